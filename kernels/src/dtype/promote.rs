//! Type promotion: the Array API standard's tables, and nbxtensor's decisions for what the
//! standard leaves open.
//!
//! | case | result |
//! |---|---|
//! | one kind | the wider (two half formats, `f16` with `bf16`: `f32`) |
//! | an fp8 with another float or a complex | refused, as PyTorch and JAX refuse: no join of both fp8s would keep promotion independent of order (`f16` holds both, but `bf16` with either is `bf16`); convert explicitly |
//! | a signed with an unsigned integer | the narrowest signed integer holding both; with `u64`: refused |
//! | two kinds (bool < uint < int < float < complex) | the higher kind at its own width (`i64` with `f16`: `f16`) |
//! | a float with a complex | the complex of the wider float's precision (`c64` with `f64`: `c128`) |
//!
//! A Python-style scalar is weak: it takes the array's dtype ([`scalar_result`]), but for a float
//! scalar with an integer or bool array (`f64`, NEP 50) and a complex scalar with an integer array
//! (`c128`) or a half array (`c64`); an integer scalar outside an integer array's range is refused.

use super::{Dtype, Kind};
use crate::{Error, Result};

fn float_bits(d: Dtype) -> u32 {
    match d {
        Dtype::F8E4M3 | Dtype::F8E5M2 => 8,
        Dtype::F16 | Dtype::BF16 => 16,
        Dtype::F32 | Dtype::C64 => 32,
        _ => 64,
    }
}

fn signed_of(bits: usize) -> Option<Dtype> {
    match bits {
        8 => Some(Dtype::I8),
        16 => Some(Dtype::I16),
        32 => Some(Dtype::I32),
        64 => Some(Dtype::I64),
        _ => None,
    }
}

/// The dtype of a binary operation on arrays of dtypes `a` and `b`. Symmetric.
///
/// # Errors
/// [`Error::NoPromotion`] for a signed integer with `u64`, and for an fp8 with another float or
/// a complex, naming both.
pub fn binary_result(a: Dtype, b: Dtype) -> Result<Dtype> {
    use Dtype::*;
    if a == b {
        return Ok(a);
    }
    let fp8 = |d: Dtype| matches!(d, F8E4M3 | F8E5M2);
    if (fp8(a) || fp8(b)) && a.is_float() && b.is_float() {
        return Err(Error::NoPromotion { left: a, right: b });
    }
    // widths in bits: the packed dtypes are narrower than a byte (`int4` with `int8`: `int8`)
    let (lo, hi) = if (a.kind(), a.bits()) <= (b.kind(), b.bits()) { (a, b) } else { (b, a) };
    Ok(match (lo.kind(), hi.kind()) {
        (Kind::Bool, _) => hi,
        (Kind::Uint, Kind::Uint) | (Kind::Int, Kind::Int) => hi,
        (Kind::Uint, Kind::Int) => {
            if hi.bits() > lo.bits() {
                hi
            } else {
                signed_of((lo.bits() * 2).max(8)).ok_or(Error::NoPromotion { left: a, right: b })?
            }
        }
        (Kind::Uint | Kind::Int, _) => hi,
        (Kind::Float, Kind::Float) => {
            if matches!((lo, hi), (F16, BF16) | (BF16, F16)) {
                F32
            } else if lo.bits() >= hi.bits() {
                lo
            } else {
                hi
            }
        }
        (Kind::Float, Kind::Complex) => {
            if float_bits(lo) > float_bits(hi) {
                C128
            } else {
                hi
            }
        }
        (Kind::Complex, Kind::Complex) => {
            if lo.size() >= hi.size() {
                lo
            } else {
                hi
            }
        }
        _ => unreachable!("kinds are ordered lo <= hi"),
    })
}

/// The dtype of an operation over arrays of all of `dtypes`, whatever their order. Where a float
/// or complex is among them, it decides alone (an integer or bool never widens a float): the
/// floats are folded with [`binary_result`]. Otherwise the integers and bools are.
///
/// # Errors
/// [`Error::NoPromotion`] as [`binary_result`] (a signed integer with `u64`, no float present);
/// [`Error::NoDtypes`] for an empty list.
pub fn result_type(dtypes: &[Dtype]) -> Result<Dtype> {
    let floats: Vec<Dtype> = dtypes.iter().copied().filter(|d| d.is_float()).collect();
    let pool = if floats.is_empty() { dtypes } else { &floats };
    let (&first, rest) = pool.split_first().ok_or(Error::NoDtypes { func: "nx_kernels::result_type" })?;
    rest.iter().try_fold(first, |acc, &d| binary_result(acc, d))
}

/// A Python-style scalar operand: weak, it takes the array's dtype where it can.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A float.
    Float(f64),
    /// A complex.
    Complex(f64, f64),
}

/// The dtype of a binary operation on an array of dtype `array` and the weak scalar `s`.
///
/// # Errors
/// [`Error::ScalarOutOfRange`] for an integer scalar outside an integer array's range.
pub fn scalar_result(array: Dtype, s: Scalar) -> Result<Dtype> {
    use Dtype::*;
    Ok(match (s, array.kind()) {
        (Scalar::Bool(_), _) => array,
        (Scalar::Int(_), Kind::Bool) => I64,
        (Scalar::Int(i), Kind::Int | Kind::Uint) => {
            let (lo, hi) = array.int_range().expect("an integer dtype");
            if i < lo || i > hi {
                return Err(Error::ScalarOutOfRange { value: i, dtype: array, lo, hi });
            }
            array
        }
        (Scalar::Int(_), _) => array,
        (Scalar::Float(_), Kind::Bool | Kind::Int | Kind::Uint) => F64,
        (Scalar::Float(_), _) => array,
        (Scalar::Complex(..), Kind::Bool | Kind::Int | Kind::Uint) => C128,
        (Scalar::Complex(..), Kind::Float) => {
            if array == F64 {
                C128
            } else {
                C64
            }
        }
        (Scalar::Complex(..), Kind::Complex) => array,
    })
}

/// The dtype a float-only op (`rsqrt`, `exp`, …) reads an operand of dtype `d` as: `f32` for bool
/// and integers, `d` itself for floats.
pub fn float_math_input(d: Dtype) -> Dtype {
    if d.is_float() {
        d
    } else {
        Dtype::F32
    }
}

/// The widest float among `dtypes` where one is wider than two bytes (`[f16, f32]` → `f32`);
/// among half and fp8 formats alone, the one there is, or `None` for two of them (`f16` with
/// `bf16`, an fp8 with another), which a precision
/// [`Policy`](super::policy::Policy) decides. Non-float dtypes are ignored; `None` if none is a
/// float.
pub fn promoted(dtypes: &[Dtype]) -> Option<Dtype> {
    let floats: Vec<Dtype> = dtypes.iter().copied().filter(|d| d.is_float()).collect();
    let widest = floats.iter().copied().max_by_key(|d| (d.size(), *d))?;
    if widest.size() <= 2 && floats.iter().any(|&d| d != widest) {
        return None;
    }
    Some(widest)
}
