//! Placing many values at once: [`Tensor::place_all`], the closings of partial sums over the
//! same groups fused into one all-reduce (the gradient buckets of data parallelism).

use nx_collectives::Reducible;
use nx_kernels::Array;

use crate::tensor::{err, window_shape};
use crate::{Placement, Result, Tensor};

/// What [`with_slices`] calls with the windows' elements.
type WithSlices<'f, T, R> = dyn FnMut(&[Option<&[T]>]) -> Result<R> + 'f;

/// Calls `f` with the elements of each of `arrays` where they lie (C-contiguous ones; `None` for
/// none), holding each one's shared claim meanwhile; `acc` holds those of the arrays before.
fn with_slices<T: Reducible, R>(
    arrays: &[Option<&Array<T>>],
    acc: Vec<Option<&[T]>>,
    f: &mut WithSlices<'_, T, R>,
) -> Result<R> {
    match arrays.split_first() {
        None => f(&acc),
        Some((None, rest)) => {
            let mut acc = acc;
            acc.push(None);
            with_slices(rest, acc, f)
        }
        Some((Some(a), rest)) => a.with_slice(|s| {
            let mut next: Vec<Option<&[T]>> = acc.clone();
            next.push(Some(s));
            with_slices(rest, next, f)
        })?,
    }
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// Each of `values` at the placement of the same index in `to`, as [`Tensor::place`] places
    /// it, with the values whose move closes a partial sum where it lies (one all-reduce: a
    /// gradient summed over `dp`) closed together, one all-reduce per group of devices instead of
    /// one per value. Each value's bits are those [`Tensor::place`] gives: a sum's association is
    /// per element (term order), whatever else shares its message. A value already at a placement
    /// [`Placement::equal`] to its target, or whose plan keeps every window (a sum of one term),
    /// keeps its windows (no copy). Answers the values in order.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let mesh = ctx.mesh(&[("dp", 2)])?;
    /// let (sum, on) = (nx::Placement::partial(&mesh, &["dp"], &[])?, nx::Placement::on(ctx.devices()));
    /// // each rank's terms: rank r holds r + 1 at every element
    /// let term = |shape: &[usize]| -> nx::Result<nx::Tensor<'_, f32>> {
    ///     let n = shape.iter().product();
    ///     let local = nx::kernels::Array::from_vec(ctx.device(), shape, vec![ctx.rank() as f32 + 1.0; n])?;
    ///     nx::Tensor::from_local(ctx, shape, &sum, Some(local))
    /// };
    /// let (a, b) = (term(&[3])?, term(&[2, 2])?);
    /// // both closed by one all-reduce of 7 elements: 1 + 2 everywhere
    /// let out = nx::Tensor::place_all(&[&a, &b], &[&on, &on])?;
    /// assert_eq!(out[0].full()?.to_vec()?, vec![3.0; 3]);
    /// assert_eq!(out[1].full()?.to_vec()?, vec![3.0; 4]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] where `values` and `to` differ in length; as [`Tensor::place`].
    pub fn place_all(values: &[&Tensor<'d, T>], to: &[&Placement<'d>]) -> Result<Vec<Tensor<'d, T>>> {
        if values.len() != to.len() {
            return Err(err("nx::Tensor::place_all", format!("{} values for {} placements", values.len(), to.len())));
        }
        // values already at an equal placement are relabelled, not moved (as the optimizers did
        // before: no copy of a closed gradient); the others planned and placed together
        // (and so are those whose plan keeps every window: a sum of one term)
        let mut moved = Vec::new();
        let mut plans = Vec::new();
        for i in (0..values.len()).filter(|&i| !values[i].placement.equal(to[i])) {
            let plan = values[i].plan(to[i])?;
            if !plan.keeps_windows() {
                moved.push(i);
                plans.push(plan);
            }
        }
        let Some(first) = values.first() else { return Ok(Vec::new()) };
        let plans: Vec<&_> = plans.iter().collect();
        // strided windows copied dense first, as `place` does
        let dense: Vec<Option<Array<T>>> = moved
            .iter()
            .map(|&i| match &values[i].local {
                Some(a) if !a.layout().is_contiguous() => a.copy().map(Some),
                _ => Ok(None),
            })
            .collect::<std::result::Result<_, _>>()?;
        let arrays: Vec<Option<&Array<T>>> =
            moved.iter().zip(&dense).map(|(&i, d)| d.as_ref().or(values[i].local.as_ref())).collect();
        let ctx = &first.ctx;
        let (comm, groups, rig) = (ctx.comm(), ctx.groups(), ctx.rig());
        let outs = with_slices(&arrays, Vec::with_capacity(arrays.len()), &mut |locals| {
            Ok(nx_collectives::place_all_in(comm, groups, &plans, locals, rig)?)
        })?;
        let mut outs = moved.iter().copied().zip(outs).peekable();
        (0..values.len())
            .map(|i| {
                let (v, p) = (values[i], to[i]);
                let Some((_, out)) = outs.next_if(|o| o.0 == i) else {
                    return Ok((*v).clone().relabel(p.clone()));
                };
                let local = match (out, p.window(&v.shape, ctx.index())?) {
                    (Some(d), Some(w)) => Some(d.into_array(&window_shape(&w))?),
                    _ => None,
                };
                Ok(v.with_local(p.clone(), v.shape.clone(), local))
            })
            .collect()
    }
}
