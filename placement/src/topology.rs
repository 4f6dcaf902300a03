//! A plan's bytes by kind of link, for devices laid out over hosts, and its predicted time there.
//!
//! Each step's messages are the ones nx's backends send: a sum (all-reduce, reduce-scatter) over
//! a group whose members lie on H ≥ 2 hosts, L ≥ 2 on each, takes the hierarchical path (within
//! each host, then across hosts among the members of each local rank: a member sends S·(H−1)/(H·L)
//! of a reduce-scatter of S bytes across hosts), and so does an all-gather (across, then within);
//! other groups exchange directly (each block straight to the member that needs it). All-to-all,
//! broadcast and send/recv steps move their transfers directly. A message between devices of one
//! host is "within"; between hosts, "across". The predicted time of a step is its latency plus the
//! larger of the busiest device's bytes within a host over the within-host bandwidth and the
//! busiest host's bytes across (sent or received, every device of the host together: one link a
//! host) over the link's.

use crate::plan::{Op, Plan};
use crate::region::{volume, Window};
use crate::{Error, Result};

/// Devices laid out over hosts and the speed of each kind of link.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// The host of each device of the plan (by position in [`Plan::devices`]); equal numbers
    /// share a host.
    pub hosts: Vec<usize>,
    /// Bytes a second a device sends (and receives) to devices of its host.
    pub within_bytes_per_second: f64,
    /// Bytes a second a host's link carries each way, shared by the host's devices.
    pub across_bytes_per_second: f64,
    /// Seconds each step costs whatever it moves.
    pub step_latency_seconds: f64,
}

/// One step's bytes by link kind, per device (positions in [`Plan::devices`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct LinkBytes {
    /// Bytes each device sends to devices of its host.
    pub within_sent: Vec<u64>,
    /// Bytes each device receives from devices of its host.
    pub within_received: Vec<u64>,
    /// Bytes each device sends to other hosts.
    pub across_sent: Vec<u64>,
    /// Bytes each device receives from other hosts.
    pub across_received: Vec<u64>,
}

impl LinkBytes {
    fn new(n: usize) -> LinkBytes {
        LinkBytes {
            within_sent: vec![0; n],
            within_received: vec![0; n],
            across_sent: vec![0; n],
            across_received: vec![0; n],
        }
    }

    /// A message of `bytes` from device `from` to device `to`.
    fn send(&mut self, hosts: &[usize], from: usize, to: usize, bytes: u64) {
        if from == to || bytes == 0 {
            return;
        }
        if hosts[from] == hosts[to] {
            self.within_sent[from] += bytes;
            self.within_received[to] += bytes;
        } else {
            self.across_sent[from] += bytes;
            self.across_received[to] += bytes;
        }
    }
}

/// A group's members by host in member order, the hosts in the order of their first member;
/// `Some` where the hierarchical path takes it (at least two hosts of the same number, at least
/// two, of members).
fn tiers(group: &[usize], hosts: &[usize]) -> Option<Vec<Vec<usize>>> {
    let mut by: Vec<(usize, Vec<usize>)> = Vec::new();
    for &d in group {
        match by.iter_mut().find(|g| g.0 == hosts[d]) {
            Some(g) => g.1.push(d),
            None => by.push((hosts[d], vec![d])),
        }
    }
    let at: Vec<Vec<usize>> = by.into_iter().map(|g| g.1).collect();
    let per = at[0].len();
    (at.len() >= 2 && per >= 2 && at.iter().all(|g| g.len() == per)).then_some(at)
}

fn vol(w: &Option<Window>) -> u64 {
    w.as_ref().map_or(0, |w| volume(w))
}

impl Plan {
    /// Each step's bytes by link kind, for devices on `hosts` (the host of each device of
    /// [`Plan::devices`]), as nx's backends move them (see the [module](self)).
    ///
    /// # Errors
    /// [`Error::Rule`] where `hosts` does not give one host a device.
    pub fn link_bytes(&self, hosts: &[usize]) -> Result<Vec<LinkBytes>> {
        let n = self.devices.len();
        if hosts.len() != n {
            return Err(Error::Rule {
                func: "nx_placement::Plan::link_bytes",
                why: format!("hosts for {} devices, for a plan over {n}", hosts.len()),
            });
        }
        let eb = self.elem_bytes as u64;
        let mut out = Vec::with_capacity(self.steps.len());
        for (k, step) in self.steps.iter().enumerate() {
            let mut lb = LinkBytes::new(n);
            match step.op {
                Op::AllReduce | Op::ReduceScatter => {
                    for g in &step.groups {
                        let m = g.len() as u64;
                        // each member's block of the sum, in elements
                        let counts: Vec<u64> = if step.op == Op::AllReduce {
                            let len = vol(&self.old[g[0]]);
                            (0..m).map(|j| (j + 1) * len / m - j * len / m).collect()
                        } else {
                            g.iter().map(|&u| vol(&self.new[u])).collect()
                        };
                        let count = |d: usize| counts[g.iter().position(|&u| u == d).expect("a member")] * eb;
                        let gather = step.op == Op::AllReduce;
                        match tiers(g, hosts) {
                            Some(at) => {
                                let (hs, ls) = (at.len(), at[0].len());
                                for h in 0..hs {
                                    for l in 0..ls {
                                        let me = at[h][l];
                                        for lp in (0..ls).filter(|&lp| lp != l) {
                                            // within: local rank lp's blocks of every host
                                            let b: u64 = (0..hs).map(|hp| count(at[hp][lp])).sum();
                                            lb.send(hosts, me, at[h][lp], b);
                                            if gather {
                                                let mine: u64 = (0..hs).map(|hp| count(at[hp][l])).sum();
                                                lb.send(hosts, me, at[h][lp], mine);
                                            }
                                        }
                                        for hp in (0..hs).filter(|&hp| hp != h) {
                                            // across: host hp's block among this local rank's
                                            lb.send(hosts, me, at[hp][l], count(at[hp][l]));
                                            if gather {
                                                lb.send(hosts, me, at[hp][l], count(me));
                                            }
                                        }
                                    }
                                }
                            }
                            None => {
                                for &a in g {
                                    for &b in g.iter().filter(|&&b| b != a) {
                                        lb.send(hosts, a, b, count(b));
                                        if gather {
                                            lb.send(hosts, a, b, count(a));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                Op::AllGather => {
                    for t in &self.transfers[k] {
                        let b = volume(&t.window) * eb;
                        let g = step.groups.iter().find(|g| g.contains(&t.from) && g.contains(&t.to));
                        match g.and_then(|g| tiers(g, hosts)) {
                            Some(at) if hosts[t.from] != hosts[t.to] => {
                                // across to the sender's local rank on the receiver's host (once
                                // a host: counted at the member of that local rank), then within
                                let l = at.iter().find_map(|h| h.iter().position(|&d| d == t.from)).expect("a member");
                                let hop = at.iter().find(|h| h.contains(&t.to)).expect("a member")[l];
                                if hop == t.to {
                                    lb.send(hosts, t.from, hop, b);
                                }
                                lb.send(hosts, hop, t.to, b);
                            }
                            _ => lb.send(hosts, t.from, t.to, b),
                        }
                    }
                }
                Op::AllToAll | Op::Broadcast | Op::SendRecv => {
                    for t in &self.transfers[k] {
                        lb.send(hosts, t.from, t.to, volume(&t.window) * eb);
                    }
                }
                Op::LocalSlice | Op::ZeroFill => {}
            }
            out.push(lb);
        }
        Ok(out)
    }

    /// The plan's predicted time on `topology`, in seconds (see the [module](self)).
    ///
    /// # Errors
    /// As [`Plan::link_bytes`].
    pub fn predicted_seconds_on(&self, topology: &Topology) -> Result<f64> {
        let hosts = &topology.hosts;
        let links = self.link_bytes(hosts)?;
        let mut total = 0.0;
        for (step, lb) in self.steps.iter().zip(&links) {
            if matches!(step.op, Op::LocalSlice | Op::ZeroFill) {
                continue;
            }
            let within = lb.within_sent.iter().zip(&lb.within_received).map(|(a, b)| *a.max(b)).max().unwrap_or(0);
            let mut per_host: Vec<(usize, u64, u64)> = Vec::new();
            for (d, &h) in hosts.iter().enumerate() {
                match per_host.iter_mut().find(|e| e.0 == h) {
                    Some(e) => {
                        e.1 += lb.across_sent[d];
                        e.2 += lb.across_received[d];
                    }
                    None => per_host.push((h, lb.across_sent[d], lb.across_received[d])),
                }
            }
            let across = per_host.iter().map(|e| e.1.max(e.2)).max().unwrap_or(0);
            total += topology.step_latency_seconds
                + (within as f64 / topology.within_bytes_per_second)
                    .max(across as f64 / topology.across_bytes_per_second);
        }
        Ok(total)
    }
}
