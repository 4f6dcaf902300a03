//! Property tests of the placement algebra and of plans, over random meshes (1–3 axes, extents
//! 1–4), shapes (with 0 and 1 extents, and fewer elements than ways) and placements.

use nx_placement::{plan, region, Devices, Mesh, MeshSpec, Op, Placement, PlacementSpec};
use proptest::prelude::*;

/// A random placement spec over a mesh of `axes` mesh axes and a value of `rank` tensor axes, from
/// the choice bytes `c`.
fn spec_from(c: &[u8], mesh: &MeshSpec, rank: usize) -> PlacementSpec {
    let names: Vec<String> = mesh.axes().iter().map(|a| a.0.clone()).collect();
    let n = mesh.size();
    match c[0] % 8 {
        0 => PlacementSpec::On,
        1 => PlacementSpec::Device(c[1] as usize % n),
        2 if rank > 0 => PlacementSpec::Split(c[1] as usize % rank),
        _ => {
            // each mesh axis: copies, a sum, or a cut of some tensor axis; shuffled order
            let mut order: Vec<usize> = (0..names.len()).collect();
            order.sort_by_key(|&i| c[2 + i]);
            let mut cuts: Vec<(usize, Vec<String>)> = Vec::new();
            let mut sums = Vec::new();
            for &m in &order {
                let role = c[6 + m] as usize % (rank + 2);
                if role == rank {
                    continue;
                } else if role == rank + 1 {
                    if c[0] % 8 >= 5 {
                        sums.push(names[m].clone());
                    }
                } else if let Some(cut) = cuts.iter_mut().find(|(a, _)| *a == role) {
                    cut.1.push(names[m].clone());
                } else {
                    cuts.push((role, vec![names[m].clone()]));
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

fn arb_case() -> impl Strategy<Value = (MeshSpec, Vec<usize>, Vec<u8>, Vec<u8>)> {
    (
        prop::collection::vec(1usize..=4, 1..=3),
        prop::collection::vec(prop_oneof![Just(0usize), Just(1), 2usize..=9], 0..=3),
        prop::collection::vec(any::<u8>(), 10),
        prop::collection::vec(any::<u8>(), 10),
    )
        .prop_map(|(ext, shape, a, b)| {
            let names = ["dp", "tp", "pp"];
            let axes: Vec<(&str, usize)> = ext.iter().enumerate().map(|(i, &e)| (names[i], e)).collect();
            (MeshSpec::new(&axes).unwrap(), shape, a, b)
        })
}

fn with_placements<R>(mesh: &MeshSpec, specs: &[&PlacementSpec], f: impl for<'d> FnOnce(&[Placement<'d>]) -> R) -> R {
    Devices::with(nx_placement::Device::sims(mesh.size()), |s| {
        let m: Mesh<'_> = mesh.over(&s).unwrap();
        let ps: Vec<Placement<'_>> = specs.iter().map(|sp| sp.over(&m).unwrap()).collect();
        f(&ps)
    })
    .unwrap()
}

/// A window as (start, end) per tensor axis. The windows below are computed from the reference's
/// rules alone, independently of the library's `region` and `Placement::window`.
type Boxes = Vec<(usize, usize)>;

/// Window `i` of `n` elements cut `k` ways: windows i < n mod k hold n/k + 1 elements, the others
/// n/k, in order from 0.
fn cut(n: usize, k: usize, i: usize) -> (usize, usize) {
    let len = |j: usize| n / k + usize::from(j < n % k);
    let start: usize = (0..i).map(len).sum();
    (start, start + len(i))
}

/// Device `d`'s coordinates on a mesh of `extents`, row-major (the last axis fastest).
fn coords(extents: &[usize], d: usize) -> Vec<usize> {
    (0..extents.len()).map(|j| d / extents[j + 1..].iter().product::<usize>() % extents[j]).collect()
}

/// The window device `d` holds of a value of `shape` at `spec` over a mesh of named `axes`
/// (`on`, `device` and `split` over the flat mesh of all the mesh's devices); `None` for none.
fn window_of(spec: &PlacementSpec, axes: &[(String, usize)], shape: &[usize], d: usize) -> Option<Boxes> {
    let whole: Boxes = shape.iter().map(|&n| (0, n)).collect();
    let devices: usize = axes.iter().map(|a| a.1).product();
    let cuts = match spec {
        PlacementSpec::On => return Some(whole),
        PlacementSpec::Device(k) => return (*k == d).then_some(whole),
        PlacementSpec::Split(a) => {
            let mut w = whole;
            w[*a] = cut(shape[*a], devices, d);
            return Some(w);
        }
        PlacementSpec::Mesh { cuts } | PlacementSpec::Partial { cuts, .. } => cuts,
    };
    let extents: Vec<usize> = axes.iter().map(|a| a.1).collect();
    let c = coords(&extents, d);
    let at = |name: &String| axes.iter().position(|a| &a.0 == name).expect("a mesh axis");
    let mut w = whole;
    for (axis, names) in cuts {
        // mixed radix over the cut's mesh axes, the first major
        let (ways, num) =
            names.iter().fold((1, 0), |(k, i), name| (k * extents[at(name)], i * extents[at(name)] + c[at(name)]));
        w[*axis] = cut(shape[*axis], ways, num);
    }
    Some(w)
}

/// Whether device `d` holds term 0 of `spec` (every device does of a value that is no sum).
fn holds_term_0(spec: &PlacementSpec, axes: &[(String, usize)], d: usize) -> bool {
    let PlacementSpec::Partial { sums, .. } = spec else { return true };
    let extents: Vec<usize> = axes.iter().map(|a| a.1).collect();
    let c = coords(&extents, d);
    sums.iter().all(|name| c[axes.iter().position(|a| &a.0 == name).expect("a mesh axis")] == 0)
}

fn elements(w: &Boxes) -> u64 {
    w.iter().map(|&(a, b)| (b - a) as u64).product()
}

/// The elements of `new` that `old` lacks.
fn lacking(old: &Option<Boxes>, new: &Option<Boxes>) -> u64 {
    match (old, new) {
        (_, None) => 0,
        (None, Some(n)) => elements(n),
        (Some(o), Some(n)) => {
            let common: u64 =
                o.iter().zip(n).map(|(&(a, b), &(c, d))| d.min(b).saturating_sub(c.max(a)) as u64).product();
            elements(n) - common
        }
    }
}

/// The mesh's axes: (name, extent), major first.
fn named(mesh: &MeshSpec) -> Vec<(String, usize)> {
    mesh.axes().to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20000))]

    #[test]
    fn windows_tile_each_copy_group_once((mesh, shape, a, _b) in arb_case()) {
        let spec = spec_from(&a, &mesh, shape.len());
        with_placements(&mesh, &[&spec], |ps| {
            let p = &ps[0];
            let total: u64 = shape.iter().map(|&n| n as u64).product();
            let n = p.devices().len();
            let windows = p.windows(&shape).unwrap();
            // Copy classes: devices that agree on the mesh axes that neither cut nor sum; each
            // class tiles every term of the value exactly once.
            let m = p.mesh_of();
            let copy_axes: Vec<usize> = match &spec {
                PlacementSpec::On => vec![0],
                PlacementSpec::Device(_) | PlacementSpec::Split(_) => vec![],
                PlacementSpec::Mesh { cuts } | PlacementSpec::Partial { cuts, .. } => {
                    let sums = match &spec { PlacementSpec::Partial { sums, .. } => sums.clone(), _ => vec![] };
                    (0..m.rank()).filter(|&i| {
                        let name = &m.axes()[i].0;
                        !sums.contains(name) && !cuts.iter().any(|(_, c)| c.contains(name))
                    }).collect()
                }
            };
            let mut classes: std::collections::BTreeMap<Vec<usize>, Vec<usize>> = Default::default();
            for d in 0..n {
                let c = m.coords_of(d).unwrap();
                classes.entry(copy_axes.iter().map(|&i| c[i]).collect()).or_default().push(d);
            }
            let classes: Vec<Vec<usize>> = classes.into_values().collect();
            let terms = p.terms();
            for class in &classes {
                for t in 0..terms {
                    let members: Vec<usize> = class.iter().copied()
                        .filter(|&d| p.term(d).unwrap().unwrap_or(0) == t && windows[d].is_some()).collect();
                    if members.is_empty() { continue; }
                    let vol: u64 = members.iter().map(|&d| region::volume(windows[d].as_ref().unwrap())).sum();
                    prop_assert_eq!(vol, total, "copy class {:?} term {} of {} over {} shape {:?}", class, t, p, mesh, shape);
                    for (i, &x) in members.iter().enumerate() {
                        for &y in &members[i + 1..] {
                            prop_assert!(region::intersect(windows[x].as_ref().unwrap(), windows[y].as_ref().unwrap()).is_none()
                                || region::volume(windows[x].as_ref().unwrap()) == 0);
                        }
                    }
                }
            }
            // every element has a holder, and holders agree with windows
            if total > 0 {
                let elem: Vec<usize> = shape.iter().map(|&k| k / 2).collect();
                let holders = p.holders(&shape, &elem).unwrap();
                prop_assert!(!holders.is_empty());
            }
            // balance: extents along an axis differ by at most one; empty only where n < k
            for axis in 0..shape.len() {
                let lens: Vec<usize> = windows.iter().flatten().map(|w| w[axis].len()).collect();
                let (lo, hi) = (lens.iter().min().copied().unwrap_or(0), lens.iter().max().copied().unwrap_or(0));
                prop_assert!(hi - lo <= 1, "{} over {} shape {:?}: {:?}", p, mesh, shape, lens);
                if shape[axis] >= n {
                    prop_assert!(lo > 0, "no empty window while n >= k");
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn text_round_trips((mesh, shape, a, _b) in arb_case()) {
        let spec = spec_from(&a, &mesh, shape.len());
        let text = spec.to_string();
        prop_assert_eq!(text.parse::<PlacementSpec>().unwrap(), spec.clone());
        let spaced = text.replace(':', " : ").replace('(', " ( ").replace(',', " ,  ");
        prop_assert_eq!(spaced.parse::<PlacementSpec>().unwrap(), spec.clone());
        let back = with_placements(&mesh, &[&spec], |ps| ps[0].spec());
        // `device s d` is `on s` where s has d alone.
        let want = if mesh.size() == 1 && matches!(spec, PlacementSpec::Device(_)) { "on".to_string() } else { text };
        prop_assert_eq!(back.to_string(), want);
        prop_assert_eq!(mesh.to_string().parse::<MeshSpec>().unwrap(), mesh);
    }

    #[test]
    fn plans_receive_exactly_the_floor((mesh, shape, a, b) in arb_case(), elem in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)]) {
        let from = spec_from(&a, &mesh, shape.len());
        let to = spec_from(&b, &mesh, shape.len());
        with_placements(&mesh, &[&from, &to], |ps| {
            let pl = plan(&ps[0], &ps[1], &shape, elem).unwrap();
            let n = ps[0].devices().len();
            for s in &pl.steps {
                prop_assert_eq!(s.bytes_sent.len(), n);
                let sent: u64 = s.bytes_sent.iter().sum();
                let recv: u64 = s.bytes_received.iter().sum();
                prop_assert_eq!(sent, recv, "every byte sent is received: {}", pl);
            }
            // The floor, from the windows alone: each device's new window less its old one. A partial
            // source is first closed by a reduction, whose bytes no window difference gives: no
            // floor. A partial target's devices of terms other than 0 get zeros: they need nothing.
            let axes = named(&mesh);
            let old: Vec<Option<Boxes>> = (0..n).map(|d| window_of(&from, &axes, &shape, d)).collect();
            let new: Vec<Option<Boxes>> = (0..n).map(|d| window_of(&to, &axes, &shape, d)).collect();
            let partial = |s: &PlacementSpec| matches!(s, PlacementSpec::Partial { .. });
            let floor: Vec<u64> = (0..n).map(|d| lacking(&old[d], &new[d]) * elem as u64).collect();
            if partial(&from) || partial(&to) {
                prop_assert_eq!(pl.floor(), None, "{}", pl);
            } else {
                prop_assert_eq!(pl.floor(), Some(&floor[..]), "{}", pl);
                prop_assert_eq!(pl.bytes_received(), floor.clone(), "{}", pl);
            }
            if !partial(&from) {
                let need: Vec<u64> = (0..n)
                    .map(|d| if holds_term_0(&to, &axes, d) { lacking(&old[d], &new[d]) * elem as u64 } else { 0 })
                    .collect();
                prop_assert_eq!(pl.bytes_received(), need, "{}", pl);
            }
            if ps[0].equal(&ps[1]) {
                prop_assert!(pl.steps.is_empty(), "{}", pl);
            }
            if ps[0].is_partial() && !ps[0].equal(&ps[1]) {
                prop_assert!(matches!(pl.steps[0].op, Op::AllReduce | Op::ReduceScatter), "{}", pl);
            }
            if ps[1].is_partial() && !ps[0].equal(&ps[1]) {
                prop_assert_eq!(pl.steps.last().unwrap().op, Op::ZeroFill);
            }
            let _ = pl.to_string();
            Ok(())
        })?;
    }

    #[test]
    // keeps_windows only where no element changes; and, for placements that are no sum of
    // several terms, wherever every window stays
    fn a_plan_keeps_its_windows_only_where_no_element_changes((mesh, shape, a, b) in arb_case()) {
        let from = spec_from(&a, &mesh, shape.len());
        let to = spec_from(&b, &mesh, shape.len());
        with_placements(&mesh, &[&from, &to], |ps| {
            let pl = plan(&ps[0], &ps[1], &shape, 4).unwrap();
            let n = ps[0].devices().len();
            let axes = named(&mesh);
            // the reference's windows alone: every device's window the same at both placements
            let same = (0..n).all(|d| window_of(&from, &axes, &shape, d) == window_of(&to, &axes, &shape, d));
            // a sum of more than one term a group (its closing or a zero fill changes elements)
            let terms = |s: &PlacementSpec| match s {
                PlacementSpec::Partial { sums, .. } => {
                    sums.iter().map(|m| axes.iter().find(|a| &a.0 == m).expect("a mesh axis").1).product()
                }
                _ => 1usize,
            };
            if pl.keeps_windows() {
                prop_assert!(same, "{}", pl);
                prop_assert!(pl.bytes_sent().iter().chain(&pl.bytes_received()).all(|&x| x == 0), "{}", pl);
            }
            if same && terms(&from) == 1 && terms(&to) == 1 {
                prop_assert!(pl.keeps_windows(), "{}", pl);
            }
            // the spelling: the same spec over one mesh, and then equal
            prop_assert_eq!(ps[0].same_spelling(&ps[1]), ps[0].spec() == ps[1].spec());
            if ps[0].same_spelling(&ps[1]) {
                prop_assert!(ps[0].equal(&ps[1]) && pl.steps.is_empty() && pl.keeps_windows(), "{}", pl);
            }
            Ok(())
        })?;
    }

    #[test]
    fn plans_between_two_sets_receive_the_floor((mesh, shape, a, b) in arb_case(), extra in 1usize..3) {
        let from = spec_from(&a, &mesh, shape.len());
        let n = mesh.size();
        // `to` lies over the last devices of `from`'s set and `extra` new ones.
        let keep = n.div_ceil(2);
        let to_list: Vec<_> = (n - keep..n + extra).map(nx_placement::Device::sim).collect();
        let to_spec = spec_from(&b, &MeshSpec::new(&[("x", to_list.len())]).unwrap(), shape.len());
        Devices::with(nx_placement::Device::sims(n), |s| {
            Devices::with(to_list.clone(), |t| {
                let m = mesh.over(&s).unwrap();
                let p = from.over(&m).unwrap();
                let q = to_spec.over(&Mesh::flat(&t)).unwrap();
                let pl = plan(&p, &q, &shape, 4).unwrap();
                prop_assert_eq!(pl.devices.len(), n + extra);
                // The floor from the windows alone (as above): the plan's devices are `from`'s set,
                // then `to`'s new ones; `to`'s device j is the plan's n - keep + j.
                let (axes, flat) = (named(&mesh), named(&MeshSpec::new(&[("x", to_list.len())]).unwrap()));
                let partial = |s: &PlacementSpec| matches!(s, PlacementSpec::Partial { .. });
                let old = |u: usize| if u < n { window_of(&from, &axes, &shape, u) } else { None };
                let new = |u: usize| if u >= n - keep { window_of(&to_spec, &flat, &shape, u - (n - keep)) } else { None };
                let floor: Vec<u64> = (0..n + extra).map(|u| lacking(&old(u), &new(u)) * 4).collect();
                if partial(&from) || partial(&to_spec) {
                    prop_assert_eq!(pl.floor(), None, "{}", pl);
                } else {
                    prop_assert_eq!(pl.floor(), Some(&floor[..]), "{}", pl);
                    prop_assert_eq!(pl.bytes_received(), floor.clone(), "{}", pl);
                }
                if !partial(&from) {
                    let term_0 = |u: usize| u < n - keep || holds_term_0(&to_spec, &flat, u - (n - keep));
                    let need: Vec<u64> = (0..n + extra).map(|u| if term_0(u) { floor[u] } else { 0 }).collect();
                    prop_assert_eq!(pl.bytes_received(), need, "{}", pl);
                }
                Ok(())
            }).unwrap()
        }).unwrap()?;
    }
}
