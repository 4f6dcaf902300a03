//! CUDA C for a map: a [`Prog`] over loads of given dtypes into destinations of given dtypes, one
//! kernel fusing the whole program, reading and writing any layouts through the [`Args`] it is
//! launched with (strides as values, so one compilation serves every layout; operands known to be
//! C-contiguous in the loop's order address element `offset + i` without dividing the index).
//!
//! The generated code computes what the host library computes, by nx's rules: halves and the
//! other narrow floats in `f32` (`bf16` widened with its NaNs made quiet, rounded back to nearest
//! with ties to even and every NaN the quiet one), integers in 64 bits wrapping, a float cast to an
//! integer toward zero and saturating (NaN to 0), `Max`/`Min` NaN where either operand is and −0
//! below +0, integer division by 0 giving 0. Its arithmetic is the IEEE operations in the order the
//! program gives (it must be compiled without contraction: `--fmad=false`), so a program of `+`,
//! `−`, `×`, `÷`, comparisons, selections and casts has the host's bits, and so does `exp` of
//! `f32` (and the sigmoid through it: `nx_expf`, the host library's own polynomial); the other
//! transcendental functions are the platform's (`tanhf`, `logf`, …: within their documented ulps
//! of the host's).
//!
//! The source is plain C++ besides `__global__`, `blockIdx`, `blockDim`, `threadIdx` and
//! `gridDim`, so the host's compiler builds it too, with those defined by a few lines (the tests
//! run every generated kernel so, against the host library).
//!
//! Declined (an error naming it): complex, fp8 and packed dtypes, and programs of more than
//! [`MAX_OPERANDS`] operands.

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

use crate::prog::{BinOp, CmpOp, Node, Prog, Ty, UnOp};
use crate::{Dtype, MAX_RANK};

/// The most operands (destinations and loads) a generated kernel takes.
pub const MAX_OPERANDS: usize = 8;

/// What a kernel is launched with (by value): the loop's extent and shape, and each operand's
/// memory, offset and strides over the loop (in elements; 0 along a broadcast axis). The generated
/// source declares the same struct (`NxArgs`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Args {
    /// The loop's number of indices.
    pub n: i64,
    /// The loop's rank.
    pub rank: i64,
    /// The loop's shape (the first `rank` extents).
    pub shape: [i64; MAX_RANK],
    /// Each operand's memory: destinations first, then loads.
    pub ptr: [*mut u8; MAX_OPERANDS],
    /// Each operand's position of the loop's first index, in elements.
    pub offset: [i64; MAX_OPERANDS],
    /// Each operand's strides over the loop's axes, in elements.
    pub strides: [[i64; MAX_RANK]; MAX_OPERANDS],
}

/// A generated kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// Its entry point's name (`nx_map_` and the signature's hash).
    pub name: String,
    /// The kernel's own source, after the [`PRELUDE`] every kernel shares.
    pub body: String,
}

impl Kernel {
    /// The whole CUDA C source: the prelude, then the kernel.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }
}

/// A map to generate: the program, the destinations' dtypes, the loads' dtypes, and which
/// operands (destinations, then loads) are C-contiguous over the loop.
#[derive(Clone, Debug)]
pub struct MapSig<'a> {
    /// The program.
    pub prog: &'a Prog,
    /// The destinations' dtypes.
    pub dsts: &'a [Dtype],
    /// The loads' dtypes.
    pub loads: &'a [Dtype],
    /// Per operand (destinations, then loads): read and written at `offset + i`.
    pub contiguous: &'a [bool],
}

impl MapSig<'_> {
    /// A name for the signature: the same program, dtypes and contiguity give the same name.
    fn name(&self) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        format!("{:?}", self.prog).hash(&mut h);
        self.dsts.hash(&mut h);
        self.loads.hash(&mut h);
        self.contiguous.hash(&mut h);
        format!("nx_map_{:016x}", h.finish())
    }
}

/// The C type a node of type `t` is held in.
pub(crate) fn cty(t: Ty) -> Result<&'static str, String> {
    Ok(match t {
        Ty::Bool => "bool",
        Ty::I64 => "long long",
        Ty::U64 => "unsigned long long",
        Ty::F32 => "float",
        Ty::F64 => "double",
        Ty::C64 | Ty::C128 => return Err("complex values are not built in the CUDA library yet".into()),
    })
}

/// Whether the CUDA library loads and stores `d`.
pub(crate) fn supported(d: Dtype) -> Result<(), String> {
    match d {
        Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::C64 | Dtype::C128 | Dtype::I4 | Dtype::U4 | Dtype::Bit => {
            Err(format!("{d} operands are not built in the CUDA library yet"))
        }
        _ => Ok(()),
    }
}

/// The helpers every kernel shares: the launch struct, halves, conversions, extremes, integer
/// powers.
pub const PRELUDE: &str = r#"
typedef long long nx_i64;
typedef unsigned long long nx_u64;
typedef unsigned int nx_u32;
typedef unsigned short nx_u16;
struct NxArgs {
    nx_i64 n;
    nx_i64 rank;
    nx_i64 shape[16];
    char *ptr[8];
    nx_i64 offset[8];
    nx_i64 strides[8][16];
};
__device__ static inline nx_u32 nx_bits_f32(float x) { return __float_as_uint(x); }
__device__ static inline float nx_f32_bits(nx_u32 u) { return __uint_as_float(u); }
__device__ static inline nx_u64 nx_bits_f64(double x) { return (nx_u64)__double_as_longlong(x); }
__device__ static inline double nx_f64_bits(nx_u64 u) { return __longlong_as_double((long long)u); }
/* a reduction's side of its launch, and one partial of its scratch (reduce_gen.rs) */
struct NxRed {
    nx_i64 outputs, terms, chunks;
    nx_i64 axis_of[16];
    char *scratch;
};
struct NxPart { double a, b, c; nx_u64 v; nx_i64 pos; unsigned flags, pad; };
__device__ static inline double nx_fmax64(double a, double b) { return (b != b) ? a : ((a != a) ? b : (b > a ? b : a)); }
__device__ static inline bool nx_isnan32(float x) { return x != x; }
__device__ static inline bool nx_isnan64(double x) { return x != x; }
/* bf16: widened exactly, a NaN made quiet; narrowed to nearest, ties to even, every NaN 0x7FC0 */
__device__ static inline float nx_bf16_f32(nx_u16 b) {
    nx_u32 w = ((nx_u32)b) << 16;
    return nx_f32_bits(((nx_u32)b & 0x7FFFu) > 0x7F80u ? (w | 0x00400000u) : w);
}
__device__ static inline nx_u16 nx_f32_bf16(float x) {
    if (nx_isnan32(x)) return (nx_u16)0x7FC0u;
    nx_u32 b = nx_bits_f32(x);
    return (nx_u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
/* f16: widened exactly (a NaN keeps its payload, made quiet); narrowed to nearest, ties to even,
   every NaN 0x7E00 */
__device__ static inline float nx_f16_f32(nx_u16 h) {
    nx_u32 s = ((nx_u32)(h & 0x8000u)) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return nx_f32_bits(s | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u));
    if (e == 0u) {
        if (m == 0u) return nx_f32_bits(s);
        float v = (float)m * nx_f32_bits(0x33800000u); /* m * 2^-24, exact */
        return s ? -v : v;
    }
    return nx_f32_bits(s | ((e + 112u) << 23) | (m << 13));
}
__device__ static inline nx_u16 nx_f32_f16(float x) {
    if (nx_isnan32(x)) return (nx_u16)0x7E00u;
    nx_u32 b = nx_bits_f32(x), s = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    if (a >= 0x47800000u) { /* 65536 and up: past the largest f16 after rounding, or infinite */
        return (nx_u16)(s | 0x7C00u);
    }
    if (a < 0x38800000u) { /* below 2^-14: subnormal (or zero) in f16 */
        if (a < 0x33000000u) return (nx_u16)s; /* at most 2^-25: rounds to zero */
        nx_u32 e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
        nx_u32 shift = 126u - e; /* 14..24 */
        nx_u32 q = m >> shift, r = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (r > half || (r == half && (q & 1u))) q += 1u;
        return (nx_u16)(s | q);
    }
    nx_u32 q = ((a >> 13) - (112u << 10)), r = a & 0x1FFFu;
    if (r > 0x1000u || (r == 0x1000u && (q & 1u))) q += 1u; /* may carry into the exponent: right */
    return (nx_u16)(s | q);
}
/* f64 to f32 rounding toward zero then setting the last bit where something was lost: rounding
   that to a format of 11 or fewer significand bits is the one correct rounding of the f64 */
__device__ static inline float nx_f64_f32_odd(double x) {
    float f = (float)x;
    if (nx_isnan32(f) || (double)f == x) return f;
    nx_u32 bits = nx_bits_f32(f);
    nx_u32 tz = ((double)f < 0 ? -(double)f : (double)f) > (x < 0 ? -x : x) ? bits - 1u : bits;
    return nx_f32_bits(tz | 1u);
}
/* the host library's exp of f32 (host/expf.rs): the same operations in the same order */
__device__ static inline float nx_expf(float x) {
    float t = x * 1.44269502f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194442e-4f;
    float p = 1.98756912e-4f;
    p = p * r + 1.39819994e-3f;
    p = p * r + 8.33345205e-3f;
    p = p * r + 4.16657962e-2f;
    p = p * r + 1.66666657e-1f;
    p = p * r + 0.5f;
    float y = (p * (r * r) + r) + 1.0f;
    int ni = (int)(__float_as_uint(t) - 0x4B400000u);
    ni = ni < -150 ? -150 : (ni > 128 ? 128 : ni);
    int n1 = ni >> 1, n2 = ni - (ni >> 1);
    float v = (y * __uint_as_float((unsigned)(n1 + 127) << 23)) * __uint_as_float((unsigned)(n2 + 127) << 23);
    return x < -104.0f ? 0.0f : (x > 88.7228317f ? __uint_as_float(0x7F800000u) : (x != x ? __uint_as_float(0x7FC00000u) : v));
}
__device__ static inline float nx_round_bf16(float x) { return nx_bf16_f32(nx_f32_bf16(x)); }
__device__ static inline float nx_round_f16(float x) { return nx_f16_f32(nx_f32_f16(x)); }
/* the extremes of nx's order: NaN where either is, -0 below +0 */
__device__ static inline float nx_max32(float x, float y) {
    if (nx_isnan32(x) || nx_isnan32(y)) return nx_f32_bits(0x7FC00000u);
    if (x == y) return (nx_bits_f32(x) >> 31) ? y : x;
    return x > y ? x : y;
}
__device__ static inline float nx_min32(float x, float y) {
    if (nx_isnan32(x) || nx_isnan32(y)) return nx_f32_bits(0x7FC00000u);
    if (x == y) return (nx_bits_f32(x) >> 31) ? x : y;
    return x < y ? x : y;
}
__device__ static inline double nx_max64(double x, double y) {
    if (nx_isnan64(x) || nx_isnan64(y)) return nx_f64_bits(0x7FF8000000000000ull);
    if (x == y) return (nx_bits_f64(x) >> 63) ? y : x;
    return x > y ? x : y;
}
__device__ static inline double nx_min64(double x, double y) {
    if (nx_isnan64(x) || nx_isnan64(y)) return nx_f64_bits(0x7FF8000000000000ull);
    if (x == y) return (nx_bits_f64(x) >> 63) ? x : y;
    return x < y ? x : y;
}
/* floats to integers: toward zero, saturating at [lo, hi], NaN to 0 */
__device__ static inline nx_i64 nx_f2i(double x, double lo, double hi, nx_i64 ilo, nx_i64 ihi) {
    if (nx_isnan64(x)) return 0;
    if (x <= lo) return ilo;
    if (x >= hi) return ihi;
    return (nx_i64)x;
}
__device__ static inline nx_u64 nx_f2u(double x, double hi, nx_u64 uhi) {
    if (nx_isnan64(x) || x <= 0.0) return 0;
    if (x >= hi) return uhi;
    return (nx_u64)x;
}
__device__ static inline nx_i64 nx_idiv(nx_i64 x, nx_i64 y) {
    if (y == 0) return 0;
    if (y == -1) return (nx_i64)(0ull - (nx_u64)x);
    return x / y;
}
__device__ static inline nx_i64 nx_ipow(nx_i64 b, nx_i64 e) {
    if (e < 0) return b == 1 ? 1 : (b == -1 ? ((e & 1) ? -1 : 1) : 0);
    nx_u64 acc = 1, base = (nx_u64)b, k = (nx_u64)e;
    while (k) { if (k & 1ull) acc *= base; base *= base; k >>= 1; }
    return (nx_i64)acc;
}
/* erf, as the host library computes it: inside |x| < 3 the series of positive terms
   2/sqrt(pi) e^(-x^2) sum (2x^2)^n x / (1*3*...*(2n+1)); outside, a continued fraction for erfc */
__device__ static inline double nx_erf(double x) {
    if (nx_isnan64(x)) return x;
    double a = fabs(x), r;
    if (a < 3.0) {
        double x2 = 2.0 * a * a, term = a, sum = a;
        for (int n = 1; n < 200; ++n) {
            term *= x2 / (double)(2 * n + 1);
            sum += term;
            if (term <= 1e-17 * sum) break;
        }
        r = 1.1283791670955126 * exp(-a * a) * sum;
    } else if (a > 6.0) {
        r = 1.0;
    } else {
        double tiny = 1e-300, f = a, c = a, d = 0.0;
        for (int k = 1; k < 200; ++k) {
            double ak = (double)k / 2.0;
            d = a + ak * d;
            d = (d < 0 ? -d : d) < tiny ? 1.0 / tiny : 1.0 / d;
            c = a + ak / c;
            if ((c < 0 ? -c : c) < tiny) c = tiny;
            double delta = c * d;
            f *= delta;
            if ((delta - 1.0 < 0 ? 1.0 - delta : delta - 1.0) < 1e-16) break;
        }
        r = 1.0 - exp(-a * a) / (f * 1.7724538509055159);
    }
    return (nx_bits_f64(x) >> 63) ? -r : r; /* copysign */
}
__device__ static inline nx_u64 nx_upow(nx_u64 b, nx_u64 k) {
    nx_u64 acc = 1;
    while (k) { if (k & 1ull) acc *= b; b *= b; k >>= 1; }
    return acc;
}
"#;

/// The source of a map kernel for `sig`.
///
/// # Errors
/// Why the CUDA library does not build it, in words: a program that does not check, a complex,
/// fp8 or packed dtype, too many operands, or destinations and loads the program does not take.
pub fn map(sig: &MapSig<'_>) -> Result<Kernel, String> {
    let p = sig.prog;
    p.check()?;
    if sig.loads != p.load_dtypes() || sig.dsts.len() != p.outputs() {
        return Err(format!(
            "{} destinations and loads {:?} for a program of {} outputs and loads {:?}",
            sig.dsts.len(),
            sig.loads,
            p.outputs(),
            p.load_dtypes()
        ));
    }
    let ops = sig.dsts.len() + sig.loads.len();
    if ops > MAX_OPERANDS || sig.contiguous.len() != ops {
        return Err(format!("{ops} operands (at most {MAX_OPERANDS}), {} contiguity flags", sig.contiguous.len()));
    }
    for &d in sig.dsts.iter().chain(sig.loads) {
        supported(d)?;
    }
    let name = sig.name();
    let coords = p.nodes.iter().any(|(n, _)| matches!(n, Node::Coord(_)));
    let mut body = positions(sig.contiguous, 0, coords);
    let nd = sig.dsts.len();
    body += &nodes(p, sig.loads, nd, &|axis| format!("idx[{axis}]"))?;
    for (i, (&d, out)) in sig.dsts.iter().zip(p.outputs.iter()).enumerate() {
        let _ = writeln!(
            body,
            "        {};",
            store(d, p.ty(*out), &format!("a.ptr[{i}]"), &format!("p{i}"), &format!("v{}", out.0))?
        );
    }
    let body = format!(
        "extern \"C\" __global__ void {name}(const struct NxArgs a) {{\n    for (nx_i64 i = (nx_i64)blockIdx.x * (nx_i64)blockDim.x + (nx_i64)threadIdx.x; i < a.n; i += (nx_i64)blockDim.x * (nx_i64)gridDim.x) {{\n{body}    }}\n}}\n"
    );
    Ok(Kernel { name, body })
}

/// Lines giving the loop index `i`'s position `p{slot0 + k}` in each operand (`contiguous[k]`: at
/// `offset + i`), the index decomposed into `idx` (over `a.shape`, `a.rank` axes) where an
/// operand is strided or `coords` are read.
pub(crate) fn positions(contiguous: &[bool], slot0: usize, coords: bool) -> String {
    let mut w = String::new();
    if contiguous.iter().any(|c| !c) || coords {
        let _ = writeln!(w, "        nx_i64 idx[16]; nx_i64 rest = i;");
        let _ = writeln!(
            w,
            "        for (int d = (int)a.rank - 1; d >= 0; --d) {{ nx_i64 e = a.shape[d] > 0 ? a.shape[d] : 1; idx[d] = rest % e; rest /= e; }}"
        );
    }
    for (k, &c) in contiguous.iter().enumerate() {
        let k = slot0 + k;
        if c {
            let _ = writeln!(w, "        nx_i64 p{k} = a.offset[{k}] + i;");
        } else {
            let _ = writeln!(w, "        nx_i64 p{k} = a.offset[{k}];");
            let _ = writeln!(w, "        for (int d = 0; d < (int)a.rank; ++d) p{k} += idx[d] * a.strides[{k}][d];");
        }
    }
    w
}

/// Lines computing each live node `v{k}` of `p`, load `j` read at position `p{slot0 + j}` of
/// `a.ptr[slot0 + j]`, a coordinate along program axis `axis` as `coord(axis)`.
pub(crate) fn nodes(
    p: &Prog,
    loads: &[Dtype],
    slot0: usize,
    coord: &dyn Fn(usize) -> String,
) -> Result<String, String> {
    let live = crate::host::eval::live(p);
    let mut w = String::new();
    for (k, (node, ty)) in p.nodes.iter().enumerate() {
        if !live[k] {
            continue;
        }
        let t = cty(*ty)?;
        let v = |x: &crate::prog::V| format!("v{}", x.0);
        let expr = match node {
            Node::Load(j) => load(loads[*j], &format!("a.ptr[{}]", slot0 + j), &format!("p{}", slot0 + j)),
            Node::Const(c) => literal(*ty, c.re),
            Node::Weak(s) => literal(*ty, crate::prog::scalar_value(*s).re),
            Node::Coord(axis) => coord(*axis),
            Node::Unary(op, x) => unary(*op, p.ty(*x), *ty, &v(x))?,
            Node::Binary(op, x, y) => binary(*op, *ty, &v(x), &v(y))?,
            Node::Compare(op, x, y) => {
                let o = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                format!("({} {o} {})", v(x), v(y))
            }
            Node::Select(c, x, y) => format!("({} ? {} : {})", v(c), v(x), v(y)),
            Node::Cast(d, x) => {
                supported(*d)?;
                held(cast(p.ty(*x), *d, &v(x))?, *d)
            }
        };
        let _ = writeln!(w, "        const {t} v{k} = {expr};");
    }
    Ok(w)
}

/// An element of dtype `d` at position `pos` of the memory at `ptr`, in its compute type.
fn load(d: Dtype, ptr: &str, pos: &str) -> String {
    let at = |c: &str| format!("((const {c} *){ptr})[{pos}]");
    match d {
        Dtype::Bool => format!("({} != 0)", at("unsigned char")),
        Dtype::I8 => format!("(nx_i64){}", at("signed char")),
        Dtype::I16 => format!("(nx_i64){}", at("short")),
        Dtype::I32 => format!("(nx_i64){}", at("int")),
        Dtype::I64 => at("long long"),
        Dtype::U8 => format!("(nx_u64){}", at("unsigned char")),
        Dtype::U16 => format!("(nx_u64){}", at("unsigned short")),
        Dtype::U32 => format!("(nx_u64){}", at("unsigned int")),
        Dtype::U64 => at("unsigned long long"),
        Dtype::F16 => format!("nx_f16_f32({})", at("nx_u16")),
        Dtype::BF16 => format!("nx_bf16_f32({})", at("nx_u16")),
        Dtype::F32 => at("float"),
        Dtype::F64 => at("double"),
        _ => unreachable!("supported() refused {d}"),
    }
}

/// A literal of type `t` holding `x` exactly as the host holds it.
pub(crate) fn literal(t: Ty, x: f64) -> String {
    match t {
        Ty::Bool => (if x != 0.0 { "true" } else { "false" }).to_string(),
        Ty::I64 => format!("(nx_i64)0x{:x}ull", x as i64 as u64),
        Ty::U64 => format!("0x{:x}ull", x as u64),
        Ty::F32 => format!("nx_f32_bits(0x{:08x}u)", (x as f32).to_bits()),
        _ => format!("nx_f64_bits(0x{:016x}ull)", x.to_bits()),
    }
}

/// `x` (of type `from`) converted to dtype `d` by nx's rules, as the C value of `d`'s range.
fn cast(from: Ty, d: Dtype, x: &str) -> Result<String, String> {
    let ty = Ty::of(d);
    Ok(match (from, d) {
        (_, Dtype::Bool) => format!("({x} != 0)"),
        (Ty::Bool, _) => {
            let c = cty(ty)?;
            format!("({x} ? ({c})1 : ({c})0)")
        }
        (Ty::F32 | Ty::F64, Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64) => {
            let bits = d.size() * 8;
            let (lo, hi) = (-(2f64.powi(bits as i32 - 1)), 2f64.powi(bits as i32 - 1) - 1.0);
            let (ilo, ihi) = (i64::MIN >> (64 - bits), i64::MAX >> (64 - bits));
            // the largest double below 2^(bits-1) for 64 bits, where hi is not exact
            let hi = if bits == 64 { 9_223_372_036_854_775_807.0f64 } else { hi };
            // i64::MIN has no literal of its own in C
            let ilo = if ilo == i64::MIN { "(-9223372036854775807ll - 1)".to_string() } else { format!("{ilo}ll") };
            format!("nx_f2i((double){x}, {lo:?}, {hi:?}, (nx_i64){ilo}, (nx_i64){ihi}ll)")
        }
        (Ty::F32 | Ty::F64, Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64) => {
            let bits = d.size() * 8;
            let hi = if bits == 64 { 18_446_744_073_709_551_615.0f64 } else { 2f64.powi(bits as i32) - 1.0 };
            format!("nx_f2u((double){x}, {hi:?}, {}ull)", u64::MAX >> (64 - bits))
        }
        (Ty::I64 | Ty::U64, Dtype::I8) => format!("(nx_i64)(signed char){x}"),
        (Ty::I64 | Ty::U64, Dtype::I16) => format!("(nx_i64)(short){x}"),
        (Ty::I64 | Ty::U64, Dtype::I32) => format!("(nx_i64)(int){x}"),
        (Ty::I64 | Ty::U64, Dtype::I64) => format!("(nx_i64){x}"),
        (Ty::I64 | Ty::U64, Dtype::U8) => format!("(nx_u64)(unsigned char){x}"),
        (Ty::I64 | Ty::U64, Dtype::U16) => format!("(nx_u64)(unsigned short){x}"),
        (Ty::I64 | Ty::U64, Dtype::U32) => format!("(nx_u64)(unsigned int){x}"),
        (Ty::I64 | Ty::U64, Dtype::U64) => format!("(nx_u64){x}"),
        (Ty::I64 | Ty::U64 | Ty::F32, Dtype::F32) => format!("(float){x}"),
        (Ty::I64 | Ty::U64 | Ty::F32 | Ty::F64, Dtype::F64) => format!("(double){x}"),
        (Ty::F64, Dtype::F32) => format!("(float){x}"),
        // one rounding: an f32's value, or an integer's or an f64's through round-to-odd f32
        (Ty::F32, Dtype::BF16) => format!("nx_round_bf16({x})"),
        (Ty::F32, Dtype::F16) => format!("nx_round_f16({x})"),
        (Ty::I64 | Ty::U64 | Ty::F64, Dtype::BF16) => format!("nx_round_bf16(nx_f64_f32_odd((double){x}))"),
        (Ty::I64 | Ty::U64 | Ty::F64, Dtype::F16) => format!("nx_round_f16(nx_f64_f32_odd((double){x}))"),
        (f, d) => return Err(format!("a cast of {} to {d} is not built in the CUDA library yet", f.dtype())),
    })
}

/// The cast's value as its held type (`Ty::of(d)`): an integer of a narrower dtype widened back.
fn held(expr: String, d: Dtype) -> String {
    match Ty::of(d) {
        Ty::I64 => format!("(nx_i64)({expr})"),
        Ty::U64 => format!("(nx_u64)({expr})"),
        _ => expr,
    }
}

/// Stores `x` (of type `from`) as an element of dtype `d` at `pos` of `ptr`.
pub(crate) fn store(d: Dtype, from: Ty, ptr: &str, pos: &str, x: &str) -> Result<String, String> {
    let at = |c: &str| format!("(({c} *){ptr})[{pos}]");
    Ok(match d {
        Dtype::Bool => format!("{} = (unsigned char)({x} != 0)", at("unsigned char")),
        Dtype::F16 => match from {
            Ty::F32 => format!("{} = nx_f32_f16({x})", at("nx_u16")),
            _ => format!("{} = nx_f32_f16(nx_f64_f32_odd((double){x}))", at("nx_u16")),
        },
        Dtype::BF16 => match from {
            Ty::F32 => format!("{} = nx_f32_bf16({x})", at("nx_u16")),
            _ => format!("{} = nx_f32_bf16(nx_f64_f32_odd((double){x}))", at("nx_u16")),
        },
        _ => {
            let c = match d {
                Dtype::I8 => "signed char",
                Dtype::I16 => "short",
                Dtype::I32 => "int",
                Dtype::I64 => "long long",
                Dtype::U8 => "unsigned char",
                Dtype::U16 => "unsigned short",
                Dtype::U32 => "unsigned int",
                Dtype::U64 => "unsigned long long",
                Dtype::F32 => "float",
                Dtype::F64 => "double",
                _ => unreachable!("supported() refused {d}"),
            };
            format!("{} = ({c})({})", at(c), cast(from, d, x)?)
        }
    })
}

/// `op x` for `x` of type `from`, giving type `to`.
fn unary(op: UnOp, from: Ty, to: Ty, x: &str) -> Result<String, String> {
    Ok(match (from, op) {
        (Ty::F32, _) => {
            let f = |name: &str| format!("{name}({x})");
            match op {
                UnOp::Neg => format!("(-{x})"),
                UnOp::Abs => f("fabsf"),
                UnOp::Exp => f("nx_expf"),
                UnOp::Log => f("logf"),
                UnOp::Sqrt => f("sqrtf"),
                UnOp::Rsqrt => format!("(1.0f / sqrtf({x}))"),
                UnOp::Tanh => f("tanhf"),
                UnOp::Sigmoid => format!("(1.0f / (1.0f + nx_expf(-{x})))"),
                UnOp::Sin => f("sinf"),
                UnOp::Cos => f("cosf"),
                UnOp::Erf => format!("(float)nx_erf((double){x})"),
                UnOp::Recip => format!("(1.0f / {x})"),
                UnOp::Floor => f("floorf"),
                UnOp::Ceil => f("ceilf"),
                UnOp::Not => return Err("Not of a float".into()),
            }
        }
        (Ty::F64, _) => {
            let f = |name: &str| format!("{name}({x})");
            match op {
                UnOp::Neg => format!("(-{x})"),
                UnOp::Abs => f("fabs"),
                UnOp::Exp => f("exp"),
                UnOp::Log => f("log"),
                UnOp::Sqrt => f("sqrt"),
                UnOp::Rsqrt => format!("(1.0 / sqrt({x}))"),
                UnOp::Tanh => f("tanh"),
                UnOp::Sigmoid => format!("(1.0 / (1.0 + exp(-{x})))"),
                UnOp::Sin => f("sin"),
                UnOp::Cos => f("cos"),
                UnOp::Erf => f("nx_erf"),
                UnOp::Recip => format!("(1.0 / {x})"),
                UnOp::Floor => f("floor"),
                UnOp::Ceil => f("ceil"),
                UnOp::Not => return Err("Not of a float".into()),
            }
        }
        (Ty::I64, UnOp::Neg) => format!("(nx_i64)(0ull - (nx_u64){x})"),
        (Ty::I64, UnOp::Abs) => format!("({x} < 0 ? (nx_i64)(0ull - (nx_u64){x}) : {x})"),
        (Ty::I64 | Ty::U64, UnOp::Not) => format!("(~{x})"),
        (Ty::U64, UnOp::Neg) => format!("(0ull - {x})"),
        (Ty::I64 | Ty::U64, _) => x.to_string(),
        (Ty::Bool, UnOp::Not) => format!("(!{x})"),
        _ => return Err(format!("{op:?} of {} to {} is not built in the CUDA library yet", from.dtype(), to.dtype())),
    })
}

/// `x op y`, both of type `t`.
fn binary(op: BinOp, t: Ty, x: &str, y: &str) -> Result<String, String> {
    Ok(match t {
        Ty::F32 | Ty::F64 => {
            let s = if t == Ty::F32 { "32" } else { "64" };
            match op {
                BinOp::Add => format!("({x} + {y})"),
                BinOp::Sub => format!("({x} - {y})"),
                BinOp::Mul => format!("({x} * {y})"),
                BinOp::Div => format!("({x} / {y})"),
                BinOp::Pow => format!("{}({x}, {y})", if t == Ty::F32 { "powf" } else { "pow" }),
                BinOp::Max => format!("nx_max{s}({x}, {y})"),
                BinOp::Min => format!("nx_min{s}({x}, {y})"),
            }
        }
        Ty::I64 => match op {
            BinOp::Add => format!("(nx_i64)((nx_u64){x} + (nx_u64){y})"),
            BinOp::Sub => format!("(nx_i64)((nx_u64){x} - (nx_u64){y})"),
            BinOp::Mul => format!("(nx_i64)((nx_u64){x} * (nx_u64){y})"),
            BinOp::Div => format!("nx_idiv({x}, {y})"),
            BinOp::Pow => format!("nx_ipow({x}, {y})"),
            BinOp::Max => format!("({x} > {y} ? {x} : {y})"),
            BinOp::Min => format!("({x} < {y} ? {x} : {y})"),
        },
        Ty::U64 => match op {
            BinOp::Add => format!("({x} + {y})"),
            BinOp::Sub => format!("({x} - {y})"),
            BinOp::Mul => format!("({x} * {y})"),
            BinOp::Div => format!("({y} == 0ull ? 0ull : {x} / {y})"),
            BinOp::Pow => format!("nx_upow({x}, {y})"),
            BinOp::Max => format!("({x} > {y} ? {x} : {y})"),
            BinOp::Min => format!("({x} < {y} ? {x} : {y})"),
        },
        Ty::Bool => match op {
            BinOp::Max => format!("({x} || {y})"),
            BinOp::Min => format!("({x} && {y})"),
            _ => return Err(format!("{op:?} of booleans")),
        },
        Ty::C64 | Ty::C128 => return Err("complex values are not built in the CUDA library yet".into()),
    })
}
