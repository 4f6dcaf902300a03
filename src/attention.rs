//! Scaled dot-product attention on `Tensor`s: the forward (an online softmax on each rank's heads)
//! and its gradient (the host's fused backward, which recomputes each row's weights from the
//! log-sum-exp the forward kept).
//!
//! | op | operands | result |
//! |---|---|---|
//! | `attention(k, v)` | `q`, `k`, `v` `[lead…, heads, rows, d]` placed alike (lead and head axes may be cut, rows and d whole), not partial | `q`'s placement |
//! | its gradient | the output's gradient placed as the output | `dq`, `dk`, `dv` placed as `q`, `k`, `v` (no communication) |

use nx_collectives::Reducible;
use nx_kernels::{Array, Attention, AttentionGrad, Dtype, Kernels, Kv, Operand};

use crate::tensor::{check, err};
use crate::{Result, Tensor};

/// The log-sum-exp of each query row of an attention (this rank's window of `[lead…, hq, tq]`),
/// in its accumulator: what its gradient reads.
#[derive(Clone)]
pub(crate) enum Lse {
    /// Of an attention of `f32` (or narrower) values.
    F32(Array<f32>),
    /// Of an attention of `f64` values.
    F64(Array<f64>),
}

impl Lse {
    fn operand(&self) -> &dyn Operand {
        match self {
            Lse::F32(a) => a,
            Lse::F64(a) => a,
        }
    }
}

/// The accumulator of an attention of `T` values: `f64` for `f64`, `f32` otherwise.
fn accumulator<T: Reducible>() -> Dtype {
    if T::DTYPE == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// Scaled dot-product attention of query rows `self` `[lead…, hq, tq, dk]` against keys `k`
    /// `[lead…, hk, tk, dk]` and values `v` `[lead…, hk, tk, dv]` (`hk` dividing `hq`: grouped
    /// query heads), scores scaled by `scale` (`1/√dk` where `None`), causal (row `i` sees keys
    /// up to `i`, as `torch`'s `is_causal`) or not, in `f64` for `f64` values and `f32`
    /// otherwise, online (flash-style). Heads cut over mesh axes run on each rank's heads
    /// (Megatron's attention): no communication.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// // heads over the two devices
    /// let p = nx::Placement::split(1, ctx.devices())?;
    /// let q = nx::Tensor::<f32>::from_fn(ctx, &[1, 2, 3, 4], &p, |i| (i[2] + i[3]) as f32 * 0.1)?;
    /// let o = q.attention(&q, &q, true, None)?;
    /// assert_eq!(o.shape(), [1, 2, 3, 4]);
    /// // the first row sees only the first key: its value
    /// assert_eq!(o.full()?.to_vec()?[..4], [0.0, 0.1, 0.2, 0.3]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// Ranks below 3 or shapes that do not fit; operands placed differently, partial, or with
    /// rows or features cut; heads cut so that a rank's query heads are not the groups of its key
    /// heads.
    pub fn attention(&self, k: &Tensor<'d, T>, v: &Tensor<'d, T>, causal: bool, scale: Option<f64>) -> Result<Self> {
        Ok(self.attention_saved(k, v, causal, scale)?.0)
    }

    /// [`Tensor::attention`] and the log-sum-exp of each of this rank's query rows (`None` on a
    /// rank that holds no window).
    pub(crate) fn attention_saved(
        &self,
        k: &Tensor<'d, T>,
        v: &Tensor<'d, T>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Self, Option<Lse>)> {
        const FUNC: &str = "nx::Tensor::attention";
        let r = self.shape.len();
        if r < 3 || k.shape.len() != r || v.shape.len() != r {
            return Err(err(
                FUNC,
                format!("q {:?}, k {:?}, v {:?}: [lead…, heads, rows, d] of one rank", self.shape, k.shape, v.shape),
            ));
        }
        let (hq, hk) = (self.shape[r - 3], k.shape[r - 3]);
        let fits = self.shape[..r - 3] == k.shape[..r - 3]
            && v.shape[..r - 1] == k.shape[..r - 1]
            && self.shape[r - 1] == k.shape[r - 1]
            && hk > 0
            && hq % hk == 0;
        if !fits {
            return Err(err(FUNC, format!("q {:?}, k {:?}, v {:?} do not fit", self.shape, k.shape, v.shape)));
        }
        for t in [k, v] {
            if !t.placement.equal(&self.placement) {
                return Err(err(
                    FUNC,
                    format!("q at {}, an operand at {}: place them alike", self.placement, t.placement),
                ));
            }
        }
        self.whole(FUNC, r - 2, false)?;
        self.whole(FUNC, r - 1, false)?;
        let mut shape = self.shape.clone();
        shape[r - 1] = v.shape[r - 1];
        // every device's query heads must be the groups of its key heads (checked for all, so
        // that every rank answers alike)
        let group = hq / hk;
        for u in 0..self.ctx.devices().len() {
            if let (Some(qw), Some(kw)) = (self.placement.window(&self.shape, u)?, k.placement.window(&k.shape, u)?) {
                let (qh, kh) = (&qw[r - 3], &kw[r - 3]);
                if qh.start != kh.start * group || qh.len() != kh.len() * group {
                    return Err(err(
                        FUNC,
                        format!("query heads {qh:?} are not the groups of key heads {kh:?} on device {u}: cut the heads so each device's are whole groups"),
                    ));
                }
            }
        }
        let (local, lse) = match (&self.local, &k.local, &v.local) {
            (Some(q), Some(kl), Some(vl)) => {
                let acc = accumulator::<T>();
                let dk = self.shape[r - 1];
                let spec =
                    Attention { scale: scale.unwrap_or(1.0 / (dk as f64).sqrt()), causal: causal.then_some(0), acc };
                let mut os = q.shape().to_vec();
                os[r - 1] = vl.shape()[r - 1];
                let o = Array::<T>::uninit_on(self.ctx.rig(), &os)?;
                let lse = if acc == Dtype::F64 {
                    Lse::F64(Array::<f64>::uninit_on(self.ctx.rig(), &os[..r - 1])?)
                } else {
                    Lse::F32(Array::<f32>::uninit_on(self.ctx.rig(), &os[..r - 1])?)
                };
                let answer = self.ctx.host().attention(&spec, &o, lse.operand(), q, Kv::Dense { k: kl, v: vl }, None);
                check(FUNC, answer, &[q, kl, vl])?;
                (Some(o), Some(lse))
            }
            _ => (None, None),
        };
        Ok((self.with_local(self.placement.clone(), shape, local), lse))
    }

    /// The gradients `[dq, dk, dv]` of `o = self.attention_saved(k, v, causal, Some(scale))` (its
    /// log-sum-exp `lse`) given `g`, the gradient of `o` placed as `o`: each placed as its operand,
    /// from the host's fused kernel on each rank's heads (no communication).
    ///
    /// # Errors
    /// `g` of another shape or placement than `o`; the kernel's refusals.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_grad(
        &self,
        k: &Tensor<'d, T>,
        v: &Tensor<'d, T>,
        o: &Tensor<'d, T>,
        lse: Option<&Lse>,
        g: &Tensor<'d, T>,
        causal: bool,
        scale: f64,
    ) -> Result<[Self; 3]> {
        const FUNC: &str = "nx::Tensor::attention_grad";
        if g.shape != o.shape || !g.placement.equal(&o.placement) {
            return Err(err(
                FUNC,
                format!("a gradient {:?} at {} for an output {:?} at {}", g.shape, g.placement, o.shape, o.placement),
            ));
        }
        let locals = match (&self.local, &k.local, &v.local, &o.local, lse, &g.local) {
            (Some(q), Some(kl), Some(vl), Some(ol), Some(lse), Some(gl)) => {
                let acc = accumulator::<T>();
                let spec = Attention { scale, causal: causal.then_some(0), acc };
                let rig = self.ctx.rig();
                let (dq, dk, dv) = (
                    Array::<T>::uninit_on(rig, q.shape())?,
                    Array::<T>::uninit_on(rig, kl.shape())?,
                    Array::<T>::uninit_on(rig, vl.shape())?,
                );
                let grad =
                    AttentionGrad { q, k: kl, v: vl, o: ol, lse: lse.operand(), d_o: gl, dq: &dq, dk: &dk, dv: &dv };
                check(FUNC, self.ctx.host().attention_grad(&spec, grad), &[q, kl, vl, ol, gl])?;
                [Some(dq), Some(dk), Some(dv)]
            }
            _ => [None, None, None],
        };
        let [dq, dk, dv] = locals;
        Ok([
            self.with_local(self.placement.clone(), self.shape.clone(), dq),
            k.with_local(k.placement.clone(), k.shape.clone(), dk),
            v.with_local(v.placement.clone(), v.shape.clone(), dv),
        ])
    }
}
