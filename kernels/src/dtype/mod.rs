//! Dtypes: what one element is, its facts, its names, and the sealed [`Element`] trait tying each
//! dtype to its Rust type.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};

use crate::{Error, Result};

pub mod convert;
pub mod fp8;
pub mod packed;
pub mod policy;
pub mod promote;
pub mod storage;

/// The element formats of nx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// `bool`, one byte, 0 or 1.
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// IEEE binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// OCP 8-bit float E4M3, without infinities ([`fp8::F8E4M3`]): `float8_e4m3fn`.
    F8E4M3,
    /// OCP 8-bit float E5M2, IEEE-like ([`fp8::F8E5M2`]): `float8_e5m2`.
    F8E5M2,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Complex of two `f32` (`num_complex::Complex32`).
    C64,
    /// Complex of two `f64` (`num_complex::Complex64`).
    C128,
    /// 4-bit two's complement integers, two to a byte ([`packed::I4`]).
    I4,
    /// 4-bit unsigned integers, two to a byte ([`packed::U4`]).
    U4,
    /// Single bits, eight to a byte, read as `bool` ([`packed::Bit`]).
    Bit,
}

/// The kind of a dtype, ordered as promotion ranks kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `bool`.
    Bool,
    /// Unsigned integers.
    Uint,
    /// Signed integers.
    Int,
    /// Real floats.
    Float,
    /// Complex floats.
    Complex,
}

impl Kind {
    /// The kind's name: `bool`, `uint`, `int`, `float`, `complex`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Uint => "uint",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Complex => "complex",
        }
    }
}

impl Dtype {
    /// Every dtype, in a fixed order.
    pub const ALL: [Dtype; 20] = [
        Dtype::Bool,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::C64,
        Dtype::C128,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
        Dtype::I4,
        Dtype::U4,
        Dtype::Bit,
    ];

    /// Bytes per element; 1 for a dtype narrower than a byte, the byte that holds the element
    /// ([`Dtype::bits`] gives its width, [`Dtype::bytes`] the bytes of `n` elements).
    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            Bool | I8 | U8 | F8E4M3 | F8E5M2 | I4 | U4 | Bit => 1,
            I16 | U16 | F16 | BF16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 | C64 => 8,
            C128 => 16,
        }
    }

    /// Bits per element: 1 for `bit`, 4 for `int4` and `uint4`, `8 · size` otherwise.
    pub fn bits(self) -> usize {
        match self {
            Dtype::Bit => 1,
            Dtype::I4 | Dtype::U4 => 4,
            d => 8 * d.size(),
        }
    }

    /// Whether the dtype is narrower than a byte (`int4`, `uint4`, `bit`): packed.
    pub fn is_packed(self) -> bool {
        self.bits() < 8
    }

    /// The bytes `n` elements take, packed: `⌈n · bits / 8⌉`; `None` where that overflows.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::Dtype;
    /// assert_eq!((Dtype::I4.bytes(5), Dtype::Bit.bytes(9), Dtype::F32.bytes(3)), (Some(3), Some(2), Some(12)));
    /// ```
    pub fn bytes(self, n: usize) -> Option<usize> {
        n.checked_mul(self.bits()).map(|b| b.div_ceil(8))
    }

    /// The alignment an element's first byte needs: its width, one component's for a complex.
    pub fn align(self) -> usize {
        match self {
            Dtype::C64 => 4,
            Dtype::C128 => 8,
            d => d.size(),
        }
    }

    /// The dtype's kind.
    pub fn kind(self) -> Kind {
        use Dtype::*;
        match self {
            Bool | Bit => Kind::Bool,
            I4 | I8 | I16 | I32 | I64 => Kind::Int,
            U4 | U8 | U16 | U32 | U64 => Kind::Uint,
            F16 | BF16 | F32 | F64 | F8E4M3 | F8E5M2 => Kind::Float,
            C64 | C128 => Kind::Complex,
        }
    }

    /// Whether the dtype is a real or complex float.
    pub fn is_float(self) -> bool {
        matches!(self.kind(), Kind::Float | Kind::Complex)
    }

    /// The canonical name (`float16`, `bfloat16`, `complex64`, …), as the Array API spells it.
    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "bool",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            U8 => "uint8",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
            F16 => "float16",
            BF16 => "bfloat16",
            F8E4M3 => "float8_e4m3fn",
            F8E5M2 => "float8_e5m2",
            F32 => "float32",
            F64 => "float64",
            C64 => "complex64",
            C128 => "complex128",
            I4 => "int4",
            U4 => "uint4",
            Bit => "bit",
        }
    }

    /// The short name (`f16`, `bf16`, `c64`, `i32`, …), as the command line takes it.
    pub fn short_name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "bool",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            U8 => "u8",
            U16 => "u16",
            U32 => "u32",
            U64 => "u64",
            F16 => "f16",
            BF16 => "bf16",
            F8E4M3 => "f8e4m3",
            F8E5M2 => "f8e5m2",
            F32 => "f32",
            F64 => "f64",
            C64 => "c64",
            C128 => "c128",
            I4 => "i4",
            U4 => "u4",
            Bit => "bit",
        }
    }

    /// The safetensors name (`BF16`, `F32`, `BOOL`, `C64`, `F8_E4M3`, …); safetensors has no
    /// sub-byte dtype, and nx names them `I4`, `U4` and `BIT`.
    pub fn safetensors_name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "BOOL",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            U8 => "U8",
            U16 => "U16",
            U32 => "U32",
            U64 => "U64",
            F16 => "F16",
            BF16 => "BF16",
            F8E4M3 => "F8_E4M3",
            F8E5M2 => "F8_E5M2",
            F32 => "F32",
            F64 => "F64",
            C64 => "C64",
            C128 => "C128",
            I4 => "I4",
            U4 => "U4",
            Bit => "BIT",
        }
    }

    /// The dtype reductions and scans of this dtype combine in: `f32` for a float narrower than
    /// it (`f16`, `bf16`, the fp8s), `int8`, `uint8` and `bool` for `int4`, `uint4` and `bit`,
    /// the dtype itself otherwise.
    pub fn carrier(self) -> Dtype {
        match self {
            Dtype::F16 | Dtype::BF16 | Dtype::F8E4M3 | Dtype::F8E5M2 => Dtype::F32,
            Dtype::I4 => Dtype::I8,
            Dtype::U4 => Dtype::U8,
            Dtype::Bit => Dtype::Bool,
            d => d,
        }
    }

    /// The smallest finite value, as an `f64` (exact for every dtype but `i64`/`u64`'s extremes,
    /// which round); 0 for `bool`, and for complex dtypes that of one component.
    pub fn min_value(self) -> f64 {
        use Dtype::*;
        match self {
            Bool | Bit | U4 | U8 | U16 | U32 | U64 => 0.0,
            I4 => -8.0,
            I8 => i8::MIN as f64,
            I16 => i16::MIN as f64,
            I32 => i32::MIN as f64,
            I64 => i64::MIN as f64,
            F16 => f16::MIN.to_f64(),
            BF16 => bf16::MIN.to_f64(),
            F8E4M3 => -f64::from(fp8::Fp8::E4M3.max()),
            F8E5M2 => -f64::from(fp8::Fp8::E5M2.max()),
            F32 | C64 => f32::MIN as f64,
            F64 | C128 => f64::MIN,
        }
    }

    /// The largest finite value, as [`Dtype::min_value`] gives the smallest.
    pub fn max_value(self) -> f64 {
        use Dtype::*;
        match self {
            Bool | Bit => 1.0,
            I4 => 7.0,
            U4 => 15.0,
            U8 => u8::MAX as f64,
            U16 => u16::MAX as f64,
            U32 => u32::MAX as f64,
            U64 => u64::MAX as f64,
            I8 => i8::MAX as f64,
            I16 => i16::MAX as f64,
            I32 => i32::MAX as f64,
            I64 => i64::MAX as f64,
            F16 => f16::MAX.to_f64(),
            BF16 => bf16::MAX.to_f64(),
            F8E4M3 => f64::from(fp8::Fp8::E4M3.max()),
            F8E5M2 => f64::from(fp8::Fp8::E5M2.max()),
            F32 | C64 => f32::MAX as f64,
            F64 | C128 => f64::MAX,
        }
    }

    /// The integer range of an integer or bool dtype, exactly; `None` for floats.
    pub fn int_range(self) -> Option<(i128, i128)> {
        use Dtype::*;
        Some(match self {
            Bool | Bit => (0, 1),
            I4 => (-8, 7),
            U4 => (0, 15),
            I8 => (i8::MIN.into(), i8::MAX.into()),
            I16 => (i16::MIN.into(), i16::MAX.into()),
            I32 => (i32::MIN.into(), i32::MAX.into()),
            I64 => (i64::MIN.into(), i64::MAX.into()),
            U8 => (0, u8::MAX.into()),
            U16 => (0, u16::MAX.into()),
            U32 => (0, u32::MAX.into()),
            U64 => (0, u64::MAX.into()),
            _ => return None,
        })
    }
}

impl fmt::Display for Dtype {
    /// The short name (`f32`, `bf16`, …), the spelling refusals and `nx` commands use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

impl FromStr for Dtype {
    type Err = Error;

    /// Reads a dtype by any of its names: canonical (`float16`), short (`f16`), safetensors
    /// (`F16`, `BF16`), torch (`torch.float16`, `torch.half`), numpy-ish aliases (`half`,
    /// `float`, `double`, `cfloat`, `cdouble`), autotune keys (`fp16`, `bf16`, `fp32`, `fp64`).
    /// Case does not matter.
    fn from_str(text: &str) -> Result<Dtype> {
        let t = text.trim();
        let t = t.strip_prefix("torch.").or_else(|| t.strip_prefix("np.")).unwrap_or(t);
        let lower = t.to_ascii_lowercase();
        if let Some(d) = Dtype::ALL
            .iter()
            .copied()
            .find(|d| lower == d.name() || lower == d.short_name() || t == d.safetensors_name())
        {
            return Ok(d);
        }
        use Dtype::*;
        Ok(match lower.as_str() {
            "half" | "fp16" => F16,
            "bfloat" | "brain_float16" => BF16,
            "float8_e4m3" | "fp8_e4m3" | "e4m3" | "fp8e4m3" | "f8e4m3fn" => F8E4M3,
            "fp8_e5m2" | "e5m2" | "fp8e5m2" => F8E5M2,
            "float" | "single" | "fp32" => F32,
            "double" | "fp64" => F64,
            "cfloat" | "complex" | "complex_float" => C64,
            "cdouble" | "complex_double" => C128,
            "char" => I8,
            "byte" | "uchar" => U8,
            "short" => I16,
            "int" => I32,
            "long" => I64,
            "boolean" | "bool_" => Bool,
            "int4_t" | "qint4" => I4,
            "uint4_t" | "quint4" => U4,
            "bit1" | "b1" | "bits" => Bit,
            _ => return Err(Error::UnknownDtype { name: text.to_string() }),
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element of one [`Dtype`]. Sealed: implemented for `bool`, the integer
/// types, `half::f16`, `half::bf16`, [`fp8::F8E4M3`], [`fp8::F8E5M2`], `f32`, `f64`, `Complex32`,
/// `Complex64`, and the packed [`packed::I4`], [`packed::U4`] and [`packed::Bit`].
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static + sealed::Sealed {
    /// The dtype of this type.
    const DTYPE: Dtype;
    /// The element as a [`Value`], exactly.
    fn to_value(self) -> Value;
    /// The element nearest `v` under nx's conversion rules ([`convert`]).
    fn from_value(v: Value) -> Self;
    /// Reads the element at `p`.
    ///
    /// # Safety
    /// `p` must be valid for reads of `size_of::<Self>()` bytes and aligned to `align_of::<Self>()`.
    unsafe fn load(p: *const u8) -> Self;
    /// Writes `v` at `p`.
    ///
    /// # Safety
    /// `p` must be valid for writes of `size_of::<Self>()` bytes and aligned to
    /// `align_of::<Self>()`.
    unsafe fn store(p: *mut u8, v: Self);
    /// Reads the element at position `pos` of memory from `base`: the bytes at `pos · size`, or
    /// for a packed dtype the field at bit `pos · bits` ([`packed`]).
    ///
    /// # Safety
    /// The element's bytes must be valid for reads, and aligned as [`Element::load`] needs.
    #[inline]
    unsafe fn load_at(base: *const u8, pos: isize) -> Self {
        // SAFETY: the caller's contract.
        unsafe { Self::load(base.offset(pos * Self::DTYPE.size() as isize)) }
    }
    /// Writes `v` at position `pos` of memory from `base`, as [`Element::load_at`] reads it; a
    /// packed element keeps the other elements of its byte (an atomic read-modify-write).
    ///
    /// # Safety
    /// The element's bytes must be valid for writes, and aligned as [`Element::store`] needs.
    #[inline]
    unsafe fn store_at(base: *mut u8, pos: isize, v: Self) {
        // SAFETY: the caller's contract.
        unsafe { Self::store(base.offset(pos * Self::DTYPE.size() as isize), v) }
    }
}

macro_rules! packed_element {
    ($t:ty, $d:ident, $bits:expr, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
            #[inline]
            fn to_value(self) -> Value {
                let f: fn($t) -> Value = $to;
                f(self)
            }
            #[inline]
            fn from_value(v: Value) -> Self {
                let f: fn(Value) -> $t = $from;
                f(v)
            }
            /// The element in the low bits of the byte at `p`.
            #[inline]
            unsafe fn load(p: *const u8) -> Self {
                // SAFETY: the caller's contract.
                unsafe { Self::load_at(p, 0) }
            }
            /// Stores into the low bits of the byte at `p`, keeping its others.
            #[inline]
            unsafe fn store(p: *mut u8, v: Self) {
                // SAFETY: the caller's contract.
                unsafe { Self::store_at(p, 0, v) }
            }
            #[inline]
            unsafe fn load_at(base: *const u8, pos: isize) -> Self {
                let (byte, shift) = packed::locate(pos, $bits);
                // SAFETY: the caller's contract: the element's byte is valid for reads.
                <$t>::from_bits(unsafe { packed::load_field(base.offset(byte), shift, $bits) })
            }
            #[inline]
            unsafe fn store_at(base: *mut u8, pos: isize, v: Self) {
                let (byte, shift) = packed::locate(pos, $bits);
                // SAFETY: the caller's contract: the element's byte is valid for writes.
                unsafe { packed::store_field(base.offset(byte), shift, $bits, v.to_bits()) }
            }
        }
    };
}

packed_element!(packed::I4, I4, 4, |x| Value::Int(x.get().into()), |v| packed::I4::wrapping(packed::int_of(v, -8, 7)));
packed_element!(packed::U4, U4, 4, |x| Value::Int(x.get().into()), |v| packed::U4::wrapping(packed::int_of(v, 0, 15)));
packed_element!(packed::Bit, Bit, 1, |x| Value::Bool(x.get()), |v| packed::Bit(truthy(v)));

/// One element of any dtype, held exactly: the meeting point of conversions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A boolean.
    Bool(bool),
    /// An integer (every integer dtype fits).
    Int(i128),
    /// A real float (every real float dtype widens exactly to `f64`).
    Float(f64),
    /// A complex float.
    Complex(Complex64),
}

macro_rules! element {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
            #[inline]
            fn to_value(self) -> Value {
                let f: fn($t) -> Value = $to;
                f(self)
            }
            #[inline]
            fn from_value(v: Value) -> Self {
                let f: fn(Value) -> $t = $from;
                f(v)
            }
            #[inline]
            unsafe fn load(p: *const u8) -> Self {
                // SAFETY: the caller's contract; every bit pattern is a valid $t.
                unsafe { p.cast::<$t>().read() }
            }
            #[inline]
            unsafe fn store(p: *mut u8, v: Self) {
                // SAFETY: the caller's contract.
                unsafe { p.cast::<$t>().write(v) }
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        element!($t, $d, |x| Value::Int(x as i128), |v| match v {
            Value::Bool(b) => b as $t,
            // wraps to the low bits, as C and numpy's casts of integers do
            Value::Int(i) => i as $t,
            // toward zero, saturating, NaN to 0 (Rust's `as`)
            Value::Float(f) => f as $t,
            Value::Complex(c) => c.re as $t,
        });
    };
}

int_element!(i8, I8);
int_element!(i16, I16);
int_element!(i32, I32);
int_element!(i64, I64);
int_element!(u8, U8);
int_element!(u16, U16);
int_element!(u32, U32);
int_element!(u64, U64);

fn truthy(v: Value) -> bool {
    match v {
        Value::Bool(b) => b,
        Value::Int(i) => i != 0,
        Value::Float(f) => f != 0.0,
        Value::Complex(c) => c.re != 0.0 || c.im != 0.0,
    }
}

fn real(v: Value) -> f64 {
    match v {
        Value::Bool(b) => f64::from(u8::from(b)),
        Value::Int(i) => i as f64,
        Value::Float(f) => f,
        Value::Complex(c) => c.re,
    }
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
    #[inline]
    fn to_value(self) -> Value {
        Value::Bool(self)
    }
    #[inline]
    fn from_value(v: Value) -> Self {
        truthy(v)
    }
    #[inline]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller's contract. Read as a byte, so that any bits (a bitcast) give a valid
        // bool: nonzero is true.
        unsafe { p.read() != 0 }
    }
    #[inline]
    unsafe fn store(p: *mut u8, v: Self) {
        // SAFETY: the caller's contract.
        unsafe { p.write(u8::from(v)) }
    }
}
element!(f64, F64, Value::Float, real);
element!(f32, F32, |x| Value::Float(x.into()), |v| match v {
    Value::Int(i) => i as f32,
    v => real(v) as f32,
});
element!(f16, F16, |x| Value::Float(x.to_f64()), |v| convert::f64_to_f16(real(v)));
element!(bf16, BF16, |x| Value::Float(x.to_f64()), |v| convert::f64_to_bf16(real(v)));
element!(fp8::F8E4M3, F8E4M3, |x| Value::Float(x.to_f64()), |v| fp8::F8E4M3::from_f64(real(v)));
element!(fp8::F8E5M2, F8E5M2, |x| Value::Float(x.to_f64()), |v| fp8::F8E5M2::from_f64(real(v)));
element!(Complex32, C64, |x| Value::Complex(Complex64::new(x.re.into(), x.im.into())), |v| match v {
    Value::Complex(c) => Complex32::new(c.re as f32, c.im as f32),
    v => Complex32::new(f32::from_value(v), 0.0),
});
element!(Complex64, C128, Value::Complex, |v| match v {
    Value::Complex(c) => c,
    v => Complex64::new(real(v), 0.0),
});
