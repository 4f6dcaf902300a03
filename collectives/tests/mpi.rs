//! The MPI backend under `mpirun -n 2, 3, 4`: the conformance suite, a deliberate mismatch, a rank
//! that skips a collective, and the same bits as the simulated backend. Each run is bounded in
//! time and killed past it; no test hangs.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nx_collectives::sim::{self, SimComm, SimOptions};

fn mpirun(n: usize, mode: &str, limit: Duration) -> (Output, Duration) {
    mpirun_with(n, mode, limit, ("1", "1"))
}

/// `(shm, cma)`: the values of `NX_MPI_SHM` (`0`: MPI's own calls only) and `NX_MPI_CMA` (`0`: the
/// shared path through the window's halves).
fn mpirun_with(n: usize, mode: &str, limit: Duration, env: (&str, &str)) -> (Output, Duration) {
    mpirun_of(env!("CARGO_BIN_EXE_nx-mpi-check").as_ref(), n, mode, limit, env)
}

/// [`mpirun_with`] of the check program at `exe`.
fn mpirun_of(
    exe: &std::path::Path,
    n: usize,
    mode: &str,
    limit: Duration,
    (shm, cma): (&str, &str),
) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "-x", "NX_MPI_SHM", "-x", "NX_MPI_CMA", "-n", &n.to_string()])
        .arg(exe)
        .arg(mode)
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

/// The check program built in the release profile, as users run it (debug assertions and overflow
/// checks off), by cargo, which names the executable it built; built once per test process.
fn release_binary() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let out = Command::new(cargo)
            .args(["build", "--release", "--locked", "--features", "mpi", "-p", "nx-collectives"])
            .args(["--bin", "nx-mpi-check", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo build --release: {}", String::from_utf8_lossy(&out.stderr));
        // the artifact message of the binary: `"executable":"/…/release/nx-mpi-check"`
        let text = String::from_utf8_lossy(&out.stdout);
        let path = text
            .lines()
            .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("nx-mpi-check"))
            .find_map(|l| l.split("\"executable\":\"").nth(1)?.split('"').next().map(PathBuf::from))
            .expect("cargo names the executable it built");
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
}

#[test]
fn lengths_that_differ_are_refused_on_every_rank_unchecked_in_a_release_build() {
    // the last rank gives every collective (and a receive) other lengths or counts; checked mode
    // is off and so are debug assertions: every rank must answer each call with a mismatch naming
    // two ranks, no byte past any buffer may change, and the communicator must stay in step
    let paths = [(("1", "1"), "cross-memory attach"), (("1", "0"), "shared window"), (("0", ""), "MPI calls")];
    for (env, path) in paths {
        for n in [2, 3] {
            let (out, _) = mpirun_of(release_binary(), n, "lengths", Duration::from_secs(120), env);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{path}, {n} ranks: {text}\n{}", String::from_utf8_lossy(&out.stderr));
            for r in 0..n {
                let ops = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "ops", "barrier"];
                let p2p = (r == 0 || r == n - 1).then_some("send/recv");
                for op in ops.into_iter().chain(p2p) {
                    let want = format!("rank {r}: {op} refused (guards intact): nx collective mismatch: rank ");
                    assert!(text.lines().any(|l| l.starts_with(&want)), "{path}, {n} ranks: no {want:?} in\n{text}");
                }
                let sum = (0..n).sum::<usize>();
                assert!(text.contains(&format!("rank {r}: in step, sum {sum}")), "{path}, {n} ranks:\n{text}");
            }
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
fn the_same_bits_as_the_simulated_backend_on_random_cases() {
    // 24 random collectives a seed (ops, reduce ops, dtypes, uneven counts, lengths past every
    // chunk and window half), every result compared bit for bit with the simulated backend's, on
    // every data path
    let paths = [("1", "1"), ("1", "0"), ("0", "")];
    for (k, env) in paths.into_iter().enumerate() {
        for n in [2, 3, 4] {
            let seed = 1000 + 10 * k as u64 + n as u64;
            let dir = std::env::temp_dir().join(format!("nx-mpi-bits-{}-{seed}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let start = Instant::now();
            let mut child = Command::new("mpirun")
                .args(["--oversubscribe", "-x", "NX_MPI_SHM", "-x", "NX_MPI_CMA", "-x", "NX_BITS_DIR"])
                .args(["-n", &n.to_string(), env!("CARGO_BIN_EXE_nx-mpi-check"), "bits", &seed.to_string()])
                .env("NX_MPI_SHM", env.0)
                .env("NX_MPI_CMA", env.1)
                .env("NX_BITS_DIR", &dir)
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("mpirun starts");
            while child.try_wait().expect("waitable").is_none() {
                if start.elapsed() > Duration::from_secs(120) {
                    let _ = child.kill();
                    panic!("mpirun -n {n} bits ran past 120 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{env:?} n={n}: {}", String::from_utf8_lossy(&out.stderr));
            let sim =
                sim::run(n, SimOptions::default(), |c: SimComm| nx_collectives::random::run(&c, seed, 24)).unwrap();
            for (r, want) in sim.iter().enumerate() {
                let bytes = std::fs::read(dir.join(format!("rank-{r}"))).unwrap();
                let got: Vec<u64> = bytes.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
                assert_eq!(got.len(), want.len(), "{env:?} n={n} rank {r}: result lengths");
                let first = got.iter().zip(want).position(|(a, b)| a != b);
                assert_eq!(first, None, "{env:?} n={n} rank {r}: first differing element");
            }
            assert!(sim.iter().map(Vec::len).sum::<usize>() > 10_000, "the cases move data");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
