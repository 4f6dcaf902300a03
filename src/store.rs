//! The client of `nx run`'s rendezvous store: a key-value store over TCP that ranks use to meet
//! (and later to exchange NCCL unique ids).
//!
//! Protocol (one line each way, values without newlines): the client first proves the run's token
//! (`AUTH <token>` → `OK`), then `SET k v` → `OK`; `GET k` → `VAL v` or `NONE`; `WAIT k ms` → `VAL v`
//! or `ERR …`; `ADD k n` → `VAL total`; `BARRIER name n ms` → `OK` or `ERR …`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::{Error, Result};

/// A connection to the store.
#[derive(Debug)]
pub struct StoreClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    addr: String,
}

fn err(why: String) -> Error {
    Error::Invalid { func: "nx::store", why }
}

impl StoreClient {
    /// Connects to the store at `addr` (`host:port`) and proves `token`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the address where the store cannot be reached within `timeout`,
    /// or refuses the token.
    pub fn connect(addr: &str, token: &str, timeout: Duration) -> Result<StoreClient> {
        let sock =
            addr.parse::<std::net::SocketAddr>().map_err(|_| err(format!("NX_STORE={addr:?} is not host:port")))?;
        let stream = TcpStream::connect_timeout(&sock, timeout)
            .map_err(|e| err(format!("cannot reach the store at {addr}: {e} (is `nx run` still running?)")))?;
        stream.set_nodelay(true).ok();
        let writer = stream.try_clone().map_err(|e| err(e.to_string()))?;
        let mut c = StoreClient { reader: BufReader::new(stream), writer, addr: addr.to_string() };
        let r = c.call(&format!("AUTH {token}"), timeout)?;
        if r != "OK" {
            return Err(err(format!("the store at {addr} refused this client: {r}")));
        }
        Ok(c)
    }

    /// Connects with `NX_STORE` and `NX_STORE_TOKEN` from the environment (what `nx run` sets).
    ///
    /// # Errors
    /// As [`StoreClient::connect`]; [`Error::Invalid`] where the variables are missing.
    pub fn from_env(timeout: Duration) -> Result<StoreClient> {
        let addr = std::env::var("NX_STORE")
            .map_err(|_| err("NX_STORE is not set: start the program with `nx run`".into()))?;
        let token = std::env::var("NX_STORE_TOKEN").map_err(|_| err("NX_STORE_TOKEN is not set".into()))?;
        StoreClient::connect(&addr, &token, timeout)
    }

    fn call(&mut self, line: &str, timeout: Duration) -> Result<String> {
        self.writer
            .set_read_timeout(Some(timeout + Duration::from_secs(5)))
            .and_then(|_| self.reader.get_ref().set_read_timeout(Some(timeout + Duration::from_secs(5))))
            .map_err(|e| err(e.to_string()))?;
        writeln!(self.writer, "{line}").map_err(|e| err(format!("store {}: {e}", self.addr)))?;
        let mut reply = String::new();
        let n = self.reader.read_line(&mut reply).map_err(|e| err(format!("store {}: {e}", self.addr)))?;
        if n == 0 {
            return Err(err(format!("the store at {} closed the connection", self.addr)));
        }
        Ok(reply.trim_end().to_string())
    }

    fn value(&mut self, line: &str, timeout: Duration) -> Result<Option<String>> {
        let r = self.call(line, timeout)?;
        if let Some(v) = r.strip_prefix("VAL ") {
            Ok(Some(v.to_string()))
        } else if r == "NONE" {
            Ok(None)
        } else {
            Err(err(r.strip_prefix("ERR ").unwrap_or(&r).to_string()))
        }
    }

    /// Sets `key` to `value` (one line, no spaces in the key).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a lost connection or a key or value the protocol cannot carry.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        if key.contains(char::is_whitespace) || value.contains('\n') {
            return Err(err(format!("key {key:?} or value {value:?} has whitespace the protocol cannot carry")));
        }
        match self.call(&format!("SET {key} {value}"), Duration::from_secs(30))?.as_str() {
            "OK" => Ok(()),
            r => Err(err(r.to_string())),
        }
    }

    /// The value of `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a lost connection.
    pub fn get(&mut self, key: &str) -> Result<Option<String>> {
        self.value(&format!("GET {key}"), Duration::from_secs(30))
    }

    /// Waits for `key` to be set, at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the key when it is not set in time.
    pub fn wait(&mut self, key: &str, timeout: Duration) -> Result<String> {
        self.value(&format!("WAIT {key} {}", timeout.as_millis()), timeout)?
            .ok_or_else(|| err(format!("waiting for {key:?}: no value")))
    }

    /// Adds `delta` to the integer at `key` (0 if unset) atomically; answers the new total.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a lost connection or a key holding no integer.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let v = self.value(&format!("ADD {key} {delta}"), Duration::from_secs(30))?.unwrap_or_default();
        v.parse().map_err(|_| err(format!("ADD {key}: the store answered {v:?}")))
    }

    /// Waits until `n` clients have reached the barrier `name`, at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the barrier and how many arrived when it times out.
    pub fn barrier(&mut self, name: &str, n: usize, timeout: Duration) -> Result<()> {
        match self.call(&format!("BARRIER {name} {n} {}", timeout.as_millis()), timeout)?.as_str() {
            "OK" => Ok(()),
            r => Err(err(r.strip_prefix("ERR ").unwrap_or(r).to_string())),
        }
    }
}
