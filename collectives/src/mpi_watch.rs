//! The MPI backend's watchdog: MPI's own calls block until their peers answer, and a peer whose
//! host or link is gone never does (TCP retries for many minutes). Each collective arms the
//! watch with its deadline while it is inside MPI's calls; a call still inside past it is
//! reported on stderr as a timeout naming the members it waited for, and the process aborts
//! (SIGABRT), which `mpirun` and `nx run` see as the rank failing — the run stops, never hangs.
//! The fingerprint exchange before the data has its own deadline and fails with an error; this
//! watch covers what follows it, in checked and unchecked mode alike.

use std::io::Write as _;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the watch waits on: the call inside MPI now, if any.
#[derive(Debug)]
struct Armed {
    /// A sequence number: a disarm ends only its own arming.
    id: u64,
    until: Instant,
    since: Instant,
    /// The timeout's report, less the seconds waited.
    what: String,
}

#[derive(Debug, Default)]
struct State {
    armed: Option<Armed>,
    next: u64,
    /// The thread waits with no deadline: an arming must wake it (otherwise it wakes at the
    /// deadline it waits for, which no later arming moves earlier).
    idle: bool,
}

/// A process's watch over its blocking MPI calls (a thread that sleeps until a deadline).
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    shared: Arc<(Mutex<State>, Condvar)>,
}

/// Disarms the watch when dropped.
#[must_use = "the watch is disarmed when its guard drops"]
pub(crate) struct Guard<'a> {
    watch: &'a Watch,
    id: u64,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut s = self.watch.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.armed.as_ref().is_some_and(|a| a.id == self.id) {
            s.armed = None;
        }
    }
}

impl Watch {
    /// A watch and its thread (which lives as long as the process).
    pub(crate) fn new() -> Watch {
        let shared: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new().name("nx-mpi-watch".into()).spawn(move || {
            let (lock, cv) = &*theirs;
            let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let now = Instant::now();
                s = match &s.armed {
                    None => {
                        s.idle = true;
                        let mut s = cv.wait(s).unwrap_or_else(|e| e.into_inner());
                        s.idle = false;
                        s
                    }
                    Some(a) if now >= a.until => {
                        let waited = now.duration_since(a.since).as_secs_f64();
                        let mut err = std::io::stderr().lock();
                        let _ = writeln!(err, "{}", a.what.replace("{waited}", &format!("{waited:.1}")));
                        let _ = err.flush();
                        std::process::abort();
                    }
                    Some(a) => {
                        let left = a.until - now;
                        cv.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0
                    }
                };
            }
        });
        if let Err(e) = spawned {
            // without its thread the watch only records; MPI's calls still run
            eprintln!("nx: the MPI watchdog cannot start ({e}): a lost peer may hang this rank");
        }
        Watch { shared }
    }

    /// Arms the watch for `timeout` while the guard lives; `what` is the report, in which
    /// `{waited}` becomes the seconds waited.
    pub(crate) fn arm(&self, timeout: Duration, what: String) -> Guard<'_> {
        let (lock, cv) = &*self.shared;
        let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
        let id = s.next;
        s.next += 1;
        let since = Instant::now();
        s.armed = Some(Armed { id, until: since + timeout, since, what });
        if s.idle {
            cv.notify_one();
        }
        Guard { watch: self, id }
    }
}
