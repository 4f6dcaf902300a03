//! Random cases every backend runs, so that two backends are compared bit for bit: [`run`] draws
//! a sequence of collectives from a seed (op, reduce op, dtype, lengths and uneven counts, small
//! and past every chunk and window half), each rank's inputs from the seed and its rank, and
//! answers the bits of every result on this rank.

use half::{bf16, f16};

use crate::{Communicator, ReduceOp, Reducible, Result};

/// SplitMix64: a small generator whose sequence is fixed by its seed.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A value in about ±64, inexact in every float dtype.
    fn value(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 128.0 - 64.0
    }
}

/// An element the cases draw, with its bits.
trait Case: Reducible {
    fn draw(d: &mut Draw) -> Self;
    fn bits(self) -> u64;
}

impl Case for f32 {
    fn draw(d: &mut Draw) -> f32 {
        d.value() as f32
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Case for f64 {
    fn draw(d: &mut Draw) -> f64 {
        d.value()
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Case for bf16 {
    fn draw(d: &mut Draw) -> bf16 {
        bf16::from_f64(d.value())
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Case for f16 {
    fn draw(d: &mut Draw) -> f16 {
        f16::from_f64(d.value() / 8.0)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Case for i32 {
    fn draw(d: &mut Draw) -> i32 {
        d.next() as i32
    }
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
}

/// A length: mostly small, sometimes past the reduce chunk and a window half (f32: 262,144
/// elements a half).
fn length(d: &mut Draw) -> usize {
    match d.below(8) {
        0 => 0,
        1 => 300_000 + d.below(40_000),
        _ => d.below(5_000),
    }
}

/// `n` counts of about `len / n` each, uneven.
fn counts(d: &mut Draw, n: usize, len: usize) -> Vec<usize> {
    (0..n).map(|_| d.below(len / n.max(1) + 2)).collect()
}

/// Runs `cases` collectives drawn from `seed` on `c` and answers the bits of every result on this
/// rank, in order.
///
/// # Errors
/// The collectives' errors.
pub fn run<C: Communicator>(c: &C, seed: u64, cases: usize) -> Result<Vec<u64>> {
    let mut shared = Draw(seed);
    let mut out = Vec::new();
    for k in 0..cases {
        // every rank draws the same call; its inputs from its rank
        let mut mine = Draw(seed ^ (c.rank() as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (k as u64) << 40);
        match shared.below(5) {
            0 => one::<f32, C>(c, &mut shared, &mut mine, &mut out)?,
            1 => one::<f64, C>(c, &mut shared, &mut mine, &mut out)?,
            2 => one::<bf16, C>(c, &mut shared, &mut mine, &mut out)?,
            3 => one::<f16, C>(c, &mut shared, &mut mine, &mut out)?,
            _ => one::<i32, C>(c, &mut shared, &mut mine, &mut out)?,
        }
    }
    Ok(out)
}

/// Large uneven sums and gathers of f32 from `seed` (past many of the hierarchical path's pieces:
/// an all-reduce of 44 MiB, a reduce-scatter where one rank keeps most, one a few elements and
/// one none, an all-gather of 40 MiB), answering the bits of every result on this rank.
///
/// # Errors
/// The collectives' errors.
pub fn large<C: Communicator>(c: &C, seed: u64) -> Result<Vec<u64>> {
    let (n, r) = (c.size(), c.rank());
    let mut mine = Draw(seed ^ (r as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut input = |len: usize| -> Vec<f32> { (0..len).map(|_| f32::draw(&mut mine)).collect() };
    let mut out = Vec::new();
    let len = 11_000_003;
    let mut got = vec![0f32; len];
    c.all_reduce(&input(len), &mut got, ReduceOp::Sum)?;
    out.extend(got.iter().map(|x| x.bits()));
    let counts: Vec<usize> = (0..n).map(|q| [9_000_001, 0, 7, 1_000_003][q % 4]).collect();
    let mut got = vec![0f32; counts[r]];
    c.reduce_scatter_v(&input(counts.iter().sum()), &mut got, &counts, ReduceOp::Sum)?;
    out.extend(got.iter().map(|x| x.bits()));
    let counts: Vec<usize> = (0..n).map(|q| [2_500_001, 3, 0, 7_500_000][q % 4]).collect();
    let mut got = vec![0f32; counts.iter().sum()];
    c.all_gather_v(&input(counts[r]), &mut got, &counts)?;
    out.extend(got.iter().map(|x| x.bits()));
    Ok(out)
}

/// One collective of `T` drawn from `shared`, inputs from `mine`; its result's bits onto `out`.
fn one<T: Case, C: Communicator>(c: &C, shared: &mut Draw, mine: &mut Draw, out: &mut Vec<u64>) -> Result<()> {
    let (n, r) = (c.size(), c.rank());
    let op = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min][shared.below(4)];
    let input = |d: &mut Draw, len: usize| -> Vec<T> { (0..len).map(|_| T::draw(d)).collect() };
    let mut got: Vec<T>;
    match shared.below(5) {
        0 => {
            let len = length(shared);
            got = vec![T::default(); len];
            c.all_reduce(&input(mine, len), &mut got, op)?;
        }
        1 => {
            let len = length(shared);
            let counts = counts(shared, n, len);
            got = vec![T::default(); counts[r]];
            c.reduce_scatter_v(&input(mine, counts.iter().sum()), &mut got, &counts, op)?;
        }
        2 => {
            let len = length(shared);
            let counts = counts(shared, n, len);
            got = vec![T::default(); counts.iter().sum()];
            c.all_gather_v(&input(mine, counts[r]), &mut got, &counts)?;
        }
        3 => {
            // counts[i][j]: what rank i sends rank j
            let len = length(shared);
            let all: Vec<Vec<usize>> = (0..n).map(|_| counts(shared, n, len)).collect();
            let recv: Vec<usize> = (0..n).map(|i| all[i][r]).collect();
            got = vec![T::default(); recv.iter().sum()];
            c.all_to_all_v(&input(mine, all[r].iter().sum()), &all[r], &mut got, &recv)?;
        }
        _ => {
            let (len, root) = (length(shared), shared.below(n));
            got = if r == root { input(mine, len) } else { vec![T::default(); len] };
            c.broadcast(&mut got, root)?;
        }
    }
    out.extend(got.into_iter().map(T::bits));
    Ok(())
}
