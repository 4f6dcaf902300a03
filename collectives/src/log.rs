//! The collective log: what a rank issued inside a recorded region — every collective, send,
//! receive and split, with its op, reduce op, dtype, group (mesh axes and members, as world ranks),
//! the bytes this rank sent and received, and the plan step it came from. Every backend records
//! into the [`Recorder`] its communicators share; `place` names the step it runs.
//!
//! Bytes follow the plans' accounting (`nx plan` prints the same figures): an all-gather sends a
//! rank's block to every other member and receives theirs; a reduce-scatter sends every block but
//! its own and receives its own block from every other member; an all-reduce is a reduce-scatter
//! of the buffer cut the placements' way (the first `len mod n` chunks one longer) and an
//! all-gather of the chunks; an all-to-all counts what goes to and comes from the other members; a
//! broadcast is pipelined from the root along the ring (each member forwards once); a barrier
//! and a split move no data.
//!
//! # Examples
//!
//! ```
//! use nx_collectives::log::{Op, Recorder};
//! use nx_collectives::sim::{self, SimOptions};
//! use nx_collectives::{Communicator, ReduceOp};
//!
//! let logs = sim::run(2, SimOptions::default(), |c| {
//!     let rec = c.recorder().expect("the simulated backend records").clone();
//!     let mark = rec.start();
//!     let mut out = [0f32; 8];
//!     c.all_reduce(&[1f32; 8], &mut out, ReduceOp::Sum)?;
//!     Ok::<_, nx_collectives::Error>(rec.stop(mark, c.world_rank()))
//! })
//! .unwrap();
//! assert_eq!(logs[0].count(Op::AllReduce, &[]), 1);
//! assert_eq!(logs[0].bytes_sent(), 32); // 4 of the 8 floats out, then the other 4 reduced
//! ```

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use nx_kernels::Dtype;

use crate::ReduceOp;

/// What a logged call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A barrier.
    Barrier,
    /// A broadcast.
    Broadcast,
    /// An all-reduce.
    AllReduce,
    /// A reduce-scatter.
    ReduceScatter,
    /// An all-gather.
    AllGather,
    /// An all-to-all.
    AllToAll,
    /// A send.
    Send,
    /// A receive.
    Recv,
    /// A split into sub-communicators.
    Split,
}

impl Op {
    /// The op's name (`all_reduce`, …).
    pub fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::AllToAll => "all_to_all",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Split => "split",
        }
    }
}

/// One logged call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What it was.
    pub op: Op,
    /// The reduce op of an all-reduce or reduce-scatter.
    pub reduce: Option<ReduceOp>,
    /// The element dtype (`None` for a barrier or a split).
    pub dtype: Option<Dtype>,
    /// The mesh axes the group spans (empty: the world, or a group named by no axes).
    pub axes: Vec<String>,
    /// The group's members, as world ranks, in communicator order (a send's or receive's: this
    /// rank and its peer).
    pub members: Vec<usize>,
    /// Bytes this rank sent.
    pub bytes_sent: u64,
    /// Bytes this rank received.
    pub bytes_received: u64,
    /// The plan step it came from, where `place` ran it.
    pub step: Option<String>,
}

/// A rank's log of a recorded region.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    /// The rank (world rank).
    pub rank: usize,
    /// The calls, in the order issued.
    pub events: Vec<Event>,
}

impl Log {
    /// How many calls of `op` over a group spanning exactly the mesh axes `axes` (in order; `&[]`:
    /// groups named by no axes, as the world).
    pub fn count(&self, op: Op, axes: &[&str]) -> usize {
        self.events.iter().filter(|e| e.op == op && e.axes.iter().map(String::as_str).eq(axes.iter().copied())).count()
    }

    /// How many calls of `op`, over any group.
    pub fn count_any(&self, op: Op) -> usize {
        self.events.iter().filter(|e| e.op == op).count()
    }

    /// The calls that move data or meet the group: every event but splits.
    pub fn collectives(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(|e| e.op != Op::Split)
    }

    /// Bytes this rank sent in the region.
    pub fn bytes_sent(&self) -> u64 {
        self.events.iter().map(|e| e.bytes_sent).sum()
    }

    /// Bytes this rank received in the region.
    pub fn bytes_received(&self) -> u64 {
        self.events.iter().map(|e| e.bytes_received).sum()
    }
}

impl Log {
    /// Whether the calls this log shows for running `plan` on device `u` (of the plan's device
    /// list) are the plan's steps it takes part in, one collective each: the same op (a send/recv
    /// step is one all-to-all over the world), the same mesh axes, and the bytes the plan says
    /// device `u` sends and receives in it.
    ///
    /// # Errors
    /// The first difference, in words, with the log as a table.
    pub fn check_plan(&self, plan: &nx_placement::Plan, u: usize) -> Result<(), String> {
        use nx_placement::Op as P;
        let steps: Vec<&nx_placement::Step> = plan
            .steps
            .iter()
            .filter(|s| match s.op {
                P::SendRecv => true,
                P::LocalSlice | P::ZeroFill => false,
                _ => s.groups.iter().any(|g| g.contains(&u)),
            })
            .collect();
        let calls: Vec<&Event> = self.events.iter().filter(|e| e.op != Op::Split).collect();
        if calls.len() != steps.len() {
            return Err(format!(
                "{} calls logged for {} steps of the plan on device {u}\n{self}",
                calls.len(),
                steps.len()
            ));
        }
        for (k, (e, s)) in calls.iter().zip(steps).enumerate() {
            let op = match s.op {
                P::AllGather => Op::AllGather,
                P::AllToAll | P::SendRecv => Op::AllToAll,
                P::AllReduce => Op::AllReduce,
                P::ReduceScatter => Op::ReduceScatter,
                P::Broadcast => Op::Broadcast,
                P::LocalSlice | P::ZeroFill => unreachable!("filtered above"),
            };
            let (sent, received) = (s.bytes_sent[u], s.bytes_received[u]);
            if e.op != op || e.axes != s.mesh_axes || (e.bytes_sent, e.bytes_received) != (sent, received) {
                return Err(format!(
                    "call {k} on device {u}: logged {} over {:?} sending {} B and receiving {} B; planned {} over {:?} sending {sent} B and receiving {received} B\n{self}",
                    e.op.name(),
                    e.axes,
                    e.bytes_sent,
                    e.bytes_received,
                    s.op.name(),
                    s.mesh_axes
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Log {
    /// A table, one call a line: number, op, dtype, group, bytes sent and received, plan step.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rank {}: {} calls, {} B sent, {} B received",
            self.rank,
            self.events.len(),
            self.bytes_sent(),
            self.bytes_received()
        )?;
        writeln!(
            f,
            "  {:>3}  {:<18} {:<5} {:<14} {:<16} {:>12} {:>12}  step",
            "#", "op", "dtype", "axes", "members", "sent", "received"
        )?;
        for (i, e) in self.events.iter().enumerate() {
            let op = match e.reduce {
                Some(r) => format!("{}({})", e.op.name(), r.name()),
                None => e.op.name().to_string(),
            };
            let dtype = e.dtype.map_or("-".to_string(), |d| d.to_string());
            let axes = if e.axes.is_empty() { "-".to_string() } else { e.axes.join(".") };
            let members: Vec<String> = e.members.iter().map(|m| m.to_string()).collect();
            writeln!(
                f,
                "  {i:>3}  {op:<18} {dtype:<5} {axes:<14} {:<16} {:>12} {:>12}  {}",
                members.join(","),
                e.bytes_sent,
                e.bytes_received,
                e.step.as_deref().unwrap_or("-")
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Rec {
    depth: usize,
    events: Vec<Event>,
    step: Option<String>,
}

/// Where a rank's communicators record its calls: shared by a communicator and every
/// sub-communicator split from it (cloning shares it). Records only between [`Recorder::start`]
/// and [`Recorder::stop`] (regions nest); outside them a call costs one check.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    inner: Rc<RefCell<Rec>>,
}

impl Recorder {
    /// A recorder that records nothing until started.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Starts a region; answers its mark, for [`Recorder::stop`].
    pub fn start(&self) -> usize {
        let mut r = self.inner.borrow_mut();
        r.depth += 1;
        r.events.len()
    }

    /// Ends the region started at `mark`; answers its calls as the log of world rank `rank`.
    pub fn stop(&self, mark: usize, rank: usize) -> Log {
        let mut r = self.inner.borrow_mut();
        r.depth = r.depth.saturating_sub(1);
        let at = mark.min(r.events.len());
        let events = if r.depth == 0 {
            let out = r.events.split_off(at);
            r.events.clear();
            out
        } else {
            r.events[at..].to_vec()
        };
        Log { rank, events }
    }

    /// Whether a region is open.
    pub fn is_on(&self) -> bool {
        self.inner.borrow().depth > 0
    }

    /// Names the plan step the calls from now on come from (`None`: none); answers the previous.
    pub fn set_step(&self, step: Option<String>) -> Option<String> {
        std::mem::replace(&mut self.inner.borrow_mut().step, step)
    }

    /// Runs `f`, recording the calls it issues as splits: the communicator management a
    /// sub-communicator takes (a cached group's agreement), which plans do not count.
    pub(crate) fn as_split<R>(&self, f: impl FnOnce() -> R) -> R {
        let from = self.inner.borrow().events.len();
        let r = f();
        for e in &mut self.inner.borrow_mut().events[from..] {
            e.op = Op::Split;
        }
        r
    }

    /// Records the event `e` makes, where a region is open (the step filled in).
    pub(crate) fn note(&self, e: impl FnOnce() -> Event) {
        let mut r = self.inner.borrow_mut();
        if r.depth > 0 {
            let mut ev = e();
            ev.step = r.step.clone();
            r.events.push(ev);
        }
    }
}

/// A call's traffic for this rank, by the plans' accounting (see the [module documentation](self)):
/// `(bytes sent, bytes received)` of `elem`-byte elements.
pub(crate) mod traffic {
    fn b(elems: usize, elem: usize) -> u64 {
        (elems as u64).saturating_mul(elem as u64)
    }

    /// An all-reduce of `len` elements on rank `me` of `n`.
    pub(crate) fn all_reduce(len: usize, me: usize, n: usize, elem: usize) -> (u64, u64) {
        let c = len / n + usize::from(me < len % n);
        let moved = b(len - c + (n - 1) * c, elem);
        (moved, moved)
    }

    /// A reduce-scatter by `counts` on rank `me`.
    pub(crate) fn reduce_scatter(counts: &[usize], me: usize, elem: usize) -> (u64, u64) {
        let total: usize = counts.iter().sum();
        (b(total - counts[me], elem), b((counts.len() - 1) * counts[me], elem))
    }

    /// An all-gather by `counts` on rank `me`.
    pub(crate) fn all_gather(counts: &[usize], me: usize, elem: usize) -> (u64, u64) {
        let total: usize = counts.iter().sum();
        (b(counts[me] * (counts.len() - 1), elem), b(total - counts[me], elem))
    }

    /// An all-to-all by `send` and `recv` counts on rank `me`.
    pub(crate) fn all_to_all(send: &[usize], recv: &[usize], me: usize, elem: usize) -> (u64, u64) {
        let others = |c: &[usize]| c.iter().enumerate().filter(|&(j, _)| j != me).map(|(_, &x)| x).sum::<usize>();
        (b(others(send), elem), b(others(recv), elem))
    }

    /// A broadcast of `len` elements from `root` on rank `me` of `n`, pipelined along the ring.
    pub(crate) fn broadcast(len: usize, root: usize, me: usize, n: usize, elem: usize) -> (u64, u64) {
        let p = (me + n - root) % n;
        let s = b(len, elem);
        (if p + 1 < n { s } else { 0 }, if p > 0 { s } else { 0 })
    }
}
