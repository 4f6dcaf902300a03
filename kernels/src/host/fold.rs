//! Padding (a move into a padded destination) and folds (a reduction over each window of the
//! padded operand, which is never materialised: a read outside the operand is the fill).

use rayon::prelude::*;

use super::eval::Ptr;
use super::reduce::Term;
use super::reg::dispatch_dtype;
use super::scan::Scan;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::kernels::Reduction;
use crate::layout::Layout;
use crate::loads::{Pad, Windows};
use crate::{Answer, Dtype, Element, Kind, Value};

/// The position of `src`'s element at the padded index `at` (one per axis), or `None` for the
/// fill.
#[inline(always)]
fn source(pad: &Pad, l: &Layout, at: &[usize]) -> Option<isize> {
    let mut pos = l.offset();
    for (d, &p) in at.iter().enumerate() {
        let i = pad.source(d, p, l.shape()[d])?;
        pos += i as isize * l.strides()[d];
    }
    Some(pos)
}

/// The index of flat position `k` of `shape`, into `idx`.
fn unflat(shape: &[usize], mut k: usize, idx: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        idx[d] = k % shape[d];
        k /= shape[d];
    }
}

pub(crate) fn pad(
    par: &std::sync::Arc<super::par::Par>,
    pad: &Pad,
    fill: Value,
    dst: &dyn Operand,
    src: &dyn Operand,
) -> Answer {
    if dst.dtype() != src.dtype() {
        return Answer::WrongDtype;
    }
    let pad = pad.clone();
    through_door(par, "pad", None, &[dst], &[src], move |w, r, execute| {
        let (dst, src) = (w[0], r[0]);
        match pad.shape(src.layout().shape()) {
            Ok(s) if s == dst.layout().shape() => {}
            _ => return Answer::ShapeMismatch,
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        macro_rules! go {
            ($t:ty) => {
                moved::<$t>(&pad, <$t as Element>::from_value(fill), dst, src)
            };
        }
        dispatch_dtype!(src.dtype(), go);
        Answer::Done
    })
}

fn moved<T: Element>(pad: &Pad, fill: T, dst: &dyn Operand, src: &dyn Operand) {
    let shape = dst.layout().shape().to_vec();
    let n: usize = shape.iter().product();
    let (dp, sp, l) = (Ptr::of(dst), Ptr::of(src), src.layout());
    let size = T::DTYPE.size() as isize;
    let base = dst.layout().offset();
    (0..n).into_par_iter().with_min_len(4096).for_each_init(
        || vec![0usize; shape.len()],
        |idx, k| {
            unflat(&shape, k, idx);
            // SAFETY: the door holds the claims; `source` answers positions of the checked
            // layout; element k of the C-contiguous destination is written by this task alone.
            unsafe {
                let v = match source(pad, l, idx) {
                    Some(pos) => T::load(sp.byte(pos * size)),
                    None => fill,
                };
                T::store(dp.byte((base + k as isize) * size), v);
            }
        },
    );
}

pub(crate) fn fold(
    par: &std::sync::Arc<super::par::Par>,
    reduction: Reduction,
    pad: &Pad,
    fill: Value,
    windows: &Windows,
    dst: &dyn Operand,
    src: &dyn Operand,
) -> Answer {
    let d = src.dtype();
    if dst.dtype() != d {
        return Answer::WrongDtype;
    }
    match reduction {
        Reduction::Sum | Reduction::Prod if d == Dtype::Bool => return Answer::WrongDtype,
        Reduction::Max | Reduction::Min if d.kind() == Kind::Complex => return Answer::Declined,
        Reduction::Sum | Reduction::Prod | Reduction::Max | Reduction::Min => {}
        _ => return Answer::Declined,
    }
    let (pad, windows) = (pad.clone(), windows.clone());
    through_door(par, "fold", None, &[dst], &[src], move |w, r, execute| {
        let (dst, src) = (w[0], r[0]);
        let fits =
            pad.shape(src.layout().shape()).and_then(|p| windows.shape(&p)).is_ok_and(|s| s == dst.layout().shape());
        if !fits {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        macro_rules! go {
            ($t:ty) => {
                folded::<$t>(reduction, &pad, <$t as Element>::from_value(fill), &windows, dst, src)
            };
        }
        dispatch_dtype!(src.dtype(), go);
        Answer::Done
    })
}

fn folded<T: Scan>(r: Reduction, pad: &Pad, fill: T, win: &Windows, dst: &dyn Operand, src: &dyn Operand) {
    let f: fn(T::C, T::C) -> T::C = match r {
        Reduction::Sum => Term::add,
        Reduction::Prod => Term::mul,
        Reduction::Max => Term::max,
        _ => Term::min,
    };
    let shape = dst.layout().shape().to_vec();
    let rank = shape.len();
    let n: usize = shape.iter().product();
    let k: usize = win.size.iter().product();
    let (dp, sp, l) = (Ptr::of(dst), Ptr::of(src), src.layout());
    let size = T::DTYPE.size() as isize;
    let base = dst.layout().offset();
    (0..n).into_par_iter().with_min_len(256).for_each_init(
        || (vec![0usize; rank], vec![0usize; rank], vec![0usize; rank]),
        |(o, w, at), j| {
            unflat(&shape, j, o);
            // the terms in C order of the window's index: a Sum from +0, the others from the first
            let mut acc: Option<T::C> = (r == Reduction::Sum).then_some(<T::C as Term>::ZERO);
            for t in 0..k {
                unflat(&win.size, t, w);
                for d in 0..rank {
                    at[d] = o[d] * win.stride[d] + w[d] * win.dilation[d];
                }
                let x = match source(pad, l, at) {
                    // SAFETY: the door holds a claim on `src`; a position of its checked layout.
                    Some(pos) => unsafe { T::load(sp.byte(pos * size)) },
                    None => fill,
                }
                .up();
                acc = Some(match acc {
                    Some(a) => f(a, x),
                    None => x,
                });
            }
            let v = acc.map_or(fill, T::down);
            // SAFETY: element j of the C-contiguous destination, written by this task alone.
            unsafe { T::store(dp.byte((base + j as isize) * size), v) };
        },
    );
}
