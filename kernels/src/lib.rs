//! Local arrays and per-device kernels for nx.
//!
//! Every device's window of a distributed value is a local [`Array`]: a [`Dtype`], a [`Layout`]
//! (shape, strides and offset in elements) and a [`Buffer`] of device memory. Moves ([`Move`]:
//! reshape, permute, broadcast, window, flip, squeeze, bitcast) are views that never copy. Kernels
//! reach arrays only through [`door`], which claims every operand of a call or none and answers
//! [`Answer::Done`], [`Answer::Declined`] or a refusal; [`refused`] turns a refusal into an
//! [`Error`] naming the function the user called and each operand.
//!
//! The contracts are `reference/nx_array.txt` (arrays, layouts, moves, the door, refusals) and
//! `reference/nbxtensor.txt` (dtype facts, conversions, promotion, policy, shape rules).

mod array;
pub mod buffer;
mod contraction;
pub mod cuda;
pub mod dl;
pub mod dlpack;
pub mod door;
pub mod dtype;
pub mod facts;
pub mod host;
pub mod kernels;
pub mod layout;
mod lease;
pub mod loads;
#[cfg(feature = "ndarray")]
mod ndarray_conv;
pub mod observe;
pub mod prog;
pub mod rig;
mod runs;
pub mod shape;
pub mod simd;

pub use array::{AnyArray, Array};
pub use buffer::{Access, Buffer, Death, MemoryKind};
pub use contraction::{
    accumulates, contraction_accumulator, widens_into, Contraction, Factor, Scale, Segmented, Segments,
};
pub use door::{door, refused, Answer, Operand};
pub use dtype::convert::{convert, converted};
pub use dtype::policy::{OpClass, Policy, PolicyChange};
pub use dtype::promote::{binary_result, float_math_input, promoted, result_type, scalar_result, Scalar};
pub use dtype::{Dtype, Element, Kind, Value};
pub use host::Host;
pub use kernels::{
    attention_grad_refusal, attention_refusal, float_carrier, full_precision, half_spectrum, same_precision,
    scan_refusal, scores_refusal, Attention, AttentionGrad, Direction, Extreme, Kernels, Kv, Reduction, Scatter,
    Scores,
};
pub use layout::{broadcast_shapes, Layout, Move, MAX_RANK};
pub use lease::Lease;
pub use loads::{Load, Pad, Padded, Windows};
pub use prog::{map_refusal, reduce_refusal, Prog};
pub use simd::Simd;

/// The errors of local arrays and kernels. Each message names the function and the offending
/// values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A dtype name nx does not know.
    #[error("nx_kernels::Dtype::from_str: unknown dtype {name:?} (try float32, f32, bf16, torch.float16, BF16, …)")]
    UnknownDtype {
        /// The name given.
        name: String,
    },
    /// Two lengths that must agree.
    #[error("{func}: {what} differ in length: {left} and {right}")]
    LengthMismatch {
        /// The function called.
        func: &'static str,
        /// What the lengths are of.
        what: String,
        /// The first length.
        left: usize,
        /// The second length.
        right: usize,
    },
    /// Two dtypes with no common dtype.
    #[error("nx_kernels::binary_result: {left} and {right} have no common dtype (no signed integer holds u64)")]
    NoPromotion {
        /// The first dtype.
        left: Dtype,
        /// The second dtype.
        right: Dtype,
    },
    /// No dtypes to promote.
    #[error("{func}: no dtypes given")]
    NoDtypes {
        /// The function called.
        func: &'static str,
    },
    /// An integer scalar outside an integer array's range.
    #[error("nx_kernels::scalar_result: the integer {value} is outside {dtype}'s range [{lo}, {hi}]")]
    ScalarOutOfRange {
        /// The scalar.
        value: i128,
        /// The array's dtype.
        dtype: Dtype,
        /// The range's least value.
        lo: i128,
        /// The range's greatest value.
        hi: i128,
    },
    /// Malformed policy text.
    #[error("nx_kernels::Policy::from_str: cannot read {text:?}: {why}")]
    BadPolicy {
        /// The text given.
        text: String,
        /// What was wrong.
        why: String,
    },
    /// Arguments that do not fit a function (a layout, a move, an index, a shape).
    #[error("{func}: {why}")]
    Invalid {
        /// The function called.
        func: &'static str,
        /// What does not fit, with the values.
        why: String,
    },
    /// An allocation failed.
    #[error("{func}: cannot allocate {bytes} bytes{}: {why}", device.as_ref().map(|d| format!(" on {d}")).unwrap_or_default())]
    OutOfMemory {
        /// The function called.
        func: &'static str,
        /// The bytes asked for.
        bytes: usize,
        /// The device, where one was asked.
        device: Option<String>,
        /// Why not (the system refused; past the limit, with what is in use).
        why: String,
    },
    /// A device is lost: the work an access or a call must follow will never be done.
    #[error("{func}: {device} is lost: {why}")]
    Lost {
        /// The function called.
        func: &'static str,
        /// The device, in words.
        device: String,
        /// Why it was lost.
        why: String,
    },
    /// A feature this build lacks.
    #[error("{func}: {device} needs the `{feature}` feature, which this build of nx lacks")]
    NotCompiled {
        /// The function called.
        func: &'static str,
        /// The feature.
        feature: &'static str,
        /// The device asked for.
        device: String,
    },
    /// A dead buffer where a live one is needed.
    #[error("{func}: the buffer is dead: it was {why}")]
    Dead {
        /// The function called.
        func: &'static str,
        /// Why it died.
        why: String,
    },
    /// A buffer a call holds a claim on.
    #[error("{func}: a buffer on {device} is in use by a kernel call")]
    Busy {
        /// The function called.
        func: &'static str,
        /// Its device.
        device: String,
    },
    /// A kernel's refusal, raised for the user: the message names the function the user called,
    /// the reason, and each operand's dtype and shape.
    #[error("{message}")]
    Refused {
        /// The refusal.
        answer: Answer,
        /// The message.
        message: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
