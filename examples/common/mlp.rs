//! The two-layer MLP of `train_mlp`, distributed (nx tensors) and on one device (plain f64), shared
//! by the example and its test.

use nx::{Ctx, Placement, Result, Tensor};

/// What to train.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data-parallel extent.
    pub dp: usize,
    /// Tensor-parallel extent.
    pub tp: usize,
    /// SGD steps.
    pub steps: usize,
    /// Learning rate.
    pub lr: f64,
    /// Training rows.
    pub train: usize,
    /// Held-out rows.
    pub test: usize,
    /// Inputs.
    pub d_in: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
    /// Print progress (rank 0).
    pub verbose: bool,
    /// Save a checkpoint (W1, b1, W2, b2 and the step) under this root every `save_every` steps
    /// and at the end.
    pub save: Option<std::path::PathBuf>,
    /// Steps between checkpoints.
    pub save_every: usize,
    /// Resume from the checkpoint this root's `latest` names (any mesh).
    pub resume: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dp: 2,
            tp: 2,
            steps: 150,
            lr: 0.5,
            train: 513,
            test: 257,
            d_in: 16,
            hidden: 33,
            classes: 4,
            verbose: true,
            save: None,
            save_every: 50,
            resume: None,
        }
    }
}

/// What a run ends with.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The training loss at the final parameters.
    pub loss: f64,
    /// The held-out accuracy.
    pub accuracy: f64,
    /// The final parameters (W1, b1, W2, b2), row-major.
    pub params: Vec<Vec<f64>>,
}

/// Row `i`'s class: blobs cycle through the classes.
fn class(i: usize, c: usize) -> usize {
    (i * 7 + i / 3) % c
}

/// The synthetic task: Gaussian blobs around class centres; `offset` picks held-out rows.
fn x(i: usize, j: usize, cfg: &Config, offset: usize) -> f64 {
    let k = class(i + offset, cfg.classes);
    1.0 * nx::normal(101, (k * cfg.d_in + j) as u64) + 1.3 * nx::normal(202, ((i + offset) * cfg.d_in + j) as u64)
}

const SEED_W1: u64 = 11;
const SEED_W2: u64 = 22;

/// Trains on the mesh of `ctx` and answers the outcome (on every rank).
pub fn train(ctx: &Ctx<'_>, cfg: &Config) -> Result<Outcome> {
    let mesh = ctx.mesh(&[("dp", cfg.dp), ("tp", cfg.tp)])?;
    let rows = Placement::mesh(&mesh, &[(0, &["dp"])])?; // data: batch over dp
    let cols = Placement::mesh(&mesh, &[(1, &["tp"])])?; // W1: columns over tp
    let vec_tp = Placement::mesh(&mesh, &[(0, &["tp"])])?; // b1 over tp; W2: rows over tp
    let copies = Placement::mesh(&mesh, &[])?; // b2: on every device
    let (b, d, h, c) = (cfg.train, cfg.d_in, cfg.hidden, cfg.classes);
    let xs = Tensor::<f64>::from_fn(ctx, &[b, d], &rows, |i| x(i[0], i[1], cfg, 0))?;
    let ys = Tensor::<f64>::from_fn(ctx, &[b, c], &rows, |i| f64::from(class(i[0], c) == i[1]))?;
    let mut w1 = Tensor::<f64>::randn(ctx, &[d, h], &cols, SEED_W1)?.scale(1.0 / (d as f64).sqrt())?;
    let mut b1 = Tensor::<f64>::zeros(ctx, &[h], &vec_tp)?;
    let mut w2 = Tensor::<f64>::randn(ctx, &[h, c], &vec_tp, SEED_W2)?.scale(1.0 / (h as f64).sqrt())?;
    let mut b2 = Tensor::<f64>::zeros(ctx, &[c], &copies)?;
    let mut loss = f64::NAN;
    let mut first = 0;
    if let Some(dir) = &cfg.resume {
        let ck = nx::ckpt::Checkpoint::open(dir)?;
        first = ck.index().meta["step"].as_u64().ok_or_else(|| nx::Error::Invalid {
            func: "train_mlp --resume",
            why: format!("{}: no step in its metadata", ck.dir().display()),
        })? as usize;
        w1 = ck.load(ctx, "w1", &cols)?;
        b1 = ck.load(ctx, "b1", &vec_tp)?;
        w2 = ck.load(ctx, "w2", &vec_tp)?;
        b2 = ck.load(ctx, "b2", &copies)?;
    }
    for step in first..=cfg.steps {
        let (pre, act, logits) = forward(&xs, [&w1, &b1, &w2, &b2], &rows)?;
        // softmax cross-entropy, row by row (each rank holds whole rows)
        let (probs, row_loss) = softmax_xent(&logits, &ys, &rows, b, c)?;
        loss = row_loss.sum(0)?.full()?.to_vec()?[0] / b as f64;
        if cfg.verbose && ctx.rank() == 0 && (step % (cfg.steps / 10).max(1) == 0 || step == cfg.steps) {
            let done = step * 30 / cfg.steps.max(1);
            println!("step {step:>4}/{} [{}{}] loss {loss:.6}", cfg.steps, "#".repeat(done), " ".repeat(30 - done));
        }
        if step == cfg.steps {
            break;
        }
        // backward, by hand
        let dz = probs.sub(&ys)?.scale(1.0 / b as f64)?; // rows over dp
        let dw2 = act.transpose()?.matmul(&dz)?.place(&vec_tp)?; // partial over dp: all-reduce
        let db2 = dz.sum(0)?.place(&copies)?;
        let da = dz.matmul(&w2.transpose()?)?; // rows over dp, columns over tp
        let dpre = pre.relu_backward(&da)?;
        let dw1 = xs.transpose()?.matmul(&dpre)?.place(&cols)?; // partial over dp: all-reduce
        let db1 = dpre.sum(0)?.place(&vec_tp)?;
        w1 = w1.sub(&dw1.scale(cfg.lr)?)?;
        b1 = b1.sub(&db1.scale(cfg.lr)?)?;
        w2 = w2.sub(&dw2.scale(cfg.lr)?)?;
        b2 = b2.sub(&db2.scale(cfg.lr)?)?;
        if let Some(dir) = &cfg.save {
            if (step + 1) % cfg.save_every.max(1) == 0 || step + 1 == cfg.steps {
                let mut s = nx::ckpt::Saver::new(ctx, dir, (step + 1) as u64)?;
                for (n, t) in [("w1", &w1), ("b1", &b1), ("w2", &w2), ("b2", &b2)] {
                    s.add(n, t)?;
                }
                s.commit(serde_json::json!({ "step": step + 1 }))?;
            }
        }
    }
    // held-out accuracy
    let tx = Tensor::<f64>::from_fn(ctx, &[cfg.test, d], &rows, |i| x(i[0], i[1], cfg, b))?;
    let (_, _, logits) = forward(&tx, [&w1, &b1, &w2, &b2], &rows)?;
    let all = logits.full()?.to_vec()?;
    let right = (0..cfg.test).filter(|&i| argmax(&all[i * c..(i + 1) * c]) == class(i + b, c)).count();
    let params = [&w1, &b1, &w2, &b2].iter().map(|t| t.full().and_then(|a| Ok(a.to_vec()?))).collect::<Result<_>>()?;
    Ok(Outcome { loss, accuracy: right as f64 / cfg.test as f64, params })
}

/// Pre-activations, activations and logits of `xs` under (W1, b1, W2, b2).
fn forward<'d>(
    xs: &Tensor<'d, f64>,
    [w1, b1, w2, b2]: [&Tensor<'d, f64>; 4],
    rows: &Placement<'d>,
) -> Result<(Tensor<'d, f64>, Tensor<'d, f64>, Tensor<'d, f64>)> {
    let pre = xs.matmul(w1)?.add(b1)?; // rows over dp, columns over tp: no byte moves
    let act = pre.relu()?;
    let logits = act.matmul(w2)?.place(rows)?.add(b2)?; // a sum over tp, closed by an all-reduce
    Ok((pre, act, logits))
}

/// Row-wise softmax of `logits` and each row's cross-entropy against one-hot `ys` (a local map:
/// every rank holds whole rows).
fn softmax_xent<'d>(
    logits: &Tensor<'d, f64>,
    ys: &Tensor<'d, f64>,
    rows: &Placement<'d>,
    b: usize,
    c: usize,
) -> Result<(Tensor<'d, f64>, Tensor<'d, f64>)> {
    let y = ys.to_local().map(|a| a.to_vec()).transpose()?;
    let probs = logits.local_map(&[b, c], rows, |z| {
        let v = z.to_vec()?;
        let mut out = Vec::with_capacity(v.len());
        for row in v.chunks(c) {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            out.extend(e.iter().map(|x| x / s));
        }
        Ok(nx::kernels::Array::from_vec(z.device(), z.shape(), out)?)
    })?;
    let row_loss = probs.local_map(&[b], rows, |p| {
        let dev = p.device();
        let (p, y) = (p.to_vec()?, y.clone().unwrap_or_default());
        let l: Vec<f64> =
            p.chunks(c).zip(y.chunks(c)).map(|(p, y)| -p.iter().zip(y).map(|(p, y)| y * p.ln()).sum::<f64>()).collect();
        Ok(nx::kernels::Array::from_vec(dev, &[l.len()], l)?)
    })?;
    Ok((probs, row_loss))
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

/// The same training on one device, in plain f64 loops: the reference.
pub fn reference(cfg: &Config) -> Outcome {
    let (b, d, h, c) = (cfg.train, cfg.d_in, cfg.hidden, cfg.classes);
    let xs: Vec<f64> = (0..b * d).map(|k| x(k / d, k % d, cfg, 0)).collect();
    let mut w1: Vec<f64> = (0..d * h).map(|k| nx::normal(SEED_W1, k as u64) * (1.0 / (d as f64).sqrt())).collect();
    let mut b1 = vec![0.0; h];
    let mut w2: Vec<f64> = (0..h * c).map(|k| nx::normal(SEED_W2, k as u64) * (1.0 / (h as f64).sqrt())).collect();
    let mut b2 = vec![0.0; c];
    let fwd = |xs: &[f64], n: usize, w1: &[f64], b1: &[f64], w2: &[f64], b2: &[f64]| {
        let mut pre = vec![0.0; n * h];
        for i in 0..n {
            for j in 0..h {
                pre[i * h + j] = (0..d).map(|k| xs[i * d + k] * w1[k * h + j]).sum::<f64>() + b1[j];
            }
        }
        let act: Vec<f64> = pre.iter().map(|&v| v.max(0.0)).collect();
        let mut z = vec![0.0; n * c];
        for i in 0..n {
            for j in 0..c {
                z[i * c + j] = (0..h).map(|k| act[i * h + k] * w2[k * c + j]).sum::<f64>() + b2[j];
            }
        }
        (pre, act, z)
    };
    let mut loss = f64::NAN;
    for step in 0..=cfg.steps {
        let (pre, act, z) = fwd(&xs, b, &w1, &b1, &w2, &b2);
        let mut probs = vec![0.0; b * c];
        loss = 0.0;
        for i in 0..b {
            let row = &z[i * c..(i + 1) * c];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            for j in 0..c {
                probs[i * c + j] = (row[j] - m).exp() / s;
            }
            loss -= probs[i * c + class(i, c)].ln();
        }
        loss /= b as f64;
        if step == cfg.steps {
            break;
        }
        let dz: Vec<f64> = (0..b * c).map(|k| (probs[k] - f64::from(class(k / c, c) == k % c)) / b as f64).collect();
        let mut dw2 = vec![0.0; h * c];
        let mut db2 = vec![0.0; c];
        let mut da = vec![0.0; b * h];
        for i in 0..b {
            for j in 0..c {
                db2[j] += dz[i * c + j];
                for k in 0..h {
                    dw2[k * c + j] += act[i * h + k] * dz[i * c + j];
                    da[i * h + k] += dz[i * c + j] * w2[k * c + j];
                }
            }
        }
        let dpre: Vec<f64> = (0..b * h).map(|k| if pre[k] > 0.0 { da[k] } else { 0.0 }).collect();
        let mut dw1 = vec![0.0; d * h];
        let mut db1 = vec![0.0; h];
        for i in 0..b {
            for j in 0..h {
                db1[j] += dpre[i * h + j];
                for k in 0..d {
                    dw1[k * h + j] += xs[i * d + k] * dpre[i * h + j];
                }
            }
        }
        for (p, g) in [(&mut w1, &dw1), (&mut b1, &db1), (&mut w2, &dw2), (&mut b2, &db2)] {
            for (p, g) in p.iter_mut().zip(g.iter()) {
                *p -= cfg.lr * g;
            }
        }
    }
    let tx: Vec<f64> = (0..cfg.test * d).map(|k| x(k / d, k % d, cfg, b)).collect();
    let (_, _, z) = fwd(&tx, cfg.test, &w1, &b1, &w2, &b2);
    let right = (0..cfg.test).filter(|&i| argmax(&z[i * c..(i + 1) * c]) == class(i + b, c)).count();
    Outcome { loss, accuracy: right as f64 / cfg.test as f64, params: vec![w1, b1, w2, b2] }
}
