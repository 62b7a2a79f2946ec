//! Tests of the writer's transaction control and reconnection, the notification payload,
//! concurrent migrations and the rescan of lost notifications, on the shared cluster (see
//! `tests`).

use std::time::Duration;

use serde_json::json;

use super::tests::{config, pg_conn, pg_db, sql};
use super::tests_own::create;
use super::writer::{events_payload, MAX_PAYLOAD};
use super::{schema, PgWriter};
use crate::error::StoreError;
use crate::event::kind;
use crate::journal::backend::{EventRows, InputRows, OwnershipRows};
use crate::journal::backend::{Nudge, Store, WriterConnection};
use crate::journal::sqlite::test_support::{mid, sid};
use crate::records::Delivery;

/// An error inside a request's savepoint leaves the batch usable after `ROLLBACK TO` (and drops
/// that request's events from the notification); outside a savepoint it aborts the
/// transaction, which then cannot commit.
#[test]
fn writer_tracks_aborted_transactions_and_savepoints() -> Result<(), StoreError> {
    let Some(db) = pg_db("writer") else {
        return Ok(());
    };
    let mut w = PgWriter::new(pg_conn(&db, "a")?, config(&db, "a"));
    assert!(!w.in_transaction());
    w.begin()?;
    w.savepoint()?;
    w.store()
        .publish(&sid("kept"), "custom.kind", &json!({}), 1)?;
    w.release()?;
    w.savepoint()?;
    w.store()
        .publish(&sid("dropped"), "custom.kind", &json!({}), 1)?;
    let failed = w
        .store()
        .admit(&sid("ghost"), &mid("x"), &json!(1), Delivery::Steer, 1);
    assert!(matches!(failed, Err(StoreError::Conflict(_))), "{failed:?}");
    assert!(w.in_transaction(), "recoverable inside the savepoint");
    w.rollback_to()?;
    w.release()?;
    w.savepoint()?;
    w.store()
        .publish(&sid("kept"), "custom.kind", &json!({}), 2)?;
    w.release()?;
    w.commit()?;
    assert!(!w.in_transaction());
    let mut check = pg_conn(&db, "check")?;
    assert_eq!(EventRows::latest_seq(&mut check, &sid("kept"))?, Some(1));
    assert_eq!(EventRows::latest_seq(&mut check, &sid("dropped"))?, None);

    w.begin()?;
    let failed = w
        .store()
        .admit(&sid("ghost"), &mid("y"), &json!(1), Delivery::Steer, 1);
    assert!(failed.is_err());
    assert!(!w.in_transaction(), "aborted outside a savepoint");
    assert!(w.commit().is_err());
    w.rollback();
    w.begin()?;
    w.store()
        .publish(&sid("kept"), "custom.kind", &json!({}), 3)?;
    w.commit()?;
    assert_eq!(EventRows::latest_seq(&mut check, &sid("kept"))?, Some(2));
    w.release_memory();
    Ok(())
}

/// A lost connection is replaced at the next `BEGIN`.
#[test]
fn writer_reconnects_after_losing_its_connection() -> Result<(), StoreError> {
    let Some(db) = pg_db("reconnect") else {
        return Ok(());
    };
    let mut w = PgWriter::new(pg_conn(&db, "a")?, config(&db, "a"));
    let mut admin = pg_conn(&db, "admin")?;
    w.begin()?;
    w.store().publish(&sid("s"), "custom.kind", &json!({}), 1)?;
    w.commit()?;
    sql(
        &mut admin,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'durable-sessions a' AND datname = current_database()",
    )?;
    std::thread::sleep(Duration::from_millis(100));
    let failed = w.begin().and_then(|()| {
        w.store()
            .publish(&sid("s"), "custom.kind", &json!({}), 2)
            .map(drop)
    });
    if failed.is_err() {
        assert!(!w.in_transaction());
        w.rollback();
    } else {
        w.commit()?;
    }
    w.begin()?;
    w.store().publish(&sid("s"), "custom.kind", &json!({}), 3)?;
    w.commit()?;
    let last = EventRows::latest_seq(&mut admin, &sid("s"))?;
    assert!(matches!(last, Some(1 | 2)), "{last:?}");
    Ok(())
}

#[test]
fn events_payload_names_each_session_once_or_says_many() {
    let appended = [(sid("b"), 4), (sid("a"), 0), (sid("b"), 6), (sid("b"), 5)];
    assert_eq!(
        events_payload("n1", &appended),
        r#"{"node":"n1","sessions":[["b",4,6],["a",0,0]]}"#
    );
    let many: Vec<_> = (0..400)
        .map(|i| (sid(&format!("session-{i:04}")), 1))
        .collect();
    let payload = events_payload("n1", &many);
    assert_eq!(payload, r#"{"many":true,"node":"n1"}"#);
    let fits: Vec<_> = (0..200).map(|i| (sid(&format!("s{i:03}")), 7)).collect();
    assert!(events_payload("n1", &fits).len() <= MAX_PAYLOAD);
    assert!(events_payload("n1", &fits).contains("s199"));
}

/// Concurrent openers migrate once; a newer schema is refused and left as it is.
#[test]
fn migrations_run_once_under_concurrency_and_refuse_newer_schemas() -> Result<(), StoreError> {
    let Some(db) = pg_db("migrate") else {
        return Ok(());
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let cfg = config(&db, &format!("m{i}"));
                scope.spawn(move || -> Result<(), StoreError> {
                    let mut client = super::conn::connect(&cfg)?;
                    schema::migrate(&mut client)
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(StoreError::Closed)))
    })?;
    let mut conn = pg_conn(&db, "a")?;
    assert_eq!(schema::version(conn.client()?)?, schema::LATEST_VERSION);
    sql(&mut conn, "UPDATE ds_schema SET version = version + 1")?;
    match schema::migrate(conn.client()?) {
        Err(StoreError::SchemaTooNew { found, known }) => {
            assert_eq!(
                (found, known),
                (schema::LATEST_VERSION + 1, schema::LATEST_VERSION)
            );
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    Ok(())
}

/// A rescan finds what other nodes routed to this node's sessions and it may never have heard:
/// an owed prompt of an unclaimed session, and an interrupt request newer than a running turn's
/// claim — once they are a second old, and only on the node that owns the session.
#[test]
fn a_rescan_finds_the_nudges_a_lost_notification_carried() -> Result<(), StoreError> {
    let Some(db) = pg_db("missed") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    for id in ["idle", "busy", "fresh", "served"] {
        create(&mut a, id)?;
        a.acquire(&sid(id))?;
    }
    let old = crate::journal::now_ms() - 5_000;
    // An owed prompt, admitted (on another node) long enough ago.
    let (owed, _) = b.admit(&sid("idle"), &mid("p"), &json!("p"), Delivery::Queue, old)?;
    b.mark_wake(&mid("p"))?;
    // A running turn, then an interrupt request after its claim.
    a.publish(
        &sid("busy"),
        kind::EXECUTION_STARTED,
        &json!({"boot": "a"}),
        old,
    )?;
    let request = b.publish(&sid("busy"), kind::INTERRUPT_REQUESTED, &json!({}), old)?;
    // Just admitted: its notification is still on its way.
    b.admit(
        &sid("fresh"),
        &mid("q"),
        &json!("q"),
        Delivery::Queue,
        old + 10_000,
    )?;
    b.mark_wake(&mid("q"))?;
    // An interrupt request older than the running turn's claim: served already.
    b.publish(&sid("served"), kind::INTERRUPT_REQUESTED, &json!({}), old)?;
    a.publish(
        &sid("served"),
        kind::EXECUTION_STARTED,
        &json!({"boot": "a"}),
        old,
    )?;

    let before = old + 1_000;
    assert_eq!(
        a.missed_nudges(before)?,
        vec![
            (sid("idle"), Nudge::Wake(owed.admitted_seq)),
            (sid("busy"), Nudge::Interrupt(request.seq)),
        ]
    );
    assert!(b.missed_nudges(before)?.is_empty(), "b owns none of them");
    Ok(())
}
