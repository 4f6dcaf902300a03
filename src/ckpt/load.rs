//! Loading: each rank reads the boxes that meet its window and assembles it.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nx_collectives::Reducible;

use super::{st_dtype, st_name, BoxEntry, Index, Sum, TensorEntry, CHUNK};
use crate::tensor::{err, window_shape};
use crate::{Ctx, Placement, Result, Tensor};

const FUNC: &str = "nx::ckpt::Checkpoint::load";

/// A tensor's entry in a safetensors header: dtype name, shape, data byte range.
pub(crate) type HeaderEntry = (String, Vec<usize>, (u64, u64));

/// The start of the data and each tensor's entry, from a safetensors file's first bytes (at
/// least the 8-byte length and the header).
pub(crate) fn header(bytes: &[u8], path: &Path) -> Result<(u64, HashMap<String, HeaderEntry>)> {
    let bad = |why: &str| err(FUNC, format!("{}: not a safetensors file ({why})", path.display()));
    let n = u64::from_le_bytes(bytes.get(..8).ok_or_else(|| bad("shorter than 8 bytes"))?.try_into().expect("8 bytes"));
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("the header runs past the file"))?;
    let json: serde_json::Value = serde_json::from_slice(&bytes[8..end]).map_err(|e| bad(&e.to_string()))?;
    let obj = json.as_object().ok_or_else(|| bad("the header is not an object"))?;
    let mut out = HashMap::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = v["dtype"].as_str().ok_or_else(|| bad(&format!("{name} has no dtype")))?.to_string();
        let shape = v["shape"].as_array().ok_or_else(|| bad(&format!("{name} has no shape")))?;
        let shape = shape
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(&format!("{name}'s shape")))?;
        let off = v["data_offsets"].as_array().ok_or_else(|| bad(&format!("{name} has no data_offsets")))?;
        let (a, z) = match (off.first().and_then(|x| x.as_u64()), off.get(1).and_then(|x| x.as_u64())) {
            (Some(a), Some(z)) if a <= z => (a, z),
            _ => return Err(bad(&format!("{name}'s data_offsets"))),
        };
        out.insert(name.clone(), (dtype, shape, (a, z)));
    }
    Ok((end as u64, out))
}

/// The header of the safetensors file at `path`, read without reading its data.
fn header_of_file(path: &Path) -> Result<(u64, HashMap<String, HeaderEntry>)> {
    let io = |e: std::io::Error| err(FUNC, format!("{}: {e}", path.display()));
    let f = File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    f.read_exact_at(&mut len, 0).map_err(io)?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(err(FUNC, format!("{}: a header of {n} bytes", path.display())));
    }
    let mut bytes = vec![0u8; 8 + n as usize];
    f.read_exact_at(&mut bytes, 0).map_err(io)?;
    header(&bytes, path)
}

/// A tensor whole on the host: name, safetensors dtype, shape, bytes.
pub type Whole = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A committed checkpoint, opened: its index.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    dir: PathBuf,
    index: Index,
}

impl Checkpoint {
    /// The checkpoint `latest` names under `root` (or `root` itself where it holds an
    /// `index.json`).
    ///
    /// # Errors
    /// No checkpoint there; an unreadable or malformed index.
    pub fn open(root: impl AsRef<Path>) -> Result<Checkpoint> {
        const OPEN: &str = "nx::ckpt::Checkpoint::open";
        let root = root.as_ref();
        let dir = if root.join("index.json").exists() {
            root.to_path_buf()
        } else {
            let latest = root.join("latest");
            let name = std::fs::read_to_string(&latest).map_err(|e| err(OPEN, format!("{}: {e}", latest.display())))?;
            root.join(name.trim())
        };
        let path = dir.join("index.json");
        let text = std::fs::read(&path).map_err(|e| err(OPEN, format!("{}: {e}", path.display())))?;
        let index: Index = serde_json::from_slice(&text).map_err(|e| err(OPEN, format!("{}: {e}", path.display())))?;
        if index.format != "nx-checkpoint-1" {
            return Err(err(OPEN, format!("{}: format {:?}", path.display(), index.format)));
        }
        Ok(Checkpoint { dir, index })
    }

    /// The index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of `name`, or `None`.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.index.tensors.iter().find(|t| t.name == name)
    }

    /// Tensor `name` at `placement` (any mesh of `ctx`'s devices): each rank reads the boxes
    /// meeting its window, checks their checksums and assembles it. A partial placement gets
    /// the value in its first term (zeros in the others).
    ///
    /// # Errors
    /// An unknown name; another dtype than `T`; a placement that does not fit the shape; a
    /// missing, truncated or corrupted file (naming it and the tensor); boxes that do not cover
    /// the window.
    pub fn load<'d, T: Reducible>(
        &self,
        ctx: &Ctx<'d>,
        name: &str,
        placement: &Placement<'d>,
    ) -> Result<Tensor<'d, T>> {
        let e = self.entry(name).ok_or_else(|| err(FUNC, format!("no tensor {name:?} in {}", self.dir.display())))?;
        if e.dtype != T::DTYPE.name() {
            return Err(err(FUNC, format!("{name} is {} in {}, asked for {}", e.dtype, self.dir.display(), T::DTYPE)));
        }
        let out = assemble(ctx, name, &e.shape, placement, &e.boxes, e.terms, &self.dir, true);
        agree(ctx, out)
    }

    /// Every tensor of the checkpoint whole, on the host, as its bytes (for `nx ckpt merge`):
    /// (name, safetensors dtype, shape, bytes).
    ///
    /// # Errors
    /// As [`Checkpoint::load`]; a dtype safetensors has not.
    pub fn whole(&self) -> Result<Vec<Whole>> {
        let mut out = Vec::new();
        for e in &self.index.tensors {
            if e.terms > 1 {
                return Err(err(
                    FUNC,
                    format!(
                        "{} was saved as {} terms: load it with nx (which sums them) and save it closed",
                        e.name, e.terms
                    ),
                ));
            }
            let dtype: crate::Dtype =
                e.dtype.parse().map_err(|_| err(FUNC, format!("{}: dtype {:?}", e.name, e.dtype)))?;
            let dt =
                st_dtype(dtype).ok_or_else(|| err(FUNC, format!("{}: {dtype} has no safetensors dtype", e.name)))?;
            let size = dtype.size();
            let window: Vec<std::ops::Range<usize>> = e.shape.iter().map(|&n| 0..n).collect();
            let bytes = e.shape.iter().try_fold(size, |a, &x| a.checked_mul(x));
            let bytes = bytes
                .ok_or_else(|| err(FUNC, format!("{}: a shape {:?} of more bytes than memory", e.name, e.shape)))?;
            let mut buf = vec![0u8; bytes];
            let covered = fill(&e.name, &window, &e.boxes, &self.dir, true, size, &mut buf)?;
            if covered != e.shape.iter().product::<usize>() {
                return Err(err(FUNC, format!("{}: the boxes cover {covered} of its elements", e.name)));
            }
            out.push((e.name.clone(), dt, e.shape.clone(), buf));
        }
        Ok(out)
    }
}

/// Tensor `name` of the plain safetensors file `file` (one holder of the whole value: Python's
/// `safetensors`, PyTorch, Hugging Face) at `placement`: each rank reads its window's runs only
/// (the file carries no checksums to check).
///
/// # Errors
/// An unreadable or malformed file; no tensor `name`; another dtype than `T`.
pub fn load_safetensors<'d, T: Reducible>(
    ctx: &Ctx<'d>,
    file: impl AsRef<Path>,
    name: &str,
    placement: &Placement<'d>,
) -> Result<Tensor<'d, T>> {
    let path = file.as_ref();
    let (start, h) = header_of_file(path)?;
    let (dtype, shape, (a, z)) =
        h.get(name).ok_or_else(|| err(FUNC, format!("no tensor {name:?} in {}", path.display())))?;
    let want = st_dtype(T::DTYPE).map(st_name);
    if want.as_deref() != Some(dtype.as_str()) {
        return Err(err(FUNC, format!("{name} is {dtype} in {}, asked for {}", path.display(), T::DTYPE)));
    }
    let whole = BoxEntry {
        start: vec![0; shape.len()],
        extent: shape.clone(),
        file: path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string(),
        offset: start
            .checked_add(*a)
            .ok_or_else(|| err(FUNC, format!("{}: {name}'s data offset {a} past any file", path.display())))?,
        len: z - a,
        fnv64: String::new(),
        term: 0,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let out = assemble(ctx, name, shape, placement, &[whole], 1, dir, false);
    agree(ctx, out)
}

/// Every rank's load agreed: where one rank failed (a bad file its window meets), every rank
/// fails, naming it, rather than going on alone into the next collective.
fn agree<'d, T: Reducible>(ctx: &Ctx<'d>, out: Result<Tensor<'d, T>>) -> Result<Tensor<'d, T>> {
    match out {
        Ok(t) => {
            super::save::agree_ok(ctx, FUNC, Ok(()))?;
            Ok(t)
        }
        Err(e) => {
            super::save::agree_ok(ctx, FUNC, Err(e.clone()))?;
            Err(e)
        }
    }
}

/// This rank's window of `name` at `placement` from `boxes` (of `terms` terms, summed in term
/// order in the carrier).
#[allow(clippy::too_many_arguments)]
fn assemble<'d, T: Reducible>(
    ctx: &Ctx<'d>,
    name: &str,
    shape: &[usize],
    placement: &Placement<'d>,
    boxes: &[BoxEntry],
    terms: usize,
    dir: &Path,
    check: bool,
) -> Result<Tensor<'d, T>> {
    // boxes of one term never overlap (each element stored once), so that the elements they
    // cover are exactly the window's when their count is
    for k in 0..terms.max(1) {
        let mine: Vec<&BoxEntry> = boxes.iter().filter(|b| b.term == k).collect();
        for (i, a) in mine.iter().enumerate() {
            for b in &mine[i + 1..] {
                let ranks = [a.start.len(), a.extent.len(), b.start.len(), b.extent.len()];
                let meet = ranks.iter().all(|&r| r == ranks[0])
                    && (0..a.start.len()).all(|d| {
                        let (ae, be) = (a.start[d].saturating_add(a.extent[d]), b.start[d].saturating_add(b.extent[d]));
                        a.start[d] < be && b.start[d] < ae
                    });
                if meet {
                    return Err(err(
                        FUNC,
                        format!(
                            "{name}: the stored boxes {:?}+{:?} and {:?}+{:?} overlap",
                            a.start, a.extent, b.start, b.extent
                        ),
                    ));
                }
            }
        }
    }
    let closed = placement.closed();
    let local = match closed.window(shape, ctx.index())? {
        Some(w) => {
            let size = std::mem::size_of::<T>();
            let n: usize = w.iter().map(|r| r.len()).product();
            if terms <= 1 && T::DTYPE != crate::Dtype::Bool {
                // read straight into the window's elements, in memory of the rig's pool
                let local = nx_kernels::Array::<T>::uninit_on(ctx.rig(), &window_shape(&w))?;
                let covered = local.with_slice_mut(|values| {
                    // SAFETY: the bytes of the `n` numbers of `T` of `values`, every bit pattern
                    // valid; borrowed mutably while `values` is not otherwise used.
                    let buf = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), n * size) };
                    fill(name, &w, boxes, dir, check, size, buf)
                })??;
                if covered != n {
                    return Err(err(
                        FUNC,
                        format!("{name}: the stored boxes cover {covered} of the {n} elements of window {w:?}"),
                    ));
                }
                let t = Tensor::from_local(ctx, shape, &closed, Some(local))?;
                return if placement.is_partial() { t.place(placement) } else { Ok(t) };
            }
            let mut acc: Vec<T::Acc> = Vec::new();
            for k in 0..terms.max(1) {
                let mine: Vec<BoxEntry> = boxes.iter().filter(|b| b.term == k).cloned().collect();
                let mut buf = vec![0u8; n * size];
                let covered = fill(name, &w, &mine, dir, check, size, &mut buf)?;
                if covered != n {
                    return Err(err(
                        FUNC,
                        format!(
                            "{name}: the stored boxes of term {k} cover {covered} of the {n} elements of window {w:?}"
                        ),
                    ));
                }
                let values = buf.chunks_exact(size).map(|c| {
                    if T::DTYPE == crate::Dtype::Bool {
                        crate::from_f64::<T>(f64::from(u8::from(c[0] != 0)))
                    } else {
                        // SAFETY: `c` holds `size_of::<T>()` bytes of a stored `T` (a number:
                        // every bit pattern is valid); read unaligned.
                        unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<T>()) }
                    }
                });
                if k == 0 {
                    acc = values.map(T::widen).collect();
                } else {
                    for (a, v) in acc.iter_mut().zip(values) {
                        *a = T::combine(nx_collectives::ReduceOp::Sum, *a, v.widen())
                            .ok_or_else(|| err(FUNC, format!("{name}: {} terms of {} have no sum", terms, T::DTYPE)))?;
                    }
                }
            }
            let values: Vec<T> = acc.into_iter().map(T::narrow).collect();
            Some(nx_kernels::Array::from_vec_on(ctx.rig(), &window_shape(&w), values)?)
        }
        None => None,
    };
    let t = Tensor::from_local(ctx, shape, &closed, local)?;
    if placement.is_partial() {
        t.place(placement)
    } else {
        Ok(t)
    }
}

/// Copies into `buf` (the window `w`, C order, `size` bytes an element) the part of each box
/// that meets it, each box's bytes checked against its checksum where `check`; answers the
/// elements covered.
fn fill(
    name: &str,
    w: &[std::ops::Range<usize>],
    boxes: &[BoxEntry],
    dir: &Path,
    check: bool,
    size: usize,
    buf: &mut [u8],
) -> Result<usize> {
    let r = w.len();
    let mut files: HashMap<&str, File> = HashMap::new();
    let mut covered = 0;
    for b in boxes {
        if b.start.len() != r || b.extent.len() != r {
            return Err(err(FUNC, format!("{name}: a box of rank {} for a value of rank {r}", b.start.len())));
        }
        let ends: Option<Vec<usize>> = (0..r).map(|d| b.start[d].checked_add(b.extent[d])).collect();
        let Some(ends) = ends else {
            return Err(err(FUNC, format!("{name}: a box {:?}+{:?} past any shape", b.start, b.extent)));
        };
        let lo: Vec<usize> = (0..r).map(|d| w[d].start.max(b.start[d])).collect();
        let hi: Vec<usize> = (0..r).map(|d| w[d].end.min(ends[d])).collect();
        if (0..r).any(|d| lo[d] >= hi[d]) && r > 0 {
            continue;
        }
        let path = dir.join(&b.file);
        let io = |e: std::io::Error| err(FUNC, format!("{name}: {}: {e}", path.display()));
        let numel = b.extent.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        let bytes_of_box = numel.and_then(|n| n.checked_mul(size));
        let (Some(numel), Some(want)) = (numel, bytes_of_box) else {
            return Err(err(FUNC, format!("{name}: a box of extents {:?} has more elements than memory", b.extent)));
        };
        if b.offset.checked_add(b.len).is_none() {
            return Err(err(FUNC, format!("{name}: a box at bytes {}+{} past any file", b.offset, b.len)));
        }
        if b.len != want as u64 {
            return Err(err(
                FUNC,
                format!("{name}: {}: a box of {numel} elements stored in {} bytes", path.display(), b.len),
            ));
        }
        if !files.contains_key(b.file.as_str()) {
            files.insert(&b.file, File::open(&path).map_err(io)?);
        }
        // a box that is the window is read straight into it
        let whole = b.extent.iter().zip(w).zip(&b.start).all(|((&e, r), &s)| r.start == s && r.len() == e);
        if !check && !whole && r > 0 {
            // no checksum to check (a plain file): only the window's runs are read
            let run = hi[r - 1] - lo[r - 1];
            let f = &files[b.file.as_str()];
            each_run(&lo, &hi, |idx| {
                let src: usize = (0..r).fold(0, |o, d| o * b.extent[d] + (idx[d] - b.start[d]));
                let dst: usize = (0..r).fold(0, |o, d| o * w[d].len() + (idx[d] - w[d].start));
                f.read_exact_at(&mut buf[dst * size..(dst + run) * size], b.offset + (src * size) as u64).map_err(
                    |e| {
                        err(
                            FUNC,
                            format!(
                                "{name}: {}: the bytes of a run cannot be read ({e}): the file is truncated",
                                path.display()
                            ),
                        )
                    },
                )?;
                covered += run;
                Ok(())
            })?;
            continue;
        }
        let f = &files[b.file.as_str()];
        let len = b.len as usize;
        let truncated = |at: usize, n: usize, e: std::io::Error| {
            err(
                FUNC,
                format!(
                    "{name}: {}: bytes {}..{} cannot be read ({e}): the file is truncated",
                    path.display(),
                    b.offset + at as u64,
                    b.offset + (at + n) as u64
                ),
            )
        };
        let mut sum = Sum::new();
        if whole {
            // chunk by chunk straight into the window, each checked while in cache
            let mut at = 0;
            while at < len {
                let n = CHUNK.min(len - at);
                let dst = &mut buf[at..at + n];
                f.read_exact_at(dst, b.offset + at as u64).map_err(|e| truncated(at, n, e))?;
                if check {
                    sum.update(dst);
                }
                at += n;
            }
            covered += numel;
        } else {
            // chunk by chunk into a scratch buffer, each checked, its part of each run along the
            // last axis of the intersection copied out; the runs rise through the box
            let mut scratch = vec![0u8; CHUNK.min(len)];
            let (mut from, mut to) = (0usize, 0usize);
            let mut next = |from: &mut usize, to: &mut usize, scratch: &mut Vec<u8>| -> Result<()> {
                let n = CHUNK.min(len - *to);
                f.read_exact_at(&mut scratch[..n], b.offset + *to as u64).map_err(|e| truncated(*to, n, e))?;
                sum.update(&scratch[..n]);
                (*from, *to) = (*to, *to + n);
                Ok(())
            };
            let run = hi[r - 1] - lo[r - 1];
            each_run(&lo, &hi, |idx| {
                let src: usize = (0..r).fold(0, |o, d| o * b.extent[d] + (idx[d] - b.start[d])) * size;
                let dst: usize = (0..r).fold(0, |o, d| o * w[d].len() + (idx[d] - w[d].start)) * size;
                let mut done = 0;
                while done < run * size {
                    while src + done >= to {
                        next(&mut from, &mut to, &mut scratch)?;
                    }
                    let take = (run * size - done).min(to - (src + done));
                    let at = src + done - from;
                    buf[dst + done..dst + done + take].copy_from_slice(&scratch[at..at + take]);
                    done += take;
                }
                covered += run;
                Ok(())
            })?;
            // the rest of the box, for its checksum
            while to < len {
                next(&mut from, &mut to, &mut scratch)?;
            }
        }
        if check && format!("{:016x}", sum.finish()) != b.fnv64 {
            return Err(err(
                FUNC,
                format!(
                    "{name}: {}: bytes {}..{} do not match their checksum: the file is corrupted",
                    path.display(),
                    b.offset,
                    b.offset + b.len
                ),
            ));
        }
    }
    Ok(covered)
}

impl<'d, T: Reducible> Tensor<'d, T> {
    /// Tensor `name` of the plain safetensors file `file` at `placement`: [`load_safetensors`].
    ///
    /// # Errors
    /// As [`load_safetensors`].
    pub fn load(ctx: &Ctx<'d>, file: impl AsRef<Path>, name: &str, placement: &Placement<'d>) -> Result<Self> {
        load_safetensors(ctx, file, name, placement)
    }
}

/// Calls `f` with the first index of each run of the box `lo..hi` along its last axis, in C
/// order (an odometer over the axes before the last); `lo` nonempty, every `lo[d] < hi[d]`.
fn each_run(lo: &[usize], hi: &[usize], mut f: impl FnMut(&[usize]) -> Result<()>) -> Result<()> {
    let r = lo.len();
    let mut idx = lo.to_vec();
    loop {
        f(&idx)?;
        let mut d = r - 1;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < hi[d] {
                break;
            }
            idx[d] = lo[d];
        }
    }
}
