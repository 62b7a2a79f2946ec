//! Real server processes ("nodes") sharing one PostgreSQL database, for the multi-node tests:
//! start, `SIGKILL`, `SIGSTOP`/`SIGCONT` and restart the `server` example; plain HTTP/1.0
//! requests and a Server-Sent Events reader over `std::net::TcpStream`; a client that spreads a
//! workload over the live nodes; and a consistent snapshot of the database read with the sync
//! `postgres` client: the crash matrix's [`StoreView`] (so its store-wide invariants apply as
//! they are) plus what only PostgreSQL records (each event's node and epoch, owners, nodes).
//!
//! Everything here blocks: call it from a plain `#[test]` thread (the sync `postgres` client
//! panics inside a tokio runtime).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable_sessions::kind;
use postgres::{Client, NoTls};
use serde_json::Value;

use super::{server_binary, EventRow, InputRow, MessageRow, SessionRow, StoreView};

/// How long a node may take to start listening.
const START_WAIT: Duration = Duration::from_secs(30);
/// The read timeout of a plain request (an admission or an interrupt answers in milliseconds).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Milliseconds since the Unix epoch (the clock the nodes stamp events with: same machine).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How a node runs (the `server` example's flags).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// `--lease-ms`.
    pub lease: Duration,
    /// `--word-delay-ms`: the echo agent's pause before each word of a reply.
    pub word_delay: Duration,
    /// `--max-resume-attempts`.
    pub max_resume_attempts: u32,
    /// The PostgreSQL server's log, whose errors a failure message shows (the nodes log only
    /// "db error").
    pub server_log: Option<PathBuf>,
}

/// One `server` process on the shared database; killed (and reaped) on drop, continued first
/// when it is stopped.
#[derive(Debug)]
pub struct Node {
    /// `--node-name` (kept across restarts; the node id changes with every boot).
    pub name: String,
    url: String,
    options: NodeOptions,
    logs: PathBuf,
    /// Boots so far (the log files are numbered by it).
    generation: u32,
    process: Option<Child>,
    addr: String,
    paused: bool,
}

impl Node {
    /// Starts node `name` on `url`, its stdout and stderr in files under `logs`, and waits until
    /// it listens (its runtime has started, so its `node` row exists).
    pub fn start(logs: &Path, url: &str, name: &str, options: &NodeOptions) -> Node {
        let mut node = Node {
            name: name.to_owned(),
            url: url.to_owned(),
            options: options.clone(),
            logs: logs.to_owned(),
            generation: 0,
            process: None,
            addr: String::new(),
            paused: false,
        };
        node.boot();
        node
    }

    fn out_path(&self) -> PathBuf {
        self.logs
            .join(format!("{}.{}.out", self.name, self.generation))
    }

    fn err_path(&self) -> PathBuf {
        self.logs
            .join(format!("{}.{}.err", self.name, self.generation))
    }

    fn boot(&mut self) {
        assert!(self.process.is_none(), "{}: already running", self.name);
        self.generation += 1;
        let stdout = File::create(self.out_path()).expect("node stdout file");
        let stderr = File::create(self.err_path()).expect("node stderr file");
        // Run through a link of our own name, so that whoever stops "server" processes by name
        // on this machine (`pkill server`, `killall server`) leaves this test's nodes alone.
        let program = self.logs.join("ds-multi-node");
        if !program.exists() {
            std::os::unix::fs::symlink(server_binary(), &program).expect("link the server binary");
        }
        let child = Command::new(&program)
            .args(["--addr", "127.0.0.1:0", "--db", &self.url, "--node-name"])
            .arg(&self.name)
            .arg("--lease-ms")
            .arg(self.options.lease.as_millis().to_string())
            .arg("--word-delay-ms")
            .arg(self.options.word_delay.as_millis().to_string())
            .arg("--max-resume-attempts")
            .arg(self.options.max_resume_attempts.to_string())
            .env("RUST_LOG", "info")
            .env_remove("DS_CRASH_POINT")
            .env_remove("DURABLE_SESSIONS_TOKEN")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn the server example");
        self.process = Some(child);
        let deadline = Instant::now() + START_WAIT;
        loop {
            let out = std::fs::read_to_string(self.out_path()).unwrap_or_default();
            if let Some(addr) = out
                .lines()
                .find_map(|l| l.strip_prefix("listening on http://"))
            {
                self.addr = addr.trim().to_owned();
                return;
            }
            let exited = self
                .process
                .as_mut()
                .and_then(|p| p.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.process = None;
                panic!(
                    "node {} exited while starting ({status}):\n{}",
                    self.name,
                    self.log_tail(60)
                );
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not listen within {START_WAIT:?}:\n{}",
                self.name,
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `host:port` it listens on (this boot).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the process runs (not killed).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("a running node").id()
    }

    /// `SIGKILL`s the process and reaps it; panics if it had died on its own.
    pub fn kill(&mut self) {
        let mut child = self.process.take().expect("a running node");
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "node {} exited on its own ({status}):\n{}",
                self.name,
                self.log_tail(60)
            );
        }
        child.kill().expect("SIGKILL the node");
        let status = child.wait().expect("reap the node");
        self.paused = false;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "node {} did not die of SIGKILL: {status}",
            self.name
        );
    }

    /// Starts the node again (same name, a new node id and port).
    pub fn restart(&mut self) {
        self.boot();
    }

    /// `SIGSTOP`: the process stops dead (a GC pause, a frozen VM), its sockets stay open.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    /// `SIGCONT`.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).expect("pid");
        #[allow(unsafe_code)]
        // SAFETY: `kill` takes no pointers; `pid` is our own unreaped child, so it cannot have
        // been reused by another process.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            sent,
            0,
            "signal {signal} to node {}: {}",
            self.name,
            io::Error::last_os_error()
        );
    }

    /// Whether it exited by itself (a crash): checked without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process
            .as_mut()
            .and_then(|p| p.try_wait().ok().flatten())
    }

    /// The last `lines` lines of every boot's stdout and stderr.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        for generation in 1..=self.generation {
            for ext in ["out", "err"] {
                let path = self.logs.join(format!("{}.{generation}.{ext}", self.name));
                let body = std::fs::read_to_string(&path).unwrap_or_default();
                let all: Vec<&str> = body.lines().collect();
                let tail = &all[all.len().saturating_sub(lines)..];
                text.push_str(&format!(
                    "--- {} ---\n{}\n",
                    path.display(),
                    tail.join("\n")
                ));
            }
        }
        if let Some(log) = &self.options.server_log {
            let body = std::fs::read_to_string(log).unwrap_or_default();
            let errors: Vec<&str> = body
                .lines()
                .filter(|l| l.contains("ERROR") || l.contains("DETAIL") || l.contains("FATAL"))
                .collect();
            let tail = &errors[errors.len().saturating_sub(lines)..];
            text.push_str(&format!(
                "--- PostgreSQL errors ({}) ---\n{}\n",
                log.display(),
                tail.join("\n")
            ));
        }
        text
    }

    /// How many lines of its stderr logs (every boot) contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        (1..=self.generation)
            .map(|g| {
                let path = self.logs.join(format!("{}.{g}.err", self.name));
                std::fs::read_to_string(path)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains(needle))
                    .count()
            })
            .sum()
    }

    /// This boot's node id, from the `node` table (the newest row of its name).
    pub fn node_id(&self, db: &mut Client) -> String {
        db.query_one(
            "SELECT node_id FROM node WHERE name = $1 ORDER BY started_at DESC LIMIT 1",
            &[&self.name],
        )
        .unwrap_or_else(|e| panic!("node id of {}: {e}", self.name))
        .get(0)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.process.take() {
            if self.paused {
                if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                    #[allow(unsafe_code)]
                    // SAFETY: as in `signal`: our own unreaped child.
                    unsafe {
                        libc::kill(pid, libc::SIGCONT);
                    }
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The nodes of one test and the directory of their logs, kept (and named on stderr) when the
/// test panics. Dropping it kills every node.
#[derive(Debug)]
pub struct Nodes {
    pub nodes: Vec<Node>,
    /// Declared after `nodes`: the processes die before their log directory goes.
    dir: Option<tempfile::TempDir>,
    /// The addresses the [`Spread`] clients use (`None`: the node is down).
    addrs: Arc<RwLock<Vec<Option<String>>>>,
}

impl Nodes {
    /// Starts `count` nodes `n0`, `n1`, … on `url`, one after another.
    pub fn start(url: &str, count: usize, options: &NodeOptions) -> Nodes {
        let dir = tempfile::Builder::new()
            .prefix("multi-node-")
            .tempdir()
            .expect("log dir");
        let nodes: Vec<Node> = (0..count)
            .map(|i| Node::start(dir.path(), url, &format!("n{i}"), options))
            .collect();
        let addrs = nodes.iter().map(|n| Some(n.addr().to_owned())).collect();
        Nodes {
            nodes,
            dir: Some(dir),
            addrs: Arc::new(RwLock::new(addrs)),
        }
    }

    pub fn addr(&self, i: usize) -> &str {
        self.nodes[i].addr()
    }

    /// A client spreading requests over the live nodes.
    pub fn spread(&self) -> Spread {
        Spread {
            addrs: self.addrs.clone(),
        }
    }

    /// Marks node `i` down for the clients (before a kill or a pause).
    pub fn take_out(&self, i: usize) {
        self.addrs.write().unwrap()[i] = None;
    }

    /// Marks node `i` up again for the clients, at its current address.
    pub fn put_back(&self, i: usize) {
        self.addrs.write().unwrap()[i] = Some(self.nodes[i].addr().to_owned());
    }

    /// SIGKILLs node `i` (out of the clients' rotation first).
    pub fn kill(&mut self, i: usize) {
        self.take_out(i);
        self.nodes[i].kill();
    }

    /// Restarts node `i` and puts it back in the clients' rotation.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
        self.put_back(i);
    }

    /// Panics (with their logs) if a node died by itself.
    pub fn assert_alive(&mut self) {
        for i in 0..self.nodes.len() {
            if let Some(status) = self.nodes[i].exited() {
                panic!(
                    "node {} died by itself ({status}):\n{}",
                    self.nodes[i].name,
                    self.nodes[i].log_tail(80)
                );
            }
        }
    }

    /// The tails of every node's logs (for a failure message).
    pub fn logs(&self, lines: usize) -> String {
        self.nodes.iter().map(|n| n.log_tail(lines)).collect()
    }

    /// Kills every node; keeps the log directory when the thread is panicking (or
    /// `DS_KEEP_NODE_LOGS` is set).
    fn finish(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.process.take() {
                if node.paused {
                    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                        #[allow(unsafe_code)]
                        // SAFETY: as in `Node::signal`: our own unreaped child.
                        unsafe {
                            libc::kill(pid, libc::SIGCONT);
                        }
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("DS_KEEP_NODE_LOGS").is_some() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                let _ = writeln!(io::stderr(), "node logs kept in {}", kept.display());
            }
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.finish();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// One HTTP/1.0 request (the connection closes after the answer, so the body is read to its
/// end): the status and the body as JSON (`Value::Null` when empty, a string when not JSON).
///
/// # Errors
/// When the node cannot be reached or the connection breaks (a killed node).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> io::Result<(u16, Value)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no response head"))?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("head {head:?}")))?;
    let text = String::from_utf8_lossy(&answer[split + 4..]).into_owned();
    let value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Ok((status, value))
}

/// [`request`] that must reach the node and answer `expect`.
pub fn call(addr: &str, method: &str, path: &str, body: Option<&Value>, expect: u16) -> Value {
    match request(addr, method, path, body) {
        Ok((status, value)) if status == expect => value,
        other => panic!("{method} {path} on {addr}: expected {expect}, got {other:?}"),
    }
}

/// A client spreading requests over the nodes that are up, moving to the next one when a node
/// cannot be reached (it was killed): requests are retried as they are, so only idempotent ones
/// (an admission with its message id, an interrupt) go through it.
#[derive(Debug, Clone)]
pub struct Spread {
    addrs: Arc<RwLock<Vec<Option<String>>>>,
}

impl Spread {
    /// Sends to node `preferred` if it is up, else to the next one up; returns the node that
    /// answered, with the answer. Gives up (panics) after 60 s without an answer.
    pub fn send(
        &self,
        preferred: usize,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (usize, u16, Value) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut i = preferred;
        let mut last = None;
        loop {
            let addr = {
                let addrs = self.addrs.read().unwrap();
                i %= addrs.len();
                addrs[i].clone()
            };
            if let Some(addr) = addr {
                match request(&addr, method, path, body) {
                    Ok((status, value)) if status < 500 => return (i, status, value),
                    other => last = Some(format!("{addr}: {other:?}")),
                }
            }
            assert!(
                Instant::now() < deadline,
                "{method} {path}: no node answered within 60 s; last {last:?}"
            );
            i += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Server-Sent Events

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// `id:` (the event's seq).
    pub id: u64,
    /// `event:` (its wire name).
    pub kind: String,
    /// `data:` (the whole `EventRecord`).
    pub data: Value,
}

/// A `GET /sessions/{id}/events` stream over HTTP/1.1 (the server refuses event streams over
/// HTTP/1.0, which has no chunked encoding); the body's chunked encoding is undone by
/// [`Chunked`].
#[derive(Debug)]
pub struct Sse {
    reader: BufReader<Chunked>,
    /// The bytes of the line being read (kept across read timeouts).
    partial: Vec<u8>,
    id: Option<u64>,
    kind: Option<String>,
    data: Option<String>,
}

impl Sse {
    /// Opens the stream of `session` on `addr`, starting after `after` (sent as `?after=`), or
    /// after `last_event_id` (sent as the `Last-Event-ID` header).
    pub fn open(
        addr: &str,
        session: &str,
        after: Option<u64>,
        last_event_id: Option<u64>,
    ) -> io::Result<Sse> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_millis(100)))?;
        let query = after.map(|a| format!("?after={a}")).unwrap_or_default();
        let header = last_event_id
            .map(|id| format!("Last-Event-ID: {id}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "GET /sessions/{session}/events{query} HTTP/1.1\r\nHost: {addr}\r\n\
             Accept: text/event-stream\r\n{header}\r\n"
        );
        stream.write_all(head.as_bytes())?;
        let mut head = BufReader::new(stream);
        let mut partial = Vec::new();
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let status = read_line(&mut head, &mut partial, deadline)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "no status line"))?;
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(io::Error::other(format!("stream answered {status:?}")));
        }
        // The rest of the head.
        while let Some(line) = read_line(&mut head, &mut partial, deadline)? {
            if line.is_empty() {
                return Ok(Sse {
                    reader: BufReader::new(Chunked {
                        inner: head,
                        left: 0,
                        size_line: Vec::new(),
                    }),
                    partial,
                    id: None,
                    kind: None,
                    data: None,
                });
            }
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "no end of head"))
    }

    /// The next complete line (without its line end), or `None` at `deadline`.
    fn line(&mut self, deadline: Instant) -> io::Result<Option<String>> {
        read_line(&mut self.reader, &mut self.partial, deadline)
    }
}

/// A chunked HTTP/1.1 body read as the bytes it carries. Keeps its place across read timeouts
/// (a `WouldBlock` or `TimedOut` from the socket passes through with nothing lost).
#[derive(Debug)]
pub struct Chunked {
    inner: BufReader<TcpStream>,
    /// Bytes left in the current chunk.
    left: usize,
    /// The chunk-size line read so far (or the CRLF after a chunk's data).
    size_line: Vec<u8>,
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.left > 0 {
                let want = buf.len().min(self.left);
                let n = self.inner.read(&mut buf[..want])?;
                self.left -= n;
                return Ok(n);
            }
            let mut byte = [0u8; 1];
            if self.inner.read(&mut byte)? == 0 {
                return Ok(0);
            }
            self.size_line.push(byte[0]);
            if !self.size_line.ends_with(b"\r\n") {
                continue;
            }
            let line =
                String::from_utf8_lossy(&self.size_line[..self.size_line.len() - 2]).into_owned();
            self.size_line.clear();
            if line.is_empty() {
                continue; // the CRLF after a chunk's data
            }
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if size == 0 {
                return Ok(0); // the last chunk
            }
            self.left = size;
        }
    }
}

/// The next complete line of `reader` (without its line end), or `None` at `deadline`; a
/// partial line is kept in `partial` across read timeouts.
fn read_line(
    reader: &mut impl BufRead,
    partial: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<Option<String>> {
    {
        loop {
            match reader.read_until(b'\n', partial) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream ended",
                    ))
                }
                Ok(_) if partial.last() == Some(&b'\n') => {
                    let mut line = std::mem::take(partial);
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Sse {
    /// The next event, or `None` when none came before `deadline`.
    ///
    /// # Errors
    /// When the stream breaks or a frame is malformed.
    pub fn next(&mut self, deadline: Instant) -> io::Result<Option<SseEvent>> {
        while let Some(line) = self.line(deadline)? {
            if line.is_empty() {
                let (id, kind, data) = (self.id.take(), self.kind.take(), self.data.take());
                let Some(data) = data else {
                    continue; // a comment or a retry hint
                };
                let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
                let data: Value = serde_json::from_str(&data).map_err(|e| bad(&e.to_string()))?;
                return Ok(Some(SseEvent {
                    id: id.ok_or_else(|| bad("a frame without id"))?,
                    kind: kind.unwrap_or_default(),
                    data,
                }));
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line.as_str(), ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.id = value.parse().ok(),
                "event" => self.kind = Some(value.to_owned()),
                "data" => {
                    let data = self.data.get_or_insert_with(String::new);
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(value);
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Reads events until `done` holds for the events read so far or `timeout` passes.
    ///
    /// # Panics
    /// When the stream breaks.
    pub fn read_until(
        &mut self,
        seen: &mut Vec<SseEvent>,
        timeout: Duration,
        mut done: impl FnMut(&[SseEvent]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        while !done(seen) {
            match self.next(deadline) {
                Ok(Some(event)) => seen.push(event),
                Ok(None) => return false,
                Err(e) => panic!("event stream broke after {} events: {e}", seen.len()),
            }
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The database

/// A connection to the test's database.
pub fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Who wrote one event row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub seq: u64,
    pub kind: String,
    pub node: Option<String>,
    pub epoch: Option<i64>,
    /// Commit time (ms since the Unix epoch, the writing node's clock).
    pub time: i64,
}

/// The whole database in one consistent snapshot: the crash matrix's view and what only the
/// shared store records.
#[derive(Debug, Clone, Default)]
pub struct PgView {
    pub store: StoreView,
    /// Per session, every event's writer, by seq.
    pub writers: BTreeMap<String, Vec<Writer>>,
    /// Per session, `(owner_node, owner_epoch)`.
    pub owners: BTreeMap<String, (Option<String>, i64)>,
    /// `node_id` → `name` of every node row.
    pub nodes: BTreeMap<String, String>,
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stored JSON {text:?}: {e}"))
}

fn seq(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_else(|_| panic!("negative seq {value}"))
}

impl PgView {
    /// Reads every table in one `REPEATABLE READ` transaction.
    pub fn read(db: &mut Client) -> PgView {
        let mut tx = db
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .expect("snapshot transaction");
        let mut view = PgView::default();
        for row in tx
            .query(
                "SELECT id, parent_id, time_suspended, resume_attempts, claim_boot, claim_seq, \
                 owner_node, owner_epoch FROM session",
                &[],
            )
            .unwrap()
        {
            let id: String = row.get(0);
            view.store.sessions.insert(
                id.clone(),
                SessionRow {
                    parent: row.get(1),
                    claimed: row.get::<_, Option<i64>>(2).is_some(),
                    attempts: u32::try_from(row.get::<_, i64>(3)).expect("attempts"),
                    claim_boot: row.get(4),
                    claim_seq: row.get::<_, Option<i64>>(5).map(seq),
                },
            );
            view.owners.insert(id, (row.get(6), row.get(7)));
        }
        for row in tx
            .query(
                "SELECT aggregate_id, seq, type, data, time, node, epoch FROM event \
                 ORDER BY aggregate_id, seq",
                &[],
            )
            .unwrap()
        {
            let id: String = row.get(0);
            let (n, kind): (u64, String) = (seq(row.get(1)), row.get(2));
            view.store
                .events
                .entry(id.clone())
                .or_default()
                .push(EventRow {
                    seq: n,
                    kind: kind.clone(),
                    data: json(row.get(3)),
                });
            view.writers.entry(id).or_default().push(Writer {
                seq: n,
                kind,
                time: row.get(4),
                node: row.get(5),
                epoch: row.get(6),
            });
        }
        for row in tx
            .query("SELECT aggregate_id, seq FROM event_sequence", &[])
            .unwrap()
        {
            view.store.sequences.insert(row.get(0), seq(row.get(1)));
        }
        for row in tx
            .query(
                "SELECT id, session_id, admitted_seq, promoted_seq, prompt, delivery, wake \
                 FROM session_input",
                &[],
            )
            .unwrap()
        {
            view.store.inputs.insert(
                row.get(0),
                InputRow {
                    session: row.get(1),
                    admitted_seq: seq(row.get(2)),
                    promoted_seq: row.get::<_, Option<i64>>(3).map(seq),
                    prompt: json(row.get(4)),
                    delivery: row.get(5),
                    wake: row.get(6),
                },
            );
        }
        for row in tx
            .query(
                "SELECT id, session_id, type, seq, data, interrupted FROM session_message",
                &[],
            )
            .unwrap()
        {
            view.store.messages.insert(
                row.get(0),
                MessageRow {
                    session: row.get(1),
                    kind: row.get(2),
                    seq: seq(row.get(3)),
                    data: json(row.get(4)),
                    interrupted: row.get(5),
                },
            );
        }
        for row in tx.query("SELECT node_id, name FROM node", &[]).unwrap() {
            view.nodes.insert(row.get(0), row.get(1));
        }
        tx.commit().unwrap();
        view
    }

    /// Whether nothing runs or is due: no claim, no session owed a turn (an acknowledged prompt
    /// whose turn has not started), no queued prompt whose turn the last one scheduled.
    pub fn quiet(&self) -> bool {
        self.store.claimed().is_empty()
            && self.store.owed().is_empty()
            && !self
                .store
                .sessions
                .keys()
                .any(|s| self.store.continuation_due(s, 0))
    }

    /// What keeps [`PgView::quiet`] from holding, for a failure message.
    pub fn busy(&self) -> String {
        let due: BTreeSet<&String> = self
            .store
            .sessions
            .keys()
            .filter(|s| self.store.continuation_due(s, 0))
            .collect();
        format!(
            "claimed {:?}; owed {:?}; continuation due {due:?}",
            self.store.claimed(),
            self.store.owed()
        )
    }

    /// The violations of what only the shared store promises, empty when they all hold:
    ///
    /// - every event records the node and the epoch it was written under;
    /// - along each session's seqs the epoch never decreases;
    /// - one writer per epoch: the turn's events (everything but the writes any node makes for
    ///   a client — `created`, `prompt.admitted`, `interrupt.requested`, `model.switched`) of one
    ///   epoch all come from one node (the epoch grows with every change of owner, so a second
    ///   node writing turn events at an epoch is a write that escaped its fence);
    /// - a claim is taken again, while it is live, only right after a restart notice (the
    ///   sweep's rules): never by a plain turn start on the same or another node;
    /// - no session is left owned by a node that has no row (a dead node whose row was deleted
    ///   while something still referred to it).
    pub fn cluster_violations(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (session, writers) in &self.writers {
            let mut last: Option<&Writer> = None;
            let mut turn_writer: BTreeMap<i64, &str> = BTreeMap::new();
            for w in writers {
                let (Some(node), Some(epoch)) = (&w.node, w.epoch) else {
                    bad.push(format!(
                        "{session}#{}: no node or epoch recorded: {w:?}",
                        w.seq
                    ));
                    continue;
                };
                if let Some(prev) = last {
                    if prev.epoch.is_some_and(|p| p > epoch) {
                        bad.push(format!(
                            "{session}#{}: epoch {epoch} ({}, by {node}) after epoch {:?} at #{}",
                            w.seq, w.kind, prev.epoch, prev.seq
                        ));
                    }
                }
                last = Some(w);
                if !is_client_write(&w.kind) {
                    match turn_writer.get(&epoch) {
                        Some(first) if *first != node.as_str() => bad.push(format!(
                            "{session}#{}: {} by {node} at epoch {epoch}, whose turn writes \
                             came from {first}: two writers of one epoch",
                            w.seq, w.kind
                        )),
                        Some(_) => {}
                        None => {
                            turn_writer.insert(epoch, node);
                        }
                    }
                }
            }
        }
        for (session, events) in &self.store.events {
            let writers = &self.writers[session];
            // The node that holds the live claim, replaying the log.
            let mut holder: Option<&str> = None;
            for (i, e) in events.iter().enumerate() {
                let node = writers[i].node.as_deref().unwrap_or("-");
                if e.kind == kind::EXECUTION_STARTED {
                    let after_notice = i > 0 && super::is_restart_notice(&events[i - 1]);
                    if let Some(held) = holder.filter(|_| !after_notice) {
                        bad.push(format!(
                            "{session}#{}: claimed by {node} while {held}'s claim was live, \
                             without the restart notice (a second claim of one turn)",
                            e.seq
                        ));
                    }
                    holder = Some(node);
                } else if super::is_releasing_terminal(e) {
                    holder = None;
                }
            }
        }
        for (session, (owner, _)) in &self.owners {
            if let Some(owner) = owner {
                if !self.nodes.contains_key(owner) {
                    bad.push(format!(
                        "{session}: owned by {owner}, which has no node row"
                    ));
                }
            }
        }
        bad
    }

    /// The session's events after `seq`, one line each, with their writers (failure messages).
    pub fn log(&self, session: &str, after: Option<u64>) -> String {
        let events = self
            .store
            .events
            .get(session)
            .map_or(&[][..], Vec::as_slice);
        let writers = self.writers.get(session).map_or(&[][..], Vec::as_slice);
        events
            .iter()
            .zip(writers)
            .filter(|(e, _)| after.is_none_or(|a| e.seq > a))
            .map(|(e, w)| {
                let data = e.data.to_string();
                let data: String = data.chars().take(120).collect();
                format!(
                    "  #{} {} {data} [node {} epoch {:?} t {}]",
                    e.seq,
                    e.kind,
                    w.node
                        .as_deref()
                        .map(|n| self.nodes.get(n).map_or(n, String::as_str))
                        .unwrap_or("-"),
                    w.epoch,
                    w.time
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Whether events of `kind` are written for a client by whichever node received the call (not
/// by the session's owner).
pub fn is_client_write(kind: &str) -> bool {
    kind == kind::CREATED
        || kind == kind::PROMPT_ADMITTED
        || kind == kind::INTERRUPT_REQUESTED
        || kind == kind::MODEL_SWITCHED
}

/// The same invariants, as SQL over the live tables (they need no snapshot): per-session seqs
/// gap-free from 0 and `event_sequence` at the last one; the epoch never decreasing along a log;
/// every event stamped with a node and an epoch; no claim without its `started` event. Returns
/// one line per violating row.
pub fn sql_violations(db: &mut Client) -> Vec<String> {
    let checks: [(&str, &str); 4] = [
        (
            "seqs not gap-free from 0",
            "SELECT aggregate_id || ': seq ' || seq || ' at index ' || i FROM \
             (SELECT aggregate_id, seq, row_number() OVER w - 1 AS i FROM event \
              WINDOW w AS (PARTITION BY aggregate_id ORDER BY seq)) e WHERE seq <> i \
             UNION ALL \
             SELECT q.aggregate_id || ': event_sequence ' || q.seq || ', last event ' || \
                    COALESCE(m.seq::text, 'none') \
             FROM event_sequence q LEFT JOIN \
              (SELECT aggregate_id, max(seq) AS seq FROM event GROUP BY aggregate_id) m \
              USING (aggregate_id) WHERE m.seq IS DISTINCT FROM q.seq",
        ),
        (
            "epoch decreasing along a log",
            "SELECT aggregate_id || '#' || seq || ': epoch ' || epoch || ' after ' || prev FROM \
             (SELECT aggregate_id, seq, epoch, lag(epoch) OVER \
              (PARTITION BY aggregate_id ORDER BY seq) AS prev FROM event) e \
             WHERE epoch < prev",
        ),
        (
            "event without node or epoch",
            "SELECT aggregate_id || '#' || seq FROM event WHERE node IS NULL OR epoch IS NULL",
        ),
        (
            "claim without its started event",
            "SELECT s.id || ': claim_seq ' || COALESCE(s.claim_seq::text, 'none') FROM session s \
             WHERE s.time_suspended IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event e \
             WHERE e.aggregate_id = s.id AND e.seq = s.claim_seq \
             AND e.type = 'session.execution.started')",
        ),
    ];
    let mut bad = Vec::new();
    for (what, sql) in checks {
        for row in db.query(sql, &[]).unwrap_or_else(|e| panic!("{what}: {e}")) {
            bad.push(format!("{what}: {}", row.get::<_, String>(0)));
        }
    }
    bad
}

/// Waits until [`PgView::quiet`] holds (twice, 100 ms apart) and returns the view then.
///
/// # Panics
/// After `timeout`, naming what is still busy.
pub fn quiesce(db: &mut Client, timeout: Duration, context: &str) -> PgView {
    let deadline = Instant::now() + timeout;
    let mut quiet_once = false;
    loop {
        let view = PgView::read(db);
        if view.quiet() {
            if quiet_once {
                return view;
            }
            quiet_once = true;
        } else {
            quiet_once = false;
            if Instant::now() >= deadline {
                let busy: Vec<String> = view
                    .store
                    .claimed()
                    .into_iter()
                    .chain(view.store.owed())
                    .chain(
                        view.store
                            .sessions
                            .keys()
                            .filter(|s| view.store.continuation_due(s, 0))
                            .cloned(),
                    )
                    .take(3)
                    .map(|s| {
                        let from = view.store.sequences.get(&s).map(|q| q.saturating_sub(25));
                        format!(
                            "{s}: row {:?}, owner {:?}\n{}",
                            view.store.sessions[&s],
                            view.owners[&s],
                            view.log(&s, from)
                        )
                    })
                    .collect();
                panic!(
                    "{context}: not quiet after {timeout:?}: {}\nnodes {:?}\n{}",
                    view.busy(),
                    view.nodes,
                    busy.join("\n")
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// The client's ledger

/// What the clients were told: the prompts acknowledged (message id → session).
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    inner: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Ledger {
    pub fn ack(&self, message: &str, session: &str) {
        self.inner
            .lock()
            .unwrap()
            .insert(message.to_owned(), session.to_owned());
    }

    pub fn acked(&self) -> BTreeMap<String, String> {
        self.inner.lock().unwrap().clone()
    }

    /// Every acknowledged prompt ran (was promoted) and, unless a user interrupted its turn,
    /// was answered exactly once; or a later interrupt request fenced it before it ran; or an
    /// `aborted` turn of its session gave it up. Returns `[answered, interrupted mid-turn,
    /// fenced before running, given up]`.
    pub fn check(&self, view: &StoreView, context: &str) -> [usize; 4] {
        let (tally, bad) = self.problems(view);
        assert!(
            bad.is_empty(),
            "{context}: {} acknowledged prompt(s) not served:\n{}",
            bad.len(),
            bad.join("\n")
        );
        tally
    }

    /// What [`Ledger::check`] checks: the tally, and one line per prompt not served.
    pub fn problems(&self, view: &StoreView) -> ([usize; 4], Vec<String>) {
        let replies = view.replies();
        let mut tally = [0; 4];
        let mut bad = Vec::new();
        for (id, session) in self.acked() {
            let Some(row) = view.inputs.get(&id) else {
                bad.push(format!(
                    "acknowledged prompt {id} ({session}) is not admitted"
                ));
                continue;
            };
            if row.session != session {
                bad.push(format!(
                    "prompt {id} admitted to {} not {session}",
                    row.session
                ));
            }
            match row.promoted_seq {
                Some(_) => {
                    let message = view.messages.get(&id);
                    let answered = replies.get(&id).copied().unwrap_or(0);
                    if message.is_some_and(|m| m.interrupted) {
                        tally[1] += 1;
                    } else if answered == 1 {
                        tally[0] += 1;
                    } else if answered == 0 && view.aborted_after(&session, row.admitted_seq) {
                        tally[3] += 1;
                    } else {
                        bad.push(format!(
                            "prompt {id} ({session}#{}) promoted, not interrupted, answered \
                             {answered} times",
                            row.admitted_seq
                        ));
                    }
                }
                None if view.interrupted_after(&session, row.admitted_seq) => tally[2] += 1,
                None if view.aborted_after(&session, row.admitted_seq) => tally[3] += 1,
                None => bad.push(format!(
                    "acknowledged prompt {id} ({session}#{}, {}, wake {}) never ran, and no \
                     later interrupt fenced it",
                    row.admitted_seq, row.delivery, row.wake
                )),
            }
        }
        (tally, bad)
    }
}

/// A prompt of `words` words (the echo agent's reply has one more: `echo:`).
pub fn words(words: usize, tag: &str) -> String {
    (0..words)
        .map(|i| format!("{tag}w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The restart notices of `session` after `seq`, with their writers.
pub fn notices_after<'a>(
    view: &'a PgView,
    session: &str,
    seq: u64,
) -> Vec<(&'a EventRow, &'a Writer)> {
    let events = view
        .store
        .events
        .get(session)
        .map_or(&[][..], Vec::as_slice);
    let writers = view.writers.get(session).map_or(&[][..], Vec::as_slice);
    events
        .iter()
        .zip(writers)
        .filter(|(e, _)| e.seq > seq && super::is_restart_notice(e))
        .collect()
}
