//! Collectives through memory that the ranks of one host share: the MPI backend's same-host path
//! (its segments come from an MPI-3 shared window), written against plain addresses so that threads
//! can stand in for processes in its tests.
//!
//! Every rank of the host owns one segment: a control page (its world rank, a slot for a number it
//! publishes, and one counter per peer: how many syncs it has begun with that peer) and two data
//! halves of [`HALF`] bytes. One set of segments ([`Node`]) serves every communicator of the
//! process; a communicator's view ([`Shm`]) names its members among them. A collective runs in
//! rounds; round `k` uses half `k mod 2`: each rank copies its share of the round into its own
//! half, the ranks meet at a *sync* (each raises its counter for every peer of the group, then
//! waits until every peer's counter for it has come as far), and each rank reads what it needs
//! straight from its peers' halves. A half is written again two rounds later, after a sync that
//! every rank reaches only once it has finished reading it, so one sync a round suffices
//! (all-reduce takes two: one before the reduction, one before the gather of its results); a last
//! sync ends each call, so that the next call, on any communicator, finds every half free.
//! Pairwise counters keep the syncs of different communicators apart: two ranks meet in the same
//! order on every communicator they share, as MPI asks of its own collectives. A waiting rank
//! spins, then yields its CPU (to a rank with work, where ranks share CPUs), and after 100 ms
//! sleeps on the counter it waits for (a Linux futex on the shared word); a rank raising a counter
//! wakes a peer that sleeps.
//!
//! Where the kernel lets every rank read every peer's memory (Linux cross-memory attach,
//! `process_vm_readv`/`_writev`: same user, ptrace allowed; probed once when the segments are
//! made, and agreed by all) and the MPI backend does not forbid it (`NX_MPI_CMA=0`), data skips
//! the halves: each rank publishes its buffers' addresses in its control page, the ranks sync (an
//! all-to-all or all-gather starts on each peer as soon as that one has arrived), and each moves
//! its share by one kernel copy straight between the user buffers — all-to-all reads each peer's
//! block; all-gather writes each rank's block into every output a piece at a time (two ranks
//! within the caches read instead); reduce-scatter reads its block's terms a chunk at a time and
//! reduces them; all-reduce does the same for its slice and writes each reduced chunk into every
//! member's output (every byte read once and written once, the memory-traffic floor). Below
//! 4 MiB a chunk is reduced straight into the rank's own output, where the writes to the peers
//! find it in the caches; from 4 MiB into a scratch chunk stored with streaming stores. A closing
//! sync keeps the buffers alive until the peers are done.
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

use crate::checks::offsets;
use crate::reduce::reduce_into;
use crate::{Error, ReduceOp, Reducible, Result};

/// Bytes of a segment's control pages.
pub(crate) const CTRL: usize = 8192;
/// Bytes of one data half of a segment.
pub(crate) const HALF: usize = 1 << 20;
/// Bytes of a rank's whole segment.
pub(crate) const SEGMENT: usize = CTRL + 2 * HALF;

/// Byte offsets inside the control pages: the world rank, process id and the segment's address in
/// its owner's process (mappings differ between processes), the number slot, the
/// published addresses (each on its own cache line), the counters (one `u64` per rank of the
/// host), and on the second page the published offsets (one `u64` per member).
const AT_WORLD: usize = 0;
const AT_PID: usize = 8;
const AT_SELF: usize = 16;
const AT_SLOT: usize = 64;
const AT_ADDR: usize = 128;
/// Non-zero while the owner sleeps in a sync (its peers then wake it after raising its counter).
const AT_SLEEP: usize = 192;
const AT_COUNTERS: usize = 256;
const AT_OFFSETS: usize = 4096;
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

/// `struct iovec` of `<sys/uio.h>`.
#[repr(C)]
struct IoVec {
    base: *mut std::ffi::c_void,
    len: usize,
}

unsafe extern "C" {
    /// Linux's cross-memory attach (glibc): copies from another process's memory into this one's.
    fn process_vm_readv(
        pid: i32,
        local: *const IoVec,
        local_count: std::ffi::c_ulong,
        remote: *const IoVec,
        remote_count: std::ffi::c_ulong,
        flags: std::ffi::c_ulong,
    ) -> isize;
    /// The same, from this process's memory into another's.
    fn process_vm_writev(
        pid: i32,
        local: *const IoVec,
        local_count: std::ffi::c_ulong,
        remote: *const IoVec,
        remote_count: std::ffi::c_ulong,
        flags: std::ffi::c_ulong,
    ) -> isize;
}

/// Copies `len` bytes at `remote` in process `pid` to `local`, by the kernel (one copy).
///
/// # Errors
/// The OS error, where the kernel refuses (no permission to read the process) or the range is not
/// mapped there.
///
/// # Safety
/// `local` points at `len` writable bytes that nothing else touches meanwhile.
unsafe fn read_process(pid: i32, remote: usize, local: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cross(pid, remote, local, len, false) }
}

/// Copies `len` bytes at `local` to `remote` in process `pid`, by the kernel (one copy).
///
/// # Errors
/// As [`read_process`].
///
/// # Safety
/// `local` points at `len` readable bytes; the peer has published `remote` for this process to
/// write, and reads it only after the next sync.
unsafe fn write_process(pid: i32, remote: usize, local: *const u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cross(pid, remote, local.cast_mut(), len, true) }
}

/// `process_vm_readv` (or `_writev` where `write`) until every byte has moved.
///
/// # Safety
/// As [`read_process`] / [`write_process`].
unsafe fn cross(pid: i32, remote: usize, local: *mut u8, len: usize, write: bool) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let step = len - done;
        let l = IoVec { base: local.wrapping_add(done).cast(), len: step };
        let r = IoVec { base: (remote + done) as *mut std::ffi::c_void, len: step };
        // SAFETY: one valid iovec each; the kernel touches only `local`'s range (the caller's
        // contract) and checks the remote range itself.
        let n = unsafe {
            if write {
                process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read no bytes"));
        }
        done += n as usize;
    }
    Ok(())
}

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
            let ok = unsafe { read_process(pid, theirs + AT_WORLD, (&mut got as *mut u64).cast(), 8) };
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

impl Shm {
    /// The view of a communicator whose members are the host ranks `members` (in communicator
    /// rank order; this process among them).
    ///
    /// # Panics
    /// Where this process is not a member (a caller's bug).
    pub(crate) fn new(node: Rc<Node>, members: Vec<usize>, timeout: Duration) -> Shm {
        let rank = members.iter().position(|&m| m == node.me).expect("this process is a member");
        Shm { node, members, rank, timeout }
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

    /// Member `q`'s published address `i` (0 or 1).
    fn addr(&self, q: usize, i: usize) -> &AtomicU64 {
        // SAFETY: a u64 inside a live, 64-byte aligned control page; accessed atomically.
        unsafe { &*((self.node.bases[self.members[q]] + AT_ADDR + 8 * i) as *const AtomicU64) }
    }

    /// Member `q`'s published offset `i` (i < MAX_RANKS).
    fn offset(&self, q: usize, i: usize) -> &AtomicU64 {
        // SAFETY: as `addr`, on the second control page.
        unsafe { &*((self.node.bases[self.members[q]] + AT_OFFSETS + 8 * i) as *const AtomicU64) }
    }

    /// Copies `dst.len()` elements at address `at` in member `q`'s process into `dst`.
    ///
    /// # Errors
    /// [`Error::PeerGone`] where the kernel refuses (the peer has left, say).
    fn read<T: Copy>(&self, call: &str, q: usize, at: usize, dst: &mut [T]) -> Result<()> {
        let (node, p) = (&*self.node, self.members[q]);
        // SAFETY: `dst` is this rank's own, exclusively borrowed.
        unsafe { read_process(node.pids[p], at, dst.as_mut_ptr().cast(), size_of_val(dst)) }.map_err(|e| {
            Error::PeerGone {
                rank: node.world[node.me],
                call: call.to_string(),
                peer: node.world[p],
                why: format!("cannot be read by cross-memory attach: {e}"),
            }
        })
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

    /// Every rank has arrived.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    pub(crate) fn barrier(&self) -> Result<()> {
        self.sync("barrier")
    }

    /// Rank `root`'s `buf` into every rank's `buf` (lengths agreed).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::PeerGone`] where a peer cannot be read.
    pub(crate) fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
        if !self.node.direct {
            return self.broadcast_halves(buf, root);
        }
        const CALL: &str = "broadcast";
        self.publish([buf.as_ptr() as usize, 0]);
        self.sync(CALL)?;
        if self.rank != root {
            self.read(CALL, root, self.peer_addr(root, 0), buf)?;
        }
        self.sync(CALL)
    }

    /// Every rank's `send` (rank `q`'s of `counts[q]` elements) into `recv`, in rank order
    /// (lengths agreed and checked).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::PeerGone`] where a peer cannot be read.
    pub(crate) fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        if !self.node.direct {
            return self.all_gather_v_halves(send, recv, counts);
        }
        const CALL: &str = "all_gather";
        let (me, offs, s) = (self.rank, offsets(counts), size_of::<T>());
        let stream = size_of_val(recv) >= STREAM_MIN;
        if !stream && self.size() == 2 {
            // two ranks within the caches: one read of the peer's block, one kernel call
            self.publish([send.as_ptr() as usize, 0]);
            self.arrive();
            // SAFETY: the checked counts put this rank's block inside `recv`.
            unsafe { put(send, recv[offs[me]..].as_mut_ptr(), false) };
            for q in self.others() {
                self.wait_for(CALL, &[q])?;
                self.read(CALL, q, self.peer_addr(q, 0), &mut recv[offs[q]..offs[q] + counts[q]])?;
            }
            return self.sync(CALL);
        }
        self.publish([0, recv.as_ptr() as usize]);
        // each peer is written as soon as it has arrived, not once all have
        self.arrive();
        let others: Vec<usize> = self.others().collect();
        let mut waited = false;
        // each rank writes its block into every member's output a piece at a time, so that the
        // piece is read from memory once and then from this core's cache: every byte read once and
        // written once (reading each peer's block reads every block n − 1 times, and one's own
        // once more for one's own output; 64 MiB over 4 ranks measured 0.47 → 0.74 of the floor,
        // 1 MiB 0.72 → 1.02 of plain MPI's speed)
        let (at, out) = (offs[me], recv.as_mut_ptr());
        for (k, piece) in send.chunks(PUSH_CHUNK.div_ceil(s)).enumerate() {
            let lo = at + k * PUSH_CHUNK.div_ceil(s);
            // SAFETY: the checked counts put this rank's block inside `recv`.
            unsafe { put(piece, out.add(lo), stream) };
            for &q in &others {
                if !waited {
                    self.wait_for(CALL, &[q])?;
                }
                self.write(CALL, q, self.peer_addr(q, 1) + lo * s, piece)?;
            }
            waited = true;
        }
        if !waited {
            // an empty block: the peers are still met
            self.wait_for(CALL, &others)?;
        }
        self.sync(CALL)
    }

    /// Block `me` of every rank's `send` (blocks of `counts`), reduced in rank order into `recv`.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::PeerGone`] where a peer cannot be read.
    pub(crate) fn reduce_scatter_v<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        if !self.node.direct {
            return self.reduce_scatter_v_halves(send, recv, counts, op);
        }
        const CALL: &str = "reduce_scatter";
        let offs = offsets(counts);
        self.publish([send.as_ptr() as usize, 0]);
        self.sync(CALL)?;
        let stream = size_of_val(recv) >= STREAM_MIN;
        self.reduce_direct(CALL, send, offs[self.rank], (recv, stream), op, |_, _| Ok(()))?;
        self.sync(CALL)
    }

    /// Every rank's `send` reduced in rank order into every rank's `recv`: each rank reduces its
    /// block of the elements, reading the peers' `send`, and writes each reduced chunk into its
    /// own `recv` and every peer's (each byte read once and written once).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::PeerGone`] where a peer cannot be read.
    pub(crate) fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if !self.node.direct {
            return self.all_reduce_halves(send, recv, op);
        }
        const CALL: &str = "all_reduce";
        let (n, me, len) = (self.size(), self.rank, send.len());
        let counts: Vec<usize> = (0..n).map(|j| (j + 1) * len / n - j * len / n).collect();
        let offs = offsets(&counts);
        self.publish([send.as_ptr() as usize, recv.as_ptr() as usize]);
        self.sync(CALL)?;
        let (s, stream) = (size_of::<T>(), size_of_val(recv) >= STREAM_MIN);
        let own = &mut recv[offs[me]..offs[me] + counts[me]];
        self.reduce_direct(CALL, send, offs[me], (own, stream), op, |lo, block| {
            for q in self.others() {
                self.write(CALL, q, self.peer_addr(q, 1) + (offs[me] + lo) * s, block)?;
            }
            Ok(())
        })?;
        self.sync(CALL)
    }

    /// Rank `q`'s block `me` of `send` (blocks of `send_counts`) into block `q` of `recv` (blocks
    /// of `recv_counts`), for every `q`; each rank publishes where its blocks start.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::PeerGone`] where a peer cannot be read.
    pub(crate) fn all_to_all_v<T: Reducible>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        if !self.node.direct {
            return self.all_to_all_v_halves(send, send_counts, recv, recv_counts);
        }
        const CALL: &str = "all_to_all";
        let (me, s) = (self.rank, size_of::<T>());
        let (soffs, roffs) = (offsets(send_counts), offsets(recv_counts));
        for (d, &o) in soffs.iter().enumerate() {
            self.offset(me, d).store(o as u64, Ordering::Relaxed);
        }
        self.publish([send.as_ptr() as usize, 0]);
        // each peer is read as soon as it has arrived, not once all have
        self.arrive();
        let own = &send[soffs[me]..soffs[me] + send_counts[me]];
        // SAFETY: the checked counts put both blocks inside their buffers.
        unsafe { put(own, recv[roffs[me]..].as_mut_ptr(), size_of_val(recv) >= STREAM_MIN) };
        for q in self.others() {
            self.wait_for(CALL, &[q])?;
            let at = self.peer_addr(q, 0) + self.offset(q, me).load(Ordering::Relaxed) as usize * s;
            self.read(CALL, q, at, &mut recv[roffs[q]..roffs[q] + recv_counts[q]])?;
        }
        self.sync(CALL)
    }

    /// The members other than this rank, from the next one round: at each step every rank
    /// reads (or writes) a different peer, rather than all the same one.
    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (1..self.size()).map(move |k| (self.rank + k) % self.size())
    }

    /// Publishes this rank's two buffer addresses for the call (read by the peers after the next
    /// sync, rewritten only after the call's closing one).
    fn publish(&self, a: [usize; 2]) {
        self.addr(self.rank, 0).store(a[0] as u64, Ordering::Relaxed);
        self.addr(self.rank, 1).store(a[1] as u64, Ordering::Relaxed);
    }

    /// Member `q`'s published address `i`.
    fn peer_addr(&self, q: usize, i: usize) -> usize {
        self.addr(q, i).load(Ordering::Relaxed) as usize
    }

    /// Elements `at..at + out.len()` of every member's published `send` (this rank's own read
    /// in place), reduced in rank order into `out` a chunk at a time; after each chunk,
    /// `then(offset in out, reduced chunk)`. Without `stream` the chunks are reduced straight
    /// into `out` (where `then` finds them in the caches); with it, into a scratch chunk stored
    /// into `out` with streaming stores.
    ///
    /// # Errors
    /// [`Error::PeerGone`] where a peer cannot be read; `then`'s errors.
    fn reduce_direct<T: Reducible>(
        &self,
        call: &str,
        send: &[T],
        at: usize,
        (out, stream): (&mut [T], bool),
        op: ReduceOp,
        mut then: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<()> {
        let (n, me, s, len) = (self.size(), self.rank, size_of::<T>(), out.len());
        let chunk = REDUCE_CHUNK.min(len).max(1);
        // the peers' terms (n - 1 chunks), and a chunk to reduce into where storing streams
        let mut scratch = vec![T::default(); chunk * (n - 1 + usize::from(stream))];
        let (peers, block) = scratch.split_at_mut(chunk * (n - 1));
        for lo in (0..len).step_by(chunk) {
            let m = chunk.min(len - lo);
            let mut bufs = peers.chunks_mut(chunk);
            let mut terms: Vec<&[T]> = Vec::with_capacity(n);
            for q in 0..n {
                if q == me {
                    terms.push(&send[at + lo..at + lo + m]);
                } else {
                    let buf = &mut bufs.next().expect("a chunk for each peer")[..m];
                    self.read(call, q, self.peer_addr(q, 0) + (at + lo) * s, buf)?;
                    terms.push(buf);
                }
            }
            let dst = &mut out[lo..lo + m];
            if stream {
                let done = reduce_into(op, &terms, &mut block[..m]);
                debug_assert!(done, "the op was checked for the dtype");
                // SAFETY: `dst` holds m elements, this rank's own.
                unsafe { put(&block[..m], dst.as_mut_ptr(), true) };
                then(lo, &block[..m])?;
            } else {
                let done = reduce_into(op, &terms, dst);
                debug_assert!(done, "the op was checked for the dtype");
                then(lo, dst)?;
            }
        }
        Ok(())
    }

    /// Copies `src` to address `at` in member `q`'s process.
    ///
    /// # Errors
    /// [`Error::PeerGone`] where the kernel refuses.
    fn write<T: Copy>(&self, call: &str, q: usize, at: usize, src: &[T]) -> Result<()> {
        let (node, p) = (&*self.node, self.members[q]);
        // SAFETY: `src` is readable; the peer published `at` for this call and reads it only
        // after the next sync.
        unsafe { write_process(node.pids[p], at, src.as_ptr().cast(), size_of_val(src)) }.map_err(|e| Error::PeerGone {
            rank: node.world[node.me],
            call: call.to_string(),
            peer: node.world[p],
            why: format!("cannot be written by cross-memory attach: {e}"),
        })
    }

    /// Rank `root`'s `buf` into every rank's `buf`, through the halves.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn broadcast_halves<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let per = HALF / size_of::<T>();
        let stream = size_of_val(buf) >= STREAM_MIN;
        for k in 0..buf.len().div_ceil(per) {
            let h = k % 2;
            let (lo, hi) = piece(buf.len(), k, per);
            if self.rank == root {
                // SAFETY: this rank's own half holds `per` elements; peers read it only after the sync.
                unsafe { put(&buf[lo..hi], self.half(root, h), false) };
            }
            self.sync("broadcast")?;
            if self.rank != root {
                // SAFETY: the root wrote hi - lo elements there before the sync and rewrites the
                // half only two rounds on; `buf` is this rank's own.
                unsafe {
                    put(std::slice::from_raw_parts(self.half::<T>(root, h), hi - lo), buf[lo..].as_mut_ptr(), stream)
                };
            }
        }
        self.end(buf.is_empty(), "broadcast")
    }

    /// [`Shm::all_gather_v`] through the halves.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn all_gather_v_halves<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        let (me, per) = (self.rank, HALF / size_of::<T>());
        let offs = offsets(counts);
        let stream = size_of_val(recv) >= STREAM_MIN;
        // SAFETY: the checked counts put this rank's block inside `recv`.
        unsafe { put(send, recv[offs[me]..].as_mut_ptr(), stream) };
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0);
        for k in 0..rounds {
            let h = k % 2;
            let (lo, hi) = piece(send.len(), k, per);
            // SAFETY: this rank's own half, read by peers only after the sync.
            unsafe { put(&send[lo..hi], self.half(me, h), false) };
            self.sync("all_gather")?;
            for q in (0..self.size()).filter(|&q| q != me) {
                let (lo, hi) = piece(counts[q], k, per);
                // SAFETY: rank q wrote hi - lo elements to its half before the sync; the block
                // lies inside `recv` by the checked counts.
                unsafe {
                    put(
                        std::slice::from_raw_parts(self.half::<T>(q, h), hi - lo),
                        recv[offs[q] + lo..].as_mut_ptr(),
                        stream,
                    )
                };
            }
        }
        self.end(rounds == 0, "all_gather")
    }

    /// [`Shm::reduce_scatter_v`] through the halves.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn reduce_scatter_v_halves<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let (n, me) = (self.size(), self.rank);
        let per = HALF / size_of::<T>() / n;
        let offs = offsets(counts);
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0);
        for k in 0..rounds {
            let h = k % 2;
            self.publish_blocks(send, &offs, counts, k, per, h);
            self.sync("reduce_scatter")?;
            let (lo, hi) = piece(counts[me], k, per);
            self.reduce_piece(op, h, hi - lo, &mut recv[lo..hi]);
        }
        self.end(rounds == 0, "reduce_scatter")
    }

    /// [`Shm::all_reduce`] through the halves: a reduce-scatter into place and an all-gather of
    /// its blocks, round by round.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn all_reduce_halves<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let (n, me, len) = (self.size(), self.rank, send.len());
        let per = HALF / size_of::<T>() / n;
        let counts: Vec<usize> = (0..n).map(|j| (j + 1) * len / n - j * len / n).collect();
        let offs = offsets(&counts);
        let stream = size_of_val(recv) >= STREAM_MIN;
        let rounds = counts.iter().map(|c| c.div_ceil(per)).max().unwrap_or(0);
        for k in 0..rounds {
            let h = k % 2;
            self.publish_blocks(send, &offs, &counts, k, per, h);
            self.sync("all_reduce")?;
            let (lo, hi) = piece(counts[me], k, per);
            let mine = &mut recv[offs[me] + lo..offs[me] + hi];
            self.reduce_piece(op, h, hi - lo, mine);
            // SAFETY: slot `me` of this rank's own half is read by no peer in this round's
            // reduction (each reads its own slot), and by every peer after the next sync.
            unsafe { put(mine, self.half::<T>(me, h).add(me * per), false) };
            self.sync("all_reduce")?;
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
        self.end(rounds == 0, "all_reduce")
    }

    /// [`Shm::all_to_all_v`] through the halves. The ranks agree on the number of rounds through
    /// the control pages, so no rank needs the others' counts.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn all_to_all_v_halves<T: Reducible>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
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
            self.sync("all_to_all")?;
            if k == 0 {
                rounds = (0..n).map(|q| self.slot(q).load(Ordering::Relaxed) as usize).max().unwrap_or(0).max(1);
            }
            for q in (0..n).filter(|&q| q != me) {
                let (lo, hi) = piece(recv_counts[q], k, per);
                // SAFETY: rank q wrote piece k of its block for this rank to slot `me` of its half
                // before the sync (its send count is this rank's receive count, checked in
                // checked mode and by contract otherwise, and never more than `per`).
                unsafe {
                    let src = std::slice::from_raw_parts(self.half::<T>(q, h).add(me * per), hi - lo);
                    put(src, recv[roffs[q] + lo..].as_mut_ptr(), stream);
                }
            }
            k += 1;
        }
        self.end(false, "all_to_all")
    }

    /// Ends a call: orders its streaming stores, and (unless it moved nothing through the halves)
    /// meets the peers once more, so that every half is free for the next call.
    ///
    /// # Errors
    /// [`Error::Timeout`].
    fn end(&self, idle: bool, call: &str) -> Result<()> {
        nx_kernels::host::store_fence();
        if idle {
            Ok(())
        } else {
            self.sync(call)
        }
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
        // SAFETY: each rank wrote `len` elements to slot `me` of its half before the sync, and
        // rewrites the half only two rounds on.
        let terms: Vec<&[T]> = (0..self.size())
            .map(|q| unsafe {
                std::slice::from_raw_parts(self.half::<T>(q, h).add(me * per_of::<T>(self.size())), len)
            })
            .collect();
        let done = reduce_into(op, &terms, out);
        debug_assert!(done, "the op was checked for the dtype");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim;
    use crate::Communicator;

    /// Segments for `n` ranks in one heap allocation (world ranks from `world0`): their bases.
    fn segments(n: usize, world0: usize) -> (std::sync::Arc<Vec<u64>>, Vec<usize>) {
        let mut mem = vec![0u64; SEGMENT / 8 * n + 8];
        let base = (mem.as_mut_ptr() as usize).next_multiple_of(64);
        let bases: Vec<usize> = (0..n).map(|q| base + q * SEGMENT).collect();
        for (q, &b) in bases.iter().enumerate() {
            // SAFETY: inside `mem`, 64-byte aligned, not yet shared.
            unsafe { Node::prepare(b as *mut u8, world0 + q) };
        }
        (std::sync::Arc::new(mem), bases)
    }

    /// A node over `bases` for host rank `me`, keeping `mem` alive; `direct`: data by
    /// cross-memory attach (here the process reads itself), else through the halves.
    fn node(mem: &std::sync::Arc<Vec<u64>>, bases: &[usize], me: usize, direct: bool) -> Rc<Node> {
        // SAFETY: `mem` holds the prepared segments and is kept by the node.
        let mut node = unsafe { Node::new(bases.to_vec(), me, Box::new(mem.clone())) };
        if direct {
            assert!(node.can_read_peers(), "a process may read itself");
            node.go_direct();
        }
        Rc::new(node)
    }

    /// Runs `body` on `n` threads standing for the ranks of one host, each with its node, for
    /// both ways of moving data.
    fn run<R: Send>(n: usize, body: impl Fn(Rc<Node>) -> R + Sync) -> Vec<R> {
        let halves = run_with(n, false, &body);
        let direct = run_with(n, true, &body);
        halves.into_iter().chain(direct).collect()
    }

    fn run_with<R: Send>(n: usize, direct: bool, body: &(impl Fn(Rc<Node>) -> R + Sync)) -> Vec<R> {
        let (mem, bases) = segments(n, 100);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (mem, bases) = (&mem, &bases);
                    s.spawn(move || body(node(mem, bases, r, direct)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
        })
    }

    /// The whole host as one communicator.
    fn world(node: Rc<Node>) -> Shm {
        let n = node.bases.len();
        Shm::new(node, (0..n).collect(), Duration::from_secs(20))
    }

    fn values(r: usize, len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7 + r * 13) % 97) as f32 * 0.37 - 11.0 + r as f32 * 1e-3).collect()
    }

    #[test]
    fn matches_sim_bit_for_bit() {
        // lengths around the round size (f32: HALF/4 = 262,144 elements a half)
        for n in [1, 2, 3, 4] {
            for len in [0, 1, 5, 262_143, 262_145, 600_001] {
                let counts: Vec<usize> = (0..n).map(|j| len / n + usize::from(j < len % n)).collect();
                let ours = run(n, |node| {
                    let s = world(node);
                    let send = values(s.rank, len);
                    let mut ar = vec![0f32; len];
                    s.all_reduce(&send, &mut ar, ReduceOp::Sum).unwrap();
                    let mut rs = vec![0f32; counts[s.rank]];
                    s.reduce_scatter_v(&send, &mut rs, &counts, ReduceOp::Sum).unwrap();
                    let mine = values(s.rank, counts[s.rank]);
                    let mut ag = vec![0f32; len];
                    s.all_gather_v(&mine, &mut ag, &counts).unwrap();
                    // rank r sends counts[q] to q, receives counts[r] from each
                    let sc = counts.clone();
                    let rc = vec![counts[s.rank]; n];
                    let total: usize = sc.iter().sum();
                    let mut out = vec![0f32; rc.iter().sum()];
                    s.all_to_all_v(&send[..total], &sc, &mut out, &rc).unwrap();
                    let mut b = if s.rank == 0 { values(9, len) } else { vec![0f32; len] };
                    s.broadcast(&mut b, 0).unwrap();
                    s.barrier().unwrap();
                    (ar, rs, ag, out, b)
                });
                let theirs = sim::run(n, crate::Options::default(), |c| {
                    let send = values(c.rank(), len);
                    let mut ar = vec![0f32; len];
                    c.all_reduce(&send, &mut ar, ReduceOp::Sum)?;
                    let mut rs = vec![0f32; counts[c.rank()]];
                    c.reduce_scatter_v(&send, &mut rs, &counts, ReduceOp::Sum)?;
                    let mine = values(c.rank(), counts[c.rank()]);
                    let mut ag = vec![0f32; len];
                    c.all_gather_v(&mine, &mut ag, &counts)?;
                    let sc = counts.clone();
                    let rc = vec![counts[c.rank()]; n];
                    let total: usize = sc.iter().sum();
                    let mut out = vec![0f32; rc.iter().sum()];
                    c.all_to_all_v(&send[..total], &sc, &mut out, &rc)?;
                    let mut b = if c.rank() == 0 { values(9, len) } else { vec![0f32; len] };
                    c.broadcast(&mut b, 0)?;
                    Ok::<_, Error>((ar, rs, ag, out, b))
                })
                .unwrap();
                for (r, (a, b)) in ours.iter().zip(theirs.iter().cycle()).enumerate() {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a.0), bits(&b.0), "all_reduce n={n} len={len} rank {r}");
                    assert_eq!(bits(&a.1), bits(&b.1), "reduce_scatter n={n} len={len} rank {r}");
                    assert_eq!(bits(&a.2), bits(&b.2), "all_gather n={n} len={len} rank {r}");
                    assert_eq!(bits(&a.3), bits(&b.3), "all_to_all n={n} len={len} rank {r}");
                    assert_eq!(bits(&a.4), bits(&b.4), "broadcast n={n} len={len} rank {r}");
                }
            }
        }
    }

    #[test]
    fn uneven_all_to_all_agrees_on_rounds() {
        // only rank 0 -> rank 1 carries more than one round; the others learn it from the slots
        let n = 3;
        let big = 3 * (HALF / 8 / n) + 5;
        let sends = |r: usize| -> Vec<usize> { (0..n).map(|d| if r == 0 && d == 1 { big } else { r + d }).collect() };
        let out = run(n, |node| {
            let s = world(node);
            let sc = sends(s.rank);
            let rc: Vec<usize> = (0..n).map(|q| sends(q)[s.rank]).collect();
            let send: Vec<f64> = (0..sc.iter().sum::<usize>()).map(|i| (s.rank * 1_000_000 + i) as f64).collect();
            let mut recv = vec![0f64; rc.iter().sum()];
            // twice, so that the slots alternate
            s.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap();
            s.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap();
            recv
        });
        for (k, recv) in out.iter().enumerate() {
            let r = k % n;
            let mut at = 0;
            for q in 0..n {
                let sc = sends(q);
                let start: usize = sc[..r].iter().sum();
                for i in 0..sc[r] {
                    assert_eq!(recv[at], (q * 1_000_000 + start + i) as f64, "rank {r} from {q} element {i}");
                    at += 1;
                }
            }
        }
    }

    #[test]
    fn communicators_over_subsets_share_the_segments() {
        // 4 host ranks: the whole host, the pairs {0,1} {2,3}, the pairs {0,2} {1,3}, interleaved;
        // sums in rank order, checked against a plain fold in that order
        let len = 3 * (HALF / 4) + 17;
        let sum = |ranks: &[usize]| -> Vec<f32> {
            let mut acc = values(ranks[0], len);
            for &r in &ranks[1..] {
                acc.iter_mut().zip(values(r, len)).for_each(|(a, x)| *a += x);
            }
            acc
        };
        let outs = run(4, |node| {
            let me = node.me;
            let all = Shm::new(node.clone(), vec![0, 1, 2, 3], Duration::from_secs(20));
            let near = Shm::new(node.clone(), if me < 2 { vec![0, 1] } else { vec![2, 3] }, Duration::from_secs(20));
            let far = Shm::new(node, if me % 2 == 0 { vec![0, 2] } else { vec![1, 3] }, Duration::from_secs(20));
            let send = values(me, len);
            let mut got = Vec::new();
            for s in [&near, &all, &far, &near, &far, &all] {
                let mut out = vec![0f32; len];
                s.all_reduce(&send, &mut out, ReduceOp::Sum).unwrap();
                got.push(out);
            }
            got
        });
        for (k, got) in outs.iter().enumerate() {
            let me = k % 4;
            let near: Vec<usize> = if me < 2 { vec![0, 1] } else { vec![2, 3] };
            let far: Vec<usize> = if me % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
            let want = [sum(&near), sum(&[0, 1, 2, 3]), sum(&far)];
            for (k, g) in got.iter().enumerate() {
                let w = &want[[0, 1, 2, 0, 2, 1][k]];
                assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {me} call {k}");
            }
        }
    }

    #[test]
    fn a_sleeping_rank_is_woken_when_its_peer_arrives() {
        // syncs sleep at once, for up to a minute a sleep: only a wake-up ends one early
        let (mem, bases) = segments(2, 0);
        let late = Duration::from_millis(300);
        let took = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let (mem, bases) = (&mem, &bases);
                    s.spawn(move || {
                        // SAFETY: as `node`'s.
                        let mut n = unsafe { Node::new(bases.to_vec(), r, Box::new(mem.clone())) };
                        n.waits = (Duration::ZERO, Duration::from_secs(60));
                        let s = Shm::new(Rc::new(n), vec![0, 1], Duration::from_secs(120));
                        let t = Instant::now();
                        for k in 0..3 {
                            if r == 1 {
                                std::thread::sleep(late);
                            }
                            s.barrier().unwrap_or_else(|e| panic!("barrier {k}: {e}"));
                        }
                        t.elapsed()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect::<Vec<_>>()
        });
        // rank 0 slept through three barriers of rank 1's lateness, woken each time
        assert!(took[0] >= 3 * late && took[0] < Duration::from_secs(30), "{took:?}");
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let (mem, bases) = segments(2, 40);
        // rank 1 never makes its view (it "skipped" the call)
        let s = Shm::new(node(&mem, &bases, 0, false), vec![0, 1], Duration::from_millis(200));
        let e = s.all_reduce(&[1f32; 10], &mut [0f32; 10], ReduceOp::Sum).unwrap_err();
        match e {
            Error::Timeout { rank, missing, ref call, .. } => {
                assert_eq!((rank, missing, call.as_str()), (40, vec![41], "all_reduce"));
            }
            other => panic!("expected a timeout, got {other}"),
        }
    }
}
