//! Tests of the transcript rows: appending, lookup, paging, cursors and the context reads.

use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::projection::message_exists;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::started;
use crate::journal::sqlite::test_support::{context, messages, messages_after, messages_tail};
use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
use crate::journal::sqlite::SqliteStore;
use crate::records::{Direction, MessagesQuery};

use crate::journal::sqlite::test_support::{admit, promote_steer};
use crate::records::{Cursor, Delivery};

fn ids(page: &[Message]) -> Vec<&str> {
    page.iter().map(|m| m.id.as_str()).collect()
}

/// Session `s` with messages `m0`..`m4` (seqs 1..=5) and session `t` with `t0`.
fn seed(conn: &mut SqliteStore) -> Result<(), StoreError> {
    create(conn, "s", None, 1)?;
    create(conn, "t", None, 1)?;
    for i in 0..5 {
        let id = mid(&format!("m{i}"));
        conn.append_message(&sid("s"), &id, "assistant", &json!({ "i": i }), 10 + i)?;
    }
    conn.append_message(&sid("t"), &mid("t0"), "assistant", &json!({}), 10)?;
    Ok(())
}

fn query(order: Order, limit: Option<usize>, cursor: Option<(&str, Direction)>) -> MessagesQuery {
    MessagesQuery {
        session_id: sid("s"),
        limit,
        order,
        cursor: cursor.map(|(id, direction)| Cursor {
            id: mid(id),
            direction,
        }),
    }
}

#[test]
fn append_message_writes_a_row_at_the_event_seq() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    let data = json!({ "text": "hello" });
    let event = db
        .conn
        .append_message(&sid("s"), &mid("m"), "assistant", &data, 42)?;
    assert_eq!(event.kind, kind::MESSAGE_APPENDED);
    assert_eq!(
        event.data,
        json!({ "messageID": "m", "type": "assistant", "data": data })
    );
    let expected = Message {
        id: mid("m"),
        session_id: sid("s"),
        kind: "assistant".into(),
        seq: event.seq,
        data,
        time_created: 42,
        interrupted: false,
    };
    assert_eq!(db.conn.get_message(&sid("s"), &mid("m"))?, Some(expected));
    Ok(())
}

#[test]
fn append_message_rejects_reused_and_prompt_ids() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    create(&mut db.conn, "t", None, 1)?;
    db.conn
        .append_message(&sid("s"), &mid("m"), "assistant", &json!(1), 2)?;
    admit(
        &mut db.conn,
        &sid("s"),
        &mid("p"),
        &json!("p"),
        Delivery::Queue,
        3,
    )?;
    let before = db.conn.latest_seq(&sid("t"))?;
    for id in ["m", "p"] {
        db.conn.execute_batch("BEGIN")?;
        let result = db
            .conn
            .append_message(&sid("t"), &mid(id), "assistant", &json!(2), 4);
        assert!(
            matches!(result, Err(StoreError::Conflict(_))),
            "{id}: {result:?}"
        );
        db.conn.execute_batch("ROLLBACK")?;
    }
    assert_eq!(db.conn.latest_seq(&sid("t"))?, before);
    Ok(())
}

#[test]
fn get_message_is_none_for_another_sessions_message() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    assert!(db.conn.get_message(&sid("s"), &mid("m1"))?.is_some());
    assert_eq!(db.conn.get_message(&sid("t"), &mid("m1"))?, None);
    assert_eq!(db.conn.get_message(&sid("s"), &mid("nope"))?, None);
    Ok(())
}

#[test]
fn message_exists_in_any_session() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    assert!(message_exists(&db.conn, &mid("m3"))?);
    assert!(message_exists(&db.conn, &mid("t0"))?);
    assert!(!message_exists(&db.conn, &mid("nope"))?);
    Ok(())
}

#[test]
fn messages_order_and_limit() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let desc = messages(&mut db.conn, &MessagesQuery::new(sid("s")))?;
    assert_eq!(ids(&desc), ["m4", "m3", "m2", "m1", "m0"]);
    let asc = messages(&mut db.conn, &query(Order::Asc, Some(2), None))?;
    assert_eq!(ids(&asc), ["m0", "m1"]);
    assert_eq!(asc[1].data, json!({ "i": 1 }));
    Ok(())
}

#[test]
fn messages_cursor_pages_both_directions_in_both_orders() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let mut page = |order, direction| -> Result<Vec<String>, StoreError> {
        let page = messages(
            &mut db.conn,
            &query(order, Some(2), Some(("m2", direction))),
        )?;
        Ok(ids(&page).into_iter().map(String::from).collect())
    };
    assert_eq!(page(Order::Asc, Direction::Next)?, ["m3", "m4"]);
    assert_eq!(page(Order::Asc, Direction::Previous)?, ["m0", "m1"]);
    assert_eq!(page(Order::Desc, Direction::Next)?, ["m1", "m0"]);
    assert_eq!(page(Order::Desc, Direction::Previous)?, ["m4", "m3"]);
    Ok(())
}

#[test]
fn messages_with_an_unknown_cursor_are_empty() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    for cursor in ["nope", "t0"] {
        for direction in [Direction::Next, Direction::Previous] {
            let page = messages(
                &mut db.conn,
                &query(Order::Desc, None, Some((cursor, direction))),
            )?;
            assert!(page.is_empty(), "cursor {cursor}: {page:?}");
        }
    }
    Ok(())
}

#[test]
fn context_is_the_whole_transcript_in_seq_order() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    assert_eq!(
        ids(&context(&mut db.conn, &sid("s"))?),
        ["m0", "m1", "m2", "m3", "m4"]
    );
    assert_eq!(ids(&context(&mut db.conn, &sid("t"))?), ["t0"]);
    assert!(context(&mut db.conn, &sid("ghost"))?.is_empty());
    Ok(())
}

#[test]
fn messages_after_and_tail_read_only_their_window() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let seqs: Vec<u64> = context(&mut db.conn, &sid("s"))?
        .iter()
        .map(|m| m.seq)
        .collect();
    let mut after = |cursor| -> Result<Vec<String>, StoreError> {
        let page = messages_after(&mut db.conn, &sid("s"), cursor)?;
        Ok(ids(&page).into_iter().map(String::from).collect())
    };
    assert_eq!(after(None)?, ["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(after(Some(seqs[2]))?, ["m3", "m4"]);
    assert!(after(Some(seqs[4]))?.is_empty());
    let mut tail = |n| -> Result<Vec<String>, StoreError> {
        let page = messages_tail(&mut db.conn, &sid("s"), n)?;
        Ok(ids(&page).into_iter().map(String::from).collect())
    };
    assert_eq!(tail(2)?, ["m3", "m4"]);
    assert_eq!(tail(9)?.len(), 5);
    assert!(tail(0)?.is_empty());
    assert_eq!(ids(&messages_tail(&mut db.conn, &sid("t"), 3)?), ["t0"]);
    Ok(())
}

/// Both reads are range scans of the `(session_id, seq)` index: their cost is that of the
/// rows they return, however long the transcript.
#[test]
fn messages_after_and_tail_search_the_session_seq_index() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    for sql in [
        "EXPLAIN QUERY PLAN SELECT id FROM session_message \
         WHERE session_id = 's' AND seq > 3 ORDER BY seq ASC",
        "EXPLAIN QUERY PLAN SELECT id FROM session_message \
         WHERE session_id = 's' ORDER BY seq DESC LIMIT 2",
    ] {
        let mut stmt = db.conn.prepare(sql)?;
        let plan: Vec<String> = stmt
            .query_map([], |row| row.get::<_, String>(3))?
            .collect::<rusqlite::Result<_>>()?;
        let plan = plan.join("; ");
        assert!(
            plan.contains("SEARCH session_message USING INDEX sqlite_autoindex_session_message_2"),
            "{sql}: {plan}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "{sql}: sorts: {plan}");
    }
    Ok(())
}

#[test]
fn a_corrupt_stored_payload_is_a_json_error() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    db.conn.execute(
        "UPDATE session_message SET data = 'not json' WHERE id = 'm1'",
        [],
    )?;
    let result = db.conn.get_message(&sid("s"), &mid("m1"));
    assert!(matches!(result, Err(StoreError::Json(_))), "{result:?}");
    let result = context(&mut db.conn, &sid("s"));
    assert!(matches!(result, Err(StoreError::Json(_))), "{result:?}");
    Ok(())
}

#[test]
fn a_user_interrupt_marks_the_turns_prompts() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    admit(conn, &s, &mid("done"), &json!("d"), Delivery::Steer, 2)?;
    started(conn, &s)?;
    promote_steer(conn, &s, None, 3)?;
    conn.publish(&s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
    admit(conn, &s, &mid("cut"), &json!("c"), Delivery::Steer, 4)?;
    started(conn, &s)?;
    promote_steer(conn, &s, None, 5)?;
    let reason = json!({ "reason": "user" });
    conn.publish(&s, kind::EXECUTION_INTERRUPTED, &reason, 6)?;
    let marked: Vec<(String, bool)> = conn
        .prepare("SELECT id, interrupted FROM session_message ORDER BY seq")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    assert_eq!(marked, [("done".into(), false), ("cut".into(), true)]);
    Ok(())
}
