//! One owner per database file: a runtime holds an exclusive OS lock on
//! `<database>.lock` from before it opens the database until `shutdown`, so a second runtime on
//! the same file — in the same process or another — is refused with `Error::DatabaseInUse`
//! naming the file and the holder's pid, and writes nothing: no migration, and above all no
//! restart sweep over the claims of the live runtime (which would publish restart notices and
//! re-claim turns that are running). The OS drops the lock with its process, so a restart after
//! `SIGKILL` is never refused. The `server` example binds its port before it starts the runtime,
//! so a busy port fails before any database work.
//!
//! The cross-process tests re-execute this test binary as a child process (`DS_OWNER_DB` set):
//! the child starts a runtime on the database whose turn never ends, prints `HOLDING` and waits
//! to be killed.
#![cfg(unix)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_sessions::kind;
use durable_sessions::testing::{self, Script, ScriptedRunner};
use durable_sessions::{CreateSession, Error, Runtime, SessionId};

#[cfg(feature = "http")]
use common::server_binary;
use common::{say, ChildProcess, StoreView, TestDb, WAIT};

/// The database file a child holds, when set (only in child processes).
const CHILD_ENV: &str = "DS_OWNER_DB";
/// Printed by the child once its runtime holds the database and its turn runs.
const HOLDING: &str = "HOLDING";
/// The session whose never-ending turn holds a claim of the live runtime.
const SESSION: &str = "live";

fn session() -> SessionId {
    SessionId::new(SESSION).expect("valid id")
}

/// `<database>.lock`.
fn lock_file(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

// ---------------------------------------------------------------------------------------------
// The child side.

/// When this process is a child, holds a runtime on the database until it is killed.
fn run_child_if_requested() {
    let Ok(db) = std::env::var(CHILD_ENV) else {
        return;
    };
    actix_rt::System::new().block_on(async {
        let _live = start_holder(Path::new(&db)).await;
        // End the test harness's "test <name> ... " line, so the marker starts a line.
        say("");
        say(HOLDING);
        // Wait to be killed; a parent that died without killing us must not leave us behind.
        actix_rt::time::sleep(Duration::from_secs(60)).await;
    });
    std::process::exit(3);
}

/// A runtime on `db` (with the restart sweep) whose session [`SESSION`] runs a turn that never
/// ends: the session holds a claim of this boot.
async fn start_holder(db: &Path) -> (Runtime, ScriptedRunner) {
    let id = session();
    let runner = ScriptedRunner::new();
    runner.set_default(&id, Script::Never);
    let runtime = Runtime::builder()
        .database(db)
        .runner(runner.clone())
        .arbiters(2)
        .shutdown_grace(Duration::from_secs(2))
        .start()
        .await
        .expect("the holder's runtime starts");
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/work".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    let execution = runtime.execution();
    let turn = id.clone();
    actix_rt::spawn(async move { execution.resume(&turn).await });
    runner.wait_for_drains_of(&id, 1, WAIT).await;
    assert!(testing::is_claimed(db, &id).unwrap());
    (runtime, runner)
}

// ---------------------------------------------------------------------------------------------
// The parent side.

/// A second `start` on `db`, with the restart sweep that would resume the live runtime's turn.
async fn second_start(db: &Path) -> Result<Runtime, Error> {
    Runtime::builder()
        .database(db)
        .runner(ScriptedRunner::new())
        .arbiters(2)
        .sweep_on_start(true)
        .shutdown_grace(Duration::from_secs(2))
        .start()
        .await
}

/// Asserts `started` is `DatabaseInUse` naming `db` and the holder `pid`, in the message too.
fn assert_in_use(started: Result<Runtime, Error>, db: &Path, pid: u32) {
    let Err(err) = started else {
        panic!("a second runtime started on {}", db.display());
    };
    let message = err.to_string();
    match err {
        Error::DatabaseInUse { path, pid: holder } => {
            assert_eq!(path, db);
            assert_eq!(holder, Some(pid));
        }
        other => panic!("expected DatabaseInUse, got {other:?}"),
    }
    assert!(
        message.contains(&db.display().to_string()) && message.contains(&format!("(pid {pid})")),
        "{message}"
    );
}

/// What a refused `start` must leave exactly as it was: the bytes of the database and its WAL
/// (not `-shm`, where every reader records its read mark), the row count of every table, the
/// schema version and the whole content of the store.
#[derive(Debug)]
struct Snapshot {
    files: BTreeMap<&'static str, Option<Vec<u8>>>,
    tables: BTreeMap<String, i64>,
    user_version: i64,
    view: StoreView,
}

impl Snapshot {
    fn take(db: &Path) -> Snapshot {
        let mut files = BTreeMap::new();
        for suffix in ["", "-wal"] {
            let mut name = db.as_os_str().to_owned();
            name.push(suffix);
            files.insert(suffix, std::fs::read(PathBuf::from(name)).ok());
        }
        let conn = rusqlite::Connection::open(db).expect("open the database");
        let names: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let tables = names
            .into_iter()
            .map(|name| {
                let rows = conn
                    .query_row(&format!("SELECT COUNT(*) FROM \"{name}\""), [], |row| {
                        row.get(0)
                    })
                    .unwrap();
                (name, rows)
            })
            .collect();
        let user_version = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        drop(conn);
        Snapshot {
            files,
            tables,
            user_version,
            view: StoreView::read(db),
        }
    }

    /// Asserts nothing changed since `self`, and that the live turn got no restart notice and
    /// no second claim.
    fn assert_unchanged(&self, after: &Snapshot) {
        assert!(
            self.files.values().all(Option::is_some),
            "the database and its WAL exist"
        );
        assert!(self.files == after.files, "the database files changed");
        assert_eq!(self.tables, after.tables);
        assert!(self.tables.get("event").is_some_and(|&rows| rows > 0));
        assert_eq!(self.user_version, after.user_version);
        assert_eq!(self.view.sessions, after.view.sessions);
        assert_eq!(self.view.events, after.view.events);
        assert_eq!(self.view.sequences, after.view.sequences);
        assert_eq!(self.view.inputs, after.view.inputs);
        assert_eq!(self.view.messages, after.view.messages);
        assert_eq!(after.view.count_kind(SESSION, kind::SYNTHETIC), 0);
        assert_eq!(after.view.count_kind(SESSION, kind::EXECUTION_STARTED), 1);
        assert!(after.view.claimed().contains(SESSION));
    }
}

/// A second runtime on a database a live runtime owns is refused with `DatabaseInUse` (the
/// path, and the holder's pid read from the lock file) and writes nothing — (a) both runtimes in
/// this process, (b) the live one in a child process — although it would run the restart sweep,
/// which before the lock published a restart notice into the live turn and re-claimed it.
#[test]
fn a_second_runtime_on_the_same_file_is_refused_and_writes_nothing() {
    run_child_if_requested();

    // (a) Two runtimes in one process: the lock belongs to an open file, not to the process.
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let (live, _runner) = start_holder(&db.path).await;
        let before = Snapshot::take(&db.path);
        assert_in_use(second_start(&db.path).await, &db.path, std::process::id());
        before.assert_unchanged(&Snapshot::take(&db.path));
        // The live runtime is unaffected: its turn still holds the claim of its boot.
        assert_eq!(
            testing::claim_state(&db.path, &session())
                .unwrap()
                .unwrap()
                .claim_boot
                .as_deref(),
            Some(live.boot_id())
        );
        live.shutdown().await;
    });

    // (b) The live runtime in another process.
    let db = TestDb::new();
    let mut child = ChildProcess::spawn(
        "a_second_runtime_on_the_same_file_is_refused_and_writes_nothing",
        &[(CHILD_ENV, db.path.display().to_string())],
    );
    child.wait_for(HOLDING);
    let before = Snapshot::take(&db.path);
    actix_rt::System::new().block_on(async {
        assert_in_use(second_start(&db.path).await, &db.path, child.id());
    });
    before.assert_unchanged(&Snapshot::take(&db.path));
    child.kill();
}

/// The OS releases the lock of a process killed with SIGKILL: the next runtime on the file
/// starts (the stale lock file, naming the dead pid, is no obstacle), records its own pid, and
/// its sweep resumes the killed turn.
#[test]
fn a_restart_after_sigkill_is_not_refused_by_a_stale_lock() {
    run_child_if_requested();
    let db = TestDb::new();
    let id = session();
    let mut child = ChildProcess::spawn(
        "a_restart_after_sigkill_is_not_refused_by_a_stale_lock",
        &[(CHILD_ENV, db.path.display().to_string())],
    );
    child.wait_for(HOLDING);
    let pid = child.id();
    let lock = lock_file(&db.path);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap().trim(),
        pid.to_string()
    );
    child.kill();
    // The lock file stays, still naming the dead holder.
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap().trim(),
        pid.to_string()
    );

    actix_rt::System::new().block_on(async {
        let runner = ScriptedRunner::new();
        let runtime = db
            .builder(&runner)
            .sweep_on_start(true)
            .start()
            .await
            .expect("a restart after SIGKILL is not refused");
        assert_eq!(
            std::fs::read_to_string(&lock).unwrap().trim(),
            std::process::id().to_string()
        );
        runtime.execution().await_idle(&id).await.unwrap();
        assert_eq!(runner.drains_of(&id).len(), 1);
        assert!(!testing::is_claimed(&db.path, &id).unwrap());
        assert_eq!(
            testing::events_of_kind(&db.path, &id, kind::SYNTHETIC)
                .unwrap()
                .len(),
            1
        );
        runtime.shutdown().await;
    });
}

/// The `server` example on a port another socket listens on exits with an error naming the
/// address, before it creates the database, its WAL or its lock file.
#[cfg(feature = "http")]
#[test]
fn a_server_on_a_busy_port_touches_no_database() {
    use std::io::Read;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("x.db");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = busy.local_addr().expect("local addr").to_string();
    let mut server = Command::new(server_binary())
        .arg("--addr")
        .arg(&addr)
        .arg("--db")
        .arg(&db)
        .env_remove("DURABLE_SESSIONS_TOKEN")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server example");
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = server.try_wait().expect("try_wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            panic!("the server on the busy port {addr} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    server
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "{status}; stderr: {stderr}");
    assert!(stderr.contains(&addr), "stderr names {addr}: {stderr}");
    let created: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read the temp dir")
        .map(|entry| entry.expect("dir entry").file_name())
        .collect();
    assert!(
        created.is_empty(),
        "the server created {created:?} next to {}",
        db.display()
    );
    drop(busy);
}
