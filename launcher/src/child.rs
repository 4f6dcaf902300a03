//! What `nx run` and its per-rank wrapper keep of a child process: its output forwarded line by
//! line (whole lines, tagged with the rank on request), the last lines and first panic of its
//! stderr and the last collective it named, and its end in words.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use tokio::task::JoinSet;

/// Lines kept from a child's stderr for the report.
pub const TAIL: usize = 12;

/// What the report keeps of a child's stderr: its last lines, its first panic (the line naming
/// where, then the message), wherever it was, and the last line naming a collective.
#[derive(Default, Debug, Clone, Serialize, Deserialize)]
pub struct Seen {
    /// The last [`TAIL`] lines.
    pub tail: VecDeque<String>,
    /// The first panic: where, and its message.
    pub panic: Option<(String, Option<String>)>,
    /// The last line naming a collective (`nx collective …`).
    pub collective: Option<String>,
}

impl Seen {
    fn line(&mut self, line: &str) {
        match &mut self.panic {
            None if line.contains("panicked at") => self.panic = Some((line.to_string(), None)),
            Some((_, msg @ None)) => *msg = Some(line.to_string()),
            _ => {}
        }
        if line.contains("nx collective") {
            self.collective = Some(line.to_string());
        }
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
    }
}

/// Where forwarded lines go: this process's stdout and stderr, each line prefixed by the tag
/// where given, or a channel (to a stream of lines to `nx run`: `(true, line)` for stderr).
#[derive(Clone)]
pub enum Sink {
    /// Printed here.
    Print(Option<String>),
    /// Sent on.
    Send(tokio::sync::mpsc::UnboundedSender<(bool, String)>),
}

/// Forwards a child's stream to `sink` line by line, each line whole (bytes that are not UTF-8
/// shown as U+FFFD, never a reason to stop reading: a pipe left unread would block the child);
/// keeps what the report needs of stderr (`err`) in `seen`. Where the channel of a
/// [`Sink::Send`] closes, the lines are printed here instead. Ends at the stream's end.
pub fn forward<R: AsyncRead + Unpin + Send + 'static>(
    set: &mut JoinSet<()>,
    stream: R,
    sink: Sink,
    err: bool,
    seen: Arc<Mutex<Seen>>,
) {
    set.spawn(async move {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        let mut sink = sink;
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let end = buf.len() - usize::from(buf.ends_with(b"\n"));
            let line = String::from_utf8_lossy(&buf[..end]).into_owned();
            if err {
                seen.lock().unwrap_or_else(|e| e.into_inner()).line(&line);
            }
            let closed = match &sink {
                Sink::Print(tag) => {
                    print_line(tag.as_deref(), err, &line);
                    false
                }
                Sink::Send(tx) => match tx.send((err, line)) {
                    Ok(()) => false,
                    Err(back) => {
                        print_line(None, err, &back.0 .1);
                        true
                    }
                },
            };
            if closed {
                sink = Sink::Print(None);
            }
        }
    });
}

/// Writes `line` whole on stdout (or stderr where `err`), prefixed by `tag` where given; a closed
/// stdout (`nx run … | head`) loses the line, never the run.
pub fn print_line(tag: Option<&str>, err: bool, line: &str) {
    use std::io::Write;
    let tag = tag.unwrap_or("");
    let _ = if err {
        writeln!(std::io::stderr().lock(), "{tag}{line}")
    } else {
        writeln!(std::io::stdout().lock(), "{tag}{line}")
    };
}

/// A signal's name, where it is one of those a rank dies of.
pub fn signal_name(sig: i32) -> &'static str {
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
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => "a signal",
    }
}

/// How a child ended, in words (`exited with status 3`, `was killed by signal 9 (SIGKILL)`), the
/// exit status `nx run` answers for it (128 + the signal for a signal), and the signal.
pub fn describe(status: &ExitStatus) -> (String, i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exited with status {c}"), c, None),
        (None, Some(s)) => (format!("was killed by signal {s} ({})", signal_name(s)), 128 + s, Some(s)),
        _ => ("ended".into(), 1, None),
    }
}

/// This host's name (`gethostname`), or `?`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it or
    // truncates (we stop at the first NUL or the end).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
