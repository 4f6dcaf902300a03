//! `nx rank -- PROGRAM ARGS`: the wrapper `nx run --mpi` starts every rank through, under mpirun
//! (not meant to be typed). It reads the rank's place from mpirun's environment and gives the
//! program nx's (`NX_RANK`, `NX_WORLD_SIZE`, `NX_LOCAL_RANK`, `NX_LOCAL_WORLD_SIZE`), streams its
//! output line by line to `nx run`'s store, which prints each line whole (mpirun's own forwarding
//! cuts long lines and interleaves ranks within them; without a store, the lines go to this
//! wrapper's own output, tagged `[R] `, or `[R@HOST] ` where the ranks span hosts, with
//! `--tag-output`), records in the store where it
//! runs ([`Started`]) and how it ended ([`Ended`]: status or signal, the panic, the last lines of
//! stderr, the last collective named, and its place in the order ranks ended), and ends as the
//! program did — the same status, or killed by the same signal — so that mpirun sees what it
//! would have seen. SIGTERM and SIGINT reach the program; if the wrapper itself is killed, the
//! program is too (Linux's parent-death signal). Any program is served, nx-based or not.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::process::Command;
use tokio::task::JoinSet;

use crate::child::{describe, forward, hostname, Seen, Sink};

/// Store keys: `nx/started/R`, `nx/ended/R`, and the counter that orders the ends.
pub const STARTED: &str = "nx/started/";
/// See [`STARTED`].
pub const ENDED: &str = "nx/ended/";
/// See [`STARTED`].
pub const ORDER: &str = "nx/order";

/// Arguments of `nx rank`.
#[derive(clap::Args, Debug)]
pub struct RankArgs {
    /// Prefix every output line with the rank, as `[3] `.
    #[arg(long)]
    tag_output: bool,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

/// Where a rank runs, as its wrapper records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Started {
    /// The rank.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// The program's process id.
    pub pid: u32,
}

/// How a rank ended, as its wrapper records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ended {
    /// The rank.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// Its place among the ranks' ends, from 1 (`i64::MAX` where the store could not count it).
    pub order: i64,
    /// In words: `exited with status 3`, `was killed by signal 9 (SIGKILL)`, `could not start: …`.
    pub how: String,
    /// The status `nx run` answers for it (128 + the signal for a signal).
    pub code: i32,
    /// Whether it failed (a status other than 0, or a signal).
    pub failed: bool,
    /// What its stderr showed.
    pub seen: Seen,
}

/// The rank's place from the launcher's environment: rank, ranks, rank on its host, ranks on its
/// host (Open MPI's variables, else PMI's and MPICH's).
fn place() -> Option<[usize; 4]> {
    let var = |names: &[&str]| names.iter().find_map(|n| std::env::var(n).ok()?.trim().parse::<usize>().ok());
    let rank = var(&["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"])?;
    let size = var(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])?;
    let local = var(&["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]).unwrap_or(0);
    let local_size = var(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]).unwrap_or(1);
    Some([rank, size, local, local_size])
}

/// Runs the wrapper; answers the status to exit with (after re-raising the program's signal, if
/// it died of one).
pub fn rank(a: &RankArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nx rank: cannot start: {e}");
            return 1;
        }
    };
    let (code, signal) = rt.block_on(wrap(a));
    drop(rt);
    if let Some(s) = signal {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: restoring the default action and raising the signal on this process have no
        // memory-safety preconditions; for a fatal signal the process ends here.
        unsafe {
            libc::signal(s, libc::SIG_DFL);
            libc::raise(s);
        }
    }
    code
}

/// Records `key` = `value` (JSON) in the store, where one is reachable.
fn record<T: Serialize>(store: &mut Option<nx::store::StoreClient>, key: &str, value: &T) {
    if let (Some(s), Ok(v)) = (store.as_mut(), serde_json::to_string(value)) {
        if let Err(e) = s.set(key, &v) {
            eprintln!("nx rank: cannot record {key} in the store: {e}");
        }
    }
}

async fn wrap(a: &RankArgs) -> (i32, Option<i32>) {
    let Some([rank, size, local, local_size]) = place() else {
        eprintln!("nx rank: no rank in the environment: nx run --mpi starts this wrapper under mpirun");
        return (2, None);
    };
    let host = hostname();
    // SIGTERM and SIGINT are the program's from the start (mpirun stops ranks with them)
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    // the store is where nx run learns of the rank; a program run without it still runs
    let mut store = match nx::store::StoreClient::from_env(Duration::from_secs(30)) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("nx rank: rank {rank}: {e}");
            None
        }
    };
    // the rank's place among the ends, taken as soon as it ends (a rank whose place is unknown
    // comes last)
    let order = |store: &mut Option<nx::store::StoreClient>| store.as_mut().and_then(|s| s.add(ORDER, 1).ok());
    let end = |store: &mut Option<nx::store::StoreClient>, order: Option<i64>, how: String, code: i32, seen: Seen| {
        let order = order.unwrap_or(i64::MAX);
        let ended = Ended { rank, host: host.clone(), order, how, code, failed: code != 0, seen };
        record(store, &format!("{ENDED}{rank}"), &ended);
    };
    let mut cmd = Command::new(&a.program[0]);
    cmd.args(&a.program[1..])
        .env("NX_RANK", rank.to_string())
        .env("NX_WORLD_SIZE", size.to_string())
        .env("NX_LOCAL_RANK", local.to_string())
        .env("NX_LOCAL_WORLD_SIZE", local_size.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: prctl in the forked child before exec, async-signal-safe; it asks the kernel to
    // SIGKILL the program when this wrapper dies, and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let how = format!("could not start {}: {e}", a.program[0]);
            eprintln!("nx rank: rank {rank} {how}");
            let at = order(&mut store);
            end(&mut store, at, how, 127, Seen::default());
            return (127, None);
        }
    };
    let pid = child.id().unwrap_or(0);
    record(&mut store, &format!("{STARTED}{rank}"), &Started { rank, host: host.clone(), pid });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut io = JoinSet::new();
    // ranks on several hosts: each line tagged with its host too
    let label = if local_size < size { format!("{rank}@{host}") } else { rank.to_string() };
    let (sink, writer) = match stream(&label).await {
        Ok((tx, writer)) => (Sink::Send(tx), Some(writer)),
        Err(e) => {
            if store.is_some() {
                eprintln!("nx rank: rank {rank} cannot stream its output to the store: {e}");
            }
            (Sink::Print(a.tag_output.then(|| format!("[{label}] "))), None)
        }
    };
    if let Some(o) = child.stdout.take() {
        forward(&mut io, o, sink.clone(), false, seen.clone());
    }
    if let Some(e) = child.stderr.take() {
        forward(&mut io, e, sink, true, seen.clone());
    }
    let status = loop {
        let pass = |s: i32| {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, s) };
        };
        tokio::select! {
            st = child.wait() => break st,
            Some(()) = async { match &mut term { Some(t) => t.recv().await, None => std::future::pending().await } } => pass(libc::SIGTERM),
            Some(()) = async { match &mut int { Some(t) => t.recv().await, None => std::future::pending().await } } => pass(libc::SIGINT),
        }
    };
    let at = order(&mut store);
    // the program's last lines, before the record
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while io.join_next().await.is_some() {} }).await;
    io.abort_all();
    if let Some(w) = writer {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match status {
        Ok(st) => {
            let (how, code, sig) = describe(&st);
            end(&mut store, at, how, code, seen);
            (code, sig)
        }
        Err(e) => {
            end(&mut store, at, format!("could not be waited for: {e}"), 1, seen);
            (1, None)
        }
    }
}

/// Opens the stream of this rank's output to the store (`STREAM LABEL`: the rank, or `R@HOST`
/// when the ranks span hosts): answers the channel its lines go into and the task that writes
/// them, which ends once every sender is gone and all is sent.
///
/// # Errors
/// Where the store is not in the environment, cannot be reached or refuses the token.
async fn stream(
    label: &str,
) -> std::io::Result<(tokio::sync::mpsc::UnboundedSender<(bool, String)>, tokio::task::JoinHandle<()>)> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
    let var = |k: &str| std::env::var(k).map_err(|_| std::io::Error::other(format!("{k} is not set")));
    let (addr, token) = (var("NX_STORE")?, var("NX_STORE_TOKEN")?);
    let sock = tokio::time::timeout(Duration::from_secs(30), tokio::net::TcpStream::connect(&addr))
        .await
        .map_err(|_| std::io::Error::other(format!("{addr} did not answer")))??;
    sock.set_nodelay(true)?;
    let (r, w) = sock.into_split();
    let mut w = BufWriter::new(w);
    w.write_all(format!("AUTH {token}\nSTREAM {label}\n").as_bytes()).await?;
    w.flush().await?;
    let mut reply = String::new();
    BufReader::new(r).read_line(&mut reply).await?;
    if reply.trim_end() != "OK" {
        return Err(std::io::Error::other(format!("the store refused this rank: {}", reply.trim_end())));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    let writer = tokio::spawn(async move {
        while let Some((err, line)) = rx.recv().await {
            let mut ok = w.write_all(format!("{} {line}\n", if err { 2 } else { 1 }).as_bytes()).await.is_ok();
            // write what else is waiting, then flush once
            while let (true, Ok((err, line))) = (ok, rx.try_recv()) {
                ok = w.write_all(format!("{} {line}\n", if err { 2 } else { 1 }).as_bytes()).await.is_ok();
            }
            if !ok || w.flush().await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    });
    Ok((tx, writer))
}
