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
//!
//! **Hosts.** `--hosts a:2,b:2` goes to mpirun's `--host`; direct ranks fill the hosts in order
//! by slot and start through the agent (`AGENT HOST 'exec' 'env' 'NX_RANK=…' … PROGRAM …`), which
//! must pass signals on. The store listens where the hosts reach it, `NX_*` settings of this
//! environment reach every rank, and ranks that vanish with no record (their wrappers killed with
//! them: a host's processes, or the host) are reported by host.

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
    /// `--hosts a:4,b:4`: through mpirun's `--host`, or (direct) each rank through `agent`.
    pub hosts: Option<String>,
    /// The remote shell of direct ranks on `hosts` (`ssh`, or a cluster's agent), split at
    /// spaces: it is called as `AGENT HOST COMMAND` and must pass signals on to the command.
    pub agent: String,
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

/// A direct rank's place: its host (`None`: this one) and its rank and ranks there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The host it runs on through the agent; `None` for this host.
    pub host: Option<String>,
    /// Its rank among the ranks of its host.
    pub local: usize,
    /// The ranks of its host.
    pub local_size: usize,
}

/// The hosts and slots of `--hosts a:4,b:2` (a host without `:K` has one slot).
///
/// # Errors
/// A message naming an empty host, a bad slot count, or an empty list.
pub fn parse_hosts(text: &str) -> Result<Vec<(String, usize)>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let (host, slots) = match part.rsplit_once(':') {
            Some((h, k)) => (
                h,
                k.parse::<usize>()
                    .ok()
                    .filter(|&k| k > 0)
                    .ok_or_else(|| format!("--hosts: {part:?}: the slots must be a positive number"))?,
            ),
            None => (part, 1),
        };
        if host.trim().is_empty() {
            return Err(format!("--hosts: {text:?} names an empty host"));
        }
        out.push((host.trim().to_string(), slots));
    }
    Ok(out)
}

/// The places of `n` direct ranks: on this host, or filling the hosts in order, each up to its
/// slots (as mpirun places by slot).
///
/// # Errors
/// A message where `n` is more than the slots of the hosts.
pub fn places(n: usize, hosts: Option<&[(String, usize)]>) -> Result<Vec<Place>, String> {
    let Some(hosts) = hosts else {
        return Ok((0..n).map(|i| Place { host: None, local: i, local_size: n }).collect());
    };
    let mut out = Vec::new();
    for (h, slots) in hosts {
        let k = (*slots).min(n - out.len());
        out.extend((0..k).map(|i| Place { host: Some(h.clone()), local: i, local_size: k }));
    }
    if out.len() < n {
        let total: usize = hosts.iter().map(|h| h.1).sum();
        return Err(format!("-n {n} is more than the {total} slots of --hosts"));
    }
    Ok(out)
}

/// `word` quoted for a POSIX shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The address of this host that `host` reaches (the source address of a route to it), for
/// the store to listen on; `127.0.0.1` where the route cannot be found.
pub fn address_toward(host: &str) -> String {
    use std::net::{ToSocketAddrs, UdpSocket};
    let found = (host, 9).to_socket_addrs().ok().and_then(|mut a| a.find(|a| a.is_ipv4())).and_then(|to| {
        // a UDP socket's connect sends nothing: it only picks the route and its source address
        let s = UdpSocket::bind("0.0.0.0:0").ok()?;
        s.connect(to).ok()?;
        s.local_addr().ok()
    });
    found.map_or_else(|| "127.0.0.1".to_string(), |a| a.ip().to_string())
}

fn spawn(
    opts: &Options,
    id: usize,
    place: &Place,
    env: &[(String, String)],
    io: &mut JoinSet<()>,
) -> std::io::Result<(Child, Proc)> {
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
    } else if let Some(at) = place.host.as_deref() {
        // through the agent: the variables on the command line, every word quoted for the
        // remote shell, which execs the program (so that its end, a signal too, is the agent's)
        let mut words: Vec<String> = vec!["exec".into(), "env".into()];
        let vars = [
            ("NX_RANK", id.to_string()),
            ("NX_WORLD_SIZE", opts.n.to_string()),
            ("NX_LOCAL_RANK", place.local.to_string()),
            ("NX_LOCAL_WORLD_SIZE", place.local_size.to_string()),
        ];
        let all = vars.iter().map(|(k, v)| (k.to_string(), v.clone())).chain(env.iter().cloned());
        words.extend(all.map(|(k, v)| quote(&format!("{k}={v}"))));
        words.extend(opts.program.iter().map(|w| quote(w)));
        let mut agent = opts.agent.split_whitespace();
        let mut c = Command::new(agent.next().unwrap_or("ssh"));
        c.args(agent).arg(at).arg(words.join(" "));
        c
    } else {
        let mut c = Command::new(&opts.program[0]);
        c.args(&opts.program[1..]);
        c.env("NX_RANK", id.to_string())
            .env("NX_WORLD_SIZE", opts.n.to_string())
            .env("NX_LOCAL_RANK", place.local.to_string())
            .env("NX_LOCAL_WORLD_SIZE", place.local_size.to_string());
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
    let label = place.host.as_ref().map_or_else(|| id.to_string(), |h| format!("{id}@{h}"));
    let tag = (opts.tag_output && opts.mode == Mode::Direct).then(|| format!("[{label}] "));
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
    let mut env = vec![("NX_STORE".to_string(), store.addr.to_string()), ("NX_STORE_TOKEN".to_string(), token.clone())];
    // nx's settings in this environment reach every rank, on every host (mpirun passes only
    // what `-x` names to the ranks it starts elsewhere)
    let own =
        ["NX_STORE", "NX_STORE_TOKEN", "NX_RANK", "NX_WORLD_SIZE", "NX_LOCAL_RANK", "NX_LOCAL_WORLD_SIZE", "NX_AGENT"];
    env.extend(std::env::vars().filter(|(k, _)| k.starts_with("NX_") && !own.contains(&k.as_str())));
    let mpi = opts.mode == Mode::Mpi;
    let mut io = JoinSet::new();
    let mut waits: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut procs = Vec::new();
    let count = if mpi { 1 } else { opts.n };
    let hosts = match opts.hosts.as_deref().map(parse_hosts).transpose() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nx run: {e}");
            return 2;
        }
    };
    let places = match places(count, if mpi { None } else { hosts.as_deref() }) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("nx run: {e}");
            return 2;
        }
    };
    for (id, place) in places.iter().enumerate() {
        match spawn(&opts, id, place, &env, &mut io) {
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
        // ranks that ended with no record while the first failure recorded is a rank stopped
        // (SIGTERM) or none: their wrappers were killed too — the host's processes, or the host
        Some(Stop::Failed(..) | Stop::Recorded)
            if mpi
                && !lost(&store).is_empty()
                && first_failure(&store).is_none_or(|e| e.code == 128 + libc::SIGTERM) =>
        {
            report.lost(&lost(&store))
        }
        Some(Stop::Failed(..) | Stop::Recorded) if mpi && first_failure(&store).is_some() => {
            let e = first_failure(&store).expect("a failure");
            report.rank(&format!("rank {} (host {})", e.rank, e.host), &e.how, &e.seen, e.code)
        }
        Some(Stop::Failed(id, status)) => {
            let (how, code, _) = describe(&status);
            let who = match (&places[id].host, mpi) {
                (_, true) => "mpirun".to_string(),
                (Some(h), false) => format!("rank {id} (host {h})"),
                (None, false) => format!("rank {id}"),
            };
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

/// The ranks under mpirun that started and ended with no record.
fn lost(store: &Served) -> Vec<Started> {
    let ended: Vec<usize> = records::<Ended>(store, ENDED).iter().map(|e| e.rank).collect();
    let mut out: Vec<Started> =
        records::<Started>(store, STARTED).into_iter().filter(|s| !ended.contains(&s.rank)).collect();
    out.sort_by_key(|s| s.rank);
    out
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

    /// Ranks that vanished with no record (their wrappers killed with them), by host; answers
    /// 137 (as for a SIGKILL).
    fn lost(&self, lost: &[Started]) -> i32 {
        let mut hosts: Vec<&str> = Vec::new();
        for s in lost {
            if !hosts.contains(&s.host.as_str()) {
                hosts.push(&s.host);
            }
        }
        let by_host: Vec<String> = hosts
            .iter()
            .map(|h| {
                let ids: Vec<usize> = lost.iter().filter(|s| s.host == *h).map(|s| s.rank).collect();
                format!("{} (host {h})", ranks_named(&ids))
            })
            .collect();
        eprintln!(
            "nx run: {} ended with no record: killed with their wrappers (SIGKILL to the host's processes) or their host went down; the other ranks were stopped (SIGTERM, then SIGKILL after {:?})",
            by_host.join(", "),
            self.opts.grace
        );
        137
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
