//! Tests of nodes: opening, leases, the listener's signals, routing and leaving, with whole
//! backends from [`open`] on the shared cluster (see `tests`).

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::node::decode;
use super::tests::{config, pg_conn, pg_db, PgDb};
use super::{open, PgBackend, PgConfig};
use crate::error::StoreError;
use crate::journal::backend::{Nudge, Ownership, Route, Signal, Store, WriterConnection};
use crate::journal::sqlite::test_support::{info, sid};

/// A node's configuration with a short lease.
fn short(db: &PgDb, node: &str, lease_ms: u64) -> PgConfig {
    PgConfig {
        lease: Duration::from_millis(lease_ms),
        ..config(db, node)
    }
}

/// The first signal `pick` accepts within `within`, skipping others.
fn wait_for(
    rx: &mut UnboundedReceiver<Signal>,
    within: Duration,
    mut pick: impl FnMut(&Signal) -> bool,
) -> Option<Signal> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match rx.try_recv() {
            Ok(signal) if pick(&signal) => return Some(signal),
            Ok(_) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    None
}

/// Opens node `node` and takes its signals.
fn node(cfg: &PgConfig) -> Result<(PgBackend, UnboundedReceiver<Signal>), StoreError> {
    let backend = open(cfg)?;
    let rx = backend.node.take_signals().ok_or(StoreError::Closed)?;
    assert!(
        backend.node.take_signals().is_none(),
        "signals are taken once"
    );
    Ok((backend, rx))
}

/// Commits `work` on the backend's writer in one transaction with a savepoint.
fn commit<T>(
    backend: &mut PgBackend,
    work: impl FnOnce(&mut dyn Store) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let w = &mut backend.writer;
    w.begin()?;
    w.savepoint()?;
    let out = work(w.store());
    match out {
        Ok(out) => {
            w.release()?;
            w.commit()?;
            Ok(out)
        }
        Err(e) => {
            w.rollback();
            Err(e)
        }
    }
}

#[test]
fn a_node_hears_other_nodes_events_and_nudges() -> Result<(), StoreError> {
    let Some(db) = pg_db("notify") else {
        return Ok(());
    };
    let (mut a, mut a_rx) = node(&config(&db, "a"))?;
    let (mut b, mut b_rx) = node(&config(&db, "b"))?;
    assert_eq!(&*a.node.id(), "a");
    let any = Duration::from_secs(5);
    assert!(
        wait_for(&mut b_rx, any, |s| *s == Signal::Rescan).is_some(),
        "on connect"
    );
    assert!(
        wait_for(&mut a_rx, any, |s| *s == Signal::Rescan).is_some(),
        "on connect"
    );
    // Both listeners are subscribed once their first Rescan arrived.
    commit(&mut a, |s| {
        s.create_session(&info("s", None, 1))?;
        s.publish(&sid("s"), "custom.kind", &json!({}), 2)?;
        s.create_session(&info("t", None, 1))
    })?;
    let events = wait_for(&mut b_rx, any, |s| matches!(s, Signal::Events(_)));
    assert_eq!(
        events,
        Some(Signal::Events(vec![(sid("s"), 0, 1), (sid("t"), 0, 0)]))
    );
    // A batch that appended nothing notifies nothing; a node does not hear its own events.
    commit(&mut a, |s| s.session_exists(&sid("s")))?;
    assert_eq!(
        wait_for(&mut a_rx, Duration::from_millis(300), |s| matches!(
            s,
            Signal::Events(_)
        )),
        None
    );

    // Routing: b owns `s`; a nudge admitted on a goes to b, at commit.
    assert_eq!(
        commit(&mut b, |s| s.acquire(&sid("s")))?,
        Ownership::Owned { epoch: 1 }
    );
    assert_eq!(
        commit(&mut b, |s| s.route(&sid("s"), Nudge::Wake(3)))?,
        Route::Local
    );
    assert_eq!(
        commit(&mut a, |s| s.route(&sid("t"), Nudge::Wake(3)))?,
        Route::Local
    );
    let routed = commit(&mut a, |s| s.route(&sid("s"), Nudge::Interrupt(7)))?;
    assert_eq!(routed, Route::Remote { node: "b".into() });
    let nudge = wait_for(&mut b_rx, any, |s| matches!(s, Signal::Nudge { .. }));
    assert_eq!(
        nudge,
        Some(Signal::Nudge {
            session: sid("s"),
            nudge: Nudge::Interrupt(7)
        })
    );
    // A nudge of a transaction that rolls back is never delivered.
    a.writer.begin()?;
    a.writer.store().route(&sid("s"), Nudge::Wake(9))?;
    a.writer.rollback();
    assert_eq!(
        wait_for(&mut b_rx, Duration::from_millis(300), |s| matches!(
            s,
            Signal::Nudge { .. }
        )),
        None
    );
    Ok(())
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
    let lost = wait_for(&mut rx, Duration::from_secs(3), |s| *s == Signal::LeaseLost);
    assert_eq!(lost, Some(Signal::LeaseLost));
    // It rejoined (see below): no second loss while the new lease is renewed.
    assert_eq!(
        wait_for(&mut rx, Duration::from_millis(1_500), |s| *s
            == Signal::LeaseLost),
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
        wait_for(&mut rx, any, |s| *s == Signal::LeaseLost),
        Some(Signal::LeaseLost)
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
    // The session the old id owned is anyone's now: the new id takes it, at a new epoch.
    assert_eq!(
        commit(&mut a, |s| s.acquire(&sid("s")))?,
        Ownership::Owned { epoch: 2 }
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
        wait_for(&mut a_rx, Duration::from_millis(500), |s| *s
            == Signal::LeaseLost),
        None
    );
    Ok(())
}

#[test]
fn opening_checks_the_node_id_and_serves_reads() -> Result<(), StoreError> {
    let Some(db) = pg_db("open") else {
        return Ok(());
    };
    let bad = open(&config(&db, "no spaces"));
    assert!(matches!(bad, Err(StoreError::Inconsistent(_))), "{bad:?}");
    let (mut a, _rx) = node(&config(&db, "0123456789abcdef0123456789abcdef"))?;
    let twice = open(&config(&db, "0123456789abcdef0123456789abcdef"));
    assert!(matches!(twice, Err(StoreError::Conflict(_))), "{twice:?}");
    commit(&mut a, |s| s.create_session(&info("s", None, 1)))?;
    assert_eq!(a.readers.size(), 2);
    let mut found = None;
    a.readers.read(&mut |store| {
        found = store.get_session(&sid("s"))?.map(|i| i.title);
        Ok(())
    })?;
    assert_eq!(found.as_deref(), Some("session s"));
    a.readers.release_memory();
    Ok(())
}

/// Opening, using and dropping a backend on a thread inside a tokio runtime (where the sync
/// client would panic) works: the blocking parts run on threads of their own.
#[actix_rt::test]
async fn a_backend_opens_and_drops_inside_a_runtime() {
    let Some(db) = pg_db("in_runtime") else {
        return;
    };
    let backend = open(&config(&db, "a")).expect("open inside a runtime");
    backend.node.leave().expect("leave inside a runtime");
    drop(backend);
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

/// A deletion committed on one node reaches the others as [`Signal::Deleted`], naming the seq
/// of its `session.deleted` (the one after the session's last event); a rolled-back one does
/// not, and deletes nothing.
#[test]
fn a_node_hears_other_nodes_deletions() -> Result<(), StoreError> {
    let Some(db) = pg_db("deleted") else {
        return Ok(());
    };
    let (mut a, _a_rx) = node(&config(&db, "a"))?;
    let (_b, mut b_rx) = node(&config(&db, "b"))?;
    let any = Duration::from_secs(5);
    assert!(wait_for(&mut b_rx, any, |s| *s == Signal::Rescan).is_some());
    commit(&mut a, |s| {
        s.create_session(&info("s", None, 1))?;
        s.create_session(&info("kept", None, 1))?;
        s.publish(&sid("s"), "custom.kind", &json!({}), 2)
    })?;
    a.writer.begin()?;
    a.writer.store().delete_session(&sid("kept"))?;
    a.writer.rollback();
    commit(&mut a, |s| s.delete_session(&sid("s")))?;
    let deleted = wait_for(&mut b_rx, any, |s| matches!(s, Signal::Deleted(_)));
    assert_eq!(deleted, Some(Signal::Deleted(vec![(sid("s"), 2)])));
    assert_eq!(
        wait_for(&mut b_rx, Duration::from_millis(300), |s| matches!(
            s,
            Signal::Deleted(_)
        )),
        None,
        "the rolled-back deletion was never announced"
    );
    let left = commit(&mut a, |s| {
        Ok((s.log_start(&sid("s"))?, s.log_start(&sid("kept"))?))
    })?;
    assert_eq!(left, (None, Some(0)));
    Ok(())
}

#[test]
fn notifications_decode_into_signals() {
    assert_eq!(
        decode(
            "me",
            "ds_node_me",
            r#"{"session":"s","nudge":"wake","seq":4}"#
        ),
        Some(Signal::Nudge {
            session: sid("s"),
            nudge: Nudge::Wake(4)
        })
    );
    assert_eq!(
        decode("me", "ds_node_me", r#"{"session":"s","nudge":"x","seq":4}"#),
        None
    );
    assert_eq!(
        decode("me", "ds_events", r#"{"node":"me","sessions":[["s",1,2]]}"#),
        None
    );
    assert_eq!(
        decode("me", "ds_events", r#"{"node":"b","sessions":[["s",1,2]]}"#),
        Some(Signal::Events(vec![(sid("s"), 1, 2)]))
    );
    assert_eq!(
        decode("me", "ds_events", r#"{"node":"b","many":true}"#),
        Some(Signal::ManyEvents)
    );
    assert_eq!(
        decode("me", "ds_events", r#"{"node":"b","deleted":[["s",7]]}"#),
        Some(Signal::Deleted(vec![(sid("s"), 7)]))
    );
    assert_eq!(
        decode("me", "ds_events", r#"{"node":"me","deleted":[["s",7]]}"#),
        None
    );
    assert_eq!(
        decode("me", "ds_nodes", r#"{"node":"b","left":true}"#),
        Some(Signal::Rescan)
    );
    assert_eq!(
        decode("me", "ds_nodes", r#"{"node":"me","left":true}"#),
        None
    );
    assert_eq!(decode("me", "ds_events", "not json"), None);
    assert_eq!(decode("me", "elsewhere", "{}"), None);
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
    let lost = wait_for(&mut rx, Duration::from_secs(5), |s| *s == Signal::LeaseLost);
    assert_eq!(lost, Some(Signal::LeaseLost));
    Ok(())
}

/// The listener reconnects after losing its connection, asks for a rescan (it may have missed
/// notifications), and hears events again; the writer reconnects at its next batch.
#[test]
fn the_listener_reconnects_and_asks_for_a_rescan() -> Result<(), StoreError> {
    let Some(db) = pg_db("relisten") else {
        return Ok(());
    };
    let (mut a, _a_rx) = node(&config(&db, "a"))?;
    let (mut b, mut b_rx) = node(&config(&db, "b"))?;
    let any = Duration::from_secs(5);
    assert!(wait_for(&mut b_rx, any, |s| *s == Signal::Rescan).is_some());
    let mut admin = pg_conn(&db, "admin")?;
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'durable-sessions b' AND datname = current_database()",
        &[],
    )?;
    assert_eq!(
        wait_for(&mut b_rx, any, |s| *s == Signal::Rescan),
        Some(Signal::Rescan)
    );
    commit(&mut a, |s| {
        s.publish(&sid("s"), "custom.kind", &json!({}), 1)
    })?;
    assert_eq!(
        wait_for(&mut b_rx, any, |s| matches!(s, Signal::Events(_))),
        Some(Signal::Events(vec![(sid("s"), 0, 0)]))
    );
    // b's writer lost its connection too: the first batch may fail, the next one works.
    if commit(&mut b, |s| {
        s.publish(&sid("s"), "custom.kind", &json!({}), 2)
    })
    .is_err()
    {
        commit(&mut b, |s| {
            s.publish(&sid("s"), "custom.kind", &json!({}), 2)
        })?;
    }
    // b's readers' pool replaces its broken connections.
    let mut seqs = Vec::new();
    for _ in 0..3 {
        let read = b.readers.read(&mut |store| {
            seqs = store
                .events_after(&sid("s"), None, 10)?
                .iter()
                .map(|e| e.seq)
                .collect();
            Ok(())
        });
        if read.is_ok() {
            break;
        }
    }
    assert_eq!(seqs, [0, 1]);
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
