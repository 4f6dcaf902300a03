//! `nx bench collectives`: all-reduce, all-gather, reduce-scatter and all-to-all against the
//! memory-traffic floor, printed as nccl-tests prints them.

use std::time::{Duration, Instant};

use nx::collectives::sim::{self, SimComm, SimOptions};
use nx::collectives::{Communicator, ReduceOp};
use serde::Serialize;

/// Arguments of `nx bench collectives`.
#[derive(clap::Args, Debug)]
pub struct CollectiveArgs {
    /// The backend: `sim` (threads of one process) or `mpi`.
    #[arg(long, default_value = "sim")]
    backend: String,
    /// Ranks (sim).
    #[arg(short = 'n', long, default_value_t = 4, value_parser = crate::args::ranks, allow_hyphen_values = true)]
    ranks: usize,
    /// The largest size, in bytes (sizes go from 4 KiB by factors of 4).
    #[arg(long, default_value_t = 256 << 20, value_parser = crate::args::max_bytes, allow_hyphen_values = true)]
    max_bytes: usize,
    /// Timed runs at each size (the median is reported); sizes up to 4 MiB run at least 21
    /// times (cheap, and the noisiest).
    #[arg(long, default_value_t = 5, value_parser = crate::args::repeats, allow_hyphen_values = true)]
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

/// Bytes read plus bytes written per second by a copy of 256 MiB on all cores (the faster of
/// `memcpy` and streaming stores), the median of 5.
fn copy_bandwidth() -> f64 {
    let n = 64 << 20;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let runs: Vec<f64> = (0..5).map(|_| crate::bench::copy_limit(&src, &mut dst, &|| 0.0)).collect();
    median(runs)
}

/// The host's copy bandwidth under MPI, bytes read plus written per second: every rank copies
/// its share of 256 MiB at once (the faster of `memcpy` and streaming stores), on the CPUs its
/// binding leaves it, and a run's bandwidth is all the bytes over the slowest rank's time; the
/// median of 5. (One rank copying alone measures one core's bandwidth where `mpirun` binds each
/// rank to a core — its default for two ranks — and so overstates every ratio.)
#[cfg(feature = "mpi")]
fn mpi_copy_bandwidth<C: Communicator>(c: &C) -> nx::collectives::Result<f64> {
    let share = (64 << 20) / c.size();
    let src = vec![1f32; share];
    let mut dst = vec![0f32; share];
    let bytes = (2 * 4 * share) as f64;
    let mut runs = Vec::new();
    for _ in 0..5 {
        c.barrier()?;
        let seconds = bytes / crate::bench::copy_limit(&src, &mut dst, &|| 0.0);
        let mut all = vec![0f64; c.size()];
        c.all_gather(&[seconds], &mut all)?;
        runs.push(bytes * c.size() as f64 / all.iter().copied().fold(0.0, f64::max));
    }
    Ok(median(runs))
}

/// (size index, op, median seconds) per measurement.
type Times = Vec<(usize, usize, f64)>;

/// A plain collective of op `k` on (send, recv).
type Plain<'a> = &'a dyn Fn(usize, &[f32], &mut [f32]);

/// Times every op at every size on `c` between barriers; where `plain` is given, each timed run
/// of nx's collective is followed by one of the MPI library's own on the same buffers
/// (interleaved, so that both see the same machine). Answers nx's times and plain's.
fn time_ops<C: Communicator>(
    c: &C,
    sizes: &[usize],
    reps: usize,
    plain: Option<Plain<'_>>,
) -> nx::collectives::Result<(Times, Times)> {
    let r = c.rank();
    let max_elems = sizes.last().copied().unwrap_or(0) / 4;
    // the buffers as nx allocates its arrays' (huge pages from 4 MiB), for nx and plain MPI alike,
    let invalid = |e: nx::kernels::Error| nx::collectives::Error::Invalid {
        func: "nx bench collectives",
        why: format!("cannot allocate the buffers: {e}"),
    };
    // from a rig's pool, as a rank's tensors are
    let rig = nx::kernels::rig::Rig::host(nx::Device::sim(r)).map_err(invalid)?;
    let send = nx::kernels::Array::<f32>::from_fn_on(&rig, &[max_elems], |i| (i[0] % 97) as f32 + r as f32)
        .map_err(invalid)?;
    let recv = nx::kernels::Array::<f32>::zeros_on(&rig, &[max_elems]).map_err(invalid)?;
    // `place` split(0) → on at each size: the plan executor's all-gather, outputs from the pool
    let n = c.size();
    let plans = nx::Devices::with(nx::Device::sims(n), |set| -> nx::placement::Result<Vec<nx::Plan>> {
        let (from, to) = (nx::Placement::split(0, &set)?, nx::Placement::on(&set));
        sizes.iter().map(|&b| nx::placement::plan(&from, &to, &[b / 4 / n * n], 4)).collect()
    })
    .map_err(|e| nx::collectives::Error::Invalid { func: "nx bench collectives", why: e.to_string() })??;
    let groups = nx::collectives::Groups::new();
    let place = |si: usize, s: &[f32]| nx::collectives::place_in(c, &groups, &plans[si], Some(s), &rig).map(drop);
    send.with_slice(|send| recv.with_slice_mut(|recv| time_ops_on(c, sizes, reps, plain, &place, send, recv)))
        .map_err(invalid)?
        .map_err(invalid)?
}

/// The ops timed, by their index in [`time_ops_on`]: the four collectives, then `place`
/// split(0) → on (the plan executor's all-gather, its output from the rig's pool).
const OPS: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "place_gather"];

/// Sizes up to this many bytes are timed at least [`SMALL_REPEATS`] times.
const SMALL: usize = 4 << 20;
/// The least number of timed runs of a size up to [`SMALL`].
const SMALL_REPEATS: usize = 21;

/// [`time_ops`] on the buffers `send` and `recv`; `place` runs the executor's plan of a size.
fn time_ops_on<C: Communicator>(
    c: &C,
    sizes: &[usize],
    reps: usize,
    plain: Option<Plain<'_>>,
    place: &dyn Fn(usize, &[f32]) -> nx::collectives::Result<()>,
    send: &[f32],
    recv: &mut [f32],
) -> nx::collectives::Result<(Times, Times)> {
    let n = c.size();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for (si, &bytes) in sizes.iter().enumerate() {
        let elems = bytes / 4;
        let per = elems / n;
        for op in 0..OPS.len() {
            let (mut ts, mut ps) = (Vec::new(), Vec::new());
            let reps = if bytes <= SMALL { reps.max(SMALL_REPEATS) } else { reps };
            for rep in 0..=reps {
                let (s, rv): (&[f32], &mut [f32]) = match op {
                    0 => (&send[..elems], &mut recv[..elems]),
                    1 | 4 => (&send[..per], &mut recv[..per * n]),
                    2 => (&send[..per * n], &mut recv[..per]),
                    _ => (&send[..per * n], &mut recv[..per * n]),
                };
                c.barrier()?;
                let t = Instant::now();
                match op {
                    0 => c.all_reduce(s, rv, ReduceOp::Sum)?,
                    1 => c.all_gather(s, rv)?,
                    2 => c.reduce_scatter(s, rv, ReduceOp::Sum)?,
                    3 => c.all_to_all(s, rv)?,
                    _ => place(si, s)?,
                }
                c.barrier()?;
                let took = t.elapsed().as_secs_f64();
                if let (Some(p), true) = (plain, op < 4) {
                    c.barrier()?;
                    let t = Instant::now();
                    p(op, s, rv);
                    c.barrier()?;
                    if rep > 0 {
                        ps.push(t.elapsed().as_secs_f64());
                    }
                }
                if rep > 0 {
                    ts.push(took);
                }
            }
            ours.push((si, op, median(ts)));
            if !ps.is_empty() {
                theirs.push((si, op, median(ps)));
            }
        }
    }
    Ok((ours, theirs))
}

/// (rank, size, copy bandwidth, nx's times, plain MPI's times) of this MPI rank.
type MpiTimes = (usize, usize, f64, Times, Times);

#[cfg(feature = "mpi")]
fn mpi_times(sizes: &[usize], reps: usize) -> Result<MpiTimes, Error> {
    use nx::collectives::mpi::{self, MpiComm, MpiOptions};
    let opts = MpiOptions { checked: false, timeout: Duration::from_secs(600), simd: None };
    Ok(mpi::run(opts, |c: MpiComm| -> nx::collectives::Result<MpiTimes> {
        let bw = mpi_copy_bandwidth(&c)?;
        let plain = |op: usize, s: &[f32], r: &mut [f32]| match op {
            0 => c.plain_all_reduce_sum(s, r),
            1 => c.plain_all_gather(s, r),
            2 => c.plain_reduce_scatter_sum(s, r),
            _ => c.plain_all_to_all(s, r),
        };
        let (ours, theirs) = time_ops(&c, sizes, reps, Some(&plain))?;
        Ok((c.rank(), c.size(), bw, ours, theirs))
    })?)
}

#[cfg(not(feature = "mpi"))]
fn mpi_times(_: &[usize], _: usize) -> Result<MpiTimes, Error> {
    Err("nx bench collectives: this nx was built without the `mpi` feature (cargo build --features mpi)".into())
}

/// Runs the collective benchmark; returns the report (empty on MPI ranks other than 0).
pub fn collectives(a: &CollectiveArgs) -> Result<String, Error> {
    let sizes: Vec<usize> =
        std::iter::successors(Some(4096usize), |&s| Some(s * 4)).take_while(|&s| s <= a.max_bytes).collect();
    let reps = a.repeats.max(1);
    let (backend, n, bw, times, plain): (&'static str, usize, f64, Times, Option<Times>) = match a.backend.as_str() {
        "sim" => {
            let bw = copy_bandwidth();
            let opts = SimOptions { checked: false, timeout: Duration::from_secs(600), ..Default::default() };
            let t = sim::run(a.ranks, opts, |c: SimComm| time_ops(&c, &sizes, reps, None))?;
            ("sim", a.ranks, bw, t[0].0.clone(), None)
        }
        "mpi" => {
            let (rank, n, bw, ours, theirs) = mpi_times(&sizes, reps)?;
            if rank != 0 {
                return Ok(String::new());
            }
            ("mpi", n, bw, ours, Some(theirs))
        }
        other => return Err(format!("nx bench collectives: unknown backend {other:?} (sim, mpi)").into()),
    };
    let names = OPS;
    let nf = n as f64;
    let rows: Vec<Row> = times
        .iter()
        .map(|&(si, op, t)| {
            let b = sizes[si] as f64;
            // nccl-tests' bus factors; the floor reads every rank's input once and writes every
            // rank's output once, at the copy's bytes-read-plus-written bandwidth
            let (bus, traffic) = match op {
                0 => (2.0 * (nf - 1.0) / nf, 2.0 * nf * b),
                1 | 2 | 4 => ((nf - 1.0) / nf, b * (nf + 1.0)),
                _ => ((nf - 1.0) / nf, 2.0 * nf * b),
            };
            let limit = traffic / bw;
            Row {
                op: names[op],
                backend,
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
    let plain_of =
        |si: usize, op: usize| plain.as_ref().and_then(|p| p.iter().find(|x| x.0 == si && x.1 == op)).map(|x| x.2);
    if a.json {
        let lines: Vec<String> = rows
            .iter()
            .zip(&times)
            .map(|(r, &(si, op, _))| {
                let mut v = serde_json::to_value(r).expect("plain data");
                if let Some(p) = plain_of(si, op) {
                    v["plain_mpi_seconds"] = serde_json::json!(p);
                }
                v.to_string()
            })
            .collect();
        return Ok(lines.join("\n"));
    }
    let mut text = format!(
        "collectives on the {backend} backend, {n} ranks; copy bandwidth {:.1} GB/s (read + written); medians of {reps} runs \
         ({} up to {} MiB)\n",
        bw / 1e9,
        reps.max(SMALL_REPEATS),
        SMALL >> 20
    );
    let extra = if plain.is_some() { format!(" {:>14} {:>9}", "plain MPI(us)", "vs plain") } else { String::new() };
    for (k, name) in names.iter().enumerate() {
        text.push_str(&format!(
            "\n# {name}\n{:>12} {:>12} {:>10} {:>10} {:>12} {:>7}{extra}\n",
            "size(B)", "time(us)", "algbw", "busbw", "floor(us)", "ratio"
        ));
        for (r, &(si, _, _)) in rows.iter().zip(&times).filter(|(r, _)| r.op == *name) {
            // vs plain: plain MPI's time over nx's (above 1: nx is faster)
            let p = plain_of(si, k).map_or(String::new(), |p| format!(" {:>14.1} {:>9.2}", p * 1e6, p / r.seconds));
            text.push_str(&format!(
                "{:>12} {:>12.1} {:>10.2} {:>10.2} {:>12.1} {:>7.2}{p}\n",
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
