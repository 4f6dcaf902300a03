//! The training step of `train_gpt`'s model: nx on one device, nx on the simulated 2×2 mesh (the
//! same two cores: the cost of placements and collectives) and PyTorch eager on CPU (the same
//! thread count), interleaved in one run; prints tokens/s (medians) and the ratios.
//!
//! `cargo run --release --example bench_gpt -- --torch PYTHON [--rounds 5] [--steps 5]` (run by
//! `benches/train_gpt.sh`, which makes the torch environment). Without `--torch` the PyTorch
//! column is left out; `--only one` (or `--only mesh`) times that run alone (for a profiler).

#[path = "common/gpt_task.rs"]
mod gpt_task;

use std::process::Command;

/// The median, NaN for none.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn nx_tokens_per_s(dp: usize, tp: usize, steps: usize) -> f64 {
    let cfg = gpt_task::Config { dp, tp, steps, eval: 0, verbose: false, ..gpt_task::Config::default() };
    let opts = nx::LaunchOptions { devices: Some(dp * tp), ..Default::default() };
    nx::launch_with(&opts, |ctx| gpt_task::train(ctx, &cfg)).expect("trains").remove(0).tokens_per_s
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let rounds: usize = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(5);
    let steps: usize = arg("--steps").and_then(|v| v.parse().ok()).unwrap_or(5);
    let torch = arg("--torch");
    let only = arg("--only");
    let (run_one, run_mesh) = match only.as_deref() {
        None => (true, true),
        Some("one") => (true, false),
        Some("mesh") => (false, true),
        Some(other) => {
            eprintln!("bench_gpt: --only takes one or mesh, not {other:?}");
            std::process::exit(2)
        }
    };
    let cfg = gpt_task::Config::default();
    let model = gpt_task::model(&cfg).expect("a model").config;
    println!(
        "train_gpt's step: {} layers, {} heads, width {}, context {}, batch {} ({} tokens a step), {rounds} interleaved rounds of {steps} steps",
        model.layers, model.heads, model.width, model.context, cfg.batch, cfg.batch * model.context
    );
    let (mut one, mut mesh, mut pt) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        if run_one {
            one.push(nx_tokens_per_s(1, 1, steps));
        }
        if run_mesh {
            mesh.push(nx_tokens_per_s(2, 2, steps));
        }
        if let Some(py) = &torch {
            let c = |x: usize| x.to_string();
            let out = Command::new(py)
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_gpt_step.py"))
                .args([
                    c(model.vocab),
                    c(model.context),
                    c(model.layers),
                    c(model.heads),
                    c(model.width),
                    c(cfg.batch),
                    c(steps),
                    c(2),
                ])
                .output()
                .expect("python runs");
            let text = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = serde_json::from_str(text.trim())
                .unwrap_or_else(|_| panic!("torch_gpt_step.py: {text} {}", String::from_utf8_lossy(&out.stderr)));
            pt.push(v["tokens_per_s"].as_f64().expect("a number"));
        }
    }
    let (a, b) = (median(&mut one), median(&mut mesh));
    if run_one {
        println!("nx, one device:        {a:>9.0} tokens/s");
    }
    if run_mesh && run_one {
        println!("nx, 2×2 simulated mesh: {b:>9.0} tokens/s  (one device / mesh: {:.2}×)", a / b);
    } else if run_mesh {
        println!("nx, 2×2 simulated mesh: {b:>9.0} tokens/s");
    }
    if !pt.is_empty() && run_one {
        let t = median(&mut pt);
        println!("PyTorch eager, 2 threads: {t:>7.0} tokens/s  (nx one device / PyTorch: {:.2})", a / t);
    }
}
