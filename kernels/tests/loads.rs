//! Padded and windowed loads in maps and reductions (`Kernels::map_loads`,
//! `Kernels::reduce_loads`) and the window move, against naive references written here: random
//! shapes, paddings (crops, interior), windows (stride, dilation), strided, flipped and broadcast
//! operands, empty axes and rank 0; convolutions as reductions of windowed products against a
//! naive f64 convolution; pools; the same bits on 1, 2 and 8 threads; refusals.

use nx_kernels::host::HostOptions;
use nx_kernels::loads::{padded_shape, Load};
use nx_kernels::prog::Prog;
use nx_kernels::{Answer, Array, Dtype, Host, Kernels, Move, Pad, Reduction, Value, Windows};
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

/// The operand index the padded index `p` reads, or `None` for the fill: written from the
/// definition (lo elements before, interior between neighbours, a negative lo crops).
fn naive_source(shape: &[usize], pad: &Pad, p: &[usize]) -> Option<Vec<usize>> {
    let mut i = Vec::new();
    for d in 0..shape.len() {
        let q = p[d] as i64 - pad.lo[d] as i64;
        let step = pad.interior[d] as i64 + 1;
        if q < 0 || q % step != 0 || (q / step) as usize >= shape[d] {
            return None;
        }
        i.push((q / step) as usize);
    }
    Some(i)
}

/// The padded index that position `v` of a load of `load_shape` reads: itself, or through the
/// windows `w·stride + e·dilation`.
fn padded_index(v: &[usize], windows: Option<&Windows>) -> Vec<usize> {
    match windows {
        None => v.to_vec(),
        Some(w) => {
            let r = w.size.len();
            (0..r).map(|d| v[d] * w.stride[d] + v[r + d] * w.dilation[d]).collect()
        }
    }
}

/// `xs` (C order) as a strided view: every other element along the last axis, the first axis
/// flipped (positions far from C order).
fn strided(shape: &[usize], xs: &[f32]) -> Array<f32> {
    if shape.is_empty() || shape.contains(&0) {
        return Array::from_vec(DEV, shape, xs.to_vec()).unwrap();
    }
    let mut big = shape.to_vec();
    let r = shape.len();
    big[r - 1] = big[r - 1] * 2 + 1;
    let b = Array::<f32>::zeros(DEV, &big).unwrap();
    let v = b.apply(&Move::Slice { axis: r - 1, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let v = v.apply(&Move::Flip(0)).unwrap().unwrap();
    Array::transfer(&Array::from_vec(DEV, shape, xs.to_vec()).unwrap(), &v).unwrap();
    v
}

/// A library on `threads` threads that splits every map and reduction it can.
fn host(threads: usize) -> Host {
    Host::with_options(HostOptions { threads: Some(threads), map: Some(1), reduce: Some(1), ..HostOptions::default() })
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn the_window_move_reads_each_window_element(
        shape in prop::collection::vec(0usize..=7, 1..=3),
        size in prop::collection::vec(1usize..=3, 3),
        stride in prop::collection::vec(1usize..=3, 3),
        dilation in prop::collection::vec(1usize..=2, 3),
        flip in any::<bool>(),
    ) {
        let r = shape.len();
        let a = Array::from_fn(DEV, &shape, |i| flat(&shape, i) as f64).unwrap();
        let a = if flip && r > 0 { a.apply(&Move::Flip(r - 1)).unwrap().unwrap() } else { a };
        let w = Windows { size: size[..r].to_vec(), stride: stride[..r].to_vec(), dilation: dilation[..r].to_vec() };
        let v = a.apply(&Move::Window(w.clone())).unwrap().unwrap();
        let counts: Vec<usize> = (0..r).map(|d| {
            let span = (w.size[d] - 1) * w.dilation[d] + 1;
            if shape[d] < span { 0 } else { (shape[d] - span) / w.stride[d] + 1 }
        }).collect();
        let want_shape: Vec<usize> = counts.iter().chain(&w.size).copied().collect();
        prop_assert_eq!(v.shape(), &want_shape[..]);
        let got = v.to_vec().unwrap();
        for (k, g) in got.iter().enumerate() {
            let idx = unflat(&want_shape, k);
            let mut at: Vec<usize> = padded_index(&idx, Some(&w));
            if flip {
                at[r - 1] = shape[r - 1] - 1 - at[r - 1];
            }
            prop_assert_eq!(*g, flat(&shape, &at) as f64, "at {:?}", idx);
        }
    }

    #[test]
    fn padded_maps_read_the_naive_padded_operand(
        shape in prop::collection::vec(0usize..=5, 0..=3),
        lo in prop::collection::vec(-2isize..=3, 3),
        hi in prop::collection::vec(-2isize..=3, 3),
        interior in prop::collection::vec(0usize..=2, 3),
        size in prop::collection::vec(1usize..=3, 3),
        stride in prop::collection::vec(1usize..=3, 3),
        dilation in prop::collection::vec(1usize..=2, 3),
        windowed in any::<bool>(),
        lead in 1usize..=2,
        threads in prop::sample::select(vec![1usize, 2, 8]),
    ) {
        let r = shape.len();
        let pad = Pad { lo: lo[..r].to_vec(), hi: hi[..r].to_vec(), interior: interior[..r].to_vec() };
        let w = Windows { size: size[..r].to_vec(), stride: stride[..r].to_vec(), dilation: dilation[..r].to_vec() };
        let windows = windowed.then_some(&w);
        let n: usize = shape.iter().product();
        // exact dyadic values, so that x·2 + y is exact in f32 and comparable bit for bit
        let xs: Vec<f32> = (0..n).map(|k| ((k * 37) % 23) as f32 * 0.25 - 2.0).collect();
        let x = strided(&shape, &xs);
        let h = host(threads);
        let load_shape = match padded_shape(&pad, windows, &shape) {
            Ok(s) => s,
            Err(_) => {
                // a crop past the operand: no load shape, every loop refused
                let dst = Array::<f32>::zeros(DEV, &[1]).unwrap();
                let mut p = Prog::new(&[Dtype::F32]);
                let l = p.load(0);
                p.output(l);
                prop_assert_eq!(
                    h.map_loads(&p, &[1], &[&dst], &[Load::padded(&x, &pad, Value::Float(0.0), windows)]),
                    Answer::ShapeMismatch
                );
                return Ok(());
            }
        };
        // the loop: `lead` copies of the load along a new leading axis, plus a plain operand
        // varying along that axis alone
        let loop_shape: Vec<usize> = std::iter::once(lead).chain(load_shape.iter().copied()).collect();
        let ones = vec![1usize; load_shape.len()];
        let y_shape: Vec<usize> = std::iter::once(lead).chain(ones).collect();
        let y = Array::from_fn(DEV, &y_shape, |i| i[0] as f32 + 0.5).unwrap();
        let mut p = Prog::new(&[Dtype::F32, Dtype::F32]);
        let (a, b) = (p.load(0), p.load(1));
        let two = p.float(2.0);
        let a2 = p.mul(a, two);
        let s = p.add(a2, b);
        p.output(s);
        let dst = Array::<f32>::zeros(DEV, &loop_shape).unwrap();
        let fill = -7.5;
        let loads = [Load::padded(&x, &pad, Value::Float(fill), windows), Load::Plain(&y)];
        prop_assert_eq!(h.map_loads(&p, &loop_shape, &[&dst], &loads), Answer::Done);
        let got = dst.to_vec().unwrap();
        for (k, g) in got.iter().enumerate() {
            let idx = unflat(&loop_shape, k);
            let at = padded_index(&idx[1..], windows);
            let v = naive_source(&shape, &pad, &at).map_or(fill, |i| f64::from(xs[flat(&shape, &i)]));
            let want = v * 2.0 + idx[0] as f64 + 0.5;
            prop_assert_eq!(f64::from(*g), want, "at {:?}", idx);
        }
    }
}

#[test]
fn padded_loads_convert_their_fill_into_their_dtype_and_read_narrow_dtypes() {
    // an i32 operand padded with a fill an i32 holds only as -7 (floats truncate), a bf16 one
    // with a fill bf16 rounds, each read into an f64 result
    let h = Host::new();
    let xi = Array::from_vec(DEV, &[3], vec![5i32, -6, 7]).unwrap();
    let xb = Array::from_vec(DEV, &[3], vec![half::bf16::from_f32(1.5); 3]).unwrap();
    let pad = Pad { lo: vec![1], hi: vec![2], interior: vec![1] };
    assert_eq!(pad.shape(&[3]).unwrap(), [8]);
    for (x, fill, want) in [
        (&xi as &dyn nx_kernels::Operand, -7.9, vec![-7.0, 5.0, -7.0, -6.0, -7.0, 7.0, -7.0, -7.0]),
        (&xb as &dyn nx_kernels::Operand, 1.0 + 2f64.powi(-9), vec![1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.0]),
    ] {
        let mut p = Prog::new(&[x.dtype()]);
        let l = p.load(0);
        let c = p.cast(l, Dtype::F64);
        p.output(c);
        let dst = Array::<f64>::zeros(DEV, &[8]).unwrap();
        assert_eq!(h.map_loads(&p, &[8], &[&dst], &[Load::padded(x, &pad, Value::Float(fill), None)]), Answer::Done);
        assert_eq!(dst.to_vec().unwrap(), want, "{}", x.dtype());
    }
    // rank 0: no padding, no windows: the element itself; an empty operand padded: all fill
    let s = Array::from_vec(DEV, &[], vec![3.25f32]).unwrap();
    let e = Array::<f32>::zeros(DEV, &[0]).unwrap();
    let mut p = Prog::new(&[Dtype::F32]);
    let l = p.load(0);
    p.output(l);
    let d0 = Array::<f32>::zeros(DEV, &[]).unwrap();
    let none = Windows::new(&[], &[]);
    assert_eq!(
        h.map_loads(&p, &[], &[&d0], &[Load::padded(&s, &Pad::none(0), Value::Float(0.0), Some(&none))]),
        Answer::Done
    );
    assert_eq!(d0.to_vec().unwrap(), [3.25]);
    let d3 = Array::<f32>::zeros(DEV, &[3]).unwrap();
    let edges = Pad::edges(&[2], &[1]);
    assert_eq!(h.map_loads(&p, &[3], &[&d3], &[Load::padded(&e, &edges, Value::Float(-1.0), None)]), Answer::Done);
    assert_eq!(d3.to_vec().unwrap(), [-1.0; 3]);
}

/// A naive f64 convolution: `x [n, c, h, w]` padded by `p` (lo = hi) along its last two axes,
/// `f [o, c, kh, kw]` at stride `s` and dilation `g`; each output with the sum of the magnitudes
/// of its products.
#[allow(clippy::type_complexity)]
fn naive_conv(
    x: &[f64],
    xs: [usize; 4],
    f: &[f64],
    fs: [usize; 4],
    p: [usize; 2],
    s: [usize; 2],
    g: [usize; 2],
) -> (Vec<usize>, Vec<(f64, f64)>) {
    let [n, c, h, w] = xs;
    let [o, _, kh, kw] = fs;
    let oh = (h + 2 * p[0] - (kh - 1) * g[0] - 1) / s[0] + 1;
    let ow = (w + 2 * p[1] - (kw - 1) * g[1] - 1) / s[1] + 1;
    let mut out = Vec::new();
    for b in 0..n {
        for q in 0..o {
            for i in 0..oh {
                for j in 0..ow {
                    let (mut acc, mut mag) = (0.0, 0.0);
                    for ch in 0..c {
                        for a in 0..kh {
                            for e in 0..kw {
                                let (y, z) = (
                                    (i * s[0] + a * g[0]) as i64 - p[0] as i64,
                                    (j * s[1] + e * g[1]) as i64 - p[1] as i64,
                                );
                                if y < 0 || z < 0 || y >= h as i64 || z >= w as i64 {
                                    continue;
                                }
                                let xv = x[((b * c + ch) * h + y as usize) * w + z as usize];
                                let fv = f[((q * c + ch) * kh + a) * kw + e];
                                acc += xv * fv;
                                mag += (xv * fv).abs();
                            }
                        }
                    }
                    out.push((acc, mag));
                }
            }
        }
    }
    (vec![n, o, oh, ow], out)
}

/// The convolution as a reduction: the windows of the padded input `[n, 1, oh, ow, 1, c, kh, kw]`
/// times the filter viewed as `[1, o, 1, 1, 1, c, kh, kw]`, summed over the window's axes.
#[allow(clippy::too_many_arguments)]
fn conv<T: nx_kernels::Element>(
    h: &Host,
    x: &Array<T>,
    f: &Array<T>,
    p: [usize; 2],
    s: [usize; 2],
    g: [usize; 2],
    out: &[usize],
) -> (Answer, Array<T>) {
    let [c, kh, kw] = [f.shape()[1], f.shape()[2], f.shape()[3]];
    let o = f.shape()[0];
    let pad = Pad::edges(&[0, 0, p[0] as isize, p[1] as isize], &[0, 0, p[0] as isize, p[1] as isize]);
    let win = Windows { size: vec![1, c, kh, kw], stride: vec![1, 1, s[0], s[1]], dilation: vec![1, 1, g[0], g[1]] };
    let fv = f.apply(&Move::Reshape(vec![1, o, 1, 1, 1, c, kh, kw])).unwrap().unwrap();
    let loop_shape = [out[0], o, out[2], out[3], 1, c, kh, kw];
    let mut prog = Prog::new(&[T::DTYPE, T::DTYPE]);
    let (a, b) = (prog.load(0), prog.load(1));
    let m = prog.mul(a, b);
    prog.output(m);
    let dst = Array::<T>::zeros(DEV, out).unwrap();
    let loads = [Load::padded(x, &pad, Value::Float(0.0), Some(&win)), Load::Plain(&fv)];
    let answer = h.reduce_loads(&prog, &loop_shape, &[4, 5, 6, 7], &[Reduction::Sum], &[&dst], &loads);
    (answer, dst)
}

#[test]
fn convolutions_are_sums_of_windowed_products_within_the_sum_bound() {
    for (xs, fs, p, s, g) in [
        ([2, 3, 9, 7], [4, 3, 3, 2], [1, 1], [2, 1], [1, 2]),
        ([1, 1, 5, 5], [1, 1, 5, 5], [2, 2], [1, 1], [1, 1]),
        ([3, 5, 17, 1], [2, 5, 4, 1], [0, 0], [3, 1], [2, 1]),
        ([1, 64, 6, 6], [3, 64, 3, 3], [1, 1], [1, 1], [1, 1]),
    ] {
        let xn: usize = xs.iter().product();
        let fnn: usize = fs.iter().product();
        let x64: Vec<f64> = (0..xn).map(|k| ((k as f64) * 0.731).sin()).collect();
        let f64s: Vec<f64> = (0..fnn).map(|k| ((k as f64) * 1.37).cos()).collect();
        let (out, want) = naive_conv(&x64, xs, &f64s, fs, p, s, g);
        let k = fs[1] * fs[2] * fs[3];
        // f64: the naive sum and the kernel's differ by rounding alone
        let x = Array::from_vec(DEV, &xs, x64.clone()).unwrap();
        let f = Array::from_vec(DEV, &fs, f64s.clone()).unwrap();
        let (answer, d) = conv(&Host::new(), &x, &f, p, s, g, &out);
        assert_eq!(answer, Answer::Done);
        let u = f64::EPSILON / 2.0;
        for (gv, (w, mag)) in d.to_vec().unwrap().iter().zip(&want) {
            assert!((gv - w).abs() <= 2.0 * k as f64 * u * mag, "f64 {gv} vs {w}");
        }
        // f32 against the f64 values of its own inputs, on 1, 2 and 8 threads with one set of bits
        let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
        let f32s: Vec<f32> = f64s.iter().map(|&v| v as f32).collect();
        let (_, want32) = naive_conv(
            &x32.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            xs,
            &f32s.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            fs,
            p,
            s,
            g,
        );
        let x = strided(&xs, &x32);
        let f = Array::from_vec(DEV, &fs, f32s).unwrap();
        let runs: Vec<Vec<u32>> = [1, 2, 8]
            .iter()
            .map(|&t| {
                let (answer, d) = conv(&host(t), &x, &f, p, s, g, &out);
                assert_eq!(answer, Answer::Done);
                d.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        assert_eq!(runs[0], runs[1], "1 and 2 threads");
        assert_eq!(runs[0], runs[2], "1 and 8 threads");
        let u = f64::from(f32::EPSILON) / 2.0;
        for (bits, (w, mag)) in runs[0].iter().zip(&want32) {
            let gv = f64::from(f32::from_bits(*bits));
            assert!((gv - w).abs() <= (k as f64 + 1.0) * u * mag + u * w.abs(), "f32 {gv} vs {w}");
        }
    }
}

#[test]
fn pools_are_reductions_of_windowed_loads() {
    // a 2-D max pool (fill −∞: the padding never wins), its argmax, and the windows' moments
    let (hh, ww) = (11, 8);
    let xs: Vec<f32> = (0..hh * ww).map(|k| ((k * 7919) % 61) as f32 * 0.5 - 15.0).collect();
    let x = strided(&[hh, ww], &xs);
    let pad = Pad::edges(&[1, 0], &[1, 2]);
    let win = Windows { size: vec![3, 2], stride: vec![2, 3], dilation: vec![1, 2] };
    let ls = padded_shape(&pad, Some(&win), &[hh, ww]).unwrap();
    let out = ls[..2].to_vec();
    assert_eq!(out, [6, 3]);
    let mut p = Prog::new(&[Dtype::F32]);
    let l = p.load(0);
    p.output(l);
    let h = Host::new();
    let (mx, am) = (Array::<f32>::zeros(DEV, &out).unwrap(), Array::<i64>::zeros(DEV, &out).unwrap());
    let (mean, var) = (Array::<f32>::zeros(DEV, &out).unwrap(), Array::<f32>::zeros(DEV, &out).unwrap());
    let ninf = Load::padded(&x, &pad, Value::Float(f64::NEG_INFINITY), Some(&win));
    let zero = Load::padded(&x, &pad, Value::Float(0.0), Some(&win));
    let arg = Reduction::Arg(nx_kernels::Extreme::Max);
    assert_eq!(h.reduce_loads(&p, &ls, &[2, 3], &[arg], &[&mx, &am], &[ninf]), Answer::Done);
    assert_eq!(h.reduce_loads(&p, &ls, &[2, 3], &[Reduction::Moments], &[&mean, &var], &[zero]), Answer::Done);
    let (mx, am, mean, var) =
        (mx.to_vec().unwrap(), am.to_vec().unwrap(), mean.to_vec().unwrap(), var.to_vec().unwrap());
    for o in 0..out[0] * out[1] {
        let (i, j) = (o / out[1], o % out[1]);
        let terms: Vec<Option<f64>> = (0..6)
            .map(|t| {
                let (a, b) = (t / 2, t % 2);
                let at = [i * 2 + a, j * 3 + b * 2];
                naive_source(&[hh, ww], &pad, &at).map(|s| f64::from(xs[s[0] * ww + s[1]]))
            })
            .collect();
        let best = terms.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
        let first = terms.iter().position(|t| *t == Some(best)).unwrap();
        assert_eq!(f64::from(mx[o]), best, "max at {o}");
        assert_eq!(am[o], first as i64, "argmax at {o}");
        let zs: Vec<f64> = terms.iter().map(|t| t.unwrap_or(0.0)).collect();
        let m = zs.iter().sum::<f64>() / 6.0;
        let v = zs.iter().map(|z| (z - m) * (z - m)).sum::<f64>() / 6.0;
        assert!((f64::from(mean[o]) - m).abs() <= 1e-5 * (1.0 + m.abs()), "mean at {o}: {} vs {m}", mean[o]);
        assert!((f64::from(var[o]) - v).abs() <= 1e-4 * (1.0 + v), "var at {o}: {} vs {v}", var[o]);
    }
}

/// A library that computes maps and reductions of plain loads only (the trait's defaults for the
/// rest): padded loads are declined, plain ones reach its `map`.
struct PlainOnly(Host);

impl Kernels for PlainOnly {
    fn name(&self) -> &'static str {
        "plain-only"
    }
    fn map(
        &self,
        prog: &Prog,
        shape: &[usize],
        dsts: &[&dyn nx_kernels::Operand],
        loads: &[&dyn nx_kernels::Operand],
    ) -> Answer {
        self.0.map(prog, shape, dsts, loads)
    }
    fn reduce(
        &self,
        prog: &Prog,
        shape: &[usize],
        axes: &[usize],
        reductions: &[Reduction],
        dsts: &[&dyn nx_kernels::Operand],
        loads: &[&dyn nx_kernels::Operand],
    ) -> Answer {
        self.0.reduce(prog, shape, axes, reductions, dsts, loads)
    }
    fn contract(
        &self,
        spec: &nx_kernels::Contraction,
        dst: &dyn nx_kernels::Operand,
        a: &dyn nx_kernels::Operand,
        b: &dyn nx_kernels::Operand,
        init: Option<&dyn nx_kernels::Operand>,
    ) -> Answer {
        self.0.contract(spec, dst, a, b, init)
    }
}

#[test]
fn loads_that_do_not_fit_are_refused_and_libraries_without_them_decline() {
    let h = Host::new();
    let x = Array::from_vec(DEV, &[4, 5], (0..20).map(|k| k as f32).collect()).unwrap();
    let mut p = Prog::new(&[Dtype::F32]);
    let l = p.load(0);
    p.output(l);
    let d = Array::<f32>::zeros(DEV, &[6, 7]).unwrap();
    let edges = Pad::edges(&[1, 1], &[1, 1]);
    let fill = Value::Float(0.0);
    assert_eq!(h.map_loads(&p, &[6, 7], &[&d], &[Load::padded(&x, &edges, fill, None)]), Answer::Done);
    // a padding of another rank, a load that does not broadcast to the loop, windows of another rank
    assert_eq!(h.map_loads(&p, &[6, 7], &[&d], &[Load::padded(&x, &Pad::none(1), fill, None)]), Answer::ShapeMismatch);
    assert_eq!(h.map_loads(&p, &[6, 7], &[&d], &[Load::padded(&x, &Pad::none(2), fill, None)]), Answer::ShapeMismatch);
    let w1 = Windows::new(&[2], &[1]);
    assert_eq!(h.map_loads(&p, &[6, 7], &[&d], &[Load::padded(&x, &edges, fill, Some(&w1))]), Answer::ShapeMismatch);
    assert_eq!(
        h.reduce_loads(&p, &[6, 7], &[1], &[Reduction::Sum], &[&d], &[Load::padded(&x, &edges, fill, None)]),
        Answer::ShapeMismatch,
        "a destination of the loop's shape where the reduction drops an axis"
    );
    let past = x.apply(&Move::Window(Windows::new(&[5, 1], &[1, 1]))).unwrap().unwrap();
    assert_eq!(past.shape(), [0, 5, 5, 1], "a window past its axis: no window, not an error");
    assert!(x.apply(&Move::Window(Windows::new(&[0, 1], &[1, 1]))).is_err(), "an empty window");
    assert!(x.apply(&Move::Window(Windows::new(&[1], &[1]))).is_err(), "windows of another rank");
    // a library without padded loads declines them and computes plain ones
    let plain = PlainOnly(Host::new());
    assert_eq!(plain.map_loads(&p, &[6, 7], &[&d], &[Load::padded(&x, &edges, fill, None)]), Answer::Declined);
    let d2 = Array::<f32>::zeros(DEV, &[4, 5]).unwrap();
    assert_eq!(plain.map_loads(&p, &[4, 5], &[&d2], &[Load::Plain(&x)]), Answer::Done);
    assert_eq!(d2.to_vec().unwrap(), x.to_vec().unwrap());
    let r = Array::<f32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(
        plain.reduce_loads(&p, &[4, 5], &[1], &[Reduction::Sum], &[&r], &[Load::padded(&x, &Pad::none(2), fill, None)]),
        Answer::Declined
    );
}
