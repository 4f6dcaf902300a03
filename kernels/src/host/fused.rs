//! Maps of float programs evaluated a few lanes at a time: every node of the program over
//! [`LANES`] consecutive indices held in a small array, loads read in place and outputs stored
//! straight from the lanes. The whole program runs over one run of lanes before the next, so the
//! reads and the (streaming) writes of memory interleave as in a hand-fused loop, where the
//! register-at-a-time evaluator of [`super::eval`] runs each node over a block of 2048 before the
//! next. It takes the common case — every live node of one float type (`f32` or `f64`), loads of
//! contiguous operands of that dtype, constants, real unary and binary ops, destinations of that
//! dtype; for `f32` also contiguous bf16 and f16 loads and destinations, widened into the lanes
//! and narrowed from them — and the elementwise functions and conversions are [`super::reg`]'s,
//! so both evaluators give the same bits.

use super::eval::{Bound, Ptr};
use super::reg::{self, real_binary, real_unary};
use crate::prog::{BinOp, Node, Ty, UnOp};
use crate::{Dtype, Simd};

/// Indices evaluated together: 512 bytes of `f32` a node. Measured here (8 interleaved runs, the
/// registers cache-line aligned): the chain `y = a*x + b; z = relu(y)` 0.89 of the copy
/// bandwidth at 128 lanes against 0.84 at 256, `add` alike (0.88, 0.86); 64 lanes made `add`
/// 10–30% slower.
pub(crate) const LANES: usize = 128;

/// The values of one node over one run of lanes.
pub(crate) type Lanes<T> = [T; LANES];

/// A node's lanes as the evaluator keeps them: aligned to a cache line, so that no vector access
/// splits one (the heap's 16-byte alignment made every other 32-byte access a split one).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Slot<T>(Lanes<T>);

/// A float type the fused evaluator runs.
pub(crate) trait Float: Copy + Default + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: Dtype;
    /// Its compute type.
    const TY: Ty;
    /// A constant's value in this type, as [`reg::Reg::fill`] rounds it.
    fn of(re: f64) -> Self;
    /// `o = op a`.
    fn unary(op: UnOp, a: &Lanes<Self>, o: &mut Lanes<Self>);
    /// `o = a op b`.
    fn binary(op: BinOp, a: &Lanes<Self>, b: &Lanes<Self>, o: &mut Lanes<Self>);
    /// `o` = the [`LANES`] halves of kind `h` at `src`, widened as the register evaluator
    /// widens them (`f32` only: a [`Fused`] of another type holds no halves).
    ///
    /// # Safety
    /// `src` addresses [`LANES`] readable, aligned halves.
    unsafe fn widen(h: Half, src: *const u8, o: &mut Lanes<Self>);
    /// `o` = `v` narrowed to halves of kind `h` (bits), as the register evaluator narrows.
    fn narrow(h: Half, v: &Lanes<Self>, o: &mut [u16; LANES]);
}

/// A half-precision dtype the `f32` evaluator reads and writes, widened and narrowed lane by
/// lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    Bf16,
    F16,
}

impl Half {
    fn of(d: Dtype) -> Option<Half> {
        match d {
            Dtype::BF16 => Some(Half::Bf16),
            Dtype::F16 => Some(Half::F16),
            _ => None,
        }
    }
}

macro_rules! lanes1 {
    ($a:expr, $o:expr, $f:expr) => {{
        let f = $f;
        for (o, &x) in $o.iter_mut().zip($a) {
            *o = f(x);
        }
    }};
}

macro_rules! lanes2 {
    ($a:expr, $b:expr, $o:expr, $f:expr) => {{
        let f = $f;
        for ((o, &x), &y) in $o.iter_mut().zip($a).zip($b) {
            *o = f(x, y);
        }
    }};
}

macro_rules! float {
    ($t:ty, $d:ident, $ty:ident; $($halves:tt)*) => {
        impl Float for $t {
            const DTYPE: Dtype = Dtype::$d;
            const TY: Ty = Ty::$ty;
            fn of(re: f64) -> $t {
                re as $t
            }
            #[inline(always)]
            fn unary(op: UnOp, a: &Lanes<$t>, o: &mut Lanes<$t>) {
                real_unary!(op, $t, lanes1(a, o))
            }
            #[inline(always)]
            fn binary(op: BinOp, a: &Lanes<$t>, b: &Lanes<$t>, o: &mut Lanes<$t>) {
                real_binary!(op, $t, lanes2(a, b, o))
            }
            $($halves)*
        }
    };
}
float! { f32, F32, F32;
    #[inline(always)]
    unsafe fn widen(h: Half, src: *const u8, o: &mut Lanes<f32>) {
        // SAFETY: the caller's contract.
        let bits = unsafe { &*src.cast::<[u16; LANES]>() };
        match h {
            Half::Bf16 => lanes1!(bits, o, reg::widen_bf16),
            Half::F16 => reg::widen_f16(bits, o),
        }
    }
    #[inline(always)]
    fn narrow(h: Half, v: &Lanes<f32>, o: &mut [u16; LANES]) {
        match h {
            Half::Bf16 => lanes1!(v, o, reg::narrow_bf16),
            Half::F16 => reg::narrow_f16(o, v),
        }
    }
}
float! { f64, F64, F64;
    unsafe fn widen(_: Half, _: *const u8, _: &mut Lanes<f64>) {
        unreachable!("an f64 evaluator holds no halves")
    }
    fn narrow(_: Half, _: &Lanes<f64>, _: &mut [u16; LANES]) {
        unreachable!("an f64 evaluator holds no halves")
    }
}

/// Where a node's lanes are: a node's register, or memory (a contiguous load read in place,
/// at the address of flat index 0).
#[derive(Clone, Copy, Debug)]
enum Arg {
    Reg(usize),
    Mem(Ptr),
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Unary(UnOp, Arg),
    Binary(BinOp, Arg, Arg),
}

/// A program bound to its operands, compiled for the fused evaluator.
pub(crate) struct Fused<T> {
    nodes: usize,
    consts: Vec<(usize, T)>,
    /// The computed nodes in program order (operands before their users), with their steps.
    steps: Vec<(usize, Step)>,
    outputs: Vec<Arg>,
    /// Contiguous loads of halves: (node, address of flat index 0, kind), widened into the
    /// node's lanes first in each run.
    widen: Vec<(usize, Ptr, Half)>,
    /// Per output, the halves it is narrowed to (`None`: stored as `T`).
    narrow: Vec<Option<Half>>,
    /// The level the loops run: they are compiled for AVX-512, AVX2 and the baseline (wider
    /// instructions; the same operations, so the same bits).
    simd: Simd,
}

/// Whether a live node of `prog` reads node `k`.
fn read_by_nodes(prog: &crate::prog::Prog, k: usize, bound: &Bound<'_>) -> bool {
    prog.nodes.iter().enumerate().any(|(i, (n, _))| {
        bound.live[i]
            && match n {
                Node::Unary(_, x) | Node::Cast(_, x) => x.0 == k,
                Node::Binary(_, x, y) | Node::Compare(_, x, y) => x.0 == k || y.0 == k,
                Node::Select(c, x, y) => c.0 == k || x.0 == k || y.0 == k,
                _ => false,
            }
    })
}

impl<T: Float> Fused<T> {
    /// `bound` compiled for destinations of dtypes `dsts`; `None` where the evaluator does not
    /// take the program (see the module documentation).
    pub(crate) fn new(simd: Simd, bound: &Bound<'_>, dsts: &[Dtype]) -> Option<Fused<T>> {
        // halves widen into and narrow from f32 lanes only
        let halves = T::DTYPE == Dtype::F32;
        let narrow: Vec<Option<Half>> = dsts.iter().map(|&d| Half::of(d).filter(|_| halves)).collect();
        if dsts.iter().zip(&narrow).any(|(&d, h)| d != T::DTYPE && h.is_none()) {
            return None;
        }
        let mut widen = Vec::new();
        let prog = bound.prog;
        // A cast to a half read only by outputs stored as that half is the store's own
        // narrowing (rounding twice to one format rounds once): it stands for its operand.
        let mut alias: Vec<usize> = (0..prog.nodes.len()).collect();
        for (k, (node, _)) in prog.nodes.iter().enumerate() {
            if let Node::Cast(d, x) = node {
                let stored_as_d = prog.outputs.iter().zip(dsts).filter(|(v, _)| v.0 == k).all(|(_, &o)| o == *d)
                    && prog.outputs.iter().any(|v| v.0 == k);
                if halves && Half::of(*d).is_some() && stored_as_d && !read_by_nodes(prog, k, bound) {
                    alias[k] = alias[x.0];
                }
            }
        }
        let arg = |v: usize| -> Arg {
            let v = alias[v];
            match prog.nodes[v].0 {
                Node::Load(j) if bound.direct[v] => {
                    let s = &bound.sources[j];
                    Arg::Mem(Ptr(s.base.at(s.dtype, s.layout.offset())))
                }
                _ => Arg::Reg(v),
            }
        };
        let (mut consts, mut steps) = (Vec::new(), Vec::new());
        for (k, (node, ty)) in prog.nodes.iter().enumerate() {
            if !bound.live[k] {
                continue;
            }
            if *ty != T::TY {
                return None;
            }
            if alias[k] != k {
                continue;
            }
            match node {
                Node::Load(j) if bound.direct[k] && bound.sources[*j].dtype == T::DTYPE => {}
                Node::Load(j)
                    if halves && bound.sources[*j].contiguous && Half::of(bound.sources[*j].dtype).is_some() =>
                {
                    let s = &bound.sources[*j];
                    let h = Half::of(s.dtype).expect("a half, checked above");
                    widen.push((k, Ptr(s.base.at(s.dtype, s.layout.offset())), h));
                }
                Node::Const(c) => consts.push((k, T::of(c.re))),
                Node::Weak(s) => consts.push((k, T::of(crate::prog::scalar_value(*s).re))),
                Node::Unary(op, x) if *op != UnOp::Not => steps.push((k, Step::Unary(*op, arg(x.0)))),
                Node::Binary(op, x, y) => steps.push((k, Step::Binary(*op, arg(x.0), arg(y.0)))),
                _ => return None,
            }
        }
        let outputs = prog.outputs.iter().map(|v| arg(v.0)).collect();
        Some(Fused { nodes: prog.nodes.len(), consts, steps, outputs, widen, narrow, simd })
    }

    /// Registers for [`Fused::run`], the constants filled in.
    pub(crate) fn registers(&self) -> Vec<Slot<T>> {
        let mut regs = vec![Slot([T::default(); LANES]); self.nodes];
        for &(k, c) in &self.consts {
            regs[k] = Slot([c; LANES]);
        }
        regs
    }

    /// Evaluates flat indices `start..end` (a multiple of [`LANES`] apart) into `outs`
    /// (address, element offset) of every output; `streaming` stores with streaming stores.
    ///
    /// # Safety
    /// The door's claims on every operand and destination are held, `start..end` lies in the
    /// loop, and no other task writes the destinations' elements `start..end`.
    pub(crate) unsafe fn run(
        &self,
        regs: &mut [Slot<T>],
        start: usize,
        end: usize,
        outs: &[(Ptr, isize)],
        streaming: bool,
    ) {
        debug_assert_eq!((end - start) % LANES, 0);
        // SAFETY: the caller's contract.
        unsafe { run_at(self.simd, self, regs, start, end, outs, streaming) }
    }

    /// The loop of [`Fused::run`].
    ///
    /// # Safety
    /// As `run`'s.
    #[inline(always)]
    unsafe fn body(&self, regs: &mut [Slot<T>], start: usize, end: usize, outs: &[(Ptr, isize)], streaming: bool) {
        /// The lanes of `a` at flat index `i`.
        ///
        /// # Safety
        /// As `run`'s; a register argument is one of `done`.
        #[inline(always)]
        unsafe fn lanes<T>(done: &[Slot<T>], a: Arg, i: usize) -> &Lanes<T> {
            match a {
                Arg::Reg(j) => &done[j].0,
                // SAFETY: a contiguous load holds every flat index of the loop; arrays of `T`
                // need only `T`'s alignment.
                Arg::Mem(p) => unsafe { &*p.0.cast::<T>().add(i).cast::<Lanes<T>>() },
            }
        }
        for i in (start..end).step_by(LANES) {
            for &(k, p, h) in &self.widen {
                // SAFETY: the caller's contract: a contiguous load holds every flat index of the
                // loop, 2-byte halves.
                unsafe { T::widen(h, p.0.add(2 * i), &mut regs[k].0) };
            }
            for &(k, step) in &self.steps {
                let (done, rest) = regs.split_at_mut(k);
                let o = &mut rest[0].0;
                // SAFETY: the caller's contract; operands precede their users.
                unsafe {
                    match step {
                        Step::Unary(op, a) => T::unary(op, lanes(done, a, i), o),
                        Step::Binary(op, a, b) => T::binary(op, lanes(done, a, i), lanes(done, b, i), o),
                    }
                }
            }
            for ((&a, &(p, off)), &h) in self.outputs.iter().zip(outs).zip(&self.narrow) {
                // SAFETY: the caller's contract.
                unsafe {
                    let v = lanes(regs, a, i);
                    match h {
                        None => {
                            let dst = p.0.cast::<T>().offset(off + i as isize);
                            if streaming {
                                reg::stream(v, dst);
                            } else {
                                std::ptr::copy_nonoverlapping(v.as_ptr(), dst, LANES);
                            }
                        }
                        Some(h) => {
                            let mut bits = [0u16; LANES];
                            T::narrow(h, v, &mut bits);
                            let dst = p.0.cast::<u16>().offset(off + i as isize);
                            if streaming {
                                reg::stream(&bits, dst);
                            } else {
                                std::ptr::copy_nonoverlapping(bits.as_ptr(), dst, LANES);
                            }
                        }
                    }
                }
            }
        }
    }
}

crate::simd_fn! {
    /// [`Fused::run`]'s loop built for the level.
    ///
    /// # Safety
    /// As [`Fused::run`]'s.
    unsafe fn run_at<T: Float>(simd: Simd, f: &Fused<T>, regs: &mut [Slot<T>], start: usize, end: usize, outs: &[(Ptr, isize)], streaming: bool) {
        // SAFETY: the caller's contract.
        unsafe { f.body(regs, start, end, outs, streaming) }
    }
}
