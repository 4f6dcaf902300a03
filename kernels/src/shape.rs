//! The shapes of kernels' destinations (the reference's `Shape`): what a caller allocates before
//! a call, and what the host library checks a call against. Each answers the shape, or why the
//! attributes and operand shapes fit no call, in words. Contractions have theirs on
//! [`crate::Contraction`]; a padded load's is [`padded`].
//!
//! ```
//! use nx_kernels::shape;
//!
//! // an embedding lookup: rows of a [50, 8] table at [4, 3] ids
//! assert_eq!(shape::gather(&[50, 8], 0, &[4, 3]).unwrap(), [4, 3, 8]);
//! // the 5 greatest of each row of [7, 100]
//! assert_eq!(shape::sort(&[7, 100], 1, 5).unwrap(), [7, 5]);
//! assert!(shape::sort(&[7, 100], 1, 101).is_err());
//! ```

pub use crate::loads::padded_shape as padded;
use crate::loads::{Pad, Windows};

fn axis_of(what: &str, shape: &[usize], axis: usize) -> Result<(), String> {
    if axis >= shape.len() {
        return Err(format!("{what} along axis {axis} of an operand of shape {shape:?}"));
    }
    Ok(())
}

/// A reduction's destinations: the loop's `shape` without `axes` (distinct, each below the rank).
///
/// # Errors
/// An axis past the rank or named twice.
pub fn reduce(shape: &[usize], axes: &[usize]) -> Result<Vec<usize>, String> {
    let mut seen = vec![false; shape.len()];
    for &a in axes {
        if a >= shape.len() || std::mem::replace(&mut seen[a], true) {
            return Err(format!("reduced axes {axes:?} of a loop of shape {shape:?}"));
        }
    }
    Ok(shape.iter().zip(&seen).filter(|(_, &s)| !s).map(|(&n, _)| n).collect())
}

/// A scan's carry along `axis` of an operand of `shape`: the shape without that axis (the
/// destination has the operand's shape).
///
/// # Errors
/// An axis past the rank.
pub fn carry(shape: &[usize], axis: usize) -> Result<Vec<usize>, String> {
    axis_of("a scan", shape, axis)?;
    let mut s = shape.to_vec();
    s.remove(axis);
    Ok(s)
}

/// A gather's destination: `src` with `axis` replaced by the index's shape.
///
/// # Errors
/// An axis past the rank, or a result of more than [`crate::MAX_RANK`] axes.
pub fn gather(src: &[usize], axis: usize, index: &[usize]) -> Result<Vec<usize>, String> {
    range_gather_or(src, axis, None, index)
}

/// A range gather's destination: `src` with `axis` replaced by the starts' shape followed by the
/// run's extent.
///
/// # Errors
/// As [`gather`].
pub fn range_gather(src: &[usize], axis: usize, run: usize, starts: &[usize]) -> Result<Vec<usize>, String> {
    range_gather_or(src, axis, Some(run), starts)
}

fn range_gather_or(src: &[usize], axis: usize, run: Option<usize>, index: &[usize]) -> Result<Vec<usize>, String> {
    axis_of("a gather", src, axis)?;
    let mut s: Vec<usize> = src[..axis].to_vec();
    s.extend(index);
    s.extend(run);
    s.extend(&src[axis + 1..]);
    if s.len() > crate::MAX_RANK {
        return Err(format!(
            "a gather of {src:?} at indices {index:?} has {} axes (at most {})",
            s.len(),
            crate::MAX_RANK
        ));
    }
    Ok(s)
}

/// A scatter's source (its values): the destination's shape `dst` with `axis` of the index's
/// extent; `index` is 1-D.
///
/// # Errors
/// An axis past the rank or an index of another rank than 1.
pub fn scatter(dst: &[usize], axis: usize, index: &[usize]) -> Result<Vec<usize>, String> {
    axis_of("a scatter", dst, axis)?;
    let [t] = index else { return Err(format!("a scatter's index of shape {index:?}: it has one axis")) };
    let mut s = dst.to_vec();
    s[axis] = *t;
    Ok(s)
}

/// A sort's destinations (values and positions) keeping the first `k` of each lane along `axis`.
///
/// # Errors
/// An axis past the rank, or `k` past the axis's extent.
pub fn sort(src: &[usize], axis: usize, k: usize) -> Result<Vec<usize>, String> {
    axis_of("a sort", src, axis)?;
    if k > src[axis] {
        return Err(format!("the first {k} of axis {axis} of {src:?}"));
    }
    let mut s = src.to_vec();
    s[axis] = k;
    Ok(s)
}

/// A fold's destination: the windows' counts of `src` padded by `pad`.
///
/// # Errors
/// As [`Pad::shape`] and [`Windows::shape`].
pub fn fold(pad: &Pad, windows: &Windows, src: &[usize]) -> Result<Vec<usize>, String> {
    windows.shape(&pad.shape(src)?)
}

/// The shapes of an attention's keys and values.
#[derive(Debug, Clone, Copy)]
pub enum KvShape<'a> {
    /// `k` `[lead…, hk, tk, dk]`, `v` `[lead…, hk, tk, dv]`.
    Dense {
        /// The keys'.
        k: &'a [usize],
        /// The values'.
        v: &'a [usize],
    },
    /// Pools `k` `[pages, hk, page, dk]`, `v` `[pages, hk, page, dv]`, a table `[lead…, max_pages]`.
    Paged {
        /// The key pool's.
        k: &'a [usize],
        /// The value pool's.
        v: &'a [usize],
        /// The page table's.
        table: &'a [usize],
    },
}

/// An attention's destinations and extents, from [`attention`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionShape {
    /// `o`: `[lead…, hq, tq, dv]`.
    pub o: Vec<usize>,
    /// `lse`: `[lead…, hq, tq]`.
    pub lse: Vec<usize>,
    /// The lengths operand's: `[lead…]`.
    pub lengths: Vec<usize>,
    /// Keys a query row reads: `tk`, or `max_pages · page`.
    pub tk: usize,
    /// Key heads.
    pub hk: usize,
}

/// An attention's shapes for a query `q` `[lead…, hq, tq, dk]` and keys and values `kv`.
///
/// # Errors
/// A query of rank below 3; keys or values whose lead axes, heads or `dk` differ from the
/// query's; key heads that do not divide the query heads (or none); pools that are not of rank 4
/// or a table that is not `[lead…, max_pages]`; `tk` past the address space.
pub fn attention(q: &[usize], kv: KvShape<'_>) -> Result<AttentionShape, String> {
    let rank = q.len();
    if rank < 3 {
        return Err(format!("a query of shape {q:?}: [lead…, heads, rows, dk] has at least 3 axes"));
    }
    let lead = rank - 3;
    let (hq, dk) = (q[lead], q[lead + 2]);
    let (ks, vs, hk, tk) = match kv {
        KvShape::Dense { k, v } => {
            if k.len() != rank || v.len() != rank || k[..lead] != q[..lead] || v[..lead + 2] != k[..lead + 2] {
                return Err(format!(
                    "keys {k:?} and values {v:?} for a query {q:?}: [lead…, hk, tk, d], lead as the query's"
                ));
            }
            (k, v, k[lead], k[lead + 1])
        }
        KvShape::Paged { k, v, table } => {
            if k.len() != 4 || v.len() != 4 || v[..3] != k[..3] || table.len() != lead + 1 || table[..lead] != q[..lead]
            {
                return Err(format!(
                    "pools {k:?} and {v:?} through a table {table:?} for a query {q:?}: [pages, hk, page, d] and [lead…, max_pages]"
                ));
            }
            let tk = table[lead]
                .checked_mul(k[2])
                .ok_or_else(|| format!("{} pages of {} keys: past the address space", table[lead], k[2]))?;
            (k, v, k[1], tk)
        }
    };
    if ks[ks.len() - 1] != dk {
        return Err(format!("keys of {} elements for queries of {dk}", ks[ks.len() - 1]));
    }
    if hk == 0 || hq % hk != 0 {
        return Err(format!("{hk} key heads for {hq} query heads: they divide them"));
    }
    let mut o = q.to_vec();
    o[rank - 1] = vs[vs.len() - 1];
    Ok(AttentionShape { o, lse: q[..rank - 1].to_vec(), lengths: q[..lead].to_vec(), tk, hk })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_every_family() {
        assert_eq!(reduce(&[2, 3, 4], &[2, 0]).unwrap(), [3]);
        assert!(reduce(&[2, 3], &[1, 1]).is_err() && reduce(&[2, 3], &[2]).is_err());
        assert_eq!(carry(&[2, 3, 4], 1).unwrap(), [2, 4]);
        assert!(carry(&[], 0).is_err());
        assert_eq!(range_gather(&[5, 6, 7], 1, 2, &[3]).unwrap(), [5, 3, 2, 7]);
        assert_eq!(gather(&[5], 0, &[]).unwrap(), Vec::<usize>::new());
        assert!(gather(&[1; 8], 0, &[1; 10]).is_err());
        assert_eq!(scatter(&[5, 6], 0, &[9]).unwrap(), [9, 6]);
        assert!(scatter(&[5, 6], 0, &[9, 1]).is_err());
        assert_eq!(fold(&Pad::edges(&[1], &[1]), &Windows::new(&[3], &[2]), &[5]).unwrap(), [3]);
        let a = attention(&[2, 8, 5, 16], KvShape::Dense { k: &[2, 2, 9, 16], v: &[2, 2, 9, 4] }).unwrap();
        assert_eq!((a.o, a.lse, a.lengths, a.tk, a.hk), (vec![2, 8, 5, 4], vec![2, 8, 5], vec![2], 9, 2));
        let p = attention(&[3, 4, 2, 8], KvShape::Paged { k: &[10, 4, 16, 8], v: &[10, 4, 16, 8], table: &[3, 5] });
        assert_eq!(p.unwrap().tk, 80);
        assert!(attention(&[8, 5, 16], KvShape::Dense { k: &[3, 9, 16], v: &[3, 9, 4] }).is_err(), "3 ∤ 8");
        assert!(attention(&[5, 16], KvShape::Dense { k: &[9, 16], v: &[9, 4] }).is_err());
    }
}
