//! The prompt inbox (`session_input`, [`InputRows`]): lookups, the pending inputs, wake marks,
//! the admission hold and what a turn promoted (as the SQLite store's). Its rows are written by
//! the projection (`projection`).

use postgres::Row;

use super::conn::{Params, PgConn};
use super::{json_value, message_id, seq_param, seq_value, session_id};
use crate::error::StoreError;
use crate::id::{MessageId, SessionId};
use crate::journal::backend::InputRows;
use crate::records::{Admission, Delivery};

macro_rules! input_columns {
    () => {
        "id, session_id, admitted_seq, prompt, delivery, time_created, promoted_seq"
    };
}
pub(super) use input_columns;

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
fn query_inputs(
    conn: &mut PgConn,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Admission>, StoreError> {
    conn.query(sql, params)?.iter().map(decode).collect()
}

impl InputRows for PgConn {
    /// The admission stored under `id`, pending or promoted, of any session.
    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError> {
        let row = self.query_opt(
            concat!(
                "SELECT ",
                input_columns!(),
                " FROM session_input WHERE id = $1"
            ),
            &[&id.as_str()],
        )?;
        row.as_ref().map(decode).transpose()
    }

    /// `session`'s pending inputs in admission order.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError> {
        query_inputs(
            self,
            concat!(
                "SELECT ",
                input_columns!(),
                " FROM session_input WHERE session_id = $1 AND promoted_seq IS NULL \
                 ORDER BY admitted_seq"
            ),
            &[&session.as_str()],
        )
    }

    /// Marks the pending input `id` as owed a turn (a no-op for a promoted input).
    fn mark_wake(&mut self, id: &MessageId) -> Result<(), StoreError> {
        self.execute(
            "UPDATE session_input SET wake = true \
             WHERE id = $1 AND promoted_seq IS NULL AND NOT wake",
            &[&id.as_str()],
        )?;
        Ok(())
    }

    /// Drops the wake marks of every pending input of `session`.
    fn clear_wakes(&mut self, session: &SessionId) -> Result<(), StoreError> {
        self.execute(
            "UPDATE session_input SET wake = false \
             WHERE session_id = $1 AND promoted_seq IS NULL AND wake",
            &[&session.as_str()],
        )?;
        Ok(())
    }

    /// Drops the wake marks of `session`'s pending inputs admitted before `seq`.
    fn clear_wakes_before(&mut self, session: &SessionId, seq: u64) -> Result<(), StoreError> {
        self.execute(
            "UPDATE session_input SET wake = false \
             WHERE session_id = $1 AND promoted_seq IS NULL AND wake AND admitted_seq < $2",
            &[&session.as_str(), &seq_param(seq)],
        )?;
        Ok(())
    }

    /// Holds `session`'s sequence row until COMMIT: an admission another node has in flight
    /// commits first (and is seen by what this transaction reads next), a later one gets a seq
    /// after this transaction's events.
    fn hold_admissions(&mut self, session: &SessionId) -> Result<(), StoreError> {
        self.execute(
            "SELECT 1 FROM event_sequence WHERE aggregate_id = $1 FOR UPDATE",
            &[&session.as_str()],
        )?;
        Ok(())
    }

    /// Whether `session` holds a pending input owed a turn.
    fn owes_turn(&mut self, session: &SessionId) -> Result<bool, StoreError> {
        let row = self.query_one(
            "SELECT EXISTS (SELECT 1 FROM session_input \
             WHERE session_id = $1 AND promoted_seq IS NULL AND wake)",
            &[&session.as_str()],
        )?;
        Ok(row.try_get(0)?)
    }

    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError> {
        query_inputs(
            self,
            "SELECT i.id, i.session_id, i.admitted_seq, i.prompt, i.delivery, i.time_created, \
                    i.promoted_seq \
             FROM session_message m JOIN session_input i ON i.id = m.id \
             WHERE m.session_id = $1 AND m.type = 'user' AND m.seq > $2 ORDER BY m.seq",
            &[&session.as_str(), &seq_param(claim)],
        )
    }
}
