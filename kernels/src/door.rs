//! The door: every kernel reaches its operands through it. It claims every operand of a call or
//! none, checks what the reference lists, runs the kernel under the claims and releases them.

use std::fmt;

use crate::buffer::{Buffer, Claim, ClaimRefusal, Claims};
use crate::layout::Layout;
use crate::{Dtype, Error};

/// What a kernel answers: done, declined, or a refusal naming what is wrong with an operand.
///
/// Refusals are listed in their order of precedence: a kernel checks dtypes before it opens the
/// door (`WrongDtype`); the door answers, in this order, `DeadBuffer`, `HeldExclusive` and
/// `ReadOnly` (claiming an operand answers them, so a dead operand is `DeadBuffer` whatever else is
/// wrong with it), then `OffHost`, `RepeatedElements` and `Overlapping`; the kernel checks shapes
/// under the claims, before any write (`ShapeMismatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The work is done.
    Done,
    /// The kernel does not compute this case.
    Declined,
    /// An operand's dtype is not the one the kernel loads.
    WrongDtype,
    /// An operand's buffer is dead.
    DeadBuffer,
    /// The host does not address an operand's memory.
    OffHost,
    /// An operand's memory is held exclusive.
    HeldExclusive,
    /// A written operand's memory admits reads only.
    ReadOnly,
    /// A written operand reaches an element twice.
    RepeatedElements,
    /// A written operand shares a byte with another written operand, or with a read operand not
    /// identical to it.
    Overlapping,
    /// The operands do not fit the operation: their number or their shapes.
    ShapeMismatch,
    /// A device whose work the call must follow is lost (its work will never be done).
    Lost,
    /// An index operand holds a position outside the axis it indexes.
    IndexOutOfRange,
}

impl Answer {
    /// What the refusal says, in words.
    pub fn reason(self) -> &'static str {
        match self {
            Answer::Done => "done (refuses nothing)",
            Answer::Declined => "declined (refuses nothing)",
            Answer::WrongDtype => "an operand's dtype is not the one the kernel loads",
            Answer::DeadBuffer => "an operand's buffer is dead",
            Answer::OffHost => "the host does not address an operand's memory",
            Answer::HeldExclusive => "an operand's memory is held exclusive",
            Answer::ReadOnly => "a written operand's memory is read-only",
            Answer::RepeatedElements => "a written operand reaches an element twice",
            Answer::Overlapping => "a written operand shares bytes with another operand it is not identical to",
            Answer::ShapeMismatch => "the operands' shapes do not fit the operation",
            Answer::Lost => "a device whose work the call must follow is lost",
            Answer::IndexOutOfRange => "an index lies outside the axis it indexes",
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// An array of any dtype, as a kernel's operand. `Sync`: a kernel's tasks on several threads read it.
pub trait Operand: Sync {
    /// The element dtype.
    fn dtype(&self) -> Dtype;
    /// The layout, in elements of the dtype.
    fn layout(&self) -> &Layout;
    /// The buffer.
    fn buffer(&self) -> &Buffer;
}

/// `dtype shape`, as refusals print an operand: `f32 [3, 4]`.
pub fn describe(o: &dyn Operand) -> String {
    format!("{} {:?}", o.dtype(), o.layout().shape())
}

/// Claims the memory of `written` for writing and of `read` for reading — every claim or none —
/// checks them, runs `f` and releases the claims when `f` returns or panics. Answers `f`'s result,
/// or a refusal without running `f` or holding a claim: `DeadBuffer`, `HeldExclusive`, `ReadOnly`,
/// then `OffHost` (this is the host's door), `RepeatedElements` and `Overlapping`.
///
/// The door never waits: a claim that conflicts with another call's is refused as
/// `HeldExclusive`. It is safe to call from several threads at once.
///
/// # Errors
/// The refusal, as an [`Answer`]; raise it for the user with [`refused`].
///
/// An operand of a packed dtype (`int4`, `uint4`, `bit`: elements narrower than a byte) is
/// refused as `WrongDtype` before any claim: a kernel addressing elements by bytes would read the
/// wrong bits. Only nx's own bit-aware accesses open the door to them.
pub fn door<R>(written: &[&dyn Operand], read: &[&dyn Operand], f: impl FnOnce() -> R) -> Result<R, Answer> {
    if written.iter().chain(read).any(|o| o.dtype().is_packed()) {
        return Err(Answer::WrongDtype);
    }
    door_packed(written, read, f)
}

/// [`door`], admitting packed operands: for callers that address elements by bits
/// ([`crate::Element::load_at`]).
pub(crate) fn door_packed<R>(
    written: &[&dyn Operand],
    read: &[&dyn Operand],
    f: impl FnOnce() -> R,
) -> Result<R, Answer> {
    let all: Vec<(&dyn Operand, bool)> =
        written.iter().map(|&o| (o, true)).chain(read.iter().map(|&o| (o, false))).collect();
    // One claim per buffer: exclusive where any operand over it is written.
    let mut wanted: Vec<(Buffer, Claim)> = Vec::with_capacity(all.len());
    for (o, w) in &all {
        let c = if *w { Claim::Exclusive } else { Claim::Shared };
        match wanted.iter_mut().find(|(b, _)| b == o.buffer()) {
            Some(slot) => {
                if c == Claim::Exclusive {
                    slot.1 = Claim::Exclusive;
                }
            }
            None => wanted.push((o.buffer().clone(), c)),
        }
    }
    let claims = Claims::take(&wanted).map_err(|r| match r {
        ClaimRefusal::Dead(_) => Answer::DeadBuffer,
        ClaimRefusal::HeldExclusive(_) => Answer::HeldExclusive,
        ClaimRefusal::ReadOnly(_) => Answer::ReadOnly,
    })?;
    let refusal = if all.iter().any(|(o, _)| !o.buffer().is_host() && o.layout().numel() > 0) {
        Some(Answer::OffHost)
    } else if written.iter().any(|o| !o.layout().is_distinct()) {
        Some(Answer::RepeatedElements)
    } else if overlapping(&all) {
        Some(Answer::Overlapping)
    } else {
        None
    };
    if let Some(r) = refusal {
        drop(claims);
        return Err(r);
    }
    let out = f();
    drop(claims);
    Ok(out)
}

fn overlapping(all: &[(&dyn Operand, bool)]) -> bool {
    for (i, (w, is_w)) in all.iter().enumerate() {
        if !is_w {
            continue;
        }
        for (j, (o, o_w)) in all.iter().enumerate() {
            if i == j || (*o_w && j < i) {
                continue;
            }
            if w.buffer().memory_id() != o.buffer().memory_id() {
                continue;
            }
            let (wl, ol) = (w.layout(), o.layout());
            let (ws, os) = (w.dtype().bits(), o.dtype().bits());
            if !o_w && identical_bits(wl, ws, ol, os) {
                continue;
            }
            if shares_byte_bits(wl, ws, ol, os) {
                return true;
            }
        }
    }
    false
}

/// Whether two layouts of elements `sa` and `sb` bytes wide place every index at the same bits.
pub fn identical(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    identical_bits(a, sa * 8, b, sb * 8)
}

/// [`identical`] for elements `sa` and `sb` bits wide.
pub(crate) fn identical_bits(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    if sa != sb || a.shape() != b.shape() {
        return false;
    }
    if a.numel() == 0 {
        return true;
    }
    a.offset() == b.offset()
        && a.shape().iter().zip(a.strides().iter().zip(b.strides())).all(|(&n, (x, y))| n == 1 || x == y)
}

/// Whether an element of `a` (elements `sa` bytes wide) and one of `b` share a byte. Exact for any
/// strides; O(1) for disjoint spans and for dense layouts, O(rank) (at most 2^rank) for two
/// layouts of one element width that are one lattice of nested strides moved by an offset
/// (interleaved entries of one array), O(n log n) otherwise.
pub fn shares_byte(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    shares_byte_bits(a, sa * 8, b, sb * 8)
}

/// [`shares_byte`] for elements `sa` and `sb` bits wide: an element narrower than a byte
/// (1 or 4 bits, never straddling two bytes) occupies the one byte that holds it.
pub(crate) fn shares_byte_bits(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    if sa < 8 || sb < 8 {
        return shares_byte_packed(a, sa, b, sb);
    }
    let (sa, sb) = (sa / 8, sb / 8);
    let (Some((alo, ahi)), Some((blo, bhi))) = (a.span(), b.span()) else { return false };
    let (sa_i, sb_i) = (sa as isize, sb as isize);
    let (a0, a1) = (alo * sa_i, (ahi + 1) * sa_i);
    let (b0, b1) = (blo * sb_i, (bhi + 1) * sb_i);
    let (lo, hi) = (a0.max(b0), a1.min(b1));
    if lo >= hi {
        return false;
    }
    let dense =
        |l: &Layout, s: isize, span: (isize, isize)| l.is_distinct() && (span.1 - span.0) == l.numel() as isize * s;
    if dense(a, sa_i, (a0, a1)) && dense(b, sb_i, (b0, b1)) {
        return true;
    }
    if sa == sb {
        if let Some(meet) = lattices_meet(a, b) {
            return meet;
        }
    }
    // Starts of a's elements within the common span, sorted; then each of b's elements looks for
    // one whose bytes meet its own.
    let mut starts: Vec<isize> = a.positions().map(|p| p * sa_i).filter(|&s| s + sa_i > lo && s < hi).collect();
    starts.sort_unstable();
    b.positions().map(|p| p * sb_i).filter(|&q| q + sb_i > lo && q < hi).any(|q| {
        let k = starts.partition_point(|&s| s + sa_i <= q);
        k < starts.len() && starts[k] < q + sb_i
    })
}

/// The axes of `l` as (extent, |stride|) by ascending stride, extent-1 axes left out, and its
/// least position; `None` for a broadcast (stride 0) axis.
fn lattice(l: &Layout) -> Option<(Vec<(usize, isize)>, isize)> {
    let mut base = l.offset();
    let mut axes = Vec::with_capacity(l.rank());
    for (&n, &s) in l.shape().iter().zip(l.strides()) {
        if n == 1 {
            continue;
        }
        if s == 0 {
            return None;
        }
        if s < 0 {
            base += (n as isize - 1) * s;
        }
        axes.push((n, s.abs()));
    }
    axes.sort_unstable_by_key(|&(n, s)| (s, n));
    Some((axes, base))
}

/// Whether two layouts of elements of one width share a position, decided without listing them
/// where both are the same lattice of nested strides moved by an offset (views of one dense
/// array's entries along an axis: packed `q`, `k`, `v`): with the strides ascending and each
/// greater than the reach `Σ (n − 1)·s` of those below it, a difference of positions has at
/// most two candidate digits an axis, tried from the largest stride down. `None` where the
/// layouts are not such a pair (the caller lists positions).
fn lattices_meet(a: &Layout, b: &Layout) -> Option<bool> {
    let ((axes, base_a), (axes_b, base_b)) = (lattice(a)?, lattice(b)?);
    if axes != axes_b || axes.len() > 16 {
        return None;
    }
    // reach[k]: the greatest |Σ j·s| of the axes below k
    let mut reach = Vec::with_capacity(axes.len() + 1);
    reach.push(0isize);
    for &(n, s) in &axes {
        let below = *reach.last().expect("starts with 0");
        if s <= below {
            return None;
        }
        reach.push(below.checked_add((n as isize - 1).checked_mul(s)?)?);
    }
    // is `delta` Σ j_k·s_k with |j_k| < n_k over axes 0..k?
    fn solve(axes: &[(usize, isize)], reach: &[isize], delta: isize) -> bool {
        let Some((&(n, s), lower)) = axes.split_last() else { return delta == 0 };
        let below = reach[lower.len()];
        let f = delta.div_euclid(s);
        [f, f + 1].into_iter().any(|j| {
            let r = delta - j * s;
            j.unsigned_abs() < n && r.abs() <= below && solve(lower, reach, r)
        })
    }
    Some(solve(&axes, &reach, base_b - base_a))
}

/// [`shares_byte_bits`] where either element is narrower than a byte: the byte ranges of every
/// element, compared exactly (O(n log n)).
fn shares_byte_packed(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    // the byte range of an element at position p, `bits` wide (positions lie within
    // MAX_POSITION = isize::MAX / 32 and elements are at most 128 bits: the products fit)
    let range = |p: isize, bits: usize| {
        let w = bits as isize;
        ((p * w).div_euclid(8), (p * w + w + 7).div_euclid(8))
    };
    let (Some((alo, ahi)), Some((blo, bhi))) = (a.span(), b.span()) else { return false };
    let ((a0, _), (_, a1)) = (range(alo, sa), range(ahi, sa));
    let ((b0, _), (_, b1)) = (range(blo, sb), range(bhi, sb));
    if a0.max(b0) >= a1.min(b1) {
        return false;
    }
    // each position once: a broadcast axis repeats positions (and may describe far more
    // elements than memory holds)
    let bytes = |l: &Layout, bits: usize| -> Vec<(isize, isize)> {
        let mut v: Vec<(isize, isize)> = l.without_broadcast().positions().map(|p| range(p, bits)).collect();
        v.sort_unstable();
        v
    };
    let (ra, rb) = (bytes(a, sa), bytes(b, sb));
    // ranges sorted by start; a's merged into disjoint runs, then each of b's looks for a run it meets
    let mut runs: Vec<(isize, isize)> = Vec::new();
    for (s, e) in ra {
        match runs.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => runs.push((s, e)),
        }
    }
    rb.iter().any(|&(s, e)| {
        let k = runs.partition_point(|r| r.1 <= s);
        k < runs.len() && runs[k].0 < e
    })
}

/// The error that raises `answer` for the user: it names `func` (the function the user called),
/// the reason, and each operand's dtype and shape; for a dead buffer, each dead operand and why
/// it died (`nx::add: f32 [3] was donated to nx::mul (f32 [3], …)`).
pub fn refused(func: &str, answer: Answer, operands: &[&dyn Operand]) -> Error {
    let message = match answer {
        Answer::DeadBuffer => {
            let dead: Vec<String> = operands
                .iter()
                .filter_map(|o| o.buffer().death().map(|d| format!("{} was {d}", describe(*o))))
                .collect();
            if dead.is_empty() {
                format!("{func}: {}", answer.reason())
            } else {
                format!("{func}: {}", dead.join("; "))
            }
        }
        _ => {
            let ops: Vec<String> = operands.iter().map(|o| describe(*o)).collect();
            format!("{func}: {} ({})", answer.reason(), ops.join(", "))
        }
    };
    Error::Refused { answer, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_views_are_decided_without_listing_positions() {
        // a dense [t = 5, 3, h = 4, d = 8]: entry e of axis 1 read heads first, [h, t, d]
        let entry = |e: isize| Layout::new(vec![4, 5, 8], vec![8, 96, 1], e * 32).unwrap();
        assert_eq!(lattices_meet(&entry(0), &entry(1)), Some(false));
        assert_eq!(lattices_meet(&entry(2), &entry(2)), Some(true));
        // the same lattice with its axes listed in another order
        let rows_first = Layout::new(vec![5, 4, 8], vec![96, 8, 1], 32).unwrap();
        assert_eq!(lattices_meet(&entry(0), &rows_first), Some(false));
        assert_eq!(lattices_meet(&entry(1), &rows_first), Some(true));
        // an axis reversed: the same lattice from its least position
        let reversed = Layout::new(vec![4, 5, 8], vec![-8, 96, 1], 32 + 3 * 8).unwrap();
        assert_eq!(lattices_meet(&entry(1), &reversed), Some(true));
        assert_eq!(lattices_meet(&entry(0), &reversed), Some(false));
        // other strides, or strides that are not nested (positions repeat): left to the listing
        let other = Layout::new(vec![4, 5, 8], vec![8, 97, 1], 0).unwrap();
        assert_eq!(lattices_meet(&entry(0), &other), None);
        let repeating = Layout::new(vec![4, 8], vec![2, 1], 0).unwrap();
        assert_eq!(lattices_meet(&repeating, &repeating), None);
        // and the door's answer through it
        assert!(!shares_byte(&entry(0), 4, &entry(1), 4));
        assert!(shares_byte(&entry(1), 4, &rows_first, 4));
    }
}
