//! A log in segments: a session back after a long absence appends to a new segment, and every
//! read, compaction and deletion covers all of them.

use rusqlite::Connection;
use serde_json::json;

use super::*;
use crate::journal::sqlite::recent::settle_recent;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::{create, sid, test_db};
use crate::journal::sqlite::SqliteStore;

/// Numbers given to `n` logs of other (unstored) sessions, as a busy store would give them.
fn give_numbers(conn: &Connection, n: i64) -> rusqlite::Result<()> {
    conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) \
         INSERT INTO event_stream (aggregate_id) SELECT 'other-' || i FROM c",
        [n],
    )?;
    Ok(())
}

fn seqs(events: &[crate::event::EventRecord]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

fn note(conn: &mut SqliteStore, s: &str, n: i64) -> Result<u64, StoreError> {
    Ok(conn
        .publish(&sid(s), "custom.note", &json!({ "n": n }), n)?
        .seq)
}

/// Past [`SEGMENT_SPAN`] numbers given to others, a session's next event opens a new segment
/// at the end of the numbers; its seqs go on from the old one, and every read sees one log:
/// whole, by pages that cross the boundary, from either side of it, settled or not.
#[test]
fn a_session_back_after_a_long_absence_continues_its_log_in_a_new_segment() -> Result<(), StoreError>
{
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let a = sid("a");
    create(conn, "a", None, 1)?;
    note(conn, "a", 1)?;
    note(conn, "a", 2)?;
    let first = segments_from(conn, &a, 0)?;
    assert_eq!(first.len(), 1);
    // Still close to the end of the numbers: no new segment.
    give_numbers(conn, SEGMENT_SPAN - 2)?;
    assert_eq!(note(conn, "a", 3)?, 3);
    assert_eq!(segments_from(conn, &a, 0)?, first);
    give_numbers(conn, 10)?;
    settle_recent(conn)?;
    assert_eq!(note(conn, "a", 4)?, 4, "the seqs go on");
    let both = segments_from(conn, &a, 0)?;
    assert_eq!(both.len(), 2);
    assert_eq!(both[0], first[0]);
    let top: i64 = conn.query_row("SELECT MAX(k) FROM event_stream", [], |r| r.get(0))?;
    assert_eq!(
        both[1], top,
        "the new segment is numbered after every other"
    );
    assert_eq!(newest(conn, &a)?, Some(top));
    assert_eq!(
        note(conn, "a", 5)?,
        5,
        "the next event goes to the new segment"
    );
    let in_new: i64 =
        conn.query_row("SELECT COUNT(*) FROM event WHERE stream = ?1", [top], |r| {
            r.get(0)
        })?;
    assert_eq!(in_new, 2);
    assert_eq!(
        segments_from(conn, &a, 0)?.len(),
        2,
        "one new segment, not one per event"
    );
    let first_seqs: Vec<i64> = conn
        .prepare("SELECT first_seq FROM event_stream WHERE aggregate_id = 'a' ORDER BY k")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    assert_eq!(first_seqs, [0, 4]);
    // A read from a seq starts at the segment that holds it.
    assert_eq!(segments_from(conn, &a, 3)?, both);
    assert_eq!(segments_from(conn, &a, 4)?, [top]);
    assert_eq!(segments_from(conn, &a, 9)?, [top]);

    assert_eq!(seqs(&conn.events_after(&a, None, 100)?), [0, 1, 2, 3, 4, 5]);
    assert_eq!(seqs(&conn.events_after(&a, Some(2), 2)?), [3, 4]);
    assert_eq!(seqs(&conn.events_after(&a, Some(0), 3)?), [1, 2, 3]);
    assert_eq!(seqs(&conn.events_after(&a, Some(3), 100)?), [4, 5]);
    assert_eq!(
        seqs(&conn.events_after(&a, Some(5), 100)?),
        Vec::<u64>::new()
    );
    assert_eq!(seqs(&conn.stored_events(&a)?), [0, 1, 2, 3, 4, 5]);
    assert_eq!(conn.latest_seq(&a)?, Some(5));
    settle_recent(conn)?;
    assert_eq!(seqs(&conn.events_after(&a, Some(1), 100)?), [2, 3, 4, 5]);
    Ok(())
}

/// A compaction deletes old events in every segment and keeps the seqs going; a deletion
/// removes every segment and every event of the log.
#[test]
fn compaction_and_deletion_cover_every_segment() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let a = sid("a");
    create(conn, "a", None, 1)?;
    for n in 1..=3 {
        note(conn, "a", n)?;
    }
    give_numbers(conn, SEGMENT_SPAN + 1)?;
    for n in 4..=6 {
        note(conn, "a", n)?;
    }
    assert_eq!(segments_from(conn, &a, 0)?.len(), 2);
    // Keep the last two (5, 6): the first segment empties, the second keeps its newest.
    let (start, deleted) = conn.compact(&a, 2, i64::MAX)?.expect("compacted");
    assert_eq!((start, deleted), (5, 5));
    assert_eq!(seqs(&conn.stored_events(&a)?), [5, 6]);
    assert_eq!(note(conn, "a", 7)?, 7);
    // Keep none: the log is empty, its floor keeps the seqs going.
    conn.compact(&a, 0, i64::MAX)?.expect("compacted");
    assert_eq!(seqs(&conn.stored_events(&a)?), Vec::<u64>::new());
    assert_eq!(conn.latest_seq(&a)?, Some(7));
    assert_eq!(note(conn, "a", 8)?, 8);

    conn.delete_session(&a)?;
    assert!(segments_from(conn, &a, 0)?.is_empty());
    let rows: i64 = conn.query_row(
        "SELECT COUNT(*) FROM event WHERE aggregate_id = 'a'",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(rows, 0);
    Ok(())
}
