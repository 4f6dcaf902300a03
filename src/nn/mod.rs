//! Layers over placements: parameters with names, [`Linear`] (copies, column- or row-parallel),
//! [`Embedding`] (copies or vocabulary-parallel), [`LayerNorm`], and the GPT of [`gpt`].
//!
//! Layers are descriptions (names, extents, how they are cut); their parameters live in a
//! [`Params`] (ordered, by name), which a training step binds to a [`Tape`] ([`Params::bind`]) and
//! an optimizer updates ([`crate::optim`]). Every layer runs over a mesh with axes `dp` (data
//! parallel: activations' batch axis cut over it) and `tp` (tensor parallel: Megatron's
//! column/row cuts of the weights), either of extent 1.

pub mod gpt;

use std::collections::HashMap;

use nx_collectives::Reducible;
use nx_kernels::Contraction;

use crate::autodiff::{Tape, Var};
use crate::tensor::err;
use crate::{Ctx, Mesh, Placement, Result, Tensor};

/// Parameters by name, in the order they were added.
#[derive(Clone, Default)]
pub struct Params<'d, T: Reducible> {
    list: Vec<(String, Tensor<'d, T>)>,
}

impl<T: Reducible> std::fmt::Debug for Params<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list.iter().map(|(n, t)| (n, t.shape().to_vec()))).finish()
    }
}

impl<'d, T: Reducible> Params<'d, T> {
    /// No parameters.
    pub fn new() -> Self {
        Params { list: Vec::new() }
    }

    /// Adds `value` as `name`.
    ///
    /// # Errors
    /// A name already present.
    pub fn insert(&mut self, name: &str, value: Tensor<'d, T>) -> Result<()> {
        if self.get(name).is_some() {
            return Err(err("nx::nn::Params::insert", format!("a parameter named {name:?} is already present")));
        }
        self.list.push((name.to_string(), value));
        Ok(())
    }

    /// The parameter `name`, or `None`.
    pub fn get(&self, name: &str) -> Option<&Tensor<'d, T>> {
        self.list.iter().find(|p| p.0 == name).map(|p| &p.1)
    }

    /// Replaces the value of `name` (an optimizer's update).
    ///
    /// # Errors
    /// An unknown name, or a value of another shape.
    pub fn set(&mut self, name: &str, value: Tensor<'d, T>) -> Result<()> {
        let Some(slot) = self.list.iter_mut().find(|p| p.0 == name) else {
            return Err(err("nx::nn::Params::set", format!("no parameter named {name:?}")));
        };
        if slot.1.shape() != value.shape() {
            return Err(err(
                "nx::nn::Params::set",
                format!("{name}: shape {:?} for {:?}", value.shape(), slot.1.shape()),
            ));
        }
        slot.1 = value;
        Ok(())
    }

    /// The parameters, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor<'d, T>)> {
        self.list.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The number of elements of all (global, counted once).
    pub fn elements(&self) -> usize {
        self.list.iter().map(|(_, t)| t.shape().iter().product::<usize>()).sum()
    }

    /// Every parameter as a named leaf of `tape`.
    pub fn bind(&self, tape: &Tape<'d, T>) -> Bound<'d, T> {
        Bound { vars: self.list.iter().map(|(n, t)| (n.clone(), tape.param(n, t.clone()))).collect() }
    }

    /// [`Params::bind_as`] under a mixed-precision `policy`: the parameters must be stored in
    /// `policy.params` and the tape compute in `policy.compute` (`bf16` compute over `f32` master
    /// weights: `Policy::from_str("params=f32,compute=bf16,output=f32")`).
    ///
    /// # Errors
    /// A policy that names other dtypes than `T` and `U`; kernel refusals of the conversion.
    pub fn bind_with<U: Reducible>(&self, tape: &Tape<'d, U>, policy: &nx_kernels::Policy) -> Result<Bound<'d, U>> {
        if policy.params != T::DTYPE || policy.compute != U::DTYPE {
            return Err(err(
                "nx::nn::Params::bind_with",
                format!("the policy {policy:?} for parameters of {} computing in {}", T::DTYPE, U::DTYPE),
            ));
        }
        self.bind_as(tape)
    }

    /// Every parameter converted to `U` as a named leaf of `tape`: mixed precision, these the
    /// master weights and the tape computing in `U` (their gradients in `U`, converted back by
    /// [`crate::autodiff::Grads::cast`]).
    ///
    /// # Errors
    /// Kernel refusals of the conversion.
    pub fn bind_as<U: Reducible>(&self, tape: &Tape<'d, U>) -> Result<Bound<'d, U>> {
        let vars =
            self.list.iter().map(|(n, t)| Ok((n.clone(), tape.param(n, t.cast::<U>()?)))).collect::<Result<_>>()?;
        Ok(Bound { vars })
    }
}

/// Parameters bound to a tape, by name.
pub struct Bound<'d, T: Reducible> {
    vars: HashMap<String, Var<'d, T>>,
}

impl<'d, T: Reducible> Bound<'d, T> {
    /// The leaf of `name`.
    ///
    /// # Errors
    /// An unknown name.
    pub fn get(&self, name: &str) -> Result<&Var<'d, T>> {
        self.vars.get(name).ok_or_else(|| err("nx::nn::Bound::get", format!("no parameter named {name:?}")))
    }
}

/// How a [`Linear`] layer's weight is cut over `tp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// Copies on every device.
    Replicated,
    /// Output features cut over `tp`: the output's last axis cut (Megatron's column-parallel).
    Column,
    /// Input features cut over `tp` (the input's last axis cut as a column-parallel layer leaves
    /// it): the product is a sum over `tp`, closed by an all-reduce before the bias
    /// (row-parallel).
    Row,
}

/// Where a layer's values lie: the mesh (axes `dp` and `tp`).
#[derive(Clone, Debug)]
pub struct Layout<'d> {
    mesh: Mesh<'d>,
}

impl<'d> Layout<'d> {
    /// The layout over `mesh`.
    ///
    /// # Errors
    /// A mesh without axes named `dp` and `tp`.
    pub fn new(mesh: &Mesh<'d>) -> Result<Self> {
        for a in ["dp", "tp"] {
            mesh.axis(a)?;
        }
        Ok(Layout { mesh: mesh.clone() })
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh<'d> {
        &self.mesh
    }

    /// Copies on every device.
    ///
    /// # Errors
    /// None in practice.
    pub fn copies(&self) -> Result<Placement<'d>> {
        Ok(Placement::mesh(&self.mesh, &[])?)
    }

    /// `axis` cut over `names`.
    ///
    /// # Errors
    /// None in practice.
    pub fn cut(&self, cuts: &[(usize, &[&str])]) -> Result<Placement<'d>> {
        Ok(Placement::mesh(&self.mesh, cuts)?)
    }

    /// The extent of `tp`.
    pub fn tp(&self) -> usize {
        self.mesh.extent("tp").expect("a layout's mesh has tp")
    }

    /// The extent of `dp`.
    pub fn dp(&self) -> usize {
        self.mesh.extent("dp").expect("a layout's mesh has dp")
    }
}

/// `y = x·W + b` over the last axis of `x`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The name prefix: parameters `{name}.w` `[d_in, d_out]` and `{name}.b` `[d_out]`.
    pub name: String,
    /// Input features.
    pub d_in: usize,
    /// Output features.
    pub d_out: usize,
    /// How the weight is cut.
    pub parallel: Parallel,
    /// Whether there is a bias.
    pub bias: bool,
}

impl Linear {
    /// The weight's and bias's placements.
    fn placements<'d>(&self, l: &Layout<'d>) -> Result<(Placement<'d>, Placement<'d>)> {
        Ok(match self.parallel {
            Parallel::Replicated => (l.copies()?, l.copies()?),
            Parallel::Column => (l.cut(&[(1, &["tp"])])?, l.cut(&[(0, &["tp"])])?),
            Parallel::Row => (l.cut(&[(0, &["tp"])])?, l.copies()?),
        })
    }

    /// Adds the parameters: the weight normal with deviation `std` from `seed`, the bias zeros.
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        l: &Layout<'d>,
        params: &mut Params<'d, T>,
        seed: u64,
        std: f64,
    ) -> Result<()> {
        let (pw, pb) = self.placements(l)?;
        params.insert(
            &format!("{}.w", self.name),
            Tensor::randn(ctx, &[self.d_in, self.d_out], &pw, seed)?.scale(std)?,
        )?;
        if self.bias {
            params.insert(&format!("{}.b", self.name), Tensor::zeros(ctx, &[self.d_out], &pb)?)?;
        }
        Ok(())
    }

    /// `x·W + b`; a row-parallel product closed (all-reduced over `tp`) before the bias.
    ///
    /// # Errors
    /// Parameters missing; `x` placed so that the product's rule refuses it.
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>) -> Result<Var<'d, T>> {
        let w = p.get(&format!("{}.w", self.name))?;
        let r = x.shape().len();
        if r == 0 || x.shape()[r - 1] != self.d_in {
            return Err(err(
                "nx::nn::Linear::forward",
                format!("{}: an input of shape {:?} for {} features", self.name, x.shape(), self.d_in),
            ));
        }
        let spec = Contraction { batch: vec![], contracting: vec![(r - 1, 0)] };
        if self.bias {
            // the bias the product's initial value (a sum over tp closed first)
            return x.contract_add(w, &spec, p.get(&format!("{}.b", self.name))?);
        }
        let y = x.contract(w, &spec)?;
        if y.placement().is_partial() {
            return y.place(&y.placement().closed());
        }
        Ok(y)
    }
}

/// A lookup table `[n, d]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The parameter's name.
    pub name: String,
    /// Rows (the vocabulary).
    pub n: usize,
    /// Features.
    pub d: usize,
    /// Rows cut over `tp` (vocabulary-parallel: the lookup a sum over `tp`, closed at once).
    pub vocab_parallel: bool,
}

impl Embedding {
    /// Adds the table, normal with deviation `std` from `seed`.
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        l: &Layout<'d>,
        params: &mut Params<'d, T>,
        seed: u64,
        std: f64,
    ) -> Result<()> {
        let p = if self.vocab_parallel { l.cut(&[(0, &["tp"])])? } else { l.copies()? };
        params.insert(&self.name, Tensor::randn(ctx, &[self.n, self.d], &p, seed)?.scale(std)?)
    }

    /// The rows `ids` (closed).
    ///
    /// # Errors
    /// As [`Var::embedding`].
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, ids: &Tensor<'d, i64>) -> Result<Var<'d, T>> {
        let y = p.get(&self.name)?.embedding(ids)?;
        if y.placement().is_partial() {
            y.place(&y.placement().closed())
        } else {
            Ok(y)
        }
    }
}

/// Layer normalisation over the last axis, with a scale and a shift (copies).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// The name prefix: `{name}.g` (ones) and `{name}.b` (zeros).
    pub name: String,
    /// Features.
    pub d: usize,
    /// The variance's guard.
    pub eps: f64,
}

impl LayerNorm {
    /// Adds the parameters.
    ///
    /// # Errors
    /// A name already present.
    pub fn init<'d, T: Reducible>(&self, ctx: &Ctx<'d>, l: &Layout<'d>, params: &mut Params<'d, T>) -> Result<()> {
        let p = l.copies()?;
        params.insert(&format!("{}.g", self.name), Tensor::from_fn(ctx, &[self.d], &p, |_| crate::from_f64(1.0))?)?;
        params.insert(&format!("{}.b", self.name), Tensor::zeros(ctx, &[self.d], &p)?)
    }

    /// The normalised `x`.
    ///
    /// # Errors
    /// As [`Var::layer_norm`].
    pub fn forward<'d, T: Reducible>(&self, p: &Bound<'d, T>, x: &Var<'d, T>) -> Result<Var<'d, T>> {
        x.layer_norm(p.get(&format!("{}.g", self.name))?, p.get(&format!("{}.b", self.name))?, self.eps)
    }
}
