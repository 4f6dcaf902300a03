//! Gathers, range gathers and scatters along an axis: moves of whole rows, checked indices.
//!
//! An operand is seen as `[outer, axis, inner]`: the axes before `axis`, the axis, the axes after
//! it. A row (one outer index, one position along the axis) is `inner` elements, one run in memory
//! where the inner axes are C-contiguous, copied at once.

use rayon::prelude::*;

use super::eval::Ptr;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::kernels::Scatter;
use crate::layout::Layout;
use crate::{Answer, Dtype};

/// A layout seen as `[outer, axis, inner]`.
#[derive(Debug, Clone)]
pub(crate) struct Rows {
    outer: Vec<(usize, isize)>,
    inner: Vec<(usize, isize)>,
    stride: isize,
    offset: isize,
    n_outer: usize,
    n_inner: usize,
    /// The inner axes are one run of unit stride.
    inner_run: bool,
}

impl Rows {
    /// `layout` cut at axes `lo..hi` (the axis, or the axes an index's shape replaces).
    pub(crate) fn new(layout: &Layout, lo: usize, hi: usize) -> Rows {
        let (shape, strides) = (layout.shape(), layout.strides());
        let pairs = |r: std::ops::Range<usize>| -> Vec<(usize, isize)> { r.map(|d| (shape[d], strides[d])).collect() };
        let (outer, inner) = (pairs(0..lo), pairs(hi..shape.len()));
        let n_inner: usize = inner.iter().map(|p| p.0).product();
        let mut want = 1isize;
        let mut inner_run = true;
        for &(n, s) in inner.iter().rev() {
            if n > 1 && s != want {
                inner_run = false;
            }
            want *= n as isize;
        }
        // the stride of the cut axes' last one (a gather's source cuts one axis)
        let stride = if hi > lo { strides[hi - 1] } else { 0 };
        Rows {
            n_outer: outer.iter().map(|p| p.0).product(),
            outer,
            inner,
            stride,
            offset: layout.offset(),
            n_inner,
            inner_run,
        }
    }

    fn decode(dims: &[(usize, isize)], mut k: usize) -> isize {
        let mut at = 0;
        for &(n, s) in dims.iter().rev() {
            at += (k % n) as isize * s;
            k /= n;
        }
        at
    }

    /// The position of row `(o, j)`'s first element.
    fn row(&self, o: usize, j: usize) -> isize {
        self.offset + Rows::decode(&self.outer, o) + j as isize * self.stride
    }

    /// The position of element `q` of a row, from the row's first.
    fn within(&self, q: usize) -> isize {
        if self.inner_run {
            q as isize
        } else {
            Rows::decode(&self.inner, q)
        }
    }
}

/// Copies `n` elements of `size` bytes from `src` (positions `from(q)`) to contiguous `dst`.
///
/// # Safety
/// Both ranges lie in memory the caller's door claims, `dst`'s exclusive and apart from `src`'s.
unsafe fn copy_row(src: *const u8, dst: *mut u8, n: usize, size: usize, run: bool, from: impl Fn(usize) -> isize) {
    if run {
        // SAFETY: the caller's contract; a run of n elements.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n * size) };
        return;
    }
    for q in 0..n {
        // SAFETY: the caller's contract; element q of the row.
        unsafe { std::ptr::copy_nonoverlapping(src.wrapping_offset(from(q) * size as isize), dst.add(q * size), size) };
    }
}

/// Orders a task's streaming stores before the task ends (an `sfence` when dropped).
struct Fence;

impl Drop for Fence {
    fn drop(&mut self) {
        super::reg::fence();
    }
}

/// The values of an `i64` operand in C order of its indices, or `IndexOutOfRange` where one
/// lies outside `0..=limit - run` (runs of `run` from each); `Declined` where their list does not
/// fit in memory (a broadcast index of more elements than memory holds).
fn indices(index: &dyn Operand, limit: usize, run: usize) -> Result<Vec<usize>, Answer> {
    let p = Ptr::of(index);
    let mut out = Vec::new();
    out.try_reserve_exact(index.layout().numel()).map_err(|_| Answer::Declined)?;
    for pos in index.layout().positions() {
        // SAFETY: the door holds a claim on `index`; positions of its checked layout.
        let v = unsafe { <i64 as crate::Element>::load(p.at(Dtype::I64, pos)) };
        match usize::try_from(v) {
            Ok(v) if v.checked_add(run).is_some_and(|end| end <= limit) => out.push(v),
            _ => return Err(Answer::IndexOutOfRange),
        }
    }
    Ok(out)
}

/// A gather (`run` = `None`) or range gather of runs of `run`.
pub(crate) fn gather(
    par: &std::sync::Arc<super::par::Par>,
    axis: usize,
    run: Option<usize>,
    dst: &dyn Operand,
    src: &dyn Operand,
    index: &dyn Operand,
) -> Answer {
    if index.dtype() != Dtype::I64 || dst.dtype() != src.dtype() {
        return Answer::WrongDtype;
    }
    through_door(par, "gather", None, &[dst], &[src, index], move |w, r, execute| {
        let (dst, src, index) = (w[0], r[0], r[1]);
        let (ss, is) = (src.layout().shape(), index.layout().shape());
        let want = match run {
            None => crate::shape::gather(ss, axis, is),
            Some(run) => crate::shape::range_gather(ss, axis, run, is),
        };
        if want.ok().as_deref() != Some(dst.layout().shape()) {
            return Answer::ShapeMismatch;
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        // the indices' values are read when the work runs (on a queued device they may still be
        // being written when the call is checked), before any write
        if !execute {
            return Answer::Done;
        }
        let len = run.unwrap_or(1);
        let at = match indices(index, ss[axis], len) {
            Ok(v) => v,
            Err(a) => return a,
        };
        let s = Rows::new(src.layout(), axis, axis + 1);
        let size = src.dtype().size();
        let (sp, dp) = (Ptr::of(src), Ptr::of(dst));
        let (t, inner) = (at.len(), s.n_inner);
        // a run of rows is one run in memory where the rows are back to back
        let runs = s.inner_run && (len == 1 || s.stride == inner as isize);
        // a result far past the caches goes to memory by streaming stores (its lines are not
        // read first: two thirds of a plain copy's traffic), each task's ordered by a fence
        let streaming = runs && dst.layout().numel().saturating_mul(size) >= super::map::STREAM_MIN;
        (0..s.n_outer * t).into_par_iter().with_min_len(64).for_each_init(
            || Fence,
            |_, k| {
                let (o, j) = (k / t, at[k % t]);
                let to = dp.byte((dst.layout().offset() as usize + k * len * inner) as isize * size as isize);
                let from = sp.byte(s.row(o, j) * size as isize);
                if streaming {
                    // SAFETY: the door holds the claims; a run of `len` rows of the checked operand
                    // at a checked index, read; task k writes its own `len` rows of `dst` alone.
                    unsafe { super::reg::stream(std::slice::from_raw_parts(from, len * inner * size), to) };
                } else if runs {
                    // SAFETY: the door holds the claims; row positions come from the checked layouts
                    // and checked indices; task k writes its own `len` rows of `dst` alone.
                    unsafe { copy_row(from, to, len * inner, size, true, |q| q as isize) };
                } else {
                    for r in 0..len {
                        let from = from.wrapping_offset(r as isize * s.stride * size as isize);
                        // SAFETY: as above.
                        unsafe {
                            copy_row(from, to.wrapping_add(r * inner * size), inner, size, false, |q| s.within(q))
                        };
                    }
                }
            },
        );
        Answer::Done
    })
}

pub(crate) fn scatter(
    par: &std::sync::Arc<super::par::Par>,
    mode: Scatter,
    axis: usize,
    dst: &dyn Operand,
    into: Option<&dyn Operand>,
    src: &dyn Operand,
    index: &dyn Operand,
) -> Answer {
    if index.dtype() != Dtype::I64 || dst.dtype() != src.dtype() || into.is_some_and(|i| i.dtype() != dst.dtype()) {
        return Answer::WrongDtype;
    }
    if mode == Scatter::Add && dst.dtype() == Dtype::Bool {
        return Answer::WrongDtype;
    }
    let mut read: Vec<&dyn Operand> = vec![src, index];
    read.extend(into);
    through_door(par, "scatter", None, &[dst], &read, move |w, r, execute| {
        let (dst, src, index, into) = (w[0], r[0], r[1], r.get(2).copied());
        let ds = dst.layout().shape();
        let want = crate::shape::scatter(ds, axis, index.layout().shape());
        if want.ok().as_deref() != Some(src.layout().shape()) || into.is_some_and(|i| i.layout().shape() != ds) {
            return Answer::ShapeMismatch;
        }
        // `into` may be the destination itself (read at each element's own index only)
        if let Some(a) = destinations(w, &[src, index]) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        let at = match indices(index, ds[axis], 1) {
            Ok(v) => v,
            Err(a) => return a,
        };
        // each destination row's sources, in index order (a stable counting sort)
        let n = ds[axis];
        let mut starts = vec![0usize; n + 1];
        for &j in &at {
            starts[j + 1] += 1;
        }
        for j in 0..n {
            starts[j + 1] += starts[j];
        }
        let mut order = vec![0usize; at.len()];
        let mut fill = starts.clone();
        for (t, &j) in at.iter().enumerate() {
            order[fill[j]] = t;
            fill[j] += 1;
        }
        macro_rules! go {
            ($t:ty) => {
                rows::<$t>(mode, axis, dst, into, src, &starts, &order)
            };
        }
        super::reg::dispatch_dtype!(dst.dtype(), go);
        Answer::Done
    })
}

/// Writes every destination row `(o, j)`: `into`'s (or zeros), then its sources `order[starts[j]..
/// starts[j + 1]]` by `mode`, in order. `Set` copies bits; `Add` sums each element in the
/// carrier, `into`'s value first, then the sources in index order, and rounds once.
fn rows<T: super::scan::Scan>(
    mode: Scatter,
    axis: usize,
    dst: &dyn Operand,
    into: Option<&dyn Operand>,
    src: &dyn Operand,
    starts: &[usize],
    order: &[usize],
) {
    use super::reduce::Term;
    let d = Rows::new(dst.layout(), axis, axis + 1);
    let s = Rows::new(src.layout(), axis, axis + 1);
    let i = into.map(|i| Rows::new(i.layout(), axis, axis + 1));
    let (dp, sp, ip) = (Ptr::of(dst), Ptr::of(src), into.map(Ptr::of));
    let n = starts.len() - 1;
    let (size, inner) = (T::DTYPE.size(), d.n_inner);
    let at = |p: Ptr, pos: isize| p.byte(pos * size as isize);
    (0..d.n_outer * n).into_par_iter().with_min_len(16).for_each_init(Vec::<T::C>::new, |acc, k| {
        let (o, j) = (k / n, k % n);
        let sources = &order[starts[j]..starts[j + 1]];
        let to = at(dp, d.row(o, j));
        let base = i.as_ref().zip(ip).map(|(i, p)| (i, at(p, i.row(o, j))));
        // SAFETY (every load, store and copy): the door holds the claims for the call; positions
        // come from the checked layouts and indices; task k writes destination row (o, j) alone
        // and reads `into` only at that row's own elements, before writing them.
        match mode {
            Scatter::Set => match (sources.last(), base) {
                // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                (Some(&t), _) => unsafe {
                    copy_row(at(sp, s.row(o, t)), to, inner, size, s.inner_run, |q| s.within(q))
                },
                (None, Some((_, from))) if from == to => {}
                // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                (None, Some((i, from))) => unsafe { copy_row(from, to, inner, size, i.inner_run, |q| i.within(q)) },
                // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                (None, None) => unsafe { std::ptr::write_bytes(to, 0, inner * size) },
            },
            Scatter::Add => {
                acc.clear();
                match base {
                    Some((i, from)) => acc.extend(
                        // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                        (0..inner).map(|q| unsafe { T::load(from.wrapping_offset(i.within(q) * size as isize)) }.up()),
                    ),
                    None => acc.resize(inner, <T::C as Term>::ZERO),
                }
                for &t in sources {
                    let from = at(sp, s.row(o, t));
                    if s.inner_run {
                        // one run: a slice of the row, added element by element (vectorized)
                        // SAFETY: the row's `inner` elements of T lie from `from` under the call's
                        // shared claim, aligned (the buffer's base is, and positions are whole
                        // elements), and nx's elements take every bit pattern they hold.
                        let row = unsafe { std::slice::from_raw_parts(from as *const T, inner) };
                        for (a, x) in acc.iter_mut().zip(row) {
                            *a = a.add(x.up());
                        }
                    } else {
                        for (q, a) in acc.iter_mut().enumerate() {
                            // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                            *a = a.add(unsafe { T::load(from.wrapping_offset(s.within(q) * size as isize)) }.up());
                        }
                    }
                }
                // SAFETY: the destination row is C-contiguous, `inner` elements from `to`, written by
                // this task alone under the call's exclusive claim.
                let out = unsafe { std::slice::from_raw_parts_mut(to as *mut T, inner) };
                for (d, &a) in out.iter_mut().zip(acc.iter()) {
                    *d = T::down(a);
                }
            }
        }
    });
}
