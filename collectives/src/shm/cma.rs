//! Linux's cross-memory attach (`process_vm_readv`/`_writev`, through glibc): one kernel copy
//! between this process's memory and a peer's, the direct path's only way of moving data.

/// `struct iovec` of `<sys/uio.h>`.
#[repr(C)]
struct IoVec {
    base: *mut std::ffi::c_void,
    len: usize,
}

unsafe extern "C" {
    /// Linux's cross-memory attach (glibc): copies from another process's memory into this one's.
    fn process_vm_readv(
        pid: i32,
        local: *const IoVec,
        local_count: std::ffi::c_ulong,
        remote: *const IoVec,
        remote_count: std::ffi::c_ulong,
        flags: std::ffi::c_ulong,
    ) -> isize;
    /// The same, from this process's memory into another's.
    fn process_vm_writev(
        pid: i32,
        local: *const IoVec,
        local_count: std::ffi::c_ulong,
        remote: *const IoVec,
        remote_count: std::ffi::c_ulong,
        flags: std::ffi::c_ulong,
    ) -> isize;
}

/// Copies `len` bytes at `remote` in process `pid` to `local`, by the kernel (one copy).
///
/// # Errors
/// The OS error, where the kernel refuses (no permission to read the process) or the range is not
/// mapped there.
///
/// # Safety
/// `local` points at `len` writable bytes that nothing else touches meanwhile.
pub(super) unsafe fn read_process(pid: i32, remote: usize, local: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cross(pid, remote, local, len, false) }
}

/// Copies `len` bytes at `local` to `remote` in process `pid`, by the kernel (one copy).
///
/// # Errors
/// As [`read_process`].
///
/// # Safety
/// `local` points at `len` readable bytes; the peer has published `remote` for this process to
/// write, and reads it only after the next sync.
pub(super) unsafe fn write_process(pid: i32, remote: usize, local: *const u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { cross(pid, remote, local.cast_mut(), len, true) }
}

/// `process_vm_readv` (or `_writev` where `write`) until every byte has moved.
///
/// # Safety
/// As [`read_process`] / [`write_process`].
unsafe fn cross(pid: i32, remote: usize, local: *mut u8, len: usize, write: bool) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let step = len - done;
        let l = IoVec { base: local.wrapping_add(done).cast(), len: step };
        let r = IoVec { base: (remote + done) as *mut std::ffi::c_void, len: step };
        // SAFETY: one valid iovec each; the kernel touches only `local`'s range (the caller's
        // contract) and checks the remote range itself.
        let n = unsafe {
            if write {
                process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read no bytes"));
        }
        done += n as usize;
    }
    Ok(())
}
