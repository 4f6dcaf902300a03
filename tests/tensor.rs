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
    use nx::Error;
    use proptest::prelude::*;

    const SPECS: [&str; 6] = ["mesh()", "mesh(0:dp)", "mesh(1:tp)", "mesh(0:dp, 1:tp)", "mesh(0:tp)", "mesh(1:dp)"];
    /// The mesh axes that cut tensor axes 0 and 1 at each of `SPECS`, written out.
    const CUTS: [[&[&str]; 2]; 6] =
        [[&[], &[]], [&["dp"], &[]], [&[], &["tp"]], [&["dp"], &["tp"]], [&["tp"], &[]], [&[], &["dp"]]];

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    /// The placement spec with `sums` and the cuts `cuts` (an uncut axis left out): `mesh(…)`
    /// without sums.
    fn spec(sums: &[&str], cuts: &[(usize, &[&str])]) -> PlacementSpec {
        let cuts: Vec<(usize, Vec<String>)> =
            cuts.iter().filter(|c| !c.1.is_empty()).map(|&(a, c)| (a, names(c))).collect();
        if sums.is_empty() {
            PlacementSpec::Mesh { cuts }
        } else {
            PlacementSpec::Partial { sums: names(sums), cuts }
        }
    }

    /// An `Invalid` error of `func` whose message contains every one of `says`.
    fn invalid(r: nx::Result<impl std::fmt::Debug>, func: &str, says: &[&str]) {
        match r {
            Err(Error::Invalid { func: f, why }) => {
                assert_eq!(f, func, "{why}");
                for s in says {
                    assert!(why.contains(s), "{func}: {why:?} does not say {s:?}");
                }
            }
            other => panic!("{func}: want an Invalid error saying {says:?}, got {other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// For random meshes, uneven shapes and operand placements: every op gives the
        /// single-device value at the placement the rules of `nx::Tensor` give, and refuses exactly
        /// where they refuse, with the error they state.
        #[test]
        fn ops_match_one_device(dp in 1usize..=3, tp in 1usize..=3, m in 1usize..=7, k in 1usize..=7, n in 1usize..=7, pa in 0usize..6, pb in 0usize..6) {
            let want = mm(m, k, n, a, b);
            let (ca, cb) = (CUTS[pa], CUTS[pb]);
            let r = launch_with(&opts(dp * tp), |ctx| -> nx::Result<()> {
                let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
                let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
                let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p(SPECS[pa])?, a)?;
                let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p(SPECS[pb])?, b)?;
                let (xp, wp) = (format!("{}", x.placement()), format!("{}", w.placement()));
                // matmul: the contracting axis must be cut alike on both sides, and then sums over
                // its mesh axes; rows cut as x's, columns as w's; no mesh axis cuts two result axes
                let result = x.matmul(&w);
                let used = [ca[1], ca[0], cb[1]].concat();
                let repeated = used.iter().enumerate().any(|(i, c)| used[..i].contains(c));
                if ca[1] != cb[0] {
                    invalid(result, "nx::Tensor::contract", &["the contracting axis pair (1, 0) is cut over", &xp, &wp]);
                } else if repeated {
                    invalid(result, "nx::Tensor::contract", &["would cut two axes of the result", &xp, &wp]);
                } else {
                    let y = result?;
                    let want_spec = spec(ca[1], &[(0, ca[0]), (1, cb[1])]);
                    assert_eq!(y.placement().spec(), want_spec, "{} x {}", SPECS[pa], SPECS[pb]);
                    assert!(y.placement().equal(&want_spec.over(&mesh)?));
                    assert_eq!(y.placement().is_partial(), !ca[1].is_empty());
                    assert!(close(&y.full()?.to_vec()?, &want), "{} x {}", SPECS[pa], SPECS[pb]);
                }
                // sum over axis 1: partial over the mesh axes that cut it, axis 0's cut kept
                let s = x.sum(1)?;
                assert_eq!(s.placement().spec(), spec(ca[1], &[(0, ca[0])]), "sum(1) of {}", SPECS[pa]);
                let rows: Vec<f64> = (0..m).map(|i| (0..k).map(|j| a(&[i, j])).sum()).collect();
                assert!(close(&s.full()?.to_vec()?, &rows));
                // a linear map keeps a partial value partial; a nonlinear one refuses it
                let scaled = s.scale(2.0)?;
                assert_eq!(scaled.placement().spec(), s.placement().spec());
                assert!(close(&scaled.full()?.to_vec()?, &rows.iter().map(|v| 2.0 * v).collect::<Vec<_>>()));
                let relu = s.relu();
                if ca[1].is_empty() {
                    let relu = relu?;
                    assert_eq!(relu.placement().spec(), s.placement().spec());
                    assert!(close(&relu.full()?.to_vec()?, &rows.iter().map(|v| v.max(0.0)).collect::<Vec<_>>()));
                } else {
                    invalid(relu, "nx::Tensor::relu", &["a nonlinear map of a partial value", &format!("{}", s.placement())]);
                }
                // maps: an operand at an equal placement (both cut over the same mesh axes of more
                // than one device), or whose windows are x's on each axis (cut alike, or whole
                // along an axis of one element, which broadcasts) give x's
                // placement; others are an error naming both placements
                let y = Tensor::<f64>::from_fn(ctx, &[m, k], &p(SPECS[pb])?, b)?;
                let effective = |c: &[&str]| -> Vec<String> {
                    c.iter().filter(|&&a| if a == "dp" { dp > 1 } else { tp > 1 }).map(|s| s.to_string()).collect()
                };
                let equal = (0..2).all(|axis| effective(ca[axis]) == effective(cb[axis]));
                let windows = [m, k].iter().enumerate().all(|(axis, &len)| {
                    effective(cb[axis]) == effective(ca[axis]) || (len == 1 && effective(cb[axis]).is_empty())
                });
                let aligned = equal || windows;
                let (xl, yl) = (format!("{:#}", x.placement()), format!("{:#}", y.placement()));
                for (func, result, f) in [
                    ("nx::Tensor::mul", x.mul(&y), (|u, v| u * v) as fn(f64, f64) -> f64),
                    ("nx::Tensor::add", x.add(&y), |u, v| u + v),
                ] {
                    if aligned {
                        let z = result?;
                        assert_eq!(z.placement().spec(), x.placement().spec(), "{func}: {} and {}", SPECS[pa], SPECS[pb]);
                        let want: Vec<f64> = (0..m * k).map(|q| f(a(&[q / k, q % k]), b(&[q / k, q % k]))).collect();
                        assert!(close(&z.full()?.to_vec()?, &want));
                    } else {
                        invalid(result, func, &["operands placed differently", &xl, &yl]);
                    }
                }
                Ok(())
            });
            prop_assert!(r.is_ok(), "{r:?}");
        }
    }
}

#[test]
fn place_reads_a_strided_window_and_runs_warm_from_the_pool() {
    // each rank's window of a split(0) [7, 5] value given as the transpose of a [5, rows] array
    launch_with(&opts(3), |ctx| {
        let p = Placement::split(0, ctx.devices())?;
        let w = p.window(&[7, 5], ctx.index())?.expect("split gives every device a window");
        let (lo, rows) = (w[0].start, w[0].len());
        let f = |i: usize, j: usize| (i * 10 + j) as f32;
        let t = nx::kernels::Array::<f32>::from_fn_on(ctx.rig(), &[5, rows], |ix| f(lo + ix[1], ix[0]))?;
        let view = t.apply(&nx::kernels::Move::Permute(vec![1, 0]))?.expect("a view");
        assert!(!view.layout().is_contiguous());
        let x = Tensor::from_local(ctx, &[7, 5], &p, Some(view))?;
        let want: Vec<f32> = (0..7).flat_map(|i| (0..5).map(move |j| f(i, j))).collect();
        assert_eq!(x.full()?.to_vec()?, want);
        // warm: placing again takes every buffer from the rig's cache
        let y = Tensor::from_fn(ctx, &[7, 5], &p, |i| f(i[0], i[1]))?;
        let to = Placement::split(1, ctx.devices())?;
        drop(y.place(&to)?.full()?);
        let (fresh, reused) = (ctx.rig().pool_stats().fresh, ctx.rig().pool_stats().reused);
        for _ in 0..3 {
            let z = y.place(&to)?.full()?;
            assert_eq!(z.to_vec()?, want);
        }
        let stats = ctx.rig().pool_stats();
        assert_eq!(stats.fresh, fresh, "{stats:?}");
        // each round: the all-to-all's packed message and output, the all-gather's message and
        // output, all from the pool (outputs alone would be 2)
        assert!(stats.reused - reused >= 3 * 4, "{stats:?}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn sums_over_several_axes_squares_and_maps_of_several_outputs() {
    let f = |i: &[usize]| (i[0] * 13 + i[1] * 5 + i[2] * 3) as f64 * 0.125 - 4.0;
    for (dp, tp) in [(1, 1), (2, 1), (2, 2), (3, 2)] {
        let (b, t, c) = (2 * dp + 1, 3, 3 * tp + 1);
        let at = |k: usize| [k / (t * c), k / c % t, k % c];
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[b, t, c], &p("mesh(0:dp, 2:tp)")?, f)?;
            // the leading axes at once (a bias's gradient): partial over dp, still cut over tp
            let s = x.sum_axes(&[1, 0])?;
            if dp > 1 {
                assert_eq!(s.placement().to_string(), "partial(dp; 0:tp)");
            }
            let want: Vec<f64> = (0..c).map(|j| (0..b * t).map(|r| f(&[r / t, r % t, j])).sum::<f64>()).collect();
            assert!(close(&s.full()?.to_vec()?, &want));
            // no axis: the value itself; an axis past the rank or named twice: errors
            assert!(close(&x.sum_axes(&[])?.full()?.to_vec()?, &x.full()?.to_vec()?));
            let e = x.sum_axes(&[3]).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::sum_axes") && e.contains("axis 3"), "{e}");
            assert!(x.sum_axes(&[1, 1]).is_err());
            // the sum of squares, closed across the mesh
            let q = x.sum_squares()?;
            assert!(q.shape().is_empty());
            let want: f64 = (0..b * t * c).map(|k| f(&at(k)).powi(2)).sum();
            let got = q.place(&p("mesh()")?)?.full()?.to_vec()?[0];
            assert!((got - want).abs() <= 1e-12 * want, "{got} against {want}");
            // of a partial value: an error
            if dp > 1 {
                let e = s.sum_squares().unwrap_err().to_string();
                assert!(e.contains("partial"), "{e}");
            }
            // three outputs of one pass, placed as the operands
            let y = Tensor::<f64>::from_fn(ctx, &[b, t, c], &p("mesh(0:dp, 2:tp)")?, |i| f(i) * 0.5 + 1.0)?;
            let outs = x.map_many(&[&y], false, |pr, l| {
                let s = pr.add(l[0], l[1]);
                let m = pr.mul(l[0], l[1]);
                let two = pr.float(2.0);
                vec![s, m, pr.mul(s, two)]
            })?;
            assert_eq!(outs.len(), 3);
            let (xv, yv) = (x.full()?.to_vec()?, y.full()?.to_vec()?);
            let wants: [Vec<f64>; 3] = [
                xv.iter().zip(&yv).map(|(a, b)| a + b).collect(),
                xv.iter().zip(&yv).map(|(a, b)| a * b).collect(),
                xv.iter().zip(&yv).map(|(a, b)| 2.0 * (a + b)).collect(),
            ];
            for (o, w) in outs.iter().zip(&wants) {
                assert!(o.placement().equal(x.placement()));
                assert!(close(&o.full()?.to_vec()?, w));
            }
            assert!(x.map_many(&[], false, |_, _| Vec::new()).is_err());
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn place_all_closes_sums_as_place_does_each() {
    for (dp, tp) in [(1, 1), (2, 2), (3, 2), (2, 3)] {
        let (m, k, n) = (2 * dp * tp + 1, 3 * tp + 1, 2 * tp + 1);
        let want = mm(m, k, n, a, b);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            // sums over tp (rows cut over dp), over dp (whole), over both
            let y1 = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(0:dp, 1:tp)")?, a)?.matmul(&Tensor::from_fn(
                ctx,
                &[k, n],
                &p("mesh(0:tp)")?,
                b,
            )?)?;
            let y2 = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(1:dp)")?, a)?.matmul(&Tensor::from_fn(
                ctx,
                &[k, n],
                &p("mesh(0:dp)")?,
                b,
            )?)?;
            let y3 = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(1:dp.tp)")?, a)?.matmul(&Tensor::from_fn(
                ctx,
                &[k, n],
                &p("mesh(0:dp.tp)")?,
                b,
            )?)?;
            let on = Placement::on(ctx.devices());
            // y2 twice to mesh(): a bucket of two, packed and copied out; y1 to where it lies
            let to = [
                p("mesh(0:dp)")?,
                p("mesh()")?,
                p("mesh()")?,
                on.clone(),
                p("mesh(1:tp)")?,
                p("mesh()")?,
                y1.placement().clone(),
            ];
            let values = [&y1, &y2, &y3, &y1, &y2, &y2, &y1];
            let all = Tensor::place_all(&values, &to.iter().collect::<Vec<_>>())?;
            for (i, ((v, at), got)) in values.iter().zip(&to).zip(&all).enumerate() {
                assert!(got.placement().equal(at), "value {i}: {}", got.placement());
                let one = v.place(at)?;
                let bits = |t: &Tensor<'_, f64>| {
                    t.to_local().map(|l| l.to_vec().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()))
                };
                assert_eq!(bits(got).transpose()?, bits(&one).transpose()?, "value {i} on rank {}", ctx.rank());
                assert!(close(&got.full()?.to_vec()?, &want), "value {i}");
            }
            let e = Tensor::place_all(&values, &[&on]).unwrap_err().to_string();
            assert!(e.contains("place_all") && e.contains("7 values for 1 placements"), "{e}");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

/// `Tensor::zeros` at split, uneven, empty and partial placements: every rank's window has the
/// placement's shape (as `from_fn`'s), every element is +0 (bit for bit) and the whole value is
/// zeros.
#[test]
fn zeros_at_every_placement() {
    for (dp, tp) in [(1, 1), (2, 2), (3, 2)] {
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            for (spec, shape) in [
                ("mesh(0:dp, 1:tp)", vec![2 * dp + 1, 3 * tp + 1]),
                ("mesh(1:dp)", vec![4, 0]),
                ("partial(tp; 0:dp)", vec![dp + 1, 5]),
                ("on", vec![]),
            ] {
                let z = Tensor::<f32>::zeros(ctx, &shape, &p(spec)?)?;
                let want = Tensor::<f32>::from_fn(ctx, &shape, &p(spec)?, |_| 1.0)?;
                let (zl, wl) = (z.to_local(), want.to_local());
                assert_eq!(zl.map(|a| a.shape().to_vec()), wl.map(|a| a.shape().to_vec()), "{spec}");
                if let Some(l) = zl {
                    assert!(l.to_vec()?.iter().all(|x| x.to_bits() == 0), "{spec}");
                }
                let full = z.full()?.to_vec()?;
                assert_eq!(full.len(), shape.iter().product::<usize>(), "{spec}");
                assert!(full.iter().all(|x| x.to_bits() == 0), "{spec}");
            }
            Ok(())
        })
        .unwrap();
    }
}

/// A sum of one term (partial over a mesh axis of extent 1) closes where it lies: `place` and
/// `place_all` answer the value's own windows (the same memory, no message); with two terms the
/// closed value is new memory. The values against the f64 product either way.
#[test]
fn a_sum_of_one_term_closes_without_a_copy() {
    for (dp, tp) in [(1, 1), (2, 1), (3, 1), (1, 2)] {
        let (m, k, n) = (2 * dp + 1, 3 * tp + 1, 4);
        let want = mm(m, k, n, a, b);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(0:dp, 1:tp)")?, a)?;
            let y = x.matmul(&Tensor::from_fn(ctx, &[k, n], &p("mesh(0:tp)")?, b)?)?;
            assert_eq!(y.placement().to_string(), "partial(tp; 0:dp)");
            let closed = y.placement().closed();
            let one = y.place(&closed)?;
            let all = Tensor::place_all(&[&y], &[&closed])?.remove(0);
            for got in [&one, &all] {
                assert!(got.placement().equal(&closed), "{}", got.placement());
                let (g, v) = (got.to_local().expect("a window"), y.to_local().expect("a window"));
                assert_eq!(g.buffer().overlaps(v.buffer()), tp == 1, "dp={dp}, tp={tp}");
                assert!(close(&got.full()?.to_vec()?, &want));
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

/// `contract_add`: the bias the product's initial value, on meshes of 1–6 devices, column- and
/// row-parallel, uneven sizes, against the f64 product plus bias; in f32 over at most 512
/// contracting indices the bits of `contract` then `add`, past that within f32's rounding; a bias
/// placed otherwise than the result's columns is refused naming both placements.
#[test]
fn contract_add_starts_the_product_from_the_bias() {
    let bias = |i: &[usize]| 0.25 * i[0] as f64 - 1.0;
    for (dp, tp) in [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 3)] {
        for k in [3 * tp + 1, 600] {
            let (m, n) = (2 * dp * tp + 1, 2 * tp + 1);
            let prod = mm(m, k, n, a, b);
            let want: Vec<f64> = (0..m * n).map(|e| prod[e] + bias(&[e % n])).collect();
            launch_with(&opts(dp * tp), |ctx| {
                let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
                let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
                let spec = nx::kernels::Contraction { batch: vec![], contracting: vec![(1, 0)] };
                let f = |t: &Tensor<'_, f32>| -> nx::Result<Vec<f64>> {
                    Ok(t.full()?.to_vec()?.into_iter().map(f64::from).collect())
                };
                let near = |got: &[f64]| {
                    got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-5 * k as f64 * (1.0 + w.abs()))
                };
                let x = Tensor::<f32>::from_fn(ctx, &[m, k], &p("mesh(0:dp)")?, |i| a(i) as f32)?;
                // column-parallel: the bias cut as the columns
                let w = Tensor::<f32>::from_fn(ctx, &[k, n], &p("mesh(1:tp)")?, |i| b(i) as f32)?;
                let bc = Tensor::<f32>::from_fn(ctx, &[n], &p("mesh(0:tp)")?, |i| bias(i) as f32)?;
                let y = x.contract_add(&w, &spec, &bc)?;
                assert_eq!(y.placement().to_string(), "mesh(0:dp, 1:tp)");
                let two = x.contract(&w, &spec)?.add(&bc)?;
                let (gy, g2) = (f(&y)?, f(&two)?);
                assert!(near(&gy), "k={k}: {gy:?}");
                if k <= 512 {
                    assert_eq!(
                        gy.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        g2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    );
                }
                // row-parallel: a sum over tp closed, the replicated bias added after
                let xr = Tensor::<f32>::from_fn(ctx, &[m, k], &p("mesh(0:dp, 1:tp)")?, |i| a(i) as f32)?;
                let wr = Tensor::<f32>::from_fn(ctx, &[k, n], &p("mesh(0:tp)")?, |i| b(i) as f32)?;
                let br = Tensor::<f32>::from_fn(ctx, &[n], &p("mesh()")?, |i| bias(i) as f32)?;
                let y = xr.contract_add(&wr, &spec, &br)?;
                assert_eq!(y.placement().to_string(), "mesh(0:dp)");
                assert!(near(&f(&y)?));
                // a partial bias: refused by name
                let part = Tensor::<f32>::from_fn(ctx, &[n], &p("partial(dp)")?, |i| bias(i) as f32)?;
                if dp > 1 {
                    let e = x.contract_add(&w, &spec, &part).unwrap_err().to_string();
                    assert!(e.contains("contract_add") && e.contains("partial bias"), "{e}");
                }
                // the whole bias against columns cut over tp: refused
                if tp > 1 {
                    let e = x.contract_add(&w, &spec, &br).unwrap_err().to_string();
                    assert!(e.contains("contract_add") && e.contains("mesh(0:dp, 1:tp)"), "{e}");
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("dp={dp},tp={tp},k={k}: {e}"));
        }
    }
}

/// `contract_add` on windows that are empty (fewer columns than `tp`, fewer rows than `dp`) and
/// on a rank-3 operand with a `[1, n]` bias broadcast over two leading axes, in f32, against
/// the f64 product plus bias.
#[test]
fn contract_add_on_empty_windows_and_rank_three() {
    let bias = |i: &[usize]| 0.5 * i[i.len() - 1] as f64 - 0.75;
    for (dp, tp) in [(2, 3), (3, 2), (1, 4)] {
        for (m, n) in [(1, 2), (dp + 1, 1), (0, 3)] {
            let k = 5;
            let prod = mm(m, k, n, a, b);
            launch_with(&opts(dp * tp), |ctx| {
                let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
                let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
                let spec = nx::kernels::Contraction { batch: vec![], contracting: vec![(1, 0)] };
                let x = Tensor::<f32>::from_fn(ctx, &[m, k], &p("mesh(0:dp)")?, |i| a(i) as f32)?;
                let w = Tensor::<f32>::from_fn(ctx, &[k, n], &p("mesh(1:tp)")?, |i| b(i) as f32)?;
                let bc = Tensor::<f32>::from_fn(ctx, &[n], &p("mesh(0:tp)")?, |i| bias(i) as f32)?;
                let got = x.contract_add(&w, &spec, &bc)?.full()?.to_vec()?;
                assert_eq!(got.len(), m * n);
                for (e, g) in got.iter().enumerate() {
                    let want = prod[e] + bias(&[e % n]);
                    assert!(
                        (f64::from(*g) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{m}x{n} element {e}: {g} vs {want}"
                    );
                }
                // rank 3: [2, m, k] · [k, n] + [1, n], the batch axis cut over dp
                let x3 =
                    Tensor::<f32>::from_fn(ctx, &[2, m, k], &p("mesh(0:dp)")?, |i| (a(&i[1..]) + i[0] as f64) as f32)?;
                let b2 = Tensor::<f32>::from_fn(ctx, &[1, n], &p("mesh(1:tp)")?, |i| bias(i) as f32)?;
                let spec3 = nx::kernels::Contraction { batch: vec![], contracting: vec![(2, 0)] };
                let got = x3.contract_add(&w, &spec3, &b2)?.full()?.to_vec()?;
                assert_eq!(got.len(), 2 * m * n);
                let bsum: Vec<f64> = (0..n).map(|j| (0..k).map(|q| b(&[q, j])).sum()).collect();
                for (e, g) in got.iter().enumerate() {
                    let (h, rest) = (e / (m * n).max(1), e % (m * n).max(1));
                    let want = prod[rest] + h as f64 * bsum[rest % n] + bias(&[0, rest % n]);
                    assert!(
                        (f64::from(*g) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "rank 3 {m}x{n} element {e}: {g} vs {want}"
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("dp={dp},tp={tp},{m}x{n}: {e}"));
        }
    }
}
