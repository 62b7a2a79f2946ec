//! The prompt inbox (`session_input`): admission and steer/queue promotion (as the SQLite
//! store's).

use postgres::Row;
use serde_json::Value;

use super::conn::{Params, PgConn};
use super::{json_text, json_value, message_id, seq_param, seq_value, session_id};
use crate::error::StoreError;
use crate::id::{MessageId, SessionId};
use crate::records::{Admission, Delivery};

macro_rules! input_columns {
    () => {
        "id, session_id, admitted_seq, prompt, delivery, time_created, promoted_seq"
    };
}

/// Decodes a row of `input_columns!()`.
fn decode(row: &Row) -> Result<Admission, StoreError> {
    let delivery: String = row.try_get(4)?;
    let delivery = delivery
        .parse::<Delivery>()
        .map_err(|e| StoreError::Inconsistent(format!("stored delivery: {e}")))?;
    let prompt: String = row.try_get(3)?;
    let promoted: Option<i64> = row.try_get(6)?;
    Ok(Admission {
        id: message_id(row.try_get(0)?)?,
        session_id: session_id(row.try_get(1)?)?,
        admitted_seq: seq_value(row.try_get(2)?)?,
        prompt: json_value(&prompt)?,
        delivery,
        time_created: row.try_get(5)?,
        promoted_seq: promoted.map(seq_value).transpose()?,
    })
}

/// Runs a query of inbox rows and decodes them.
pub(super) fn query_inputs(
    conn: &mut PgConn,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Admission>, StoreError> {
    conn.query(sql, params)?.iter().map(decode).collect()
}

/// The admission stored under `id`, pending or promoted, of any session.
pub(crate) fn get_input(
    conn: &mut PgConn,
    id: &MessageId,
) -> Result<Option<Admission>, StoreError> {
    let row = conn.query_opt(
        concat!(
            "SELECT ",
            input_columns!(),
            " FROM session_input WHERE id = $1"
        ),
        &[&id.as_str()],
    )?;
    row.as_ref().map(decode).transpose()
}

/// Inserts a pending inbox row (the projection of `session.prompt.admitted`). An id already in
/// the inbox or the transcript is a conflict.
pub(super) fn insert_input(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
    admitted_seq: u64,
    prompt: &Value,
    delivery: Delivery,
    time: i64,
) -> Result<(), StoreError> {
    let prompt = json_text(prompt)?;
    // The transcript check and the insert in one statement (one round trip).
    let inserted = conn.execute_or_conflict(
        concat!(
            "INSERT INTO session_input (",
            input_columns!(),
            ") SELECT $1, $2, $3, $4, $5, $6, NULL \
             WHERE NOT EXISTS (SELECT 1 FROM session_message WHERE id = $1)"
        ),
        &[
            &id.as_str(),
            &session.as_str(),
            &seq_param(admitted_seq),
            &prompt,
            &delivery.as_str(),
            &time,
        ],
        || format!("prompt {id} cannot be admitted to session {session}"),
    )?;
    if inserted == 0 {
        return Err(StoreError::Conflict(format!(
            "prompt {id} is already in a transcript"
        )));
    }
    Ok(())
}

/// Marks a pending input promoted by event `seq`; unknown or already promoted is a conflict.
pub(super) fn mark_promoted(
    conn: &mut PgConn,
    session: &SessionId,
    id: &MessageId,
    seq: u64,
) -> Result<(), StoreError> {
    let changed = conn.execute(
        "UPDATE session_input SET promoted_seq = $3 \
         WHERE id = $1 AND session_id = $2 AND promoted_seq IS NULL",
        &[&id.as_str(), &session.as_str(), &seq_param(seq)],
    )?;
    if changed == 0 {
        return Err(StoreError::Conflict(format!(
            "prompt {id} is not pending in session {session}"
        )));
    }
    Ok(())
}

/// `session`'s pending inputs in admission order.
pub(crate) fn pending_inputs(
    conn: &mut PgConn,
    session: &SessionId,
) -> Result<Vec<Admission>, StoreError> {
    query_inputs(
        conn,
        concat!(
            "SELECT ",
            input_columns!(),
            " FROM session_input WHERE session_id = $1 AND promoted_seq IS NULL \
             ORDER BY admitted_seq"
        ),
        &[&session.as_str()],
    )
}
