//! Hand-checked layouts and every error of the reference.

use nx_placement::{Device, Devices, Error, Mesh, Placement, PlacementSpec, MAX_RANK};

fn lens(p: &Placement<'_>, shape: &[usize], axis: usize) -> Vec<usize> {
    (0..p.devices().len()).map(|d| p.window(shape, d).unwrap().map_or(0, |w| w[axis].len())).collect()
}

#[test]
fn five_over_four_is_2_1_1_1() {
    Devices::with(Device::sims(4), |s| {
        let p = Placement::split(0, &s).unwrap();
        assert_eq!(lens(&p, &[5], 0), [2, 1, 1, 1]);
        assert_eq!(lens(&p, &[3], 0), [1, 1, 1, 0], "empty only where n < k");
        assert_eq!(lens(&p, &[0], 0), [0, 0, 0, 0]);
        assert_eq!(p.holders(&[5], &[1]).unwrap(), [0]);
        assert_eq!(p.holders(&[5], &[4]).unwrap(), [3]);
    })
    .unwrap();
}

#[test]
fn seven_by_five_over_two_by_three() {
    Devices::with(Device::sims(6), |s| {
        let m = Mesh::new(&s, &[("dp", 2), ("tp", 3)]).unwrap();
        let p = Placement::mesh(&m, &[(0, &["dp"]), (1, &["tp"])]).unwrap();
        let w: Vec<_> = (0..6).map(|d| p.window(&[7, 5], d).unwrap().unwrap()).collect();
        assert_eq!(w[0], vec![0..4, 0..2]);
        assert_eq!(w[1], vec![0..4, 2..4]);
        assert_eq!(w[2], vec![0..4, 4..5]);
        assert_eq!(w[3], vec![4..7, 0..2]);
        assert_eq!(w[5], vec![4..7, 4..5]);
        // copies along an uncut mesh axis
        let rows = Placement::mesh(&m, &[(0, &["dp"])]).unwrap();
        assert_eq!(rows.holders(&[7, 5], &[6, 0]).unwrap(), [3, 4, 5]);
        // a sum over tp: terms 0,1,2 in each dp row, groups along tp
        let part = Placement::partial(&m, &["tp"], &[(0, &["dp"])]).unwrap();
        assert_eq!((0..6).map(|d| part.term(d).unwrap().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
        assert_eq!(part.sum_group(4).unwrap(), [3, 4, 5]);
        assert_eq!(part.terms(), 3);
    })
    .unwrap();
}

#[test]
fn constructors_normalise_as_the_reference_says() {
    Devices::with(Device::sims(1), |s| {
        // device s d is on s where s has d alone
        assert!(Placement::device(&s, 0).unwrap().equal(&Placement::on(&s)));
        assert_eq!(Placement::device(&s, 0).unwrap().to_string(), "on");
    })
    .unwrap();
    Devices::with(Device::sims(4), |s| {
        let m = Mesh::new(&s, &[("a", 2), ("b", 2)]).unwrap();
        // partial m [] cuts is mesh m cuts
        let p = Placement::partial(&m, &[], &[(0, &["a"])]).unwrap();
        assert!(!p.is_partial());
        assert_eq!(p.to_string(), "mesh(0:a)");
        // split is mesh over x=n
        let flat = Mesh::new(&s, &[("x", 4)]).unwrap();
        assert!(Placement::split(1, &s).unwrap().equal(&Placement::mesh(&flat, &[(1, &["x"])]).unwrap()));
        // equal ignores how a window is spelled: a.b over 2x2 is split over 4
        assert!(Placement::split(0, &s).unwrap().equal(&Placement::mesh(&m, &[(0, &["a", "b"])]).unwrap()));
        assert!(!Placement::split(0, &s).unwrap().equal(&Placement::mesh(&m, &[(0, &["b", "a"])]).unwrap()));
        // closed and uncut
        let q = Placement::partial(&m, &["b"], &[(1, &["a"])]).unwrap();
        assert_eq!(q.closed().to_string(), "mesh(1:a)");
        assert_eq!(q.uncut().to_string(), "mesh()");
        assert!(q.uncut().equal(&Placement::on(&s)));
        let on = Placement::on(&s);
        assert_eq!(on.uncut().to_string(), "on");
        assert_eq!(Placement::split(0, &s).unwrap().uncut().to_string(), "on");
        assert!(!q.equal(&q.closed()), "a sum is not its closing");
        assert_eq!(format!("{q:#}"), "partial(b; 1:a) over a=2,b=2 [sim:0, sim:1, sim:2, sim:3]");
    })
    .unwrap();
}

#[test]
fn same_is_a_witness_between_brands() {
    Devices::with(Device::sims(3), |a| {
        Devices::with(Device::sims(3), |b| {
            let p = Placement::split(0, &a).unwrap();
            let q = Placement::on(&b);
            let proof = Placement::same(&p, &q).expect("one set");
            let p_at_b: Placement<'_> = p.cast(proof);
            // p_at_b now lives at b's brand: it can be kept beside q.
            let both = [p_at_b, q];
            assert!(both[0].equal(&p));
        })
        .unwrap();
        Devices::with(Device::sims(2), |c| {
            assert!(Placement::same(&Placement::on(&a), &Placement::on(&c)).is_none());
            assert!(!Placement::on(&a).equal(&Placement::on(&c)));
        })
        .unwrap();
    })
    .unwrap();
}

#[test]
fn every_error_of_the_reference() {
    Devices::with(Device::sims(4), |s| {
        let m = Mesh::new(&s, &[("dp", 2), ("tp", 2)]).unwrap();
        let e = Placement::device(&s, 4).unwrap_err();
        assert!(matches!(e, Error::DeviceNotInSet { .. }));
        assert!(e.to_string().starts_with("nx_placement::Placement::device: device number 4"), "{e}");
        let e = Placement::on_device(&s, &Device::sim(9)).unwrap_err();
        assert!(e.to_string().contains("sim:9"), "{e}");
        let e = Placement::split(MAX_RANK, &s).unwrap_err();
        assert!(matches!(e, Error::AxisOutOfRange { axis: 16, .. }), "{e}");
        let e = Placement::mesh(&m, &[(0, &["pp"])]).unwrap_err();
        assert_eq!(e.to_string(), "nx_placement::Placement::mesh: the mesh dp=2,tp=2 has no axis \"pp\"");
        let e = Placement::mesh(&m, &[(0, &["dp"]), (0, &["tp"])]).unwrap_err();
        assert!(matches!(e, Error::AxisInTwoCuts { axis: 0, .. }), "{e}");
        let e = Placement::mesh(&m, &[(0, &["dp"]), (1, &["dp"])]).unwrap_err();
        assert!(matches!(e, Error::NameInTwoCuts { .. }), "{e}");
        let e = Placement::mesh(&m, &[(0, &["dp", "dp"])]).unwrap_err();
        assert!(matches!(e, Error::NameInTwoCuts { .. }), "{e}");
        let e = Placement::mesh(&m, &[(MAX_RANK, &["dp"])]).unwrap_err();
        assert!(matches!(e, Error::AxisOutOfRange { .. }), "{e}");
        let e = Placement::partial(&m, &["tp", "tp"], &[]).unwrap_err();
        assert!(matches!(e, Error::NameInSumsTwice { .. }), "{e}");
        let e = Placement::partial(&m, &["tp"], &[(0, &["tp"])]).unwrap_err();
        assert!(matches!(e, Error::NameInSumsAndCut { .. }), "{e}");
        let e = Placement::partial(&m, &["zz"], &[]).unwrap_err();
        assert!(matches!(e, Error::UnknownMeshAxis { .. }), "{e}");
        let e = Placement::split(3, &s).unwrap().window(&[4, 4], 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nx_placement::Placement::window: split(3) cuts axis 3, so it needs a value of rank > 3, got shape [4, 4]"
        );
        let e = Placement::on(&s).window(&[4], 7).unwrap_err();
        assert!(matches!(e, Error::DeviceNotInSet { .. }), "{e}");
        let e = Placement::on(&s).holders(&[4], &[4]).unwrap_err();
        assert!(matches!(e, Error::ElementOutOfRange { .. }), "{e}");
    })
    .unwrap();
}

#[test]
fn mesh_errors() {
    use nx_mesh::Error as M;
    Devices::with(Device::sims(4), |s| {
        assert!(matches!(Mesh::new(&s, &[("a", 2), ("a", 2)]), Err(M::RepeatedAxis { .. })));
        assert!(matches!(Mesh::new(&s, &[("", 4)]), Err(M::BadAxisName { .. })));
        assert!(matches!(Mesh::new(&s, &[("a", 0), ("b", 4)]), Err(M::ZeroExtent { .. })));
        let e = Mesh::new(&s, &[("a", 3)]).unwrap_err();
        assert_eq!(e.to_string(), "nx_mesh::Mesh::new: mesh extents [3] multiply to 3, but the set has 4 devices");
        let m = Mesh::new(&s, &[("a", 2), ("b", 2)]).unwrap();
        assert!(matches!(m.index_of(&[2, 0]), Err(M::OutOfRange { .. })));
        assert!(matches!(m.group(&["c"], 0), Err(M::UnknownAxis { .. })));
        assert_eq!(m.group(&["a"], 1).unwrap(), [1, 3]);
        assert_eq!(m.group(&["b", "a"], 0).unwrap(), [0, 2, 1, 3]);
        let n = m.with_group(&["b"], 2, |g| g.to_string()).unwrap();
        assert_eq!(n, "[sim:2, sim:3]");
    })
    .unwrap();
    assert!(matches!(Devices::with(vec![], |_| ()), Err(M::EmptySet { .. })));
    let e = Devices::with(vec![Device::sim(1), Device::sim(1)], |_| ()).unwrap_err();
    assert_eq!(e.to_string(), "nx_mesh::Devices::with: device sim:1 is listed twice (at 0 and 1)");
    let e = "dp=2,tp".parse::<nx_mesh::MeshSpec>().unwrap_err();
    assert!(e.to_string().contains("column 8"), "{e}");
    assert_eq!("dp = 2, tp=4".parse::<nx_mesh::MeshSpec>().unwrap().to_string(), "dp=2,tp=4");
}

#[test]
fn spec_parse_errors_point_at_the_column() {
    for (text, col) in
        [("mush(0:a)", 1), ("split(x)", 7), ("mesh(0 a)", 8), ("mesh(0:1a)", 8), ("on on", 4), ("device(", 8)]
    {
        let e = text.parse::<PlacementSpec>().unwrap_err();
        assert!(matches!(e, Error::Parse { column, .. } if column == col), "{text}: {e}");
    }
    let spec: PlacementSpec = serde_json::from_str("\"partial(a.b; 0:c)\"").unwrap();
    assert_eq!(serde_json::to_string(&spec).unwrap(), "\"partial(a.b; 0:c)\"");
}
