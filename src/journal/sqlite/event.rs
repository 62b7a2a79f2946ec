//! The per-session event log ([`EventRows`]): appends (sequence + insert + projection) and
//! replay reads.

use std::borrow::Borrow;

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;

use super::recent::newest_seq;
use super::segments::{newest, segments_from};
use super::{
    get_opt_seq, get_seq, json_text, json_value, limit_param, seq_param, SqliteStore, StoreError,
};
use crate::event::EventRecord;
use crate::id::SessionId;
use crate::journal::backend::EventRows;

/// The query behind [`next_seq`] (and, one less, `latest_seq`): one past the newest seq of
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

/// The query behind `events_after`, on one segment of the log (numbered `?4`): the settled
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

/// The query behind `latest_interrupt_seq`. The type is a literal, not a parameter, so that
/// SQLite can use the partial index `event_interrupt`.
pub(super) const LATEST_INTERRUPT_SQL: &str = "SELECT MAX(seq) FROM event \
     WHERE aggregate_id = ?1 AND type = 'session.interrupt.requested'";

/// Appends an event to the log of `session` with the next seq (0 for the first event), without
/// its projection. Events of one session appended in the same transaction (several requests of
/// a batch, or several events of one request) get consecutive seqs: the first reads the newest
/// in the indexes, the next ones follow the writer's memory of what the transaction appended
/// (see [`super::streams`]); the unique index of recent entries refuses a duplicate.
fn insert<C: Borrow<Connection>>(
    store: &mut SqliteStore<C>,
    session: &SessionId,
    kind: &str,
    data: Value,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let text = json_text(&data)?;
    let conn = store.conn.borrow();
    let streams = &mut store.streams;
    let placed = streams.stream_key(conn, session, |k| next_seq(conn, session, k))?;
    let stream = placed.k;
    let seq = match placed.seq.or_else(|| streams.next_appended(stream)) {
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
    streams.appended(stream, seq);
    Ok(EventRecord {
        session_id: session.clone(),
        seq,
        kind: kind.to_owned(),
        data,
        time,
    })
}

impl<C: Borrow<Connection>> EventRows for SqliteStore<C> {
    fn insert_event(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: Value,
        time: i64,
    ) -> Result<EventRecord, StoreError> {
        insert(self, session, kind, data, time)
    }

    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let conn = self.conn();
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

    /// The seq of `session`'s latest `session.interrupt.requested` event, if any.
    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let mut stmt = self.conn().prepare_cached(LATEST_INTERRUPT_SQL)?;
        Ok(stmt.query_row([session.as_str()], |row| get_opt_seq(row, 0))?)
    }

    /// The seq of `session`'s latest event, or `None` before its first (after a compaction
    /// that kept none of its events: the seq its last event had).
    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let stream = newest(self.conn(), session)?;
        Ok(next_seq(self.conn(), session, stream)?.checked_sub(1))
    }

    /// The first seq of `session`'s log a replay returns (0 until compacted); `None` when the
    /// session is not stored.
    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT log_start FROM session WHERE id = ?1")?;
        Ok(stmt
            .query_row([session.as_str()], |row| get_seq(row, 0))
            .optional()?)
    }
}

impl<C: Borrow<Connection>> SqliteStore<C> {
    /// Every stored event row of `session`, in seq order, below the start of a compacted log too
    /// (the kept interrupt fence), without reading the session row: what `testing::events`
    /// inspects, on a database of any schema version (before version 9, by the session id).
    pub(crate) fn stored_events(
        &mut self,
        session: &SessionId,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let conn = self.conn();
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
}

#[cfg(test)]
mod tests;
