//! CUDA C for a reduction with the host library's association, so that a sum has the same bits on
//! the CPU and the GPU: each output's terms cut into chunks of 2048, a chunk reduced as the host
//! reduces it (a `Sum` in 8 lanes, term `t` into lane `t mod 8`, then the fixed tree
//! `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`; the others left to right; `Logsumexp`
//! and `Moments` in two passes in `f64`), and the chunks' partials combined by the pairwise tree
//! (pairs of neighbours, then pairs of those, an odd one carried up: the host's tree, whose first
//! half is rounded up to a power of two).
//!
//! Two kernels: `…_chunks` computes every (output, chunk) partial into a scratch array, one per
//! thread; `…_finish` combines each output's partials in place and stores the results. Each chunk
//! is one thread's sequential loop: simple and exact, not yet the fastest layout on a GPU.
//!
//! The loop is given to the kernels in the host's order: the kept axes, then the reduced ones
//! ([`ReduceArgs`]), so output `o`'s terms are the flat indices `o·terms … (o+1)·terms − 1`.
//! The two kernels are one module: [`ReduceKernels::source`].

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

use super::codegen::{cty, literal, nodes, positions, store, supported, Kernel, MAX_OPERANDS};
use crate::kernels::{Extreme, Reduction};
use crate::prog::{Node, Prog, Ty};
use crate::{Dtype, MAX_RANK};

/// Terms a chunk holds (the host library's).
pub const CHUNK: usize = 2048;

/// The reduction's side of the launch (with [`super::codegen::Args`], whose shape and strides are
/// the loop's in the host's order: kept axes, then reduced ones): outputs, terms an output,
/// chunks an output, where each program axis lies in that order, and the scratch of
/// `outputs · chunks · reductions` partials ([`PART_BYTES`] each). The generated source declares
/// the same struct (`NxRed`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReduceArgs {
    /// Outputs.
    pub outputs: i64,
    /// Terms an output.
    pub terms: i64,
    /// Chunks an output: ⌈terms / 2048⌉.
    pub chunks: i64,
    /// For each program axis, the loop axis (in the host's order) that holds it.
    pub axis_of: [i64; MAX_RANK],
    /// The partials' memory.
    pub scratch: *mut u8,
}

/// Bytes of one partial in the scratch.
pub const PART_BYTES: usize = 48;

/// A reduction to generate: the program, each output's reduction, the destinations (one per
/// reduction, two for `Arg` and `Moments`), the loads and which of them are C-contiguous in the
/// host's loop order.
#[derive(Clone, Debug)]
pub struct ReduceSig<'a> {
    /// The program.
    pub prog: &'a Prog,
    /// Each output's reduction.
    pub reductions: &'a [Reduction],
    /// The destinations' dtypes.
    pub dsts: &'a [Dtype],
    /// The loads' dtypes.
    pub loads: &'a [Dtype],
    /// Per load: read at `offset + i` in the host's loop order.
    pub contiguous: &'a [bool],
}

/// The two kernels of a reduction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceKernels {
    /// Every (output, chunk) partial, one a thread.
    pub chunks: Kernel,
    /// Each output's partials combined and stored, one output a thread.
    pub finish: Kernel,
}

impl ReduceKernels {
    /// The module's whole CUDA C source: the prelude, then both kernels.
    pub fn source(&self) -> String {
        format!("{}\n{}\n{}", super::codegen::PRELUDE, self.chunks.body, self.finish.body)
    }
}

/// The C expressions of a term type: its bits into `NxPart::v` and back.
fn to_bits(t: Ty, x: &str) -> String {
    match t {
        Ty::F32 => format!("(nx_u64)nx_bits_f32({x})"),
        Ty::F64 => format!("nx_bits_f64({x})"),
        Ty::Bool => format!("(nx_u64)({x} ? 1 : 0)"),
        _ => format!("(nx_u64)({x})"),
    }
}

fn from_bits(t: Ty, v: &str) -> String {
    match t {
        Ty::F32 => format!("nx_f32_bits((nx_u32){v})"),
        Ty::F64 => format!("nx_f64_bits({v})"),
        Ty::Bool => format!("({v} != 0)"),
        Ty::I64 => format!("(nx_i64)({v})"),
        _ => v.to_string(),
    }
}

/// `a ⊕ b` of a monoid reduction over terms of type `t`, as the host's `Term` defines it.
fn op(r: Reduction, t: Ty, a: &str, b: &str) -> String {
    let float = matches!(t, Ty::F32 | Ty::F64);
    let s = if t == Ty::F32 { "32" } else { "64" };
    match (r, t) {
        (Reduction::Sum, Ty::Bool) | (Reduction::Max, Ty::Bool) => format!("({a} || {b})"),
        (Reduction::Prod, Ty::Bool) | (Reduction::Min, Ty::Bool) => format!("({a} && {b})"),
        (Reduction::Sum, Ty::I64) => format!("(nx_i64)((nx_u64){a} + (nx_u64){b})"),
        (Reduction::Prod, Ty::I64) => format!("(nx_i64)((nx_u64){a} * (nx_u64){b})"),
        (Reduction::Sum, _) => format!("({a} + {b})"),
        (Reduction::Prod, _) => format!("({a} * {b})"),
        (Reduction::Max, _) if float => format!("nx_max{s}({a}, {b})"),
        (Reduction::Min, _) if float => format!("nx_min{s}({a}, {b})"),
        (Reduction::Max, _) => format!("({a} > {b} ? {a} : {b})"),
        _ => format!("({a} < {b} ? {a} : {b})"),
    }
}

/// Whether `x` beats `y` for the extreme `e` (strictly; +0 over −0 for `Max`), as the host's.
fn beats(e: Extreme, t: Ty, x: &str, y: &str) -> String {
    match (e, t) {
        (Extreme::Max, Ty::Bool) => format!("({x} && !{y})"),
        (Extreme::Min, Ty::Bool) => format!("(!{x} && {y})"),
        (Extreme::Max, Ty::F32 | Ty::F64) => {
            format!("({x} > {y} || ({x} == {y} && {} && !{}))", signbit(t, y), signbit(t, x))
        }
        (Extreme::Min, Ty::F32 | Ty::F64) => {
            format!("({x} < {y} || ({x} == {y} && !{} && {}))", signbit(t, y), signbit(t, x))
        }
        (Extreme::Max, _) => format!("({x} > {y})"),
        (Extreme::Min, _) => format!("({x} < {y})"),
    }
}

fn signbit(t: Ty, x: &str) -> String {
    if t == Ty::F32 {
        format!("((nx_bits_f32({x}) >> 31) != 0)")
    } else {
        format!("((nx_bits_f64({x}) >> 63) != 0)")
    }
}

fn isnan(t: Ty, x: &str) -> String {
    match t {
        Ty::F32 | Ty::F64 => format!("({x} != {x})"),
        _ => "false".to_string(),
    }
}

impl ReduceSig<'_> {
    fn name(&self) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        format!("{:?}", self.prog).hash(&mut h);
        format!("{:?}", self.reductions).hash(&mut h);
        self.dsts.hash(&mut h);
        self.loads.hash(&mut h);
        self.contiguous.hash(&mut h);
        format!("nx_reduce_{:016x}", h.finish())
    }
}

/// The kernels of a reduction `sig`.
///
/// # Errors
/// Why the CUDA library does not build it, in words: as [`super::codegen::map`], and a
/// reduction of terms it does not accept, or destinations not as many as the reductions write.
pub fn reduce(sig: &ReduceSig<'_>) -> Result<ReduceKernels, String> {
    let p = sig.prog;
    if let Some((_, why)) = crate::prog::reduce_refusal(p, MAX_RANK, sig.reductions, sig.dsts, sig.loads) {
        return Err(why);
    }
    let nd = sig.dsts.len();
    if nd + sig.loads.len() > MAX_OPERANDS || sig.contiguous.len() != sig.loads.len() {
        return Err(format!("{} operands (at most {MAX_OPERANDS})", nd + sig.loads.len()));
    }
    for &d in sig.dsts.iter().chain(sig.loads) {
        supported(d)?;
    }
    let name = sig.name();
    let nr = sig.reductions.len();
    let coords = p.nodes.iter().any(|(n, _)| matches!(n, Node::Coord(_)));
    let program = {
        let mut w = positions(sig.contiguous, nd, coords);
        w += &nodes(p, sig.loads, nd, &|axis| format!("idx[r.axis_of[{axis}]]"))?;
        w
    };
    let two_pass = sig.reductions.iter().any(|r| matches!(r, Reduction::Logsumexp | Reduction::Moments));
    // the chunks kernel: state, the pass(es) over the terms, the partial
    let (mut state, mut pass1, mut pass2, mut part) = (String::new(), String::new(), String::new(), String::new());
    for (k, &r) in sig.reductions.iter().enumerate() {
        let out = p.outputs[k];
        let t = p.ty(out);
        let c = cty(t)?;
        let x = format!("v{}", out.0);
        let slot = format!("P[(w * {nr}) + {k}]");
        match r {
            Reduction::Sum => {
                let zero = literal(t, 0.0);
                let _ = writeln!(state, "        {c} l{k}[8]; for (int q = 0; q < 8; ++q) l{k}[q] = {zero};");
                let _ = writeln!(pass1, "        l{k}[rel & 7] = {};", op(r, t, &format!("l{k}[rel & 7]"), &x));
                let l = |q: usize| format!("l{k}[{q}]");
                let o = |a: String, b: String| op(r, t, &a, &b);
                let total = o(o(o(l(0), l(1)), o(l(2), l(3))), o(o(l(4), l(5)), o(l(6), l(7))));
                let _ = writeln!(part, "        {slot}.v = {};", to_bits(t, &total));
            }
            Reduction::Prod | Reduction::Max | Reduction::Min => {
                let _ = writeln!(state, "        {c} a{k} = {};", literal(t, 0.0));
                let _ = writeln!(pass1, "        a{k} = rel == 0 ? {x} : {};", op(r, t, &format!("a{k}"), &x));
                let _ = writeln!(part, "        {slot}.v = {};", to_bits(t, &format!("a{k}")));
            }
            Reduction::Arg(e) => {
                let _ = writeln!(state, "        {c} b{k} = {}; nx_i64 at{k} = 0;", literal(t, 0.0));
                let nan_best = isnan(t, &format!("b{k}"));
                let better = format!("({} || {})", isnan(t, &x), beats(e, t, &x, &format!("b{k}")));
                let _ = writeln!(
                    pass1,
                    "        if (rel == 0) {{ b{k} = {x}; at{k} = 0; }} else if (!{nan_best} && {better}) {{ b{k} = {x}; at{k} = rel; }}"
                );
                let _ = writeln!(part, "        {slot}.v = {}; {slot}.pos = t0 + at{k};", to_bits(t, &format!("b{k}")));
            }
            Reduction::Logsumexp => {
                let _ = writeln!(
                    state,
                    "        double m{k} = nx_f64_bits(0xFFF0000000000000ull), s{k} = 0.0; bool nan{k} = false;"
                );
                let _ = writeln!(
                    pass1,
                    "        {{ double y = (double){x}; nan{k} = nan{k} || (y != y); m{k} = nx_fmax64(m{k}, y); }}"
                );
                let _ = writeln!(pass2, "        if (m{k} - m{k} == 0.0) s{k} += exp((double){x} - m{k});");
                let _ = writeln!(part, "        {slot}.a = m{k}; {slot}.b = s{k}; {slot}.flags = nan{k} ? 1u : 0u;");
            }
            Reduction::Moments => {
                let _ = writeln!(state, "        double n{k} = 0.0, tot{k} = 0.0, q{k} = 0.0; unsigned f{k} = 0u;");
                let _ = writeln!(
                    pass1,
                    "        {{ double y = (double){x}; if (y != y) f{k} |= 4u; else if (y == nx_f64_bits(0x7FF0000000000000ull)) f{k} |= 1u; else if (y == nx_f64_bits(0xFFF0000000000000ull)) f{k} |= 2u; else {{ n{k} += 1.0; tot{k} += y; }} }}"
                );
                let _ = writeln!(
                    pass2,
                    "        {{ double y = (double){x}; if (y - y == 0.0) {{ double d = y - mean{k}; q{k} += d * d; }} }}"
                );
                let _ = writeln!(
                    part,
                    "        {slot}.a = n{k}; {slot}.b = mean{k}; {slot}.c = q{k}; {slot}.flags = f{k};"
                );
            }
        }
    }
    let mut between = String::new();
    for (k, &r) in sig.reductions.iter().enumerate() {
        if r == Reduction::Moments {
            let _ = writeln!(between, "        double mean{k} = n{k} > 0.0 ? tot{k} / n{k} : 0.0;");
        }
    }
    let term_loop = |pass: &str| {
        format!(
            "        for (nx_i64 t = t0; t < t1; ++t) {{\n        nx_i64 i = o * r.terms + t; nx_i64 rel = t - t0; (void)rel;\n{program}{pass}        }}\n"
        )
    };
    let grid = "(nx_i64)blockIdx.x * (nx_i64)blockDim.x + (nx_i64)threadIdx.x";
    let step = "(nx_i64)blockDim.x * (nx_i64)gridDim.x";
    let mut chunks = format!(
        "extern \"C\" __global__ void {name}_chunks(const struct NxArgs a, const struct NxRed r) {{\n    struct NxPart *P = (struct NxPart *)r.scratch;\n    for (nx_i64 w = {grid}; w < r.outputs * r.chunks; w += {step}) {{\n        nx_i64 o = w / r.chunks, j = w % r.chunks;\n        nx_i64 t0 = j * {CHUNK}, t1 = t0 + {CHUNK} < r.terms ? t0 + {CHUNK} : r.terms;\n{state}"
    );
    chunks += &term_loop(&pass1);
    chunks += &between;
    if two_pass {
        chunks += &term_loop(&pass2);
    }
    chunks += &part;
    chunks += "    }\n}\n";
    // the finish kernel: the pairwise tree in place, then the results
    let mut finish = format!(
        "extern \"C\" __global__ void {name}_finish(const struct NxArgs a, const struct NxRed r) {{\n    struct NxPart *P = (struct NxPart *)r.scratch;\n    for (nx_i64 o = {grid}; o < r.outputs; o += {step}) {{\n        nx_i64 base = o * r.chunks;\n"
    );
    let mut slot = 0;
    for (k, &r) in sig.reductions.iter().enumerate() {
        let t = p.ty(p.outputs[k]);
        let c = cty(t)?;
        let pk = |j: &str| format!("P[({j}) * {nr} + {k}]");
        let (x, y) = (pk("base + i"), pk("base + i + width"));
        let combine = match r {
            Reduction::Sum | Reduction::Prod | Reduction::Max | Reduction::Min => {
                let (xa, ya) = (from_bits(t, &format!("{x}.v")), from_bits(t, &format!("{y}.v")));
                format!("{{ {c} u = {xa}, v = {ya}; {x}.v = {}; }}", to_bits(t, &op(r, t, "u", "v")))
            }
            Reduction::Arg(e) => {
                let (xa, ya) = (from_bits(t, &format!("{x}.v")), from_bits(t, &format!("{y}.v")));
                format!(
                    "{{ {c} u = {xa}, v = {ya}; if (!({} || (!{} && !{}))) {{ {x}.v = {y}.v; {x}.pos = {y}.pos; }} }}",
                    isnan(t, "u"),
                    isnan(t, "v"),
                    beats(e, t, "v", "u")
                )
            }
            Reduction::Logsumexp => format!(
                "{{ double m = nx_fmax64({x}.a, {y}.a); double s = (m - m == 0.0) ? {x}.b * exp({x}.a - m) + {y}.b * exp({y}.a - m) : 0.0; {x}.a = m; {x}.b = s; {x}.flags |= {y}.flags; }}"
            ),
            Reduction::Moments => format!(
                "{{ double na = {x}.a, nb = {y}.a, n = na + nb; if (n == 0.0) {{ {x}.b = 0.0; {x}.c = 0.0; }} else {{ double d = {y}.b - {x}.b; {x}.b = {x}.b + d * (nb / n); {x}.c = {x}.c + {y}.c + d * d * (na * nb / n); }} {x}.a = n; {x}.flags |= {y}.flags; }}"
            ),
        };
        let _ = writeln!(
            finish,
            "        for (nx_i64 width = 1; width < r.chunks; width *= 2) for (nx_i64 i = 0; i + width < r.chunks; i += 2 * width) {combine}"
        );
        // the results: of the partial where there are terms, else the empty reduction's
        let p0 = pk("base");
        let dst = |d: usize| (format!("a.ptr[{d}]"), format!("(a.offset[{d}] + o)"));
        let (d0, at0) = dst(slot);
        let dt0 = sig.dsts[slot];
        let nan = "nx_f64_bits(0x7FF8000000000000ull)";
        let lines = match r {
            Reduction::Sum | Reduction::Prod | Reduction::Max | Reduction::Min => {
                let empty = match (r, t) {
                    (Reduction::Sum, _) => literal(t, 0.0),
                    (Reduction::Prod, _) => literal(t, 1.0),
                    (Reduction::Max, Ty::F32 | Ty::F64) => literal(t, f64::NEG_INFINITY),
                    (Reduction::Min, Ty::F32 | Ty::F64) => literal(t, f64::INFINITY),
                    (Reduction::Max, Ty::I64) => "(-9223372036854775807ll - 1)".into(),
                    (Reduction::Min, Ty::I64) => "9223372036854775807ll".into(),
                    (Reduction::Max, Ty::U64) => "0ull".into(),
                    (Reduction::Min, Ty::U64) => "18446744073709551615ull".into(),
                    (Reduction::Max, _) => "false".into(),
                    _ => "true".into(),
                };
                let v = format!("(r.chunks > 0 ? {} : ({c}){empty})", from_bits(t, &format!("{p0}.v")));
                format!("        {{ const {c} x = {v}; {}; }}\n", store(dt0, t, &d0, &at0, "x")?)
            }
            Reduction::Arg(_) => {
                let (d1, at1) = dst(slot + 1);
                format!(
                    "        {{ const {c} x = {}; {}; {}; }}\n",
                    from_bits(t, &format!("{p0}.v")),
                    store(dt0, t, &d0, &at0, "x")?,
                    store(sig.dsts[slot + 1], Ty::I64, &d1, &at1, &format!("{p0}.pos"))?
                )
            }
            Reduction::Logsumexp => format!(
                "        {{ double x; if (r.chunks == 0) x = nx_f64_bits(0xFFF0000000000000ull); else if ({p0}.flags & 1u) x = {nan}; else if ({p0}.a - {p0}.a != 0.0) x = {p0}.a; else x = {p0}.a + log({p0}.b); {}; }}\n",
                store(dt0, Ty::F64, &d0, &at0, "x")?
            ),
            Reduction::Moments => {
                let (d1, at1) = dst(slot + 1);
                format!(
                    "        {{ double m, v; unsigned f = r.chunks > 0 ? {p0}.flags : 0u; double n = r.chunks > 0 ? {p0}.a : 0.0;\n          if ((f & 4u) || (n == 0.0 && !(f & 3u))) {{ m = {nan}; v = {nan}; }}\n          else if (f & 3u) {{ m = (f & 3u) == 3u ? {nan} : ((f & 1u) ? nx_f64_bits(0x7FF0000000000000ull) : nx_f64_bits(0xFFF0000000000000ull)); v = {nan}; }}\n          else {{ m = {p0}.b; double q = {p0}.c / n; v = q < 0.0 ? 0.0 : q; }}\n          {}; {}; }}\n",
                    store(dt0, Ty::F64, &d0, &at0, "m")?,
                    store(sig.dsts[slot + 1], Ty::F64, &d1, &at1, "v")?
                )
            }
        };
        finish += &lines;
        slot += r.destinations();
    }
    finish += "    }\n}\n";
    Ok(ReduceKernels {
        chunks: Kernel { name: format!("{name}_chunks"), body: chunks },
        finish: Kernel { name: format!("{name}_finish"), body: finish },
    })
}
