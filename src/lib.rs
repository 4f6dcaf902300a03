//! nx: a distributed SPMD tensor framework.
//!
//! This facade re-exports the layers a program uses:
//!
//! - [`mesh`]: devices, branded device sets and meshes;
//! - [`placement`]: where a value's elements lie, and plans to move them;
//! - [`kernels`]: local arrays, dtypes, layouts, buffers, the door and the host kernels;
//! - [`collectives`]: communicators (the simulated backend) and the plan executor `place`.
//!
//! `nx::launch`, the MPI backend and distributed tensors are not built yet (see ARCHITECTURE.md).
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

pub use nx_collectives as collectives;
pub use nx_kernels as kernels;
pub use nx_mesh as mesh;
pub use nx_placement as placement;

pub use nx_kernels::{Dtype, Element};
pub use nx_mesh::{Device, DeviceKind, Devices, Mesh, MeshSpec};
pub use nx_placement::{Placement, PlacementSpec, Plan};

/// Plans moving a value of `shape` and `dtype` from `from` to `to`: [`nx_placement::plan()`] with
/// the dtype's width.
///
/// # Errors
/// As [`nx_placement::plan()`]: a placement cutting an axis past the shape's rank.
pub fn plan<'d, 'e>(
    from: &Placement<'d>,
    to: &Placement<'e>,
    shape: &[usize],
    dtype: Dtype,
) -> Result<Plan, nx_placement::Error> {
    nx_placement::plan(from, to, shape, dtype.size())
}
