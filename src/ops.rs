//! `Tensor` ops along an axis: scans, sorts, gathers and scatters, concatenation and stacking,
//! softmax (attention is in `attention.rs`). Each runs on each rank's window where the placement
//! leaves the axis whole (an axis cut over mesh axes is an error naming the placement: place it
//! whole first).
//!
//! | op | operands | result |
//! |---|---|---|
//! | `cumsum(axis)` | axis whole; partial allowed (linear) | the same placement |
//! | `sort`, `argsort`, `topk` | axis whole, not partial | the same placement (`topk`: the axis of extent k) |
//! | `gather(axis, index)` | `self`'s axis whole; `index` (`i64`, not partial) over the same mesh | `self`'s cuts on its other axes, `index`'s on the axes replacing `axis`; partial as `self` |
//! | `scatter_add(axis, index, n)` | `index` 1-D, cut as `self`'s `axis` | the axis of extent n, whole; a sum over the mesh axes that cut it (each rank adds its rows: data parallelism's gradient), and over `self`'s sums |
//! | `concat`, `stack` | placed alike, axis whole | the same placement (`stack`: the new axis whole) |
//! | `softmax`, `log_softmax` | axis whole, not partial | the same placement |
//! | `pad(lo, hi, fill)` | padded axes whole; partial only with fill 0 (linear) | the same placement |

use nx_collectives::Reducible;
use nx_kernels::prog::{Prog, UnOp};
use nx_kernels::{Array, Kernels, Move, Operand, Reduction, Scatter};

use crate::tensor::{check, err, window_shape};
use nx_placement::rules;

use crate::{Placement, Result, Tensor};

impl<'d, T: Reducible> Tensor<'d, T> {
    fn axis_of(&self, func: &'static str, axis: usize) -> Result<()> {
        if axis >= self.shape.len() {
            return Err(err(func, format!("axis {axis} of a value of shape {:?}", self.shape)));
        }
        Ok(())
    }

    /// An error unless `axis` is an axis of the shape that the placement leaves whole (and, unless
    /// `partial_ok`, the value is not a sum).
    pub(crate) fn whole(&self, func: &'static str, axis: usize, partial_ok: bool) -> Result<()> {
        self.axis_of(func, axis)?;
        rules::along(func, &self.placement, &[axis], partial_ok)?;
        Ok(())
    }

    /// The inclusive cumulative sum along `axis` (a scan in the carrier, see the host library's
    /// docs for its association and bound).
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// let x = nx::Tensor::<f32>::from_fn(ctx, &[2, 3], &p, |i| (i[1] + 1) as f32)?;
    /// assert_eq!(x.cumsum(1)?.full()?.to_vec()?, [1.0, 3.0, 6.0, 1.0, 3.0, 6.0]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// An axis past the rank or cut by the placement.
    pub fn cumsum(&self, axis: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::cumsum";
        self.whole(FUNC, axis, true)?;
        let local = match &self.local {
            Some(a) => {
                let dst = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                check(FUNC, self.ctx.host().scan(Reduction::Sum, axis, None, &[&dst], a), &[a])?;
                Some(dst)
            }
            None => None,
        };
        Ok(self.with_local(self.placement.clone(), self.shape.clone(), local))
    }

    /// The running maximum along `axis` and the position of its first occurrence (of the first
    /// NaN once one is met; −0 below +0), as `torch.cummax`.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// let x = nx::Tensor::<f32>::from_fn(ctx, &[2, 4], &p, |i| [1.0, 3.0, 2.0, 3.0][i[1]])?;
    /// let (v, at) = x.cummax(1)?;
    /// assert_eq!(v.full()?.to_vec()?, [1.0, 3.0, 3.0, 3.0, 1.0, 3.0, 3.0, 3.0]);
    /// assert_eq!(at.full()?.to_vec()?, [0, 1, 1, 1, 0, 1, 1, 1]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// An axis past the rank or cut by the placement; a partial value (place it closed first);
    /// complex values (no order).
    pub fn cummax(&self, axis: usize) -> Result<(Self, Tensor<'d, i64>)> {
        self.running("nx::Tensor::cummax", nx_kernels::Extreme::Max, axis)
    }

    /// The running minimum along `axis` and the position of its first occurrence, as
    /// `torch.cummin`.
    ///
    /// # Errors
    /// As [`Tensor::cummax`].
    pub fn cummin(&self, axis: usize) -> Result<(Self, Tensor<'d, i64>)> {
        self.running("nx::Tensor::cummin", nx_kernels::Extreme::Min, axis)
    }

    fn running(&self, func: &'static str, e: nx_kernels::Extreme, axis: usize) -> Result<(Self, Tensor<'d, i64>)> {
        self.whole(func, axis, false)?;
        let (values, positions) = match &self.local {
            Some(a) => {
                let v = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                let p = Array::<i64>::uninit_on(self.ctx.rig(), a.shape())?;
                check(func, self.ctx.host().scan(Reduction::Arg(e), axis, None, &[&v, &p], a), &[a])?;
                (Some(v), Some(p))
            }
            None => (None, None),
        };
        let positions = Tensor {
            ctx: self.ctx.clone(),
            placement: self.placement.clone(),
            shape: self.shape.clone(),
            local: positions,
        };
        Ok((self.with_local(self.placement.clone(), self.shape.clone(), values), positions))
    }

    /// `log Σ exp` of each prefix along `axis` (`torch.logcumsumexp`): −∞ while every term so
    /// far is −∞, +∞ from a +∞ term, NaN from a NaN (see the host library's docs for the
    /// association and bound).
    ///
    /// # Errors
    /// An axis past the rank or cut by the placement; a partial value; values that are not real
    /// floats.
    pub fn logcumsumexp(&self, axis: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::logcumsumexp";
        self.whole(FUNC, axis, false)?;
        let local = match &self.local {
            Some(a) => {
                let dst = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                check(FUNC, self.ctx.host().scan(Reduction::Logsumexp, axis, None, &[&dst], a), &[a])?;
                Some(dst)
            }
            None => None,
        };
        Ok(self.with_local(self.placement.clone(), self.shape.clone(), local))
    }

    /// The first `k` of each lane along `axis` in stable sorted order (ascending, or
    /// `descending`; NaNs greatest, −0 below +0), with their positions along the axis.
    fn sorted(&self, func: &'static str, axis: usize, descending: bool, k: usize) -> Result<(Self, Tensor<'d, i64>)> {
        self.whole(func, axis, false)?;
        if k > self.shape[axis] {
            return Err(err(func, format!("k = {k} past axis {axis} of extent {}", self.shape[axis])));
        }
        let mut shape = self.shape.clone();
        shape[axis] = k;
        let (values, positions) = match &self.local {
            Some(a) => {
                let mut s = a.shape().to_vec();
                s[axis] = k;
                let v = Array::<T>::uninit_on(self.ctx.rig(), &s)?;
                let p = Array::<i64>::uninit_on(self.ctx.rig(), &s)?;
                check(func, self.ctx.host().sort(axis, descending, Some(&v), Some(&p), a), &[a])?;
                (Some(v), Some(p))
            }
            None => (None, None),
        };
        let pos =
            Tensor { ctx: self.ctx.clone(), shape: shape.clone(), placement: self.placement.clone(), local: positions };
        Ok((self.with_local(self.placement.clone(), shape, values), pos))
    }

    /// The values along `axis` sorted stably (ascending, or `descending`; NaNs greatest, −0 below
    /// +0).
    ///
    /// # Errors
    /// An axis past the rank or cut by the placement; a partial value.
    pub fn sort(&self, axis: usize, descending: bool) -> Result<Self> {
        self.axis_of("nx::Tensor::sort", axis)?;
        Ok(self.sorted("nx::Tensor::sort", axis, descending, self.shape[axis])?.0)
    }

    /// The positions a stable sort along `axis` puts in order (argsort).
    ///
    /// # Errors
    /// As [`Tensor::sort`].
    pub fn argsort(&self, axis: usize, descending: bool) -> Result<Tensor<'d, i64>> {
        self.axis_of("nx::Tensor::argsort", axis)?;
        Ok(self.sorted("nx::Tensor::argsort", axis, descending, self.shape[axis])?.1)
    }

    /// The `k` greatest values along `axis`, greatest first (ties in order of position), and
    /// their positions: the prefix of a stable descending sort.
    ///
    /// # Errors
    /// As [`Tensor::sort`]; `k` past the axis.
    pub fn topk(&self, k: usize, axis: usize) -> Result<(Self, Tensor<'d, i64>)> {
        self.sorted("nx::Tensor::topk", axis, true, k)
    }

    /// `self`'s elements at positions `index` along `axis`: the result has `self`'s shape with
    /// `axis` replaced by `index`'s shape (numpy's `take`; `index_select` for a 1-D index, an
    /// embedding lookup for a table and token ids). An index outside the axis is an error.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// // a replicated table [4, 2], token ids [3] split over the devices: rows split alike
    /// let on = nx::Placement::on(ctx.devices());
    /// let table = nx::Tensor::<f32>::from_fn(ctx, &[4, 2], &on, |i| (10 * i[0] + i[1]) as f32)?;
    /// let ids = nx::Tensor::<i64>::from_fn(ctx, &[3], &nx::Placement::split(0, ctx.devices())?, |i| [3, 0, 3][i[0]])?;
    /// let rows = table.gather(0, &ids)?;
    /// assert_eq!(rows.full()?.to_vec()?, [30.0, 31.0, 0.0, 1.0, 30.0, 31.0]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// `axis` past the rank or cut; `index` partial, over another mesh, or cut over a mesh axis
    /// that also cuts another of `self`'s axes; an index outside the axis.
    pub fn gather(&self, axis: usize, index: &Tensor<'d, i64>) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::gather";
        self.whole(FUNC, axis, true)?;
        if index.placement.is_partial() {
            return Err(err(FUNC, format!("the index is a sum of terms ({})", index.placement)));
        }
        let ir = index.shape.len();
        let placement = self.combined(FUNC, axis, index)?;
        let mut shape = self.shape[..axis].to_vec();
        shape.extend(&index.shape);
        shape.extend(&self.shape[axis + 1..]);
        let local = match (&self.local, &index.local) {
            (Some(a), Some(i)) => {
                let mut s = a.shape()[..axis].to_vec();
                s.extend(i.shape());
                s.extend(&a.shape()[axis + 1..]);
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &s)?;
                check(FUNC, self.ctx.host().gather(axis, &dst, a, i), &[a, i])?;
                Some(dst)
            }
            _ => None,
        };
        let _ = ir;
        Ok(self.with_local(placement, shape, local))
    }

    /// [`Tensor::gather`] of a 1-D index.
    ///
    /// # Errors
    /// As [`Tensor::gather`]; an index that is not 1-D.
    pub fn index_select(&self, axis: usize, index: &Tensor<'d, i64>) -> Result<Self> {
        if index.shape.len() != 1 {
            return Err(err("nx::Tensor::index_select", format!("the index has shape {:?}, not 1-D", index.shape)));
        }
        self.gather(axis, index)
    }

    /// The placement of a gather of `self` along `axis` by `index` ([`rules::gather`]).
    fn combined(&self, func: &'static str, axis: usize, index: &Tensor<'d, i64>) -> Result<Placement<'d>> {
        Ok(rules::gather(func, &self.placement, axis, &index.placement, index.shape.len())?)
    }

    /// `n` rows along `axis`, zeros, to which each row `t` of `self` along `axis` is added at
    /// row `index[t]` (duplicates in order of `t`, deterministic): the gradient of a gather.
    /// Where `index` and `self`'s axis are cut (data parallelism), each rank adds its rows and the
    /// result is a sum over the mesh axes that cut them, closed by [`Tensor::place`].
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// let g = nx::Tensor::<f32>::from_fn(ctx, &[3, 2], &p, |i| (i[0] + 1) as f32)?;
    /// let ids = nx::Tensor::<i64>::from_fn(ctx, &[3], &p, |i| [1, 0, 1][i[0]])?;
    /// let grad = g.scatter_add(0, &ids, 2)?;
    /// assert!(grad.placement().is_partial());
    /// assert_eq!(grad.full()?.to_vec()?, [2.0, 2.0, 4.0, 4.0]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// `axis` past the rank; `index` not 1-D, partial, or not of `self`'s axis's extent and cut; an
    /// index outside `0..n`.
    pub fn scatter_add(&self, axis: usize, index: &Tensor<'d, i64>, n: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::scatter_add";
        self.axis_of(FUNC, axis)?;
        if index.shape != [self.shape[axis]] || index.placement.is_partial() {
            return Err(err(
                FUNC,
                format!(
                    "the index {:?} at {} must be 1-D of axis {axis}'s extent {}, not partial",
                    index.shape, index.placement, self.shape[axis]
                ),
            ));
        }
        let placement = rules::scatter(FUNC, &self.placement, axis, &index.placement)?;
        let mut shape = self.shape.clone();
        shape[axis] = n;
        let local = match (&self.local, &index.local) {
            (Some(a), Some(i)) => {
                let mut s = a.shape().to_vec();
                s[axis] = n;
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &s)?;
                check(FUNC, self.ctx.host().scatter(Scatter::Add, axis, &dst, None, a, i), &[a, i])?;
                Some(dst)
            }
            _ => None,
        };
        // a device whose term is not 0 of a partial target still holds a window of it
        let local = match (local, placement.window(&shape, self.ctx.index())?) {
            (Some(l), _) => Some(l),
            (None, Some(w)) => Some(Array::<T>::zeros_on(self.ctx.rig(), &window_shape(&w))?),
            (None, None) => None,
        };
        Ok(self.with_local(placement, shape, local))
    }

    /// `self` and `others` end to end along `axis` (placed alike, the axis whole).
    ///
    /// # Errors
    /// Operands placed differently or of shapes that differ off `axis`; `axis` past the rank or
    /// cut.
    pub fn concat(&self, others: &[&Tensor<'d, T>], axis: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::concat";
        self.joined(FUNC, others, axis, false)
    }

    /// `self` and `others` (of one shape, placed alike) stacked along a new axis `axis` (whole).
    ///
    /// # Errors
    /// Operands placed differently or of other shapes; `axis` past the rank.
    pub fn stack(&self, others: &[&Tensor<'d, T>], axis: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::stack";
        self.joined(FUNC, others, axis, true)
    }

    fn joined(&self, func: &'static str, others: &[&Tensor<'d, T>], axis: usize, new: bool) -> Result<Self> {
        let all: Vec<&Tensor<'d, T>> = std::iter::once(self).chain(others.iter().copied()).collect();
        if new {
            if axis > self.shape.len() {
                return Err(err(func, format!("axis {axis} past a result of rank {}", self.shape.len() + 1)));
            }
        } else {
            self.whole(func, axis, true)?;
        }
        for t in &all[1..] {
            if !t.placement.equal(&self.placement) {
                return Err(err(func, format!("operands at {} and {}: place one first", self.placement, t.placement)));
            }
            let same = t.shape.len() == self.shape.len()
                && (0..self.shape.len()).all(|d| (d == axis && !new) || t.shape[d] == self.shape[d]);
            if !same {
                return Err(err(
                    func,
                    format!("shapes {:?} and {:?} do not join along axis {axis}", self.shape, t.shape),
                ));
            }
        }
        // the result's placement: the same cuts, shifted past a new axis
        let placement = if new { rules::insert_axis(func, &self.placement, axis)? } else { self.placement.clone() };
        let mut shape = self.shape.clone();
        if new {
            shape.insert(axis, all.len());
        } else {
            shape[axis] = all.iter().map(|t| t.shape[axis]).sum();
        }
        let local = match &self.local {
            Some(a) => {
                // stacked pieces are views with the new axis of extent 1
                let pieces: Vec<Array<T>> = all
                    .iter()
                    .map(|t| {
                        let l = t.local.as_ref().expect("operands placed alike hold windows alike");
                        if new {
                            let mut s = l.shape().to_vec();
                            s.insert(axis, 1);
                            Ok(l.apply(&Move::Reshape(s))?.expect("inserting an axis of 1 is a view"))
                        } else {
                            Ok(l.clone())
                        }
                    })
                    .collect::<Result<_>>()?;
                let mut s = a.shape().to_vec();
                if new {
                    s.insert(axis, all.len());
                } else {
                    s[axis] = pieces.iter().map(|p| p.shape()[axis]).sum();
                }
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &s)?;
                let mut at = 0;
                let offsets: Vec<Vec<usize>> = pieces
                    .iter()
                    .map(|p| {
                        let mut o = vec![0; s.len()];
                        o[axis] = at;
                        at += p.shape()[axis];
                        o
                    })
                    .collect();
                let list: Vec<(&[usize], &dyn Operand)> =
                    offsets.iter().zip(&pieces).map(|(o, p)| (o.as_slice(), p as &dyn Operand)).collect();
                let ops: Vec<&dyn Operand> = pieces.iter().map(|p| p as &dyn Operand).collect();
                check(func, self.ctx.host().assemble(&dst, &list), &ops)?;
                Some(dst)
            }
            None => None,
        };
        Ok(self.with_local(placement, shape, local))
    }

    /// `exp(x − logsumexp(x))` along `axis`.
    ///
    /// # Errors
    /// As [`Tensor::log_softmax`].
    pub fn softmax(&self, axis: usize) -> Result<Self> {
        self.normalized("nx::Tensor::softmax", axis, true)
    }

    /// `x − logsumexp(x)` along `axis` (the log-sum-exp a reduction, see the host library's
    /// bound).
    ///
    /// # Errors
    /// An axis past the rank or cut; a partial value (softmax is not linear).
    pub fn log_softmax(&self, axis: usize) -> Result<Self> {
        self.normalized("nx::Tensor::log_softmax", axis, false)
    }

    fn normalized(&self, func: &'static str, axis: usize, exp: bool) -> Result<Self> {
        self.whole(func, axis, false)?;
        let local = match &self.local {
            Some(a) => {
                let mut keep = a.shape().to_vec();
                keep[axis] = 1;
                let mut less = a.shape().to_vec();
                less.remove(axis);
                let lse = Array::<T>::uninit_on(self.ctx.rig(), &less)?;
                let mut p = Prog::new(&[T::DTYPE]);
                let l = p.load(0);
                p.output(l);
                check(
                    func,
                    self.ctx.host().reduce(&p, a.shape(), &[axis], &[Reduction::Logsumexp], &[&lse], &[a]),
                    &[a],
                )?;
                let lse = lse.apply(&Move::Reshape(keep))?.expect("inserting an axis of 1 is a view");
                let mut p = Prog::new(&[T::DTYPE, T::DTYPE]);
                let (x, m) = (p.load(0), p.load(1));
                let d = p.sub(x, m);
                let out = if exp { p.unary(UnOp::Exp, d) } else { d };
                p.output(out);
                let dst = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                check(func, self.ctx.host().map(&p, a.shape(), &[&dst], &[a, &lse]), &[a, &lse])?;
                Some(dst)
            }
            None => None,
        };
        Ok(self.with_local(self.placement.clone(), self.shape.clone(), local))
    }

    /// `self` with `lo[i]` elements of `fill` before axis i and `hi[i]` after (a negative count
    /// crops).
    ///
    /// # Errors
    /// Lists of another length than the rank; a padded or cropped axis cut by the placement; a
    /// partial value padded with a fill other than 0; a crop past an axis.
    pub fn pad(&self, lo: &[isize], hi: &[isize], fill: f64) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::pad";
        let pad = nx_kernels::Pad::edges(lo, hi);
        let shape = pad.shape(&self.shape).map_err(|why| err(FUNC, why))?;
        if self.placement.is_partial() && fill != 0.0 {
            return Err(err(
                FUNC,
                format!("{} is a sum of terms: a fill of {fill} would be added once per term", self.placement),
            ));
        }
        for d in 0..self.shape.len() {
            if lo[d] != 0 || hi[d] != 0 {
                self.whole(FUNC, d, true)?;
            }
        }
        let local = match &self.local {
            Some(a) => {
                let s = pad.shape(a.shape()).map_err(|why| err(FUNC, why))?;
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &s)?;
                check(FUNC, self.ctx.host().pad(&pad, nx_kernels::Value::Float(fill), &dst, a), &[a])?;
                Some(dst)
            }
            None => None,
        };
        Ok(self.with_local(self.placement.clone(), shape, local))
    }
}
