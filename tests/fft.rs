//! `Tensor` Fourier transforms (`fft`, `rfft`, `irfft`) on meshes of 1–6 simulated ranks and
//! uneven shapes, each against a naive DFT in f64 written here; a sum of terms transformed term by
//! term; errors for axes the placement cuts, axes named twice and half spectra of the wrong extent.

use num_complex::Complex64;
use nx::kernels::Direction;
use nx::{launch_with, LaunchOptions, Placement, PlacementSpec, Tensor};

type C = Complex64;

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

fn f(i: &[usize]) -> f64 {
    ((i[0] * 37 + i[1] * 11) % 17) as f64 * 0.5 - 3.0
}

/// The naive DFT of each row of an `m × n` C-order array (`sign` −1 forward).
fn dft_rows(x: &[C], n: usize, sign: f64) -> Vec<C> {
    x.chunks(n.max(1))
        .flat_map(|row| {
            (0..n).map(move |k| {
                row.iter().enumerate().fold(C::new(0.0, 0.0), |acc, (j, &v)| {
                    let t = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                    acc + v * C::new(t.cos(), t.sin())
                })
            })
        })
        .collect()
}

const MESHES: [(usize, usize); 5] = [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)];

#[test]
fn transforms_along_a_whole_axis_match_the_naive_dft_on_every_mesh() {
    for (dp, tp) in MESHES {
        let (m, n) = (2 * dp + 1, 3 * tp + 2);
        launch_with(&opts(dp * tp), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("tp", tp)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let x = Tensor::<f64>::from_fn(ctx, &[m, n], &p("mesh(0:dp)")?, f)?;
            let xs: Vec<C> = (0..m * n).map(|k| C::new(f(&[k / n, k % n]), 0.0)).collect();
            let want = dft_rows(&xs, n, -1.0);
            // real to the half spectrum, and the complex transform of the full one
            let h = n / 2 + 1;
            let spec = x.rfft(&[1], Direction::Forward)?;
            assert_eq!(spec.shape(), [m, h]);
            let got = spec.full()?.to_vec()?;
            for i in 0..m {
                for k in 0..h {
                    let (g, w) = (got[i * h + k], want[i * n + k]);
                    assert!((g - w).norm() < 1e-12, "rfft ({i}, {k}): {g} against {w}");
                }
            }
            let xc = Tensor::<C>::from_fn(ctx, &[m, n], &p("mesh(0:dp)")?, |i| C::new(f(i), 0.5 * f(&[i[1], i[0]])))?;
            let xcs: Vec<C> = (0..m * n).map(|k| C::new(f(&[k / n, k % n]), 0.5 * f(&[k % n, k / n]))).collect();
            for (dir, sign) in [(Direction::Forward, -1.0), (Direction::Inverse, 1.0)] {
                let got = xc.fft(&[1], dir)?.full()?.to_vec()?;
                let want = dft_rows(&xcs, n, sign);
                assert!(got.iter().zip(&want).all(|(g, w)| (g - w).norm() < 1e-12), "fft {dir:?} on {dp}×{tp}");
            }
            // back: n times the signal
            let back = spec.irfft(&[1], n, Direction::Inverse)?.full()?.to_vec()?;
            for (k, b) in back.iter().enumerate() {
                let w = n as f64 * f(&[k / n, k % n]);
                assert!((b - w).abs() < 1e-11, "irfft at {k}: {b} against {w}");
            }
            // a sum of terms transforms term by term and stays one
            let part = x.place(&p("partial(tp; 0:dp)")?)?;
            let got = part.rfft(&[1], Direction::Forward)?;
            assert!(got.placement().is_partial());
            let got = got.full()?.to_vec()?;
            assert!((0..m).all(|i| (0..h).all(|k| (got[i * h + k] - want[i * n + k]).norm() < 1e-12)), "partial");
            // a cut axis is an error naming the placement; an axis twice; a wrong half spectrum
            if dp > 1 {
                let e = x.rfft(&[0], Direction::Forward).unwrap_err().to_string();
                assert!(
                    e.contains("nx::Tensor::rfft") && e.contains("mesh(0:dp)") && e.contains("place it whole"),
                    "{e}"
                );
            }
            let e = xc.fft(&[1, 1], Direction::Forward).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::fft") && e.contains("twice"), "{e}");
            let e = spec.irfft(&[1], n + 2, Direction::Inverse).unwrap_err().to_string();
            assert!(e.contains("nx::Tensor::irfft") && e.contains("half spectrum"), "{e}");
            Ok(())
        })
        .unwrap();
    }
}
