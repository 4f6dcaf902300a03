//! Mixed-precision policies: plain, immutable data handed to the calls that use it.
//!
//! A [`Policy`] names three dtypes — `params` (what parameters are stored in), `compute` (what
//! matrix work runs in), `output` (what results are returned in) — spelled as JAX's jmp does:
//! `"params=float32,compute=float16,output=float32"`. Op classes follow PyTorch's autocast tables:
//! [`OpClass::Float32`] ops compute in `f32` whatever the policy, [`OpClass::Compute`] ops in the
//! compute dtype, [`OpClass::Widest`] ops in the widest of their inputs; other ops keep their
//! inputs' dtypes.

use std::fmt;
use std::str::FromStr;

use super::{promote, Dtype};
use crate::{Error, Result};

/// How an op picks the dtype it computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    /// Numerically sensitive ops: always `f32` (softmax, norms, losses, exp/log, sums…).
    Float32,
    /// Matrix work: the policy's compute dtype (mm, matmul, linear, conv, bmm, attention…).
    Compute,
    /// Ops mixing inputs: the widest float among them (addcmul, cat, stack, where…).
    Widest,
    /// Everything else keeps its inputs' dtypes.
    Keep,
}

const FLOAT32_OPS: &[&str] = &[
    "softmax",
    "log_softmax",
    "layer_norm",
    "group_norm",
    "batch_norm",
    "rms_norm",
    "norm",
    "exp",
    "log",
    "log1p",
    "expm1",
    "pow",
    "sum",
    "prod",
    "cumsum",
    "cumprod",
    "mean",
    "var",
    "std",
    "logsumexp",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "acos",
    "asin",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    "reciprocal",
    "rsqrt",
    "softplus",
    "cosine_similarity",
    "dist",
    "pdist",
    "cdist",
    "renorm",
];
const COMPUTE_OPS: &[&str] = &[
    "mm",
    "matmul",
    "bmm",
    "addmm",
    "addbmm",
    "baddbmm",
    "addmv",
    "mv",
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "chain_matmul",
    "multi_dot",
    "scaled_dot_product_attention",
    "einsum",
    "contract",
];
const WIDEST_OPS: &[&str] =
    &["addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "cat", "stack", "index_copy", "where", "lerp"];

/// The class of `op` (PyTorch's operator names).
pub fn op_class(op: &str) -> OpClass {
    if FLOAT32_OPS.contains(&op) {
        OpClass::Float32
    } else if COMPUTE_OPS.contains(&op) {
        OpClass::Compute
    } else if WIDEST_OPS.contains(&op) {
        OpClass::Widest
    } else {
        OpClass::Keep
    }
}

/// A mixed-precision policy. Never changes: [`Policy::replace`] makes a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The dtype parameters are stored in.
    pub params: Dtype,
    /// The dtype matrix work computes in.
    pub compute: Dtype,
    /// The dtype results are returned in.
    pub output: Dtype,
}

impl Default for Policy {
    /// Everything in `f32`.
    fn default() -> Self {
        Policy { params: Dtype::F32, compute: Dtype::F32, output: Dtype::F32 }
    }
}

/// Which dtypes [`Policy::replace`] changes; `None` keeps the old one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyChange {
    /// A new `params`.
    pub params: Option<Dtype>,
    /// A new `compute`.
    pub compute: Option<Dtype>,
    /// A new `output`.
    pub output: Option<Dtype>,
}

impl Policy {
    /// A new policy with `change` applied.
    pub fn replace(&self, change: PolicyChange) -> Policy {
        Policy {
            params: change.params.unwrap_or(self.params),
            compute: change.compute.unwrap_or(self.compute),
            output: change.output.unwrap_or(self.output),
        }
    }

    /// The dtype `op` computes in, given its inputs' dtypes; `None` for an op that keeps its
    /// inputs' dtypes (or no float input for [`OpClass::Widest`]).
    pub fn compute_dtype(&self, op: &str, inputs: &[Dtype]) -> Option<Dtype> {
        match op_class(op) {
            OpClass::Float32 => Some(Dtype::F32),
            OpClass::Compute => Some(self.compute),
            OpClass::Widest => {
                let floats: Vec<Dtype> = inputs.iter().copied().filter(|d| d.is_float()).collect();
                promote::promoted(&floats).or_else(|| (!floats.is_empty()).then_some(Dtype::F32))
            }
            OpClass::Keep => None,
        }
    }

    /// `value`, a fill constant of `op` meant for another dtype (a mask sentinel such as
    /// `-3.39e38`), clamped into `dtype`'s finite range so that it stays finite there.
    pub fn fill_value(&self, _op: &str, value: f64, dtype: Dtype) -> f64 {
        if value.is_nan() || !dtype.is_float() {
            return value;
        }
        value.clamp(dtype.min_value(), dtype.max_value())
    }
}

impl fmt::Display for Policy {
    /// `params=float32,compute=float16,output=float32`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "params={},compute={},output={}", self.params.name(), self.compute.name(), self.output.name())
    }
}

impl FromStr for Policy {
    type Err = Error;

    /// Reads `params=…,compute=…,output=…` (any subset, any order; unnamed ones are `f32`), or a
    /// single dtype name for all three.
    fn from_str(text: &str) -> Result<Policy> {
        let bad = |why: String| Error::BadPolicy { text: text.to_string(), why };
        if !text.contains('=') {
            let d: Dtype = text.parse()?;
            return Ok(Policy { params: d, compute: d, output: d });
        }
        let mut p = Policy::default();
        for part in text.split(',') {
            let (key, val) = part.split_once('=').ok_or_else(|| bad(format!("{part:?} is not key=dtype")))?;
            let d: Dtype = val.trim().parse()?;
            match key.trim() {
                "params" | "p" => p.params = d,
                "compute" | "c" => p.compute = d,
                "output" | "o" => p.output = d,
                other => return Err(bad(format!("unknown key {other:?} (params, compute, output)"))),
            }
        }
        Ok(p)
    }
}
