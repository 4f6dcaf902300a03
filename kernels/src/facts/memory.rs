//! The host memory a process may use, and where that reading came from.

use std::path::{Path, PathBuf};

/// The host memory as read on the running machine.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemoryState {
    /// Bytes the process may hold at most: the smaller of the machine's memory and a cgroup's limit.
    pub limit: u64,
    /// Bytes available now: `MemAvailable`, at most the limit less the cgroup's usage.
    pub available: u64,
    /// The machine's memory (`MemTotal`).
    pub total: u64,
    /// Where `limit` came from: `"cgroup v2 limit (<file>)"`, `"cgroup v1 limit (<file>)"` or
    /// `"/proc/meminfo"`.
    pub source: String,
}

impl MemoryState {
    /// Reads the running machine's memory: `/proc/meminfo`, then the process's cgroup (v2's
    /// `memory.max` and `memory.current`, else v1's `memory.limit_in_bytes` and
    /// `memory.usage_in_bytes`; a limit of 2⁶² bytes or more is none).
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming `/proc/meminfo` where it cannot be read or lacks `MemTotal`.
    pub fn read() -> crate::Result<MemoryState> {
        let invalid = |why: String| crate::Error::Invalid { func: "nx_kernels::facts::MemoryState::read", why };
        let info = std::fs::read_to_string("/proc/meminfo").map_err(|e| invalid(format!("/proc/meminfo: {e}")))?;
        let field = |name: &str| -> Option<u64> {
            let line = info.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
            kib.checked_mul(1024)
        };
        let total = field("MemTotal:").ok_or_else(|| invalid("/proc/meminfo has no MemTotal".into()))?;
        let available = field("MemAvailable:").unwrap_or(total);
        let mut state = MemoryState { limit: total, available, total, source: "/proc/meminfo".into() };
        if let Some((limit, usage, source)) = cgroup_limit() {
            if limit < total {
                state.limit = limit;
                state.available = available.min(limit.saturating_sub(usage));
                state.source = source;
            }
        }
        Ok(state)
    }
}

/// A cgroup's memory limit and usage, `(limit, usage, source)`, where one is set.
fn cgroup_limit() -> Option<(u64, u64, String)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |f: PathBuf| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let (root, limit_file, usage_file, version) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max", "memory.current", "v2")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "v1")
        } else {
            continue;
        };
        for dir in [Path::new(root).join(path), Path::new(root).to_path_buf()] {
            if let Some(limit) = read(dir.join(limit_file)).filter(|&l| l < 1 << 62) {
                let usage = read(dir.join(usage_file)).unwrap_or(0);
                return Some((limit, usage, format!("cgroup {version} limit ({})", dir.join(limit_file).display())));
            }
        }
    }
    None
}
