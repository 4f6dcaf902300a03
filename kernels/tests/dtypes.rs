//! Dtype facts, names, conversions (bit-exact) and promotion.
#![allow(clippy::approx_constant)] // the reference's example value 3.14159, not π

use std::path::PathBuf;

use half::{bf16, f16};
use nx_kernels::dtype::convert::{f32_to_bf16, f32_to_f16, BF16_QNAN, F16_QNAN};
use nx_kernels::{binary_result, convert, float_math_input, promoted, result_type, scalar_result, Dtype, Kind};
use nx_kernels::{Element, Policy, PolicyChange, Scalar, Value};

/// An independent decoder of a 16-bit float with `exp_bits` exponent bits, in f64.
fn decode16(bits: u16, exp_bits: u32) -> f64 {
    let man_bits = 15 - exp_bits;
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let e = ((bits >> man_bits) & ((1 << exp_bits) - 1)) as i32;
    let m = (bits & ((1 << man_bits) - 1)) as f64;
    let bias = (1 << (exp_bits - 1)) - 1;
    let max_e = (1 << exp_bits) - 1;
    if e == max_e {
        return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if e == 0 {
        sign * m * 2f64.powi(1 - bias - man_bits as i32)
    } else {
        sign * (1.0 + m / 2f64.powi(man_bits as i32)) * 2f64.powi(e - bias)
    }
}

#[test]
fn every_half_pattern_widens_exactly() {
    for bits in 0..=u16::MAX {
        for (got, exp_bits) in [(f16::from_bits(bits).to_value(), 5), (bf16::from_bits(bits).to_value(), 8)] {
            let want = decode16(bits, exp_bits);
            let Value::Float(got) = got else { panic!("a float widens to a float") };
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x} with {exp_bits} exponent bits");
            }
        }
        // and through the bulk path to f32, exactly
        let v: Vec<f32> = nx_kernels::converted(&[bf16::from_bits(bits)]);
        if !bf16::from_bits(bits).is_nan() {
            assert_eq!(v[0].to_bits(), (bits as u32) << 16);
        }
    }
}

/// Round-to-nearest-even of f32 to bf16 by integer arithmetic (the classic formulation).
fn bf16_reference(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return BF16_QNAN;
    }
    let rounding = 0x7FFF + ((b >> 16) & 1);
    ((b + rounding) >> 16) as u16
}

#[test]
fn f32_to_bf16_rounds_ties_to_even_and_quiets_nans() {
    for h in 0..=u16::MAX {
        let base = (h as u32) << 16;
        if f32::from_bits(base).is_nan() || f32::from_bits(base).is_infinite() {
            continue;
        }
        for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
            let x = f32::from_bits(base | low);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f32_to_bf16(x).to_bits(), bf16_reference(x), "{:#010x}", base | low);
        }
        // exact ties: round to the even neighbour
        let tie = f32::from_bits(base | 0x8000);
        let want = if h & 1 == 0 { h } else { h.wrapping_add(1) };
        if !tie.is_nan() && !f32::from_bits((want as u32) << 16).is_nan() {
            assert_eq!(f32_to_bf16(tie).to_bits(), want, "tie at {h:#06x}");
        }
    }
    for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001), f32::from_bits(0xFFC1_2345)] {
        assert_eq!(f32_to_bf16(nan).to_bits(), 0x7FC0);
        assert_eq!(f32_to_f16(nan).to_bits(), F16_QNAN);
    }
    // the reference's example
    let bits: Vec<u16> = [1.0f32, 3.141_59, -2.5e-3, f32::NAN].iter().map(|&x| f32_to_bf16(x).to_bits()).collect();
    assert_eq!(bits[3], 0x7FC0);
    assert_eq!(bf16::from_bits(bits[0]).to_f32(), 1.0);
    assert!((bf16::from_bits(bits[1]).to_f32() - 3.141_59).abs() < 0.02);
}

#[test]
fn f32_to_f16_is_the_nearest_with_ties_to_even() {
    // every finite positive f16, in order, as f64
    let table: Vec<(u16, f64)> = (0..0x7C00u16).map(|b| (b, decode16(b, 5))).collect();
    let nearest = |x: f64| -> u16 {
        let a = x.abs();
        let k = table.partition_point(|&(_, v)| v < a);
        let pick = if k == table.len() {
            let max = table[k - 1].1;
            // past the largest finite: rounds to it below max + half an ulp (2^4), else to infinity
            if a < max + 16.0 {
                table[k - 1].0
            } else {
                0x7C00
            }
        } else if k == 0 {
            table[0].0
        } else {
            let (lo, hi) = (table[k - 1], table[k]);
            let (dl, dh) = (a - lo.1, hi.1 - a);
            if dl < dh || (dl == dh && lo.0 & 1 == 0) {
                lo.0
            } else {
                hi.0
            }
        };
        if x.is_sign_negative() {
            pick | 0x8000
        } else {
            pick
        }
    };
    // all ties, and points just beside them
    for w in table.windows(2) {
        let mid = (w[0].1 + w[1].1) / 2.0;
        let m32 = mid as f32;
        assert_eq!(m32 as f64, mid, "midpoints of f16 are f32 values");
        for x in [m32, f32::from_bits(m32.to_bits() + 1), f32::from_bits(m32.to_bits() - 1), -m32] {
            assert_eq!(f32_to_f16(x).to_bits(), nearest(x as f64), "{x:e}");
        }
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let x = f32::from_bits(state as u32);
        if x.is_nan() {
            assert_eq!(f32_to_f16(x).to_bits(), F16_QNAN);
        } else if x.is_infinite() {
            assert_eq!(f32_to_f16(x).to_f32(), x);
        } else {
            assert_eq!(f32_to_f16(x).to_bits(), nearest(x as f64), "{x:e}");
        }
    }
}

#[test]
fn bulk_conversion_is_the_same_bits_in_parallel_and_checks_lengths() {
    let n = nx_kernels::dtype::convert::PARALLEL_MIN * 3 + 7;
    let src: Vec<f32> = (0..n).map(|i| (i as f32 - 1000.0) * 0.37).collect();
    let mut par = vec![bf16::ZERO; n];
    convert(&src, &mut par).unwrap();
    for (x, y) in src.iter().zip(&par) {
        assert_eq!(y.to_bits(), bf16_reference(*x));
    }
    let mut short = vec![0u8; 3];
    let e = convert(&src[..4], &mut short).unwrap_err();
    assert_eq!(e.to_string(), "nx_kernels::convert: f32 source and u8 destination differ in length: 4 and 3");
    // integer and special casts
    assert_eq!(nx_kernels::converted::<f32, i8>(&[300.7, -1e9, f32::NAN, -2.9]), [127, -128, 0, -2]);
    assert_eq!(nx_kernels::converted::<i32, u8>(&[257, -1]), [1, 255]);
    assert_eq!(nx_kernels::converted::<f64, bool>(&[0.0, -0.0, 0.5, f64::NAN]), [false, false, true, true]);
    assert_eq!(nx_kernels::converted::<i64, f32>(&[(1 << 24) + 1]), [16777216.0]);
}

#[test]
fn facts_and_names() {
    for d in Dtype::ALL {
        assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
        assert_eq!(d.short_name().parse::<Dtype>().unwrap(), d);
        assert_eq!(d.safetensors_name().parse::<Dtype>().unwrap(), d);
        assert_eq!(format!("torch.{}", d.name()).parse::<Dtype>().unwrap(), d);
        assert!(d.size() % d.align() == 0);
        assert!(d.min_value() <= d.max_value());
    }
    assert_eq!(Dtype::BF16.size(), 2);
    assert_eq!(Dtype::C64.size(), 8);
    assert_eq!(Dtype::C64.align(), 4);
    assert_eq!(Dtype::BF16.kind(), Kind::Float);
    assert_eq!(Dtype::U8.kind(), Kind::Uint);
    assert_eq!("BF16".parse::<Dtype>().unwrap(), Dtype::BF16);
    assert_eq!("fp16".parse::<Dtype>().unwrap(), Dtype::F16);
    assert_eq!("half".parse::<Dtype>().unwrap(), Dtype::F16);
    assert_eq!("torch.float16".parse::<Dtype>().unwrap(), Dtype::F16);
    assert_eq!(Dtype::F16.carrier(), Dtype::F32);
    assert_eq!(Dtype::BF16.carrier(), Dtype::F32);
    assert_eq!(Dtype::I8.carrier(), Dtype::I8);
    assert_eq!(Dtype::F16.max_value(), 65504.0);
    let e = "fp8_unknown".parse::<Dtype>().unwrap_err();
    assert!(e.to_string().contains("unknown dtype \"fp8_unknown\""), "{e}");
}

fn conformance(name: &str) -> serde_json::Value {
    let dir = std::env::var_os("NX_CONFORMANCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"));
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn promotion_matches_the_conformance_table_in_both_orders() {
    let data = conformance("promotion.json");
    let pairs = data["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 120, "all unordered pairs of 15 dtypes");
    for p in pairs {
        let a: Dtype = p[0].as_str().unwrap().parse().unwrap();
        let b: Dtype = p[1].as_str().unwrap().parse().unwrap();
        let want: Option<Dtype> = p[2].as_str().map(|s| s.parse().unwrap());
        assert_eq!(binary_result(a, b).ok(), want, "{a} with {b}");
        assert_eq!(binary_result(b, a).ok(), want, "{b} with {a}");
    }
    let e = binary_result(Dtype::I8, Dtype::U64).unwrap_err();
    assert!(e.to_string().contains("i8 and u64"), "{e}");
}

#[test]
fn promotion_is_order_independent_over_three_operands() {
    for a in Dtype::ALL {
        for b in Dtype::ALL {
            for c in Dtype::ALL {
                let r = result_type(&[a, b, c]).ok();
                for perm in [[a, c, b], [b, a, c], [b, c, a], [c, a, b], [c, b, a]] {
                    assert_eq!(result_type(&perm).ok(), r, "{a} {b} {c}");
                }
            }
        }
    }
}

#[test]
fn the_references_promotion_and_scalar_examples() {
    use Dtype::*;
    assert_eq!(promoted(&[F16, F32]), Some(F32));
    assert_eq!(promoted(&[F16, BF16]), None);
    assert_eq!(float_math_input(I64), F32);
    assert_eq!(binary_result(I8, U8).unwrap(), I16);
    assert_eq!(binary_result(C64, F64).unwrap(), C128);
    assert_eq!(binary_result(I64, F16).unwrap(), F16);
    assert_eq!(binary_result(BF16, F16).unwrap(), F32);
    assert_eq!(binary_result(U8, I8).unwrap(), I16);
    assert_eq!(scalar_result(F16, Scalar::Float(0.5)).unwrap(), F16);
    assert_eq!(scalar_result(I32, Scalar::Float(1.5)).unwrap(), F64);
    assert_eq!(scalar_result(I32, Scalar::Complex(1.0, 1.0)).unwrap(), C128);
    assert_eq!(scalar_result(F16, Scalar::Complex(1.0, 1.0)).unwrap(), C64);
    assert_eq!(scalar_result(U8, Scalar::Int(255)).unwrap(), U8);
    let e = scalar_result(U8, Scalar::Int(256)).unwrap_err();
    assert_eq!(e.to_string(), "nx_kernels::scalar_result: the integer 256 is outside u8's range [0, 255]");
    assert_eq!(scalar_result(Bool, Scalar::Bool(true)).unwrap(), Bool);
}

#[test]
fn the_references_policy_examples() {
    let p: Policy = "params=float32,compute=float16,output=float32".parse().unwrap();
    assert_eq!(p.compute_dtype("mm", &[Dtype::F32, Dtype::F32]), Some(Dtype::F16));
    assert_eq!(p.compute_dtype("softmax", &[Dtype::F16]), Some(Dtype::F32));
    assert_eq!(p.compute_dtype("addcmul", &[Dtype::F16, Dtype::F32, Dtype::F16]), Some(Dtype::F32));
    assert_eq!(p.compute_dtype("relu", &[Dtype::F16]), None);
    assert_eq!(p.fill_value("masked_fill", -3.39e38, Dtype::F16), -65504.0);
    let q = p.replace(PolicyChange { compute: Some(Dtype::BF16), ..Default::default() });
    assert_eq!(q.compute, Dtype::BF16);
    assert_eq!(p.compute, Dtype::F16, "a policy never changes");
    assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
    assert!("params=float32,speed=fast".parse::<Policy>().is_err());
}

#[test]
fn f64_rounds_to_halves_once() {
    // f64 values strictly between an f32 tie and its neighbours must not round twice
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let x = f64::from_bits(state & 0x47EF_FFFF_FFFF_FFFF);
        let x = if state & 1 == 1 { x } else { x * 1e-30 };
        // the two bf16 values around |x|: truncate to f32 toward zero, then to bf16 toward zero
        let a = x.abs();
        let mut f = a as f32;
        if f as f64 > a {
            f = f32::from_bits(f.to_bits() - 1);
        }
        let below = (f.to_bits() >> 16) as u16;
        // past the largest finite value, the next step up is 2^128 (IEEE overflow rounding)
        let next = if below + 1 == 0x7F80 { 2f64.powi(128) } else { bf16::from_bits(below + 1).to_f64() };
        let (lo, hi) = (bf16::from_bits(below).to_f64(), next);
        let (dl, dh) = (a - lo, hi - a);
        let want = if dl < dh || (dl == dh && below & 1 == 0) { below } else { below + 1 };
        let want = if x < 0.0 { want | 0x8000 } else { want };
        assert_eq!(nx_kernels::dtype::convert::f64_to_bf16(x).to_bits(), want, "{x:e}");
    }
    // a double-rounding trap: just above a bf16 tie, but within f32 rounding of it
    let tie = f32::from_bits(0x3F80_8000) as f64; // between 1.0 and the next bf16
    let x = tie + 2f64.powi(-40);
    assert_eq!(nx_kernels::dtype::convert::f64_to_bf16(x).to_bits(), 0x3F81, "rounds up, not to even");
    let x = tie - 2f64.powi(-40);
    assert_eq!(nx_kernels::dtype::convert::f64_to_bf16(x).to_bits(), 0x3F80);
}

#[test]
fn storage_dtypes_and_representation_bytes() {
    use nx_kernels::dtype::storage::{representation_bytes as rb, storage_dtype, Stores};
    // the reference's examples
    assert_eq!(storage_dtype(Dtype::F64, Stores { fp64: false, ..Stores::all() }), Dtype::F32);
    assert_eq!(rb("int4-g128-asym", 256).unwrap(), 128 + 2 * (2 + 2));
    // every dtype is itself in a store of everything, and a store without a format holds a
    // dtype that holds it
    for d in Dtype::ALL {
        assert_eq!(storage_dtype(d, Stores::all()), d);
        for fp64 in [false, true] {
            for fp16 in [false, true] {
                for bf16 in [false, true] {
                    for fp8 in [false, true] {
                        let s = Stores { fp64, fp16, bf16, fp8 };
                        let held = storage_dtype(d, s);
                        let banned = |x: Dtype| match x {
                            Dtype::F64 | Dtype::C128 => !fp64,
                            Dtype::F16 => !fp16,
                            Dtype::BF16 => !bf16,
                            Dtype::F8E4M3 | Dtype::F8E5M2 => !fp8,
                            _ => false,
                        };
                        assert!(!banned(held), "{d} in {s:?}: {held}");
                        assert_eq!(held.kind(), d.kind(), "{d} in {s:?}: {held}");
                        if !matches!(d, Dtype::F64 | Dtype::C128) {
                            assert!(held.max_value() >= d.max_value(), "{d} in {s:?}: {held} holds its range");
                        }
                    }
                }
            }
        }
    }
    // the table, by hand
    let cases: &[(&str, u64, u64)] = &[
        ("float32", 10, 40),
        ("BF16", 3, 6),
        ("F8_E4M3", 5, 5),
        ("int4", 7, 4),
        ("uint4", 0, 0),
        ("int4-g128", 256, 128 + 2 * 2),
        ("int4-g128-sym", 257, 129 + 3 * 2),
        ("int4-g128-asym", 257, 129 + 3 * 4),
        ("int4-g64-asym-bf16", 100, 50 + 2 * 4),
        ("int8-g32-f32", 33, 33 + 2 * 4),
        ("uint8-g16-asym-float32", 16, 16 + 8),
        ("f8e4m3-g32", 64, 64 + 4),
        ("mxfp8", 65, 65 + 3),
        ("mxfp8_e5m2", 32, 33),
        ("mxint8", 1, 2),
        ("mxfp6_e2m3", 32, 24 + 1),
        ("mxfp6_e3m2", 5, 4 + 1),
        ("mxfp4", 33, 17 + 2),
    ];
    for &(name, n, want) in cases {
        assert_eq!(rb(name, n).unwrap(), want, "{name} × {n}");
    }
    for bad in ["fp8_unknown", "int4-g0", "int4-gx", "int4-g128-skew", "complex64-g4", "int4-g8-i32", ""] {
        let e = rb(bad, 8).unwrap_err().to_string();
        assert!(e.contains("representation_bytes") && e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
    let e = rb("float64", u64::MAX / 4).unwrap_err().to_string();
    assert!(e.contains("overflow") && e.contains(&(u64::MAX / 4).to_string()), "{e}");
    assert!(rb("int4", u64::MAX).is_err(), "n·4 bits overflows too");
}
