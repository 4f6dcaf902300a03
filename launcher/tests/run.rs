//! `nx run` as a user runs it: failures reported and contained, every process gone afterwards, the
//! store. Every run is bounded in time; ranks record their pids, which are checked in /proc.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nx_launcher::store;

const NX: &str = env!("CARGO_BIN_EXE_nx");
const HELPER: &str = env!("CARGO_BIN_EXE_nx-rank-helper");

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("nx-run-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn pids(&self) -> Vec<i32> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("pid-")?.parse().ok())
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `pid` is a live process (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

fn nx_run(dir: &Dir, args: &[&str]) -> Command {
    let mut c = Command::new(NX);
    c.arg("run").args(args).env("NX_TEST_DIR", &dir.0).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn finish(child: Child, limit: Duration) -> (Output, Duration) {
    // read the pipes while waiting, so that a chatty run never blocks on them
    let start = Instant::now();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (out.unwrap(), start.elapsed()),
        Err(_) => {
            // SAFETY: killing our own child process has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            panic!("nx run ran past {limit:?}");
        }
    }
}

fn all_gone(dir: &Dir) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let live: Vec<i32> = dir.pids().into_iter().filter(|&p| alive(p)).collect();
        if live.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "processes outlived nx run: {live:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_rank_killed_with_sigkill_stops_the_others_and_is_named() {
    let dir = Dir::new("sigkill");
    let child = nx_run(&dir, &["--direct", "-n", "3", "--grace", "1", "--", HELPER, "sigkill", "1"]).spawn().unwrap();
    let (out, took) = finish(child, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{err}");
    assert!(err.contains("rank 1 was killed by signal 9 (SIGKILL)"), "{err}");
    assert!(took < Duration::from_secs(1 + 2 + 2), "stopped within --grace + 2 s (and start-up): {took:?}");
    assert_eq!(dir.pids().len(), 3);
    all_gone(&dir);
}

#[test]
fn a_panic_is_in_the_report() {
    let dir = Dir::new("panic");
    let child = nx_run(&dir, &["--direct", "-n", "3", "--grace", "1", "--", HELPER, "panic", "2"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101));
    assert!(err.contains("nx run: rank 2 exited with status 101"), "{err}");
    assert!(err.contains("panic: boom from rank 2"), "{err}");
    assert!(err.contains("last lines of its stderr"), "{err}");
    all_gone(&dir);
}

#[test]
fn a_rank_that_hangs_past_the_timeout_is_stopped_and_reported() {
    let dir = Dir::new("hang");
    let child =
        nx_run(&dir, &["--direct", "-n", "2", "--timeout", "1", "--grace", "1", "--", HELPER, "hang"]).spawn().unwrap();
    let (out, took) = finish(child, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("nx run: ranks 0, 1 ran past --timeout 1s"), "{err}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    all_gone(&dir);
}

#[test]
fn ctrl_c_reaches_every_rank() {
    let dir = Dir::new("ctrlc");
    let child = nx_run(&dir, &["--direct", "-n", "3", "--grace", "1", "--", HELPER, "hang"]).spawn().unwrap();
    let start = Instant::now();
    while dir.pids().len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(10), "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: sending SIGINT to our own child process has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let (out, _) = finish(child, Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    all_gone(&dir);
}

#[test]
fn twenty_runs_leave_no_process_behind() {
    let dir = Dir::new("twenty");
    for _ in 0..20 {
        // each rank leaves a `sleep` child in its process group and exits 0
        let child = nx_run(&dir, &["--direct", "-n", "2", "--", HELPER, "child"]).spawn().unwrap();
        let (out, _) = finish(child, Duration::from_secs(20));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(dir.pids().len(), 20 * 2 * 2, "ranks and their children recorded");
    all_gone(&dir);
}

#[test]
fn a_rank_that_hangs_alone_is_the_one_named() {
    let dir = Dir::new("hang-one");
    let args = ["--direct", "-n", "3", "--timeout", "2", "--grace", "1", "--", HELPER, "hang", "2"];
    let (out, _) = finish(nx_run(&dir, &args).spawn().unwrap(), Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("nx run: rank 2 ran past --timeout 2s"), "{err}");
    all_gone(&dir);
}

#[test]
fn the_same_failures_through_mpirun() {
    // each report names the failing rank and its host, its status or signal, as direct ones do
    let dir = Dir::new("mpi");
    let child = nx_run(&dir, &["--mpi", "-n", "3", "--grace", "1", "--", HELPER, "panic", "1"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101), "{err}");
    assert!(err.contains("nx run: rank 1 (host ") && err.contains(") exited with status 101"), "{err}");
    assert!(err.contains("panic: boom from rank 1"), "{err}");
    all_gone(&dir);
    let child = nx_run(&dir, &["--mpi", "-n", "3", "--grace", "1", "--", HELPER, "sigkill", "2"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{err}");
    assert!(err.contains("nx run: rank 2 (host ") && err.contains(") was killed by signal 9 (SIGKILL)"), "{err}");
    all_gone(&dir);
    let args = ["--mpi", "-n", "3", "--timeout", "2", "--grace", "1", "--", HELPER, "hang", "1"];
    let (out, took) = finish(nx_run(&dir, &args).spawn().unwrap(), Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("nx run: rank 1 (host ") && err.contains("ran past --timeout 2s"), "{err}");
    assert!(took < Duration::from_secs(2 + 1 + 5), "{took:?}");
    all_gone(&dir);
}

#[test]
fn mpirun_ranks_get_their_variables_and_tagged_whole_lines() {
    let dir = Dir::new("mpi-env");
    let child = nx_run(&dir, &["--mpi", "-n", "3", "--tag-output", "--", HELPER, "env"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..3 {
        let want = format!("[{r}] rank {r}: NX_RANK={r} NX_WORLD_SIZE=3 NX_LOCAL_RANK={r} NX_LOCAL_WORLD_SIZE=3");
        assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
    }
    let child = nx_run(&dir, &["--mpi", "-n", "3", "--tag-output", "--", HELPER, "lines", "200"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3 * 200);
    for l in lines {
        let r = l.strip_prefix('[').and_then(|s| s.split_once("] ")).expect("a tag");
        assert!(r.1.starts_with(&format!("rank {} line", r.0)) && r.1.ends_with(&"x".repeat(200)), "{l}");
    }
    // and they meet through the store (twice at one barrier)
    let (out, _) =
        finish(nx_run(&dir, &["--mpi", "-n", "3", "--", HELPER, "store"]).spawn().unwrap(), Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..3 {
        assert!(text.contains(&format!("rank {r} met hello-{}", (r + 1) % 3)), "{text}");
    }
    all_gone(&dir);
}

#[test]
fn tagged_output_lines_are_whole() {
    let dir = Dir::new("tags");
    let child = nx_run(&dir, &["--direct", "-n", "4", "--tag-output", "--", HELPER, "lines", "300"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * 300);
    for l in lines {
        let r = l.strip_prefix('[').and_then(|s| s.split_once("] ")).expect("a tag");
        assert!(r.1.starts_with(&format!("rank {} line", r.0)) && r.1.ends_with(&"x".repeat(200)), "{l}");
    }
}

#[test]
fn ranks_meet_through_the_store() {
    let dir = Dir::new("store");
    let child = nx_run(&dir, &["--direct", "-n", "4", "--", HELPER, "store"]).spawn().unwrap();
    let (out, _) = finish(child, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..4 {
        assert!(text.contains(&format!("rank {r} met hello-{}", (r + 1) % 4)), "{text}");
    }
}

#[test]
fn the_store_under_64_clients_loses_nothing_and_refuses_strangers() {
    let server = store::start("127.0.0.1:0", "secret").unwrap();
    let addr = server.addr.to_string();
    std::thread::scope(|s| {
        for i in 0..64 {
            let addr = addr.clone();
            s.spawn(move || {
                let mut c = nx::store::StoreClient::connect(&addr, "secret", Duration::from_secs(5)).unwrap();
                c.set(&format!("k{i}"), &format!("v{i}")).unwrap();
                c.add("total", 1).unwrap();
                c.barrier("everyone", 64, Duration::from_secs(20)).unwrap();
                // reusable: the same name again, and again
                c.add("between", 1).unwrap();
                c.barrier("everyone", 64, Duration::from_secs(20)).unwrap();
                assert_eq!(c.add("between", 0).unwrap(), 64, "the second barrier waited for all");
                c.barrier("everyone", 64, Duration::from_secs(20)).unwrap();
            });
        }
    });
    let mut c = nx::store::StoreClient::connect(&addr, "secret", Duration::from_secs(5)).unwrap();
    for i in 0..64 {
        assert_eq!(c.get(&format!("k{i}")).unwrap(), Some(format!("v{i}")));
    }
    assert_eq!(c.add("total", 0).unwrap(), 64);
    let e = c.add("total", i64::MAX).unwrap_err().to_string();
    assert!(e.contains("overflows"), "{e}");
    // a barrier that times out withdraws its arrival (the second try counts one again)
    let e = c.barrier("pair", 2, Duration::from_millis(100)).unwrap_err().to_string();
    assert!(e.contains("barrier \"pair\" timed out after 100 ms with 1 of 2 arrived"), "{e}");
    let e = c.barrier("pair", 2, Duration::from_millis(100)).unwrap_err().to_string();
    assert!(e.contains("with 1 of 2 arrived"), "{e}");
    // a count that disagrees with the clients waiting is refused; the right one completes it
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let mut w = nx::store::StoreClient::connect(&addr, "secret", Duration::from_secs(5)).unwrap();
            w.barrier("trio", 2, Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(300));
        let e = c.barrier("trio", 3, Duration::from_secs(1)).unwrap_err().to_string();
        assert!(e.contains("barrier \"trio\" waits for 2 clients; this one asked for 3"), "{e}");
        c.barrier("trio", 2, Duration::from_secs(10)).unwrap();
        waiting.join().unwrap().unwrap();
    });
    let e = c.wait("missing", Duration::from_millis(200)).unwrap_err().to_string();
    assert!(e.contains("timed out after 200 ms waiting for key \"missing\""), "{e}");
    let e = nx::store::StoreClient::connect(&addr, "guess", Duration::from_secs(5)).unwrap_err().to_string();
    assert!(e.contains("refused this client"), "{e}");
    let e = nx::store::StoreClient::connect("127.0.0.1:1", "x", Duration::from_millis(500)).unwrap_err().to_string();
    assert!(e.contains("cannot reach the store at 127.0.0.1:1"), "{e}");
}

#[test]
fn bad_invocations_are_one_clear_line() {
    // direct ranks on hosts: more ranks than slots, or slots that are no number
    let o = Command::new(NX).args(["run", "--direct", "--hosts", "a:2", "-n", "3", "--", HELPER]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("-n 3 is more than the 2 slots of --hosts"));
    let o = Command::new(NX).args(["run", "--direct", "--hosts", "a:x", "-n", "1", "--", HELPER]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"a:x\": the slots must be a positive number"));
    let o = Command::new(NX).args(["run", "--direct", "-n", "1", "--", "/nonexistent/program"]).output().unwrap();
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot start rank 0"));
    let o = Command::new(NX).arg("info").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("backends compiled in: sim"));
}

/// `nx info --json`: the host's facts (memory naming its source, the cores this process may use),
/// the pool's size and thresholds kept in the given cache, every shipped device; `--device` one.
#[test]
fn info_prints_the_facts_as_json() {
    let cache = std::env::temp_dir().join(format!("nx-info-cache-{}", std::process::id()));
    let o = Command::new(NX).args(["info", "--json"]).env("XDG_CACHE_HOME", &cache).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let src = v["host"]["memory"]["source"].as_str().unwrap();
    assert!(src == "/proc/meminfo" || src.starts_with("cgroup v"), "{src}");
    let cores = v["host"]["usable_cores"].as_u64().unwrap();
    assert_eq!(v["pool"]["threads"].as_u64(), Some(cores));
    let origin = v["pool"]["thresholds_source"].as_str().unwrap();
    if cores > 1 {
        // measured now and kept in the cache given: the second run reads them
        assert!(origin.contains(&cache.join("nx").join("host").display().to_string()), "{origin}");
        let again = Command::new(NX).args(["info", "--json"]).env("XDG_CACHE_HOME", &cache).output().unwrap();
        let w: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
        assert!(w["pool"]["thresholds_source"].as_str().unwrap().starts_with("read from"), "{w}");
        assert_eq!(w["pool"]["thresholds"], v["pool"]["thresholds"]);
    }
    let names: Vec<&str> = v["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"NVIDIA H200"), "{names:?}");
    let o = Command::new(NX).args(["info", "--device", "nvidia/nvidia_h200"]).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d["compute_capability"], "9.0");
    let o = Command::new(NX).args(["info", "--device", "nvidia/nope"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no device file nvidia/nope"));
    // this machine's GPUs, or why there are none
    assert!(v["gpus"]["gpus"].is_array() || v["gpus"]["absent"].is_string(), "{}", v["gpus"]);
    // the GPUs a driver reports (the stand-in driver of the kernels' tests): listed, with their key
    let so = cache.join("libcuda.so.1");
    std::fs::create_dir_all(&cache).unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/tests/data/fake_libcuda.c");
    let cc = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(src).output().expect("cc");
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let o = Command::new(NX).arg("info").arg("--cuda-driver").arg(&so).env("XDG_CACHE_HOME", &cache).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("CUDA 12.8")
            && text.contains("0: NVIDIA H200 (nvidia-h200, shipped file), compute capability 9.0, 132 multiprocessors"),
        "{text}"
    );
    assert!(text.contains("1: NVIDIA Fake Z9 (nvidia-fake-z9), compute capability 12.1"), "{text}");
    let o = Command::new(NX)
        .args(["info", "--json", "--cuda-driver"])
        .arg(&so)
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["gpus"]["gpus"][0]["max_shared_memory_per_block"], 232_448);
    // NVRTC, cuBLAS and NCCL: their versions from the directories scripts/test names, else why not
    let mut cmd = Command::new(NX);
    cmd.args(["info", "--json"]);
    let dirs = std::env::var("NX_CUDA_LIB_DIRS").unwrap_or_default();
    // (an unset variable splits into one empty path, which is no directory)
    for d in std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()) {
        cmd.arg("--cuda-libs").arg(d);
    }
    let w: serde_json::Value = serde_json::from_slice(&cmd.output().unwrap().stdout).unwrap();
    for lib in ["nvrtc", "cublas", "nccl"] {
        let r = &w["cuda_libraries"][lib];
        assert!(if dirs.is_empty() { r["Err"].is_string() } else { r["Ok"].is_string() }, "{lib}: {r}");
    }
    let o = Command::new(NX).args(["info", "--cuda-driver", "/nonexistent/libcuda.so.1"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("GPUs: none (/nonexistent/libcuda.so.1 does not load"));
    std::fs::remove_dir_all(&cache).ok();
}
