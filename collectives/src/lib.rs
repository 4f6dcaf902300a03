//! Collectives for nx: communicators that move bytes between ranks, and the executor that runs a
//! placement plan on each rank's window.
//!
//! [`Communicator`] is the contract every backend implements: rank, size, barrier, broadcast,
//! all-reduce, reduce-scatter, all-gather and all-to-all (each with variable counts), send/recv,
//! and `split` into a sub-communicator. Backends: [`sim`] (the ranks are threads of one process,
//! reading each other's buffers where they lie) and [`mpi`] (feature `mpi`: one rank per process
//! under `mpirun`). [`conformance::suite`] is the one conformance suite every backend runs.
//!
//! **Determinism.** All-reduce and reduce-scatter add the terms in rank order (term order), rank 0
//! first, in every backend and for every size: the same bits on every rank, every run. Halves add
//! in `f32` and round once.
//!
//! **Checked mode.** Before each collective the ranks of the group agree on a [`Fingerprint`]
//! (sequence number, op, dtype, counts, the mesh axes of the group — named by
//! [`Communicator::split_over`], as the plan executor does — and the call site); a mismatch is an
//! [`Error::Mismatch`] on every rank naming both sides, not a hang. A collective that waits past the timeout ends in
//! [`Error::Timeout`] naming the ranks that did not arrive. Lengths, counts and dtypes are checked
//! before any byte moves, checked mode or not.

use std::cell::Cell;
use std::fmt;
use std::panic::Location;
use std::time::Duration;

mod checks;
pub mod conformance;
mod groups;
pub mod log;
pub mod mismatch;
pub mod mpi;
#[cfg(feature = "mpi")]
mod mpi_tiers;
#[cfg(feature = "mpi")]
mod mpi_watch;
pub mod place;
pub mod place_all;
pub mod random;
mod reduce;
mod shm;
pub mod sim;

pub use groups::Groups;
pub use place::{place, place_in, Alloc, Heap};
pub use place_all::place_all_in;
pub use reduce::{ReduceOp, Reducible};

use nx_kernels::Dtype;

/// What a rank called: the op, its dtype and counts, where, and its number in the communicator's
/// sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// The collective's number on this communicator, from 0.
    pub seq: u64,
    /// The op (`all_reduce`, `all_gather`, …).
    pub op: &'static str,
    /// The element dtype (`None` for a barrier).
    pub dtype: Option<Dtype>,
    /// The counts the op was given (a length, or counts per rank).
    pub counts: Vec<usize>,
    /// The mesh axes the communicator's group spans (empty: not a mesh-axis group).
    pub axes: Vec<String>,
    /// The caller's source location.
    pub site: &'static Location<'static>,
}

impl fmt::Display for Fingerprint {
    /// `all_gather(f32, [4, 4]) at train.rs:42`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.site.file().rsplit(['/', '\\']).next().unwrap_or(self.site.file());
        match self.dtype {
            Some(d) => write!(f, "{}({d}, {:?})", self.op, self.counts)?,
            None => write!(f, "{}()", self.op)?,
        }
        if !self.axes.is_empty() {
            write!(f, " over mesh axes {}", self.axes.join(","))?;
        }
        write!(f, " at {file}:{}", self.site.line())
    }
}

impl Fingerprint {
    /// The next fingerprint of a communicator whose sequence counter is `seq` and whose group
    /// spans mesh axes `axes`, for a call of `op` from the caller's caller.
    #[track_caller]
    pub fn next(
        seq: &Cell<u64>,
        axes: &[String],
        op: &'static str,
        dtype: Option<Dtype>,
        counts: Vec<usize>,
    ) -> Fingerprint {
        let n = seq.get();
        seq.set(n + 1);
        Fingerprint { seq: n, op, dtype, counts, axes: axes.to_vec(), site: Location::caller() }
    }

    /// The fingerprint of a send or receive of `op` (`send`, `recv`) on a communicator whose
    /// collectives are numbered by `seq`: point-to-point calls involve two ranks only, so they do
    /// not advance the collectives' sequence (it stands at the next collective's number).
    #[track_caller]
    pub fn point_to_point(
        seq: &Cell<u64>,
        axes: &[String],
        op: &'static str,
        dtype: Option<Dtype>,
        counts: Vec<usize>,
    ) -> Fingerprint {
        Fingerprint { seq: seq.get(), op, dtype, counts, axes: axes.to_vec(), site: Location::caller() }
    }

    /// Whether two ranks' calls agree: in checked mode everything, otherwise the op, the dtype and
    /// the counts (what keeps bytes in bounds).
    pub fn agrees(&self, other: &Fingerprint, checked: bool) -> bool {
        let shape = self.op == other.op && self.dtype == other.dtype && self.counts == other.counts;
        if checked {
            shape && self.seq == other.seq && self.axes == other.axes && self.site == other.site
        } else {
            shape
        }
    }
}

/// Settings of a communicator, passed explicitly (no global switch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Agree on full fingerprints (sequence, op, dtype, counts, mesh axes, call site) before each
    /// collective; op, dtype and counts are always checked.
    pub checked: bool,
    /// How long a collective waits for its peers before failing.
    pub timeout: Duration,
    /// The highest SIMD level the reduction loops use (`None`: all the CPU has); every level
    /// gives the same bits.
    pub simd: Option<nx_kernels::Simd>,
}

impl Default for Options {
    /// Checked in debug builds and tests, five minutes' timeout, every SIMD level the CPU has.
    fn default() -> Self {
        Options { checked: cfg!(debug_assertions), timeout: Duration::from_secs(300), simd: None }
    }
}

/// The errors of collectives. Each message names the function and the offending values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Two ranks of a group called different collectives (or the same one differently).
    #[error("nx collective mismatch: rank {rank_a} called {call_a}; rank {rank_b} called {call_b}")]
    Mismatch {
        /// The first rank.
        rank_a: usize,
        /// Its call.
        call_a: String,
        /// The other rank.
        rank_b: usize,
        /// Its call.
        call_b: String,
    },
    /// A collective waited past the timeout.
    #[error("nx collective timeout: {call} on rank {rank} waited {waited_s:.1} s for ranks {missing:?}, which did not arrive")]
    Timeout {
        /// This rank.
        rank: usize,
        /// What it called.
        call: String,
        /// Seconds waited.
        waited_s: f64,
        /// The world ranks that did not arrive.
        missing: Vec<usize>,
    },
    /// Another rank failed or exited while this one waited for it.
    #[error("nx collective: {call} on rank {rank} cannot finish: rank {peer} {why}")]
    PeerGone {
        /// This rank.
        rank: usize,
        /// What it called.
        call: String,
        /// The rank that failed or left.
        peer: usize,
        /// What happened to it.
        why: String,
    },
    /// Arguments that do not fit (lengths, counts, a root or peer out of range).
    #[error("{func}: {why}")]
    Invalid {
        /// The function called.
        func: &'static str,
        /// What does not fit, with the values.
        why: String,
    },
    /// A rank's body failed; the root cause of a run.
    #[error("rank {rank} failed: {why}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its error or panic message.
        why: String,
    },
    /// A fault injected on purpose (a simulated world's [`sim::Fault`]).
    #[error("nx fault injection: rank {rank} {what} at its collective {at}, {call}")]
    Injected {
        /// The rank.
        rank: usize,
        /// Which of its collectives, from 0.
        at: usize,
        /// The call.
        call: String,
        /// What it did (`failed`, `stalled`).
        what: &'static str,
    },
    /// A placement error.
    #[error(transparent)]
    Placement(#[from] nx_placement::Error),
    /// A local-array error.
    #[error(transparent)]
    Kernels(#[from] nx_kernels::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The collectives contract. All ranks of a communicator call its collectives in the same order;
/// each call checks lengths and counts before any byte moves.
///
/// Methods are `#[track_caller]`: the call site goes into the fingerprint.
pub trait Communicator: Sized {
    /// This rank's number in the communicator.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// The backend's name (`sim`, `mpi`).
    fn backend(&self) -> &'static str;
    /// This rank's number in the world (for messages).
    fn world_rank(&self) -> usize;

    /// Where this communicator records the calls it issues ([`log`]), shared with the
    /// communicators split from it; `None` for a backend that records nothing.
    fn recorder(&self) -> Option<&log::Recorder> {
        None
    }

    /// Records in the log ([`Communicator::recorder`]), as this communicator's own call of `op`
    /// would, a call that a dry run leaves out: `dtype` elements moving `bytes` (sent, received)
    /// by the log's accounting. Moves nothing and meets no peer.
    fn note_skipped(&self, op: log::Op, reduce: Option<ReduceOp>, dtype: nx_kernels::Dtype, bytes: (u64, u64));

    /// The host of each member, by rank (equal numbers share a host; default: one host).
    /// Reductions over members on several hosts associate per host: each host's terms in rank
    /// order, rounded to the dtype, then the host results in the order of their lowest members
    /// — on one host, or one member a host, plain rank order.
    fn hosts(&self) -> Vec<usize> {
        vec![0; self.size()]
    }

    /// Waits until every rank arrives.
    ///
    /// # Errors
    /// [`Error::Mismatch`], [`Error::Timeout`], [`Error::PeerGone`].
    #[track_caller]
    fn barrier(&self) -> Result<()>;

    /// Copies `root`'s `buf` into every rank's `buf` (all of one length).
    ///
    /// # Errors
    /// As [`Communicator::barrier`]; [`Error::Invalid`] for a root past the size.
    #[track_caller]
    fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()>;

    /// `recv` = the reduction by `op` of every rank's `send`, in rank order (term order), on every
    /// rank.
    ///
    /// # Errors
    /// As [`Communicator::barrier`]; [`Error::Invalid`] where `send` and `recv` differ in length.
    #[track_caller]
    fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()>;

    /// Rank r's `recv` (of `counts[r]` elements) = the reduction in rank order of block r of every
    /// rank's `send` (the blocks of `counts`, in order).
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`]; [`Error::Invalid`] where the lengths do not fit `counts`.
    #[track_caller]
    fn reduce_scatter_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize], op: ReduceOp) -> Result<()>;

    /// Every rank's `recv` = the ranks' `send`s in rank order, rank r's of `counts[r]` elements.
    ///
    /// # Errors
    /// As [`Communicator::barrier`]; [`Error::Invalid`] where the lengths do not fit `counts`.
    #[track_caller]
    fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()>;

    /// Each rank sends block j of `send` (of `send_counts[j]` elements) to rank j, which receives
    /// it as block i of its `recv` (of its `recv_counts[i]` elements), i the sender.
    ///
    /// # Errors
    /// As [`Communicator::barrier`]; [`Error::Mismatch`] where a sender's count and its
    /// receiver's disagree; [`Error::Invalid`] where lengths do not fit the counts.
    #[track_caller]
    fn all_to_all_v<T: Reducible>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()>;

    /// Sends `buf` to rank `to`, which receives it with [`Communicator::recv`] (synchronous).
    ///
    /// # Errors
    /// [`Error::Mismatch`] for a receiver expecting another dtype or length; as
    /// [`Communicator::barrier`].
    #[track_caller]
    fn send<T: Reducible>(&self, buf: &[T], to: usize) -> Result<()>;

    /// Receives into `buf` what rank `from` sends.
    ///
    /// # Errors
    /// As [`Communicator::send`].
    #[track_caller]
    fn recv<T: Reducible>(&self, buf: &mut [T], from: usize) -> Result<()>;

    /// The sub-communicator of the ranks that give the same `color`, numbered by `key` (ties by
    /// rank); `None` for a rank giving no color. Collective over this communicator. The
    /// sub-communicator's group spans the mesh axes `axes` (named in its fingerprints, so that
    /// two ranks that meet over different axes are a mismatch in checked mode; empty: none).
    ///
    /// # Errors
    /// As [`Communicator::barrier`].
    #[track_caller]
    fn split_over(&self, color: Option<usize>, key: usize, axes: &[String]) -> Result<Option<Self>>;

    /// [`Communicator::split_over`] naming no mesh axes.
    ///
    /// # Errors
    /// As [`Communicator::barrier`].
    #[track_caller]
    fn split(&self, color: Option<usize>, key: usize) -> Result<Option<Self>> {
        self.split_over(color, key, &[])
    }

    /// [`Communicator::all_gather_v`] with equal counts.
    ///
    /// # Errors
    /// As [`Communicator::all_gather_v`].
    #[track_caller]
    fn all_gather<T: Reducible>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let counts = vec![send.len(); self.size()];
        self.all_gather_v(send, recv, &counts)
    }

    /// [`Communicator::reduce_scatter_v`] with equal counts.
    ///
    /// # Errors
    /// As [`Communicator::reduce_scatter_v`].
    #[track_caller]
    fn reduce_scatter<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let counts = vec![recv.len(); self.size()];
        self.reduce_scatter_v(send, recv, &counts, op)
    }

    /// [`Communicator::all_to_all_v`] with equal counts.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all_v`].
    #[track_caller]
    fn all_to_all<T: Reducible>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let c = vec![send.len() / self.size().max(1); self.size()];
        self.all_to_all_v(send, &c, recv, &c)
    }
}
