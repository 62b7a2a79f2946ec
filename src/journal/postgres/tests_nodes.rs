//! Tests of nodes: opening, the listener's signals and routing (leases: `tests_leases`), with
//! whole backends from [`open`] on the shared cluster (see `tests`).

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::node::decode;
use super::tests::{config, pg_conn, pg_db, PgDb};
use super::{open, PgBackend, PgConfig};
use crate::error::StoreError;
use crate::journal::backend::{Nudge, Ownership, Route, Signal, Store};
use crate::journal::sqlite::test_support::{info, sid};

/// A node's configuration with a short lease.
pub(super) fn short(db: &PgDb, node: &str, lease_ms: u64) -> PgConfig {
    PgConfig {
        lease: Duration::from_millis(lease_ms),
        ..config(db, node)
    }
}

/// The first signal `pick` accepts within `within`, skipping others.
pub(super) fn wait_for(
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
pub(super) fn node(cfg: &PgConfig) -> Result<(PgBackend, UnboundedReceiver<Signal>), StoreError> {
    let backend = open(cfg)?;
    let rx = backend.node.take_signals().ok_or(StoreError::Closed)?;
    assert!(
        backend.node.take_signals().is_none(),
        "signals are taken once"
    );
    Ok((backend, rx))
}

/// Commits `work` on the backend's writer in one transaction with a savepoint.
pub(super) fn commit<T>(
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
