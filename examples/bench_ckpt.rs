//! Saving and loading a checkpoint of 1 GiB (16 f32 tensors of 64 MiB, rows cut over 4 simulated
//! ranks) against the disk's own sequential write and read speed, measured in the same run and
//! directory (one plain file written by `std::fs` and fsynced, then read back); loads at the saved
//! placement and at another (columns cut: each rank's window meets every saved box); medians of
//! interleaved rounds; and the process's peak resident memory during a save beyond the model.
//!
//! `cargo run --release --example bench_ckpt -- [--dir DIR] [--rounds 3] [--mib 1024]`

use std::io::{Read, Write};
use std::time::Instant;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let dir = std::path::PathBuf::from(
        arg("--dir").unwrap_or_else(|| std::env::temp_dir().join("nx-bench-ckpt").display().to_string()),
    );
    let rounds: usize = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(3);
    let mib: usize = arg("--mib").and_then(|v| v.parse().ok()).unwrap_or(1024);
    let tensors = 16;
    let rows = mib * (1 << 20) / 4 / tensors / 1024;
    let bytes = (tensors * rows * 1024 * 4) as f64;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a writable directory");
    println!(
        "{tensors} f32 tensors of [{rows}, 1024] ({:.0} MiB) over 4 ranks, in {}",
        bytes / (1 << 20) as f64,
        dir.display()
    );
    let (mut save, mut load, mut cross, mut write, mut read) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut extra = 0u64;
    for round in 0..rounds {
        // the disk alone: one file of the same bytes, written and fsynced, then read
        let plain = dir.join("plain.bin");
        let block = vec![0x5au8; 8 << 20];
        let t = Instant::now();
        let mut f = std::fs::File::create(&plain).expect("creates");
        for _ in 0..(bytes as usize / block.len()) {
            f.write_all(&block).expect("writes");
        }
        f.sync_all().expect("syncs");
        write.push(bytes / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut f = std::fs::File::open(&plain).expect("opens");
        let mut buf = vec![0u8; 8 << 20];
        while f.read(&mut buf).expect("reads") > 0 {}
        read.push(bytes / t.elapsed().as_secs_f64());
        std::fs::remove_file(&plain).ok();
        // nx: save from 4 ranks, then load onto another placement (columns cut)
        let root = dir.join("ckpt");
        let out = nx::launch_with(&nx::LaunchOptions { devices: Some(4), ..Default::default() }, |ctx| {
            let split = nx::Placement::split(0, ctx.devices())?;
            let ts: Vec<nx::Tensor<'_, f32>> = (0..tensors)
                .map(|k| nx::Tensor::<f32>::from_fn(ctx, &[rows, 1024], &split, |i| (i[0] ^ i[1] ^ k) as f32))
                .collect::<nx::Result<_>>()?;
            nx::collectives::Communicator::barrier(ctx.comm())?;
            let before = peak_rss();
            let t = Instant::now();
            let mut s = nx::ckpt::Saver::new(ctx, &root, round as u64)?;
            for (k, x) in ts.iter().enumerate() {
                s.add(&format!("t{k}"), x)?;
            }
            s.commit(serde_json::Value::Null)?;
            let saved = t.elapsed().as_secs_f64();
            let grew = peak_rss().saturating_sub(before);
            drop(ts);
            let ck = nx::ckpt::Checkpoint::open(&root)?;
            let mut times = Vec::new();
            for p in [split, nx::Placement::split(1, ctx.devices())?] {
                nx::collectives::Communicator::barrier(ctx.comm())?;
                let t = Instant::now();
                for k in 0..tensors {
                    let _ = ck.load::<f32>(ctx, &format!("t{k}"), &p)?;
                }
                nx::collectives::Communicator::barrier(ctx.comm())?;
                times.push(t.elapsed().as_secs_f64());
            }
            Ok((saved, times[0], times[1], grew))
        })
        .expect("saves and loads");
        let (s, l, c, g) = out
            .iter()
            .fold((0.0f64, 0.0f64, 0.0f64, 0u64), |a, o| (a.0.max(o.0), a.1.max(o.1), a.2.max(o.2), a.3.max(o.3)));
        save.push(bytes / s);
        load.push(bytes / l);
        cross.push(bytes / c);
        extra = extra.max(g);
        std::fs::remove_dir_all(&root).ok();
    }
    let gb = |x: f64| x / 1e9;
    let (s, l, c, w, r) =
        (median(&mut save), median(&mut load), median(&mut cross), median(&mut write), median(&mut read));
    println!("disk, sequential write + fsync: {:.2} GB/s; read: {:.2} GB/s", gb(w), gb(r));
    println!("nx save: {:.2} GB/s ({:.2} of the disk's write)", gb(s), s / w);
    println!("nx load at the saved placement: {:.2} GB/s ({:.2} of the disk's read)", gb(l), l / r);
    println!("nx load onto another placement (every rank meets every box): {:.2} GB/s ({:.2})", gb(c), c / r);
    println!(
        "peak resident memory grew by {:.1} MiB during a save (4 ranks in one process)",
        extra as f64 / (1 << 20) as f64
    );
    std::fs::remove_dir_all(&dir).ok();
}
