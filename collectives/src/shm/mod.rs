//! Collectives through memory that the ranks of one host share: the MPI backend's same-host path
//! (its segments come from an MPI-3 shared window), written against plain addresses so that threads
//! can stand in for processes in its tests.
//!
//! Every rank of the host owns one segment: control pages (its world rank, a slot for a number it
//! publishes, one counter per peer — how many syncs it has begun with that peer —, and what it
//! announces of its current call: see [`call`]) and two data halves of [`HALF`] bytes. One set of
//! segments ([`Node`]) serves every communicator of the process; a communicator's view ([`Shm`])
//! names its members among them. The ranks meet at *syncs*: each raises its counter for every peer
//! of the group, then waits until every peer's counter for it has come as far. Pairwise counters
//! keep the syncs of different communicators apart: two ranks meet in the same order on every
//! communicator they share, as MPI asks of its own collectives. A waiting rank spins, then yields
//! its CPU (to a rank with work, where ranks share CPUs), and after 100 ms sleeps on the counter it
//! waits for (a Linux futex on the shared word); a rank raising a counter wakes a peer that sleeps.
//!
//! **Every call is checked, in checked mode or not.** A rank announces its call (op, dtype,
//! counts, its buffers' addresses and lengths) before its first sync; after it, before any byte
//! moves between two ranks, each checks the other's announcement, and every access to a peer's
//! buffer is checked against the length the peer announced for it. Ranks whose calls differ (in
//! op, dtype, counts or lengths) all end with the same [`Error::Mismatch`] after the call's second
//! sync, and no byte of a buffer moved that the call did not own. Every call has two syncs at
//! least, so the communicator stays usable after a refusal.
//!
//! Where the kernel lets every rank read every peer's memory (Linux cross-memory attach,
//! `process_vm_readv`/`_writev`: same user, ptrace allowed; probed once when the segments are
//! made, and agreed by all) and the MPI backend does not forbid it (`NX_MPI_CMA=0`), data skips
//! the halves ([`direct`]): each moves its share by one kernel copy straight between the user
//! buffers — all-to-all reads each peer's block; all-gather writes each rank's block into every
//! output a piece at a time (two ranks within the caches read instead); reduce-scatter reads its
//! block's terms a chunk at a time and reduces them; all-reduce does the same for its slice and
//! writes each reduced chunk into every member's output (every byte read once and written once,
//! the memory-traffic floor). Below 4 MiB a chunk is reduced straight into the rank's own output,
//! where the writes to the peers find it in the caches; from 4 MiB into a scratch chunk stored
//! with streaming stores. A closing sync keeps the buffers alive until the peers are done.
//!
//! Otherwise data moves through the halves ([`halves`]), in rounds: round `k` uses half
//! `k mod 2`; each rank copies its share of the round into its own half, the ranks sync, and each
//! reads what it needs straight from its peers' halves. A half is written again two rounds later,
//! after a sync that every rank reaches only once it has finished reading it, so one sync a round
//! suffices (all-reduce takes two: one before the reduction, one before the gather of its
//! results); a last sync ends each call, so that the next call, on any communicator, finds every
//! half free.
//!
//! Sums add in term order, rank 0 first, through the same reduction as every other backend: the
//! same bits as `sim` and as MPI's own path. A rank that does not reach a sync within the timeout
//! gets [`Error::Timeout`] naming the ranks that did not arrive (after which the views are spent:
//! the run is stopped).
//!
//! Data moved per call: each rank reads its input once and writes its output once in memory; the
//! halves stay in the caches between the copy in and the copies out.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Error, ReduceOp, Reducible, Result};

mod call;
mod cma;
mod direct;
mod halves;

use call::Call;
pub(crate) use call::CTRL;

/// Bytes of one data half of a segment.
pub(crate) const HALF: usize = 1 << 20;
/// Bytes of a rank's whole segment.
pub(crate) const SEGMENT: usize = CTRL + 2 * HALF;

/// Byte offsets inside the first control page: the world rank, process id and the segment's
/// address in its owner's process (mappings differ between processes), the number slot, the
/// sleeping flag and the counters (one `u64` per rank of the host); the call's announcement lies
/// between the slot and the flag and on the pages after ([`call`]).
const AT_WORLD: usize = 0;
const AT_PID: usize = 8;
const AT_SELF: usize = 16;
const AT_SLOT: usize = 64;
/// Non-zero while the owner sleeps in a sync (its peers then wake it after raising its counter).
const AT_SLEEP: usize = 192;
const AT_COUNTERS: usize = 256;
/// The most ranks one set of segments serves.
pub(crate) const MAX_RANKS: usize = (4096 - AT_COUNTERS) / 8;

/// Spins of a sync before it yields the CPU, where each rank has a CPU of its own.
const SPINS: u32 = 200;
/// How long a sync yields before it sleeps: a wake-up from a sleep costs tens of microseconds on
/// a virtual machine (sleeping after 50 µs slowed 1 MiB all-reduces by a quarter here, and with
/// more ranks than CPUs all-to-alls by about a tenth), while a yield lets any other runnable rank
/// have the CPU and otherwise returns at once. A rank that waits longer (on a peer still
/// computing, say) sleeps, and its peers wake it when they arrive.
const YIELD_FOR: Duration = Duration::from_millis(100);
/// The longest single sleep of a sync (it then checks its timeout and sleeps again).
const NAP: Duration = Duration::from_millis(50);

/// Sleeping and waking on a 32-bit word of shared memory: Linux futexes (not the process-private
/// kind: the segments are shared between processes), through glibc's `syscall`.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod futex {
    use std::sync::atomic::AtomicU64;

    #[cfg(target_arch = "x86_64")]
    const SYS_FUTEX: std::ffi::c_long = 202;
    #[cfg(target_arch = "aarch64")]
    const SYS_FUTEX: std::ffi::c_long = 98;
    const FUTEX_WAIT: std::ffi::c_long = 0;
    const FUTEX_WAKE: std::ffi::c_long = 1;

    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }

    unsafe extern "C" {
        fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
    }

    /// The low 32 bits of `w` (a futex word): they change whenever the counter does.
    fn low(w: &AtomicU64) -> *const u32 {
        let p = w.as_ptr().cast::<u32>();
        if cfg!(target_endian = "little") {
            p
        } else {
            p.wrapping_add(1)
        }
    }

    /// Sleeps while `w`'s low half is `seen`'s, for at most `nap` (or until woken; spurious
    /// returns are allowed — the caller checks again).
    pub(super) fn wait(w: &AtomicU64, seen: u64, nap: std::time::Duration) {
        let t = Timespec { sec: nap.as_secs() as i64, nsec: i64::from(nap.subsec_nanos()) };
        // SAFETY: a futex wait on a live, aligned word of shared memory, with a valid timeout;
        // the kernel only reads the word.
        unsafe { syscall(SYS_FUTEX, low(w), FUTEX_WAIT, seen as u32, &t as *const Timespec) };
    }

    /// Wakes every sleeper on `w`.
    pub(super) fn wake(w: &AtomicU64) {
        // SAFETY: a futex wake on a live, aligned word; it touches no memory.
        unsafe { syscall(SYS_FUTEX, low(w), FUTEX_WAKE, i32::MAX) };
    }
}

/// Elsewhere: sleeping is a yield.
#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
mod futex {
    use std::sync::atomic::AtomicU64;

    pub(super) fn wait(_: &AtomicU64, _: u64, _: std::time::Duration) {
        std::thread::yield_now()
    }

    pub(super) fn wake(_: &AtomicU64) {}
}

/// Bytes of its block a rank writes into every member's output at a time in an all-gather that
/// pushes (here and on `sim`): they stay in its cache from the first copy to the last.
pub(crate) const PUSH_CHUNK: usize = 256 << 10;

/// Elements a direct reduction reads from each peer at a time.
const REDUCE_CHUNK: usize = 32 << 10;

/// Copies into a caller's buffer of at least this many bytes stream their stores.
const STREAM_MIN: usize = 4 << 20;

/// The segments of the ranks of one host, as this process sees them: shared by every
/// communicator's view, and keeping the memory alive (`keep`: the MPI window, or a test's buffer).
pub(crate) struct Node {
    /// The address of every rank's segment, by rank on the host.
    bases: Vec<usize>,
    /// Every rank's world rank (for error messages).
    world: Vec<usize>,
    /// Every rank's process id.
    pids: Vec<i32>,
    /// Whether data moves by one kernel copy straight from the peers' buffers (cross-memory
    /// attach) rather than through the halves.
    direct: bool,
    /// This process's rank on the host.
    me: usize,
    /// Syncs begun with each peer.
    begun: Vec<Cell<u64>>,
    /// How long a sync yields after its spins before it sleeps, and its longest single sleep.
    waits: (Duration, Duration),
    /// Spins of a sync before it yields.
    spins: u32,
    /// What owns the memory.
    _keep: Box<dyn std::any::Any>,
}

impl Node {
    /// Prepares this rank's own control page: zeroes it and records `world_rank` there. Every rank
    /// calls it, then the ranks meet (an MPI barrier) before [`Node::new`].
    ///
    /// # Safety
    /// `base` points at a segment of [`SEGMENT`] bytes, 64-byte aligned, that no peer reads yet.
    pub(crate) unsafe fn prepare(base: *mut u8, world_rank: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            std::ptr::write_bytes(base, 0, CTRL);
            (base.add(AT_WORLD) as *mut u64).write(world_rank as u64);
            (base.add(AT_PID) as *mut u64).write(u64::from(std::process::id()));
            (base.add(AT_SELF) as *mut u64).write(base as u64);
        }
    }

    /// This process's view of the segments at `bases` (every host rank's, in rank order, each
    /// prepared), itself rank `me`; `keep` owns the memory. Data moves through the halves until
    /// [`Node::go_direct`].
    ///
    /// # Safety
    /// Each address is a [`SEGMENT`]-byte segment, 64-byte aligned, shared by the ranks, prepared
    /// by its rank before this call and alive as long as `keep`; at most [`MAX_RANKS`] of them;
    /// every rank makes one `Node` over them.
    pub(crate) unsafe fn new(bases: Vec<usize>, me: usize, keep: Box<dyn std::any::Any>) -> Node {
        assert!(bases.len() <= MAX_RANKS && me < bases.len(), "at most MAX_RANKS segments, `me` among them");
        // SAFETY: prepared pages hold the world rank and the pid.
        let word = |b: usize, at: usize| unsafe { ((b + at) as *const u64).read_volatile() };
        let world = bases.iter().map(|&b| word(b, AT_WORLD) as usize).collect();
        let pids = bases.iter().map(|&b| word(b, AT_PID) as i32).collect();
        let begun = bases.iter().map(|_| Cell::new(0)).collect();
        Node { bases, world, pids, direct: false, me, begun, waits: (YIELD_FOR, NAP), spins: SPINS, _keep: keep }
    }

    /// Whether this process may read every peer's memory by cross-memory attach (the kernel
    /// allows it to the same user where ptrace would be allowed): it reads each peer's world rank
    /// that way, at the address the peer's own process sees its segment at, and compares.
    pub(crate) fn can_read_peers(&self) -> bool {
        self.bases.iter().zip(&self.pids).zip(&self.world).all(|((&b, &pid), &w)| {
            // SAFETY: a prepared control page holds the owner's address of its segment.
            let theirs = unsafe { ((b + AT_SELF) as *const u64).read_volatile() } as usize;
            let mut got = u64::MAX;
            // SAFETY: `got` is 8 writable bytes of this frame.
            let ok = unsafe { cma::read_process(pid, theirs + AT_WORLD, (&mut got as *mut u64).cast(), 8) };
            ok.is_ok() && got == w as u64
        })
    }

    /// Moves data by cross-memory attach from now on; every rank decides alike (they agree first).
    pub(crate) fn go_direct(&mut self) {
        self.direct = true;
    }

    /// Whether data moves by cross-memory attach (else through the halves).
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// Has the syncs yield at once, without spinning: more ranks share this host than it has
    /// CPUs, so a peer waited for may need this CPU to arrive (1–4 MiB collectives over 4 ranks
    /// on 2 CPUs measured up to a fifth faster).
    pub(crate) fn shares_cpus(&mut self) {
        self.spins = 1;
    }

    /// Host rank `q`'s sleeping flag.
    fn sleeping(&self, q: usize) -> &AtomicU64 {
        // SAFETY: a u64 on its own line of a live, 64-byte aligned control page; accessed atomically.
        unsafe { &*((self.bases[q] + AT_SLEEP) as *const AtomicU64) }
    }

    /// Host rank `q`'s counter of syncs begun with host rank `p`.
    fn counter(&self, q: usize, p: usize) -> &AtomicU64 {
        // SAFETY: counters are u64s inside a 64-byte aligned, live control page (p < MAX_RANKS),
        // and every access to them is atomic.
        unsafe { &*((self.bases[q] + AT_COUNTERS + 8 * p) as *const AtomicU64) }
    }
}

/// One rank's view of the segments for the collectives of one communicator.
pub(crate) struct Shm {
    node: Rc<Node>,
    /// The members' ranks on the host, in communicator rank order.
    members: Vec<usize>,
    /// This rank in the communicator.
    rank: usize,
    timeout: Duration,
    /// The SIMD level of the reduction loops.
    simd: nx_kernels::Simd,
}

impl std::fmt::Debug for Shm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shm(rank {} of {})", self.rank, self.members.len())
    }
}

/// Elements `lo..hi` of a run of `count` that round `k` moves, `per` a round.
fn piece(count: usize, k: usize, per: usize) -> (usize, usize) {
    ((k * per).min(count), ((k + 1) * per).min(count))
}

/// Copies `src` to `dst`, streaming the stores where `stream`.
///
/// # Safety
/// `dst` points at `src.len()` valid, aligned elements that nothing else touches meanwhile.
unsafe fn put<T: Copy>(src: &[T], dst: *mut T, stream: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        if stream {
            nx_kernels::host::stream_copy(src, dst);
        } else {
            nx_kernels::host::copy(src, dst);
        }
    }
}

/// Elements of one slot of a half for a group of `n` ranks.
fn per_of<T>(n: usize) -> usize {
    HALF / size_of::<T>() / n
}

/// A call's announcement: its buffers as addresses and lengths.
fn bufs<T>(send: &[T], recv: &[T]) -> [call::Announced; 2] {
    [(send.as_ptr() as usize, send.len()), (recv.as_ptr() as usize, recv.len())]
}

impl Shm {
    /// The view of a communicator whose members are the host ranks `members` (in communicator
    /// rank order; this process among them).
    ///
    /// # Panics
    /// Where this process is not a member (a caller's bug).
    pub(crate) fn new(node: Rc<Node>, members: Vec<usize>, timeout: Duration, simd: nx_kernels::Simd) -> Shm {
        let rank = members.iter().position(|&m| m == node.me).expect("this process is a member");
        Shm { node, members, rank, timeout, simd }
    }

    /// The segments this view uses.
    pub(crate) fn node(&self) -> Rc<Node> {
        self.node.clone()
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    /// The start of member `q`'s half `h`, as elements of `T`.
    fn half<T>(&self, q: usize, h: usize) -> *mut T {
        (self.node.bases[self.members[q]] + CTRL + h * HALF) as *mut T
    }

    /// Member `q`'s number slot.
    fn slot(&self, q: usize) -> &AtomicU64 {
        // SAFETY: a u64 on its own line of a live, 64-byte aligned control page; accessed atomically.
        unsafe { &*((self.node.bases[self.members[q]] + AT_SLOT) as *const AtomicU64) }
    }

    /// Raises this rank's counter for every peer of the group, then waits until every peer's
    /// counter for this rank has come as far.
    ///
    /// # Errors
    /// [`Error::Timeout`] after the timeout, naming the ranks that did not arrive.
    fn sync(&self, call: &str) -> Result<()> {
        self.arrive();
        let all: Vec<usize> = self.others().collect();
        self.wait_for(call, &all)
    }

    /// The first half of a [`Shm::sync`]: raises this rank's counter for every peer of the group
    /// (waking those that sleep). The call must go on to wait for every peer with
    /// [`Shm::wait_for`] — all at once or one by one, as it needs them — before its next sync.
    fn arrive(&self) {
        let (node, me) = (&*self.node, self.node.me);
        nx_kernels::host::store_fence();
        let peers = || self.members.iter().copied().filter(move |&p| p != me);
        for p in peers() {
            let e = node.begun[p].get() + 1;
            node.begun[p].set(e);
            node.counter(me, p).store(e, Ordering::SeqCst);
        }
        // a peer that sleeps waits on the counter just raised: wake it (its flag is set before it
        // checks the counter a last time, and the counter stored before the flag is read here,
        // so one of the two sees the other)
        for p in peers() {
            if node.sleeping(p).load(Ordering::SeqCst) != 0 {
                futex::wake(node.counter(me, p));
            }
        }
    }

    /// The second half of a [`Shm::sync`] for the members `qs`: waits until each has arrived.
    ///
    /// # Errors
    /// [`Error::Timeout`] after the timeout, naming those of `qs` that did not arrive.
    fn wait_for(&self, call: &str, qs: &[usize]) -> Result<()> {
        let (node, me) = (&*self.node, self.node.me);
        let peers = || qs.iter().map(|&q| self.members[q]);
        let arrived = |p: usize| node.counter(p, me).load(Ordering::Acquire) >= node.begun[p].get();
        let mut spins = 0u32;
        let mut start = None;
        loop {
            if peers().all(arrived) {
                return Ok(());
            }
            spins += 1;
            if spins < node.spins {
                std::hint::spin_loop();
                continue;
            }
            let since = *start.get_or_insert_with(Instant::now);
            if since.elapsed() < node.waits.0 {
                std::thread::yield_now();
                continue;
            }
            if let Some(p) = peers().find(|&p| !arrived(p)) {
                let word = node.counter(p, me);
                let seen = word.load(Ordering::SeqCst);
                node.sleeping(me).store(1, Ordering::SeqCst);
                if word.load(Ordering::SeqCst) == seen && !arrived(p) {
                    futex::wait(word, seen, node.waits.1.min(self.timeout));
                }
                node.sleeping(me).store(0, Ordering::SeqCst);
            }
            if since.elapsed() >= self.timeout {
                return Err(Error::Timeout {
                    rank: node.world[me],
                    call: call.to_string(),
                    waited_s: since.elapsed().as_secs_f64(),
                    missing: peers().filter(|&p| !arrived(p)).map(|p| node.world[p]).collect(),
                });
            }
        }
    }

    /// The members other than this rank, from the next one round: at each step every rank
    /// reads (or writes) a different peer, rather than all the same one.
    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (1..self.size()).map(move |k| (self.rank + k) % self.size())
    }

    /// Ends a refused call: meets the peers once more (so that every announcement stays until
    /// all have read it, and the counters stay in step), then answers the refusal.
    ///
    /// # Errors
    /// `refusal`, or [`Error::Timeout`].
    fn refuse(&self, call: &str, refusal: Error) -> Result<()> {
        self.sync(call)?;
        Err(refusal)
    }

    /// Every rank has arrived (two syncs: the barrier's call is checked between them).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Mismatch`] where a peer called another collective.
    pub(crate) fn barrier(&self) -> Result<()> {
        const CALL: &str = "barrier";
        self.announce(&Call { op: CALL, dtype: None, counts: &[], pairs: None }, [(0, 0); 2]);
        self.sync(CALL)?;
        let verdict = self.verdict();
        self.sync(CALL)?;
        verdict
    }

    /// Rank `root`'s `buf` into every rank's `buf`.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Mismatch`] where the ranks' calls differ; [`Error::PeerGone`]
    /// where a peer cannot be read.
    pub(crate) fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let call = Call { op: "broadcast", dtype: Some(T::DTYPE), counts: &[buf.len(), root], pairs: None };
        self.announce(&call, bufs(buf, &[]));
        if self.node.direct {
            self.broadcast_direct(buf, root)
        } else {
            self.broadcast_halves(buf, root)
        }
    }

    /// Every rank's `send` (rank `q`'s of `counts[q]` elements) into `recv`, in rank order
    /// (lengths checked against `counts` on this rank).
    ///
    /// # Errors
    /// As [`Shm::broadcast`].
    pub(crate) fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        self.announce(&Call { op: "all_gather", dtype: Some(T::DTYPE), counts, pairs: None }, bufs(send, recv));
        if self.node.direct {
            self.all_gather_v_direct(send, recv, counts)
        } else {
            self.all_gather_v_halves(send, recv, counts)
        }
    }

    /// Block `me` of every rank's `send` (blocks of `counts`), reduced in rank order into `recv`
    /// (lengths checked against `counts` on this rank).
    ///
    /// # Errors
    /// As [`Shm::broadcast`].
    pub(crate) fn reduce_scatter_v<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call { op: op.fingerprint_name("reduce_scatter"), dtype: Some(T::DTYPE), counts, pairs: None };
        self.announce(&call, bufs(send, recv));
        if self.node.direct {
            self.reduce_scatter_v_direct(send, recv, counts, op)
        } else {
            self.reduce_scatter_v_halves(send, recv, counts, op)
        }
    }

    /// Every rank's `send` reduced in rank order into every rank's `recv` (of `send`'s length).
    ///
    /// # Errors
    /// As [`Shm::broadcast`].
    pub(crate) fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let call =
            Call { op: op.fingerprint_name("all_reduce"), dtype: Some(T::DTYPE), counts: &[send.len()], pairs: None };
        self.announce(&call, bufs(send, recv));
        if self.node.direct {
            self.all_reduce_direct(send, recv, op)
        } else {
            self.all_reduce_halves(send, recv, op)
        }
    }

    /// Rank `q`'s block `me` of `send` (blocks of `send_counts`) into block `q` of `recv` (blocks
    /// of `recv_counts`), for every `q` (lengths checked against the counts on this rank).
    ///
    /// # Errors
    /// As [`Shm::broadcast`]; [`Error::Mismatch`] also where a sender's count is not its
    /// receiver's.
    pub(crate) fn all_to_all_v<T: Reducible>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let n = [self.size()];
        let call =
            Call { op: "all_to_all", dtype: Some(T::DTYPE), counts: &n, pairs: Some((send_counts, recv_counts)) };
        self.announce(&call, bufs(send, recv));
        if self.node.direct {
            self.all_to_all_v_direct(send, send_counts, recv, recv_counts)
        } else {
            self.all_to_all_v_halves(send, send_counts, recv, recv_counts)
        }
    }
}

#[cfg(test)]
mod tests;
