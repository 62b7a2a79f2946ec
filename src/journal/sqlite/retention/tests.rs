//! Tests of deletion and compaction.

use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::{create, mid, sid, test_db};

use crate::journal::sqlite::test_support::admit;
use crate::records::Delivery;

/// The lowest seq stored for `session`, replayable or not.
fn first_seq(conn: &Connection, session: &SessionId) -> Result<Option<u64>, StoreError> {
    let mut stmt = conn.prepare("SELECT MIN(seq) FROM event WHERE aggregate_id = ?1")?;
    Ok(stmt.query_row([session.as_str()], |row| {
        crate::journal::sqlite::get_opt_seq(row, 0)
    })?)
}

#[test]
fn a_tree_is_the_session_and_everything_below_it() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    create(conn, "root", None, 1)?;
    create(conn, "a", Some("root"), 2)?;
    create(conn, "b", Some("root"), 3)?;
    create(conn, "a1", Some("a"), 4)?;
    create(conn, "other", None, 5)?;
    let tree = conn.session_tree(&sid("root"))?;
    assert_eq!(tree[0], sid("root"));
    let mut rest: Vec<_> = tree[1..].iter().map(SessionId::to_string).collect();
    rest.sort();
    assert_eq!(rest, ["a", "a1", "b"]);
    assert_eq!(conn.session_tree(&sid("a"))?, [sid("a"), sid("a1")]);
    assert!(conn.session_tree(&sid("missing"))?.is_empty());
    Ok(())
}

#[test]
fn deleting_leaves_no_row_of_the_session() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let (s, other) = (sid("s"), sid("other"));
    for id in ["s", "other"] {
        create(conn, id, None, 1)?;
        admit(
            conn,
            &sid(id),
            &mid(&format!("p-{id}")),
            &json!("hi"),
            Delivery::Steer,
            2,
        )?;
        conn.append_message(
            &sid(id),
            &mid(&format!("m-{id}")),
            "assistant",
            &json!("a"),
            3,
        )?;
    }
    conn.delete_session(&s)?;
    for table in ["session_input", "session_message"] {
        let n: i64 = conn.query_row(
            &format!("SELECT COUNT(*) FROM {table} WHERE session_id = 's'"),
            [],
            |r| r.get(0),
        )?;
        assert_eq!(n, 0, "{table}");
    }
    assert!(conn.events_after(&s, None, 10)?.is_empty());
    assert_eq!(conn.latest_seq(&s)?, None);
    assert_eq!(conn.log_start(&s)?, None);
    assert_eq!(
        conn.events_after(&other, None, 10)?.len(),
        3,
        "others untouched"
    );
    Ok(())
}

#[test]
fn compaction_keeps_the_newest_events_and_the_interrupt_fence() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?; // seq 0
    conn.publish(
        &s,
        kind::INTERRUPT_REQUESTED,
        &json!({ "sessionID": "s" }),
        2,
    )?; // 1
    for i in 0..8 {
        conn.publish(&s, "custom.kind", &json!({ "i": i }), 3 + i)?; // 2..=9
    }
    assert_eq!(conn.compactable(3, 100, 10)?, std::slice::from_ref(&s));
    assert!(
        conn.compactable(3, 5, 10)?.is_empty(),
        "not idle long enough"
    );
    assert!(conn.compactable(10, 100, 10)?.is_empty(), "not long enough");
    assert_eq!(conn.compact(&s, 3, 5)?, None, "rechecked: not idle");

    assert_eq!(conn.compact(&s, 3, 100)?, Some((7, 6)));
    assert_eq!(conn.log_start(&s)?, Some(7));
    let replay: Vec<u64> = conn
        .events_after(&s, None, 100)?
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(replay, [7, 8, 9], "the fence row is kept but not replayed");
    assert_eq!(first_seq(conn, &s)?, Some(1));
    assert_eq!(conn.latest_interrupt_seq(&s)?, Some(1), "the durable fence");
    assert_eq!(conn.compact(&s, 3, 100)?, None, "nothing more to compact");

    let next = conn.publish(&s, "custom.kind", &json!({}), 50)?;
    assert_eq!(next.seq, 10, "seqs go on after the newest");
    Ok(())
}

/// A compaction that keeps no event (`keep_last` 0) leaves only the fence, below the new
/// start: seqs go on one past the last one the log had, not after the fence.
#[test]
fn a_log_compacted_whole_goes_on_after_its_last_seq() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?; // seq 0
    conn.publish(&s, kind::INTERRUPT_REQUESTED, &json!({}), 2)?; // 1
    for i in 0..3 {
        conn.publish(&s, "custom.kind", &json!({ "i": i }), 3 + i)?; // 2..=4
    }
    assert_eq!(conn.compact(&s, 0, 100)?, Some((5, 4)));
    assert_eq!(first_seq(conn, &s)?, Some(1), "the fence is kept");
    assert!(conn.events_after(&s, None, 100)?.is_empty());
    assert_eq!(conn.latest_seq(&s)?, Some(4));
    assert!(conn.compactable(0, 100, 10)?.is_empty(), "nothing left");
    assert_eq!(conn.compact(&s, 0, 100)?, None);
    assert_eq!(conn.publish(&s, "custom.kind", &json!({}), 50)?.seq, 5);

    // Without a fence, no event row is left at all.
    let t = sid("t");
    create(conn, "t", None, 1)?;
    conn.publish(&t, "custom.kind", &json!({}), 2)?;
    assert_eq!(conn.compact(&t, 0, 100)?, Some((2, 2)));
    assert_eq!(first_seq(conn, &t)?, None);
    assert_eq!(conn.latest_seq(&t)?, Some(1));
    assert_eq!(conn.publish(&t, "custom.kind", &json!({}), 50)?.seq, 2);
    Ok(())
}
