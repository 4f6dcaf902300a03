//! Placement propagation rules: the placement of an op's result from its operands' placements,
//! as pure functions of placements and shapes (no mesh is launched, no byte moves).
//!
//! A placement is taken apart into [`Parts`]: its cuts (tensor axis, mesh axis names) and its sums
//! (mesh axis names); each rule maps parts to parts and [`rebuild`] lays them over the operand's
//! mesh again.
//!
//! | rule | result |
//! |---|---|
//! | [`elementwise`] | the first operand's placement, where each other operand's windows are its own (or whole along an axis of one element, which broadcasts) |
//! | [`scatter`] | the scattered axis whole; the sums of the value and the mesh axes that cut the scattered axis (and the index alike) become sums |
//! | [`insert_axis`] | the cuts shifted past a new whole axis (`stack`) |
//! | [`gather`] | the value's cuts and sums on its other axes, the index's cuts on the axes replacing the gathered one |
//! | [`contract`] | each result axis cut as its operand cuts it; contracting pairs cut alike on both sides make the result a sum over their mesh axes |
//! | [`reduce`] | the reduced axes removed; the mesh axes that cut them become sums |
//! | [`permute`] | the cuts follow their axes |
//! | [`reshape`] | each cut moves to the leading axis of its group of merged or split axes, where every device's window is the same set of elements |
//! | [`along`] | an op along axes (scans, sorts, softmax, norms, a vocabulary's maxima): the operand's placement, where those axes are whole (and the value closed, for nonlinear ops) |
//! | [`attention`] | the queries' placement, where queries, keys and values are placed alike and closed, rows and features whole, every device's query heads the groups of its key heads |
//!
//! ```
//! use nx_placement::{rules, Devices, Device, Mesh, Placement};
//! let set = Devices::unbranded(Device::sims(4)).unwrap();
//! let mesh = Mesh::new(&set, &[("dp", 2), ("tp", 2)]).unwrap();
//! // x [b, c] rows over dp, columns over tp; w [c, h] rows over tp: a sum over tp
//! let x = Placement::mesh(&mesh, &[(0, &["dp"]), (1, &["tp"])]).unwrap();
//! let w = Placement::mesh(&mesh, &[(0, &["tp"])]).unwrap();
//! let y = rules::contract("example", &x, &w, 2, 2, &[], &[(1, 0)]).unwrap();
//! assert_eq!(y.to_string(), Placement::partial(&mesh, &["tp"], &[(0, &["dp"])]).unwrap().to_string());
//! ```

use crate::{Error, Placement, PlacementSpec, Result};

/// A placement taken apart: cuts (tensor axis, mesh axis names, in order) and sums (mesh axis
/// names). `split(a)` is a cut of `a` over its flat mesh's axis `x`; `on` has neither.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parts {
    /// Tensor axis and the mesh axes cutting it.
    pub cuts: Vec<(usize, Vec<String>)>,
    /// Summed mesh axes.
    pub sums: Vec<String>,
}

impl Parts {
    /// The mesh axes cutting `axis` (empty where it is whole).
    pub fn cut_of(&self, axis: usize) -> Vec<String> {
        self.cuts.iter().find(|c| c.0 == axis).map(|c| c.1.clone()).unwrap_or_default()
    }
}

/// The parts of `p`.
///
/// # Errors
/// [`Error::Rule`] for a value held on one device (`device(k)`): it has no mesh to propagate over.
pub fn parts(func: &'static str, p: &Placement<'_>) -> Result<Parts> {
    Ok(match p.spec() {
        PlacementSpec::On => Parts::default(),
        PlacementSpec::Split(a) => Parts { cuts: vec![(a, vec!["x".to_string()])], sums: Vec::new() },
        PlacementSpec::Mesh { cuts } => Parts { cuts, sums: Vec::new() },
        PlacementSpec::Partial { sums, cuts } => Parts { cuts, sums },
        PlacementSpec::Device(_) => {
            return Err(Error::Rule {
                func,
                why: format!("{p} holds the value on one device: place it over the mesh first"),
            })
        }
    })
}

/// `parts` laid over `p`'s mesh; `on` and `split` where they are what the parts say over a flat
/// mesh, so that a result keeps the operand's spelling.
///
/// # Errors
/// The errors of [`Placement::partial`]: a mesh axis in two cuts, or both summed and cutting.
pub fn rebuild<'d>(p: &Placement<'d>, parts: &Parts) -> Result<Placement<'d>> {
    let flat = matches!(p.spec(), PlacementSpec::On | PlacementSpec::Split(_));
    if flat && parts.sums.is_empty() {
        match parts.cuts.as_slice() {
            [] => return Ok(Placement::on(p.devices())),
            [(a, n)] if n.len() == 1 => return Placement::split(*a, p.devices()),
            _ => {}
        }
    }
    let names: Vec<(usize, Vec<&str>)> =
        parts.cuts.iter().map(|(a, n)| (*a, n.iter().map(String::as_str).collect())).collect();
    let cut_refs: Vec<(usize, &[&str])> = names.iter().map(|(a, n)| (*a, n.as_slice())).collect();
    let s: Vec<&str> = parts.sums.iter().map(String::as_str).collect();
    Placement::partial(p.mesh_of(), &s, &cut_refs)
}

/// The placement of the contraction of `a` (rank `ra`) with `b` (rank `rb`) over `contracting`
/// pairs, keeping `batch` pairs: result axes are the batch pairs, then `a`'s free axes, then `b`'s,
/// each cut as its operand cuts it; contracting pairs cut over the same mesh axes on both sides
/// make the result a sum over them.
///
/// # Errors
/// [`Error::Rule`] for operands over different meshes, partial operands, a pair cut differently
/// on the two sides, or a mesh axis that would cut two result axes.
pub fn contract<'d>(
    func: &'static str,
    a: &Placement<'d>,
    b: &Placement<'d>,
    ra: usize,
    rb: usize,
    batch: &[(usize, usize)],
    contracting: &[(usize, usize)],
) -> Result<Placement<'d>> {
    let fail = |why: String| Error::Rule { func, why };
    if !a.mesh_of().same_axes(b.mesh_of()) || !a.devices().same_list(b.devices()) {
        return Err(fail(format!("operands over different meshes: {a:#} and {b:#}")));
    }
    if a.is_partial() || b.is_partial() {
        return Err(fail(format!("a partial operand ({a} · {b}): close it with place first")));
    }
    let (pa, pb) = (parts(func, a)?, parts(func, b)?);
    let differ = |what: &str, i: usize, j: usize, x: &[String], y: &[String]| {
        fail(format!("the {what} pair ({i}, {j}) is cut over {x:?} on the left ({a}) and {y:?} on the right ({b}): place one to match"))
    };
    let mut sums: Vec<String> = Vec::new();
    for &(i, j) in contracting {
        let (x, y) = (pa.cut_of(i), pb.cut_of(j));
        if x != y {
            return Err(differ("contracting axis", i, j, &x, &y));
        }
        sums.extend(x);
    }
    let mut axes: Vec<Vec<String>> = Vec::new();
    for &(i, j) in batch {
        let (x, y) = (pa.cut_of(i), pb.cut_of(j));
        if x != y {
            return Err(differ("batch", i, j, &x, &y));
        }
        axes.push(x);
    }
    let used_a: Vec<usize> = batch.iter().chain(contracting).map(|p| p.0).collect();
    let used_b: Vec<usize> = batch.iter().chain(contracting).map(|p| p.1).collect();
    axes.extend((0..ra).filter(|x| !used_a.contains(x)).map(|x| pa.cut_of(x)));
    axes.extend((0..rb).filter(|x| !used_b.contains(x)).map(|x| pb.cut_of(x)));
    let mut seen: Vec<&String> = sums.iter().collect();
    for c in axes.iter().flatten() {
        if seen.contains(&c) {
            return Err(fail(format!("{a} · {b}: mesh axis {c:?} would cut two axes of the result")));
        }
        seen.push(c);
    }
    let cuts = axes.into_iter().enumerate().filter(|(_, c)| !c.is_empty()).collect();
    rebuild(a, &Parts { cuts, sums })
}

/// The placement of a reduction of `axes` (sorted or not, each once) of a value at `p`: the axes
/// removed, the mesh axes that cut them become sums (kept sums stay).
///
/// # Errors
/// As [`parts`].
pub fn reduce<'d>(func: &'static str, p: &Placement<'d>, axes: &[usize]) -> Result<Placement<'d>> {
    if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        return Err(Error::Rule { func, why: format!("axes {axes:?} name one axis twice") });
    }
    let pp = parts(func, p)?;
    let mut out = Parts { cuts: Vec::new(), sums: pp.sums };
    for (a, names) in pp.cuts {
        if axes.contains(&a) {
            out.sums.extend(names);
        } else {
            out.cuts.push((a - axes.iter().filter(|&&x| x < a).count(), names));
        }
    }
    rebuild(p, &out)
}

/// The placement of `p` with its axes reordered (result axis `i` is axis `perm[i]`).
///
/// # Errors
/// As [`parts`]; [`Error::Rule`] where `perm` is not a permutation covering the cut axes.
pub fn permute<'d>(func: &'static str, p: &Placement<'d>, perm: &[usize]) -> Result<Placement<'d>> {
    let mut seen = vec![false; perm.len()];
    if perm.iter().any(|&x| x >= perm.len() || std::mem::replace(&mut seen[x], true)) {
        return Err(Error::Rule { func, why: format!("{perm:?} is not a permutation") });
    }
    let pp = parts(func, p)?;
    let mut cuts = Vec::with_capacity(pp.cuts.len());
    for (a, names) in pp.cuts {
        let Some(i) = perm.iter().position(|&x| x == a) else {
            return Err(Error::Rule { func, why: format!("{perm:?} does not move axis {a}, which {p} cuts") });
        };
        cuts.push((i, names));
    }
    rebuild(p, &Parts { cuts, sums: pp.sums })
}

/// Groups of axes of `from` and `to` with equal products, in order: (`from` axes, `to` axes).
fn groups(from: &[usize], to: &[usize]) -> Option<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < from.len() || j < to.len() {
        let (i0, j0) = (i, j);
        let (mut pa, mut pb) = (1u128, 1u128);
        // take at least one axis from each side where one is left, then grow the smaller
        if i < from.len() {
            pa *= from[i] as u128;
            i += 1;
        }
        if j < to.len() {
            pb *= to[j] as u128;
            j += 1;
        }
        while pa != pb {
            if pa < pb && i < from.len() {
                pa *= from[i] as u128;
                i += 1;
            } else if pb < pa && j < to.len() {
                pb *= to[j] as u128;
                j += 1;
            } else {
                return None;
            }
        }
        // trailing axes of one extent join the group
        while i < from.len() && from[i] == 1 && (j == to.len() || to[j] != 1) {
            i += 1;
        }
        while j < to.len() && to[j] == 1 && (i == from.len() || from[i] != 1) {
            j += 1;
        }
        out.push((i0..i, j0..j));
    }
    Some(out)
}

/// The flat range a window covers within a group of axes, where it is one run of C order; `None`
/// where it is not contiguous there.
fn run(w: &crate::Window, shape: &[usize], axes: std::ops::Range<usize>) -> Option<(u128, u128)> {
    let ax: Vec<usize> = axes.collect();
    if ax.iter().any(|&a| w[a].is_empty()) {
        return Some((0, 0));
    }
    // the first axis taking more than one element; those after it must be whole
    if let Some(k) = ax.iter().position(|&a| w[a].len() > 1) {
        if ax[k + 1..].iter().any(|&a| w[a].len() != shape[a]) {
            return None;
        }
    }
    let mut start = 0u128;
    for &a in &ax {
        start = start * shape[a] as u128 + w[a].start as u128;
    }
    let count: u128 = ax.iter().map(|&a| w[a].len() as u128).product();
    Some((start, start + count))
}

/// The placement of a value at `p` of shape `from` reshaped to `to` (C order): within each group
/// of axes whose extents multiply alike, the mesh axes cutting its one cut axis cut the group's
/// first axis of `to` of more than one element; the result is that placement where every device's
/// window covers the same elements as before, else an error.
///
/// # Errors
/// [`Error::Rule`] where the element counts differ, a group has two cut axes, or the windows of
/// the reshaped value would not hold the same elements (place the value first).
pub fn reshape<'d>(func: &'static str, p: &Placement<'d>, from: &[usize], to: &[usize]) -> Result<Placement<'d>> {
    let count = |s: &[usize]| s.iter().try_fold(1u128, |a, &x| a.checked_mul(x as u128));
    if count(from) != count(to) {
        return Err(Error::Rule { func, why: format!("{from:?} and {to:?} hold different numbers of elements") });
    }
    let pp = parts(func, p)?;
    if pp.cuts.is_empty() {
        return Ok(p.clone());
    }
    let fail = |why: &str| Error::Rule {
        func,
        why: format!("{from:?} at {p} cannot become {to:?} without moving elements ({why}): place it first"),
    };
    let gs = groups(from, to).ok_or_else(|| fail("no grouping of the axes"))?;
    let mut cuts = Vec::new();
    for (ga, gb) in &gs {
        let inside: Vec<&(usize, Vec<String>)> = pp.cuts.iter().filter(|c| ga.contains(&c.0)).collect();
        match inside.as_slice() {
            [] => {}
            [(_, names)] => {
                let lead = gb.clone().find(|&j| to[j] > 1).unwrap_or(gb.start);
                if gb.is_empty() {
                    return Err(fail("a cut axis vanishes"));
                }
                cuts.push((lead, names.clone()));
            }
            _ => return Err(fail("two cut axes in one group")),
        }
    }
    let q = rebuild(p, &Parts { cuts, sums: pp.sums })?;
    for d in 0..p.devices().len() {
        match (p.window(from, d)?, q.window(to, d)?) {
            (None, None) => {}
            (Some(wa), Some(wb)) => {
                for (ga, gb) in &gs {
                    let (x, y) = (run(&wa, from, ga.clone()), run(&wb, to, gb.clone()));
                    if x.is_none() || x != y {
                        return Err(fail(&format!("device {d}'s windows {wa:?} and {wb:?} differ")));
                    }
                }
            }
            _ => return Err(fail("a device would hold a window in one and none in the other")),
        }
    }
    Ok(q)
}

/// Checks that `b` (shape `sb`) can take part in an elementwise op whose result is `a`'s (shape
/// `sa`, numpy's broadcasting: `sb` aligned to the trailing axes): equal placements of one shape,
/// or, on every device, `b`'s window is `a`'s on each aligned axis — or the whole of an axis of
/// one element, which broadcasts —, neither operand a sum, or both sums alike.
///
/// # Errors
/// [`Error::Rule`] naming both placements where a device's windows differ.
pub fn elementwise(func: &'static str, a: &Placement<'_>, sa: &[usize], b: &Placement<'_>, sb: &[usize]) -> Result<()> {
    if a.equal(b) && sa == sb {
        return Ok(());
    }
    let fits = b.devices().same_list(a.devices())
        && sb.len() <= sa.len()
        && !a.is_partial()
        && !b.is_partial()
        && (0..a.devices().len()).all(|d| match (a.window(sa, d), b.window(sb, d)) {
            (Ok(Some(m)), Ok(Some(t))) => {
                let lead = m.len() - t.len();
                t.iter()
                    .enumerate()
                    .all(|(i, r)| (sb[i] == 1 && *r == (0..1)) || (*r == m[lead + i] && sb[i] == sa[lead + i]))
            }
            (Ok(None), Ok(None)) => true,
            _ => false,
        });
    if fits {
        Ok(())
    } else {
        Err(Error::Rule {
            func,
            why: format!("operands placed differently: {sa:?} at {a:#} and {sb:?} at {b:#}; place one of them first"),
        })
    }
}

/// The placement of a gather of a value at `p` along `axis` by an index of rank `index_rank` at
/// `ip`: the value's cuts (shifted past the index's axes) and sums, the index's cuts on the axes
/// that replace `axis`.
///
/// # Errors
/// [`Error::Rule`] for operands over different meshes (an index at `on` fits any), a value or
/// index on one device, a gathered axis that is cut, or a mesh axis that would cut two axes of
/// the result.
pub fn gather<'d>(
    func: &'static str,
    p: &Placement<'d>,
    axis: usize,
    ip: &Placement<'_>,
    index_rank: usize,
) -> Result<Placement<'d>> {
    let on_index = matches!(ip.spec(), PlacementSpec::On);
    if !on_index && !p.mesh_of().same_axes(ip.mesh_of()) {
        return Err(Error::Rule {
            func,
            why: format!("the value at {p} and the index at {ip} are over different meshes"),
        });
    }
    if matches!(p.spec(), PlacementSpec::Device(_)) || matches!(ip.spec(), PlacementSpec::Device(_)) {
        return Err(Error::Rule { func, why: "a value on one device: place it over the mesh first".into() });
    }
    let pp = parts(func, p)?;
    let ipp = parts(func, ip)?;
    if !pp.cut_of(axis).is_empty() {
        return Err(Error::Rule { func, why: format!("axis {axis} is cut by {p}: place it whole first") });
    }
    let mut out: Vec<(usize, Vec<String>)> = Vec::new();
    for (a, names) in pp.cuts {
        out.push((if a < axis { a } else { a + index_rank - 1 }, names));
    }
    for (j, names) in ipp.cuts {
        out.push((axis + j, names));
    }
    let mut seen: Vec<&String> = pp.sums.iter().collect();
    for (_, names) in &out {
        for n in names {
            if seen.contains(&n) {
                return Err(Error::Rule {
                    func,
                    why: format!("mesh axis {n} would cut two axes: the value at {p}, the index at {ip}"),
                });
            }
            seen.push(n);
        }
    }
    out.sort_by_key(|c| c.0);
    rebuild(p, &Parts { cuts: out, sums: pp.sums })
}

/// The placement of a scatter-add of a value at `p` along `axis` by a 1-D index at `ip` (cut as
/// `axis` is, or at `on`): `axis` whole, a sum over the mesh axes that cut it (each rank adds its
/// rows) and over `p`'s sums, the other cuts kept.
///
/// # Errors
/// [`Error::Rule`] for a value on one device, operands over different meshes, or an index cut
/// otherwise than `axis`.
pub fn scatter<'d>(func: &'static str, p: &Placement<'d>, axis: usize, ip: &Placement<'_>) -> Result<Placement<'d>> {
    if matches!(p.spec(), PlacementSpec::Device(_)) {
        return Err(Error::Rule { func, why: "a value on one device: place it over the mesh first".into() });
    }
    let icut = if matches!(ip.spec(), PlacementSpec::On) {
        Vec::new()
    } else {
        if !p.mesh_of().same_axes(ip.mesh_of()) {
            return Err(Error::Rule {
                func,
                why: format!("the value at {p} and the index at {ip} are over different meshes"),
            });
        }
        parts(func, ip)?.cut_of(0)
    };
    let pp = parts(func, p)?;
    let scut = pp.cut_of(axis);
    if scut != icut {
        return Err(Error::Rule { func, why: format!("axis {axis} of {p} and the index at {ip} are cut differently") });
    }
    let mut sums = pp.sums;
    sums.extend(scut);
    let cuts = pp.cuts.into_iter().filter(|c| c.0 != axis).collect();
    rebuild(p, &Parts { cuts, sums })
}

/// The placement of a value at `p` with a new whole axis at `axis` (`stack`): the cuts at or past
/// it shifted by one.
///
/// # Errors
/// As [`parts`].
pub fn insert_axis<'d>(func: &'static str, p: &Placement<'d>, axis: usize) -> Result<Placement<'d>> {
    if matches!(p.spec(), PlacementSpec::On | PlacementSpec::Device(_)) {
        return Ok(p.clone());
    }
    let pp = parts(func, p)?;
    let cuts = pp.cuts.into_iter().map(|(a, n)| (if a >= axis { a + 1 } else { a }, n)).collect();
    rebuild(p, &Parts { cuts, sums: pp.sums })
}

/// The placement of an op along `axes` of a value at `p` (a scan, a sort, a softmax, a norm; an
/// attention's rows and features): `p` itself, where every one of `axes` is whole and, unless
/// `partial_ok` (a linear op), the value is not a sum. A value on one device stays there.
///
/// # Errors
/// [`Error::Rule`] naming the axis and the mesh axes that cut it, or the sum, to place first.
pub fn along<'d>(func: &'static str, p: &Placement<'d>, axes: &[usize], partial_ok: bool) -> Result<Placement<'d>> {
    if !partial_ok && p.is_partial() {
        return Err(Error::Rule { func, why: format!("{p} is a sum of terms: place it closed first") });
    }
    if matches!(p.spec(), PlacementSpec::Device(_)) {
        return Ok(p.clone());
    }
    let pp = parts(func, p)?;
    for &axis in axes {
        let cut = pp.cut_of(axis);
        if !cut.is_empty() {
            return Err(Error::Rule {
                func,
                why: format!("axis {axis} is cut over {} by {p}: place it whole first", cut.join(".")),
            });
        }
    }
    Ok(p.clone())
}

/// The placement of an attention's output: queries at `q` of shape `qs`, keys at `k` of shape
/// `ks` and values at `v`, their heads along axis `heads` and rows along `rows`, features last.
/// The queries' placement (the output's, its last axis the values' features), where the three
/// are placed alike and not partial, rows and features whole, and every device's query heads
/// are the groups of its key heads (`qs[heads] / ks[heads]` query heads a key head, grouped-query
/// attention).
///
/// # Errors
/// [`Error::Rule`] naming what to place otherwise: operands placed unlike, a sum, rows or
/// features cut, a device's query heads that are not whole groups of its key heads; shapes of
/// another rank than the placements cut.
#[allow(clippy::too_many_arguments)]
pub fn attention<'d>(
    func: &'static str,
    q: &Placement<'d>,
    qs: &[usize],
    k: &Placement<'_>,
    ks: &[usize],
    v: &Placement<'_>,
    heads: usize,
    rows: usize,
) -> Result<Placement<'d>> {
    for (same, t) in [(k.equal(q), k.to_string()), (v.equal(q), v.to_string())] {
        if !same {
            return Err(Error::Rule { func, why: format!("q at {q}, an operand at {t}: place them alike") });
        }
    }
    let r = qs.len();
    if r < 3 || ks.len() != r || heads >= r || rows >= r || ks[heads] == 0 || !qs[heads].is_multiple_of(ks[heads]) {
        return Err(Error::Rule {
            func,
            why: format!("queries {qs:?} and keys {ks:?}: heads at axis {heads}, rows at {rows}"),
        });
    }
    let out = along(func, q, &[rows, r - 1], false)?;
    let group = qs[heads] / ks[heads];
    for u in 0..q.devices().len() {
        if let (Some(qw), Some(kw)) = (q.window(qs, u)?, k.window(ks, u)?) {
            let (qh, kh) = (&qw[heads], &kw[heads]);
            if qh.start != kh.start * group || qh.len() != kh.len() * group {
                return Err(Error::Rule {
                    func,
                    why: format!(
                        "query heads {qh:?} are not the groups of key heads {kh:?} on device {u}: cut the heads so each device's are whole groups"
                    ),
                });
            }
        }
    }
    Ok(out)
}
