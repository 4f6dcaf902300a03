//! nx: a distributed SPMD tensor framework.
//!
//! This facade re-exports the layers a program uses:
//!
//! - [`mesh`]: devices, branded device sets and meshes;
//! - [`placement`]: where a value's elements lie, and plans to move them;
//! - [`kernels`]: local arrays, dtypes, layouts, buffers, the door and the host kernels;
//! - [`collectives`]: communicators (the simulated backend) and the plan executor `place`.
//!
//! and, on top of them, [`launch`] (the SPMD entry point: a simulated mesh by default, MPI under
//! `mpirun`) and [`Tensor`] (a distributed array whose ops propagate placements).
//!
//! ```
//! use nx::{Device, Devices, Dtype, Mesh, Placement};
//!
//! Devices::with(Device::sims(8), |set| {
//!     let mesh = Mesh::new(&set, &[("dp", 2), ("tp", 4)]).unwrap();
//!     let from = Placement::mesh(&mesh, &[(0, &["tp"])]).unwrap();
//!     let to = Placement::mesh(&mesh, &[(1, &["tp"])]).unwrap();
//!     let plan = nx::plan(&from, &to, &[4096, 4096], Dtype::F32).unwrap();
//!     assert_eq!(plan.steps[0].op, nx::placement::Op::AllToAll);
//! })
//! .unwrap();
//! ```

mod attention;
pub mod autodiff;
pub mod ckpt;
pub mod dry;
mod fft;
mod grouped;
mod launch;
mod linalg;
pub mod nn;
mod ops;
pub mod optim;
mod place_all;
mod shape;
pub mod store;
mod tensor;
pub mod testing;

pub use fft::{FftComplex, FftReal};
pub use launch::{launch, launch_with, Comm, Ctx, LaunchOptions, Observe};
pub use linalg::{Eig, MatrixField};
pub use tensor::{from_f64, normal, splitmix64, uniform, Tensor};

pub use nx_collectives as collectives;
pub use nx_kernels as kernels;
pub use nx_mesh as mesh;
pub use nx_placement as placement;

pub use nx_kernels::{Dtype, Element};
pub use nx_mesh::{Device, DeviceKind, Devices, Mesh, MeshSpec};
pub use nx_placement::{Placement, PlacementSpec, Plan};

/// The errors of nx: each layer's, and the tensor layer's own. Each message names the function
/// and the offending values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Arguments that do not fit (operands placed differently, a nonlinear map of a partial
    /// value, shapes that do not multiply, …).
    #[error("{func}: {why}")]
    Invalid {
        /// The function called.
        func: &'static str,
        /// What does not fit, with the values.
        why: String,
    },
    /// A placement error (a propagation rule's refusal is [`Error::Invalid`]).
    #[error(transparent)]
    Placement(nx_placement::Error),
    /// A local-array or kernel error.
    #[error(transparent)]
    Kernels(#[from] nx_kernels::Error),
    /// A collectives error (a mismatch, a timeout, a failed rank).
    #[error(transparent)]
    Collectives(#[from] nx_collectives::Error),
}

/// The result type of nx.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Plans moving a value of `shape` and `dtype` from `from` to `to`: [`nx_placement::plan()`] with
/// the dtype's width.
///
/// # Errors
/// As [`nx_placement::plan()`]: a placement cutting an axis past the shape's rank;
/// [`Error::Invalid`] for a packed dtype (`int4`, `uint4`, `bit`).
pub fn plan<'d, 'e>(from: &Placement<'d>, to: &Placement<'e>, shape: &[usize], dtype: Dtype) -> Result<Plan> {
    if dtype.is_packed() {
        return Err(Error::Invalid {
            func: "nx::plan",
            why: format!("{dtype} is packed (elements narrower than a byte): plans move whole bytes of elements"),
        });
    }
    Ok(nx_placement::plan(from, to, shape, dtype.size())?)
}

impl From<nx_placement::Error> for Error {
    fn from(e: nx_placement::Error) -> Error {
        match e {
            nx_placement::Error::Rule { func, why } => Error::Invalid { func, why },
            e => Error::Placement(e),
        }
    }
}

impl From<nx_mesh::Error> for Error {
    fn from(e: nx_mesh::Error) -> Error {
        Error::Placement(nx_placement::Error::Mesh(e))
    }
}
