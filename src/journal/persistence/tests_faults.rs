//! Store faults under the writer: a batch that fails as a whole answers every request with
//! the fault, and counts each once.

use std::time::Duration;

use futures::future::join_all;
use rusqlite::Connection;

use super::tests::{row_exists, start_with};

/// A batch that cannot begin — another connection holds the database's write lock past the
/// busy timeout, so `BEGIN IMMEDIATE` fails with `SQLITE_BUSY` — fails as a whole: every
/// request is answered with that error and counted once in `failed_requests`, and the writer
/// commits again once the lock is gone.
#[actix_rt::test]
async fn a_batch_that_cannot_begin_counts_every_request_as_failed() {
    use std::sync::Mutex;

    let dir = tempfile::tempdir().unwrap();
    let (persistence, path) = start_with(&dir, |cfg| {
        cfg.busy_timeout = Duration::from_millis(100);
    });
    let (started, running) = futures::channel::oneshot::channel::<()>();
    let started = Mutex::new(Some(started));
    let (release, hold) = std::sync::mpsc::channel::<()>();
    // Holds the writer, alone, until the requests below are queued (so they make one batch),
    // with its write lock handed back: it commits its transaction itself and opens a deferred
    // one, which takes no lock, for the writer to commit.
    let gate = persistence.submit(
        move |w| {
            w.conn().execute_batch("COMMIT")?;
            if let Some(started) = started.lock().expect("not poisoned").take() {
                let _ = started.send(());
            }
            let _ = hold.recv_timeout(Duration::from_secs(10));
            w.conn().execute_batch("BEGIN")?;
            Ok(())
        },
        false,
    );
    running.await.expect("the holding request runs");
    let locker = Connection::open(&path).expect("second connection");
    locker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let before = persistence.stats();
    let writes: Vec<_> = (0..20i64)
        .map(|k| {
            persistence.submit(
                move |w| {
                    w.conn()
                        .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                    Ok(())
                },
                false,
            )
        })
        .collect();
    release.send(()).expect("release the writer");
    gate.await.expect("the holding request commits");
    for (k, result) in join_all(writes).await.into_iter().enumerate() {
        match result {
            Err(e) => assert!(e.is_busy(), "request {k}: {e}"),
            Ok(()) => panic!("request {k} committed under another connection's lock"),
        }
    }
    let after = persistence.stats();
    assert_eq!(after.requests - before.requests, 20);
    assert_eq!(after.largest_batch, 20, "the requests made one batch");
    assert_eq!(
        after.failed_requests - before.failed_requests,
        20,
        "every request of the failed batch counts once"
    );
    locker.execute_batch("ROLLBACK").expect("release the lock");
    drop(locker);
    persistence
        .write(|w| {
            w.conn()
                .execute("INSERT INTO t (k, v) VALUES (100, 'after')", [])?;
            Ok(())
        })
        .await
        .expect("the writer commits once the lock is gone");
    assert!(row_exists(&path, 100));
    assert_eq!(persistence.stats().failed_requests, after.failed_requests);
}
