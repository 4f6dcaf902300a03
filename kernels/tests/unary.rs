//! The host library's real unary ops against independent f64 references (none calling the std
//! function the kernel calls), within their stated bounds, in f64 and f32.

use nx_kernels::prog::{Prog, UnOp};
use nx_kernels::{Answer, Array, Dtype, Host, Kernels};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// Every unary op of real floats.
const REAL_UNARY: [UnOp; 14] = [
    UnOp::Neg,
    UnOp::Abs,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Sqrt,
    UnOp::Rsqrt,
    UnOp::Tanh,
    UnOp::Sigmoid,
    UnOp::Sin,
    UnOp::Cos,
    UnOp::Erf,
    UnOp::Recip,
    UnOp::Floor,
    UnOp::Ceil,
];

/// The f64 references for the real unary ops, none calling the std function the kernel calls
/// (each within 2.3 ulps of the exact value on the inputs tested: measured, not proved):
/// exp by Cody–Waite reduction modulo ln 2 and a Taylor series, ln by the series of
/// 2·atanh((m − 1)/(m + 1)) on the mantissa, sin and cos by reduction modulo π/2 (three parts) and
/// Taylor series, tanh and the sigmoid from that exp (Taylor series of sinh and cosh below 1/2),
/// sqrt and rsqrt by Newton's method from a bit-level guess, erf by Simpson's rule; the exact ops
/// (neg, abs, recip, floor, ceil) are checked by their defining properties in
/// [`exact_unary_holds`] instead.
mod reference {
    // fdlibm's split constants, by their bits
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000); // ln 2's leading 32 bits: k·LN2_HI is exact
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76); // ln 2 − LN2_HI
                                                               // π/2 = PIO2_1 + PIO2_2 + PIO2_3 + O(2^-120); the first two hold 33 bits, so k·PIO2_1 and
                                                               // k·PIO2_2 are exact for |k| < 2^20
    const PIO2_1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000);
    const PIO2_2: f64 = f64::from_bits(0x3dd0_b461_1a60_0000);
    const PIO2_3: f64 = f64::from_bits(0x3ba3_198a_2e03_7073);

    /// 2^k for a normal result.
    fn pow2(k: i64) -> f64 {
        assert!((-1022..=1023).contains(&k), "2^{k} is not normal");
        f64::from_bits(((1023 + k) as u64) << 52)
    }

    pub fn exp(x: f64) -> f64 {
        if x.is_nan() {
            return x;
        }
        if x > 709.78 {
            return f64::INFINITY;
        }
        if x < -708.0 {
            assert!(x == f64::NEG_INFINITY, "exp({x}) underflows: no reference");
            return 0.0;
        }
        let k = (x * std::f64::consts::LOG2_E).round();
        let r = (x - k * LN2_HI) - k * LN2_LO; // |r| <= 0.35
                                               // Σ rⁱ/i! by Horner's rule: 1 + r(1 + r/2(1 + r/3(…)))
        let p = (1..=24).rev().fold(1.0, |p, i| 1.0 + r / i as f64 * p);
        // 2^k in two factors: k reaches 1024 just below the overflow
        let k = k as i64;
        p * pow2(k / 2) * pow2(k - k / 2)
    }

    pub fn ln(x: f64) -> f64 {
        if x.is_nan() || x < 0.0 {
            return f64::NAN;
        }
        if x == 0.0 {
            return f64::NEG_INFINITY;
        }
        if x == f64::INFINITY {
            return x;
        }
        // x = m·2^e, m in [√½, √2)
        let (x, shift) = if x < f64::MIN_POSITIVE { (x * pow2(54), -54) } else { (x, 0) };
        let bits = x.to_bits();
        let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023 + shift;
        let mut m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
        if m > std::f64::consts::SQRT_2 {
            m /= 2.0;
            e += 1;
        }
        // ln m = 2·atanh s = 2(s + s³/3 + s⁵/5 + …), |s| <= 0.172
        let s = (m - 1.0) / (m + 1.0);
        let s2 = s * s;
        let series = (0..=14).rev().fold(0.0, |acc, j| 1.0 / (2 * j + 1) as f64 + s2 * acc);
        let e = e as f64;
        e * LN2_HI + (e * LN2_LO + 2.0 * s * series)
    }

    /// sin r and cos r for |r| <= π/4, by their Taylor series.
    fn sin_cos_small(r: f64) -> (f64, f64) {
        let r2 = r * r;
        // sin r = r(1 − r²/(2·3)(1 − r²/(4·5)(…))), cos r = 1 − r²/(1·2)(1 − r²/(3·4)(…))
        let sin = r * (1..=12).rev().fold(1.0, |p, i| 1.0 - r2 / ((2 * i) * (2 * i + 1)) as f64 * p);
        let cos = (1..=12).rev().fold(1.0, |p, i| 1.0 - r2 / ((2 * i - 1) * (2 * i)) as f64 * p);
        (sin, cos)
    }

    /// sin x (or cos x, with `cos`) for |x| <= 100.
    pub fn sin_or_cos(x: f64, cos: bool) -> f64 {
        if !x.is_finite() {
            return f64::NAN;
        }
        assert!(x.abs() <= 100.0, "sin({x}): outside the reference's reduction");
        let k = (x * std::f64::consts::FRAC_2_PI).round();
        let r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
        let (s, c) = sin_cos_small(r);
        let quadrant = (k as i64 + i64::from(cos)).rem_euclid(4);
        let v = [s, c, -s, -c][quadrant as usize];
        // sin(±0) is ±0
        if x == 0.0 && !cos {
            x
        } else {
            v
        }
    }

    pub fn tanh(x: f64) -> f64 {
        if x.is_nan() || x == 0.0 {
            return x;
        }
        let a = x.abs();
        let t = if a > 20.0 {
            1.0 // 1 − tanh a < 2e-17
        } else if a < 0.5 {
            // sinh a / cosh a from their series of positive terms
            let a2 = a * a;
            let sinh = a * (1..=10).rev().fold(1.0, |p, i| 1.0 + a2 / ((2 * i) * (2 * i + 1)) as f64 * p);
            let cosh = (1..=10).rev().fold(1.0, |p, i| 1.0 + a2 / ((2 * i - 1) * (2 * i)) as f64 * p);
            sinh / cosh
        } else {
            let e2 = exp(2.0 * a);
            (e2 - 1.0) / (e2 + 1.0)
        };
        t.copysign(x)
    }

    pub fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + exp(-x))
    }

    /// 1/√x by Newton's method y ← y(3 − x·y²)/2 from the bit-level guess (the classic constant):
    /// quadratic convergence, a few ulps after 6 steps.
    pub fn rsqrt(x: f64) -> f64 {
        if x.is_nan() || x < 0.0 {
            return f64::NAN;
        }
        if x == 0.0 {
            return f64::INFINITY.copysign(x);
        }
        if x == f64::INFINITY {
            return 0.0;
        }
        let (x, scale) = if x < 1e-300 { (x * pow2(600), pow2(300)) } else { (x, 1.0) };
        let mut y = f64::from_bits(0x5fe6_eb50_c7b5_37a9 - (x.to_bits() >> 1));
        for _ in 0..6 {
            y = y * (1.5 - 0.5 * x * y * y);
        }
        y * scale
    }

    /// √x as x·(1/√x), then one Newton step y ← (y + x/y)/2.
    pub fn sqrt(x: f64) -> f64 {
        if x.is_nan() || x < 0.0 {
            return f64::NAN;
        }
        if x == 0.0 || x == f64::INFINITY {
            return x;
        }
        let y = x * rsqrt(x);
        0.5 * (y + x / y)
    }
}

/// A reference value for `op` at `v` from [`reference`] (erf by [`erf_reference`]).
fn unary_reference(op: UnOp, v: f64) -> f64 {
    match op {
        UnOp::Exp => reference::exp(v),
        UnOp::Log => reference::ln(v),
        UnOp::Sqrt => reference::sqrt(v),
        UnOp::Rsqrt => reference::rsqrt(v),
        UnOp::Tanh => reference::tanh(v),
        UnOp::Sigmoid => reference::sigmoid(v),
        UnOp::Sin => reference::sin_or_cos(v, false),
        UnOp::Cos => reference::sin_or_cos(v, true),
        UnOp::Erf if v.is_nan() => v,
        UnOp::Erf if v.is_infinite() => v.signum(),
        // erf x = 2x/√π (1 − x²/3 + …): below 1e-100 the first term is exact to 1e-200
        UnOp::Erf if v.abs() < 1e-100 => std::f64::consts::FRAC_2_SQRT_PI * v,
        UnOp::Erf => erf_reference(v),
        _ => unreachable!("an exact op"),
    }
}

/// The exact unary ops (neg, abs, floor, ceil: exact; recip: correctly rounded) of a float with
/// `mantissa` bits, subnormal spacing `tiny` and greatest value `max` (f32 values widened), checked
/// by what defines them rather than by the operation itself: `got` is op(v).
fn exact_unary_holds(op: UnOp, v: f64, got: f64, (mantissa, tiny, max): (i32, f64, f64)) -> bool {
    const SIGN: u64 = 1 << 63;
    let integral = |g: f64| (g as i64) as f64 == g;
    if v.is_nan() {
        return got.is_nan();
    }
    match op {
        UnOp::Neg => got.to_bits() == v.to_bits() ^ SIGN,
        UnOp::Abs => got.to_bits() == v.to_bits() & !SIGN,
        UnOp::Recip if v == 0.0 => got == f64::INFINITY.copysign(v),
        UnOp::Recip if v.is_infinite() => got == 0.0 && got.is_sign_negative() == v.is_sign_negative(),
        // past the greatest value 1/v overflows
        UnOp::Recip if got.is_infinite() => v.abs() * max <= 1.0 && got.is_sign_negative() == v.is_sign_negative(),
        // correctly rounded: |got − 1/v| <= ulp(got)/2, i.e. |got·v − 1| <= |v|·ulp(got)/2, the
        // residual exact by fma (and exact for widened f32 values)
        UnOp::Recip => {
            let e = ((got.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023;
            let ulp = 2f64.powi(e - mantissa).max(tiny);
            got.mul_add(v, -1.0).abs() <= v.abs() * ulp / 2.0
        }
        // past 2^52 (and at ±0, ±∞) every value is its own floor and ceiling
        UnOp::Floor | UnOp::Ceil if v == 0.0 || v.abs() >= 2f64.powi(52) => got.to_bits() == v.to_bits(),
        // the greatest integer not above v, +0 for v in (0, 1)
        UnOp::Floor => integral(got) && got <= v && v < got + 1.0 && (got != 0.0 || got.is_sign_positive()),
        // the least integer not below v, −0 for v in (−1, 0)
        UnOp::Ceil => {
            integral(got) && got >= v && v > got - 1.0 && (got != 0.0 || got.is_sign_negative() == v.is_sign_negative())
        }
        _ => unreachable!("a rounded op"),
    }
}

/// `got`'s distance from `want` in units in the last place of a float with `mantissa` bits
/// (below the smallest normal, the subnormals' spacing `tiny`).
fn ulps(got: f64, want: f64, mantissa: i32, tiny: f64) -> f64 {
    let e = ((want.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let ulp = 2f64.powi(e - mantissa).max(tiny);
    (got - want).abs() / ulp
}

/// Inputs for `op`: 2001 points of [−10.3, 10.3] (both zeros, ±1), then every special value, then
/// for the ops whose reference reaches them, wide magnitudes.
fn unary_inputs(op: UnOp) -> Vec<f64> {
    let mut xs: Vec<f64> = (0..2001).map(|i| (i as f64 - 1000.0) / 97.0).collect();
    xs.extend([-0.0, 1.0, -1.0, 0.5, -0.5, 1e-9, -1e-9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
    let wide = [1e-300, 1e-310, 3e-200, 1e-20, 0.999_999_9, 1.000_000_1, 123_456.789, 1e20, 1e200, 1.7e308];
    match op {
        UnOp::Exp => xs.extend([-700.0, -500.5, -88.0, 88.0, 100.25, 709.5, 1e-300]),
        UnOp::Sigmoid => xs.extend([-700.0, -88.0, 88.0, 700.0, 1e-300]),
        UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt | UnOp::Recip => xs.extend(wide.iter().flat_map(|&w| [w, -w])),
        UnOp::Tanh | UnOp::Neg | UnOp::Abs | UnOp::Floor | UnOp::Ceil | UnOp::Erf => {
            xs.extend(wide.iter().flat_map(|&w| [w, -w]))
        }
        _ => xs.extend([-99.5, 31.4159, 1e-300]),
    }
    xs
}

/// Each real unary op in `f64` and in `f32` against the references above (f32 inputs widened
/// exactly to f64, the reference then rounded to f32). The bounds, in ulps of the result's type:
/// - f64, 4 ulps: on these inputs the kernel's exp, log, sqrt, sin and cos are within 0.5 ulp of
///   the exact value, tanh, rsqrt and the sigmoid within 1.9 (two or three roundings), and the
///   references within 2.3 (both measured against 200-bit mpmath);
/// - f64 erf, 10 ulps: the kernel's series is stated "to a few ulps" and measured within 7.1 ulps
///   (near |x| = 1.6 and 2.4), Simpson's rule within 2.3;
/// - f32, 4 ulps: libm's f32 functions are within 1–2 ulps (measured at most 2.0 here, the
///   sigmoid), the f64 reference rounded to f32 within ½ ulp;
/// - exact ops: exactly (neg, abs, floor, ceil) or correctly rounded (recip), by
///   [`exact_unary_holds`];
/// - NaN exactly where the reference is NaN, ±∞ exactly where either is infinite.
#[test]
fn unary_ops_match_independent_references() {
    let host = Host::new();
    for op in REAL_UNARY {
        let exact = matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Recip | UnOp::Floor | UnOp::Ceil);
        let xs = unary_inputs(op);
        let prog = |d: Dtype| {
            let mut p = Prog::new(&[d]);
            let l = p.load(0);
            let u = p.unary(op, l);
            p.output(u);
            p
        };
        // f64
        let x = Array::<f64>::from_vec(DEV, &[xs.len()], xs.clone()).unwrap();
        let y = Array::<f64>::zeros(DEV, &[xs.len()]).unwrap();
        assert_eq!(host.map(&prog(Dtype::F64), &[xs.len()], &[&y], &[&x]), Answer::Done);
        let got = y.to_vec().unwrap();
        // f32, of the inputs rounded to f32
        let xs32: Vec<f32> = xs.iter().map(|&v| v as f32).collect();
        let x = Array::<f32>::from_vec(DEV, &[xs.len()], xs32.clone()).unwrap();
        let y = Array::<f32>::zeros(DEV, &[xs.len()]).unwrap();
        assert_eq!(host.map(&prog(Dtype::F32), &[xs.len()], &[&y], &[&x]), Answer::Done);
        let got32 = y.to_vec().unwrap();
        for i in 0..xs.len() {
            let (v, g, v32, g32) = (xs[i], got[i], xs32[i], got32[i]);
            if exact {
                let f64s = (52, 2f64.powi(-1074), f64::MAX);
                let f32s = (23, 2f64.powi(-149), f64::from(f32::MAX));
                assert!(exact_unary_holds(op, v, g, f64s), "f64 {op:?}({v:e}) = {g:e}");
                assert!(exact_unary_holds(op, f64::from(v32), f64::from(g32), f32s), "f32 {op:?}({v32:e}) = {g32:e}");
                continue;
            }
            for (what, v, g, want, bound, mantissa, tiny) in [
                ("f64", v, g, unary_reference(op, v), if op == UnOp::Erf { 10.0 } else { 4.0 }, 52, 2f64.powi(-1074)),
                ("f32", f64::from(v32), f64::from(g32), unary_reference(op, f64::from(v32)), 4.0, 23, 2f64.powi(-149)),
            ] {
                // the reference rounded to the result's type, then compared
                let want = if what == "f32" { f64::from(want as f32) } else { want };
                if want.is_nan() {
                    assert!(g.is_nan(), "{what} {op:?}({v:e}) = {g:e}, want NaN");
                } else if want.is_infinite() || g.is_infinite() {
                    assert_eq!(g, want, "{what} {op:?}({v:e})");
                } else {
                    let d = ulps(g, want, mantissa, tiny);
                    assert!(d <= bound, "{what} {op:?}({v:e}) = {g:e}, want {want:e}: {d} ulps (bound {bound})");
                }
            }
        }
    }
}

/// erf by Simpson's rule on 2/√π e^(−t²) with many panels: independent of the library's series.
fn erf_reference(x: f64) -> f64 {
    // past 6, erf is 1 - 2e-17: 1 to double precision
    let x = x.clamp(-6.0, 6.0);
    let n = 6_000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    // Neumaier-compensated Simpson sum
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for i in 0..=n {
        let w = if i == 0 || i == n {
            1.0
        } else if i % 2 == 1 {
            4.0
        } else {
            2.0
        };
        let term = w * f(i as f64 * h);
        let t = s + term;
        c += if s.abs() >= term.abs() { (s - t) + term } else { (term - t) + s };
        s = t;
    }
    (s + c) * h / 3.0 * std::f64::consts::FRAC_2_SQRT_PI
}

#[test]
fn erf_matches_tabulated_values() {
    // erf at 0.5, 1, 2, 3 (Abramowitz & Stegun, table 7.1, to 16 digits)
    let host = Host::new();
    let xs = [0.0, 0.5, 1.0, 2.0, 3.0, -1.0];
    let want = [
        0.0,
        0.520_499_877_813_046_5,
        0.842_700_792_949_714_9,
        0.995_322_265_018_952_7,
        0.999_977_909_503_001_4,
        -0.842_700_792_949_714_9,
    ];
    let x = Array::<f64>::from_vec(DEV, &[6], xs.to_vec()).unwrap();
    let mut p = Prog::new(&[Dtype::F64]);
    let l = p.load(0);
    let e = p.unary(UnOp::Erf, l);
    p.output(e);
    let y = Array::<f64>::zeros(DEV, &[6]).unwrap();
    assert_eq!(host.map(&p, &[6], &[&y], &[&x]), Answer::Done);
    for (g, w) in y.to_vec().unwrap().iter().zip(want) {
        assert!((g - w).abs() <= 4.5e-16, "{g} vs {w}"); // 2 ulps near 1
    }
}
