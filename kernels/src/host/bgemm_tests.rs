//! Tests of the bf16 product: against naive f64 loops, its stated association bit for bit on
//! every kit the CPU runs, edges that are not multiples of the tiles.

use half::bf16;

use super::*;
use crate::host::sgemm::{Rows, KC};

/// Normal bf16 values of magnitude 2^-8..2^8 of either sign, some zeros.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> bf16 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if self.0.is_multiple_of(53) {
            return bf16::from_bits(((self.0 >> 9) as u16 & 1) << 15);
        }
        let sign = ((self.0 >> 20) as u16 & 1) << 15;
        let exp = 119 + (self.0 >> 24) as u16 % 17;
        bf16::from_bits(sign | exp << 7 | (self.0 >> 40) as u16 & 0x7f)
    }

    fn fill(&mut self, n: usize) -> Vec<bf16> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// The documented association, written out with plain f32 products (exact here) and sums.
fn documented(m: usize, n: usize, k: usize, a: &[bf16], b: &[bf16], c: &mut [f32], add: bool) {
    let (a, b): (Vec<f32>, Vec<f32>) = (a.iter().map(|x| x.to_f32()).collect(), b.iter().map(|x| x.to_f32()).collect());
    for i in 0..m {
        for j in 0..n {
            let mut out = if add { c[i * n + j] } else { 0.0 };
            for (blk, p0) in (0..k).step_by(KC).enumerate() {
                let end = (p0 + KC).min(k);
                let mut s = 0f32;
                for e in (p0..end).step_by(2) {
                    if e + 1 < end {
                        s += a[i * k + e + 1] * b[(e + 1) * n + j];
                    }
                    s += a[i * k + e] * b[e * n + j];
                }
                out = if blk == 0 && !add { s } else { out + s };
            }
            c[i * n + j] = out;
        }
    }
}

/// `x`, or a zero of its sign where it is subnormal.
fn flush(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0f32.copysign(x)
    } else {
        x
    }
}

/// The AMX kit's association, written out with plain f32 products (exact here) and sums: one
/// running sum from the output (adding) or +0, groups of 32 from index 0, a group's even-indexed
/// and odd-indexed products summed apart (the indices past `k` as +0 products) and their sum added,
/// a subnormal output added onto and subnormal sums taken as zeros of their signs.
fn documented_amx(m: usize, n: usize, k: usize, a: &[bf16], b: &[bf16], c: &mut [f32], add: bool) {
    let (a, b): (Vec<f32>, Vec<f32>) = (a.iter().map(|x| x.to_f32()).collect(), b.iter().map(|x| x.to_f32()).collect());
    for i in 0..m {
        for j in 0..n {
            let term = |e: usize| if e < k { a[i * k + e] * b[e * n + j] } else { 0.0 };
            let mut s = if add { flush(c[i * n + j]) } else { 0.0 };
            for g in (0..k).step_by(32) {
                let (mut even, mut odd) = (term(g), term(g + 1));
                for t in 1..16 {
                    even = flush(even + term(g + 2 * t));
                    odd = flush(odd + term(g + 2 * t + 1));
                }
                s = flush(s + flush(even + odd));
            }
            c[i * n + j] = s;
        }
    }
}

/// The association `kit` documents.
#[allow(clippy::too_many_arguments)]
fn documented_by(kit: Bf16Isa, m: usize, n: usize, k: usize, a: &[bf16], b: &[bf16], c: &mut [f32], add: bool) {
    if kit == Bf16Isa::Tiles {
        documented_amx(m, n, k, a, b, c, add)
    } else {
        documented(m, n, k, a, b, c, add)
    }
}

fn kits() -> Vec<Bf16Isa> {
    let (here, absent): (Vec<Bf16Isa>, Vec<Bf16Isa>) =
        [Bf16Isa::Tiles, Bf16Isa::Dot, Bf16Isa::Wide(Isa::Avx512), Bf16Isa::Wide(Isa::Avx2), Bf16Isa::Wide(Isa::Plain)]
            .into_iter()
            .partition(|k| k.available());
    if !absent.is_empty() {
        eprintln!("this CPU lacks {absent:?}: those kits are not tested here");
    }
    here
}

#[allow(clippy::too_many_arguments)]
fn run(isa: Bf16Isa, m: usize, n: usize, k: usize, a: &[bf16], b: &[bf16], c: &mut [f32], add: bool) {
    let am = Mat { base: a.as_ptr(), rows: Rows::Stride(k as isize), col: 1 };
    let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
    let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
    // SAFETY: the slices hold the extents.
    unsafe { bgemm(isa, m, n, k, am, bm, out, add, true) };
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const EDGES: [usize; 6] = [1, 15, 16, 17, 31, 33];

#[test]
fn every_kit_gives_the_documented_association_on_edges_of_the_tiles() {
    let mut g = Gen(21);
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for &m in &EDGES {
        for &n in &EDGES {
            shapes.push((m, n, EDGES[(m + n) % 6]));
        }
    }
    shapes.extend([
        (13, 40, 1025),
        (4100, 3, 7),
        (5, 4100, 515),
        (2, 3, 0),
        (65, 70, 543),
        (64, 96, 2100),
        (40, 64, 1030),
        (33, 34, 4096),
        (64, 96, 4200),
        (3, 35, 4097),
        (35, 2, 8230),
    ]);
    for (m, n, k) in shapes {
        let (a, b) = (g.fill(m * k), g.fill(k * n));
        let c0: Vec<f32> = g.fill(m * n).iter().map(|x| x.to_f32()).collect();
        for add in [false, true] {
            for kit in kits() {
                let mut want = c0.clone();
                documented_by(kit, m, n, k, &a, &b, &mut want, add);
                let mut c = c0.clone();
                run(kit, m, n, k, &a, &b, &mut c, add);
                assert_eq!(bits(&c), bits(&want), "{kit:?} {m}x{n}x{k} add {add}");
            }
        }
    }
}

#[test]
fn products_are_within_f32_accumulations_bound_of_naive_f64_loops() {
    let mut g = Gen(5);
    for &(m, n, k) in &[(17, 33, 31), (31, 15, 1100), (16, 16, 16), (1, 1, 1), (33, 17, 15), (15, 31, 33)] {
        let (a, b) = (g.fill(m * k), g.fill(k * n));
        for kit in kits() {
            let mut c = vec![f32::NAN; m * n];
            run(kit, m, n, k, &a, &b, &mut c, false);
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for p in 0..k {
                        let t = a[i * k + p].to_f64() * b[p * n + j].to_f64();
                        exact += t;
                        mag += t.abs();
                    }
                    let bound = (k + 1) as f64 * f32::EPSILON as f64 / 2.0 * mag * 1.01;
                    let got = c[i * n + j] as f64;
                    assert!((got - exact).abs() <= bound, "{kit:?} {m}x{n}x{k} ({i}, {j}): {got} against {exact}");
                }
            }
        }
    }
}

#[test]
fn transposed_operands_and_listed_rows() {
    let (m, n, k, tall) = (15, 33, 531, 40);
    let mut g = Gen(8);
    let big = g.fill(tall * k);
    let bt = g.fill(n * k); // B transposed
    let picks: Vec<usize> = (0..m).map(|i| (i * 7 + 2) % tall).collect();
    let a: Vec<bf16> = picks.iter().flat_map(|&r| big[r * k..(r + 1) * k].to_vec()).collect();
    let b: Vec<bf16> = (0..k).flat_map(|p| (0..n).map(move |j| (p, j))).map(|(p, j)| bt[j * k + p]).collect();
    let rows: Vec<isize> = picks.iter().map(|&r| (r * k) as isize).collect();
    for kit in kits() {
        let mut want = vec![0f32; m * n];
        documented_by(kit, m, n, k, &a, &b, &mut want, false);
        let mut c = vec![f32::NAN; m * n];
        let am = Mat { base: big.as_ptr(), rows: Rows::At(&rows), col: 1 };
        let bm = Mat { base: bt.as_ptr(), rows: Rows::Stride(1), col: k as isize };
        let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
        // SAFETY: every listed row lies in its slice.
        unsafe { bgemm(kit, m, n, k, am, bm, out, false, true) };
        assert_eq!(bits(&c), bits(&want), "{kit:?}");
    }
}

#[test]
fn strided_operands_through_the_general_packers() {
    // A transposed (column stride m) and B's columns flipped (column stride -1): neither packer's
    // contiguous path
    let (m, n, k) = (13, 35, 517);
    let mut g = Gen(31);
    let at = g.fill(k * m);
    let b = g.fill(k * n);
    let a: Vec<bf16> = (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| at[p * m + i]).collect();
    let bf: Vec<bf16> = (0..k).flat_map(|p| (0..n).map(move |j| (p, j))).map(|(p, j)| b[p * n + (n - 1 - j)]).collect();
    for kit in kits() {
        let mut want = vec![0f32; m * n];
        documented_by(kit, m, n, k, &a, &bf, &mut want, false);
        let mut c = vec![f32::NAN; m * n];
        // SAFETY: every element addressed lies in its slice.
        unsafe {
            let am = Mat { base: at.as_ptr(), rows: Rows::Stride(1), col: m as isize };
            let bm = Mat { base: b.as_ptr().add(n - 1), rows: Rows::Stride(n as isize), col: -1 };
            let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
            bgemm(kit, m, n, k, am, bm, out, false, true);
        }
        assert_eq!(bits(&c), bits(&want), "{kit:?}");
    }
}

#[test]
fn listed_and_reversed_output_rows_on_whole_tiles() {
    // whole 32 x 32 tiles whose output rows are not one positive stride apart: listed in a
    // scattered order and by a negative stride, added onto and not, over blocks past the f32 kits'
    // and the AMX kit's (whole tiles reloaded in place)
    for k in [1100, 4200] {
        listed_and_reversed(k);
    }
}

fn listed_and_reversed(k: usize) {
    let (m, n) = (64, 64);
    let mut g = Gen(44);
    let (a, b) = (g.fill(m * k), g.fill(k * n));
    let c0: Vec<f32> = g.fill(m * n).iter().map(|x| x.to_f32()).collect();
    let am = Mat { base: a.as_ptr(), rows: Rows::Stride(k as isize), col: 1 };
    let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
    // row i of the product lands in row to(i) of c
    let to = |i: usize| (i * 37 + 5) % m;
    let listed: Vec<isize> = (0..m).map(|i| (to(i) * n) as isize).collect();
    let place = |v: &[f32]| -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        (0..m).for_each(|i| out[to(i) * n..(to(i) + 1) * n].copy_from_slice(&v[i * n..(i + 1) * n]));
        out
    };
    let flip = |v: &[f32]| -> Vec<f32> { (0..m).rev().flat_map(|i| v[i * n..(i + 1) * n].to_vec()).collect() };
    for kit in kits() {
        for add in [false, true] {
            let mut want = c0.clone();
            documented_by(kit, m, n, k, &a, &b, &mut want, add);
            let mut c = place(&c0);
            let out = Out { base: c.as_mut_ptr(), rows: Rows::At(&listed) };
            // SAFETY: every listed row lies in c.
            unsafe { bgemm(kit, m, n, k, am, bm, out, add, true) };
            assert_eq!(bits(&c), bits(&place(&want)), "{kit:?} listed, k {k}, add {add}");
            let mut c = flip(&c0);
            // SAFETY: row i at (m - 1 - i)·n, every row in c.
            let out = Out { base: unsafe { c.as_mut_ptr().add((m - 1) * n) }, rows: Rows::Stride(-(n as isize)) };
            // SAFETY: every row lies in c.
            unsafe { bgemm(kit, m, n, k, am, bm, out, add, true) };
            assert_eq!(bits(&c), bits(&flip(&want)), "{kit:?} negative stride, k {k}, add {add}");
        }
    }
}

/// The bf16 bits of `x` rounded to nearest, ties to even, every NaN `0x7FC0`, by its halves'
/// integer parts (written apart from the library's conversions).
fn rounded(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let b = x.to_bits();
    let (hi, lo) = (b >> 16, b & 0xFFFF);
    (if lo > 0x8000 || (lo == 0x8000 && hi & 1 == 1) { hi + 1 } else { hi }) as u16
}

/// Operands whose products are exact ties of bf16 (the product of two 8-bit significands has 16
/// bits) or are NaN, among the random ones.
fn awkward(g: &mut Gen, n: usize) -> Vec<bf16> {
    g.fill(n)
        .into_iter()
        .enumerate()
        .map(|(i, x)| match i % 29 {
            3 => bf16::from_f32(1.0625), // (1 + 2⁻⁴)² = 1 + 2⁻³ + 2⁻⁸: a tie, kept even
            4 => bf16::from_f32(-1.1875),
            7 if i % 3 == 0 => bf16::from_bits(0x7FC1),
            _ => x,
        })
        .collect()
}

#[test]
fn amx_bf16_outputs_round_the_documented_sums_once() {
    if !Bf16Isa::Tiles.available() {
        eprintln!("this CPU has no AMX-BF16: the bf16-output tiles are not tested here");
        return;
    }
    let mut g = Gen(77);
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for &m in &EDGES {
        for &n in &EDGES {
            shapes.push((m, n, EDGES[(m * 5 + n) % 6]));
        }
    }
    shapes.extend([(64, 64, 1), (64, 96, 2), (65, 70, 543), (96, 64, 2100), (33, 31, 4096), (4100, 3, 7)]);
    assert!(writes_bf16(Bf16Isa::Tiles, 4096) && !writes_bf16(Bf16Isa::Tiles, 4097) && !writes_bf16(Bf16Isa::Dot, 1));
    for (m, n, k) in shapes {
        let (a, b) = (awkward(&mut g, m * k), awkward(&mut g, k * n));
        // an init with NaNs, infinities, both zeros and subnormals among random values
        let c0: Vec<bf16> = awkward(&mut g, m * n)
            .into_iter()
            .enumerate()
            .map(|(i, x)| match i % 31 {
                1 => bf16::from_bits(0x7F80),
                2 => bf16::from_bits(0x8000),
                3 => bf16::from_bits(if i % 2 == 0 { 0x0001 } else { 0x8001 }),
                4 => bf16::from_bits(0xFF81),
                _ => x,
            })
            .collect();
        for add in [false, true] {
            let mut want: Vec<f32> = c0.iter().map(|x| x.to_f32()).collect();
            documented_amx(m, n, k, &a, &b, &mut want, add);
            let want: Vec<u16> = want.iter().map(|&x| rounded(x)).collect();
            for rows in ["stride", "listed"] {
                // listed rows in reverse order
                let listed: Vec<isize> = (0..m).map(|i| ((m - 1 - i) * n) as isize).collect();
                let mut c = c0.clone();
                if rows == "listed" {
                    c.reverse();
                    c.chunks_mut(n).for_each(|r| r.reverse());
                }
                let am = Mat { base: a.as_ptr(), rows: Rows::Stride(k as isize), col: 1 };
                let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
                let r = if rows == "listed" { Rows::At(&listed) } else { Rows::Stride(n as isize) };
                let out = Out { base: c.as_mut_ptr(), rows: r };
                // SAFETY: the slices hold the extents; every listed row lies in c.
                unsafe { bgemm_into_bf16(m, n, k, am, bm, out, add, true) };
                if rows == "listed" {
                    c.reverse();
                    c.chunks_mut(n).for_each(|r| r.reverse());
                }
                let got: Vec<u16> = c.iter().map(|x| x.to_bits()).collect();
                if let Some(i) = (0..m * n).find(|&i| got[i] != want[i]) {
                    panic!("{m}x{n}x{k} add {add} {rows} at {i}: {:#06x} against {:#06x}", got[i], want[i]);
                }
            }
        }
    }
}

/// The bf16 rows the AMX kit writes and reads, on any CPU with AVX-512 BW: every bf16 bit pattern
/// widens exactly, f32s around every rounding boundary (ties, the largest finite values, ±∞,
/// NaNs, subnormals, zeros) round as `f32_to_bf16` does, and a row of `nv` lanes touches those
/// lanes alone.
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_rows_widen_and_round_within_their_lanes() {
    use crate::dtype::convert::f32_to_bf16;
    use amx::x86::{narrow_row, widen_row};
    if !crate::Simd::Avx512.available() {
        eprintln!("this CPU has no AVX-512 BW: the bf16 rows are not tested here");
        return;
    }
    #[repr(C, align(64))]
    struct Buf([f32; 32]);
    let mut buf = Buf([0.0; 32]);
    // every bf16 pattern, 32 at a time, widened
    for base in (0..=u16::MAX as u32).step_by(32) {
        let row: Vec<u16> = (base..base + 32).map(|h| h as u16).collect();
        // SAFETY: 32 lanes of row; buf holds 32 aligned f32s; the CPU has AVX-512 BW.
        unsafe { widen_row(row.as_ptr(), u32::MAX, buf.0.as_mut_ptr()) };
        for (t, &h) in row.iter().enumerate() {
            assert_eq!(buf.0[t].to_bits(), u32::from(h) << 16, "widen {h:#06x}");
        }
    }
    // f32s around every bf16 boundary: each high half with low halves at and beside the tie
    let lows = [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
    let values: Vec<f32> =
        (0..=u16::MAX as u32).flat_map(|h| lows.iter().map(move |&l| f32::from_bits(h << 16 | l))).collect();
    for chunk in values.chunks(32) {
        buf.0[..chunk.len()].copy_from_slice(chunk);
        let mut out = [0u16; 32];
        // SAFETY: as above.
        unsafe { narrow_row(buf.0.as_ptr(), out.as_mut_ptr(), u32::MAX >> (32 - chunk.len())) };
        for (t, &x) in chunk.iter().enumerate() {
            assert_eq!(out[t], f32_to_bf16(x).to_bits(), "round {:#010x}", x.to_bits());
        }
    }
    // rows of nv lanes between guards: nothing past the lanes is written, nothing read counts
    for nv in 1..=32usize {
        let lanes = if nv == 32 { u32::MAX } else { (1u32 << nv) - 1 };
        let mut dst = vec![0xABCDu16; 40];
        buf.0 = std::array::from_fn(|t| t as f32 + 0.5);
        // SAFETY: lanes 0..nv from dst[4] lie in dst.
        unsafe { narrow_row(buf.0.as_ptr(), dst.as_mut_ptr().add(4), lanes) };
        for (t, &d) in dst.iter().enumerate() {
            let want = if (4..4 + nv).contains(&t) { f32_to_bf16((t - 4) as f32 + 0.5).to_bits() } else { 0xABCD };
            assert_eq!(d, want, "nv {nv}: element {t}");
        }
        // SAFETY: as above.
        unsafe { widen_row(dst.as_ptr().add(4), lanes, buf.0.as_mut_ptr()) };
        for (t, &x) in buf.0.iter().enumerate() {
            let want = if t < nv { f32::from_bits(u32::from(dst[4 + t]) << 16) } else { 0.0 };
            assert_eq!(x.to_bits(), want.to_bits(), "nv {nv}: widened lane {t}");
        }
    }
}
