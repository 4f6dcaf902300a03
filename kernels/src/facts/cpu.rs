//! The compute cores this process may use: its CPU affinity, the cores those CPUs sit on (SMT
//! siblings counted once), a hybrid CPU's performance cores, and a cgroup's CPU quota.

use std::collections::BTreeSet;
use std::path::Path;

/// What the cores of this process were read from: the inputs of [`Cores::from_readings`], each
/// as the machine wrote it, so a test can give any machine's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuReadings {
    /// The CPUs this thread may run on (`Cpus_allowed_list` of `/proc/thread-self/status`).
    pub allowed: Vec<usize>,
    /// For each CPU known to sysfs, its `(package, core)` (the core id joined with the die id
    /// where sysfs has one, as `die · 2²⁰ + core`): CPUs sharing one are SMT siblings.
    pub core_of: Vec<(usize, (usize, usize))>,
    /// A hybrid CPU's performance CPUs (`/sys/devices/cpu_core/cpus`), where the machine has them.
    pub performance: Option<Vec<usize>>,
    /// A cgroup's CPU quota as `(quota, period)` in µs (`cpu.max`, or v1's `cpu.cfs_quota_us` and
    /// `cpu.cfs_period_us`), where one is set, and the file it came from.
    pub quota: Option<(u64, u64, String)>,
}

/// The compute cores measured on the machine, and what bounded them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cores {
    /// The cores: at least 1.
    pub count: usize,
    /// What the count came from, in words (affinity, topology, performance cores, quota).
    pub source: String,
}

impl Cores {
    /// The cores of this process on the running machine.
    ///
    /// Returns the physical cores under the process's CPU affinity (SMT siblings counted once; on
    /// a hybrid CPU its performance cores only), at most the cgroup's quota rounded up, at least 1.
    /// Readings the machine does not offer are left out (a CPU sysfs does not describe is a core
    /// of its own; no affinity list means every CPU sysfs lists or `available_parallelism`).
    pub fn measured() -> Cores {
        Cores::from_readings(&CpuReadings::read())
    }

    /// The cores `readings` describe, as [`Cores::measured`] counts them.
    pub fn from_readings(r: &CpuReadings) -> Cores {
        let mut allowed: BTreeSet<usize> = r.allowed.iter().copied().collect();
        let mut words = Vec::new();
        if allowed.is_empty() {
            allowed = r.core_of.iter().map(|c| c.0).collect();
        }
        if allowed.is_empty() {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            allowed = (0..n).collect();
            words.push(format!("{n} CPUs (available_parallelism)"));
        } else {
            words.push(format!("{} CPUs allowed ({})", allowed.len(), list_text(&allowed)));
        }
        if let Some(p) = &r.performance {
            let perf: BTreeSet<usize> = p.iter().copied().collect();
            let kept: BTreeSet<usize> = allowed.intersection(&perf).copied().collect();
            if !kept.is_empty() && kept.len() < allowed.len() {
                words.push(format!("{} of them performance CPUs ({})", kept.len(), list_text(&kept)));
                allowed = kept;
            }
        }
        let cores: BTreeSet<(usize, usize)> = allowed
            .iter()
            .map(|&cpu| r.core_of.iter().find(|c| c.0 == cpu).map_or((usize::MAX, cpu), |c| c.1))
            .collect();
        let mut count = cores.len().max(1);
        if cores.len() < allowed.len() {
            words.push(format!("on {} physical cores (SMT siblings once)", cores.len()));
        }
        if let Some((quota, period, file)) = &r.quota {
            if *period > 0 {
                let cap = quota.div_ceil(*period).max(1) as usize;
                if cap < count {
                    words.push(format!("held to {cap} by a cgroup quota of {quota}/{period} µs ({file})"));
                    count = cap;
                }
            }
        }
        Cores { count, source: words.join(", ") }
    }
}

impl CpuReadings {
    /// Reads the running machine's: `/proc/thread-self/status`, `/sys/devices/system/cpu`, the
    /// process's cgroup (v2, then v1). Files absent or unreadable leave their field empty.
    pub fn read() -> CpuReadings {
        let allowed = std::fs::read_to_string("/proc/thread-self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(|v| parse_list(v.trim()))
            })
            .unwrap_or_default();
        let mut core_of = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(cpu) = name.to_str().and_then(|n| n.strip_prefix("cpu")).and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let read = |f: &str| -> Option<usize> {
                    std::fs::read_to_string(entry.path().join("topology").join(f)).ok()?.trim().parse().ok()
                };
                if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
                    // core ids may repeat across the dies of a package
                    let die = read("die_id").unwrap_or(0);
                    core_of.push((cpu, (pkg, die.saturating_mul(1 << 20).saturating_add(core))));
                }
            }
        }
        core_of.sort_unstable();
        let performance = std::fs::read_to_string("/sys/devices/cpu_core/cpus").ok().and_then(|s| parse_list(s.trim()));
        CpuReadings { allowed, core_of, performance, quota: cgroup_quota() }
    }
}

/// The cgroup CPU quota of this process, `(quota, period, file)`, where one is set.
fn cgroup_quota() -> Option<(u64, u64, String)> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: the unified hierarchy
            for dir in [Path::new("/sys/fs/cgroup").join(path), Path::new("/sys/fs/cgroup").to_path_buf()] {
                let file = dir.join("cpu.max");
                if let Ok(text) = std::fs::read_to_string(&file) {
                    let mut w = text.split_whitespace();
                    if let (Some(q), Some(p)) = (w.next(), w.next()) {
                        if let (Ok(q), Ok(p)) = (q.parse(), p.parse()) {
                            return Some((q, p, file.display().to_string()));
                        }
                    }
                }
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            for dir in [Path::new("/sys/fs/cgroup/cpu").join(path), Path::new("/sys/fs/cgroup/cpu").to_path_buf()] {
                let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<i64>().ok();
                if let (Some(q), Some(p)) = (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")) {
                    if q > 0 && p > 0 {
                        return Some((q as u64, p as u64, dir.join("cpu.cfs_quota_us").display().to_string()));
                    }
                }
            }
        }
    }
    None
}

/// Parses a kernel CPU list (`0-3,8,10-11`); `None` where it is not one.
pub fn parse_list(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    if text.is_empty() {
        return Some(out);
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 20 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

/// The CPU list `set` in the kernel's spelling (`0-3,8`).
fn list_text(set: &BTreeSet<usize>) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &c in set {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == c => r.1 = c,
            _ => runs.push((c, c)),
        }
    }
    runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect::<Vec<_>>().join(",")
}
