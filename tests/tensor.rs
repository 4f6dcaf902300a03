//! Distributed tensors: each op's result placement and value against a single-device computation,
//! on meshes of 1 to 6 simulated ranks and uneven shapes; errors for mismatched placements and for
//! nonlinear maps of partial values.

use nx::{launch_with, LaunchOptions, Placement, PlacementSpec, Tensor};

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

fn a(i: &[usize]) -> f64 {
    (i[0] * 7 + i[1] * 3) as f64 * 0.25 - 2.0
}
fn b(i: &[usize]) -> f64 {
    (i[0] * 5 + i[1] * 11 % 7) as f64 * 0.125 - 1.0
}

/// Naive `[m, k] · [k, n]` of two index functions.
fn mm(m: usize, k: usize, n: usize, f: impl Fn(&[usize]) -> f64, g: impl Fn(&[usize]) -> f64) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| f(&[i, p]) * g(&[p, j])).sum();
        }
    }
    out
}

fn close(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(x, y)| (x - y).abs() <= 1e-12 * (1.0 + y.abs()))
}

#[test]
fn matmul_follows_the_contraction_rules_on_every_mesh() {
    for (dp, tp) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 3)] {
        let (m, k, n) = (2 * dp * tp + 1, 3 * tp + 1, 2 * tp + 1); // uneven: n·k+1
        let want = mm(m, k, n, a, b);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            // row-split x whole -> row-split; whole x column-split -> column-split
            let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(0:dp)")?, a)?;
            let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p("mesh(1:tp)")?, b)?;
            let y = x.matmul(&w)?;
            assert_eq!(y.placement().to_string(), "mesh(0:dp, 1:tp)");
            assert!(close(&y.full()?.to_vec()?, &want));
            // contracting axis split on both -> partial over its mesh axes, closed by place
            let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(0:dp, 1:tp)")?, a)?;
            let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p("mesh(0:tp)")?, b)?;
            let y = x.matmul(&w)?;
            assert_eq!(y.placement().to_string(), "partial(tp; 0:dp)");
            assert!(y.placement().is_partial());
            assert!(close(&y.full()?.to_vec()?, &want));
            // whole x whole -> whole, every rank computes it
            let on = Placement::on(ctx.devices());
            let y = Tensor::<f64>::from_fn(ctx, &[m, k], &on, a)?.matmul(&Tensor::from_fn(ctx, &[k, n], &on, b)?)?;
            assert_eq!(y.placement().to_string(), "on");
            assert!(close(&y.to_local().unwrap().to_vec()?, &want));
            // the contracting axis cut differently on the two sides is an error naming both
            let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(1:tp)")?, a)?;
            let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p("mesh()")?, b)?;
            if tp > 1 {
                let e = x.matmul(&w).unwrap_err().to_string();
                assert!(e.contains("contracting axis") && e.contains("mesh(1:tp)") && e.contains("mesh()"), "{e}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn maps_keep_their_placement_and_refuse_what_does_not_fit() {
    for (dp, tp) in [(1, 1), (2, 1), (2, 2), (3, 2)] {
        let (m, n) = (2 * dp + 1, 3 * tp + 1);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let pl = p("mesh(0:dp, 1:tp)")?;
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &pl, a)?;
            let y = Tensor::<f64>::from_fn(ctx, &[m, n], &pl, b)?;
            let z = x.mul(&y)?.add(&x.scale(2.0)?)?.relu()?;
            assert!(z.placement().equal(&pl));
            let want: Vec<f64> =
                (0..m * n).map(|k| [k / n, k % n]).map(|i| (a(&i) * b(&i) + 2.0 * a(&i)).max(0.0)).collect();
            assert!(close(&z.full()?.to_vec()?, &want));
            // a bias over tp broadcast along the rows
            let bias = Tensor::<f64>::from_fn(ctx, &[n], &p("mesh(0:tp)")?, |i| i[0] as f64)?;
            let s = x.add(&bias)?;
            let want: Vec<f64> = (0..m * n).map(|k| a(&[k / n, k % n]) + (k % n) as f64).collect();
            assert!(close(&s.full()?.to_vec()?, &want));
            // differently placed operands: an error naming both placements
            if dp > 1 || tp > 1 {
                let other = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(1:dp)")?, b)?;
                let e = x.add(&other).unwrap_err().to_string();
                assert!(e.contains("placed differently") && e.contains("mesh(1:dp)"), "{e}");
            }
            // a sum over a split axis is partial; a nonlinear map of it is an error, a linear one not
            let rows = x.sum(1)?;
            if tp > 1 {
                assert_eq!(rows.placement().to_string(), "partial(tp; 0:dp)");
                let e = rows.relu().unwrap_err().to_string();
                assert!(e.contains("nonlinear map of a partial value"), "{e}");
            }
            let doubled = rows.add(&rows)?;
            let want: Vec<f64> = (0..m).map(|i| 2.0 * (0..n).map(|j| a(&[i, j])).sum::<f64>()).collect();
            assert!(close(&doubled.full()?.to_vec()?, &want));
            // a sum over a whole axis is local
            let cols = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(1:tp)")?, a)?.sum(0)?;
            assert_eq!(cols.placement().to_string(), "mesh(0:tp)");
            let want: Vec<f64> = (0..n).map(|j| (0..m).map(|i| a(&[i, j])).sum::<f64>()).collect();
            assert!(close(&cols.full()?.to_vec()?, &want));
            // transpose carries the cuts
            let t = x.transpose()?;
            assert_eq!(t.placement().to_string(), "mesh(1:dp, 0:tp)");
            let want: Vec<f64> = (0..n * m).map(|k| a(&[k % m, k / m])).collect();
            assert!(close(&t.full()?.to_vec()?, &want));
            // randn gives one global value whatever the placement
            let r1 = Tensor::<f64>::randn(ctx, &[m, n], &pl, 7)?.full()?.to_vec()?;
            let r2 = Tensor::<f64>::randn(ctx, &[m, n], &p("mesh(1:dp)")?, 7)?.full()?.to_vec()?;
            assert_eq!(r1, r2);
            // from_local checks the window
            let e = Tensor::<f64>::from_local(ctx, &[m, n], &pl, None).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::from_local"), "{e}");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn plan_shows_what_place_moves() {
    launch_with(&opts(4), |ctx| {
        let mesh = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        let x = Tensor::<f32>::from_fn(ctx, &[9, 5], &Placement::mesh(&mesh, &[(0, &["tp"])])?, |i| i[0] as f32)?;
        let to = Placement::mesh(&mesh, &[(1, &["tp"])])?;
        let plan = x.plan(&to)?;
        assert_eq!(plan.steps[0].op, nx::placement::Op::AllToAll);
        let moved = x.place(&to)?;
        assert!(moved.placement().equal(&to));
        assert_eq!(moved.full()?.to_vec()?, x.full()?.to_vec()?);
        Ok(())
    })
    .unwrap();
}

#[test]
fn general_contractions_distribute_gather_and_rand() {
    for (dp, tp) in [(1, 1), (2, 1), (2, 2), (3, 2)] {
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            // a [B, M, K] with b [K, B, N]: batch (0, 1), contracting (2, 0); batch over dp, K over tp
            let (bt, m, k, n) = (dp + 1, 3, 2 * tp + 1, 2);
            let fa = |i: &[usize]| (i[0] * 100 + i[1] * 10 + i[2]) as f64 * 0.01;
            let fb = |i: &[usize]| (i[0] as f64 - 2.0 * i[1] as f64 + 0.5 * i[2] as f64) * 0.1;
            let a = Tensor::<f64>::from_fn(ctx, &[bt, m, k], &p("mesh(0:dp, 2:tp)")?, fa)?;
            let b = Tensor::<f64>::from_fn(ctx, &[k, bt, n], &p("mesh(1:dp, 0:tp)")?, fb)?;
            let spec = nx::kernels::Contraction { batch: vec![(0, 1)], contracting: vec![(2, 0)] };
            let y = a.contract(&b, &spec)?;
            assert_eq!(y.placement().to_string(), "partial(tp; 0:dp)"); // batch over dp, K summed over tp
            let got = y.full()?.to_vec()?;
            for z in 0..bt {
                for i in 0..m {
                    for j in 0..n {
                        let w: f64 = (0..k).map(|q| fa(&[z, i, q]) * fb(&[q, z, j])).sum();
                        assert!((got[(z * m + i) * n + j] - w).abs() < 1e-12);
                    }
                }
            }
            // distribute from the last rank, gather to rank 0 alone
            let src = ctx.size() - 1;
            let whole = (ctx.rank() == src)
                .then(|| nx::kernels::Array::<f32>::from_fn(ctx.device(), &[5, 3], |i| (i[0] * 3 + i[1]) as f32))
                .transpose()?;
            let t = Tensor::<f32>::distribute(ctx, &[5, 3], &p("mesh(0:dp, 1:tp)")?, src, whole)?;
            let at0 = t.full_on(0)?;
            assert_eq!(at0.is_some(), ctx.rank() == 0);
            if let Some(a) = at0 {
                assert_eq!(a.to_vec()?, (0..15).map(|x| x as f32).collect::<Vec<_>>());
            }
            // rand: one global value whatever the placement, in [0, 1)
            let r1 = Tensor::<f64>::rand(ctx, &[4, 5], &p("mesh(0:dp)")?, 3)?.full()?.to_vec()?;
            let r2 = Tensor::<f64>::rand(ctx, &[4, 5], &p("mesh(1:tp)")?, 3)?.full()?.to_vec()?;
            assert_eq!(r1, r2);
            assert!(r1.iter().all(|&x| (0.0..1.0).contains(&x)));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn automatic_placement_is_opt_in_and_moves_the_operand() {
    let run = |auto: bool| {
        launch_with(&LaunchOptions { devices: Some(4), auto_place: auto, ..Default::default() }, |ctx| {
            let mesh = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
            let x = Tensor::<f64>::from_fn(ctx, &[5, 3], &Placement::mesh(&mesh, &[(0, &["dp"])])?, a)?;
            let y = Tensor::<f64>::from_fn(ctx, &[5, 3], &Placement::mesh(&mesh, &[(1, &["tp"])])?, b)?;
            let z = x.add(&y)?;
            assert!(z.placement().equal(x.placement()));
            let want: Vec<f64> = (0..15).map(|q| a(&[q / 3, q % 3]) + b(&[q / 3, q % 3])).collect();
            assert!(close(&z.full()?.to_vec()?, &want));
            Ok(())
        })
    };
    assert!(run(false).unwrap_err().to_string().contains("placed differently"));
    run(true).unwrap();
}

mod random {
    use super::*;
    use proptest::prelude::*;

    const SPECS: [&str; 6] = ["mesh()", "mesh(0:dp)", "mesh(1:tp)", "mesh(0:dp, 1:tp)", "mesh(0:tp)", "mesh(1:dp)"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// For random meshes, uneven shapes and operand placements: every op either gives the
        /// single-device value at its documented placement, or refuses with a clear error.
        #[test]
        fn ops_match_one_device(dp in 1usize..=3, tp in 1usize..=3, m in 1usize..=7, k in 1usize..=7, n in 1usize..=7, pa in 0usize..6, pb in 0usize..6) {
            let want = mm(m, k, n, a, b);
            let r = launch_with(&opts(dp * tp), |ctx| -> nx::Result<()> {
                let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
                let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
                let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p(SPECS[pa])?, a)?;
                let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p(SPECS[pb])?, b)?;
                match x.matmul(&w) {
                    Ok(y) => assert!(close(&y.full()?.to_vec()?, &want), "{} x {}", SPECS[pa], SPECS[pb]),
                    Err(e) => assert!(e.to_string().starts_with("nx::Tensor::contract"), "{e}"),
                }
                let s = x.sum(1)?;
                let rows: Vec<f64> = (0..m).map(|i| (0..k).map(|j| a(&[i, j])).sum()).collect();
                assert!(close(&s.full()?.to_vec()?, &rows));
                let y = Tensor::<f64>::from_fn(ctx, &[m, k], &p(SPECS[pb])?, b)?;
                match x.mul(&y) {
                    Ok(z) => {
                        let want: Vec<f64> = (0..m * k).map(|q| a(&[q / k, q % k]) * b(&[q / k, q % k])).collect();
                        assert!(close(&z.full()?.to_vec()?, &want));
                    }
                    Err(e) => assert!(e.to_string().contains("placed differently"), "{e}"),
                }
                Ok(())
            });
            prop_assert!(r.is_ok(), "{r:?}");
        }
    }
}
