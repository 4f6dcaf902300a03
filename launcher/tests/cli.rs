//! `nx show` and `nx plan`, run as a user runs them.

use std::process::{Command, Output};

fn nx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nx")).args(args).output().expect("nx runs")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "nx failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn show_json_is_exactly_the_documented_form() {
    let o = nx(&["show", "--mesh", "dp=2,tp=3", "--placement", "mesh(0:dp.tp)", "--shape", "7,5", "--json"]);
    let text = stdout(&o);
    assert!(text.starts_with(
        r#"{"mesh":[["dp",2],["tp",3]],"shape":[7,5],"placement":"mesh(0:dp.tp)","devices":[{"index":0,"device":"sim:0","coords":[0,0],"window":[[0,2],[0,5]],"term":null},{"index":1,"device":"sim:1","coords":[0,1],"window":[[2,3],[0,5]],"term":null},"#
    ), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 6);
    assert_eq!(v["devices"][5]["window"], serde_json::json!([[6, 7], [0, 5]]));

    let o = nx(&["show", "--mesh", "x=3", "--placement", "device(1)", "--shape", "4", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["devices"][0]["window"].is_null());
    let o = nx(&["show", "--mesh", "dp=2,tp=2", "--placement", "partial(tp; 0:dp)", "--shape", "5", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["devices"][3]["term"], 1);
}

#[test]
fn show_draws_a_grid_and_a_table() {
    let grid = stdout(&nx(&["show", "--mesh", "dp=2,tp=3", "--placement", "mesh(0:dp, 1:tp)", "--shape", "7,5"]));
    assert!(grid.contains("0..4 │ sim:0 │ sim:1 │ sim:2 │"), "{grid}");
    assert!(grid.contains("4..7 │ sim:3 │ sim:4 │ sim:5 │"), "{grid}");
    let table = stdout(&nx(&["show", "--mesh", "a=2", "--placement", "split(1)", "--shape", "2,3,4"]));
    assert!(table.contains("sim:1    [1]         -     [0..2, 2..3, 0..4]"), "{table}");
}

#[test]
fn plan_json_lists_steps_and_totals() {
    let o = nx(&[
        "plan",
        "--mesh",
        "dp=2,tp=4",
        "--shape",
        "4096,4096",
        "--dtype",
        "f32",
        "--from",
        "mesh(0:tp)",
        "--to",
        "mesh(1:tp)",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["from"], "mesh(0:tp)");
    assert_eq!(v["steps"][0]["op"], "all_to_all");
    assert_eq!(v["steps"][0]["mesh_axes"], serde_json::json!(["tp"]));
    let each = 4096u64 * 4096 * 4 * 3 / 16;
    assert_eq!(v["bytes_sent"], serde_json::json!(vec![each; 8]));
    assert_eq!(v["bytes_received"], serde_json::json!(vec![each; 8]));
    let words = stdout(&nx(&[
        "plan",
        "--mesh",
        "dp=2,tp=4",
        "--shape",
        "9,5",
        "--dtype",
        "bf16",
        "--from",
        "partial(tp)",
        "--to",
        "mesh(0:tp)",
    ]));
    assert!(words.contains("reduce-scatter"), "{words}");
}

#[test]
fn plan_over_hosts_gives_bytes_by_link_and_a_predicted_time() {
    // 64 MiB all-reduced over 2 hosts of 2 at 1 Gbit/s: 32 MiB across a device, S/rate in all
    let args = ["plan", "--mesh", "x=4", "--shape", "4096,4096", "--from", "partial(x)", "--to", "on"];
    let o = nx(&[&args[..], &["--hosts", "2,2", "--across-gbps", "1", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["links"][0]["across_sent"], serde_json::json!(vec![32u64 << 20; 4]));
    let secs = v["predicted_seconds"].as_f64().unwrap();
    let want = (64u64 << 20) as f64 / 1.25e8;
    assert!((secs - want).abs() / want < 1e-3, "{secs} vs {want}");
    let words = stdout(&nx(&[&args[..], &["--hosts", "3,1"]].concat()));
    assert!(words.contains("over 2 hosts ([3, 1] devices a host)") && words.contains("predicted:"), "{words}");
    let bad = nx(&[&args[..], &["--hosts", "2,1"]].concat());
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lays out 3 devices, the mesh x=4 has 4"));
}

#[test]
fn bad_input_is_one_clear_line_and_a_failure() {
    for (args, needle) in [
        (vec!["show", "--mesh", "dp=2", "--placement", "mesh(0:pp)", "--shape", "4"], "has no axis \"pp\""),
        (vec!["show", "--mesh", "dp=2", "--placement", "split(2)", "--shape", "4"], "rank > 2"),
        (vec!["show", "--mesh", "dp=2", "--placement", "mesh(0:dp", "--shape", "4"], "column 10"),
        (vec!["show", "--mesh", "dp=3", "--placement", "on", "--shape", "4,x"], "not an extent"),
        (
            vec!["plan", "--mesh", "dp=2", "--shape", "4", "--dtype", "f33", "--from", "on", "--to", "on"],
            "unknown dtype",
        ),
        (vec!["show", "--mesh", "dp=0", "--placement", "on", "--shape", "4"], "extent 0"),
    ] {
        let o = nx(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn bench_kernels_reports_ratios_as_json() {
    let o =
        nx(&["bench", "kernels", "--size", "65536", "--matmul", "64", "--repeats", "1", "--python", "none", "--json"]);
    let text = stdout(&o);
    let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "copy");
    assert!(names[1].starts_with("read limit"), "{names:?}");
    assert!(rows[1]["value"].as_f64().unwrap() > 0.0, "{}", rows[1]);
    assert!(names.iter().any(|n| n.starts_with("fused")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("fill")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("matmul bf16")), "{names:?}");
    for r in &rows[2..6] {
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["unit"], "GB/s");
    }
    // the pool rows and the submit cost, in microseconds
    assert!(names.contains(&"add, output from the pool each run"), "{names:?}");
    let submit = rows.iter().find(|r| r["name"] == "submit to a queued rig (caller's cost)").expect("submit row");
    assert_eq!(submit["unit"], "us");
    assert!(submit["value"].as_f64().unwrap() > 0.0, "{submit}");
    // without numpy the matmuls have no limit, and say so with nulls
    assert!(rows.last().unwrap()["limit"].is_null());
}

#[test]
fn bench_collectives_reports_nccl_style_json() {
    let o = nx(&["bench", "collectives", "-n", "3", "--max-bytes", "65536", "--repeats", "1", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 5 * 3, "4 collectives and place at 4, 16 and 64 KiB");
    assert!(rows.iter().any(|r| r["op"] == "place_gather"), "{rows:?}");
    for r in &rows {
        for k in ["op", "backend", "bytes", "n", "seconds", "algbw", "busbw", "limit_seconds", "ratio"] {
            assert!(!r[k].is_null(), "{k} in {r}");
        }
        assert_eq!(r["n"], 3);
    }
    let o = nx(&["bench", "collectives", "--backend", "carrier-pigeon"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown backend \"carrier-pigeon\""));
}

/// Runs `nx` with `args`, at most `limit`; answers its output, killed past the limit.
fn nx_within(args: &[&str], limit: std::time::Duration) -> Output {
    use std::time::Instant;
    let mut child = Command::new(env!("CARGO_BIN_EXE_nx"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nx runs");
    let start = Instant::now();
    while child.try_wait().expect("waitable").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("nx {args:?} ran past {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn bad_input_is_one_line_naming_the_problem_never_a_panic() {
    // (arguments, what the one line on stderr must contain)
    let table: &[(&[&str], &str)] = &[
        // numbers: zero, negative, huge, not numbers
        (&["bench", "kernels", "--size", "0"], "\"0\" is not a whole number from 1"),
        (&["bench", "kernels", "--size", "-5"], "--size"),
        (&["bench", "kernels", "--size", "abc"], "\"abc\" is not a whole number"),
        (&["bench", "kernels", "--size", "99999999999999999999999"], "is not a whole number"),
        (&["bench", "kernels", "--matmul", "0"], "\"0\" is not a whole number from 1 to 65536"),
        (&["bench", "kernels", "--size", "17179869184", "--python", "none"], "GiB available"),
        (&["bench", "kernels", "--matmul", "65536", "--python", "none"], "GiB available"),
        (&["bench", "kernels", "--repeats", "0"], "\"0\" is not a whole number from 1"),
        (&["bench", "collectives", "--ranks", "0"], "\"0\" is not a whole number from 1 to 4096"),
        (&["bench", "collectives", "--ranks", "100000"], "from 1 to 4096"),
        (&["bench", "collectives", "--max-bytes", "0"], "from 4096"),
        (&["bench", "collectives", "--backend", "nope"], "unknown backend \"nope\""),
        (&["run", "--timeout", "1e20", "--", "true"], "\"1e20\" is not a number of seconds above 0"),
        (&["run", "--timeout", "0", "--", "true"], "above 0"),
        (&["run", "--timeout", "-1", "--", "true"], "--timeout"),
        (&["run", "--timeout", "nan", "--", "true"], "\"nan\" is not a number of seconds"),
        (&["run", "--timeout", "inf", "--", "true"], "\"inf\" is not a number of seconds"),
        (&["run", "--grace", "1e20", "--", "true"], "\"1e20\" is not a number of seconds from 0"),
        (&["run", "--grace", "-1", "--", "true"], "--grace"),
        (&["run", "-n", "0", "--", "true"], "\"0\" is not a whole number from 1 to 4096"),
        (&["run", "-n", "100000", "--", "true"], "from 1 to 4096"),
        (&["run", "--direct", "-n", "2"], "PROGRAM"),
        (&["run", "--direct", "--", "/nonexistent/program"], "cannot start rank 0 (/nonexistent/program)"),
        (&["run", "--direct", "--store-addr", "nonsense", "--", "true"], "the store cannot listen on nonsense"),
        (&["rank", "--", "true"], "nx rank: no rank in the environment"),
        // meshes
        (
            &["show", "--mesh", "x=100000000000", "--placement", "on", "--shape", "4"],
            "past the most devices a mesh spans",
        ),
        (&["show", "--mesh", "x=4294967296,y=4294967296", "--placement", "on", "--shape", "4"], "most devices"),
        (&["show", "--mesh", "x=0", "--placement", "on", "--shape", "4"], "--mesh"),
        (&["show", "--mesh", "dp=2,dp=2", "--placement", "on", "--shape", "4"], "--mesh"),
        (&["show", "--mesh", "=2", "--placement", "on", "--shape", "4"], "--mesh"),
        (&["show", "--mesh", "dp=2,tp", "--placement", "on", "--shape", "4"], "--mesh"),
        (&["show", "--mesh", "dp=-2", "--placement", "on", "--shape", "4"], "--mesh"),
        // placements
        (&["show", "--mesh", "dp=2", "--placement", "mesh(0:zz)", "--shape", "4"], "no axis \"zz\""),
        (&["show", "--mesh", "dp=2", "--placement", "mesh(0:dp", "--shape", "4"], "--placement"),
        (&["show", "--mesh", "dp=2", "--placement", "split(99)", "--shape", "4"], "tensor axis 99 is not below"),
        (&["show", "--mesh", "dp=2", "--placement", "split(1)", "--shape", "4"], "split(1)"),
        (&["show", "--mesh", "dp=2", "--placement", "device(9)", "--shape", "4"], "device"),
        (&["show", "--mesh", "dp=2", "--placement", "partial(dp; 0:dp)", "--shape", "4"], "both summed and in a cut"),
        (&["show", "--mesh", "dp=2", "--placement", "frobnicate", "--shape", "4"], "--placement"),
        // shapes
        (&["show", "--mesh", "dp=2", "--placement", "on", "--shape", "4,-1"], "\"-1\" in shape"),
        (&["show", "--mesh", "dp=2", "--placement", "on", "--shape", "4,abc"], "\"abc\" in shape"),
        (&["show", "--mesh", "dp=2", "--placement", "on", "--shape", "18446744073709551616"], "in shape"),
        (
            &[
                "plan",
                "--mesh",
                "dp=2,tp=4",
                "--shape",
                "4294967296,4294967296,65536",
                "--from",
                "mesh(0:tp)",
                "--to",
                "mesh(1:tp)",
            ],
            "too large to count in 64 bits",
        ),
        (
            &[
                "plan",
                "--mesh",
                "dp=2",
                "--shape",
                "18446744073709551615,18446744073709551615",
                "--from",
                "on",
                "--to",
                "split(0)",
            ],
            "too large",
        ),
        // dtypes and the rest
        (
            &["plan", "--mesh", "dp=2", "--shape", "4", "--dtype", "float128", "--from", "on", "--to", "split(0)"],
            "unknown dtype \"float128\"",
        ),
        (&["plan", "--mesh", "dp=2", "--shape", "4", "--from", "on(", "--to", "split(0)"], "--from"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, want) in table {
        let o = nx_within(args, std::time::Duration::from_secs(20));
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!o.status.success(), "nx {args:?} succeeded");
        assert!(
            !err.contains("panicked") && !String::from_utf8_lossy(&o.stdout).contains("panicked"),
            "nx {args:?}: {err}"
        );
        assert_eq!(lines.len(), 1, "nx {args:?}: one line on stderr, got {err:?}");
        assert!(lines[0].contains(want), "nx {args:?}: {:?} lacks {want:?}", lines[0]);
    }
}

#[test]
fn the_collective_log_shows_the_bytes_nx_plan_prints() {
    // for each transition, what `nx plan --json` prints per step and device is what every rank's
    // log of running it on the simulated mesh records
    let transitions = [
        ("mesh(0:tp)", "mesh(1:tp)"),
        ("mesh(0:dp.tp)", "on"),
        ("partial(tp; 0:dp)", "mesh(0:dp)"),
        ("partial(tp; 0:dp)", "mesh(0:dp.tp)"),
        ("device(3)", "on"),
        ("mesh(0:dp)", "mesh(0:tp)"),
        ("mesh(0:tp.dp)", "mesh(0:dp.tp)"),
        ("split(1)", "mesh(0:tp)"),
    ];
    for (from, to) in transitions {
        let o = nx(&["plan", "--mesh", "dp=2,tp=4", "--shape", "37,21", "--from", from, "--to", to, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let steps = v["steps"].as_array().unwrap().clone();
        let opts = nx::LaunchOptions { devices: Some(8), ..Default::default() };
        nx::launch_with(&opts, |ctx| {
            let m = ctx.mesh(&[("dp", 2), ("tp", 4)])?;
            let (p, q) = (from.parse::<nx::PlacementSpec>()?.over(&m)?, to.parse::<nx::PlacementSpec>()?.over(&m)?);
            let t = nx::Tensor::<f32>::rand(ctx, &[37, 21], &p, 5)?;
            let (_, log) = ctx.record(|| t.place(&q))?;
            let calls: Vec<_> = log.collectives().collect();
            let u = ctx.index();
            // the steps that issue a collective (every device of this mesh takes part in each)
            let mine: Vec<&serde_json::Value> =
                steps.iter().filter(|s| s["op"] != "local_slice" && s["op"] != "zero_fill").collect();
            assert!(!mine.is_empty(), "{from} -> {to} moves bytes");
            assert_eq!(calls.len(), mine.len(), "{from} -> {to} on device {u}:\n{log}");
            for (e, s) in calls.iter().zip(mine) {
                assert_eq!(e.bytes_sent, s["bytes_sent"][u].as_u64().unwrap(), "{from} -> {to} on device {u}:\n{log}");
                assert_eq!(e.bytes_received, s["bytes_received"][u].as_u64().unwrap(), "{from} -> {to}:\n{log}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    }
}
