//! Scaled dot-product attention on `Tensor`s: the forward (an online softmax on each rank's heads)
//! and its gradient (the host's fused backward, which recomputes each row's weights from the
//! log-sum-exp the forward kept).
//!
//! | op | operands | result |
//! |---|---|---|
//! | `attention(k, v)` | `q`, `k`, `v` `[lead…, heads, rows, d]` placed alike (lead and head axes may be cut, rows and d whole), not partial | `q`'s placement |
//! | `attention_thd(k, v)` | the same as `[lead…, rows, heads, d]` (FlashAttention's layout) | `q`'s placement |
//! | `attention_qkv()` | one value `[lead…, rows, 3, heads, d]` (`q`, `k`, `v` packed; lead and head axes may be cut, rows, the packing axis and d whole), not partial | its placement without the packing axis |
//! | its gradient | the output's gradient placed as the output | `dq`, `dk`, `dv` placed as `q`, `k`, `v` (packed: one gradient placed as the packed value); no communication |

use nx_collectives::Reducible;
use nx_kernels::{Array, Attention, AttentionGrad, Dtype, Kernels, Kv, Move, Operand};

use nx_placement::rules;

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

/// `a` with its axes `rank − 3` and `rank − 2` swapped (a view): `[lead…, rows, heads, d]` read
/// as `[lead…, heads, rows, d]`, where `swap`; `a` itself otherwise.
fn heads_first<T: nx_kernels::Element>(a: &Array<T>, swap: bool) -> Result<Array<T>> {
    if !swap {
        return Ok(a.clone());
    }
    let r = a.shape().len();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 3, r - 2);
    Ok(a.apply(&Move::Permute(perm))?.expect("a permutation is a view"))
}

/// `s` with its axes `len − 3` and `len − 2` swapped where `swap`.
fn swapped(s: &[usize], swap: bool) -> Vec<usize> {
    let mut s = s.to_vec();
    if swap {
        let r = s.len();
        s.swap(r - 3, r - 2);
    }
    s
}

/// The query, key and value windows of a packed array `[lead…, rows, 3, heads, d]`: views
/// `[lead…, rows, heads, d]` of its entries 0, 1 and 2 along axis `rank − 3`.
fn unpack<T: nx_kernels::Element>(a: &Array<T>) -> Result<[Array<T>; 3]> {
    let axis = a.shape().len() - 3;
    let part = |i: isize| -> Result<Array<T>> {
        let m = Move::Slice { axis, start: Some(i), stop: Some(i + 1), step: 1 };
        let s = a.apply(&m)?.expect("a slice is a view");
        Ok(s.apply(&Move::Squeeze(axis))?.expect("a squeeze is a view"))
    };
    Ok([part(0)?, part(1)?, part(2)?])
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
        Ok(self.attention_saved(k, v, causal, scale, false)?.0)
    }

    /// [`Tensor::attention`] of operands laid out `[lead…, rows, heads, d]` (FlashAttention's
    /// layout: a projection's output `[b, t, width]` reshaped to `[b, t, heads, d]`, no copy), the
    /// result `[lead…, rows, heads, dv]`. The kernel reads and writes through permuted views; the
    /// values and bits are `attention`'s of the permuted operands.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// // [batch, rows, heads, d], the heads over the two devices
    /// let p = nx::Placement::split(2, ctx.devices())?;
    /// let q = nx::Tensor::<f32>::from_fn(ctx, &[1, 3, 2, 4], &p, |i| (i[1] + i[3]) as f32 * 0.1)?;
    /// let o = q.attention_thd(&q, &q, true, None)?;
    /// assert_eq!(o.shape(), [1, 3, 2, 4]);
    /// let heads_first = q.permute(&[0, 2, 1, 3])?;
    /// let want = heads_first.attention(&heads_first, &heads_first, true, None)?.permute(&[0, 2, 1, 3])?;
    /// assert_eq!(o.full()?.to_vec()?, want.full()?.to_vec()?);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::attention`], of the permuted shapes and axes.
    pub fn attention_thd(
        &self,
        k: &Tensor<'d, T>,
        v: &Tensor<'d, T>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Self> {
        Ok(self.attention_saved(k, v, causal, scale, true)?.0)
    }

    /// [`Tensor::attention`] (or [`Tensor::attention_thd`] where `thd`) and the log-sum-exp of
    /// each of this rank's query rows `[lead…, heads, rows]` (`None` on a rank that holds no
    /// window).
    pub(crate) fn attention_saved(
        &self,
        k: &Tensor<'d, T>,
        v: &Tensor<'d, T>,
        causal: bool,
        scale: Option<f64>,
        thd: bool,
    ) -> Result<(Self, Option<Lse>)> {
        let func = if thd { "nx::Tensor::attention_thd" } else { "nx::Tensor::attention" };
        let r = self.shape.len();
        if r < 3 || k.shape.len() != r || v.shape.len() != r {
            let axes = if thd { "[lead…, rows, heads, d]" } else { "[lead…, heads, rows, d]" };
            return Err(err(func, format!("q {:?}, k {:?}, v {:?}: {axes} of one rank", self.shape, k.shape, v.shape)));
        }
        // the heads' and rows' axes
        let (ha, ra) = if thd { (r - 2, r - 3) } else { (r - 3, r - 2) };
        let (qs, ks, vs) = (swapped(&self.shape, thd), swapped(&k.shape, thd), swapped(&v.shape, thd));
        let (hq, hk) = (qs[r - 3], ks[r - 3]);
        let fits = qs[..r - 3] == ks[..r - 3]
            && vs[..r - 1] == ks[..r - 1]
            && qs[r - 1] == ks[r - 1]
            && hk > 0
            && hq % hk == 0;
        if !fits {
            return Err(err(func, format!("q {:?}, k {:?}, v {:?} do not fit", self.shape, k.shape, v.shape)));
        }
        rules::attention(func, &self.placement, &self.shape, &k.placement, &k.shape, &v.placement, ha, ra)?;
        let mut shape = self.shape.clone();
        shape[r - 1] = v.shape[r - 1];
        let (local, lse) = match (&self.local, &k.local, &v.local) {
            (Some(q), Some(kl), Some(vl)) => {
                let (o, lse) = self.attend(func, [q, kl, vl], causal, scale, thd)?;
                (Some(o), Some(lse))
            }
            _ => (None, None),
        };
        Ok((self.with_local(self.placement.clone(), shape, local), lse))
    }

    /// The gradients `[dq, dk, dv]` of `o = self.attention_saved(k, v, causal, Some(scale), thd)`
    /// (its log-sum-exp `lse`) given `g`, the gradient of `o` placed as `o`: each placed as its
    /// operand, from the host's fused kernel on each rank's heads (no communication).
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
        thd: bool,
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
                let rig = self.ctx.rig();
                let (dq, dk, dv) = (
                    Array::<T>::uninit_on(rig, q.shape())?,
                    Array::<T>::uninit_on(rig, kl.shape())?,
                    Array::<T>::uninit_on(rig, vl.shape())?,
                );
                self.attend_grad(FUNC, [q, kl, vl], ol, lse, gl, [&dq, &dk, &dv], causal, scale, thd)?;
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

impl<'d, T: Reducible> Tensor<'d, T> {
    /// This rank's attention of local arrays `q`, `k`, `v` (`[lead…, heads, rows, d]`, or
    /// `[lead…, rows, heads, d]` where `thd`, views allowed): the output (dense, in the operands'
    /// layout) and each query row's log-sum-exp (`[lead…, heads, rows]`).
    fn attend(
        &self,
        func: &'static str,
        [q, k, v]: [&Array<T>; 3],
        causal: bool,
        scale: Option<f64>,
        thd: bool,
    ) -> Result<(Array<T>, Lse)> {
        let r = q.shape().len();
        let acc = accumulator::<T>();
        let dk = q.shape()[r - 1];
        let spec = Attention { scale: scale.unwrap_or(1.0 / (dk as f64).sqrt()), causal: causal.then_some(0), acc };
        let mut os = q.shape().to_vec();
        os[r - 1] = v.shape()[r - 1];
        let o = Array::<T>::uninit_on(self.ctx.rig(), &os)?;
        // the lse of each row, heads first in either layout
        let ls = swapped(&os, thd);
        let lse = if acc == Dtype::F64 {
            Lse::F64(Array::<f64>::uninit_on(self.ctx.rig(), &ls[..r - 1])?)
        } else {
            Lse::F32(Array::<f32>::uninit_on(self.ctx.rig(), &ls[..r - 1])?)
        };
        let (qv, kv, vv, ov) =
            (heads_first(q, thd)?, heads_first(k, thd)?, heads_first(v, thd)?, heads_first(&o, thd)?);
        let answer = self.ctx.host().attention(&spec, &ov, lse.operand(), &qv, Kv::Dense { k: &kv, v: &vv }, None);
        check(func, answer, &[q, k, v])?;
        Ok((o, lse))
    }

    /// This rank's gradients of [`Tensor::attend`]'s output `o` (log-sum-exp `lse`) given `g`,
    /// written into `dq`, `dk`, `dv` (laid out as the operands; views with their last axis at
    /// stride 1 allowed).
    #[allow(clippy::too_many_arguments)]
    fn attend_grad(
        &self,
        func: &'static str,
        [q, k, v]: [&Array<T>; 3],
        o: &Array<T>,
        lse: &Lse,
        g: &Array<T>,
        [dq, dk, dv]: [&Array<T>; 3],
        causal: bool,
        scale: f64,
        thd: bool,
    ) -> Result<()> {
        let spec = Attention { scale, causal: causal.then_some(0), acc: accumulator::<T>() };
        let h = |a: &Array<T>| heads_first(a, thd);
        let (qv, kv, vv, ov, gv) = (h(q)?, h(k)?, h(v)?, h(o)?, h(g)?);
        let (dqv, dkv, dvv) = (h(dq)?, h(dk)?, h(dv)?);
        let grad = AttentionGrad {
            q: &qv,
            k: &kv,
            v: &vv,
            o: &ov,
            lse: lse.operand(),
            d_o: &gv,
            dq: &dqv,
            dk: &dkv,
            dv: &dvv,
        };
        check(func, self.ctx.host().attention_grad(&spec, grad), &[q, k, v, o, g])
    }

    /// [`Tensor::attention_thd`] of the queries, keys and values packed in one value `self`
    /// `[lead…, rows, 3, heads, d]` (entries 0, 1, 2 of axis `rank − 3`: a fused projection's
    /// `[b, t, 3·width]` output reshaped, GPT-2's `c_attn`), the result `[lead…, rows, heads, d]`.
    /// The kernel reads the three as views of this rank's window: no copy. Heads (and lead axes)
    /// may be cut; rows, the packing axis and `d` must be whole.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// // [batch, rows, 3, heads, d], the heads over the two devices
    /// let p = nx::Placement::split(3, ctx.devices())?;
    /// let x = nx::Tensor::<f32>::from_fn(ctx, &[1, 3, 3, 2, 4], &p, |i| (i[1] + i[2] + i[4]) as f32 * 0.1)?;
    /// let o = x.attention_qkv(true, None)?;
    /// assert_eq!(o.shape(), [1, 3, 2, 4]);
    /// let part = |i| x.narrow(2, i, 1)?.reshape(&[1, 3, 2, 4]);
    /// let want = part(0)?.attention_thd(&part(1)?, &part(2)?, true, None)?;
    /// assert_eq!(o.full()?.to_vec()?, want.full()?.to_vec()?);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// A rank below 4 or a packing axis of other than 3 entries; a partial value, or rows, the
    /// packing axis or `d` cut; the kernel's refusals (values that are not real floats).
    pub fn attention_qkv(&self, causal: bool, scale: Option<f64>) -> Result<Self> {
        Ok(self.attention_qkv_saved(causal, scale)?.0)
    }

    /// [`Tensor::attention_qkv`] and the log-sum-exp of each of this rank's query rows.
    pub(crate) fn attention_qkv_saved(&self, causal: bool, scale: Option<f64>) -> Result<(Self, Option<Lse>)> {
        const FUNC: &str = "nx::Tensor::attention_qkv";
        let r = self.shape.len();
        if r < 4 || self.shape[r - 3] != 3 {
            return Err(err(FUNC, format!("a value {:?}: needs [lead…, rows, 3, heads, d]", self.shape)));
        }
        for axis in [r - 4, r - 3, r - 1] {
            self.whole(FUNC, axis, false)?;
        }
        // the packing axis removed (whole: no sums); a value on one device stays there
        let placement = match self.placement.spec() {
            nx_placement::PlacementSpec::Device(_) => self.placement.clone(),
            _ => rules::reduce(FUNC, &self.placement, &[r - 3])?,
        };
        let mut shape = self.shape.clone();
        shape.remove(r - 3);
        let (local, lse) = match &self.local {
            Some(a) => {
                let [q, k, v] = unpack(a)?;
                let (o, lse) = self.attend(FUNC, [&q, &k, &v], causal, scale, true)?;
                (Some(o), Some(lse))
            }
            None => (None, None),
        };
        Ok((self.with_local(placement, shape, local), lse))
    }

    /// The gradient of `o = self.attention_qkv_saved(causal, Some(scale))` (its log-sum-exp
    /// `lse`) given `g` placed as `o`: one value placed as this one, `dq`, `dk` and `dv` written
    /// by the fused kernel into its three entries (no communication, no copy).
    ///
    /// # Errors
    /// `g` of another shape or placement than `o`; the kernel's refusals.
    pub(crate) fn attention_qkv_grad(
        &self,
        o: &Tensor<'d, T>,
        lse: Option<&Lse>,
        g: &Tensor<'d, T>,
        causal: bool,
        scale: f64,
    ) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::attention_qkv_grad";
        if g.shape != o.shape || !g.placement.equal(&o.placement) {
            return Err(err(
                FUNC,
                format!("a gradient {:?} at {} for an output {:?} at {}", g.shape, g.placement, o.shape, o.placement),
            ));
        }
        let local = match (&self.local, &o.local, lse, &g.local) {
            (Some(a), Some(ol), Some(lse), Some(gl)) => {
                let d = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                let [q, k, v] = unpack(a)?;
                let [dq, dk, dv] = unpack(&d)?;
                self.attend_grad(FUNC, [&q, &k, &v], ol, lse, gl, [&dq, &dk, &dv], causal, scale, true)?;
                Some(d)
            }
            _ => None,
        };
        Ok(self.with_local(self.placement.clone(), self.shape.clone(), local))
    }
}
