//! Claim bookkeeping in `session_claim`: claim, release, resume counting and the restart
//! sweep's reads.
//!
//! A session has a `session_claim` row only while it holds a claim (`time_suspended` set) or
//! the restart sweep has counted an adoption it has not claimed yet (`time_suspended` NULL,
//! `resume_attempts` counted); a release deletes the row. So a claim and its release write a
//! few pages of a table as small as the number of claimed sessions, not the session's row.
//! None of these writes touch `session.time_updated`: a claim is execution state, not a
//! session change.

use rusqlite::{Connection, OptionalExtension};

use super::{get_opt_seq, seq_param, session_id, StoreError};
use crate::id::SessionId;
use crate::journal::rules::ClaimRow;
use crate::records::ClaimState;

/// The claim row of `id`, if it has one.
pub(crate) fn claim_row(conn: &Connection, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
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
pub(crate) fn write_claim(
    conn: &Connection,
    id: &SessionId,
    claim: &ClaimRow,
) -> Result<bool, StoreError> {
    // A session the writer knows the log number of is stored (see `streams`): its claim needs
    // no probe of the session table.
    let sql = if super::streams::lookup(id).is_some() {
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
    let mut stmt = conn.prepare_cached(sql)?;
    let seq = claim.seq.map(seq_param);
    Ok(stmt.execute(rusqlite::params![id.as_str(), claim.time, seq, claim.boot])? > 0)
}

/// Releases the claim on `id` and resets its resume attempts (deletes its claim row).
/// Returns whether there was a row to delete.
pub(crate) fn release(conn: &Connection, id: &SessionId) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached("DELETE FROM session_claim WHERE session_id = ?1")?;
    Ok(stmt.execute([id.as_str()])? > 0)
}

/// Counts one resume attempt of `id`'s claimed turn for process boot `boot` and returns the new
/// count, taking the claim for `boot` (`claim_boot`), so a turn is counted at most once per boot.
/// `None` when there is nothing to count: the session is gone, its claim was released, or the
/// claim is already `boot`'s — a turn this process started, or a sweep of this boot (running
/// concurrently) counted it first.
pub(crate) fn count_resume(
    conn: &Connection,
    id: &SessionId,
    boot: &str,
) -> Result<Option<u32>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_claim SET resume_attempts = resume_attempts + 1, claim_boot = ?2 \
         WHERE session_id = ?1 AND time_suspended IS NOT NULL \
           AND (claim_boot IS NULL OR claim_boot <> ?2) \
         RETURNING resume_attempts",
    )?;
    Ok(stmt
        .query_row(rusqlite::params![id.as_str(), boot], |row| row.get(0))
        .optional()?)
}

/// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
pub(crate) fn own_claims(
    conn: &Connection,
    boot: &str,
) -> Result<Vec<(SessionId, u64)>, StoreError> {
    let mut stmt = conn.prepare_cached(
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

/// Counts one more attempt of the turn `boot` claimed at `claim` and returns the new count;
/// `None` when `id` holds no such claim (released, or taken by another boot).
pub(crate) fn count_own_resume(
    conn: &Connection,
    id: &SessionId,
    boot: &str,
    claim: u64,
) -> Result<Option<u32>, StoreError> {
    let mut stmt = conn.prepare_cached(
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
/// session owed a turn) and returns the new count; `None` when the session is gone or claimed
/// (a turn of this process, or a concurrent sweep, took it since it was listed). The count
/// lives in a claim row without a claim (`time_suspended` NULL) until the sweep claims the
/// turn, or a release deletes it.
pub(crate) fn count_adoption(conn: &Connection, id: &SessionId) -> Result<Option<u32>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO session_claim (session_id, resume_attempts) \
         SELECT id, 1 FROM session WHERE id = ?1 \
         ON CONFLICT (session_id) DO UPDATE SET resume_attempts = resume_attempts + 1 \
           WHERE time_suspended IS NULL \
         RETURNING resume_attempts",
    )?;
    Ok(stmt.query_row([id.as_str()], |row| row.get(0)).optional()?)
}

/// The query behind [`list_claimed`]: every claim (`session_claim` holds claimed sessions only,
/// so it is scanned and sorted by claim time), each session's row read by id for its parent.
const LIST_CLAIMED_SQL: &str = "SELECT session_claim.session_id \
     FROM session_claim CROSS JOIN session s ON s.id = session_claim.session_id \
     WHERE session_claim.time_suspended IS NOT NULL AND s.parent_id IS NULL \
       AND (?1 IS NULL OR session_claim.claim_boot IS NULL \
            OR session_claim.claim_boot <> ?1) \
     ORDER BY session_claim.time_suspended, session_claim.session_id";

/// Claimed top-level sessions, oldest claim first, except those claimed by `exclude_boot` (a
/// claim without a boot is never excluded).
pub(crate) fn list_claimed(
    conn: &Connection,
    exclude_boot: Option<&str>,
) -> Result<Vec<SessionId>, StoreError> {
    let mut stmt = conn.prepare_cached(LIST_CLAIMED_SQL)?;
    let ids = stmt
        .query_map([exclude_boot], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    ids.into_iter().map(session_id).collect()
}

/// The statement behind [`release_child_claims`]: it reads the claims, and each claimed
/// session's row by id (not every child through `session_parent`).
const RELEASE_CHILD_CLAIMS_SQL: &str = "DELETE FROM session_claim \
     WHERE time_suspended IS NOT NULL AND (claim_boot IS NULL OR claim_boot <> ?1) \
       AND (SELECT s.parent_id FROM session s WHERE s.id = session_claim.session_id) IS NOT NULL";

/// Releases every child session claimed by a boot other than `boot` (children are never
/// resumed on their own; a claim of `boot` is a child turn running in this process). Returns
/// how many claims were released.
pub(crate) fn release_child_claims(conn: &Connection, boot: &str) -> Result<usize, StoreError> {
    let mut stmt = conn.prepare_cached(RELEASE_CHILD_CLAIMS_SQL)?;
    Ok(stmt.execute([boot])?)
}

/// The query behind [`claim_counts`].
const CLAIM_COUNTS_SQL: &str = "SELECT COUNT(*), ?1 - MIN(time_suspended) FROM session_claim \
     WHERE time_suspended IS NOT NULL";

/// How many sessions hold a claim, and `now` minus the oldest claim's time.
pub(crate) fn claim_counts(conn: &Connection, now: i64) -> Result<(i64, Option<i64>), StoreError> {
    let mut stmt = conn.prepare_cached(CLAIM_COUNTS_SQL)?;
    Ok(stmt.query_row([now], |row| Ok((row.get(0)?, row.get(1)?)))?)
}

/// The claim bookkeeping of `id`, or `None` when the session is not stored.
pub(crate) fn claim_state(
    conn: &Connection,
    id: &SessionId,
) -> Result<Option<ClaimState>, StoreError> {
    let mut stmt = conn.prepare_cached(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::sqlite::get_session;
    use crate::journal::sqlite::test_support::claim;
    use crate::journal::sqlite::test_support::{create, plan, sid, test_db};

    /// What the restart sweep reads at start costs what is claimed or owed, not the number of
    /// sessions: each statement reads the claims (`session_claim`, a row per claimed session,
    /// scanned or through its primary key) or the inbox's wake marks (`session_input_wake`)
    /// first, and a session only by id; none scans `session` or reads it through the parent
    /// index (where every top-level session has the same key).
    #[test]
    fn the_sweeps_reads_visit_claims_and_wake_marks_only() -> Result<(), StoreError> {
        let db = test_db()?;
        create(&db.conn, "a", None, 1)?;
        create(&db.conn, "child", Some("a"), 2)?;
        let sweep = [
            LIST_CLAIMED_SQL,
            RELEASE_CHILD_CLAIMS_SQL,
            CLAIM_COUNTS_SQL,
            crate::journal::sqlite::recovery::ADOPTABLE_SQL,
        ];
        for sql in sweep {
            let lines = plan(&db.conn, sql)?;
            let reads: Vec<&str> = lines
                .iter()
                .map(String::as_str)
                .filter(|l| l.starts_with("SCAN") || l.starts_with("SEARCH"))
                .collect();
            // `session_claim` by name, or through its primary key (`session_id`).
            let claims_or_wakes = |l: &str| {
                l.contains("session_claim")
                    || l.contains("PRIMARY KEY (session_id=?)")
                    || l.contains("session_input_wake")
            };
            assert!(
                reads.first().is_some_and(|l| claims_or_wakes(l)),
                "{sql}: reads the claims or the wake marks first: {lines:?}"
            );
            for read in reads {
                assert!(
                    !read.contains("session_parent")
                        && (claims_or_wakes(read) || read.ends_with("(id=?)")),
                    "{sql}: {read} (a session is read by id only): {lines:?}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn second_claim_keeps_first_time_and_time_updated() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        create(conn, "a", None, 100)?;
        assert!(claim(conn, &sid("a"), 1_000, 1, "boot-1")?);
        count_resume(conn, &sid("a"), "boot-2")?;
        assert!(claim(conn, &sid("a"), 2_000, 1, "boot-2")?);
        let state = claim_state(conn, &sid("a"))?.expect("stored");
        assert_eq!(
            state,
            ClaimState {
                time_suspended: Some(1_000),
                resume_attempts: 1,
                claim_boot: Some("boot-2".into()),
            }
        );
        let info = get_session(conn, &sid("a"))?.expect("stored");
        assert_eq!((info.time_updated, info.time_suspended), (100, Some(1_000)));
        Ok(())
    }

    #[test]
    fn claim_of_a_missing_session_reports_false() -> Result<(), StoreError> {
        let db = test_db()?;
        assert!(!claim(&db.conn, &sid("ghost"), 1, 1, "b")?);
        assert!(!release(&db.conn, &sid("ghost"))?);
        assert_eq!(claim_state(&db.conn, &sid("ghost"))?, None);
        Ok(())
    }

    #[test]
    fn release_clears_claim_and_resets_attempts() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        create(conn, "a", None, 100)?;
        claim(conn, &sid("a"), 1_000, 1, "boot")?;
        count_resume(conn, &sid("a"), "boot-2")?;
        count_resume(conn, &sid("a"), "boot-3")?;
        assert!(release(conn, &sid("a"))?);
        let state = claim_state(conn, &sid("a"))?.expect("stored");
        assert_eq!(
            state,
            ClaimState {
                time_suspended: None,
                resume_attempts: 0,
                claim_boot: None,
            }
        );
        assert_eq!(
            get_session(conn, &sid("a"))?.expect("stored").time_updated,
            100
        );
        Ok(())
    }

    #[test]
    fn count_resume_counts_up_and_is_none_for_missing_row() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        create(conn, "a", None, 100)?;
        claim(conn, &sid("a"), 1_000, 1, "boot")?;
        assert_eq!(count_resume(conn, &sid("a"), "boot-2")?, Some(1));
        assert_eq!(count_resume(conn, &sid("a"), "boot-3")?, Some(2));
        assert_eq!(count_resume(conn, &sid("a"), "boot-4")?, Some(3));
        assert_eq!(count_resume(conn, &sid("ghost"), "boot-4")?, None);
        assert_eq!(
            get_session(conn, &sid("a"))?.expect("stored").time_updated,
            100
        );
        Ok(())
    }

    #[test]
    fn count_resume_counts_once_per_boot_and_never_a_released_claim() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        create(conn, "a", None, 100)?;
        claim(conn, &sid("a"), 1_000, 1, "crashed")?;
        assert_eq!(count_resume(conn, &sid("a"), "boot-2")?, Some(1));
        // A second count in the same boot (a concurrent sweep) finds the claim taken.
        assert_eq!(count_resume(conn, &sid("a"), "boot-2")?, None);
        let state = claim_state(conn, &sid("a"))?.expect("stored");
        assert_eq!(state.resume_attempts, 1);
        assert_eq!(state.claim_boot.as_deref(), Some("boot-2"));
        // The next boot counts again.
        assert_eq!(count_resume(conn, &sid("a"), "boot-3")?, Some(2));
        // A released claim is never counted.
        release(conn, &sid("a"))?;
        assert_eq!(count_resume(conn, &sid("a"), "boot-4")?, None);
        let state = claim_state(conn, &sid("a"))?.expect("stored");
        assert_eq!((state.time_suspended, state.resume_attempts), (None, 0));
        Ok(())
    }

    #[test]
    fn list_claimed_excludes_children_unclaimed_and_excluded_boot() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        for (id, parent) in [
            ("old", None),
            ("mine", None),
            ("anon", None),
            ("idle", None),
            ("child", Some("old")),
        ] {
            create(conn, id, parent, 100)?;
        }
        claim(conn, &sid("old"), 10, 1, "boot-old")?;
        claim(conn, &sid("mine"), 20, 1, "boot-now")?;
        claim(conn, &sid("child"), 30, 1, "boot-old")?;
        claim(conn, &sid("anon"), 40, 1, "boot-old")?;
        conn.execute(
            "UPDATE session_claim SET claim_boot = NULL WHERE session_id = 'anon'",
            [],
        )?;

        let all = list_claimed(conn, None)?;
        assert_eq!(all, vec![sid("old"), sid("mine"), sid("anon")]);
        let others = list_claimed(conn, Some("boot-now"))?;
        assert_eq!(others, vec![sid("old"), sid("anon")]);
        Ok(())
    }

    #[test]
    fn release_child_claims_touches_only_claimed_children() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        create(conn, "parent", None, 100)?;
        create(conn, "busy-child", Some("parent"), 100)?;
        create(conn, "idle-child", Some("parent"), 100)?;
        claim(conn, &sid("parent"), 10, 1, "b")?;
        claim(conn, &sid("busy-child"), 10, 1, "b")?;
        count_resume(conn, &sid("busy-child"), "b2")?;

        assert_eq!(
            release_child_claims(conn, "b2")?,
            0,
            "its own boot's claim is a live turn"
        );
        assert_eq!(release_child_claims(conn, "b3")?, 1);
        let child = claim_state(conn, &sid("busy-child"))?.expect("stored");
        assert_eq!((child.time_suspended, child.resume_attempts), (None, 0));
        let parent = claim_state(conn, &sid("parent"))?.expect("stored");
        assert_eq!(parent.time_suspended, Some(10));
        assert_eq!(release_child_claims(conn, "b3")?, 0);
        Ok(())
    }
}
