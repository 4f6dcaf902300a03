//! Padding and folds (pooling over windows of a padded operand) of the host library against
//! naive references written here: random shapes, paddings (crops, interior), windows (stride,
//! dilation), strided operands, special values, refusals, the same bits on 1, 2 and 8 threads.

use nx_kernels::{Answer, Array, Host, Kernels, Move, Pad, Reduction, Value, Windows};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn unflat(shape: &[usize], mut k: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = k % shape[d];
        k /= shape[d];
    }
    idx
}

fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().enumerate().fold(0, |a, (d, &i)| a * shape[d] + i)
}

/// The padded operand's value at padded index `p`: the source element, or `None` for the fill.
fn naive_at(shape: &[usize], lo: &[isize], interior: &[usize], p: &[usize]) -> Option<Vec<usize>> {
    let mut i = Vec::new();
    for d in 0..shape.len() {
        let q = p[d] as isize - lo[d];
        let step = interior[d] as isize + 1;
        if q < 0 || q % step != 0 || (q / step) as usize >= shape[d] {
            return None;
        }
        i.push((q / step) as usize);
    }
    Some(i)
}

/// `xs` (C order) as a strided view: every other element along the last axis, reversed.
fn strided(shape: &[usize], xs: &[f32]) -> Array<f32> {
    let mut big = shape.to_vec();
    let r = shape.len();
    big[r - 1] = big[r - 1] * 2 + 1;
    let b = Array::<f32>::zeros(DEV, &big).unwrap();
    let v = b.apply(&Move::Slice { axis: r - 1, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let v = v.apply(&Move::Flip(0)).unwrap().unwrap();
    Array::transfer(&Array::from_vec(DEV, shape, xs.to_vec()).unwrap(), &v).unwrap();
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pads_and_folds_match_the_naive_padded_operand(
        shape in prop::collection::vec(0usize..=6, 1..=3),
        lo in prop::collection::vec(-2isize..=3, 3),
        hi in prop::collection::vec(-2isize..=3, 3),
        interior in prop::collection::vec(0usize..=2, 3),
        size in prop::collection::vec(1usize..=3, 3),
        stride in prop::collection::vec(1usize..=3, 3),
        dilation in prop::collection::vec(1usize..=2, 3),
    ) {
        let r = shape.len();
        let pad = Pad { lo: lo[..r].to_vec(), hi: hi[..r].to_vec(), interior: interior[..r].to_vec() };
        let n: usize = shape.iter().product();
        let xs: Vec<f32> = (0..n).map(|k| if k % 7 == 5 { f32::from_bits(0x7fc0_0000 + k as u32) } else { (k as f32 * 0.37).sin() }).collect();
        let src = if n > 0 { strided(&shape, &xs) } else { Array::from_vec(DEV, &shape, xs.clone()).unwrap() };
        let host = Host::new();
        let padded = match pad.shape(&shape) {
            Ok(p) => p,
            Err(_) => {
                // a crop past the operand: no padded shape, every destination refused
                let dst = Array::<f32>::zeros(DEV, &[1]).unwrap();
                prop_assert_eq!(host.pad(&pad, Value::Float(0.0), &dst, &src), Answer::ShapeMismatch);
                return Ok(());
            }
        };
        let dst = Array::<f32>::zeros(DEV, &padded).unwrap();
        prop_assert_eq!(host.pad(&pad, Value::Float(-7.5), &dst, &src), Answer::Done);
        let got = dst.to_vec().unwrap();
        for (k, g) in got.iter().enumerate() {
            let p = unflat(&padded, k);
            let want = naive_at(&shape, &pad.lo, &pad.interior, &p).map_or(-7.5, |i| xs[flat(&shape, &i)]);
            prop_assert_eq!(g.to_bits(), want.to_bits(), "at {:?}", p);
        }
        // folds over the padded operand: a max pool (fill −∞) and a sum pool (fill 0)
        let win = Windows { size: size[..r].to_vec(), stride: stride[..r].to_vec(), dilation: dilation[..r].to_vec() };
        let out = win.shape(&padded).unwrap();
        let finite: Vec<f32> = xs.iter().map(|x| if x.is_nan() { 0.25 } else { *x }).collect();
        let fsrc = Array::from_vec(DEV, &shape, finite.clone()).unwrap();
        for (red, fill) in [(Reduction::Max, f64::NEG_INFINITY), (Reduction::Sum, 0.0)] {
            let d = Array::<f32>::zeros(DEV, &out).unwrap();
            prop_assert_eq!(host.fold(red, &pad, Value::Float(fill), &win, &d, &fsrc), Answer::Done);
            let got = d.to_vec().unwrap();
            let wn: usize = win.size.iter().product();
            for (j, g) in got.iter().enumerate() {
                let o = unflat(&out, j);
                let terms: Vec<f64> = (0..wn).map(|t| {
                    let w = unflat(&win.size, t);
                    let p: Vec<usize> = (0..r).map(|d| o[d] * win.stride[d] + w[d] * win.dilation[d]).collect();
                    naive_at(&shape, &pad.lo, &pad.interior, &p).map_or(fill, |i| f64::from(finite[flat(&shape, &i)]))
                }).collect();
                if red == Reduction::Max {
                    let m = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    prop_assert_eq!(f64::from(*g), m);
                } else {
                    let (s, mag): (f64, f64) = (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum());
                    let u = f64::from(f32::EPSILON) / 2.0;
                    prop_assert!((f64::from(*g) - s).abs() <= wn as f64 * u * mag + u * s.abs(), "{} vs {}", g, s);
                }
            }
        }
    }
}

#[test]
fn folds_pool_integers_exactly_on_any_thread_count_and_refuse_what_does_not_fit() {
    // a 2-D max pool of i32 (3×3 windows, stride 2, padding 1 of i32::MIN) and a product pool
    let (h, w) = (37, 41);
    let xs: Vec<i32> = (0..h * w).map(|k| ((k * 7919) % 1009) as i32 - 500).collect();
    let src = Array::from_vec(DEV, &[h, w], xs.clone()).unwrap();
    let pad = Pad::edges(&[1, 1], &[1, 1]);
    let win = Windows::new(&[3, 3], &[2, 2]);
    let out = win.shape(&pad.shape(&[h, w]).unwrap()).unwrap();
    assert_eq!(out, [19, 21]);
    let run = |threads: usize| {
        let d = Array::<i32>::zeros(DEV, &out).unwrap();
        let host = Host::with_threads(threads).unwrap();
        assert_eq!(host.fold(Reduction::Max, &pad, Value::Int(i128::from(i32::MIN)), &win, &d, &src), Answer::Done);
        d.to_vec().unwrap()
    };
    let one = run(1);
    for (j, &g) in one.iter().enumerate() {
        let (oi, oj) = (j / out[1], j % out[1]);
        let mut m = i32::MIN;
        for a in 0..3 {
            for b in 0..3 {
                let (pi, pj) = ((oi * 2 + a) as isize - 1, (oj * 2 + b) as isize - 1);
                if (0..h as isize).contains(&pi) && (0..w as isize).contains(&pj) {
                    m = m.max(xs[pi as usize * w + pj as usize]);
                }
            }
        }
        assert_eq!(g, m, "at {j}");
    }
    assert_eq!(run(2), one);
    assert_eq!(run(8), one);
    // refusals: another dtype, a wrong shape, booleans summed, a window of 0, an Arg fold
    let host = Host::new();
    let bad = Array::<f32>::zeros(DEV, &out).unwrap();
    assert_eq!(host.fold(Reduction::Max, &pad, Value::Int(0), &win, &bad, &src), Answer::WrongDtype);
    let small = Array::<i32>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.fold(Reduction::Max, &pad, Value::Int(0), &win, &small, &src), Answer::ShapeMismatch);
    let b = Array::<bool>::zeros(DEV, &[4]).unwrap();
    assert_eq!(
        host.fold(
            Reduction::Sum,
            &Pad::none(1),
            Value::Bool(false),
            &Windows::new(&[2], &[2]),
            &Array::<bool>::zeros(DEV, &[2]).unwrap(),
            &b
        ),
        Answer::WrongDtype
    );
    let zero = Windows::new(&[0, 3], &[1, 1]);
    assert!(zero.shape(&[4, 4]).is_err());
    assert_eq!(host.fold(Reduction::Max, &pad, Value::Int(0), &zero, &small, &src), Answer::ShapeMismatch);
    assert_eq!(host.fold(Reduction::Logsumexp, &pad, Value::Int(0), &win, &small, &src), Answer::Declined);
    assert_eq!(
        host.pad(&Pad::none(1), Value::Int(0), &small, &src),
        Answer::ShapeMismatch,
        "a padding of another rank"
    );
    assert!(Pad::edges(&[-3], &[-2]).shape(&[4]).is_err(), "a crop past the operand");
    assert_eq!(Pad { lo: vec![-1], hi: vec![0], interior: vec![2] }.shape(&[3]).unwrap(), [6]);
}
