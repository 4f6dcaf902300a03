//! The MPI backend under `mpirun -n 2, 3, 4`: the conformance suite, a deliberate mismatch, a rank
//! that skips a collective, and the same bits as the simulated backend. Each run is bounded in
//! time and killed past it; no test hangs.
#![cfg(feature = "mpi")]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nx_collectives::sim::{self, SimComm, SimOptions};
use nx_collectives::{Communicator, ReduceOp};

fn mpirun(n: usize, mode: &str, limit: Duration) -> (Output, Duration) {
    mpirun_with(n, mode, limit, "1")
}

/// `shm`: the value of `NX_MPI_SHM` (`0`: MPI's own calls only).
fn mpirun_with(n: usize, mode: &str, limit: Duration, shm: &str) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "-x", "NX_MPI_SHM", "-n", &n.to_string(), env!("CARGO_BIN_EXE_nx-mpi-check"), mode])
        .env("NX_MPI_SHM", shm)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts (OpenMPI: apt-get install openmpi-bin libopenmpi-dev)");
    loop {
        if child.try_wait().expect("waitable").is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "mpirun -n {n} {mode} ran past {limit:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().expect("output"), start.elapsed())
}

#[test]
fn conformance_on_2_3_and_4_ranks() {
    // through the shared window (every rank is on this host), then through MPI's own calls
    for (shm, path) in [("1", "shared memory"), ("0", "MPI calls")] {
        for n in [2, 3, 4] {
            let (out, _) = mpirun_with(n, "conformance", Duration::from_secs(120), shm);
            assert!(
                out.status.success(),
                "mpirun -n {n}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains(&format!("conformance passed on {n} ranks through {path}")), "{text}");
        }
    }
}

#[test]
fn a_mismatch_names_both_ranks_and_stops_the_job() {
    let (out, _) = mpirun(3, "mismatch", Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 0 called all_reduce_sum(f32, [16])"), "{err}");
    assert!(err.contains("rank 2 called all_gather(f32, [4, 4, 4])"), "{err}");
}

#[test]
fn a_skipped_collective_times_out_naming_the_rank() {
    let (out, took) = mpirun(3, "skip", Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("waited") && err.contains("for ranks [1], which did not arrive"), "{err}");
    assert!(took < Duration::from_secs(30), "stopped well within the limit: {took:?}");
}

#[test]
fn a_skipped_collective_times_out_on_the_shared_memory_path_unchecked() {
    let (out, took) = mpirun(3, "skip-unchecked", Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("barrier on rank") && err.contains("for ranks [1], which did not arrive"), "{err}");
    assert!(took < Duration::from_secs(30), "stopped well within the limit: {took:?}");
}

#[test]
fn the_same_bits_as_the_simulated_backend() {
    let (out, _) = mpirun(4, "checksum", Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mpi: u64 = text.trim().strip_prefix("checksum ").expect("a checksum line").parse().unwrap();
    let sim = sim::run(4, SimOptions::default(), |c: SimComm| -> nx_collectives::Result<u64> {
        let len = 1001;
        let mut got = vec![0f32; len];
        c.all_reduce(&nx_collectives::conformance::input(c.rank(), len), &mut got, ReduceOp::Sum)?;
        Ok(got.iter().map(|x| u64::from(x.to_bits())).sum())
    })
    .unwrap()[0];
    assert_eq!(mpi, sim);
}
