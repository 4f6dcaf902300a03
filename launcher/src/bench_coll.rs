//! `nx bench collectives`: all-reduce, all-gather, reduce-scatter and all-to-all against the
//! memory-traffic floor, printed as nccl-tests prints them.

use std::time::{Duration, Instant};

use nx::collectives::sim::{self, SimComm, SimOptions};
use nx::collectives::{Communicator, ReduceOp};
use rayon::prelude::*;
use serde::Serialize;

/// Arguments of `nx bench collectives`.
#[derive(clap::Args, Debug)]
pub struct CollectiveArgs {
    /// The backend: `sim` (threads of one process) or `mpi`.
    #[arg(long, default_value = "sim")]
    backend: String,
    /// Ranks (sim).
    #[arg(short = 'n', long, default_value_t = 4)]
    ranks: usize,
    /// The largest size, in bytes (sizes go from 4 KiB by factors of 4).
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Timed runs at each size (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Debug, Clone)]
struct Row {
    op: &'static str,
    backend: &'static str,
    bytes: usize,
    n: usize,
    seconds: f64,
    algbw: f64,
    busbw: f64,
    limit_seconds: f64,
    ratio: f64,
}

type Error = Box<dyn std::error::Error>;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Bytes read plus bytes written per second by a copy of 256 MiB on all cores.
fn copy_bandwidth() -> f64 {
    let n = 64 << 20;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s));
            (2 * n * 4) as f64 / t.elapsed().as_secs_f64()
        })
        .collect();
    median(runs)
}

/// Runs the collective benchmark; returns the report.
pub fn collectives(a: &CollectiveArgs) -> Result<String, Error> {
    if a.backend != "sim" {
        return Err(format!("nx bench collectives: backend {:?} is not built yet (sim is)", a.backend).into());
    }
    let n = a.ranks;
    let bw = copy_bandwidth();
    let sizes: Vec<usize> =
        std::iter::successors(Some(4096usize), |&s| Some(s * 4)).take_while(|&s| s <= a.max_bytes).collect();
    let reps = a.repeats.max(1);
    let opts = SimOptions { checked: false, timeout: Duration::from_secs(600) };
    let max_elems = a.max_bytes / 4;
    // Each rank times every op at every size between barriers; rank 0's times are reported.
    let times = sim::run(n, opts, |c: SimComm| -> nx::collectives::Result<Vec<(usize, usize, f64)>> {
        let r = c.rank();
        let send: Vec<f32> = (0..max_elems).map(|i| (i % 97) as f32 + r as f32).collect();
        let mut recv = vec![0f32; max_elems];
        let mut out = Vec::new();
        for (si, &bytes) in sizes.iter().enumerate() {
            let elems = bytes / 4;
            for op in 0..4 {
                let mut ts = Vec::new();
                for rep in 0..=reps {
                    c.barrier()?;
                    let t = Instant::now();
                    match op {
                        0 => c.all_reduce(&send[..elems], &mut recv[..elems], ReduceOp::Sum)?,
                        1 => {
                            let per = elems / n;
                            c.all_gather(&send[..per], &mut recv[..per * n])?
                        }
                        2 => {
                            let per = elems / n;
                            c.reduce_scatter(&send[..per * n], &mut recv[..per], ReduceOp::Sum)?
                        }
                        _ => {
                            let per = elems / n;
                            c.all_to_all(&send[..per * n], &mut recv[..per * n])?
                        }
                    }
                    c.barrier()?;
                    if rep > 0 {
                        ts.push(t.elapsed().as_secs_f64());
                    }
                }
                out.push((si, op, median(ts)));
            }
        }
        Ok(out)
    })?;
    let names = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"];
    let nf = n as f64;
    let rows: Vec<Row> = times[0]
        .iter()
        .map(|&(si, op, t)| {
            let b = sizes[si] as f64;
            // nccl-tests' bus factors; the floor reads every rank's input once and writes every
            // rank's output once, at the copy's bytes-read-plus-written bandwidth
            let (bus, traffic) = match op {
                0 => (2.0 * (nf - 1.0) / nf, 2.0 * nf * b),
                1 | 2 => ((nf - 1.0) / nf, b * (nf + 1.0)),
                _ => ((nf - 1.0) / nf, 2.0 * nf * b),
            };
            let limit = traffic / bw;
            Row {
                op: names[op],
                backend: "sim",
                bytes: sizes[si],
                n,
                seconds: t,
                algbw: b / t / 1e9,
                busbw: b / t / 1e9 * bus,
                limit_seconds: limit,
                ratio: limit / t,
            }
        })
        .collect();
    if a.json {
        return Ok(rows.iter().map(|r| serde_json::to_string(r).expect("plain data")).collect::<Vec<_>>().join("\n"));
    }
    let mut text = format!(
        "collectives on the sim backend, {n} ranks; copy bandwidth {:.1} GB/s (read + written); medians of {reps} runs\n",
        bw / 1e9
    );
    for name in names {
        text.push_str(&format!(
            "\n# {name}\n{:>12} {:>12} {:>10} {:>10} {:>12} {:>7}\n",
            "size(B)", "time(us)", "algbw", "busbw", "floor(us)", "ratio"
        ));
        for r in rows.iter().filter(|r| r.op == name) {
            text.push_str(&format!(
                "{:>12} {:>12.1} {:>10.2} {:>10.2} {:>12.1} {:>7.2}\n",
                r.bytes,
                r.seconds * 1e6,
                r.algbw,
                r.busbw,
                r.limit_seconds * 1e6,
                r.ratio
            ));
        }
    }
    Ok(text.trim_end().to_string())
}
