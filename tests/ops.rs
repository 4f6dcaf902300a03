//! `Tensor` ops along an axis (cumsum, cummax, cummin, logcumsumexp, sort, argsort, topk, gather,
//! scatter_add, concat, stack,
//! softmax, log_softmax) on meshes of 1–6 simulated ranks and uneven shapes, each against a naive
//! single-device computation written here; errors for axes the placement cuts.

use nx::{launch_with, LaunchOptions, Placement, PlacementSpec, Tensor};

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

fn f(i: &[usize]) -> f64 {
    ((i[0] * 37 + i[1] * 11) % 17) as f64 * 0.5 - 3.0
}

const MESHES: [(usize, usize); 5] = [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)];

#[test]
fn cumsum_and_sorts_along_a_whole_axis_match_one_device() {
    for (dp, tp) in MESHES {
        let (m, n) = (2 * dp + 1, 3 * tp + 2);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(0:dp)")?, f)?;
            // cumsum along the whole axis 1, of a closed and of a partial value
            let mut want = vec![0.0; m * n];
            for i in 0..m {
                let mut s = 0.0;
                for j in 0..n {
                    s += f(&[i, j]);
                    want[i * n + j] = s;
                }
            }
            let got = x.cumsum(1)?.full()?.to_vec()?;
            assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?}");
            let part = x.place(&p("partial(tp; 0:dp)")?)?;
            let got = part.cumsum(1)?.full()?.to_vec()?;
            assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "partial: {got:?}");
            // sorts: stable, descending, a top-3
            let (vals, pos) = x.topk(3, 1)?;
            let all = x.argsort(1, false)?.full()?.to_vec()?;
            let sorted = x.sort(1, true)?.full()?.to_vec()?;
            let (vals, pos) = (vals.full()?.to_vec()?, pos.full()?.to_vec()?);
            for i in 0..m {
                let mut lane: Vec<(f64, i64)> = (0..n).map(|j| (f(&[i, j]), j as i64)).collect();
                lane.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
                assert_eq!(&all[i * n..(i + 1) * n], lane.iter().map(|x| x.1).collect::<Vec<_>>().as_slice());
                lane.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
                assert_eq!(&sorted[i * n..(i + 1) * n], lane.iter().map(|x| x.0).collect::<Vec<_>>().as_slice());
                assert_eq!(&pos[i * 3..i * 3 + 3], lane[..3].iter().map(|x| x.1).collect::<Vec<_>>().as_slice());
                assert_eq!(&vals[i * 3..i * 3 + 3], lane[..3].iter().map(|x| x.0).collect::<Vec<_>>().as_slice());
            }
            // a cut axis is an error naming the placement; a sum cannot be sorted
            if dp > 1 {
                let e = x.cumsum(0).unwrap_err().to_string();
                assert!(
                    e.contains("nx::Tensor::cumsum") && e.contains("mesh(0:dp)") && e.contains("place it whole"),
                    "{e}"
                );
            }
            if tp > 1 {
                let e = part.sort(1, false).unwrap_err().to_string();
                assert!(e.contains("sum of terms"), "{e}");
            }
            assert!(x.topk(n + 1, 1).unwrap_err().to_string().contains("past axis 1"));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn running_extremes_and_logcumsumexp_along_a_whole_axis_match_one_device() {
    for (dp, tp) in MESHES {
        let (m, n) = (2 * dp + 1, 3 * tp + 2);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(0:dp)")?, f)?;
            let (mx, at) = x.cummax(1)?;
            let (mn, at_min) = x.cummin(1)?;
            let lse = x.logcumsumexp(1)?.full()?.to_vec()?;
            let (mx, at, mn, at_min) =
                (mx.full()?.to_vec()?, at.full()?.to_vec()?, mn.full()?.to_vec()?, at_min.full()?.to_vec()?);
            for i in 0..m {
                let (mut best, mut bi, mut least, mut li) = (f64::NEG_INFINITY, 0, f64::INFINITY, 0);
                for j in 0..n {
                    let v = f(&[i, j]);
                    if v > best {
                        (best, bi) = (v, j as i64);
                    }
                    if v < least {
                        (least, li) = (v, j as i64);
                    }
                    let k = i * n + j;
                    assert_eq!((mx[k], at[k], mn[k], at_min[k]), (best, bi, least, li), "at ({i}, {j})");
                    let l = (0..=j).map(|t| f(&[i, t]).exp()).sum::<f64>().ln();
                    assert!((lse[k] - l).abs() < 1e-12, "lse at ({i}, {j}): {} vs {l}", lse[k]);
                }
            }
            if dp > 1 {
                let e = x.cummax(0).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::cummax") && e.contains("place it whole"), "{e}");
            }
            if tp > 1 {
                let part = x.place(&p("partial(tp; 0:dp)")?)?;
                let e = part.logcumsumexp(1).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::logcumsumexp") && e.contains("sum of terms"), "{e}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn embedding_lookups_and_their_gradients_follow_the_placements() {
    for (dp, tp) in MESHES {
        let (vocab, width, tokens) = (7, 2 * tp + 1, 3 * dp + 1);
        let id = |t: usize| ((t * 5 + 2) % vocab) as i64;
        let table = |i: &[usize]| (i[0] * 10 + i[1]) as f64;
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            // a table cut over tp by columns, ids cut over dp: rows over dp, columns over tp
            let w = Tensor::<f64>::from_fn(ctx, &[vocab, width], &p("mesh(1:tp)")?, table)?;
            let ids = Tensor::<i64>::from_fn(ctx, &[tokens], &p("mesh(0:dp)")?, |i| id(i[0]))?;
            let rows = w.gather(0, &ids)?;
            assert!(rows.placement().equal(&p("mesh(0:dp, 1:tp)")?), "{}", rows.placement());
            let want: Vec<f64> =
                (0..tokens).flat_map(|t| (0..width).map(move |j| table(&[id(t) as usize, j]))).collect();
            assert_eq!(rows.full()?.to_vec()?, want);
            // ids of two axes: [2, tokens] → [2, tokens, width]
            let ids2 = Tensor::<i64>::from_fn(ctx, &[2, tokens], &p("mesh(1:dp)")?, |i| id(i[0] + i[1]))?;
            let r2 = w.gather(0, &ids2)?.full()?.to_vec()?;
            for a in 0..2 {
                for t in 0..tokens {
                    for j in 0..width {
                        assert_eq!(r2[(a * tokens + t) * width + j], table(&[id(a + t) as usize, j]));
                    }
                }
            }
            // the gradient: a sum over dp, closed by place
            let g = Tensor::<f64>::from_fn(ctx, &[tokens, width], &p("mesh(0:dp, 1:tp)")?, |i| {
                (i[0] + 1) as f64 * 0.5 + i[1] as f64
            })?;
            let grad = g.scatter_add(0, &ids, vocab)?;
            if dp > 1 {
                assert!(grad.placement().is_partial(), "{}", grad.placement());
            }
            let mut want = vec![0.0; vocab * width];
            for t in 0..tokens {
                for j in 0..width {
                    want[id(t) as usize * width + j] += (t + 1) as f64 * 0.5 + j as f64;
                }
            }
            let closed = grad.place(&p("mesh(1:tp)")?)?;
            assert_eq!(closed.full()?.to_vec()?, want);
            // a vocabulary cut over the mesh cannot be gathered along it, nor an index be a sum
            if tp > 1 {
                let cut = Tensor::<f64>::from_fn(ctx, &[vocab, width], &p("mesh(0:tp)")?, table)?;
                let e = cut.gather(0, &ids).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::gather") && e.contains("cut over tp"), "{e}");
                // rows over tp and ids over tp would cut two axes by one mesh axis
                let idt = Tensor::<i64>::from_fn(ctx, &[tokens], &p("mesh(0:tp)")?, |i| id(i[0]))?;
                let e = w.gather(0, &idt).unwrap_err().to_string();
                assert!(e.contains("would cut two axes"), "{e}");
            }
            // an index outside the table
            let bad =
                Tensor::<i64>::from_fn(
                    ctx,
                    &[tokens],
                    &p("mesh(0:dp)")?,
                    |i| if i[0] == 0 { vocab as i64 } else { 0 },
                )?;
            let e = w.gather(0, &bad);
            if ctx.rank() == 0 || dp == 1 {
                let e = e.unwrap_err().to_string();
                assert!(e.contains("outside the axis"), "{e}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn concat_stack_and_softmax_match_one_device() {
    for (dp, tp) in MESHES {
        let (m, n) = (2 * dp + 1, 2 * tp + 3);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let a = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(0:dp)")?, f)?;
            let b = Tensor::<f64>::from_fn(ctx, &[m, 2], &p("mesh(0:dp)")?, |i| -(i[0] as f64) - i[1] as f64)?;
            let c = a.concat(&[&b], 1)?.full()?.to_vec()?;
            for i in 0..m {
                for j in 0..n + 2 {
                    let want = if j < n { f(&[i, j]) } else { -(i as f64) - (j - n) as f64 };
                    assert_eq!(c[i * (n + 2) + j], want);
                }
            }
            let s = a.stack(&[&a.scale(2.0)?], 1)?;
            assert!(s.placement().equal(&p("mesh(0:dp)")?));
            let s = s.full()?.to_vec()?;
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(s[(i * 2) * n + j], f(&[i, j]));
                    assert_eq!(s[(i * 2 + 1) * n + j], 2.0 * f(&[i, j]));
                }
            }
            // stacked at axis 0: the cut of axis 0 moves to axis 1
            let s0 = a.stack(&[&a.scale(2.0)?], 0)?;
            if dp > 1 {
                assert!(s0.placement().equal(&p("mesh(1:dp)")?), "{}", s0.placement());
            }
            let s0 = s0.full()?.to_vec()?;
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(s0[i * n + j], f(&[i, j]));
                    assert_eq!(s0[(m + i) * n + j], 2.0 * f(&[i, j]));
                }
            }
            let sm = a.softmax(1)?.full()?.to_vec()?;
            let lsm = a.log_softmax(1)?.full()?.to_vec()?;
            for i in 0..m {
                let mx = (0..n).map(|j| f(&[i, j])).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = (0..n).map(|j| (f(&[i, j]) - mx).exp()).sum();
                for j in 0..n {
                    let want = f(&[i, j]) - mx - z.ln();
                    assert!((lsm[i * n + j] - want).abs() < 1e-12, "{} vs {want}", lsm[i * n + j]);
                    assert!((sm[i * n + j] - want.exp()).abs() < 1e-12);
                }
            }
            if dp > 1 {
                let e = a.concat(&[&b], 0).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::concat") && e.contains("cut over dp"), "{e}");
                let moved = b.place(&p("mesh()")?)?;
                let e = a.concat(&[&moved], 1).unwrap_err().to_string();
                assert!(e.contains("place one first"), "{e}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn attention_qkv_reads_queries_keys_and_values_packed_in_one_value() {
    for (dp, tp) in [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)] {
        let (b, h, t, d) = (dp + 1, 2 * tp, 9, 3);
        // entry e of axis 2: 0 queries, 1 keys, 2 values
        let x = |i: &[usize]| ((i[0] * 31 + i[1] * 17 + i[2] * 29 + i[3] * 7 + i[4] * 3) % 19) as f64 / 19.0 - 0.5;
        let at = |bb: usize, i: usize, e: usize, hh: usize, c: usize| x(&[bb, i, e, hh, c]);
        // the naive softmax(QKᵀ/√d)V in f64, causal or not, [b, t, h, d]
        let naive = |causal: bool| {
            let mut want = vec![0.0; b * t * h * d];
            for bb in 0..b {
                for hh in 0..h {
                    for i in 0..t {
                        let seen = if causal { i + 1 } else { t };
                        let s: Vec<f64> = (0..seen)
                            .map(|j| {
                                (0..d).map(|c| at(bb, i, 0, hh, c) * at(bb, j, 1, hh, c)).sum::<f64>()
                                    / (d as f64).sqrt()
                            })
                            .collect();
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = s.iter().map(|y| (y - m).exp()).sum();
                        for c in 0..d {
                            want[((bb * t + i) * h + hh) * d + c] =
                                (0..seen).map(|j| (s[j] - m).exp() / z * at(bb, j, 2, hh, c)).sum();
                        }
                    }
                }
            }
            want
        };
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = "mesh(0:dp, 3:tp)".parse::<PlacementSpec>()?.over(&mesh)?;
            let packed = Tensor::<f64>::from_fn(ctx, &[b, t, 3, h, d], &p, x)?;
            for causal in [true, false] {
                let o = packed.attention_qkv(causal, None)?;
                let want_p = "mesh(0:dp, 2:tp)".parse::<PlacementSpec>()?.over(&mesh)?;
                assert!(o.placement().equal(&want_p) && o.shape() == [b, t, h, d], "{}", o.placement());
                let got = o.full()?.to_vec()?;
                for (e, (g, w)) in got.iter().zip(naive(causal)).enumerate() {
                    assert!((g - w).abs() < 1e-12, "dp={dp},tp={tp},causal={causal} element {e}: {g} vs {w}");
                }
            }
            // on one device, and a batch of 1 over dp (a rank with an empty window): the same
            // values
            let on0 = Placement::device(ctx.devices(), 0)?;
            let o = packed.place(&on0)?.attention_qkv(true, None)?;
            assert!(o.placement().equal(&on0), "{}", o.placement());
            let want = naive(true);
            let close = |got: &[f64], what: &str| {
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 1e-12, "{what} dp={dp},tp={tp} element {e}: {g} vs {w}");
                }
            };
            close(&o.full()?.to_vec()?, "on device 0");
            let lone = Tensor::<f64>::from_fn(ctx, &[1, t, 3, h, d], &p, x)?;
            let got = lone.attention_qkv(true, None)?.full()?.to_vec()?;
            assert_eq!(got.len(), t * h * d);
            close(&got, "a batch of 1");
            // a sum of terms refused
            let sums = Placement::partial(&mesh, &["tp"], &[])?;
            let e =
                Tensor::<f64>::zeros(ctx, &[b, t, 3, h, d], &sums)?.attention_qkv(true, None).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::attention_qkv") && e.contains("sum of terms"), "{e}");
            // the packing axis, the rows or d cut; an axis of other than 3 entries; rank 3
            if tp > 1 {
                for (spec, axis) in [("mesh(2:tp)", 2), ("mesh(1:tp)", 1), ("mesh(4:tp)", 4)] {
                    let cut = packed.place(&spec.parse::<PlacementSpec>()?.over(&mesh)?)?;
                    let e = cut.attention_qkv(true, None).unwrap_err().to_string();
                    assert!(
                        e.contains("nx::Tensor::attention_qkv") && e.contains(&format!("axis {axis} is cut")),
                        "{e}"
                    );
                }
            }
            let whole = "mesh()".parse::<PlacementSpec>()?.over(&mesh)?;
            let four = Tensor::<f64>::zeros(ctx, &[b, t, 4, h, d], &whole)?;
            let e = four.attention_qkv(true, None).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::attention_qkv") && e.contains("[lead…, rows, 3, heads, d]"), "{e}");
            let e = Tensor::<f64>::zeros(ctx, &[t, 3, d], &whole)?.attention_qkv(true, None).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::attention_qkv"), "{e}");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn attention_runs_on_each_ranks_heads_and_matches_one_device() {
    for (dp, tp) in [(1, 1), (2, 1), (1, 2), (2, 2)] {
        let (b, hq, hk, t, d) = (dp + 1, 4 * tp, 2 * tp, 13, 5);
        let q = |i: &[usize]| ((i[0] * 31 + i[1] * 17 + i[2] * 7 + i[3] * 3) % 19) as f64 / 19.0 - 0.5;
        let k = |i: &[usize]| ((i[0] * 13 + i[1] * 5 + i[2] * 11 + i[3]) % 23) as f64 / 23.0 - 0.5;
        let v = |i: &[usize]| ((i[0] + i[1] * 3 + i[2] * 2 + i[3] * 5) % 7) as f64 - 3.0;
        // the naive causal softmax(QKᵀ/√d)V in f64
        let mut want = vec![0.0; b * hq * t * d];
        for bb in 0..b {
            for h in 0..hq {
                let g = h / (hq / hk);
                for i in 0..t {
                    let s: Vec<f64> = (0..=i)
                        .map(|j| (0..d).map(|c| q(&[bb, h, i, c]) * k(&[bb, g, j, c])).sum::<f64>() / (d as f64).sqrt())
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for c in 0..d {
                        want[((bb * hq + h) * t + i) * d + c] =
                            (0..=i).map(|j| (s[j] - m).exp() / z * v(&[bb, g, j, c])).sum();
                    }
                }
            }
        }
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = "mesh(0:dp, 1:tp)".parse::<PlacementSpec>()?.over(&mesh)?;
            let (qt, kt, vt) = (
                Tensor::<f64>::from_fn(ctx, &[b, hq, t, d], &p, q)?,
                Tensor::<f64>::from_fn(ctx, &[b, hk, t, d], &p, k)?,
                Tensor::<f64>::from_fn(ctx, &[b, hk, t, d], &p, v)?,
            );
            let o = qt.attention(&kt, &vt, true, None)?;
            assert!(o.placement().equal(&p));
            let got = o.full()?.to_vec()?;
            assert!(got.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-12), "dp={dp},tp={tp}");
            // FlashAttention's layout [b, t, h, d], the heads (axis 2) cut over tp in groups
            let pt = "mesh(0:dp, 2:tp)".parse::<PlacementSpec>()?.over(&mesh)?;
            let swap = |f: fn(&[usize]) -> f64| move |i: &[usize]| f(&[i[0], i[2], i[1], i[3]]);
            let (qs, ks, vs) = (
                Tensor::<f64>::from_fn(ctx, &[b, t, hq, d], &pt, swap(q))?,
                Tensor::<f64>::from_fn(ctx, &[b, t, hk, d], &pt, swap(k))?,
                Tensor::<f64>::from_fn(ctx, &[b, t, hk, d], &pt, swap(v))?,
            );
            let o = qs.attention_thd(&ks, &vs, true, None)?;
            assert!(o.placement().equal(&pt) && o.shape() == [b, t, hq, d]);
            let got = o.full()?.to_vec()?;
            for (e, x) in got.iter().enumerate() {
                let (bb, i, h, c) = (e / (t * hq * d), e / (hq * d) % t, e / d % hq, e % d);
                let y = want[((bb * hq + h) * t + i) * d + c];
                assert!((x - y).abs() < 1e-12, "thd dp={dp},tp={tp} [{bb}, {i}, {h}, {c}]: {x} vs {y}");
            }
            if tp > 1 {
                let rows = "mesh(1:tp)".parse::<PlacementSpec>()?.over(&mesh)?;
                let e = qs.place(&rows)?.attention_thd(&ks.place(&rows)?, &vs.place(&rows)?, true, None);
                let e = e.unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::attention_thd") && e.contains("axis 1 is cut"), "{e}");
            }
            // rows cut: an error naming the placement
            let rows = "mesh(2:dp.tp)".parse::<PlacementSpec>()?.over(&mesh)?;
            if dp * tp > 1 {
                let qr = qt.place(&rows)?;
                let e = qr.attention(&kt.place(&rows)?, &vt.place(&rows)?, true, None).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::attention") && e.contains("axis 2 is cut"), "{e}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn pad_along_whole_axes_matches_one_device() {
    for (dp, tp) in MESHES {
        let (m, n) = (2 * dp + 1, tp + 3);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = "mesh(0:dp)".parse::<PlacementSpec>()?.over(&mesh)?;
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &p, f)?;
            let y = x.pad(&[0, 2], &[0, -1], 9.0)?;
            assert_eq!(y.shape(), [m, n + 1]);
            let got = y.full()?.to_vec()?;
            for i in 0..m {
                for j in 0..n + 1 {
                    let want = if j < 2 { 9.0 } else { f(&[i, j - 2]) };
                    assert_eq!(got[i * (n + 1) + j], want);
                }
            }
            if dp > 1 {
                let e = x.pad(&[1, 0], &[0, 0], 0.0).unwrap_err().to_string();
                assert!(e.contains("nx::Tensor::pad") && e.contains("cut over dp"), "{e}");
            }
            let e = x.pad(&[0, -(n as isize)], &[0, -1], 0.0).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::pad"), "{e}");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("dp={dp},tp={tp}: {e}"));
    }
}

#[test]
fn attention_refuses_heads_cut_off_their_groups_on_every_rank() {
    // 4 query heads and 2 key heads over 3 devices: windows [0, 2), [2, 3), [3, 4) against
    // [0, 1), [1, 2), [2, 2): every rank answers the same error
    let out = launch_with(&opts(3), |ctx| {
        let p = Placement::split(1, ctx.devices())?;
        let q = Tensor::<f32>::zeros(ctx, &[1, 4, 3, 2], &p)?;
        let k = Tensor::<f32>::zeros(ctx, &[1, 2, 3, 2], &p)?;
        let e = q.attention(&k, &k, false, None).unwrap_err().to_string();
        assert!(e.contains("not the groups of key heads"), "{e}");
        // the same heads in FlashAttention's layout, axis 2
        let p = Placement::split(2, ctx.devices())?;
        let q = Tensor::<f32>::zeros(ctx, &[1, 3, 4, 2], &p)?;
        let k = Tensor::<f32>::zeros(ctx, &[1, 3, 2, 2], &p)?;
        let e = q.attention_thd(&k, &k, false, None).unwrap_err().to_string();
        assert!(e.contains("nx::Tensor::attention_thd") && e.contains("not the groups of key heads"), "{e}");
        Ok(())
    });
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn index_select_picks_rows_along_a_whole_axis_and_refuses_an_index_of_rank_two() {
    for (dp, tp) in MESHES {
        let (m, n) = (3 * tp + 1, 2 * dp + 3);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            // rows of a table whose columns are cut over dp; the index whole, with repeats
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(1:dp)")?, f)?;
            let picks: Vec<i64> = vec![m as i64 - 1, 0, 2, 2, 1];
            let idx = Tensor::<i64>::from_fn(ctx, &[picks.len()], &Placement::on(ctx.devices()), |i| picks[i[0]])?;
            let got = x.index_select(0, &idx)?.full()?.to_vec()?;
            let want: Vec<f64> = picks.iter().flat_map(|&r| (0..n).map(move |j| f(&[r as usize, j]))).collect();
            assert_eq!(got, want, "on {dp}×{tp}");
            let two = Tensor::<i64>::zeros(ctx, &[2, 2], &Placement::on(ctx.devices()))?;
            let e = x.index_select(0, &two).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::index_select") && e.contains("not 1-D"), "{e}");
            Ok(())
        })
        .unwrap();
    }
}
