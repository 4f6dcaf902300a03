//! The attention's gradient of the host library against a naive one in f64 written here (the
//! softmax from the scores, `D` as `rowsum(P ∘ dP)`, every product by loops): grouped query heads,
//! causal masks at several offsets, rows that see no key, blocks of rows past the kernel's block,
//! products on both of its paths, bf16 operands, f32 and f64 accumulators, refusals, and the same
//! bits on 1, 2 and 8 threads.

use half::bf16;
use nx_kernels::{Answer, Array, Attention, AttentionGrad, Dtype, Element, Host, Kernels, Kv};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize, salt: usize) -> f64 {
    (((k * 7919 + salt * 104_729) % 10007) as f64 / 10007.0 - 0.5) * 2.0
}

#[derive(Clone, Copy, Debug)]
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

/// The naive (dq, dk, dv) in f64 of `c` on q, k, v and the output's gradient `go` (C order).
fn naive(c: &Case, q: &[f64], k: &[f64], v: &[f64], go: &[f64], scale: f64) -> [Vec<f64>; 3] {
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..c.lead {
        for h in 0..c.hq {
            let g = h / (c.hq / c.hk);
            let kb = (b * c.hk + g) * c.tk;
            for i in 0..c.tq {
                let qi = ((b * c.hq + h) * c.tq + i) * c.dk;
                let oi = ((b * c.hq + h) * c.tq + i) * c.dv;
                let seen: Vec<usize> =
                    (0..c.tk).filter(|&t| c.causal.is_none_or(|off| t as i64 <= i as i64 + off)).collect();
                if seen.is_empty() {
                    continue;
                }
                let s: Vec<f64> = seen
                    .iter()
                    .map(|&t| scale * (0..c.dk).map(|d| q[qi + d] * k[(kb + t) * c.dk + d]).sum::<f64>())
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let dp: Vec<f64> =
                    seen.iter().map(|&t| (0..c.dv).map(|d| go[oi + d] * v[(kb + t) * c.dv + d]).sum::<f64>()).collect();
                let dsum: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (j, &t) in seen.iter().enumerate() {
                    let ds = p[j] * (dp[j] - dsum);
                    for d in 0..c.dk {
                        dq[qi + d] += scale * ds * k[(kb + t) * c.dk + d];
                        dk[(kb + t) * c.dk + d] += scale * ds * q[qi + d];
                    }
                    for d in 0..c.dv {
                        dv[(kb + t) * c.dv + d] += p[j] * go[oi + d];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

fn arr<T: Element>(shape: &[usize], xs: &[f64], f: impl Fn(f64) -> T) -> Array<T> {
    Array::from_vec(DEV, shape, xs.iter().map(|&x| f(x)).collect()).unwrap()
}

/// The case's operands (values rounded to `f32`'s): q, k, v and the output's gradient.
fn operands(c: &Case, round: fn(f64) -> f64) -> [Vec<f64>; 4] {
    let n = |a: usize, b: usize, d: usize| c.lead * a * b * d;
    [
        (0..n(c.hq, c.tq, c.dk)).map(|x| round(val(x, 1))).collect(),
        (0..n(c.hk, c.tk, c.dk)).map(|x| round(val(x, 2))).collect(),
        (0..n(c.hk, c.tk, c.dv)).map(|x| round(val(x, 3))).collect(),
        (0..n(c.hq, c.tq, c.dv)).map(|x| round(val(x, 4))).collect(),
    ]
}

/// The host's forward (o, lse) and gradients of `c` in `T` with an accumulator `L` on `threads`.
fn host_grads<T: Element, L: Element>(
    c: &Case,
    xs: &[Vec<f64>; 4],
    spec: &Attention,
    to: fn(f64) -> T,
    threads: usize,
) -> [Array<T>; 3] {
    let Case { lead, hq, hk, tq, tk, dk, dv, .. } = *c;
    let host = Host::with_threads(threads).unwrap();
    let q = arr(&[lead, hq, tq, dk], &xs[0], to);
    let k = arr(&[lead, hk, tk, dk], &xs[1], to);
    let v = arr(&[lead, hk, tk, dv], &xs[2], to);
    let go = arr(&[lead, hq, tq, dv], &xs[3], to);
    let o = Array::<T>::zeros(DEV, &[lead, hq, tq, dv]).unwrap();
    let lse = Array::<L>::zeros(DEV, &[lead, hq, tq]).unwrap();
    assert_eq!(host.attention(spec, &o, &lse, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Done);
    let dq = Array::<T>::zeros(DEV, &[lead, hq, tq, dk]).unwrap();
    let dk_ = Array::<T>::zeros(DEV, &[lead, hk, tk, dk]).unwrap();
    let dv_ = Array::<T>::zeros(DEV, &[lead, hk, tk, dv]).unwrap();
    let g = AttentionGrad { q: &q, k: &k, v: &v, o: &o, lse: &lse, d_o: &go, dq: &dq, dk: &dk_, dv: &dv_ };
    assert_eq!(host.attention_grad(spec, g), Answer::Done);
    [dq, dk_, dv_]
}

/// Checks each gradient against the naive one: within `u·32·(tk + dk + dv + 16)·(1 + max|want|)`.
fn check(c: &Case, got: &[Vec<f64>; 3], want: &[Vec<f64>; 3], u: f64) {
    for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(want)) {
        assert_eq!(g.len(), w.len());
        let top = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let bound = u * 32.0 * (c.tk + c.dk + c.dv + 16) as f64 * (1.0 + top);
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!((a - b).abs() <= bound, "{c:?} {name}[{i}]: {a} vs {b} (bound {bound})");
        }
    }
}

fn f64s<T: Element + Into<f64>>(a: &Array<T>) -> Vec<f64> {
    a.to_vec().unwrap().into_iter().map(Into::into).collect()
}

fn run_case(c: &Case, f64acc: bool) {
    let scale = 1.0 / (c.dk.max(1) as f64).sqrt();
    if f64acc {
        let spec = Attention { scale, causal: c.causal, acc: Dtype::F64 };
        let xs = operands(c, |x| x);
        let want = naive(c, &xs[0], &xs[1], &xs[2], &xs[3], scale);
        let got = host_grads::<f64, f64>(c, &xs, &spec, |x| x, 2);
        check(c, &[f64s(&got[0]), f64s(&got[1]), f64s(&got[2])], &want, f64::EPSILON / 2.0);
    } else {
        let spec = Attention { scale, causal: c.causal, acc: Dtype::F32 };
        let xs = operands(c, |x| x as f32 as f64);
        let want = naive(c, &xs[0], &xs[1], &xs[2], &xs[3], scale as f32 as f64);
        let got = host_grads::<f32, f32>(c, &xs, &spec, |x| x as f32, 2);
        check(c, &[f64s(&got[0]), f64s(&got[1]), f64s(&got[2])], &want, f64::from(f32::EPSILON) / 2.0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_gradient_matches_the_naive_one(
        lead in 1usize..=2, hk in 1usize..=2, group in 1usize..=3, tq in 0usize..=40, tk in 0usize..=60,
        dk in 1usize..=20, dv in 1usize..=18, causal in prop::option::of(-3i64..=3), f64acc in any::<bool>(),
    ) {
        run_case(&Case { lead, hq: hk * group, hk, tq, tk, dk, dv, causal }, f64acc);
    }
}

#[test]
fn blocks_of_rows_and_products_through_faer() {
    // 300 rows: blocks of 128, 128 and 44; the first blocks' products pass faer's threshold
    for (causal, f64acc) in [(Some(0), false), (None, true), (Some(-5), false), (Some(40), true)] {
        run_case(&Case { lead: 1, hq: 2, hk: 1, tq: 300, tk: 260, dk: 24, dv: 16, causal }, f64acc);
    }
}

#[test]
fn rows_that_see_no_key_get_no_gradient_and_empty_axes_write_nothing() {
    let c = Case { lead: 2, hq: 2, hk: 2, tq: 6, tk: 5, dk: 3, dv: 2, causal: Some(-2) };
    let spec = Attention { scale: 0.5, causal: c.causal, acc: Dtype::F32 };
    let xs = operands(&c, |x| x as f32 as f64);
    let [dq, dk, _] = host_grads::<f32, f32>(&c, &xs, &spec, |x| x as f32, 1);
    let dq = dq.to_vec().unwrap();
    for bh in 0..4 {
        // rows 0 and 1 see no key under an offset of −2
        assert!(dq[bh * 18..bh * 18 + 6].iter().all(|x| x.to_bits() == 0), "{bh}: {:?}", &dq[bh * 18..][..6]);
        assert!(dq[bh * 18 + 6..(bh + 1) * 18].iter().any(|&x| x != 0.0));
    }
    // key 4 is seen by rows from 6 on, which do not exist: no gradient
    let dk = dk.to_vec().unwrap();
    for bg in 0..4 {
        assert!(dk[bg * 15 + 12..bg * 15 + 15].iter().all(|x| x.to_bits() == 0), "{bg}");
    }
    for (tq, tk, dk, dv) in [(0, 4, 3, 2), (3, 0, 3, 2), (3, 4, 0, 2), (3, 4, 3, 0)] {
        let c = Case { lead: 1, hq: 1, hk: 1, tq, tk, dk, dv, causal: None };
        run_case(&c, false);
        if tk == 0 || dv == 0 {
            // no key, or values of no features: every gradient is zero
            let xs = operands(&c, |x| x as f32 as f64);
            let spec = Attention { scale: 1.0, causal: None, acc: Dtype::F32 };
            for g in host_grads::<f32, f32>(&c, &xs, &spec, |x| x as f32, 1) {
                assert!(g.to_vec().unwrap().iter().all(|x| x.to_bits() == 0));
            }
        }
    }
}

#[test]
fn bf16_operands_and_the_same_bits_on_any_threads() {
    let c = Case { lead: 3, hq: 4, hk: 2, tq: 150, tk: 150, dk: 16, dv: 8, causal: Some(0) };
    let spec = Attention { scale: 0.25, causal: c.causal, acc: Dtype::F32 };
    let xs = operands(&c, |x| bf16::from_f64(x).to_f64());
    let bits = |a: &[Array<bf16>; 3]| {
        a.iter().map(|x| x.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let one = host_grads::<bf16, f32>(&c, &xs, &spec, bf16::from_f64, 1);
    let bits32 = |a: &[Array<f32>; 3]| {
        a.iter().map(|x| x.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let one32 = host_grads::<f32, f32>(&c, &xs, &spec, |x| x as f32, 1);
    for t in [2, 8] {
        assert_eq!(bits(&host_grads::<bf16, f32>(&c, &xs, &spec, bf16::from_f64, t)), bits(&one), "{t} threads");
        assert_eq!(bits32(&host_grads::<f32, f32>(&c, &xs, &spec, |x| x as f32, t)), bits32(&one32), "{t} threads");
    }
    // each result rounds once from f32 to bf16; o rounds too, so D carries bf16's error: 2⁻⁸ of the
    // naive result's scale
    let want = naive(&c, &xs[0], &xs[1], &xs[2], &xs[3], 0.25);
    for (g, w) in one.iter().zip(&want) {
        let top = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (a, b) in g.to_vec().unwrap().iter().zip(w) {
            assert!((a.to_f64() - b).abs() <= top / 64.0 + 1e-3, "{a} vs {b}");
        }
    }
}

#[test]
fn refusals() {
    let (q, k, v) = (
        Array::<f32>::zeros(DEV, &[1, 2, 3, 4]).unwrap(),
        Array::<f32>::zeros(DEV, &[1, 1, 5, 4]).unwrap(),
        Array::<f32>::zeros(DEV, &[1, 1, 5, 2]).unwrap(),
    );
    let (o, go) = (Array::<f32>::zeros(DEV, &[1, 2, 3, 2]).unwrap(), Array::<f32>::zeros(DEV, &[1, 2, 3, 2]).unwrap());
    let lse = Array::<f32>::zeros(DEV, &[1, 2, 3]).unwrap();
    let (dq, dk, dv) = (q.copy().unwrap(), k.copy().unwrap(), v.copy().unwrap());
    let spec = Attention { scale: 0.5, causal: None, acc: Dtype::F32 };
    let host = Host::new();
    let g = AttentionGrad { q: &q, k: &k, v: &v, o: &o, lse: &lse, d_o: &go, dq: &dq, dk: &dk, dv: &dv };
    assert_eq!(host.attention_grad(&spec, g), Answer::Done);
    let l64 = Array::<f64>::zeros(DEV, &[1, 2, 3]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { lse: &l64, ..g }), Answer::WrongDtype, "lse of f64");
    let d64 = Array::<f64>::zeros(DEV, &[1, 2, 3, 4]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { dq: &d64, ..g }), Answer::WrongDtype, "dq wider");
    let i = Array::<i32>::zeros(DEV, &[1, 2, 3, 2]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { d_o: &i, ..g }), Answer::WrongDtype, "integer d_o");
    let small = Array::<f32>::zeros(DEV, &[1, 1, 4, 4]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { dk: &small, ..g }), Answer::ShapeMismatch);
    let o3 = Array::<f32>::zeros(DEV, &[1, 2, 3, 3]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { o: &o3, ..g }), Answer::ShapeMismatch);
    assert_eq!(host.attention_grad(&spec, AttentionGrad { d_o: &o3, ..g }), Answer::ShapeMismatch);
    let l2 = Array::<f32>::zeros(DEV, &[1, 2, 4]).unwrap();
    assert_eq!(host.attention_grad(&spec, AttentionGrad { lse: &l2, ..g }), Answer::ShapeMismatch);
    let k3 = Array::<f32>::zeros(DEV, &[1, 3, 5, 4]).unwrap();
    assert_eq!(
        host.attention_grad(&spec, AttentionGrad { k: &k3, dk: &k3.copy().unwrap(), ..g }),
        Answer::ShapeMismatch
    );
    // a destination that is an operand, or another destination
    assert_eq!(host.attention_grad(&spec, AttentionGrad { dq: &q, ..g }), Answer::Overlapping);
    let v4 = Array::<f32>::zeros(DEV, &[1, 1, 5, 4]).unwrap();
    let o4 = Array::<f32>::zeros(DEV, &[1, 2, 3, 4]).unwrap();
    let square = AttentionGrad { v: &v4, o: &o4, d_o: &o4, dv: &v4.copy().unwrap(), ..g };
    assert_eq!(host.attention_grad(&spec, square), Answer::Done);
    assert_eq!(host.attention_grad(&spec, AttentionGrad { dv: &dk, ..square }), Answer::Overlapping, "dk is dv");
    let q2 = Array::<f32>::zeros(DEV, &[2, 4]).unwrap();
    assert_eq!(
        host.attention_grad(&spec, AttentionGrad { q: &q2, dq: &q2.copy().unwrap(), ..g }),
        Answer::ShapeMismatch
    );
    let dq_t = Array::<f32>::zeros(DEV, &[1, 2, 4, 3])
        .unwrap()
        .apply(&nx_kernels::Move::Permute(vec![0, 1, 3, 2]))
        .unwrap()
        .unwrap();
    assert_eq!(dq_t.layout().shape(), [1, 2, 3, 4]);
    assert_eq!(host.attention_grad(&spec, AttentionGrad { dq: &dq_t, ..g }), Answer::Declined, "a strided dq");
}

#[test]
fn strided_operands_and_an_f64_accumulator_into_f32() {
    // k given transposed ([lead, hk, dk, tk] stored, permuted) and an f64 accumulator writing f32
    let c = Case { lead: 2, hq: 3, hk: 1, tq: 7, tk: 9, dk: 5, dv: 17, causal: Some(1) };
    let xs = operands(&c, |x| x as f32 as f64);
    let scale = 0.4;
    let want = naive(&c, &xs[0], &xs[1], &xs[2], &xs[3], scale);
    let mut kt = vec![0.0; xs[1].len()];
    for b in 0..c.lead {
        for t in 0..c.tk {
            for d in 0..c.dk {
                kt[(b * c.dk + d) * c.tk + t] = xs[1][(b * c.tk + t) * c.dk + d];
            }
        }
    }
    let k = arr(&[c.lead, 1, c.dk, c.tk], &kt, |x| x as f32)
        .apply(&nx_kernels::Move::Permute(vec![0, 1, 3, 2]))
        .unwrap()
        .unwrap();
    let q = arr(&[c.lead, c.hq, c.tq, c.dk], &xs[0], |x| x as f32);
    let v = arr(&[c.lead, 1, c.tk, c.dv], &xs[2], |x| x as f32);
    let go = arr(&[c.lead, c.hq, c.tq, c.dv], &xs[3], |x| x as f32);
    let spec = Attention { scale, causal: c.causal, acc: Dtype::F64 };
    let host = Host::new();
    let o = Array::<f32>::zeros(DEV, &[c.lead, c.hq, c.tq, c.dv]).unwrap();
    let lse = Array::<f64>::zeros(DEV, &[c.lead, c.hq, c.tq]).unwrap();
    assert_eq!(host.attention(&spec, &o, &lse, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Done);
    let (dq, dk, dv) = (
        Array::<f32>::zeros(DEV, &[c.lead, c.hq, c.tq, c.dk]).unwrap(),
        Array::<f32>::zeros(DEV, &[c.lead, 1, c.tk, c.dk]).unwrap(),
        Array::<f32>::zeros(DEV, &[c.lead, 1, c.tk, c.dv]).unwrap(),
    );
    let g = AttentionGrad { q: &q, k: &k, v: &v, o: &o, lse: &lse, d_o: &go, dq: &dq, dk: &dk, dv: &dv };
    assert_eq!(host.attention_grad(&spec, g), Answer::Done);
    // o is rounded to f32 and so is each result: f32's bound
    check(&c, &[f64s(&dq), f64s(&dk), f64s(&dv)], &want, f64::from(f32::EPSILON) / 2.0);
}

#[test]
fn an_infinite_output_gradient_leaves_hidden_pairs_at_zero() {
    // row 0 sees key 0 alone; an infinite dO in row 0 makes its dP infinite at both keys, and key 1,
    // which row 0 does not see, must keep the finite gradient row 1 gives it (not 0·(∞ − ∞))
    let c = Case { lead: 1, hq: 1, hk: 1, tq: 2, tk: 2, dk: 1, dv: 1, causal: Some(0) };
    let xs = [vec![0.5, -0.25], vec![1.0, 2.0], vec![0.5, 1.5], vec![f64::INFINITY, 1.0]];
    let spec = Attention { scale: 1.0, causal: c.causal, acc: Dtype::F64 };
    let [_, dk, _] = host_grads::<f64, f64>(&c, &xs, &spec, |x| x, 1);
    let dk = dk.to_vec().unwrap();
    let finite = [xs[0].clone(), xs[1].clone(), xs[2].clone(), vec![0.0, 1.0]];
    let want = naive(&c, &finite[0], &finite[1], &finite[2], &finite[3], 1.0);
    assert!((dk[1] - want[1][1]).abs() <= 1e-15, "key 1: {} vs {}", dk[1], want[1][1]);
}

/// `xs` of C order over `[lead, h, t, d]` rewritten in C order over `[lead, t, h, d]`.
fn rows_first(xs: &[f64], lead: usize, h: usize, t: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; xs.len()];
    for b in 0..lead {
        for hh in 0..h {
            for i in 0..t {
                for e in 0..d {
                    out[((b * t + i) * h + hh) * d + e] = xs[((b * h + hh) * t + i) * d + e];
                }
            }
        }
    }
    out
}

/// The forward and backward of `c` with every operand and destination a view `[lead, h, t, d]`
/// of a dense `[lead, t, h, d]` array, against the dense layout's bits (and the naive gradient
/// within `u`'s bound).
fn rows_first_case<T: Element + PartialEq + std::fmt::Debug, L: Element + PartialEq + std::fmt::Debug>(
    c: &Case,
    spec: &Attention,
    to: fn(f64) -> T,
    round: fn(f64) -> f64,
    u: f64,
) where
    f64: From<T>,
{
    let swap = |a: Array<T>| a.apply(&nx_kernels::Move::Permute(vec![0, 2, 1, 3])).unwrap().unwrap();
    let xs = operands(c, round);
    let want = naive(c, &xs[0], &xs[1], &xs[2], &xs[3], spec.scale);
    let dense = host_grads::<T, L>(c, &xs, spec, to, 2);
    let Case { lead, hq, hk, tq, tk, dk, dv, .. } = *c;
    let q = swap(arr(&[lead, tq, hq, dk], &rows_first(&xs[0], lead, hq, tq, dk), to));
    let k = swap(arr(&[lead, tk, hk, dk], &rows_first(&xs[1], lead, hk, tk, dk), to));
    let v = swap(arr(&[lead, tk, hk, dv], &rows_first(&xs[2], lead, hk, tk, dv), to));
    let go = swap(arr(&[lead, tq, hq, dv], &rows_first(&xs[3], lead, hq, tq, dv), to));
    let zeros = |s: &[usize]| Array::<T>::zeros(DEV, s).unwrap();
    let (o_rows, dq_rows, dk_rows, dv_rows) = (
        zeros(&[lead, tq, hq, dv]),
        zeros(&[lead, tq, hq, dk]),
        zeros(&[lead, tk, hk, dk]),
        zeros(&[lead, tk, hk, dv]),
    );
    let (o, dq, dk_, dv_) = (swap(o_rows.clone()), swap(dq_rows.clone()), swap(dk_rows.clone()), swap(dv_rows.clone()));
    assert!(!o.layout().is_contiguous());
    let lse = Array::<L>::zeros(DEV, &[lead, hq, tq]).unwrap();
    let host = Host::with_threads(2).unwrap();
    assert_eq!(host.attention(spec, &o, &lse, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Done);
    let g = AttentionGrad { q: &q, k: &k, v: &v, o: &o, lse: &lse, d_o: &go, dq: &dq, dk: &dk_, dv: &dv_ };
    assert_eq!(host.attention_grad(spec, g), Answer::Done);
    let got = [f64s(&dq_rows), f64s(&dk_rows), f64s(&dv_rows)];
    let want_rows = [
        rows_first(&want[0], lead, hq, tq, dk),
        rows_first(&want[1], lead, hk, tk, dk),
        rows_first(&want[2], lead, hk, tk, dv),
    ];
    check(c, &got, &want_rows, u);
    let dims = [(hq, tq, dk), (hk, tk, dk), (hk, tk, dv)];
    for (i, (g, (h, t, d))) in got.iter().zip(dims).enumerate() {
        assert_eq!(*g, rows_first(&f64s(&dense[i]), lead, h, t, d), "{c:?} gradient {i}: the dense layout's bits");
    }
    // the output: the dense layout's bits, each row where the view puts it
    let o_dense = Array::<T>::zeros(DEV, &[lead, hq, tq, dv]).unwrap();
    let lse_dense = Array::<L>::zeros(DEV, &[lead, hq, tq]).unwrap();
    let (qd, kd, vd) = (
        arr(&[lead, hq, tq, dk], &xs[0], to),
        arr(&[lead, hk, tk, dk], &xs[1], to),
        arr(&[lead, hk, tk, dv], &xs[2], to),
    );
    assert_eq!(host.attention(spec, &o_dense, &lse_dense, &qd, Kv::Dense { k: &kd, v: &vd }, None), Answer::Done);
    assert_eq!(f64s(&o_rows), rows_first(&f64s(&o_dense), lead, hq, tq, dv), "{c:?} o");
    assert_eq!(lse.to_vec().unwrap(), lse_dense.to_vec().unwrap(), "{c:?} lse");
    // an output whose rows are not at stride 1 is declined
    let o_cols =
        Array::<T>::zeros(DEV, &[lead, hq, dv, tq]).unwrap().apply(&nx_kernels::Move::Permute(vec![0, 1, 3, 2]));
    let o_cols = o_cols.unwrap().unwrap();
    assert_eq!(host.attention(spec, &o_cols, &lse, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Declined);
}

#[test]
fn flash_attentions_layout_reads_and_writes_through_permuted_views() {
    // every operand and destination a view [lead, h, t, d] of a dense [lead, t, h, d] array (a
    // projection's output reshaped: FlashAttention's layout), forward and backward: f64 rows
    // copied whole, and f32 rows from an f64 accumulator stored an element at a time, with rows
    // that see no key (causal offset −3)
    let c = Case { lead: 2, hq: 4, hk: 2, tq: 9, tk: 11, dk: 6, dv: 5, causal: Some(2) };
    let spec = Attention { scale: 0.45, causal: c.causal, acc: Dtype::F64 };
    rows_first_case::<f64, f64>(&c, &spec, |x| x, |x| x, f64::EPSILON / 2.0);
    let c = Case { lead: 1, hq: 3, hk: 1, tq: 8, tk: 7, dk: 5, dv: 4, causal: Some(-3) };
    let spec = Attention { scale: 0.3, causal: c.causal, acc: Dtype::F64 };
    rows_first_case::<f32, f64>(&c, &spec, |x| x as f32, |x| x as f32 as f64, f64::from(f32::EPSILON) / 2.0);
}
