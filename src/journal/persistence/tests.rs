//! Group commit: batching, reply-after-commit, and per-request rollback.

use std::time::Duration;

use futures::future::join_all;
use rusqlite::Connection;

use super::{Persistence, WriteCtx};
use crate::error::StoreError;
use crate::journal::sqlite::backend::{SqliteReaders, SqliteWriter};
use crate::journal::sqlite::{self, StoreConfig};

pub(super) fn start(dir: &tempfile::TempDir) -> (Persistence, std::path::PathBuf) {
    start_with(dir, |_| {})
}

/// [`start`] with the store's configuration adjusted by `configure`.
pub(super) fn start_with(
    dir: &tempfile::TempDir,
    configure: impl FnOnce(&mut StoreConfig),
) -> (Persistence, std::path::PathBuf) {
    let path = dir.path().join("p.db");
    let mut cfg = StoreConfig::new(&path);
    configure(&mut cfg);
    let pool = sqlite::open(&cfg).expect("open pool");
    let writer = sqlite::open_connection(&cfg).expect("open writer");
    pool.get()
        .expect("a pooled connection")
        .execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .expect("create table");
    let persistence = Persistence::start(
        std::sync::Arc::new(SqliteReaders(pool.clone())),
        Box::new(SqliteWriter::new(writer, pool)),
        true,
        1024,
    )
    .expect("start");
    (persistence, path)
}

impl WriteCtx<'_> {
    /// The SQLite connection under the request, to write raw rows of the test table.
    pub(super) fn conn(&mut self) -> &Connection {
        self.store.as_sqlite().expect("the SQLite backend")
    }
}

pub(super) fn row_exists(path: &std::path::Path, k: i64) -> bool {
    let conn = Connection::open(path).expect("second connection");
    conn.query_row("SELECT count(*) FROM t WHERE k = ?1", [k], |r| {
        r.get::<_, i64>(0)
    })
    .expect("query")
        == 1
}

/// 200 concurrent writes commit in far fewer transactions than requests, and every reply
/// arrives only after its row is readable from a second connection.
#[actix_rt::test]
async fn concurrent_writes_are_group_committed_and_replied_after_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    let before = persistence.stats();
    // The first write holds the writer for a moment, so the other 199 queue up behind it.
    let slow = persistence.write(|w| {
        std::thread::sleep(Duration::from_millis(100));
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (-1, 'slow')", [])?;
        Ok(())
    });
    let writes = (0..199i64).map(|k| {
        let persistence = persistence.clone();
        let path = path.clone();
        async move {
            persistence
                .write(move |w| {
                    w.conn()
                        .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                    Ok(k)
                })
                .await
                .expect("write");
            assert!(row_exists(&path, k), "reply for {k} came before its commit");
        }
    });
    let (slow, _) = futures::join!(slow, join_all(writes));
    slow.unwrap();
    assert!(row_exists(&path, -1));
    let after = persistence.stats();
    let requests = after.requests - before.requests;
    let transactions = after.transactions - before.transactions;
    println!(
        "group commit: {requests} requests in {transactions} transactions, largest batch {}",
        after.largest_batch
    );
    assert_eq!(requests, 199 + 1);
    assert!(
        transactions <= 5,
        "200 requests took {transactions} transactions"
    );
    assert!(
        after.largest_batch >= 100,
        "largest batch {}",
        after.largest_batch
    );
}

/// A request that fails inside a batch is rolled back alone; the others commit.
#[actix_rt::test]
async fn one_failing_request_in_a_batch_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    let slow = persistence.write(|w| {
        std::thread::sleep(Duration::from_millis(50));
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (-1, 'slow')", [])?;
        Ok(())
    });
    let writes = (0..20i64).map(|k| {
        let persistence = persistence.clone();
        async move {
            persistence
                .write(move |w| {
                    w.conn()
                        .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                    if k == 7 {
                        return Err(StoreError::Conflict("deliberate".into()));
                    }
                    Ok(())
                })
                .await
        }
    });
    let (slow, results) = futures::join!(slow, join_all(writes));
    slow.unwrap();
    for (k, result) in results.into_iter().enumerate() {
        let k = k as i64;
        if k == 7 {
            assert!(matches!(result, Err(StoreError::Conflict(_))));
            assert!(!row_exists(&path, k), "the failed request's row was kept");
        } else {
            result.unwrap();
            assert!(row_exists(&path, k));
        }
    }
    assert_eq!(persistence.stats().failed_requests, 1);
}

/// A batch first runs without savepoints: each request of a batch that succeeds runs once.
/// When one fails, the batch is rolled back and runs again with a savepoint per request: the
/// requests up to the failing one ran twice, the rest once, and each row is stored once.
#[actix_rt::test]
async fn a_batch_runs_once_without_savepoints_and_again_with_them_after_a_failure() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    for failing in [None, Some(7i64)] {
        let base = if failing.is_some() { 100 } else { 0 };
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..20).map(|_| AtomicUsize::new(0)).collect());
        // A request holds the writer, alone, until the 20 below are queued: they then make
        // one batch.
        let (started, running) = futures::channel::oneshot::channel::<()>();
        let started = Mutex::new(Some(started));
        let (release, hold) = std::sync::mpsc::channel::<()>();
        // `submit` queues at once (`write` when first polled).
        let gate = persistence.submit(
            move |_| {
                if let Some(started) = started.lock().expect("not poisoned").take() {
                    let _ = started.send(());
                }
                let _ = hold.recv_timeout(Duration::from_secs(10));
                Ok(())
            },
            false,
        );
        running.await.expect("the holding request runs");
        let writes: Vec<_> = (0..20i64)
            .map(|k| {
                let runs = runs.clone();
                persistence.submit(
                    move |w| {
                        runs[k as usize].fetch_add(1, Ordering::SeqCst);
                        w.conn()
                            .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [base + k])?;
                        if Some(k) == failing {
                            return Err(StoreError::Conflict("deliberate".into()));
                        }
                        Ok(())
                    },
                    false,
                )
            })
            .collect();
        release.send(()).expect("release the writer");
        gate.await.unwrap();
        let results = join_all(writes).await;
        for (k, result) in results.into_iter().enumerate() {
            let k = k as i64;
            let ran = runs[k as usize].load(Ordering::SeqCst);
            match failing {
                None => assert_eq!(ran, 1, "request {k} of a batch that succeeded"),
                Some(f) => assert_eq!(ran, if k <= f { 2 } else { 1 }, "request {k}"),
            }
            assert_eq!(
                result.is_ok(),
                Some(k) != failing,
                "request {k}: {result:?}"
            );
            assert_eq!(row_exists(&path, base + k), Some(k) != failing, "row {k}");
        }
    }
}

/// Events published by a request reach subscribers only after COMMIT, and a rolled-back
/// request's events never do.
#[actix_rt::test]
async fn live_subscribers_see_only_committed_events() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, _path) = start(&dir);
    let mut bus = persistence.subscribe();
    let session = crate::id::SessionId::new("s").unwrap();
    let failing = session.clone();
    let rolled_back = persistence
        .write(move |w| {
            w.publish(&failing, "test.rolled-back", &serde_json::json!({}))?;
            Err::<(), _>(StoreError::Conflict("no".into()))
        })
        .await;
    assert!(rolled_back.is_err());
    let ok = session.clone();
    let record = persistence
        .write(move |w| w.publish(&ok, "test.kept", &serde_json::json!({"n": 1})))
        .await
        .unwrap();
    assert_eq!(
        record.seq, 0,
        "the rolled-back event must not consume a seq"
    );
    let seen = bus.recv().await.unwrap();
    assert_eq!(seen.kind, "test.kept");
    assert!(bus.try_recv().is_err());
}

/// After `stop`, writes fail with `Closed` instead of hanging.
#[actix_rt::test]
async fn writes_after_stop_fail_with_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, _path) = start(&dir);
    persistence.stop().await;
    let result = persistence.write(|_| Ok(())).await;
    assert!(matches!(result, Err(StoreError::Closed)));
}

/// Regression (found by the full-disk store-fault test): when SQLite rolls back the whole write
/// transaction itself — as it may on `SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_BUSY` or
/// `SQLITE_NOMEM` mid-write — the batch fails as a whole. Before the fix the requests after the failing one ran in
/// autocommit mode: each `SAVEPOINT` opened a transaction of its own and its `RELEASE`
/// committed it, so a request was durably stored while its caller was told it failed (and its
/// events never reached live subscribers). Here the failing request simulates SQLite's automatic
/// rollback with an explicit `ROLLBACK`; `tests/store_faults.rs` shows it on a real full disk.
#[actix_rt::test]
async fn a_transaction_rolled_back_by_sqlite_fails_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    let (release, hold) = std::sync::mpsc::channel::<()>();
    // Holds the writer until every other request below is queued (the last future of the join
    // releases it), so `b` and `c` share a batch, `b` first.
    let first = persistence.write(move |w| {
        // A request may run twice (the batch runs again, a savepoint per request, after a
        // failure): the second run finds the channel closed.
        assert!(
            !matches!(
                hold.recv_timeout(Duration::from_secs(10)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ),
            "never released"
        );
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (0, 'first')", [])?;
        Ok(())
    });
    let insert = |k: i64, rollback: bool| {
        persistence.write(move |w| {
            w.conn()
                .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
            if rollback {
                w.conn().execute_batch("ROLLBACK")?;
                return Err(StoreError::Inconsistent("rolled back by sqlite".into()));
            }
            Ok(())
        })
    };
    let (first, a, b, c, ()) = futures::join!(
        first,
        insert(1, false),
        insert(2, true),
        insert(3, false),
        async move { release.send(()).expect("release the writer") }
    );
    assert!(b.is_err());
    assert!(c.is_err(), "c shared b's batch, which SQLite rolled back");
    let answered = [(0, first), (1, a), (2, b), (3, c)];
    let errors = answered.iter().filter(|(_, r)| r.is_err()).count() as u64;
    assert_eq!(
        persistence.stats().failed_requests,
        errors,
        "every request answered with an error counts once"
    );
    for (k, result) in answered {
        assert_eq!(
            result.is_ok(),
            row_exists(&path, k),
            "request {k} answered {result:?} but its row stored = {}",
            row_exists(&path, k)
        );
    }
    // The writer goes on committing.
    persistence
        .write(|w| {
            w.conn()
                .execute("INSERT INTO t (k, v) VALUES (4, 'after')", [])?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(row_exists(&path, 4));
}

/// A write alone commits in a transaction of its own, between the batches queued around it,
/// and a failing one is rolled back whole (every row it wrote) while its neighbours commit.
#[actix_rt::test]
async fn a_write_alone_commits_by_itself_and_rolls_back_whole_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    // Hold the writer so everything below queues up behind it.
    let slow = persistence.write(|w| {
        std::thread::sleep(Duration::from_millis(100));
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (0, 'slow')", [])?;
        Ok(())
    });
    let before_alone = persistence.write(|w| {
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (1, 'x')", [])?;
        Ok(())
    });
    let failing = persistence.write_alone(|w| {
        for k in 10..20i64 {
            w.conn()
                .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
        }
        // A duplicate key: the write fails after ten rows.
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (10, 'dup')", [])?;
        Ok(())
    });
    let alone = persistence.write_alone(|w| {
        for k in 20..30i64 {
            w.conn()
                .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
        }
        Ok(w.conn().is_autocommit())
    });
    let after_alone = persistence.write(|w| {
        w.conn()
            .execute("INSERT INTO t (k, v) VALUES (2, 'x')", [])?;
        Ok(())
    });
    let before = persistence.stats();
    let (slow, before_alone, failing, alone, after_alone) =
        futures::join!(slow, before_alone, failing, alone, after_alone);
    slow.unwrap();
    before_alone.unwrap();
    after_alone.unwrap();
    assert!(
        matches!(failing, Err(StoreError::Database(_))),
        "the failing write reports its own error: {failing:?}"
    );
    assert!(!alone.unwrap(), "a write alone runs inside a transaction");
    for k in 10..20 {
        assert!(
            !row_exists(&path, k),
            "row {k} of the failed write alone is stored"
        );
    }
    for k in (0..3).chain(20..30) {
        assert!(row_exists(&path, k), "row {k} is missing");
    }
    let after = persistence.stats();
    assert_eq!(after.failed_requests - before.failed_requests, 1);
    // slow | before_alone | failing | alone | after_alone: the writes alone never share a
    // transaction with the batched ones.
    assert!(after.transactions - before.transactions >= 4);
}

/// Recent event entries of the log at `path`, read from a second connection.
fn recent_entries(path: &std::path::Path) -> i64 {
    let conn = Connection::open(path).expect("second connection");
    conn.query_row("SELECT count(*) FROM event WHERE recent = 1", [], |r| {
        r.get(0)
    })
    .expect("query")
}

/// While a maintenance hold is alive (the restart sweep), the writer does not settle the event
/// log after its writes, up to a bound far above the usual; once the hold is dropped, the next
/// write is followed by the settle. (Housekeeping runs after a write is answered: the empty
/// write after each step waits for it.)
#[actix_rt::test]
async fn housekeeping_waits_while_a_maintenance_hold_is_alive() {
    use crate::journal::sqlite::recent::SETTLE_EVERY;
    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start(&dir);
    let session = crate::id::SessionId::new("held").expect("an id");
    // The writer's first housekeeping settles whatever an earlier process left, hold or not.
    persistence.write(|_| Ok(())).await.expect("a write");
    let hold = persistence.defer_maintenance();
    let appended = persistence
        .write(move |w| {
            for _ in 0..SETTLE_EVERY {
                let data = serde_json::json!({});
                w.store().publish(&session, "custom.kind", &data, 1)?;
            }
            Ok(())
        })
        .await;
    appended.expect("the events are appended");
    persistence.write(|_| Ok(())).await.expect("a write");
    assert_eq!(recent_entries(&path), SETTLE_EVERY, "settled under a hold");
    drop(hold);
    persistence.write(|_| Ok(())).await.expect("a write");
    persistence.write(|_| Ok(())).await.expect("a write");
    assert_eq!(
        recent_entries(&path),
        0,
        "not settled once the hold is gone"
    );
}
