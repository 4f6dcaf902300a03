//! Each example runs on the simulated mesh and (feature `mpi`) under `mpirun`, and succeeds;
//! `train_mlp` ends with the same parameters, bit for bit, in both modes.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The example's binary, built beside this test (cargo builds examples with the tests).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let path = dir.join("examples").join(name);
    assert!(path.exists(), "{} is not built (cargo build --examples)", path.display());
    path
}

/// A small, quick `train_gpt`.
const GPT: &[&str] = &["--steps", "12", "--layers", "1", "--width", "32", "--batch", "12", "--mesh", "dp=2,tp=2"];

fn run(mut cmd: Command, limit: Duration) -> Output {
    let start = Instant::now();
    let mut child =
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawns");
    while child.try_wait().expect("waitable").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn checksum(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text.lines().find_map(|l| l.strip_prefix("parameters checksum: ")).expect("a checksum line").to_string()
}

#[test]
fn examples_run_on_the_simulated_mesh() {
    for name in ["placements", "tensor_parallel"] {
        let out = run(Command::new(example(name)), Duration::from_secs(120));
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut cmd = Command::new(example("train_mlp"));
    cmd.args(["--steps", "30", "--mesh", "dp=2,tp=2"]);
    let out = run(cmd, Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("final loss:") && text.contains("single-device reference"), "{text}");
    checksum(&out);
    let mut cmd = Command::new(example("train_gpt"));
    cmd.args(GPT);
    let out = run(cmd, Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("final loss:") && text.contains("held-out accuracy:"), "{text}");
    checksum(&out);
    // --dry-run: the report of every rank, no kernel run
    for (name, args) in [("train_mlp", &["--steps", "3", "--mesh", "dp=2,tp=4"][..]), ("train_gpt", GPT)] {
        let mut cmd = Command::new(example(name));
        cmd.args(args).arg("--dry-run");
        let out = run(cmd, Duration::from_secs(120));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{name} --dry-run: {text}{}", String::from_utf8_lossy(&out.stderr));
        let ranks = if name == "train_mlp" { 8 } else { 4 };
        assert!(text.contains("no kernel ran") && text.matches("peak memory: ").count() == ranks, "{text}");
        assert!(text.contains("AllReduce") && text.contains("contract"), "{text}");
    }
    // bad options: a clear error and a failure
    let mut cmd = Command::new(example("train_gpt"));
    cmd.args(["--mesh", "dp=2,tp=3"]);
    let out = run(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not divide"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new(example("train_mlp"));
    cmd.args(["--mesh", "dp=2"]);
    let out = run(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give dp=N,tp=M"));
}

#[cfg(feature = "mpi")]
#[test]
fn examples_run_under_mpirun_with_the_same_bits() {
    let mpirun = |n: usize, name: &str, args: &[&str]| {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-n", &n.to_string()])
            .arg(example(name))
            .args(args)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        run(cmd, Duration::from_secs(300))
    };
    for (n, name) in [(6, "placements"), (4, "tensor_parallel")] {
        let out = mpirun(n, name, &[]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let args = ["--steps", "30", "--mesh", "dp=2,tp=2"];
    let mpi = checksum(&mpirun(4, "train_mlp", &args));
    // and through `nx run -n 4 --mpi` (the launcher of the workspace, built beside this test by
    // `cargo test --workspace`): its absence fails the test
    let nx = example("placements").parent().and_then(|d| d.parent()).expect("target/<profile>").join("nx");
    assert!(nx.exists(), "{} is not built: run the tests with --workspace (scripts/test does)", nx.display());
    {
        let mut cmd = Command::new(&nx);
        cmd.args(["run", "-n", "4", "--mpi", "--"]).arg(example("train_mlp")).args(args);
        assert_eq!(checksum(&run(cmd, Duration::from_secs(300))), mpi, "under nx run");
        for (n, name) in [(4, "tensor_parallel"), (6, "placements")] {
            let mut cmd = Command::new(&nx);
            cmd.args(["run", "-n", &n.to_string(), "--mpi", "--"]).arg(example(name));
            let out = run(cmd, Duration::from_secs(300));
            assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let mut cmd = Command::new(example("train_mlp"));
    cmd.args(args);
    let sim = checksum(&run(cmd, Duration::from_secs(300)));
    assert_eq!(mpi, sim, "the final parameters under MPI and on the simulated mesh");
    // train_gpt likewise, under mpirun and nx run
    let gpt_mpi = checksum(&mpirun(4, "train_gpt", GPT));
    let mut cmd = Command::new(&nx);
    cmd.args(["run", "-n", "4", "--mpi", "--"]).arg(example("train_gpt")).args(GPT);
    assert_eq!(checksum(&run(cmd, Duration::from_secs(300))), gpt_mpi, "train_gpt under nx run");
    let mut cmd = Command::new(example("train_gpt"));
    cmd.args(GPT);
    assert_eq!(checksum(&run(cmd, Duration::from_secs(300))), gpt_mpi, "train_gpt under MPI and on the simulated mesh");
}

/// A rank killed (SIGKILL) in the middle of a save, through `nx run`: the run fails naming it,
/// the previous checkpoint stays the one `latest` names and loads, and no partial checkpoint is
/// visible.
#[cfg(feature = "mpi")]
#[test]
fn a_rank_killed_during_a_save_leaves_the_previous_checkpoint() {
    let dir = std::env::temp_dir().join(format!("nx-ckpt-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nx = example("placements").parent().and_then(|d| d.parent()).expect("target/<profile>").join("nx");
    let mut cmd = Command::new(&nx);
    cmd.args(["run", "-n", "2", "--mpi", "--"]).arg(example("ckpt_crash")).arg(&dir).args(["--die-at", "3"]);
    let out = run(cmd, Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run fails");
    assert!(err.contains("rank 1") && err.contains("signal 9"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("saved step 2") && !text.contains("saved step 3"), "{text}");
    let ck = nx::ckpt::Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.index().step, 2);
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(!names.iter().any(|n| n == "ckpt-0000000003"), "{names:?}");
    let got = nx::launch_with(&nx::LaunchOptions { devices: Some(3), ..Default::default() }, |ctx| {
        let cols = nx::Placement::split(1, ctx.devices())?;
        Ok(nx::ckpt::Checkpoint::open(&dir)?.load::<f32>(ctx, "w", &cols)?.full()?.to_vec()?)
    })
    .unwrap()
    .remove(0);
    let want: Vec<f32> = (0..1024 * 256).map(|k| 2000.0 + ((k / 256) % 7) as f32 + (k % 256) as f32).collect();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).ok();
}

/// `train_mlp --save`, then `nx ckpt info` and `nx ckpt merge` on what it saved, and
/// `train_gpt --resume` on another mesh.
#[test]
fn checkpoints_from_the_examples_and_the_nx_ckpt_command() {
    let dir = std::env::temp_dir().join(format!("nx-ckpt-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nx = example("placements").parent().and_then(|d| d.parent()).expect("target/<profile>").join("nx");
    assert!(nx.exists(), "{} is not built: run the tests with --workspace (scripts/test does)", nx.display());
    let mut cmd = Command::new(example("train_mlp"));
    cmd.args(["--steps", "20", "--mesh", "dp=2,tp=2", "--save"]).arg(dir.join("mlp")).args(["--save-every", "10"]);
    let full = run(cmd, Duration::from_secs(300));
    let whole = checksum(&full);
    // resumed from step 10 on another mesh: the same final parameters (to rounding: the checksum
    // line is over f64 bits, so compare the final loss line instead)
    let mut cmd = Command::new(example("train_mlp"));
    cmd.args(["--steps", "20", "--mesh", "dp=1,tp=3", "--resume"]).arg(dir.join("mlp").join("ckpt-0000000010"));
    let resumed = run(cmd, Duration::from_secs(300));
    let line = |o: &Output| {
        String::from_utf8_lossy(&o.stdout).lines().find(|l| l.starts_with("final loss:")).map(|l| l[..24].to_string())
    };
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(line(&resumed), line(&full), "the resumed run ends as the uninterrupted one");
    assert!(!whole.is_empty());
    // nx ckpt info and merge
    let info = run(
        {
            let mut c = Command::new(&nx);
            c.args(["ckpt", "info"]).arg(dir.join("mlp"));
            c
        },
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    assert!(
        text.contains("(step 20, 4 tensors)")
            && text.contains("w1: float64 [16, 33] at mesh(1:tp)")
            && text.contains("checksum"),
        "{text}"
    );
    let out = dir.join("mlp.safetensors");
    let merged = run(
        {
            let mut c = Command::new(&nx);
            c.args(["ckpt", "merge"]).arg(dir.join("mlp")).arg("-o").arg(&out);
            c
        },
        Duration::from_secs(60),
    );
    assert!(merged.status.success(), "{}", String::from_utf8_lossy(&merged.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("w1").unwrap().shape(), [16, 33]);
    // a missing checkpoint: a clear error
    let bad = run(
        {
            let mut c = Command::new(&nx);
            c.args(["ckpt", "info"]).arg(dir.join("none"));
            c
        },
        Duration::from_secs(60),
    );
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("nx::ckpt::Checkpoint::open"));
    std::fs::remove_dir_all(&dir).ok();
}
