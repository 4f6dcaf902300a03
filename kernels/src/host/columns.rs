//! Sums down the columns of a row-major matrix (a bias's gradient: a sum over the leading axes of
//! a contiguous value) without gathering each column's strided terms: a block of adjacent columns
//! is summed at once, row by row, the lanes of the documented association kept per column. Each
//! column gets the bits the reduction kernel's own association gives it — term `i` of a chunk of
//! [`CHUNK`] into lane `i % 8`, the lanes' fixed tree, the chunks' pairwise tree — since every
//! column sees the same additions in the same order; only the loop order differs (across columns
//! instead of along one), which vectorises.

use super::eval::{Bound, Ptr};
use super::par::for_each;
use super::reduce::{Term, CHUNK};
use crate::kernels::Reduction;
use crate::prog::Node;
use crate::runs::Runs;
use crate::Dtype;

/// Columns summed together: two 512-bit vectors of `f32`.
const BLOCK: usize = 32;

/// A plain sum whose terms lie as the rows of a matrix: output `o`'s term `t` at element
/// `base + t·row + o`.
pub(crate) struct Columns {
    base: Ptr,
    dtype: Dtype,
    outputs: usize,
    terms: usize,
    row: isize,
    dst: (Ptr, isize),
}

impl Columns {
    /// The column form of a reduction of `bound` (loop axes: the `kept` outputs' axes, then the
    /// reduced ones) into `dsts`, where it has one: one plain `Sum` of an `f32` or `f64` operand
    /// into a destination of its dtype, the kept axes merging into one of stride 1, the reduced
    /// ones into one of any stride, and a block of columns for each of `threads` (1 where the
    /// call runs inline).
    pub(crate) fn of(
        bound: &Bound<'_>,
        kept: usize,
        reductions: &[Reduction],
        dsts: &[(Ptr, isize, Dtype)],
        threads: usize,
    ) -> Option<Columns> {
        let prog = bound.prog;
        if reductions != [Reduction::Sum] || prog.outputs.len() != 1 || dsts.len() != 1 {
            return None;
        }
        let Node::Load(j) = prog.nodes[prog.outputs[0].0].0 else { return None };
        let s = &bound.sources[j];
        if s.padding.is_some() || !matches!(s.dtype, Dtype::F32 | Dtype::F64) || dsts[0].2 != s.dtype {
            return None;
        }
        let (shape, strides) = (s.layout.shape(), s.layout.strides());
        let merged = |lo: usize, hi: usize| -> Option<(usize, isize)> {
            let n: usize = shape[lo..hi].iter().product();
            let mut runs = Runs::new(&shape[lo..hi], [&strides[lo..hi]], [0], 0, n);
            let [stride] = runs.inner_strides();
            // one run covers the whole block of axes: they merge into one axis
            match runs.next_run() {
                Some((_, len)) if len == n => Some((n, stride)),
                None => Some((0, 0)),
                _ => None,
            }
        };
        let (outputs, ostride) = merged(0, kept)?;
        let (terms, row) = merged(kept, shape.len())?;
        // under 2 outputs or with contiguous terms the row-wise paths are already direct
        // blocks of columns are its only split: fewer blocks than threads stay on the kernel's
        // paths, which also split the terms
        if outputs < 2 || ostride != 1 || terms == 0 || row == 1 || outputs.div_ceil(BLOCK) < threads {
            return None;
        }
        let base = Ptr(s.base.at(s.dtype, s.layout.offset()));
        Some(Columns { base, dtype: s.dtype, outputs, terms, row, dst: (dsts[0].0, dsts[0].1) })
    }

    /// Writes every column's sum, blocks of columns over the pool unless `inline`.
    ///
    /// # Safety
    /// The door's claims are held: the operand readable at every term, the destination
    /// writable at its `outputs` elements and written by nothing else.
    pub(crate) unsafe fn run(&self, inline: bool) {
        let blocks = self.outputs.div_ceil(BLOCK);
        match self.dtype {
            // SAFETY: the caller's contract; each block writes its own columns.
            Dtype::F32 => for_each(inline, blocks, 1, |b| unsafe { self.block::<f32>(b) }),
            // SAFETY: as above.
            Dtype::F64 => for_each(inline, blocks, 1, |b| unsafe { self.block::<f64>(b) }),
            d => unreachable!("column sums of {d}"),
        }
    }

    /// The sums of block `b`'s columns.
    ///
    /// # Safety
    /// As [`Columns::run`].
    unsafe fn block<T: Term>(&self, b: usize) {
        let (c0, c1) = (b * BLOCK, ((b + 1) * BLOCK).min(self.outputs));
        let width = c1 - c0;
        let src = self.base.0.cast::<T>().cast_const();
        let chunks = self.terms.div_ceil(CHUNK);
        let mut sums = vec![[T::ZERO; BLOCK]; chunks];
        for (k, sum) in sums.iter_mut().enumerate() {
            let mut lanes = [[T::ZERO; BLOCK]; 8];
            for i in 0..CHUNK.min(self.terms - k * CHUNK) {
                let t = (k * CHUNK + i) as isize;
                // SAFETY: the caller's contract: term t of columns c0..c1 lies in the operand.
                let row = unsafe { std::slice::from_raw_parts(src.offset(t * self.row + c0 as isize), width) };
                let lane = &mut lanes[i % 8];
                if width == BLOCK {
                    for (l, &x) in lane.iter_mut().zip(row) {
                        *l = l.add(x);
                    }
                } else {
                    for (l, &x) in lane[..width].iter_mut().zip(row) {
                        *l = l.add(x);
                    }
                }
            }
            // the lanes' tree of the reduction kernel's chunk loop
            for (c, s) in sum.iter_mut().enumerate().take(width) {
                let l = |k: usize| lanes[k][c];
                *s = (l(0).add(l(1)).add(l(2).add(l(3)))).add(l(4).add(l(5)).add(l(6).add(l(7))));
            }
        }
        let dst = self.dst.0 .0.cast::<T>();
        let mut column = vec![T::ZERO; chunks];
        for c in 0..width {
            column.iter_mut().zip(&sums).for_each(|(x, s)| *x = s[c]);
            let v = super::reduce::tree_by(&column, &|a: T, b: T| a.add(b)).unwrap_or(T::ZERO);
            // SAFETY: the caller's contract: output c0 + c is this block's alone.
            unsafe { dst.offset(self.dst.1 + (c0 + c) as isize).write(v) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prog::Prog;
    use crate::{Array, Move};
    use nx_mesh::{Device, DeviceKind};

    const DEV: Device = Device { kind: DeviceKind::Sim, ordinal: 0, rank: 0 };

    /// Whether a plain sum of `a` over its leading `lead` axes into a destination of `dst`
    /// takes the column path on `threads`.
    fn takes(a: &Array<f32>, lead: usize, dst: Dtype, threads: usize, reductions: &[Reduction]) -> bool {
        let mut p = Prog::new(&[Dtype::F32]);
        let l = p.load(0);
        p.output(l);
        let rank = a.shape().len();
        let perm: Vec<usize> = (lead..rank).chain(0..lead).collect();
        let bound = Bound::new(&p, a.shape(), &perm, &[a], &[None]).unwrap();
        let out = [(Ptr(std::ptr::null_mut()), 0, dst)];
        Columns::of(&bound, rank - lead, reductions, &out, threads).is_some()
    }

    #[test]
    fn the_column_path_takes_matrices_of_rows_and_nothing_else() {
        let a = Array::<f32>::zeros(DEV, &[9, 4, 70]).unwrap();
        let sum = [Reduction::Sum];
        assert!(takes(&a, 2, Dtype::F32, 1, &sum), "a bias's gradient: two leading axes");
        assert!(takes(&a, 2, Dtype::F32, 3, &sum), "three blocks of columns for three threads");
        assert!(!takes(&a, 2, Dtype::F32, 4, &sum), "fewer blocks than threads");
        assert!(!takes(&a, 2, Dtype::F64, 1, &sum), "another destination dtype");
        assert!(!takes(&a, 2, Dtype::F32, 1, &[Reduction::Max]), "not a sum");
        assert!(!takes(&a, 3, Dtype::F32, 1, &sum), "one output");
        // the last axis reduced: its terms contiguous, the row paths' case
        let t = a.apply(&Move::Permute(vec![2, 0, 1])).unwrap().unwrap();
        assert!(!takes(&t, 1, Dtype::F32, 1, &sum), "terms at stride 1");
        // kept axes that do not merge into one of stride 1
        let s = a.apply(&Move::Slice { axis: 2, start: None, stop: None, step: 2 }).unwrap().unwrap();
        assert!(!takes(&s, 2, Dtype::F32, 1, &sum), "columns at stride 2");
        // rows at twice the stride still do; reduced axes that do not merge into one do not
        let r = a.apply(&Move::Slice { axis: 1, start: None, stop: None, step: 2 }).unwrap().unwrap();
        assert!(takes(&r, 2, Dtype::F32, 1, &sum), "rows at twice the stride");
        let r = a.apply(&Move::Slice { axis: 0, start: None, stop: None, step: 2 }).unwrap().unwrap();
        assert!(!takes(&r, 2, Dtype::F32, 1, &sum), "reduced axes of strides 560 and 70");
    }
}
