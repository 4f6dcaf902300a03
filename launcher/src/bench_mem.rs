//! `nx bench kernels`' memory peers: the read limit (plain parallel read loops at their best
//! width), the plain 8-lane loop that the kernels' sums associate as, and PyTorch's maps and sums
//! (`benches/torch_elementwise.py`).

use std::time::Instant;

use nx::kernels::Simd;
use rayon::prelude::*;

nx::kernels::simd_fn! {
    /// The sum of `c` in 8 lanes, each in order (a chain of dependent additions per lane, the
    /// association of the kernels' sums), built for the level.
    pub(crate) fn lanes8(simd: Simd, c: &[f32]) -> f32 {
        let mut l = [0f32; 8];
        // plain `for` loops: an iterator adapter's closure would not inherit the build's features
        for v in c.chunks_exact(8) {
            for k in 0..8 {
                l[k] += v[k];
            }
        }
        l.iter().sum::<f32>()
    }
}

nx::kernels::simd_fn! {
    /// The sum of `c` in 64 lanes (four 512-bit or eight 256-bit chains: as many loads in flight
    /// as the core keeps), built for the level.
    pub(crate) fn lanes64(simd: Simd, c: &[f32]) -> f32 {
        let mut l = [0f32; 64];
        for v in c.chunks_exact(64) {
            for k in 0..64 {
                l[k] += v[k];
            }
        }
        l.iter().sum::<f32>()
    }
}

/// The read limit: bytes read per second by the fastest of four plain parallel read loops over
/// `src` on the current pool's threads (8 lanes and 64 lanes, each built for the CPU's widest
/// level, in tasks of 2¹⁶ elements and in one task a thread); `before` runs ahead of each (a
/// cache scrub).
pub(crate) fn read_limit(src: &[f32], before: &dyn Fn() -> f32) -> f64 {
    let simd = Simd::detected();
    let bytes = size_of_val(src) as f64;
    let mut best = 0f64;
    let whole = src.len().div_ceil(rayon::current_num_threads()).max(1);
    for task in [1 << 16, whole] {
        for f in [lanes8 as fn(Simd, &[f32]) -> f32, lanes64] {
            before();
            let t = Instant::now();
            let s = src.par_chunks(task).map(|c| f(simd, c)).sum::<f32>();
            best = best.max(bytes / t.elapsed().as_secs_f64());
            std::hint::black_box(s);
        }
    }
    best
}

/// One round of PyTorch's maps and sums over `n` elements (the last-axis sum over rows of
/// `cols`), each the median of `repeats` runs: GB/s by name (`add`, `add_bf16`, `fused`, `sum`,
/// `sum_rows`) and torch's version.
///
/// # Errors
/// Where the script cannot run or its output is not the JSON expected.
pub(crate) fn torch_round(python: &str, n: usize, cols: usize, repeats: usize) -> Result<serde_json::Value, String> {
    crate::bench::python_peer(
        python,
        "benches/torch_elementwise.py",
        &[n.to_string(), cols.to_string(), repeats.to_string()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both loops at every level give the sum of small integers exactly.
    #[test]
    fn the_read_loops_sum() {
        let c: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let want = c[..1000 / 64 * 64].iter().sum::<f32>();
        for simd in Simd::available_levels() {
            assert_eq!(lanes8(simd, &c[..1000 / 8 * 8]), c[..1000 / 8 * 8].iter().sum::<f32>());
            assert_eq!(lanes64(simd, &c), want);
        }
    }
}
