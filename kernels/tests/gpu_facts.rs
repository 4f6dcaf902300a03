//! GPU facts read through the CUDA driver's API (`nx_kernels::facts::gpu`), against a stand-in
//! driver compiled here from `tests/data/fake_libcuda.c` (the values a real driver gives an
//! H200, and a made-up device): the calls, their marshalling, the shipped-file match, a failing
//! call named with its code; and this machine's answer (its driver, or why there is none).

use nx_kernels::facts::gpu;

/// The stand-in driver whose `cuInit` answers `init`, built into a fresh directory with the C
/// compiler CI has (`cc`).
fn fake_driver(init: i32) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nx-fake-cuda-{}-{init}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("libcuda.so.1");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fake_libcuda.c");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", &format!("-DFAKE_INIT={init}"), "-o"])
        .arg(&so)
        .arg(src)
        .output()
        .expect("a C compiler (cc) to build the stand-in driver");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    so
}

#[test]
fn gpu_facts_are_read_through_the_driver_api() {
    let so = fake_driver(0);
    let path = so.to_str().unwrap();
    let f = gpu::read_from(path).unwrap();
    assert_eq!((f.driver.as_str(), f.driver_version.as_str()), (path, "12.8"));
    assert_eq!(f.gpus.len(), 2);
    let h = &f.gpus[0];
    assert_eq!((h.ordinal, h.name.as_str(), h.key.as_str()), (0, "NVIDIA H200", "nvidia-h200"));
    assert_eq!((h.compute_capability.as_str(), h.multiprocessors, h.memory_bytes), ("9.0", 132, 150_754_820_096));
    assert_eq!(
        (h.max_shared_memory_per_block, h.shared_memory_per_multiprocessor, h.l2_bytes),
        (232_448, 233_472, 52_428_800)
    );
    assert!(h.shipped, "the H200 has a shipped file");
    // the shipped file agrees with what the driver reads
    let file = nx_kernels::facts::device_named(&h.name).unwrap();
    assert_eq!(file.compute_capability.as_deref(), Some(h.compute_capability.as_str()));
    assert_eq!((file.cores, file.memory.bytes), (h.multiprocessors, h.memory_bytes));
    assert_eq!(file.memory.max_shared_memory_per_block, Some(h.max_shared_memory_per_block));
    let z = &f.gpus[1];
    assert_eq!(
        (z.name.as_str(), z.compute_capability.as_str(), z.multiprocessors, z.shipped),
        ("NVIDIA Fake Z9", "12.1", 7, false)
    );
    let json = serde_json::to_value(&f).unwrap();
    assert_eq!(json["gpus"][0]["compute_capability"], "9.0");
    std::fs::remove_dir_all(so.parent().unwrap()).ok();
}

#[test]
fn a_failing_driver_and_a_missing_one_are_named() {
    // a driver whose cuInit fails: the call and its code named
    let failing = fake_driver(999);
    let e = gpu::read_from(failing.to_str().unwrap()).unwrap_err();
    assert!(e.contains("cuInit answered 999") && e.contains("libcuda.so.1"), "{e}");
    // a driver that finds no device (CUDA_ERROR_NO_DEVICE): an empty list, not an error
    let none = fake_driver(100);
    let f = gpu::read_from(none.to_str().unwrap()).unwrap();
    assert!(f.gpus.is_empty() && f.driver_version == "12.8");
    // a path where no library is: named
    let e = gpu::read_from("/nonexistent/libcuda.so.1").unwrap_err();
    assert!(e.contains("/nonexistent/libcuda.so.1") && e.contains("does not load"), "{e}");
    // a library that is not a driver: the call it lacks, named
    let e = gpu::read_from("libm.so.6").unwrap_err();
    assert!(e.contains("has no cuInit"), "{e}");
    // this machine: its driver's GPUs, or why there are none
    match gpu::read() {
        Ok(f) => println!("this machine: driver {} (CUDA {}), {} GPUs", f.driver, f.driver_version, f.gpus.len()),
        Err(e) => assert!(e.contains("no CUDA driver") && e.contains("libcuda.so.1"), "{e}"),
    }
    for so in [failing, none] {
        std::fs::remove_dir_all(so.parent().unwrap()).ok();
    }
}

#[test]
fn cuda_libraries_answer_their_versions_or_why_not() {
    // the directories scripts/test names (PyPI's CUDA wheels beside torch), where there are some
    let dirs: Vec<std::path::PathBuf> =
        std::env::var("NX_CUDA_LIB_DIRS").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let libs = gpu::libraries(&dirs);
    let version = |r: &Result<String, String>, what: &str| match r {
        Ok(v) => {
            let major: u32 = v.split('.').next().unwrap().parse().unwrap_or_else(|_| panic!("{what}: {v}"));
            println!("{what} {v}");
            major
        }
        Err(e) => {
            assert!(dirs.is_empty(), "{what} does not load from {dirs:?}: {e}");
            assert!(e.contains("none of") && e.contains(".so"), "{what}: {e}");
            0
        }
    };
    let (nvrtc, cublas, nccl) =
        (version(&libs.nvrtc, "NVRTC"), version(&libs.cublas, "cuBLAS"), version(&libs.nccl, "NCCL"));
    if !dirs.is_empty() {
        assert!(nvrtc >= 12 && cublas >= 12 && nccl == 2, "{libs:?}");
    }
    // a directory without them: every one is named as missing
    let none = gpu::libraries(&[std::env::temp_dir().join("nx-no-cuda-here")]);
    if dirs.is_empty() {
        assert!(none.nvrtc.is_err() && none.cublas.is_err() && none.nccl.is_err());
    }
}
