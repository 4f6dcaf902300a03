//! The hierarchical path of the MPI backend (and the byte views its calls and the flat ones share): a communicator whose members lie on H ≥ 2 hosts, L ≥
//! 2 on each, reduces within each host first and then across hosts, so that each rank sends
//! across hosts only its share of its host's partial result.
//!
//! A reduce-scatter of S bytes is a reduce-scatter within the host (local rank l keeps, summed over
//! the host's L terms in rank order and rounded, the blocks of every host's l-th member:
//! S/L) and then one across the hosts among the members of local rank l (host h keeps its block,
//! summed over the H host results in host order): each rank sends S·(H−1)/(H·L) across hosts, the
//! hierarchical floor, where the flat exchange sends S·(n−L)/n. An all-gather goes the other way:
//! across the hosts among the members of each local rank, then within the host. The association
//! is the one every path keeps across hosts ([`crate::Communicator::hosts`]), so the bits are the
//! flat path's and the simulated backend's laid out alike.
//!
//! The bytes move by MPI's own calls on two sub-communicators (within a host Open MPI's
//! shared-memory transport carries them); nx reduces them, in the documented order. A large
//! reduce-scatter goes in pieces (one for each 2 MiB of a rank's input, at most 16; each member's
//! block cut alike): the exchange across hosts of one
//! piece (`MPI_Ialltoallv`) runs while the next piece is reduced within the host; an all-gather
//! likewise, in pieces of about 2 MiB of each member's block, gathers one piece within the host
//! while the next crosses (`MPI_Iallgatherv`); an all-reduce runs the two as one pipeline of
//! three steps (piece p reduced within the host while p−1 crosses reduced and p−2 crosses
//! gathered). Pieces of 2 MiB, at most 16, measured ahead of 1 MiB (at most 64: 0.5–0.7×) and of
//! at most 8 (0.94×) on 64 MiB over two namespaced hosts.

use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives as _;

use crate::checks::offsets as displs;
use crate::reduce::{by_host, reduce_into};
use crate::{Error, ReduceOp, Reducible, Result};
use mpi::Count;
use nx_kernels::Simd;

/// The two levels of a communicator laid out regularly over hosts.
pub(crate) struct Tiers {
    /// The members on this host, numbered in rank order.
    local: SimpleCommunicator,
    /// The members of this one's local rank on every host, numbered in host order.
    cross: SimpleCommunicator,
    /// `at[h][l]`: the communicator rank of host h's l-th member.
    at: Vec<Vec<usize>>,
    /// This rank's host and local rank.
    h: usize,
    l: usize,
    /// The SIMD level of the reduction loops.
    simd: Simd,
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tiers({} hosts of {}, this rank {}.{})", self.at.len(), self.at[0].len(), self.h, self.l)
    }
}

impl Tiers {
    /// The levels of `comm`, whose member of rank r lies on host `hosts[r]` (the same list on
    /// every member); `None`, with no call made, unless there are at least two hosts of the same
    /// number (at least two) of members. Collective over `comm` otherwise.
    pub(crate) fn new(comm: &SimpleCommunicator, hosts: &[usize], simd: Simd) -> Option<Tiers> {
        let at = by_host(hosts.iter().copied());
        let per = at[0].len();
        if at.len() < 2 || per < 2 || at.iter().any(|g| g.len() != per) {
            return None;
        }
        let me = comm.rank() as usize;
        let (h, l) = at
            .iter()
            .enumerate()
            .find_map(|(h, g)| g.iter().position(|&r| r == me).map(|l| (h, l)))
            .expect("every member lies on a host");
        let local = comm.split_by_color_with_key(Color::with_value(h as i32), l as i32)?;
        let cross = comm.split_by_color_with_key(Color::with_value(l as i32), h as i32)?;
        Some(Tiers { local, cross, at, h, l, simd })
    }

    /// `recv` = this rank's block (of `counts`, by communicator rank) of the reduction of every
    /// member's `send` — within the host, then across the hosts.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    pub(crate) fn reduce_scatter_v<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        const FUNC: &str = "nx_collectives::mpi::reduce_scatter";
        let hosts = self.at.len();
        // every byte count fits MPI's range (then every piece's does)
        byte_counts::<T>([send.len()], FUNC)?;
        let off = displs(counts);
        // in pieces, the across-host exchange of one overlapping the within-host one of the next
        let pieces = (std::mem::size_of_val(send) / PIECE).clamp(1, MAX_PIECES);
        let cut = |q: usize, p: usize| off[q] + counts[q] * p / pieces;
        let len = |q: usize, p: usize| cut(q, p + 1) - cut(q, p);
        let me = self.at[self.h][self.l];
        let mut inflight: Option<(Exchange<T>, usize)> = None;
        let mut result = Ok(());
        for p in 0..pieces {
            let local = self.reduce_within(send, &cut, p, op);
            if let Some((x, pp)) = inflight.take() {
                self.close(x, &|q| len(q, pp), &mut recv[cut(me, pp) - off[me]..cut(me, pp + 1) - off[me]], op);
            }
            let part = match local {
                Ok(part) => part,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            // across the hosts: host h's piece to its member of this local rank
            let cross_counts: Vec<usize> = (0..hosts).map(|h| len(self.at[h][self.l], p)).collect();
            inflight = Some((Exchange::start(&self.cross, part, &cross_counts, len(me, p))?, p));
        }
        if let Some((x, pp)) = inflight.take() {
            self.close(x, &|q| len(q, pp), &mut recv[cut(me, pp) - off[me]..cut(me, pp + 1) - off[me]], op);
        }
        result
    }

    /// `recv` = the reduction of every member's `send` (chunk j of it reduced on member j as
    /// [`Tiers::reduce_scatter_v`] does, then gathered to all), in pieces whose steps overlap:
    /// while piece p is reduced within the host, piece p−1 crosses the hosts reduced and piece p−2
    /// crosses them gathered.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    pub(crate) fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        const FUNC: &str = "nx_collectives::mpi::all_reduce";
        let (hosts, per) = (self.at.len(), self.at[0].len());
        // n = hosts·per, both counts of members: no overflow
        byte_counts::<T>([send.len()], FUNC)?;
        let n = hosts * per;
        let len_all = send.len();
        let counts: Vec<usize> = (0..n).map(|j| (j + 1) * len_all / n - j * len_all / n).collect();
        let off = displs(&counts);
        let pieces = (std::mem::size_of_val(send) / PIECE).clamp(1, MAX_PIECES);
        let cut = |q: usize, p: usize| off[q] + counts[q] * p / pieces;
        let len = |q: usize, p: usize| cut(q, p + 1) - cut(q, p);
        let me = self.at[self.h][self.l];
        let cross_counts = |p: usize| -> Vec<usize> { (0..hosts).map(|h| len(self.at[h][self.l], p)).collect() };
        // piece p reduced across the hosts: this rank's part, then its gather across them starts
        let reduced = |x: Exchange<T>, p: usize| -> Result<Exchange<T>> {
            let mut mine = vec![T::default(); len(me, p)];
            self.close(x, &|q| len(q, p), &mut mine, op);
            Exchange::gather(&self.cross, mine, &cross_counts(p))
        };
        let gathered = |x: Exchange<T>, p: usize, recv: &mut [T]| self.gather_within(x, &cut, p, recv, FUNC);
        let mut rs: Option<(Exchange<T>, usize)> = None;
        let mut ag: Option<(Exchange<T>, usize)> = None;
        for p in 0..pieces {
            let part = self.reduce_within(send, &cut, p, op)?;
            let started = Exchange::start(&self.cross, part, &cross_counts(p), len(me, p))?;
            if let Some((x, pp)) = rs.replace((started, p)) {
                let next = reduced(x, pp)?;
                if let Some((y, ppp)) = ag.replace((next, pp)) {
                    gathered(y, ppp, recv)?;
                }
            }
        }
        if let Some((x, pp)) = rs.take() {
            let next = reduced(x, pp)?;
            if let Some((y, ppp)) = ag.replace((next, pp)) {
                gathered(y, ppp, recv)?;
            }
        }
        if let Some((y, ppp)) = ag.take() {
            gathered(y, ppp, recv)?;
        }
        Ok(())
    }

    /// Piece p of every member's block of `send` (member q's from `cut(q, p)` to `cut(q, p + 1)`)
    /// reduced within the host: this rank keeps, summed over its host's members in rank order,
    /// piece p of every host's member of its local rank, in host order.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    fn reduce_within<T: Reducible>(
        &self,
        send: &[T],
        cut: &dyn Fn(usize, usize) -> usize,
        p: usize,
        op: ReduceOp,
    ) -> Result<Vec<T>> {
        let (hosts, per) = (self.at.len(), self.at[0].len());
        // local rank l' keeps piece p of every host's l'-th member's block
        let mut regrouped = Vec::new();
        let mut local_counts = vec![0usize; per];
        for (lp, c) in local_counts.iter_mut().enumerate() {
            for h in 0..hosts {
                let q = self.at[h][lp];
                regrouped.extend_from_slice(&send[cut(q, p)..cut(q, p + 1)]);
                *c += cut(q, p + 1) - cut(q, p);
            }
        }
        let mut part = vec![T::default(); local_counts[self.l]];
        exchange_reduce(self.simd, &self.local, &regrouped, &local_counts, &mut part, op)?;
        Ok(part)
    }

    /// Waits for piece p's gather across the hosts (this local rank's piece of every host's
    /// block), gathers every local rank's within the host, and puts each member q's piece into
    /// `recv` from `at(q, p)` to `at(q, p + 1)`.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    fn gather_within<T: Reducible>(
        &self,
        x: Exchange<T>,
        at: &dyn Fn(usize, usize) -> usize,
        p: usize,
        recv: &mut [T],
        func: &'static str,
    ) -> Result<()> {
        let (hosts, per) = (self.at.len(), self.at[0].len());
        let (_, mine) = x.finish();
        let len = |q: usize| at(q, p + 1) - at(q, p);
        let local_counts: Vec<usize> = (0..per).map(|lp| (0..hosts).map(|h| len(self.at[h][lp])).sum()).collect();
        let mut all = vec![T::default(); local_counts.iter().sum()];
        gather(&self.local, &mine, &mut all, &local_counts, func)?;
        let mut from = 0;
        for lp in 0..per {
            for h in 0..hosts {
                let q = self.at[h][lp];
                recv[at(q, p)..at(q, p + 1)].copy_from_slice(&all[from..from + len(q)]);
                from += len(q);
            }
        }
        Ok(())
    }

    /// Waits for a piece's exchange across the hosts and reduces its blocks, in host order, into
    /// `out` (this rank's part of the piece; `len(q)`: member q's part of it).
    fn close<T: Reducible>(&self, x: Exchange<T>, len: &dyn Fn(usize) -> usize, out: &mut [T], op: ReduceOp) {
        let (part, blocks) = x.finish();
        let mine = out.len();
        let at_host: Vec<usize> = displs(&(0..self.at.len()).map(|h| len(self.at[h][self.l])).collect::<Vec<_>>());
        let terms: Vec<&[T]> = (0..self.at.len())
            .map(|h| if h == self.h { &part[at_host[h]..at_host[h] + mine] } else { &blocks[h * mine..(h + 1) * mine] })
            .collect();
        if mine > 0 {
            reduce_into(self.simd, op, &terms, out);
        }
    }

    /// `recv` = every member's `send` (of `counts`, by communicator rank) in rank order —
    /// across the hosts, then within the host.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    pub(crate) fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        const FUNC: &str = "nx_collectives::mpi::all_gather_v";
        let (hosts, per) = (self.at.len(), self.at[0].len());
        byte_counts::<T>([recv.len()], FUNC)?;
        let off = displs(counts);
        // in pieces, the within-host gather of one overlapping the across-host one of the next
        let pieces = (std::mem::size_of_val(recv) / (PIECE * per * hosts)).clamp(1, MAX_PIECES);
        // piece p of block q: from `cut(q, p)` within the block
        let cut = |q: usize, p: usize| counts[q] * p / pieces;
        let len = |q: usize, p: usize| cut(q, p + 1) - cut(q, p);
        let at = |q: usize, p: usize| off[q] + cut(q, p);
        let me = self.at[self.h][self.l];
        let within = |x: Exchange<T>, p: usize, recv: &mut [T]| self.gather_within(x, &at, p, recv, FUNC);
        let mut inflight: Option<(Exchange<T>, usize)> = None;
        for p in 0..pieces {
            // across the hosts: this local rank's piece p of every host's block
            let cross_counts: Vec<usize> = (0..hosts).map(|h| len(self.at[h][self.l], p)).collect();
            let piece = send[cut(me, p)..cut(me, p + 1)].to_vec();
            let x = Exchange::gather(&self.cross, piece, &cross_counts)?;
            if let Some((prev, pp)) = inflight.replace((x, p)) {
                within(prev, pp, recv)?;
            }
        }
        match inflight {
            Some((last, p)) => within(last, p, recv),
            None => Ok(()),
        }
    }
}

/// Bytes of input a rank sends in one piece of a pipelined reduce-scatter (at least one piece,
/// at most [`MAX_PIECES`]).
const PIECE: usize = 2 << 20;
/// The most pieces a reduce-scatter is cut into.
const MAX_PIECES: usize = 16;

/// An `MPI_Ialltoallv` of blocks (each member's block of `send` to that member, this rank's own
/// kept out) or an `MPI_Iallgatherv` in flight, owning its buffers (their memory does not move
/// while it runs; dropping it waits for it).
struct Exchange<T> {
    req: mpi::ffi::MPI_Request,
    done: bool,
    send: Vec<T>,
    recv: Vec<T>,
    /// Send and receive counts and displacements, in bytes (read by MPI until the end).
    counts: [Vec<Count>; 4],
}

impl<T: Reducible> Exchange<T> {
    /// Starts sending block j of `send` (`counts[j]` elements) to member j and receiving `mine`
    /// elements from every other member, into block j of the receive buffer.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    fn start(comm: &SimpleCommunicator, send: Vec<T>, counts: &[usize], mine: usize) -> Result<Exchange<T>> {
        use mpi::raw::AsRaw as _;
        const FUNC: &str = "nx_collectives::mpi::reduce_scatter";
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        let own = |q: usize, c: usize| if q == me { 0 } else { c };
        let sc = byte_counts::<T>(counts.iter().enumerate().map(|(q, &c)| own(q, c)), FUNC)?;
        let sd = displs(&byte_counts::<T>(counts.iter().copied(), FUNC)?);
        let rc = byte_counts::<T>((0..n).map(|q| own(q, mine)), FUNC)?;
        let rd = displs(&byte_counts::<T>(std::iter::repeat_n(mine, n), FUNC)?);
        let mut x = Exchange {
            // SAFETY: a plain handle, written by MPI_Ialltoallv below before any use.
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            done: false,
            send,
            recv: vec![T::default(); mine * n],
            counts: [sc, sd, rc, rd],
        };
        let [sc, sd, rc, rd] = &x.counts;
        // SAFETY: the buffers and counts are owned by `x`, whose heap memory stays put until the
        // request completes (`finish` or `drop` waits for it); the counts stay within the
        // buffers (blocks of `counts` in `send`, `mine` a member in `recv`); bytes of plain data.
        let rc = unsafe {
            mpi::ffi::MPI_Ialltoallv(
                x.send.as_ptr().cast(),
                sc.as_ptr(),
                sd.as_ptr(),
                mpi::ffi::RSMPI_UINT8_T,
                x.recv.as_mut_ptr().cast(),
                rc.as_ptr(),
                rd.as_ptr(),
                mpi::ffi::RSMPI_UINT8_T,
                comm.as_raw(),
                &mut x.req,
            )
        };
        x.started(rc, FUNC)
    }

    /// Starts gathering every member's `send` (`counts[j]` elements from member j) into one
    /// buffer, in member order.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    fn gather(comm: &SimpleCommunicator, send: Vec<T>, counts: &[usize]) -> Result<Exchange<T>> {
        use mpi::raw::AsRaw as _;
        const FUNC: &str = "nx_collectives::mpi::all_gather_v";
        let sc = byte_counts::<T>([send.len()], FUNC)?;
        let rc = byte_counts::<T>(counts.iter().copied(), FUNC)?;
        let rd = displs(&rc);
        let mut x = Exchange {
            // SAFETY: a plain handle, written by MPI_Iallgatherv below before any use.
            req: unsafe { mpi::ffi::RSMPI_REQUEST_NULL },
            done: false,
            send,
            recv: vec![T::default(); counts.iter().sum()],
            counts: [sc, Vec::new(), rc, rd],
        };
        let [sc, _, rc, rd] = &x.counts;
        // SAFETY: as in `start`: owned buffers and counts that stay put until the request
        // completes; the counts stay within the buffers.
        let rc = unsafe {
            mpi::ffi::MPI_Iallgatherv(
                x.send.as_ptr().cast(),
                sc[0],
                mpi::ffi::RSMPI_UINT8_T,
                x.recv.as_mut_ptr().cast(),
                rc.as_ptr(),
                rd.as_ptr(),
                mpi::ffi::RSMPI_UINT8_T,
                comm.as_raw(),
                &mut x.req,
            )
        };
        x.started(rc, FUNC)
    }

    /// `self` where MPI started it (`rc`), else an error naming `func` (nothing in flight).
    fn started(mut self, rc: std::os::raw::c_int, func: &'static str) -> Result<Exchange<T>> {
        if rc == mpi::ffi::MPI_SUCCESS as std::os::raw::c_int {
            return Ok(self);
        }
        self.done = true;
        Err(Error::Invalid { func, why: format!("MPI refused to start the exchange (error {rc})") })
    }

    /// Waits for the exchange; answers the send buffer and what arrived (block j from member j).
    fn finish(mut self) -> (Vec<T>, Vec<T>) {
        self.wait();
        (std::mem::take(&mut self.send), std::mem::take(&mut self.recv))
    }

    fn wait(&mut self) {
        if !self.done {
            // SAFETY: a request started by `start` and not yet waited for.
            unsafe { mpi::ffi::MPI_Wait(&mut self.req, mpi::ffi::RSMPI_STATUS_IGNORE) };
            self.done = true;
        }
    }
}

impl<T> Drop for Exchange<T> {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: as `wait`: the buffers are freed only after the request completes.
            unsafe { mpi::ffi::MPI_Wait(&mut self.req, mpi::ffi::RSMPI_STATUS_IGNORE) };
        }
    }
}

/// Block r of every member's `send` (blocks of `counts`) reduced on member r in rank order into
/// `out` (`counts[r]` elements).
fn exchange_reduce<T: Reducible>(
    simd: Simd,
    comm: &SimpleCommunicator,
    send: &[T],
    counts: &[usize],
    out: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    const FUNC: &str = "nx_collectives::mpi::reduce_scatter";
    let (n, me, mine) = (comm.size() as usize, comm.rank() as usize, out.len());
    let own = |q: usize, c: usize| if q == me { 0 } else { c };
    let sc = byte_counts::<T>(counts.iter().enumerate().map(|(q, &c)| own(q, c)), FUNC)?;
    let rc = byte_counts::<T>((0..n).map(|q| own(q, mine)), FUNC)?;
    let sd = displs(&byte_counts::<T>(counts.iter().copied(), FUNC)?);
    let rd = displs(&byte_counts::<T>(std::iter::repeat_n(mine, n), FUNC)?);
    let mut blocks = vec![T::default(); mine * n];
    {
        let part = Partition::new(bytes(send), &sc[..], &sd[..]);
        let mut rpart = PartitionMut::new(bytes_mut(&mut blocks), &rc[..], &rd[..]);
        comm.all_to_all_varcount_into(&part, &mut rpart);
    }
    if mine > 0 {
        let lo: usize = counts[..me].iter().sum();
        let terms: Vec<&[T]> =
            (0..n).map(|q| if q == me { &send[lo..lo + mine] } else { &blocks[q * mine..(q + 1) * mine] }).collect();
        reduce_into(simd, op, &terms, out);
    }
    Ok(())
}

/// Every member's `send` (`counts` by rank) into `recv`, in rank order.
fn gather<T: Reducible>(
    comm: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
    counts: &[usize],
    func: &'static str,
) -> Result<()> {
    let c = byte_counts::<T>(counts.iter().copied(), func)?;
    let d = displs(&c);
    let mut part = PartitionMut::new(bytes_mut(recv), &c[..], &d[..]);
    comm.all_gather_varcount_into(bytes(send), &mut part);
    Ok(())
}

pub(crate) fn bytes<T: Copy>(s: &[T]) -> &[u8] {
    // SAFETY: nx's elements are plain data without padding; any initialised memory reads as bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

pub(crate) fn bytes_mut<T: Reducible>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as `bytes`; peers write values of the same dtype (checked by fingerprints), so
    // every element written is one of `T`'s values (a bool 0 or 1).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The byte counts of runs of `counts` elements of `T`, in MPI's count type; their sum fits it too
/// (so that their displacements do).
pub(crate) fn byte_counts<T>(counts: impl IntoIterator<Item = usize>, func: &'static str) -> Result<Vec<Count>> {
    let mut total: Count = 0;
    counts
        .into_iter()
        .map(|c| {
            let n = c.checked_mul(size_of::<T>()).and_then(|n| Count::try_from(n).ok());
            let sum = n.and_then(|n| total.checked_add(n));
            match (n, sum) {
                (Some(n), Some(sum)) => {
                    total = sum;
                    Ok(n)
                }
                _ => Err(Error::Invalid {
                    func,
                    why: format!(
                        "{c} elements of {} bytes (with the runs before) exceed MPI's count range",
                        size_of::<T>()
                    ),
                }),
            }
        })
        .collect()
}
