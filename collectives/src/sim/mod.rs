//! The simulated backend: N ranks as threads of one process, collectives through shared memory.
//!
//! [`run`] starts the ranks and hands each a [`SimComm`] over the world. A collective is two
//! rendezvous of its group ([`sync`]): at the first each rank posts its fingerprint and the
//! addresses of its buffers, and every rank checks every fingerprint; between the two, each rank
//! reads its peers' buffers where they lie and writes results where they go (an all-reduce sums
//! its own chunk of every rank's input in rank order and writes it straight into every rank's
//! output, streaming the stores when large); the second rendezvous ends the call once every rank
//! is done with every buffer. All state lives in the world a call of [`run`] makes: many simulated
//! worlds run side by side in one process.
//!
//! A rank whose body returns an error, panics or returns while peers wait for it is reported to
//! them at once ([`Error::PeerGone`]); a collective that waits past the timeout fails with the
//! ranks that did not arrive ([`Error::Timeout`]). Faults can be injected through the options
//! ([`Fault`]). Every rank records its calls into its [`Recorder`] ([`crate::log`]).

use std::cell::Cell;
use std::fmt::Display;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checks;
use crate::log::{traffic, Event, Op, Recorder};
use crate::reduce::{by_host, reduce_grouped};
use crate::{Communicator, Error, Fingerprint, ReduceOp, Reducible, Result};

mod fault;
mod sync;

pub use fault::{Fault, FaultKind};
use sync::{Group, Mail, Slot, World};

/// Settings of a simulated world, passed explicitly (no global switch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimOptions {
    /// Agree on full fingerprints (sequence, op, dtype, counts, mesh axes, call site) before each
    /// collective; op, dtype and counts are always checked.
    pub checked: bool,
    /// How long a collective waits for its peers before failing.
    pub timeout: Duration,
    /// Faults to inject ([`Fault`]).
    pub faults: Vec<Fault>,
    /// The host of each rank, to simulate a layout over hosts (empty: one host): reductions
    /// then associate as the MPI backend's do across hosts ([`Communicator::hosts`]), the same
    /// bits as MPI ranks laid out so.
    pub hosts: Vec<usize>,
    /// The highest SIMD level the reduction loops use (`None`: all the CPU has); every level
    /// gives the same bits.
    pub simd: Option<nx_kernels::Simd>,
}

impl Default for SimOptions {
    /// The collectives' defaults ([`crate::Options`]), no faults.
    fn default() -> Self {
        let o = crate::Options::default();
        SimOptions { checked: o.checked, timeout: o.timeout, faults: Vec::new(), hosts: Vec::new(), simd: o.simd }
    }
}

/// The most ranks a simulated world has (a thread each).
pub const MAX_RANKS: usize = 4096;

/// A communicator over a group of simulated ranks.
#[derive(Debug)]
pub struct SimComm {
    world: Arc<World>,
    group: Arc<Group>,
    key: Vec<u64>,
    rank: usize,
    seq: Cell<u64>,
    /// The mesh axes the group spans (for fingerprints).
    axes: Vec<String>,
    recorder: Recorder,
}

/// Runs `body` on `n` simulated ranks, each a thread with its [`SimComm`] over the world (one
/// rank on the caller's thread), and returns their results in rank order.
///
/// # Errors
/// [`Error::Invalid`] for `n` = 0 or past [`MAX_RANKS`]; [`Error::RankFailed`] naming the first
/// rank whose body failed or panicked (the root cause; the others' errors follow from it).
pub fn run<R, E, F>(n: usize, opts: SimOptions, body: F) -> Result<Vec<R>>
where
    R: Send,
    E: Display,
    F: Fn(SimComm) -> std::result::Result<R, E> + Sync,
{
    if n == 0 || n > MAX_RANKS {
        return Err(Error::Invalid {
            func: "nx_collectives::sim::run",
            why: format!("a world of {n} ranks (a simulated world has 1 to {MAX_RANKS}: a thread each)"),
        });
    }
    if !opts.hosts.is_empty() && opts.hosts.len() != n {
        return Err(Error::Invalid {
            func: "nx_collectives::sim::run",
            why: format!("hosts for {} ranks in a world of {n}", opts.hosts.len()),
        });
    }
    let world = Arc::new(World::new(n, opts));
    let results: Vec<Option<R>> = if n == 1 {
        // one rank runs on the caller's thread: a caller on a pool's worker keeps its kernels
        // there (their splits start from a worker, with no hand-off into the pool and back)
        vec![rank(&world, 0, 1, &body)]
    } else {
        std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(n);
            for r in 0..n {
                let (w, body) = (world.clone(), &body);
                let started = std::thread::Builder::new()
                    .name(format!("nx-sim-rank-{r}"))
                    .spawn_scoped(s, move || rank(&w, r, n, body));
                match started {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        // the ranks that cannot start are gone: the others fail at once, naming them
                        for q in r..n {
                            let why = format!("failed: its thread could not start: {e}");
                            world.leave(q, why.clone(), Some(why));
                        }
                        break;
                    }
                }
            }
            let mut out: Vec<Option<R>> = handles.into_iter().map(|h| h.join().unwrap_or(None)).collect();
            out.resize_with(n, || None);
            out
        })
    };
    if let Some((rank, why)) = world.first_failure() {
        return Err(Error::RankFailed { rank, why });
    }
    Ok(results.into_iter().map(|r| r.expect("every rank returned")).collect())
}

/// Rank `r`'s body (of `n`) over its communicator: its value, or `None` where it failed or
/// panicked (its leaving recorded in `world` either way).
fn rank<R, E, F>(world: &Arc<World>, r: usize, n: usize, body: &F) -> Option<R>
where
    E: Display,
    F: Fn(SimComm) -> std::result::Result<R, E>,
{
    let comm = SimComm {
        group: world.group(&[], || (0..n).collect()),
        world: world.clone(),
        key: Vec::new(),
        rank: r,
        seq: Cell::new(0),
        axes: Vec::new(),
        recorder: Recorder::new(),
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| body(comm))) {
        Ok(Ok(v)) => {
            world.leave(r, "returned from its body".into(), None);
            Some(v)
        }
        Ok(Err(e)) => {
            world.leave(r, format!("failed: {e}"), Some(e.to_string()));
            None
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            world.leave(r, format!("panicked: {msg}"), Some(format!("panicked: {msg}")));
            None
        }
    }
}

impl SimComm {
    /// The SIMD level of the world's reduction loops.
    fn simd(&self) -> nx_kernels::Simd {
        nx_kernels::Simd::capped(self.world.opts.simd)
    }

    fn world_of(&self, r: usize) -> usize {
        self.group.members[r]
    }

    #[track_caller]
    fn fingerprint(&self, op: &'static str, dtype: Option<nx_kernels::Dtype>, counts: Vec<usize>) -> Fingerprint {
        Fingerprint::next(&self.seq, &self.axes, op, dtype, counts)
    }

    /// Records a call of `op` moving `(sent, received)` bytes, where a region is open.
    fn note(&self, op: Op, reduce: Option<ReduceOp>, dtype: Option<nx_kernels::Dtype>, bytes: (u64, u64)) {
        self.recorder.note(|| Event {
            op,
            reduce,
            dtype,
            axes: self.axes.clone(),
            members: self.group.members.clone(),
            bytes_sent: bytes.0,
            bytes_received: bytes.1,
            step: None,
        });
    }

    /// The first rendezvous of a collective: applies an injected fault, posts the fingerprint and
    /// buffers, and checks every member's fingerprint. Answers the rendezvous's parity and every
    /// member's `(send, recv)` addresses.
    fn open(
        &self,
        fp: Fingerprint,
        send: usize,
        recv: usize,
        extra: Vec<usize>,
    ) -> Result<(usize, Vec<(usize, usize)>)> {
        self.world.fault(self.world_rank(), &|| fp.to_string())?;
        // the call in words only where an error needs them
        let site = fp.clone();
        let slot = Slot { fp: Some(fp), send, recv, extra };
        let parity = self.group.meet(&self.world, self.rank, Some(slot), &|| site.to_string())?;
        let n = self.size();
        // every member compares every fingerprint with member 0's: the same verdict on every rank
        let mismatch = self.group.slot(parity, 0, |first| {
            let a = first.fp.as_ref().expect("posted");
            (1..n).find_map(|j| {
                self.group.slot(parity, j, |s| {
                    let b = s.fp.as_ref().expect("posted");
                    (!a.agrees(b, self.world.opts.checked)).then(|| (a.to_string(), b.to_string(), j))
                })
            })
        });
        if let Some((call_a, call_b, j)) = mismatch {
            return Err(Error::Mismatch { rank_a: self.world_of(0), call_a, rank_b: self.world_of(j), call_b });
        }
        Ok((parity, (0..n).map(|m| self.group.slot(parity, m, |s| (s.send, s.recv))).collect()))
    }

    /// The second rendezvous: every member is done with every buffer.
    fn close(&self, what: &'static str) -> Result<()> {
        self.group.meet(&self.world, self.rank, None, &|| format!("the end of {what}")).map(|_| ())
    }
}

/// Collectives whose buffers hold at least this many bytes write with streaming stores.
const STREAM_MIN: usize = 4 << 20;

/// Whether a collective over buffers of `n` elements of `T` streams its stores.
fn streams<T>(n: usize) -> bool {
    n * size_of::<T>() >= STREAM_MIN
}

/// Copies `n` elements from `src` to `dst`, with streaming stores where `stream` (the caller
/// fences before the call's closing rendezvous).
///
/// # Safety
/// Both point at `n` valid, aligned elements, and nothing else touches `dst`'s meanwhile.
unsafe fn put<T: Copy>(src: *const T, dst: *mut T, n: usize, stream: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        if stream {
            nx_kernels::host::stream_copy(std::slice::from_raw_parts(src, n), dst);
        } else {
            nx_kernels::host::copy(std::slice::from_raw_parts(src, n), dst)
        }
    }
}

impl Communicator for SimComm {
    fn hosts(&self) -> Vec<usize> {
        let hosts = &self.world.opts.hosts;
        self.group.members.iter().map(|&m| hosts.get(m).copied().unwrap_or(0)).collect()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.members.len()
    }

    fn backend(&self) -> &'static str {
        "sim"
    }

    fn world_rank(&self) -> usize {
        self.group.members[self.rank]
    }

    fn recorder(&self) -> Option<&Recorder> {
        Some(&self.recorder)
    }

    fn note_skipped(&self, op: Op, reduce: Option<ReduceOp>, dtype: nx_kernels::Dtype, bytes: (u64, u64)) {
        self.note(op, reduce, Some(dtype), bytes);
    }

    #[track_caller]
    fn barrier(&self) -> Result<()> {
        let fp = self.fingerprint("barrier", None, Vec::new());
        self.note(Op::Barrier, None, None, (0, 0));
        self.open(fp, 0, 0, Vec::new())?;
        self.close("barrier")
    }

    #[track_caller]
    fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> Result<()> {
        checks::root(root, self.size())?;
        let fp = self.fingerprint("broadcast", Some(T::DTYPE), vec![buf.len(), root]);
        let addr = buf.as_mut_ptr() as usize;
        let bytes = traffic::broadcast(buf.len(), root, self.rank, self.size(), size_of::<T>());
        self.note(Op::Broadcast, None, Some(T::DTYPE), bytes);
        let (_, slots) = self.open(fp, addr, addr, Vec::new())?;
        if self.rank != root && !buf.is_empty() {
            // SAFETY: the root is blocked in this call until `close`, and only reads its buffer;
            // lengths agree (checked by the fingerprints); this rank writes its own buffer alone.
            unsafe { put(slots[root].0 as *const T, addr as *mut T, buf.len(), false) };
        }
        self.close("broadcast")
    }

    #[track_caller]
    fn all_reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        checks::all_reduce(send, recv, op)?;
        let fp = self.fingerprint(op.fingerprint_name("all_reduce"), Some(T::DTYPE), vec![send.len()]);
        let bytes = traffic::all_reduce(send.len(), self.rank, self.size(), size_of::<T>());
        self.note(Op::AllReduce, Some(op), Some(T::DTYPE), bytes);
        let (_, slots) = self.open(fp, send.as_ptr() as usize, recv.as_mut_ptr() as usize, Vec::new())?;
        let (n, len) = (self.size(), send.len());
        let (lo, hi) = (self.rank * len / n, (self.rank + 1) * len / n);
        // This rank sums elements lo..hi of every member's send, in member (term) order, a block at
        // a time, and writes each block straight into every member's recv.
        const BLOCK: usize = 1 << 14;
        let stream = streams::<T>(len);
        let mut block = vec![T::default(); BLOCK.min(hi - lo)];
        let tiers = by_host(self.hosts());
        let mut at = lo;
        while at < hi {
            let m = BLOCK.min(hi - at);
            // SAFETY: every member is blocked in this call until `close`; their send buffers are
            // only read, and this rank alone writes elements lo..hi of every member's recv buffer.
            unsafe {
                let terms: Vec<&[T]> =
                    slots.iter().map(|s| std::slice::from_raw_parts((s.0 as *const T).add(at), m)).collect();
                reduce_grouped(self.simd(), op, &terms, &tiers, &mut block[..m]);
                for s in &slots {
                    put(block.as_ptr(), (s.1 as *mut T).add(at), m, stream);
                }
            }
            at += m;
        }
        if stream {
            nx_kernels::host::store_fence();
        }
        self.close("all_reduce")
    }

    #[track_caller]
    fn reduce_scatter_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize], op: ReduceOp) -> Result<()> {
        checks::reduce_scatter(send, recv, counts, op, self.rank(), self.size())?;
        let fp = self.fingerprint(op.fingerprint_name("reduce_scatter"), Some(T::DTYPE), counts.to_vec());
        self.note(
            Op::ReduceScatter,
            Some(op),
            Some(T::DTYPE),
            traffic::reduce_scatter(counts, self.rank, size_of::<T>()),
        );
        let (_, slots) = self.open(fp, send.as_ptr() as usize, recv.as_mut_ptr() as usize, Vec::new())?;
        let off: usize = counts[..self.rank].iter().sum();
        // SAFETY: members are blocked until `close`; send buffers only read (their lengths agree by
        // the fingerprints); this rank writes its own recv alone.
        unsafe {
            let terms: Vec<&[T]> =
                slots.iter().map(|s| std::slice::from_raw_parts((s.0 as *const T).add(off), recv.len())).collect();
            reduce_grouped(self.simd(), op, &terms, &by_host(self.hosts()), recv);
        }
        self.close("reduce_scatter")
    }

    #[track_caller]
    fn all_gather_v<T: Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<()> {
        checks::all_gather(send, recv, counts, self.rank(), self.size())?;
        let fp = self.fingerprint("all_gather", Some(T::DTYPE), counts.to_vec());
        self.note(Op::AllGather, None, Some(T::DTYPE), traffic::all_gather(counts, self.rank, size_of::<T>()));
        let (_, slots) = self.open(fp, send.as_ptr() as usize, recv.as_mut_ptr() as usize, Vec::new())?;
        let off: usize = counts[..self.rank].iter().sum();
        let stream = streams::<T>(recv.len());
        // a piece at a time into every member's recv, starting past this rank, so that each piece
        // is read from memory once and from the caches after
        let (n, per) = (slots.len(), (crate::shm::PUSH_CHUNK / size_of::<T>()).max(1));
        for lo in (0..send.len()).step_by(per) {
            let m = per.min(send.len() - lo);
            for s in slots.iter().cycle().skip(self.rank + 1).take(n) {
                // SAFETY: members are blocked until `close`; this rank writes its own block of
                // every member's recv (disjoint from every other writer's) from its own send.
                unsafe { put(send.as_ptr().add(lo), (s.1 as *mut T).add(off + lo), m, stream) };
            }
        }
        if stream {
            nx_kernels::host::store_fence();
        }
        self.close("all_gather")
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
        let extra: Vec<usize> = send_counts.iter().chain(recv_counts).copied().collect();
        let bytes = traffic::all_to_all(send_counts, recv_counts, self.rank, size_of::<T>());
        self.note(Op::AllToAll, None, Some(T::DTYPE), bytes);
        let (parity, slots) = self.open(fp, send.as_ptr() as usize, recv.as_mut_ptr() as usize, extra)?;
        // every sender's count must be its receiver's; all ranks check all pairs alike
        let all: Vec<Vec<usize>> = (0..n).map(|m| self.group.slot(parity, m, |s| s.extra.clone())).collect();
        checks::all_to_all_pairs(&all, |r| self.world_of(r))?;
        let mut at = 0;
        for (j, sj) in slots.iter().enumerate() {
            let src_off: usize = all[j][..self.rank].iter().sum();
            let cnt = recv_counts[j];
            // SAFETY: members are blocked until `close`; their send buffers are only read, at
            // offsets and counts every rank agreed on above; this rank writes its own recv.
            unsafe { put((sj.0 as *const T).add(src_off), recv.as_mut_ptr().add(at), cnt, false) };
            at += cnt;
        }
        self.close("all_to_all")
    }

    #[track_caller]
    fn send<T: Reducible>(&self, buf: &[T], to: usize) -> Result<()> {
        checks::peer("nx_collectives::send", to, self.rank(), self.size())?;
        let fp = Fingerprint::point_to_point(&self.seq, &self.axes, "send", Some(T::DTYPE), vec![buf.len()]);
        let key = (self.world_rank(), self.world_of(to));
        let bytes = size_of_val(buf) as u64;
        self.recorder.note(|| Event {
            op: Op::Send,
            reduce: None,
            dtype: Some(T::DTYPE),
            axes: self.axes.clone(),
            members: vec![key.0, key.1],
            bytes_sent: bytes,
            bytes_received: 0,
            step: None,
        });
        self.world.fault(self.world_rank(), &|| fp.to_string())?;
        let call = fp.to_string();
        let start = Instant::now();
        let w = &*self.world;
        let mut mail = w.mail.lock().unwrap_or_else(|e| e.into_inner());
        mail.insert(key, Mail { addr: buf.as_ptr() as usize, len: buf.len(), fp, taken: false, refused: None });
        w.mail_cv.notify_all();
        loop {
            let m = mail.get(&key).expect("posted");
            if m.taken {
                let refused = m.refused.clone();
                mail.remove(&key);
                return match refused {
                    Some(r) => Err(Error::Mismatch { rank_a: key.0, call_a: call, rank_b: key.1, call_b: r }),
                    None => Ok(()),
                };
            }
            if w.is_gone(key.1) {
                mail.remove(&key);
                return Err(Error::PeerGone { rank: key.0, call, peer: key.1, why: w.why_gone(key.1) });
            }
            let waited = start.elapsed();
            if waited >= w.opts.timeout {
                mail.remove(&key);
                drop(mail);
                let e = Error::Timeout { rank: key.0, call, waited_s: waited.as_secs_f64(), missing: vec![key.1] };
                w.leave(key.0, format!("failed: {e}"), Some(e.to_string()));
                return Err(e);
            }
            let slice = (w.opts.timeout - waited).min(Duration::from_millis(200));
            mail = w.mail_cv.wait_timeout(mail, slice).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    #[track_caller]
    fn recv<T: Reducible>(&self, buf: &mut [T], from: usize) -> Result<()> {
        checks::peer("nx_collectives::recv", from, self.rank(), self.size())?;
        let fp = Fingerprint::point_to_point(&self.seq, &self.axes, "recv", Some(T::DTYPE), vec![buf.len()]);
        let key = (self.world_of(from), self.world_rank());
        let bytes = size_of_val(buf) as u64;
        self.recorder.note(|| Event {
            op: Op::Recv,
            reduce: None,
            dtype: Some(T::DTYPE),
            axes: self.axes.clone(),
            members: vec![key.1, key.0],
            bytes_sent: 0,
            bytes_received: bytes,
            step: None,
        });
        self.world.fault(self.world_rank(), &|| fp.to_string())?;
        let call = fp.to_string();
        let start = Instant::now();
        let w = &*self.world;
        let mut mail = w.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(m) = mail.get_mut(&key).filter(|m| !m.taken) {
                m.taken = true;
                let ok = m.fp.dtype == fp.dtype && m.len == buf.len();
                let theirs = m.fp.to_string();
                if !ok {
                    m.refused = Some(call.clone());
                    w.mail_cv.notify_all();
                    return Err(Error::Mismatch { rank_a: key.0, call_a: theirs, rank_b: key.1, call_b: call });
                }
                // SAFETY: the sender is blocked until it sees `taken` after this copy (under the
                // lock), and only reads its buffer; dtype and length agree.
                unsafe { put(m.addr as *const T, buf.as_mut_ptr(), buf.len(), false) };
                w.mail_cv.notify_all();
                return Ok(());
            }
            if w.is_gone(key.0) {
                return Err(Error::PeerGone { rank: key.1, call, peer: key.0, why: w.why_gone(key.0) });
            }
            let waited = start.elapsed();
            if waited >= w.opts.timeout {
                drop(mail);
                let e = Error::Timeout { rank: key.1, call, waited_s: waited.as_secs_f64(), missing: vec![key.0] };
                w.leave(key.1, format!("failed: {e}"), Some(e.to_string()));
                return Err(e);
            }
            let slice = (w.opts.timeout - waited).min(Duration::from_millis(200));
            mail = w.mail_cv.wait_timeout(mail, slice).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    #[track_caller]
    fn split_over(&self, color: Option<usize>, key: usize, axes: &[String]) -> Result<Option<SimComm>> {
        let seq = self.seq.get();
        let fp = self.fingerprint("split", None, Vec::new());
        let c = color.unwrap_or(usize::MAX);
        self.note(Op::Split, None, None, (0, 0));
        let (parity, _) = self.open(fp, 0, 0, vec![c, key])?;
        let extra: Vec<(usize, usize)> =
            (0..self.size()).map(|m| self.group.slot(parity, m, |s| (s.extra[0], s.extra[1]))).collect();
        let out = color.map(|c| {
            let mut mine: Vec<(usize, usize)> =
                (0..self.size()).filter(|&m| extra[m].0 == c).map(|m| (extra[m].1, m)).collect();
            mine.sort_unstable();
            let members: Vec<usize> = mine.iter().map(|&(_, m)| self.group.members[m]).collect();
            let rank = mine.iter().position(|&(_, m)| m == self.rank).expect("this rank is in its group");
            let mut gkey = self.key.clone();
            gkey.extend([seq, c as u64]);
            SimComm {
                group: self.world.group(&gkey, || members),
                world: self.world.clone(),
                key: gkey,
                rank,
                seq: Cell::new(0),
                axes: axes.to_vec(),
                recorder: self.recorder.clone(),
            }
        });
        self.close("split")?;
        Ok(out)
    }
}
