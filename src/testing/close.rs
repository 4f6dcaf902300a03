//! Comparing results: within a relative and absolute tolerance, or exactly (bit for bit, for
//! integer and bitwise results), with a readable report of the first difference.

use std::fmt;

use nx_kernels::{Element, Value};

/// How close two results must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tol {
    /// The same bits (floats: NaN payloads too; +0 and −0 differ).
    Exact,
    /// `|got − want| ≤ abs + rel·|want|` for every element (complex: the modulus of the
    /// difference; integers: their exact difference); NaN only where a NaN is wanted (a complex
    /// value with a NaN part counts as NaN), ±∞ only where the same infinity is.
    Close {
        /// Relative tolerance.
        rel: f64,
        /// Absolute tolerance.
        abs: f64,
    },
}

impl Tol {
    /// `Close` with relative tolerance `rel` and absolute tolerance `abs`.
    pub fn close(rel: f64, abs: f64) -> Tol {
        Tol::Close { rel, abs }
    }
}

/// Where two results differ: the first element that does, how many do, and the lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The elements of the result.
    pub got_len: usize,
    /// The elements wanted.
    pub want_len: usize,
    /// The first differing index (`None` where only the lengths differ).
    pub first: Option<usize>,
    /// The result there and the value wanted, in words.
    pub values: Option<(String, String)>,
    /// The absolute and relative error there (floats).
    pub error: Option<(f64, f64)>,
    /// How many elements differ (of the common length).
    pub count: usize,
    /// The tolerance.
    pub tol: Tol,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.got_len != self.want_len {
            write!(f, "lengths differ: got {} elements, want {}", self.got_len, self.want_len)?;
            if self.first.is_some() {
                f.write_str("; ")?;
            }
        }
        if let (Some(i), Some((g, w))) = (self.first, &self.values) {
            write!(
                f,
                "{} of {} elements differ; the first at index {i}: got {g}, want {w}",
                self.count,
                self.got_len.min(self.want_len)
            )?;
            if let Some((abs, rel)) = self.error {
                write!(f, " (error {abs:e}, relative {rel:e})")?;
            }
            match self.tol {
                Tol::Exact => f.write_str(", bit for bit")?,
                Tol::Close { rel, abs } => write!(f, ", tolerance rel {rel:e} abs {abs:e}")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Difference {}

/// The bits of a value, for exact comparison (floats by their own bits).
fn bits<T: Element>(v: T) -> [u64; 2] {
    let mut b = [0u64; 2];
    // SAFETY: 16 bytes aligned to 8 hold any element of nx's dtypes (at most 16 bytes, aligned to
    // at most 8); `store` writes its `size` bytes and the rest stay 0.
    unsafe { T::store(b.as_mut_ptr().cast(), v) };
    b
}

/// Whether `g` is within `tol` of `w`; with the absolute and relative error for floats.
fn within(g: Value, w: Value, rel: f64, abs: f64) -> (bool, Option<(f64, f64)>) {
    let real = |v: Value| match v {
        Value::Bool(b) => Some(f64::from(u8::from(b))),
        Value::Int(i) => Some(i as f64),
        Value::Float(x) => Some(x),
        Value::Complex(_) => None,
    };
    match (g, w) {
        (Value::Complex(a), Value::Complex(b)) => {
            let (na, nb) = (a.re.is_nan() || a.im.is_nan(), b.re.is_nan() || b.im.is_nan());
            if na || nb {
                return (na && nb, None);
            }
            let d = (a - b).norm();
            (a == b || d <= abs + rel * b.norm(), Some((d, if b.norm() == 0.0 { d } else { d / b.norm() })))
        }
        (Value::Int(a), Value::Int(b)) => {
            // exactly: the difference of two integers of any dtype fits i128
            let d = (a - b).unsigned_abs() as f64;
            (a == b || d <= abs + rel * (b as f64).abs(), Some((d, if b == 0 { d } else { d / (b as f64).abs() })))
        }
        (a, b) => match (real(a), real(b)) {
            (Some(x), Some(y)) => {
                if y.is_nan() || x.is_nan() {
                    return (x.is_nan() && y.is_nan(), None);
                }
                if y.is_infinite() || x.is_infinite() {
                    return (x == y, None);
                }
                let d = (x - y).abs();
                (d <= abs + rel * y.abs(), Some((d, if y == 0.0 { d } else { d / y.abs() })))
            }
            _ => (false, None),
        },
    }
}

/// Compares `got` with `want` element by element.
///
/// # Errors
/// The [`Difference`]: lengths that differ, or elements outside `tol`.
pub fn check_close<T: Element>(got: &[T], want: &[T], tol: Tol) -> Result<(), Box<Difference>> {
    let mut first = None;
    let mut count = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (ok, error) = match tol {
            Tol::Exact => (bits(g) == bits(w), None),
            Tol::Close { rel, abs } => within(g.to_value(), w.to_value(), rel, abs),
        };
        if !ok {
            count += 1;
            if first.is_none() {
                first = Some((i, format!("{g:?}"), format!("{w:?}"), error));
            }
        }
    }
    if count == 0 && got.len() == want.len() {
        return Ok(());
    }
    Err(Box::new(Difference {
        got_len: got.len(),
        want_len: want.len(),
        first: first.as_ref().map(|f| f.0),
        values: first.as_ref().map(|f| (f.1.clone(), f.2.clone())),
        error: first.and_then(|f| f.3),
        count,
        tol,
    }))
}

/// Asserts `got` is within `tol` of `want` (see [`check_close`]).
///
/// # Examples
///
/// ```
/// use nx::testing::{assert_close, Tol};
///
/// assert_close(&[1.0f32, 2.0], &[1.0, 2.0000002], Tol::close(1e-6, 0.0));
/// let one_ulp = f32::from_bits(2.0f32.to_bits() + 1);
/// let r = std::panic::catch_unwind(|| assert_close(&[1.0f32, one_ulp], &[1.0, 2.0], Tol::Exact));
/// assert!(r.is_err());
/// ```
///
/// # Panics
/// Where they differ, with the first difference: its index, both values, the error and how many
/// elements differ.
#[track_caller]
pub fn assert_close<T: Element>(got: &[T], want: &[T], tol: Tol) {
    if let Err(d) = check_close(got, want, tol) {
        panic!("assert_close: {d}");
    }
}
