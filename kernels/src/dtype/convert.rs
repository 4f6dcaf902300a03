//! Conversions between dtypes, with exact rounding rules.
//!
//! - To `f16` and `bf16`: round to nearest, ties to even, from the exact value (a float widens to
//!   `f64` exactly first, so `f32 → bf16` rounds once); every NaN becomes the quiet NaN (`0x7E00`,
//!   `0x7FC0`), as torch does; overflow goes to ±∞.
//! - To `f32` and `f64`: Rust's `as`, round to nearest, ties to even; integers round once.
//! - Widening between floats is exact.
//! - To an integer: a float truncates toward zero, saturating at the range, NaN to 0; an integer
//!   keeps its low bits (a wrap, as C and numpy cast); a complex casts its real part.
//! - To `bool`: nonzero is `true`. From `bool`: 0 or 1.
//! - To a complex: the value as the real part, 0 imaginary.
//!
//! An integer past 2^53 converted to `f16` or `bf16` rounds through `f64` first, so it may round
//! twice; every such integer is far past `f16`'s range, and within bf16's ulp of the once-rounded
//! result.

use half::{bf16, f16};
use rayon::prelude::*;

use super::Element;
use crate::{Error, Result};

/// The quiet NaN every `bf16` NaN becomes.
pub const BF16_QNAN: u16 = 0x7FC0;
/// The quiet NaN every `f16` NaN becomes.
pub const F16_QNAN: u16 = 0x7E00;

/// `x` rounded to `bf16`: nearest, ties to even; every NaN to [`BF16_QNAN`].
///
/// Branch-free, so that loops over slices vectorise: just under half a `bf16` ulp plus the kept
/// last bit is added to the bits and the low half dropped (a carry rounds up, into ∞ past the
/// largest finite value).
#[inline]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    bf16::from_bits(if x.is_nan() { BF16_QNAN } else { rounded })
}

/// `x` rounded to `f16`: nearest, ties to even; every NaN to [`F16_QNAN`].
#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    if x.is_nan() {
        f16::from_bits(F16_QNAN)
    } else {
        f16::from_f32(x)
    }
}

/// `x` rounded to `f32` by *round to odd*: toward zero, then the last bit set if anything was
/// lost. Rounding that to a format of p ≤ 11 significand bits is the correct rounding of `x`
/// itself (24 ≥ 2p + 2), which is how `f64` reaches `f16` and `bf16` with one rounding.
#[inline]
fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if f.is_nan() || f as f64 == x {
        return f;
    }
    let bits = f.to_bits();
    let toward_zero = if (f as f64).abs() > x.abs() { bits - 1 } else { bits };
    f32::from_bits(toward_zero | 1)
}

/// `x` rounded to `bf16` once: nearest, ties to even; every NaN to [`BF16_QNAN`].
#[inline]
pub fn f64_to_bf16(x: f64) -> bf16 {
    f32_to_bf16(f64_to_f32_odd(x))
}

/// `x` rounded to `f16` once: nearest, ties to even; every NaN to [`F16_QNAN`].
#[inline]
pub fn f64_to_f16(x: f64) -> f16 {
    f32_to_f16(f64_to_f32_odd(x))
}

/// Slices at least this long are converted by several threads.
pub const PARALLEL_MIN: usize = 1 << 16;

/// Writes `src`'s elements, converted to `D` under this module's rules, into the caller's `dst`.
/// Slices of [`PARALLEL_MIN`] elements or more are cut into contiguous pieces converted on the
/// rayon pool; the result is the same bits either way.
///
/// # Errors
/// [`Error::LengthMismatch`] unless both slices have one length; nothing is written then.
pub fn convert<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<()> {
    convert_split("nx_kernels::convert", src, dst, (src.len() >= PARALLEL_MIN).then_some(1 << 14))
}

/// [`convert`] named `func` in its error, in contiguous pieces of `piece` elements over the
/// current rayon pool where one is given, else in one piece on the calling thread.
pub(crate) fn convert_split<S: Element, D: Element>(
    func: &'static str,
    src: &[S],
    dst: &mut [D],
    piece: Option<usize>,
) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            func,
            what: format!("{} source and {} destination", S::DTYPE, D::DTYPE),
            left: src.len(),
            right: dst.len(),
        });
    }
    let one = |(s, d): (&[S], &mut [D])| {
        for (x, y) in s.iter().zip(d.iter_mut()) {
            *y = D::from_value(x.to_value());
        }
    };
    match piece {
        Some(p) => src.par_chunks(p.max(1)).zip(dst.par_chunks_mut(p.max(1))).for_each(one),
        None => one((src, dst)),
    }
    Ok(())
}

/// `src` converted to `D`, in a fresh vector.
pub fn converted<S: Element, D: Element>(src: &[S]) -> Vec<D> {
    let mut out = vec![D::default(); src.len()];
    convert(src, &mut out).expect("lengths agree");
    out
}
