//! Tests of the sums' association (see `reduce.rs`).

use super::*;

/// The documented association of a chunk's sum, written out naively: term i added into lane
/// i mod 8 (each lane from +0), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
fn naive_chunk<T: Term>(xs: &[T]) -> T {
    let mut l = [T::ZERO; 8];
    for (i, &x) in xs.iter().enumerate() {
        l[i % 8] = l[i % 8].add(x);
    }
    let (a, b) = (l[0].add(l[1]), l[2].add(l[3]));
    let (c, d) = (l[4].add(l[5]), l[6].add(l[7]));
    a.add(b).add(c.add(d))
}

/// A run's sum as documented: chunks of 2048 summed as [`naive_chunk`], then the pairwise tree
/// (the first ⌈p/2⌉ rounded up to a power of two, then the rest), +0 for no term.
fn naive_run<T: Term>(xs: &[T]) -> T {
    fn tree<T: Term>(ps: &[T]) -> T {
        if ps.len() == 1 {
            return ps[0];
        }
        let mut h = 1;
        while 2 * h < ps.len() {
            h *= 2;
        }
        tree(&ps[..h]).add(tree(&ps[h..]))
    }
    let ps: Vec<T> = xs.chunks(2048).map(naive_chunk).collect();
    if ps.is_empty() {
        T::ZERO
    } else {
        tree(&ps)
    }
}

/// Inputs of n terms: inexact values whose lanes differ in magnitude by more than the
/// precision, some cancelling (lanes 1 and 2, 5 and 6), so that any change of association
/// changes the bits; −0 at every 13th.
fn terms(n: usize) -> (Vec<f32>, Vec<f64>, Vec<Complex32>) {
    const S32: [f64; 8] = [1.0, 3.0e7, -3.0e7, 1.0, 7.0e-3, 2.0e7, -2.0e7, 5.0];
    const S64: [f64; 8] = [1.0, 3.0e16, -3.0e16, 1.0, 7.0e-3, 2.0e16, -2.0e16, 5.0];
    let base = |i: usize| ((i * 7919) % 1009) as f64 * 0.37 - 150.0;
    let xs: Vec<f32> = (0..n).map(|i| if i % 13 == 5 { -0.0 } else { (base(i) * S32[i % 8]) as f32 }).collect();
    let ds: Vec<f64> = (0..n).map(|i| if i % 13 == 5 { -0.0 } else { base(i) / 3.0 * S64[i % 8] }).collect();
    let zs: Vec<Complex32> = (0..n).map(|i| Complex32::new(xs[i], -xs[(i * 5) % n] * 0.5)).collect();
    (xs, ds, zs)
}

fn cbits(z: Complex32) -> (u32, u32) {
    (z.re.to_bits(), z.im.to_bits())
}

/// The baseline chunk loop (and the run's chunks and tree) give the documented association's
/// bits, written out naively; on any CPU.
#[test]
fn the_chunk_loop_and_the_run_follow_the_documented_association() {
    // the all-negative-zero chunk: lanes start from +0, so the sum is +0
    assert_eq!(sum_chunk(Simd::Baseline, &[-0.0f32; 9]).to_bits(), 0.0f32.to_bits());
    for n in [0, 1, 7, 8, 9, 31, 2047, 2048, 2049, 3 * 2048 + 5, 5 * 2048, 9 * 2048 + 1] {
        let (xs, ds, zs) = terms(n);
        let c = n.min(2048);
        assert_eq!(sum_chunk(Simd::Baseline, &xs[..c]).to_bits(), naive_chunk(&xs[..c]).to_bits(), "f32 chunk, {n}");
        assert_eq!(sum_chunk(Simd::Baseline, &ds[..c]).to_bits(), naive_chunk(&ds[..c]).to_bits(), "f64 chunk, {n}");
        assert_eq!(cbits(sum_chunk(Simd::Baseline, &zs[..c])), cbits(naive_chunk(&zs[..c])), "c64 chunk, {n}");
        // the run (its chunk loop the build of the CPU's level)
        let Partial::Sum(r) = sum_run(Simd::detected(), &xs) else { unreachable!() };
        assert_eq!(r.to_bits(), naive_run(&xs).to_bits(), "f32 run, {n}");
        let Partial::Sum(r) = sum_run(Simd::detected(), &ds) else { unreachable!() };
        assert_eq!(r.to_bits(), naive_run(&ds).to_bits(), "f64 run, {n}");
        let Partial::Sum(r) = sum_run(Simd::detected(), &zs) else { unreachable!() };
        assert_eq!(cbits(r), cbits(naive_run(&zs)), "c64 run, {n}");
    }
}

/// The chunk loop at every level this CPU runs gives the baseline build's bits and the naive
/// association's (the baseline is checked on every CPU).
#[test]
fn every_level_of_the_chunk_loop_gives_the_baseline_bits() {
    for simd in Simd::available_levels() {
        for n in [0, 1, 7, 8, 9, 31, 2047, 2048] {
            let (xs, ds, zs) = terms(n);
            assert_eq!(sum_chunk(simd, &xs).to_bits(), naive_chunk(&xs).to_bits(), "f32 {simd}, {n}");
            assert_eq!(sum_chunk(simd, &ds).to_bits(), naive_chunk(&ds).to_bits(), "f64 {simd}, {n}");
            assert_eq!(cbits(sum_chunk(simd, &zs)), cbits(naive_chunk(&zs)), "c64 {simd}, {n}");
            let (is, us) =
                (xs.iter().map(|&x| (x * 1e6) as i64).collect::<Vec<_>>(), (0..n as u64).collect::<Vec<_>>());
            assert_eq!(sum_chunk(simd, &is), is.iter().fold(0i64, |a, &x| a.wrapping_add(x)), "i64 {simd}, {n}");
            assert_eq!(sum_chunk(simd, &us), us.iter().sum::<u64>(), "u64 {simd}, {n}");
        }
    }
}

/// Chunks summed four side by side (runs, rows of whole chunks summed across row boundaries, and
/// the evaluated path's partials) give the naive association's bits at every level, for runs
/// that end inside and after a quadruple of chunks.
#[test]
fn chunks_summed_side_by_side_keep_each_chunks_bits() {
    for simd in Simd::available_levels() {
        for n in [4 * 2048, 4 * 2048 + 1, 7 * 2048 + 3, 8 * 2048, 13 * 2048 + 2047] {
            let (xs, ds, zs) = terms(n);
            let Partial::Sum(r) = sum_run(simd, &xs) else { unreachable!() };
            assert_eq!(r.to_bits(), naive_run(&xs).to_bits(), "f32 run {simd}, {n}");
            let Partial::Sum(r) = sum_run(simd, &ds) else { unreachable!() };
            assert_eq!(r.to_bits(), naive_run(&ds).to_bits(), "f64 run {simd}, {n}");
            let Partial::Sum(r) = sum_run(simd, &zs) else { unreachable!() };
            assert_eq!(cbits(r), cbits(naive_run(&zs)), "c64 run {simd}, {n}");
            let mut ps = Vec::new();
            chunks_any(simd, Reduction::Sum, Src::F(&xs), 0, &mut ps);
            let want: Vec<u32> = xs.chunks(2048).map(|c| naive_chunk(c).to_bits()).collect();
            let got: Vec<u32> = ps
                .iter()
                .map(|p| if let AnyPartial::F(Partial::Sum(x)) = p { x.to_bits() } else { panic!() })
                .collect();
            assert_eq!(got, want, "f32 partials {simd}, {n}");
        }
        // rows of one, two and three whole chunks, and of a chunk and a bit; short rows (each
        // one chunk, summed in one call)
        let short = [(17, 1), (33, 7), (64, 8), (9, 13), (5, 2047)];
        for (rows, terms_a_row) in [(9, 2048), (7, 2 * 2048), (5, 3 * 2048), (3, 2049)].into_iter().chain(short) {
            let (xs, ds, _) = terms(rows * terms_a_row);
            let mut got = Vec::new();
            sum_rows(simd, &xs, terms_a_row, &mut |k, (v, _)| got.push((k, v)));
            let want: Vec<_> =
                xs.chunks(terms_a_row).map(|r| Value::Float(f64::from(naive_run(r)))).enumerate().collect();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "f32 rows {simd}, {rows}x{terms_a_row}");
            let mut got = Vec::new();
            sum_rows(simd, &ds, terms_a_row, &mut |k, (v, _)| got.push((k, v)));
            let want: Vec<_> = ds.chunks(terms_a_row).map(|r| Value::Float(naive_run(r))).enumerate().collect();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "f64 rows {simd}, {rows}x{terms_a_row}");
        }
    }
}

/// A reduction's short rows (each one chunk: attention's rows of a few keys) summed by the kernel,
/// plain and through a program (a product of two loads), give each row's documented association,
/// inline and split over the pool, at uneven row counts and lengths.
#[test]
fn short_rows_through_the_kernel_keep_the_chunk_association() {
    use crate::host::{HostOptions, Store};
    use crate::{Array, Kernels, Prog};
    let dev = nx_mesh::Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
    let split = HostOptions { threads: Some(2), reduce: Some(1), store: Store::Memory, ..HostOptions::default() };
    let inline = HostOptions { threads: Some(1), store: Store::Memory, ..HostOptions::default() };
    for opts in [split, inline] {
        let host = crate::Host::with_options(opts).unwrap();
        for (rows, t) in [(1, 1), (3, 7), (2048, 8), (513, 13), (9, 2047), (4, 2048)] {
            let (xs, _, _) = terms(rows * t);
            let ys: Vec<f32> = (0..rows * t).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
            let (a, b) = (
                Array::from_vec(dev, &[rows, t], xs.clone()).unwrap(),
                Array::from_vec(dev, &[rows, t], ys.clone()).unwrap(),
            );
            for product in [false, true] {
                let mut p = Prog::new(&[Dtype::F32, Dtype::F32]);
                let (x, y) = (p.load(0), p.load(1));
                let v = if product { p.mul(x, y) } else { x };
                p.output(v);
                let out = Array::<f32>::zeros(dev, &[rows]).unwrap();
                assert_eq!(
                    host.reduce(&p, &[rows, t], &[1], &[Reduction::Sum], &[&out], &[&a, &b]),
                    crate::Answer::Done
                );
                let terms: Vec<f32> =
                    if product { xs.iter().zip(&ys).map(|(x, y)| x * y).collect() } else { xs.clone() };
                let want: Vec<u32> = terms.chunks(t).map(|r| naive_chunk(r).to_bits()).collect();
                let got: Vec<u32> = out.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{rows}x{t}, product {product}, threads {}", host.threads());
            }
        }
    }
}
