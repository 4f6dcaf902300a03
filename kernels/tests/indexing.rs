//! Scans, gathers, range gathers, scatters, sorts and assembly of the host library against naive
//! references written here: random shapes, strided and offset layouts, empty axes, rank 0,
//! special values, refusals, and the same bits on 1, 2 and 8 threads.

#![allow(clippy::needless_range_loop)] // the naive references index as their formulas do

use half::bf16;
use nx_kernels::{Answer, Array, Element, Host, Kernels, Move, Operand, Reduction, Scatter};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// `vals` (C order) as an array of `shape`: contiguous, or a view over a larger buffer (every
/// other element along the last axis, the first axis reversed, at an offset).
fn arr<T: Element>(shape: &[usize], vals: &[T], strided: bool) -> Array<T> {
    let n: usize = shape.iter().product();
    assert_eq!(vals.len(), n);
    if !strided || shape.is_empty() {
        return Array::from_vec(DEV, shape, vals.to_vec()).unwrap();
    }
    let r = shape.len();
    let mut big = shape.to_vec();
    big[r - 1] = big[r - 1] * 2 + 1;
    big[0] += 1;
    let b = Array::<T>::zeros(DEV, &big).unwrap();
    let v = b.apply(&Move::Slice { axis: r - 1, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let v = v.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
    let v = v.apply(&Move::Flip(0)).unwrap().unwrap();
    let dense = Array::from_vec(DEV, shape, vals.to_vec()).unwrap();
    Array::transfer(&dense, &v).unwrap();
    assert!(!v.layout().is_contiguous() || n <= 1);
    v
}

/// The C-order strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect()
}

/// The index of flat position `k` of `shape`.
fn unflat(shape: &[usize], mut k: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = k % shape[d];
        k /= shape[d];
    }
    idx
}

fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

fn val(k: usize) -> f32 {
    ((k * 7919) % 10007) as f32 / 97.0 - 51.0
}

// ---------------------------------------------------------------- scans

/// The naive scans of `x` (of `shape`) along `axis`, in f64, sequentially: (results, Σ|x| so far).
fn naive_cumsum(shape: &[usize], axis: usize, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = x.len();
    let (mut out, mut mag) = (vec![0.0; n], vec![0.0; n]);
    for k in 0..n {
        let mut idx = unflat(shape, k);
        let i = idx[axis];
        let (mut s, mut m) = (0.0, 0.0);
        for t in 0..=i {
            idx[axis] = t;
            let v = x[flat(shape, &idx)];
            s += v;
            m += v.abs();
        }
        out[k] = s;
        mag[k] = m;
    }
    (out, mag)
}

fn gamma(k: usize, u: f64) -> f64 {
    k as f64 * u / (1.0 - k as f64 * u)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn sum_scans_are_within_their_bound_and_integer_and_extreme_scans_exact(
        shape in prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=9], 1..=3),
        axis_pick in 0usize..3,
        strided in any::<bool>(),
    ) {
        let axis = axis_pick % shape.len();
        let n: usize = shape.iter().product();
        let host = Host::new();
        let xs: Vec<f32> = (0..n).map(val).collect();
        let a = arr(&shape, &xs, strided);
        let dst = Array::<f32>::zeros(DEV, &shape).unwrap();
        prop_assert_eq!(host.scan(Reduction::Sum, axis, None, &[&dst], &a), Answer::Done);
        let (want, mag) = naive_cumsum(&shape, axis, &xs.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        let got = dst.to_vec().unwrap();
        for k in 0..n {
            let i = unflat(&shape, k)[axis];
            let bound = gamma(i + 2, f64::from(f32::EPSILON) / 2.0) * mag[k] + f64::from(f32::EPSILON) * want[k].abs();
            prop_assert!((f64::from(got[k]) - want[k]).abs() <= bound, "{k}: {} vs {}", got[k], want[k]);
        }
        // i32: wrapping, exact; Max and Min: exact
        let ints: Vec<i32> = (0..n).map(|k| (k as i32 * 1_000_003).wrapping_mul(2_654_435)).collect();
        let ia = arr(&shape, &ints, strided);
        let id = Array::<i32>::zeros(DEV, &shape).unwrap();
        for r in [Reduction::Sum, Reduction::Prod, Reduction::Max, Reduction::Min] {
            prop_assert_eq!(host.scan(r, axis, None, &[&id], &ia), Answer::Done);
            let got = id.to_vec().unwrap();
            for k in 0..n {
                let mut idx = unflat(&shape, k);
                let i = idx[axis];
                let terms: Vec<i32> = (0..=i).map(|t| { idx[axis] = t; ints[flat(&shape, &idx)] }).collect();
                let want = match r {
                    Reduction::Sum => terms.iter().fold(0i32, |a, &b| a.wrapping_add(b)),
                    Reduction::Prod => terms[1..].iter().fold(terms[0], |a, &b| a.wrapping_mul(b)),
                    Reduction::Max => *terms.iter().max().unwrap(),
                    _ => *terms.iter().min().unwrap(),
                };
                prop_assert_eq!(got[k], want, "{:?} at {}", r, k);
            }
        }
    }
}

#[test]
fn a_scan_of_a_prefix_is_the_prefix_of_the_scan_and_resumes_from_a_carry() {
    let host = Host::new();
    let n = 19 * 4096 + 77; // past several groups of blocks (8 blocks of 4096 run side by side)
    let xs: Vec<f32> = (0..n).map(val).collect();
    let whole = Array::<f32>::zeros(DEV, &[n]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 0, None, &[&whole], &arr(&[n], &xs, false)), Answer::Done);
    let whole = whole.to_vec().unwrap();
    // the stated association, written here: result k of block b is (T₀ + … + T_{b−1}) + x_lo + …
    // + x_k, in order, each total T the block's own sum from its first term
    let mut want = Vec::with_capacity(n);
    let mut before: Option<f32> = Some(0.0);
    for block in xs.chunks(4096) {
        let mut acc = before;
        for &x in block {
            let v = acc.map_or(x, |a| a + x);
            want.push(v);
            acc = Some(v);
        }
        let total = block[1..].iter().fold(block[0], |a, &x| a + x);
        before = before.map(|b| b + total);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&whole), bits(&want), "the stated association");
    for m in [1, 4095, 4096, 4097, 8192 + 5, 8 * 4096, 8 * 4096 + 1, 16 * 4096 + 3, n - 1] {
        let part = Array::<f32>::zeros(DEV, &[m]).unwrap();
        assert_eq!(host.scan(Reduction::Sum, 0, None, &[&part], &arr(&[m], &xs[..m], true)), Answer::Done);
        assert_eq!(bits(&part.to_vec().unwrap()), bits(&whole[..m]), "prefix of {m}");
    }
    // the same bits on 1, 2 and 8 threads: one long lane (its blocks in parallel) and many lanes
    for shape in [vec![n], vec![3, 9 * 4096 + 5], vec![8, 5000], vec![5000, 3]] {
        let axis = if shape.len() == 2 && shape[1] == 3 { 0 } else { shape.len() - 1 };
        let len: usize = shape.iter().product();
        let x = arr(&shape, &(0..len).map(val).collect::<Vec<_>>(), true);
        let run = |t: usize| {
            let d = Array::<f32>::zeros(DEV, &shape).unwrap();
            assert_eq!(Host::with_threads(t).unwrap().scan(Reduction::Sum, axis, None, &[&d], &x), Answer::Done);
            d.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(run(2), one, "{shape:?}");
        assert_eq!(run(8), one, "{shape:?}");
    }
    // exact scans resume: the scan of xs[m..] from the carry of result m − 1 is the rest
    let ints: Vec<i64> = (0..n as i64).map(|k| k * k - 3 * k).collect();
    for r in [Reduction::Sum, Reduction::Max, Reduction::Min, Reduction::Prod] {
        let all = Array::<i64>::zeros(DEV, &[n]).unwrap();
        assert_eq!(host.scan(r, 0, None, &[&all], &arr(&[n], &ints, false)), Answer::Done);
        let all = all.to_vec().unwrap();
        let m = 5000;
        let carry = Array::from_vec(DEV, &[], vec![all[m - 1]]).unwrap();
        let rest = Array::<i64>::zeros(DEV, &[n - m]).unwrap();
        assert_eq!(host.scan(r, 0, Some(&carry), &[&rest], &arr(&[n - m], &ints[m..], true)), Answer::Done);
        assert_eq!(rest.to_vec().unwrap(), all[m..], "{r:?} resumed at {m}");
    }
    // bf16 sums in f32 from a f32 carry, each result rounded once
    let hs: Vec<bf16> = (0..300).map(|k| bf16::from_f32(val(k))).collect();
    let carry = Array::from_vec(DEV, &[], vec![0.375f32]).unwrap();
    let d = Array::<bf16>::zeros(DEV, &[300]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 0, Some(&carry), &[&d], &arr(&[300], &hs, false)), Answer::Done);
    let mut acc = 0.375f32;
    let want: Vec<bf16> = hs
        .iter()
        .map(|h| {
            acc += h.to_f32();
            bf16::from_f32(acc)
        })
        .collect();
    assert_eq!(d.to_vec().unwrap(), want);
}

#[test]
fn scans_keep_special_values_and_refuse_what_does_not_fit() {
    let host = Host::new();
    let xs = [1.0f32, f32::NAN, 3.0, -0.0];
    let d = Array::<f32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(host.scan(Reduction::Max, 0, None, &[&d], &arr(&[4], &xs, false)), Answer::Done);
    let got = d.to_vec().unwrap();
    assert!(got[0] == 1.0 && got[1].is_nan() && got[2].is_nan() && got[3].is_nan());
    // a sum from +0: of −0 terms +0; a product from its first term keeps −0
    let z = [-0.0f32, -0.0];
    assert_eq!(
        host.scan(Reduction::Sum, 0, None, &[&Array::<f32>::zeros(DEV, &[2]).unwrap()], &arr(&[2], &z, false)),
        Answer::Done
    );
    let s = Array::<f32>::zeros(DEV, &[2]).unwrap();
    host.scan(Reduction::Sum, 0, None, &[&s], &arr(&[2], &z, false));
    assert!(s.to_vec().unwrap().iter().all(|v| v.to_bits() == 0));
    let p = Array::<f32>::zeros(DEV, &[2]).unwrap();
    host.scan(Reduction::Prod, 0, None, &[&p], &arr(&[2], &[-0.0f32, 2.0], false));
    assert!(p.to_vec().unwrap().iter().all(|v| v.to_bits() == (-0.0f32).to_bits()));
    // bool Max and Min are cumulative any and all
    let b = Array::<bool>::zeros(DEV, &[3]).unwrap();
    host.scan(Reduction::Max, 0, None, &[&b], &arr(&[3], &[false, true, false], false));
    assert_eq!(b.to_vec().unwrap(), [false, true, true]);
    // refusals, before any write
    let f = arr(&[4], &[1.0f32, 2.0, 3.0, 4.0], false);
    assert_eq!(
        host.scan(Reduction::Sum, 0, None, &[&Array::<bool>::zeros(DEV, &[3]).unwrap()], &arr(&[3], &[true; 3], false)),
        Answer::WrongDtype
    );
    assert_eq!(host.scan(Reduction::Sum, 0, None, &[&Array::<f64>::zeros(DEV, &[4]).unwrap()], &f), Answer::WrongDtype);
    let ints = arr(&[4], &[1i32, 2, 3, 4], false);
    let di = Array::<i32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(host.scan(Reduction::Logsumexp, 0, None, &[&di], &ints), Answer::WrongDtype, "integers have no lse");
    assert_eq!(host.scan(Reduction::Moments, 0, None, &[&d], &f), Answer::ShapeMismatch, "one destination of two");
    assert_eq!(host.scan(Reduction::Sum, 1, None, &[&d], &f), Answer::ShapeMismatch);
    let c = Array::<f64>::zeros(DEV, &[]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 0, Some(&c), &[&d], &f), Answer::WrongDtype);
    let c = Array::<f32>::zeros(DEV, &[2]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 0, Some(&c), &[&d], &f), Answer::ShapeMismatch);
    assert_eq!(
        host.scan(Reduction::Sum, 0, None, &[&Array::<f32>::zeros(DEV, &[5]).unwrap()], &f),
        Answer::ShapeMismatch
    );
    let cplx = Array::<num_complex::Complex32>::zeros(DEV, &[2]).unwrap();
    assert_eq!(host.scan(Reduction::Max, 0, None, &[&cplx], &cplx.copy().unwrap()), Answer::Declined);
    assert_eq!(
        host.scan(
            Reduction::Sum,
            0,
            None,
            &[&Array::<f32>::zeros(DEV, &[]).unwrap()],
            &Array::<f32>::zeros(DEV, &[]).unwrap()
        ),
        Answer::ShapeMismatch
    );
}

// ---------------------------------------------------------------- gathers and scatters

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn gathers_take_the_indexed_rows_bit_for_bit(
        shape in prop::collection::vec(prop_oneof![Just(1usize), 2usize..=6], 1..=3),
        axis_pick in 0usize..3,
        ishape in prop::collection::vec(0usize..=4, 0..=2),
        seed in any::<u64>(),
        strided in any::<bool>(),
    ) {
        let axis = axis_pick % shape.len();
        let n: usize = shape.iter().product();
        let m: usize = ishape.iter().product();
        let xs: Vec<f32> = (0..n).map(|k| if k % 5 == 3 { f32::from_bits(0x7fa0_0000 + k as u32) } else { val(k) }).collect();
        let a = arr(&shape, &xs, strided);
        let idx: Vec<i64> = (0..m).map(|t| (((seed >> (t % 32)) + t as u64 * 7) % shape[axis] as u64) as i64).collect();
        let ia = arr(&ishape, &idx, strided);
        let mut oshape = shape[..axis].to_vec();
        oshape.extend(&ishape);
        oshape.extend(&shape[axis + 1..]);
        let dst = Array::<f32>::zeros(DEV, &oshape).unwrap();
        prop_assert_eq!(Host::new().gather(axis, &dst, &a, &ia), Answer::Done);
        let got = dst.to_vec().unwrap();
        let on: usize = oshape.iter().product();
        for k in 0..on {
            let o = unflat(&oshape, k);
            let t = flat(&ishape, &o[axis..axis + ishape.len()]);
            let mut src = o[..axis].to_vec();
            src.push(idx[t] as usize);
            src.extend(&o[axis + ishape.len()..]);
            prop_assert_eq!(got[k].to_bits(), xs[flat(&shape, &src)].to_bits(), "at {:?}", o);
        }
        // a range gather of runs of 2 where the axis holds them
        if shape[axis] >= 2 {
            let starts: Vec<i64> = idx.iter().map(|&i| i.min(shape[axis] as i64 - 2)).collect();
            let sa = arr(&ishape, &starts, false);
            let mut rshape = shape[..axis].to_vec();
            rshape.extend(&ishape);
            rshape.push(2);
            rshape.extend(&shape[axis + 1..]);
            let rd = Array::<f32>::zeros(DEV, &rshape).unwrap();
            prop_assert_eq!(Host::new().range_gather(axis, 2, &rd, &a, &sa), Answer::Done);
            let got = rd.to_vec().unwrap();
            for (k, g) in got.iter().enumerate() {
                let o = unflat(&rshape, k);
                let t = flat(&ishape, &o[axis..axis + ishape.len()]);
                let mut src = o[..axis].to_vec();
                src.push(starts[t] as usize + o[axis + ishape.len()]);
                src.extend(&o[axis + ishape.len() + 1..]);
                prop_assert_eq!(g.to_bits(), xs[flat(&shape, &src)].to_bits());
            }
        }
    }

    #[test]
    fn scatters_add_duplicates_in_index_order_and_set_the_last(
        shape in prop::collection::vec(prop_oneof![Just(1usize), 2usize..=6], 1..=3),
        axis_pick in 0usize..3,
        len in 0usize..=9,
        seed in any::<u64>(),
        strided in any::<bool>(),
        with_into in any::<bool>(),
    ) {
        let axis = axis_pick % shape.len();
        let mut sshape = shape.clone();
        sshape[axis] = len;
        let (n, sn) = (shape.iter().product::<usize>(), sshape.iter().product::<usize>());
        let idx: Vec<i64> = (0..len).map(|t| ((seed >> (2 * t)) % shape[axis] as u64) as i64).collect();
        let xs: Vec<f32> = (0..sn).map(val).collect();
        let base: Vec<f32> = (0..n).map(|k| val(k + 1000)).collect();
        let (src, ia) = (arr(&sshape, &xs, strided), arr(&[len], &idx, strided));
        let into = arr(&shape, &base, strided);
        for mode in [Scatter::Add, Scatter::Set] {
            let dst = Array::<f32>::zeros(DEV, &shape).unwrap();
            let i: Option<&dyn Operand> = if with_into { Some(&into) } else { None };
            prop_assert_eq!(Host::new().scatter(mode, axis, &dst, i, &src, &ia), Answer::Done);
            let got = dst.to_vec().unwrap();
            for k in 0..n {
                let d = unflat(&shape, k);
                let mut want = if with_into { base[k] } else { 0.0 };
                for (t, &j) in idx.iter().enumerate() {
                    if j as usize == d[axis] {
                        let mut s = d.clone();
                        s[axis] = t;
                        let v = xs[flat(&sshape, &s)];
                        want = if mode == Scatter::Add { want + v } else { v };
                    }
                }
                prop_assert_eq!(got[k].to_bits(), want.to_bits(), "{:?} at {:?}", mode, d);
            }
        }
    }
}

/// A result past 8 MiB is written by streaming stores: rows of an odd byte length (heads and
/// tails unaligned), a destination at an odd offset, repeated indices, a range gather, on 1 and
/// 2 threads, each element against the table's.
#[test]
fn large_gathers_take_the_indexed_rows_bit_for_bit() {
    let (rows, width, tokens) = (997usize, 1027usize, 2111usize);
    let xs: Vec<f32> = (0..rows * width).map(|k| (k % 65_521) as f32 - 0.5).collect();
    let table = Array::from_vec(DEV, &[rows, width], xs.clone()).unwrap();
    let idx: Vec<i64> = (0..tokens).map(|t| ((t * 7919 + t / 3) % rows) as i64).collect();
    let ia = Array::from_vec(DEV, &[tokens], idx.clone()).unwrap();
    for threads in [1, 2] {
        let host = Host::with_threads(threads).unwrap();
        // the destination: rows 1.. of a larger buffer, so that it starts 4·width bytes in
        let big = Array::<f32>::zeros(DEV, &[tokens + 1, width]).unwrap();
        let dst = big.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
        assert!(tokens * width * 4 > 8 << 20);
        assert_eq!(host.gather(0, &dst, &table, &ia), Answer::Done);
        let got = big.to_vec().unwrap();
        assert!(got[..width].iter().all(|&x| x == 0.0), "the row before the destination is untouched");
        for t in 0..tokens {
            let (o, r) = (&got[(t + 1) * width..(t + 2) * width], idx[t] as usize);
            assert!(
                o.iter().zip(&xs[r * width..(r + 1) * width]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "row {t} (index {r}), {threads} threads"
            );
        }
        // runs of 3 rows from each start
        let starts: Vec<i64> = idx.iter().map(|&i| i.min(rows as i64 - 3)).collect();
        let sa = Array::from_vec(DEV, &[tokens], starts.clone()).unwrap();
        let rd = Array::<f32>::zeros(DEV, &[tokens, 3, width]).unwrap();
        assert_eq!(host.range_gather(0, 3, &rd, &table, &sa), Answer::Done);
        let got = rd.to_vec().unwrap();
        for t in 0..tokens {
            for q in 0..3 {
                let r = starts[t] as usize + q;
                let o = &got[(t * 3 + q) * width..(t * 3 + q + 1) * width];
                assert!(
                    o.iter().zip(&xs[r * width..(r + 1) * width]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "run {t}.{q}"
                );
            }
        }
    }
}

#[test]
fn indices_outside_the_axis_are_refused_before_any_write() {
    let host = Host::new();
    let a = arr(&[3, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], false);
    for bad in [-1i64, 3, i64::MIN, i64::MAX] {
        let i = arr(&[2], &[0, bad], false);
        let dst = Array::from_vec(DEV, &[2, 2], vec![9.0f32; 4]).unwrap();
        assert_eq!(host.gather(0, &dst, &a, &i), Answer::IndexOutOfRange, "{bad}");
        assert_eq!(dst.to_vec().unwrap(), [9.0; 4], "nothing written");
        let s = Array::from_vec(DEV, &[3, 2], vec![9.0f32; 6]).unwrap();
        assert_eq!(host.scatter(Scatter::Add, 0, &s, None, &dst, &i), Answer::IndexOutOfRange);
        assert_eq!(s.to_vec().unwrap(), [9.0; 6]);
    }
    // a run past the axis
    let starts = arr(&[1], &[2i64], false);
    let rd = Array::<f32>::zeros(DEV, &[1, 2, 2]).unwrap();
    assert_eq!(host.range_gather(0, 2, &rd, &a, &starts), Answer::IndexOutOfRange);
    // wrong dtypes and shapes
    let i = arr(&[2], &[0i64, 1], false);
    assert_eq!(host.gather(0, &Array::<f64>::zeros(DEV, &[2, 2]).unwrap(), &a, &i), Answer::WrongDtype);
    assert_eq!(host.gather(0, &Array::<f32>::zeros(DEV, &[2, 3]).unwrap(), &a, &i), Answer::ShapeMismatch);
    assert_eq!(host.gather(2, &Array::<f32>::zeros(DEV, &[2, 2]).unwrap(), &a, &i), Answer::ShapeMismatch);
    let i32s = arr(&[2], &[0i32, 1], false);
    assert_eq!(host.gather(0, &Array::<f32>::zeros(DEV, &[2, 2]).unwrap(), &a, &i32s), Answer::WrongDtype);
    let b = Array::<bool>::zeros(DEV, &[3]).unwrap();
    assert_eq!(
        host.scatter(Scatter::Add, 0, &b, None, &b.copy().unwrap(), &arr(&[3], &[0i64, 1, 2], false)),
        Answer::WrongDtype
    );
}

#[test]
fn scatter_adds_are_the_same_bits_on_any_thread_count_and_in_place() {
    // 20000 indices into 300 rows of 33: many duplicates per row
    let (rows, width, len) = (300, 33, 20000);
    let idx: Vec<i64> = (0..len).map(|t| ((t * 7919) % 1013 % rows) as i64).collect();
    let xs: Vec<f32> = (0..len * width).map(val).collect();
    let (src, ia) = (arr(&[len, width], &xs, true), arr(&[len], &idx, false));
    let run = |threads: usize| {
        let host = Host::with_threads(threads).unwrap();
        let dst = Array::<f32>::zeros(DEV, &[rows, width]).unwrap();
        assert_eq!(host.scatter(Scatter::Add, 0, &dst, None, &src, &ia), Answer::Done);
        dst.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let one = run(1);
    assert_eq!(run(2), one);
    assert_eq!(run(8), one);
    // into identical to the destination: added in place, as into a fresh one from a copy
    let dst = Array::from_vec(DEV, &[rows, width], (0..rows * width).map(val).collect()).unwrap();
    let fresh = Array::<f32>::zeros(DEV, &[rows, width]).unwrap();
    let copy = dst.copy().unwrap();
    assert_eq!(Host::new().scatter(Scatter::Add, 0, &fresh, Some(&copy), &src, &ia), Answer::Done);
    assert_eq!(Host::new().scatter(Scatter::Add, 0, &dst, Some(&dst), &src, &ia), Answer::Done);
    assert_eq!(dst.to_vec().unwrap(), fresh.to_vec().unwrap());
    // bf16 adds in f32 and rounds once
    let hs: Vec<bf16> = (0..6).map(|k| bf16::from_f32(val(k) / 64.0)).collect();
    let d = Array::<bf16>::zeros(DEV, &[1]).unwrap();
    let i = arr(&[6], &[0i64; 6], false);
    assert_eq!(Host::new().scatter(Scatter::Add, 0, &d, None, &arr(&[6], &hs, false), &i), Answer::Done);
    let want = bf16::from_f32(hs.iter().fold(0.0f32, |a, h| a + h.to_f32()));
    assert_eq!(d.to_vec().unwrap(), [want]);
}

// ---------------------------------------------------------------- sorts

/// The reference order: NaNs greatest (all alike), −0 below +0, by value otherwise.
fn before(a: f32, b: f32) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Equal,
        (true, false) => Greater,
        (false, true) => Less,
        _ if a == b => (a.is_sign_positive()).cmp(&b.is_sign_positive()),
        _ => a.partial_cmp(&b).unwrap(),
    }
}

/// The naive stable sort of each lane of `x` (of `shape`) along `axis`: (values, positions) of
/// the first `k`.
fn naive_sort(shape: &[usize], axis: usize, x: &[f32], descending: bool, k: usize) -> (Vec<f32>, Vec<i64>) {
    let mut oshape = shape.to_vec();
    oshape[axis] = k;
    let on: usize = oshape.iter().product();
    let (mut vals, mut pos) = (vec![0.0; on], vec![0; on]);
    let mut sorted: std::collections::HashMap<Vec<usize>, Vec<(f32, usize)>> = Default::default();
    for o in 0..on {
        let oi = unflat(&oshape, o);
        let mut key = oi.clone();
        key[axis] = 0;
        let lane = sorted.entry(key).or_insert_with(|| {
            let mut lane: Vec<(f32, usize)> = (0..shape[axis])
                .map(|t| {
                    let mut i = oi.clone();
                    i[axis] = t;
                    (x[flat(shape, &i)], t)
                })
                .collect();
            // stable: ties keep their positions' order, ascending or descending
            lane.sort_by(|p, q| if descending { before(q.0, p.0) } else { before(p.0, q.0) });
            lane
        });
        vals[o] = lane[oi[axis]].0;
        pos[o] = lane[oi[axis]].1 as i64;
    }
    (vals, pos)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn sorts_are_stable_and_order_nans_and_zeros_as_the_reference(
        shape in prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=40], 1..=2),
        axis_pick in 0usize..2,
        k_cut in 0usize..=40,
        descending in any::<bool>(),
        strided in any::<bool>(),
        long in any::<bool>(),
    ) {
        let mut shape = shape;
        let axis = axis_pick % shape.len();
        if long {
            shape[axis] = 1500; // past the radix threshold
        }
        let n: usize = shape.iter().product();
        // few distinct values: many ties; NaNs of both signs, ±0, ±∞
        let pick = [0.0f32, -0.0, 1.0, -1.0, f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 2.5, 1.0];
        let xs: Vec<f32> = (0..n).map(|k| pick[(k * 7 + k / 3) % pick.len()]).collect();
        let a = arr(&shape, &xs, strided);
        for k in [shape[axis], k_cut.min(shape[axis])] {
            let mut oshape = shape.clone();
            oshape[axis] = k;
            let (v, p) = (Array::<f32>::zeros(DEV, &oshape).unwrap(), Array::<i64>::zeros(DEV, &oshape).unwrap());
            prop_assert_eq!(Host::new().sort(axis, descending, Some(&v), Some(&p), &a), Answer::Done);
            let (wv, wp) = naive_sort(&shape, axis, &xs, descending, k);
            prop_assert_eq!(p.to_vec().unwrap(), wp.clone(), "positions, k = {}", k);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&v.to_vec().unwrap()), bits(&wv), "values keep their bits");
            // positions alone
            let p2 = Array::<i64>::zeros(DEV, &oshape).unwrap();
            prop_assert_eq!(Host::new().sort(axis, descending, None, Some(&p2), &a), Answer::Done);
            prop_assert_eq!(p2.to_vec().unwrap(), wp);
        }
    }
}

#[test]
fn integer_sorts_top_k_thread_counts_and_refusals() {
    // i32 and u8 lanes against the standard library's stable sort, and a top-k of few of many
    let xs: Vec<i32> = (0..50_000).map(|k| (k * 7919) % 10007 - 5000).collect();
    let want = |d: bool, k: usize| {
        let mut v = Vec::new();
        for r in 0..5 {
            let mut lane: Vec<(i32, i64)> = (0..10_000).map(|t| (xs[r * 10_000 + t], t as i64)).collect();
            lane.sort_by(|p, q| if d { q.0.cmp(&p.0) } else { p.0.cmp(&q.0) });
            v.extend(lane[..k].iter().map(|x| x.1));
        }
        v
    };
    // lanes strided and contiguous (a top-k's filter reads a contiguous lane as a slice)
    for strided in [true, false] {
        let a = arr(&[5, 10_000], &xs, strided);
        for (threads, d, k) in [(1, false, 10_000), (2, true, 10_000), (8, true, 50), (1, false, 3), (2, false, 0)] {
            let p = Array::<i64>::zeros(DEV, &[5, k]).unwrap();
            assert_eq!(Host::with_threads(threads).unwrap().sort(1, d, None, Some(&p), &a), Answer::Done);
            assert_eq!(p.to_vec().unwrap(), want(d, k), "{threads} threads, descending {d}, k {k}, strided {strided}");
        }
    }
    // a top-k of booleans from a contiguous lane, some read through a bitcast of bytes that
    // are neither 0 nor 1 (a boolean reads a byte ≠ 0)
    let raw: Vec<u8> = (0..2 * 3000).map(|k| if k % 97 == 5 { (k % 7 + 1) as u8 * 2 } else { 0 }).collect();
    let flags = arr(&[2, 3000], &raw, false).bitcast::<bool>().unwrap().unwrap();
    let p = Array::<i64>::zeros(DEV, &[2, 5]).unwrap();
    assert_eq!(Host::new().sort(1, true, None, Some(&p), &flags), Answer::Done);
    let want: Vec<i64> = (0..2)
        .flat_map(|r| (0..3000).filter(|t| raw[r * 3000 + t] != 0).take(5).map(|t| t as i64).collect::<Vec<_>>())
        .collect();
    assert_eq!(p.to_vec().unwrap(), want, "top-5 of booleans");
    let bytes: Vec<u8> = (0..3000).map(|k| (k * 31 % 251) as u8).collect();
    let v = Array::<u8>::zeros(DEV, &[3000]).unwrap();
    assert_eq!(Host::new().sort(0, false, Some(&v), None, &arr(&[3000], &bytes, false)), Answer::Done);
    let mut sorted = bytes.clone();
    sorted.sort();
    assert_eq!(v.to_vec().unwrap(), sorted);
    // refusals
    let f = arr(&[4], &[1.0f32, 2.0, 3.0, 4.0], false);
    assert_eq!(Host::new().sort(0, false, None, None, &f), Answer::ShapeMismatch);
    assert_eq!(
        Host::new().sort(0, false, Some(&Array::<f32>::zeros(DEV, &[5]).unwrap()), None, &f),
        Answer::ShapeMismatch
    );
    assert_eq!(
        Host::new().sort(1, false, Some(&Array::<f32>::zeros(DEV, &[4]).unwrap()), None, &f),
        Answer::ShapeMismatch
    );
    assert_eq!(
        Host::new().sort(0, false, None, Some(&Array::<i32>::zeros(DEV, &[4]).unwrap()), &f),
        Answer::WrongDtype
    );
    let c = Array::<num_complex::Complex64>::zeros(DEV, &[2]).unwrap();
    assert_eq!(Host::new().sort(0, false, Some(&c), None, &c.copy().unwrap()), Answer::Declined);
}

// ---------------------------------------------------------------- assembly

#[test]
fn assembly_writes_pieces_in_order_at_their_offsets() {
    let host = Host::new();
    // concatenation along axis 1 of [2, 3] and [2, 2] (strided), then a box over both
    let a = arr(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], true);
    let b = arr(&[2, 2], &[7.0f32, 8.0, 9.0, 10.0], true);
    let dst = Array::<f32>::zeros(DEV, &[2, 5]).unwrap();
    assert_eq!(host.assemble(&dst, &[(&[0, 0], &a), (&[0, 3], &b)]), Answer::Done);
    assert_eq!(dst.to_vec().unwrap(), [1.0, 2.0, 3.0, 7.0, 8.0, 4.0, 5.0, 6.0, 9.0, 10.0]);
    // the result itself first (kept), then a box written over it; the later piece wins
    let boxed = arr(&[1, 2], &[-1.0f32, -2.0], false);
    assert_eq!(host.assemble(&dst, &[(&[0, 0], &dst), (&[1, 2], &boxed)]), Answer::Done);
    assert_eq!(dst.to_vec().unwrap(), [1.0, 2.0, 3.0, 7.0, 8.0, 4.0, 5.0, -1.0, -2.0, 10.0]);
    // stacking: pieces of [1, 3] at rows 0 and 1; rank 0 and empty pieces
    let s = Array::<f32>::zeros(DEV, &[2, 3]).unwrap();
    let r0 = arr(&[1, 3], &[1.0f32, 2.0, 3.0], false);
    let r1 = arr(&[1, 3], &[4.0f32, 5.0, 6.0], true);
    let none = Array::<f32>::zeros(DEV, &[0, 3]).unwrap();
    assert_eq!(host.assemble(&s, &[(&[0, 0], &r0), (&[1, 0], &r1), (&[2, 0], &none)]), Answer::Done);
    assert_eq!(s.to_vec().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let scalar = Array::<f32>::zeros(DEV, &[]).unwrap();
    assert_eq!(host.assemble(&scalar, &[(&[], &arr(&[], &[4.5f32], false))]), Answer::Done);
    assert_eq!(scalar.to_vec().unwrap(), [4.5]);
    // refusals: a piece past the result, of another rank or dtype
    assert_eq!(host.assemble(&s, &[(&[1, 1], &r0)]), Answer::ShapeMismatch);
    assert_eq!(host.assemble(&s, &[(&[0], &r0)]), Answer::ShapeMismatch);
    assert_eq!(host.assemble(&s, &[(&[0, 0], &arr(&[1, 3], &[1.0f64, 2.0, 3.0], false))]), Answer::WrongDtype);
    assert_eq!(host.assemble(&s, &[(&[usize::MAX, 0], &r0)]), Answer::ShapeMismatch);
}

#[test]
fn review_cases_offsets_identical_operands_carries_of_rank_one_and_queued_indices() {
    let host = Host::new();
    // a gather into a C-contiguous destination at an offset (rows 1..3 of a [4, 2] array)
    let a = arr(&[3, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], false);
    let big = Array::<f32>::zeros(DEV, &[4, 2]).unwrap();
    let part = big.apply(&Move::Slice { axis: 0, start: Some(1), stop: Some(3), step: 1 }).unwrap().unwrap();
    assert!(part.layout().is_contiguous() && part.layout().offset() == 2);
    assert_eq!(host.gather(0, &part, &a, &arr(&[2], &[2i64, 0], false)), Answer::Done);
    assert_eq!(big.to_vec().unwrap(), [0.0, 0.0, 5.0, 6.0, 1.0, 2.0, 0.0, 0.0]);
    // a destination identical to an operand read at other indices: refused
    let i3 = arr(&[3], &[2i64, 0, 1], false);
    assert_eq!(host.gather(0, &a, &a, &i3), Answer::Overlapping);
    assert_eq!(host.scatter(Scatter::Add, 0, &a, None, &a, &i3), Answer::Overlapping);
    assert_eq!(host.scatter(Scatter::Add, 0, &a, Some(&a), &a.copy().unwrap(), &i3), Answer::Done, "into may be it");
    let f = arr(&[5], &[3.0f32, 1.0, 2.0, 0.0, 4.0], false);
    assert_eq!(host.sort(0, false, Some(&f), None, &f), Answer::Overlapping);
    assert_eq!(host.scan(Reduction::Sum, 0, None, &[&f], &f), Answer::Overlapping);
    assert_eq!(host.pad(&nx_kernels::Pad::none(1), nx_kernels::Value::Float(0.0), &f, &f), Answer::Overlapping);
    let s = Array::<f32>::zeros(DEV, &[2, 5]).unwrap();
    let row = s.apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(1), step: 1 }).unwrap().unwrap();
    assert_eq!(host.assemble(&s, &[(&[1, 0], &row)]), Answer::Overlapping, "a piece of the result elsewhere");
    // a carry of rank 1: each lane along axis 1 from its own
    let x = arr(&[3, 4], &(0..12).map(|k| k as i64).collect::<Vec<_>>(), true);
    let carry = arr(&[3], &[100i64, -100, 7], true);
    let d = Array::<i64>::zeros(DEV, &[3, 4]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 1, Some(&carry), &[&d], &x), Answer::Done);
    let mut want = Vec::new();
    for (r, c) in [100i64, -100, 7].iter().enumerate() {
        let mut acc = *c;
        for j in 0..4 {
            acc += (r * 4 + j) as i64;
            want.push(acc);
        }
    }
    assert_eq!(d.to_vec().unwrap(), want);
    // on a queued device, indices written by queued work are read when the gather runs
    let rig = nx_kernels::rig::Rig::queued(DEV, std::time::Duration::from_micros(300), 5).unwrap();
    let n = 5000;
    let xs: Vec<f32> = (0..n).map(val).collect();
    let q = Array::<f32>::from_fn_on(&rig, &[n], |i| xs[i[0]]).unwrap();
    let pos = Array::<i64>::zeros_on(&rig, &[n]).unwrap();
    assert_eq!(host.sort(0, false, None, Some(&pos), &q), Answer::Done);
    let sorted = Array::<f32>::zeros_on(&rig, &[n]).unwrap();
    assert_eq!(host.gather(0, &sorted, &q, &pos), Answer::Done);
    let mut want = xs.clone();
    want.sort_by(f32::total_cmp);
    assert_eq!(sorted.to_vec().unwrap(), want);
}
