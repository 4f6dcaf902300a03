//! The scan kernel: every reduction along an axis (Sum, Prod, Max, Min, Logsumexp, Moments,
//! Arg), from an optional carry, in blocks of [`BLOCK`] terms (see the library's docs for the
//! association and its bound).

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};
use rayon::prelude::*;

use super::eval::Ptr;
use super::lanes::Lanes;
use super::reduce::{chunk, combine, finish, store_value, Partial, Term};
use super::reg::dispatch_dtype;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::dtype::convert::{f32_to_bf16, f32_to_f16};
use crate::kernels::{scan_refusal, Reduction};
use crate::{Answer, Dtype, Element, Simd};

/// Terms a block holds: results of block k continue from the combination of the totals of the
/// blocks before it.
pub(crate) const BLOCK: usize = 4096;

/// Blocks whose chains of combinations a task runs side by side.
const WAYS: usize = 8;

/// An element type a scan reads and writes: its carrier, and its carry's element type (the
/// contract's carrier dtype: `f32` for halves, the type itself otherwise).
pub(crate) trait Scan: Element {
    type C: Term;
    type K: Element;
    fn up(self) -> Self::C;
    fn down(c: Self::C) -> Self;
    fn carry(k: Self::K) -> Self::C;
}

macro_rules! scan_same {
    ($t:ty, $c:ty) => {
        impl Scan for $t {
            type C = $c;
            type K = $t;
            #[inline(always)]
            fn up(self) -> $c {
                self as $c
            }
            #[inline(always)]
            fn down(c: $c) -> $t {
                c as $t
            }
            fn carry(k: $t) -> $c {
                k as $c
            }
        }
    };
}
scan_same!(i8, i64);
scan_same!(i16, i64);
scan_same!(i32, i64);
scan_same!(i64, i64);
scan_same!(u8, u64);
scan_same!(u16, u64);
scan_same!(u32, u64);
scan_same!(u64, u64);
scan_same!(f32, f32);
scan_same!(f64, f64);

macro_rules! scan_self {
    ($t:ty) => {
        impl Scan for $t {
            type C = $t;
            type K = $t;
            fn up(self) -> $t {
                self
            }
            fn down(c: $t) -> $t {
                c
            }
            fn carry(k: $t) -> $t {
                k
            }
        }
    };
}
scan_self!(bool);
scan_self!(Complex32);
scan_self!(Complex64);

macro_rules! scan_half {
    ($t:ty, $down:expr) => {
        impl Scan for $t {
            type C = f32;
            type K = f32;
            #[inline(always)]
            fn up(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn down(c: f32) -> $t {
                $down(c)
            }
            fn carry(k: f32) -> f32 {
                k
            }
        }
    };
}
scan_half!(f16, f32_to_f16);
scan_half!(bf16, f32_to_bf16);
scan_half!(crate::dtype::fp8::F8E4M3, crate::dtype::fp8::F8E4M3::from_f32);
scan_half!(crate::dtype::fp8::F8E5M2, crate::dtype::fp8::F8E5M2::from_f32);

pub(crate) fn scan(
    par: &std::sync::Arc<super::par::Par>,
    reduction: Reduction,
    axis: usize,
    carry: Option<&dyn Operand>,
    dsts: &[&dyn Operand],
    src: &dyn Operand,
) -> Answer {
    let rank = src.layout().rank();
    let dt: Vec<Dtype> = dsts.iter().map(|d| d.dtype()).collect();
    if let Some((a, _)) = scan_refusal(reduction, rank, axis, &dt, carry.map(|c| c.dtype()), src.dtype()) {
        return a;
    }
    let mut read: Vec<&dyn Operand> = vec![src];
    read.extend(carry);
    let simd = par.simd();
    through_door(par, "scan", None, dsts, &read, move |w, r, execute| {
        let (src, carry) = (r[0], r.get(1).copied());
        let shape = src.layout().shape();
        if w.iter().any(|d| d.layout().shape() != shape) {
            return Answer::ShapeMismatch;
        }
        if carry.is_some_and(|c| crate::shape::carry(shape, axis).ok().as_deref() != Some(c.layout().shape())) {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        macro_rules! go {
            ($t:ty) => {
                run::<$t>(simd, reduction, axis, carry, w, src)
            };
        }
        dispatch_dtype!(src.dtype(), go);
        Answer::Done
    })
}

fn run<T: Scan>(
    simd: Simd,
    r: Reduction,
    axis: usize,
    carry: Option<&dyn Operand>,
    dsts: &[&dyn Operand],
    src: &dyn Operand,
) {
    let (dp, size) = (Ptr::of(dsts[0]), T::DTYPE.size() as isize);
    // the door holds an exclusive claim on each destination; `at` is a position of its checked
    // layout, written by the task that owns its lane (or block) alone
    let put = move |at: &[isize; 1], v: T::C| {
        // SAFETY: as said above.
        unsafe { T::store(dp.byte(at[0] * size), T::down(v)) }
    };
    // the combination a generic function item (never a pointer), so that each walk inlines it
    macro_rules! plain {
        ($f:expr, $start:expr) => {
            lanes::<T, _, 1>(
                axis,
                carry,
                dsts,
                src,
                &Walk { term: |x: T::C, _k: usize| x, f: $f, carry: T::carry, start: $start, put },
            )
        };
    }
    match r {
        Reduction::Sum => plain!(<T::C as Term>::add, Some(<T::C as Term>::ZERO)),
        Reduction::Prod => plain!(<T::C as Term>::mul, None),
        Reduction::Max => plain!(<T::C as Term>::max, None),
        Reduction::Min => plain!(<T::C as Term>::min, None),
        Reduction::Logsumexp => lanes::<T, _, 1>(axis, carry, dsts, src, &finished::<T, 1>(simd, r, dsts)),
        Reduction::Moments | Reduction::Arg(_) => {
            lanes::<T, _, 2>(axis, carry, dsts, src, &finished::<T, 2>(simd, r, dsts))
        }
    }
}

/// The walk of a `Logsumexp`, `Moments` or `Arg` scan into its `N` destinations: the reduction's
/// own partials, one a term, combined as blocks of terms combine them, and finished at every
/// result (its special values, and its bits for the terms so far).
#[allow(clippy::type_complexity)]
fn finished<T: Scan, const N: usize>(
    simd: Simd,
    r: Reduction,
    dsts: &[&dyn Operand],
) -> Walk<
    Partial<T::C>,
    impl Fn(T::C, usize) -> Partial<T::C> + Send + Sync + Copy,
    impl Fn(Partial<T::C>, Partial<T::C>) -> Partial<T::C> + Send + Sync + Copy,
    impl Fn(T::K) -> Partial<T::C> + Send + Sync + Copy,
    impl Fn(&[isize; N], Partial<T::C>) + Send + Sync + Copy,
> {
    let outs: [(Ptr, Dtype); N] = std::array::from_fn(|i| (Ptr::of(dsts[i]), dsts[i].dtype()));
    Walk {
        term: move |x: T::C, k: usize| chunk(simd, r, &[x], k as i64),
        f: move |a, b| combine(r, a, b),
        carry: move |c: T::K| chunk(simd, r, &[T::carry(c)], 0),
        start: None,
        put: move |at: &[isize; N], p: Partial<T::C>| {
            let (v, w) = finish(r, Some(p));
            // SAFETY: the door holds an exclusive claim on each destination; `at` holds positions
            // of their checked layouts, this lane's own elements, written by its task alone.
            unsafe {
                store_value(outs[0].1, outs[0].0, at[0], v);
                if let (Some(w), Some(&(p, d))) = (w, outs.get(1)) {
                    store_value(d, p, at[N - 1], w);
                }
            }
        },
    }
}

/// How a scan walks its terms: each term's state (from its value in the carrier and its position
/// along the lane), how two states combine (the earlier first), a carry's state, a `Sum`'s start,
/// and how a result's state is written at the destinations' positions.
struct Walk<S, Tm, F, K, P> {
    term: Tm,
    f: F,
    carry: K,
    start: Option<S>,
    put: P,
}

/// Scans every lane along `axis`: lanes in parallel where there are enough, else each lane's
/// blocks in parallel (the same combinations either way: the same bits).
fn lanes<T, S, const N: usize>(
    axis: usize,
    carry: Option<&dyn Operand>,
    dsts: &[&dyn Operand],
    src: &dyn Operand,
    walk: &Walk<
        S,
        impl Fn(T::C, usize) -> S + Send + Sync + Copy,
        impl Fn(S, S) -> S + Send + Sync + Copy,
        impl Fn(T::K) -> S + Send + Sync + Copy,
        impl Fn(&[isize; N], S) + Send + Sync + Copy,
    >,
) where
    T: Scan,
    S: Copy + Send + Sync,
{
    // The walk's functions, and every value the loops below read, are copied into the closures
    // that use them (`move`): a closure's own values lie behind its `&self`, which the compiler
    // knows no store changes during the call, so they stay in registers through the stores
    // through raw pointers; behind a second reference they were reloaded at every store (scans
    // 15-30% slower).
    let (term, f, put_at, carry_of, first) = (walk.term, walk.f, walk.put, walk.carry, walk.start);
    let sl = Lanes::new(src.layout(), axis);
    let dls: [Lanes; N] = std::array::from_fn(|i| Lanes::new(dsts[i].layout(), axis));
    let strides: [isize; N] = std::array::from_fn(|i| dls[i].stride());
    let cl = carry.map(|c| Lanes::points(c.layout()));
    let (sp, cp) = (Ptr::of(src), carry.map(Ptr::of));
    let size = T::DTYPE.size() as isize;
    let ksize = T::K::DTYPE.size() as isize;
    let n = sl.len();
    let one = |lane: usize, split: bool| {
        // SAFETY (every load below): the door holds the claims for the call; positions come from
        // the checked layouts of the operands, lanes and indices in range.
        let start = cl.as_ref().map(|c| c.start(lane));
        // SAFETY: under the call's claims, at positions of the checked layouts (see above).
        let c0: Option<S> = start.zip(cp).map(|(s, p)| carry_of(unsafe { T::K::load(p.byte(s * ksize)) }));
        let c0 = c0.or(first);
        let (s0, step) = (sl.start(lane), sl.stride());
        let d0: [isize; N] = std::array::from_fn(|i| dls[i].start(lane));
        // SAFETY: under the call's claims, at positions of the checked layouts (see above).
        let get = move |k: usize| term(unsafe { T::load(sp.byte((s0 + k as isize * step) * size)).up() }, k);
        // each destination's position of result k
        let put = move |k: usize, v: S| put_at(&std::array::from_fn(|i| d0[i] + k as isize * strides[i]), v);
        let blocks = n.div_ceil(BLOCK);
        if blocks == 0 {
            return; // an empty lane: nothing to write
        }
        // a block's total, from its first term
        let total = move |b: usize| {
            let (lo, hi) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
            (lo + 1..hi).fold(get(lo), |a, k| f(a, get(k)))
        };
        // the totals of WAYS whole blocks from block `b0`, their chains interleaved (the same
        // combinations as `total`'s, run side by side: the adds' latency hidden)
        let totals_of = move |b0: usize| -> [S; WAYS] {
            let mut acc: [S; WAYS] = std::array::from_fn(|w| get((b0 + w) * BLOCK));
            for j in 1..BLOCK {
                for (w, a) in acc.iter_mut().enumerate() {
                    *a = f(*a, get((b0 + w) * BLOCK + j));
                }
            }
            acc
        };
        // a block's results, from what the blocks before it combine to
        let results = move |b: usize, before: Option<S>| {
            let mut acc = before;
            for k in b * BLOCK..((b + 1) * BLOCK).min(n) {
                let x = get(k);
                let v = match acc {
                    Some(a) => f(a, x),
                    None => x,
                };
                put(k, v);
                acc = Some(v);
            }
        };
        // the results of WAYS whole blocks from block `b0`, interleaved as `totals_of`
        let results_of = move |b0: usize, before: &[Option<S>]| {
            let mut acc: [S; WAYS] = std::array::from_fn(|w| {
                let k = (b0 + w) * BLOCK;
                let x = get(k);
                let v = match before[w] {
                    Some(a) => f(a, x),
                    None => x,
                };
                put(k, v);
                v
            });
            for j in 1..BLOCK {
                for (w, a) in acc.iter_mut().enumerate() {
                    let k = (b0 + w) * BLOCK + j;
                    *a = f(*a, get(k));
                    put(k, *a);
                }
            }
        };
        if blocks == 1 {
            results(0, c0);
            return;
        }
        // the totals of blocks 0..blocks − 1 (each whole), in groups of WAYS, then one by one;
        // a lane split over the threads runs groups only where they keep every thread busy
        let threads = rayon::current_num_threads();
        let grouped = |g: usize| if split && g < threads { 0 } else { g };
        let groups = grouped((blocks - 1) / WAYS);
        let totals: Vec<S> = if split {
            let mut t: Vec<S> = (0..groups).into_par_iter().flat_map_iter(|g| totals_of(g * WAYS)).collect();
            t.par_extend((groups * WAYS..blocks - 1).into_par_iter().map(total));
            t
        } else {
            let mut t: Vec<S> = (0..groups).flat_map(|g| totals_of(g * WAYS)).collect();
            t.extend((groups * WAYS..blocks - 1).map(total));
            t
        };
        // what the blocks before each block combine to: the carry (or nothing), then the totals
        let mut before = Vec::with_capacity(blocks);
        let mut c = c0;
        before.push(c);
        for t in &totals {
            c = Some(match c {
                Some(c) => f(c, *t),
                None => *t,
            });
            before.push(c);
        }
        // results of whole blocks in groups of WAYS, the rest (the last, maybe short) one by one
        let whole = n / BLOCK;
        let groups = grouped(whole / WAYS);
        if split {
            (0..groups).into_par_iter().for_each(|g| results_of(g * WAYS, &before[g * WAYS..]));
            (groups * WAYS..blocks).into_par_iter().for_each(|b| results(b, before[b]));
        } else {
            (0..groups).for_each(|g| results_of(g * WAYS, &before[g * WAYS..]));
            (groups * WAYS..blocks).for_each(|b| results(b, before[b]));
        }
    };
    let count = sl.count();
    if count >= 2 * rayon::current_num_threads() || n <= BLOCK {
        (0..count).into_par_iter().with_min_len(16).for_each(|lane| one(lane, false));
    } else {
        (0..count).for_each(|lane| one(lane, true));
    }
}
