//! The transcript (`session_message`): appends, lookups, keyset pages by `seq`, and the
//! maintenance queries (transcript owner, projection rebuild, undecodable messages).

use postgres::Row;
use serde_json::Value;

use super::conn::PgConn;
use super::session_id;
use super::{event, json_text, json_value, limit_param, message_id, seq_param, seq_value};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::rules::Scan;
use crate::records::{Message, Order};

macro_rules! message_columns {
    () => {
        "id, session_id, type, seq, data, time_created, interrupted"
    };
}

/// Decodes a row of `message_columns!()`; a malformed `data` payload is [`StoreError::Json`].
fn decode(row: &Row) -> Result<Message, StoreError> {
    let data: String = row.try_get(4)?;
    Ok(Message {
        id: message_id(row.try_get(0)?)?,
        session_id: session_id(row.try_get(1)?)?,
        kind: row.try_get(2)?,
        seq: seq_value(row.try_get(3)?)?,
        data: json_value(&data)?,
        time_created: row.try_get(5)?,
        interrupted: row.try_get(6)?,
    })
}

/// Inserts a transcript row created by event `seq`; an id already in a transcript, or a seq
/// already used in this one, is a conflict.
pub(super) fn insert_message(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
    kind: &str,
    seq: u64,
    data: &Value,
    time: i64,
) -> Result<(), StoreError> {
    let data = json_text(data)?;
    conn.execute_or_conflict(
        "INSERT INTO session_message \
         (id, session_id, type, seq, data, time_created, time_updated) \
         VALUES ($1, $2, $3, $4, $5, $6, $6)",
        &[
            &id.as_str(),
            &session.as_str(),
            &kind,
            &seq_param(seq),
            &data,
            &time,
        ],
        || format!("message {id} cannot be added to session {session}"),
    )?;
    Ok(())
}

/// Inserts the transcript row of `session.message.appended`: an id of the inbox (prompts enter
/// the transcript by promotion) or already in a transcript is a conflict. The inbox check and
/// the insert are one statement (one round trip).
pub(super) fn insert_appended(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
    kind: &str,
    seq: u64,
    data: &Value,
    time: i64,
) -> Result<(), StoreError> {
    let data = json_text(data)?;
    let inserted = conn.execute_or_conflict(
        "INSERT INTO session_message \
         (id, session_id, type, seq, data, time_created, time_updated) \
         SELECT $1, $2, $3, $4, $5, $6, $6 \
         WHERE NOT EXISTS (SELECT 1 FROM session_input WHERE id = $1)",
        &[
            &id.as_str(),
            &session.as_str(),
            &kind,
            &seq_param(seq),
            &data,
            &time,
        ],
        || format!("message {id} cannot be added to session {session}"),
    )?;
    if inserted == 0 {
        return Err(StoreError::Conflict(format!(
            "message {id} is a prompt id; prompts enter the transcript by promotion"
        )));
    }
    Ok(())
}

/// Appends a message by publishing `session.message.appended`.
pub(crate) fn append_message(
    conn: &mut PgConn,
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
    event::append(conn, session, &appended, now)
}

/// The message `id` of `session`; `None` when unknown or of another session.
pub(crate) fn get_message(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
) -> Result<Option<Message>, StoreError> {
    let row = conn.query_opt(
        concat!(
            "SELECT ",
            message_columns!(),
            " FROM session_message WHERE id = $1 AND session_id = $2"
        ),
        &[&id.as_str(), &session.as_str()],
    )?;
    row.as_ref().map(decode).transpose()
}

/// The seq of message `id` within `session`.
pub(crate) fn message_seq(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
) -> Result<Option<u64>, StoreError> {
    let row = conn.query_opt(
        "SELECT seq FROM session_message WHERE id = $1 AND session_id = $2",
        &[&id.as_str(), &session.as_str()],
    )?;
    row.map(|row| seq_value(row.try_get(0)?)).transpose()
}

/// The messages of `session` in the range of `scan`, in its order: a range scan of the
/// `UNIQUE (session_id, seq)` index.
pub(crate) fn scan_messages(
    conn: &mut PgConn,
    session: &SessionId,
    scan: Scan,
) -> Result<Vec<Message>, StoreError> {
    let limit = limit_param(scan.limit);
    let session = session.as_str();
    let sql = match (scan.order, scan.past.is_some()) {
        (Order::Asc, false) => concat!(
            "SELECT ",
            message_columns!(),
            " FROM session_message WHERE session_id = $1 ORDER BY seq ASC LIMIT $2"
        ),
        (Order::Desc, false) => concat!(
            "SELECT ",
            message_columns!(),
            " FROM session_message WHERE session_id = $1 ORDER BY seq DESC LIMIT $2"
        ),
        (Order::Asc, true) => concat!(
            "SELECT ",
            message_columns!(),
            " FROM session_message WHERE session_id = $1 AND seq > $3 \
             ORDER BY seq ASC LIMIT $2"
        ),
        (Order::Desc, true) => concat!(
            "SELECT ",
            message_columns!(),
            " FROM session_message WHERE session_id = $1 AND seq < $3 \
             ORDER BY seq DESC LIMIT $2"
        ),
    };
    let rows = match scan.past {
        None => conn.query(sql, &[&session, &limit])?,
        Some(past) => conn.query(sql, &[&session, &limit, &seq_param(past)])?,
    };
    rows.iter().map(decode).collect()
}

/// The session whose transcript holds message `id`, if any.
pub(crate) fn transcript_owner(
    conn: &mut PgConn,
    id: &MessageId,
) -> Result<Option<SessionId>, StoreError> {
    let row = conn.query_opt(
        "SELECT session_id FROM session_message WHERE id = $1",
        &[&id.as_str()],
    )?;
    row.map(|row| session_id(row.try_get(0)?)).transpose()
}

/// Deletes `session`'s inbox and transcript rows (before they are rebuilt from its events).
pub(crate) fn delete_projections(conn: &mut PgConn, session: &SessionId) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM session_input WHERE session_id = $1",
        &[&session.as_str()],
    )?;
    conn.execute(
        "DELETE FROM session_message WHERE session_id = $1",
        &[&session.as_str()],
    )?;
    Ok(())
}

/// How many inbox and transcript rows `session` has.
pub(crate) fn projection_counts(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<(usize, usize), StoreError> {
    let row = conn.query_one(
        "SELECT (SELECT COUNT(*) FROM session_input WHERE session_id = $1), \
                (SELECT COUNT(*) FROM session_message WHERE session_id = $1)",
        &[&session.as_str()],
    )?;
    let (inputs, messages): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    Ok((
        usize::try_from(inputs).unwrap_or(0),
        usize::try_from(messages).unwrap_or(0),
    ))
}

/// The first message of `session`'s transcript (in seq order) whose stored payload is not valid
/// JSON, if any.
pub(crate) fn undecodable_message(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<Option<MessageId>, StoreError> {
    let rows = conn.query(
        "SELECT id, data FROM session_message WHERE session_id = $1 ORDER BY seq",
        &[&session.as_str()],
    )?;
    for row in rows {
        let data: String = row.try_get(1)?;
        if serde_json::from_str::<Value>(&data).is_err() {
            return message_id(row.try_get(0)?).map(Some);
        }
    }
    Ok(None)
}
