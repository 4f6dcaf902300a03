//! Scans of every reduction kind beyond the monoids (`Logsumexp`, `Moments`, `Arg`) against
//! naive f64 references written here, recomputed from scratch for every prefix: the library's
//! stated bounds, the reductions' special values (NaN, ±∞, −0, ties), the prefix property bit for
//! bit across blocks, lanes along strided axes, a carry, 1, 2 and 8 threads, refusals.

use nx_kernels::{Answer, Array, Element, Extreme, Host, Kernels, Move, Reduction};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// Lane lengths: one term, a few, past one block of 4096 and past three.
const LENGTHS: [usize; 4] = [1, 7, 4099, 3 * 4096 + 5];

/// `vals` laid as `[n, 3]` with every column the lane, read along axis 0 through a strided view
/// (every other row of a larger array), so that lanes and their destinations step by strides.
fn lanes<T: Element>(vals: &[T]) -> Array<T> {
    let n = vals.len();
    let big = Array::<T>::zeros(DEV, &[2 * n, 3]).unwrap();
    let v = big.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let data: Vec<T> = vals.iter().flat_map(|&x| [x, x, x]).collect();
    Array::transfer(&Array::from_vec(DEV, &[n, 3], data).unwrap(), &v).unwrap();
    v
}

/// Column `c` of a `[n, 3]` result.
fn column<T: Element>(a: &Array<T>, c: usize) -> Vec<T> {
    a.to_vec().unwrap().chunks(3).map(|r| r[c]).collect()
}

/// log Σ exp over `xs`, from scratch: −∞ for no term or all −∞, NaN with a NaN, +∞ with a +∞.
fn naive_lse(xs: &[f64]) -> f64 {
    if xs.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if m.is_infinite() {
        return m;
    }
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// The values of a prefix scan at every index `i` (from scratch for each: quadratic, so only for
/// the shorter lanes and every 101st index of the longest).
fn checked_indices(n: usize) -> Vec<usize> {
    if n <= 4200 {
        (0..n).collect()
    } else {
        (0..n).step_by(101).chain([n - 1]).collect()
    }
}

fn scan<T: Element>(
    h: &Host,
    r: Reduction,
    carry: Option<&dyn nx_kernels::Operand>,
    dsts: &[&dyn nx_kernels::Operand],
    src: &Array<T>,
) {
    assert_eq!(h.scan(r, 0, carry, dsts, src), Answer::Done, "{r:?}");
}

#[test]
fn logsumexp_scans_are_within_their_bound_and_keep_the_prefix_property() {
    for n in LENGTHS {
        let xs: Vec<f64> = (0..n).map(|k| ((k as f64) * 0.7).sin() * 30.0 - (k % 13) as f64).collect();
        let u64_ = f64::EPSILON / 2.0;
        // f64 and f32 terms; f32 also from a carry of 5 (the lse of the terms before)
        let x64 = lanes(&xs);
        let d64 = Array::<f64>::zeros(DEV, &[n, 3]).unwrap();
        scan(&Host::new(), Reduction::Logsumexp, None, &[&d64], &x64);
        let x32v: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        let x32 = lanes(&x32v);
        let d32 = Array::<f32>::zeros(DEV, &[n, 3]).unwrap();
        let carry = Array::from_vec(DEV, &[3], vec![5.0f32; 3]).unwrap();
        scan(&Host::new(), Reduction::Logsumexp, Some(&carry), &[&d32], &x32);
        let (g64, g32) = (column(&d64, 1), column(&d32, 2));
        for i in checked_indices(n) {
            let l = naive_lse(&xs[..=i]);
            let bound = (4.0 * (i as f64 + 2.0) + 2.0 * l.abs()) * u64_;
            assert!((g64[i] - l).abs() <= bound, "f64 at {i} of {n}: {} vs {l}", g64[i]);
            let terms: Vec<f64> = std::iter::once(5.0).chain(x32v[..=i].iter().map(|&x| f64::from(x))).collect();
            let l = naive_lse(&terms);
            let u32_ = f64::from(f32::EPSILON) / 2.0;
            assert!((f64::from(g32[i]) - l).abs() <= u32_ * l.abs() + bound, "f32 at {i} of {n}: {} vs {l}", g32[i]);
        }
        // the same bits on 1, 2 and 8 threads, and for a prefix of the lane
        let bits = |t: usize, m: usize| {
            let d = Array::<f32>::zeros(DEV, &[m, 3]).unwrap();
            scan(&Host::with_threads(t).unwrap(), Reduction::Logsumexp, None, &[&d], &lanes(&x32v[..m]));
            d.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let whole = bits(1, n);
        assert_eq!(bits(2, n), whole);
        assert_eq!(bits(8, n), whole);
        let m = n - n / 3;
        assert_eq!(bits(2, m), whole[..3 * m], "the scan of a prefix is the prefix of the scan");
    }
    // special values: all −∞ so far is −∞, a +∞ makes +∞, a NaN makes NaN from there on
    let ninf = f32::NEG_INFINITY;
    let xs = [ninf, ninf, 0.0, f32::INFINITY, 1.0, f32::NAN, 2.0];
    let d = Array::<f32>::zeros(DEV, &[7, 3]).unwrap();
    scan(&Host::new(), Reduction::Logsumexp, None, &[&d], &lanes(&xs));
    let g = column(&d, 0);
    assert_eq!(&g[..4], &[ninf, ninf, 0.0, f32::INFINITY]);
    assert_eq!(g[4], f32::INFINITY);
    assert!(g[5].is_nan() && g[6].is_nan());
    // bf16 terms scan in f32 and round once
    let hb: Vec<half::bf16> = [1.0f32, 2.0, 3.0].iter().map(|&x| half::bf16::from_f32(x)).collect();
    let d = Array::<half::bf16>::zeros(DEV, &[3, 3]).unwrap();
    scan(&Host::new(), Reduction::Logsumexp, None, &[&d], &lanes(&hb));
    let want: Vec<half::bf16> = [naive_lse(&[1.0]), naive_lse(&[1.0, 2.0]), naive_lse(&[1.0, 2.0, 3.0])]
        .iter()
        .map(|&v| half::bf16::from_f64(v))
        .collect();
    assert_eq!(column(&d, 1), want);
}

#[test]
fn moments_scans_give_each_prefix_its_mean_and_variance() {
    for n in LENGTHS {
        let xs: Vec<f64> = (0..n).map(|k| 100.0 + ((k as f64) * 1.3).cos() * (1.0 + (k % 5) as f64)).collect();
        let x = lanes(&xs);
        let (mean, var) = (Array::<f64>::zeros(DEV, &[n, 3]).unwrap(), Array::<f64>::zeros(DEV, &[n, 3]).unwrap());
        scan(&Host::new(), Reduction::Moments, None, &[&mean, &var], &x);
        let (gm, gv) = (column(&mean, 0), column(&var, 2));
        let u = f64::EPSILON / 2.0;
        let big = xs.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        for i in checked_indices(n) {
            let p = &xs[..=i];
            let m = p.iter().sum::<f64>() / p.len() as f64;
            let v = p.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / p.len() as f64;
            assert!((gm[i] - m).abs() <= 4.0 * (i as f64 + 2.0) * u * big, "mean at {i} of {n}: {} vs {m}", gm[i]);
            assert!(
                (gv[i] - v).abs() <= 8.0 * (i as f64 + 2.0) * u * big * big,
                "variance at {i} of {n}: {} vs {v}",
                gv[i]
            );
            assert!(gv[i] >= 0.0);
        }
        let bits = |t: usize| {
            let (a, b) = (Array::<f64>::zeros(DEV, &[n, 3]).unwrap(), Array::<f64>::zeros(DEV, &[n, 3]).unwrap());
            scan(&Host::with_threads(t).unwrap(), Reduction::Moments, None, &[&a, &b], &x);
            (a.to_vec().unwrap(), b.to_vec().unwrap())
        };
        let one = bits(1);
        assert_eq!(bits(2), one);
        assert_eq!(bits(8), one);
    }
    // special values: an infinity makes the mean that infinity and the variance NaN; both signs
    // make the mean NaN; a NaN makes both NaN
    let inf = f32::INFINITY;
    let xs = [1.0f32, 3.0, inf, 2.0, -inf, 0.0];
    let (m, v) = (Array::<f32>::zeros(DEV, &[6, 3]).unwrap(), Array::<f32>::zeros(DEV, &[6, 3]).unwrap());
    scan(&Host::new(), Reduction::Moments, None, &[&m, &v], &lanes(&xs));
    let (m, v) = (column(&m, 1), column(&v, 1));
    assert_eq!((m[0], v[0], m[1], v[1]), (1.0, 0.0, 2.0, 1.0));
    assert_eq!((m[2], m[3]), (inf, inf));
    assert!(v[2].is_nan() && v[3].is_nan() && m[4].is_nan() && v[4].is_nan() && m[5].is_nan());
    let xs = [1.0f32, f32::NAN, 2.0];
    let (m, v) = (Array::<f32>::zeros(DEV, &[3, 3]).unwrap(), Array::<f32>::zeros(DEV, &[3, 3]).unwrap());
    scan(&Host::new(), Reduction::Moments, None, &[&m, &v], &lanes(&xs));
    assert_eq!(column(&m, 0)[0], 1.0);
    assert!(column(&m, 0)[1..].iter().chain(&column(&v, 0)[1..]).all(|x| x.is_nan()));
}

/// The running extreme and the position of its first occurrence (of the first NaN once one is
/// seen), from scratch for every prefix: `Maximum`'s order puts −0 below +0.
fn naive_arg(xs: &[f64], e: Extreme) -> Vec<(f64, i64)> {
    let beats = |x: f64, y: f64| match e {
        Extreme::Max => x > y || (x == y && x.is_sign_positive() && y.is_sign_negative()),
        Extreme::Min => x < y || (x == y && x.is_sign_negative() && y.is_sign_positive()),
    };
    (0..xs.len())
        .map(|i| {
            if let Some(p) = xs[..=i].iter().position(|x| x.is_nan()) {
                return (f64::NAN, p as i64);
            }
            let mut best = 0;
            for j in 1..=i {
                if beats(xs[j], xs[best]) {
                    best = j;
                }
            }
            (xs[best], best as i64)
        })
        .collect()
}

#[test]
fn arg_scans_are_exact_running_extremes_with_first_positions() {
    for n in LENGTHS {
        // few distinct values, so that ties cross blocks; signed zeros among them
        let xs: Vec<f64> = (0..n)
            .map(|k| match (k * 7919) % 11 {
                0 => -0.0,
                1 => 0.0,
                j => (j as f64 - 5.0) * ((k / 1000) as f64 + 1.0),
            })
            .collect();
        let x32: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
        let xi: Vec<i32> = xs.iter().map(|&x| x as i32).collect();
        for e in [Extreme::Max, Extreme::Min] {
            let want = naive_arg(&xs, e);
            let run = |t: usize| {
                let (v, p) = (Array::<f32>::zeros(DEV, &[n, 3]).unwrap(), Array::<i64>::zeros(DEV, &[n, 3]).unwrap());
                scan(&Host::with_threads(t).unwrap(), Reduction::Arg(e), None, &[&v, &p], &lanes(&x32));
                (column(&v, 2), column(&p, 2))
            };
            let (v, p) = run(1);
            let checked = checked_indices(n);
            for &i in &checked {
                assert_eq!((f64::from(v[i]).to_bits(), p[i]), (want[i].0.to_bits(), want[i].1), "{e:?} at {i} of {n}");
            }
            assert_eq!(run(2), (v.clone(), p.clone()));
            assert_eq!(run(8), (v, p));
            let want_i = naive_arg(&xi.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), e);
            let (v, p) = (Array::<i32>::zeros(DEV, &[n, 3]).unwrap(), Array::<i64>::zeros(DEV, &[n, 3]).unwrap());
            scan(&Host::new(), Reduction::Arg(e), None, &[&v, &p], &lanes(&xi));
            let (v, p) = (column(&v, 0), column(&p, 0));
            for &i in &checked {
                assert_eq!((f64::from(v[i]), p[i]), want_i[i], "i32 {e:?} at {i}");
            }
        }
    }
    // the first NaN wins and stays; booleans: any/all with the first true/false
    let xs = [1.0f32, f32::NAN, 5.0, f32::NAN];
    let (v, p) = (Array::<f32>::zeros(DEV, &[4, 3]).unwrap(), Array::<i64>::zeros(DEV, &[4, 3]).unwrap());
    scan(&Host::new(), Reduction::Arg(Extreme::Min), None, &[&v, &p], &lanes(&xs));
    assert_eq!(column(&p, 1), [0, 1, 1, 1]);
    assert!(column(&v, 1)[1..].iter().all(|x| x.is_nan()));
    let bs = [false, false, true, true, false];
    let (v, p) = (Array::<bool>::zeros(DEV, &[5, 3]).unwrap(), Array::<i64>::zeros(DEV, &[5, 3]).unwrap());
    scan(&Host::new(), Reduction::Arg(Extreme::Max), None, &[&v, &p], &lanes(&bs));
    assert_eq!((column(&v, 0), column(&p, 0)), (vec![false, false, true, true, true], vec![0, 0, 2, 2, 2]));
}

#[test]
fn scans_of_the_new_kinds_refuse_what_does_not_fit() {
    let h = Host::new();
    let x = Array::from_vec(DEV, &[4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let (a, b) = (Array::<f32>::zeros(DEV, &[4]).unwrap(), Array::<f32>::zeros(DEV, &[4]).unwrap());
    let p = Array::<i64>::zeros(DEV, &[4]).unwrap();
    let c = Array::<f32>::zeros(DEV, &[]).unwrap();
    let arg = Reduction::Arg(Extreme::Max);
    assert_eq!(h.scan(Reduction::Moments, 0, Some(&c), &[&a, &b], &x), Answer::Declined, "a carry of moments");
    assert_eq!(h.scan(arg, 0, Some(&c), &[&a, &p], &x), Answer::Declined, "a carry of an arg scan");
    assert_eq!(h.scan(arg, 0, None, &[&a, &b], &x), Answer::WrongDtype, "positions not i64");
    assert_eq!(h.scan(arg, 0, None, &[&a], &x), Answer::ShapeMismatch, "one destination of two");
    assert_eq!(h.scan(Reduction::Logsumexp, 0, None, &[&a, &b], &x), Answer::ShapeMismatch, "two of one");
    let small = Array::<i64>::zeros(DEV, &[3]).unwrap();
    assert_eq!(h.scan(arg, 0, None, &[&a, &small], &x), Answer::ShapeMismatch, "positions of another shape");
    let z = Array::<num_complex::Complex64>::zeros(DEV, &[4]).unwrap();
    let zd = Array::<num_complex::Complex64>::zeros(DEV, &[4]).unwrap();
    assert_eq!(h.scan(arg, 0, None, &[&zd, &p], &z), Answer::Declined, "complex extremes");
    assert_eq!(h.scan(Reduction::Logsumexp, 0, None, &[&zd], &z), Answer::WrongDtype, "complex lse");
    assert_eq!(
        h.scan(Reduction::Logsumexp, 0, Some(&Array::<f64>::zeros(DEV, &[]).unwrap()), &[&a], &x),
        Answer::WrongDtype
    );
}
