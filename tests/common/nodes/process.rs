//! The node processes: start the `server` example on the shared database, `SIGKILL`,
//! `SIGSTOP`/`SIGCONT` and restart it, read its logs; [`Nodes`], one test's set of them and the
//! addresses its [`Spread`] clients use.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use postgres::Client;

use super::Spread;
use crate::common::server_binary;

/// How long a node may take to start listening.
const START_WAIT: Duration = Duration::from_secs(30);

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

impl Node {
    /// Kills and reaps the process, continuing it first when it is stopped.
    fn reap(&mut self) {
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

impl Drop for Node {
    fn drop(&mut self) {
        self.reap();
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
            node.reap();
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
