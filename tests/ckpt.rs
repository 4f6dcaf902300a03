//! Checkpoints: saved on one mesh, loaded on another (random meshes of 1–3 axes and 1–8
//! devices, uneven and empty shapes, every placement kind, several dtypes) bit for bit;
//! corrupted and truncated files detected; an uncommitted save leaves the previous checkpoint;
//! plain safetensors files read onto placements; `merge` writes one file; Python's `safetensors`
//! both ways where it is installed.

use std::path::{Path, PathBuf};

use nx::ckpt::{load_safetensors, Checkpoint, Saver};
use nx::kernels::dtype::fp8::{F8E4M3, F8E5M2};
use nx::testing::strategies::{meshes, placed_tensor, placements, shapes};
use nx::{launch_with, LaunchOptions, MeshSpec, PlacementSpec, Tensor};
use proptest::prelude::*;

fn scratch(tag: &str) -> PathBuf {
    let d =
        std::env::temp_dir().join(format!("nx-ckpt-{tag}-{}-{:?}", std::process::id(), std::thread::current().id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

/// Loads `name` on `mesh` at `spec` and answers the whole value from rank 0.
fn load_on<T: nx::collectives::Reducible>(
    dir: &Path,
    mesh: &MeshSpec,
    spec: &PlacementSpec,
    name: &str,
    shape: &[usize],
) -> Vec<T> {
    launch_with(&opts(mesh.size()), |ctx| {
        let m = mesh.over(ctx.devices())?;
        let p = spec.over(&m)?;
        let t = Checkpoint::open(dir)?.load::<T>(ctx, name, &p)?;
        assert_eq!(t.shape(), shape);
        assert!(t.placement().equal(&p));
        Ok(t.full()?.to_vec()?)
    })
    .unwrap()
    .remove(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn saved_on_one_mesh_loads_on_any_other_bit_for_bit(
        (case, to_mesh, to_spec) in placed_tensor(meshes(1..=3, 1..=2), shapes(0..=3, 7)).prop_flat_map(|c| {
            let r = c.shape.len();
            (Just(c), meshes(1..=3, 1..=3).prop_filter("at most 8 devices", |m| m.size() <= 8))
                .prop_flat_map(move |(c, m)| (Just(c), Just(m.clone()), placements(&m, r)))
        })
    ) {
        let dir = scratch("prop");
        launch_with(&case.options(), |ctx| {
            let m = case.mesh(ctx)?;
            let t = case.tensor::<f64>(ctx, &m)?;
            // the conversions of the closed value (a sum's terms would round one by one)
            let closed = t.place(&t.placement().closed())?;
            let b = closed.cast::<half::bf16>()?;
            let mut s = Saver::new(ctx, &dir, 3)?;
            s.add("x", &t)?;
            s.add_terms("xt", &t)?; // a partial value's terms as they are
            s.add("b", &b)?;
            // every other dtype
            let t = closed;
            s.add("f32", &t.cast::<f32>()?)?;
            s.add("f16", &t.cast::<half::f16>()?)?;
            s.add("e4m3", &t.cast::<F8E4M3>()?)?;
            s.add("e5m2", &t.cast::<F8E5M2>()?)?;
            s.add("i8", &t.scale(8.0)?.cast::<i8>()?)?;
            s.add("i16", &t.scale(1000.0)?.cast::<i16>()?)?;
            s.add("i32", &t.scale(1e6)?.cast::<i32>()?)?;
            s.add("u8", &t.cast::<u8>()?)?;
            s.add("u16", &t.scale(1000.0)?.cast::<u16>()?)?;
            s.add("u32", &t.scale(1e6)?.cast::<u32>()?)?;
            s.add("u64", &t.scale(1e6)?.cast::<u64>()?)?;
            s.add("bool", &t.cast::<bool>()?)?;
            s.commit(serde_json::json!({ "step": 3 }))?;
            Ok(())
        }).unwrap();
        let want = case.value();
        let got = load_on::<f64>(&dir, &to_mesh, &to_spec, "x", &case.shape);
        prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        // the terms (exact on the strategies' grid) sum to the value
        let got = load_on::<f64>(&dir, &to_mesh, &to_spec, "xt", &case.shape);
        prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        let got = load_on::<half::bf16>(&dir, &to_mesh, &to_spec, "b", &case.shape);
        prop_assert_eq!(got, want.iter().map(|&v| half::bf16::from_f64(v)).collect::<Vec<_>>());
        // the other dtypes, all in one launch: as the conversions of the value give them
        let all = every_dtype(&dir, &to_mesh, &to_spec, &case.shape);
        let sum = case.shape.iter().product::<usize>();
        for (name, scale, got) in all {
            prop_assert_eq!(got.len(), sum);
            let want: Vec<String> = want.iter().map(|&v| convert(name, v * scale)).collect();
            prop_assert_eq!(got, want, "{}", name);
        }
        // every box stored once: the stored bytes are the value's
        let ix = Checkpoint::open(&dir).unwrap();
        let e = ix.entry("x").unwrap();
        prop_assert_eq!(e.boxes.iter().map(|b| b.len).sum::<u64>(), 8 * want.len() as u64);
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// `v` converted to dtype `name` by nx's rules, printed.
fn convert(name: &str, v: f64) -> String {
    use nx::from_f64;
    match name {
        "f32" => format!("{:?}", from_f64::<f32>(v)),
        "f16" => format!("{:?}", from_f64::<half::f16>(v)),
        "e4m3" => format!("{:?}", from_f64::<F8E4M3>(v)),
        "e5m2" => format!("{:?}", from_f64::<F8E5M2>(v)),
        "i8" => format!("{:?}", from_f64::<i8>(v)),
        "i16" => format!("{:?}", from_f64::<i16>(v)),
        "i32" => format!("{:?}", from_f64::<i32>(v)),
        "u8" => format!("{:?}", from_f64::<u8>(v)),
        "u16" => format!("{:?}", from_f64::<u16>(v)),
        "u32" => format!("{:?}", from_f64::<u32>(v)),
        "u64" => format!("{:?}", from_f64::<u64>(v)),
        _ => format!("{:?}", from_f64::<bool>(v)),
    }
}

/// Every other dtype's tensor loaded on `mesh` at `spec`: (name, the scale it was saved at, its
/// elements printed).
fn every_dtype(
    dir: &Path,
    mesh: &MeshSpec,
    spec: &PlacementSpec,
    shape: &[usize],
) -> Vec<(&'static str, f64, Vec<String>)> {
    launch_with(&opts(mesh.size()), |ctx| {
        let m = mesh.over(ctx.devices())?;
        let p = spec.over(&m)?;
        let ck = Checkpoint::open(dir)?;
        fn one<'d, T: nx::collectives::Reducible>(
            ck: &Checkpoint,
            ctx: &nx::Ctx<'d>,
            n: &str,
            p: &nx::Placement<'d>,
            shape: &[usize],
        ) -> nx::Result<Vec<String>> {
            let t = ck.load::<T>(ctx, n, p)?;
            assert_eq!(t.shape(), shape);
            Ok(t.full()?.to_vec()?.iter().map(|v| format!("{v:?}")).collect())
        }
        Ok(vec![
            ("f32", 1.0, one::<f32>(&ck, ctx, "f32", &p, shape)?),
            ("f16", 1.0, one::<half::f16>(&ck, ctx, "f16", &p, shape)?),
            ("e4m3", 1.0, one::<F8E4M3>(&ck, ctx, "e4m3", &p, shape)?),
            ("e5m2", 1.0, one::<F8E5M2>(&ck, ctx, "e5m2", &p, shape)?),
            ("i8", 8.0, one::<i8>(&ck, ctx, "i8", &p, shape)?),
            ("i16", 1000.0, one::<i16>(&ck, ctx, "i16", &p, shape)?),
            ("i32", 1e6, one::<i32>(&ck, ctx, "i32", &p, shape)?),
            ("u8", 1.0, one::<u8>(&ck, ctx, "u8", &p, shape)?),
            ("u16", 1000.0, one::<u16>(&ck, ctx, "u16", &p, shape)?),
            ("u32", 1e6, one::<u32>(&ck, ctx, "u32", &p, shape)?),
            ("u64", 1e6, one::<u64>(&ck, ctx, "u64", &p, shape)?),
            // (booleans have no sum: a partial target is closed)
            ("bool", 1.0, one::<bool>(&ck, ctx, "bool", &p.closed(), shape)?),
        ])
    })
    .unwrap()
    .remove(0)
}

/// Saves `w` (i64 [5, 3] split over rows) on 2 devices into `dir` at `step`.
fn save_small(dir: &Path, step: u64, base: i64) {
    launch_with(&opts(2), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        let w = Tensor::<i64>::from_fn(ctx, &[5, 3], &rows, |i| base + (i[0] * 3 + i[1]) as i64)?;
        let f = Tensor::<bool>::from_fn(ctx, &[5], &nx::Placement::on(ctx.devices()), |i| i[0] % 2 == 1)?;
        let mut s = Saver::new(ctx, dir, step)?;
        s.add("w", &w)?;
        s.add("flags", &f)?;
        s.commit(serde_json::json!({ "step": step }))?;
        Ok(())
    })
    .unwrap();
}

fn load_err(dir: &Path) -> String {
    launch_with(&opts(3), |ctx| {
        let cols = nx::Placement::split(1, ctx.devices())?;
        Ok(Checkpoint::open(dir)?.load::<i64>(ctx, "w", &cols).map(|_| ()).unwrap_err().to_string())
    })
    .unwrap()
    .remove(0)
}

#[test]
fn corrupted_and_truncated_files_are_errors_naming_them() {
    let dir = scratch("bad");
    save_small(&dir, 1, 0);
    let ck = Checkpoint::open(&dir).unwrap();
    let b = ck.entry("w").unwrap().boxes[0].clone();
    let file = ck.dir().join(&b.file);
    let pristine = std::fs::read(&file).unwrap();
    // two values negated (their top bits flipped, words 0 and 4: one lane of the checksum), then
    // one flipped low bit
    for flips in [vec![(7usize, 0x80u8), (39, 0x80)], vec![(3, 0x40)]] {
        let mut bytes = pristine.clone();
        for (at, bit) in flips {
            bytes[b.offset as usize + at] ^= bit;
        }
        std::fs::write(&file, &bytes).unwrap();
        let e = load_err(&dir);
        assert!(e.contains("do not match their checksum") && e.contains(&b.file) && e.contains("w:"), "{e}");
    }
    let bytes = pristine;
    // cut short
    std::fs::write(&file, &bytes[..b.offset as usize + 5]).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("truncated") && e.contains(&b.file), "{e}");
    // gone
    std::fs::remove_file(&file).unwrap();
    let e = load_err(&dir);
    assert!(e.contains(&b.file) && e.contains("No such file"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn overlapping_boxes_in_an_index_are_refused() {
    // the second box of `w` (rows 3..5) moved up to rows 2..4: its elements still number the
    // window's, but row 2 is stored twice and row 4 nowhere
    let dir = scratch("overlap");
    save_small(&dir, 1, 0);
    let ck = Checkpoint::open(&dir).unwrap();
    let path = ck.dir().join("index.json");
    let mut index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let w = index["tensors"].as_array_mut().unwrap().iter_mut().find(|t| t["name"] == "w").unwrap();
    let boxes = w["boxes"].as_array_mut().unwrap();
    let second = boxes.iter_mut().find(|b| b["start"][0] == 3).unwrap();
    second["start"][0] = serde_json::json!(2);
    std::fs::write(&path, serde_json::to_string(&index).unwrap()).unwrap();
    let e = launch_with(&opts(1), |ctx| {
        let on = nx::Placement::on(ctx.devices());
        Ok(Checkpoint::open(&dir)?.load::<i64>(ctx, "w", &on).map(|_| ()).unwrap_err().to_string())
    })
    .unwrap()
    .remove(0);
    assert!(e.contains("w: the stored boxes") && e.contains("overlap"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_uncommitted_save_leaves_the_previous_checkpoint() {
    let dir = scratch("atomic");
    save_small(&dir, 1, 0);
    save_small(&dir, 2, 100);
    // a save that stops before its commit (a crash): every rank's files are written, the index
    // is not
    launch_with(&opts(2), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        let w = Tensor::<i64>::from_fn(ctx, &[5, 3], &rows, |_| -1)?;
        let mut s = Saver::new(ctx, &dir, 3)?;
        s.add("w", &w)?;
        let pending = s.commit_async(serde_json::Value::Null);
        let frag = dir.join("ckpt-0000000003.tmp").join(format!("rank{}.json", ctx.rank()));
        while !frag.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(pending);
        Ok(())
    })
    .unwrap();
    let tmp = dir.join("ckpt-0000000003.tmp");
    assert!(tmp.join("rank0.safetensors").exists() && tmp.join("rank1.safetensors").exists());
    assert!(!dir.join("ckpt-0000000003").exists());
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.index().step, 2);
    let got = load_on::<i64>(&dir, &MeshSpec::new(&[("a", 3)]).unwrap(), &PlacementSpec::Split(1), "w", &[5, 3]);
    assert_eq!(got, (0..15).map(|i| 100 + i).collect::<Vec<i64>>());
    let flags = load_on::<bool>(&dir, &MeshSpec::new(&[("a", 1)]).unwrap(), &PlacementSpec::On, "flags", &[5]);
    assert_eq!(flags, [false, true, false, true, false]);
    // the two newest kept
    save_small(&dir, 4, 200);
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("ckpt-") && !n.ends_with(".tmp"))
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn merge_writes_one_plain_file_that_loads_onto_any_placement() {
    let dir = scratch("merge");
    save_small(&dir, 5, 10);
    let file = dir.join("model.safetensors");
    assert_eq!(nx::ckpt::merge(&dir, &file).unwrap(), 2);
    // read back by the safetensors crate itself
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor("w").unwrap();
    assert_eq!(w.shape(), [5, 3]);
    let vals: Vec<i64> = w.data().chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(vals, (10..25).collect::<Vec<i64>>());
    // and onto 4 devices, columns cut, by nx
    let got = launch_with(&opts(4), |ctx| {
        let m = ctx.mesh(&[("a", 2), ("b", 2)])?;
        let p = nx::Placement::mesh(&m, &[(1, &["a", "b"])])?;
        Ok(load_safetensors::<i64>(ctx, &file, "w", &p)?.full()?.to_vec()?)
    })
    .unwrap();
    for g in got {
        assert_eq!(g, (10..25).collect::<Vec<i64>>());
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn python_safetensors_both_ways() {
    let py = std::env::var_os("NX_TORCH_PYTHON")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nx/torch/bin/python")));
    let Some(py) = py.filter(|p| {
        std::process::Command::new(p)
            .args(["-c", "import safetensors, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        println!("SKIPPED: no Python with safetensors and numpy (scripts/test installs them)");
        return;
    };
    let dir = scratch("py");
    std::fs::create_dir_all(&dir).unwrap();
    // Python writes, nx reads onto 3 devices
    let from_py = dir.join("py.safetensors");
    let script = format!(
        "import numpy as np; from safetensors.numpy import save_file; save_file({{'a': np.arange(35, dtype=np.float32).reshape(7, 5) / 4}}, '{}')",
        from_py.display()
    );
    let out = std::process::Command::new(&py).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = launch_with(&opts(3), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        Ok(load_safetensors::<f32>(ctx, &from_py, "a", &rows)?.full()?.to_vec()?)
    })
    .unwrap()
    .remove(0);
    assert_eq!(got, (0..35).map(|i| i as f32 / 4.0).collect::<Vec<_>>());
    // nx saves and merges, Python reads
    save_small(&dir, 1, 7);
    let merged = dir.join("merged.safetensors");
    nx::ckpt::merge(&dir, &merged).unwrap();
    let script = format!(
        "from safetensors.numpy import load_file; t = load_file('{}'); print(t['w'].tolist(), t['flags'].tolist())",
        merged.display()
    );
    let out = std::process::Command::new(&py).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "[[7, 8, 9], [10, 11, 12], [13, 14, 15], [16, 17, 18], [19, 20, 21]] [False, True, False, True, False]"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The fp8 dtypes through safetensors both ways with PyTorch (`F8_E4M3`, `F8_E5M2`, which
/// `safetensors.torch` reads as `float8_e4m3fn` and `float8_e5m2`): every bit pattern, values
/// decoded by torch.
#[test]
fn fp8_tensors_through_safetensors_with_pytorch() {
    let Some(py) = std::env::var_os("NX_TORCH_PYTHON").map(PathBuf::from).filter(|p| {
        std::process::Command::new(p)
            .args(["-c", "import safetensors, torch"])
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        println!("SKIPPED: NX_TORCH_PYTHON names no Python with torch and safetensors (scripts/test installs them)");
        return;
    };
    let dir = scratch("fp8");
    std::fs::create_dir_all(&dir).unwrap();
    // nx saves every pattern of both formats split over 3 devices, merges; torch decodes
    launch_with(&opts(3), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        let a = Tensor::<F8E4M3>::from_fn(ctx, &[16, 16], &rows, |i| F8E4M3::from_bits((i[0] * 16 + i[1]) as u8))?;
        let b = Tensor::<F8E5M2>::from_fn(ctx, &[256], &rows, |i| F8E5M2::from_bits(i[0] as u8))?;
        let mut s = Saver::new(ctx, &dir, 1)?;
        s.add("a", &a)?;
        s.add("b", &b)?;
        s.commit(serde_json::Value::Null)?;
        Ok(())
    })
    .unwrap();
    let merged = dir.join("merged.safetensors");
    nx::ckpt::merge(&dir, &merged).unwrap();
    let script = format!(
        "import torch; from safetensors.torch import load_file, save_file\n\
         t = load_file('{m}')\n\
         print(t['a'].dtype, t['b'].dtype)\n\
         print(' '.join(repr(v) for v in t['a'].float().flatten().tolist()))\n\
         print(' '.join(repr(v) for v in t['b'].float().tolist()))\n\
         x = torch.linspace(-500, 500, 77)\n\
         save_file({{'a': x.to(torch.float8_e4m3fn), 'b': (x * 130).to(torch.float8_e5m2)}}, '{p}')\n\
         print(' '.join(str(v) for v in x.to(torch.float8_e4m3fn).view(torch.uint8).tolist()))\n\
         print(' '.join(str(v) for v in (x * 130).to(torch.float8_e5m2).view(torch.uint8).tolist()))",
        m = merged.display(),
        p = dir.join("py.safetensors").display()
    );
    let out = std::process::Command::new(&py).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "torch.float8_e4m3fn torch.float8_e5m2");
    let decoded = |line: &str| -> Vec<f32> { line.split(' ').map(|v| v.parse::<f32>().unwrap()).collect() };
    let (ta, tb) = (decoded(lines[1]), decoded(lines[2]));
    for b in 0..=255u8 {
        for (got, want) in
            [(ta[b as usize], F8E4M3::from_bits(b).to_f32()), (tb[b as usize], F8E5M2::from_bits(b).to_f32())]
        {
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{b:#04x}: torch {got}, nx {want}"
            );
        }
    }
    // torch saves, nx loads onto 2 devices: torch's bits
    let bits = |line: &str| -> Vec<u8> { line.split(' ').map(|v| v.parse::<u8>().unwrap()).collect() };
    let (wa, wb) = (bits(lines[3]), bits(lines[4]));
    let py_file = dir.join("py.safetensors");
    let (ga, gb) = launch_with(&opts(2), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        let a = load_safetensors::<F8E4M3>(ctx, &py_file, "a", &rows)?.full()?.to_vec()?;
        let b = load_safetensors::<F8E5M2>(ctx, &py_file, "b", &rows)?.full()?.to_vec()?;
        Ok((a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()))
    })
    .unwrap()
    .remove(0);
    assert_eq!((ga, gb), (wa, wb));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_asynchronous_save_overlaps_the_next_steps_and_commits_the_values_it_was_given() {
    let dir = scratch("async");
    let got = launch_with(&opts(4), |ctx| {
        let m = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        let p = nx::Placement::mesh(&m, &[(0, &["dp"]), (1, &["tp"])])?;
        let mut w = Tensor::<f32>::from_fn(ctx, &[9, 7], &p, |i| (i[0] * 7 + i[1]) as f32)?;
        let mut s = Saver::new(ctx, &dir, 1)?;
        s.add("w", &w)?;
        let pending = s.commit_async(serde_json::json!({ "step": 1 }));
        // the next steps: new values, collectives, while the files are written
        for _ in 0..5 {
            w = w.scale(2.0)?.add(&w)?;
            let _ = w.full()?;
        }
        let at = pending.wait()?;
        assert!(at.ends_with("ckpt-0000000001"));
        let back = Checkpoint::open(&dir)?.load::<f32>(ctx, "w", &nx::Placement::split(1, ctx.devices())?)?;
        Ok(back.full()?.to_vec()?)
    })
    .unwrap();
    for g in got {
        assert_eq!(g, (0..63).map(|k| k as f32).collect::<Vec<_>>());
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_partial_value_saved_as_terms_loads_as_its_closed_sum() {
    let dir = scratch("terms");
    let closed = launch_with(&opts(4), |ctx| {
        let m = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        // a sum over dp and tp of four different terms
        let p = nx::Placement::partial(&m, &["dp", "tp"], &[])?;
        let terms = Tensor::<f32>::randn(ctx, &[7, 5], &p.closed(), 3)?;
        let t = Tensor::from_local(ctx, &[7, 5], &p, terms.to_local().cloned())?;
        let t = t.scale(1.0 + ctx.rank() as f64 * 0.37)?; // the terms differ by rank
        let mut s = Saver::new(ctx, &dir, 1)?;
        let ((), log) = ctx.record(|| s.add_terms("t", &t))?;
        assert_eq!(log.collectives().count(), 0, "saving terms issues no collective");
        s.commit(serde_json::Value::Null)?;
        Ok(t.place(&p.closed())?.full()?.to_vec()?)
    })
    .unwrap()
    .remove(0);
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.entry("t").unwrap().terms, 4);
    let got = load_on::<f32>(&dir, &MeshSpec::new(&[("a", 3)]).unwrap(), &PlacementSpec::Split(1), "t", &[7, 5]);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        closed.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let e = nx::ckpt::merge(&dir, dir.join("m.safetensors")).unwrap_err().to_string();
    assert!(e.contains("saved as 4 terms"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn boxes_past_one_read_chunk_load_exactly_and_are_checked_whole() {
    // two boxes of 516 and 515 rows of 600 f32 (1.2 MB each: more than one 1 MiB read chunk),
    // loaded where a window is a box, meets part of one, or meets every box
    let dir = scratch("chunks");
    let shape = [1031usize, 600];
    let value = |i: usize, j: usize| (i * 600 + j) as f64;
    launch_with(&opts(2), |ctx| {
        let rows = nx::Placement::split(0, ctx.devices())?;
        let t = Tensor::<f32>::from_fn(ctx, &shape, &rows, |i| value(i[0], i[1]) as f32)?;
        let mut s = Saver::new(ctx, &dir, 1)?;
        s.add("t", &t)?;
        s.commit(serde_json::Value::Null)
    })
    .unwrap();
    for (devices, spec) in [(2, "split(0)"), (3, "split(0)"), (4, "split(1)"), (1, "on"), (3, "split(1)")] {
        let mesh: MeshSpec = format!("x={devices}").parse().unwrap();
        let spec: PlacementSpec = spec.parse().unwrap();
        let got = load_on::<f32>(&dir, &mesh, &spec, "t", &shape);
        for (k, g) in got.iter().enumerate() {
            assert_eq!(f64::from(*g), value(k / 600, k % 600), "element {k} at {spec:?} over {devices}");
        }
    }
    // one value near the end of the first box flipped: found by every load, even by ranks whose
    // windows stop short of it
    let ck = Checkpoint::open(&dir).unwrap();
    let b = ck.entry("t").unwrap().boxes.iter().find(|b| b.start == [0, 0]).unwrap().clone();
    let file = ck.dir().join(&b.file);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(b.offset + b.len) as usize - 9] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    for (devices, place) in [(2, 0usize), (4, 0), (3, 1)] {
        let e = launch_with(&opts(devices), |ctx| {
            let p = nx::Placement::split(place, ctx.devices())?;
            Ok(Checkpoint::open(&dir)?.load::<f32>(ctx, "t", &p).map(|_| ()).unwrap_err().to_string())
        })
        .unwrap()
        .remove(0);
        assert!(e.contains("do not match their checksum") && e.contains(&b.file), "{e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
