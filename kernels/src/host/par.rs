//! The host library's thread pool and the sizes under which its work runs inline.
//!
//! A pool's size is by default the compute cores this process may use
//! ([`Cores::measured`](crate::facts::Cores::measured)); a library may be given its own. The
//! matrix products and factorisations (`faer`) run on the same pool with as many threads, so the
//! two never oversubscribe the machine. For each kind of work ([`Work`]) a threshold in elements
//! decides where it runs: under it, on the calling thread, in one piece (no hand-off to the pool);
//! from it, cut over the pool. Each threshold is measured by a probe the first time a library
//! needs it — the work itself timed inline and on the pool at doubling sizes, the smallest size
//! from which the pool wins twice running — and kept in a store (by default
//! `$XDG_CACHE_HOME/nx/host/` or `~/.cache/nx/host/`, one file per CPU model and pool size), from
//! which every later library on the machine reads it. A setting overrides both. The bits of every
//! result are the same under any threshold and any pool size.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::facts::{arch_string, Cores};
use crate::{Error, Result, Simd};

/// A kind of host work with its own threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Elementwise programs ([`Kernels::map`](crate::Kernels::map)): elements of the shape.
    Map,
    /// Reductions ([`Kernels::reduce`](crate::Kernels::reduce)): elements read.
    Reduce,
    /// Dtype conversions ([`Host::convert`](super::Host::convert)): elements converted.
    Convert,
}

impl Work {
    /// Every kind, in the order of [`Thresholds`]' fields.
    pub const ALL: [Work; 3] = [Work::Map, Work::Reduce, Work::Convert];

    /// Its name in a store's file and in messages (`map`, `reduce`, `convert`).
    pub fn name(self) -> &'static str {
        match self {
            Work::Map => "map",
            Work::Reduce => "reduce",
            Work::Convert => "convert",
        }
    }
}

/// A threshold for each kind of work, in elements: work of fewer runs inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Thresholds {
    /// For [`Work::Map`].
    pub map: usize,
    /// For [`Work::Reduce`].
    pub reduce: usize,
    /// For [`Work::Convert`].
    pub convert: usize,
}

impl Thresholds {
    /// The threshold of `work`.
    pub fn of(&self, work: Work) -> usize {
        match work {
            Work::Map => self.map,
            Work::Reduce => self.reduce,
            Work::Convert => self.convert,
        }
    }

    fn set(&mut self, work: Work, value: usize) {
        match work {
            Work::Map => self.map = value,
            Work::Reduce => self.reduce = value,
            Work::Convert => self.convert = value,
        }
    }
}

/// Where measured thresholds are kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Store {
    /// The user's cache: `$XDG_CACHE_HOME/nx/host/`, else `$HOME/.cache/nx/host/`; in memory
    /// only where neither is set.
    #[default]
    Cache,
    /// A directory of the caller's.
    Dir(PathBuf),
    /// Nowhere: each library measures (once) for itself.
    Memory,
}

impl Store {
    /// The directory of this store, where it has one.
    pub fn directory(&self) -> Option<PathBuf> {
        match self {
            Store::Cache => std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
                .map(|d| d.join("nx").join("host")),
            Store::Dir(d) => Some(d.clone()),
            Store::Memory => None,
        }
    }
}

/// The settings of a host library. Every field has a default: `HostOptions::default()` is the
/// measured machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostOptions {
    /// The pool's threads (default: the measured cores).
    pub threads: Option<usize>,
    /// Thresholds that override the measured ones, per kind (`None`: measured).
    pub map: Option<usize>,
    /// As `map`, for [`Work::Reduce`].
    pub reduce: Option<usize>,
    /// As `map`, for [`Work::Convert`].
    pub convert: Option<usize>,
    /// Where measured thresholds are kept.
    pub store: Store,
    /// The highest SIMD level the kernels may use (default: all the CPU has; a level above the
    /// CPU's is lowered to it): [`Simd::Baseline`] forces the portable path of every kernel nx writes
    /// (faer, rustfft and `half` pick theirs by the CPU).
    pub simd: Option<Simd>,
    /// How long one of the pool's threads keeps looking for work after a kernel ran on the pool,
    /// rather than sleeping at once (default [`WARM`]; zero: rayon's own sleep). A thread asleep
    /// took 60–90 µs to wake on a 2-core VM, longer than many of a training step's kernels.
    pub warm: Option<std::time::Duration>,
    /// Whether the thread that makes the library is the first of its pool's threads (the pool is
    /// then built at once, even of one thread): its calls run their splits from there, with no
    /// hand-off into the pool and back, and a library of one thread keeps every kernel on it
    /// (otherwise a kernel's own splits called from a thread outside any pool go to rayon's
    /// global pool). For a thread that runs one worker's whole program, as a simulated rank's.
    /// A thread is the first thread of one such pool in its lifetime (rayon keeps it there, and
    /// the pool's bookkeeping with it): a second is refused.
    pub this_thread: bool,
}

/// How long a pool's thread keeps looking for work after a kernel by default.
pub const WARM: std::time::Duration = std::time::Duration::from_millis(1);

/// Where a library's thresholds came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Measured by this library's probe (and written to the file named, where the store has one).
    Measured(Option<PathBuf>),
    /// Read from a store's file.
    Stored(PathBuf),
    /// A pool of one thread: everything inline, nothing to measure.
    OneThread,
}

/// The library's pool, shared by its clones.
#[derive(Debug)]
pub(crate) struct Par {
    threads: usize,
    cores_source: String,
    pool: Arc<OnceLock<Option<rayon::ThreadPool>>>,
    /// Keeps a thread of the pool looking for work between kernels.
    warm: Arc<super::warm::Warm>,
    options: HostOptions,
    measured: Arc<OnceLock<(Thresholds, Origin)>>,
    /// Fixed thresholds (a probe's forced modes) in place of the measured ones.
    forced: Option<usize>,
    /// What watches this library's calls.
    observer: Option<Arc<dyn crate::observe::Observer>>,
    /// The SIMD level its kernels run.
    simd: Simd,
}

impl Par {
    pub(crate) fn new(options: HostOptions) -> Result<Arc<Par>> {
        let func = "nx_kernels::Host::with_options";
        let (threads, cores_source) = match options.threads {
            Some(0) => return Err(Error::Invalid { func, why: "a pool of 0 threads".into() }),
            Some(n) => (n, format!("set to {n}")),
            None => {
                let c = Cores::measured();
                (c.count, c.source)
            }
        };
        for w in Work::ALL {
            let t = match w {
                Work::Map => options.map,
                Work::Reduce => options.reduce,
                Work::Convert => options.convert,
            };
            if t == Some(0) {
                return Err(Error::Invalid {
                    func,
                    why: format!("a {} threshold of 0 elements (1 is the least)", w.name()),
                });
            }
        }
        let simd = Simd::capped(options.simd);
        let warm = Arc::new(super::warm::Warm::new(options.warm.unwrap_or(WARM), options.this_thread));
        let pool = Arc::new(OnceLock::new());
        if options.this_thread {
            let built = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .use_current_thread()
                .thread_name(|i| format!("nx-host-{i}"))
                .build()
                .map_err(|e| Error::Invalid {
                    func,
                    why: format!("cannot start a pool of {threads} threads on this one: {e}"),
                })?;
            let _ = pool.set(Some(built));
        }
        Ok(Arc::new(Par {
            threads,
            cores_source,
            pool,
            warm,
            options,
            measured: Arc::default(),
            forced: None,
            observer: None,
            simd,
        }))
    }

    /// The SIMD level the library's kernels run.
    pub(crate) fn simd(&self) -> Simd {
        self.simd
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    pub(crate) fn cores_source(&self) -> &str {
        &self.cores_source
    }

    /// Builds the pool now (a library made by `with_options` reports a failure at once).
    pub(crate) fn start(&self) -> Result<()> {
        match self.pool() {
            Some(_) => Ok(()),
            None if self.threads == 1 => Ok(()),
            None => Err(Error::Invalid {
                func: "nx_kernels::Host::with_options",
                why: format!("cannot start a pool of {} threads", self.threads),
            }),
        }
    }

    /// The pool: none for one thread (its work runs on the caller's) but a pool on the thread that
    /// made the library ([`HostOptions::this_thread`]), or where threads cannot be started (then
    /// work runs on the caller's thread, splitting onto rayon's global pool).
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        if self.threads == 1 && !self.options.this_thread {
            return None;
        }
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("nx-host-{i}"))
                    .build()
                    .ok()
            })
            .as_ref()
    }

    /// Runs `f` on the pool (where this library has one of several threads).
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self.pool() {
            // a pool of one thread on another (a queued rig's worker calling): that thread runs
            // no loop that would take the work, so it runs here
            Some(p) if p.current_num_threads() == 1 && p.current_thread_index().is_none() => f(),
            Some(p) => {
                let r = p.install(f);
                self.warm.after(p);
                r
            }
            None => f(),
        }
    }

    /// Whether `elements` of `work` run inline (in a dry run, where nothing runs, without
    /// measuring anything).
    pub(crate) fn inline(&self, work: Work, elements: usize) -> bool {
        if self.observer.as_ref().is_some_and(|o| o.active()) {
            return true;
        }
        self.threads == 1 || elements < self.threshold(work)
    }

    /// The threshold of `work`: the setting, else the measured one.
    pub(crate) fn threshold(&self, work: Work) -> usize {
        if let Some(t) = self.forced {
            return t;
        }
        let set = match work {
            Work::Map => self.options.map,
            Work::Reduce => self.options.reduce,
            Work::Convert => self.options.convert,
        };
        set.unwrap_or_else(|| self.measured().0.of(work))
    }

    /// The thresholds in force and where the measured ones came from.
    pub(crate) fn thresholds(&self) -> (Thresholds, Origin) {
        let (mut t, origin) = self.measured().clone();
        for w in Work::ALL {
            t.set(w, self.threshold(w));
        }
        (t, origin)
    }

    /// The measured thresholds: read from the store, else probed (and written there).
    fn measured(&self) -> &(Thresholds, Origin) {
        self.measured.get_or_init(|| {
            if self.threads == 1 {
                let all = Thresholds { map: usize::MAX, reduce: usize::MAX, convert: usize::MAX };
                return (all, Origin::OneThread);
            }
            let file = self.options.store.directory().map(|d| d.join(self.file_name()));
            if let Some(t) = file.as_ref().and_then(|f| read_store(f)) {
                return (t, Origin::Stored(file.expect("read from it")));
            }
            let t = self.probe();
            let written = file.filter(|f| write_store(f, &t).is_ok());
            (t, Origin::Measured(written))
        })
    }

    /// The store's file for this CPU model and pool size.
    fn file_name(&self) -> String {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = info
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or(std::env::consts::ARCH.to_string(), |(_, v)| v.trim().to_string());
        format!("{}-{}t.json", arch_string(&model), self.threads)
    }

    /// Measures each kind's threshold: its work at 2¹⁰, 2¹¹, … elements timed inline and on the
    /// pool (the fastest of 5 interleaved runs each), the smallest size from which the pool won
    /// twice running; past 2¹⁸ elements without that (a busy machine: a probe that ran beside a
    /// build kept 2²² for every kind, which left a training step on one thread), 2¹⁸ — work that
    /// large gains from a second thread on any idle machine measured (its threshold was 2¹⁴ to
    /// 2¹⁶), whatever one probe saw.
    fn probe(&self) -> Thresholds {
        const LAST: usize = 1 << 18;
        let mut t = Thresholds { map: LAST, reduce: LAST, convert: LAST };
        let inline = Arc::new(Par { forced: Some(usize::MAX), ..self.shallow() });
        let split = Arc::new(Par { forced: Some(1), ..self.shallow() });
        for w in Work::ALL {
            let mut wins = 0;
            let mut n = 1 << 10;
            while n <= LAST {
                // memory refused (a tight limit): the sizes measured so far are all there is
                let Some(job) = super::probe_job(w, n) else { break };
                let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
                for _ in 0..5 {
                    a = a.min(time(|| job(&inline)));
                    b = b.min(time(|| self.install(|| job(&split))));
                }
                if b < a {
                    wins += 1;
                    if wins == 2 {
                        t.set(w, n / 2);
                        break;
                    }
                } else {
                    wins = 0;
                }
                n *= 2;
            }
        }
        t
    }

    /// A copy without a pool of its own: run under this one's `install`, its work splits onto it.
    fn shallow(&self) -> Par {
        Par {
            threads: self.threads,
            cores_source: String::new(),
            pool: Arc::new(OnceLock::from(None)),
            warm: self.warm.clone(),
            options: self.options.clone(),
            measured: Arc::default(),
            forced: None,
            observer: None,
            simd: self.simd,
        }
    }

    /// This library watched by `observer`: the same pool and thresholds.
    pub(crate) fn observed(&self, observer: Option<Arc<dyn crate::observe::Observer>>) -> Arc<Par> {
        Arc::new(Par {
            threads: self.threads,
            cores_source: self.cores_source.clone(),
            pool: self.pool.clone(),
            warm: self.warm.clone(),
            options: self.options.clone(),
            measured: self.measured.clone(),
            forced: self.forced,
            observer,
            simd: self.simd,
        })
    }

    /// What watches this library's calls.
    pub(crate) fn observer(&self) -> Option<&Arc<dyn crate::observe::Observer>> {
        self.observer.as_ref()
    }
}

/// `f(i)` for every `i` in `0..n`: in order on the calling thread where `inline`, else over the
/// current pool in pieces of at least `min` indices.
pub(crate) fn for_each(inline: bool, n: usize, min: usize, f: impl Fn(usize) + Send + Sync) {
    use rayon::prelude::*;
    if inline {
        (0..n).for_each(f);
    } else {
        (0..n).into_par_iter().with_min_len(min).for_each(f);
    }
}

/// As [`for_each`], with a state made by `init` once per piece (once in all where `inline`).
pub(crate) fn for_each_init<S>(
    inline: bool,
    n: usize,
    min: usize,
    init: impl Fn() -> S + Send + Sync,
    f: impl Fn(&mut S, usize) + Send + Sync,
) {
    use rayon::prelude::*;
    if inline {
        let mut state = init();
        (0..n).for_each(|i| f(&mut state, i));
    } else {
        (0..n).into_par_iter().with_min_len(min).for_each_init(init, f);
    }
}

fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoreFile {
    thresholds: Thresholds,
}

fn read_store(file: &std::path::Path) -> Option<Thresholds> {
    let text = std::fs::read_to_string(file).ok()?;
    let t = serde_json::from_str::<StoreFile>(&text).ok()?.thresholds;
    (t.map > 0 && t.reduce > 0 && t.convert > 0).then_some(t)
}

/// Writes `t` to `file` through a temporary file renamed into place, so a reader never sees half.
fn write_store(file: &std::path::Path, t: &Thresholds) -> std::io::Result<()> {
    let dir = file.parent().ok_or(std::io::ErrorKind::InvalidInput)?;
    std::fs::create_dir_all(dir)?;
    // a name no other writer, in this process or another, uses at once
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = dir.join(format!(
        ".{}.{:?}.{nanos}.{}",
        std::process::id(),
        std::thread::current().id(),
        file.file_name().unwrap_or_default().to_string_lossy()
    ));
    let text = serde_json::to_string_pretty(&StoreFile { thresholds: *t }).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}
