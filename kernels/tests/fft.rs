//! Fourier transforms of the host library against a naive O(n²) DFT in f64 written here: every
//! length 1–64 and large primes, both directions, complex and real forms, several axes, strided,
//! flipped and broadcast inputs, empty axes and rank 0, the round trip, special values, the same
//! bits on 1, 2 and 8 threads, and every refusal.

use half::f16;
use num_complex::{Complex32, Complex64};
use nx_kernels::{Answer, Array, Direction, Element, Host, Kernels, Move};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize, salt: usize) -> f64 {
    (((k * 7919 + salt * 104_729) % 10007) as f64 / 10007.0 - 0.5) * 2.0
}

type C = Complex64;

/// The naive DFT of one lane in f64 (`sign` −1 forward, +1 inverse), the angle reduced exactly
/// (`jk mod n`) before the trigonometry.
fn dft(x: &[C], sign: f64) -> Vec<C> {
    let n = x.len();
    (0..n)
        .map(|k| {
            x.iter().enumerate().fold(C::new(0.0, 0.0), |acc, (j, &v)| {
                let t = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                acc + v * C::new(t.cos(), t.sin())
            })
        })
        .collect()
}

/// The naive transform of a C-order array of `shape` along `axes` (each axis's lanes by `dft`).
fn dft_axes(shape: &[usize], x: &[C], axes: &[usize], sign: f64) -> Vec<C> {
    let mut y = x.to_vec();
    for &a in axes {
        let inner: usize = shape[a + 1..].iter().product();
        let outer: usize = shape[..a].iter().product();
        let n = shape[a];
        for o in 0..outer {
            for i in 0..inner {
                let lane: Vec<C> = (0..n).map(|j| y[(o * n + j) * inner + i]).collect();
                for (j, v) in dft(&lane, sign).into_iter().enumerate() {
                    y[(o * n + j) * inner + i] = v;
                }
            }
        }
    }
    y
}

/// The stated bound: each output within `5·u·⌈log₂ n⌉·Σ|x|` of the exact transform per axis of
/// `n` points (`u` the part's unit roundoff), `Σ|x|` over the whole input for several axes.
fn bound(u: f64, shape: &[usize], axes: &[usize], x: &[C]) -> f64 {
    let l1: f64 = x.iter().map(|v| v.norm()).sum();
    let logs: f64 = axes.iter().map(|&a| (shape[a].max(2) as f64).log2().ceil()).sum();
    5.0 * u * logs.max(1.0) * l1.max(f64::MIN_POSITIVE) * 1.0000001
}

fn close(got: &[C], want: &[C], eps: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).norm() <= eps, "{what}: output {k}: {g} against {w} (bound {eps})");
    }
}

fn c32(v: &[C]) -> Vec<Complex32> {
    v.iter().map(|c| Complex32::new(c.re as f32, c.im as f32)).collect()
}

fn widen(v: &[Complex32]) -> Vec<C> {
    v.iter().map(|c| C::new(f64::from(c.re), f64::from(c.im))).collect()
}

fn run<S: Element, D: Element>(host: &Host, dir: Direction, axes: &[usize], shape: &[usize], src: &Array<S>) -> Vec<D> {
    let dst = Array::<D>::zeros(DEV, shape).unwrap();
    assert_eq!(host.fft(dir, axes, &dst, src), Answer::Done, "fft along {axes:?} into {shape:?}");
    dst.to_vec().unwrap()
}

#[test]
fn every_length_to_64_and_large_primes_match_the_naive_dft_both_ways() {
    let host = Host::new();
    let u32_ = f64::from(f32::EPSILON) / 2.0;
    let u64_ = f64::EPSILON / 2.0;
    for n in (1..=64).chain([97, 127, 251, 1009, 4099, 1 << 12, 3 * 5 * 7 * 11]) {
        let x: Vec<C> = (0..n).map(|j| C::new(val(j, n), val(j, n + 1))).collect();
        // the f32 operands as their f32 values, so the reference transforms what the kernel reads
        let x32 = c32(&x);
        let xw = widen(&x32);
        for (dir, sign) in [(Direction::Forward, -1.0), (Direction::Inverse, 1.0)] {
            let want = dft(&xw, sign);
            let got =
                run::<Complex32, Complex32>(&host, dir, &[0], &[n], &Array::from_vec(DEV, &[n], x32.clone()).unwrap());
            close(&widen(&got), &want, bound(u32_, &[n], &[0], &xw), &format!("c64, n = {n}, {dir:?}"));
            let want = dft(&x, sign);
            let got = run::<C, C>(&host, dir, &[0], &[n], &Array::from_vec(DEV, &[n], x.clone()).unwrap());
            close(&got, &want, bound(u64_, &[n], &[0], &x), &format!("c128, n = {n}, {dir:?}"));
        }
    }
}

#[test]
fn the_round_trip_gives_n_times_the_input() {
    let host = Host::new();
    for n in [1, 2, 7, 64, 100, 1009] {
        let x: Vec<C> = (0..n).map(|j| C::new(val(j, 3), val(j, 4))).collect();
        let a = Array::from_vec(DEV, &[n], x.clone()).unwrap();
        let y = Array::<C>::zeros(DEV, &[n]).unwrap();
        assert_eq!(host.fft(Direction::Forward, &[0], &y, &a), Answer::Done);
        let back = run::<C, C>(&host, Direction::Inverse, &[0], &[n], &y);
        let want: Vec<C> = x.iter().map(|v| v * n as f64).collect();
        // two transforms: twice the bound of one, over the forward output's size (≤ n·Σ|x|)
        let eps = 2.0 * bound(f64::EPSILON / 2.0, &[n], &[0], &x) * n as f64;
        close(&back, &want, eps, &format!("round trip of {n}"));
    }
}

#[test]
fn several_axes_strided_flipped_and_broadcast_inputs_match_the_naive_transform() {
    let host = Host::new();
    let shape = [3usize, 5, 4];
    let n: usize = shape.iter().product();
    // stored as [3, 5, 8], the view taking every other element of the last axis, flipped on 0
    let store: Vec<Complex32> = (0..n * 2).map(|k| Complex32::new(val(k, 7) as f32, val(k, 8) as f32)).collect();
    let base = Array::from_vec(DEV, &[3, 5, 8], store).unwrap();
    let view = base.apply(&Move::Slice { axis: 2, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let view = view.apply(&Move::Flip(0)).unwrap().unwrap();
    let x = widen(&view.to_vec().unwrap());
    let u = f64::from(f32::EPSILON) / 2.0;
    for axes in [vec![0], vec![1], vec![2], vec![0, 2], vec![2, 0, 1], vec![1, 2, 0], vec![]] {
        for (dir, sign) in [(Direction::Forward, -1.0), (Direction::Inverse, 1.0)] {
            // the kernel transforms the last of `axes` first: the reference follows that order
            let order: Vec<usize> = axes.iter().rev().copied().collect();
            let want = dft_axes(&shape, &x, &order, sign);
            let got = widen(&run::<Complex32, Complex32>(&host, dir, &axes, &shape, &view));
            let eps = if axes.is_empty() { 0.0 } else { bound(u, &shape, &axes, &x) };
            close(&got, &want, eps, &format!("axes {axes:?}, {dir:?}"));
        }
    }
    // a broadcast input: one row of 6 seen 4 times
    let row: Vec<Complex32> = (0..6).map(|k| Complex32::new(val(k, 9) as f32, 0.5)).collect();
    let b = Array::from_vec(DEV, &[1, 6], row).unwrap().apply(&Move::Expand(vec![4, 6])).unwrap().unwrap();
    let x = widen(&b.to_vec().unwrap());
    for axes in [vec![1], vec![0, 1]] {
        let got = widen(&run::<Complex32, Complex32>(&host, Direction::Forward, &axes, &[4, 6], &b));
        let order: Vec<usize> = axes.iter().rev().copied().collect();
        close(&got, &dft_axes(&[4, 6], &x, &order, -1.0), bound(u, &[4, 6], &axes, &x), &format!("broadcast {axes:?}"));
    }
}

/// The Hermitian extension of the first `n/2 + 1` points of a lane of `n`.
fn extend(h: &[C], n: usize) -> Vec<C> {
    (0..n).map(|j| if j < h.len() { h[j] } else { h[n - j].conj() }).collect()
}

#[test]
fn real_forms_give_the_half_or_full_spectrum_and_back() {
    let host = Host::new();
    let u = f64::EPSILON / 2.0;
    for n in [1usize, 2, 3, 8, 9, 30, 31, 257] {
        let h = n / 2 + 1;
        let x: Vec<f64> = (0..2 * n).map(|j| val(j, n)).collect(); // two lanes of n, as [2, n]
        let xc: Vec<C> = x.iter().map(|&v| C::new(v, 0.0)).collect();
        let a = Array::from_vec(DEV, &[2, n], x.clone()).unwrap();
        for (dir, sign) in [(Direction::Forward, -1.0), (Direction::Inverse, 1.0)] {
            let full = dft_axes(&[2, n], &xc, &[1], sign);
            let got = run::<f64, C>(&host, dir, &[1], &[2, n], &a);
            close(&got, &full, bound(u, &[2, n], &[1], &xc), &format!("real {n}, full, {dir:?}"));
            let got = run::<f64, C>(&host, dir, &[1], &[2, h], &a);
            let want: Vec<C> = (0..2).flat_map(|r| full[r * n..r * n + h].to_vec()).collect();
            close(&got, &want, bound(u, &[2, n], &[1], &xc), &format!("real {n}, half, {dir:?}"));
            // complex to real: from the half spectrum (imaginary parts at 0 and n/2 included,
            // which the extension keeps: the real part of its transform)
            let hs: Vec<C> = (0..2 * h).map(|j| C::new(val(j, 5), val(j, 6))).collect();
            let want: Vec<C> = (0..2)
                .flat_map(|r| dft(&extend(&hs[r * h..(r + 1) * h], n), sign))
                .map(|c| C::new(c.re, 0.0))
                .collect();
            let got: Vec<C> =
                run::<C, f64>(&host, dir, &[1], &[2, n], &Array::from_vec(DEV, &[2, h], hs.clone()).unwrap())
                    .into_iter()
                    .map(|v| C::new(v, 0.0))
                    .collect();
            let ext: Vec<C> = (0..2).flat_map(|r| extend(&hs[r * h..(r + 1) * h], n)).collect();
            close(&got, &want, bound(u, &[2, n], &[1], &ext), &format!("to real {n}, {dir:?}"));
        }
    }
    // complex to real from a flipped, strided view, along one axis and along two (the second
    // through the kernel's contiguous copy)
    let (r, n) = (3usize, 10usize);
    let h = n / 2 + 1;
    let store: Vec<C> = (0..r * 2 * h).map(|j| C::new(val(j, 20), val(j, 21))).collect();
    let base = Array::from_vec(DEV, &[r, 2 * h], store).unwrap();
    let view = base.apply(&Move::Slice { axis: 1, start: Some(0), stop: None, step: 2 }).unwrap().unwrap();
    let view = view.apply(&Move::Flip(0)).unwrap().unwrap();
    let hs = view.to_vec().unwrap();
    let want: Vec<C> =
        (0..r).flat_map(|q| dft(&extend(&hs[q * h..(q + 1) * h], n), 1.0)).map(|c| C::new(c.re, 0.0)).collect();
    let got: Vec<C> =
        run::<C, f64>(&host, Direction::Inverse, &[1], &[r, n], &view).into_iter().map(|v| C::new(v, 0.0)).collect();
    let ext: Vec<C> = (0..r).flat_map(|q| extend(&hs[q * h..(q + 1) * h], n)).collect();
    close(&got, &want, bound(u, &[r, n], &[1], &ext), "to real from a strided view");
    // along [0, 1]: axis 0 complex to complex first, then axis 1 to real
    let inner = dft_axes(&[r, h], &hs, &[0], 1.0);
    let want: Vec<C> =
        (0..r).flat_map(|q| dft(&extend(&inner[q * h..(q + 1) * h], n), 1.0)).map(|c| C::new(c.re, 0.0)).collect();
    let got: Vec<C> =
        run::<C, f64>(&host, Direction::Inverse, &[0, 1], &[r, n], &view).into_iter().map(|v| C::new(v, 0.0)).collect();
    let l1: f64 = hs.iter().map(|c| c.norm()).sum::<f64>() * 2.0;
    close(&got, &want, 5.0 * u * 8.0 * l1 * r as f64, "to real along two axes from a strided view");
    // several axes: real to half spectrum along [0, 1] (axis 1 first), then back, n·m times x
    let (m, n) = (6usize, 10usize);
    let x: Vec<f32> = (0..m * n).map(|j| val(j, 12) as f32).collect();
    let a = Array::from_vec(DEV, &[m, n], x.clone()).unwrap();
    let spec = Array::<Complex32>::zeros(DEV, &[m, n / 2 + 1]).unwrap();
    assert_eq!(host.fft(Direction::Forward, &[0, 1], &spec, &a), Answer::Done);
    let xc: Vec<C> = x.iter().map(|&v| C::new(f64::from(v), 0.0)).collect();
    let full = dft_axes(&[m, n], &xc, &[1, 0], -1.0);
    let want: Vec<C> = (0..m).flat_map(|r| full[r * n..r * n + n / 2 + 1].to_vec()).collect();
    let u32_ = f64::from(f32::EPSILON) / 2.0;
    close(&widen(&spec.to_vec().unwrap()), &want, bound(u32_, &[m, n], &[0, 1], &xc), "rfft2");
    let back = run::<Complex32, f32>(&host, Direction::Inverse, &[0, 1], &[m, n], &spec);
    for (k, (&b, &x)) in back.iter().zip(&x).enumerate() {
        let eps = 3.0 * bound(u32_, &[m, n], &[0, 1], &xc) * (m * n) as f64;
        assert!(
            (f64::from(b) - (m * n) as f64 * f64::from(x)).abs() <= eps,
            "irfft2 at {k}: {b} against {x}·{}",
            m * n
        );
    }
}

#[test]
fn empty_axes_rank_zero_special_values_and_thread_counts() {
    let host = Host::new();
    // an axis of no points: nothing to write; a half spectrum of 0 points has 0
    let e = Array::<Complex32>::zeros(DEV, &[3, 0]).unwrap();
    assert_eq!(host.fft(Direction::Forward, &[1], &Array::<Complex32>::zeros(DEV, &[3, 0]).unwrap(), &e), Answer::Done);
    let r = Array::<f32>::zeros(DEV, &[0, 4]).unwrap();
    assert_eq!(host.fft(Direction::Forward, &[0], &Array::<Complex32>::zeros(DEV, &[0, 4]).unwrap(), &r), Answer::Done);
    // rank 0, no axis: a copy, a real widened to complex
    let s = Array::from_vec(DEV, &[], vec![2.5f64]).unwrap();
    assert_eq!(run::<f64, C>(&host, Direction::Forward, &[], &[], &s), vec![C::new(2.5, 0.0)]);
    // a NaN reaches every output of its lane and no other lane; an infinity makes its lane's
    // outputs infinite or NaN
    let mut x = vec![Complex32::new(1.0, 0.0); 3 * 16];
    x[5] = Complex32::new(f32::NAN, 0.0);
    x[16 + 3] = Complex32::new(f32::INFINITY, 0.0);
    let got = run::<Complex32, Complex32>(
        &host,
        Direction::Forward,
        &[1],
        &[3, 16],
        &Array::from_vec(DEV, &[3, 16], x).unwrap(),
    );
    assert!(got[..16].iter().all(|c| c.re.is_nan() || c.im.is_nan()), "NaN lane: {:?}", &got[..16]);
    assert!(got[16..32].iter().all(|c| !c.re.is_finite() || !c.im.is_finite()), "∞ lane: {:?}", &got[16..32]);
    assert_eq!(got[32], Complex32::new(16.0, 0.0));
    assert!(got[33..].iter().all(|c| c.norm() < 1e-5), "the ones' lane: {:?}", &got[32..]);
    // the same bits on 1, 2 and 8 threads, several axes and lanes of a prime length
    let shape = [8usize, 127, 6];
    let n: usize = shape.iter().product();
    let x: Vec<Complex32> = (0..n).map(|k| Complex32::new(val(k, 1) as f32, val(k, 2) as f32)).collect();
    let a = Array::from_vec(DEV, &shape, x).unwrap();
    let bits = |v: Vec<Complex32>| v.iter().map(|c| (c.re.to_bits(), c.im.to_bits())).collect::<Vec<_>>();
    let one = bits(run(&Host::with_threads(1).unwrap(), Direction::Forward, &[1, 0], &shape, &a));
    for t in [2, 8] {
        assert_eq!(
            bits(run(&Host::with_threads(t).unwrap(), Direction::Forward, &[1, 0], &shape, &a)),
            one,
            "{t} threads"
        );
    }
}

#[test]
fn refusals_name_what_does_not_fit() {
    let host = Host::new();
    let c = Array::<Complex32>::zeros(DEV, &[4, 6]).unwrap();
    let f = Array::<f32>::zeros(DEV, &[4, 6]).unwrap();
    let fwd = Direction::Forward;
    let refuse = |dst: &dyn nx_kernels::door::Operand, src: &dyn nx_kernels::door::Operand, axes: &[usize]| {
        host.fft(fwd, axes, dst, src)
    };
    // dtypes: real to real, another precision, halves, integers
    assert_eq!(refuse(&Array::<f32>::zeros(DEV, &[4, 6]).unwrap(), &f, &[1]), Answer::WrongDtype);
    assert_eq!(refuse(&Array::<Complex64>::zeros(DEV, &[4, 6]).unwrap(), &c, &[1]), Answer::WrongDtype);
    assert_eq!(refuse(&Array::<Complex64>::zeros(DEV, &[4, 6]).unwrap(), &f, &[1]), Answer::WrongDtype);
    assert_eq!(refuse(&c, &Array::<f16>::zeros(DEV, &[4, 6]).unwrap(), &[1]), Answer::WrongDtype);
    assert_eq!(refuse(&c, &Array::<i32>::zeros(DEV, &[4, 6]).unwrap(), &[1]), Answer::WrongDtype);
    // axes: repeated, past the rank
    let c2 = Array::<Complex32>::zeros(DEV, &[4, 6]).unwrap();
    assert_eq!(refuse(&c2, &c, &[1, 1]), Answer::ShapeMismatch);
    assert_eq!(refuse(&c2, &c, &[2]), Answer::ShapeMismatch);
    // shapes: complex of another shape, a half spectrum of the wrong extent, along another axis
    assert_eq!(refuse(&Array::<Complex32>::zeros(DEV, &[4, 5]).unwrap(), &c, &[1]), Answer::ShapeMismatch);
    assert_eq!(refuse(&Array::<Complex32>::zeros(DEV, &[4, 5]).unwrap(), &f, &[1]), Answer::ShapeMismatch);
    assert_eq!(refuse(&Array::<Complex32>::zeros(DEV, &[3, 6]).unwrap(), &f, &[1]), Answer::ShapeMismatch);
    assert_eq!(refuse(&Array::<Complex32>::zeros(DEV, &[4, 4]).unwrap(), &f, &[1]), Answer::Done, "half of 6 is 4");
    assert_eq!(
        refuse(&Array::<f32>::zeros(DEV, &[4, 7]).unwrap(), &c, &[1]),
        Answer::ShapeMismatch,
        "6 is not half of 7"
    );
    assert_eq!(refuse(&Array::<f32>::zeros(DEV, &[4, 10]).unwrap(), &c, &[1]), Answer::Done, "6 is half of 10");
    assert_eq!(refuse(&Array::<f32>::zeros(DEV, &[4, 11]).unwrap(), &c, &[1]), Answer::Done, "and of 11");
    assert_eq!(refuse(&c, &c, &[1]), Answer::Overlapping, "in place");
    assert_eq!(refuse(&c2, &Array::<Complex32>::zeros(DEV, &[4]).unwrap(), &[0]), Answer::ShapeMismatch, "ranks");
}
