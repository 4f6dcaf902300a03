//! The AMX kit of the bf16 product: `tdpbf16ps` on tiles of 16 rows × 16 pairs, four output
//! tiles (32 × 32) a call of the loop nest.
//!
//! Association (the instruction's order measured bit for bit on an Intel Xeon with AMX-BF16; Intel
//! does not document it): one running sum `s` an output, from what the output holds (adding) or
//! from +0, over groups of 32 consecutive contracting indices from index 0 (indices past `k`
//! count as +0 products), each group adding `s = s + (E + O)`, where `E` sums the group's 16
//! even-indexed products in order, starting from the first, and `O` its 16 odd-indexed ones
//! alike. Products are exact in f32, every sum rounds to nearest even, subnormal inputs (the
//! output added onto among them) count as zero of their sign and subnormal sums flush to zero,
//! as `vdpbf16ps`'s do — to +0 (measured once, on the Xeon of 2026-12-07: a running sum of
//! 2⁻¹²⁶ − 1.5·2⁻¹²⁶ read +0), so a running sum reads −0 only where it starts at a −0 output
//! and every group adds −0. Products and sums past f32's largest finite value are not fixed here
//! (measured: a group whose products overflow f32 gave ∞ where the steps above give NaN). No
//! blocks of the contracting axis show in the bits: a block's tiles start from the output the
//! block before left.
//!
//! The output is f32 or bf16 ([`Target`]). A whole 32 × 32 f32 tile of rows one stride apart is
//! loaded from and stored to the output by the tile instructions; edge tiles, listed rows and bf16
//! outputs pass through a buffer, with the same sums: a bf16 output is widened into it exactly
//! (adding) and each sum rounded from it once, to nearest, ties to even, every NaN the quiet one
//! (`f32_to_bf16`'s bits).

use half::bf16;

use super::{Dot, Dst, Kit, Mat};

/// Pairs a group of contracting indices holds (one tile row of 64 bytes).
const GROUP: usize = 16;

/// The contracting axis's block: the panels of a call (256 KiB each at most). The tiles hold
/// their sums over a whole block, so up to this depth a product's outputs are written once, with
/// no f32 sums stored and read back between blocks, and a bf16 output straight from the tiles.
pub(super) const KC_AMX: usize = 4096;

/// Packed `B` panels a task runs its row panels against: half the second-level cache (2 MiB a
/// core on the Intel Xeons with AMX).
const B_SHARE_AMX: usize = 1 << 20;

/// An output element of the AMX kit.
pub(super) trait Target: Copy + Send + Sync + 'static {
    /// Whether it is bf16 (else f32).
    const BF16: bool;
}

impl Target for f32 {
    const BF16: bool = false;
}

impl Target for bf16 {
    const BF16: bool = true;
}

/// The AMX kit: `A` panels of groups of 32 rows × 16 pairs (row-major, a tile row a row), `B`
/// panels of pairs × 32 columns (the `vdpbf16ps` kit's layout), depth padded to whole groups.
pub(super) struct Tiles<'a, O = f32> {
    pub(super) a: Mat<'a, bf16>,
    pub(super) b: Mat<'a, bf16>,
    pub(super) out: std::marker::PhantomData<O>,
}

impl<O: Target> Kit for Tiles<'_, O> {
    type P = u32;
    type O = O;

    fn tile(&self) -> (usize, usize) {
        (32, 32)
    }

    fn kc(&self) -> usize {
        KC_AMX
    }

    fn b_share(&self) -> usize {
        B_SHARE_AMX
    }

    fn depth(&self, kc: usize) -> usize {
        kc.div_ceil(2 * GROUP) * GROUP
    }

    unsafe fn pack_a(&self, i0: usize, mv: usize, p0: usize, kc: usize, panel: &mut [u32]) {
        let depth = self.depth(kc);
        let pairs = kc.div_ceil(2);
        let zero = bf16::from_bits(0);
        for r in 0..32 {
            // the entry of row r, pair q
            let at = |q: usize| (q / GROUP * 32 + r) * GROUP + q % GROUP;
            if r >= mv {
                (0..depth).for_each(|q| panel[at(q)] = 0);
                continue;
            }
            if self.a.col == 1 {
                // SAFETY: the caller's contract: kc contiguous elements from (i0 + r, p0).
                let row = unsafe { self.a.base.offset(self.a.rows.at(i0 + r) + p0 as isize) };
                for g in 0..depth / GROUP {
                    let (q0, whole) = (g * GROUP, (kc / 2).saturating_sub(g * GROUP).min(GROUP));
                    let dst = &mut panel[at(q0)..at(q0) + GROUP];
                    for (t, d) in dst[..whole].iter_mut().enumerate() {
                        // SAFETY: pair q0 + t lies among the row's kc / 2 whole pairs; the even
                        // index is the low half of a little-endian word.
                        *d = unsafe { row.add(2 * (q0 + t)).cast::<u32>().read_unaligned() };
                    }
                    dst[whole..].fill(0);
                }
                if kc % 2 == 1 {
                    // SAFETY: index kc - 1 lies in the row.
                    panel[at(kc / 2)] = super::pair(unsafe { *row.add(kc - 1) }, zero);
                }
                continue;
            }
            for q in 0..depth {
                let get = |p: usize| {
                    if p < kc {
                        // SAFETY: the caller's contract.
                        unsafe { self.a.get(i0 + r, p0 + p) }
                    } else {
                        zero
                    }
                };
                panel[at(q)] = if q < pairs { super::pair(get(2 * q), get(2 * q + 1)) } else { 0 };
            }
        }
    }

    unsafe fn pack_b(&self, p0: usize, kc: usize, j0: usize, nv: usize, panel: &mut [u32]) {
        let pairs = kc.div_ceil(2);
        let (head, rest) = panel[..self.depth(kc) * 32].split_at_mut(pairs * 32);
        // SAFETY: the caller's contract.
        unsafe { Dot { a: self.a, b: self.b }.pack_b(p0, kc, j0, nv, head) };
        rest.fill(0);
    }

    unsafe fn run(&self, depth: usize, a: &[u32], b: &[u32], dst: &Dst<O>, mv: usize, nv: usize, add: bool) {
        debug_assert!(depth.is_multiple_of(GROUP) && a.len() >= depth * 32 && b.len() >= depth * 32);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract: the CPU runs AMX-BF16 and the process holds the tile
        // state (`Simd::Amx`).
        unsafe {
            x86::tile_amx(depth / GROUP, a.as_ptr(), b.as_ptr(), dst, mv, nv, add)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Bf16Isa::Tiles is x86-64 only ({depth}, {mv}, {nv}, {add}, {})", a.len() + b.len())
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    impl Config {
        fn new() -> Config {
            let mut c = [0u8; 64];
            c[0] = 1;
            for t in 0..8 {
                c[16 + 2 * t] = 64; // bytes a row (little-endian u16)
                c[48 + t] = 16; // rows
            }
            Config(c)
        }
    }

    /// A tile's outputs in f32, 32 rows of 32, where they do not go in place (edges, listed rows,
    /// bf16 outputs).
    #[repr(C, align(64))]
    struct Acc([f32; 32 * 32]);

    /// The stride in bytes between `dst`'s 32 rows where they are one stride apart.
    fn stride<O>(dst: &super::Dst<O>) -> Option<isize> {
        let step = (dst[1] as isize).wrapping_sub(dst[0] as isize);
        (1..32)
            .all(|r| (dst[r] as isize).wrapping_sub(dst[0] as isize) == step.wrapping_mul(r as isize))
            .then_some(step)
    }

    /// The 32 bf16 at `d`'s lanes of `lanes` (the others +0) widened exactly into `buf`.
    ///
    /// # Safety
    /// The lanes of `lanes` lie in live memory; `buf` holds 32 writable f32 on a 64-byte line;
    /// the CPU has AVX-512F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::host::bgemm) unsafe fn widen_row(d: *const u16, lanes: __mmask32, buf: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let h = _mm512_maskz_loadu_epi16(lanes, d.cast());
            let lo = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)));
            let hi = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(h)));
            _mm512_store_si512(buf.cast(), lo);
            _mm512_store_si512(buf.add(16).cast(), hi);
        }
    }

    /// 16 f32's bits rounded to bf16 bits in their low halves: nearest, ties to even (the carry
    /// of just under half an ulp plus the kept last bit), every NaN `0x7FC0`.
    #[target_feature(enable = "avx512f")]
    fn round16(bits: __m512i) -> __m512i {
        let one = _mm512_set1_epi32(1);
        let keep = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
        let near = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(keep, _mm512_set1_epi32(0x7FFF))));
        let nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF)),
            _mm512_set1_epi32(0x7F80_0000),
        );
        _mm512_mask_mov_epi32(near, nan, _mm512_set1_epi32(0x7FC0))
    }

    /// The 32 f32 at `buf` rounded to bf16 into `d`'s lanes of `lanes`.
    ///
    /// # Safety
    /// The lanes of `lanes` lie in writable memory; `buf` holds 32 f32 on a 64-byte line; the CPU
    /// has AVX-512F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::host::bgemm) unsafe fn narrow_row(buf: *const f32, d: *mut u16, lanes: __mmask32) {
        // SAFETY: the caller's contract.
        unsafe {
            let lo = _mm512_cvtepi32_epi16(round16(_mm512_load_si512(buf.cast())));
            let hi = _mm512_cvtepi32_epi16(round16(_mm512_load_si512(buf.add(16).cast())));
            _mm512_mask_storeu_epi16(d.cast(), lanes, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
        }
    }

    /// Four output tiles (tmm0..3: rows 0–15 and 16–31 × columns 0–15 and 16–31) over `groups`
    /// groups, `A` in tmm4–5, `B` in tmm6–7, from (`add`) and into `dst`.
    ///
    /// # Safety
    /// `a` and `b` hold `groups · 512` entries in the kit's layouts; `dst[..mv]` point at `nv`
    /// writable elements each; the CPU has AVX-512F, AVX-512BW and AMX-BF16 and the process holds
    /// the tile state.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn tile_amx<O: super::Target>(
        groups: usize,
        a: *const u32,
        b: *const u32,
        dst: &super::Dst<O>,
        mv: usize,
        nv: usize,
        add: bool,
    ) {
        let config = Config::new();
        let mut acc = std::mem::MaybeUninit::<Acc>::uninit();
        let lanes = if nv >= 32 { u32::MAX } else { (1u32 << nv) - 1 };
        let (m0, m1) = ((lanes & 0xffff) as __mmask16, (lanes >> 16) as __mmask16);
        // an f32 output's tiles in place (rows of 32 one stride apart), else the buffer
        let (c, s, buffered) = match stride(dst) {
            // rows at least a tile row apart (the contract keeps rows disjoint)
            Some(s) if !O::BF16 && mv == 32 && nv == 32 && s.unsigned_abs() >= 128 => (dst[0].cast::<f32>(), s, false),
            _ => {
                let c = acc.write(Acc([0.0; 32 * 32])).0.as_mut_ptr();
                if add {
                    for (r, &d) in dst.iter().enumerate().take(mv) {
                        // SAFETY: the caller's contract: masked lanes lie in the row (the second
                        // half's address may lie past its end, where its mask is empty).
                        unsafe {
                            if O::BF16 {
                                widen_row(d.cast(), lanes, c.add(r * 32));
                            } else {
                                let d = d.cast::<f32>();
                                _mm512_store_ps(c.add(r * 32), _mm512_maskz_loadu_ps(m0, d));
                                _mm512_store_ps(c.add(r * 32 + 16), _mm512_maskz_loadu_ps(m1, d.wrapping_add(16)));
                            }
                        }
                    }
                }
                (c, 128, true)
            }
        };
        // the four output tiles' first elements
        let corner =
            [c, c.wrapping_add(16), c.wrapping_byte_offset(16 * s), c.wrapping_byte_offset(16 * s).wrapping_add(16)];
        // SAFETY: the caller's contract; the tile loads read 16 rows of 64 bytes at the strides
        // given, within the panels and the output tile (or the buffer); the stores write the
        // output tile (or the buffer).
        unsafe {
            asm!("ldtilecfg [{cfg}]", cfg = in(reg) config.0.as_ptr(), options(nostack, readonly));
            if add {
                asm!(
                    "tileloadd tmm0, [{c0} + {s}*1]",
                    "tileloadd tmm1, [{c1} + {s}*1]",
                    "tileloadd tmm2, [{c2} + {s}*1]",
                    "tileloadd tmm3, [{c3} + {s}*1]",
                    c0 = in(reg) corner[0],
                    c1 = in(reg) corner[1],
                    c2 = in(reg) corner[2],
                    c3 = in(reg) corner[3],
                    s = in(reg) s,
                    options(nostack, readonly),
                );
            } else {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nomem, nostack));
            }
            for g in 0..groups {
                let (ag, bg) = (a.add(g * 512), b.add(g * 512));
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) ag,
                    a1 = in(reg) ag.add(256),
                    b0 = in(reg) bg,
                    b1 = in(reg) bg.add(16),
                    sa = in(reg) 64usize,
                    sb = in(reg) 128usize,
                    options(nostack, readonly),
                );
            }
            asm!(
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                "tilerelease",
                c0 = in(reg) corner[0],
                c1 = in(reg) corner[1],
                c2 = in(reg) corner[2],
                c3 = in(reg) corner[3],
                s = in(reg) s,
                options(nostack),
            );
            if buffered {
                for (r, &d) in dst.iter().enumerate().take(mv) {
                    if O::BF16 {
                        narrow_row(c.add(r * 32), d.cast(), lanes);
                    } else {
                        let d = d.cast::<f32>();
                        _mm512_mask_storeu_ps(d, m0, _mm512_load_ps(c.add(r * 32)));
                        _mm512_mask_storeu_ps(d.wrapping_add(16), m1, _mm512_load_ps(c.add(r * 32 + 16)));
                    }
                }
            }
        }
    }
}
