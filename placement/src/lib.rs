//! Placements for nx: where a distributed value's elements lie over a device set, and what it
//! costs to move them.
//!
//! [`Placement<'d>`] implements every function of `reference/nx_placement.txt` (`on`, `device`,
//! `split`, `mesh`, `partial`, `closed`, `uncut`, `devices`, `equal`, `same`, the printer) with its
//! rules: a window of n elements cut k ways holds n/k+1 in the first n mod k windows and n/k in
//! the others, with no padding; mesh coordinates are major first; a partial value's terms are
//! numbered row-major over its sums in the order listed. [`PlacementSpec`] is the unbranded text
//! form. [`plan()`] turns a change of placement into steps with exact byte counts.
//!
//! This crate is pure: no I/O, no memory beyond its own bookkeeping.

mod placement;
pub mod plan;
pub mod region;
pub mod rules;
mod spec;
pub mod topology;

pub use placement::Placement;
pub use plan::{plan, CostModel, Op, Plan, Step, Transfer};
pub use region::Window;
pub use spec::PlacementSpec;
pub use topology::{LinkBytes, Topology};

pub use nx_mesh::{Device, DeviceKind, Devices, Equal, Mesh, MeshSpec, MAX_RANK};

/// The errors of placements. Each message names the function and the offending values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A device that is not in the set.
    #[error("{func}: device {device} is not in the set {set}")]
    DeviceNotInSet {
        /// The function called.
        func: &'static str,
        /// The device, in words.
        device: String,
        /// The set, printed.
        set: String,
    },
    /// A tensor axis at or past [`MAX_RANK`].
    #[error("{func}: tensor axis {axis} is not below the most axes an array has, {max_rank}")]
    AxisOutOfRange {
        /// The function called.
        func: &'static str,
        /// The axis given.
        axis: usize,
        /// [`MAX_RANK`].
        max_rank: usize,
    },
    /// A mesh axis name the mesh lacks.
    #[error("{func}: the mesh {mesh} has no axis {name:?}")]
    UnknownMeshAxis {
        /// The function called.
        func: &'static str,
        /// The name given.
        name: String,
        /// The mesh, printed.
        mesh: String,
    },
    /// One tensor axis in two cuts.
    #[error("{func}: tensor axis {axis} is cut twice")]
    AxisInTwoCuts {
        /// The function called.
        func: &'static str,
        /// The axis.
        axis: usize,
    },
    /// One mesh axis in two cuts (or twice in one).
    #[error("{func}: mesh axis {name:?} is named in two cuts")]
    NameInTwoCuts {
        /// The function called.
        func: &'static str,
        /// The name.
        name: String,
    },
    /// A mesh axis named twice among the sums.
    #[error("{func}: mesh axis {name:?} is summed twice")]
    NameInSumsTwice {
        /// The function called.
        func: &'static str,
        /// The name.
        name: String,
    },
    /// A mesh axis both summed and cutting.
    #[error("{func}: mesh axis {name:?} is both summed and in a cut")]
    NameInSumsAndCut {
        /// The function called.
        func: &'static str,
        /// The name.
        name: String,
    },
    /// A placement that cuts an axis a shape lacks.
    #[error("{func}: {placement} cuts axis {axis}, so it needs a value of rank > {axis}, got shape {shape:?}")]
    RankTooSmall {
        /// The function called.
        func: &'static str,
        /// The placement, printed.
        placement: String,
        /// The highest axis it cuts.
        axis: usize,
        /// The shape given.
        shape: Vec<usize>,
    },
    /// An element index outside a shape.
    #[error("{func}: element {element:?} is not in a value of shape {shape:?}")]
    ElementOutOfRange {
        /// The function called.
        func: &'static str,
        /// The index given.
        element: Vec<usize>,
        /// The shape.
        shape: Vec<usize>,
    },
    /// A value too large for a plan to count: its bytes times four times the square of the
    /// devices (the most any plan's figures reach) pass `u64`.
    #[error("{func}: a value of shape {shape:?} of {elem_bytes}-byte elements over {devices} devices is too large to count in 64 bits")]
    TooLarge {
        /// The function called.
        func: &'static str,
        /// The shape.
        shape: Vec<usize>,
        /// Bytes an element.
        elem_bytes: usize,
        /// The devices of both sets.
        devices: usize,
    },
    /// A shape whose elements are more than 64 bits count.
    #[error("{func}: shape {shape:?} has more elements than 64 bits count")]
    TooManyElements {
        /// The function called.
        func: &'static str,
        /// The shape.
        shape: Vec<usize>,
    },
    /// Malformed placement text.
    #[error("nx_placement::PlacementSpec::from_str: cannot read {text:?} at column {column}: {why}")]
    Parse {
        /// The text given.
        text: String,
        /// The 1-based column of the problem.
        column: usize,
        /// What was wrong.
        why: String,
    },
    /// Operands whose placements an op's propagation rule cannot combine ([`rules`]).
    #[error("{func}: {why}")]
    Rule {
        /// The function called.
        func: &'static str,
        /// What does not fit, naming the placements.
        why: String,
    },
    /// An error of the device set or mesh.
    #[error(transparent)]
    Mesh(#[from] nx_mesh::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
