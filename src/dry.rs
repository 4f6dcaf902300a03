//! Dry runs: what a program *would* do on a mesh — its kernels (kind, dtypes, shapes, the case
//! key), its collectives (op, group, bytes) and each device's peak memory — without running a
//! kernel.
//!
//! [`run`] launches the program with every rank's kernels watched ([`LaunchOptions::observe`]):
//! under [`Observe::Dry`] each call is checked (the door's refusals, shapes, dtypes) and
//! recorded, not run, and every rank's device is a dry rig ([`nx_kernels::rig::RigOptions::dry`]):
//! its pool accounts every block as a real run's does, but a large block is address space alone,
//! and nothing writes its memory — fills (`Tensor::from_fn`, `randn`) are skipped, `place` takes
//! every buffer a step takes and records every collective with its bytes but copies and moves no
//! element, and the host loops of the autodiff ops compute nothing. Values are unspecified; the
//! collective log, the kernels and the pool's peak are the program's.
//! Under [`Observe::Trace`] the kernels run too: the same report of a real run, to compare.
//!
//! So a program of any size of mesh and model runs dry in one process in a little memory: a
//! training step of a GPT of 2.15 billion parameters on 8 devices (about 14 GB a device, 114 GB
//! in all) takes a fraction of a second and a few MiB of resident memory (`tests/dry.rs`), and
//! with [`LaunchOptions::memory_limit`] the device that would run out is named.
//!
//! # Examples
//!
//! ```
//! use nx::dry::{self, Observe};
//! use nx::{LaunchOptions, Placement, Tensor};
//!
//! let opts = LaunchOptions { devices: Some(2), ..Default::default() };
//! let reports = dry::run(&opts, Observe::Dry, |ctx| {
//!     let x = Tensor::<f32>::rand(ctx, &[64, 8], &Placement::split(0, ctx.devices())?, 1)?;
//!     x.relu()?.sum(0)?.full()?;
//!     Ok(())
//! })?;
//! assert_eq!(reports.len(), 2);
//! assert!(reports[0].kernels.iter().any(|k| k.kernel == "map"));
//! assert!(reports[0].collectives.collectives().count() >= 1);
//! assert!(reports[0].peak_bytes >= 32 * 8 * 4);
//! # Ok::<(), nx::Error>(())
//! ```

use std::collections::BTreeMap;

use nx_collectives::log::Log;
use nx_kernels::observe::Launch;

pub use crate::launch::Observe;
use crate::{Ctx, LaunchOptions, Result};

/// One rank's report.
#[derive(Debug, Clone)]
pub struct Report {
    /// The rank.
    pub rank: usize,
    /// Its device.
    pub device: String,
    /// Every kernel call, in order.
    pub kernels: Vec<Launch>,
    /// Every collective, send, receive and split, with bytes ([`nx_collectives::log`]).
    pub collectives: Log,
    /// The most bytes the device's pool held at once ([`nx_kernels::rig::PoolStats::peak`]).
    pub peak_bytes: usize,
}

impl Report {
    /// Returns the calls per case key, with their count, in key order.
    pub fn kernel_counts(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for k in &self.kernels {
            *m.entry(k.key.clone()).or_insert(0) += 1;
        }
        m
    }

    /// Returns the report as text: kernels by kind and case, collectives by op with their
    /// bytes, the peak memory.
    pub fn text(&self) -> String {
        let mut out = format!("rank {} on {}: {} kernel calls\n", self.rank, self.device, self.kernels.len());
        let mut kinds: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for k in &self.kernels {
            let e = kinds.entry(k.kernel).or_default();
            e.0 += 1;
            e.1 += k.bytes();
        }
        for (kind, (n, bytes)) in &kinds {
            out += &format!("  {kind:<16} {n:>6} calls, {:>12} bytes of operands\n", bytes);
        }
        let counts = self.kernel_counts();
        out += &format!("  {} distinct cases; the most called:\n", counts.len());
        let mut top: Vec<(&String, &usize)> = counts.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (key, n) in top.iter().take(5) {
            out += &format!("    {n:>6} × {key}\n");
        }
        let mut ops: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
        for e in self.collectives.collectives() {
            let v = ops.entry(format!("{:?}", e.op)).or_default();
            v.0 += 1;
            v.1 += e.bytes_sent;
            v.2 += e.bytes_received;
        }
        out += &format!("  {} collectives:\n", self.collectives.collectives().count());
        for (op, (n, sent, recv)) in &ops {
            out += &format!("    {op:<14} {n:>6} calls, {sent:>12} bytes sent, {recv:>12} received\n");
        }
        out +=
            &format!("  peak memory: {} bytes ({:.2} MiB)", self.peak_bytes, self.peak_bytes as f64 / (1 << 20) as f64);
        out
    }
}

/// Runs `body` on every rank of a launch with `opts`, its kernels watched as `mode` says.
///
/// Returns each rank's report (one, this rank's, under `mpirun`).
///
/// # Errors
/// As [`crate::launch_with`] and `body`'s; a dry call's checks refuse as the call would.
pub fn run<F>(opts: &LaunchOptions, mode: Observe, body: F) -> Result<Vec<Report>>
where
    F: for<'d> Fn(&Ctx<'d>) -> Result<()> + Sync,
{
    let opts = LaunchOptions { observe: Some(mode), ..opts.clone() };
    crate::launch_with(&opts, |ctx| {
        let ((), collectives) = ctx.record(|| body(ctx))?;
        Ok(Report {
            rank: ctx.rank(),
            device: ctx.rig().device().to_string(),
            kernels: ctx.launches(),
            collectives,
            peak_bytes: ctx.rig().pool_stats().peak,
        })
    })
}
