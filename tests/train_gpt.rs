//! `train_gpt`'s training on meshes of 1–8 devices (with and without ZeRO-1) against its
//! one-device run: per-step losses and final parameters.

#[path = "../examples/common/gpt_task.rs"]
mod gpt_task;

use gpt_task::{Config, Outcome};
use nx::{launch_with, LaunchOptions};

fn small(dp: usize, tp: usize, zero: bool) -> Config {
    Config {
        dp,
        tp,
        zero,
        steps: 6,
        layers: 2,
        heads: 4,
        width: 16,
        batch: 7,
        eval: 10,
        verbose: false,
        ..Config::default()
    }
}

fn run(cfg: &Config) -> Outcome {
    let opts = LaunchOptions { devices: Some(cfg.dp * cfg.tp), ..Default::default() };
    launch_with(&opts, |ctx| gpt_task::train(ctx, cfg)).unwrap().remove(0)
}

fn compare(a: &Outcome, b: &Outcome, tol: f64, what: &str) {
    for (i, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
        assert!(
            (x - y).abs() <= tol * y.abs(),
            "{what}: step {i}: loss {x} vs one device {y}; all {:?} vs {:?}",
            a.losses,
            b.losses
        );
    }
    for ((n, p), (_, q)) in a.params.iter().zip(&b.params) {
        let worst = p.iter().zip(q).map(|(x, y)| (x - y).abs() / (y.abs() + 1e-2)).fold(0.0f32, |m, d| {
            if d.is_nan() || d > m {
                d
            } else {
                m
            }
        });
        assert!(f64::from(worst) <= 100.0 * tol, "{what}: parameter {n} differs by {worst} relative");
    }
}

#[test]
fn five_meshes_match_one_device() {
    let one = run(&small(1, 1, false));
    assert!(one.losses.iter().all(|l| l.is_finite()));
    assert!(one.losses.last() < one.losses.first(), "the loss falls: {:?}", one.losses);
    for (dp, tp) in [(2, 1), (1, 2), (2, 2), (3, 1), (2, 4)] {
        let out = run(&small(dp, tp, false));
        compare(&out, &one, 1e-4, &format!("dp={dp},tp={tp}"));
    }
}

#[test]
fn zero_one_matches_plain_data_parallelism() {
    for (dp, tp) in [(2, 1), (2, 2), (3, 1)] {
        let plain = run(&small(dp, tp, false));
        let zero = run(&small(dp, tp, true));
        compare(&zero, &plain, 1e-6, &format!("ZeRO-1 over dp={dp},tp={tp}"));
    }
}

#[test]
fn micro_batches_accumulate_to_the_whole_batch() {
    let whole = run(&small(2, 2, false));
    let micro = run(&gpt_task::Config { micro: 3, ..small(2, 2, false) });
    compare(&micro, &whole, 1e-5, "three micro-batches against one batch");
}

#[test]
fn bf16_compute_with_f32_master_weights_trains_and_tracks_f32() {
    let f32_run = run(&small(2, 2, false));
    let bf16 = run(&gpt_task::Config { bf16: true, ..small(2, 2, false) });
    assert!(bf16.losses.last() < bf16.losses.first(), "the loss falls: {:?}", bf16.losses);
    for (i, (a, b)) in bf16.losses.iter().zip(&f32_run.losses).enumerate() {
        assert!((a - b).abs() <= 2e-2 * b.abs(), "step {i}: bf16 loss {a} vs f32 {b}");
    }
    // and on one device alike (bf16 rounding of different sums: within its precision)
    let one = run(&gpt_task::Config { bf16: true, ..small(1, 1, false) });
    for (i, (a, b)) in bf16.losses.iter().zip(&one.losses).enumerate() {
        assert!((a - b).abs() <= 2e-2 * b.abs(), "step {i}: bf16 on 2×2 {a} vs one device {b}");
    }
}

#[test]
fn a_run_resumed_from_a_checkpoint_continues_as_the_uninterrupted_one() {
    let root = std::env::temp_dir().join(format!("nx-gpt-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // six steps, saved at 3 and 6
    let straight = run(&gpt_task::Config { save: Some(root.clone()), save_every: 3, ..small(2, 2, true) });
    let at3 = root.join("ckpt-0000000003");
    assert!(at3.join("index.json").exists());
    // resumed from step 3 on the same mesh: the same bits
    let same = run(&gpt_task::Config { resume: Some(at3.clone()), ..small(2, 2, true) });
    assert_eq!(same.losses, straight.losses);
    assert_eq!(same.params, straight.params);
    // on other meshes (the state resharded; sums in another order: to rounding)
    for (dp, tp, zero) in [(1, 1, false), (3, 1, true), (1, 4, false)] {
        let other = run(&gpt_task::Config { resume: Some(at3.clone()), ..small(dp, tp, zero) });
        assert_eq!(other.losses[..3], straight.losses[..3], "the first three losses come from the checkpoint");
        compare(&other, &straight, 1e-4, &format!("resumed on dp={dp},tp={tp}"));
    }
    std::fs::remove_dir_all(&root).ok();
}
