//! The transcript (`session_message`, [`MessageRows`]): appends, lookups, keyset pages by
//! `seq`, interrupt marks and the maintenance queries (transcript owner, projection rebuild,
//! undecodable messages). Its rows are written by the projection (`projection`).

use postgres::Row;
use serde_json::Value;

use super::conn::PgConn;
use super::{json_value, limit_param, message_id, seq_param, seq_value, session_id};
use crate::error::StoreError;
use crate::id::{MessageId, SessionId};
use crate::journal::backend::MessageRows;
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

impl MessageRows for PgConn {
    /// The message `id` of `session`; `None` when unknown or of another session.
    fn get_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<Message>, StoreError> {
        let row = self.query_opt(
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
    fn message_seq(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<u64>, StoreError> {
        let row = self.query_opt(
            "SELECT seq FROM session_message WHERE id = $1 AND session_id = $2",
            &[&id.as_str(), &session.as_str()],
        )?;
        row.map(|row| seq_value(row.try_get(0)?)).transpose()
    }

    fn scan_messages(
        &mut self,
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
            None => self.query(sql, &[&session, &limit])?,
            Some(past) => self.query(sql, &[&session, &limit, &seq_param(past)])?,
        };
        rows.iter().map(decode).collect()
    }

    /// Whether `session`'s transcript holds a `user` message with seq greater than `seq`.
    fn user_message_after(&mut self, session: &SessionId, seq: u64) -> Result<bool, StoreError> {
        let row = self.query_one(
            "SELECT EXISTS (SELECT 1 FROM session_message \
             WHERE session_id = $1 AND type = 'user' AND seq > $2)",
            &[&session.as_str(), &seq_param(seq)],
        )?;
        Ok(row.try_get(0)?)
    }

    /// The session whose transcript holds message `id`, if any.
    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError> {
        let row = self.query_opt(
            "SELECT session_id FROM session_message WHERE id = $1",
            &[&id.as_str()],
        )?;
        row.map(|row| session_id(row.try_get(0)?)).transpose()
    }

    /// The first message of `session`'s transcript (in seq order) whose stored payload is not valid
    /// JSON, if any.
    fn undecodable_message(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<MessageId>, StoreError> {
        let rows = self.query(
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

    /// Deletes `session`'s inbox and transcript rows (before they are rebuilt from its events).
    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError> {
        self.execute(
            "DELETE FROM session_input WHERE session_id = $1",
            &[&session.as_str()],
        )?;
        self.execute(
            "DELETE FROM session_message WHERE session_id = $1",
            &[&session.as_str()],
        )?;
        Ok(())
    }

    /// How many inbox and transcript rows `session` has.
    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError> {
        let row = self.query_one(
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

    /// Marks the `user` messages of `session` promoted after `claim` as interrupted by a user.
    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError> {
        self.execute(
            "UPDATE session_message SET interrupted = true \
             WHERE session_id = $1 AND type = 'user' AND seq > $2 AND NOT interrupted",
            &[&session.as_str(), &seq_param(claim)],
        )?;
        Ok(())
    }
}
