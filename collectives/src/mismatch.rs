//! The mismatch suite: ranks that give a collective (or a send and its receive) different lengths
//! or counts are refused on every rank with [`Error::Mismatch`], by every backend, in checked mode
//! or not, and no byte outside the buffers changes (each buffer lies between guards that are
//! checked after the call). Run by the simulated backend's tests and under `mpirun` (in a release
//! build, unchecked) by `nx-mpi-check lengths`.

use crate::{Communicator, Error, ReduceOp, Result};

/// Elements of the guards on each side of a buffer, and their value.
const GUARD: usize = 4096;
const SENTINEL: f32 = -7.25;

/// A buffer of `len` elements between guards.
fn guarded(len: usize) -> Vec<f32> {
    vec![SENTINEL; len + 2 * GUARD]
}

/// Whether the guards around a buffer still hold the sentinel, bit for bit.
fn intact(v: &[f32]) -> bool {
    let n = v.len();
    v[..GUARD].iter().chain(&v[n - GUARD..]).all(|x| x.to_bits() == SENTINEL.to_bits())
}

/// Runs the suite on `c` (at least 2 ranks): every collective, then a send and its receive, with
/// the last rank giving other lengths or counts; then two calls where the last rank calls another
/// op (`ops`, `barrier`); then an all-reduce that agrees. Answers one line
/// per call: `rank R: OP refused (guards intact): ERROR` where the backend refused it as it must,
/// else what it did instead (`NOT REFUSED`, `failed otherwise`, `GUARDS BROKEN`); and last
/// `rank R: in step, sum S` (S the sum of the ranks).
///
/// # Errors
/// The errors of the final all-reduce.
pub fn suite<C: Communicator>(c: &C) -> Result<Vec<String>> {
    let (n, r) = (c.size(), c.rank());
    let last = r == n - 1;
    let mut lines = Vec::new();
    let mut say = |what: &str, e: Result<()>, bufs: &[&Vec<f32>]| {
        let guards = if bufs.iter().all(|b| intact(b)) { "guards intact" } else { "GUARDS BROKEN" };
        lines.push(match e {
            Err(e @ Error::Mismatch { .. }) => format!("rank {r}: {what} refused ({guards}): {e}"),
            Err(e) => format!("rank {r}: {what} failed otherwise ({guards}): {e}"),
            Ok(()) => format!("rank {r}: {what} NOT REFUSED ({guards})"),
        });
    };
    // large enough to pass the push piece, the reduce chunk and a half's round
    let len = if last { 300_017 } else { 300_000 };
    let send = guarded(len);
    let mut recv = guarded(len);
    let e = c.all_reduce(&send[GUARD..GUARD + len], &mut recv[GUARD..GUARD + len], ReduceOp::Sum);
    say("all_reduce", e, &[&recv]);
    let counts: Vec<usize> = (0..n).map(|q| if last { 100_003 + q } else { 100_000 + q }).collect();
    let total: usize = counts.iter().sum();
    let send = guarded(total);
    let mut part = guarded(counts[r]);
    let e =
        c.reduce_scatter_v(&send[GUARD..GUARD + total], &mut part[GUARD..GUARD + counts[r]], &counts, ReduceOp::Sum);
    say("reduce_scatter", e, &[&part]);
    let mine = guarded(counts[r]);
    let mut all = guarded(total);
    let e = c.all_gather_v(&mine[GUARD..GUARD + counts[r]], &mut all[GUARD..GUARD + total], &counts);
    say("all_gather", e, &[&all]);
    // the last rank expects more from rank 0 than rank 0 sends it
    let sc = vec![70_000; n];
    let rc: Vec<usize> = (0..n).map(|q| if last && q == 0 { 70_009 } else { 70_000 }).collect();
    let (st, rt) = (sc.iter().sum::<usize>(), rc.iter().sum::<usize>());
    let send = guarded(st);
    let mut recv = guarded(rt);
    let e = c.all_to_all_v(&send[GUARD..GUARD + st], &sc, &mut recv[GUARD..GUARD + rt], &rc);
    say("all_to_all", e, &[&recv]);
    let mut b = guarded(len);
    let e = c.broadcast(&mut b[GUARD..GUARD + len], 0);
    say("broadcast", e, &[&b]);
    // rank 0 sends 1000 elements to the last rank, which expects 1009
    if r == 0 || last {
        let mut b = guarded(if last { 1009 } else { 1000 });
        let m = b.len() - 2 * GUARD;
        let e = if r == 0 { c.send(&b[GUARD..GUARD + m], n - 1) } else { c.recv(&mut b[GUARD..GUARD + m], 0) };
        say("send/recv", e, &[&b]);
    }
    // other ops: the last rank calls an all-to-all where the others call an all-reduce, then a
    // barrier where they call an all-gather
    let mut recv = guarded(n);
    let e = if last {
        let ones = vec![1; n];
        c.all_to_all_v(&vec![1f32; n], &ones, &mut recv[GUARD..GUARD + n], &ones)
    } else {
        c.all_reduce(&vec![1f32; n], &mut recv[GUARD..GUARD + n], ReduceOp::Sum)
    };
    say("ops", e, &[&recv]);
    let mut all = guarded(n);
    let e = if last { c.barrier() } else { c.all_gather(&[1f32], &mut all[GUARD..GUARD + n]) };
    say("barrier", e, &[&all]);
    // still in step: a call that agrees
    let mut out = [0f32; 3];
    c.all_reduce(&[r as f32; 3], &mut out, ReduceOp::Sum)?;
    lines.push(format!("rank {r}: in step, sum {}", out[0]));
    Ok(lines)
}
