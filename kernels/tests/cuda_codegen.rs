//! The CUDA kernels nx generates for maps (`nx_kernels::cuda::codegen`), run on this machine: every
//! kernel of a suite — each unary and binary op of every type, comparisons, selections, every cast
//! and store between the supported dtypes, coordinates, weak constants, fused chains over halves —
//! is built by the host's C++ compiler with CUDA's built-ins (`blockIdx`, `threadIdx`, the bit
//! casts) defined by a few lines, and launched over emulated blocks and threads on contiguous,
//! strided and broadcast operands holding special values; each result must be the host library's
//! bit for bit (the same libm, no contraction). Where NVRTC is installed (`NX_NVRTC` names the
//! library, as `scripts/test` installs it from PyPI), every kernel is also compiled to PTX for
//! `sm_80` and `sm_90`.

use std::ffi::{c_char, c_int, c_void, CString};

use nx_kernels::dl::Library;

use nx_kernels::cuda::codegen::{Args, Kernel, MAX_OPERANDS, PRELUDE};
use nx_kernels::{Answer, Host, Kernels, Move, Operand, MAX_RANK};

#[path = "common/cuda_suite.rs"]
mod cuda_suite;

use cuda_suite::{bytes, destination, kernel, operand, suite, TestOperand};

/// CUDA's built-ins for the host's C++ compiler: one emulated thread at a time.
const SHIM: &str = r#"
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

/// Builds `kernels` (each with an emulated launch `emu_<name>`) into one library with the host's
/// C++ compiler; answers its handle.
fn build(kernels: &[Kernel]) -> Library {
    let dir = std::env::temp_dir().join(format!("nx-cuda-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = format!("{SHIM}\n{PRELUDE}\n");
    for k in kernels {
        src += &k.body;
        src += &format!(
            "extern \"C\" void emu_{n}(const NxArgs *a, unsigned blocks, unsigned threads) {{\n    gridDim.x = blocks; blockDim.x = threads;\n    for (unsigned b = 0; b < blocks; ++b) for (unsigned t = 0; t < threads; ++t) {{ blockIdx.x = b; threadIdx.x = t; {n}(*a); }}\n}}\n",
            n = k.name
        );
    }
    let (cpp, so) = (dir.join("kernels.cpp"), dir.join("kernels.so"));
    std::fs::write(&cpp, &src).unwrap();
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

type Emu = unsafe extern "C" fn(*const Args, u32, u32);

#[test]
fn generated_maps_compute_the_host_librarys_bits() {
    let shape = [5usize, 13];
    let n: usize = shape.iter().product();
    let cases = suite();
    assert!(cases.len() > 250, "{} cases", cases.len());
    // every case's operands, its kernel, and the host's results
    struct Run {
        loads: Vec<TestOperand>,
        kernel: Kernel,
        want: Vec<Vec<u8>>,
    }
    let host = Host::new();
    let runs: Vec<Run> = cases
        .iter()
        .map(|c| {
            let loads: Vec<_> =
                c.prog.load_dtypes().iter().zip(&c.kinds).map(|(&d, &kind)| operand(d, &shape, kind)).collect();
            let lr: Vec<&dyn Operand> = loads.iter().map(|l| &*l.0).collect();
            let dsts: Vec<_> = c.dsts.iter().map(|&d| destination(d, &shape)).collect();
            let dr: Vec<&dyn Operand> = dsts.iter().map(|d| &*d.0).collect();
            assert_eq!(host.map(&c.prog, &shape, &dr, &lr), Answer::Done, "{}", c.what);
            let want = dsts.iter().map(|(o, p)| bytes(&**o, *p)).collect();
            Run { kernel: kernel(c, &lr, &shape), loads, want }
        })
        .collect();
    let lib = build(&runs.iter().map(|r| r.kernel.clone()).collect::<Vec<_>>());
    for (c, r) in cases.iter().zip(&runs) {
        let dsts: Vec<_> = c.dsts.iter().map(|&d| destination(d, &shape)).collect();
        let mut a = Args {
            n: n as i64,
            rank: shape.len() as i64,
            shape: [0; MAX_RANK],
            ptr: [std::ptr::null_mut(); MAX_OPERANDS],
            offset: [0; MAX_OPERANDS],
            strides: [[0; MAX_RANK]; MAX_OPERANDS],
        };
        for (d, &e) in shape.iter().enumerate() {
            a.shape[d] = e as i64;
        }
        let operands: Vec<(&dyn Operand, *mut u8)> =
            dsts.iter().map(|(o, p)| (&**o, *p)).chain(r.loads.iter().map(|l| (&*l.0, l.2))).collect();
        for (k, (o, p)) in operands.iter().enumerate() {
            let l = o.layout().apply(&Move::Expand(shape.to_vec())).unwrap().unwrap();
            a.ptr[k] = *p;
            a.offset[k] = l.offset() as i64;
            for (d, &s) in l.strides().iter().enumerate() {
                a.strides[k][d] = s as i64;
            }
        }
        // SAFETY: the library's emulated launch of this kernel is of type `Emu`; `a` addresses this
        // case's live operands over the loop (the destinations C-contiguous and fresh).
        unsafe {
            let f: Emu = lib.get(&format!("emu_{}", r.kernel.name)).unwrap();
            f(&a, 3, 7);
        }
        for (i, ((o, p), want)) in dsts.iter().zip(&r.want).enumerate() {
            let got = bytes(&**o, *p);
            let size = o.dtype().size();
            if let Some(e) = (0..n).find(|&e| got[e * size..(e + 1) * size] != want[e * size..(e + 1) * size]) {
                panic!(
                    "{}: output {i} ({}) differs from the host's at element {e}: {:?} against {:?}\n{}",
                    c.what,
                    o.dtype(),
                    &got[e * size..(e + 1) * size],
                    &want[e * size..(e + 1) * size],
                    r.kernel.body
                );
            }
        }
    }
}

/// The NVRTC library `NX_NVRTC` names, or `None` (the test then says so and checks nothing).
fn nvrtc() -> Option<Library> {
    let path = std::env::var("NX_NVRTC").ok().filter(|p| !p.is_empty())?;
    Some(Library::open(&path).unwrap_or_else(|e| panic!("NX_NVRTC: {e}")))
}

#[test]
fn generated_maps_compile_with_nvrtc_for_sm80_and_sm90() {
    let Some(lib) = nvrtc() else {
        println!("SKIPPED: NX_NVRTC is not set (scripts/test sets it where NVRTC installs from PyPI)");
        return;
    };
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
    // SAFETY: NVRTC's own signatures, as nvrtc.h declares them.
    let (create, compile, ptx_size, ptx, log_size, log, destroy): (Create, Compile, Size, Get, Size, Get, Destroy) = unsafe {
        (
            lib.get("nvrtcCreateProgram").unwrap(),
            lib.get("nvrtcCompileProgram").unwrap(),
            lib.get("nvrtcGetPTXSize").unwrap(),
            lib.get("nvrtcGetPTX").unwrap(),
            lib.get("nvrtcGetProgramLogSize").unwrap(),
            lib.get("nvrtcGetProgramLog").unwrap(),
            lib.get("nvrtcDestroyProgram").unwrap(),
        )
    };
    let shape = [5usize, 13];
    let mut compiled = 0;
    for c in suite() {
        let loads: Vec<_> =
            c.prog.load_dtypes().iter().zip(&c.kinds).map(|(&d, &kind)| operand(d, &shape, kind)).collect();
        let lr: Vec<&dyn Operand> = loads.iter().map(|l| &*l.0).collect();
        let k = kernel(&c, &lr, &shape);
        let src = CString::new(k.source()).unwrap();
        let name = CString::new(format!("{}.cu", k.name)).unwrap();
        for arch in ["--gpu-architecture=compute_80", "--gpu-architecture=compute_90"] {
            let opts: Vec<CString> =
                [arch, "--fmad=false", "--std=c++17"].iter().map(|s| CString::new(*s).unwrap()).collect();
            let optp: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
            // SAFETY: NVRTC's calls on a program it made, with NUL-terminated strings and buffers of
            // the sizes it gave.
            unsafe {
                let mut prog = std::ptr::null_mut();
                assert_eq!(create(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()), 0);
                let r = compile(prog, optp.len() as c_int, optp.as_ptr());
                let mut n = 0usize;
                log_size(prog, &mut n);
                let mut text = vec![0 as c_char; n.max(1)];
                log(prog, text.as_mut_ptr());
                let text = std::ffi::CStr::from_ptr(text.as_ptr()).to_string_lossy().into_owned();
                assert_eq!(r, 0, "{} ({arch}): NVRTC failed:\n{text}\n{}", c.what, k.source());
                let mut n = 0usize;
                assert_eq!(ptx_size(prog, &mut n), 0);
                let mut out = vec![0 as c_char; n];
                assert_eq!(ptx(prog, out.as_mut_ptr()), 0);
                let out = std::ffi::CStr::from_ptr(out.as_ptr()).to_string_lossy().into_owned();
                assert!(out.contains(&format!(".entry {}", k.name)), "{}: no entry in the PTX", c.what);
                destroy(&mut prog);
            }
            compiled += 1;
        }
    }
    println!("NVRTC compiled {compiled} kernels (sm_80 and sm_90)");
}
