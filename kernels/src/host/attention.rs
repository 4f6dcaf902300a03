//! The attention kernel: online (flash-style) softmax over tiles of keys, never holding more than
//! a tile of scores; dense and paged keys, grouped query heads, causal masks and lengths.
//!
//! For each lead index and key head, the visible keys (before the lead's length, on a page of the
//! pool) are packed once, widened to the accumulator, with their positions. Each task takes
//! [`QB`] query rows of one query head: `S = s × (Q Kᵀ)` over a tile of [`KB`] keys by `faer`'s
//! product, the causal mask applied, then per row the running maximum `m`, the sum `l` of
//! `exp(S − m)` and `O += P V`, rescaled by `exp(m_old − m)` when the maximum grows. At the end
//! `o = O / l`, `lse = m + ln l`; a row of no visible key has `o = +0`, `lse = −∞`.

use rayon::prelude::*;

use super::attention_rows::RowOps;
use super::attention_scores::{ScoreProg, Tile};
use super::eval::Ptr;
use super::reg::{Reg, Src};
use super::{row_destinations, through_door};
use crate::door::Operand;
use crate::dtype::fp8::{F8E4M3, F8E5M2};
use crate::kernels::{attention_refusal, scores_refusal, Attention, Kv, Scores};
use crate::shape::KvShape;
use crate::{Answer, Dtype, Element, Simd};

/// Query rows a task takes.
pub(crate) const QB: usize = 256;
/// Keys a tile holds.
pub(crate) const KB: usize = 128;

/// The accumulator: `f32` or `f64`.
pub(super) trait Acc: faer::traits::ComplexField + Copy + Send + Sync + PartialOrd + 'static {
    const ZERO: Self;
    const NEG_INF: Self;
    const INF: Self;
    const NAN: Self;
    fn of(x: f64) -> Self;
    fn fexp(self) -> Self;
    fn fln(self) -> Self;
    fn read(d: Dtype, p: *const u8) -> Self;
    /// Appends the `n` elements of dtype `d` at `at(0)`, `at(1)`, … to `out`, widened: one copy
    /// where they are contiguous and of the accumulator's own dtype.
    fn read_row(out: &mut Vec<Self>, d: Dtype, stride: isize, n: usize, at: impl Fn(usize) -> *const u8);
    fn fmax(self, o: Self) -> Self;
    fn fmul(self, o: Self) -> Self;
    fn fadd(self, o: Self) -> Self;
    fn fsub(self, o: Self) -> Self;
    fn fdiv(self, o: Self) -> Self;
    fn to_f64(self) -> f64;
    fn nan(self) -> bool;
    /// The greatest of `s·x` over `row` (NaNs skipped; −∞ for none).
    fn max_scaled(simd: Simd, row: &[Self], s: Self) -> Self;
    /// Replaces each `x` of `row` by `exp(s·x − m)`; answers their sum, in 16 lanes
    /// ([`attention_rows`](super::attention_rows)).
    fn exp_row(simd: Simd, row: &mut [Self], s: Self, m: Self) -> Self;
    /// A register of these values.
    fn reg(xs: Vec<Self>) -> Reg;
    /// Element `i` of a register of the accumulator's type.
    fn at(src: &Src<'_>, i: usize) -> Self;
}

macro_rules! acc {
    ($t:ty, $v:ident) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            const INF: Self = <$t>::INFINITY;
            const NAN: Self = <$t>::NAN;
            fn of(x: f64) -> Self {
                x as $t
            }
            fn fexp(self) -> Self {
                <$t>::exp(self)
            }
            fn fln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn read(d: Dtype, p: *const u8) -> Self {
                // SAFETY: the caller passes the address of an element of dtype `d` under a claim.
                unsafe {
                    match d {
                        Dtype::F16 => <half::f16 as Element>::load(p).to_f64() as $t,
                        Dtype::BF16 => <half::bf16 as Element>::load(p).to_f64() as $t,
                        Dtype::F8E4M3 => <F8E4M3 as Element>::load(p).to_f32() as $t,
                        Dtype::F8E5M2 => <F8E5M2 as Element>::load(p).to_f32() as $t,
                        Dtype::F32 => <f32 as Element>::load(p) as $t,
                        Dtype::F64 => <f64 as Element>::load(p) as $t,
                        d => unreachable!("attention_refusal refuses {d}"),
                    }
                }
            }
            #[inline(always)]
            fn read_row(out: &mut Vec<Self>, d: Dtype, stride: isize, n: usize, at: impl Fn(usize) -> *const u8) {
                if stride == 1 && d == <$t as Element>::DTYPE && n > 0 {
                    // SAFETY: the caller's `n` contiguous elements of this dtype from `at(0)`, aligned
                    // (a checked layout's), under the call's claims.
                    out.extend_from_slice(unsafe { std::slice::from_raw_parts(at(0).cast::<$t>(), n) });
                } else {
                    out.extend((0..n).map(|i| Self::read(d, at(i))));
                }
            }
            #[inline(always)]
            fn fmax(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            #[inline(always)]
            fn fmul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn fadd(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn fsub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn fdiv(self, o: Self) -> Self {
                self / o
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn nan(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn max_scaled(simd: Simd, row: &[Self], s: Self) -> Self {
                <$t as RowOps>::max_scaled(simd, row, s)
            }
            #[inline(always)]
            fn exp_row(simd: Simd, row: &mut [Self], s: Self, m: Self) -> Self {
                <$t as RowOps>::exp_row(simd, row, s, m)
            }
            fn reg(xs: Vec<Self>) -> Reg {
                Reg::$v(xs)
            }
            fn at(src: &Src<'_>, i: usize) -> Self {
                let Src::$v(v) = src else { unreachable!("scores_refusal: output 1 is the accumulator's") };
                v[i]
            }
        }
    };
}
acc!(f32, F);
acc!(f64, D);

/// Stores `x` as an element of float dtype `d` at `p`, rounded once.
///
/// # Safety
/// `p` is the address of an element of dtype `d` under an exclusive claim.
pub(super) unsafe fn store(d: Dtype, p: *mut u8, x: f64, x32: Option<f32>) {
    // SAFETY: the caller's contract. An f32 accumulator's value is stored from f32 (one rounding).
    unsafe {
        match (d, x32) {
            (Dtype::F16, Some(v)) => <half::f16 as Element>::store(p, crate::dtype::convert::f32_to_f16(v)),
            (Dtype::BF16, Some(v)) => <half::bf16 as Element>::store(p, crate::dtype::convert::f32_to_bf16(v)),
            (Dtype::F16, None) => <half::f16 as Element>::store(p, half::f16::from_f64(x)),
            (Dtype::BF16, None) => <half::bf16 as Element>::store(p, half::bf16::from_f64(x)),
            (Dtype::F8E4M3, Some(v)) => <F8E4M3 as Element>::store(p, F8E4M3::from_f32(v)),
            (Dtype::F8E5M2, Some(v)) => <F8E5M2 as Element>::store(p, F8E5M2::from_f32(v)),
            (Dtype::F8E4M3, None) => <F8E4M3 as Element>::store(p, F8E4M3::from_f64(x)),
            (Dtype::F8E5M2, None) => <F8E5M2 as Element>::store(p, F8E5M2::from_f64(x)),
            (Dtype::F32, Some(v)) => <f32 as Element>::store(p, v),
            (Dtype::F32, None) => <f32 as Element>::store(p, x as f32),
            (Dtype::F64, _) => <f64 as Element>::store(p, x),
            (d, _) => unreachable!("attention_refusal refuses {d}"),
        }
    }
}

/// An operand's layout as (extents, strides, offset).
#[derive(Clone)]
pub(super) struct View {
    pub(super) shape: Vec<usize>,
    pub(super) strides: Vec<isize>,
    offset: isize,
    p: Ptr,
    pub(super) d: Dtype,
}

impl View {
    pub(super) fn of(o: &dyn Operand) -> View {
        let l = o.layout();
        View {
            shape: l.shape().to_vec(),
            strides: l.strides().to_vec(),
            offset: l.offset(),
            p: Ptr::of(o),
            d: o.dtype(),
        }
    }

    /// The position of the lead index `b` (flat over the first `lead` axes) with `rest` after.
    pub(super) fn pos(&self, lead: usize, b: usize, rest: &[usize]) -> isize {
        let mut at = self.offset;
        let mut k = b;
        for d in (0..lead).rev() {
            at += (k % self.shape[d]) as isize * self.strides[d];
            k /= self.shape[d];
        }
        for (j, &i) in rest.iter().enumerate() {
            at += i as isize * self.strides[lead + j];
        }
        at
    }

    pub(super) fn addr(&self, pos: isize) -> *mut u8 {
        self.p.byte(pos * self.d.size() as isize)
    }

    /// Element `pos`'s `i64` value.
    fn int(&self, pos: isize) -> i64 {
        // SAFETY: called under the door's claims with positions of the checked layout.
        unsafe { <i64 as Element>::load(self.addr(pos)) }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    par: &std::sync::Arc<super::par::Par>,
    spec: &Attention,
    scores: Option<Scores<'_>>,
    o: &dyn Operand,
    lse: &dyn Operand,
    q: &dyn Operand,
    kv: Kv<'_>,
    lengths: Option<&dyn Operand>,
) -> Answer {
    let (k, v, table) = match kv {
        Kv::Dense { k, v } => (k, v, None),
        Kv::Paged { k, v, table } => (k, v, Some(table)),
    };
    let rank = q.layout().rank();
    if let Some((a, _)) = attention_refusal(spec, q.dtype(), rank, o.dtype(), lse.dtype(), k.dtype(), v.dtype()) {
        return a;
    }
    if table.is_some_and(|t| t.dtype() != Dtype::I64) || lengths.is_some_and(|l| l.dtype() != Dtype::I64) {
        return Answer::WrongDtype;
    }
    if let Some(sc) = scores {
        let lt: Vec<Dtype> = sc.loads.iter().map(|l| l.dtype()).collect();
        if let Some((a, _)) = scores_refusal(sc.prog, spec.acc, rank, &lt) {
            return a;
        }
    }
    let mut read: Vec<&dyn Operand> = vec![q, k, v];
    read.extend(table);
    read.extend(lengths);
    let first_load = read.len();
    read.extend(scores.iter().flat_map(|sc| sc.loads.iter().copied()));
    let (paged, has_len) = (table.is_some(), lengths.is_some());
    let prog = scores.map(|sc| sc.prog.clone());
    let spec = spec.clone();
    let simd = par.simd();
    through_door(par, "attention", None, &[o, lse], &read, move |w, r, execute| {
        let (o, lse, q, k, v) = (w[0], w[1], r[0], r[1], r[2]);
        let table = paged.then(|| r[3]);
        let lengths = has_len.then(|| r[3 + usize::from(paged)]);
        let qs = q.layout().shape();
        let lead = rank - 3;
        let (hq, tq, dk) = (qs[lead], qs[lead + 1], qs[lead + 2]);
        let (ks, vs) = (k.layout().shape(), v.layout().shape());
        // keys: dense [lead…; hk; tk; d] or pools [pages; hk; page; d] through a table [lead…; max]
        let kv = match table {
            None => KvShape::Dense { k: ks, v: vs },
            Some(t) => KvShape::Paged { k: ks, v: vs, table: t.layout().shape() },
        };
        let Ok(want) = crate::shape::attention(qs, kv) else { return Answer::ShapeMismatch };
        let (hk, tk, dv) = (want.hk, want.tk, vs[vs.len() - 1]);
        let (page, pages) = if paged { (ks[2], ks[0]) } else { (0, 0) };
        if o.layout().shape() != want.o || lse.layout().shape() != want.lse {
            return Answer::ShapeMismatch;
        }
        if lengths.is_some_and(|l| l.layout().shape() != want.lengths) {
            return Answer::ShapeMismatch;
        }
        // the score program's loads broadcast to the loop [lead…, hq, tq, tk]
        let loop_shape: Vec<usize> = qs[..lead].iter().copied().chain([hq, tq, tk]).collect();
        let scored = match &prog {
            None => None,
            Some(p) => match ScoreProg::new(p, &r[first_load..], &loop_shape) {
                Ok(sp) => Some(sp),
                Err(a) => return a,
            },
        };
        if let Some(a) = row_destinations(w, r) {
            return a;
        }
        // lengths are positions: outside 0..=tk they are refused before any write (read when the
        // work runs: on a queued device they may still be being written when the call is checked)
        if !execute {
            return Answer::Done;
        }
        let lens: Vec<usize> = match lengths {
            Some(l) => {
                let lv = View::of(l);
                let mut out = Vec::new();
                for p in l.layout().positions() {
                    match usize::try_from(lv.int(p)) {
                        Ok(x) if x <= tk => out.push(x),
                        _ => return Answer::IndexOutOfRange,
                    }
                }
                out
            }
            None => vec![tk; qs[..lead].iter().product()],
        };
        let views = Views {
            q: View::of(q),
            k: View::of(k),
            v: View::of(v),
            table: table.map(View::of),
            o: View::of(o),
            lse: View::of(lse),
        };
        let dims = Dims { lead, hq, hk, tq, tk, dk, dv, page, pages, simd };
        if spec.acc == Dtype::F64 {
            run::<f64>(&spec, scored.as_ref(), &views, &dims, &lens);
        } else {
            run::<f32>(&spec, scored.as_ref(), &views, &dims, &lens);
        }
        Answer::Done
    })
}

struct Views {
    q: View,
    k: View,
    v: View,
    table: Option<View>,
    o: View,
    lse: View,
}

struct Dims {
    lead: usize,
    hq: usize,
    hk: usize,
    tq: usize,
    tk: usize,
    dk: usize,
    dv: usize,
    page: usize,
    pages: usize,
    /// The SIMD level the row loops run.
    simd: Simd,
}

/// A key head's visible keys, widened: rows of `k` and `v`, and each key's position.
struct Packed<A> {
    k: Vec<A>,
    v: Vec<A>,
    pos: Vec<usize>,
}

/// Packs the visible keys of lead `b`, key head `g` into `p` (its memory reused).
fn pack<A: Acc>(p: &mut Packed<A>, x: &Views, d: &Dims, b: usize, g: usize, len: usize) {
    p.k.clear();
    p.v.clear();
    p.pos.clear();
    for t in 0..len {
        // the key's row: dense, or on its page of the pools (a hole: not visible, never read)
        let (kr, vr) = match &x.table {
            None => (x.k.pos(d.lead, b, &[g, t, 0]), x.v.pos(d.lead, b, &[g, t, 0])),
            Some(tv) => {
                let e = tv.int(tv.pos(d.lead, b, &[t / d.page]));
                let Ok(e) = usize::try_from(e) else { continue };
                if e >= d.pages {
                    continue;
                }
                (x.k.pos(0, 0, &[e, g, t % d.page, 0]), x.v.pos(0, 0, &[e, g, t % d.page, 0]))
            }
        };
        let (ks, vs) = (x.k.strides[x.k.strides.len() - 1], x.v.strides[x.v.strides.len() - 1]);
        A::read_row(&mut p.k, x.k.d, ks, d.dk, |i| x.k.addr(kr + i as isize * ks));
        A::read_row(&mut p.v, x.v.d, vs, d.dv, |i| x.v.addr(vr + i as isize * vs));
        p.pos.push(t);
    }
}

fn run<A: Acc>(spec: &Attention, scored: Option<&ScoreProg>, x: &Views, d: &Dims, lens: &[usize]) {
    let lead_n: usize = x.q.shape[..d.lead].iter().product();
    let s = A::of(spec.scale);
    let group = d.hq / d.hk;
    let blocks = d.tq.div_ceil(QB);
    let empty = || Packed::<A> { k: Vec::new(), v: Vec::new(), pos: Vec::new() };
    (0..lead_n * d.hk).into_par_iter().for_each_init(empty, |packed, bg| {
        let (b, g) = (bg / d.hk, bg % d.hk);
        pack::<A>(packed, x, d, b, g, lens[b].min(d.tk));
        let packed = &*packed;
        (0..group * blocks).into_par_iter().for_each(|task| {
            let h = g * group + task / blocks;
            let i0 = (task % blocks) * QB;
            let i1 = (i0 + QB).min(d.tq);
            rows(d.simd, spec, scored, s, x, d, packed, b, h, i0, i1);
        });
    });
}

crate::simd_fn! {
    /// Query rows `i0..i1` of head `h` at lead index `b`, built for the level: even at AVX2 its
    /// scalar code VEX-encoded as faer's products and libm's `expf` are. Between them, the
    /// baseline's legacy SSE instructions with the vector registers' upper halves dirty ran the
    /// whole kernel 15× slower on an Intel Xeon (3.6 against 56 GFLOP/s before the row loops were
    /// vectorised; 160 with them).
    fn rows<A: Acc>(simd: Simd, spec: &Attention, scored: Option<&ScoreProg>, s: A, x: &Views, d: &Dims, kv: &Packed<A>, b: usize, h: usize, i0: usize, i1: usize) {
        let (bq, n) = (i1 - i0, kv.pos.len());
        let qs = x.q.strides[x.q.strides.len() - 1];
        let mut qt = Vec::with_capacity(bq * d.dk);
        for i in i0..i1 {
            let r = x.q.pos(d.lead, b, &[h, i, 0]);
            A::read_row(&mut qt, x.q.d, qs, d.dk, |c| x.q.addr(r + c as isize * qs));
        }
        let (mut m, mut l) = (vec![A::NEG_INF; bq], vec![A::ZERO; bq]);
        let mut poisoned = vec![false; bq];
        let mut acc = vec![A::ZERO; bq * d.dv];
        let mut sc = vec![A::ZERO; bq * KB];
        let mut regs = scored.map(|p| p.registers(bq * KB));
        // with a score program, its output is the score the softmax takes: no further scale
        let s = if scored.is_some() { A::of(1.0) } else { s };
        let s_raw = A::of(spec.scale);
        // the last key a row may see under the causal mask
        let last = |i: usize| spec.causal.map(|c| (i as i64).saturating_add(c));
        let mut j0 = 0;
        while j0 < n {
            let j1 = (j0 + KB).min(n);
            if last(i1 - 1).is_some_and(|e| (kv.pos[j0] as i64) > e) {
                break; // every later key is past every row's mask
            }
            let bk = j1 - j0;
            // the rows before `r0` see no key of the tile (under a causal mask): left out of both
            // products, as they are of the softmax
            let r0 = spec.causal.map_or(0, |c| {
                let first = (kv.pos[j0] as i64).saturating_sub(c).saturating_sub(i0 as i64);
                first.clamp(0, bq as i64) as usize
            });
            let rows = bq - r0;
            // SAFETY: the slices hold bq × dk, bk × dk and bq × bk elements, row-major; rows r0.. of
            // them are taken.
            unsafe {
                let qm = faer::MatRef::from_raw_parts(qt.as_ptr().add(r0 * d.dk), rows, d.dk, d.dk as isize, 1);
                let km = faer::MatRef::from_raw_parts(kv.k.as_ptr().add(j0 * d.dk), bk, d.dk, d.dk as isize, 1);
                let sm = faer::MatMut::from_raw_parts_mut(sc.as_mut_ptr().add(r0 * bk), rows, bk, bk as isize, 1);
                faer::linalg::matmul::matmul(sm, faer::Accum::Replace, qm, km.transpose(), A::of(1.0), faer::Par::Seq);
            }
            if let (Some(p), Some(regs)) = (scored, regs.as_mut()) {
                // the program's visibility and score of each pair; a hidden pair weighs exp(−∞) = 0
                let tile = &mut sc[r0 * bk..bq * bk];
                let scores = A::reg(tile.iter().map(|&x| x.fmul(s_raw)).collect());
                let t = Tile { b, h, rows: i0 + r0..i1, keys: &kv.pos[j0..j1] };
                // SAFETY: the door's claims on the program's loads are held for the whole call.
                let (vis, score) = unsafe { p.run(regs, &t, scores) };
                let Src::B(vis) = vis else { unreachable!("scores_refusal: output 0 is a bool") };
                for (e, x) in tile.iter_mut().enumerate() {
                    *x = if vis[e] { A::at(&score, e) } else { A::NEG_INF };
                }
            }
            for r in r0..bq {
                let row = &mut sc[r * bk..(r + 1) * bk];
                // the keys this row sees in the tile: a prefix (positions ascend); the rest weigh 0
                let seen = match last(i0 + r) {
                    None => bk,
                    Some(e) => kv.pos[j0..j1].partition_point(|&p| p as i64 <= e),
                };
                row[seen..].fill(A::ZERO);
                let visible = &mut row[..seen];
                let mx = m[r].fmax(A::max_scaled(simd, visible, s));
                if mx == A::INF {
                    poisoned[r] = true; // a score overflowed: the row's o and lse are NaN
                    visible.fill(A::ZERO);
                    continue;
                }
                if mx == A::NEG_INF && !visible.iter().any(|x| x.fmul(s).nan()) {
                    visible.fill(A::ZERO); // nothing visible yet: weights of zero
                    continue;
                }
                let alpha = if m[r] == A::NEG_INF { A::ZERO } else { m[r].fsub(mx).fexp() };
                let sum = A::exp_row(simd, visible, s, mx);
                l[r] = l[r].fmul(alpha).fadd(sum);
                m[r] = mx;
                if alpha != A::of(1.0) {
                    acc[r * d.dv..(r + 1) * d.dv].iter_mut().for_each(|a| *a = a.fmul(alpha));
                }
            }
            // SAFETY: as above, bq × bk, bk × dv and bq × dv elements, rows r0.. of the first and last.
            unsafe {
                let pm = faer::MatRef::from_raw_parts(sc.as_ptr().add(r0 * bk), rows, bk, bk as isize, 1);
                let vm = faer::MatRef::from_raw_parts(kv.v.as_ptr().add(j0 * d.dv), bk, d.dv, d.dv as isize, 1);
                let om = faer::MatMut::from_raw_parts_mut(acc.as_mut_ptr().add(r0 * d.dv), rows, d.dv, d.dv as isize, 1);
                faer::linalg::matmul::matmul(om, faer::Accum::Add, pm, vm, A::of(1.0), faer::Par::Seq);
            }
            j0 = j1;
        }
        let f32acc = std::mem::size_of::<A>() == 4;
        let own = if f32acc { Dtype::F32 } else { Dtype::F64 };
        for r in 0..bq {
            let i = i0 + r;
            let none = l[r] == A::ZERO && !poisoned[r];
            let lse = if poisoned[r] {
                f64::NAN
            } else if none {
                f64::NEG_INFINITY
            } else {
                m[r].fadd(l[r].fln()).to_f64()
            };
            // SAFETY: o and lse hold their last axis at stride 1 (checked) in distinct positions (the
            // door's check) of the checked shapes; this task writes rows i0..i1 of head h at lead b
            // alone.
            unsafe {
                let at = x.lse.pos(d.lead, b, &[h, i]);
                store(x.lse.d, x.lse.addr(at), lse, f32acc.then_some(lse as f32));
                let ob = x.o.pos(d.lead, b, &[h, i, 0]);
                if x.o.d == own && !poisoned[r] && !none {
                    // the row in the accumulator's own dtype: divided in place, copied (the same bits
                    // as the element-wise store below)
                    let row = &mut acc[r * d.dv..(r + 1) * d.dv];
                    row.iter_mut().for_each(|a| *a = a.fdiv(l[r]));
                    std::ptr::copy_nonoverlapping(row.as_ptr().cast::<u8>(), x.o.addr(ob), d.dv * own.size());
                    continue;
                }
                for c in 0..d.dv {
                    let val = if poisoned[r] {
                        A::NAN
                    } else if none {
                        A::ZERO
                    } else {
                        acc[r * d.dv + c].fdiv(l[r])
                    };
                    let v64 = val.to_f64();
                    store(
                        x.o.d,
                        x.o.addr(ob + c as isize),
                        if none { 0.0 } else { v64 },
                        f32acc.then_some(if none { 0.0 } else { v64 as f32 }),
                    );
                }
            }
        }
    }
}
