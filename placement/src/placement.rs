//! `Placement<'d>`: where a value's elements lie over a device set of brand `'d`.

use std::fmt;

use nx_mesh::{Devices, Equal, Mesh, MAX_RANK};

use crate::region::{chunk, Window};
use crate::spec::PlacementSpec;
use crate::{Error, Result};

/// The cuts of a mesh placement: each tensor axis with the mesh axes (positions in the mesh) that
/// cut it, major first.
pub(crate) type Cuts = Vec<(usize, Vec<usize>)>;

/// Per device: the (axis, ways, number) of each axis cut more than one way, sorted (`None` for a
/// device holding nothing), and the term with its group.
type Signature = (Option<Vec<(usize, usize, usize)>>, Option<(usize, Vec<usize>)>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    On,
    Device(usize),
    Split(usize),
    Mesh { cuts: Cuts },
    Partial { sums: Vec<usize>, cuts: Cuts },
}

/// Where a value's elements lie over the device set of brand `'d`: the placement functions of
/// `reference/nx_placement.txt`.
///
/// Every placement has a mesh: [`Placement::on`], [`Placement::device`] and [`Placement::split`]
/// use the one-axis mesh `x=n` of their set ([`Mesh::flat`]). `Display` prints the text form of
/// [`PlacementSpec`]; the alternate form (`{:#}`) adds the mesh and the devices.
///
/// # Examples
///
/// ```
/// use nx_mesh::{Device, Devices, Mesh};
/// use nx_placement::Placement;
///
/// Devices::with(Device::sims(4), |set| {
///     let p = Placement::split(0, &set).unwrap();
///     let lens: Vec<usize> =
///         (0..4).map(|d| p.window(&[5], d).unwrap().unwrap()[0].len()).collect();
///     assert_eq!(lens, [2, 1, 1, 1]);
///     assert_eq!(p.to_string(), "split(0)");
/// })
/// .unwrap();
/// ```
///
/// Placements of two sets never mix without the witness of [`Placement::same`]:
///
/// ```compile_fail
/// use nx_mesh::{Device, Devices};
/// use nx_placement::Placement;
///
/// Devices::with(Device::sims(2), |a| {
///     Devices::with(Device::sims(2), |b| {
///         let mut p = Placement::on(&a);
///         p = Placement::on(&b); // a placement over `b` is not one over `a`
///     })
/// });
/// ```
#[derive(Clone)]
pub struct Placement<'d> {
    mesh: Mesh<'d>,
    form: Form,
}

impl fmt::Debug for Placement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Placement({self:#})")
    }
}

impl fmt::Display for Placement<'_> {
    /// The text form (`split(0)`, `mesh(0:dp.tp)`, …); with `{:#}`, also the mesh and devices:
    /// `mesh(0:dp) over dp=2,tp=2 [sim:0, sim:1, sim:2, sim:3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.spec())?;
        if f.alternate() {
            write!(f, " over {} {}", self.mesh, self.mesh.devices())?;
        }
        Ok(())
    }
}

fn check_axis(func: &'static str, axis: usize) -> Result<()> {
    if axis >= MAX_RANK {
        return Err(Error::AxisOutOfRange { func, axis, max_rank: MAX_RANK });
    }
    Ok(())
}

fn check_cuts(func: &'static str, mesh: &Mesh<'_>, cuts: &[(usize, &[&str])]) -> Result<Cuts> {
    let mut out: Cuts = Vec::with_capacity(cuts.len());
    let mut used: Vec<&str> = Vec::new();
    for &(axis, names) in cuts {
        check_axis(func, axis)?;
        if out.iter().any(|(a, _)| *a == axis) {
            return Err(Error::AxisInTwoCuts { func, axis });
        }
        let mut at = Vec::with_capacity(names.len());
        for &name in names {
            if used.contains(&name) {
                return Err(Error::NameInTwoCuts { func, name: name.to_string() });
            }
            used.push(name);
            at.push(mesh_axis(func, mesh, name)?);
        }
        out.push((axis, at));
    }
    Ok(out)
}

fn mesh_axis(func: &'static str, mesh: &Mesh<'_>, name: &str) -> Result<usize> {
    mesh.axes().iter().position(|a| a.0 == name).ok_or_else(|| Error::UnknownMeshAxis {
        func,
        name: name.to_string(),
        mesh: mesh.to_string(),
    })
}

impl<'d> Placement<'d> {
    /// `on s`: the whole value on every device of `devices`.
    pub fn on(devices: &Devices<'d>) -> Placement<'d> {
        Placement { mesh: Mesh::flat(devices), form: Form::On }
    }

    /// `device s d`: the whole value on the device at position `index` of `devices` alone;
    /// [`Placement::on`] where the set has that device alone.
    ///
    /// # Errors
    /// [`Error::DeviceNotInSet`] unless `index` is a position of the set.
    pub fn device(devices: &Devices<'d>, index: usize) -> Result<Placement<'d>> {
        if index >= devices.len() {
            return Err(Error::DeviceNotInSet {
                func: "nx_placement::Placement::device",
                device: format!("number {index}"),
                set: devices.to_string(),
            });
        }
        if devices.len() == 1 {
            return Ok(Placement::on(devices));
        }
        Ok(Placement { mesh: Mesh::flat(devices), form: Form::Device(index) })
    }

    /// `device s d` for a device given by identity.
    ///
    /// # Errors
    /// [`Error::DeviceNotInSet`] unless `device` is in the set.
    pub fn on_device(devices: &Devices<'d>, device: &nx_mesh::Device) -> Result<Placement<'d>> {
        let index = devices.position(device).ok_or_else(|| Error::DeviceNotInSet {
            func: "nx_placement::Placement::device",
            device: device.to_string(),
            set: devices.to_string(),
        })?;
        Placement::device(devices, index)
    }

    /// `split ~axis s`: tensor axis `axis` cut into one window per device, in order, as evenly as
    /// its extent allows (of n elements over k devices the first n mod k windows hold n/k+1, the
    /// others n/k).
    ///
    /// # Errors
    /// [`Error::AxisOutOfRange`] unless `axis` < [`MAX_RANK`].
    pub fn split(axis: usize, devices: &Devices<'d>) -> Result<Placement<'d>> {
        check_axis("nx_placement::Placement::split", axis)?;
        Ok(Placement { mesh: Mesh::flat(devices), form: Form::Split(axis) })
    }

    /// `mesh m cuts`: each tensor axis `a` of `(a, names)` cut over the mesh axes `names`, major
    /// first; mesh axes no cut names hold copies.
    ///
    /// # Errors
    /// [`Error::UnknownMeshAxis`] for a name the mesh lacks, [`Error::AxisInTwoCuts`],
    /// [`Error::NameInTwoCuts`], and [`Error::AxisOutOfRange`] for an axis not below
    /// [`MAX_RANK`].
    pub fn mesh(mesh: &Mesh<'d>, cuts: &[(usize, &[&str])]) -> Result<Placement<'d>> {
        let cuts = check_cuts("nx_placement::Placement::mesh", mesh, cuts)?;
        Ok(Placement { mesh: mesh.clone(), form: Form::Mesh { cuts } })
    }

    /// `partial m sums cuts`: `mesh m cuts` with the value a sum over the mesh axes `sums`. A
    /// device holds a term; terms are numbered row-major over `sums` in the order given, term 0
    /// first. With no sums this is [`Placement::mesh`].
    ///
    /// # Errors
    /// As [`Placement::mesh`], and [`Error::NameInSumsTwice`], [`Error::NameInSumsAndCut`].
    pub fn partial(mesh: &Mesh<'d>, sums: &[&str], cuts: &[(usize, &[&str])]) -> Result<Placement<'d>> {
        const FUNC: &str = "nx_placement::Placement::partial";
        let cuts = check_cuts(FUNC, mesh, cuts)?;
        let mut at = Vec::with_capacity(sums.len());
        for (i, &name) in sums.iter().enumerate() {
            if sums[..i].contains(&name) {
                return Err(Error::NameInSumsTwice { func: FUNC, name: name.to_string() });
            }
            let p = mesh_axis(FUNC, mesh, name)?;
            if cuts.iter().any(|(_, c)| c.contains(&p)) {
                return Err(Error::NameInSumsAndCut { func: FUNC, name: name.to_string() });
            }
            at.push(p);
        }
        let form = if at.is_empty() { Form::Mesh { cuts } } else { Form::Partial { sums: at, cuts } };
        Ok(Placement { mesh: mesh.clone(), form })
    }

    /// `closed p`: `p` where the value is no sum; `p` itself unless partial.
    pub fn closed(&self) -> Placement<'d> {
        match &self.form {
            Form::Partial { cuts, .. } => {
                Placement { mesh: self.mesh.clone(), form: Form::Mesh { cuts: cuts.clone() } }
            }
            _ => self.clone(),
        }
    }

    /// `uncut p`: every axis whole on each of `p`'s devices, mesh axes that cut one holding copies,
    /// the value no sum; `p` itself if it cuts no axis and is not partial.
    pub fn uncut(&self) -> Placement<'d> {
        let form = match &self.form {
            Form::On | Form::Device(_) => return self.clone(),
            Form::Split(_) => Form::On,
            Form::Mesh { cuts } if cuts.is_empty() => return self.clone(),
            Form::Mesh { .. } | Form::Partial { .. } => Form::Mesh { cuts: Vec::new() },
        };
        Placement { mesh: self.mesh.clone(), form }
    }

    /// `devices p`: the set.
    pub fn devices(&self) -> &Devices<'d> {
        self.mesh.devices()
    }

    /// The mesh the placement cuts over (`x=n` for `on`, `device` and `split`).
    pub fn mesh_of(&self) -> &Mesh<'d> {
        &self.mesh
    }

    /// Whether the value is a sum of terms.
    pub fn is_partial(&self) -> bool {
        matches!(self.form, Form::Partial { .. })
    }

    /// The unbranded text form.
    pub fn spec(&self) -> PlacementSpec {
        let names = |at: &[usize]| at.iter().map(|&m| self.mesh.axes()[m].0.clone()).collect();
        let cuts = |c: &Cuts| c.iter().map(|(a, at)| (*a, names(at))).collect();
        match &self.form {
            Form::On => PlacementSpec::On,
            Form::Device(k) => PlacementSpec::Device(*k),
            Form::Split(a) => PlacementSpec::Split(*a),
            Form::Mesh { cuts: c } => PlacementSpec::Mesh { cuts: cuts(c) },
            Form::Partial { sums, cuts: c } => PlacementSpec::Partial { sums: names(sums), cuts: cuts(c) },
        }
    }

    pub(crate) fn form(&self) -> &Form {
        &self.form
    }

    /// The cuts as mesh-axis positions (a `split` cuts over the flat mesh's one axis).
    pub(crate) fn cuts(&self) -> Cuts {
        match &self.form {
            Form::On | Form::Device(_) => Vec::new(),
            Form::Split(a) => vec![(*a, vec![0])],
            Form::Mesh { cuts } | Form::Partial { cuts, .. } => cuts.clone(),
        }
    }

    /// The summed mesh axes (positions), empty unless partial.
    pub(crate) fn sums(&self) -> &[usize] {
        match &self.form {
            Form::Partial { sums, .. } => sums,
            _ => &[],
        }
    }

    /// The highest tensor axis the placement cuts, if any.
    pub fn max_axis(&self) -> Option<usize> {
        match &self.form {
            Form::On | Form::Device(_) => None,
            Form::Split(a) => Some(*a),
            Form::Mesh { cuts } | Form::Partial { cuts, .. } => cuts.iter().map(|c| c.0).max(),
        }
    }

    /// Checks that a value of `shape` can lie at this placement.
    ///
    /// # Errors
    /// [`Error::RankTooSmall`] when the placement cuts an axis at or past the shape's rank.
    pub fn check_shape(&self, func: &'static str, shape: &[usize]) -> Result<()> {
        if !shape.contains(&0) && shape.iter().try_fold(1u64, |a, &n| a.checked_mul(n as u64)).is_none() {
            return Err(Error::TooManyElements { func, shape: shape.to_vec() });
        }
        match self.max_axis() {
            Some(a) if a >= shape.len() => {
                Err(Error::RankTooSmall { func, placement: self.to_string(), axis: a, shape: shape.to_vec() })
            }
            _ => Ok(()),
        }
    }

    /// Per tensor axis cut, the number of ways it is cut and device `index`'s number among them;
    /// `None` for a device that holds nothing. `index` must be below the set's size.
    pub(crate) fn cut_coords(&self, index: usize) -> Option<Vec<(usize, usize, usize)>> {
        if let Form::Device(k) = self.form {
            return (k == index).then(Vec::new);
        }
        let axes = self.mesh.axes();
        let mut out = Vec::new();
        let mut push = |axis: usize, at: &[usize]| {
            let (mut ways, mut num) = (1, 0);
            for &m in at {
                ways *= axes[m].1;
                num = num * axes[m].1 + self.coord(index, m);
            }
            out.push((axis, ways, num));
        };
        match &self.form {
            Form::On | Form::Device(_) => {}
            Form::Split(a) => push(*a, &[0]),
            Form::Mesh { cuts } | Form::Partial { cuts, .. } => {
                for (axis, at) in cuts {
                    push(*axis, at);
                }
            }
        }
        Some(out)
    }

    /// Device `index`'s coordinate along mesh axis `m` (row-major, the last axis fastest).
    fn coord(&self, index: usize, m: usize) -> usize {
        debug_assert!(index < self.mesh.len(), "device {index} of a mesh of {}", self.mesh.len());
        let axes = self.mesh.axes();
        let after: usize = axes[m + 1..].iter().map(|a| a.1).product();
        index / after % axes[m].1
    }

    /// The window of a value of `shape` that device number `index` holds: a range per tensor
    /// axis, or `None` for a device that holds nothing (`device` placements elsewhere). A window
    /// may be empty where an axis has fewer elements than it is cut ways.
    ///
    /// # Errors
    /// [`Error::RankTooSmall`] when the placement cuts an axis past the shape's rank;
    /// [`Error::DeviceNotInSet`] for an index past the set.
    pub fn window(&self, shape: &[usize], index: usize) -> Result<Option<Window>> {
        self.check_shape("nx_placement::Placement::window", shape)?;
        self.check_index("nx_placement::Placement::window", index)?;
        Ok(self.window_unchecked(shape, index))
    }

    pub(crate) fn window_unchecked(&self, shape: &[usize], index: usize) -> Option<Window> {
        let cut = self.cut_coords(index)?;
        let mut w: Window = shape.iter().map(|&n| 0..n).collect();
        for (axis, ways, num) in cut {
            w[axis] = chunk(shape[axis], ways, num);
        }
        Some(w)
    }

    fn check_index(&self, func: &'static str, index: usize) -> Result<()> {
        if index >= self.devices().len() {
            return Err(Error::DeviceNotInSet {
                func,
                device: format!("number {index}"),
                set: self.devices().to_string(),
            });
        }
        Ok(())
    }

    /// Every device's window of a value of `shape`, in set order.
    ///
    /// # Errors
    /// [`Error::RankTooSmall`] when the placement cuts an axis past the shape's rank.
    pub fn windows(&self, shape: &[usize]) -> Result<Vec<Option<Window>>> {
        self.check_shape("nx_placement::Placement::windows", shape)?;
        Ok((0..self.devices().len()).map(|d| self.window_unchecked(shape, d)).collect())
    }

    /// The term device number `index` holds of a partial value (row-major over the sums, term 0
    /// first), or `None` if the value is no sum.
    ///
    /// # Errors
    /// [`Error::DeviceNotInSet`] for an index past the set.
    pub fn term(&self, index: usize) -> Result<Option<usize>> {
        self.check_index("nx_placement::Placement::term", index)?;
        Ok(self.term_unchecked(index))
    }

    pub(crate) fn term_unchecked(&self, index: usize) -> Option<usize> {
        let Form::Partial { sums, .. } = &self.form else { return None };
        let axes = self.mesh.axes();
        Some(sums.iter().fold(0, |t, &m| t * axes[m].1 + self.coord(index, m)))
    }

    /// The number of terms of a partial value (1 if it is no sum).
    pub fn terms(&self) -> usize {
        let extents = self.mesh.extents();
        self.sums().iter().map(|&m| extents[m]).product()
    }

    /// The devices of device `index`'s group of a partial value: those differing from it only
    /// along the sums, in term order; `[index]` if the value is no sum.
    ///
    /// # Errors
    /// [`Error::DeviceNotInSet`] for an index past the set.
    pub fn sum_group(&self, index: usize) -> Result<Vec<usize>> {
        self.check_index("nx_placement::Placement::sum_group", index)?;
        Ok(self.group_along(self.sums(), index))
    }

    /// The devices differing from `index` only along the mesh axes at positions `axes`, numbered
    /// row-major over `axes` in the order given.
    pub(crate) fn group_along(&self, axes: &[usize], index: usize) -> Vec<usize> {
        let names: Vec<&str> = axes.iter().map(|&m| self.mesh.axes()[m].0.as_str()).collect();
        self.mesh.group(&names, index).expect("axes and index of this mesh")
    }

    /// The device numbers holding the element at `element` of a value of `shape` (every term, for
    /// a partial value).
    ///
    /// # Errors
    /// [`Error::RankTooSmall`] as [`Placement::window`]; [`Error::ElementOutOfRange`] unless
    /// `element` is an index into `shape`.
    pub fn holders(&self, shape: &[usize], element: &[usize]) -> Result<Vec<usize>> {
        const FUNC: &str = "nx_placement::Placement::holders";
        self.check_shape(FUNC, shape)?;
        if element.len() != shape.len() || element.iter().zip(shape).any(|(i, n)| i >= n) {
            return Err(Error::ElementOutOfRange { func: FUNC, element: element.to_vec(), shape: shape.to_vec() });
        }
        Ok((0..self.devices().len())
            .filter(|&d| {
                self.window_unchecked(shape, d).is_some_and(|w| w.iter().zip(element).all(|(r, i)| r.contains(i)))
            })
            .collect())
    }

    /// `equal p q`: `p` and `q` are of one set and every device holds the same window, and the
    /// same term of a partial value, whatever the shape and whatever their brands.
    pub fn equal<'e>(&self, other: &Placement<'e>) -> bool {
        if !self.devices().same_list(other.devices()) {
            return false;
        }
        if self.same_spelling(other) {
            return true;
        }
        (0..self.devices().len()).all(|d| self.signature(d) == other.signature(d))
    }

    /// Whether `other` is this placement written the same way over a mesh of the same axes
    /// (`self.spec() == other.spec()` with equal meshes), checked without building either spec.
    /// Placements so spelled over one device set are [`Placement::equal`]; equal ones may be
    /// spelled otherwise (`split(0)` and `mesh(0:x)`).
    pub fn same_spelling<'e>(&self, other: &Placement<'e>) -> bool {
        self.form == other.form && self.mesh.same_axes(&other.mesh)
    }

    /// What decides device `d`'s window for any shape, and its term and group.
    fn signature(&self, d: usize) -> Signature {
        let cut = self.cut_coords(d).map(|c| {
            let mut c: Vec<_> = c.into_iter().filter(|&(_, ways, _)| ways > 1).collect();
            c.sort_unstable();
            c
        });
        let term = self.term_unchecked(d).map(|t| {
            let mut g = self.group_along(self.sums(), d);
            g.sort_unstable();
            (t, g)
        });
        (cut, term)
    }

    /// `same p q`: `Some` witness iff `p` and `q` are of one set, whatever they cut; the witness
    /// reads values of one brand at the other ([`Placement::cast`]).
    pub fn same<'e>(p: &Placement<'d>, q: &Placement<'e>) -> Option<Equal<'d, 'e>> {
        p.devices().same(q.devices())
    }

    /// This placement read at brand `'e`, given the proof that both brands name one set.
    pub fn cast<'e>(&self, proof: Equal<'d, 'e>) -> Placement<'e> {
        Placement { mesh: proof.mesh(&self.mesh), form: self.form.clone() }
    }
}
