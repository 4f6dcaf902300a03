//! Buffers: memory on a device, alive or dead, read-only or read-write, claimed at run time.
//!
//! A [`Buffer`] is a shared handle (cloning shares it): the arrays over it are views. Its life —
//! alive, or dead with the reason it died — is per buffer; its claims are per *memory*, shared by
//! every buffer over the same bytes ([`Buffer::read_only`], [`Buffer::donate`]), so that no two
//! handles can lend a `&[T]` and a `&mut [T]` of the same bytes at once. Each lives behind its
//! own lock; no state is global. Claims are taken only by [`crate::door`] (and the array functions
//! built on it): *shared* for reads, *exclusive* for writes, all of one call or none.
//!
//! Host memory (devices of kind `sim` and `cpu`) is allocated zeroed and aligned to 64 bytes. CUDA
//! memory comes later through the same type; a buffer of a device this process does not address
//! can be described with [`Buffer::unaddressed`], which host kernels refuse as off-host.

use std::alloc::{self, Layout as AllocLayout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use nx_mesh::Device;

use crate::rig::{Event, Pool, Rig};
use crate::{Error, Result};

/// The alignment of host memory, in bytes.
pub const HOST_ALIGN: usize = 64;

/// Host buffers of at least this many bytes are mapped from the kernel directly (on Linux) and
/// asked for transparent huge pages (`madvise(MADV_HUGEPAGE)`): streaming over them measured
/// 10–40% faster on this project's virtual machines, reads most, as TLB misses (two-level page
/// walks under a hypervisor) fall 512-fold. Their pages are zero until written, as
/// `alloc_zeroed`'s are.
pub const HUGE_MIN: usize = 4 << 20;

#[cfg(target_os = "linux")]
pub(crate) mod os {
    //! The three calls of glibc a huge-page mapping needs (and `mprotect`, for tests that place
    //! memory before an unreadable page).
    use std::ffi::{c_int, c_long, c_void};

    pub(crate) const PROT_READ_WRITE: c_int = 0x1 | 0x2;
    pub(crate) const MAP_PRIVATE_ANONYMOUS: c_int = 0x02 | 0x20;
    pub(crate) const MAP_NORESERVE: c_int = 0x4000;
    pub(crate) const MADV_HUGEPAGE: c_int = 14;

    unsafe extern "C" {
        pub(crate) fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: c_long,
        ) -> *mut c_void;
        pub(crate) fn munmap(addr: *mut c_void, len: usize) -> c_int;
        pub(crate) fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
        #[cfg(test)]
        pub(crate) fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int;
    }
}

/// What a buffer's memory admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only.
    Read,
    /// Reads and writes.
    ReadWrite,
}

/// Where a buffer's memory lies, as the reference's `Rig.Buffer.kind` says.
///
/// On host devices (kinds `sim` and `cpu`) every kind is host memory, which the host and every
/// host device address; a rig's pool keeps the kinds apart all the same, so that a block of one
/// kind never serves a request for another (as a CUDA device's must: its device memory, its
/// page-locked host memory and its mapped memory come from different allocators).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum MemoryKind {
    /// The device's own memory (the default).
    #[default]
    Device,
    /// Host memory, page-locked for the device's copies where its kind has such memory.
    Host,
    /// Host memory the device addresses through a mapping.
    Mapped,
}

/// Why a buffer died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Death {
    /// [`Buffer::free`] released it.
    Freed,
    /// An op took its memory for its output ([`Buffer::donate`]); the text names the op and its
    /// operands, as `nx::mul (f32 [3], f32 [3])`.
    DonatedTo(String),
}

impl fmt::Display for Death {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Death::Freed => f.write_str("freed"),
            Death::DonatedTo(op) => write!(f, "donated to {op}"),
        }
    }
}

/// Host memory from the system (64-byte aligned, zeroed when fresh), or lent by foreign code.
pub(crate) struct Raw {
    ptr: NonNull<u8>,
    layout: AllocLayout,
    /// Mapped by `mmap` (freed by `munmap`), not by the allocator.
    mapped: bool,
    /// Foreign memory's release (a DLPack producer's deleter), run in place of freeing it.
    release: Option<Box<dyn FnOnce() + Send>>,
}

// SAFETY: `Raw` owns its allocation; the bytes are touched only through the buffers built on it,
// under their claims, or by the pool that caches it, under its lock.
unsafe impl Send for Raw {}

impl Raw {
    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.layout.size()
    }
}

/// `bytes` (at least 1) fresh zeroed bytes from the system: from [`HUGE_MIN`] an anonymous
/// mapping asked for huge pages, else the allocator; `None` where the system refuses. A
/// `reserve`-less mapping (a dry rig's: [`crate::rig::RigOptions::dry`]) is address space alone,
/// never counted against the system's memory: its pages exist only where something writes them.
pub(crate) fn alloc_raw(bytes: usize, reserve: bool) -> Option<Raw> {
    let layout = AllocLayout::from_size_align(bytes.max(1), HOST_ALIGN).ok()?;
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_MIN {
        let flags = if reserve { os::MAP_PRIVATE_ANONYMOUS } else { os::MAP_PRIVATE_ANONYMOUS | os::MAP_NORESERVE };
        // SAFETY: an anonymous private mapping of a non-zero length; the hint only advises.
        let p = unsafe { os::mmap(std::ptr::null_mut(), layout.size(), os::PROT_READ_WRITE, flags, -1, 0) };
        // MAP_FAILED is -1; mappings are page-aligned, which HOST_ALIGN divides
        if p as isize != -1 && !p.is_null() {
            // SAFETY: the range was just mapped; a refused hint leaves ordinary pages.
            unsafe { os::madvise(p, layout.size(), os::MADV_HUGEPAGE) };
            return Some(Raw {
                ptr: NonNull::new(p.cast::<u8>()).expect("not null"),
                layout,
                mapped: true,
                release: None,
            });
        }
    }
    // SAFETY: `layout` has a non-zero size.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
    Some(Raw { ptr, layout, mapped: false, release: None })
}

/// Scratch `f32`s fresh from the system ([`alloc_raw`]: zeroed, huge pages from [`HUGE_MIN`]
/// bytes), given back when dropped. A kernel's accumulator that it writes before it reads: its
/// pages are faulted in by writes (no copy of the zero page, no shootdown of its mapping).
pub(crate) struct Fresh {
    raw: Option<Raw>,
    len: usize,
}

impl Fresh {
    /// `len` zeroed f32s; `None` where the size overflows or the system refuses.
    pub(crate) fn f32s(len: usize) -> Option<Fresh> {
        let raw = alloc_raw(len.checked_mul(4)?, true)?;
        Some(Fresh { raw: Some(raw), len })
    }

    /// Answers the elements.
    pub(crate) fn slice_mut(&mut self) -> &mut [f32] {
        let raw = self.raw.as_ref().expect("held until dropped");
        // SAFETY: the allocation holds `len` zeroed, 64-byte aligned f32s, owned by self.
        unsafe { std::slice::from_raw_parts_mut(raw.ptr.as_ptr().cast::<f32>(), self.len) }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            free_raw(raw);
        }
    }
}

/// Gives `raw` back to the system (foreign memory: back to its owner, by its release).
pub(crate) fn free_raw(mut raw: Raw) {
    if let Some(release) = raw.release.take() {
        release();
        return;
    }
    #[cfg(target_os = "linux")]
    if raw.mapped {
        // SAFETY: `ptr` was mapped with this length by `mmap` and is unmapped once, here.
        unsafe { os::munmap(raw.ptr.as_ptr().cast(), raw.layout.size()) };
        return;
    }
    // SAFETY: `ptr` was allocated with `layout` by `alloc_zeroed` and is freed once, here.
    unsafe { alloc::dealloc(raw.ptr.as_ptr(), raw.layout) }
}

/// The work a memory's accesses must follow: the last work that writes it, and the work that
/// reads it since.
#[derive(Debug, Default)]
struct Pending {
    write: Option<Event>,
    reads: Vec<Event>,
}

/// Host memory: back to its pool (or the system) when the last buffer over it goes.
struct Memory {
    raw: Option<Raw>,
    len: usize,
    kind: MemoryKind,
    /// The pool it came from, which takes it back with the work still pending on it.
    pool: Option<Arc<Pool>>,
    pending: Mutex<Pending>,
}

// SAFETY: `Memory` owns its allocation and never hands out references; every read or write of its
// bytes goes through a claim taken by the door on the buffer that holds it, which excludes
// conflicting access from other threads, or through work submitted under such claims.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared access to the pointer is mediated by claims.
unsafe impl Sync for Memory {}

impl Memory {
    fn ptr(&self) -> NonNull<u8> {
        self.raw.as_ref().expect("live memory").ptr
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let Some(raw) = self.raw.take() else { return };
        // every work that touches memory holds a handle of it ([`Rig::submit`] keeps its
        // buffers): at the last handle's end no work can touch it any more
        match &self.pool {
            Some(pool) => pool.give(self.kind, raw),
            None => free_raw(raw),
        }
    }
}

/// The claims on one memory, shared by every buffer over it.
#[derive(Debug, Default)]
struct Held {
    readers: usize,
    writer: bool,
    /// Lent to code outside the claims for good: never held exclusive again.
    exported: bool,
}

struct Inner {
    device: Device,
    bytes: usize,
    access: Access,
    memory: Option<Arc<Memory>>,
    /// The rig whose timeline runs work on the memory (`None`: the host's, at once).
    rig: Option<Rig>,
    /// The memory's claims (locked before `death` wherever both are).
    held: Arc<Mutex<Held>>,
    death: Mutex<Option<Death>>,
}

/// Memory on a device. Cloning shares the buffer; see the [module documentation](self).
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held();
        write!(
            f,
            "Buffer({} bytes on {}, {:?}, {:?}, {:?})",
            self.inner.bytes,
            self.inner.device,
            self.inner.access,
            *self.death_lock(),
            *held
        )
    }
}

impl PartialEq for Buffer {
    /// The same buffer (not merely equal bytes).
    fn eq(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Buffer {}

impl Buffer {
    /// `bytes` zeroed bytes of read-write memory on `device`.
    ///
    /// # Errors
    /// [`Error::NotCompiled`] for a CUDA device (the `cuda` feature is not built yet);
    /// [`Error::OutOfMemory`] where the allocation fails.
    pub fn new(device: Device, bytes: usize) -> Result<Buffer> {
        if !device.kind.is_host() {
            return Err(Error::NotCompiled {
                func: "nx_kernels::Buffer::new",
                feature: "cuda",
                device: device.to_string(),
            });
        }
        let raw = alloc_raw(bytes, true).ok_or_else(|| Error::OutOfMemory {
            func: "nx_kernels::Buffer::new",
            bytes,
            device: Some(device.to_string()),
            why: "the system refused".into(),
        })?;
        let memory =
            Memory { raw: Some(raw), len: bytes, kind: MemoryKind::Device, pool: None, pending: Mutex::default() };
        Ok(Buffer::from_parts(device, bytes, Access::ReadWrite, Some(Arc::new(memory)), Arc::default(), None))
    }

    /// `bytes` bytes of memory of `kind` from `rig`'s pool, zeroed where `zeroed` (else their
    /// contents are whatever the block held). No work touches a cached block, so a reused one is
    /// zeroed at once.
    pub(crate) fn from_pool(rig: &Rig, bytes: usize, kind: MemoryKind, zeroed: bool) -> Result<Buffer> {
        let (raw, fresh) = rig.pool().take(kind, bytes)?;
        // a dry rig's memory holds unspecified values: nothing writes it (not even zeros)
        if zeroed && !fresh && !rig.is_dry() {
            // SAFETY: the block holds at least `bytes` bytes and nothing else holds or touches it.
            unsafe { std::ptr::write_bytes(raw.ptr.as_ptr(), 0, bytes) };
        }
        let memory =
            Memory { raw: Some(raw), len: bytes, kind, pool: Some(rig.pool().clone()), pending: Mutex::default() };
        Ok(Buffer::from_parts(
            rig.device(),
            bytes,
            Access::ReadWrite,
            Some(Arc::new(memory)),
            Arc::default(),
            Some(rig.clone()),
        ))
    }

    /// A buffer over `bytes` bytes of host memory at `ptr` that foreign code lends (a DLPack
    /// producer's tensor): `release` runs once, when the last buffer and the last work over the
    /// memory have ended, in place of freeing it. The memory never enters a pool.
    ///
    /// # Safety
    /// `ptr` must stay valid for reads (and, for [`Access::ReadWrite`], writes) of `bytes` bytes
    /// until `release` runs, and nothing outside this buffer's claims may write it meanwhile.
    pub(crate) unsafe fn foreign(
        device: Device,
        ptr: NonNull<u8>,
        bytes: usize,
        access: Access,
        release: Box<dyn FnOnce() + Send>,
    ) -> Buffer {
        let layout = AllocLayout::from_size_align(bytes.max(1), 1).expect("a size the producer holds");
        let raw = Raw { ptr, layout, mapped: false, release: Some(release) };
        let memory =
            Memory { raw: Some(raw), len: bytes, kind: MemoryKind::Host, pool: None, pending: Mutex::default() };
        Buffer::from_parts(device, bytes, access, Some(Arc::new(memory)), Arc::default(), None)
    }

    /// Claims this buffer's memory (shared, or exclusive where `write`) until the guard drops.
    pub(crate) fn claim(&self, write: bool) -> std::result::Result<Claims, ClaimRefusal> {
        Claims::take(&[(self.clone(), if write { Claim::Exclusive } else { Claim::Shared })])
    }

    /// A buffer describing `bytes` bytes of memory on `device` that this process does not address
    /// (a peer's device, say): it has a size and a state but no host pointer, and host kernels
    /// refuse it as [`crate::Answer::OffHost`].
    pub fn unaddressed(device: Device, bytes: usize) -> Buffer {
        Buffer::from_parts(device, bytes, Access::ReadWrite, None, Arc::default(), None)
    }

    fn from_parts(
        device: Device,
        bytes: usize,
        access: Access,
        memory: Option<Arc<Memory>>,
        held: Arc<Mutex<Held>>,
        rig: Option<Rig>,
    ) -> Buffer {
        Buffer { inner: Arc::new(Inner { device, bytes, access, memory, rig, held, death: Mutex::new(None) }) }
    }

    /// A new buffer over the same memory that admits reads only. Both stay alive, and they share
    /// the memory's claims: a write through one excludes every access through the other.
    pub fn read_only(&self) -> Buffer {
        let i = &self.inner;
        Buffer::from_parts(i.device, i.bytes, Access::Read, i.memory.clone(), i.held.clone(), i.rig.clone())
    }

    // A poisoned lock only means a panic elsewhere while it was held; the state stays valid.
    fn held(&self) -> MutexGuard<'_, Held> {
        self.inner.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn death_lock(&self) -> MutexGuard<'_, Option<Death>> {
        self.inner.death.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.inner.bytes
    }

    /// What the memory admits.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The kind of the memory ([`MemoryKind::Device`] for memory from [`Buffer::new`]); `None`
    /// for memory this process does not address ([`Buffer::unaddressed`]).
    pub fn memory_kind(&self) -> Option<MemoryKind> {
        self.inner.memory.as_ref().map(|m| m.kind)
    }

    /// Whether this process's host addresses the memory.
    pub fn is_host(&self) -> bool {
        self.inner.memory.is_some()
    }

    /// Why the buffer died, or `None` while it lives.
    pub fn death(&self) -> Option<Death> {
        self.death_lock().clone()
    }

    /// Whether the buffer lives.
    pub fn is_alive(&self) -> bool {
        self.death_lock().is_none()
    }

    /// Whether some call holds the memory exclusive now (through this buffer or another over the
    /// same memory).
    pub fn is_held_exclusive(&self) -> bool {
        self.held().writer
    }

    /// Kills the buffer: its arrays are dead from now on, and its memory goes with the last handle.
    ///
    /// # Errors
    /// [`Error::Busy`] while a call holds a claim on its memory; [`Error::Dead`] if it is dead
    /// already.
    pub fn free(&self) -> Result<()> {
        self.kill("nx_kernels::Buffer::free", Death::Freed).map(|_| ())
    }

    /// Kills this buffer in favour of an op's output, which takes its memory: the returned buffer
    /// is alive over the same bytes, and arrays of this one are dead, "donated to `op`".
    ///
    /// # Errors
    /// As [`Buffer::free`].
    pub fn donate(&self, op: impl Into<String>) -> Result<Buffer> {
        self.kill("nx_kernels::Buffer::donate", Death::DonatedTo(op.into()))?;
        let i = &self.inner;
        Ok(Buffer::from_parts(i.device, i.bytes, i.access, i.memory.clone(), i.held.clone(), i.rig.clone()))
    }

    fn kill(&self, func: &'static str, why: Death) -> Result<()> {
        let held = self.held();
        let mut death = self.death_lock();
        if let Some(d) = &*death {
            return Err(Error::Dead { func, why: d.to_string() });
        }
        if held.writer || held.readers > 0 {
            return Err(Error::Busy { func, device: self.inner.device.to_string() });
        }
        *death = Some(why);
        Ok(())
    }

    /// The host address of byte 0, or `None` for memory the host does not address.
    pub(crate) fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.inner.memory.as_ref().map(|m| {
            debug_assert!(m.len >= self.inner.bytes);
            m.ptr()
        })
    }

    /// A borrow of this buffer's memory for `rig`, which maps it: a buffer on `rig` sharing the
    /// memory, its claims and its pending work (writes through either show in the other), alive
    /// however this one ends. `None` where `rig` cannot map it (memory the host does not address).
    pub fn borrow(&self, rig: &Rig) -> Option<Buffer> {
        let i = &self.inner;
        i.memory.as_ref()?;
        Some(Buffer::from_parts(rig.device(), i.bytes, i.access, i.memory.clone(), i.held.clone(), Some(rig.clone())))
    }

    /// Lends the memory to code outside the claims for good (a foreign pointer, a mapping): from
    /// now on no call holds it exclusive (writing calls are refused as `HeldExclusive`), as the
    /// reference's `Rig.Buffer.export` says. Answers once the work pending on it has ended.
    ///
    /// # Errors
    /// As [`Buffer::wait`].
    pub fn export(&self) -> Result<()> {
        self.held().exported = true;
        self.wait()
    }

    /// Whether the memory was exported ([`Buffer::export`]).
    pub fn is_exported(&self) -> bool {
        self.held().exported
    }

    /// Whether this buffer and `other` are over one memory (the same allocation, borrowed or not):
    /// positions in one are positions in the other.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        self.memory_id() == other.memory_id()
    }

    /// Whether this buffer's memory and `other`'s hold a byte in common (the same memory, or
    /// host ranges that meet).
    pub fn overlaps(&self, other: &Buffer) -> bool {
        if self.memory_id() == other.memory_id() {
            return true;
        }
        match (self.host_ptr(), other.host_ptr()) {
            (Some(a), Some(b)) => {
                let (a, b) = (a.as_ptr() as usize, b.as_ptr() as usize);
                let (la, lb) = (self.bytes(), other.bytes());
                la > 0 && lb > 0 && a < b + lb && b < a + la
            }
            _ => false,
        }
    }

    /// The rig whose timeline runs work on this memory (`None`: the host's, at once).
    pub fn rig(&self) -> Option<&Rig> {
        self.inner.rig.as_ref()
    }

    /// Blocks until the work pending on this buffer's memory has ended: what a host access must
    /// follow (a read follows its writes; a write, its reads too — waiting for both is what every
    /// host access here does).
    ///
    /// # Errors
    /// [`Error::Lost`] where that work's rig is lost.
    pub fn wait(&self) -> Result<()> {
        for e in self.pending_events(true) {
            e.wait().map_err(|l| crate::rig::lost("nx_kernels::Buffer::wait", l))?;
        }
        Ok(())
    }

    /// Whether work is pending on this buffer's memory.
    pub fn is_pending(&self) -> bool {
        !self.pending_events(true).is_empty()
    }

    /// The events an access must follow: the last write's, and for a write the reads' too (those
    /// not ended).
    pub(crate) fn pending_events(&self, write: bool) -> Vec<Event> {
        let Some(m) = &self.inner.memory else { return Vec::new() };
        let p = m.pending.lock().unwrap_or_else(|e| e.into_inner());
        let reads = if write { p.reads.as_slice() } else { &[] };
        p.write.iter().chain(reads).filter(|e| !e.is_done()).cloned().collect()
    }

    /// Records work at `e` that reads (or `write`s) this buffer's memory.
    pub(crate) fn note_pending(&self, e: &Event, write: bool) {
        let Some(m) = &self.inner.memory else { return };
        let mut p = m.pending.lock().unwrap_or_else(|e| e.into_inner());
        if write {
            p.write = Some(e.clone());
            p.reads.clear();
        } else {
            p.reads.retain(|r| !r.is_done() && !e.covers(r));
            p.reads.push(e.clone());
        }
    }

    /// The identity of the bytes (every buffer over one memory shares it, as it shares the
    /// claims), for overlap checks.
    pub(crate) fn memory_id(&self) -> usize {
        Arc::as_ptr(&self.inner.held) as usize
    }
}

/// How a call claims one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    Shared,
    Exclusive,
}

/// Why a set of claims was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimRefusal {
    Dead(usize),
    HeldExclusive(usize),
    ReadOnly(usize),
}

/// Claims on the memories of several buffers, released on drop.
pub(crate) struct Claims {
    held: Vec<(Arc<Mutex<Held>>, Claim)>,
}

impl Claims {
    /// Claims every `(buffer, claim)` (distinct buffers) or none: one claim per memory, exclusive
    /// where any buffer over it is claimed so. Refusals name the position in `wanted` of the first
    /// buffer at fault, dead before held before read-only.
    pub(crate) fn take(wanted: &[(Buffer, Claim)]) -> std::result::Result<Claims, ClaimRefusal> {
        // one entry per memory: (its claims, the claim, the first position in `wanted` over it)
        let mut memories: Vec<(Arc<Mutex<Held>>, Claim, usize)> = Vec::with_capacity(wanted.len());
        for (i, (b, c)) in wanted.iter().enumerate() {
            match memories.iter_mut().find(|m| Arc::ptr_eq(&m.0, &b.inner.held)) {
                Some(m) if *c == Claim::Exclusive => m.1 = Claim::Exclusive,
                Some(_) => {}
                None => memories.push((b.inner.held.clone(), *c, i)),
            }
        }
        // lock in address order, so that two calls never wait on each other's locks
        memories.sort_by_key(|m| Arc::as_ptr(&m.0) as usize);
        let mut guards: Vec<MutexGuard<'_, Held>> =
            memories.iter().map(|m| m.0.lock().unwrap_or_else(|e| e.into_inner())).collect();
        if let Some(i) = wanted.iter().position(|(b, _)| b.death_lock().is_some()) {
            return Err(ClaimRefusal::Dead(i));
        }
        let conflict = |m: &(Arc<Mutex<Held>>, Claim, usize), h: &Held| match m.1 {
            Claim::Shared => h.writer,
            Claim::Exclusive => h.writer || h.readers > 0 || h.exported,
        };
        if let Some(i) = memories.iter().zip(&guards).filter(|(m, h)| conflict(m, h)).map(|(m, _)| m.2).min() {
            return Err(ClaimRefusal::HeldExclusive(i));
        }
        if let Some(i) = wanted.iter().position(|(b, c)| *c == Claim::Exclusive && b.access() == Access::Read) {
            return Err(ClaimRefusal::ReadOnly(i));
        }
        for (m, h) in memories.iter().zip(guards.iter_mut()) {
            match m.1 {
                Claim::Shared => h.readers += 1,
                Claim::Exclusive => h.writer = true,
            }
        }
        drop(guards);
        Ok(Claims { held: memories.into_iter().map(|m| (m.0, m.1)).collect() })
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        for (m, c) in &self.held {
            let mut h = m.lock().unwrap_or_else(|e| e.into_inner());
            match c {
                Claim::Shared => h.readers -= 1,
                Claim::Exclusive => h.writer = false,
            }
        }
    }
}
