//! The turn half of the parity test ([`super::tests`]): a turn's claim and settlement, the
//! restart sweep's reads and counts, run on SQLite and on PostgreSQL with the same calls.

use serde_json::json;

use super::tests::outcome;
use crate::event::{kind, SessionEvent};
use crate::id::SessionId;
use crate::journal::backend::{Ownership, Store};
use crate::journal::sqlite::test_support::{mid, sid};
use crate::outcome::InterruptReason;
use crate::records::Delivery;

/// The epoch this connection's node holds `session` at (taking it): 0 on SQLite, whose process
/// owns every session; a fresh epoch on PostgreSQL.
fn epoch_of(store: &mut dyn Store, session: &SessionId) -> u64 {
    match store.acquire(session) {
        Ok(Ownership::Owned { epoch }) => epoch,
        other => panic!("acquire {session}: {other:?}"),
    }
}

/// A turn's two writes (`claim_turn`, `settle_turn`: one schema function call each on
/// PostgreSQL, the statements one by one on SQLite) on sessions `u` and `v` of [`scenario`]:
/// a second claim, every kind of terminal, a settlement with pending inputs (the function's
/// slow path), the sweep's unfenced claim and its reads and counts (one statement each on
/// PostgreSQL); the outcome of each, and the rows they leave.
pub(super) fn turn_scenario(store: &mut dyn Store) -> Vec<String> {
    let (u, v) = (sid("u"), sid("v"));
    let mut out = Vec::new();
    let mut log = |label: &str, line: String| out.push(format!("{label}: {line}"));
    let succeeded = SessionEvent::ExecutionSucceeded {};
    let interrupted = |reason| SessionEvent::ExecutionInterrupted { reason };
    let e = epoch_of(store, &u);
    log("claim u", outcome(store.claim_turn(&u, e, "b7", 90)));
    log("claim u state", outcome(store.claim_state(&u)));
    log("claim u again", outcome(store.claim_turn(&u, e, "b8", 91)));
    log("claim u again state", outcome(store.claim_state(&u)));
    log("claim u seq", outcome(store.claim_seq(&u)));
    log(
        "settle u",
        outcome(store.settle_turn(&u, e, &succeeded, 92)),
    );
    log("settle u state", outcome(store.claim_state(&u)));
    log(
        "admit u",
        outcome(store.admit(&u, &mid("ui1"), &json!("x"), Delivery::Steer, 93)),
    );
    log("claim u 2", outcome(store.claim_turn(&u, e, "b7", 94)));
    log("promote u", outcome(store.promote_steer(&u, None, 95)));
    let user = interrupted(InterruptReason::User);
    log("interrupt u", outcome(store.settle_turn(&u, e, &user, 96)));
    log("interrupt u context", outcome(store.context(&u)));
    log("claim u 3", outcome(store.claim_turn(&u, e, "b7", 97)));
    let shutdown = interrupted(InterruptReason::Shutdown);
    log(
        "shutdown u",
        outcome(store.settle_turn(&u, e, &shutdown, 98)),
    );
    log("shutdown u state", outcome(store.claim_state(&u)));
    // The restart sweep's claim: a plain append of `session.execution.started`.
    let resumed = SessionEvent::ExecutionStarted {
        boot: "b9".into(),
        turn: None,
    };
    log("sweep claim u", outcome(store.append(&u, &resumed, 99)));
    log("sweep claim u state", outcome(store.claim_state(&u)));
    log("sweep claim u seq", outcome(store.claim_seq(&u)));
    log("claimed turn u", outcome(store.claimed_turn(&u, "b9")));
    log(
        "interrupt request u",
        outcome(store.publish(
            &u,
            kind::INTERRUPT_REQUESTED,
            &json!({"sessionID": "u"}),
            99,
        )),
    );
    log(
        "claimed turn u fenced",
        outcome(store.claimed_turn(&u, "b9")),
    );
    let ids = [u.clone(), v.clone(), sid("ghost"), u.clone()];
    log("count resumes", outcome(store.count_resumes(&ids, "b10")));
    log(
        "count resumes again",
        outcome(store.count_resumes(&ids, "b10")),
    );
    log("count resumes state", outcome(store.claim_state(&u)));

    let e = epoch_of(store, &v);
    for (id, delivery, time) in [("vs1", Delivery::Steer, 100), ("vq1", Delivery::Queue, 101)] {
        log(
            "admit v",
            outcome(store.admit(&v, &mid(id), &json!(id), delivery, time)),
        );
    }
    log("claim v", outcome(store.claim_turn(&v, e, "b7", 102)));
    log("promote v", outcome(store.promote_steer(&v, None, 103)));
    log(
        "settle v",
        outcome(store.settle_turn(&v, e, &succeeded, 104)),
    );
    log("settle v state", outcome(store.claim_state(&v)));
    log("settle v owes", outcome(store.owes_turn(&v)));
    log("claim v 2", outcome(store.claim_turn(&v, e, "b7", 105)));
    let aborted = SessionEvent::aborted();
    log("abort v", outcome(store.settle_turn(&v, e, &aborted, 106)));
    log("abort v owes", outcome(store.owes_turn(&v)));
    log("abort v pending", outcome(store.pending_inputs(&v)));
    log("claimed turn v", outcome(store.claimed_turn(&v, "b7")));
    log("events u", outcome(store.events_after(&u, Some(0), 100)));
    log("events v", outcome(store.events_after(&v, Some(0), 100)));
    out
}
