//! The `nn` layers in every cut (`Linear` replicated, column- and row-parallel; `Embedding`
//! replicated and vocabulary-parallel; `LayerNorm`; dropout at two placements) through a small
//! network: each parameter's
//! gradient on meshes of 1–8 devices with uneven extents against the one-device gradient, and
//! the one-device gradient against central finite differences (f64). Then what the collectives
//! carry: a vocabulary-parallel cross-entropy never gathers its logits (its loss against a naive
//! f64 one written here), and ZeRO-1's update closes gradients by reduce-scatters and
//! re-assembles parameters by all-gathers where plain data parallelism all-reduces.

use nx::autodiff::{Dropout, Tape};
use nx::nn::{Embedding, LayerNorm, Layout, Linear, Parallel, Params};
use nx::optim::{AdamW, Zero};
use nx::testing::Op;
use nx::{launch_with, Ctx, LaunchOptions, Placement, Result, Tensor};

/// The network's layers: vocabulary 7, features 6 → 5 → 8 → 4.
fn layers() -> (Embedding, Embedding, LayerNorm, Linear, Linear, Linear) {
    (
        Embedding { name: "tok".into(), n: 7, d: 6, vocab_parallel: false },
        Embedding { name: "vocab".into(), n: 7, d: 6, vocab_parallel: true },
        LayerNorm { name: "ln".into(), d: 6, eps: 1e-5 },
        Linear { name: "rep".into(), d_in: 6, d_out: 5, parallel: Parallel::Replicated, bias: true },
        Linear { name: "col".into(), d_in: 5, d_out: 8, parallel: Parallel::Column, bias: true },
        Linear { name: "row".into(), d_in: 8, d_out: 4, parallel: Parallel::Row, bias: true },
    )
}

/// The parameters on a `dp × tp` mesh (the biases and the norm's shift given values, not zeros).
fn params<'d>(ctx: &Ctx<'d>, l: &Layout<'d>) -> Result<Params<'d, f64>> {
    let (tok, vocab, ln, rep, col, row) = layers();
    let mut p = Params::new();
    tok.init(ctx, l, &mut p, 1, 0.5)?;
    vocab.init(ctx, l, &mut p, 2, 0.5)?;
    ln.init(ctx, l, &mut p)?;
    rep.init(ctx, l, &mut p, 3, 0.4)?;
    col.init(ctx, l, &mut p, 4, 0.4)?;
    row.init(ctx, l, &mut p, 5, 0.4)?;
    let names: Vec<String> = p.iter().map(|(n, _)| n.to_string()).collect();
    for (k, name) in names.iter().enumerate() {
        if name.ends_with(".b") || name == "ln.g" {
            let t = p.get(name).expect("listed");
            let base = if name == "ln.g" { 1.0 } else { 0.0 };
            let v = Tensor::<f64>::from_fn(ctx, t.shape(), &t.placement().clone(), |i| {
                base + 0.1 * ((i[0] * 3 + k) % 5) as f64 - 0.2
            })?;
            p.set(name, v)?;
        }
    }
    Ok(p)
}

/// The loss on a `dp × tp` mesh with element `e` of parameter `perturb.0` moved by `perturb.2`,
/// and every parameter's gradient (whole, by name).
fn run(dp: usize, tp: usize, perturb: Option<(&str, usize, f64)>) -> (f64, Vec<(String, Vec<f64>)>) {
    let opts = LaunchOptions { devices: Some(dp * tp), ..Default::default() };
    let out = launch_with(&opts, |ctx| {
        let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
        let l = Layout::new(&mesh)?;
        let mut p = params(ctx, &l)?;
        if let Some((name, e, h)) = perturb {
            let t = p.get(name).expect("a parameter").clone();
            let mut v = t.full()?.to_vec()?;
            v[e] += h;
            let flat = |i: &[usize]| i.iter().zip(t.shape()).fold(0, |a, (&x, &n)| a * n + x);
            p.set(name, Tensor::<f64>::from_fn(ctx, t.shape(), t.placement(), |i| v[flat(i)])?)?;
        }
        let (tok, vocab, ln, rep, col, row) = layers();
        let tape = Tape::new();
        let b = p.bind(&tape);
        // ids [5, 3] cut over dp (5 rows over dp: uneven)
        let rows = l.cut(&[(0, &["dp"])])?;
        let ids = Tensor::<i64>::from_fn(ctx, &[5, 3], &rows, |i| ((i[0] * 5 + i[1] * 3) % 7) as i64)?;
        let h = tok.forward(&b, &ids)?.add(&vocab.forward(&b, &ids)?)?;
        // dropout (a counter-based mask of the global index: the same on every mesh) at two
        // placements: rows over dp, and rows over dp with the features over tp
        let h = ln.forward(&b, &h)?.dropout(Dropout { p: 0.3, seed: 11 })?;
        let h = rep.forward(&b, &h)?.tanh()?;
        let h = col.forward(&b, &h)?.gelu()?.dropout(Dropout { p: 0.25, seed: 12 })?; // features over tp
        let y = row.forward(&b, &h)?; // closed over tp
                                      // Σ y ∘ R for a fixed R, closed to a scalar
        let r = Tensor::<f64>::from_fn(ctx, y.shape(), y.placement(), |i| {
            ((i[0] * 7 + i[1] * 3 + i[2]) % 11) as f64 * 0.1 - 0.5
        })?;
        let loss = y.mul(&tape.constant(r))?.sum_all()?;
        let loss = loss.place(&l.copies()?)?;
        let value = loss.value().full()?.to_vec()?[0];
        let grads = tape.backward(&loss)?;
        let mut gs = Vec::new();
        for (name, _) in p.iter() {
            let g = grads.of(b.get(name)?).expect("every parameter has a gradient");
            gs.push((name.to_string(), g.full()?.to_vec()?));
        }
        Ok((value, gs))
    })
    .unwrap();
    out.into_iter().next().unwrap()
}

#[test]
fn layers_in_every_cut_have_the_one_device_gradients() {
    let (loss, reference) = run(1, 1, None);
    // central finite differences of the one-device loss, every element of every parameter
    let h = 1e-5;
    for (name, g) in &reference {
        for (e, &ge) in g.iter().enumerate() {
            let fd = (run(1, 1, Some((name, e, h))).0 - run(1, 1, Some((name, e, -h))).0) / (2.0 * h);
            assert!((fd - ge).abs() <= 1e-5 * (1.0 + fd.abs()), "{name}[{e}]: backward {ge}, finite differences {fd}");
        }
    }
    for (dp, tp) in [(2, 1), (1, 2), (2, 2), (1, 3), (3, 2), (2, 4)] {
        let (l, gs) = run(dp, tp, None);
        assert!((l - loss).abs() <= 1e-10 * (1.0 + loss.abs()), "dp={dp}, tp={tp}: loss {l} against {loss}");
        let names = |v: &[(String, Vec<f64>)]| v.iter().map(|(n, g)| (n.clone(), g.len())).collect::<Vec<_>>();
        assert_eq!(names(&gs), names(&reference), "dp={dp}, tp={tp}: the parameters and their sizes");
        for ((name, a), (_, b)) in gs.iter().zip(&reference) {
            for (e, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() <= 1e-10 * (1.0 + y.abs()), "dp={dp}, tp={tp}: {name}[{e}]: {x} against {y}");
            }
        }
    }
}

/// Logits `[rows, classes]` with the classes cut over `tp`: the loss and its backward move a few
/// values a row, never the logits (no all-to-all; bytes received below a quarter of the
/// logits' size), and the loss is the naive f64 one.
#[test]
fn vocabulary_parallel_cross_entropy_never_gathers_the_logits() {
    let (rows, classes) = (6usize, 40usize);
    let z = |r: usize, c: usize| ((r * 13 + c * 7) % 17) as f64 * 0.3 - 2.0;
    let label = |r: usize| if r == 4 { -1 } else { ((r * 11) % classes) as i64 };
    for (dp, tp) in [(1, 2), (1, 4), (2, 2)] {
        let opts = LaunchOptions { devices: Some(dp * tp), ..Default::default() };
        let out = launch_with(&opts, |ctx| {
            let m = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let tape = Tape::new();
            let logits = tape.leaf(Tensor::<f64>::from_fn(
                ctx,
                &[rows, classes],
                &Placement::mesh(&m, &[(0, &["dp"]), (1, &["tp"])])?,
                |i| z(i[0], i[1]),
            )?);
            let labels = Tensor::<i64>::from_fn(ctx, &[rows], &Placement::mesh(&m, &[(0, &["dp"])])?, |i| label(i[0]))?;
            let ((loss, _), log) = ctx.record(|| {
                let loss = logits.cross_entropy(&labels)?;
                let grads = tape.backward(&loss)?;
                Ok((loss, grads))
            })?;
            let received: u64 = log.collectives().map(|e| e.bytes_received).sum();
            Ok((loss.value().full()?.to_vec()?[0], log.count_any(Op::AllToAll), received))
        })
        .unwrap();
        let (mut sum, mut counted) = (0.0, 0);
        for r in 0..rows {
            if label(r) < 0 {
                continue;
            }
            let lse = (0..classes).map(|c| z(r, c).exp()).sum::<f64>().ln();
            sum += lse - z(r, label(r) as usize);
            counted += 1;
        }
        let want = sum / counted as f64;
        let logits_bytes = (rows * classes * 8) as u64;
        for (loss, moved, received) in out {
            assert!((loss - want).abs() <= 1e-12 * want.abs(), "dp={dp}, tp={tp}: loss {loss} against {want}");
            assert_eq!(moved, 0, "dp={dp}, tp={tp}: an all-to-all");
            assert!(received * 4 < logits_bytes, "dp={dp}, tp={tp}: {received} bytes received of {logits_bytes}");
        }
    }
}

/// One AdamW step of the network's parameters: ZeRO-1 over `dp` closes the gradients by
/// reduce-scatters and gathers the updated parameters by all-gathers, never all-reducing more than
/// the norm's sums of squares; plain data parallelism all-reduces the gradients and gathers nothing.
#[test]
fn zero_one_reduce_scatters_gradients_and_all_gathers_parameters() {
    for zero in [false, true] {
        let opts = LaunchOptions { devices: Some(4), ..Default::default() };
        let logs = launch_with(&opts, |ctx| {
            let mesh = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
            let l = Layout::new(&mesh)?;
            let mut p = params(ctx, &l)?;
            let (tok, vocab, ln, rep, col, row) = layers();
            let tape = Tape::new();
            let b = p.bind(&tape);
            let ids =
                Tensor::<i64>::from_fn(ctx, &[6, 3], &l.cut(&[(0, &["dp"])])?, |i| ((i[0] * 5 + i[1]) % 7) as i64)?;
            let h = ln.forward(&b, &tok.forward(&b, &ids)?.add(&vocab.forward(&b, &ids)?)?)?;
            let y = row.forward(&b, &col.forward(&b, &rep.forward(&b, &h)?.tanh()?)?)?;
            let loss = y.mul(&y)?.sum_all()?.place(&l.copies()?)?;
            let grads = tape.backward(&loss)?;
            let mut opt = AdamW::new();
            opt.zero = zero.then(|| Zero { axis: "dp".into() });
            let (_, log) = ctx.record(|| opt.step(&mut p, &grads, 1e-2))?;
            let big = |op| log.collectives().filter(|e| e.op == op && e.bytes_received > 64).count();
            Ok((big(Op::AllReduce), log.count_any(Op::ReduceScatter), log.count_any(Op::AllGather)))
        })
        .unwrap();
        for (all_reduces, scatters, gathers) in logs {
            if zero {
                assert!(scatters > 0 && gathers > 0, "ZeRO-1: {scatters} reduce-scatters, {gathers} all-gathers");
                assert_eq!(all_reduces, 0, "ZeRO-1 all-reduced gradients");
            } else {
                assert!(all_reduces > 0 && gathers == 0, "plain: {all_reduces} all-reduces, {gathers} all-gathers");
            }
        }
    }
}
