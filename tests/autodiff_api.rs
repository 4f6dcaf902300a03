//! The tape's services: `no_grad`, `detach`, accumulation over backward calls, freeing, errors;
//! dropout's mask (the same on every mesh); the optimizers against hand-computed updates.

use nx::autodiff::{Dropout, Tape};
use nx::nn::Params;
use nx::optim::{warmup_cosine, AdamW, Moments, Sgd, Zero};
use nx::{launch_with, LaunchOptions, Placement, Tensor};

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

#[test]
fn no_grad_detach_accumulation_and_freeing() {
    launch_with(&opts(2), |ctx| {
        let rows = Placement::split(0, ctx.devices())?;
        let tape = Tape::new();
        let x = tape.param("x", Tensor::<f64>::from_fn(ctx, &[3], &rows, |i| i[0] as f64 + 1.0)?);
        // y = x² summed: dy/dx = 2x; a detached factor is a constant
        let y = x.square()?.sum_all()?;
        let z = x.mul(&x.detach())?.sum_all()?; // d/dx = x (the detached copy has no gradient)
        let inside = tape.no_grad(|| x.square())?;
        assert!(!inside.requires_grad(), "no_grad records nothing");
        let before = tape.len();
        let _ = tape.no_grad(|| x.tanh()?.sum_all())?;
        assert_eq!(tape.len(), before, "no_grad adds no node");
        let mut g = tape.backward(&y)?;
        assert_eq!(g.named("x").unwrap().full()?.to_vec()?, [2.0, 4.0, 6.0]);
        let gz = tape.backward(&z)?;
        assert_eq!(gz.named("x").unwrap().full()?.to_vec()?, [1.0, 2.0, 3.0]);
        g.accumulate(gz)?;
        assert_eq!(g.named("x").unwrap().full()?.to_vec()?, [3.0, 6.0, 9.0]);
        // the ops of y were freed by its backward
        let e = tape.backward(&y).unwrap_err().to_string();
        assert!(e.contains("freed by an earlier backward"), "{e}");
        // a constant loss
        let c = tape.constant(Tensor::<f64>::zeros(ctx, &[], &Placement::on(ctx.devices()))?);
        let e = tape.backward(&c).unwrap_err().to_string();
        assert!(e.contains("depends on no leaf"), "{e}");
        // a loss of another tape
        let other = Tape::new();
        let w = other.leaf(Tensor::<f64>::zeros(ctx, &[3], &rows)?);
        let e = tape.backward(&w.sum_all()?).unwrap_err().to_string();
        assert!(e.contains("another tape"), "{e}");
        let e = x.add(&w).unwrap_err().to_string();
        assert!(e.contains("different tapes"), "{e}");
        Ok(())
    })
    .unwrap();
}

#[test]
fn dropout_masks_are_the_same_on_every_mesh_and_placement() {
    let run = |n: usize| {
        launch_with(&opts(n), |ctx| {
            let m = ctx.mesh(&[("a", n)])?;
            let tape = Tape::new();
            let x = tape.leaf(Tensor::<f64>::from_fn(ctx, &[5, 9], &Placement::mesh(&m, &[(1, &["a"])])?, |_| 1.0)?);
            let y = x.dropout(Dropout { p: 0.5, seed: 7 })?;
            let g = tape.backward(&y.sum_all()?)?;
            Ok((y.value().full()?.to_vec()?, g.of(&x).unwrap().full()?.to_vec()?))
        })
        .unwrap()
        .remove(0)
    };
    let (one, g1) = run(1);
    // kept elements scaled by 2, dropped ones 0; the gradient is the mask
    assert!(one.iter().all(|&v| v == 0.0 || v == 2.0));
    let kept = one.iter().filter(|&&v| v == 2.0).count();
    assert!((10..=35).contains(&kept), "{kept} of 45 kept");
    assert_eq!(one, g1);
    for n in [2, 3, 4] {
        assert_eq!(run(n), (one.clone(), g1.clone()), "{n} devices");
    }
}

/// The gradients of `Σ_rows 0.25 · Σ w²` (= Σ w²) with the rows cut over `dp`.
fn grads_of<'d>(ctx: &nx::Ctx<'d>, m: &nx::Mesh<'d>, p: &Params<'d, f64>) -> nx::Result<nx::autodiff::Grads<'d, f64>> {
    let tape = Tape::new();
    let b = p.bind(&tape);
    let w = b.get("w")?;
    let quarter = tape.constant(Tensor::<f64>::from_fn(ctx, &[4, 2], &Placement::mesh(m, &[(0, &["dp"])])?, |_| 0.25)?);
    let loss = quarter.matmul(&w.square()?)?.sum_all()?;
    tape.backward(&loss)
}

#[test]
fn sgd_and_adamw_steps_by_hand() {
    launch_with(&opts(4), |ctx| {
        let m = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        let cut = Placement::mesh(&m, &[(1, &["tp"])])?;
        let w0: Vec<f64> = (0..6).map(|i| i as f64 - 2.5).collect();
        let mk = || -> nx::Result<Params<'_, f64>> {
            let mut p = Params::new();
            p.insert("w", Tensor::<f64>::from_fn(ctx, &[2, 3], &cut, |i| w0[i[0] * 3 + i[1]])?)?;
            Ok(p)
        };
        // loss = Σ w² · c over rows cut over dp (a gradient that is a sum over dp): dL/dw = 2cw
        // SGD with momentum 0.9, two steps: b₁ = g₁, b₂ = 0.9 b₁ + g₂
        let mut p = mk()?;
        let mut sgd = Sgd::new(0.9);
        let g = grads_of(ctx, &m, &p)?;
        sgd.step(&mut p, &g, 0.1)?;
        let g = grads_of(ctx, &m, &p)?;
        sgd.step(&mut p, &g, 0.1)?;
        let got = p.get("w").unwrap().full()?.to_vec()?;
        for (i, &w) in w0.iter().enumerate() {
            let g1 = 2.0 * w;
            let w1 = w - 0.1 * g1;
            let b2 = 0.9 * g1 + 2.0 * w1;
            let w2 = w1 - 0.1 * b2;
            assert!((got[i] - w2).abs() < 1e-12, "sgd {i}: {} vs {w2}", got[i]);
        }
        // AdamW, one step, no clipping: m̂ = g, v̂ = g², w − lr·(g/(|g| + eps) + wd·w)
        for zero in [None, Some(Zero { axis: "dp".into() })] {
            let mut p = mk()?;
            let mut adam = AdamW::new();
            adam.clip = None;
            adam.zero = zero.clone();
            let g = grads_of(ctx, &m, &p)?;
            let norm = adam.step(&mut p, &g, 0.01)?;
            let want_norm = w0.iter().map(|w| (2.0 * w) * (2.0 * w)).sum::<f64>().sqrt();
            assert!((norm - want_norm).abs() < 1e-12 * want_norm, "the gradient's global norm {norm} vs {want_norm}");
            let got = p.get("w").unwrap().full()?.to_vec()?;
            for (i, &w) in w0.iter().enumerate() {
                let g = 2.0 * w;
                let want = w - 0.01 * (g / (g.abs() + 1e-8) + 0.1 * w);
                assert!((got[i] - want).abs() < 1e-12, "adamw {zero:?} {i}: {} vs {want}", got[i]);
            }
            assert!(p.get("w").unwrap().placement().equal(&cut), "the parameter keeps its placement");
            let st = adam.state("w").unwrap();
            assert_eq!(st.steps, 1);
            let shard_cut = zero.is_some();
            assert_eq!(
                !st.m.placement().equal(&cut),
                shard_cut,
                "ZeRO keeps the state cut over dp: {}",
                st.m.placement()
            );
        }
        // clipping to 1: the update uses g/‖g‖
        let mut p = mk()?;
        let mut sgd = Sgd::new(0.0);
        sgd.clip = Some(1.0);
        let g = grads_of(ctx, &m, &p)?;
        let norm = sgd.step(&mut p, &g, 1.0)?;
        let got = p.get("w").unwrap().full()?.to_vec()?;
        for (i, &w) in w0.iter().enumerate() {
            let want = w - 2.0 * w / (norm + 1e-6);
            assert!((got[i] - want).abs() < 1e-12, "clipped {i}: {} vs {want}", got[i]);
        }
        Ok(())
    })
    .unwrap();
    // the schedule: warmup to the peak, cosine to the floor
    assert_eq!(warmup_cosine(0, 10, 100, 1.0, 0.1), 0.1);
    assert_eq!(warmup_cosine(9, 10, 100, 1.0, 0.1), 1.0);
    assert!((warmup_cosine(55, 10, 100, 1.0, 0.1) - 0.55).abs() < 1e-12);
    assert_eq!(warmup_cosine(100, 10, 100, 1.0, 0.1), 0.1);
}

#[test]
fn refusals_reach_every_rank() {
    let out = launch_with(&opts(4), |ctx| {
        let m = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        let tape = Tape::new();
        // a nonlinear op of a sum is refused, as the forward op is
        let s = tape.leaf(Tensor::<f64>::zeros(ctx, &[3], &Placement::partial(&m, &["tp"], &[])?)?);
        let e1 = s.tanh().unwrap_err().to_string();
        // an id out of range on one rank's rows only: every rank answers the error
        let rows = Placement::mesh(&m, &[(0, &["dp"])])?;
        let ids = Tensor::<i64>::from_fn(ctx, &[4, 2], &rows, |i| if i[0] == 3 && i[1] == 1 { 9 } else { 0 })?;
        let table = tape.leaf(Tensor::<f64>::zeros(ctx, &[5, 3], &Placement::mesh(&m, &[])?)?);
        let e2 = table.embedding(&ids).unwrap_err().to_string();
        let logits =
            tape.leaf(Tensor::<f64>::zeros(ctx, &[4, 2, 5], &Placement::mesh(&m, &[(0, &["dp"]), (2, &["tp"])])?)?);
        let e3 = logits.cross_entropy(&ids).unwrap_err().to_string();
        Ok((e1, e2, e3))
    })
    .unwrap();
    for (e1, e2, e3) in &out {
        assert!(e1.contains("nonlinear map of a partial value"), "{e1}");
        assert!(e2.contains("nx::autodiff::Var::embedding") && e2.contains("id 9 at position 3 of device"), "{e2}");
        assert!(e3.contains("nx::autodiff::Var::cross_entropy") && e3.contains("label 9"), "{e3}");
    }
}

/// Layer norm of an `f32` value of many rows (several of the pool's tasks a rank), forward and
/// backward, against its formulas written naively in `f64` here; on one device and with the rows
/// cut over three (each row's output and gradient the same bits, the parameters' gradients within
/// rounding of each other).
#[test]
fn layer_norm_of_many_rows_against_naive_f64() {
    const R: usize = 2001;
    const D: usize = 9;
    let xv = |i: usize| ((i * 7919 + 13) % 1009) as f64 / 1009.0 * 4.0 - 2.0 + (i / D) as f64 * 1e-3;
    let gv = |j: usize| 0.5 + j as f64 * 0.125;
    let bv = |j: usize| j as f64 * 0.25 - 1.0;
    let rv = |i: usize| ((i * 31 + 7) % 97) as f64 / 97.0 - 0.5;
    let run = |n: usize| {
        launch_with(&opts(n), |ctx| {
            let rows = Placement::split(0, ctx.devices())?;
            let copies = Placement::on(ctx.devices());
            let tape = Tape::new();
            let x = tape.param("x", Tensor::<f32>::from_fn(ctx, &[R, D], &rows, |i| xv(i[0] * D + i[1]) as f32)?);
            let g = tape.param("g", Tensor::<f32>::from_fn(ctx, &[D], &copies, |i| gv(i[0]) as f32)?);
            let b = tape.param("b", Tensor::<f32>::from_fn(ctx, &[D], &copies, |i| bv(i[0]) as f32)?);
            let r = tape.constant(Tensor::<f32>::from_fn(ctx, &[R, D], &rows, |i| rv(i[0] * D + i[1]) as f32)?);
            let y = x.layer_norm(&g, &b, 1e-5)?;
            let loss = y.mul(&r)?.sum_all()?;
            let grads = tape.backward(&loss)?;
            let whole = |name: &str| -> nx::Result<Vec<f32>> { Ok(grads.named(name).unwrap().full()?.to_vec()?) };
            Ok((y.value().full()?.to_vec()?, whole("x")?, whole("g")?, whole("b")?))
        })
        .unwrap()
        .remove(0)
    };
    // the naive formulas, from the f32 inputs
    let x32: Vec<f64> = (0..R * D).map(|i| f64::from(xv(i) as f32)).collect();
    let (g32, b32): (Vec<f64>, Vec<f64>) = (0..D).map(|j| (f64::from(gv(j) as f32), f64::from(bv(j) as f32))).unzip();
    let r32: Vec<f64> = (0..R * D).map(|i| f64::from(rv(i) as f32)).collect();
    let (mut y, mut dx, mut dg, mut db) = (vec![0.0; R * D], vec![0.0; R * D], vec![0.0; D], vec![0.0; D]);
    for i in 0..R {
        let row = &x32[i * D..(i + 1) * D];
        let mu = row.iter().sum::<f64>() / D as f64;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / D as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let h: Vec<f64> = row.iter().map(|v| (v - mu) * rstd).collect();
        let dh: Vec<f64> = (0..D).map(|j| r32[i * D + j] * g32[j]).collect();
        let m1 = dh.iter().sum::<f64>() / D as f64;
        let m2 = dh.iter().zip(&h).map(|(a, b)| a * b).sum::<f64>() / D as f64;
        for j in 0..D {
            y[i * D + j] = h[j] * g32[j] + b32[j];
            dx[i * D + j] = rstd * (dh[j] - m1 - h[j] * m2);
            dg[j] += r32[i * D + j] * h[j];
            db[j] += r32[i * D + j];
        }
    }
    let close = |got: &[f32], want: &[f64], tol: f64, what: &str| {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((f64::from(g) - w).abs() <= tol * (1.0 + w.abs()), "{what}[{k}]: {g} against {w}");
        }
    };
    let one = run(1);
    close(&one.0, &y, 1e-6, "y");
    close(&one.1, &dx, 1e-6, "dx");
    close(&one.2, &dg, 1e-5, "dgamma");
    close(&one.3, &db, 1e-5, "dbeta");
    let three = run(3);
    assert_eq!(three.0, one.0, "each row's output the same bits on three devices");
    assert_eq!(three.1, one.1, "each row's gradient the same bits on three devices");
    close(&three.2, &dg, 1e-5, "dgamma on three devices");
    close(&three.3, &db, 1e-5, "dbeta on three devices");
}

/// The gradients of `Σ_p s_p · Σ w_p²` over the parameters `specs` names (name, shape, the mesh
/// axis cutting its last axis or none, s).
fn square_grads<'d>(
    p: &Params<'d, f64>,
    specs: &[(&str, Vec<usize>, &str, f64)],
    whole: &Placement<'d>,
) -> nx::Result<nx::autodiff::Grads<'d, f64>> {
    let tape = Tape::new();
    let b = p.bind(&tape);
    let mut loss = None;
    for (name, _, _, s) in specs {
        let term = b.get(name)?.square()?.sum_all()?.scale(*s)?.place(whole)?;
        loss = Some(match loss {
            None => term,
            Some(l) => term.add(&l)?,
        });
    }
    tape.backward(&loss.expect("terms"))
}

#[test]
fn adamw_steps_small_parameters_as_one_flat_array_and_large_ones_alone() {
    // parameters small (stepped as groups by placement and rank: cut over tp unevenly, whole, of
    // rank 2 so decayed) and one past the group bound (alone), three clipped steps, against AdamW
    // by hand in f64; loss Σ_p s_p · Σ w_p², so g = 2·s_p·w
    let specs: [(&str, Vec<usize>, &str, f64); 9] = [
        ("a", vec![5], "tp", 1.0),
        ("b", vec![3], "", 2.0),
        ("c", vec![2, 3], "", 0.5),
        ("d", vec![7], "tp", 1.5),
        ("e", vec![1], "", 3.0),
        ("f", vec![2], "tp", 0.75),
        ("g", vec![4], "dp", 1.25),
        ("h", vec![3], "dp", 0.6),
        ("big", vec![3, 6000], "tp", 0.25),
    ];
    let init = |p: usize, i: usize| ((p * 31 + i * 7) % 13) as f64 / 13.0 - 0.4;
    let cases = [(1, 1, false), (2, 2, false), (1, 3, false), (2, 2, true), (2, 1, true)];
    for (dp, tp, zero) in cases {
        let got = launch_with(&opts(dp * tp), |ctx| {
            let m = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let mut p = Params::new();
            for (k, (name, shape, axis, _)) in specs.iter().enumerate() {
                let at = if axis.is_empty() {
                    Placement::mesh(&m, &[])?
                } else {
                    Placement::mesh(&m, &[(shape.len() - 1, &[*axis])])?
                };
                let flat = |i: &[usize]| i.iter().zip(shape).fold(0, |a, (x, e)| a * e + x);
                p.insert(name, Tensor::<f64>::from_fn(ctx, shape, &at, |i| init(k, flat(i)))?)?;
            }
            // under ZeRO the parameters not cut over dp update on their shards, alone; those cut
            // over dp already update where they lie, in groups
            let zero = zero.then(|| Zero { axis: "dp".into() });
            let mut adam = AdamW::new();
            adam.clip = Some(0.5);
            adam.zero = zero.clone();
            let whole = Placement::mesh(&m, &[])?;
            let mut norms = Vec::new();
            for _ in 0..3 {
                let g = square_grads(&p, &specs, &whole)?;
                norms.push(adam.step(&mut p, &g, 0.01)?);
            }
            // the small parameters of one placement and rank were stepped as one array: they are
            // views of one buffer; the large one has its own
            let local = |n: &str| p.get(n).unwrap().to_local().unwrap();
            if tp > 1 && zero.is_none() {
                assert!(local("a").buffer().same_memory(local("d").buffer()), "a and d in one group");
                assert!(local("a").buffer().same_memory(local("f").buffer()), "a and f in one group");
            }
            if zero.is_none() {
                assert!(local("b").buffer().same_memory(local("e").buffer()), "b and e in one group");
            } else {
                assert!(!local("b").buffer().same_memory(local("e").buffer()), "b and e on their shards");
            }
            assert!(local("g").buffer().same_memory(local("h").buffer()), "g and h in one group");
            assert!(!local("big").buffer().same_memory(local("a").buffer()));
            let mut out = Vec::new();
            for (name, ..) in &specs {
                let w = p.get(name).unwrap();
                let st = adam.state(name).unwrap();
                assert_eq!(st.steps, 3);
                if zero.is_none() {
                    assert!(st.m.placement().equal(w.placement()) && st.v.placement().equal(w.placement()));
                }
                out.push((w.full()?.to_vec()?, st.m.full()?.to_vec()?, st.v.full()?.to_vec()?));
            }
            // a run resumed from copies of the state and parameters (fresh arrays, gathered rather
            // than read in place) steps as the run itself does, bit for bit
            let mut again = AdamW::new();
            again.clip = Some(0.5);
            again.zero = zero.clone();
            let mut p2 = Params::new();
            for (name, ..) in &specs {
                let st = adam.state(name).unwrap();
                again.set_state(name, Moments { m: st.m.scale(1.0)?, v: st.v.scale(1.0)?, steps: st.steps });
                p2.insert(name, p.get(name).unwrap().scale(1.0)?)?;
            }
            let mut p3 = Params::new();
            for (name, ..) in &specs {
                p3.insert(name, p.get(name).unwrap().clone())?;
            }
            let (g2, g3) = (square_grads(&p2, &specs, &whole)?, square_grads(&p3, &specs, &whole)?);
            again.step(&mut p2, &g2, 0.01)?;
            let mut continued = adam;
            continued.step(&mut p3, &g3, 0.01)?;
            for (name, ..) in &specs {
                let (a, b) = (p2.get(name).unwrap().full()?.to_vec()?, p3.get(name).unwrap().full()?.to_vec()?);
                assert_eq!(a, b, "{name}: resumed vs continued");
            }
            Ok((norms, out))
        })
        .unwrap()
        .remove(0);
        // by hand
        let mut w: Vec<Vec<f64>> =
            specs.iter().enumerate().map(|(k, s)| (0..s.1.iter().product()).map(|i| init(k, i)).collect()).collect();
        let mut mo = vec![vec![0.0; 0]; specs.len()];
        let mut ve = mo.clone();
        for (k, x) in w.iter().enumerate() {
            mo[k] = vec![0.0; x.len()];
            ve[k] = vec![0.0; x.len()];
        }
        for step in 1..=3usize {
            let g: Vec<Vec<f64>> =
                w.iter().zip(&specs).map(|(x, s)| x.iter().map(|v| 2.0 * s.3 * v).collect()).collect();
            let norm = g.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
            assert!(
                (got.0[step - 1] - norm).abs() <= 1e-12 * norm,
                "{dp}×{tp} zero {zero}: step {step}: norm {} vs {norm}",
                got.0[step - 1]
            );
            let f = if norm > 0.5 { 0.5 / (norm + 1e-6) } else { 1.0 };
            let (c1, c2) = (1.0 - 0.9f64.powi(step as i32), 1.0 - 0.95f64.powi(step as i32));
            for k in 0..specs.len() {
                let wd = if specs[k].1.len() >= 2 { 0.1 } else { 0.0 };
                for i in 0..w[k].len() {
                    let gi = f * g[k][i];
                    mo[k][i] = 0.9 * mo[k][i] + 0.1 * gi;
                    ve[k][i] = 0.95 * ve[k][i] + 0.05 * gi * gi;
                    let u = (mo[k][i] / c1) / ((ve[k][i] / c2).sqrt() + 1e-8) + wd * w[k][i];
                    w[k][i] -= 0.01 * u;
                }
            }
        }
        for (k, (gw, gm, gv)) in got.1.iter().enumerate() {
            for (what, a, b) in [("w", gw, &w[k]), ("m", gm, &mo[k]), ("v", gv, &ve[k])] {
                assert_eq!(a.len(), b.len());
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
                        "{dp}×{tp} zero {zero}: {} {what}[{i}]: {x} vs {y}",
                        specs[k].0
                    );
                }
            }
        }
    }
}
