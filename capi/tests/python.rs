//! DLPack with NumPy and PyTorch in one process: `tests/dlpack.py` loads this crate's shared
//! library by `ctypes` and exchanges arrays both ways (values, shared memory seen from both sides,
//! claims held while the other side holds the memory, strides, dtypes, lifetimes, refusals).
//! Python is `$NX_TORCH_PYTHON`, else the test command's environment (`~/.cache/nx/torch`), else
//! `python3`; without NumPy the test says so and checks nothing.

use std::path::PathBuf;
use std::process::Command;

/// The shared library cargo built beside this test (`target/<profile>/deps/libnx_capi*.so`, or
/// its copy one level up).
fn shared_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let mut found: Vec<PathBuf> = [deps, deps.parent()?]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            n.starts_with("libnx_capi") && n.ends_with(".so")
        })
        .collect();
    // the newest build
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found.pop()
}

fn python() -> Option<String> {
    let venv = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nx/torch/bin/python"));
    let candidates = std::env::var("NX_TORCH_PYTHON")
        .ok()
        .into_iter()
        .chain(venv.filter(|p| p.exists()).map(|p| p.display().to_string()))
        .chain(["python3".to_string()]);
    for p in candidates {
        let ok = Command::new(&p).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success());
        if ok {
            return Some(p);
        }
    }
    None
}

#[test]
fn dlpack_with_numpy_and_torch() {
    let Some(py) = python() else {
        eprintln!("no Python with NumPy here: the DLPack exchange is not checked");
        return;
    };
    let lib = shared_library().expect("cargo builds libnx_capi.so beside this crate's tests");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/dlpack.py");
    let out = Command::new(&py).arg(&script).arg(&lib).output().expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "{py} {}: {text}", script.display());
    assert!(text.contains("dlpack: all checks passed"), "{text}");
    assert!(text.contains("nx -> numpy") && text.contains("numpy -> nx"), "{text}");
    // the test command installs PyTorch and names its Python: there, PyTorch must be checked
    if std::env::var_os("NX_TORCH_PYTHON").is_some() {
        assert!(text.contains("nx -> torch") && text.contains("torch -> nx"), "PyTorch was not checked: {text}");
    }
}
