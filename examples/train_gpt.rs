//! The main job: a small GPT (4 layers, 4 heads, width 128 by default) learns multi-digit
//! addition written as text, trained with data parallelism over `dp` and tensor parallelism over
//! `tp` (Megatron's cuts, [`nx::nn::gpt`]), gradients by [`nx::autodiff`], AdamW with warmup and
//! cosine decay and global-norm clipping ([`nx::optim`]), optionally ZeRO-1 over `dp`.
//!
//! Runs on the simulated mesh by default (`cargo run --release --example train_gpt`), one rank per
//! process under `mpirun -n 4` or `nx run -n 4` (built with `--features mpi`). Options:
//! `--mesh dp=2,tp=2` (any mesh of 1–8 devices whose `tp` divides the heads), `--steps N`,
//! `--seed N`, `--zero`, `--bf16` (bf16 compute, f32 master weights and optimizer), `--micro N`
//! (micro-batches a step, gradients accumulated), `--save DIR --save-every N` (sharded
//! checkpoints: parameters, AdamW's state, progress; [`nx::ckpt`]), `--resume DIR` (on any mesh;
//! `--steps` counts from the start of training), `--digits N`, `--layers N`, `--width N`, `--heads N`, `--batch N`,
//! `--lr X`, `--no-reference`, `--dry-run` (the kernels, collectives and peak memory per device the
//! training would use, running no kernel: [`nx::dry`]). It trains the same model on one device beside it (the same
//! weights and batches) and exits non-zero where the first 20 steps' losses differ by more than
//! 1e-3 relative (3e-2 in bf16): a wrong gradient, a wrong placement rule or a lost sum shows at
//! once. It prints the final losses (the mean of the last 20 steps) and held-out accuracies of
//! both, but does not fail on them: f32 sums in another order agree to about 1e-7 for the first
//! 30 steps and then drift apart, and training amplifies the drift — the step at which a run
//! leaves the loss plateau is chaotic (measured with the fused q, k, v projection: seeds 2 and 3
//! reach 100% held-out accuracy on the 2×2 mesh and on one device in 800 steps, seed 1 stays on
//! the plateau, 14% and 22.5%; so the default seed is 2). `tests/train_gpt.rs` checks per-step
//! agreement on five meshes, `tests/torch_gpt.rs` against PyTorch.

use std::process::ExitCode;

#[path = "common/gpt_task.rs"]
mod gpt_task;

use gpt_task::Config;

fn parse() -> Result<(Config, bool, bool), String> {
    let mut cfg = Config::default();
    let mut reference = true;
    let mut dry = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let num = |v: &str, what: &str| v.parse::<usize>().map_err(|_| format!("{what} {v}: not a number"));
    while i < args.len() {
        match args[i].as_str() {
            "--zero" => {
                cfg.zero = true;
                i += 1;
                continue;
            }
            "--no-reference" => {
                reference = false;
                i += 1;
                continue;
            }
            "--dry-run" => {
                dry = true;
                i += 1;
                continue;
            }
            "--bf16" => {
                cfg.bf16 = true;
                i += 1;
                continue;
            }
            _ => {}
        }
        let val = args.get(i + 1).ok_or_else(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--mesh" => {
                let m: nx::MeshSpec = val.parse().map_err(|e| format!("{e}"))?;
                let ext = |n: &str| m.axes().iter().find(|a| a.0 == n).map(|a| a.1);
                (cfg.dp, cfg.tp) = (ext("dp").unwrap_or(1), ext("tp").unwrap_or(1));
                if m.axes().iter().any(|a| a.0 != "dp" && a.0 != "tp") || cfg.dp * cfg.tp > 8 {
                    return Err(format!("--mesh {val}: give dp=N,tp=M (up to 8 devices)"));
                }
            }
            "--steps" => cfg.steps = num(val, "--steps")?,
            "--seed" => cfg.seed = num(val, "--seed")? as u64,
            "--digits" => cfg.digits = num(val, "--digits")?.clamp(1, 6),
            "--layers" => cfg.layers = num(val, "--layers")?,
            "--width" => cfg.width = num(val, "--width")?,
            "--heads" => cfg.heads = num(val, "--heads")?,
            "--batch" => cfg.batch = num(val, "--batch")?,
            "--micro" => cfg.micro = num(val, "--micro")?.max(1),
            "--save" => cfg.save = Some(val.into()),
            "--save-every" => cfg.save_every = num(val, "--save-every")?.max(1),
            "--resume" => cfg.resume = Some(val.into()),
            "--lr" => cfg.lr = val.parse().map_err(|_| format!("--lr {val}: not a number"))?,
            other => {
                return Err(format!(
                    "unknown option {other} (--mesh dp=2,tp=2 --steps 800 --seed 2 --zero --bf16 --micro 1 --save DIR --save-every 100 --resume DIR --digits 2 --layers 4 --width 128 --heads 4 --batch 64 --lr 0.0006 --no-reference --dry-run)"
                ))
            }
        }
        i += 2;
    }
    if cfg.steps == 0 || cfg.batch == 0 || cfg.layers == 0 || cfg.width == 0 || cfg.heads == 0 {
        return Err("--steps, --batch, --layers, --width and --heads need at least 1".into());
    }
    Ok((cfg, reference, dry))
}

fn main() -> ExitCode {
    let (cfg, with_reference, dry) = match parse() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("train_gpt: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = nx::LaunchOptions { devices: Some(cfg.dp * cfg.tp), ..Default::default() };
    if dry {
        // what the training would run: its kernels checked, not run, and its collectives and memory
        return match nx::dry::run(&opts, nx::Observe::Dry, |ctx| gpt_task::train(ctx, &cfg).map(|_| ())) {
            Ok(reports) => {
                println!("train_gpt --dry-run over dp={},tp={}, {} steps: no kernel ran", cfg.dp, cfg.tp, cfg.steps);
                for r in &reports {
                    println!("{}", r.text());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("train_gpt: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runs = match nx::launch_with(&opts, |ctx| {
        if ctx.rank() == 0 {
            let params = gpt_task::model(&cfg)?.config;
            println!(
                "training a GPT ({} layers, {} heads, width {}, context {}) on {}-digit addition over dp={},tp={}{}{} ({} ranks, {} backend), {} steps of {} problems",
                params.layers, params.heads, params.width, params.context, cfg.digits, cfg.dp, cfg.tp,
                if cfg.zero { " with ZeRO-1" } else { "" }, if cfg.bf16 { " in bf16" } else { "" }, ctx.size(), ctx.backend(), cfg.steps, cfg.batch
            );
        }
        let out = gpt_task::train(ctx, &cfg)?;
        Ok((ctx.rank(), out))
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_gpt: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some((_, out)) = runs.into_iter().find(|(r, _)| *r == 0) else { return ExitCode::SUCCESS };
    let last = |o: &gpt_task::Outcome| o.losses.last().copied().unwrap_or(f64::NAN);
    println!("trained at {:.0} tokens/s", out.tokens_per_s);
    // FNV-1a of the final parameters' bits: equal across backends (the same sums in the same order)
    let sum = out
        .params
        .iter()
        .flat_map(|(_, v)| v)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x0100_0000_01b3));
    println!("parameters checksum: {sum:016x}");
    if !with_reference {
        println!("final loss: {:.6}", last(&out));
        println!("held-out accuracy: {:.1}%", 100.0 * out.accuracy);
        return ExitCode::SUCCESS;
    }
    println!("the same training on one device, for reference:");
    let one = Config { dp: 1, tp: 1, zero: false, micro: 1, save: None, resume: None, ..cfg.clone() };
    let local = nx::LaunchOptions { devices: Some(1), local: true, ..Default::default() };
    let reference = match nx::launch_with(&local, |ctx| gpt_task::train(ctx, &one)) {
        Ok(mut r) => r.remove(0),
        Err(e) => {
            eprintln!("train_gpt: the one-device reference: {e}");
            return ExitCode::FAILURE;
        }
    };
    // per-step agreement while rounding has not yet compounded; then the end, where two runs of
    // hundreds of steps have drifted apart (float sums in another order) but must agree in kind
    let early = out
        .losses
        .iter()
        .zip(&reference.losses)
        .take(20)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .fold(0.0, |m: f64, d| if d.is_nan() || d > m { d } else { m });
    let tail = |o: &gpt_task::Outcome| {
        let n = o.losses.len().clamp(1, 20);
        o.losses.iter().rev().take(n).sum::<f64>() / n as f64
    };
    let (l, r) = (tail(&out), tail(&reference));
    let rel = (l - r).abs() / r.abs();
    // bf16 rounds each sum's terms to 8 bits: its runs agree to about 2⁻⁸ a step
    let early_tol = if cfg.bf16 { 3e-2 } else { 1e-3 };
    println!("first 20 steps' losses: largest relative difference {early:.1e} (tolerance {early_tol:.0e})");
    println!("final loss: {l:.6} (single-device reference: {r:.6}, relative difference {rel:.1e}; the mean of the last 20 steps)");
    println!(
        "held-out accuracy: {:.1}% (single-device reference: {:.1}%)",
        100.0 * out.accuracy,
        100.0 * reference.accuracy
    );
    // (a NaN fails the test)
    let ok = early <= early_tol;
    let drifted =
        !((l <= 2.0 * r && r <= 2.0 * l) || (l - r).abs() <= 0.05) || (out.accuracy - reference.accuracy).abs() > 0.10;
    if drifted {
        println!(
            "the two runs drifted apart after the first steps (f32 sums in another order, amplified by training's chaos: where one run leaves the loss plateau earlier than the other); the per-step agreement above is the check"
        );
    }
    if !ok {
        eprintln!("train_gpt: the distributed run's first 20 losses differ from one device's past the tolerance");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
