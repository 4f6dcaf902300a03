//! The differentiable ops of [`Var`]: elementwise, contractions, reductions, moves, placement.

use nx_collectives::Reducible;
use nx_kernels::prog::{CmpOp, Prog, UnOp, V};
use nx_kernels::Contraction;

use super::Var;
use crate::tensor::err;
use crate::{Placement, Result, Tensor};

/// `g` at `p` (closed), placed there where it is not.
///
/// Placements that are `equal` (the same windows on every device) but spelled otherwise — a cut
/// over a mesh axis of one device, say — are relabelled without moving a byte, so that the
/// propagation rules, which compare mesh axis names, meet the spelling they expect.
pub(crate) fn fit<'d, T: Reducible>(g: Tensor<'d, T>, p: &Placement<'d>) -> Result<Tensor<'d, T>> {
    let p = p.closed();
    if g.placement.same_spelling(&p) || g.placement.spec() == p.spec() {
        Ok(g)
    } else if g.placement.equal(&p) {
        Ok(g.relabel(p))
    } else {
        g.place(&p)
    }
}

/// `g` where its cuts are `p`'s (a sum allowed, for linear rules), else placed at `closed(p)`.
pub(crate) fn like<'d, T: Reducible>(g: Tensor<'d, T>, p: &Placement<'d>) -> Result<Tensor<'d, T>> {
    if g.placement.same_spelling(p) || g.placement.closed().spec() == p.closed().spec() {
        Ok(g)
    } else {
        fit(g, p)
    }
}

/// `g` summed down to `shape` over the axes numpy's broadcasting added or repeated.
pub(crate) fn sum_to<'d, T: Reducible>(g: Tensor<'d, T>, shape: &[usize]) -> Result<Tensor<'d, T>> {
    if g.shape.len() < shape.len() {
        return Err(err(
            "nx::autodiff::sum_to",
            format!("a gradient of shape {:?} cannot sum to the larger rank of {shape:?}", g.shape),
        ));
    }
    // the leading axes broadcasting added, and the extent-1 axes broadcasting repeated, in one sum
    let lead = g.shape.len().saturating_sub(shape.len());
    let axes: Vec<usize> =
        (0..g.shape.len()).filter(|&a| a < lead || (shape[a - lead] == 1 && g.shape[a] != 1)).collect();
    if axes.is_empty() {
        return Ok(g);
    }
    let s = g.sum_axes(&axes)?;
    if s.shape == shape {
        Ok(s)
    } else {
        s.reshape(shape)
    }
}

/// `shape` with an axis of one element at `axis`.
pub(crate) fn keep(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.insert(axis, 1);
    s
}

impl<'d, T: Reducible> Var<'d, T> {
    pub(crate) fn check_tape(&self, func: &'static str, other: &Var<'d, T>) -> Result<()> {
        if !std::rc::Rc::ptr_eq(&self.tape.inner, &other.tape.inner) {
            return Err(err(func, "operands recorded on different tapes".into()));
        }
        Ok(())
    }

    /// `self + other` ([`Tensor::add`]; `other` may broadcast).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn add(&self, other: &Var<'d, T>) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::add", other)?;
        let out = self.value.add(&other.value)?;
        let (sa, sb) = (self.value.shape.clone(), other.value.shape.clone());
        let pb = other.value.placement.clone();
        Ok(self.tape.record(out, &[self, other], move |g| {
            let gb =
                if other_needs(&sb, &g.shape) { Some(like(sum_to(g.clone(), &sb)?, &pb)?) } else { Some(g.clone()) };
            Ok(vec![Some(sum_to(g, &sa)?), gb])
        }))
    }

    /// `self − other`.
    ///
    /// # Errors
    /// As [`Tensor::sub`].
    pub fn sub(&self, other: &Var<'d, T>) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::sub", other)?;
        let out = self.value.sub(&other.value)?;
        let (sa, sb) = (self.value.shape.clone(), other.value.shape.clone());
        Ok(self.tape.record(out, &[self, other], move |g| {
            let gb = sum_to(g.scale(-1.0)?, &sb)?;
            Ok(vec![Some(sum_to(g, &sa)?), Some(gb)])
        }))
    }

    /// `self · other` elementwise (`other` may broadcast).
    ///
    /// # Errors
    /// As [`Tensor::mul`].
    pub fn mul(&self, other: &Var<'d, T>) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::mul", other)?;
        let out = self.value.mul(&other.value)?;
        let (a, b) = (self.value.clone(), other.value.clone());
        let p = out.placement.clone();
        let (da, db) = (self.id.is_some(), other.id.is_some());
        Ok(self.tape.record(out, &[self, other], move |g| {
            let g = fit(g, &p)?;
            let ga = if da { Some(g.mul(&b)?) } else { None };
            let gb = if db { Some(sum_to(g.mul(&a)?, &b.shape)?) } else { None };
            Ok(vec![ga, gb])
        }))
    }

    /// `self / other` elementwise (`other` may broadcast).
    ///
    /// # Errors
    /// As [`Tensor::mul`].
    pub fn div(&self, other: &Var<'d, T>) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::div", other)?;
        let out = self.value.map(&[&other.value], false, |p, l| p.div(l[0], l[1]))?;
        let (a, b) = (self.value.clone(), other.value.clone());
        let p = out.placement.clone();
        Ok(self.tape.record(out, &[self, other], move |g| {
            let g = fit(g, &p)?;
            let ga = g.map(&[&b], false, |p, l| p.div(l[0], l[1]))?;
            let gb = g.map(&[&a, &b], false, |p, l| {
                let t = p.mul(l[0], l[1]);
                let bb = p.mul(l[2], l[2]);
                let q = p.div(t, bb);
                p.unary(UnOp::Neg, q)
            })?;
            Ok(vec![Some(ga), Some(sum_to(gb, &b.shape)?)])
        }))
    }

    /// `c · self` (linear: a sum stays one).
    ///
    /// # Errors
    /// Kernel refusals.
    pub fn scale(&self, c: f64) -> Result<Self> {
        let out = self.value.scale(c)?;
        Ok(self.tape.record(out, &[self], move |g| Ok(vec![Some(g.scale(c)?)])))
    }

    /// `self + c`.
    ///
    /// # Errors
    /// A partial value.
    pub fn add_scalar(&self, c: f64) -> Result<Self> {
        let out = self.value.add_scalar(c)?;
        Ok(self.tape.record(out, &[self], move |g| Ok(vec![Some(g)])))
    }

    /// An elementwise function: `f` builds the value from `x`, `df` its derivative from `x` and
    /// the value `y`.
    ///
    /// # Errors
    /// A partial value.
    pub fn pointwise(&self, f: impl Fn(&mut Prog, V) -> V, df: impl Fn(&mut Prog, V, V) -> V + 'd) -> Result<Self> {
        let out = self.value.map(&[], false, |p, l| f(p, l[0]))?;
        let (x, y) = (self.value.clone(), out.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &y.placement)?;
            let gx = g.map(&[&x, &y], false, |p, l| {
                let d = df(p, l[1], l[2]);
                p.mul(l[0], d)
            })?;
            Ok(vec![Some(gx)])
        }))
    }

    /// `max(x, 0)`.
    ///
    /// # Errors
    /// A partial value.
    pub fn relu(&self) -> Result<Self> {
        self.pointwise(
            |p, x| {
                let z = p.float(0.0);
                p.max(x, z)
            },
            |p, x, _| {
                let (z, one) = (p.float(0.0), p.float(1.0));
                let c = p.compare(CmpOp::Gt, x, z);
                p.select(c, one, z)
            },
        )
    }

    /// GELU, tanh form (GPT-2's and `torch`'s `approximate="tanh"`):
    /// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`, evaluated as `x·σ(2u)` (the same function:
    /// `(1 + tanh u)/2 = σ(2u)`; an exponential is cheaper than a hyperbolic tangent here).
    ///
    /// # Errors
    /// A partial value.
    pub fn gelu(&self) -> Result<Self> {
        const K: f64 = 0.797_884_560_802_865_4; // √(2/π)
        const C: f64 = 0.044_715;
        // σ(2u) of x
        let gate = |p: &mut Prog, x: V| {
            let (k2, c) = (p.float(2.0 * K), p.float(C));
            let x2 = p.mul(x, x);
            let t = p.mul(c, x2);
            let one = p.float(1.0);
            let t = p.add(one, t);
            let s = p.mul(x, t);
            let u2 = p.mul(k2, s);
            p.unary(UnOp::Sigmoid, u2)
        };
        self.pointwise(
            move |p, x| {
                let s = gate(p, x);
                p.mul(x, s)
            },
            move |p, x, _| {
                // σ + x·σ(1 − σ)·2u′, u′ = √(2/π)(1 + 3c·x²)
                let s = gate(p, x);
                let (one, k2, c3) = (p.float(1.0), p.float(2.0 * K), p.float(3.0 * C));
                let m = p.sub(one, s);
                let x2 = p.mul(x, x);
                let q = p.mul(c3, x2);
                let q = p.add(one, q);
                let du = p.mul(k2, q);
                let b = p.mul(x, s);
                let b = p.mul(b, m);
                let b = p.mul(b, du);
                p.add(s, b)
            },
        )
    }

    /// SiLU `x·σ(x)`.
    ///
    /// # Errors
    /// A partial value.
    pub fn silu(&self) -> Result<Self> {
        self.pointwise(
            |p, x| {
                let s = p.unary(UnOp::Sigmoid, x);
                p.mul(x, s)
            },
            |p, x, _| {
                // σ(x)·(1 + x·(1 − σ(x)))
                let s = p.unary(UnOp::Sigmoid, x);
                let one = p.float(1.0);
                let m = p.sub(one, s);
                let t = p.mul(x, m);
                let t = p.add(one, t);
                p.mul(s, t)
            },
        )
    }

    /// `tanh x`.
    ///
    /// # Errors
    /// A partial value.
    pub fn tanh(&self) -> Result<Self> {
        self.pointwise(
            |p, x| p.unary(UnOp::Tanh, x),
            |p, _, y| {
                let one = p.float(1.0);
                let y2 = p.mul(y, y);
                p.sub(one, y2)
            },
        )
    }

    /// `eˣ`.
    ///
    /// # Errors
    /// A partial value.
    pub fn exp(&self) -> Result<Self> {
        self.pointwise(|p, x| p.unary(UnOp::Exp, x), |_, _, y| y)
    }

    /// `ln x`.
    ///
    /// # Errors
    /// A partial value.
    pub fn log(&self) -> Result<Self> {
        self.pointwise(|p, x| p.unary(UnOp::Log, x), |p, x, _| p.unary(UnOp::Recip, x))
    }

    /// `1/√x`.
    ///
    /// # Errors
    /// A partial value.
    pub fn rsqrt(&self) -> Result<Self> {
        self.pointwise(
            |p, x| p.unary(UnOp::Rsqrt, x),
            |p, x, y| {
                // −y/(2x)
                let h = p.float(-0.5);
                let q = p.div(y, x);
                p.mul(h, q)
            },
        )
    }

    /// `x²`.
    ///
    /// # Errors
    /// A partial value.
    pub fn square(&self) -> Result<Self> {
        self.pointwise(
            |p, x| p.mul(x, x),
            |p, x, _| {
                let two = p.float(2.0);
                p.mul(two, x)
            },
        )
    }

    /// The matrix product `self [m, k] · other [k, n]` ([`Var::contract`]).
    ///
    /// # Errors
    /// As [`Tensor::matmul`].
    pub fn matmul(&self, other: &Var<'d, T>) -> Result<Self> {
        if self.value.shape.len() != 2 || other.value.shape.len() != 2 {
            return Err(err(
                "nx::autodiff::Var::matmul",
                format!("needs [m, k] · [k, n], got {:?} · {:?}", self.value.shape, other.value.shape),
            ));
        }
        self.contract(other, &Contraction::matmul(0))
    }

    /// The contraction `spec` ([`Tensor::contract`]). The gradient in each operand is the
    /// contraction of the output's gradient with the other operand, permuted to the operand's
    /// axes.
    ///
    /// # Errors
    /// As [`Tensor::contract`].
    pub fn contract(&self, other: &Var<'d, T>, spec: &Contraction) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::contract", other)?;
        let out = self.value.contract(&other.value, spec)?;
        let (a, b) = (self.value.clone(), other.value.clone());
        let (da, db) = (self.id.is_some(), other.id.is_some());
        let p = out.placement.clone();
        let spec = spec.clone();
        Ok(self.tape.record(out, &[self, other], move |g| {
            let g = fit(g, &p)?;
            let ga = if da { Some(contract_grad(&g, &b, &spec, a.shape.len(), false)?) } else { None };
            let gb = if db { Some(contract_grad(&g, &a, &spec, b.shape.len(), true)?) } else { None };
            Ok(vec![ga, gb])
        }))
    }

    /// `self · other + bias` ([`Tensor::contract_add`]: the bias the product's initial value, one
    /// kernel call). Its gradients are those of [`Var::contract`] and of [`Var::add`]: the
    /// output's gradient contracted with the other operand, and summed down to the bias's shape.
    ///
    /// # Errors
    /// As [`Tensor::contract_add`]; a variable of another tape.
    pub fn contract_add(&self, other: &Var<'d, T>, spec: &Contraction, bias: &Var<'d, T>) -> Result<Self> {
        self.check_tape("nx::autodiff::Var::contract_add", other)?;
        self.check_tape("nx::autodiff::Var::contract_add", bias)?;
        let out = self.value.contract_add(&other.value, spec, &bias.value)?;
        let (a, b) = (self.value.clone(), other.value.clone());
        let (da, db, dc) = (self.id.is_some(), other.id.is_some(), bias.id.is_some());
        let (sc, pc) = (bias.value.shape.clone(), bias.value.placement.clone());
        let p = out.placement.clone();
        let spec = spec.clone();
        Ok(self.tape.record(out, &[self, other, bias], move |g| {
            let g = fit(g, &p)?;
            let ga = if da { Some(contract_grad(&g, &b, &spec, a.shape.len(), false)?) } else { None };
            let gb = if db { Some(contract_grad(&g, &a, &spec, b.shape.len(), true)?) } else { None };
            let gc = if dc { Some(like(sum_to(g, &sc)?, &pc)?) } else { None };
            Ok(vec![ga, gb, gc])
        }))
    }

    /// The sum over `axis` ([`Tensor::sum`]).
    ///
    /// # Errors
    /// As [`Tensor::sum`].
    pub fn sum(&self, axis: usize) -> Result<Self> {
        let out = self.value.sum(axis)?;
        let (shape, p, op) = (self.value.shape.clone(), self.value.placement.clone(), out.placement.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &op)?.reshape(&keep(&g_shape(&shape, axis), axis))?;
            Ok(vec![Some(g.expand(&shape, &p.closed())?)])
        }))
    }

    /// The mean over `axis`.
    ///
    /// # Errors
    /// As [`Tensor::sum`].
    pub fn mean(&self, axis: usize) -> Result<Self> {
        let n = *self
            .value
            .shape
            .get(axis)
            .ok_or_else(|| err("nx::autodiff::Var::mean", format!("axis {axis} of {:?}", self.value.shape)))?;
        self.sum(axis)?.scale(1.0 / n.max(1) as f64)
    }

    /// The sum of every element: a scalar.
    ///
    /// # Errors
    /// As [`Tensor::sum`].
    pub fn sum_all(&self) -> Result<Self> {
        let mut v = self.clone();
        while !v.value.shape.is_empty() {
            v = v.sum(v.value.shape.len() - 1)?;
        }
        Ok(v)
    }

    /// The greatest element along `axis` ([`Tensor::max`]); the gradient goes to the maxima,
    /// split evenly among ties (`torch.amax`'s rule), across ranks where the axis is cut.
    ///
    /// # Errors
    /// As [`Tensor::max`].
    pub fn max(&self, axis: usize) -> Result<Self> {
        let out = self.value.max(axis)?;
        let (x, y) = (self.value.clone(), out.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &y.placement)?;
            let ks = keep(&y.shape, axis);
            let ye = y.reshape(&ks)?.expand(&x.shape, &x.placement)?;
            let mask = x.map(&[&ye], false, |p, l| {
                let (z, one) = (p.float(0.0), p.float(1.0));
                let c = p.compare(CmpOp::Eq, l[0], l[1]);
                p.select(c, one, z)
            })?;
            let count = fit(mask.sum(axis)?, &y.placement)?;
            let share = g.map(&[&count], false, |p, l| p.div(l[0], l[1]))?;
            let share = share.reshape(&ks)?.expand(&x.shape, &x.placement)?;
            Ok(vec![Some(mask.mul(&share)?)])
        }))
    }

    /// The same elements under `shape` ([`Tensor::reshape`]).
    ///
    /// # Errors
    /// As [`Tensor::reshape`].
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        let out = self.value.reshape(shape)?;
        let (from, p, op) = (self.value.shape.clone(), self.value.placement.clone(), out.placement.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let g = like(g, &op)?.reshape(&from)?;
            Ok(vec![Some(like(g, &p)?)])
        }))
    }

    /// The axes reordered ([`Tensor::permute`]).
    ///
    /// # Errors
    /// As [`Tensor::permute`].
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let out = self.value.permute(perm)?;
        let mut inv = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        let op = out.placement.clone();
        Ok(self.tape.record(out, &[self], move |g| Ok(vec![Some(like(g, &op)?.permute(&inv)?)])))
    }

    /// Elements `start..start + len` of `axis` ([`Tensor::narrow`]); the gradient padded with
    /// zeros.
    ///
    /// # Errors
    /// As [`Tensor::narrow`].
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        let out = self.value.narrow(axis, start, len)?;
        let (n, r, op) = (self.value.shape[axis], self.value.shape.len(), out.placement.clone());
        Ok(self.tape.record(out, &[self], move |g| {
            let (mut lo, mut hi) = (vec![0isize; r], vec![0isize; r]);
            lo[axis] = start as isize;
            hi[axis] = (n - start - len) as isize;
            Ok(vec![Some(like(g, &op)?.pad(&lo, &hi, 0.0)?)])
        }))
    }

    /// `self` and `others` joined along `axis` ([`Tensor::concat`]).
    ///
    /// # Errors
    /// As [`Tensor::concat`].
    pub fn concat(&self, others: &[&Var<'d, T>], axis: usize) -> Result<Self> {
        for o in others {
            self.check_tape("nx::autodiff::Var::concat", o)?;
        }
        let vals: Vec<&Tensor<'d, T>> = others.iter().map(|o| &o.value).collect();
        let out = self.value.concat(&vals, axis)?;
        let lens: Vec<usize> =
            std::iter::once(self.value.shape[axis]).chain(others.iter().map(|o| o.value.shape[axis])).collect();
        let op = out.placement.clone();
        let mut all = vec![self];
        all.extend(others.iter().copied());
        Ok(self.tape.record(out, &all, move |g| {
            let g = like(g, &op)?;
            let mut at = 0;
            lens.iter()
                .map(|&l| {
                    let piece = g.narrow(axis, at, l)?;
                    at += l;
                    Ok(Some(piece))
                })
                .collect()
        }))
    }

    /// The same value at `to` ([`Tensor::place`]); the backward places the gradient at
    /// `closed(from)` (the module docs' table).
    ///
    /// # Errors
    /// As [`Tensor::place`].
    pub fn place(&self, to: &Placement<'d>) -> Result<Self> {
        let out = self.value.place(to)?;
        let from = self.value.placement.clone();
        Ok(self.tape.record(out, &[self], move |g| Ok(vec![Some(fit(g, &from)?)])))
    }

    /// `softmax` along `axis` (whole on the placement).
    ///
    /// # Errors
    /// As [`Tensor::softmax`].
    pub fn softmax(&self, axis: usize) -> Result<Self> {
        let out = self.value.softmax(axis)?;
        let y = out.clone();
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &y.placement)?;
            let s = g.mul(&y)?.sum(axis)?.reshape(&keep(&g_shape(&y.shape, axis), axis))?;
            let gx = g.map(&[&y, &s], false, |p, l| {
                let d = p.sub(l[0], l[2]);
                p.mul(l[1], d)
            })?;
            Ok(vec![Some(gx)])
        }))
    }

    /// `log_softmax` along `axis` (whole on the placement).
    ///
    /// # Errors
    /// As [`Tensor::log_softmax`].
    pub fn log_softmax(&self, axis: usize) -> Result<Self> {
        let out = self.value.log_softmax(axis)?;
        let y = out.clone();
        Ok(self.tape.record(out, &[self], move |g| {
            let g = fit(g, &y.placement)?;
            let s = g.sum(axis)?.reshape(&keep(&g_shape(&y.shape, axis), axis))?;
            let gx = g.map(&[&y, &s], false, |p, l| {
                let e = p.unary(UnOp::Exp, l[1]);
                let t = p.mul(e, l[2]);
                p.sub(l[0], t)
            })?;
            Ok(vec![Some(gx)])
        }))
    }
}

/// Whether a gradient of shape `g` must be summed down to an operand of shape `b`.
fn other_needs(b: &[usize], g: &[usize]) -> bool {
    b != g
}

/// `shape` without `axis`.
fn g_shape(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.remove(axis);
    s
}

/// The gradient of a contraction in one operand (`a`, of rank `rank`, or `b` where `of_b`): the
/// output's gradient `g` contracted with the other operand `o` over the other's free axes, as
/// `g · o` or as `o · g`, whichever lands in the operand's axes (`dW = xᵀ·dy` of a linear layer
/// as `x · dy` over the rows, not `dy · x` and a transposing copy), else `g · o` permuted to them.
/// The two orders give the same bits: each product's factors commute exactly and the contracted
/// indices are summed in the same order.
fn contract_grad<'d, T: Reducible>(
    g: &Tensor<'d, T>,
    o: &Tensor<'d, T>,
    spec: &Contraction,
    rank: usize,
    of_b: bool,
) -> Result<Tensor<'d, T>> {
    // (this operand's axis, the other's) for each pair
    let flip = |v: &[(usize, usize)]| -> Vec<(usize, usize)> {
        v.iter().map(|&(x, y)| if of_b { (y, x) } else { (x, y) }).collect()
    };
    let (batch, contracting) = (flip(&spec.batch), flip(&spec.contracting));
    let nb = batch.len();
    let used_mine: Vec<usize> = batch.iter().chain(&contracting).map(|p| p.0).collect();
    let used_other: Vec<usize> = batch.iter().chain(&contracting).map(|p| p.1).collect();
    let free_mine: Vec<usize> = (0..rank).filter(|x| !used_mine.contains(x)).collect();
    let free_other: Vec<usize> = (0..o.shape.len()).filter(|x| !used_other.contains(x)).collect();
    // g's axes: batch, a's free, b's free; the other operand's free axes among them
    let start = if of_b { nb } else { nb + free_mine.len() };
    let g_other: Vec<usize> = (start..start + free_other.len()).collect();
    // the axes left of `o` (paired with my contracting axes), in o's order, as mine
    let mut rest: Vec<(usize, usize)> = contracting.iter().map(|&(m, ox)| (ox, m)).collect();
    rest.sort();
    let batch_mine = batch.iter().map(|p| p.0);
    // g · o: batch, g's free axes (my free axes, in order), then o's axes left
    let gfirst: Vec<usize> =
        batch_mine.clone().chain(free_mine.iter().copied()).chain(rest.iter().map(|p| p.1)).collect();
    // o · g: batch, o's axes left, then my free axes
    let ofirst: Vec<usize> = batch_mine.chain(rest.iter().map(|p| p.1)).chain(free_mine.iter().copied()).collect();
    let identity = |src: &[usize]| src.iter().enumerate().all(|(i, &s)| i == s);
    if identity(&ofirst) && !identity(&gfirst) {
        let ospec = Contraction {
            batch: batch.iter().enumerate().map(|(k, p)| (p.1, k)).collect(),
            contracting: free_other.iter().zip(&g_other).map(|(&ox, &gx)| (ox, gx)).collect(),
        };
        return o.contract(g, &ospec);
    }
    let gspec = Contraction {
        batch: batch.iter().enumerate().map(|(k, p)| (k, p.1)).collect(),
        contracting: g_other.iter().zip(&free_other).map(|(&gx, &ox)| (gx, ox)).collect(),
    };
    let r = g.contract(o, &gspec)?;
    if identity(&gfirst) {
        return Ok(r);
    }
    let perm: Vec<usize> = (0..rank).map(|i| gfirst.iter().position(|&s| s == i).expect("every axis once")).collect();
    r.permute(&perm)
}
