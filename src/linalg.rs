//! `Tensor` matrix routines on the last two axes: `cholesky`, `solve`, `solve_triangular`. The
//! matrix axes must be whole under the placement (the batch axes before them may be cut: each
//! rank computes its own matrices), the value closed (the routines are not linear), and the two
//! operands of a solve placed alike. The host library's docs state the bounds.

use nx_collectives::Reducible;
use nx_kernels::{Array, Kernels};

use crate::tensor::{check, err};
use crate::{Result, Tensor};

impl<'d, T: Reducible> Tensor<'d, T> {
    /// Checks that the last two axes exist and are whole, and the value is closed.
    fn matrices(&self, func: &'static str) -> Result<()> {
        let r = self.shape.len();
        if r < 2 {
            return Err(err(func, format!("a value of shape {:?} holds no matrices (rank below 2)", self.shape)));
        }
        self.whole(func, r - 2, false)?;
        self.whole(func, r - 1, false)
    }

    /// The Cholesky factor of each matrix (the last two axes, square, Hermitian positive
    /// definite; the lower triangle read): `l` lower triangular with `a = l·lᴴ`, zeros above the
    /// diagonal; a matrix that is not positive definite has a factor of NaNs.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// // two matrices [[4, 2], [2, 5]], one a rank
    /// let a = nx::Tensor::<f64>::from_fn(ctx, &[2, 2, 2], &p, |i| [4.0, 2.0, 2.0, 5.0][i[1] * 2 + i[2]])?;
    /// assert_eq!(a.cholesky()?.full()?.to_vec()?, [2.0, 0.0, 1.0, 2.0, 2.0, 0.0, 1.0, 2.0]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// A rank below 2; matrix axes cut by the placement; a sum of terms; a dtype other than
    /// `f32`, `f64`, `c64`, `c128`; matrices that are not square.
    pub fn cholesky(&self) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::cholesky";
        self.matrices(FUNC)?;
        let local = match &self.local {
            Some(a) => {
                let l = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                check(FUNC, self.ctx.host().cholesky(&l, a), &[a])?;
                Some(l)
            }
            None => None,
        };
        Ok(self.with_local(self.placement.clone(), self.shape.clone(), local))
    }

    /// `x` with `self·x = b` for each square matrix of `self` (`[batch…, n, n]`), `b` and `x`
    /// `[batch…, n, k]`, by LU with partial pivoting; a singular matrix gives infinities or NaNs.
    ///
    /// # Errors
    /// As [`Tensor::cholesky`], and `b` of another placement or of shapes that do not fit.
    pub fn solve(&self, b: &Self) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::solve";
        self.solve_with(FUNC, b, |host, x, a, b| host.solve(x, a, b))
    }

    /// `x` with `self·x = b` for each triangular matrix of `self` (its `lower` or upper
    /// triangle; with `unit` its diagonal taken as ones; the other triangle never read).
    ///
    /// # Errors
    /// As [`Tensor::solve`].
    pub fn solve_triangular(&self, b: &Self, lower: bool, unit: bool) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::solve_triangular";
        self.solve_with(FUNC, b, |host, x, a, b| host.solve_triangular(lower, unit, x, a, b))
    }

    fn solve_with(
        &self,
        func: &'static str,
        b: &Self,
        kernel: impl Fn(&nx_kernels::Host, &Array<T>, &Array<T>, &Array<T>) -> nx_kernels::Answer,
    ) -> Result<Self> {
        self.matrices(func)?;
        b.matrices(func)?;
        if !self.placement.equal(&b.placement) {
            return Err(err(
                func,
                format!("a placed {} and b placed {}: place them alike", self.placement, b.placement),
            ));
        }
        let (r, s) = (self.shape.len(), &b.shape);
        let fits = s.len() == r
            && s[..r - 2] == self.shape[..r - 2]
            && self.shape[r - 1] == self.shape[r - 2]
            && s[r - 2] == self.shape[r - 2];
        if !fits {
            return Err(err(
                func,
                format!("a of shape {:?} and b of shape {:?}: a [batch…, n, n], b [batch…, n, k]", self.shape, s),
            ));
        }
        let local = match (&self.local, &b.local) {
            (Some(a), Some(bl)) => {
                let x = Array::<T>::uninit_on(self.ctx.rig(), bl.shape())?;
                check(func, kernel(self.ctx.host(), &x, a, bl), &[a, bl])?;
                Some(x)
            }
            _ => None,
        };
        Ok(self.with_local(b.placement.clone(), b.shape.clone(), local))
    }
}
