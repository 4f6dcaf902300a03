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

use super::eval::Ptr;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::kernels::{attention_refusal, Attention, Kv};
use crate::{Answer, Dtype, Element};

/// Query rows a task takes.
pub(crate) const QB: usize = 64;
/// Keys a tile holds.
pub(crate) const KB: usize = 128;

/// The accumulator: `f32` or `f64`.
trait Acc: faer::traits::ComplexField + Copy + Send + Sync + PartialOrd + 'static {
    const ZERO: Self;
    const NEG_INF: Self;
    fn of(x: f64) -> Self;
    fn fexp(self) -> Self;
    fn fln(self) -> Self;
    fn read(d: Dtype, p: *const u8) -> Self;
    fn fmax(self, o: Self) -> Self;
    fn fmul(self, o: Self) -> Self;
    fn fadd(self, o: Self) -> Self;
    fn fsub(self, o: Self) -> Self;
    fn fdiv(self, o: Self) -> Self;
    fn to_f64(self) -> f64;
    fn nan(self) -> bool;
    /// Scales `row` by `s` in place; answers its greatest element (NaNs skipped; −∞ for none).
    fn scale_max(row: &mut [Self], s: Self) -> Self;
    /// Replaces each `x` of `row` by `exp(x − m)`; answers their sum, in 8 lanes (element `j` into
    /// lane `j mod 8`, the lanes added as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`, then the tail).
    fn exp_row(row: &mut [Self], m: Self) -> Self;
}

macro_rules! acc {
    ($t:ty) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
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
                        Dtype::F32 => <f32 as Element>::load(p) as $t,
                        _ => <f64 as Element>::load(p) as $t,
                    }
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
            fn scale_max(row: &mut [Self], s: Self) -> Self {
                <$t as RowOps>::scale_max(row, s)
            }
            #[inline(always)]
            fn exp_row(row: &mut [Self], m: Self) -> Self {
                <$t as RowOps>::exp_row(row, m)
            }
        }
    };
}
/// `exp(x)` for `f32`, branch-free so that a row's loop vectorizes: `x = n ln 2 + r` (`ln 2` in
/// two parts), Cephes' degree-6 polynomial on r, scaled by `2ⁿ` through the exponent bits;
/// within 2 ulps of `exp` where the result is normal, +0 below −87.3 (where it would be
/// subnormal), +∞ above 88.7, NaN for NaN. Plain multiplications and additions (never fused):
/// the same bits whatever the CPU.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let scale = f32::from_bits((((n as i32).clamp(-126, 127) + 127) as u32) << 23);
    let v = y * scale;
    if x < -87.33 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else {
        v
    }
}

/// [`Acc::scale_max`] without vector instructions.
#[inline(always)]
fn scale_max_plain<T: Copy + PartialOrd + std::ops::MulAssign + FloatConst>(row: &mut [T], s: T) -> T {
    let mut lanes = [T::NEG_INF; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for k in 0..8 {
            c[k] *= s;
            // NaN compares false: skipped
            if c[k] > lanes[k] {
                lanes[k] = c[k];
            }
        }
    }
    let mut m = lanes.iter().fold(T::NEG_INF, |a, &b| if b > a { b } else { a });
    for x in chunks.into_remainder() {
        *x *= s;
        if *x > m {
            m = *x;
        }
    }
    m
}

/// [`Acc::exp_row`] without vector instructions.
#[inline(always)]
fn exp_row_plain<
    T: Copy + ExpOf + FloatConst + std::ops::Sub<Output = T> + std::ops::Add<Output = T> + std::ops::AddAssign,
>(
    row: &mut [T],
    m: T,
) -> T {
    let mut l = [T::ZERO_; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for k in 0..8 {
            c[k] = (c[k] - m).exp_of();
            l[k] += c[k];
        }
    }
    let mut sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for x in chunks.into_remainder() {
        *x = (*x - m).exp_of();
        sum += *x;
    }
    sum
}

/// The row loops of each accumulator: `f32`'s in AVX2 where the CPU has it.
trait RowOps: Sized {
    fn scale_max(row: &mut [Self], s: Self) -> Self;
    fn exp_row(row: &mut [Self], m: Self) -> Self;
}

impl RowOps for f32 {
    #[inline(always)]
    fn scale_max(row: &mut [f32], s: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { simd::scale_max(row, s) };
        }
        scale_max_plain(row, s)
    }
    #[inline(always)]
    fn exp_row(row: &mut [f32], m: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { simd::exp_row(row, m) };
        }
        exp_row_plain(row, m)
    }
}

impl RowOps for f64 {
    #[inline(always)]
    fn scale_max(row: &mut [f64], s: f64) -> f64 {
        scale_max_plain(row, s)
    }
    #[inline(always)]
    fn exp_row(row: &mut [f64], m: f64) -> f64 {
        exp_row_plain(row, m)
    }
}

/// Constants of the two accumulators.
trait FloatConst {
    const NEG_INF: Self;
    const ZERO_: Self;
}

impl FloatConst for f32 {
    const NEG_INF: f32 = f32::NEG_INFINITY;
    const ZERO_: f32 = 0.0;
}

impl FloatConst for f64 {
    const NEG_INF: f64 = f64::NEG_INFINITY;
    const ZERO_: f64 = 0.0;
}

/// The `f32` row loops in AVX2: the same operations as [`scale_max_plain`] and
/// [`exp_row_plain`] with [`exp_f32`], eight lanes at a time (the same bits).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scale_max(row: &mut [f32], s: f32) -> f32 {
        let (sv, mut lanes) = (_mm256_set1_ps(s), _mm256_set1_ps(f32::NEG_INFINITY));
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds 8 elements.
            unsafe {
                let x = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), sv);
                _mm256_storeu_ps(c.as_mut_ptr(), x);
                // x > lane ? x : lane (a NaN x keeps the lane), as the plain loop
                lanes = _mm256_max_ps(x, lanes);
            }
        }
        let mut l = [0f32; 8];
        // SAFETY: `l` holds 8 elements.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
        let mut m = l.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        for x in chunks.into_remainder() {
            *x *= s;
            if *x > m {
                m = *x;
            }
        }
        m
    }

    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn exp_row(row: &mut [f32], m: f32) -> f32 {
        let mv = _mm256_set1_ps(m);
        let mut lanes = _mm256_setzero_ps();
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds 8 elements.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
                lanes = _mm256_add_ps(lanes, e);
            }
        }
        let mut l = [0f32; 8];
        // SAFETY: `l` holds 8 elements.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
        let mut sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        for x in chunks.into_remainder() {
            *x = super::exp_f32(*x - m);
            sum += *x;
        }
        sum
    }

    /// [`super::exp_f32`] of eight lanes.
    #[target_feature(enable = "avx2")]
    fn exp8(x: __m256) -> __m256 {
        let c = |v: f32| _mm256_set1_ps(v);
        let (mul, add, sub) = (_mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps);
        let round = c(12_582_912.0);
        let n = sub(add(mul(x, c(std::f32::consts::LOG2_E)), round), round);
        let r = sub(sub(x, mul(n, c(0.693_359_4))), mul(n, c(-2.121_944_4e-4)));
        let mut p = c(1.987_569_1e-4);
        p = add(mul(p, r), c(1.398_199_9e-3));
        p = add(mul(p, r), c(8.333_452e-3));
        p = add(mul(p, r), c(4.166_579_6e-2));
        p = add(mul(p, r), c(1.666_666_5e-1));
        p = add(mul(p, r), c(0.5));
        let y = add(add(mul(mul(p, r), r), r), c(1.0));
        let ni =
            _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(-126)), _mm256_set1_epi32(127));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(ni, _mm256_set1_epi32(127))));
        let v = mul(y, scale);
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(x, c(-87.33));
        let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x, c(88.72));
        let v = _mm256_andnot_ps(low, v);
        _mm256_blendv_ps(v, c(f32::INFINITY), high)
    }
}

/// A row's `exp`: [`exp_f32`] for `f32`, the library's `exp` for `f64`.
trait ExpOf {
    fn exp_of(self) -> Self;
}

impl ExpOf for f32 {
    #[inline(always)]
    fn exp_of(self) -> f32 {
        exp_f32(self)
    }
}

impl ExpOf for f64 {
    #[inline(always)]
    fn exp_of(self) -> f64 {
        self.exp()
    }
}

acc!(f32);
acc!(f64);

/// Stores `x` as an element of float dtype `d` at `p`, rounded once.
///
/// # Safety
/// `p` is the address of an element of dtype `d` under an exclusive claim.
unsafe fn store(d: Dtype, p: *mut u8, x: f64, x32: Option<f32>) {
    // SAFETY: the caller's contract. An f32 accumulator's value is stored from f32 (one rounding).
    unsafe {
        match (d, x32) {
            (Dtype::F16, Some(v)) => <half::f16 as Element>::store(p, crate::dtype::convert::f32_to_f16(v)),
            (Dtype::BF16, Some(v)) => <half::bf16 as Element>::store(p, crate::dtype::convert::f32_to_bf16(v)),
            (Dtype::F16, None) => <half::f16 as Element>::store(p, half::f16::from_f64(x)),
            (Dtype::BF16, None) => <half::bf16 as Element>::store(p, half::bf16::from_f64(x)),
            (Dtype::F32, Some(v)) => <f32 as Element>::store(p, v),
            (Dtype::F32, None) => <f32 as Element>::store(p, x as f32),
            _ => <f64 as Element>::store(p, x),
        }
    }
}

/// An operand's layout as (extents, strides, offset).
#[derive(Clone)]
struct View {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: isize,
    p: Ptr,
    d: Dtype,
}

impl View {
    fn of(o: &dyn Operand) -> View {
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
    fn pos(&self, lead: usize, b: usize, rest: &[usize]) -> isize {
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

    fn addr(&self, pos: isize) -> *mut u8 {
        self.p.byte(pos * self.d.size() as isize)
    }

    /// Element `pos`'s `i64` value.
    fn int(&self, pos: isize) -> i64 {
        // SAFETY: called under the door's claims with positions of the checked layout.
        unsafe { <i64 as Element>::load(self.addr(pos)) }
    }
}

pub(crate) fn attention(
    spec: &Attention,
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
    let mut read: Vec<&dyn Operand> = vec![q, k, v];
    read.extend(table);
    read.extend(lengths);
    let (paged, has_len) = (table.is_some(), lengths.is_some());
    let spec = spec.clone();
    through_door(&[o, lse], &read, move |w, r, execute| {
        let (o, lse, q, k, v) = (w[0], w[1], r[0], r[1], r[2]);
        let table = paged.then(|| r[3]);
        let lengths = has_len.then(|| r[3 + usize::from(paged)]);
        let qs = q.layout().shape();
        let lead = rank - 3;
        let (hq, tq, dk) = (qs[lead], qs[lead + 1], qs[lead + 2]);
        let (ks, vs) = (k.layout().shape(), v.layout().shape());
        // keys: dense [lead…; hk; tk; d] or pools [pages; hk; page; d] through a table [lead…; max]
        let (hk, tk, page, pages) = match table {
            None => {
                if ks.len() != rank || vs.len() != rank || ks[..lead] != qs[..lead] || vs[..lead + 2] != ks[..lead + 2]
                {
                    return Answer::ShapeMismatch;
                }
                (ks[lead], ks[lead + 1], 0, 0)
            }
            Some(t) => {
                let ts = t.layout().shape();
                if ks.len() != 4
                    || vs.len() != 4
                    || vs[..3] != ks[..3]
                    || ts.len() != lead + 1
                    || ts[..lead] != qs[..lead]
                {
                    return Answer::ShapeMismatch;
                }
                let Some(tk) = ts[lead].checked_mul(ks[2]) else { return Answer::ShapeMismatch };
                (ks[1], tk, ks[2], ks[0])
            }
        };
        let dv = vs[vs.len() - 1];
        if ks[ks.len() - 1] != dk || hk == 0 || hq % hk != 0 {
            return Answer::ShapeMismatch;
        }
        let mut want_o = qs.to_vec();
        want_o[rank - 1] = dv;
        if o.layout().shape() != want_o || lse.layout().shape() != &qs[..rank - 1] {
            return Answer::ShapeMismatch;
        }
        if lengths.is_some_and(|l| l.layout().shape() != &qs[..lead]) {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = destinations(w, r) {
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
        let dims = Dims { lead, hq, hk, tq, tk, dk, dv, page, pages };
        if spec.acc == Dtype::F64 {
            run::<f64>(&spec, &views, &dims, &lens);
        } else {
            run::<f32>(&spec, &views, &dims, &lens);
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
        p.k.extend((0..d.dk).map(|i| A::read(x.k.d, x.k.addr(kr + i as isize * ks))));
        p.v.extend((0..d.dv).map(|i| A::read(x.v.d, x.v.addr(vr + i as isize * vs))));
        p.pos.push(t);
    }
}

fn run<A: Acc>(spec: &Attention, x: &Views, d: &Dims, lens: &[usize]) {
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
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { rows_avx2(spec, s, x, d, packed, b, h, i0, i1) };
                return;
            }
            rows(spec, s, x, d, packed, b, h, i0, i1);
        });
    });
}

/// [`rows`] compiled for AVX2 and FMA: its scalar code VEX-encoded as faer's products and libm's
/// `expf` are. Between them, the baseline's legacy SSE instructions with the vector registers'
/// upper halves dirty ran the whole kernel 15× slower on this Xeon (3.6 against 56 GFLOP/s
/// before the row loops were vectorised; 160 with them).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_avx2<A: Acc>(
    spec: &Attention,
    s: A,
    x: &Views,
    d: &Dims,
    kv: &Packed<A>,
    b: usize,
    h: usize,
    i0: usize,
    i1: usize,
) {
    rows(spec, s, x, d, kv, b, h, i0, i1)
}

/// Query rows `i0..i1` of head `h` at lead index `b`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rows<A: Acc>(spec: &Attention, s: A, x: &Views, d: &Dims, kv: &Packed<A>, b: usize, h: usize, i0: usize, i1: usize) {
    let (bq, n) = (i1 - i0, kv.pos.len());
    let qs = x.q.strides[x.q.strides.len() - 1];
    let mut qt = Vec::with_capacity(bq * d.dk);
    for i in i0..i1 {
        let r = x.q.pos(d.lead, b, &[h, i, 0]);
        qt.extend((0..d.dk).map(|c| A::read(x.q.d, x.q.addr(r + c as isize * qs))));
    }
    let (mut m, mut l) = (vec![A::NEG_INF; bq], vec![A::ZERO; bq]);
    let mut acc = vec![A::ZERO; bq * d.dv];
    let mut sc = vec![A::ZERO; bq * KB];
    // the last key a row may see under the causal mask
    let last = |i: usize| spec.causal.map(|c| (i as i64).saturating_add(c));
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + KB).min(n);
        if last(i1 - 1).is_some_and(|e| (kv.pos[j0] as i64) > e) {
            break; // every later key is past every row's mask
        }
        let bk = j1 - j0;
        // SAFETY: the slices hold bq × dk, bk × dk and bq × bk elements, row-major.
        unsafe {
            let qm = faer::MatRef::from_raw_parts(qt.as_ptr(), bq, d.dk, d.dk as isize, 1);
            let km = faer::MatRef::from_raw_parts(kv.k.as_ptr().add(j0 * d.dk), bk, d.dk, d.dk as isize, 1);
            let sm = faer::MatMut::from_raw_parts_mut(sc.as_mut_ptr(), bq, bk, bk as isize, 1);
            faer::linalg::matmul::matmul(sm, faer::Accum::Replace, qm, km.transpose(), A::of(1.0), faer::Par::Seq);
        }
        for r in 0..bq {
            let row = &mut sc[r * bk..(r + 1) * bk];
            // the keys this row sees in the tile: a prefix (positions ascend); the rest weigh 0
            let seen = match last(i0 + r) {
                None => bk,
                Some(e) => kv.pos[j0..j1].partition_point(|&p| p as i64 <= e),
            };
            row[seen..].fill(A::ZERO);
            let visible = &mut row[..seen];
            let mx = m[r].fmax(A::scale_max(visible, s));
            if mx == A::NEG_INF && !visible.iter().any(|x| x.nan()) {
                visible.fill(A::ZERO); // nothing visible yet: weights of zero
                continue;
            }
            let alpha = if m[r] == A::NEG_INF { A::ZERO } else { m[r].fsub(mx).fexp() };
            let sum = A::exp_row(visible, mx);
            l[r] = l[r].fmul(alpha).fadd(sum);
            m[r] = mx;
            if alpha != A::of(1.0) {
                acc[r * d.dv..(r + 1) * d.dv].iter_mut().for_each(|a| *a = a.fmul(alpha));
            }
        }
        // SAFETY: as above, bq × bk, bk × dv and bq × dv elements.
        unsafe {
            let pm = faer::MatRef::from_raw_parts(sc.as_ptr(), bq, bk, bk as isize, 1);
            let vm = faer::MatRef::from_raw_parts(kv.v.as_ptr().add(j0 * d.dv), bk, d.dv, d.dv as isize, 1);
            let om = faer::MatMut::from_raw_parts_mut(acc.as_mut_ptr(), bq, d.dv, d.dv as isize, 1);
            faer::linalg::matmul::matmul(om, faer::Accum::Add, pm, vm, A::of(1.0), faer::Par::Seq);
        }
        j0 = j1;
    }
    let f32acc = std::mem::size_of::<A>() == 4;
    for r in 0..bq {
        let i = i0 + r;
        let none = l[r] == A::ZERO;
        let lse = if none { f64::NEG_INFINITY } else { m[r].fadd(l[r].fln()).to_f64() };
        // SAFETY: o and lse are C-contiguous of the checked shapes; this task writes rows i0..i1
        // of head h at lead b alone.
        unsafe {
            let at = x.lse.pos(d.lead, b, &[h, i]);
            store(x.lse.d, x.lse.addr(at), lse, f32acc.then_some(lse as f32));
            let ob = x.o.pos(d.lead, b, &[h, i, 0]);
            for c in 0..d.dv {
                let val = if none { A::ZERO } else { acc[r * d.dv + c].fdiv(l[r]) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_and_its_vector_loops_give_the_plain_bits() {
        for k in 0..200_000 {
            let x = -87.0 + k as f32 * (175.0 / 200_000.0);
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            let ulp = f64::from(f32::EPSILON) * want;
            assert!((f64::from(got) - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, want {want}");
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            for len in [0, 1, 7, 8, 9, 64, 127, 128] {
                let row: Vec<f32> = (0..len).map(|i| ((i * 7919 % 211) as f32 - 105.0) * 0.37).collect();
                let (mut a, mut b) = (row.clone(), row.clone());
                // SAFETY: the CPU has AVX2.
                let ma = unsafe { simd::scale_max(&mut a, 0.9) };
                let mb = scale_max_plain(&mut b, 0.9f32);
                assert_eq!(
                    (ma.to_bits(), a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    (mb.to_bits(), b.iter().map(|x| x.to_bits()).collect())
                );
                // SAFETY: as above.
                let sa = unsafe { simd::exp_row(&mut a, ma) };
                let sb = exp_row_plain(&mut b, mb);
                assert_eq!(
                    (sa.to_bits(), a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    (sb.to_bits(), b.iter().map(|x| x.to_bits()).collect()),
                    "{len}"
                );
            }
        }
    }
}
