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
