//! Device sets and meshes for nx, branded per device set.
//!
//! A [`Device`] is an identity: its kind (`sim`, `cpu`, `cuda`), its ordinal and the rank that
//! owns it. A [`Devices<'d>`] is an ordered set of devices without repeats, branded by a
//! *generative lifetime* `'d`: every set is opened by [`Devices::with`], whose closure receives a
//! brand that no other set shares, so values laid over one set cannot be mixed with values laid
//! over another without a run-time witness (see `nx_placement::Placement::same`).
//!
//! A [`Mesh<'d>`] names axes with extents over a set, major first: over extents `e1, e2` the
//! device at coordinates `(i1, i2)` is the set's device number `i1·e2 + i2`.
//!
//! ```
//! use nx_mesh::{Device, Devices, Mesh};
//!
//! let n = Devices::with(Device::sims(6), |devices| {
//!     let mesh = Mesh::new(&devices, &[("dp", 2), ("tp", 3)]).unwrap();
//!     assert_eq!(mesh.index_of(&[1, 2]).unwrap(), 5);
//!     assert_eq!(mesh.coords_of(4).unwrap(), vec![1, 1]);
//!     mesh.len()
//! })
//! .unwrap();
//! assert_eq!(n, 6);
//! ```
//!
//! Two brands never mix:
//!
//! ```compile_fail
//! use nx_mesh::{Device, Devices, Mesh};
//!
//! Devices::with(Device::sims(2), |a| {
//!     Devices::with(Device::sims(2), |b| {
//!         let m = Mesh::new(&a, &[("x", 2)]).unwrap();
//!         // A mesh over `a` is not a mesh over `b`: this does not compile.
//!         let _n: nx_mesh::Mesh<'_> = if true { m } else { Mesh::new(&b, &[("x", 2)]).unwrap() };
//!     })
//! });
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

mod mesh;
pub use mesh::{Mesh, MeshSpec};

/// The errors of this crate. Each message names the function and the offending values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A device set was given no devices.
    #[error("{func}: a device set needs at least one device")]
    EmptySet {
        /// The function called.
        func: &'static str,
    },
    /// A device set lists one device twice.
    #[error("{func}: device {device} is listed twice (at {first} and {second})")]
    RepeatedDevice {
        /// The function called.
        func: &'static str,
        /// The repeated device.
        device: Device,
        /// Its first position.
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// A device is not in the set.
    #[error("{func}: device {device} is not in the set {set}")]
    NotInSet {
        /// The function called.
        func: &'static str,
        /// The device asked for.
        device: Device,
        /// The set, printed.
        set: String,
    },
    /// A mesh axis name is empty or malformed.
    #[error("{func}: mesh axis name {name:?} is not a name (letters, digits and '_', not starting with a digit)")]
    BadAxisName {
        /// The function called.
        func: &'static str,
        /// The offending name.
        name: String,
    },
    /// A mesh axis name appears twice.
    #[error("{func}: mesh axis {name:?} is named twice")]
    RepeatedAxis {
        /// The function called.
        func: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A mesh axis has extent zero.
    #[error("{func}: mesh axis {name:?} has extent 0")]
    ZeroExtent {
        /// The function called.
        func: &'static str,
        /// The axis.
        name: String,
    },
    /// A mesh of more devices than [`MAX_DEVICES`] (or than `usize` counts).
    #[error("{func}: mesh extents {extents:?} multiply past the most devices a mesh spans, {max}")]
    TooManyDevices {
        /// The function called.
        func: &'static str,
        /// The extents given.
        extents: Vec<usize>,
        /// [`MAX_DEVICES`].
        max: usize,
    },
    /// The mesh's extents do not multiply to the set's size.
    #[error("{func}: mesh extents {extents:?} multiply to {product}, but the set has {devices} devices")]
    SizeMismatch {
        /// The function called.
        func: &'static str,
        /// The extents given.
        extents: Vec<usize>,
        /// Their product.
        product: usize,
        /// The set's size.
        devices: usize,
    },
    /// A mesh axis name the mesh lacks.
    #[error("{func}: the mesh {mesh} has no axis {name:?}")]
    UnknownAxis {
        /// The function called.
        func: &'static str,
        /// The name asked for.
        name: String,
        /// The mesh, printed.
        mesh: String,
    },
    /// A coordinate or index out of range.
    #[error("{func}: {what} {value:?} is out of range for {bound}")]
    OutOfRange {
        /// The function called.
        func: &'static str,
        /// What was out of range.
        what: &'static str,
        /// The value given.
        value: Vec<usize>,
        /// The range, in words.
        bound: String,
    },
    /// Malformed mesh text.
    #[error("{func}: cannot read {text:?} at column {column}: {why}")]
    Parse {
        /// The function called.
        func: &'static str,
        /// The text given.
        text: String,
        /// The 1-based column of the problem.
        column: usize,
        /// What was wrong.
        why: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kind of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A simulated device: host memory, driven by a thread of this process.
    Sim,
    /// A host CPU device, driven by its own process (MPI ranks).
    Cpu,
    /// A CUDA GPU.
    Cuda,
}

impl DeviceKind {
    /// The kind's name as printed: `sim`, `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Sim => "sim",
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// Whether memory of this kind is host memory a CPU kernel can read.
    pub fn is_host(self) -> bool {
        !matches!(self, DeviceKind::Cuda)
    }
}

/// A device: an identity, not a handle. Two devices are equal when kind, ordinal and owning rank
/// are.
///
/// `Display` prints `kind:ordinal` (`sim:3`, `cpu:0`, `cuda:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Device {
    /// What kind of device.
    pub kind: DeviceKind,
    /// Its ordinal among devices of its kind on its host (or in its simulated world).
    pub ordinal: usize,
    /// The rank that drives it.
    pub rank: usize,
}

impl Device {
    /// A device of `kind` with `ordinal`, driven by `rank`.
    pub fn new(kind: DeviceKind, ordinal: usize, rank: usize) -> Device {
        Device { kind, ordinal, rank }
    }

    /// Simulated device `i`, driven by rank `i`.
    pub fn sim(i: usize) -> Device {
        Device::new(DeviceKind::Sim, i, i)
    }

    /// Simulated devices `0..n`, each driven by the rank of its number.
    pub fn sims(n: usize) -> Vec<Device> {
        (0..n).map(Device::sim).collect()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.ordinal)
    }
}

/// The brand of a device set: an invariant lifetime.
pub type Brand<'d> = PhantomData<fn(&'d ()) -> &'d ()>;

/// An ordered set of devices without repeats, branded by the generative lifetime `'d`.
///
/// Cloning is cheap (the list is shared). Open one with [`Devices::with`]; a sub-set gets its own
/// brand through [`Devices::with_subset`].
#[derive(Clone)]
pub struct Devices<'d> {
    list: Arc<[Device]>,
    brand: Brand<'d>,
}

impl fmt::Debug for Devices<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Devices{self}")
    }
}

impl fmt::Display for Devices<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.list.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

fn check_devices(func: &'static str, list: &[Device]) -> Result<()> {
    if list.is_empty() {
        return Err(Error::EmptySet { func });
    }
    let mut seen = std::collections::HashMap::with_capacity(list.len());
    for (i, d) in list.iter().enumerate() {
        if let Some(first) = seen.insert(*d, i) {
            return Err(Error::RepeatedDevice { func, device: *d, first, second: i });
        }
    }
    Ok(())
}

impl Devices<'static> {
    /// Checks `list` and returns it as a set without a fresh brand.
    ///
    /// Use this where a set's values never meet another set's (a command-line tool, a test of one
    /// set). Programs with several sets use [`Devices::with`], which brands each apart.
    ///
    /// # Errors
    /// [`Error::EmptySet`] for no devices, [`Error::RepeatedDevice`] for a device listed twice.
    pub fn unbranded(list: Vec<Device>) -> Result<Devices<'static>> {
        check_devices("nx_mesh::Devices::unbranded", &list)?;
        Ok(Devices { list: list.into(), brand: PhantomData })
    }

    /// Runs `body` with `list` opened as a set of a brand no other set shares, and returns what
    /// `body` returns.
    ///
    /// # Errors
    /// [`Error::EmptySet`] for no devices, [`Error::RepeatedDevice`] for a device listed twice;
    /// `body` does not run then.
    pub fn with<R>(list: Vec<Device>, body: impl for<'b> FnOnce(Devices<'b>) -> R) -> Result<R> {
        check_devices("nx_mesh::Devices::with", &list)?;
        Ok(body(Devices { list: list.into(), brand: PhantomData }))
    }
}

impl<'d> Devices<'d> {
    /// Runs `body` with the devices at `indices` (positions in this set, in the order given) as a
    /// set of its own brand, and returns what `body` returns.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for an index past the set, [`Error::RepeatedDevice`] for an index
    /// given twice, [`Error::EmptySet`] for none.
    pub fn with_subset<R>(&self, indices: &[usize], body: impl for<'b> FnOnce(Devices<'b>) -> R) -> Result<R> {
        let list = self.pick("nx_mesh::Devices::with_subset", indices)?;
        Devices::with(list, body)
    }

    pub(crate) fn pick(&self, func: &'static str, indices: &[usize]) -> Result<Vec<Device>> {
        let mut list = Vec::with_capacity(indices.len());
        for &i in indices {
            let d = self.list.get(i).ok_or_else(|| Error::OutOfRange {
                func,
                what: "device index",
                value: vec![i],
                bound: format!("a set of {} devices", self.list.len()),
            })?;
            list.push(*d);
        }
        check_devices(func, &list)?;
        Ok(list)
    }

    /// The number of devices (at least one).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Always false: a set holds at least one device.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The devices, in order.
    pub fn as_slice(&self) -> &[Device] {
        &self.list
    }

    /// The device at position `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<Device> {
        self.list.get(i).copied()
    }

    /// The position of `device` in the set.
    ///
    /// # Errors
    /// [`Error::NotInSet`] naming the device and the set.
    pub fn index_of(&self, device: &Device) -> Result<usize> {
        self.position(device).ok_or_else(|| Error::NotInSet {
            func: "nx_mesh::Devices::index_of",
            device: *device,
            set: self.to_string(),
        })
    }

    /// The position of `device` in the set, or `None`.
    pub fn position(&self, device: &Device) -> Option<usize> {
        self.list.iter().position(|d| d == device)
    }

    /// Whether both sets list the same devices in the same order, whatever their brands.
    pub fn same_list<'e>(&self, other: &Devices<'e>) -> bool {
        self.list == other.list
    }

    /// `Some` witness that this set and `other` are one set (the same devices in the same order),
    /// whatever their brands; `None` otherwise. The witness reads values of one brand at the
    /// other.
    pub fn same<'e>(&self, other: &Devices<'e>) -> Option<Equal<'d, 'e>> {
        (self.list == other.list).then_some(Equal { brands: PhantomData })
    }
}

/// A run-time proof that the brands `'d` and `'e` name one device set, from [`Devices::same`].
/// It converts what lives over one brand into the other.
#[derive(Clone, Copy)]
pub struct Equal<'d, 'e> {
    brands: PhantomData<(Brand<'d>, Brand<'e>)>,
}

impl fmt::Debug for Equal<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Equal")
    }
}

impl<'d, 'e> Equal<'d, 'e> {
    /// The proof the other way round.
    pub fn flip(self) -> Equal<'e, 'd> {
        Equal { brands: PhantomData }
    }

    /// `devices` read at brand `'e`.
    pub fn devices(self, devices: &Devices<'d>) -> Devices<'e> {
        Devices { list: devices.list.clone(), brand: PhantomData }
    }

    /// `mesh` read at brand `'e`.
    pub fn mesh(self, mesh: &Mesh<'d>) -> Mesh<'e> {
        mesh.rebrand(self.devices(mesh.devices()))
    }
}

/// The most axes an array (and so a placement's cut) may have: 16, as many as a Bigarray. Shared by
/// placements and layouts.
pub const MAX_RANK: usize = 16;

/// The most devices a mesh spans (2^20, a million: past the largest machines built; a mesh's
/// coordinates and a plan's per-device figures are computed for every device).
pub const MAX_DEVICES: usize = 1 << 20;
