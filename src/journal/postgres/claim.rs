//! Claims and what recovery reads and writes ([`ClaimRows`]): the claim bookkeeping, resume
//! and adoption counting, the restart sweep's listings (as the SQLite store's).
//!
//! Several nodes: the sweep's listings leave out sessions a live node other than this one owns
//! (that node resumes its own turns), and counting a resume or an adoption takes the session
//! for this node in the same statement — only when no other live node owns it, with a new
//! epoch unless this node owns it already — so two surviving nodes never both count, nor both
//! resume, one turn. Counting skips a session whose row another transaction holds (`SKIP
//! LOCKED`): that transaction is another node taking it, and the writer does not wait on it.

use super::conn::PgConn;
use super::{count_value, seq_param, seq_value, session_id};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{ClaimRows, ClaimedTurn};
use crate::records::ClaimState;

/// Reads an optional attempt count returned by a counting statement.
fn counted(row: Option<postgres::Row>) -> Result<Option<u32>, StoreError> {
    row.map(|row| count_value(row.try_get(0)?)).transpose()
}

/// Decodes a column of session ids.
fn ids(rows: Vec<postgres::Row>) -> Result<Vec<SessionId>, StoreError> {
    rows.iter().map(|row| session_id(row.try_get(0)?)).collect()
}

impl ClaimRows for PgConn {
    /// The claim bookkeeping of `id`, or `None` when the session is not stored.
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError> {
        let row = self.query_opt(
            "SELECT time_suspended, resume_attempts, claim_boot FROM session WHERE id = $1",
            &[&id.as_str()],
        )?;
        row.map(|row| {
            Ok(ClaimState {
                time_suspended: row.try_get(0)?,
                resume_attempts: count_value(row.try_get(1)?)?,
                claim_boot: row.try_get(2)?,
            })
        })
        .transpose()
    }

    /// The seq of the `session.execution.started` event that took `session`'s claim, if claimed.
    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        let row = self.query_opt(
            "SELECT claim_seq FROM session WHERE id = $1",
            &[&session.as_str()],
        )?;
        let seq: Option<i64> = row.map(|row| row.try_get(0)).transpose()?.flatten();
        seq.map(seq_value).transpose()
    }

    /// How many sessions hold a claim, and `now` minus the oldest claim's time.
    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError> {
        let row = self.query_one(
            "SELECT COUNT(*), $1::bigint - MIN(time_suspended) FROM session \
             WHERE time_suspended IS NOT NULL",
            &[&now],
        )?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// Claimed top-level sessions no other live node owns, oldest claim first, except those
    /// claimed by `exclude_boot` (a claim without a boot is never excluded).
    fn list_claimed(&mut self, exclude_boot: Option<&str>) -> Result<Vec<SessionId>, StoreError> {
        let me = self.node_arc();
        let rows = self.query(
            concat!(
                "SELECT s.id FROM session s \
                 WHERE s.time_suspended IS NOT NULL AND s.parent_id IS NULL \
                   AND ($1::text IS NULL OR s.claim_boot IS NULL OR s.claim_boot <> $1) AND ",
                not_held_elsewhere!("$2"),
                " ORDER BY s.time_suspended, s.id"
            ),
            &[&exclude_boot, &&*me],
        )?;
        ids(rows)
    }

    /// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
    fn own_claims(&mut self, boot: &str) -> Result<Vec<(SessionId, u64)>, StoreError> {
        let rows = self.query(
            "SELECT id, claim_seq FROM session \
             WHERE time_suspended IS NOT NULL AND claim_boot = $1 AND claim_seq IS NOT NULL \
               AND parent_id IS NULL",
            &[&boot],
        )?;
        rows.iter()
            .map(|row| Ok((session_id(row.try_get(0)?)?, seq_value(row.try_get(1)?)?)))
            .collect()
    }

    /// Unclaimed top-level sessions no live node owns (this one included) whose pending inputs are
    /// owed a turn, in id order. A session this node owns is left out: its owed input is one this
    /// node's own wake is carrying to its actor right now (the admission took the session and
    /// routed the wake here), or the next queued prompt its own turn just scheduled, and adopting
    /// it would publish a restart notice and a second claim next to that turn (the periodic
    /// takeover runs this listing while the node serves).
    fn adoptable(&mut self) -> Result<Vec<SessionId>, StoreError> {
        let me = self.node_arc();
        let rows = self.query(
            concat!(
                "SELECT DISTINCT i.session_id FROM session_input i \
                 JOIN session s ON s.id = i.session_id \
                 WHERE i.promoted_seq IS NULL AND i.wake \
                   AND s.time_suspended IS NULL AND s.parent_id IS NULL \
                   AND s.owner_node IS DISTINCT FROM $1 AND ",
                not_held_elsewhere!("$1"),
                " ORDER BY i.session_id"
            ),
            &[&&*me],
        )?;
        ids(rows)
    }

    /// Counts one resume attempt of `id`'s claimed turn for boot `boot`, taking the claim for
    /// `boot` and the session for this node. `None` when the session is gone, unclaimed, claimed by
    /// `boot` already, owned by another live node, or held by another transaction.
    fn count_resume(&mut self, id: &SessionId, boot: &str) -> Result<Option<u32>, StoreError> {
        let me = self.node_arc();
        let row = self.query_opt(
            concat!(
                "UPDATE session AS s \
                 SET resume_attempts = s.resume_attempts + 1, claim_boot = $2, ",
                take_ownership!("$3"),
                " WHERE s.id = (SELECT id FROM session WHERE id = $1 \
                                FOR NO KEY UPDATE SKIP LOCKED) \
                   AND s.time_suspended IS NOT NULL \
                   AND (s.claim_boot IS NULL OR s.claim_boot <> $2) AND ",
                not_held_elsewhere!("$3"),
                " RETURNING s.resume_attempts"
            ),
            &[&id.as_str(), &boot, &&*me],
        )?;
        counted(row)
    }

    fn count_own_resume(
        &mut self,
        id: &SessionId,
        boot: &str,
        claim: u64,
    ) -> Result<Option<u32>, StoreError> {
        let row = self.query_opt(
            "UPDATE session SET resume_attempts = resume_attempts + 1 \
             WHERE id = $1 AND time_suspended IS NOT NULL AND claim_boot = $2 AND claim_seq = $3 \
             RETURNING resume_attempts",
            &[&id.as_str(), &boot, &seq_param(claim)],
        )?;
        counted(row)
    }

    /// Counts one attempt of `id` when it holds no claim (adopting a session owed a turn), taking
    /// it for this node. `None` when it is gone, claimed, owned by another live node, or held by
    /// another transaction.
    fn count_adoption(&mut self, id: &SessionId) -> Result<Option<u32>, StoreError> {
        let me = self.node_arc();
        let row = self.query_opt(
            concat!(
                "UPDATE session AS s SET resume_attempts = s.resume_attempts + 1, ",
                take_ownership!("$2"),
                " WHERE s.id = (SELECT id FROM session WHERE id = $1 \
                                FOR NO KEY UPDATE SKIP LOCKED) \
                   AND s.time_suspended IS NULL AND ",
                not_held_elsewhere!("$2"),
                " RETURNING s.resume_attempts"
            ),
            &[&id.as_str(), &&*me],
        )?;
        counted(row)
    }

    /// [`ClaimRows::count_resume`] of every one of `ids` in one statement (the same conditions, row
    /// by row), returned in the order of `ids`.
    fn count_resumes(
        &mut self,
        ids: &[SessionId],
        boot: &str,
    ) -> Result<Vec<(SessionId, u32)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let me = self.node_arc();
        let list: Vec<&str> = ids.iter().map(SessionId::as_str).collect();
        let rows = self.query(
            concat!(
                "UPDATE session AS s \
                 SET resume_attempts = s.resume_attempts + 1, claim_boot = $2, ",
                take_ownership!("$3"),
                " WHERE s.id IN (SELECT id FROM session WHERE id = ANY($1) \
                                 FOR NO KEY UPDATE SKIP LOCKED) \
                   AND s.time_suspended IS NOT NULL \
                   AND (s.claim_boot IS NULL OR s.claim_boot <> $2) AND ",
                not_held_elsewhere!("$3"),
                " RETURNING s.id, s.resume_attempts"
            ),
            &[&list, &boot, &&*me],
        )?;
        let mut counted = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            counted.insert(row.try_get::<_, String>(0)?, count_value(row.try_get(1)?)?);
        }
        Ok(ids
            .iter()
            .filter_map(|id| counted.remove(id.as_str()).map(|n| (id.clone(), n)))
            .collect())
    }

    /// What the sweep reads of `id`'s claimed turn, in one statement: `None` when it holds no
    /// claim for `boot`; else its claim seq and the seq of its latest interrupt request (the
    /// literal type lets the partial index `event_interrupt` serve it). The row stays locked until
    /// COMMIT, so another node cannot count the turn for itself (its count skips locked rows)
    /// between this read and the sweep's writes, which would then be two nodes' writes.
    fn claimed_turn(
        &mut self,
        id: &SessionId,
        boot: &str,
    ) -> Result<Option<ClaimedTurn>, StoreError> {
        let row = self.query_opt(
            "SELECT s.claim_seq, (SELECT MAX(e.seq) FROM event e WHERE e.aggregate_id = s.id \
                                  AND e.type = 'session.interrupt.requested') \
             FROM session s WHERE s.id = $1 AND s.time_suspended IS NOT NULL AND s.claim_boot = $2 \
             FOR NO KEY UPDATE OF s",
            &[&id.as_str(), &boot],
        )?;
        row.map(|row| {
            let claim: Option<i64> = row.try_get(0)?;
            let fence: Option<i64> = row.try_get(1)?;
            Ok(ClaimedTurn {
                claim: claim.map(seq_value).transpose()?,
                fence: fence.map(seq_value).transpose()?,
            })
        })
        .transpose()
    }

    /// Releases every claimed child session no live turn holds: claimed by a boot other than
    /// `boot` and not owned by another live node (every node sweeps every quarter lease: the
    /// running child turns of this node and of the others keep their claims); returns how many.
    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError> {
        let me = self.node_arc();
        let n = self.execute(
            concat!(
                "UPDATE session AS s SET time_suspended = NULL, resume_attempts = 0, \
                 claim_boot = NULL, claim_seq = NULL \
                 WHERE s.time_suspended IS NOT NULL AND s.parent_id IS NOT NULL \
                   AND (s.claim_boot IS NULL OR s.claim_boot <> $1) AND ",
                not_held_elsewhere!("$2")
            ),
            &[&boot, &&*me],
        )?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}
