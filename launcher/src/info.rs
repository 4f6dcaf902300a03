//! `nx info`: the backends compiled in, the libraries found on this machine, the devices a
//! program gets, and the host's facts (its CPU, the cores this process may use, its memory and
//! where that reading came from, the host library's pool and thresholds), as text or JSON.

use nx::kernels::facts::{self, HostFacts};
use nx::kernels::host::{Origin, Work};
use nx::kernels::Host;
use serde_json::json;

type Error = Box<dyn std::error::Error>;

/// Arguments of `nx info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Print JSON: the libraries, the host's facts, the pool, and every shipped device file.
    #[arg(long)]
    json: bool,
    /// Print one shipped device description, as `nvidia/nvidia_h200` (JSON).
    #[arg(long, value_name = "VENDOR/MODEL")]
    device: Option<String>,
    /// The CUDA driver to read the GPUs through (default: `libcuda.so.1` where the dynamic loader
    /// finds it).
    #[arg(long, value_name = "PATH")]
    cuda_driver: Option<String>,
    /// A directory to look for NVRTC, cuBLAS and NCCL in first (repeatable; then where the dynamic
    /// loader looks).
    #[arg(long, value_name = "DIR")]
    cuda_libs: Vec<std::path::PathBuf>,
}

fn lib(names: &[&str]) -> Option<std::path::PathBuf> {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/nvidia/lib64",
    ];
    names.iter().flat_map(|n| dirs.iter().map(move |d| std::path::Path::new(d).join(n))).find(|p| p.exists())
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Runs `nx info`.
///
/// # Errors
/// A device that no shipped file describes, and a host whose memory cannot be read.
pub fn info(a: &InfoArgs) -> Result<String, Error> {
    if let Some(d) = &a.device {
        let (vendor, model) =
            d.split_once('/').ok_or_else(|| format!("nx info --device: {d:?} is not VENDOR/MODEL"))?;
        return Ok(serde_json::to_string_pretty(&facts::device_file(vendor, model)?)?);
    }
    let facts = HostFacts::read()?;
    let host = Host::new();
    let (thresholds, origin) = host.thresholds();
    let origin = match origin {
        Origin::Measured(Some(f)) => format!("measured now, kept in {}", f.display()),
        Origin::Measured(None) => "measured now (no cache directory to keep them in)".to_string(),
        Origin::Stored(f) => format!("read from {}", f.display()),
        Origin::OneThread => "one thread: everything inline".to_string(),
    };
    let found = |p: Option<std::path::PathBuf>| p.map(|p| p.display().to_string());
    let (mpi, cuda, nccl) = (
        found(lib(&["libmpi.so", "libmpi.so.40"])),
        found(lib(&["libcuda.so", "libcuda.so.1"])),
        found(lib(&["libnccl.so", "libnccl.so.2"])),
    );
    let mpi_built = cfg!(feature = "mpi");
    let cuda_libs = facts::gpu::libraries(&a.cuda_libs);
    let gpus = match &a.cuda_driver {
        Some(path) => facts::gpu::read_from(path),
        None => facts::gpu::read(),
    };
    let sim = std::env::var("NX_SIM_DEVICES").unwrap_or_else(|_| "4".into());
    if a.json {
        let shipped: Vec<serde_json::Value> =
            facts::device_files().iter().filter_map(|(v, m)| facts::device_file(v, m).ok()).map(|d| json!(d)).collect();
        let value = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "backends": if mpi_built { vec!["sim", "mpi"] } else { vec!["sim"] },
            "mpirun": on_path("mpirun"),
            "libraries": { "mpi": mpi, "cuda": cuda, "nccl": nccl },
            "cuda_libraries": cuda_libs,
            "host": facts,
            "gpus": match &gpus {
                Ok(g) => json!(g),
                Err(why) => json!({ "absent": why }),
            },
            "pool": {
                "threads": host.threads(),
                "source": host.threads_source(),
                "thresholds": thresholds,
                "thresholds_source": origin,
            },
            "devices": shipped,
        });
        return Ok(serde_json::to_string_pretty(&value)?);
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let t = |w: Work| match thresholds.of(w) {
        usize::MAX => "never".to_string(),
        n => n.to_string(),
    };
    Ok(format!(
        "nx {}
backends compiled in: sim{}; cuda, nccl: not built yet
mpirun: {}
MPI library: {}
CUDA driver: {}
NCCL: {}
devices a program gets: {} simulated (NX_SIM_DEVICES), or one cpu device per rank under mpirun
host: {} ({}), {} cores, {} CPUs online; SIMD: {}
cores this process may use: {} ({})
memory: {:.1} GiB limit ({}), {:.1} GiB available, {:.1} GiB in the machine
host library: {} threads; work runs on the pool from map {}, reduce {}, convert {} elements ({})
GPUs: {}
NVRTC: {}
cuBLAS: {}
NCCL version: {}
shipped device files: {}",
        env!("CARGO_PKG_VERSION"),
        if mpi_built { ", mpi" } else { " (mpi: build with --features mpi)" },
        if on_path("mpirun") { "on PATH" } else { "not on PATH" },
        mpi.map_or("not found".into(), |p| format!("found ({p})")),
        cuda.map_or("not found".into(), |p| format!("found ({p})")),
        nccl.map_or("not found".into(), |p| format!("found ({p})")),
        sim,
        facts.cpu.name,
        facts.key,
        facts.cpu.cores,
        facts.logical_cpus,
        facts.cpu.simd.join(" "),
        facts.usable_cores,
        facts.cores_source,
        gib(facts.memory.limit),
        facts.memory.source,
        gib(facts.memory.available),
        gib(facts.memory.total),
        host.threads(),
        t(Work::Map),
        t(Work::Reduce),
        t(Work::Convert),
        origin,
        gpu_lines(&gpus),
        lib_line(&cuda_libs.nvrtc),
        lib_line(&cuda_libs.cublas),
        lib_line(&cuda_libs.nccl),
        facts::device_files().iter().map(|(v, m)| format!("{v}/{m}")).collect::<Vec<_>>().join(", "),
    ))
}

/// The GPUs the driver found, a line each, or why there are none.
fn gpu_lines(gpus: &Result<facts::gpu::GpuFacts, String>) -> String {
    match gpus {
        Err(why) => format!("none ({why})"),
        Ok(g) if g.gpus.is_empty() => {
            format!("none (the driver {}, CUDA {}, finds no device)", g.driver, g.driver_version)
        }
        Ok(g) => {
            let mut out = format!("driver {}, CUDA {}", g.driver, g.driver_version);
            for d in &g.gpus {
                out += &format!(
                    "\n  {}: {} ({}{}), compute capability {}, {} multiprocessors, {:.1} GiB, {} KiB shared a block",
                    d.ordinal,
                    d.name,
                    d.key,
                    if d.shipped { ", shipped file" } else { "" },
                    d.compute_capability,
                    d.multiprocessors,
                    d.memory_bytes as f64 / (1u64 << 30) as f64,
                    d.max_shared_memory_per_block / 1024
                );
            }
            out
        }
    }
}

/// A library's version, or why there is none.
fn lib_line(r: &Result<String, String>) -> String {
    match r {
        Ok(v) => v.clone(),
        Err(why) => format!("none ({why})"),
    }
}
