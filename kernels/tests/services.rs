//! Host services: the measured thread pool (its size against the machine's own files, read
//! independently here; affinity respected in a child under `taskset`), the thresholds measured
//! once and reused from their store, settings overriding both, the same bits inline and on the
//! pool, and the device facts (shipped files, keys, the running host).

use std::collections::BTreeSet;
use std::path::PathBuf;

use half::bf16;
use nx_kernels::facts::{self, arch_string, Cores, CpuReadings};
use nx_kernels::host::{HostOptions, Origin, Store, Work};
use nx_kernels::prog::{Prog, UnOp};
use nx_kernels::{Array, Dtype, Host, Kernels, Move, Reduction};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn readings(allowed: &[usize], cores: &[(usize, usize)]) -> CpuReadings {
    CpuReadings {
        allowed: allowed.to_vec(),
        core_of: cores.iter().enumerate().map(|(cpu, &c)| (cpu, c)).collect(),
        performance: None,
        quota: None,
    }
}

#[test]
fn cores_count_physical_cores_under_affinity_hybrid_and_quota() {
    // 8 CPUs on 4 cores (SMT pairs 0/4, 1/5, ...), as Linux numbers them
    let smt: Vec<(usize, usize)> = (0..8).map(|c| (0, c % 4)).collect();
    assert_eq!(Cores::from_readings(&readings(&(0..8).collect::<Vec<_>>(), &smt)).count, 4);
    // affinity of two siblings: one core
    assert_eq!(Cores::from_readings(&readings(&[1, 5], &smt)).count, 1);
    assert_eq!(Cores::from_readings(&readings(&[0, 1, 2], &smt)).count, 3);
    // two packages whose core ids repeat: cores differ by package
    let two: Vec<(usize, usize)> = (0..4).map(|c| (c / 2, c % 2)).collect();
    assert_eq!(Cores::from_readings(&readings(&[0, 1, 2, 3], &two)).count, 4);
    // a hybrid CPU: 4 performance CPUs on 2 cores (SMT), 4 efficiency cores
    let hybrid: Vec<(usize, usize)> = [(0, 0), (0, 0), (0, 1), (0, 1), (0, 8), (0, 9), (0, 10), (0, 11)].to_vec();
    let mut r = readings(&(0..8).collect::<Vec<_>>(), &hybrid);
    r.performance = Some(vec![0, 1, 2, 3]);
    let c = Cores::from_readings(&r);
    assert_eq!(c.count, 2, "{}", c.source);
    assert!(c.source.contains("performance"), "{}", c.source);
    // affinity on efficiency cores only: those cores, not none
    r.allowed = vec![4, 5];
    assert_eq!(Cores::from_readings(&r).count, 2);
    // a quota of 1.5 CPUs holds 4 cores to 2
    let mut q = readings(&(0..8).collect::<Vec<_>>(), &smt);
    q.quota = Some((150_000, 100_000, "cpu.max".into()));
    let c = Cores::from_readings(&q);
    assert_eq!(c.count, 2);
    assert!(c.source.contains("quota") && c.source.contains("cpu.max"), "{}", c.source);
    // a quota above the cores changes nothing; CPUs sysfs does not describe are cores of their own
    q.quota = Some((1_000_000, 100_000, "cpu.max".into()));
    assert_eq!(Cores::from_readings(&q).count, 4);
    assert_eq!(Cores::from_readings(&readings(&[0, 1, 2], &[])).count, 3);
    assert!(Cores::from_readings(&CpuReadings::default()).count >= 1);
}

#[test]
fn cpu_lists_parse_as_the_kernel_writes_them() {
    assert_eq!(facts::parse_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
    assert_eq!(facts::parse_list("5"), Some(vec![5]));
    assert_eq!(facts::parse_list(""), Some(vec![]));
    assert_eq!(facts::parse_list("3-1"), None);
    assert_eq!(facts::parse_list("a"), None);
}

/// The cores this process may use, read here otherwise than the library reads them: the affinity
/// through `taskset -p` (the library reads `/proc/thread-self/status`), cores through each CPU's
/// `thread_siblings_list` (the library reads `core_id` and `physical_package_id`).
fn independent_cores() -> Option<usize> {
    let out = std::process::Command::new("taskset").args(["-cp", &std::process::id().to_string()]).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let list = text.rsplit(':').next()?.trim().to_string();
    let allowed = facts::parse_list(&list)?;
    let mut cores = BTreeSet::new();
    for cpu in &allowed {
        let f = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
        let siblings = std::fs::read_to_string(f).ok()?;
        // a core is named by its lowest allowed sibling
        let sib = facts::parse_list(siblings.trim())?;
        cores.insert(sib.into_iter().filter(|s| allowed.contains(s)).min()?);
    }
    Some(cores.len())
}

#[test]
fn the_pool_measures_the_cores_this_process_may_use() {
    let Some(expected) = independent_cores() else {
        eprintln!("no taskset or CPU topology here: the measured size is only checked to be at least 1");
        assert!(Host::new().threads() >= 1);
        return;
    };
    // a cgroup quota would lower the measurement below the affinity's cores
    let quota = CpuReadings::read().quota;
    let host = Host::new();
    // a quota, or a hybrid CPU's performance cores, lower the measurement below the cores
    let hybrid = std::path::Path::new("/sys/devices/cpu_core/cpus").exists();
    match (quota, hybrid) {
        (None, false) => assert_eq!(host.threads(), expected, "{}", host.threads_source()),
        _ => assert!(host.threads() <= expected, "{}", host.threads_source()),
    }
    assert_eq!(host.threads(), Cores::measured().count);
    // a setting overrides the measurement
    assert_eq!(Host::with_threads(3).unwrap().threads(), 3);
    assert_eq!(Host::with_threads(3).unwrap().threads_source(), "set to 3");
}

/// Run in a child under `taskset -c CPU` by the test below: one CPU allowed, one thread measured.
#[test]
fn child_under_one_cpu() {
    let Ok(cpu) = std::env::var("NX_TEST_ONE_CPU") else { return };
    let host = Host::new();
    assert_eq!(host.threads(), 1, "{}", host.threads_source());
    assert!(host.threads_source().contains(&format!("1 CPUs allowed ({cpu})")), "{}", host.threads_source());
}

#[test]
fn affinity_set_by_taskset_is_respected() {
    let exe = std::env::current_exe().unwrap();
    // the first CPU this process may use
    let Some(cpu) = CpuReadings::read().allowed.first().copied() else { return };
    let Ok(out) = std::process::Command::new("taskset")
        .arg("-c")
        .arg(cpu.to_string())
        .arg(&exe)
        .args(["--exact", "child_under_one_cpu", "--nocapture"])
        .env("NX_TEST_ONE_CPU", cpu.to_string())
        .output()
    else {
        eprintln!("no taskset: skipped");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
}

fn temp_store(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nx-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn thresholds_are_measured_once_and_reused_from_the_store() {
    let dir = temp_store("reuse");
    let opts = HostOptions { threads: Some(2), store: Store::Dir(dir.clone()), ..Default::default() };
    let first = Host::with_options(opts.clone()).unwrap();
    let (t1, o1) = first.thresholds();
    let Origin::Measured(Some(file)) = o1 else { panic!("the first library measures and writes: {o1:?}") };
    assert!(file.starts_with(&dir) && file.exists(), "{file:?}");
    assert!(file.file_name().unwrap().to_string_lossy().ends_with("-2t.json"), "{file:?}");
    for w in Work::ALL {
        assert!(t1.of(w) >= 1, "{w:?}");
    }
    // a second library reads the store (no probe): the same thresholds
    let second = Host::with_options(opts.clone()).unwrap();
    assert_eq!(second.thresholds(), (t1, Origin::Stored(file.clone())));
    // what the store holds is what every later library uses
    std::fs::write(&file, r#"{"thresholds":{"map":12345,"reduce":777,"convert":99}}"#).unwrap();
    let third = Host::with_options(opts.clone()).unwrap();
    assert_eq!((third.threshold(Work::Map), third.threshold(Work::Reduce)), (12345, 777));
    // a setting overrides the store, kind by kind
    let set = Host::with_options(HostOptions { map: Some(5), ..opts.clone() }).unwrap();
    assert_eq!((set.threshold(Work::Map), set.threshold(Work::Reduce), set.threshold(Work::Convert)), (5, 777, 99));
    // a damaged file is measured again and rewritten
    std::fs::write(&file, "{not json").unwrap();
    let fourth = Host::with_options(opts.clone()).unwrap();
    assert!(matches!(fourth.thresholds().1, Origin::Measured(Some(_))));
    assert!(std::fs::read_to_string(&file).unwrap().contains("thresholds"));
    // clones share what one measured
    let clone = fourth.clone();
    assert_eq!(clone.thresholds(), fourth.thresholds());
    // a pool of one thread runs everything inline and measures nothing
    let one =
        Host::with_options(HostOptions { threads: Some(1), store: Store::Dir(dir.clone()), ..Default::default() })
            .unwrap();
    assert_eq!(one.thresholds().1, Origin::OneThread);
    assert_eq!(one.threshold(Work::Map), usize::MAX);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_settings_are_refused_by_name() {
    let e = Host::with_options(HostOptions { threads: Some(0), ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("Host::with_options") && e.contains("0 threads"), "{e}");
    let e = Host::with_options(HostOptions { reduce: Some(0), store: Store::Memory, ..Default::default() })
        .unwrap_err()
        .to_string();
    assert!(e.contains("reduce threshold of 0"), "{e}");
}

fn host(threads: usize, threshold: usize) -> Host {
    Host::with_options(HostOptions {
        threads: Some(threads),
        map: Some(threshold),
        reduce: Some(threshold),
        convert: Some(threshold),
        store: Store::Memory,
        ..HostOptions::default()
    })
    .unwrap()
}

fn value(i: usize) -> f32 {
    ((i * 7919 % 10007) as f32 - 5003.0) * 1e-3
}

/// Exponentials, row sums and conversions: inline and on pools of 2 and 3 threads, the same bits,
/// each within its bound of a naive f64 reference.
#[test]
fn inline_and_pooled_work_give_the_same_bits() {
    let (inline, two, three) = (host(2, usize::MAX), host(2, 1), host(3, 1));
    for n in [0usize, 1, 2047, 2049, 70_001, 300_001] {
        let src = Array::<f32>::from_fn(DEV, &[n], |i| value(i[0])).unwrap();
        let mut prog = Prog::new(&[Dtype::F32]);
        let x = prog.load(0);
        let y = prog.unary(UnOp::Exp, x);
        prog.output(y);
        let mut outs = Vec::new();
        for h in [&inline, &two, &three] {
            let dst = Array::<f32>::zeros(DEV, &[n]).unwrap();
            assert_eq!(h.map(&prog, &[n], &[&dst], &[&src]), nx_kernels::Answer::Done);
            outs.push(dst.to_vec().unwrap());
        }
        assert!(outs.iter().all(|o| o.iter().map(|v| v.to_bits()).eq(outs[0].iter().map(|v| v.to_bits()))), "map {n}");
        for (i, &v) in outs[0].iter().enumerate() {
            let e = (value(i) as f64).exp();
            assert!(((v as f64) - e).abs() <= 4.0 * f32::EPSILON as f64 * e, "exp at {i}: {v} against {e}");
        }
        // row sums over rows of 1000 (and the remainder as one row): every reduce branch
        let rows = n / 1000 + 1;
        let cols = n / rows;
        let m = rows * cols;
        let src = Array::<f32>::from_fn(DEV, &[m], |i| value(i[0]))
            .unwrap()
            .apply(&Move::Reshape(vec![rows, cols]))
            .unwrap()
            .unwrap();
        let mut sum = Prog::new(&[Dtype::F32]);
        let x = sum.load(0);
        sum.output(x);
        let mut sums = Vec::new();
        for h in [&inline, &two, &three] {
            for axis in [0usize, 1] {
                let dst = Array::<f32>::zeros(DEV, &[if axis == 1 { rows } else { cols }]).unwrap();
                let shape = [rows, cols];
                assert_eq!(
                    h.reduce(&sum, &shape, &[axis], &[Reduction::Sum], &[&dst], &[&src]),
                    nx_kernels::Answer::Done
                );
                sums.push(dst.to_vec().unwrap());
            }
        }
        for (k, s) in sums.iter().enumerate() {
            assert_eq!(
                s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                sums[k % 2].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "sums {n}"
            );
        }
        for (r, &got) in sums[1].iter().enumerate() {
            let exact: f64 = (0..cols).map(|c| value(r * cols + c) as f64).sum();
            let bound: f64 =
                (0..cols).map(|c| (value(r * cols + c) as f64).abs()).sum::<f64>() * cols as f64 * f32::EPSILON as f64;
            assert!((got as f64 - exact).abs() <= bound + 1e-30, "row {r} of {n}");
        }
        // conversions: the same bits as the library's plain `convert`, and each the nearest bf16
        let xs: Vec<f32> = (0..n).map(value).collect();
        let mut want = vec![bf16::ZERO; n];
        nx_kernels::convert(&xs, &mut want).unwrap();
        for h in [&inline, &two, &three] {
            let mut got = vec![bf16::ZERO; n];
            h.convert(&xs, &mut got).unwrap();
            assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().map(|v| v.to_bits())), "convert {n}");
        }
        for (i, w) in want.iter().enumerate().take(5000) {
            let err = (w.to_f64() - xs[i] as f64).abs();
            assert!(err <= (xs[i] as f64).abs() * 2f64.powi(-8), "bf16 of {}", xs[i]);
        }
    }
    let e = inline.convert(&[1.0f32, 2.0], &mut [bf16::ZERO]).unwrap_err().to_string();
    assert!(e.contains("Host::convert") && e.contains('2') && e.contains('1'), "{e}");
}

/// Threads of this process, from `/proc/self/task`.
fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// A library's maps, reductions, products and conversions, small and large, start exactly its
/// pool's threads: none of rayon's global pool, none of faer's own. Counted in a child process
/// of its own (`pool_threads_child`), where no other test starts threads.
#[test]
fn a_library_runs_on_its_own_pool_only() {
    if threads_now() == 0 {
        eprintln!("no /proc/self/task here: skipped");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "pool_threads_child", "--nocapture", "--test-threads", "1"])
        .env("NX_TEST_POOL_THREADS", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
fn pool_threads_child() {
    if std::env::var("NX_TEST_POOL_THREADS").is_err() {
        return;
    }
    let before = threads_now();
    let h = host(3, 4096);
    let n = 1 << 18;
    let src = Array::<f32>::from_fn(DEV, &[n], |i| value(i[0])).unwrap();
    let mut prog = Prog::new(&[Dtype::F32]);
    let x = prog.load(0);
    let y = prog.unary(UnOp::Exp, x);
    prog.output(y);
    for m in [10usize, n] {
        let s = src.apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(m as isize), step: 1 }).unwrap().unwrap();
        let dst = Array::<f32>::zeros(DEV, &[m]).unwrap();
        assert_eq!(h.map(&prog, &[m], &[&dst], &[&s]), nx_kernels::Answer::Done);
        let one = Array::<f32>::zeros(DEV, &[]).unwrap();
        let mut sum = Prog::new(&[Dtype::F32]);
        let x = sum.load(0);
        sum.output(x);
        assert_eq!(h.reduce(&sum, &[m], &[0], &[Reduction::Sum], &[&one], &[&s]), nx_kernels::Answer::Done);
    }
    let a = Array::<f32>::from_fn(DEV, &[256, 256], |i| value(i[0] * 256 + i[1])).unwrap();
    let c = Array::<f32>::zeros(DEV, &[256, 256]).unwrap();
    let spec = nx_kernels::Contraction::matmul(0);
    assert_eq!(h.contract(&spec, &c, &a, &a, None), nx_kernels::Answer::Done);
    let mut out = vec![bf16::ZERO; n];
    h.convert(&src.to_vec().unwrap(), &mut out).unwrap();
    assert_eq!(threads_now().saturating_sub(before), 3, "threads started besides the library's pool of 3");
}

/// A library made with `this_thread` runs on the thread that made it: its calls from there stay
/// there (no hand-off), one of one thread starts no thread at all (its products' splits stay off
/// rayon's global pool), one of three starts two; a call from another thread still completes;
/// its products give the bits of a library of its own pool. In a child process, as above.
#[test]
fn a_library_on_this_thread_keeps_its_work_there() {
    if threads_now() == 0 {
        eprintln!("no /proc/self/task here: skipped");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "this_thread_child", "--nocapture", "--test-threads", "1"])
        .env("NX_TEST_THIS_THREAD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
fn this_thread_child() {
    if std::env::var("NX_TEST_THIS_THREAD").is_err() {
        return;
    }
    let (m, k, n) = (97usize, 300, 130);
    let a = Array::<f32>::from_fn(DEV, &[m, k], |i| value(i[0] * k + i[1])).unwrap();
    let b = Array::<f32>::from_fn(DEV, &[k, n], |i| value(i[0] * n + i[1] + 1)).unwrap();
    let spec = nx_kernels::Contraction::matmul(0);
    let product = |h: &Host| {
        let c = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
        assert_eq!(h.contract(&spec, &c, &a, &b, None), nx_kernels::Answer::Done);
        c.to_vec().unwrap()
    };
    let on_this = |threads| {
        Host::with_options(HostOptions { threads: Some(threads), this_thread: true, ..HostOptions::default() }).unwrap()
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    // each on a thread of its own: a thread is the first of one such pool in its lifetime
    let (got, one) = std::thread::scope(|s| {
        s.spawn(|| {
            let me = std::thread::current().id();
            let before = threads_now();
            let one = on_this(1);
            assert_eq!(one.install(|| (std::thread::current().id(), rayon::current_num_threads())), (me, 1));
            let got = product(&one);
            assert_eq!(threads_now(), before, "a library of one thread on this one started threads");
            let Err(e) = Host::with_options(HostOptions { this_thread: true, ..HostOptions::default() }) else {
                panic!("a second pool on one thread was made")
            };
            let e = e.to_string();
            assert!(e.contains("Host::with_options") && e.contains("this one"), "{e}");
            (got, one)
        })
        .join()
        .unwrap()
    });
    // naive f64 products: the reference
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k).map(|p| value(i * k + p) as f64 * value(p * n + j + 1) as f64).sum();
            let bound: f64 = (0..k).map(|p| (value(i * k + p) as f64 * value(p * n + j + 1) as f64).abs()).sum::<f64>()
                * k as f64
                * f32::EPSILON as f64;
            assert!((got[i * n + j] as f64 - exact).abs() <= bound, "({i}, {j})");
        }
    }
    let three = std::thread::scope(|s| {
        s.spawn(|| {
            let me = std::thread::current().id();
            let before = threads_now();
            let three = on_this(3);
            assert_eq!(three.install(|| (std::thread::current().id(), rayon::current_num_threads())), (me, 3));
            assert_eq!(bits(&product(&three)), bits(&got));
            assert_eq!(threads_now(), before + 2, "a library of three threads on this one starts two");
            three
        })
        .join()
        .unwrap()
    });
    // from another thread (the one-thread library's own has ended): the one-thread library
    // computes on the caller's, the three-thread one on its pool's other threads
    assert_eq!(one.install(|| std::thread::current().id()), std::thread::current().id());
    assert_eq!(bits(&product(&one)), bits(&got));
    assert_eq!(bits(&product(&three)), bits(&got));
    let own = host(3, 1);
    assert_eq!(bits(&product(&own)), bits(&got));
    // such a library dropped after kernels called from its thread ends its pool's threads (no
    // request for a looking thread outlives it)
    let before = threads_now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let h = on_this(3);
            for _ in 0..20 {
                assert_eq!(bits(&product(&h)), bits(&got));
            }
        });
    });
    let t = std::time::Instant::now();
    while threads_now() != before && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(threads_now(), before, "the threads of a dropped library on its own thread outlived it");
}

#[test]
fn device_keys_follow_one_rule() {
    assert_eq!(arch_string("Apple M4 Pro"), "apple-m4-pro");
    assert_eq!(arch_string("NVIDIA H200"), "nvidia-h200");
    assert_eq!(arch_string("NVIDIA A100-SXM4-80GB"), "nvidia-a100-sxm4-80gb");
    assert_eq!(arch_string("AMD EPYC 9654 96-Core Processor"), "amd-epyc-9654");
    assert_eq!(arch_string("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"), "intel-xeon-platinum-8480");
    assert_eq!(arch_string("Intel(R) Core(TM) i9-13900K"), "intel-core-i9-13900k");
    assert_eq!(arch_string("  --  "), "");
}

#[test]
fn every_shipped_device_file_parses_under_its_key() {
    let files = facts::device_files();
    assert!(files.len() >= 5);
    for (vendor, stem) in files {
        let d = facts::device_file(vendor, stem).unwrap();
        assert_eq!(arch_string(&d.name).replace('-', "_"), stem, "{vendor}/{stem}: its name's key names its file");
        assert_eq!(d.vendor, vendor);
        assert!(d.cores > 0 && !d.caches.is_empty() && d.memory.bandwidth_gb_s > 0.0, "{stem}");
        match d.kind.as_str() {
            "gpu" => {
                assert!(d.compute_capability.is_some() && d.memory.bytes > 0, "{stem}");
                assert!(d.memory.max_shared_memory_per_block.is_some(), "{stem}");
            }
            "cpu" => assert!(d.compute_capability.is_none(), "{stem}"),
            k => panic!("{stem}: kind {k}"),
        }
        // found by the name its tools print, and by its key
        assert_eq!(facts::device_named(&d.name).as_ref(), Some(&d));
        assert_eq!(facts::device_file(vendor, &arch_string(&d.name)).unwrap(), d);
    }
    let h100 = facts::device_file("nvidia", "nvidia_h100_80gb_hbm3").unwrap();
    assert_eq!((h100.compute_capability.as_deref(), h100.cores), (Some("9.0"), 132));
    let e = facts::device_file("nvidia", "rtx_9090").unwrap_err().to_string();
    assert!(e.contains("device_file") && e.contains("nvidia/rtx_9090") && e.contains("nvidia_h200"), "{e}");
    assert!(facts::device_named("No Such GPU").is_none());
}

#[test]
fn the_running_host_is_described() {
    let f = facts::HostFacts::read().unwrap();
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let processors = info.lines().filter(|l| l.starts_with("processor")).count();
    if processors > 0 {
        assert_eq!(f.logical_cpus, processors);
    }
    assert_eq!(f.key, arch_string(&f.cpu.name));
    assert!(f.cpu.cores as usize <= f.logical_cpus && f.cpu.cores >= 1);
    assert!(f.usable_cores >= 1 && f.usable_cores <= f.cpu.cores as usize);
    assert!(!f.cores_source.is_empty());
    assert!(f.memory.limit <= f.memory.total && f.memory.available <= f.memory.limit);
    assert!(f.memory.source == "/proc/meminfo" || f.memory.source.starts_with("cgroup v"), "{}", f.memory.source);
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(f.cpu.simd.contains(&"avx2".to_string()), std::arch::is_x86_feature_detected!("avx2"));
        let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        assert_eq!(f.cpu.simd.contains(&"amx_tile".to_string()), flags.split_whitespace().any(|w| w == "amx_tile"));
    }
    if std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index0").exists() {
        assert!(f.cpu.caches.iter().any(|c| c.level == 1), "{:?}", f.cpu.caches);
    }
    // the JSON `nx info --json` prints
    let json = serde_json::to_value(&f).unwrap();
    assert!(json["memory"]["source"].is_string() && json["cpu"]["simd"].is_array());
}

/// A dry library checks and records each call without running it; a trace records and runs.
#[test]
fn dry_calls_are_checked_recorded_and_not_run() {
    use nx_kernels::observe::Recording;
    let dry = std::sync::Arc::new(Recording::dry());
    let h = host(2, 1).observed(dry.clone());
    assert!(h.observer().is_some_and(|o| o.active()));
    let src = Array::<f32>::from_fn(DEV, &[3, 4], |i| value(i[0] * 4 + i[1])).unwrap();
    let dst = Array::<f32>::zeros(DEV, &[3, 4]).unwrap();
    let mut prog = Prog::new(&[Dtype::F32]);
    let x = prog.load(0);
    let y = prog.unary(UnOp::Exp, x);
    prog.output(y);
    assert_eq!(h.map(&prog, &[3, 4], &[&dst], &[&src]), nx_kernels::Answer::Done);
    assert_eq!(dst.to_vec().unwrap(), vec![0.0; 12], "not run");
    // checked: a destination of another shape is refused as the call would be
    let small = Array::<f32>::zeros(DEV, &[3, 3]).unwrap();
    assert_eq!(h.map(&prog, &[3, 4], &[&small], &[&src]), nx_kernels::Answer::ShapeMismatch);
    let sums = Array::<f32>::zeros(DEV, &[3]).unwrap();
    let mut sum = Prog::new(&[Dtype::F32]);
    let x = sum.load(0);
    sum.output(x);
    assert_eq!(h.reduce(&sum, &[3, 4], &[1], &[Reduction::Sum], &[&sums], &[&src]), nx_kernels::Answer::Done);
    assert_eq!(sums.to_vec().unwrap(), vec![0.0; 3]);
    let keys: Vec<String> = dry.launches().into_iter().map(|l| l.key).collect();
    assert_eq!(keys, ["map f32[3,4] <- f32[3,4]", "map f32[3,3] <- f32[3,4]", "reduce f32[3] <- f32[3,4]"]);
    assert_eq!(dry.launches()[2].bytes(), 3 * 4 + 12 * 4);
    // the door's refusals too: a dead destination, a read-only one, one overlapping its operand
    let dead = Array::<f32>::zeros(DEV, &[3, 4]).unwrap();
    dead.buffer().free().unwrap();
    assert_eq!(h.map(&prog, &[3, 4], &[&dead], &[&src]), nx_kernels::Answer::DeadBuffer);
    let frozen = Array::<f32>::new(dst.layout().clone(), dst.buffer().read_only()).unwrap();
    assert_eq!(h.map(&prog, &[3, 4], &[&frozen], &[&src]), nx_kernels::Answer::ReadOnly);
    let flipped = src.apply(&nx_kernels::Move::Flip(0)).unwrap().unwrap();
    assert_eq!(h.map(&prog, &[3, 4], &[&flipped], &[&src]), nx_kernels::Answer::Overlapping);
    // a trace of the same library runs the calls
    let trace = std::sync::Arc::new(Recording::trace());
    let t = h.observed(trace.clone());
    assert_eq!(t.map(&prog, &[3, 4], &[&dst], &[&src]), nx_kernels::Answer::Done);
    assert_eq!(dst.get(&[1, 2]).unwrap(), value(6).exp());
    assert_eq!(trace.launches().len(), 1);
    assert_eq!(dry.launches().len(), 6, "each observer sees its own library's calls");
    // the unwatched library records nothing and runs
    assert!(host(2, 1).observer().is_none());
}
