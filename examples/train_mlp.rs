//! The main job: a two-layer MLP trained with data parallelism over `dp` and tensor parallelism
//! over `tp` (Megatron-style: the first layer column-split, the second row-split, its partial sum
//! closed by an all-reduce; gradients all-reduced over `dp`), on a learnable synthetic
//! classification task with a held-out split. Backward passes are written by hand.
//!
//! Runs on the simulated mesh by default (`cargo run --release --example train_mlp`), and one rank
//! per process under `mpirun -n 4` (built with `--features mpi`). Options: `--mesh dp=2,tp=4`,
//! `--steps N`, `--lr X`, `--dry-run` (report the kernels, collectives and peak memory per device
//! the training would use, running no kernel: [`nx::dry`]), `--save DIR --save-every N`, `--resume DIR` (sharded checkpoints of the
//! parameters and the step, [`nx::ckpt`]; resumed on any mesh, `--steps` counting from the start). It checks its own result against the same training on one device and
//! exits non-zero when they differ by more than 1e-5 relative, or when the held-out accuracy is
//! not above 90%.

use std::process::ExitCode;

#[path = "common/mlp.rs"]
mod mlp;

fn parse() -> Result<(mlp::Config, bool), String> {
    let mut cfg = mlp::Config::default();
    let mut dry = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--dry-run" {
            dry = true;
            i += 1;
            continue;
        }
        let val = args.get(i + 1).ok_or_else(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--mesh" => {
                let m: nx::MeshSpec = val.parse().map_err(|e| format!("{e}"))?;
                let ext = |n: &str| m.axes().iter().find(|a| a.0 == n).map(|a| a.1);
                match (ext("dp"), ext("tp"), m.axes().len()) {
                    (Some(dp), Some(tp), 2) => (cfg.dp, cfg.tp) = (dp, tp),
                    _ => return Err(format!("--mesh {val}: give dp=N,tp=M")),
                }
            }
            "--steps" => cfg.steps = val.parse().map_err(|_| format!("--steps {val}: not a number"))?,
            "--lr" => cfg.lr = val.parse().map_err(|_| format!("--lr {val}: not a number"))?,
            "--save" => cfg.save = Some(val.into()),
            "--save-every" => cfg.save_every = val.parse().map_err(|_| format!("--save-every {val}: not a number"))?,
            "--resume" => cfg.resume = Some(val.into()),
            other => return Err(format!("unknown option {other} (--mesh dp=2,tp=2 --steps 150 --lr 0.5 --save DIR --save-every 50 --resume DIR --dry-run)")),
        }
        i += 2;
    }
    Ok((cfg, dry))
}

fn main() -> ExitCode {
    let (cfg, dry) = match parse() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("train_mlp: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = nx::LaunchOptions { devices: Some(cfg.dp * cfg.tp), ..Default::default() };
    if dry {
        // what the training would run: its kernels checked, not run, and its collectives and memory
        let quiet = mlp::Config { verbose: false, ..cfg.clone() };
        return match nx::dry::run(&opts, nx::Observe::Dry, |ctx| mlp::train(ctx, &quiet).map(|_| ())) {
            Ok(reports) => {
                println!("train_mlp --dry-run over dp={},tp={}: no kernel ran", cfg.dp, cfg.tp);
                for r in &reports {
                    println!("{}", r.text());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("train_mlp: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runs = match nx::launch_with(&opts, |ctx| {
        if ctx.rank() == 0 {
            println!(
                "training a {}-{}-{} MLP on {} rows over dp={},tp={} ({} ranks, {} backend, {} devices, work {})",
                cfg.d_in,
                cfg.hidden,
                cfg.classes,
                cfg.train,
                cfg.dp,
                cfg.tp,
                ctx.size(),
                ctx.backend(),
                ctx.device().kind.name(),
                ctx.rig().timing()
            );
        }
        let out = mlp::train(ctx, &cfg)?;
        Ok((ctx.rank(), out))
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("train_mlp: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some((_, out)) = runs.into_iter().find(|(r, _)| *r == 0) else { return ExitCode::SUCCESS };
    let reference = mlp::reference(&mlp::Config { verbose: false, ..cfg.clone() });
    let rel = (out.loss - reference.loss).abs() / reference.loss.abs();
    println!(
        "final loss: {:.8} (single-device reference: {:.8}, relative difference {rel:.1e})",
        out.loss, reference.loss
    );
    println!(
        "held-out accuracy: {:.1}% (single-device reference: {:.1}%)",
        100.0 * out.accuracy,
        100.0 * reference.accuracy
    );
    // the final parameters' bits, to compare runs (the simulated mesh and MPI give the same)
    let sum = out.params.iter().flatten().fold(0u64, |h, x| h.rotate_left(5) ^ x.to_bits());
    println!("parameters checksum: {sum:016x}");
    if rel > 1e-5 || out.accuracy <= 0.9 {
        eprintln!(
            "train_mlp: FAILED: the loss differs from the reference by {rel:.1e} or the accuracy is not above 90%"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
