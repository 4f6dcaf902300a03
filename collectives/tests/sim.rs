//! The conformance suite on the simulated backend (1–8 ranks), its error paths, and `place` on
//! random meshes, shapes and placement pairs.

use std::time::Duration;

use nx_collectives::log::Log;
use nx_collectives::sim::{self, SimComm, SimOptions};
use nx_collectives::{place, place_in, Communicator, Error, ReduceOp, Result};
use nx_kernels::rig::Rig;
use nx_kernels::Lease;
use nx_placement::{plan, region, Device, Devices, MeshSpec, Op, PlacementSpec};
use proptest::prelude::*;

fn opts() -> SimOptions {
    SimOptions { checked: true, timeout: Duration::from_secs(20), ..Default::default() }
}

#[test]
fn the_conformance_suite_on_1_to_8_ranks() {
    for n in 1..=8 {
        sim::run(n, opts(), |c: SimComm| nx_collectives::conformance::suite(&c))
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn the_conformance_suite_on_ranks_laid_out_over_hosts() {
    // per host, then across hosts: blocks of hosts, an uneven last host, hosts interleaved, one
    // rank a host (plain rank order)
    let layouts: [&[usize]; 5] =
        [&[0, 0, 1, 1], &[0, 0, 1, 1, 2], &[0, 1, 0, 1], &[0, 0, 0, 1, 1, 1, 2, 2], &[0, 1, 2]];
    for hosts in layouts {
        let o = SimOptions { hosts: hosts.to_vec(), ..opts() };
        sim::run(hosts.len(), o, |c: SimComm| {
            assert_eq!(c.hosts(), hosts);
            nx_collectives::conformance::suite(&c)?;
            nx_collectives::conformance::places(&c)
        })
        .unwrap_or_else(|e| panic!("hosts {hosts:?}: {e}"));
    }
    // a layout of other length than the world is refused
    let e = sim::run(3, SimOptions { hosts: vec![0, 1], ..opts() }, |_c: SimComm| Ok::<_, Error>(())).unwrap_err();
    assert!(e.to_string().contains("hosts for 2 ranks in a world of 3"), "{e}");
}

#[test]
fn the_conformance_suite_on_queued_devices_from_their_pools() {
    for n in [1, 2, 3, 5, 8] {
        sim::run(n, opts(), |c: SimComm| {
            let rig = Rig::queued(nx_mesh::Device::sim(c.rank()), Duration::from_micros(200), 7 + c.rank() as u64)?;
            nx_collectives::conformance::suite_in(&c, &rig)?;
            let stats = rig.pool_stats();
            assert!(stats.reused > 0 && stats.in_use == 0, "{stats:?}");
            Ok::<_, Error>(())
        })
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn a_mismatch_is_an_error_naming_both_ranks() {
    let e = sim::run(4, opts(), |c: SimComm| -> Result<()> {
        let mut out = vec![0f32; 16];
        if c.rank() == 3 {
            c.all_gather(&[0f32; 4], &mut out)
        } else {
            c.all_reduce(&[0f32; 16], &mut out, ReduceOp::Sum)
        }
    })
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("rank 0 called all_reduce_sum(f32, [16]) at sim.rs:"), "{text}");
    assert!(text.contains("rank 3 called all_gather(f32, [4, 4, 4, 4]) at sim.rs:"), "{text}");
    // different shapes of one op
    let e = sim::run(2, opts(), |c: SimComm| -> Result<()> {
        let n = 4 + c.rank();
        let mut out = vec![0f32; n];
        c.all_reduce(&vec![0f32; n], &mut out, ReduceOp::Sum)
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("all_reduce_sum(f32, [4])") && e.to_string().contains("all_reduce_sum(f32, [5])"),
        "{e}"
    );
    // the same call over a group each rank takes for another mesh axis
    let e = sim::run(2, opts(), |c: SimComm| -> Result<()> {
        let axes = [if c.rank() == 0 { "x" } else { "y" }.to_string()];
        let g = c.split_over(Some(0), c.rank(), &axes)?.expect("a color");
        let mut out = vec![0f32; 4];
        g.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum)
    })
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("rank 0 called all_reduce_sum(f32, [4]) over mesh axes x at sim.rs:"), "{text}");
    assert!(text.contains("rank 1 called all_reduce_sum(f32, [4]) over mesh axes y at sim.rs:"), "{text}");
}

#[test]
fn a_rank_that_skips_a_collective_is_named_at_once() {
    let t = std::time::Instant::now();
    let e = sim::run(
        3,
        SimOptions { checked: true, timeout: Duration::from_secs(60), ..Default::default() },
        |c: SimComm| -> Result<()> {
            if c.rank() == 1 {
                return Ok(()); // skips the barrier
            }
            c.barrier()
        },
    )
    .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "no hang");
    let text = e.to_string();
    assert!(text.contains("rank 1 returned from its body"), "{text}");
}

#[test]
fn a_stall_times_out_naming_the_missing_ranks() {
    let e = sim::run(
        3,
        SimOptions { checked: true, timeout: Duration::from_millis(300), ..Default::default() },
        |c: SimComm| -> Result<()> {
            if c.rank() == 2 {
                std::thread::sleep(Duration::from_millis(1500));
            }
            c.barrier()
        },
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("waited") && text.contains("for ranks [2]"), "{text}");
}

#[test]
fn a_panic_is_the_root_cause_and_bad_counts_are_refused() {
    let e = sim::run(2, opts(), |c: SimComm| -> Result<()> {
        if c.rank() == 0 {
            panic!("boom on purpose");
        }
        c.barrier()
    })
    .unwrap_err();
    assert_eq!(e, Error::RankFailed { rank: 0, why: "panicked: boom on purpose".into() });
    let e = sim::run(1, opts(), |c: SimComm| -> Result<()> {
        let mut out = [0f32; 3];
        c.all_gather_v(&[1.0f32; 2], &mut out, &[2])
    })
    .unwrap_err();
    assert!(e.to_string().contains("nx_collectives::all_gather_v: counts [2] for send of 2 and recv of 3"), "{e}");
    let e = sim::run(2, opts(), |c: SimComm| -> Result<()> {
        let (s, r) = if c.rank() == 0 { (vec![1u8; 2], vec![1, 1]) } else { (vec![1u8; 2], vec![2, 0]) };
        let mut recv = vec![0u8; r.iter().sum()];
        c.all_to_all_v(&s, &[1, 1], &mut recv, &r)
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("sending 1 elements to rank 1")
            && e.to_string().contains("receiving 2 elements from rank 0"),
        "{e}"
    );
}

/// The global value's element at flat index i, and term t's share of it.
fn global(i: usize) -> f32 {
    ((i * 7919) % 1009) as f32 / 31.0 - 16.0
}
fn term(i: usize, t: usize) -> f32 {
    global(i) / 3.0 + t as f32 * 0.25
}

fn spec_from(c: &[u8], mesh: &MeshSpec, rank: usize) -> PlacementSpec {
    let names: Vec<String> = mesh.axes().iter().map(|a| a.0.clone()).collect();
    match c[0] % 8 {
        0 => PlacementSpec::On,
        1 => PlacementSpec::Device(c[1] as usize % mesh.size()),
        2 if rank > 0 => PlacementSpec::Split(c[1] as usize % rank),
        _ => {
            let mut cuts: Vec<(usize, Vec<String>)> = Vec::new();
            let mut sums = Vec::new();
            for (m, name) in names.iter().enumerate() {
                let role = c[2 + m] as usize % (rank + 2);
                if role == rank {
                    continue;
                } else if role == rank + 1 {
                    if c[0] % 8 >= 5 {
                        sums.push(name.clone());
                    }
                } else if let Some(cut) = cuts.iter_mut().find(|(a, _)| *a == role) {
                    cut.1.push(name.clone());
                } else {
                    cuts.push((role, vec![name.clone()]));
                }
            }
            if sums.is_empty() {
                PlacementSpec::Mesh { cuts }
            } else {
                PlacementSpec::Partial { sums, cuts }
            }
        }
    }
}

/// Fills blocks of every class the property's windows take with a NaN no value holds, and gives
/// them back to `rig`'s pool.
fn dirty(rig: &Rig) {
    let leases: Vec<Lease<f32>> = [128usize, 256, 512, 1024]
        .iter()
        .flat_map(|&n| (0..8).map(move |_| n))
        .map(|n| {
            let mut l = Lease::<f32>::uninit(rig, n).unwrap();
            l.fill(f32::from_bits(0x7fc0_dead));
            l
        })
        .collect();
    drop(leases);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn place_keeps_the_value_and_issues_the_plans_collectives(
        ext in prop::collection::vec(1usize..=3, 1..=3),
        shape in prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=7], 0..=3),
        a in prop::collection::vec(any::<u8>(), 6),
        b in prop::collection::vec(any::<u8>(), 6),
    ) {
        let names = ["dp", "tp", "pp"];
        let axes: Vec<(&str, usize)> = ext.iter().enumerate().map(|(i, &e)| (names[i], e)).collect();
        let mesh = MeshSpec::new(&axes).unwrap();
        let n = mesh.size();
        let (from, to) = (spec_from(&a, &mesh, shape.len()), spec_from(&b, &mesh, shape.len()));
        let numel: usize = shape.iter().product();
        let strides: Vec<usize> = (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect();
        let flat = |idx: &[usize]| idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>();
        let elements = |w: &region::Window| -> Vec<usize> {
            let mut out = Vec::new();
            let total: usize = w.iter().map(|r| r.len()).product();
            for k in 0..total {
                let mut rest = k;
                let mut idx = vec![0; w.len()];
                for d in (0..w.len()).rev() {
                    let len = w[d].len();
                    idx[d] = w[d].start + rest % len;
                    rest /= len;
                }
                out.push(flat(&idx));
            }
            out
        };
        let result = sim::run(n, opts(), |c: SimComm| -> Result<(Log, nx_placement::Plan, usize)> {
            Devices::with(Device::sims(n), |set| -> Result<(Log, nx_placement::Plan, usize)> {
                let m = mesh.over(&set).unwrap();
                let (p, q) = (from.over(&m).unwrap(), to.over(&m).unwrap());
                let pl = plan(&p, &q, &shape, 4)?;
                let r = c.rank();
                // this rank's window at `from`: the value, or a term of a sum
                let local = pl.old[r].as_ref().map(|w| {
                    let t = p.term(r).unwrap();
                    elements(w).into_iter().map(|i| match t { Some(t) => term(i, t), None => global(i) }).collect::<Vec<f32>>()
                });
                let rec = c.recorder().expect("sim records").clone();
                let mark = rec.start();
                let got = place(&c, &pl, local.clone())?;
                let log = rec.stop(mark, c.world_rank());
                // from a device's pool whose blocks hold a sentinel: every element the executor
                // answers was written, bit for bit as from fresh vectors; warm, nothing is fresh
                let rig = Rig::host(nx_mesh::Device::sim(r)).unwrap();
                let groups = nx_collectives::Groups::new();
                dirty(&rig);
                let bits = |v: Option<Vec<f32>>| v.map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                let pooled = place_in(&c, &groups, &pl, local.as_deref(), &rig)?.map(|l| l.to_vec());
                assert_eq!(bits(pooled), bits(got.clone()), "pooled, rank {r}: {from} -> {to}\n{pl}");
                let fresh = rig.pool_stats().fresh;
                let again = place_in(&c, &groups, &pl, local.as_deref(), &rig)?.map(|l| l.to_vec());
                assert_eq!(rig.pool_stats().fresh, fresh, "a warm place allocated from the system");
                assert_eq!(bits(again), bits(got.clone()));
                // the closed value: the term-order sum where `from` is partial
                let terms = p.terms();
                let value = |i: usize| if p.is_partial() { (1..terms).fold(term(i, 0), |acc, t| acc + term(i, t)) } else { global(i) };
                match (&pl.new[r], got) {
                    (None, None) => {}
                    (Some(w), Some(data)) => {
                        let t = q.term(r).unwrap();
                        // equal placements move nothing: a partial value keeps its terms
                        let same = p.equal(&q);
                        let want: Vec<f32> = elements(w).into_iter().map(|i| match t {
                            Some(t) if same => term(i, t),
                            Some(t) if t > 0 => 0.0,
                            _ => value(i),
                        }).collect();
                        assert_eq!(data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "rank {r}: {from} -> {to} over {mesh} shape {shape:?}\n{pl}");
                    }
                    (w, d) => panic!("rank {r}: window {w:?}, data {:?}", d.map(|d| d.len())),
                }
                Ok((log, pl, r))
            }).unwrap()
        });
        let per_rank = result.unwrap_or_else(|e| panic!("{from} -> {to} over {mesh} shape {shape:?}: {e}"));
        for (log, pl, r) in per_rank {
            // the collectives this rank issued are the plan's steps it takes part in: the same
            // op, mesh axes, and bytes sent and received; their groups are the plan's
            if let Err(why) = log.check_plan(&pl, r) {
                panic!("{from} -> {to} over {mesh} shape {shape:?}: {why}");
            }
            let mine = pl.steps.iter().filter(|s| !matches!(s.op, Op::LocalSlice | Op::ZeroFill))
                .filter(|s| s.op == Op::SendRecv || s.groups.iter().any(|g| g.contains(&r)));
            for (e, st) in log.collectives().zip(mine) {
                let group: Vec<usize> = match st.op {
                    Op::SendRecv => (0..n).collect(),
                    _ => st.groups.iter().find(|g| g.contains(&r)).cloned().unwrap_or_default(),
                };
                prop_assert_eq!(&e.members, &group);
                prop_assert!(e.step.as_deref().is_some_and(|s| s.contains(st.op.name())), "{:?}", e.step);
            }
        }
        let _ = numel;
    }
}

#[test]
fn a_broadcast_root_keeps_only_its_window() {
    // device(1) -> split(0) of one element: sim:1 broadcasts it, then needs an empty window
    let got = sim::run(2, opts(), |c: SimComm| -> Result<Option<Vec<f32>>> {
        Devices::with(Device::sims(2), |s| -> Result<Option<Vec<f32>>> {
            let pl = plan(&nx_placement::Placement::device(&s, 1)?, &nx_placement::Placement::split(0, &s)?, &[1], 4)?;
            let local = (c.rank() == 1).then(|| vec![7.5f32]);
            place(&c, &pl, local)
        })
        .unwrap()
    })
    .unwrap();
    assert_eq!(got, [Some(vec![7.5]), Some(vec![])]);
}

#[test]
fn place_between_two_device_sets_moves_only_the_overlaps() {
    // a world of 6 ranks; the value moves from split(0) over ranks 0..4 to split(0) over 2..6
    let got = sim::run(6, opts(), |c: SimComm| -> Result<Option<Vec<f32>>> {
        Devices::with(Device::sims(4), |a| {
            Devices::with((2..6).map(Device::sim).collect(), |b| -> Result<Option<Vec<f32>>> {
                let p = nx_placement::Placement::split(0, &a).unwrap();
                let q = nx_placement::Placement::split(0, &b).unwrap();
                let pl = plan(&p, &q, &[10], 4)?;
                assert_eq!(pl.steps[0].op, Op::SendRecv);
                let r = c.rank();
                let local = pl.old.get(r).cloned().flatten().map(|w| w[0].clone().map(|i| i as f32).collect());
                place(&c, &pl, local)
            })
            .unwrap()
        })
        .unwrap()
    })
    .unwrap();
    // sim:2..5 are b's devices 0..3 and hold [0,3) [3,6) [6,8) [8,10)
    assert_eq!(got[0], None);
    assert_eq!(got[1], None);
    assert_eq!(got[2], Some(vec![0.0, 1.0, 2.0]));
    assert_eq!(got[3], Some(vec![3.0, 4.0, 5.0]));
    assert_eq!(got[4], Some(vec![6.0, 7.0]));
    assert_eq!(got[5], Some(vec![8.0, 9.0]));
}

#[test]
fn the_property_tests_cases_reach_every_kind_of_step() {
    // the cases of `place_keeps_the_value_and_issues_the_plans_collectives`, drawn the same way:
    // their plans take every kind of step
    use proptest::strategy::ValueTree;
    let s = (
        prop::collection::vec(1usize..=3, 1..=3),
        prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=7], 0..=3),
        prop::collection::vec(any::<u8>(), 6),
        prop::collection::vec(any::<u8>(), 6),
    );
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3000 {
        let (ext, shape, a, b) = s.new_tree(&mut runner).unwrap().current();
        let names = ["dp", "tp", "pp"];
        let axes: Vec<(&str, usize)> = ext.iter().enumerate().map(|(i, &e)| (names[i], e)).collect();
        let mesh = MeshSpec::new(&axes).unwrap();
        let (from, to) = (spec_from(&a, &mesh, shape.len()), spec_from(&b, &mesh, shape.len()));
        Devices::with(Device::sims(mesh.size()), |set| {
            let m = mesh.over(&set).unwrap();
            let pl = plan(&from.over(&m).unwrap(), &to.over(&m).unwrap(), &shape, 4).unwrap();
            seen.extend(pl.steps.iter().map(|s| s.op.name()));
        })
        .unwrap();
    }
    let mut seen: Vec<&str> = seen.into_iter().collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            "all_gather",
            "all_reduce",
            "all_to_all",
            "broadcast",
            "local_slice",
            "reduce_scatter",
            "send_recv",
            "zero_fill"
        ]
    );
}

#[test]
fn groups_split_once_and_ranks_that_disagree_about_them_meet_in_an_error() {
    use nx_collectives::log::Op as L;
    use nx_collectives::Groups;
    // mesh(0:tp) over dp=2,tp=2 → on: all-gathers within each dp row; the second place splits nothing
    let got = sim::run(4, opts(), |c: SimComm| -> Result<(usize, usize, Vec<f32>)> {
        let pl = Devices::with(Device::sims(4), |set| -> Result<nx_placement::Plan> {
            let m = MeshSpec::new(&[("dp", 2), ("tp", 2)]).unwrap().over(&set).unwrap();
            let from = nx_placement::Placement::mesh(&m, &[(0, &["tp"])])?;
            let to = nx_placement::Placement::mesh(&m, &[])?;
            let pl = plan(&from, &to, &[5], 4)?;
            assert_eq!(pl.steps[0].op, Op::AllGather, "{pl}");
            Ok(pl)
        })
        .unwrap()?;
        let r = c.rank();
        let mine: Vec<f32> = match r % 2 {
            0 => vec![0.0, 1.0, 2.0],
            _ => vec![3.0, 4.0],
        };
        let (groups, rig) = (Groups::new(), Rig::host(nx_mesh::Device::sim(r))?);
        let rec = c.recorder().expect("sim records").clone();
        let mut splits = Vec::new();
        let mut out = Vec::new();
        for _ in 0..2 {
            let mark = rec.start();
            out = place_in(&c, &groups, &pl, Some(&mine), &rig)?.expect("all hold it").to_vec();
            // a split proper logs no dtype; a cached group's agreement logs its hash's
            let log = rec.stop(mark, c.world_rank());
            let split = |e: &&nx_collectives::log::Event| e.op == L::Split && e.dtype.is_none();
            splits.push(log.events.iter().filter(split).count());
        }
        Ok((splits[0], splits[1], out))
    })
    .unwrap();
    for (first, second, out) in got {
        assert_eq!((first, second), (1, 0), "one split, then none (an agreement)");
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 4.0]);
    }
    // rank 0 asks for cached groups, rank 1 for new ones; or both for cached ones, different:
    // an error naming both, not a hang, checked or not
    for checked in [true, false] {
        let o = SimOptions { checked, ..opts() };
        let e = sim::run(2, o.clone(), |c: SimComm| -> Result<()> {
            let groups = Groups::new();
            groups.get(&c, &[vec![0, 1]], &[])?;
            let other = if c.rank() == 0 { vec![vec![0, 1]] } else { vec![vec![0], vec![1]] };
            groups.get(&c, &other, &[]).map(drop)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("all_gather") && e.contains("split") && e.contains("rank 0") && e.contains("rank 1"), "{e}");
        let e = sim::run(2, o, |c: SimComm| -> Result<()> {
            let groups = Groups::new();
            let (a, b) = (vec![vec![0, 1]], vec![vec![0], vec![1]]);
            groups.get(&c, &a, &[])?;
            groups.get(&c, &b, &[])?;
            groups.get(&c, if c.rank() == 0 { &a } else { &b }, &[]).map(drop)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("other groups") && e.contains("rank 0") && e.contains("rank 1"), "{e}");
    }
}
