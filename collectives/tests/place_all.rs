//! `place_all_in` on random meshes and lists of values: the same bits as each value's own
//! `place_in`, the closings of sums over the same groups in one all-reduce, the others' steps
//! as their own.

use std::time::Duration;

use nx_collectives::log::Op as Call;
use nx_collectives::sim::{self, SimComm, SimOptions};
use nx_collectives::{place_all_in, place_in, Communicator, Groups, Result};
use nx_kernels::rig::Rig;
use nx_placement::{plan, Device, Devices, MeshSpec, Op, PlacementSpec};
use proptest::prelude::*;

fn opts() -> SimOptions {
    SimOptions { checked: true, timeout: Duration::from_secs(20), ..Default::default() }
}

/// Value `v`'s term `t` at element `i`: fractions whose sums round, so association shows, and
/// each value its own (a window copied to another's place shows).
fn term(v: usize, i: usize, t: usize) -> f32 {
    ((i * 7 + t * 13 + v * 5) % 17) as f32 * 0.37 - 1.1 + 1e-3 * t as f32 + 0.01 * v as f32
}

/// One value of the list: its shape, where it lies, where it goes.
#[derive(Debug, Clone)]
struct Case {
    shape: Vec<usize>,
    from: PlacementSpec,
    to: PlacementSpec,
}

/// A value whose mesh axes `sum` (a bit set over `names`) hold terms and `cut` (another, disjoint)
/// cut its axis 0, going (`kind`) 0: closed where it lies, 1: whole everywhere, 2: nowhere.
fn case(names: &[String], shape: Vec<usize>, sum: u8, cut: u8, kind: u8) -> Case {
    let pick = |bits: u8| -> Vec<String> {
        names.iter().enumerate().filter(|(k, _)| bits >> k & 1 == 1).map(|(_, n)| n.clone()).collect()
    };
    let cut = if shape.is_empty() { 0 } else { cut & !sum };
    let cuts = if cut == 0 { vec![] } else { vec![(0, pick(cut))] };
    let sums = pick(sum);
    let from = if sums.is_empty() {
        PlacementSpec::Mesh { cuts: cuts.clone() }
    } else {
        PlacementSpec::Partial { sums, cuts: cuts.clone() }
    };
    let to = match kind % 3 {
        0 => PlacementSpec::Mesh { cuts },
        1 => PlacementSpec::Mesh { cuts: vec![] },
        _ => from.clone(),
    };
    Case { shape, from, to }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn place_all_gives_each_values_bits_and_fuses_the_closings(
        ext in prop::collection::vec(1usize..=3, 1..=3),
        values in prop::collection::vec(
            (prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=5], 0..=2), any::<u8>(), any::<u8>(), any::<u8>()),
            0..=6,
        ),
    ) {
        let names: Vec<String> = ["dp", "tp", "pp"][..ext.len()].iter().map(|s| s.to_string()).collect();
        let axes: Vec<(&str, usize)> = names.iter().zip(&ext).map(|(n, &e)| (n.as_str(), e)).collect();
        let mesh = MeshSpec::new(&axes).unwrap();
        let n = mesh.size();
        let mask = (1u8 << ext.len()) - 1;
        let cases: Vec<Case> = values.into_iter().map(|(s, sum, cut, kind)| case(&names, s, sum & mask, cut & mask, kind)).collect();
        let out = sim::run(n, opts(), |c: SimComm| -> Result<()> {
            Devices::with(Device::sims(n), |set| -> Result<()> {
                let m = mesh.over(&set).unwrap();
                let plans = cases
                    .iter()
                    .map(|k| plan(&k.from.over(&m).unwrap(), &k.to.over(&m).unwrap(), &k.shape, 4))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let r = c.rank();
                let locals: Vec<Option<Vec<f32>>> = cases
                    .iter()
                    .zip(&plans)
                    .enumerate()
                    .map(|(v, (k, pl))| {
                        let t = k.from.over(&m).unwrap().term(r).unwrap().unwrap_or(0);
                        pl.old[r].as_ref().map(|w| (0..nx_placement::region::volume(w) as usize).map(|i| term(v, i, t)).collect())
                    })
                    .collect();
                let slices: Vec<Option<&[f32]>> = locals.iter().map(|l| l.as_deref()).collect();
                let (rig, groups) = (Rig::host(Device::sim(r)).unwrap(), Groups::new());
                let rec = c.recorder().expect("sim records").clone();
                // each value on its own
                let mark = rec.start();
                let mut one = Vec::new();
                for (pl, l) in plans.iter().zip(&slices) {
                    one.push(place_in(&c, &groups, pl, *l, &rig)?.map(|b| b.to_vec()));
                }
                let alone = rec.stop(mark, c.world_rank());
                // all at once
                let mark = rec.start();
                let refs: Vec<&_> = plans.iter().collect();
                let all = place_all_in(&c, &groups, &refs, &slices, &rig)?;
                let together = rec.stop(mark, c.world_rank());
                let bits = |v: &Option<Vec<f32>>| v.as_ref().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                for (i, (a, b)) in one.iter().zip(all).enumerate() {
                    assert_eq!(bits(a), bits(&b.map(|b| b.to_vec())), "rank {r}, value {i}: {:?}", cases[i]);
                }
                // the closings where they lie: one all-reduce per distinct group set among them
                // (on this rank: one per set it belongs to)
                let closes: Vec<&_> = plans.iter().filter(|p| p.steps.len() == 1 && p.steps[0].op == Op::AllReduce && p.old == p.new).collect();
                let mut sets: Vec<(&Vec<Vec<usize>>, &Vec<String>)> = Vec::new();
                for p in &closes {
                    let key = (&p.steps[0].groups, &p.steps[0].mesh_axes);
                    if !sets.contains(&key) {
                        sets.push(key);
                    }
                }
                let fused = closes.len() - sets.len();
                assert_eq!(together.count_any(Call::AllReduce) + fused, alone.count_any(Call::AllReduce), "rank {r}: {cases:?}");
                assert_eq!(together.collectives().count() + fused, alone.collectives().count(), "rank {r}: {cases:?}");
                Ok(())
            })
            .unwrap()
        });
        out.unwrap_or_else(|e| panic!("{cases:?} over {mesh}: {e}"));
    }
}

#[test]
fn lists_of_other_lengths_are_refused_by_name() {
    let out = sim::run(1, opts(), |c: SimComm| -> Result<()> {
        let rig = Rig::host(Device::sim(0)).unwrap();
        let err = place_all_in::<f32, _, _>(&c, &Groups::new(), &[], &[None], &rig).unwrap_err().to_string();
        assert!(err.contains("place_all_in") && err.contains("0 plans for 1 windows"), "{err}");
        Ok(())
    });
    out.unwrap();
}
