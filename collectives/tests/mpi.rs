//! The MPI backend under `mpirun -n 2, 3, 4`: the conformance suite, a deliberate mismatch, a rank
//! that skips a collective, and the same bits as the simulated backend. Each run is bounded in
//! time and killed past it; no test hangs.
#![cfg(feature = "mpi")]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nx_collectives::sim::{self, SimComm, SimOptions};
use nx_collectives::{Communicator, ReduceOp};

fn mpirun(n: usize, mode: &str, limit: Duration) -> (Output, Duration) {
    mpirun_with(n, mode, limit, ("1", "1"))
}

/// `(shm, cma)`: the values of `NX_MPI_SHM` (`0`: MPI's own calls only) and `NX_MPI_CMA` (`0`: the
/// shared path through the window's halves).
fn mpirun_with(n: usize, mode: &str, limit: Duration, (shm, cma): (&str, &str)) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "-x", "NX_MPI_SHM", "-x", "NX_MPI_CMA", "-n", &n.to_string()])
        .args([env!("CARGO_BIN_EXE_nx-mpi-check"), mode])
        .env("NX_MPI_SHM", shm)
        .env("NX_MPI_CMA", cma)
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

/// Whether this process runs as root (`Uid:` in /proc/self/status).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

#[test]
fn conformance_on_2_3_and_4_ranks() {
    // every rank is on this host: one kernel copy between buffers (root may read its own
    // processes), through the shared window's halves, and through MPI's own calls
    let paths = [(("1", "1"), "cross-memory attach"), (("1", "0"), "shared window"), (("0", ""), "MPI calls")];
    for (env, path) in paths {
        for n in [2, 3, 4] {
            let (out, _) = mpirun_with(n, "conformance", Duration::from_secs(120), env);
            assert!(
                out.status.success(),
                "mpirun -n {n}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            // the kernel lets root read any process; another user may be refused (Yama), and then
            // the shared path moves data through the window instead
            let fell_back = path == "cross-memory attach"
                && !root()
                && text.contains(&format!("conformance passed on {n} ranks through shared window"));
            assert!(fell_back || text.contains(&format!("conformance passed on {n} ranks through {path}")), "{text}");
        }
    }
}

/// Runs `mode` on `n` ranks, which must fail; answers its stderr and how long it took.
fn failing(n: usize, mode: &str) -> (String, Duration) {
    let (out, took) = mpirun(n, mode, Duration::from_secs(60));
    assert!(!out.status.success(), "mpirun -n {n} {mode} succeeded");
    (String::from_utf8_lossy(&out.stderr).into_owned(), took)
}

#[test]
fn a_mismatch_names_both_ranks_and_stops_the_job() {
    let (err, _) = failing(3, "mismatch");
    assert!(err.contains("rank 0 called all_reduce_sum(f32, [16])"), "{err}");
    assert!(err.contains("rank 2 called all_gather(f32, [4, 4, 4])"), "{err}");
}

#[test]
fn ranks_that_take_a_group_for_different_mesh_axes_are_a_mismatch() {
    let (err, _) = failing(3, "axes");
    assert!(err.contains("called all_reduce_sum(f32, [4]) over mesh axes x at nx-mpi-check.rs:"), "{err}");
    assert!(err.contains("called all_reduce_sum(f32, [4]) over mesh axes y at nx-mpi-check.rs:"), "{err}");
}

#[test]
fn a_skipped_collective_times_out_naming_the_rank() {
    let (err, took) = failing(3, "skip");
    assert!(err.contains("waited") && err.contains("for ranks [1], which did not arrive"), "{err}");
    assert!(took < Duration::from_secs(30), "stopped well within the limit: {took:?}");
}

#[test]
fn a_skipped_collective_times_out_on_the_shared_memory_path_unchecked() {
    let (err, took) = failing(3, "skip-unchecked");
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
