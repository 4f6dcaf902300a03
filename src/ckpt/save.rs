//! Saving: every rank writes its own boxes, rank 0 commits.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use nx_collectives::Reducible;

use super::{st_dtype, BoxEntry, Index, Sum, TensorEntry, CHUNK};
use crate::tensor::err;
use crate::{Ctx, Placement, Result, Tensor};

const FUNC: &str = "nx::ckpt::Saver";

/// The bytes of `v` as they lie in memory (little-endian on the hosts nx runs on).
pub(crate) fn bytes_of<T: nx_kernels::Element>(v: &[T]) -> &[u8] {
    // SAFETY: an `Element` (sealed: bools, integers, floats, complex pairs of floats) has no
    // padding, so `v` is `size_of_val(v)` initialised bytes; they are read, not written, while
    // `v` is borrowed, for as long.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Every rank's `mine` agreed: `Ok` where every rank's is, else on every rank an error naming the
/// first rank that failed (and, on that rank, its own error).
pub(crate) fn agree_ok(ctx: &Ctx<'_>, func: &'static str, mine: Result<()>) -> Result<()> {
    let n = ctx.devices().len();
    let rows = Placement::split(0, ctx.devices())?;
    let flag = i64::from(mine.is_err());
    let local = nx_kernels::Array::from_vec_on(ctx.rig(), &[1], vec![flag])?;
    let all = Tensor::from_local(ctx, &[n], &rows, Some(local))?.full()?.to_vec()?;
    mine?;
    match all.iter().position(|&f| f != 0) {
        Some(d) => Err(err(func, format!("device {d} failed to write its part; nothing was committed"))),
        None => Ok(()),
    }
}

/// Writes `bytes` to `path` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| err(FUNC, format!("{}: {e}", path.display()));
    let mut f = File::create(path).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Fsyncs a directory (its entries).
fn sync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|f| f.sync_all()).map_err(|e| err(FUNC, format!("{}: {e}", path.display())))
}

/// Writes a box's bytes where they lie (no staging copy) and answers their checksum.
type WriteBox = Box<dyn Fn(&mut dyn Write) -> Result<u64> + Send>;

/// A box this rank stores, written at the commit.
struct Stored {
    term: usize,
    name: String,
    dtype: safetensors::Dtype,
    start: Vec<usize>,
    extent: Vec<usize>,
    len: u64,
    write: WriteBox,
}

/// A checkpoint being saved: tensors added on every rank alike, then [`Saver::commit`].
pub struct Saver<'d> {
    ctx: Ctx<'d>,
    root: PathBuf,
    step: u64,
    tmp: PathBuf,
    entries: Vec<TensorEntry>,
    /// This rank's boxes.
    mine: Vec<Stored>,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stored({} {:?}+{:?})", self.name, self.start, self.extent)
    }
}

impl std::fmt::Debug for Saver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Saver({} step {}, {} tensors)", self.root.display(), self.step, self.entries.len())
    }
}

impl<'d> Saver<'d> {
    /// Starts checkpoint `step` under `root` (created where missing): rank 0 makes the temporary
    /// directory `ckpt-<step>.tmp` afresh. Every rank calls it.
    ///
    /// # Errors
    /// A root that cannot be created or written, on every rank.
    pub fn new(ctx: &Ctx<'d>, root: impl AsRef<Path>, step: u64) -> Result<Saver<'d>> {
        let root = root.as_ref().to_path_buf();
        let tmp = root.join(format!("ckpt-{step:010}.tmp"));
        let made = if ctx.rank() == 0 {
            (|| -> Result<()> {
                let io = |e: std::io::Error| err(FUNC, format!("{}: {e}", tmp.display()));
                fs::create_dir_all(&root).map_err(|e| err(FUNC, format!("{}: {e}", root.display())))?;
                if tmp.exists() {
                    fs::remove_dir_all(&tmp).map_err(io)?;
                }
                fs::create_dir(&tmp).map_err(io)
            })()
        } else {
            Ok(())
        };
        agree_ok(ctx, FUNC, made)?;
        Ok(Saver { ctx: ctx.clone(), root, step, tmp, entries: Vec::new(), mine: Vec::new() })
    }

    /// Adds `t` as `name`; a partial value is closed first (an all-reduce or reduce-scatter, as
    /// its plan says). Of the devices holding one window, the first stores it. Every rank calls
    /// it with the same names in the same order.
    ///
    /// # Errors
    /// A name already added; complex dtypes (safetensors has none); the collectives' errors.
    pub fn add<T: Reducible>(&mut self, name: &str, t: &Tensor<'d, T>) -> Result<()> {
        self.put(name, t, false)
    }

    /// Adds `t` as `name`, a partial value saved as its terms without closing it (no
    /// collective; each term's windows written once); [`crate::ckpt::Checkpoint::load`] sums them.
    /// A closed value is saved as [`Saver::add`] does.
    ///
    /// # Errors
    /// As [`Saver::add`].
    pub fn add_terms<T: Reducible>(&mut self, name: &str, t: &Tensor<'d, T>) -> Result<()> {
        self.put(name, t, true)
    }

    fn put<T: Reducible>(&mut self, name: &str, t: &Tensor<'d, T>, as_terms: bool) -> Result<()> {
        if self.entries.iter().any(|e| e.name == name) {
            return Err(err(FUNC, format!("{name:?} is added twice")));
        }
        if name == "__metadata__" || name.is_empty() {
            return Err(err(FUNC, format!("{name:?} is not a tensor name safetensors allows")));
        }
        let Some(dt) = st_dtype(T::DTYPE) else {
            return Err(err(FUNC, format!("{name}: {} has no safetensors dtype", T::DTYPE)));
        };
        let t = if t.placement.is_partial() && !as_terms { t.place(&t.placement.closed())? } else { t.clone() };
        let windows = t.placement.windows(&t.shape)?;
        let terms: Vec<usize> = (0..windows.len())
            .map(|d| t.placement.term(d).map(|x| x.unwrap_or(0)))
            .collect::<std::result::Result<_, _>>()?;
        let me = self.ctx.index();
        // the first device holding this window of this term
        let first = (0..windows.len()).find(|&d| windows[d] == windows[me] && terms[d] == terms[me]);
        if let (Some(w), Some(a), Some(first)) = (&windows[me], &t.local, first) {
            let n: usize = w.iter().map(|r| r.len()).product();
            if first == me && n > 0 {
                let a = if a.layout().is_contiguous() { a.clone() } else { a.copy()? };
                let what = name.to_string();
                self.mine.push(Stored {
                    term: terms[me],
                    name: name.to_string(),
                    dtype: dt,
                    start: w.iter().map(|r| r.start).collect(),
                    extent: w.iter().map(|r| r.len()).collect(),
                    len: (n * std::mem::size_of::<T>()) as u64,
                    write: Box::new(move |out: &mut dyn Write| {
                        a.with_slice(|v| {
                            let b = bytes_of(v);
                            // chunk by chunk, each summed while it is still in cache
                            let mut sum = Sum::new();
                            for c in b.chunks(CHUNK) {
                                out.write_all(c).map_err(|e| err(FUNC, format!("{what}: {e}")))?;
                                sum.update(c);
                            }
                            Ok(sum.finish())
                        })?
                    }),
                });
            }
        }
        self.entries.push(TensorEntry {
            name: name.to_string(),
            dtype: T::DTYPE.name().to_string(),
            shape: t.shape.clone(),
            placement: format!("{:#}", t.placement),
            boxes: Vec::new(),
            terms: t.placement.terms(),
        });
        Ok(())
    }

    /// Writes every rank's boxes (fsynced), agrees that all did, then rank 0 writes the index
    /// (with `meta`), renames the checkpoint into place and points `latest` at it, and removes the
    /// checkpoints older than the one before it (and older crashed saves' temporary directories). Answers the checkpoint's directory.
    ///
    /// # Errors
    /// A rank that fails to write (every rank then fails, nothing committed).
    pub fn commit(mut self, meta: serde_json::Value) -> Result<PathBuf> {
        let mine = std::mem::take(&mut self.mine);
        let wrote = write_rank(&self.tmp, self.ctx.rank(), &mine);
        self.finish(wrote, meta)
    }

    /// [`Saver::commit`] with this rank's file written by a thread of its own while the caller
    /// goes on (the next training steps): the windows are values no op changes, so holding them
    /// is the snapshot. [`PendingSave::wait`] ends the save (the agreement and the commit: every
    /// rank calls it).
    ///
    /// # Errors
    /// None here; [`PendingSave::wait`] answers the save's.
    pub fn commit_async(mut self, meta: serde_json::Value) -> PendingSave<'d> {
        let mine = std::mem::take(&mut self.mine);
        let (tmp, rank) = (self.tmp.clone(), self.ctx.rank());
        let writer = std::thread::Builder::new()
            .name(format!("nx-ckpt-{rank}"))
            .spawn(move || write_rank(&tmp, rank, &mine))
            .map_err(|e| err(FUNC, format!("cannot start the writer thread: {e}")));
        PendingSave { saver: self, writer, meta }
    }

    /// Agrees that every rank wrote, then rank 0 commits.
    fn finish(self, wrote: Result<()>, meta: serde_json::Value) -> Result<PathBuf> {
        let rank = self.ctx.rank();
        agree_ok(&self.ctx, FUNC, wrote)?;
        let dir = self.root.join(format!("ckpt-{:010}", self.step));
        let committed = if rank == 0 {
            (|| -> Result<()> {
                let mut entries = self.entries.clone();
                for r in 0..self.ctx.size() {
                    let path = self.tmp.join(format!("rank{r}.json"));
                    let text = fs::read(&path).map_err(|e| err(FUNC, format!("{}: {e}", path.display())))?;
                    let boxes: Vec<(String, BoxEntry)> =
                        serde_json::from_slice(&text).map_err(|e| err(FUNC, format!("{}: {e}", path.display())))?;
                    for (n, b) in boxes {
                        let e = entries
                            .iter_mut()
                            .find(|e| e.name == n)
                            .ok_or_else(|| err(FUNC, format!("rank {r} stored an unknown tensor {n}")))?;
                        e.boxes.push(b);
                    }
                    fs::remove_file(&path).map_err(|e| err(FUNC, format!("{}: {e}", path.display())))?;
                }
                for e in &mut entries {
                    e.boxes.sort_by(|a, b| (a.term, &a.start).cmp(&(b.term, &b.start)));
                }
                let index = Index { format: "nx-checkpoint-1".into(), step: self.step, tensors: entries, meta };
                let text = serde_json::to_vec_pretty(&index).map_err(|x| err(FUNC, x.to_string()))?;
                write_synced(&self.tmp.join("index.json"), &text)?;
                sync_dir(&self.tmp)?;
                // a checkpoint of this step already there (which `latest` may name) is moved aside
                // first and removed only once `latest` names the new one
                let aside = self.root.join(format!("ckpt-{:010}.old", self.step));
                let had = dir.exists();
                if had {
                    if aside.exists() {
                        fs::remove_dir_all(&aside).map_err(|e| err(FUNC, format!("{}: {e}", aside.display())))?;
                    }
                    fs::rename(&dir, &aside).map_err(|e| err(FUNC, format!("{}: {e}", dir.display())))?;
                }
                fs::rename(&self.tmp, &dir).map_err(|e| err(FUNC, format!("{}: {e}", dir.display())))?;
                sync_dir(&self.root)?;
                let latest = self.root.join("latest.tmp");
                write_synced(&latest, format!("ckpt-{:010}\n", self.step).as_bytes())?;
                fs::rename(&latest, self.root.join("latest"))
                    .map_err(|e| err(FUNC, format!("{}: {e}", latest.display())))?;
                sync_dir(&self.root)?;
                // committed: what follows only tidies, and a failure there is reported, not fatal
                if had {
                    if let Err(e) = fs::remove_dir_all(&aside) {
                        eprintln!("nx::ckpt: could not remove {}: {e}", aside.display());
                    }
                }
                if let Err(e) = prune(&self.root, self.step) {
                    eprintln!("{e}");
                }
                Ok(())
            })()
        } else {
            Ok(())
        };
        agree_ok(&self.ctx, FUNC, committed)?;
        Ok(dir)
    }
}

/// Writes this rank's file (the safetensors header, then each box from its window) and its
/// fragment of the index, both fsynced.
fn write_rank(tmp: &Path, rank: usize, mine: &[Stored]) -> Result<()> {
    let file = format!("rank{rank}.safetensors");

    let mut boxes: Vec<(String, BoxEntry)> = Vec::new();
    if !mine.is_empty() {
        // the safetensors header first (every box's size is known), then each box's bytes
        // straight from its window
        let mut header = serde_json::Map::new();
        let mut at = 0u64;
        for b in mine {
            header.insert(
                        b.name.clone(),
                        serde_json::json!({ "dtype": super::st_name(b.dtype), "shape": b.extent, "data_offsets": [at, at + b.len] }),
                    );
            at += b.len;
        }
        let mut text = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(|x| err(FUNC, x.to_string()))?;
        while text.len() % 8 != 0 {
            text.push(b' ');
        }
        let path = tmp.join(&file);
        let io = |e: std::io::Error| err(FUNC, format!("{}: {e}", path.display()));
        let f = File::create(&path).map_err(io)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, f);
        out.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
        out.write_all(&text).map_err(io)?;
        let data = 8 + text.len() as u64;
        let mut at = 0u64;
        for b in mine {
            let sum = (b.write)(&mut out)?;
            boxes.push((
                b.name.clone(),
                BoxEntry {
                    start: b.start.clone(),
                    extent: b.extent.clone(),
                    file: file.clone(),
                    offset: data + at,
                    len: b.len,
                    fnv64: format!("{sum:016x}"),
                    term: b.term,
                },
            ));
            at += b.len;
        }
        out.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    }
    let frag = serde_json::to_vec(&boxes).map_err(|x| err(FUNC, x.to_string()))?;
    write_synced(&tmp.join(format!("rank{rank}.json")), &frag)
}

/// A save whose files are being written ([`Saver::commit_async`]).
pub struct PendingSave<'d> {
    saver: Saver<'d>,
    writer: Result<std::thread::JoinHandle<Result<()>>>,
    meta: serde_json::Value,
}

impl std::fmt::Debug for PendingSave<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingSave({:?})", self.saver)
    }
}

impl PendingSave<'_> {
    /// Waits for this rank's files, agrees with every rank that all were written, and commits;
    /// answers the checkpoint's directory.
    ///
    /// # Errors
    /// As [`Saver::commit`]; a writer thread that panicked.
    pub fn wait(self) -> Result<PathBuf> {
        let wrote = match self.writer {
            Ok(h) => h.join().unwrap_or_else(|_| Err(err(FUNC, "the writer thread panicked".into()))),
            Err(e) => Err(e),
        };
        self.saver.finish(wrote, self.meta)
    }
}

/// Removes the committed checkpoints older than the newest one before `step` (the one just
/// committed, which `latest` names, and the one before it are kept; newer ones, of another run,
/// are left), and the temporary directories of saves older than `step` (crashed saves).
fn prune(root: &Path, step: u64) -> Result<()> {
    let steps = |suffix: &str| -> Result<Vec<(u64, PathBuf)>> {
        Ok(fs::read_dir(root)
            .map_err(|e| err(FUNC, format!("{}: {e}", root.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| {
                let n = p.file_name()?.to_str()?.strip_prefix("ckpt-")?.to_string();
                let k: u64 = if suffix.is_empty() { n.parse().ok()? } else { n.strip_suffix(suffix)?.parse().ok()? };
                Some((k, p))
            })
            .collect())
    };
    let mut done: Vec<(u64, PathBuf)> = steps("")?.into_iter().filter(|(k, _)| *k < step).collect();
    done.sort();
    done.pop(); // the newest before `step` stays
    for (_, old) in done {
        fs::remove_dir_all(&old).map_err(|e| err(FUNC, format!("{}: {e}", old.display())))?;
    }
    for (k, tmp) in steps(".tmp")? {
        if k < step {
            fs::remove_dir_all(&tmp).map_err(|e| err(FUNC, format!("{}: {e}", tmp.display())))?;
        }
    }
    Ok(())
}
