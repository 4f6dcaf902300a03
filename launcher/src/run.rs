//! `nx run`: starts the ranks, connects them through the store, and supervises them.
//!
//! Ranks start as child processes of `nx run` (`--direct`), or under `--mpi` through one `mpirun`
//! that starts each rank through `nx rank` ([`crate::rank`]), a wrapper of nx's own: it sets the
//! rank's variables, streams its lines to the store (which prints each whole, tagged on request:
//! mpirun's own forwarding cuts long lines), and records there where the rank runs and how it
//! ended, so that reports name ranks in both modes, for any program. Each child of `nx run` runs
//! in a process group of its own. The first rank to exit non-zero or die by a signal, or the
//! ranks still running at `--timeout`, stop the others: SIGTERM to every group, `--grace`
//! seconds, then SIGKILL. One report on stderr names that rank (its host under mpirun), its exit
//! status or signal, its panic message if any, the last lines of its stderr and the last
//! collective it named; `nx run` exits with that rank's status (128 + the signal for a signal;
//! 124 for a timeout). Ctrl-C or SIGTERM to `nx run` reaches every rank the same way. Every
//! process the run started is killed before `nx run` returns, so none outlives it.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use crate::child::{describe, forward, Seen, Sink};
use crate::rank::{Ended, Started, ENDED, STARTED};
use crate::store::Served;

/// How `nx run` starts the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// N child processes of `nx run` itself.
    Direct,
    /// One `mpirun`, which starts the ranks (on this host or `hosts`), each through `nx rank`.
    Mpi,
}

/// The options of `nx run`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ranks.
    pub n: usize,
    /// How to start them.
    pub mode: Mode,
    /// `--hosts a:4,b:4` (MPI only).
    pub hosts: Option<String>,
    /// Stop everything after this long.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Prefix every output line with its rank.
    pub tag_output: bool,
    /// Where the store listens.
    pub store_addr: String,
    /// The program and its arguments.
    pub program: Vec<String>,
}

/// A child of `nx run`: a rank (direct) or mpirun.
struct Proc {
    pgid: i32,
    seen: Arc<Mutex<Seen>>,
}

fn killpg(pgid: i32, sig: i32) {
    // SAFETY: killpg has no memory-safety preconditions; a group that is gone answers ESRCH.
    unsafe {
        libc::killpg(pgid, sig);
    }
}

fn spawn(opts: &Options, id: usize, env: &[(String, String)], io: &mut JoinSet<()>) -> std::io::Result<(Child, Proc)> {
    let mut cmd = if opts.mode == Mode::Mpi {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "-n", &opts.n.to_string()]);
        if let Some(h) = &opts.hosts {
            c.args(["--host", h]);
        }
        for (k, _) in env {
            c.args(["-x", k]);
        }
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        // every rank through the wrapper: this very binary
        c.arg(std::env::current_exe()?).arg("rank");
        if opts.tag_output {
            c.arg("--tag-output");
        }
        c.arg("--").args(&opts.program);
        c
    } else {
        let mut c = Command::new(&opts.program[0]);
        c.args(&opts.program[1..]);
        c.env("NX_RANK", id.to_string())
            .env("NX_WORLD_SIZE", opts.n.to_string())
            .env("NX_LOCAL_RANK", id.to_string())
            .env("NX_LOCAL_WORLD_SIZE", opts.n.to_string());
        c
    };
    cmd.envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pgid = child.id().map_or(0, |p| p as i32);
    let seen = Arc::new(Mutex::new(Seen::default()));
    // under mpirun the ranks' lines come through the store, tagged there; mpirun's own go as they are
    let tag = (opts.tag_output && opts.mode == Mode::Direct).then(|| format!("[{id}] "));
    if let Some(o) = child.stdout.take() {
        forward(io, o, Sink::Print(tag.clone()), false, seen.clone());
    }
    if let Some(e) = child.stderr.take() {
        forward(io, e, Sink::Print(tag), true, seen.clone());
    }
    Ok((child, Proc { pgid, seen }))
}

/// Why the run stopped early.
enum Stop {
    /// Child `id` (a rank, or mpirun) ended with `status`.
    Failed(usize, ExitStatus),
    /// A rank's wrapper recorded a failure (under mpirun).
    Recorded,
    /// The timeout passed while these children (direct) were still running.
    TimedOut(Vec<usize>),
    Interrupted(&'static str),
}

/// Runs the program as the options say; answers `nx run`'s exit status.
pub fn run(opts: Options) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nx run: cannot start: {e}");
            return 1;
        }
    };
    rt.block_on(supervise(opts))
}

/// The records of the ranks' wrappers with the prefix `key`, by rank.
fn records<T: serde::de::DeserializeOwned>(store: &Served, key: &str) -> Vec<T> {
    store.with_prefix(key).into_iter().filter_map(|(_, v)| serde_json::from_str(&v).ok()).collect()
}

/// The first rank to fail, by the order the wrappers ended in.
fn first_failure(store: &Served) -> Option<Ended> {
    records::<Ended>(store, ENDED).into_iter().filter(|e| e.failed).min_by_key(|e| e.order)
}

async fn supervise(opts: Options) -> i32 {
    let token = match crate::store::random_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nx run: cannot make a token: {e}");
            return 1;
        }
    };
    let store = match crate::store::serve(&opts.store_addr, token.clone(), opts.tag_output).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nx run: the store cannot listen on {}: {e}", opts.store_addr);
            return 1;
        }
    };
    let env = vec![("NX_STORE".to_string(), store.addr.to_string()), ("NX_STORE_TOKEN".to_string(), token.clone())];
    let mpi = opts.mode == Mode::Mpi;
    let mut io = JoinSet::new();
    let mut waits: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut procs = Vec::new();
    let count = if mpi { 1 } else { opts.n };
    for id in 0..count {
        match spawn(&opts, id, &env, &mut io) {
            Ok((mut child, p)) => {
                waits.spawn(async move { (id, child.wait().await) });
                procs.push(p);
            }
            Err(e) => {
                let what = if mpi { "mpirun".to_string() } else { format!("rank {id} ({})", opts.program[0]) };
                eprintln!("nx run: cannot start {what}: {e}");
                stop(&procs, &mut waits, opts.grace).await;
                return 127;
            }
        }
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let timeout = opts.timeout.unwrap_or(Duration::from_secs(u64::MAX / 4));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut running = vec![true; count];
    let outcome = loop {
        if mpi && first_failure(&store).is_some() {
            break Some(Stop::Recorded);
        }
        tokio::select! {
            done = waits.join_next() => match done {
                Some(Ok((id, Ok(status)))) => {
                    running[id] = false;
                    if !status.success() {
                        break Some(Stop::Failed(id, status));
                    }
                    if !running.contains(&true) {
                        break None;
                    }
                }
                Some(Ok((id, Err(e)))) => {
                    eprintln!("nx run: cannot wait for rank {id}: {e}");
                    break Some(Stop::Interrupted("a wait failed"));
                }
                Some(Err(_)) | None => break None,
            },
            _ = store.changed() => {}
            // a change between two waits on the store is seen at the next look
            _ = tokio::time::sleep(Duration::from_millis(200)), if mpi => {}
            _ = &mut deadline => break Some(Stop::TimedOut((0..count).filter(|&i| running[i]).collect())),
            _ = tokio::signal::ctrl_c() => break Some(Stop::Interrupted("SIGINT")),
            _ = async { match &mut sigterm { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {
                break Some(Stop::Interrupted("SIGTERM"))
            }
        }
    };
    // under mpirun, the ranks that had not ended when the run stopped
    let unfinished: Vec<Started> = {
        let ended: Vec<usize> = records::<Ended>(&store, ENDED).iter().map(|e| e.rank).collect();
        records::<Started>(&store, STARTED).into_iter().filter(|s| !ended.contains(&s.rank)).collect()
    };
    if matches!(outcome, Some(Stop::Recorded)) {
        // mpirun stops the job of a failed rank itself: let it (a signal now would interrupt
        // its own abort), then stop what is left
        let _ = tokio::time::timeout(opts.grace, async { while waits.join_next().await.is_some() {} }).await;
    }
    stop(&procs, &mut waits, opts.grace).await;
    reap_by_token(&token);
    // let the forwarders and the ranks' streams print what the ranks wrote
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while io.join_next().await.is_some() {} }).await;
    io.abort_all();
    store.drain(Duration::from_secs(2)).await;
    let report = Report { opts: &opts, store: &store };
    match outcome {
        None => 0,
        Some(Stop::Failed(..) | Stop::Recorded) if mpi && first_failure(&store).is_some() => {
            let e = first_failure(&store).expect("a failure");
            report.rank(&format!("rank {} (host {})", e.rank, e.host), &e.how, &e.seen, e.code)
        }
        Some(Stop::Failed(id, status)) => {
            let (how, code, _) = describe(&status);
            let who = if mpi { "mpirun".to_string() } else { format!("rank {id}") };
            let seen = procs[id].seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            report.rank(&who, &how, &seen, code)
        }
        Some(Stop::Recorded) => 1,
        Some(Stop::TimedOut(direct)) => {
            let why = format!("ran past --timeout {timeout:.0?}");
            if mpi {
                report.hung(&unfinished, &why)
            } else {
                let seen = procs[direct[0]].seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
                report.rank(&ranks_named(&direct), &why, &seen, 124);
                124
            }
        }
        Some(Stop::Interrupted(sig)) => {
            eprintln!("nx run: {sig}: every rank was stopped");
            130
        }
    }
}

/// `rank 2`, or `ranks 1, 2`.
fn ranks_named(ids: &[usize]) -> String {
    let list: Vec<String> = ids.iter().map(|r| r.to_string()).collect();
    format!("rank{} {}", if ids.len() == 1 { "" } else { "s" }, list.join(", "))
}

/// SIGKILLs every process whose environment holds this run's store token: the ranks `nx run`
/// started, wherever they went (mpirun's ranks live in process groups of their own). Matches the
/// run's random secret, never a name.
fn reap_by_token(token: &str) {
    let needle = format!("NX_STORE_TOKEN={token}");
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
}

/// SIGTERM to every group, `grace`, SIGKILL to every group; waits for the children.
async fn stop(procs: &[Proc], waits: &mut JoinSet<(usize, std::io::Result<ExitStatus>)>, grace: Duration) {
    for p in procs {
        killpg(p.pgid, libc::SIGTERM);
    }
    let _ = tokio::time::timeout(grace, async { while waits.join_next().await.is_some() {} }).await;
    for p in procs {
        killpg(p.pgid, libc::SIGKILL);
    }
    while waits.join_next().await.is_some() {}
}

/// The root-cause report on stderr.
struct Report<'a> {
    opts: &'a Options,
    store: &'a Served,
}

impl Report<'_> {
    /// `who` `why`: its panic, last collective and stderr's last lines; answers `code`.
    fn rank(&self, who: &str, why: &str, seen: &Seen, code: i32) -> i32 {
        let mut out = format!(
            "nx run: {who} {why}; the other ranks were stopped (SIGTERM, then SIGKILL after {:?})\n",
            self.opts.grace
        );
        if let Some((at, msg)) = &seen.panic {
            out.push_str(&format!("  panic: {} ({})\n", msg.as_deref().unwrap_or("").trim(), at.trim()));
        }
        match &seen.collective {
            Some(c) => out.push_str(&format!("  last collective: {}\n", c.trim())),
            None => out.push_str("  last collective: none reported on its stderr\n"),
        }
        if seen.tail.is_empty() {
            out.push_str("  its stderr was empty\n");
        } else {
            out.push_str("  last lines of its stderr:\n");
            for l in &seen.tail {
                out.push_str(&format!("    | {l}\n"));
            }
        }
        eprint!("{out}");
        code
    }

    /// The ranks under mpirun still running at the timeout, by their records (their stderr as
    /// their wrappers recorded it once stopped); answers 124.
    fn hung(&self, unfinished: &[Started], why: &str) -> i32 {
        let Some(first) = unfinished.first() else {
            let n = records::<Started>(self.store, STARTED).len();
            eprintln!("nx run: the run {why} with {n} of {} ranks started and none running", self.opts.n);
            return 124;
        };
        let ids: Vec<usize> = unfinished.iter().map(|s| s.rank).collect();
        let named: Vec<String> =
            unfinished.iter().map(|s| format!("{} (host {}, pid {})", s.rank, s.host, s.pid)).collect();
        let seen = self
            .store
            .get(&format!("{ENDED}{}", first.rank))
            .and_then(|v| serde_json::from_str::<Ended>(&v).ok())
            .map(|e| e.seen)
            .unwrap_or_default();
        let who = format!("rank{} {}", if ids.len() == 1 { "" } else { "s" }, named.join(", "));
        self.rank(&who, why, &seen, 124)
    }
}
