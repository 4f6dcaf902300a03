//! The rendezvous store of `nx run`: a key-value store on tokio over TCP. Every client proves the
//! run's random token first; a connection without it is refused and logged. The protocol is
//! `nx::store`'s, plus `STREAM LABEL` (the rank, or `R@HOST`), which turns a connection into a
//! rank's output (`1 line` for stdout, `2 line` for stderr; no replies), printed here line by
//! line.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    map: HashMap<String, String>,
    barriers: HashMap<String, Barrier>,
}

/// A reusable barrier: the clients it waits for, how many have arrived in this round, and how
/// many rounds have passed (a client waits for the round it arrived in to pass).
#[derive(Debug)]
struct Barrier {
    n: i64,
    count: i64,
    round: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
    token: String,
    /// Prefix the lines of a rank's stream with `[R] `.
    tag: bool,
    /// Rank streams still open, and a notice when one ends.
    streams: std::sync::atomic::AtomicUsize,
    stream_ended: Notify,
}

/// The longest line the store reads (a key and its value, or a line of a rank's output): longer
/// ones end the connection, so that no client grows the store's memory without bound.
const MAX_LINE: usize = 1 << 20;

/// Reads one line of at most [`MAX_LINE`] bytes (without its newline); `None` at the end.
///
/// # Errors
/// The read's I/O error; `InvalidData` for a longer line or one that is not UTF-8.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    buf.clear();
    let n = r.take(MAX_LINE as u64 + 1).read_until(b'\n', buf).await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_LINE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a line past {MAX_LINE} bytes")));
    }
    String::from_utf8(std::mem::take(buf))
        .map(Some)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "a line that is not UTF-8"))
}

/// A random token: 16 bytes of the OS's randomness, in hex.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A store being served: where it listens, and its keys as `nx run` reads them.
pub struct Served {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Served {
    /// The value of `key`, or `None`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).map.get(key).cloned()
    }

    /// Every key that starts with `prefix`, with its value, in key order.
    pub fn with_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, String)> =
            st.map.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
        out.sort();
        out
    }

    /// Waits until a client next changes the store.
    pub async fn changed(&self) {
        self.shared.changed.notified().await
    }

    /// Waits until every rank's output stream has ended (its last lines printed), at most `limit`.
    pub async fn drain(&self, limit: Duration) {
        use std::sync::atomic::Ordering;
        let _ = tokio::time::timeout(limit, async {
            loop {
                let ended = self.shared.stream_ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if self.shared.streams.load(Ordering::SeqCst) == 0 {
                    return;
                }
                ended.await;
            }
        })
        .await;
    }
}

/// Binds the store to `bind` (`127.0.0.1:0` for any free port) and serves it on the current tokio
/// runtime; answers the served store. Lines that ranks stream to it (`STREAM LABEL`) are printed on
/// this process's stdout and stderr, each whole, prefixed `[LABEL] ` where `tag`.
///
/// # Errors
/// The bind's I/O error.
pub async fn serve(bind: &str, token: String, tag: bool) -> std::io::Result<Served> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        changed: Notify::new(),
        token,
        tag,
        streams: Default::default(),
        stream_ended: Notify::new(),
    });
    let served = Served { addr, shared: shared.clone() };
    tokio::spawn(async move {
        loop {
            let Ok((sock, peer)) = listener.accept().await else { continue };
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = client(sock, peer, shared).await {
                    eprintln!("nx run: store: {peer}: {e}");
                }
            });
        }
    });
    Ok(served)
}

/// A store served on a thread of its own, for programs without a runtime (tests). Stops when
/// dropped.
pub struct Background {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts a store on a background thread.
///
/// # Errors
/// The bind's I/O error.
pub fn start(bind: &str, token: &str) -> std::io::Result<Background> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (bind, token) = (bind.to_string(), token.to_string());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let r = serve(&bind, token, false).await.map(|s| s.addr);
            let ok = r.is_ok();
            let _ = tx.send(r);
            if ok {
                let _ = stop_rx.await;
            }
        });
    });
    let addr = rx.recv().map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(Background { addr, stop: Some(stop_tx), thread: Some(thread) })
}

async fn client(sock: TcpStream, peer: SocketAddr, shared: Arc<Shared>) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    match read_line(&mut r, &mut buf).await? {
        Some(l) if l.strip_prefix("AUTH ") == Some(shared.token.as_str()) => w.write_all(b"OK\n").await?,
        _ => {
            eprintln!("nx run: store: refused a client at {peer} without the run's token");
            w.write_all(b"ERR this store needs the run's token (NX_STORE_TOKEN)\n").await?;
            return Ok(());
        }
    }
    while let Some(line) = read_line(&mut r, &mut buf).await? {
        if let Some(rank) = line.strip_prefix("STREAM ") {
            // from here on the connection carries a rank's output: `1 line` (stdout) or `2 line`
            use std::sync::atomic::Ordering;
            let tag = shared.tag.then(|| format!("[{}] ", rank.trim()));
            shared.streams.fetch_add(1, Ordering::SeqCst);
            let out = stream(&mut r, &mut buf, tag.as_deref()).await;
            shared.streams.fetch_sub(1, Ordering::SeqCst);
            shared.stream_ended.notify_waiters();
            return out;
        }
        let reply = answer(&shared, &line).await;
        w.write_all(reply.as_bytes()).await?;
        w.write_all(b"\n").await?;
    }
    Ok(())
}

/// Prints a rank's stream of output lines, `1 line` for stdout and `2 line` for stderr, until it
/// ends.
///
/// # Errors
/// As [`read_line`].
async fn stream<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    tag: Option<&str>,
) -> std::io::Result<()> {
    while let Some(l) = read_line(r, buf).await? {
        let (which, text) = l.split_once(' ').unwrap_or((l.as_str(), ""));
        crate::child::print_line(tag, which == "2", text);
    }
    Ok(())
}

async fn wait_for(shared: &Shared, ms: u64, mut ready: impl FnMut(&State) -> Option<String>) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    loop {
        let notified = shared.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(v) = ready(&shared.state.lock().unwrap_or_else(|e| e.into_inner())) {
            return Some(v);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return None;
        }
    }
}

async fn answer(shared: &Shared, line: &str) -> String {
    let mut parts = line.splitn(3, ' ');
    let (cmd, a, b) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let lock = || shared.state.lock().unwrap_or_else(|e| e.into_inner());
    match cmd {
        "SET" if !a.is_empty() => {
            lock().map.insert(a.to_string(), b.to_string());
            shared.changed.notify_waiters();
            "OK".into()
        }
        "GET" => lock().map.get(a).map_or("NONE".into(), |v| format!("VAL {v}")),
        "ADD" => match b.parse::<i64>() {
            Ok(d) => {
                let mut st = lock();
                let cur: i64 = st.map.get(a).and_then(|v| v.parse().ok()).unwrap_or(0);
                let Some(sum) = cur.checked_add(d) else {
                    return format!("ERR ADD {a}: {cur} + {d} overflows a 64-bit integer");
                };
                st.map.insert(a.to_string(), sum.to_string());
                drop(st);
                shared.changed.notify_waiters();
                format!("VAL {sum}")
            }
            Err(_) => format!("ERR ADD {a}: {b:?} is not an integer"),
        },
        "WAIT" => match b.parse::<u64>() {
            Ok(ms) => match wait_for(shared, ms, |st| st.map.get(a).cloned()).await {
                Some(v) => format!("VAL {v}"),
                None => format!("ERR timed out after {ms} ms waiting for key {a:?}"),
            },
            Err(_) => format!("ERR WAIT {a}: {b:?} is not a number of milliseconds"),
        },
        "BARRIER" => {
            let mut nb = b.splitn(2, ' ');
            let (n, ms) = (nb.next().unwrap_or("").parse::<i64>(), nb.next().unwrap_or("").parse::<u64>());
            let (Ok(n), Ok(ms)) = (n, ms) else { return format!("ERR BARRIER {a}: give a count and milliseconds") };
            if n < 1 {
                return format!("ERR BARRIER {a}: a barrier of {n} clients");
            }
            // arrive in the current round; the last arrival ends it and opens the next
            let round = {
                let mut st = lock();
                let bar = st.barriers.entry(a.to_string()).or_insert(Barrier { n, count: 0, round: 0 });
                if bar.count > 0 && bar.n != n {
                    return format!("ERR barrier {a:?} waits for {} clients; this one asked for {n}", bar.n);
                }
                bar.n = n;
                bar.count += 1;
                let round = bar.round;
                if bar.count >= n {
                    bar.count = 0;
                    bar.round += 1;
                }
                round
            };
            shared.changed.notify_waiters();
            let passed = |st: &State| st.barriers.get(a).is_some_and(|bar| bar.round > round);
            match wait_for(shared, ms, |st| passed(st).then(String::new)).await {
                Some(_) => "OK".into(),
                None => {
                    // withdraw this arrival, unless the round passed meanwhile
                    let mut st = lock();
                    if passed(&st) {
                        return "OK".into();
                    }
                    let bar = st.barriers.get_mut(a).expect("arrived above");
                    bar.count -= 1;
                    format!("ERR barrier {a:?} timed out after {ms} ms with {} of {n} arrived", bar.count + 1)
                }
            }
        }
        _ => format!("ERR unknown command {line:?}"),
    }
}
