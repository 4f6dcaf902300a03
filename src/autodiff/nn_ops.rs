//! The differentiable ops of neural networks over placements: norms, embedding lookups,
//! vocabulary-parallel cross-entropy, attention and dropout.

use nx_collectives::{ReduceOp, Reducible};
use nx_kernels::{Array, Value};
use nx_placement::rules;

use super::ops::{fit, keep};
use super::Var;
use crate::tensor::{err, window_shape};
use crate::{uniform, Placement, Result, Tensor};

/// Dropout's settings: the probability of zeroing an element and the seed of its mask. The mask
/// of element `i` is `uniform(seed, i) < p` (the flat global index), so it is the same for every
/// mesh and placement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// The probability of zeroing an element, in [0, 1).
    pub p: f64,
    /// The seed (one per use and step).
    pub seed: u64,
}

/// `x` as an `f64` (floats widen exactly).
fn to_f64<T: Reducible>(x: T) -> f64 {
    match x.to_value() {
        Value::Float(v) => v,
        Value::Int(i) => i as f64,
        Value::Bool(b) => f64::from(u8::from(b)),
        Value::Complex(c) => c.re,
    }
}

/// Agrees across every rank whether any rank found a bad value (`(position, value)` in its
/// window of `t`), by one all-gather of a pair a rank; every rank then answers the same error,
/// naming the first such rank, or none.
fn agree(func: &'static str, t: &Tensor<'_, i64>, bad: Option<(usize, i64)>, why: &str, what: &str) -> Result<()> {
    let ctx = &t.ctx;
    let rows = Placement::split(0, ctx.devices())?;
    let n = ctx.devices().len();
    let (k, v) = bad.map(|(k, v)| (k as i64, v)).unwrap_or((-1, 0));
    let local = Array::from_vec_on(ctx.rig(), &[1, 2], vec![k, v])?;
    let all = Tensor::from_local(ctx, &[n, 2], &rows, Some(local))?.full()?.to_vec()?;
    if ctx.rig().is_dry() {
        return Ok(()); // the values of a dry run are unspecified: its collective alone is real
    }
    match all.chunks(2).enumerate().find(|(_, p)| p[0] >= 0) {
        Some((d, p)) => Err(err(
            func,
            format!("{what} {} at position {} of device {d}'s window of the {what}s is {why}", p[1], p[0]),
        )),
        None => Ok(()),
    }
}

/// `a`, or a C-ordered copy of it where it is not contiguous.
fn contiguous<T: Reducible>(a: &Array<T>) -> Result<Array<T>> {
    Ok(if a.layout().is_contiguous() { a.clone() } else { a.copy()? })
}

/// Rows of a parallel task in [`by_rows`] and [`by_columns`]: about 4096 elements.
fn rows_a_task(d: usize) -> usize {
    (4096 / d.max(1)).max(1)
}

/// Runs `f(i, src row i, dst row i, state i)` for each row of `d` elements of `src` and `dst`
/// (`state` one entry a row), tasks of whole rows in parallel on `host`'s pool.
fn by_rows<T: Sync, U: Send, S: Send>(
    host: &nx_kernels::Host,
    d: usize,
    src: &[T],
    dst: &mut [U],
    state: &mut [S],
    f: impl Fn(usize, &[T], &mut [U], &mut S) + Sync,
) {
    use rayon::prelude::*;
    let (rows, d) = (state.len(), d.max(1));
    let per = rows_a_task(d);
    host.install(|| {
        src[..rows * d]
            .par_chunks(per * d)
            .zip(dst[..rows * d].par_chunks_mut(per * d))
            .zip(state.par_chunks_mut(per))
            .enumerate()
            .for_each(|(k, ((s, o), st))| {
                for (j, ((s, o), st)) in s.chunks_exact(d).zip(o.chunks_exact_mut(d)).zip(st).enumerate() {
                    f(k * per + j, s, o, st);
                }
            })
    })
}

/// Layer norm's parameter gradients: `dg[j] += Σ dy[i, j]·x̂[i, j]` and `db[j] += Σ dy[i, j]` over
/// the rows `i` in row order (`x̂ = (x − mean)·(1/σ)` from each row's `stats`), blocks of columns
/// in parallel on `host`'s pool (so each column's sum keeps its order).
fn by_columns<T: Reducible>(
    host: &nx_kernels::Host,
    d: usize,
    xs: &[T],
    dys: &[T],
    stats: &[(f64, f64)],
    dg: &mut [f64],
    db: &mut [f64],
) {
    use rayon::prelude::*;
    const COLUMNS: usize = 32;
    host.install(|| {
        dg.par_chunks_mut(COLUMNS).zip(db.par_chunks_mut(COLUMNS)).enumerate().for_each(|(k, (dg, db))| {
            let c0 = k * COLUMNS;
            for (i, &(mu, rstd)) in stats.iter().enumerate() {
                let (xr, dyr) = (&xs[i * d + c0..][..dg.len()], &dys[i * d + c0..][..dg.len()]);
                for (((g, b), &x), &dy) in dg.iter_mut().zip(db.iter_mut()).zip(xr).zip(dyr) {
                    let dy = to_f64(dy);
                    *g += dy * ((to_f64(x) - mu) * rstd);
                    *b += dy;
                }
            }
        })
    })
}

/// This rank's whole window of a value with copies, as `f64`s.
fn local_f64<T: Reducible>(t: &Tensor<'_, T>) -> Result<Vec<f64>> {
    Ok(t.local.as_ref().map(|a| a.to_vec()).transpose()?.unwrap_or_default().into_iter().map(to_f64).collect())
}

/// The mesh-axis names cutting `axis` of `p` (empty where whole).
fn cut_names(func: &'static str, p: &Placement<'_>, axis: usize) -> Result<Vec<String>> {
    Ok(rules::parts(func, p)?.cut_of(axis))
}

/// The start of this rank's window along `axis` (0 where it holds none).
fn window_start<T: Reducible>(t: &Tensor<'_, T>, axis: usize) -> Result<usize> {
    Ok(t.placement.window(&t.shape, t.ctx.index())?.map(|w| w[axis].start).unwrap_or(0))
}

impl<'d, T: Reducible> Var<'d, T> {
    /// Layer normalisation over the last axis (whole on the placement):
    /// `(x − mean)/√(var + eps) · gamma + beta`, `var` the biased variance, each row's moments
    /// in `f64` (two passes). One fused op forward and backward: `dx = rstd·(dx̂ − mean(dx̂) −
    /// x̂·mean(dx̂·x̂))` with `dx̂ = dy·gamma`; `dgamma = Σ dy·x̂` and `dbeta = Σ dy` over each rank's
    /// rows, in row order, a sum over the mesh axes that cut the rows.
    ///
    /// # Errors
    /// A scalar; a last axis cut; a partial value; `gamma`/`beta` not `[d]` with copies.
    pub fn layer_norm(&self, gamma: &Var<'d, T>, beta: &Var<'d, T>, eps: f64) -> Result<Self> {
        const FUNC: &str = "nx::autodiff::Var::layer_norm";
        self.check_tape(FUNC, gamma)?;
        self.check_tape(FUNC, beta)?;
        let x = &self.value;
        let r = x.shape.len();
        if r == 0 {
            return Err(err(FUNC, "a scalar has no axis to normalise".into()));
        }
        x.whole(FUNC, r - 1, false)?;
        rules::parts(FUNC, &x.placement)?;
        let d = x.shape[r - 1];
        for (what, p) in [("gamma", &gamma.value), ("beta", &beta.value)] {
            if p.shape != [d] || p.placement.is_partial() || !rules::parts(FUNC, &p.placement)?.cuts.is_empty() {
                return Err(err(FUNC, format!("{what} is {:?} at {}: needs [{d}] with copies", p.shape, p.placement)));
            }
        }
        let (gv, bv) = (local_f64(&gamma.value)?, local_f64(&beta.value)?);
        // the mean and 1/σ of each row, kept for the backward (which recomputes x̂ from them)
        // a dry run's values are unspecified: its rows are not computed
        let dry = x.ctx.rig().is_dry();
        let (stats, local) = match &x.local {
            Some(a) if dry => (Vec::new(), Some(Array::uninit_on(x.ctx.rig(), a.shape())?)),
            Some(a) => {
                let a = contiguous(a)?;
                let rows = a.layout().numel().checked_div(d).unwrap_or(0);
                let mut stats = vec![(0.0, 0.0); rows];
                let out = Array::<T>::uninit_on(x.ctx.rig(), a.shape())?;
                a.with_slice(|xs| {
                    out.with_slice_mut(|os| {
                        by_rows(x.ctx.host(), d, xs, os, &mut stats, |_, row, o, st| {
                            let mu = row.iter().map(|&v| to_f64(v)).sum::<f64>() / d as f64;
                            let var = row.iter().map(|&v| (to_f64(v) - mu) * (to_f64(v) - mu)).sum::<f64>() / d as f64;
                            let rstd = 1.0 / (var + eps).sqrt();
                            for ((o, &v), (g, b)) in o.iter_mut().zip(row).zip(gv.iter().zip(&bv)) {
                                *o = crate::from_f64::<T>((to_f64(v) - mu) * rstd * g + b);
                            }
                            *st = (mu, rstd);
                        })
                    })
                })??;
                (stats, Some(out))
            }
            None => (Vec::new(), None),
        };
        let out = x.with_local(x.placement.clone(), x.shape.clone(), local);
        let xc = x.clone();
        Ok(self.tape.record(out, &[self, gamma, beta], move |g| {
            let g = fit(g, &xc.placement)?;
            let mut dg = vec![0.0; d];
            let mut db = vec![0.0; d];
            let local = match (&g.local, &xc.local) {
                (Some(a), _) if dry => Some(Array::uninit_on(xc.ctx.rig(), a.shape())?),
                (Some(a), Some(xa)) => {
                    let (dy, xa) = (contiguous(a)?, contiguous(xa)?);
                    let dx = Array::<T>::uninit_on(xc.ctx.rig(), a.shape())?;
                    let host = xc.ctx.host();
                    xa.with_slice(|xs| {
                        dy.with_slice(|dys| {
                            // each row's dx from its own x̂ (x̂ = (x − mean)·(1/σ), as forward)
                            dx.with_slice_mut(|dxs| {
                                // no state a row to write: a zero-sized slot for each
                                by_rows(host, d, dys, dxs, &mut vec![(); stats.len()], |i, dyr, o, _| {
                                    let ((mu, rstd), xr) = (stats[i], &xs[i * d..(i + 1) * d]);
                                    let (mut m1, mut m2) = (0.0, 0.0);
                                    for ((&dv, &v), g) in dyr.iter().zip(xr).zip(&gv) {
                                        let dh = to_f64(dv) * g;
                                        m1 += dh;
                                        m2 += dh * ((to_f64(v) - mu) * rstd);
                                    }
                                    let (m1, m2) = (m1 / d as f64, m2 / d as f64);
                                    for ((o, (&dv, &v)), g) in o.iter_mut().zip(dyr.iter().zip(xr)).zip(&gv) {
                                        let (dh, h) = (to_f64(dv) * g, (to_f64(v) - mu) * rstd);
                                        *o = crate::from_f64::<T>(rstd * (dh - m1 - h * m2));
                                    }
                                })
                            })?;
                            // dgamma and dbeta: each column's sum over the rows in row order,
                            // columns in parallel
                            by_columns(host, d, xs, dys, &stats, &mut dg, &mut db);
                            Ok::<_, nx_kernels::Error>(())
                        })
                    })???;
                    Some(dx)
                }
                _ => None,
            };
            let gx = xc.with_local(xc.placement.clone(), xc.shape.clone(), local);
            // the parameters' gradients: each rank's rows, a sum over the mesh axes cutting them
            let lead: Vec<usize> = (0..r - 1).collect();
            let rows_p = rules::reduce(FUNC, &xc.placement, &lead)?;
            let pp = rules::parts(FUNC, &rows_p)?;
            let at = rules::rebuild(&xc.placement, &rules::Parts { cuts: Vec::new(), sums: pp.sums })?;
            let held = xc.local.is_some();
            let vec_of = |v: Vec<f64>| -> Result<Tensor<'d, T>> {
                let a = if held {
                    Some(Array::from_vec_on(xc.ctx.rig(), &[d], v.into_iter().map(crate::from_f64::<T>).collect())?)
                } else {
                    Some(Array::zeros_on(xc.ctx.rig(), &[d])?)
                };
                Tensor::from_local(&xc.ctx, &[d], &at, a)
            };
            Ok(vec![Some(gx), Some(vec_of(dg)?), Some(vec_of(db)?)])
        }))
    }

    /// RMS normalisation over the last axis: `x/√(mean(x²) + eps) · gamma`.
    ///
    /// # Errors
    /// As [`Var::layer_norm`].
    pub fn rms_norm(&self, gamma: &Var<'d, T>, eps: f64) -> Result<Self> {
        let r = self.shape().len();
        if r == 0 {
            return Err(err("nx::autodiff::Var::rms_norm", "a scalar has no axis to normalise".into()));
        }
        self.value.whole("nx::autodiff::Var::rms_norm", r - 1, false)?;
        let ks = keep(&self.shape()[..r - 1], r - 1);
        let ms = self.square()?.mean(r - 1)?.reshape(&ks)?;
        self.mul(&ms.add_scalar(eps)?.rsqrt()?)?.mul(gamma)
    }

    /// Elements zeroed with probability `d.p`, the others scaled by `1/(1 − p)`; the identity
    /// where `p` is 0.
    ///
    /// # Errors
    /// A `p` outside [0, 1); a partial value.
    pub fn dropout(&self, d: Dropout) -> Result<Self> {
        if !(0.0..1.0).contains(&d.p) {
            return Err(err("nx::autodiff::Var::dropout", format!("p = {} is not in [0, 1)", d.p)));
        }
        if d.p == 0.0 {
            return Ok(self.clone());
        }
        let keep_scale = 1.0 / (1.0 - d.p);
        let strides: Vec<usize> = (0..self.shape().len()).map(|i| self.shape()[i + 1..].iter().product()).collect();
        let mask = Tensor::<T>::from_fn(&self.value.ctx, self.shape(), &self.placement().closed(), |i| {
            let flat: usize = i.iter().zip(&strides).map(|(a, b)| a * b).sum();
            crate::from_f64(if uniform(d.seed, flat as u64) < d.p { 0.0 } else { keep_scale })
        })?;
        self.mul(&self.tape.constant(mask))
    }

    /// The rows `ids` (`i64`, any shape) of the table `self` `[n, d]`: a result of shape
    /// `ids.shape + [d]`, cut on the leading axes as `ids` and on the last as the table's
    /// columns. Where the table's rows are cut over mesh axes (a vocabulary-parallel embedding),
    /// each rank looks up the ids in its rows, zeros elsewhere, and the result is a sum over those
    /// axes (closed by `place`, Megatron's all-reduce). The gradient is a scatter-add of the
    /// output's gradient into the table's rows, in index order (deterministic), a sum over the
    /// mesh axes cutting `ids`.
    ///
    /// # Errors
    /// A table not 2-D or partial; partial ids; ids and table over different meshes, or cut over
    /// a mesh axis that also cuts the table's rows; an id outside `0..n`.
    pub fn embedding(&self, ids: &Tensor<'d, i64>) -> Result<Self> {
        const FUNC: &str = "nx::autodiff::Var::embedding";
        let t = &self.value;
        if t.shape.len() != 2 || t.placement.is_partial() || ids.placement.is_partial() {
            return Err(err(
                FUNC,
                format!(
                    "needs a closed table [n, d] and closed ids, got {:?} at {} and ids at {}",
                    t.shape, t.placement, ids.placement
                ),
            ));
        }
        if !t.placement.mesh_of().same_axes(ids.placement.mesh_of()) {
            return Err(err(
                FUNC,
                format!("the table at {:#} and ids at {:#} are over different meshes", t.placement, ids.placement),
            ));
        }
        let (n, d) = (t.shape[0], t.shape[1]);
        let rows = cut_names(FUNC, &t.placement, 0)?;
        let cols = cut_names(FUNC, &t.placement, 1)?;
        let ip = rules::parts(FUNC, &ids.placement)?;
        if let Some(c) = ip.cuts.iter().flat_map(|c| &c.1).find(|c| rows.contains(c) || cols.contains(c)) {
            return Err(err(
                FUNC,
                format!("mesh axis {c:?} cuts both the ids ({}) and the table ({})", ids.placement, t.placement),
            ));
        }
        let mut cuts = ip.cuts.clone();
        if !cols.is_empty() {
            cuts.push((ids.shape.len(), cols));
        }
        let placement = rules::rebuild(&t.placement, &rules::Parts { cuts, sums: rows.clone() })?;
        let mut shape = ids.shape.clone();
        shape.push(d);
        let r0 = window_start(t, 0)?;
        // a dry run's ids are unspecified: not checked
        let dry = t.ctx.rig().is_dry();
        let bad = match &ids.local {
            Some(ix) if !dry => {
                ix.to_vec()?.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= n).map(|(k, &id)| (k, id))
            }
            _ => None,
        };
        agree(FUNC, ids, bad, &format!("outside 0..{n}"), "id")?;
        let local = match (&t.local, &ids.local, placement.window(&shape, t.ctx.index())?) {
            (Some(_), Some(_), Some(w)) if dry => Some(Array::uninit_on(t.ctx.rig(), &window_shape(&w))?),
            (Some(tab), Some(ix), Some(w)) => {
                let (tv, iv) = (tab.to_vec()?, ix.to_vec()?);
                let (tn, td) = (tab.shape()[0], tab.shape()[1]);
                let mut out = vec![T::default(); iv.len() * td];
                for (k, &id) in iv.iter().enumerate() {
                    if id < 0 || id as usize >= n {
                        continue; // refused on every rank below
                    }
                    let i = id as usize;
                    if (r0..r0 + tn).contains(&i) {
                        out[k * td..(k + 1) * td].copy_from_slice(&tv[(i - r0) * td..(i - r0 + 1) * td]);
                    }
                }
                Some(Array::from_vec_on(t.ctx.rig(), &window_shape(&w), out)?)
            }
            _ => None,
        };
        let out = t.with_local(placement.clone(), shape, local);
        let (table, ids) = (t.clone(), ids.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &placement)?;
            // each rank adds its positions' gradients into its rows, in position order
            let sums: Vec<String> = ip.cuts.iter().flat_map(|c| c.1.clone()).collect();
            let tp = rules::parts(FUNC, &table.placement)?;
            let gp = rules::rebuild(&table.placement, &rules::Parts { cuts: tp.cuts, sums })?;
            let local = match (&table.local, &ids.local, &g.local) {
                (Some(tab), Some(_), Some(_)) if dry => Some(Array::uninit_on(table.ctx.rig(), tab.shape())?),
                (Some(tab), Some(ix), Some(gl)) => {
                    let (iv, gv) = (ix.to_vec()?, gl.to_vec()?);
                    let (tn, td) = (tab.shape()[0], tab.shape()[1]);
                    // in the carrier, rounded once
                    let mut acc: Vec<T::Acc> = vec![T::default().widen(); tn * td];
                    for (k, &id) in iv.iter().enumerate() {
                        let i = id as usize;
                        if (r0..r0 + tn).contains(&i) {
                            let row = &mut acc[(i - r0) * td..(i - r0 + 1) * td];
                            for (a, &b) in row.iter_mut().zip(&gv[k * td..(k + 1) * td]) {
                                *a = T::combine(ReduceOp::Sum, *a, b.widen()).expect("floats sum");
                            }
                        }
                    }
                    let acc: Vec<T> = acc.into_iter().map(T::narrow).collect();
                    Some(Array::from_vec_on(table.ctx.rig(), tab.shape(), acc)?)
                }
                (Some(tab), _, _) => Some(Array::zeros_on(table.ctx.rig(), tab.shape())?),
                _ => None,
            };
            Ok(vec![Some(table.with_local(gp, table.shape.clone(), local))])
        }))
    }

    /// The mean cross-entropy of logits `self` `[…, c]` against class `labels` (`i64`, shape
    /// `[…]`, placed as the logits' leading axes): `mean(logsumexp(z) − z[label])` over the rows
    /// whose label is not negative (a negative label is ignored, as `torch`'s `ignore_index`), a
    /// scalar with copies on every device (0 where every label is ignored). The class axis may be cut (a vocabulary-parallel head): each rank
    /// reduces its classes, the maxima gathered and the sums and picked logits closed over the
    /// mesh axes that cut it — small collectives of one value a row; the logits are never gathered.
    ///
    /// # Errors
    /// Logits of rank 0 or partial; labels of another shape, placed otherwise, or outside `0..c`.
    pub fn cross_entropy(&self, labels: &Tensor<'d, i64>) -> Result<Self> {
        const FUNC: &str = "nx::autodiff::Var::cross_entropy";
        let z = &self.value;
        let r = z.shape.len();
        if r == 0 || z.placement.is_partial() || labels.shape != z.shape[..r - 1] {
            return Err(err(
                FUNC,
                format!(
                    "logits {:?} at {} and labels {:?}: needs closed logits [.., c] and labels [..]",
                    z.shape, z.placement, labels.shape
                ),
            ));
        }
        let c = z.shape[r - 1];
        let rows_p = rules::reduce(FUNC, &z.placement, &[r - 1])?.closed();
        if !labels.placement.equal(&rows_p) {
            return Err(err(FUNC, format!("labels at {} where the logits' rows lie at {rows_p}", labels.placement)));
        }
        // the maxima, closed across the class cut (stability only: no gradient)
        let m = z.max(r - 1)?;
        let ks = keep(&z.shape[..r - 1], r - 1);
        let m_k = m.reshape(&ks)?;
        let e = z.map(&[&m_k], false, |p, l| {
            let d = p.sub(l[0], l[1]);
            p.unary(nx_kernels::prog::UnOp::Exp, d)
        })?;
        let s = fit(e.sum(r - 1)?, &rows_p)?;
        // the logit of each row's label, from the rank holding its class
        let c0 = window_start(z, r - 1)?;
        let picked_p = rules::reduce(FUNC, &z.placement, &[r - 1])?;
        // a dry run's labels are unspecified: not checked
        let dry = z.ctx.rig().is_dry();
        let bad = match &labels.local {
            Some(ll) if !dry => ll.to_vec()?.iter().enumerate().find(|(_, &l)| l >= c as i64).map(|(k, &l)| (k, l)),
            _ => None,
        };
        agree(FUNC, labels, bad, &format!("outside 0..{c} (negative labels are ignored)"), "label")?;
        let picked_local = match (&z.local, &labels.local, picked_p.window(&labels.shape, z.ctx.index())?) {
            (Some(_), Some(_), Some(w)) if dry => Some(Array::uninit_on(z.ctx.rig(), &window_shape(&w))?),
            (Some(zl), Some(ll), Some(w)) => {
                let (zv, lv) = (zl.to_vec()?, ll.to_vec()?);
                let cl = zl.shape()[r - 1];
                let mut out = vec![T::default(); lv.len()];
                for (k, &lab) in lv.iter().enumerate() {
                    if lab < 0 {
                        continue;
                    }
                    if lab as usize >= c {
                        continue; // refused on every rank below
                    }
                    let j = lab as usize;
                    if (c0..c0 + cl).contains(&j) {
                        out[k] = zv[k * cl + j - c0];
                    }
                }
                Some(Array::from_vec_on(z.ctx.rig(), &window_shape(&w), out)?)
            }
            _ => None,
        };
        let picked = fit(z.with_local(picked_p, labels.shape.clone(), picked_local), &rows_p)?;
        // per-row loss ln s + m − picked, then the mean
        let lse = s.map(&[&m], false, |p, l| {
            let ls = p.unary(nx_kernels::prog::UnOp::Log, l[0]);
            p.add(ls, l[1])
        })?;
        let valid = Tensor::<T>::from_local(
            &z.ctx,
            &labels.shape,
            &rows_p,
            match &labels.local {
                Some(ll) => Some(Array::from_vec_on(
                    z.ctx.rig(),
                    ll.shape(),
                    ll.to_vec()?.iter().map(|&l| crate::from_f64(if l < 0 { 0.0 } else { 1.0 })).collect(),
                )?),
                None => None,
            },
        )?;
        let row_loss = lse.sub(&picked)?.mul(&valid)?;
        let on = Placement::mesh(z.placement.mesh_of(), &[])?;
        let all = |t: Tensor<'d, T>| -> Result<Tensor<'d, T>> {
            let mut t = t;
            while !t.shape.is_empty() {
                t = t.sum(t.shape.len() - 1)?;
            }
            fit(t, &on)
        };
        let count = all(valid)?;
        let count = count.to_local().map(|a| a.to_vec()).transpose()?.map(|v| to_f64(v[0])).unwrap_or(0.0);
        let rows = count.max(1.0);
        let loss = all(row_loss)?.scale(1.0 / rows)?;
        let (zc, lab, lse_k) = (z.clone(), labels.clone(), lse.reshape(&ks)?);
        Ok(self.tape.record(loss, &[self], move |g| {
            // d/dz = (softmax(z) − onehot(label)) · g / rows, on each rank's classes
            let g = fit(g, &on)?;
            let gs = g.to_local().map(|a| a.to_vec()).transpose()?.map(|v| v[0]).unwrap_or_default();
            let k = to_f64(gs) / rows;
            let soft = zc.map(&[&lse_k], false, |p, l| {
                let d = p.sub(l[0], l[1]);
                p.unary(nx_kernels::prog::UnOp::Exp, d)
            })?;
            let local = match (&soft.local, &lab.local) {
                (Some(sl), Some(_)) if dry => Some(Array::uninit_on(zc.ctx.rig(), sl.shape())?),
                (Some(sl), Some(ll)) => {
                    let (mut sv, lv) = (sl.to_vec()?, ll.to_vec()?);
                    let cl = sl.shape()[r - 1];
                    for (row, &l) in lv.iter().enumerate() {
                        if l < 0 {
                            sv[row * cl..(row + 1) * cl].fill(T::default());
                            continue;
                        }
                        let j = l as usize;
                        if (c0..c0 + cl).contains(&j) {
                            let x = &mut sv[row * cl + j - c0];
                            *x = crate::from_f64(to_f64(*x) - 1.0);
                        }
                    }
                    for x in &mut sv {
                        *x = crate::from_f64(to_f64(*x) * k);
                    }
                    Some(Array::from_vec_on(zc.ctx.rig(), sl.shape(), sv)?)
                }
                (None, None) => None,
                _ => return Err(err(FUNC, format!("rank {} holds logits and labels unlike", zc.ctx.rank()))),
            };
            Ok(vec![Some(zc.with_local(zc.placement.clone(), zc.shape.clone(), local))])
        }))
    }

    /// Causal (or not) scaled dot-product attention of `self` (queries `[b, h, t, d]`) against
    /// keys `k` and values `v` of that shape, heads possibly cut ([`Tensor::attention`], the
    /// host kernel's online softmax). The backward is one fused kernel on each rank's heads
    /// (FlashAttention-2's): the probabilities recomputed from `q`, `k` and the log-sum-exp the
    /// forward kept, no communication.
    ///
    /// # Errors
    /// As [`Tensor::attention`]; shapes other than `[b, h, t, d]` of one shape.
    pub fn attention(&self, k: &Var<'d, T>, v: &Var<'d, T>, causal: bool) -> Result<Self> {
        self.attention_in(k, v, causal, false)
    }

    /// [`Var::attention`] of operands `[b, t, h, d]` (FlashAttention's layout,
    /// [`Tensor::attention_thd`]): a projection's output reshaped, no permutes before or after,
    /// and none in the backward (the fused kernel reads and writes this layout in place).
    ///
    /// # Errors
    /// As [`Tensor::attention_thd`]; shapes other than `[b, t, h, d]` of one shape.
    pub fn attention_thd(&self, k: &Var<'d, T>, v: &Var<'d, T>, causal: bool) -> Result<Self> {
        self.attention_in(k, v, causal, true)
    }

    /// [`Var::attention_thd`] of the queries, keys and values packed in `self` `[b, t, 3, h, d]`
    /// ([`Tensor::attention_qkv`]: a fused projection's output reshaped); the output
    /// `[b, t, h, d]`. Its gradient is one value placed as `self`, the fused backward writing
    /// `dq`, `dk`, `dv` into its three entries.
    ///
    /// # Errors
    /// As [`Tensor::attention_qkv`]; shapes other than `[b, t, 3, h, d]`.
    pub fn attention_qkv(&self, causal: bool) -> Result<Self> {
        let x = &self.value;
        if x.shape.len() != 5 {
            return Err(err(
                "nx::autodiff::Var::attention_qkv",
                format!("a value {:?}: needs [b, t, 3, h, d]", x.shape),
            ));
        }
        let scale = 1.0 / (x.shape[4] as f64).sqrt();
        let (out, lse) = x.attention_qkv_saved(causal, Some(scale))?;
        let (x, o) = (x.clone(), out.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &o.placement)?;
            Ok(vec![Some(x.attention_qkv_grad(&o, lse.as_ref(), &g, causal, scale)?)])
        }))
    }

    fn attention_in(&self, k: &Var<'d, T>, v: &Var<'d, T>, causal: bool, thd: bool) -> Result<Self> {
        let func = if thd { "nx::autodiff::Var::attention_thd" } else { "nx::autodiff::Var::attention" };
        self.check_tape(func, k)?;
        self.check_tape(func, v)?;
        let (q, kk, vv) = (&self.value, &k.value, &v.value);
        if q.shape.len() != 4 || kk.shape != q.shape || vv.shape != q.shape {
            let axes = if thd { "[b, t, h, d]" } else { "[b, h, t, d]" };
            return Err(err(func, format!("q {:?}, k {:?}, v {:?}: needs {axes} alike", q.shape, kk.shape, vv.shape)));
        }
        let scale = 1.0 / (q.shape[3] as f64).sqrt();
        let (out, lse) = q.attention_saved(kk, vv, causal, Some(scale), thd)?;
        let (q, kk, vv, o) = (q.clone(), kk.clone(), vv.clone(), out.clone());
        Ok(self.tape.record(out, &[self, k, v], move |g| {
            // the fused backward: P recomputed from the forward's log-sum-exp, D = rowsum(dO ∘ O)
            let g = fit(g, &o.placement)?;
            let [dq, dk, dv] = q.attention_grad(&kk, &vv, &o, lse.as_ref(), &g, causal, scale, thd)?;
            Ok(vec![Some(dq), Some(dk), Some(dv)])
        }))
    }
}
