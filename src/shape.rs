//! `Tensor` ops on shapes and whole axes: reshape, permute, narrow, expand, max, mean, and maps
//! with a constant. Placements follow [`nx_placement::rules`]; none moves a byte between ranks
//! except [`Tensor::max`] over a cut axis (an all-gather of each rank's maxima).
//!
//! | op | operands | result |
//! |---|---|---|
//! | `reshape(shape)` | any | [`nx_placement::rules::reshape`]: each cut on the leading axis of its group, where the windows hold the same elements; else an error |
//! | `permute(perm)` | any | the cuts follow their axes |
//! | `narrow(axis, start, len)` | axis whole | the same placement |
//! | `expand(shape, placement)` | not partial; windows matching the target's on the axes that are not broadcast | the given placement |
//! | `max(axis)` | not partial | the axis removed; where it is cut, every rank of a group holds the maxima of all (closed, not a sum) |
//! | `mean(axis)` | any | as `sum` |

use nx_collectives::Reducible;
use nx_kernels::prog::Prog;
use nx_kernels::{Array, Kernels, Move, Reduction};
use nx_placement::rules;

use crate::tensor::{check, err, window_shape};
use crate::{Placement, Result, Tensor};

/// `a` as a C-contiguous array of `shape` (a view where it already is one).
fn reshaped<T: Reducible>(a: &Array<T>, shape: &[usize]) -> Result<Array<T>> {
    if let Some(v) = a.apply(&Move::Reshape(shape.to_vec()))? {
        return Ok(v);
    }
    Ok(a.copy()?.apply(&Move::Reshape(shape.to_vec()))?.expect("a dense array reshapes as a view"))
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// The same elements in C order under `shape`; the placement by
    /// [`nx_placement::rules::reshape`] (each rank's window reshaped where it lies).
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let x = nx::Tensor::<f32>::from_fn(ctx, &[4, 6], &nx::Placement::split(0, ctx.devices())?, |i| i[1] as f32)?;
    /// let y = x.reshape(&[4, 2, 3])?;
    /// assert!(y.placement().equal(&nx::Placement::split(0, ctx.devices())?));
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// Shapes of different element counts; a placement whose windows would not hold the same
    /// elements after the reshape (place the value first).
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::reshape";
        let placement = match self.placement.spec() {
            nx_placement::PlacementSpec::Device(_) => self.placement.clone(),
            _ => rules::reshape(FUNC, &self.placement, &self.shape, shape)?,
        };
        if shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x)) != Some(self.shape.iter().product()) {
            return Err(err(FUNC, format!("{:?} cannot become {shape:?}", self.shape)));
        }
        let local = match (&self.local, placement.window(shape, self.ctx.index())?) {
            (Some(a), Some(w)) => Some(reshaped(a, &window_shape(&w))?),
            _ => None,
        };
        Ok(self.with_local(placement, shape.to_vec(), local))
    }

    /// The axes reordered: axis `i` of the result is axis `perm[i]`; the cuts follow their axes.
    /// The window is copied dense.
    ///
    /// # Errors
    /// `perm` not a permutation of the axes.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::permute";
        let mut seen = vec![false; self.shape.len()];
        if perm.len() != self.shape.len()
            || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(err(FUNC, format!("{perm:?} is not a permutation of the axes of {:?}", self.shape)));
        }
        let placement = match self.placement.spec() {
            nx_placement::PlacementSpec::Device(_) => self.placement.clone(),
            _ => rules::permute(FUNC, &self.placement, perm)?,
        };
        let local = match &self.local {
            Some(a) => Some(a.apply(&Move::Permute(perm.to_vec()))?.expect("a permutation is a view").copy()?),
            None => None,
        };
        Ok(self.with_local(placement, perm.iter().map(|&p| self.shape[p]).collect(), local))
    }

    /// Elements `start..start + len` of `axis` (whole on the placement), copied dense.
    ///
    /// # Errors
    /// An axis past the rank or cut; a range past the axis.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::narrow";
        self.whole(FUNC, axis, true)?;
        if start.checked_add(len).is_none_or(|e| e > self.shape[axis]) {
            return Err(err(FUNC, format!("{start}..{start}+{len} of axis {axis} of {:?}", self.shape)));
        }
        let local = match &self.local {
            Some(a) => {
                let m = Move::Slice { axis, start: Some(start as isize), stop: Some((start + len) as isize), step: 1 };
                Some(a.apply(&m)?.expect("a slice is a view").copy()?)
            }
            None => None,
        };
        let mut shape = self.shape.clone();
        shape[axis] = len;
        Ok(self.with_local(self.placement.clone(), shape, local))
    }

    /// This value broadcast (numpy's rules) to `shape` at `placement`: each rank's window is its
    /// window of this value repeated along the broadcast axes.
    ///
    /// # Errors
    /// Shapes that do not broadcast; a partial value or target; a window of this value that is
    /// not the target's on an axis that is not broadcast.
    pub fn expand(&self, shape: &[usize], placement: &Placement<'d>) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::expand";
        let r = self.shape.len();
        let fits =
            r <= shape.len() && (0..r).all(|i| self.shape[i] == 1 || self.shape[i] == shape[shape.len() - r + i]);
        if !fits || self.placement.is_partial() || placement.is_partial() {
            return Err(err(
                FUNC,
                format!("{:?} at {} does not broadcast to {shape:?} at {placement}", self.shape, self.placement),
            ));
        }
        for d in 0..placement.devices().len() {
            let (mine, target) = (self.placement.window(&self.shape, d)?, placement.window(shape, d)?);
            let ok = match (&mine, &target) {
                (_, Some(t)) if t.iter().any(|x| x.is_empty()) => true,
                (Some(m), Some(t)) => (0..r).all(|i| {
                    let ti = &t[shape.len() - r + i];
                    if self.shape[i] == 1 && shape[shape.len() - r + i] != 1 {
                        m[i] == (0..1)
                    } else {
                        m[i] == *ti
                    }
                }),
                (_, None) => true,
                (None, Some(_)) => false,
            };
            if !ok {
                return Err(err(
                    FUNC,
                    format!(
                        "device {d}'s window {mine:?} of {:?} at {} is not its window {target:?} of {shape:?} at {placement}",
                        self.shape, self.placement
                    ),
                ));
            }
        }
        let local = match (placement.window(shape, self.ctx.index())?, &self.local) {
            (Some(w), _) if w.iter().any(|x| x.is_empty()) => {
                Some(Array::<T>::uninit_on(self.ctx.rig(), &window_shape(&w))?)
            }
            (Some(w), Some(a)) => {
                let ws = window_shape(&w);
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &ws)?;
                let mut p = Prog::new(&[T::DTYPE]);
                let l = p.load(0);
                p.output(l);
                check(FUNC, self.ctx.host().map(&p, &ws, &[&dst], &[a]), &[a])?;
                Some(dst)
            }
            _ => None,
        };
        Ok(self.with_local(placement.clone(), shape.to_vec(), local))
    }

    /// The greatest element along `axis` (NaN where one is). Where the placement cuts the axis,
    /// each rank's maxima are all-gathered over the mesh axes that cut it and reduced again, so
    /// the result is closed.
    ///
    /// # Errors
    /// An axis past the rank; a partial value (a maximum of a sum is not a sum of maxima).
    pub fn max(&self, axis: usize) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::max";
        if axis >= self.shape.len() {
            return Err(err(FUNC, format!("axis {axis} of a value of shape {:?}", self.shape)));
        }
        if self.placement.is_partial() {
            return Err(err(FUNC, format!("{} is a sum of terms: place it closed first", self.placement)));
        }
        let mut shape = self.shape.clone();
        shape.remove(axis);
        let reduce = |a: &Array<T>, axis: usize| -> Result<Array<T>> {
            let mut out = a.shape().to_vec();
            out.remove(axis);
            let dst = Array::<T>::uninit_on(self.ctx.rig(), &out)?;
            let mut p = Prog::new(&[T::DTYPE]);
            let l = p.load(0);
            p.output(l);
            check(FUNC, self.ctx.host().reduce(&p, a.shape(), &[axis], &[Reduction::Max], &[&dst], &[a]), &[a])?;
            Ok(dst)
        };
        let cut = match self.placement.spec() {
            nx_placement::PlacementSpec::Device(_) => Vec::new(),
            _ => rules::parts(FUNC, &self.placement)?.cut_of(axis),
        };
        let local = match &self.local {
            Some(a) => Some(reduce(a, axis)?),
            None => None,
        };
        if cut.is_empty() {
            let placement = match self.placement.spec() {
                nx_placement::PlacementSpec::Device(_) => self.placement.clone(),
                _ => rules::reduce(FUNC, &self.placement, &[axis])?,
            };
            return Ok(self.with_local(placement, shape, local));
        }
        // each rank's maxima as element `c` of a last axis of `ways` cut over the mesh axes that
        // cut `axis` (c the rank's block), gathered whole and reduced
        let mut pp = rules::parts(FUNC, &self.placement)?;
        let mesh = self.placement.mesh_of();
        let ways: usize = cut
            .iter()
            .map(|n| mesh.extent(n))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(nx_placement::Error::from)?
            .iter()
            .product();
        pp.cuts.retain(|c| c.0 != axis);
        for c in &mut pp.cuts {
            if c.0 > axis {
                c.0 -= 1;
            }
        }
        let closed = rules::rebuild(&self.placement, &pp)?;
        pp.cuts.push((shape.len(), cut));
        let spread = rules::rebuild(&self.placement, &pp)?;
        let mut wide = shape.clone();
        wide.push(ways);
        let local = match (local, spread.window(&wide, self.ctx.index())?) {
            (Some(m), Some(w)) => Some(reshaped(&m, &window_shape(&w))?),
            _ => None,
        };
        let gathered = self.with_local(spread, wide, local).place(&closed)?;
        let local = match &gathered.local {
            Some(a) => Some(reduce(a, shape.len())?),
            None => None,
        };
        Ok(self.with_local(closed, shape, local))
    }

    /// The mean along `axis`: [`Tensor::sum`] scaled by 1/n (partial where the sum is).
    ///
    /// # Errors
    /// As [`Tensor::sum`].
    pub fn mean(&self, axis: usize) -> Result<Self> {
        let n =
            *self.shape.get(axis).ok_or_else(|| err("nx::Tensor::mean", format!("axis {axis} of {:?}", self.shape)))?;
        self.sum(axis)?.scale(1.0 / n.max(1) as f64)
    }

    /// The value converted to `U` elementwise (nx's conversion rules: to `bf16`/`f16` round to
    /// nearest even), at the same placement; a sum's terms are converted one by one.
    ///
    /// # Errors
    /// Kernel refusals (none for numeric dtypes).
    pub fn cast<U: Reducible>(&self) -> Result<Tensor<'d, U>> {
        const FUNC: &str = "nx::Tensor::cast";
        let local = match &self.local {
            Some(a) => {
                let dst = Array::<U>::uninit_on(self.ctx.rig(), a.shape())?;
                let mut p = Prog::new(&[T::DTYPE]);
                let l = p.load(0);
                let c = p.cast(l, U::DTYPE);
                p.output(c);
                check(FUNC, self.ctx.host().map(&p, a.shape(), &[&dst], &[a]), &[a])?;
                Some(dst)
            }
            None => None,
        };
        Ok(Tensor { ctx: self.ctx.clone(), shape: self.shape.clone(), placement: self.placement.clone(), local })
    }

    /// `self + c` elementwise.
    ///
    /// # Errors
    /// A partial value (a constant added to each term would be added once per term).
    pub fn add_scalar(&self, c: f64) -> Result<Self> {
        self.map(&[], false, |p, l| {
            let k = p.float(c);
            p.add(l[0], k)
        })
    }
}
