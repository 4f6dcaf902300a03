//! A GPT (decoder-only transformer, pre-norm, learned positions) over `dp` × `tp`: activations'
//! batch cut over `dp`; attention heads and the MLP's hidden features cut over `tp` (Megatron:
//! `q`, `k`, `v` (one fused projection, GPT-2's `c_attn`) and the first MLP layer
//! column-parallel, the output projections row-parallel, two all-reduces a block forward and two
//! backward); the output head column-parallel over the vocabulary, its cross-entropy closed
//! across `tp` without gathering the logits.

use nx_collectives::Reducible;
use nx_kernels::Contraction;

use super::{Bound, Embedding, LayerNorm, Layout, Linear, Parallel, Params};
use crate::autodiff::Var;
use crate::tensor::err;
use crate::{Ctx, Result, Tensor};

/// A GPT's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The longest context.
    pub context: usize,
    /// Blocks.
    pub layers: usize,
    /// Attention heads (`tp` must divide them).
    pub heads: usize,
    /// The model's width (`heads` divides it).
    pub width: usize,
}

/// Causal self-attention: `q`, `k`, `v` one column-parallel projection (weight `[width, 3,
/// width]`, its last axis cut over `tp`: each rank's columns of all three), the output
/// row-parallel.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    qkv: String,
    width: usize,
    out: Linear,
    heads: usize,
}

/// The MLP: width → 4·width (GELU) → width, column- then row-parallel.
#[derive(Debug, Clone)]
pub struct Mlp {
    fc: Linear,
    proj: Linear,
}

impl Mlp {
    /// width → `hidden` (GELU) → width, parameters `{prefix}.fc` (column-parallel) and
    /// `{prefix}.proj` (row-parallel).
    pub fn new(prefix: &str, width: usize, hidden: usize) -> Mlp {
        Mlp {
            fc: linear(format!("{prefix}.fc"), width, hidden, Parallel::Column),
            proj: linear(format!("{prefix}.proj"), hidden, width, Parallel::Row),
        }
    }

    /// Adds the parameters from seeds `seed` and `seed + 1`.
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        l: &Layout<'d>,
        p: &mut Params<'d, T>,
        seed: u64,
        std: f64,
        out_std: f64,
    ) -> Result<()> {
        self.fc.init(ctx, l, p, seed, std)?;
        self.proj.init(ctx, l, p, seed.wrapping_add(1), out_std)
    }

    /// `proj(gelu(fc(x)))`: the hidden features over `tp`, one all-reduce.
    ///
    /// # Errors
    /// As [`Linear::forward`].
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>) -> Result<Var<'d, T>> {
        self.proj.forward(p, &self.fc.forward(p, x)?.gelu()?)
    }
}

impl Block {
    /// Block `prefix` of `width` features and `heads` heads (`{prefix}.ln1`, `.attn`, `.ln2`,
    /// `.mlp`; the MLP 4·width wide).
    pub fn new(prefix: &str, width: usize, heads: usize) -> Block {
        let ln = |name: String| LayerNorm { name, d: width, eps: 1e-5 };
        Block {
            ln1: ln(format!("{prefix}.ln1")),
            attn: SelfAttention::new(&format!("{prefix}.attn"), width, heads),
            ln2: ln(format!("{prefix}.ln2")),
            mlp: Mlp::new(&format!("{prefix}.mlp"), width, 4 * width),
        }
    }

    /// Adds the parameters from seeds `seed..seed + 6`.
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        l: &Layout<'d>,
        p: &mut Params<'d, T>,
        seed: u64,
        std: f64,
        out_std: f64,
    ) -> Result<()> {
        self.ln1.init(ctx, l, p)?;
        self.attn.init(ctx, l, p, seed, std, out_std)?;
        self.ln2.init(ctx, l, p)?;
        self.mlp.init(ctx, l, p, seed.wrapping_add(4), std, out_std)
    }

    /// `x + attn(ln1(x))`, then `+ mlp(ln2(·))`.
    ///
    /// # Errors
    /// As the layers'.
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>) -> Result<Var<'d, T>> {
        let x = x.add(&self.attn.forward(p, &self.ln1.forward(p, x)?)?)?;
        x.add(&self.mlp.forward(p, &self.ln2.forward(p, &x)?)?)
    }
}

/// A pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
#[derive(Debug, Clone)]
pub struct Block {
    ln1: LayerNorm,
    attn: SelfAttention,
    ln2: LayerNorm,
    mlp: Mlp,
}

/// The model.
#[derive(Debug, Clone)]
pub struct Gpt {
    /// Its sizes.
    pub config: GptConfig,
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

fn linear(name: String, d_in: usize, d_out: usize, parallel: Parallel) -> Linear {
    Linear { name, d_in, d_out, parallel, bias: true }
}

impl Gpt {
    /// The model of `config`.
    ///
    /// # Errors
    /// A width the heads do not divide; zero sizes.
    pub fn new(config: GptConfig) -> Result<Gpt> {
        let c = config.width;
        if config.heads == 0 || !c.is_multiple_of(config.heads) || config.vocab == 0 || config.context == 0 {
            return Err(err(
                "nx::nn::gpt::Gpt::new",
                format!("{config:?}: the heads must divide the width, sizes above 0"),
            ));
        }
        let ln = |name: String| LayerNorm { name, d: c, eps: 1e-5 };
        let blocks = (0..config.layers).map(|i| Block::new(&format!("h{i}"), c, config.heads)).collect();
        Ok(Gpt {
            config,
            tok: Embedding { name: "tok".into(), n: config.vocab, d: c, vocab_parallel: false },
            pos: Embedding { name: "pos".into(), n: config.context, d: c, vocab_parallel: false },
            blocks,
            ln_f: ln("ln_f".into()),
            head: Linear { name: "head".into(), d_in: c, d_out: config.vocab, parallel: Parallel::Column, bias: false },
        })
    }

    /// Fresh parameters from `seed` (GPT-2's: normal weights of deviation 0.02, the residual
    /// projections' 0.02/√(2·layers), zero biases, unit norms). Their global values depend on the
    /// seed alone, not on the mesh.
    ///
    /// # Errors
    /// A layout whose `tp` does not divide the heads.
    pub fn init<'d, T: Reducible>(&self, ctx: &Ctx<'d>, l: &Layout<'d>, seed: u64) -> Result<Params<'d, T>> {
        if !self.config.heads.is_multiple_of(l.tp()) {
            return Err(err(
                "nx::nn::gpt::Gpt::init",
                format!("tp = {} does not divide {} heads", l.tp(), self.config.heads),
            ));
        }
        let mut p = Params::new();
        let std = 0.02;
        let res = std / ((2 * self.config.layers.max(1)) as f64).sqrt();
        let mut s = seed.wrapping_mul(1000);
        let mut next = || {
            s = s.wrapping_add(1);
            s
        };
        self.tok.init(ctx, l, &mut p, next(), std)?;
        self.pos.init(ctx, l, &mut p, next(), std)?;
        for b in &self.blocks {
            let first = next();
            for _ in 0..5 {
                next();
            }
            b.init(ctx, l, &mut p, first, std, res)?;
        }
        self.ln_f.init(ctx, l, &mut p)?;
        self.head.init(ctx, l, &mut p, next(), std)?;
        Ok(p)
    }

    /// The logits `[b, t, vocab]` (the vocabulary cut over `tp`) of tokens `ids` `[b, t]` (`i64`,
    /// the batch cut over `dp`), `t` at most the context.
    ///
    /// # Errors
    /// Ids of another rank or too long, or placed otherwise; a parameter missing.
    pub fn forward<'d, T: Reducible>(
        &self,
        p: &Bound<'d, T>,
        l: &Layout<'d>,
        ids: &Tensor<'d, i64>,
    ) -> Result<Var<'d, T>> {
        let s = ids.shape();
        if s.len() != 2 || s[1] > self.config.context {
            return Err(err(
                "nx::nn::gpt::Gpt::forward",
                format!("ids {s:?}: needs [batch, t ≤ {}]", self.config.context),
            ));
        }
        let t = s[1];
        let positions = Tensor::<i64>::from_fn(&ids.ctx, &[t], &l.copies()?, |i| i[0] as i64)?;
        let mut x = self.tok.forward(p, ids)?.add(&self.pos.forward(p, &positions)?)?;
        for blk in &self.blocks {
            x = blk.forward(p, &x)?;
        }
        let x = self.ln_f.forward(p, &x)?;
        self.head.forward(p, &x)
    }

    /// The mean cross-entropy of the next tokens `labels` `[b, t]` (negative labels ignored)
    /// after `ids`.
    ///
    /// # Errors
    /// As [`Gpt::forward`] and [`Var::cross_entropy`].
    pub fn loss<'d, T: Reducible>(
        &self,
        p: &Bound<'d, T>,
        l: &Layout<'d>,
        ids: &Tensor<'d, i64>,
        labels: &Tensor<'d, i64>,
    ) -> Result<Var<'d, T>> {
        self.forward(p, l, ids)?.cross_entropy(labels)
    }
}

impl SelfAttention {
    /// Causal self-attention of `width` features in `heads` heads, parameters `{prefix}.qkv.w`
    /// `[width, 3, width]` and `{prefix}.qkv.b` `[3, width]` (`q`, `k`, `v` column-parallel: the
    /// last axis cut over `tp`; `[width, 3·width]` in C order is GPT-2's `c_attn`), and
    /// `{prefix}.out` (row-parallel).
    pub fn new(prefix: &str, width: usize, heads: usize) -> SelfAttention {
        SelfAttention {
            qkv: format!("{prefix}.qkv"),
            width,
            out: linear(format!("{prefix}.out"), width, width, Parallel::Row),
            heads,
        }
    }

    /// Adds the parameters (normal weights of deviation `std` from `seed`, the output's
    /// `out_std` from `seed + 3`; zero biases).
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        l: &Layout<'d>,
        p: &mut Params<'d, T>,
        seed: u64,
        std: f64,
        out_std: f64,
    ) -> Result<()> {
        let c = self.width;
        let w = Tensor::randn(ctx, &[c, 3, c], &l.cut(&[(2, &["tp"])])?, seed)?.scale(std)?;
        p.insert(&format!("{}.w", self.qkv), w)?;
        p.insert(&format!("{}.b", self.qkv), Tensor::zeros(ctx, &[3, c], &l.cut(&[(1, &["tp"])])?)?)?;
        self.out.init(ctx, l, p, seed.wrapping_add(3), out_std)
    }

    /// The attention of `x` `[b, t, width]` (the batch cut over `dp`): heads over `tp`.
    ///
    /// # Errors
    /// An input of another shape; `tp` not dividing the heads.
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>) -> Result<Var<'d, T>> {
        let s = x.shape();
        if s.len() != 3 || s[2] != self.width || !s[2].is_multiple_of(self.heads) {
            return Err(err(
                "nx::nn::gpt::SelfAttention::forward",
                format!(
                    "an input {s:?}: needs [b, t, {}] ({} features, a multiple of {} heads)",
                    self.width, self.width, self.heads
                ),
            ));
        }
        let (b, t, c) = (s[0], s[1], s[2]);
        let (h, d) = (self.heads, c / self.heads);
        let (w, bias) = (p.get(&format!("{}.w", self.qkv))?, p.get(&format!("{}.b", self.qkv))?);
        let spec = Contraction { batch: vec![], contracting: vec![(2, 0)] };
        // [b, t, 3, h, d]: the fused projection reshaped (no copy), attention reading q, k, v in
        // place
        let qkv = x.contract_add(w, &spec, bias)?.reshape(&[b, t, 3, h, d])?;
        let o = qkv.attention_qkv(true)?.reshape(&[b, t, c])?;
        self.out.forward(p, &o)
    }
}
