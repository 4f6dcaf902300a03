//! What a rank announces of each call before any byte moves: the op, the dtype, the counts its
//! fingerprint carries, the addresses and lengths of its buffers, and for an all-to-all every
//! send and receive count. Peers check the announcement before they touch one another's memory,
//! in checked mode or not: a reader or writer never leaves a peer's buffer (each access is checked
//! against the length the peer announced for it), and ranks whose calls differ end with one
//! verdict, the same on every rank, naming the first two that differ.
//!
//! An announcement stays as it is from the owner's arrival at the call's first sync until the
//! peers have all arrived at its second (every call has two syncs at least; the owner announces
//! its next call only after the last sync of this one), so every check between the two syncs reads
//! a stable announcement of the same call.

use std::sync::atomic::{AtomicU64, Ordering};

use nx_kernels::Dtype;

use super::{Shm, MAX_RANKS};
use crate::{checks, Error, Result};

/// Byte offsets in the control pages: the two buffers' addresses then their lengths (elements),
/// the op, the dtype, the number of counts and their digest (all on one cache line); the counts
/// on the next page; an all-to-all's send counts then receive counts on the two after.
const AT_BUFS: usize = 128;
const AT_CALL: usize = 160;
const AT_COUNTS: usize = 4096;
const AT_PAIRS: usize = 8192;
/// The control pages' size: the counters' page and the three above.
pub(crate) const CTRL: usize = 16384;

/// The ops, by the names their fingerprints give them; announced as their place here, plus one.
const OPS: [&str; 12] = [
    "barrier",
    "broadcast",
    "all_reduce_sum",
    "all_reduce_prod",
    "all_reduce_max",
    "all_reduce_min",
    "reduce_scatter_sum",
    "reduce_scatter_prod",
    "reduce_scatter_max",
    "reduce_scatter_min",
    "all_gather",
    "all_to_all",
];

/// The digest of a call's op, dtype and counts (FNV-1a over their words).
fn digest(op: usize, dtype: usize, counts: &[usize]) -> u64 {
    [op, dtype, counts.len()]
        .iter()
        .chain(counts)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &w| (h ^ w as u64).wrapping_mul(0x100_0000_01b3))
}

/// The announced code of `op`: its place in [`OPS`] plus one (0: none).
fn code(op: &str) -> usize {
    OPS.iter().position(|&o| o == op).map_or(0, |i| i + 1)
}

/// The code of `all_to_all` (the last of [`OPS`]).
const ALL_TO_ALL: usize = OPS.len();

/// A call as its ranks must agree on it.
pub(super) struct Call<'a> {
    /// The op's fingerprint name (one of [`OPS`]).
    pub op: &'static str,
    /// The element dtype (`None` for a barrier).
    pub dtype: Option<Dtype>,
    /// The counts its fingerprint carries (a length, counts per rank, a length and a root).
    pub counts: &'a [usize],
    /// An all-to-all's send and receive counts.
    pub pairs: Option<(&'a [usize], &'a [usize])>,
}

/// A buffer as announced: its address and its length in elements.
pub(super) type Announced = (usize, usize);

impl Shm {
    /// Member `q`'s control word at byte `at`.
    fn word(&self, q: usize, at: usize) -> &AtomicU64 {
        debug_assert!(at + 8 <= CTRL && at.is_multiple_of(8));
        // SAFETY: an aligned u64 inside a live, 64-byte aligned control page of CTRL bytes;
        // every access to control words is atomic.
        unsafe { &*((self.node.bases[self.members[q]] + at) as *const AtomicU64) }
    }

    fn load(&self, q: usize, at: usize) -> usize {
        self.word(q, at).load(Ordering::Relaxed) as usize
    }

    /// Announces `call` over the buffers `bufs` (address, length in elements; `(0, 0)` for none).
    /// Made before the call's first arrival, which publishes it (a fence and a release store).
    pub(super) fn announce(&self, call: &Call<'_>, bufs: [Announced; 2]) {
        let me = self.rank;
        let set = |at: usize, v: usize| self.word(me, at).store(v as u64, Ordering::Relaxed);
        let op = code(call.op);
        let dtype = call.dtype.and_then(|d| Dtype::ALL.iter().position(|&x| x == d)).map_or(0, |i| i + 1);
        for (i, (addr, len)) in bufs.into_iter().enumerate() {
            set(AT_BUFS + 8 * i, addr);
            set(AT_BUFS + 16 + 8 * i, len);
        }
        set(AT_CALL, op);
        set(AT_CALL + 8, dtype);
        set(AT_CALL + 24, digest(op, dtype, call.counts) as usize);
        // at most MAX_RANKS + 2 counts fit the page; no call carries more (a group has at most
        // MAX_RANKS members)
        debug_assert!(call.counts.len() <= MAX_RANKS + 2);
        let counts = &call.counts[..call.counts.len().min(MAX_RANKS + 2)];
        set(AT_CALL + 16, counts.len());
        for (i, &c) in counts.iter().enumerate() {
            set(AT_COUNTS + 8 * i, c);
        }
        if let Some((send, recv)) = call.pairs {
            for (i, &c) in send.iter().chain(recv).enumerate() {
                set(AT_PAIRS + 8 * i, c);
            }
        }
    }

    /// Member `q`'s announced buffer `i`.
    pub(super) fn announced(&self, q: usize, i: usize) -> Announced {
        (self.load(q, AT_BUFS + 8 * i), self.load(q, AT_BUFS + 16 + 8 * i))
    }

    /// Member `q`'s announced counts.
    fn counts_of(&self, q: usize) -> Vec<usize> {
        let n = self.load(q, AT_CALL + 16).min(MAX_RANKS + 2);
        (0..n).map(|i| self.load(q, AT_COUNTS + 8 * i)).collect()
    }

    /// Member `q`'s announced all-to-all counts: what it sends to each member, then what it
    /// receives from each.
    fn pairs_of(&self, q: usize) -> Vec<usize> {
        (0..2 * self.size()).map(|i| self.load(q, AT_PAIRS + 8 * i)).collect()
    }

    /// Whether members `p` and `q` announced the same op, dtype and counts: by the words of one
    /// cache line — op, dtype, number of counts and the counts' digest — where a peer's counts
    /// page would cost a second line from its core (a tenth of a small all-gather's time). Two
    /// calls whose counts differ share a digest once in 2⁶⁴ pairs; even then every access stays
    /// inside the buffers announced ([`Shm::inside`]).
    fn same(&self, p: usize, q: usize) -> bool {
        [0, 8, 16, 24].iter().all(|&w| self.load(p, AT_CALL + w) == self.load(q, AT_CALL + w))
    }

    /// Member `q`'s call in words, as fingerprints print one: `all_gather(f32, [4, 4])`.
    pub(super) fn describe(&self, q: usize) -> String {
        let op = self.load(q, AT_CALL).checked_sub(1).and_then(|i| OPS.get(i)).copied().unwrap_or("an unknown call");
        match self.load(q, AT_CALL + 8).checked_sub(1).and_then(|i| Dtype::ALL.get(i)) {
            Some(d) => format!("{op}({d}, {:?})", self.counts_of(q)),
            None => format!("{op}()"),
        }
    }

    /// The mismatch between members `p` and `q`, naming both calls.
    pub(super) fn mismatch(&self, p: usize, q: usize) -> Error {
        let world = |m: usize| self.node.world[self.members[m]];
        Error::Mismatch { rank_a: world(p), call_a: self.describe(p), rank_b: world(q), call_b: self.describe(q) }
    }

    /// Whether this rank and member `q` may move data between them: the same call, and for an
    /// all-to-all the same counts both ways.
    pub(super) fn agrees_with(&self, q: usize) -> bool {
        let me = self.rank;
        if !self.same(me, q) {
            return false;
        }
        if self.load(me, AT_CALL) != ALL_TO_ALL {
            return true;
        }
        let (n, mine, theirs) = (self.size(), self.pairs_of(me), self.pairs_of(q));
        theirs[me] == mine[n + q] && mine[q] == theirs[n + me]
    }

    /// The call's verdict, once every member has announced it: the same on every rank, as each
    /// reads the same announcements. `Ok` where every member announced member 0's call (and for an
    /// all-to-all every sender's count is its receiver's); else the mismatch naming member 0 and
    /// the first that differs (or the first pair of counts that differ).
    ///
    /// # Errors
    /// [`Error::Mismatch`].
    pub(super) fn verdict(&self) -> Result<()> {
        if let Some(q) = (1..self.size()).find(|&q| !self.same(0, q)) {
            return Err(self.mismatch(0, q));
        }
        if self.load(0, AT_CALL) == ALL_TO_ALL {
            let all: Vec<Vec<usize>> = (0..self.size()).map(|q| self.pairs_of(q)).collect();
            checks::all_to_all_pairs(&all, |m| self.node.world[self.members[m]])?;
        }
        Ok(())
    }

    /// Where member `q`'s all-to-all block for member `to` starts in its send buffer, by its
    /// announced send counts (`None` where they overflow).
    pub(super) fn send_offset(&self, q: usize, to: usize) -> Option<usize> {
        checks::total(&self.pairs_of(q)[..to])
    }

    /// Elements `at..at + len` of member `q`'s announced buffer `i`, as a byte address in its
    /// process, or the mismatch where they do not lie inside it (announcements that agree never
    /// leave it: the check makes every cross-process access stay in bounds whatever they say).
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming this rank's call and `q`'s.
    pub(super) fn inside(&self, q: usize, i: usize, at: usize, len: usize, elem: usize) -> Result<usize> {
        let (addr, n) = self.announced(q, i);
        match at.checked_add(len) {
            Some(end) if end <= n && addr != 0 => Ok(addr + at * elem),
            _ if len == 0 => Ok(addr),
            _ => Err(self.mismatch(self.rank, q)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_all_to_all_code_is_its_place() {
        assert_eq!(super::code("all_to_all"), super::ALL_TO_ALL);
    }
}
