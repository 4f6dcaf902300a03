//! Matrix routines of the host library (Cholesky, triangular and general solves) against naive
//! f64 factorizations and substitutions written here and within the stated backward-error
//! bounds: f32, f64, c64 and c128, sizes 0 to past faer's blocks, batches, strided inputs, the
//! triangle never read filled with NaNs, matrices that are not positive definite or singular,
//! the same bits on 1, 2 and 8 threads, and the refusals.

use half::f16;
use num_complex::{Complex32, Complex64};
use nx_kernels::{Answer, Array, Element, Host, Kernels, Move};
use nx_mesh::Device;

mod common;
use common::val;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

type C = Complex64;

/// A dtype under test, to and from complex f64, with its unit roundoff.
trait Num: Element + Copy {
    /// The real type of the parts.
    type Real: Num;
    const COMPLEX: bool;
    const U: f64;
    fn of(c: C) -> Self;
    fn wide(self) -> C;
}
impl Num for f32 {
    type Real = f32;
    const COMPLEX: bool = false;
    const U: f64 = f32::EPSILON as f64 / 2.0;
    fn of(c: C) -> f32 {
        c.re as f32
    }
    fn wide(self) -> C {
        C::new(f64::from(self), 0.0)
    }
}
impl Num for f64 {
    type Real = f64;
    const COMPLEX: bool = false;
    const U: f64 = f64::EPSILON / 2.0;
    fn of(c: C) -> f64 {
        c.re
    }
    fn wide(self) -> C {
        C::new(self, 0.0)
    }
}
impl Num for Complex32 {
    type Real = f32;
    const COMPLEX: bool = true;
    const U: f64 = f32::EPSILON as f64 / 2.0;
    fn of(c: C) -> Complex32 {
        Complex32::new(c.re as f32, c.im as f32)
    }
    fn wide(self) -> C {
        C::new(f64::from(self.re), f64::from(self.im))
    }
}
impl Num for Complex64 {
    type Real = f64;
    const COMPLEX: bool = true;
    const U: f64 = f64::EPSILON / 2.0;
    fn of(c: C) -> C {
        c
    }
    fn wide(self) -> C {
        self
    }
}

fn gamma(k: usize, u: f64) -> f64 {
    k as f64 * u / (1.0 - k as f64 * u)
}

/// `count` Hermitian positive definite n × n matrices `M·Mᴴ + n·I`, C order, in f64.
fn spd(count: usize, n: usize, complex: bool, salt: usize) -> Vec<C> {
    let mut out = Vec::with_capacity(count * n * n);
    for b in 0..count {
        let m: Vec<C> = (0..n * n)
            .map(|k| C::new(val(k + b * 977, salt), if complex { val(k + b * 977, salt + 1) } else { 0.0 }))
            .collect();
        for i in 0..n {
            for j in 0..n {
                let s: C = (0..n).map(|k| m[i * n + k] * m[j * n + k].conj()).sum();
                out.push(if i == j { s + n as f64 } else { s });
            }
        }
    }
    out
}

/// The naive Cholesky factor of an n × n Hermitian positive definite matrix (its lower triangle).
fn naive_cholesky(a: &[C], n: usize) -> Vec<C> {
    let mut l = vec![C::new(0.0, 0.0); n * n];
    for j in 0..n {
        let d: f64 = a[j * n + j].re - (0..j).map(|k| l[j * n + k].norm_sqr()).sum::<f64>();
        l[j * n + j] = C::new(d.sqrt(), 0.0);
        for i in j + 1..n {
            let s: C = a[i * n + j] - (0..j).map(|k| l[i * n + k] * l[j * n + k].conj()).sum::<C>();
            l[i * n + j] = s / l[j * n + j].re;
        }
    }
    l
}

fn arr<T: Num>(shape: &[usize], xs: &[C]) -> Array<T> {
    Array::from_vec(DEV, shape, xs.iter().map(|&c| T::of(c)).collect()).unwrap()
}

fn wide<T: Num>(a: &Array<T>) -> Vec<C> {
    a.to_vec().unwrap().into_iter().map(Num::wide).collect()
}

fn cholesky_case<T: Num>(host: &Host, batch: usize, n: usize) {
    let what = format!("{} batch {batch}, n {n}", std::any::type_name::<T>());
    let a = spd(batch, n, T::COMPLEX, n);
    // the upper triangle, never read, holds NaNs
    let stored: Vec<C> = (0..batch * n * n)
        .map(|k| if (k % (n * n)) % n > (k % (n * n)) / n { C::new(f64::NAN, 0.0) } else { a[k] })
        .collect();
    let x = arr::<T>(&[batch, n, n], &stored);
    let l = Array::<T>::zeros(DEV, &[batch, n, n]).unwrap();
    assert_eq!(host.cholesky(&l, &x), Answer::Done, "{what}");
    let got = wide(&l);
    let read: Vec<C> = wide(&x);
    for b in 0..batch {
        // the reference factors the values the kernel read (the lower triangle, mirrored)
        let mut ab = vec![C::new(0.0, 0.0); n * n];
        for i in 0..n {
            for j in 0..=i {
                ab[i * n + j] = read[b * n * n + i * n + j];
                ab[j * n + i] = read[b * n * n + i * n + j].conj();
            }
        }
        let want = naive_cholesky(&ab, n);
        let g = &got[b * n * n..(b + 1) * n * n];
        let lmax = want.iter().map(|c| c.norm()).fold(0.0, f64::max);
        for k in 0..n * n {
            let (i, j) = (k / n, k % n);
            if i < j {
                assert_eq!(g[k], C::new(0.0, 0.0), "{what}: ({i}, {j}) above the diagonal");
                continue;
            }
            let eps = 8.0 * n as f64 * T::U * lmax.max(1.0);
            assert!((g[k] - want[k]).norm() <= eps, "{what}: l({i}, {j}) = {} against {}", g[k], want[k]);
        }
        // the stated backward error: |a − l·lᴴ| ≤ 2·γ(n + 1)·|l|·|lᴴ| elementwise
        for i in 0..n {
            for j in 0..n {
                let (mut s, mut m) = (C::new(0.0, 0.0), 0.0);
                for k in 0..n {
                    s += g[i * n + k] * g[j * n + k].conj();
                    m += g[i * n + k].norm() * g[j * n + k].norm();
                }
                let r = (ab[i * n + j] - s).norm();
                let bound = 2.0 * gamma(n + 1, T::U) * m;
                assert!(r <= bound + 1e-300, "{what}: residual {r} at ({i}, {j}), bound {bound}");
            }
        }
    }
}

#[test]
fn cholesky_factors_match_the_naive_factor_within_the_backward_error_bound() {
    let host = Host::new();
    for (batch, n) in [(1, 0), (3, 1), (2, 2), (4, 5), (2, 17), (1, 64), (1, 130)] {
        cholesky_case::<f32>(&host, batch, n);
        cholesky_case::<f64>(&host, batch, n);
        cholesky_case::<Complex32>(&host, batch, n);
        cholesky_case::<Complex64>(&host, batch, n);
    }
}

#[test]
fn cholesky_of_strided_inputs_non_definite_matrices_and_thread_counts() {
    let host = Host::new();
    // a transposed view: the factor of what the view reads (the transpose of a symmetric matrix
    // is itself: the same factor as the stored one)
    let n = 9;
    let a = spd(1, n, false, 3);
    let stored = arr::<f64>(&[n, n], &a);
    let view = stored.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    let (l1, l2) = (Array::<f64>::zeros(DEV, &[n, n]).unwrap(), Array::<f64>::zeros(DEV, &[n, n]).unwrap());
    assert_eq!(host.cholesky(&l1, &stored), Answer::Done);
    assert_eq!(host.cholesky(&l2, &view), Answer::Done);
    let want = naive_cholesky(&a, n);
    for (k, (x, w)) in wide(&l2).iter().zip(&want).enumerate() {
        assert!((x - w).norm() < 1e-12, "transposed view at {k}: {x} against {w}");
    }
    // a batch with one matrix that is not positive definite: its factor is NaN, the others not
    let mut b = spd(3, 4, false, 5);
    b[16 + 5] = C::new(-50.0, 0.0); // matrix 1, element (1, 1)
    let x = arr::<f64>(&[3, 4, 4], &b);
    let l = Array::<f64>::zeros(DEV, &[3, 4, 4]).unwrap();
    assert_eq!(host.cholesky(&l, &x), Answer::Done);
    let got = l.to_vec().unwrap();
    assert!(got[16..32].iter().all(|v| v.is_nan()), "{:?}", &got[16..32]);
    assert!(got[..16].iter().chain(&got[32..]).all(|v| v.is_finite()));
    // a NaN on the diagonal: not positive definite
    let mut c = spd(1, 3, false, 6);
    c[4] = C::new(f64::NAN, 0.0);
    let l = Array::<f64>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.cholesky(&l, &arr::<f64>(&[3, 3], &c)), Answer::Done);
    assert!(l.to_vec().unwrap().iter().all(|v| v.is_nan()));
    // the same bits on 1, 2 and 8 threads: a batch, and one matrix past faer's blocks
    for (batch, n) in [(6, 40), (1, 300)] {
        let x = arr::<f32>(&[batch, n, n], &spd(batch, n, false, 7));
        let run = |t: usize| {
            let l = Array::<f32>::zeros(DEV, &[batch, n, n]).unwrap();
            assert_eq!(Host::with_threads(t).unwrap().cholesky(&l, &x), Answer::Done);
            l.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(run(2), one, "batch {batch}, n {n}: 2 threads");
        assert_eq!(run(8), one, "batch {batch}, n {n}: 8 threads");
    }
}

/// Naive substitution for a triangular n × n `t` (C order) and n × k `b` in complex f64.
fn naive_triangular(t: &[C], b: &[C], n: usize, k: usize, lower: bool, unit: bool) -> Vec<C> {
    let mut x = b.to_vec();
    let rows: Vec<usize> = if lower { (0..n).collect() } else { (0..n).rev().collect() };
    for &i in &rows {
        for c in 0..k {
            let mut s = b[i * k + c];
            for j in 0..n {
                let before = if lower { j < i } else { j > i };
                if before {
                    s -= t[i * n + j] * x[j * k + c];
                }
            }
            x[i * k + c] = if unit { s } else { s / t[i * n + i] };
        }
    }
    x
}

fn triangular_case<T: Num>(host: &Host, batch: usize, n: usize, k: usize) {
    for (lower, unit) in [(true, false), (true, true), (false, false), (false, true)] {
        let what = format!("{} batch {batch}, n {n}, k {k}, lower {lower}, unit {unit}", std::any::type_name::<T>());
        // the triangle used: well conditioned (a diagonal of 2 + |…|); the other triangle, and
        // with `unit` the diagonal, NaN: never read
        let t: Vec<C> = (0..batch * n * n)
            .map(|q| {
                let (i, j) = ((q % (n * n)) / n, q % n);
                let used = if lower { j < i } else { j > i };
                let z = C::new(val(q, 2) * 0.5, if T::COMPLEX { val(q, 3) * 0.5 } else { 0.0 });
                if used {
                    z
                } else if i == j && !unit {
                    z + 2.0 + z.norm()
                } else {
                    C::new(f64::NAN, f64::NAN)
                }
            })
            .collect();
        let b: Vec<C> =
            (0..batch * n * k).map(|q| C::new(val(q, 4), if T::COMPLEX { val(q, 5) } else { 0.0 })).collect();
        let (ta, ba) = (arr::<T>(&[batch, n, n], &t), arr::<T>(&[batch, n, k], &b));
        let x = Array::<T>::zeros(DEV, &[batch, n, k]).unwrap();
        assert_eq!(host.solve_triangular(lower, unit, &x, &ta, &ba), Answer::Done, "{what}");
        let got = wide(&x);
        let (tr, br) = (wide(&ta), wide(&ba));
        for m in 0..batch {
            let want =
                naive_triangular(&tr[m * n * n..(m + 1) * n * n], &br[m * n * k..(m + 1) * n * k], n, k, lower, unit);
            // (t + Δt)·x = b with |Δt| ≤ γ(n)·|t|: |b − t·x| ≤ γ(n)·|t|·|x|, checked on the kernel's x
            let g = &got[m * n * k..(m + 1) * n * k];
            for i in 0..n {
                for c in 0..k {
                    let (mut s, mut bound) = (C::new(0.0, 0.0), 0.0);
                    for j in 0..n {
                        let used = if lower { j < i } else { j > i };
                        let tij = if i == j && unit {
                            C::new(1.0, 0.0)
                        } else if used || i == j {
                            tr[m * n * n + i * n + j]
                        } else {
                            continue;
                        };
                        s += tij * g[j * k + c];
                        bound += tij.norm() * g[j * k + c].norm();
                    }
                    let r = (br[m * n * k + i * k + c] - s).norm();
                    assert!(r <= gamma(n + 1, T::U) * 2.0 * bound + 1e-300, "{what}: residual {r} at ({i}, {c})");
                    let w = want[i * k + c];
                    assert!(
                        (g[i * k + c] - w).norm() <= 1e-3_f64.min(1e4 * T::U) * (1.0 + w.norm()),
                        "{what}: x({i}, {c}) {} against {w}",
                        g[i * k + c]
                    );
                }
            }
        }
    }
}

#[test]
fn triangular_solves_read_only_their_triangle_and_match_naive_substitution() {
    let host = Host::new();
    for (batch, n, k) in [(1, 0, 3), (2, 1, 1), (3, 7, 2), (1, 40, 5), (1, 150, 3)] {
        triangular_case::<f32>(&host, batch, n, k);
        triangular_case::<f64>(&host, batch, n, k);
        triangular_case::<Complex32>(&host, batch, n, k);
        triangular_case::<Complex64>(&host, batch, n, k);
    }
}

/// Naive Gaussian elimination with partial pivoting in complex f64.
fn naive_solve(a: &[C], b: &[C], n: usize, k: usize) -> Vec<C> {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    for c in 0..n {
        let p = (c..n).max_by(|&x, &y| a[x * n + c].norm().total_cmp(&a[y * n + c].norm())).unwrap();
        for j in 0..n {
            a.swap(c * n + j, p * n + j);
        }
        for j in 0..k {
            b.swap(c * k + j, p * k + j);
        }
        for r in c + 1..n {
            let f = a[r * n + c] / a[c * n + c];
            for j in c..n {
                let v = a[c * n + j];
                a[r * n + j] -= f * v;
            }
            for j in 0..k {
                let v = b[c * k + j];
                b[r * k + j] -= f * v;
            }
        }
    }
    let mut x = b.clone();
    for i in (0..n).rev() {
        for c in 0..k {
            let s: C = (i + 1..n).map(|j| a[i * n + j] * x[j * k + c]).sum();
            x[i * k + c] = (b[i * k + c] - s) / a[i * n + i];
        }
    }
    x
}

fn solve_case<T: Num>(host: &Host, batch: usize, n: usize, k: usize) {
    let what = format!("{} batch {batch}, n {n}, k {k}", std::any::type_name::<T>());
    let a: Vec<C> = (0..batch * n * n).map(|q| C::new(val(q, 8), if T::COMPLEX { val(q, 9) } else { 0.0 })).collect();
    let b: Vec<C> = (0..batch * n * k).map(|q| C::new(val(q, 10), if T::COMPLEX { val(q, 11) } else { 0.0 })).collect();
    let (aa, ba) = (arr::<T>(&[batch, n, n], &a), arr::<T>(&[batch, n, k], &b));
    let x = Array::<T>::zeros(DEV, &[batch, n, k]).unwrap();
    assert_eq!(host.solve(&x, &aa, &ba), Answer::Done, "{what}");
    let (got, ar, br) = (wide(&x), wide(&aa), wide(&ba));
    for m in 0..batch {
        let (am, bm, g) =
            (&ar[m * n * n..(m + 1) * n * n], &br[m * n * k..(m + 1) * n * k], &got[m * n * k..(m + 1) * n * k]);
        let want = naive_solve(am, bm, n, k);
        // the stated normwise backward error: ‖b − a·x‖∞ ≤ 10·n·u·‖a‖∞·‖x‖∞
        let anorm = (0..n).map(|i| (0..n).map(|j| am[i * n + j].norm()).sum::<f64>()).fold(0.0, f64::max);
        let xnorm = g.iter().map(|c| c.norm()).fold(0.0, f64::max);
        for i in 0..n {
            for c in 0..k {
                let s: C = (0..n).map(|j| am[i * n + j] * g[j * k + c]).sum();
                let r = (bm[i * k + c] - s).norm();
                assert!(r <= 10.0 * n as f64 * T::U * anorm * xnorm + 1e-300, "{what}: residual {r} at ({i}, {c})");
                let w = want[i * k + c];
                let cond = 1e5; // these random matrices' condition numbers stay well below this
                assert!(
                    (g[i * k + c] - w).norm() <= cond * n as f64 * T::U * (1.0 + xnorm),
                    "{what}: x({i}, {c}) {} against {w}",
                    g[i * k + c]
                );
            }
        }
    }
}

#[test]
fn general_solves_match_naive_elimination_within_the_backward_error_bound() {
    let host = Host::new();
    for (batch, n, k) in [(1, 0, 2), (2, 1, 1), (3, 6, 2), (1, 33, 4), (1, 140, 2)] {
        solve_case::<f32>(&host, batch, n, k);
        solve_case::<f64>(&host, batch, n, k);
        solve_case::<Complex32>(&host, batch, n, k);
        solve_case::<Complex64>(&host, batch, n, k);
    }
    // a singular matrix: its x is not finite, the batch's other matrix is
    let mut a: Vec<C> = (0..2 * 9).map(|q| C::new(val(q, 12), 0.0)).collect();
    for j in 0..3 {
        a[2 * 3 + j] = a[j] * 2.0; // matrix 0: row 2 = 2 × row 0
    }
    let x = Array::<f64>::zeros(DEV, &[2, 3, 1]).unwrap();
    assert_eq!(
        host.solve(&x, &arr::<f64>(&[2, 3, 3], &a), &arr::<f64>(&[2, 3, 1], &[C::new(1.0, 0.0); 6])),
        Answer::Done
    );
    let got = x.to_vec().unwrap();
    assert!(got[..3].iter().any(|v| !v.is_finite()), "{got:?}");
    assert!(got[3..].iter().all(|v| v.is_finite()), "{got:?}");
    // the same bits on 1, 2 and 8 threads: a batch, and one matrix past faer's blocks
    for (batch, n) in [(5, 30), (1, 260)] {
        let a: Vec<C> = (0..batch * n * n).map(|q| C::new(val(q, 13), 0.0)).collect();
        let b: Vec<C> = (0..batch * n * 3).map(|q| C::new(val(q, 14), 0.0)).collect();
        let (aa, ba) = (arr::<f32>(&[batch, n, n], &a), arr::<f32>(&[batch, n, 3], &b));
        let run = |t: usize| {
            let x = Array::<f32>::zeros(DEV, &[batch, n, 3]).unwrap();
            assert_eq!(Host::with_threads(t).unwrap().solve(&x, &aa, &ba), Answer::Done);
            let y = Array::<f32>::zeros(DEV, &[batch, n, 3]).unwrap();
            assert_eq!(Host::with_threads(t).unwrap().solve_triangular(true, false, &y, &aa, &ba), Answer::Done);
            (x.to_vec().unwrap(), y.to_vec().unwrap())
                .0
                .iter()
                .chain(&y.to_vec().unwrap())
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(run(2), one, "batch {batch}, n {n}: 2 threads");
        assert_eq!(run(8), one, "batch {batch}, n {n}: 8 threads");
    }
}

#[test]
fn matrix_routines_refuse_what_does_not_fit() {
    let host = Host::new();
    let sq = Array::<f64>::zeros(DEV, &[2, 3, 3]).unwrap();
    let l = Array::<f64>::zeros(DEV, &[2, 3, 3]).unwrap();
    let b = Array::<f64>::zeros(DEV, &[2, 3, 4]).unwrap();
    let x = Array::<f64>::zeros(DEV, &[2, 3, 4]).unwrap();
    // dtypes: halves, integers, mixed
    let h = Array::<f16>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(host.cholesky(&Array::<f16>::zeros(DEV, &[3, 3]).unwrap(), &h), Answer::WrongDtype);
    assert_eq!(
        host.cholesky(&Array::<i32>::zeros(DEV, &[3, 3]).unwrap(), &Array::<i32>::zeros(DEV, &[3, 3]).unwrap()),
        Answer::WrongDtype
    );
    assert_eq!(host.cholesky(&Array::<f32>::zeros(DEV, &[2, 3, 3]).unwrap(), &sq), Answer::WrongDtype);
    assert_eq!(host.solve(&Array::<f32>::zeros(DEV, &[2, 3, 4]).unwrap(), &sq, &b), Answer::WrongDtype);
    assert_eq!(
        host.solve_triangular(true, false, &x, &sq, &Array::<f32>::zeros(DEV, &[2, 3, 4]).unwrap()),
        Answer::WrongDtype
    );
    // shapes: not square, rank 1, another shape, batches that differ, rows that differ
    let rect = Array::<f64>::zeros(DEV, &[3, 4]).unwrap();
    assert_eq!(host.cholesky(&Array::<f64>::zeros(DEV, &[3, 4]).unwrap(), &rect), Answer::ShapeMismatch);
    assert_eq!(
        host.cholesky(&Array::<f64>::zeros(DEV, &[3]).unwrap(), &Array::<f64>::zeros(DEV, &[3]).unwrap()),
        Answer::ShapeMismatch
    );
    assert_eq!(host.cholesky(&Array::<f64>::zeros(DEV, &[1, 3, 3]).unwrap(), &sq), Answer::ShapeMismatch);
    assert_eq!(host.solve(&x, &sq, &Array::<f64>::zeros(DEV, &[3, 3, 4]).unwrap()), Answer::ShapeMismatch);
    assert_eq!(
        host.solve(&Array::<f64>::zeros(DEV, &[2, 4, 4]).unwrap(), &sq, &Array::<f64>::zeros(DEV, &[2, 4, 4]).unwrap()),
        Answer::ShapeMismatch
    );
    assert_eq!(host.solve(&Array::<f64>::zeros(DEV, &[2, 3, 5]).unwrap(), &sq, &b), Answer::ShapeMismatch);
    assert_eq!(
        host.solve_triangular(false, true, &x, &Array::<f64>::zeros(DEV, &[2, 3, 2]).unwrap(), &b),
        Answer::ShapeMismatch
    );
    // a destination over an operand
    assert_eq!(host.solve(&b, &sq, &b), Answer::Overlapping);
    assert_eq!(host.cholesky(&l, &l), Answer::Overlapping);
    assert_eq!(host.cholesky(&l, &sq), Answer::Done);
}

/// The eigenvalues of a real symmetric n × n matrix by cyclic Jacobi rotations in f64,
/// ascending.
fn jacobi_eigenvalues(a: &[f64], n: usize) -> Vec<f64> {
    let mut a = a.to_vec();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * n + j].powi(2))
            .sum();
        if off < 1e-30 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if a[p * n + q].abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * a[p * n + q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let (c, s) = (1.0 / (t * t + 1.0).sqrt(), t / (t * t + 1.0).sqrt());
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
        }
    }
    let mut w: Vec<f64> = (0..n).map(|i| a[i * n + i]).collect();
    w.sort_by(f64::total_cmp);
    w
}

/// The real symmetric 2n × 2n embedding [[Re, −Im], [Im, Re]] of a Hermitian n × n matrix: its
/// eigenvalues are the matrix's, each twice.
fn embed(h: &[C], n: usize) -> Vec<f64> {
    let m = 2 * n;
    let mut e = vec![0.0; m * m];
    for i in 0..n {
        for j in 0..n {
            let z = h[i * n + j];
            e[i * m + j] = z.re;
            e[i * m + n + j] = -z.im;
            e[(n + i) * m + j] = z.im;
            e[(n + i) * m + n + j] = z.re;
        }
    }
    e
}

/// The product of an m × p and a p × n complex matrix (C order).
fn mul(a: &[C], b: &[C], m: usize, p: usize, n: usize) -> Vec<C> {
    (0..m * n).map(|q| (0..p).map(|k| a[(q / n) * p + k] * b[k * n + q % n]).sum()).collect()
}

fn adjoint(a: &[C], m: usize, n: usize) -> Vec<C> {
    (0..n * m).map(|q| a[(q % m) * n + q / m].conj()).collect()
}

/// Checks `x` within `eps` of `y`, elementwise in modulus.
fn near(x: &[C], y: &[C], eps: f64, what: &str) {
    assert_eq!(x.len(), y.len(), "{what}");
    for (k, (a, b)) in x.iter().zip(y).enumerate() {
        assert!((a - b).norm() <= eps, "{what}: at {k}: {a} against {b} (ε {eps})");
    }
}

fn identity(n: usize) -> Vec<C> {
    (0..n * n).map(|q| C::new(if q / n == q % n { 1.0 } else { 0.0 }, 0.0)).collect()
}

fn decompositions_case<T: Num>(host: &Host, batch: usize, m: usize, n: usize) {
    let what = format!("{} batch {batch}, {m} × {n}", std::any::type_name::<T>());
    let k = m.min(n);
    let a: Vec<C> = (0..batch * m * n).map(|q| C::new(val(q, 30), if T::COMPLEX { val(q, 31) } else { 0.0 })).collect();
    let aa = arr::<T>(&[batch, m, n], &a);
    let a = wide(&aa);
    let eps =
        40.0 * (m + n + 2) as f64 * T::U * (1.0 + a.iter().map(|c| c.norm()).fold(0.0, f64::max) * (m.max(n) as f64));
    // qr, reduced and complete
    for complete in [false, true] {
        let qc = if complete { m } else { k };
        let (q, r) =
            (Array::<T>::zeros(DEV, &[batch, m, qc]).unwrap(), Array::<T>::zeros(DEV, &[batch, qc, n]).unwrap());
        assert_eq!(host.qr(&q, &r, &aa), Answer::Done, "{what}: qr");
        let (q, r) = (wide(&q), wide(&r));
        for b in 0..batch {
            let (qb, rb, ab) =
                (&q[b * m * qc..(b + 1) * m * qc], &r[b * qc * n..(b + 1) * qc * n], &a[b * m * n..(b + 1) * m * n]);
            near(&mul(qb, rb, m, qc, n), ab, eps, &format!("{what}: q·r (complete {complete})"));
            near(&mul(&adjoint(qb, m, qc), qb, qc, m, qc), &identity(qc), eps, &format!("{what}: qᴴq"));
            assert!((0..qc * n).all(|x| x / n <= x % n || rb[x] == C::new(0.0, 0.0)), "{what}: r upper");
        }
    }
    // svd: values against the eigenvalues of aᴴa (their square roots), and the reconstruction
    let s = Array::<T::Real>::zeros(DEV, &[batch, k]).unwrap();
    assert_eq!(host.svd(None, &s, None, &aa), Answer::Done, "{what}: singular values");
    let sv: Vec<f64> = s.to_vec().unwrap().into_iter().map(|x| x.wide().re).collect();
    for complete in [false, true] {
        let (uc, vr) = if complete { (m, n) } else { (k, k) };
        let (u, s2, vh) = (
            Array::<T>::zeros(DEV, &[batch, m, uc]).unwrap(),
            Array::<T::Real>::zeros(DEV, &[batch, k]).unwrap(),
            Array::<T>::zeros(DEV, &[batch, vr, n]).unwrap(),
        );
        assert_eq!(host.svd(Some(&u), &s2, Some(&vh), &aa), Answer::Done, "{what}: svd");
        let (u, vh) = (wide(&u), wide(&vh));
        let s2: Vec<f64> = s2.to_vec().unwrap().into_iter().map(|x| x.wide().re).collect();
        for b in 0..batch {
            let sb = &s2[b * k..(b + 1) * k];
            assert!(sb.windows(2).all(|w| w[0] >= w[1]) && sb.iter().all(|&x| x >= 0.0), "{what}: descending {sb:?}");
            for (x, y) in sb.iter().zip(&sv[b * k..(b + 1) * k]) {
                assert!((x - y).abs() <= eps, "{what}: values with and without vectors");
            }
            let ab = &a[b * m * n..(b + 1) * m * n];
            // the eigenvalues of aᴴa (n × n; k of them are σ², the rest 0)
            let ata = mul(&adjoint(ab, m, n), ab, n, m, n);
            let mut ev = jacobi_eigenvalues(&embed(&ata, n), 2 * n);
            ev.reverse();
            for i in 0..k {
                let want = ev[2 * i].max(0.0).sqrt();
                assert!((sb[i] - want).abs() <= eps, "{what}: σ{i} = {} against {want}", sb[i]);
            }
            let mut us = u[b * m * uc..(b + 1) * m * uc].to_vec();
            for i in 0..m {
                for j in 0..uc {
                    us[i * uc + j] *= if j < k { sb[j] } else { 0.0 };
                }
            }
            let vb = &vh[b * vr * n..(b + 1) * vr * n];
            // with complete factors the columns of u past k meet rows of vh past k: zeros of Σ
            let (us, vb): (Vec<C>, Vec<C>) = if complete {
                ((0..m * k).map(|q| us[(q / k) * uc + q % k]).collect(), vb[..k * n].to_vec())
            } else {
                (us, vb.to_vec())
            };
            near(&mul(&us, &vb, m, k, n), ab, eps, &format!("{what}: u·Σ·vh (complete {complete})"));
            let ub = &u[b * m * uc..(b + 1) * m * uc];
            near(&mul(&adjoint(ub, m, uc), ub, uc, m, uc), &identity(uc), eps, &format!("{what}: uᴴu"));
            let vfull = &vh[b * vr * n..(b + 1) * vr * n];
            near(&mul(vfull, &adjoint(vfull, vr, n), vr, n, vr), &identity(vr), eps, &format!("{what}: vh·vhᴴ"));
        }
    }
    // eigh of the Hermitian a·aᴴ + its lower triangle only (the upper NaN, never read)
    let h: Vec<C> = (0..batch)
        .flat_map(|b| mul(&a[b * m * n..(b + 1) * m * n], &adjoint(&a[b * m * n..(b + 1) * m * n], m, n), m, n, m))
        .collect();
    let stored: Vec<C> = h
        .iter()
        .enumerate()
        .map(|(q, &z)| if (q % (m * m)) % m > (q % (m * m)) / m { C::new(f64::NAN, f64::NAN) } else { z })
        .collect();
    let ha = arr::<T>(&[batch, m, m], &stored);
    let h = wide(&ha); // the values the kernel reads (the lower triangle, as rounded)
    let (w, v) = (Array::<T::Real>::zeros(DEV, &[batch, m]).unwrap(), Array::<T>::zeros(DEV, &[batch, m, m]).unwrap());
    assert_eq!(host.eigh(&w, Some(&v), &ha), Answer::Done, "{what}: eigh");
    let (w, v): (Vec<f64>, Vec<C>) = (w.to_vec().unwrap().into_iter().map(|x| x.wide().re).collect(), wide(&v));
    let heps = eps * (1.0 + n as f64);
    for b in 0..batch {
        let mut hb = vec![C::new(0.0, 0.0); m * m];
        for i in 0..m {
            for j in 0..=i {
                hb[i * m + j] = h[b * m * m + i * m + j];
                hb[j * m + i] = h[b * m * m + i * m + j].conj();
            }
        }
        let want = jacobi_eigenvalues(&embed(&hb, m), 2 * m);
        let wb = &w[b * m..(b + 1) * m];
        for i in 0..m {
            assert!((wb[i] - want[2 * i]).abs() <= heps, "{what}: λ{i} = {} against {}", wb[i], want[2 * i]);
        }
        let vb = &v[b * m * m..(b + 1) * m * m];
        let mut vw = vb.to_vec();
        for i in 0..m {
            for j in 0..m {
                vw[i * m + j] *= wb[j];
            }
        }
        near(&mul(&hb, vb, m, m, m), &vw, heps, &format!("{what}: h·v = v·diag(w)"));
        near(&mul(&adjoint(vb, m, m), vb, m, m, m), &identity(m), eps, &format!("{what}: vᴴv"));
    }
}

#[test]
fn qr_svd_and_eigh_reconstruct_their_matrices_and_match_jacobi_eigenvalues() {
    let host = Host::new();
    for (batch, m, n) in [(1, 0, 3), (2, 1, 1), (2, 5, 3), (1, 3, 6), (1, 40, 25), (1, 70, 70)] {
        decompositions_case::<f32>(&host, batch, m, n);
        decompositions_case::<f64>(&host, batch, m, n);
        decompositions_case::<Complex32>(&host, batch, m, n);
        decompositions_case::<Complex64>(&host, batch, m, n);
    }
}

#[test]
fn decompositions_give_the_same_bits_on_any_thread_count_and_refuse_what_does_not_fit() {
    let (m, n) = (150, 120);
    let a: Vec<C> = (0..m * n).map(|q| C::new(val(q, 40), 0.0)).collect();
    let aa = arr::<f64>(&[m, n], &a);
    let h: Vec<C> = mul(&a, &adjoint(&a, m, n), m, n, m);
    let ha = arr::<f64>(&[m, m], &h);
    let run = |t: usize| {
        let host = Host::with_threads(t).unwrap();
        let (q, r) = (Array::<f64>::zeros(DEV, &[m, n]).unwrap(), Array::<f64>::zeros(DEV, &[n, n]).unwrap());
        assert_eq!(host.qr(&q, &r, &aa), Answer::Done);
        let (u, s, vh) = (
            Array::<f64>::zeros(DEV, &[m, n]).unwrap(),
            Array::<f64>::zeros(DEV, &[n]).unwrap(),
            Array::<f64>::zeros(DEV, &[n, n]).unwrap(),
        );
        assert_eq!(host.svd(Some(&u), &s, Some(&vh), &aa), Answer::Done);
        let (w, v) = (Array::<f64>::zeros(DEV, &[m]).unwrap(), Array::<f64>::zeros(DEV, &[m, m]).unwrap());
        assert_eq!(host.eigh(&w, Some(&v), &ha), Answer::Done);
        [q, r, u, s, vh, w, v].iter().flat_map(|x| x.to_vec().unwrap()).map(f64::to_bits).collect::<Vec<_>>()
    };
    let one = run(1);
    for t in [2, 8] {
        let other = run(t);
        let first = (0..one.len()).find(|&i| one[i] != other[i]);
        assert_eq!(first, None, "{t} threads: first differing element of q, r, u, s, vh, w, v");
    }
    // and the same bits in a batch: each of two copies as the matrix alone
    let twice: Vec<C> = a.iter().chain(&a).copied().collect();
    let host = Host::with_threads(2).unwrap();
    let (q2, r2) = (Array::<f64>::zeros(DEV, &[2, m, n]).unwrap(), Array::<f64>::zeros(DEV, &[2, n, n]).unwrap());
    assert_eq!(host.qr(&q2, &r2, &arr::<f64>(&[2, m, n], &twice)), Answer::Done);
    let (u2, s2, vh2) = (
        Array::<f64>::zeros(DEV, &[2, m, n]).unwrap(),
        Array::<f64>::zeros(DEV, &[2, n]).unwrap(),
        Array::<f64>::zeros(DEV, &[2, n, n]).unwrap(),
    );
    assert_eq!(host.svd(Some(&u2), &s2, Some(&vh2), &arr::<f64>(&[2, m, n], &twice)), Answer::Done);
    let halves = |x: &Array<f64>| {
        let v: Vec<u64> = x.to_vec().unwrap().into_iter().map(f64::to_bits).collect();
        let (lo, hi) = v.split_at(v.len() / 2);
        assert_eq!(lo, hi, "the two copies of a batch");
        lo.to_vec()
    };
    let alone: Vec<u64> = [&q2, &r2, &u2, &s2, &vh2].iter().flat_map(|x| halves(x)).collect();
    assert!(one[..alone.len()] == alone[..], "a batch's matrix as the matrix alone");
    // refusals
    let host = Host::new();
    let a = Array::<f64>::zeros(DEV, &[4, 3]).unwrap();
    let z = |s: &[usize]| Array::<f64>::zeros(DEV, s).unwrap();
    assert_eq!(host.qr(&z(&[4, 2]), &z(&[2, 3]), &a), Answer::ShapeMismatch, "q neither reduced nor complete");
    assert_eq!(host.qr(&z(&[4, 3]), &z(&[4, 3]), &a), Answer::ShapeMismatch, "r of the other form");
    assert_eq!(host.qr(&Array::<f32>::zeros(DEV, &[4, 3]).unwrap(), &z(&[3, 3]), &a), Answer::WrongDtype);
    assert_eq!(host.svd(None, &z(&[4]), None, &a), Answer::ShapeMismatch, "k values");
    assert_eq!(host.svd(Some(&z(&[4, 3])), &z(&[3]), None, &a), Answer::ShapeMismatch, "u without vh");
    assert_eq!(
        host.svd(Some(&z(&[4, 4])), &z(&[3]), Some(&z(&[3, 3])), &a),
        Answer::Done,
        "complete: vh is n × n = k × n"
    );
    assert_eq!(
        host.svd(Some(&z(&[4, 2])), &z(&[3]), Some(&z(&[3, 3])), &a),
        Answer::ShapeMismatch,
        "u of neither form"
    );
    let wide_a = z(&[3, 4]);
    assert_eq!(
        host.svd(Some(&z(&[3, 3])), &z(&[3]), Some(&z(&[4, 4])), &wide_a),
        Answer::Done,
        "complete vh of a wide matrix"
    );
    assert_eq!(
        host.svd(Some(&z(&[3, 3])), &z(&[3]), Some(&z(&[4, 3])), &wide_a),
        Answer::ShapeMismatch,
        "vh of neither form"
    );
    assert_eq!(host.svd(None, &Array::<f32>::zeros(DEV, &[3]).unwrap(), None, &a), Answer::WrongDtype);
    let c = Array::<Complex64>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(
        host.svd(None, &Array::<Complex64>::zeros(DEV, &[3]).unwrap(), None, &c),
        Answer::WrongDtype,
        "complex values"
    );
    assert_eq!(host.eigh(&z(&[3]), None, &c), Answer::Done, "real values of a complex matrix");
    assert_eq!(host.eigh(&z(&[4]), None, &a), Answer::ShapeMismatch, "not square");
    assert_eq!(host.eigh(&z(&[3]), Some(&z(&[3, 3])), &c), Answer::WrongDtype, "vectors of the matrix's dtype");
    assert_eq!(
        host.eigh(&Array::<f16>::zeros(DEV, &[3]).unwrap(), None, &Array::<f16>::zeros(DEV, &[3, 3]).unwrap()),
        Answer::WrongDtype
    );
    let sq = z(&[3, 3]);
    assert_eq!(host.eigh(&z(&[3]), Some(&sq), &sq), Answer::Overlapping);
}
