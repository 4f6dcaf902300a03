//! The map suite the CUDA tests share: programs covering every op, cast and store nx generates,
//! the operands they run on (special values; contiguous, strided and broadcast layouts), and the
//! kernel each one is.

#![allow(dead_code)] // each test file uses part of the suite

use half::{bf16, f16};
use nx_kernels::cuda::codegen::{self, Kernel, MapSig};
use nx_kernels::prog::{BinOp, CmpOp, Prog, UnOp};
use nx_kernels::{Array, Dtype, Element, Move, Operand};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

/// The values a test array of dtype `d` holds at index `k`: special values first, then a spread.
pub fn value(d: Dtype, k: usize) -> f64 {
    let specials = [0.0, -0.0, 1.0, -1.0, 0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 65504.0, 1e-7, 3.0, -2.5];
    let x = if k < specials.len() { specials[k] } else { ((k * 7919) % 1013) as f64 * 0.37 - 150.0 };
    match d {
        Dtype::Bool => f64::from(u8::from(k % 3 == 1)),
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => {
            let ext = [0.0, -1.0, 1.0, 127.0, -128.0, 32767.0, -32768.0, 2147483647.0, -2147483648.0];
            if k < ext.len() && d.size() >= 4 || k < 5 {
                ext[k]
            } else {
                ((k * 7919) % 2001) as f64 - 1000.0
            }
        }
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => {
            if k < 3 {
                [0.0, 255.0, 1.0][k]
            } else {
                ((k * 7919) % 4001) as f64
            }
        }
        _ => x,
    }
}

/// A load: the view the kernel reads, the array whose memory it views, and that memory's address.
pub type TestOperand = (Box<dyn Operand>, Box<dyn Operand>, *mut u8);

/// An array of `shape` of dtype `d` laid out as `kind` asks: `0` C-contiguous, `1` strided (the
/// last axis every other element, the first flipped), `2` broadcast along the first axis. Answers
/// the array and the base array whose memory it views.
pub fn operand(d: Dtype, shape: &[usize], kind: u8) -> TestOperand {
    macro_rules! go {
        ($t:ty) => {{
            let conv = |x: f64| <$t as Element>::from_value(nx_kernels::Value::Float(x));
            let r = shape.len();
            let (base_shape, view): (Vec<usize>, Box<dyn Fn(&Array<$t>) -> Array<$t>>) = match kind {
                0 => (shape.to_vec(), Box::new(|a: &Array<$t>| a.clone())),
                1 => {
                    let mut b = shape.to_vec();
                    b[r - 1] = 2 * b[r - 1] + 1;
                    (
                        b,
                        Box::new(move |a: &Array<$t>| {
                            let v = a
                                .apply(&Move::Slice { axis: r - 1, start: Some(1), stop: None, step: 2 })
                                .unwrap()
                                .unwrap();
                            v.apply(&Move::Flip(0)).unwrap().unwrap()
                        }),
                    )
                }
                _ => {
                    let mut b = shape.to_vec();
                    b[0] = 1;
                    let full = shape.to_vec();
                    (b, Box::new(move |a: &Array<$t>| a.apply(&Move::Expand(full.clone())).unwrap().unwrap()))
                }
            };
            let n: usize = base_shape.iter().product();
            let base = Array::<$t>::from_vec(DEV, &base_shape, (0..n).map(|k| conv(value(d, k))).collect()).unwrap();
            let ptr = base.with_slice(|s| s.as_ptr() as *mut u8).unwrap();
            let v = view(&base);
            (Box::new(v) as Box<dyn Operand>, Box::new(base) as Box<dyn Operand>, ptr)
        }};
    }
    match d {
        Dtype::Bool => go!(bool),
        Dtype::I8 => go!(i8),
        Dtype::I16 => go!(i16),
        Dtype::I32 => go!(i32),
        Dtype::I64 => go!(i64),
        Dtype::U8 => go!(u8),
        Dtype::U16 => go!(u16),
        Dtype::U32 => go!(u32),
        Dtype::U64 => go!(u64),
        Dtype::F16 => go!(f16),
        Dtype::BF16 => go!(bf16),
        Dtype::F32 => go!(f32),
        Dtype::F64 => go!(f64),
        d => panic!("no test arrays of {d}"),
    }
}

/// A destination of `shape` and dtype `d`, zeroed, with its address.
pub fn destination(d: Dtype, shape: &[usize]) -> (Box<dyn Operand>, *mut u8) {
    macro_rules! go {
        ($t:ty) => {{
            let a = Array::<$t>::zeros(DEV, shape).unwrap();
            let p = a.with_slice_mut(|s| s.as_mut_ptr() as *mut u8).unwrap();
            (Box::new(a) as Box<dyn Operand>, p)
        }};
    }
    match d {
        Dtype::Bool => go!(bool),
        Dtype::I8 => go!(i8),
        Dtype::I16 => go!(i16),
        Dtype::I32 => go!(i32),
        Dtype::I64 => go!(i64),
        Dtype::U8 => go!(u8),
        Dtype::U16 => go!(u16),
        Dtype::U32 => go!(u32),
        Dtype::U64 => go!(u64),
        Dtype::F16 => go!(f16),
        Dtype::BF16 => go!(bf16),
        Dtype::F32 => go!(f32),
        Dtype::F64 => go!(f64),
        d => panic!("no destinations of {d}"),
    }
}

/// The bytes of a C-contiguous destination.
pub fn bytes(o: &dyn Operand, p: *mut u8) -> Vec<u8> {
    let n = o.layout().numel() * o.dtype().size();
    // SAFETY: the destination's own memory, C-contiguous from its start, alive in the caller.
    unsafe { std::slice::from_raw_parts(p, n).to_vec() }
}

pub struct Case {
    pub what: String,
    pub prog: Prog,
    pub dsts: Vec<Dtype>,
    /// Each load's layout kind (see [`operand`]).
    pub kinds: Vec<u8>,
}

/// Every case of the suite.
pub fn suite() -> Vec<Case> {
    use Dtype::*;
    let mut cases = Vec::new();
    let mut add = |what: String, prog: Prog, dsts: Vec<Dtype>, kinds: Vec<u8>| {
        cases.push(Case { what, prog, dsts, kinds });
    };
    let unaries = [
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
    for d in [F32, F64, BF16, F16] {
        for op in unaries {
            let mut p = Prog::new(&[d]);
            let x = p.load(0);
            let y = p.unary(op, x);
            p.output(y);
            add(format!("{op:?} of {d}"), p, vec![d], vec![1]);
        }
    }
    for d in [I32, I64, U8, U64] {
        for op in [UnOp::Neg, UnOp::Abs, UnOp::Not, UnOp::Floor] {
            let mut p = Prog::new(&[d]);
            let x = p.load(0);
            let y = p.unary(op, x);
            p.output(y);
            add(format!("{op:?} of {d}"), p, vec![d], vec![0]);
        }
    }
    let mut p = Prog::new(&[Bool]);
    let x = p.load(0);
    let y = p.unary(UnOp::Not, x);
    p.output(y);
    add("Not of bool".into(), p, vec![Bool], vec![2]);
    let binaries = [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Pow, BinOp::Max, BinOp::Min];
    for (a, b) in [(F32, F32), (F64, F64), (BF16, F32), (I32, I64), (U8, U64), (I16, I16), (U32, U32)] {
        for op in binaries {
            let mut p = Prog::new(&[a, b]);
            let (x, y) = (p.load(0), p.load(1));
            let z = p.binary(op, x, y);
            p.output(z);
            let out = if a == BF16 { F32 } else { b };
            add(format!("{op:?} of {a} and {b}"), p, vec![out], vec![0, 1]);
        }
    }
    for op in [BinOp::Max, BinOp::Min] {
        let mut p = Prog::new(&[Bool, Bool]);
        let (x, y) = (p.load(0), p.load(1));
        let z = p.binary(op, x, y);
        p.output(z);
        add(format!("{op:?} of bools"), p, vec![Bool], vec![0, 2]);
    }
    for d in [F32, F64, I64, U16, Bool] {
        for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            let mut p = Prog::new(&[d, d]);
            let (x, y) = (p.load(0), p.load(1));
            let z = p.compare(op, x, y);
            let s = p.select(z, x, y);
            p.output(z);
            p.output(s);
            add(format!("{op:?} of {d}, and a selection"), p, vec![Bool, d], vec![1, 2]);
        }
    }
    let all = [Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64];
    for from in all {
        for to in all {
            // stored as `to` (the store's conversion), and cast to `to` then stored as f64 (the
            // cast's held value, exactly)
            let mut p = Prog::new(&[from]);
            let x = p.load(0);
            let c = p.cast(x, to);
            let w = p.cast(c, F64);
            p.output(x);
            p.output(w);
            add(format!("{from} to {to}"), p, vec![to, F64], vec![1]);
        }
    }
    // coordinates and weak constants
    let mut p = Prog::new(&[F32]);
    let (x, i, j) = (p.load(0), p.coord(0), p.coord(1));
    let ij = p.mul(i, j);
    let k = p.int(3);
    let ijk = p.add(ij, k);
    let f = p.cast(ijk, F32);
    let h = p.float(2.5);
    let xh = p.mul(x, h);
    let z = p.add(xh, f);
    p.output(z);
    p.output(ijk);
    add("coordinates and weak constants".into(), p, vec![F32, I32], vec![2]);
    // a fused chain over halves: y = gelu-like(x·w + b) in f32, stored as bf16 and f16
    let mut p = Prog::new(&[BF16, BF16, F16]);
    let (x, w, b) = (p.load(0), p.load(1), p.load(2));
    let xw = p.mul(x, w);
    let bf = p.cast(b, F32);
    let s = p.add(xw, bf);
    let t = p.unary(UnOp::Tanh, s);
    let one = p.float(1.0);
    let t1 = p.add(t, one);
    let half = p.float(0.5);
    let g = p.mul(s, t1);
    let y = p.mul(g, half);
    p.output(y);
    p.output(y);
    add("a fused chain over halves".into(), p, vec![BF16, F16], vec![0, 2, 1]);
    cases
}

/// The generated kernel of `case` over `loads`' layouts and `dsts` (all C-contiguous).
pub fn kernel(case: &Case, loads: &[&dyn Operand], shape: &[usize]) -> Kernel {
    let ld: Vec<Dtype> = loads.iter().map(|l| l.dtype()).collect();
    let mut contiguous = vec![true; case.dsts.len()];
    contiguous.extend(loads.iter().map(|l| {
        let w = l.layout().apply(&Move::Expand(shape.to_vec())).unwrap().unwrap();
        w.is_contiguous() && w.is_distinct()
    }));
    codegen::map(&MapSig { prog: &case.prog, dsts: &case.dsts, loads: &ld, contiguous: &contiguous })
        .unwrap_or_else(|e| panic!("{}: {e}", case.what))
}
