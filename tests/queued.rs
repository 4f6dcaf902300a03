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

/// Run in a child process of this test binary (the environment is the process's): `NX_SIM_QUEUED`
/// chooses queued devices, its absence the host, and a value that is not a delay is refused.
#[test]
fn nx_sim_queued_chooses_queued_devices() {
    const NAME: &str = "nx_sim_queued_chooses_queued_devices";
    if let Ok(want) = std::env::var("NX_TEST_QUEUED_CHILD") {
        let r = nx::launch_with(&LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
            Ok((ctx.rig().is_queued(), ctx.rig().timing()))
        });
        match want.as_str() {
            "bad" => {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("NX_SIM_QUEUED=\"soon\" is not a delay in microseconds"), "{e}");
            }
            _ => assert_eq!(r.unwrap(), vec![(want == "queued", want.as_str()); 2]),
        }
        return;
    }
    for (env, want) in [(Some("40"), "queued"), (Some("0"), "queued"), (None, "host"), (Some("soon"), "bad")] {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", NAME, "--test-threads=1"]).env("NX_TEST_QUEUED_CHILD", want);
        match env {
            Some(v) => c.env("NX_SIM_QUEUED", v),
            None => c.env_remove("NX_SIM_QUEUED"),
        };
        let o = c.output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "NX_SIM_QUEUED={env:?}: {text}{}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("1 passed"), "the child ran the test: {text}");
    }
}
