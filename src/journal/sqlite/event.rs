//! The per-session event log: publishing (sequence + insert + projection) and replay reads.

use rusqlite::types::Type;
use rusqlite::Connection;
use serde_json::Value;

use super::projection::Rows;
use super::recent::newest_seq;
use super::segments::{newest, segments_from};
use super::streams::{self, stream_key};
use super::{get_opt_seq, get_seq, json_text, json_value, limit_param, seq_param, StoreError};
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::journal::projection;

/// The query behind [`next_seq`] (and, one less, [`latest_seq`]): one past the newest seq of
/// the log numbered `?2` in either index (the recent one's right edge, where the new entry
/// goes; see [`super::recent`]), and never below the `event_floor` of session `?1` (written by
/// a compaction that kept none of the log's events).
pub(crate) const NEXT_SEQ_SQL: &str = concat!(
    "SELECT MAX(",
    newest_seq!(stream "?2"),
    " + 1, COALESCE((SELECT seq FROM event_floor WHERE aggregate_id = ?1), 0))"
);

/// The seq the next event of `session`, whose log is numbered `stream` (`None`: it has none
/// yet), gets (0 for the first).
fn next_seq(
    conn: &Connection,
    session: &SessionId,
    stream: Option<i64>,
) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare_cached(NEXT_SEQ_SQL)?;
    Ok(
        stmt.query_row(rusqlite::params![session.as_str(), stream], |row| {
            get_seq(row, 0)
        })?,
    )
}

/// Appends an event to `session`'s log with the next seq (0 for the first event), without its
/// projection. Events of one session appended in the same transaction (several requests of a
/// batch, or several events of one request) get consecutive seqs: the first reads the newest
/// in the indexes, the next ones follow the writer's memory of what the transaction appended
/// (see [`streams`]); the unique index of recent entries refuses a duplicate.
fn insert(
    conn: &Connection,
    session: &SessionId,
    kind: &str,
    data: Value,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let text = json_text(&data)?;
    let placed = stream_key(conn, session, |k| next_seq(conn, session, k))?;
    let stream = placed.k;
    let seq = match placed.seq.or_else(|| streams::next_appended(stream)) {
        Some(seq) => seq,
        None => next_seq(conn, session, Some(stream))?,
    };
    let mut insert = conn.prepare_cached(
        "INSERT INTO event (aggregate_id, stream, seq, type, data, time, recent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1)",
    )?;
    insert.execute(rusqlite::params![
        session.as_str(),
        stream,
        seq_param(seq),
        kind,
        text,
        time
    ])?;
    streams::appended(stream, seq);
    Ok(EventRecord {
        session_id: session.clone(),
        seq,
        kind: kind.to_owned(),
        data,
        time,
    })
}

/// Appends a runtime event to `session`'s log with the next seq and runs its projection, all on
/// the caller's transaction. Any failure, including a projection conflict, is returned; the
/// caller's transaction or savepoint then rolls the event back.
pub(crate) fn append(
    conn: &Connection,
    session: &SessionId,
    event: &SessionEvent,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let record = insert(conn, session, event.kind(), event.data()?, time)?;
    projection::apply(&mut Rows(conn), session, record.seq, time, event)?;
    Ok(record)
}

/// Appends an event given by wire name and payload (a runner-defined event; a built-in name is
/// decoded and projected like [`append`]).
pub(crate) fn publish(
    conn: &Connection,
    session: &SessionId,
    kind: &str,
    data: &Value,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let record = insert(conn, session, kind, data.clone(), time)?;
    project(conn, &record)?;
    Ok(record)
}

/// Applies the projection writes of one stored event (the rule is
/// [`projection::project`]'s; these are SQLite's statements for it).
pub(crate) fn project(conn: &Connection, ev: &EventRecord) -> Result<(), StoreError> {
    projection::project(&mut Rows(conn), ev)
}

/// Reads the `event` rows of `session` that `stmt` selects (`seq, type, data, time`) with
/// `params`, in one pass: the session id is the caller's (shared, not re-read and re-validated
/// per row) and the payload is decoded from the row's text in place.
fn read_events<P: rusqlite::Params>(
    stmt: &mut rusqlite::CachedStatement<'_>,
    session: &SessionId,
    params: P,
) -> Result<Vec<EventRecord>, StoreError> {
    let mut rows = stmt.query(params)?;
    let mut events = Vec::new();
    while let Some(row) = rows.next()? {
        events.push(EventRecord {
            session_id: session.clone(),
            seq: get_seq(row, 0)?,
            kind: row.get(1)?,
            data: json_value(row.get_ref(2)?.as_str().map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(2, Type::Text, Box::new(e))
            })?)?,
            time: row.get(3)?,
        });
    }
    Ok(events)
}

/// The query behind [`events_after`], on one segment of the log (numbered `?4`): the settled
/// history, then the recent entries (all above it), each part in its index's order, merged,
/// so the limit stops the read early.
pub(crate) const EVENTS_AFTER_SQL: &str = "\
    SELECT seq, type, data, time FROM event INDEXED BY event_log WHERE stream = ?4 \
      AND recent = 0 \
      AND seq > MAX(?2, COALESCE((SELECT log_start FROM session WHERE id = ?1), 0) - 1) \
    UNION ALL \
    SELECT seq, type, data, time FROM event INDEXED BY event_recent WHERE stream = ?4 \
      AND recent = 1 \
      AND seq > MAX(?2, COALESCE((SELECT log_start FROM session WHERE id = ?1), 0) - 1) \
    ORDER BY 1 LIMIT ?3";

/// Up to `limit` events of `session` with seq strictly greater than `after` (all when `None`),
/// in seq order — never below the start of its log (`session.log_start`): after a compaction,
/// the one older row kept (the latest interrupt request, the durable fence) is not replayed.
/// The segments are read in order (their seqs ascend with them), from the one holding
/// `after + 1`, until `limit` is reached.
pub(crate) fn events_after(
    conn: &Connection,
    session: &SessionId,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<EventRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(EVENTS_AFTER_SQL)?;
    let after = after.map_or(-1, seq_param);
    let from = u64::try_from(after + 1).unwrap_or(0);
    let mut events = Vec::new();
    for k in segments_from(conn, session, from)? {
        let left = limit - events.len();
        if left == 0 {
            break;
        }
        events.extend(read_events(
            &mut stmt,
            session,
            rusqlite::params![session.as_str(), after, limit_param(Some(left)), k],
        )?);
    }
    Ok(events)
}

/// Every stored event row of `session`, in seq order, below the start of a compacted log too
/// (the kept interrupt fence), without reading the session row: what `testing::events`
/// inspects, on a database of any schema version (before version 9, by the session id).
pub(crate) fn stored_events(
    conn: &Connection,
    session: &SessionId,
) -> Result<Vec<EventRecord>, StoreError> {
    let numbered = conn.prepare_cached(
        "SELECT seq, type, data, time FROM event INDEXED BY event_log WHERE stream = ?2 \
           AND recent = 0 \
         UNION ALL \
         SELECT seq, type, data, time FROM event INDEXED BY event_recent WHERE stream = ?2 \
           AND recent = 1 ORDER BY 1",
    );
    let (Ok(mut stmt), Ok(ks)) = (numbered, segments_from(conn, session, 0)) else {
        let mut stmt = conn.prepare_cached(
            "SELECT seq, type, data, time FROM event WHERE aggregate_id = ?1 ORDER BY seq",
        )?;
        return read_events(&mut stmt, session, [session.as_str()]);
    };
    let mut events = Vec::new();
    for k in ks {
        events.extend(read_events(
            &mut stmt,
            session,
            rusqlite::params![session.as_str(), k],
        )?);
    }
    Ok(events)
}

/// The seq of `session`'s latest event, or `None` before its first (after a compaction that
/// kept none of its events: the seq its last event had).
pub(crate) fn latest_seq(
    conn: &Connection,
    session: &SessionId,
) -> Result<Option<u64>, StoreError> {
    let stream = newest(conn, session)?;
    Ok(next_seq(conn, session, stream)?.checked_sub(1))
}

/// The query behind [`latest_interrupt_seq`]. The type is a literal, not a parameter, so that
/// SQLite can use the partial index `event_interrupt`.
pub(super) const LATEST_INTERRUPT_SQL: &str = "SELECT MAX(seq) FROM event \
     WHERE aggregate_id = ?1 AND type = 'session.interrupt.requested'";

/// The seq of `session`'s latest `session.interrupt.requested` event, if any.
pub(crate) fn latest_interrupt_seq(
    conn: &Connection,
    session: &SessionId,
) -> Result<Option<u64>, StoreError> {
    let mut stmt = conn.prepare_cached(LATEST_INTERRUPT_SQL)?;
    Ok(stmt.query_row([session.as_str()], |row| get_opt_seq(row, 0))?)
}

#[cfg(test)]
mod tests {
    use rusqlite::TransactionBehavior;
    use serde_json::json;

    use super::*;
    use crate::event::kind;
    use crate::journal::sqlite::pool::open_connection;
    use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
    use crate::journal::sqlite::{
        admit, append_message, claim_state, get_input, messages, pending_inputs, promote_steer,
    };
    use crate::records::Delivery;
    use crate::records::MessagesQuery;

    #[test]
    fn seqs_start_at_zero_and_are_independent_per_session() -> Result<(), StoreError> {
        let db = test_db()?;
        let conn = &db.conn;
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
                            let tx =
                                conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
        let db = test_db()?;
        let conn = &db.conn;
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
        let db = test_db()?;
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
        assert!(messages(&db.conn, &MessagesQuery::new(sid("s")))?.is_empty());
        Ok(())
    }

    #[test]
    fn replaying_prompt_projections_rebuilds_inbox_and_transcript() -> Result<(), StoreError> {
        let db = test_db()?;
        let conn = &db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        admit(conn, &s, &mid("p1"), &json!("one"), Delivery::Steer, 2)?;
        admit(conn, &s, &mid("p2"), &json!("two"), Delivery::Queue, 3)?;
        admit(conn, &s, &mid("p3"), &json!("three"), Delivery::Steer, 4)?;
        promote_steer(conn, &s, Some(1), 5)?;
        append_message(conn, &s, &mid("a1"), "assistant", &json!({"text": "ok"}), 6)?;
        let inputs =
            |conn: &Connection| -> Result<Vec<Option<crate::records::Admission>>, StoreError> {
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
}
