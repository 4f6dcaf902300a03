//! The world of a simulated run and the rendezvous of its groups.
//!
//! A group meets without a world lock: each member posts its slot (in the half of the slots the
//! rendezvous's parity picks), marks its arrival and counts itself in; the last to arrive opens
//! the next rendezvous. Waiting members spin (where every rank has a CPU of its own), then yield
//! their CPU, and after [`YIELD_FOR`] sleep on the group's condition variable, which the last
//! arrival signals. A slot is written again two rendezvous later, after a rendezvous that every
//! member reaches only once it has read the slots it needs, so each collective's two rendezvous
//! (the first posts, the second ends the call) never race on a slot. While waiting, a member
//! checks every member that has not arrived: one that has left the run ends the wait with
//! [`Error::PeerGone`] naming it, and past the timeout the wait ends with [`Error::Timeout`] naming
//! those that did not arrive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Fault, FaultKind, SimOptions};
use crate::{Error, Fingerprint, Result};

/// How long a waiting member yields its CPU before it sleeps: ranks of a small collective arrive
/// within microseconds, while a rank that computes meanwhile should get the CPU (4 ranks on 2
/// CPUs, medians of 5 runs: 200 µs, 500 µs and 2 ms gave 9.2, 8.8 and 11.7 µs at 16 KiB
/// all-reduces, 754, 696 and 1017 µs at 4 MiB).
const YIELD_FOR: Duration = Duration::from_micros(500);
/// The longest single sleep (the sleeper then checks its peers and its timeout again).
const NAP: Duration = Duration::from_millis(50);
/// Spins before yielding, where every rank has a CPU.
const SPINS: u32 = 200;

/// What a member posts at the first rendezvous of a collective.
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    pub(super) fp: Option<Fingerprint>,
    pub(super) send: usize,
    pub(super) recv: usize,
    pub(super) extra: Vec<usize>,
}

/// A group of ranks that meet.
#[derive(Debug)]
pub(super) struct Group {
    /// The members' world ranks, in group order.
    pub(super) members: Vec<usize>,
    /// The rendezvous passed (high 32 bits, wrapping) and the members arrived at the current one
    /// (low 32 bits), in one word: arriving, completing and withdrawing an arrival are each one
    /// compare-and-swap, so a rank that gives up is never counted as arrived.
    state: AtomicU64,
    /// Per member: the rendezvous it is arrived at, plus one (0: none).
    arrived: Vec<AtomicU64>,
    /// The slots, by the rendezvous's parity, then member.
    slots: [Vec<Mutex<Slot>>; 2],
    sleepers: AtomicUsize,
    park: Mutex<()>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // a poisoned lock only means a panic elsewhere while it was held; the data stays valid
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Group {
    pub(super) fn new(members: Vec<usize>) -> Group {
        let n = members.len();
        let slots = || (0..n).map(|_| Mutex::new(Slot::default())).collect();
        Group {
            members,
            state: AtomicU64::new(0),
            arrived: (0..n).map(|_| AtomicU64::new(0)).collect(),
            slots: [slots(), slots()],
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Member `m`'s slot of the rendezvous of parity `parity`, to `f`.
    pub(super) fn slot<R>(&self, parity: usize, m: usize, f: impl FnOnce(&Slot) -> R) -> R {
        f(&lock(&self.slots[parity][m]))
    }

    /// Wakes the members that sleep.
    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.park);
            self.cv.notify_all();
        }
    }

    /// The rendezvous number in `state`.
    fn gen_of(state: u64) -> u64 {
        state >> 32
    }

    /// Member `me` arrives (posting `slot`, where given) and waits for every member; answers the
    /// parity of this rendezvous's slots. `call` names the call for errors.
    ///
    /// # Errors
    /// [`Error::PeerGone`] naming a member that left before arriving; [`Error::Timeout`] naming
    /// those that did not arrive within the timeout (this rank then leaves the run). Either way
    /// this rank's arrival is withdrawn first, so no later arrival completes the rendezvous with
    /// it (and reads its buffers) — unless the rendezvous completed meanwhile, which is then a
    /// success.
    pub(super) fn meet(
        &self,
        world: &World,
        me: usize,
        slot: Option<Slot>,
        call: &dyn Fn() -> String,
    ) -> Result<usize> {
        let n = self.members.len() as u64;
        let s0 = self.state.load(Ordering::Acquire);
        let g = Self::gen_of(s0);
        let parity = (g % 2) as usize;
        if let Some(s) = slot {
            *lock(&self.slots[parity][me]) = s;
        }
        self.arrived[me].store(g + 1, Ordering::Release);
        // count in; the last arrival opens the next rendezvous
        let mut cur = s0;
        loop {
            let count = cur & 0xffff_ffff;
            let next = if count + 1 == n { (g + 1) << 32 } else { cur + 1 };
            match self.state.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) if count + 1 == n => {
                    self.wake();
                    return Ok(parity);
                }
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        // (sequentially consistent: a sleeper's check and the last arrival's look at `sleepers`
        // must see one another)
        let passed = || Self::gen_of(self.state.load(Ordering::SeqCst)) != g;
        // withdraws this arrival; `false` where the rendezvous completed meanwhile
        let withdraw = || -> bool {
            let mut cur = self.state.load(Ordering::Acquire);
            loop {
                if Self::gen_of(cur) != g {
                    return false;
                }
                match self.state.compare_exchange_weak(cur, cur - 1, Ordering::SeqCst, Ordering::Acquire) {
                    Ok(_) => {
                        self.arrived[me].store(0, Ordering::Release);
                        return true;
                    }
                    Err(now) => cur = now,
                }
            }
        };
        // the members that have not arrived, and the first of them that has left the run
        let missing = || -> Vec<usize> {
            (0..self.members.len())
                .filter(|&m| self.arrived[m].load(Ordering::Acquire) != g + 1)
                .map(|m| self.members[m])
                .collect()
        };
        let gone = || missing().into_iter().find(|&w| world.is_gone(w));
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if passed() {
                return Ok(parity);
            }
            spins = spins.wrapping_add(1);
            if spins < world.spins {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if spins.is_multiple_of(16) || waited >= YIELD_FOR {
                if let Some(peer) = gone() {
                    if !withdraw() {
                        return Ok(parity);
                    }
                    let why = world.why_gone(peer);
                    return Err(Error::PeerGone { rank: self.members[me], call: call(), peer, why });
                }
                if waited >= world.opts.timeout {
                    let missing = missing();
                    if !withdraw() {
                        return Ok(parity);
                    }
                    let e = Error::Timeout {
                        rank: self.members[me],
                        call: call(),
                        waited_s: waited.as_secs_f64(),
                        missing,
                    };
                    world.leave(self.members[me], format!("failed: {e}"), Some(e.to_string()));
                    return Err(e);
                }
            }
            if waited < YIELD_FOR {
                std::thread::yield_now();
                continue;
            }
            // sleep until the last arrival or a departure (both signal under the park lock)
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = lock(&self.park);
            if !passed() && gone().is_none() {
                let nap = NAP.min(world.opts.timeout.saturating_sub(waited)).max(Duration::from_millis(1));
                drop(self.cv.wait_timeout(guard, nap).unwrap_or_else(|e| e.into_inner()));
            } else {
                drop(guard);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A mailbox entry of a send waiting for its receive.
#[derive(Debug)]
pub(super) struct Mail {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) fp: Fingerprint,
    pub(super) taken: bool,
    pub(super) refused: Option<String>,
}

/// The state of one simulated run: shared by its ranks, nothing global.
#[derive(Debug)]
pub(super) struct World {
    pub(super) opts: SimOptions,
    /// Spins of a wait before it yields (1 where ranks outnumber CPUs).
    spins: u32,
    gone: Vec<AtomicBool>,
    why: Mutex<Vec<Option<String>>>,
    first_failure: Mutex<Option<(usize, String)>>,
    /// Every group, by its key (parent's key, split number, color).
    groups: Mutex<HashMap<Vec<u64>, Arc<Group>>>,
    /// Collectives begun, per rank (for faults).
    begun: Vec<AtomicUsize>,
    pub(super) mail: Mutex<HashMap<(usize, usize), Mail>>,
    pub(super) mail_cv: Condvar,
}

impl World {
    pub(super) fn new(n: usize, opts: SimOptions) -> World {
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        let mut groups = HashMap::new();
        groups.insert(Vec::new(), Arc::new(Group::new((0..n).collect())));
        World {
            opts,
            spins: if n > cpus { 1 } else { SPINS },
            gone: (0..n).map(|_| AtomicBool::new(false)).collect(),
            why: Mutex::new(vec![None; n]),
            first_failure: Mutex::new(None),
            groups: Mutex::new(groups),
            begun: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            mail: Mutex::new(HashMap::new()),
            mail_cv: Condvar::new(),
        }
    }

    /// The group with `key`, made over `members` where it is new.
    pub(super) fn group(&self, key: &[u64], members: impl FnOnce() -> Vec<usize>) -> Arc<Group> {
        lock(&self.groups).entry(key.to_vec()).or_insert_with(|| Arc::new(Group::new(members()))).clone()
    }

    pub(super) fn is_gone(&self, rank: usize) -> bool {
        self.gone[rank].load(Ordering::Acquire)
    }

    pub(super) fn why_gone(&self, rank: usize) -> String {
        lock(&self.why)[rank].clone().unwrap_or_default()
    }

    /// The first rank that failed, with why.
    pub(super) fn first_failure(&self) -> Option<(usize, String)> {
        lock(&self.first_failure).clone()
    }

    /// Marks `rank` gone: `why` for its peers ("failed: …"), `cause` the root cause if it failed;
    /// wakes every waiting rank.
    pub(super) fn leave(&self, rank: usize, why: String, cause: Option<String>) {
        {
            let mut first = lock(&self.first_failure);
            if let (Some(c), None) = (cause, first.as_ref()) {
                *first = Some((rank, c));
            }
        }
        lock(&self.why)[rank] = Some(why);
        self.gone[rank].store(true, Ordering::SeqCst);
        for g in lock(&self.groups).values() {
            let _p = lock(&g.park);
            g.cv.notify_all();
        }
        let _m = lock(&self.mail);
        self.mail_cv.notify_all();
    }

    /// Counts world rank `rank`'s next collective and applies the fault injected there, if any.
    ///
    /// # Errors
    /// [`Error::Injected`] for a failure, or after a stall; panics for a panic.
    pub(super) fn fault(&self, rank: usize, call: &dyn Fn() -> String) -> Result<()> {
        let at = self.begun[rank].fetch_add(1, Ordering::Relaxed);
        let Some(f) = self.opts.faults.iter().find(|f: &&Fault| f.rank == rank && f.at == at) else { return Ok(()) };
        match f.kind {
            FaultKind::Fail => Err(Error::Injected { rank, at, call: call(), what: "failed" }),
            FaultKind::Panic => panic!("nx fault injection: rank {rank} panicked at its collective {at}, {}", call()),
            FaultKind::Delay(d) => {
                std::thread::sleep(d);
                Ok(())
            }
            FaultKind::Stall => {
                // never arrive: wait until every peer has left (each gives up a timeout after it
                // began to wait), bounded by three timeouts and a second, then fail
                let start = Instant::now();
                let others = |w: &World| (0..w.gone.len()).filter(|&r| r != rank).all(|r| w.is_gone(r));
                while !others(self) && start.elapsed() < 3 * self.opts.timeout + Duration::from_secs(1) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(Error::Injected { rank, at, call: call(), what: "stalled" })
            }
        }
    }
}
