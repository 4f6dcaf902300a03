//! Simulated ranks on queued devices (work queued on a timeline per device, each item after a
//! random delay): the main job's training and every kind of transition give the bits they give
//! with work run at once.

use std::time::Duration;

#[path = "../examples/common/mlp.rs"]
mod mlp;

use nx::kernels::rig::QueueOptions;
use nx::{LaunchOptions, PlacementSpec, Tensor};

fn opts(n: usize, queued: bool) -> LaunchOptions {
    let queued = queued.then_some(QueueOptions { delay: Duration::from_micros(150), seed: 3 });
    LaunchOptions { devices: Some(n), queued, ..Default::default() }
}

#[test]
fn training_on_queued_devices_gives_the_same_bits() {
    let cfg = mlp::Config { steps: 15, verbose: false, dp: 2, tp: 2, ..mlp::Config::default() };
    let at_once = nx::launch_with(&opts(4, false), |ctx| mlp::train(ctx, &cfg)).unwrap();
    let queued = nx::launch_with(&opts(4, true), |ctx| {
        assert!(ctx.rig().is_queued());
        mlp::train(ctx, &cfg)
    })
    .unwrap();
    assert!(at_once == queued, "the parameters differ");
    let reference = mlp::reference(&cfg);
    assert!((queued[0].loss - reference.loss).abs() < 1e-9 * reference.loss.abs(), "against one device");
}

#[test]
fn every_kind_of_transition_on_queued_devices_gives_the_same_bits() {
    // each: a value made by kernels (queued), then placed; every kind of plan step
    let transitions = [
        ("mesh(0:dp.tp)", "on"),
        ("mesh(0:tp)", "mesh(1:tp)"),
        ("partial(tp; 0:dp)", "mesh(0:dp.tp)"),
        ("partial(dp.tp)", "on"),
        ("device(3)", "on"),
        ("mesh(1:dp, 0:tp)", "mesh(0:dp)"),
        ("on", "partial(tp)"),
        ("split(1)", "mesh(0:tp.dp)"),
        ("mesh(0:dp)", "mesh(0:tp)"),
    ];
    let run = |queued: bool| {
        nx::launch_with(&opts(4, queued), |ctx| {
            let m = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
            let mut out = Vec::new();
            for (from, to) in transitions {
                let (p, q) = (from.parse::<PlacementSpec>()?.over(&m)?, to.parse::<PlacementSpec>()?.over(&m)?);
                let f = |i: &[usize]| (i[0] * 7 + i[1]) as f32 * 0.25 - 3.0;
                let closed = Tensor::<f32>::from_fn(ctx, &[9, 6], &p.closed(), f)?;
                // kernels on the device's timeline, then the move
                let x = closed.scale(1.5)?.relu()?;
                let x = if p.is_partial() { x.place(&p)? } else { x };
                let y = x.place(&q)?;
                out.push(y.full()?.to_vec()?.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            }
            Ok(out)
        })
        .unwrap()
    };
    assert_eq!(run(true), run(false));
}
