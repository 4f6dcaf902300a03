//! Meshes: named axes with extents over a device set, major first.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Devices, Error, Result, MAX_DEVICES};

/// Named mesh axes with extents, unbranded: what a configuration file or the command line holds.
///
/// Text form `dp=2,tp=4` (`Display` and `FromStr` round-trip; any spacing is read).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshSpec {
    axes: Vec<(String, usize)>,
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl MeshSpec {
    /// Checks and returns the axes `axes` (name, extent), major first.
    ///
    /// # Errors
    /// [`Error::BadAxisName`] for a name that is not a name, [`Error::RepeatedAxis`] for a name
    /// given twice, [`Error::ZeroExtent`] for an extent of 0.
    pub fn new(axes: &[(&str, usize)]) -> Result<MeshSpec> {
        Self::check("nx_mesh::MeshSpec::new", axes.iter().map(|&(n, e)| (n.to_string(), e)).collect())
    }

    fn check(func: &'static str, axes: Vec<(String, usize)>) -> Result<MeshSpec> {
        for (i, (name, extent)) in axes.iter().enumerate() {
            if !is_name(name) {
                return Err(Error::BadAxisName { func, name: name.clone() });
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::RepeatedAxis { func, name: name.clone() });
            }
            if *extent == 0 {
                return Err(Error::ZeroExtent { func, name: name.clone() });
            }
        }
        let size = axes.iter().try_fold(1usize, |p, a| p.checked_mul(a.1));
        if size.is_none_or(|s| s > MAX_DEVICES) {
            return Err(Error::TooManyDevices { func, extents: axes.iter().map(|a| a.1).collect(), max: MAX_DEVICES });
        }
        Ok(MeshSpec { axes })
    }

    /// The axes, major first.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// The number of devices the mesh spans: the product of its extents (1 for no axes; at most
    /// [`MAX_DEVICES`], checked when the spec was made).
    pub fn size(&self) -> usize {
        self.axes.iter().map(|a| a.1).product()
    }

    /// This spec laid over `devices`.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] unless the extents multiply to the set's size.
    pub fn over<'d>(&self, devices: &Devices<'d>) -> Result<Mesh<'d>> {
        Mesh::build("nx_mesh::MeshSpec::over", devices, self.axes.clone())
    }
}

impl fmt::Display for MeshSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, e)) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}={e}")?;
        }
        Ok(())
    }
}

impl FromStr for MeshSpec {
    type Err = Error;

    /// Reads `dp=2,tp=4`.
    fn from_str(text: &str) -> Result<MeshSpec> {
        const FUNC: &str = "nx_mesh::MeshSpec::from_str";
        let err = |column: usize, why: &str| Error::Parse {
            func: FUNC,
            text: text.to_string(),
            column: column + 1,
            why: why.to_string(),
        };
        let mut axes = Vec::new();
        if text.trim().is_empty() {
            return Err(err(0, "expected axes such as dp=2,tp=4"));
        }
        let mut start = 0;
        for part in text.split(',') {
            let Some(eq) = part.find('=') else {
                return Err(err(start + part.len(), "expected '=' and an extent after the axis name"));
            };
            let name = part[..eq].trim();
            if !is_name(name) {
                let col = start + part.len() - part.trim_start().len();
                return Err(err(col, &format!("{name:?} is not an axis name")));
            }
            let ext_text = part[eq + 1..].trim();
            let extent: usize = ext_text
                .parse()
                .map_err(|_| err(start + eq + 1, &format!("{ext_text:?} is not an extent (a whole number)")))?;
            axes.push((name.to_string(), extent));
            start += part.len() + 1;
        }
        MeshSpec::check(FUNC, axes)
    }
}

/// Named axes with extents over a device set of brand `'d`, major first: over extents `e1, e2`
/// the device at `(i1, i2)` is the set's device `i1·e2 + i2`.
///
/// Cloning is cheap.
#[derive(Clone)]
pub struct Mesh<'d> {
    devices: Devices<'d>,
    axes: Arc<[(String, usize)]>,
}

impl fmt::Debug for Mesh<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mesh({self} over {})", self.devices)
    }
}

impl fmt::Display for Mesh<'_> {
    /// Prints the axes as `dp=2,tp=4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.spec(), f)
    }
}

impl<'d> Mesh<'d> {
    /// A mesh of `axes` (name, extent), major first, over `devices`.
    ///
    /// # Errors
    /// [`Error::BadAxisName`], [`Error::RepeatedAxis`], [`Error::ZeroExtent`] for bad axes;
    /// [`Error::SizeMismatch`] unless the extents multiply to the set's size.
    pub fn new(devices: &Devices<'d>, axes: &[(&str, usize)]) -> Result<Mesh<'d>> {
        let spec = MeshSpec::check("nx_mesh::Mesh::new", axes.iter().map(|&(n, e)| (n.to_string(), e)).collect())?;
        Mesh::build("nx_mesh::Mesh::new", devices, spec.axes)
    }

    fn build(func: &'static str, devices: &Devices<'d>, axes: Vec<(String, usize)>) -> Result<Mesh<'d>> {
        let extents: Vec<usize> = axes.iter().map(|a| a.1).collect();
        let product = extents.iter().product();
        if product != devices.len() {
            return Err(Error::SizeMismatch { func, extents, product, devices: devices.len() });
        }
        Ok(Mesh { devices: devices.clone(), axes: axes.into() })
    }

    /// The one-axis mesh `x=n` over a set of `n` devices: the mesh `split` cuts over.
    pub fn flat(devices: &Devices<'d>) -> Mesh<'d> {
        Mesh { devices: devices.clone(), axes: vec![("x".to_string(), devices.len())].into() }
    }

    pub(crate) fn rebrand<'e>(&self, devices: Devices<'e>) -> Mesh<'e> {
        Mesh { devices, axes: self.axes.clone() }
    }

    /// The set the mesh spans.
    pub fn devices(&self) -> &Devices<'d> {
        &self.devices
    }

    /// The unbranded axes.
    pub fn spec(&self) -> MeshSpec {
        MeshSpec { axes: self.axes.to_vec() }
    }

    /// Whether `other` has this mesh's axes (names and extents, in order): `self.spec() ==
    /// other.spec()` without building either spec.
    pub fn same_axes(&self, other: &Mesh<'_>) -> bool {
        Arc::ptr_eq(&self.axes, &other.axes) || self.axes[..] == other.axes[..]
    }

    /// The axes (name, extent), major first.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    /// The extents, major first.
    pub fn extents(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.1).collect()
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false: a mesh spans at least one device.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The position of the axis `name` among the mesh's axes.
    ///
    /// # Errors
    /// [`Error::UnknownAxis`] naming the axis and the mesh.
    pub fn axis(&self, name: &str) -> Result<usize> {
        self.axes.iter().position(|a| a.0 == name).ok_or_else(|| Error::UnknownAxis {
            func: "nx_mesh::Mesh::axis",
            name: name.to_string(),
            mesh: self.to_string(),
        })
    }

    /// The extent of the axis `name`.
    ///
    /// # Errors
    /// [`Error::UnknownAxis`] naming the axis and the mesh.
    pub fn extent(&self, name: &str) -> Result<usize> {
        Ok(self.axes[self.axis(name)?].1)
    }

    /// The coordinates of device number `index`, major first.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for an index past the set.
    pub fn coords_of(&self, index: usize) -> Result<Vec<usize>> {
        if index >= self.len() {
            return Err(Error::OutOfRange {
                func: "nx_mesh::Mesh::coords_of",
                what: "device index",
                value: vec![index],
                bound: format!("a mesh of {} devices", self.len()),
            });
        }
        let mut coords = vec![0; self.axes.len()];
        let mut rest = index;
        for (c, (_, e)) in coords.iter_mut().zip(self.axes.iter()).rev() {
            *c = rest % e;
            rest /= e;
        }
        Ok(coords)
    }

    /// The device number at `coords`, major first.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for the wrong number of coordinates or one past its extent.
    pub fn index_of(&self, coords: &[usize]) -> Result<usize> {
        let ok = coords.len() == self.axes.len() && coords.iter().zip(self.axes.iter()).all(|(c, (_, e))| c < e);
        if !ok {
            return Err(Error::OutOfRange {
                func: "nx_mesh::Mesh::index_of",
                what: "coordinates",
                value: coords.to_vec(),
                bound: format!("the mesh {self}"),
            });
        }
        Ok(coords.iter().zip(self.axes.iter()).fold(0, |acc, (c, (_, e))| acc * e + c))
    }

    /// The device numbers of the group through device `index` along the mesh axes `axes`: the
    /// devices whose coordinates differ from its own only along those axes, numbered row-major over
    /// `axes` in the order given (the first major).
    ///
    /// # Errors
    /// [`Error::UnknownAxis`] for a name the mesh lacks, [`Error::RepeatedAxis`] for a name given
    /// twice, [`Error::OutOfRange`] for an index past the set.
    pub fn group(&self, axes: &[&str], index: usize) -> Result<Vec<usize>> {
        let at: Vec<usize> = self.axis_positions("nx_mesh::Mesh::group", axes)?;
        let base = self.coords_of(index)?;
        let size: usize = at.iter().map(|&a| self.axes[a].1).product();
        let mut out = Vec::with_capacity(size);
        let mut coords = base;
        for mut k in 0..size {
            for &a in at.iter().rev() {
                let e = self.axes[a].1;
                coords[a] = k % e;
                k /= e;
            }
            out.push(self.index_of(&coords).expect("coordinates in range"));
        }
        Ok(out)
    }

    /// Positions of the named axes, checked.
    ///
    /// # Errors
    /// [`Error::UnknownAxis`] for a name the mesh lacks, [`Error::RepeatedAxis`] for a name given
    /// twice; both name `func`.
    pub fn axis_positions(&self, func: &'static str, axes: &[&str]) -> Result<Vec<usize>> {
        let mut at = Vec::with_capacity(axes.len());
        for (i, name) in axes.iter().enumerate() {
            if axes[..i].contains(name) {
                return Err(Error::RepeatedAxis { func, name: name.to_string() });
            }
            let p = self.axes.iter().position(|a| a.0 == *name).ok_or_else(|| Error::UnknownAxis {
                func,
                name: name.to_string(),
                mesh: self.to_string(),
            })?;
            at.push(p);
        }
        Ok(at)
    }

    /// Runs `body` with the group through device `index` along `axes` (see [`Mesh::group`]) as a
    /// set of its own brand, and returns what `body` returns.
    ///
    /// # Errors
    /// As [`Mesh::group`].
    pub fn with_group<R>(&self, axes: &[&str], index: usize, body: impl for<'b> FnOnce(Devices<'b>) -> R) -> Result<R> {
        let indices = self.group(axes, index)?;
        self.devices.with_subset(&indices, body)
    }
}
