//! The Fourier transform kernel, through `rustfft`: complex to complex, real to complex (the
//! full spectrum or its first `n/2 + 1` points) and complex to real, along any axes, one axis
//! after another. Plans are cached per length in the library's [`Plans`]; lanes run in parallel,
//! each through the same plan, so the bits do not depend on the thread count.

use std::sync::{Arc, Mutex};

use num_complex::Complex;
use rayon::prelude::*;
use rustfft::{Fft, FftNum, FftPlanner};

use super::eval::Ptr;
use super::lanes::Lanes;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::kernels::{half_spectrum, same_precision, Direction};
use crate::layout::Layout;
use crate::{Answer, Dtype, Element, Kind};

/// The plans a library keeps, one per length, direction and precision (`rustfft`'s planners;
/// a plan is shared by every call of its length).
pub(crate) struct Plans {
    f32: Mutex<FftPlanner<f32>>,
    f64: Mutex<FftPlanner<f64>>,
}

impl Default for Plans {
    fn default() -> Plans {
        Plans { f32: Mutex::new(FftPlanner::new()), f64: Mutex::new(FftPlanner::new()) }
    }
}

impl std::fmt::Debug for Plans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Plans")
    }
}

/// A real part type of the transforms: `f32` or `f64`.
trait Real: FftNum + Element {
    fn planner(p: &Plans) -> &Mutex<FftPlanner<Self>>;
}

impl Real for f32 {
    fn planner(p: &Plans) -> &Mutex<FftPlanner<f32>> {
        &p.f32
    }
}

impl Real for f64 {
    fn planner(p: &Plans) -> &Mutex<FftPlanner<f64>> {
        &p.f64
    }
}

/// The plan of `n` points in `direction` (cached).
fn plan<T: Real>(plans: &Plans, direction: Direction, n: usize) -> Arc<dyn Fft<T>> {
    // a planner left poisoned by a panic elsewhere still holds valid plans
    let mut p = T::planner(plans).lock().unwrap_or_else(|e| e.into_inner());
    match direction {
        Direction::Forward => p.plan_fft_forward(n),
        Direction::Inverse => p.plan_fft_inverse(n),
    }
}

/// What the transform reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Complex to complex, one shape.
    Complex,
    /// Real to complex: along the last axis transformed, `n` or `n/2 + 1` outputs of `n` points.
    FromReal,
    /// Complex to real: along the last axis transformed, `n/2 + 1` inputs of `n` points.
    ToReal,
}

pub(crate) fn fft(
    par: &std::sync::Arc<super::par::Par>,
    plans: &Arc<Plans>,
    direction: Direction,
    axes: &[usize],
    dst: &dyn Operand,
    src: &dyn Operand,
) -> Answer {
    let (sd, dd) = (src.dtype(), dst.dtype());
    let form = match (sd.kind(), dd.kind()) {
        (Kind::Complex, Kind::Complex) => Form::Complex,
        (Kind::Float, Kind::Complex) => Form::FromReal,
        (Kind::Complex, Kind::Float) => Form::ToReal,
        _ => return Answer::WrongDtype,
    };
    if !same_precision(sd, dd) {
        return Answer::WrongDtype;
    }
    let (axes, plans) = (axes.to_vec(), plans.clone());
    through_door(par, "fft", None, &[dst], &[src], move |w, r, execute| {
        let (dst, src) = (w[0], r[0]);
        let (ss, ds) = (src.layout().shape(), dst.layout().shape());
        let rank = ss.len();
        let distinct = axes.iter().enumerate().all(|(i, a)| !axes[..i].contains(a));
        if ds.len() != rank || !distinct || axes.iter().any(|&a| a >= rank) {
            return Answer::ShapeMismatch;
        }
        let last = axes.last().copied();
        let fits = (0..rank).all(|d| match form {
            _ if Some(d) != last => ss[d] == ds[d],
            Form::Complex => ss[d] == ds[d],
            Form::FromReal => ds[d] == ss[d] || ds[d] == half_spectrum(ss[d]),
            Form::ToReal => ss[d] == half_spectrum(ds[d]),
        });
        // complex to real along several axes works in a C-contiguous copy of the input
        if !fits || (form == Form::ToReal && axes.len() > 1 && Layout::contiguous(ss).is_err()) {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        if dd == Dtype::F64 || dd == Dtype::C128 {
            run::<f64>(&plans, direction, &axes, form, dst, src);
        } else {
            run::<f32>(&plans, direction, &axes, form, dst, src);
        }
        Answer::Done
    })
}

/// Elements of one array as lanes along an axis: its memory, element size and layout.
#[derive(Clone, Copy)]
struct Side<'a> {
    p: Ptr,
    size: isize,
    layout: &'a Layout,
}

impl Side<'_> {
    fn of(o: &dyn Operand) -> Side<'_> {
        Side { p: Ptr::of(o), size: o.dtype().size() as isize, layout: o.layout() }
    }
}

/// Fills a lane's buffer from the address of each of its elements.
type Fill<'a, T> = dyn Fn(&mut [Complex<T>], &dyn Fn(usize) -> *const u8) + Sync + 'a;
/// Writes a lane's results to the address of each of its elements.
type Out<'a, T> = dyn Fn(&[Complex<T>], &dyn Fn(usize) -> *mut u8) + Sync + 'a;

/// For each lane of `from` along `axis` (in parallel), `body(input, lane)` fills the lane's
/// buffer from its `n` elements, then the plan of `n` points transforms it, then `out(buffer,
/// lane)` writes its results. `n` is `from`'s extent along `axis`, or `points` where given (a
/// complex-to-real lane of `points` from fewer inputs).
#[allow(clippy::too_many_arguments)]
fn pass<T: Real>(
    plans: &Plans,
    direction: Direction,
    axis: usize,
    from: Side<'_>,
    points: Option<usize>,
    fill: &Fill<'_, T>,
    to: Side<'_>,
    out: &Out<'_, T>,
) {
    let (fl, tl) = (Lanes::new(from.layout, axis), Lanes::new(to.layout, axis));
    let n = points.unwrap_or(fl.len());
    if n == 0 || fl.count() == 0 {
        return;
    }
    let fft = plan::<T>(plans, direction, n);
    let scratch_len = fft.get_inplace_scratch_len();
    let zero = Complex::new(T::zero(), T::zero());
    (0..fl.count()).into_par_iter().with_min_len(1).for_each_init(
        || (vec![zero; n], vec![zero; scratch_len]),
        |(buf, scratch), lane| {
            let (f0, t0) = (fl.start(lane), tl.start(lane));
            let at = |j: usize| from.p.byte((f0 + j as isize * fl.stride()) * from.size).cast_const();
            fill(buf, &at);
            fft.process_with_scratch(buf, scratch);
            let put = |j: usize| to.p.byte((t0 + j as isize * tl.stride()) * to.size);
            out(buf, &put);
        },
    );
}

/// Whether the `n` elements at `at(0)`, `at(1)`, … of a complex lane are adjacent (more than
/// one, each one element past the last).
fn contiguous<T: Real>(n: usize, at: &dyn Fn(usize) -> *const u8) -> bool {
    n > 1 && (at(1) as usize).wrapping_sub(at(0) as usize) == size_of::<Complex<T>>()
}

fn run<T: Real>(plans: &Plans, direction: Direction, axes: &[usize], form: Form, dst: &dyn Operand, src: &dyn Operand)
where
    Complex<T>: Element,
{
    let zero = Complex::new(T::zero(), T::zero());
    // SAFETY (every load and store of the closures below): the door holds the claims for the
    // call; addresses come from the operands' checked layouts, lanes and indices in range; each
    // lane of a destination is written by its task alone, after its reads of that lane.
    let read_complex = |buf: &mut [Complex<T>], at: &dyn Fn(usize) -> *const u8| {
        if contiguous::<T>(buf.len(), at) {
            // SAFETY: see above; the lane's elements are adjacent and aligned (a checked layout's).
            buf.copy_from_slice(unsafe { std::slice::from_raw_parts(at(0).cast::<Complex<T>>(), buf.len()) });
            return;
        }
        for (j, b) in buf.iter_mut().enumerate() {
            // SAFETY: see above.
            *b = unsafe { <Complex<T> as Element>::load(at(j)) };
        }
    };
    let read_real = |buf: &mut [Complex<T>], at: &dyn Fn(usize) -> *const u8| {
        for (j, b) in buf.iter_mut().enumerate() {
            // SAFETY: see above.
            *b = Complex::new(unsafe { T::load(at(j)) }, T::zero());
        }
    };
    let (s, d) = (Side::of(src), Side::of(dst));
    let Some((&first, rest)) = axes.split_last() else {
        // no axis: each element copied (a real one widened to complex)
        let (sl, dl) = (Lanes::points(src.layout()), Lanes::points(dst.layout()));
        for k in 0..sl.count() {
            let (from, to) = (s.p.byte(sl.start(k) * s.size), d.p.byte(dl.start(k) * d.size));
            // SAFETY: see above.
            unsafe {
                match form {
                    Form::FromReal => <Complex<T> as Element>::store(to, Complex::new(T::load(from), T::zero())),
                    Form::ToReal => T::store(to, <Complex<T> as Element>::load(from).re),
                    Form::Complex => <Complex<T> as Element>::store(to, <Complex<T> as Element>::load(from)),
                }
            }
        }
        return;
    };
    let write_complex = |buf: &[Complex<T>], put: &dyn Fn(usize) -> *mut u8, m: usize| {
        if contiguous::<T>(m, &|j| put(j).cast_const()) {
            // SAFETY: see above; the lane's elements are adjacent and aligned (a checked layout's).
            unsafe { std::slice::from_raw_parts_mut(put(0).cast::<Complex<T>>(), m) }.copy_from_slice(&buf[..m]);
            return;
        }
        for (j, b) in buf[..m].iter().enumerate() {
            // SAFETY: see above.
            unsafe { <Complex<T> as Element>::store(put(j), *b) };
        }
    };
    // the axes after the first pass, in place in the destination (complex) or a scratch array
    let in_place = |side: Side<'_>, axes: &[usize]| {
        for &a in axes.iter().rev() {
            let n = side.layout.shape()[a];
            pass::<T>(plans, direction, a, side, None, &read_complex, side, &|buf, put| write_complex(buf, put, n));
        }
    };
    match form {
        Form::Complex | Form::FromReal => {
            let m = dst.layout().shape()[first];
            let fill: &Fill<'_, T> = if form == Form::Complex { &read_complex } else { &read_real };
            pass::<T>(plans, direction, first, s, None, fill, d, &|buf, put| write_complex(buf, put, m));
            in_place(d, rest);
        }
        Form::ToReal => {
            // the other axes first, complex to complex in a C-contiguous copy of the input
            let shape = src.layout().shape().to_vec();
            let mut copy: Vec<Complex<T>> = Vec::new();
            let (layout, p) = if rest.is_empty() {
                (src.layout().clone(), s.p)
            } else {
                // checked under the door before the call ran
                let Ok(layout) = Layout::contiguous(&shape) else { return };
                copy.resize(layout.numel(), zero);
                let cl = Lanes::points(src.layout());
                for (k, c) in copy.iter_mut().enumerate() {
                    // SAFETY: see above; `cl` walks the input in C order, as `copy` is laid.
                    *c = unsafe { <Complex<T> as Element>::load(s.p.byte(cl.start(k) * s.size)) };
                }
                let p = Ptr(copy.as_mut_ptr().cast());
                in_place(Side { p, size: s.size, layout: &layout }, rest);
                (layout, p)
            };
            let from = Side { p, size: s.size, layout: &layout };
            let n = dst.layout().shape()[first];
            let h = from.layout.shape()[first];
            // the lane extended to n points as a Hermitian sequence: x[j] = conj(x[n − j]) past h
            let fill = |buf: &mut [Complex<T>], at: &dyn Fn(usize) -> *const u8| {
                for (j, b) in buf.iter_mut().enumerate() {
                    // SAFETY: see above (j < h, or n − j < h where j ≥ h).
                    *b = unsafe {
                        if j < h {
                            <Complex<T> as Element>::load(at(j))
                        } else {
                            <Complex<T> as Element>::load(at(n - j)).conj()
                        }
                    };
                }
            };
            let out = |buf: &[Complex<T>], put: &dyn Fn(usize) -> *mut u8| {
                for (j, b) in buf.iter().enumerate() {
                    // SAFETY: see above.
                    unsafe { T::store(put(j), b.re) };
                }
            };
            pass::<T>(plans, direction, first, from, Some(n), &fill, d, &out);
        }
    }
}
