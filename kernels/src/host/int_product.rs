//! The integer matrix product, wrapping: `dst[b] (+)= lhs[b] · rhs[b]` in `i32` or `i64`.
//!
//! Integer sums are exact modulo 2^w whatever their order, so any tiling gives the same bits on
//! any number of threads. Rows are cut into tasks of [`ROWS`]; each task walks `rhs` in tiles of
//! [`KT`] × [`NT`] (a tile stays in the core's L2 while the task's rows stream past it) and adds
//! `a[r, k] · rhs[k, tile]` to the row's outputs, a loop the compiler vectorises, built for
//! AVX-512, AVX2 and the baseline and picked at run time.

use rayon::prelude::*;

use super::contract::{Dims, View};
use super::eval::Ptr;
use crate::{Element, Simd};

/// Rows of the output per task.
const ROWS: usize = 32;
/// Contracting indices per tile of `rhs`.
const KT: usize = 256;
/// Columns per tile of `rhs`.
const NT: usize = 512;

/// An integer accumulator: wrapping multiply-add.
pub(crate) trait Wrapping: Element {
    /// `self + a · b`, wrapping.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

impl Wrapping for i32 {
    #[inline(always)]
    fn mul_add(self, a: i32, b: i32) -> i32 {
        self.wrapping_add(a.wrapping_mul(b))
    }
}

impl Wrapping for i64 {
    #[inline(always)]
    fn mul_add(self, a: i64, b: i64) -> i64 {
        self.wrapping_add(a.wrapping_mul(b))
    }
}

crate::simd_fn! {
    /// One task's rows: `c [rows, n] += a [rows, k] · b [k, n]`, `b` C-contiguous rows of `n`,
    /// built for the level.
    ///
    /// # Safety
    /// `a` addresses `rows × k` Ts through strides `(sr, sk)` and `b` `k × n` Ts in C order.
    unsafe fn rows<T: Wrapping>(simd: Simd, c: &mut [T], n: usize, k: usize, a: *const T, sr: isize, sk: isize, b: *const T) {
        let rows = c.len() / n;
        for n0 in (0..n).step_by(NT) {
            let nw = NT.min(n - n0);
            for k0 in (0..k).step_by(KT) {
                let kw = KT.min(k - k0);
                for r in 0..rows {
                    let out = &mut c[r * n + n0..r * n + n0 + nw];
                    for kk in k0..k0 + kw {
                        // SAFETY: the caller's contract; r < rows, kk < k, n0 + nw <= n.
                        let (x, row) = unsafe {
                            (
                                *a.offset(r as isize * sr + kk as isize * sk),
                                std::slice::from_raw_parts(b.add(kk * n + n0), nw),
                            )
                        };
                        for (o, &y) in out.iter_mut().zip(row) {
                            *o = o.mul_add(x, y);
                        }
                    }
                }
            }
        }
    }
}

/// `dst[b] (+)= lhs[b] · rhs[b]` for every batch `b` (`add`: onto what `dst` holds), wrapping,
/// `dst` C-contiguous `(b, m, n)`.
///
/// # Safety
/// The views address valid `T`s over their `(b, m, k)` and `(b, k, n)` extents; `dst` holds `b·m·n` of them that
/// nothing else touches meanwhile.
pub(crate) unsafe fn int_product<T: Wrapping>(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool) {
    if d.m * d.n == 0 {
        return;
    }
    for bb in 0..d.b {
        let size = std::mem::size_of::<T>() as isize;
        let out = dst.0.wrapping_offset((bb * d.m * d.n) as isize * size).cast::<T>();
        // SAFETY: the caller's contract; batch bb of dst is this loop's alone.
        let c = unsafe { std::slice::from_raw_parts_mut(out, d.m * d.n) };
        if !add {
            c.fill(T::default());
        }
        let a = lhs.base.0.wrapping_offset((lhs.offset + bb as isize * lhs.strides[0]) * size).cast::<T>() as usize;
        let mut packed: Vec<T> = Vec::new();
        let b = if rhs.strides[2] == 1 && rhs.strides[1] == d.n as isize {
            rhs.base.0.wrapping_offset((rhs.offset + bb as isize * rhs.strides[0]) * size).cast::<T>() as usize
        } else {
            // SAFETY: the caller's contract.
            packed.extend(
                (0..d.k)
                    .flat_map(|kk| (0..d.n).map(move |col| (kk, col)))
                    .map(|(kk, col)| unsafe { rhs.load::<T>(bb, kk, col) }),
            );
            packed.as_ptr() as usize
        };
        let (sr, sk) = (lhs.strides[1], lhs.strides[2]);
        c.par_chunks_mut(ROWS * d.n).enumerate().for_each(|(t, chunk)| {
            let a = (a as *const T).wrapping_offset((t * ROWS) as isize * sr);
            // SAFETY: the caller's contract; this task's rows start at row t·ROWS; `b` holds
            // k rows of n in C order (`rhs` in place, or `packed`, alive until the loop ends).
            unsafe { rows(d.simd, chunk, d.n, d.k, a, sr, sk, b as *const T) }
        });
        drop(packed);
    }
}
