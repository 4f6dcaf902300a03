//! The MPI backend (feature `mpi`): this process is one rank under `mpirun`.
//!
//! **Ranks on one host** (every rank of the world on this host, the usual single-node job): [`run`]
//! makes an MPI-3 shared window (`MPI_Comm_split_type` + `MPI_Win_allocate_shared`) and every
//! communicator, the world and each `split` of it, runs its collectives through it: the ranks meet
//! through counters in the window, and data moves by one kernel copy between the user buffers
//! (cross-memory attach, where the kernel lets every rank read every peer) or else through
//! double-buffered halves of the window. See the `shm` module's notes. `NX_MPI_SHM=0` (the same on
//! every rank) keeps every collective on MPI's own calls; `NX_MPI_CMA=0` keeps to the halves. The
//! window is freed when `run`'s body has returned on every rank; a failing run aborts without
//! waiting for it.
//!
//! **Ranks on several hosts** use MPI's calls. A communicator whose members lie on at least two
//! hosts, as many (at least two) on each, takes the hierarchical path (the `mpi_tiers` module:
//! within each host, then across); `NX_MPI_HIER=0` (the same on every rank) keeps the flat
//! exchange below. Both, and every other backend, reduce across hosts in one association: each
//! host's terms in rank order, rounded to the dtype, then the host results in host order
//! ([`crate::Communicator::hosts`]). A watchdog (`mpi_watch`) bounds the time each collective
//! spends inside MPI's calls after its fingerprints met (one deadline a collective, its data
//! included): a peer lost there is reported as a timeout naming the other hosts' ranks, and the
//! rank aborts, never hangs.
//!
//! **Otherwise** MPI moves bytes and nx reduces them. A reduce-scatter is an `MPI_Alltoallv` of the
//! blocks followed by a local sum in rank (term) order (per host first, across hosts), an all-reduce that reduce-scatter then an
//! `MPI_Allgatherv` of the chunks — the same bits as the simulated backend, for the same bytes as
//! MPI's ring (2·S·(n−1)/n a rank), never `MPI_Allreduce`'s unspecified order. (One
//! `MPI_Allgather` of the whole inputs and a local sum of all of them measured 1.2–4× slower on
//! one host, even for two ranks, where the bytes are the same.)
//!
//! Before each collective the ranks exchange fingerprints point to point, non-blocking, against a
//! deadline: a mismatch is an [`crate::Error::Mismatch`] on every rank naming both calls; a rank that
//! does not arrive within the timeout is named in an [`crate::Error::Timeout`]. [`run`] reports a
//! failing rank
//! and aborts the job (`MPI_Abort`), so that `mpirun` stops the others.
//!
//! Without the feature the same names are here and [`run`] answers [`crate::Error::Invalid`] saying so.

/// Settings of the MPI backend: the collectives' [`crate::Options`].
pub type MpiOptions = crate::Options;

/// Whether this process was started by `mpirun` (Open MPI's or a PMI launcher's variables).
pub fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"].iter().any(|v| std::env::var_os(v).is_some())
}

#[cfg(not(feature = "mpi"))]
/// Runs `body` on this process's rank (not built: the `mpi` feature is off).
///
/// # Errors
/// Always [`crate::Error::Invalid`]: this build of nx has no MPI backend.
pub fn run<R, E: std::fmt::Display>(
    _opts: MpiOptions,
    _body: impl FnOnce(MpiComm) -> std::result::Result<R, E>,
) -> crate::Result<R> {
    Err(crate::Error::Invalid {
        func: "nx_collectives::mpi::run",
        why: "this build of nx has no MPI backend: build with the `mpi` feature (needs libopenmpi-dev and libclang)"
            .into(),
    })
}

#[cfg(not(feature = "mpi"))]
/// A communicator over MPI ranks (not built: the `mpi` feature is off).
#[derive(Debug)]
pub enum MpiComm {}

#[cfg(feature = "mpi")]
pub use imp::{run, MpiComm};

#[cfg(feature = "mpi")]
mod imp {
    use std::cell::{Cell, RefCell};
    use std::fmt::Display;
    use std::panic::{AssertUnwindSafe, Location};
    use std::rc::Rc;
    use std::time::Instant;

    use nx_kernels::Simd;

    use mpi::datatype::{Partition, PartitionMut};
    use mpi::request::StaticScope;
    use mpi::topology::Communicator as _;
    use mpi::topology::{Color, SimpleCommunicator};
    use mpi::traits::{CommunicatorCollectives as _, Destination as _, Root as _, Source as _};

    use super::MpiOptions;
    use crate::checks;
    use crate::checks::offsets as displs;
    use crate::log::{traffic, Event, Op, Recorder};
    use crate::mpi_tiers as tiers;
    use crate::mpi_tiers::{byte_counts, bytes, bytes_mut};
    use crate::mpi_watch::{Guard, Watch};
    use crate::reduce::{by_host, reduce_grouped};
    use crate::shm::{Node, Shm, MAX_RANKS, SEGMENT};
    use crate::{Communicator, Error, Fingerprint, ReduceOp, Reducible, Result};
    use nx_kernels::Array;
    use nx_mesh::{Device, DeviceKind};

    const FP_TAG: i32 = 7700;
    const DATA_TAG: i32 = 7701;

    /// A communicator over MPI ranks.
    pub struct MpiComm {
        comm: SimpleCommunicator,
        world_rank: usize,
        /// Every member's world rank, by communicator rank (errors name world ranks).
        members: Rc<[usize]>,
        /// The host of every world rank (the lowest world rank on it), by world rank.
        hosts: Rc<[usize]>,
        /// The hierarchical path, where the members lie on several hosts, as many on each.
        tiers: Option<Rc<tiers::Tiers>>,
        /// The process's watch over MPI's blocking calls (shared with the splits).
        watch: Watch,
        seq: Cell<u64>,
        opts: MpiOptions,
        /// Reused message memory (8-byte aligned): a fresh large buffer would fault its pages in
        /// on every call, slower than the copy it serves. An nx array, so that from 4 MiB it lies
        /// on huge pages as the callers' arrays do (MPI's copies into it pin a page at a time:
        /// on small pages 16 MiB all-reduces ran a third slower than `MPI_Allreduce` on huge ones).
        scratch: RefCell<Option<Array<u64>>>,
        /// The shared-memory path: this communicator's view of the segments of the host's ranks
        /// (`None`: they are not all on one host, or shared memory is off).
        shm: Option<Shm>,
        /// The mesh axes the group spans (for fingerprints).
        axes: Vec<String>,
        /// Where this rank's calls are recorded (shared with the splits).
        recorder: Recorder,
    }

    /// An MPI-3 shared window (`MPI_Win_allocate_shared`) over the ranks of the world, which all
    /// live on this host; freed when the last communicator that uses it and `run` let go (on
    /// every rank at once: `run` holds it until its body has returned, on every rank).
    struct Window {
        win: mpi::ffi::MPI_Win,
        /// The node communicator the window was made over (kept alive with it).
        _node: SimpleCommunicator,
    }

    impl Drop for Window {
        fn drop(&mut self) {
            // SAFETY: `win` came from MPI_Win_allocate_shared and is freed once, by every rank at
            // the same point (the end of `run`'s successful body; a failed run aborts instead).
            unsafe { mpi::ffi::MPI_Win_free(&mut self.win) };
        }
    }

    /// The CPUs online on this host (`/sys/devices/system/cpu/online`, e.g. `0-1,4`), or what the
    /// standard library sees where that cannot be read.
    fn online_cpus() -> usize {
        let parsed = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|t| {
            t.trim()
                .split(',')
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => Some(b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1),
                    None => r.parse::<usize>().ok().map(|_| 1),
                })
                .sum::<Option<usize>>()
        });
        parsed.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The hierarchical path of `comm`, whose member of rank r is world rank r's of `hosts`
    /// (for the world; a split passes its members' hosts), unless `NX_MPI_HIER=0` (the same on
    /// every rank) or the layout is not regular ([`tiers::Tiers::new`]).
    fn hierarchical(comm: &SimpleCommunicator, hosts: &[usize], simd: Simd) -> Option<Rc<tiers::Tiers>> {
        if std::env::var("NX_MPI_HIER").is_ok_and(|v| v == "0") {
            return None;
        }
        tiers::Tiers::new(comm, hosts, simd).map(Rc::new)
    }

    /// The host of every rank of `world`, named by the lowest world rank on it (collective).
    fn host_of_each(world: &SimpleCommunicator) -> Rc<[usize]> {
        let node = world.split_shared(world.rank());
        let mut on_node = vec![0u64; node.size() as usize];
        node.all_gather_into(&(world.rank() as u64), &mut on_node[..]);
        let mine = on_node.iter().copied().min().unwrap_or(world.rank() as u64);
        let mut all = vec![0u64; world.size() as usize];
        world.all_gather_into(&mine, &mut all[..]);
        all.into_iter().map(|h| h as usize).collect()
    }

    /// Makes the shared segments of the world's ranks (collective over `world`), or `None` where
    /// they do not all share this host or MPI cannot make the window.
    fn make_node(world: &SimpleCommunicator) -> Option<Rc<Node>> {
        use mpi::raw::AsRaw as _;
        let node = world.split_shared(world.rank());
        let n = node.size() as usize;
        if n != world.size() as usize || !(2..=MAX_RANKS).contains(&n) {
            return None;
        }
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: a null handle, written by MPI_Win_allocate_shared.
        let mut win = unsafe { mpi::ffi::RSMPI_WIN_NULL };
        // SAFETY: FFI with valid out-pointers; collective over `node`, which every rank reaches
        // here (in `run`).
        let rc = unsafe {
            mpi::ffi::MPI_Win_allocate_shared(
                (SEGMENT + 64) as mpi::ffi::MPI_Aint,
                1,
                mpi::ffi::RSMPI_INFO_NULL,
                node.as_raw(),
                (&mut base as *mut *mut u8).cast(),
                &mut win,
            )
        };
        // every rank learns whether every rank got its segment
        let ok = i32::from(rc == mpi::ffi::MPI_SUCCESS as i32 && !base.is_null());
        let mut all = 0i32;
        node.all_reduce_into(&ok, &mut all, mpi::collective::SystemOperation::min());
        if all == 0 {
            if rc == mpi::ffi::MPI_SUCCESS as i32 {
                // SAFETY: made above and freed once, by every rank that made it (all did, or
                // none: the window is collective).
                unsafe { mpi::ffi::MPI_Win_free(&mut win) };
            }
            return None;
        }
        // segments start where MPI puts them (Open MPI: 8-byte aligned); each is used from its
        // first 64-byte boundary (the same place in every process: mappings are page-aligned)
        let align = |p: *mut u8| p.wrapping_add((p as usize).next_multiple_of(64) - p as usize);
        let mut bases = Vec::with_capacity(n);
        for q in 0..n as i32 {
            let (mut size, mut unit, mut ptr): (mpi::ffi::MPI_Aint, i32, *mut u8) = (0, 0, std::ptr::null_mut());
            // SAFETY: FFI with valid out-pointers on a live window.
            unsafe { mpi::ffi::MPI_Win_shared_query(win, q, &mut size, &mut unit, (&mut ptr as *mut *mut u8).cast()) };
            bases.push(align(ptr) as usize);
        }
        // SAFETY: this rank's own segment holds SEGMENT bytes from its first 64-byte boundary; no
        // peer reads it until after the barrier below.
        unsafe { Node::prepare(align(base), world.rank() as usize) };
        node.barrier();
        let me = node.rank() as usize;
        let comm = node.duplicate();
        let keep = Box::new(Window { win, _node: node });
        // SAFETY: every segment lives as long as the window, which the node keeps; each was
        // prepared before the barrier; at most MAX_RANKS (checked).
        let mut shared = unsafe { Node::new(bases, me, keep) };
        // one kernel copy straight from the peers' buffers where every rank may read every peer
        // (with more ranks than CPUs too: on buffers in huge pages, as nx's arrays are, it
        // measured ahead of the halves here); `NX_MPI_CMA=0` keeps to the halves
        let allowed = std::env::var("NX_MPI_CMA").as_deref() != Ok("0");
        if n > online_cpus() {
            shared.shares_cpus();
        }
        let (mine, mut all) = (i32::from(allowed && shared.can_read_peers()), 0i32);
        comm.all_reduce_into(&mine, &mut all, mpi::collective::SystemOperation::min());
        if all == 1 {
            shared.go_direct();
        }
        Some(Rc::new(shared))
    }

    impl std::fmt::Debug for MpiComm {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "MpiComm(rank {} of {}, world rank {})", self.rank(), self.size(), self.world_rank)
        }
    }

    /// Runs `body` on this process's rank with a communicator over the world, and returns what it
    /// returns. A body that fails or panics is reported on stderr (`nx: rank R failed: …`) and the
    /// job aborted, so that `mpirun` stops every rank and exits non-zero.
    ///
    /// # Errors
    /// [`Error::Invalid`] where MPI cannot be initialised (twice in one process, say).
    pub fn run<R, E: Display>(opts: MpiOptions, body: impl FnOnce(MpiComm) -> std::result::Result<R, E>) -> Result<R> {
        let universe = mpi::initialize().ok_or_else(|| Error::Invalid {
            func: "nx_collectives::mpi::run",
            why: "MPI is initialised already".into(),
        })?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let comm = world.duplicate();
        // the same setting on every rank (mpirun passes the environment on), or MPI_Comm_split_type
        // below would wait for the ranks that skip it
        let node = if std::env::var("NX_MPI_SHM").is_ok_and(|v| v == "0") { None } else { make_node(&comm) };
        let shm = node
            .as_ref()
            .map(|n| Shm::new(n.clone(), (0..comm.size() as usize).collect(), opts.timeout, Simd::capped(opts.simd)));
        let members: Rc<[usize]> = (0..comm.size() as usize).collect();
        let hosts = host_of_each(&comm);
        let tiers = hierarchical(&comm, &hosts, Simd::capped(opts.simd));
        let comm = MpiComm {
            comm,
            world_rank: rank,
            members,
            hosts,
            tiers,
            watch: Watch::new(),
            seq: Cell::new(0),
            opts,
            scratch: RefCell::new(None),
            shm,
            axes: Vec::new(),
            recorder: Recorder::new(),
        };
        let out = std::panic::catch_unwind(AssertUnwindSafe(|| body(comm)));
        let why = match out {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e.to_string(),
            Err(p) => format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
        };
        eprintln!("nx: rank {rank} failed: {why}");
        world.abort(1)
    }

    /// A fingerprint record: `seq`, then the shape key, the words and the extra counts, each on
    /// a line.
    fn record(fp: &Fingerprint, extra: &[usize]) -> Vec<u8> {
        let extra: Vec<String> = extra.iter().map(|x| x.to_string()).collect();
        format!("{}\n{}|{:?}|{:?}\n{fp}\n{}", fp.seq, fp.op, fp.dtype, fp.counts, extra.join(",")).into_bytes()
    }

    struct Record {
        seq: String,
        shape: String,
        words: String,
        extra: Vec<usize>,
    }

    fn parse(b: &[u8]) -> Record {
        let text = String::from_utf8_lossy(b);
        let mut lines = text.split('\n');
        let mut next = || lines.next().unwrap_or("").to_string();
        let (seq, shape, words, extra) = (next(), next(), next(), next());
        Record { seq, shape, words, extra: extra.split(',').filter_map(|x| x.parse().ok()).collect() }
    }

    impl MpiComm {
        #[track_caller]
        fn fingerprint(&self, op: &'static str, dtype: Option<nx_kernels::Dtype>, counts: Vec<usize>) -> Fingerprint {
            Fingerprint::next(&self.seq, &self.axes, op, dtype, counts)
        }

        /// Records a call of `op` moving `(sent, received)` bytes among `members` (world ranks;
        /// `None`: the group's), where a region is open.
        fn note(
            &self,
            op: Op,
            reduce: Option<ReduceOp>,
            dtype: Option<nx_kernels::Dtype>,
            bytes: (u64, u64),
            members: Option<Vec<usize>>,
        ) {
            self.recorder.note(|| Event {
                op,
                reduce,
                dtype,
                axes: self.axes.clone(),
                members: members.unwrap_or_else(|| self.members.to_vec()),
                bytes_sent: bytes.0,
                bytes_received: bytes.1,
                step: None,
            });
        }

        /// Sends this rank's record to each of `peers` and receives theirs, against the deadline.
        /// Answers the records by peer (this rank's own in its place).
        fn exchange(&self, fp: &Fingerprint, extra: &[usize], peers: &[usize]) -> Result<Vec<Option<Record>>> {
            const LEN: usize = 4096;
            let mut mine = record(fp, extra);
            mine.truncate(LEN - 16);
            let mut framed = (mine.len() as u64).to_le_bytes().to_vec();
            framed.extend(&mine);
            framed.resize(LEN, 0);
            // 'static buffers: on a timeout the requests are abandoned with them (the job ends).
            let send: &'static [u8] = Box::leak(framed.into_boxed_slice());
            let mut recvs: Vec<(usize, *mut [u8])> = Vec::new();
            let mut pending = Vec::new();
            let mut sends = Vec::new();
            for &j in peers {
                let buf: &'static mut [u8] = Box::leak(vec![0u8; LEN].into_boxed_slice());
                recvs.push((j, buf as *mut [u8]));
                let p = self.comm.process_at_rank(j as i32);
                sends.push(p.immediate_send_with_tag(StaticScope, send, FP_TAG));
                pending.push((j, p.immediate_receive_into_with_tag(StaticScope, buf, FP_TAG)));
            }
            let start = Instant::now();
            while !pending.is_empty() {
                let mut still = Vec::new();
                for (j, req) in pending {
                    match req.test() {
                        Ok(_) => {}
                        Err(req) => still.push((j, req)),
                    }
                }
                pending = still;
                if pending.is_empty() {
                    break;
                }
                if start.elapsed() >= self.opts.timeout {
                    // named by world rank (`j` is a rank of this communicator)
                    let missing: Vec<usize> = pending.iter().map(|(j, _)| self.members[*j]).collect();
                    pending.into_iter().for_each(|(_, r)| std::mem::forget(r));
                    sends.into_iter().for_each(std::mem::forget);
                    return Err(Error::Timeout {
                        rank: self.world_rank,
                        call: fp.to_string(),
                        waited_s: start.elapsed().as_secs_f64(),
                        missing,
                    });
                }
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            for s in sends {
                s.wait();
            }
            let mut out: Vec<Option<Record>> = (0..self.size()).map(|_| None).collect();
            for (j, raw) in recvs {
                // SAFETY: the receive into `raw` completed above; the box came from `Box::leak`.
                let b = unsafe { Box::from_raw(raw) };
                let len = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize;
                out[j] = Some(parse(&b[8..8 + len.min(LEN - 8)]));
            }
            // SAFETY: every send completed; the box came from `Box::leak`.
            drop(unsafe { Box::from_raw(send as *const [u8] as *mut [u8]) });
            Ok(out)
        }

        /// In checked mode, agrees on the fingerprint with every rank (or the `peers` of a
        /// send/recv) before any byte moves, against the deadline, and answers every rank's extra
        /// counts. Unchecked, answers `None` at once: the shared-memory path checks each call
        /// itself, and MPI's own calls are checked by [`MpiComm::agree_shape`].
        fn agree(&self, fp: &Fingerprint, extra: &[usize], peers: Option<&[usize]>) -> Result<Option<Vec<Vec<usize>>>> {
            if !self.opts.checked {
                return Ok(None);
            }
            self.agree_checked(fp, extra, peers).map(Some)
        }

        fn agree_checked(&self, fp: &Fingerprint, extra: &[usize], peers: Option<&[usize]>) -> Result<Vec<Vec<usize>>> {
            let me = self.rank();
            let everyone: Vec<usize> = (0..self.size()).filter(|&j| j != me).collect();
            let peers = peers.unwrap_or(&everyone);
            let mut recs = self.exchange(fp, extra, peers)?;
            recs[me] = Some(parse(&record(fp, extra)));
            let ids: Vec<usize> = (0..self.size()).filter(|j| recs[*j].is_some()).collect();
            let first = ids[0];
            let a = recs[first].as_ref().expect("present");
            for &j in &ids[1..] {
                let b = recs[j].as_ref().expect("present");
                let same = a.shape == b.shape && (!self.opts.checked || (a.seq == b.seq && a.words == b.words));
                if !same {
                    return Err(Error::Mismatch {
                        rank_a: self.members[first],
                        call_a: a.words.clone(),
                        rank_b: self.members[j],
                        call_b: b.words.clone(),
                    });
                }
            }
            Ok(recs.into_iter().map(|r| r.map(|r| r.extra).unwrap_or_default()).collect())
        }

        /// Before a collective over MPI's own calls in unchecked mode (checked mode agreed on the
        /// whole fingerprint already): one `MPI_Allreduce` (max) of the call's shape hash and its
        /// complement tells every rank at once whether every rank called the same op with the
        /// same dtype and counts — all ranks see the same maximum, which equals a rank's own hash
        /// and complement only where every hash is the same; then, for an all-to-all, one
        /// `MPI_Alltoall` of the counts and one `MPI_Allreduce` of a flag whether every sender's
        /// count is its receiver's. Where they differ, `MPI_Allgather`s of the calls name the
        /// first two ranks that differ, on every rank.
        ///
        /// # Errors
        /// [`Error::Mismatch`].
        fn agree_shape(&self, fp: &Fingerprint, pairs: Option<(&[usize], &[usize])>) -> Result<Guard<'_>> {
            use mpi::collective::SystemOperation;
            let watch = self.watched(fp, None);
            if self.opts.checked {
                return Ok(watch);
            }
            let shape = format!("{}|{:?}|{:?}", fp.op, fp.dtype, fp.counts);
            // FNV-1a: any hash does; a collision could only let two differing calls through to
            // MPI, which still refuses a message longer than its receive buffer
            let h =
                shape.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            // first the shape, whatever the op (so that ranks calling different ops meet in the
            // same MPI call), then an all-to-all's counts, once every rank is in an all-to-all
            let mine = [h, !h];
            let mut max = [0u64; 2];
            self.comm.all_reduce_into(&mine[..], &mut max[..], SystemOperation::max());
            let same = max == mine;
            if same {
                let Some((send, recv)) = pairs else { return Ok(watch) };
                let counts: Vec<u64> = send.iter().map(|&c| c as u64).collect();
                let mut theirs = vec![0u64; self.size()];
                self.comm.all_to_all_into(&counts[..], &mut theirs[..]);
                let bad = u64::from(theirs.iter().zip(recv).any(|(&t, &r)| t != r as u64));
                let mut any = 0u64;
                self.comm.all_reduce_into(&bad, &mut any, SystemOperation::max());
                if any == 0 {
                    return Ok(watch);
                }
            }
            // every rank is here, knowing alike: gather the calls (or an all-to-all's counts)
            const LEN: usize = 512;
            let mut text = fp.to_string().into_bytes();
            text.truncate(LEN);
            text.resize(LEN, 0);
            let mut all = vec![0u8; LEN * self.size()];
            self.comm.all_gather_into(&text[..], &mut all[..]);
            let call = |j: usize| {
                let t = &all[j * LEN..(j + 1) * LEN];
                String::from_utf8_lossy(&t[..t.iter().position(|&b| b == 0).unwrap_or(LEN)]).into_owned()
            };
            if !same {
                let mut hashes = vec![0u64; self.size()];
                self.comm.all_gather_into(&h, &mut hashes[..]);
                let j = (1..self.size()).find(|&j| hashes[j] != hashes[0]).unwrap_or(0);
                let (rank_a, rank_b) = (self.members[0], self.members[j]);
                return Err(Error::Mismatch { rank_a, call_a: call(0), rank_b, call_b: call(j) });
            }
            let (send, recv) = pairs.expect("only an all-to-all's counts differ where the shapes agree");
            let mine: Vec<u64> = send.iter().chain(recv).map(|&c| c as u64).collect();
            let mut every = vec![0u64; mine.len() * self.size()];
            self.comm.all_gather_into(&mine[..], &mut every[..]);
            let every: Vec<Vec<usize>> =
                every.chunks(mine.len()).map(|c| c.iter().map(|&x| x as usize).collect()).collect();
            checks::all_to_all_pairs(&every, |r| self.members[r]).map(|()| watch)
        }

        /// Arms the watch over MPI's calls for call `fp` (with `peer`, a send or receive); the
        /// report names the members on other hosts (else every other member), by world rank.
        fn watched(&self, fp: &Fingerprint, peer: Option<usize>) -> Guard<'_> {
            let me = self.world_rank;
            let others: Vec<usize> = match peer {
                Some(p) => vec![self.members[p]],
                None => {
                    let away: Vec<usize> =
                        self.members.iter().copied().filter(|&m| self.hosts[m] != self.hosts[me]).collect();
                    if away.is_empty() {
                        self.members.iter().copied().filter(|&m| m != me).collect()
                    } else {
                        away
                    }
                }
            };
            let what = format!(
                "nx: rank {me} failed: nx collective timeout: {fp} on rank {me} waited {{waited}} s for ranks {others:?} inside MPI's calls, which did not answer (a host or its link is gone)"
            );
            self.watch.arm(self.opts.timeout, what)
        }

        /// Runs `f` with `n` elements of `T` of this communicator's reused scratch memory (their
        /// values are whatever the last call left: every bit pattern is a value of nx's dtypes).
        ///
        /// # Errors
        /// [`Error::Kernels`] where the memory cannot be allocated; `f`'s errors.
        fn with_scratch<T: Reducible, R>(&self, n: usize, f: impl FnOnce(&mut [T]) -> Result<R>) -> Result<R> {
            let mut s = self.scratch.borrow_mut();
            let words = (n * std::mem::size_of::<T>()).div_ceil(8).max(1);
            if s.as_ref().is_none_or(|a| a.numel() < words) {
                let host = Device::new(DeviceKind::Cpu, 0, self.world_rank);
                *s = None; // the old memory goes first
                *s = Some(Array::<u64>::zeros(host, &[words])?);
            }
            let scratch = s.as_ref().expect("allocated above");
            scratch.with_slice_mut(|w| {
                // SAFETY: the array holds at least n·size_of::<T>() initialised bytes, 8-byte
                // aligned (every dtype's alignment divides 8); bools are only ever read after MPI
                // wrote valid bools there (dtypes agree by fingerprint) or after a reduction
                // stored one.
                let slice = unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<T>(), n) };
                f(slice)
            })?
        }

        /// Block r of every rank's `send` (blocks of `counts`) reduced on rank r in rank order
        /// into `out` (`counts[r]` elements): the peers' blocks arrive in `blocks` (`counts[r]`
        /// elements a rank; this rank's own slot stays unused — its block is read from `send`).
        fn exchange_and_reduce<T: Reducible>(
            &self,
            send: &[T],
            counts: &[usize],
            blocks: &mut [T],
            out: &mut [T],
            op: ReduceOp,
        ) -> Result<()> {
            const FUNC: &str = "nx_collectives::mpi::reduce_scatter";
            let (n, me, mine) = (self.size(), self.rank(), out.len());
            // nothing to or from this rank itself: its block is a term in place
            let own = |q: usize, c: usize| if q == me { 0 } else { c };
            let sc = byte_counts::<T>(counts.iter().enumerate().map(|(q, &c)| own(q, c)), FUNC)?;
            let rc = byte_counts::<T>((0..n).map(|q| own(q, mine)), FUNC)?;
            let sd = displs(&byte_counts::<T>(counts.iter().copied(), FUNC)?);
            let rd = displs(&byte_counts::<T>(std::iter::repeat_n(mine, n), FUNC)?);
            {
                let part = Partition::new(bytes(send), &sc[..], &sd[..]);
                let mut rpart = PartitionMut::new(bytes_mut(blocks), &rc[..], &rd[..]);
                self.comm.all_to_all_varcount_into(&part, &mut rpart);
            }
            if mine > 0 {
                let lo: usize = counts[..me].iter().sum();
                let blocks = &*blocks;
                let terms: Vec<&[T]> = (0..n)
                    .map(|q| if q == me { &send[lo..lo + mine] } else { &blocks[q * mine..(q + 1) * mine] })
                    .collect();
                reduce_grouped(Simd::capped(self.opts.simd), op, &terms, &by_host(self.hosts()), out);
            }
            Ok(())
        }
    }

    impl Communicator for MpiComm {
        fn hosts(&self) -> Vec<usize> {
            self.members.iter().map(|&m| self.hosts[m]).collect()
        }

        fn rank(&self) -> usize {
            self.comm.rank() as usize
        }

        fn size(&self) -> usize {
            self.comm.size() as usize
        }

        fn backend(&self) -> &'static str {
            "mpi"
        }

        fn world_rank(&self) -> usize {
            self.world_rank
        }

        fn recorder(&self) -> Option<&Recorder> {
            Some(&self.recorder)
        }

        fn note_skipped(&self, op: Op, reduce: Option<ReduceOp>, dtype: nx_kernels::Dtype, bytes: (u64, u64)) {
            self.note(op, reduce, Some(dtype), bytes, None);
        }

        #[track_caller]
        fn barrier(&self) -> Result<()> {
            let fp = self.fingerprint("barrier", None, Vec::new());
            self.note(Op::Barrier, None, None, (0, 0), None);
            // checked: every rank has sent its record to every other, so all arrived
            let checked = self.agree(&fp, &[], None)?.is_some();
            if let Some(shm) = self.shm() {
                return shm.barrier();
            }
            if !checked {
                // the shape check meets every rank, as the barrier would
                let _watch = self.agree_shape(&fp, None)?;
            }
            Ok(())
        }

        #[track_caller]
        fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
            checks::root(root, self.size())?;
            let fp = self.fingerprint("broadcast", Some(T::DTYPE), vec![buf.len(), root]);
            let moved = traffic::broadcast(buf.len(), root, self.rank(), self.size(), size_of::<T>());
            self.note(Op::Broadcast, None, Some(T::DTYPE), moved, None);
            self.agree(&fp, &[], None)?;
            if let Some(shm) = self.shm() {
                return shm.broadcast(buf, root);
            }
            let _watch = self.agree_shape(&fp, None)?;
            if !buf.is_empty() {
                self.comm.process_at_rank(root as i32).broadcast_into(bytes_mut(buf));
            }
            Ok(())
        }

        #[track_caller]
        fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
            checks::all_reduce(send, recv, op)?;
            let fp = self.fingerprint(op.fingerprint_name("all_reduce"), Some(T::DTYPE), vec![send.len()]);
            let moved = traffic::all_reduce(send.len(), self.rank(), self.size(), size_of::<T>());
            self.note(Op::AllReduce, Some(op), Some(T::DTYPE), moved, None);
            self.agree(&fp, &[], None)?;
            if let Some(shm) = self.shm() {
                return shm.all_reduce(send, recv, op);
            }
            let _watch = self.agree_shape(&fp, None)?;
            let (n, len) = (self.size(), send.len());
            let counts: Vec<usize> = (0..n).map(|j| (j + 1) * len / n - j * len / n).collect();
            let mine = counts[self.rank()];
            if let Some(t) = &self.tiers {
                return t.all_reduce(send, recv, op);
            }
            let c = byte_counts::<T>(counts.iter().copied(), "nx_collectives::all_reduce")?;
            let d = displs(&c);
            // this rank's chunk of the sum, reduced into scratch memory and gathered from there
            // into every rank's `recv` (rsmpi has no MPI_IN_PLACE)
            self.with_scratch::<T, _>(mine * (n + 1), |scratch| {
                let (blocks, chunk) = scratch.split_at_mut(mine * n);
                self.exchange_and_reduce(send, &counts, blocks, chunk, op)?;
                let mut part = PartitionMut::new(bytes_mut(recv), &c[..], &d[..]);
                self.comm.all_gather_varcount_into(bytes(chunk), &mut part);
                Ok(())
            })
        }

        #[track_caller]
        fn reduce_scatter_v<T: Reducible>(
            &self,
            send: &[T],
            recv: &mut [T],
            counts: &[usize],
            op: ReduceOp,
        ) -> Result<()> {
            checks::reduce_scatter(send, recv, counts, op, self.rank(), self.size())?;
            let fp = self.fingerprint(op.fingerprint_name("reduce_scatter"), Some(T::DTYPE), counts.to_vec());
            let moved = traffic::reduce_scatter(counts, self.rank(), size_of::<T>());
            self.note(Op::ReduceScatter, Some(op), Some(T::DTYPE), moved, None);
            self.agree(&fp, &[], None)?;
            if let Some(shm) = self.shm() {
                return shm.reduce_scatter_v(send, recv, counts, op);
            }
            let _watch = self.agree_shape(&fp, None)?;
            if let Some(t) = &self.tiers {
                return t.reduce_scatter_v(send, recv, counts, op);
            }
            let n = self.size();
            self.with_scratch::<T, _>(recv.len() * n, |blocks| self.exchange_and_reduce(send, counts, blocks, recv, op))
        }

        #[track_caller]
        fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
            checks::all_gather(send, recv, counts, self.rank(), self.size())?;
            let fp = self.fingerprint("all_gather", Some(T::DTYPE), counts.to_vec());
            self.note(
                Op::AllGather,
                None,
                Some(T::DTYPE),
                traffic::all_gather(counts, self.rank(), size_of::<T>()),
                None,
            );
            self.agree(&fp, &[], None)?;
            if let Some(shm) = self.shm() {
                return shm.all_gather_v(send, recv, counts);
            }
            let _watch = self.agree_shape(&fp, None)?;
            if let Some(t) = &self.tiers {
                return t.all_gather_v(send, recv, counts);
            }
            let c = byte_counts::<T>(counts.iter().copied(), "nx_collectives::all_gather_v")?;
            let d = displs(&c);
            let mut part = PartitionMut::new(bytes_mut(recv), &c[..], &d[..]);
            self.comm.all_gather_varcount_into(bytes(send), &mut part);
            Ok(())
        }

        #[track_caller]
        fn all_to_all_v<T: Reducible>(
            &self,
            send: &[T],
            send_counts: &[usize],
            recv: &mut [T],
            recv_counts: &[usize],
        ) -> Result<()> {
            let n = self.size();
            checks::all_to_all(send, send_counts, recv, recv_counts, n)?;
            let fp = self.fingerprint("all_to_all", Some(T::DTYPE), vec![n]);
            let moved = traffic::all_to_all(send_counts, recv_counts, self.rank(), size_of::<T>());
            self.note(Op::AllToAll, None, Some(T::DTYPE), moved, None);
            let extra: Vec<usize> = send_counts.iter().chain(recv_counts).copied().collect();
            if let Some(all) = self.agree(&fp, &extra, None)? {
                checks::all_to_all_pairs(&all, |r| self.members[r])?;
            }
            if let Some(shm) = self.shm() {
                return shm.all_to_all_v(send, send_counts, recv, recv_counts);
            }
            let _watch = self.agree_shape(&fp, Some((send_counts, recv_counts)))?;
            let sc = byte_counts::<T>(send_counts.iter().copied(), "nx_collectives::all_to_all_v")?;
            let rc = byte_counts::<T>(recv_counts.iter().copied(), "nx_collectives::all_to_all_v")?;
            let (sd, rd) = (displs(&sc), displs(&rc));
            let part = Partition::new(bytes(send), &sc[..], &sd[..]);
            let mut rpart = PartitionMut::new(bytes_mut(recv), &rc[..], &rd[..]);
            self.comm.all_to_all_varcount_into(&part, &mut rpart);
            Ok(())
        }

        #[track_caller]
        fn send<T: Reducible>(&self, buf: &[T], to: usize) -> Result<()> {
            checks::peer("nx_collectives::send", to, self.rank(), self.size())?;
            let fp = Fingerprint::point_to_point(&self.seq, &self.axes, "send", Some(T::DTYPE), vec![buf.len()]);
            let peers = vec![self.world_rank, self.members[to]];
            self.note(Op::Send, None, Some(T::DTYPE), (size_of_val(buf) as u64, 0), Some(peers));
            self.pair(&fp, to)?;
            let _watch = self.watched(&fp, Some(to));
            self.comm.process_at_rank(to as i32).send_with_tag(bytes(buf), DATA_TAG);
            Ok(())
        }

        #[track_caller]
        fn recv<T: Reducible>(&self, buf: &mut [T], from: usize) -> Result<()> {
            checks::peer("nx_collectives::recv", from, self.rank(), self.size())?;
            let fp = Fingerprint::point_to_point(&self.seq, &self.axes, "recv", Some(T::DTYPE), vec![buf.len()]);
            let peers = vec![self.world_rank, self.members[from]];
            self.note(Op::Recv, None, Some(T::DTYPE), (0, size_of_val(buf) as u64), Some(peers));
            self.pair(&fp, from)?;
            let _watch = self.watched(&fp, Some(from));
            self.comm.process_at_rank(from as i32).receive_into_with_tag(bytes_mut(buf), DATA_TAG);
            Ok(())
        }

        #[track_caller]
        fn split_over(&self, color: Option<usize>, key: usize, axes: &[String]) -> Result<Option<MpiComm>> {
            let fp = self.fingerprint("split", None, Vec::new());
            self.note(Op::Split, None, None, (0, 0), None);
            self.agree(&fp, &[], None)?;
            let _watch = self.watched(&fp, None);
            let c = match color {
                Some(c) => Color::with_value(c as i32),
                None => Color::undefined(),
            };
            let Some(comm) = self.comm.split_by_color_with_key(c, key as i32) else { return Ok(None) };
            // the members' world ranks (= their ranks on the host, where the node is the whole world)
            let mut members = vec![0u64; comm.size() as usize];
            comm.all_gather_into(&(self.world_rank as u64), &mut members[..]);
            let members: Rc<[usize]> = members.into_iter().map(|m| m as usize).collect();
            let shm = self.shm.as_ref().map(|parent| {
                Shm::new(parent.node(), members.to_vec(), self.opts.timeout, Simd::capped(self.opts.simd))
            });
            let of_members: Vec<usize> = members.iter().map(|&m| self.hosts[m]).collect();
            let tiers = hierarchical(&comm, &of_members, Simd::capped(self.opts.simd));
            Ok(Some(MpiComm {
                comm,
                world_rank: self.world_rank,
                members,
                hosts: self.hosts.clone(),
                tiers,
                watch: self.watch.clone(),
                seq: Cell::new(0),
                opts: self.opts,
                scratch: RefCell::new(None),
                shm,
                axes: axes.to_vec(),
                recorder: self.recorder.clone(),
            }))
        }
    }

    impl MpiComm {
        /// The shared-memory path, where it is on and every rank is on this host.
        fn shm(&self) -> Option<&Shm> {
            self.shm.as_ref()
        }

        /// Whether this communicator's collectives go through shared memory: the world's ranks all
        /// share this host and `NX_MPI_SHM` was not `0` when the run began.
        pub fn uses_shared_memory(&self) -> bool {
            self.shm.is_some()
        }

        /// How this communicator's collectives move data: `"cross-memory attach"` (one kernel copy
        /// between the ranks' buffers, where the kernel lets every rank read every peer),
        /// `"shared window"` (through the window's halves: otherwise, or `NX_MPI_CMA=0`), or
        /// `"MPI calls within and across hosts"` (the hierarchical path, where the members lie
        /// on several hosts, as many on each), or `"MPI calls"`.
        pub fn data_path(&self) -> &'static str {
            match (&self.shm, &self.tiers) {
                (Some(s), _) if s.node().is_direct() => "cross-memory attach",
                (Some(_), _) => "shared window",
                (None, Some(_)) => "MPI calls within and across hosts",
                (None, None) => "MPI calls",
            }
        }

        /// The MPI library's own `MPI_Allreduce` (sum) of `f32`s, unchecked: the peer nx's
        /// benchmarks compare with.
        pub fn plain_all_reduce_sum(&self, send: &[f32], recv: &mut [f32]) {
            self.comm.all_reduce_into(send, recv, mpi::collective::SystemOperation::sum());
        }

        /// The MPI library's own `MPI_Allgather` of `f32`s, for comparisons.
        pub fn plain_all_gather(&self, send: &[f32], recv: &mut [f32]) {
            self.comm.all_gather_into(send, recv);
        }

        /// The MPI library's own `MPI_Reduce_scatter_block` (sum) of `f32`s, for comparisons.
        pub fn plain_reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) {
            self.comm.reduce_scatter_block_into(send, recv, mpi::collective::SystemOperation::sum());
        }

        /// The MPI library's own `MPI_Alltoall` of `f32`s, for comparisons.
        pub fn plain_all_to_all(&self, send: &[f32], recv: &mut [f32]) {
            self.comm.all_to_all_into(send, recv);
        }

        /// A send and its receive agree on dtype and length (the op names differ by design), in
        /// checked mode or not: a short exchange of the two shapes, against the deadline.
        fn pair(&self, fp: &Fingerprint, peer: usize) -> Result<()> {
            let shape = Fingerprint { op: "p2p", seq: 0, site: Location::caller(), ..fp.clone() };
            let mut recs = self.exchange(&shape, &[], &[peer])?;
            let theirs = recs[peer].take().expect("exchanged");
            let ours = parse(&record(&shape, &[]));
            if theirs.shape != ours.shape {
                // `p2p(f32, [4]) at …` as `send(f32, [4])`
                let call = |op: &str, r: &Record| {
                    let words = r.words.split(" at ").next().unwrap_or_default();
                    format!("{op}{}", words.strip_prefix("p2p").unwrap_or(words))
                };
                let (a, b) = if fp.op == "send" { (self.rank(), peer) } else { (peer, self.rank()) };
                let of = |r: usize| if r == self.rank() { &ours } else { &theirs };
                return Err(Error::Mismatch {
                    rank_a: a,
                    call_a: call("send", of(a)),
                    rank_b: b,
                    call_b: call("recv", of(b)),
                });
            }
            Ok(())
        }
    }
}
