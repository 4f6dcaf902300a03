//! The argument checks every backend runs before a collective: lengths, counts, roots, peers and
//! whether the dtype has the reduce op. One place, so that every backend refuses alike.

use crate::{Error, ReduceOp, Reducible, Result};

fn invalid(func: &'static str, why: String) -> Error {
    Error::Invalid { func, why }
}

/// The sum of `counts`, or `None` where it overflows (no buffer holds that many elements).
pub(crate) fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |a, &c| a.checked_add(c))
}

/// A root of a group of `n`.
pub(crate) fn root(root: usize, n: usize) -> Result<()> {
    if root >= n {
        return Err(invalid("nx_collectives::broadcast", format!("root {root} of a group of {n}")));
    }
    Ok(())
}

/// The dtype `T` has the reduce op `op` (no sum of booleans, no extreme of complex numbers).
pub(crate) fn reducible<T: Reducible>(func: &'static str, op: ReduceOp) -> Result<()> {
    if T::combine(op, T::default().widen(), T::default().widen()).is_none() {
        return Err(invalid(func, format!("{} has no {}", T::DTYPE, op.name())));
    }
    Ok(())
}

/// An all-reduce's buffers.
pub(crate) fn all_reduce<T: Reducible>(send: &[T], recv: &[T], op: ReduceOp) -> Result<()> {
    const FUNC: &str = "nx_collectives::all_reduce";
    if send.len() != recv.len() {
        return Err(invalid(FUNC, format!("send of {} and recv of {} elements", send.len(), recv.len())));
    }
    reducible::<T>(FUNC, op)
}

/// A reduce-scatter's buffers on rank `rank` of `n`.
pub(crate) fn reduce_scatter<T: Reducible>(
    send: &[T],
    recv: &[T],
    counts: &[usize],
    op: ReduceOp,
    rank: usize,
    n: usize,
) -> Result<()> {
    const FUNC: &str = "nx_collectives::reduce_scatter_v";
    if counts.len() != n || total(counts) != Some(send.len()) || counts[rank] != recv.len() {
        return Err(invalid(
            FUNC,
            format!("counts {counts:?} for send of {} and recv of {} on rank {rank} of {n}", send.len(), recv.len()),
        ));
    }
    reducible::<T>(FUNC, op)
}

/// An all-gather's buffers on rank `rank` of `n`.
pub(crate) fn all_gather<T>(send: &[T], recv: &[T], counts: &[usize], rank: usize, n: usize) -> Result<()> {
    if counts.len() != n || counts[rank] != send.len() || total(counts) != Some(recv.len()) {
        return Err(invalid(
            "nx_collectives::all_gather_v",
            format!("counts {counts:?} for send of {} and recv of {} on rank {rank}", send.len(), recv.len()),
        ));
    }
    Ok(())
}

/// An all-to-all's buffers in a group of `n`.
pub(crate) fn all_to_all<T>(
    send: &[T],
    send_counts: &[usize],
    recv: &[T],
    recv_counts: &[usize],
    n: usize,
) -> Result<()> {
    if send_counts.len() != n
        || recv_counts.len() != n
        || total(send_counts) != Some(send.len())
        || total(recv_counts) != Some(recv.len())
    {
        return Err(invalid(
            "nx_collectives::all_to_all_v",
            format!(
                "send counts {send_counts:?} for {} elements, recv counts {recv_counts:?} for {}, in a group of {n}",
                send.len(),
                recv.len()
            ),
        ));
    }
    Ok(())
}

/// Every sender's count is its receiver's: `all[j]` is rank j's send counts then recv counts.
pub(crate) fn all_to_all_pairs(all: &[Vec<usize>], name: impl Fn(usize) -> usize) -> Result<()> {
    let n = all.len();
    for (j, sj) in all.iter().enumerate() {
        for (m, sm) in all.iter().enumerate() {
            if sj[m] != sm[n + j] {
                return Err(Error::Mismatch {
                    rank_a: name(j),
                    call_a: format!("all_to_all sending {} elements to rank {}", sj[m], name(m)),
                    rank_b: name(m),
                    call_b: format!("all_to_all receiving {} elements from rank {}", sm[n + j], name(j)),
                });
            }
        }
    }
    Ok(())
}

/// A point-to-point peer of rank `rank` of `n`.
pub(crate) fn peer(func: &'static str, peer: usize, rank: usize, n: usize) -> Result<()> {
    if peer >= n || peer == rank {
        return Err(invalid(func, format!("peer rank {peer} of rank {rank} of {n}")));
    }
    Ok(())
}

/// Exclusive prefix sums: where each run of `counts` starts (counts whose [`total`] was checked).
pub(crate) fn offsets<T: Copy + Default + std::ops::Add<Output = T>>(counts: &[T]) -> Vec<T> {
    counts
        .iter()
        .scan(T::default(), |acc, &c| {
            let o = *acc;
            *acc = o + c;
            Some(o)
        })
        .collect()
}
