//! nx's C ABI: host arrays and their DLPack exchange, for foreign callers — Python through
//! `ctypes` in this crate's tests, whose script (`tests/dlpack.py`) shows the whole protocol
//! (`__dlpack__`, `__dlpack_device__`, capsules named `dltensor_versioned` and `dltensor`).
//!
//! An array is an opaque handle (`*mut AnyArray`) freed by [`nx_array_drop`]. Calls that can fail
//! return null or -1 and write a NUL-terminated message naming the function into the caller's
//! `err` buffer of `cap` bytes (nothing is kept between calls).

use std::ffi::c_void;
use std::ptr::NonNull;

use half::{bf16, f16};
use nx_kernels::{dlpack, Access, AnyArray, Array, Dtype, Element, Move, Value};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Cpu, ordinal: 0, rank: 0 };

/// Writes `msg` into `err` (`cap` bytes), cut to fit, NUL-terminated.
///
/// # Safety
/// `err` is null or valid for writes of `cap` bytes.
unsafe fn say(err: *mut u8, cap: usize, msg: &str) {
    if err.is_null() || cap == 0 {
        return;
    }
    let mut n = msg.len().min(cap - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller's contract: `cap` bytes at `err`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err, n);
        *err.add(n) = 0;
    }
}

fn handle(a: AnyArray) -> *mut AnyArray {
    Box::into_raw(Box::new(a))
}

/// A fresh C-contiguous `rows × cols` f32 array whose element `[r, c]` is `r·cols + c + 0.5`.
///
/// Returns its handle (null where `rows·cols` overflows or memory is refused).
#[no_mangle]
pub extern "C" fn nx_array_f32(rows: usize, cols: usize) -> *mut AnyArray {
    match Array::<f32>::from_fn(DEV, &[rows, cols], |i| (i[0] * cols + i[1]) as f32 + 0.5) {
        Ok(a) => handle(a.into_any()),
        Err(_) => std::ptr::null_mut(),
    }
}

/// Ends handle `h` (its buffer lives on while exports or other handles hold it).
///
/// # Safety
/// `h` is null or a handle of this library, not yet dropped.
#[no_mangle]
pub unsafe extern "C" fn nx_array_drop(h: *mut AnyArray) {
    if !h.is_null() {
        // SAFETY: the caller's contract.
        drop(unsafe { Box::from_raw(h) });
    }
}

/// A view of `h`: 1 flipped along axis 0 (a negative stride), 2 transposed, 3 its first row
/// broadcast over axis 0 (a stride of 0), anything else the same array.
///
/// Returns the view's handle, or null where the view cannot be made.
///
/// # Safety
/// `h` is a live handle of this library.
#[no_mangle]
pub unsafe extern "C" fn nx_view(h: *const AnyArray, kind: i32) -> *mut AnyArray {
    // SAFETY: the caller's contract.
    let a = unsafe { &*h }.clone();
    let Ok(f) = a.clone().expect::<f32>() else { return handle(a) };
    if f.shape().len() != 2 && (1..=3).contains(&kind) {
        return std::ptr::null_mut();
    }
    let v = match kind {
        1 => f.apply(&Move::Flip(0)),
        2 => f.apply(&Move::Permute(vec![1, 0])),
        3 => f
            .apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(1), step: 1 })
            .and_then(|r| r.map(|r| r.apply(&Move::Expand(vec![4, f.shape()[1]]))).transpose().map(Option::flatten)),
        _ => Ok(Some(f)),
    };
    match v {
        Ok(Some(v)) => handle(v.into_any()),
        _ => std::ptr::null_mut(),
    }
}

fn get_as<T: Element>(a: &AnyArray, idx: &[usize]) -> Result<Value, String> {
    a.clone().expect::<T>().and_then(|a| a.get(idx)).map(Element::to_value).map_err(|e| e.to_string())
}

fn set_as<T: Element>(a: &AnyArray, idx: &[usize], v: f64) -> Result<(), String> {
    a.clone().expect::<T>().and_then(|a| a.set(idx, T::from_value(Value::Float(v)))).map_err(|e| e.to_string())
}

macro_rules! by_dtype {
    ($d:expr, $f:ident, $($args:expr),*) => {
        match $d {
            Dtype::Bool => $f::<bool>($($args),*),
            Dtype::I8 => $f::<i8>($($args),*),
            Dtype::I16 => $f::<i16>($($args),*),
            Dtype::I32 => $f::<i32>($($args),*),
            Dtype::I64 => $f::<i64>($($args),*),
            Dtype::U8 => $f::<u8>($($args),*),
            Dtype::U16 => $f::<u16>($($args),*),
            Dtype::U32 => $f::<u32>($($args),*),
            Dtype::U64 => $f::<u64>($($args),*),
            Dtype::F16 => $f::<f16>($($args),*),
            Dtype::BF16 => $f::<bf16>($($args),*),
            Dtype::F8E4M3 => $f::<nx_kernels::dtype::fp8::F8E4M3>($($args),*),
            Dtype::F8E5M2 => $f::<nx_kernels::dtype::fp8::F8E5M2>($($args),*),
            Dtype::F32 => $f::<f32>($($args),*),
            Dtype::F64 => $f::<f64>($($args),*),
            d => Err(format!("{d} is not read or written through this ABI")),
        }
    };
}

/// Reads element `idx` (`n` indices) of `h` as an f64 into `out`.
///
/// Returns 0, or -1 with a message (an index out of range, memory held exclusive, a dead buffer).
///
/// # Safety
/// `h` is a live handle; `idx` holds `n` values; `out` is valid for a write; `err` as [`say`]'s.
#[no_mangle]
pub unsafe extern "C" fn nx_get(
    h: *const AnyArray,
    idx: *const usize,
    n: usize,
    out: *mut f64,
    err: *mut u8,
    cap: usize,
) -> i32 {
    // SAFETY: the caller's contract (a null `idx` reads as no index).
    let (a, idx) = unsafe { (&*h, if idx.is_null() { &[][..] } else { std::slice::from_raw_parts(idx, n) }) };
    match by_dtype!(a.dtype(), get_as, a, idx) {
        Ok(v) => {
            let x = match v {
                Value::Bool(b) => b as u8 as f64,
                Value::Int(i) => i as f64,
                Value::Float(f) => f,
                Value::Complex(c) => c.re,
            };
            // SAFETY: the caller's contract.
            unsafe { *out = x };
            0
        }
        Err(e) => {
            // SAFETY: the caller's contract.
            unsafe { say(err, cap, &e) };
            -1
        }
    }
}

/// Writes `v` (converted to the dtype) at element `idx` (`n` indices) of `h`.
///
/// Returns 0, or -1 with a message (held memory, a read-only or dead buffer, a bad index).
///
/// # Safety
/// As [`nx_get`]'s.
#[no_mangle]
pub unsafe extern "C" fn nx_set(
    h: *const AnyArray,
    idx: *const usize,
    n: usize,
    v: f64,
    err: *mut u8,
    cap: usize,
) -> i32 {
    // SAFETY: the caller's contract (a null `idx` reads as no index).
    let (a, idx) = unsafe { (&*h, if idx.is_null() { &[][..] } else { std::slice::from_raw_parts(idx, n) }) };
    match by_dtype!(a.dtype(), set_as, a, idx, v) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: the caller's contract.
            unsafe { say(err, cap, &e) };
            -1
        }
    }
}

/// Writes `h`'s dtype name (`float32`, `bfloat16`, …) into `err`'s buffer.
///
/// # Safety
/// `h` is a live handle; `out` as [`say`]'s `err`.
#[no_mangle]
pub unsafe extern "C" fn nx_dtype(h: *const AnyArray, out: *mut u8, cap: usize) {
    // SAFETY: the caller's contract.
    unsafe { say(out, cap, &(*h).dtype().to_string()) }
}

/// Frees `h`'s buffer (every handle over it dies).
///
/// Returns 0, or -1 with a message where it is claimed.
///
/// # Safety
/// `h` is a live handle; `err` as [`say`]'s.
#[no_mangle]
pub unsafe extern "C" fn nx_free(h: *const AnyArray, err: *mut u8, cap: usize) -> i32 {
    // SAFETY: the caller's contract.
    match unsafe { &*h }.buffer().free() {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: the caller's contract.
            unsafe { say(err, cap, &e.to_string()) };
            -1
        }
    }
}

/// Exports `h` for a DLPack consumer: for writing where `writable`, as a
/// `DLManagedTensorVersioned` where `versioned`, else a legacy `DLManagedTensor`.
///
/// Returns the tensor (the consumer calls its deleter once), or null with a message.
///
/// # Safety
/// `h` is a live handle; `err` as [`say`]'s.
#[no_mangle]
pub unsafe extern "C" fn nx_export(
    h: *const AnyArray,
    writable: i32,
    versioned: i32,
    err: *mut u8,
    cap: usize,
) -> *mut c_void {
    // SAFETY: the caller's contract.
    let a = unsafe { &*h };
    let access = if writable != 0 { Access::ReadWrite } else { Access::Read };
    let r = if versioned != 0 {
        dlpack::export(a, access).map(|p| p.as_ptr().cast::<c_void>())
    } else {
        dlpack::export_legacy(a, access).map(|p| p.as_ptr().cast::<c_void>())
    };
    r.unwrap_or_else(|e| {
        // SAFETY: the caller's contract.
        unsafe { say(err, cap, &e.to_string()) };
        std::ptr::null_mut()
    })
}

/// The address of `h`'s first element as an export shows it (`data + byte_offset`), or 0 where
/// it cannot be exported for reading now.
///
/// # Safety
/// `h` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn nx_address(h: *const AnyArray) -> usize {
    // SAFETY: the caller's contract.
    let Ok(t) = dlpack::export(unsafe { &*h }, Access::Read) else { return 0 };
    // SAFETY: a tensor just exported, deleted once here.
    unsafe {
        let m = t.as_ptr();
        let at = ((*m).dl_tensor.data as usize) + (*m).dl_tensor.byte_offset as usize;
        ((*m).deleter.expect("nx's exports have a deleter"))(m);
        at
    }
}

/// Imports a producer's tensor (`versioned`: a `DLManagedTensorVersioned`, else a legacy
/// `DLManagedTensor`), zero-copy; its deleter runs when the last handle over it ends (or now,
/// where it is refused).
///
/// Returns the handle, or null with a message.
///
/// # Safety
/// `t` is a producer's unconsumed tensor of that kind; `err` as [`say`]'s.
#[no_mangle]
pub unsafe extern "C" fn nx_import(t: *mut c_void, versioned: i32, err: *mut u8, cap: usize) -> *mut AnyArray {
    let Some(p) = NonNull::new(t) else {
        // SAFETY: the caller's contract.
        unsafe { say(err, cap, "nx_import: a null tensor") };
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's contract.
    let r = unsafe {
        if versioned != 0 {
            dlpack::import(p.cast(), DEV)
        } else {
            dlpack::import_legacy(p.cast(), DEV)
        }
    };
    match r {
        Ok(a) => handle(a),
        Err(e) => {
            // SAFETY: the caller's contract.
            unsafe { say(err, cap, &e.to_string()) };
            std::ptr::null_mut()
        }
    }
}

/// Calls the deleter of a tensor no consumer took (a capsule's destructor).
///
/// # Safety
/// `t` is null or an unconsumed tensor of that kind.
#[no_mangle]
pub unsafe extern "C" fn nx_delete(t: *mut c_void, versioned: i32) {
    if t.is_null() {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        if versioned != 0 {
            let m = t.cast::<dlpack::DLManagedTensorVersioned>();
            if let Some(d) = (*m).deleter {
                d(m)
            }
        } else {
            let m = t.cast::<dlpack::DLManagedTensor>();
            if let Some(d) = (*m).deleter {
                d(m)
            }
        }
    }
}
