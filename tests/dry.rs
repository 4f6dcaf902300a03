//! Dry runs of `train_mlp`'s and `train_gpt`'s training (ZeRO-1 included): the same kernels (kinds, dtypes, shapes, in order), the
//! same collectives (ops, groups, bytes) and a peak memory within 10% of a real run's on every
//! rank, on meshes of 4 and 8 devices; kernels that were checked and not run; refusals as a real
//! run's.

#[path = "../examples/common/mlp.rs"]
#[allow(dead_code)]
mod mlp;

#[path = "../examples/common/gpt_task.rs"]
mod gpt_task;

use nx::dry::{self, Observe, Report};
use nx::kernels::prog::UnOp;
use nx::{LaunchOptions, Placement, Tensor};

fn cfg(dp: usize, tp: usize) -> mlp::Config {
    mlp::Config { dp, tp, steps: 4, train: 129, test: 33, verbose: false, ..Default::default() }
}

fn both(dp: usize, tp: usize) -> (Vec<Report>, Vec<Report>) {
    let opts = LaunchOptions { devices: Some(dp * tp), ..Default::default() };
    let c = cfg(dp, tp);
    let body = |ctx: &nx::Ctx<'_>| mlp::train(ctx, &c).map(|_| ());
    (dry::run(&opts, Observe::Dry, body).unwrap(), dry::run(&opts, Observe::Trace, body).unwrap())
}

fn compare(dry: &[Report], real: &[Report]) {
    for (d, r) in dry.iter().zip(real) {
        assert_eq!(d.rank, r.rank);
        let (dk, rk): (Vec<&str>, Vec<&str>) =
            (d.kernels.iter().map(|k| k.key.as_str()).collect(), r.kernels.iter().map(|k| k.key.as_str()).collect());
        assert!(dk.len() > 50, "{} kernel calls", dk.len());
        assert_eq!(dk, rk, "rank {}: the kernels of a dry and a real run", d.rank);
        let (de, re) = (events(d), events(r));
        assert!(!de.is_empty());
        assert_eq!(de, re, "rank {}: the collectives", d.rank);
        assert!(d.collectives.bytes_received() > 0);
        let (dp_, rp) = (d.peak_bytes as f64, r.peak_bytes as f64);
        assert!(rp > 0.0 && (dp_ - rp).abs() <= 0.1 * rp, "rank {}: peak {dp_} against {rp}", d.rank);
    }
}

fn events(r: &Report) -> Vec<String> {
    r.collectives
        .collectives()
        .map(|e| format!("{:?} {:?} {:?} {} {}", e.op, e.dtype, e.axes, e.bytes_sent, e.bytes_received))
        .collect()
}

#[test]
fn a_dry_run_reports_what_a_real_run_does() {
    for (dp, tp) in [(2, 2), (4, 2)] {
        let (dry, real) = both(dp, tp);
        assert_eq!(dry.len(), dp * tp);
        compare(&dry, &real);
        for d in &dry {
            for kind in ["map", "reduce", "contract"] {
                assert!(d.kernels.iter().any(|k| k.kernel == kind), "no {kind} in {:?}", d.kernel_counts());
            }
            let text = d.text();
            assert!(text.contains("peak memory") && text.contains("collectives") && text.contains("map"), "{text}");
        }
    }
}

#[test]
fn a_dry_run_of_the_gpt_reports_what_a_real_run_does() {
    for (dp, tp, zero) in [(2, 2, false), (2, 1, true)] {
        let cfg = gpt_task::Config {
            dp,
            tp,
            zero,
            steps: 2,
            layers: 2,
            heads: 4,
            width: 16,
            batch: 7,
            eval: 4,
            verbose: false,
            ..gpt_task::Config::default()
        };
        let opts = LaunchOptions { devices: Some(dp * tp), ..Default::default() };
        let body = |ctx: &nx::Ctx<'_>| gpt_task::train(ctx, &cfg).map(|_| ());
        let (dry, real) =
            (dry::run(&opts, Observe::Dry, body).unwrap(), dry::run(&opts, Observe::Trace, body).unwrap());
        compare(&dry, &real);
        assert!(dry[0].kernels.iter().any(|k| k.kernel == "attention"), "{:?}", dry[0].kernel_counts());
    }
}

#[test]
fn dry_kernels_are_checked_not_run() {
    let opts = LaunchOptions { devices: Some(2), ..Default::default() };
    let reports = dry::run(&opts, Observe::Dry, |ctx| {
        assert!(ctx.is_dry());
        let p = Placement::split(0, ctx.devices())?;
        let x = Tensor::<f64>::from_fn(ctx, &[8, 3], &p, |i| (i[0] * 3 + i[1]) as f64 + 1.0)?;
        let y = x.unary(UnOp::Exp)?;
        let got = y.to_local().expect("a window").to_vec()?;
        let ran: Vec<f64> = x.to_local().expect("a window").to_vec()?.iter().map(|v| v.exp()).collect();
        assert!(got.iter().zip(&ran).all(|(g, r)| g != r), "a dry map ran: {got:?}");
        // a program that does not fit is refused dry too
        let z = Tensor::<f64>::zeros(ctx, &[4, 5], &Placement::on(ctx.devices()))?;
        assert!(x.matmul(&z).is_err());
        Ok(())
    })
    .unwrap();
    assert!(reports[0].kernels.iter().any(|k| k.key == "map f64[4,3] <- f64[4,3]"), "{:?}", reports[0].kernel_counts());
    // a trace runs them
    let traced = dry::run(&opts, Observe::Trace, |ctx| {
        assert!(!ctx.is_dry());
        let x = Tensor::<f64>::from_fn(ctx, &[8, 3], &Placement::split(0, ctx.devices())?, |i| i[0] as f64)?;
        let y = x.unary(UnOp::Exp)?.to_local().expect("a window").to_vec()?;
        assert!(y.iter().zip(x.to_local().expect("a window").to_vec()?).all(|(a, b)| *a == b.exp()));
        Ok(())
    })
    .unwrap();
    assert!(!traced[1].kernels.is_empty());
}

/// This process's resident-memory high-water mark, in bytes (Linux's `VmHWM`); `None` elsewhere.
fn rss_peak() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// The host's memory, in bytes (`MemTotal`); `None` elsewhere.
fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

#[test]
fn a_dry_run_sizes_a_model_larger_than_this_machine_in_a_little_of_its_memory() {
    use nx::autodiff::Tape;
    use nx::nn::gpt::{Gpt, GptConfig};
    use nx::optim::AdamW;
    // a GPT of 2.15 billion f32 parameters (width 8192, 2 blocks, 32768 tokens) trained one step
    // on 8 devices (dp = 2, tp = 4) with AdamW: every device holds a quarter of the parameters,
    // their gradients and two moments (8.6 GB) and the step's activations: about 14 GB a device,
    // 114 GB in all, dry in a few MiB of this machine's memory and a fraction of a second
    let gpt = Gpt::new(GptConfig { vocab: 32768, context: 256, layers: 2, heads: 32, width: 8192 }).unwrap();
    let (b, t) = (4, 256);
    let run = |limit: Option<usize>| {
        let opts = LaunchOptions { devices: Some(8), memory_limit: limit, ..Default::default() };
        dry::run(&opts, Observe::Dry, |ctx| {
            let mesh = ctx.mesh(&[("dp", 2), ("tp", 4)])?;
            let layout = nx::nn::Layout::new(&mesh)?;
            let mut params = gpt.init::<f32>(ctx, &layout, 1)?;
            let rows = layout.cut(&[(0, &["dp"])])?;
            let ids = Tensor::<i64>::from_fn(ctx, &[b, t], &rows, |i| ((i[0] * 31 + i[1] * 7) % 32768) as i64)?;
            let tape = Tape::new();
            let loss = gpt.loss(&params.bind(&tape), &layout, &ids, &ids)?;
            let grads = tape.backward(&loss)?;
            AdamW::new().step(&mut params, &grads, 1e-4)?;
            // a quarter of the parameters on each device
            let mine: usize = params.iter().filter_map(|(_, p)| p.to_local()).map(|a| a.numel()).sum();
            assert!(mine > 2_150_000_000 / 4 * 9 / 10, "{mine} parameters here");
            Ok(())
        })
    };
    let before = rss_peak();
    let reports = run(None).unwrap();
    assert_eq!(reports.len(), 8);
    let total: u64 = reports.iter().map(|r| r.peak_bytes as u64).sum();
    for r in &reports {
        // parameters, gradients and two moments at least, each a quarter of 2.15 billion floats
        assert!(r.peak_bytes as u64 >= 4 * 2_150_000_000 / 4 * 4 * 9 / 10, "rank {}: peak {} B", r.rank, r.peak_bytes);
    }
    if let (Some(mem), Some(a), Some(z)) = (mem_total(), before, rss_peak()) {
        assert!(total > mem, "the model needs {total} B among the devices, more than this machine's {mem} B");
        // what the run itself made resident: small arrays, the tape, the reports
        assert!(z.saturating_sub(a) < 3 << 30, "the dry run held {} B of this machine's memory", z - a);
    }
    // a device of 24 GiB holds it; one of 8 GiB does not, and the error names the device
    let per = reports.iter().map(|r| r.peak_bytes).max().unwrap();
    assert!(per < 24 << 30, "{per} B on one device");
    run(Some(24 << 30)).unwrap();
    let e = run(Some(8 << 30)).unwrap_err().to_string();
    assert!(e.contains("sim:") && e.contains("limit"), "{e}");
}
