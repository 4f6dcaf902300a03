//! `Tensor` Fourier transforms: `fft` (complex to complex), `rfft` (real to the half spectrum)
//! and `irfft` (the half spectrum to real), along axes the placement leaves whole, on each
//! rank's window. A transform is linear, so a sum of terms (`partial`) transforms term by term
//! and stays one. Neither direction divides by the number of points: `irfft(rfft(x))` is
//! `n·x` (n the points of the axes). The host library's docs state the bound.

use num_complex::{Complex32, Complex64};
use nx_collectives::Reducible;
use nx_kernels::{Array, Direction, Kernels};

use crate::tensor::{check, err};
use crate::{Result, Tensor};

/// A complex element type, with the real type of its parts (`Complex32`: `f32`).
pub trait FftComplex: Reducible {
    /// The parts' type.
    type Real: FftReal<Complex = Self>;
}

/// A real element type, with the complex type of its precision (`f32`: `Complex32`).
pub trait FftReal: Reducible {
    /// The complex type of this precision.
    type Complex: FftComplex<Real = Self>;
}

impl FftComplex for Complex32 {
    type Real = f32;
}
impl FftComplex for Complex64 {
    type Real = f64;
}
impl FftReal for f32 {
    type Complex = Complex32;
}
impl FftReal for f64 {
    type Complex = Complex64;
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// Checks that `axes` are distinct axes the placement leaves whole (a sum allowed).
    fn transformable(&self, func: &'static str, axes: &[usize]) -> Result<()> {
        for (i, &a) in axes.iter().enumerate() {
            if axes[..i].contains(&a) {
                return Err(err(func, format!("axis {a} named twice in {axes:?}")));
            }
            self.whole(func, a, true)?;
        }
        Ok(())
    }

    /// The transform of the local window into a new array of `shape` (the local window's with
    /// the last of `axes` of extent `last`), as a tensor of the same placement.
    fn transformed<U: Reducible>(
        &self,
        func: &'static str,
        direction: Direction,
        axes: &[usize],
        last: impl Fn(usize) -> usize,
    ) -> Result<Tensor<'d, U>> {
        let with_last = |s: &[usize]| {
            let mut s = s.to_vec();
            if let Some(&a) = axes.last() {
                s[a] = last(s[a]);
            }
            s
        };
        let local = match &self.local {
            Some(a) => {
                let dst = Array::<U>::uninit_on(self.ctx.rig(), &with_last(a.shape()))?;
                check(func, self.ctx.host().fft(direction, axes, &dst, a), &[a])?;
                Some(dst)
            }
            None => None,
        };
        Ok(Tensor { ctx: self.ctx.clone(), shape: with_last(&self.shape), placement: self.placement.clone(), local })
    }
}

impl<'d, T: FftComplex> Tensor<'d, T> {
    /// The discrete Fourier transform along `axes` (`Forward`: `e^(−2πi jk/n)`, `Inverse`:
    /// `e^(+2πi jk/n)`, neither divided by n), the same shape and placement.
    ///
    /// ```
    /// use num_complex::Complex32;
    /// use nx::kernels::Direction;
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let p = nx::Placement::split(0, ctx.devices())?;
    /// let x = nx::Tensor::<Complex32>::from_fn(ctx, &[2, 4], &p, |i| Complex32::new((i[1] == 1) as u8 as f32, 0.0))?;
    /// let y = x.fft(&[1], Direction::Forward)?.full()?.to_vec()?;
    /// // a unit impulse at 1: e^(−2πi k/4) = 1, −i, −1, i
    /// assert!((y[1] - Complex32::new(0.0, -1.0)).norm() < 1e-6);
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// An axis past the rank, named twice, or cut by the placement.
    pub fn fft(&self, axes: &[usize], direction: Direction) -> Result<Self> {
        const FUNC: &str = "nx::Tensor::fft";
        self.transformable(FUNC, axes)?;
        self.transformed(FUNC, direction, axes, |n| n)
    }

    /// The real signal of `n` points along the last of `axes` whose half spectrum this is (its
    /// extent there `n/2 + 1`): the other axes transformed first, complex to complex, then the
    /// last extended as a Hermitian sequence (`x[j] = conj(x[n − j])` past the given points) and
    /// the real part of its transform kept; `Inverse` for numpy's `irfftn` times the points.
    ///
    /// # Errors
    /// An axis past the rank, named twice or cut by the placement; no axis; an extent along the
    /// last of `axes` other than `n/2 + 1`.
    pub fn irfft(&self, axes: &[usize], n: usize, direction: Direction) -> Result<Tensor<'d, T::Real>> {
        const FUNC: &str = "nx::Tensor::irfft";
        self.transformable(FUNC, axes)?;
        let Some(&a) = axes.last() else { return Err(err(FUNC, "no axis to transform".into())) };
        let want = nx_kernels::half_spectrum(n);
        if self.shape[a] != want {
            return Err(err(FUNC, format!("axis {a} has {} points; a half spectrum of {n} has {want}", self.shape[a])));
        }
        self.transformed(FUNC, direction, axes, |_| n)
    }
}

impl<'d, T: FftReal> Tensor<'d, T> {
    /// The half spectrum of the transform along `axes`: the last of them (transformed first)
    /// keeps its first `n/2 + 1` points, the rest being their conjugates; numpy's `rfftn`.
    ///
    /// ```
    /// use nx::kernels::Direction;
    /// # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    /// let x = nx::Tensor::<f64>::from_fn(ctx, &[6], &nx::Placement::on(ctx.devices()), |i| i[0] as f64)?;
    /// let y = x.rfft(&[0], Direction::Forward)?;
    /// assert_eq!(y.shape(), [4]);
    /// let back = y.irfft(&[0], 6, Direction::Inverse)?.full()?.to_vec()?;
    /// assert!(back.iter().enumerate().all(|(i, v)| (v - 6.0 * i as f64).abs() < 1e-9));
    /// # Ok(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// An axis past the rank, named twice, or cut by the placement.
    pub fn rfft(&self, axes: &[usize], direction: Direction) -> Result<Tensor<'d, T::Complex>> {
        const FUNC: &str = "nx::Tensor::rfft";
        self.transformable(FUNC, axes)?;
        self.transformed(FUNC, direction, axes, nx_kernels::half_spectrum)
    }
}
