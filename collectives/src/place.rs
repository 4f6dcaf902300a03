//! Executing a plan: each rank runs the steps of a [`Plan`] on its window, with the collective
//! each step names, over sub-communicators of the step's groups.
//!
//! A window's data is its elements in C order of the window's box. Memory: a step holds its input
//! window, its output window and its message buffers, no more.

use nx_placement::region::{intersect, volume, Window};
use nx_placement::{Op, Plan};

use crate::log::Recorder;
use crate::{Communicator, Error, ReduceOp, Reducible, Result};

/// Copies the elements of box `b` from `src` (the data of box `sw`) into `dst` (of box `dw`).
fn copy_box<T: Copy>(src: &[T], sw: &Window, dst: &mut [T], dw: &Window, b: &Window) {
    if volume(b) == 0 {
        return;
    }
    let rank = b.len();
    if rank == 0 {
        dst[0] = src[0];
        return;
    }
    let strides = |w: &Window| {
        let mut s = vec![1usize; rank];
        for d in (0..rank - 1).rev() {
            s[d] = s[d + 1] * w[d + 1].len();
        }
        s
    };
    let (ss, ds) = (strides(sw), strides(dw));
    let run = b[rank - 1].len();
    let mut idx: Vec<usize> = b.iter().map(|r| r.start).collect();
    loop {
        let so: usize = (0..rank).map(|d| (idx[d] - sw[d].start) * ss[d]).sum();
        let doff: usize = (0..rank).map(|d| (idx[d] - dw[d].start) * ds[d]).sum();
        let (from, to) = (&src[so..so + run], &mut dst[doff..doff + run]);
        // SAFETY: `to` is a slice of `run` elements apart from `from` (vector copies: see
        // `nx_kernels::host::copy` on `memcpy`).
        unsafe { nx_kernels::host::copy(from, to.as_mut_ptr()) };
        // next run: advance all axes but the last
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < b[d].end {
                break;
            }
            idx[d] = b[d].start;
        }
    }
}

/// `data` (of box `w`) restricted to box `b`, in C order.
fn pack<T: Copy + Default>(data: &[T], w: &Window, b: &Window) -> Vec<T> {
    let mut out = vec![T::default(); volume(b) as usize];
    copy_box(data, w, &mut out, b, b);
    out
}

/// This rank's group in `groups` and its position there, as a `split` color and key.
fn color(groups: &[Vec<usize>], me: Option<usize>) -> (Option<usize>, usize) {
    let Some(me) = me else { return (None, 0) };
    for (g, members) in groups.iter().enumerate() {
        if let Some(p) = members.iter().position(|&m| m == me) {
            return (Some(g), p);
        }
    }
    (None, 0)
}

fn vol(w: &Option<Window>) -> usize {
    w.as_ref().map_or(0, |w| volume(w) as usize)
}

/// Runs `plan` on this rank: `local` is this rank's window of the value at the plan's `from`
/// (its elements in C order; `None` where it holds nothing), and the answer its window at `to`.
/// Every rank of `comm` calls it with the same plan; rank r drives the plan's device whose owning
/// rank is r.
///
/// # Errors
/// [`Error::Invalid`] where `local` does not match this rank's window at `from`; any error of the
/// collectives (a peer that failed, a timeout, a mismatch).
pub fn place<T: Reducible, C: Communicator>(comm: &C, plan: &Plan, local: Option<Vec<T>>) -> Result<Option<Vec<T>>> {
    let me = plan.devices.iter().position(|d| d.rank == comm.world_rank());
    let owner: Vec<usize> = plan.devices.iter().map(|d| d.rank).collect();
    let old = me.and_then(|u| plan.old[u].clone());
    if local.as_ref().map(Vec::len) != old.as_ref().map(|w| volume(w) as usize) {
        return Err(Error::Invalid {
            func: "nx_collectives::place",
            why: format!(
                "rank {} holds {:?} elements, its window at {} is {:?}",
                comm.world_rank(),
                local.as_ref().map(Vec::len),
                plan.from,
                old
            ),
        });
    }
    let (data, win) = (local, old);
    let recorder = comm.recorder().cloned();
    let outer = recorder.as_ref().and_then(|r| r.set_step(None));
    let out = run_steps(comm, plan, me, &owner, (data, win), recorder.as_ref());
    if let Some(r) = &recorder {
        r.set_step(outer);
    }
    let (data, _) = out?;
    // Devices that hold nothing at `to` (a `device` placement elsewhere) drop what they held.
    Ok(me.and_then(|u| plan.new[u].as_ref().map(|_| data.unwrap_or_default())))
}

/// The steps of `plan` on this rank (device `me`, holding `data` over the window `win`), each
/// named in `recorder` as it runs; answers what the rank holds after the last.
fn run_steps<T: Reducible, C: Communicator>(
    comm: &C,
    plan: &Plan,
    me: Option<usize>,
    owner: &[usize],
    (mut data, mut win): (Option<Vec<T>>, Option<Window>),
    recorder: Option<&Recorder>,
) -> Result<(Option<Vec<T>>, Option<Window>)> {
    for (k, step) in plan.steps.iter().enumerate() {
        if let Some(r) = recorder {
            let over =
                if step.mesh_axes.is_empty() { String::new() } else { format!(" over {}", step.mesh_axes.join(".")) };
            r.set_step(Some(format!("{k}: {}{over}", step.op.name())));
        }
        let (c, key) = color(&step.groups, me);
        // only the steps that meet in groups split (every rank takes the same steps)
        let grouped = !matches!(step.op, Op::SendRecv | Op::LocalSlice | Op::ZeroFill);
        let group = if grouped { comm.split_over(c, key, &step.mesh_axes)? } else { None };
        match step.op {
            Op::AllReduce => {
                if let (Some(g), Some(d)) = (&group, &data) {
                    let mut out = vec![T::default(); d.len()];
                    g.all_reduce(d, &mut out, ReduceOp::Sum)?;
                    data = Some(out);
                }
            }
            Op::ReduceScatter => {
                if let (Some(g), Some(d), Some(w), Some(c)) = (&group, &data, &win, c) {
                    let members = &step.groups[c];
                    let mut send = Vec::with_capacity(d.len());
                    let mut counts = Vec::with_capacity(members.len());
                    for &m in members {
                        let b = plan.new[m].clone().expect("a reduce-scatter's targets hold a window");
                        send.extend(pack(d, w, &b));
                        counts.push(volume(&b) as usize);
                    }
                    let mine = plan.new[me.expect("a member")].clone();
                    let mut out = vec![T::default(); vol(&mine)];
                    g.reduce_scatter_v(&send, &mut out, &counts, ReduceOp::Sum)?;
                    data = Some(out);
                    win = mine;
                }
            }
            Op::LocalSlice => {
                if let Some(u) = me {
                    let target = plan.need[u].clone();
                    data = match (&data, &win, &target) {
                        (Some(d), Some(w), Some(t)) => Some(pack(d, w, t)),
                        _ => None,
                    };
                    win = target;
                }
            }
            Op::AllGather | Op::AllToAll => {
                if let (Some(g), Some(c)) = (&group, c) {
                    let members = &step.groups[c];
                    let u = me.expect("a member");
                    let (d, w) = (data.as_deref().unwrap_or(&[]), win.clone());
                    let target = plan.need[u].clone().expect("a gather's members need a window");
                    let mut out = vec![T::default(); volume(&target) as usize];
                    if step.op == Op::AllGather {
                        let counts: Vec<usize> = members.iter().map(|&m| vol(&plan.old[m])).collect();
                        let mut all = vec![T::default(); counts.iter().sum()];
                        g.all_gather_v(d, &mut all, &counts)?;
                        let mut at = 0;
                        for (j, &m) in members.iter().enumerate() {
                            if let Some(ow) = &plan.old[m] {
                                copy_box(&all[at..at + counts[j]], ow, &mut out, &target, ow);
                            }
                            at += counts[j];
                        }
                    } else {
                        let mut send = Vec::new();
                        let mut send_counts = Vec::with_capacity(members.len());
                        let mut recv_counts = Vec::with_capacity(members.len());
                        let pieces: Vec<Option<Window>> = members
                            .iter()
                            .map(|&m| match (&plan.old[m], &plan.need[u]) {
                                (Some(o), Some(n)) => intersect(n, o),
                                _ => None,
                            })
                            .collect();
                        for &m in members {
                            let b = match (&w, &plan.need[m]) {
                                (Some(o), Some(n)) => intersect(o, n),
                                _ => None,
                            };
                            match (&b, &w) {
                                (Some(b), Some(ow)) => {
                                    send.extend(pack(d, ow, b));
                                    send_counts.push(volume(b) as usize);
                                }
                                _ => send_counts.push(0),
                            }
                        }
                        for p in &pieces {
                            recv_counts.push(vol(p));
                        }
                        let mut recv = vec![T::default(); recv_counts.iter().sum()];
                        g.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
                        let mut at = 0;
                        for (j, p) in pieces.iter().enumerate() {
                            if let Some(p) = p {
                                copy_box(&recv[at..at + recv_counts[j]], p, &mut out, &target, p);
                            }
                            at += recv_counts[j];
                        }
                    }
                    data = Some(out);
                    win = Some(target);
                }
            }
            Op::Broadcast => {
                if let (Some(g), Some(u)) = (&group, me) {
                    let root = step.groups[0][0];
                    let whole = plan.old[root].clone().expect("the root holds the value");
                    let mut buf = if u == root {
                        data.clone().unwrap_or_default()
                    } else {
                        vec![T::default(); volume(&whole) as usize]
                    };
                    g.broadcast(&mut buf, 0)?;
                    // every member keeps what it needs of the whole: the root may need less
                    let target = plan.need[u].clone();
                    data = target.as_ref().map(|t| if *t == whole { buf } else { pack(&buf, &whole, t) });
                    win = target;
                }
            }
            Op::SendRecv => {
                // One all-to-all-v over the whole communicator; counts are zero outside the
                // plan's transfers, which every rank computes alike.
                let n = comm.size();
                let moves = &plan.transfers[k];
                let mut send_counts = vec![0usize; n];
                let mut send = Vec::new();
                let mut recv_counts = vec![0usize; n];
                for r in 0..n {
                    for t in moves.iter().filter(|t| Some(t.from) == me && owner[t.to] == r) {
                        let (d, w) = (data.as_deref().expect("a sender holds data"), win.as_ref().expect("a window"));
                        send.extend(pack(d, w, &t.window));
                        send_counts[r] += volume(&t.window) as usize;
                    }
                    for t in moves.iter().filter(|t| Some(t.to) == me && owner[t.from] == r) {
                        recv_counts[r] += volume(&t.window) as usize;
                    }
                }
                let mut recv = vec![T::default(); recv_counts.iter().sum()];
                comm.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
                if let Some(u) = me {
                    if let Some(target) = plan.need[u].clone() {
                        let mut out = vec![T::default(); volume(&target) as usize];
                        // what this rank already holds
                        if let (Some(d), Some(w)) = (&data, &win) {
                            if let Some(keep) = intersect(w, &target) {
                                copy_box(d, w, &mut out, &target, &keep);
                            }
                        }
                        let mut at = 0;
                        for r in 0..n {
                            for t in moves.iter().filter(|t| t.to == u && owner[t.from] == r) {
                                let len = volume(&t.window) as usize;
                                copy_box(&recv[at..at + len], &t.window, &mut out, &target, &t.window);
                                at += len;
                            }
                        }
                        data = Some(out);
                    } else {
                        data = None;
                    }
                    win = plan.need[u].clone();
                }
            }
            Op::ZeroFill => {
                // Terms other than 0 of the target: zeros, whatever the device held before.
                if let Some(u) = me {
                    if plan.need[u].is_none() {
                        data = plan.new[u].as_ref().map(|w| vec![T::default(); volume(w) as usize]);
                    }
                    win = plan.new[u].clone();
                }
            }
        }
    }
    Ok((data, win))
}
