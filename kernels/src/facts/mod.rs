//! Device facts: what a device the library can target is (cores, caches, SIMD features, memory;
//! a GPU's compute capability and shared memory), read from the files shipped in this crate —
//! one per device model, `devices/<vendor>/<key>.json`, the key by [`arch_string`] — and from the
//! running machine ([`HostFacts::read`]; its GPUs from the CUDA driver, [`gpu::read`]). Nothing
//! here is cached or global: each call reads.
//!
//! # Examples
//!
//! ```
//! use nx_kernels::facts::{arch_string, device_file};
//!
//! assert_eq!(arch_string("NVIDIA H200"), "nvidia-h200");
//! assert_eq!(arch_string("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"), "intel-xeon-platinum-8480");
//! let h200 = device_file("nvidia", "nvidia_h200")?;
//! assert_eq!(h200.compute_capability.as_deref(), Some("9.0"));
//! assert_eq!(h200.memory.max_shared_memory_per_block, Some(232_448));
//! # Ok::<(), nx_kernels::Error>(())
//! ```

mod cpu;
pub mod gpu;
mod memory;

pub use cpu::{parse_list, Cores, CpuReadings};
pub use memory::MemoryState;

use serde::{Deserialize, Serialize};

/// One device model's description.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// The model's name as its vendor's tools print it (`nvidia-smi`, `/proc/cpuinfo`).
    pub name: String,
    /// `"nvidia"`, `"amd"`, `"intel"`, …
    pub vendor: String,
    /// `"gpu"` or `"cpu"`.
    pub kind: String,
    /// A GPU's compute capability (`"9.0"`); none for CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// Compute cores: a GPU's multiprocessors, a CPU's physical cores.
    pub cores: u32,
    /// SIMD and matrix features, lower case (`avx512f`, `amx_bf16`, `tensor-core-bf16`).
    pub simd: Vec<String>,
    /// The caches, innermost first.
    pub caches: Vec<Cache>,
    /// The memory.
    pub memory: Memory,
    /// Where the facts came from or what qualifies them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// One cache level of a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    /// Its level (1 innermost).
    pub level: u32,
    /// `"data"`, `"instruction"` or `"unified"`.
    pub kind: String,
    /// Bytes of one instance.
    pub bytes: u64,
    /// Cores sharing one instance.
    pub shared_by: u32,
}

/// A device's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Bytes of memory (0 where the model does not fix it: a CPU's is the machine's).
    pub bytes: u64,
    /// Peak bandwidth by the datasheet, in GB/s.
    pub bandwidth_gb_s: f64,
    /// A GPU's most shared memory one block may use (opt-in), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shared_memory_per_block: Option<u64>,
    /// A GPU's shared memory per multiprocessor, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory_per_multiprocessor: Option<u64>,
}

/// The device files shipped in this crate, as `(vendor, file stem, text)`.
const FILES: &[(&str, &str, &str)] = &[
    ("amd", "amd_epyc_9654", include_str!("../../devices/amd/amd_epyc_9654.json")),
    ("intel", "intel_xeon_platinum_8480", include_str!("../../devices/intel/intel_xeon_platinum_8480.json")),
    ("nvidia", "nvidia_a100_sxm4_80gb", include_str!("../../devices/nvidia/nvidia_a100_sxm4_80gb.json")),
    ("nvidia", "nvidia_h100_80gb_hbm3", include_str!("../../devices/nvidia/nvidia_h100_80gb_hbm3.json")),
    ("nvidia", "nvidia_h200", include_str!("../../devices/nvidia/nvidia_h200.json")),
];

/// The shipped device files, as `(vendor, file stem)`: the stem is the model's [`arch_string`]
/// with `_` for `-`.
pub fn device_files() -> Vec<(&'static str, &'static str)> {
    FILES.iter().map(|f| (f.0, f.1)).collect()
}

/// The description of model `name` (a file stem, `nvidia_h200`, or its key, `nvidia-h200`) of
/// `vendor`, from the files shipped in this crate.
///
/// # Errors
/// [`crate::Error::Invalid`] naming the vendor and model where no file describes it (listing the
/// files there are), or where the shipped file does not parse.
pub fn device_file(vendor: &str, name: &str) -> crate::Result<DeviceFacts> {
    let stem = name.replace('-', "_");
    let func = "nx_kernels::facts::device_file";
    let Some(&(_, _, text)) = FILES.iter().find(|f| f.0 == vendor && f.1 == stem) else {
        let known: Vec<String> = FILES.iter().map(|f| format!("{}/{}", f.0, f.1)).collect();
        return Err(crate::Error::Invalid {
            func,
            why: format!("no device file {vendor}/{stem} (shipped: {})", known.join(", ")),
        });
    };
    serde_json::from_str(text)
        .map_err(|e| crate::Error::Invalid { func, why: format!("devices/{vendor}/{stem}.json: {e}") })
}

/// The shipped description of the model named `name` as its tools print it (`"NVIDIA H200"`,
/// a `/proc/cpuinfo` model name), found by its [`arch_string`]; `None` where none is shipped.
pub fn device_named(name: &str) -> Option<DeviceFacts> {
    let stem = arch_string(name).replace('-', "_");
    let &(vendor, _, _) = FILES.iter().find(|f| f.1 == stem)?;
    device_file(vendor, &stem).ok()
}

/// A device model's key: its name in lower case, the marks `(R)` and `(TM)`, a CPU's clock
/// (from `@`), core counts (`96-Core`) and the words `cpu` and `processor` dropped, every run of
/// other characters than letters and digits one `-`, none at either end.
///
/// Returns the key (`"Apple M4 Pro"` → `"apple-m4-pro"`, `"NVIDIA A100-SXM4-80GB"` →
/// `"nvidia-a100-sxm4-80gb"`, `"AMD EPYC 9654 96-Core Processor"` → `"amd-epyc-9654"`).
pub fn arch_string(name: &str) -> String {
    let lower = name.to_lowercase().replace("(r)", " ").replace("(tm)", " ");
    let lower = lower.split('@').next().unwrap_or("");
    let words: Vec<&str> = lower
        .split_whitespace()
        .filter(|w| !matches!(*w, "cpu" | "processor"))
        .filter(|w| !(w.ends_with("-core") && w[..w.len() - 5].chars().all(|c| c.is_ascii_digit())))
        .collect();
    let mut key = String::new();
    for c in words.join(" ").chars() {
        if c.is_ascii_alphanumeric() {
            key.push(c);
        } else if !key.is_empty() && !key.ends_with('-') {
            key.push('-');
        }
    }
    key.trim_end_matches('-').to_string()
}

/// The running host's facts: the measured [`DeviceFacts`] of its CPU, the cores this process may
/// use, its memory now, and the shipped file of its model where there is one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostFacts {
    /// The CPU as measured here: `cores` the physical cores of the machine, `caches` from sysfs,
    /// `simd` the features detected at run time, `memory.bytes` the memory limit.
    pub cpu: DeviceFacts,
    /// Its key ([`arch_string`] of the model name).
    pub key: String,
    /// The CPU threads the machine has online.
    pub logical_cpus: usize,
    /// The compute cores this process may use ([`Cores::measured`]) and what bounded them.
    pub usable_cores: usize,
    /// What `usable_cores` came from.
    pub cores_source: String,
    /// The memory this process may use and where that came from.
    pub memory: MemoryState,
    /// The shipped description of this model, where one is shipped.
    pub shipped: Option<DeviceFacts>,
}

impl HostFacts {
    /// Reads the running machine: `/proc/cpuinfo`, `/sys/devices/system/cpu`, the CPU features
    /// detected at run time, the cores of [`Cores::measured`] and [`MemoryState::read`].
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] where `/proc/meminfo` cannot be read.
    pub fn read() -> crate::Result<HostFacts> {
        let memory = MemoryState::read()?;
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let name = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let vendor = match field("vendor_id").as_deref() {
            Some("GenuineIntel") => "intel",
            Some("AuthenticAMD") => "amd",
            Some(v) => v,
            None => "unknown",
        }
        .to_lowercase();
        let readings = CpuReadings::read();
        let all = CpuReadings { allowed: Vec::new(), performance: None, quota: None, ..readings.clone() };
        let usable = Cores::from_readings(&readings);
        let key = arch_string(&name);
        let cpu = DeviceFacts {
            name: name.clone(),
            vendor,
            kind: "cpu".into(),
            compute_capability: None,
            cores: Cores::from_readings(&all).count as u32,
            simd: simd_features(),
            caches: caches(),
            memory: Memory {
                bytes: memory.limit,
                bandwidth_gb_s: 0.0,
                max_shared_memory_per_block: None,
                shared_memory_per_multiprocessor: None,
            },
            note: "measured on this machine (bandwidth not measured: 0)".into(),
        };
        let logical_cpus = readings.core_of.len().max(std::thread::available_parallelism().map_or(1, |n| n.get()));
        Ok(HostFacts {
            cpu,
            shipped: device_named(&name),
            key,
            logical_cpus,
            usable_cores: usable.count,
            cores_source: usable.source,
            memory,
        })
    }
}

/// The SIMD features this CPU has, detected at run time (AMX from the kernel's CPU flags).
fn simd_features() -> Vec<String> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if std::arch::is_x86_feature_detected!($f) {
                    out.push($f.replace('-', "_"));
                }
            )*};
        }
        probe!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512bf16",
            "avx512fp16",
            "avx512vnni",
            "avxvnni"
        );
        // AMX's run-time detection is not stable Rust yet: the kernel's flags say it
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        if let Some(flags) = info.lines().find(|l| l.starts_with("flags")) {
            let flags: Vec<&str> = flags.split_whitespace().collect();
            out.extend(
                ["amx_tile", "amx_bf16", "amx_int8"].iter().filter(|f| flags.contains(f)).map(|f| f.to_string()),
            );
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            out.push("neon".into());
        }
    }
    out
}

/// The caches of CPU 0 from sysfs, innermost first.
fn caches() -> Vec<Cache> {
    let mut out = Vec::new();
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    for i in 0..8 {
        let dir = base.join(format!("index{i}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size")) else {
            continue;
        };
        let bytes = match size.strip_suffix('K') {
            Some(k) => k.parse::<u64>().ok().map(|k| k * 1024),
            None => size.strip_suffix('M').and_then(|m| m.parse::<u64>().ok()).map(|m| m << 20),
        };
        let shared_by = read("shared_cpu_list").and_then(|l| parse_list(&l)).map_or(1, |l| l.len() as u32);
        if let (Ok(level), Some(bytes)) = (level.parse(), bytes) {
            out.push(Cache { level, kind: kind.to_lowercase(), bytes, shared_by });
        }
    }
    out
}
