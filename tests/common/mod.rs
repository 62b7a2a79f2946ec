//! Shared helpers for the integration tests: a temp database and a runtime on it (`harness`),
//! waits on what the runtime commits (`events`), sessions.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_sessions::{CreateSession, Runner, Runtime, RuntimeBuilder, SessionId};
use tempfile::TempDir;

mod backend;
mod events;
mod harness;
mod server;
#[cfg(feature = "http")]
pub mod web;

pub use backend::{
    await_killed_node, await_no_live_node, fresh_database, is_postgres, on_postgres_now,
    sqlite_only, test_names, CRASH_LEASE, OWN_CLUSTER_PREFIX, POSTGRES_ENV,
};
#[cfg(feature = "testing-postgres")]
pub use backend::{postgres_only, run_suite_on_postgres};

pub use events::{next_commit, wait_for_event, wait_until_committed};
pub use harness::{Harness, HarnessBuilder};
pub use server::{example_binary, server_binary};

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
        let path = fresh_database(dir.path());
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

/// The tests' runtime builder on `database`: two arbiters, no restart sweep at start (nor, on
/// PostgreSQL, a periodic takeover: a test runs the sweep itself), a short shutdown grace.
pub fn test_builder<R: Runner + Clone>(database: &Path, runner: &R) -> RuntimeBuilder {
    Runtime::builder()
        .database(database)
        .runner(runner.clone())
        .arbiters(2)
        .sweep_on_start(false)
        .takeover(false)
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
#[cfg(unix)]
mod disk;
mod echo;
#[cfg(unix)]
mod read_only;
mod rng;
mod store;

/// Real server processes on one PostgreSQL database (the multi-node tests).
#[cfg(feature = "postgres")]
pub mod nodes;

pub use child::{ChildProcess, CHILD_WAIT};
#[cfg(unix)]
pub use disk::{Filler, SmallDisk};
pub use echo::{unreplied, EchoOptions, EchoRunner, StepBody};
#[cfg(unix)]
pub use read_only::{is_root, ReadOnly};
pub use rng::{run_seed, splitmix, XorShift};
pub use store::{
    is_abort, is_releasing_terminal, is_restart_notice, step_violations, EventRow, InputRow,
    MessageRow, SessionRow, StepLog, StoreView,
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

/// `SELECT COUNT(*)` (or any single integer) on the test's database (a SQLite file, or a
/// PostgreSQL URL).
pub fn count(db: &Path, sql: &str) -> i64 {
    rows(db, sql, &[])[0][0].as_i64().expect("an integer")
}

/// Runs a write on the test's database (see [`rows`] for the parameters).
pub fn execute(db: &Path, sql: &str, params: &[&str]) {
    rows(db, sql, params);
}

/// The rows `sql` reads from the test's database (a SQLite file, or a PostgreSQL URL), each
/// column as JSON: text as a string, integers as numbers, NULL as null. Parameters are text,
/// written `$1`, `$2`… in order of first use (SQLite binds them by position too).
pub fn rows(db: &Path, sql: &str, params: &[&str]) -> Vec<Vec<Value>> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(db) {
        return pg_read(url, false, &[(sql, params)]).remove(0);
    }
    sqlite_rows(db, sql, params)
}

/// The rows of each query of `queries` (no parameters) on the PostgreSQL database `url`, all
/// read in one `REPEATABLE READ` transaction: one snapshot, as a live runtime's commits between
/// two of the queries are seen by neither.
#[cfg(feature = "postgres")]
pub fn pg_snapshot(url: &str, queries: &[&str]) -> Vec<Vec<Vec<Value>>> {
    let queries: Vec<(&str, &[&str])> = queries.iter().map(|q| (*q, &[][..])).collect();
    pg_read(url, true, &queries)
}

/// `db` as a PostgreSQL URL, when it is one.
#[cfg(feature = "postgres")]
fn postgres_url(db: &Path) -> Option<&str> {
    db.to_str().filter(|d| d.starts_with("postgres"))
}

/// Runs `queries` on a connection of its own (in one `REPEATABLE READ` transaction when
/// `one_snapshot`), each column as JSON (text or BIGINT).
#[cfg(feature = "postgres")]
fn pg_read(url: &str, one_snapshot: bool, queries: &[(&str, &[&str])]) -> Vec<Vec<Vec<Value>>> {
    let url = url.to_owned();
    let queries: Vec<(String, Vec<String>)> = queries
        .iter()
        .map(|(sql, params)| {
            let params = params.iter().map(|p| (*p).to_owned()).collect();
            ((*sql).to_owned(), params)
        })
        .collect();
    // The sync client cannot run on a thread inside a tokio runtime.
    std::thread::spawn(move || {
        let mut client =
            postgres::Client::connect(&url, postgres::NoTls).expect("connect to PostgreSQL");
        if one_snapshot {
            client
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .expect("begin a snapshot");
        }
        let out = queries
            .iter()
            .map(|(sql, params)| {
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                    .iter()
                    .map(|p| p as &(dyn postgres::types::ToSql + Sync))
                    .collect();
                client
                    .query(sql.as_str(), &params)
                    .unwrap_or_else(|e| panic!("query {sql:?}: {e}"))
                    .iter()
                    .map(|row| {
                        (0..row.len())
                            .map(|i| {
                                if let Ok(text) = row.try_get::<_, Option<String>>(i) {
                                    return text.map_or(Value::Null, Value::String);
                                }
                                let int: Option<i64> = row.try_get(i).expect("text or bigint");
                                int.map_or(Value::Null, Value::from)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        if one_snapshot {
            client.batch_execute("COMMIT").expect("end the snapshot");
        }
        out
    })
    .join()
    .expect("the query thread")
}

/// [`rows`] on a SQLite file.
fn sqlite_rows(db: &Path, sql: &str, params: &[&str]) -> Vec<Vec<Value>> {
    let conn = rusqlite::Connection::open(db).expect("open db");
    sqlite_query(&conn, sql, params)
}

/// The rows `sql` reads on `conn`, each column as JSON.
fn sqlite_query(conn: &rusqlite::Connection, sql: &str, params: &[&str]) -> Vec<Vec<Value>> {
    let mut stmt = conn.prepare(sql).expect("prepare");
    let width = stmt.column_count();
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params))
        .expect("query");
    let mut out = Vec::new();
    while let Some(row) = rows.next().expect("row") {
        out.push(
            (0..width)
                .map(|i| match row.get_ref(i).expect("column") {
                    rusqlite::types::ValueRef::Null => Value::Null,
                    rusqlite::types::ValueRef::Integer(n) => Value::from(n),
                    rusqlite::types::ValueRef::Real(x) => Value::from(x),
                    rusqlite::types::ValueRef::Text(t) => {
                        Value::String(String::from_utf8_lossy(t).into_owned())
                    }
                    rusqlite::types::ValueRef::Blob(_) => Value::Null,
                })
                .collect(),
        );
    }
    out
}
