//! The reduction suite the CUDA tests share: every kind of every term type, the host library's
//! results, and each case's generated kernels and launch.

#![allow(dead_code)] // each test file uses part of the suite

use crate::cuda_suite::{bytes, destination, operand, TestOperand};
use nx_kernels::cuda::codegen::{Args, MAX_OPERANDS};
use nx_kernels::cuda::reduce_gen::{self, ReduceArgs, ReduceKernels, ReduceSig, CHUNK, PART_BYTES};
use nx_kernels::prog::Prog;
use nx_kernels::{Answer, Dtype, Extreme, Host, Kernels, Layout, Move, Operand, Reduction, MAX_RANK};

/// A reduction of the suite: its program, reductions, destination dtypes, loop shape, reduced
/// axes, and the kind of operands it loads (as `cuda_suite::operand`'s).
pub struct Case {
    pub what: String,
    pub prog: Prog,
    pub reductions: Vec<Reduction>,
    pub dsts: Vec<Dtype>,
    pub shape: Vec<usize>,
    pub axes: Vec<usize>,
    pub kind: u8,
}

/// Every kind of every term type over the last, the first and several axes, past one chunk,
/// none, coordinates, and chunks of very different sizes.
pub fn suite() -> Vec<Case> {
    use Dtype::*;
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[3, 2 * CHUNK + 37], &[1]),
        (&[CHUNK + 5, 2], &[0]),
        (&[3, 4, 700], &[0, 2]),
        (&[4, 0], &[1]),
        (&[5, 9], &[0, 1]),
    ];
    let mut cases = Vec::new();
    for (d, kinds) in [
        (
            F32,
            vec![
                Reduction::Sum,
                Reduction::Prod,
                Reduction::Max,
                Reduction::Min,
                Reduction::Logsumexp,
                Reduction::Moments,
            ],
        ),
        (F64, vec![Reduction::Sum, Reduction::Max, Reduction::Logsumexp, Reduction::Moments]),
        (BF16, vec![Reduction::Sum, Reduction::Min, Reduction::Logsumexp]),
        (I32, vec![Reduction::Sum, Reduction::Prod, Reduction::Max, Reduction::Min]),
        (U8, vec![Reduction::Sum, Reduction::Max]),
        (Bool, vec![Reduction::Max, Reduction::Min]),
    ] {
        for r in kinds.into_iter().chain([Reduction::Arg(Extreme::Max), Reduction::Arg(Extreme::Min)]) {
            for (si, (shape, axes)) in shapes.iter().enumerate() {
                if matches!(r, Reduction::Arg(_)) && shape.contains(&0) {
                    continue; // an Arg of no term is refused
                }
                let mut p = Prog::new(&[d]);
                let x = p.load(0);
                p.output(x);
                let out = d;
                let dsts = match r {
                    Reduction::Arg(_) => vec![out, I64],
                    Reduction::Moments => vec![out, out],
                    _ => vec![out],
                };
                cases.push(Case {
                    what: format!("{r:?} of {d} over {axes:?} of {shape:?}"),
                    prog: p,
                    reductions: vec![r],
                    dsts,
                    shape: shape.to_vec(),
                    axes: axes.to_vec(),
                    kind: (si % 3) as u8,
                });
            }
        }
    }
    // chunk partials of very different sizes, so that another association of the chunks rounds
    // otherwise: chunk 0 holds 2²⁴ a term, the others 1 and 0.5 by turns (in f32, 2³⁵ + 1536 and
    // 2³⁵ + 3072 round apart)
    let mut q = Prog::new(&[F32]);
    let j = q.coord(1);
    let c = q.int(CHUNK as i64);
    let early = q.compare(nx_kernels::prog::CmpOp::Lt, j, c);
    let two = q.int(2);
    let half = q.div(j, two);
    let twice = q.mul(half, two);
    let odd = q.compare(nx_kernels::prog::CmpOp::Ne, twice, j);
    let (big, one, h) = (
        q.constant(16_777_216.0, nx_kernels::prog::Ty::F32),
        q.constant(1.0, nx_kernels::prog::Ty::F32),
        q.constant(0.5, nx_kernels::prog::Ty::F32),
    );
    let small = q.select(odd, h, one);
    let y = q.select(early, big, small);
    q.output(y);
    cases.push(Case {
        what: "a sum of chunks of very different sizes".into(),
        prog: q,
        reductions: vec![Reduction::Sum],
        dsts: vec![F32],
        shape: vec![2, 4 * CHUNK + 9],
        axes: vec![1],
        kind: 0,
    });
    // two reductions of one program reading coordinates: a sum and a max of x·(i + 1) − j
    let mut p = Prog::new(&[F32]);
    let (x, i, j) = (p.load(0), p.coord(0), p.coord(2));
    let one = p.int(1);
    let i1 = p.add(i, one);
    let f = p.cast(i1, F32);
    let xf = p.mul(x, f);
    let jf = p.cast(j, F32);
    let y = p.sub(xf, jf);
    p.output(y);
    p.output(y);
    cases.push(Case {
        what: "a sum and a max of a program of coordinates".into(),
        prog: p,
        reductions: vec![Reduction::Sum, Reduction::Max],
        dsts: vec![F32, F32],
        shape: vec![3, 4, 1500],
        axes: vec![1, 2],
        kind: 1,
    });
    cases
}

/// The host's loop order: kept axes, then reduced ones.
pub fn perm(rank: usize, axes: &[usize]) -> Vec<usize> {
    (0..rank).filter(|a| !axes.contains(a)).chain(axes.iter().copied()).collect()
}

/// A case run by the host library, and what its launch needs: its loads, their layouts over the
/// loop in the host's order, the host's destinations' bytes, and the kept shape.
pub struct Prepared {
    pub loads: Vec<TestOperand>,
    pub layouts: Vec<Layout>,
    pub want: Vec<Vec<u8>>,
    pub kept: Vec<usize>,
    pub kernels: ReduceKernels,
}

/// Runs `c` on the host library and generates its kernels.
pub fn prepare(host: &Host, c: &Case) -> Prepared {
    let loads: Vec<_> = c.prog.load_dtypes().iter().map(|&d| operand(d, &c.shape, c.kind)).collect();
    let lr: Vec<&dyn Operand> = loads.iter().map(|l| &*l.0).collect();
    let kept: Vec<usize> = (0..c.shape.len()).filter(|a| !c.axes.contains(a)).map(|a| c.shape[a]).collect();
    let dsts: Vec<_> = c.dsts.iter().map(|&d| destination(d, &kept)).collect();
    let dr: Vec<&dyn Operand> = dsts.iter().map(|d| &*d.0).collect();
    assert_eq!(host.reduce(&c.prog, &c.shape, &c.axes, &c.reductions, &dr, &lr), Answer::Done, "{}", c.what);
    let want: Vec<Vec<u8>> = dsts.iter().map(|(o, p)| bytes(&**o, *p)).collect();
    // each load's layout over the loop in the host's order, and whether it runs contiguous there
    let pm = perm(c.shape.len(), &c.axes);
    let layouts: Vec<Layout> = lr
        .iter()
        .map(|l| {
            let w = l.layout().apply(&Move::Expand(c.shape.clone())).unwrap().unwrap();
            w.apply(&Move::Permute(pm.clone())).unwrap().unwrap()
        })
        .collect();
    let contiguous: Vec<bool> = layouts.iter().map(|l| l.is_contiguous() && l.is_distinct()).collect();
    let kernels = kernels(c, &contiguous);
    Prepared { loads, layouts, want, kept, kernels }
}

/// The kernels of `c`, its loads contiguous in the host's loop order as `contiguous` says.
pub fn kernels(c: &Case, contiguous: &[bool]) -> ReduceKernels {
    let sig =
        ReduceSig { prog: &c.prog, reductions: &c.reductions, dsts: &c.dsts, loads: c.prog.load_dtypes(), contiguous };
    reduce_gen::reduce(&sig).unwrap_or_else(|e| panic!("{}: {e}", c.what))
}

/// Outputs, terms an output, and chunks an output of `c`.
pub fn counts(c: &Case) -> (usize, usize, usize) {
    let outputs: usize = (0..c.shape.len()).filter(|a| !c.axes.contains(a)).map(|a| c.shape[a]).product();
    let terms: usize = c.axes.iter().map(|&a| c.shape[a]).product();
    (outputs, terms, terms.div_ceil(CHUNK))
}

/// Bytes of `c`'s scratch.
pub fn scratch_bytes(c: &Case) -> usize {
    let (outputs, _, chunks) = counts(c);
    (outputs * chunks * c.reductions.len()).max(1) * PART_BYTES
}

/// The launch of `c`: destinations at `dsts` (C-contiguous, offset 0), each load's base array at
/// `loads` (its layout from `p`), the partials at `scratch`.
pub fn launch(c: &Case, p: &Prepared, dsts: &[*mut u8], loads: &[*mut u8], scratch: *mut u8) -> (Args, ReduceArgs) {
    let pm = perm(c.shape.len(), &c.axes);
    let (outputs, terms, chunks) = counts(c);
    let mut a = Args {
        n: (outputs * terms) as i64,
        rank: c.shape.len() as i64,
        shape: [0; MAX_RANK],
        ptr: [std::ptr::null_mut(); MAX_OPERANDS],
        offset: [0; MAX_OPERANDS],
        strides: [[0; MAX_RANK]; MAX_OPERANDS],
    };
    for (k, &ax) in pm.iter().enumerate() {
        a.shape[k] = c.shape[ax] as i64;
    }
    for (k, &d) in dsts.iter().enumerate() {
        a.ptr[k] = d;
    }
    for (j, (&l, lay)) in loads.iter().zip(&p.layouts).enumerate() {
        let k = dsts.len() + j;
        a.ptr[k] = l;
        a.offset[k] = lay.offset() as i64;
        for (d, &s) in lay.strides().iter().enumerate() {
            a.strides[k][d] = s as i64;
        }
    }
    let mut r = ReduceArgs {
        outputs: outputs as i64,
        terms: terms as i64,
        chunks: chunks as i64,
        axis_of: [0; MAX_RANK],
        scratch,
    };
    for (k, &ax) in pm.iter().enumerate() {
        r.axis_of[ax] = k as i64;
    }
    (a, r)
}
