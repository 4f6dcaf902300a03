//! `train_gpt`'s model against the same GPT written in PyTorch (`tests/torch_gpt.py`): nx writes
//! its initial weights and batches as a safetensors file, torch trains from them, and the
//! per-step losses of 50 f32 steps on a 2×2 mesh must agree within 1e-4 relative.
//!
//! The Python with torch and safetensors is `NX_TORCH_PYTHON`, else `~/.cache/nx/torch/bin/python`
//! (the venv `benches/kernels.sh` and `scripts/test` make); where neither imports torch the test
//! prints why and passes without comparing.

#[path = "../examples/common/gpt_task.rs"]
mod gpt_task;

use std::path::PathBuf;
use std::process::Command;

use safetensors::tensor::{Dtype, TensorView};

fn python() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = std::env::var_os("NX_TORCH_PYTHON").map(PathBuf::from).into_iter().collect();
    if let Some(h) = std::env::var_os("HOME") {
        c.push(PathBuf::from(h).join(".cache/nx/torch/bin/python"));
    }
    c.into_iter()
        .find(|p| Command::new(p).args(["-c", "import torch, safetensors"]).output().is_ok_and(|o| o.status.success()))
}

fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    // SAFETY: plain numbers (f32, f64, i64) read as their bytes, within the slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }.to_vec()
}

#[test]
fn per_step_losses_match_pytorch() {
    let Some(py) = python() else {
        println!("SKIPPED: no Python with torch and safetensors (set NX_TORCH_PYTHON, or run scripts/test, which installs them)");
        return;
    };
    let cfg = gpt_task::Config {
        dp: 2,
        tp: 2,
        steps: 50,
        layers: 2,
        heads: 4,
        width: 32,
        batch: 16,
        lr: 1e-3,
        eval: 10,
        verbose: false,
        ..gpt_task::Config::default()
    };
    let gpt = gpt_task::model(&cfg).unwrap();
    // the initial weights (their global values depend on the seed alone), gathered on one device
    let initial = nx::launch_with(&nx::LaunchOptions { devices: Some(1), ..Default::default() }, |ctx| {
        let layout = nx::nn::Layout::new(&ctx.mesh(&[("dp", 1), ("tp", 1)])?)?;
        let p: nx::nn::Params<'_, f32> = gpt.init(ctx, &layout, cfg.seed)?;
        p.iter()
            .map(|(n, t)| Ok((n.to_string(), t.shape().to_vec(), t.full()?.to_vec()?)))
            .collect::<nx::Result<Vec<_>>>()
    })
    .unwrap()
    .remove(0);
    let t = 3 * cfg.digits + 2;
    let (mut ids, mut labels) = (Vec::new(), Vec::new());
    for s in 0..cfg.steps {
        let (i, l) = gpt_task::batch_host(&cfg, s);
        ids.extend(i);
        labels.extend(l);
    }
    let c = gpt.config;
    let config: Vec<i64> =
        [c.vocab, c.context, c.layers, c.heads, c.width, cfg.steps].iter().map(|&x| x as i64).collect();
    let mut blobs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        initial.iter().map(|(n, s, v)| (n.clone(), Dtype::F32, s.clone(), bytes(v))).collect();
    blobs.push(("ids".into(), Dtype::I64, vec![cfg.steps, cfg.batch, t], bytes(&ids)));
    blobs.push(("labels".into(), Dtype::I64, vec![cfg.steps, cfg.batch, t], bytes(&labels)));
    blobs.push(("config".into(), Dtype::I64, vec![config.len()], bytes(&config)));
    blobs.push(("lr".into(), Dtype::F64, vec![1], bytes(&[cfg.lr])));
    let views: Vec<(String, TensorView<'_>)> =
        blobs.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let dir = std::env::temp_dir().join(format!("nx-torch-gpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gpt.safetensors");
    safetensors::serialize_to_file(views, &None, &file).unwrap();
    // nx on a 2×2 mesh
    let opts = nx::LaunchOptions { devices: Some(4), ..Default::default() };
    let ours = nx::launch_with(&opts, |ctx| gpt_task::train(ctx, &cfg)).unwrap().remove(0);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_gpt.py");
    let out = Command::new(&py).arg(script).arg(&file).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "torch_gpt.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let theirs: Vec<f64> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), cfg.steps);
    let worst = ours.losses.iter().zip(&theirs).map(|(a, b)| (a - b).abs() / b.abs()).fold(0.0, f64::max);
    println!("50 steps: nx {:?}\ntorch {theirs:?}\nlargest relative difference {worst:.2e}", ours.losses);
    assert!(ours.losses.last() < ours.losses.first(), "the loss falls");
    for (i, (a, b)) in ours.losses.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "step {i}: nx loss {a}, torch {b} (all: {:?} vs {theirs:?})",
            ours.losses
        );
    }
}
