//! Tests of nodes' leases: a lapsed lease, rejoining under a new id, leaving, forgetting dead
//! nodes, an unreachable database and a stalled zombie, with whole backends (`open`) on
//! the shared cluster (see `tests`).

use std::time::{Duration, Instant};

use serde_json::json;

use super::tests::{config, pg_conn, pg_db};
use super::tests_nodes::{commit, node, short, wait_for};
use super::PgConfig;
use crate::error::StoreError;
use crate::journal::backend::{Nudge, Ownership, Signal, WriterConnection};
use crate::journal::backend::{OwnershipRows, Store};
use crate::journal::sqlite::test_support::{info, sid};

/// Whether `signal` is a lost lease.
fn is_lost(signal: &Signal) -> bool {
    matches!(signal, Signal::LeaseLost { .. })
}

#[test]
fn a_lapsed_lease_is_reported_once() -> Result<(), StoreError> {
    let Some(db) = pg_db("lease_lost") else {
        return Ok(());
    };
    let (a, mut rx) = node(&short(&db, "a", 600))?;
    // Renewals keep it alive past several leases.
    std::thread::sleep(Duration::from_millis(1_500));
    let mut admin = pg_conn(&db, "admin")?;
    let live = admin.query_one(
        "SELECT lease_until > now() FROM node WHERE node_id = 'a'",
        &[],
    )?;
    assert!(live.get::<_, bool>(0), "renewed");
    // The first rescan (on connecting) and one per lease since (the safety net), nothing else.
    let mut seen = Vec::new();
    while let Ok(signal) = rx.try_recv() {
        seen.push(signal);
    }
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.iter().all(|s| *s == Signal::Rescan), "{seen:?}");
    admin.execute(
        "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = 'a'",
        &[],
    )?;
    let lost = wait_for(&mut rx, Duration::from_secs(3), is_lost);
    assert_eq!(lost, Some(Signal::LeaseLost { generation: 1 }));
    // It rejoined (see below): no second loss while the new lease is renewed.
    assert_eq!(
        wait_for(&mut rx, Duration::from_millis(1_500), is_lost),
        None
    );
    drop(a);
    Ok(())
}

/// After losing its lease, a node registers a new id with a fresh lease, ends the old id's
/// lease for good, asks for a rescan, and works under the new id: its connections take sessions
/// and write events as the new node, and its listener hears the new id's nudges.
#[test]
fn a_node_that_lost_its_lease_rejoins_under_a_new_id() -> Result<(), StoreError> {
    let Some(db) = pg_db("rejoin") else {
        return Ok(());
    };
    let (mut a, mut rx) = node(&short(&db, "a", 600))?;
    let (mut b, _b_rx) = node(&config(&db, "b"))?;
    let any = Duration::from_secs(5);
    assert!(wait_for(&mut rx, any, |s| *s == Signal::Rescan).is_some());
    commit(&mut a, |s| {
        s.create_session(&info("s", None, 1))?;
        s.create_session(&info("t", None, 1))?;
        s.acquire(&sid("s"))
    })?;
    let mut admin = pg_conn(&db, "admin")?;
    admin.execute(
        "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = 'a'",
        &[],
    )?;
    assert_eq!(
        wait_for(&mut rx, any, is_lost),
        Some(Signal::LeaseLost { generation: 1 })
    );
    // The listener asks for a rescan once it follows the new id.
    assert_eq!(
        wait_for(&mut rx, any, |s| *s == Signal::Rescan
            && &*a.node.id() != "a"),
        Some(Signal::Rescan)
    );
    let new = a.node.id();
    assert_ne!(&*new, "a");
    let rows = admin.query(
        "SELECT node_id, lease_until > now() FROM node WHERE name = 'a' ORDER BY started_at",
        &[],
    )?;
    let rows: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, vec![("a".into(), false), (new.to_string(), true)]);
    // The session the old id owned is anyone's now: the new id (generation 2) takes it, at a
    // new epoch.
    assert_eq!(
        commit(&mut a, |s| s.acquire_under(&sid("s")))?,
        (Ownership::Owned { epoch: 2 }, 2)
    );
    let owner: String = admin
        .query_one("SELECT owner_node FROM session WHERE id = 's'", &[])?
        .get(0);
    assert_eq!(owner, *new);
    // Another node routes a nudge to the new id's channel, and the listener hears it.
    commit(&mut b, |s| {
        assert_eq!(
            s.acquire(&sid("s"))?,
            Ownership::Elsewhere {
                node: new.to_string()
            }
        );
        Ok(())
    })?;
    // The listener follows the new id a poll after the lease thread set it: a nudge routed
    // before that is missed (a rescan serves it), so route until one is heard.
    let deadline = Instant::now() + any;
    let mut heard = None;
    for seq in 7.. {
        commit(&mut b, |s| s.route(&sid("s"), Nudge::Wake(seq)))?;
        heard = wait_for(&mut rx, Duration::from_millis(250), |s| {
            matches!(s, Signal::Nudge { .. })
        });
        if heard.is_some() || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        matches!(
            &heard,
            Some(Signal::Nudge { session, nudge: Nudge::Wake(_) }) if *session == sid("s")
        ),
        "{heard:?}"
    );
    Ok(())
}

#[test]
fn a_leaving_node_hands_its_sessions_over_at_once() -> Result<(), StoreError> {
    let Some(db) = pg_db("leave") else {
        return Ok(());
    };
    let (mut a, mut a_rx) = node(&config(&db, "a"))?;
    let (mut b, mut b_rx) = node(&config(&db, "b"))?;
    let any = Duration::from_secs(5);
    assert!(wait_for(&mut b_rx, any, |s| *s == Signal::Rescan).is_some());
    commit(&mut a, |s| {
        s.create_session(&info("s", None, 1))?;
        s.acquire(&sid("s"))
    })?;
    assert_eq!(
        commit(&mut b, |s| s.acquire(&sid("s")))?,
        Ownership::Elsewhere { node: "a".into() }
    );
    a.node.leave()?;
    assert_eq!(
        wait_for(&mut b_rx, any, |s| *s == Signal::Rescan),
        Some(Signal::Rescan)
    );
    assert_eq!(
        commit(&mut b, |s| s.acquire(&sid("s")))?,
        Ownership::Owned { epoch: 2 }
    );
    // The node that left hears of no lost lease.
    assert_eq!(
        wait_for(&mut a_rx, Duration::from_millis(500), is_lost),
        None
    );
    Ok(())
}

#[test]
fn dead_nodes_are_forgotten_once_nothing_refers_to_them() -> Result<(), StoreError> {
    let Some(db) = pg_db("forget") else {
        return Ok(());
    };
    let mut admin = pg_conn(&db, "admin")?;
    admin.create_session(&info("s", None, 1))?;
    for (id, owns) in [("dead_owner", true), ("dead_idle", false)] {
        admin.execute(
            "INSERT INTO node (node_id, name, lease_until) \
             VALUES ($1, $1, now() - interval '1 hour')",
            &[&id],
        )?;
        if owns {
            admin.execute("UPDATE session SET owner_node = $1", &[&id])?;
        }
    }
    // A node renewing every 100 ms cleans up at its tenth renewal.
    let (_a, _rx) = node(&short(&db, "a", 300))?;
    std::thread::sleep(Duration::from_millis(1_600));
    let rows = admin.query("SELECT node_id FROM node ORDER BY node_id", &[])?;
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, ["a", "admin", "dead_owner"]);
    Ok(())
}

/// A node that cannot reach the database for a whole lease reports its lease lost.
#[test]
fn an_unreachable_database_loses_the_lease() -> Result<(), StoreError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(StoreError::WriterThread)?
        .port();
    let cfg = PgConfig {
        lease: Duration::from_millis(600),
        ..PgConfig::new(format!("postgres://postgres@127.0.0.1:{port}/none"), "lost")
    };
    let node = super::Node::start(&cfg, super::NodeId::new(&cfg.node_id))?;
    let mut rx = node.take_signals().ok_or(StoreError::Closed)?;
    let lost = wait_for(&mut rx, Duration::from_secs(5), is_lost);
    assert_eq!(lost, Some(Signal::LeaseLost { generation: 1 }));
    Ok(())
}

/// A zombie: node `a` owns a session, stalls past its lease (here: in the middle of a fenced
/// transaction, holding the session's row), `b` takes the session over; every late write of
/// `a` fails, and along the session's log the epoch never decreases.
#[test]
fn a_stalled_zombie_is_fenced_and_its_row_lock_released() -> Result<(), StoreError> {
    let Some(db) = pg_db("zombie") else {
        return Ok(());
    };
    let a_cfg = short(&db, "a", 600);
    let mut a = {
        let mut client = super::conn::connect(&a_cfg)?;
        super::schema::migrate(&mut client)?;
        super::node::register(&mut client, &a_cfg, &a_cfg.node_id)?;
        super::PgWriter::new(super::PgConn::new(client, super::NodeId::new("a")), a_cfg)
    };
    let mut b = pg_conn(&db, "b")?;
    a.store().create_session(&info("s", None, 1))?;
    assert_eq!(a.store().acquire(&sid("s"))?, Ownership::Owned { epoch: 1 });
    a.begin()?;
    a.store().check_fence(&sid("s"), 1)?;
    a.store().publish(&sid("s"), "turn.step", &json!(1), 2)?;
    a.commit()?;
    // `a` stalls inside a fenced transaction; its lease lapses.
    a.begin()?;
    a.store().check_fence(&sid("s"), 1)?;
    b.execute(
        "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = 'a'",
        &[],
    )?;
    // The server ends `a`'s idle transaction after half its lease: `b` gets the session.
    let started = Instant::now();
    assert_eq!(b.acquire(&sid("s"))?, Ownership::Owned { epoch: 2 });
    assert!(started.elapsed() < Duration::from_secs(5));
    b.publish(&sid("s"), "turn.step", &json!(2), 3)?;
    // Every late write of `a` fails: the stalled transaction, and a new fenced one.
    let late = a.store().publish(&sid("s"), "turn.step", &json!("late"), 4);
    assert!(late.is_err() || a.commit().is_err());
    a.rollback();
    a.begin()?;
    let fenced = a.store().check_fence(&sid("s"), 1);
    assert!(
        matches!(fenced, Err(StoreError::Fenced { epoch: 1, .. })),
        "{fenced:?}"
    );
    a.rollback();
    let rows = b.query(
        "SELECT epoch, node, data FROM event WHERE aggregate_id = 's' ORDER BY seq",
        &[],
    )?;
    let log: Vec<(i64, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        log.iter().skip(1).cloned().collect::<Vec<_>>(),
        [(1, "a".into(), "1".into()), (2, "b".into(), "2".into())]
    );
    assert!(log.windows(2).all(|w| w[0].0 <= w[1].0), "{log:?}");
    Ok(())
}
