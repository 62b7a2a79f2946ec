//! Claims and what recovery reads and writes: claim and release (projections), resume and
//! adoption counting, the restart sweep's listings, wake marks, interrupt marks, served inputs
//! and settling (as the SQLite store's).
//!
//! Several nodes: the sweep's listings leave out sessions a live node other than this one owns
//! (that node resumes its own turns), and counting a resume or an adoption takes the session
//! for this node in the same statement — only when no other live node owns it, with a new
//! epoch unless this node owns it already — so two surviving nodes never both count, nor both
//! resume, one turn. Counting skips a session whose row another transaction holds (`SKIP
//! LOCKED`): that transaction is another node taking it, and the writer does not wait on it.

use super::conn::PgConn;
use super::input::query_inputs;
use super::{count_value, seq_param, seq_value, session_id};
use crate::error::StoreError;
use crate::id::{MessageId, SessionId};
use crate::journal::backend::ClaimedTurn;
use crate::journal::rules::ClaimRow;
use crate::records::{Admission, ClaimState};

/// The claim columns of `id`'s row, if it is claimed or counted.
pub(crate) fn claim_row(conn: &mut PgConn, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
    let row = conn.query_opt(
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

/// Writes `claim` into `id`'s row, keeping its resume attempts. Returns whether the row exists.
pub(crate) fn write_claim(
    conn: &mut PgConn,
    id: &SessionId,
    claim: &ClaimRow,
) -> Result<bool, StoreError> {
    let seq = claim.seq.map(seq_param);
    Ok(conn.execute(
        "UPDATE session SET time_suspended = $2, claim_seq = $3, claim_boot = $4 WHERE id = $1",
        &[&id.as_str(), &claim.time, &seq, &claim.boot],
    )? > 0)
}

/// Releases the claim on `id` and resets its resume attempts. Returns whether the row exists.
pub(crate) fn release(conn: &mut PgConn, id: &SessionId) -> Result<bool, StoreError> {
    Ok(conn.execute(
        "UPDATE session SET time_suspended = NULL, resume_attempts = 0, claim_boot = NULL, \
         claim_seq = NULL WHERE id = $1",
        &[&id.as_str()],
    )? > 0)
}

/// Reads an optional attempt count returned by a counting statement.
fn counted(row: Option<postgres::Row>) -> Result<Option<u32>, StoreError> {
    row.map(|row| count_value(row.try_get(0)?)).transpose()
}

/// Counts one resume attempt of `id`'s claimed turn for boot `boot`, taking the claim for
/// `boot` and the session for this node. `None` when the session is gone, unclaimed, claimed by
/// `boot` already, owned by another live node, or held by another transaction.
pub(crate) fn count_resume(
    conn: &mut PgConn,
    id: &SessionId,
    boot: &str,
) -> Result<Option<u32>, StoreError> {
    let me = conn.node_arc();
    let row = conn.query_opt(
        concat!(
            "UPDATE session AS s SET resume_attempts = s.resume_attempts + 1, claim_boot = $2, ",
            take_ownership!("$3"),
            " WHERE s.id = (SELECT id FROM session WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED) \
               AND s.time_suspended IS NOT NULL \
               AND (s.claim_boot IS NULL OR s.claim_boot <> $2) AND ",
            not_held_elsewhere!("$3"),
            " RETURNING s.resume_attempts"
        ),
        &[&id.as_str(), &boot, &&*me],
    )?;
    counted(row)
}

/// [`count_resume`] of every one of `ids` in one statement (the same conditions, row by row),
/// returned in the order of `ids`.
pub(crate) fn count_resumes(
    conn: &mut PgConn,
    ids: &[SessionId],
    boot: &str,
) -> Result<Vec<(SessionId, u32)>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let me = conn.node_arc();
    let list: Vec<&str> = ids.iter().map(SessionId::as_str).collect();
    let rows = conn.query(
        concat!(
            "UPDATE session AS s SET resume_attempts = s.resume_attempts + 1, claim_boot = $2, ",
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
pub(crate) fn claimed_turn(
    conn: &mut PgConn,
    id: &SessionId,
    boot: &str,
) -> Result<Option<ClaimedTurn>, StoreError> {
    let row = conn.query_opt(
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

/// Counts one attempt of `id` when it holds no claim (adopting a session owed a turn), taking
/// it for this node. `None` when it is gone, claimed, owned by another live node, or held by
/// another transaction.
pub(crate) fn count_adoption(conn: &mut PgConn, id: &SessionId) -> Result<Option<u32>, StoreError> {
    let me = conn.node_arc();
    let row = conn.query_opt(
        concat!(
            "UPDATE session AS s SET resume_attempts = s.resume_attempts + 1, ",
            take_ownership!("$2"),
            " WHERE s.id = (SELECT id FROM session WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED) \
               AND s.time_suspended IS NULL AND ",
            not_held_elsewhere!("$2"),
            " RETURNING s.resume_attempts"
        ),
        &[&id.as_str(), &&*me],
    )?;
    counted(row)
}

/// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
pub(crate) fn own_claims(
    conn: &mut PgConn,
    boot: &str,
) -> Result<Vec<(SessionId, u64)>, StoreError> {
    let rows = conn.query(
        "SELECT id, claim_seq FROM session \
         WHERE time_suspended IS NOT NULL AND claim_boot = $1 AND claim_seq IS NOT NULL \
           AND parent_id IS NULL",
        &[&boot],
    )?;
    rows.iter()
        .map(|row| Ok((session_id(row.try_get(0)?)?, seq_value(row.try_get(1)?)?)))
        .collect()
}

/// Counts one more attempt of the turn `boot` claimed at `claim`; `None` when `id` holds no
/// such claim (released, or taken by another node id).
pub(crate) fn count_own_resume(
    conn: &mut PgConn,
    id: &SessionId,
    boot: &str,
    claim: u64,
) -> Result<Option<u32>, StoreError> {
    let row = conn.query_opt(
        "UPDATE session SET resume_attempts = resume_attempts + 1 \
         WHERE id = $1 AND time_suspended IS NOT NULL AND claim_boot = $2 AND claim_seq = $3 \
         RETURNING resume_attempts",
        &[&id.as_str(), &boot, &seq_param(claim)],
    )?;
    counted(row)
}

/// Decodes a column of session ids.
fn ids(rows: Vec<postgres::Row>) -> Result<Vec<SessionId>, StoreError> {
    rows.iter().map(|row| session_id(row.try_get(0)?)).collect()
}

/// Claimed top-level sessions no other live node owns, oldest claim first, except those
/// claimed by `exclude_boot` (a claim without a boot is never excluded).
pub(crate) fn list_claimed(
    conn: &mut PgConn,
    exclude_boot: Option<&str>,
) -> Result<Vec<SessionId>, StoreError> {
    let me = conn.node_arc();
    let rows = conn.query(
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

/// Releases every claimed child session no live turn holds: claimed by a boot other than
/// `boot` and not owned by another live node (every node sweeps every quarter lease: the
/// running child turns of this node and of the others keep their claims); returns how many.
pub(crate) fn release_child_claims(conn: &mut PgConn, boot: &str) -> Result<usize, StoreError> {
    let me = conn.node_arc();
    let n = conn.execute(
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

/// How many sessions hold a claim, and `now` minus the oldest claim's time.
pub(crate) fn claim_counts(conn: &mut PgConn, now: i64) -> Result<(i64, Option<i64>), StoreError> {
    let row = conn.query_one(
        "SELECT COUNT(*), $1::bigint - MIN(time_suspended) FROM session \
         WHERE time_suspended IS NOT NULL",
        &[&now],
    )?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The claim bookkeeping of `id`, or `None` when the session is not stored.
pub(crate) fn claim_state(
    conn: &mut PgConn,
    id: &SessionId,
) -> Result<Option<ClaimState>, StoreError> {
    let row = conn.query_opt(
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

/// Marks the pending input `id` as owed a turn (a no-op for a promoted input).
pub(crate) fn mark_wake(conn: &mut PgConn, id: &MessageId) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE session_input SET wake = true \
         WHERE id = $1 AND promoted_seq IS NULL AND NOT wake",
        &[&id.as_str()],
    )?;
    Ok(())
}

/// Drops the wake marks of every pending input of `session`.
pub(crate) fn clear_wakes(conn: &mut PgConn, session: &SessionId) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE session_input SET wake = false \
         WHERE session_id = $1 AND promoted_seq IS NULL AND wake",
        &[&session.as_str()],
    )?;
    Ok(())
}

/// The seq of the `session.execution.started` event that took `session`'s claim, if claimed.
pub(crate) fn claim_seq(conn: &mut PgConn, session: &SessionId) -> Result<Option<u64>, StoreError> {
    let row = conn.query_opt(
        "SELECT claim_seq FROM session WHERE id = $1",
        &[&session.as_str()],
    )?;
    let seq: Option<i64> = row.map(|row| row.try_get(0)).transpose()?.flatten();
    seq.map(seq_value).transpose()
}

/// Marks the `user` messages of `session` promoted after `claim` as interrupted by a user.
pub(crate) fn mark_interrupted(
    conn: &mut PgConn,
    session: &SessionId,
    claim: u64,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE session_message SET interrupted = true \
         WHERE session_id = $1 AND type = 'user' AND seq > $2 AND NOT interrupted",
        &[&session.as_str(), &seq_param(claim)],
    )?;
    Ok(())
}

/// Unclaimed top-level sessions no live node owns (this one included) whose pending inputs
/// are owed a turn, in id order. A session this node owns is left out: its owed input is one
/// this node's own wake is carrying to its actor right now (the admission took the session and
/// routed the wake here), or the next queued prompt its own turn just scheduled, and adopting it
/// would publish a restart notice and a second claim next to that turn (the periodic takeover
/// runs this listing while the node serves).
pub(crate) fn adoptable(conn: &mut PgConn) -> Result<Vec<SessionId>, StoreError> {
    let me = conn.node_arc();
    let rows = conn.query(
        concat!(
            "SELECT DISTINCT i.session_id FROM session_input i JOIN session s ON s.id = i.session_id \
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

/// Whether `session` holds a pending input owed a turn.
pub(crate) fn owes_turn(conn: &mut PgConn, session: &SessionId) -> Result<bool, StoreError> {
    let row = conn.query_one(
        "SELECT EXISTS (SELECT 1 FROM session_input \
         WHERE session_id = $1 AND promoted_seq IS NULL AND wake)",
        &[&session.as_str()],
    )?;
    Ok(row.try_get(0)?)
}

/// The inputs whose prompts entered `session`'s transcript after seq `claim`, in promotion
/// order.
pub(crate) fn promoted_after(
    conn: &mut PgConn,
    session: &SessionId,
    claim: u64,
) -> Result<Vec<Admission>, StoreError> {
    query_inputs(
        conn,
        "SELECT i.id, i.session_id, i.admitted_seq, i.prompt, i.delivery, i.time_created, \
                i.promoted_seq \
         FROM session_message m JOIN session_input i ON i.id = m.id \
         WHERE m.session_id = $1 AND m.type = 'user' AND m.seq > $2 ORDER BY m.seq",
        &[&session.as_str(), &seq_param(claim)],
    )
}

/// Whether `session`'s transcript holds a `user` message with seq greater than `seq`.
pub(crate) fn user_message_after(
    conn: &mut PgConn,
    session: &SessionId,
    seq: u64,
) -> Result<bool, StoreError> {
    let row = conn.query_one(
        "SELECT EXISTS (SELECT 1 FROM session_message \
         WHERE session_id = $1 AND type = 'user' AND seq > $2)",
        &[&session.as_str(), &seq_param(seq)],
    )?;
    Ok(row.try_get(0)?)
}

/// Drops the wake marks of `session`'s pending inputs admitted before `seq`.
pub(crate) fn clear_wakes_before(
    conn: &mut PgConn,
    session: &SessionId,
    seq: u64,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE session_input SET wake = false \
         WHERE session_id = $1 AND promoted_seq IS NULL AND wake AND admitted_seq < $2",
        &[&session.as_str(), &seq_param(seq)],
    )?;
    Ok(())
}

/// Holds `session`'s sequence row until COMMIT: an admission another node has in flight
/// commits first (and is seen by what this transaction reads next), a later one gets a seq
/// after this transaction's events.
pub(crate) fn hold_admissions(conn: &mut PgConn, session: &SessionId) -> Result<(), StoreError> {
    conn.execute(
        "SELECT 1 FROM event_sequence WHERE aggregate_id = $1 FOR UPDATE",
        &[&session.as_str()],
    )?;
    Ok(())
}
