//! The CUDA reductions nx generates (`nx_kernels::cuda::reduce_gen`) in the host library's
//! association, run on this machine: every kind (`Sum`, `Prod`, `Max`, `Min`, `Arg`, `Logsumexp`,
//! `Moments`) of every term type it takes, over the last, the first and several axes, with terms
//! past one chunk of 2048 (the pairwise tree of chunks), none, and a program of coordinates; each
//! built with the host's C++ compiler (CUDA's built-ins defined by a few lines), launched over
//! emulated blocks and threads, its results the host library's bit for bit. Where NVRTC is
//! installed (`NX_NVRTC`), every module compiles to PTX for `sm_80` and `sm_90`.

#[path = "common/cuda_suite.rs"]
mod cuda_suite;
#[path = "common/emulate.rs"]
mod emulate;
#[path = "common/reduce_suite.rs"]
mod reduce_suite;

use cuda_suite::{bytes, destination};
use emulate::{build_cpp, Nvrtc, SHIM};
use nx_kernels::cuda::codegen::{Args, PRELUDE};
use nx_kernels::cuda::reduce_gen::{ReduceArgs, ReduceKernels};
use nx_kernels::dl::Library;
use nx_kernels::Host;
use reduce_suite::{counts, kernels, launch, prepare, scratch_bytes, suite};

fn build(modules: &[ReduceKernels]) -> Library {
    let mut src = format!("{SHIM}\n{PRELUDE}\n");
    let mut seen = std::collections::HashSet::new();
    for m in modules.iter().filter(|m| seen.insert(m.chunks.name.clone())) {
        src += &m.chunks.body;
        src += &m.finish.body;
        for k in [&m.chunks, &m.finish] {
            src += &format!(
                "extern \"C\" void emu_{n}(const NxArgs *a, const NxRed *r, unsigned blocks, unsigned threads) {{\n    gridDim.x = blocks; blockDim.x = threads;\n    for (unsigned b = 0; b < blocks; ++b) for (unsigned t = 0; t < threads; ++t) {{ blockIdx.x = b; threadIdx.x = t; {n}(*a, *r); }}\n}}\n",
                n = k.name
            );
        }
    }
    build_cpp("reduce", &src)
}

type Emu = unsafe extern "C" fn(*const Args, *const ReduceArgs, u32, u32);

#[test]
fn generated_reductions_compute_the_host_librarys_bits() {
    let host = Host::new();
    let cases = suite();
    assert!(cases.len() > 150, "{} cases", cases.len());
    let prepared: Vec<_> = cases.iter().map(|c| prepare(&host, c)).collect();
    let modules: Vec<ReduceKernels> = prepared.iter().map(|p| p.kernels.clone()).collect();
    let lib = build(&modules);
    for (c, p) in cases.iter().zip(&prepared) {
        let dsts: Vec<_> = c.dsts.iter().map(|&d| destination(d, &p.kept)).collect();
        let mut scratch = vec![0u8; scratch_bytes(c)];
        let dp: Vec<*mut u8> = dsts.iter().map(|d| d.1).collect();
        let lp: Vec<*mut u8> = p.loads.iter().map(|l| l.2).collect();
        let (a, r) = launch(c, p, &dp, &lp, scratch.as_mut_ptr());
        // SAFETY: the library's emulated launches of this module's kernels, of type `Emu`; `a`
        // and `r` address this case's live operands, destinations and scratch.
        unsafe {
            let f: Emu = lib.get(&format!("emu_{}", p.kernels.chunks.name)).unwrap();
            f(&a, &r, 2, 5);
            let g: Emu = lib.get(&format!("emu_{}", p.kernels.finish.name)).unwrap();
            g(&a, &r, 3, 2);
        }
        let outputs = counts(c).0;
        for (i, ((o, ptr), want)) in dsts.iter().zip(&p.want).enumerate() {
            let got = bytes(&**o, *ptr);
            let size = o.dtype().size();
            if let Some(e) = (0..outputs).find(|&e| got[e * size..(e + 1) * size] != want[e * size..(e + 1) * size]) {
                panic!(
                    "{}: destination {i} ({}) differs from the host's at output {e}: {:?} against {:?}",
                    c.what,
                    o.dtype(),
                    &got[e * size..(e + 1) * size],
                    &want[e * size..(e + 1) * size]
                );
            }
        }
    }
}

#[test]
fn generated_reductions_compile_with_nvrtc_for_sm80_and_sm90() {
    let Some(nvrtc) = Nvrtc::from_env() else {
        println!("SKIPPED: NX_NVRTC is not set (scripts/test sets it where NVRTC installs from PyPI)");
        return;
    };
    let mut n = 0;
    for c in suite() {
        let m = kernels(&c, &vec![true; c.prog.load_dtypes().len()]);
        for arch in ["compute_80", "compute_90"] {
            let ptx = nvrtc
                .ptx(&m.source(), &m.chunks.name, arch)
                .unwrap_or_else(|log| panic!("{} ({arch}): NVRTC failed:\n{log}\n{}", c.what, m.source()));
            assert!(ptx.contains(&format!(".entry {}", m.finish.name)), "{}: no finish in the PTX", c.what);
            n += 1;
        }
    }
    println!("NVRTC compiled {n} reduction modules (sm_80 and sm_90)");
}
