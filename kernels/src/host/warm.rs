//! Keeping a pool's threads awake between kernels: after each call that ran on the pool, one of
//! its other threads stays looking for work for a while ([`HostOptions::warm`](super::HostOptions)),
//! as OpenMP's threads spin before they sleep, instead of going to sleep at once.
//!
//! A rayon thread that finds no work sleeps after a few rounds, and waking it is the kernel's
//! business: on the 2-core Intel VM, a `join` of two 50 µs halves took 114–141 µs once the
//! caller had worked alone for 50 µs–1 ms before it (the sleeping thread's half started 60–90 µs
//! late, so the caller ran both) and 53–55 µs with a thread kept looking. A training step is
//! hundreds of such kernels with the caller's own work between them. The thread looks by
//! `rayon::yield_now` in a loop without `pause` instructions (a hypervisor may take a loop of
//! `pause` for a vCPU waiting on a lock and stop running it: with `pause` in the loop the same
//! joins took as long as with no one looking). Which thread runs what, never what is computed:
//! no result depends on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One pool's waking state, shared by the library's clones.
#[derive(Debug)]
pub(crate) struct Warm {
    /// How long a thread keeps looking after the pool's last work.
    keep: Duration,
    /// When `last` counts from.
    base: Instant,
    /// Nanoseconds from `base` to the pool's last work.
    last: AtomicU64,
    /// Whether a thread is looking now (one at a time).
    looking: AtomicBool,
    /// Whether the pool's first thread is a caller's own (`HostOptions::this_thread`), which runs
    /// no loop of its own and must never be the one looking.
    first_is_callers: bool,
    /// Lookers started, for the tests.
    #[cfg(test)]
    starts: std::sync::atomic::AtomicUsize,
}

impl Warm {
    /// A state that keeps a thread looking for `keep` after the last work (none for zero), never
    /// the pool's first thread where it is a caller's own (`first_is_callers`).
    pub(crate) fn new(keep: Duration, first_is_callers: bool) -> Warm {
        Warm {
            keep,
            base: Instant::now(),
            last: AtomicU64::new(0),
            looking: AtomicBool::new(false),
            first_is_callers,
            #[cfg(test)]
            starts: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Notes work that just ran on `pool` and, where no thread is looking, asks one of the pool's
    /// threads — not the caller's, nor a first thread that is a caller's own — to look for the
    /// next work for `keep`.
    ///
    /// The request is a job spawned on the pool (from one of its threads onto that thread's queue,
    /// where the others steal it; pushing it wakes a sleeper): a job every thread that runs the
    /// pool's loop takes in time, so none is left behind when the pool ends (rayon ends a pool's
    /// threads once its spawned jobs have run). A thread that must not look returns from it at once.
    pub(crate) fn after(self: &Arc<Self>, pool: &rayon::ThreadPool) {
        let caller = pool.current_thread_index();
        if self.keep.is_zero() || pool.current_num_threads() < 2 {
            return;
        }
        self.last.store(self.now(), Ordering::Relaxed);
        if self.looking.load(Ordering::Relaxed) {
            return;
        }
        let warm = Arc::clone(self);
        pool.spawn(move || {
            let me = rayon::current_thread_index();
            let barred = me == caller || (warm.first_is_callers && me == Some(0));
            if barred || warm.looking.swap(true, Ordering::Acquire) {
                return;
            }
            #[cfg(test)]
            warm.starts.fetch_add(1, Ordering::Relaxed);
            let keep = u64::try_from(warm.keep.as_nanos()).unwrap_or(u64::MAX);
            loop {
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => warm.last.store(warm.now(), Ordering::Relaxed),
                    Some(rayon::Yield::Idle)
                        if warm.now().saturating_sub(warm.last.load(Ordering::Relaxed)) <= keep => {}
                    _ => break,
                }
            }
            warm.looking.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 10 s for `cond`.
    fn within(cond: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// After work on the pool (called from one of its threads or from outside), a thread looks
    /// until `keep` has passed with no work, then stops; with a pool of one thread or `keep`
    /// zero, none looks.
    #[test]
    fn a_thread_looks_after_work_on_the_pool_then_sleeps() {
        let looking = |w: &Warm| w.looking.load(Ordering::Acquire);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let warm = Arc::new(Warm::new(Duration::from_millis(30), false));
        // the caller goes on working after its call (a program on the pool's thread), and
        // another thread takes the request
        let work_on = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::black_box(0);
            }
        };
        pool.install(|| {
            warm.after(&pool);
            work_on(Duration::from_millis(5));
        });
        assert!(within(|| looking(&warm)), "no thread looked for work");
        // work run meanwhile keeps it looking; then it stops
        for _ in 0..5 {
            pool.install(|| {
                rayon::join(|| std::hint::black_box(1), || std::hint::black_box(2));
                warm.after(&pool);
                work_on(Duration::from_millis(1));
            });
        }
        assert!(within(|| !looking(&warm)), "the looking thread never stopped");
        // called from outside the pool
        warm.after(&pool);
        assert!(within(|| looking(&warm)), "no thread looked after a call from outside");
        assert!(within(|| !looking(&warm)), "the looking thread never stopped");
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let none = Arc::new(Warm::new(Duration::ZERO, false));
        let started = warm.starts.load(Ordering::Relaxed);
        for (w, p) in [(&warm, &one), (&none, &pool)] {
            p.install(|| w.after(p));
            w.after(p);
            std::thread::sleep(Duration::from_millis(20));
            assert!(!looking(w));
        }
        assert_eq!((warm.starts.load(Ordering::Relaxed), none.starts.load(Ordering::Relaxed)), (started, 0));
    }
}
