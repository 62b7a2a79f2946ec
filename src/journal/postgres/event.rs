//! The per-session event log ([`EventRows`]): appending (next seq + insert + projection) and
//! replay reads.
//!
//! An append is one round trip, the schema's function `ds_append`: the seq comes from the
//! session's `event_sequence` row, taken with `INSERT … ON CONFLICT DO UPDATE … RETURNING`,
//! which stays locked until COMMIT, so writers of one session on several nodes serialize on it
//! and seqs stay gap-free (0 for the first event). The event row records this node and the
//! session's current `owner_epoch`, read by a later statement of the function (a fresh snapshot:
//! it sees every ownership change committed before this writer got the seq). Its projection
//! is a statement of its own, except for `session.execution.started`, appended together with
//! the claim it takes by `ds_claim_turn` (see `turn`).

use serde_json::Value;

use super::conn::PgConn;
use super::{json_text, json_value, seq_param, seq_value, session_id, turn};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::journal::backend::EventRows;

/// Appends an event to `session`'s log with the next seq, without its projection.
fn insert(
    conn: &mut PgConn,
    session: &SessionId,
    kind: &str,
    data: Value,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let text = json_text(&data)?;
    let node = conn.node_arc();
    let row = conn.query_one(
        "SELECT ds_append($1, $2, $3, $4, $5)",
        &[&session.as_str(), &kind, &text, &time, &&*node],
    )?;
    let seq = seq_value(row.try_get(0)?)?;
    Ok(appended(conn, session, seq, kind, data, time))
}

/// The record of an event appended at `seq` (by `ds_append` or a turn's function), noted for
/// the batch's `ds_events`.
pub(super) fn appended(
    conn: &mut PgConn,
    session: &SessionId,
    seq: u64,
    kind: &str,
    data: Value,
    time: i64,
) -> EventRecord {
    conn.appended.push((session.clone(), seq));
    EventRecord {
        session_id: session.clone(),
        seq,
        kind: kind.to_owned(),
        data,
        time,
    }
}

/// Every stored event row of `session`, in seq order, below the start of a compacted log too
/// (as the SQLite store's `stored_events`).
pub(crate) fn stored_events(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<Vec<EventRecord>, StoreError> {
    let rows = conn.query(
        "SELECT aggregate_id, seq, type, data, time FROM event WHERE aggregate_id = $1 \
         ORDER BY seq",
        &[&session.as_str()],
    )?;
    rows.iter().map(record).collect()
}

/// Decodes an `event` row (`aggregate_id, seq, type, data, time`).
fn record(row: &postgres::Row) -> Result<EventRecord, StoreError> {
    let data: String = row.try_get(3)?;
    Ok(EventRecord {
        session_id: session_id(row.try_get(0)?)?,
        seq: seq_value(row.try_get(1)?)?,
        kind: row.try_get(2)?,
        data: json_value(&data)?,
        time: row.try_get(4)?,
    })
}

impl EventRows for PgConn {
    /// Appends an event to `session`'s log with the next seq (`ds_append`, one round trip),
    /// without its projection.
    fn insert_event(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: Value,
        time: i64,
    ) -> Result<EventRecord, StoreError> {
        insert(self, session, kind, data, time)
    }

    /// `session.execution.started` and its projection (the claim) in one round trip.
    fn append_projected(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        time: i64,
    ) -> Result<Option<EventRecord>, StoreError> {
        // A retry's claim (`turn` set) keeps its turn's seq: the statements run one by one.
        let SessionEvent::ExecutionStarted { boot, turn: None } = event else {
            return Ok(None);
        };
        turn::started(self, session, None, boot, time)?
            .ok_or_else(|| {
                StoreError::Inconsistent("ds_claim_turn appended nothing without a fence".into())
            })
            .map(Some)
    }

    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let after = after.map_or(-1, seq_param);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(
            "SELECT aggregate_id, seq, type, data, time FROM event \
             WHERE aggregate_id = $1 \
               AND seq > GREATEST($2, \
                              COALESCE((SELECT log_start FROM session WHERE id = $1), 0) - 1) \
             ORDER BY seq LIMIT $3",
            &[&session.as_str(), &after, &limit],
        )?;
        rows.iter().map(record).collect()
    }

    /// The seq of `session`'s latest `session.interrupt.requested` (the type is a literal, so the
    /// partial index `event_interrupt` serves it).
    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let row = self.query_one(
            "SELECT MAX(seq) FROM event \
             WHERE aggregate_id = $1 AND type = 'session.interrupt.requested'",
            &[&session.as_str()],
        )?;
        let max: Option<i64> = row.try_get(0)?;
        max.map(seq_value).transpose()
    }

    /// The seq of `session`'s latest event, or `None` before its first.
    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let row = self.query_opt(
            "SELECT seq FROM event_sequence WHERE aggregate_id = $1",
            &[&session.as_str()],
        )?;
        row.map(|row| seq_value(row.try_get(0)?)).transpose()
    }

    /// The first seq of `session`'s log a replay returns; `None` when it is not stored.
    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let row = self.query_opt(
            "SELECT log_start FROM session WHERE id = $1",
            &[&session.as_str()],
        )?;
        row.map(|row| seq_value(row.try_get(0)?)).transpose()
    }
}
