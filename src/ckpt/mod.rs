//! Sharded checkpoints: save a set of tensors from any mesh, load them onto any other.
//!
//! **Format.** A checkpoint root holds checkpoints `ckpt-<step>` and a file `latest` naming the
//! newest. A checkpoint is a directory of safetensors files, `rank<r>.safetensors` (the boxes rank
//! `r` wrote), and one `index.json` ([`Index`]): for every tensor its name, dtype, global shape,
//! the placement it was saved at (text), and each stored box (start, extents) with its file, byte
//! range and checksum (64-bit, over 64-bit words in eight lanes); plus the caller's metadata
//! (JSON: step, data position, …). Each
//! box of the global value is written once: of the devices holding one window (copies), the first
//! writes it. A partial value is closed before it is written ([`Saver::add`] places it: one
//! collective, the value's bytes once), or saved as its terms ([`Saver::add_terms`]: no
//! collective, each term's windows once; loading sums the terms in term order, in the carrier, as
//! closing the value would).
//!
//! **Streaming.** Each rank's boxes go to its file at the commit straight from the windows where
//! they lie (the header first, every size being known), in 1 MiB chunks each checksummed while
//! in cache: no staging copy of a shard.
//!
//! **Asynchronous.** [`Saver::commit_async`] writes the files on a thread of each rank's while
//! training goes on (a window is a value no op changes: holding it is the snapshot);
//! [`PendingSave::wait`] agrees and commits.
//!
//! **Atomic.** Every rank writes into `ckpt-<step>.tmp`, fsyncs its files and reports; then rank 0
//! writes the index last, fsyncs, renames the directory into place and then `latest` (written
//! beside and renamed), so a crash at any moment leaves the previous checkpoint the one `latest`
//! names, whole. Every rank's success is agreed before the commit: a rank that fails to write makes
//! every rank's save fail, naming it.
//!
//! **Load.** [`Checkpoint::load`] reads, on each rank, only the boxes that intersect its window at
//! the target placement (byte ranges read where they lie), checks each box's checksum and
//! assembles the window exactly (uneven extents included); a missing, truncated or corrupted file
//! is an error naming the file and the tensor. A box is read by positioned reads of 1 MiB chunks,
//! each checksummed while it is still in cache: a box that is the window straight into the
//! window's memory (from the rig's pool), another through one chunk of scratch, its runs copied
//! out (a memory map was the alternative: its page faults cost what the copy saves, and every
//! byte of a box must be read for its checksum anyway). [`load_safetensors`] (= `Tensor::load`)
//! reads one tensor of a plain safetensors file (Python's `safetensors`, PyTorch, Hugging Face)
//! onto any placement, only the window's runs (a plain file carries no checksum to check).
//!
//! The ranks share one file system (one host, or a shared mount across hosts).
//!
//! ```
//! # use nx::collectives::Communicator;
//! # nx::launch_with(&nx::LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
//! let dir = std::env::temp_dir().join(format!("nx-ckpt-doc-{}", std::process::id()));
//! let rows = nx::Placement::split(0, ctx.devices())?;
//! let w = nx::Tensor::<f32>::from_fn(ctx, &[5, 3], &rows, |i| (i[0] * 3 + i[1]) as f32)?;
//! let mut s = nx::ckpt::Saver::new(ctx, &dir, 7)?;
//! s.add("w", &w)?;
//! s.commit(serde_json::json!({ "step": 7 }))?;
//! // loaded at another placement: the same value
//! let ck = nx::ckpt::Checkpoint::open(&dir)?;
//! let cols = nx::Placement::split(1, ctx.devices())?;
//! let back = ck.load::<f32>(ctx, "w", &cols)?;
//! assert_eq!(back.full()?.to_vec()?, w.full()?.to_vec()?);
//! assert_eq!(ck.index().meta["step"], 7);
//! # ctx.comm().barrier()?;
//! # if ctx.rank() == 0 { std::fs::remove_dir_all(&dir).ok(); }
//! # Ok(()) }).unwrap();
//! ```

mod load;
mod save;

use serde::{Deserialize, Serialize};

pub use load::{load_safetensors, Checkpoint, Whole};
pub use save::{PendingSave, Saver};

/// The index of a checkpoint (`index.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// `nx-checkpoint-1`.
    pub format: String,
    /// The step it was saved at.
    pub step: u64,
    /// The tensors, in the order they were added.
    pub tensors: Vec<TensorEntry>,
    /// The caller's metadata.
    pub meta: serde_json::Value,
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Its dtype's name (`f32`, `bf16`, `i64`, …).
    pub dtype: String,
    /// The global shape.
    pub shape: Vec<usize>,
    /// The placement it was saved at, and its mesh, as text.
    pub placement: String,
    /// The stored boxes: together they tile the value, each once (each term's, where saved as
    /// terms).
    pub boxes: Vec<BoxEntry>,
    /// The terms saved (1 for a closed value; a sum's number of terms where saved as terms,
    /// [`Saver::add_terms`]).
    #[serde(default = "one")]
    pub terms: usize,
}

fn one() -> usize {
    1
}

/// One stored box of a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxEntry {
    /// The first global index.
    pub start: Vec<usize>,
    /// The extents.
    pub extent: Vec<usize>,
    /// The file, relative to the checkpoint's directory.
    pub file: String,
    /// The first byte in the file.
    pub offset: u64,
    /// The bytes.
    pub len: u64,
    /// The bytes' checksum (64-bit, over their 64-bit words in eight lanes, folded with their
    /// length), hexadecimal.
    pub fnv64: String,
    /// The term the box belongs to (0 for a closed value).
    #[serde(default)]
    pub term: usize,
}

/// The bytes written or read at once: a box is checksummed in chunks of this size (a whole
/// number of 64-byte blocks), each while it is still in cache.
pub(crate) const CHUNK: usize = 1 << 20;

/// A box's checksum, of its bytes: over their little-endian 64-bit words in eight interleaved lanes
/// (word `i` to lane `i mod 8`; the last, short word padded with zeros), each word xored in,
/// multiplied by FNV's 64-bit prime and its high half folded back down (so a difference in any bit
/// reaches every later bit), the lanes then folded in order with the length — eight independent
/// chains, so it runs at memory speed.
///
/// Fed in pieces, every piece but the last a whole number of 64-byte blocks, so a box is
/// summed chunk by chunk as it is written or read, each chunk while it is still in cache.
pub(crate) struct Sum {
    lanes: [u64; 8],
    len: u64,
    /// A short last block was folded in: no more bytes may follow.
    ended: bool,
}

const P: u64 = 0x0100_0000_01b3;

fn mix(h: u64, w: u64) -> u64 {
    let h = (h ^ w).wrapping_mul(P);
    h ^ (h >> 29)
}

impl Sum {
    pub(crate) fn new() -> Sum {
        let mut lanes = [0u64; 8];
        for (i, l) in lanes.iter_mut().enumerate() {
            *l = 0xcbf2_9ce4_8422_2325u64 ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1));
        }
        Sum { lanes, len: 0, ended: false }
    }

    /// Folds in `bytes`, the next piece (a whole number of 64-byte blocks unless it is the last).
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        debug_assert!(!self.ended, "a piece after a short one");
        let h = &mut self.lanes;
        let mut blocks = bytes.chunks_exact(64);
        for blk in &mut blocks {
            for (l, w) in h.iter_mut().zip(blk.chunks_exact(8)) {
                *l = mix(*l, u64::from_le_bytes(w.try_into().expect("8 bytes")));
            }
        }
        let rest = blocks.remainder();
        for (i, w) in rest.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..w.len()].copy_from_slice(w);
            h[i] = mix(h[i], u64::from_le_bytes(word));
        }
        self.ended = !rest.is_empty();
        self.len += bytes.len() as u64;
    }

    /// The checksum of every piece folded in.
    pub(crate) fn finish(&self) -> u64 {
        let out = self.lanes.iter().fold(0xcbf2_9ce4_8422_2325u64, |a, &l| mix(mix(a, l), l.rotate_left(32)));
        mix(out, self.len)
    }
}

/// The safetensors dtype of an nx dtype (`F8_E4M3` and `F8_E5M2` for the fp8s), or `None`
/// (complex numbers).
pub(crate) fn st_dtype(d: crate::Dtype) -> Option<safetensors::Dtype> {
    use crate::Dtype as D;
    use safetensors::Dtype as S;
    Some(match d {
        D::Bool => S::BOOL,
        D::I8 => S::I8,
        D::I16 => S::I16,
        D::I32 => S::I32,
        D::I64 => S::I64,
        D::U8 => S::U8,
        D::U16 => S::U16,
        D::U32 => S::U32,
        D::U64 => S::U64,
        D::F16 => S::F16,
        D::BF16 => S::BF16,
        D::F8E4M3 => S::F8_E4M3,
        D::F8E5M2 => S::F8_E5M2,
        D::F32 => S::F32,
        D::F64 => S::F64,
        _ => return None,
    })
}

/// The name safetensors' header gives dtype `d` (`F32`, `BF16`, …).
pub(crate) fn st_name(d: safetensors::Dtype) -> String {
    format!("{d:?}")
}

/// Writes every tensor of the checkpoint at `dir` (a root or one checkpoint) whole into one
/// plain safetensors file `out`, which Python's `safetensors`, PyTorch and Hugging Face read;
/// answers the number of tensors.
///
/// # Errors
/// As [`Checkpoint::open`] and [`Checkpoint::whole`]; an unwritable `out`.
pub fn merge(dir: impl AsRef<std::path::Path>, out: impl AsRef<std::path::Path>) -> crate::Result<usize> {
    const FUNC: &str = "nx::ckpt::merge";
    let ck = Checkpoint::open(dir)?;
    let whole = ck.whole()?;
    let views = whole
        .iter()
        .map(|(n, d, s, b)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| crate::tensor::err(FUNC, format!("{n}: {e}")))
        })
        .collect::<crate::Result<Vec<_>>>()?;
    let out = out.as_ref();
    safetensors::serialize_to_file(views, &None, out)
        .map_err(|e| crate::tensor::err(FUNC, format!("{}: {e}", out.display())))?;
    Ok(whole.len())
}

#[cfg(test)]
mod tests {
    use super::Sum;

    /// The checksum of the 1000 bytes below, as the format's first writer (a one-pass function,
    /// run apart from this code) computed it.
    const GOLDEN: &str = "169cc07f5ad20fca";

    #[test]
    fn a_checksum_fed_in_pieces_is_the_checksum_fed_whole() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0usize, 1, 7, 63, 64, 65, 128, 999, 1000] {
            let mut whole = Sum::new();
            whole.update(&bytes[..len]);
            for piece in [64usize, 128, 320] {
                let mut parts = Sum::new();
                for c in bytes[..len].chunks(piece) {
                    parts.update(c);
                }
                assert_eq!(parts.finish(), whole.finish(), "{len} bytes in pieces of {piece}");
            }
            // the sum of the format (checkpoints written before stay readable)
            if len == 1000 {
                assert_eq!(format!("{:016x}", whole.finish()), GOLDEN, "the checksum of the format changed");
            }
            // every byte counts: one flipped bit changes the sum
            if len > 0 {
                let mut other = bytes[..len].to_vec();
                other[len / 2] ^= 0x10;
                let mut flipped = Sum::new();
                flipped.update(&other);
                assert_ne!(flipped.finish(), whole.finish(), "{len} bytes");
            }
        }
    }
}
