//! Tests of the event log: publishing, sequences, replay reads.

use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::pool::open_connection;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
use crate::journal::sqlite::SqliteStore;

use crate::journal::sqlite::test_support::{admit, messages, promote_steer};
use crate::records::Delivery;
use crate::records::MessagesQuery;

#[test]
fn seqs_start_at_zero_and_are_independent_per_session() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let (a, b) = (sid("a"), sid("b"));
    assert_eq!(conn.latest_seq(&a)?, None);
    let mut seqs = Vec::new();
    for session in [&a, &a, &b, &a, &b] {
        seqs.push(conn.publish(session, "custom.kind", &json!({}), 1)?.seq);
    }
    assert_eq!(seqs, [0, 1, 0, 2, 1]);
    assert_eq!(conn.latest_seq(&a)?, Some(2));
    assert_eq!(conn.latest_seq(&b)?, Some(1));
    Ok(())
}

#[test]
fn concurrent_publishers_leave_no_gap() -> Result<(), StoreError> {
    const THREADS: usize = 6;
    const EACH: usize = 40;
    let mut db = test_db()?;
    let session = sid("shared");
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cfg, session) = (&db.cfg, &session);
                scope.spawn(move || -> Result<(), StoreError> {
                    let mut conn = SqliteStore::new(open_connection(cfg)?);
                    for i in 0..EACH {
                        conn.execute_batch("BEGIN IMMEDIATE")?;
                        conn.publish(session, "custom.kind", &json!({ "t": t, "i": i }), 1)?;
                        conn.execute_batch("COMMIT")?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("publisher thread panicked"))
    })?;
    let events = db.conn.events_after(&session, None, usize::MAX)?;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (0..(THREADS * EACH) as u64).collect();
    assert_eq!(seqs, expected);
    assert_eq!(
        db.conn.latest_seq(&session)?,
        Some((THREADS * EACH - 1) as u64)
    );
    Ok(())
}

#[test]
fn failing_projection_rolls_back_its_event() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    db.conn
        .append_message(&sid("s"), &mid("m1"), "assistant", &json!("hi"), 2)?;
    let before = db.conn.latest_seq(&sid("s"))?;

    db.conn.execute_batch("BEGIN")?;
    {
        db.conn.execute_batch("SAVEPOINT sp")?;
        let data = json!({ "messageID": "m1", "prompt": "p", "delivery": "steer" });
        let result = db.conn.publish(&sid("s"), kind::PROMPT_ADMITTED, &data, 3);
        assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
        // The savepoint is rolled back (what dropping a rusqlite savepoint does).
        db.conn.execute_batch("ROLLBACK TO sp; RELEASE sp")?;
    }
    db.conn.publish(&sid("s"), "custom.kind", &json!({}), 4)?;
    db.conn.execute_batch("COMMIT")?;

    assert_eq!(db.conn.get_input(&mid("m1"))?, None);
    let events = db.conn.events_after(&sid("s"), before, 10)?;
    assert_eq!(
        events.len(),
        1,
        "only the event after the savepoint: {events:?}"
    );
    assert_eq!(events[0].kind, "custom.kind");
    assert_eq!(Some(events[0].seq), before.map(|s| s + 1));
    Ok(())
}

#[test]
fn execution_events_claim_and_release() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    let started = json!({ "boot": "boot-1" });
    let claimed = |conn: &mut SqliteStore| -> Result<Option<i64>, StoreError> {
        Ok(conn.claim_state(&s)?.and_then(|c| c.time_suspended))
    };

    conn.publish(&s, kind::EXECUTION_STARTED, &started, 100)?;
    let state = conn.claim_state(&s)?.expect("stored");
    assert_eq!(
        (state.time_suspended, state.claim_boot.as_deref()),
        (Some(100), Some("boot-1"))
    );
    conn.publish(
        &s,
        kind::EXECUTION_INTERRUPTED,
        &json!({ "reason": "shutdown" }),
        110,
    )?;
    assert_eq!(
        claimed(conn)?,
        Some(100),
        "a shutdown interrupt keeps the claim"
    );
    conn.publish(
        &s,
        kind::EXECUTION_INTERRUPTED,
        &json!({ "reason": "user" }),
        120,
    )?;
    assert_eq!(claimed(conn)?, None);

    let failed = json!({ "error": { "type": "unknown", "message": "boom" } });
    for (terminal, data) in [
        (kind::EXECUTION_SUCCEEDED, json!({})),
        (kind::EXECUTION_FAILED, failed),
    ] {
        conn.publish(&s, kind::EXECUTION_STARTED, &json!({}), 200)?;
        assert_eq!(
            conn.claim_state(&s)?.expect("stored").claim_boot.as_deref(),
            Some("")
        );
        conn.publish(&s, terminal, &data, 210)?;
        assert_eq!(claimed(conn)?, None, "{terminal} releases");
    }
    Ok(())
}

#[test]
fn events_after_is_exclusive_ordered_and_limited() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let s = sid("s");
    for i in 0..5 {
        db.conn
            .publish(&s, "custom.kind", &json!({ "i": i }), 10 + i)?;
    }
    db.conn
        .publish(&sid("other"), "custom.kind", &json!({}), 1)?;
    let all = db.conn.events_after(&s, None, 100)?;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(all[2].data, json!({ "i": 2 }));
    assert_eq!((all[2].time, all[2].session_id.as_str()), (12, "s"));
    let after = db.conn.events_after(&s, Some(1), 2)?;
    assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
    assert!(db.conn.events_after(&s, Some(4), 10)?.is_empty());
    Ok(())
}

#[test]
fn latest_interrupt_seq_uses_the_partial_index() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let s = sid("s");
    assert_eq!(db.conn.latest_interrupt_seq(&s)?, None);
    db.conn
        .publish(&s, kind::INTERRUPT_REQUESTED, &json!({}), 1)?;
    db.conn.publish(&s, "custom.kind", &json!({}), 2)?;
    db.conn
        .publish(&s, kind::INTERRUPT_REQUESTED, &json!({}), 3)?;
    db.conn.publish(&s, "custom.kind", &json!({}), 4)?;
    db.conn
        .publish(&sid("t"), kind::INTERRUPT_REQUESTED, &json!({}), 5)?;
    assert_eq!(db.conn.latest_interrupt_seq(&s)?, Some(2));

    assert!(LATEST_INTERRUPT_SQL.contains(&format!("'{}'", kind::INTERRUPT_REQUESTED)));
    let mut plan = db
        .conn
        .prepare(&format!("EXPLAIN QUERY PLAN {LATEST_INTERRUPT_SQL}"))?;
    let details = plan
        .query_map(["s"], |row| row.get::<_, String>(3))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    assert!(
        details.iter().any(|d| d.contains("event_interrupt")),
        "{details:?}"
    );
    Ok(())
}

#[test]
fn unknown_kinds_have_no_projection() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    for k in [
        kind::INTERRUPT_REQUESTED,
        kind::MODEL_SWITCHED,
        kind::SYNTHETIC,
        "x.y",
    ] {
        db.conn
            .publish(&sid("s"), k, &json!({ "messageID": "m" }), 2)?;
    }
    assert_eq!(db.conn.get_input(&mid("m"))?, None);
    assert!(messages(&mut db.conn, &MessagesQuery::new(sid("s")))?.is_empty());
    Ok(())
}

#[test]
fn replaying_prompt_projections_rebuilds_inbox_and_transcript() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    admit(conn, &s, &mid("p1"), &json!("one"), Delivery::Steer, 2)?;
    admit(conn, &s, &mid("p2"), &json!("two"), Delivery::Queue, 3)?;
    admit(conn, &s, &mid("p3"), &json!("three"), Delivery::Steer, 4)?;
    promote_steer(conn, &s, Some(1), 5)?;
    conn.append_message(&s, &mid("a1"), "assistant", &json!({"text": "ok"}), 6)?;
    let inputs =
        |conn: &mut SqliteStore| -> Result<Vec<Option<crate::records::Admission>>, StoreError> {
            ["p1", "p2", "p3"]
                .iter()
                .map(|id| conn.get_input(&mid(id)))
                .collect()
        };
    let (inbox, transcript) = (
        inputs(conn)?,
        messages(conn, &MessagesQuery::new(s.clone()))?,
    );
    assert_eq!(conn.pending_inputs(&s)?.len(), 2);

    conn.execute("DELETE FROM session_input", [])?;
    conn.execute("DELETE FROM session_message", [])?;
    for ev in conn.events_after(&s, None, usize::MAX)? {
        if ev.kind != kind::CREATED {
            conn.project(&ev)?;
        }
    }
    assert_eq!(inputs(conn)?, inbox);
    assert_eq!(messages(conn, &MessagesQuery::new(s))?, transcript);
    Ok(())
}
