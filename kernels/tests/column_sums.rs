//! Sums over the leading axes of a value (a bias's gradient) take the column path: they must give
//! the bits of the same sums taken along contiguous rows (the transposed copy summed over its last
//! axis, the kernel's documented association), and lie within the association's bound of naive
//! f64 sums — at uneven sizes, across chunk boundaries, over strided, flipped and broadcast rows,
//! inline and split over the pool.

use nx_kernels::host::{HostOptions, Store};
use nx_kernels::{Answer, Array, Dtype, Element, Host, Kernels, Move, Prog, Reduction};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize) -> f64 {
    (((k * 7919 + 104_729) % 10007) as f64 / 10007.0 - 0.5) * 200.0
}

fn hosts() -> Vec<Host> {
    let split = HostOptions { threads: Some(2), reduce: Some(1), store: Store::Memory, ..HostOptions::default() };
    let inline = HostOptions { threads: Some(1), store: Store::Memory, ..HostOptions::default() };
    vec![Host::with_options(split).unwrap(), Host::with_options(inline).unwrap()]
}

/// The sums of `a` (of shape `[rows, cols]`) over axis 0, and of its transposed contiguous copy
/// over axis 1.
fn both<T: Element + Copy>(h: &Host, a: &Array<T>, rows: usize, cols: usize) -> (Vec<T>, Vec<T>) {
    let mut p = Prog::new(&[T::DTYPE]);
    let x = p.load(0);
    p.output(x);
    let down = Array::<T>::zeros(DEV, &[cols]).unwrap();
    assert_eq!(h.reduce(&p, &[rows, cols], &[0], &[Reduction::Sum], &[&down], &[a]), Answer::Done);
    let t = a.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap().copy().unwrap();
    let along = Array::<T>::zeros(DEV, &[cols]).unwrap();
    assert_eq!(h.reduce(&p, &[cols, rows], &[1], &[Reduction::Sum], &[&along], &[&t]), Answer::Done);
    (down.to_vec().unwrap(), along.to_vec().unwrap())
}

/// The additions on a term's way into a sum of `n` (as `tests/simd_levels.rs` states them).
fn depth(n: usize) -> f64 {
    (n.div_ceil(8).min(256) + 3 + (usize::BITS - n.div_ceil(2048).leading_zeros()) as usize) as f64
}

fn check_against_f64(got: &[f64], terms: &[Vec<f64>], eps: f64, what: &str) {
    for (c, (g, col)) in got.iter().zip(terms).enumerate() {
        let want: f64 = col.iter().sum();
        let mag: f64 = col.iter().map(|x| x.abs()).sum();
        let n = col.len();
        assert!((g - want).abs() <= mag * depth(n) * eps / 2.0 + 1e-300, "{what}: column {c}: {g} against {want}");
    }
}

#[test]
fn column_sums_match_the_row_association_and_f64() {
    for h in hosts() {
        for rows in [1usize, 7, 8, 9, 2049, 3 * 2048 + 5] {
            for cols in [2usize, 15, 33, 65] {
                let xs: Vec<f64> = (0..rows * cols).map(val).collect();
                let columns = |xs: &[f64]| -> Vec<Vec<f64>> {
                    (0..cols).map(|c| (0..rows).map(|r| xs[r * cols + c]).collect()).collect()
                };
                // f32
                let a = Array::<f32>::from_vec(DEV, &[rows, cols], xs.iter().map(|&x| x as f32).collect()).unwrap();
                let (down, along) = both(&h, &a, rows, cols);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&down), bits(&along), "f32 {rows}x{cols}: the row association's bits");
                let x32: Vec<f64> = xs.iter().map(|&x| f64::from(x as f32)).collect();
                let got: Vec<f64> = down.iter().map(|&x| f64::from(x)).collect();
                check_against_f64(&got, &columns(&x32), f64::from(f32::EPSILON), &format!("f32 {rows}x{cols}"));
                // f64
                let a = Array::<f64>::from_vec(DEV, &[rows, cols], xs.clone()).unwrap();
                let (down, along) = both(&h, &a, rows, cols);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&down), bits(&along), "f64 {rows}x{cols}");
                check_against_f64(&down, &columns(&xs), f64::EPSILON, &format!("f64 {rows}x{cols}"));
            }
        }
    }
}

#[test]
fn strided_flipped_broadcast_and_several_leading_axes() {
    let h = &hosts()[0];
    let (rows, cols) = (2 * 2048 + 3, 37);
    let xs: Vec<f32> = (0..2 * rows * cols).map(|k| val(k) as f32).collect();
    let full = Array::<f32>::from_vec(DEV, &[2 * rows, cols], xs.clone()).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let views = [
        // every other row: rows at twice the stride
        Move::Slice { axis: 0, start: None, stop: None, step: 2 },
        // the rows last to first
        Move::Slice { axis: 0, start: None, stop: None, step: -2 },
    ];
    for m in views {
        let a = full.apply(&m).unwrap().unwrap();
        assert_eq!(a.shape(), [rows, cols]);
        let (down, along) = both(h, &a, rows, cols);
        assert_eq!(bits(&down), bits(&along), "{m:?}");
        let seen = a.to_vec().unwrap();
        let terms: Vec<Vec<f64>> =
            (0..cols).map(|c| (0..rows).map(|r| f64::from(seen[r * cols + c])).collect()).collect();
        let got: Vec<f64> = down.iter().map(|&x| f64::from(x)).collect();
        check_against_f64(&got, &terms, f64::from(f32::EPSILON), &format!("{m:?}"));
    }
    // one row repeated (stride 0): every column the sum of its one value, rows times
    let one = Array::<f32>::from_vec(DEV, &[1, cols], xs[..cols].to_vec()).unwrap();
    let b = one.apply(&Move::Expand(vec![rows, cols])).unwrap().unwrap();
    let (down, along) = both(h, &b, rows, cols);
    assert_eq!(bits(&down), bits(&along), "broadcast rows");
    let terms: Vec<Vec<f64>> = (0..cols).map(|c| vec![f64::from(xs[c]); rows]).collect();
    let got: Vec<f64> = down.iter().map(|&x| f64::from(x)).collect();
    check_against_f64(&got, &terms, f64::from(f32::EPSILON), "broadcast rows");
    // [a, b, c] over its two leading axes: the terms of [a·b, c]
    let (a0, b0) = (3, 1367);
    let x3 = Array::<f32>::from_vec(DEV, &[a0, b0, cols], xs[..a0 * b0 * cols].to_vec()).unwrap();
    let mut p = Prog::new(&[Dtype::F32]);
    let l = p.load(0);
    p.output(l);
    let d3 = Array::<f32>::zeros(DEV, &[cols]).unwrap();
    assert_eq!(h.reduce(&p, &[a0, b0, cols], &[0, 1], &[Reduction::Sum], &[&d3], &[&x3]), Answer::Done);
    let x2 = Array::<f32>::from_vec(DEV, &[a0 * b0, cols], xs[..a0 * b0 * cols].to_vec()).unwrap();
    let (down, along) = both(h, &x2, a0 * b0, cols);
    assert_eq!(bits(&down), bits(&along), "[a·b, c]");
    assert_eq!(bits(&d3.to_vec().unwrap()), bits(&along), "two leading axes: the row association's bits");
}
