//! `nx bench kernels`: the host kernels against the memory-bandwidth limit and against numpy.

use std::process::Command;
use std::time::Instant;

use nx::kernels::prog::Prog;
use nx::kernels::rig::{QueueOptions, Rig, RigOptions};
use nx::kernels::{Array, Contraction, Dtype, Host, Kernels, Reduction, Simd};
use nx::Device;
use rayon::prelude::*;
use serde::Serialize;

use crate::bench_mem::{lanes8, read_limit};

/// Arguments of `nx bench kernels`.
#[derive(clap::Args, Debug)]
pub struct KernelArgs {
    /// Elements of the map and sum arrays (f32).
    #[arg(long, default_value_t = 1 << 24, value_parser = crate::args::elements, allow_hyphen_values = true)]
    size: usize,
    /// Edge of the square matmuls.
    #[arg(long, default_value_t = 2048, value_parser = crate::args::edge, allow_hyphen_values = true)]
    matmul: usize,
    /// Timed runs of each measurement (the median is reported).
    #[arg(long, default_value_t = 9, value_parser = crate::args::repeats, allow_hyphen_values = true)]
    repeats: usize,
    /// The Python that runs `benches/numpy_matmul.py` for the peer figure; `none` skips it.
    #[arg(long, default_value = "python3")]
    python: String,
    /// The numpy script.
    #[arg(long, default_value = "benches/numpy_matmul.py")]
    numpy_script: String,
    /// The Python with torch that runs `benches/torch_indexing.py` for the indexing rows' peer
    /// (`benches/kernels.sh` manages one); `none` skips it.
    #[arg(long, default_value = "none")]
    torch: String,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Only these groups of rows (comma-separated: memory, matmul, indexing, numeric); all where
    /// not given.
    #[arg(long, value_delimiter = ',', value_parser = ["memory", "matmul", "indexing", "numeric"])]
    only: Vec<String>,
}

/// One figure: `value` in `unit`, against `limit` (same unit), `ratio` = value / limit; a row
/// timed against a peer adds its name, its value and `peer_ratio` (nx's speed over the peer's:
/// above 1, nx is faster).
#[derive(Serialize, Debug, Default)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) limit: Option<f64>,
    pub(crate) ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_value: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) peer_ratio: Option<f64>,
}

/// Runs a peer's `script` under `python` with `args` and this pool's thread count last, and
/// answers the one JSON object it prints; `Err` naming the failure where it cannot.
pub(crate) fn python_peer(python: &str, script: &str, args: &[String]) -> Result<serde_json::Value, String> {
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .arg(rayon::current_num_threads().to_string())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} {script} failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the output of {script}: {e}"))
}

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Rounds of numpy's matmul and nx's, back to back.
const MATMUL_ROUNDS: usize = 5;

/// Median seconds of `repeats` runs of `f`, after one untimed warm-up.
pub(crate) fn time(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..repeats)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

type Error = Box<dyn std::error::Error>;

/// A timed kernel: its name, the bytes it moves, and the run.
/// A timed map or sum: its name, the bytes it reads and writes, the run, whether its limit is
/// the read limit (else the copy), and its figure's name in `benches/torch_elementwise.py`.
struct Case<'a> {
    name: String,
    bytes: usize,
    run: Box<dyn FnMut() + 'a>,
    reads_only: bool,
    torch: Option<&'static str>,
}

impl<'a> Case<'a> {
    fn new(name: impl Into<String>, bytes: usize, run: impl FnMut() + 'a) -> Case<'a> {
        Case { name: name.into(), bytes, run: Box::new(run), reads_only: false, torch: None }
    }

    /// Against the read limit.
    fn reads(mut self) -> Case<'a> {
        self.reads_only = true;
        self
    }

    /// Beside torch's figure `key`.
    fn torch(mut self, key: &'static str) -> Case<'a> {
        self.torch = Some(key);
        self
    }
}

/// Work items a round of the submit measurement queues.
const SUBMITS: usize = 20_000;

/// The caller's cost of queueing work on a queued rig (median microseconds a submit, each naming
/// a buffer it writes, over `repeats` rounds of [`SUBMITS`]), and a submit's round trip (queued,
/// run by the worker, waited for).
fn submit_cost(dev: Device, repeats: usize) -> Result<Vec<Row>, Error> {
    let rig = Rig::new(dev, RigOptions { queue: Some(QueueOptions::default()), ..RigOptions::default() })?;
    let buf = rig.alloc(64)?;
    let (mut queue, mut trip) = (Vec::new(), Vec::new());
    for _ in 0..repeats.max(3) {
        let t = Instant::now();
        for _ in 0..SUBMITS {
            rig.submit(&[], &[&buf], Box::new(|| Ok(())))?;
        }
        queue.push(t.elapsed().as_secs_f64() * 1e6 / SUBMITS as f64);
        rig.synchronize()?;
        let t = Instant::now();
        for _ in 0..1000 {
            if let Some(e) = rig.submit(&[], &[&buf], Box::new(|| Ok(())))? {
                e.wait()?;
            }
        }
        trip.push(t.elapsed().as_secs_f64() * 1e6 / 1000.0);
    }
    let row = |name: &str, v: Vec<f64>| Row {
        name: name.into(),
        value: median(v),
        unit: "us",
        limit: None,
        ratio: None,
        ..Default::default()
    };
    Ok(vec![row("submit to a queued rig (caller's cost)", queue), row("submit and wait (round trip)", trip)])
}

fn numpy_gflops(a: &KernelArgs, repeats: usize) -> Result<(f64, String), String> {
    if a.python == "none" {
        return Err("skipped (--python none)".into());
    }
    let out = Command::new(&a.python)
        .arg(&a.numpy_script)
        .arg(a.matmul.to_string())
        .arg(repeats.to_string())
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", a.python))?;
    if !out.status.success() {
        return Err(format!("{} {} failed: {}", a.python, a.numpy_script, String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let g = v["gflops"].as_f64().ok_or("no gflops in the numpy output")?;
    Ok((g, format!("numpy {} on {}", v["numpy"], v["blas"])))
}

/// Runs the kernel benchmark; returns the report.
pub fn kernels(a: &KernelArgs) -> Result<String, Error> {
    // about 32 bytes an element of the map and sum arrays (eight arrays of f32 and bf16, and the
    // values they are made from), and 32 an element of the matmuls (ours and numpy's)
    let need = (a.size as u128 + (a.matmul as u128).pow(2)) * 32;
    if let Some(avail) = available_memory() {
        if need > avail as u128 {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            return Err(format!(
                "nx bench kernels: --size {} and --matmul {} need about {:.1} GiB; this machine has {:.1} GiB available",
                a.size,
                a.matmul,
                gib(need),
                gib(avail as u128)
            )
            .into());
        }
    }
    let dev = Device::sim(0);
    let host = Host::new();
    let rig = Rig::host(dev)?;
    let n = a.size;
    let r = a.repeats.max(1);
    let mut rows = Vec::new();
    let mut notes = Vec::new();

    let want = |group: &str| a.only.is_empty() || a.only.iter().any(|g| g == group);
    if want("memory") {
        memory_rows(a, &host, &rig, &mut rows, &mut notes)?;
    }
    if want("matmul") {
        matmul_rows(a, &host, &rig, &mut rows, &mut notes)?;
    }
    if want("indexing") {
        let (indexing, note) = crate::bench_index::rows(n, r, &a.torch)?;
        rows.extend(indexing);
        notes.push(note);
    }
    if want("numeric") {
        // the numeric rows' peers: numpy (and torch) from the torch environment where given
        let fourier_python = if a.torch != "none" { &a.torch } else { &a.python };
        let (fourier, note) = crate::bench_numeric::rows(r, fourier_python)?;
        rows.extend(fourier);
        notes.push(note);
    }

    if a.json {
        return Ok(rows
            .iter()
            .map(|row| serde_json::to_string(row).expect("plain data"))
            .collect::<Vec<_>>()
            .join("\n"));
    }
    let mut text = format!(
        "host kernels: {} threads, {} f32 elements ({} MiB an array), matmul {}^3; medians of {r} runs\n",
        rayon::current_num_threads(),
        n,
        (n * 4) >> 20,
        a.matmul
    );
    text.push_str(&format!("{:<40} {:>10} {:<8} {:>10} {:>7}\n", "benchmark", "value", "unit", "limit", "ratio"));
    for row in &rows {
        let lim = row.limit.map_or("-".to_string(), |l| format!("{l:.1}"));
        let ratio = row.ratio.map_or("-".to_string(), |x| format!("{x:.2}"));
        let peer = match (row.peer_value, row.peer_ratio) {
            (Some(v), Some(x)) => format!("   peer {v:.1} {}, nx {x:.2}x its speed", row.unit),
            _ => String::new(),
        };
        text.push_str(&format!(
            "{:<40} {:>10.1} {:<8} {:>10} {:>7}{peer}\n",
            row.name, row.value, row.unit, lim, ratio
        ));
    }
    text.push_str(&format!("SIMD level dispatched to: {} (the highest this CPU has)\n", host.simd()));
    text.push_str("limits: maps against the copy bandwidth (bytes read + written per second), sums against the\n");
    text.push_str("        read limit (bytes read per second by the fastest plain read loop), each timed\n");
    text.push_str("        beside each kernel run, each run after an untimed scrub of the caches;\n");
    text.push_str("        ratio = median over repeats of (kernel bytes/s) / (limit bytes/s); with --torch, torch's\n");
    text.push_str(
        "        maps and sums as peers, each repeat's run just before nx's, nx x = median of (nx / torch)\n",
    );
    text.push_str("        matmuls against numpy's f32 matmul measured in the same run: ratio = median over\n");
    text.push_str("        rounds of numpy then nx back to back of (nx GFLOP/s) / (numpy GFLOP/s); with --torch,\n");
    text.push_str(
        "        torch's f32 and bf16 matmuls as peers, each round's beside nx's, nx x = (nx GFLOP/s) / (torch's)\n",
    );
    for note in notes {
        text.push_str(&format!("peer: {note}\n"));
    }
    if a.torch != "none" {
        text.push_str("indexing rows against PyTorch on CPU in the same run, same threads: nx x = median over\n");
        text.push_str("        rounds of torch then nx back to back of (torch time) / (nx time)\n");
    }
    text.push_str("Fourier and Cholesky rows against numpy and torch (same threads) in the same run, nx x as above\n");
    Ok(text.trim_end().to_string())
}

/// Writes `v` over `c` by streaming stores, 32 bytes at a time where the CPU has AVX (the
/// unaligned head and tail plainly); plain stores elsewhere.
fn stream_fill(c: &mut [f32], v: f32) {
    /// The AVX loop of `stream_fill`.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    unsafe fn fill_avx(c: &mut [f32], v: f32) {
        use std::arch::x86_64::{_mm256_set1_ps, _mm256_stream_ps};
        let head = c.as_ptr().align_offset(32).min(c.len());
        let (head, rest) = c.split_at_mut(head);
        head.fill(v);
        let mut body = rest.chunks_exact_mut(8);
        let x = _mm256_set1_ps(v);
        for lane in &mut body {
            // SAFETY: `lane` is 8 f32 at a 32-byte aligned address (the head took the rest).
            unsafe { _mm256_stream_ps(lane.as_mut_ptr(), x) };
        }
        body.into_remainder().fill(v);
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX.
        return unsafe { fill_avx(c, v) };
    }
    c.fill(v)
}

/// Bytes read plus bytes written per second by the faster of two parallel copies of `src` into
/// `dst` on all cores: `memcpy` (whose stores read each line first) and streaming stores (which do
/// not; 32-byte loads and stores where the CPU has AVX2); `before` runs ahead of each (a cache
/// scrub).
pub(crate) fn copy_limit(src: &[f32], dst: &mut [f32], before: &dyn Fn() -> f32) -> f64 {
    let bytes = (2 * size_of_val(src)) as f64;
    let t = Instant::now();
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
    let plain = bytes / t.elapsed().as_secs_f64();
    before();
    let t = Instant::now();
    dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| {
        // SAFETY: `d` holds s.len() elements, this task's alone.
        unsafe { nx::kernels::host::stream_copy(s, d.as_mut_ptr()) };
        nx::kernels::host::store_fence();
    });
    let streamed = bytes / t.elapsed().as_secs_f64();
    plain.max(streamed)
}

/// The memory available to new allocations (`MemAvailable` of `/proc/meminfo`), in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 =
        text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The maps' and sums' rows (with the copy and read limits, torch's peers and the pool's rows).
fn memory_rows(
    a: &KernelArgs,
    host: &Host,
    rig: &Rig,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let (dev, n, r) = (rig.device(), a.size, a.repeats.max(1));
    let x = Array::<f32>::from_fn_on(rig, &[n], |i| (i[0] % 1000) as f32 * 1e-3)?;
    let y = Array::<f32>::from_fn_on(rig, &[n], |i| (i[0] % 777) as f32 * 1e-3)?;
    let b = Array::<f32>::from_fn_on(rig, &[n], |i| (i[0] % 333) as f32 * -1e-3)?;
    let out = Array::<f32>::zeros_on(rig, &[n])?;
    let out2 = Array::<f32>::zeros_on(rig, &[n])?;

    let mut add = Prog::new(&[Dtype::F32, Dtype::F32]);
    let (l0, l1) = (add.load(0), add.load(1));
    let s = add.add(l0, l1);
    add.output(s);

    let mut chain = Prog::new(&[Dtype::F32, Dtype::F32, Dtype::F32]);
    let (ca, cx, cb) = (chain.load(0), chain.load(1), chain.load(2));
    let ax = chain.mul(ca, cx);
    let yv = chain.add(ax, cb);
    let zero = chain.float(0.0);
    let z = chain.max(yv, zero);
    chain.output(yv);
    chain.output(z);

    let hx = Array::<half::bf16>::from_fn_on(rig, &[n], |i| half::bf16::from_f32((i[0] % 1000) as f32 * 1e-3))?;
    let hy = Array::<half::bf16>::from_fn_on(rig, &[n], |i| half::bf16::from_f32((i[0] % 777) as f32 * 1e-3))?;
    let ho = Array::<half::bf16>::zeros_on(rig, &[n])?;
    let mut hadd = Prog::new(&[Dtype::BF16, Dtype::BF16]);
    let (h0, h1) = (hadd.load(0), hadd.load(1));
    let hs = hadd.add(h0, h1);
    hadd.output(hs);
    let mut ident = Prog::new(&[Dtype::F32]);
    let l = ident.load(0);
    ident.output(l);
    let all = Array::<f32>::zeros_on(rig, &[])?;
    let cols = if n.is_multiple_of(4096) { 4096 } else { n };
    let rows_n = n / cols;
    let x2 = x.apply(&nx::kernels::Move::Reshape(vec![rows_n, cols]))?.ok_or("reshape")?;
    let per_row = Array::<f32>::zeros_on(rig, &[rows_n])?;

    // The limit: a parallel copy, bytes read plus bytes written per second, of the kernels' own
    // input `x` into their own output `out` (where memory lies moves its bandwidth by a fifth on
    // this virtual machine, so limit and kernels share theirs). Each repeat times the copy and
    // then every kernel, so that each ratio compares runs seconds apart on this noisy machine;
    // the medians of the values and of the per-repeat ratios are reported.
    let done = nx::kernels::Answer::Done;
    let mut cases: Vec<Case<'_>> = vec![
        // a peer for the sums: a plain parallel Rust loop of the sums' 8 lanes, in place
        Case::new("sum, plain 8-lane Rust loop (peer)", n * 4, || {
            let simd = Simd::detected();
            let sum = x
                .with_slice(|v| host.install(|| v.par_chunks(1 << 16).map(|c| lanes8(simd, c)).sum::<f32>()))
                .expect("contiguous");
            std::hint::black_box(sum);
        })
        .reads(),
        // the write-only counterpart: what streaming stores alone get per second here
        Case::new("fill, streaming stores (write-only peer)", n * 4, || {
            out2.with_slice_mut(|d| {
                host.install(|| {
                    d.par_chunks_mut(1 << 16).for_each(|c| {
                        stream_fill(c, 1.0);
                        nx::kernels::host::store_fence();
                    })
                })
            })
            .expect("contiguous")
        }),
        Case::new("sum (all elements)", n * 4, || {
            assert_eq!(host.reduce(&ident, &[n], &[0], &[Reduction::Sum], &[&all], &[&x]), done)
        })
        .reads()
        .torch("sum"),
        Case::new(format!("sum (last axis of {rows_n}x{cols})"), n * 4, || {
            assert_eq!(host.reduce(&ident, &[rows_n, cols], &[1], &[Reduction::Sum], &[&per_row], &[&x2]), done)
        })
        .reads()
        .torch("sum_rows"),
        Case::new("add", 3 * n * 4, || assert_eq!(host.map(&add, &[n], &[&out], &[&x, &y]), done)).torch("add"),
        // halves: widened to f32, added, rounded back
        Case::new("add bf16", 3 * n * 2, || assert_eq!(host.map(&hadd, &[n], &[&ho], &[&hx, &hy]), done))
            .torch("add_bf16"),
        Case::new("fused y=a*x+b, z=relu(y)", 5 * n * 4, || {
            assert_eq!(host.map(&chain, &[n], &[&out, &out2], &[&x, &y, &b]), done)
        })
        .torch("fused"),
        // a new output each run, from the device's caching pool (the block of the last run's)
        Case::new("add, output from the pool each run", 3 * n * 4, || {
            let o = Array::<f32>::uninit_on(rig, &[n]).expect("pool");
            assert_eq!(host.map(&add, &[n], &[&o], &[&x, &y]), done);
        }),
        // the peer without a pool: a new zeroed output from the system each run
        Case::new("add, output from the system each run (peer)", 3 * n * 4, || {
            let o = Array::<f32>::zeros(dev, &[n]).expect("memory");
            assert_eq!(host.map(&add, &[n], &[&o], &[&x, &y]), done);
        }),
    ];
    let (mut copy_bw, mut read_bw) = (Vec::new(), Vec::new());
    let mut values: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let (mut torch_values, mut torch_ratios): (Vec<Vec<f64>>, Vec<Vec<f64>>) =
        (vec![Vec::new(); cases.len()], vec![Vec::new(); cases.len()]);
    let mut torch_note = None;
    // Before each timed run, an untimed read of an unrelated buffer: whatever the previous run
    // left dirty in the caches is written back then, so each run starts from the same state.
    // Every parallel loop of the bench (scrub, limits, peers) runs on the library's pool, as the
    // kernels do: a second pool's threads, still spinning after the scrub, had held off the
    // wake-up of the kernels' threads (sums read at 0.7 of their speed then).
    let scrub: Vec<f32> = vec![1.0; 1 << 24];
    let simd = Simd::detected();
    let clean =
        || host.install(|| std::hint::black_box(scrub.par_chunks(1 << 16).map(|c| lanes8(simd, c)).sum::<f32>()));
    for rep in 0..=r {
        // torch's round first (its own process), then the limits and nx's rows back to back
        let peer = if rep > 0 && a.torch != "none" {
            match crate::bench_mem::torch_round(&a.torch, n, cols, 3) {
                Ok(v) => {
                    torch_note.get_or_insert_with(|| {
                        format!("torch {} on {} threads (maps and sums)", v["torch"], v["threads"])
                    });
                    Some(v)
                }
                Err(e) => {
                    torch_note.get_or_insert_with(|| format!("torch maps and sums peer: {e}"));
                    None
                }
            }
        } else {
            None
        };
        clean();
        let bw = x.with_slice(|s| out.with_slice_mut(|d| host.install(|| copy_limit(s, d, &clean))))??;
        let rb = x.with_slice(|s| host.install(|| read_limit(s, &clean)))?;
        for (i, case) in cases.iter_mut().enumerate() {
            clean();
            let t = Instant::now();
            (case.run)();
            let v = case.bytes as f64 / t.elapsed().as_secs_f64();
            if rep > 0 {
                values[i].push(v / 1e9);
                ratios[i].push(v / if case.reads_only { rb } else { bw });
                if let Some(p) = case.torch.and_then(|k| peer.as_ref()?[k].as_f64()) {
                    torch_values[i].push(p);
                    torch_ratios[i].push(v / 1e9 / p);
                }
            }
        }
        if rep > 0 {
            copy_bw.push(bw / 1e9);
            read_bw.push(rb / 1e9);
        }
    }
    notes.extend(torch_note);
    let (bw, rb) = (median(copy_bw), median(read_bw));
    rows.push(Row { name: "copy".into(), value: bw, unit: "GB/s", limit: None, ratio: None, ..Default::default() });
    rows.push(Row {
        name: "read limit (plain 8- or 64-lane loops, the fastest)".into(),
        value: rb,
        unit: "GB/s",
        limit: None,
        ratio: None,
        ..Default::default()
    });
    for (i, case) in cases.iter().enumerate() {
        let some = |v: &Vec<f64>| (!v.is_empty()).then(|| median(v.clone()));
        rows.push(Row {
            name: case.name.clone(),
            value: median(values[i].clone()),
            unit: "GB/s",
            limit: Some(if case.reads_only { rb } else { bw }),
            ratio: Some(median(ratios[i].clone())),
            peer: case.torch.filter(|_| !torch_values[i].is_empty()).map(|k| format!("torch {k}")),
            peer_value: some(&torch_values[i]),
            peer_ratio: some(&torch_ratios[i]),
        });
    }
    drop(cases);
    rows.extend(submit_cost(dev, r)?);
    Ok(())
}

/// The matmul rows, interleaved with numpy's and torch's.
fn matmul_rows(
    a: &KernelArgs,
    host: &Host,
    rig: &Rig,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let r = a.repeats.max(1);
    // Matmuls, interleaved with numpy's so that both see the same machine.
    let m = a.matmul;
    let mr = (r / 3).max(3);
    let ma = Array::<f32>::from_fn_on(rig, &[m, m], |i| ((i[0] * 7 + i[1] * 3) % 17) as f32 * 0.1 - 0.8)?;
    let mb = Array::<f32>::from_fn_on(rig, &[m, m], |i| ((i[0] * 5 + i[1]) % 13) as f32 * 0.1 - 0.6)?;
    let mc = Array::<f32>::zeros_on(rig, &[m, m])?;
    let flops = 2.0 * (m as f64).powi(3);
    let ha =
        Array::<half::bf16>::from_fn_on(rig, &[m, m], |i| half::bf16::from_f32(((i[0] + i[1]) % 11) as f32 * 0.1))?;
    let hb =
        Array::<half::bf16>::from_fn_on(rig, &[m, m], |i| half::bf16::from_f32(((i[0] * 3 + i[1]) % 7) as f32 * 0.1))?;
    let hc = Array::<half::bf16>::zeros_on(rig, &[m, m])?;
    // Rounds of numpy, nx f32, torch (f32 and bf16), nx bf16, back to back: the machine's speed
    // drifts over seconds, so each ratio is the median of each round's, as for the maps and sums.
    let (mut ours, mut peer, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ours_b, mut torch_f, mut torch_b, mut vs_f, mut vs_b) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut torch_note = String::new();
    for round in 0..MATMUL_ROUNDS {
        let p = match numpy_gflops(a, mr) {
            Ok((g, info)) => {
                if round == 0 {
                    notes.push(info);
                }
                Some(g)
            }
            Err(e) => {
                if round == 0 {
                    notes.push(format!("numpy peer: {e}"));
                }
                None
            }
        };
        let t = time(mr, || {
            assert_eq!(host.contract(&Contraction::matmul(0), &mc, &ma, &mb, None), nx::kernels::Answer::Done)
        });
        let g = flops / t / 1e9;
        ours.push(g);
        if let Some(p) = p {
            peer.push(p);
            ratios.push(g / p);
        }
        let tp = if a.torch == "none" {
            Err("skipped (--torch none)".to_string())
        } else {
            python_peer(&a.torch, "benches/torch_matmul.py", &[m.to_string(), mr.to_string()])
        };
        let t = time(mr, || {
            assert_eq!(host.contract(&Contraction::matmul(0), &hc, &ha, &hb, None), nx::kernels::Answer::Done)
        });
        let gb = flops / t / 1e9;
        ours_b.push(gb);
        match tp {
            Ok(v) => {
                let (f, b) = (v["f32"].as_f64().unwrap_or(f64::NAN), v["bf16"].as_f64().unwrap_or(f64::NAN));
                if round == 0 {
                    torch_note = format!("torch {} on {} threads (matmuls)", v["torch"], v["threads"]);
                }
                torch_f.push(f);
                torch_b.push(b);
                vs_f.push(g / f);
                vs_b.push(gb / b);
            }
            Err(e) if round == 0 => torch_note = format!("torch matmul peer: {e}"),
            Err(_) => {}
        }
    }
    notes.push(torch_note);
    let peer_g = (!peer.is_empty()).then(|| median(peer));
    let some = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
    rows.push(Row {
        name: format!("matmul f32 {m}^3"),
        value: median(ours),
        unit: "GFLOP/s",
        limit: peer_g,
        ratio: some(ratios),
        peer: (!torch_f.is_empty()).then(|| "torch matmul f32".to_string()),
        peer_value: some(torch_f),
        peer_ratio: some(vs_f),
    });
    let gb = median(ours_b);
    rows.push(Row {
        name: format!("matmul bf16 {m}^3 (f32 accumulate)"),
        value: gb,
        unit: "GFLOP/s",
        limit: peer_g,
        ratio: peer_g.map(|p| gb / p),
        peer: (!torch_b.is_empty()).then(|| "torch matmul bf16".to_string()),
        peer_value: some(torch_b),
        peer_ratio: some(vs_b),
    });

    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stream_fill;

    /// Every element from every alignment, lengths 0–99, is written, and nothing around it.
    #[test]
    fn streaming_fill_writes_every_element() {
        let mut buf = vec![0f32; 128];
        for start in 0..9 {
            for len in 0..100 {
                buf.fill(-1.0);
                stream_fill(&mut buf[start..start + len], 2.5);
                nx::kernels::host::store_fence();
                for (i, &v) in buf.iter().enumerate() {
                    let inside = (start..start + len).contains(&i);
                    assert_eq!(v, if inside { 2.5 } else { -1.0 }, "start {start}, len {len}, index {i}");
                }
            }
        }
    }
}
