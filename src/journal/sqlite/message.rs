//! The transcript (`session_message`): appends, lookups and keyset pages by `seq`.

use rusqlite::{Connection, OptionalExtension, Row};
use serde_json::Value;

use super::{
    append, conflict_on_constraint, get_seq, json_text, json_value, limit_param, message_id,
    seq_param, session_id, StoreError,
};
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::rules::Scan;
use crate::records::{Message, Order};

macro_rules! message_columns {
    () => {
        "id, session_id, type, seq, data, time_created"
    };
}

/// A `session_message` row as stored, before ids and JSON are decoded.
struct MessageRow {
    id: String,
    session_id: String,
    kind: String,
    seq: u64,
    data: String,
    time_created: i64,
    interrupted: bool,
}

impl MessageRow {
    /// Reads the columns of `message_columns!()`, then `interrupted`, in order.
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            session_id: row.get(1)?,
            kind: row.get(2)?,
            seq: get_seq(row, 3)?,
            data: row.get(4)?,
            time_created: row.get(5)?,
            interrupted: row.get(6)?,
        })
    }

    /// Decodes the row; a malformed `data` payload is [`StoreError::Json`].
    fn decode(self) -> Result<Message, StoreError> {
        Ok(Message {
            id: message_id(self.id)?,
            session_id: session_id(self.session_id)?,
            kind: self.kind,
            seq: self.seq,
            data: json_value(&self.data)?,
            time_created: self.time_created,
            interrupted: self.interrupted,
        })
    }
}

/// Inserts a transcript row created by event `seq` (the projection of
/// `session.message.appended` and part of `session.prompt.promoted`). An id already in a
/// transcript, or a seq already used in this one, is a conflict.
pub(super) fn insert_message(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
    kind: &str,
    seq: u64,
    data: &Value,
    time: i64,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "INSERT INTO session_message (",
        message_columns!(),
        ", time_updated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)"
    ))?;
    stmt.execute(rusqlite::params![
        id.as_str(),
        session.as_str(),
        kind,
        seq_param(seq),
        json_text(data)?,
        time,
    ])
    .map_err(|e| {
        conflict_on_constraint(e, || {
            format!("message {id} cannot be added to session {session}")
        })
    })?;
    Ok(())
}

/// Appends a message to `session`'s transcript by publishing `session.message.appended`. An id
/// already in a transcript is [`StoreError::Conflict`].
pub(crate) fn append_message(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
    kind: &str,
    data: &Value,
    now: i64,
) -> Result<EventRecord, StoreError> {
    let appended = SessionEvent::MessageAppended {
        message_id: id.clone(),
        kind: kind.to_owned(),
        data: data.clone(),
    };
    append(conn, session, &appended, now)
}

/// The message `id` of `session`; `None` when it is unknown or belongs to another session.
pub(crate) fn get_message(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
) -> Result<Option<Message>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        message_columns!(),
        ", interrupted",
        " FROM session_message WHERE id = ?1 AND session_id = ?2"
    ))?;
    let row = stmt
        .query_row([id.as_str(), session.as_str()], MessageRow::read)
        .optional()?;
    row.map(MessageRow::decode).transpose()
}

/// Whether any transcript holds a message `id`.
pub(crate) fn message_exists(conn: &Connection, id: &MessageId) -> Result<bool, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM session_message WHERE id = ?1)")?;
    Ok(stmt.query_row([id.as_str()], |row| row.get(0))?)
}

/// The seq of message `id` within `session`.
pub(crate) fn message_seq(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
) -> Result<Option<u64>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT seq FROM session_message WHERE id = ?1 AND session_id = ?2")?;
    Ok(stmt
        .query_row([id.as_str(), session.as_str()], |row| get_seq(row, 0))
        .optional()?)
}

/// The messages of `session` in the range of `scan`, in its order: a range scan of the
/// `UNIQUE (session_id, seq)` index.
pub(crate) fn scan_messages(
    conn: &Connection,
    session: &SessionId,
    scan: Scan,
) -> Result<Vec<Message>, StoreError> {
    let limit = limit_param(scan.limit);
    let sql = match (scan.order, scan.past.is_some()) {
        (Order::Asc, false) => concat!(
            "SELECT ",
            message_columns!(),
            ", interrupted FROM session_message WHERE session_id = ?1 \
             ORDER BY seq ASC LIMIT ?2"
        ),
        (Order::Desc, false) => concat!(
            "SELECT ",
            message_columns!(),
            ", interrupted FROM session_message WHERE session_id = ?1 \
             ORDER BY seq DESC LIMIT ?2"
        ),
        (Order::Asc, true) => concat!(
            "SELECT ",
            message_columns!(),
            ", interrupted FROM session_message WHERE session_id = ?1 AND seq > ?3 \
             ORDER BY seq ASC LIMIT ?2"
        ),
        (Order::Desc, true) => concat!(
            "SELECT ",
            message_columns!(),
            ", interrupted FROM session_message WHERE session_id = ?1 AND seq < ?3 \
             ORDER BY seq DESC LIMIT ?2"
        ),
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = match scan.past {
        None => stmt.query_map(rusqlite::params![session.as_str(), limit], MessageRow::read)?,
        Some(past) => stmt.query_map(
            rusqlite::params![session.as_str(), limit, seq_param(past)],
            MessageRow::read,
        )?,
    }
    .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(MessageRow::decode).collect()
}

#[cfg(test)]
mod tests;
