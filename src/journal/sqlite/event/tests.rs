//! Tests of the event log: publishing, sequences, replay reads.

use rusqlite::TransactionBehavior;
use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::pool::open_connection;
use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
use crate::journal::sqlite::{append_message, claim_state, get_input, pending_inputs};

use crate::journal::sqlite::test_support::{admit, messages, promote_steer};
use crate::records::Delivery;
use crate::records::MessagesQuery;

#[test]
fn seqs_start_at_zero_and_are_independent_per_session() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let (a, b) = (sid("a"), sid("b"));
    assert_eq!(latest_seq(conn, &a)?, None);
    let mut seqs = Vec::new();
    for session in [&a, &a, &b, &a, &b] {
        seqs.push(publish(conn, session, "custom.kind", &json!({}), 1)?.seq);
    }
    assert_eq!(seqs, [0, 1, 0, 2, 1]);
    assert_eq!(latest_seq(conn, &a)?, Some(2));
    assert_eq!(latest_seq(conn, &b)?, Some(1));
    Ok(())
}

#[test]
fn concurrent_publishers_leave_no_gap() -> Result<(), StoreError> {
    const THREADS: usize = 6;
    const EACH: usize = 40;
    let db = test_db()?;
    let session = sid("shared");
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cfg, session) = (&db.cfg, &session);
                scope.spawn(move || -> Result<(), StoreError> {
                    let mut conn = open_connection(cfg)?;
                    for i in 0..EACH {
                        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                        publish(&tx, session, "custom.kind", &json!({ "t": t, "i": i }), 1)?;
                        tx.commit()?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("publisher thread panicked"))
    })?;
    let events = events_after(&db.conn, &session, None, usize::MAX)?;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (0..(THREADS * EACH) as u64).collect();
    assert_eq!(seqs, expected);
    assert_eq!(
        latest_seq(&db.conn, &session)?,
        Some((THREADS * EACH - 1) as u64)
    );
    Ok(())
}

#[test]
fn failing_projection_rolls_back_its_event() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&db.conn, "s", None, 1)?;
    append_message(
        &db.conn,
        &sid("s"),
        &mid("m1"),
        "assistant",
        &json!("hi"),
        2,
    )?;
    let before = latest_seq(&db.conn, &sid("s"))?;

    let mut tx = db.conn.transaction()?;
    {
        let sp = tx.savepoint()?;
        let data = json!({ "messageID": "m1", "prompt": "p", "delivery": "steer" });
        let result = publish(&sp, &sid("s"), kind::PROMPT_ADMITTED, &data, 3);
        assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
        // Dropping the savepoint rolls it back.
    }
    publish(&tx, &sid("s"), "custom.kind", &json!({}), 4)?;
    tx.commit()?;

    assert_eq!(get_input(&db.conn, &mid("m1"))?, None);
    let events = events_after(&db.conn, &sid("s"), before, 10)?;
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
    let claimed = |conn: &Connection| -> Result<Option<i64>, StoreError> {
        Ok(claim_state(conn, &s)?.and_then(|c| c.time_suspended))
    };

    publish(conn, &s, kind::EXECUTION_STARTED, &started, 100)?;
    let state = claim_state(conn, &s)?.expect("stored");
    assert_eq!(
        (state.time_suspended, state.claim_boot.as_deref()),
        (Some(100), Some("boot-1"))
    );
    publish(
        conn,
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
    publish(
        conn,
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
        publish(conn, &s, kind::EXECUTION_STARTED, &json!({}), 200)?;
        assert_eq!(
            claim_state(conn, &s)?
                .expect("stored")
                .claim_boot
                .as_deref(),
            Some("")
        );
        publish(conn, &s, terminal, &data, 210)?;
        assert_eq!(claimed(conn)?, None, "{terminal} releases");
    }
    Ok(())
}

#[test]
fn events_after_is_exclusive_ordered_and_limited() -> Result<(), StoreError> {
    let db = test_db()?;
    let s = sid("s");
    for i in 0..5 {
        publish(&db.conn, &s, "custom.kind", &json!({ "i": i }), 10 + i)?;
    }
    publish(&db.conn, &sid("other"), "custom.kind", &json!({}), 1)?;
    let all = events_after(&db.conn, &s, None, 100)?;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(all[2].data, json!({ "i": 2 }));
    assert_eq!((all[2].time, all[2].session_id.as_str()), (12, "s"));
    let after = events_after(&db.conn, &s, Some(1), 2)?;
    assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
    assert!(events_after(&db.conn, &s, Some(4), 10)?.is_empty());
    Ok(())
}

#[test]
fn latest_interrupt_seq_uses_the_partial_index() -> Result<(), StoreError> {
    let db = test_db()?;
    let s = sid("s");
    assert_eq!(latest_interrupt_seq(&db.conn, &s)?, None);
    publish(&db.conn, &s, kind::INTERRUPT_REQUESTED, &json!({}), 1)?;
    publish(&db.conn, &s, "custom.kind", &json!({}), 2)?;
    publish(&db.conn, &s, kind::INTERRUPT_REQUESTED, &json!({}), 3)?;
    publish(&db.conn, &s, "custom.kind", &json!({}), 4)?;
    publish(
        &db.conn,
        &sid("t"),
        kind::INTERRUPT_REQUESTED,
        &json!({}),
        5,
    )?;
    assert_eq!(latest_interrupt_seq(&db.conn, &s)?, Some(2));

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
    create(&db.conn, "s", None, 1)?;
    for k in [
        kind::INTERRUPT_REQUESTED,
        kind::MODEL_SWITCHED,
        kind::SYNTHETIC,
        "x.y",
    ] {
        publish(&db.conn, &sid("s"), k, &json!({ "messageID": "m" }), 2)?;
    }
    assert_eq!(get_input(&db.conn, &mid("m"))?, None);
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
    append_message(conn, &s, &mid("a1"), "assistant", &json!({"text": "ok"}), 6)?;
    let inputs = |conn: &Connection| -> Result<Vec<Option<crate::records::Admission>>, StoreError> {
        ["p1", "p2", "p3"]
            .iter()
            .map(|id| get_input(conn, &mid(id)))
            .collect()
    };
    let (inbox, transcript) = (
        inputs(conn)?,
        messages(conn, &MessagesQuery::new(s.clone()))?,
    );
    assert_eq!(pending_inputs(conn, &s)?.len(), 2);

    conn.execute("DELETE FROM session_input", [])?;
    conn.execute("DELETE FROM session_message", [])?;
    for ev in events_after(conn, &s, None, usize::MAX)? {
        if ev.kind != kind::CREATED {
            project(conn, &ev)?;
        }
    }
    assert_eq!(inputs(conn)?, inbox);
    assert_eq!(messages(conn, &MessagesQuery::new(s))?, transcript);
    Ok(())
}
