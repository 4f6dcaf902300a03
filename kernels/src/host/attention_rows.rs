//! The attention kernel's row loops: the greatest scaled score of a row, then `exp(s·x − m)` in
//! place and its sum. `f32`'s run in AVX-512 or AVX2 where the library's level allows; every path computes
//! the same operations in the same 16 lanes (element `j` into lane `j mod 16`), so the bits are
//! the same on every CPU.

use crate::Simd;

/// Lanes of the row loops.
const LANES: usize = 16;

/// `exp(x)` for `f32`, branch-free so that a row's loop vectorizes: `x = n ln 2 + r` (`n` the
/// integer nearest `x / ln 2`, `ln 2` in two parts), Cephes' degree-6 polynomial on `r`, scaled
/// by `2ⁿ` exactly (as two powers of two, each normal); within 2 ulps of `exp` where the result
/// is normal, +0 below −87.33 (the result turns subnormal below −87.34), +∞ above 88.72, NaN
/// for NaN. Fused
/// multiply-adds where written (`mul_add`), so the same bits whatever the CPU: the vector loops
/// compute the same operations.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    let n = x.mul_add(LOG2E, ROUND) - ROUND;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // n within [−126, 128] (it is there wherever the result is kept), split in two halves
    let ni = (n as i32).clamp(-126, 128);
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let pow = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let v = y * pow(n1) * pow(n2);
    if x < LOW {
        0.0
    } else if x > HIGH {
        f32::INFINITY
    } else {
        v
    }
}

// the maps' exp's reduction and polynomial (this one keeps fused multiply-adds and flushes
// subnormal results: its vector loops are written with intrinsics)
use super::expf::{LN2_HI, LN2_LO, LOG2E, P, ROUND};
/// Below `LOW` the result would be subnormal: +0; above `HIGH`, +∞.
const LOW: f32 = -87.33;
const HIGH: f32 = 88.72;

/// A float of the row loops: its constants and its `exp` ([`exp_f32`] for `f32`, the library's
/// for `f64`).
pub(super) trait RowFloat:
    Copy + PartialOrd + std::ops::Mul<Output = Self> + std::ops::Neg<Output = Self> + std::ops::Add<Output = Self>
{
    const NEG_INF: Self;
    const ZERO: Self;
    fn exp_of(self) -> Self;
    /// `self · a + b`, rounded once.
    fn fma(self, a: Self, b: Self) -> Self;
}

impl RowFloat for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    const ZERO: f32 = 0.0;
    #[inline(always)]
    fn exp_of(self) -> f32 {
        exp_f32(self)
    }
    #[inline(always)]
    fn fma(self, a: f32, b: f32) -> f32 {
        self.mul_add(a, b)
    }
}

impl RowFloat for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    const ZERO: f64 = 0.0;
    #[inline(always)]
    fn exp_of(self) -> f64 {
        self.exp()
    }
    #[inline(always)]
    fn fma(self, a: f64, b: f64) -> f64 {
        self.mul_add(a, b)
    }
}

/// The sum of 16 lanes, as a balanced tree: `(l0+l1)+(l2+l3)`, and so on up.
#[inline(always)]
fn sum16<T: RowFloat>(l: &[T; LANES]) -> T {
    let q = |i: usize| (l[i] + l[i + 1]) + (l[i + 2] + l[i + 3]);
    (q(0) + q(4)) + (q(8) + q(12))
}

/// The greatest of `s·x` over `row` (NaNs skipped; −∞ for none), without vector instructions.
#[inline(always)]
pub(super) fn max_scaled_plain<T: RowFloat>(row: &[T], s: T) -> T {
    let mut lanes = [T::NEG_INF; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            let x = c[k] * s;
            // NaN compares false: skipped
            if x > lanes[k] {
                lanes[k] = x;
            }
        }
    }
    let mut m = lanes.iter().fold(T::NEG_INF, |a, &b| if b > a { b } else { a });
    for &x in chunks.remainder() {
        let x = x * s;
        if x > m {
            m = x;
        }
    }
    m
}

/// Replaces each `x` of `row` by `exp(s·x − m)` (one fused multiply-add) and answers their sum in 16 lanes (element `j` into lane `j mod 16`, the lanes added by [`sum16`],
/// then the tail in order), without vector instructions.
#[inline(always)]
pub(super) fn exp_row_plain<T: RowFloat>(row: &mut [T], s: T, m: T) -> T {
    let mut l = [T::ZERO; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            c[k] = c[k].fma(s, -m).exp_of();
            l[k] = l[k] + c[k];
        }
    }
    let mut sum = sum16(&l);
    for x in chunks.into_remainder() {
        *x = x.fma(s, -m).exp_of();
        sum = sum + *x;
    }
    sum
}

/// The row loops of each accumulator: `f32`'s in AVX-512 or AVX2 where the level allows it, the
/// same bits as the plain loops.
pub(super) trait RowOps: Sized {
    /// The greatest of `s·x` over `row`: NaNs skipped, −∞ for none.
    fn max_scaled(simd: Simd, row: &[Self], s: Self) -> Self;
    /// Replaces each `x` of `row` by `exp(s·x − m)`; answers their sum, in 16 lanes.
    fn exp_row(simd: Simd, row: &mut [Self], s: Self, m: Self) -> Self;
}

impl RowOps for f32 {
    #[inline(always)]
    fn max_scaled(simd: Simd, row: &[f32], s: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            if simd.avx512() {
                // SAFETY: the CPU has AVX-512F and FMA.
                return unsafe { simd512::max_scaled(row, s) };
            }
            if simd.avx2() {
                // SAFETY: the CPU has AVX2 and FMA.
                return unsafe { simd256::max_scaled(row, s) };
            }
        }
        max_scaled_plain(row, s)
    }
    #[inline(always)]
    fn exp_row(simd: Simd, row: &mut [f32], s: f32, m: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            if simd.avx512() {
                // SAFETY: the CPU has AVX-512F and FMA.
                return unsafe { simd512::exp_row(row, s, m) };
            }
            if simd.avx2() {
                // SAFETY: the CPU has AVX2 and FMA.
                return unsafe { simd256::exp_row(row, s, m) };
            }
        }
        exp_row_plain(row, s, m)
    }
}

impl RowOps for f64 {
    #[inline(always)]
    fn max_scaled(_: Simd, row: &[f64], s: f64) -> f64 {
        max_scaled_plain(row, s)
    }
    #[inline(always)]
    fn exp_row(_: Simd, row: &mut [f64], s: f64, m: f64) -> f64 {
        exp_row_plain(row, s, m)
    }
}

/// The `f32` row loops in AVX2: the plain loops' operations, 16 lanes as two registers.
#[cfg(target_arch = "x86_64")]
mod simd256 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn max_scaled(row: &[f32], s: f32) -> f32 {
        let sv = _mm256_set1_ps(s);
        let (mut lo, mut hi) = (_mm256_set1_ps(f32::NEG_INFINITY), _mm256_set1_ps(f32::NEG_INFINITY));
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            // SAFETY: `c` holds 16 elements.
            unsafe {
                // x > lane ? x : lane (a NaN x keeps the lane), as the plain loop
                lo = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), sv), lo);
                hi = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr().add(8)), sv), hi);
            }
        }
        let mut l = [0f32; LANES];
        // SAFETY: `l` holds 16 elements.
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), lo);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), hi);
        }
        let mut m = l.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        for &x in chunks.remainder() {
            let x = x * s;
            if x > m {
                m = x;
            }
        }
        m
    }

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_row(row: &mut [f32], s: f32, m: f32) -> f32 {
        let (sv, mv) = (_mm256_set1_ps(s), _mm256_set1_ps(m));
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut chunks = row.chunks_exact_mut(LANES);
        for c in &mut chunks {
            // SAFETY: `c` holds 16 elements.
            unsafe {
                let p = c.as_mut_ptr();
                let a = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(p), sv, mv));
                let b = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(p.add(8)), sv, mv));
                _mm256_storeu_ps(p, a);
                _mm256_storeu_ps(p.add(8), b);
                lo = _mm256_add_ps(lo, a);
                hi = _mm256_add_ps(hi, b);
            }
        }
        let mut l = [0f32; LANES];
        // SAFETY: `l` holds 16 elements.
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), lo);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), hi);
        }
        let mut sum = super::sum16(&l);
        for x in chunks.into_remainder() {
            *x = super::exp_f32(x.mul_add(s, -m));
            sum += *x;
        }
        sum
    }

    /// [`super::exp_f32`] of eight lanes.
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        use super::{HIGH, LN2_HI, LN2_LO, LOG2E, LOW, P, ROUND};
        let c = |v: f32| _mm256_set1_ps(v);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(x, c(LOG2E), c(ROUND)), c(ROUND));
        let r = _mm256_fnmadd_ps(n, c(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, c(LN2_LO), r);
        let mut p = c(P[0]);
        for k in &P[1..] {
            p = _mm256_fmadd_ps(p, r, c(*k));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), c(1.0));
        // truncation as `as i32`: a NaN's i32::MIN clamped as the plain loop's 0 would be (the
        // result is NaN either way)
        let ni =
            _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(-126)), _mm256_set1_epi32(128));
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let pow =
            |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127))));
        let v = _mm256_mul_ps(_mm256_mul_ps(y, pow(n1)), pow(n2));
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(x, c(LOW));
        let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x, c(HIGH));
        let v = _mm256_andnot_ps(low, v);
        _mm256_blendv_ps(v, c(f32::INFINITY), high)
    }
}

/// The `f32` row loops in AVX-512: the plain loops' operations, 16 lanes in one register.
#[cfg(target_arch = "x86_64")]
mod simd512 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// # Safety
    /// The CPU has AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn max_scaled(row: &[f32], s: f32) -> f32 {
        let sv = _mm512_set1_ps(s);
        let mut lanes = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            // SAFETY: `c` holds 16 elements.
            // x > lane ? x : lane (a NaN x keeps the lane), as the plain loop
            lanes = unsafe { _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), sv), lanes) };
        }
        let mut l = [0f32; LANES];
        // SAFETY: `l` holds 16 elements.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), lanes) };
        let mut m = l.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        for &x in chunks.remainder() {
            let x = x * s;
            if x > m {
                m = x;
            }
        }
        m
    }

    /// # Safety
    /// The CPU has AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn exp_row(row: &mut [f32], s: f32, m: f32) -> f32 {
        let (sv, mv) = (_mm512_set1_ps(s), _mm512_set1_ps(m));
        let mut lanes = _mm512_setzero_ps();
        let mut chunks = row.chunks_exact_mut(LANES);
        for c in &mut chunks {
            // SAFETY: `c` holds 16 elements.
            unsafe {
                let e = exp16(_mm512_fmsub_ps(_mm512_loadu_ps(c.as_ptr()), sv, mv));
                _mm512_storeu_ps(c.as_mut_ptr(), e);
                lanes = _mm512_add_ps(lanes, e);
            }
        }
        let mut l = [0f32; LANES];
        // SAFETY: `l` holds 16 elements.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), lanes) };
        let mut sum = super::sum16(&l);
        for x in chunks.into_remainder() {
            *x = super::exp_f32(x.mul_add(s, -m));
            sum += *x;
        }
        sum
    }

    /// [`super::exp_f32`] of sixteen lanes; the scaling by `2ⁿ` one `vscalefps` (exact where
    /// the result is normal, as the plain loop's two products).
    #[target_feature(enable = "avx512f,fma")]
    fn exp16(x: __m512) -> __m512 {
        use super::{HIGH, LN2_HI, LN2_LO, LOG2E, LOW, P, ROUND};
        let c = |v: f32| _mm512_set1_ps(v);
        let n = _mm512_sub_ps(_mm512_fmadd_ps(x, c(LOG2E), c(ROUND)), c(ROUND));
        let r = _mm512_fnmadd_ps(n, c(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, c(LN2_LO), r);
        let mut p = c(P[0]);
        for k in &P[1..] {
            p = _mm512_fmadd_ps(p, r, c(*k));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), c(1.0));
        let v = _mm512_scalef_ps(y, n);
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, c(LOW));
        let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, c(HIGH));
        let v = _mm512_mask_blend_ps(low, v, c(0.0));
        _mm512_mask_blend_ps(high, v, c(f32::INFINITY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_and_its_vector_loops_give_the_plain_bits() {
        // the whole range kept, both ends included (2ⁿ of n = 128 near the top)
        for k in 0..=200_000 {
            let x = LOW + k as f32 * ((HIGH - LOW) / 200_000.0);
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            let ulp = f64::from(f32::EPSILON) * want;
            assert!((f64::from(got) - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, want {want}");
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(88.7) > 3.2e38 && exp_f32(88.7).is_finite(), "{}", exp_f32(88.7));
        // bits, every NaN as one (a NaN's payload is whichever operand the compiler put first)
        let one = |x: f32| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() };
        let bits = |r: &[f32]| r.iter().map(|&x| one(x)).collect::<Vec<_>>();
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 64, 127, 128, 200] {
            // scores over the whole range: a NaN, ±∞, −0, past exp's ends
            let mut row: Vec<f32> = (0..len).map(|i| ((i * 7919 % 211) as f32 - 105.0) * 0.97).collect();
            let specials: &[(usize, f32)] = match len {
                127 => &[(3, f32::NAN), (16, -0.0), (40, 300.0)],
                200 => &[(5, f32::INFINITY), (6, f32::NEG_INFINITY)],
                _ => &[],
            };
            for &(at, v) in specials {
                row[at] = v;
            }
            let s = 0.9f32;
            let mp = max_scaled_plain(&row, s);
            let mut plain = row.clone();
            let sp = exp_row_plain(&mut plain, s, mp);
            // the naive loop: the same operations one element at a time, the lanes as documented
            let mut naive_m = f32::NEG_INFINITY;
            let mut lanes = [0f32; LANES];
            let mut naive = row.clone();
            for x in &row {
                if x * s > naive_m {
                    naive_m = x * s;
                }
            }
            let whole = len / LANES * LANES;
            for (j, x) in naive.iter_mut().enumerate() {
                *x = exp_f32(x.mul_add(s, -naive_m));
                if j < whole {
                    lanes[j % LANES] += *x;
                }
            }
            let q = |i: usize| (lanes[i] + lanes[i + 1]) + (lanes[i + 2] + lanes[i + 3]);
            let naive_sum = naive[whole..].iter().fold((q(0) + q(4)) + (q(8) + q(12)), |a, &x| a + x);
            assert_eq!((one(mp), one(sp), bits(&plain)), (one(naive_m), one(naive_sum), bits(&naive)));
            for simd in Simd::available_levels() {
                let mut a = row.clone();
                let m = <f32 as RowOps>::max_scaled(simd, &a, s);
                let sum = <f32 as RowOps>::exp_row(simd, &mut a, s, m);
                assert_eq!((one(m), one(sum), bits(&a)), (one(mp), one(sp), bits(&plain)), "{simd} {len}");
            }
        }
    }
}
