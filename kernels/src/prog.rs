//! `Prog`: a small program over one element of each operand, with one or more outputs.
//!
//! A program is a DAG of nodes built against its loads' dtypes. Each node has a compute type
//! ([`Ty`]): `bool`; `i64` for signed and `u64` for unsigned integers (arithmetic wraps, so the
//! result stored into a narrower integer is that dtype's wrapping arithmetic); `f32` for `f16`,
//! `bf16` and `f32` (halves compute in `f32`, rounding once on store); `f64`; and the two complex
//! types. Binary operands meet at their promoted type ([`crate::binary_result`]); a constant is a
//! weak scalar ([`crate::scalar_result`]); float math on an integer reads it as `f32`
//! ([`crate::float_math_input`]).
//!
//! ```
//! use nx_kernels::prog::Prog;
//! use nx_kernels::Dtype;
//!
//! // y = a*x + b; z = relu(y): one pass over memory
//! let mut p = Prog::new(&[Dtype::F32, Dtype::F32, Dtype::F32]);
//! let (a, x, b) = (p.load(0), p.load(1), p.load(2));
//! let ax = p.mul(a, x);
//! let y = p.add(ax, b);
//! let zero = p.float(0.0);
//! let z = p.max(y, zero);
//! p.output(y);
//! p.output(z);
//! assert!(p.check().is_ok());
//! ```

use num_complex::Complex64;

use crate::{binary_result, scalar_result, Answer, Dtype, Scalar};

/// A node of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct V(pub(crate) usize);

/// The compute type of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    /// Booleans.
    Bool,
    /// Signed integers, wrapping.
    I64,
    /// Unsigned integers, wrapping.
    U64,
    /// `f32` (and the halves and the fp8s).
    F32,
    /// `f64`.
    F64,
    /// Complex of `f32`.
    C64,
    /// Complex of `f64`.
    C128,
}

impl Ty {
    /// The compute type elements of `d` load as.
    pub fn of(d: Dtype) -> Ty {
        use Dtype::*;
        match d {
            Bool | Bit => Ty::Bool,
            I4 | I8 | I16 | I32 | I64 => Ty::I64,
            U4 | U8 | U16 | U32 | U64 => Ty::U64,
            F16 | BF16 | F8E4M3 | F8E5M2 | F32 => Ty::F32,
            Dtype::F64 => Ty::F64,
            Dtype::C64 => Ty::C64,
            Dtype::C128 => Ty::C128,
        }
    }

    /// The dtype standing for this type in promotion.
    pub fn dtype(self) -> Dtype {
        match self {
            Ty::Bool => Dtype::Bool,
            Ty::I64 => Dtype::I64,
            Ty::U64 => Dtype::U64,
            Ty::F32 => Dtype::F32,
            Ty::F64 => Dtype::F64,
            Ty::C64 => Dtype::C64,
            Ty::C128 => Dtype::C128,
        }
    }

    /// Whether the type is a real float.
    pub fn is_real_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    /// Whether the type is complex.
    pub fn is_complex(self) -> bool {
        matches!(self, Ty::C64 | Ty::C128)
    }
}

/// Unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// −x (integers wrap).
    Neg,
    /// |x| (integers wrap; a complex gives its modulus, a real of its precision).
    Abs,
    /// eˣ.
    Exp,
    /// ln x.
    Log,
    /// √x.
    Sqrt,
    /// 1/√x.
    Rsqrt,
    /// tanh x.
    Tanh,
    /// 1/(1+e⁻ˣ).
    Sigmoid,
    /// sin x.
    Sin,
    /// cos x.
    Cos,
    /// erf x.
    Erf,
    /// 1/x.
    Recip,
    /// ⌊x⌋ (identity on integers).
    Floor,
    /// ⌈x⌉ (identity on integers).
    Ceil,
    /// Logical not (booleans) or bitwise not (integers).
    Not,
}

impl UnOp {
    /// Whether the op is float math, reading integers and booleans as `f32`.
    fn float_only(self) -> bool {
        !matches!(self, UnOp::Neg | UnOp::Abs | UnOp::Not | UnOp::Floor | UnOp::Ceil)
    }
}

/// Binary operations on operands of one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    /// x + y.
    Add,
    /// x − y.
    Sub,
    /// x · y.
    Mul,
    /// x / y (integers: toward zero, 0 where y is 0, never a trap).
    Div,
    /// xʸ (integers: wrapping; a negative exponent gives 0 unless |x| is 1).
    Pow,
    /// The greater, a NaN where either is, −0 below +0 (`any` on booleans).
    Max,
    /// The lesser, a NaN where either is, −0 below +0 (`all` on booleans).
    Min,
}

/// Comparisons, giving booleans (IEEE: every comparison with a NaN is false but `Ne`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// x = y.
    Eq,
    /// x ≠ y.
    Ne,
    /// x < y.
    Lt,
    /// x ≤ y.
    Le,
    /// x > y.
    Gt,
    /// x ≥ y.
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Load(usize),
    Const(Complex64),
    Weak(Scalar),
    Coord(usize),
    Unary(UnOp, V),
    Binary(BinOp, V, V),
    Compare(CmpOp, V, V),
    Select(V, V, V),
    Cast(Dtype, V),
}

/// A program: see the [module documentation](self).
#[derive(Debug, Clone, PartialEq)]
pub struct Prog {
    pub(crate) loads: Vec<Dtype>,
    pub(crate) nodes: Vec<(Node, Ty)>,
    pub(crate) outputs: Vec<V>,
    error: Option<String>,
}

pub(crate) fn scalar_ty(s: Scalar) -> Ty {
    match s {
        Scalar::Bool(_) => Ty::Bool,
        Scalar::Int(_) => Ty::I64,
        Scalar::Float(_) => Ty::F64,
        Scalar::Complex(..) => Ty::C128,
    }
}

pub(crate) fn scalar_value(s: Scalar) -> Complex64 {
    match s {
        Scalar::Bool(b) => Complex64::new(f64::from(u8::from(b)), 0.0),
        Scalar::Int(i) => Complex64::new(i as f64, 0.0),
        Scalar::Float(f) => Complex64::new(f, 0.0),
        Scalar::Complex(re, im) => Complex64::new(re, im),
    }
}

impl Prog {
    /// An empty program over loads of `loads`' dtypes (operand `i` of a call has dtype
    /// `loads[i]`).
    pub fn new(loads: &[Dtype]) -> Prog {
        Prog { loads: loads.to_vec(), nodes: Vec::new(), outputs: Vec::new(), error: None }
    }

    fn push(&mut self, n: Node, t: Ty) -> V {
        self.nodes.push((n, t));
        V(self.nodes.len() - 1)
    }

    fn fail(&mut self, why: String) -> V {
        if self.error.is_none() {
            self.error = Some(why);
        }
        self.push(Node::Const(Complex64::new(0.0, 0.0)), Ty::F32)
    }

    /// The compute type of `v`.
    pub fn ty(&self, v: V) -> Ty {
        self.nodes[v.0].1
    }

    /// The number of outputs.
    pub fn outputs(&self) -> usize {
        self.outputs.len()
    }

    /// The compute type of output `i`; `None` where the program has no output `i`.
    pub fn output_ty(&self, i: usize) -> Option<Ty> {
        self.outputs.get(i).map(|v| self.ty(*v))
    }

    /// The loads' dtypes.
    pub fn load_dtypes(&self) -> &[Dtype] {
        &self.loads
    }

    /// The element of operand `i` at the loop's index (broadcast or strided as its layout says).
    pub fn load(&mut self, i: usize) -> V {
        match self.loads.get(i) {
            Some(&d) => self.push(Node::Load(i), Ty::of(d)),
            None => self.fail(format!("load {i} of a program of {} loads", self.loads.len())),
        }
    }

    /// A weak float constant.
    pub fn float(&mut self, x: f64) -> V {
        self.push(Node::Weak(Scalar::Float(x)), Ty::F64)
    }

    /// A weak integer constant.
    pub fn int(&mut self, x: i64) -> V {
        self.push(Node::Weak(Scalar::Int(x.into())), Ty::I64)
    }

    /// A weak boolean constant.
    pub fn boolean(&mut self, x: bool) -> V {
        self.push(Node::Weak(Scalar::Bool(x)), Ty::Bool)
    }

    /// A constant of compute type `ty` (not weak).
    pub fn constant(&mut self, x: f64, ty: Ty) -> V {
        self.push(Node::Const(Complex64::new(x, 0.0)), ty)
    }

    /// The loop index along `axis`, as an `i64`.
    pub fn coord(&mut self, axis: usize) -> V {
        self.push(Node::Coord(axis), Ty::I64)
    }

    fn is_weak(&self, v: V) -> Option<Scalar> {
        match self.nodes[v.0].0 {
            Node::Weak(s) => Some(s),
            _ => None,
        }
    }

    /// `v` as compute type `ty`: a weak constant becomes a typed one.
    fn as_ty(&mut self, v: V, ty: Ty) -> V {
        if self.ty(v) == ty && self.is_weak(v).is_none() {
            return v;
        }
        if let Some(s) = self.is_weak(v) {
            return self.push(Node::Const(scalar_value(s)), ty);
        }
        self.push(Node::Cast(ty.dtype(), v), ty)
    }

    /// The type two operands meet at.
    fn meet(&mut self, x: V, y: V, what: &str) -> Option<Ty> {
        let r = match (self.is_weak(x), self.is_weak(y)) {
            (Some(_), Some(_)) => binary_result(self.ty(x).dtype(), self.ty(y).dtype()).map(Ty::of),
            (Some(s), None) => scalar_result(self.ty(y).dtype(), s).map(Ty::of),
            (None, Some(s)) => scalar_result(self.ty(x).dtype(), s).map(Ty::of),
            (None, None) => binary_result(self.ty(x).dtype(), self.ty(y).dtype()).map(Ty::of),
        };
        match r {
            Ok(t) => Some(t),
            Err(e) => {
                self.fail(format!("{what}: {e}"));
                None
            }
        }
    }

    /// `op x`.
    pub fn unary(&mut self, op: UnOp, x: V) -> V {
        let t = self.ty(x);
        let x = if op.float_only() && !(t.is_real_float() || t.is_complex()) {
            self.as_ty(x, Ty::F32)
        } else if let Some(s) = self.is_weak(x) {
            self.as_ty(x, scalar_ty(s))
        } else {
            x
        };
        let t = self.ty(x);
        let complex_ok = matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Exp | UnOp::Log | UnOp::Sqrt | UnOp::Recip);
        if t.is_complex() && !complex_ok {
            return self.fail(format!("{op:?} takes real operands, got {}", t.dtype()));
        }
        if op == UnOp::Not && !matches!(t, Ty::Bool | Ty::I64 | Ty::U64) {
            return self.fail(format!("Not takes booleans or integers, got {}", t.dtype()));
        }
        if t == Ty::Bool && matches!(op, UnOp::Neg | UnOp::Abs) {
            return self.fail(format!("{op:?} of a boolean"));
        }
        let out = match (op, t) {
            (UnOp::Abs, Ty::C64) => Ty::F32,
            (UnOp::Abs, Ty::C128) => Ty::F64,
            _ => t,
        };
        self.push(Node::Unary(op, x), out)
    }

    /// `x op y` at the type they meet at.
    pub fn binary(&mut self, op: BinOp, x: V, y: V) -> V {
        let Some(t) = self.meet(x, y, &format!("{op:?}")) else { return V(self.nodes.len() - 1) };
        if t == Ty::Bool && !matches!(op, BinOp::Max | BinOp::Min) {
            return self.fail(format!("{op:?} of booleans"));
        }
        if t.is_complex() && matches!(op, BinOp::Max | BinOp::Min | BinOp::Pow) {
            return self.fail(format!("{op:?} takes real operands, got {}", t.dtype()));
        }
        let (x, y) = (self.as_ty(x, t), self.as_ty(y, t));
        self.push(Node::Binary(op, x, y), t)
    }

    /// `x op y` as a boolean.
    pub fn compare(&mut self, op: CmpOp, x: V, y: V) -> V {
        let Some(t) = self.meet(x, y, &format!("{op:?}")) else { return V(self.nodes.len() - 1) };
        if t.is_complex() && !matches!(op, CmpOp::Eq | CmpOp::Ne) {
            return self.fail(format!("{op:?} orders complex numbers, which have no order"));
        }
        let (x, y) = (self.as_ty(x, t), self.as_ty(y, t));
        self.push(Node::Compare(op, x, y), Ty::Bool)
    }

    /// `if c { x } else { y }`, `c` a boolean.
    pub fn select(&mut self, c: V, x: V, y: V) -> V {
        let c = if self.is_weak(c).is_some() { self.as_ty(c, Ty::Bool) } else { c };
        if self.ty(c) != Ty::Bool {
            return self.fail(format!("select's condition is {}, not bool", self.ty(c).dtype()));
        }
        let Some(t) = self.meet(x, y, "Select") else { return V(self.nodes.len() - 1) };
        let (x, y) = (self.as_ty(x, t), self.as_ty(y, t));
        self.push(Node::Select(c, x, y), t)
    }

    /// `x` converted to `d` by nx's conversion rules (a cast to `f16` rounds to `f16`, a float
    /// to `i8` saturates at `i8`'s range), held in `d`'s compute type; `x` itself where `d` is
    /// the dtype of `x`'s own type (`f32` of an `f32` value: nothing to convert).
    pub fn cast(&mut self, x: V, d: Dtype) -> V {
        let x = if let Some(s) = self.is_weak(x) { self.as_ty(x, scalar_ty(s)) } else { x };
        if self.ty(x).dtype() == d {
            // the dtype of the value's own type: nothing to convert
            return x;
        }
        self.push(Node::Cast(d, x), Ty::of(d))
    }

    /// Makes `v` the next output.
    pub fn output(&mut self, v: V) {
        let v = if let Some(s) = self.is_weak(v) { self.as_ty(v, scalar_ty(s)) } else { v };
        self.outputs.push(v);
    }

    /// `None` if the program is well typed, else why not.
    ///
    /// # Errors
    /// The first type error met while building, in words.
    pub fn check(&self) -> Result<(), String> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None if self.outputs.is_empty() => Err("the program has no output".to_string()),
            None => Ok(()),
        }
    }

    /// The highest loop axis a `coord` node reads, if any.
    pub(crate) fn max_coord(&self) -> Option<usize> {
        self.nodes.iter().filter_map(|(n, _)| if let Node::Coord(a) = n { Some(*a) } else { None }).max()
    }
}

macro_rules! binop_fns {
    ($($name:ident => $op:ident),*) => {
        impl Prog {
            $(
                #[doc = concat!("`x ", stringify!($op), " y` (see [`BinOp::", stringify!($op), "`]).")]
                pub fn $name(&mut self, x: V, y: V) -> V {
                    self.binary(BinOp::$op, x, y)
                }
            )*
        }
    };
}
binop_fns!(add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, max => Max, min => Min);

/// `Some((refusal, why))` where `prog` over loads of `loads` into destinations of `dsts`, on a loop
/// of rank `rank`, does not fit; `None` where all fit. It reads no shape but the rank.
pub fn map_refusal(prog: &Prog, rank: usize, dsts: &[Dtype], loads: &[Dtype]) -> Option<(Answer, String)> {
    if let Err(e) = prog.check() {
        return Some((Answer::WrongDtype, e));
    }
    if loads.len() != prog.loads.len() {
        return Some((Answer::ShapeMismatch, format!("{} loads for a program of {}", loads.len(), prog.loads.len())));
    }
    if let Some(i) = (0..loads.len()).find(|&i| loads[i] != prog.loads[i]) {
        return Some((Answer::WrongDtype, format!("load {i} is {}, the program loads {}", loads[i], prog.loads[i])));
    }
    if dsts.len() != prog.outputs.len() {
        return Some((
            Answer::ShapeMismatch,
            format!("{} destinations for a program of {} outputs", dsts.len(), prog.outputs.len()),
        ));
    }
    if let Some(a) = prog.max_coord().filter(|&a| a >= rank) {
        return Some((Answer::ShapeMismatch, format!("coord({a}) on a loop of rank {rank}")));
    }
    None
}

/// As [`map_refusal`], for `reduce`'s `reductions` of `prog`'s outputs: also the number of
/// reductions, the destinations each needs (one, or two for `Arg` and `Moments`, the second of an
/// `Arg` an `i64`), and the terms each accepts (`Sum` and `Prod` every dtype but booleans,
/// `Logsumexp` and `Moments` real floats; `WrongDtype` otherwise).
pub fn reduce_refusal(
    prog: &Prog,
    rank: usize,
    reductions: &[crate::kernels::Reduction],
    dsts: &[Dtype],
    loads: &[Dtype],
) -> Option<(Answer, String)> {
    use crate::kernels::Reduction;
    let per_output: Vec<Dtype> = prog.outputs.iter().map(|v| prog.ty(*v).dtype()).collect();
    if let Some(r) = map_refusal(prog, rank, &per_output, loads) {
        return Some(r);
    }
    if reductions.len() != prog.outputs.len() {
        return Some((
            Answer::ShapeMismatch,
            format!("{} reductions for a program of {} outputs", reductions.len(), prog.outputs.len()),
        ));
    }
    let want: usize = reductions.iter().map(|r| r.destinations()).sum();
    if dsts.len() != want {
        return Some((Answer::ShapeMismatch, format!("{} destinations where the reductions write {want}", dsts.len())));
    }
    let mut k = 0;
    for (i, r) in reductions.iter().enumerate() {
        let t = prog.ty(prog.outputs[i]);
        if !r.accepts(t.dtype()) {
            return Some((Answer::WrongDtype, format!("{r:?} does not reduce {} terms", t.dtype())));
        }
        if matches!(r, Reduction::Arg(_)) && dsts[k + 1] != Dtype::I64 {
            return Some((
                Answer::WrongDtype,
                format!("Arg's positions go to an i64 destination, not {}", dsts[k + 1]),
            ));
        }
        k += r.destinations();
    }
    None
}
