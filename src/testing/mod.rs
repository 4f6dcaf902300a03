//! What a user needs to unit-test placements on simulated meshes:
//!
//! - **the collective log** — [`Ctx::record`] answers every collective, send, receive and split a
//!   rank issued inside a region, with its op, dtype, group, bytes and plan step ([`Log`]);
//! - **reference checks** — [`same_as_one_device`] runs one body on a simulated mesh and on one
//!   device (the same mesh axes, each of extent 1) and compares every rank's result with the
//!   one-device one ([`check_close`], [`assert_close`]: within a tolerance, or exactly);
//! - **fault injection** — [`LaunchOptions::faults`]: a rank fails, panics, stalls or is delayed
//!   at its n-th collective ([`Fault`]), and the test sees what a real run shows;
//! - **strategies** (feature `testing`) — `proptest` strategies of meshes, shapes, placements of
//!   every kind and placed tensors with known values ([`strategies`]).
//!
//! The simulated mesh's small collectives take about 11 µs (4 ranks, 16 KiB all-reduce, on 2
//! CPUs), so a test of thousands of steps runs in seconds. `tests/guide.rs` is a worked example:
//! a Megatron-style MLP block checked against one device, with its one all-reduce counted, on
//! random meshes and batch sizes, and with a rank made to fail.

mod close;
#[cfg(feature = "testing")]
pub mod strategies;
#[cfg(feature = "testing")]
pub use strategies::{mesh, meshes, placed_tensor, placements, shapes, PlacedCase};

pub use close::{assert_close, check_close, Difference, Tol};
pub use nx_collectives::log::{Event, Log, Op};
pub use nx_collectives::sim::{Fault, FaultKind};

use crate::{launch_with, Ctx, Element, Error, LaunchOptions, Mesh, MeshSpec, Result};

/// `mesh` with every extent 1: the same axis names over one device.
fn on_one_device(mesh: &MeshSpec) -> MeshSpec {
    let axes: Vec<(&str, usize)> = mesh.axes().iter().map(|a| (a.0.as_str(), 1)).collect();
    MeshSpec::new(&axes).expect("the axes of a valid mesh")
}

/// Runs `body` on a simulated mesh `mesh` (one rank per device, with `opts`' other settings) and
/// on one device (the same mesh axes, each of extent 1); compares every rank's result with the
/// one-device result within `tol`. Answers every rank's result.
///
/// # Examples
///
/// ```
/// use nx::testing::{same_as_one_device, Tol};
/// use nx::{MeshSpec, PlacementSpec, Tensor};
///
/// let mesh: MeshSpec = "dp=2,tp=2".parse().unwrap();
/// same_as_one_device(&mesh, &Default::default(), Tol::close(1e-12, 0.0), |ctx, m| {
///     let x = Tensor::<f64>::rand(ctx, &[5, 3], &"mesh(0:dp, 1:tp)".parse::<PlacementSpec>()?.over(m)?, 7)?;
///     let s = x.sum(1)?.full()?;
///     Ok(s.to_vec()?)
/// })
/// .unwrap();
/// ```
///
/// # Errors
/// [`Error::Invalid`] naming the rank and the first difference where a rank's result differs;
/// the body's errors.
pub fn same_as_one_device<T, F>(mesh: &MeshSpec, opts: &LaunchOptions, tol: Tol, body: F) -> Result<Vec<Vec<T>>>
where
    T: Element + Send,
    F: for<'d> Fn(&Ctx<'d>, &Mesh<'d>) -> Result<Vec<T>> + Sync,
{
    let run = |spec: &MeshSpec| {
        let o = LaunchOptions { devices: Some(spec.size()), ..opts.clone() };
        launch_with(&o, |ctx| {
            let m = spec.over(ctx.devices()).map_err(nx_placement::Error::from)?;
            body(ctx, &m)
        })
    };
    let one = run(&on_one_device(mesh))?.pop().expect("one rank");
    let all = run(mesh)?;
    for (r, got) in all.iter().enumerate() {
        check_close(got, &one, tol).map_err(|d| Error::Invalid {
            func: "nx::testing::same_as_one_device",
            why: format!("rank {r} of the mesh {mesh} differs from one device: {d}"),
        })?;
    }
    Ok(all)
}
