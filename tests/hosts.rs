//! Many hosts on one machine: `scripts/cluster` makes namespaced hosts (each its own network
//! stack and address, joined by a bridge), and ranks run across them through mpirun and `nx run`.
//! Training has the bits of the simulated mesh; the collectives' conformance suite and random
//! cases pass across hosts (uneven ranks a host included); a rank killed on the second host, a
//! whole host's processes killed, and a cut link each end the run with a report naming them, and
//! no process survives on any host. Needs root and network namespaces: elsewhere each test says
//! why on one line and passes.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// target/<profile>, where the tests, the examples and the workspace's binaries are built.
fn target() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf()
}

fn example(name: &str) -> PathBuf {
    let path = target().join("examples").join(name);
    assert!(path.exists(), "{} is not built (cargo build --examples)", path.display());
    path
}

/// A binary of the workspace (`nx`, `nx-mpi-check`), built by `cargo test --workspace`.
fn binary(name: &str) -> PathBuf {
    let path = target().join(name);
    assert!(path.exists(), "{} is not built: run the tests with --workspace (scripts/test does)", path.display());
    path
}

/// A cluster of namespaced hosts, removed when dropped.
struct Cluster {
    name: String,
    /// `198.18.S.1:2,198.18.S.2:2`
    hosts: String,
    /// The `export`s of its `env` file.
    env: Vec<(String, String)>,
    subnet: u8,
}

impl Cluster {
    /// `hosts` hosts of `slots` ranks on subnet `subnet` (one a test: tests run in parallel), or
    /// `None` (said on one line) where this machine cannot make them.
    fn up(name: &str, subnet: u8, hosts: usize, slots: usize) -> Option<Cluster> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster");
        let out = Command::new("bash")
            .arg(&script)
            .args(["up", &hosts.to_string(), "--name", name, "--subnet", &subnet.to_string()])
            .args(["--slots", &slots.to_string()])
            .output()
            .expect("bash runs");
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if err.contains("needs root") || err.contains("cannot be made here") || err.contains("needs ip") {
                eprintln!("skipped: no namespaced hosts on this machine ({})", err.trim());
                return None;
            }
            panic!("scripts/cluster up failed: {err}");
        }
        let hosts = String::from_utf8_lossy(&out.stdout).lines().last().expect("the --hosts line").to_string();
        let file = std::fs::read_to_string(format!("/tmp/nx-cluster-{name}/env")).expect("the env file");
        let env = file
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(Cluster { name: name.to_string(), hosts, env, subnet })
    }

    fn host(&self, i: usize) -> String {
        format!("198.18.{}.{i}", self.subnet)
    }

    /// A command with the cluster's settings and mpirun's permission to run as root.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        c
    }

    /// `mpirun -n N --host …` of `program`.
    fn mpirun(&self, n: usize, program: &Path) -> Command {
        let mut c = self.command("mpirun");
        c.args(["--oversubscribe", "-n", &n.to_string(), "--host", &self.hosts]).arg(program);
        c
    }

    /// `nx run --mpi -n N --hosts … --` (the program's path and arguments to follow).
    fn nx_run(&self, n: usize, extra: &[&str]) -> Command {
        let mut c = self.command(binary("nx"));
        c.args(["run", "--mpi", "-n", &n.to_string(), "--hosts", &self.hosts]).args(extra).arg("--");
        c
    }

    /// The processes in host `i`'s namespace.
    fn pids(&self, i: usize) -> Vec<u32> {
        let out = Command::new("ip").args(["netns", "pids", &format!("nx-{}-{i}", self.name)]).output().expect("ip");
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// The processes of host `i` running `exe`.
    fn running(&self, i: usize, exe: &Path) -> Vec<u32> {
        let exe = exe.canonicalize().expect("the program's path");
        self.pids(i)
            .into_iter()
            .filter(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == exe))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster");
        let _ = Command::new("bash").arg(script).args(["down", "--name", &self.name]).output();
    }
}

/// Runs `cmd` to its end within `limit` (killed past it: the test fails, never hangs).
fn run(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawns");
    wait(child, limit)
}

fn wait(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("waitable").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("ran past {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn checksum(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text.lines()
        .find_map(|l| l.split("parameters checksum: ").nth(1))
        .unwrap_or_else(|| panic!("a checksum line in {text}"))
        .to_string()
}

/// Waits until `f` holds, polling, for at most `limit`.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

const MLP: &[&str] = &["--steps", "30", "--mesh", "dp=2,tp=2"];
const GPT: &[&str] = &["--steps", "8", "--layers", "1", "--width", "32", "--batch", "12", "--mesh", "dp=2,tp=2"];

#[test]
fn training_across_two_hosts_has_the_bits_of_the_simulated_mesh() {
    let Some(c) = Cluster::up("train", 11, 2, 2) else { return };
    let limit = Duration::from_secs(300);
    let mlp = example("train_mlp");
    // the simulated mesh laid out as the hosts are (its reductions associate as theirs)
    let sim = checksum(&run(
        {
            let mut cmd = Command::new(&mlp);
            cmd.args(MLP).env("NX_SIM_HOSTS", "2,2");
            cmd
        },
        limit,
    ));
    let mut cmd = c.mpirun(4, &mlp);
    cmd.args(MLP);
    assert_eq!(checksum(&run(cmd, limit)), sim, "train_mlp under mpirun across two hosts");
    let mut cmd = c.nx_run(4, &["--tag-output"]);
    cmd.arg(&mlp).args(MLP);
    let out = run(cmd, limit);
    assert_eq!(checksum(&out), sim, "train_mlp under nx run --hosts");
    // each line tagged with its rank and host
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("[0@nx-{}-1] ", c.name)), "{text}");
    let gpt = example("train_gpt");
    let sim = checksum(&run(
        {
            let mut cmd = Command::new(&gpt);
            cmd.args(GPT).env("NX_SIM_HOSTS", "2,2");
            cmd
        },
        limit,
    ));
    let mut cmd = c.nx_run(4, &[]);
    cmd.arg(&gpt).args(GPT);
    assert_eq!(checksum(&run(cmd, limit)), sim, "train_gpt under nx run --hosts");
}

#[test]
fn the_collectives_pass_their_conformance_suite_and_keep_their_bits_across_hosts() {
    use nx_collectives::sim::{self, SimComm, SimOptions};
    // two hosts of two ranks, and three hosts of 2, 2 and 1 (the last uneven): the suite
    // (every collective, uneven counts, sub-communicators of mesh axes that span the hosts) and
    // random cases compared bit for bit with the simulated backend
    for (name, subnet, hosts, n) in [("conf", 12u8, 2usize, 4usize), ("conf3", 13, 3, 5)] {
        let Some(c) = Cluster::up(name, subnet, hosts, 2) else { return };
        let check = binary("nx-mpi-check");
        let mut cmd = c.mpirun(n, &check);
        cmd.arg("conformance");
        let out = run(cmd, Duration::from_secs(300));
        assert!(out.status.success(), "{n} ranks on {hosts} hosts: {}", String::from_utf8_lossy(&out.stderr));
        // two hosts of two: the hierarchical path; 2, 2 and 1: the flat exchange
        let path = if n == 4 { "MPI calls within and across hosts" } else { "MPI calls" };
        let text = String::from_utf8_lossy(&out.stdout);
        let line = format!("conformance passed on {n} ranks through {path}");
        assert!(text.lines().any(|l| l.trim() == line), "{text}");
        let seed = 7000 + n as u64;
        let dir = std::env::temp_dir().join(format!("nx-hosts-bits-{}-{seed}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // the ranks on other hosts get only what -x names
        let mut cmd = c.command("mpirun");
        cmd.args(["--oversubscribe", "-x", "NX_BITS_DIR", "-n", &n.to_string(), "--host", &c.hosts])
            .arg(&check)
            .args(["bits", &seed.to_string()])
            .env("NX_BITS_DIR", &dir);
        let out = run(cmd, Duration::from_secs(300));
        assert!(out.status.success(), "bits: {}", String::from_utf8_lossy(&out.stderr));
        // the simulated backend laid out as the hosts are: the same bits; on one host: others
        let layout: Vec<usize> = (0..n).map(|r| r / 2).collect();
        let random = |s: SimComm| nx_collectives::random::run(&s, seed, 24);
        let want = sim::run(n, SimOptions { hosts: layout, ..SimOptions::default() }, random).unwrap();
        let flat = sim::run(n, SimOptions::default(), random).unwrap();
        let mut unlike_flat = false;
        for (r, want) in want.iter().enumerate() {
            let bytes = std::fs::read(dir.join(format!("rank-{r}"))).unwrap();
            let got: Vec<u64> = bytes.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(got.len(), want.len(), "rank {r}: result lengths");
            assert_eq!(got.iter().zip(want).position(|(a, b)| a != b), None, "rank {r}: first differing element");
            unlike_flat |= got != flat[r];
        }
        assert!(unlike_flat, "{n} ranks on {hosts} hosts: the cases tell the association across hosts from one host's");
        // large uneven cases: many pieces of the hierarchical path, blocks of 0 and a few elements
        let mut cmd = c.command("mpirun");
        cmd.args(["--oversubscribe", "-x", "NX_BITS_DIR", "-n", &n.to_string(), "--host", &c.hosts])
            .arg(&check)
            .args(["large", &seed.to_string()])
            .env("NX_BITS_DIR", &dir);
        let out = run(cmd, Duration::from_secs(300));
        assert!(out.status.success(), "large: {}", String::from_utf8_lossy(&out.stderr));
        let o = SimOptions { hosts: (0..n).map(|r| r / 2).collect(), ..SimOptions::default() };
        let want = sim::run(n, o, |s: SimComm| nx_collectives::random::large(&s, seed)).unwrap();
        for (r, want) in want.iter().enumerate() {
            let bytes = std::fs::read(dir.join(format!("rank-{r}"))).unwrap();
            let got: Vec<u64> = bytes.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(got.len(), want.len(), "large, rank {r}: result lengths");
            assert_eq!(
                got.iter().zip(want).position(|(a, b)| a != b),
                None,
                "large, rank {r}: first differing element"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Starts a long `train_mlp` across the cluster's two hosts through `nx run --mpi --hosts`, and
/// waits until both ranks of host 2 run.
fn long_run(c: &Cluster, extra_env: &[(&str, &str)]) -> Child {
    let mlp = example("train_mlp");
    let mut cmd = c.nx_run(4, &["--grace", "2"]);
    cmd.arg(&mlp).args(["--steps", "1000000", "--mesh", "dp=2,tp=2"]);
    cmd.envs(extra_env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("nx run starts");
    assert!(
        until(Duration::from_secs(60), || c.running(2, &mlp).len() == 2 && c.running(1, &mlp).len() == 2),
        "the ranks start on both hosts"
    );
    // past the first steps: every rank is in the training loop
    std::thread::sleep(Duration::from_secs(2));
    child
}

/// No process of the run is left on any host.
fn nothing_left(c: &Cluster) {
    assert!(
        until(Duration::from_secs(20), || c.pids(1).is_empty() && c.pids(2).is_empty()),
        "processes left: host 1 {:?}, host 2 {:?}",
        c.pids(1),
        c.pids(2)
    );
}

#[test]
fn a_rank_killed_on_the_second_host_stops_every_rank_on_every_host() {
    let Some(c) = Cluster::up("kill", 14, 2, 2) else { return };
    let child = long_run(&c, &[]);
    let victim = c.running(2, &example("train_mlp"))[0];
    // SAFETY: kill has no memory-safety preconditions; the pid is a rank this test started.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let out = wait(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    let host = format!("(host nx-{}-2)", c.name);
    assert!(err.contains(&host) && err.contains("killed by signal 9 (SIGKILL)"), "{err}");
    nothing_left(&c);
    // direct ranks through the cluster's agent: rank 2 (the second host's first) kills itself
    let mut cmd = c.command(binary("nx"));
    cmd.args(["run", "--direct", "-n", "4", "--hosts", &c.hosts, "--grace", "1", "--"]).args([
        "sh",
        "-c",
        "if [ \"$NX_RANK\" = 2 ]; then sleep 1; kill -9 $$; fi; echo \"rank $NX_RANK of $NX_WORLD_SIZE, $NX_LOCAL_RANK of $NX_LOCAL_WORLD_SIZE on $(hostname)\"; sleep 60",
    ]);
    let start = Instant::now();
    let out = run(cmd, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    assert!(err.contains(&format!("rank 2 (host {})", c.host(2))) && err.contains("signal 9"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "stopped within the grace: {:?}", start.elapsed());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("rank 3 of 4, 1 of 2 on nx-{}-2", c.name)), "{text}");
    nothing_left(&c);
}

#[test]
fn a_host_whose_processes_are_killed_is_named() {
    let Some(c) = Cluster::up("host", 15, 2, 2) else { return };
    let child = long_run(&c, &[]);
    for p in c.pids(2) {
        // SAFETY: kill has no memory-safety preconditions; every process of the namespace is
        // this test's (the cluster is its own).
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    let out = wait(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("ranks 2, 3 (host nx-{}-2) ended with no record", c.name)), "{err}");
    nothing_left(&c);
}

#[test]
fn a_cut_link_is_an_error_naming_the_unreachable_ranks() {
    let Some(c) = Cluster::up("link", 16, 2, 2) else { return };
    let child = long_run(&c, &[("NX_TIMEOUT", "5")]);
    let cut = Instant::now();
    let dev = format!("nxv-{}-2", c.name);
    assert!(Command::new("ip").args(["link", "set", &dev, "down"]).status().expect("ip").success());
    let out = wait(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    // a rank of host 1 waited for its peer of host 2 (ranks 2 and 3 are host 2's)
    let named = err.lines().any(|l| {
        l.contains("nx collective timeout")
            && (l.contains("for ranks [2]") || l.contains("for ranks [3]") || l.contains("for ranks [2, 3]"))
    });
    assert!(named, "{err}");
    assert!(
        cut.elapsed() < Duration::from_secs(60),
        "the error came after the timeout, not a hang: {:?}",
        cut.elapsed()
    );
    nothing_left(&c);
    // unchecked all-reduces of 4 MiB: the cut meets the ranks inside MPI's calls, where the
    // watchdog ends the wait (3 s) naming the ranks of the other host
    assert!(Command::new("ip").args(["link", "set", &dev, "up"]).status().expect("ip").success());
    let check = binary("nx-mpi-check");
    let mut cmd = c.nx_run(4, &["--grace", "2"]);
    cmd.arg(&check).arg("forever").stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("nx run starts");
    assert!(until(Duration::from_secs(60), || c.running(2, &check).len() == 2), "the ranks start");
    std::thread::sleep(Duration::from_secs(2));
    let cut = Instant::now();
    assert!(Command::new("ip").args(["link", "set", &dev, "down"]).status().expect("ip").success());
    let out = wait(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("inside MPI's calls") && err.contains("for ranks [2, 3]"), "{err}");
    assert!(cut.elapsed() < Duration::from_secs(60), "not a hang: {:?}", cut.elapsed());
    nothing_left(&c);
}
