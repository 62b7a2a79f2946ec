//! What recovery needs beyond the claim itself: the durable wake marks of admitted prompts, the
//! seq a claim was taken at, the inputs a claimed turn served, the interrupt marks of the
//! transcript, and the next queued prompt once a turn settles.
//!
//! A pending input's `wake` mark means "a caller was told this prompt will run, and no turn has
//! had the chance to serve it yet". It is set in the admission's own transaction, so a process
//! killed between the admission and its wake still leaves the intent on disk; the restart sweep
//! adopts sessions holding marked inputs ([`adoptable`]). The mark is dropped when an interrupt
//! fences the input ([`clear_wakes`]), and when a turn that claimed after the admission settles
//! without scheduling another ([`clear_wakes_before`], by the journal's settle rule).

use rusqlite::{Connection, OptionalExtension};

use super::{get_opt_seq, input, seq_param, session_id, StoreError};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::ClaimedTurn;
use crate::records::Admission;

/// Marks the pending input `id` as owed a turn. A no-op for a promoted input.
pub(crate) fn mark_wake(conn: &Connection, id: &MessageId) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_input SET wake = 1 WHERE id = ?1 AND promoted_seq IS NULL AND wake = 0",
    )?;
    stmt.execute([id.as_str()])?;
    Ok(())
}

/// Drops the wake marks of every pending input of `session` (an interrupt fenced them).
pub(crate) fn clear_wakes(conn: &Connection, session: &SessionId) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_input SET wake = 0 \
         WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1",
    )?;
    stmt.execute([session.as_str()])?;
    Ok(())
}

/// What the restart sweep reads of `session`'s turn claimed by `boot`, in one statement: the
/// seq that took the claim and the latest interrupt request. `None` when it holds no claim of
/// `boot` (a deleted session has no claim row).
pub(crate) fn claimed_turn(
    conn: &Connection,
    session: &SessionId,
    boot: &str,
) -> Result<Option<ClaimedTurn>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT claim_seq, ({}) FROM session_claim \
         WHERE session_id = ?1 AND time_suspended IS NOT NULL AND claim_boot = ?2",
        super::event::LATEST_INTERRUPT_SQL
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

/// The seq of the `session.execution.started` event that took `session`'s claim, if claimed.
pub(crate) fn claim_seq(conn: &Connection, session: &SessionId) -> Result<Option<u64>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT claim_seq FROM session_claim WHERE session_id = ?1")?;
    Ok(stmt
        .query_row([session.as_str()], |row| get_opt_seq(row, 0))
        .optional()?
        .flatten())
}

/// Marks the `user` messages of `session` promoted after `claim` as interrupted by a user.
pub(crate) fn mark_interrupted(
    conn: &Connection,
    session: &SessionId,
    claim: u64,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_message SET interrupted = 1 \
         WHERE session_id = ?1 AND type = 'user' AND seq > ?2 AND interrupted = 0",
    )?;
    stmt.execute(rusqlite::params![session.as_str(), seq_param(claim)])?;
    Ok(())
}

/// The query behind [`adoptable`]: read from the inbox's wake marks (`session_input_wake`),
/// each session's row and claim by id.
pub(super) const ADOPTABLE_SQL: &str = "SELECT DISTINCT i.session_id \
     FROM session_input i CROSS JOIN session s ON s.id = i.session_id \
     WHERE i.promoted_seq IS NULL AND i.wake = 1 AND s.parent_id IS NULL \
       AND NOT EXISTS (SELECT 1 FROM session_claim c \
                       WHERE c.session_id = i.session_id AND c.time_suspended IS NOT NULL) \
     ORDER BY i.session_id";

/// Top-level sessions holding no claim whose pending inputs are owed a turn, in id order.
pub(crate) fn adoptable(conn: &Connection) -> Result<Vec<SessionId>, StoreError> {
    let mut stmt = conn.prepare_cached(ADOPTABLE_SQL)?;
    let ids = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    ids.into_iter().map(session_id).collect()
}

/// Whether `session` holds a pending input owed a turn.
pub(crate) fn owes_turn(conn: &Connection, session: &SessionId) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM session_input \
         WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1)",
    )?;
    Ok(stmt.query_row([session.as_str()], |row| row.get(0))?)
}

/// The inputs whose prompts entered `session`'s transcript after seq `claim`, in promotion
/// order.
pub(crate) fn promoted_after(
    conn: &Connection,
    session: &SessionId,
    claim: u64,
) -> Result<Vec<Admission>, StoreError> {
    input::query_inputs(
        conn,
        "SELECT i.id, i.session_id, i.admitted_seq, i.prompt, i.delivery, i.time_created, \
                i.promoted_seq \
         FROM session_message m JOIN session_input i ON i.id = m.id \
         WHERE m.session_id = ?1 AND m.type = 'user' AND m.seq > ?2 ORDER BY m.seq",
        rusqlite::params![session.as_str(), seq_param(claim)],
    )
}

/// Whether `session`'s transcript holds a `user` message with seq greater than `seq`.
pub(crate) fn user_message_after(
    conn: &Connection,
    session: &SessionId,
    seq: u64,
) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM session_message \
         WHERE session_id = ?1 AND type = 'user' AND seq > ?2)",
    )?;
    Ok(
        stmt.query_row(rusqlite::params![session.as_str(), seq_param(seq)], |row| {
            row.get(0)
        })?,
    )
}

/// Drops the wake marks of `session`'s pending inputs admitted before `seq`.
pub(crate) fn clear_wakes_before(
    conn: &Connection,
    session: &SessionId,
    seq: u64,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_input SET wake = 0 \
         WHERE session_id = ?1 AND promoted_seq IS NULL AND wake = 1 AND admitted_seq < ?2",
    )?;
    stmt.execute(rusqlite::params![session.as_str(), seq_param(seq)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::kind;
    use crate::journal::sqlite::publish;
    use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
    use crate::journal::sqlite::test_support::{served_inputs, settle};

    use crate::journal::sqlite::test_support::{admit, promote_queue, promote_steer};
    use crate::records::Delivery;

    fn started(conn: &Connection, s: &SessionId) -> Result<u64, StoreError> {
        Ok(publish(conn, s, kind::EXECUTION_STARTED, &json!({ "boot": "b" }), 1)?.seq)
    }

    #[test]
    fn wake_marks_are_adopted_until_fenced_or_claimed() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        create(conn, "quiet", None, 1)?;
        create(conn, "child", Some("s"), 1)?;
        admit(conn, &s, &mid("p1"), &json!("one"), Delivery::Steer, 2)?;
        admit(
            conn,
            &sid("quiet"),
            &mid("q"),
            &json!("q"),
            Delivery::Steer,
            2,
        )?;
        admit(
            conn,
            &sid("child"),
            &mid("c"),
            &json!("c"),
            Delivery::Steer,
            2,
        )?;
        assert!(adoptable(conn)?.is_empty(), "admitted without resume");
        mark_wake(conn, &mid("p1"))?;
        mark_wake(conn, &mid("c"))?;
        assert_eq!(
            adoptable(conn)?,
            vec![s.clone()],
            "children are not adopted"
        );
        assert!(owes_turn(conn, &s)?);
        started(conn, &s)?;
        assert!(
            adoptable(conn)?.is_empty(),
            "a claimed session is swept as a claim"
        );
        publish(conn, &s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
        assert_eq!(adoptable(conn)?, vec![s.clone()]);
        clear_wakes(conn, &s)?;
        assert!(adoptable(conn)?.is_empty());
        assert!(!owes_turn(conn, &s)?);
        Ok(())
    }

    #[test]
    fn a_claim_keeps_its_first_seq_across_resumed_attempts() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        assert_eq!(claim_seq(conn, &s)?, None);
        let first = started(conn, &s)?;
        started(conn, &s)?;
        assert_eq!(claim_seq(conn, &s)?, Some(first));
        let error = json!({ "error": { "type": "unknown", "message": "boom" } });
        publish(conn, &s, kind::EXECUTION_FAILED, &error, 2)?;
        assert_eq!(claim_seq(conn, &s)?, None);
        let next = started(conn, &s)?;
        assert_eq!(claim_seq(conn, &s)?, Some(next));
        Ok(())
    }

    #[test]
    fn served_inputs_skip_earlier_turns_and_interrupted_work() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        admit(conn, &s, &mid("old"), &json!("old"), Delivery::Steer, 2)?;
        started(conn, &s)?;
        promote_steer(conn, &s, None, 3)?;
        publish(conn, &s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
        admit(conn, &s, &mid("a"), &json!("a"), Delivery::Steer, 4)?;
        let claim = started(conn, &s)?;
        promote_steer(conn, &s, None, 5)?;
        let ids = |v: Vec<Admission>| v.into_iter().map(|a| a.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(served_inputs(conn, &s, claim, None)?), ["a"]);
        let fence = publish(conn, &s, kind::INTERRUPT_REQUESTED, &json!({}), 6)?.seq;
        assert!(ids(served_inputs(conn, &s, claim, Some(fence))?).is_empty());
        admit(conn, &s, &mid("b"), &json!("b"), Delivery::Queue, 7)?;
        promote_queue(conn, &s, 8)?;
        assert_eq!(ids(served_inputs(conn, &s, claim, Some(fence))?), ["b"]);
        Ok(())
    }

    #[test]
    fn settle_schedules_the_next_queued_prompt_only_after_progress() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        started(conn, &s)?;
        let q1 = admit(conn, &s, &mid("q1"), &json!("1"), Delivery::Queue, 2)?.0;
        let q2 = admit(conn, &s, &mid("q2"), &json!("2"), Delivery::Queue, 2)?.0;
        mark_wake(conn, &q1.id)?;
        mark_wake(conn, &q2.id)?;
        // Nothing promoted yet: no progress, no continuation; the wakes came after the claim.
        assert_eq!(settle(conn, &s)?, None);
        assert!(owes_turn(conn, &s)?);
        promote_queue(conn, &s, 3)?;
        assert_eq!(settle(conn, &s)?, Some(q2.admitted_seq));
        publish(conn, &s, kind::EXECUTION_SUCCEEDED, &json!({}), 4)?;
        // The next turn claims after both admissions and promotes nothing: the mark is dropped.
        started(conn, &s)?;
        assert_eq!(settle(conn, &s)?, None);
        assert!(!owes_turn(conn, &s)?);
        // A fenced queue input is never scheduled.
        publish(conn, &s, kind::INTERRUPT_REQUESTED, &json!({}), 5)?;
        promote_steer(conn, &s, None, 5)?;
        assert_eq!(settle(conn, &s)?, None);
        Ok(())
    }

    #[test]
    fn a_user_interrupt_marks_the_turns_prompts() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let s = sid("s");
        create(conn, "s", None, 1)?;
        admit(conn, &s, &mid("done"), &json!("d"), Delivery::Steer, 2)?;
        started(conn, &s)?;
        promote_steer(conn, &s, None, 3)?;
        publish(conn, &s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
        admit(conn, &s, &mid("cut"), &json!("c"), Delivery::Steer, 4)?;
        started(conn, &s)?;
        promote_steer(conn, &s, None, 5)?;
        let reason = json!({ "reason": "user" });
        publish(conn, &s, kind::EXECUTION_INTERRUPTED, &reason, 6)?;
        let marked: Vec<(String, bool)> = conn
            .prepare("SELECT id, interrupted FROM session_message ORDER BY seq")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        assert_eq!(marked, [("done".into(), false), ("cut".into(), true)]);
        Ok(())
    }
}
