//! The general contraction: block-scaled operands, segments (the grouped matmul of a mixture of
//! experts, and contracting groups) and integer contractions.
//!
//! Operands that need it are read into the accumulator in C order of their (batch, rows,
//! contracting) or (batch, contracting, columns) permutation, each element times its block
//! scale; the others are read in place through their strides. An `f32` group of rows goes to
//! nx's own product ([`super::sgemm`]) with the group's row starts, read and written in place;
//! other groups' rows (or contracting indices) are gathered into a contiguous block, multiplied by
//! the float product of [`super::contract`] or the wrapping integer product of
//! [`super::int_product`], and written back to the group's rows. Integer accumulators of up to 32 bits compute in `i32` and
//! 64-bit ones in `i64`, wrapping: the low bits of a wrapping sum do not depend on the width it
//! wraps at, so an `i8` or `u16` accumulator's result is the low bits of the `i32` one.

use num_complex::{Complex32, Complex64};
use rayon::prelude::*;

use super::contract::{as_view, product, Dims, View};
use super::eval::Ptr;
use super::int_product::int_product;
use super::sgemm::{sgemm, Isa, Mat, Out, Rows};
use super::through_door;
use crate::contraction::{contraction_accumulator, widens_into, Contraction, Factor, Scale, Segmented, Segments};
use crate::door::{identical, Operand};
use crate::layout::{extent_product, Move};
use crate::{Answer, Dtype, Element, Simd, Value};

/// What one accumulator type does in a general contraction.
trait Acc: Element {
    /// `self · 2^(e − 127)`, a NaN for `e = 255` (float and complex accumulators).
    fn pow2(self, e: u8) -> Self;
    /// `self · s` as the accumulator multiplies.
    fn times(self, s: Self) -> Self;
    /// `dst[b] (+)= lhs[b] · rhs[b]`, as [`product`].
    ///
    /// # Safety
    /// As [`product`].
    unsafe fn multiply(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool);
}

/// `2^(e − 127)` in `f32`, exactly (`2^−127` is subnormal), and a NaN for 255.
fn pow2_f32(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// `2^(e − 127)` in `f64`, exactly, and a NaN for 255.
fn pow2_f64(e: u8) -> f64 {
    match e {
        255 => f64::NAN,
        e => f64::from_bits((u64::from(e) + 1023 - 127) << 52),
    }
}

macro_rules! float_acc {
    ($t:ty, $pow:ident, $one:expr) => {
        impl Acc for $t {
            fn pow2(self, e: u8) -> Self {
                self * $pow(e)
            }
            fn times(self, s: Self) -> Self {
                self * s
            }
            unsafe fn multiply(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool) {
                // SAFETY: the caller's contract.
                unsafe { product::<$t>(d, dst, lhs, rhs, add, $one) }
            }
        }
    };
}

macro_rules! complex_acc {
    ($t:ty, $pow:ident, $one:expr) => {
        impl Acc for $t {
            fn pow2(self, e: u8) -> Self {
                // each part scaled apart: a complex product by (s, 0) would make NaN parts of an
                // infinite one
                let s = $pow(e);
                <$t>::new(self.re * s, self.im * s)
            }
            fn times(self, s: Self) -> Self {
                self * s
            }
            unsafe fn multiply(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool) {
                // SAFETY: the caller's contract.
                unsafe { product::<$t>(d, dst, lhs, rhs, add, $one) }
            }
        }
    };
}

float_acc!(f32, pow2_f32, 1.0);
float_acc!(f64, pow2_f64, 1.0);
complex_acc!(Complex32, pow2_f32, Complex32::new(1.0, 0.0));
complex_acc!(Complex64, pow2_f64, Complex64::new(1.0, 0.0));

macro_rules! int_acc {
    ($t:ty) => {
        impl Acc for $t {
            fn pow2(self, _e: u8) -> Self {
                // never called: exponent scales are refused on integer accumulators
                self
            }
            fn times(self, s: Self) -> Self {
                self.wrapping_mul(s)
            }
            unsafe fn multiply(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool) {
                // SAFETY: the caller's contract.
                unsafe { int_product::<$t>(d, dst, lhs, rhs, add) }
            }
        }
    };
}

int_acc!(i32);
int_acc!(i64);

/// The element of dtype `d` at `p`, exactly.
///
/// # Safety
/// `p` addresses a live, aligned element of dtype `d`.
unsafe fn value_at(d: Dtype, p: *const u8) -> Value {
    use half::{bf16, f16};
    macro_rules! typed {
        ($($n:ident => $t:ty),*) => {
            match d {
                // SAFETY: the caller's contract.
                $(Dtype::$n => unsafe { <$t>::load(p) }.to_value(),)*
                Dtype::I4 | Dtype::U4 | Dtype::Bit => unreachable!("packed dtypes answer WrongDtype at the door"),
            }
        };
    }
    typed!(Bool => bool, I8 => i8, I16 => i16, I32 => i32, I64 => i64, U8 => u8, U16 => u16, U32 => u32,
        U64 => u64, F16 => f16, BF16 => bf16, F8E4M3 => crate::dtype::fp8::F8E4M3,
            F8E5M2 => crate::dtype::fp8::F8E5M2, F32 => f32, F64 => f64, C64 => Complex32, C128 => Complex64)
}

/// Writes `v` at `p` as dtype `d` converts it (rounding to nearest even, integers wrapping).
///
/// # Safety
/// `p` addresses an aligned element of dtype `d` that nothing else touches meanwhile.
unsafe fn store_value(d: Dtype, p: *mut u8, v: Value) {
    use half::{bf16, f16};
    macro_rules! typed {
        ($($n:ident => $t:ty),*) => {
            match d {
                // SAFETY: the caller's contract.
                $(Dtype::$n => unsafe { <$t>::store(p, <$t>::from_value(v)) },)*
                Dtype::I4 | Dtype::U4 | Dtype::Bit => unreachable!("packed dtypes answer WrongDtype at the door"),
            }
        };
    }
    typed!(Bool => bool, I8 => i8, I16 => i16, I32 => i32, I64 => i64, U8 => u8, U16 => u16, U32 => u32,
        U64 => u64, F16 => f16, BF16 => bf16, F8E4M3 => crate::dtype::fp8::F8E4M3,
            F8E5M2 => crate::dtype::fp8::F8E5M2, F32 => f32, F64 => f64, C64 => Complex32, C128 => Complex64)
}

/// Where the door's list holds each read operand, and what the call computes.
#[derive(Clone)]
struct Plan {
    spec: Contraction,
    segments: Option<Segments>,
    out: Vec<usize>,
    ids_shape: Vec<usize>,
    /// (exponent codes?, position) of each operand's scale.
    scales: [Option<(bool, usize)>; 2],
    init: Option<usize>,
    ids: Option<usize>,
    acc: Dtype,
    /// The SIMD level the products run.
    simd: Simd,
}

/// Whether a scale of shape `s` blocks an operand of shape `o`: one rank, each extent dividing
/// the operand's, 0 only along an empty axis.
fn blocks(o: &[usize], s: &[usize]) -> bool {
    o.len() == s.len() && o.iter().zip(s).all(|(&n, &k)| if k == 0 { n == 0 } else { n % k == 0 })
}

pub(crate) fn contract_general(
    par: &std::sync::Arc<super::par::Par>,
    spec: &Contraction,
    segments: Option<Segmented<'_>>,
    dst: &dyn Operand,
    a: Factor<'_>,
    b: Factor<'_>,
    init: Option<&dyn Operand>,
) -> Answer {
    let d = dst.dtype();
    let Some(acc) = contraction_accumulator(d) else { return Answer::WrongDtype };
    let plain = segments.is_none() && a.scale.is_none() && b.scale.is_none();
    if plain && d.is_float() && a.array.dtype() == d && b.array.dtype() == d {
        return super::contract::contract(par, spec, dst, a.array, b.array, init);
    }
    let fits = |x: Dtype| x == d || widens_into(x, acc); // f16 operands of an f16 destination
    if !fits(a.array.dtype()) || !fits(b.array.dtype()) || init.is_some_and(|i| i.dtype() != d) {
        return Answer::WrongDtype;
    }
    for s in [a.scale, b.scale].into_iter().flatten() {
        match s {
            Scale::Exponent(e) if e.dtype() != Dtype::U8 || !acc.is_float() => return Answer::WrongDtype,
            // a value scale this library does not read exactly into the accumulator
            Scale::Value(v) if !widens_into(v.dtype(), acc) => return Answer::Declined,
            _ => {}
        }
    }
    if segments.is_some_and(|s| s.ids.dtype() != Dtype::I64) {
        return Answer::WrongDtype;
    }
    let (sa, sb) = (a.array.layout().shape(), b.array.layout().shape());
    let shapes = match &segments {
        Some(s) => spec.segmented_shape(sa, sb, &s.segments),
        None => spec.shape(sa, sb).map(|o| (o, Vec::new())),
    };
    let Ok((out, ids_shape)) = shapes else { return Answer::ShapeMismatch };
    for (f, s) in [(a, sa), (b, sb)] {
        if f.scale.is_some_and(|sc| !blocks(s, sc.array().layout().shape())) {
            return Answer::ShapeMismatch;
        }
    }
    let mut reads: Vec<&dyn Operand> = vec![a.array, b.array];
    let init_at = init.map(|i| {
        reads.push(i);
        reads.len() - 1
    });
    let mut scales = [None, None];
    for (k, f) in [a, b].iter().enumerate() {
        if let Some(s) = f.scale {
            reads.push(s.array());
            scales[k] = Some((matches!(s, Scale::Exponent(_)), reads.len() - 1));
        }
    }
    let ids_at = segments.map(|s| {
        reads.push(s.ids);
        reads.len() - 1
    });
    let plan = Plan {
        spec: spec.clone(),
        segments: segments.map(|s| s.segments),
        out,
        ids_shape,
        scales,
        init: init_at,
        ids: ids_at,
        acc,
        simd: par.simd(),
    };
    through_door(par, "contract_general", None, &[dst], &reads, move |w, r, run| {
        let dst = w[0];
        if dst.layout().shape() != plan.out
            || plan.init.is_some_and(|i| r[i].layout().shape() != plan.out)
            || plan.ids.is_some_and(|i| r[i].layout().shape() != plan.ids_shape)
        {
            return Answer::ShapeMismatch;
        }
        // every operand but init (read at the result's own index) must not share dst's bytes
        let others: Vec<&dyn Operand> = (0..r.len()).filter(|&k| Some(k) != plan.init).map(|k| r[k]).collect();
        if let Some(e) = super::destinations(w, &others) {
            return e;
        }
        if !run {
            return Answer::Done;
        }
        // SAFETY: the door holds every claim for this closure's whole run.
        unsafe {
            match plan.acc {
                Dtype::F32 => compute::<f32>(&plan, dst, r),
                Dtype::F64 => compute::<f64>(&plan, dst, r),
                Dtype::C64 => compute::<Complex32>(&plan, dst, r),
                Dtype::C128 => compute::<Complex64>(&plan, dst, r),
                Dtype::I64 | Dtype::U64 => compute::<i64>(&plan, dst, r),
                _ => compute::<i32>(&plan, dst, r),
            }
        }
        Answer::Done
    })
}

/// An operand as a `[b, r, c]` view of `T`s: in place where it is `T`, unscaled and its
/// permutation merges to three axes; else read into `T` (times its scale) into `keep`.
///
/// # Safety
/// Claims held on `o` and its scale.
unsafe fn view_of<T: Acc>(
    o: &dyn Operand,
    scale: Option<(bool, &dyn Operand)>,
    perm: &[usize],
    dims: [usize; 3],
    keep: &mut Vec<Vec<T>>,
) -> View {
    if o.dtype() == T::DTYPE && scale.is_none() {
        if let Some((offset, strides)) = as_view(o.layout(), perm, dims) {
            return View { base: Ptr::of(o), offset, strides };
        }
    }
    // SAFETY: the caller's contract.
    let packed = unsafe { read_scaled::<T>(o, scale, perm) };
    let v = View {
        base: Ptr(packed.as_ptr() as *mut u8),
        offset: 0,
        strides: [(dims[1] * dims[2]) as isize, dims[2] as isize, 1],
    };
    keep.push(packed);
    v
}

/// `o`'s elements in C order of its layout permuted by `perm`, each read into `T` and multiplied
/// by its block scale.
///
/// # Safety
/// Claims held on `o` and its scale.
unsafe fn read_scaled<T: Acc>(o: &dyn Operand, scale: Option<(bool, &dyn Operand)>, perm: &[usize]) -> Vec<T> {
    let permute = |l: &crate::Layout| l.apply(&Move::Permute(perm.to_vec())).ok().flatten().expect("a permutation");
    let l = permute(o.layout());
    let (d, base) = (o.dtype(), Ptr::of(o));
    let mut out = Vec::with_capacity(l.numel());
    // SAFETY: the caller's contract; positions of checked layouts address live elements.
    let load = |d: Dtype, base: Ptr, p: isize| unsafe { value_at(d, base.at(d, p)) };
    match scale {
        None => out.extend(l.positions().map(|p| T::from_value(load(d, base, p)))),
        Some((exponent, s)) => {
            let sl = permute(s.layout());
            let (shape, rank) = (l.shape().to_vec(), l.rank());
            let ratio: Vec<usize> =
                shape.iter().zip(sl.shape()).map(|(&n, &k)| n.checked_div(k).unwrap_or(1)).collect();
            let (sd, sbase) = (s.dtype(), Ptr::of(s));
            let mut idx = vec![0usize; rank];
            for p in l.positions() {
                let sp =
                    sl.offset() + (0..rank).map(|ax| (idx[ax] / ratio[ax]) as isize * sl.strides()[ax]).sum::<isize>();
                let x = T::from_value(load(d, base, p));
                out.push(match load(sd, sbase, sp) {
                    Value::Int(e) if exponent => x.pow2(e as u8),
                    v => x.times(T::from_value(v)),
                });
                for ax in (0..rank).rev() {
                    idx[ax] += 1;
                    if idx[ax] < shape[ax] {
                        break;
                    }
                    idx[ax] = 0;
                }
            }
        }
    }
    out
}

/// Runs the plan in accumulator `T`.
///
/// # Safety
/// The door's claims are held on `dst` and every read operand `r`.
unsafe fn compute<T: Acc>(plan: &Plan, dst: &dyn Operand, r: &[&dyn Operand]) {
    let (a, b) = (r[0], r[1]);
    let simd = plan.simd;
    let (sa, sb) = (a.layout().shape(), b.layout().shape());
    let ax = plan.spec.axes(sa.len(), sb.len());
    let ext = |s: &[usize], axes: &[usize]| extent_product(axes.iter().map(|&x| s[x]));
    let scale = |k: usize| plan.scales[k].map(|(e, at)| (e, r[at]));
    let (nb, m, k) = (ext(sa, &ax.batch_a), ext(sa, &ax.free_a), ext(sa, &ax.con_a));
    let numel = extent_product(plan.out.iter().copied());
    let d = dst.dtype();
    let direct = d == T::DTYPE;
    let mut own: Vec<T> = if direct { Vec::new() } else { vec![T::default(); numel] };
    let out = if direct { Ptr(Ptr::of(dst).at(d, dst.layout().offset())) } else { Ptr(own.as_mut_ptr().cast()) };
    let at = |i: usize| out.at(T::DTYPE, i as isize).cast::<T>();
    // SAFETY: the caller's contract; `out` holds `numel` Ts this call alone writes.
    unsafe {
        match plan.init.map(|i| r[i]) {
            Some(i)
                if direct
                    && identical(i.layout(), d.size(), dst.layout(), d.size())
                    && i.buffer().memory_id() == dst.buffer().memory_id() => {}
            // init's bits where it is the accumulator's dtype (a NaN's payload kept), else its value
            Some(i) if direct => {
                let ib = Ptr::of(i);
                for (q, p) in i.layout().positions().enumerate() {
                    at(q).write(T::load(ib.at(d, p)));
                }
            }
            Some(i) => {
                let (id, ib) = (i.dtype(), Ptr::of(i));
                for (q, p) in i.layout().positions().enumerate() {
                    at(q).write(T::from_value(value_at(id, ib.at(id, p))));
                }
            }
            None if numel == 0 => {}
            None => {
                std::slice::from_raw_parts_mut(at(0), numel).par_chunks_mut(1 << 16).for_each(|c| c.fill(T::default()))
            }
        }
        let add = plan.init.is_some();
        // outputs that receive products, where init's bits must be restored elsewhere (a
        // destination narrower than the accumulator)
        let track = !direct && add;
        let mut touched = vec![false; if track { numel } else { 0 }];
        let ids: Vec<i64> = plan.ids.map_or(Vec::new(), |i| {
            let o = r[i];
            o.layout().positions().map(|p| i64::load(Ptr::of(o).at(Dtype::I64, p))).collect()
        });
        let mut keep: Vec<Vec<T>> = Vec::new();
        let perm_a: Vec<usize> = ax.batch_a.iter().chain(&ax.free_a).chain(&ax.con_a).copied().collect();
        match plan.segments {
            None => {
                let n = ext(sb, &ax.free_b);
                let perm_b: Vec<usize> = ax.batch_b.iter().chain(&ax.con_b).chain(&ax.free_b).copied().collect();
                if ![nb, m, n, k].contains(&0) {
                    let lhs = view_of::<T>(a, scale(0), &perm_a, [nb, m, k], &mut keep);
                    let rhs = view_of::<T>(b, scale(1), &perm_b, [nb, k, n], &mut keep);
                    T::multiply(&Dims { b: nb, m, n, k, simd }, out, lhs, rhs, add);
                    touched.fill(true);
                }
            }
            Some(Segments::Rows { a_axis, b_axis }) => {
                let rest: Vec<usize> = ax.free_b.iter().copied().filter(|&x| x != b_axis).collect();
                let (g, n) = (sb[b_axis], ext(sb, &rest));
                let pos = ax.free_a.iter().position(|&x| x == a_axis).expect("checked by segmented_shape");
                let inner = ext(sa, &ax.free_a[pos + 1..]);
                let rows = sa[a_axis];
                if [nb, m, n, k, g].contains(&0) {
                    return finish(own, direct, dst, plan.init.map(|i| (r[i], &touched[..])));
                }
                let perm_b: Vec<usize> =
                    ax.batch_b.iter().chain(&[b_axis]).chain(&ax.con_b).chain(&rest).copied().collect();
                let lhs = view_of::<T>(a, scale(0), &perm_a, [nb, m, k], &mut keep);
                let rhs = view_of::<T>(b, scale(1), &perm_b, [nb * g, k, n], &mut keep);
                // (other than f32) one pair of buffers for every group: fresh pages cost more than
                // the copies
                let (mut ta, mut to): (Vec<T>, Vec<T>) = (Vec::new(), Vec::new());
                for bb in 0..nb {
                    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); g];
                    for row in 0..m {
                        let e = ids[bb * rows + (row / inner) % rows];
                        if (0..g as i64).contains(&e) {
                            groups[e as usize].push(row);
                        }
                    }
                    for (e, members) in groups.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
                        let cnt = members.len();
                        if T::DTYPE == Dtype::F32 {
                            // nx's own product reads the group's rows and writes its outputs in place
                            let rows_a: Vec<isize> = members
                                .iter()
                                .map(|&row| lhs.offset + bb as isize * lhs.strides[0] + row as isize * lhs.strides[1])
                                .collect();
                            let rows_c: Vec<isize> = members.iter().map(|&row| ((bb * m + row) * n) as isize).collect();
                            let am =
                                Mat { base: lhs.base.0.cast::<f32>(), rows: Rows::At(&rows_a), col: lhs.strides[2] };
                            let bm = Mat {
                                base: rhs
                                    .base
                                    .0
                                    .cast::<f32>()
                                    .offset(rhs.offset + (bb * g + e) as isize * rhs.strides[0]),
                                rows: Rows::Stride(rhs.strides[1]),
                                col: rhs.strides[2],
                            };
                            let om = Out { base: out.0.cast::<f32>(), rows: Rows::At(&rows_c) };
                            sgemm(Isa::of(simd), cnt, n, k, am, bm, om, add, true);
                            if track {
                                for &row in members {
                                    touched[(bb * m + row) * n..(bb * m + row + 1) * n].fill(true);
                                }
                            }
                            continue;
                        }
                        ta.clear();
                        for &row in members {
                            if lhs.strides[2] == 1 {
                                // a row in place: one copy
                                let at = lhs.base.at(
                                    T::DTYPE,
                                    lhs.offset + bb as isize * lhs.strides[0] + row as isize * lhs.strides[1],
                                );
                                ta.extend_from_slice(std::slice::from_raw_parts(at.cast::<T>(), k));
                            } else {
                                ta.extend((0..k).map(|kk| lhs.load::<T>(bb, row, kk)));
                            }
                        }
                        to.clear();
                        to.resize(cnt * n, T::default());
                        if add {
                            for (q, &row) in members.iter().enumerate() {
                                std::ptr::copy_nonoverlapping(at((bb * m + row) * n), to.as_mut_ptr().add(q * n), n);
                            }
                        }
                        let tv = View { base: Ptr(ta.as_ptr() as *mut u8), offset: 0, strides: [0, k as isize, 1] };
                        let rv = View { offset: rhs.offset + (bb * g + e) as isize * rhs.strides[0], ..rhs };
                        T::multiply(&Dims { b: 1, m: cnt, n, k, simd }, Ptr(to.as_mut_ptr().cast()), tv, rv, add);
                        for (q, &row) in members.iter().enumerate() {
                            std::ptr::copy_nonoverlapping(to.as_ptr().add(q * n), at((bb * m + row) * n), n);
                            if track {
                                touched[(bb * m + row) * n..(bb * m + row + 1) * n].fill(true);
                            }
                        }
                    }
                }
            }
            Some(Segments::Contracting { pair, groups }) => {
                let n = ext(sb, &ax.free_b);
                let p = plan.spec.contracting.iter().position(|&q| q == pair).expect("checked by segmented_shape");
                let (span, inner) = (sa[pair.0], ext(sa, &ax.con_a[p + 1..]));
                if [nb, m, n, k, groups].contains(&0) {
                    return finish(own, direct, dst, plan.init.map(|i| (r[i], &touched[..])));
                }
                let perm_b: Vec<usize> = ax.batch_b.iter().chain(&ax.con_b).chain(&ax.free_b).copied().collect();
                let lhs = view_of::<T>(a, scale(0), &perm_a, [nb, m, k], &mut keep);
                let rhs = view_of::<T>(b, scale(1), &perm_b, [nb, k, n], &mut keep);
                for bb in 0..nb {
                    let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups];
                    for kk in 0..k {
                        let e = ids[bb * span + (kk / inner) % span];
                        if (0..groups as i64).contains(&e) {
                            members[e as usize].push(kk);
                        }
                    }
                    for (e, ks) in members.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
                        let ke = ks.len();
                        let mut ta: Vec<T> = Vec::with_capacity(m * ke);
                        for row in 0..m {
                            ta.extend(ks.iter().map(|&kk| lhs.load::<T>(bb, row, kk)));
                        }
                        let mut tb: Vec<T> = Vec::with_capacity(ke * n);
                        for &kk in ks {
                            tb.extend((0..n).map(|col| rhs.load::<T>(bb, kk, col)));
                        }
                        let tav = View { base: Ptr(ta.as_ptr() as *mut u8), offset: 0, strides: [0, ke as isize, 1] };
                        let tbv = View { base: Ptr(tb.as_ptr() as *mut u8), offset: 0, strides: [0, n as isize, 1] };
                        let block = Ptr(at((e * nb + bb) * m * n).cast());
                        T::multiply(&Dims { b: 1, m, n, k: ke, simd }, block, tav, tbv, add);
                        if track {
                            touched[(e * nb + bb) * m * n..(e * nb + bb + 1) * m * n].fill(true);
                        }
                    }
                }
            }
        }
        drop(keep);
        finish(own, direct, dst, plan.init.map(|i| (r[i], &touched[..])));
    }
}

/// Rounds the accumulator's results into `dst` where they were not computed there, and gives
/// the outputs without products (not `touched`) init's own bits.
///
/// # Safety
/// Claims held on `dst`, C-contiguous, of `own.len()` elements where `!direct`, and on init.
unsafe fn finish<T: Acc>(own: Vec<T>, direct: bool, dst: &dyn Operand, init: Option<(&dyn Operand, &[bool])>) {
    if direct {
        return;
    }
    let (d, base, off) = (dst.dtype(), Ptr::of(dst), dst.layout().offset());
    // outputs without products are left to init's bits below (init may be dst itself)
    let kept = |q: usize| init.is_some_and(|(_, t)| !t[q]);
    // SAFETY: the caller's contract; each element is written once.
    own.par_iter()
        .enumerate()
        .with_min_len(1 << 14)
        .filter(|&(q, _)| !kept(q))
        .for_each(|(q, x)| unsafe { store_value(d, base.at(d, off + q as isize), x.to_value()) });
    if let Some((i, touched)) = init {
        let ib = Ptr::of(i);
        for (q, p) in i.layout().positions().enumerate().filter(|&(q, _)| !touched[q]) {
            // SAFETY: the caller's contract; init and dst share the dtype, so one element's bytes.
            unsafe { std::ptr::copy(ib.at(d, p), base.at(d, off + q as isize), d.size()) };
        }
    }
}
