//! Shared helpers for the integration tests: a temp database and a runtime on it (`harness`),
//! waits on what the runtime commits (`events`), sessions.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_sessions::{CreateSession, Runner, Runtime, RuntimeBuilder, SessionId};
use tempfile::TempDir;

mod events;
mod harness;
mod server;
#[cfg(feature = "http")]
pub mod web;

pub use events::{next_commit, wait_for_event, wait_until_committed};
pub use harness::{Harness, HarnessBuilder};
pub use server::server_binary;

/// How long a test waits for something observable before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A temp directory holding the test's database file.
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sessions.db");
        Self { dir, path }
    }

    /// A builder on this database: [`test_builder`].
    pub fn builder<R: Runner + Clone>(&self, runner: &R) -> RuntimeBuilder {
        test_builder(&self.path, runner)
    }

    pub async fn start<R: Runner + Clone>(&self, runner: &R) -> Runtime {
        self.builder(runner).start().await.expect("runtime starts")
    }

    /// Keeps the directory and its files on disk (a failed test's database, for a post-mortem)
    /// and returns its path.
    pub fn keep(self) -> PathBuf {
        self.dir.keep()
    }
}

/// The tests' runtime builder on `database`: two arbiters, no restart sweep at start, a short
/// shutdown grace.
pub fn test_builder<R: Runner + Clone>(database: &Path, runner: &R) -> RuntimeBuilder {
    Runtime::builder()
        .database(database)
        .runner(runner.clone())
        .arbiters(2)
        .sweep_on_start(false)
        .shutdown_grace(Duration::from_secs(2))
}

/// Creates a top-level session `id` (or a child of `parent`).
pub async fn create(runtime: &Runtime, id: &str, parent: Option<&SessionId>) -> SessionId {
    let id = SessionId::new(id).expect("valid id");
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            parent_id: parent.cloned(),
            directory: "/work".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    id
}

/// Waits until `check` holds, polling every few milliseconds: for state no event announces (the
/// registry's counters, `active()`); a condition on what the runtime commits is better awaited
/// with [`wait_until_committed`] or [`wait_for_event`].
///
/// # Panics
/// After [`WAIT`], naming `what`.
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Reliability helpers (crash matrix, store faults, bad input, load): a store snapshot read with
// plain rusqlite and the invariants every test of those suites checks on it (`store`), a
// deterministic PRNG (`rng`), a runner that promotes prompts and replies to each exactly once
// (`echo`), and child processes a test kills with SIGKILL (`child`).

mod child;
mod echo;
mod rng;
mod store;

pub use child::{ChildProcess, CHILD_WAIT};
pub use echo::{unreplied, EchoOptions, EchoRunner};
pub use rng::{run_seed, splitmix, XorShift};
pub use store::{
    is_abort, is_releasing_terminal, is_restart_notice, EventRow, InputRow, MessageRow, SessionRow,
    StoreView,
};

use serde_json::{json, Value};

/// Prints one line on stdout and flushes it (child processes talk to their parent this way).
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The prompt body the reliability suites admit for message id `id`: deterministic, so a client
/// can retry it exactly.
pub fn prompt_body(id: &str) -> Value {
    json!({ "text": id })
}

/// A valid session id.
pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("valid session id")
}

/// A valid message id.
pub fn mid(s: &str) -> durable_sessions::MessageId {
    durable_sessions::MessageId::new(s).expect("valid message id")
}

/// The prompt `{"text": s}`.
pub fn text(s: &str) -> serde_json::Value {
    serde_json::json!({ "text": s })
}

/// `SELECT COUNT(*)` (or any single integer) on the database file.
pub fn count(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).expect("open db");
    conn.query_row(sql, [], |row| row.get(0)).expect("count")
}
