//! The indexing, sort, fold and attention families on what their own suites leave out, each
//! against a reference written here: sorts of 8-byte keys (f64, i64, u64) and of f16, by radix
//! and by top-k selection; special values (NaN, ±∞, −0) in scans, scatters, folds and visible
//! attention operands; broadcast operands and rank 0; refusals (a scatter's `Set` out of range,
//! a negative range start, f64 operands on an f32 accumulator, a negative length); and the same
//! bits on 1, 2 and 8 threads for gathers, `Set` scatters, float sorts, folds, pads, assemblies
//! and paged attention.

use half::f16;
use nx_kernels::{
    Answer, Array, Attention, Dtype, Element, Host, Kernels, Kv, Move, Operand, Pad, Reduction, Scatter, Windows,
};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn hosts() -> [Host; 3] {
    [Host::with_threads(1).unwrap(), Host::with_threads(2).unwrap(), Host::with_threads(8).unwrap()]
}

/// A deterministic scramble of `k`.
fn mix(k: u64) -> u64 {
    let mut z = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The reference's order of floats: NaNs greatest (all alike), −0 below +0, by value otherwise.
fn float_order(a: f64, b: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Equal,
        (true, false) => Greater,
        (false, true) => Less,
        _ if a == b => a.is_sign_positive().cmp(&b.is_sign_positive()),
        _ => a.partial_cmp(&b).unwrap(),
    }
}

/// Sorts one lane of `n` keys (positions by a stable sort of the reference's order, written
/// here) on 1, 2 and 8 threads, whole and as a top-k, against the naive order; answers nothing,
/// asserts.
fn check_sort<T: Element + PartialEq + std::fmt::Debug>(xs: &[T], order: impl Fn(&T, &T) -> std::cmp::Ordering) {
    let n = xs.len();
    let src = Array::from_vec(DEV, &[n], xs.to_vec()).unwrap();
    for descending in [false, true] {
        let mut want: Vec<usize> = (0..n).collect();
        want.sort_by(|&a, &b| if descending { order(&xs[b], &xs[a]) } else { order(&xs[a], &xs[b]) });
        for k in [n, n / 20, 1] {
            // every thread count: the stable order's positions, and values equal to their keys
            // in the reference's order (a NaN equals a NaN there)
            for (t, h) in hosts().iter().enumerate() {
                let (v, p) = (Array::<T>::zeros(DEV, &[k]).unwrap(), Array::<i64>::zeros(DEV, &[k]).unwrap());
                assert_eq!(h.sort(0, descending, Some(&v), Some(&p), &src), Answer::Done);
                for (j, (&pos, val)) in p.to_vec().unwrap().iter().zip(&v.to_vec().unwrap()).enumerate() {
                    let what = format!("{}: {k} of {n}, descending {descending}, host {t}, at {j}", T::DTYPE);
                    assert_eq!(pos as usize, want[j], "{what}");
                    assert_eq!(order(val, &xs[want[j]]), std::cmp::Ordering::Equal, "{what}");
                }
            }
        }
    }
}

#[test]
fn sorts_of_eight_byte_keys_and_halves_by_radix_and_selection() {
    let n = 5000;
    let f: Vec<f64> = (0..n as u64)
        .map(|k| match mix(k) % 23 {
            0 => f64::NAN,
            1 => -0.0,
            2 => 0.0,
            3 => f64::INFINITY,
            4 => f64::NEG_INFINITY,
            5 => f64::from_bits(1), // the least subnormal
            r => ((mix(k + 1) % 200) as f64 - 100.0) * 1e-3 * r as f64,
        })
        .collect();
    check_sort(&f, |a, b| float_order(*a, *b));
    let i: Vec<i64> =
        (0..n as u64).map(|k| if k % 97 == 0 { i64::MIN } else { (mix(k) % 1000) as i64 - 500 }).collect();
    check_sort(&i, |a, b| a.cmp(b));
    let u: Vec<u64> = (0..n as u64).map(|k| if k % 89 == 0 { u64::MAX } else { mix(k) % 700 }).collect();
    check_sort(&u, |a, b| a.cmp(b));
    let h: Vec<f16> = f.iter().map(|&x| f16::from_f64(x)).collect();
    check_sort(&h, |a, b| float_order(a.to_f64(), b.to_f64()));
}

#[test]
fn special_values_in_scans_scatters_and_folds() {
    let h = Host::new();
    let (inf, ninf, nan) = (f32::INFINITY, f32::NEG_INFINITY, f32::NAN);
    // a Sum scan: +∞ then −∞ make NaN from there on; a Max scan keeps +∞; a Min scan puts −0 below +0
    let x = Array::from_vec(DEV, &[5], vec![1.0f32, inf, 2.0, ninf, 3.0]).unwrap();
    let d = Array::<f32>::zeros(DEV, &[5]).unwrap();
    assert_eq!(h.scan(Reduction::Sum, 0, None, &[&d], &x), Answer::Done);
    let s = d.to_vec().unwrap();
    assert_eq!(&s[..3], &[1.0, inf, inf]);
    assert!(s[3].is_nan() && s[4].is_nan());
    assert_eq!(h.scan(Reduction::Max, 0, None, &[&d], &x), Answer::Done);
    assert_eq!(d.to_vec().unwrap(), [1.0, inf, inf, inf, inf]);
    let z = Array::from_vec(DEV, &[3], vec![0.0f32, -0.0, 0.0]).unwrap();
    let dz = Array::<f32>::zeros(DEV, &[3]).unwrap();
    assert_eq!(h.scan(Reduction::Min, 0, None, &[&dz], &z), Answer::Done);
    assert_eq!(dz.to_vec().unwrap().iter().map(|v| v.is_sign_negative()).collect::<Vec<_>>(), [false, true, true]);
    // scatters: Add of −0 onto nothing is +0 (a sum from +0), onto −0 stays −0; Set copies bits
    // (−0, a NaN payload); ±∞ added make NaN
    let into = Array::from_vec(DEV, &[4], vec![0.0f32, -0.0, 1.0, 5.0]).unwrap();
    let vals = Array::from_vec(DEV, &[5], vec![-0.0f32, -0.0, inf, ninf, f32::from_bits(0x7fc0_1234)]).unwrap();
    let idx = Array::from_vec(DEV, &[5], vec![0i64, 1, 2, 2, 3]).unwrap();
    let d = Array::<f32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(h.scatter(Scatter::Add, 0, &d, Some(&into), &vals, &idx), Answer::Done);
    let a = d.to_vec().unwrap();
    assert_eq!((a[0].to_bits(), a[1].to_bits()), (0.0f32.to_bits(), (-0.0f32).to_bits()));
    assert!(a[2].is_nan() && a[3].is_nan());
    let fresh = Array::<f32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(h.scatter(Scatter::Add, 0, &fresh, None, &vals, &idx), Answer::Done);
    assert_eq!(fresh.to_vec().unwrap()[0].to_bits(), 0, "+0 + −0 is +0");
    assert_eq!(h.scatter(Scatter::Set, 0, &d, Some(&into), &vals, &idx), Answer::Done);
    let st = d.to_vec().unwrap();
    assert_eq!(
        (st[0].to_bits(), st[1].to_bits(), st[2], st[3].to_bits()),
        ((-0.0f32).to_bits(), (-0.0f32).to_bits(), ninf, 0x7fc0_1234)
    );
    // folds: a window's Max with a NaN is NaN, a Sum of ±∞ is NaN, a Min of ±0 is −0, a Max of
    // −0 alone is −0
    // windows [1, NaN], [+∞, −∞], [+0, −0], [−0, −0]
    let x = Array::from_vec(DEV, &[8], vec![1.0f32, nan, inf, ninf, 0.0, -0.0, -0.0, -0.0]).unwrap();
    let win = Windows::new(&[2], &[2]);
    let d = Array::<f32>::zeros(DEV, &[4]).unwrap();
    let none = Pad::none(1);
    type Check = fn(&[f32]) -> bool;
    let checks: [(Reduction, Check); 3] = [
        (Reduction::Max, |v| {
            v[0].is_nan() && v[1] == f32::INFINITY && v[2].to_bits() == 0 && v[3].to_bits() == 0x8000_0000
        }),
        (Reduction::Sum, |v| v[0].is_nan() && v[1].is_nan() && v[2].to_bits() == 0 && v[3].to_bits() == 0),
        (Reduction::Min, |v| {
            v[0].is_nan() && v[1] == f32::NEG_INFINITY && v[2].to_bits() == 0x8000_0000 && v[3].to_bits() == 0x8000_0000
        }),
    ];
    for (r, check) in checks {
        assert_eq!(h.fold(r, &none, nx_kernels::Value::Float(0.0), &win, &d, &x), Answer::Done);
        assert!(check(&d.to_vec().unwrap()), "{r:?}: {:?}", d.to_vec().unwrap());
    }
}

/// `xs` of `shape` as a view whose axis 0 is broadcast from extent 1 (`xs` holds one slice).
fn broadcast<T: Element>(shape: &[usize], xs: &[T]) -> Array<T> {
    let mut one = shape.to_vec();
    one[0] = 1;
    Array::from_vec(DEV, &one, xs.to_vec()).unwrap().apply(&Move::Expand(shape.to_vec())).unwrap().unwrap()
}

#[test]
fn broadcast_operands_and_rank_zero() {
    let h = Host::new();
    // a gather from a table broadcast along its rows: every row reads the one row
    let t = broadcast(&[6, 3], &[1.0f32, 2.0, 3.0]);
    let idx = Array::from_vec(DEV, &[4], vec![5i64, 0, 3, 3]).unwrap();
    let d = Array::<f32>::zeros(DEV, &[4, 3]).unwrap();
    assert_eq!(h.gather(0, &d, &t, &idx), Answer::Done);
    assert_eq!(d.to_vec().unwrap(), [1.0, 2.0, 3.0].repeat(4));
    // a gather by a rank-0 index: the axis disappears
    let i0 = Array::from_vec(DEV, &[], vec![2i64]).unwrap();
    let row = Array::<f32>::zeros(DEV, &[3]).unwrap();
    let table = Array::from_fn(DEV, &[4, 3], |i| (i[0] * 10 + i[1]) as f32).unwrap();
    assert_eq!(h.gather(0, &row, &table, &i0), Answer::Done);
    assert_eq!(row.to_vec().unwrap(), [20.0, 21.0, 22.0]);
    // a sort of lanes broadcast along axis 0: every lane sorted alike, positions along axis 1
    let s = broadcast(&[3, 4], &[3.0f32, -1.0, 2.0, -1.0]);
    let (v, p) = (Array::<f32>::zeros(DEV, &[3, 4]).unwrap(), Array::<i64>::zeros(DEV, &[3, 4]).unwrap());
    assert_eq!(h.sort(1, false, Some(&v), Some(&p), &s), Answer::Done);
    assert_eq!(v.to_vec().unwrap(), [-1.0, -1.0, 2.0, 3.0].repeat(3));
    assert_eq!(p.to_vec().unwrap(), [1i64, 3, 2, 0].repeat(3));
    // a sum fold of a broadcast operand, and of rank 0 (no axis: the element itself)
    let b = broadcast(&[4, 5], &[1.0f32, 2.0, 3.0, 4.0, 5.0]);
    let d = Array::<f32>::zeros(DEV, &[2, 2]).unwrap();
    let win = Windows::new(&[2, 3], &[2, 2]);
    assert_eq!(h.fold(Reduction::Sum, &Pad::none(2), nx_kernels::Value::Float(0.0), &win, &d, &b), Answer::Done);
    assert_eq!(d.to_vec().unwrap(), [12.0, 24.0, 12.0, 24.0]);
    let x0 = Array::from_vec(DEV, &[], vec![7.5f32]).unwrap();
    let d0 = Array::<f32>::zeros(DEV, &[]).unwrap();
    let w0 = Windows::new(&[], &[]);
    assert_eq!(h.fold(Reduction::Max, &Pad::none(0), nx_kernels::Value::Float(0.0), &w0, &d0, &x0), Answer::Done);
    assert_eq!(d0.to_vec().unwrap(), [7.5]);
    assert_eq!(h.pad(&Pad::none(0), nx_kernels::Value::Float(0.0), &d0, &x0), Answer::Done);
    // attention over keys and values broadcast along the heads (one key head's rows read by every
    // head), against the same keys laid out in full
    let (hk, tk, dk) = (3, 5, 2);
    let q = Array::from_fn(DEV, &[1, 3, 2, dk], |i| ((i[1] * 7 + i[2] * 3 + i[3]) % 5) as f32 * 0.25).unwrap();
    let kone: Vec<f32> = (0..tk * dk).map(|k| (k % 4) as f32 * 0.5 - 0.75).collect();
    let vone: Vec<f32> = (0..tk * dk).map(|k| (k % 3) as f32).collect();
    let expand = |xs: &[f32]| {
        Array::from_vec(DEV, &[1, 1, tk, dk], xs.to_vec())
            .unwrap()
            .apply(&Move::Expand(vec![1, hk, tk, dk]))
            .unwrap()
            .unwrap()
    };
    let full = |xs: &[f32]| Array::from_vec(DEV, &[1, hk, tk, dk], xs.repeat(hk)).unwrap();
    let spec = Attention { scale: 0.5, causal: None, acc: Dtype::F32 };
    let mut outs = Vec::new();
    for (k, v) in [(expand(&kone), expand(&vone)), (full(&kone), full(&vone))] {
        let (o, l) = (Array::<f32>::zeros(DEV, &[1, 3, 2, dk]).unwrap(), Array::<f32>::zeros(DEV, &[1, 3, 2]).unwrap());
        assert_eq!(h.attention(&spec, &o, &l, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Done);
        outs.push((o.to_vec().unwrap(), l.to_vec().unwrap()));
    }
    assert_eq!(outs[0], outs[1], "broadcast keys read as the full ones");
}

#[test]
fn special_values_in_visible_attention_operands() {
    // one head, 2 query rows, 3 keys: a NaN in query row 1 makes that row's o and lse NaN and
    // leaves row 0 alone; a NaN in a visible value reaches o's column; a key of +∞ against a
    // positive query overflows the score (the row is NaN); a −∞ score weighs 0
    let h = Host::new();
    let spec = Attention { scale: 1.0, causal: None, acc: Dtype::F32 };
    let run = |q: Vec<f32>, k: Vec<f32>, v: Vec<f32>| {
        let (q, k, v) = (
            Array::from_vec(DEV, &[1, 2, 1], q).unwrap(),
            Array::from_vec(DEV, &[1, 3, 1], k).unwrap(),
            Array::from_vec(DEV, &[1, 3, 2], v).unwrap(),
        );
        let (o, l) = (Array::<f32>::zeros(DEV, &[1, 2, 2]).unwrap(), Array::<f32>::zeros(DEV, &[1, 2]).unwrap());
        assert_eq!(h.attention(&spec, &o, &l, &q, Kv::Dense { k: &k, v: &v }, None), Answer::Done);
        (o.to_vec().unwrap(), l.to_vec().unwrap())
    };
    let v = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let (o, l) = run(vec![1.0, f32::NAN], vec![0.0, 0.0, 0.0], v.clone());
    assert_eq!(o[..2], [3.0, 4.0]);
    assert!((l[0] - 3f32.ln()).abs() < 1e-6);
    assert!(o[2].is_nan() && o[3].is_nan() && l[1].is_nan());
    let (o, l) = run(vec![1.0, 1.0], vec![0.0, 0.0, 0.0], vec![1.0, f32::NAN, 3.0, 4.0, 5.0, 6.0]);
    assert!(o[0] == 3.0 && o[1].is_nan() && o[2] == 3.0 && o[3].is_nan() && l.iter().all(|x| x.is_finite()));
    let (o, l) = run(vec![1.0, -1.0], vec![f32::INFINITY, 0.0, 0.0], v.clone());
    assert!(o[0].is_nan() && l[0].is_nan(), "a score of +∞ overflows its row");
    // row 1 scores −∞ at key 0: weight 0, the others share the row
    assert_eq!((o[2], o[3]), (4.0, 5.0));
    assert!((l[1] - 2f32.ln()).abs() < 1e-6);
}

#[test]
fn refusals_of_the_families() {
    let h = Host::new();
    let x = Array::from_fn(DEV, &[4, 2], |i| (i[0] * 2 + i[1]) as f32).unwrap();
    let d = Array::<f32>::zeros(DEV, &[4, 2]).unwrap();
    let src = Array::<f32>::zeros(DEV, &[2, 2]).unwrap();
    for bad in [-1i64, 4] {
        let idx = Array::from_vec(DEV, &[2], vec![0, bad]).unwrap();
        assert_eq!(h.scatter(Scatter::Set, 0, &d, Some(&x), &src, &idx), Answer::IndexOutOfRange, "Set at {bad}");
    }
    assert_eq!(d.to_vec().unwrap(), [0.0; 8], "refused before any write");
    let starts = Array::from_vec(DEV, &[1], vec![-1i64]).unwrap();
    let r = Array::<f32>::zeros(DEV, &[1, 2, 2]).unwrap();
    assert_eq!(h.range_gather(0, 2, &r, &x, &starts), Answer::IndexOutOfRange, "a negative start");
    // f64 operands on an f32 accumulator; a negative length
    let q = Array::<f64>::zeros(DEV, &[1, 2, 2]).unwrap();
    let (o, l) = (Array::<f64>::zeros(DEV, &[1, 2, 2]).unwrap(), Array::<f32>::zeros(DEV, &[1, 2]).unwrap());
    let spec = Attention { scale: 1.0, causal: None, acc: Dtype::F32 };
    assert_eq!(h.attention(&spec, &o, &l, &q, Kv::Dense { k: &q, v: &q }, None), Answer::WrongDtype);
    let q = Array::<f32>::zeros(DEV, &[2, 1, 2, 2]).unwrap();
    let (o, l) = (Array::<f32>::zeros(DEV, &[2, 1, 2, 2]).unwrap(), Array::<f32>::zeros(DEV, &[2, 1, 2]).unwrap());
    let len = Array::from_vec(DEV, &[2], vec![1i64, -1]).unwrap();
    assert_eq!(h.attention(&spec, &o, &l, &q, Kv::Dense { k: &q, v: &q }, Some(&len)), Answer::IndexOutOfRange);
}

/// Runs `f` on 1, 2 and 8 threads and asserts the same results.
fn same_on_every_count<R: PartialEq + std::fmt::Debug>(what: &str, f: impl Fn(&Host) -> R) {
    let runs: Vec<R> = hosts().iter().map(f).collect();
    assert_eq!(runs[0], runs[1], "{what}: 1 and 2 threads");
    assert_eq!(runs[0], runs[2], "{what}: 1 and 8 threads");
}

#[test]
fn every_family_gives_one_set_of_bits_on_any_thread_count() {
    let n = 20_000;
    let xs: Vec<f32> = (0..n as u64).map(|k| ((mix(k) % 10_000) as f32 - 5000.0) * 1e-3).collect();
    let x = Array::from_vec(DEV, &[n / 8, 8], xs.clone()).unwrap();
    let idx = Array::from_vec(DEV, &[3000], (0..3000u64).map(|k| (mix(k) % (n as u64 / 8)) as i64).collect()).unwrap();
    same_on_every_count("gather", |h| {
        let d = Array::<f32>::zeros(DEV, &[3000, 8]).unwrap();
        assert_eq!(h.gather(0, &d, &x, &idx), Answer::Done);
        d.to_vec().unwrap()
    });
    let src = Array::from_fn(DEV, &[3000, 8], |i| (i[0] * 8 + i[1]) as f32).unwrap();
    same_on_every_count("scatter Set", |h| {
        let d = Array::<f32>::zeros(DEV, &[n / 8, 8]).unwrap();
        assert_eq!(h.scatter(Scatter::Set, 0, &d, Some(&x), &src, &idx), Answer::Done);
        d.to_vec().unwrap()
    });
    let flat = Array::from_vec(DEV, &[n], xs.clone()).unwrap();
    same_on_every_count("float sort", |h| {
        let (v, p) = (Array::<f32>::zeros(DEV, &[n]).unwrap(), Array::<i64>::zeros(DEV, &[n]).unwrap());
        assert_eq!(h.sort(0, true, Some(&v), Some(&p), &flat), Answer::Done);
        (v.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(), p.to_vec().unwrap())
    });
    let img = Array::from_vec(DEV, &[100, 200], xs.clone()).unwrap();
    let pad = Pad { lo: vec![1, -1], hi: vec![2, 0], interior: vec![0, 1] };
    let win = Windows { size: vec![3, 4], stride: vec![2, 3], dilation: vec![1, 2] };
    let out = win.shape(&pad.shape(&[100, 200]).unwrap()).unwrap();
    same_on_every_count("sum fold", |h| {
        let d = Array::<f32>::zeros(DEV, &out).unwrap();
        assert_eq!(h.fold(Reduction::Sum, &pad, nx_kernels::Value::Float(0.5), &win, &d, &img), Answer::Done);
        d.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    });
    let padded = pad.shape(&[100, 200]).unwrap();
    same_on_every_count("pad", |h| {
        let d = Array::<f32>::zeros(DEV, &padded).unwrap();
        assert_eq!(h.pad(&pad, nx_kernels::Value::Float(-2.0), &d, &img), Answer::Done);
        d.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    });
    let a = Array::from_fn(DEV, &[50, 30], |i| (i[0] * 30 + i[1]) as f32).unwrap();
    let b = Array::from_fn(DEV, &[20, 30], |i| -((i[0] * 30 + i[1]) as f32)).unwrap();
    same_on_every_count("assemble", |h| {
        let d = Array::<f32>::zeros(DEV, &[60, 30]).unwrap();
        let pieces: [(&[usize], &dyn Operand); 2] = [(&[0, 0], &a), (&[40, 0], &b)];
        assert_eq!(h.assemble(&d, &pieces), Answer::Done);
        d.to_vec().unwrap()
    });
    // paged attention: 2 leads, 8 pages of 16 keys, tables with holes, lengths, causal
    let (pages, page, hk, hq, tq, dk) = (8, 16, 2, 4, 40, 8);
    let kp = Array::from_fn(DEV, &[pages, hk, page, dk], |i| {
        ((mix((i[0] * 512 + i[1] * 128 + i[2] * 8 + i[3]) as u64) % 1000) as f32 - 500.0) * 1e-3
    })
    .unwrap();
    let vp = Array::from_fn(DEV, &[pages, hk, page, dk], |i| {
        ((mix((i[0] * 777 + i[1] * 99 + i[2] * 8 + i[3]) as u64) % 1000) as f32) * 1e-3
    })
    .unwrap();
    let table = Array::from_vec(DEV, &[2, 4], vec![3i64, -1, 0, 7, 5, 2, 9, 1]).unwrap();
    let lens = Array::from_vec(DEV, &[2], vec![60i64, 64]).unwrap();
    let q =
        Array::from_fn(DEV, &[2, hq, tq, dk], |i| (((i[1] * 40 + i[2]) * 8 + i[3]) % 13) as f32 * 0.1 - 0.6).unwrap();
    let spec = Attention { scale: 0.35, causal: Some(24), acc: Dtype::F32 };
    same_on_every_count("paged attention", |h| {
        let (o, l) =
            (Array::<f32>::zeros(DEV, &[2, hq, tq, dk]).unwrap(), Array::<f32>::zeros(DEV, &[2, hq, tq]).unwrap());
        let kv = Kv::Paged { k: &kp, v: &vp, table: &table };
        assert_eq!(h.attention(&spec, &o, &l, &q, kv, Some(&lens)), Answer::Done);
        (
            o.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            l.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        )
    });
}
