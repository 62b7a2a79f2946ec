//! A turn's writes on PostgreSQL: the schema functions behind `Store::claim_turn` and
//! `Store::settle_turn` are fenced like `check_fence` and write nothing when fenced, and a
//! batch the writer runs without savepoints keeps a failing request's failure its own (and a
//! request failing on a lock does not hold its batch up twice), and a run of turn writes
//! prepared in one round trip stores and answers what the same writes one by one do.

use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};

use serde_json::json;

use super::tests::{config, pg_conn, pg_db, sql};
use super::tests_journal::{journal, journal_with};
use super::PgConfig;
use crate::error::StoreError;
use crate::event::{kind, SessionEvent};
use crate::id::SessionId;
use crate::journal::backend::{ClaimRows, EventRows, InputRows, OwnershipRows, TurnRows};
use crate::journal::backend::{Ownership, Store};
use crate::journal::sqlite::test_support::{info, mid, sid};
use crate::journal::turn_write::{TurnWrite, TurnWriteKind};
use crate::outcome::{InterruptReason, Terminal};
use crate::records::Delivery;

fn is_fenced<T: std::fmt::Debug>(result: Result<T, StoreError>, want: u64) -> bool {
    matches!(result, Err(StoreError::Fenced { epoch, .. }) if epoch == want)
}

#[test]
fn turn_functions_are_fenced_and_write_nothing_when_fenced() -> Result<(), StoreError> {
    let Some(db) = pg_db("turn_fence") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    a.create_session(&info("s", None, 1))?;
    let s = sid("s");
    let succeeded = SessionEvent::ExecutionSucceeded {};
    assert!(
        is_fenced(a.claim_turn(&s, 0, "boot", 2), 0),
        "nobody owns it"
    );
    assert_eq!(a.acquire(&s)?, Ownership::Owned { epoch: 1 });
    assert!(
        is_fenced(a.claim_turn(&s, 2, "boot", 2), 2),
        "a wrong epoch"
    );
    assert!(is_fenced(b.claim_turn(&s, 1, "boot", 2), 1), "another node");
    assert!(is_fenced(b.settle_turn(&s, 1, &succeeded, 2), 1));
    assert!(is_fenced(a.claim_turn(&sid("ghost"), 1, "boot", 2), 1));
    assert_eq!(
        a.events_after(&s, None, 10)?.len(),
        1,
        "session.created only"
    );
    assert_eq!(a.claim_state(&s)?.and_then(|c| c.time_suspended), None);

    let claim = a.claim_turn(&s, 1, "boot", 3)?;
    assert_eq!(
        (claim.seq, claim.kind.as_str()),
        (1, kind::EXECUTION_STARTED)
    );
    assert_eq!(a.claim_state(&s)?.and_then(|c| c.time_suspended), Some(3));
    assert!(is_fenced(b.settle_turn(&s, 1, &succeeded, 4), 1));
    assert_eq!(a.claim_state(&s)?.and_then(|c| c.time_suspended), Some(3));
    let (next, terminal) = a.settle_turn(&s, 1, &succeeded, 5)?;
    assert_eq!((next, terminal.seq), (None, 2));
    assert_eq!(a.claim_state(&s)?.and_then(|c| c.time_suspended), None);
    // The rows record the node and the epoch that wrote them; `appended` names both events.
    let rows = a.query(
        "SELECT node, epoch FROM event WHERE aggregate_id = 's' AND seq > 0 ORDER BY seq",
        &[],
    )?;
    let rows: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, [("a".to_owned(), 1), ("a".to_owned(), 1)]);
    assert!(a.appended.ends_with(&[(s.clone(), 1), (s.clone(), 2)]));
    // A terminal that is not one is refused before anything is written.
    let started = SessionEvent::ExecutionStarted {
        boot: "x".into(),
        turn: None,
    };
    assert!(matches!(
        a.settle_turn(&s, 1, &started, 6),
        Err(StoreError::Inconsistent(_))
    ));
    Ok(())
}

/// The writer runs a batch without savepoints first; when one request fails (here a claim with
/// a stale epoch), the batch is rolled back and run again with a savepoint per request: every
/// other request commits, the failing one gets its own error.
#[actix_rt::test]
async fn a_failing_request_fails_alone_in_a_batch() -> Result<(), StoreError> {
    let Some(db) = pg_db("turn_batch") else {
        return Ok(());
    };
    let (a, _node, _signals) = journal(&db, "a");
    let ids: Vec<SessionId> = (0..20).map(|i| sid(&format!("s{i}"))).collect();
    for id in &ids {
        a.create_session(info(id.as_str(), None, 1)).await?;
        a.load_session(id.clone()).await?;
    }
    let before = a.stats();
    // Holds the writer while the claims queue up behind it, so they commit as one batch: the
    // hold is queued alone and the claims only once the writer is inside it (a claim is queued
    // when called), and it lets go once all of them are queued. No timing is assumed.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let hold = a.inner.persistence.write_now(move |_| {
        let _ = started_tx.send(());
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the writer took the hold");
    let claims = join_all(ids.iter().enumerate().map(|(i, id)| {
        let epoch = if i == 7 { 2 } else { 1 };
        a.claim_turn(id.clone(), "boot".into(), epoch)
    }));
    release_tx.send(()).expect("the hold is waiting");
    let (held, results) = futures::join!(hold, claims);
    held?;
    for (i, result) in results.into_iter().enumerate() {
        if i == 7 {
            assert!(is_fenced(result, 2), "claim {i}");
        } else {
            assert!(result.is_ok(), "claim {i}: {result:?}");
        }
    }
    let after = a.stats();
    assert!(after.largest_batch >= 19, "{after:?}");
    assert_eq!(after.failed_requests - before.failed_requests, 1);
    for (i, id) in ids.iter().enumerate() {
        let log = a.events_after(id.clone(), None, 10).await?;
        assert_eq!(log.len(), if i == 7 { 1 } else { 2 }, "{id}: {log:?}");
    }
    Ok(())
}

/// A request of a batch that fails on a lock another transaction holds (its wait timed out, an
/// error that may clear) runs alone after its batch: the other requests commit after one lock
/// wait, not after a second one in the batch's run with savepoints.
#[actix_rt::test]
async fn a_request_failing_on_a_lock_runs_alone_after_its_batch() -> Result<(), StoreError> {
    let Some(db) = pg_db("turn_lock") else {
        return Ok(());
    };
    // The node's connections wait at most a lease for a lock (`lock_timeout`). Long enough
    // that s2's run alone outlasts the test task's turn to release the lock on a loaded machine
    // (with 2 s it once timed out in the full parallel run).
    let lease = Duration::from_secs(4);
    let (a, _node, _signals) = journal_with(&PgConfig {
        lease,
        ..config(&db, "a")
    });
    let ids: Vec<SessionId> = (0..5).map(|i| sid(&format!("s{i}"))).collect();
    for id in &ids {
        a.create_session(info(id.as_str(), None, 1)).await?;
        a.load_session(id.clone()).await?;
    }
    // Another transaction holds session s2's row until told to let go.
    let (locked_tx, locked) = futures::channel::oneshot::channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let url = db.url.clone();
    let holder = std::thread::spawn(move || -> Result<(), postgres::Error> {
        let mut b = postgres::Client::connect(&url, postgres::NoTls)?;
        b.batch_execute("BEGIN; SELECT 1 FROM session WHERE id = 's2' FOR UPDATE")?;
        let _ = locked_tx.send(());
        let _ = release_rx.recv();
        b.batch_execute("COMMIT")
    });
    locked.await.expect("the holder took the lock");

    // Holds the writer while the claims queue up behind it, so they commit as one batch.
    let start = Instant::now();
    let hold = a.inner.persistence.write_now(|_| {
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    });
    let mut claims: FuturesUnordered<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let claim = a.claim_turn(id.clone(), "boot".into(), 1);
            async move { (i, claim.await, start.elapsed()) }
        })
        .collect();
    let mut done = Vec::new();
    let (held, ()) = futures::join!(hold, async {
        while let Some((i, result, at)) = claims.next().await {
            done.push((i, result, at));
            if done.len() == ids.len() - 1 {
                // The four others committed: let the lock go for s2's retry.
                let _ = release.send(());
            }
        }
    });
    held?;
    let _ = release.send(());
    holder.join().expect("holder thread")?;
    for (i, result, at) in &done {
        assert!(result.is_ok(), "claim {i}: {result:?}");
        if *i != 2 {
            // One lock wait (the savepoint-free run), then the rerun without s2.
            assert!(at < &(lease * 8 / 5), "claim {i} took {at:?}");
        }
    }
    assert_eq!(done.last().map(|(i, ..)| *i), Some(2), "s2 commits last");
    for id in &ids {
        assert_eq!(a.events_after(id.clone(), None, 10).await?.len(), 2, "{id}");
    }
    Ok(())
}

/// Nodes write concurrently: a queued prompt another node admits in a transaction still open
/// when a turn's terminal settles takes its seq before the terminal's, so the settlement must
/// see it and owe it the next turn (the turn promoted a prompt, so the queue goes on), not
/// leave it pending with no turn scheduled.
#[test]
fn a_terminal_settles_a_prompt_admitted_concurrently_before_it() -> Result<(), StoreError> {
    let Some(db) = pg_db("turn_settle_race") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    let mut watch = pg_conn(&db, "watch")?;
    a.create_session(&info("s", None, 1))?;
    let s = sid("s");
    assert_eq!(a.acquire(&s)?, Ownership::Owned { epoch: 1 });
    a.admit(&s, &mid("p1"), &json!("one"), Delivery::Queue, 2)?;
    a.claim_turn(&s, 1, "boot", 3)?;
    assert!(a.promote_queue(&s, 4)?.is_some(), "the turn's progress");

    // Node b admits the next queued prompt and has not committed yet.
    sql(&mut b, "BEGIN")?;
    let (admitted, _) = b.admit(&s, &mid("p2"), &json!("two"), Delivery::Queue, 5)?;
    let backend: i32 = a.query_one("SELECT pg_backend_pid()", &[])?.get(0);
    let (next, terminal) = std::thread::scope(|scope| {
        let settling = scope.spawn(|| -> Result<_, StoreError> {
            sql(&mut a, "BEGIN")?;
            let settled = a.settle_turn(&s, 1, &SessionEvent::ExecutionSucceeded {}, 6)?;
            sql(&mut a, "COMMIT")?;
            Ok(settled)
        });
        // Commit the admission once the terminal waits for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: bool = watch
                .query_one(
                    "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' \
                     FROM pg_stat_activity WHERE pid = $1",
                    &[&backend],
                )?
                .get(0);
            if waiting || settling.is_finished() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        sql(&mut b, "COMMIT")?;
        settling.join().expect("settling thread")
    })?;
    assert!(
        admitted.admitted_seq < terminal.seq,
        "{admitted:?} {terminal:?}"
    );
    assert_eq!(
        next,
        Some(admitted.admitted_seq),
        "the prompt is owed the next turn"
    );
    assert!(a.owes_turn(&s)?, "its wake mark is stored");
    Ok(())
}

/// Runs one session's turn writes in `order` (claims, then terminals) on `conn`, in one
/// transaction, prepared as one run (`prepared`) or each on its own; returns what each call
/// answered: the event's seq and kind, what the settlement decided, or the error's name.
fn turn_writes(
    conn: &mut super::conn::PgConn,
    writes: &[TurnWrite],
    prepared: bool,
) -> Result<Vec<String>, StoreError> {
    sql(conn, "BEGIN")?;
    if prepared {
        let run: Vec<&TurnWrite> = writes.iter().collect();
        conn.prepare_turns(&run, 10)?;
    }
    let mut answers = Vec::new();
    for write in writes {
        let answer = match &write.kind {
            TurnWriteKind::Claim { boot } => conn
                .claim_turn(&write.session, write.epoch, boot, 10)
                .map(|e| format!("{} {}", e.seq, e.kind)),
            TurnWriteKind::Settle { terminal } => conn
                .settle_turn(
                    &write.session,
                    write.epoch,
                    &SessionEvent::terminal(terminal),
                    10,
                )
                .map(|(next, e)| format!("{} {} next {next:?}", e.seq, e.kind)),
        };
        answers.push(answer.unwrap_or_else(|e| match e {
            StoreError::Fenced { epoch, .. } => format!("fenced at {epoch}"),
            other => format!("error {other}"),
        }));
    }
    sql(conn, "COMMIT")?;
    Ok(answers)
}

/// A run of turn writes prepared in one round trip (`Store::prepare_turns`, `ds_turns`) answers
/// and stores exactly what the same calls made one by one do: claims, a fenced claim, a
/// success, a user interrupt, a shutdown (which keeps its claim) and a terminal that finds a
/// queued prompt pending (settled statement by statement after the run).
#[test]
fn a_prepared_run_of_turn_writes_matches_the_writes_made_one_by_one() -> Result<(), StoreError> {
    let Some(db) = pg_db("turn_prepared") else {
        return Ok(());
    };
    let mut conn = pg_conn(&db, "a")?;
    let mut outcomes = Vec::new();
    for prepared in [false, true] {
        let name = |i: usize| sid(&format!("{prepared}-s{i}"));
        for i in 0..5 {
            conn.create_session(&info(name(i).as_str(), None, 1))?;
            assert_eq!(conn.acquire(&name(i))?, Ownership::Owned { epoch: 1 });
        }
        // Session 3's turn runs a queued prompt; another is admitted before its terminal.
        conn.admit(
            &name(3),
            &mid(&format!("{prepared}-p1")),
            &json!("one"),
            Delivery::Queue,
            2,
        )?;
        let write = |i: usize, epoch: u64, kind: TurnWriteKind| TurnWrite {
            session: name(i),
            epoch,
            kind,
        };
        let claim = || TurnWriteKind::Claim {
            boot: "boot".into(),
        };
        let claims = [
            write(0, 1, claim()),
            write(1, 1, claim()),
            write(2, 1, claim()),
            write(3, 1, claim()),
            write(4, 2, claim()),
        ];
        let mut answers = turn_writes(&mut conn, &claims, prepared)?;
        assert!(conn.promote_queue(&name(3), 11)?.is_some());
        conn.admit(
            &name(3),
            &mid(&format!("{prepared}-p2")),
            &json!("two"),
            Delivery::Queue,
            12,
        )?;
        let settle = |terminal: Terminal| TurnWriteKind::Settle { terminal };
        let interrupted = |reason: InterruptReason| Terminal::Interrupted { reason };
        let terminals = [
            write(0, 1, settle(Terminal::Succeeded)),
            write(1, 1, settle(interrupted(InterruptReason::User))),
            write(2, 1, settle(interrupted(InterruptReason::Shutdown))),
            write(3, 1, settle(Terminal::Succeeded)),
            write(4, 1, settle(Terminal::Succeeded)),
        ];
        answers.extend(turn_writes(&mut conn, &terminals, prepared)?);
        for i in 0..5 {
            let log = conn.events_after(&name(i), None, 20)?;
            let kinds: Vec<_> = log
                .iter()
                .map(|e| format!("{} {}", e.seq, e.kind))
                .collect();
            let claimed = conn.claim_state(&name(i))?.and_then(|c| c.time_suspended);
            answers.push(format!("{kinds:?} claimed {claimed:?}"));
            answers.push(format!("owes a turn {}", conn.owes_turn(&name(i))?));
        }
        outcomes.push(answers);
    }
    assert_eq!(outcomes[0], outcomes[1]);
    assert!(outcomes[1][4].starts_with("fenced"), "{:?}", outcomes[1]);
    assert!(
        outcomes[1][8].ends_with("next Some(4)"),
        "{:?}",
        outcomes[1]
    );

    // A request taken out of the run's order is refused (its own call would write twice).
    let s = |i: usize| sid(&format!("true-s{i}"));
    sql(&mut conn, "BEGIN")?;
    let run = [s(0), s(1)].map(|session| TurnWrite {
        session,
        epoch: 1,
        kind: TurnWriteKind::Claim { boot: "b".into() },
    });
    conn.prepare_turns(&run.iter().collect::<Vec<_>>(), 20)?;
    assert!(matches!(
        conn.claim_turn(&s(1), 1, "b", 20),
        Err(StoreError::Inconsistent(_))
    ));
    sql(&mut conn, "ROLLBACK")?;
    Ok(())
}
