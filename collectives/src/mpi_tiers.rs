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
//! shared-memory transport carries them); nx reduces them, in the documented order.

use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives as _;

use crate::checks::offsets as displs;
use crate::reduce::{by_host, reduce_into};
use crate::{Error, ReduceOp, Reducible, Result};
use mpi::Count;

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
    pub(crate) fn new(comm: &SimpleCommunicator, hosts: &[usize]) -> Option<Tiers> {
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
        Some(Tiers { local, cross, at, h, l })
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
        let (hosts, per) = (self.at.len(), self.at[0].len());
        let off = displs(counts);
        // the blocks regrouped by local rank, then host: local rank l' keeps every host's l'-th
        let mut regrouped = Vec::with_capacity(send.len());
        let mut local_counts = vec![0usize; per];
        for (lp, c) in local_counts.iter_mut().enumerate() {
            for h in 0..hosts {
                let q = self.at[h][lp];
                regrouped.extend_from_slice(&send[off[q]..off[q] + counts[q]]);
                *c += counts[q];
            }
        }
        let mut part = vec![T::default(); local_counts[self.l]];
        exchange_reduce(&self.local, &regrouped, &local_counts, &mut part, op)?;
        drop(regrouped);
        let cross_counts: Vec<usize> = (0..hosts).map(|h| counts[self.at[h][self.l]]).collect();
        exchange_reduce(&self.cross, &part, &cross_counts, recv, op)
    }

    /// `recv` = every member's `send` (of `counts`, by communicator rank) in rank order —
    /// across the hosts, then within the host.
    ///
    /// # Errors
    /// Where a count exceeds MPI's range.
    pub(crate) fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        const FUNC: &str = "nx_collectives::mpi::all_gather_v";
        let (hosts, per) = (self.at.len(), self.at[0].len());
        // across the hosts: this local rank's blocks of every host, in host order
        let cross_counts: Vec<usize> = (0..hosts).map(|h| counts[self.at[h][self.l]]).collect();
        let mut mine = vec![T::default(); cross_counts.iter().sum()];
        gather(&self.cross, send, &mut mine, &cross_counts, FUNC)?;
        // within the host: every local rank's, in local order
        let local_counts: Vec<usize> = (0..per).map(|lp| (0..hosts).map(|h| counts[self.at[h][lp]]).sum()).collect();
        let mut all = vec![T::default(); local_counts.iter().sum()];
        gather(&self.local, &mine, &mut all, &local_counts, FUNC)?;
        // into rank order
        let off = displs(counts);
        let mut at = 0;
        for lp in 0..per {
            for h in 0..hosts {
                let q = self.at[h][lp];
                recv[off[q]..off[q] + counts[q]].copy_from_slice(&all[at..at + counts[q]]);
                at += counts[q];
            }
        }
        Ok(())
    }
}

/// Block r of every member's `send` (blocks of `counts`) reduced on member r in rank order into
/// `out` (`counts[r]` elements).
fn exchange_reduce<T: Reducible>(
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
        reduce_into(op, &terms, out);
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

/// The byte counts of runs of `counts` elements of `T`, in MPI's count type.
pub(crate) fn byte_counts<T>(counts: impl IntoIterator<Item = usize>, func: &'static str) -> Result<Vec<Count>> {
    counts
        .into_iter()
        .map(|c| {
            let n = c * size_of::<T>();
            Count::try_from(n).map_err(|_| Error::Invalid { func, why: format!("{n} bytes exceed MPI's count range") })
        })
        .collect()
}
