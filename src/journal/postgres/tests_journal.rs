//! The journal over the PostgreSQL backend, through the real writer thread (group commit, a
//! savepoint per request) and readers, with two nodes: admissions on one node route their
//! wakes to the owner, the owner's turn writes are fenced, and seqs stay gap-free; a lone turn
//! write commits in one statement that other nodes hear.

use std::time::Duration;

use futures::future::join_all;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::tests::{config, pg_db};
use super::{open, Node, PgConfig};
use crate::error::StoreError;
use crate::event::kind;
use crate::journal::backend::{Nudge, Ownership, Route, Signal};
use crate::journal::persistence::Persistence;
use crate::journal::sqlite::test_support::{info, mid, sid};
use crate::journal::{Admitted, Journal};
use crate::outcome::Terminal;
use crate::records::Delivery;

/// A journal over node `node` of the database at `url`, its node and the node's signals.
pub(super) fn journal(
    db: &super::tests::PgDb,
    node: &str,
) -> (Journal, Node, UnboundedReceiver<Signal>) {
    journal_with(&config(db, node))
}

/// A journal over the node `cfg` describes, its node and the node's signals.
pub(super) fn journal_with(cfg: &PgConfig) -> (Journal, Node, UnboundedReceiver<Signal>) {
    let backend = open(cfg).expect("open the postgres backend");
    let signals = backend.node.take_signals().expect("signals");
    let persistence =
        Persistence::start(backend.readers, backend.writer, true, 1024).expect("start");
    let journal = Journal::new(persistence, true);
    (journal, backend.node, signals)
}

/// The next signal matching `pick` within 5 s.
async fn next(
    rx: &mut UnboundedReceiver<Signal>,
    mut pick: impl FnMut(&Signal) -> bool,
) -> Option<Signal> {
    tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(signal) = rx.recv().await {
            if pick(&signal) {
                return Some(signal);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

#[actix_rt::test]
async fn the_journal_runs_on_postgres_across_two_nodes() -> Result<(), StoreError> {
    let Some(db) = pg_db("journal") else {
        return Ok(());
    };
    let (a, _a_node, mut a_rx) = journal(&db, "a");
    let (b, _b_node, mut b_rx) = journal(&db, "b");
    assert!(next(&mut a_rx, |s| *s == Signal::Rescan).await.is_some());
    assert!(next(&mut b_rx, |s| *s == Signal::Rescan).await.is_some());
    let s = sid("s");
    a.create_session(info("s", None, 1)).await?;
    assert_eq!(
        a.load_session(s.clone()).await?.ownership,
        Ownership::Owned { epoch: 1 }
    );

    // 60 admissions on b at once: group-committed, each routed to the owner, a.
    let admissions = (0..60).map(|i| {
        let b = b.clone();
        let s = s.clone();
        async move {
            let prompt = json!({ "text": format!("p{i}") });
            b.admit_prompt(s, mid(&format!("p{i}")), prompt, Delivery::Steer, true)
                .await
        }
    });
    let results = join_all(admissions).await;
    for result in results {
        let (admitted, route) = result?;
        assert!(matches!(admitted, Admitted::New(_)), "{admitted:?}");
        assert_eq!(route, Route::Remote { node: "a".into() });
    }
    let stats = b.stats();
    assert!(stats.transactions < stats.requests, "{stats:?}");
    let nudge = next(&mut a_rx, |s| matches!(s, Signal::Nudge { .. })).await;
    assert!(
        matches!(nudge, Some(Signal::Nudge { ref session, nudge: Nudge::Wake(_) }) if *session == s),
        "{nudge:?}"
    );
    // A conflicting retry (same id, other prompt) is a conflict and writes nothing.
    let (conflict, _) = b
        .admit_prompt(s.clone(), mid("p0"), json!("other"), Delivery::Steer, true)
        .await?;
    assert!(matches!(conflict, Admitted::Conflict(_)), "{conflict:?}");

    // The owner's turn writes pass its fence; the other node's are fenced.
    a.claim_turn(s.clone(), "boot-a".into(), 1).await?;
    let fenced = b.claim_turn(s.clone(), "boot-b".into(), 1).await;
    assert!(
        matches!(fenced, Err(StoreError::Fenced { .. })),
        "{fenced:?}"
    );
    let promoted = a.promote_steer(s.clone(), None, 1).await?;
    assert_eq!(promoted.len(), 60);
    // b hears a's commits, up to the last promotion (seq 121).
    let heard = next(
        &mut b_rx,
        |sig| matches!(sig, Signal::Events(e) if e.iter().any(|(x, _, to)| *x == s && *to == 121)),
    )
    .await;
    assert!(heard.is_some());

    let log = b.events_after(s.clone(), None, 1_000).await?;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..log.len() as u64).collect::<Vec<_>>());
    assert_eq!(log.len(), 1 + 60 + 1 + 60);
    Ok(())
}

/// A turn write alone in the writer's queue commits in one autocommitted statement carrying
/// its `ds_events` notification (`WriterConnection::commit_turn`): other nodes hear it, a
/// fenced one writes nothing and fails alone, and a terminal that finds a queued prompt
/// pending is settled in a transaction as usual (the prompt is owed the next turn).
#[actix_rt::test]
async fn a_lone_turn_write_is_heard_a_fenced_one_fails_alone_and_a_pending_one_settles(
) -> Result<(), StoreError> {
    let Some(db) = pg_db("journal_lone_turn") else {
        return Ok(());
    };
    let (a, _a_node, _a_rx) = journal(&db, "a");
    let (_b, _b_node, mut b_rx) = journal(&db, "b");
    let s = sid("s");
    a.create_session(info("s", None, 1)).await?;
    a.load_session(s.clone()).await?;
    // The turn will run a queued prompt.
    a.admit_prompt(s.clone(), mid("q1"), json!("one"), Delivery::Queue, false)
        .await?;
    let before = a.stats();
    assert_eq!(a.claim_turn(s.clone(), "boot".into(), 1).await?, 2);
    let signal = next(&mut b_rx, |sig| {
        matches!(sig, Signal::Events(e) if e.iter().any(|(x, from, to)| *x == s && *from == 2 && *to == 2))
    })
    .await;
    assert!(signal.is_some(), "b hears the claim");
    // A stale epoch: fenced, nothing written, the request counted as failed.
    let fenced = a.claim_turn(s.clone(), "boot".into(), 2).await;
    assert!(
        matches!(fenced, Err(StoreError::Fenced { epoch: 2, .. })),
        "{fenced:?}"
    );
    let after = a.stats();
    assert_eq!(after.transactions - before.transactions, 2, "{after:?}");
    assert_eq!(
        after.failed_requests - before.failed_requests,
        1,
        "{after:?}"
    );

    // Another queued prompt admitted during the turn: the terminal owes it the next turn.
    assert!(a.promote_queue(s.clone(), 1).await?.is_some());
    let (admitted, _) = a
        .admit_prompt(s.clone(), mid("q2"), json!("two"), Delivery::Queue, false)
        .await?;
    let Admitted::New(admission) = admitted else {
        panic!("{admitted:?}");
    };
    let next_turn = a.settle_turn(s.clone(), Terminal::Succeeded, 1).await?;
    assert_eq!(next_turn, Some(admission.admitted_seq));
    let log = a.events_after(s.clone(), None, 10).await?;
    let kinds: Vec<&str> = log.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            kind::CREATED,
            kind::PROMPT_ADMITTED,
            kind::EXECUTION_STARTED,
            kind::PROMPT_PROMOTED,
            kind::PROMPT_ADMITTED,
            kind::EXECUTION_SUCCEEDED
        ]
    );
    Ok(())
}
