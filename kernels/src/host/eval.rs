//! Evaluating a program over blocks of a loop's flat indices.

use crate::door::Operand;
use crate::host::reg::{self, Reg, Src};
use crate::layout::{contiguous_strides, extent_product, Layout, Move};
use crate::loads::{padded_shape, Load, Pad, Windows};
use crate::prog::{Node, Prog, Ty};
use crate::runs::Runs;
use crate::{Answer, Dtype, Value};

/// A host address held under the door's claims, shared by the tasks of one kernel call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ptr(pub(crate) *mut u8);

// SAFETY: a `Ptr` is made only inside a door's closure, which holds the claims on its memory for
// the whole call; tasks of the call read shared operands and write disjoint ranges of the
// destinations, so sending the address to the pool's threads races with nothing.
unsafe impl Send for Ptr {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ptr {}

impl Ptr {
    pub(crate) fn of(o: &dyn Operand) -> Ptr {
        Ptr(o.buffer().host_ptr().map_or(std::ptr::null_mut(), |p| p.as_ptr()))
    }

    /// The address `bytes` past this one.
    #[inline(always)]
    pub(crate) fn byte(self, bytes: isize) -> *mut u8 {
        self.0.wrapping_offset(bytes)
    }

    /// The address of element position `pos` of an array of dtype `d`.
    pub(crate) fn at(self, d: Dtype, pos: isize) -> *mut u8 {
        self.0.wrapping_offset(pos * d.size() as isize)
    }
}

/// How a loop reads a padded load ([`Load::Padded`]), owned so that a kernel's work can hold it.
#[derive(Debug, Clone)]
pub(crate) struct Read {
    pad: Pad,
    fill: Value,
    windows: Option<Windows>,
}

/// Each load's padded read, or `None` for a plain one.
pub(crate) fn reads(loads: &[Load<'_>]) -> Vec<Option<Read>> {
    loads
        .iter()
        .map(|l| match l {
            Load::Plain(_) => None,
            Load::Padded(p) => Some(Read { pad: p.pad.clone(), fill: p.fill, windows: p.windows.cloned() }),
        })
        .collect()
}

/// A padded load's positions: a position of its padded (and windowed) shape, C order, to the
/// operand's element it reads, or the fill.
pub(crate) struct Padding {
    read: Read,
    /// The padded (and windowed) shape, and its C-contiguous strides.
    shape: Vec<usize>,
    strides: Vec<isize>,
    /// The operand's own layout.
    operand: Layout,
}

impl Padding {
    /// The operand's element position that position `v` of the padded shape reads (`v` a C-order
    /// position, as [`Padding::strides`] numbers them), or `None` for the fill.
    #[inline]
    fn source(&self, mut v: isize) -> Option<isize> {
        let r = self.operand.rank();
        let mut idx = [0usize; crate::MAX_RANK];
        for (k, (&n, &st)) in self.shape.iter().zip(&self.strides).enumerate() {
            let i = v / st;
            v -= i * st;
            debug_assert!((i as usize) < n, "a position of the padded shape");
            idx[k] = i as usize;
        }
        let mut pos = self.operand.offset();
        for d in 0..r {
            let at = match &self.read.windows {
                Some(w) => idx[d] * w.stride[d] + idx[r + d] * w.dilation[d],
                None => idx[d],
            };
            let i = self.read.pad.source(d, at, self.operand.shape()[d])?;
            pos += i as isize * self.operand.strides()[d];
        }
        Some(pos)
    }

    /// Loads the padded positions `runs` walks into `out`, the fill where they read none of the
    /// operand's elements.
    ///
    /// # Safety
    /// A claim on the operand's buffer must be held, `base` its address.
    unsafe fn load(&self, d: Dtype, base: *const u8, runs: &mut Runs<1>, len: usize, out: &mut Reg) {
        let [s] = runs.inner_strides();
        let mut at = Vec::with_capacity(len);
        while let Some(([p], n)) = runs.next_run() {
            at.extend((0..n as isize).map(|i| self.source(p + i * s)));
        }
        // SAFETY: the caller's contract; `source` answers positions of the operand's checked
        // layout.
        unsafe { reg::load_positions(d, base, &at, self.read.fill, out) }
    }
}

/// One load: its dtype, memory and layout over the loop's (possibly permuted) shape.
pub(crate) struct Source {
    pub(crate) dtype: Dtype,
    pub(crate) base: Ptr,
    /// The positions the loop reads: the operand's elements, or for a padded load the positions
    /// of its padded shape ([`Source::padding`]).
    pub(crate) layout: Layout,
    /// Whether it lies contiguous in the loop's order (flat index i at element offset + i).
    pub(crate) contiguous: bool,
    /// A padded load's reads: its layout's positions are then not the operand's.
    pub(crate) padding: Option<Padding>,
}

/// A program bound to its operands over a loop.
pub(crate) struct Bound<'p> {
    pub(crate) prog: &'p Prog,
    shape: Vec<usize>,
    /// For each program axis, the loop axis that holds it.
    axis_of: Vec<usize>,
    pub(crate) sources: Vec<Source>,
    pub(crate) live: Vec<bool>,
    /// Per node: a load read in place (a contiguous source needing no conversion).
    pub(crate) direct: Vec<bool>,
}

impl<'p> Bound<'p> {
    /// Binds `prog` to `loads` over a loop of `shape`, its axes visited in the order `perm`
    /// (loop axis `i` is program axis `perm[i]`). Answers `ShapeMismatch` for a load that does not
    /// broadcast to `shape`.
    pub(crate) fn new(
        prog: &'p Prog,
        shape: &[usize],
        perm: &[usize],
        loads: &[&dyn Operand],
        reads: &[Option<Read>],
    ) -> Result<Bound<'p>, Answer> {
        let loop_shape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
        let mut axis_of = vec![0; perm.len()];
        for (i, &a) in perm.iter().enumerate() {
            axis_of[a] = i;
        }
        let mut sources = Vec::with_capacity(loads.len());
        for (j, l) in loads.iter().enumerate() {
            let (read, padding) = match reads.get(j).cloned().flatten() {
                None => (l.layout().clone(), None),
                Some(read) => {
                    let operand = l.layout().clone();
                    let shape = padded_shape(&read.pad, read.windows.as_ref(), operand.shape())
                        .map_err(|_| Answer::ShapeMismatch)?;
                    // the padded shape's own positions, C order; one past any layout's reach
                    // is a loop no memory could hold
                    let strides = contiguous_strides(&shape).map_err(|_| Answer::Declined)?;
                    let virt = Layout::new(shape.clone(), strides.clone(), 0).map_err(|_| Answer::Declined)?;
                    (virt, Some(Padding { read, shape, strides, operand }))
                }
            };
            let wide = read.apply(&Move::Expand(shape.to_vec())).map_err(|_| Answer::ShapeMismatch)?;
            let wide = wide.ok_or(Answer::ShapeMismatch)?;
            let layout = wide
                .apply(&Move::Permute(perm.to_vec()))
                .map_err(|_| Answer::ShapeMismatch)?
                .ok_or(Answer::ShapeMismatch)?;
            let contiguous = padding.is_none() && layout.is_contiguous() && layout.is_distinct();
            sources.push(Source { dtype: l.dtype(), base: Ptr::of(*l), layout, contiguous, padding });
        }
        let live = live(prog);
        let direct = prog
            .nodes
            .iter()
            .map(|(n, _)| match n {
                Node::Load(j) => {
                    let s = &sources[*j];
                    s.contiguous
                        && matches!(
                            s.dtype,
                            Dtype::F32 | Dtype::F64 | Dtype::I64 | Dtype::U64 | Dtype::C64 | Dtype::C128
                        )
                }
                _ => false,
            })
            .collect();
        Ok(Bound { prog, shape: loop_shape, axis_of, sources, live, direct })
    }

    /// The loop's number of indices.
    pub(crate) fn numel(&self) -> usize {
        extent_product(self.shape.iter().copied())
    }

    /// A fresh register per node.
    pub(crate) fn registers(&self, cap: usize) -> Vec<Reg> {
        // a dead node or a load read in place never fills its register: none allocated
        let held = |k: usize| self.live[k] && !self.direct[k];
        self.prog.nodes.iter().enumerate().map(|(k, (_, t))| Reg::new(*t, if held(k) { cap } else { 0 })).collect()
    }

    /// Node `k`'s values at flat indices `start..start + len` after [`Bound::eval`] of that block:
    /// its register, or the memory of a load read in place.
    pub(crate) fn view<'r>(&'r self, regs: &'r [Reg], k: usize, start: usize, len: usize) -> Src<'r> {
        if self.direct[k] {
            let Node::Load(j) = self.prog.nodes[k].0 else { unreachable!("direct nodes are loads") };
            let s = &self.sources[j];
            let p = s.base.at(s.dtype, s.layout.offset() + start as isize);
            // SAFETY: the door's claims outlive the kernel call, and with it every view; a
            // contiguous source holds this run.
            unsafe { Src::memory(s.dtype, p, len).expect("direct dtypes are held in place") }
        } else {
            regs[k].view()
        }
    }

    /// Output `i`'s values at flat indices `start..start + len` after [`Bound::eval`].
    pub(crate) fn output<'r>(&'r self, regs: &'r [Reg], i: usize, start: usize, len: usize) -> Src<'r> {
        self.view(regs, self.prog.outputs[i].0, start, len)
    }

    /// Whether output `i` is an operand read in place: [`Bound::output`] holds its values at any
    /// flat indices without [`Bound::eval`].
    pub(crate) fn in_place(&self, i: usize) -> bool {
        self.direct[self.prog.outputs[i].0]
    }

    /// The compute type of output `i`.
    pub(crate) fn output_ty(&self, i: usize) -> Ty {
        self.prog.ty(self.prog.outputs[i])
    }

    /// Evaluates every live node at flat loop indices `start..start + len`.
    ///
    /// # Safety
    /// The door's claims on every load must be held.
    pub(crate) unsafe fn eval(&self, start: usize, len: usize, regs: &mut [Reg]) {
        for i in 0..regs.len() {
            if !self.live[i] || self.direct[i] {
                continue;
            }
            let (done, rest) = regs.split_at_mut(i);
            let out = &mut rest[0];
            match &self.prog.nodes[i].0 {
                Node::Load(j) => {
                    let s = &self.sources[*j];
                    if let Some(p) = &s.padding {
                        let l = &s.layout;
                        let mut runs = Runs::new(l.shape(), [l.strides()], [l.offset()], start, len);
                        // SAFETY: claims held; the padding reads positions of the operand's
                        // checked layout.
                        unsafe { p.load(s.dtype, s.base.0, &mut runs, len, out) }
                    } else if s.contiguous && !s.dtype.is_packed() {
                        let p = s.base.at(s.dtype, s.layout.offset() + start as isize);
                        // SAFETY: claims held; a contiguous layout over the loop holds these runs.
                        unsafe { reg::load_run(s.dtype, p, len, out) }
                    } else {
                        let l = &s.layout;
                        let mut runs = Runs::new(l.shape(), [l.strides()], [l.offset()], start, len);
                        // SAFETY: claims held; positions of the checked, broadcast layout.
                        unsafe { reg::load_runs(s.dtype, s.base.0, &mut runs, out) }
                    }
                }
                Node::Coord(a) => {
                    let axis = self.axis_of[*a];
                    let inner: usize = self.shape[axis + 1..].iter().product();
                    let n = self.shape[axis].max(1);
                    let Reg::I(v) = out else { unreachable!("coord is i64") };
                    v.clear();
                    v.extend((start..start + len).map(|f| ((f / inner.max(1)) % n) as i64));
                }
                node => compute(node, len, |k| self.view(done, k, start, len), out),
            }
        }
    }
}

/// Which nodes of `prog` its outputs read, directly or through others.
pub(crate) fn live(prog: &Prog) -> Vec<bool> {
    let mut live = vec![false; prog.nodes.len()];
    let mut stack: Vec<usize> = prog.outputs.iter().map(|v| v.0).collect();
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i], true) {
            continue;
        }
        match &prog.nodes[i].0 {
            Node::Unary(_, x) | Node::Cast(_, x) => stack.push(x.0),
            Node::Binary(_, x, y) | Node::Compare(_, x, y) => stack.extend([x.0, y.0]),
            Node::Select(c, x, y) => stack.extend([c.0, x.0, y.0]),
            _ => {}
        }
    }
    live
}

/// Computes `node` — a constant or an operation, not a load or a coordinate, which their
/// evaluators read — at `len` indices into `out`, from the values `view` gives of the nodes it
/// reads.
pub(crate) fn compute<'r>(node: &Node, len: usize, view: impl Fn(usize) -> Src<'r>, out: &mut Reg) {
    match node {
        // A constant's register keeps its values from block to block.
        Node::Const(c) => {
            if out.view().len() != len {
                out.clear();
                out.fill(*c, len);
            }
        }
        Node::Weak(s) => {
            if out.view().len() != len {
                out.clear();
                out.fill(crate::prog::scalar_value(*s), len);
            }
        }
        Node::Unary(op, x) => reg::unary(*op, view(x.0), out),
        Node::Binary(op, x, y) => reg::binary(*op, view(x.0), view(y.0), out),
        Node::Compare(op, x, y) => reg::compare(*op, view(x.0), view(y.0), out),
        Node::Select(c, x, y) => reg::select(view(c.0), view(x.0), view(y.0), out),
        Node::Cast(d, x) => reg::cast(view(x.0), *d, out),
        Node::Load(_) | Node::Coord(_) => unreachable!("loads and coordinates come from their evaluator"),
    }
}
