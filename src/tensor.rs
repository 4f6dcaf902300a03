//! Distributed tensors: [`Tensor`].

use nx_collectives::Reducible;
use nx_kernels::prog::{CmpOp, Prog, UnOp, V};
use nx_kernels::{refused, Answer, Array, Contraction, Element, Kernels, Move, Reduction, Value};
use nx_placement::region::Window;
use nx_placement::{rules, Placement, Plan};

use crate::launch::Ctx;
use crate::{Error, Result};

/// `Tensor<'d, T>`: a global array over the device set of brand `'d`, laid out by a placement;
/// each rank holds its window (or a term of a sum) as a local [`Array`].
///
/// Every op states its result's placement, and none moves a byte silently:
///
/// | op | operands | result |
/// |---|---|---|
/// | `add`, `sub` | equal placements (a broadcast operand whose windows match) | that placement; partial stays partial (a sum of sums) |
/// | `scale` | any | the same placement |
/// | `mul`, `map`, `relu`, … (nonlinear) | equal placements (an axis of one element may be cut differently: it broadcasts), none partial | that placement; a partial operand is an error |
/// | `matmul`, `contract` | over one mesh | each result axis cut as its operand cuts it (rows as the left's, columns as the right's); where both cut a contracting axis over the same mesh axes, a sum over them (partial), closed only by [`Tensor::place`] |
/// | `sum(axis)` | any | the axis removed; cut over mesh axes → partial over them; whole → local |
/// | `transpose` | 2-D | the cuts follow their axes |
/// | `local_map` | any | the placement the caller declares, checked against the windows |
///
/// Operands placed differently are an error naming both placements: place one first, or launch
/// with [`crate::LaunchOptions::auto_place`], which places a map's same-shaped operand as the first
/// one and logs each move on rank 0's stderr.
#[derive(Clone)]
pub struct Tensor<'d, T: Reducible> {
    pub(crate) ctx: Ctx<'d>,
    pub(crate) shape: Vec<usize>,
    pub(crate) placement: Placement<'d>,
    pub(crate) local: Option<Array<T>>,
}

impl<T: Reducible> std::fmt::Debug for Tensor<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}>({:?} at {})", T::DTYPE, self.shape, self.placement)
    }
}

pub(crate) fn err(func: &'static str, why: String) -> Error {
    Error::Invalid { func, why }
}

/// The C strides of `shape` in elements, saturating: where they would overflow, the shape has more
/// elements than any window [`Tensor::from_fn`] accepts (it refuses the shape before it reads them).
fn c_strides(shape: &[usize]) -> Vec<usize> {
    (0..shape.len()).map(|d| shape[d + 1..].iter().fold(1usize, |a, &x| a.saturating_mul(x))).collect()
}

pub(crate) fn window_shape(w: &Window) -> Vec<usize> {
    w.iter().map(|r| r.len()).collect()
}

/// An error naming `func` where `placement` is not over `ctx`'s devices.
fn over_launch(func: &'static str, ctx: &Ctx<'_>, placement: &Placement<'_>) -> Result<()> {
    if placement.devices().same_list(ctx.devices()) {
        return Ok(());
    }
    Err(err(func, format!("{placement:#} is not over the launch's devices {}", ctx.devices())))
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// The value whose element at each global index `i` is `f(i)`; each rank computes only its
    /// window. At a partial placement the first term of each sum holds the value and the other
    /// terms zeros, so the sum is `f(i)` there too.
    ///
    /// # Errors
    /// A placement that cuts an axis past the shape's rank; a placement over another set than
    /// `ctx`'s.
    pub fn from_fn(
        ctx: &Ctx<'d>,
        shape: &[usize],
        placement: &Placement<'d>,
        f: impl Fn(&[usize]) -> T,
    ) -> Result<Self> {
        over_launch("nx::Tensor::from_fn", ctx, placement)?;
        let local = match placement.window(shape, ctx.index())? {
            None => None,
            Some(w) if placement.term(ctx.index())?.is_some_and(|t| t > 0) => {
                Some(Array::zeros_on(ctx.rig(), &window_shape(&w))?)
            }
            Some(w) => {
                let starts: Vec<usize> = w.iter().map(|r| r.start).collect();
                let mut g = vec![0; shape.len()];
                Some(Array::from_fn_on(ctx.rig(), &window_shape(&w), |i| {
                    for (d, (&s, &x)) in starts.iter().zip(i).enumerate() {
                        g[d] = s + x;
                    }
                    f(&g)
                })?)
            }
        };
        Ok(Tensor { ctx: ctx.clone(), shape: shape.to_vec(), placement: placement.clone(), local })
    }

    /// Zeros: each rank's window taken zeroed from the device's pool (no element written one by
    /// one).
    ///
    /// # Errors
    /// As [`Tensor::from_fn`].
    pub fn zeros(ctx: &Ctx<'d>, shape: &[usize], placement: &Placement<'d>) -> Result<Self> {
        over_launch("nx::Tensor::zeros", ctx, placement)?;
        let local = match placement.window(shape, ctx.index())? {
            None => None,
            Some(w) => Some(Array::zeros_on(ctx.rig(), &window_shape(&w))?),
        };
        Ok(Tensor { ctx: ctx.clone(), shape: shape.to_vec(), placement: placement.clone(), local })
    }

    /// Normal samples (mean 0, deviation 1) from `seed`: element i's value depends on the seed
    /// and i alone, so the global value is the same for every mesh and placement.
    ///
    /// # Errors
    /// As [`Tensor::from_fn`].
    pub fn randn(ctx: &Ctx<'d>, shape: &[usize], placement: &Placement<'d>, seed: u64) -> Result<Self> {
        let strides = c_strides(shape);
        Tensor::from_fn(ctx, shape, placement, |i| {
            let flat = i.iter().zip(&strides).map(|(a, b)| a * b).sum::<usize>() as u64;
            T::from_value(Value::Float(normal(seed, flat)))
        })
    }

    /// Uniform samples in [0, 1) from `seed`: element i's value depends on the seed and i alone.
    ///
    /// # Errors
    /// As [`Tensor::from_fn`].
    pub fn rand(ctx: &Ctx<'d>, shape: &[usize], placement: &Placement<'d>, seed: u64) -> Result<Self> {
        let strides = c_strides(shape);
        Tensor::from_fn(ctx, shape, placement, |i| {
            let flat = i.iter().zip(&strides).map(|(a, b)| a * b).sum::<usize>() as u64;
            T::from_value(Value::Float(uniform(seed, flat)))
        })
    }

    /// The value `whole` held by rank `src` alone (other ranks pass `None`), laid out at
    /// `placement`: rank `src` sends each rank its window (the plan from `device(src)`).
    ///
    /// # Errors
    /// [`Error::Invalid`] where rank `src` passes no value or one of another shape, or another rank
    /// passes one; the errors of [`Tensor::place`].
    pub fn distribute(
        ctx: &Ctx<'d>,
        shape: &[usize],
        placement: &Placement<'d>,
        src: usize,
        whole: Option<Array<T>>,
    ) -> Result<Self> {
        let here = Placement::device(ctx.devices(), src)?;
        let mine = ctx.index() == src;
        if mine != whole.is_some() || whole.as_ref().is_some_and(|a| a.shape() != shape) {
            return Err(err(
                "nx::Tensor::distribute",
                format!(
                    "rank {} passed {:?} for a value of shape {shape:?} held by rank {src}",
                    ctx.rank(),
                    whole.map(|a| a.shape().to_vec())
                ),
            ));
        }
        let whole = match whole {
            Some(a) if !a.layout().is_contiguous() => Some(a.copy()?),
            w => w,
        };
        Tensor::from_local(ctx, shape, &here, whole)?.place(placement)
    }

    /// The tensor whose window on this rank is `local`, of global `shape` at `placement`.
    ///
    /// # Errors
    /// [`Error::Invalid`] where `local`'s shape is not this rank's window (or it holds one and the
    /// placement gives it none).
    pub fn from_local(
        ctx: &Ctx<'d>,
        shape: &[usize],
        placement: &Placement<'d>,
        local: Option<Array<T>>,
    ) -> Result<Self> {
        let w = placement.window(shape, ctx.index())?;
        let ok = match (&w, &local) {
            (None, None) => true,
            (Some(w), Some(a)) => a.shape() == window_shape(w),
            _ => false,
        };
        if !ok {
            return Err(err(
                "nx::Tensor::from_local",
                format!(
                    "rank {} holds {:?} but its window of {shape:?} at {placement} is {w:?}",
                    ctx.rank(),
                    local.as_ref().map(|a| a.shape().to_vec())
                ),
            ));
        }
        Ok(Tensor { ctx: ctx.clone(), shape: shape.to_vec(), placement: placement.clone(), local })
    }

    /// [`Tensor::from_local`] without the check that `local` is this rank's window: for callers
    /// that computed it from the placement themselves. A wrong window is a wrong value, not an error.
    pub fn from_local_unchecked(
        ctx: &Ctx<'d>,
        shape: &[usize],
        placement: &Placement<'d>,
        local: Option<Array<T>>,
    ) -> Self {
        Tensor { ctx: ctx.clone(), shape: shape.to_vec(), placement: placement.clone(), local }
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The placement.
    pub fn placement(&self) -> &Placement<'d> {
        &self.placement
    }

    /// This rank's window (a term of the sum, for a partial value), or `None` where it holds nothing.
    pub fn to_local(&self) -> Option<&Array<T>> {
        self.local.as_ref()
    }

    /// The plan that [`Tensor::place`] would run, without running it.
    ///
    /// # Errors
    /// A placement that cuts an axis past the shape's rank.
    pub fn plan(&self, to: &Placement<'d>) -> Result<Plan> {
        Ok(nx_placement::plan(&self.placement, to, &self.shape, T::DTYPE.size())?)
    }

    /// The same value at `to`: runs the plan's collectives (closing a partial value in term order).
    /// Where the plan leaves every window as it is ([`Plan::keeps_windows`]: a sum of one term, a
    /// partial value over mesh axes of extent 1, or at an equal placement) the answer holds this
    /// value's own windows, with no copy and no message.
    ///
    /// # Errors
    /// As [`Tensor::plan`]; any collective's error.
    pub fn place(&self, to: &Placement<'d>) -> Result<Self> {
        let plan = self.plan(to)?;
        if plan.keeps_windows() {
            // every rank holds its window already (a sum of one term, say): no copy, no message
            return Ok(self.clone().relabel(to.clone()));
        }
        let (comm, groups, rig) = (self.ctx.comm(), self.ctx.groups(), self.ctx.rig());
        // the window read where it lies (a strided one copied dense first, in the pool); outputs
        // and messages from the pool
        let out = match &self.local {
            Some(a) => {
                let dense;
                let a = if a.layout().is_contiguous() {
                    a
                } else {
                    dense = a.copy()?;
                    &dense
                };
                a.with_slice(|s| nx_collectives::place_in(comm, groups, &plan, Some(s), rig))??
            }
            None => nx_collectives::place_in(comm, groups, &plan, None, rig)?,
        };
        let local = match (out, to.window(&self.shape, self.ctx.index())?) {
            (Some(d), Some(w)) => Some(d.into_array(&window_shape(&w))?),
            _ => None,
        };
        Ok(Tensor { ctx: self.ctx.clone(), shape: self.shape.clone(), placement: to.clone(), local })
    }

    /// The whole value on every rank (an all-gather, closing a sum first).
    ///
    /// # Errors
    /// As [`Tensor::place`].
    pub fn full(&self) -> Result<Array<T>> {
        let on = Placement::on(self.ctx.devices());
        Ok(self.place(&on)?.local.expect("every device holds the value at `on`"))
    }

    /// The whole value on rank `dst` alone (`None` on the others): a gather to one device.
    ///
    /// # Errors
    /// As [`Tensor::place`]; a rank past the set.
    pub fn full_on(&self, dst: usize) -> Result<Option<Array<T>>> {
        let one = Placement::device(self.ctx.devices(), dst)?;
        Ok(self.place(&one)?.local)
    }

    /// The same windows under `p`, which the caller knows to be [`Placement::equal`] to this
    /// placement (another spelling of the same layout).
    pub(crate) fn relabel(self, p: Placement<'d>) -> Self {
        Tensor { placement: p, ..self }
    }

    pub(crate) fn with_local(&self, placement: Placement<'d>, shape: Vec<usize>, local: Option<Array<T>>) -> Self {
        Tensor { ctx: self.ctx.clone(), shape, placement, local }
    }

    /// Runs `build` (a program over loads of `T`, one per operand, answering its output) on each
    /// rank's windows; the operands must be placed alike (see [`Tensor`]).
    /// Runs a fused program over this tensor's window and the others' (one load each, this one
    /// first; `build` answers the output node): one pass over memory on each rank, the result
    /// placed as this operand. `linear` says the program is linear in its operands (a sum of
    /// sums stays a sum), which admits partial values.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// let (a, x) = (nx::Tensor::<f32>::from_fn(ctx, &[5], &p, |i| i[0] as f32)?, nx::Tensor::<f32>::rand(ctx, &[5], &p, 1)?);
    /// // y = relu(2·a + x), fused
    /// let y = a.map(&[&x], false, |prog, l| {
    ///     let two = prog.float(2.0);
    ///     let t = prog.mul(l[0], two);
    ///     let s = prog.add(t, l[1]);
    ///     let zero = prog.float(0.0);
    ///     prog.max(s, zero)
    /// })?;
    /// assert!(y.placement().equal(&p));
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// Operands placed differently; a partial operand of a nonlinear program.
    pub fn map(&self, others: &[&Tensor<'d, T>], linear: bool, build: impl Fn(&mut Prog, &[V]) -> V) -> Result<Self> {
        self.zip("nx::Tensor::map", others, linear, build)
    }

    /// As [`Tensor::map`] with several outputs: `build` answers one value per output, all
    /// computed in one pass over the operands (an optimizer's moments and weights together);
    /// answers one tensor per value, placed as this one.
    ///
    /// # Errors
    /// As [`Tensor::map`]; `build` answering no value.
    pub fn map_many(
        &self,
        others: &[&Tensor<'d, T>],
        linear: bool,
        build: impl Fn(&mut Prog, &[V]) -> Vec<V>,
    ) -> Result<Vec<Self>> {
        self.zip_many("nx::Tensor::map_many", others, linear, build)
    }

    fn zip(
        &self,
        func: &'static str,
        others: &[&Tensor<'d, T>],
        linear: bool,
        build: impl Fn(&mut Prog, &[V]) -> V,
    ) -> Result<Self> {
        let mut out = self.zip_many(func, others, linear, |p, l| vec![build(p, l)])?;
        Ok(out.remove(0))
    }

    fn zip_many(
        &self,
        func: &'static str,
        others: &[&Tensor<'d, T>],
        linear: bool,
        build: impl Fn(&mut Prog, &[V]) -> Vec<V>,
    ) -> Result<Vec<Self>> {
        // Opt-in automatic placement: an operand of the same shape placed otherwise moves to this
        // one's placement, and the move is logged.
        let moved: Vec<Tensor<'d, T>> = others
            .iter()
            .map(|o| {
                if self.ctx.auto_place() && o.shape == self.shape && !o.placement.equal(&self.placement) {
                    let plan = o.plan(&self.placement)?;
                    let bytes: u64 = plan.bytes_received().iter().sum();
                    if self.ctx.rank() == 0 {
                        eprintln!(
                            "nx: {func}: placed an operand from {} to {} ({bytes} bytes moved)",
                            o.placement, self.placement
                        );
                    }
                    o.place(&self.placement)
                } else {
                    Ok((*o).clone())
                }
            })
            .collect::<Result<_>>()?;
        let others: Vec<&Tensor<'d, T>> = moved.iter().collect();
        let others = &others[..];
        for o in others {
            rules::elementwise(func, &self.placement, &self.shape, &o.placement, &o.shape)?;
        }
        if !linear && (self.placement.is_partial() || others.iter().any(|o| o.placement.is_partial())) {
            return Err(err(
                func,
                format!("a nonlinear map of a partial value ({}): close it with place first", self.placement),
            ));
        }
        let mut p = Prog::new(&vec![T::DTYPE; 1 + others.len()]);
        let loads: Vec<V> = (0..=others.len()).map(|i| p.load(i)).collect();
        let outs = build(&mut p, &loads);
        if outs.is_empty() {
            return Err(err(func, "the program answers no value".into()));
        }
        let Some(a) = &self.local else {
            return Ok(outs
                .iter()
                .map(|_| self.with_local(self.placement.clone(), self.shape.clone(), None))
                .collect());
        };
        for &o in &outs {
            let o = p.cast(o, T::DTYPE);
            p.output(o);
        }
        let dsts: Vec<Array<T>> =
            outs.iter().map(|_| Array::<T>::uninit_on(self.ctx.rig(), a.shape())).collect::<Result<_, _>>()?;
        let mut ops: Vec<&dyn nx_kernels::Operand> = vec![a];
        for o in others {
            ops.push(o.local.as_ref().expect("aligned operands hold windows where this one does"));
        }
        let dst_ops: Vec<&dyn nx_kernels::Operand> = dsts.iter().map(|d| d as &dyn nx_kernels::Operand).collect();
        check(func, self.ctx.host().map(&p, a.shape(), &dst_ops, &ops), &ops)?;
        Ok(dsts.into_iter().map(|d| self.with_local(self.placement.clone(), self.shape.clone(), Some(d))).collect())
    }

    /// `self + other` (linear: partial values stay partial).
    ///
    /// # Errors
    /// Operands placed differently.
    pub fn add(&self, other: &Tensor<'d, T>) -> Result<Self> {
        self.zip("nx::Tensor::add", &[other], true, |p, l| p.add(l[0], l[1]))
    }

    /// `self - other` (linear).
    ///
    /// # Errors
    /// Operands placed differently.
    pub fn sub(&self, other: &Tensor<'d, T>) -> Result<Self> {
        self.zip("nx::Tensor::sub", &[other], true, |p, l| p.sub(l[0], l[1]))
    }

    /// `self * other`, elementwise (nonlinear).
    ///
    /// # Errors
    /// Operands placed differently; a partial operand.
    pub fn mul(&self, other: &Tensor<'d, T>) -> Result<Self> {
        self.zip("nx::Tensor::mul", &[other], false, |p, l| p.mul(l[0], l[1]))
    }

    /// `c · self` (linear).
    ///
    /// # Errors
    /// None in practice; kernel refusals are raised.
    pub fn scale(&self, c: f64) -> Result<Self> {
        self.zip("nx::Tensor::scale", &[], true, |p, l| {
            let k = p.float(c);
            p.mul(l[0], k)
        })
    }

    /// `max(self, 0)`.
    ///
    /// # Errors
    /// A partial value.
    pub fn relu(&self) -> Result<Self> {
        self.zip("nx::Tensor::relu", &[], false, |p, l| {
            let z = p.float(0.0);
            p.max(l[0], z)
        })
    }

    /// `upstream` where `self > 0`, else 0: the gradient of [`Tensor::relu`] at `self`.
    ///
    /// # Errors
    /// Operands placed differently; a partial operand.
    pub fn relu_backward(&self, upstream: &Tensor<'d, T>) -> Result<Self> {
        self.zip("nx::Tensor::relu_backward", &[upstream], false, |p, l| {
            let z = p.float(0.0);
            let pos = p.compare(CmpOp::Gt, l[0], z);
            p.select(pos, l[1], z)
        })
    }

    /// `op self`, elementwise.
    ///
    /// # Errors
    /// A partial value.
    pub fn unary(&self, op: UnOp) -> Result<Self> {
        self.zip("nx::Tensor::unary", &[], false, |p, l| p.unary(op, l[0]))
    }

    /// The matrix product `self [m, k] · other [k, n]`: [`Tensor::contract`] with one contracting
    /// pair.
    ///
    /// # Errors
    /// As [`Tensor::contract`].
    pub fn matmul(&self, other: &Tensor<'d, T>) -> Result<Self> {
        if self.shape.len() != 2 || other.shape.len() != 2 || self.shape[1] != other.shape[0] {
            return Err(err(
                "nx::Tensor::matmul",
                format!("needs [m, k] · [k, n], got {:?} · {:?}", self.shape, other.shape),
            ));
        }
        self.contract(other, &Contraction::matmul(0))
    }

    /// The general contraction `spec` of `self` with `other` (result axes: batch pairs, then this
    /// operand's free axes, then the other's). Each result axis is cut as its operand cuts it; a
    /// batch pair must be cut alike on both sides; contracting pairs cut alike on both sides
    /// (over the same mesh axes) make the result a sum over those mesh axes.
    ///
    /// # Errors
    /// Pairs of different extents or past the ranks; placements over different meshes; pairs cut
    /// differently on the two sides; a mesh axis that would cut two result axes; partial operands.
    pub fn contract(&self, other: &Tensor<'d, T>, spec: &Contraction) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::contract";
        let (shape, placement) = self.contracted(FUNC, other, spec)?;
        let local = match (&self.local, &other.local, placement.window(&shape, self.ctx.index())?) {
            (Some(a), Some(b), Some(w)) => {
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &window_shape(&w))?;
                let ops: [&dyn nx_kernels::Operand; 2] = [a, b];
                check(FUNC, self.ctx.host().contract(spec, &dst, a, b, None), &ops)?;
                Some(dst)
            }
            _ => None,
        };
        Ok(self.with_local(placement, shape, local))
    }

    /// The shape and placement of `self · other` under `spec` (the contraction rule), for `func`.
    fn contracted(
        &self,
        func: &'static str,
        other: &Tensor<'d, T>,
        spec: &Contraction,
    ) -> Result<(Vec<usize>, Placement<'d>)> {
        let shape = spec.shape(&self.shape, &other.shape).map_err(|why| err(func, why))?;
        let placement = rules::contract(
            func,
            &self.placement,
            &other.placement,
            self.shape.len(),
            other.shape.len(),
            &spec.batch,
            &spec.contracting,
        )?;
        Ok((shape, placement))
    }

    /// `self · other` (as [`Tensor::contract`]) plus `bias`, broadcast to the result by numpy's
    /// rule (aligned to its trailing axes), in one kernel call: the bias, placed where the
    /// result's windows are (as [`Tensor::add`] requires), is the contraction's initial value, so
    /// each element is `bias + Σ` (an `f32` contraction of at most 512 indices, one block of the
    /// host's product, so gives the bits of `self.contract(other)?.add(bias)`; a longer one adds
    /// the bias before the later blocks' sums). Where the contraction leaves a sum (a
    /// contracting axis cut), the sum is closed first ([`Tensor::place`]) and the bias added after.
    /// The bias is never moved (the opt-in automatic placement of [`Tensor::add`] does not apply):
    /// place it first.
    ///
    /// # Errors
    /// As [`Tensor::contract`] and [`Tensor::add`]; a partial bias; a collective's error closing a
    /// sum.
    pub fn contract_add(&self, other: &Tensor<'d, T>, spec: &Contraction, bias: &Tensor<'d, T>) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::contract_add";
        if bias.placement.is_partial() {
            return Err(err(FUNC, format!("a partial bias ({}): close it with place first", bias.placement)));
        }
        let (shape, placement) = self.contracted(FUNC, other, spec)?;
        if placement.is_partial() {
            let y = self.contract(other, spec)?;
            let y = if y.placement.is_partial() { y.place(&y.placement.closed())? } else { y };
            return y.add(bias);
        }
        rules::elementwise(FUNC, &placement, &shape, &bias.placement, &bias.shape)?;
        let local = match (&self.local, &other.local, placement.window(&shape, self.ctx.index())?) {
            (Some(a), Some(b), Some(w)) => {
                let ws = window_shape(&w);
                let init = bias
                    .local
                    .as_ref()
                    .expect("a bias placed as the result holds a window where it does")
                    .apply(&Move::Expand(ws.clone()))?
                    .ok_or_else(|| err(FUNC, format!("a bias of shape {:?} for a result of {ws:?}", bias.shape)))?;
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &ws)?;
                let ops: [&dyn nx_kernels::Operand; 3] = [a, b, &init];
                check(FUNC, self.ctx.host().contract(spec, &dst, a, b, Some(&init)), &ops)?;
                Some(dst)
            }
            _ => None,
        };
        Ok(self.with_local(placement, shape, local))
    }

    /// The 2-D transpose; the cuts follow their axes.
    ///
    /// # Errors
    /// A value that is not 2-D.
    pub fn transpose(&self) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::transpose";
        if self.shape.len() != 2 {
            return Err(err(FUNC, format!("needs a 2-D value, got {:?}", self.shape)));
        }
        let placement = rules::permute(FUNC, &self.placement, &[1, 0])?;
        let local = match &self.local {
            Some(a) => Some(a.apply(&Move::Permute(vec![1, 0]))?.expect("a permutation is a view").copy()?),
            None => None,
        };
        Ok(self.with_local(placement, vec![self.shape[1], self.shape[0]], local))
    }

    /// The sum over `axis`: a cut axis leaves a value partial over the mesh axes that cut it, a
    /// whole one a local sum.
    ///
    /// # Errors
    /// An axis past the rank.
    pub fn sum(&self, axis: usize) -> Result<Self> {
        self.summed("nx::Tensor::sum", &[axis], false)
    }

    /// The sum over every axis of `axes` (in any order, each once) in one pass: a cut axis
    /// leaves a value partial over the mesh axes that cut it, as [`Tensor::sum`] does. No axis
    /// answers the value itself.
    ///
    /// # Errors
    /// An axis past the rank or named twice.
    pub fn sum_axes(&self, axes: &[usize]) -> Result<Self> {
        self.summed("nx::Tensor::sum_axes", axes, false)
    }

    /// The sum of the squares of every element (of shape `[]`; partial over the mesh axes that
    /// cut this value), in one pass.
    ///
    /// # Errors
    /// A partial value (its squares are not the squares' sum: close it first).
    pub fn sum_squares(&self) -> Result<Self> {
        self.summed("nx::Tensor::sum_squares", &(0..self.shape.len()).collect::<Vec<_>>(), true)
    }

    fn summed(&self, func: &'static str, axes: &[usize], square: bool) -> Result<Self> {
        if let Some(a) = axes.iter().find(|&&a| a >= self.shape.len()) {
            return Err(err(func, format!("axis {a} of a value of shape {:?}", self.shape)));
        }
        if axes.is_empty() && !square {
            return Ok(self.clone());
        }
        if square && self.placement.is_partial() {
            return Err(err(func, format!("the squares of a partial value ({}): close it first", self.placement)));
        }
        let placement = rules::reduce(func, &self.placement, axes)?;
        let kept = |s: &[usize]| -> Vec<usize> {
            s.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &n)| n).collect()
        };
        let shape = kept(&self.shape);
        let local = match &self.local {
            Some(a) => Some(sum_local(func, &self.ctx, a, axes, square)?),
            None => None,
        };
        Ok(self.with_local(placement, shape, local))
    }

    /// Runs `f` on this rank's window (shard_map): the result is declared of global `shape` at
    /// `placement`, and each rank's output must be its window there.
    ///
    /// # Errors
    /// `f`'s error; [`Error::Invalid`] where an output is not its rank's window.
    pub fn local_map<U: Reducible>(
        &self,
        shape: &[usize],
        placement: &Placement<'d>,
        f: impl FnOnce(&Array<T>) -> Result<Array<U>>,
    ) -> Result<Tensor<'d, U>> {
        let out = match &self.local {
            Some(a) => Some(f(a)?),
            None => None,
        };
        Tensor::from_local(&self.ctx, shape, placement, out)
    }
}

/// The sum of `a`'s elements (or of their squares, where `square`) along `axes`, on this rank:
/// `a`'s shape without `axes`.
///
/// # Errors
/// The kernel's refusals, named by `func`.
pub(crate) fn sum_local<T: Reducible>(
    func: &'static str,
    ctx: &Ctx<'_>,
    a: &Array<T>,
    axes: &[usize],
    square: bool,
) -> Result<Array<T>> {
    let kept: Vec<usize> = a.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &n)| n).collect();
    let dst = Array::<T>::uninit_on(ctx.rig(), &kept)?;
    let mut p = Prog::new(&[T::DTYPE]);
    let l = p.load(0);
    let l = if square { p.mul(l, l) } else { l };
    p.output(l);
    let ops: [&dyn nx_kernels::Operand; 1] = [a];
    check(func, ctx.host().reduce(&p, a.shape(), axes, &[Reduction::Sum], &[&dst], &[a]), &ops)?;
    Ok(dst)
}

pub(crate) fn check(func: &'static str, a: Answer, ops: &[&dyn nx_kernels::Operand]) -> Result<()> {
    match a {
        Answer::Done => Ok(()),
        Answer::Declined => Err(err(func, "the host kernels decline this case".into())),
        r => Err(refused(func, r, ops).into()),
    }
}

/// The uniform sample in [0, 1) [`Tensor::rand`] puts at flat index `index` for `seed`.
pub fn uniform(seed: u64, index: u64) -> f64 {
    let z = splitmix64(seed ^ splitmix64(index));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The splitmix64 finaliser: a well-mixed 64-bit hash of `z` (the generator behind
/// [`uniform`] and [`normal`]).
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The standard normal sample [`Tensor::randn`] puts at flat index `index` for `seed`: two
/// splitmix64 draws through Box–Muller. Public so that a single-device reference can rebuild the
/// same values.
pub fn normal(seed: u64, index: u64) -> f64 {
    let a = splitmix64(seed ^ splitmix64(index.wrapping_mul(2)));
    let b = splitmix64(seed ^ splitmix64(index.wrapping_mul(2) + 1));
    let u1 = ((a >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (b >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `T`'s element from a float, by nx's conversion rules.
pub fn from_f64<T: Element>(x: f64) -> T {
    T::from_value(Value::Float(x))
}
