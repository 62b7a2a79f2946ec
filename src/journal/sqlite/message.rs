//! The transcript (`session_message`, [`MessageRows`]): appends, lookups, keyset pages by
//! `seq`, the interrupt marks, and what the session service reads and clears around a rebuild
//! of the projections (who owns a message, the counts, an undecodable payload). (A message's
//! row is the projection's: [`super::projection`].)

use std::borrow::Borrow;

use rusqlite::{Connection, OptionalExtension, Row};

use super::{
    get_seq, json_value, limit_param, message_id, seq_param, session_id, SqliteStore, StoreError,
};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::MessageRows;
use crate::journal::rules::Scan;
use crate::records::{Message, Order};

/// The columns a transcript row is read with (then `interrupted`), and written with.
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

impl<C: Borrow<Connection>> MessageRows for SqliteStore<C> {
    /// The message `id` of `session`; `None` when it is unknown or belongs to another session.
    fn get_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<Message>, StoreError> {
        let mut stmt = self.conn().prepare_cached(concat!(
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

    /// The seq of message `id` within `session`.
    fn message_seq(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<u64>, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT seq FROM session_message WHERE id = ?1 AND session_id = ?2")?;
        Ok(stmt
            .query_row([id.as_str(), session.as_str()], |row| get_seq(row, 0))
            .optional()?)
    }

    fn scan_messages(
        &mut self,
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
        let mut stmt = self.conn().prepare_cached(sql)?;
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

    /// Whether `session`'s transcript holds a `user` message with seq greater than `seq`.
    fn user_message_after(&mut self, session: &SessionId, seq: u64) -> Result<bool, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM session_message \
             WHERE session_id = ?1 AND type = 'user' AND seq > ?2)",
        )?;
        Ok(
            stmt.query_row(rusqlite::params![session.as_str(), seq_param(seq)], |row| {
                row.get(0)
            })?,
        )
    }

    /// The session whose transcript holds message `id`, if any.
    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT session_id FROM session_message WHERE id = ?1")?;
        let owner: Option<String> = stmt.query_row([id.as_str()], |row| row.get(0)).optional()?;
        owner
            .map(|s| {
                SessionId::new(s)
                    .map_err(|e| StoreError::Inconsistent(format!("stored session id: {e}")))
            })
            .transpose()
    }

    /// The first message of `session`'s transcript (in seq order) whose stored payload is not
    /// valid JSON, if any: the diagnosis behind [`crate::Error::MessageDecode`].
    fn undecodable_message(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<MessageId>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT id, data FROM session_message WHERE session_id = ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([session.as_str()])?;
        while let Some(row) = rows.next()? {
            let data: String = row.get(1)?;
            if serde_json::from_str::<serde_json::Value>(&data).is_err() {
                let id: String = row.get(0)?;
                return MessageId::new(id)
                    .map(Some)
                    .map_err(|e| StoreError::Inconsistent(format!("stored message id: {e}")));
            }
        }
        Ok(None)
    }

    /// Deletes `session`'s inbox and transcript rows (before they are rebuilt from its events).
    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached("DELETE FROM session_input WHERE session_id = ?1")?
            .execute([session.as_str()])?;
        self.conn()
            .prepare_cached("DELETE FROM session_message WHERE session_id = ?1")?
            .execute([session.as_str()])?;
        Ok(())
    }

    /// How many inbox and transcript rows `session` has.
    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError> {
        let count = |sql: &str| -> Result<usize, StoreError> {
            let n: i64 = self
                .conn()
                .prepare_cached(sql)?
                .query_row([session.as_str()], |row| row.get(0))?;
            Ok(usize::try_from(n).unwrap_or(0))
        };
        Ok((
            count("SELECT COUNT(*) FROM session_input WHERE session_id = ?1")?,
            count("SELECT COUNT(*) FROM session_message WHERE session_id = ?1")?,
        ))
    }

    /// Marks the `user` messages of `session` promoted after `claim` as interrupted by a user.
    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_message SET interrupted = 1 \
             WHERE session_id = ?1 AND type = 'user' AND seq > ?2 AND interrupted = 0",
        )?;
        stmt.execute(rusqlite::params![session.as_str(), seq_param(claim)])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
