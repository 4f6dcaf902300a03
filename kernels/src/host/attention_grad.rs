//! The gradient of an attention ([`Kernels::attention_grad`](crate::Kernels::attention_grad)):
//! FlashAttention-2's backward over dense keys, recomputing each row's weights from the forward's
//! log-sum-exp instead of holding them.
//!
//! One task a lead index and key head (their gradients are its own: no reduction across tasks).
//! It widens the head's keys and values once (`K`, `Kᵀ`, `Vᵀ`), then for each of its query heads
//! and each block of [`QB`] query rows, over the keys some row of the block sees: `S = Q·Kᵀ`,
//! `P = exp(s·S − lse)` (zero where the causal mask hides a key or a row sees none), `D =
//! rowsum(dO ∘ O)`, `dS = s·P ∘ (dO·Vᵀ − D)`; `dV += Pᵀ·dO`, `dK += dSᵀ·Q`, `dQ = dS·K`. Products
//! of at least [`FAER_MIN`] multiply-adds run through `faer`, smaller ones by rows of
//! multiply-adds here (the training shapes: a few keys a row, where a product call's setup
//! outweighs its work). A task's order is fixed, so the bits do not depend on the threads.

use std::sync::Arc;

use rayon::prelude::*;

use super::attention::{store, Acc, View};
use super::par::Par;
use super::{overlaps, row_destinations, through_door};
use crate::kernels::{attention_grad_refusal, Attention, AttentionGrad};
use crate::shape::KvShape;
use crate::{Answer, Dtype, Simd};

/// Query rows a block takes: the scores held at once are `QB × tk`.
const QB: usize = 128;
/// Products of at least this many multiply-adds run through `faer`.
const FAER_MIN: usize = 1 << 15;

pub(crate) fn attention_grad(par: &Arc<Par>, spec: &Attention, g: AttentionGrad<'_>) -> Answer {
    if let Some((a, _)) = attention_grad_refusal(spec, &g) {
        return a;
    }
    let spec = spec.clone();
    let simd = par.simd();
    let written = [g.dq, g.dk, g.dv];
    let read = [g.q, g.k, g.v, g.o, g.lse, g.d_o];
    through_door(par, "attention_grad", None, &written, &read, move |w, r, execute| {
        let (dq, dk, dv) = (w[0], w[1], w[2]);
        let (q, k, v, o, lse, d_o) = (r[0], r[1], r[2], r[3], r[4], r[5]);
        let (qs, ks, vs) = (q.layout().shape(), k.layout().shape(), v.layout().shape());
        let Ok(want) = crate::shape::attention(qs, KvShape::Dense { k: ks, v: vs }) else {
            return Answer::ShapeMismatch;
        };
        let shapes_fit = o.layout().shape() == want.o
            && d_o.layout().shape() == want.o
            && lse.layout().shape() == want.lse
            && dq.layout().shape() == qs
            && dk.layout().shape() == ks
            && dv.layout().shape() == vs;
        if !shapes_fit {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = row_destinations(w, r) {
            return a;
        }
        if overlaps(dq, dk) || overlaps(dq, dv) || overlaps(dk, dv) {
            return Answer::Overlapping;
        }
        if !execute {
            return Answer::Done;
        }
        let lead = qs.len() - 3;
        let d =
            Dims { lead, hq: qs[lead], hk: want.hk, tq: qs[lead + 1], tk: want.tk, dk: qs[lead + 2], dv: vs[lead + 2] };
        let x = Views {
            q: View::of(q),
            k: View::of(k),
            v: View::of(v),
            o: View::of(o),
            lse: View::of(lse),
            d_o: View::of(d_o),
            dq: View::of(dq),
            dk: View::of(dk),
            dv: View::of(dv),
        };
        let tasks = qs[..lead].iter().product::<usize>() * d.hk;
        if spec.acc == Dtype::F64 {
            (0..tasks).into_par_iter().for_each_init(Scratch::new, |w, bg| {
                task::<f64>(simd, &spec, spec.scale, &x, &d, w, bg / d.hk, bg % d.hk)
            });
        } else {
            (0..tasks).into_par_iter().for_each_init(Scratch::new, |w, bg| {
                task::<f32>(simd, &spec, spec.scale as f32, &x, &d, w, bg / d.hk, bg % d.hk)
            });
        }
        Answer::Done
    })
}

struct Views {
    q: View,
    k: View,
    v: View,
    o: View,
    lse: View,
    d_o: View,
    dq: View,
    dk: View,
    dv: View,
}

struct Dims {
    lead: usize,
    hq: usize,
    hk: usize,
    tq: usize,
    tk: usize,
    dk: usize,
    dv: usize,
}

#[allow(clippy::too_many_arguments)]
/// Appends `rows` rows of `n` elements of `x` at lead `b`, head `h`, from row `r0`, widened.
fn read_rows<A: Acc>(out: &mut Vec<A>, x: &View, lead: usize, b: usize, h: usize, r0: usize, rows: usize, n: usize) {
    out.clear();
    let st = x.strides[x.strides.len() - 1];
    for i in r0..r0 + rows {
        let at = x.pos(lead, b, &[h, i, 0]);
        A::read_row(out, x.d, st, n, |c| x.addr(at + c as isize * st));
    }
}

#[allow(clippy::too_many_arguments)]
/// Stores `rows` rows of `n` accumulators from `src` (row-major) at lead `b`, head `h`, from row
/// `r0` of `x`, each rounded once.
fn store_rows<A: Acc>(x: &View, src: &[A], lead: usize, b: usize, h: usize, r0: usize, rows: usize, n: usize) {
    let f32acc = std::mem::size_of::<A>() == 4;
    let own = if f32acc { Dtype::F32 } else { Dtype::F64 };
    for r in 0..rows {
        let at = x.pos(lead, b, &[h, r0 + r, 0]);
        if x.d == own {
            // SAFETY: as below; a row of a destination (its last axis at stride 1, checked) is `n`
            // adjacent elements of the accumulator's own dtype, and `src` holds `rows × n`.
            unsafe {
                std::ptr::copy_nonoverlapping(src[r * n..(r + 1) * n].as_ptr().cast::<u8>(), x.addr(at), n * own.size())
            };
            continue;
        }
        for c in 0..n {
            let v = src[r * n + c].to_f64();
            // SAFETY: a destination of the checked shape, its last axis at stride 1 and its positions
            // distinct (checked); rows of head `h` at lead `b` are this task's alone, under the door's
            // exclusive claim.
            unsafe { store(x.d, x.addr(at + c as isize), v, f32acc.then_some(v as f32)) };
        }
    }
}

/// `t` becomes the transpose of the `rows × cols` row-major `m`.
fn transpose<A: Acc>(t: &mut Vec<A>, m: &[A], rows: usize, cols: usize) {
    t.clear();
    t.resize(rows * cols, A::ZERO);
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
}

/// A thread's buffers, reused from task to task.
struct Scratch<A> {
    kr: Vec<A>,
    vr: Vec<A>,
    kt: Vec<A>,
    vt: Vec<A>,
    gk: Vec<A>,
    gv: Vec<A>,
    qb: Vec<A>,
    ob: Vec<A>,
    gob: Vec<A>,
    ls: Vec<A>,
    dd: Vec<A>,
    p: Vec<A>,
    ds: Vec<A>,
    gq: Vec<A>,
}

impl<A: Acc> Scratch<A> {
    fn new() -> Self {
        Scratch {
            kr: Vec::new(),
            vr: Vec::new(),
            kt: Vec::new(),
            vt: Vec::new(),
            gk: Vec::new(),
            gv: Vec::new(),
            qb: Vec::new(),
            ob: Vec::new(),
            gob: Vec::new(),
            ls: Vec::new(),
            dd: Vec::new(),
            p: Vec::new(),
            ds: Vec::new(),
            gq: Vec::new(),
        }
    }
}

/// `v` as `n` zeros.
fn zeroed<A: Acc>(v: &mut Vec<A>, n: usize) {
    v.clear();
    v.resize(n, A::ZERO);
}

/// `c[i·ldc + j] (+)= Σ_p a[i·ars + p·acs] · b[p·ldb + j]` for `i < m`, `j < n`, `p < k` (added to
/// `c` where `add`, else replacing it). Inlined into the level's code.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn mm<A: Acc>(
    m: usize,
    n: usize,
    k: usize,
    a: &[A],
    ars: usize,
    acs: usize,
    b: &[A],
    ldb: usize,
    c: &mut [A],
    ldc: usize,
    add: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if m * n * k >= FAER_MIN {
        assert!(
            (m - 1) * ars + (k - 1) * acs < a.len() && (k - 1) * ldb + n <= b.len() && (m - 1) * ldc + n <= c.len()
        );
        // SAFETY: the assertion keeps every element the three views address within its slice.
        unsafe {
            let am = faer::MatRef::from_raw_parts(a.as_ptr(), m, k, ars as isize, acs as isize);
            let bm = faer::MatRef::from_raw_parts(b.as_ptr(), k, n, ldb as isize, 1);
            let cm = faer::MatMut::from_raw_parts_mut(c.as_mut_ptr(), m, n, ldc as isize, 1);
            let accum = if add { faer::Accum::Add } else { faer::Accum::Replace };
            faer::linalg::matmul::matmul(cm, accum, am, bm, A::of(1.0), faer::Par::Seq);
        }
        return;
    }
    // blocks of up to 4 rows and 16 columns, summed in registers over p in order (the same bits
    // for any blocking)
    let mut i = 0;
    while i < m {
        let r = if m - i >= 4 { 4 } else { 1 };
        let mut j = 0;
        while j < n {
            let w = if n - j >= 16 {
                16
            } else if n - j >= 8 {
                8
            } else {
                1
            };
            let at = Block { i0: i, j0: j, k, ars, acs, ldb, ldc, add };
            match (r, w) {
                (4, 16) => block::<A, 4, 16>(&at, a, b, c),
                (4, 8) => block::<A, 4, 8>(&at, a, b, c),
                (4, _) => block::<A, 4, 1>(&at, a, b, c),
                (_, 16) => block::<A, 1, 16>(&at, a, b, c),
                (_, 8) => block::<A, 1, 8>(&at, a, b, c),
                _ => block::<A, 1, 1>(&at, a, b, c),
            }
            j += w;
        }
        i += r;
    }
}

/// Where a block of [`mm`] lies: its first row and column, the sum's length and the strides.
struct Block {
    i0: usize,
    j0: usize,
    k: usize,
    ars: usize,
    acs: usize,
    ldb: usize,
    ldc: usize,
    add: bool,
}

/// `R × W` entries of [`mm`] from row `i0`, column `j0`, held in registers over the sum.
#[inline(always)]
fn block<A: Acc, const R: usize, const W: usize>(at: &Block, a: &[A], b: &[A], c: &mut [A]) {
    let mut acc = [[A::ZERO; W]; R];
    if at.add {
        for (r, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[(at.i0 + r) * at.ldc + at.j0..][..W]);
        }
    }
    for p in 0..at.k {
        let br: &[A; W] = b[p * at.ldb + at.j0..][..W].try_into().expect("W entries");
        for (r, row) in acc.iter_mut().enumerate() {
            let x = a[(at.i0 + r) * at.ars + p * at.acs];
            for l in 0..W {
                row[l] = row[l].fadd(x.fmul(br[l]));
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        c[(at.i0 + r) * at.ldc + at.j0..][..W].copy_from_slice(row);
    }
}

crate::simd_fn! {
    /// The gradients of key head `g` at lead index `b` and of its query heads' rows; `s` is the
    /// score's factor in the accumulator.
    fn task<A: Acc>(simd: Simd, spec: &Attention, s: A, x: &Views, d: &Dims, w: &mut Scratch<A>, b: usize, g: usize) {
        let (tk, dk, dv, lead) = (d.tk, d.dk, d.dv, d.lead);
        let Scratch { kr, vr, kt, vt, gk, gv, qb, ob, gob, ls, dd, p, ds, gq } = w;
        read_rows(kr, &x.k, lead, b, g, 0, tk, dk);
        read_rows(vr, &x.v, lead, b, g, 0, tk, dv);
        transpose(kt, kr, tk, dk);
        transpose(vt, vr, tk, dv);
        zeroed(gk, tk * dk);
        zeroed(gv, tk * dv);
        let qb_max = QB.min(d.tq);
        zeroed(dd, qb_max);
        zeroed(p, qb_max * tk);
        zeroed(ds, qb_max * tk);
        zeroed(gq, qb_max * dk);
        let group = d.hq / d.hk;
        let lse_st = x.lse.strides[x.lse.strides.len() - 1];
        for h in g * group..(g + 1) * group {
            let mut i0 = 0;
            while i0 < d.tq {
                let bq = QB.min(d.tq - i0);
                // the keys some row of the block sees: a prefix under the causal mask
                let seen = |i: usize| spec.causal.map_or(tk, |c| ((i as i64).saturating_add(c).saturating_add(1)).clamp(0, tk as i64) as usize);
                let n = seen(i0 + bq - 1);
                read_rows(qb, &x.q, lead, b, h, i0, bq, dk);
                read_rows(ob, &x.o, lead, b, h, i0, bq, dv);
                read_rows(gob, &x.d_o, lead, b, h, i0, bq, dv);
                ls.clear();
                let at = x.lse.pos(lead, b, &[h, i0]);
                // positions of the checked lse layout, read under the door's claims
                ls.extend((0..bq).map(|r| A::read(x.lse.d, x.lse.addr(at + r as isize * lse_st))));
                // S = Q·Kᵀ over the keys seen, then P = exp(s·S − lse), zero where hidden
                mm(bq, n, dk, qb, dk, 1, kt, tk, p, n, false);
                for r in 0..bq {
                    let row = &mut p[r * n..(r + 1) * n];
                    let vis = seen(i0 + r).min(n);
                    if ls[r] == A::NEG_INF {
                        row.fill(A::ZERO); // a row that sees no key: no weight, no gradient
                        dd[r] = A::ZERO;
                        continue;
                    }
                    A::exp_row(simd, &mut row[..vis], s, ls[r]);
                    row[vis..].fill(A::ZERO);
                    let (o_r, g_r) = (&ob[r * dv..(r + 1) * dv], &gob[r * dv..(r + 1) * dv]);
                    dd[r] = o_r.iter().zip(g_r).fold(A::ZERO, |acc, (&a, &c)| acc.fadd(a.fmul(c)));
                }
                // dS = s·P ∘ (dO·Vᵀ − D)
                mm(bq, n, dv, gob, dv, 1, vt, tk, ds, n, false);
                for r in 0..bq {
                    // hidden pairs get zero, not 0·(dP − D), which an infinite dP would make NaN
                    let vis = if ls[r] == A::NEG_INF { 0 } else { seen(i0 + r).min(n) };
                    let (pr, dr) = (&p[r * n..(r + 1) * n], &mut ds[r * n..(r + 1) * n]);
                    for (y, &pw) in dr[..vis].iter_mut().zip(&pr[..vis]) {
                        *y = pw.fmul(y.fsub(dd[r])).fmul(s);
                    }
                    dr[vis..].fill(A::ZERO);
                }
                // dV += Pᵀ·dO, dK += dSᵀ·Q (over the keys seen), dQ = dS·K
                mm(n, dv, bq, p, 1, n, gob, dv, gv, dv, true);
                mm(n, dk, bq, ds, 1, n, qb, dk, gk, dk, true);
                mm(bq, dk, n, ds, n, 1, kr, dk, gq, dk, false);
                store_rows(&x.dq, gq, lead, b, h, i0, bq, dk);
                i0 += bq;
            }
        }
        store_rows(&x.dk, gk, lead, b, g, 0, tk, dk);
        store_rows(&x.dv, gv, lead, b, g, 0, tk, dv);
    }
}
