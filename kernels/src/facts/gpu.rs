//! The running machine's GPUs, read from the CUDA driver (`libcuda.so.1`, loaded at run time; no
//! CUDA toolkit needed to build or to run without one): each device's name and key, compute
//! capability, multiprocessors, memory, shared memory per block and per multiprocessor, and L2
//! cache, with the driver's version. Where no driver loads, or it finds no device, the answer
//! says why. Seven driver calls, made through `dlopen`/`dlsym`; nothing is kept.

use std::ffi::{c_char, c_int, CStr};

use crate::dl::Library as Lib;

use serde::Serialize;

/// One GPU as its driver describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// The driver's ordinal.
    pub ordinal: u32,
    /// The model's name (`"NVIDIA H200"`).
    pub name: String,
    /// Its key ([`super::arch_string`]): the shipped file describing the model, where one is.
    pub key: String,
    /// The compute capability (`"9.0"`).
    pub compute_capability: String,
    /// Multiprocessors.
    pub multiprocessors: u32,
    /// Device memory, in bytes.
    pub memory_bytes: u64,
    /// The most shared memory one block may use (opt-in), in bytes.
    pub max_shared_memory_per_block: u64,
    /// Shared memory per multiprocessor, in bytes.
    pub shared_memory_per_multiprocessor: u64,
    /// The L2 cache, in bytes.
    pub l2_bytes: u64,
    /// Whether a shipped file describes the model ([`super::device_named`]).
    pub shipped: bool,
}

/// The GPUs the driver found, and the driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    /// The library loaded.
    pub driver: String,
    /// The CUDA version the driver supports (`"12.8"`).
    pub driver_version: String,
    /// The devices, by ordinal.
    pub gpus: Vec<Gpu>,
}

/// `CUresult cuInit(unsigned int)` and friends; `CUdevice` is an `int`.
type Init = unsafe extern "C" fn(u32) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int) -> c_int;
type Count = unsafe extern "C" fn(*mut c_int) -> c_int;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type TotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type Attribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// The driver's attributes read (`CUdevice_attribute`).
const MULTIPROCESSOR_COUNT: c_int = 16;
const L2_CACHE_SIZE: c_int = 38;
const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const COMPUTE_CAPABILITY_MINOR: c_int = 76;
const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: c_int = 81;
const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;

/// `CUDA_ERROR_NO_DEVICE`: a driver with no device is a machine without GPUs, not an error.
const NO_DEVICE: c_int = 100;

/// The running machine's GPUs through the CUDA driver `libcuda.so.1` (else `libcuda.so`), found
/// where the dynamic loader looks.
///
/// # Errors
/// Why there are none to read, in words: no driver loads, a call it lacks, or one failing
/// (named with its error code). A driver that finds no device answers an empty list.
pub fn read() -> Result<GpuFacts, String> {
    let mut why = Vec::new();
    for name in ["libcuda.so.1", "libcuda.so"] {
        match Lib::open(name) {
            Ok(lib) => return read_lib(&lib),
            Err(e) => why.push(e),
        }
    }
    Err(format!("no CUDA driver: {}", why.join("; ")))
}

/// [`read`] through the driver library at `path`.
///
/// # Errors
/// As [`read`].
pub fn read_from(path: &str) -> Result<GpuFacts, String> {
    read_lib(&Lib::open(path)?)
}

fn read_lib(lib: &Lib) -> Result<GpuFacts, String> {
    let ok = |call: &str, r: c_int| if r == 0 { Ok(()) } else { Err(format!("{}: {call} answered {r}", lib.path())) };
    let (init, version, count, device, name, total, attribute) =
        // SAFETY: each type is the driver API's signature of its symbol, as `cuda.h` declares it.
        unsafe {
        (
            lib.get::<Init>("cuInit")?,
            lib.get::<Version>("cuDriverGetVersion")?,
            lib.get::<Count>("cuDeviceGetCount")?,
            lib.get::<DeviceGet>("cuDeviceGet")?,
            lib.get::<Name>("cuDeviceGetName")?,
            lib.get::<TotalMem>("cuDeviceTotalMem_v2")?,
            lib.get::<Attribute>("cuDeviceGetAttribute")?,
        )
    };
    let mut v: c_int = 0;
    // SAFETY: the driver's calls with valid out pointers.
    ok("cuDriverGetVersion", unsafe { version(&mut v) })?;
    let driver_version = format!("{}.{}", v / 1000, (v % 1000) / 10);
    let facts = |gpus| GpuFacts { driver: lib.path().to_string(), driver_version: driver_version.clone(), gpus };
    // SAFETY: as above.
    match unsafe { init(0) } {
        0 => {}
        NO_DEVICE => return Ok(facts(Vec::new())),
        r => return Err(format!("{}: cuInit answered {r}", lib.path())),
    }
    let mut n: c_int = 0;
    // SAFETY: as above.
    ok("cuDeviceGetCount", unsafe { count(&mut n) })?;
    let mut gpus = Vec::new();
    for ordinal in 0..n.max(0) {
        let mut d: c_int = 0;
        // SAFETY: as above; `ordinal` below the count the driver gave.
        ok("cuDeviceGet", unsafe { device(&mut d, ordinal) })?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: a buffer of the length passed; the driver NUL-terminates within it.
        ok("cuDeviceGetName", unsafe { name(buf.as_mut_ptr(), buf.len() as c_int, d) })?;
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (its last byte forced so).
        let model = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        let mut bytes: usize = 0;
        // SAFETY: as above.
        ok("cuDeviceTotalMem_v2", unsafe { total(&mut bytes, d) })?;
        let attr = |a: c_int| -> Result<u64, String> {
            let mut x: c_int = 0;
            // SAFETY: as above.
            ok(&format!("cuDeviceGetAttribute({a})"), unsafe { attribute(&mut x, a, d) })?;
            u64::try_from(x).map_err(|_| format!("{}: attribute {a} of device {ordinal} is {x}", lib.path()))
        };
        let key = super::arch_string(&model);
        gpus.push(Gpu {
            ordinal: ordinal as u32,
            shipped: super::device_named(&model).is_some(),
            key,
            name: model,
            compute_capability: format!("{}.{}", attr(COMPUTE_CAPABILITY_MAJOR)?, attr(COMPUTE_CAPABILITY_MINOR)?),
            multiprocessors: u32::try_from(attr(MULTIPROCESSOR_COUNT)?).map_err(|e| format!("{}: {e}", lib.path()))?,
            memory_bytes: bytes as u64,
            max_shared_memory_per_block: attr(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            shared_memory_per_multiprocessor: attr(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            l2_bytes: attr(L2_CACHE_SIZE)?,
        });
    }
    Ok(facts(gpus))
}

/// The CUDA libraries nx uses beside the driver, and their versions where they load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CudaLibraries {
    /// NVRTC (`nvrtcVersion`): its version, or why not.
    pub nvrtc: Result<String, String>,
    /// cuBLAS (`cublasGetProperty`): its version, or why not.
    pub cublas: Result<String, String>,
    /// NCCL (`ncclGetVersion`): its version, or why not.
    pub nccl: Result<String, String>,
}

/// The versions of NVRTC, cuBLAS and NCCL: each library loaded from `dirs` in order (then where
/// the dynamic loader looks), by the sonames of CUDA 13 and 12 (`libnvrtc.so.13`,
/// `libcublas.so.12`, `libnccl.so.2`, …), and asked its version.
pub fn libraries(dirs: &[std::path::PathBuf]) -> CudaLibraries {
    let find = |names: &[&str]| -> Result<Lib, String> {
        let mut last = String::new();
        let candidates = dirs
            .iter()
            .flat_map(|d| names.iter().map(move |n| d.join(n).display().to_string()))
            .chain(names.iter().map(|n| n.to_string()));
        for c in candidates {
            match Lib::open(&c) {
                Ok(l) => return Ok(l),
                Err(e) => last = e,
            }
        }
        Err(format!("none of {} loads (the last: {last})", names.join(", ")))
    };
    let nvrtc = find(&["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]).and_then(|l| {
        // SAFETY: `nvrtcResult nvrtcVersion(int *major, int *minor)`.
        let f = unsafe { l.get::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>("nvrtcVersion")? };
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out pointers.
        match unsafe { f(&mut a, &mut b) } {
            0 => Ok(format!("{a}.{b} ({})", l.path())),
            r => Err(format!("{}: nvrtcVersion answered {r}", l.path())),
        }
    });
    let cublas = find(&["libcublas.so.13", "libcublas.so.12", "libcublas.so"]).and_then(|l| {
        // SAFETY: `cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value)`.
        let f = unsafe { l.get::<unsafe extern "C" fn(c_int, *mut c_int) -> c_int>("cublasGetProperty")? };
        let mut v = [0; 3];
        for (k, x) in v.iter_mut().enumerate() {
            // SAFETY: a valid out pointer; MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL are 0, 1, 2.
            let r = unsafe { f(k as c_int, x) };
            if r != 0 {
                return Err(format!("{}: cublasGetProperty({k}) answered {r}", l.path()));
            }
        }
        Ok(format!("{}.{}.{} ({})", v[0], v[1], v[2], l.path()))
    });
    let nccl = find(&["libnccl.so.2", "libnccl.so"]).and_then(|l| {
        // SAFETY: `ncclResult_t ncclGetVersion(int *version)`.
        let f = unsafe { l.get::<unsafe extern "C" fn(*mut c_int) -> c_int>("ncclGetVersion")? };
        let mut v = 0;
        // SAFETY: a valid out pointer.
        match unsafe { f(&mut v) } {
            // NCCL_VERSION(X, Y, Z) = X·10000 + Y·100 + Z since 2.9
            0 => Ok(format!("{}.{}.{} ({})", v / 10000, (v % 10000) / 100, v % 100, l.path())),
            r => Err(format!("{}: ncclGetVersion answered {r}", l.path())),
        }
    });
    CudaLibraries { nvrtc, cublas, nccl }
}
