//! The propagation rules as pure functions of placements and shapes: no mesh is launched.

use nx_placement::{rules, Device, Devices, Mesh, Placement};

fn with(axes: &[(&str, usize)], f: impl FnOnce(&Mesh<'static>)) {
    let n = axes.iter().map(|a| a.1).product();
    let set = Devices::unbranded(Device::sims(n)).unwrap();
    f(&Mesh::new(&set, axes).unwrap());
}

#[test]
fn contractions_reductions_and_permutations() {
    with(&[("dp", 2), ("tp", 3)], |m| {
        let p = |c: &[(usize, &[&str])]| Placement::mesh(m, c).unwrap();
        // column-parallel: rows over dp, columns over tp, no sum
        let y = rules::contract("t", &p(&[(0, &["dp"])]), &p(&[(1, &["tp"])]), 2, 2, &[], &[(1, 0)]).unwrap();
        assert!(y.equal(&p(&[(0, &["dp"]), (1, &["tp"])])));
        // row-parallel: a sum over tp
        let y =
            rules::contract("t", &p(&[(0, &["dp"]), (1, &["tp"])]), &p(&[(0, &["tp"])]), 2, 2, &[], &[(1, 0)]).unwrap();
        assert!(y.equal(&Placement::partial(m, &["tp"], &[(0, &["dp"])]).unwrap()));
        // batched: the batch pair cut alike, contracting whole
        let q = p(&[(0, &["dp"]), (1, &["tp"])]);
        let s = rules::contract("t", &q, &q, 4, 4, &[(0, 0), (1, 1)], &[(3, 3)]).unwrap();
        assert!(s.equal(&q));
        // refusals: pairs cut differently, a mesh axis cutting two result axes
        let e = rules::contract("t", &p(&[(1, &["tp"])]), &p(&[]), 2, 2, &[], &[(1, 0)]).unwrap_err().to_string();
        assert!(e.contains("the contracting axis pair (1, 0) is cut over"), "{e}");
        let e = rules::contract("t", &p(&[(0, &["tp"])]), &p(&[(1, &["tp"])]), 2, 2, &[], &[(1, 0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("would cut two axes"), "{e}");
        // a reduction of a cut axis is a sum over its mesh axes; the others shift
        let r = rules::reduce("t", &p(&[(0, &["dp"]), (2, &["tp"])]), &[0]).unwrap();
        assert!(r.equal(&Placement::partial(m, &["dp"], &[(1, &["tp"])]).unwrap()));
        let t = rules::permute("t", &p(&[(0, &["dp"]), (2, &["tp"])]), &[2, 0, 1]).unwrap();
        assert!(t.equal(&p(&[(1, &["dp"]), (0, &["tp"])])));
    });
}

#[test]
fn reshapes_keep_cuts_where_the_windows_agree() {
    with(&[("dp", 2), ("tp", 2)], |m| {
        let p = |c: &[(usize, &[&str])]| Placement::mesh(m, c).unwrap();
        // [b, t, c] with c over tp → [b, t, h, d]: the heads over tp where tp divides them
        let x = p(&[(0, &["dp"]), (2, &["tp"])]);
        let y = rules::reshape("t", &x, &[3, 5, 8], &[3, 5, 4, 2]).unwrap();
        assert!(y.equal(&p(&[(0, &["dp"]), (2, &["tp"])])));
        // and back
        let z = rules::reshape("t", &y, &[3, 5, 4, 2], &[3, 5, 8]).unwrap();
        assert!(z.equal(&x));
        // 3 heads over 2 devices: the windows of c (3, 3 of 6·… ) are not whole heads
        let e = rules::reshape("t", &x, &[3, 5, 6], &[3, 5, 3, 2]).unwrap_err().to_string();
        assert!(e.contains("without moving elements"), "{e}");
        // merging a cut axis with a whole one after it keeps the cut where blocks align
        let w = rules::reshape("t", &p(&[(0, &["dp"])]), &[4, 3], &[12]).unwrap();
        assert!(w.equal(&p(&[(0, &["dp"])])));
        let e = rules::reshape("t", &p(&[(0, &["dp"])]), &[5, 3], &[15]).unwrap_err().to_string();
        assert!(e.contains("windows"), "{e}");
        // an axis of one element inserted
        let k = rules::reshape("t", &p(&[(0, &["tp"])]), &[6], &[1, 6]).unwrap();
        assert!(k.equal(&p(&[(1, &["tp"])])));
    });
}

#[test]
fn elementwise_broadcasts_and_gathers() {
    with(&[("dp", 2), ("tp", 2)], |m| {
        let p = |c: &[(usize, &[&str])]| Placement::mesh(m, c).unwrap();
        let x = p(&[(0, &["dp"]), (2, &["tp"])]);
        // a bias over tp broadcasts to [b, t, c] with c over tp; one with copies does not
        rules::elementwise("t", &x, &[4, 3, 6], &p(&[(0, &["tp"])]), &[6]).unwrap();
        let e = rules::elementwise("t", &x, &[4, 3, 6], &p(&[]), &[6]).unwrap_err().to_string();
        assert!(e.contains("operands placed differently"), "{e}");
        // an axis of one element, whole, broadcasts along a cut one
        rules::elementwise("t", &x, &[4, 3, 6], &p(&[(0, &["dp"])]), &[4, 3, 1]).unwrap();
        // a sum and a closed value never mix
        let s = Placement::partial(m, &["tp"], &[(0, &["dp"])]).unwrap();
        assert!(rules::elementwise("t", &s, &[4, 6], &p(&[(0, &["dp"])]), &[4, 6]).is_err());
        // a gather of a table with copies by ids over dp: cut over dp
        let g = rules::gather("t", &p(&[]), 0, &p(&[(0, &["dp"])]), 2).unwrap();
        assert!(g.equal(&p(&[(0, &["dp"])])));
        let e = rules::gather("t", &p(&[(1, &["dp"])]), 0, &p(&[(0, &["dp"])]), 1).unwrap_err().to_string();
        assert!(e.contains("would cut two axes"), "{e}");
    });
}

#[test]
fn ops_along_axes_need_them_whole() {
    with(&[("dp", 2), ("tp", 3)], |m| {
        let p = |c: &[(usize, &[&str])]| Placement::mesh(m, c).unwrap();
        let x = p(&[(0, &["dp"]), (2, &["tp"])]);
        // along a whole axis: the operand's placement
        assert!(rules::along("t", &x, &[1], false).unwrap().equal(&x));
        let e = rules::along("t", &x, &[1, 2], false).unwrap_err().to_string();
        assert!(e.contains("t: axis 2 is cut over tp") && e.contains("place it whole first"), "{e}");
        // a sum: refused for a nonlinear op, kept for a linear one
        let s = Placement::partial(m, &["tp"], &[(0, &["dp"])]).unwrap();
        let e = rules::along("t", &s, &[1], false).unwrap_err().to_string();
        assert!(e.contains("a sum of terms"), "{e}");
        assert!(rules::along("t", &s, &[1], true).unwrap().equal(&s));
        // a value on one device stays there
        let d = Placement::device(m.devices(), 4).unwrap();
        assert!(rules::along("t", &d, &[0], false).unwrap().equal(&d));
    });
}

#[test]
fn attention_keeps_the_queries_placement_where_heads_group_on_every_device() {
    with(&[("dp", 2), ("tp", 2)], |m| {
        let p = |c: &[(usize, &[&str])]| Placement::mesh(m, c).unwrap();
        // [b, h, t, d]: batch over dp, heads over tp
        let q = p(&[(0, &["dp"]), (1, &["tp"])]);
        let (qs, ks) = ([4, 8, 5, 3], [4, 4, 5, 3]);
        assert!(rules::attention("t", &q, &qs, &q, &ks, &q, 1, 2).unwrap().equal(&q));
        // 8 query heads over 4 key heads, 2 ways: each device's 4 query heads are 2 whole groups
        // 6 query heads over 3 key heads cut 2 ways: heads 0..3 against key heads 0..2 (not 0..1.5)
        let e = rules::attention("t", &q, &[4, 6, 5, 3], &q, &[4, 3, 5, 3], &q, 1, 2).unwrap_err().to_string();
        assert!(e.contains("are not the groups of key heads"), "{e}");
        // rows or features cut, operands unlike, a sum: refused, naming the placements
        let rows = p(&[(2, &["tp"])]);
        let e = rules::attention("t", &rows, &qs, &rows, &ks, &rows, 1, 2).unwrap_err().to_string();
        assert!(e.contains("axis 2 is cut over tp"), "{e}");
        let e = rules::attention("t", &q, &qs, &p(&[]), &ks, &q, 1, 2).unwrap_err().to_string();
        assert!(e.contains("place them alike"), "{e}");
        let s = Placement::partial(m, &["tp"], &[]).unwrap();
        let e = rules::attention("t", &s, &qs, &s, &ks, &s, 1, 2).unwrap_err().to_string();
        assert!(e.contains("a sum of terms"), "{e}");
        // heads that do not divide
        let e = rules::attention("t", &q, &[4, 5, 5, 3], &q, &[4, 2, 5, 3], &q, 1, 2).unwrap_err().to_string();
        assert!(e.contains("heads at axis 1"), "{e}");
    });
    // 8 query heads over 4 key heads cut 3 ways: device 0 holds query heads 0..3 (a group and a
    // half) against key heads 0..2
    with(&[("tp", 3)], |m| {
        let q = Placement::mesh(m, &[(1, &["tp"])]).unwrap();
        let e = rules::attention("t", &q, &[1, 8, 5, 3], &q, &[1, 4, 5, 3], &q, 1, 2).unwrap_err().to_string();
        assert!(e.contains("query heads 0..3 are not the groups of key heads 0..2 on device 0"), "{e}");
        assert!(rules::attention("t", &q, &[1, 6, 5, 3], &q, &[1, 3, 5, 3], &q, 1, 2).unwrap().equal(&q));
    });
}
