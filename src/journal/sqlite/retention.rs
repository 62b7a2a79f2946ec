//! Deleting sessions and compacting their event logs: the session tree, every row keyed by a
//! session, where a session's log starts, and the compaction of idle sessions' old events.
//! Every value is a bound parameter.

use rusqlite::{Connection, OptionalExtension};

use super::recent::{newest_seq, segments_of, stream_of, time_of_latest};
use super::{get_seq, latest_interrupt_seq, seq_param, session_id, StoreError};
use crate::id::SessionId;

/// `session` and every session below it, `session` first; empty when it is not stored.
pub(crate) fn session_tree(
    conn: &Connection,
    session: &SessionId,
) -> Result<Vec<SessionId>, StoreError> {
    // `UNION` (not `UNION ALL`): a row seen twice is not walked again, so the walk ends even if
    // the parent links of a hand-edited database formed a cycle.
    let mut stmt = conn.prepare_cached(
        "WITH RECURSIVE tree(id) AS ( \
             SELECT id FROM session WHERE id = ?1 \
             UNION SELECT s.id FROM session s JOIN tree t ON s.parent_id = t.id \
         ) SELECT id FROM tree",
    )?;
    let ids = stmt
        .query_map([session.as_str()], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut tree = Vec::with_capacity(ids.len());
    for id in ids {
        let id = session_id(id)?;
        if &id == session {
            tree.insert(0, id);
        } else {
            tree.push(id);
        }
    }
    Ok(tree)
}

/// Deletes every row keyed by `session`: the inbox, the transcript, the event log and its
/// number (which the writer forgets at once), the claim, the seq floor and the session row.
pub(crate) fn delete_session(conn: &Connection, session: &SessionId) -> Result<(), StoreError> {
    super::streams::forget(session);
    for sql in [
        "DELETE FROM session_input WHERE session_id = ?1",
        "DELETE FROM session_message WHERE session_id = ?1",
        concat!(
            "DELETE FROM event INDEXED BY event_log WHERE stream IN ",
            segments_of!("?1"),
            " AND recent = 0"
        ),
        concat!(
            "DELETE FROM event INDEXED BY event_recent WHERE stream IN ",
            segments_of!("?1"),
            " AND recent = 1"
        ),
        "DELETE FROM event_stream WHERE aggregate_id = ?1",
        "DELETE FROM session_claim WHERE session_id = ?1",
        "DELETE FROM event_floor WHERE aggregate_id = ?1",
        "DELETE FROM session WHERE id = ?1",
    ] {
        conn.prepare_cached(sql)?.execute([session.as_str()])?;
    }
    Ok(())
}

/// The first seq of `session`'s log a replay returns (0 until compacted); `None` when the
/// session is not stored.
pub(crate) fn log_start(conn: &Connection, session: &SessionId) -> Result<Option<u64>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT log_start FROM session WHERE id = ?1")?;
    Ok(stmt
        .query_row([session.as_str()], |row| get_seq(row, 0))
        .optional()?)
}

/// Up to `limit` unclaimed sessions whose log holds more than `keep_last` events and whose
/// newest event was committed before `idle_before`.
pub(crate) fn compactable(
    conn: &Connection,
    keep_last: u64,
    idle_before: i64,
    limit: usize,
) -> Result<Vec<SessionId>, StoreError> {
    // The newest event's time is looked up only for sessions the cheap tests let through, so a
    // pass over sessions compacted already costs one probe of each log's newest seq. A log
    // that kept no event (its newest seq is the fence, or none) has nothing more to compact.
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT id FROM (SELECT s.id, s.log_start, ",
        newest_seq!("s.id"),
        " AS latest \
              FROM session s \
              WHERE NOT EXISTS (SELECT 1 FROM session_claim c \
                                WHERE c.session_id = s.id AND c.time_suspended IS NOT NULL)) \
         WHERE latest >= 0 AND latest + 1 - log_start > ?1 \
           AND ",
        time_of_latest!("id"),
        " < ?2 LIMIT ?3"
    ))?;
    let ids = stmt
        .query_map(
            rusqlite::params![
                seq_param(keep_last),
                idle_before,
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |row| row.get::<_, String>(0),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    ids.into_iter().map(session_id).collect()
}

/// Compacts `session`'s log if it still qualifies (unclaimed, idle since before
/// `idle_before`, more than `keep_last` events): deletes every event below the new start but
/// the latest interrupt request, and records the start. When no event is kept (`keep_last`
/// 0), the start is also the log's seq floor (`event_floor`): the next event gets it, as it
/// would have with the newest event kept. Returns the start and how many events went.
pub(crate) fn compact(
    conn: &Connection,
    session: &SessionId,
    keep_last: u64,
    idle_before: i64,
) -> Result<Option<(u64, usize)>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT latest, log_start, claimed, ",
        time_of_latest!("?1"),
        " FROM (SELECT ",
        newest_seq!("s.id"),
        " AS latest, s.log_start, \
                      EXISTS (SELECT 1 FROM session_claim c WHERE c.session_id = s.id \
                              AND c.time_suspended IS NOT NULL) AS claimed \
               FROM session s WHERE s.id = ?1) \
         WHERE latest >= 0"
    ))?;
    let found = stmt
        .query_row([session.as_str()], |row| {
            Ok((
                get_seq(row, 0)?,
                get_seq(row, 1)?,
                row.get::<_, bool>(2)?,
                row.get::<_, Option<i64>>(3)?,
            ))
        })
        .optional()?;
    let Some((latest, start, claimed, newest)) = found else {
        return Ok(None);
    };
    let start_now = (latest + 1).saturating_sub(keep_last);
    if claimed || start_now <= start || newest.is_none_or(|time| time >= idle_before) {
        return Ok(None);
    }
    let fence = latest_interrupt_seq(conn, session)?;
    super::streams::forget_appended();
    let mut deleted = 0;
    for sql in [
        concat!(
            "DELETE FROM event INDEXED BY event_log WHERE stream IN ",
            segments_of!("?1"),
            " AND recent = 0 AND seq < ?2 AND seq <> ?3"
        ),
        concat!(
            "DELETE FROM event INDEXED BY event_recent WHERE stream IN ",
            segments_of!("?1"),
            " AND recent = 1 AND seq < ?2 AND seq <> ?3"
        ),
    ] {
        deleted += conn.prepare_cached(sql)?.execute(rusqlite::params![
            session.as_str(),
            seq_param(start_now),
            fence.map_or(-1, seq_param)
        ])?;
    }
    conn.prepare_cached("UPDATE session SET log_start = ?2 WHERE id = ?1")?
        .execute(rusqlite::params![session.as_str(), seq_param(start_now)])?;
    if start_now > latest {
        conn.prepare_cached(
            "INSERT INTO event_floor (aggregate_id, seq) VALUES (?1, ?2) \
             ON CONFLICT (aggregate_id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
        )?
        .execute(rusqlite::params![session.as_str(), seq_param(start_now)])?;
    }
    Ok(Some((start_now, deleted)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::kind;
    use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
    use crate::journal::sqlite::{append_message, events_after, latest_seq, publish};

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
        let tree = session_tree(conn, &sid("root"))?;
        assert_eq!(tree[0], sid("root"));
        let mut rest: Vec<_> = tree[1..].iter().map(SessionId::to_string).collect();
        rest.sort();
        assert_eq!(rest, ["a", "a1", "b"]);
        assert_eq!(session_tree(conn, &sid("a"))?, [sid("a"), sid("a1")]);
        assert!(session_tree(conn, &sid("missing"))?.is_empty());
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
            append_message(
                conn,
                &sid(id),
                &mid(&format!("m-{id}")),
                "assistant",
                &json!("a"),
                3,
            )?;
        }
        delete_session(conn, &s)?;
        for table in ["session_input", "session_message"] {
            let n: i64 = conn.query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE session_id = 's'"),
                [],
                |r| r.get(0),
            )?;
            assert_eq!(n, 0, "{table}");
        }
        assert!(events_after(conn, &s, None, 10)?.is_empty());
        assert_eq!(latest_seq(conn, &s)?, None);
        assert_eq!(log_start(conn, &s)?, None);
        assert_eq!(
            events_after(conn, &other, None, 10)?.len(),
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
        publish(
            conn,
            &s,
            kind::INTERRUPT_REQUESTED,
            &json!({ "sessionID": "s" }),
            2,
        )?; // 1
        for i in 0..8 {
            publish(conn, &s, "custom.kind", &json!({ "i": i }), 3 + i)?; // 2..=9
        }
        assert_eq!(compactable(conn, 3, 100, 10)?, std::slice::from_ref(&s));
        assert!(
            compactable(conn, 3, 5, 10)?.is_empty(),
            "not idle long enough"
        );
        assert!(
            compactable(conn, 10, 100, 10)?.is_empty(),
            "not long enough"
        );
        assert_eq!(compact(conn, &s, 3, 5)?, None, "rechecked: not idle");

        assert_eq!(compact(conn, &s, 3, 100)?, Some((7, 6)));
        assert_eq!(log_start(conn, &s)?, Some(7));
        let replay: Vec<u64> = events_after(conn, &s, None, 100)?
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(replay, [7, 8, 9], "the fence row is kept but not replayed");
        assert_eq!(first_seq(conn, &s)?, Some(1));
        assert_eq!(
            latest_interrupt_seq(conn, &s)?,
            Some(1),
            "the durable fence"
        );
        assert_eq!(compact(conn, &s, 3, 100)?, None, "nothing more to compact");

        let next = publish(conn, &s, "custom.kind", &json!({}), 50)?;
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
        publish(conn, &s, kind::INTERRUPT_REQUESTED, &json!({}), 2)?; // 1
        for i in 0..3 {
            publish(conn, &s, "custom.kind", &json!({ "i": i }), 3 + i)?; // 2..=4
        }
        assert_eq!(compact(conn, &s, 0, 100)?, Some((5, 4)));
        assert_eq!(first_seq(conn, &s)?, Some(1), "the fence is kept");
        assert!(events_after(conn, &s, None, 100)?.is_empty());
        assert_eq!(latest_seq(conn, &s)?, Some(4));
        assert!(compactable(conn, 0, 100, 10)?.is_empty(), "nothing left");
        assert_eq!(compact(conn, &s, 0, 100)?, None);
        assert_eq!(publish(conn, &s, "custom.kind", &json!({}), 50)?.seq, 5);

        // Without a fence, no event row is left at all.
        let t = sid("t");
        create(conn, "t", None, 1)?;
        publish(conn, &t, "custom.kind", &json!({}), 2)?;
        assert_eq!(compact(conn, &t, 0, 100)?, Some((2, 2)));
        assert_eq!(first_seq(conn, &t)?, None);
        assert_eq!(latest_seq(conn, &t)?, Some(1));
        assert_eq!(publish(conn, &t, "custom.kind", &json!({}), 50)?.seq, 2);
        Ok(())
    }
}
