//! Saves a checkpoint a step for five steps; with `--die-at N`, rank 1 kills itself with SIGKILL
//! in the middle of step N's save (after its files are written, before the save is committed). For the test
//! that a rank killed during a save leaves the previous checkpoint loadable and no partial one
//! visible (`tests/examples.rs`, under `nx run --mpi`).
//!
//! `ckpt_crash DIR [--die-at N]`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().cloned() else {
        eprintln!("ckpt_crash: give a directory");
        return ExitCode::from(2);
    };
    let die_at: Option<u64> =
        args.iter().position(|a| a == "--die-at").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok());
    let out = nx::launch(|ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        for step in 1..=5u64 {
            let w = nx::Tensor::<f32>::from_fn(ctx, &[1024, 256], &rows, |i| {
                (step * 1000) as f32 + (i[0] % 7) as f32 + i[1] as f32
            })?;
            let mut s = nx::ckpt::Saver::new(ctx, &dir, step)?;
            s.add("w", &w)?;
            if die_at == Some(step) && ctx.rank() == 1 {
                // its files written (the writer's fragment of the index is its last), then killed
                let _pending = s.commit_async(serde_json::json!({ "step": step }));
                let frag = std::path::Path::new(&dir).join(format!("ckpt-{step:010}.tmp")).join("rank1.json");
                while !frag.exists() {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                // SAFETY: raising a signal on this process; nothing is shared with Rust code.
                unsafe { libc::raise(libc::SIGKILL) };
                unreachable!("SIGKILL ends the process");
            } else {
                s.commit(serde_json::json!({ "step": step }))?;
            }
            if ctx.rank() == 0 {
                println!("saved step {step}");
            }
        }
        Ok(())
    });
    match out {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ckpt_crash: {e}");
            ExitCode::FAILURE
        }
    }
}
