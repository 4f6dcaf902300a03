//! The host kernel library against naive references: maps bit for bit, reductions and
//! contractions within their stated bounds, special values, refusals, and thread-count
//! independence.

use half::{bf16, f16};
use nx_kernels::prog::{BinOp, CmpOp, Prog, UnOp};
use nx_kernels::{Answer, Array, Contraction, Dtype, Element, Extreme, Host, Kernels, Move, Operand, Reduction};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// A view of `shape` over a larger buffer: every other element along the last axis, reversed
/// along the first, at an offset — exercising strided, negative and offset layouts.
fn strided<T: Element>(shape: &[usize], f: impl Fn(usize) -> T) -> Array<T> {
    let mut big = shape.to_vec();
    if let Some(l) = big.last_mut() {
        *l = *l * 2 + 1;
    }
    if let Some(f0) = big.first_mut() {
        *f0 += 1;
    }
    let mut k = 0;
    let base = Array::<T>::from_fn(DEV, &big, |_| {
        k += 1;
        f(k * 7919 % 10007)
    })
    .unwrap();
    let mut v = base;
    if !shape.is_empty() {
        let last = shape.len() - 1;
        v = v.apply(&Move::Slice { axis: last, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
        v = v.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
        v = v.apply(&Move::Flip(0)).unwrap().unwrap();
    }
    assert_eq!(v.shape(), shape);
    v
}

fn val(k: usize) -> f32 {
    (k as f32 - 5003.0) / 977.0
}

fn chain_prog(d: Dtype) -> Prog {
    let mut p = Prog::new(&[d, d, d]);
    let (a, x, b) = (p.load(0), p.load(1), p.load(2));
    let ax = p.mul(a, x);
    let y = p.add(ax, b);
    let zero = p.float(0.0);
    let z = p.max(y, zero);
    p.output(y);
    p.output(z);
    p
}

#[test]
fn fused_chain_is_bit_exact_on_strided_and_broadcast_operands() {
    let host = Host::new();
    for shape in [vec![], vec![0], vec![7], vec![3, 5], vec![4, 1, 9], vec![33, 65]] {
        let a = strided::<f32>(&shape, val);
        let x = strided::<f32>(&shape, |k| val(k + 1));
        // b broadcast along every axis but the last
        let b_shape: Vec<usize> = shape.last().map(|&n| vec![n]).unwrap_or_default();
        let b = Array::<f32>::from_fn(DEV, &b_shape, |i| i.first().map_or(0.5, |&j| j as f32 - 2.0)).unwrap();
        let y = Array::<f32>::zeros(DEV, &shape).unwrap();
        let z = Array::<f32>::zeros(DEV, &shape).unwrap();
        assert_eq!(host.map(&chain_prog(Dtype::F32), &shape, &[&y, &z], &[&a, &x, &b]), Answer::Done);
        let bw = b.apply(&Move::Expand(shape.clone())).unwrap().unwrap();
        let (av, xv, bv) = (a.to_vec().unwrap(), x.to_vec().unwrap(), bw.to_vec().unwrap());
        let want_y: Vec<f32> = (0..av.len()).map(|i| av[i] * xv[i] + bv[i]).collect();
        let want_z: Vec<f32> = want_y.iter().map(|&v| if v > 0.0 { v } else { 0.0 }).collect();
        assert_eq!(y.to_vec().unwrap(), want_y, "shape {shape:?}");
        assert_eq!(z.to_vec().unwrap(), want_z, "shape {shape:?}");
    }
}

/// Every unary op of real floats.
const REAL_UNARY: [UnOp; 14] = [
    UnOp::Neg,
    UnOp::Abs,
    UnOp::Exp,
    UnOp::Log,
    UnOp::Sqrt,
    UnOp::Rsqrt,
    UnOp::Tanh,
    UnOp::Sigmoid,
    UnOp::Sin,
    UnOp::Cos,
    UnOp::Erf,
    UnOp::Recip,
    UnOp::Floor,
    UnOp::Ceil,
];

/// Values with every special case among ordinary ones.
fn specials(k: usize) -> f64 {
    const S: [f64; 8] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1.0, -1.0, 1e-310];
    if k.is_multiple_of(11) {
        S[(k / 11) % S.len()]
    } else {
        (k as f64 - 5003.0) / 97.0
    }
}

fn same_bits<T: Element + Copy + PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let nan = |v: &T| matches!(v.to_value(), nx_kernels::Value::Float(f) if f.is_nan());
        assert!(g == w && format!("{g:?}") == format!("{w:?}") || nan(g) && nan(w), "{what} at {i}: {g:?} vs {w:?}");
    }
}

/// Contiguous operands of one float dtype run through the lane-fused evaluator; the same values
/// through strided views run through the register evaluator: every unary and binary op, and a
/// chain with constants and two outputs, give the same bits on both — at lengths around the lane
/// count and a task, and past the streaming-store threshold.
#[test]
fn lane_fused_maps_match_the_register_evaluator_bit_for_bit() {
    let host = Host::new();
    let binary = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Pow, BinOp::Max, BinOp::Min];
    macro_rules! go {
        ($t:ty, $d:expr, $n:expr, $progs:expr) => {{
            let n: usize = $n;
            let fx = |k: usize| specials(k) as $t;
            let fy = |k: usize| specials(k * 3 + 5) as $t;
            let xs: Vec<$t> = (0..n).map(fx).collect();
            let ys: Vec<$t> = (0..n).map(fy).collect();
            let (x, y) = (
                Array::<$t>::from_vec(DEV, &[n], xs.clone()).unwrap(),
                Array::<$t>::from_vec(DEV, &[n], ys.clone()).unwrap(),
            );
            // the same values, every other element of a larger buffer
            let wide = |v: &[$t]| {
                let big: Vec<$t> = v.iter().flat_map(|&e| [e, 0.0]).collect();
                let b = Array::<$t>::from_vec(DEV, &[2 * n], big).unwrap();
                b.apply(&Move::Slice { axis: 0, start: Some(0), stop: None, step: 2 }).unwrap().unwrap()
            };
            let (xw, yw) = (wide(&xs), wide(&ys));
            for (name, p) in $progs {
                let outs = p.outputs();
                let fused: Vec<Array<$t>> = (0..outs).map(|_| Array::<$t>::zeros(DEV, &[n]).unwrap()).collect();
                let plain: Vec<Array<$t>> = (0..outs).map(|_| Array::<$t>::zeros(DEV, &[n]).unwrap()).collect();
                let f: Vec<&dyn Operand> = fused.iter().map(|a| a as &dyn Operand).collect();
                let q: Vec<&dyn Operand> = plain.iter().map(|a| a as &dyn Operand).collect();
                assert_eq!(host.map(&p, &[n], &f, &[&x, &y]), Answer::Done);
                assert_eq!(host.map(&p, &[n], &q, &[&xw, &yw]), Answer::Done);
                for (a, b) in fused.iter().zip(&plain) {
                    same_bits(&a.to_vec().unwrap(), &b.to_vec().unwrap(), &format!("{name} over {n} {}", $d));
                }
            }
        }};
    }
    let progs = |d: Dtype| {
        let mut v = Vec::new();
        for op in REAL_UNARY {
            let mut p = Prog::new(&[d, d]);
            let l = p.load(0);
            let u = p.unary(op, l);
            p.output(u);
            v.push((format!("{op:?}"), p));
        }
        for op in binary {
            let mut p = Prog::new(&[d, d]);
            let (a, b) = (p.load(0), p.load(1));
            let u = p.binary(op, a, b);
            p.output(u);
            v.push((format!("{op:?}"), p));
        }
        // a chain with a constant, a weak scalar, a load as an output and two computed outputs
        let mut p = Prog::new(&[d, d]);
        let (a, b) = (p.load(0), p.load(1));
        let c = p.float(0.25);
        let ab = p.mul(a, b);
        let s = p.add(ab, c);
        let t = p.unary(UnOp::Tanh, s);
        let m = p.max(t, b);
        p.output(m);
        p.output(a);
        p.output(s);
        v.push(("chain".into(), p));
        v
    };
    // around the lane count (128) and a task (2^16)
    for n in [0, 1, 63, 127, 128, 129, 128 * 5 + 13, (1 << 16) + 128 * 3 + 1] {
        go!(f32, Dtype::F32, n, progs(Dtype::F32));
        go!(f64, Dtype::F64, n, progs(Dtype::F64));
    }
    // three outputs of 4 MiB and more: streaming stores
    let big = (1 << 20) + 77;
    go!(f32, Dtype::F32, big, progs(Dtype::F32).into_iter().filter(|(n, _)| n == "chain"));
}

/// Contiguous runs of halves load and store through bulk loops (no `memcpy`, no per-element
/// dispatch): every bf16 and f16 bit pattern widens to the scalar conversion's bits, and f32 values
/// around every bf16 and f16 rounding boundary (ties, ±∞, NaNs with payloads, subnormals) narrow to
/// `f32_to_bf16`'s and `f32_to_f16`'s — over lengths of several blocks and a short tail.
#[test]
fn half_runs_convert_as_the_scalar_conversions_bit_for_bit() {
    use nx_kernels::dtype::convert::{f32_to_bf16, f32_to_f16};
    let host = Host::new();
    let cast = |from: Dtype, to: Dtype| {
        let mut p = Prog::new(&[from]);
        let l = p.load(0);
        let c = p.cast(l, to);
        p.output(c);
        p
    };
    let patterns: Vec<u16> = (0..=u16::MAX).chain(0..77).collect();
    let n = patterns.len();
    let out = Array::<f32>::zeros(DEV, &[n]).unwrap();
    let b = Array::<bf16>::from_vec(DEV, &[n], patterns.iter().map(|&h| bf16::from_bits(h)).collect()).unwrap();
    assert_eq!(host.map(&cast(Dtype::BF16, Dtype::F32), &[n], &[&out], &[&b]), Answer::Done);
    for (&h, got) in patterns.iter().zip(out.to_vec().unwrap()) {
        assert_eq!(got.to_bits(), bf16::from_bits(h).to_f32().to_bits(), "bf16 {h:#06x}");
    }
    let f = Array::<f16>::from_vec(DEV, &[n], patterns.iter().map(|&h| f16::from_bits(h)).collect()).unwrap();
    assert_eq!(host.map(&cast(Dtype::F16, Dtype::F32), &[n], &[&out], &[&f]), Answer::Done);
    for (&h, got) in patterns.iter().zip(out.to_vec().unwrap()) {
        assert_eq!(got.to_bits(), f16::from_bits(h).to_f32().to_bits(), "f16 {h:#06x}");
    }
    // f32s at and around each bf16 (high half) and f16 boundary, NaN payloads included
    let xs: Vec<f32> = (0..=u16::MAX)
        .flat_map(|h| {
            let base = u32::from(h) << 16;
            [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1000, 0x2000].map(move |low| f32::from_bits(base | low))
        })
        .collect();
    let n = xs.len();
    let x = Array::<f32>::from_vec(DEV, &[n], xs.clone()).unwrap();
    let ob = Array::<bf16>::zeros(DEV, &[n]).unwrap();
    let of = Array::<f16>::zeros(DEV, &[n]).unwrap();
    assert_eq!(host.map(&cast(Dtype::F32, Dtype::BF16), &[n], &[&ob], &[&x]), Answer::Done);
    assert_eq!(host.map(&cast(Dtype::F32, Dtype::F16), &[n], &[&of], &[&x]), Answer::Done);
    for ((&x, gb), gf) in xs.iter().zip(ob.to_vec().unwrap()).zip(of.to_vec().unwrap()) {
        assert_eq!(gb.to_bits(), f32_to_bf16(x).to_bits(), "f32 {:#010x} to bf16", x.to_bits());
        assert_eq!(gf.to_bits(), f32_to_f16(x).to_bits(), "f32 {:#010x} to f16", x.to_bits());
    }
    // a difference computed in f32 and stored as a half: NaNs of either sign and any payload (∞ − ∞,
    // NaN operands) narrow to the one quiet NaN
    let n = patterns.len();
    let sub = |d: Dtype| {
        let mut p = Prog::new(&[d, d]);
        let (a, b) = (p.load(0), p.load(1));
        let s = p.sub(a, b);
        p.output(s);
        p
    };
    let (pb, pf) = (sub(Dtype::BF16), sub(Dtype::F16));
    let rev = |h: u16| h.rotate_left(7) ^ 0x7C00;
    let (b2, f2) = (
        Array::<bf16>::from_vec(DEV, &[n], patterns.iter().map(|&h| bf16::from_bits(rev(h))).collect()).unwrap(),
        Array::<f16>::from_vec(DEV, &[n], patterns.iter().map(|&h| f16::from_bits(rev(h))).collect()).unwrap(),
    );
    let (ob, of) = (Array::<bf16>::zeros(DEV, &[n]).unwrap(), Array::<f16>::zeros(DEV, &[n]).unwrap());
    assert_eq!(host.map(&pb, &[n], &[&ob], &[&b, &b2]), Answer::Done);
    assert_eq!(host.map(&pf, &[n], &[&of], &[&f, &f2]), Answer::Done);
    for (k, &h) in patterns.iter().enumerate() {
        let wb = f32_to_bf16(bf16::from_bits(h).to_f32() - bf16::from_bits(rev(h)).to_f32());
        let wf = f32_to_f16(f16::from_bits(h).to_f32() - f16::from_bits(rev(h)).to_f32());
        assert_eq!(ob.get(&[k]).unwrap().to_bits(), wb.to_bits(), "bf16 {h:#06x} - {:#06x}", rev(h));
        assert_eq!(of.get(&[k]).unwrap().to_bits(), wf.to_bits(), "f16 {h:#06x} - {:#06x}", rev(h));
    }
}

#[test]
fn halves_compute_in_f32_and_round_once() {
    let host = Host::new();
    for d in [Dtype::F16, Dtype::BF16] {
        let n = 3000;
        macro_rules! go {
            ($t:ty, $down:expr) => {{
                let a = Array::<$t>::from_fn(DEV, &[n], |i| <$t>::from_f32(val(i[0] * 3))).unwrap();
                let x = Array::<$t>::from_fn(DEV, &[n], |i| <$t>::from_f32(val(i[0] * 5 + 1))).unwrap();
                let b = Array::<$t>::from_fn(DEV, &[n], |i| <$t>::from_f32(val(i[0] + 2))).unwrap();
                let (y, z) = (Array::<$t>::zeros(DEV, &[n]).unwrap(), Array::<$t>::zeros(DEV, &[n]).unwrap());
                assert_eq!(host.map(&chain_prog(d), &[n], &[&y, &z], &[&a, &x, &b]), Answer::Done);
                let (av, xv, bv) = (a.to_vec().unwrap(), x.to_vec().unwrap(), b.to_vec().unwrap());
                for i in 0..n {
                    let f = av[i].to_f32() * xv[i].to_f32() + bv[i].to_f32();
                    assert_eq!(y.get(&[i]).unwrap().to_bits(), $down(f).to_bits(), "{d} at {i}");
                }
            }};
        }
        match d {
            Dtype::F16 => go!(f16, nx_kernels::dtype::convert::f32_to_f16),
            _ => go!(bf16, nx_kernels::dtype::convert::f32_to_bf16),
        }
    }
}

#[test]
fn integers_wrap_casts_saturate_and_coords_count() {
    let host = Host::new();
    let a = Array::<i8>::from_vec(DEV, &[4], vec![100, -128, 7, 0]).unwrap();
    let mut p = Prog::new(&[Dtype::I8]);
    let x = p.load(0);
    let two = p.int(2);
    let y = p.mul(x, two);
    let zero = p.int(0);
    let q = p.div(x, zero);
    p.output(y);
    p.output(q);
    let (y, q) = (Array::<i8>::zeros(DEV, &[4]).unwrap(), Array::<i8>::zeros(DEV, &[4]).unwrap());
    assert_eq!(host.map(&p, &[4], &[&y, &q], &[&a]), Answer::Done);
    assert_eq!(y.to_vec().unwrap(), [-56, 0, 14, 0], "i8 wrapping");
    assert_eq!(q.to_vec().unwrap(), [0, 0, 0, 0], "integer division by 0 is 0, never a trap");

    let f = Array::<f32>::from_vec(DEV, &[3], vec![300.7, -1e9, f32::NAN]).unwrap();
    let mut p = Prog::new(&[Dtype::F32]);
    let l = p.load(0);
    let c = p.cast(l, Dtype::I8);
    p.output(c);
    let out = Array::<i32>::zeros(DEV, &[3]).unwrap();
    assert_eq!(host.map(&p, &[3], &[&out], &[&f]), Answer::Done);
    assert_eq!(out.to_vec().unwrap(), [127, -128, 0]);

    let mut p = Prog::new(&[]);
    let (r, c) = (p.coord(0), p.coord(1));
    let ten = p.int(10);
    let rt = p.mul(r, ten);
    let v = p.add(rt, c);
    let big = p.int(20);
    let cmp = p.compare(CmpOp::Gt, v, big);
    let neg = p.int(-1);
    let s = p.select(cmp, neg, v);
    p.output(s);
    let out = Array::<i64>::zeros(DEV, &[3, 4]).unwrap();
    assert_eq!(host.map(&p, &[3, 4], &[&out], &[]), Answer::Done);
    assert_eq!(out.to_vec().unwrap(), [0, 1, 2, 3, 10, 11, 12, 13, 20, -1, -1, -1]);
}

#[test]
fn map_refusals() {
    let host = Host::new();
    let a = Array::<f32>::from_vec(DEV, &[4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let out = Array::<f32>::zeros(DEV, &[4]).unwrap();
    let p = chain_prog(Dtype::F32);
    // the program loads three operands and writes two outputs
    assert_eq!(host.map(&p, &[4], &[&out], &[&a, &a, &a]), Answer::ShapeMismatch);
    let i = Array::<i32>::zeros(DEV, &[4]).unwrap();
    assert_eq!(host.map(&p, &[4], &[&out, &out.copy().unwrap()], &[&a, &i, &a]), Answer::WrongDtype);
    let r = nx_kernels::map_refusal(&p, 1, &[Dtype::F32, Dtype::F32], &[Dtype::F32, Dtype::I32, Dtype::F32]).unwrap();
    assert_eq!(r.1, "load 1 is i32, the program loads f32");
    // a type error in the program
    let mut bad = Prog::new(&[Dtype::C64]);
    let c = bad.load(0);
    let m = bad.max(c, c);
    bad.output(m);
    let r = nx_kernels::map_refusal(&bad, 1, &[Dtype::C64], &[Dtype::C64]).unwrap();
    assert_eq!(r, (Answer::WrongDtype, "Max takes real operands, got c64".to_string()));
    // a load that does not broadcast, a destination of the wrong shape
    let mut p1 = Prog::new(&[Dtype::F32]);
    let l = p1.load(0);
    let e = p1.unary(UnOp::Exp, l);
    p1.output(e);
    let three = Array::<f32>::zeros(DEV, &[3]).unwrap();
    assert_eq!(host.map(&p1, &[4], &[&out], &[&three]), Answer::ShapeMismatch);
    assert_eq!(host.map(&p1, &[3], &[&out], &[&three]), Answer::ShapeMismatch);
    // in place (identical) is allowed; shifted overlap is refused
    assert_eq!(host.map(&p1, &[4], &[&a], &[&a]), Answer::Done);
    let big = Array::<f32>::zeros(DEV, &[5]).unwrap();
    let lo = big.apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(4), step: 1 }).unwrap().unwrap();
    let hi = big.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
    assert_eq!(host.map(&p1, &[4], &[&hi], &[&lo]), Answer::Overlapping);
    // coord past the loop's rank
    let mut pc = Prog::new(&[]);
    let c2 = pc.coord(2);
    pc.output(c2);
    let o = Array::<i64>::zeros(DEV, &[2, 2]).unwrap();
    assert_eq!(host.map(&pc, &[2, 2], &[&o], &[]), Answer::ShapeMismatch);
}

fn sum_prog(d: Dtype) -> Prog {
    let mut p = Prog::new(&[d]);
    let l = p.load(0);
    p.output(l);
    p
}

fn reduce1(host: &Host, r: Reduction, x: &dyn Operand, axes: &[usize], dst: &[&dyn Operand]) -> Answer {
    host.reduce(&sum_prog(x.dtype()), x.layout().shape(), axes, &[r], dst, &[x])
}

fn gamma(k: f64, u: f64) -> f64 {
    k * u / (1.0 - k * u)
}

/// The library's stated bound on a Sum of n terms.
fn sum_bound(n: usize, u: f64) -> f64 {
    let c = n.min(2048);
    let p = n.div_ceil(2048).max(1);
    gamma((c.div_ceil(8) + 2) as f64 + (p as f64).log2().ceil(), u)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn reductions_match_the_f64_reference(shape in prop::collection::vec(0usize..40, 1..4), pick in any::<u8>(), seed in any::<u32>()) {
        let host = Host::new();
        let rank = shape.len();
        let axes: Vec<usize> = (0..rank).filter(|a| pick >> a & 1 == 1).collect();
        let x = strided::<f32>(&shape, |k| val(k.wrapping_mul(seed as usize | 1) % 10007) * 3.0);
        let xv = x.to_vec().unwrap();
        let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
        let out_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
        let outs: usize = out_shape.iter().product();
        // reference: group terms by output, in C order
        let mut groups: Vec<Vec<f64>> = vec![Vec::new(); outs];
        for (flat, &v) in xv.iter().enumerate() {
            let mut idx = vec![0; rank];
            let mut r = flat;
            for d in (0..rank).rev() { idx[d] = r % shape[d]; r /= shape[d]; }
            let o = kept.iter().fold(0, |acc, &a| acc * shape[a] + idx[a]);
            groups[o].push(v as f64);
        }
        let sum = Array::<f32>::zeros(DEV, &out_shape).unwrap();
        let (mx, at) = (Array::<f32>::zeros(DEV, &out_shape).unwrap(), Array::<i64>::zeros(DEV, &out_shape).unwrap());
        let (mean, var) = (Array::<f64>::zeros(DEV, &out_shape).unwrap(), Array::<f64>::zeros(DEV, &out_shape).unwrap());
        let lse = Array::<f64>::zeros(DEV, &out_shape).unwrap();
        prop_assert_eq!(reduce1(&host, Reduction::Sum, &x, &axes, &[&sum]), Answer::Done);
        let arg = reduce1(&host, Reduction::Arg(Extreme::Max), &x, &axes, &[&mx, &at]);
        prop_assert_eq!(reduce1(&host, Reduction::Moments, &x, &axes, &[&mean, &var]), Answer::Done);
        prop_assert_eq!(reduce1(&host, Reduction::Logsumexp, &x, &axes, &[&lse]), Answer::Done);
        let terms = groups.first().map_or(0, |g| g.len());
        if terms == 0 && outs > 0 { prop_assert_eq!(arg, Answer::ShapeMismatch); } else { prop_assert_eq!(arg, Answer::Done); }
        let (sv, mxv, atv, mv, vv, lv) = (sum.to_vec().unwrap(), mx.to_vec().unwrap(), at.to_vec().unwrap(),
            mean.to_vec().unwrap(), var.to_vec().unwrap(), lse.to_vec().unwrap());
        let u32_ = 2f64.powi(-24);
        for (o, g) in groups.iter().enumerate() {
            let exact: f64 = g.iter().sum();
            let abs: f64 = g.iter().map(|v| v.abs()).sum();
            let bound = sum_bound(g.len(), u32_) * abs + exact.abs() * u32_ + 1e-30;
            prop_assert!((sv[o] as f64 - exact).abs() <= bound, "sum {} vs {} (bound {})", sv[o], exact, bound);
            if !g.is_empty() {
                let m = g.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                prop_assert_eq!(mxv[o] as f64, m);
                let first = g.iter().position(|&v| v == m).unwrap();
                prop_assert_eq!(atv[o], first as i64);
                let n = g.len() as f64;
                let mu = exact / n;
                let s2 = g.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
                prop_assert!((mv[o] - mu).abs() <= 1e-12 * (abs / n + 1.0));
                prop_assert!((vv[o] - s2).abs() <= 1e-11 * (s2 + 1.0) && vv[o] >= 0.0);
                let l = m + g.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                prop_assert!((lv[o] - l).abs() <= 1e-12 * (l.abs() + 1.0), "lse {} vs {}", lv[o], l);
            } else {
                prop_assert!(mv[o].is_nan() && vv[o].is_nan());
                prop_assert_eq!(lv[o], f64::NEG_INFINITY);
            }
        }
    }
}

#[test]
fn special_values_of_every_reduction() {
    let host = Host::new();
    let one = |r: Reduction, xs: &[f64]| -> (f64, f64) {
        let x = Array::<f64>::from_vec(DEV, &[xs.len()], xs.to_vec()).unwrap();
        let a = Array::<f64>::zeros(DEV, &[]).unwrap();
        let b = Array::<f64>::zeros(DEV, &[]).unwrap();
        let p = Array::<i64>::zeros(DEV, &[]).unwrap();
        let dsts: Vec<&dyn Operand> = match r {
            Reduction::Moments => vec![&a, &b],
            Reduction::Arg(_) => vec![&a, &p],
            _ => vec![&a],
        };
        assert_eq!(reduce1(&host, r, &x, &[0], &dsts), Answer::Done, "{r:?} {xs:?}");
        let second = if matches!(r, Reduction::Arg(_)) { p.get(&[]).unwrap() as f64 } else { b.get(&[]).unwrap() };
        (a.get(&[]).unwrap(), second)
    };
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    // Sum: -0 terms give +0; NaN propagates; +inf + -inf is NaN; empty is +0
    assert_eq!(one(Reduction::Sum, &[-0.0, -0.0]).0.to_bits(), 0f64.to_bits());
    assert!(one(Reduction::Sum, &[1.0, nan]).0.is_nan());
    assert!(one(Reduction::Sum, &[inf, -inf]).0.is_nan());
    assert_eq!(one(Reduction::Sum, &[]).0.to_bits(), 0);
    // Prod: empty is 1; -0 · 1 stays -0 (from the first term, never by 1)
    assert_eq!(one(Reduction::Prod, &[]).0, 1.0);
    assert_eq!(one(Reduction::Prod, &[-0.0]).0.to_bits(), (-0f64).to_bits());
    // Max/Min: NaN propagates; -0 below +0; empty is the identity
    assert!(one(Reduction::Max, &[1.0, nan, 3.0]).0.is_nan());
    assert_eq!(one(Reduction::Max, &[-0.0, 0.0]).0.to_bits(), 0f64.to_bits());
    assert_eq!(one(Reduction::Min, &[0.0, -0.0]).0.to_bits(), (-0f64).to_bits());
    assert_eq!(one(Reduction::Max, &[]).0, -inf);
    assert_eq!(one(Reduction::Min, &[]).0, inf);
    // Arg: the first extreme with its bits; the first NaN
    assert_eq!(one(Reduction::Arg(Extreme::Max), &[1.0, 3.0, 3.0]).1, 1.0);
    assert_eq!(one(Reduction::Arg(Extreme::Max), &[-0.0, 0.0, 0.0]).1, 1.0);
    assert_eq!(one(Reduction::Arg(Extreme::Min), &[0.0, -0.0, -0.0]).1, 1.0);
    assert_eq!(one(Reduction::Arg(Extreme::Max), &[1.0, nan, 5.0, nan]).1, 1.0);
    let many: Vec<f64> = (0..1000).map(|i| if i == 700 || i > 900 { 9.0 } else { 1.0 }).collect();
    assert_eq!(one(Reduction::Arg(Extreme::Max), &many).1, 700.0, "across chunks, the first");
    // Logsumexp
    assert_eq!(one(Reduction::Logsumexp, &[]).0, -inf);
    assert_eq!(one(Reduction::Logsumexp, &[-inf, -inf]).0, -inf);
    assert_eq!(one(Reduction::Logsumexp, &[1.0, inf]).0, inf);
    assert!(one(Reduction::Logsumexp, &[inf, nan]).0.is_nan());
    assert!((one(Reduction::Logsumexp, &[1000.0, 1000.0]).0 - (1000.0 + 2f64.ln())).abs() < 1e-12);
    // Moments
    let (m, v) = one(Reduction::Moments, &[]);
    assert!(m.is_nan() && v.is_nan());
    let (m, v) = one(Reduction::Moments, &[1.0, inf]);
    assert!(m == inf && v.is_nan());
    let (m, v) = one(Reduction::Moments, &[-inf, inf]);
    assert!(m.is_nan() && v.is_nan());
    let (m, v) = one(Reduction::Moments, &[1e8 + 1.0, 1e8 + 2.0, 1e8 + 3.0]);
    assert!((m - (1e8 + 2.0)).abs() < 1e-6 && (v - 2.0 / 3.0).abs() < 1e-6, "{m} {v}");
    let (_, v) = one(Reduction::Moments, &vec![0.1; 1000]);
    assert!(v >= 0.0, "never negative");
}

#[test]
fn integer_and_boolean_reductions() {
    let host = Host::new();
    let x = Array::<i8>::from_vec(DEV, &[4], vec![100, 100, 100, -3]).unwrap();
    let s = Array::<i8>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Sum, &x, &[0], &[&s]), Answer::Done);
    assert_eq!(s.get(&[]).unwrap(), (297i32 as i8), "wraps in i8");
    let b = Array::<bool>::from_vec(DEV, &[3], vec![false, true, false]).unwrap();
    let any = Array::<bool>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Max, &b, &[0], &[&any]), Answer::Done);
    assert!(any.get(&[]).unwrap());
    assert_eq!(reduce1(&host, Reduction::Sum, &b, &[0], &[&any]), Answer::WrongDtype);
    let f = Array::<f32>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Logsumexp, &x, &[0], &[&f]), Answer::WrongDtype);
    let wrong = Array::<i32>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Arg(Extreme::Min), &x, &[0], &[&s, &wrong]), Answer::WrongDtype);
    assert_eq!(reduce1(&host, Reduction::Sum, &x, &[0], &[&s, &s]), Answer::ShapeMismatch);
    assert_eq!(reduce1(&host, Reduction::Sum, &x, &[1], &[&s]), Answer::ShapeMismatch);
    let c = Array::<num_complex::Complex32>::zeros(DEV, &[3]).unwrap();
    let cs = Array::<num_complex::Complex32>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Max, &c, &[0], &[&cs]), Answer::Declined);
    assert_eq!(reduce1(&host, Reduction::Sum, &c, &[0], &[&cs]), Answer::Done);
    let empty = Array::<f32>::zeros(DEV, &[0]).unwrap();
    let p = Array::<i64>::zeros(DEV, &[]).unwrap();
    assert_eq!(reduce1(&host, Reduction::Arg(Extreme::Max), &empty, &[0], &[&f, &p]), Answer::ShapeMismatch);
}

/// The association the module documentation states for a `Sum`: chunks of 2048 terms, term `i`
/// into lane `i mod 8`, the lanes as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then a pairwise tree
/// over the chunks (the first half rounded up to a power of two, then the rest).
fn documented_sum(xs: &[f32]) -> f32 {
    fn tree(ps: &[f32]) -> f32 {
        match ps.len() {
            0 => 0.0,
            1 => ps[0],
            n => {
                let h = n.next_power_of_two() / 2;
                tree(&ps[..h]) + tree(&ps[h..])
            }
        }
    }
    let chunks: Vec<f32> = xs
        .chunks(2048)
        .map(|c| {
            let mut l = [0f32; 8];
            for (i, &x) in c.iter().enumerate() {
                l[i % 8] += x;
            }
            ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
        })
        .collect();
    tree(&chunks)
}

/// A whole-array sum, and two sums of one program in one call, are the documented association
/// bit for bit: from one chunk to many blocks of chunks, on 1 and 3 threads.
#[test]
fn sums_follow_the_documented_association_exactly() {
    for threads in [1, 3] {
        let host = Host::with_threads(threads).unwrap();
        for n in [1, 2047, 2048, 2049, 2048 * 16, 2048 * 16 + 1, 2048 * 37 + 5, 2048 * 200 + 3] {
            let xs: Vec<f32> = (0..n).map(|k| val(k * 13 % 10007) * 1.0e3).collect();
            let x = Array::<f32>::from_vec(DEV, &[n], xs.clone()).unwrap();
            let mut p = Prog::new(&[Dtype::F32]);
            let l = p.load(0);
            let sq = p.mul(l, l);
            p.output(l);
            p.output(sq);
            let (s, q) = (Array::<f32>::zeros(DEV, &[]).unwrap(), Array::<f32>::zeros(DEV, &[]).unwrap());
            let r = host.reduce(&p, &[n], &[0], &[Reduction::Sum, Reduction::Sum], &[&s, &q], &[&x]);
            assert_eq!(r, Answer::Done);
            let squares: Vec<f32> = xs.iter().map(|v| v * v).collect();
            assert_eq!(s.get(&[]).unwrap().to_bits(), documented_sum(&xs).to_bits(), "sum of {n}");
            assert_eq!(q.get(&[]).unwrap().to_bits(), documented_sum(&squares).to_bits(), "squares of {n}");
            let all = Array::<f32>::zeros(DEV, &[]).unwrap();
            assert_eq!(reduce1(&host, Reduction::Sum, &x, &[0], &[&all]), Answer::Done);
            assert_eq!(all.get(&[]).unwrap().to_bits(), documented_sum(&xs).to_bits(), "alone, {n}");
            // rows summed in parallel, each row's chunks typed in one run (more rows than 2 threads)
            if n <= 2048 * 37 + 5 {
                let rows = 7;
                let m: Vec<f32> = (0..rows * n).map(|k| val(k * 7 % 10009) * 1.0e3).collect();
                let a = Array::<f32>::from_vec(DEV, &[rows, n], m.clone()).unwrap();
                let out = Array::<f32>::zeros(DEV, &[rows]).unwrap();
                assert_eq!(reduce1(&host, Reduction::Sum, &a, &[1], &[&out]), Answer::Done);
                for (r, got) in out.to_vec().unwrap().into_iter().enumerate() {
                    let want = documented_sum(&m[r * n..(r + 1) * n]);
                    assert_eq!(got.to_bits(), want.to_bits(), "row {r} of {rows}x{n}, {threads} threads");
                }
            }
        }
    }
}

#[test]
fn the_same_bits_with_1_2_and_8_threads() {
    let x = strided::<f32>(&[301, 1031], |k| val(k) * 1.0e3);
    let m = Array::<f32>::from_fn(DEV, &[257, 300], |i| val(i[0] * 300 + i[1])).unwrap();
    let w = Array::<f32>::from_fn(DEV, &[300, 513], |i| val(i[0] + i[1] * 7)).unwrap();
    // a contracting axis past the product's cache blocks, and a batch
    let long_a = Array::<f32>::from_fn(DEV, &[3, 65, 2100], |i| val(i[0] * 7 + i[1] * 2100 + i[2])).unwrap();
    let long_b = Array::<f32>::from_fn(DEV, &[3, 2100, 67], |i| val(i[0] + i[1] * 67 + i[2] * 3)).unwrap();
    let mut runs = Vec::new();
    for threads in [1, 2, 8] {
        let host = Host::with_threads(threads).unwrap();
        let all = Array::<f32>::zeros(DEV, &[]).unwrap();
        let rows = Array::<f32>::zeros(DEV, &[301]).unwrap();
        let cols = Array::<f32>::zeros(DEV, &[1031]).unwrap();
        let (mean, var) = (Array::<f32>::zeros(DEV, &[]).unwrap(), Array::<f32>::zeros(DEV, &[]).unwrap());
        assert_eq!(reduce1(&host, Reduction::Sum, &x, &[0, 1], &[&all]), Answer::Done);
        assert_eq!(reduce1(&host, Reduction::Sum, &x, &[1], &[&rows]), Answer::Done);
        assert_eq!(reduce1(&host, Reduction::Sum, &x, &[0], &[&cols]), Answer::Done);
        assert_eq!(reduce1(&host, Reduction::Moments, &x, &[0, 1], &[&mean, &var]), Answer::Done);
        let mm = Array::<f32>::zeros(DEV, &[257, 513]).unwrap();
        assert_eq!(host.contract(&Contraction::matmul(0), &mm, &m, &w, None), Answer::Done);
        let long = Array::<f32>::zeros(DEV, &[3, 65, 67]).unwrap();
        assert_eq!(host.contract(&Contraction::matmul(1), &long, &long_a, &long_b, None), Answer::Done);
        let bits = |a: &Array<f32>| a.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        runs.push([bits(&all), bits(&rows), bits(&cols), bits(&mean), bits(&var), bits(&mm), bits(&long)]);
    }
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

/// Naive f64 contraction of C-order data [b, m, k] · [b, k, n].
fn naive(a: &[f64], b: &[f64], (bt, m, k, n): (usize, usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; bt * m * n];
    let mut mag = vec![0.0; bt * m * n];
    for z in 0..bt {
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let (x, y) = (a[z * m * k + i * k + p], b[z * k * n + p * n + j]);
                    out[z * m * n + i * n + j] += x * y;
                    mag[z * m * n + i * n + j] += (x * y).abs();
                }
            }
        }
    }
    (out, mag)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6000))]

    #[test]
    fn matmuls_match_the_f64_reference(bt in 1usize..3, m in 0usize..40, k in 0usize..70, n in 0usize..40, transpose in any::<bool>(), with_init in any::<bool>()) {
        let host = Host::new();
        let a = Array::<f32>::from_fn(DEV, &[bt, m, k], |i| val(i[0] * 31 + i[1] * 7 + i[2] * 3)).unwrap();
        // b given transposed in memory: its [b, k, n] view is strided
        let b = if transpose {
            let bt_ = Array::<f32>::from_fn(DEV, &[bt, n, k], |i| val(i[0] + i[1] * 5 + i[2] * 11)).unwrap();
            bt_.apply(&Move::Permute(vec![0, 2, 1])).unwrap().unwrap()
        } else {
            Array::<f32>::from_fn(DEV, &[bt, k, n], |i| val(i[0] + i[2] * 5 + i[1] * 11)).unwrap()
        };
        let init = Array::<f32>::from_fn(DEV, &[bt, m, n], |i| val(i[1] + i[2])).unwrap();
        let out = Array::<f32>::zeros(DEV, &[bt, m, n]).unwrap();
        let init_op: Option<&dyn Operand> = if with_init { Some(&init) } else { None };
        prop_assert_eq!(host.contract(&Contraction::matmul(1), &out, &a, &b, init_op), Answer::Done);
        let f = |x: &Array<f32>| x.to_vec().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>();
        let (want, mag) = naive(&f(&a), &f(&b), (bt, m, k, n));
        let iv = f(&init);
        let got = out.to_vec().unwrap();
        let u = 2f64.powi(-24);
        for i in 0..want.len() {
            let (w, g) = if with_init { (want[i] + iv[i], mag[i] + iv[i].abs()) } else { (want[i], mag[i]) };
            let bound = gamma(k as f64 + 1.0, u) * g + w.abs() * u;
            prop_assert!((got[i] as f64 - w).abs() <= bound, "{} vs {} (bound {})", got[i], w, bound);
        }
    }
}

#[test]
fn general_contractions_halves_and_complex() {
    let host = Host::new();
    // a [2, 3, 4, 5] with b [5, 2, 4, 6]: batch (0, 1), contract (2, 2) and (3, 0)
    let a =
        Array::<f64>::from_fn(DEV, &[2, 3, 4, 5], |i| (i[0] * 60 + i[1] * 20 + i[2] * 5 + i[3]) as f64 * 0.01).unwrap();
    let b = Array::<f64>::from_fn(DEV, &[5, 2, 4, 6], |i| {
        i[0] as f64 - i[1] as f64 * 2.0 + i[2] as f64 * 0.5 - i[3] as f64
    })
    .unwrap();
    let spec = Contraction { batch: vec![(0, 1)], contracting: vec![(2, 2), (3, 0)] };
    assert_eq!(spec.shape(a.shape(), b.shape()).unwrap(), [2, 3, 6]);
    let out = Array::<f64>::zeros(DEV, &[2, 3, 6]).unwrap();
    assert_eq!(host.contract(&spec, &out, &a, &b, None), Answer::Done);
    for z in 0..2 {
        for i in 0..3 {
            for j in 0..6 {
                let mut s = 0.0;
                for p in 0..4 {
                    for q in 0..5 {
                        s += a.get(&[z, i, p, q]).unwrap() * b.get(&[q, z, p, j]).unwrap();
                    }
                }
                assert!((out.get(&[z, i, j]).unwrap() - s).abs() < 1e-12 * (1.0 + s.abs()));
            }
        }
    }
    // bf16 operands accumulate in f32 and round once
    let ah = Array::<bf16>::from_fn(DEV, &[17, 300], |i| bf16::from_f32(val(i[0] * 300 + i[1]))).unwrap();
    let bh = Array::<bf16>::from_fn(DEV, &[300, 9], |i| bf16::from_f32(val(i[0] * 9 + i[1] + 1))).unwrap();
    let oh = Array::<bf16>::zeros(DEV, &[17, 9]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &oh, &ah, &bh, None), Answer::Done);
    for i in 0..17 {
        for j in 0..9 {
            let (mut s, mut g) = (0.0f64, 0.0f64);
            for p in 0..300 {
                let x = ah.get(&[i, p]).unwrap().to_f64() * bh.get(&[p, j]).unwrap().to_f64();
                s += x;
                g += x.abs();
            }
            let got = oh.get(&[i, j]).unwrap().to_f64();
            let bound = gamma(301.0, 2f64.powi(-24)) * g + s.abs() * 2f64.powi(-8);
            assert!((got - s).abs() <= bound, "{got} vs {s}");
        }
    }
    // onto an init, batched (two matrices of the 17 x 9 product's shape): each output init's
    // element plus its sum, rounded once
    let a3 = Array::<bf16>::from_fn(DEV, &[2, 17, 300], |i| bf16::from_f32(val(i[0] * 5100 + i[1] * 300 + i[2] + 5)))
        .unwrap();
    let b3 =
        Array::<bf16>::from_fn(DEV, &[2, 300, 9], |i| bf16::from_f32(val(i[0] * 2700 + i[1] * 9 + i[2] + 11))).unwrap();
    let init =
        Array::<bf16>::from_fn(DEV, &[2, 17, 9], |i| bf16::from_f32(val(i[0] * 153 + i[1] * 9 + i[2] + 3) * 8.0))
            .unwrap();
    let o3 = Array::<bf16>::zeros(DEV, &[2, 17, 9]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(1), &o3, &a3, &b3, Some(&init)), Answer::Done);
    for z in 0..2 {
        for i in 0..17 {
            for j in 0..9 {
                let c = init.get(&[z, i, j]).unwrap().to_f64();
                let (mut s, mut g) = (c, c.abs());
                for p in 0..300 {
                    let x = a3.get(&[z, i, p]).unwrap().to_f64() * b3.get(&[z, p, j]).unwrap().to_f64();
                    s += x;
                    g += x.abs();
                }
                let got = o3.get(&[z, i, j]).unwrap().to_f64();
                let bound = gamma(302.0, 2f64.powi(-24)) * g + s.abs() * 2f64.powi(-8);
                assert!((got - s).abs() <= bound, "init, batch {z} ({i}, {j}): {got} vs {s}");
            }
        }
    }
    // bf16 batched, its right operand without a (batch, contracting, free) view: packed first
    let a4 =
        Array::<bf16>::from_fn(DEV, &[2, 3, 4, 5], |i| bf16::from_f32(val(i[0] * 60 + i[1] * 20 + i[2] * 5 + i[3])))
            .unwrap();
    let b4 = Array::<bf16>::from_fn(DEV, &[5, 2, 4, 6], |i| {
        bf16::from_f32(val(i[0] * 48 + i[1] * 24 + i[2] * 6 + i[3] + 7))
    })
    .unwrap();
    let o4 = Array::<bf16>::zeros(DEV, &[2, 3, 6]).unwrap();
    assert_eq!(host.contract(&spec, &o4, &a4, &b4, None), Answer::Done);
    for z in 0..2 {
        for i in 0..3 {
            for j in 0..6 {
                let (mut s, mut g) = (0.0f64, 0.0f64);
                for p in 0..4 {
                    for q in 0..5 {
                        let x = a4.get(&[z, i, p, q]).unwrap().to_f64() * b4.get(&[q, z, p, j]).unwrap().to_f64();
                        s += x;
                        g += x.abs();
                    }
                }
                let got = o4.get(&[z, i, j]).unwrap().to_f64();
                let bound = gamma(21.0, 2f64.powi(-24)) * g + s.abs() * 2f64.powi(-8);
                assert!((got - s).abs() <= bound, "batch {z} ({i}, {j}): {got} vs {s}");
            }
        }
    }
    // complex
    use num_complex::Complex64 as Z;
    let ac = Array::<Z>::from_fn(DEV, &[2, 3], |i| Z::new(i[0] as f64, i[1] as f64 - 1.0)).unwrap();
    let bc = Array::<Z>::from_fn(DEV, &[3, 2], |i| Z::new(1.0 - i[1] as f64, i[0] as f64)).unwrap();
    let oc = Array::<Z>::zeros(DEV, &[2, 2]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &oc, &ac, &bc, None), Answer::Done);
    for i in 0..2 {
        for j in 0..2 {
            let s: Z = (0..3).map(|p| ac.get(&[i, p]).unwrap() * bc.get(&[p, j]).unwrap()).sum();
            assert!((oc.get(&[i, j]).unwrap() - s).norm() < 1e-12);
        }
    }
    // K = 0: init exactly, -0 stays -0; +0 without init
    let e1 = Array::<f32>::zeros(DEV, &[2, 0]).unwrap();
    let e2 = Array::<f32>::zeros(DEV, &[0, 2]).unwrap();
    let init = Array::<f32>::from_vec(DEV, &[2, 2], vec![-0.0, 1.0, f32::NAN, 2.0]).unwrap();
    let o = Array::<f32>::from_vec(DEV, &[2, 2], vec![9.0; 4]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &o, &e1, &e2, Some(&init)), Answer::Done);
    let bits: Vec<u32> = o.to_vec().unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, init.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    assert_eq!(host.contract(&Contraction::matmul(0), &o, &e1, &e2, None), Answer::Done);
    assert!(o.to_vec().unwrap().iter().all(|v| v.to_bits() == 0));
    // refusals
    let i32s = Array::<i32>::zeros(DEV, &[2, 2]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &i32s, &i32s, &i32s, None), Answer::Declined);
    let f64s = Array::<f64>::zeros(DEV, &[2, 2]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &o, &f64s, &o, None), Answer::WrongDtype);
    let o3 = Array::<f32>::zeros(DEV, &[3, 2]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &o, &o3, &o, None), Answer::ShapeMismatch);
    // in place: init identical to dst
    let acc = Array::<f32>::from_vec(DEV, &[2, 2], vec![1.0; 4]).unwrap();
    let eye = Array::<f32>::from_vec(DEV, &[2, 2], vec![1.0, 0.0, 0.0, 1.0]).unwrap();
    assert_eq!(host.contract(&Contraction::matmul(0), &acc, &eye, &eye, Some(&acc.clone())), Answer::Done);
    assert_eq!(acc.to_vec().unwrap(), [2.0, 1.0, 1.0, 2.0]);
    // a destination that is an operand (read at other indices): refused before any write
    assert_eq!(host.contract(&Contraction::matmul(0), &acc, &acc.clone(), &eye, None), Answer::Overlapping);
    assert_eq!(host.contract(&Contraction::matmul(0), &acc, &eye, &acc.clone(), None), Answer::Overlapping);
    assert_eq!(acc.to_vec().unwrap(), [2.0, 1.0, 1.0, 2.0]);
}

#[test]
fn an_init_over_many_pieces_is_each_outputs_start() {
    // 300 × 250 outputs: the init copied in pieces of 2^15 elements, which start mid-row; a bias
    // broadcast along the rows (runs copied), and a transposed init (read an element at a time)
    let host = Host::new();
    let (m, k, n) = (300, 7, 250);
    let a = Array::<f32>::from_fn(DEV, &[m, k], |i| val(i[0] * k + i[1])).unwrap();
    let b = Array::<f32>::from_fn(DEV, &[k, n], |i| val(i[0] * n + i[1] + 17)).unwrap();
    let bias = Array::<f32>::from_fn(DEV, &[n], |i| 100.0 + i[0] as f32).unwrap();
    let rows = bias.apply(&Move::Expand(vec![m, n])).unwrap().unwrap();
    let t = Array::<f32>::from_fn(DEV, &[n, m], |i| (i[0] * 1000 + i[1]) as f32).unwrap();
    let across = t.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    for (what, init, at) in [
        ("bias rows", &rows, &(|_: usize, j: usize| 100.0 + j as f64) as &dyn Fn(usize, usize) -> f64),
        ("transposed", &across, &|i: usize, j: usize| (j * 1000 + i) as f64),
    ] {
        let out = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
        assert_eq!(host.contract(&Contraction::matmul(0), &out, &a, &b, Some(init)), Answer::Done);
        let got = out.to_vec().unwrap();
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut g) = (at(i, j), at(i, j).abs());
                for p in 0..k {
                    let x = val(i * k + p) as f64 * val(p * n + j + 17) as f64;
                    s += x;
                    g += x.abs();
                }
                let bound = 9.0 * 2f64.powi(-24) * g;
                assert!((got[i * n + j] as f64 - s).abs() <= bound, "{what} ({i}, {j}): {} vs {s}", got[i * n + j]);
            }
        }
    }
}
