//! `Tensor` matrix routines on the last two axes: `cholesky`, `solve`, `solve_triangular`, `qr`,
//! `svd`, `svdvals`, `eigh`, `eig`. The
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

/// The eigenvalues and eigenvectors [`Tensor::eig`] returns, complex.
pub type Eig<'d, T> = (Tensor<'d, <T as MatrixField>::Complex>, Tensor<'d, <T as MatrixField>::Complex>);

/// A dtype the matrix routines take (`f32`, `f64`, `Complex32`, `Complex64`), with the real type
/// of its parts (singular values and Hermitian eigenvalues are real) and the complex type of its
/// precision (general eigenvalues are complex).
pub trait MatrixField: Reducible {
    /// The parts' type.
    type Real: Reducible;
    /// The complex type of the parts' precision.
    type Complex: Reducible;
}

impl MatrixField for f32 {
    type Real = f32;
    type Complex = num_complex::Complex32;
}
impl MatrixField for f64 {
    type Real = f64;
    type Complex = num_complex::Complex64;
}
impl MatrixField for num_complex::Complex32 {
    type Real = f32;
    type Complex = num_complex::Complex32;
}
impl MatrixField for num_complex::Complex64 {
    type Real = f64;
    type Complex = num_complex::Complex64;
}

impl<'d, T: MatrixField> Tensor<'d, T> {
    /// A local array of `shape` (the local window's batch axes, then `tail`) on the rank's rig.
    fn local_of<U: Reducible>(&self, a: &Array<T>, tail: &[usize]) -> Result<Array<U>> {
        let r = a.shape().len();
        let mut s = a.shape()[..r - 2].to_vec();
        s.extend_from_slice(tail);
        Ok(Array::<U>::uninit_on(self.ctx.rig(), &s)?)
    }

    /// A tensor of this one's placement whose shape is the batch axes then `tail`.
    fn shaped<U: Reducible>(&self, tail: &[usize], local: Option<Array<U>>) -> Tensor<'d, U> {
        let r = self.shape.len();
        let mut shape = self.shape[..r - 2].to_vec();
        shape.extend_from_slice(tail);
        Tensor { ctx: self.ctx.clone(), shape, placement: self.placement.clone(), local }
    }

    /// The QR factors of each matrix: `(q, r)` with `self = q·r`, reduced (`q` m × k, `r` k × n,
    /// k = min(m, n)) or `complete` (`q` m × m, `r` m × n); the signs those of Householder
    /// reflections (`r`'s diagonal may be negative).
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let a = nx::Tensor::<f64>::from_fn(ctx, &[3, 2], &nx::Placement::on(ctx.devices()), |i| (i[0] * 2 + i[1]) as f64)?;
    /// let (q, r) = a.qr(false)?;
    /// assert_eq!((q.shape(), r.shape()), (&[3, 2][..], &[2, 2][..]));
    /// let back = q.matmul(&r)?.full()?.to_vec()?;
    /// assert!(back.iter().enumerate().all(|(k, x)| (x - k as f64).abs() < 1e-12));
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::cholesky`], but for squareness.
    pub fn qr(&self, complete: bool) -> Result<(Self, Self)> {
        const FUNC: &str = "nx::Tensor::qr";
        self.matrices(FUNC)?;
        let r = self.shape.len();
        let (m, n) = (self.shape[r - 2], self.shape[r - 1]);
        let c = if complete { m } else { m.min(n) };
        let (q, rr) = match &self.local {
            Some(a) => {
                let (q, rr) = (self.local_of::<T>(a, &[m, c])?, self.local_of::<T>(a, &[c, n])?);
                check(FUNC, self.ctx.host().qr(&q, &rr, a), &[a])?;
                (Some(q), Some(rr))
            }
            None => (None, None),
        };
        Ok((self.shaped(&[m, c], q), self.shaped(&[c, n], rr)))
    }

    /// The singular values of each matrix, descending (`[batch…, k]`, k = min(m, n)).
    ///
    /// # Errors
    /// As [`Tensor::qr`].
    pub fn svdvals(&self) -> Result<Tensor<'d, T::Real>> {
        const FUNC: &str = "nx::Tensor::svdvals";
        self.matrices(FUNC)?;
        let r = self.shape.len();
        let k = self.shape[r - 2].min(self.shape[r - 1]);
        let s = match &self.local {
            Some(a) => {
                let s = self.local_of::<T::Real>(a, &[k])?;
                check(FUNC, self.ctx.host().svd(None, &s, None, a), &[a])?;
                Some(s)
            }
            None => None,
        };
        Ok(self.shaped(&[k], s))
    }

    /// The singular value decomposition of each matrix: `(u, s, vh)` with `self = u·diag(s)·vh`,
    /// `s` descending; reduced (`u` m × k, `vh` k × n) or `complete` (`u` m × m, `vh` n × n).
    ///
    /// # Errors
    /// As [`Tensor::qr`].
    pub fn svd(&self, complete: bool) -> Result<(Self, Tensor<'d, T::Real>, Self)> {
        const FUNC: &str = "nx::Tensor::svd";
        self.matrices(FUNC)?;
        let r = self.shape.len();
        let (m, n) = (self.shape[r - 2], self.shape[r - 1]);
        let k = m.min(n);
        let (uc, vr) = if complete { (m, n) } else { (k, k) };
        let (u, s, vh) = match &self.local {
            Some(a) => {
                let u = self.local_of::<T>(a, &[m, uc])?;
                let s = self.local_of::<T::Real>(a, &[k])?;
                let vh = self.local_of::<T>(a, &[vr, n])?;
                check(FUNC, self.ctx.host().svd(Some(&u), &s, Some(&vh), a), &[a])?;
                (Some(u), Some(s), Some(vh))
            }
            None => (None, None, None),
        };
        Ok((self.shaped(&[m, uc], u), self.shaped(&[k], s), self.shaped(&[vr, n], vh)))
    }

    /// The eigenvalues (ascending, `[batch…, n]`) and orthonormal eigenvectors (the columns of
    /// `[batch…, n, n]`) of each Hermitian matrix, read from its lower triangle.
    ///
    /// # Errors
    /// As [`Tensor::cholesky`].
    pub fn eigh(&self) -> Result<(Tensor<'d, T::Real>, Self)> {
        const FUNC: &str = "nx::Tensor::eigh";
        self.matrices(FUNC)?;
        let r = self.shape.len();
        let n = self.shape[r - 1];
        let (w, v) = match &self.local {
            Some(a) => {
                let w = self.local_of::<T::Real>(a, &[n])?;
                let v = Array::<T>::uninit_on(self.ctx.rig(), a.shape())?;
                check(FUNC, self.ctx.host().eigh(&w, Some(&v), a), &[a])?;
                (Some(w), Some(v))
            }
            None => (None, None),
        };
        Ok((self.shaped(&[n], w), self.with_local(self.placement.clone(), self.shape.clone(), v)))
    }

    /// The eigenvalues (`[batch…, n]`, complex, in the host library's stated order) and
    /// eigenvectors (the unit columns of `[batch…, n, n]`) of each square matrix:
    /// `self·v = v·diag(w)`.
    ///
    /// ```
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// // a rotation by 90°: eigenvalues ±i
    /// let a = nx::Tensor::<f64>::from_fn(ctx, &[2, 2], &nx::Placement::on(ctx.devices()), |i| [0.0, -1.0, 1.0, 0.0][i[0] * 2 + i[1]])?;
    /// let (w, v) = a.eig()?;
    /// let w = w.full()?.to_vec()?;
    /// assert!(w.iter().all(|z| z.re.abs() < 1e-15 && (z.im.abs() - 1.0).abs() < 1e-15) && w[0] == w[1].conj());
    /// assert_eq!(v.shape(), &[2, 2]);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::cholesky`].
    pub fn eig(&self) -> Result<Eig<'d, T>> {
        const FUNC: &str = "nx::Tensor::eig";
        self.matrices(FUNC)?;
        let r = self.shape.len();
        let n = self.shape[r - 1];
        let (w, v) = match &self.local {
            Some(a) => {
                let w = self.local_of::<T::Complex>(a, &[n])?;
                let v = Array::<T::Complex>::uninit_on(self.ctx.rig(), a.shape())?;
                check(FUNC, self.ctx.host().eig(&w, Some(&v), a), &[a])?;
                (Some(w), Some(v))
            }
            None => (None, None),
        };
        let vectors =
            Tensor { ctx: self.ctx.clone(), shape: self.shape.clone(), placement: self.placement.clone(), local: v };
        Ok((self.shaped(&[n], w), vectors))
    }
}
