//! Optimizers over placed parameters: [`Sgd`] (momentum), [`AdamW`] (decoupled weight decay),
//! both with global-norm clipping across shards and an optional ZeRO-1 mode; [`warmup_cosine`].
//!
//! A step closes each gradient at its parameter's placement (an all-reduce over `dp` for a
//! weight whose gradient is a sum over it) and keeps each parameter's state (momentum, moments)
//! placed as the parameter. In ZeRO-1 mode ([`Zero`]) the state and the update are cut over the
//! data-parallel axis as well: the gradient is reduce-scattered to the shard, the shard updated,
//! and the parameter all-gathered back — the same arithmetic on each element, so the same
//! parameters as plain data parallelism.
//!
//! The gradient's global 2-norm is that of the closed gradients, each rank summing the squares
//! of its window and the sums closed over the mesh axes that cut them, so every rank clips by the
//! same factor.
//!
//! AdamW steps its small parameters (at most 16,384 elements, updated where they lie) as one flat
//! array a rank for each placement, rank and update count, and sums their squares likewise
//! (`flat.rs`: PyTorch's `foreach` step): one kernel call for a GPT's ~40 biases and norms instead
//! of one each. The arithmetic of each element is the same program; the norm's association is
//! over the flat array (its bits may differ from a sum per parameter's in the last place), the
//! same on every backend and mesh of one layout.

mod flat;

use std::collections::HashMap;

use nx_collectives::Reducible;
use nx_kernels::prog::{Prog, V};
use nx_kernels::{Array, Kernels, Operand};
use nx_placement::rules;

use crate::autodiff::Grads;
use crate::nn::Params;
use crate::tensor::{check, err};
use crate::{Placement, Result, Tensor};

/// ZeRO-1: optimizer state and updates cut over the mesh axis `axis` (`dp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zero {
    /// The data-parallel mesh axis.
    pub axis: String,
}

/// The placement of a parameter's state under ZeRO over `axis`: its placement with `axis`
/// added to the cut of its first axis the placement leaves whole (else to its first axis's cut).
///
/// # Errors
/// A placement over a mesh without `axis`; a scalar parameter.
pub fn shard<'d>(p: &Placement<'d>, shape: &[usize], axis: &str) -> Result<Placement<'d>> {
    const FUNC: &str = "nx::optim::shard";
    p.mesh_of().axis(axis)?;
    if shape.is_empty() {
        return Err(err(FUNC, format!("a scalar at {p} has no axis to cut over {axis}")));
    }
    let mut pp = rules::parts(FUNC, p)?;
    if pp.cuts.iter().any(|c| c.1.iter().any(|n| n == axis)) {
        return Ok(p.clone());
    }
    match (0..shape.len()).find(|&a| pp.cut_of(a).is_empty() && shape[a] > 1) {
        Some(a) => pp.cuts.push((a, vec![axis.to_string()])),
        None => match pp.cuts.iter_mut().find(|c| c.0 == 0) {
            Some(c) => c.1.push(axis.to_string()),
            None => pp.cuts.push((0, vec![axis.to_string()])),
        },
    }
    pp.cuts.sort();
    Ok(rules::rebuild(p, &pp)?)
}

/// Where a parameter's update runs: its placement, or its ZeRO shard.
fn target<'d>(zero: &Option<Zero>, t: &Tensor<'d, impl Reducible>) -> Result<Placement<'d>> {
    match zero {
        Some(z) => shard(t.placement(), t.shape(), &z.axis),
        None => Ok(t.placement().clone()),
    }
}

/// Tensors by name.
type Named<'d, T> = Vec<(String, Tensor<'d, T>)>;

/// The gradients of `params` closed at their update placements, and their global 2-norm.
fn closed<'d, T: Reducible>(
    params: &Params<'d, T>,
    grads: &Grads<'d, T>,
    zero: &Option<Zero>,
) -> Result<(Named<'d, T>, f64)> {
    let mut names = Vec::new();
    let (mut gs, mut ats) = (Vec::new(), Vec::new());
    for (name, w) in params.iter() {
        let Some(g) = grads.named(name) else { continue };
        if w.placement().is_partial() {
            return Err(err(
                "nx::optim",
                format!("parameter {name} is a sum of terms ({}): keep parameters closed", w.placement()),
            ));
        }
        names.push(name.to_string());
        gs.push(g);
        ats.push(target(zero, w)?);
    }
    // the gradients closed together (one all-reduce per group of devices, not one per gradient),
    // then the squares of each rank's windows (the small gradients of one placement as one flat
    // array), closed over the axes that cut them likewise
    let gs = Tensor::place_all(&gs, &ats.iter().collect::<Vec<_>>())?;
    let refs: Vec<&Tensor<'d, T>> = gs.iter().collect();
    let (groups, alone) = flat::groups(&refs, |_| Some(()));
    let mut squares = Vec::with_capacity(groups.len() + alone.len());
    for g in &groups {
        squares.push(flat::group_squares(&g.iter().map(|&i| refs[i]).collect::<Vec<_>>())?);
    }
    for &i in &alone {
        squares.push(gs[i].sum_squares()?);
    }
    let whole = squares.iter().map(|s| Placement::mesh(s.placement().mesh_of(), &[])).collect::<Result<Vec<_>, _>>()?;
    let squares = Tensor::place_all(&squares.iter().collect::<Vec<_>>(), &whole.iter().collect::<Vec<_>>())?;
    let mut sq = 0.0;
    for s in &squares {
        let s = s.to_local().ok_or_else(|| err("nx::optim", format!("no sum of squares of {names:?} on this rank")))?;
        sq += s.to_vec()?[0].to_value().as_f64_lossy();
    }
    Ok((names.into_iter().zip(gs).collect(), sq.sqrt()))
}

trait Lossy {
    fn as_f64_lossy(&self) -> f64;
}

impl Lossy for nx_kernels::Value {
    fn as_f64_lossy(&self) -> f64 {
        match *self {
            nx_kernels::Value::Float(v) => v,
            nx_kernels::Value::Int(i) => i as f64,
            nx_kernels::Value::Bool(b) => f64::from(u8::from(b)),
            nx_kernels::Value::Complex(c) => c.re,
        }
    }
}

/// The factor clipping a gradient of norm `norm` to at most `max` (1 where it is within).
fn clip_factor(norm: f64, max: Option<f64>) -> f64 {
    match max {
        Some(m) if norm > m => m / (norm + 1e-6),
        _ => 1.0,
    }
}

/// AdamW (Loshchilov & Hutter): Adam's moments with bias correction and weight decay applied to
/// the parameter directly, `w ← w − lr·(m̂/(√v̂ + eps) + wd·w)`, decay on parameters of rank ≥ 2
/// (weights and tables, not biases or norms), as GPT-2's training does.
#[derive(Debug)]
pub struct AdamW<'d, T: Reducible> {
    /// β₁.
    pub beta1: f64,
    /// β₂.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// The decoupled weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this, if set.
    pub clip: Option<f64>,
    /// ZeRO-1, if set.
    pub zero: Option<Zero>,
    state: HashMap<String, Moments<'d, T>>,
}

/// A parameter's AdamW state: its first and second moments and its number of updates.
#[derive(Debug, Clone)]
pub struct Moments<'d, T: Reducible> {
    /// The first moment, placed as the update runs (the parameter's placement, or its shard).
    pub m: Tensor<'d, T>,
    /// The second moment.
    pub v: Tensor<'d, T>,
    /// Updates so far (each parameter's own: one skipped for want of a gradient is not counted).
    pub steps: u64,
}

impl<'d, T: Reducible> AdamW<'d, T> {
    /// β = (0.9, 0.95), ε = 1e-8, decay 0.1, clipping at 1, no ZeRO.
    pub fn new() -> Self {
        AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            clip: Some(1.0),
            zero: None,
            state: HashMap::new(),
        }
    }

    /// One update of `params` by `grads` at learning rate `lr` (a parameter without a gradient
    /// is left as it is); answers the gradient's global norm before clipping. The moments and the
    /// weight are computed in one pass in `T`'s compute type (f32 for the halves), the weight
    /// from the moments before they are rounded to `T`.
    ///
    /// # Errors
    /// A ZeRO axis the mesh lacks; a parameter that is a sum of terms; the collectives' errors.
    pub fn step(&mut self, params: &mut Params<'d, T>, grads: &Grads<'d, T>, lr: f64) -> Result<f64> {
        let (gs, norm) = closed(params, grads, &self.zero)?;
        let f = clip_factor(norm, self.clip);
        let ws: Vec<Tensor<'d, T>> =
            gs.iter().map(|(name, _)| params.get(name).expect("a gradient's parameter").clone()).collect();
        // the small parameters updated where they lie, by placement, rank (so decay) and update
        // count, as one flat array each; the rest alone
        let refs: Vec<&Tensor<'d, T>> = gs.iter().map(|(_, g)| g).collect();
        let (groups, alone) = flat::groups(&refs, |i| {
            let (name, g) = &gs[i];
            let state = self.state.get(name);
            let placed = ws[i].placement().equal(g.placement())
                && state.is_none_or(|s| s.m.placement().equal(g.placement()) && s.v.placement().equal(g.placement()));
            placed.then(|| state.map(|s| s.steps))
        });
        for g in &groups {
            self.update_group(params, &gs, &ws, g, f, lr)?;
        }
        for i in alone {
            let (name, g) = &gs[i];
            let w = &ws[i];
            let at = g.placement().clone();
            let ws = if w.placement().equal(&at) { w.clone() } else { w.place(&at)? };
            let (m, v, steps) = match self.state.remove(name) {
                Some(s) => (s.m, s.v, s.steps),
                None => (Tensor::zeros(&w.ctx, w.shape(), &at)?, Tensor::zeros(&w.ctx, w.shape(), &at)?, 0),
            };
            let k = self.constants(steps + 1, f, lr, w.shape().len());
            // m, v and w updated in one pass: loads w, m, v, g
            let mut out = ws.map_many(&[&m, &v, g], false, |p, l| k.program(p, l))?;
            let (v, m, nw) = (out.pop().expect("three"), out.pop().expect("three"), out.pop().expect("three"));
            let nw = if nw.placement().equal(w.placement()) { nw } else { nw.place(w.placement())? };
            params.set(name, nw)?;
            self.state.insert(name.clone(), Moments { m, v, steps: steps + 1 });
        }
        Ok(norm)
    }

    /// The constants of an update numbered `steps` of a parameter of rank `rank`.
    fn constants(&self, steps: u64, clip: f64, lr: f64, rank: usize) -> Update {
        let t = i32::try_from(steps).unwrap_or(i32::MAX);
        Update {
            b1: self.beta1,
            b2: self.beta2,
            eps: self.eps,
            clip,
            lr,
            c1: 1.0 - self.beta1.powi(t),
            c2: 1.0 - self.beta2.powi(t),
            wd: if rank >= 2 { self.weight_decay } else { 0.0 },
        }
    }

    /// Updates the parameters `members` (indices into `gs` and `ws`: one placement, where their
    /// update runs, one rank, one update count) as one flat array on this rank.
    fn update_group(
        &mut self,
        params: &mut Params<'d, T>,
        gs: &[(String, Tensor<'d, T>)],
        ws: &[Tensor<'d, T>],
        members: &[usize],
        clip: f64,
        lr: f64,
    ) -> Result<()> {
        const FUNC: &str = "nx::optim::AdamW::step";
        let first = &ws[members[0]];
        let steps = self.state.get(&gs[members[0]].0).map_or(0, |s| s.steps) + 1;
        let k = self.constants(steps, clip, lr, first.shape().len());
        let wl: Option<Vec<&Array<T>>> = members.iter().map(|&i| ws[i].local.as_ref()).collect();
        let gl: Option<Vec<&Array<T>>> = members.iter().map(|&i| gs[i].1.local.as_ref()).collect();
        let (Some(wl), Some(gl)) = (wl, gl) else {
            // this rank holds no window of them (one placement: of none)
            for &i in members {
                let (name, w) = (&gs[i].0, &ws[i]);
                let none = || w.with_local(w.placement().clone(), w.shape().to_vec(), None);
                let (m, v) = match self.state.remove(name) {
                    Some(s) => (s.m, s.v),
                    None => (none(), none()),
                };
                self.state.insert(name.clone(), Moments { m, v, steps });
            }
            return Ok(());
        };
        let ctx = &first.ctx;
        let n: usize = wl.iter().map(|a| a.numel()).sum();
        let (w, g) = (flat::flat(ctx, &wl)?, flat::flat(ctx, &gl)?);
        // the group shares whether it has a state (its key)
        let (m, v) = if !self.state.contains_key(&gs[members[0]].0) {
            (Array::<T>::zeros_on(ctx.rig(), &[n])?, Array::<T>::zeros_on(ctx.rig(), &[n])?)
        } else {
            // each member's moments: windows of its parameter's shape (a state set from elsewhere)
            let moment = |second: bool| -> Result<Vec<&Array<T>>> {
                members
                    .iter()
                    .zip(&wl)
                    .map(|(&i, w)| {
                        let s = self.state.get(&gs[i].0).and_then(|s| if second { &s.v } else { &s.m }.local.as_ref());
                        match s {
                            Some(a) if a.shape() == w.shape() => Ok(a),
                            Some(a) => Err(err(
                                FUNC,
                                format!(
                                    "{}: a moment's window {:?} for a parameter's {:?}",
                                    gs[i].0,
                                    a.shape(),
                                    w.shape()
                                ),
                            )),
                            None => Err(err(FUNC, format!("{}: no moment on this rank", gs[i].0))),
                        }
                    })
                    .collect()
            };
            (flat::flat(ctx, &moment(false)?)?, flat::flat(ctx, &moment(true)?)?)
        };
        let mut p = Prog::new(&[T::DTYPE; 4]);
        let loads: Vec<V> = (0..4).map(|i| p.load(i)).collect();
        for o in k.program(&mut p, &loads) {
            let o = p.cast(o, T::DTYPE);
            p.output(o);
        }
        let fresh = || Array::<T>::uninit_on(ctx.rig(), &[n]);
        let (nw, nm, nv) = (fresh()?, fresh()?, fresh()?);
        let read: [&dyn Operand; 4] = [&w, &m, &v, &g];
        check(FUNC, ctx.host().map(&p, &[n], &[&nw, &nm, &nv], &read), &read)?;
        let mut at = 0;
        for (j, &i) in members.iter().enumerate() {
            let (name, t) = (&gs[i].0, &ws[i]);
            let shape = wl[j].shape();
            let view = |a: &Array<T>| -> Result<Tensor<'d, T>> {
                Ok(t.with_local(t.placement().clone(), t.shape().to_vec(), Some(flat::part(a, at, shape)?)))
            };
            params.set(name, view(&nw)?)?;
            self.state.insert(name.clone(), Moments { m: view(&nm)?, v: view(&nv)?, steps });
            at += wl[j].numel();
        }
        Ok(())
    }

    /// Sets the state of `name` (resuming from a checkpoint): its moments must lie where the
    /// update runs (the parameter's placement, or [`shard`] of it under ZeRO).
    pub fn set_state(&mut self, name: &str, state: Moments<'d, T>) {
        self.state.insert(name.to_string(), state);
    }

    /// Every parameter's state, by name.
    pub fn states(&self) -> impl Iterator<Item = (&String, &Moments<'d, T>)> {
        self.state.iter()
    }

    /// The state of `name` (first and second moments, placed as they are kept, and its update
    /// count), or `None`.
    pub fn state(&self, name: &str) -> Option<&Moments<'d, T>> {
        self.state.get(name)
    }
}

/// The constants of one AdamW update.
struct Update {
    b1: f64,
    b2: f64,
    eps: f64,
    /// The clipping factor of the gradient.
    clip: f64,
    lr: f64,
    /// The bias corrections `1 − βᵗ`.
    c1: f64,
    c2: f64,
    /// The decay.
    wd: f64,
}

impl Update {
    /// The update of loads `[w, m, v, g]`: `[w', m', v']`.
    fn program(&self, p: &mut Prog, l: &[V]) -> Vec<V> {
        let (w, m, v, g) = (l[0], l[1], l[2], l[3]);
        let (a1, s1, a2, s2, ff) = (
            p.float(self.b1),
            p.float((1.0 - self.b1) * self.clip),
            p.float(self.b2),
            p.float(1.0 - self.b2),
            p.float(self.clip),
        );
        let x = p.mul(a1, m);
        let y = p.mul(s1, g);
        let m = p.add(x, y);
        let x = p.mul(a2, v);
        let gg = p.mul(g, ff);
        let g2 = p.mul(gg, gg);
        let y = p.mul(s2, g2);
        let v = p.add(x, y);
        let (k1, k2, e, lrv, d) =
            (p.float(1.0 / self.c1), p.float(1.0 / self.c2), p.float(self.eps), p.float(self.lr), p.float(self.wd));
        let mh = p.mul(m, k1);
        let vh = p.mul(v, k2);
        let s = p.unary(nx_kernels::prog::UnOp::Sqrt, vh);
        let s = p.add(s, e);
        let u = p.div(mh, s);
        let dw = p.mul(d, w);
        let u = p.add(u, dw);
        let step = p.mul(lrv, u);
        vec![p.sub(w, step), m, v]
    }
}

impl<T: Reducible> Default for AdamW<'_, T> {
    fn default() -> Self {
        AdamW::new()
    }
}

/// SGD with momentum `μ` (`torch`'s form: `b ← μ·b + g`, `w ← w − lr·b`), clipping and ZeRO as
/// [`AdamW`].
#[derive(Debug)]
pub struct Sgd<'d, T: Reducible> {
    /// μ.
    pub momentum: f64,
    /// Clip the global gradient norm to this, if set.
    pub clip: Option<f64>,
    /// ZeRO-1, if set.
    pub zero: Option<Zero>,
    state: HashMap<String, Tensor<'d, T>>,
}

impl<'d, T: Reducible> Sgd<'d, T> {
    /// Momentum `momentum`, no clipping, no ZeRO.
    pub fn new(momentum: f64) -> Self {
        Sgd { momentum, clip: None, zero: None, state: HashMap::new() }
    }

    /// One update; answers the gradient's global norm before clipping.
    ///
    /// # Errors
    /// As [`AdamW::step`].
    pub fn step(&mut self, params: &mut Params<'d, T>, grads: &Grads<'d, T>, lr: f64) -> Result<f64> {
        let (gs, norm) = closed(params, grads, &self.zero)?;
        let f = clip_factor(norm, self.clip);
        let mu = self.momentum;
        for (name, g) in gs {
            let w = params.get(&name).expect("a gradient's parameter").clone();
            let at = g.placement().clone();
            let ws = if w.placement().equal(&at) { w.clone() } else { w.place(&at)? };
            // the momentum and the weight in one pass: loads w, g and (after the first step) b
            let state = self.state.remove(&name);
            let mut out = match &state {
                Some(b) => ws.map_many(&[&g, b], false, |p, l| {
                    let (m, ff, k) = (p.float(mu), p.float(f), p.float(lr));
                    let x = p.mul(m, l[2]);
                    let y = p.mul(ff, l[1]);
                    let b = p.add(x, y);
                    let s = p.mul(k, b);
                    vec![p.sub(l[0], s), b]
                })?,
                None => ws.map_many(&[&g], false, |p, l| {
                    let (ff, k) = (p.float(f), p.float(lr));
                    let b = p.mul(l[1], ff);
                    let s = p.mul(k, b);
                    vec![p.sub(l[0], s), b]
                })?,
            };
            let (b, nw) = (out.pop().expect("two"), out.pop().expect("two"));
            let nw = if nw.placement().equal(w.placement()) { nw } else { nw.place(w.placement())? };
            params.set(&name, nw)?;
            self.state.insert(name, b);
        }
        Ok(norm)
    }
}

/// The learning rate at `step`: linear warmup from 0 to `peak` over `warmup` steps, then a
/// cosine decay to `floor` at `total` (and `floor` after).
pub fn warmup_cosine(step: usize, warmup: usize, total: usize, peak: f64, floor: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    if step >= total {
        return floor;
    }
    let p = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * p).cos())
}
