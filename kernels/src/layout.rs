//! Layouts and moves: where elements lie in a buffer, and views that change that without moving
//! an element.
//!
//! A [`Layout`] maps an index to an element position: `offset + Σ index[i]·strides[i]`, in
//! elements of the array's dtype. Strides may be 0 (a broadcast axis) or negative (a flipped one).
//! A [`Move`] makes a new layout over the same positions; [`Layout::apply`] answers `None` where
//! a move cannot be a view (a reshape ATen's rule refuses: copy first).

use crate::{Error, Result};

pub use nx_mesh::MAX_RANK;

/// Shape, strides and offset, in elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: isize,
}

/// A movement: a change of layout that moves no element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// The same elements in C order under another shape of as many elements (a view where ATen's
    /// `computeStride` rule allows).
    Reshape(Vec<usize>),
    /// Axes reordered: axis `i` of the result is axis `perm[i]` of the input.
    Permute(Vec<usize>),
    /// Broadcast to a shape, numpy's rules: leading axes added, extent-1 axes repeated at stride 0.
    Expand(Vec<usize>),
    /// A window of one axis, Python's slice: negative bounds count from the end, bounds are
    /// clamped, `step` is not 0 and may be negative.
    Slice {
        /// The axis.
        axis: usize,
        /// First index (`None`: the start for a positive step, the end for a negative one).
        start: Option<isize>,
        /// Index past the last (`None`: to the end in the step's direction).
        stop: Option<isize>,
        /// The step.
        step: isize,
    },
    /// One axis reversed.
    Flip(usize),
    /// An axis of extent 1 removed.
    Squeeze(usize),
    /// An axis of extent 1 inserted at this position.
    Unsqueeze(usize),
    /// The windows of every axis ([`crate::Windows`]): a layout of twice the rank, the windows'
    /// indices (as many along each axis as [`crate::Windows::shape`] counts) then each window's
    /// element indices (its `size`), window `w`'s element `e` along axis `d` being element
    /// `w·stride[d] + e·dilation[d]`. Windows that overlap read elements more than once.
    Window(crate::Windows),
}

/// The greatest magnitude of a position (in elements) and of a stride that a layout may have:
/// byte offsets of elements up to 16 bytes wide, a stride past either end included, stay in
/// `isize`. (A buffer is never that large: arrays over memory reach far less.)
pub const MAX_POSITION: isize = isize::MAX / 32;

/// The C-contiguous strides of `shape`.
///
/// # Errors
/// [`Error::Invalid`] naming the shape where its elements are more than a layout reaches
/// ([`MAX_POSITION`]).
pub fn contiguous_strides(shape: &[usize]) -> Result<Vec<isize>> {
    let too_many = || {
        invalid(
            "nx_kernels::layout::contiguous_strides",
            format!("shape {shape:?} has more elements than a layout reaches ({MAX_POSITION})"),
        )
    };
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    if shape.contains(&0) {
        // no element is ever reached: any strides do; these are the C ones, capped at the bound
        for (s, &n) in strides.iter_mut().zip(shape).rev() {
            *s = acc;
            acc = acc.saturating_mul(isize::try_from(n.max(1)).unwrap_or(isize::MAX)).min(MAX_POSITION);
        }
        return Ok(strides);
    }
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = isize::try_from(n).ok().and_then(|n| acc.checked_mul(n)).ok_or_else(too_many)?;
    }
    if acc > MAX_POSITION {
        return Err(too_many());
    }
    Ok(strides)
}

/// The number of elements of `shape` (1 for rank 0).
///
/// # Errors
/// [`Error::Invalid`] naming the shape where the product overflows `usize`.
pub fn numel(shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n)).ok_or_else(|| {
        invalid("nx_kernels::layout::numel", format!("shape {shape:?} has more elements than usize holds"))
    })
}

/// The product of extents known to fit `usize`: axes of a layout's shape (whose element count was
/// checked when it was made), or some of them.
pub(crate) fn extent_product(extents: impl IntoIterator<Item = usize>) -> usize {
    // a zero anywhere makes 0, though the extents before it may multiply past `usize` (where no
    // zero is, the product fits and never saturates)
    let (p, zero) = extents.into_iter().fold((1usize, false), |(p, z), n| (p.saturating_mul(n), z || n == 0));
    if zero {
        0
    } else {
        p
    }
}

/// The shape numpy's broadcasting gives `a` and `b`.
///
/// # Errors
/// [`Error::Invalid`] naming both shapes where an axis differs and neither extent is 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        *o = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Invalid {
                    func: "nx_kernels::broadcast_shapes",
                    why: format!("shapes {a:?} and {b:?} do not broadcast: axis {i} has extents {x} and {y}"),
                })
            }
        };
    }
    Ok(out)
}

/// Python's slice bounds of `len` elements clamped: `(start, stop)` for a positive step. For
/// example `slice_bounds(50, 80, 60) == (50, 60)`.
pub fn slice_bounds(start: isize, stop: isize, len: usize) -> (usize, usize) {
    let clamp = |i: isize| -> usize {
        let i = if i < 0 { i + len as isize } else { i };
        i.clamp(0, len as isize) as usize
    };
    let (s, e) = (clamp(start), clamp(stop));
    (s, e.max(s))
}

/// ATen's `computeStride`: the strides that lay `new_shape` over the elements of `shape` at
/// `strides` in C order without a copy, or `None` where no strides do.
///
/// Every product is checked: a shape or stride that overflows has no view (`None`).
pub fn view_strides(shape: &[usize], strides: &[isize], new_shape: &[usize]) -> Option<Vec<isize>> {
    let n = numel(shape).ok()?;
    if n != numel(new_shape).ok()? {
        return None;
    }
    if n == 0 || shape.is_empty() {
        return if shape == new_shape { Some(strides.to_vec()) } else { contiguous_strides(new_shape).ok() };
    }
    let mut new_strides = vec![0isize; new_shape.len()];
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base = *strides.last().expect("rank > 0");
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    let times = |k: usize, s: isize| isize::try_from(k).ok().and_then(|k| k.checked_mul(s));
    for tensor_d in (0..shape.len()).rev() {
        tensor_numel *= shape[tensor_d];
        let boundary = tensor_d == 0
            || (shape[tensor_d - 1] != 1 && Some(strides[tensor_d - 1]) != times(tensor_numel, chunk_base));
        if boundary {
            while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                new_strides[view_d as usize] = times(view_numel, chunk_base)?;
                view_numel *= new_shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base = strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(new_strides)
}

fn invalid(func: &'static str, why: String) -> Error {
    Error::Invalid { func, why }
}

impl Layout {
    /// The C-contiguous layout of `shape` at offset 0.
    ///
    /// # Errors
    /// [`Error::Invalid`] for more than [`MAX_RANK`] axes, or more elements than a layout
    /// reaches ([`contiguous_strides`]).
    pub fn contiguous(shape: &[usize]) -> Result<Layout> {
        Layout::new(shape.to_vec(), contiguous_strides(shape)?, 0)
    }

    /// The layout of `shape` at `strides` from `offset`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for more than [`MAX_RANK`] axes, shape and strides of different
    /// lengths, an extent past `isize::MAX` (numpy's limit), an element count that overflows
    /// `usize`, or an offset, a stride or a position
    /// reached past [`MAX_POSITION`] in magnitude (every product and sum checked).
    pub fn new(shape: Vec<usize>, strides: Vec<isize>, offset: isize) -> Result<Layout> {
        const FUNC: &str = "nx_kernels::Layout::new";
        if shape.len() > MAX_RANK {
            return Err(invalid(FUNC, format!("shape {shape:?} has more than {MAX_RANK} axes")));
        }
        if shape.len() != strides.len() {
            return Err(invalid(FUNC, format!("shape {shape:?} and strides {strides:?} differ in length")));
        }
        if let Some(e) = shape.iter().find(|&&e| e > isize::MAX as usize) {
            return Err(invalid(FUNC, format!("shape {shape:?} has an extent {e} past isize::MAX")));
        }
        let n = numel(&shape)?;
        let beyond = || {
            invalid(
                FUNC,
                format!("shape {shape:?} at strides {strides:?} from {offset} reaches positions past ±{MAX_POSITION}"),
            )
        };
        if offset.unsigned_abs() > MAX_POSITION as usize
            || strides.iter().any(|s| s.unsigned_abs() > MAX_POSITION as usize)
        {
            return Err(beyond());
        }
        if n > 0 {
            let (mut lo, mut hi) = (offset, offset);
            for (&e, &s) in shape.iter().zip(&strides) {
                let reach = isize::try_from(e - 1).ok().and_then(|k| k.checked_mul(s)).ok_or_else(beyond)?;
                let end = if reach < 0 { &mut lo } else { &mut hi };
                *end =
                    end.checked_add(reach).filter(|p| p.unsigned_abs() <= MAX_POSITION as usize).ok_or_else(beyond)?;
            }
        }
        Ok(Layout { shape, strides, offset })
    }

    /// The extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The position of index 0, in elements.
    pub fn offset(&self) -> isize {
        self.offset
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of indices (it fits `usize`: checked when the layout was made).
    pub fn numel(&self) -> usize {
        extent_product(self.shape.iter().copied())
    }

    /// The least and greatest element positions the layout reaches, or `None` for no element.
    pub fn span(&self) -> Option<(isize, isize)> {
        if self.numel() == 0 {
            return None;
        }
        let (mut lo, mut hi) = (self.offset, self.offset);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (n as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        Some((lo, hi))
    }

    /// The layout of a copy of this one (the reference's `to_device` rule), and the elements its
    /// memory holds: one per index, an axis of stride 0 counted once. Where this layout's span
    /// fits in that many elements it is kept, shifted so its least position is 0; otherwise the
    /// axes are packed by decreasing magnitude of stride (ties in axis order), the last at stride
    /// 1 and each other at the product of the extents after it, each with the sign of its stride,
    /// an axis of stride 0 keeping 0, the least position at 0.
    pub fn copy_layout(&self) -> (Layout, usize) {
        self.copy_layout_bits(8)
    }

    /// [`Layout::copy_layout`] for elements of `bits` bits. Below a byte (`bits` dividing 8) the
    /// span is counted in bytes: where the bytes from the first position's to the last's are no
    /// more than the copy's, the layout is kept, shifted by whole bytes (its least position keeps
    /// its place in its byte), so a copy of those bytes keeps the bits beside the elements.
    pub fn copy_layout_bits(&self, bits: usize) -> (Layout, usize) {
        let count =
            extent_product(self.shape.iter().zip(&self.strides).map(|(&e, &s)| if s == 0 { e.min(1) } else { e }));
        let per = if (1..8).contains(&bits) { (8 / bits) as isize } else { 1 };
        let shift = match self.span() {
            None => Some(self.offset),
            Some((lo, hi)) => {
                let (first, last) = (lo.div_euclid(per), hi.div_euclid(per));
                (((last - first) as usize) < count.div_ceil(per as usize)).then_some(first * per)
            }
        };
        if let Some(shift) = shift {
            return (
                Layout { shape: self.shape.clone(), strides: self.strides.clone(), offset: self.offset - shift },
                count,
            );
        }
        let mut order: Vec<usize> = (0..self.rank()).collect();
        order.sort_by_key(|&a| (std::cmp::Reverse(self.strides[a].unsigned_abs()), a));
        let mut strides = vec![0isize; self.rank()];
        let mut acc = 1isize;
        for &a in order.iter().rev() {
            let s = self.strides[a];
            if s != 0 {
                strides[a] = acc * s.signum();
                acc *= self.shape[a] as isize;
            }
        }
        // the least position at 0: each negative stride's reach
        let offset =
            self.shape.iter().zip(&strides).map(|(&e, &s)| if s < 0 { -(e as isize - 1) * s } else { 0 }).sum();
        (Layout { shape: self.shape.clone(), strides, offset }, count)
    }

    /// This layout with every axis of stride 0 (and elements) at extent 1: each position once.
    pub fn without_broadcast(&self) -> Layout {
        let shape = self.shape.iter().zip(&self.strides).map(|(&e, &s)| if s == 0 { e.min(1) } else { e }).collect();
        Layout { shape, strides: self.strides.clone(), offset: self.offset }
    }

    /// Whether the layout is C-contiguous: strides are the contiguous ones, an extent-1 axis's
    /// stride being free. (Any layout of no element is contiguous.)
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expect = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 {
                if s != expect {
                    return false;
                }
                expect *= n as isize;
            }
        }
        true
    }

    /// The position of `index`.
    ///
    /// # Errors
    /// [`Error::Invalid`] unless `index` has one entry per axis, each below its extent.
    pub fn position(&self, index: &[usize]) -> Result<isize> {
        if index.len() != self.rank() || index.iter().zip(&self.shape).any(|(i, n)| i >= n) {
            return Err(invalid(
                "nx_kernels::Layout::position",
                format!("index {index:?} is not an index of shape {:?}", self.shape),
            ));
        }
        Ok(self.offset + index.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum::<isize>())
    }

    /// Every element position, in C order of indices.
    pub fn positions(&self) -> Positions<'_> {
        Positions { layout: self, index: vec![0; self.rank()], next: self.offset, left: self.numel() }
    }

    /// Whether no two indices reach one position ("distinct"): a written array must be. Exact:
    /// a sufficient stride test first, then a sort of the positions.
    pub fn is_distinct(&self) -> bool {
        let mut axes: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&n, _)| n > 1)
            .map(|(&n, &s)| (n, s.unsigned_abs()))
            .collect();
        if axes.is_empty() || self.numel() == 0 {
            return true;
        }
        // a broadcast axis repeats its positions; more indices than positions in the span
        // repeat one (so the sort below never holds more positions than the span has)
        let (lo, hi) = self.span().expect("elements");
        if axes.iter().any(|a| a.1 == 0) || self.numel() - 1 > (hi - lo) as usize {
            return false;
        }
        axes.sort_by_key(|a| a.1);
        let mut reach = 0usize;
        let mut clean = true;
        for &(n, s) in &axes {
            if s <= reach {
                clean = false;
                break;
            }
            reach += s * (n - 1);
        }
        if clean {
            return true;
        }
        let mut all: Vec<isize> = self.positions().collect();
        all.sort_unstable();
        all.windows(2).all(|w| w[0] != w[1])
    }

    /// The layout `m` makes, or `None` where `m` is a reshape that cannot be a view.
    ///
    /// # Errors
    /// [`Error::Invalid`] for arguments that do not fit the layout (an axis past the rank, a
    /// permutation that is not one, a shape of another element count, a squeeze of an extent other
    /// than 1, a step of 0, a broadcast that does not fit, a result past [`MAX_RANK`]).
    pub fn apply(&self, m: &Move) -> Result<Option<Layout>> {
        const FUNC: &str = "nx_kernels::Layout::apply";
        let axis_ok = |axis: usize, what: &str| -> Result<()> {
            if axis >= self.rank() {
                return Err(invalid(FUNC, format!("{what} axis {axis} of a layout of shape {:?}", self.shape)));
            }
            Ok(())
        };
        let mut out = self.clone();
        match m {
            Move::Reshape(shape) => {
                if numel(shape).ok() != Some(self.numel()) {
                    return Err(invalid(
                        FUNC,
                        format!("cannot reshape {:?} ({} elements) to {shape:?}", self.shape, self.numel()),
                    ));
                }
                let Some(strides) = view_strides(&self.shape, &self.strides, shape) else { return Ok(None) };
                return Layout::new(shape.clone(), strides, self.offset).map(Some);
            }
            Move::Permute(perm) => {
                let mut seen = vec![false; self.rank()];
                if perm.len() != self.rank()
                    || perm.iter().any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
                {
                    return Err(invalid(FUNC, format!("{perm:?} is not a permutation of {} axes", self.rank())));
                }
                out.shape = perm.iter().map(|&p| self.shape[p]).collect();
                out.strides = perm.iter().map(|&p| self.strides[p]).collect();
            }
            Move::Expand(shape) => {
                let fits = shape.len() >= self.rank()
                    && shape.len() <= MAX_RANK
                    && self.shape.iter().zip(&shape[shape.len() - self.rank()..]).all(|(&a, &b)| a == b || a == 1);
                if !fits {
                    return Err(invalid(FUNC, format!("cannot broadcast shape {:?} to {shape:?}", self.shape)));
                }
                let lead = shape.len() - self.rank();
                out.shape = shape.clone();
                out.strides = (0..shape.len())
                    .map(|i| if i < lead || self.shape[i - lead] != shape[i] { 0 } else { self.strides[i - lead] })
                    .collect();
            }
            Move::Slice { axis, start, stop, step } => {
                axis_ok(*axis, "slice of")?;
                if *step == 0 {
                    return Err(invalid(FUNC, format!("slice of axis {axis} with step 0")));
                }
                let n = self.shape[*axis] as isize;
                let norm = |i: isize| if i < 0 { i.saturating_add(n) } else { i };
                // count = ceil(distance / |step|), in unsigned arithmetic (no step overflows it)
                let count = |from: isize, to: isize| {
                    if to > from {
                        ((to - from - 1) as usize / step.unsigned_abs() + 1) as isize
                    } else {
                        0
                    }
                };
                let (first, count) = if *step > 0 {
                    let s = start.map_or(0, |s| norm(s).clamp(0, n));
                    let e = stop.map_or(n, |e| norm(e).clamp(0, n));
                    (s, count(s, e))
                } else {
                    let s = start.map_or(n - 1, |s| norm(s).clamp(-1, n - 1));
                    let e = stop.map_or(-1, |e| norm(e).clamp(-1, n - 1));
                    (s, count(e, s))
                };
                // (an empty layout's offset is free: its other extents may be huge)
                if count > 0 && self.numel() > 0 {
                    out.offset += first * self.strides[*axis];
                }
                out.shape[*axis] = count as usize;
                // stride × step, as numpy and ATen give it; where that leaves the bound (a step
                // past the extent: one element or none, whose stride is free) the stride stays
                let s = self.strides[*axis];
                out.strides[*axis] =
                    s.checked_mul(*step).filter(|x| x.unsigned_abs() <= MAX_POSITION as usize).unwrap_or(s);
            }
            Move::Flip(axis) => {
                axis_ok(*axis, "flip of")?;
                let n = self.shape[*axis];
                if n > 0 && self.numel() > 0 {
                    out.offset += (n as isize - 1) * self.strides[*axis];
                }
                out.strides[*axis] = -self.strides[*axis];
            }
            Move::Squeeze(axis) => {
                axis_ok(*axis, "squeeze of")?;
                if self.shape[*axis] != 1 {
                    return Err(invalid(
                        FUNC,
                        format!("squeeze of axis {axis} of shape {:?}: its extent is not 1", self.shape),
                    ));
                }
                out.shape.remove(*axis);
                out.strides.remove(*axis);
            }
            Move::Unsqueeze(axis) => {
                if *axis > self.rank() || self.rank() == MAX_RANK {
                    return Err(invalid(FUNC, format!("unsqueeze at {axis} of a layout of shape {:?}", self.shape)));
                }
                // the stride of an extent-1 axis is free: the next axis's reach, where it fits
                let s = self.strides.get(*axis).map_or(1, |&s| {
                    s.checked_mul(self.shape[*axis].max(1) as isize)
                        .filter(|x| x.unsigned_abs() <= MAX_POSITION as usize)
                        .unwrap_or(s)
                });
                out.shape.insert(*axis, 1);
                out.strides.insert(*axis, s);
            }
            Move::Window(w) => {
                let counts =
                    w.shape(&self.shape).map_err(|why| invalid(FUNC, format!("windows of {:?}: {why}", self.shape)))?;
                if 2 * self.rank() > MAX_RANK {
                    return Err(invalid(
                        FUNC,
                        format!("windows of a layout of rank {}: at most {} axes", self.rank(), MAX_RANK / 2),
                    ));
                }
                // A step scaled past the bound moves along an axis of one window (or of a window
                // of one element) only, where no second index reaches it: the axis's own stride
                // stands in. Every position reached lies within the input's reach.
                let scaled = |d: usize, k: usize| {
                    isize::try_from(k)
                        .ok()
                        .and_then(|k| self.strides[d].checked_mul(k))
                        .filter(|x| x.unsigned_abs() <= MAX_POSITION as usize)
                        .unwrap_or(self.strides[d])
                };
                let rank = self.rank();
                out.strides = (0..rank)
                    .map(|d| scaled(d, w.stride[d]))
                    .chain((0..rank).map(|d| scaled(d, w.dilation[d])))
                    .collect();
                out.shape = counts.into_iter().chain(w.size.iter().copied()).collect();
            }
        }
        Layout::new(out.shape, out.strides, out.offset).map(Some)
    }

    /// The layout of the same bits read as elements `to_size` wide instead of `from_size` (bytes,
    /// or bits for packed dtypes: any one unit for both; the reference's bitcast): equal widths keep it; a narrower dtype appends an axis of extent
    /// r = from/to at stride 1 and multiplies the rest by r; a wider one needs a trailing axis of
    /// extent r = to/from at stride 1 and an offset and strides that are multiples of r, and
    /// removes it. `None` where widening's conditions fail.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a narrowing of a layout of [`MAX_RANK`] axes, or one whose positions
    /// multiplied by the ratio pass the bound on positions.
    pub fn bitcast(&self, from_size: usize, to_size: usize) -> Result<Option<Layout>> {
        use std::cmp::Ordering;
        match from_size.cmp(&to_size) {
            Ordering::Equal => Ok(Some(self.clone())),
            Ordering::Greater => {
                let r = (from_size / to_size) as isize;
                if self.rank() == MAX_RANK {
                    return Err(invalid(
                        "nx_kernels::Array::bitcast",
                        format!("narrowing a layout of {MAX_RANK} axes ({:?}) needs one more axis", self.shape),
                    ));
                }
                let mut shape = self.shape.clone();
                let too_far = || {
                    invalid(
                        "nx_kernels::Array::bitcast",
                        format!("a layout {:?} at strides {:?} from {} read as {r} times as many elements reaches past isize", self.shape, self.strides, self.offset),
                    )
                };
                let mut strides: Vec<isize> =
                    self.strides.iter().map(|s| s.checked_mul(r).ok_or_else(too_far)).collect::<Result<_>>()?;
                shape.push(r as usize);
                strides.push(1);
                // `new` checks every position against MAX_POSITION again
                Layout::new(shape, strides, self.offset.checked_mul(r).ok_or_else(too_far)?).map(Some)
            }
            Ordering::Less => {
                let r = to_size / from_size;
                let (Some(&last), Some(&last_stride)) = (self.shape.last(), self.strides.last()) else {
                    return Ok(None);
                };
                if last != r || (last_stride != 1 && r > 1) {
                    return Ok(None);
                }
                let ri = r as isize;
                let rest = &self.strides[..self.rank() - 1];
                let empty = self.numel() == 0;
                if !empty && (self.offset % ri != 0 || rest.iter().any(|s| s % ri != 0)) {
                    return Ok(None);
                }
                let strides = rest.iter().map(|s| s / ri).collect();
                Ok(Some(Layout {
                    shape: self.shape[..self.rank() - 1].to_vec(),
                    strides,
                    offset: self.offset.div_euclid(ri),
                }))
            }
        }
    }
}

/// The element positions of a layout in C order of indices ([`Layout::positions`]).
#[derive(Debug, Clone)]
pub struct Positions<'l> {
    layout: &'l Layout,
    index: Vec<usize>,
    next: isize,
    left: usize,
}

impl Iterator for Positions<'_> {
    type Item = isize;

    fn next(&mut self) -> Option<isize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let out = self.next;
        for d in (0..self.index.len()).rev() {
            self.index[d] += 1;
            self.next += self.layout.strides[d];
            if self.index[d] < self.layout.shape[d] {
                break;
            }
            self.next -= self.layout.strides[d] * self.index[d] as isize;
            self.index[d] = 0;
        }
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Positions<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_shape_examples() {
        assert_eq!(numel(&[2, 3, 4]).unwrap(), 24);
        assert_eq!(contiguous_strides(&[2, 3, 4]).unwrap(), [12, 4, 1]);
        assert_eq!(view_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]), Some(vec![4, 1]));
        assert_eq!(view_strides(&[4, 3], &[1, 4], &[12]), None);
        assert!(Layout::new(vec![1, 32, 64, 1], vec![2048, 64, 1, 64], 0).unwrap().is_contiguous());
        assert_eq!(broadcast_shapes(&[5, 3, 1], &[4]).unwrap(), [5, 3, 4]);
        let l = Layout::new(vec![3, 1], vec![1, 1], 0).unwrap();
        let e = l.apply(&Move::Expand(vec![2, 3, 4])).unwrap().unwrap();
        assert_eq!((e.shape(), e.strides()), (&[2, 3, 4][..], &[0, 1, 0][..]));
        assert_eq!(slice_bounds(50, 80, 60), (50, 60));
        let e = broadcast_shapes(&[2, 3], &[4]).unwrap_err();
        assert!(e.to_string().contains("[2, 3] and [4]"), "{e}");
    }
}
