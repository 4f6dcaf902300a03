//! `nx-mpi-check MODE`: the collectives conformance suite and its failure cases on the MPI backend,
//! one rank per process under `mpirun`. Exits 0 when every rank passes; a failing rank is reported
//! and the job aborted.
//!
//! Modes: `conformance` (the suite, every collective and `place`), `mismatch` (the last rank calls
//! another collective), `axes` (two ranks meet in a group each takes for another mesh axis),
//! `skip` (rank 1 skips a barrier; a 3 s timeout), `skip-unchecked` (the same in unchecked mode,
//! after a first barrier: the shared-memory path's own watchdog), `bits SEED` (writes the bits of
//! [`nx_collectives::random::run`]'s results to `$NX_BITS_DIR/rank-R`, little-endian `u64`s, to
//! compare with the simulated backend's), `large SEED` (the same of [`nx_collectives::random::large`]),
//! `lengths` (unchecked: the last rank
//! gives every collective and a receive other lengths or counts; each rank prints what each call
//! answered and whether the guards around its buffers are intact, then shows the communicator
//! still works), `forever` (unchecked all-reduces of 4 MiB until stopped, a 3 s timeout: a peer
//! lost in the middle is met inside MPI's calls, where the watchdog ends the wait).
//! `NX_MPI_SHM=0` keeps every collective on MPI's own calls; `NX_MPI_CMA=0` moves the shared
//! path's data through the window's halves (else by cross-memory attach, where the kernel allows).

use std::time::Duration;

use nx_collectives::mpi::{self, MpiOptions};
use nx_collectives::{conformance, Communicator, ReduceOp};

/// The random cases of the `bits` mode.
pub const CASES: usize = 24;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "conformance".into());
    let skip = mode.starts_with("skip");
    let unchecked = mode == "skip-unchecked" || mode == "lengths" || mode == "forever";
    let secs = if skip || mode == "forever" { 3 } else { 60 };
    let opts = MpiOptions { checked: !unchecked, timeout: Duration::from_secs(secs), simd: None };
    let out = mpi::run(opts, |c| -> nx_collectives::Result<()> {
        match mode.as_str() {
            "conformance" => {
                conformance::suite(&c)?;
                // again with every buffer from a queued device's pool
                let rig = nx_kernels::rig::Rig::queued(
                    nx_mesh::Device::sim(c.rank()),
                    Duration::from_micros(100),
                    c.rank() as u64,
                )?;
                conformance::suite_in(&c, &rig)?;
                if c.rank() == 0 {
                    println!("conformance passed on {} ranks through {}", c.size(), c.data_path());
                }
            }
            "mismatch" => {
                if c.rank() == c.size() - 1 {
                    let mut out = vec![0f32; 4 * c.size()];
                    c.all_gather(&[0f32; 4], &mut out)?;
                } else {
                    let mut out = vec![0f32; 16];
                    c.all_reduce(&[0f32; 16], &mut out, ReduceOp::Sum)?;
                }
            }
            "axes" => {
                // ranks 0 and 1 meet in one group, each taking it for another mesh axis
                let axes = [if c.rank() == 0 { "x" } else { "y" }.to_string()];
                if let Some(g) = c.split_over((c.rank() < 2).then_some(0), c.rank(), &axes)? {
                    let mut out = vec![0f32; 4];
                    g.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum)?;
                }
            }
            "skip" | "skip-unchecked" => {
                c.barrier()?;
                if c.rank() != 1 {
                    c.barrier()?;
                } else {
                    std::thread::sleep(Duration::from_secs(8));
                }
            }
            "lengths" => {
                for line in nx_collectives::mismatch::suite(&c)? {
                    println!("{line}");
                }
            }
            "bits" | "large" => {
                let seed: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(1);
                let bits = if mode == "bits" {
                    nx_collectives::random::run(&c, seed, CASES)?
                } else {
                    nx_collectives::random::large(&c, seed)?
                };
                let dir = std::env::var("NX_BITS_DIR").unwrap_or_else(|_| ".".into());
                let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                let path = std::path::Path::new(&dir).join(format!("rank-{}", c.rank()));
                std::fs::write(&path, bytes).map_err(|e| nx_collectives::Error::Invalid {
                    func: "nx-mpi-check",
                    why: format!("cannot write {}: {e}", path.display()),
                })?;
            }
            "forever" => {
                // all-reduces of 4 MiB until stopped, unchecked: a lost peer is met inside
                // MPI's calls, where only the watchdog ends the wait
                let send = vec![1f32; 1 << 20];
                let mut out = vec![0f32; 1 << 20];
                for k in 0u64.. {
                    c.all_reduce(&send, &mut out, ReduceOp::Sum)?;
                    if k == 0 && c.rank() == 0 {
                        println!("all-reducing on {} ranks", c.size());
                    }
                }
            }
            other => panic!("unknown mode {other:?}"),
        }
        Ok(())
    });
    if let Err(e) = out {
        eprintln!("nx-mpi-check: {e}");
        std::process::exit(2);
    }
}
