//! The general contraction of the host library against a naive reference written here (each
//! output's products enumerated index by index in f64 or i128): grouped matmuls (`Rows`
//! segments, the mixture-of-experts shape), contracting groups, exponent and value block scales
//! read by the operand's own index through strided views, integer contractions wrapping in
//! their accumulator, narrow operands widened, outputs without products keeping their init's
//! bits, the same bits on 1, 2 and 8 threads, and the refusals.

use half::{bf16, f16};
use num_complex::Complex32;
use nx_kernels::{
    accumulates, contraction_accumulator, float_carrier, Answer, Array, Contraction, Dtype, Element, Factor, Host,
    Kernels, Move, Operand, Reduction, Scale, Segmented, Segments, Value,
};
use nx_mesh::Device;
use proptest::prelude::*;

mod common;
use common::val;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// The C-order position of `idx` in `shape`.
fn flat(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// Every index of `shape` in C order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![];
    if shape.contains(&0) {
        return out;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        out.push(idx.clone());
        let mut ax = shape.len();
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// A block scale for the reference: its shape and its values in C order (f64, exact).
struct RefScale {
    shape: Vec<usize>,
    values: Vec<f64>,
}

impl RefScale {
    /// The scale of the operand's element at `idx` (operand of shape `of`).
    fn at(&self, idx: &[usize], of: &[usize]) -> f64 {
        let block: Vec<usize> = idx.iter().zip(of).zip(&self.shape).map(|((&i, &n), &k)| i / (n / k)).collect();
        self.values[flat(&block, &self.shape)]
    }
}

/// One contraction for the reference, operands' values in C order of their logical shapes.
struct Case<'c> {
    spec: &'c Contraction,
    sa: Vec<usize>,
    sb: Vec<usize>,
    av: Vec<f64>,
    bv: Vec<f64>,
    ascale: Option<RefScale>,
    bscale: Option<RefScale>,
    segments: Option<(Segments, Vec<i64>)>,
}

/// The result's shape, then per output its exact value (`None` without products), Σ|a·b| and
/// its count of products.
type Expected = (Vec<usize>, Vec<Option<f64>>, Vec<f64>, Vec<usize>);

/// Each output's exact value (`None` where it has no products), its Σ|a·b|, and its count of
/// products, in C order of the result, the result's shape derived here from the roles of axes.
fn reference(c: &Case) -> Expected {
    let (ra, rb) = (c.sa.len(), c.sb.len());
    let in_a = |x: usize| c.spec.batch.iter().any(|p| p.0 == x) || c.spec.contracting.iter().any(|p| p.0 == x);
    let in_b = |y: usize| c.spec.batch.iter().any(|p| p.1 == y) || c.spec.contracting.iter().any(|p| p.1 == y);
    let free_a: Vec<usize> = (0..ra).filter(|&x| !in_a(x)).collect();
    let mut free_b: Vec<usize> = (0..rb).filter(|&y| !in_b(y)).collect();
    let batch_ext: Vec<usize> = c.spec.batch.iter().map(|p| c.sa[p.0]).collect();
    let con_ext: Vec<usize> = c.spec.contracting.iter().map(|p| c.sa[p.0]).collect();
    let (lead, gsize) = match c.segments {
        Some((Segments::Rows { b_axis, .. }, _)) => {
            free_b.retain(|&y| y != b_axis);
            (0, 0)
        }
        Some((Segments::Contracting { groups, .. }, _)) => (1, groups),
        None => (0, 0),
    };
    let mut shape: Vec<usize> = if lead == 1 { vec![gsize] } else { vec![] };
    shape.extend(&batch_ext);
    shape.extend(free_a.iter().map(|&x| c.sa[x]));
    shape.extend(free_b.iter().map(|&y| c.sb[y]));
    let (mut want, mut mag, mut count) = (vec![], vec![], vec![]);
    for o in indices(&shape) {
        let (g, rest) = o.split_at(lead);
        let (bi, rest) = rest.split_at(batch_ext.len());
        let (ai, bf) = rest.split_at(free_a.len());
        let (mut ia, mut ib) = (vec![0; ra], vec![0; rb]);
        for (p, &i) in c.spec.batch.iter().zip(bi) {
            ia[p.0] = i;
            ib[p.1] = i;
        }
        for (&x, &i) in free_a.iter().zip(ai) {
            ia[x] = i;
        }
        for (&y, &i) in free_b.iter().zip(bf) {
            ib[y] = i;
        }
        let mut ids_idx = bi.to_vec();
        let (mut sum, mut abs, mut n) = (0.0f64, 0.0f64, 0usize);
        let mut rows_ok = true;
        if let Some((Segments::Rows { a_axis, b_axis }, ids)) = &c.segments {
            ids_idx.push(ia[*a_axis]);
            let mut ids_shape = batch_ext.clone();
            ids_shape.push(c.sa[*a_axis]);
            let e = ids[flat(&ids_idx, &ids_shape)];
            if e >= 0 && (e as usize) < c.sb[*b_axis] {
                ib[*b_axis] = e as usize;
            } else {
                rows_ok = false;
            }
        }
        if rows_ok {
            for ci in indices(&con_ext) {
                for (p, &i) in c.spec.contracting.iter().zip(&ci) {
                    ia[p.0] = i;
                    ib[p.1] = i;
                }
                if let Some((Segments::Contracting { pair, .. }, ids)) = &c.segments {
                    let mut ids_shape = batch_ext.clone();
                    ids_shape.push(c.sa[pair.0]);
                    let mut at = bi.to_vec();
                    at.push(ia[pair.0]);
                    if ids[flat(&at, &ids_shape)] != g[0] as i64 {
                        continue;
                    }
                }
                let x = c.av[flat(&ia, &c.sa)] * c.ascale.as_ref().map_or(1.0, |s| s.at(&ia, &c.sa));
                let y = c.bv[flat(&ib, &c.sb)] * c.bscale.as_ref().map_or(1.0, |s| s.at(&ib, &c.sb));
                sum += x * y;
                abs += (x * y).abs();
                n += 1;
            }
        }
        want.push((n > 0).then_some(sum));
        mag.push(abs);
        count.push(n);
    }
    (shape, want, mag, count)
}

/// An unscaled case.
fn plain_case<'c>(
    spec: &'c Contraction,
    sa: Vec<usize>,
    sb: Vec<usize>,
    av: Vec<f64>,
    bv: Vec<f64>,
    segments: Option<(Segments, Vec<i64>)>,
) -> Case<'c> {
    Case { spec, sa, sb, av, bv, ascale: None, bscale: None, segments }
}

/// A case of `c`'s contraction and shapes, without values, scales or segments.
fn case_like<'c>(c: &Case<'c>) -> Case<'c> {
    plain_case(c.spec, c.sa.clone(), c.sb.clone(), vec![], vec![], None)
}

fn gamma(k: f64, u: f64) -> f64 {
    k * u / (1.0 - k * u)
}

fn wide<T: Element>(x: T) -> f64 {
    match x.to_value() {
        Value::Float(f) => f,
        Value::Int(i) => i as f64,
        v => panic!("{v:?}"),
    }
}

fn array<T: Element>(shape: &[usize], values: &[f64]) -> Array<T> {
    Array::from_vec(DEV, shape, values.iter().map(|&x| T::from_value(Value::Float(x))).collect()).unwrap()
}

/// Checks `got` within the library's stated bound γ(K + 3)·(|init| + Σ|a·b|) (`u` the
/// accumulator's unit roundoff; `ud` the destination's, for its rounding) of the reference,
/// `init` added; outputs without products equal to init's bits (or +0).
fn check<T: Element>(got: &Array<T>, init: Option<&Array<T>>, r: &Expected, u: f64, ud: f64) {
    assert_eq!(got.shape(), &r.0[..]);
    let g = got.to_vec().unwrap();
    let iv: Vec<T> = init.map_or(vec![T::default(); g.len()], |i| i.to_vec().unwrap());
    for q in 0..g.len() {
        match r.1[q] {
            None => assert_eq!(bits(g[q]), bits(iv[q]), "output {q} has no products: init's bits"),
            Some(w) => {
                let i0 = wide(iv[q]);
                let w = w + i0;
                let got = wide(g[q]);
                if w.is_nan() {
                    assert!(got.is_nan(), "output {q}: {got} where a NaN scale reaches it");
                    continue;
                }
                let bound = gamma(r.3[q] as f64 + 3.0, u) * (r.2[q] + i0.abs()) + ud * w.abs();
                assert!((got - w).abs() <= bound, "output {q}: {got} vs {w} (bound {bound})");
            }
        }
    }
}

const U32: f64 = f32::EPSILON as f64 / 2.0;

/// An element's bytes (NaN payloads and signed zeros included).
fn bits<T: Element>(x: T) -> [u64; 2] {
    let mut b = [0u64; 2];
    // SAFETY: 16 bytes aligned to 8 hold any element.
    unsafe { T::store(b.as_mut_ptr().cast(), x) };
    b
}

/// The mixture-of-experts shape: tokens [t, k] against experts [g, k, n], each token's expert
/// by id, ids outside [0, g) leaving a row without products.
#[test]
fn grouped_matmul_of_experts() {
    let host = Host::new();
    for (t, k, n, g) in [(37, 19, 13, 3), (1, 1, 1, 1), (65, 300, 33, 8), (5, 0, 4, 2), (0, 3, 4, 2), (6, 3, 0, 2)] {
        let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
        let av: Vec<f64> = (0..t * k).map(|q| val(q, 1)).collect();
        let bv: Vec<f64> = (0..g * k * n).map(|q| val(q, 2)).collect();
        let ids: Vec<i64> =
            (0..t).map(|r| [0, 2, -1, 1, 7, 2, 0][r % 7] % (g as i64 + 1) - i64::from(r % 11 == 3)).collect();
        let (a, b) = (array::<f32>(&[t, k], &av), array::<f32>(&[g, k, n], &bv));
        let id = Array::<i64>::from_vec(DEV, &[t], ids.clone()).unwrap();
        let segments = Segments::Rows { a_axis: 0, b_axis: 0 };
        let case = Case {
            spec: &spec,
            sa: vec![t, k],
            sb: vec![g, k, n],
            av,
            bv,
            ascale: None,
            bscale: None,
            segments: Some((segments, ids)),
        };
        let r = reference(&case);
        for with_init in [false, true] {
            let out = Array::<f32>::zeros(DEV, &r.0).unwrap();
            let init = Array::<f32>::from_fn(DEV, &r.0, |i| if i[0] % 2 == 0 { -0.0 } else { 0.25 }).unwrap();
            let init_op: Option<&dyn Operand> = if with_init { Some(&init) } else { None };
            let seg = Some(Segmented { segments, ids: &id });
            assert_eq!(
                host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), init_op),
                Answer::Done
            );
            check(&out, with_init.then_some(&init), &r, U32, 0.0);
        }
    }
}

/// Rows segments on the second free axis of a batched operand whose experts' array is strided,
/// bf16 destination (f32 accumulator) and f16 operands widened into an f32 one.
#[test]
fn grouped_matmul_batched_strided_and_narrow() {
    let host = Host::new();
    // a [2 (batch), 3, 7 (rows), 5 (contracting)], b [4, 2 (batch), 6 (n), 5 (contracting)]
    let spec = Contraction { batch: vec![(0, 1)], contracting: vec![(3, 3)] };
    let (sa, sb) = (vec![2, 3, 7, 5], vec![4, 2, 6, 5]);
    let av: Vec<f64> = (0..numel(&sa)).map(|q| val(q, 3)).collect();
    let bv: Vec<f64> = (0..numel(&sb)).map(|q| val(q, 4)).collect();
    let ids: Vec<i64> = (0..14).map(|q| (q * 5 % 6) as i64 - 1).collect();
    let segments = Segments::Rows { a_axis: 2, b_axis: 0 };
    let case = plain_case(&spec, sa.clone(), sb.clone(), av.clone(), bv.clone(), Some((segments, ids.clone())));
    let r = reference(&case);
    assert_eq!(r.0, [2, 3, 7, 6]);
    let id = Array::<i64>::from_vec(DEV, &[2, 7], ids).unwrap();
    // b stored as [6, 5, 4, 2] and permuted into its logical shape: strided in every axis
    let stored: Vec<f64> = indices(&[6, 5, 4, 2]).iter().map(|i| bv[flat(&[i[2], i[3], i[0], i[1]], &sb)]).collect();
    let seg = Some(Segmented { segments, ids: &id });
    let b = array::<f32>(&[6, 5, 4, 2], &stored).apply(&Move::Permute(vec![2, 3, 0, 1])).unwrap().unwrap();
    let a = array::<f32>(&sa, &av);
    // bf16 operands into a bf16 destination (an f32 accumulator), the reference on their values
    let (ah, bh) = (array::<bf16>(&sa, &av), array::<bf16>(&sb, &bv));
    let avh: Vec<f64> = ah.to_vec().unwrap().iter().map(|x| x.to_f64()).collect();
    let bvh: Vec<f64> = bh.to_vec().unwrap().iter().map(|x| x.to_f64()).collect();
    let rh = reference(&Case { av: avh, bv: bvh, segments: case.segments.clone(), ..case_like(&case) });
    let out = Array::<bf16>::zeros(DEV, &r.0).unwrap();
    assert_eq!(host.contract_general(&spec, seg, &out, Factor::plain(&ah), Factor::plain(&bh), None), Answer::Done);
    check(&out, None, &rh, U32, 2f64.powi(-8));
    // f32 through the strided experts
    let out = Array::<f32>::zeros(DEV, &r.0).unwrap();
    assert_eq!(host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), None), Answer::Done);
    check(&out, None, &r, U32, 0.0);
    // f16 operands widened into an f32 destination
    let (a16, b16) = (array::<f16>(&sa, &av), array::<f16>(&sb, &bv));
    let av16: Vec<f64> = a16.to_vec().unwrap().iter().map(|x| x.to_f64()).collect();
    let bv16: Vec<f64> = b16.to_vec().unwrap().iter().map(|x| x.to_f64()).collect();
    let r16 = reference(&Case { av: av16, bv: bv16, segments: case.segments.clone(), ..case_like(&case) });
    let out = Array::<f32>::zeros(DEV, &r.0).unwrap();
    assert_eq!(host.contract_general(&spec, seg, &out, Factor::plain(&a16), Factor::plain(&b16), None), Answer::Done);
    check(&out, None, &r16, U32, 0.0);
}

/// Contracting groups: a [m, k] · b [k, n] cut along k into groups, the result [g, m, n]; and a
/// contraction over two pairs with the second one segmented, batched.
#[test]
fn contracting_groups() {
    let host = Host::new();
    for (m, k, n, g) in [(4, 9, 3, 3), (17, 65, 9, 4), (3, 0, 2, 2), (2, 5, 2, 1)] {
        let spec = Contraction::matmul(0);
        let av: Vec<f64> = (0..m * k).map(|q| val(q, 5)).collect();
        let bv: Vec<f64> = (0..k * n).map(|q| val(q, 6)).collect();
        let ids: Vec<i64> = (0..k).map(|q| (q * 7 % (g + 2)) as i64 - 1).collect();
        let segments = Segments::Contracting { pair: (1, 0), groups: g };
        let r = reference(&plain_case(
            &spec,
            vec![m, k],
            vec![k, n],
            av.clone(),
            bv.clone(),
            Some((segments, ids.clone())),
        ));
        assert_eq!(r.0, [g, m, n]);
        let id = Array::<i64>::from_vec(DEV, &[k], ids).unwrap();
        let (a, b) = (array::<f64>(&[m, k], &av), array::<f64>(&[k, n], &bv));
        let out = Array::<f64>::zeros(DEV, &r.0).unwrap();
        let init =
            Array::<f64>::from_fn(DEV, &r.0, |i| if i[0] == 0 { f64::from_bits(0x7ff8_0000_0000_0123) } else { -0.0 })
                .unwrap();
        let seg = Some(Segmented { segments, ids: &id });
        assert_eq!(
            host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), Some(&init)),
            Answer::Done
        );
        // an init NaN's payload survives only where no product touches it: compare bit patterns
        let (got, iv) = (out.to_vec().unwrap(), init.to_vec().unwrap());
        for q in 0..got.len() {
            match r.1[q] {
                None => assert_eq!(got[q].to_bits(), iv[q].to_bits(), "output {q} without products"),
                Some(w) if iv[q].is_nan() => assert!(got[q].is_nan(), "{w}"),
                Some(w) => {
                    let bound = gamma(r.3[q] as f64 + 1.0, f64::EPSILON / 2.0) * r.2[q];
                    assert!((got[q] - w).abs() <= bound, "{} vs {w}", got[q]);
                }
            }
        }
    }
    // a [2, 3, 4, 5] · b [5, 2, 4, 6]: batch (0, 1), contracting (2, 2) and (3, 0), the second cut
    let spec = Contraction { batch: vec![(0, 1)], contracting: vec![(2, 2), (3, 0)] };
    let (sa, sb) = (vec![2, 3, 4, 5], vec![5, 2, 4, 6]);
    let av: Vec<f64> = (0..numel(&sa)).map(|q| val(q, 7)).collect();
    let bv: Vec<f64> = (0..numel(&sb)).map(|q| val(q, 8)).collect();
    let ids: Vec<i64> = vec![0, 1, 1, 0, 2, 2, 2, -5, 0, 1];
    let segments = Segments::Contracting { pair: (3, 0), groups: 3 };
    let r =
        reference(&plain_case(&spec, sa.clone(), sb.clone(), av.clone(), bv.clone(), Some((segments, ids.clone()))));
    assert_eq!(r.0, [3, 2, 3, 6]);
    let id = Array::<i64>::from_vec(DEV, &[2, 5], ids).unwrap();
    let out = Array::<f32>::zeros(DEV, &r.0).unwrap();
    let seg = Some(Segmented { segments, ids: &id });
    assert_eq!(
        host.contract_general(
            &spec,
            seg,
            &out,
            Factor::plain(&array::<f32>(&sa, &av)),
            Factor::plain(&array::<f32>(&sb, &bv)),
            None
        ),
        Answer::Done
    );
    check(&out, None, &r, U32, 0.0);
}

/// Exponent codes in blocks of 32 along a's contracting axis (the MX layout), a's array given
/// transposed in memory, and f16 value scales in blocks of 4 rows of b.
#[test]
fn block_scales_by_the_operands_own_index() {
    let host = Host::new();
    let (m, k, n) = (5, 96, 7);
    let av: Vec<f64> = (0..m * k).map(|q| val(q, 9)).collect();
    let bv: Vec<f64> = (0..k * n).map(|q| val(q, 10)).collect();
    // codes 0 (2^-127), 127 (1), 130 (8), 100, 255 (NaN) in a's blocks of [1, 32]
    let codes: Vec<u8> = (0..m * 3).map(|q| [127u8, 130, 100, 0, 126, 140, 127, 255][q % 8]).collect();
    let escale = RefScale {
        shape: vec![m, 3],
        values: codes.iter().map(|&e| if e == 255 { f64::NAN } else { 2f64.powi(i32::from(e) - 127) }).collect(),
    };
    let vs: Vec<f64> = (0..(k / 4) * n).map(|q| f16::from_f64(1.0 + val(q, 11)).to_f64()).collect();
    let vscale = RefScale { shape: vec![k / 4, n], values: vs.clone() };
    let r = reference(&Case {
        spec: &Contraction::matmul(0),
        sa: vec![m, k],
        sb: vec![k, n],
        av: av.clone(),
        bv: bv.clone(),
        ascale: Some(escale),
        bscale: Some(vscale),
        segments: None,
    });
    // a stored [k, m] and transposed: the scale follows the logical index, not memory order
    let stored: Vec<f64> = indices(&[k, m]).iter().map(|i| av[i[1] * k + i[0]]).collect();
    let a = array::<f32>(&[k, m], &stored).apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    let b = array::<f32>(&[k, n], &bv);
    let e = Array::<u8>::from_vec(DEV, &[m, 3], codes).unwrap();
    let v = Array::<f16>::from_vec(DEV, &[k / 4, n], vs.iter().map(|&x| f16::from_f64(x)).collect()).unwrap();
    let out = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
    let (fa, fb) = (Factor::scaled(&a, Scale::Exponent(&e)), Factor::scaled(&b, Scale::Value(&v)));
    assert_eq!(host.contract_general(&Contraction::matmul(0), None, &out, fa, fb, None), Answer::Done);
    check(&out, None, &r, U32, 0.0);
    // f64 accumulator: 2^-127 exact, the NaN code row by row
    let out = Array::<f64>::zeros(DEV, &[m, n]).unwrap();
    let (a64, b64) = (array::<f64>(&[m, k], &av), array::<f64>(&[k, n], &bv));
    assert_eq!(
        host.contract_general(
            &Contraction::matmul(0),
            None,
            &out,
            Factor::scaled(&a64, Scale::Exponent(&e)),
            Factor::scaled(&b64, Scale::Value(&v)),
            None
        ),
        Answer::Done
    );
    check(&out, None, &r, f64::EPSILON / 2.0, 0.0);
    // a scale of shape 1 along an axis scales the whole axis; an i8 value scale into an i32 contraction
    let ai = Array::<i8>::from_fn(DEV, &[3, 4], |i| (i[0] * 4 + i[1]) as i8 - 5).unwrap();
    let bi = Array::<i8>::from_fn(DEV, &[4, 2], |i| (i[0] * 2 + i[1]) as i8 - 3).unwrap();
    let si = Array::<i8>::from_vec(DEV, &[3, 1], vec![1, -2, 3]).unwrap();
    let out = Array::<i32>::zeros(DEV, &[3, 2]).unwrap();
    assert_eq!(
        host.contract_general(
            &Contraction::matmul(0),
            None,
            &out,
            Factor::scaled(&ai, Scale::Value(&si)),
            Factor::plain(&bi),
            None
        ),
        Answer::Done
    );
    let (av, bv, sv) = (ai.to_vec().unwrap(), bi.to_vec().unwrap(), [1, -2, 3]);
    let want: Vec<i32> = (0..6)
        .map(|q| (0..4).map(|p| i32::from(av[q / 2 * 4 + p]) * sv[q / 2] * i32::from(bv[p * 2 + q % 2])).sum())
        .collect();
    assert_eq!(out.to_vec().unwrap(), want);
}

/// `a [b, m, k] · b [b, k, n]` in integers, against i128 sums wrapped to the destination.
fn int_case<S: Element, D: Element>(
    host: &Host,
    (bt, m, k, n): (usize, usize, usize, usize),
    sv: impl Fn(usize, usize) -> S,
    strided_b: bool,
) {
    let a = Array::<S>::from_fn(DEV, &[bt, m, k], |i| sv(flat(i, &[bt, m, k]), 1)).unwrap();
    let b = if strided_b {
        Array::<S>::from_fn(DEV, &[bt, n, k], |i| sv(flat(&[i[0], i[2], i[1]], &[bt, k, n]), 2))
            .unwrap()
            .apply(&Move::Permute(vec![0, 2, 1]))
            .unwrap()
            .unwrap()
    } else {
        Array::<S>::from_fn(DEV, &[bt, k, n], |i| sv(flat(i, &[bt, k, n]), 2)).unwrap()
    };
    let init =
        Array::<D>::from_fn(DEV, &[bt, m, n], |i| D::from_value(Value::Int(i[2] as i128 * 1_000_003 - 7))).unwrap();
    let int = |v: Value| match v {
        Value::Int(i) => i,
        v => panic!("{v:?}"),
    };
    let (avs, bvs) = (a.to_vec().unwrap(), b.to_vec().unwrap());
    for with_init in [false, true] {
        let out = Array::<D>::zeros(DEV, &[bt, m, n]).unwrap();
        let init_op: Option<&dyn Operand> = if with_init { Some(&init) } else { None };
        assert_eq!(
            host.contract_general(&Contraction::matmul(1), None, &out, Factor::plain(&a), Factor::plain(&b), init_op),
            Answer::Done,
            "{:?}→{:?}",
            S::DTYPE,
            D::DTYPE
        );
        let (got, iv) = (out.to_vec().unwrap(), init.to_vec().unwrap());
        for z in 0..bt {
            for i in 0..m {
                for j in 0..n {
                    let mut s: i128 = if with_init { int(iv[(z * m + i) * n + j].to_value()) } else { 0 };
                    for p in 0..k {
                        // i128 wraps only at a multiple of 2^64: the low bits stay exact
                        s = s.wrapping_add(
                            int(avs[(z * m + i) * k + p].to_value()) * int(bvs[(z * k + p) * n + j].to_value()),
                        );
                    }
                    // wrapped to the destination's width, as its conversion of an integer does
                    assert_eq!(
                        got[(z * m + i) * n + j],
                        D::from_value(Value::Int(s)),
                        "[{z}, {i}, {j}] {:?}→{:?}",
                        S::DTYPE,
                        D::DTYPE
                    );
                }
            }
        }
    }
}

#[test]
fn integer_contractions_wrap_in_their_accumulator() {
    let host = Host::new();
    // every bit random: the hash's 52 integer bits spread over 64 by an odd multiplier
    let hash =
        |q: usize, salt: usize| ((val(q, salt) * 2f64.powi(52)) as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64);
    // int8 operands into an int32 destination: tiles' edges plus one, full i8 range
    for dims in [(1, 33, 257, 513), (2, 5, 3, 7), (1, 0, 4, 3), (1, 3, 0, 2), (1, 1, 1, 1)] {
        int_case::<i8, i32>(&host, dims, |q, s| hash(q, s) as i8, dims.0 == 2);
    }
    // sums that wrap: i32 operands near the range's ends, an i8 accumulator, u8 into u32, u32 into u64 and i64
    int_case::<i32, i32>(&host, (2, 9, 40, 11), |q, s| hash(q, s) as i32, true);
    int_case::<i8, i8>(&host, (1, 7, 50, 5), |q, s| hash(q, s) as i8, false);
    int_case::<u8, u32>(&host, (1, 6, 300, 9), |q, s| hash(q, s) as u8, false);
    int_case::<u8, i16>(&host, (1, 6, 30, 9), |q, s| hash(q, s) as u8, true);
    int_case::<u32, u64>(&host, (1, 6, 30, 9), |q, s| hash(q, s) as u32, false);
    int_case::<i64, i64>(&host, (2, 6, 30, 9), hash, true);
}

/// The same bits on 1, 2 and 8 threads: a grouped f32 matmul of many rows per group and an int8
/// contraction of many row tasks.
#[test]
fn the_same_bits_on_1_2_and_8_threads() {
    let (t, k, n, g) = (300, 700, 65, 4);
    let a = Array::<f32>::from_fn(DEV, &[t, k], |i| val(i[0] * k + i[1], 12) as f32).unwrap();
    let b = Array::<f32>::from_fn(DEV, &[g, k, n], |i| val(flat(i, &[g, k, n]), 13) as f32).unwrap();
    let ids = Array::<i64>::from_fn(DEV, &[t], |i| (i[0] * 7 % 5) as i64).unwrap();
    let ai = Array::<i8>::from_fn(DEV, &[200, 300], |i| (i[0] * 31 + i[1] * 17) as i8).unwrap();
    let bi = Array::<i8>::from_fn(DEV, &[300, 600], |i| (i[0] * 13 + i[1] * 3) as i8).unwrap();
    let mut runs = vec![];
    for threads in [1, 2, 8] {
        let host = Host::with_threads(threads).unwrap();
        let out = Array::<f32>::zeros(DEV, &[t, n]).unwrap();
        let seg = Some(Segmented { segments: Segments::Rows { a_axis: 0, b_axis: 0 }, ids: &ids });
        let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
        assert_eq!(host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), None), Answer::Done);
        let oi = Array::<i32>::zeros(DEV, &[200, 600]).unwrap();
        assert_eq!(
            host.contract_general(&Contraction::matmul(0), None, &oi, Factor::plain(&ai), Factor::plain(&bi), None),
            Answer::Done
        );
        runs.push((out.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(), oi.to_vec().unwrap()));
    }
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

fn seg(ids: &dyn Operand, segments: Segments) -> Option<Segmented<'_>> {
    Some(Segmented { segments, ids })
}

#[test]
fn refusals() {
    let host = Host::new();
    let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
    let a = Array::<f32>::zeros(DEV, &[4, 3]).unwrap();
    let b = Array::<f32>::zeros(DEV, &[2, 3, 5]).unwrap();
    let out = Array::<f32>::zeros(DEV, &[4, 5]).unwrap();
    let ids = Array::<i64>::zeros(DEV, &[4]).unwrap();
    let rows = Segments::Rows { a_axis: 0, b_axis: 0 };
    let run = |seg: Option<Segmented>, dst: &dyn Operand, fa: Factor, fb: Factor, init: Option<&dyn Operand>| {
        host.contract_general(&spec, seg, dst, fa, fb, init)
    };
    assert_eq!(run(seg(&ids, rows), &out, Factor::plain(&a), Factor::plain(&b), None), Answer::Done);
    // ids not i64, of the wrong shape
    let ids32 = Array::<i32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(run(seg(&ids32, rows), &out, Factor::plain(&a), Factor::plain(&b), None), Answer::WrongDtype);
    let ids5 = Array::<i64>::zeros(DEV, &[5]).unwrap();
    assert_eq!(run(seg(&ids5, rows), &out, Factor::plain(&a), Factor::plain(&b), None), Answer::ShapeMismatch);
    // a segmented axis that is not free; a destination of the plain shape
    assert_eq!(
        run(seg(&ids, Segments::Rows { a_axis: 1, b_axis: 0 }), &out, Factor::plain(&a), Factor::plain(&b), None),
        Answer::ShapeMismatch
    );
    assert_eq!(
        run(
            seg(&ids, Segments::Contracting { pair: (0, 0), groups: 2 }),
            &out,
            Factor::plain(&a),
            Factor::plain(&b),
            None
        ),
        Answer::ShapeMismatch
    );
    let plain_out = Array::<f32>::zeros(DEV, &[4, 2, 5]).unwrap();
    assert_eq!(run(seg(&ids, rows), &plain_out, Factor::plain(&a), Factor::plain(&b), None), Answer::ShapeMismatch);
    // f64 operands into an f32 accumulator; a bool destination; an init of another dtype
    let a64 = Array::<f64>::zeros(DEV, &[4, 3]).unwrap();
    assert_eq!(run(seg(&ids, rows), &out, Factor::plain(&a64), Factor::plain(&b), None), Answer::WrongDtype);
    let ob = Array::<bool>::zeros(DEV, &[4, 5]).unwrap();
    assert_eq!(run(seg(&ids, rows), &ob, Factor::plain(&a), Factor::plain(&b), None), Answer::WrongDtype);
    let i64init = Array::<f64>::zeros(DEV, &[4, 5]).unwrap();
    assert_eq!(run(seg(&ids, rows), &out, Factor::plain(&a), Factor::plain(&b), Some(&i64init)), Answer::WrongDtype);
    // int operands into a float accumulator, signed into unsigned, exponents on an integer one
    let ai = Array::<i8>::zeros(DEV, &[4, 3]).unwrap();
    let bi = Array::<i8>::zeros(DEV, &[3, 5]).unwrap();
    let m = Contraction::matmul(0);
    assert_eq!(host.contract_general(&m, None, &out, Factor::plain(&ai), Factor::plain(&bi), None), Answer::WrongDtype);
    let ou = Array::<u32>::zeros(DEV, &[4, 5]).unwrap();
    assert_eq!(host.contract_general(&m, None, &ou, Factor::plain(&ai), Factor::plain(&bi), None), Answer::WrongDtype);
    let oi = Array::<i32>::zeros(DEV, &[4, 5]).unwrap();
    let codes = Array::<u8>::zeros(DEV, &[4, 1]).unwrap();
    assert_eq!(
        host.contract_general(&m, None, &oi, Factor::scaled(&ai, Scale::Exponent(&codes)), Factor::plain(&bi), None),
        Answer::WrongDtype
    );
    // exponent codes not u8; a scale not dividing its operand, of another rank
    let a2 = Array::<f32>::zeros(DEV, &[4, 3]).unwrap();
    let b2 = Array::<f32>::zeros(DEV, &[3, 5]).unwrap();
    let codes_i8 = Array::<i8>::zeros(DEV, &[4, 1]).unwrap();
    assert_eq!(
        host.contract_general(
            &m,
            None,
            &out,
            Factor::scaled(&a2, Scale::Exponent(&codes_i8)),
            Factor::plain(&b2),
            None
        ),
        Answer::WrongDtype
    );
    let s3 = Array::<u8>::zeros(DEV, &[3, 1]).unwrap();
    assert_eq!(
        host.contract_general(&m, None, &out, Factor::scaled(&a2, Scale::Exponent(&s3)), Factor::plain(&b2), None),
        Answer::ShapeMismatch
    );
    let s1 = Array::<u8>::zeros(DEV, &[4]).unwrap();
    assert_eq!(
        host.contract_general(&m, None, &out, Factor::scaled(&a2, Scale::Exponent(&s1)), Factor::plain(&b2), None),
        Answer::ShapeMismatch
    );
    let s0 = Array::<u8>::zeros(DEV, &[0, 1]).unwrap();
    assert_eq!(
        host.contract_general(&m, None, &out, Factor::scaled(&a2, Scale::Exponent(&s0)), Factor::plain(&b2), None),
        Answer::ShapeMismatch
    );
    // a value scale wider than the accumulator: a case this library does not compute
    let v64 = Array::<f64>::zeros(DEV, &[4, 1]).unwrap();
    assert_eq!(
        host.contract_general(&m, None, &out, Factor::scaled(&a2, Scale::Value(&v64)), Factor::plain(&b2), None),
        Answer::Declined
    );
    // a library that does not build the general contraction declines it
    struct Bare;
    impl Kernels for Bare {
        fn name(&self) -> &'static str {
            "bare"
        }
        fn map(&self, _: &nx_kernels::Prog, _: &[usize], _: &[&dyn Operand], _: &[&dyn Operand]) -> Answer {
            Answer::Declined
        }
        fn reduce(
            &self,
            _: &nx_kernels::Prog,
            _: &[usize],
            _: &[usize],
            _: &[Reduction],
            _: &[&dyn Operand],
            _: &[&dyn Operand],
        ) -> Answer {
            Answer::Declined
        }
        fn contract(
            &self,
            _: &Contraction,
            _: &dyn Operand,
            _: &dyn Operand,
            _: &dyn Operand,
            _: Option<&dyn Operand>,
        ) -> Answer {
            Answer::Declined
        }
    }
    assert_eq!(Bare.contract_general(&m, None, &out, Factor::plain(&a2), Factor::plain(&b2), None), Answer::Declined);
}

/// The contract's tables, written out here: which dtypes a contraction computes in, the float
/// carriers, and which terms each reduction takes.
#[test]
fn accumulates_float_carrier_and_accepts() {
    use Dtype::*;
    let all = [Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64, C64, C128];
    for d in all {
        assert_eq!(accumulates(d), !matches!(d, Bool | F16 | BF16), "{d:?}");
        let carrier = match d {
            F16 | BF16 | F32 => Some(F32),
            F64 => Some(F64),
            _ => None,
        };
        assert_eq!(float_carrier(d), carrier, "{d:?}");
        assert_eq!(
            contraction_accumulator(d),
            if d == Bool {
                None
            } else if matches!(d, F16 | BF16) {
                Some(F32)
            } else {
                Some(d)
            }
        );
        let real = matches!(d, F16 | BF16 | F32 | F64);
        assert_eq!(Reduction::Sum.accepts(d), d != Bool);
        assert_eq!(Reduction::Prod.accepts(d), d != Bool);
        assert!(Reduction::Max.accepts(d) && Reduction::Min.accepts(d));
        assert!(Reduction::Arg(nx_kernels::Extreme::Max).accepts(d));
        assert_eq!(Reduction::Logsumexp.accepts(d), real);
        assert_eq!(Reduction::Moments.accepts(d), real);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random grouped matmuls: any rows, experts, ids (some out of range) and an init.
    #[test]
    fn random_grouped_matmuls(t in 0usize..30, k in 0usize..40, n in 0usize..12, g in 1usize..6, salt in 0usize..1000, with_init in any::<bool>()) {
        let host = Host::new();
        let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
        let av: Vec<f64> = (0..t * k).map(|q| val(q, salt)).collect();
        let bv: Vec<f64> = (0..g * k * n).map(|q| val(q, salt + 1)).collect();
        let ids: Vec<i64> = (0..t).map(|q| (val(q, salt + 2) * (g as f64 + 1.5)).floor() as i64).collect();
        let segments = Segments::Rows { a_axis: 0, b_axis: 0 };
        let r = reference(&plain_case(&spec, vec![t, k], vec![g, k, n], av.clone(), bv.clone(), Some((segments, ids.clone()))));
        let id = Array::<i64>::from_vec(DEV, &[t], ids).unwrap();
        let (a, b) = (array::<f32>(&[t, k], &av), array::<f32>(&[g, k, n], &bv));
        let out = Array::<f32>::zeros(DEV, &r.0).unwrap();
        let init = Array::<f32>::from_fn(DEV, &r.0, |i| val(i[0] + i[1] * 3, salt) as f32).unwrap();
        let init_op: Option<&dyn Operand> = if with_init { Some(&init) } else { None };
        prop_assert_eq!(host.contract_general(&spec, Some(Segmented { segments, ids: &id }), &out, Factor::plain(&a), Factor::plain(&b), init_op), Answer::Done);
        check(&out, with_init.then_some(&init), &r, U32, 0.0);
    }
}

/// Index arithmetic off the last axes (the segmented rows axis before another free axis, the
/// experts' axis after another, the segmented contracting pair before another), no experts at
/// all, a complex accumulator with exponent scales under segments, int8 experts.
#[test]
fn segments_off_the_last_axes_complex_and_integer() {
    let host = Host::new();
    // a [5, 3, 4]: rows axis 0 then free axis 1, contracting 2; b [4, 6, 2]: experts on axis 2
    let spec = Contraction { contracting: vec![(2, 0)], batch: vec![] };
    let (sa, sb) = (vec![5, 3, 4], vec![4, 6, 2]);
    let av: Vec<f64> = (0..numel(&sa)).map(|q| val(q, 20)).collect();
    let bv: Vec<f64> = (0..numel(&sb)).map(|q| val(q, 21)).collect();
    let ids = vec![1, 0, -1, 1, 2];
    let segments = Segments::Rows { a_axis: 0, b_axis: 2 };
    let r =
        reference(&plain_case(&spec, sa.clone(), sb.clone(), av.clone(), bv.clone(), Some((segments, ids.clone()))));
    assert_eq!(r.0, [5, 3, 6]);
    let id = Array::<i64>::from_vec(DEV, &[5], ids).unwrap();
    let out = Array::<f64>::zeros(DEV, &r.0).unwrap();
    let seg = Some(Segmented { segments, ids: &id });
    let (a, b) = (array::<f64>(&sa, &av), array::<f64>(&sb, &bv));
    assert_eq!(host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), None), Answer::Done);
    check(&out, None, &r, f64::EPSILON / 2.0, 0.0);
    // no experts: every row without products
    let b0 = Array::<f64>::zeros(DEV, &[4, 6, 0]).unwrap();
    let init = Array::<f64>::from_fn(DEV, &r.0, |i| i[2] as f64 - 2.5).unwrap();
    assert_eq!(
        host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b0), Some(&init)),
        Answer::Done
    );
    assert_eq!(out.to_vec().unwrap(), init.to_vec().unwrap());
    // the segmented pair before another: a [3, 4, 5] · b [4, 5, 2] over (1, 0) and (2, 1)
    let spec2 = Contraction { contracting: vec![(1, 0), (2, 1)], batch: vec![] };
    let (sa2, sb2) = (vec![3, 4, 5], vec![4, 5, 2]);
    let av2: Vec<f64> = (0..numel(&sa2)).map(|q| val(q, 22)).collect();
    let bv2: Vec<f64> = (0..numel(&sb2)).map(|q| val(q, 23)).collect();
    let seg2 = Segments::Contracting { pair: (1, 0), groups: 2 };
    let ids2 = vec![1, 0, 1, 5];
    let r2 =
        reference(&plain_case(&spec2, sa2.clone(), sb2.clone(), av2.clone(), bv2.clone(), Some((seg2, ids2.clone()))));
    assert_eq!(r2.0, [2, 3, 2]);
    let id2 = Array::<i64>::from_vec(DEV, &[4], ids2).unwrap();
    let out2 = Array::<f32>::zeros(DEV, &r2.0).unwrap();
    let (a2, b2) = (array::<f32>(&sa2, &av2), array::<f32>(&sb2, &bv2));
    let s2 = Some(Segmented { segments: seg2, ids: &id2 });
    assert_eq!(host.contract_general(&spec2, s2, &out2, Factor::plain(&a2), Factor::plain(&b2), None), Answer::Done);
    check(&out2, None, &r2, U32, 0.0);
    // c64: tokens with exponent scales per row, experts per (expert, k-block of 2)
    let (t, k, n, g) = (6, 4, 3, 2);
    let spec3 = Contraction { contracting: vec![(1, 1)], batch: vec![] };
    let zc = |q: usize, s: usize| Complex32::new(val(q, s) as f32, val(q, s + 1) as f32);
    let ac = Array::<Complex32>::from_fn(DEV, &[t, k], |i| zc(i[0] * k + i[1], 30)).unwrap();
    let bc = Array::<Complex32>::from_fn(DEV, &[g, k, n], |i| zc(flat(i, &[g, k, n]), 32)).unwrap();
    let ea = Array::<u8>::from_fn(DEV, &[t, 1], |i| 125 + i[0] as u8).unwrap();
    let eb = Array::<u8>::from_fn(DEV, &[g, 2, 1], |i| 126 + (i[0] + i[1]) as u8).unwrap();
    let idc = Array::<i64>::from_vec(DEV, &[t], vec![0, 1, 1, -3, 0, 1]).unwrap();
    let oc = Array::<Complex32>::zeros(DEV, &[t, n]).unwrap();
    let sc = Some(Segmented { segments: Segments::Rows { a_axis: 0, b_axis: 0 }, ids: &idc });
    let fa = Factor::scaled(&ac, Scale::Exponent(&ea));
    let fb = Factor::scaled(&bc, Scale::Exponent(&eb));
    assert_eq!(host.contract_general(&spec3, sc, &oc, fa, fb, None), Answer::Done);
    let (avc, bvc, got) = (ac.to_vec().unwrap(), bc.to_vec().unwrap(), oc.to_vec().unwrap());
    let ids_c = [0i64, 1, 1, -3, 0, 1];
    for r in 0..t {
        for c in 0..n {
            let (mut want, mut mag) = (num_complex::Complex64::new(0.0, 0.0), 0.0);
            if ids_c[r] >= 0 {
                let e = ids_c[r] as usize;
                for p in 0..k {
                    let x = num_complex::Complex64::new(avc[r * k + p].re.into(), avc[r * k + p].im.into())
                        * 2f64.powi(r as i32 - 2);
                    let yv = bvc[(e * k + p) * n + c];
                    let y = num_complex::Complex64::new(yv.re.into(), yv.im.into()) * 2f64.powi((e + p / 2) as i32 - 1);
                    want += x * y;
                    mag += x.norm() * y.norm();
                }
            }
            let g = num_complex::Complex64::new(got[r * n + c].re.into(), got[r * n + c].im.into());
            assert!((g - want).norm() <= gamma(2.0 * k as f64 + 2.0, U32) * mag, "c64 [{r}, {c}]: {g} vs {want}");
        }
    }
    // int8 experts into i32, exactly
    let ai = Array::<i8>::from_fn(DEV, &[t, k], |i| (i[0] * 37 + i[1] * 11) as i8).unwrap();
    let bi = Array::<i8>::from_fn(DEV, &[g, k, n], |i| (i[0] * 53 + i[1] * 7 + i[2] * 19) as i8).unwrap();
    let oi = Array::<i32>::zeros(DEV, &[t, n]).unwrap();
    assert_eq!(host.contract_general(&spec3, sc, &oi, Factor::plain(&ai), Factor::plain(&bi), None), Answer::Done);
    let (avi, bvi) = (ai.to_vec().unwrap(), bi.to_vec().unwrap());
    for r in 0..t {
        for c in 0..n {
            let want: i32 = if ids_c[r] < 0 {
                0
            } else {
                (0..k).map(|p| i32::from(avi[r * k + p]) * i32::from(bvi[(ids_c[r] as usize * k + p) * n + c])).sum()
            };
            assert_eq!(oi.to_vec().unwrap()[r * n + c], want, "int8 [{r}, {c}]");
        }
    }
}

/// Outputs without products keep init's bits through a narrower destination (f16 NaN payloads,
/// init the destination itself); a destination sharing an operand's bytes is refused; one that
/// is not C-contiguous declined.
#[test]
fn init_bits_overlap_and_layouts() {
    let host = Host::new();
    let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
    let a = Array::<f16>::from_fn(DEV, &[4, 3], |i| f16::from_f64(val(i[0] * 3 + i[1], 40))).unwrap();
    let b = Array::<f16>::from_fn(DEV, &[2, 3, 2], |i| f16::from_f64(val(flat(i, &[2, 3, 2]), 41))).unwrap();
    let ids = Array::<i64>::from_vec(DEV, &[4], vec![0, -1, 1, 9]).unwrap();
    let seg = Some(Segmented { segments: Segments::Rows { a_axis: 0, b_axis: 0 }, ids: &ids });
    let payloads = [0x7E01u16, 0xFE05, 0x8000, 0x7C00];
    let init = Array::<f16>::from_fn(DEV, &[4, 2], |i| f16::from_bits(payloads[(i[0] + i[1]) % 4])).unwrap();
    for in_place in [false, true] {
        let out = if in_place { init.copy().unwrap() } else { Array::<f16>::zeros(DEV, &[4, 2]).unwrap() };
        let iv: &Array<f16> = if in_place { &out } else { &init };
        let before: Vec<u16> = iv.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            host.contract_general(&spec, seg, &out, Factor::plain(&a), Factor::plain(&b), Some(iv)),
            Answer::Done
        );
        let got: Vec<u16> = out.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
        for row in [1, 3] {
            assert_eq!(got[row * 2..row * 2 + 2], before[row * 2..row * 2 + 2], "row {row} (in place: {in_place})");
        }
        assert!(got[..2] != before[..2] || got[4..6] != before[4..6], "rows with products changed");
    }
    // k = 0 through an f16 destination: every output init's bits
    let a0 = Array::<f16>::zeros(DEV, &[4, 0]).unwrap();
    let b0 = Array::<f16>::zeros(DEV, &[2, 0, 2]).unwrap();
    let out = Array::<f16>::zeros(DEV, &[4, 2]).unwrap();
    assert_eq!(
        host.contract_general(&spec, seg, &out, Factor::plain(&a0), Factor::plain(&b0), Some(&init)),
        Answer::Done
    );
    let bits16 = |x: &Array<f16>| x.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits16(&out), bits16(&init));
    // a destination that is an operand: refused; one not C-contiguous: declined
    let sq = Array::<i32>::from_fn(DEV, &[3, 3], |i| i[0] as i32).unwrap();
    let sb = Array::<i8>::zeros(DEV, &[3, 3]).unwrap();
    let m = Contraction::matmul(0);
    let i8sq = Array::<i32>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.contract_general(&m, None, &sq, Factor::plain(&sq), Factor::plain(&sb), None), Answer::Overlapping);
    assert_eq!(
        host.contract_general(&m, None, &i8sq, Factor::plain(&sq), Factor::plain(&sb), Some(&i8sq)),
        Answer::Done
    );
    let wide = Array::<i32>::zeros(DEV, &[3, 6]).unwrap();
    let strided = wide.apply(&Move::Slice { axis: 1, start: Some(0), stop: None, step: 2 }).unwrap().unwrap();
    assert_eq!(
        host.contract_general(&m, None, &strided, Factor::plain(&sq), Factor::plain(&sb), None),
        Answer::Declined
    );
}
