//! Registers: a block of one node's values, of its compute type, and the operations on them.

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};

use crate::dtype::convert::{f32_to_bf16, f32_to_f16};
use crate::dtype::fp8::{F8E4M3, F8E5M2};
use crate::dtype::packed::{Bit, I4, U4};
use crate::prog::{BinOp, CmpOp, Ty, UnOp};
use crate::{Dtype, Element, Value};

/// Stores `src` at `dst` with non-temporal (streaming) stores where the platform has them: the
/// lines go to memory without being read first. The caller ends its task with [`fence`]. Where the
/// CPU has AVX2 the copy loads and stores 32 bytes at a time: SSE2's 16-byte loads keep half the
/// cache lines in flight, and a copy through them measured 0.84–0.96 of the 32-byte one here.
///
/// # Safety
/// `dst` points at `src.len()` writable, aligned elements under an exclusive claim.
#[inline(always)]
pub(crate) unsafe fn stream<T: Copy>(src: &[T], dst: *mut T) {
    // SAFETY: the caller's contract.
    unsafe { vector_copy(src, dst, true) }
}

/// Copies `src` to `dst` by vector loads and stores (32 bytes where the CPU has AVX2) instead of
/// `memcpy`: glibc's `memcpy` moves 2112 bytes and more by `rep movsb`, which on this AMD Zen 3
/// ran at 1.8 GB/s instead of 40–85 whenever the destination lay 1–31 bytes past the source
/// modulo 4 KiB — as it does between consecutive heap blocks of 8 KiB, such as two registers
/// (a register-to-register cast of 16M `f32` took 36 ms instead of 4).
///
/// # Safety
/// As [`stream`]'s.
#[inline(always)]
pub(crate) unsafe fn copy<T: Copy>(src: &[T], dst: *mut T) {
    // SAFETY: the caller's contract.
    unsafe { vector_copy(src, dst, false) }
}

/// [`stream`] (`streaming`) or [`copy`].
///
/// # Safety
/// As [`stream`]'s.
#[inline(always)]
unsafe fn vector_copy<T: Copy>(src: &[T], dst: *mut T, streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(src);
        let (s, d) = (src.as_ptr().cast::<u8>(), dst.cast::<u8>());
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        // SAFETY: the caller's contract; the AVX2 builds run only where the CPU has AVX2.
        unsafe {
            match (avx2, streaming) {
                (true, true) => stream_avx2(s, d, bytes),
                (false, true) => stream_sse2(s, d, bytes),
                (true, false) => copy_avx2(s, d, bytes),
                (false, false) => copy_sse2(s, d, bytes),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        let _ = streaming;
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    }
}

/// The vector copy loop: `$bytes` bytes from `$s` to `$d`, unaligned head and tail bytes stored
/// plainly, the `$w`-byte aligned middle by `$load` and `$store` (streaming or plain) of vectors
/// `$v`.
#[cfg(target_arch = "x86_64")]
macro_rules! stream_loop {
    ($s:expr, $d:expr, $bytes:expr, $w:literal, $v:ty, $load:ident, $store:ident) => {{
        let (s, d, bytes) = ($s, $d, $bytes);
        let mut i = 0;
        // SAFETY: the caller's contract; every access is below `bytes`.
        unsafe {
            while i < bytes && (d.add(i) as usize) % $w != 0 {
                d.add(i).write(s.add(i).read());
                i += 1;
            }
            while i + $w <= bytes {
                std::arch::x86_64::$store(d.add(i).cast::<$v>(), std::arch::x86_64::$load(s.add(i).cast::<$v>()));
                i += $w;
            }
            while i < bytes {
                d.add(i).write(s.add(i).read());
                i += 1;
            }
        }
    }};
}

/// Copies `bytes` bytes from `s` to `d` with SSE2 streaming stores (x86-64's baseline) over the
/// 16-byte aligned middle.
///
/// # Safety
/// `s` and `d` hold `bytes` bytes, readable and writable; they do not overlap.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_sse2(s: *const u8, d: *mut u8, bytes: usize) {
    stream_loop!(s, d, bytes, 16, std::arch::x86_64::__m128i, _mm_loadu_si128, _mm_stream_si128)
}

/// [`stream_sse2`] with 32-byte loads and streaming stores over the 32-byte aligned middle.
///
/// # Safety
/// As [`stream_sse2`]'s; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(s: *const u8, d: *mut u8, bytes: usize) {
    stream_loop!(s, d, bytes, 32, std::arch::x86_64::__m256i, _mm256_loadu_si256, _mm256_stream_si256)
}

/// [`stream_sse2`] with plain stores.
///
/// # Safety
/// As [`stream_sse2`]'s.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn copy_sse2(s: *const u8, d: *mut u8, bytes: usize) {
    stream_loop!(s, d, bytes, 16, std::arch::x86_64::__m128i, _mm_loadu_si128, _mm_storeu_si128)
}

/// [`stream_avx2`] with plain stores.
///
/// # Safety
/// As [`stream_avx2`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(s: *const u8, d: *mut u8, bytes: usize) {
    stream_loop!(s, d, bytes, 32, std::arch::x86_64::__m256i, _mm256_loadu_si256, _mm256_storeu_si256)
}

/// Orders this thread's streaming stores before what follows (an `sfence`).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

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
            Dtype::F8E4M3 => $m!($crate::dtype::fp8::F8E4M3),
            Dtype::F8E5M2 => $m!($crate::dtype::fp8::F8E5M2),
            Dtype::I4 | Dtype::U4 | Dtype::Bit => {
                unreachable!("packed dtypes answer WrongDtype before a kernel's body (through_door)")
            }
            Dtype::F32 => $m!(f32),
            Dtype::F64 => $m!(f64),
            Dtype::C64 => $m!(num_complex::Complex32),
            Dtype::C128 => $m!(num_complex::Complex64),
        }
    };
}
pub(crate) use dispatch_dtype;

/// [`dispatch_dtype`], the packed dtypes included.
macro_rules! dispatch_any_dtype {
    ($d:expr, $m:ident) => {
        match $d {
            Dtype::I4 => $m!($crate::dtype::packed::I4),
            Dtype::U4 => $m!($crate::dtype::packed::U4),
            Dtype::Bit => $m!($crate::dtype::packed::Bit),
            d => dispatch_dtype!(d, $m),
        }
    };
}

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

/// A block of values read in place: a register's, or memory's for a load that needs no
/// conversion.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src<'a> {
    B(&'a [bool]),
    I(&'a [i64]),
    U(&'a [u64]),
    F(&'a [f32]),
    D(&'a [f64]),
    C(&'a [Complex32]),
    Z(&'a [Complex64]),
}

macro_rules! each_src {
    ($r:expr, $v:ident => $body:expr) => {
        match $r {
            Src::B($v) => $body,
            Src::I($v) => $body,
            Src::U($v) => $body,
            Src::F($v) => $body,
            Src::D($v) => $body,
            Src::C($v) => $body,
            Src::Z($v) => $body,
        }
    };
}

pub(crate) use each_src;

impl<'a> Src<'a> {
    pub(crate) fn len(&self) -> usize {
        each_src!(self, v => v.len())
    }

    /// Element `i` as a [`Value`].
    pub(crate) fn value(&self, i: usize) -> Value {
        each_src!(self, v => v[i].to_value())
    }

    /// The elements `r`.
    pub(crate) fn slice(self, r: std::ops::Range<usize>) -> Src<'a> {
        match self {
            Src::B(v) => Src::B(&v[r]),
            Src::I(v) => Src::I(&v[r]),
            Src::U(v) => Src::U(&v[r]),
            Src::F(v) => Src::F(&v[r]),
            Src::D(v) => Src::D(&v[r]),
            Src::C(v) => Src::C(&v[r]),
            Src::Z(v) => Src::Z(&v[r]),
        }
    }

    /// `len` elements of dtype `d` at `p`, in place, where `d` is held without conversion
    /// (`f32`, `f64`, `i64`, `u64`, `c64`, `c128`); `None` otherwise.
    ///
    /// # Safety
    /// `p` points at `len` aligned elements of `d` under a claim that outlives `'a`.
    pub(crate) unsafe fn memory(d: Dtype, p: *const u8, len: usize) -> Option<Src<'a>> {
        // SAFETY: the caller's contract; every bit pattern of these types is a value.
        unsafe {
            Some(match d {
                Dtype::F32 => Src::F(std::slice::from_raw_parts(p.cast(), len)),
                Dtype::F64 => Src::D(std::slice::from_raw_parts(p.cast(), len)),
                Dtype::I64 => Src::I(std::slice::from_raw_parts(p.cast(), len)),
                Dtype::U64 => Src::U(std::slice::from_raw_parts(p.cast(), len)),
                Dtype::C64 => Src::C(std::slice::from_raw_parts(p.cast(), len)),
                Dtype::C128 => Src::Z(std::slice::from_raw_parts(p.cast(), len)),
                _ => return None,
            })
        }
    }
}

impl Reg {
    /// The register's values, in place.
    pub(crate) fn view(&self) -> Src<'_> {
        match self {
            Reg::B(v) => Src::B(v),
            Reg::I(v) => Src::I(v),
            Reg::U(v) => Src::U(v),
            Reg::F(v) => Src::F(v),
            Reg::D(v) => Src::D(v),
            Reg::C(v) => Src::C(v),
            Reg::Z(v) => Src::Z(v),
        }
    }

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

    pub(crate) fn clear(&mut self) {
        each!(self, v => v.clear())
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

/// Loads the positions `runs` walks from memory at `base` into `out` (cleared first), each
/// element converted to its compute type: a run at stride 0 as one value repeated, any other by
/// a loop of its stride.
///
/// # Safety
/// A claim on the array's buffer must be held, and every position the runs reach must be one of
/// its layout's.
pub(crate) unsafe fn load_runs(d: Dtype, base: *const u8, runs: &mut crate::runs::Runs<1>, out: &mut Reg) {
    out.clear();
    let [s] = runs.inner_strides();
    macro_rules! go {
        ($t:ty, $v:ident, $conv:expr) => {{
            let Reg::$v(v) = out else { unreachable!("register of the load's type") };
            let f: fn($t) -> _ = $conv;
            while let Some(([p], n)) = runs.next_run() {
                if s == 0 {
                    // SAFETY: the caller's contract.
                    v.extend(std::iter::repeat_n(f(unsafe { <$t>::load_at(base, p) }), n));
                } else {
                    // SAFETY: the caller's contract.
                    v.extend((0..n as isize).map(|i| f(unsafe { <$t>::load_at(base, p + i * s) })));
                }
            }
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
        Dtype::F8E4M3 => go!(F8E4M3, F, F8E4M3::to_f32),
        Dtype::F8E5M2 => go!(F8E5M2, F, F8E5M2::to_f32),
        Dtype::F32 => go!(f32, F, |x| x),
        Dtype::F64 => go!(f64, D, |x| x),
        Dtype::C64 => go!(Complex32, C, |x| x),
        Dtype::C128 => go!(Complex64, Z, |x| x),
        Dtype::I4 => go!(I4, I, |x: I4| i64::from(x.get())),
        Dtype::U4 => go!(U4, U, |x: U4| u64::from(x.get())),
        Dtype::Bit => go!(Bit, B, Bit::get),
    }
}

/// Loads the elements at `at` from memory at `base` into `out` (cleared first), each converted to
/// its compute type, `fill` (as `d` converts it) where a position is `None`.
///
/// # Safety
/// A claim on the array's buffer must be held, and every position must be one of its layout's.
pub(crate) unsafe fn load_positions(d: Dtype, base: *const u8, at: &[Option<isize>], fill: Value, out: &mut Reg) {
    out.clear();
    macro_rules! go {
        ($t:ty, $v:ident, $conv:expr) => {{
            let Reg::$v(v) = out else { unreachable!("register of the load's type") };
            let f: fn($t) -> _ = $conv;
            let fill = f(<$t as Element>::from_value(fill));
            v.extend(at.iter().map(|p| match p {
                // SAFETY: the caller's contract.
                Some(p) => f(unsafe { <$t>::load_at(base, *p) }),
                None => fill,
            }));
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
        Dtype::F8E4M3 => go!(F8E4M3, F, F8E4M3::to_f32),
        Dtype::F8E5M2 => go!(F8E5M2, F, F8E5M2::to_f32),
        Dtype::F32 => go!(f32, F, |x| x),
        Dtype::F64 => go!(f64, D, |x| x),
        Dtype::C64 => go!(Complex32, C, |x| x),
        Dtype::C128 => go!(Complex64, Z, |x| x),
        Dtype::I4 => go!(I4, I, |x: I4| i64::from(x.get())),
        Dtype::U4 => go!(U4, U, |x: U4| u64::from(x.get())),
        Dtype::Bit => go!(Bit, B, Bit::get),
    }
}

/// Stores `r` into `r.len()` consecutive elements of the packed dtype `d` from position `pos`
/// of memory at `base`, converting as [`store`] does, each keeping the other elements of its
/// byte.
///
/// # Safety
/// An exclusive claim on the destination must be held and the positions must be its elements'.
pub(crate) unsafe fn store_packed(r: Src<'_>, d: Dtype, base: *mut u8, pos: isize) {
    macro_rules! go {
        ($t:ty) => {{
            for i in 0..r.len() {
                // SAFETY: the caller's contract.
                unsafe { <$t>::store_at(base, pos + i as isize, <$t>::from_value(r.value(i))) }
            }
        }};
    }
    match d {
        Dtype::I4 => go!(I4),
        Dtype::U4 => go!(U4),
        Dtype::Bit => go!(Bit),
        d => unreachable!("{d} is not packed"),
    }
}

/// Loads `n` consecutive elements of dtype `d` from `src` (a contiguous run).
///
/// # Safety
/// A claim on the array's buffer must be held; `src` points at a run of `n` of its elements.
pub(crate) unsafe fn load_run(d: Dtype, src: *const u8, n: usize, out: &mut Reg) {
    match (d, &mut *out) {
        // SAFETY: the caller's contract: n aligned f32 elements.
        (Dtype::F32, Reg::F(v)) => unsafe { copy_into(std::slice::from_raw_parts(src.cast::<f32>(), n), v) },
        // SAFETY: as above.
        (Dtype::F64, Reg::D(v)) => unsafe { copy_into(std::slice::from_raw_parts(src.cast::<f64>(), n), v) },
        (Dtype::BF16, Reg::F(v)) => {
            v.clear();
            v.reserve(n);
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts(src.cast::<bf16>(), n) };
            for (o, x) in v.spare_capacity_mut().iter_mut().zip(s) {
                o.write(widen_bf16(x.to_bits()));
            }
            // SAFETY: the loop initialised the first n elements (reserved above).
            unsafe { v.set_len(n) };
        }
        (Dtype::F16, Reg::F(v)) => {
            v.clear();
            v.resize(n, 0.0);
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts(src.cast::<u16>(), n) };
            widen_f16(s, v);
        }
        _ => {
            let mut runs = crate::runs::Runs::new(&[n], [&[1]], [0], 0, n);
            // SAFETY: the caller's contract: positions 0..n from `src`.
            unsafe { load_runs(d, src, &mut runs, out) }
        }
    }
}

/// A bf16's bits widened to `f32` without a branch, so that a loop of it vectorises: the bits
/// shifted, a NaN made quiet (both evaluators widen by it).
#[inline(always)]
pub(crate) fn widen_bf16(x: u16) -> f32 {
    let b = u32::from(x);
    let w = b << 16;
    f32::from_bits(if b & 0x7FFF > 0x7F80 { w | 0x0040_0000 } else { w })
}

/// `x` rounded to bf16 as [`f32_to_bf16`] (nearest, ties to even, every NaN the quiet one), as
/// bits.
#[inline(always)]
pub(crate) fn narrow_bf16(x: f32) -> u16 {
    f32_to_bf16(x).to_bits()
}

/// f16 bits (as `u16`s) widened to `f32` exactly, into `out` (as long): `half`'s slice conversion
/// (F16C where the CPU has it).
#[inline(always)]
pub(crate) fn widen_f16(bits: &[u16], out: &mut [f32]) {
    half::slice::HalfFloatSliceExt::convert_to_f32_slice(
        half::slice::HalfBitsSliceExt::reinterpret_cast::<f16>(bits),
        out,
    );
}

/// `v` rounded to f16 bits into `out` (as long): F16C's conversion where the CPU has it
/// (nearest, ties to even, as [`f32_to_f16`]), then every NaN made the quiet one
/// [`f32_to_f16`] gives.
#[inline(always)]
pub(crate) fn narrow_f16(out: &mut [u16], v: &[f32]) {
    half::slice::HalfFloatSliceExt::convert_from_f32_slice(
        half::slice::HalfBitsSliceExt::reinterpret_cast_mut::<f16>(out),
        v,
    );
    for (o, &x) in out.iter_mut().zip(v) {
        if x.is_nan() {
            *o = f32_to_f16(x).to_bits();
        }
    }
}

/// Stores `r` into `n = r.len()` consecutive elements of dtype `d` at `dst`, converting from the
/// register's type by nx's rules (the same type keeps low bits of integers; another converts as
/// [`crate::convert`] does). `streaming` stores `f32`, `f64`, `f16` and `bf16` runs with
/// [`stream`]; plain runs of those go through [`copy`], never `memcpy`.
///
/// # Safety
/// An exclusive claim on the destination must be held and `dst` must point at `r.len()` elements.
pub(crate) unsafe fn store(r: Src<'_>, d: Dtype, dst: *mut u8, streaming: bool) {
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
        (Src::F(v), Dtype::F32) if streaming => {
            // SAFETY: the caller's contract.
            unsafe { stream(v, dst.cast::<f32>()) }
        }
        (Src::D(v), Dtype::F64) if streaming => {
            // SAFETY: the caller's contract.
            unsafe { stream(v, dst.cast::<f64>()) }
        }
        (Src::F(v), Dtype::F32) => {
            // SAFETY: the caller's contract.
            unsafe { copy(v, dst.cast::<f32>()) }
        }
        (Src::D(v), Dtype::F64) => {
            // SAFETY: the caller's contract.
            unsafe { copy(v, dst.cast::<f64>()) }
        }
        // SAFETY: the caller's contract.
        (Src::F(v), Dtype::F16) => unsafe { narrow(v, dst.cast::<u16>(), streaming, narrow_f16) },
        // SAFETY: the caller's contract.
        (Src::F(v), Dtype::BF16) => unsafe {
            narrow(v, dst.cast::<u16>(), streaming, |out, v| {
                for (o, &x) in out.iter_mut().zip(v) {
                    *o = narrow_bf16(x);
                }
            })
        },
        (Src::F(v), Dtype::F8E4M3) => go!(F8E4M3, v, F8E4M3::from_f32),
        (Src::F(v), Dtype::F8E5M2) => go!(F8E5M2, v, F8E5M2::from_f32),
        (Src::B(v), Dtype::Bool) => go!(bool, v, |x| x),
        (Src::I(v), Dtype::I8) => go!(i8, v, |x| x as i8),
        (Src::I(v), Dtype::I16) => go!(i16, v, |x| x as i16),
        (Src::I(v), Dtype::I32) => go!(i32, v, |x| x as i32),
        (Src::I(v), Dtype::I64) => go!(i64, v, |x| x),
        (Src::U(v), Dtype::U8) => go!(u8, v, |x| x as u8),
        (Src::U(v), Dtype::U16) => go!(u16, v, |x| x as u16),
        (Src::U(v), Dtype::U32) => go!(u32, v, |x| x as u32),
        (Src::U(v), Dtype::U64) => go!(u64, v, |x| x),
        (Src::C(v), Dtype::C64) => go!(Complex32, v, |x| x),
        (Src::Z(v), Dtype::C128) => go!(Complex64, v, |x| x),
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

/// Writes `v` narrowed by `f` (which fills its first argument from its second) at `dst`: through a
/// buffer of 512 on the stack, each part of it then copied or streamed ([`copy`], [`stream`]), so
/// that a streaming destination's lines are not read first and the narrowing loop vectorises.
///
/// # Safety
/// `dst` points at `v.len()` writable, aligned elements under an exclusive claim.
unsafe fn narrow<H: Copy + Default>(v: &[f32], dst: *mut H, streaming: bool, f: impl Fn(&mut [H], &[f32])) {
    const PART: usize = 512;
    let mut buf = [H::default(); PART];
    for (k, part) in v.chunks(PART).enumerate() {
        let out = &mut buf[..part.len()];
        f(out, part);
        // SAFETY: the caller's contract: this part's elements of the destination.
        unsafe {
            let at = dst.add(k * PART);
            if streaming {
                stream(out, at)
            } else {
                copy(out, at)
            }
        }
    }
}

/// `src` converted element by element to dtype `d` by nx's rules, held in `out` (of `Ty::of(d)`).
pub(crate) fn cast(src: Src<'_>, d: Dtype, out: &mut Reg) {
    out.clear();
    match (src, &mut *out, d) {
        (Src::F(s), Reg::D(o), Dtype::F64) => o.extend(s.iter().map(|&x| f64::from(x))),
        (Src::D(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| x as f32)),
        (Src::I(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| x as f32)),
        (Src::I(s), Reg::D(o), Dtype::F64) => o.extend(s.iter().map(|&x| x as f64)),
        (Src::F(s), Reg::F(o), Dtype::F32) => copy_into(s, o),
        (Src::B(s), Reg::F(o), Dtype::F32) => o.extend(s.iter().map(|&x| f32::from(u8::from(x)))),
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
            dispatch_any_dtype!(d, slow)
        }
    }
}

/// `o` made a copy of `s` by [`copy`].
fn copy_into<T: Copy>(s: &[T], o: &mut Vec<T>) {
    o.clear();
    o.reserve(s.len());
    // SAFETY: `o` has room for `s.len()` elements, which the copy initialises before `set_len`.
    unsafe {
        copy(s, o.as_mut_ptr());
        o.set_len(s.len());
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

#[inline(always)]
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

#[inline(always)]
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

/// `o = f(s)` elementwise; `f` is a closure, inlined into the loop.
#[inline(always)]
fn map_into<T: Copy, U>(s: &[T], o: &mut Vec<U>, f: impl Fn(T) -> U) {
    o.extend(s.iter().map(|&x| f(x)));
}

/// `o = f(a, b)` elementwise; `f` is a closure, inlined into the loop.
#[inline(always)]
fn zip_into<T: Copy, U>(a: &[T], b: &[T], o: &mut Vec<U>, f: impl Fn(T, T) -> U) {
    let n = a.len().min(b.len());
    o.extend(a[..n].iter().zip(&b[..n]).map(|(&x, &y)| f(x, y)));
}

/// Expands `$go!($args.., f)` with `f` the elementwise function of the real unary op `$op` over
/// the float type `$t`: one monomorphised loop per op, so that each vectorises. Every evaluator
/// of real unary ops goes through it, so they agree bit for bit.
macro_rules! real_unary {
    ($op:expr, $t:ty, $go:ident($($arg:expr),*)) => {
        match $op {
            $crate::prog::UnOp::Neg => $go!($($arg),*, |x: $t| -x),
            $crate::prog::UnOp::Abs => $go!($($arg),*, |x: $t| x.abs()),
            $crate::prog::UnOp::Exp => $go!($($arg),*, |x: $t| $crate::host::expf::MapExp::map_exp(x)),
            $crate::prog::UnOp::Log => $go!($($arg),*, |x: $t| x.ln()),
            $crate::prog::UnOp::Sqrt => $go!($($arg),*, |x: $t| x.sqrt()),
            $crate::prog::UnOp::Rsqrt => $go!($($arg),*, |x: $t| 1.0 / x.sqrt()),
            $crate::prog::UnOp::Tanh => $go!($($arg),*, |x: $t| x.tanh()),
            $crate::prog::UnOp::Sigmoid => $go!($($arg),*, |x: $t| 1.0 / (1.0 + $crate::host::expf::MapExp::map_exp(-x))),
            $crate::prog::UnOp::Sin => $go!($($arg),*, |x: $t| x.sin()),
            $crate::prog::UnOp::Cos => $go!($($arg),*, |x: $t| x.cos()),
            $crate::prog::UnOp::Erf => $go!($($arg),*, |x: $t| $crate::host::reg::erf(x as f64) as $t),
            $crate::prog::UnOp::Recip => $go!($($arg),*, |x: $t| 1.0 / x),
            $crate::prog::UnOp::Floor => $go!($($arg),*, |x: $t| x.floor()),
            $crate::prog::UnOp::Ceil => $go!($($arg),*, |x: $t| x.ceil()),
            $crate::prog::UnOp::Not => unreachable!("typed by Prog"),
        }
    };
}
pub(crate) use real_unary;

/// As [`real_unary`], for the real binary op `$op`.
macro_rules! real_binary {
    ($op:expr, $t:ty, $go:ident($($arg:expr),*)) => {
        match $op {
            $crate::prog::BinOp::Add => $go!($($arg),*, |x: $t, y: $t| x + y),
            $crate::prog::BinOp::Sub => $go!($($arg),*, |x: $t, y: $t| x - y),
            $crate::prog::BinOp::Mul => $go!($($arg),*, |x: $t, y: $t| x * y),
            $crate::prog::BinOp::Div => $go!($($arg),*, |x: $t, y: $t| x / y),
            $crate::prog::BinOp::Pow => $go!($($arg),*, |x: $t, y: $t| x.powf(y)),
            $crate::prog::BinOp::Max => $go!($($arg),*, $crate::host::reg::float_max::<$t>),
            $crate::prog::BinOp::Min => $go!($($arg),*, $crate::host::reg::float_min::<$t>),
        }
    };
}
pub(crate) use real_binary;

macro_rules! map_vec {
    ($s:expr, $o:expr, $f:expr) => {
        map_into($s, $o, $f)
    };
}

macro_rules! zip_vec {
    ($a:expr, $b:expr, $o:expr, $f:expr) => {
        zip_into($a, $b, $o, $f)
    };
}

/// `out = op x`.
pub(crate) fn unary(op: UnOp, x: Src<'_>, out: &mut Reg) {
    out.clear();
    match (x, &mut *out) {
        (Src::F(s), Reg::F(o)) => real_unary!(op, f32, map_vec(s, o)),
        (Src::D(s), Reg::D(o)) => real_unary!(op, f64, map_vec(s, o)),
        (Src::I(s), Reg::I(o)) => o.extend(s.iter().map(|&x| match op {
            UnOp::Neg => x.wrapping_neg(),
            UnOp::Abs => x.wrapping_abs(),
            UnOp::Not => !x,
            _ => x,
        })),
        (Src::U(s), Reg::U(o)) => o.extend(s.iter().map(|&x| match op {
            UnOp::Neg => x.wrapping_neg(),
            UnOp::Not => !x,
            _ => x,
        })),
        (Src::B(s), Reg::B(o)) => o.extend(s.iter().map(|&x| !x)),
        (Src::C(s), Reg::F(o)) => o.extend(s.iter().map(|x| x.norm())),
        (Src::Z(s), Reg::D(o)) => o.extend(s.iter().map(|x| x.norm())),
        (Src::C(s), Reg::C(o)) => o.extend(s.iter().map(|&x| complex_unary32(op, x))),
        (Src::Z(s), Reg::Z(o)) => o.extend(s.iter().map(|&x| complex_unary64(op, x))),
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
pub(crate) fn binary(op: BinOp, x: Src<'_>, y: Src<'_>, out: &mut Reg) {
    out.clear();
    match (x, y, &mut *out) {
        (Src::F(a), Src::F(b), Reg::F(o)) => real_binary!(op, f32, zip_vec(a, b, o)),
        (Src::D(a), Src::D(b), Reg::D(o)) => real_binary!(op, f64, zip_vec(a, b, o)),
        (Src::I(a), Src::I(b), Reg::I(o)) => {
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
        (Src::U(a), Src::U(b), Reg::U(o)) => {
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
        (Src::B(a), Src::B(b), Reg::B(o)) => {
            o.extend(a.iter().zip(b).map(|(&x, &y)| if op == BinOp::Max { x | y } else { x & y }))
        }
        (Src::C(a), Src::C(b), Reg::C(o)) => o.extend(a.iter().zip(b).map(|(&x, &y)| complex_binary(op, x, y))),
        (Src::Z(a), Src::Z(b), Reg::Z(o)) => o.extend(a.iter().zip(b).map(|(&x, &y)| complex_binary(op, x, y))),
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
pub(crate) fn compare(op: CmpOp, x: Src<'_>, y: Src<'_>, out: &mut Reg) {
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
        (Src::B(a), Src::B(b)) => ord!(a, b),
        (Src::I(a), Src::I(b)) => ord!(a, b),
        (Src::U(a), Src::U(b)) => ord!(a, b),
        (Src::F(a), Src::F(b)) => ord!(a, b),
        (Src::D(a), Src::D(b)) => ord!(a, b),
        (Src::C(a), Src::C(b)) => o.extend(a.iter().zip(b).map(|(x, y)| (x == y) == (op == CmpOp::Eq))),
        (Src::Z(a), Src::Z(b)) => o.extend(a.iter().zip(b).map(|(x, y)| (x == y) == (op == CmpOp::Eq))),
        _ => unreachable!("typed by Prog"),
    }
}

/// `out = c ? x : y`.
pub(crate) fn select(c: Src<'_>, x: Src<'_>, y: Src<'_>, out: &mut Reg) {
    let Src::B(c) = c else { unreachable!("typed by Prog") };
    out.clear();
    macro_rules! pick {
        ($a:expr, $b:expr, $o:expr) => {
            $o.extend(c.iter().zip($a.iter().zip($b.iter())).map(|(&c, (&x, &y))| if c { x } else { y }))
        };
    }
    match (x, y, &mut *out) {
        (Src::B(a), Src::B(b), Reg::B(o)) => pick!(a, b, o),
        (Src::I(a), Src::I(b), Reg::I(o)) => pick!(a, b, o),
        (Src::U(a), Src::U(b), Reg::U(o)) => pick!(a, b, o),
        (Src::F(a), Src::F(b), Reg::F(o)) => pick!(a, b, o),
        (Src::D(a), Src::D(b), Reg::D(o)) => pick!(a, b, o),
        (Src::C(a), Src::C(b), Reg::C(o)) => pick!(a, b, o),
        (Src::Z(a), Src::Z(b), Reg::Z(o)) => pick!(a, b, o),
        _ => unreachable!("typed by Prog"),
    }
}

#[cfg(test)]
mod tests {
    /// The vector copies, streaming and plain, store every byte at any alignment of either side
    /// and any length: heads and tails past the aligned middle, lengths below one vector, in both
    /// builds of the loop.
    #[test]
    fn vector_copies_store_every_byte() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        for from in [0, 1, 7, 16, 31, 33] {
            for at in [0, 1, 5, 16, 17, 32] {
                for len in [0, 1, 15, 16, 31, 32, 33, 64, 100, 255] {
                    let s = &src[from..from + len];
                    let mut d = vec![0u8; 300];
                    // SAFETY: `d` holds `at + len` bytes, apart from `s`.
                    unsafe { super::stream(s, d.as_mut_ptr().add(at)) };
                    super::fence();
                    assert_eq!(&d[at..at + len], s, "from {from}, at {at}, {len} bytes");
                    assert!(d[..at].iter().chain(&d[at + len..]).all(|&b| b == 0), "outside the copy");
                    let mut d = vec![0u8; 300];
                    // SAFETY: as above.
                    unsafe { super::copy(s, d.as_mut_ptr().add(at)) };
                    assert_eq!(&d[at..at + len], s, "plain copy: from {from}, at {at}, {len} bytes");
                    assert!(d[..at].iter().chain(&d[at + len..]).all(|&b| b == 0), "outside the plain copy");
                    #[cfg(target_arch = "x86_64")]
                    for build in [super::stream_sse2, super::copy_sse2] {
                        let mut d = vec![0u8; 300];
                        // SAFETY: as above.
                        unsafe { build(s.as_ptr(), d.as_mut_ptr().add(at), len) };
                        super::fence();
                        assert_eq!(&d[at..at + len], s, "SSE2 builds: from {from}, at {at}, {len} bytes");
                        assert!(d[..at].iter().chain(&d[at + len..]).all(|&b| b == 0), "outside the SSE2 copy");
                    }
                }
            }
        }
    }
}
