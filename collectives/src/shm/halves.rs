//! The halves path: data moves in rounds through the two halves of each rank's segment (see the
//! module notes). Every call has one round at least, and checks the announcements after round
//! 0's sync, before anything is read from a peer's half.

use std::sync::atomic::Ordering;

use super::{per_of, piece, put, Shm, HALF, STREAM_MIN};
use crate::checks::offsets;
use crate::reduce::reduce_into;
use crate::{ReduceOp, Reducible, Result};

impl Shm {
    /// After round `k`'s first sync: in round 0, the call's verdict — the refusal, after the
    /// closing sync, where the ranks' calls differ.
    ///
    /// # Errors
    /// [`Error::Mismatch`](crate::Error::Mismatch); [`Error::Timeout`](crate::Error::Timeout).
    fn checked_round(&self, k: usize, call: &str) -> Result<()> {
        if k == 0 {
            if let Err(e) = self.verdict() {
                return self.end(call).and(Err(e));
            }
        }
        Ok(())
    }

    /// [`Shm::broadcast`] through the halves.
    pub(super) fn broadcast_halves<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
        const CALL: &str = "broadcast";
        let per = HALF / size_of::<T>();
        let stream = size_of_val(buf) >= STREAM_MIN;
        for k in 0..buf.len().div_ceil(per).max(1) {
            let h = k % 2;
            let (lo, hi) = piece(buf.len(), k, per);
            if self.rank == root {
                // SAFETY: this rank's own half holds `per` elements; peers read it only after the sync.
                unsafe { put(&buf[lo..hi], self.half(root, h), false) };
            }
            self.sync(CALL)?;
            self.checked_round(k, CALL)?;
            if self.rank != root {
                // SAFETY: the root wrote hi - lo elements there before the sync (their lengths
                // agree: checked above) and rewrites the half only two rounds on; `buf` is this
                // rank's own.
                unsafe {
                    put(std::slice::from_raw_parts(self.half::<T>(root, h), hi - lo), buf[lo..].as_mut_ptr(), stream)
                };
            }
        }
        self.end(CALL)
    }

    /// [`Shm::all_gather_v`] through the halves.
    pub(super) fn all_gather_v_halves<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        const CALL: &str = "all_gather";
        let (me, per) = (self.rank, HALF / size_of::<T>());
        let offs = offsets(counts);
        let stream = size_of_val(recv) >= STREAM_MIN;
        // SAFETY: the checked counts put this rank's block inside `recv`.
        unsafe { put(send, recv[offs[me]..].as_mut_ptr(), stream) };
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0).max(1);
        for k in 0..rounds {
            let h = k % 2;
            let (lo, hi) = piece(send.len(), k, per);
            // SAFETY: this rank's own half, read by peers only after the sync.
            unsafe { put(&send[lo..hi], self.half(me, h), false) };
            self.sync(CALL)?;
            self.checked_round(k, CALL)?;
            for q in (0..self.size()).filter(|&q| q != me) {
                let (lo, hi) = piece(counts[q], k, per);
                // SAFETY: rank q wrote hi - lo elements to its half before the sync (its counts
                // are these: checked above); the block lies inside `recv` by the checked counts.
                unsafe {
                    put(
                        std::slice::from_raw_parts(self.half::<T>(q, h), hi - lo),
                        recv[offs[q] + lo..].as_mut_ptr(),
                        stream,
                    )
                };
            }
        }
        self.end(CALL)
    }

    /// [`Shm::reduce_scatter_v`] through the halves.
    pub(super) fn reduce_scatter_v_halves<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter";
        let (n, me) = (self.size(), self.rank);
        let per = HALF / size_of::<T>() / n;
        let offs = offsets(counts);
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0).max(1);
        for k in 0..rounds {
            let h = k % 2;
            self.publish_blocks(send, &offs, counts, k, per, h);
            self.sync(CALL)?;
            self.checked_round(k, CALL)?;
            let (lo, hi) = piece(counts[me], k, per);
            self.reduce_piece(op, h, hi - lo, &mut recv[lo..hi]);
        }
        self.end(CALL)
    }

    /// [`Shm::all_reduce`] through the halves: a reduce-scatter into place and an all-gather of
    /// its blocks, round by round.
    pub(super) fn all_reduce_halves<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        const CALL: &str = "all_reduce";
        let (n, me, len) = (self.size(), self.rank, send.len());
        let per = HALF / size_of::<T>() / n;
        let counts: Vec<usize> = (0..n).map(|j| (j + 1) * len / n - j * len / n).collect();
        let offs = offsets(&counts);
        let stream = size_of_val(recv) >= STREAM_MIN;
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0).max(1);
        for k in 0..rounds {
            let h = k % 2;
            self.publish_blocks(send, &offs, &counts, k, per, h);
            self.sync(CALL)?;
            self.checked_round(k, CALL)?;
            let (lo, hi) = piece(counts[me], k, per);
            let mine = &mut recv[offs[me] + lo..offs[me] + hi];
            self.reduce_piece(op, h, hi - lo, mine);
            // SAFETY: slot `me` of this rank's own half is read by no peer in this round's
            // reduction (each reads its own slot), and by every peer after the next sync.
            unsafe { put(mine, self.half::<T>(me, h).add(me * per), false) };
            self.sync(CALL)?;
            for q in (0..n).filter(|&q| q != me) {
                let (lo, hi) = piece(counts[q], k, per);
                // SAFETY: rank q wrote its reduced piece to slot q of its half before the sync;
                // the piece lies inside `recv`.
                unsafe {
                    let src = std::slice::from_raw_parts(self.half::<T>(q, h).add(q * per), hi - lo);
                    put(src, recv[offs[q] + lo..].as_mut_ptr(), stream);
                }
            }
        }
        self.end(CALL)
    }

    /// [`Shm::all_to_all_v`] through the halves. The ranks agree on the number of rounds through
    /// the control pages, so no rank needs the others' counts.
    pub(super) fn all_to_all_v_halves<T: Reducible>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        const CALL: &str = "all_to_all";
        let (n, me) = (self.size(), self.rank);
        let per = HALF / size_of::<T>() / n;
        let (soffs, roffs) = (offsets(send_counts), offsets(recv_counts));
        let stream = size_of_val(recv) >= STREAM_MIN;
        // SAFETY: the checked counts put both blocks inside their buffers.
        unsafe { put(&send[soffs[me]..soffs[me] + send_counts[me]], recv[roffs[me]..].as_mut_ptr(), stream) };
        let mine = send_counts.iter().chain(recv_counts).map(|c| c.div_ceil(per)).max().unwrap_or(0);
        // read by the peers after the first sync; rewritten only after the closing one
        self.slot(me).store(mine as u64, Ordering::Relaxed);
        let mut rounds = 1;
        let mut k = 0;
        while k < rounds {
            let h = k % 2;
            self.publish_blocks(send, &soffs, send_counts, k, per, h);
            self.sync(CALL)?;
            self.checked_round(k, CALL)?;
            if k == 0 {
                rounds = (0..n).map(|q| self.slot(q).load(Ordering::Relaxed) as usize).max().unwrap_or(0).max(1);
            }
            for q in (0..n).filter(|&q| q != me) {
                let (lo, hi) = piece(recv_counts[q], k, per);
                // SAFETY: rank q wrote piece k of its block for this rank to slot `me` of its half
                // before the sync (its send count is this rank's receive count: checked above),
                // never more than `per` elements.
                unsafe {
                    let src = std::slice::from_raw_parts(self.half::<T>(q, h).add(me * per), hi - lo);
                    put(src, recv[roffs[q] + lo..].as_mut_ptr(), stream);
                }
            }
            k += 1;
        }
        self.end(CALL)
    }

    /// Ends a call: orders its streaming stores and meets the peers once more, so that every half
    /// and announcement is free for the next call.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout).
    fn end(&self, call: &str) -> Result<()> {
        nx_kernels::host::store_fence();
        self.sync(call)
    }

    /// Copies piece `k` of every block `q` of `send` to slot `q` of this rank's half `h`.
    fn publish_blocks<T: Reducible>(
        &self,
        send: &[T],
        offs: &[usize],
        counts: &[usize],
        k: usize,
        per: usize,
        h: usize,
    ) {
        for (q, (&o, &c)) in offs.iter().zip(counts).enumerate() {
            let (lo, hi) = piece(c, k, per);
            // SAFETY: this rank's own half holds n·per elements; peers read it after the sync.
            unsafe { put(&send[o + lo..o + hi], self.half::<T>(self.rank, h).add(q * per), false) };
        }
    }

    /// Reduces slot `me` of every rank's half `h` (`len` elements), in rank order, into `out`.
    fn reduce_piece<T: Reducible>(&self, op: ReduceOp, h: usize, len: usize, out: &mut [T]) {
        let me = self.rank;
        // SAFETY: each rank wrote `len` elements to slot `me` of its half before the sync (their
        // counts agree: checked in round 0), and rewrites the half only two rounds on.
        let terms: Vec<&[T]> = (0..self.size())
            .map(|q| unsafe {
                std::slice::from_raw_parts(self.half::<T>(q, h).add(me * per_of::<T>(self.size())), len)
            })
            .collect();
        let done = reduce_into(self.simd, op, &terms, out);
        debug_assert!(done, "the op was checked for the dtype");
    }
}
