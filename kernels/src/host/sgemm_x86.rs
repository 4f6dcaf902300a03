//! The x86 tiles of nx's `f32` product: AVX-512 (12 × 32) and AVX2 (6 × 16), reading `A` from a
//! packed panel or where it lies ([`Src`]), and the AVX-512 tile's prefetches and masked stores
//! (which the bf16 kits share).

use std::arch::x86_64::*;

/// Asks for the first `mv` destination rows of a 12 × 32 tile in the first cache level.
///
/// # Safety
/// The CPU has AVX-512F (prefetches touch no memory).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn prefetch(dst: &[*mut f32; 12], mv: usize) {
    for &d in dst.iter().take(mv) {
        _mm_prefetch::<_MM_HINT_T0>(d.cast());
        _mm_prefetch::<_MM_HINT_T0>(d.wrapping_add(16).cast());
    }
}

/// Adds (`add`) or stores a 12 × 32 tile's accumulators into the first `mv` rows' first `nv`
/// columns at `dst`, by masked loads and stores.
///
/// # Safety
/// `dst[..mv]` point at `nv` writable elements each; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store(acc: &[[__m512; 2]; 12], dst: &[*mut f32; 12], mv: usize, nv: usize, add: bool) {
    let lanes = if nv >= 32 { u32::MAX } else { (1u32 << nv) - 1 };
    let (m0, m1) = ((lanes & 0xffff) as __mmask16, (lanes >> 16) as __mmask16);
    for (r, s) in acc.iter().enumerate().take(mv) {
        // the second half's address may lie past the row's end, where its mask is empty
        let (d0, d1) = (dst[r], dst[r].wrapping_add(16));
        let (mut v0, mut v1) = (s[0], s[1]);
        // SAFETY: the caller's contract: masked lanes lie in the row.
        unsafe {
            if add {
                v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, d0), v0);
                v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, d1), v1);
            }
            _mm512_mask_storeu_ps(d0, m0, v0);
            _mm512_mask_storeu_ps(d1, m1, v1);
        }
    }
}

/// How far ahead of its loads the AVX-512 tile asks for the `B` panel, in rows of the panel.
const PREFETCH_ROWS: isize = 24;

/// Where a tile reads `A`: element `(r, p)` of its rows.
pub(crate) trait Src: Copy {
    /// Row `r`'s entry at contracting index `p`.
    ///
    /// # Safety
    /// It is live.
    unsafe fn at(self, p: usize, r: usize) -> f32;
}

/// A packed panel: `MR` rows side by side, one contracting index at a time.
#[derive(Clone, Copy)]
pub(crate) struct Packed<const MR: usize>(pub(crate) *const f32);

impl<const MR: usize> Src for Packed<MR> {
    #[inline(always)]
    unsafe fn at(self, p: usize, r: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(p * MR + r) }
    }
}

/// `A`'s rows read in place: row `r` from `.0[r]`, its contracting indices at stride 1.
#[derive(Clone, Copy)]
pub(crate) struct InPlace<'a, const MR: usize>(pub(crate) &'a [*const f32; MR]);

impl<const MR: usize> Src for InPlace<'_, MR> {
    #[inline(always)]
    unsafe fn at(self, p: usize, r: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *self.0[r].add(p) }
    }
}

/// `A`'s rows side by side in place: row `r`'s entry at contracting index `p` at
/// `.0 + p · .1 + r` (a transposed `A`).
#[derive(Clone, Copy)]
pub(crate) struct Across(pub(crate) *const f32, pub(crate) isize);

impl Src for Across {
    #[inline(always)]
    unsafe fn at(self, p: usize, r: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *self.0.offset(p as isize * self.1 + r as isize) }
    }
}

/// [`Across`] of a tile's first `.2` rows: the rows past them read row 0 again.
#[derive(Clone, Copy)]
pub(crate) struct Short(pub(crate) *const f32, pub(crate) isize, pub(crate) usize);

impl Src for Short {
    #[inline(always)]
    unsafe fn at(self, p: usize, r: usize) -> f32 {
        let r = if r < self.2 { r } else { 0 };
        // SAFETY: the caller's contract.
        unsafe { *self.0.offset(p as isize * self.1 + r as isize) }
    }
}

/// The AVX-512 tile: 12 rows × 32 columns in 24 registers; `B`'s row `p` (32 entries) at
/// `b.ptr + p · b.ld` (a packed panel's `ld` is 32; `B`'s own rows where it is read in place).
///
/// # Safety
/// As [`super::tile`], on a CPU with AVX-512F; `a` holds 12 rows of `kc` entries, `b` `kc` rows
/// of 32 live entries at stride `b.ld`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile512<S: Src>(
    kc: usize,
    a: S,
    b: super::Panel<f32>,
    dst: &[*mut f32; 12],
    mv: usize,
    nv: usize,
    add: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; 12];
    // SAFETY: the caller's contract: 12 rows of kc entries of A, kc rows of 32 entries of B at
    // stride b.ld.
    unsafe {
        if add {
            prefetch(dst, mv);
        }
        for p in 0..kc {
            let row = b.ptr.offset(p as isize * b.ld);
            // the B panel streams from the second cache level: ask for its lines ahead
            let ahead = row.wrapping_offset(PREFETCH_ROWS * b.ld);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(16).cast());
            let b0 = _mm512_loadu_ps(row);
            let b1 = _mm512_loadu_ps(row.add(16));
            for (r, s) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(a.at(p, r));
                s[0] = _mm512_fmadd_ps(x, b0, s[0]);
                s[1] = _mm512_fmadd_ps(x, b1, s[1]);
            }
        }
        store(&acc, dst, mv, nv, add);
    }
}

/// The AVX2 tile: 6 rows × 16 columns in 12 registers; `B`'s row `p` (16 entries) at
/// `b.ptr + p · b.ld`.
///
/// # Safety
/// As [`super::tile`], on a CPU with AVX2 and FMA; `b` holds `kc` rows of 16 live entries at
/// stride `b.ld`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile256<S: Src>(
    kc: usize,
    a: S,
    b: super::Panel<f32>,
    dst: &[*mut f32; 12],
    mv: usize,
    nv: usize,
    add: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; 6];
    // SAFETY: the caller's contract: 6 rows of kc entries of A, kc rows of 16 entries of B at
    // stride b.ld.
    unsafe {
        for p in 0..kc {
            let row = b.ptr.offset(p as isize * b.ld);
            let b0 = _mm256_loadu_ps(row);
            let b1 = _mm256_loadu_ps(row.add(8));
            for (r, s) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(a.at(p, r));
                s[0] = _mm256_fmadd_ps(x, b0, s[0]);
                s[1] = _mm256_fmadd_ps(x, b1, s[1]);
            }
        }
        for (r, s) in acc.iter().enumerate().take(mv) {
            let d = dst[r];
            if nv == 16 {
                let (mut v0, mut v1) = (s[0], s[1]);
                if add {
                    v0 = _mm256_add_ps(_mm256_loadu_ps(d), v0);
                    v1 = _mm256_add_ps(_mm256_loadu_ps(d.add(8)), v1);
                }
                _mm256_storeu_ps(d, v0);
                _mm256_storeu_ps(d.add(8), v1);
            } else {
                let mut t = [0f32; 16];
                _mm256_storeu_ps(t.as_mut_ptr(), s[0]);
                _mm256_storeu_ps(t.as_mut_ptr().add(8), s[1]);
                for (j, &x) in t.iter().enumerate().take(nv) {
                    let o = d.add(j);
                    *o = if add { *o + x } else { x };
                }
            }
        }
    }
}
