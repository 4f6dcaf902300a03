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

use half::{bf16, f16};
use nx_kernels::cuda::codegen::{self, Args, Kernel, MapSig, MAX_OPERANDS, PRELUDE};
use nx_kernels::prog::{BinOp, CmpOp, Prog, UnOp};
use nx_kernels::{Answer, Array, Dtype, Element, Host, Kernels, Move, Operand, MAX_RANK};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

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

/// The values a test array of dtype `d` holds at index `k`: special values first, then a spread.
fn value(d: Dtype, k: usize) -> f64 {
    let specials = [0.0, -0.0, 1.0, -1.0, 0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 65504.0, 1e-7, 3.0, -2.5];
    let x = if k < specials.len() { specials[k] } else { ((k * 7919) % 1013) as f64 * 0.37 - 150.0 };
    match d {
        Dtype::Bool => f64::from(u8::from(k % 3 == 1)),
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => {
            let ext = [0.0, -1.0, 1.0, 127.0, -128.0, 32767.0, -32768.0, 2147483647.0, -2147483648.0];
            if k < ext.len() && d.size() >= 4 || k < 5 {
                ext[k]
            } else {
                ((k * 7919) % 2001) as f64 - 1000.0
            }
        }
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => {
            if k < 3 {
                [0.0, 255.0, 1.0][k]
            } else {
                ((k * 7919) % 4001) as f64
            }
        }
        _ => x,
    }
}

/// A load: the view the kernel reads, the array whose memory it views, and that memory's address.
type TestOperand = (Box<dyn Operand>, Box<dyn Operand>, *mut u8);

/// An array of `shape` of dtype `d` laid out as `kind` asks: `0` C-contiguous, `1` strided (the
/// last axis every other element, the first flipped), `2` broadcast along the first axis. Answers
/// the array and the base array whose memory it views.
fn operand(d: Dtype, shape: &[usize], kind: u8) -> TestOperand {
    macro_rules! go {
        ($t:ty) => {{
            let conv = |x: f64| <$t as Element>::from_value(nx_kernels::Value::Float(x));
            let r = shape.len();
            let (base_shape, view): (Vec<usize>, Box<dyn Fn(&Array<$t>) -> Array<$t>>) = match kind {
                0 => (shape.to_vec(), Box::new(|a: &Array<$t>| a.clone())),
                1 => {
                    let mut b = shape.to_vec();
                    b[r - 1] = 2 * b[r - 1] + 1;
                    (
                        b,
                        Box::new(move |a: &Array<$t>| {
                            let v = a
                                .apply(&Move::Slice { axis: r - 1, start: Some(1), stop: None, step: 2 })
                                .unwrap()
                                .unwrap();
                            v.apply(&Move::Flip(0)).unwrap().unwrap()
                        }),
                    )
                }
                _ => {
                    let mut b = shape.to_vec();
                    b[0] = 1;
                    let full = shape.to_vec();
                    (b, Box::new(move |a: &Array<$t>| a.apply(&Move::Expand(full.clone())).unwrap().unwrap()))
                }
            };
            let n: usize = base_shape.iter().product();
            let base = Array::<$t>::from_vec(DEV, &base_shape, (0..n).map(|k| conv(value(d, k))).collect()).unwrap();
            let ptr = base.with_slice(|s| s.as_ptr() as *mut u8).unwrap();
            let v = view(&base);
            (Box::new(v) as Box<dyn Operand>, Box::new(base) as Box<dyn Operand>, ptr)
        }};
    }
    match d {
        Dtype::Bool => go!(bool),
        Dtype::I8 => go!(i8),
        Dtype::I16 => go!(i16),
        Dtype::I32 => go!(i32),
        Dtype::I64 => go!(i64),
        Dtype::U8 => go!(u8),
        Dtype::U16 => go!(u16),
        Dtype::U32 => go!(u32),
        Dtype::U64 => go!(u64),
        Dtype::F16 => go!(f16),
        Dtype::BF16 => go!(bf16),
        Dtype::F32 => go!(f32),
        Dtype::F64 => go!(f64),
        d => panic!("no test arrays of {d}"),
    }
}

/// A destination of `shape` and dtype `d`, zeroed, with its address.
fn destination(d: Dtype, shape: &[usize]) -> (Box<dyn Operand>, *mut u8) {
    macro_rules! go {
        ($t:ty) => {{
            let a = Array::<$t>::zeros(DEV, shape).unwrap();
            let p = a.with_slice_mut(|s| s.as_mut_ptr() as *mut u8).unwrap();
            (Box::new(a) as Box<dyn Operand>, p)
        }};
    }
    match d {
        Dtype::Bool => go!(bool),
        Dtype::I8 => go!(i8),
        Dtype::I16 => go!(i16),
        Dtype::I32 => go!(i32),
        Dtype::I64 => go!(i64),
        Dtype::U8 => go!(u8),
        Dtype::U16 => go!(u16),
        Dtype::U32 => go!(u32),
        Dtype::U64 => go!(u64),
        Dtype::F16 => go!(f16),
        Dtype::BF16 => go!(bf16),
        Dtype::F32 => go!(f32),
        Dtype::F64 => go!(f64),
        d => panic!("no destinations of {d}"),
    }
}

/// The bytes of a C-contiguous destination.
fn bytes(o: &dyn Operand, p: *mut u8) -> Vec<u8> {
    let n = o.layout().numel() * o.dtype().size();
    // SAFETY: the destination's own memory, C-contiguous from its start, alive in the caller.
    unsafe { std::slice::from_raw_parts(p, n).to_vec() }
}

struct Case {
    what: String,
    prog: Prog,
    dsts: Vec<Dtype>,
    /// Each load's layout kind (see [`operand`]).
    kinds: Vec<u8>,
}

/// Every case of the suite.
fn suite() -> Vec<Case> {
    use Dtype::*;
    let mut cases = Vec::new();
    let mut add = |what: String, prog: Prog, dsts: Vec<Dtype>, kinds: Vec<u8>| {
        cases.push(Case { what, prog, dsts, kinds });
    };
    let unaries = [
        UnOp::Neg,
        UnOp::Abs,
        UnOp::Exp,
        UnOp::Log,
        UnOp::Sqrt,
        UnOp::Rsqrt,
        UnOp::Tanh,
        UnOp::Sigmoid,
        UnOp::Sin,
        UnOp::Cos,
        UnOp::Erf,
        UnOp::Recip,
        UnOp::Floor,
        UnOp::Ceil,
    ];
    for d in [F32, F64, BF16, F16] {
        for op in unaries {
            let mut p = Prog::new(&[d]);
            let x = p.load(0);
            let y = p.unary(op, x);
            p.output(y);
            add(format!("{op:?} of {d}"), p, vec![d], vec![1]);
        }
    }
    for d in [I32, I64, U8, U64] {
        for op in [UnOp::Neg, UnOp::Abs, UnOp::Not, UnOp::Floor] {
            let mut p = Prog::new(&[d]);
            let x = p.load(0);
            let y = p.unary(op, x);
            p.output(y);
            add(format!("{op:?} of {d}"), p, vec![d], vec![0]);
        }
    }
    let mut p = Prog::new(&[Bool]);
    let x = p.load(0);
    let y = p.unary(UnOp::Not, x);
    p.output(y);
    add("Not of bool".into(), p, vec![Bool], vec![2]);
    let binaries = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Pow, BinOp::Max, BinOp::Min];
    for (a, b) in [(F32, F32), (F64, F64), (BF16, F32), (I32, I64), (U8, U64), (I16, I16), (U32, U32)] {
        for op in binaries {
            let mut p = Prog::new(&[a, b]);
            let (x, y) = (p.load(0), p.load(1));
            let z = p.binary(op, x, y);
            p.output(z);
            let out = if a == BF16 { F32 } else { b };
            add(format!("{op:?} of {a} and {b}"), p, vec![out], vec![0, 1]);
        }
    }
    for op in [BinOp::Max, BinOp::Min] {
        let mut p = Prog::new(&[Bool, Bool]);
        let (x, y) = (p.load(0), p.load(1));
        let z = p.binary(op, x, y);
        p.output(z);
        add(format!("{op:?} of bools"), p, vec![Bool], vec![0, 2]);
    }
    for d in [F32, F64, I64, U16, Bool] {
        for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            let mut p = Prog::new(&[d, d]);
            let (x, y) = (p.load(0), p.load(1));
            let z = p.compare(op, x, y);
            let s = p.select(z, x, y);
            p.output(z);
            p.output(s);
            add(format!("{op:?} of {d}, and a selection"), p, vec![Bool, d], vec![1, 2]);
        }
    }
    let all = [Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64];
    for from in all {
        for to in all {
            // stored as `to` (the store's conversion), and cast to `to` then stored as f64 (the
            // cast's held value, exactly)
            let mut p = Prog::new(&[from]);
            let x = p.load(0);
            let c = p.cast(x, to);
            let w = p.cast(c, F64);
            p.output(x);
            p.output(w);
            add(format!("{from} to {to}"), p, vec![to, F64], vec![1]);
        }
    }
    // coordinates and weak constants
    let mut p = Prog::new(&[F32]);
    let (x, i, j) = (p.load(0), p.coord(0), p.coord(1));
    let ij = p.mul(i, j);
    let k = p.int(3);
    let ijk = p.add(ij, k);
    let f = p.cast(ijk, F32);
    let h = p.float(2.5);
    let xh = p.mul(x, h);
    let z = p.add(xh, f);
    p.output(z);
    p.output(ijk);
    add("coordinates and weak constants".into(), p, vec![F32, I32], vec![2]);
    // a fused chain over halves: y = gelu-like(x·w + b) in f32, stored as bf16 and f16
    let mut p = Prog::new(&[BF16, BF16, F16]);
    let (x, w, b) = (p.load(0), p.load(1), p.load(2));
    let xw = p.mul(x, w);
    let bf = p.cast(b, F32);
    let s = p.add(xw, bf);
    let t = p.unary(UnOp::Tanh, s);
    let one = p.float(1.0);
    let t1 = p.add(t, one);
    let half = p.float(0.5);
    let g = p.mul(s, t1);
    let y = p.mul(g, half);
    p.output(y);
    p.output(y);
    add("a fused chain over halves".into(), p, vec![BF16, F16], vec![0, 2, 1]);
    cases
}

/// The generated kernel of `case` over `loads`' layouts and `dsts` (all C-contiguous).
fn kernel(case: &Case, loads: &[&dyn Operand], shape: &[usize]) -> Kernel {
    let ld: Vec<Dtype> = loads.iter().map(|l| l.dtype()).collect();
    let mut contiguous = vec![true; case.dsts.len()];
    contiguous.extend(loads.iter().map(|l| {
        let w = l.layout().apply(&Move::Expand(shape.to_vec())).unwrap().unwrap();
        w.is_contiguous() && w.is_distinct()
    }));
    codegen::map(&MapSig { prog: &case.prog, dsts: &case.dsts, loads: &ld, contiguous: &contiguous })
        .unwrap_or_else(|e| panic!("{}: {e}", case.what))
}

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
    let path = std::env::var("NX_NVRTC").ok()?;
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
