//! nx's own `f32` matrix product: `C (+)= A · B` in BLIS's loop nest, with rows of `A` and `C`
//! read and written where they lie (a stride or a list of row starts), so a grouped product
//! addresses each group's rows in place instead of gathering them into a block.
//!
//! The contracting axis is cut into blocks of [`KC`]; within a block each output's products are
//! added in index order by fused multiply-adds into an accumulator from +0, and the block's sum is
//! added to the output (or, in the first block of an overwriting product, stored). So an output's
//! bits depend on `k` alone — not on `m`, `n`, where its row or column lies, the thread count or
//! the instruction set: the AVX-512 tiles (12 × 32), the AVX2 ones (6 × 16) and the plain ones
//! (scalar `mul_add`, 6 × 16) give the same bits, picked by the library's SIMD level.
//!
//! Loop nest: for each [`NC`] columns and each block of the contracting axis, `B`'s block is
//! packed into panels of the tile's width (zero-padded) over the pool. `A` is read in one of two
//! ways. In a product of at most [`IN_PLACE_COLUMNS`] columns (shapes here are m × k × n), where
//! too few column panels share a packed panel to pay for it, the vector tiles read `A` where it
//! lies: each row's entries at stride 1 (`col == 1`) through a pointer a row, or a transposed `A`
//! (its rows side by side, `Rows::Stride(1)`) through one pointer a contracting index; and there
//! `B`'s whole column panels are read where they lie too where its rows' entries lie at stride 1
//! ([`Kit::b_at`]: no packing pass; a last panel of fewer columns is packed). Otherwise
//! each [`MCHUNK`] rows of `A` are packed into panels of the tile's height over the pool (fewer
//! columns or rows at a time where a deep block's panels would pass [`KEPT_BYTES`]). Tasks of up
//! to [`MC_PANELS`] row panels and a share of the column panels (at most [`Kit::b_share`] bytes
//! of them, [`B_SHARE_BYTES`] but for the AMX kit's; a product of fewer tasks than 8 a thread is
//! cut as [`split`] says) run the tile kernel over every pair, an `A` panel (12 × 512: 24 KiB,
//! the first level of cache) against each of the task's `B` panels in turn (from the second,
//! which must hold them all: on the Intel VM, shares of 2 MiB, its whole second level, had them
//! come from the third, and 2048³ ran at 218 GFLOP/s against 295 with shares of 256 KiB, 512 KiB
//! or 1 MiB). The tile kernels reach 106 GFLOP/s a core on an AMD EPYC with AVX-512 (data in the
//! first level: the AVX2 tiles reach as much), 110–170 on the Intel Xeon of 2026-12-07 (its speed
//! drifts); see the README's benchmarks for whole products.

use crate::Simd;
use rayon::prelude::*;

/// The contracting axis's block: an output's bits depend on `k` through it.
pub(crate) const KC: usize = 512;
/// Columns packed at a time.
const NC: usize = 4096;
/// Rows packed at a time.
const MCHUNK: usize = 4096;
/// Row panels in a task's block of `A`.
const MC_PANELS: usize = 16;
/// The fewest row panels a task of a small product runs where the rows are cut (see `split`).
const MIN_RUN: usize = 8;
/// The most bytes of packed `B` panels one task runs its row panels against: half of the smallest
/// second-level cache of the x86 cores nx meets (512 KiB, AMD Zen 2 and 3), so they stay there
/// while the task's `A` panels pass over them.
const B_SHARE_BYTES: usize = 1 << 18;

/// The tile kernels, by instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F: tiles of 12 rows × 32 columns.
    Avx512,
    /// AVX2 with FMA: tiles of 6 × 16.
    Avx2,
    /// Scalar fused multiply-adds: tiles of 6 × 16.
    Plain,
}

impl Isa {
    /// The best kernel a library at `simd` runs.
    pub(crate) fn of(simd: Simd) -> Isa {
        if simd.avx512() {
            Isa::Avx512
        } else if simd.avx2() {
            Isa::Avx2
        } else {
            Isa::Plain
        }
    }

    /// The lowest level that runs the kernel.
    #[cfg(test)]
    pub(crate) fn level(self) -> Simd {
        match self {
            Isa::Avx512 => Simd::Avx512,
            Isa::Avx2 => Simd::Avx2,
            Isa::Plain => Simd::Baseline,
        }
    }

    /// Whether this CPU runs the kernel.
    #[cfg(test)]
    pub(crate) fn available(self) -> bool {
        self.level().available()
    }

    /// The tile: (rows, columns).
    pub(crate) fn tile(self) -> (usize, usize) {
        match self {
            Isa::Avx512 => (12, 32),
            Isa::Avx2 | Isa::Plain => (6, 16),
        }
    }
}

/// Where a matrix's rows start, in elements from its base.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// Row `i` at `i · stride`.
    Stride(isize),
    /// Row `i` at `starts[i]`.
    At(&'a [isize]),
}

impl Rows<'_> {
    pub(crate) fn at(&self, i: usize) -> isize {
        match self {
            Rows::Stride(s) => i as isize * s,
            Rows::At(v) => v[i],
        }
    }
}

/// A matrix read by the product: element `(i, j)` at `base + rows.at(i) + j · col`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T = f32> {
    pub(crate) base: *const T,
    pub(crate) rows: Rows<'a>,
    pub(crate) col: isize,
}

impl<T: Copy> Mat<'_, T> {
    /// Element `(i, j)`.
    ///
    /// # Safety
    /// It is live.
    pub(crate) unsafe fn get(&self, i: usize, j: usize) -> T {
        // SAFETY: the caller's contract.
        unsafe { *self.base.offset(self.rows.at(i) + j as isize * self.col) }
    }
}

/// The destination: element `(i, j)` at `base + rows.at(i) + j`.
#[derive(Clone, Copy)]
pub(crate) struct Out<'a, T = f32> {
    pub(crate) base: *mut T,
    pub(crate) rows: Rows<'a>,
}

impl<T> Out<'_, T> {
    /// Where element `(i, j)` lies.
    ///
    /// # Safety
    /// It lies in the destination's allocation.
    unsafe fn at(&self, i: usize, j: usize) -> *mut T {
        // SAFETY: the caller's contract.
        unsafe { self.base.offset(self.rows.at(i) + j as isize) }
    }
}

// SAFETY: the matrices are only read by the tasks of one call, whose caller holds the memory for
// its whole run.
unsafe impl<T> Send for Mat<'_, T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Mat<'_, T> {}
// SAFETY: the tasks of one call write the destination at disjoint elements; its caller holds the
// memory for the whole run.
unsafe impl<T> Send for Out<'_, T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Out<'_, T> {}

/// A buffer of packed entries whose first lies on a 64-byte line, taken from the calling
/// thread's [`SCRATCH`] and given back when dropped. Its entries hold whatever an earlier product
/// packed: every packer writes every entry of its panel, padding included, before the tiles read it.
struct Aligned<P: 'static> {
    v: Vec<P>,
    start: usize,
}

thread_local! {
    /// Packing buffers a product gave back, for the next product on this thread: an allocator's
    /// cache (no setting, nothing a result depends on), so that a training step's small
    /// products neither zero nor fault in fresh pages for every call. At most [`KEPT`] buffers
    /// of at most [`KEPT_BYTES`] each are kept.
    static SCRATCH: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers [`SCRATCH`] keeps a thread.
const KEPT: usize = 4;
/// The largest buffer [`SCRATCH`] keeps.
const KEPT_BYTES: usize = 16 << 20;

impl<P: Copy + Default + 'static> Aligned<P> {
    fn new(len: usize) -> Aligned<P> {
        let want = len + 16;
        let kept = SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let at = s.iter().position(|b| b.downcast_ref::<Vec<P>>().is_some_and(|v| v.len() >= want))?;
            s.swap_remove(at).downcast::<Vec<P>>().ok()
        });
        let v = match kept {
            Some(v) => *v,
            None => vec![P::default(); want],
        };
        let start = v.as_ptr().align_offset(64).min(16);
        Aligned { v, start }
    }

    fn slice(&mut self, len: usize) -> &mut [P] {
        &mut self.v[self.start..self.start + len]
    }
}

impl<P: 'static> Drop for Aligned<P> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.len() * std::mem::size_of::<P>() > KEPT_BYTES {
            return;
        }
        // a thread being torn down has no cache left: the buffer is freed
        let _ = SCRATCH.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEPT {
                s.push(Box::new(v));
            }
        });
    }
}

/// The most rows a tile has.
pub(crate) const MR_MAX: usize = 32;

/// A tile's destination rows: the first `mv` point at its rows in `C`.
pub(crate) type Dst<T = f32> = [*mut T; MR_MAX];

/// The first 12 of a tile's destination rows, for the 12-row tiles.
pub(crate) fn first12(dst: &Dst) -> &[*mut f32; 12] {
    dst[..12].try_into().expect("12 of MR_MAX rows")
}

/// What the loop nest runs: how operands are packed into panels and the tile kernel over them.
pub(crate) trait Kit: Sync {
    /// A packed entry.
    type P: Copy + Default + Send + Sync + 'static;
    /// An element of the destination.
    type O;
    /// The tile: (rows, columns), at most [`MR_MAX`] rows.
    fn tile(&self) -> (usize, usize);
    /// The block of the contracting axis a panel holds.
    fn kc(&self) -> usize {
        KC
    }
    /// The most bytes of packed `B` panels a task runs its row panels against.
    fn b_share(&self) -> usize {
        B_SHARE_BYTES
    }
    /// Packed entries along the contracting axis for `kc` of its indices.
    fn depth(&self, kc: usize) -> usize {
        kc
    }
    /// Packs rows `i0..i0 + mv`, contracting indices `p0..p0 + kc` of `A` into `panel` (`depth`
    /// groups of the tile's rows, the rows past `mv` zero).
    ///
    /// # Safety
    /// Those elements of `A` are live.
    unsafe fn pack_a(&self, i0: usize, mv: usize, p0: usize, kc: usize, panel: &mut [Self::P]);
    /// Packs contracting indices `p0..p0 + kc`, columns `j0..j0 + nv` of `B` into `panel`
    /// (`depth` groups of the tile's columns, the columns past `nv` zero).
    ///
    /// # Safety
    /// Those elements of `B` are live.
    unsafe fn pack_b(&self, p0: usize, kc: usize, j0: usize, nv: usize, panel: &mut [Self::P]);
    /// The tile of two panels of `depth` groups, added to (`add`) or stored into the first `mv`
    /// rows' first `nv` columns at `dst`.
    ///
    /// # Safety
    /// The panels hold `depth` groups; `dst[..mv]` point at `nv` writable elements each; the CPU
    /// runs the kit's kernel.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &self,
        depth: usize,
        a: &[Self::P],
        b: &[Self::P],
        dst: &Dst<Self::O>,
        mv: usize,
        nv: usize,
        add: bool,
    );
    /// Whether [`Kit::run_in_place`] reads `A` where it lies in a product of `n` columns, so that
    /// no `A` panels are packed.
    fn a_in_place(&self, n: usize) -> bool {
        let _ = n;
        false
    }
    /// The tile of `A`'s rows `i..i + mv` from contracting index `p0`, read where they lie, and a
    /// `B` panel of `kc` rows (packed, or `B`'s own: [`Kit::b_at`]), added to (`add`) or stored
    /// into the first `mv` rows' first `nv` columns at `dst`.
    ///
    /// # Safety
    /// As [`Kit::run`]; [`Kit::a_in_place`] holds, those `kc` entries of `A`'s rows are live and
    /// `b` addresses `kc` live rows of the tile's columns.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_in_place(
        &self,
        kc: usize,
        i: usize,
        mv: usize,
        p0: usize,
        b: Panel<Self::P>,
        dst: &Dst<Self::O>,
        nv: usize,
        add: bool,
    ) {
        let _ = (kc, i, mv, p0, b, dst, nv, add);
        unreachable!("run_in_place of a kit that packs A");
    }
    /// Where the tiles that read `A` in place read `B` in place too: its entry at contracting
    /// index `p`, column `j`, as the start of a panel whose rows lie `ld` apart (a whole panel of
    /// the tile's columns read from there, no packing); `None` where `B`'s panels are packed.
    ///
    /// # Safety
    /// That entry is live.
    unsafe fn b_at(&self, p: usize, j: usize) -> Option<Panel<Self::P>> {
        let _ = (p, j);
        None
    }
}

/// A `B` panel a tile reads: row `p` (the tile's columns) at `ptr + p · ld`.
#[derive(Clone, Copy)]
pub(crate) struct Panel<P> {
    pub(crate) ptr: *const P,
    pub(crate) ld: isize,
}

/// The most columns of a product whose `f32` tiles read `A`'s rows in place.
const IN_PLACE_COLUMNS: usize = 256;

/// The `f32` kit: plain operands, `isa`'s tiles.
struct F32<'a> {
    isa: Isa,
    a: Mat<'a>,
    b: Mat<'a>,
}

impl Kit for F32<'_> {
    type P = f32;
    type O = f32;

    fn tile(&self) -> (usize, usize) {
        self.isa.tile()
    }

    unsafe fn pack_a(&self, i0: usize, mv: usize, p0: usize, kc: usize, panel: &mut [f32]) {
        // SAFETY: the caller's contract.
        unsafe { pack_a(self.a, i0, mv, p0, kc, self.isa.tile().0, panel) }
    }

    unsafe fn pack_b(&self, p0: usize, kc: usize, j0: usize, nv: usize, panel: &mut [f32]) {
        // SAFETY: the caller's contract.
        unsafe { pack_b(self.b, p0, kc, j0, nv, self.isa.tile().1, panel) }
    }

    unsafe fn run(&self, depth: usize, a: &[f32], b: &[f32], dst: &Dst, mv: usize, nv: usize, add: bool) {
        // SAFETY: the caller's contract.
        unsafe { tile(self.isa, depth, a, b, first12(dst), mv, nv, add) }
    }

    fn a_in_place(&self, n: usize) -> bool {
        // the vector tiles broadcast each entry from where it lies, so a row's entries at
        // stride 1 (or a transposed `A`, rows side by side) need no panel; a panel is packed once
        // and read by every column panel, so it pays where there are many (on the Xeon of
        // 2026-12-07, m × k × n: reading in place ran 512×512×128 10–24% and 512×128×128 10%
        // faster, 512×128×512 alike, 2048³ 7–13% slower)
        let across = matches!(self.a.rows, Rows::Stride(1));
        cfg!(target_arch = "x86_64") && (self.a.col == 1 || across) && self.isa != Isa::Plain && n <= IN_PLACE_COLUMNS
    }

    unsafe fn b_at(&self, p: usize, j: usize) -> Option<Panel<f32>> {
        // `B`'s rows at a stride, their entries at stride 1: a panel's rows are 32 (or 16) of
        // them side by side, read by the tile's row loads as a packed panel's are (same FMAs,
        // same bits); only whole panels, so no load passes a row's end
        match self.b.rows {
            Rows::Stride(ld) if self.b.col == 1 && self.isa != Isa::Plain => {
                // SAFETY: the caller's contract: the entry is live.
                let ptr = unsafe { self.b.base.offset(p as isize * ld + j as isize) };
                Some(Panel { ptr, ld })
            }
            _ => None,
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn run_in_place(
        &self,
        kc: usize,
        i: usize,
        mv: usize,
        p0: usize,
        b: Panel<f32>,
        dst: &Dst,
        nv: usize,
        add: bool,
    ) {
        debug_assert!(self.a_in_place(0) && (1..=self.isa.tile().0).contains(&mv) && kc > 0);
        let dst12 = first12(dst);
        if self.a.col != 1 {
            // a transposed `A`: the tile's rows side by side at each contracting index; rows past
            // mv are read but not stored, and the whole tile's rows lie in `A` only where mv is
            // the tile's, so a short tile reads row i's entries again
            let at = self.a.rows.at(i) + p0 as isize * self.a.col;
            // SAFETY: the caller's contract: those entries are live.
            let base = unsafe { self.a.base.offset(at) };
            let full = mv == self.isa.tile().0;
            // SAFETY: the caller's contract; the kit's tile runs where `Isa::of` found its features.
            unsafe {
                return match (self.isa, full) {
                    (Isa::Avx512, true) => x86::tile512(kc, x86::Across(base, self.a.col), b, dst12, mv, nv, add),
                    (_, true) => x86::tile256(kc, x86::Across(base, self.a.col), b, dst12, mv, nv, add),
                    (Isa::Avx512, false) => x86::tile512(kc, x86::Short(base, self.a.col, mv), b, dst12, mv, nv, add),
                    (_, false) => x86::tile256(kc, x86::Short(base, self.a.col, mv), b, dst12, mv, nv, add),
                };
            }
        }
        let mut rows = [std::ptr::null::<f32>(); 12];
        for (r, row) in rows.iter_mut().enumerate() {
            // rows past mv read row i again: their sums are not stored
            let at = self.a.rows.at(i + if r < mv { r } else { 0 }) + p0 as isize;
            // SAFETY: the caller's contract: kc entries of the row from p0 are live.
            *row = unsafe { self.a.base.offset(at) };
        }
        // SAFETY: the caller's contract; the kit's tile runs where `Isa::of` found its features.
        unsafe {
            match self.isa {
                Isa::Avx512 => x86::tile512(kc, x86::InPlace(&rows), b, dst12, mv, nv, add),
                _ => {
                    let six: &[*const f32; 6] = rows[..6].try_into().expect("6 of 12 rows");
                    x86::tile256(kc, x86::InPlace(six), b, dst12, mv, nv, add)
                }
            }
        }
    }
}

/// `C (+)= A · B` for `A` of `m × k`, `B` of `k × n` (`add`: onto what `C` holds; else `C` is
/// overwritten, +0 where `k` is 0), with `isa`'s tiles, over the current rayon pool where
/// `parallel`.
///
/// # Safety
/// `a`, `b` address live `f32`s over their extents; `c` addresses `m` rows of `n` writable `f32`s,
/// no two rows sharing an element, that nothing else reads or writes meanwhile, disjoint from
/// `a`'s and `b`'s; the CPU runs `isa` ([`Isa::of`] a level the CPU has).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(isa: Isa, m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Out, add: bool, parallel: bool) {
    // SAFETY: the caller's contract.
    unsafe { drive(&F32 { isa, a, b }, m, n, k, c, add, parallel) }
}

/// `C (+)= A · B` as [`sgemm`] says, with `kit`'s packing and tiles.
///
/// # Safety
/// As [`sgemm`], for the kit's operands and kernel.
pub(crate) unsafe fn drive<K: Kit>(kit: &K, m: usize, n: usize, k: usize, c: Out<K::O>, add: bool, parallel: bool) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !add {
            for i in 0..m {
                // SAFETY: the caller's contract: row i holds n elements.
                unsafe { std::ptr::write_bytes(c.base.offset(c.rows.at(i)), 0, n) };
            }
        }
        return;
    }
    let (mr, nr) = kit.tile();
    let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
    let block = kit.kc();
    let deep = kit.depth(block.min(k));
    // columns and rows packed at a time: at most what a buffer the thread keeps holds, so that
    // deep blocks (the AMX kit's) do not fault in fresh packing buffers every product
    let fits = |r: usize| (KEPT_BYTES - 64) / (deep * r * size_of::<K::P>()).max(1) * r;
    let (nc_max, m_chunk) = (NC.min(fits(nr)).max(nr), MCHUNK.min(fits(mr)).max(mr));
    // A read in place (the f32 tiles: entries at stride 1, or a transposed A) needs no panels
    let in_place = kit.a_in_place(n);
    // and there, B's whole column panels too where its rows' entries lie at stride 1: only a
    // last panel of fewer columns is packed, the one panel the buffer then holds
    // SAFETY: the caller's contract: B's entry (0, 0) is live (k and n are not 0).
    let b_in_place = in_place && unsafe { kit.b_at(0, 0) }.is_some();
    let b_panels = if b_in_place { 1 } else { nc_max.min(n.div_ceil(nr) * nr) / nr };
    let mut packed_b = Aligned::<K::P>::new(deep * b_panels * nr);
    let mut packed_a = Aligned::<K::P>::new(if in_place { 0 } else { deep * m.min(m_chunk).div_ceil(mr) * mr });
    for jc in (0..n).step_by(nc_max) {
        let nc = nc_max.min(n - jc);
        let panels = nc.div_ceil(nr);
        for pc in (0..k).step_by(block) {
            let kc = block.min(k - pc);
            let deep = kit.depth(kc);
            let bp = packed_b.slice(deep * panels.min(b_panels) * nr);
            let pack = |(q, panel): (usize, &mut [K::P])| {
                // SAFETY: the caller's contract: rows pc.., columns jc + q·nr.. of b.
                unsafe { kit.pack_b(pc, kc, jc + q * nr, nr.min(nc - q * nr), panel) }
            };
            if b_in_place {
                if nc % nr != 0 {
                    pack((panels - 1, bp));
                }
            } else if threads > 1 && panels > 1 {
                bp.par_chunks_mut(deep * nr).enumerate().for_each(pack);
            } else {
                bp.chunks_mut(deep * nr).enumerate().for_each(pack);
            }
            let bp: &[K::P] = bp;
            let onto = add || pc > 0;
            for ic in (0..m).step_by(m_chunk) {
                let mm = m_chunk.min(m - ic);
                let row_panels = mm.div_ceil(mr);
                let ap = packed_a.slice(if in_place { 0 } else { row_panels * mr * deep });
                let pack = |(q, panel): (usize, &mut [K::P])| {
                    // SAFETY: the caller's contract: rows ic + q·mr.., columns pc.. of a.
                    unsafe { kit.pack_a(ic + q * mr, mr.min(mm - q * mr), pc, kc, panel) }
                };
                if !in_place {
                    if threads > 1 && row_panels > 1 {
                        ap.par_chunks_mut(deep * mr).enumerate().for_each(pack);
                    } else {
                        ap.chunks_mut(deep * mr).enumerate().for_each(pack);
                    }
                }
                let ap: &[K::P] = ap;
                // tasks of runs of the row panels by runs of the column panels (`split`)
                let fit = (kit.b_share() / (deep * nr * size_of::<K::P>())).max(1);
                let (blocks, shares) = split(row_panels, panels, threads, MC_PANELS, fit);
                let (per_block, per_share) = (row_panels.div_ceil(blocks), panels.div_ceil(shares));
                let (blocks, shares) = (row_panels.div_ceil(per_block), panels.div_ceil(per_share));
                let task = |t: usize| {
                    let (ib, sh) = (t / shares, t % shares);
                    let (q0, q1) = (ib * per_block, ((ib + 1) * per_block).min(row_panels));
                    let (p0, p1) = (sh * per_share, ((sh + 1) * per_share).min(panels));
                    for q in q0..q1 {
                        let (i, mv) = (ic + q * mr, mr.min(mm - q * mr));
                        let apanel = if in_place { &ap[..0] } else { &ap[q * deep * mr..(q + 1) * deep * mr] };
                        for p in p0..p1 {
                            let (j, nv) = (jc + p * nr, nr.min(nc - p * nr));
                            // (B read in place: the buffer's one panel is the last, packed)
                            let bpanel = if b_in_place { bp } else { &bp[p * deep * nr..(p + 1) * deep * nr] };
                            // SAFETY: the caller's contract: B's entry (pc, j) is live.
                            let b_own = if b_in_place && nv == nr { unsafe { kit.b_at(pc, j) } } else { None };
                            let mut dst: Dst<K::O> = [std::ptr::null_mut(); MR_MAX];
                            for (r, d) in dst.iter_mut().enumerate().take(mv) {
                                // SAFETY: the caller's contract: row i + r, column j lie in c.
                                *d = unsafe { c.at(i + r, j) };
                            }
                            // SAFETY: panels of deep·mr (or A's rows in place) and deep·nr; dst's
                            // first mv rows hold nv elements.
                            unsafe {
                                if in_place {
                                    let packed = Panel { ptr: bpanel.as_ptr(), ld: nr as isize };
                                    kit.run_in_place(kc, i, mv, pc, b_own.unwrap_or(packed), &dst, nv, onto)
                                } else {
                                    kit.run(deep, apanel, bpanel, &dst, mv, nv, onto)
                                }
                            };
                        }
                    }
                };
                if threads > 1 && blocks * shares > 1 {
                    (0..blocks * shares).into_par_iter().for_each(task);
                } else {
                    (0..blocks * shares).for_each(task);
                }
            }
        }
    }
}

/// How a block of `rows` row panels by `panels` column panels is cut into tasks for `threads`:
/// `(blocks, shares)`, the row panels cut into `blocks` runs of `rows.div_ceil(blocks)` and the
/// column panels into `shares` runs of `panels.div_ceil(shares)`, each task one run of each.
///
/// A task runs at most `fit` column panels (its share of `B` stays in the second-level cache).
/// Where tasks of `mc_panels` row panels by such shares number at least 8 a thread, those are the
/// tasks (work stealing evens out the threads). A smaller product is cut into about twice as many
/// tasks as threads, so that a thread that starts late leaves its second task to the others:
/// the rows first, in runs of at least [`MIN_RUN`] row panels (a multiple of the threads where
/// the rows alone are cut), then the column panels shared out for the rest, then the rows cut
/// finer where the columns are too few. Measured on two threads, interleaved in one process:
/// 512 × 128 × 128 runs as four tasks of a quarter of the rows at 1.1–1.2× the twelve tasks of
/// the cut before (three runs of the rows by four shares of the columns), 128 × 512 × 128 as
/// four tasks of a quarter of the columns (cutting its eleven row panels instead runs 0.85× that).
fn split(rows: usize, panels: usize, threads: usize, mc_panels: usize, fit: usize) -> (usize, usize) {
    let (b0, s0) = (rows.div_ceil(mc_panels.max(1)).max(1), panels.div_ceil(fit.max(1)).max(1));
    if threads <= 1 || b0.saturating_mul(s0) >= threads.saturating_mul(8) {
        return (b0, s0);
    }
    let want = 2 * threads;
    // runs of the rows first, as many as make `want` tasks with the shares `fit` needs
    let mut blocks = (rows / MIN_RUN).clamp(1, want.div_ceil(s0)).max(b0);
    let shares = want.div_ceil(blocks).max(s0).min(panels);
    if blocks * shares < want {
        // too few column panels to share: cut the rows finer
        blocks = want.div_ceil(shares).max(blocks).min(rows);
    }
    // an even deal where the rows alone are cut: runs as many as a multiple of the threads
    while shares == 1 && blocks % threads != 0 && blocks < rows {
        blocks += 1;
    }
    (blocks, shares)
}

/// Packs rows `p0..p0 + kc`, columns `j0..j0 + nv` of `b` into `panel` (`kc` rows of `nr`, the
/// columns past `nv` zero).
///
/// # Safety
/// Those elements of `b` are live.
unsafe fn pack_b(b: Mat, p0: usize, kc: usize, j0: usize, nv: usize, nr: usize, panel: &mut [f32]) {
    for p in 0..kc {
        let row = b.rows.at(p0 + p) + j0 as isize * b.col;
        let dst = &mut panel[p * nr..(p + 1) * nr];
        if b.col == 1 {
            // SAFETY: the caller's contract: nv contiguous elements.
            dst[..nv].copy_from_slice(unsafe { std::slice::from_raw_parts(b.base.offset(row), nv) });
        } else {
            for (jj, d) in dst[..nv].iter_mut().enumerate() {
                // SAFETY: the caller's contract.
                *d = unsafe { *b.base.offset(row + jj as isize * b.col) };
            }
        }
        dst[nv..].fill(0.0);
    }
}

/// Packs rows `i0..i0 + mv`, columns `p0..p0 + kc` of `a` into `panel` (`kc` columns of `mr`, the
/// rows past `mv` zero).
///
/// # Safety
/// Those elements of `a` are live.
unsafe fn pack_a(a: Mat, i0: usize, mv: usize, p0: usize, kc: usize, mr: usize, panel: &mut [f32]) {
    // the tile's rows side by side, one contraction index at a time: the panel written in order,
    // each row read as a stream (a transposed `A`, rows at stride 1, reads its runs whole)
    let mut rows = [std::ptr::null::<f32>(); 12];
    for (r, row) in rows.iter_mut().enumerate().take(mv) {
        // SAFETY: the caller's contract: row i0 + r from column p0 is live.
        *row = unsafe { a.base.offset(a.rows.at(i0 + r) + p0 as isize * a.col) };
    }
    match (mr, mv) {
        // SAFETY: the caller's contract: mv rows of kc live elements.
        (6, 6) => return unsafe { pack_full::<6>(&rows, a.col, kc, panel) },
        // SAFETY: as above.
        (12, 12) => return unsafe { pack_full::<12>(&rows, a.col, kc, panel) },
        _ => {}
    }
    let rows = &rows[..mv];
    for (p, dst) in panel.chunks_exact_mut(mr).take(kc).enumerate() {
        let off = p as isize * a.col;
        for (d, &row) in dst.iter_mut().zip(rows) {
            // SAFETY: the caller's contract: column p0 + p of each row is live.
            *d = unsafe { *row.offset(off) };
        }
        dst[mv..].fill(0.0);
    }
}

/// [`pack_a`] of a whole panel of `MR` rows: a fixed loop, the panel's groups written whole.
///
/// # Safety
/// As [`pack_a`]: `rows[..MR]` point at rows whose `kc` elements at stride `col` are live.
#[inline(always)]
unsafe fn pack_full<const MR: usize>(rows: &[*const f32; 12], col: isize, kc: usize, panel: &mut [f32]) {
    let rows: &[*const f32; MR] = rows[..MR].try_into().expect("MR rows");
    if (0..MR).all(|r| rows[r] == rows[0].wrapping_add(r)) {
        // a transposed `A`: the panel's rows side by side in memory, one run a group
        for (p, dst) in panel.chunks_exact_mut(MR).take(kc).enumerate() {
            // SAFETY: the caller's contract: MR consecutive live elements at this offset.
            let src = unsafe { &*rows[0].offset(p as isize * col).cast::<[f32; MR]>() };
            dst.copy_from_slice(src);
        }
        return;
    }
    for (p, dst) in panel.chunks_exact_mut(MR).take(kc).enumerate() {
        let dst: &mut [f32; MR] = dst.try_into().expect("a group of MR");
        let off = p as isize * col;
        for r in 0..MR {
            // SAFETY: the caller's contract.
            dst[r] = unsafe { *rows[r].offset(off) };
        }
    }
}

/// One tile: the products of an `A` panel and a `B` panel over `kc`, added to (`add`) or stored
/// into the first `mv` rows' first `nv` columns at `dst`.
///
/// # Safety
/// `a` holds `kc · mr`, `b` `kc · nr` elements of `isa`'s tile; `dst[..mv]` point at `nv` writable
/// elements each.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    isa: Isa,
    kc: usize,
    a: &[f32],
    b: &[f32],
    dst: &[*mut f32; 12],
    mv: usize,
    nv: usize,
    add: bool,
) {
    debug_assert!(a.len() >= kc * isa.tile().0 && b.len() >= kc * isa.tile().1);
    // SAFETY: the caller's contract; each kernel runs only where `Isa::of` found its features (the level's checks test the CPU).
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                x86::tile512(kc, x86::Packed::<12>(a.as_ptr()), Panel { ptr: b.as_ptr(), ld: 32 }, dst, mv, nv, add)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                x86::tile256(kc, x86::Packed::<6>(a.as_ptr()), Panel { ptr: b.as_ptr(), ld: 16 }, dst, mv, nv, add)
            }
            _ => tile_plain(kc, a, b, dst, mv, nv, add),
        }
    }
}

/// The plain 6 × 16 tile: the same additions, in the same order, as the vector ones.
///
/// # Safety
/// As [`tile`].
unsafe fn tile_plain(kc: usize, a: &[f32], b: &[f32], dst: &[*mut f32; 12], mv: usize, nv: usize, add: bool) {
    let mut acc = [[0f32; 16]; 6];
    for p in 0..kc {
        for (r, row) in acc.iter_mut().enumerate() {
            let x = a[p * 6 + r];
            for (j, s) in row.iter_mut().enumerate() {
                *s = x.mul_add(b[p * 16 + j], *s);
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(mv) {
        // SAFETY: the caller's contract: nv elements at dst[r].
        let out = unsafe { std::slice::from_raw_parts_mut(dst[r], nv) };
        for (o, &s) in out.iter_mut().zip(row) {
            *o = if add { *o + s } else { s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "sgemm_x86.rs"]
pub(crate) mod x86;

#[cfg(test)]
#[path = "sgemm_tests.rs"]
mod tests;
