//! SQLite's statements for the projection's row writes ([`ProjectionRows`]; the rule is
//! `journal::projection`'s): the session row of `session.created`, the claim and its release,
//! the inbox row of an admission and its promotion, the transcript rows.

use std::borrow::Borrow;

use rusqlite::{Connection, OptionalExtension};

use super::{conflict_on_constraint, get_opt_seq, json_text, seq_param, SqliteStore, StoreError};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::InputRows;
use crate::journal::backend::{NewInput, NewMessage, ProjectionRows};
use crate::journal::rules::ClaimRow;
use crate::records::SessionInfo;

impl<C: Borrow<Connection>> ProjectionRows for SqliteStore<C> {
    /// Inserts a session row (the projection of `session.created`); an existing id is a
    /// conflict. A claim or attempt count the record carries (never one `Sessions::create`
    /// makes) goes to its claim row.
    fn insert_session(&mut self, info: &SessionInfo) -> Result<(), StoreError> {
        let model = info.model.as_ref().map(json_text).transpose()?;
        let metadata = info.metadata.as_ref().map(json_text).transpose()?;
        let mut stmt = self.conn().prepare_cached(
            "INSERT INTO session (id, parent_id, title, directory, agent, model, metadata, \
             time_created, time_updated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        stmt.execute(rusqlite::params![
            info.id.as_str(),
            info.parent_id.as_ref().map(SessionId::as_str),
            info.title,
            info.directory,
            info.agent,
            model,
            metadata,
            info.time_created,
            info.time_updated,
        ])
        .map_err(|e| conflict_on_constraint(e, || format!("session {} already exists", info.id)))?;
        if info.time_suspended.is_some() || info.resume_attempts != 0 {
            self.conn()
                .prepare_cached(
                    "INSERT INTO session_claim (session_id, time_suspended, resume_attempts) \
                     VALUES (?1, ?2, ?3)",
                )?
                .execute(rusqlite::params![
                    info.id.as_str(),
                    info.time_suspended,
                    info.resume_attempts
                ])?;
        }
        Ok(())
    }

    /// The claim row of `id`, if it has one.
    fn claim_row(&mut self, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT time_suspended, claim_seq, claim_boot FROM session_claim WHERE session_id = ?1",
        )?;
        Ok(stmt
            .query_row([id.as_str()], |row| {
                Ok(ClaimRow {
                    time: row.get(0)?,
                    seq: get_opt_seq(row, 1)?,
                    boot: row.get(2)?,
                })
            })
            .optional()?)
    }

    /// Writes `claim` as `id`'s claim row, keeping its resume attempts. Returns whether the
    /// session exists (nothing is written when it does not).
    fn insert_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        // A session the writer knows the log number of is stored (see `streams`): its claim
        // needs no probe of the session table.
        let sql = if self.streams.lookup(id).is_some() {
            "INSERT INTO session_claim (session_id, time_suspended, claim_seq, claim_boot) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (session_id) DO NOTHING"
        } else {
            "INSERT INTO session_claim (session_id, time_suspended, claim_seq, claim_boot) \
             SELECT id, ?2, ?3, ?4 FROM session WHERE id = ?1 ON CONFLICT (session_id) DO NOTHING"
        };
        let mut stmt = self.conn().prepare_cached(sql)?;
        let seq = claim.seq.map(seq_param);
        Ok(stmt.execute(rusqlite::params![id.as_str(), claim.time, seq, claim.boot])? > 0)
    }

    fn write_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        // A session the writer knows the log number of is stored (see `streams`): its claim
        // needs no probe of the session table.
        let sql = if self.streams.lookup(id).is_some() {
            "INSERT INTO session_claim (session_id, time_suspended, claim_seq, claim_boot) \
             VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (session_id) DO UPDATE SET time_suspended = excluded.time_suspended, \
               claim_seq = excluded.claim_seq, claim_boot = excluded.claim_boot"
        } else {
            "INSERT INTO session_claim (session_id, time_suspended, claim_seq, claim_boot) \
             SELECT id, ?2, ?3, ?4 FROM session WHERE id = ?1 \
             ON CONFLICT (session_id) DO UPDATE SET time_suspended = excluded.time_suspended, \
               claim_seq = excluded.claim_seq, claim_boot = excluded.claim_boot"
        };
        let mut stmt = self.conn().prepare_cached(sql)?;
        let seq = claim.seq.map(seq_param);
        Ok(stmt.execute(rusqlite::params![id.as_str(), claim.time, seq, claim.boot])? > 0)
    }

    /// Releases the claim on `id` and resets its resume attempts (deletes its claim row).
    fn release(&mut self, id: &SessionId) -> Result<(), StoreError> {
        release(self.conn(), id).map(drop)
    }

    /// The transcript probe, then the insert.
    fn insert_input(&mut self, row: &NewInput<'_>) -> Result<bool, StoreError> {
        if message_exists(self.conn(), row.id)? {
            return Ok(false);
        }
        let mut stmt = self.conn().prepare_cached(
            "INSERT INTO session_input (id, session_id, admitted_seq, prompt, delivery, \
             time_created, promoted_seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)",
        )?;
        stmt.execute(rusqlite::params![
            row.id.as_str(),
            row.session.as_str(),
            seq_param(row.seq),
            json_text(row.prompt)?,
            row.delivery.as_str(),
            row.time,
        ])
        .map_err(|e| {
            conflict_on_constraint(e, || {
                format!(
                    "prompt {} cannot be admitted to session {}",
                    row.id, row.session
                )
            })
        })?;
        Ok(true)
    }

    fn mark_promoted(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
    ) -> Result<bool, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_input SET promoted_seq = ?3 \
             WHERE id = ?1 AND session_id = ?2 AND promoted_seq IS NULL",
        )?;
        let params = rusqlite::params![id.as_str(), session.as_str(), seq_param(seq)];
        Ok(stmt.execute(params)? > 0)
    }

    /// Inserts a transcript row created by event `seq` (part of the projection of
    /// `session.prompt.promoted`). An id already in a transcript, or a seq already used in
    /// this one, is a conflict.
    fn insert_message(&mut self, row: &NewMessage<'_>) -> Result<(), StoreError> {
        insert_message(self.conn(), row)
    }

    /// Inserts the transcript row of `session.message.appended`: an id of the inbox is a
    /// conflict (prompts enter the transcript by promotion), as [`Self::insert_message`]'s are.
    fn insert_appended(&mut self, row: &NewMessage<'_>) -> Result<bool, StoreError> {
        if self.get_input(row.id)?.is_some() {
            return Ok(false);
        }
        insert_message(self.conn(), row)?;
        Ok(true)
    }
}

/// Deletes the claim row of `id`; whether there was one.
pub(super) fn release(conn: &Connection, id: &SessionId) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached("DELETE FROM session_claim WHERE session_id = ?1")?;
    Ok(stmt.execute([id.as_str()])? > 0)
}

/// Whether any transcript holds a message `id`.
pub(super) fn message_exists(conn: &Connection, id: &MessageId) -> Result<bool, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM session_message WHERE id = ?1)")?;
    Ok(stmt.query_row([id.as_str()], |row| row.get(0))?)
}

/// The transcript row insert of a promotion and of `session.message.appended`.
fn insert_message(conn: &Connection, row: &NewMessage<'_>) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO session_message (id, session_id, type, seq, data, time_created, \
         time_updated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
    )?;
    stmt.execute(rusqlite::params![
        row.id.as_str(),
        row.session.as_str(),
        row.kind,
        seq_param(row.seq),
        json_text(row.data)?,
        row.time,
    ])
    .map_err(|e| {
        conflict_on_constraint(e, || {
            format!(
                "message {} cannot be added to session {}",
                row.id, row.session
            )
        })
    })?;
    Ok(())
}
