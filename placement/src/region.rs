//! Windows as boxes: per-axis half-open ranges, and the few set operations plans need.

use std::ops::Range;

/// A box of elements: one half-open range per tensor axis. A box of rank 0 holds one element.
pub type Window = Vec<Range<usize>>;

/// The number of elements of `w`, saturating at `u64::MAX` (the windows of a placement of a
/// shape always fit: its element count is checked wherever a shape is taken).
pub fn volume(w: &[Range<usize>]) -> u64 {
    if w.iter().any(|r| r.is_empty()) {
        return 0;
    }
    w.iter().fold(1u64, |a, r| a.saturating_mul(r.len() as u64))
}

/// The common part of `a` and `b`, or `None` where they share no element.
pub fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Window> {
    let w: Window = a.iter().zip(b).map(|(x, y)| x.start.max(y.start)..x.end.min(y.end)).collect();
    (w.iter().all(|r| r.start < r.end)).then_some(w)
}

/// Whether every element of `inner` is in `outer` (an empty `inner` is in anything).
pub fn contains(outer: &[Range<usize>], inner: &[Range<usize>]) -> bool {
    volume(inner) == 0 || outer.iter().zip(inner).all(|(o, i)| o.start <= i.start && i.end <= o.end)
}

/// `a` less `b`, as disjoint boxes (at most two per axis).
pub fn subtract(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Window> {
    if volume(a) == 0 {
        return Vec::new();
    }
    let Some(common) = intersect(a, b) else {
        return vec![a.to_vec()];
    };
    let mut out = Vec::new();
    let mut rest = a.to_vec();
    for axis in 0..a.len() {
        let c = &common[axis];
        if rest[axis].start < c.start {
            let mut lo = rest.clone();
            lo[axis] = rest[axis].start..c.start;
            out.push(lo);
        }
        if c.end < rest[axis].end {
            let mut hi = rest.clone();
            hi[axis] = c.end..rest[axis].end;
            out.push(hi);
        }
        rest[axis] = c.clone();
    }
    out
}

/// The window of number `index` when `n` elements are cut `k` ways: the first `n mod k` windows
/// hold `n/k + 1`, the others `n/k`.
pub fn chunk(n: usize, k: usize, index: usize) -> Range<usize> {
    let (q, r) = (n / k, n % k);
    let start = index * q + index.min(r);
    start..start + q + usize::from(index < r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_the_reference_rule() {
        let lens: Vec<usize> = (0..4).map(|i| chunk(5, 4, i).len()).collect();
        assert_eq!(lens, [2, 1, 1, 1]);
        assert_eq!(chunk(3, 4, 3), 3..3);
        assert_eq!(chunk(0, 3, 2), 0..0);
    }

    #[test]
    fn subtract_is_exact() {
        let a = vec![0..4, 0..4];
        let b = vec![1..3, 2..6];
        let parts = subtract(&a, &b);
        let total: u64 = parts.iter().map(|p| volume(p)).sum();
        assert_eq!(total, 16 - 4);
        for p in &parts {
            assert!(intersect(p, &b).is_none());
            assert!(contains(&a, p));
        }
        for (i, p) in parts.iter().enumerate() {
            for q in &parts[i + 1..] {
                assert!(intersect(p, q).is_none());
            }
        }
    }
}
