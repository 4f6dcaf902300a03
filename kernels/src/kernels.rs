//! `trait Kernels`: the kernel contract of `reference/nx_kernel.txt`, for one device's memory.
//!
//! A kernel takes its attributes, then its destinations, then its operands, and answers through
//! the door ([`crate::door`]): [`Answer::Done`], [`Answer::Declined`] for a case the library does
//! not compute, or a refusal naming what is wrong with an operand, always before any write.
//! Destinations are C-contiguous arrays the caller allocates, reaching no element twice; operands
//! may be strided, broadcast or offset. Kernels are deterministic: the same bits on every run and
//! any number of threads.
//!
//! Operations a library does not build answer `Declined` by default. A destination that shares bytes with an
//! operand the kernel reads at other indices than the result's own is refused as `Overlapping`.

use crate::contraction::{Contraction, Factor, Segmented};
use crate::door::Operand;
use crate::loads::{Load, Pad, Windows};
use crate::prog::Prog;
use crate::Answer;

/// A Fourier transform's direction: along an axis of `n` points, `Forward` is `y[k] = Σ_j x[j]
/// e^(−2πi jk/n)` and `Inverse` the same sum with `e^(+2πi jk/n)`. Neither divides by `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `e^(−2πi jk/n)`.
    Forward,
    /// `e^(+2πi jk/n)`.
    Inverse,
}

/// Whether `a` and `b` are float or complex dtypes whose parts have one precision: `f32` and
/// `c64`, or `f64` and `c128` (either with itself or the other) — the pairs a Fourier transform
/// reads and writes.
///
/// # Examples
/// ```
/// use nx_kernels::{same_precision, Dtype};
/// assert!(same_precision(Dtype::F32, Dtype::C64));
/// assert!(!same_precision(Dtype::F32, Dtype::C128));
/// assert!(!same_precision(Dtype::F16, Dtype::F16));
/// ```
pub fn same_precision(a: crate::Dtype, b: crate::Dtype) -> bool {
    use crate::Dtype::{C128, C64, F32, F64};
    let part = |d| match d {
        F32 | C64 => Some(4),
        F64 | C128 => Some(8),
        _ => None,
    };
    part(a).is_some() && part(a) == part(b)
}

/// The points a half spectrum of `n` holds (a real-to-complex transform's last axis): `n/2 + 1`,
/// and none of none.
///
/// # Examples
/// ```
/// assert_eq!((nx_kernels::half_spectrum(8), nx_kernels::half_spectrum(9), nx_kernels::half_spectrum(0)), (5, 5, 0));
/// ```
pub fn half_spectrum(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n / 2 + 1
    }
}

/// Whether the matrix routines take `d`: `f32`, `f64`, `c64` or `c128`.
///
/// # Examples
/// ```
/// use nx_kernels::{full_precision, Dtype};
/// assert!(full_precision(Dtype::C64) && !full_precision(Dtype::BF16) && !full_precision(Dtype::I32));
/// ```
pub fn full_precision(d: crate::Dtype) -> bool {
    matches!(d, crate::Dtype::F32 | crate::Dtype::F64 | crate::Dtype::C64 | crate::Dtype::C128)
}

/// The dtype reductions and scans of the float dtype `d` combine in: `f32` for `f16` and
/// `bf16`, `d` itself for the other floats; none for a dtype that is not a real float.
///
/// # Examples
/// ```
/// use nx_kernels::{float_carrier, Dtype};
/// assert_eq!(float_carrier(Dtype::BF16), Some(Dtype::F32));
/// assert_eq!(float_carrier(Dtype::F64), Some(Dtype::F64));
/// assert_eq!(float_carrier(Dtype::I8), None);
/// ```
pub fn float_carrier(d: crate::Dtype) -> Option<crate::Dtype> {
    (d.kind() == crate::Kind::Float).then(|| d.carrier())
}

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
    /// Whether the reduction reduces terms of `d`: `Sum` and `Prod` every dtype but `bool`,
    /// `Max`, `Min` and `Arg` every dtype, `Logsumexp` and `Moments` real floats.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::{Dtype, Reduction};
    /// assert!(Reduction::Sum.accepts(Dtype::C64) && !Reduction::Sum.accepts(Dtype::Bool));
    /// assert!(Reduction::Max.accepts(Dtype::Bool) && !Reduction::Logsumexp.accepts(Dtype::I32));
    /// ```
    pub fn accepts(self, d: crate::Dtype) -> bool {
        match self {
            Reduction::Sum | Reduction::Prod => d != crate::Dtype::Bool,
            Reduction::Logsumexp | Reduction::Moments => d.kind() == crate::Kind::Float,
            Reduction::Max | Reduction::Min | Reduction::Arg(_) => true,
        }
    }

    /// How many destinations the reduction writes.
    pub fn destinations(self) -> usize {
        match self {
            Reduction::Arg(_) | Reduction::Moments => 2,
            _ => 1,
        }
    }
}

/// How a scatter stores what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scatter {
    /// Stores the value (the last of a duplicate index wins).
    Set,
    /// Adds it (in the carrier, in index order).
    Add,
}

/// `Some((refusal, why))` where a scan by `reduction` along `axis` of an operand of rank `rank`
/// and dtype `src`, into destinations of `dsts` from a carry of dtype `carry`, does not fit:
/// `ShapeMismatch` for an axis past the rank (a rank-0 operand has none) or another number of
/// destinations than the reduction writes (one; two for `Moments` and `Arg`); `WrongDtype` for
/// terms the reduction does not accept ([`Reduction::accepts`]), a destination not of `src`'s
/// dtype (an `Arg`'s second: `i64`), or a carry not of the carrier; `Declined` for `Max`, `Min`
/// and `Arg` of complex terms (this library orders none) and for a carry of a `Moments` or `Arg`
/// scan (its state is more than one value of the carrier). It reads no shape but the rank.
pub fn scan_refusal(
    reduction: Reduction,
    rank: usize,
    axis: usize,
    dsts: &[crate::Dtype],
    carry: Option<crate::Dtype>,
    src: crate::Dtype,
) -> Option<(Answer, String)> {
    use crate::Kind;
    if axis >= rank {
        return Some((Answer::ShapeMismatch, format!("axis {axis} of an operand of rank {rank}")));
    }
    if dsts.len() != reduction.destinations() {
        return Some((
            Answer::ShapeMismatch,
            format!("{} destinations for a {reduction:?} scan, which writes {}", dsts.len(), reduction.destinations()),
        ));
    }
    if !reduction.accepts(src) {
        return Some((Answer::WrongDtype, format!("a {reduction:?} scan does not take {src} terms")));
    }
    if dsts[0] != src {
        return Some((Answer::WrongDtype, format!("the destination is {}, the operand {src}", dsts[0])));
    }
    if matches!(reduction, Reduction::Arg(_)) && dsts[1] != crate::Dtype::I64 {
        return Some((Answer::WrongDtype, format!("Arg's positions go to an i64 destination, not {}", dsts[1])));
    }
    if src.kind() == Kind::Complex && matches!(reduction, Reduction::Max | Reduction::Min | Reduction::Arg(_)) {
        return Some((Answer::Declined, format!("{reduction:?} of complex terms has no order here")));
    }
    match carry {
        Some(_) if matches!(reduction, Reduction::Moments | Reduction::Arg(_)) => {
            Some((Answer::Declined, format!("a {reduction:?} scan's state is more than one carry value")))
        }
        Some(c) if c != src.carrier() => {
            Some((Answer::WrongDtype, format!("the carry is {c}, the carrier of {src} is {}", src.carrier())))
        }
        _ => None,
    }
}

/// The attributes of an attention ([`Kernels::attention`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    /// The score's factor `s` (rounded to the accumulator), commonly `1/√dk`.
    pub scale: f64,
    /// The causal mask: query row `i` sees the keys at positions up to `i + c` (`Some(0)`: the
    /// lower triangle, as `torch`'s `is_causal`; `Some(tk − tq)`: aligned at the last key, as a
    /// decoder's cache is); `None`: every key.
    pub causal: Option<i64>,
    /// The accumulator: [`crate::Dtype::F32`] or [`crate::Dtype::F64`].
    pub acc: crate::Dtype,
}

/// The keys and values of an attention.
#[derive(Clone, Copy)]
pub enum Kv<'a> {
    /// `k` `[lead…, hk, tk, dk]` and `v` `[lead…, hk, tk, dv]`.
    Dense {
        /// The keys.
        k: &'a dyn Operand,
        /// The values.
        v: &'a dyn Operand,
    },
    /// Pools `k` `[pages, hk, page, dk]` and `v` `[pages, hk, page, dv]` read through `table`
    /// (`i64` `[lead…, max_pages]`): key `t` of lead index `b` is entry `table[b, t / page]` at
    /// `t mod page`, `tk = max_pages · page`; an entry outside `0..pages` is a hole (its keys
    /// are not visible and never read).
    Paged {
        /// The key pool.
        k: &'a dyn Operand,
        /// The value pool.
        v: &'a dyn Operand,
        /// The page table.
        table: &'a dyn Operand,
    },
}

/// The operands of an attention's gradient ([`Kernels::attention_grad`]): the forward's dense
/// operands and outputs, the gradient of its output, and the three gradients it writes.
#[derive(Clone, Copy)]
pub struct AttentionGrad<'a> {
    /// The query rows `[lead…, hq, tq, dk]`.
    pub q: &'a dyn Operand,
    /// The keys `[lead…, hk, tk, dk]`.
    pub k: &'a dyn Operand,
    /// The values `[lead…, hk, tk, dv]`.
    pub v: &'a dyn Operand,
    /// The forward's output `[lead…, hq, tq, dv]`.
    pub o: &'a dyn Operand,
    /// The forward's log-sum-exp of each row `[lead…, hq, tq]`, in the accumulator's dtype.
    pub lse: &'a dyn Operand,
    /// The gradient of the output, `o`'s shape.
    pub d_o: &'a dyn Operand,
    /// Written: the gradient of `q`, its shape.
    pub dq: &'a dyn Operand,
    /// Written: the gradient of `k`, its shape.
    pub dk: &'a dyn Operand,
    /// Written: the gradient of `v`, its shape.
    pub dv: &'a dyn Operand,
}

/// `Some((refusal, why))` where an attention of `spec` over a query of dtype `q` and rank `rank`
/// (at least 3), keys `k` and values `v`, into `o` and `lse`, does not fit: `WrongDtype` for an
/// accumulator that is not `f32` or `f64`, an operand that is not a real float narrower than or
/// as wide as it, or an `lse` not of its dtype; `ShapeMismatch` for a rank below 3. It reads no
/// shape but the rank.
pub fn attention_refusal(
    spec: &Attention,
    q: crate::Dtype,
    rank: usize,
    o: crate::Dtype,
    lse: crate::Dtype,
    k: crate::Dtype,
    v: crate::Dtype,
) -> Option<(Answer, String)> {
    use crate::Dtype;
    if !matches!(spec.acc, Dtype::F32 | Dtype::F64) {
        return Some((Answer::WrongDtype, format!("the accumulator is {}, not f32 or f64", spec.acc)));
    }
    for (what, d) in [("q", q), ("k", k), ("v", v), ("o", o)] {
        if !d.is_float() || d.kind() == crate::Kind::Complex || d.size() > spec.acc.size() {
            return Some((
                Answer::WrongDtype,
                format!("{what} is {d}: a real float no wider than the accumulator {}", spec.acc),
            ));
        }
    }
    if lse != spec.acc {
        return Some((Answer::WrongDtype, format!("lse is {lse}, the accumulator {}", spec.acc)));
    }
    if rank < 3 {
        return Some((
            Answer::ShapeMismatch,
            format!("a query of rank {rank}: [lead…, heads, rows, dk] has at least 3"),
        ));
    }
    None
}

/// `Some((refusal, why))` where the gradient of an attention of `spec` ([`Kernels::attention_grad`])
/// does not fit its operands' dtypes and rank: as [`attention_refusal`] for `q`, `k`, `v`, `o` and
/// `lse`, and `WrongDtype` for a `d_o`, `dq`, `dk` or `dv` that is not a real float no wider than
/// the accumulator. It reads no shape but the rank.
pub fn attention_grad_refusal(spec: &Attention, g: &AttentionGrad<'_>) -> Option<(Answer, String)> {
    let rank = g.q.layout().rank();
    if let Some(r) = attention_refusal(spec, g.q.dtype(), rank, g.o.dtype(), g.lse.dtype(), g.k.dtype(), g.v.dtype()) {
        return Some(r);
    }
    for (what, d) in [("d_o", g.d_o.dtype()), ("dq", g.dq.dtype()), ("dk", g.dk.dtype()), ("dv", g.dv.dtype())] {
        if !d.is_float() || d.kind() == crate::Kind::Complex || d.size() > spec.acc.size() {
            return Some((
                Answer::WrongDtype,
                format!("{what} is {d}: a real float no wider than the accumulator {}", spec.acc),
            ));
        }
    }
    None
}

/// The operands of `loads` where every one is plain; `None` where one is padded.
fn plain<'a>(loads: &[Load<'a>]) -> Option<Vec<&'a dyn Operand>> {
    loads
        .iter()
        .map(|l| match l {
            Load::Plain(o) => Some(*o),
            Load::Padded(_) => None,
        })
        .collect()
}

/// A program deciding an attention's visibility and scores ([`Kernels::attention_scored`]), run
/// over the attention's loop `[lead…, hq, tq, tk]`: its load 0 is the pair's score `s × q·k` in
/// the accumulator, its loads 1… are `loads` (each broadcast to the loop: biases, masks, slopes),
/// its `coord(r − 2)` is the query row and `coord(r − 1)` the key, `r` the query's rank (the
/// loop's). Output 0, a
/// `bool`, says whether the pair is visible (besides the causal mask, lengths and pages); output
/// 1, in the accumulator, is its score: ALiBi, soft-capping, sliding windows, prefix-LM masks.
#[derive(Clone, Copy)]
pub struct Scores<'a> {
    /// The program.
    pub prog: &'a Prog,
    /// Its loads after the score.
    pub loads: &'a [&'a dyn Operand],
}

/// `Some((refusal, why))` where an attention's score program `prog` over loads of `loads` (after
/// the score), with an accumulator `acc` and a query of rank `rank`, does not fit: `WrongDtype`
/// for a program that does not check, a load 0 that is not the accumulator's, a load not of its
/// array's dtype, an output 0 that is not a `bool` or an output 1 not of the accumulator's type;
/// `ShapeMismatch` for another number of loads or outputs than two, or a coordinate past the
/// loop's rank (the query's). It reads no shape but the rank.
pub fn scores_refusal(prog: &Prog, acc: crate::Dtype, rank: usize, loads: &[crate::Dtype]) -> Option<(Answer, String)> {
    use crate::prog::Ty;
    if let Err(e) = prog.check() {
        return Some((Answer::WrongDtype, e));
    }
    let want = prog.load_dtypes();
    if want.len() != loads.len() + 1 {
        return Some((
            Answer::ShapeMismatch,
            format!("{} loads after the score for a program of {} loads", loads.len(), want.len()),
        ));
    }
    if want[0] != acc {
        return Some((Answer::WrongDtype, format!("the program's score is {}, the accumulator {acc}", want[0])));
    }
    if let Some(i) = (0..loads.len()).find(|&i| loads[i] != want[i + 1]) {
        return Some((
            Answer::WrongDtype,
            format!("load {} is {}, the program loads {}", i + 1, loads[i], want[i + 1]),
        ));
    }
    if prog.outputs() != 2 {
        return Some((Answer::ShapeMismatch, format!("a score program of {} outputs, not 2", prog.outputs())));
    }
    let (vis, score) = (prog.output_ty(0), prog.output_ty(1));
    if vis != Some(Ty::Bool) || score != Some(Ty::of(acc)) {
        let name = |t: Option<Ty>| t.map_or_else(String::new, |t| t.dtype().to_string());
        return Some((
            Answer::WrongDtype,
            format!("outputs of {} and {}: a bool and the accumulator {acc}", name(vis), name(score)),
        ));
    }
    if let Some(a) = prog.max_coord().filter(|&a| a >= rank) {
        return Some((Answer::ShapeMismatch, format!("coord({a}) on an attention loop of rank {rank}")));
    }
    None
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

    /// [`Kernels::map`] over loads that may be padded and windowed ([`Load`]): load `j` is read
    /// as [`Load::shape`] gives it, broadcast to `shape`, an index outside the operand its fill.
    /// The default computes plain loads through [`Kernels::map`] and declines padded ones.
    fn map_loads(&self, prog: &Prog, shape: &[usize], dsts: &[&dyn Operand], loads: &[Load<'_>]) -> Answer {
        match plain(loads) {
            Some(plain) => self.map(prog, shape, dsts, &plain),
            None => Answer::Declined,
        }
    }

    /// [`Kernels::reduce`] over loads that may be padded and windowed, as [`Kernels::map_loads`]
    /// reads them: a sum pool, a max pool, and with a product of a windowed load and a filter,
    /// a convolution. The default computes plain loads through [`Kernels::reduce`] and declines
    /// padded ones.
    fn reduce_loads(
        &self,
        prog: &Prog,
        shape: &[usize],
        axes: &[usize],
        reductions: &[Reduction],
        dsts: &[&dyn Operand],
        loads: &[Load<'_>],
    ) -> Answer {
        match plain(loads) {
            Some(plain) => self.reduce(prog, shape, axes, reductions, dsts, &plain),
            None => Answer::Declined,
        }
    }

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

    /// `dst = init + contraction(a, b)` in full: each operand scaled by its block scale (a
    /// [`Factor`]), the contraction cut into groups by `segments` where given, the products
    /// computed in [`crate::contraction_accumulator`] of `dst`'s dtype, each operand's and each
    /// value scale's dtype [`crate::widens_into`] it (`i8` operands into an `i32` destination:
    /// an integer contraction, wrapping). `init` is of `dst`'s dtype and shape; the shapes are
    /// [`Contraction::segmented_shape`]'s. An output without products is its init element's bits
    /// (or +0), untouched by any addition. Answers `WrongDtype` for a `bool` destination, an
    /// operand that does not widen into the accumulator, an init not of `dst`'s dtype, exponent
    /// codes not `u8` or on an integer accumulator, ids not `i64`; `ShapeMismatch` for shapes
    /// other than those, or a scale that does not block its operand; `Overlapping` for a
    /// destination sharing bytes with an operand, a scale or the ids; `Declined` for a case the
    /// library does not compute (the default: every case).
    fn contract_general(
        &self,
        _spec: &Contraction,
        _segments: Option<Segmented<'_>>,
        _dst: &dyn Operand,
        _a: Factor<'_>,
        _b: Factor<'_>,
        _init: Option<&dyn Operand>,
    ) -> Answer {
        Answer::Declined
    }

    /// A scan of `src` along `axis` by `reduction` into `dsts` (`src`'s shape; one destination of
    /// `src`'s dtype, or two for `Moments` — the means, then the variances — and `Arg` — the
    /// extremes, then their `i64` positions): result `i` is the reduction of the terms up to `i`,
    /// combined in the carrier ([`crate::Dtype::carrier`]), continuing from `carry` (the
    /// carrier's dtype, [`crate::shape::carry`]'s shape) where given — the value of the result
    /// before the first term — else a `Sum` from +0 and the others from their first term. The
    /// scan of a prefix of the axis is the prefix of the scan, bit for bit; [`scan_refusal`] names
    /// what does not fit.
    fn scan(
        &self,
        _reduction: Reduction,
        _axis: usize,
        _carry: Option<&dyn Operand>,
        _dsts: &[&dyn Operand],
        _src: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// `dst[o…, t…, i…] = src[o…, index[t…], i…]`: the elements of `src` at positions `index`
    /// (an `i64` array of any shape) along `axis`; `dst` has `src`'s shape with `axis` replaced
    /// by `index`'s. An index outside `0..src.shape[axis]` is refused as
    /// [`Answer::IndexOutOfRange`] before any write (on a queued device, when the work runs: the
    /// device is then lost, naming it). Bits are copied.
    fn gather(&self, _axis: usize, _dst: &dyn Operand, _src: &dyn Operand, _index: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// `dst[o…, t…, k, i…] = src[o…, starts[t…] + k, i…]` for `k < run`: runs of `run`
    /// consecutive elements along `axis` from each of `starts` (an `i64` array); a run past the
    /// axis is refused as [`Answer::IndexOutOfRange`], as [`Kernels::gather`] refuses.
    fn range_gather(
        &self,
        _axis: usize,
        _run: usize,
        _dst: &dyn Operand,
        _src: &dyn Operand,
        _starts: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// `dst = into` (zeros without it), then for each `t` in order `dst[o…, index[t], i…]`
    /// receives `src[o…, t, i…]` by `mode`: `Set` (the last `t` of a duplicate index wins) or
    /// `Add` (in the carrier, in order of `t`, rounded once). `index` is 1-D, of `src.shape[axis]`
    /// elements; `src` has `dst`'s shape with `axis` of that extent; `into` has `dst`'s shape and
    /// may be identical to it. Indices are checked as [`Kernels::gather`] checks them.
    fn scatter(
        &self,
        _mode: Scatter,
        _axis: usize,
        _dst: &dyn Operand,
        _into: Option<&dyn Operand>,
        _src: &dyn Operand,
        _index: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// A stable sort of `src` along `axis`, ascending or `descending`, in the order of
    /// `Maximum`/`Minimum` (NaNs greatest, −0 below +0), writing the first `k` of each lane's
    /// sorted elements into `values` and their positions (`i64`) into `positions` — `k` their
    /// extent along `axis` (at most `src`'s; `k` below it is a top-k). Either destination may be
    /// absent, not both.
    fn sort(
        &self,
        _axis: usize,
        _descending: bool,
        _values: Option<&dyn Operand>,
        _positions: Option<&dyn Operand>,
        _src: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// `dst` = `src` padded by `pad` (a move: bits copied), the padding's elements `fill` (as the
    /// dtype converts it); `dst` has [`Pad::shape`] of `src`'s.
    fn pad(&self, _pad: &Pad, _fill: crate::Value, _dst: &dyn Operand, _src: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// A fold: each element of `dst` reduces by `reduction` (`Sum`, `Prod`, `Max`, `Min`) one
    /// window of `src` padded by `pad` — the padded operand never materialised, its padding
    /// `fill` — the windows as [`Windows::shape`] counts them: pooling, and with `fill` 0 a sum
    /// pool that includes the padding. The terms are a window's elements in C order of its
    /// index, combined in the carrier left to right (a `Sum` from +0) and rounded once.
    fn fold(
        &self,
        _reduction: Reduction,
        _pad: &Pad,
        _fill: crate::Value,
        _windows: &Windows,
        _dst: &dyn Operand,
        _src: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// Attention of query rows `q` `[lead…, hq, tq, dk]` against keys and values `kv` (dense
    /// `[lead…, hk, tk, d]`, or paged pools read through a table) into `o` `[lead…, hq, tq, dv]`
    /// and `lse` `[lead…, hq, tq]` (the accumulator's dtype): query head `h` reads key head
    /// `h / (hq / hk)`; a pair's score is `scale × q·k` in the accumulator; a pair is visible
    /// where its key lies before the lead index's length (`lengths`, `i64` `[lead…]`; `tk`
    /// without), on a page of the pool, and within the causal mask. `lse` is the log-sum-exp of a
    /// row's visible scores and `o` their values weighted by `exp(score − lse)`; a row of no
    /// visible pair has `o = +0`, `lse = −∞`. A length outside `0..=tk` is refused as
    /// [`Answer::IndexOutOfRange`]; [`attention_refusal`] names dtypes that do not fit. `o` and
    /// `lse` may be strided where their last axis is at stride 1 (a permuted view of a dense
    /// array: FlashAttention's `[lead…, tq, hq, dv]` output); others are declined.
    fn attention(
        &self,
        _spec: &Attention,
        _o: &dyn Operand,
        _lse: &dyn Operand,
        _q: &dyn Operand,
        _kv: Kv<'_>,
        _lengths: Option<&dyn Operand>,
    ) -> Answer {
        Answer::Declined
    }

    /// [`Kernels::attention`] with a score program ([`Scores`]): a pair is visible where it is
    /// as `attention` says and the program's output 0 holds, and its score is the program's
    /// output 1 (given `s × q·k`); [`scores_refusal`] names a program that does not fit, and a
    /// load that does not broadcast to the loop is refused as `ShapeMismatch`. The default
    /// declines.
    #[allow(clippy::too_many_arguments)]
    fn attention_scored(
        &self,
        _spec: &Attention,
        _scores: Scores<'_>,
        _o: &dyn Operand,
        _lse: &dyn Operand,
        _q: &dyn Operand,
        _kv: Kv<'_>,
        _lengths: Option<&dyn Operand>,
    ) -> Answer {
        Answer::Declined
    }

    /// The gradient of [`Kernels::attention`] over dense keys without lengths: given its operands,
    /// its outputs `o` and `lse` and the gradient `d_o` of `o`, writes `dq`, `dk` and `dv` (each
    /// its operand's shape), as FlashAttention's backward: a visible pair weighs `P = exp(s·q·k −
    /// lse)` (no weight in a row of `lse = −∞`), `D = rowsum(d_o ∘ o)`, `dS = P ∘ (d_o·vᵀ − D)`,
    /// `dq = s·dS·k`, `dk = s·dSᵀ·q` and `dv = Pᵀ·d_o`, summed over the query heads of a key head
    /// and in the accumulator, each result rounded once. A destination whose last axis is not at
    /// stride 1 is declined (other strides are read, as a permuted view of a dense array has); one
    /// sharing a byte with an operand or another destination is refused as
    /// `Overlapping`; [`attention_grad_refusal`] names dtypes that do not fit. The default
    /// declines.
    fn attention_grad(&self, _spec: &Attention, _grad: AttentionGrad<'_>) -> Answer {
        Answer::Declined
    }

    /// Writes each piece into `dst` at its offset (the index of its first element in `dst`), in
    /// order: a later piece overwrites an earlier where they overlap, and elements no piece
    /// covers keep what `dst` held. The first piece may be identical to `dst` where it is the
    /// whole result. Concatenation, stacking and writing a box.
    fn assemble(&self, _dst: &dyn Operand, _pieces: &[(&[usize], &dyn Operand)]) -> Answer {
        Answer::Declined
    }

    /// The discrete Fourier transform of `src` along `axes` (distinct, in any order), one axis
    /// after another, the last of `axes` first: along an axis of `n` points `y[k] = Σ_j x[j]
    /// e^(∓2πi jk/n)` (`-` forward, `+` inverse), neither direction dividing by `n`. Three forms,
    /// read from the dtypes, which must be of [`same_precision`]:
    /// - complex to complex: `dst` has `src`'s shape;
    /// - real to complex: the real input read as complex; along the last of `axes`, `dst` holds
    ///   all `n` outputs or the first `n/2 + 1` (the half spectrum, the rest being their
    ///   conjugates), whichever its extent says;
    /// - complex to real: along the last of `axes` (transformed last), `src` holds the first
    ///   `n/2 + 1` points of a lane of `n` = `dst`'s extent, extended as `x[j] = conj(x[n − j])`
    ///   past them, and `dst` the real part of that lane's transform (the other axes first,
    ///   complex to complex).
    ///
    /// Every other axis has one extent in both; an axis of no points transforms to none (a half
    /// spectrum of 0 points has 0). A library states its error bound.
    fn fft(&self, _direction: Direction, _axes: &[usize], _dst: &dyn Operand, _src: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// The Cholesky factor of each matrix of `a` (its last two axes; batch axes before them):
    /// `l` lower triangular with `a = l·lᴴ`, read from `a`'s lower triangle alone (the upper is
    /// never read), zeros above the diagonal. A matrix that is not positive definite (a pivot
    /// not above 0, or NaN) has a factor of NaNs; the others of the batch are unaffected. `l` has
    /// `a`'s shape and dtype, one of [`full_precision`]'s.
    fn cholesky(&self, _l: &dyn Operand, _a: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// `x` with `a·x = b` for each triangular matrix of `a` `[batch…, n, n]` (its `lower` or
    /// upper triangle; with `unit` its diagonal taken as ones, never read; the other triangle
    /// never read), `b` and `x` `[batch…, n, k]`, one dtype of [`full_precision`]'s. A zero on
    /// the diagonal gives infinities or NaNs, as the division does.
    fn solve_triangular(
        &self,
        _lower: bool,
        _unit: bool,
        _x: &dyn Operand,
        _a: &dyn Operand,
        _b: &dyn Operand,
    ) -> Answer {
        Answer::Declined
    }

    /// `x` with `a·x = b` for each square matrix of `a` `[batch…, n, n]`, by LU with partial
    /// pivoting (rows exchanged for the pivot of greatest magnitude), `b` and `x`
    /// `[batch…, n, k]`, one dtype of [`full_precision`]'s. A singular matrix (a zero pivot)
    /// gives infinities or NaNs in its `x`.
    fn solve(&self, _x: &dyn Operand, _a: &dyn Operand, _b: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// The QR factors of each matrix of `a` `[batch…, m, n]` (k = min(m, n)) by Householder
    /// reflections: `a = q·r`, `q` with orthonormal columns, `r` upper triangular (trapezoidal).
    /// Reduced (`q` `[batch…, m, k]`, `r` `[batch…, k, n]`) or complete (`q` `[batch…, m, m]`,
    /// `r` `[batch…, m, n]`, its rows past k zero), read from `q`'s shape. The factors are
    /// unique only up to a unit factor per column of `q` and row of `r`: the signs are those the
    /// reflections leave (`r`'s diagonal may be negative). One dtype of [`full_precision`]'s.
    fn qr(&self, _q: &dyn Operand, _r: &dyn Operand, _a: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// The singular values `s` `[batch…, k]` (the real dtype of `a`'s parts, descending) of each
    /// matrix of `a` `[batch…, m, n]`, and with `u` and `vh` the vectors: `a = u·diag(s)·vh`,
    /// reduced (`u` `[batch…, m, k]`, `vh` `[batch…, k, n]`) or complete (`u` `[batch…, m, m]`,
    /// `vh` `[batch…, n, n]`), read from their shapes; both or neither. Vectors of a simple
    /// value are unique up to a unit factor, of a repeated one up to a unitary basis of its
    /// space. A matrix the iteration does not converge on gets NaNs.
    fn svd(&self, _u: Option<&dyn Operand>, _s: &dyn Operand, _vh: Option<&dyn Operand>, _a: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// The eigenvalues `w` `[batch…, n]` (the real dtype of `a`'s parts, ascending) of each
    /// Hermitian matrix of `a` `[batch…, n, n]`, read from its lower triangle alone, and with
    /// `v` (`a`'s shape) the orthonormal eigenvectors as its columns: `a·v = v·diag(w)`. Vectors
    /// are unique as [`Kernels::svd`]'s are. A matrix the iteration does not converge on gets
    /// NaNs.
    fn eigh(&self, _w: &dyn Operand, _v: Option<&dyn Operand>, _a: &dyn Operand) -> Answer {
        Answer::Declined
    }

    /// The eigenvalues `w` `[batch…, n]` of each square matrix of `a` `[batch…, n, n]`, complex
    /// of `a`'s precision (`c64` for `f32` and `c64`, `c128` for `f64` and `c128`), and with `v`
    /// (that dtype, `a`'s shape) eigenvectors as its columns, each of unit 2-norm: `a·v =
    /// v·diag(w)`. The library states the values' order; a real matrix's conjugate pairs are
    /// exact conjugates. A matrix the iteration does not converge on gets NaNs. Answers
    /// `WrongDtype` for `a` not `f32`, `f64`, `c64` or `c128` or `w`/`v` not its complex dtype;
    /// `ShapeMismatch` for a matrix that is not square or destinations of other shapes.
    fn eig(&self, _w: &dyn Operand, _v: Option<&dyn Operand>, _a: &dyn Operand) -> Answer {
        Answer::Declined
    }
}
