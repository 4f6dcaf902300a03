//! bf16 matrix products with f32 accumulation, in [`super::sgemm`]'s loop nest: AMX tiles where
//! the library's level has them ([`Simd::Amx`]), `vdpbf16ps` tiles where it has AVX-512 BF16, else
//! the f32 tiles over operands widened as they are packed.
//!
//! Association: as the f32 product's (blocks of 512 along the contracting axis, each block from +0,
//! its sum added to the output), with a block's indices taken in pairs `(2q, 2q + 1)`, the odd one
//! added first: `s = (s + a₂q₊₁·b₂q₊₁) + a₂q·b₂q`, each product exact in f32 and each sum rounded to
//! nearest even. That is what `vdpbf16ps` computes (Intel's definition; measured bit for bit on an
//! AMD EPYC with AVX-512 BF16), and the widened kit packs each pair odd index first so that the
//! f32 fused multiply-adds give the same bits. One difference remains: `vdpbf16ps` treats subnormal
//! inputs as zero and flushes subnormal sums to zero, the widened kit keeps them; outputs whose
//! terms or partial sums come within 2⁻¹²⁶ of zero may differ between CPUs with and without AVX-512
//! BF16.
//!
//! The AMX kit adds in an order of its own, which its instruction fixes (`amx`'s docs state it): a
//! library at [`Simd::Amx`] gives bits of its own for bf16 products, each within the bound of f32
//! accumulation; every other level gives the bits above. Its tiles hold each output's sum over a
//! whole block of up to 4096 contracting indices, so it also writes a bf16 destination itself
//! ([`bgemm_into_bf16`]), each sum rounded once, where the other kits accumulate in f32 first.

use std::marker::PhantomData;

use half::bf16;

use super::sgemm::{drive, first12, Dst, Isa, Kit, Mat, Out};
use crate::Simd;

/// The instruction set a bf16 product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bf16Isa {
    /// AMX tiles, 32 × 32 a call (`tdpbf16ps`).
    Tiles,
    /// `vdpbf16ps` tiles of 12 × 32.
    Dot,
    /// The f32 tiles of this instruction set over widened operands.
    Wide(Isa),
}

impl Bf16Isa {
    /// The best a library at `simd` runs.
    pub(crate) fn of(simd: Simd) -> Bf16Isa {
        if simd.amx() {
            Bf16Isa::Tiles
        } else if simd.avx512bf16() {
            Bf16Isa::Dot
        } else {
            Bf16Isa::Wide(Isa::of(simd))
        }
    }

    /// Whether this CPU runs it.
    #[cfg(test)]
    pub(crate) fn available(self) -> bool {
        match self {
            Bf16Isa::Tiles => Simd::Amx.available(),
            Bf16Isa::Dot => Simd::Avx512Bf16.available(),
            Bf16Isa::Wide(isa) => isa.available(),
        }
    }
}

/// `C (+)= A · B` for bf16 `A` (`m × k`) and `B` (`k × n`) into f32 `C`, as
/// [`super::sgemm::sgemm`] says, by `isa`.
///
/// # Safety
/// As [`super::sgemm::sgemm`], for bf16 operands; the CPU runs `isa`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn bgemm(
    isa: Bf16Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<bf16>,
    b: Mat<bf16>,
    c: Out,
    add: bool,
    parallel: bool,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match isa {
            Bf16Isa::Tiles => drive(&amx::Tiles { a, b, out: PhantomData }, m, n, k, c, add, parallel),
            Bf16Isa::Dot => drive(&Dot { a, b }, m, n, k, c, add, parallel),
            Bf16Isa::Wide(isa) => drive(&Wide { isa, a, b }, m, n, k, c, add, parallel),
        }
    }
}

/// Whether a product of `k` contracting indices by `isa` writes a bf16 output itself
/// ([`bgemm_into_bf16`]): the AMX tiles hold each output's sum over the whole axis up to a block's
/// depth.
pub(crate) fn writes_bf16(isa: Bf16Isa, k: usize) -> bool {
    isa == Bf16Isa::Tiles && k <= amx::KC_AMX
}

/// `C (+)= A · B` for bf16 `A`, `B` and `C`: each output's f32 sum (from `C`'s element widened,
/// adding, else +0) as [`bgemm`] by the AMX kit adds it, rounded once to bf16 (nearest, ties to
/// even, every NaN the quiet one), over the current rayon pool where `parallel`.
///
/// # Safety
/// As [`super::sgemm::sgemm`], for bf16 operands and destination; [`writes_bf16`] holds for
/// (`Bf16Isa::Tiles`, `k`) and the CPU runs AMX-BF16 with the tile state granted.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn bgemm_into_bf16(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<bf16>,
    b: Mat<bf16>,
    c: Out<bf16>,
    add: bool,
    parallel: bool,
) {
    assert!(writes_bf16(Bf16Isa::Tiles, k), "bgemm_into_bf16: k = {k} past the AMX kit's block");
    // SAFETY: the caller's contract.
    unsafe { drive(&amx::Tiles { a, b, out: PhantomData }, m, n, k, c, add, parallel) }
}

/// Where contracting index `p` of a block of `kc` goes in the widened kit's packing: each pair
/// `(2q, 2q + 1)` odd index first; a last index without a partner stays.
fn slot(p: usize, kc: usize) -> usize {
    if p ^ 1 < kc {
        p ^ 1
    } else {
        p
    }
}

/// The widened kit: operands widened to f32 as they are packed, each pair odd index first.
struct Wide<'a> {
    isa: Isa,
    a: Mat<'a, bf16>,
    b: Mat<'a, bf16>,
}

impl Kit for Wide<'_> {
    type P = f32;
    type O = f32;

    fn tile(&self) -> (usize, usize) {
        self.isa.tile()
    }

    unsafe fn pack_a(&self, i0: usize, mv: usize, p0: usize, kc: usize, panel: &mut [f32]) {
        let mr = self.isa.tile().0;
        for r in 0..mr {
            for p in 0..kc {
                // SAFETY: the caller's contract.
                panel[slot(p, kc) * mr + r] = if r < mv { unsafe { self.a.get(i0 + r, p0 + p) }.to_f32() } else { 0.0 };
            }
        }
    }

    unsafe fn pack_b(&self, p0: usize, kc: usize, j0: usize, nv: usize, panel: &mut [f32]) {
        let nr = self.isa.tile().1;
        for p in 0..kc {
            let dst = &mut panel[slot(p, kc) * nr..(slot(p, kc) + 1) * nr];
            for (j, d) in dst.iter_mut().enumerate() {
                // SAFETY: the caller's contract.
                *d = if j < nv { unsafe { self.b.get(p0 + p, j0 + j) }.to_f32() } else { 0.0 };
            }
        }
    }

    unsafe fn run(&self, depth: usize, a: &[f32], b: &[f32], dst: &Dst, mv: usize, nv: usize, add: bool) {
        // SAFETY: the caller's contract.
        unsafe { super::sgemm::tile(self.isa, depth, a, b, first12(dst), mv, nv, add) }
    }
}

/// The `vdpbf16ps` kit: entries are pairs of bf16 (the even index in the low half).
struct Dot<'a> {
    a: Mat<'a, bf16>,
    b: Mat<'a, bf16>,
}

/// The pair `(lo, hi)` as one entry.
fn pair(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
}

impl Kit for Dot<'_> {
    type P = u32;
    type O = f32;

    fn tile(&self) -> (usize, usize) {
        (12, 32)
    }

    fn depth(&self, kc: usize) -> usize {
        kc.div_ceil(2)
    }

    unsafe fn pack_a(&self, i0: usize, mv: usize, p0: usize, kc: usize, panel: &mut [u32]) {
        let zero = bf16::from_bits(0);
        if self.a.col == 1 {
            // a row's pairs are its consecutive 4-byte words
            for r in 0..12 {
                if r >= mv {
                    (0..kc.div_ceil(2)).for_each(|q| panel[q * 12 + r] = 0);
                    continue;
                }
                // SAFETY: the caller's contract: kc contiguous elements from (i0 + r, p0).
                let row =
                    unsafe { std::slice::from_raw_parts(self.a.base.offset(self.a.rows.at(i0 + r) + p0 as isize), kc) };
                let (whole, rest) = row.split_at(kc & !1);
                for (q, w) in whole.chunks_exact(2).enumerate() {
                    panel[q * 12 + r] = pair(w[0], w[1]);
                }
                if let [last] = rest {
                    panel[(kc / 2) * 12 + r] = pair(*last, zero);
                }
            }
            return;
        }
        for r in 0..12 {
            for q in 0..kc.div_ceil(2) {
                let get = |p: usize| {
                    if r < mv && p < kc {
                        // SAFETY: the caller's contract.
                        unsafe { self.a.get(i0 + r, p0 + p) }
                    } else {
                        zero
                    }
                };
                panel[q * 12 + r] = pair(get(2 * q), get(2 * q + 1));
            }
        }
    }

    unsafe fn pack_b(&self, p0: usize, kc: usize, j0: usize, nv: usize, panel: &mut [u32]) {
        let zero = bf16::from_bits(0);
        if self.b.col == 1 {
            // two rows' runs of nv elements interleaved
            let run = |p: usize| {
                // SAFETY: the caller's contract: nv contiguous elements from (p0 + p, j0).
                unsafe { std::slice::from_raw_parts(self.b.base.offset(self.b.rows.at(p0 + p) + j0 as isize), nv) }
            };
            for q in 0..kc.div_ceil(2) {
                let dst = &mut panel[q * 32..(q + 1) * 32];
                let lo = run(2 * q);
                if 2 * q + 1 < kc {
                    let hi = run(2 * q + 1);
                    for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                        *d = pair(l, h);
                    }
                } else {
                    for (d, &l) in dst.iter_mut().zip(lo) {
                        *d = pair(l, zero);
                    }
                }
                dst[nv..].fill(0);
            }
            return;
        }
        for q in 0..kc.div_ceil(2) {
            for j in 0..32 {
                let get = |p: usize| {
                    if j < nv && p < kc {
                        // SAFETY: the caller's contract.
                        unsafe { self.b.get(p0 + p, j0 + j) }
                    } else {
                        zero
                    }
                };
                panel[q * 32 + j] = pair(get(2 * q), get(2 * q + 1));
            }
        }
    }

    unsafe fn run(&self, depth: usize, a: &[u32], b: &[u32], dst: &Dst, mv: usize, nv: usize, add: bool) {
        debug_assert!(a.len() >= depth * 12 && b.len() >= depth * 32);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract: the CPU has AVX-512 BF16.
        unsafe {
            x86::tile_dot(depth, a.as_ptr(), b.as_ptr(), first12(dst), mv, nv, add)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Bf16Isa::Dot is x86-64 only ({depth}, {mv}, {nv}, {add}, {})", a.len() + b.len())
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::host::sgemm::x86::{prefetch, store};

    /// The `vdpbf16ps` tile: 12 rows × 32 columns in 24 registers, a pair of contracting indices
    /// an instruction.
    ///
    /// # Safety
    /// `a` holds `depth · 12` and `b` `depth · 32` entries; `dst[..mv]` point at `nv` writable
    /// elements each; the CPU has AVX-512F and AVX-512 BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile_dot(
        depth: usize,
        a: *const u32,
        b: *const u32,
        dst: &[*mut f32; 12],
        mv: usize,
        nv: usize,
        add: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; 12];
        // SAFETY: the caller's contract.
        unsafe {
            if add {
                prefetch(dst, mv);
            }
            for q in 0..depth {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * 32).cast()));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * 32 + 16).cast()));
                let aq = a.add(q * 12);
                for (r, s) in acc.iter_mut().enumerate() {
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*aq.add(r) as i32));
                    s[0] = _mm512_dpbf16_ps(s[0], x, b0);
                    s[1] = _mm512_dpbf16_ps(s[1], x, b1);
                }
            }
            store(&acc, dst, mv, nv, add);
        }
    }
}

#[path = "bgemm_amx.rs"]
mod amx;

#[cfg(test)]
#[path = "bgemm_tests.rs"]
mod tests;
