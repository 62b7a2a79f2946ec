//! Claim bookkeeping in `session_claim` ([`ClaimRows`]): resume counting and the restart
//! sweep's reads. (A claim and its release are the projection's writes:
//! [`super::projection`].)
//!
//! A session has a `session_claim` row only while it holds a claim (`time_suspended` set) or
//! the restart sweep has counted an adoption it has not claimed yet (`time_suspended` NULL,
//! `resume_attempts` counted); a release deletes the row. So a claim and its release write a
//! few pages of a table as small as the number of claimed sessions, not the session's row.
//! None of these writes touch `session.time_updated`: a claim is execution state, not a
//! session change.

use std::borrow::Borrow;

use rusqlite::{Connection, OptionalExtension};

use super::event::LATEST_INTERRUPT_SQL;
use super::{get_opt_seq, seq_param, session_id, SqliteStore, StoreError};
use crate::id::SessionId;
use crate::journal::backend::{ClaimRows, ClaimedTurn};
use crate::records::ClaimState;

/// The query behind `list_claimed`: every claim (`session_claim` holds claimed sessions only,
/// so it is scanned and sorted by claim time), each session's row read by id for its parent.
const LIST_CLAIMED_SQL: &str = "SELECT session_claim.session_id \
     FROM session_claim CROSS JOIN session s ON s.id = session_claim.session_id \
     WHERE session_claim.time_suspended IS NOT NULL AND s.parent_id IS NULL \
       AND (?1 IS NULL OR session_claim.claim_boot IS NULL \
            OR session_claim.claim_boot <> ?1) \
     ORDER BY session_claim.time_suspended, session_claim.session_id";

/// The statement behind `release_child_claims`: it reads the claims, and each claimed
/// session's row by id (not every child through `session_parent`).
const RELEASE_CHILD_CLAIMS_SQL: &str = "DELETE FROM session_claim \
     WHERE time_suspended IS NOT NULL AND (claim_boot IS NULL OR claim_boot <> ?1) \
       AND (SELECT s.parent_id FROM session s WHERE s.id = session_claim.session_id) IS NOT NULL";

/// The query behind `claim_counts`.
const CLAIM_COUNTS_SQL: &str = "SELECT COUNT(*), ?1 - MIN(time_suspended) FROM session_claim \
     WHERE time_suspended IS NOT NULL";

/// The query behind `adoptable`: read from the inbox's wake marks (`session_input_wake`),
/// each session's row and claim by id.
const ADOPTABLE_SQL: &str = "SELECT DISTINCT i.session_id \
     FROM session_input i CROSS JOIN session s ON s.id = i.session_id \
     WHERE i.promoted_seq IS NULL AND i.wake = 1 AND s.parent_id IS NULL \
       AND NOT EXISTS (SELECT 1 FROM session_claim c \
                       WHERE c.session_id = i.session_id AND c.time_suspended IS NOT NULL) \
     ORDER BY i.session_id";

impl<C: Borrow<Connection>> ClaimRows for SqliteStore<C> {
    /// The claim bookkeeping of `id`, or `None` when the session is not stored.
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT c.time_suspended, COALESCE(c.resume_attempts, 0), c.claim_boot \
             FROM session s LEFT JOIN session_claim c ON c.session_id = s.id WHERE s.id = ?1",
        )?;
        let state = stmt
            .query_row([id.as_str()], |row| {
                Ok(ClaimState {
                    time_suspended: row.get(0)?,
                    resume_attempts: row.get(1)?,
                    claim_boot: row.get(2)?,
                })
            })
            .optional()?;
        Ok(state)
    }

    /// The seq of the `session.execution.started` event that took `session`'s claim, if
    /// claimed.
    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT claim_seq FROM session_claim WHERE session_id = ?1")?;
        Ok(stmt
            .query_row([session.as_str()], |row| get_opt_seq(row, 0))
            .optional()?
            .flatten())
    }

    /// How many sessions hold a claim, and `now` minus the oldest claim's time.
    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError> {
        let mut stmt = self.conn().prepare_cached(CLAIM_COUNTS_SQL)?;
        Ok(stmt.query_row([now], |row| Ok((row.get(0)?, row.get(1)?)))?)
    }

    /// Claimed top-level sessions, oldest claim first, except those claimed by
    /// `exclude_boot` (a claim without a boot is never excluded).
    fn list_claimed(&mut self, exclude_boot: Option<&str>) -> Result<Vec<SessionId>, StoreError> {
        let mut stmt = self.conn().prepare_cached(LIST_CLAIMED_SQL)?;
        let ids = stmt
            .query_map([exclude_boot], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter().map(session_id).collect()
    }

    /// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
    fn own_claims(&mut self, boot: &str) -> Result<Vec<(SessionId, u64)>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT c.session_id, c.claim_seq \
             FROM session_claim c CROSS JOIN session s ON s.id = c.session_id \
             WHERE c.time_suspended IS NOT NULL AND c.claim_boot = ?1 AND c.claim_seq IS NOT NULL \
               AND s.parent_id IS NULL",
        )?;
        let rows = stmt
            .query_map([boot], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(id, seq)| Ok((session_id(id)?, u64::try_from(seq).unwrap_or_default())))
            .collect()
    }

    /// Top-level sessions holding no claim whose pending inputs are owed a turn, in id order.
    fn adoptable(&mut self) -> Result<Vec<SessionId>, StoreError> {
        let mut stmt = self.conn().prepare_cached(ADOPTABLE_SQL)?;
        let ids = stmt
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter().map(session_id).collect()
    }

    /// Counts one resume attempt of `id`'s claimed turn for process boot `boot` and returns the
    /// new count, taking the claim for `boot` (`claim_boot`), so a turn is counted at most once
    /// per boot. `None` when there is nothing to count: the session is gone, its claim was
    /// released, or the claim is already `boot`'s — a turn this process started, or a sweep of
    /// this boot (running concurrently) counted it first.
    fn count_resume(&mut self, id: &SessionId, boot: &str) -> Result<Option<u32>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_claim SET resume_attempts = resume_attempts + 1, claim_boot = ?2 \
             WHERE session_id = ?1 AND time_suspended IS NOT NULL \
               AND (claim_boot IS NULL OR claim_boot <> ?2) \
             RETURNING resume_attempts",
        )?;
        Ok(stmt
            .query_row(rusqlite::params![id.as_str(), boot], |row| row.get(0))
            .optional()?)
    }

    fn count_own_resume(
        &mut self,
        id: &SessionId,
        boot: &str,
        claim: u64,
    ) -> Result<Option<u32>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "UPDATE session_claim SET resume_attempts = resume_attempts + 1 \
             WHERE session_id = ?1 AND time_suspended IS NOT NULL AND claim_boot = ?2 \
               AND claim_seq = ?3 \
             RETURNING resume_attempts",
        )?;
        Ok(stmt
            .query_row(
                rusqlite::params![id.as_str(), boot, seq_param(claim)],
                |row| row.get(0),
            )
            .optional()?)
    }

    /// Counts one resume attempt of `id` when it holds no claim (the restart sweep adopting a
    /// session owed a turn) and returns the new count; `None` when the session is gone or
    /// claimed (a turn of this process, or a concurrent sweep, took it since it was listed).
    /// The count lives in a claim row without a claim (`time_suspended` NULL) until the sweep
    /// claims the turn, or a release deletes it.
    fn count_adoption(&mut self, id: &SessionId) -> Result<Option<u32>, StoreError> {
        let mut stmt = self.conn().prepare_cached(
            "INSERT INTO session_claim (session_id, resume_attempts) \
             SELECT id, 1 FROM session WHERE id = ?1 \
             ON CONFLICT (session_id) DO UPDATE SET resume_attempts = resume_attempts + 1 \
               WHERE time_suspended IS NULL \
             RETURNING resume_attempts",
        )?;
        Ok(stmt.query_row([id.as_str()], |row| row.get(0)).optional()?)
    }

    /// What the restart sweep reads of `session`'s turn claimed by `boot`, in one statement:
    /// the seq that took the claim and the latest interrupt request. `None` when it holds no
    /// claim of `boot` (a deleted session has no claim row).
    fn claimed_turn(
        &mut self,
        session: &SessionId,
        boot: &str,
    ) -> Result<Option<ClaimedTurn>, StoreError> {
        let mut stmt = self.conn().prepare_cached(&format!(
            "SELECT claim_seq, ({LATEST_INTERRUPT_SQL}) FROM session_claim \
             WHERE session_id = ?1 AND time_suspended IS NOT NULL AND claim_boot = ?2"
        ))?;
        Ok(stmt
            .query_row(rusqlite::params![session.as_str(), boot], |row| {
                Ok(ClaimedTurn {
                    claim: get_opt_seq(row, 0)?,
                    fence: get_opt_seq(row, 1)?,
                })
            })
            .optional()?)
    }

    /// Releases every child session claimed by a boot other than `boot` (children are never
    /// resumed on their own; a claim of `boot` is a child turn running in this process).
    /// Returns how many claims were released.
    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError> {
        let mut stmt = self.conn().prepare_cached(RELEASE_CHILD_CLAIMS_SQL)?;
        Ok(stmt.execute([boot])?)
    }
}

#[cfg(test)]
mod tests;
