//! PostgreSQL's statements for the projection's row writes ([`ProjectionRows`]; the rule is
//! `journal::projection`'s): the session row, its claim, the inbox and the transcript rows an
//! event's projection writes.

use super::conn::PgConn;
use super::input::input_columns;
use super::session::session_columns;
use super::{json_text, seq_param, seq_value};
use crate::error::StoreError;
use crate::id::{MessageId, SessionId};
use crate::journal::backend::{NewInput, NewMessage, ProjectionRows};
use crate::journal::rules::ClaimRow;
use crate::records::SessionInfo;

impl ProjectionRows for PgConn {
    /// Inserts a session row (the projection of `session.created`); an existing id is a conflict.
    fn insert_session(&mut self, info: &SessionInfo) -> Result<(), StoreError> {
        let model = info.model.as_ref().map(json_text).transpose()?;
        let metadata = info.metadata.as_ref().map(json_text).transpose()?;
        let parent = info.parent_id.as_ref().map(SessionId::as_str);
        let attempts = i64::from(info.resume_attempts);
        self.execute_or_conflict(
            concat!(
                "INSERT INTO session (",
                session_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ),
            &[
                &info.id.as_str(),
                &parent,
                &info.title,
                &info.directory,
                &info.agent,
                &model,
                &metadata,
                &info.time_created,
                &info.time_updated,
                &info.time_suspended,
                &attempts,
            ],
            || format!("session {} already exists", info.id),
        )?;
        Ok(())
    }

    /// The claim columns of `id`'s row, if it is claimed or counted.
    fn claim_row(&mut self, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
        let row = self.query_opt(
            "SELECT time_suspended, claim_seq, claim_boot FROM session \
             WHERE id = $1 AND (time_suspended IS NOT NULL OR claim_seq IS NOT NULL \
                                OR claim_boot IS NOT NULL)",
            &[&id.as_str()],
        )?;
        row.map(|row| {
            let seq: Option<i64> = row.try_get(1)?;
            Ok(ClaimRow {
                time: row.try_get(0)?,
                seq: seq.map(seq_value).transpose()?,
                boot: row.try_get(2)?,
            })
        })
        .transpose()
    }

    /// One statement: the claim columns written where they are all empty.
    fn insert_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        let seq = claim.seq.map(seq_param);
        Ok(self.execute(
            "UPDATE session SET time_suspended = $2, claim_seq = $3, claim_boot = $4 \
             WHERE id = $1 AND time_suspended IS NULL AND claim_seq IS NULL \
               AND claim_boot IS NULL",
            &[&id.as_str(), &claim.time, &seq, &claim.boot],
        )? > 0)
    }

    /// Writes `claim` into `id`'s row, keeping its resume attempts. Returns whether the row exists.
    fn write_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        let seq = claim.seq.map(seq_param);
        Ok(self.execute(
            "UPDATE session SET time_suspended = $2, claim_seq = $3, claim_boot = $4 WHERE id = $1",
            &[&id.as_str(), &claim.time, &seq, &claim.boot],
        )? > 0)
    }

    /// Releases the claim on `id` and resets its resume attempts.
    fn release(&mut self, id: &SessionId) -> Result<(), StoreError> {
        self.execute(
            "UPDATE session SET time_suspended = NULL, resume_attempts = 0, claim_boot = NULL, \
             claim_seq = NULL WHERE id = $1",
            &[&id.as_str()],
        )?;
        Ok(())
    }

    /// The transcript check and the insert in one statement.
    fn insert_input(&mut self, row: &NewInput<'_>) -> Result<bool, StoreError> {
        let prompt = json_text(row.prompt)?;
        // The transcript check and the insert in one statement (one round trip).
        let inserted = self.execute_or_conflict(
            concat!(
                "INSERT INTO session_input (",
                input_columns!(),
                ") SELECT $1, $2, $3, $4, $5, $6, NULL \
                 WHERE NOT EXISTS (SELECT 1 FROM session_message WHERE id = $1)"
            ),
            &[
                &row.id.as_str(),
                &row.session.as_str(),
                &seq_param(row.seq),
                &prompt,
                &row.delivery.as_str(),
                &row.time,
            ],
            || {
                format!(
                    "prompt {} cannot be admitted to session {}",
                    row.id, row.session
                )
            },
        )?;
        Ok(inserted > 0)
    }

    fn mark_promoted(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
    ) -> Result<bool, StoreError> {
        let changed = self.execute(
            "UPDATE session_input SET promoted_seq = $3 \
             WHERE id = $1 AND session_id = $2 AND promoted_seq IS NULL",
            &[&id.as_str(), &session.as_str(), &seq_param(seq)],
        )?;
        Ok(changed > 0)
    }

    /// Inserts a transcript row created by event `seq`; an id already in a transcript, or a seq
    /// already used in this one, is a conflict.
    fn insert_message(&mut self, row: &NewMessage<'_>) -> Result<(), StoreError> {
        insert_message(
            self,
            "INSERT INTO session_message \
             (id, session_id, type, seq, data, time_created, time_updated) \
             VALUES ($1, $2, $3, $4, $5, $6, $6)",
            row,
        )
        .map(drop)
    }

    /// The inbox check and the insert in one statement.
    fn insert_appended(&mut self, row: &NewMessage<'_>) -> Result<bool, StoreError> {
        let inserted = insert_message(
            self,
            "INSERT INTO session_message \
             (id, session_id, type, seq, data, time_created, time_updated) \
             SELECT $1, $2, $3, $4, $5, $6, $6 \
             WHERE NOT EXISTS (SELECT 1 FROM session_input WHERE id = $1)",
            row,
        )?;
        Ok(inserted > 0)
    }
}

/// Runs `sql`, an insert of a transcript row whose placeholders `$1` … `$6` are `row`'s id,
/// session, type, seq, data and time; the rows it wrote. A duplicate id or seq is a conflict.
fn insert_message(conn: &mut PgConn, sql: &str, row: &NewMessage<'_>) -> Result<u64, StoreError> {
    let data = json_text(row.data)?;
    conn.execute_or_conflict(
        sql,
        &[
            &row.id.as_str(),
            &row.session.as_str(),
            &row.kind,
            &seq_param(row.seq),
            &data,
            &row.time,
        ],
        || {
            format!(
                "message {} cannot be added to session {}",
                row.id, row.session
            )
        },
    )
}
