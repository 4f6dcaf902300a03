//! The rendezvous store of `nx run`: a key-value store on tokio over TCP. Every client proves the
//! run's random token first; a connection without it is refused and logged. The protocol is
//! `nx::store`'s.

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
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
    token: String,
}

/// A random token: 16 bytes of the OS's randomness, in hex.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Binds the store to `bind` (`127.0.0.1:0` for any free port) and serves it on the current tokio
/// runtime; answers the bound address.
///
/// # Errors
/// The bind's I/O error.
pub async fn serve(bind: &str, token: String) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Notify::new(), token });
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
    Ok(addr)
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
            let r = serve(&bind, token).await;
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
    let mut lines = BufReader::new(r).lines();
    match lines.next_line().await? {
        Some(l) if l.strip_prefix("AUTH ") == Some(shared.token.as_str()) => w.write_all(b"OK\n").await?,
        _ => {
            eprintln!("nx run: store: refused a client at {peer} without the run's token");
            w.write_all(b"ERR this store needs the run's token (NX_STORE_TOKEN)\n").await?;
            return Ok(());
        }
    }
    while let Some(line) = lines.next_line().await? {
        let reply = answer(&shared, &line).await;
        w.write_all(reply.as_bytes()).await?;
        w.write_all(b"\n").await?;
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
                st.map.insert(a.to_string(), (cur + d).to_string());
                drop(st);
                shared.changed.notify_waiters();
                format!("VAL {}", cur + d)
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
            let key = format!("\u{1}barrier/{a}");
            {
                let mut st = lock();
                let cur: i64 = st.map.get(&key).and_then(|v| v.parse().ok()).unwrap_or(0);
                st.map.insert(key.clone(), (cur + 1).to_string());
            }
            shared.changed.notify_waiters();
            let done = wait_for(shared, ms, |st| {
                let c: i64 = st.map.get(&key).and_then(|v| v.parse().ok()).unwrap_or(0);
                (c >= n).then(String::new)
            })
            .await;
            match done {
                Some(_) => "OK".into(),
                None => {
                    let c = lock().map.get(&key).cloned().unwrap_or_default();
                    format!("ERR barrier {a:?} timed out after {ms} ms with {c} of {n} arrived")
                }
            }
        }
        _ => format!("ERR unknown command {line:?}"),
    }
}
