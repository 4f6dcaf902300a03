//! Registers: a block of one node's values, of its compute type, and the operations on them.

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};

use crate::dtype::convert::{f32_to_bf16, f32_to_f16};
use crate::prog::{BinOp, CmpOp, Ty, UnOp};
use crate::{Dtype, Element, Value};

/// Calls `$m!(T)` with the Rust type of dtype `$d`.
macro_rules! dispatch_dtype {
    ($d:expr, $m:ident) => {
        match $d {
            Dtype::Bool => $m!(bool),
            Dtype::I8 => $m!(i8),
            Dtype::I16 => $m!(i16),
            Dtype::I32 => $m!(i32),
            Dtype::I64 => $m!(i64),
            Dtype::U8 => $m!(u8),
            Dtype::U16 => $m!(u16),
            Dtype::U32 => $m!(u32),
            Dtype::U64 => $m!(u64),
            Dtype::F16 => $m!(half::f16),
            Dtype::BF16 => $m!(half::bf16),
            Dtype::F32 => $m!(f32),
            Dtype::F64 => $m!(f64),
            Dtype::C64 => $m!(num_complex::Complex32),
            Dtype::C128 => $m!(num_complex::Complex64),
        }
    };
}
pub(crate) use dispatch_dtype;

/// A block of values of one compute type.
#[derive(Debug, Clone)]
pub(crate) enum Reg {
    B(Vec<bool>),
    I(Vec<i64>),
    U(Vec<u64>),
    F(Vec<f32>),
    D(Vec<f64>),
    C(Vec<Complex32>),
    Z(Vec<Complex64>),
}

/// Applies `$body` with `$v` bound to the register's vector, whatever its type.
macro_rules! each {
    ($r:expr, $v:ident => $body:expr) => {
        match $r {
            Reg::B($v) => $body,
            Reg::I($v) => $body,
            Reg::U($v) => $body,
            Reg::F($v) => $body,
            Reg::D($v) => $body,
            Reg::C($v) => $body,
            Reg::Z($v) => $body,
        }
    };
}

impl Reg {
    pub(crate) fn new(ty: Ty, cap: usize) -> Reg {
        match ty {
            Ty::Bool => Reg::B(Vec::with_capacity(cap)),
            Ty::I64 => Reg::I(Vec::with_capacity(cap)),
            Ty::U64 => Reg::U(Vec::with_capacity(cap)),
            Ty::F32 => Reg::F(Vec::with_capacity(cap)),
            Ty::F64 => Reg::D(Vec::with_capacity(cap)),
            Ty::C64 => Reg::C(Vec::with_capacity(cap)),
            Ty::C128 => Reg::Z(Vec::with_capacity(cap)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        each!(self, v => v.len())
    }

    pub(crate) fn clear(&mut self) {
        each!(self, v => v.clear())
    }

    /// Element `i` as a [`Value`].
    pub(crate) fn value(&self, i: usize) -> Value {
        each!(self, v => v[i].to_value())
    }

    /// Appends the constant `x` (a real part and an imaginary one) `n` times.
    pub(crate) fn fill(&mut self, x: Complex64, n: usize) {
        let re = x.re;
        match self {
            Reg::B(v) => v.resize(n, re != 0.0 || x.im != 0.0),
            Reg::I(v) => v.resize(n, re as i64),
            Reg::U(v) => v.resize(n, re as u64),
            Reg::F(v) => v.resize(n, re as f32),
            Reg::D(v) => v.resize(n, re),
            Reg::C(v) => v.resize(n, Complex32::new(re as f32, x.im as f32)),
            Reg::Z(v) => v.resize(n, x),
        }
    }
}

/// Loads `positions` of an array of dtype `d` at `base` into `out` (whose type is `Ty::of(d)`).
///
/// # Safety
/// A claim on the array's buffer must be held, and every position must be one of its layout's.
pub(crate) unsafe fn load(d: Dtype, base: *const u8, positions: &mut dyn Iterator<Item = isize>, out: &mut Reg) {
    out.clear();
    macro_rules! go {
        ($t:ty, $v:ident, $conv:expr) => {{
            let Reg::$v(v) = out else { unreachable!("register of the load's type") };
            let f: fn($t) -> _ = $conv;
            // SAFETY: the caller's contract.
            v.extend(positions.map(|p| f(unsafe { <$t>::load(base.offset(p * size_of::<$t>() as isize)) })));
        }};
    }
    match d {
        Dtype::Bool => go!(bool, B, |x| x),
        Dtype::I8 => go!(i8, I, i64::from),
        Dtype::I16 => go!(i16, I, i64::from),
        Dtype::I32 => go!(i32, I, i64::from),
        Dtype::I64 => go!(i64, I, |x| x),
        Dtype::U8 => go!(u8, U, u64::from),
        Dtype::U16 => go!(u16, U, u64::from),
        Dtype::U32 => go!(u32, U, u64::from),
        Dtype::U64 => go!(u64, U, |x| x),
        Dtype::F16 => go!(f16, F, f16::to_f32),
        Dtype::BF16 => go!(bf16, F, bf16::to_f32),
        Dtype::F32 => go!(f32, F, |x| x),
        Dtype::F64 => go!(f64, D, |x| x),
        Dtype::C64 => go!(Complex32, C, |x| x),
        Dtype::C128 => go!(Complex64, Z, |x| x),
    }
}

/// Loads `n` consecutive elements of dtype `d` from `src` (a contiguous run).
///
/// # Safety
/// As [`load`]: `src` points at a claimed run of `n` elements.
pub(crate) unsafe fn load_run(d: Dtype, src: *const u8, n: usize, out: &mut Reg) {
    match (d, &mut *out) {
        (Dtype::F32, Reg::F(v)) => {
            v.clear();
            // SAFETY: the caller's contract: n aligned f32 elements.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(src.cast::<f32>(), n) });
        }
        (Dtype::F64, Reg::D(v)) => {
            v.clear();
            // SAFETY: as above.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(src.cast::<f64>(), n) });
        }
        // SAFETY: the caller's contract.
        _ => unsafe { load(d, src, &mut (0..n as isize), out) },
    }
}

/// Stores `r` into `n = r.len()` consecutive elements of dtype `d` at `dst`, converting from the
/// register's type by nx's rules (the same type keeps low bits of integers; another converts as
/// [`crate::convert`] does).
///
/// # Safety
/// An exclusive claim on the destination must be held and `dst` must point at `r.len()` elements.
pub(crate) unsafe fn store(r: &Reg, d: Dtype, dst: *mut u8) {
    macro_rules! go {
        ($t:ty, $src:expr, $conv:expr) => {{
            let out = dst.cast::<$t>();
            for (i, &x) in $src.iter().enumerate() {
                // SAFETY: the caller's contract; `out` is aligned for $t.
                unsafe { <$t>::store(out.add(i).cast(), $conv(x)) }
            }
        }};
    }
    match (r, d) {
        (Reg::F(v), Dtype::F32) => {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst.cast::<f32>(), v.len()) }
        }
        (Reg::D(v), Dtype::F64) => {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst.cast::<f64>(), v.len()) }
        }
        (Reg::F(v), Dtype::F16) => go!(f16, v, f32_to_f16),
        (Reg::F(v), Dtype::BF16) => go!(bf16, v, f32_to_bf16),
        (Reg::B(v), Dtype::Bool) => go!(bool, v, |x| x),
        (Reg::I(v), Dtype::I8) => go!(i8, v, |x| x as i8),
        (Reg::I(v), Dtype::I16) => go!(i16, v, |x| x as i16),
        (Reg::I(v), Dtype::I32) => go!(i32, v, |x| x as i32),
        (Reg::I(v), Dtype::I64) => go!(i64, v, |x| x),
        (Reg::U(v), Dtype::U8) => go!(u8, v, |x| x as u8),
        (Reg::U(v), Dtype::U16) => go!(u16, v, |x| x as u16),
        (Reg::U(v), Dtype::U32) => go!(u32, v, |x| x as u32),
        (Reg::U(v), Dtype::U64) => go!(u64, v, |x| x),
        (Reg::C(v), Dtype::C64) => go!(Complex32, v, |x| x),
        (Reg::Z(v), Dtype::C128) => go!(Complex64, v, |x| x),
        _ => {
            macro_rules! slow {
                ($t:ty) => {{
                    let out = dst.cast::<$t>();
                    for i in 0..r.len() {
                        // SAFETY: the caller's contract.
                        unsafe { <$t>::store(out.add(i).cast(), <$t>::from_value(r.value(i))) }
                    }
                }};
            }
            dispatch_dtype!(d, slow)
        }
    }
}

/// `src` converted element by element to dtype `d` by nx's rules, held in `out` (of `Ty::of(d)`).
pub(crate) fn cast(src: &Reg, d: Dtype, out: &mut Reg) {
    out.clear();
    match (src, &mut *out, d) {
        (Reg::F(s), Reg::D(o), Dtype::F64) => o.extend(s.iter().map(|&x| f64::from(x))),
        (Reg::D(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| x as f32)),
        (Reg::I(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| x as f32)),
        (Reg::I(s), Reg::D(o), Dtype::F64) => o.extend(s.iter().map(|&x| x as f64)),
        (Reg::F(s), Reg::F(o), Dtype::F32) => o.extend_from_slice(s),
        (Reg::B(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| f32::from(u8::from(x)))),
        _ => {
            let n = src.len();
            macro_rules! slow {
                ($t:ty) => {{
                    for i in 0..n {
                        let x = <$t>::from_value(src.value(i));
                        push_value(out, x.to_value());
                    }
                }};
            }
            dispatch_dtype!(d, slow)
        }
    }
}

/// Appends `v`, already of the register's type's range, to `r`.
fn push_value(r: &mut Reg, v: Value) {
    match r {
        Reg::B(o) => o.push(bool::from_value(v)),
        Reg::I(o) => o.push(i64::from_value(v)),
        Reg::U(o) => o.push(u64::from_value(v)),
        Reg::F(o) => o.push(f32::from_value(v)),
        Reg::D(o) => o.push(f64::from_value(v)),
        Reg::C(o) => o.push(Complex32::from_value(v)),
        Reg::Z(o) => o.push(Complex64::from_value(v)),
    }
}

/// erf x, to a few ulps in `f64`: inside |x| < 3 the series of positive terms
/// 2/√π · e^(−x²) · Σ (2x²)ⁿ x / (1·3·…·(2n+1)), which cancels nothing; outside, a continued
/// fraction for erfc.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 3.0 {
        let x2 = 2.0 * a * a;
        let (mut term, mut sum) = (a, a);
        // |x| < 3 converges within 80 terms; the cap makes any input end.
        for n in 1..200 {
            term *= x2 / (2 * n + 1) as f64;
            sum += term;
            if term <= 1e-17 * sum {
                break;
            }
        }
        (std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * sum).copysign(x)
    } else if a > 6.0 {
        1f64.copysign(x)
    } else {
        // erfc a = e^(−a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + …)))) by Lentz's method
        let tiny = 1e-300;
        let (mut f, mut c, mut d) = (a, a, 0.0f64);
        for k in 1..200 {
            let ak = k as f64 / 2.0;
            d = a + ak * d;
            d = if d.abs() < tiny { 1.0 / tiny } else { 1.0 / d };
            c = a + ak / c;
            if c.abs() < tiny {
                c = tiny;
            }
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        let erfc = (-a * a).exp() / (f * std::f64::consts::PI.sqrt());
        (1.0 - erfc).copysign(x)
    }
}

pub(crate) fn float_max<T: num_traits_lite::Float>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        T::nan()
    } else if x == y {
        if x.is_sign_negative() {
            y
        } else {
            x
        }
    } else if x > y {
        x
    } else {
        y
    }
}

pub(crate) fn float_min<T: num_traits_lite::Float>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        T::nan()
    } else if x == y {
        if x.is_sign_negative() {
            x
        } else {
            y
        }
    } else if x < y {
        x
    } else {
        y
    }
}

/// The few float facts `fmax`/`fmin` need, for `f32` and `f64`.
pub(crate) mod num_traits_lite {
    pub trait Float: Copy + PartialOrd {
        fn is_nan(self) -> bool;
        fn is_sign_negative(self) -> bool;
        fn nan() -> Self;
    }
    macro_rules! float {
        ($t:ty) => {
            impl Float for $t {
                fn is_nan(self) -> bool {
                    <$t>::is_nan(self)
                }
                fn is_sign_negative(self) -> bool {
                    <$t>::is_sign_negative(self)
                }
                fn nan() -> Self {
                    <$t>::NAN
                }
            }
        };
    }
    float!(f32);
    float!(f64);
}

fn ipow(mut base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut e, mut acc) = (exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

fn upow(mut base: u64, mut e: u64) -> u64 {
    let mut acc = 1u64;
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

/// `out = op x`.
pub(crate) fn unary(op: UnOp, x: &Reg, out: &mut Reg) {
    out.clear();
    macro_rules! real {
        ($s:expr, $o:expr, $t:ty) => {{
            let f: fn($t) -> $t = match op {
                UnOp::Neg => |x| -x,
                UnOp::Abs => |x| x.abs(),
                UnOp::Exp => |x| x.exp(),
                UnOp::Log => |x| x.ln(),
                UnOp::Sqrt => |x| x.sqrt(),
                UnOp::Rsqrt => |x| 1.0 / x.sqrt(),
                UnOp::Tanh => |x| x.tanh(),
                UnOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
                UnOp::Sin => |x| x.sin(),
                UnOp::Cos => |x| x.cos(),
                UnOp::Erf => |x| erf(x as f64) as $t,
                UnOp::Recip => |x| 1.0 / x,
                UnOp::Floor => |x| x.floor(),
                UnOp::Ceil => |x| x.ceil(),
                UnOp::Not => unreachable!("typed by Prog"),
            };
            $o.extend($s.iter().map(|&x| f(x)));
        }};
    }
    match (x, &mut *out) {
        (Reg::F(s), Reg::F(o)) => real!(s, o, f32),
        (Reg::D(s), Reg::D(o)) => real!(s, o, f64),
        (Reg::I(s), Reg::I(o)) => o.extend(s.iter().map(|&x| match op {
            UnOp::Neg => x.wrapping_neg(),
            UnOp::Abs => x.wrapping_abs(),
            UnOp::Not => !x,
            _ => x,
        })),
        (Reg::U(s), Reg::U(o)) => o.extend(s.iter().map(|&x| match op {
            UnOp::Neg => x.wrapping_neg(),
            UnOp::Not => !x,
            _ => x,
        })),
        (Reg::B(s), Reg::B(o)) => o.extend(s.iter().map(|&x| !x)),
        (Reg::C(s), Reg::F(o)) => o.extend(s.iter().map(|x| x.norm())),
        (Reg::Z(s), Reg::D(o)) => o.extend(s.iter().map(|x| x.norm())),
        (Reg::C(s), Reg::C(o)) => o.extend(s.iter().map(|&x| complex_unary32(op, x))),
        (Reg::Z(s), Reg::Z(o)) => o.extend(s.iter().map(|&x| complex_unary64(op, x))),
        _ => unreachable!("typed by Prog"),
    }
}

macro_rules! complex_unary {
    ($name:ident, $t:ty) => {
        fn $name(op: UnOp, x: $t) -> $t {
            match op {
                UnOp::Neg => -x,
                UnOp::Exp => x.exp(),
                UnOp::Log => x.ln(),
                UnOp::Sqrt => x.sqrt(),
                UnOp::Recip => x.inv(),
                _ => unreachable!("typed by Prog"),
            }
        }
    };
}
complex_unary!(complex_unary32, Complex32);
complex_unary!(complex_unary64, Complex64);

/// `out = x op y`, both of one type.
pub(crate) fn binary(op: BinOp, x: &Reg, y: &Reg, out: &mut Reg) {
    out.clear();
    macro_rules! real {
        ($a:expr, $b:expr, $o:expr, $t:ty) => {{
            let f: fn($t, $t) -> $t = match op {
                BinOp::Add => |x, y| x + y,
                BinOp::Sub => |x, y| x - y,
                BinOp::Mul => |x, y| x * y,
                BinOp::Div => |x, y| x / y,
                BinOp::Pow => |x, y| x.powf(y),
                BinOp::Max => float_max,
                BinOp::Min => float_min,
            };
            $o.extend($a.iter().zip($b.iter()).map(|(&x, &y)| f(x, y)));
        }};
    }
    match (x, y, &mut *out) {
        (Reg::F(a), Reg::F(b), Reg::F(o)) => real!(a, b, o, f32),
        (Reg::D(a), Reg::D(b), Reg::D(o)) => real!(a, b, o, f64),
        (Reg::I(a), Reg::I(b), Reg::I(o)) => {
            let f: fn(i64, i64) -> i64 = match op {
                BinOp::Add => i64::wrapping_add,
                BinOp::Sub => i64::wrapping_sub,
                BinOp::Mul => i64::wrapping_mul,
                BinOp::Div => |x, y| if y == 0 { 0 } else { x.wrapping_div(y) },
                BinOp::Pow => ipow,
                BinOp::Max => std::cmp::max,
                BinOp::Min => std::cmp::min,
            };
            o.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y)));
        }
        (Reg::U(a), Reg::U(b), Reg::U(o)) => {
            let f: fn(u64, u64) -> u64 = match op {
                BinOp::Add => u64::wrapping_add,
                BinOp::Sub => u64::wrapping_sub,
                BinOp::Mul => u64::wrapping_mul,
                BinOp::Div => |x, y| x.checked_div(y).unwrap_or(0),
                BinOp::Pow => upow,
                BinOp::Max => std::cmp::max,
                BinOp::Min => std::cmp::min,
            };
            o.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y)));
        }
        (Reg::B(a), Reg::B(b), Reg::B(o)) => {
            o.extend(a.iter().zip(b).map(|(&x, &y)| if op == BinOp::Max { x | y } else { x & y }))
        }
        (Reg::C(a), Reg::C(b), Reg::C(o)) => o.extend(a.iter().zip(b).map(|(&x, &y)| complex_binary(op, x, y))),
        (Reg::Z(a), Reg::Z(b), Reg::Z(o)) => o.extend(a.iter().zip(b).map(|(&x, &y)| complex_binary(op, x, y))),
        _ => unreachable!("typed by Prog"),
    }
}

fn complex_binary<
    T: std::ops::Add<Output = T> + std::ops::Sub<Output = T> + std::ops::Mul<Output = T> + std::ops::Div<Output = T>,
>(
    op: BinOp,
    x: T,
    y: T,
) -> T {
    match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => x / y,
        _ => unreachable!("typed by Prog"),
    }
}

/// `out = x op y` as booleans.
pub(crate) fn compare(op: CmpOp, x: &Reg, y: &Reg, out: &mut Reg) {
    let Reg::B(o) = out else { unreachable!("comparisons give booleans") };
    o.clear();
    macro_rules! ord {
        ($a:expr, $b:expr) => {
            o.extend($a.iter().zip($b.iter()).map(|(x, y)| match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                CmpOp::Lt => x < y,
                CmpOp::Le => x <= y,
                CmpOp::Gt => x > y,
                CmpOp::Ge => x >= y,
            }))
        };
    }
    match (x, y) {
        (Reg::B(a), Reg::B(b)) => ord!(a, b),
        (Reg::I(a), Reg::I(b)) => ord!(a, b),
        (Reg::U(a), Reg::U(b)) => ord!(a, b),
        (Reg::F(a), Reg::F(b)) => ord!(a, b),
        (Reg::D(a), Reg::D(b)) => ord!(a, b),
        (Reg::C(a), Reg::C(b)) => o.extend(a.iter().zip(b).map(|(x, y)| (x == y) == (op == CmpOp::Eq))),
        (Reg::Z(a), Reg::Z(b)) => o.extend(a.iter().zip(b).map(|(x, y)| (x == y) == (op == CmpOp::Eq))),
        _ => unreachable!("typed by Prog"),
    }
}

/// `out = c ? x : y`.
pub(crate) fn select(c: &Reg, x: &Reg, y: &Reg, out: &mut Reg) {
    let Reg::B(c) = c else { unreachable!("typed by Prog") };
    out.clear();
    macro_rules! pick {
        ($a:expr, $b:expr, $o:expr) => {
            $o.extend(c.iter().zip($a.iter().zip($b.iter())).map(|(&c, (&x, &y))| if c { x } else { y }))
        };
    }
    match (x, y, &mut *out) {
        (Reg::B(a), Reg::B(b), Reg::B(o)) => pick!(a, b, o),
        (Reg::I(a), Reg::I(b), Reg::I(o)) => pick!(a, b, o),
        (Reg::U(a), Reg::U(b), Reg::U(o)) => pick!(a, b, o),
        (Reg::F(a), Reg::F(b), Reg::F(o)) => pick!(a, b, o),
        (Reg::D(a), Reg::D(b), Reg::D(o)) => pick!(a, b, o),
        (Reg::C(a), Reg::C(b), Reg::C(o)) => pick!(a, b, o),
        (Reg::Z(a), Reg::Z(b), Reg::Z(o)) => pick!(a, b, o),
        _ => unreachable!("typed by Prog"),
    }
}
