//! Attention of the host library against a naive softmax(s·QKᵀ)V in f64 written here: grouped
//! query heads, causal masks at several offsets, lengths, paged tables with holes, rows with no
//! visible key, strided queries, bf16 operands, f32 and f64 accumulators within the stated bound,
//! refusals, and the same bits on 1, 2 and 8 threads.

use half::bf16;
use nx_kernels::{Answer, Array, Attention, Dtype, Element, Host, Kernels, Kv, Move};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize, salt: usize) -> f64 {
    (((k * 7919 + salt * 104_729) % 10007) as f64 / 10007.0 - 0.5) * 2.0
}

struct Case {
    lead: usize,
    hq: usize,
    hk: usize,
    tq: usize,
    tk: usize,
    dk: usize,
    dv: usize,
    causal: Option<i64>,
}

/// The naive (o, lse) of `c` on q, k, v given in f64 (C order), keys visible where `vis(b, t)`.
fn naive(
    c: &Case,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    vis: &dyn Fn(usize, usize) -> bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut o, mut lse, mut amax) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..c.lead {
        for h in 0..c.hq {
            let g = h / (c.hq / c.hk);
            for i in 0..c.tq {
                let qrow = &q[((b * c.hq + h) * c.tq + i) * c.dk..][..c.dk];
                let mut scores = Vec::new();
                let mut a: f64 = 0.0;
                for t in 0..c.tk {
                    let seen = vis(b, t) && c.causal.is_none_or(|off| t as i64 <= i as i64 + off);
                    if !seen {
                        continue;
                    }
                    let krow = &k[((b * c.hk + g) * c.tk + t) * c.dk..][..c.dk];
                    let dot: f64 = qrow.iter().zip(krow).map(|(x, y)| x * y).sum();
                    a = a.max(scale * qrow.iter().zip(krow).map(|(x, y)| (x * y).abs()).sum::<f64>());
                    scores.push((t, scale * dot));
                }
                amax.push(a);
                if scores.is_empty() {
                    lse.push(f64::NEG_INFINITY);
                    o.extend(std::iter::repeat_n(0.0, c.dv));
                    continue;
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                let l = m + z.ln();
                lse.push(l);
                for d in 0..c.dv {
                    o.push(
                        scores.iter().map(|&(t, s)| (s - l).exp() * v[((b * c.hk + g) * c.tk + t) * c.dv + d]).sum(),
                    );
                }
            }
        }
    }
    (o, lse, amax)
}

fn arr<T: Element>(shape: &[usize], xs: &[f64], f: impl Fn(f64) -> T) -> Array<T> {
    Array::from_vec(DEV, shape, xs.iter().map(|&x| f(x)).collect()).unwrap()
}

/// Checks `o` and `lse` against the naive values within the library's stated bound for an
/// accumulator of unit roundoff `u`: ε = u·((dk + 2)·A + tk + 8 + |L|), o within
/// (2ε + (tk + 8)·u)·max|v| (plus `extra` for operands rounded to their dtype).
fn check(c: &Case, got_o: &[f64], got_l: &[f64], want: &(Vec<f64>, Vec<f64>, Vec<f64>), vmax: f64, u: f64, extra: f64) {
    let (o, l, a) = want;
    for r in 0..l.len() {
        if l[r] == f64::NEG_INFINITY {
            assert_eq!(got_l[r], f64::NEG_INFINITY, "row {r}: no visible key");
            assert!(got_o[r * c.dv..(r + 1) * c.dv].iter().all(|x| x.to_bits() == 0), "row {r}: o = +0");
            continue;
        }
        let eps = u * ((c.dk + 2) as f64 * a[r] + c.tk as f64 + 8.0 + l[r].abs()) + extra;
        assert!((got_l[r] - l[r]).abs() <= eps, "row {r}: lse {} vs {} (ε {eps})", got_l[r], l[r]);
        for d in 0..c.dv {
            let (g, w) = (got_o[r * c.dv + d], o[r * c.dv + d]);
            let bound = (2.0 * eps + (c.tk + 8) as f64 * u) * vmax + extra;
            assert!((g - w).abs() <= bound, "row {r}, {d}: o {g} vs {w} (bound {bound})");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn dense_attention_matches_the_naive_softmax(
        lead in 1usize..=2, hk in 1usize..=2, group in 1usize..=3, tq in 0usize..=70, tk in 0usize..=140,
        dk in 1usize..=9, dv in 1usize..=5, causal in prop::option::of(-3i64..=3), with_len in any::<bool>(),
        f64acc in any::<bool>(),
    ) {
        let hq = hk * group;
        let lengths = with_len.then(|| (0..lead).map(|b| (b * 37 + 5) % (tk + 1)).collect::<Vec<_>>());
        let c = Case { lead, hq, hk, tq, tk, dk, dv, causal };
        let q: Vec<f64> = (0..lead * hq * tq * dk).map(|k| val(k, 1) as f32 as f64).collect();
        let k: Vec<f64> = (0..lead * hk * tk * dk).map(|x| val(x, 2) as f32 as f64).collect();
        let v: Vec<f64> = (0..lead * hk * tk * dv).map(|x| val(x, 3) as f32 as f64).collect();
        let scale = 1.0 / (dk as f64).sqrt();
        let acc = if f64acc { Dtype::F64 } else { Dtype::F32 };
        let spec = Attention { scale, causal, acc };
        let (qa, ka, va) = (arr(&[lead, hq, tq, dk], &q, |x| x as f32), arr(&[lead, hk, tk, dk], &k, |x| x as f32), arr(&[lead, hk, tk, dv], &v, |x| x as f32));
        let len_a = lengths.as_ref().map(|l| Array::from_vec(DEV, &[lead], l.iter().map(|&x| x as i64).collect()).unwrap());
        let o = Array::<f32>::zeros(DEV, &[lead, hq, tq, dv]).unwrap();
        let len_op = len_a.as_ref().map(|a| a as &dyn nx_kernels::Operand);
        let scale_r = if f64acc { scale } else { scale as f32 as f64 };
        let want = naive(&c, &q, &k, &v, scale_r, &|b, t| lengths.as_ref().is_none_or(|l| t < l[b]));
        let (u, extra) = if f64acc { (f64::EPSILON / 2.0, f64::from(f32::EPSILON)) } else { (f64::from(f32::EPSILON) / 2.0, 0.0) };
        if f64acc {
            let lse = Array::<f64>::zeros(DEV, &[lead, hq, tq]).unwrap();
            prop_assert_eq!(Host::new().attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, len_op), Answer::Done);
            let go: Vec<f64> = o.to_vec().unwrap().iter().map(|&x| f64::from(x)).collect();
            check(&c, &go, &lse.to_vec().unwrap(), &want, 1.0, u, extra);
        } else {
            let lse = Array::<f32>::zeros(DEV, &[lead, hq, tq]).unwrap();
            prop_assert_eq!(Host::new().attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, len_op), Answer::Done);
            let go: Vec<f64> = o.to_vec().unwrap().iter().map(|&x| f64::from(x)).collect();
            let gl: Vec<f64> = lse.to_vec().unwrap().iter().map(|&x| f64::from(x)).collect();
            check(&c, &go, &gl, &want, 1.0, u, 0.0);
        }
    }
}

#[test]
fn paged_attention_reads_pages_through_the_table_and_skips_holes() {
    // lead 2, hk 2 (hq 4), pages of 16, 5 table entries each (tk = 80), one hole per lead
    let (lead, hq, hk, tq, page, maxp, pages, dk, dv) = (2, 4, 2, 9, 16, 5, 7, 8, 3);
    let tk = maxp * page;
    let table: Vec<i64> = vec![3, 0, -1, 6, 2, 5, 1, 4, 9, 0];
    let hole = |b: usize, t: usize| {
        let e = table[b * maxp + t / page];
        (0..pages as i64).contains(&e)
    };
    let pool_k: Vec<f64> = (0..pages * hk * page * dk).map(|x| val(x, 5) as f32 as f64).collect();
    let pool_v: Vec<f64> = (0..pages * hk * page * dv).map(|x| val(x, 6) as f32 as f64).collect();
    // the dense keys the table describes (zeros at holes, never visible there)
    let mut k = vec![0.0; lead * hk * tk * dk];
    let mut v = vec![0.0; lead * hk * tk * dv];
    for b in 0..lead {
        for g in 0..hk {
            for t in 0..tk {
                if !hole(b, t) {
                    continue;
                }
                let e = table[b * maxp + t / page] as usize;
                for d in 0..dk {
                    k[((b * hk + g) * tk + t) * dk + d] = pool_k[((e * hk + g) * page + t % page) * dk + d];
                }
                for d in 0..dv {
                    v[((b * hk + g) * tk + t) * dv + d] = pool_v[((e * hk + g) * page + t % page) * dv + d];
                }
            }
        }
    }
    let q: Vec<f64> = (0..lead * hq * tq * dk).map(|x| val(x, 7) as f32 as f64).collect();
    let lengths = [70usize, 33];
    let c = Case { lead, hq, hk, tq, tk, dk, dv, causal: Some(60) };
    let want = naive(&c, &q, &k, &v, 0.25, &|b, t| hole(b, t) && t < lengths[b]);
    let qa = arr(&[lead, hq, tq, dk], &q, |x| x);
    let (pk, pv) = (arr(&[pages, hk, page, dk], &pool_k, |x| x), arr(&[pages, hk, page, dv], &pool_v, |x| x));
    let ta = Array::from_vec(DEV, &[lead, maxp], table.clone()).unwrap();
    let la = Array::from_vec(DEV, &[lead], lengths.iter().map(|&x| x as i64).collect()).unwrap();
    let (o, lse) =
        (Array::<f64>::zeros(DEV, &[lead, hq, tq, dv]).unwrap(), Array::<f64>::zeros(DEV, &[lead, hq, tq]).unwrap());
    let spec = Attention { scale: 0.25, causal: Some(60), acc: Dtype::F64 };
    assert_eq!(
        Host::new().attention(&spec, &o, &lse, &qa, Kv::Paged { k: &pk, v: &pv, table: &ta }, Some(&la)),
        Answer::Done
    );
    check(&c, &o.to_vec().unwrap(), &lse.to_vec().unwrap(), &want, 1.0, f64::EPSILON / 2.0, 0.0);
    // values past a lead's length are never read: lead 1 (length 33) reads page 4 at its slot 2
    // (keys 32..48), a page no other lead reads; poison its rows of keys 33.. and the same bits
    // come out
    let mut poisoned_v = pool_v.clone();
    for g in 0..hk {
        for row in 1..page {
            for d in 0..dv {
                poisoned_v[((4 * hk + g) * page + row) * dv + d] = f64::NAN;
            }
        }
    }
    let pv2 = arr(&[pages, hk, page, dv], &poisoned_v, |x| x);
    let o2 = Array::<f64>::zeros(DEV, &[lead, hq, tq, dv]).unwrap();
    let lse2 = Array::<f64>::zeros(DEV, &[lead, hq, tq]).unwrap();
    assert_eq!(
        Host::new().attention(&spec, &o2, &lse2, &qa, Kv::Paged { k: &pk, v: &pv2, table: &ta }, Some(&la)),
        Answer::Done
    );
    let bits = |a: &Array<f64>| a.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&o2), bits(&o), "values past the length are never read");
}

#[test]
fn grouped_heads_bf16_strided_queries_threads_and_refusals() {
    let (lead, hq, hk, tq, tk, dk, dv) = (1, 4, 2, 150, 300, 16, 8);
    let q: Vec<f64> = (0..lead * hq * tq * dk).map(|x| bf16::from_f64(val(x, 8)).to_f64()).collect();
    let k: Vec<f64> = (0..lead * hk * tk * dk).map(|x| bf16::from_f64(val(x, 9)).to_f64()).collect();
    let v: Vec<f64> = (0..lead * hk * tk * dv).map(|x| bf16::from_f64(val(x, 10)).to_f64()).collect();
    // q as a transposed view: [lead, hq, dk, tq] stored, permuted to [lead, hq, tq, dk]
    let mut qt = vec![0.0; q.len()];
    for h in 0..hq {
        for i in 0..tq {
            for d in 0..dk {
                qt[(h * dk + d) * tq + i] = q[(h * tq + i) * dk + d];
            }
        }
    }
    let qa = arr(&[lead, hq, dk, tq], &qt, bf16::from_f64).apply(&Move::Permute(vec![0, 1, 3, 2])).unwrap().unwrap();
    let (ka, va) = (arr(&[lead, hk, tk, dk], &k, bf16::from_f64), arr(&[lead, hk, tk, dv], &v, bf16::from_f64));
    let spec = Attention { scale: 0.25, causal: Some(150), acc: Dtype::F32 };
    let c = Case { lead, hq, hk, tq, tk, dk, dv, causal: Some(150) };
    let want = naive(&c, &q, &k, &v, 0.25, &|_, _| true);
    let run = |threads: usize| {
        let (o, lse) = (
            Array::<f32>::zeros(DEV, &[lead, hq, tq, dv]).unwrap(),
            Array::<f32>::zeros(DEV, &[lead, hq, tq]).unwrap(),
        );
        assert_eq!(
            Host::with_threads(threads).unwrap().attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None),
            Answer::Done
        );
        (o.to_vec().unwrap(), lse.to_vec().unwrap())
    };
    let (o1, l1) = run(1);
    let go: Vec<f64> = o1.iter().map(|&x| f64::from(x)).collect();
    let gl: Vec<f64> = l1.iter().map(|&x| f64::from(x)).collect();
    check(&c, &go, &gl, &want, 1.0, f64::from(f32::EPSILON) / 2.0, 0.0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for t in [2, 8] {
        let (o, l) = run(t);
        assert_eq!((bits(&o), bits(&l)), (bits(&o1), bits(&l1)), "{t} threads");
    }
    // bf16 output rounds once from the f32 result
    let ob = Array::<bf16>::zeros(DEV, &[lead, hq, tq, dv]).unwrap();
    let lse = Array::<f32>::zeros(DEV, &[lead, hq, tq]).unwrap();
    assert_eq!(Host::new().attention(&spec, &ob, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::Done);
    assert!(ob.to_vec().unwrap().iter().zip(&o1).all(|(b, f)| *b == bf16::from_f32(*f)));
    // refusals
    let host = Host::new();
    let f64s = Array::<f64>::zeros(DEV, &[lead, hq, tq]).unwrap();
    assert_eq!(
        host.attention(&spec, &ob, &f64s, &qa, Kv::Dense { k: &ka, v: &va }, None),
        Answer::WrongDtype,
        "lse of another dtype"
    );
    let bad = Attention { acc: Dtype::BF16, ..spec.clone() };
    assert_eq!(host.attention(&bad, &ob, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::WrongDtype);
    let k3 = Array::<bf16>::zeros(DEV, &[lead, 3, tk, dk]).unwrap();
    assert_eq!(
        host.attention(&spec, &ob, &lse, &qa, Kv::Dense { k: &k3, v: &va }, None),
        Answer::ShapeMismatch,
        "hk must divide hq"
    );
    let wide = Array::<f32>::zeros(DEV, &[lead, hq, tq, dv + 1]).unwrap();
    assert_eq!(host.attention(&spec, &wide, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::ShapeMismatch);
    let long = Array::from_vec(DEV, &[lead], vec![tk as i64 + 1]).unwrap();
    let o = Array::<f32>::from_vec(DEV, &[lead, hq, tq, dv], vec![7.0; lead * hq * tq * dv]).unwrap();
    assert_eq!(
        host.attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, Some(&long)),
        Answer::IndexOutOfRange
    );
    assert!(o.to_vec().unwrap().iter().all(|&x| x == 7.0), "nothing written");
    let q2 = Array::<f32>::zeros(DEV, &[tq, dk]).unwrap();
    assert_eq!(host.attention(&spec, &o, &lse, &q2, Kv::Dense { k: &ka, v: &va }, None), Answer::ShapeMismatch);
}

#[test]
fn an_output_identical_to_an_operand_and_a_huge_causal_offset() {
    let q = arr(&[1, 1, 4, 2], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], |x| x as f32);
    let lse = Array::<f32>::zeros(DEV, &[1, 1, 4]).unwrap();
    let spec = Attention { scale: 1.0, causal: Some(i64::MAX), acc: Dtype::F32 };
    let k = q.copy().unwrap();
    assert_eq!(Host::new().attention(&spec, &q, &lse, &q, Kv::Dense { k: &k, v: &k }, None), Answer::Overlapping);
    let o = Array::<f32>::zeros(DEV, &[1, 1, 4, 2]).unwrap();
    assert_eq!(
        Host::new().attention(&spec, &o, &lse, &q, Kv::Dense { k: &k, v: &k }, None),
        Answer::Done,
        "every key visible"
    );
    let none = Attention { causal: Some(i64::MIN), ..spec };
    assert_eq!(Host::new().attention(&none, &o, &lse, &q, Kv::Dense { k: &k, v: &k }, None), Answer::Done);
    assert!(lse.to_vec().unwrap().iter().all(|&l| l == f32::NEG_INFINITY), "no key visible");
}

#[test]
fn long_queries_span_several_blocks_and_key_tiles_under_causal_offsets() {
    // more query rows than two of the kernel's blocks (256 rows) and keys over several tiles
    // (128 keys), both with a remainder; offsets that leave early rows nothing to see, keys that
    // start past a block's first rows, and keys left over past the last query
    let (lead, hq, hk, tq, tk, dk, dv) = (1, 2, 1, 2 * 256 + 7, 2 * 256 + 7 + 130, 8, 4);
    let q: Vec<f64> = (0..lead * hq * tq * dk).map(|x| val(x, 11) as f32 as f64).collect();
    let k: Vec<f64> = (0..lead * hk * tk * dk).map(|x| val(x, 12) as f32 as f64).collect();
    let v: Vec<f64> = (0..lead * hk * tk * dv).map(|x| val(x, 13) as f32 as f64).collect();
    let (qa, ka, va) = (
        arr(&[lead, hq, tq, dk], &q, |x| x as f32),
        arr(&[lead, hk, tk, dk], &k, |x| x as f32),
        arr(&[lead, hk, tk, dv], &v, |x| x as f32),
    );
    for off in [-300, -5, 0, 1, 130, 200] {
        let spec = Attention { scale: 0.7, causal: Some(off), acc: Dtype::F32 };
        let c = Case { lead, hq, hk, tq, tk, dk, dv, causal: Some(off) };
        let want = naive(&c, &q, &k, &v, 0.7, &|_, _| true);
        let run = |threads: usize| {
            let (o, lse) = (
                Array::<f32>::zeros(DEV, &[lead, hq, tq, dv]).unwrap(),
                Array::<f32>::zeros(DEV, &[lead, hq, tq]).unwrap(),
            );
            let kv = Kv::Dense { k: &ka, v: &va };
            assert_eq!(Host::with_threads(threads).unwrap().attention(&spec, &o, &lse, &qa, kv, None), Answer::Done);
            (o.to_vec().unwrap(), lse.to_vec().unwrap())
        };
        let (o1, l1) = run(1);
        let go: Vec<f64> = o1.iter().map(|&x| f64::from(x)).collect();
        let gl: Vec<f64> = l1.iter().map(|&x| f64::from(x)).collect();
        check(&c, &go, &gl, &want, 1.0, f64::from(f32::EPSILON) / 2.0, 0.0);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (o2, l2) = run(2);
        assert_eq!((bits(&o2), bits(&l2)), (bits(&o1), bits(&l1)), "offset {off}: 2 threads");
    }
}

#[test]
fn a_score_that_overflows_makes_its_row_nan() {
    // q·k = 2·(1e20)² overflows f32 on row 0 only; row 1 stays finite
    let (q, k, v) = (vec![1e20f32, 1e20, 1e-3, 1e-3], vec![1e20f32, 1e20, 1.0, 1.0], vec![1.0f32, 2.0, 3.0, 4.0]);
    let qa = Array::from_vec(DEV, &[1, 1, 2, 2], q).unwrap();
    let (ka, va) = (Array::from_vec(DEV, &[1, 1, 2, 2], k).unwrap(), Array::from_vec(DEV, &[1, 1, 2, 2], v).unwrap());
    let (o, lse) = (Array::<f32>::zeros(DEV, &[1, 1, 2, 2]).unwrap(), Array::<f32>::zeros(DEV, &[1, 1, 2]).unwrap());
    let spec = Attention { scale: 1.0, causal: None, acc: Dtype::F32 };
    assert_eq!(Host::new().attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::Done);
    let (o, lse) = (o.to_vec().unwrap(), lse.to_vec().unwrap());
    assert!(lse[0].is_nan() && o[..2].iter().all(|x| x.is_nan()), "row 0: {o:?} {lse:?}");
    assert!(lse[1].is_finite() && o[2..].iter().all(|x| x.is_finite()), "row 1: {o:?} {lse:?}");
}
