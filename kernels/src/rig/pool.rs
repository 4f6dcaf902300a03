//! A device's caching pool: host memory in size classes, kept when a buffer dies and handed to a
//! later allocation of its class once the work pending on it allows — at once for work of the
//! allocating device's own timeline (stream-ordered reuse, as PyTorch's caching allocator and
//! `cudaMallocAsync` do: the new buffer's work queues after it), after that work otherwise (the new
//! buffer inherits the events, and every access of it follows them). A limit refuses what a card
//! of that size would; cached blocks are released first.
//!
//! Classes: 512 bytes and up in powers of two below 1 MiB, then multiples of 2 MiB (the huge-page
//! size); a request takes a block of its class or of up to a quarter more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use nx_mesh::Device;

use super::timeline::Event;
use crate::buffer::{alloc_raw, free_raw, MemoryKind, Raw};
use crate::{Error, Result};

/// What a pool holds, in bytes, and how often it went to the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes of live buffers (their classes).
    pub in_use: usize,
    /// Bytes cached for reuse.
    pub cached: usize,
    /// The most `in_use` has been.
    pub peak: usize,
    /// Allocations from the system (a mapping or the allocator).
    pub fresh: usize,
    /// Allocations served from the cache.
    pub reused: usize,
    /// Blocks given back to the system to make room under the limit.
    pub released: usize,
}

/// A cached block and the work that may still touch it.
struct Block {
    raw: Raw,
    ready: Vec<Event>,
}

// SAFETY: a cached block is memory no buffer holds; only the pool touches it, under its lock.
unsafe impl Send for Block {}

#[derive(Default)]
struct State {
    /// Cached blocks by kind and class.
    free: BTreeMap<(MemoryKind, usize), Vec<Block>>,
    stats: PoolStats,
}

/// One device's pool, shared by its rig and the memory it lent.
pub(crate) struct Pool {
    device: Device,
    limit: Option<usize>,
    state: Mutex<State>,
}

/// The class of a request of `bytes`.
pub(crate) fn class(bytes: usize) -> Option<usize> {
    const SMALL: usize = 1 << 20;
    const LARGE: usize = 2 << 20;
    if bytes <= SMALL {
        Some(bytes.max(512).next_power_of_two())
    } else {
        bytes.checked_next_multiple_of(LARGE)
    }
}

impl Pool {
    pub(crate) fn new(device: Device, limit: Option<usize>) -> Arc<Pool> {
        Arc::new(Pool { device, limit, state: Mutex::new(State::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// A block of `kind` of at least `bytes`, the events its new buffer must follow, and whether it is fresh
    /// from the system (zero): a cached block of the class (or up to a quarter larger) whose work
    /// is done or lies on `own`'s timeline, else fresh memory (cached blocks released first where
    /// the limit needs room).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the device, the request and what is in use, past the limit
    /// or where the system refuses.
    pub(crate) fn take(&self, kind: MemoryKind, bytes: usize, own: Option<&Event>) -> Result<(Raw, Vec<Event>, bool)> {
        let func = "nx_kernels::Rig::alloc";
        let oom = |st: &State, why: &str| Error::OutOfMemory {
            func,
            bytes,
            device: Some(self.device.to_string()),
            why: format!("{why}; {} B in use, {} B cached", st.stats.in_use, st.stats.cached),
        };
        let mut st = self.lock();
        let Some(c) = class(bytes) else { return Err(oom(&st, "no class holds it")) };
        // a cached block: its work done, or ordered before the new buffer's by the timeline
        let usable = |b: &Block| b.ready.iter().all(|e| e.is_ended() || own.is_some_and(|o| o.same_timeline(e)));
        let upper = if c <= 1 << 20 { c } else { c + c / 4 };
        let found =
            st.free.range_mut((kind, c)..=(kind, upper)).find_map(|(&k, v)| v.iter().position(usable).map(|i| (k, i)));
        if let Some((key, i)) = found {
            let k = key.1;
            let blocks = st.free.get_mut(&key).expect("found above");
            let b = blocks.swap_remove(i);
            if blocks.is_empty() {
                st.free.remove(&key);
            }
            st.stats.cached -= k;
            st.stats.in_use += k;
            st.stats.peak = st.stats.peak.max(st.stats.in_use);
            st.stats.reused += 1;
            let ready = b.ready.into_iter().filter(|e| !e.is_ended()).collect();
            return Ok((b.raw, ready, false));
        }
        // fresh memory, under the limit: cached blocks whose work is done go first
        if let Some(limit) = self.limit {
            if st.stats.in_use.saturating_add(c) > limit {
                return Err(oom(&st, &format!("past the limit of {limit} B")));
            }
            while st.stats.in_use + st.stats.cached + c > limit {
                if !release_one(&mut st) {
                    break;
                }
            }
            if st.stats.in_use + st.stats.cached + c > limit {
                return Err(oom(&st, &format!("past the limit of {limit} B, the cache busy")));
            }
        }
        let raw = match alloc_raw(c) {
            Some(r) => r,
            None => {
                // the system refused: release the cache and try once more
                while release_one(&mut st) {}
                alloc_raw(c).ok_or_else(|| oom(&st, "the system refused"))?
            }
        };
        st.stats.in_use += c;
        st.stats.peak = st.stats.peak.max(st.stats.in_use);
        st.stats.fresh += 1;
        Ok((raw, Vec::new(), true))
    }

    /// Takes back the block of a dead buffer, with the work that may still touch it.
    pub(crate) fn give(&self, kind: MemoryKind, raw: Raw, ready: Vec<Event>) {
        let c = raw.bytes();
        let mut st = self.lock();
        st.stats.in_use -= c;
        st.stats.cached += c;
        st.free.entry((kind, c)).or_default().push(Block { raw, ready });
    }

    /// Gives every cached block whose work is done back to the system; answers the bytes freed.
    pub(crate) fn trim(&self) -> usize {
        let mut st = self.lock();
        let before = st.stats.cached;
        while release_one(&mut st) {}
        before - st.stats.cached
    }
}

/// Gives the largest cached block whose work is done back to the system; `false` for none.
fn release_one(st: &mut State) -> bool {
    let found = st
        .free
        .iter()
        .filter(|(_, v)| v.iter().any(|b| b.ready.iter().all(Event::is_ended)))
        .max_by_key(|(&(_, c), _)| c)
        .and_then(|(&key, v)| v.iter().position(|b| b.ready.iter().all(Event::is_ended)).map(|i| (key, i)));
    let Some((key, i)) = found else { return false };
    let k = key.1;
    let blocks = st.free.get_mut(&key).expect("found above");
    let b = blocks.swap_remove(i);
    if blocks.is_empty() {
        st.free.remove(&key);
    }
    st.stats.cached -= k;
    st.stats.released += 1;
    free_raw(b.raw);
    true
}

impl Drop for Pool {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, blocks) in std::mem::take(&mut st.free) {
            for b in blocks {
                // a dying pool's blocks: their work ended with the timeline before it
                for e in &b.ready {
                    let _ = e.wait();
                }
                free_raw(b.raw);
            }
        }
    }
}
