//! The contraction kernel: operands permuted to (batch, free, contracting) views, a matrix
//! product per batch: nx's own for `f32` (and f16 and fp8, widened to it), its bf16 one for bf16
//! (AMX tiles where the library's level is `amx`, `vdpbf16ps` where it has AVX-512 BF16), `faer`'s
//! for the rest.

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};
use rayon::prelude::*;

use super::bgemm::{bgemm, bgemm_into_bf16, writes_bf16, Bf16Isa};
use super::eval::Ptr;
use super::sgemm::{sgemm, Isa, Mat, Out, Rows};
use super::through_door;
use crate::door::{identical, Operand};
use crate::dtype::convert::{f32_to_bf16, f32_to_f16};
use crate::dtype::fp8::{F8E4M3, F8E5M2};
use crate::layout::{extent_product, Layout, Move};
use crate::runs::Runs;
use crate::Contraction;
use crate::{Answer, Dtype, Element, Simd};

/// An operand as a [B, rows, cols] view: base address and strides in elements.
#[derive(Clone, Copy)]
pub(crate) struct View {
    pub(crate) base: Ptr,
    pub(crate) offset: isize,
    pub(crate) strides: [isize; 3],
}

impl View {
    /// The element at `[b, r, c]`.
    ///
    /// # Safety
    /// The view addresses live `T`s there.
    pub(crate) unsafe fn load<T: Element>(&self, b: usize, r: usize, c: usize) -> T {
        let pos =
            self.offset + b as isize * self.strides[0] + r as isize * self.strides[1] + c as isize * self.strides[2];
        // SAFETY: the caller's contract.
        unsafe { T::load(self.base.at(T::DTYPE, pos)) }
    }
}

/// The operand's layout permuted by `perm` and merged to `[b, r, c]`, if that is a view.
pub(crate) fn as_view(layout: &Layout, perm: &[usize], dims: [usize; 3]) -> Option<(isize, [isize; 3])> {
    let p = layout.apply(&Move::Permute(perm.to_vec())).ok()??;
    let v = p.apply(&Move::Reshape(dims.to_vec())).ok()??;
    Some((v.offset(), [v.strides()[0], v.strides()[1], v.strides()[2]]))
}

/// Elements converted a task at a time where the layout is contiguous.
const CONVERT_TASK: usize = 1 << 16;

/// The elements of `o` (of Rust type `S`) in C order of its layout permuted by `perm`, as `T`.
///
/// # Safety
/// A claim on `o`'s buffer is held and `S` is its element type.
unsafe fn pack<S: Element, T: Send>(o: &dyn Operand, perm: &[usize], conv: impl Fn(S) -> T + Sync) -> Vec<T> {
    let l = o.layout().apply(&Move::Permute(perm.to_vec())).ok().flatten().expect("a permutation of its axes");
    let base = Ptr::of(o);
    if l.is_contiguous() {
        // in parallel, the elements in memory order
        let (off, n) = (l.offset(), l.numel());
        return (0..n)
            .into_par_iter()
            .with_min_len(CONVERT_TASK)
            // SAFETY: the caller's contract; a contiguous layout holds n elements from its offset.
            .map(|k| conv(unsafe { S::load(base.at(S::DTYPE, off + k as isize)) }))
            .collect();
    }
    // SAFETY: the caller's contract; positions of a checked layout.
    l.positions().map(|p| conv(unsafe { S::load(base.at(S::DTYPE, p)) })).collect()
}

pub(crate) struct Dims {
    pub(crate) b: usize,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// The SIMD level the products run.
    pub(crate) simd: Simd,
}

/// `dst[b] (+)= lhs[b] · rhs[b]` for every batch `b` (`add`: accumulate into what `dst` holds;
/// else overwrite it), `dst` C-contiguous (b, m, n). One batch takes every thread of the pool;
/// many batches spread over the pool, one thread each. `f32` goes to nx's own product, whose bits
/// depend on `k` alone; the other types to faer's, which blocks the contracting axis by cache
/// sizes alone, so the bits do not depend on the thread count (checked with 1, 2 and 8).
///
/// # Safety
/// The views address valid `T`s of live memory over their (b, m, k) and (b, k, n) extents; `dst`
/// holds b·m·n of them that nothing else touches meanwhile.
pub(crate) unsafe fn product<T: faer::traits::ComplexField + Copy + Send + Sync + 'static>(
    d: &Dims,
    dst: Ptr,
    lhs: View,
    rhs: View,
    add: bool,
    one: T,
) {
    let threads = rayon::current_num_threads().max(1);
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: the caller's contract, T being f32.
        return unsafe { product_f32(d, dst, lhs, rhs, add, threads) };
    }
    let size = size_of::<T>() as isize;
    let one_batch = |bb: usize, par: faer::Par| {
        let (dst, lhs, rhs) = (dst, lhs, rhs);
        let at = |v: View| v.base.0.wrapping_offset((v.offset + bb as isize * v.strides[0]) * size).cast::<T>();
        let out = dst.0.wrapping_offset((bb * d.m * d.n) as isize * size).cast::<T>();
        // SAFETY: the caller's contract; batch bb of dst is written by this call alone.
        unsafe {
            let a = faer::MatRef::from_raw_parts(at(lhs), d.m, d.k, lhs.strides[1], lhs.strides[2]);
            let b = faer::MatRef::from_raw_parts(at(rhs), d.k, d.n, rhs.strides[1], rhs.strides[2]);
            let c = faer::MatMut::from_raw_parts_mut(out, d.m, d.n, d.n as isize, 1);
            let accum = if add { faer::Accum::Add } else { faer::Accum::Replace };
            faer::linalg::matmul::matmul(c, accum, a, b, one, par);
        }
    };
    if d.b >= threads {
        (0..d.b).into_par_iter().for_each(|bb| one_batch(bb, faer::Par::Seq));
    } else {
        (0..d.b).for_each(|bb| one_batch(bb, faer::Par::rayon(threads)));
    }
}

/// Runs `one(b, parallel)` for every batch `b`: one batch on every thread of the pool (`parallel`),
/// many batches spread over the pool, one thread each.
fn spread(d: &Dims, threads: usize, one: impl Fn(usize, bool) + Sync) {
    if d.b >= threads {
        (0..d.b).into_par_iter().for_each(|bb| one(bb, false));
    } else {
        (0..d.b).for_each(|bb| one(bb, true));
    }
}

/// Batch `bb` of a view of `T`s as a matrix.
fn batch<'a, T>(v: View, bb: usize) -> Mat<'a, T> {
    let base = v.base.0.wrapping_offset((v.offset + bb as isize * v.strides[0]) * size_of::<T>() as isize).cast();
    Mat { base, rows: Rows::Stride(v.strides[1]), col: v.strides[2] }
}

/// Batch `bb` of the C-contiguous f32 destination.
fn batch_out<'a>(d: &Dims, dst: Ptr, bb: usize) -> Out<'a> {
    Out { base: dst.0.wrapping_offset((bb * d.m * d.n) as isize * 4).cast(), rows: Rows::Stride(d.n as isize) }
}

/// [`product`] for `f32`, by nx's own kernel ([`super::sgemm`]): its bits depend on `k` alone.
///
/// # Safety
/// As [`product`].
unsafe fn product_f32(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool, threads: usize) {
    let isa = Isa::of(d.simd);
    spread(d, threads, |bb, parallel| {
        let (dst, lhs, rhs) = (dst, lhs, rhs);
        // SAFETY: the caller's contract; batch bb of dst is written by this call alone.
        unsafe { sgemm(isa, d.m, d.n, d.k, batch(lhs, bb), batch(rhs, bb), batch_out(d, dst, bb), add, parallel) }
    });
}

/// `dst[b] (+)= lhs[b] · rhs[b]` (`add`: onto what `dst` holds) for bf16 views into an f32 `dst`, by the bf16 product
/// ([`super::bgemm`]), batches spread as [`product`] spreads them.
///
/// # Safety
/// As [`product`], the views addressing bf16s and `dst` f32s.
unsafe fn product_bf16(d: &Dims, dst: Ptr, lhs: View, rhs: View, add: bool, threads: usize) {
    let isa = Bf16Isa::of(d.simd);
    spread(d, threads, |bb, parallel| {
        let (dst, lhs, rhs) = (dst, lhs, rhs);
        // SAFETY: the caller's contract; batch bb of dst is written by this call alone.
        unsafe { bgemm(isa, d.m, d.n, d.k, batch(lhs, bb), batch(rhs, bb), batch_out(d, dst, bb), add, parallel) }
    });
}

/// Operand `o` permuted by `perm` as a `[b, rows, cols]` view of its own memory, or, where no
/// view exists, of a C-order copy kept in `keep`.
///
/// # Safety
/// A claim on `o`'s buffer is held and `T` is its element type.
unsafe fn view_or_copy<T: Element + Send>(
    o: &dyn Operand,
    perm: &[usize],
    shape: [usize; 3],
    keep: &mut Vec<Vec<T>>,
) -> View {
    match as_view(o.layout(), perm, shape) {
        Some((offset, strides)) => View { base: Ptr::of(o), offset, strides },
        None => {
            // SAFETY: the caller's contract.
            let packed = unsafe { pack::<T, T>(o, perm, |x| x) };
            let v = View {
                base: Ptr(packed.as_ptr() as *mut u8),
                offset: 0,
                strides: [(shape[1] * shape[2]) as isize, shape[2] as isize, 1],
            };
            keep.push(packed);
            v
        }
    }
}

pub(crate) fn contract(
    par: &std::sync::Arc<super::par::Par>,
    spec: &Contraction,
    dst: &dyn Operand,
    a: &dyn Operand,
    b: &dyn Operand,
    init: Option<&dyn Operand>,
) -> Answer {
    let d = dst.dtype();
    if a.dtype() != d || b.dtype() != d || init.is_some_and(|i| i.dtype() != d) {
        return Answer::WrongDtype;
    }
    if !matches!(
        d,
        Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64 | Dtype::C64 | Dtype::C128
    ) {
        return Answer::Declined;
    }
    let Ok(out_shape) = spec.shape(a.layout().shape(), b.layout().shape()) else { return Answer::ShapeMismatch };
    let mut reads: Vec<&dyn Operand> = vec![a, b];
    reads.extend(init);
    let spec = spec.clone();
    let simd = par.simd();
    through_door(par, "contract", None, &[dst], &reads, move |w, r, run| {
        let (dst, a, b, init, spec) = (w[0], r[0], r[1], r.get(2).copied(), &spec);
        if dst.layout().shape() != out_shape || init.is_some_and(|i| i.layout().shape() != out_shape) {
            return Answer::ShapeMismatch;
        }
        // a and b are read at other indices than the result's: they must not share its bytes
        if let Some(e) = super::destinations(&[dst], &[a, b]) {
            return e;
        }
        if !run {
            return Answer::Done;
        }
        let (sa, sb) = (a.layout().shape(), b.layout().shape());
        let batch_a: Vec<usize> = spec.batch.iter().map(|p| p.0).collect();
        let batch_b: Vec<usize> = spec.batch.iter().map(|p| p.1).collect();
        let con_a: Vec<usize> = spec.contracting.iter().map(|p| p.0).collect();
        let con_b: Vec<usize> = spec.contracting.iter().map(|p| p.1).collect();
        let free_a: Vec<usize> = (0..sa.len()).filter(|x| !batch_a.contains(x) && !con_a.contains(x)).collect();
        let free_b: Vec<usize> = (0..sb.len()).filter(|x| !batch_b.contains(x) && !con_b.contains(x)).collect();
        let ext = |s: &[usize], ax: &[usize]| extent_product(ax.iter().map(|&x| s[x]));
        let dims = Dims { b: ext(sa, &batch_a), m: ext(sa, &free_a), n: ext(sb, &free_b), k: ext(sa, &con_a), simd };
        let perm_a: Vec<usize> = batch_a.iter().chain(&free_a).chain(&con_a).copied().collect();
        let perm_b: Vec<usize> = batch_b.iter().chain(&con_b).chain(&free_b).copied().collect();
        // SAFETY: the door holds every claim for this closure's whole run.
        unsafe {
            match d {
                Dtype::F32 => native::<f32>(&dims, dst, a, b, init, &perm_a, &perm_b, 1.0),
                Dtype::F64 => native::<f64>(&dims, dst, a, b, init, &perm_a, &perm_b, 1.0),
                Dtype::C64 => native::<Complex32>(&dims, dst, a, b, init, &perm_a, &perm_b, Complex32::new(1.0, 0.0)),
                Dtype::C128 => native::<Complex64>(&dims, dst, a, b, init, &perm_a, &perm_b, Complex64::new(1.0, 0.0)),
                Dtype::F16 => widened::<f16>(&dims, dst, a, b, init, &perm_a, &perm_b, f16::to_f32, f32_to_f16),
                Dtype::BF16 => widened::<bf16>(&dims, dst, a, b, init, &perm_a, &perm_b, bf16::to_f32, f32_to_bf16),
                Dtype::F8E4M3 => {
                    widened::<F8E4M3>(&dims, dst, a, b, init, &perm_a, &perm_b, F8E4M3::to_f32, F8E4M3::from_f32)
                }
                Dtype::F8E5M2 => {
                    widened::<F8E5M2>(&dims, dst, a, b, init, &perm_a, &perm_b, F8E5M2::to_f32, F8E5M2::from_f32)
                }
                _ => unreachable!("declined above"),
            }
        }
        Answer::Done
    })
}

/// Elements of `init` a task of [`start`] copies.
const START_TASK: usize = 1 << 15;

/// Writes `init` (or +0) into the C-contiguous destination.
///
/// # Safety
/// Claims held; `T` is the destination's element type.
unsafe fn start<T: Element>(dst: &dyn Operand, init: Option<&dyn Operand>) {
    let out = Ptr::of(dst);
    let off = dst.layout().offset();
    match init {
        Some(i)
            if identical(i.layout(), i.dtype().size(), dst.layout(), dst.dtype().size())
                && i.buffer().memory_id() == dst.buffer().memory_id() => {}
        Some(i) => {
            // a run of the innermost axes at a time: a copy where init's run is contiguous, one
            // value repeated where it is broadcast (a bias's rows)
            let (src, l) = (Ptr::of(i), i.layout());
            // the C-contiguous destination's strides (its shape is init's, and fits: dst exists)
            let mut dense = vec![1isize; l.shape().len()];
            for d in (0..dense.len().saturating_sub(1)).rev() {
                dense[d] = dense[d + 1] * l.shape()[d + 1] as isize;
            }
            // in pieces of START_TASK elements over the pool (a bias copied into a product's rows
            // is a pass over the whole output: serial, it held the other threads off the product)
            let n = l.numel();
            let piece = |c: usize| {
                let lo = c * START_TASK;
                let mut runs =
                    Runs::new(l.shape(), [l.strides(), &dense], [l.offset(), off], lo, START_TASK.min(n - lo));
                let [ss, ds] = runs.inner_strides();
                while let Some(([p, q], n)) = runs.next_run() {
                    if ss == 1 && ds == 1 {
                        // SAFETY: the caller's contract; n elements contiguous in both, init's and
                        // the destination's bytes disjoint (the door's overlap check).
                        unsafe {
                            std::ptr::copy_nonoverlapping(src.at(T::DTYPE, p), out.at(T::DTYPE, q), n * T::DTYPE.size())
                        }
                        continue;
                    }
                    for e in 0..n as isize {
                        // SAFETY: the caller's contract; positions of init's checked layout and of
                        // the C-contiguous destination.
                        unsafe { T::store(out.at(T::DTYPE, q + e * ds), T::load(src.at(T::DTYPE, p + e * ss))) }
                    }
                }
            };
            let pieces = n.div_ceil(START_TASK);
            if pieces > 1 {
                (0..pieces).into_par_iter().for_each(piece);
            } else if n > 0 {
                piece(0);
            }
        }
        None => {
            for k in 0..dst.layout().numel() {
                // SAFETY: the caller's contract.
                unsafe { T::store(out.at(T::DTYPE, off + k as isize), T::default()) }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn native<T: Element + faer::traits::ComplexField>(
    dims: &Dims,
    dst: &dyn Operand,
    a: &dyn Operand,
    b: &dyn Operand,
    init: Option<&dyn Operand>,
    perm_a: &[usize],
    perm_b: &[usize],
    one: T,
) {
    // SAFETY: the caller's contract throughout.
    unsafe {
        if dims.k == 0 || dims.m == 0 || dims.n == 0 || dims.b == 0 {
            start::<T>(dst, init);
            return;
        }
        // with an init, the product adds to it; without, it overwrites the destination
        if init.is_some() {
            start::<T>(dst, init);
        }
        let mut keep: Vec<Vec<T>> = Vec::new();
        let lhs = view_or_copy(a, perm_a, [dims.b, dims.m, dims.k], &mut keep);
        let rhs = view_or_copy(b, perm_b, [dims.b, dims.k, dims.n], &mut keep);
        let out = Ptr(Ptr::of(dst).at(T::DTYPE, dst.layout().offset()));
        product::<T>(dims, out, lhs, rhs, init.is_some(), one);
        drop(keep);
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn widened<H: Element>(
    dims: &Dims,
    dst: &dyn Operand,
    a: &dyn Operand,
    b: &dyn Operand,
    init: Option<&dyn Operand>,
    perm_a: &[usize],
    perm_b: &[usize],
    up: fn(H) -> f32,
    down: fn(f32) -> H,
) {
    // SAFETY: the caller's contract throughout.
    unsafe {
        if dims.k == 0 {
            // No products: each output is init's element, bit for bit (a NaN keeps its payload).
            start::<H>(dst, init);
            return;
        }
        let n_out = dims.b * dims.m * dims.n;
        let bf16 = dims.m > 0 && dims.n > 0 && dims.b > 0 && H::DTYPE == Dtype::BF16;
        if bf16 && writes_bf16(Bf16Isa::of(dims.simd), dims.k) {
            // the AMX tiles round their sums into the destination themselves (from init, copied
            // there first): no f32 accumulator
            if init.is_some() {
                start::<H>(dst, init);
            }
            let mut keep: Vec<Vec<H>> = Vec::new();
            let lhs = view_or_copy(a, perm_a, [dims.b, dims.m, dims.k], &mut keep);
            let rhs = view_or_copy(b, perm_b, [dims.b, dims.k, dims.n], &mut keep);
            let out = Ptr(Ptr::of(dst).at(H::DTYPE, dst.layout().offset()));
            let adding = init.is_some();
            spread(dims, rayon::current_num_threads().max(1), |bb, parallel| {
                let (out, lhs, rhs) = (out, lhs, rhs);
                let c = Out {
                    base: out.0.wrapping_add(bb * dims.m * dims.n * 2).cast::<bf16>(),
                    rows: Rows::Stride(dims.n as isize),
                };
                // SAFETY (the unsafe block around): the caller's contract; batch bb of dst is
                // written by this call alone.
                bgemm_into_bf16(dims.m, dims.n, dims.k, batch(lhs, bb), batch(rhs, bb), c, adding, parallel)
            });
            drop(keep);
            return;
        }
        // the accumulator: init widened, else zeros; a bf16 product without init overwrites
        // fresh memory, its sums read back plus +0 below: the bits of adding them onto zeros
        // (a sum that underflowed to -0 reads +0; every other value is itself)
        let mut held: Vec<f32>;
        let mut fresh = None;
        let overwrite = init.is_none() && bf16 && n_out * 4 >= crate::buffer::HUGE_MIN;
        if overwrite {
            fresh = crate::buffer::Fresh::f32s(n_out);
        }
        let add = fresh.is_none();
        let acc: &mut [f32] = match (&mut fresh, init) {
            (Some(f), _) => f.slice_mut(),
            (None, Some(i)) => {
                held = pack::<H, f32>(i, &(0..i.layout().rank()).collect::<Vec<_>>(), up);
                &mut held
            }
            (None, None) => {
                held = vec![0.0; n_out];
                &mut held
            }
        };
        if bf16 {
            // bf16 operands read where they lie (or packed as bf16), by the bf16 product
            let mut keep: Vec<Vec<H>> = Vec::new();
            let lhs = view_or_copy(a, perm_a, [dims.b, dims.m, dims.k], &mut keep);
            let rhs = view_or_copy(b, perm_b, [dims.b, dims.k, dims.n], &mut keep);
            product_bf16(dims, Ptr(acc.as_mut_ptr().cast()), lhs, rhs, add, rayon::current_num_threads().max(1));
            drop(keep);
        } else if dims.m > 0 && dims.n > 0 && dims.b > 0 {
            let la = pack::<H, f32>(a, perm_a, up);
            let lb = pack::<H, f32>(b, perm_b, up);
            let lhs = View {
                base: Ptr(la.as_ptr() as *mut u8),
                offset: 0,
                strides: [(dims.m * dims.k) as isize, dims.k as isize, 1],
            };
            let rhs = View {
                base: Ptr(lb.as_ptr() as *mut u8),
                offset: 0,
                strides: [(dims.k * dims.n) as isize, dims.n as isize, 1],
            };
            product::<f32>(dims, Ptr(acc.as_mut_ptr().cast()), lhs, rhs, true, 1.0);
        }
        let out = Ptr::of(dst);
        let off = dst.layout().offset();
        acc.par_iter().enumerate().with_min_len(CONVERT_TASK).for_each(|(k, &x)| {
            // An output with no product is init as the accumulator holds it: -0 and NaN bits of a
            // half survive the exact round trip through f32. Each element of the contiguous
            // destination is written once.
            let x = if add { x } else { x + 0.0 };
            H::store(out.at(H::DTYPE, off + k as isize), down(x))
        });
    }
}
