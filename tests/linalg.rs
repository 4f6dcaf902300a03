//! `Tensor` matrix routines (`cholesky`, `solve`, `solve_triangular`) on meshes of 1–6 simulated
//! ranks with batches cut over them, against naive f64 computations written here; errors for
//! matrix axes the placement cuts, sums of terms, and operands placed apart.

use nx::{launch_with, LaunchOptions, Placement, PlacementSpec, Tensor};

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

/// Matrix b of a batch: diagonally dominant, so positive definite where symmetric.
fn a(i: &[usize]) -> f64 {
    let (b, r, c) = (i[0], i[1], i[2]);
    let off = (((r + c) * 7 + b * 3) % 11) as f64 * 0.1 - 0.5; // symmetric in (r, c)
    if r == c {
        6.0 + b as f64
    } else {
        off
    }
}

const MESHES: [(usize, usize); 5] = [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)];

#[test]
fn batched_routines_match_naive_loops_on_every_mesh() {
    for (dp, tp) in MESHES {
        let (batch, n, k) = (2 * dp + 1, 5, 2);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[batch, n, n], &p("mesh(0:dp)")?, a)?;
            let rhs =
                Tensor::<f64>::from_fn(ctx, &[batch, n, k], &p("mesh(0:dp)")?, |i| (i[1] * 3 + i[2]) as f64 - 4.0)?;
            let l = x.cholesky()?.full()?.to_vec()?;
            let sol = x.solve(&rhs)?.full()?.to_vec()?;
            let low = x.solve_triangular(&rhs, true, false)?.full()?.to_vec()?;
            for b in 0..batch {
                let m = |r: usize, c: usize| a(&[b, r, c]);
                let rb = |r: usize, c: usize| (r * 3 + c) as f64 - 4.0;
                // naive Cholesky
                let mut want = vec![0.0; n * n];
                for j in 0..n {
                    let d = m(j, j) - (0..j).map(|q| want[j * n + q] * want[j * n + q]).sum::<f64>();
                    want[j * n + j] = d.sqrt();
                    for i in j + 1..n {
                        want[i * n + j] = (m(i, j) - (0..j).map(|q| want[i * n + q] * want[j * n + q]).sum::<f64>())
                            / want[j * n + j];
                    }
                }
                let got = &l[b * n * n..(b + 1) * n * n];
                assert!(
                    got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-12),
                    "cholesky {b} on {dp}×{tp}: {got:?}"
                );
                // solve: the residual of the kernel's x, and forward substitution naively
                for c in 0..k {
                    for r in 0..n {
                        let s: f64 = (0..n).map(|q| m(r, q) * sol[(b * n + q) * k + c]).sum();
                        assert!((s - rb(r, c)).abs() < 1e-11, "solve {b}: residual at ({r}, {c})");
                    }
                    let mut y = vec![0.0; n];
                    for r in 0..n {
                        y[r] = (rb(r, c) - (0..r).map(|q| m(r, q) * y[q]).sum::<f64>()) / m(r, r);
                        assert!((low[(b * n + r) * k + c] - y[r]).abs() < 1e-12, "solve_triangular {b} at ({r}, {c})");
                    }
                }
            }
            // errors: matrix axes cut, a sum, operands placed apart
            if tp > 1 {
                let cut = x.place(&p("mesh(1:tp)")?)?;
                let e = cut.cholesky().unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::cholesky") && e.contains("place it whole"), "{e}");
                let e = x.solve(&rhs.place(&p("mesh(0:dp, 2:tp)")?)?).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::solve"), "{e}");
                let part = x.place(&p("partial(tp; 0:dp)")?)?;
                let e = part.cholesky().unwrap_err().to_string();
                assert!(e.contains("sum of terms"), "{e}");
            }
            if dp > 1 {
                let e = x.solve(&rhs.place(&Placement::on(ctx.devices()))?).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::solve") && e.contains("place them alike"), "{e}");
            }
            let e = Tensor::<f64>::zeros(ctx, &[3], &Placement::on(ctx.devices()))?.cholesky().unwrap_err().to_string();
            assert!(e.contains("rank below 2"), "{e}");
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn decompositions_reconstruct_their_matrices_on_every_mesh() {
    for (dp, tp) in MESHES {
        let (batch, m, n) = (2 * dp + 1, 5, 3);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p: Placement<'_> = "mesh(0:dp)".parse::<PlacementSpec>()?.over(&mesh)?;
            let f = |i: &[usize]| {
                ((i[0] * 31 + i[1] * 7 + i[2] * 3) % 13) as f64 * 0.25 - 1.5 + if i[1] == i[2] { 2.0 } else { 0.0 }
            };
            let x = Tensor::<f64>::from_fn(ctx, &[batch, m, n], &p, f)?;
            let (q, r) = x.qr(false)?;
            let (u, s, vh) = x.svd(false)?;
            let vals = x.svdvals()?.full()?.to_vec()?;
            let (q, r, u, s, vh) = (
                q.full()?.to_vec()?,
                r.full()?.to_vec()?,
                u.full()?.to_vec()?,
                s.full()?.to_vec()?,
                vh.full()?.to_vec()?,
            );
            let k = n;
            for b in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let qr: f64 = (0..k).map(|t| q[(b * m + i) * k + t] * r[(b * k + t) * n + j]).sum();
                        let usv: f64 =
                            (0..k).map(|t| u[(b * m + i) * k + t] * s[b * k + t] * vh[(b * k + t) * n + j]).sum();
                        let want = f(&[b, i, j]);
                        assert!(
                            (qr - want).abs() < 1e-12 && (usv - want).abs() < 1e-12,
                            "batch {b} ({i}, {j}) on {dp}×{tp}"
                        );
                    }
                }
                assert!((0..k).all(|t| (vals[b * k + t] - s[b * k + t]).abs() < 1e-12));
            }
            // eigh of the symmetric x·xᵀ (built here in f64, its lower triangle read)
            let g = |i: &[usize]| (0..n).map(|t| f(&[i[0], i[1], t]) * f(&[i[0], i[2], t])).sum::<f64>();
            let h = Tensor::<f64>::from_fn(ctx, &[batch, m, m], &p, g)?;
            let (w, v) = h.eigh()?;
            let (w, v) = (w.full()?.to_vec()?, v.full()?.to_vec()?);
            for b in 0..batch {
                assert!(w[b * m..(b + 1) * m].windows(2).all(|p| p[0] <= p[1]), "ascending");
                for i in 0..m {
                    for j in 0..m {
                        let hv: f64 = (0..m).map(|t| g(&[b, i, t]) * v[(b * m + t) * m + j]).sum();
                        assert!(
                            (hv - v[(b * m + i) * m + j] * w[b * m + j]).abs() < 1e-10,
                            "h·v = v·w at batch {b} ({i}, {j})"
                        );
                    }
                }
            }
            // eig of the square leading block of x (not symmetric): x·v = v·diag(w), in complex f64
            let sq = |i: &[usize]| f(&[i[0], i[1], i[2]]) + (i[1] as f64 - i[2] as f64) * 0.5;
            let e = Tensor::<f64>::from_fn(ctx, &[batch, n, n], &p, sq)?;
            let (w, v) = e.eig()?;
            assert!(w.placement().equal(&p) && v.placement().equal(&p));
            let (w, v) = (w.full()?.to_vec()?, v.full()?.to_vec()?);
            for b in 0..batch {
                for j in 0..n {
                    // unit columns: zero vectors would satisfy the residual check alone
                    let len: f64 = (0..n).map(|t| v[(b * n + t) * n + j].norm_sqr()).sum::<f64>().sqrt();
                    assert!((len - 1.0).abs() < 1e-12, "column {j} of batch {b}: norm {len}");
                }
                for i in 0..n {
                    for j in 0..n {
                        let xv: num_complex::Complex64 = (0..n).map(|t| v[(b * n + t) * n + j] * sq(&[b, i, t])).sum();
                        assert!(
                            (xv - v[(b * n + i) * n + j] * w[b * n + j]).norm() < 1e-10,
                            "x·v = v·w at batch {b} ({i}, {j}) on {dp}×{tp}"
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    }
}
