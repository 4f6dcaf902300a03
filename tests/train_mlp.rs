//! The main job's training on several meshes, against the single-device reference.

#[path = "../examples/common/mlp.rs"]
mod mlp;

#[test]
fn train_mlp_matches_its_single_device_reference_on_every_mesh() {
    let base = mlp::Config { steps: 40, verbose: false, ..mlp::Config::default() };
    let reference = mlp::reference(&base);
    for (dp, tp) in [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)] {
        let cfg = mlp::Config { dp, tp, ..base.clone() };
        let opts = nx::LaunchOptions { devices: Some(dp * tp), ..Default::default() };
        let outs = nx::launch_with(&opts, |ctx| mlp::train(ctx, &cfg)).unwrap();
        for out in &outs {
            let rel = (out.loss - reference.loss).abs() / reference.loss;
            assert!(rel < 1e-9, "dp={dp},tp={tp}: loss {} vs {}", out.loss, reference.loss);
            for (p, q) in out.params.iter().zip(&reference.params) {
                assert!(p.iter().zip(q).all(|(x, y)| (x - y).abs() < 1e-9 * (1.0 + y.abs())));
            }
        }
        // every rank ends with the same parameters, bit for bit
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "dp={dp},tp={tp}");
    }
}

#[test]
fn train_mlp_resumed_on_another_mesh_ends_as_the_uninterrupted_run() {
    let root = std::env::temp_dir().join(format!("nx-mlp-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let run = |cfg: &mlp::Config| {
        let opts = nx::LaunchOptions { devices: Some(cfg.dp * cfg.tp), ..Default::default() };
        nx::launch_with(&opts, |ctx| mlp::train(ctx, cfg)).unwrap().remove(0)
    };
    let base = mlp::Config { steps: 40, verbose: false, ..mlp::Config::default() };
    let straight = run(&mlp::Config { save: Some(root.clone()), save_every: 15, ..base.clone() });
    let at30 = root.join("ckpt-0000000030");
    // checkpoints at 15, 30 and 40 (the two newest kept: 30 and 40)
    assert!(at30.join("index.json").exists());
    let same = run(&mlp::Config { resume: Some(at30.clone()), ..base.clone() });
    assert_eq!(same, straight, "resumed on the same mesh: the same bits");
    for (dp, tp) in [(1, 1), (3, 1), (1, 3)] {
        let other = run(&mlp::Config { dp, tp, resume: Some(at30.clone()), ..base.clone() });
        assert!((other.loss - straight.loss).abs() < 1e-9 * straight.loss, "dp={dp},tp={tp}");
        for (p, q) in other.params.iter().zip(&straight.params) {
            assert!(p.iter().zip(q).all(|(x, y)| (x - y).abs() < 1e-9 * (1.0 + y.abs())), "dp={dp},tp={tp}");
        }
    }
    std::fs::remove_dir_all(&root).ok();
}
