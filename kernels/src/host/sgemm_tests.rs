//! Tests of nx's `f32` product: against naive f64 loops, its stated association bit for bit, and
//! the same bits on every instruction set, thread count, shape and row placement.

use super::*;

/// A deterministic stream of values in [-1, 1), some exactly 0 and some tiny.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        match self.0 % 97 {
            0 => 0.0,
            1 => -1.0e-30,
            _ => ((self.0 >> 40) as f32 / (1u64 << 23) as f32) - 1.0,
        }
    }

    fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// The documented association, written out: per block of KC, an accumulator from +0 takes each
/// product by a fused multiply-add in index order; the block's sum is added to the output, or
/// stored in the first block of an overwriting product.
fn documented(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32], add: bool) {
    for i in 0..m {
        for j in 0..n {
            let mut out = if add { c[i * n + j] } else { 0.0 };
            for (q, p0) in (0..k).step_by(KC).enumerate() {
                let mut s = 0f32;
                for p in p0..(p0 + KC).min(k) {
                    s = a[i * k + p].mul_add(b[p * n + j], s);
                }
                out = if q == 0 && !add { s } else { out + s };
            }
            c[i * n + j] = out;
        }
    }
}

/// Runs the product of row-major `a` (m × k) and `b` (k × n) into row-major `c`.
#[allow(clippy::too_many_arguments)]
fn run(isa: Isa, m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32], add: bool, parallel: bool) {
    let am = Mat { base: a.as_ptr(), rows: Rows::Stride(k as isize), col: 1 };
    let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
    let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
    // SAFETY: the slices hold the extents.
    unsafe { sgemm(isa, m, n, k, am, bm, out, add, parallel) };
}

fn isas() -> Vec<Isa> {
    let (here, absent): (Vec<Isa>, Vec<Isa>) =
        [Isa::Avx512, Isa::Avx2, Isa::Plain].into_iter().partition(|i| i.available());
    if !absent.is_empty() {
        eprintln!("this CPU lacks {absent:?}: those tiles are not tested here");
    }
    here
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (13, 33, 1025),
    (12, 32, 512),
    (25, 17, 513),
    (7, 65, 3),
    (200, 45, 300),
    (1, 100, 1700),
    (40, 1, 9),
    (3, 4097, 2),
];

#[test]
fn products_are_within_the_bound_of_naive_f64_loops() {
    let mut g = Gen(7);
    for &(m, n, k) in &SHAPES {
        let (a, b) = (g.fill(m * k), g.fill(k * n));
        let c0 = g.fill(m * n);
        for isa in isas() {
            for add in [false, true] {
                let mut c = c0.clone();
                run(isa, m, n, k, &a, &b, &mut c, add, true);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut mag) = (if add { c0[i * n + j] as f64 } else { 0.0 }, 0f64);
                        for p in 0..k {
                            let t = a[i * k + p] as f64 * b[p * n + j] as f64;
                            exact += t;
                            mag += t.abs();
                        }
                        mag += if add { (c0[i * n + j] as f64).abs() } else { 0.0 };
                        // each of at most k + 2 roundings is within 2^-24 of what it rounds
                        let bound = (k + 2) as f64 * f32::EPSILON as f64 / 2.0 * mag * 1.01 + 1e-37;
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{isa:?} {m}x{n}x{k} add {add} at ({i}, {j}): {got} against {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_kernel_gives_the_documented_association_bit_for_bit() {
    let mut g = Gen(11);
    for &(m, n, k) in &SHAPES {
        let (a, b) = (g.fill(m * k), g.fill(k * n));
        let c0 = g.fill(m * n);
        for add in [false, true] {
            let mut want = c0.clone();
            documented(m, n, k, &a, &b, &mut want, add);
            for isa in isas() {
                for parallel in [false, true] {
                    let mut c = c0.clone();
                    run(isa, m, n, k, &a, &b, &mut c, add, parallel);
                    assert_eq!(bits(&c), bits(&want), "{isa:?} {m}x{n}x{k} add {add} parallel {parallel}");
                }
            }
        }
    }
}

#[test]
fn bits_do_not_depend_on_the_thread_count() {
    let (m, n, k) = (77, 130, 600);
    let mut g = Gen(3);
    let (a, b) = (g.fill(m * k), g.fill(k * n));
    let mut first: Option<Vec<u32>> = None;
    for threads in [1, 2, 3, 8] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut c = vec![f32::NAN; m * n];
        pool.install(|| run(Isa::of(Simd::detected()), m, n, k, &a, &b, &mut c, false, true));
        let got = bits(&c);
        assert_eq!(*first.get_or_insert_with(|| got.clone()), got, "{threads} threads");
    }
}

#[test]
fn listed_rows_and_strided_operands_are_read_and_written_in_place() {
    // A's rows picked from a taller matrix out of order, B read transposed, C's rows scattered
    // into a taller destination: the same bits as the plain product of the gathered rows.
    let (m, n, k, tall) = (19, 37, 270, 50);
    let mut g = Gen(5);
    let big_a = g.fill(tall * k);
    let bt = g.fill(n * k); // B transposed: element (p, j) at j·k + p
    let picks: Vec<usize> = (0..m).map(|i| (i * 7 + 3) % tall).collect();
    let a: Vec<f32> = picks.iter().flat_map(|&r| big_a[r * k..(r + 1) * k].to_vec()).collect();
    let b: Vec<f32> = (0..k).flat_map(|p| (0..n).map(move |j| (p, j))).map(|(p, j)| bt[j * k + p]).collect();
    let mut want = vec![0f32; m * n];
    documented(m, n, k, &a, &b, &mut want, false);
    let a_rows: Vec<isize> = picks.iter().map(|&r| (r * k) as isize).collect();
    let c_rows: Vec<isize> = (0..m).map(|i| (((i * 11) % tall) * n) as isize).collect();
    for isa in isas() {
        let mut c = vec![f32::NAN; tall * n];
        let am = Mat { base: big_a.as_ptr(), rows: Rows::At(&a_rows), col: 1 };
        let bm = Mat { base: bt.as_ptr(), rows: Rows::Stride(1), col: k as isize };
        let out = Out { base: c.as_mut_ptr(), rows: Rows::At(&c_rows) };
        // SAFETY: every listed row lies in its slice.
        unsafe { sgemm(isa, m, n, k, am, bm, out, false, true) };
        for i in 0..m {
            let r = c_rows[i] as usize;
            assert_eq!(bits(&c[r..r + n]), bits(&want[i * n..(i + 1) * n]), "{isa:?} row {i}");
        }
        let written: std::collections::HashSet<usize> = c_rows.iter().map(|&r| r as usize / n).collect();
        for row in (0..tall).filter(|r| !written.contains(r)) {
            assert!(c[row * n..(row + 1) * n].iter().all(|x| x.is_nan()), "{isa:?}: row {row} written");
        }
    }
}

#[test]
fn a_row_has_the_same_bits_alone_as_in_any_matrix() {
    let (m, n, k) = (50, 70, 520);
    let mut g = Gen(9);
    let (a, b) = (g.fill(m * k), g.fill(k * n));
    let mut whole = vec![0f32; m * n];
    run(Isa::of(Simd::detected()), m, n, k, &a, &b, &mut whole, false, true);
    for i in [0, 13, 49] {
        let mut row = vec![0f32; n];
        run(Isa::of(Simd::detected()), 1, n, k, &a[i * k..(i + 1) * k], &b, &mut row, false, false);
        assert_eq!(bits(&row), bits(&whole[i * n..(i + 1) * n]), "row {i}");
        // and a column alone
        let col: Vec<f32> = (0..k).map(|p| b[p * n + 5]).collect();
        let mut one = vec![0f32; 1];
        run(Isa::of(Simd::detected()), 1, 1, k, &a[i * k..(i + 1) * k], &col, &mut one, false, false);
        assert_eq!(one[0].to_bits(), whole[i * n + 5].to_bits(), "row {i} column 5");
    }
}

#[test]
fn empty_extents_write_what_the_contract_says() {
    for isa in isas() {
        let mut c = vec![5f32; 6];
        run(isa, 2, 3, 0, &[], &[], &mut c, true, true);
        assert_eq!(c, vec![5.0; 6], "{isa:?}: k = 0 adding leaves C");
        run(isa, 2, 3, 0, &[], &[], &mut c, false, true);
        assert_eq!(bits(&c), vec![0; 6], "{isa:?}: k = 0 overwriting stores +0");
        let mut none: Vec<f32> = Vec::new();
        run(isa, 0, 3, 4, &[], &[0.0; 12], &mut none, false, true);
        run(isa, 2, 0, 4, &[0.0; 8], &[], &mut none, false, true);
    }
}

#[test]
fn more_rows_than_a_chunk_and_columns_than_a_pack() {
    // m past MCHUNK (4096, not a multiple of either tile height) and n past NC, k past KC
    for &(m, n, k) in &[(4100, 3, 530), (2, 4100, 515)] {
        let mut g = Gen(13);
        let (a, b) = (g.fill(m * k), g.fill(k * n));
        let c0 = g.fill(m * n);
        let mut want = c0.clone();
        documented(m, n, k, &a, &b, &mut want, true);
        for isa in isas() {
            let mut c = c0.clone();
            run(isa, m, n, k, &a, &b, &mut c, true, true);
            assert_eq!(bits(&c), bits(&want), "{isa:?} {m}x{n}x{k}");
        }
    }
}

#[test]
fn flipped_and_transposed_operands_and_listed_rows_added_onto() {
    // A read transposed and with its rows flipped (negative row stride, column stride m), B with
    // its columns flipped (negative column stride), C's rows listed out of order and added onto.
    let (m, n, k) = (14, 35, 600);
    let mut g = Gen(17);
    let at = g.fill(k * m); // A transposed: element (i, p) at p·m + i
    let b = g.fill(k * n);
    let c0 = g.fill(m * n);
    let a: Vec<f32> = (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| at[p * m + (m - 1 - i)]).collect();
    let bf: Vec<f32> = (0..k).flat_map(|p| (0..n).map(move |j| (p, j))).map(|(p, j)| b[p * n + (n - 1 - j)]).collect();
    let order: Vec<usize> = (0..m).map(|i| (i * 5) % m).collect();
    let mut want = c0.clone();
    let mut plain = vec![0f32; m * n];
    for (i, &r) in order.iter().enumerate() {
        plain[i * n..(i + 1) * n].copy_from_slice(&c0[r * n..(r + 1) * n]);
    }
    documented(m, n, k, &a, &bf, &mut plain, true);
    for (i, &r) in order.iter().enumerate() {
        want[r * n..(r + 1) * n].copy_from_slice(&plain[i * n..(i + 1) * n]);
    }
    let c_rows: Vec<isize> = order.iter().map(|&r| (r * n) as isize).collect();
    for isa in isas() {
        let mut c = c0.clone();
        // SAFETY: every element addressed lies in its slice.
        unsafe {
            let am = Mat { base: at.as_ptr().add(m - 1), rows: Rows::Stride(-1), col: m as isize };
            let bm = Mat { base: b.as_ptr().add(n - 1), rows: Rows::Stride(n as isize), col: -1 };
            let out = Out { base: c.as_mut_ptr(), rows: Rows::At(&c_rows) };
            sgemm(isa, m, n, k, am, bm, out, true, true);
        }
        assert_eq!(bits(&c), bits(&want), "{isa:?}");
    }
}

#[test]
fn transposed_and_listed_a_read_in_place_on_every_tile_edge() {
    // A transposed (its rows side by side: element (i, p) at p·m + i), transposed with its
    // contracting index flipped (a negative column stride) and A's rows listed out of order: the
    // tiles read them where they lie (up to IN_PLACE_COLUMNS columns) or from panels (past it);
    // heights around both tiles' (6 and 12 rows), past a block of KC, added onto and overwriting
    let mut g = Gen(23);
    let shapes = [
        (1, 5, 7),
        (5, 33, 40),
        (11, 64, 130),
        (13, 17, 513),
        (25, 256, 64),
        (30, 257, 9),
        (6, 300, 20),
        (30, 300, 600),
    ];
    for &(m, n, k) in &shapes {
        let at = g.fill(k * m);
        let b = g.fill(k * n);
        let c0 = g.fill(m * n);
        let a: Vec<f32> = (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| at[p * m + i]).collect();
        let flipped: Vec<f32> =
            (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| at[(k - 1 - p) * m + i]).collect();
        // A's rows listed in reverse from a copy with a gap after each row
        let gap = k + 3;
        let mut spaced = vec![f32::NAN; m * gap];
        for i in 0..m {
            spaced[(m - 1 - i) * gap..(m - 1 - i) * gap + k].copy_from_slice(&a[i * k..(i + 1) * k]);
        }
        let rows: Vec<isize> = (0..m).map(|i| ((m - 1 - i) * gap) as isize).collect();
        // the last contracting index's row of `at`, where the flipped A starts
        let last = at[(k - 1) * m..].as_ptr();
        for isa in isas() {
            let cases = [
                ("transposed", &a, Mat { base: at.as_ptr(), rows: Rows::Stride(1), col: m as isize }),
                ("flipped", &flipped, Mat { base: last, rows: Rows::Stride(1), col: -(m as isize) }),
                ("listed", &a, Mat { base: spaced.as_ptr(), rows: Rows::At(&rows), col: 1 }),
            ];
            for (what, plain, am) in cases {
                let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
                let kit = F32 { isa, a: am, b: bm };
                let vector = isa != Isa::Plain && cfg!(target_arch = "x86_64");
                assert_eq!(kit.a_in_place(n), vector && n <= IN_PLACE_COLUMNS, "{isa:?} {what} {m}x{n}x{k}");
                for add in [true, false] {
                    let mut want = c0.clone();
                    documented(m, n, k, plain, &b, &mut want, add);
                    for parallel in [false, true] {
                        let mut c = c0.clone();
                        let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
                        // SAFETY: every element addressed lies in its slice.
                        unsafe { sgemm(isa, m, n, k, am, bm, out, add, parallel) };
                        let how = format!("{isa:?} {what} {m}x{n}x{k} add {add} parallel {parallel}");
                        assert_eq!(bits(&c), bits(&want), "{how}");
                    }
                }
            }
        }
    }
}

/// `n` f32s ending where an unreadable page starts, so that a read past them faults.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
struct Guarded {
    map: *mut std::ffi::c_void,
    len: usize,
    n: usize,
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use crate::buffer::os;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
impl Guarded {
    fn new(v: &[f32]) -> Guarded {
        let page = 4096;
        let data = (v.len() * 4).div_ceil(page) * page;
        let len = data + page;
        // SAFETY: a fresh private anonymous mapping, its last page made unreadable.
        unsafe {
            let map = os::mmap(std::ptr::null_mut(), len, os::PROT_READ_WRITE, os::MAP_PRIVATE_ANONYMOUS, -1, 0);
            assert!(map as isize != -1, "mmap");
            assert_eq!(os::mprotect(map.cast::<u8>().add(data).cast(), page, 0), 0, "mprotect");
            let g = Guarded { map, len, n: v.len() };
            std::ptr::copy_nonoverlapping(v.as_ptr(), g.ptr().cast_mut(), v.len());
            g
        }
    }

    fn ptr(&self) -> *const f32 {
        // SAFETY: n f32s end at the guard page.
        unsafe { self.map.cast::<u8>().add(self.len - 4096 - self.n * 4).cast() }
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: mapped with this length in `new`, unmapped once.
        unsafe { os::munmap(self.map, self.len) };
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn a_read_in_place_is_not_read_past_its_last_entry() {
    // A ending where an unreadable page starts: transposed (short last tiles read their own rows
    // again, never the entries past row m - 1), flipped, and with entries at stride 1; a read
    // past A faults and fails the test
    let mut g = Gen(29);
    for &(m, n, k) in &[(5, 40, 33), (13, 64, 600), (25, 256, 7), (1, 3, 2)] {
        let a = g.fill(m * k);
        let b = g.fill(k * n);
        let at: Vec<f32> = (0..k).flat_map(|p| (0..m).map(move |i| (i, p))).map(|(i, p)| a[i * k + p]).collect();
        let flipped: Vec<f32> =
            (0..m).flat_map(|i| (0..k).map(move |p| (i, p))).map(|(i, p)| a[i * k + k - 1 - p]).collect();
        let (ga, gat) = (Guarded::new(&a), Guarded::new(&at));
        let mut want = vec![0f32; m * n];
        documented(m, n, k, &a, &b, &mut want, false);
        let mut want_flipped = vec![0f32; m * n];
        documented(m, n, k, &flipped, &b, &mut want_flipped, false);
        // SAFETY: the last contracting index's entries of the transposed A
        let last = unsafe { gat.ptr().add((k - 1) * m) };
        for isa in isas() {
            let cases = [
                ("rows", &want, Mat { base: ga.ptr(), rows: Rows::Stride(k as isize), col: 1 }),
                ("transposed", &want, Mat { base: gat.ptr(), rows: Rows::Stride(1), col: m as isize }),
                ("flipped", &want_flipped, Mat { base: last, rows: Rows::Stride(1), col: -(m as isize) }),
            ];
            for (what, want, am) in cases {
                let mut c = vec![f32::NAN; m * n];
                let bm = Mat { base: b.as_ptr(), rows: Rows::Stride(n as isize), col: 1 };
                let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
                // SAFETY: every element addressed lies in its allocation.
                unsafe { sgemm(isa, m, n, k, am, bm, out, false, true) };
                assert_eq!(bits(&c), bits(want), "{isa:?} {what} {m}x{n}x{k}");
            }
        }
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn b_read_in_place_is_not_read_past_its_last_entry() {
    // B's rows at a stride with entries at stride 1, read in place as whole panels (A read in
    // place too): ending where an unreadable page starts, its rows flipped (the first row last in
    // memory), and a window of a wider matrix; a last panel of fewer columns is packed. A read
    // past B's guarded end faults and fails the test; every case's bits are the documented
    // association's (the window's, against its padding columns, checks the bits alone).
    let mut g = Gen(31);
    for &(m, n, k) in &[(5, 64, 33), (13, 100, 7), (12, 256, 600), (1, 32, 2), (30, 17, 40)] {
        let a = g.fill(m * k);
        let b = g.fill(k * n);
        let flipped: Vec<f32> = (0..k).rev().flat_map(|p| b[p * n..(p + 1) * n].to_vec()).collect();
        let wide: Vec<f32> =
            (0..k).flat_map(|p| [vec![9.0; 3], b[p * n..(p + 1) * n].to_vec(), vec![7.0; 2]].concat()).collect();
        let (gb, gf) = (Guarded::new(&b), Guarded::new(&flipped));
        let mut want = vec![0f32; m * n];
        documented(m, n, k, &a, &b, &mut want, false);
        for isa in isas() {
            // SAFETY: the flipped matrix's row k - 1 is B's row 0; the window's columns start at 3
            let cases = unsafe {
                [
                    ("rows", Mat { base: gb.ptr(), rows: Rows::Stride(n as isize), col: 1 }),
                    ("flipped", Mat { base: gf.ptr().add((k - 1) * n), rows: Rows::Stride(-(n as isize)), col: 1 }),
                    ("window", Mat { base: wide.as_ptr().add(3), rows: Rows::Stride(n as isize + 5), col: 1 }),
                ]
            };
            for (what, bm) in cases {
                let am = Mat { base: a.as_ptr(), rows: Rows::Stride(k as isize), col: 1 };
                let kit = F32 { isa, a: am, b: bm };
                // SAFETY: entry (0, 0) is live.
                let own = kit.a_in_place(n) && unsafe { kit.b_at(0, 0) }.is_some();
                assert_eq!(own, isa != Isa::Plain, "{isa:?} {what}: B read in place");
                for parallel in [false, true] {
                    let mut c = vec![f32::NAN; m * n];
                    let out = Out { base: c.as_mut_ptr(), rows: Rows::Stride(n as isize) };
                    // SAFETY: every element addressed lies in its allocation.
                    unsafe { sgemm(isa, m, n, k, am, bm, out, false, parallel) };
                    assert_eq!(bits(&c), bits(&want), "{isa:?} {what} {m}x{n}x{k} parallel {parallel}");
                }
            }
        }
    }
}

/// `split` keeps its bounds on every cut: runs within the rows and columns, a share within `fit`,
/// the cut of a large product (or of any on one thread) its blocks of `mc_panels` rows by shares
/// of `fit`, and a small product on several threads at least as many tasks as threads where it
/// has the tiles for them, and not many more than its shares need.
#[test]
fn split_keeps_its_bounds() {
    for threads in 1..=9 {
        for rows in 1..=70 {
            for panels in 1..=40 {
                for fit in 1..=6 {
                    let (blocks, shares) = split(rows, panels, threads, MC_PANELS, fit);
                    let what = format!("{rows} row panels, {panels} column panels, {threads} threads, fit {fit}");
                    assert!(
                        (1..=rows).contains(&blocks) && (1..=panels).contains(&shares),
                        "{what}: {blocks} × {shares}"
                    );
                    let (per_block, per_share) = (rows.div_ceil(blocks), panels.div_ceil(shares));
                    assert!(per_share <= fit, "{what}: {per_share} column panels a task");
                    let (b0, s0) = (rows.div_ceil(MC_PANELS), panels.div_ceil(fit));
                    let tasks = rows.div_ceil(per_block) * panels.div_ceil(per_share);
                    if threads == 1 || b0 * s0 >= 8 * threads {
                        assert_eq!((blocks, shares), (b0, s0), "{what}");
                    } else {
                        assert!(tasks >= threads.min(rows * panels), "{what}: {tasks} tasks");
                        assert!(tasks <= 2 * (2 * threads).max(s0 * threads).max(b0 * s0), "{what}: {tasks} tasks");
                    }
                }
            }
        }
    }
    // the measured cases: two threads, 512 rows (43 panels of 12) by 128 columns (4 of 32) in
    // four runs of the rows; 128 rows (11 panels) by 128 columns in four shares of the columns
    assert_eq!(split(43, 4, 2, MC_PANELS, 16), (4, 1));
    assert_eq!(split(11, 4, 2, MC_PANELS, 4), (1, 4));
}
