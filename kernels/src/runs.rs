//! Runs: the positions of `K` layouts of one shape, walked together in C order of indices, a run
//! of the innermost axis at a time, with the axes that can merge merged first. Copies and loads
//! move a run by a tight loop (a `memcpy` where the run is contiguous in every layout, one value
//! repeated where a source's stride is 0) instead of stepping an index per element.

/// The joint walk of `K` layouts over one shape (see the module's docs).
#[derive(Debug, Clone)]
pub(crate) struct Runs<const K: usize> {
    shape: Vec<usize>,
    strides: Vec<[isize; K]>,
    index: Vec<usize>,
    pos: [isize; K],
    left: usize,
}

impl<const K: usize> Runs<K> {
    /// The walk of flat indices `start..start + len` of `shape` in C order, layout `k` having
    /// `strides[k]` and `offsets[k]`. Extent-1 axes are dropped and an axis merges into the next
    /// where every layout's stride allows (`stride[d] = stride[d + 1] · shape[d + 1]`).
    pub(crate) fn new(shape: &[usize], strides: [&[isize]; K], offsets: [isize; K], start: usize, len: usize) -> Self {
        let mut sh: Vec<usize> = Vec::with_capacity(shape.len());
        let mut st: Vec<[isize; K]> = Vec::with_capacity(shape.len());
        for (d, &n) in shape.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let s: [isize; K] = std::array::from_fn(|k| strides[k][d]);
            if let Some(last) = st.last_mut() {
                // the axis before is outer: it merges when its stride steps over this whole axis
                if (0..K).all(|k| last[k] == s[k] * n as isize) {
                    *last = s;
                    *sh.last_mut().expect("an axis") *= n;
                    continue;
                }
            }
            sh.push(n);
            st.push(s);
        }
        let total: usize = sh.iter().product();
        let len = len.min(total.saturating_sub(start));
        let mut index = vec![0; sh.len()];
        let mut pos = offsets;
        if len > 0 {
            let mut rest = start;
            for d in (0..sh.len()).rev() {
                index[d] = rest % sh[d];
                rest /= sh[d];
                for (p, s) in pos.iter_mut().zip(st[d]) {
                    *p += index[d] as isize * s;
                }
            }
        }
        Runs { shape: sh, strides: st, index, pos, left: len }
    }

    /// Each layout's stride along a run (0 for a walk of no axis: its runs are one element).
    pub(crate) fn inner_strides(&self) -> [isize; K] {
        self.strides.last().copied().unwrap_or([0; K])
    }

    /// The next run: each layout's first position and the run's length (at least 1).
    pub(crate) fn next_run(&mut self) -> Option<([isize; K], usize)> {
        if self.left == 0 {
            return None;
        }
        let out = self.pos;
        let Some(last) = self.shape.len().checked_sub(1) else {
            self.left = 0;
            return Some((out, 1));
        };
        let n = (self.shape[last] - self.index[last]).min(self.left);
        self.left -= n;
        self.index[last] += n;
        for (p, s) in self.pos.iter_mut().zip(self.strides[last]) {
            *p += n as isize * s;
        }
        if self.index[last] == self.shape[last] {
            for d in (0..=last).rev() {
                if d < last {
                    self.index[d] += 1;
                    for (p, s) in self.pos.iter_mut().zip(self.strides[d]) {
                        *p += s;
                    }
                    if self.index[d] < self.shape[d] {
                        break;
                    }
                }
                for (p, s) in self.pos.iter_mut().zip(self.strides[d]) {
                    *p -= s * self.shape[d] as isize;
                }
                self.index[d] = 0;
            }
        }
        Some((out, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every position the runs cover, in order, against a naive walk of the indices.
    fn check(shape: &[usize], strides: [&[isize]; 2], offsets: [isize; 2], start: usize, len: usize) {
        let total: usize = shape.iter().product();
        let mut want = Vec::new();
        for flat in start..(start + len).min(total) {
            let mut rest = flat;
            let mut p = offsets;
            for d in (0..shape.len()).rev() {
                let i = (rest % shape[d]) as isize;
                rest /= shape[d];
                p[0] += i * strides[0][d];
                p[1] += i * strides[1][d];
            }
            want.push(p);
        }
        let mut runs = Runs::new(shape, strides, offsets, start, len);
        let s = runs.inner_strides();
        let mut got = Vec::new();
        while let Some((p, n)) = runs.next_run() {
            assert!(n >= 1);
            for i in 0..n as isize {
                got.push([p[0] + i * s[0], p[1] + i * s[1]]);
            }
        }
        assert_eq!(got, want, "shape {shape:?} strides {strides:?} from {start} for {len}");
    }

    #[test]
    fn runs_cover_the_positions_in_c_order() {
        // contiguous against transposed, broadcast, flipped, extent-1 and empty axes, rank 0
        check(&[2, 3, 4], [&[12, 4, 1], &[1, 2, 6]], [0, 0], 0, 24);
        check(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]], [5, 7], 3, 17);
        check(&[5, 1, 7], [&[0, 9, 1], &[7, 7, 1]], [0, 0], 0, 35);
        check(&[5, 1, 7], [&[0, 9, 1], &[7, 7, 1]], [0, 0], 6, 22);
        check(&[4, 3], [&[-3, 1], &[3, 1]], [9, 0], 1, 11);
        check(&[3, 0, 2], [&[0, 2, 1], &[0, 2, 1]], [0, 0], 0, 0);
        check(&[], [&[], &[]], [4, 2], 0, 1);
        check(&[2, 2, 2, 2, 3], [&[24, 12, 6, 3, 1], &[1, 2, 4, 8, 16]], [0, 0], 5, 40);
        // a start past the end walks nothing
        check(&[2, 3], [&[3, 1], &[3, 1]], [0, 0], 6, 4);
    }

    #[test]
    fn axes_merge_only_where_every_layout_allows() {
        let r = Runs::new(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]], [0, 0], 0, 24);
        assert_eq!((r.shape.clone(), r.inner_strides()), (vec![24], [1, 1]));
        let r = Runs::new(&[2, 3, 4], [&[12, 4, 1], &[1, 2, 6]], [0, 0], 0, 24);
        assert_eq!(r.shape, vec![2, 3, 4]);
        let r = Runs::new(&[2, 3, 4], [&[12, 4, 1], &[1, 8, 2]], [0, 0], 0, 24);
        assert_eq!((r.shape.clone(), r.inner_strides()), (vec![2, 12], [1, 2]));
        let r = Runs::new(&[6, 1, 8], [&[0, 5, 1], &[8, 8, 1]], [0, 0], 0, 48);
        assert_eq!((r.shape.clone(), r.inner_strides()), (vec![6, 8], [1, 1]));
    }
}
