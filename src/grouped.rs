//! `Tensor::grouped_matmul`: the mixture-of-experts contraction, each row of tokens against the
//! expert its id names, through the host library's segmented contraction
//! ([`nx_kernels::Segments::Rows`]). Tokens may be cut along their rows (data or expert
//! parallelism after a dispatch): each rank multiplies its own rows by the experts it holds whole.

use nx_collectives::Reducible;
use nx_kernels::{Array, Contraction, Factor, Kernels, Segmented, Segments};

use crate::tensor::{check, err, window_shape};
use crate::{Result, Tensor};

impl<'d, T: Reducible> Tensor<'d, T> {
    /// `out[t] = self[t] · experts[ids[t]]` for tokens `self [t, k]`, experts `[g, k, n]` and
    /// `ids [t]` (`i64`); a row whose id is outside `0..g` is zeros (it has no products). The
    /// result `[t, n]` is placed as `self` is.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let rows = nx::Placement::split(0, ctx.devices())?;
    /// let whole = nx::Placement::on(ctx.devices());
    /// let x = nx::Tensor::<f32>::from_fn(ctx, &[4, 2], &rows, |i| (i[0] + i[1]) as f32)?;
    /// // expert 0 sums a row's two elements, expert 1 doubles the first
    /// let w = nx::Tensor::<f32>::from_fn(ctx, &[2, 2, 1], &whole, |i| [[1.0, 1.0], [2.0, 0.0]][i[0]][i[1]])?;
    /// let ids = nx::Tensor::<i64>::from_fn(ctx, &[4], &rows, |i| [0, 1, 1, -1][i[0]])?;
    /// assert_eq!(x.grouped_matmul(&w, &ids)?.full()?.to_vec()?, [1.0, 2.0, 4.0, 0.0]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// Shapes other than `[t, k]`, `[g, k, n]` and `[t]`; `self`'s contracting axis cut or `self`
    /// a sum of terms; `ids` placed otherwise than `self`; experts not held whole by every rank
    /// `self` runs on; a dtype the host library does not contract.
    pub fn grouped_matmul(&self, experts: &Tensor<'d, T>, ids: &Tensor<'d, i64>) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::grouped_matmul";
        let (s, e) = (&self.shape, &experts.shape);
        if s.len() != 2 || e.len() != 3 || ids.shape.len() != 1 || e[1] != s[1] || ids.shape[0] != s[0] {
            return Err(err(
                FUNC,
                format!("tokens {s:?}, experts {e:?} and ids {:?}: needs [t, k], [g, k, n] and [t]", ids.shape),
            ));
        }
        self.whole(FUNC, 1, false)?;
        if !ids.placement.equal(&self.placement) {
            return Err(err(
                FUNC,
                format!("tokens placed {} and ids placed {}: place them alike", self.placement, ids.placement),
            ));
        }
        let held = self.placement.uncut();
        if !experts.placement.equal(&held) {
            return Err(err(
                FUNC,
                format!("experts placed {}: every rank of the tokens' needs them whole ({held})", experts.placement),
            ));
        }
        let shape = vec![s[0], e[2]];
        let local = match (&self.local, &experts.local, &ids.local, self.placement.window(&shape, self.ctx.index())?) {
            (Some(a), Some(b), Some(id), Some(w)) => {
                let dst = Array::<T>::uninit_on(self.ctx.rig(), &window_shape(&w))?;
                let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
                let segments = Some(Segmented { segments: Segments::Rows { a_axis: 0, b_axis: 0 }, ids: id });
                let answer =
                    self.ctx.host().contract_general(&spec, segments, &dst, Factor::plain(a), Factor::plain(b), None);
                check(FUNC, answer, &[a, b, id])?;
                Some(dst)
            }
            _ => None,
        };
        Ok(self.with_local(self.placement.clone(), shape, local))
    }
}
