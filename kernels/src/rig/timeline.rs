//! A queued timeline: one worker thread runs a device's submitted work in submission order, each
//! item after the events it must follow (on any timeline) and after an optional random delay, so
//! that work really runs after the call that submitted it — the stand-in for a GPU stream.
//!
//! An item that fails or panics loses the device: it and every item after it fail without
//! running, and every event from it on answers [`Lost`]; so does an item that must follow work a
//! lost device did not finish. Waiting never hangs on a lost device.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use nx_mesh::Device;

/// Work on a timeline: it answers why it failed, if it did.
pub type Work = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// A device is lost: the work an access or a call must follow will never be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{device} is lost: {why}")]
pub struct Lost {
    /// The lost device.
    pub device: Device,
    /// Why it was lost.
    pub why: String,
}

struct Item {
    seq: u64,
    deps: Vec<Event>,
    delay: Duration,
    work: Work,
}

struct State {
    items: VecDeque<Item>,
    /// Items submitted, and items ended (run, failed or skipped), in order.
    submitted: u64,
    ended: u64,
    /// The first item that did not run to its end, and why.
    lost: Option<(u64, String)>,
    stop: bool,
}

/// The shared state of one queued timeline.
pub(crate) struct Queue {
    device: Device,
    state: Mutex<State>,
    /// The worker waits here for items; waiters for ends.
    work: Condvar,
    ended: Condvar,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // a poisoned lock only means a panic elsewhere while it was held; the state stays valid
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A point on a timeline: done once the item submitted there (and everything before it) has
/// ended. Cloning shares it.
#[derive(Clone)]
pub struct Event {
    queue: Arc<Queue>,
    seq: u64,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({} #{})", self.queue.device, self.seq)
    }
}

impl Event {
    /// Whether the work up to this event has run to its end (a lost device's never is).
    pub fn is_done(&self) -> bool {
        let st = lock(&self.queue.state);
        st.ended >= self.seq && st.lost.as_ref().is_none_or(|(at, _)| *at > self.seq)
    }

    /// Whether the work up to this event has ended, run or failed: no work of it touches memory
    /// any more.
    pub fn is_ended(&self) -> bool {
        lock(&self.queue.state).ended >= self.seq
    }

    /// The device of the event's timeline.
    pub fn device(&self) -> Device {
        self.queue.device
    }

    /// Whether `self` and `other` lie on one timeline.
    pub(crate) fn same_timeline(&self, other: &Event) -> bool {
        Arc::ptr_eq(&self.queue, &other.queue)
    }

    /// Whether this event comes at or after `other` on their one timeline.
    pub(crate) fn covers(&self, other: &Event) -> bool {
        self.same_timeline(other) && self.seq >= other.seq
    }

    /// Blocks until the work up to this event has ended.
    ///
    /// # Errors
    /// [`Lost`] where the device was lost at or before this event.
    pub fn wait(&self) -> Result<(), Lost> {
        let q = &*self.queue;
        let mut st = lock(&q.state);
        while st.ended < self.seq {
            st = q.ended.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &st.lost {
            Some((at, why)) if *at <= self.seq => Err(Lost { device: q.device, why: why.clone() }),
            _ => Ok(()),
        }
    }
}

/// A queued timeline. Its worker runs detached and ends once the timeline is dropped and its work
/// done.
pub(crate) struct Timeline {
    queue: Arc<Queue>,
    /// Per-item delays: at most this long, drawn from `seed`.
    delay: Duration,
    draws: Mutex<u64>,
}

impl Timeline {
    /// A timeline for `device` whose items each wait up to `delay` (a random share of it, from
    /// `seed`) before they run.
    pub(crate) fn new(device: Device, delay: Duration, seed: u64) -> std::io::Result<Timeline> {
        let queue = Arc::new(Queue {
            device,
            state: Mutex::new(State { items: VecDeque::new(), submitted: 0, ended: 0, lost: None, stop: false }),
            work: Condvar::new(),
            ended: Condvar::new(),
        });
        let q = queue.clone();
        // detached: see `Drop`
        std::thread::Builder::new().name(format!("nx-timeline-{device}")).spawn(move || run(&q))?;
        Ok(Timeline { queue, delay, draws: Mutex::new(seed) })
    }

    /// Queues `work` after the events `deps`; answers its event.
    ///
    /// # Errors
    /// [`Lost`] where the device is lost already (nothing is queued).
    pub(crate) fn submit(&self, deps: Vec<Event>, work: Work) -> Result<Event, Lost> {
        let q = &*self.queue;
        let mut st = lock(&q.state);
        if let Some((_, why)) = &st.lost {
            return Err(Lost { device: q.device, why: why.clone() });
        }
        // drawn under the queue's lock: the n-th item submitted gets the n-th draw
        let delay = self.draw();
        st.submitted += 1;
        let seq = st.submitted;
        st.items.push_back(Item { seq, deps, delay, work });
        drop(st);
        q.work.notify_one();
        Ok(Event { queue: self.queue.clone(), seq })
    }

    /// Whether `e` lies on this timeline.
    pub(crate) fn owns(&self, e: &Event) -> bool {
        Arc::ptr_eq(&self.queue, &e.queue)
    }

    /// The event of the last item submitted (`None`: none yet).
    pub(crate) fn last(&self) -> Option<Event> {
        let seq = lock(&self.queue.state).submitted;
        (seq > 0).then(|| Event { queue: self.queue.clone(), seq })
    }

    /// Loses the device: the items not yet ended fail, and so does every later submission.
    pub(crate) fn lose(&self, why: &str) {
        let q = &*self.queue;
        let mut st = lock(&q.state);
        if st.lost.is_none() {
            let at = st.ended + 1;
            st.lost = Some((at, why.to_string()));
        }
        drop(st);
        q.work.notify_one();
    }

    /// Why the device is lost, if it is.
    pub(crate) fn lost(&self) -> Option<String> {
        lock(&self.queue.state).lost.as_ref().map(|l| l.1.clone())
    }

    /// A delay of up to `self.delay` (splitmix64 of the draws).
    fn draw(&self) -> Duration {
        if self.delay.is_zero() {
            return Duration::ZERO;
        }
        let mut d = self.draws.lock().unwrap_or_else(|e| e.into_inner());
        *d = d.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *d;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        self.delay.mul_f64((z >> 11) as f64 / (1u64 << 53) as f64)
    }
}

impl Drop for Timeline {
    /// Stops the worker once its queue is empty, without waiting for it: the last handle of a rig
    /// may end on any thread, its own worker's or another rig's included (an item's buffers name
    /// their rigs), and a worker waiting on that thread's work would never end. The items left
    /// hold their buffers and run; the worker then ends on its own.
    fn drop(&mut self) {
        lock(&self.queue.state).stop = true;
        self.queue.work.notify_one();
    }
}

/// The worker: runs items in order until the timeline stops and is empty.
fn run(q: &Queue) {
    loop {
        let item = {
            let mut st = lock(&q.state);
            loop {
                if let Some(i) = st.items.pop_front() {
                    break i;
                }
                if st.stop {
                    return;
                }
                st = q.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        // the events it must follow, on any timeline
        let mut failed = item.deps.iter().find_map(|d| d.wait().err()).map(|l| format!("it must follow work on {}", l));
        if !item.delay.is_zero() && failed.is_none() {
            std::thread::sleep(item.delay);
        }
        // a device lost before the item runs (its delay included) never runs it
        if failed.is_none() && lock(&q.state).lost.is_none() {
            failed = match std::panic::catch_unwind(AssertUnwindSafe(item.work)) {
                Ok(Ok(())) => None,
                Ok(Err(why)) => Some(why),
                Err(p) => Some(format!(
                    "its work panicked: {}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
            };
        }
        let mut st = lock(&q.state);
        if let (Some(why), None) = (failed, &st.lost) {
            st.lost = Some((item.seq, why));
        }
        st.ended = item.seq;
        drop(st);
        q.ended.notify_all();
    }
}
