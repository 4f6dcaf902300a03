//! DLPack in Rust alone: exports read back through hand-read structs, every dtype round-tripped,
//! claims held until the deleter, producers' tensors built by hand (strides, negative strides,
//! offsets, read-only, empty) imported and their deleters run exactly once, refusals named.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use half::{bf16, f16};
use nx_kernels::dlpack::{self, DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use nx_kernels::{Access, Array, Dtype, Element, Move};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// The elements a tensor's struct describes, read by hand: positions from its shape, strides
/// and byte offset (not through nx's layouts).
unsafe fn elements<T: Copy>(t: &DLTensor) -> Vec<T> {
    let n = t.ndim as usize;
    // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
    let shape = unsafe { std::slice::from_raw_parts(t.shape, n) };
    // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
    let strides = unsafe { std::slice::from_raw_parts(t.strides, n) };
    let total: i64 = shape.iter().product();
    let mut out = Vec::new();
    for k in 0..total {
        let (mut rem, mut pos) = (k, 0i64);
        for a in (0..n).rev() {
            pos += (rem % shape[a]) * strides[a];
            rem /= shape[a];
        }
        let p = (t.data as usize + t.byte_offset as usize) as *const T;
        // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
        out.push(unsafe { *p.offset(pos as isize) });
    }
    out
}

fn f32s(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25 - 3.0).collect()
}

#[test]
fn exports_describe_the_window_and_hold_its_claim() {
    let a = Array::<f32>::from_vec(DEV, &[4, 6], f32s(24)).unwrap();
    // a strided window: rows 1..3, every other column from 1
    let w = a
        .apply(&Move::Slice { axis: 0, start: Some(1), stop: Some(3), step: 1 })
        .unwrap()
        .unwrap()
        .apply(&Move::Slice { axis: 1, start: Some(1), stop: None, step: 2 })
        .unwrap()
        .unwrap();
    let t = dlpack::export(&w.clone().into_any(), Access::Read).unwrap();
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    let m = unsafe { &*t.as_ptr() };
    assert_eq!((m.version.major, m.version.minor), (1, 0));
    assert_eq!(m.flags & dlpack::FLAG_READ_ONLY, dlpack::FLAG_READ_ONLY);
    assert_eq!(m.dl_tensor.device, DLDevice { device_type: dlpack::DEVICE_CPU, device_id: 0 });
    assert_eq!(m.dl_tensor.dtype, DLDataType { code: 2, bits: 32, lanes: 1 });
    assert_eq!(m.dl_tensor.ndim, 2);
    let want: Vec<f32> = (1..3).flat_map(|r| (1..6).step_by(2).map(move |c| (r * 6 + c) as f32 * 0.25 - 3.0)).collect();
    // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
    assert_eq!(unsafe { elements::<f32>(&m.dl_tensor) }, want);
    // reads go on; writes wait for the deleter
    assert_eq!(a.get(&[0, 0]).unwrap(), -3.0);
    let e = a.set(&[0, 0], 1.0).unwrap_err().to_string();
    assert!(e.contains("HeldExclusive") || e.contains("held"), "{e}");
    // SAFETY: the export is deleted once, here.
    unsafe { (m.deleter.unwrap())(t.as_ptr()) };
    a.set(&[0, 0], 1.0).unwrap();

    // a write export excludes nx's reads too, and a second export, until its deleter
    let t = dlpack::export(&a.clone().into_any(), Access::ReadWrite).unwrap();
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    let m = unsafe { &mut *t.as_ptr() };
    assert_eq!(m.flags & dlpack::FLAG_READ_ONLY, 0);
    assert!(a.get(&[0, 0]).is_err());
    let e = dlpack::export(&a.clone().into_any(), Access::Read).unwrap_err().to_string();
    assert!(e.contains("nx_kernels::dlpack::export") && e.contains("held exclusive"), "{e}");
    // the consumer writes element [2, 3]
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    unsafe { *(m.dl_tensor.data as *mut f32).add(2 * 6 + 3) = 77.0 };
    // SAFETY: the export is deleted once, here.
    unsafe { (m.deleter.unwrap())(t.as_ptr()) };
    assert_eq!(a.get(&[2, 3]).unwrap(), 77.0);

    // the legacy struct: the same tensor, no flags
    let t = dlpack::export_legacy(&w.clone().into_any(), Access::Read).unwrap();
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    let m = unsafe { &*t.as_ptr() };
    // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
    assert_eq!(unsafe { elements::<f32>(&m.dl_tensor) }.len(), 6);
    assert!(a.set(&[0, 0], 2.0).is_err());
    // SAFETY: the export is deleted once, here.
    unsafe { (m.deleter.unwrap())(t.as_ptr()) };
    a.set(&[0, 0], 2.0).unwrap();
}

#[test]
fn exports_refuse_what_consumers_cannot_take() {
    let a = Array::<f32>::from_vec(DEV, &[3, 2], f32s(6)).unwrap();
    let flipped = a.apply(&Move::Flip(0)).unwrap().unwrap().into_any();
    let e = dlpack::export(&flipped, Access::Read).unwrap_err().to_string();
    assert!(e.contains("nx_kernels::dlpack::export") && e.contains("negative") && e.contains("axis 0"), "{e}");
    let row = a.apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(1), step: 1 }).unwrap().unwrap();
    let wide = row.apply(&Move::Expand(vec![5, 2])).unwrap().unwrap().into_any();
    let e = dlpack::export(&wide, Access::ReadWrite).unwrap_err().to_string();
    assert!(e.contains("repeats elements"), "{e}");
    // for reading, a broadcast goes out with its stride of 0
    let t = dlpack::export(&wide, Access::Read).unwrap();
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    let m = unsafe { &*t.as_ptr() };
    // SAFETY: the struct describes live memory of its producer (an export not yet deleted).
    assert_eq!(unsafe { std::slice::from_raw_parts(m.dl_tensor.strides, 2) }, &[0, 1]);
    // SAFETY: the export is deleted once, here.
    unsafe { (m.deleter.unwrap())(t.as_ptr()) };
    let ro = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap().into_any();
    let e = dlpack::export(&ro, Access::ReadWrite).unwrap_err().to_string();
    assert!(e.contains("reads only"), "{e}");
    let dead = Array::<f32>::zeros(DEV, &[2]).unwrap();
    dead.buffer().free().unwrap();
    let e = dlpack::export_legacy(&dead.into_any(), Access::Read).unwrap_err().to_string();
    assert!(e.contains("nx_kernels::dlpack::export_legacy") && e.contains("free"), "{e}");
    let off = Array::<f32>::new(nx_kernels::Layout::contiguous(&[2]).unwrap(), nx_kernels::Buffer::unaddressed(DEV, 8))
        .unwrap()
        .into_any();
    let e = dlpack::export(&off, Access::Read).unwrap_err().to_string();
    assert!(e.contains("not host memory"), "{e}");
}

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: Vec<T>, code: u8) {
    let n = values.len();
    let a = Array::<T>::from_vec(DEV, &[n], values.clone()).unwrap();
    let t = dlpack::export(&a.clone().into_any(), Access::ReadWrite).unwrap();
    assert_eq!(
        // SAFETY: a tensor this test made or exported, alive until its deleter runs.
        unsafe { (*t.as_ptr()).dl_tensor.dtype },
        DLDataType { code, bits: (T::DTYPE.size() * 8) as u8, lanes: 1 }
    );
    assert_eq!(dlpack::dtype_of(dlpack::data_type(T::DTYPE)).unwrap(), T::DTYPE);
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let b = unsafe { dlpack::import(t, DEV) }.unwrap().expect::<T>().unwrap();
    assert_eq!(b.to_vec().unwrap(), values, "{}", T::DTYPE);
    drop(b);
    // the deleter ran: nx holds its memory alone again
    a.set(&[0], values[0]).unwrap();
}

#[test]
fn every_dtype_round_trips_through_nx_itself() {
    round_trip(vec![true, false, true], 6);
    round_trip(vec![-3i8, 0, 127], 0);
    round_trip(vec![-3i16, 9], 0);
    round_trip(vec![-3i32, 9], 0);
    round_trip(vec![i64::MIN, 9], 0);
    round_trip(vec![255u8, 9], 1);
    round_trip(vec![65535u16, 9], 1);
    round_trip(vec![7u32, 9], 1);
    round_trip(vec![u64::MAX, 9], 1);
    round_trip(vec![f16::from_f32(1.5), f16::INFINITY], 2);
    round_trip(vec![bf16::from_f32(-2.0), bf16::ONE], 4);
    round_trip(vec![1.5f32, -0.0], 2);
    round_trip(vec![1.5f64, 1e300], 2);
    round_trip(vec![num_complex::Complex32::new(1.0, -2.0)], 5);
    round_trip(vec![num_complex::Complex64::new(1.0, -2.0)], 5);
    let e = dlpack::dtype_of(DLDataType { code: 2, bits: 32, lanes: 4 }).unwrap_err().to_string();
    assert!(e.contains("dtype_of") && e.contains("4 lanes"), "{e}");
}

/// A producer's tensor, built by hand: `data` of f32 elements, with a deleter that counts.
struct Producer {
    _data: Vec<f32>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn produced_deleter(t: *mut DLManagedTensorVersioned) {
    // SAFETY: the box this test leaked for the tensor, freed once by its deleter.
    let t = unsafe { Box::from_raw(t) };
    // SAFETY: the box this test leaked for the tensor, freed once by its deleter.
    let p = unsafe { Box::from_raw(t.manager_ctx.cast::<Producer>()) };
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn produced_legacy_deleter(t: *mut DLManagedTensor) {
    // SAFETY: the box this test leaked for the tensor, freed once by its deleter.
    let t = unsafe { Box::from_raw(t) };
    // SAFETY: the box this test leaked for the tensor, freed once by its deleter.
    let p = unsafe { Box::from_raw(t.manager_ctx.cast::<Producer>()) };
    p.deleted.fetch_add(1, Ordering::SeqCst);
}

struct Spec {
    data: Vec<f32>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    flags: u64,
    major: u32,
    device_type: i32,
    dtype: DLDataType,
}

fn spec(data: Vec<f32>, shape: &[i64], strides: Option<&[i64]>) -> Spec {
    Spec {
        data,
        shape: shape.to_vec(),
        strides: strides.map(<[i64]>::to_vec),
        byte_offset: 0,
        flags: 0,
        major: 1,
        device_type: dlpack::DEVICE_CPU,
        dtype: DLDataType { code: 2, bits: 32, lanes: 1 },
    }
}

fn tensor(mut s: Spec, deleted: &Arc<AtomicUsize>) -> (DLTensor, Box<Producer>) {
    let mut p = Box::new(Producer {
        _data: std::mem::take(&mut s.data),
        _shape: s.shape.clone(),
        _strides: s.strides.clone().unwrap_or_default(),
        deleted: deleted.clone(),
    });
    let t = DLTensor {
        data: p._data.as_mut_ptr().cast::<c_void>(),
        device: DLDevice { device_type: s.device_type, device_id: 0 },
        ndim: s.shape.len() as i32,
        dtype: s.dtype,
        shape: p._shape.as_mut_ptr(),
        strides: if s.strides.is_some() { p._strides.as_mut_ptr() } else { std::ptr::null_mut() },
        byte_offset: s.byte_offset,
    };
    (t, p)
}

fn produce(s: Spec, deleted: &Arc<AtomicUsize>) -> NonNull<DLManagedTensorVersioned> {
    let (flags, major) = (s.flags, s.major);
    let (dl_tensor, p) = tensor(s, deleted);
    let m = Box::new(DLManagedTensorVersioned {
        version: dlpack::DLPackVersion { major, minor: 3 },
        manager_ctx: Box::into_raw(p).cast(),
        deleter: Some(produced_deleter),
        flags,
        dl_tensor,
    });
    NonNull::new(Box::into_raw(m)).unwrap()
}

#[test]
fn producers_tensors_import_zero_copy_and_are_released_once() {
    let deleted = Arc::new(AtomicUsize::new(0));
    // C-contiguous (null strides), 2 × 3
    let t = produce(spec(f32s(6), &[2, 3], None), &deleted);
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    let data = unsafe { (*t.as_ptr()).dl_tensor.data as *mut f32 };
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let a = unsafe { dlpack::import(t, DEV) }.unwrap().expect::<f32>().unwrap();
    assert_eq!(a.to_vec().unwrap(), f32s(6));
    a.set(&[1, 2], 50.0).unwrap();
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    assert_eq!(unsafe { *data.add(5) }, 50.0, "nx wrote the producer's memory");
    // SAFETY: a tensor this test made or exported, alive until its deleter runs.
    unsafe { *data.add(1) = -8.0 };
    assert_eq!(a.get(&[0, 1]).unwrap(), -8.0, "nx reads the producer's writes");
    let view = a.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    drop(a);
    assert_eq!(deleted.load(Ordering::SeqCst), 0, "a view keeps the memory");
    drop(view);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);

    // negative strides and an offset: the rows of a 3 × 2 block reversed, from element 4
    let mut s = spec(f32s(8), &[3, 2], Some(&[-2, 1]));
    s.byte_offset = 4 * 4;
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let a = unsafe { dlpack::import(produce(s, &deleted), DEV) }.unwrap().expect::<f32>().unwrap();
    let v = f32s(8);
    assert_eq!(a.to_vec().unwrap(), vec![v[4], v[5], v[2], v[3], v[0], v[1]]);
    drop(a);
    assert_eq!(deleted.load(Ordering::SeqCst), 2);

    // read-only: a read-only array
    let mut s = spec(f32s(3), &[3], Some(&[1]));
    s.flags = dlpack::FLAG_READ_ONLY;
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let a = unsafe { dlpack::import(produce(s, &deleted), DEV) }.unwrap().expect::<f32>().unwrap();
    assert_eq!(a.buffer().access(), Access::Read);
    assert!(a.set(&[0], 1.0).is_err());
    drop(a);
    // no element: released at once
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let a = unsafe { dlpack::import(produce(spec(vec![], &[0, 4], None), &deleted), DEV) }.unwrap();
    assert_eq!(deleted.load(Ordering::SeqCst), 4);
    assert_eq!(a.shape(), &[0, 4]);
    // rank 0
    let a =
        // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
        unsafe { dlpack::import(produce(spec(vec![2.5], &[], None), &deleted), DEV) }.unwrap().expect::<f32>().unwrap();
    assert_eq!(a.get(&[]).unwrap(), 2.5);
    drop(a);
    assert_eq!(deleted.load(Ordering::SeqCst), 5);

    // legacy
    let (dl_tensor, p) = tensor(spec(f32s(2), &[2], None), &deleted);
    let m = Box::new(DLManagedTensor {
        dl_tensor,
        manager_ctx: Box::into_raw(p).cast(),
        deleter: Some(produced_legacy_deleter),
    });
    // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
    let a = unsafe { dlpack::import_legacy(NonNull::new(Box::into_raw(m)).unwrap(), DEV) }.unwrap();
    assert_eq!(a.dtype(), Dtype::F32);
    drop(a);
    assert_eq!(deleted.load(Ordering::SeqCst), 6);
}

#[test]
fn refused_imports_name_the_fault_and_still_release_the_tensor() {
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut n = 0;
    let mut refuse = |s: Spec, words: &[&str]| {
        // SAFETY: a tensor made by this test or exported by nx, not yet consumed, its memory alive until its deleter.
        let e = unsafe { dlpack::import(produce(s, &deleted), DEV) }.unwrap_err().to_string();
        n += 1;
        assert!(e.contains("nx_kernels::dlpack::import"), "{e}");
        for w in words {
            assert!(e.contains(w), "{e} lacks {w}");
        }
        assert_eq!(deleted.load(Ordering::SeqCst), n, "the deleter ran once for: {e}");
    };
    let mut s = spec(f32s(2), &[2], None);
    s.major = 2;
    refuse(s, &["DLPack 2.3"]);
    let mut s = spec(f32s(2), &[2], None);
    s.device_type = dlpack::DEVICE_CUDA;
    refuse(s, &["device type 2", "GPU library"]);
    let mut s = spec(f32s(2), &[2], None);
    s.dtype = DLDataType { code: 2, bits: 8, lanes: 1 };
    refuse(s, &["code 2, 8 bits"]);
    let mut s = spec(f32s(2), &[2], None);
    s.byte_offset = 2;
    refuse(s, &["not aligned for f32"]);
    refuse(spec(f32s(2), &[-1], None), &["negative extent"]);
    refuse(spec(f32s(2), &[1; 17], None), &["17 axes"]);
    refuse(spec(f32s(2), &[1 << 40, 1 << 40], None), &["more elements than a layout reaches"]);
}
