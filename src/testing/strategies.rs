//! `proptest` strategies for placement tests (feature `testing`): meshes of 1–3 axes, shapes with
//! uneven and empty extents, placements of every kind valid for a shape and a mesh (partial ones
//! included), and placed tensors with known values.

use std::ops::RangeInclusive;

use proptest::prelude::*;

use crate::{Ctx, LaunchOptions, Mesh, MeshSpec, PlacementSpec, Result, Tensor};
use nx_collectives::Reducible;

/// The names of generated meshes' axes, major first.
pub const AXES: [&str; 3] = ["dp", "tp", "pp"];

/// Meshes of `axes` axes (named [`AXES`], major first), each of an extent in `extents`.
///
/// # Panics
/// Where `axes` reaches past three axes or `extents` includes 0 (a strategy built wrongly).
pub fn meshes(axes: RangeInclusive<usize>, extents: RangeInclusive<usize>) -> impl Strategy<Value = MeshSpec> {
    assert!(*axes.end() <= AXES.len() && *extents.start() >= 1, "1 to 3 axes of extents from 1");
    prop::collection::vec(extents, axes).prop_map(|ext| {
        let named: Vec<(&str, usize)> = ext.iter().enumerate().map(|(i, &e)| (AXES[i], e)).collect();
        MeshSpec::new(&named).expect("valid axes")
    })
}

/// Shapes of `rank` axes, each extent up to `max`: mostly uneven (n·k+1 over small k), sometimes
/// 0 or 1.
pub fn shapes(rank: RangeInclusive<usize>, max: usize) -> impl Strategy<Value = Vec<usize>> {
    let extent = prop_oneof![1 => Just(0usize), 1 => Just(1usize), 6 => 0..=max];
    prop::collection::vec(extent, rank)
}

/// The kind of a placement, as [`placements`] reaches every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `on`.
    On,
    /// `device(K)`.
    Device,
    /// `split(A)`.
    Split,
    /// `mesh(…)`.
    Mesh,
    /// `partial(…)`.
    Partial,
}

/// The kind of `p`.
pub fn kind(p: &PlacementSpec) -> Kind {
    match p {
        PlacementSpec::On => Kind::On,
        PlacementSpec::Device(_) => Kind::Device,
        PlacementSpec::Split(_) => Kind::Split,
        PlacementSpec::Mesh { .. } => Kind::Mesh,
        PlacementSpec::Partial { .. } => Kind::Partial,
    }
}

/// Placements over `mesh` valid for values of `rank` axes: `on`, `device(K)`, `split(A)` (where
/// the rank allows), and meshes and partial sums whose every mesh axis is unused, cuts a tensor
/// axis, or (in a partial sum) is summed over.
pub fn placements(mesh: &MeshSpec, rank: usize) -> impl Strategy<Value = PlacementSpec> {
    let names: Vec<String> = mesh.axes().iter().map(|a| a.0.clone()).collect();
    let size = mesh.size();
    (0u8..8, any::<u16>(), prop::collection::vec(any::<u16>(), names.len())).prop_map(move |(k, x, roles)| {
        match k {
            0 => PlacementSpec::On,
            1 => PlacementSpec::Device(x as usize % size),
            2 if rank > 0 => PlacementSpec::Split(x as usize % rank),
            _ => {
                let partial = k >= 5;
                let mut cuts: Vec<(usize, Vec<String>)> = Vec::new();
                let mut sums = Vec::new();
                for (name, r) in names.iter().zip(&roles) {
                    // a role per mesh axis: unused, summed (partial only), or cutting axis r
                    let role = *r as usize % (rank + 2);
                    if role == rank {
                        continue;
                    } else if role == rank + 1 {
                        if partial {
                            sums.push(name.clone());
                        }
                    } else if let Some(cut) = cuts.iter_mut().find(|(a, _)| *a == role) {
                        cut.1.push(name.clone());
                    } else {
                        cuts.push((role, vec![name.clone()]));
                    }
                }
                if sums.is_empty() && partial && !names.is_empty() {
                    // a partial sum over at least one axis: the first unused or the first
                    let free = names.iter().find(|n| !cuts.iter().any(|c| c.1.contains(n))).cloned();
                    match free {
                        Some(n) => sums.push(n),
                        None => {
                            let n = names[0].clone();
                            cuts.iter_mut().for_each(|c| c.1.retain(|m| *m != n));
                            cuts.retain(|c| !c.1.is_empty());
                            sums.push(n);
                        }
                    }
                }
                if sums.is_empty() {
                    PlacementSpec::Mesh { cuts }
                } else {
                    PlacementSpec::Partial { sums, cuts }
                }
            }
        }
    })
}

/// A placed tensor to build in a test: a mesh, a shape, a placement of it, and the seed of its
/// values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedCase {
    /// The mesh.
    pub mesh: MeshSpec,
    /// The global shape.
    pub shape: Vec<usize>,
    /// The placement.
    pub placement: PlacementSpec,
    /// The seed of the values ([`crate::uniform`]).
    pub seed: u64,
}

impl PlacedCase {
    /// Launch options of one simulated rank per device of the mesh.
    pub fn options(&self) -> LaunchOptions {
        LaunchOptions { devices: Some(self.mesh.size()), ..Default::default() }
    }

    /// The mesh over `ctx`'s devices.
    ///
    /// # Errors
    /// Where `ctx` has another number of devices than the mesh.
    pub fn mesh<'d>(&self, ctx: &Ctx<'d>) -> Result<Mesh<'d>> {
        Ok(self.mesh.over(ctx.devices()).map_err(nx_placement::Error::from)?)
    }

    /// The tensor on `mesh`: the value [`PlacedCase::value`] laid out at the placement (a partial
    /// one as term 0 holding it and the other terms zeros).
    ///
    /// # Errors
    /// As [`Tensor::rand`] and [`Tensor::place`].
    pub fn tensor<'d, T: Reducible>(&self, ctx: &Ctx<'d>, mesh: &Mesh<'d>) -> Result<Tensor<'d, T>> {
        let p = self.placement.over(mesh)?;
        let t = Tensor::<T>::rand(ctx, &self.shape, &p.closed(), self.seed)?;
        if p.is_partial() {
            t.place(&p)
        } else {
            Ok(t)
        }
    }

    /// The global value in C order: element i is `uniform(seed, i)`.
    pub fn value(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        (0..n as u64).map(|i| crate::uniform(self.seed, i)).collect()
    }
}

/// Placed tensors over meshes from `meshes` with shapes from `shapes`, every placement kind.
pub fn placed_tensor(
    meshes: impl Strategy<Value = MeshSpec>,
    shapes: impl Strategy<Value = Vec<usize>>,
) -> impl Strategy<Value = PlacedCase> {
    (meshes, shapes, any::<u64>()).prop_flat_map(|(mesh, shape, seed)| {
        placements(&mesh, shape.len()).prop_map(move |placement| PlacedCase {
            mesh: mesh.clone(),
            shape: shape.clone(),
            placement,
            seed,
        })
    })
}
