//! `nx ckpt`: list a checkpoint, or merge it into one safetensors file.

use std::path::PathBuf;

/// The subcommands of `nx ckpt`.
#[derive(clap::Subcommand, Debug)]
pub enum Ckpt {
    /// The tensors of a checkpoint: names, dtypes, shapes, placements, boxes, bytes, checksums.
    Info {
        /// The checkpoint root (its `latest`) or one checkpoint's directory.
        dir: PathBuf,
    },
    /// Write every tensor whole into one safetensors file (read by Python's `safetensors`,
    /// PyTorch, Hugging Face).
    Merge {
        /// The checkpoint root (its `latest`) or one checkpoint's directory.
        dir: PathBuf,
        /// The file to write.
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
}

/// Runs `nx ckpt …`; answers what to print.
///
/// # Errors
/// The checkpoint's errors, in words.
pub fn ckpt(c: &Ckpt) -> Result<String, nx::Error> {
    match c {
        Ckpt::Info { dir } => {
            let ck = nx::ckpt::Checkpoint::open(dir)?;
            let ix = ck.index();
            let mut out = format!("{} (step {}, {} tensors)\n", ck.dir().display(), ix.step, ix.tensors.len());
            for t in &ix.tensors {
                let bytes: u64 = t.boxes.iter().map(|b| b.len).sum();
                let terms = if t.terms > 1 { format!(", saved as {} terms", t.terms) } else { String::new() };
                out.push_str(&format!(
                    "{}: {} {:?} at {}{terms}, {} boxes, {bytes} bytes\n",
                    t.name,
                    t.dtype,
                    t.shape,
                    t.placement,
                    t.boxes.len()
                ));
                for b in &t.boxes {
                    let term = if t.terms > 1 { format!(" term {}", b.term) } else { String::new() };
                    out.push_str(&format!(
                        "    {:?}+{:?}{term} in {} at bytes {}+{} checksum {}\n",
                        b.start, b.extent, b.file, b.offset, b.len, b.fnv64
                    ));
                }
            }
            if !ix.meta.is_null() {
                out.push_str(&format!("meta: {}\n", ix.meta));
            }
            Ok(out.trim_end().to_string())
        }
        Ckpt::Merge { dir, out } => {
            let n = nx::ckpt::merge(dir, out)?;
            Ok(format!("wrote {n} tensors to {}", out.display()))
        }
    }
}
