//! `nx-mpi-check MODE`: the collectives conformance suite and its failure cases on the MPI backend,
//! one rank per process under `mpirun`. Exits 0 when every rank passes; a failing rank is reported
//! and the job aborted.
//!
//! Modes: `conformance` (the suite, every collective and `place`), `mismatch` (the last rank calls
//! another collective), `axes` (two ranks meet in a group each takes for another mesh axis),
//! `skip` (rank 1 skips a barrier; a 3 s timeout), `skip-unchecked` (the same in unchecked mode,
//! after a first barrier: the shared-memory path's own watchdog), `checksum` (prints rank 0's bits
//! of an all-reduce, to compare with the simulated backend's).
//! `NX_MPI_SHM=0` keeps every collective on MPI's own calls; `NX_MPI_CMA=0` moves the shared
//! path's data through the window's halves (else by cross-memory attach, where the kernel allows).

use std::time::Duration;

use nx_collectives::mpi::{self, MpiOptions};
use nx_collectives::{conformance, Communicator, ReduceOp};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "conformance".into());
    let skip = mode.starts_with("skip");
    let opts =
        MpiOptions { checked: mode != "skip-unchecked", timeout: Duration::from_secs(if skip { 3 } else { 60 }) };
    let out = mpi::run(opts, |c| -> nx_collectives::Result<()> {
        match mode.as_str() {
            "conformance" => {
                conformance::suite(&c)?;
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
            "checksum" => {
                let len = 1001;
                let mut got = vec![0f32; len];
                c.all_reduce(&conformance::input(c.rank(), len), &mut got, ReduceOp::Sum)?;
                if c.rank() == 0 {
                    let sum: u64 = got.iter().map(|x| u64::from(x.to_bits())).sum();
                    println!("checksum {sum}");
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
