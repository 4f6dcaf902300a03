//! A GPT (decoder-only transformer, pre-norm, learned positions) over `dp` × `tp`: activations'
//! batch cut over `dp`; attention heads and the MLP's hidden features cut over `tp` (Megatron:
//! `q`, `k`, `v` and the first MLP layer column-parallel, the output projections row-parallel,
//! two all-reduces a block forward and two backward); the output head column-parallel over the
//! vocabulary, its cross-entropy closed across `tp` without gathering the logits.

use nx_collectives::Reducible;

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

/// Causal self-attention: `q`, `k`, `v` column-parallel, the output row-parallel.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

/// The MLP: width → 4·width (GELU) → width, column- then row-parallel.
#[derive(Debug, Clone)]
pub struct Mlp {
    fc: Linear,
    proj: Linear,
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
        if config.heads == 0 || c % config.heads != 0 || config.vocab == 0 || config.context == 0 {
            return Err(err(
                "nx::nn::gpt::Gpt::new",
                format!("{config:?}: the heads must divide the width, sizes above 0"),
            ));
        }
        let ln = |name: String| LayerNorm { name, d: c, eps: 1e-5 };
        let blocks = (0..config.layers)
            .map(|i| Block {
                ln1: ln(format!("h{i}.ln1")),
                attn: SelfAttention {
                    q: linear(format!("h{i}.attn.q"), c, c, Parallel::Column),
                    k: linear(format!("h{i}.attn.k"), c, c, Parallel::Column),
                    v: linear(format!("h{i}.attn.v"), c, c, Parallel::Column),
                    out: linear(format!("h{i}.attn.out"), c, c, Parallel::Row),
                    heads: config.heads,
                },
                ln2: ln(format!("h{i}.ln2")),
                mlp: Mlp {
                    fc: linear(format!("h{i}.mlp.fc"), c, 4 * c, Parallel::Column),
                    proj: linear(format!("h{i}.mlp.proj"), 4 * c, c, Parallel::Row),
                },
            })
            .collect();
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
        if self.config.heads % l.tp() != 0 {
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
            b.ln1.init(ctx, l, &mut p)?;
            for lin in [&b.attn.q, &b.attn.k, &b.attn.v] {
                lin.init(ctx, l, &mut p, next(), std)?;
            }
            b.attn.out.init(ctx, l, &mut p, next(), res)?;
            b.ln2.init(ctx, l, &mut p)?;
            b.mlp.fc.init(ctx, l, &mut p, next(), std)?;
            b.mlp.proj.init(ctx, l, &mut p, next(), res)?;
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
        let (b, t) = (s[0], s[1]);
        let positions = Tensor::<i64>::from_fn(&ids.ctx, &[t], &l.copies()?, |i| i[0] as i64)?;
        let mut x = self.tok.forward(p, ids)?.add(&self.pos.forward(p, &positions)?)?;
        for blk in &self.blocks {
            let h = blk.ln1.forward(p, &x)?;
            x = x.add(&blk.attn.forward(p, &h, b, t)?)?;
            let h = blk.ln2.forward(p, &x)?;
            let h = blk.mlp.fc.forward(p, &h)?.gelu()?;
            x = x.add(&blk.mlp.proj.forward(p, &h)?)?;
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
    fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>, b: usize, t: usize) -> Result<Var<'d, T>> {
        let c = x.shape()[2];
        let (h, d) = (self.heads, c / self.heads);
        let split = |y: Var<'d, T>| y.reshape(&[b, t, h, d])?.permute(&[0, 2, 1, 3]);
        let q = split(self.q.forward(p, x)?)?;
        let k = split(self.k.forward(p, x)?)?;
        let v = split(self.v.forward(p, x)?)?;
        let o = q.attention(&k, &v, true)?.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?;
        self.out.forward(p, &o)
    }
}
