//! The OCP 8-bit float formats, E4M3 and E5M2: decoding each bit pattern exactly and encoding a
//! value with one rounding to nearest, ties to even.
//!
//! E4M3 (bias 7) has no infinities: its only NaNs are `S.1111.111`, and its largest finite value
//! is 448. E5M2 (bias 15) is IEEE-like: `S.11111.00` is ±∞, `S.11111.xx` (xx ≠ 00) NaNs, and its
//! largest finite value is 57344. Both have subnormals and a signed zero.
//!
//! Encoding rounds the exact value once (from `f64`, so an `f32` or `f64` rounds directly, never
//! through a narrower float). A value that rounds past the largest finite one overflows: to NaN
//! in E4M3 and to ±∞ in E5M2 (numpy's `ml_dtypes` casts); the saturating encoding gives ±max in
//! its place, and for an infinity too in E4M3, while E5M2 keeps its infinities. A format's own
//! cast ([`Fp8::saturates`]) is the OCP rule PyTorch's casts follow: E4M3, without infinities,
//! saturates; E5M2 overflows to ±∞. A NaN encodes as the format's NaN of its sign
//! (`S.1111.111`, `S.11111.10`).

/// One of the OCP 8-bit float formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits, no infinities: `float8_e4m3fn`.
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits, with infinities: `float8_e5m2`.
    E5M2,
}

impl Fp8 {
    /// (exponent bits, mantissa bits, bias).
    fn fields(self) -> (u32, u32, i32) {
        match self {
            Fp8::E4M3 => (4, 3, 7),
            Fp8::E5M2 => (5, 2, 15),
        }
    }

    /// The largest finite value: 448 or 57344.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::Fp8;
    /// assert_eq!((Fp8::E4M3.max(), Fp8::E5M2.max()), (448.0, 57344.0));
    /// ```
    pub fn max(self) -> f32 {
        self.decode(self.max_bits())
    }

    /// Whether the format's own cast saturates ([`Fp8::cast`]): E4M3, which has no infinities,
    /// does; E5M2 does not.
    pub fn saturates(self) -> bool {
        self == Fp8::E4M3
    }

    /// `x` encoded as the format's own cast does: [`Fp8::encode`], saturating where
    /// [`Fp8::saturates`].
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::Fp8;
    /// assert_eq!((Fp8::E4M3.cast(1e9), Fp8::E5M2.cast(1e9)), (0x7E, 0x7C));
    /// ```
    pub fn cast(self, x: f64) -> u8 {
        self.encode(x, self.saturates())
    }

    /// The bits of the largest finite value, positive.
    fn max_bits(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7E,
            Fp8::E5M2 => 0x7B,
        }
    }

    /// The format's NaN of the given sign.
    fn nan(self, negative: bool) -> u8 {
        let s = if negative { 0x80 } else { 0 };
        match self {
            Fp8::E4M3 => s | 0x7F,
            Fp8::E5M2 => s | 0x7E,
        }
    }

    /// The value of bit pattern `b`, exactly (every one is an `f32`).
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::Fp8;
    /// assert_eq!(Fp8::E4M3.decode(0x38), 1.0);
    /// assert_eq!(Fp8::E4M3.decode(0x01), 2f32.powi(-9)); // the least subnormal
    /// assert!(Fp8::E4M3.decode(0x7F).is_nan() && Fp8::E5M2.decode(0xFC) == f32::NEG_INFINITY);
    /// ```
    pub fn decode(self, b: u8) -> f32 {
        let (eb, mb, bias) = self.fields();
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let e = u32::from(b >> mb) & ((1 << eb) - 1);
        let m = u32::from(b) & ((1 << mb) - 1);
        let top = (1 << eb) - 1;
        match self {
            Fp8::E4M3 if e == top && m == (1 << mb) - 1 => return f32::NAN.copysign(sign),
            Fp8::E5M2 if e == top => return if m == 0 { sign * f32::INFINITY } else { f32::NAN.copysign(sign) },
            _ => {}
        }
        // every term is exact in f32: at most 4 significant bits, exponents within f32's range
        let unit = 2f32.powi(1 - bias - mb as i32);
        let magnitude = if e == 0 { m as f32 * unit } else { ((1 << mb) + m) as f32 * unit * 2f32.powi(e as i32 - 1) };
        sign * magnitude
    }

    /// `x` rounded to nearest, ties to even, into the format; overflowing to NaN (E4M3) or ±∞
    /// (E5M2), or to ±max where `saturate`.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::Fp8;
    /// assert_eq!(Fp8::E4M3.encode(1.0, false), 0x38);
    /// assert_eq!(Fp8::E4M3.encode(464.0, false), 0x7E); // a tie: to the even 448
    /// assert_eq!(Fp8::E4M3.encode(480.0, false), 0x7F); // past 448: NaN
    /// assert_eq!(Fp8::E4M3.encode(480.0, true), 0x7E);
    /// assert_eq!(Fp8::E5M2.encode(-1e9, false), 0xFC); // -∞
    /// ```
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        let (_, mb, bias) = self.fields();
        let negative = x.is_sign_negative();
        let s: u8 = if negative { 0x80 } else { 0 };
        if x.is_nan() {
            return self.nan(negative);
        }
        let over = || match (self, saturate) {
            (_, true) => s | self.max_bits(),
            (Fp8::E4M3, false) => s | 0x7F,
            (Fp8::E5M2, false) => s | 0x7C,
        };
        let a = x.abs();
        if a.is_infinite() {
            return if self == Fp8::E5M2 { s | 0x7C } else { over() };
        }
        if a >= 2.0 * f64::from(self.max()) {
            return over();
        }
        // a in units of the least subnormal, 2^(1 - bias - mb): exact (a power-of-two scaling of
        // a value far below f64's overflow), then rounded to an integer, ties to even. Below the
        // least normal the integer is the subnormal's mantissa (2^mb of them make the least
        // normal, which the same bits encode); above, only mb + 1 significant bits survive.
        let units = a * 2f64.powi(bias + mb as i32 - 1);
        let normal_units = f64::from(1u32 << mb);
        let q = if units < normal_units {
            units.round_ties_even() as u64
        } else {
            // keep mb + 1 significant bits: round units / 2^k to an integer, k its excess bits
            // units is a normal f64 of at least 2^mb: its exponent field is its binary order
            let order = ((units.to_bits() >> 52) & 0x7FF) as i32 - 1023;
            let step = 2f64.powi(order - mb as i32);
            let r = (units / step).round_ties_even() * step; // exact: both scalings are powers of two
            r as u64
        };
        // q units: encode as (exponent, mantissa)
        if q < (1 << mb) {
            return s | q as u8;
        }
        let e = 63 - q.leading_zeros(); // q in [2^e, 2^(e+1))
        let exponent = e - mb + 1; // the biased exponent field: q = 2^mb units is exponent 1
        let mantissa = (q >> (e - mb)) & ((1 << mb) - 1);
        let bits = (exponent as u64) << mb | mantissa;
        let limit = u64::from(self.max_bits());
        if bits > limit {
            return over();
        }
        s | bits as u8
    }
}

macro_rules! fp8_element {
    ($(#[$doc:meta])* $name:ident, $fmt:expr) => {
        $(#[$doc])*
        ///
        /// Its bits are the format's; [`PartialEq`] compares values as IEEE floats do (a NaN equals
        /// nothing, `-0` equals `+0`), and [`Default`] is `+0`.
        #[derive(Clone, Copy, Default)]
        #[repr(transparent)]
        pub struct $name(u8);

        impl $name {
            /// The format of this type.
            pub const FORMAT: Fp8 = $fmt;

            /// The element of bit pattern `bits`.
            pub const fn from_bits(bits: u8) -> $name {
                $name(bits)
            }

            /// The element's bit pattern.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// The element's value, exactly.
            #[inline]
            pub fn to_f32(self) -> f32 {
                Self::FORMAT.decode(self.0)
            }

            /// Whether the element is a NaN.
            #[inline]
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }

            /// The element's value, exactly.
            #[inline]
            pub fn to_f64(self) -> f64 {
                f64::from(self.to_f32())
            }

            /// `x` rounded once into the format, as its own cast does ([`Fp8::cast`]).
            #[inline]
            pub fn from_f64(x: f64) -> $name {
                $name(Self::FORMAT.cast(x))
            }

            /// `x` rounded once into the format, as its own cast does ([`Fp8::cast`]).
            #[inline]
            pub fn from_f32(x: f32) -> $name {
                Self::from_f64(f64::from(x))
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &$name) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        impl std::fmt::Debug for $name {
            /// The value, as `f32` prints it.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.to_f32(), f)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    };
}

fp8_element!(
    /// An element of `float8_e4m3fn` ([`Fp8::E4M3`]), the [`crate::Dtype::F8E4M3`] dtype.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::F8E4M3;
    /// assert_eq!(F8E4M3::from_f32(1.0).to_bits(), 0x38);
    /// assert_eq!(F8E4M3::from_f32(1e6).to_f32(), 448.0); // the format's cast saturates
    /// ```
    F8E4M3,
    Fp8::E4M3
);
fp8_element!(
    /// An element of `float8_e5m2` ([`Fp8::E5M2`]), the [`crate::Dtype::F8E5M2`] dtype.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::dtype::fp8::F8E5M2;
    /// assert_eq!(F8E5M2::from_f32(-2.0).to_bits(), 0xC0);
    /// assert_eq!(F8E5M2::from_f32(1e6).to_f32(), f32::INFINITY); // past 57344: ∞
    /// ```
    F8E5M2,
    Fp8::E5M2
);
