//! Tests of the claim bookkeeping and the restart sweep's reads.

use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::projection::release;
use crate::journal::sqlite::test_support::claim;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::{create, plan, sid, started, test_db};

/// What the restart sweep reads at start costs what is claimed or owed, not the number of
/// sessions: each statement reads the claims (`session_claim`, a row per claimed session,
/// scanned or through its primary key) or the inbox's wake marks (`session_input_wake`)
/// first, and a session only by id; none scans `session` or reads it through the parent
/// index (where every top-level session has the same key).
#[test]
fn the_sweeps_reads_visit_claims_and_wake_marks_only() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "a", None, 1)?;
    create(&mut db.conn, "child", Some("a"), 2)?;
    let sweep = [
        LIST_CLAIMED_SQL,
        RELEASE_CHILD_CLAIMS_SQL,
        CLAIM_COUNTS_SQL,
        ADOPTABLE_SQL,
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
    conn.count_resume(&sid("a"), "boot-2")?;
    assert!(claim(conn, &sid("a"), 2_000, 1, "boot-2")?);
    let state = conn.claim_state(&sid("a"))?.expect("stored");
    assert_eq!(
        state,
        ClaimState {
            time_suspended: Some(1_000),
            resume_attempts: 1,
            claim_boot: Some("boot-2".into()),
        }
    );
    let info = conn.get_session(&sid("a"))?.expect("stored");
    assert_eq!((info.time_updated, info.time_suspended), (100, Some(1_000)));
    Ok(())
}

#[test]
fn claim_of_a_missing_session_reports_false() -> Result<(), StoreError> {
    let mut db = test_db()?;
    assert!(!claim(&mut db.conn, &sid("ghost"), 1, 1, "b")?);
    assert!(!release(&db.conn, &sid("ghost"))?);
    assert_eq!(db.conn.claim_state(&sid("ghost"))?, None);
    Ok(())
}

#[test]
fn release_clears_claim_and_resets_attempts() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    create(conn, "a", None, 100)?;
    claim(conn, &sid("a"), 1_000, 1, "boot")?;
    conn.count_resume(&sid("a"), "boot-2")?;
    conn.count_resume(&sid("a"), "boot-3")?;
    assert!(release(conn, &sid("a"))?);
    let state = conn.claim_state(&sid("a"))?.expect("stored");
    assert_eq!(
        state,
        ClaimState {
            time_suspended: None,
            resume_attempts: 0,
            claim_boot: None,
        }
    );
    assert_eq!(
        conn.get_session(&sid("a"))?.expect("stored").time_updated,
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
    assert_eq!(conn.count_resume(&sid("a"), "boot-2")?, Some(1));
    assert_eq!(conn.count_resume(&sid("a"), "boot-3")?, Some(2));
    assert_eq!(conn.count_resume(&sid("a"), "boot-4")?, Some(3));
    assert_eq!(conn.count_resume(&sid("ghost"), "boot-4")?, None);
    assert_eq!(
        conn.get_session(&sid("a"))?.expect("stored").time_updated,
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
    assert_eq!(conn.count_resume(&sid("a"), "boot-2")?, Some(1));
    // A second count in the same boot (a concurrent sweep) finds the claim taken.
    assert_eq!(conn.count_resume(&sid("a"), "boot-2")?, None);
    let state = conn.claim_state(&sid("a"))?.expect("stored");
    assert_eq!(state.resume_attempts, 1);
    assert_eq!(state.claim_boot.as_deref(), Some("boot-2"));
    // The next boot counts again.
    assert_eq!(conn.count_resume(&sid("a"), "boot-3")?, Some(2));
    // A released claim is never counted.
    release(conn, &sid("a"))?;
    assert_eq!(conn.count_resume(&sid("a"), "boot-4")?, None);
    let state = conn.claim_state(&sid("a"))?.expect("stored");
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

    let all = conn.list_claimed(None)?;
    assert_eq!(all, vec![sid("old"), sid("mine"), sid("anon")]);
    let others = conn.list_claimed(Some("boot-now"))?;
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
    conn.count_resume(&sid("busy-child"), "b2")?;

    assert_eq!(
        conn.release_child_claims("b2")?,
        0,
        "its own boot's claim is a live turn"
    );
    assert_eq!(conn.release_child_claims("b3")?, 1);
    let child = conn.claim_state(&sid("busy-child"))?.expect("stored");
    assert_eq!((child.time_suspended, child.resume_attempts), (None, 0));
    let parent = conn.claim_state(&sid("parent"))?.expect("stored");
    assert_eq!(parent.time_suspended, Some(10));
    assert_eq!(conn.release_child_claims("b3")?, 0);
    Ok(())
}

#[test]
fn a_claim_keeps_its_first_seq_across_resumed_attempts() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    assert_eq!(conn.claim_seq(&s)?, None);
    let first = started(conn, &s)?;
    started(conn, &s)?;
    assert_eq!(conn.claim_seq(&s)?, Some(first));
    let error = json!({ "error": { "type": "unknown", "message": "boom" } });
    conn.publish(&s, kind::EXECUTION_FAILED, &error, 2)?;
    assert_eq!(conn.claim_seq(&s)?, None);
    let next = started(conn, &s)?;
    assert_eq!(conn.claim_seq(&s)?, Some(next));
    Ok(())
}
