//! Tests of the PostgreSQL store: one shared throwaway cluster (started by the first test that
//! needs it, stopped when the last running one is done), one database per test.
//!
//! The parity test runs one sequence of store calls against SQLite and PostgreSQL and compares
//! every result.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use serde_json::json;

use super::conn::{connect, PgConn};
use super::tests_parity::turn_scenario;
use super::{node, schema, PgConfig};
use crate::error::StoreError;
use crate::event::kind;
use crate::journal::backend::Store;
use crate::journal::sqlite::test_support::{info, mid, sid, test_db};
use crate::records::{
    Anchor, Cursor, Delivery, Direction, ListQuery, MessagesQuery, Order, ParentFilter,
};
use crate::testing::postgres::{start_or_skip, PgCluster};

/// The cluster the running tests share.
fn cluster() -> Option<Arc<PgCluster>> {
    static SHARED: Mutex<Weak<PgCluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(cluster) = shared.upgrade() {
        return Some(cluster);
    }
    let cluster = Arc::new(start_or_skip("journal::postgres")?);
    *shared = Arc::downgrade(&cluster);
    Some(cluster)
}

/// A database of its own for one test, on the shared cluster.
pub(super) struct PgDb {
    /// Its URL.
    pub(super) url: String,
    /// Keeps the cluster running.
    _cluster: Arc<PgCluster>,
}

/// Creates database `name` (`None`: PostgreSQL is not installed, the test is skipped).
pub(super) fn pg_db(name: &str) -> Option<PgDb> {
    let cluster = cluster()?;
    let url = cluster
        .create_database(name)
        .unwrap_or_else(|e| panic!("create database {name}: {e}"));
    Some(PgDb {
        url,
        _cluster: cluster,
    })
}

/// A configuration of node `node` on `db` (a long lease: store tests must not see it lapse).
pub(super) fn config(db: &PgDb, node: &str) -> PgConfig {
    PgConfig {
        lease: Duration::from_secs(60),
        pool_size: 2,
        ..PgConfig::new(db.url.clone(), node)
    }
}

/// A migrated connection of registered node `node` (no threads), in autocommit.
pub(super) fn pg_conn(db: &PgDb, node: &str) -> Result<PgConn, StoreError> {
    let cfg = config(db, node);
    let mut client = connect(&cfg)?;
    schema::migrate(&mut client)?;
    node::register(&mut client, &cfg, &cfg.node_id)?;
    Ok(PgConn::new(client, super::NodeId::new(node)))
}

/// Runs raw SQL on the connection (test setup).
pub(super) fn sql(conn: &mut PgConn, text: &str) -> Result<(), StoreError> {
    conn.client()?.batch_execute(text)?;
    Ok(())
}

/// A result as the parity test compares it: the value, or the kind of error.
pub(super) fn outcome<T: Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Ok(value) => format!("{value:?}"),
        Err(StoreError::Conflict(_)) => "Err(Conflict)".into(),
        Err(StoreError::Json(_)) => "Err(Json)".into(),
        Err(StoreError::Inconsistent(_)) => "Err(Inconsistent)".into(),
        Err(StoreError::Fenced { .. }) => "Err(Fenced)".into(),
        Err(other) => format!("Err(engine: {other})"),
    }
}

/// One long sequence of store calls touching every statement (in autocommit, as the SQLite
/// store's unit tests run); the outcome of each, in order.
fn scenario(store: &mut dyn Store) -> Vec<String> {
    let (s, t, child) = (sid("s"), sid("t"), sid("child"));
    let mut out = Vec::new();
    let mut log = |label: &str, line: String| out.push(format!("{label}: {line}"));
    for (id, parent, time, dir, title) in [
        ("s", None, 10, "/one", "Plain Title"),
        ("t", None, 20, "/one", "100% done"),
        ("child", Some("s"), 20, "/two", "snake_case"),
        ("u", None, 30, "/one", r"back\slash"),
        ("v", None, 40, "/three", "Über naïve"),
    ] {
        let mut i = info(id, parent, time);
        i.directory = dir.into();
        i.title = title.into();
        i.model = Some(json!({"provider": "p", "id": "m", "n": 1.5}));
        log("create", outcome(store.create_session(&i)));
    }
    log(
        "create again",
        outcome(store.create_session(&info("s", None, 99))),
    );
    log("get", outcome(store.get_session(&s)));
    log("get ghost", outcome(store.get_session(&sid("ghost"))));
    log("exists", outcome(store.session_exists(&t)));
    for query in [
        ListQuery::default(),
        ListQuery {
            search: Some("plain".into()),
            ..ListQuery::default()
        },
        ListQuery {
            search: Some("0%".into()),
            ..ListQuery::default()
        },
        ListQuery {
            search: Some(r"k\s".into()),
            parent: ParentFilter::TopLevel,
            ..ListQuery::default()
        },
        ListQuery {
            directory: Some("/one".into()),
            order: Order::Asc,
            limit: Some(2),
            anchor: Some(Anchor {
                id: t.clone(),
                time: 20,
                direction: Direction::Previous,
            }),
            ..ListQuery::default()
        },
        ListQuery {
            parent: ParentFilter::ChildrenOf(s.clone()),
            ..ListQuery::default()
        },
        // SQLite's LIKE folds ASCII case only.
        ListQuery {
            search: Some("über NAÏVE".into()),
            ..ListQuery::default()
        },
        ListQuery {
            search: Some("ber NAÏ".into()),
            ..ListQuery::default()
        },
        ListQuery {
            search: Some("ber naï".into()),
            ..ListQuery::default()
        },
    ] {
        log("list", outcome(store.list_sessions(&query)));
    }
    let prompt = json!({ "parts": [{ "type": "text", "text": "hi ü" }] });
    for (id, delivery) in [
        ("p1", Delivery::Steer),
        ("q1", Delivery::Queue),
        ("p2", Delivery::Steer),
        ("q2", Delivery::Queue),
    ] {
        log(
            "admit",
            outcome(store.admit(&s, &mid(id), &prompt, delivery, 40)),
        );
    }
    log(
        "admit again",
        outcome(store.admit(&t, &mid("p1"), &json!(1), Delivery::Queue, 41)),
    );
    log(
        "admit child",
        outcome(store.admit(&child, &mid("c1"), &json!("c"), Delivery::Steer, 41)),
    );
    log(
        "admit ghost",
        outcome(store.admit(&sid("ghost"), &mid("g1"), &json!("g"), Delivery::Steer, 41)),
    );
    log("wake", outcome(store.mark_wake(&mid("p1"))));
    log("wake child", outcome(store.mark_wake(&mid("c1"))));
    log("owes", outcome(store.owes_turn(&s)));
    log("adoptable", outcome(store.adoptable()));
    log("get input", outcome(store.get_input(&mid("q1"))));
    log("pending", outcome(store.pending_inputs(&s)));
    log(
        "started",
        outcome(store.publish(&s, kind::EXECUTION_STARTED, &json!({"boot": "b1"}), 50)),
    );
    log(
        "started child",
        outcome(store.publish(&child, kind::EXECUTION_STARTED, &json!({"boot": "b1"}), 51)),
    );
    log("claim", outcome(store.claim_state(&s)));
    log("claim seq", outcome(store.claim_seq(&s)));
    log("claim counts", outcome(store.claim_counts(100)));
    log(
        "steer cutoff",
        outcome(store.promote_steer(&s, Some(4), 60)),
    );
    log("queue", outcome(store.promote_queue(&s, 61)));
    log(
        "message",
        outcome(store.append_message(&s, &mid("a1"), "assistant", &json!({"text": "ok"}), 62)),
    );
    log(
        "message dup",
        outcome(store.append_message(&s, &mid("a1"), "assistant", &json!(1), 63)),
    );
    log(
        "message prompt id",
        outcome(store.append_message(&s, &mid("q2"), "assistant", &json!(1), 63)),
    );
    log(
        "admit transcript id",
        outcome(store.admit(&s, &mid("a1"), &json!(1), Delivery::Steer, 63)),
    );
    log(
        "promote twice",
        outcome(store.publish(
            &s,
            kind::PROMPT_PROMOTED,
            &json!({"messageID": "p1", "prompt": "x", "delivery": "steer"}),
            64,
        )),
    );
    log(
        "custom",
        outcome(store.publish(&s, "custom.kind", &json!({"k": [1, "two", null]}), 65)),
    );
    log("served", outcome(store.served_inputs(&s, 5, None)));
    log(
        "interrupt",
        outcome(store.publish(
            &s,
            kind::INTERRUPT_REQUESTED,
            &json!({"sessionID": "s"}),
            66,
        )),
    );
    log("latest interrupt", outcome(store.latest_interrupt_seq(&s)));
    log(
        "served fenced",
        outcome(store.served_inputs(&s, 5, Some(12))),
    );
    log("settle", outcome(store.settle(&s)));
    log("list claimed", outcome(store.list_claimed(None)));
    log("list claimed excl", outcome(store.list_claimed(Some("b1"))));
    log("resume", outcome(store.count_resume(&s, "b2")));
    log("resume again", outcome(store.count_resume(&s, "b2")));
    log("resume next", outcome(store.count_resume(&s, "b3")));
    log("adoption claimed", outcome(store.count_adoption(&s)));
    log("adoption free", outcome(store.count_adoption(&t)));
    log("children", outcome(store.release_child_claims("b9")));
    log(
        "interrupted",
        outcome(store.publish(
            &s,
            kind::EXECUTION_INTERRUPTED,
            &json!({"reason": "user"}),
            70,
        )),
    );
    log("claim after", outcome(store.claim_state(&s)));
    log("clear wakes", outcome(store.clear_wakes(&s)));
    log("owes after", outcome(store.owes_turn(&s)));
    log("context", outcome(store.context(&s)));
    for (cursor, order, limit) in [
        (None, Order::Desc, Some(2)),
        (Some(("a1", Direction::Next)), Order::Asc, None),
        (Some(("a1", Direction::Previous)), Order::Asc, Some(1)),
        (Some(("nope", Direction::Next)), Order::Desc, None),
    ] {
        let query = MessagesQuery {
            session_id: s.clone(),
            limit,
            order,
            cursor: cursor.map(|(id, direction)| Cursor {
                id: mid(id),
                direction,
            }),
        };
        log("messages", outcome(store.messages(&query)));
    }
    log("get message", outcome(store.get_message(&s, &mid("a1"))));
    log(
        "get message other",
        outcome(store.get_message(&t, &mid("a1"))),
    );
    log("owner", outcome(store.transcript_owner(&mid("p1"))));
    log("counts", outcome(store.projection_counts(&s)));
    log("delete", outcome(store.delete_projections(&s)));
    log("counts deleted", outcome(store.projection_counts(&s)));
    let events = store.events_after(&s, None, usize::MAX);
    if let Ok(events) = &events {
        for event in events {
            if [
                kind::PROMPT_ADMITTED,
                kind::PROMPT_PROMOTED,
                kind::MESSAGE_APPENDED,
            ]
            .contains(&event.kind.as_str())
            {
                log("project", outcome(store.project(event)));
            }
        }
    }
    log("events", outcome(events));
    log("events page", outcome(store.events_after(&s, Some(3), 2)));
    log(
        "events child",
        outcome(store.events_after(&child, None, 100)),
    );
    log("context rebuilt", outcome(store.context(&s)));
    log(
        "bad message",
        outcome(store.append_message(&s, &mid("m-bad"), "assistant", &json!("x"), 80)),
    );
    log("claim counts end", outcome(store.claim_counts(100)));
    log("get end", outcome(store.get_session(&s)));
    out
}

/// What the store says of session `s` once message `m-bad` holds an undecodable payload.
fn diagnosis(store: &mut dyn Store) -> Vec<String> {
    vec![
        outcome(store.undecodable_message(&sid("s"))),
        outcome(store.context(&sid("s"))),
        outcome(store.get_message(&sid("s"), &mid("m-bad"))),
    ]
}

/// The same calls give the same results on SQLite and PostgreSQL: rows, seqs, payloads,
/// orderings, conflicts and decoding errors, and a turn's claim and settlement (schema
/// functions on PostgreSQL).
#[test]
fn postgres_store_gives_the_same_results_as_sqlite() -> Result<(), StoreError> {
    let Some(db) = pg_db("parity") else {
        return Ok(());
    };
    let mut lite = test_db()?;
    let mut pg = pg_conn(&db, "node-a")?;
    let mut sqlite = scenario(&mut lite.conn);
    let mut postgres = scenario(&mut pg);
    let turns = turn_scenario(&mut lite.conn);
    // The turn scenario reaches each path of the functions: a settlement owing the queued
    // prompt (pending inputs), transcript marks of a user interrupt, a kept shutdown claim.
    let line = |label: &str| turns.iter().find(|l| l.starts_with(label)).cloned();
    assert!(
        line("settle v:").is_some_and(|l| l.starts_with("settle v: (Some(")),
        "{turns:#?}"
    );
    assert!(line("interrupt u context:").is_some_and(|l| l.contains("interrupted: true")));
    assert!(line("shutdown u state:").is_some_and(|l| l.contains("time_suspended: Some(97)")));
    let counted = "count resumes: [(\"u\", 1)]";
    assert_eq!(
        line("count resumes:").as_deref(),
        Some(counted),
        "{turns:#?}"
    );
    let again = "count resumes again: []";
    assert_eq!(line("count resumes again:").as_deref(), Some(again));
    assert!(line("claimed turn u fenced:").is_some_and(|l| l.contains("fence: Some(")));
    assert!(!turns.iter().any(|l| l.contains("Err(")), "{turns:#?}");
    sqlite.extend(turns);
    postgres.extend(turn_scenario(&mut pg));
    assert_eq!(sqlite.len(), postgres.len());
    for (lite, pg) in sqlite.iter().zip(&postgres) {
        assert_eq!(lite, pg);
    }
    assert!(
        sqlite
            .iter()
            .filter(|l| l.contains("Err(Conflict)"))
            .count()
            >= 4
    );
    // The stored payloads are byte for byte the same.
    let all = "SELECT aggregate_id, seq, type, data, time FROM event ORDER BY aggregate_id, seq";
    let mut stmt = lite.conn.prepare(all)?;
    let lite_rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    drop(stmt);
    let pg_rows = pg
        .query(all, &[])?
        .iter()
        .map(|r| {
            Ok((
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(3)?,
                r.try_get(4)?,
            ))
        })
        .collect::<Result<Vec<(String, i64, String, String, i64)>, StoreError>>()?;
    assert!(lite_rows.len() > 20);
    assert_eq!(lite_rows, pg_rows);
    let corrupt = "UPDATE session_message SET data = '{oops' WHERE id = 'm-bad'";
    lite.conn.execute(corrupt, [])?;
    sql(&mut pg, corrupt)?;
    let lite_diagnosis = diagnosis(&mut lite.conn);
    assert_eq!(lite_diagnosis, diagnosis(&mut pg));
    assert_eq!(lite_diagnosis[1], "Err(Json)");
    Ok(())
}
