//! Tests of sequences, conflicts, ownership and fencing on the shared cluster (see `tests`; the
//! writer's: `tests_writer`).

use serde_json::json;

use super::conn::{conflict_on_constraint, PgConn};
use super::tests::{config, pg_conn, pg_db, sql};
use super::PgWriter;
use crate::error::StoreError;
use crate::event::{kind, SessionEvent};
use crate::journal::backend::{ClaimRows, EventRows, InputRows, OwnershipRows};
use crate::journal::backend::{Nudge, Ownership, Route, Store, WriterConnection};
use crate::journal::sqlite::test_support::{info, mid, sid};
use crate::records::Delivery;

/// Creates top-level session `id` through the store.
pub(super) fn create(conn: &mut PgConn, id: &str) -> Result<(), StoreError> {
    conn.create_session(&info(id, None, 1))?;
    Ok(())
}

/// Lapses node `node`'s lease (as if it died a lease ago).
fn lapse(conn: &mut PgConn, node: &str) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = $1",
        &[&node],
    )?;
    Ok(())
}

#[test]
fn seqs_start_at_zero_and_are_gap_free_per_session() -> Result<(), StoreError> {
    let Some(db) = pg_db("seqs") else {
        return Ok(());
    };
    let mut conn = pg_conn(&db, "a")?;
    let (a, b) = (sid("a"), sid("b"));
    assert_eq!(EventRows::latest_seq(&mut conn, &a)?, None);
    let mut seqs = Vec::new();
    for session in [&a, &a, &b, &a, &b] {
        seqs.push(conn.publish(session, "custom.kind", &json!({}), 1)?.seq);
    }
    assert_eq!(seqs, [0, 1, 0, 2, 1]);
    assert_eq!(EventRows::latest_seq(&mut conn, &a)?, Some(2));
    Ok(())
}

#[test]
fn constraint_violations_become_conflicts() -> Result<(), StoreError> {
    let Some(db) = pg_db("conflicts") else {
        return Ok(());
    };
    let mut conn = pg_conn(&db, "a")?;
    sql(
        &mut conn,
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('a', 0)",
    )?;
    let client = conn.client()?;
    let dup = client
        .execute(
            "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('a', 1)",
            &[],
        )
        .map_err(|e| conflict_on_constraint(e, || "duplicate".into()));
    assert!(matches!(dup, Err(StoreError::Conflict(m)) if m.starts_with("duplicate")));
    let other = client
        .execute("SELECT * FROM no_such_table", &[])
        .map_err(|e| conflict_on_constraint(e, || "unused".into()));
    assert!(matches!(other, Err(StoreError::Database(_))));
    Ok(())
}

/// Two nodes' writers append to one session at once, each in transactions of several events:
/// the seqs are 0.. with no gap and no duplicate, and each row records its writer.
#[test]
fn two_nodes_appending_to_one_session_leave_no_gap() -> Result<(), StoreError> {
    const EACH: usize = 60;
    let Some(db) = pg_db("two_writers") else {
        return Ok(());
    };
    let mut setup = pg_conn(&db, "setup")?;
    create(&mut setup, "shared")?;
    let writers: Vec<PgWriter> = ["n1", "n2"]
        .into_iter()
        .map(|node| Ok(PgWriter::new(pg_conn(&db, node)?, config(&db, node))))
        .collect::<Result<_, StoreError>>()?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = writers
            .into_iter()
            .map(|mut w| {
                scope.spawn(move || -> Result<(), StoreError> {
                    for i in 0..EACH / 3 {
                        w.begin()?;
                        for j in 0..3 {
                            w.savepoint()?;
                            w.store()
                                .publish(&sid("shared"), "custom.kind", &json!([i, j]), 1)?;
                            w.release()?;
                        }
                        w.commit()?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(StoreError::Closed)))
    })?;
    let rows = setup.query(
        "SELECT seq, node FROM event WHERE aggregate_id = 'shared' ORDER BY seq",
        &[],
    )?;
    let seqs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(seqs, (0..=(2 * EACH) as i64).collect::<Vec<_>>());
    let by = |node: &str| rows.iter().filter(|r| r.get::<_, &str>(1) == node).count();
    assert_eq!((by("setup"), by("n1"), by("n2")), (1, EACH, EACH));
    Ok(())
}

#[test]
fn acquire_takes_free_own_and_lapsed_sessions_only() -> Result<(), StoreError> {
    let Some(db) = pg_db("acquire") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    create(&mut a, "s")?;
    assert_eq!(a.acquire(&sid("ghost"))?, Ownership::Missing);
    assert_eq!(a.acquire(&sid("s"))?, Ownership::Owned { epoch: 1 });
    assert_eq!(
        a.acquire(&sid("s"))?,
        Ownership::Owned { epoch: 1 },
        "own: kept"
    );
    assert_eq!(
        b.acquire(&sid("s"))?,
        Ownership::Elsewhere { node: "a".into() }
    );
    lapse(&mut b, "a")?;
    assert_eq!(b.acquire(&sid("s"))?, Ownership::Owned { epoch: 2 });
    // An owner whose row is gone is dead too.
    sql(
        &mut a,
        "UPDATE session SET owner_node = 'vanished' WHERE id = 's'",
    )?;
    assert_eq!(a.acquire(&sid("s"))?, Ownership::Owned { epoch: 3 });
    // Released: the next owner (even the same node) takes a new epoch.
    a.release_ownership(&[sid("s"), sid("ghost")])?;
    let row = a.query_one(
        "SELECT owner_node, owner_epoch FROM session WHERE id = 's'",
        &[],
    )?;
    assert_eq!(
        (row.get::<_, Option<String>>(0), row.get::<_, i64>(1)),
        (None, 3)
    );
    assert_eq!(b.acquire(&sid("s"))?, Ownership::Owned { epoch: 4 });
    // Releasing what another node owns changes nothing.
    a.release_ownership(&[sid("s")])?;
    assert_eq!(
        a.acquire(&sid("s"))?,
        Ownership::Elsewhere { node: "b".into() }
    );
    Ok(())
}

/// A session a dead node left claimed is not taken by `acquire` (a wake would start a plain
/// turn over the dead turn's claim): it is the takeover's, whose counting takes it; a node that
/// left gracefully is no different. An unclaimed session of a dead node is taken as before.
#[test]
fn acquire_leaves_a_dead_nodes_claimed_turn_to_the_takeover() -> Result<(), StoreError> {
    let Some(db) = pg_db("acquire_claimed") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    for id in ["busy", "idle"] {
        create(&mut a, id)?;
        assert_eq!(a.acquire(&sid(id))?, Ownership::Owned { epoch: 1 });
    }
    a.publish(
        &sid("busy"),
        kind::EXECUTION_STARTED,
        &json!({"boot": "a"}),
        5,
    )?;
    assert_eq!(
        a.acquire(&sid("busy"))?,
        Ownership::Owned { epoch: 1 },
        "its own"
    );
    lapse(&mut b, "a")?;
    assert_eq!(
        b.acquire(&sid("busy"))?,
        Ownership::Elsewhere { node: "a".into() }
    );
    assert_eq!(b.acquire(&sid("idle"))?, Ownership::Owned { epoch: 2 });
    // Released (a graceful leave keeps the claim): still the takeover's.
    sql(
        &mut a,
        "UPDATE session SET owner_node = NULL WHERE id = 'busy'",
    )?;
    assert_eq!(
        b.acquire(&sid("busy"))?,
        Ownership::Elsewhere { node: "a".into() }
    );
    // A wake or an interrupt received meanwhile is carried out by the takeover, not here.
    assert_eq!(
        b.route(&sid("busy"), Nudge::Wake(6))?,
        Route::Remote { node: "a".into() }
    );
    assert_eq!(b.route(&sid("idle"), Nudge::Wake(6))?, Route::Local);
    assert_eq!(b.count_resume(&sid("busy"), "b")?, Some(1));
    assert_eq!(b.acquire(&sid("busy"))?, Ownership::Owned { epoch: 2 });
    assert_eq!(b.route(&sid("busy"), Nudge::Wake(6))?, Route::Local);
    Ok(())
}

#[test]
fn check_fence_passes_only_the_owner_at_its_epoch() -> Result<(), StoreError> {
    let Some(db) = pg_db("fence") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    create(&mut a, "s")?;
    let fenced = |r: Result<(), StoreError>, want: u64| matches!(r, Err(StoreError::Fenced { session_id, epoch }) if session_id.as_str() == "s" && epoch == want);
    assert!(fenced(a.check_fence(&sid("s"), 0), 0), "nobody owns it");
    assert_eq!(a.acquire(&sid("s"))?, Ownership::Owned { epoch: 1 });
    a.check_fence(&sid("s"), 1)?;
    assert!(fenced(b.check_fence(&sid("s"), 1), 1), "another node");
    lapse(&mut b, "a")?;
    assert_eq!(b.acquire(&sid("s"))?, Ownership::Owned { epoch: 2 });
    assert!(fenced(a.check_fence(&sid("s"), 1), 1), "a stale epoch");
    b.check_fence(&sid("s"), 2)?;
    assert!(matches!(
        b.check_fence(&sid("ghost"), 2),
        Err(StoreError::Fenced { .. })
    ));
    Ok(())
}

/// While a fenced request's transaction is open, no other node can take the session; once it
/// commits, the takeover goes through.
#[test]
fn check_fence_holds_the_session_until_commit() -> Result<(), StoreError> {
    let Some(db) = pg_db("fence_lock") else {
        return Ok(());
    };
    let mut a = PgWriter::new(pg_conn(&db, "a")?, config(&db, "a"));
    let mut b = pg_conn(&db, "b")?;
    create(&mut b, "s")?;
    a.store().acquire(&sid("s"))?;
    lapse(&mut b, "a")?;
    a.begin()?;
    a.store().check_fence(&sid("s"), 1)?;
    sql(&mut b, "SET lock_timeout = 200")?;
    let blocked = b.acquire(&sid("s"));
    assert!(
        matches!(blocked, Err(StoreError::Database(_))),
        "{blocked:?}"
    );
    a.store().publish(&sid("s"), "custom.kind", &json!({}), 2)?;
    a.commit()?;
    assert_eq!(b.acquire(&sid("s"))?, Ownership::Owned { epoch: 2 });
    let row = b.query_one(
        "SELECT node, epoch FROM event WHERE aggregate_id = 's' AND seq = 1",
        &[],
    )?;
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i64>(1)),
        ("a".into(), 1)
    );
    Ok(())
}

/// The sweep of node `b` leaves out what live node `a` owns, and two surviving nodes never
/// both count one turn.
#[test]
fn survivors_share_a_dead_nodes_sessions_without_double_counting() -> Result<(), StoreError> {
    let Some(db) = pg_db("takeover") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    let mut c = pg_conn(&db, "c")?;
    for id in ["busy", "owed"] {
        create(&mut a, id)?;
        a.acquire(&sid(id))?;
    }
    a.publish(
        &sid("busy"),
        kind::EXECUTION_STARTED,
        &json!({"boot": "a"}),
        5,
    )?;
    a.admit(&sid("owed"), &mid("p"), &json!("p"), Delivery::Steer, 6)?;
    a.mark_wake(&mid("p"))?;
    assert!(b.list_claimed(Some("b"))?.is_empty(), "a is alive");
    assert!(b.adoptable()?.is_empty());
    assert!(
        a.adoptable()?.is_empty(),
        "its own wake serves its own owed session"
    );
    assert_eq!(b.count_resume(&sid("busy"), "b")?, None);
    assert_eq!(b.count_adoption(&sid("owed"))?, None);
    assert_eq!(a.list_claimed(Some("a2"))?, [sid("busy")], "its own");
    lapse(&mut a, "a")?;
    assert_eq!(b.list_claimed(Some("b"))?, [sid("busy")]);
    assert_eq!(c.adoptable()?, [sid("owed")]);
    assert_eq!(b.count_resume(&sid("busy"), "b")?, Some(1));
    assert_eq!(c.count_resume(&sid("busy"), "c")?, None, "b owns it now");
    assert_eq!(c.count_adoption(&sid("owed"))?, Some(1));
    assert_eq!(b.count_adoption(&sid("owed"))?, None);
    let owners = a.query(
        "SELECT id, owner_node, owner_epoch FROM session ORDER BY id",
        &[],
    )?;
    let owners: Vec<(String, String, i64)> = owners
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        owners,
        [
            ("busy".into(), "b".into(), 2),
            ("owed".into(), "c".into(), 2)
        ]
    );
    assert!(c.list_claimed(Some("c"))?.is_empty());
    // A row another transaction holds is skipped, not waited for.
    let mut d = PgWriter::new(pg_conn(&db, "d")?, config(&db, "d"));
    lapse(&mut a, "b")?;
    d.begin()?;
    d.store().check_fence(&sid("busy"), 0).ok();
    assert_eq!(c.count_resume(&sid("busy"), "c")?, None);
    d.rollback();
    assert_eq!(c.count_resume(&sid("busy"), "c")?, Some(2));
    Ok(())
}

/// A sweep releases only the child claims no live turn holds: neither its own boot's nor those
/// of a live node that owns the child (every node sweeps every quarter lease); a dead node's are
/// released.
#[test]
fn release_child_claims_spares_live_nodes_turns() -> Result<(), StoreError> {
    let Some(db) = pg_db("children") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    create(&mut a, "parent")?;
    a.create_session(&info("child", Some("parent"), 1))?;
    a.acquire(&sid("child"))?;
    a.publish(
        &sid("child"),
        kind::EXECUTION_STARTED,
        &json!({"boot": "a"}),
        5,
    )?;
    assert_eq!(a.release_child_claims("a")?, 0, "its own running turn");
    assert_eq!(b.release_child_claims("b")?, 0, "a is alive");
    lapse(&mut a, "a")?;
    assert_eq!(b.release_child_claims("b")?, 1, "a is dead");
    assert!(a
        .claim_state(&sid("child"))?
        .is_some_and(|c| c.time_suspended.is_none()));
    Ok(())
}

/// Step records are turn writes: once another node took the session over, the old owner's
/// step outcome is fenced and nothing of it is stored.
#[test]
fn a_fenced_node_cannot_record_a_step() -> Result<(), StoreError> {
    let Some(db) = pg_db("fenced_step") else {
        return Ok(());
    };
    let mut a = pg_conn(&db, "a")?;
    let mut b = pg_conn(&db, "b")?;
    create(&mut a, "s")?;
    let s = sid("s");
    assert_eq!(a.acquire(&s)?, Ownership::Owned { epoch: 1 });
    let turn = a.claim_turn(&s, 1, "a-boot", 2)?.seq;
    let step = |turn: u64, done: bool| {
        if done {
            SessionEvent::StepCompleted {
                turn,
                step: "pay".into(),
                attempt: 1,
                result: json!("paid"),
            }
        } else {
            SessionEvent::StepStarted {
                turn,
                step: "pay".into(),
                attempt: 1,
                key: format!("s:{turn}:pay"),
            }
        }
    };
    a.record_step(&s, &step(turn, false), 1, 3)?;
    // `a` dies mid-step; `b` takes its turn over (its attempt counted, the session its own).
    lapse(&mut b, "a")?;
    assert_eq!(b.count_resume(&s, "b")?, Some(1));
    assert_eq!(b.acquire(&s)?, Ownership::Owned { epoch: 2 });
    let late = a.record_step(&s, &step(turn, true), 1, 4);
    assert!(
        matches!(late, Err(StoreError::Fenced { epoch: 1, .. })),
        "{late:?}"
    );
    let kinds: Vec<String> = b
        .events_after(&s, None, 100)?
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [kind::CREATED, kind::EXECUTION_STARTED, kind::STEP_STARTED]
    );
    Ok(())
}
