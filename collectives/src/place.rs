//! Executing a plan: each rank runs the steps of a [`Plan`] on its window, with the collective
//! each step names, over sub-communicators of the step's groups.
//!
//! A window's data is its elements in C order of the window's box. Memory: a step holds its input
//! window, its output window and its message buffers, no more, each taken from an [`Alloc`]:
//! fresh vectors ([`Heap`]) or a device's caching pool ([`Rig`]).

use std::ops::{Deref, DerefMut};

use nx_kernels::rig::Rig;
use nx_kernels::{Element, Lease};
use nx_placement::region::{intersect, volume, Window};
use nx_placement::{Op, Plan};

use crate::log::{traffic, Op as Call, Recorder};
use crate::{Communicator, Error, Groups, ReduceOp, Reducible, Result};

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

/// The group of `groups` that holds device `me`.
fn color(groups: &[Vec<usize>], me: Option<usize>) -> Option<usize> {
    let me = me?;
    groups.iter().position(|members| members.contains(&me))
}

fn vol(w: &Option<Window>) -> usize {
    w.as_ref().map_or(0, |w| volume(w) as usize)
}

/// Where box `b` (inside box `w`, not empty) lies in the C order of `w`'s elements when it is one
/// run there: its first element's offset; `None` where it is not one run.
fn run_in(w: &Window, b: &Window) -> Option<usize> {
    // the last axis where `b` is narrower than `w`: every axis after it is whole, every one
    // before it holds one index
    let Some(k) = (0..w.len()).rev().find(|&d| b[d] != w[d]) else { return Some(0) };
    if b[..k].iter().any(|r| r.len() != 1) {
        return None;
    }
    let mut stride = 1usize;
    let mut at = 0usize;
    for d in (0..w.len()).rev() {
        at += (b[d].start - w[d].start) * stride;
        stride *= w[d].len();
    }
    Some(at)
}

/// Whether the boxes `bs` (inside box `w`) tile `w`'s elements in C order, each one run, back to
/// back in their order: then the buffer of `w` is the pieces' buffers end to end.
fn in_order<'w>(w: &Window, bs: impl IntoIterator<Item = Option<&'w Window>>) -> bool {
    let mut at = 0usize;
    for b in bs.into_iter().flatten() {
        let n = volume(b) as usize;
        if n == 0 {
            continue;
        }
        if run_in(w, b) != Some(at) {
            return false;
        }
        at += n;
    }
    at == volume(w) as usize
}

/// Where the plan executor takes its outputs and message buffers: the system's heap
/// ([`Heap`], `Vec`s) or a device's caching pool ([`Rig`], [`Lease`]s: no fresh allocation per
/// step once the pool is warm).
pub trait Alloc<T> {
    /// A run of elements the executor owns.
    type Buf: DerefMut<Target = [T]>;

    /// `len` elements whose values are unspecified, for code that writes them all.
    ///
    /// # Errors
    /// Where the memory cannot be had (a device's limit, the system).
    fn uninit(&self, len: usize) -> Result<Self::Buf>;

    /// `len` zero elements.
    ///
    /// # Errors
    /// As [`Alloc::uninit`].
    fn zeroed(&self, len: usize) -> Result<Self::Buf>;

    /// Whether it lends a dry rig's memory ([`Rig::is_dry`]): the executor then takes every
    /// buffer a step takes, and records every call it makes, but copies no element and moves no
    /// byte. The default: no.
    fn dry(&self) -> bool {
        false
    }
}

/// Vectors from the system allocator, fresh each time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heap;

impl<T: Copy + Default> Alloc<T> for Heap {
    type Buf = Vec<T>;

    fn uninit(&self, len: usize) -> Result<Vec<T>> {
        self.zeroed(len)
    }

    fn zeroed(&self, len: usize) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| Error::Invalid {
            func: "nx_collectives::place",
            why: format!("the system refused {len} elements of {} bytes", size_of::<T>()),
        })?;
        v.resize(len, T::default());
        Ok(v)
    }
}

impl<T: Element> Alloc<T> for Rig {
    type Buf = Lease<T>;

    fn uninit(&self, len: usize) -> Result<Lease<T>> {
        Ok(Lease::uninit(self, len)?)
    }

    fn zeroed(&self, len: usize) -> Result<Lease<T>> {
        Ok(Lease::zeroed(self, len)?)
    }

    fn dry(&self) -> bool {
        self.is_dry()
    }
}

/// What a rank holds between steps: the caller's elements, or a buffer of the executor's.
enum Cur<'a, T, B> {
    In(&'a [T]),
    Own(B),
}

impl<T, B: DerefMut<Target = [T]>> Deref for Cur<'_, T, B> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Cur::In(s) => s,
            Cur::Own(b) => b,
        }
    }
}

/// `data` (of box `w`) restricted to box `b`, in C order, in a buffer of `alloc`'s.
fn pack<T: Copy, A: Alloc<T>>(alloc: &A, data: &[T], w: &Window, b: &Window) -> Result<A::Buf> {
    let mut out = alloc.uninit(volume(b) as usize)?;
    if !alloc.dry() {
        copy_box(data, w, &mut out, b, b);
    }
    Ok(out)
}

/// A buffer for a window of `len` elements assembled from pieces of `covered` elements in all:
/// unspecified where the pieces (disjoint, inside the window) cover it, else zeros.
fn assembled<T, A: Alloc<T>>(alloc: &A, len: usize, covered: usize) -> Result<A::Buf> {
    if covered == len {
        alloc.uninit(len)
    } else {
        alloc.zeroed(len)
    }
}

/// An owned copy of `s` from `alloc`.
pub(crate) fn owned<T: Copy, A: Alloc<T>>(alloc: &A, s: &[T]) -> Result<A::Buf> {
    let mut b = alloc.uninit(s.len())?;
    if !alloc.dry() {
        // SAFETY: `b` is a buffer of `s.len()` elements apart from `s`.
        unsafe { nx_kernels::host::copy(s, b.as_mut_ptr()) };
    }
    Ok(b)
}

/// Runs `plan` on this rank: `local` is this rank's window of the value at the plan's `from`
/// (its elements in C order; `None` where it holds nothing), and the answer its window at `to`.
/// Every rank of `comm` calls it with the same plan; rank r drives the plan's device whose owning
/// rank is r. Outputs and message buffers are fresh vectors ([`Heap`]); see [`place_in`] for a
/// device's pool.
///
/// # Errors
/// [`Error::Invalid`] where `local` does not match this rank's window at `from`; any error of the
/// collectives (a peer that failed, a timeout, a mismatch).
pub fn place<T: Reducible, C: Communicator>(comm: &C, plan: &Plan, local: Option<Vec<T>>) -> Result<Option<Vec<T>>> {
    place_in(comm, &Groups::new(), plan, local.as_deref(), &Heap)
}

/// [`place`] reading this rank's window where it lies, taking every output and message buffer
/// from `alloc` (a [`Rig`]'s pool: warm, a step takes no element buffer from the system) and the
/// sub-communicators of the steps' groups from `groups` (split once per groups; the same cache
/// for every call on `comm`). Answers this rank's window at `to` (`None` where it holds nothing
/// there).
///
/// ```
/// use nx_collectives::{place_in, sim, Communicator, Groups};
/// use nx_kernels::rig::Rig;
/// use nx_placement::{plan, Device, Devices, Placement};
///
/// // split over 2 devices → whole on every device (an all-gather), outputs from each rig's pool
/// let got = sim::run(2, Default::default(), |c| -> nx_collectives::Result<Vec<f32>> {
///     let rig = Rig::host(Device::sim(c.rank()))?;
///     let pl = Devices::with(Device::sims(2), |set| plan(&Placement::split(0, &set)?, &Placement::on(&set), &[5], 4))
///         .map_err(nx_placement::Error::from)??;
///     let mine: Vec<f32> = if c.rank() == 0 { vec![0.0, 1.0, 2.0] } else { vec![3.0, 4.0] };
///     let out = place_in(&c, &Groups::new(), &pl, Some(&mine), &rig)?.expect("every device holds the value");
///     Ok(out.to_vec())
/// })?;
/// assert_eq!(got, vec![vec![0.0, 1.0, 2.0, 3.0, 4.0]; 2]);
/// # Ok::<(), nx_collectives::Error>(())
/// ```
///
/// # Errors
/// As [`place`]; where `alloc` cannot give the memory a step needs.
pub fn place_in<T: Reducible, C: Communicator, A: Alloc<T>>(
    comm: &C,
    groups: &Groups<C>,
    plan: &Plan,
    local: Option<&[T]>,
    alloc: &A,
) -> Result<Option<A::Buf>> {
    let me = plan.devices.iter().position(|d| d.rank == comm.world_rank());
    let owner: Vec<usize> = plan.devices.iter().map(|d| d.rank).collect();
    let old = me.and_then(|u| plan.old[u].clone());
    if local.map(<[T]>::len) != old.as_ref().map(|w| volume(w) as usize) {
        return Err(Error::Invalid {
            func: "nx_collectives::place",
            why: format!(
                "rank {} holds {:?} elements, its window at {} is {:?}",
                comm.world_rank(),
                local.map(<[T]>::len),
                plan.from,
                old
            ),
        });
    }
    let recorder = comm.recorder().cloned();
    let outer = recorder.as_ref().and_then(|r| r.set_step(None));
    let out = run_steps((comm, groups), plan, me, &owner, (local.map(Cur::In), old), recorder.as_ref(), alloc);
    if let Some(r) = &recorder {
        r.set_step(outer);
    }
    let (data, _) = out?;
    // Devices that hold nothing at `to` (a `device` placement elsewhere) drop what they held.
    if me.and_then(|u| plan.new[u].as_ref()).is_none() {
        return Ok(None);
    }
    Ok(Some(match data {
        Some(Cur::Own(b)) => b,
        Some(Cur::In(s)) => owned(alloc, s)?,
        None => alloc.uninit(0)?,
    }))
}

/// The state of a rank between steps: what it holds, and the window it holds.
type State<'a, T, B> = (Option<Cur<'a, T, B>>, Option<Window>);

/// The steps of `plan` on this rank (device `me`, holding `data` over the window `win`), each
/// named in `recorder` as it runs; answers what the rank holds after the last.
fn run_steps<'a, T: Reducible, C: Communicator, A: Alloc<T>>(
    (comm, groups): (&C, &Groups<C>),
    plan: &Plan,
    me: Option<usize>,
    owner: &[usize],
    (mut data, mut win): State<'a, T, A::Buf>,
    recorder: Option<&Recorder>,
    alloc: &A,
) -> Result<State<'a, T, A::Buf>> {
    // a dry run takes every buffer and records every call, and copies and moves nothing
    let dry = alloc.dry();
    let sz = size_of::<T>();
    for (k, step) in plan.steps.iter().enumerate() {
        if let Some(r) = recorder {
            let over =
                if step.mesh_axes.is_empty() { String::new() } else { format!(" over {}", step.mesh_axes.join(".")) };
            r.set_step(Some(format!("{k}: {}{over}", step.op.name())));
        }
        let c = color(&step.groups, me);
        // only the steps that meet in groups split (every rank takes the same steps)
        let grouped = !matches!(step.op, Op::SendRecv | Op::LocalSlice | Op::ZeroFill);
        let sub = match grouped {
            true => {
                let world: Vec<Vec<usize>> =
                    step.groups.iter().map(|g| g.iter().map(|&u| owner[u]).collect()).collect();
                Some(groups.get(comm, &world, &step.mesh_axes)?)
            }
            false => None,
        };
        let group: Option<&C> = sub.as_deref().and_then(Option::as_ref);
        match step.op {
            Op::AllReduce => {
                if let (Some(g), Some(d)) = (&group, data.as_deref()) {
                    let mut out = alloc.uninit(d.len())?;
                    if dry {
                        let moved = traffic::all_reduce(d.len(), g.rank(), g.size(), sz);
                        g.note_skipped(Call::AllReduce, Some(ReduceOp::Sum), T::DTYPE, moved);
                    } else {
                        g.all_reduce(d, &mut out, ReduceOp::Sum)?;
                    }
                    data = Some(Cur::Own(out));
                }
            }
            Op::ReduceScatter => {
                if let (Some(g), Some(d), Some(w), Some(c)) = (&group, data.as_deref(), &win, c) {
                    let members = &step.groups[c];
                    let targets: Vec<Window> = members
                        .iter()
                        .map(|&m| plan.new[m].clone().expect("a reduce-scatter's targets hold a window"))
                        .collect();
                    let counts: Vec<usize> = targets.iter().map(|b| volume(b) as usize).collect();
                    let mine = plan.new[me.expect("a member")].clone();
                    let mut out = alloc.uninit(vol(&mine))?;
                    // where the targets are this window's runs in order, it is the message
                    let packed = if in_order(w, targets.iter().map(Some)) {
                        None
                    } else {
                        let mut send = alloc.uninit(counts.iter().sum())?;
                        let mut at = 0;
                        for (b, &n) in targets.iter().zip(&counts) {
                            if !dry {
                                copy_box(d, w, &mut send[at..at + n], b, b);
                            }
                            at += n;
                        }
                        Some(send)
                    };
                    if dry {
                        let moved = traffic::reduce_scatter(&counts, g.rank(), sz);
                        g.note_skipped(Call::ReduceScatter, Some(ReduceOp::Sum), T::DTYPE, moved);
                    } else {
                        g.reduce_scatter_v(packed.as_deref().unwrap_or(d), &mut out, &counts, ReduceOp::Sum)?;
                    }
                    data = Some(Cur::Own(out));
                    win = mine;
                }
            }
            Op::LocalSlice => {
                if let Some(u) = me {
                    let target = plan.need[u].clone();
                    data = match (data.as_deref(), &win, &target) {
                        (Some(d), Some(w), Some(t)) => Some(Cur::Own(pack(alloc, d, w, t)?)),
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
                    let len = volume(&target) as usize;
                    let out = if step.op == Op::AllGather {
                        let counts: Vec<usize> = members.iter().map(|&m| vol(&plan.old[m])).collect();
                        // where the members' windows are the target's runs in order, gather in
                        // place (one call site either way: checked mode compares them)
                        let direct = in_order(&target, members.iter().map(|&m| plan.old[m].as_ref()));
                        let mut out = assembled(alloc, len, if direct { len } else { counts.iter().sum() })?;
                        let mut all = if direct { None } else { Some(alloc.uninit(counts.iter().sum())?) };
                        if dry {
                            let moved = traffic::all_gather(&counts, g.rank(), sz);
                            g.note_skipped(Call::AllGather, None, T::DTYPE, moved);
                        } else {
                            g.all_gather_v(d, all.as_deref_mut().unwrap_or(&mut out), &counts)?;
                        }
                        let Some(all) = all.filter(|_| !dry) else {
                            data = Some(Cur::Own(out));
                            win = Some(target);
                            continue;
                        };
                        let mut at = 0;
                        for (j, &m) in members.iter().enumerate() {
                            if let Some(ow) = &plan.old[m] {
                                copy_box(&all[at..at + counts[j]], ow, &mut out, &target, ow);
                            }
                            at += counts[j];
                        }
                        out
                    } else {
                        // what each member sends this one, and what this one sends each
                        let pieces: Vec<Option<Window>> = members
                            .iter()
                            .map(|&m| match (&plan.old[m], &plan.need[u]) {
                                (Some(o), Some(n)) => intersect(n, o),
                                _ => None,
                            })
                            .collect();
                        let sends: Vec<Option<Window>> = members
                            .iter()
                            .map(|&m| match (&w, &plan.need[m]) {
                                (Some(o), Some(n)) => intersect(o, n),
                                _ => None,
                            })
                            .collect();
                        let send_counts: Vec<usize> = sends.iter().map(vol).collect();
                        let recv_counts: Vec<usize> = pieces.iter().map(vol).collect();
                        // the window is the message where the pieces sent are its runs in order
                        let packed = match &w {
                            Some(ow) if !in_order(ow, sends.iter().map(Option::as_ref)) => {
                                let mut send = alloc.uninit(send_counts.iter().sum())?;
                                let mut at = 0;
                                for (b, &n) in sends.iter().zip(&send_counts) {
                                    if let Some(b) = b.as_ref().filter(|_| !dry) {
                                        copy_box(d, ow, &mut send[at..at + n], b, b);
                                    }
                                    at += n;
                                }
                                Some(send)
                            }
                            _ => None,
                        };
                        let send: &[T] = packed.as_deref().unwrap_or(d);
                        // where the pieces received are the target's runs in order, receive in place
                        let direct = in_order(&target, pieces.iter().map(Option::as_ref));
                        let received = recv_counts.iter().sum();
                        let mut out = assembled(alloc, len, if direct { len } else { received })?;
                        let mut recv = if direct { None } else { Some(alloc.uninit(received)?) };
                        if dry {
                            let moved = traffic::all_to_all(&send_counts, &recv_counts, g.rank(), sz);
                            g.note_skipped(Call::AllToAll, None, T::DTYPE, moved);
                        } else {
                            g.all_to_all_v(send, &send_counts, recv.as_deref_mut().unwrap_or(&mut out), &recv_counts)?;
                        }
                        drop(packed);
                        let Some(recv) = recv.filter(|_| !dry) else {
                            data = Some(Cur::Own(out));
                            win = Some(target);
                            continue;
                        };
                        let mut at = 0;
                        for (j, p) in pieces.iter().enumerate() {
                            if let Some(p) = p {
                                copy_box(&recv[at..at + recv_counts[j]], p, &mut out, &target, p);
                            }
                            at += recv_counts[j];
                        }
                        out
                    };
                    data = Some(Cur::Own(out));
                    win = Some(target);
                }
            }
            Op::Broadcast => {
                if let (Some(g), Some(u)) = (&group, me) {
                    let root = step.groups[0][0];
                    let whole = plan.old[root].clone().expect("the root holds the value");
                    let mut buf = if u == root {
                        match data.take() {
                            Some(Cur::Own(b)) => b,
                            Some(Cur::In(s)) => owned(alloc, s)?,
                            None => alloc.uninit(0)?,
                        }
                    } else {
                        alloc.uninit(volume(&whole) as usize)?
                    };
                    if dry {
                        let moved = traffic::broadcast(buf.len(), 0, g.rank(), g.size(), sz);
                        g.note_skipped(Call::Broadcast, None, T::DTYPE, moved);
                    } else {
                        g.broadcast(&mut buf, 0)?;
                    }
                    // every member keeps what it needs of the whole: the root may need less
                    let target = plan.need[u].clone();
                    data = match &target {
                        Some(t) if *t == whole => Some(Cur::Own(buf)),
                        Some(t) => Some(Cur::Own(pack(alloc, &buf, &whole, t)?)),
                        None => None,
                    };
                    win = target;
                }
            }
            Op::SendRecv => {
                // One all-to-all-v over the whole communicator; counts are zero outside the
                // plan's transfers, which every rank computes alike.
                let n = comm.size();
                let moves = &plan.transfers[k];
                let mut send_counts = vec![0usize; n];
                let mut recv_counts = vec![0usize; n];
                for t in moves {
                    if Some(t.from) == me {
                        send_counts[owner[t.to]] += volume(&t.window) as usize;
                    }
                    if Some(t.to) == me {
                        recv_counts[owner[t.from]] += volume(&t.window) as usize;
                    }
                }
                let mut send = alloc.uninit(send_counts.iter().sum())?;
                let mut at = 0;
                for r in 0..n {
                    for t in moves.iter().filter(|t| Some(t.from) == me && owner[t.to] == r) {
                        let (d, w) = (data.as_deref().expect("a sender holds data"), win.as_ref().expect("a window"));
                        let len = volume(&t.window) as usize;
                        if !dry {
                            copy_box(d, w, &mut send[at..at + len], &t.window, &t.window);
                        }
                        at += len;
                    }
                }
                let mut recv = alloc.uninit(recv_counts.iter().sum())?;
                if dry {
                    let moved = traffic::all_to_all(&send_counts, &recv_counts, comm.rank(), sz);
                    comm.note_skipped(Call::AllToAll, None, T::DTYPE, moved);
                } else {
                    comm.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
                }
                drop(send);
                if let Some(u) = me {
                    if let Some(target) = plan.need[u].clone() {
                        // what this rank already holds
                        let keep = match &win {
                            Some(w) if data.is_some() => intersect(w, &target),
                            _ => None,
                        };
                        let covered = vol(&keep) + recv_counts.iter().sum::<usize>();
                        let mut out = assembled(alloc, volume(&target) as usize, covered)?;
                        if let (Some(d), Some(w), Some(keep), false) = (data.as_deref(), &win, &keep, dry) {
                            copy_box(d, w, &mut out, &target, keep);
                        }
                        let mut at = 0;
                        for r in 0..n {
                            for t in moves.iter().filter(|t| t.to == u && owner[t.from] == r) {
                                let len = volume(&t.window) as usize;
                                if !dry {
                                    copy_box(&recv[at..at + len], &t.window, &mut out, &target, &t.window);
                                }
                                at += len;
                            }
                        }
                        data = Some(Cur::Own(out));
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
                        data = match &plan.new[u] {
                            Some(w) => Some(Cur::Own(alloc.zeroed(volume(w) as usize)?)),
                            None => None,
                        };
                    }
                    win = plan.new[u].clone();
                }
            }
        }
    }
    Ok((data, win))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(r: &[(usize, usize)]) -> Window {
        r.iter().map(|&(a, b)| a..b).collect()
    }

    #[test]
    fn runs_are_found_where_they_are_and_only_there() {
        let t = w(&[(2, 5), (0, 4)]); // 3 rows of 4 from row 2
        assert_eq!(run_in(&t, &t), Some(0));
        assert_eq!(run_in(&t, &w(&[(3, 5), (0, 4)])), Some(4), "rows 3..5: from the second row");
        assert_eq!(run_in(&t, &w(&[(4, 5), (1, 3)])), Some(9), "part of the last row");
        assert_eq!(run_in(&t, &w(&[(2, 4), (0, 2)])), None, "two rows' halves are two runs");
        let rank0: Window = Vec::new();
        assert_eq!(run_in(&rank0, &rank0), Some(0));
        // columns split: never in order; rows split in order: yes; out of order: no
        assert!(!in_order(&t, [Some(&w(&[(2, 5), (0, 2)])), Some(&w(&[(2, 5), (2, 4)]))]));
        let (a, b) = (w(&[(2, 3), (0, 4)]), w(&[(3, 5), (0, 4)]));
        assert!(in_order(&t, [Some(&a), None, Some(&b)]), "a member holding nothing is skipped");
        assert!(!in_order(&t, [Some(&b), Some(&a)]));
        assert!(!in_order(&t, [Some(&a)]), "the pieces must cover the window");
        // empty pieces take no room wherever they claim to lie
        assert!(in_order(&t, [Some(&w(&[(4, 4), (0, 4)])), Some(&t)]));
    }
}
