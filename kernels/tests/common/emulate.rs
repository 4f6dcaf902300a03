//! What the CUDA tests need to run generated CUDA C without a GPU: CUDA's built-ins for the
//! host's C++ compiler, a library built from a source, and NVRTC loaded from `NX_NVRTC`.

#![allow(dead_code)] // each test file uses part of it

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use nx_kernels::dl::Library;

/// CUDA's built-ins for the host's C++ compiler: one emulated thread at a time.
pub const SHIM: &str = r#"
#include <math.h>
#include <string.h>
struct nx_dim3 { unsigned x, y, z; };
static nx_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
static inline long long __double_as_longlong(double x) { long long u; memcpy(&u, &x, 8); return u; }
static inline double __longlong_as_double(long long u) { double x; memcpy(&x, &u, 8); return x; }
"#;

/// `src` built into a shared library by the host's C++ compiler (IEEE operations as written: no
/// contraction, no fast math), loaded; `tag` names its temporary directory.
pub fn build_cpp(tag: &str, src: &str) -> Library {
    let dir = std::env::temp_dir().join(format!("nx-cuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cpp, so) = (dir.join("kernels.cpp"), dir.join("kernels.so"));
    std::fs::write(&cpp, src).unwrap();
    let out = std::process::Command::new("c++")
        .args(["-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-w", "-o"])
        .arg(&so)
        .arg(&cpp)
        .output()
        .expect("a C++ compiler (c++) to build the generated kernels");
    assert!(out.status.success(), "c++: {}", String::from_utf8_lossy(&out.stderr));
    let lib = Library::open(so.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    lib
}

type Create = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type Compile = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
type Size = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
type Get = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut *mut c_void) -> c_int;

/// NVRTC, loaded from the path `NX_NVRTC` names.
pub struct Nvrtc {
    _lib: Library,
    create: Create,
    compile: Compile,
    ptx_size: Size,
    ptx: Get,
    log_size: Size,
    log: Get,
    destroy: Destroy,
}

impl Nvrtc {
    /// NVRTC where `NX_NVRTC` names it, or `None` (the test then says so and checks nothing).
    pub fn from_env() -> Option<Nvrtc> {
        let path = std::env::var("NX_NVRTC").ok().filter(|p| !p.is_empty())?;
        let lib = Library::open(&path).unwrap_or_else(|e| panic!("NX_NVRTC: {e}"));
        // SAFETY: NVRTC's own signatures, as nvrtc.h declares them.
        unsafe {
            Some(Nvrtc {
                create: lib.get("nvrtcCreateProgram").unwrap(),
                compile: lib.get("nvrtcCompileProgram").unwrap(),
                ptx_size: lib.get("nvrtcGetPTXSize").unwrap(),
                ptx: lib.get("nvrtcGetPTX").unwrap(),
                log_size: lib.get("nvrtcGetProgramLogSize").unwrap(),
                log: lib.get("nvrtcGetProgramLog").unwrap(),
                destroy: lib.get("nvrtcDestroyProgram").unwrap(),
                _lib: lib,
            })
        }
    }

    /// `source` compiled to PTX for `arch` (`compute_90`) without contraction, as the GPU runtime
    /// compiles it; or NVRTC's log.
    pub fn ptx(&self, source: &str, name: &str, arch: &str) -> Result<String, String> {
        let src = CString::new(source).unwrap();
        let name = CString::new(format!("{name}.cu")).unwrap();
        let opts: Vec<CString> = [format!("--gpu-architecture={arch}"), "--fmad=false".into(), "--std=c++17".into()]
            .into_iter()
            .map(|s| CString::new(s).unwrap())
            .collect();
        let optp: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: NVRTC's calls on a program it made, with NUL-terminated strings and buffers of
        // the sizes it gave.
        unsafe {
            let mut prog = std::ptr::null_mut();
            assert_eq!((self.create)(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()), 0);
            let r = (self.compile)(prog, optp.len() as c_int, optp.as_ptr());
            let out = if r == 0 {
                let mut n = 0usize;
                assert_eq!((self.ptx_size)(prog, &mut n), 0);
                let mut out = vec![0 as c_char; n.max(1)];
                assert_eq!((self.ptx)(prog, out.as_mut_ptr()), 0);
                Ok(CStr::from_ptr(out.as_ptr()).to_string_lossy().into_owned())
            } else {
                let mut n = 0usize;
                (self.log_size)(prog, &mut n);
                let mut text = vec![0 as c_char; n.max(1)];
                (self.log)(prog, text.as_mut_ptr());
                Err(CStr::from_ptr(text.as_ptr()).to_string_lossy().into_owned())
            };
            (self.destroy)(&mut prog);
            out
        }
    }
}
