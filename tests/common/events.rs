//! Waiting on what the runtime commits: event-driven, never on a timer.
//!
//! [`Runtime::subscribe`](durable_sessions::Runtime::subscribe) streams every event the runtime
//! commits, after its COMMIT. Subscribe *before* the action that commits what a test waits for:
//! a subscriber sees only what commits after it subscribed.

use std::sync::Arc;

use durable_sessions::{EventRecord, EventStream, RecvError};
use tokio::time::Instant;

use super::WAIT;

/// Waits for the next event of `events` that `pred` accepts, and returns it.
///
/// # Panics
/// After [`WAIT`], naming `what`; when the runtime stops; when the subscriber lagged behind
/// the bus (the awaited event may be one of those it missed).
pub async fn wait_for_event(
    events: &mut EventStream,
    what: &str,
    pred: impl Fn(&EventRecord) -> bool,
) -> Arc<EventRecord> {
    let deadline = Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) if pred(&event) => return event,
            Ok(Ok(_)) => {}
            Ok(Err(RecvError::Lagged { missed })) => {
                panic!("waiting for {what}: the subscriber lagged and missed {missed} events")
            }
            Ok(Err(RecvError::Closed)) => panic!("waiting for {what}: the runtime stopped"),
            Err(_) => panic!("timed out waiting for {what}"),
        }
    }
}

/// Waits until `check` holds, checking it now and again each time the runtime commits an event
/// `relevant` accepts (never on a timer).
///
/// For a condition on the store — or on state the runtime changes before it commits the event
/// that follows — with `events` subscribed before this first check, so a commit between a check
/// and the wait is not missed. `relevant` names the events that can make `check` true (`|_|
/// true` for any); a subscriber that lagged behind the bus checks again anyway.
///
/// # Panics
/// After [`WAIT`], naming `what`; when the runtime stops.
pub async fn wait_until_committed(
    events: &mut EventStream,
    what: &str,
    relevant: impl Fn(&EventRecord) -> bool,
    mut check: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(
            next_commit(events, deadline, &relevant).await,
            "timed out waiting for {what}"
        );
    }
}

/// Waits until the runtime commits an event `relevant` accepts — or tells this lagging
/// subscriber it missed some — until `deadline`; false when the deadline passed first. The step
/// of an event-driven wait whose check is async (see [`wait_until_committed`]).
///
/// # Panics
/// When the runtime stops.
pub async fn next_commit(
    events: &mut EventStream,
    deadline: Instant,
    relevant: impl Fn(&EventRecord) -> bool,
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(event)) if relevant(&event) => return true,
            Ok(Ok(_)) => {}
            Ok(Err(RecvError::Lagged { .. })) => return true,
            Ok(Err(RecvError::Closed)) => panic!("the runtime stopped"),
            Err(_) => return false,
        }
    }
}
