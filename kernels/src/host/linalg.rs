//! The matrix routines, through `faer`: Cholesky factors, triangular solves and general solves
//! (LU with partial pivoting), QR, SVD and the Hermitian and general eigendecompositions on the
//! last two axes of batched operands. Each matrix is read into
//! a column-major `faer::Mat` through its layout, factored or solved there, and written out.
//! Several matrices run one per task, each on one thread; a single matrix runs on the library's
//! threads (faer splits its products by output blocks, so the bits do not depend on their count).
//! QR, SVD and the eigendecompositions, whose bits follow faer's split of them, get a fixed split
//! of `NOMINAL_SPLIT` (8) tasks on every matrix, alone or batched, run by whatever threads there are.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch, LltRegularization};
use faer::linalg::lu::partial_pivoting::{factor as lu, solve as lu_solve};
use faer::{Mat, MatMut, Par};
use num_complex::{Complex32, Complex64};
use rayon::prelude::*;

use super::eval::Ptr;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::kernels::full_precision;
use crate::layout::Layout;
use crate::{Answer, Dtype, Element};

/// A dtype the routines compute in: `f32`, `f64`, `Complex32`, `Complex64`.
trait Field: faer::traits::ComplexField + Element + Copy + Send + Sync {
    const NAN: Self;
    const ZERO: Self;
    const ONE: Self;
}

impl Field for f32 {
    const NAN: f32 = f32::NAN;
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}
impl Field for f64 {
    const NAN: f64 = f64::NAN;
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}
impl Field for Complex32 {
    const NAN: Complex32 = Complex32::new(f32::NAN, f32::NAN);
    const ZERO: Complex32 = Complex32::new(0.0, 0.0);
    const ONE: Complex32 = Complex32::new(1.0, 0.0);
}
impl Field for Complex64 {
    const NAN: Complex64 = Complex64::new(f64::NAN, f64::NAN);
    const ZERO: Complex64 = Complex64::new(0.0, 0.0);
    const ONE: Complex64 = Complex64::new(1.0, 0.0);
}

/// One operand's matrices: its memory, dtype and layout, the batch flattened in C order.
#[derive(Clone, Copy)]
struct Mats<'a> {
    p: Ptr,
    size: isize,
    layout: &'a Layout,
}

impl Mats<'_> {
    fn of(o: &dyn Operand) -> Mats<'_> {
        Mats { p: Ptr::of(o), size: o.dtype().size() as isize, layout: o.layout() }
    }

    /// The address of element (i, j) of matrix `b`.
    fn at(&self, b: usize, i: usize, j: usize) -> *mut u8 {
        let (shape, strides) = (self.layout.shape(), self.layout.strides());
        let r = shape.len();
        let mut pos = self.layout.offset() + i as isize * strides[r - 2] + j as isize * strides[r - 1];
        let mut k = b;
        for d in (0..r - 2).rev() {
            pos += (k % shape[d]) as isize * strides[d];
            k /= shape[d];
        }
        self.p.byte(pos * self.size)
    }

    /// The rows, columns and their strides of the matrices.
    fn dims(&self) -> (usize, usize, isize, isize) {
        let (shape, strides) = (self.layout.shape(), self.layout.strides());
        let r = shape.len();
        (shape[r - 2], shape[r - 1], strides[r - 2], strides[r - 1])
    }

    /// Matrix `b` as an owned column-major matrix, read in tiles through the layout's strides.
    fn read<T: Field>(&self, b: usize) -> Mat<T> {
        self.read_part(b, Part::All)
    }

    /// The `part` of matrix `b` (zeros elsewhere, never read).
    fn read_part<T: Field>(&self, b: usize, part: Part) -> Mat<T> {
        let (m, n, rs, cs) = self.dims();
        let mut x = Mat::<T>::zeros(m, n);
        if m == 0 || n == 0 {
            return x;
        }
        let xs = x.col_stride();
        let (from, to) = (self.at(b, 0, 0).cast::<T>().cast_const(), x.as_ptr_mut());
        // SAFETY: under the call's claims; every element read is a position of the checked
        // layout (the matrix's first element, then its strides within its extents), every one
        // written an element of `x`.
        unsafe { blocked_copy(m, n, part, from, rs, cs, to, 1, xs) };
        x
    }

    /// Writes `x` as matrix `b` (a destination's: this task's alone).
    fn write<T: Field>(&self, b: usize, x: faer::MatRef<'_, T>) {
        let (m, n, rs, cs) = self.dims();
        if m == 0 || n == 0 {
            return;
        }
        let (from, to) = (x.as_ptr(), self.at(b, 0, 0).cast::<T>());
        // SAFETY: under the call's claims; a destination reaches no element twice and matrix `b`
        // is written by this task alone, at positions of the checked layout; `x` is m × n.
        unsafe { blocked_copy(m, n, Part::All, from, x.row_stride(), x.col_stride(), to, rs, cs) };
    }
}

/// The elements of a matrix a routine reads: all, or a triangle with or without its diagonal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    All,
    /// `i ≥ j` (with the diagonal) or `i > j`.
    Lower {
        diagonal: bool,
    },
    /// `i ≤ j` (with the diagonal) or `i < j`.
    Upper {
        diagonal: bool,
    },
}

impl Part {
    fn has(self, i: usize, j: usize) -> bool {
        match self {
            Part::All => true,
            Part::Lower { diagonal } => i > j || (diagonal && i == j),
            Part::Upper { diagonal } => i < j || (diagonal && i == j),
        }
    }
}

/// Copies the `part` of an m × n matrix between strided layouts in square tiles, so that a
/// transposing copy (row-major to column-major) reads and writes whole cache lines.
///
/// # Safety
/// Every `from + i·frs + j·fcs` is readable and every `to + i·trs + j·tcs` writable, for i < m
/// and j < n, and the two do not overlap.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked_copy<T: Copy>(
    m: usize,
    n: usize,
    part: Part,
    from: *const T,
    frs: isize,
    fcs: isize,
    to: *mut T,
    trs: isize,
    tcs: isize,
) {
    const TILE: usize = 32;
    for i0 in (0..m).step_by(TILE) {
        for j0 in (0..n).step_by(TILE) {
            for i in i0..(i0 + TILE).min(m) {
                for j in j0..(j0 + TILE).min(n) {
                    if !part.has(i, j) {
                        continue;
                    }
                    let (i, j) = (i as isize, j as isize);
                    // SAFETY: the caller's contract.
                    unsafe { *to.offset(i * trs + j * tcs) = *from.offset(i * frs + j * fcs) };
                }
            }
        }
    }
}

/// The batch axes' extents and the matrices' (rows, columns) of a layout of rank ≥ 2.
fn split(l: &Layout) -> Option<(&[usize], usize, usize)> {
    let s = l.shape();
    (s.len() >= 2).then(|| (&s[..s.len() - 2], s[s.len() - 2], s[s.len() - 1]))
}

/// Runs `f(b, par)` for every matrix `b` of a batch of `count`: one task each on one thread, or
/// one matrix on the pool's threads (the routines whose bits do not depend on their count).
fn each(count: usize, f: impl Fn(usize, Par) + Sync) {
    if count == 1 {
        f(0, Par::rayon(rayon::current_num_threads()));
    } else {
        (0..count).into_par_iter().for_each(|b| f(b, Par::Seq));
    }
}

/// The split faer's QR, SVD and eigendecompositions are given, whatever the pool's threads: their
/// bits follow the split (its tasks' blocks), not the threads that run its tasks, so a fixed split
/// keeps the bits of one thread on any count while a pool of two or more shares the work.
const NOMINAL_SPLIT: usize = 8;

/// As [`each`] for the routines whose bits follow faer's split: every matrix, alone or in a batch,
/// under the same [`NOMINAL_SPLIT`], so its bits depend neither on the threads nor on the batch.
fn each_fixed(count: usize, f: impl Fn(usize, Par) + Sync) {
    (0..count).into_par_iter().for_each(|b| f(b, Par::rayon(NOMINAL_SPLIT)));
}

macro_rules! dispatch {
    ($d:expr, $go:ident) => {
        match $d {
            Dtype::F32 => $go!(f32),
            Dtype::F64 => $go!(f64),
            Dtype::C64 => $go!(Complex32),
            _ => $go!(Complex64),
        }
    };
}

pub(crate) fn cholesky(par: &std::sync::Arc<super::par::Par>, l: &dyn Operand, a: &dyn Operand) -> Answer {
    if !full_precision(a.dtype()) || l.dtype() != a.dtype() {
        return Answer::WrongDtype;
    }
    through_door(par, "cholesky", None, &[l], &[a], move |w, r, execute| {
        let (l, a) = (w[0], r[0]);
        let Some((batch, m, n)) = split(a.layout()) else { return Answer::ShapeMismatch };
        if m != n || l.layout().shape() != a.layout().shape() {
            return Answer::ShapeMismatch;
        }
        if let Some(x) = destinations(w, r) {
            return x;
        }
        if !execute {
            return Answer::Done;
        }
        let count = batch.iter().product();
        let (lm, am) = (Mats::of(l), Mats::of(a));
        macro_rules! go {
            ($t:ty) => {
                each(count, |b, par| {
                    let mut x = am.read_part::<$t>(b, Part::Lower { diagonal: true });
                    let mut mem = MemBuffer::new(cholesky_in_place_scratch::<$t>(n, par, Default::default()));
                    let reg =
                        LltRegularization { dynamic_regularization_delta: 0.0, dynamic_regularization_epsilon: 0.0 };
                    let ok =
                        cholesky_in_place(x.as_mut(), reg, par, MemStack::new(&mut mem), Default::default()).is_ok();
                    for j in 0..n {
                        for i in 0..n {
                            x[(i, j)] = if !ok {
                                <$t as Field>::NAN
                            } else if i < j {
                                <$t as Field>::ZERO
                            } else {
                                x[(i, j)]
                            };
                        }
                    }
                    lm.write(b, x.as_ref());
                })
            };
        }
        dispatch!(a.dtype(), go);
        Answer::Done
    })
}

/// The shapes of a solve: `a` `[batch…, n, n]`, `b` and `x` `[batch…, n, k]`.
fn solve_shapes(x: &Layout, a: &Layout, b: &Layout) -> Option<(usize, usize, usize)> {
    let (ab, m, n) = split(a)?;
    let (bb, bn, k) = split(b)?;
    (m == n && bn == n && ab == bb && x.shape() == b.shape()).then(|| (ab.iter().product(), n, k))
}

/// Which solve: of a triangle (`lower` or upper; `unit`: its diagonal taken as ones), or of a
/// general matrix by LU with partial pivoting.
#[derive(Clone, Copy)]
pub(crate) enum Solve {
    Triangular { lower: bool, unit: bool },
    General,
}

pub(crate) fn solve(
    par: &std::sync::Arc<super::par::Par>,
    kind: Solve,
    x: &dyn Operand,
    a: &dyn Operand,
    b: &dyn Operand,
) -> Answer {
    if !full_precision(a.dtype()) || x.dtype() != a.dtype() || b.dtype() != a.dtype() {
        return Answer::WrongDtype;
    }
    through_door(par, "solve", None, &[x], &[a, b], move |w, r, execute| {
        let (x, a, b) = (w[0], r[0], r[1]);
        let Some((count, n, k)) = solve_shapes(x.layout(), a.layout(), b.layout()) else {
            return Answer::ShapeMismatch;
        };
        if let Some(e) = destinations(w, r) {
            return e;
        }
        if !execute {
            return Answer::Done;
        }
        let (xm, am, bm) = (Mats::of(x), Mats::of(a), Mats::of(b));
        macro_rules! go {
            ($t:ty) => {
                each(count, |i, par| {
                    let mut rhs = bm.read::<$t>(i);
                    match kind {
                        Solve::Triangular { lower, unit } => {
                            let part =
                                if lower { Part::Lower { diagonal: !unit } } else { Part::Upper { diagonal: !unit } };
                            let t = am.read_part::<$t>(i, part);
                            triangular::<$t>(lower, unit, t.as_ref(), rhs.as_mut(), par);
                        }
                        Solve::General => lu_solve_in_place::<$t>(am.read::<$t>(i), rhs.as_mut(), n, k, par),
                    }
                    xm.write(i, rhs.as_ref());
                })
            };
        }
        dispatch!(a.dtype(), go);
        Answer::Done
    })
}

/// Solves `t·x = rhs` in place for the triangle of `t` that `lower` names (its diagonal taken
/// as ones where `unit`).
fn triangular<T: Field>(lower: bool, unit: bool, t: faer::MatRef<'_, T>, rhs: MatMut<'_, T>, par: Par) {
    use faer::linalg::triangular_solve as ts;
    match (lower, unit) {
        (true, false) => ts::solve_lower_triangular_in_place(t, rhs, par),
        (true, true) => ts::solve_unit_lower_triangular_in_place(t, rhs, par),
        (false, false) => ts::solve_upper_triangular_in_place(t, rhs, par),
        (false, true) => ts::solve_unit_upper_triangular_in_place(t, rhs, par),
    }
}

/// Solves `f·x = rhs` in place (`f` n × n, `rhs` n × k) by LU with partial pivoting, `f`
/// factored in place: L below the diagonal (its own diagonal of ones), U on and above.
fn lu_solve_in_place<T: Field>(mut f: Mat<T>, rhs: MatMut<'_, T>, n: usize, k: usize, par: Par) {
    let (mut perm, mut inv) = (vec![0usize; n], vec![0usize; n]);
    let need = lu::lu_in_place_scratch::<usize, T>(n, n, par, Default::default())
        .or(lu_solve::solve_in_place_scratch::<usize, T>(n, k, par));
    let mut mem = MemBuffer::new(need);
    let (_, p) = lu::lu_in_place(f.as_mut(), &mut perm, &mut inv, par, MemStack::new(&mut mem), Default::default());
    lu_solve::solve_in_place(f.as_ref(), f.as_ref(), p, rhs, par, MemStack::new(&mut mem));
}

/// Whether `l` is `[batch…, k]`: a vector of k values per matrix (singular values, eigenvalues).
fn vectors_of(l: &Layout, batch: &[usize], k: usize) -> bool {
    let s = l.shape();
    s.len() == batch.len() + 1 && s[..batch.len()] == *batch && s[batch.len()] == k
}

/// The address of element `i` of vector `b` of an array `[batch…, k]`.
fn vec_at(v: &Mats<'_>, b: usize, i: usize) -> *mut u8 {
    let (shape, strides) = (v.layout.shape(), v.layout.strides());
    let r = shape.len();
    let mut pos = v.layout.offset() + i as isize * strides[r - 1];
    let mut k = b;
    for d in (0..r - 1).rev() {
        pos += (k % shape[d]) as isize * strides[d];
        k /= shape[d];
    }
    v.p.byte(pos * v.size)
}

/// A float field's real part type (`f32` for `Complex32`) and the real part of a value.
trait RealOf: Field {
    type Part: Element;
    fn re(self) -> Self::Part;
}
impl RealOf for f32 {
    type Part = f32;
    fn re(self) -> f32 {
        self
    }
}
impl RealOf for f64 {
    type Part = f64;
    fn re(self) -> f64 {
        self
    }
}
impl RealOf for Complex32 {
    type Part = f32;
    fn re(self) -> f32 {
        self.re
    }
}
impl RealOf for Complex64 {
    type Part = f64;
    fn re(self) -> f64 {
        self.re
    }
}

/// The real dtype of a full-precision dtype's parts.
fn real_of(d: Dtype) -> Dtype {
    match d {
        Dtype::C64 => Dtype::F32,
        Dtype::C128 => Dtype::F64,
        d => d,
    }
}

/// Writes the real parts of `s` as vector `b` of `v`.
fn write_real<T: RealOf>(v: &Mats<'_>, b: usize, s: faer::diag::DiagRef<'_, T>) {
    let s = s.column_vector();
    for i in 0..s.nrows() {
        // SAFETY: under the call's claims, at a position of the checked layout; vector `b` of a
        // destination is written by this task alone.
        unsafe { <T::Part as Element>::store(vec_at(v, b, i), s[i].re()) };
    }
}

macro_rules! dispatch_real {
    ($d:expr, $go:ident) => {
        match $d {
            Dtype::F32 => $go!(f32),
            Dtype::F64 => $go!(f64),
            Dtype::C64 => $go!(Complex32),
            _ => $go!(Complex64),
        }
    };
}

pub(crate) fn qr(par: &std::sync::Arc<super::par::Par>, q: &dyn Operand, r: &dyn Operand, a: &dyn Operand) -> Answer {
    if !full_precision(a.dtype()) || q.dtype() != a.dtype() || r.dtype() != a.dtype() {
        return Answer::WrongDtype;
    }
    through_door(par, "qr", None, &[q, r], &[a], move |w, rd, execute| {
        let (q, r, a) = (w[0], w[1], rd[0]);
        let (Some((batch, m, n)), Some((qb, qm, qk)), Some((rb, rk, rn))) =
            (split(a.layout()), split(q.layout()), split(r.layout()))
        else {
            return Answer::ShapeMismatch;
        };
        let k = m.min(n);
        // reduced (q m × k, r k × n) or complete (q m × m, r m × n), read from q's shape
        let complete = qk == m;
        let fits = qb == batch && rb == batch && qm == m && (qk == k || complete) && rk == qk && rn == n;
        if !fits {
            return Answer::ShapeMismatch;
        }
        if let Some(e) = destinations(w, rd) {
            return e;
        }
        if !execute {
            return Answer::Done;
        }
        let count = batch.iter().product();
        let (qm_, rm_, am) = (Mats::of(q), Mats::of(r), Mats::of(a));
        macro_rules! go {
            ($t:ty) => {
                each_fixed(count, |b, par| {
                    let mut f = am.read::<$t>(b);
                    let cols = if complete { m } else { k };
                    let mut qq = Mat::<$t>::identity(m, cols);
                    let mut rr = Mat::<$t>::zeros(cols, n);
                    if k > 0 {
                        use faer::linalg::householder as hh;
                        use faer::linalg::qr::no_pivoting::factor as qf;
                        let bs = qf::recommended_block_size::<$t>(m, n).max(1);
                        let mut coeff = Mat::<$t>::zeros(bs, k);
                        let mut mem = MemBuffer::new(qf::qr_in_place_scratch::<$t>(m, n, bs, par, Default::default()));
                        qf::qr_in_place(f.as_mut(), coeff.as_mut(), par, MemStack::new(&mut mem), Default::default());
                        // r: the upper trapezoid; the Householder basis: below the diagonal, ones on it
                        let mut basis = Mat::<$t>::zeros(m, k);
                        for j in 0..k {
                            for i in 0..m {
                                if i < j {
                                    continue;
                                }
                                basis[(i, j)] = if i == j { <$t as Field>::ONE } else { f[(i, j)] };
                            }
                        }
                        for j in 0..n {
                            for i in 0..=j.min(k - 1) {
                                rr[(i, j)] = f[(i, j)];
                            }
                        }
                        let need = hh::apply_block_householder_sequence_on_the_left_in_place_scratch::<$t>(m, bs, cols);
                        let mut mem = MemBuffer::new(need);
                        hh::apply_block_householder_sequence_on_the_left_in_place_with_conj(
                            basis.as_ref(),
                            coeff.as_ref(),
                            faer::Conj::No,
                            qq.as_mut(),
                            par,
                            MemStack::new(&mut mem),
                        );
                    }
                    qm_.write(b, qq.as_ref());
                    rm_.write(b, rr.as_ref());
                })
            };
        }
        dispatch!(a.dtype(), go);
        Answer::Done
    })
}

pub(crate) fn svd(
    par: &std::sync::Arc<super::par::Par>,
    u: Option<&dyn Operand>,
    s: &dyn Operand,
    vh: Option<&dyn Operand>,
    a: &dyn Operand,
) -> Answer {
    let d = a.dtype();
    if !full_precision(d)
        || s.dtype() != real_of(d)
        || u.is_some_and(|u| u.dtype() != d)
        || vh.is_some_and(|v| v.dtype() != d)
    {
        return Answer::WrongDtype;
    }
    if u.is_some() != vh.is_some() {
        return Answer::ShapeMismatch;
    }
    let vectors = u.is_some();
    let written: Vec<&dyn Operand> = [Some(s), u, vh].into_iter().flatten().collect();
    through_door(par, "svd", None, &written, &[a], move |w, rd, execute| {
        let a = rd[0];
        let Some((batch, m, n)) = split(a.layout()) else { return Answer::ShapeMismatch };
        let k = m.min(n);
        if !vectors_of(w[0].layout(), batch, k) {
            return Answer::ShapeMismatch;
        }
        // reduced (u m × k, vh k × n) or complete (u m × m, vh n × n), read from the shapes
        let mut complete = false;
        if vectors {
            let (Some((ub, um, uk)), Some((vb, vk, vn))) = (split(w[1].layout()), split(w[2].layout())) else {
                return Answer::ShapeMismatch;
            };
            complete = uk == m && vk == n && (m != n || uk == k);
            let reduced = uk == k && vk == k;
            if ub != batch || vb != batch || um != m || vn != n || !(complete || reduced) {
                return Answer::ShapeMismatch;
            }
            complete = complete && !reduced;
        }
        if let Some(e) = destinations(w, rd) {
            return e;
        }
        if !execute {
            return Answer::Done;
        }
        let count = batch.iter().product();
        let sm = Mats::of(w[0]);
        let (um, vm) = (vectors.then(|| Mats::of(w[1])), vectors.then(|| Mats::of(w[2])));
        let am = Mats::of(a);
        use faer::linalg::svd::{svd as faer_svd, svd_scratch, ComputeSvdVectors};
        let how = if !vectors {
            ComputeSvdVectors::No
        } else if complete {
            ComputeSvdVectors::Full
        } else {
            ComputeSvdVectors::Thin
        };
        macro_rules! go {
            ($t:ty) => {
                each_fixed(count, |b, par| {
                    let x = am.read::<$t>(b);
                    let (uc, vc) = if complete { (m, n) } else { (k, k) };
                    let mut sv = faer::diag::Diag::<$t>::zeros(k);
                    let (mut uu, mut vv) = (Mat::<$t>::zeros(m, uc), Mat::<$t>::zeros(n, vc));
                    // no values (an empty side): the complete factors are any orthonormal bases
                    let ok = if k == 0 {
                        uu = Mat::identity(m, uc);
                        vv = Mat::identity(n, vc);
                        true
                    } else {
                        let mut mem = MemBuffer::new(svd_scratch::<$t>(m, n, how, how, par, Default::default()));
                        let (ou, ov) = if vectors { (Some(uu.as_mut()), Some(vv.as_mut())) } else { (None, None) };
                        faer_svd(x.as_ref(), sv.as_mut(), ou, ov, par, MemStack::new(&mut mem), Default::default())
                            .is_ok()
                    };
                    if !ok {
                        sv.column_vector_mut().fill(<$t as Field>::NAN);
                        uu.fill(<$t as Field>::NAN);
                        vv.fill(<$t as Field>::NAN);
                    }
                    write_real(&sm, b, sv.as_ref());
                    if let (Some(um), Some(vm)) = (&um, &vm) {
                        um.write(b, uu.as_ref());
                        vm.write(b, vv.adjoint().to_owned().as_ref());
                    }
                })
            };
        }
        dispatch_real!(d, go);
        Answer::Done
    })
}

/// The checks of an eigendecomposition's destinations: `a` square, `w` `[batch…, n]`, `v`
/// (where given) of `a`'s shape, then the door's; the count of matrices and `n` where all pass.
fn eigen_shapes(wr: &[&dyn Operand], rd: &[&dyn Operand], vectors: bool) -> Result<(usize, usize), Answer> {
    let a = rd[0];
    let Some((batch, m, n)) = split(a.layout()) else { return Err(Answer::ShapeMismatch) };
    let fits =
        m == n && vectors_of(wr[0].layout(), batch, n) && (!vectors || wr[1].layout().shape() == a.layout().shape());
    if !fits {
        return Err(Answer::ShapeMismatch);
    }
    if let Some(e) = destinations(wr, rd) {
        return Err(e);
    }
    Ok((batch.iter().product(), n))
}

pub(crate) fn eigh(
    par: &std::sync::Arc<super::par::Par>,
    w: &dyn Operand,
    v: Option<&dyn Operand>,
    a: &dyn Operand,
) -> Answer {
    let d = a.dtype();
    if !full_precision(d) || w.dtype() != real_of(d) || v.is_some_and(|v| v.dtype() != d) {
        return Answer::WrongDtype;
    }
    let vectors = v.is_some();
    let written: Vec<&dyn Operand> = [Some(w), v].into_iter().flatten().collect();
    through_door(par, "eigh", None, &written, &[a], move |wr, rd, execute| {
        let (count, n) = match eigen_shapes(wr, rd, vectors) {
            Ok(dims) => dims,
            Err(e) => return e,
        };
        if !execute {
            return Answer::Done;
        }
        let a = rd[0];
        let (wm, vm, am) = (Mats::of(wr[0]), vectors.then(|| Mats::of(wr[1])), Mats::of(a));
        use faer::linalg::evd::{self_adjoint_evd, self_adjoint_evd_scratch, ComputeEigenvectors};
        let how = if vectors { ComputeEigenvectors::Yes } else { ComputeEigenvectors::No };
        macro_rules! go {
            ($t:ty) => {
                each_fixed(count, |b, par| {
                    // the lower triangle, mirrored: faer reads the lower triangle alone
                    let x = am.read_part::<$t>(b, Part::Lower { diagonal: true });
                    let mut ev = faer::diag::Diag::<$t>::zeros(n);
                    let mut uu = Mat::<$t>::zeros(n, n);
                    let ok = n == 0 || {
                        let mut mem = MemBuffer::new(self_adjoint_evd_scratch::<$t>(n, how, par, Default::default()));
                        let ou = if vectors { Some(uu.as_mut()) } else { None };
                        self_adjoint_evd(x.as_ref(), ev.as_mut(), ou, par, MemStack::new(&mut mem), Default::default())
                            .is_ok()
                    };
                    if !ok {
                        ev.column_vector_mut().fill(<$t as Field>::NAN);
                        uu.fill(<$t as Field>::NAN);
                    }
                    write_real(&wm, b, ev.as_ref());
                    if let Some(vm) = &vm {
                        vm.write(b, uu.as_ref());
                    }
                })
            };
        }
        dispatch_real!(d, go);
        Answer::Done
    })
}

/// The complex dtype of `d`'s precision: eig's values and vectors.
fn complex_of(d: Dtype) -> Dtype {
    match d {
        Dtype::F32 | Dtype::C64 => Dtype::C64,
        _ => Dtype::C128,
    }
}

pub(crate) fn eig(
    par: &std::sync::Arc<super::par::Par>,
    w: &dyn Operand,
    v: Option<&dyn Operand>,
    a: &dyn Operand,
) -> Answer {
    let d = a.dtype();
    let c = complex_of(d);
    if !full_precision(d) || w.dtype() != c || v.is_some_and(|v| v.dtype() != c) {
        return Answer::WrongDtype;
    }
    let vectors = v.is_some();
    let written: Vec<&dyn Operand> = [Some(w), v].into_iter().flatten().collect();
    through_door(par, "eig", None, &written, &[a], move |wr, rd, execute| {
        let (count, n) = match eigen_shapes(wr, rd, vectors) {
            Ok(dims) => dims,
            Err(e) => return e,
        };
        if !execute {
            return Answer::Done;
        }
        let a = rd[0];
        let (wm, vm, am) = (Mats::of(wr[0]), vectors.then(|| Mats::of(wr[1])), Mats::of(a));
        use faer::linalg::evd::{evd_cplx, evd_real, evd_scratch, ComputeEigenvectors};
        let how = if vectors { ComputeEigenvectors::Yes } else { ComputeEigenvectors::No };
        // Writes matrix b's values (and vectors), NaNs where the iteration failed.
        macro_rules! out {
            ($c:ty, $b:expr, $ok:expr, $vals:expr, $vecs:expr) => {{
                let (mut vals, mut vecs): (Vec<$c>, Mat<$c>) = ($vals, $vecs);
                if !$ok {
                    vals.fill(<$c as Field>::NAN);
                    vecs.fill(<$c as Field>::NAN);
                }
                for (i, x) in vals.iter().enumerate() {
                    // SAFETY: under the call's claims, at a position of the checked layout;
                    // vector b of a destination is written by this task alone.
                    unsafe { <$c as Element>::store(vec_at(&wm, $b, i), *x) };
                }
                if let Some(vm) = &vm {
                    // each column to unit 2-norm (faer's scaled norm; a zero column stays zero)
                    for j in 0..vecs.ncols() {
                        let norm = vecs.col(j).norm_l2();
                        if norm > 0.0 {
                            for i in 0..vecs.nrows() {
                                vecs[(i, j)] = <$c>::new(vecs[(i, j)].re / norm, vecs[(i, j)].im / norm);
                            }
                        }
                    }
                    vm.write($b, vecs.as_ref());
                }
            }};
        }
        macro_rules! real {
            ($t:ty, $c:ty) => {
                each_fixed(count, |b, par| {
                    let x = am.read::<$t>(b);
                    let (mut re, mut im) = (faer::diag::Diag::<$t>::zeros(n), faer::diag::Diag::<$t>::zeros(n));
                    let mut ur = Mat::<$t>::zeros(n, n);
                    let ok = n == 0 || {
                        let mut mem =
                            MemBuffer::new(evd_scratch::<$t>(n, ComputeEigenvectors::No, how, par, Default::default()));
                        let ou = if vectors { Some(ur.as_mut()) } else { None };
                        let stack = MemStack::new(&mut mem);
                        evd_real(x.as_ref(), re.as_mut(), im.as_mut(), None, ou, par, stack, Default::default()).is_ok()
                    };
                    // a conjugate pair's vectors are held as the real and imaginary parts of the
                    // first's, in two adjacent columns (LAPACK's convention)
                    let (re, im) = (re.column_vector(), im.column_vector());
                    let mut vals = vec![<$c>::new(0.0, 0.0); n];
                    let mut vecs = Mat::<$c>::zeros(if vectors { n } else { 0 }, if vectors { n } else { 0 });
                    let mut j = 0;
                    while j < n {
                        if im[j] == 0.0 || j + 1 == n {
                            vals[j] = <$c>::new(re[j], im[j]);
                            for i in 0..vecs.nrows() {
                                vecs[(i, j)] = <$c>::new(ur[(i, j)], 0.0);
                            }
                            j += 1;
                        } else {
                            vals[j] = <$c>::new(re[j], im[j]);
                            vals[j + 1] = <$c>::new(re[j], -im[j]);
                            for i in 0..vecs.nrows() {
                                vecs[(i, j)] = <$c>::new(ur[(i, j)], ur[(i, j + 1)]);
                                vecs[(i, j + 1)] = <$c>::new(ur[(i, j)], -ur[(i, j + 1)]);
                            }
                            j += 2;
                        }
                    }
                    out!($c, b, ok, vals, vecs);
                })
            };
        }
        macro_rules! complex {
            ($c:ty) => {
                each_fixed(count, |b, par| {
                    let x = am.read::<$c>(b);
                    let mut s = faer::diag::Diag::<$c>::zeros(n);
                    let mut ur = Mat::<$c>::zeros(if vectors { n } else { 0 }, if vectors { n } else { 0 });
                    let ok = n == 0 || {
                        let mut mem =
                            MemBuffer::new(evd_scratch::<$c>(n, ComputeEigenvectors::No, how, par, Default::default()));
                        let ou = if vectors { Some(ur.as_mut()) } else { None };
                        let stack = MemStack::new(&mut mem);
                        evd_cplx(x.as_ref(), s.as_mut(), None, ou, par, stack, Default::default()).is_ok()
                    };
                    let vals: Vec<$c> = s.column_vector().iter().copied().collect();
                    out!($c, b, ok, vals, ur);
                })
            };
        }
        match d {
            Dtype::F32 => real!(f32, Complex32),
            Dtype::F64 => real!(f64, Complex64),
            Dtype::C64 => complex!(Complex32),
            _ => complex!(Complex64),
        }
        Answer::Done
    })
}
