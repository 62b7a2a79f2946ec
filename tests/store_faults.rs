//! Store faults: a full disk, a read-only database file, a database locked
//! by another process past `busy_timeout`, a corrupt file, and a database file lost beside its
//! WAL. Each gives the caller a typed error (`Error::Store` carrying the SQLite code, or
//! `StoreError::WalWithoutDatabase`; at `start` for a file that cannot be opened for writing or
//! read, or has lost its main file), never a panic; no partial transaction (each failed write left no row
//! and no event: the store-wide invariants of `tests/common` hold and row counts are what the
//! successful calls alone explain); a request failing inside a group-commit batch fails alone;
//! and the runtime recovers when the fault clears: the exact retry of the failed prompt, new
//! prompts and turns succeed on the same runtime (or, for faults found at `start`, the next
//! `start`).
//!
//! The faults are real, not mocked: the full disk is a small tmpfs mounted for the test
//! (`mount -t tmpfs -o size=…`, later `remount,size=…` to clear it), which needs root or
//! `CAP_SYS_ADMIN` — elsewhere that test says so and passes without running; the read-only file
//! is `chmod 0444` — or, as root (who ignores file modes), `chattr +i`; the lock is held by
//! another process (this test binary re-executed) in `BEGIN EXCLUSIVE`, and released by
//! SIGKILLing it; the corruptions overwrite bytes of a copy of a real database; the lost
//! database file is the main file of a runtime SIGKILLed mid-write (this test binary
//! re-executed), removed or emptied beside its WAL.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use durable_sessions::{
    Admission, CreateSession, Error, ListQuery, MessageId, MessagesQuery, PromptInput, Runtime,
    SessionId, Sessions, StoreError, Terminal,
};
use futures::future::join_all;
use rusqlite::ErrorCode;
use serde_json::{json, Value};

use common::{
    is_root, prompt_body, say, test_builder, ChildProcess, EchoOptions, EchoRunner, Harness,
    ReadOnly, SmallDisk, StoreView, TestDb,
};

/// Set in the child process that holds the database lock: the database path.
const LOCKER_ENV: &str = "DS_FAULT_LOCKER";

async fn open_session(sessions: &Sessions, id: &str) -> SessionId {
    let id = SessionId::new(id).unwrap();
    sessions
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/faults".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    id
}

/// Admits prompt `id` (body [`prompt_body`], or `body`) to `session`, waking it.
async fn prompt_with(
    sessions: &Sessions,
    session: &SessionId,
    id: &str,
    body: Value,
    wake: bool,
) -> Result<Admission, Error> {
    sessions
        .prompt(
            PromptInput::new(session.clone(), body)
                .with_id(MessageId::new(id).unwrap())
                .with_resume(wake),
        )
        .await
}

async fn prompt(sessions: &Sessions, session: &SessionId, id: &str) -> Result<Admission, Error> {
    prompt_with(sessions, session, id, prompt_body(id), true).await
}

/// The SQLite code of a store error, if it is one (the driver's error is the source of
/// `StoreError::Database`).
fn sqlite_code(error: &Error) -> Option<ErrorCode> {
    match error {
        Error::Store(e @ StoreError::Database(_)) => std::error::Error::source(e)?
            .downcast_ref::<rusqlite::Error>()?
            .sqlite_error_code(),
        _ => None,
    }
}

/// Asserts `result` is an `Error::Store` with one of the SQLite `codes`.
#[track_caller]
fn assert_store_error<T: std::fmt::Debug>(result: Result<T, Error>, codes: &[ErrorCode]) {
    match result {
        Err(e) if sqlite_code(&e).is_some_and(|c| codes.contains(&c)) => {}
        other => panic!("expected Error::Store with one of {codes:?}, got {other:?}"),
    }
}

async fn await_idle(runtime: &Runtime, ids: &[&SessionId]) {
    for id in ids {
        runtime.execution().await_idle(id).await.unwrap();
    }
}

/// Every user message of the view answered exactly once, nothing pending, no claim.
fn assert_settled(view: &StoreView, context: &str) {
    view.assert_invariants(10, context);
    assert!(
        view.claimed().is_empty(),
        "{context}: claims {:?}",
        view.claimed()
    );
    assert!(
        view.pending().is_empty(),
        "{context}: pending {:?}",
        view.pending()
    );
    let replies = view.replies();
    for (id, m) in &view.messages {
        if m.kind == "user" {
            assert_eq!(
                replies.get(id),
                Some(&1),
                "{context}: {id} answered {replies:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A database locked by another process.

/// In the locker child: holds `BEGIN EXCLUSIVE` on the database until killed.
fn run_locker_if_requested() {
    let Ok(path) = std::env::var(LOCKER_ENV) else {
        return;
    };
    say("");
    let conn = rusqlite::Connection::open(path).expect("locker opens the database");
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE")
        .expect("take the write lock");
    say("LOCKED");
    // Hold the lock until the parent SIGKILLs this process (the lock dies with it).
    std::thread::sleep(Duration::from_secs(120));
    std::process::exit(3);
}

/// Another process holds the write lock (`BEGIN EXCLUSIVE`) past `busy_timeout`: every write —
/// prompt, create, interrupt, model switch, a turn's claim — fails with `SQLITE_BUSY` as
/// `Error::Store` (`is_busy()`), reads keep working, nothing is written; once the other process
/// dies the exact retry of the refused prompt, new prompts and the refused turn all succeed.
#[test]
fn a_database_locked_by_another_process_gives_busy_errors_and_recovers_when_released() {
    const TEST: &str =
        "a_database_locked_by_another_process_gives_busy_errors_and_recovers_when_released";
    run_locker_if_requested();
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = db
            .builder(&runner)
            .busy_timeout(Duration::from_millis(150))
            .start()
            .await
            .unwrap();
        let sessions = runtime.sessions();
        let a = open_session(&sessions, "a").await;
        let b = open_session(&sessions, "b").await;
        prompt(&sessions, &a, "a1").await.unwrap();
        prompt(&sessions, &b, "b1").await.unwrap();
        await_idle(&runtime, &[&a, &b]).await;
        let before = StoreView::read(&db.path);
        assert_settled(&before, "before the lock");

        let locker = ChildProcess::spawn(TEST, &[(LOCKER_ENV, db.path.display().to_string())]);
        let mut locker = locker;
        locker.wait_for("LOCKED");
        let busy = [ErrorCode::DatabaseBusy];
        assert_store_error(prompt(&sessions, &a, "a2").await, &busy);
        assert_store_error(
            sessions
                .create(CreateSession {
                    id: Some(SessionId::new("c").unwrap()),
                    directory: "/faults".into(),
                    ..CreateSession::default()
                })
                .await,
            &busy,
        );
        assert_store_error(sessions.interrupt(&a).await, &busy);
        assert_store_error(sessions.switch_model(&a, json!("other")).await, &busy);
        // The turn cannot claim, nor record its failure: the caller gets the store error.
        assert_store_error(runtime.execution().resume(&b).await, &busy);
        match prompt(&sessions, &a, "a2").await {
            Err(e) => assert!(matches!(&e, Error::Store(s) if s.is_busy()), "{e:?}"),
            Ok(_) => panic!("a write succeeded under the lock"),
        }
        // Reads are not blocked (WAL), and nothing was written.
        sessions.get(&a).await.unwrap();
        assert_eq!(
            sessions
                .messages(MessagesQuery::new(a.clone()))
                .await
                .unwrap()
                .len(),
            2
        );
        assert!(runtime.execution().active().is_empty());
        let locked = StoreView::read(&db.path);
        assert_eq!(
            locked.counts(),
            before.counts(),
            "a refused write left rows"
        );

        // The other process dies; its lock goes with it.
        locker.kill();
        prompt(&sessions, &a, "a2")
            .await
            .expect("exact retry after the lock");
        prompt(&sessions, &b, "b2").await.unwrap();
        let c = open_session(&sessions, "c").await;
        prompt(&sessions, &c, "c1").await.unwrap();
        await_idle(&runtime, &[&a, &b, &c]).await;
        assert_eq!(
            runtime.execution().resume(&b).await.unwrap(),
            Terminal::Succeeded
        );
        sessions.interrupt(&a).await.unwrap();
        sessions.switch_model(&a, json!("other")).await.unwrap();
        let after = StoreView::read(&db.path);
        assert_settled(&after, "after the lock");
        assert_eq!(after.sessions.len(), 3);
        assert_eq!(after.inputs.len(), 5);
        runtime.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------------
// A full disk.

/// A padded prompt body, deterministic in `id` so it can be retried exactly.
fn padded(id: &str, bytes: usize) -> Value {
    json!({ "text": id, "pad": "x".repeat(bytes) })
}

/// The disk fills up (a 768 KiB tmpfs): the prompt that does not fit fails with `SQLITE_FULL`
/// as `Error::Store` and leaves nothing behind; a huge prompt sharing a group-commit batch with
/// small ones never leaves a reply that disagrees with the store (a small write is stored iff it
/// was acknowledged — the regression of the batch fix in `persistence`); other sessions' writes
/// fail the same typed way or succeed, never half; once the filesystem grows, the exact retry of
/// the refused prompt succeeds and every pending prompt is promoted and answered once.
#[test]
fn a_full_disk_fails_writes_with_sqlite_full_and_recovers_when_space_returns() {
    let Some(disk) = SmallDisk::tmpfs("768k") else {
        eprintln!(
            "skipped: this process cannot mount a tmpfs (needs root or CAP_SYS_ADMIN); \
             no other way to make SQLite see a really full disk here"
        );
        return;
    };
    let path = disk.mount.join("sessions.db");
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = test_builder(&path, &runner)
            .max_prompt_bytes(16 << 20)
            .start()
            .await
            .unwrap();
        let sessions = runtime.sessions();
        let a = open_session(&sessions, "a").await;
        let b = open_session(&sessions, "b").await;
        prompt(&sessions, &a, "a0").await.unwrap();
        prompt(&sessions, &b, "b0").await.unwrap();
        await_idle(&runtime, &[&a, &b]).await;

        // Fill the disk with 64 KiB prompts (admitted, not woken) until one does not fit.
        let full = [ErrorCode::DiskFull];
        let mut refused = None;
        for i in 0..64 {
            let id = format!("fill{i}");
            match prompt_with(&sessions, &a, &id, padded(&id, 64 << 10), false).await {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(sqlite_code(&e), Some(ErrorCode::DiskFull), "{e:?}");
                    refused = Some(id);
                    break;
                }
            }
        }
        let refused = refused.expect("the 768 KiB disk never filled up");
        eprintln!("disk full: prompt {refused} refused with SQLITE_FULL");
        let view = StoreView::read(&path);
        view.assert_invariants(10, "disk full");
        assert!(
            !view.inputs.contains_key(&refused),
            "the refused prompt was stored"
        );

        // A huge prompt and small ones at once: each reply agrees with the store.
        for round in 0..4 {
            let big = format!("big{round}");
            let small: Vec<String> = (0..3).map(|i| format!("small{round}-{i}")).collect();
            let smalls = small
                .iter()
                .map(|id| prompt_with(&sessions, &b, id, prompt_body(id), false));
            let (big_result, small_results) = futures::join!(
                prompt_with(&sessions, &a, &big, padded(&big, 4 << 20), false),
                join_all(smalls)
            );
            assert_store_error(big_result, &full);
            let view = StoreView::read(&path);
            view.assert_invariants(10, "disk full, batch");
            assert!(!view.inputs.contains_key(&big));
            for (id, result) in small.iter().zip(small_results) {
                eprintln!(
                    "disk full, round {round}: {id} -> {:?}",
                    result.as_ref().map(drop)
                );
                match result {
                    Ok(_) => assert!(
                        view.inputs.contains_key(id),
                        "{id} acknowledged, not stored"
                    ),
                    Err(e) => {
                        assert_eq!(sqlite_code(&e), Some(ErrorCode::DiskFull), "{e:?}");
                        assert!(!view.inputs.contains_key(id), "{id} refused, yet stored");
                    }
                }
            }
        }
        // Another session's turn either runs or fails with the same typed error, never half.
        match runtime.execution().resume(&b).await {
            Ok(_) => {}
            Err(e) => assert_eq!(sqlite_code(&e), Some(ErrorCode::DiskFull), "{e:?}"),
        }
        StoreView::read(&path).assert_invariants(10, "disk full, turn");

        // Space returns: the refused prompt's exact retry succeeds, everything drains.
        disk.resize("64m");
        prompt_with(&sessions, &a, &refused, padded(&refused, 64 << 10), true)
            .await
            .expect("exact retry once space returned");
        prompt(&sessions, &b, "b1").await.unwrap();
        await_idle(&runtime, &[&a, &b]).await;
        let after = StoreView::read(&path);
        assert_settled(&after, "after the disk grew");
        assert!(after.inputs.contains_key(&refused));
        runtime.shutdown().await;
    });
    drop(disk);
}

// ---------------------------------------------------------------------------------------------
// A read-only database file.

/// A database with two answered prompts, its runtime shut down.
async fn seeded(path: &Path) {
    let runner = EchoRunner::new(EchoOptions::default());
    let runtime = test_builder(path, &runner).start().await.unwrap();
    let sessions = runtime.sessions();
    let a = open_session(&sessions, "a").await;
    prompt(&sessions, &a, "a1").await.unwrap();
    prompt(&sessions, &a, "a2").await.unwrap();
    await_idle(&runtime, &[&a]).await;
    runtime.shutdown().await;
}

/// A database file the process may not write fails `start` with `Error::Store` carrying
/// `SQLITE_READONLY`, with or without the sweep — regression: with `sweep_on_start(false)`,
/// `start` used to succeed on a connection SQLite had silently opened read-only, and that
/// runtime refused every write even after the file became writable again — and the next
/// `start`, once the file is writable, serves it with its data intact.
#[test]
fn a_read_only_database_file_fails_start_and_starts_once_writable() {
    let db = TestDb::new();
    actix_rt::System::new().block_on(seeded(&db.path));
    let before = StoreView::read(&db.path);
    let Some(read_only) = ReadOnly::set(std::slice::from_ref(&db.path)) else {
        eprintln!("skipped: cannot make the database file read-only here (chattr/chmod failed)");
        return;
    };
    for sweep in [true, false] {
        // Without the sweep, `start` itself writes nothing: before the fix it succeeded.
        actix_rt::System::new().block_on(async {
            let runner = EchoRunner::new(EchoOptions::default());
            let started = db.builder(&runner).sweep_on_start(sweep).start().await;
            assert_store_error(started, &[ErrorCode::ReadOnly]);
        });
    }
    assert_eq!(StoreView::read(&db.path).counts(), before.counts());
    drop(read_only);
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = db.builder(&runner).start().await.unwrap();
        let sessions = runtime.sessions();
        let a = SessionId::new("a").unwrap();
        assert_eq!(
            sessions
                .messages(MessagesQuery::new(a.clone()))
                .await
                .unwrap()
                .len(),
            4
        );
        prompt(&sessions, &a, "a3").await.unwrap();
        await_idle(&runtime, &[&a]).await;
        assert_settled(&StoreView::read(&db.path), "writable again");
        runtime.shutdown().await;
    });
}

/// The database file and its WAL become read-only under a running runtime (`chattr +i`, root
/// only: a mode change does not affect descriptors already open): writes fail with a typed
/// `Error::Store` (an I/O error), nothing is stored, reads work; cleared, the same runtime
/// takes the exact retry and runs the turn. (The `-shm` file is left alone: it is
/// memory-mapped, and an immutable mapped file faults the process with SIGBUS in the kernel —
/// no database library can turn that into an error.)
#[test]
fn a_database_file_made_read_only_under_a_running_runtime_fails_writes_and_recovers() {
    if !is_root() {
        eprintln!("skipped: needs root for chattr +i on files the runtime holds open");
        return;
    }
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = db.builder(&runner).start().await.unwrap();
        let sessions = runtime.sessions();
        let a = open_session(&sessions, "a").await;
        let b = open_session(&sessions, "b").await;
        prompt(&sessions, &a, "a1").await.unwrap();
        await_idle(&runtime, &[&a]).await;
        let before = StoreView::read(&db.path);
        let wal = PathBuf::from(format!("{}-wal", db.path.display()));
        let Some(read_only) = ReadOnly::set(&[db.path.clone(), wal]) else {
            eprintln!("skipped: chattr +i failed on this filesystem");
            runtime.shutdown().await;
            return;
        };
        let io = [ErrorCode::SystemIoFailure, ErrorCode::ReadOnly];
        assert_store_error(prompt(&sessions, &a, "a2").await, &io);
        assert_store_error(prompt(&sessions, &b, "b1").await, &io);
        assert_store_error(runtime.execution().resume(&b).await, &io);
        sessions.get(&a).await.unwrap();
        assert_eq!(StoreView::read(&db.path).counts(), before.counts());
        drop(read_only);
        prompt(&sessions, &a, "a2")
            .await
            .expect("exact retry once writable");
        prompt(&sessions, &b, "b1").await.unwrap();
        await_idle(&runtime, &[&a, &b]).await;
        assert_eq!(
            runtime.execution().resume(&b).await.unwrap(),
            Terminal::Succeeded
        );
        assert_settled(&StoreView::read(&db.path), "writable again");
        runtime.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------------
// A corrupt file.

/// How a case damages the database: its bytes (written back when changed) or the file at a path.
type Damage = fn(&mut Vec<u8>, &Path);

/// A corrupt database file — garbage header, not a database at all, truncated mid-page, b-tree
/// pages overwritten, a zeroed stretch, an empty file made of the header alone, a schema from the
/// future — makes `start` (with its sweep) fail with `Error::Store`, never a panic; where the
/// damage lets it start, every call answers with a value or a typed error. The same path with
/// the good bytes restored starts and serves the data.
#[test]
fn a_corrupt_database_file_fails_start_with_a_typed_error_never_a_panic() {
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = db.builder(&runner).start().await.unwrap();
        let sessions = runtime.sessions();
        for i in 0..12 {
            let id = open_session(&sessions, &format!("s{i}")).await;
            let body = padded(&format!("p{i}"), 3000);
            prompt_with(&sessions, &id, &format!("p{i}"), body, true)
                .await
                .unwrap();
            await_idle(&runtime, &[&id]).await;
        }
        runtime.shutdown().await;
    });
    // Fold the WAL into the file, so its bytes are the whole database.
    let conn = rusqlite::Connection::open(&db.path).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let good = std::fs::read(&db.path).unwrap();
    assert!(good.len() > 8 * 4096, "a database of a few pages");

    let cases: &[(&str, Damage)] = &[
        ("garbage header", |b, _| b[..100].fill(0xa5)),
        ("not a database", |b, _| {
            *b = b"hello, not sqlite".repeat(400)
        }),
        ("truncated mid-page", |b, _| b.truncate(4096 + 1000)),
        ("b-tree pages overwritten", |b, _| b[2 * 4096..].fill(0x5a)),
        ("a zeroed stretch", |b, _| {
            let mid = b.len() / 2;
            b[mid - 8192..mid + 8192].fill(0);
        }),
        ("the header page alone", |b, _| b.truncate(4096)),
        ("a schema from the future", |_, path| {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }),
    ];
    for (name, damage) in cases {
        let path = db.dir.path().join(format!("{}.db", name.replace(' ', "-")));
        let mut bytes = good.clone();
        std::fs::write(&path, &bytes).unwrap();
        damage(&mut bytes, &path);
        if bytes != good {
            std::fs::write(&path, &bytes).unwrap();
        }
        actix_rt::System::new().block_on(async {
            let runner = EchoRunner::new(EchoOptions::default());
            match test_builder(&path, &runner)
                .sweep_on_start(true)
                .start()
                .await
            {
                Err(Error::Store(e)) => eprintln!("{name}: start refused: {e}"),
                Err(other) => panic!("{name}: start failed with a non-store error {other:?}"),
                Ok(runtime) => {
                    eprintln!("{name}: started");
                    // The damage missed what start reads: every call still answers typed.
                    let sessions = runtime.sessions();
                    let s1 = SessionId::new("s1").unwrap();
                    let answers = [
                        sessions.get(&s1).await.map(drop),
                        sessions.list(ListQuery::default()).await.map(drop),
                        sessions
                            .messages(MessagesQuery::new(s1.clone()))
                            .await
                            .map(drop),
                        prompt(&sessions, &s1, "late").await.map(drop),
                        runtime.execution().resume(&s1).await.map(drop),
                    ];
                    for answer in answers {
                        eprintln!("{name}: answered {answer:?}");
                        assert!(
                            matches!(
                                answer,
                                Ok(()) | Err(Error::Store(_) | Error::NotFound { .. })
                            ),
                            "{name}: {answer:?}"
                        );
                    }
                    runtime.shutdown().await;
                }
            }
        });
        // The fault clears: the good bytes, under the same name.
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let restored = path.with_extension("restored");
        std::fs::write(&restored, &good).unwrap();
        std::fs::rename(&restored, &path).unwrap();
        actix_rt::System::new().block_on(async {
            let runner = EchoRunner::new(EchoOptions::default());
            let runtime = test_builder(&path, &runner)
                .sweep_on_start(true)
                .start()
                .await;
            let runtime = runtime.unwrap_or_else(|e| panic!("{name}: restored file: {e}"));
            let listed = runtime.sessions().list(ListQuery::default()).await.unwrap();
            assert_eq!(listed.len(), 12, "{name}: restored data");
            runtime.shutdown().await;
        });
        assert_settled(&StoreView::read(&path), name);
    }
}

// ---------------------------------------------------------------------------------------------
// A database file lost beside its WAL.

/// Set in the child process that writes until it is killed: the database path.
const WRITER_ENV: &str = "DS_FAULT_WRITER";

/// In the writer child: answers prompts on a runtime, then keeps admitting prompts (a write
/// every few ms, so the writer never idles long enough to checkpoint and truncate its log)
/// until the parent SIGKILLs it. Prints `ACK <id>` for each acknowledged prompt, and `READY`.
fn run_writer_if_requested() {
    let Ok(path) = std::env::var(WRITER_ENV) else {
        return;
    };
    say("");
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = test_builder(Path::new(&path), &runner)
            .start()
            .await
            .unwrap();
        let sessions = runtime.sessions();
        let a = open_session(&sessions, "a").await;
        for id in ["a1", "a2", "a3"] {
            prompt(&sessions, &a, id).await.unwrap();
            say(&format!("ACK {id}"));
        }
        await_idle(&runtime, &[&a]).await;
        for i in 0.. {
            let id = format!("w{i}");
            prompt_with(&sessions, &a, &id, prompt_body(&id), false)
                .await
                .unwrap();
            say(&format!("ACK {id}"));
            if i == 3 {
                say("READY");
            }
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
    });
    std::process::exit(3);
}

/// `<path>-wal`.
fn wal_of(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", path.display()))
}

/// Starts a runtime on `path` (with the sweep) and returns how it went.
fn start_on(path: &Path) -> Result<(), Error> {
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = test_builder(path, &runner)
            .sweep_on_start(true)
            .start()
            .await?;
        runtime.shutdown().await;
        Ok(())
    })
}

/// A database file that is missing or empty while its WAL holds committed transactions (a bad
/// restore, a damaged copy) is refused at `start` with `StoreError::WalWithoutDatabase`, naming
/// both files, before SQLite opens it — SQLite would start an empty database and delete the
/// log with every acknowledged prompt in it. The log is left byte for byte; with the main file
/// restored the runtime starts and every acknowledged prompt is there. An empty (or missing)
/// main file beside an empty, absent or header-only log is a new database and starts.
#[test]
fn a_database_file_lost_beside_its_wal_is_refused_at_start() {
    const TEST: &str = "a_database_file_lost_beside_its_wal_is_refused_at_start";
    run_writer_if_requested();
    let db = TestDb::new();
    let wal = wal_of(&db.path);
    let mut writer = ChildProcess::spawn(TEST, &[(WRITER_ENV, db.path.display().to_string())]);
    writer.wait_for("READY");
    let acked: Vec<String> = writer
        .kill()
        .iter()
        .filter_map(|line| line.strip_prefix("ACK ").map(str::to_owned))
        .collect();
    assert!(acked.len() >= 7, "acknowledged {acked:?}");
    let log = std::fs::read(&wal).expect("the killed runtime's WAL");
    let main = std::fs::read(&db.path).expect("the killed runtime's database file");
    assert!(log.len() > 32, "the WAL holds frames ({} bytes)", log.len());
    let saved = db.dir.path().join("saved.db");
    std::fs::rename(&db.path, &saved).unwrap();

    for lost in ["missing", "empty"] {
        if lost == "empty" {
            std::fs::write(&db.path, b"").unwrap();
        }
        let Err(error) = start_on(&db.path) else {
            panic!("{lost} database file: the runtime started");
        };
        match &error {
            Error::Store(StoreError::WalWithoutDatabase { database, wal: w }) => {
                assert_eq!(database, &db.path, "{lost}");
                assert_eq!(w, &wal, "{lost}");
            }
            other => panic!("{lost} database file: expected WalWithoutDatabase, got {other:?}"),
        }
        let message = error.to_string();
        for named in [&db.path, &wal] {
            assert!(message.contains(&named.display().to_string()), "{message}");
        }
        eprintln!("{lost} database file: start refused: {message}");
        assert_eq!(std::fs::read(&wal).unwrap(), log, "{lost}: the WAL changed");
        match lost {
            "missing" => assert!(!db.path.exists(), "the database file was created"),
            _ => assert_eq!(std::fs::metadata(&db.path).unwrap().len(), 0),
        }
    }

    // Restored, the database starts with every acknowledged prompt, and serves.
    std::fs::rename(&saved, &db.path).unwrap();
    assert_eq!(std::fs::read(&db.path).unwrap(), main);
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = db
            .builder(&runner)
            .sweep_on_start(true)
            .start()
            .await
            .expect("the restored database starts");
        let sessions = runtime.sessions();
        let a = SessionId::new("a").unwrap();
        prompt(&sessions, &a, "after").await.unwrap();
        await_idle(&runtime, &[&a]).await;
        runtime.shutdown().await;
    });
    let view = StoreView::read(&db.path);
    view.assert_invariants(10, "restored");
    for id in &acked {
        assert!(view.inputs.contains_key(id), "acknowledged {id} is lost");
    }
    assert_eq!(view.replies().get("a1"), Some(&1), "{:?}", view.replies());
    assert_eq!(view.replies().get("after"), Some(&1));

    // A new database: an empty main file beside no log, an empty log, a header alone.
    for (case, log_bytes) in [
        ("no log", None),
        ("an empty log", Some(&log[..0])),
        ("a header alone", Some(&log[..32])),
    ] {
        let path = db.dir.path().join(format!("{}.db", case.replace(' ', "-")));
        std::fs::write(&path, b"").unwrap();
        if let Some(bytes) = log_bytes {
            std::fs::write(wal_of(&path), bytes).unwrap();
        }
        start_on(&path).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(StoreView::read(&path).sessions.is_empty(), "{case}");
    }
}

// ---------------------------------------------------------------------------------------------
// A failing request inside a batch.

/// A request that fails inside a group-commit batch (a prompt id reused with another body:
/// `PromptConflict`) fails alone: the other sessions' admissions in the same transactions
/// commit, their turns run, and the conflicting requests left nothing behind.
#[actix_rt::test]
async fn a_failing_request_in_a_batch_fails_alone_and_other_sessions_keep_working() {
    let runner = EchoRunner::new(EchoOptions::default());
    let runtime = Harness::with(|b| b.max_prompt_bytes(4 << 20))
        .start(&runner)
        .await;
    let sessions = runtime.sessions();
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(open_session(&sessions, &format!("s{i}")).await);
    }
    prompt(&sessions, &ids[0], "dup").await.unwrap();
    await_idle(&runtime, &[&ids[0]]).await;
    let before = runtime.stats().persistence;
    // A 1 MiB prompt first keeps the writer busy while the others queue into batches.
    let slow = prompt_with(&sessions, &ids[0], "slow", padded("slow", 1 << 20), true);
    let burst = ids.iter().enumerate().skip(1).map(|(i, id)| {
        let sessions = sessions.clone();
        async move {
            if i % 8 == 0 {
                prompt_with(&sessions, id, "dup", json!({"text": "another body"}), true).await
            } else {
                prompt(&sessions, id, &format!("p{i}")).await
            }
        }
    });
    let (slow, results) = futures::join!(slow, join_all(burst));
    slow.unwrap();
    let after = runtime.stats().persistence;
    assert!(
        after.transactions - before.transactions < after.requests - before.requests,
        "no batch formed: {before:?} -> {after:?}"
    );
    for (i, result) in (1..).zip(results) {
        if i % 8 == 0 {
            assert!(
                matches!(result, Err(Error::PromptConflict { .. })),
                "s{i}: {result:?}"
            );
        } else {
            result.unwrap_or_else(|e| panic!("s{i}: {e}"));
        }
    }
    let refs: Vec<&SessionId> = ids.iter().collect();
    await_idle(&runtime, &refs).await;
    let view = StoreView::read(runtime.path());
    assert_settled(&view, "after the batch");
    assert_eq!(view.inputs.len(), 2 + 39 - 4, "inputs");
    assert_eq!(view.inputs["dup"].session, "s0");
    runtime.stop().await;
}
