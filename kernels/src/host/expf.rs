//! The maps' exponential: `Exp` and `Sigmoid` of `f32` (and of the halves, computed in `f32`)
//! through [`exp_f32`], written in plain multiplies, adds and bit operations so that it
//! vectorises in every build of a map's loop (SSE2, AVX2, AVX-512) and gives the same bits in
//! each, where libm's `expf` is a call per element (it was 8% of a training step). `f64` keeps
//! libm's `exp`. The CUDA library's prelude holds the same operations in C (`nx_expf`,
//! `cuda::codegen::PRELUDE`), so a GPU gives these bits too.

/// `log₂ e`, and `1.5 · 2²³`: adding it rounds an `f32` of magnitude below 2²² to an integer.
pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(super) const ROUND: f32 = 12_582_912.0;
/// `ln 2` in two parts (Cody and Waite): `n · LN2_HI` is exact for the `n` that reach it.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial, highest degree first: `exp(r) ≈ 1 + r + r²·p(r)`.
pub(super) const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// Below `LOW`, `exp` is under half the least subnormal: +0.
const LOW: f32 = -104.0;
/// The greatest `f32` whose `exp` is finite; above it, +∞.
const HIGH: f32 = 88.722_83;

/// `exp(x)` rounded to `f32`: `x = n ln 2 + r` (`n` the integer nearest `x / ln 2`), Cephes'
/// degree-6 polynomial on `r`, scaled by `2ⁿ` as two powers of two (the first product exact, so
/// a subnormal result is rounded once). Within 1 ulp of `exp` (0.96 at most over 2·10⁶ points of
/// the whole range, subnormal results included, in this module's test), +0 below −104, +∞ above
/// 88.72283, the quiet NaN (`0x7FC00000`) for a NaN. No fused multiply-adds: the same bits
/// whatever the CPU and however the loop is vectorised.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + *c;
    }
    let y = (p * (r * r) + r) + 1.0;
    // n as an integer: where the result is kept, `t` lies in [2²³, 2²⁴) and its significand's
    // low bits hold n + 2²² (no float-to-integer conversion, which does not vectorise as Rust
    // defines it); clamped to [−150, 128] as an integer (elsewhere the result is replaced below)
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32).clamp(-150, 128);
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let pow = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let v = (y * pow(n1)) * pow(n2);
    // a NaN is the quiet one, whatever sign the operations left it (LLVM does not fix which
    // operand's NaN an operation passes on)
    if x < LOW {
        0.0
    } else if x > HIGH {
        f32::INFINITY
    } else if x.is_nan() {
        f32::NAN
    } else {
        v
    }
}

/// The exponential the maps' evaluators compute, by float type.
pub(crate) trait MapExp: Copy {
    /// `exp(self)`.
    fn map_exp(self) -> Self;
}

impl MapExp for f32 {
    #[inline(always)]
    fn map_exp(self) -> f32 {
        exp_f32(self)
    }
}

impl MapExp for f64 {
    #[inline(always)]
    fn map_exp(self) -> f64 {
        self.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ulps of `got` from `want` (exact in f64), the ulp of `want`'s binade in `f32`, at least the
    /// least subnormal's.
    fn ulps(got: f32, want: f64) -> f64 {
        let e = want.abs().log2().floor().max(-126.0);
        let ulp = 2f64.powf(e - 23.0);
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_one_ulp_over_its_whole_range() {
        let mut worst = (0.0, 0.0f32);
        for k in 0..=2_000_000u32 {
            let x = -105.0 + k as f32 * (195.0 / 2_000_000.0);
            // the reference: f64's exp, correctly rounded to well under an f32 ulp
            let want = f64::from(x).exp();
            let got = exp_f32(x);
            if want > f64::from(f32::MAX) * (1.0 + 2f64.powi(-25)) {
                assert_eq!(got, f32::INFINITY, "exp({x})");
                continue;
            }
            let d = ulps(got, want);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 1.0, "exp({}) is {} ulps off", worst.1, worst.0);
        // each end: the last finite result, the first subnormal ones, zero
        assert!(exp_f32(HIGH).is_finite() && exp_f32(HIGH) > 3.4e38);
        assert_eq!(exp_f32(f32::from_bits(HIGH.to_bits() + 1)), f32::INFINITY);
        assert_eq!(exp_f32(-103.28), f32::from_bits(1), "exp(−103.28) ≈ 1.3e-45: the least subnormal");
        assert_eq!(exp_f32(-104.0), 0.0);
        for (x, want) in [
            (0.0, 1.0),
            (-0.0, 1.0),
            (f32::NEG_INFINITY, 0.0),
            (f32::INFINITY, f32::INFINITY),
            (-1e30, 0.0),
            (1e30, f32::INFINITY),
        ] {
            assert_eq!(exp_f32(x), want, "exp({x})");
        }
        assert_eq!((exp_f32(f32::NAN).to_bits(), exp_f32(-f32::NAN).to_bits()), (0x7FC0_0000, 0x7FC0_0000));
        assert_eq!(exp_f32(1.0), std::f32::consts::E);
    }

    #[test]
    fn the_cuda_prelude_holds_the_rust_constants() {
        // the C literals are the Rust constants' decimal forms: each parses to the same f32
        for (c, v) in [
            ("1.44269502f", LOG2E),
            ("0.693359375f", LN2_HI),
            ("-2.12194442e-4f", LN2_LO),
            ("1.98756912e-4f", P[0]),
            ("1.39819994e-3f", P[1]),
            ("8.33345205e-3f", P[2]),
            ("4.16657962e-2f", P[3]),
            ("1.66666657e-1f", P[4]),
            ("-104.0f", LOW),
            ("88.7228317f", HIGH),
        ] {
            assert!(crate::cuda::codegen::PRELUDE.contains(c), "{c}");
            let parsed: f32 = c.trim_end_matches('f').parse().unwrap();
            assert_eq!(parsed.to_bits(), v.to_bits(), "{c}");
        }
    }
}
