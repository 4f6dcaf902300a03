//! The dtypes narrower than a byte: `int4`, `uint4` and `bit`, packed.
//!
//! An array of them numbers its elements by position as every array does; the element at
//! position `p` is the `bits`-wide field at bit `p · bits` of its buffer, counted from the least
//! significant bit of the first byte (element 0 of a byte is its low nibble, or its bit 0: the
//! order of numpy's `packbits(bitorder="little")`, PyTorch's `uint4x2` and GGML's). No element
//! straddles two bytes. A store to one element keeps the other elements of its byte, whoever
//! stores to them meanwhile: it is an atomic read-modify-write of that byte.
//!
//! `int4` is two's complement (−8..=7), `uint4` is 0..=15, `bit` is 0 or 1 read as a `bool`.
//! Conversions into them follow the integer rules ([`super::convert`]): an integer keeps its low
//! bits, a float truncates toward zero and saturates at the range (NaN to 0); into `bit`, nonzero
//! is 1.

use std::sync::atomic::{AtomicU8, Ordering};

use super::Value;

/// Stores the `bits`-wide field `v` at bit `shift` of the byte at `p`, keeping its other bits,
/// atomically.
///
/// # Safety
/// `p` must be valid for reads and writes of one byte, and every other access to that byte must
/// be atomic or ordered with this one (the door's claims order the host's accesses).
#[inline]
pub(crate) unsafe fn store_field(p: *mut u8, shift: u32, bits: u32, v: u8) {
    let mask = (((1u16 << bits) - 1) as u8) << shift;
    // SAFETY: the caller's contract; AtomicU8 has the size and alignment of u8.
    let cell = unsafe { AtomicU8::from_ptr(p) };
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((b & !mask) | ((v << shift) & mask)));
}

/// Reads the `bits`-wide field at bit `shift` of the byte at `p`.
///
/// # Safety
/// `p` must be valid for a read of one byte.
#[inline]
pub(crate) unsafe fn load_field(p: *const u8, shift: u32, bits: u32) -> u8 {
    // SAFETY: the caller's contract; read atomically, as other elements of the byte may be
    // stored to meanwhile.
    let b = unsafe { AtomicU8::from_ptr(p as *mut u8) }.load(Ordering::Relaxed);
    (b >> shift) & (((1u16 << bits) - 1) as u8)
}

/// The byte and the shift of the `bits`-wide element at position `pos` from `base`.
#[inline]
pub(crate) fn locate(pos: isize, bits: u32) -> (isize, u32) {
    let bit = pos * bits as isize;
    (bit.div_euclid(8), bit.rem_euclid(8) as u32)
}

/// An element of `int4` ([`crate::Dtype::I4`]): −8..=7.
///
/// # Examples
/// ```
/// use nx_kernels::dtype::packed::I4;
/// assert_eq!(I4::new(-8).unwrap().to_bits(), 0x8);
/// assert_eq!(I4::from_bits(0xF).get(), -1);
/// assert_eq!(I4::wrapping(9).get(), -7); // the low 4 bits of 9
/// assert!(I4::new(8).is_none());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct I4(i8);

impl I4 {
    /// The least value, −8.
    pub const MIN: I4 = I4(-8);
    /// The greatest value, 7.
    pub const MAX: I4 = I4(7);

    /// `v` where it lies in −8..=7.
    pub const fn new(v: i8) -> Option<I4> {
        if v >= -8 && v <= 7 {
            Some(I4(v))
        } else {
            None
        }
    }

    /// The low 4 bits of `v`, as two's complement.
    pub const fn wrapping(v: i128) -> I4 {
        I4::from_bits(v as u8)
    }

    /// The element of the low 4 bits of `b` (the other bits ignored).
    pub const fn from_bits(b: u8) -> I4 {
        I4((((b & 0xF) as i8) << 4) >> 4)
    }

    /// The element's 4 bits, in the low nibble.
    pub const fn to_bits(self) -> u8 {
        (self.0 as u8) & 0xF
    }

    /// The value.
    pub const fn get(self) -> i8 {
        self.0
    }
}

/// An element of `uint4` ([`crate::Dtype::U4`]): 0..=15.
///
/// # Examples
/// ```
/// use nx_kernels::dtype::packed::U4;
/// assert_eq!(U4::new(15).unwrap().get(), 15);
/// assert_eq!(U4::wrapping(-1).get(), 15);
/// assert!(U4::new(16).is_none());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct U4(u8);

impl U4 {
    /// The greatest value, 15.
    pub const MAX: U4 = U4(15);

    /// `v` where it lies in 0..=15.
    pub const fn new(v: u8) -> Option<U4> {
        if v <= 15 {
            Some(U4(v))
        } else {
            None
        }
    }

    /// The low 4 bits of `v`.
    pub const fn wrapping(v: i128) -> U4 {
        U4((v as u8) & 0xF)
    }

    /// The element of the low 4 bits of `b`.
    pub const fn from_bits(b: u8) -> U4 {
        U4(b & 0xF)
    }

    /// The element's 4 bits, in the low nibble.
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// The value.
    pub const fn get(self) -> u8 {
        self.0
    }
}

/// An element of `bit` ([`crate::Dtype::Bit`]): one bit, read as a `bool`.
///
/// # Examples
/// ```
/// use nx_kernels::dtype::packed::Bit;
/// assert!(Bit(true).get() && !Bit::from_bits(0b10).get());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bit(pub bool);

impl Bit {
    /// The element of the low bit of `b`.
    pub const fn from_bits(b: u8) -> Bit {
        Bit(b & 1 == 1)
    }

    /// The element's bit, in bit 0.
    pub const fn to_bits(self) -> u8 {
        self.0 as u8
    }

    /// The value.
    pub const fn get(self) -> bool {
        self.0
    }
}

/// A float converted by the integer rules into `lo..=hi`: truncated toward zero, saturated,
/// NaN to 0.
fn saturate(f: f64, lo: i128, hi: i128) -> i128 {
    if f.is_nan() {
        0
    } else {
        (f.trunc().clamp(lo as f64, hi as f64)) as i128
    }
}

/// The integer `v` converts to before keeping low bits, for an element of range `lo..=hi`.
pub(crate) fn int_of(v: Value, lo: i128, hi: i128) -> i128 {
    match v {
        Value::Bool(b) => i128::from(b),
        Value::Int(i) => i,
        Value::Float(f) => saturate(f, lo, hi),
        Value::Complex(c) => saturate(c.re, lo, hi),
    }
}
