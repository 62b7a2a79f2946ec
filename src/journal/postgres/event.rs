//! The per-session event log: appending (next seq + insert + projection) and replay reads.
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

use super::claim::{claim_row, claim_seq, mark_interrupted, release, write_claim};
use super::conn::PgConn;
use super::{input, json_text, json_value, message, seq_param, seq_value, session, session_id};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::projection::{self, ProjectionRows};
use crate::journal::rules::ClaimRow;
use crate::records::{Delivery, SessionInfo};

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
    conn.appended.push((session.clone(), seq));
    Ok(EventRecord {
        session_id: session.clone(),
        seq,
        kind: kind.to_owned(),
        data,
        time,
    })
}

/// Appends a runtime event with the next seq and runs its projection, in the caller's
/// transaction.
pub(crate) fn append(
    conn: &mut PgConn,
    session: &SessionId,
    event: &SessionEvent,
    time: i64,
) -> Result<EventRecord, StoreError> {
    if let SessionEvent::ExecutionStarted { boot } = event {
        // The append and its projection (the claim) in one round trip.
        return super::turn::started(conn, session, None, boot, time)?.ok_or_else(|| {
            StoreError::Inconsistent("ds_claim_turn appended nothing without a fence".into())
        });
    }
    let record = insert(conn, session, event.kind(), event.data()?, time)?;
    projection::apply(&mut Rows(conn), session, record.seq, time, event)?;
    Ok(record)
}

/// Appends an event given by wire name and payload (a built-in name is decoded and projected
/// like [`append`]).
pub(crate) fn publish(
    conn: &mut PgConn,
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
/// [`projection::project`]'s; these are PostgreSQL's statements for it).
pub(crate) fn project(conn: &mut PgConn, ev: &EventRecord) -> Result<(), StoreError> {
    projection::project(&mut Rows(conn), ev)
}

/// PostgreSQL's statements for the projection's row writes.
struct Rows<'a>(&'a mut PgConn);

impl ProjectionRows for Rows<'_> {
    fn insert_session(&mut self, info: &SessionInfo) -> Result<(), StoreError> {
        session::insert_session(&mut *self.0, info)
    }

    fn claim_row(&mut self, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
        claim_row(&mut *self.0, id)
    }

    fn write_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        write_claim(&mut *self.0, id, claim)
    }

    fn claim_seq(&mut self, id: &SessionId) -> Result<Option<u64>, StoreError> {
        claim_seq(&mut *self.0, id)
    }

    fn mark_interrupted(&mut self, id: &SessionId, claim: u64) -> Result<(), StoreError> {
        mark_interrupted(&mut *self.0, id, claim)
    }

    fn release(&mut self, id: &SessionId) -> Result<(), StoreError> {
        release(&mut *self.0, id).map(drop)
    }

    fn insert_input(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
        prompt: &Value,
        delivery: Delivery,
        time: i64,
    ) -> Result<(), StoreError> {
        input::insert_input(&mut *self.0, session, id, seq, prompt, delivery, time)
    }

    fn mark_promoted(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
    ) -> Result<(), StoreError> {
        input::mark_promoted(&mut *self.0, session, id, seq)
    }

    fn insert_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        seq: u64,
        data: &Value,
        time: i64,
    ) -> Result<(), StoreError> {
        message::insert_message(&mut *self.0, session, id, kind, seq, data, time)
    }

    fn insert_appended(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        seq: u64,
        data: &Value,
        time: i64,
    ) -> Result<(), StoreError> {
        message::insert_appended(&mut *self.0, session, id, kind, seq, data, time)
    }
}

/// Up to `limit` events of `session` with seq greater than `after` (all when `None`), in seq
/// order, never below the start of its log (as the SQLite store's).
pub(crate) fn events_after(
    conn: &mut PgConn,
    session: &SessionId,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<EventRecord>, StoreError> {
    let after = after.map_or(-1, seq_param);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = conn.query(
        "SELECT aggregate_id, seq, type, data, time FROM event \
         WHERE aggregate_id = $1 \
           AND seq > GREATEST($2, COALESCE((SELECT log_start FROM session WHERE id = $1), 0) - 1) \
         ORDER BY seq LIMIT $3",
        &[&session.as_str(), &after, &limit],
    )?;
    rows.iter().map(record).collect()
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

/// The seq of `session`'s latest event, or `None` before its first.
pub(crate) fn latest_seq(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<Option<u64>, StoreError> {
    let row = conn.query_opt(
        "SELECT seq FROM event_sequence WHERE aggregate_id = $1",
        &[&session.as_str()],
    )?;
    row.map(|row| seq_value(row.try_get(0)?)).transpose()
}

/// The seq of `session`'s latest `session.interrupt.requested` (the type is a literal, so the
/// partial index `event_interrupt` serves it).
pub(crate) fn latest_interrupt_seq(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<Option<u64>, StoreError> {
    let row = conn.query_one(
        "SELECT MAX(seq) FROM event \
         WHERE aggregate_id = $1 AND type = 'session.interrupt.requested'",
        &[&session.as_str()],
    )?;
    let max: Option<i64> = row.try_get(0)?;
    max.map(seq_value).transpose()
}
