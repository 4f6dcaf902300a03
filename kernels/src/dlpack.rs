//! DLPack: a local window lent to another library, or another library's tensor lent to nx,
//! zero-copy, in DLPack 1.0's structs (`DLManagedTensorVersioned`) or the legacy
//! `DLManagedTensor`.
//!
//! An export holds a claim on the array's memory until the consumer calls the tensor's deleter:
//! a read export ([`Access::Read`], flagged `DLPACK_FLAG_BITMASK_READ_ONLY`) a shared claim, so
//! nx may still read but not write the memory meanwhile; a write export an exclusive one, so nx
//! neither reads nor writes it until the consumer is done (its writes are then seen). Exports
//! refuse dead buffers, memory the host does not address, negative strides (which NumPy and
//! PyTorch consumers do not all accept: copy first) and, for writing, repeated elements.
//!
//! An import wraps the producer's memory as a [`Buffer`] whose last handle calls the producer's
//! deleter; a read-only tensor becomes a read-only buffer. It takes host tensors (`kDLCPU`,
//! `kDLCUDAHost`) of the dtypes nx has, at any strides.
//!
//! # Examples
//!
//! ```
//! use nx_kernels::{dlpack, Access, Array};
//! use nx_mesh::Device;
//!
//! let dev = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
//! let a = Array::<f32>::from_vec(dev, &[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0])?;
//! let t = dlpack::export(&a.clone().into_any(), Access::Read)?;
//! // the consumer (here nx itself) takes the tensor; its deleter runs when the import ends
//! let b = unsafe { dlpack::import(t, dev)? }.expect::<f32>()?;
//! assert_eq!(b.to_vec()?, a.to_vec()?);
//! assert!(a.set(&[0, 0], 9.0).is_err(), "exported for reading: nx writes nothing meanwhile");
//! drop(b);
//! a.set(&[0, 0], 9.0)?;
//! # Ok::<(), nx_kernels::Error>(())
//! ```

use std::ffi::c_void;
use std::ptr::NonNull;

use nx_mesh::Device;

use crate::buffer::{ClaimRefusal, Claims};
use crate::door::Operand;
use crate::{Access, AnyArray, Array, Buffer, Dtype, Error, Layout, Result, MAX_RANK};

/// `DLDeviceType::kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `DLDeviceType::kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;
/// `DLDeviceType::kDLCUDAHost` (pinned host memory).
pub const DEVICE_CUDA_HOST: i32 = 3;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub const FLAG_IS_COPIED: u64 = 2;
/// The DLPack version these structs are (1.0).
pub const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// `DLDeviceType`.
    pub device_type: i32,
    /// The device's ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// `DLDataTypeCode`: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool.
    pub code: u8,
    /// Bits of one lane.
    pub bits: u8,
    /// Lanes (1: a scalar element).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// The memory's base address.
    pub data: *mut c_void,
    /// The device.
    pub device: DLDevice,
    /// Axes.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for C-contiguous.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.0).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The producer's version.
    pub version: DLPackVersion,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `FLAG_READ_ONLY`, `FLAG_IS_COPIED`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The legacy `DLManagedTensor` (DLPack before 1.0): no version, no flags.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The DLPack type of `d` (a packed dtype's is its width in bits: nx exports none).
pub fn data_type(d: Dtype) -> DLDataType {
    let code = match d.kind() {
        crate::Kind::Bool => 6,
        crate::Kind::Int => 0,
        crate::Kind::Uint => 1,
        crate::Kind::Float if d == Dtype::BF16 => 4,
        // dlpack.h 1.1: kDLFloat8_e4m3fn, kDLFloat8_e5m2
        crate::Kind::Float if d == Dtype::F8E4M3 => 10,
        crate::Kind::Float if d == Dtype::F8E5M2 => 12,
        crate::Kind::Float => 2,
        crate::Kind::Complex => 5,
    };
    DLDataType { code, bits: d.bits() as u8, lanes: 1 }
}

/// The dtype of DLPack type `t`, where nx has it.
///
/// # Errors
/// [`Error::Invalid`] naming the code, bits and lanes otherwise.
pub fn dtype_of(t: DLDataType) -> Result<Dtype> {
    let d = match (t.code, t.bits, t.lanes) {
        (6, 8, 1) => Dtype::Bool,
        (0, 8, 1) => Dtype::I8,
        (0, 16, 1) => Dtype::I16,
        (0, 32, 1) => Dtype::I32,
        (0, 64, 1) => Dtype::I64,
        (1, 8, 1) => Dtype::U8,
        (1, 16, 1) => Dtype::U16,
        (1, 32, 1) => Dtype::U32,
        (1, 64, 1) => Dtype::U64,
        (2, 16, 1) => Dtype::F16,
        (4, 16, 1) => Dtype::BF16,
        (10, 8, 1) => Dtype::F8E4M3,
        (12, 8, 1) => Dtype::F8E5M2,
        (2, 32, 1) => Dtype::F32,
        (2, 64, 1) => Dtype::F64,
        (5, 64, 1) => Dtype::C64,
        (5, 128, 1) => Dtype::C128,
        (code, bits, lanes) => {
            return Err(Error::Invalid {
                func: "nx_kernels::dlpack::dtype_of",
                why: format!("no nx dtype is DLPack code {code}, {bits} bits, {lanes} lanes"),
            })
        }
    };
    Ok(d)
}

/// What an exported tensor keeps until its deleter: the claim, the buffer, the extents.
#[repr(C)]
struct Lent<M> {
    /// First, so that the tensor's address is the whole's.
    managed: M,
    _claims: Claims,
    _buffer: Buffer,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

/// The `DLTensor` of `array` and what it must keep: checks the export's conditions and claims.
fn prepare(func: &'static str, array: &AnyArray, access: Access) -> Result<(DLTensor, Claims, Vec<i64>, Vec<i64>)> {
    let layout = array.layout();
    let buffer = array.buffer();
    if let Some(d) = buffer.death() {
        return Err(Error::Dead { func, why: d.to_string() });
    }
    if array.dtype().is_packed() {
        return Err(Error::Invalid {
            func,
            why: format!(
                "{} is packed (elements narrower than a byte): convert it to a byte dtype to export it",
                array.dtype()
            ),
        });
    }
    let Some(base) = buffer.host_ptr() else {
        return Err(Error::Invalid {
            func,
            why: format!("the memory of {} is not host memory (device exports need the GPU library)", buffer.device()),
        });
    };
    if let Some(axis) = layout.strides().iter().zip(layout.shape()).position(|(&s, &n)| s < 0 && n > 1) {
        return Err(Error::Invalid {
            func,
            why: format!(
                "stride {} along axis {axis} of {:?} is negative: DLPack consumers do not all take it (copy first)",
                layout.strides()[axis],
                layout.shape()
            ),
        });
    }
    let write = access == Access::ReadWrite;
    if write && !layout.is_distinct() {
        return Err(Error::Invalid {
            func,
            why: format!(
                "layout {:?} at strides {:?} repeats elements: it cannot be lent for writing",
                layout.shape(),
                layout.strides()
            ),
        });
    }
    // claimed first, then the pending work awaited: no call can queue work on it in between
    let claims = buffer.claim(write).map_err(|r| match r {
        ClaimRefusal::Dead(_) => Error::Dead { func, why: "the buffer died".into() },
        ClaimRefusal::HeldExclusive(_) => Error::Invalid {
            func,
            why: if write {
                "the memory is held by a call or an export (lending it for writing needs it alone)".into()
            } else {
                "the memory is held exclusive by a call or an export for writing".into()
            },
        },
        ClaimRefusal::ReadOnly(_) => {
            Error::Invalid { func, why: "the buffer admits reads only: export it for reading".into() }
        }
    })?;
    buffer.wait()?;
    let shape: Vec<i64> = layout.shape().iter().map(|&n| n as i64).collect();
    // a negative stride is left only along axes of one element or none, where it moves nothing
    let strides: Vec<i64> = layout.strides().iter().map(|&s| s.max(0) as i64).collect();
    let t = DLTensor {
        data: base.as_ptr().cast(),
        device: DLDevice { device_type: DEVICE_CPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: data_type(array.dtype()),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        // positions are within ±isize::MAX / 32: the byte offset fits
        byte_offset: (layout.offset().max(0) as u64) * array.dtype().size() as u64,
    };
    Ok((t, claims, shape, strides))
}

/// Lends `array`'s window to a DLPack consumer as a `DLManagedTensorVersioned`, for `access`
/// (a read export is flagged read-only). The claim is held until the consumer calls the
/// tensor's deleter, which it must call once.
///
/// Returns the tensor, owned by the consumer.
///
/// # Errors
/// [`Error::Dead`] for a dead buffer; [`Error::Invalid`] for memory the host does not address,
/// a negative stride, repeated elements lent for writing, a read-only buffer lent for writing,
/// and memory held by a call or export that conflicts; [`Error::Lost`] where work pending on it
/// was lost.
pub fn export(array: &AnyArray, access: Access) -> Result<NonNull<DLManagedTensorVersioned>> {
    let (dl_tensor, claims, shape, strides) = prepare("nx_kernels::dlpack::export", array, access)?;
    let flags = if access == Access::Read { FLAG_READ_ONLY } else { 0 };
    let managed = DLManagedTensorVersioned {
        version: VERSION,
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_versioned),
        flags,
        dl_tensor,
    };
    Ok(lend(managed, Kept { claims, buffer: array.buffer().clone(), shape, strides }))
}

/// As [`export`], in the legacy `DLManagedTensor` (which has no read-only flag: a read export's
/// consumer must not write).
///
/// # Errors
/// As [`export`].
pub fn export_legacy(array: &AnyArray, access: Access) -> Result<NonNull<DLManagedTensor>> {
    let (dl_tensor, claims, shape, strides) = prepare("nx_kernels::dlpack::export_legacy", array, access)?;
    let managed = DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_legacy) };
    Ok(lend(managed, Kept { claims, buffer: array.buffer().clone(), shape, strides }))
}

/// The two managed structs' common fields.
trait Managed {
    fn parts(&mut self) -> (&mut *mut c_void, &mut DLTensor);
}

impl Managed for DLManagedTensorVersioned {
    fn parts(&mut self) -> (&mut *mut c_void, &mut DLTensor) {
        (&mut self.manager_ctx, &mut self.dl_tensor)
    }
}

impl Managed for DLManagedTensor {
    fn parts(&mut self) -> (&mut *mut c_void, &mut DLTensor) {
        (&mut self.manager_ctx, &mut self.dl_tensor)
    }
}

/// What an export keeps until its deleter.
struct Kept {
    claims: Claims,
    buffer: Buffer,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// Leaks `managed` with what it keeps, its context and extents pointing into the leaked box.
fn lend<M: Managed>(managed: M, kept: Kept) -> NonNull<M> {
    let held = Box::new(Lent {
        managed,
        _claims: kept.claims,
        _buffer: kept.buffer,
        _shape: kept.shape,
        _strides: kept.strides,
    });
    let p = Box::into_raw(held);
    // SAFETY: `p` is the box just leaked; its vectors do not move while it lives.
    unsafe {
        let (shape, strides) = ((*p)._shape.as_mut_ptr(), (*p)._strides.as_mut_ptr());
        let (ctx, t) = (*p).managed.parts();
        *ctx = p.cast();
        t.shape = shape;
        t.strides = strides;
        NonNull::new_unchecked(p.cast())
    }
}

/// The deleter of [`export`]'s tensors: releases the claim and the buffer.
unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    if !t.is_null() {
        // SAFETY: `t` is the `Held` box `export` leaked (its first field), deleted once.
        drop(unsafe { Box::from_raw(t.cast::<Lent<DLManagedTensorVersioned>>()) });
    }
}

/// The deleter of [`export_legacy`]'s tensors.
unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    if !t.is_null() {
        // SAFETY: as in `delete_versioned`.
        drop(unsafe { Box::from_raw(t.cast::<Lent<DLManagedTensor>>()) });
    }
}

/// A raw pointer that the release closure carries to whichever thread ends the memory.
struct SendPtr(*mut c_void);
// SAFETY: DLPack deleters may be called from any thread (the standard asks producers for that).
unsafe impl Send for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so that a closure captures the whole wrapper).
    fn into_inner(self) -> *mut c_void {
        self.0
    }
}

/// Takes a producer's `DLManagedTensorVersioned` as an array on `device` (a host device),
/// zero-copy: its memory stays the producer's, and the tensor's deleter runs when the last
/// buffer and work over it have ended. A read-only tensor becomes a read-only array.
///
/// Returns the array.
///
/// # Errors
/// [`Error::Invalid`] naming what does not fit — a major version other than 1, device memory, a
/// dtype nx lacks, more than [`MAX_RANK`] axes, a negative extent, a first element misaligned
/// for its dtype, a layout overflowing — after calling the deleter (the tensor is consumed
/// either way).
///
/// # Safety
/// `t` must be a valid tensor of its producer, not yet consumed, whose memory stays valid and
/// is written by no one else until its deleter runs.
pub unsafe fn import(t: NonNull<DLManagedTensorVersioned>, device: Device) -> Result<AnyArray> {
    const FUNC: &str = "nx_kernels::dlpack::import";
    let p = t.as_ptr();
    // SAFETY: the caller's contract: `t` is a valid tensor.
    let (version, flags, deleter) = unsafe { ((*p).version, (*p).flags, (*p).deleter) };
    let release = move || {
        if let Some(d) = deleter {
            // SAFETY: the producer's deleter, called once, on its own tensor.
            unsafe { d(p) }
        }
    };
    if version.major != 1 {
        release();
        return Err(Error::Invalid {
            func: FUNC,
            why: format!("DLPack {}.{}: this consumer reads version 1", version.major, version.minor),
        });
    }
    let access = if flags & FLAG_READ_ONLY != 0 { Access::Read } else { Access::ReadWrite };
    let ptr = SendPtr(p.cast());
    // SAFETY: the caller's contract; the struct is copied out, since a refusal releases it;
    // `release` is called once, by the buffer or there.
    unsafe {
        take(FUNC, (*p).dl_tensor, device, access, move || {
            let p = ptr.into_inner();
            if let Some(d) = deleter {
                d(p.cast())
            }
        })
    }
}

/// As [`import`], for a legacy `DLManagedTensor` (always read-write).
///
/// # Errors
/// As [`import`], but for the version.
///
/// # Safety
/// As [`import`].
pub unsafe fn import_legacy(t: NonNull<DLManagedTensor>, device: Device) -> Result<AnyArray> {
    let p = t.as_ptr();
    // SAFETY: the caller's contract.
    let deleter = unsafe { (*p).deleter };
    let ptr = SendPtr(p.cast());
    // SAFETY: the caller's contract; `release` is called once.
    unsafe {
        take("nx_kernels::dlpack::import_legacy", (*p).dl_tensor, device, Access::ReadWrite, move || {
            let p = ptr.into_inner();
            if let Some(d) = deleter {
                d(p.cast())
            }
        })
    }
}

/// The array over tensor `t`'s memory; `release` runs when it ends, or now on an error.
///
/// # Safety
/// As [`import`].
unsafe fn take(
    func: &'static str,
    t: DLTensor,
    device: Device,
    access: Access,
    release: impl FnOnce() + Send + 'static,
) -> Result<AnyArray> {
    let fail = |release: Box<dyn FnOnce() + Send>, why: String| {
        release();
        Err(Error::Invalid { func, why })
    };
    let release: Box<dyn FnOnce() + Send> = Box::new(release);
    if !matches!(t.device.device_type, DEVICE_CPU | DEVICE_CUDA_HOST) {
        return fail(
            release,
            format!("device type {} is not host memory (import it with the GPU library)", t.device.device_type),
        );
    }
    let dtype = match dtype_of(t.dtype) {
        Ok(d) => d,
        Err(e) => return fail(release, e.to_string()),
    };
    let ndim = match usize::try_from(t.ndim) {
        Ok(n) if n <= MAX_RANK => n,
        _ => return fail(release, format!("{} axes (0 to {MAX_RANK} fit)", t.ndim)),
    };
    if ndim > 0 && t.shape.is_null() {
        return fail(release, format!("{ndim} axes but no shape"));
    }
    // SAFETY: the caller's contract: `shape` (and `strides` where not null) hold `ndim` values.
    let (shape, strides) = unsafe {
        let shape: &[i64] = if ndim == 0 { &[] } else { std::slice::from_raw_parts(t.shape, ndim) };
        let strides = (!t.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(t.strides, ndim).to_vec());
        (shape.to_vec(), strides)
    };
    let Ok(shape) = shape.iter().map(|&n| usize::try_from(n)).collect::<std::result::Result<Vec<usize>, _>>() else {
        return fail(release, format!("shape {shape:?} has a negative extent"));
    };
    let strides: Vec<isize> = match strides {
        Some(s) => s.iter().map(|&s| s as isize).collect(),
        None => match crate::layout::contiguous_strides(&shape) {
            Ok(s) => s,
            Err(e) => return fail(release, e.to_string()),
        },
    };
    let layout = match Layout::new(shape.clone(), strides.clone(), 0) {
        Ok(l) => l,
        Err(e) => return fail(release, e.to_string()),
    };
    let size = dtype.size();
    let Some((lo, hi)) = layout.span() else {
        // no element: a buffer of no bytes over nothing
        release();
        return any(dtype, layout, Buffer::new(device, 0)?);
    };
    let first = (t.data as usize).wrapping_add(t.byte_offset as usize);
    let base = first.wrapping_add_signed(lo * size as isize);
    if t.data.is_null() || !base.is_multiple_of(dtype.align()) {
        return fail(release, format!("the first element at {first:#x} is not aligned for {dtype} (or is null)"));
    }
    let bytes = ((hi - lo + 1) as usize) * size;
    let layout = Layout::new(shape, strides, -lo).expect("a shift of a checked layout");
    // SAFETY: the caller's contract: the producer's memory spans these bytes until `release`.
    let buffer =
        unsafe { Buffer::foreign(device, NonNull::new(base as *mut u8).expect("not null"), bytes, access, release) };
    any(dtype, layout, buffer)
}

/// The array of `dtype` over `layout` in `buffer`.
fn any(dtype: Dtype, layout: Layout, buffer: Buffer) -> Result<AnyArray> {
    use half::{bf16, f16};
    use num_complex::{Complex32, Complex64};
    Ok(match dtype {
        Dtype::Bool => Array::<bool>::new(layout, buffer)?.into_any(),
        Dtype::I8 => Array::<i8>::new(layout, buffer)?.into_any(),
        Dtype::I16 => Array::<i16>::new(layout, buffer)?.into_any(),
        Dtype::I32 => Array::<i32>::new(layout, buffer)?.into_any(),
        Dtype::I64 => Array::<i64>::new(layout, buffer)?.into_any(),
        Dtype::U8 => Array::<u8>::new(layout, buffer)?.into_any(),
        Dtype::U16 => Array::<u16>::new(layout, buffer)?.into_any(),
        Dtype::U32 => Array::<u32>::new(layout, buffer)?.into_any(),
        Dtype::U64 => Array::<u64>::new(layout, buffer)?.into_any(),
        Dtype::F16 => Array::<f16>::new(layout, buffer)?.into_any(),
        Dtype::BF16 => Array::<bf16>::new(layout, buffer)?.into_any(),
        Dtype::F8E4M3 => Array::<crate::dtype::fp8::F8E4M3>::new(layout, buffer)?.into_any(),
        Dtype::F8E5M2 => Array::<crate::dtype::fp8::F8E5M2>::new(layout, buffer)?.into_any(),
        Dtype::I4 | Dtype::U4 | Dtype::Bit => unreachable!("dtype_of never answers a packed dtype"),
        Dtype::F32 => Array::<f32>::new(layout, buffer)?.into_any(),
        Dtype::F64 => Array::<f64>::new(layout, buffer)?.into_any(),
        Dtype::C64 => Array::<Complex32>::new(layout, buffer)?.into_any(),
        Dtype::C128 => Array::<Complex64>::new(layout, buffer)?.into_any(),
    })
}
