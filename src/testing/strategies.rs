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

/// The mesh `extents` gives (axes named [`AXES`], major first), always: for tests of one mesh.
///
/// # Panics
/// Where `extents` has more than three axes or a 0 (a strategy built wrongly).
pub fn mesh(extents: &[usize]) -> impl Strategy<Value = MeshSpec> {
    assert!(extents.len() <= AXES.len() && !extents.contains(&0), "1 to 3 axes of extents from 1");
    let named: Vec<(&str, usize)> = extents.iter().enumerate().map(|(i, &e)| (AXES[i], e)).collect();
    Just(MeshSpec::new(&named).expect("valid axes"))
}

/// Shapes of `rank` axes, each extent drawn from `0..=max`, with 0 and 1 weighted up (a quarter
/// of the extents): small extents over meshes of up to three ways are mostly uneven.
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
    /// The seed of the values.
    pub seed: u64,
}

/// The grid the values lie on: every value, term and partial sum of them is a multiple of 2⁻²⁰
/// below 2⁴ in magnitude, exact in `f32` and `f64`, so terms sum to the value in any order.
const GRID: f64 = 1.0 / (1u64 << 20) as f64;

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

    /// The global value in C order: element i is `uniform(seed, i)` rounded down to a multiple of
    /// 2⁻²⁰ (exact in `f32`).
    pub fn value(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        (0..n as u64).map(|i| self.element(i)).collect()
    }

    fn element(&self, i: u64) -> f64 {
        (crate::uniform(self.seed, i) / GRID).floor() * GRID
    }

    /// Term `t` of element `i` of a partial value: terms 1, 2, … are multiples of 2⁻²⁰ from
    /// 2⁻²⁰ to 8·2⁻²⁰, and term 0 is the element less the others, so the terms sum to the element
    /// exactly, in any order, and no term alone is it (where there are two terms or more).
    pub fn term(&self, t: usize, i: u64, terms: usize) -> f64 {
        let share = |t: usize| {
            ((crate::uniform(self.seed ^ (t as u64).wrapping_mul(0x9e37_79b9), i) * 8.0).floor() + 1.0) * GRID
        };
        if t > 0 {
            share(t)
        } else {
            (1..terms).fold(self.element(i), |acc, t| acc - share(t))
        }
    }

    /// The tensor on `mesh`: the value [`PlacedCase::value`] at the placement; a partial one as
    /// [`PlacedCase::term`]'s terms. For float dtypes (others truncate the values).
    ///
    /// # Errors
    /// As [`Tensor::from_fn`].
    pub fn tensor<'d, T: Reducible>(&self, ctx: &Ctx<'d>, mesh: &Mesh<'d>) -> Result<Tensor<'d, T>> {
        let p = self.placement.over(mesh)?;
        let strides: Vec<u64> =
            (0..self.shape.len()).map(|d| self.shape[d + 1..].iter().product::<usize>() as u64).collect();
        let flat = move |idx: &[usize]| idx.iter().zip(&strides).map(|(&x, &s)| x as u64 * s).sum::<u64>();
        let (term, terms) = (p.term(ctx.index())?, p.terms());
        let value = |x: f64| T::from_value(nx_kernels::Value::Float(x));
        // each term's window, built at the closed placement (the same windows)
        let t = Tensor::from_fn(ctx, &self.shape, &p.closed(), |idx| match term {
            Some(t) => value(self.term(t, flat(idx), terms)),
            None => value(self.element(flat(idx))),
        })?;
        Tensor::from_local(ctx, &self.shape, &p, t.to_local().cloned())
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
