//! `trait Kernels`: the kernel contract of `reference/nx_kernel.txt`, for one device's memory.
//!
//! A kernel takes its attributes, then its destinations, then its operands, and answers through
//! the door ([`crate::door`]): [`Answer::Done`], [`Answer::Declined`] for a case the library does
//! not compute, or a refusal naming what is wrong with an operand, always before any write.
//! Destinations are C-contiguous arrays the caller allocates, reaching no element twice; operands
//! may be strided, broadcast or offset. Kernels are deterministic: the same bits on every run and
//! any number of threads.
//!
//! The operations the contract adds later (scans, gathers and scatters, sorts, Fourier
//! transforms, matrix routines, attention) have their places here already and answer `Declined`
//! in every library until built.

use crate::door::Operand;
use crate::prog::Prog;
use crate::Answer;

/// The extreme an [`Reduction::Arg`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Extreme {
    /// The greatest.
    Max,
    /// The least.
    Min,
}

/// What a reduction computes from its terms (the values of one program output along the reduced
/// axes, numbered in C order of those axes' indices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The sum, from +0 (a sum of −0 terms is +0); integers wrap. One destination.
    Sum,
    /// The product, from the first term (an empty product is 1); integers wrap. One destination.
    Prod,
    /// The greatest term, NaN where one is, −0 below +0; `any` on booleans. One destination.
    Max,
    /// The least term, likewise; `all` on booleans. One destination.
    Min,
    /// The extreme, then the `i64` position of the first term with its bits (of the first NaN
    /// where it is NaN). Two destinations.
    Arg(Extreme),
    /// `m + ln Σ exp(x − m)`, m the greatest term: −∞ for no term or all −∞, +∞ where a term is
    /// +∞ and none NaN, NaN where a term is. Floats. One destination.
    Logsumexp,
    /// The population mean, then the variance (never negative); NaN for no term or a NaN term.
    /// Floats. Two destinations.
    Moments,
}

impl Reduction {
    /// How many destinations the reduction writes.
    pub fn destinations(self) -> usize {
        match self {
            Reduction::Arg(_) | Reduction::Moments => 2,
            _ => 1,
        }
    }
}

/// A general contraction of `a` with `b`: the batch pairs, then the contracting pairs (axis of
/// `a`, axis of `b`), each pair of one extent. The result's axes are the batch pairs, then `a`'s
/// free axes, then `b`'s, each in its operand's order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Contraction {
    /// Axes summed over: (axis of `a`, axis of `b`).
    pub contracting: Vec<(usize, usize)>,
    /// Axes kept and paired: (axis of `a`, axis of `b`).
    pub batch: Vec<(usize, usize)>,
}

impl Contraction {
    /// Batched matrix product: `a [.., m, k] · b [.., k, n]`, the leading `batch` axes paired.
    pub fn matmul(batch: usize) -> Contraction {
        Contraction { contracting: vec![(batch + 1, batch)], batch: (0..batch).map(|i| (i, i)).collect() }
    }

    /// The result's shape for operands of shapes `a` and `b`, or why they do not fit.
    ///
    /// # Errors
    /// Why not, in words: an axis past an operand's rank or in two pairs, or a pair of two extents.
    pub fn shape(&self, a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
        let pairs = self.batch.iter().chain(&self.contracting);
        let (mut used_a, mut used_b) = (vec![false; a.len()], vec![false; b.len()]);
        for &(x, y) in pairs {
            if x >= a.len() || y >= b.len() {
                return Err(format!("pair ({x}, {y}) is past the operands' ranks {} and {}", a.len(), b.len()));
            }
            if std::mem::replace(&mut used_a[x], true) || std::mem::replace(&mut used_b[y], true) {
                return Err(format!("axis pair ({x}, {y}) repeats an axis"));
            }
            if a[x] != b[y] {
                return Err(format!("pair ({x}, {y}) has extents {} and {}", a[x], b[y]));
            }
        }
        let mut out: Vec<usize> = self.batch.iter().map(|&(x, _)| a[x]).collect();
        out.extend((0..a.len()).filter(|&i| !used_a[i]).map(|i| a[i]));
        out.extend((0..b.len()).filter(|&i| !used_b[i]).map(|i| b[i]));
        Ok(out)
    }
}

/// The kernel contract, for a library of kernels that compute on some devices' memory.
///
/// Each method takes attributes, then destinations, then operands, and answers as the [module
/// documentation](self) says. A library states in its docs what it declines, its algorithms, its
/// error bounds and whether it may be called from several threads at once.
pub trait Kernels {
    /// The library's name, as errors print it.
    fn name(&self) -> &'static str;

    /// Runs `prog` at every index of a loop of `shape`: destination `i` (of `shape`) receives
    /// output `i`; operand `j` is read broadcast to `shape` (numpy's rules).
    fn map(&self, prog: &Prog, shape: &[usize], dsts: &[&dyn Operand], loads: &[&dyn Operand]) -> Answer;

    /// Reduces each output of `prog` over a loop of `shape` along `axes` by `reductions[i]`; the
    /// destinations (one or two per reduction, in order) have `shape` without `axes`.
    fn reduce(
        &self,
        prog: &Prog,
        shape: &[usize],
        axes: &[usize],
        reductions: &[Reduction],
        dsts: &[&dyn Operand],
        loads: &[&dyn Operand],
    ) -> Answer;

    /// `dst = init + contraction(a, b)` (`init` of `dst`'s shape, read at the result's own index;
    /// `+0` without it).
    fn contract(
        &self,
        spec: &Contraction,
        dst: &dyn Operand,
        a: &dyn Operand,
        b: &dyn Operand,
        init: Option<&dyn Operand>,
    ) -> Answer;

    /// A Sum, Prod, Max or Min scan of `src` along `axis` into `dst`. Not built yet.
    fn scan(&self, _reduction: Reduction, _axis: usize, _dst: &dyn Operand, _src: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// `dst[..., i, ...] = src[..., index[i], ...]` along `axis`. Not built yet.
    fn gather(&self, _axis: usize, _dst: &dyn Operand, _src: &dyn Operand, _index: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// A stable sort of `src` along `axis` into `dst`. Not built yet.
    fn sort(&self, _axis: usize, _descending: bool, _dst: &dyn Operand, _src: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// A Fourier transform along `axes`. Not built yet.
    fn fft(&self, _axes: &[usize], _inverse: bool, _dst: &dyn Operand, _src: &dyn Operand) -> Answer {
        Answer::Declined
    }
}
