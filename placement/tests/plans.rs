//! Each row of DESIGN.md's transition table issues exactly the collective it names, with exact
//! bytes, on uneven sizes (n·k+1).

use nx_placement::{plan, Device, Devices, Mesh, Op, Placement};

fn ops(p: &nx_placement::Plan) -> Vec<Op> {
    p.steps.iter().map(|s| s.op).collect()
}

#[test]
fn split_to_on_is_an_all_gather_with_variable_counts() {
    Devices::with(Device::sims(4), |s| {
        // 9 rows of 3 f32 over 4: rows 3,2,2,2
        let pl = plan(&Placement::split(0, &s).unwrap(), &Placement::on(&s), &[9, 3], 4).unwrap();
        assert_eq!(ops(&pl), [Op::AllGather]);
        assert_eq!(pl.steps[0].groups, [vec![0, 1, 2, 3]]);
        assert_eq!(pl.bytes_received(), [6 * 12, 7 * 12, 7 * 12, 7 * 12]);
        assert_eq!(pl.bytes_sent(), [3 * 12 * 3, 2 * 12 * 3, 2 * 12 * 3, 2 * 12 * 3]);
        assert_eq!(pl.floor().unwrap(), pl.bytes_received());
    })
    .unwrap();
}

#[test]
fn partial_to_closed_is_an_all_reduce_and_to_split_a_reduce_scatter() {
    Devices::with(Device::sims(6), |s| {
        let m = Mesh::new(&s, &[("dp", 2), ("tp", 3)]).unwrap();
        let part = Placement::partial(&m, &["tp"], &[]).unwrap();
        // 7 elements of 8 bytes, groups of 3: chunks 3,2,2
        let pl = plan(&part, &part.closed(), &[7], 8).unwrap();
        assert_eq!(ops(&pl), [Op::AllReduce]);
        assert_eq!(pl.steps[0].mesh_axes, ["tp"]);
        assert_eq!(pl.steps[0].groups, [vec![0, 1, 2], vec![3, 4, 5]]);
        // sent = (W - c) + (n-1)c
        assert_eq!(pl.bytes_sent(), [(4 + 6) * 8, (5 + 4) * 8, (5 + 4) * 8, (4 + 6) * 8, 72, 72]);
        assert_eq!(pl.bytes_sent(), pl.bytes_received());
        assert!(pl.floor().is_none());

        let rs = plan(&part, &Placement::mesh(&m, &[(0, &["tp"])]).unwrap(), &[7], 8).unwrap();
        assert_eq!(ops(&rs), [Op::ReduceScatter]);
        // device 0 keeps 3 of 7: sends 4, receives 2·3
        assert_eq!(rs.bytes_sent()[0], 4 * 8);
        assert_eq!(rs.bytes_received()[0], 6 * 8);
        // a target that does not tile each group's window: all-reduce, then what is left
        let other = plan(&part, &Placement::mesh(&m, &[(0, &["dp"])]).unwrap(), &[7], 8).unwrap();
        assert_eq!(ops(&other), [Op::AllReduce, Op::LocalSlice]);
    })
    .unwrap();
}

#[test]
fn split_to_split_is_an_all_to_all_and_on_to_split_a_local_slice() {
    Devices::with(Device::sims(8), |s| {
        let m = Mesh::new(&s, &[("dp", 2), ("tp", 4)]).unwrap();
        let from = Placement::mesh(&m, &[(0, &["tp"])]).unwrap();
        let to = Placement::mesh(&m, &[(1, &["tp"])]).unwrap();
        let pl = plan(&from, &to, &[4096, 4096], 4).unwrap();
        assert_eq!(ops(&pl), [Op::AllToAll]);
        assert_eq!(pl.steps[0].mesh_axes, ["tp"]);
        assert_eq!(pl.steps[0].groups, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let s_bytes = 4096u64 * 4096 * 4;
        assert!(pl.bytes_sent().iter().all(|&b| b == s_bytes * 3 / 16), "S·(n−1)/n²");
        // uneven: 9 x 5 over 4
        let pl = plan(&from, &to, &[9, 5], 4).unwrap();
        assert_eq!(ops(&pl), [Op::AllToAll]);
        assert_eq!(pl.floor().unwrap(), pl.bytes_received());

        let slice = plan(&Placement::on(&s), &to, &[9, 5], 4).unwrap();
        assert_eq!(ops(&slice), [Op::LocalSlice]);
        assert!(slice.bytes_received().iter().all(|&b| b == 0));
    })
    .unwrap();
}

#[test]
fn closed_to_partial_is_a_zero_fill_and_device_to_on_a_broadcast() {
    Devices::with(Device::sims(4), |s| {
        let m = Mesh::new(&s, &[("a", 2), ("b", 2)]).unwrap();
        let pl = plan(&Placement::on(&s), &Placement::partial(&m, &["b"], &[]).unwrap(), &[5], 4).unwrap();
        assert_eq!(ops(&pl), [Op::ZeroFill]);
        assert_eq!(pl.steps[0].groups, [vec![1, 3]]);
        assert!(pl.bytes_sent().iter().all(|&b| b == 0));

        let pl = plan(&Placement::device(&s, 2).unwrap(), &Placement::on(&s), &[5], 4).unwrap();
        assert_eq!(ops(&pl), [Op::Broadcast]);
        assert_eq!(pl.steps[0].groups, [vec![2, 3, 0, 1]]);
        assert_eq!(pl.bytes_received(), [20, 20, 0, 20]);
        assert_eq!(pl.bytes_sent(), [20, 0, 20, 20], "pipelined: each forwards once, the last none");
    })
    .unwrap();
}

#[test]
fn mixed_cuts_fall_back_to_exact_send_recv() {
    Devices::with(Device::sims(4), |s| {
        let m = Mesh::new(&s, &[("dp", 2), ("tp", 2)]).unwrap();
        // rows over dp -> rows over tp: devices (0,0) and (1,1) already hold what they need
        let pl = plan(
            &Placement::mesh(&m, &[(0, &["dp"])]).unwrap(),
            &Placement::mesh(&m, &[(0, &["tp"])]).unwrap(),
            &[9, 2],
            4,
        )
        .unwrap();
        assert_eq!(ops(&pl), [Op::SendRecv]);
        assert_eq!(pl.bytes_received(), [0, 4 * 8, 5 * 8, 0]);
        assert_eq!(pl.floor().unwrap(), pl.bytes_received());
    })
    .unwrap();
}

#[test]
fn between_two_sets_only_the_overlaps_move() {
    Devices::with(Device::sims(4), |a| {
        Devices::with((2..6).map(Device::sim).collect(), |b| {
            let pl = plan(&Placement::split(0, &a).unwrap(), &Placement::split(0, &b).unwrap(), &[8], 4).unwrap();
            // a: sim0..3 hold [0,2) [2,4) [4,6) [6,8); b: sim2..5 want the same windows in its order
            assert_eq!(pl.devices.len(), 6);
            assert_eq!(ops(&pl), [Op::SendRecv]);
            assert_eq!(pl.bytes_received(), [0, 0, 8, 8, 8, 8]);
            assert_eq!(pl.floor().unwrap(), pl.bytes_received());
            let text = pl.to_string();
            assert!(text.contains("send/recv"), "{text}");
            // the exact floor line: the floor per device, then ", reached" (", NOT reached" where missed)
            let line = "  floor (bytes the new windows need and the old lack): [0 B, 0 B, 8 B, 8 B, 8 B, 8 B], reached";
            assert!(text.lines().any(|l| l == line), "{text}");
            assert!(!text.contains("NOT reached"), "{text}");
        })
        .unwrap();
    })
    .unwrap();
}

#[test]
fn equal_placements_plan_nothing() {
    Devices::with(Device::sims(4), |s| {
        let m = Mesh::new(&s, &[("x", 4)]).unwrap();
        let pl =
            plan(&Placement::split(0, &s).unwrap(), &Placement::mesh(&m, &[(0, &["x"])]).unwrap(), &[7], 4).unwrap();
        assert!(pl.steps.is_empty());
        assert!(pl.to_string().contains("no step"));
        let e = plan(&Placement::split(2, &s).unwrap(), &Placement::on(&s), &[7], 4).unwrap_err();
        assert!(e.to_string().starts_with("nx_placement::plan: split(2) cuts axis 2"), "{e}");
    })
    .unwrap();
}

#[test]
fn a_sum_of_one_term_keeps_its_windows_and_any_other_move_does_not() {
    Devices::with(Device::sims(4), |s| {
        // axes of extent 1: a partial value over `tp` has one term a group
        let m = Mesh::new(&s, &[("dp", 4), ("tp", 1)]).unwrap();
        let one = Placement::partial(&m, &["tp"], &[]).unwrap();
        let cut = Placement::mesh(&m, &[(0, &["dp"])]).unwrap();
        let one_cut = Placement::partial(&m, &["tp"], &[(0, &["dp"])]).unwrap();
        for (from, to) in [(&one, &one.closed()), (&one_cut, &cut), (&cut, &one_cut)] {
            let pl = plan(from, to, &[9, 3], 4).unwrap();
            assert!(pl.keeps_windows(), "{from} -> {to}: {pl}");
            assert!(pl.bytes_sent().iter().chain(&pl.bytes_received()).all(|&b| b == 0));
        }
        // two terms: a sum to close; a zero fill; a slice; a gather
        let m2 = Mesh::new(&s, &[("dp", 2), ("tp", 2)]).unwrap();
        let two = Placement::partial(&m2, &["tp"], &[]).unwrap();
        let on = Placement::on(&s);
        for (from, to) in [
            (&two, &two.closed()),
            (&on, &two),
            (&on, &Placement::split(0, &s).unwrap()),
            (&Placement::split(0, &s).unwrap(), &on),
        ] {
            let pl = plan(from, to, &[9, 3], 4).unwrap();
            assert!(!pl.keeps_windows(), "{from} -> {to}: {pl}");
        }
    })
    .unwrap();
}
