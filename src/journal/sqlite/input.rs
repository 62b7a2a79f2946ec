//! The prompt inbox (`session_input`, [`InputRows`]): admitted prompts and their durable wake
//! marks. (An admission's and a promotion's rows are the projection's: [`super::projection`].)
//!
//! A pending input's `wake` mark means "a caller was told this prompt will run, and no turn has
//! had the chance to serve it yet". It is set in the admission's own transaction, so a process
//! killed between the admission and its wake still leaves the intent on disk; the restart sweep
//! adopts sessions holding marked inputs (`ClaimRows::adoptable`). The mark is dropped when an
//! interrupt fences the input (`clear_wakes`), and when a turn that claimed after the admission
//! settles without scheduling another (`clear_wakes_before`, by the journal's settle rule).

use std::borrow::Borrow;

use rusqlite::{Connection, OptionalExtension, Row};

use super::{
    get_opt_seq, get_seq, json_value, message_id, seq_param, session_id, SqliteStore, StoreError,
};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::InputRows;
use crate::records::{Admission, Delivery};

/// The columns an inbox row is read with.
macro_rules! input_columns {
    () => {
        "id, session_id, admitted_seq, prompt, delivery, time_created, promoted_seq"
    };
}

/// A `session_input` row as stored, before ids and JSON are decoded.
struct InputRow {
    id: String,
    session_id: String,
    admitted_seq: u64,
    prompt: String,
    delivery: String,
    time_created: i64,
    promoted_seq: Option<u64>,
}

impl InputRow {
    /// Reads the columns of `input_columns!()` in order.
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            session_id: row.get(1)?,
            admitted_seq: get_seq(row, 2)?,
            prompt: row.get(3)?,
            delivery: row.get(4)?,
            time_created: row.get(5)?,
            promoted_seq: get_opt_seq(row, 6)?,
        })
    }

    fn decode(self) -> Result<Admission, StoreError> {
        let delivery = self
            .delivery
            .parse::<Delivery>()
            .map_err(|e| StoreError::Inconsistent(format!("stored delivery: {e}")))?;
        Ok(Admission {
            id: message_id(self.id)?,
            session_id: session_id(self.session_id)?,
            admitted_seq: self.admitted_seq,
            prompt: json_value(&self.prompt)?,
            delivery,
            time_created: self.time_created,
            promoted_seq: self.promoted_seq,
        })
    }
}

/// Runs a cached query of inbox rows and decodes them.
fn query_inputs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Admission>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(params, InputRow::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(InputRow::decode).collect()
}

impl<C: Borrow<Connection>> InputRows for SqliteStore<C> {
    /// The admission stored under `id`, pending or promoted, of any session.
    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError> {
        let mut stmt = self.conn().prepare_cached(concat!(
            "SELECT ",
            input_columns!(),
            " FROM session_input WHERE id = ?1"
        ))?;
        let row = stmt.query_row([id.as_str()], InputRow::read).optional()?;
        row.map(InputRow::decode).transpose()
    }

    /// `session`'s pending inputs in admission order.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError> {
        query_inputs(
            self.conn(),
            concat!(
                "SELECT ",
                input_columns!(),
                " FROM session_input WHERE session_id = ?1 AND promoted_seq IS NULL \
                 ORDER BY admitted_seq"
            ),
            [session.as_str()],
        )
    }

    /// Marks the pending input `id` as owed a turn. A no-op for a promoted input.
    fn mark_wake(&mut self, id: &MessageId) -> Result<(), StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_input SET wake = 1 WHERE id = ?1 AND promoted_seq IS NULL AND wake = 0",
        )?;
        stmt.execute([id.as_str()])?;
        Ok(())
    }

    /// Drops the wake marks of every pending input of `session` (an interrupt fenced them).
    fn clear_wakes(&mut self, session: &SessionId) -> Result<(), StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_input SET wake = 0 \
             WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1",
        )?;
        stmt.execute([session.as_str()])?;
        Ok(())
    }

    /// Drops the wake marks of `session`'s pending inputs admitted before `seq`.
    fn clear_wakes_before(&mut self, session: &SessionId, seq: u64) -> Result<(), StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_input SET wake = 0 \
             WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1 AND admitted_seq < ?2",
        )?;
        stmt.execute(rusqlite::params![session.as_str(), seq_param(seq)])?;
        Ok(())
    }

    /// Whether `session` holds a pending input owed a turn.
    fn owes_turn(&mut self, session: &SessionId) -> Result<bool, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM session_input \
             WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1)",
        )?;
        Ok(stmt.query_row([session.as_str()], |row| row.get(0))?)
    }

    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError> {
        query_inputs(
            self.conn(),
            "SELECT i.id, i.session_id, i.admitted_seq, i.prompt, i.delivery, i.time_created, \
                    i.promoted_seq \
             FROM session_message m JOIN session_input i ON i.id = m.id \
             WHERE m.session_id = ?1 AND m.type = 'user' AND m.seq > ?2 ORDER BY m.seq",
            rusqlite::params![session.as_str(), seq_param(claim)],
        )
    }
}

#[cfg(test)]
mod tests;
