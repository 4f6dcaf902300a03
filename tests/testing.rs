//! `nx::testing`: its strategies produce only valid cases and reach every placement kind; a placed
//! tensor holds its stated value; `check_close` tells a one-ulp difference in exact mode; the
//! one-device comparison finds a wrong rank.

use std::collections::HashSet;

use nx::testing::strategies::{self, kind, Kind, PlacedCase};
use nx::testing::{check_close, same_as_one_device, Tol};
use nx::{launch_with, Devices, MeshSpec, Placement, Tensor};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

fn cases(n: usize) -> Vec<PlacedCase> {
    let mut runner = TestRunner::deterministic();
    let s = strategies::placed_tensor(strategies::meshes(1..=3, 1..=3), strategies::shapes(0..=3, 7));
    (0..n).map(|_| s.new_tree(&mut runner).expect("a case").current()).collect()
}

#[test]
fn ten_thousand_cases_are_valid_and_reach_every_placement_kind() {
    let mut kinds = HashSet::new();
    let mut partial_with_cuts = false;
    for c in cases(10_000) {
        kinds.insert(kind(&c.placement));
        Devices::with(nx::Device::sims(c.mesh.size()), |set| {
            let m = c.mesh.over(&set).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            let p: Placement<'_> = c.placement.over(&m).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            // every device's window of the shape is defined
            for d in 0..set.len() {
                p.window(&c.shape, d).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
            partial_with_cuts |= p.is_partial() && p.to_string().contains(':');
        })
        .unwrap();
        assert_eq!(c.value().len(), c.shape.iter().product::<usize>());
    }
    let all: HashSet<Kind> = [Kind::On, Kind::Device, Kind::Split, Kind::Mesh, Kind::Partial].into();
    assert_eq!(kinds, all);
    assert!(partial_with_cuts, "partial sums that also cut an axis");
}

#[test]
fn placed_tensors_hold_their_value() {
    // built on their meshes and gathered: the stated value, exactly (a partial one summed)
    for c in cases(300) {
        let want = c.value();
        let got = launch_with(&c.options(), |ctx| {
            let m = c.mesh(ctx)?;
            let t = c.tensor::<f64>(ctx, &m)?;
            assert_eq!(t.placement().to_string(), c.placement.over(&m)?.to_string());
            Ok(t.full()?.to_vec()?)
        })
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
        for g in got {
            check_close(&g, &want, Tol::Exact).unwrap_or_else(|d| panic!("{c:?}: {d}"));
        }
        // a partial value's terms all differ from the value: only their sum is it
        if let nx::PlacementSpec::Partial { .. } = c.placement {
            let terms = nx::Devices::with(nx::Device::sims(c.mesh.size()), |set| {
                c.placement.over(&c.mesh.over(&set).unwrap()).unwrap().terms()
            })
            .unwrap();
            if terms > 1 && !want.is_empty() {
                let zero: Vec<f64> = (0..want.len() as u64).map(|i| c.term(0, i, terms)).collect();
                assert!(zero.iter().zip(&want).any(|(a, b)| a != b), "{c:?}: term 0 is the value");
            }
        }
    }
}

#[test]
fn exact_mode_tells_one_ulp_and_close_mode_reports_the_first_difference() {
    let a = [1.0f32, 2.0, -0.0];
    let mut b = a;
    b[1] = f32::from_bits(2.0f32.to_bits() + 1);
    let d = check_close(&b, &a, Tol::Exact).unwrap_err();
    assert_eq!((d.first, d.count), (Some(1), 1));
    assert!(d.to_string().contains("at index 1: got 2.0000002, want 2.0, bit for bit"), "{d}");
    assert!(check_close(&b, &a, Tol::close(1e-6, 0.0)).is_ok());
    // +0 and -0 differ bit for bit; integers compare exactly
    assert!(check_close(&[0.0f32], &[-0.0], Tol::Exact).is_err());
    assert!(check_close(&[3i32, 4], &[3, 5], Tol::Exact).unwrap_err().to_string().contains("got 4, want 5"));
    // lengths, NaN where a NaN is wanted only
    assert!(check_close(&[1.0f64], &[1.0, 2.0], Tol::close(1.0, 1.0))
        .unwrap_err()
        .to_string()
        .contains("lengths differ"));
    assert!(check_close(&[f64::NAN], &[f64::NAN], Tol::close(0.0, 0.0)).is_ok());
    assert!(check_close(&[f64::NAN], &[1.0], Tol::close(1e9, 1e9)).is_err());
    let d = check_close(&[1.0f64, 2.5], &[1.0, 2.0], Tol::close(0.1, 0.0)).unwrap_err();
    assert!(d.to_string().contains("error 5e-1, relative 2.5e-1"), "{d}");
}

#[test]
fn the_one_device_comparison_names_a_rank_that_differs() {
    let mesh: MeshSpec = "dp=2,tp=2".parse().unwrap();
    // a body that is right on one device and wrong on rank 3 of the mesh
    let e = same_as_one_device(&mesh, &Default::default(), Tol::Exact, |ctx, m| {
        let p = "mesh(0:dp.tp)".parse::<nx::PlacementSpec>()?.over(m)?;
        let x = Tensor::<f32>::rand(ctx, &[9], &p, 3)?.full()?.to_vec()?;
        Ok(if ctx.rank() == 3 { x.iter().map(|v| v + 1e-7).collect() } else { x })
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("rank 3 of the mesh dp=2,tp=2 differs from one device"), "{e}");
}
