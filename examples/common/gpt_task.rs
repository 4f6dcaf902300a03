//! `train_gpt`'s task and training loop, shared by the example and its tests: a GPT learns
//! multi-digit addition written as text (`"123+456="` followed by the sum's digits reversed,
//! `"9750"`, so each digit depends on the ones before it), scored by exact match on held-out
//! problems (a tenth of all pairs, never trained on), answers generated greedily digit by digit.

#![allow(dead_code)]

use std::time::Instant;

use nx::autodiff::{Grads, Tape};
use nx::nn::gpt::{Gpt, GptConfig};
use nx::nn::{Layout, Params};
use nx::optim::{warmup_cosine, AdamW, Zero};
use nx::{Ctx, Result, Tensor};

/// Tokens: digits 0–9, `+` and `=`.
pub const VOCAB: usize = 12;
const PLUS: i64 = 10;
const EQUALS: i64 = 11;

/// What to train.
#[derive(Debug, Clone)]
pub struct Config {
    /// Data-parallel extent.
    pub dp: usize,
    /// Tensor-parallel extent (divides the heads).
    pub tp: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// The seed of the weights and batches.
    pub seed: u64,
    /// ZeRO-1 over `dp`.
    pub zero: bool,
    /// Digits of each operand.
    pub digits: usize,
    /// Blocks.
    pub layers: usize,
    /// Heads.
    pub heads: usize,
    /// Width.
    pub width: usize,
    /// Problems a step.
    pub batch: usize,
    /// The peak learning rate.
    pub lr: f64,
    /// Held-out problems scored.
    pub eval: usize,
    /// Show progress (rank 0).
    pub verbose: bool,
    /// Compute in bf16 (forward and backward), f32 master weights and optimizer.
    pub bf16: bool,
    /// Micro-batches a step (gradients accumulated).
    pub micro: usize,
    /// Save checkpoints under this root.
    pub save: Option<std::path::PathBuf>,
    /// Save every this many steps (and at the end).
    pub save_every: usize,
    /// Resume from the checkpoint this root's `latest` names.
    pub resume: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dp: 2,
            tp: 2,
            steps: 800,
            seed: 2,
            zero: false,
            digits: 2,
            layers: 4,
            heads: 4,
            width: 128,
            batch: 64,
            lr: 6e-4,
            eval: 200,
            verbose: true,
            bf16: false,
            micro: 1,
            save: None,
            save_every: 100,
            resume: None,
        }
    }
}

/// What a run ends with.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Each step's training loss.
    pub losses: Vec<f64>,
    /// Exact-match accuracy on the held-out problems.
    pub accuracy: f64,
    /// Training tokens a second (wall clock, rank 0's view).
    pub tokens_per_s: f64,
    /// The final parameters, whole, by name.
    pub params: Vec<(String, Vec<f32>)>,
}

/// Whether the pair (a, b) is held out (a tenth of all pairs, by hash).
pub fn held_out(a: u64, b: u64) -> bool {
    nx::splitmix64(a.wrapping_mul(1_000_003) ^ b ^ 0xA5A5).is_multiple_of(10)
}

/// The tokens of `a+b=` and the reversed sum, `3·digits + 3` of them.
pub fn tokens(a: u64, b: u64, digits: usize) -> Vec<i64> {
    let num = |mut x: u64, n: usize| -> Vec<i64> {
        let mut d = vec![0; n];
        for i in (0..n).rev() {
            d[i] = (x % 10) as i64;
            x /= 10;
        }
        d
    };
    let mut t = num(a, digits);
    t.push(PLUS);
    t.extend(num(b, digits));
    t.push(EQUALS);
    let mut s = num(a + b, digits + 1);
    s.reverse();
    t.extend(s);
    t
}

/// Training problem `i` of step `step`: a pair not held out.
pub fn train_pair(seed: u64, step: usize, i: usize, digits: usize) -> (u64, u64) {
    let n = 10u64.pow(digits as u32);
    let mut k = 0u64;
    loop {
        let h = nx::splitmix64(seed ^ nx::splitmix64((step as u64) << 20 ^ (i as u64) << 4 ^ k));
        let (a, b) = (h % n, (h >> 32) % n);
        if !held_out(a, b) {
            return (a, b);
        }
        k += 1;
    }
}

/// The first `count` held-out pairs, in order of a fixed walk.
pub fn eval_pairs(count: usize, digits: usize) -> Vec<(u64, u64)> {
    let n = 10u64.pow(digits as u32);
    let mut out = Vec::new();
    let mut k = 0u64;
    while out.len() < count && k < 64 * n * n {
        let h = nx::splitmix64(0xE7A1 ^ k);
        let (a, b) = (h % n, (h >> 32) % n);
        if held_out(a, b) && !out.contains(&(a, b)) {
            out.push((a, b));
        }
        k += 1;
    }
    out
}

/// The model of `cfg`.
pub fn model(cfg: &Config) -> Result<Gpt> {
    Gpt::new(GptConfig {
        vocab: VOCAB,
        context: 3 * cfg.digits + 2,
        layers: cfg.layers,
        heads: cfg.heads,
        width: cfg.width,
    })
}

/// Inputs and labels of step `step`'s batch, row-major `[batch, 3·digits + 2]` each, the labels
/// of the prompt's positions ignored (−1).
pub fn batch_host(cfg: &Config, step: usize) -> (Vec<i64>, Vec<i64>) {
    let t = 3 * cfg.digits + 2;
    let prompt = 2 * cfg.digits + 1;
    let (mut ids, mut labels) = (Vec::with_capacity(cfg.batch * t), Vec::with_capacity(cfg.batch * t));
    for i in 0..cfg.batch {
        let (a, b) = train_pair(cfg.seed, step, i, cfg.digits);
        let s = tokens(a, b, cfg.digits);
        ids.extend_from_slice(&s[..t]);
        labels.extend((0..t).map(|j| if j < prompt { -1 } else { s[j + 1] }));
    }
    (ids, labels)
}

/// Trains on the mesh of `ctx` and answers the outcome (on every rank).
pub fn train(ctx: &Ctx<'_>, cfg: &Config) -> Result<Outcome> {
    let mesh = ctx.mesh(&[("dp", cfg.dp), ("tp", cfg.tp)])?;
    let layout = Layout::new(&mesh)?;
    let rows = layout.cut(&[(0, &["dp"])])?;
    let gpt = model(cfg)?;
    let mut params: Params<'_, f32> = gpt.init(ctx, &layout, cfg.seed)?;
    let mut opt = AdamW::new();
    opt.weight_decay = 0.0;
    if cfg.zero {
        opt.zero = Some(Zero { axis: "dp".into() });
    }
    let mut losses = Vec::with_capacity(cfg.steps);
    let mut first_step = 0;
    if let Some(dir) = &cfg.resume {
        // parameters, optimizer state and progress; the losses so far, so that the run reads as
        // an uninterrupted one
        let ck = nx::ckpt::Checkpoint::open(dir)?;
        let meta = ck.index().meta.clone();
        let bad = |what: &str| nx::Error::Invalid {
            func: "train_gpt --resume",
            why: format!("{}: no {what} in its metadata", ck.dir().display()),
        };
        first_step = meta["step"].as_u64().ok_or_else(|| bad("step"))? as usize;
        losses = meta["losses"].as_array().map(|v| v.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default();
        let names: Vec<(String, nx::Placement<'_>)> =
            params.iter().map(|(n, p)| (n.to_string(), p.placement().clone())).collect();
        for (name, at) in names {
            let w = ck.load::<f32>(ctx, &name, &at)?;
            if first_step > 0 {
                let at = if cfg.zero { nx::optim::shard(&at, w.shape(), "dp")? } else { at.clone() };
                let m = ck.load::<f32>(ctx, &format!("adam.{name}.m"), &at)?;
                let v = ck.load::<f32>(ctx, &format!("adam.{name}.v"), &at)?;
                let steps = meta["adam_steps"][&name].as_u64().ok_or_else(|| bad(&format!("adam_steps of {name}")))?;
                opt.set_state(&name, nx::optim::Moments { m, v, steps });
            }
            params.set(&name, w)?;
        }
    }
    let bar = (cfg.verbose && ctx.rank() == 0).then(|| {
        let b = indicatif::ProgressBar::new(cfg.steps as u64);
        b.set_position(first_step as u64);
        b.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"));
        b
    });
    let t = 3 * cfg.digits + 2;
    // timed from the end of the first step (the pools and caches warm), where there are more
    let (mut start, mut first) = (Instant::now(), first_step);
    for step in first_step..cfg.steps {
        let (ids, labels) = batch_host(cfg, step);
        // micro-batches of consecutive rows, each loss weighted by its share of the rows (every
        // row has as many answer tokens), their gradients accumulated
        let micro = cfg.micro.clamp(1, cfg.batch.max(1));
        let mut grads: Option<Grads<'_, f32>> = None;
        let mut l = 0.0;
        for k in 0..micro {
            let (r0, r1) = (k * cfg.batch / micro, (k + 1) * cfg.batch / micro);
            let n = r1 - r0;
            let ids = Tensor::from_fn(ctx, &[n, t], &rows, |i| ids[(r0 + i[0]) * t + i[1]])?;
            let labels = Tensor::from_fn(ctx, &[n, t], &rows, |i| labels[(r0 + i[0]) * t + i[1]])?;
            let w = n as f64 / cfg.batch as f64;
            let g = if cfg.bf16 {
                let tape = Tape::<half::bf16>::new();
                let policy =
                    nx::kernels::Policy { params: nx::Dtype::F32, compute: nx::Dtype::BF16, output: nx::Dtype::F32 };
                let loss = gpt.loss(&params.bind_with(&tape, &policy)?, &layout, &ids, &labels)?.scale(w)?;
                l += f64::from(loss.value().to_local().expect("copies on every rank").to_vec()?[0]);
                tape.backward(&loss)?.cast::<f32>()?
            } else {
                let tape = Tape::new();
                let loss = gpt.loss(&params.bind(&tape), &layout, &ids, &labels)?.scale(w)?;
                l += f64::from(loss.value().to_local().expect("copies on every rank").to_vec()?[0]);
                tape.backward(&loss)?
            };
            match &mut grads {
                None => grads = Some(g),
                Some(all) => all.accumulate(g)?,
            }
        }
        let grads = grads.expect("at least one micro-batch");
        let lr = warmup_cosine(step, cfg.steps / 20 + 1, cfg.steps, cfg.lr, cfg.lr / 10.0);
        opt.step(&mut params, &grads, lr)?;
        losses.push(l);
        if let Some(dir) = &cfg.save {
            if (step + 1) % cfg.save_every.max(1) == 0 || step + 1 == cfg.steps {
                save_state(ctx, dir, step + 1, &params, &opt, &losses)?;
            }
        }
        if step == first_step && step + 1 < cfg.steps {
            (start, first) = (Instant::now(), step + 1);
        }
        if let Some(b) = &bar {
            b.inc(1);
            let tps = (step + 1).saturating_sub(first) as f64 * (cfg.batch * t) as f64 / start.elapsed().as_secs_f64();
            b.set_message(format!("loss {l:.4}, {tps:.0} tokens/s"));
        }
    }
    if let Some(b) = bar {
        b.finish();
    }
    let tokens_per_s = (cfg.steps.saturating_sub(first) * cfg.batch * t) as f64 / start.elapsed().as_secs_f64();
    let accuracy = score(ctx, cfg, &gpt, &layout, &params)?;
    let params = params.iter().map(|(n, p)| Ok((n.to_string(), p.full()?.to_vec()?))).collect::<Result<Vec<_>>>()?;
    Ok(Outcome { losses, accuracy, tokens_per_s, params })
}

/// Saves the parameters, AdamW's state and the progress (the step, the losses so far) as
/// checkpoint `step` under `dir`.
fn save_state<'d>(
    ctx: &Ctx<'d>,
    dir: &std::path::Path,
    step: usize,
    params: &Params<'d, f32>,
    opt: &AdamW<'d, f32>,
    losses: &[f64],
) -> Result<()> {
    let mut s = nx::ckpt::Saver::new(ctx, dir, step as u64)?;
    for (name, p) in params.iter() {
        s.add(name, p)?;
    }
    let mut states: Vec<(&String, &nx::optim::Moments<'d, f32>)> = opt.states().collect();
    states.sort_by(|a, b| a.0.cmp(b.0));
    let mut steps = serde_json::Map::new();
    for (name, st) in states {
        s.add(&format!("adam.{name}.m"), &st.m)?;
        s.add(&format!("adam.{name}.v"), &st.v)?;
        steps.insert(name.clone(), serde_json::json!(st.steps));
    }
    s.commit(serde_json::json!({ "step": step, "losses": losses, "adam_steps": steps }))?;
    Ok(())
}

/// Exact-match accuracy on the held-out problems: each answer digit generated greedily from the
/// prompt and the digits before it.
pub fn score<'d>(ctx: &Ctx<'d>, cfg: &Config, gpt: &Gpt, layout: &Layout<'d>, params: &Params<'d, f32>) -> Result<f64> {
    let pairs = eval_pairs(cfg.eval, cfg.digits);
    if pairs.is_empty() {
        return Ok(0.0);
    }
    let t = 3 * cfg.digits + 2;
    let prompt = 2 * cfg.digits + 2;
    let rows = layout.cut(&[(0, &["dp"])])?;
    let mut seqs: Vec<Vec<i64>> = pairs
        .iter()
        .map(|&(a, b)| {
            let mut s = tokens(a, b, cfg.digits);
            s.truncate(prompt);
            s.resize(t, 0);
            s
        })
        .collect();
    let tape = Tape::new();
    let bound = params.bind(&tape);
    for j in 0..=cfg.digits {
        let ids = Tensor::from_fn(ctx, &[pairs.len(), t], &rows, |i| seqs[i[0]][i[1]])?;
        let logits = tape.no_grad(|| gpt.forward(&bound, layout, &ids))?;
        let at = prompt - 1 + j;
        let z = logits.value().narrow(1, at, 1)?.full()?.to_vec()?;
        for (i, s) in seqs.iter_mut().enumerate() {
            let row = &z[i * VOCAB..(i + 1) * VOCAB];
            let best = (0..VOCAB).max_by(|&x, &y| row[x].total_cmp(&row[y])).expect("a vocabulary");
            // the last digit lies past the inputs
            if prompt + j < t {
                s[prompt + j] = best as i64;
            } else {
                s.push(best as i64);
            }
        }
    }
    let right =
        pairs.iter().zip(&seqs).filter(|(&(a, b), s)| s[prompt..] == tokens(a, b, cfg.digits)[prompt..]).count();
    Ok(right as f64 / pairs.len().max(1) as f64)
}
