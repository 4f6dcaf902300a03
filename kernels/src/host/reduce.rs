//! The reduction kernel: fixed chunks, fixed lanes, a fixed tree (see the library's docs).

use num_complex::{Complex32, Complex64};
use rayon::prelude::*;

use super::eval::{reads, Bound, Ptr};
use super::par::{for_each, for_each_init};
use super::reg::{dispatch_dtype, each_src, float_max, float_min, Reg, Src};
use super::{through_door, Work};
use crate::door::Operand;
use crate::kernels::{Extreme, Reduction};
use crate::layout::extent_product;
use crate::loads::Load;
use crate::prog::{reduce_refusal, Prog, Ty};
use crate::{Answer, Dtype, Element, Simd, Value};

/// Terms a chunk holds.
pub(crate) const CHUNK: usize = 2048;

/// What reductions (and scans) need of a term type.
pub(crate) trait Term: Copy + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn lowest() -> Self;
    fn highest() -> Self;
    fn is_nan(self) -> bool;
    /// Whether `self` beats `o` for `e` (strictly: greater, or +0 over −0 for Max).
    fn beats(self, o: Self, e: Extreme) -> bool;
    fn to_f64(self) -> f64;
    fn value(self) -> Value;
}

macro_rules! float_term {
    ($t:ty) => {
        impl Term for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn max(self, o: Self) -> Self {
                float_max(self, o)
            }
            fn min(self, o: Self) -> Self {
                float_min(self, o)
            }
            fn lowest() -> Self {
                <$t>::NEG_INFINITY
            }
            fn highest() -> Self {
                <$t>::INFINITY
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn beats(self, o: Self, e: Extreme) -> bool {
                match e {
                    Extreme::Max => self > o || (self == o && o.is_sign_negative() && !self.is_sign_negative()),
                    Extreme::Min => self < o || (self == o && !o.is_sign_negative() && self.is_sign_negative()),
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn value(self) -> Value {
                self.to_value()
            }
        }
    };
}
float_term!(f32);
float_term!(f64);

macro_rules! int_term {
    ($t:ty) => {
        impl Term for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn max(self, o: Self) -> Self {
                std::cmp::max(self, o)
            }
            fn min(self, o: Self) -> Self {
                std::cmp::min(self, o)
            }
            fn lowest() -> Self {
                <$t>::MIN
            }
            fn highest() -> Self {
                <$t>::MAX
            }
            fn is_nan(self) -> bool {
                false
            }
            fn beats(self, o: Self, e: Extreme) -> bool {
                match e {
                    Extreme::Max => self > o,
                    Extreme::Min => self < o,
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn value(self) -> Value {
                self.to_value()
            }
        }
    };
}
int_term!(i64);
int_term!(u64);

impl Term for bool {
    const ZERO: Self = false;
    const ONE: Self = true;
    fn add(self, o: Self) -> Self {
        self | o
    }
    fn mul(self, o: Self) -> Self {
        self & o
    }
    fn max(self, o: Self) -> Self {
        self | o
    }
    fn min(self, o: Self) -> Self {
        self & o
    }
    fn lowest() -> Self {
        false
    }
    fn highest() -> Self {
        true
    }
    fn is_nan(self) -> bool {
        false
    }
    fn beats(self, o: Self, e: Extreme) -> bool {
        match e {
            Extreme::Max => self & !o,
            Extreme::Min => !self & o,
        }
    }
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    fn value(self) -> Value {
        Value::Bool(self)
    }
}

macro_rules! complex_term {
    ($t:ty, $z:expr, $one:expr) => {
        impl Term for $t {
            const ZERO: Self = $z;
            const ONE: Self = $one;
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn max(self, _: Self) -> Self {
                unreachable!("complex extremes are declined")
            }
            fn min(self, _: Self) -> Self {
                unreachable!("complex extremes are declined")
            }
            fn lowest() -> Self {
                unreachable!("complex extremes are declined")
            }
            fn highest() -> Self {
                unreachable!("complex extremes are declined")
            }
            fn is_nan(self) -> bool {
                self.re.is_nan() || self.im.is_nan()
            }
            fn beats(self, _: Self, _: Extreme) -> bool {
                unreachable!("complex extremes are declined")
            }
            fn to_f64(self) -> f64 {
                unreachable!("complex terms have no Logsumexp or Moments")
            }
            fn value(self) -> Value {
                self.to_value()
            }
        }
    };
}
complex_term!(Complex32, Complex32::new(0.0, 0.0), Complex32::new(1.0, 0.0));
complex_term!(Complex64, Complex64::new(0.0, 0.0), Complex64::new(1.0, 0.0));

/// A chunk's (or several chunks') partial result.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Partial<T> {
    Sum(T),
    Prod(T),
    Ext(T),
    Arg(T, i64),
    Lse { m: f64, s: f64, nan: bool },
    Mom { n: f64, mean: f64, m2: f64, pinf: bool, ninf: bool, nan: bool },
}

crate::simd_fn! {
    /// The sum of a chunk in its documented association (8 lanes, each in order, then a fixed
    /// tree), built for the level: the same additions in the same order, so the same bits, where
    /// the wider builds take fewer load instructions, which keeps more cache lines in flight (over
    /// one huge-page array on the Zen 3 VM the AVX2 build read 10–20% faster than the SSE2 build).
    fn sum_chunk<T: Term>(simd: Simd, xs: &[T]) -> T {
        lanes_sum(xs)
    }
}

crate::simd_fn! {
    /// [`sum_chunk`] of each row of `terms` terms of `v` (at most [`CHUNK`]: each row one chunk)
    /// into `out`, one slot a row: one call for many short rows.
    fn sum_short_rows<T: Term>(simd: Simd, v: &[T], terms: usize, out: &mut [T]) {
        for (row, o) in v.chunks_exact(terms).zip(out) {
            *o = lanes_sum(row);
        }
    }
}

/// A chunk's sum in [`sum_chunk`]'s association: 8 lanes, each in order, then [`lanes_tree`].
#[inline(always)]
fn lanes_sum<T: Term>(xs: &[T]) -> T {
    let mut l = [T::ZERO; 8];
    let mut it = xs.chunks_exact(8);
    for c in &mut it {
        let c: &[T; 8] = c.try_into().expect("chunks of 8");
        for k in 0..8 {
            l[k] = l[k].add(c[k]);
        }
    }
    for (k, &x) in it.remainder().iter().enumerate() {
        l[k] = l[k].add(x);
    }
    lanes_tree(l)
}

/// A chunk's 8 lanes combined in the fixed tree of [`sum_chunk`].
#[inline(always)]
fn lanes_tree<T: Term>(l: [T; 8]) -> T {
    (l[0].add(l[1]).add(l[2].add(l[3]))).add(l[4].add(l[5]).add(l[6].add(l[7])))
}

crate::simd_fn! {
    /// The sums of four chunks of [`CHUNK`] terms (`q` holds them one after another), each in
    /// [`sum_chunk`]'s association, so the same bits as four calls of it: the four chunks' lanes
    /// are added side by side, four independent chains of additions in flight where one chunk's
    /// loop waits on one chain's latency (over a 64 MiB array on the Intel VM, one chain a core
    /// read at ~0.8 of the read limit, four at ~1.0).
    fn sum_chunks4<T: Term>(simd: Simd, q: &[T]) -> [T; 4] {
        let (mut la, mut lb, mut lc, mut ld) = ([T::ZERO; 8], [T::ZERO; 8], [T::ZERO; 8], [T::ZERO; 8]);
        let (a, rest) = q.split_at(CHUNK);
        let (b, rest) = rest.split_at(CHUNK);
        let (c, d) = rest.split_at(CHUNK);
        let quads = a.chunks_exact(8).zip(b.chunks_exact(8)).zip(c.chunks_exact(8)).zip(d.chunks_exact(8));
        for (((a, b), c), d) in quads {
            let a: &[T; 8] = a.try_into().expect("chunks of 8");
            let b: &[T; 8] = b.try_into().expect("chunks of 8");
            let c: &[T; 8] = c.try_into().expect("chunks of 8");
            let d: &[T; 8] = d.try_into().expect("chunks of 8");
            // one loop a chunk: each is one vector of lanes (lanes of several chunks in one
            // loop had the compiler shuffle them across vectors)
            for k in 0..8 {
                la[k] = la[k].add(a[k]);
            }
            for k in 0..8 {
                lb[k] = lb[k].add(b[k]);
            }
            for k in 0..8 {
                lc[k] = lc[k].add(c[k]);
            }
            for k in 0..8 {
                ld[k] = ld[k].add(d[k]);
            }
        }
        // the lanes leave the loop through an opaque copy: otherwise the compiler vectorises the
        // four trees across the chunks and transposes every step of the loop to match
        let [la, lb, lc, ld] = std::hint::black_box([la, lb, lc, ld]);
        [lanes_tree(la), lanes_tree(lb), lanes_tree(lc), lanes_tree(ld)]
    }
}

/// The sum of each run of [`CHUNK`] terms of `xs` (the last may be shorter), in order, into
/// `out` (one slot a run): whole quadruples of chunks side by side ([`sum_chunks4`]), the rest
/// one by one; the same bits as [`sum_chunk`] of each run.
fn chunk_sums<T: Term>(simd: Simd, xs: &[T], out: &mut [T]) {
    debug_assert_eq!(out.len(), xs.len().div_ceil(CHUNK));
    let mut quads = xs.chunks_exact(4 * CHUNK);
    let whole = 4 * (xs.len() / (4 * CHUNK));
    for (q, s) in (&mut quads).zip(out[..whole].chunks_exact_mut(4)) {
        s.copy_from_slice(&sum_chunks4(simd, q));
    }
    for (c, s) in quads.remainder().chunks(CHUNK).zip(&mut out[whole..]) {
        *s = sum_chunk(simd, c);
    }
}

pub(crate) fn chunk<T: Term>(simd: Simd, r: Reduction, xs: &[T], base: i64) -> Partial<T> {
    match r {
        Reduction::Sum => Partial::Sum(sum_chunk(simd, xs)),
        Reduction::Prod => Partial::Prod(xs[1..].iter().fold(xs[0], |a, &x| a.mul(x))),
        Reduction::Max => Partial::Ext(xs[1..].iter().fold(xs[0], |a, &x| a.max(x))),
        Reduction::Min => Partial::Ext(xs[1..].iter().fold(xs[0], |a, &x| a.min(x))),
        Reduction::Arg(e) => {
            let (mut best, mut at) = (xs[0], 0usize);
            for (i, &x) in xs.iter().enumerate().skip(1) {
                if best.is_nan() {
                    break;
                }
                if x.is_nan() || x.beats(best, e) {
                    best = x;
                    at = i;
                }
            }
            Partial::Arg(best, base + at as i64)
        }
        Reduction::Logsumexp => {
            let nan = xs.iter().any(|x| x.is_nan());
            let m = xs.iter().map(|x| x.to_f64()).fold(f64::NEG_INFINITY, f64::max);
            let s = if m.is_finite() { xs.iter().map(|x| (x.to_f64() - m).exp()).sum() } else { 0.0 };
            Partial::Lse { m, s, nan }
        }
        Reduction::Moments => {
            let (mut n, mut total, mut pinf, mut ninf, mut nan) = (0.0, 0.0, false, false, false);
            for x in xs.iter().map(|x| x.to_f64()) {
                if x.is_nan() {
                    nan = true;
                } else if x == f64::INFINITY {
                    pinf = true;
                } else if x == f64::NEG_INFINITY {
                    ninf = true;
                } else {
                    n += 1.0;
                    total += x;
                }
            }
            let mean = if n > 0.0 { total / n } else { 0.0 };
            let m2 = xs.iter().map(|x| x.to_f64()).filter(|x| x.is_finite()).map(|x| (x - mean) * (x - mean)).sum();
            Partial::Mom { n, mean, m2, pinf, ninf, nan }
        }
    }
}

/// Combines the partials of two runs of terms, `a` the earlier.
pub(crate) fn combine<T: Term>(r: Reduction, a: Partial<T>, b: Partial<T>) -> Partial<T> {
    match (a, b) {
        (Partial::Sum(x), Partial::Sum(y)) => Partial::Sum(x.add(y)),
        (Partial::Prod(x), Partial::Prod(y)) => Partial::Prod(x.mul(y)),
        (Partial::Ext(x), Partial::Ext(y)) => Partial::Ext(if r == Reduction::Max { x.max(y) } else { x.min(y) }),
        (Partial::Arg(x, i), Partial::Arg(y, j)) => {
            let Reduction::Arg(e) = r else { unreachable!("Arg partials") };
            // the earlier keeps ties; the first NaN wins
            if x.is_nan() || (!y.is_nan() && !y.beats(x, e)) {
                Partial::Arg(x, i)
            } else {
                Partial::Arg(y, j)
            }
        }
        (Partial::Lse { m: ma, s: sa, nan: na }, Partial::Lse { m: mb, s: sb, nan: nb }) => {
            let m = ma.max(mb);
            let s = if m.is_finite() { sa * (ma - m).exp() + sb * (mb - m).exp() } else { 0.0 };
            Partial::Lse { m, s, nan: na || nb }
        }
        (
            Partial::Mom { n: na, mean: ma, m2: qa, pinf: pa, ninf: xa, nan: za },
            Partial::Mom { n: nb, mean: mb, m2: qb, pinf: pb, ninf: xb, nan: zb },
        ) => {
            let n = na + nb;
            let (mean, m2) = if n == 0.0 {
                (0.0, 0.0)
            } else {
                let d = mb - ma;
                (ma + d * (nb / n), qa + qb + d * d * (na * nb / n))
            };
            Partial::Mom { n, mean, m2, pinf: pa || pb, ninf: xa || xb, nan: za || zb }
        }
        _ => unreachable!("one reduction's partials"),
    }
}

/// Combines partials in the fixed pairwise tree: the first half rounded up to a power of two, then
/// the rest.
fn tree<T: Term>(r: Reduction, ps: &[Partial<T>]) -> Option<Partial<T>> {
    tree_by(ps, &|a, b| combine(r, a, b))
}

/// The pairwise tree of [`tree`] over any values, combined by `f`; `None` for no value.
pub(crate) fn tree_by<P: Copy>(ps: &[P], f: &impl Fn(P, P) -> P) -> Option<P> {
    match ps.len() {
        0 => None,
        1 => Some(ps[0]),
        n => {
            let h = n.next_power_of_two() / 2;
            Some(f(tree_by(&ps[..h], f)?, tree_by(&ps[h..], f)?))
        }
    }
}

/// The result values (one or two) of `r` over terms whose partial is `p` (`None`: no term).
pub(crate) fn finish<T: Term>(r: Reduction, p: Option<Partial<T>>) -> (Value, Option<Value>) {
    let nan = Value::Float(f64::NAN);
    match (r, p) {
        (Reduction::Sum, None) => (T::ZERO.value(), None),
        (Reduction::Prod, None) => (T::ONE.value(), None),
        (Reduction::Max, None) => (T::lowest().value(), None),
        (Reduction::Min, None) => (T::highest().value(), None),
        (Reduction::Logsumexp, None) => (Value::Float(f64::NEG_INFINITY), None),
        (Reduction::Moments, None) => (nan, Some(nan)),
        (Reduction::Arg(_), None) => unreachable!("an Arg of no term is refused"),
        (_, Some(Partial::Sum(x) | Partial::Prod(x) | Partial::Ext(x))) => (x.value(), None),
        (_, Some(Partial::Arg(x, i))) => (x.value(), Some(Value::Int(i.into()))),
        (_, Some(Partial::Lse { m, s, nan: n })) => {
            let v = if n {
                f64::NAN
            } else if m.is_infinite() {
                m
            } else {
                m + s.ln()
            };
            (Value::Float(v), None)
        }
        (_, Some(Partial::Mom { n, mean, m2, pinf, ninf, nan: z })) => {
            if z || (n == 0.0 && !pinf && !ninf) {
                (nan, Some(nan))
            } else if pinf || ninf {
                let m = if pinf && ninf {
                    f64::NAN
                } else if pinf {
                    f64::INFINITY
                } else {
                    f64::NEG_INFINITY
                };
                (Value::Float(m), Some(nan))
            } else {
                (Value::Float(mean), Some(Value::Float((m2 / n).max(0.0))))
            }
        }
    }
}

/// A partial of any term type.
#[derive(Clone, Copy, Debug)]
enum AnyPartial {
    B(Partial<bool>),
    I(Partial<i64>),
    U(Partial<u64>),
    F(Partial<f32>),
    D(Partial<f64>),
    C(Partial<Complex32>),
    Z(Partial<Complex64>),
}

fn chunk_any(simd: Simd, r: Reduction, src: Src<'_>, base: i64) -> AnyPartial {
    match src {
        Src::B(v) => AnyPartial::B(chunk(simd, r, v, base)),
        Src::I(v) => AnyPartial::I(chunk(simd, r, v, base)),
        Src::U(v) => AnyPartial::U(chunk(simd, r, v, base)),
        Src::F(v) => AnyPartial::F(chunk(simd, r, v, base)),
        Src::D(v) => AnyPartial::D(chunk(simd, r, v, base)),
        Src::C(v) => AnyPartial::C(chunk(simd, r, v, base)),
        Src::Z(v) => AnyPartial::Z(chunk(simd, r, v, base)),
    }
}

/// The partials of `r` over each run of [`CHUNK`] terms of `src` (the last may be shorter),
/// appended to `out`; `base` is the first term's position. One dispatch on the type for the runs.
fn chunks_any(simd: Simd, r: Reduction, src: Src<'_>, base: i64, out: &mut Vec<AnyPartial>) {
    macro_rules! go {
        ($v:ident, $xs:expr) => {
            if matches!(r, Reduction::Sum) {
                sum_partials(simd, $xs, |x| out.push(AnyPartial::$v(Partial::Sum(x))))
            } else {
                out.extend(
                    $xs.chunks(CHUNK)
                        .enumerate()
                        .map(|(k, c)| AnyPartial::$v(chunk(simd, r, c, base + (k * CHUNK) as i64))),
                )
            }
        };
    }
    match src {
        Src::B(v) => go!(B, v),
        Src::I(v) => go!(I, v),
        Src::U(v) => go!(U, v),
        Src::F(v) => go!(F, v),
        Src::D(v) => go!(D, v),
        Src::C(v) => go!(C, v),
        Src::Z(v) => go!(Z, v),
    }
}

/// The sum of each run of [`CHUNK`] terms of `xs` (the last may be shorter), in order, given to
/// `push`: [`chunk_sums`] four chunks at a time.
fn sum_partials<T: Term>(simd: Simd, xs: &[T], mut push: impl FnMut(T)) {
    for q in xs.chunks(4 * CHUNK) {
        let mut s = [T::ZERO; 4];
        let k = q.len().div_ceil(CHUNK);
        chunk_sums(simd, q, &mut s[..k]);
        s[..k].iter().for_each(|&x| push(x));
    }
}

/// The sum of `xs` as a run of whole chunks from a chunk boundary (the last may be shorter): each
/// chunk summed, the chunks' partials combined by the pairwise tree, all typed. The same bits as
/// [`chunks_any`] then [`tree_any`], without a dispatch per chunk.
fn sum_run<T: Term>(simd: Simd, xs: &[T]) -> Partial<T> {
    const STACK: usize = 64;
    let k = xs.len().div_ceil(CHUNK);
    let add = |a: T, b: T| a.add(b);
    Partial::Sum(
        if k <= STACK {
            let mut ps = [T::ZERO; STACK];
            chunk_sums(simd, xs, &mut ps[..k]);
            tree_by(&ps[..k], &add)
        } else {
            let mut ps = vec![T::ZERO; k];
            chunk_sums(simd, xs, &mut ps);
            tree_by(&ps, &add)
        }
        .unwrap_or(T::ZERO),
    )
}

/// [`sum_run`] of any term type.
fn sum_run_any(simd: Simd, src: Src<'_>) -> AnyPartial {
    match src {
        Src::B(v) => AnyPartial::B(sum_run(simd, v)),
        Src::I(v) => AnyPartial::I(sum_run(simd, v)),
        Src::U(v) => AnyPartial::U(sum_run(simd, v)),
        Src::F(v) => AnyPartial::F(sum_run(simd, v)),
        Src::D(v) => AnyPartial::D(sum_run(simd, v)),
        Src::C(v) => AnyPartial::C(sum_run(simd, v)),
        Src::Z(v) => AnyPartial::Z(sum_run(simd, v)),
    }
}

/// The sums of consecutive rows of `terms` terms of `src` (a whole number of rows), each as
/// [`sum_run`] then finished, given to `f` with the row's position: one dispatch on the type for
/// every row, no partial leaving its row (the same bits as [`sum_run_any`] then [`finish_any`]).
fn sum_rows_any(simd: Simd, src: Src<'_>, terms: usize, mut f: impl FnMut(usize, (Value, Option<Value>))) {
    each_src!(src, v => sum_rows(simd, v, terms, &mut f))
}

/// [`sum_rows_any`] of one term type. Rows of whole chunks have their chunks summed across row
/// boundaries, four side by side, then each row's tree over its own chunks' sums (the same bits:
/// a chunk's sum does not depend on its neighbours).
fn sum_rows<T: Term>(simd: Simd, v: &[T], terms: usize, f: &mut impl FnMut(usize, (Value, Option<Value>))) {
    if terms > 0 && terms.is_multiple_of(CHUNK) && terms < 4 * CHUNK {
        let per = terms / CHUNK;
        let mut sums = vec![T::ZERO; v.len() / CHUNK];
        chunk_sums(simd, v, &mut sums);
        let add = |a: T, b: T| a.add(b);
        for (k, row) in sums.chunks(per).enumerate() {
            let sum = tree_by(row, &add).unwrap_or(T::ZERO);
            f(k, finish(Reduction::Sum, Some(Partial::Sum(sum))));
        }
        return;
    }
    if terms > 0 && terms <= CHUNK {
        // short rows, one chunk each: summed in one call (a row's sum_run is its chunk's sum)
        let mut sums = vec![T::ZERO; v.len() / terms];
        sum_short_rows(simd, v, terms, &mut sums);
        for (k, &sum) in sums.iter().enumerate() {
            f(k, finish(Reduction::Sum, Some(Partial::Sum(sum))));
        }
        return;
    }
    for (k, row) in v.chunks(terms).enumerate() {
        f(k, finish(Reduction::Sum, Some(sum_run(simd, row))));
    }
}

/// The pairwise tree of `ps` (all of one term type), as one partial; `None` for no partial.
fn tree_any(r: Reduction, ps: impl Iterator<Item = AnyPartial>) -> Option<AnyPartial> {
    let mut ps = ps.peekable();
    macro_rules! go {
        ($v:ident) => {{
            let typed: Vec<_> =
                ps.map(|p| if let AnyPartial::$v(p) = p { p } else { unreachable!("one type") }).collect();
            tree(r, &typed).map(AnyPartial::$v)
        }};
    }
    match ps.peek()? {
        AnyPartial::B(_) => go!(B),
        AnyPartial::I(_) => go!(I),
        AnyPartial::U(_) => go!(U),
        AnyPartial::F(_) => go!(F),
        AnyPartial::D(_) => go!(D),
        AnyPartial::C(_) => go!(C),
        AnyPartial::Z(_) => go!(Z),
    }
}

fn finish_any(r: Reduction, ty: Ty, ps: impl Iterator<Item = AnyPartial>) -> (Value, Option<Value>) {
    macro_rules! go {
        ($v:ident, $t:ty) => {{
            let typed: Vec<Partial<$t>> =
                ps.map(|p| if let AnyPartial::$v(p) = p { p } else { unreachable!("one type") }).collect();
            finish::<$t>(r, tree(r, &typed))
        }};
    }
    match ty {
        Ty::Bool => go!(B, bool),
        Ty::I64 => go!(I, i64),
        Ty::U64 => go!(U, u64),
        Ty::F32 => go!(F, f32),
        Ty::F64 => go!(D, f64),
        Ty::C64 => go!(C, Complex32),
        Ty::C128 => go!(Z, Complex64),
    }
}

/// Writes `v` as element `at` of a C-contiguous destination of dtype `d`.
///
/// # Safety
/// An exclusive claim on the destination is held and `at` is one of its positions.
pub(crate) unsafe fn store_value(d: Dtype, p: Ptr, at: isize, v: Value) {
    macro_rules! go {
        ($t:ty) => {
            // SAFETY: the caller's contract.
            unsafe { <$t>::store(p.at(d, at), <$t>::from_value(v)) }
        };
    }
    dispatch_dtype!(d, go)
}

struct Job<'a> {
    bound: &'a Bound<'a>,
    reductions: &'a [Reduction],
    /// Per reduction, its destinations: (address, offset, dtype).
    outs: Vec<Vec<(Ptr, isize, Dtype)>>,
    terms: usize,
    /// The SIMD level the chunk loops run.
    simd: Simd,
}

impl Job<'_> {
    /// Appends the partials of every reduction over terms `base..base + len` of one output, which
    /// lie at `off..off + len` of the block of `block` flat indices from `start` just evaluated.
    #[allow(clippy::too_many_arguments)]
    fn partials(
        &self,
        regs: &[Reg],
        (start, block): (usize, usize),
        off: usize,
        len: usize,
        base: usize,
        out: &mut Vec<AnyPartial>,
    ) {
        for (i, &r) in self.reductions.iter().enumerate() {
            let src = self.bound.output(regs, i, start, block).slice(off..off + len);
            out.push(chunk_any(self.simd, r, src, base as i64));
        }
    }

    /// Finishes output `o` from its partials (chunk-major: every reduction's partial of chunk 0,
    /// then of chunk 1, …) and writes it.
    ///
    /// # Safety
    /// The door's claims are held; no other task writes output `o`.
    unsafe fn write(&self, o: usize, flat: &[AnyPartial]) {
        let n = self.reductions.len();
        for (i, &r) in self.reductions.iter().enumerate() {
            let values = finish_any(r, self.bound.output_ty(i), flat.iter().skip(i).step_by(n).copied());
            // SAFETY: the caller's contract.
            unsafe { self.store(o, i, values) };
        }
    }

    /// Writes reduction `i`'s result values (one or two) for output `o`.
    ///
    /// # Safety
    /// The door's claims are held; no other task writes output `o`.
    unsafe fn store(&self, o: usize, i: usize, (v, w): (Value, Option<Value>)) {
        let dsts = &self.outs[i];
        // SAFETY: the caller's contract.
        unsafe {
            store_value(dsts[0].2, dsts[0].0, dsts[0].1 + o as isize, v);
            if let (Some(w), Some(&(p, off, d))) = (w, dsts.get(1)) {
                store_value(d, p, off + o as isize, w);
            }
        }
    }

    /// Output `o`'s partials for chunks `j0..j1`, evaluated as one block.
    ///
    /// # Safety
    /// The door's claims are held.
    unsafe fn chunks(&self, regs: &mut [Reg], o: usize, j0: usize, j1: usize, out: &mut Vec<AnyPartial>) {
        let start = j0 * CHUNK;
        let end = (j1 * CHUNK).min(self.terms);
        // SAFETY: the caller's contract.
        unsafe { self.bound.eval(o * self.terms + start, end - start, regs) };
        let n = self.reductions.len();
        if n == 1 {
            let src = self.bound.output(regs, 0, o * self.terms + start, end - start);
            chunks_any(self.simd, self.reductions[0], src, start as i64, out);
            return;
        }
        // chunk-major: every reduction's partial of chunk j0, then of j0 + 1, …
        let mut per: Vec<Vec<AnyPartial>> = Vec::with_capacity(n);
        for (i, &r) in self.reductions.iter().enumerate() {
            let mut v = Vec::with_capacity(j1 - j0);
            chunks_any(
                self.simd,
                r,
                self.bound.output(regs, i, o * self.terms + start, end - start),
                start as i64,
                &mut v,
            );
            per.push(v);
        }
        for k in 0..j1 - j0 {
            out.extend(per.iter().map(|v| v[k]));
        }
    }
}

/// Terms one task of a plain sum over many rows reads at least (whole rows).
const ROW_TASK: usize = 1 << 16;

/// Tasks a thread a plain sum is cut into at least: fewer, longer runs of memory than tasks of
/// [`ROW_TASK`] terms alone would give (over 64 MiB on the Intel VM the sums read ~3% faster so),
/// and still enough to even out the threads.
const TASKS_A_THREAD: usize = 4;

/// Chunks evaluated together (the association stays per chunk).
const GROUP: usize = 4;
/// Chunks whose partials one task combines before they leave it: a power of two, so that the
/// pairwise tree over every output's chunks splits only at its multiples, and the tree over these
/// blocks' partials is the tree over the chunks' (the bits do not depend on it).
const BLOCK_CHUNKS: usize = 16;

pub(crate) fn reduce(
    par: &std::sync::Arc<super::par::Par>,
    prog: &Prog,
    shape: &[usize],
    axes: &[usize],
    reductions: &[Reduction],
    dsts: &[&dyn Operand],
    loads: &[Load<'_>],
) -> Answer {
    let dt: Vec<_> = dsts.iter().map(|d| d.dtype()).collect();
    let lt: Vec<_> = loads.iter().map(|l| l.operand().dtype()).collect();
    if let Some((answer, _)) = reduce_refusal(prog, shape.len(), reductions, &dt, &lt) {
        return answer;
    }
    let mut red = axes.to_vec();
    red.sort_unstable();
    red.dedup();
    if red.len() != axes.len() || red.iter().any(|&a| a >= shape.len()) {
        return Answer::ShapeMismatch;
    }
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !red.contains(a)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let (prog, shape, reductions, reads) = (prog.clone(), shape.to_vec(), reductions.to_vec(), reads(loads));
    let loads: Vec<&dyn Operand> = loads.iter().map(Load::operand).collect();
    let read = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).unwrap_or(usize::MAX);
    // inline: every loop below in order on the calling thread
    let (inline, threads, simd) = (par.inline(Work::Reduce, read), par.threads(), par.simd());
    through_door(par, "reduce", Some((Work::Reduce, read)), dsts, &loads, move |dsts, loads, run| {
        let (prog, shape, reductions) = (&prog, &shape[..], &reductions[..]);
        if dsts.iter().any(|d| d.layout().shape() != out_shape) {
            return Answer::ShapeMismatch;
        }
        if dsts.iter().any(|d| !d.layout().is_contiguous()) {
            return Answer::Declined;
        }
        let complex_extreme = reductions.iter().enumerate().any(|(i, r)| {
            matches!(r, Reduction::Max | Reduction::Min | Reduction::Arg(_)) && prog.ty(prog.outputs[i]).is_complex()
        });
        if complex_extreme {
            return Answer::Declined;
        }
        let perm: Vec<usize> = kept.iter().chain(&red).copied().collect();
        let bound = match Bound::new(prog, shape, &perm, loads, &reads) {
            Ok(b) => b,
            Err(a) => return a,
        };
        let (outputs, terms) =
            (extent_product(out_shape.iter().copied()), extent_product(red.iter().map(|&a| shape[a])));
        if terms == 0 && outputs > 0 && reductions.iter().any(|r| matches!(r, Reduction::Arg(_))) {
            return Answer::ShapeMismatch;
        }
        if !run {
            return Answer::Done;
        }
        let mut outs: Vec<Vec<(Ptr, isize, Dtype)>> = Vec::with_capacity(reductions.len());
        let mut k = 0;
        for r in reductions {
            outs.push(
                dsts[k..k + r.destinations()].iter().map(|d| (Ptr::of(*d), d.layout().offset(), d.dtype())).collect(),
            );
            k += r.destinations();
        }
        if let Some(c) = super::columns::Columns::of(
            &bound,
            kept.len(),
            reductions,
            outs.first().map_or(&[][..], Vec::as_slice),
            if inline { 1 } else { threads },
        ) {
            // SAFETY: the door holds the claims; the destination is written by this call alone.
            unsafe { c.run(inline) };
            return Answer::Done;
        }
        let job = Job { bound: &bound, reductions, outs, terms, simd };
        if terms == 0 {
            // SAFETY: the door holds the claims; each output is written once.
            (0..outputs).for_each(|o| unsafe { job.write(o, &[]) });
        } else if terms <= CHUNK {
            // Whole outputs per block: each output is one chunk.
            let per = (1024 / terms).max(1);
            for_each(inline, outputs.div_ceil(per), 1, |b| {
                let mut regs = bound.registers(per * terms);
                let (o0, o1) = (b * per, ((b + 1) * per).min(outputs));
                // SAFETY: the door holds the claims; this task writes outputs o0..o1 alone.
                unsafe {
                    bound.eval(o0 * terms, (o1 - o0) * terms, &mut regs);
                    if reductions == [Reduction::Sum] {
                        // one sum: the block's rows summed typed, one dispatch (the same bits as
                        // each output's chunk partial finished)
                        let rows = bound.output(&regs, 0, o0 * terms, (o1 - o0) * terms);
                        sum_rows_any(simd, rows, terms, |k, values| job.store(o0 + k, 0, values));
                        return;
                    }
                    let mut ps = Vec::with_capacity(reductions.len());
                    for o in o0..o1 {
                        ps.clear();
                        job.partials(&regs, (o0 * terms, (o1 - o0) * terms), (o - o0) * terms, terms, 0, &mut ps);
                        job.write(o, &ps);
                    }
                }
            });
        } else {
            let chunks = terms.div_ceil(CHUNK);
            let groups = chunks.div_ceil(GROUP);
            let span = |g: usize| (g * GROUP, ((g + 1) * GROUP).min(chunks));
            // one plain sum of an operand read in place: typed runs of chunks, no evaluation
            let plain_sum = reductions == [Reduction::Sum] && bound.in_place(0);
            if outputs >= 2 * threads && plain_sum {
                // whole rows per task, ROW_TASK terms or more: each task one run of memory, one
                // type dispatch, no allocation per row (over 4096 rows of 4096: 0.931 of the plain
                // read loop's speed, against 0.915 with a task and a partial vector per row)
                let per = (ROW_TASK / terms).max(outputs / (TASKS_A_THREAD * threads)).max(1);
                for_each(inline, outputs.div_ceil(per), 1, |b| {
                    let (o0, o1) = (b * per, ((b + 1) * per).min(outputs));
                    let rows = bound.output(&[], 0, o0 * terms, (o1 - o0) * terms);
                    // SAFETY: the door holds the claims; this task writes outputs o0..o1 alone.
                    sum_rows_any(simd, rows, terms, |k, values| unsafe { job.store(o0 + k, 0, values) });
                });
            } else if outputs >= 2 * threads {
                for_each_init(
                    inline,
                    outputs,
                    1,
                    || (bound.registers(CHUNK * GROUP), Vec::with_capacity(chunks * reductions.len())),
                    // SAFETY: the door holds the claims; this task writes output o alone.
                    |(regs, ps), o| unsafe {
                        ps.clear();
                        for g in 0..groups {
                            let (j0, j1) = span(g);
                            job.chunks(regs, o, j0, j1, ps);
                        }
                        job.write(o, ps);
                    },
                );
            } else {
                // every block of BLOCK_CHUNKS chunks combined by one task into its own slots of
                // one short vector: an indexed loop, as even as a plain parallel loop over the terms
                let n = reductions.len();
                let blocks = chunks.div_ceil(BLOCK_CHUNKS);
                let mut ps = vec![AnyPartial::B(Partial::Sum(false)); blocks * n];
                let block_terms = BLOCK_CHUNKS * CHUNK;
                for o in 0..outputs {
                    if plain_sum {
                        let one = |(b, slot): (usize, &mut AnyPartial)| {
                            let (lo, hi) = (b * block_terms, ((b + 1) * block_terms).min(terms));
                            *slot = sum_run_any(simd, bound.output(&[], 0, o * terms + lo, hi - lo));
                        };
                        if inline {
                            ps.iter_mut().enumerate().for_each(one);
                        } else {
                            let min = (blocks / (TASKS_A_THREAD * threads)).max(2);
                            ps.par_iter_mut().with_min_len(min).enumerate().for_each(one);
                        }
                        // SAFETY: the door holds the claims; output o is written once.
                        unsafe { job.write(o, &ps) };
                        continue;
                    }
                    let init = || (bound.registers(CHUNK * GROUP), Vec::with_capacity(BLOCK_CHUNKS * n));
                    // SAFETY: the door holds the claims; chunks only read.
                    let block = |(regs, out): &mut (Vec<Reg>, Vec<AnyPartial>),
                                 (b, slots): (usize, &mut [AnyPartial])| unsafe {
                        out.clear();
                        let end = ((b + 1) * BLOCK_CHUNKS).min(chunks);
                        for j0 in (b * BLOCK_CHUNKS..end).step_by(GROUP) {
                            job.chunks(regs, o, j0, (j0 + GROUP).min(end), out);
                        }
                        for (i, (&r, slot)) in reductions.iter().zip(slots).enumerate() {
                            *slot = tree_any(r, out.iter().skip(i).step_by(n).copied()).expect("a block has chunks");
                        }
                    };
                    if inline {
                        let mut state = init();
                        ps.chunks_mut(n).enumerate().for_each(|x| block(&mut state, x));
                    } else {
                        ps.par_chunks_mut(n).with_min_len(2).enumerate().for_each_init(init, block);
                    }
                    // SAFETY: as above; output o is written once.
                    unsafe { job.write(o, &ps) };
                }
            }
        }
        Answer::Done
    })
}

#[cfg(test)]
#[path = "reduce_tests.rs"]
mod tests;
