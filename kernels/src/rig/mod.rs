//! Devices as running things: a [`Rig`] is a device's timeline and its caching pool (the
//! reference's `Rig.t`; [`nx_mesh::Device`] stays the identity).
//!
//! A rig's work runs on its timeline. The **host** rig runs work at once, on the calling thread. A
//! **queued** rig ([`Rig::queued`]) has a worker thread that runs its work in submission order,
//! after an optional random delay an item — the stand-in for a GPU stream, so that ordering bugs
//! show on CPUs: a kernel on a queued rig answers `Done` once its work is *queued*.
//! [`Rig::submit`] names the buffers work reads and writes; the model orders the work after every
//! earlier work that writes what it reads or touches what it writes, on any rig (an event of
//! another timeline waited for first); every host access of a buffer (reading its elements,
//! lending them, transferring them) waits for the work pending on its memory first
//! ([`crate::Buffer::wait`]). A rig whose work fails or panics is lost ([`Lost`]): that work and
//! every later work of the rig fail, and so does every access that must follow them; a rig whose
//! work must follow lost work is lost too (it can no longer vouch for what its buffers hold, as a
//! CUDA error ends its context). No wait hangs, and a rig's last handle may end on any thread,
//! a worker's included: its worker finishes the work left and ends on its own.
//!
//! Buffers come from the rig's caching pool ([`Rig::alloc`]): size classes, kinds of memory kept
//! apart ([`crate::MemoryKind`]), a memory limit passed explicitly ([`RigOptions::limit`]), and
//! statistics ([`PoolStats`]). Submitted work holds its buffers until it has run, so a block
//! returns to the cache only once no work touches it, and is reused at once.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use nx_kernels::{Array, Host, Kernels, Prog, Dtype};
//! use nx_kernels::rig::{QueueOptions, Rig, RigOptions};
//! use nx_mesh::Device;
//!
//! let rig = Rig::new(Device::sim(0), RigOptions { queue: Some(QueueOptions { delay: Duration::from_millis(1), seed: 7 }), ..RigOptions::default() })?;
//! let x = Array::<f32>::from_vec_on(&rig, &[4], vec![1.0, 2.0, 3.0, 4.0])?;
//! let y = Array::<f32>::zeros_on(&rig, &[4])?;
//! let mut p = Prog::new(&[Dtype::F32]);
//! let l = p.load(0);
//! let d = p.add(l, l);
//! p.output(d);
//! assert_eq!(Host::new().map(&p, &[4], &[&y], &[&x]), nx_kernels::Answer::Done); // queued
//! assert_eq!(y.to_vec()?, [2.0, 4.0, 6.0, 8.0]); // the read waits for it
//! # Ok::<(), nx_kernels::Error>(())
//! ```

mod pool;
mod timeline;

use std::sync::Arc;
use std::time::Duration;

use nx_mesh::Device;

pub use pool::PoolStats;
pub use timeline::{Event, Lost, Work};

use crate::buffer::{Buffer, MemoryKind};
use crate::{Error, Result};

pub(crate) use pool::Pool;
use timeline::Timeline;

/// How a queued rig runs its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueOptions {
    /// Each item waits up to this long before it runs (a share drawn from `seed`): zero for
    /// none.
    pub delay: Duration,
    /// The seed of the delays.
    pub seed: u64,
}

/// Settings of a rig, passed explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RigOptions {
    /// A queued timeline (`None`: work runs at once, on the host).
    pub queue: Option<QueueOptions>,
    /// The most bytes its buffers may hold at once (their classes), as a card of that size
    /// would (`None`: the system's).
    pub limit: Option<usize>,
    /// A dry rig, for dry runs: its pool accounts every block as any pool does, but a large
    /// block is address space alone (pages exist only where something writes), and its memory
    /// holds unspecified values — nothing zeroes it, and nx writes nothing to it (kernels are
    /// checked, not run; collectives and fills move no bytes): a program larger than this
    /// machine's memory runs dry in a little of it.
    pub dry: bool,
}

struct Inner {
    device: Device,
    timeline: Option<Timeline>,
    pool: Arc<Pool>,
    dry: bool,
}

/// A device with its timeline and caching pool. Cloning shares it; see the
/// [module documentation](self).
#[derive(Clone)]
pub struct Rig {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rig({}, {})", self.inner.device, if self.is_queued() { "queued" } else { "host" })
    }
}

impl PartialEq for Rig {
    /// The same rig (not merely the same device identity).
    fn eq(&self, other: &Rig) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Rig {
    /// A rig for `device` with `opts`.
    ///
    /// # Errors
    /// [`Error::NotCompiled`] for a device whose memory the host does not address (CUDA: not
    /// built yet); [`Error::Invalid`] where the timeline's thread cannot start.
    pub fn new(device: Device, opts: RigOptions) -> Result<Rig> {
        const FUNC: &str = "nx_kernels::Rig::new";
        if !device.kind.is_host() {
            return Err(Error::NotCompiled { func: FUNC, feature: "cuda", device: device.to_string() });
        }
        let timeline = match opts.queue {
            Some(q) => Some(Timeline::new(device, q.delay, q.seed).map_err(|e| Error::Invalid {
                func: FUNC,
                why: format!("the timeline of {device} cannot start: {e}"),
            })?),
            None => None,
        };
        let pool = Pool::new(device, opts.limit, opts.dry);
        Ok(Rig { inner: Arc::new(Inner { device, timeline, pool, dry: opts.dry }) })
    }

    /// The host rig of `device`: work runs at once; no limit.
    ///
    /// # Errors
    /// As [`Rig::new`].
    pub fn host(device: Device) -> Result<Rig> {
        Rig::new(device, RigOptions::default())
    }

    /// A queued rig of `device` whose items each wait up to `delay` (drawn from `seed`).
    ///
    /// # Errors
    /// As [`Rig::new`].
    pub fn queued(device: Device, delay: Duration, seed: u64) -> Result<Rig> {
        Rig::new(device, RigOptions { queue: Some(QueueOptions { delay, seed }), ..RigOptions::default() })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Whether its work is queued (else it runs at once).
    pub fn is_queued(&self) -> bool {
        self.inner.timeline.is_some()
    }

    /// Whether it is a dry rig ([`RigOptions::dry`]): its memory's values are unspecified and
    /// nothing writes them.
    pub fn is_dry(&self) -> bool {
        self.inner.dry
    }

    /// `host` or `queued`, as the examples print it.
    pub fn timing(&self) -> &'static str {
        if self.is_queued() {
            "queued"
        } else {
            "host"
        }
    }

    /// Runs `work` on this rig after every earlier work its access must follow: the work that
    /// writes what it `reads`, and the work that reads or writes what it `writes`, on any rig.
    /// On the host rig it waits for that work and runs at once; on a queued rig it is queued.
    /// Answers the work's event (`None` where it ran at once). The work keeps the buffers alive
    /// until it has run. The caller holds the claims that make the buffers' pending work stable
    /// (the door's).
    ///
    /// # Errors
    /// [`Error::Lost`] where this rig is lost, or (at once) the work it must follow is; the
    /// work's own failure, where it ran at once.
    pub fn submit(&self, reads: &[&Buffer], writes: &[&Buffer], work: Work) -> Result<Option<Event>> {
        let mut deps: Vec<Event> = Vec::new();
        for b in reads {
            deps.extend(b.pending_events(false));
        }
        for b in writes {
            deps.extend(b.pending_events(true));
        }
        match &self.inner.timeline {
            None => {
                for e in &deps {
                    e.wait().map_err(|l| lost("nx_kernels::Rig::submit", l))?;
                }
                work().map_err(|why| Error::Invalid { func: "nx_kernels::Rig::submit", why })?;
                Ok(None)
            }
            Some(t) => {
                // the timeline orders its own items: only other timelines' events are waited for
                deps.retain(|e| !t.owns(e) && !e.is_done());
                // the work keeps its buffers (their memory) until it has run
                let keep: Vec<Buffer> = reads.iter().chain(writes).map(|b| (*b).clone()).collect();
                let work: Work = Box::new(move || {
                    let r = work();
                    drop(keep);
                    r
                });
                let e = t.submit(deps, work).map_err(|l| lost("nx_kernels::Rig::submit", l))?;
                for b in reads {
                    b.note_pending(&e, false);
                }
                for b in writes {
                    b.note_pending(&e, true);
                }
                Ok(Some(e))
            }
        }
    }

    /// Blocks until every work submitted so far has ended.
    ///
    /// # Errors
    /// [`Error::Lost`] where the rig is lost.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(e) = self.inner.timeline.as_ref().and_then(Timeline::last) {
            e.wait().map_err(|l| lost("nx_kernels::Rig::synchronize", l))?;
        }
        match self.inner.timeline.as_ref().and_then(Timeline::lost) {
            Some(why) => Err(lost("nx_kernels::Rig::synchronize", Lost { device: self.device(), why })),
            None => Ok(()),
        }
    }

    /// Loses the rig (a device that stopped answering): its work that has not started fails
    /// (an item waiting out its delay included; one running ends first), and so does every later
    /// submission and every access that must follow them. The host rig cannot be
    /// lost (its work ran already).
    pub fn lose(&self, why: &str) {
        if let Some(t) = &self.inner.timeline {
            t.lose(why);
        }
    }

    /// Why the rig is lost, if it is.
    pub fn lost(&self) -> Option<String> {
        self.inner.timeline.as_ref().and_then(Timeline::lost)
    }

    /// The pool's statistics.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// Gives the cached blocks whose work is done back to the system; answers the bytes freed.
    pub fn trim(&self) -> usize {
        self.inner.pool.trim()
    }

    /// A buffer of `bytes` zeroed bytes from the pool.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the device, the request and what is in use, past the
    /// limit or where the system refuses.
    pub fn alloc(&self, bytes: usize) -> Result<Buffer> {
        Buffer::from_pool(self, bytes, MemoryKind::Device, true)
    }

    /// As [`Rig::alloc`], of memory of `kind` (a block of one kind never serves another).
    ///
    /// # Errors
    /// As [`Rig::alloc`].
    pub fn alloc_in(&self, kind: MemoryKind, bytes: usize) -> Result<Buffer> {
        Buffer::from_pool(self, bytes, kind, true)
    }

    /// A buffer of `bytes` bytes from the pool whose contents are unspecified (those of a block
    /// reused, or zeros): for outputs a kernel writes whole. Its dtype must take every bit pattern
    /// (not `bool`).
    ///
    /// # Errors
    /// As [`Rig::alloc`].
    pub fn alloc_uninit(&self, bytes: usize) -> Result<Buffer> {
        Buffer::from_pool(self, bytes, MemoryKind::Device, false)
    }

    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.inner.pool
    }
}

/// The error of an access that must follow a lost rig's work.
pub(crate) fn lost(func: &'static str, l: Lost) -> Error {
    Error::Lost { func, device: l.device.to_string(), why: l.why }
}
