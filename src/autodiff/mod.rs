//! Reverse-mode differentiation of the global function a program computes, over placements.
//!
//! A [`Tape`] records, per rank, each op a [`Var`] takes part in, with its backward rule; a
//! [`Tape::backward`] walks it in reverse and answers the gradients of the leaves ([`Grads`]).
//! Every rank records the same ops (SPMD), so the collectives the backward rules issue meet.
//!
//! **Gradients are global values.** The gradient of a value at placement `P` is a tensor of its
//! shape at any placement whose global value is the gradient; its canonical placement is
//! `closed(P)` (`P`'s cuts, no sums): *the gradient of every term of a sum is the whole
//! gradient*. Each rule places an incoming gradient only where its own computation needs it (a
//! nonlinear op needs it closed as its output), so a gradient that is a sum over `dp` (a weight's,
//! under data parallelism) stays one until a consumer closes it: the optimizer by an all-reduce,
//! or ZeRO by a reduce-scatter.
//!
//! **Transitions** (`Var::place`, `P → Q`) are the identity of the global function; the
//! backward is `g.place(closed(P))` from wherever `g` lies, which is the dual of the forward's
//! collective:
//!
//! | forward `P → Q` | backward (from `g`'s placement to `closed(P)`) |
//! |---|---|
//! | all-gather (cut → copies) | reduce-scatter where `g` is a sum over those axes, else a local slice |
//! | local slice (copies → cut) | all-gather |
//! | all-to-all (cut axis a → cut axis b) | the all-to-all back |
//! | closing a sum by an all-reduce (a sum → copies) | no communication: every term's gradient is the whole gradient, which the copies hold |
//! | closing a sum by a reduce-scatter (a sum → cut) | all-gather: every term's gradient is the whole gradient |
//! | zero fill (closed → a sum) | no communication: `g` already lies on each term's ranks |
//!
//! Because gradients are values rather than per-rank buffers, a sum can never be counted twice:
//! adding a bias with copies to a sum over `tp` is refused in the forward ([`crate::Tensor`]'s
//! rules), so the `tp×` bias gradient DTensor's users meet cannot arise.
//!
//! **Ops** and their gradient placements:
//!
//! | op | gradient of each operand |
//! |---|---|
//! | `add`, `sub`, `scale`, `add_scalar` | the incoming gradient (summed over broadcast axes: a sum over the mesh axes that cut them) |
//! | `mul`, `div`, pointwise (`relu`, `gelu`, `silu`, `tanh`, `exp`, `log`, `rsqrt`, …) | at the output's placement (closed first) |
//! | `contract`, `matmul` | contractions of the gradient with the other operand: a sum over the mesh axes that cut the other operand's free axes (Megatron's `f`/`g` all-reduces, placed lazily) |
//! | `contract_add` (a `Linear` with a bias: the bias the product's initial value) | `contract`'s for the operands; the bias's as `add`'s (summed over its broadcast axes) |
//! | `sum`, `mean` | the gradient expanded along the axis, at `closed(P)` |
//! | `max` | to the maxima, split evenly among ties (across ranks where the axis is cut); a NaN row's gradient is NaN |
//! | `reshape`, `permute`, `narrow`, `concat` | the inverse move (`narrow`: zero padding) |
//! | `softmax`, `log_softmax` | local (the axis is whole) |
//! | `layer_norm` (fused), `rms_norm` | local for `x` (the last axis is whole); the scale's and shift's a sum over the mesh axes cutting the rows |
//! | `dropout` | the gradient through the same mask (a function of the seed and the global index) |
//! | `embedding` | a deterministic scatter-add into the table's rows: a sum over the index's mesh axes |
//! | `cross_entropy` | `(softmax − one-hot)/n` on each rank's classes: the class axis may be cut (vocabulary parallel), its maxima and sums closed across ranks, the logits never gathered |
//! | `attention` | one fused kernel per rank's heads: P recomputed from `q`, `k` and the forward's log-sum-exp, `D = rowsum(dO ∘ O)` |
//! | `place` | the table above |
//!
//! `Tape::no_grad` runs a closure without recording; [`Var::detach`] cuts a value off the tape;
//! [`Grads::accumulate`] adds the gradients of several backward calls (micro-batches); a backward
//! frees what it walked (the saved tensors), and a second one through freed ops is an error.

mod nn_ops;
mod ops;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use nx_collectives::Reducible;

use crate::tensor::err;
use crate::{Placement, Result, Tensor};

pub use nn_ops::Dropout;

type Back<'d, T> = Box<dyn FnOnce(Tensor<'d, T>) -> Result<Vec<Option<Tensor<'d, T>>>> + 'd>;

enum Node<'d, T: Reducible> {
    /// A value whose gradient is answered, with its name if a parameter.
    Leaf(Option<String>),
    /// An op: its inputs' ids (`None` for constants) and backward rule.
    Op(Vec<Option<usize>>, Back<'d, T>),
    /// An op a backward has walked.
    Freed,
}

struct Inner<'d, T: Reducible> {
    nodes: Vec<Node<'d, T>>,
    recording: bool,
}

/// A recording of the ops of one program on one rank, for [`Tape::backward`]. Cheap to clone
/// (a shared handle); one per training step is usual.
///
/// # Examples
///
/// ```
/// use nx::autodiff::Tape;
/// use nx::{LaunchOptions, Placement, Tensor};
///
/// nx::launch_with(&LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
///     let tape = Tape::new();
///     let rows = Placement::split(0, ctx.devices())?;
///     let x = tape.constant(Tensor::<f64>::from_fn(ctx, &[4, 3], &rows, |i| (i[0] + i[1]) as f64)?);
///     let w = tape.param("w", Tensor::<f64>::from_fn(ctx, &[3, 2], &Placement::on(ctx.devices()), |i| i[1] as f64)?);
///     // loss = Σ (x·w): its gradient in w is xᵀ·1, a sum over the devices' rows
///     let loss = x.matmul(&w)?.sum(1)?.sum(0)?;
///     let grads = tape.backward(&loss)?;
///     let g = grads.named("w").unwrap().full()?.to_vec()?;
///     assert_eq!(g, [6.0, 6.0, 10.0, 10.0, 14.0, 14.0]);
///     Ok(())
/// })
/// .unwrap();
/// ```
pub struct Tape<'d, T: Reducible> {
    inner: Rc<RefCell<Inner<'d, T>>>,
}

impl<T: Reducible> Clone for Tape<'_, T> {
    fn clone(&self) -> Self {
        Tape { inner: self.inner.clone() }
    }
}

impl<T: Reducible> Default for Tape<'_, T> {
    fn default() -> Self {
        Tape::new()
    }
}

impl<T: Reducible> std::fmt::Debug for Tape<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.borrow();
        write!(f, "Tape({} nodes, recording {})", i.nodes.len(), i.recording)
    }
}

/// A value on a [`Tape`]: a [`Tensor`] and, where it depends on a leaf, its node.
#[derive(Clone)]
pub struct Var<'d, T: Reducible> {
    pub(crate) value: Tensor<'d, T>,
    pub(crate) id: Option<usize>,
    pub(crate) tape: Tape<'d, T>,
}

impl<T: Reducible> std::fmt::Debug for Var<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var({:?}, node {:?})", self.value, self.id)
    }
}

impl<'d, T: Reducible> Tape<'d, T> {
    /// An empty tape, recording.
    pub fn new() -> Self {
        Tape { inner: Rc::new(RefCell::new(Inner { nodes: Vec::new(), recording: true })) }
    }

    fn push(&self, node: Node<'d, T>) -> usize {
        let mut i = self.inner.borrow_mut();
        i.nodes.push(node);
        i.nodes.len() - 1
    }

    /// A leaf whose gradient [`Tape::backward`] answers ([`Grads::of`]).
    pub fn leaf(&self, value: Tensor<'d, T>) -> Var<'d, T> {
        let id = self.push(Node::Leaf(None));
        Var { value, id: Some(id), tape: self.clone() }
    }

    /// A named leaf (a parameter): its gradient is also answered by name ([`Grads::named`]).
    pub fn param(&self, name: &str, value: Tensor<'d, T>) -> Var<'d, T> {
        let id = self.push(Node::Leaf(Some(name.to_string())));
        Var { value, id: Some(id), tape: self.clone() }
    }

    /// A value with no gradient (data, masks).
    pub fn constant(&self, value: Tensor<'d, T>) -> Var<'d, T> {
        Var { value, id: None, tape: self.clone() }
    }

    /// Runs `f` without recording: every value it makes is a constant.
    ///
    /// # Errors
    /// `f`'s.
    pub fn no_grad<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let was = std::mem::replace(&mut self.inner.borrow_mut().recording, false);
        let out = f();
        self.inner.borrow_mut().recording = was;
        out
    }

    /// The number of nodes recorded (walked ones included).
    pub fn len(&self) -> usize {
        self.inner.borrow().nodes.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `value` recorded as the result of an op of `inputs` whose backward maps the output's
    /// gradient to each input's (`None`: no gradient); a constant where no input has a node or
    /// the tape does not record.
    pub(crate) fn record(
        &self,
        value: Tensor<'d, T>,
        inputs: &[&Var<'d, T>],
        back: impl FnOnce(Tensor<'d, T>) -> Result<Vec<Option<Tensor<'d, T>>>> + 'd,
    ) -> Var<'d, T> {
        let live = self.inner.borrow().recording && inputs.iter().any(|v| v.id.is_some());
        if !live {
            return Var { value, id: None, tape: self.clone() };
        }
        let ids = inputs.iter().map(|v| v.id).collect();
        let id = self.push(Node::Op(ids, Box::new(back)));
        Var { value, id: Some(id), tape: self.clone() }
    }

    /// The gradients of `loss` (a scalar, or any value: the gradient of the sum of its elements)
    /// in every leaf it depends on. Frees the ops it walks.
    ///
    /// # Errors
    /// A loss with no node on this tape; a walk through ops an earlier backward freed; the
    /// errors of the backward rules (collectives included).
    pub fn backward(&self, loss: &Var<'d, T>) -> Result<Grads<'d, T>> {
        let seed = Tensor::from_fn(&loss.value.ctx, &loss.value.shape, &loss.value.placement.closed(), |_| {
            crate::from_f64::<T>(1.0)
        })?;
        self.backward_with(loss, seed)
    }

    /// [`Tape::backward`] from the gradient `seed` of `loss` (its shape, at any placement).
    ///
    /// # Errors
    /// As [`Tape::backward`]; a seed of another shape.
    pub fn backward_with(&self, loss: &Var<'d, T>, seed: Tensor<'d, T>) -> Result<Grads<'d, T>> {
        const FUNC: &str = "nx::autodiff::Tape::backward";
        let Some(top) = loss.id else {
            return Err(err(FUNC, "the loss depends on no leaf of this tape (a constant)".into()));
        };
        if !Rc::ptr_eq(&loss.tape.inner, &self.inner) {
            return Err(err(FUNC, "the loss was recorded on another tape".into()));
        }
        if seed.shape != loss.value.shape {
            return Err(err(FUNC, format!("a seed of shape {:?} for a loss of {:?}", seed.shape, loss.value.shape)));
        }
        let mut pending: Vec<Option<Tensor<'d, T>>> = (0..=top).map(|_| None).collect();
        pending[top] = Some(seed);
        let mut out = Grads { tape: Some(self.inner.clone()), ..Grads::default() };
        for id in (0..=top).rev() {
            let Some(g) = pending[id].take() else { continue };
            let node = std::mem::replace(&mut self.inner.borrow_mut().nodes[id], Node::Freed);
            match node {
                Node::Leaf(name) => {
                    if let Some(n) = &name {
                        // two leaves of one name (a parameter bound twice): their gradients add
                        let mut slot = out.names.remove(n);
                        accumulate(&mut slot, g.clone())?;
                        out.names.insert(n.clone(), slot.expect("accumulate fills the slot"));
                    }
                    out.ids.insert(id, g);
                    self.inner.borrow_mut().nodes[id] = Node::Leaf(name);
                }
                Node::Freed => {
                    return Err(err(FUNC, format!("node {id} was freed by an earlier backward")));
                }
                Node::Op(inputs, back) => {
                    let grads = back(g)?;
                    for (input, grad) in inputs.into_iter().zip(grads) {
                        if let (Some(i), Some(gr)) = (input, grad) {
                            accumulate(&mut pending[i], gr)?;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// `slot += g`, `g` placed as the slot's value where they differ.
fn accumulate<'d, T: Reducible>(slot: &mut Option<Tensor<'d, T>>, g: Tensor<'d, T>) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(s) => {
            let g = if g.placement.equal(&s.placement) { g } else { g.place(&s.placement)? };
            s.add(&g)?
        }
    });
    Ok(())
}

/// The gradients a [`Tape::backward`] answers: by leaf and by parameter name.
pub struct Grads<'d, T: Reducible> {
    ids: HashMap<usize, Tensor<'d, T>>,
    names: BTreeMap<String, Tensor<'d, T>>,
    /// The tape whose leaves `ids` numbers (none after a cast or an accumulation).
    tape: Option<Rc<RefCell<Inner<'d, T>>>>,
}

impl<T: Reducible> Default for Grads<'_, T> {
    fn default() -> Self {
        Grads { ids: HashMap::new(), names: BTreeMap::new(), tape: None }
    }
}

impl<T: Reducible> std::fmt::Debug for Grads<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.names.iter()).finish()
    }
}

impl<'d, T: Reducible> Grads<'d, T> {
    /// The gradient in `leaf` (at the placement its backward left it: a sum where it is one), or
    /// `None` where the loss does not depend on it, the leaf is of another tape, or these
    /// gradients were accumulated or cast (which keep the named ones only).
    pub fn of(&self, leaf: &Var<'d, T>) -> Option<&Tensor<'d, T>> {
        match &self.tape {
            Some(t) if Rc::ptr_eq(t, &leaf.tape.inner) => leaf.id.and_then(|i| self.ids.get(&i)),
            _ => None,
        }
    }

    /// The gradient in the parameter `name`, or `None`.
    pub fn named(&self, name: &str) -> Option<&Tensor<'d, T>> {
        self.names.get(name)
    }

    /// The named gradients, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Tensor<'d, T>)> {
        self.names.iter()
    }

    /// Adds `other`'s named gradients into these (gradient accumulation over micro-batches);
    /// placed as these where they differ. Afterwards only the named gradients are answered.
    ///
    /// # Errors
    /// The collectives' errors of placing.
    pub fn accumulate(&mut self, other: Grads<'d, T>) -> Result<()> {
        for (n, g) in other.names {
            let mut slot = self.names.remove(&n);
            accumulate(&mut slot, g)?;
            self.names.insert(n, slot.expect("accumulate fills the slot"));
        }
        self.ids.clear();
        self.tape = None;
        Ok(())
    }

    /// The named gradients converted to `U` (mixed precision: `bf16` gradients for `f32` master
    /// weights).
    ///
    /// # Errors
    /// Kernel refusals of the conversion.
    pub fn cast<U: Reducible>(&self) -> Result<Grads<'d, U>> {
        let names = self.names.iter().map(|(n, g)| Ok((n.clone(), g.cast::<U>()?))).collect::<Result<_>>()?;
        Ok(Grads { ids: HashMap::new(), names, tape: None })
    }

    /// Replaces the gradient of `name` (after clipping, or placing).
    pub fn set(&mut self, name: &str, g: Tensor<'d, T>) {
        self.names.insert(name.to_string(), g);
    }
}

impl<'d, T: Reducible> Var<'d, T> {
    /// The value.
    pub fn value(&self) -> &Tensor<'d, T> {
        &self.value
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.value.shape
    }

    /// The placement.
    pub fn placement(&self) -> &Placement<'d> {
        &self.value.placement
    }

    /// Whether the value depends on a leaf (has a node on the tape).
    pub fn requires_grad(&self) -> bool {
        self.id.is_some()
    }

    /// The same value, cut off the tape: no gradient flows through it.
    pub fn detach(&self) -> Var<'d, T> {
        Var { value: self.value.clone(), id: None, tape: self.tape.clone() }
    }

    /// The tape it is recorded on.
    pub fn tape(&self) -> &Tape<'d, T> {
        &self.tape
    }
}
