//! A device's caching pool: host memory in size classes, kept when a buffer's memory ends and
//! handed to a later allocation of its class.
//!
//! A block enters the cache only once no work can touch it: work submitted to a rig holds its
//! buffers until it has run ([`super::Rig::submit`]), so the last handle of a memory ends after
//! the last work on it, and a cached block is reused at once, by any device's work. (PyTorch's
//! caching allocator and `cudaMallocAsync` also hand a block freed with work still queued on it to
//! later work of the same stream; here such a block returns to the cache when that work has run.)
//! Kinds of memory ([`MemoryKind`]) are cached apart. A limit refuses what a card of that size
//! would; cached blocks are released first.
//!
//! Classes: 512 bytes and up in powers of two up to 1 MiB, then multiples of 2 MiB (the huge-page
//! size); a request takes a block of its class, or past 1 MiB of up to a quarter more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use nx_mesh::Device;

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

/// A cached block: memory no buffer holds and no work touches.
struct Block {
    raw: Raw,
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
    /// Whether its large blocks are address space alone (a dry rig's).
    dry: bool,
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
    pub(crate) fn new(device: Device, limit: Option<usize>, dry: bool) -> Arc<Pool> {
        Arc::new(Pool { device, limit, dry, state: Mutex::new(State::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// A block of `kind` of at least `bytes`, and whether it is fresh from the system (zero): a
    /// cached block of the class (past 1 MiB, of up to a quarter more), else fresh memory (cached
    /// blocks released first where the limit needs room).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the device, the request and what is in use, past the limit
    /// or where the system refuses.
    pub(crate) fn take(&self, kind: MemoryKind, bytes: usize) -> Result<(Raw, bool)> {
        let func = "nx_kernels::Rig::alloc";
        let oom = |st: &State, why: &str| Error::OutOfMemory {
            func,
            bytes,
            device: Some(self.device.to_string()),
            why: format!("{why}; {} B in use, {} B cached", st.stats.in_use, st.stats.cached),
        };
        let mut st = self.lock();
        let Some(c) = class(bytes) else { return Err(oom(&st, "no class holds it")) };
        let upper = if c <= 1 << 20 { c } else { c + c / 4 };
        let found = st.free.range((kind, c)..=(kind, upper)).next().map(|(&key, _)| key);
        if let Some(key) = found {
            let k = key.1;
            let blocks = st.free.get_mut(&key).expect("found above");
            let b = blocks.pop().expect("classes in the map hold blocks");
            if blocks.is_empty() {
                st.free.remove(&key);
            }
            st.stats.cached -= k;
            st.stats.in_use += k;
            st.stats.peak = st.stats.peak.max(st.stats.in_use);
            st.stats.reused += 1;
            return Ok((b.raw, false));
        }
        // fresh memory, under the limit: cached blocks go first
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
                return Err(oom(&st, &format!("past the limit of {limit} B")));
            }
        }
        let raw = match alloc_raw(c, !self.dry) {
            Some(r) => r,
            None => {
                // the system refused: release the cache and try once more
                while release_one(&mut st) {}
                alloc_raw(c, !self.dry).ok_or_else(|| oom(&st, "the system refused"))?
            }
        };
        st.stats.in_use += c;
        st.stats.peak = st.stats.peak.max(st.stats.in_use);
        st.stats.fresh += 1;
        Ok((raw, true))
    }

    /// Takes back the block of a memory whose last handle ended (no work touches it any more).
    pub(crate) fn give(&self, kind: MemoryKind, raw: Raw) {
        let c = raw.bytes();
        let mut st = self.lock();
        st.stats.in_use -= c;
        st.stats.cached += c;
        st.free.entry((kind, c)).or_default().push(Block { raw });
    }

    /// Gives every cached block back to the system; answers the bytes freed.
    pub(crate) fn trim(&self) -> usize {
        let mut st = self.lock();
        let before = st.stats.cached;
        while release_one(&mut st) {}
        before - st.stats.cached
    }
}

/// Gives the largest cached block back to the system; `false` for none.
fn release_one(st: &mut State) -> bool {
    let Some((&key, _)) = st.free.iter().max_by_key(|(&(_, c), _)| c) else { return false };
    let blocks = st.free.get_mut(&key).expect("found above");
    let b = blocks.pop().expect("classes in the map hold blocks");
    if blocks.is_empty() {
        st.free.remove(&key);
    }
    st.stats.cached -= key.1;
    st.stats.released += 1;
    free_raw(b.raw);
    true
}

impl Drop for Pool {
    /// Frees the cached blocks, which no work touches; never waits.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, blocks) in std::mem::take(&mut st.free) {
            for b in blocks {
                free_raw(b.raw);
            }
        }
    }
}
