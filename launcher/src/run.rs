//! `nx run`: starts the ranks, connects them through the store, and supervises them.
//!
//! Each rank (or `mpirun`, under `--mpi`) runs in a process group of its own. The first rank to
//! exit non-zero, die by a signal, or outlive `--timeout` stops the others: SIGTERM to every
//! group, `--grace` seconds, then SIGKILL. One report on stderr names that rank, its exit status
//! or signal, its panic message if any, the last lines of its stderr and the last collective it
//! named; `nx run` exits with that rank's status (128 + the signal for a signal). Ctrl-C or
//! SIGTERM to `nx run` reaches every rank the same way. Every group is killed before `nx run`
//! returns, so no process outlives it.

use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

/// How `nx run` starts the ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// N child processes of `nx run` itself.
    Direct,
    /// One `mpirun`, which starts the ranks (on this host or `hosts`).
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

/// Lines kept from each rank's stderr for the report.
const TAIL: usize = 12;

/// What the report keeps of a rank's stderr: its last lines, and its first panic (the line naming
/// where, then the message), wherever it was.
#[derive(Default)]
struct Seen {
    tail: VecDeque<String>,
    panic: Option<(String, Option<String>)>,
}

struct Rank {
    id: usize,
    pgid: i32,
    seen: Arc<Mutex<Seen>>,
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGPIPE => "SIGPIPE",
        _ => "a signal",
    }
}

fn describe(status: &ExitStatus) -> (String, i32) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exited with status {c}"), c),
        (None, Some(s)) => (format!("was killed by signal {s} ({})", signal_name(s)), 128 + s),
        _ => ("ended".into(), 1),
    }
}

fn killpg(pgid: i32, sig: i32) {
    // SAFETY: killpg has no memory-safety preconditions; a group that is gone answers ESRCH.
    unsafe {
        libc::killpg(pgid, sig);
    }
}

/// Forwards a child's stream line by line (whole lines: each `println!` holds the lock), tagged
/// with its rank if asked; keeps the last lines of stderr.
fn forward<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    set: &mut JoinSet<()>,
    stream: R,
    tag: Option<String>,
    err: bool,
    seen: Arc<Mutex<Seen>>,
) {
    set.spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let shown = match &tag {
                Some(t) => format!("{t}{line}"),
                None => line.clone(),
            };
            if err {
                eprintln!("{shown}");
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                match &mut s.panic {
                    None if line.contains("panicked at") => s.panic = Some((line.clone(), None)),
                    Some((_, msg @ None)) => *msg = Some(line.clone()),
                    _ => {}
                }
                if s.tail.len() == TAIL {
                    s.tail.pop_front();
                }
                s.tail.push_back(line);
            } else {
                println!("{shown}");
            }
        }
    });
}

fn spawn_rank(
    opts: &Options,
    id: usize,
    env: &[(String, String)],
    io: &mut JoinSet<()>,
) -> std::io::Result<(Child, Rank)> {
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
        c.args(&opts.program);
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
    let tag = opts.tag_output.then(|| if opts.mode == Mode::Mpi { String::new() } else { format!("[{id}] ") });
    if let Some(o) = child.stdout.take() {
        forward(io, o, tag.clone(), false, seen.clone());
    }
    if let Some(e) = child.stderr.take() {
        forward(io, e, tag, true, seen.clone());
    }
    Ok((child, Rank { id, pgid, seen }))
}

/// Why the run stopped early.
enum Stop {
    Failed(usize, ExitStatus),
    TimedOut,
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

async fn supervise(opts: Options) -> i32 {
    let token = match crate::store::random_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nx run: cannot make a token: {e}");
            return 1;
        }
    };
    let addr = match crate::store::serve(&opts.store_addr, token.clone()).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nx run: the store cannot listen on {}: {e}", opts.store_addr);
            return 1;
        }
    };
    let env = vec![("NX_STORE".to_string(), addr.to_string()), ("NX_STORE_TOKEN".to_string(), token.clone())];
    let mut io = JoinSet::new();
    let mut waits: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut ranks = Vec::new();
    let count = if opts.mode == Mode::Mpi { 1 } else { opts.n };
    for id in 0..count {
        match spawn_rank(&opts, id, &env, &mut io) {
            Ok((mut child, rank)) => {
                waits.spawn(async move { (id, child.wait().await) });
                ranks.push(rank);
            }
            Err(e) => {
                eprintln!("nx run: cannot start rank {id} ({}): {e}", opts.program[0]);
                stop(&ranks, &mut waits, opts.grace).await;
                return 127;
            }
        }
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let timeout = opts.timeout.unwrap_or(Duration::from_secs(u64::MAX / 4));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut left = count;
    let outcome = loop {
        tokio::select! {
            done = waits.join_next() => match done {
                Some(Ok((id, Ok(status)))) => {
                    if status.success() {
                        left -= 1;
                        if left == 0 {
                            break None;
                        }
                    } else {
                        break Some(Stop::Failed(id, status));
                    }
                }
                Some(Ok((id, Err(e)))) => {
                    eprintln!("nx run: cannot wait for rank {id}: {e}");
                    break Some(Stop::Interrupted("a wait failed"));
                }
                Some(Err(_)) | None => break None,
            },
            _ = &mut deadline => break Some(Stop::TimedOut),
            _ = tokio::signal::ctrl_c() => break Some(Stop::Interrupted("SIGINT")),
            _ = async { match &mut sigterm { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {
                break Some(Stop::Interrupted("SIGTERM"))
            }
        }
    };
    stop(&ranks, &mut waits, opts.grace).await;
    reap_by_token(&token);
    // let the forwarders flush what the ranks wrote
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while io.join_next().await.is_some() {} }).await;
    io.abort_all();
    match outcome {
        None => 0,
        Some(Stop::Failed(id, status)) => report(&opts, &ranks[id], &describe(&status).0, describe(&status).1),
        Some(Stop::TimedOut) => {
            let why = format!("ran past --timeout {:.0?}", timeout);
            report(&opts, &ranks[0], &why, 124)
        }
        Some(Stop::Interrupted(sig)) => {
            eprintln!("nx run: {sig}: every rank was stopped");
            130
        }
    }
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
async fn stop(ranks: &[Rank], waits: &mut JoinSet<(usize, std::io::Result<ExitStatus>)>, grace: Duration) {
    for r in ranks {
        killpg(r.pgid, libc::SIGTERM);
    }
    let _ = tokio::time::timeout(grace, async { while waits.join_next().await.is_some() {} }).await;
    for r in ranks {
        killpg(r.pgid, libc::SIGKILL);
    }
    while waits.join_next().await.is_some() {}
}

fn report(opts: &Options, rank: &Rank, why: &str, code: i32) -> i32 {
    let seen = rank.seen.lock().unwrap_or_else(|e| e.into_inner());
    let tail: Vec<String> = seen.tail.iter().cloned().collect();
    let who = if opts.mode == Mode::Mpi {
        // nx's MPI ranks name themselves when they fail: "nx: rank R failed: …"
        tail.iter()
            .find_map(|l| {
                l.strip_prefix("nx: rank ")
                    .and_then(|r| r.split(' ').next())
                    .map(|r| format!("rank {r} (under mpirun)"))
            })
            .unwrap_or_else(|| "mpirun".to_string())
    } else {
        format!("rank {}", rank.id)
    };
    let mut out =
        format!("nx run: {who} {why}; the other ranks were stopped (SIGTERM, then SIGKILL after {:?})\n", opts.grace);
    if let Some((at, msg)) = &seen.panic {
        out.push_str(&format!("  panic: {} ({})\n", msg.as_deref().unwrap_or("").trim(), at.trim()));
    }
    if let Some(c) = tail.iter().rev().find(|l| l.contains("nx collective")) {
        out.push_str(&format!("  last collective: {}\n", c.trim()));
    } else {
        out.push_str("  last collective: none reported on its stderr\n");
    }
    if tail.is_empty() {
        out.push_str("  its stderr was empty\n");
    } else {
        out.push_str("  last lines of its stderr:\n");
        for l in &tail {
            out.push_str(&format!("    | {l}\n"));
        }
    }
    eprint!("{out}");
    code
}
