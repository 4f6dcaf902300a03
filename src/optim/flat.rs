//! Multi-tensor steps (PyTorch's `foreach` optimizers, Apex's multi-tensor apply): the small
//! parameters of one placement are updated as one flat array on each rank. Their windows are laid
//! end to end — read in place where they already lie so in one buffer (as the previous step's
//! results do), else gathered by one `assemble` — one map updates them all, and each parameter and
//! moment gets back a view of its own span of the result. A step then pays one kernel call (and
//! one fork of the pool) per group instead of one per parameter: a GPT's biases and norms are
//! most of its parameters by count and almost none by size.

use nx_collectives::Reducible;
use nx_kernels::{Array, Kernels, Layout, Move, Operand};
use nx_placement::rules;

use crate::tensor::{check, err, sum_local};
use crate::{Ctx, Result, Tensor};

/// Parameters of at most this many elements are stepped in groups; larger ones alone (their own
/// call is worth its cost, and gathering them would copy them).
pub(super) const SMALL: usize = 1 << 14;

/// Indices of tensors (into the caller's list) that share a placement and a key: each group is
/// stepped as one flat array. Tensors larger than [`SMALL`] are left out.
pub(super) fn groups<'d, T: Reducible, K: PartialEq + Copy>(
    tensors: &[&Tensor<'d, T>],
    key: impl Fn(usize) -> Option<K>,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    let mut alone = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let small = t.shape.iter().product::<usize>() <= SMALL;
        match key(i) {
            Some(k) if small => {
                let same = |g: &(K, Vec<usize>)| {
                    let first = tensors[g.1[0]];
                    g.0 == k && first.shape.len() == t.shape.len() && first.placement.equal(&t.placement)
                };
                match groups.iter_mut().find(|g| same(g)) {
                    Some(g) => g.1.push(i),
                    None => groups.push((k, vec![i])),
                }
            }
            _ => alone.push(i),
        }
    }
    (groups.into_iter().map(|g| g.1).collect(), alone)
}

/// The windows `arrays` of this rank end to end as one array `[n]`: a view where they lie so in one
/// buffer already, else a fresh array assembled from them.
///
/// # Errors
/// The allocator's and the kernel's.
pub(super) fn flat<T: Reducible>(ctx: &Ctx<'_>, arrays: &[&Array<T>]) -> Result<Array<T>> {
    const FUNC: &str = "nx::optim::flat";
    let n: usize = arrays.iter().map(|a| a.numel()).sum();
    if let Some(first) = arrays.first() {
        let mut next = first.layout().offset();
        let in_place = arrays.iter().all(|a| {
            let ok = a.layout().is_contiguous()
                && a.buffer().same_memory(first.buffer())
                && (a.numel() == 0 || a.layout().offset() == next);
            next += a.numel() as isize;
            ok
        });
        if in_place {
            let layout = Layout::new(vec![n], vec![1], first.layout().offset())?;
            return Ok(Array::new(layout, first.buffer().clone())?);
        }
    }
    let dst = Array::<T>::uninit_on(ctx.rig(), &[n])?;
    let lines: Vec<Array<T>> = arrays
        .iter()
        .map(|a| match a.apply(&Move::Reshape(vec![a.numel()]))? {
            Some(v) => Ok(v),
            None => a.copy()?.apply(&Move::Reshape(vec![a.numel()])).map(|v| v.expect("a dense array reshapes")),
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut at = 0;
    let offsets: Vec<[usize; 1]> = lines
        .iter()
        .map(|l| {
            let o = [at];
            at += l.numel();
            o
        })
        .collect();
    let pieces: Vec<(&[usize], &dyn Operand)> =
        offsets.iter().zip(&lines).map(|(o, l)| (&o[..], l as &dyn Operand)).collect();
    let read: Vec<&dyn Operand> = lines.iter().map(|l| l as &dyn Operand).collect();
    check(FUNC, ctx.host().assemble(&dst, &pieces), &read)?;
    Ok(dst)
}

/// Span `at..at + numel(shape)` of the flat `a`, as an array of `shape` (a view).
///
/// # Errors
/// A span past `a` (a caller's bug, reported rather than read).
pub(super) fn part<T: Reducible>(a: &Array<T>, at: usize, shape: &[usize]) -> Result<Array<T>> {
    let n: usize = shape.iter().product();
    let m = Move::Slice { axis: 0, start: Some(at as isize), stop: Some((at + n) as isize), step: 1 };
    let span = a.apply(&m)?.expect("a slice is a view");
    if span.numel() != n {
        return Err(err("nx::optim::part", format!("{at}..{at}+{n} of a flat array of {}", a.numel())));
    }
    Ok(span.apply(&Move::Reshape(shape.to_vec()))?.expect("a dense span reshapes"))
}

/// The sum of the squares of the tensors `ts` (one placement, `ts[0]`'s) as a scalar at the
/// placement `Tensor::sum_squares` gives `ts[0]`: each rank's windows summed as one flat array.
///
/// # Errors
/// A partial value; the kernels'.
pub(super) fn group_squares<'d, T: Reducible>(ts: &[&Tensor<'d, T>]) -> Result<Tensor<'d, T>> {
    const FUNC: &str = "nx::optim::group_squares";
    let first = ts[0];
    if first.placement.is_partial() {
        return Err(err(FUNC, format!("the squares of a partial value ({}): close it first", first.placement)));
    }
    let axes: Vec<usize> = (0..first.shape.len()).collect();
    let placement = rules::reduce(FUNC, &first.placement, &axes)?;
    let local = match ts.iter().map(|t| t.local.as_ref()).collect::<Option<Vec<_>>>() {
        Some(arrays) => Some(sum_local(FUNC, &first.ctx, &flat(&first.ctx, &arrays)?, &[0], true)?),
        None => None,
    };
    Ok(first.with_local(placement, vec![], local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_reads_adjacent_windows_in_place_and_gathers_others() {
        crate::launch_with(&crate::LaunchOptions { devices: Some(1), ..Default::default() }, |ctx| {
            let whole = Array::<f32>::from_vec_on(ctx.rig(), &[7], (0..7).map(|x| x as f32).collect())?;
            let (a, b) = (part(&whole, 0, &[1, 3])?, part(&whole, 3, &[4])?);
            let f = flat(ctx, &[&a, &b])?;
            assert!(f.buffer().same_memory(whole.buffer()) && f.layout().offset() == 0, "read in place");
            assert_eq!(f.to_vec()?, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            // out of order, or with a gap: gathered into a fresh array
            let g = flat(ctx, &[&b, &a])?;
            assert!(!g.buffer().same_memory(whole.buffer()));
            assert_eq!(g.to_vec()?, [3.0, 4.0, 5.0, 6.0, 0.0, 1.0, 2.0]);
            let h = flat(ctx, &[&a, &part(&whole, 4, &[3])?])?;
            assert!(!h.buffer().same_memory(whole.buffer()));
            assert_eq!(h.to_vec()?, [0.0, 1.0, 2.0, 4.0, 5.0, 6.0]);
            // a span past the array is an error, not a read
            assert!(part(&whole, 5, &[3]).is_err());
            Ok(())
        })
        .unwrap();
    }
}
