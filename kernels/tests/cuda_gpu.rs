//! The generated maps and reductions on a GPU (`nx_kernels::cuda::Gpu`, feature `cuda`): every
//! kernel of the shared suites compiled by NVRTC for the GPU's architecture and launched on device
//! copies of the suites' operands (contiguous, strided and broadcast, special values), each result
//! against the host library's: bit for bit where nx fixes the bits (arithmetic, comparisons,
//! selections, casts, halves, and every reduction but a log-sum-exp, in the host's association),
//! within the GPU's documented ulps for its transcendental functions. Without a GPU (or its
//! driver, or NVRTC) it says so in one line and checks only that the refusal is an error, not a
//! panic.

#[path = "common/cuda_suite.rs"]
mod cuda_suite;
#[path = "common/reduce_suite.rs"]
mod reduce_suite;

use cuda_suite::{bytes, destination, kernel, operand, suite};
use nx_kernels::cuda::codegen::{Args, MAX_OPERANDS};
use nx_kernels::cuda::Gpu;
use nx_kernels::{Answer, Dtype, Host, Kernels, Move, Operand, Reduction, MAX_RANK};

/// The functions the GPU computes to its own ulps, not the host libm's bits.
const TRANSCENDENTAL: [&str; 9] = ["Exp", "Log", "Tanh", "Sigmoid", "Sin", "Cos", "Erf", "Pow", "fused chain"];

/// Whether `a` and `b` (little-endian elements of `d`) agree within `ulps` units in the last
/// place, or are both NaN.
fn close(d: Dtype, a: &[u8], b: &[u8], ulps: i64) -> bool {
    let ord = |x: i64, bits: u32| if x >> (bits - 1) & 1 == 1 { (1i64 << (bits - 1)) - 1 - x } else { x };
    match d {
        Dtype::F32 => {
            let (x, y) = (f32::from_le_bytes(a.try_into().unwrap()), f32::from_le_bytes(b.try_into().unwrap()));
            (x.is_nan() && y.is_nan())
                || (ord(i64::from(x.to_bits()), 32) - ord(i64::from(y.to_bits()), 32)).abs() <= ulps
        }
        Dtype::F64 => {
            let (x, y) = (f64::from_le_bytes(a.try_into().unwrap()), f64::from_le_bytes(b.try_into().unwrap()));
            (x.is_nan() && y.is_nan()) || (x.to_bits() as i64).abs_diff(y.to_bits() as i64) <= ulps as u64
        }
        Dtype::BF16 | Dtype::F16 => {
            let (x, y) = (u16::from_le_bytes(a.try_into().unwrap()), u16::from_le_bytes(b.try_into().unwrap()));
            (ord(i64::from(x), 16) - ord(i64::from(y), 16)).abs() <= 1
        }
        _ => a == b,
    }
}

#[test]
fn generated_maps_run_on_the_gpu_as_on_the_host() {
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(why) => {
            println!("SKIPPED: no GPU to run the generated kernels on: {why}");
            assert!(
                why.contains("no CUDA driver") || why.contains("no NVRTC") || why.contains("nx_kernels::cuda::Gpu"),
                "{why}"
            );
            return;
        }
    };
    println!("GPU: {} ({})", gpu.name().unwrap(), gpu.arch());
    let shape = [33usize, 65];
    let n: usize = shape.iter().product();
    let host = Host::new();
    let mut checked = 0;
    for c in suite() {
        let loads: Vec<_> =
            c.prog.load_dtypes().iter().zip(&c.kinds).map(|(&d, &kind)| operand(d, &shape, kind)).collect();
        let lr: Vec<&dyn Operand> = loads.iter().map(|l| &*l.0).collect();
        let dsts: Vec<_> = c.dsts.iter().map(|&d| destination(d, &shape)).collect();
        let dr: Vec<&dyn Operand> = dsts.iter().map(|d| &*d.0).collect();
        assert_eq!(host.map(&c.prog, &shape, &dr, &lr), Answer::Done, "{}", c.what);
        let k = kernel(&c, &lr, &shape);
        // device copies: each load's whole base array (its view's offset and strides kept), each
        // destination fresh
        let dev_loads: Vec<_> = loads
            .iter()
            .map(|l| {
                let len = l.1.layout().numel() * l.1.dtype().size();
                // SAFETY: the base array's own C-contiguous bytes, alive in `loads`.
                gpu.upload(unsafe { std::slice::from_raw_parts(l.2, len) }).unwrap()
            })
            .collect();
        let dev_dsts: Vec<_> =
            dsts.iter().map(|(o, _)| gpu.upload(&vec![0u8; o.layout().numel() * o.dtype().size()]).unwrap()).collect();
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
        let layouts: Vec<nx_kernels::Layout> =
            dr.iter().chain(&lr).map(|o| o.layout().apply(&Move::Expand(shape.to_vec())).unwrap().unwrap()).collect();
        for (k, l) in layouts.iter().enumerate() {
            a.ptr[k] = if k < dev_dsts.len() {
                gpu.address(&dev_dsts[k])
            } else {
                gpu.address(&dev_loads[k - dev_dsts.len()])
            };
            a.offset[k] = l.offset() as i64;
            for (d, &s) in l.strides().iter().enumerate() {
                a.strides[k][d] = s as i64;
            }
        }
        // SAFETY: `a` addresses the device copies above, over the loop they were made for.
        unsafe { gpu.map(&k, &a) }.unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let loose = TRANSCENDENTAL.iter().any(|t| c.what.contains(t));
        for (i, ((o, p), dev)) in dsts.iter().zip(&dev_dsts).enumerate() {
            let (want, got) = (bytes(&**o, *p), gpu.download(dev).unwrap());
            let size = o.dtype().size();
            for e in 0..n {
                let (g, w) = (&got[e * size..(e + 1) * size], &want[e * size..(e + 1) * size]);
                let ok = if loose { close(o.dtype(), g, w, 4) } else { g == w };
                assert!(ok, "{}: output {i} ({}) at {e}: {g:?} on the GPU, {w:?} on the host", c.what, o.dtype());
            }
        }
        checked += 1;
    }
    println!("{checked} generated maps ran on the GPU as on the host");
}

#[test]
fn generated_reductions_run_on_the_gpu_with_the_host_librarys_bits() {
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(why) => {
            println!("SKIPPED: no GPU to run the generated reductions on: {why}");
            return;
        }
    };
    let host = Host::new();
    let mut checked = 0;
    for c in reduce_suite::suite() {
        let p = reduce_suite::prepare(&host, &c);
        let dev_loads: Vec<_> = p
            .loads
            .iter()
            .map(|l| {
                let len = l.1.layout().numel() * l.1.dtype().size();
                // SAFETY: the base array's own C-contiguous bytes, alive in `p.loads`.
                gpu.upload(unsafe { std::slice::from_raw_parts(l.2, len) }).unwrap()
            })
            .collect();
        let outputs = reduce_suite::counts(&c).0;
        let dev_dsts: Vec<_> = c.dsts.iter().map(|d| gpu.zeros(outputs * d.size()).unwrap()).collect();
        let scratch = gpu.zeros(reduce_suite::scratch_bytes(&c)).unwrap();
        let dp: Vec<*mut u8> = dev_dsts.iter().map(|d| gpu.address(d)).collect();
        let lp: Vec<*mut u8> = dev_loads.iter().map(|l| gpu.address(l)).collect();
        let (a, r) = reduce_suite::launch(&c, &p, &dp, &lp, gpu.address(&scratch));
        // SAFETY: `a` and `r` address the device copies, destinations and scratch above.
        unsafe { gpu.reduce(&p.kernels, &a, &r) }.unwrap_or_else(|e| panic!("{}: {e}", c.what));
        // a log-sum-exp's exp and log are the GPU's own, within its ulps; every other kind is
        // the host's association of IEEE operations, so the host's bits
        let loose = c.reductions.iter().any(|r| matches!(r, Reduction::Logsumexp));
        for (i, (dev, want)) in dev_dsts.iter().zip(&p.want).enumerate() {
            let got = gpu.download(dev).unwrap();
            let size = c.dsts[i].size();
            for e in 0..outputs {
                let (g, w) = (&got[e * size..(e + 1) * size], &want[e * size..(e + 1) * size]);
                let ok = if loose { close(c.dsts[i], g, w, 4) } else { g == w };
                assert!(ok, "{}: destination {i} at output {e}: {g:?} on the GPU, {w:?} on the host", c.what);
            }
        }
        checked += 1;
    }
    println!("{checked} generated reductions ran on the GPU with the host's bits");
}
