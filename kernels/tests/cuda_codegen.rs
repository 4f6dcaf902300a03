//! The CUDA kernels nx generates for maps (`nx_kernels::cuda::codegen`), run on this machine: every
//! kernel of a suite — each unary and binary op of every type, comparisons, selections, every cast
//! and store between the supported dtypes, coordinates, weak constants, fused chains over halves —
//! is built by the host's C++ compiler with CUDA's built-ins (`blockIdx`, `threadIdx`, the bit
//! casts) defined by a few lines, and launched over emulated blocks and threads on contiguous,
//! strided and broadcast operands holding special values; each result must be the host library's
//! bit for bit (the same libm, no contraction). Where NVRTC is installed (`NX_NVRTC` names the
//! library, as `scripts/test` installs it from PyPI), every kernel is also compiled to PTX for
//! `sm_80` and `sm_90`.

use nx_kernels::dl::Library;

use nx_kernels::cuda::codegen::{Args, Kernel, MAX_OPERANDS, PRELUDE};
use nx_kernels::{Answer, Host, Kernels, Move, Operand, MAX_RANK};

#[path = "common/cuda_suite.rs"]
mod cuda_suite;
#[path = "common/emulate.rs"]
mod emulate;

use cuda_suite::{bytes, destination, kernel, operand, suite, TestOperand};
use emulate::{build_cpp, Nvrtc, SHIM};

/// Builds `kernels` (each with an emulated launch `emu_<name>`) into one library with the host's
/// C++ compiler; answers its handle.
fn build(kernels: &[Kernel]) -> Library {
    let mut src = format!("{SHIM}\n{PRELUDE}\n");
    let mut seen = std::collections::HashSet::new();
    for k in kernels.iter().filter(|k| seen.insert(k.name.clone())) {
        src += &k.body;
        src += &format!(
            "extern \"C\" void emu_{n}(const NxArgs *a, unsigned blocks, unsigned threads) {{\n    gridDim.x = blocks; blockDim.x = threads;\n    for (unsigned b = 0; b < blocks; ++b) for (unsigned t = 0; t < threads; ++t) {{ blockIdx.x = b; threadIdx.x = t; {n}(*a); }}\n}}\n",
            n = k.name
        );
    }
    build_cpp("emu", &src)
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

#[test]
fn generated_maps_compile_with_nvrtc_for_sm80_and_sm90() {
    let Some(nvrtc) = Nvrtc::from_env() else {
        println!("SKIPPED: NX_NVRTC is not set (scripts/test sets it where NVRTC installs from PyPI)");
        return;
    };
    let shape = [5usize, 13];
    let mut compiled = 0;
    for c in suite() {
        let loads: Vec<_> =
            c.prog.load_dtypes().iter().zip(&c.kinds).map(|(&d, &kind)| operand(d, &shape, kind)).collect();
        let lr: Vec<&dyn Operand> = loads.iter().map(|l| &*l.0).collect();
        let k = kernel(&c, &lr, &shape);
        for arch in ["compute_80", "compute_90"] {
            let ptx = nvrtc
                .ptx(&k.source(), &k.name, arch)
                .unwrap_or_else(|log| panic!("{} ({arch}): NVRTC failed:\n{log}\n{}", c.what, k.source()));
            assert!(ptx.contains(&format!(".entry {}", k.name)), "{}: no entry in the PTX", c.what);
            compiled += 1;
        }
    }
    println!("NVRTC compiled {compiled} kernels (sm_80 and sm_90)");
}
