//! The sort kernel: a stable sort of each lane by an order-preserving integer key (NaNs
//! greatest, −0 below +0) and the position, pairs that are unique: by LSD radix for long lanes,
//! by the standard library's sort for short ones, and a selection for a top-k of few; values
//! copied as bits, positions as `i64`.

use half::{bf16, f16};
use rayon::prelude::*;

use super::eval::Ptr;
use super::lanes::Lanes;
use super::{destinations, through_door};
use crate::door::Operand;
use crate::{Answer, Dtype, Element, Kind, Simd};

/// Lanes from this many elements sort by radix; shorter ones by the standard library's sort (of
/// unique pairs: one order).
const RADIX_MIN: usize = 1024;

/// An element type with a key whose integer order is the sort's (ascending): `BYTES` low bytes
/// of it vary.
pub(crate) trait Key: Element {
    const BYTES: usize;
    fn key(self) -> u64;
}

macro_rules! unsigned_key {
    ($t:ty) => {
        impl Key for $t {
            const BYTES: usize = size_of::<$t>();
            fn key(self) -> u64 {
                self as u64
            }
        }
    };
}
unsigned_key!(u8);
unsigned_key!(u16);
unsigned_key!(u32);
unsigned_key!(u64);

macro_rules! signed_key {
    ($t:ty, $u:ty) => {
        impl Key for $t {
            const BYTES: usize = size_of::<$t>();
            fn key(self) -> u64 {
                // the sign bit flipped: two's complement order becomes unsigned order
                ((self as $u) ^ (1 << (<$u>::BITS - 1))) as u64
            }
        }
    };
}
signed_key!(i8, u8);
signed_key!(i16, u16);
signed_key!(i32, u32);
signed_key!(i64, u64);

impl Key for bool {
    const BYTES: usize = 1;
    fn key(self) -> u64 {
        u64::from(self)
    }
}

/// The key of a float's bits `b` of `bits` bits: negatives reversed below positives (−0 just
/// below +0), every NaN the greatest key. Branch-free: random signs are not predictable.
#[inline(always)]
fn float_key(b: u64, bits: u32, nan: bool) -> u64 {
    let top = 1u64 << (bits - 1);
    let all = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    // a negative flips every bit, a positive only the sign's
    let negative = (b >> (bits - 1)) & 1;
    let key = b ^ ((0u64.wrapping_sub(negative) & all) | top);
    key | (0u64.wrapping_sub(u64::from(nan)) & all)
}

macro_rules! float_key {
    ($t:ty, $bits:expr) => {
        impl Key for $t {
            const BYTES: usize = $bits / 8;
            fn key(self) -> u64 {
                float_key(u64::from(self.to_bits()), $bits, self.is_nan())
            }
        }
    };
}
float_key!(f32, 32);
float_key!(f64, 64);
float_key!(f16, 16);
float_key!(bf16, 16);
float_key!(crate::dtype::fp8::F8E4M3, 8);
float_key!(crate::dtype::fp8::F8E5M2, 8);

/// The elements a top-k's filter reads at a time.
const BLOCK: usize = 64;

/// Writes the keys (xor `flip`) of the next `keys.len()` elements of a lane, the element `t` of
/// them at `at(t)`, `stride` elements apart: a contiguous lane read as a slice, in vector
/// registers at the library's level.
#[inline(always)]
fn block_keys<T: Key>(simd: Simd, keys: &mut [u64], stride: isize, flip: u64, at: impl Fn(usize) -> *const u8) {
    // booleans are read as bytes (`Element::load`): a byte of a bitcast array may be neither
    // 0 nor 1, so never through a `&[bool]`
    if stride == 1 && !keys.is_empty() && T::DTYPE != crate::Dtype::Bool {
        // SAFETY: the caller's elements: `keys.len()` of them from `at(0)`, contiguous and
        // aligned (a checked layout's), under the call's claims; every bit pattern is a `T`.
        let xs = unsafe { std::slice::from_raw_parts(at(0).cast::<T>(), keys.len()) };
        keys_of(simd, keys, xs, flip);
        return;
    }
    for (t, key) in keys.iter_mut().enumerate() {
        // SAFETY: the caller's element `t`, under the call's claims.
        *key = unsafe { T::load(at(t)) }.key() ^ flip;
    }
}

crate::simd_fn! {
    /// The keys (xor `flip`) of `xs`, into `keys`, built for the level.
    fn keys_of<T: Key>(simd: Simd, keys: &mut [u64], xs: &[T], flip: u64) {
        for (key, &x) in keys.iter_mut().zip(xs) {
            *key = x.key() ^ flip;
        }
    }
}

/// An element's key and position, ordered by key, then position.
trait Item: Copy + Ord + Send + Sync {
    fn new(key: u64, pos: usize) -> Self;
    fn key(self) -> u64;
    fn digit(self, byte: usize) -> usize;
    fn pos(self) -> usize;
}

/// A key of at most 4 bytes above a 32-bit position.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Packed(u64);

impl Item for Packed {
    fn new(key: u64, pos: usize) -> Packed {
        Packed(key << 32 | pos as u64)
    }
    fn key(self) -> u64 {
        self.0 >> 32
    }
    #[inline(always)]
    fn digit(self, byte: usize) -> usize {
        (self.0 >> (32 + 8 * byte)) as usize & 0xff
    }
    fn pos(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
}

/// An 8-byte key and its position.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Wide(u64, u32);

impl Item for Wide {
    fn new(key: u64, pos: usize) -> Wide {
        Wide(key, pos as u32)
    }
    fn key(self) -> u64 {
        self.0
    }
    #[inline(always)]
    fn digit(self, byte: usize) -> usize {
        (self.0 >> (8 * byte)) as usize & 0xff
    }
    fn pos(self) -> usize {
        self.1 as usize
    }
}

/// Sorts `items` (positions ascending) by key, stably, keeping the first `k`: a selection then a
/// sort of those for few of many, a radix sort over `bytes` key bytes for long lanes, a merge
/// sort otherwise. Items are unique (their positions differ), so every way gives one order.
fn order<I: Item>(items: &mut Vec<I>, scratch: &mut Vec<I>, bytes: usize, k: usize) {
    let n = items.len();
    if k == 0 {
        items.clear();
        return;
    }
    if k < n && k * 16 <= n {
        items.select_nth_unstable(k - 1);
        items.truncate(k);
        items.sort_unstable();
        return;
    }
    if n < RADIX_MIN {
        items.sort_unstable();
    } else {
        scratch.clear();
        scratch.resize(n, items[0]);
        for byte in 0..bytes {
            let mut count = [0usize; 257];
            for it in items.iter() {
                count[it.digit(byte) + 1] += 1;
            }
            if count.contains(&n) {
                continue; // one digit throughout: the pass moves nothing
            }
            for d in 0..256 {
                count[d + 1] += count[d];
            }
            for it in items.iter() {
                let d = it.digit(byte);
                scratch[count[d]] = *it;
                count[d] += 1;
            }
            std::mem::swap(items, scratch);
        }
    }
    items.truncate(k);
}

pub(crate) fn sort(
    par: &std::sync::Arc<super::par::Par>,
    axis: usize,
    descending: bool,
    values: Option<&dyn Operand>,
    positions: Option<&dyn Operand>,
    src: &dyn Operand,
) -> Answer {
    let written: Vec<&dyn Operand> = values.into_iter().chain(positions).collect();
    if written.is_empty() {
        return Answer::ShapeMismatch;
    }
    if values.is_some_and(|v| v.dtype() != src.dtype()) || positions.is_some_and(|p| p.dtype() != Dtype::I64) {
        return Answer::WrongDtype;
    }
    if src.dtype().kind() == Kind::Complex {
        return Answer::Declined;
    }
    let (has_values, has_positions) = (values.is_some(), positions.is_some());
    let simd = par.simd();
    through_door(par, "sort", None, &written, &[src], move |w, r, execute| {
        let src = r[0];
        let (values, positions) = match (has_values, has_positions) {
            (true, true) => (Some(w[0]), Some(w[1])),
            (true, false) => (Some(w[0]), None),
            _ => (None, Some(w[0])),
        };
        let shape = src.layout().shape();
        let out = w[0].layout().shape();
        let k = out.get(axis).copied().unwrap_or(0);
        let fits = crate::shape::sort(shape, axis, k).ok().as_deref() == Some(out)
            && w.iter().all(|o| o.layout().shape() == out);
        if !fits {
            return Answer::ShapeMismatch;
        }
        if shape[axis] > u32::MAX as usize {
            return Answer::Declined;
        }
        if let Some(a) = destinations(w, r) {
            return a;
        }
        if !execute {
            return Answer::Done;
        }
        let k = out[axis];
        macro_rules! go {
            ($t:ty) => {
                lanes::<$t>(simd, axis, descending, k, values, positions, src)
            };
        }
        match src.dtype() {
            Dtype::Bool => go!(bool),
            Dtype::I8 => go!(i8),
            Dtype::I16 => go!(i16),
            Dtype::I32 => go!(i32),
            Dtype::I64 => go!(i64),
            Dtype::U8 => go!(u8),
            Dtype::U16 => go!(u16),
            Dtype::U32 => go!(u32),
            Dtype::U64 => go!(u64),
            Dtype::F16 => go!(f16),
            Dtype::BF16 => go!(bf16),
            Dtype::F8E4M3 => go!(crate::dtype::fp8::F8E4M3),
            Dtype::F8E5M2 => go!(crate::dtype::fp8::F8E5M2),
            Dtype::F32 => go!(f32),
            Dtype::F64 => go!(f64),
            Dtype::C64 | Dtype::C128 => return Answer::Declined,
            Dtype::I4 | Dtype::U4 | Dtype::Bit => return Answer::WrongDtype,
        }
        Answer::Done
    })
}

fn lanes<T: Key>(
    simd: Simd,
    axis: usize,
    descending: bool,
    k: usize,
    values: Option<&dyn Operand>,
    positions: Option<&dyn Operand>,
    src: &dyn Operand,
) {
    if T::BYTES <= 4 {
        run::<T, Packed>(simd, axis, descending, k, values, positions, src)
    } else {
        run::<T, Wide>(simd, axis, descending, k, values, positions, src)
    }
}

fn run<T: Key, I: Item>(
    simd: Simd,
    axis: usize,
    descending: bool,
    k: usize,
    values: Option<&dyn Operand>,
    positions: Option<&dyn Operand>,
    src: &dyn Operand,
) {
    let sl = Lanes::new(src.layout(), axis);
    let vl = values.map(|v| Lanes::new(v.layout(), axis));
    let pl = positions.map(|p| Lanes::new(p.layout(), axis));
    let (sp, vp, pp) = (Ptr::of(src), values.map(Ptr::of), positions.map(Ptr::of));
    let size = T::DTYPE.size() as isize;
    let mask = if T::BYTES == 8 { u64::MAX } else { (1u64 << (8 * T::BYTES)) - 1 };
    let n = sl.len();
    (0..sl.count()).into_par_iter().for_each_init(
        || (Vec::<I>::new(), Vec::<I>::new()),
        |(items, scratch), lane| {
            let s0 = sl.start(lane);
            let at = |t: usize| sp.byte((s0 + t as isize * sl.stride()) * size);
            items.clear();
            // SAFETY (every load and store): the door holds the claims; positions come from the
            // checked layouts; lane `lane` of the destinations is written by this task alone.
            if k > 0 && k * 16 <= n {
                // a few of many: keep candidates below the k-th least seen so far, selecting the
                // k least whenever 4k are held (items are unique: one answer whatever the order)
                // A block's keys are read first and its least compared with the bar's key: most
                // blocks hold no candidate, and the loop over them runs in vector registers. A
                // later key equal to the bar's is past it (its position is greater).
                let flip = if descending { mask } else { 0 };
                let mut keys = [0u64; BLOCK];
                let mut bar = u64::MAX;
                let mut held = false; // whether `bar` is the key of a k-th least seen so far
                let mut t0 = 0;
                while t0 < n {
                    let m = BLOCK.min(n - t0);
                    let keys = &mut keys[..m];
                    block_keys::<T>(simd, keys, sl.stride(), flip, |t| at(t0 + t));
                    if held && keys.iter().fold(u64::MAX, |a, &x| a.min(x)) >= bar {
                        t0 += m;
                        continue;
                    }
                    for (j, &key) in keys.iter().enumerate() {
                        if held && key >= bar {
                            continue;
                        }
                        items.push(I::new(key, t0 + j));
                        if items.len() == 4 * k {
                            items.select_nth_unstable(k - 1);
                            items.truncate(k);
                            bar = items[k - 1].key();
                            held = true;
                        }
                    }
                    t0 += m;
                }
            } else {
                items.extend((0..n).map(|t| {
                    // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                    let key = unsafe { T::load(at(t)) }.key();
                    I::new(if descending { !key & mask } else { key }, t)
                }));
            }
            order(items, scratch, T::BYTES, k);
            if let (Some(vl), Some(vp)) = (&vl, vp) {
                let v0 = vl.start(lane);
                for (j, it) in items.iter().enumerate() {
                    let to = vp.byte((v0 + j as isize * vl.stride()) * size);
                    // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                    unsafe { std::ptr::copy_nonoverlapping(at(it.pos()), to, size as usize) };
                }
            }
            if let (Some(pl), Some(pp)) = (&pl, pp) {
                let p0 = pl.start(lane);
                for (j, it) in items.iter().enumerate() {
                    let to = pp.byte((p0 + j as isize * pl.stride()) * 8);
                    // SAFETY: under the call's claims, at positions of the checked layouts (see above).
                    unsafe { <i64 as Element>::store(to, it.pos() as i64) };
                }
            }
        },
    );
}
