//! The host kernel library: nx's kernels on host memory (devices of kind `sim` and `cpu`), with
//! rayon.
//!
//! # What it computes and declines
//!
//! - **map**: every program ([`crate::prog::Prog`]) over operands of any dtype and layout
//!   (strided, broadcast, offset) into C-contiguous destinations, and over padded and windowed
//!   loads ([`crate::Load`]; `map_loads`, `reduce_loads`): each element of such a load is found
//!   from its index (its windows, then the padding, else the operand's element), the padded
//!   operand never materialised. Declines destinations that are not C-contiguous.
//! - **reduce**: `Sum` and `Prod` of every dtype but booleans, `Max`, `Min` and `Arg` of every real
//!   dtype and booleans, `Logsumexp` and `Moments` of real floats. Declines `Max`, `Min` and `Arg`
//!   of complex terms (the contract leaves their order open; this library gives none yet).
//! - **contract**: `f32`, `f64`, `c64`, `c128` natively, `f16` and `bf16` widened exactly to `f32`
//!   and accumulated there, each output rounded once into its dtype. Declines integers and
//!   booleans. Operands and `init` must share the destination's dtype (else `WrongDtype`).
//! - **scan**: every reduction of the dtypes it reduces (`Sum`, `Prod`, `Max`, `Min`,
//!   `Logsumexp`, `Moments`, `Arg`), from an optional carry for the first five; declines a carry
//!   of `Moments` or `Arg` (their state is more than one carrier value) and `Max`, `Min` and
//!   `Arg` of complex terms.
//! - **gather**, **range gather**, **scatter** (`Set`, `Add`), **assemble**: every dtype (a
//!   scatter's `Add` every dtype but booleans), `i64` indices. An index outside its axis is
//!   refused as `IndexOutOfRange` before any write (on a queued device, when the work runs: the
//!   device is lost, naming it); declines an index of more elements than memory holds (a
//!   broadcast view).
//! - **sort** (values and/or positions, a top-k where the destinations are shorter): every real
//!   dtype and booleans; declines complex ones and lanes of 2³² elements or more.
//! - **pad** (every dtype) and **fold** (`Sum`, `Prod`, `Max`, `Min` of the dtypes it reduces,
//!   over windows of the padded operand, never materialised).
//! - **attention**: dense and paged, grouped query heads, causal masks and lengths, a score
//!   program deciding visibility and scores (`attention_scored`), operands of `f16`, `bf16`,
//!   `f32` (and `f64` with an `f64` accumulator), accumulators `f32` and `f64`.
//! - **contract_general**: block-scaled operands (`Exponent` codes and `Value` scales), `Rows`
//!   and `Contracting` segments, and operands of any dtype that widens exactly into the
//!   accumulator ([`crate::widens_into`]): every integer accumulator (`i8` to `u64`, wrapping:
//!   `i8` operands into `i32` is the int8 contraction), `f32` and `f64` (narrower float operands
//!   widened), `c64` and `c128`. Refuses exponent codes on an integer accumulator.
//! - **fft** (complex and real forms, every length), **matrix routines** (Cholesky, triangular
//!   and LU solves, QR, SVD, eigh, eig) on `f32`, `f64`, `c64`, `c128`.
//!
//! # Instruction sets
//!
//! A library runs at one [`crate::Simd`] level: the highest the CPU has, or lower where
//! [`HostOptions::simd`] caps it (a cap above the CPU's level is lowered to it), read with
//! [`Host::simd`]. Loops written once ([`crate::simd_fn!`]: sums, the lane-fused maps, sort keys,
//! integer products, attention's rows, and the collectives' reduction loops) are built for
//! AVX-512, AVX2 and the baseline; the kernels written with intrinsics (the f32 and bf16 product
//! tiles, attention's row maxima and exponentials) have a path per level. Every level computes
//! the same operations in the same order, so the bits are the same at every level (tested level
//! by level against the baseline and against f64 loops: `tests/simd_levels.rs`), but for the
//! bf16 product at `avx512bf16`, whose instruction flushes subnormals (NaN payloads may differ),
//! and at `amx`, whose tiles add each group of 32 contracting indices in an order of their own
//! (`bgemm_amx.rs` states it; tested bit for bit against it, and against f64 loops).
//! What other crates compute (faer's f64 and complex products and factorisations, rustfft,
//! `half`'s F16C conversions) follows the CPU, not the level. Copies alone
//! (streaming stores, the 4 KiB-alias copy) pick their load width by the CPU, whatever the
//! level: they move bytes, and each build is tested directly.
//!
//! # Algorithms
//!
//! - **Loops** run in tasks of 2¹⁶ flat indices over the rayon pool, so a chain of maps reads and
//!   writes memory once. A program whose live nodes are all of one float type (`f32` or `f64`) —
//!   loads of contiguous operands of that dtype, constants, real unary and binary ops — into
//!   destinations of that dtype (or, for `f32`, contiguous bf16 and f16 loads and destinations,
//!   widened into and narrowed from the lanes by the register evaluator's own conversions) runs *lane-fused*: the whole program over 128 indices held in small
//!   cache-line aligned arrays, then the next 128, loads read in place and outputs stored straight
//!   from the lanes (built for AVX-512, AVX2 and the baseline, the library's level picking); its reads and writes
//!   interleave as a hand-fused loop's do. Every other program runs over blocks of 2048 indices
//!   held in typed registers (one per node): a load of a contiguous operand that needs no
//!   conversion (`f32`, `f64`, `i64`, `u64`, `c64`, `c128`) is read in place, other loads convert
//!   into a register.
//!   Both evaluators apply the same elementwise functions: the same bits. Outputs of 8 MiB and
//!   more are written with streaming stores.
//! - **Reductions** number each output's terms in C order of the reduced axes and cut them into
//!   chunks of 2048. A `Sum` chunk adds term `i` into lane `i mod 8` (each lane from +0), then adds
//!   the lanes as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`; a `Prod` chunk multiplies left to right
//!   from its first term; chunks combine by a pairwise tree (the first ⌈p/2⌉ rounded up to a power
//!   of two, then the rest). A task combines the partials of 16 aligned chunks before they leave
//!   it — the tree splits only at multiples of 16, so this is the same tree. A lone `Sum` of an
//!   operand read in place sums its chunks straight from memory, typed, with the chunk loop
//!   built for the library's level (the same additions in the same order: the same bits; wider
//!   loads keep more cache lines in flight than SSE2's). `Logsumexp` keeps per chunk the maximum m
//!   and Σ exp(x − m) in `f64` and combines by rescaling; `Moments` keeps per chunk the count,
//!   the mean and the sum of squared deviations (two passes over the chunk, in `f64`) and combines
//!   by Chan's formula, so the variance is a sum of non-negative terms: never negative. Nothing
//!   depends on the thread count: the same bits with 1, 2 or 64 threads.
//! - **Scans** cut each lane into blocks of 4096 terms. Block k's results continue from `C_k`,
//!   left to right (`r_i = C_k ⊕ x_{4096k} ⊕ … ⊕ x_i`, one combination per term); `C_0` is the
//!   carry (a `Sum` without one: +0; the others: nothing, so the first result is the first term),
//!   and `C_{k+1} = C_k ⊕ T_k`, `T_k` block k's terms combined left to right from its first.
//!   `Logsumexp`, `Moments` and `Arg` scans combine the reductions' own per-term states (the
//!   maximum and Σ exp(x − m) in `f64`; the count, mean and sum of squared deviations in `f64`,
//!   by Chan's formula; the extreme and its first position) in the same blocks, and finish each
//!   result as the reduction finishes its terms: its special values.
//!   Blocks do not depend on the lane's length, so the scan of a prefix is the prefix of the
//!   scan; many lanes run in parallel, a few long ones block by block (totals, then results), a
//!   task running the chains of 8 whole blocks side by side; the same combinations either way:
//!   the same bits on any thread count.
//! - **Gathers and scatters** move whole rows (the axes after the indexed one), a row one copy
//!   where its axes are C-contiguous; a scatter sorts its indices by destination (a stable
//!   counting sort) and each destination row, on one thread, receives its sources in index
//!   order — `Add` sums each element in the carrier from `into`'s value (or +0) and rounds once.
//! - **Sorts** map each element to an integer key whose order is the contract's (NaNs greatest,
//!   all alike; −0 below +0; descending: the key complemented) and sort (key, position) pairs:
//!   by LSD radix over the key's bytes (passes of one digit skipped) from 1024 elements, by the
//!   standard library's sort below; a top-k of k ≤ n/16 selects then sorts the k. Pairs are
//!   unique, so every path gives the one stable order. Lanes run in parallel.
//! - **Folds** run one task per block of outputs, each output's window walked in C order, a read
//!   outside the operand the fill: O(outputs × window) reads, through the operand's layout.
//! - **Attention** is online (flash-style): per lead index and key head the visible keys (before
//!   the length, on a page of the pool) are packed once, widened to the accumulator; a task takes
//!   256 query rows of one head and walks tiles of 128 keys: `S = s·(Q Kᵀ)` by `faer`'s product
//!   (one thread), the causal mask, then per row the running maximum m, `l = l·e^(m_old − m) +
//!   Σ e^(S − m)` and `O = O·e^(m_old − m) + P V`; at the end `o = O / l`, `lse = m + ln l`.
//!   `e^(S − m)` is one fused `s·(q·k) − m`, then an `exp` within 2 ulps (Cephes' polynomial),
//!   summed in 16 lanes, the same bits on every CPU (the tile products are faer's, whose kernels
//!   follow the CPU). A score that overflows to +∞ makes its row's `o` and `lse` NaN. Tiles past every row's causal mask
//!   are skipped, and rows before a tile's first visible key left out of its products. Scores
//!   are never held beyond a tile. A NaN
//!   or infinity in a key or value past a row's length, or on a hole of the table, is never read;
//!   one in a value the causal mask hides from a row, in a tile holding a key visible to that
//!   row, reaches its `o` (its weight is 0, and 0 × NaN is NaN). A score program runs on each
//!   tile after its product, over the pairs of the rows the tile's products take, by the
//!   register evaluator's node functions (its loads read at the pairs' positions of the loop):
//!   a pair it hides scores −∞ (weight 0, so a NaN value there, in a tile with a visible pair,
//!   reaches `o` as above), and its scores take no further scale.
//! - **Fourier transforms** run through `rustfft`, one axis after another (the last of `axes`
//!   first; complex to real: the others first, then the last): each lane is read into a buffer,
//!   transformed in place by the plan of its length (cached in the library, shared by its clones)
//!   and written out; lanes in parallel, every lane through the same plan, so the bits do not
//!   depend on the thread count. A real lane is transformed as complex (its half spectrum the
//!   first n/2 + 1 outputs); a complex-to-real lane is extended to its n points as a Hermitian
//!   sequence and its real part kept.
//! - **Matrix routines** (Cholesky, triangular solves, general solves by LU with partial
//!   pivoting, QR by Householder reflections, SVD, Hermitian eigendecomposition) read each
//!   matrix (or the triangle a routine uses) into a column-major `faer::Mat` through its layout
//!   in tiles and write the results out. Several matrices run one per task on one thread; a
//!   single Cholesky or solve runs on the pool's threads (faer splits those by output blocks:
//!   the same bits on any thread count), a single QR, SVD or eigendecomposition with faer's
//!   work split into a fixed 8 tasks whatever the pool's threads (its bits follow the split, not
//!   the threads: the same bits alone or in a batch, on 1, 2 or 3 threads). Singular values
//!   descend, eigenvalues ascend; the factors' signs are those faer's reflections and rotations
//!   leave. `eig` reduces to Hessenberg then Schur form (faer's `evd_real`/`evd_cplx`): the
//!   values in the order of the Schur form's diagonal, a real matrix's conjugate pair adjacent
//!   (the one faer's real Schur block gives first, then its conjugate); each vector scaled to
//!   unit 2-norm, its phase as faer leaves it.
//! - **Contractions** permute each operand to (batch, free, contracting) as a view, or copy it
//!   when no view exists, and run a matrix product per batch: one batch on every thread of the
//!   pool, many batches one thread each. `f32` (and f16 and fp8, widened) runs nx's own product
//!   (`sgemm`): the contracting axis in blocks of 512, each block's products fused-multiply-added
//!   in index order into an accumulator from +0, the block's sum added to the output — an output's
//!   bits depend on the contracting extent alone, the same on AVX-512, AVX2 and plain tiles, any
//!   thread count, and for a row or column alone or in any matrix. bf16 operands into a bf16
//!   destination run the bf16 kit (`bgemm`): the same blocks, each pair of contracting indices
//!   added odd index first (`vdpbf16ps`'s order, which it runs where the library's level has AVX-512 BF16;
//!   elsewhere the f32 tiles over operands widened as packed, in that order: the same bits, but
//!   for subnormals, which the instruction flushes to zero, and NaN payloads); where the level is
//!   `amx`, AMX tiles, which add each group of 32 contracting indices as (even-indexed products in
//!   order) + (odd-indexed ones) onto one running sum (`bgemm_amx.rs`): bits of their own; up to
//!   4096 contracting indices they round each sum to the bf16 output themselves. Other bf16
//!   contractions (scaled, segmented, or into another dtype) widen into `f32` and run `sgemm` in
//!   index order: their bits differ from the plain bf16 product's within the same bound. `f64` and complex run `faer`'s product, which blocks the
//!   contracting axis by cache sizes alone, so its bits are independent of the thread count
//!   (tested with 1, 2 and 8 threads, past a block of the contracting axis).
//! - **General contractions** read an operand that is not the accumulator's dtype, or is scaled,
//!   into the accumulator in its permuted C order (each element times its block's scale, one
//!   rounding), else in place. `Rows` segments of an `f32` accumulator hand each group's row
//!   starts to `sgemm`, which reads and writes them in place; of other accumulators they gather
//!   each group's rows into one block, multiply it by the group's slice of `b` with the product
//!   above and write the rows back; `Contracting`
//!   segments gather each group's contracting indices, in their order, from both operands. Integer
//!   products (`int_product`) accumulate in `i32` (accumulators up to 32 bits) or `i64`, wrapping,
//!   in tiles of 256 contracting indices by 512 columns per task of 32 rows, the loop compiled for
//!   AVX-512, AVX2 and the baseline: exact, so the same bits on any thread count.
//!
//! # Error bounds
//!
//! u is the unit roundoff of the carrier (`f32`: 2⁻²⁴, `f64`: 2⁻⁵³; halves sum in `f32`) and
//! γ(k) = k·u/(1 − k·u).
//!
//! - A `Sum` of n terms is within γ(⌈c/8⌉ + 2 + ⌈log₂ p⌉)·Σ|x| of the exact sum, c = min(n, 2048)
//!   terms a chunk and p chunks: far inside the contract's γ(n − 1)·Σ|x|. A `Prod` is within a
//!   relative γ(n − 1).
//! - `Logsumexp` is within about (n + 3)·u₆₄ + u of the exact value, u₆₄ = 2⁻⁵³ and u the rounding
//!   into the destination; `Moments`' mean and variance within a relative few·n·u₆₄ of their values
//!   in the carrier's terms (plus the final rounding).
//! - A `Sum` scan's result i (k = ⌊i/4096⌋) is within γ(i + 2)·(|carry| + Σ|x|) of the exact sum
//!   of the carry and its terms (each term passes through at most i + 1 additions); a `Prod`
//!   within a relative γ(i + 2). Integer, boolean, `Max`, `Min` and `Arg` scans are exact. A
//!   `Logsumexp` scan's result i is within (4(i + 2) + 2|L|)·u₆₄ of the exact L of the carry and
//!   its terms, plus the rounding into the destination; a `Moments` scan's mean within
//!   4(i + 2)·u₆₄·max|x| and its variance within 8(i + 2)·u₆₄·max|x|², plus that rounding.
//! - A `Sum` fold of a window of K elements is within γ(K − 1)·Σ|x| (left to right from +0).
//! - Attention: with A = max over a row's visible pairs of s·Σ|qᵢkᵢ|, `lse` is within
//!   ε = u·((dk + 2)·A + tk + 8 + |L|) of the exact log-sum-exp L, and each element of `o` within
//!   (2ε + (tk + 8)·u)·max|v| of the exact weighted sum (u the accumulator's unit roundoff), before
//!   the rounding into the destination's dtype. With a score program, L is over its scores, and
//!   the roundings of its own operations add to ε.
//! - A contraction output with K products is within γ(K + 1)·(|init| + Σ|a||b|) for real dtypes
//!   (each product fused into one addition, then `init`) and within γ(2K + 2) for complex ones;
//!   a scaled operand's element adds one rounding (its product by the scale; none for exponent
//!   codes but where the result is subnormal), within γ(K + 3) for real dtypes. Integer
//!   contractions are exact modulo 2^w, w the accumulator's width.
//! - A Fourier transform along axes of n₁, n₂, … points has each output within
//!   5·u·(⌈log₂ n₁⌉ + ⌈log₂ n₂⌉ + …)·Σ|x| of the exact transform (u the parts' unit roundoff,
//!   Σ|x| over the lanes the output reads; `rustfft`'s mixed-radix, Rader and Bluestein plans,
//!   tested for every length 1–64 and primes to 4099). The sign of a zero is not kept.
//! - Cholesky: the factor l satisfies |a − l·lᴴ| ≤ 2·γ(n + 1)·|l|·|lᴴ| elementwise (Higham's
//!   γ(n + 1), doubled for faer's blocked updates). A triangular solve: |b − t·x| ≤ 2·γ(n + 1)·|t|·|x|
//!   elementwise. A general solve: ‖b − a·x‖∞ ≤ 10·n·u·‖a‖∞·‖x‖∞ where partial pivoting's growth
//!   stays small (as it does but for contrived matrices). QR, SVD and eigh: each reconstruction
//!   (`q·r`, `u·diag(s)·vh`, `a·v − v·diag(w)`) and each orthonormality (`qᴴq`, `uᴴu`, `vh·vhᴴ`,
//!   `vᴴv` against the identity) within 40·(m + n + 2)·u·(1 + max(m, n)·max|a|) elementwise
//!   (times n + 1 for eigh), and the values within the same of the exact ones (tested against
//!   Jacobi rotations in f64).
//!
//! # Threads
//!
//! The library is safe to call from several threads at once: each call claims its arrays through
//! the door, which refuses (never waits for) a conflicting claim. Its work runs on its own pool
//! ([`HostOptions`]: the measured cores, thresholds under which maps, reductions and
//! conversions run on the calling thread), shared by its clones; a queued rig's worker runs the
//! work it queued on that pool too.

mod assemble;
mod attention;
mod attention_grad;
mod attention_rows;
mod attention_scores;
mod bgemm;
mod columns;
mod contract;
mod contract_general;
pub(crate) mod eval;
pub(crate) mod expf;
mod fft;
mod fold;
mod fused;
mod gather;
mod int_product;
mod lanes;
mod linalg;
mod map;
mod par;
mod reduce;
pub(crate) mod reg;
mod scan;
mod sgemm;
mod sort;
mod warm;

use std::sync::Arc;

use par::Par;
pub use par::{HostOptions, Origin, Store, Thresholds, Work, WARM};

use crate::contraction::{Contraction, Factor, Segmented};
use crate::door::Operand;
use crate::kernels::{Attention, Direction, Kernels, Kv, Reduction, Scatter};
use crate::loads::Load;
use crate::prog::Prog;
use crate::rig::Work as RigWork;
use crate::{Answer, Result};
use crate::{AnyArray, Buffer};

/// The host kernel library. See the [module documentation](self).
///
/// Clones share one thread pool, its thresholds and the Fourier plans.
///
/// # Examples
///
/// ```
/// use nx_kernels::host::{Host, HostOptions, Store, Work};
///
/// // a library of 2 threads whose maps of fewer than 4096 elements run on the calling thread
/// let opts = HostOptions { threads: Some(2), map: Some(4096), store: Store::Memory, ..Default::default() };
/// let host = Host::with_options(opts)?;
/// assert_eq!(host.threads(), 2);
/// assert_eq!(host.threshold(Work::Map), 4096);
/// # Ok::<(), nx_kernels::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Host {
    par: Arc<Par>,
    /// The Fourier transforms' plans, shared by the clones of this library.
    plans: Arc<fft::Plans>,
}

impl Default for Host {
    fn default() -> Host {
        Host::new()
    }
}

impl Host {
    /// The library on a pool of the compute cores this process may use
    /// ([`Cores::measured`](crate::facts::Cores::measured)), started at its first parallel work,
    /// its thresholds measured (or read from the user's cache) when first needed.
    pub fn new() -> Host {
        let par = Par::new(HostOptions::default()).expect("the default options are valid");
        Host { par, plans: Arc::default() }
    }

    /// The library on a pool of its own of `threads` threads (other settings the defaults).
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] for 0 threads or where the pool cannot be started.
    pub fn with_threads(threads: usize) -> Result<Host> {
        Host::with_options(HostOptions { threads: Some(threads), ..HostOptions::default() })
    }

    /// The library with `options`; its pool started now.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming the setting for 0 threads or a threshold of 0, and where the
    /// pool cannot be started.
    pub fn with_options(options: HostOptions) -> Result<Host> {
        let par = Par::new(options)?;
        par.start()?;
        Ok(Host { par, plans: Arc::default() })
    }

    /// Returns this library watched by `observer` (its pool, thresholds and plans shared): each
    /// call is reported to it, and where it is [`active`](crate::observe::Observer::active)
    /// checked but not run (see [`crate::observe`]).
    pub fn observed(&self, observer: Arc<dyn crate::observe::Observer>) -> Host {
        Host { par: self.par.observed(Some(observer)), plans: self.plans.clone() }
    }

    /// Returns the observer watching this library, where one does.
    pub fn observer(&self) -> Option<&Arc<dyn crate::observe::Observer>> {
        self.par.observer()
    }

    /// Returns the SIMD level this library's kernels run: its [`HostOptions::simd`] cap, lowered
    /// to what the CPU has.
    pub fn simd(&self) -> crate::Simd {
        self.par.simd()
    }

    /// Returns the threads of this library's pool.
    pub fn threads(&self) -> usize {
        self.par.threads()
    }

    /// Runs `f` on this library's pool and returns its result: rayon's parallel iterators inside
    /// `f` split over the library's threads (on the caller's thread where the library has one).
    /// A caller's own parallel loops beside the kernels should run here, so that one set of
    /// threads owns the cores: a second pool's threads, still spinning after its loop, delay the
    /// wake-up of the kernels' (over a 64 MiB sum on the 2-core Intel VM, a kernel run after a
    /// loop on rayon's global pool read at 0.7 of its speed after one on this pool).
    ///
    /// # Examples
    /// ```
    /// use rayon::prelude::*;
    /// let host = nx_kernels::Host::new();
    /// let v: Vec<u64> = (0..1000).collect();
    /// assert_eq!(host.install(|| v.par_iter().sum::<u64>()), 499_500);
    /// ```
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.par.install(f)
    }

    /// Returns what the pool's size came from, in words (a setting, or the measurement's
    /// affinity, topology, performance cores and quota).
    pub fn threads_source(&self) -> &str {
        self.par.cores_source()
    }

    /// Returns the threshold of `work` in elements: its setting, else the measured one
    /// (measured now where this library has not yet).
    pub fn threshold(&self, work: Work) -> usize {
        self.par.threshold(work)
    }

    /// Returns every threshold in force and where the measured ones came from (measuring them
    /// now where this library has not yet).
    pub fn thresholds(&self) -> (Thresholds, Origin) {
        self.par.thresholds()
    }

    /// Writes `src`'s elements converted to `D` (as [`crate::convert`]) into `dst`: inline under
    /// the [`Work::Convert`] threshold, else in contiguous pieces over this library's pool.
    ///
    /// # Errors
    /// [`crate::Error::LengthMismatch`] unless both slices have one length; nothing is written then.
    pub fn convert<S: crate::Element, D: crate::Element>(&self, src: &[S], dst: &mut [D]) -> Result<()> {
        convert_on(&self.par, src, dst)
    }
}

/// [`Host::convert`] on `par`.
fn convert_on<S: crate::Element, D: crate::Element>(par: &Par, src: &[S], dst: &mut [D]) -> Result<()> {
    const FUNC: &str = "nx_kernels::Host::convert";
    if par.inline(Work::Convert, src.len()) {
        crate::dtype::convert::convert_split(FUNC, src, dst, None)
    } else {
        let piece = src.len().div_ceil(par.threads().saturating_mul(4)).clamp(1024, 1 << 16);
        par.install(|| crate::dtype::convert::convert_split(FUNC, src, dst, Some(piece)))
    }
}

/// A probe's work, run under the library it is given.
pub(crate) type ProbeJob = Box<dyn Fn(&Arc<Par>) + Send + Sync>;

/// The work a probe of `work` times at `n` elements, run under the library it is given: an
/// exponential of `n` f32 elements (map), the sums of `n / 1024` rows of 1024 f32 (reduce), `n`
/// f32 to bf16 (convert); `None` where its memory is refused.
pub(crate) fn probe_job(work: Work, n: usize) -> Option<ProbeJob> {
    use crate::prog::UnOp;
    let dev = nx_mesh::Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
    let src = crate::Array::<f32>::from_fn(dev, &[n], |i| (i[0] % 1000) as f32 * 1e-3).ok()?;
    match work {
        Work::Map => {
            let dst = crate::Array::<f32>::zeros(dev, &[n]).ok()?;
            let mut prog = Prog::new(&[crate::Dtype::F32]);
            let x = prog.load(0);
            let y = prog.unary(UnOp::Exp, x);
            prog.output(y);
            Some(Box::new(move |par| {
                let _ = map::map(par, &prog, &[n], &[&dst], &[Load::Plain(&src)]);
            }))
        }
        Work::Reduce => {
            let rows = (n / 1024).max(1);
            let src = src.apply(&crate::Move::Reshape(vec![rows, n / rows])).ok().flatten()?;
            let dst = crate::Array::<f32>::zeros(dev, &[rows]).ok()?;
            let mut prog = Prog::new(&[crate::Dtype::F32]);
            let x = prog.load(0);
            prog.output(x);
            Some(Box::new(move |par| {
                let _ = reduce::reduce(
                    par,
                    &prog,
                    &[rows, n / rows],
                    &[1],
                    &[Reduction::Sum],
                    &[&dst],
                    &[Load::Plain(&src)],
                );
            }))
        }
        Work::Convert => {
            let src = src.to_vec().ok()?;
            let dst = std::sync::Mutex::new(vec![half::bf16::ZERO; n]);
            Some(Box::new(move |par| {
                let mut d = dst.lock().unwrap_or_else(|e| e.into_inner());
                let _ = convert_on(par, &src, &mut d);
            }))
        }
    }
}

impl Kernels for Host {
    fn name(&self) -> &'static str {
        "host"
    }

    fn map(&self, prog: &Prog, shape: &[usize], dsts: &[&dyn Operand], loads: &[&dyn Operand]) -> Answer {
        let loads: Vec<Load<'_>> = loads.iter().map(|&o| Load::Plain(o)).collect();
        map::map(&self.par, prog, shape, dsts, &loads)
    }

    fn map_loads(&self, prog: &Prog, shape: &[usize], dsts: &[&dyn Operand], loads: &[Load<'_>]) -> Answer {
        map::map(&self.par, prog, shape, dsts, loads)
    }

    fn reduce(
        &self,
        prog: &Prog,
        shape: &[usize],
        axes: &[usize],
        reductions: &[Reduction],
        dsts: &[&dyn Operand],
        loads: &[&dyn Operand],
    ) -> Answer {
        let loads: Vec<Load<'_>> = loads.iter().map(|&o| Load::Plain(o)).collect();
        reduce::reduce(&self.par, prog, shape, axes, reductions, dsts, &loads)
    }

    fn reduce_loads(
        &self,
        prog: &Prog,
        shape: &[usize],
        axes: &[usize],
        reductions: &[Reduction],
        dsts: &[&dyn Operand],
        loads: &[Load<'_>],
    ) -> Answer {
        reduce::reduce(&self.par, prog, shape, axes, reductions, dsts, loads)
    }

    fn contract(
        &self,
        spec: &Contraction,
        dst: &dyn Operand,
        a: &dyn Operand,
        b: &dyn Operand,
        init: Option<&dyn Operand>,
    ) -> Answer {
        contract::contract(&self.par, spec, dst, a, b, init)
    }

    fn contract_general(
        &self,
        spec: &Contraction,
        segments: Option<Segmented<'_>>,
        dst: &dyn Operand,
        a: Factor<'_>,
        b: Factor<'_>,
        init: Option<&dyn Operand>,
    ) -> Answer {
        contract_general::contract_general(&self.par, spec, segments, dst, a, b, init)
    }

    fn scan(
        &self,
        reduction: Reduction,
        axis: usize,
        carry: Option<&dyn Operand>,
        dsts: &[&dyn Operand],
        src: &dyn Operand,
    ) -> Answer {
        scan::scan(&self.par, reduction, axis, carry, dsts, src)
    }

    fn gather(&self, axis: usize, dst: &dyn Operand, src: &dyn Operand, index: &dyn Operand) -> Answer {
        gather::gather(&self.par, axis, None, dst, src, index)
    }

    fn range_gather(
        &self,
        axis: usize,
        run: usize,
        dst: &dyn Operand,
        src: &dyn Operand,
        starts: &dyn Operand,
    ) -> Answer {
        gather::gather(&self.par, axis, Some(run), dst, src, starts)
    }

    fn scatter(
        &self,
        mode: Scatter,
        axis: usize,
        dst: &dyn Operand,
        into: Option<&dyn Operand>,
        src: &dyn Operand,
        index: &dyn Operand,
    ) -> Answer {
        gather::scatter(&self.par, mode, axis, dst, into, src, index)
    }

    fn sort(
        &self,
        axis: usize,
        descending: bool,
        values: Option<&dyn Operand>,
        positions: Option<&dyn Operand>,
        src: &dyn Operand,
    ) -> Answer {
        sort::sort(&self.par, axis, descending, values, positions, src)
    }

    fn pad(&self, pad: &crate::Pad, fill: crate::Value, dst: &dyn Operand, src: &dyn Operand) -> Answer {
        fold::pad(&self.par, pad, fill, dst, src)
    }

    fn fold(
        &self,
        reduction: Reduction,
        pad: &crate::Pad,
        fill: crate::Value,
        windows: &crate::Windows,
        dst: &dyn Operand,
        src: &dyn Operand,
    ) -> Answer {
        fold::fold(&self.par, reduction, pad, fill, windows, dst, src)
    }

    fn attention(
        &self,
        spec: &Attention,
        o: &dyn Operand,
        lse: &dyn Operand,
        q: &dyn Operand,
        kv: Kv<'_>,
        lengths: Option<&dyn Operand>,
    ) -> Answer {
        attention::attention(&self.par, spec, None, o, lse, q, kv, lengths)
    }

    fn attention_scored(
        &self,
        spec: &Attention,
        scores: crate::Scores<'_>,
        o: &dyn Operand,
        lse: &dyn Operand,
        q: &dyn Operand,
        kv: Kv<'_>,
        lengths: Option<&dyn Operand>,
    ) -> Answer {
        attention::attention(&self.par, spec, Some(scores), o, lse, q, kv, lengths)
    }

    fn attention_grad(&self, spec: &Attention, grad: crate::AttentionGrad<'_>) -> Answer {
        attention_grad::attention_grad(&self.par, spec, grad)
    }

    fn assemble(&self, dst: &dyn Operand, pieces: &[(&[usize], &dyn Operand)]) -> Answer {
        assemble::assemble(&self.par, dst, pieces)
    }

    fn fft(&self, direction: Direction, axes: &[usize], dst: &dyn Operand, src: &dyn Operand) -> Answer {
        fft::fft(&self.par, &self.plans, direction, axes, dst, src)
    }

    fn cholesky(&self, l: &dyn Operand, a: &dyn Operand) -> Answer {
        linalg::cholesky(&self.par, l, a)
    }

    fn solve_triangular(&self, lower: bool, unit: bool, x: &dyn Operand, a: &dyn Operand, b: &dyn Operand) -> Answer {
        linalg::solve(&self.par, linalg::Solve::Triangular { lower, unit }, x, a, b)
    }

    fn solve(&self, x: &dyn Operand, a: &dyn Operand, b: &dyn Operand) -> Answer {
        linalg::solve(&self.par, linalg::Solve::General, x, a, b)
    }

    fn qr(&self, q: &dyn Operand, r: &dyn Operand, a: &dyn Operand) -> Answer {
        linalg::qr(&self.par, q, r, a)
    }

    fn svd(&self, u: Option<&dyn Operand>, s: &dyn Operand, vh: Option<&dyn Operand>, a: &dyn Operand) -> Answer {
        linalg::svd(&self.par, u, s, vh, a)
    }

    fn eigh(&self, w: &dyn Operand, v: Option<&dyn Operand>, a: &dyn Operand) -> Answer {
        linalg::eigh(&self.par, w, v, a)
    }

    fn eig(&self, w: &dyn Operand, v: Option<&dyn Operand>, a: &dyn Operand) -> Answer {
        linalg::eig(&self.par, w, v, a)
    }
}

/// Copies `src` to `dst` with streaming (non-temporal) stores where the platform has them, so
/// that a large copy neither reads the destination's lines first nor evicts the caches; end the
/// thread's run of such copies with [`store_fence`]. Other platforms copy plainly.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` elements, aligned for `T`, and not overlap `src`;
/// nothing else may access it meanwhile.
pub unsafe fn stream_copy<T: Copy>(src: &[T], dst: *mut T) {
    // SAFETY: the caller's contract.
    unsafe { reg::stream(src, dst) }
}

/// Copies `src` to `dst`: by `memcpy`, except where the destination lies 1–63 bytes past the source
/// modulo 4 KiB — there glibc's `memcpy` (from 2112 bytes, `rep movsb`) ran up to 30 times slower
/// on AMD Zen 3 (1.8 GB/s), and the copy goes by vector loads and stores instead (32 bytes at a
/// time where the CPU has AVX2). Elsewhere `memcpy` measured as fast or faster for copies from
/// memory (the collectives' 1–16 MiB copies ran 5–20% slower through the vector loop).
///
/// # Safety
/// As [`stream_copy`]'s.
pub unsafe fn copy<T: Copy>(src: &[T], dst: *mut T) {
    let delta = (dst as usize).wrapping_sub(src.as_ptr() as usize) % 4096;
    if (1..64).contains(&delta) {
        // SAFETY: the caller's contract.
        unsafe { reg::copy(src, dst) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }
}

/// Orders this thread's streaming stores before what follows (an `sfence` on x86-64).
pub fn store_fence() {
    reg::fence()
}

/// Whether written operand `w` and read operand `r` share a byte. The door admits a destination
/// identical to an operand; a kernel that reads an operand at other indices than the result's
/// own refuses that as `Overlapping` (its result would depend on the order of its tasks).
pub(crate) fn overlaps(w: &dyn Operand, r: &dyn Operand) -> bool {
    w.buffer().memory_id() == r.buffer().memory_id()
        && crate::door::shares_byte_bits(w.layout(), w.dtype().bits(), r.layout(), r.dtype().bits())
}

/// The refusal of destinations `written` for a kernel that reads `read` at other indices than the
/// result's own: `Declined` for a destination that is not C-contiguous, then `Overlapping` for
/// one sharing a byte with such an operand; `None` where they fit.
pub(crate) fn destinations(written: &[&dyn Operand], read: &[&dyn Operand]) -> Option<Answer> {
    if written.iter().any(|w| !w.layout().is_contiguous()) {
        return Some(Answer::Declined);
    }
    written.iter().any(|w| read.iter().any(|r| overlaps(*w, *r))).then_some(Answer::Overlapping)
}

/// As [`destinations`], for a kernel that writes each destination a row (its last axis) at a time
/// through its strides: a destination need only hold that axis at stride 1 (any other strides, as
/// a permuted view of a dense array has; the door refuses positions that repeat).
pub(crate) fn row_destinations(written: &[&dyn Operand], read: &[&dyn Operand]) -> Option<Answer> {
    let rows = |w: &&dyn Operand| {
        let l = w.layout();
        l.numel() == 0 || l.rank() == 0 || l.shape()[l.rank() - 1] == 1 || l.strides()[l.rank() - 1] == 1
    };
    if !written.iter().all(rows) {
        return Some(Answer::Declined);
    }
    written.iter().any(|w| read.iter().any(|r| overlaps(*w, *r))).then_some(Answer::Overlapping)
}

/// Runs a kernel's `body(written, read, run)` through the door: its checks, then (where `run`)
/// its work. Where the first written operand lives on a queued rig, the checks run now, under the
/// claims, and the work is queued on that rig's timeline over owned views of the operands (after
/// every work it must follow): `Done` means queued. Elsewhere the body runs at once, after the
/// work pending on every operand. Flattens the door's refusal into the answer; a device the call
/// must follow that is lost answers [`Answer::Lost`].
/// The kernels that read and write packed dtypes (`int4`, `uint4`, `bit`), by bits: maps (casts
/// into and out of them, and programs over their values). Every other kernel answers
/// `WrongDtype` for a packed operand: convert it by a map first.
const PACKED_KERNELS: &[&str] = &["map"];

pub(crate) fn through_door<F>(
    par: &Arc<Par>,
    kernel: &'static str,
    work: Option<(Work, usize)>,
    written: &[&dyn Operand],
    read: &[&dyn Operand],
    body: F,
) -> Answer
where
    F: Fn(&[&dyn Operand], &[&dyn Operand], bool) -> Answer + Send + Sync + 'static,
{
    // packed dtypes (int4, uint4, bit) only through the kernels that address them by bits
    let packed_ok = PACKED_KERNELS.contains(&kernel);
    if !packed_ok && written.iter().chain(read).any(|o| o.dtype().is_packed()) {
        return Answer::WrongDtype;
    }
    if let Some(o) = par.observer() {
        o.record(crate::observe::Launch::of(kernel, written, read));
        if o.active() {
            // a dry run: the call's checks — the door's (claims taken and given back at once, which
            // touches no memory and waits for nothing) and the kernel's — and no work
            return crate::door::door_packed(written, read, || body(written, read, false)).unwrap_or_else(|a| a);
        }
    }
    // inline: on the calling thread (the rig's worker for queued work), else on the pool
    let inline = work.is_some_and(|(w, n)| par.inline(w, n));
    let rig = written.first().and_then(|o| o.buffer().rig()).filter(|r| r.is_queued()).cloned();
    let answer = crate::door::door_packed(written, read, || match rig {
        None => {
            if written.iter().chain(read).any(|o| o.buffer().wait().is_err()) {
                return Answer::Lost;
            }
            if inline {
                body(written, read, true)
            } else {
                par.install(|| body(written, read, true))
            }
        }
        Some(rig) => {
            let checked = body(written, read, false);
            if checked != Answer::Done {
                return checked;
            }
            let (w, r): (Vec<AnyArray>, Vec<AnyArray>) =
                (written.iter().map(|o| AnyArray::of(*o)).collect(), read.iter().map(|o| AnyArray::of(*o)).collect());
            let (wb, rb): (Vec<Buffer>, Vec<Buffer>) =
                (w.iter().map(|a| a.buffer().clone()).collect(), r.iter().map(|a| a.buffer().clone()).collect());
            let par = par.clone();
            let work: RigWork = Box::new(move || {
                let wv: Vec<&dyn Operand> = w.iter().map(|a| a as &dyn Operand).collect();
                let rv: Vec<&dyn Operand> = r.iter().map(|a| a as &dyn Operand).collect();
                let answer = if inline { body(&wv, &rv, true) } else { par.install(|| body(&wv, &rv, true)) };
                match answer {
                    Answer::Done => Ok(()),
                    other => Err(format!("a kernel answered \"{other}\" when it ran")),
                }
            });
            let (wr, rr): (Vec<&Buffer>, Vec<&Buffer>) = (wb.iter().collect(), rb.iter().collect());
            match rig.submit(&rr, &wr, work) {
                Ok(_) => Answer::Done,
                Err(_) => Answer::Lost,
            }
        }
    });
    answer.unwrap_or_else(|refusal| refusal)
}

#[cfg(test)]
mod tests {
    /// `copy` stores exactly the source, by either path: destinations 0–100 bytes past the source
    /// modulo 4 KiB (the vector loop from 1 to 63), lengths around `rep movsb`'s 2112 bytes.
    #[test]
    fn copies_store_exactly_the_source_at_any_distance() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 31 % 253) as u8).collect();
        let mut buf = vec![0u8; 3 * 4096 + 9200];
        for delta in [0, 1, 15, 16, 31, 32, 63, 64, 100] {
            for len in [0, 7, 2111, 2112, 3000, 8192] {
                buf.fill(0);
                // the destination `delta` bytes past the source modulo 4 KiB
                let at = (src.as_ptr() as usize + delta).wrapping_sub(buf.as_ptr() as usize) % 4096 + 4096;
                // SAFETY: `buf` holds `at + len` bytes, apart from `src`.
                unsafe { super::copy(&src[..len], buf.as_mut_ptr().add(at)) };
                assert_eq!(&buf[at..at + len], &src[..len], "{delta} bytes past, {len} bytes");
                assert!(buf[..at].iter().chain(&buf[at + len..]).all(|&b| b == 0), "outside: {delta}, {len}");
            }
        }
    }
}
