//! The guide to `nx::testing` (the README quotes it): a user's unit tests of a Megatron-style MLP
//! block — a column-parallel linear layer, a relu, then a row-parallel one — on simulated meshes,
//! with all four tools: the single-device result, exactly one all-reduce over `tp` of the bytes
//! the plan says, random meshes and batch sizes, and a rank made to fail.

use nx::collectives::Error as CollectiveError;
use nx::testing::strategies;
use nx::testing::{same_as_one_device, Fault, FaultKind, Op, Tol};
use nx::{Ctx, LaunchOptions, Mesh, MeshSpec, Placement, PlacementSpec, Tensor};
use proptest::prelude::*;

/// The block: y = relu(x · w1) · w2, with x's rows over `dp`, w1's columns and w2's rows over
/// `tp` (no byte moves until the end), then y's partial sums over `tp` closed onto rows over `dp`.
fn mlp<'d>(ctx: &Ctx<'d>, mesh: &Mesh<'d>, batch: usize) -> nx::Result<Tensor<'d, f64>> {
    let (d, h) = (8, 12);
    let p = |s: &str| -> nx::Result<Placement<'d>> { Ok(s.parse::<PlacementSpec>()?.over(mesh)?) };
    let x = Tensor::<f64>::randn(ctx, &[batch, d], &p("mesh(0:dp)")?, 1)?;
    let w1 = Tensor::<f64>::randn(ctx, &[d, h], &p("mesh(1:tp)")?, 2)?;
    let w2 = Tensor::<f64>::randn(ctx, &[h, d], &p("mesh(0:tp)")?, 3)?;
    let y = x.matmul(&w1)?.relu()?.matmul(&w2)?; // partial(tp; 0:dp)
    y.place(&p("mesh(0:dp)")?)
}

#[test]
fn the_block_gives_the_single_device_result_with_one_all_reduce_over_tp() {
    let mesh: MeshSpec = "dp=2,tp=3".parse().unwrap();
    let batch = 2 * 3 + 1; // uneven on purpose
                           // 1. the same values as on one device (the same axes, each of extent 1), every rank
    same_as_one_device(&mesh, &LaunchOptions::default(), Tol::close(1e-12, 1e-12), |ctx, m| {
        Ok(mlp(ctx, m, batch)?.full()?.to_vec()?)
    })
    .unwrap();
    // 2. exactly one all-reduce, over tp, moving what the plan says
    let opts = LaunchOptions { devices: Some(6), ..Default::default() };
    nx::launch_with(&opts, |ctx| {
        let m = mesh.over(ctx.devices()).map_err(nx::placement::Error::from)?;
        let (y, log) = ctx.record(|| mlp(ctx, &m, batch))?;
        assert_eq!(log.count(Op::AllReduce, &["tp"]), 1, "{log}");
        assert_eq!(log.collectives().count(), 1, "nothing else moves:\n{log}");
        // the plan of closing the sum: the same bytes
        let partial = "partial(tp; 0:dp)".parse::<PlacementSpec>()?.over(&m)?;
        let plan = nx::plan(&partial, y.placement(), &[batch, 8], nx::Dtype::F64)?;
        let e = log.collectives().next().expect("the all-reduce");
        assert_eq!(e.bytes_sent, plan.steps[0].bytes_sent[ctx.index()], "{log}\n{plan}");
        assert_eq!(e.bytes_received, plan.steps[0].bytes_received[ctx.index()]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_rank_that_fails_is_named_and_its_peers_released() {
    // rank 4 fails at its second collective (place's split, then the all-reduce): the run names
    // it, nothing hangs
    let mesh: MeshSpec = "dp=2,tp=3".parse().unwrap();
    let opts = LaunchOptions {
        devices: Some(6),
        faults: vec![Fault { rank: 4, at: 1, kind: FaultKind::Fail }],
        ..Default::default()
    };
    let e = nx::launch_with(&opts, |ctx| {
        let m = mesh.over(ctx.devices()).map_err(nx::placement::Error::from)?;
        mlp(ctx, &m, 5).map(|_| ())
    })
    .unwrap_err();
    match e {
        nx::Error::Collectives(CollectiveError::RankFailed { rank: 4, why }) => {
            assert!(why.contains("nx fault injection: rank 4 failed at its collective 1, all_reduce_sum(f64"), "{why}");
        }
        other => panic!("{other}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn on_random_meshes_and_batches(mesh in strategies::meshes(2..=2, 1..=3), batch in 0usize..9) {
        same_as_one_device(&mesh, &LaunchOptions::default(), Tol::close(1e-12, 1e-12), |ctx, m| {
            Ok(mlp(ctx, m, batch)?.full()?.to_vec()?)
        })
        .unwrap_or_else(|e| panic!("{mesh}, batch {batch}: {e}"));
    }
}
