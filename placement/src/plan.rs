//! Plans: a change of placement as steps, each a collective over mesh-axis groups, with the exact
//! bytes every device sends and receives. Pure: nothing moves here.
//!
//! # How a plan is made
//!
//! 1. A partial value is closed first: by one **reduce-scatter** over its sums when the target's
//!    windows tile each group's window, otherwise by an **all-reduce** (reduce-scatter then
//!    all-gather, 2·W·(n−1)/n per device).
//! 2. The closed value then moves to the target's windows in **one** step, the first that fits:
//!    - nothing to receive: a **local slice** (0 bytes), or no step at all;
//!    - from `device(k)` to devices that need the whole value: a **broadcast** (pipelined: every
//!      device but the last forwards it once);
//!    - over the groups of the mesh axes whose role changed (all devices, when the two placements
//!      use different meshes): an **all-gather** where each group's old windows tile every
//!      member's new window, an **all-to-all** where each group's old and new windows both tile
//!      the same block;
//!    - otherwise **send/recv** of exactly the parts of each new window its device lacks, each part
//!      from the first device after it (in ring order) that holds it.
//! 3. A partial target: term 0 keeps the value, the other terms are filled with zeros (**zero
//!    fill**, 0 bytes; exact, no division).
//!
//! For every transition without a partial value, the bytes a device receives are the *floor*: the
//! bytes its new window needs and its old one lacks ([`Plan::floor`]). A step never gathers more
//! than that, which is why a transition that no single collective serves exactly is sent point to
//! point rather than gathered and sliced.

use std::fmt;

use nx_mesh::{Device, MeshSpec};

use crate::placement::{Cuts, Form};
use crate::region::{contains, intersect, subtract, volume, Window};
use crate::{Placement, PlacementSpec, Result};

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Each group's members exchange their windows (variable counts when uneven).
    AllGather,
    /// Each group closes its sum in term order and every member keeps the whole window.
    AllReduce,
    /// Each group closes its sum in term order and every member keeps its part.
    ReduceScatter,
    /// Each group's members exchange the parts of their windows the others' new windows need.
    AllToAll,
    /// One device's whole value to the others.
    Broadcast,
    /// Each device keeps part of what it holds: no byte moves.
    LocalSlice,
    /// Devices holding terms other than 0 of a partial target fill their window with zeros.
    ZeroFill,
    /// Point-to-point sends of exactly the missing parts of each window.
    SendRecv,
}

impl Op {
    /// The op's name as `--json` prints it (`all_gather`, …).
    pub fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all_gather",
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllToAll => "all_to_all",
            Op::Broadcast => "broadcast",
            Op::LocalSlice => "local_slice",
            Op::ZeroFill => "zero_fill",
            Op::SendRecv => "send_recv",
        }
    }
}

/// One step of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Step {
    /// What the step does.
    pub op: Op,
    /// The mesh axes its groups span (empty for send/recv, local slices and broadcasts between
    /// sets).
    pub mesh_axes: Vec<String>,
    /// The groups of devices that take part, as positions in [`Plan::devices`]; each group's
    /// members are listed in the order the collective numbers them (term order for sums).
    pub groups: Vec<Vec<usize>>,
    /// Bytes each device of [`Plan::devices`] sends in this step.
    pub bytes_sent: Vec<u64>,
    /// Bytes each device of [`Plan::devices`] receives in this step.
    pub bytes_received: Vec<u64>,
    /// The placement the value has after this step, as text.
    pub after: String,
}

/// The cost model a plan's predicted time uses: per step, a latency plus the busiest device's
/// larger of bytes sent and received over its link bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Bytes per second a device sends (and receives) at once.
    pub link_bytes_per_second: f64,
    /// Seconds each step costs whatever it moves.
    pub step_latency_seconds: f64,
}

impl Default for CostModel {
    /// 10 GB/s per device link, 10 µs per step: a conservative single-host figure.
    fn default() -> Self {
        CostModel { link_bytes_per_second: 10e9, step_latency_seconds: 10e-6 }
    }
}

/// A change of placement as steps. See the [module documentation](self) for how it is made.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The placement the value leaves.
    pub from: PlacementSpec,
    /// The mesh of `from`.
    pub from_mesh: MeshSpec,
    /// The placement the value reaches.
    pub to: PlacementSpec,
    /// The mesh of `to`.
    pub to_mesh: MeshSpec,
    /// The devices involved: `from`'s set, then those of `to`'s set not in it. Device numbers in
    /// steps are positions in this list.
    pub devices: Vec<Device>,
    /// The value's global shape.
    pub shape: Vec<usize>,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Each device's window at `from` (`None`: it holds nothing, or is not in `from`'s set).
    pub old: Vec<Option<Window>>,
    /// Each device's window once the value is closed and moved, before a zero fill: its window at
    /// `to`, or `None` where it holds a term other than 0 of a partial target.
    pub need: Vec<Option<Window>>,
    /// Each device's window at `to`.
    pub new: Vec<Option<Window>>,
    /// For each step that moves pieces of windows (all-gather, all-to-all, broadcast, send/recv),
    /// who receives which box from whom; empty for the others.
    pub transfers: Vec<Vec<Transfer>>,
    floor: Option<Vec<u64>>,
}

/// A box of the value that one device receives from another in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The receiving device (a position in [`Plan::devices`]).
    pub to: usize,
    /// The sending device.
    pub from: usize,
    /// The box, in global indices.
    pub window: Window,
}

impl Plan {
    /// Total bytes each device sends over all steps.
    pub fn bytes_sent(&self) -> Vec<u64> {
        self.sum(|s| &s.bytes_sent)
    }

    /// Total bytes each device receives over all steps.
    pub fn bytes_received(&self) -> Vec<u64> {
        self.sum(|s| &s.bytes_received)
    }

    fn sum(&self, f: impl Fn(&Step) -> &Vec<u64>) -> Vec<u64> {
        let mut out = vec![0; self.devices.len()];
        for s in &self.steps {
            for (o, b) in out.iter_mut().zip(f(s)) {
                *o += b;
            }
        }
        out
    }

    /// For a transition without a partial value, the bytes each device's new window needs and its
    /// old one lacks: what any plan must deliver, and what this plan's devices receive. `None`
    /// where either side is partial.
    pub fn floor(&self) -> Option<&[u64]> {
        self.floor.as_deref()
    }

    /// The bytes of the whole value (they fit: [`plan`] checks them; a plan built by hand past
    /// that answers `u64::MAX`).
    pub fn value_bytes(&self) -> u64 {
        self.shape.iter().try_fold(self.elem_bytes as u64, |a, &n| a.checked_mul(n as u64)).unwrap_or(u64::MAX)
    }

    /// Whether the plan leaves every device's elements as they are: no step moves a byte or fills
    /// zeros, and each device's window at the target is its window at the source — a sum of one
    /// term closing (a partial value over axes of extent 1), a partial value kept at an equal
    /// placement, or another spelling of the same windows. Such a plan's result is the value's own
    /// windows, relabelled, with no copy.
    pub fn keeps_windows(&self) -> bool {
        self.steps.iter().all(|s| {
            (s.op != Op::ZeroFill || s.groups.iter().all(|g| g.is_empty()))
                && s.bytes_sent.iter().chain(&s.bytes_received).all(|&b| b == 0)
        }) && self.old == self.new
    }

    /// The plan's predicted time under `model`, in seconds.
    pub fn predicted_seconds(&self, model: &CostModel) -> f64 {
        self.steps
            .iter()
            .filter(|s| !matches!(s.op, Op::LocalSlice | Op::ZeroFill))
            .map(|s| {
                let busiest = s.bytes_sent.iter().zip(&s.bytes_received).map(|(a, b)| *a.max(b)).max();
                model.step_latency_seconds + busiest.unwrap_or(0) as f64 / model.link_bytes_per_second
            })
            // from +0: an empty `sum` of floats is −0, printed "-0.000 ms"
            .fold(0.0, |a, b| a + b)
    }
}

/// `n` bytes in words: `512 B`, `3.0 KiB`, `64.0 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

fn per_device(bytes: &[u64]) -> String {
    let (lo, hi) = (bytes.iter().min().copied().unwrap_or(0), bytes.iter().max().copied().unwrap_or(0));
    if lo == hi {
        format!("{} each", human_bytes(lo))
    } else if bytes.len() <= 16 {
        let list: Vec<String> = bytes.iter().map(|&b| human_bytes(b)).collect();
        format!("[{}]", list.join(", "))
    } else {
        format!("{} to {}", human_bytes(lo), human_bytes(hi))
    }
}

fn groups_text(groups: &[Vec<usize>]) -> String {
    let shown: Vec<String> = groups
        .iter()
        .take(8)
        .map(|g| format!("{{{}}}", g.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")))
        .collect();
    let more = if groups.len() > 8 { format!(" and {} more", groups.len() - 8) } else { String::new() };
    format!("{}{more}", shown.join(" "))
}

impl fmt::Display for Plan {
    /// The plan in words: the value, both placements, each step with its groups and bytes, the
    /// totals against the floor, and the time [`CostModel::default`] predicts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan for a value of shape {:?}, {} bytes an element ({} in all)",
            self.shape,
            self.elem_bytes,
            human_bytes(self.value_bytes())
        )?;
        writeln!(f, "  from {} over mesh {}", self.from, self.from_mesh)?;
        writeln!(f, "  to   {} over mesh {}", self.to, self.to_mesh)?;
        if self.steps.is_empty() {
            writeln!(f, "  no step: every device already holds what it needs")?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            let axes = if s.mesh_axes.is_empty() { String::new() } else { format!(" over {}", s.mesh_axes.join(".")) };
            let what = match s.op {
                Op::AllGather => "all-gather",
                Op::AllReduce => "all-reduce (term order)",
                Op::ReduceScatter => "reduce-scatter (term order)",
                Op::AllToAll => "all-to-all",
                Op::Broadcast => "broadcast (pipelined)",
                Op::LocalSlice => "local slice, no byte moves",
                Op::ZeroFill => "zero fill of terms other than 0, no byte moves",
                Op::SendRecv => "send/recv of the missing windows",
            };
            writeln!(f, "  {}. {what}{axes}, groups {}", i + 1, groups_text(&s.groups))?;
            if !matches!(s.op, Op::LocalSlice | Op::ZeroFill) {
                writeln!(
                    f,
                    "     bytes sent: {}; received: {}",
                    per_device(&s.bytes_sent),
                    per_device(&s.bytes_received)
                )?;
            }
            writeln!(f, "     then the value is {}", s.after)?;
        }
        let recv = self.bytes_received();
        let sent = self.bytes_sent();
        writeln!(
            f,
            "  in all, the busiest device sends {} and receives {}; all devices together move {}",
            human_bytes(sent.iter().copied().max().unwrap_or(0)),
            human_bytes(recv.iter().copied().max().unwrap_or(0)),
            human_bytes(recv.iter().sum())
        )?;
        if let Some(floor) = &self.floor {
            let on = floor == &recv;
            writeln!(
                f,
                "  floor (bytes the new windows need and the old lack): {}{}",
                per_device(floor),
                if on { ", reached" } else { ", NOT reached" }
            )?;
        }
        let model = CostModel::default();
        write!(
            f,
            "  predicted time: {:.3} ms at {:.0} GB/s per device link and {:.0} µs per step",
            self.predicted_seconds(&model) * 1e3,
            model.link_bytes_per_second / 1e9,
            model.step_latency_seconds * 1e6
        )
    }
}

/// What every device of the plan holds at some point: a window or nothing.
type Windows = Vec<Option<Window>>;

fn vol(w: &Option<Window>) -> u64 {
    w.as_ref().map_or(0, |w| volume(w))
}

struct Ctx<'a, 'd, 'e> {
    from: &'a Placement<'d>,
    to: &'a Placement<'e>,
    same_set: bool,
    n: usize,
    to_pos: Vec<Option<usize>>,
    eb: u64,
}

/// Plans moving a value of `shape`, `elem_bytes` bytes an element, from `from` to `to` (which may
/// lie over another set). See the [module documentation](self).
///
/// # Errors
/// [`crate::Error::RankTooSmall`] when either placement cuts an axis past the shape's rank;
/// [`crate::Error::TooLarge`] for a value whose bytes, times four times the square of the devices,
/// pass `u64`.
pub fn plan<'d, 'e>(from: &Placement<'d>, to: &Placement<'e>, shape: &[usize], elem_bytes: usize) -> Result<Plan> {
    let mut devices: Vec<Device> = from.devices().as_slice().to_vec();
    for d in to.devices().as_slice() {
        if !devices.contains(d) {
            devices.push(*d);
        }
    }
    let n = devices.len();
    // every figure a plan counts — one device's bytes in a step, all devices' together over every
    // step — is at most the value's bytes times 4·n²: checked once here, so that the arithmetic
    // below cannot overflow
    let bytes = shape.iter().try_fold(elem_bytes as u64, |a, &x| a.checked_mul(x as u64));
    if bytes.and_then(|b| b.checked_mul(4 * (n as u64) * (n as u64))).is_none() {
        return Err(crate::Error::TooLarge {
            func: "nx_placement::plan",
            shape: shape.to_vec(),
            elem_bytes,
            devices: n,
        });
    }
    from.check_shape("nx_placement::plan", shape)?;
    to.check_shape("nx_placement::plan", shape)?;
    let to_pos: Vec<Option<usize>> = devices.iter().map(|d| to.devices().position(d)).collect();
    let same_set = from.devices().same_list(to.devices());
    let cx = Ctx { from, to, same_set, n, to_pos, eb: elem_bytes as u64 };

    let old: Windows =
        (0..n).map(|u| if u < from.devices().len() { from.window_unchecked(shape, u) } else { None }).collect();
    let new: Windows = (0..n).map(|u| cx.to_pos[u].and_then(|p| to.window_unchecked(shape, p))).collect();
    let floor = (!from.is_partial() && !to.is_partial())
        .then(|| (0..n).map(|u| missing(&old[u], &new[u]).iter().map(|w| volume(w)).sum::<u64>() * cx.eb).collect());

    // What each device needs: its window, unless it holds a term other than 0 of the target.
    let need: Windows = (0..n)
        .map(|u| match cx.to_pos[u].map(|p| to.term_unchecked(p)) {
            Some(Some(t)) if t > 0 => None,
            _ => new[u].clone(),
        })
        .collect();
    let mut steps = Vec::new();
    let mut transfers = Vec::new();
    let done = same_set && from.equal(to);
    if from.is_partial() && !done {
        if let Some(step) = cx.reduce_scatter(&old, &new) {
            steps.push(step);
        } else {
            steps.push(cx.all_reduce(&old));
        }
    }
    transfers.extend(steps.iter().map(|_| Vec::new()));
    if !done && steps.first().is_none_or(|s| s.op != Op::ReduceScatter) {
        if let Some((step, moves)) = cx.core(&old, &need) {
            steps.push(step);
            transfers.push(moves);
        }
        if to.is_partial() {
            let fill: Vec<usize> =
                (0..n).filter(|&u| cx.to_pos[u].is_some_and(|p| to.term_unchecked(p).is_some_and(|t| t > 0))).collect();
            let sums = to.sums().iter().map(|&m| to.mesh_of().axes()[m].0.clone()).collect();
            steps.push(Step {
                op: Op::ZeroFill,
                mesh_axes: sums,
                groups: vec![fill],
                bytes_sent: vec![0; n],
                bytes_received: vec![0; n],
                after: to.to_string(),
            });
            transfers.push(Vec::new());
        }
    }
    Ok(Plan {
        from: from.spec(),
        from_mesh: from.mesh_of().spec(),
        to: to.spec(),
        to_mesh: to.mesh_of().spec(),
        devices,
        shape: shape.to_vec(),
        elem_bytes,
        steps,
        old,
        need,
        new,
        transfers,
        floor,
    })
}

/// The parts of `new` that `old` lacks, as disjoint boxes.
fn missing(old: &Option<Window>, new: &Option<Window>) -> Vec<Window> {
    match (old, new) {
        (_, None) => Vec::new(),
        (None, Some(n)) => vec![n.clone()].into_iter().filter(|w| volume(w) > 0).collect(),
        (Some(o), Some(n)) => subtract(n, o),
    }
}

fn pairwise_disjoint(ws: &[&Window]) -> bool {
    ws.iter().enumerate().all(|(i, a)| ws[i + 1..].iter().all(|b| intersect(a, b).is_none()))
}

fn axis_names(mesh: &nx_mesh::Mesh<'_>, at: &[usize]) -> Vec<String> {
    at.iter().map(|&m| mesh.axes()[m].0.clone()).collect()
}

/// The role of each mesh axis: the tensor axis it cuts and its place in that cut.
fn roles(cuts: &Cuts, axes: usize) -> Vec<Option<(usize, usize)>> {
    let mut r = vec![None; axes];
    for (axis, at) in cuts {
        for (i, &m) in at.iter().enumerate() {
            r[m] = Some((*axis, i));
        }
    }
    r
}

impl Ctx<'_, '_, '_> {
    fn zeros(&self) -> Vec<u64> {
        vec![0; self.n]
    }

    /// Partitions of `from`'s set to try a collective over, with the mesh axes each spans.
    fn candidate_groups(&self) -> Vec<(Vec<String>, Vec<Vec<usize>>)> {
        let mut out = Vec::new();
        if !self.same_set {
            return out;
        }
        let mesh = self.from.mesh_of();
        let all: Vec<usize> = (0..mesh.rank()).collect();
        if mesh.same_axes(self.to.mesh_of()) {
            let a = roles(&self.from.cuts(), mesh.rank());
            let b = roles(&self.to.closed().cuts(), mesh.rank());
            let changed: Vec<usize> = all.iter().copied().filter(|&m| a[m] != b[m]).collect();
            if !changed.is_empty() && changed.len() < all.len() {
                out.push((axis_names(mesh, &changed), self.partition(&changed)));
            }
        }
        out.push((axis_names(mesh, &all), vec![(0..self.n).collect()]));
        out
    }

    fn partition(&self, axes: &[usize]) -> Vec<Vec<usize>> {
        let mut seen = vec![false; self.n];
        let mut groups = Vec::new();
        for d in 0..self.n {
            if !seen[d] {
                let g = self.from.group_along(axes, d);
                for &m in &g {
                    seen[m] = true;
                }
                groups.push(g);
            }
        }
        groups
    }

    fn core(&self, old: &Windows, need: &Windows) -> Option<(Step, Vec<Transfer>)> {
        let after = self.to.closed().to_string();
        let all_inside = (0..self.n).all(|u| match (&old[u], &need[u]) {
            (_, None) => true,
            (Some(o), Some(w)) => contains(o, w),
            (None, Some(w)) => volume(w) == 0,
        });
        if all_inside {
            let sliced = (0..self.n).any(|u| need[u].is_some() && need[u] != old[u]);
            return sliced.then(|| {
                let step = Step {
                    op: Op::LocalSlice,
                    mesh_axes: Vec::new(),
                    groups: vec![(0..self.n).filter(|&u| need[u].is_some()).collect()],
                    bytes_sent: self.zeros(),
                    bytes_received: self.zeros(),
                    after,
                };
                (step, Vec::new())
            });
        }
        if let Some(s) = self.broadcast(old, need, &after) {
            let root = s.groups[0][0];
            let moves = s.groups[0][1..]
                .iter()
                .map(|&u| Transfer { to: u, from: root, window: old[root].clone().expect("the root holds it") })
                .collect();
            return Some((s, moves));
        }
        for (axes, groups) in self.candidate_groups() {
            let s = self
                .all_gather(&axes, &groups, old, need, &after)
                .or_else(|| self.all_to_all(&axes, &groups, old, need, &after));
            if let Some(s) = s {
                let mut moves = Vec::new();
                for g in &s.groups {
                    for &u in g {
                        for &e in g {
                            if let (true, Some(n), Some(o)) = (u != e, &need[u], &old[e]) {
                                if let Some(w) = intersect(n, o) {
                                    moves.push(Transfer { to: u, from: e, window: w });
                                }
                            }
                        }
                    }
                }
                return Some((s, moves));
            }
        }
        Some(self.send_recv(old, need, &after))
    }

    fn broadcast(&self, old: &Windows, need: &Windows, after: &str) -> Option<Step> {
        let (true, Form::Device(k)) = (self.same_set, self.from.form()) else { return None };
        let k = *k;
        let whole = old[k].as_ref()?;
        let mut receivers = Vec::new();
        for (u, w) in need.iter().enumerate() {
            match w {
                None => {}
                Some(_) if u == k => {}
                Some(w) if w == whole => receivers.push(u),
                Some(_) => return None,
            }
        }
        let s = volume(whole) * self.eb;
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        // Pipelined along k, then the receivers in ring order after k: each forwards once.
        receivers.sort_by_key(|&u| (u + self.n - k) % self.n);
        let mut chain = vec![k];
        chain.extend(&receivers);
        for w in chain.windows(2) {
            sent[w[0]] += s;
            recv[w[1]] += s;
        }
        Some(Step {
            op: Op::Broadcast,
            mesh_axes: axis_names(self.from.mesh_of(), &[0]),
            groups: vec![chain],
            bytes_sent: sent,
            bytes_received: recv,
            after: after.to_string(),
        })
    }

    fn all_gather(
        &self,
        axes: &[String],
        groups: &[Vec<usize>],
        old: &Windows,
        need: &Windows,
        after: &str,
    ) -> Option<Step> {
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        for g in groups {
            let olds: Vec<&Window> = g.iter().map(|&u| old[u].as_ref()).collect::<Option<_>>()?;
            if !pairwise_disjoint(&olds) {
                return None;
            }
            let total: u64 = olds.iter().map(|w| volume(w)).sum();
            for &u in g {
                let n = need[u].as_ref()?;
                if volume(n) != total || !olds.iter().all(|o| contains(n, o)) {
                    return None;
                }
                recv[u] = (volume(n) - vol(&old[u])) * self.eb;
                sent[u] = vol(&old[u]) * (g.len() as u64 - 1) * self.eb;
            }
        }
        Some(Step {
            op: Op::AllGather,
            mesh_axes: axes.to_vec(),
            groups: groups.to_vec(),
            bytes_sent: sent,
            bytes_received: recv,
            after: after.to_string(),
        })
    }

    fn all_to_all(
        &self,
        axes: &[String],
        groups: &[Vec<usize>],
        old: &Windows,
        need: &Windows,
        after: &str,
    ) -> Option<Step> {
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        for g in groups {
            let olds: Vec<&Window> = g.iter().map(|&u| old[u].as_ref()).collect::<Option<_>>()?;
            let news: Vec<&Window> = g.iter().map(|&u| need[u].as_ref()).collect::<Option<_>>()?;
            if !pairwise_disjoint(&olds) || !pairwise_disjoint(&news) {
                return None;
            }
            for (i, &u) in g.iter().enumerate() {
                let covered: u64 = olds.iter().filter_map(|o| intersect(news[i], o)).map(|w| volume(&w)).sum();
                if covered != volume(news[i]) {
                    return None;
                }
                let own = intersect(news[i], olds[i]).map_or(0, |w| volume(&w));
                recv[u] = (volume(news[i]) - own) * self.eb;
                sent[u] = news
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .filter_map(|(_, n)| intersect(olds[i], n))
                    .map(|w| volume(&w))
                    .sum::<u64>()
                    * self.eb;
            }
        }
        Some(Step {
            op: Op::AllToAll,
            mesh_axes: axes.to_vec(),
            groups: groups.to_vec(),
            bytes_sent: sent,
            bytes_received: recv,
            after: after.to_string(),
        })
    }

    fn send_recv(&self, old: &Windows, need: &Windows, after: &str) -> (Step, Vec<Transfer>) {
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        let mut involved = vec![false; self.n];
        let mut moves = Vec::new();
        for u in 0..self.n {
            let mut rest = missing(&old[u], &need[u]);
            for step in 1..self.n {
                if rest.is_empty() {
                    break;
                }
                let e = (u + step) % self.n;
                let Some(held) = &old[e] else { continue };
                let mut next = Vec::with_capacity(rest.len());
                for piece in rest {
                    if let Some(common) = intersect(&piece, held) {
                        let b = volume(&common) * self.eb;
                        sent[e] += b;
                        recv[u] += b;
                        involved[e] = true;
                        involved[u] = true;
                        next.extend(subtract(&piece, &common));
                        moves.push(Transfer { to: u, from: e, window: common });
                    } else {
                        next.push(piece);
                    }
                }
                rest = next;
            }
            assert!(rest.is_empty(), "nx_placement::plan: a closed value's every element has a holder");
        }
        let step = Step {
            op: Op::SendRecv,
            mesh_axes: Vec::new(),
            groups: vec![(0..self.n).filter(|&u| involved[u]).collect()],
            bytes_sent: sent,
            bytes_received: recv,
            after: after.to_string(),
        };
        (step, moves)
    }

    fn sum_groups(&self) -> Vec<Vec<usize>> {
        let mut seen = vec![false; self.from.devices().len()];
        let mut out = Vec::new();
        for d in 0..seen.len() {
            if !seen[d] {
                let g = self.from.group_along(self.from.sums(), d);
                for &m in &g {
                    seen[m] = true;
                }
                out.push(g);
            }
        }
        out
    }

    fn all_reduce(&self, old: &Windows) -> Step {
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        let groups = self.sum_groups();
        for g in &groups {
            let n = g.len() as u64;
            for (p, &u) in g.iter().enumerate() {
                let w = vol(&old[u]);
                let c = w / n + u64::from((p as u64) < w % n);
                // reduce-scatter of the window in n chunks, then all-gather of the chunks
                sent[u] = (w - c + (n - 1) * c) * self.eb;
                recv[u] = ((n - 1) * c + w - c) * self.eb;
            }
        }
        Step {
            op: Op::AllReduce,
            mesh_axes: axis_names(self.from.mesh_of(), self.from.sums()),
            groups,
            bytes_sent: sent,
            bytes_received: recv,
            after: self.from.closed().to_string(),
        }
    }

    fn reduce_scatter(&self, old: &Windows, new: &Windows) -> Option<Step> {
        if !self.same_set || self.to.is_partial() {
            return None;
        }
        let (mut sent, mut recv) = (self.zeros(), self.zeros());
        let groups = self.sum_groups();
        for g in &groups {
            let common = old[g[0]].as_ref()?;
            let news: Vec<&Window> = g.iter().map(|&u| new[u].as_ref()).collect::<Option<_>>()?;
            if !pairwise_disjoint(&news)
                || !news.iter().all(|w| contains(common, w))
                || news.iter().map(|w| volume(w)).sum::<u64>() != volume(common)
            {
                return None;
            }
            let n = g.len() as u64;
            for (i, &u) in g.iter().enumerate() {
                sent[u] = (volume(common) - volume(news[i])) * self.eb;
                recv[u] = (n - 1) * volume(news[i]) * self.eb;
            }
        }
        Some(Step {
            op: Op::ReduceScatter,
            mesh_axes: axis_names(self.from.mesh_of(), self.from.sums()),
            groups,
            bytes_sent: sent,
            bytes_received: recv,
            after: self.to.to_string(),
        })
    }
}
