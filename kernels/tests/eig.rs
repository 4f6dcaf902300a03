//! The general eigendecomposition of the host library: matrices built here with known
//! eigenvalues (a real block-diagonal form of 2 × 2 rotation-scalings and reals, or a complex
//! upper-triangular one, conjugated by a Householder reflection written here), checked by the
//! values against the known ones, the residual a·v − v·diag(w), unit columns and exact
//! conjugate pairs; f32, f64, c64, c128, sizes 0 to 17, batches through strided layouts, the
//! same bits on 1, 2 and 8 threads, and the refusals.

use num_complex::{Complex32, Complex64};
use nx_kernels::{Answer, Array, Element, Host, Kernels, Move, Value};
use nx_mesh::Device;

mod common;
use common::val;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

type C = Complex64;

/// A test matrix (row-major n × n, complex f64) and its eigenvalues.
fn build(n: usize, salt: usize, complex: bool) -> (Vec<C>, Vec<C>) {
    let mut t = vec![C::new(0.0, 0.0); n * n];
    let mut eig = vec![];
    let mut j = 0;
    while j < n {
        if !complex && j + 1 < n && j % 3 == 0 {
            // [[α, β], [−β, α]]: α ± iβ
            let (al, be) = (1.0 + j as f64 + val(j, salt), 0.5 + val(j, salt + 1).abs());
            t[j * n + j] = C::new(al, 0.0);
            t[j * n + j + 1] = C::new(be, 0.0);
            t[(j + 1) * n + j] = C::new(-be, 0.0);
            t[(j + 1) * n + j + 1] = C::new(al, 0.0);
            eig.extend([C::new(al, be), C::new(al, -be)]);
            j += 2;
        } else {
            let l = if complex { C::new(j as f64 - 3.0, val(j, salt) * 2.0) } else { C::new(-(j as f64) - 0.5, 0.0) };
            t[j * n + j] = l;
            eig.push(l);
            j += 1;
        }
    }
    if complex {
        // a mild upper triangle: the eigenvalues stay the diagonal
        for i in 0..n {
            for c in i + 1..n {
                t[i * n + c] = C::new(val(i * n + c, salt + 2), val(i * n + c, salt + 3)) * 0.3;
            }
        }
    }
    // H = I − 2uuᴴ/(uᴴu): unitary and Hermitian, its own inverse; A = H·T·H
    let u: Vec<C> = (0..n).map(|i| C::new(val(i, salt + 4), if complex { val(i, salt + 5) } else { 0.0 })).collect();
    let uu: f64 = u.iter().map(|x| x.norm_sqr()).sum();
    let h = |i: usize, c: usize| -> C { C::new(if i == c { 1.0 } else { 0.0 }, 0.0) - u[i] * u[c].conj() * (2.0 / uu) };
    let mut ht = vec![C::new(0.0, 0.0); n * n];
    for i in 0..n {
        for c in 0..n {
            ht[i * n + c] = (0..n).map(|k| h(i, k) * t[k * n + c]).sum();
        }
    }
    let mut a = vec![C::new(0.0, 0.0); n * n];
    for i in 0..n {
        for c in 0..n {
            a[i * n + c] = (0..n).map(|k| ht[i * n + k] * h(k, c)).sum();
        }
    }
    (a, eig)
}

trait Num: Element {
    type Out: Element;
    const REAL: bool;
    const U: f64;
    fn of(c: C) -> Self;
}
impl Num for f32 {
    const REAL: bool = true;
    type Out = Complex32;
    const U: f64 = f32::EPSILON as f64 / 2.0;
    fn of(c: C) -> f32 {
        c.re as f32
    }
}
impl Num for f64 {
    const REAL: bool = true;
    type Out = Complex64;
    const U: f64 = f64::EPSILON / 2.0;
    fn of(c: C) -> f64 {
        c.re
    }
}
impl Num for Complex32 {
    const REAL: bool = false;
    type Out = Complex32;
    const U: f64 = f32::EPSILON as f64 / 2.0;
    fn of(c: C) -> Complex32 {
        Complex32::new(c.re as f32, c.im as f32)
    }
}
impl Num for Complex64 {
    const REAL: bool = false;
    type Out = Complex64;
    const U: f64 = f64::EPSILON / 2.0;
    fn of(c: C) -> Complex64 {
        c
    }
}

fn wide<T: Element>(x: T) -> C {
    match x.to_value() {
        Value::Complex(c) => c,
        Value::Float(f) => C::new(f, 0.0),
        v => panic!("{v:?}"),
    }
}

/// Runs eig on a batch of `batch` matrices of size n (stored transposed, read through a
/// permuted view) and checks every claim; returns the bits of w and v.
fn check<T: Num>(host: &Host, n: usize, batch: usize, complex: bool) -> Vec<u64> {
    let cases: Vec<(Vec<C>, Vec<C>)> = (0..batch).map(|b| build(n, 10 * b + n, complex)).collect();
    // stored [batch, col, row], viewed [batch, row, col]
    let stored = Array::<T>::from_fn(DEV, &[batch, n, n], |i| T::of(cases[i[0]].0[i[2] * n + i[1]])).unwrap();
    let a = stored.apply(&Move::Permute(vec![0, 2, 1])).unwrap().unwrap();
    let w = Array::<T::Out>::zeros(DEV, &[batch, n]).unwrap();
    let v = Array::<T::Out>::zeros(DEV, &[batch, n, n]).unwrap();
    assert_eq!(host.eig(&w, Some(&v), &a), Answer::Done);
    let w_only = Array::<T::Out>::zeros(DEV, &[batch, n]).unwrap();
    assert_eq!(host.eig(&w_only, None, &a), Answer::Done);
    let (wv, vv, wo) = (w.to_vec().unwrap(), v.to_vec().unwrap(), w_only.to_vec().unwrap());
    for (b, (am, known)) in cases.iter().enumerate() {
        // the matrix as the kernel read it (rounded into T)
        let ar: Vec<C> = am.iter().map(|&x| wide(T::of(x))).collect();
        let norm = ar.iter().map(|x| x.norm_sqr()).sum::<f64>().sqrt().max(1.0);
        let tol = 200.0 * (n as f64 + 1.0) * T::U * norm * if complex { 10.0 } else { 1.0 };
        for values in [&wv, &wo] {
            let got: Vec<C> = values[b * n..(b + 1) * n].iter().map(|&x| wide(x)).collect();
            let mut used = vec![false; n];
            for k in known {
                let (q, d) = (0..n)
                    .filter(|&q| !used[q])
                    .map(|q| (q, (got[q] - k).norm()))
                    .min_by(|x, y| x.1.total_cmp(&y.1))
                    .unwrap();
                assert!(d <= tol, "n {n} batch {b}: eigenvalue {k} nearest {} ({d} > {tol})", got[q]);
                used[q] = true;
            }
            if T::REAL {
                // a real matrix's pairs: exact conjugates, adjacent
                let mut j = 0;
                while j < n {
                    if got[j].im != 0.0 {
                        assert_eq!(got[j + 1], got[j].conj(), "pair at {j}");
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
            }
        }
        for j in 0..n {
            let wj = wide(wv[b * n + j]);
            let col: Vec<C> = (0..n).map(|i| wide(vv[(b * n + i) * n + j])).collect();
            let len = col.iter().map(|x| x.norm_sqr()).sum::<f64>().sqrt();
            assert!((len - 1.0).abs() <= 10.0 * n as f64 * T::U, "column {j}: norm {len}");
            let res: f64 = (0..n)
                .map(|i| ((0..n).map(|k| ar[i * n + k] * col[k]).sum::<C>() - col[i] * wj).norm_sqr())
                .sum::<f64>()
                .sqrt();
            assert!(res <= tol, "n {n} batch {b}: residual {res} of column {j} (> {tol})");
        }
    }
    let bits = |x: C| [x.re.to_bits(), x.im.to_bits()];
    wv.iter().chain(&vv).flat_map(|&x| bits(wide(x))).collect()
}

#[test]
fn real_and_complex_matrices_of_known_eigenvalues() {
    let host = Host::new();
    for n in [0, 1, 2, 3, 4, 5, 8, 17] {
        check::<f64>(&host, n, 1, false);
        check::<f32>(&host, n, 2, false);
        check::<Complex64>(&host, n, 1, true);
        check::<Complex32>(&host, n, 2, true);
    }
    // a complex matrix with real eigenvalue structure: a real matrix read as complex
    check::<Complex64>(&host, 6, 3, false);
}

#[test]
fn the_same_bits_on_1_2_and_8_threads() {
    let runs: Vec<(Vec<u64>, Vec<u64>)> = [1, 2, 8]
        .iter()
        .map(|&t| {
            let host = Host::with_threads(t).unwrap();
            (check::<f64>(&host, 40, 1, false), check::<Complex32>(&host, 9, 3, true))
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

#[test]
fn refusals() {
    let host = Host::new();
    let a = Array::<f64>::zeros(DEV, &[2, 3, 3]).unwrap();
    let w = Array::<Complex64>::zeros(DEV, &[2, 3]).unwrap();
    let v = Array::<Complex64>::zeros(DEV, &[2, 3, 3]).unwrap();
    assert_eq!(host.eig(&w, Some(&v), &a), Answer::Done);
    // real values for a real matrix; vectors of the other precision; an integer matrix
    let wr = Array::<f64>::zeros(DEV, &[2, 3]).unwrap();
    assert_eq!(host.eig(&wr, None, &a), Answer::WrongDtype);
    let v64 = Array::<Complex32>::zeros(DEV, &[2, 3, 3]).unwrap();
    assert_eq!(host.eig(&w, Some(&v64), &a), Answer::WrongDtype);
    let ai = Array::<i32>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.eig(&Array::<Complex64>::zeros(DEV, &[3]).unwrap(), None, &ai), Answer::WrongDtype);
    // not square; values or vectors of the wrong shape; rank 1
    let rect = Array::<f64>::zeros(DEV, &[2, 3, 4]).unwrap();
    assert_eq!(host.eig(&w, None, &rect), Answer::ShapeMismatch);
    let w4 = Array::<Complex64>::zeros(DEV, &[2, 4]).unwrap();
    assert_eq!(host.eig(&w4, None, &a), Answer::ShapeMismatch);
    let v2 = Array::<Complex64>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.eig(&w, Some(&v2), &a), Answer::ShapeMismatch);
    let r1 = Array::<f64>::zeros(DEV, &[3]).unwrap();
    assert_eq!(host.eig(&w, None, &r1), Answer::ShapeMismatch);
    // NaNs where the iteration cannot run: a matrix of infinities
    let bad = Array::<f64>::from_fn(DEV, &[2, 2], |_| f64::INFINITY).unwrap();
    let wb = Array::<Complex64>::zeros(DEV, &[2]).unwrap();
    assert_eq!(host.eig(&wb, None, &bad), Answer::Done);
    assert!(wb.to_vec().unwrap().iter().all(|x| x.re.is_nan() || x.im.is_nan() || !x.re.is_finite()));
}
