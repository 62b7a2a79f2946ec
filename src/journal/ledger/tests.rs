use serde_json::json;

use super::*;
use crate::id::SessionId;
use crate::outcome::SessionError;

fn record(seq: u64, event: &SessionEvent) -> EventRecord {
    EventRecord {
        session_id: SessionId::new("s").unwrap_or_else(|_| unreachable!()),
        seq,
        kind: event.kind().to_owned(),
        data: event.data().unwrap_or_default(),
        time: 0,
    }
}

fn started(turn: Option<u64>) -> SessionEvent {
    SessionEvent::ExecutionStarted {
        boot: "b".into(),
        turn,
    }
}

fn step(turn: u64, name: &str, attempt: u32) -> SessionEvent {
    SessionEvent::StepStarted {
        turn,
        step: name.into(),
        attempt,
        key: format!("s:{turn}:{name}"),
    }
}

fn done(turn: u64, name: &str, result: serde_json::Value) -> SessionEvent {
    SessionEvent::StepCompleted {
        turn,
        step: name.into(),
        attempt: 1,
        result,
    }
}

fn failed(turn: u64, name: &str) -> SessionEvent {
    SessionEvent::StepFailed {
        turn,
        step: name.into(),
        attempt: 1,
        error: SessionError::new("step", "429"),
    }
}

fn log(events: &[SessionEvent], first: u64) -> Vec<EventRecord> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| record(first + i as u64, e))
        .collect()
}

#[test]
fn a_completed_step_replays_and_an_open_one_is_ambiguous() -> Result<(), StoreError> {
    let events = log(
        &[
            started(None),
            step(5, "a", 1),
            done(5, "a", json!(1)),
            step(5, "b", 1),
            started(None),
        ],
        5,
    );
    let ledger = Ledger::fold(5, &events)?;
    assert_eq!(ledger.attempt, 2);
    assert_eq!(
        ledger.lookup("a"),
        Lookup::Done(StepStatus::Completed { result: json!(1) })
    );
    assert_eq!(ledger.lookup("b"), Lookup::Ambiguous { previous: 1 });
    assert_eq!(ledger.lookup("c"), Lookup::Run { previous: 0 });
    assert_eq!(ledger.open().len(), 1);
    assert_eq!(ledger.open()[0].key, "s:5:b");
    Ok(())
}

#[test]
fn a_retry_runs_failed_steps_again_and_keeps_completed_ones() -> Result<(), StoreError> {
    let events = log(
        &[
            started(None),
            step(3, "a", 1),
            done(3, "a", json!("x")),
            step(3, "b", 1),
            failed(3, "b"),
            SessionEvent::terminal(&crate::outcome::Terminal::Failed {
                error: SessionError::new("x", "y"),
            }),
            started(Some(3)),
        ],
        3,
    );
    let ledger = Ledger::fold(3, &events)?;
    assert_eq!(ledger.attempt, 2);
    assert!(matches!(ledger.lookup("a"), Lookup::Done(_)));
    assert_eq!(ledger.lookup("b"), Lookup::Run { previous: 1 });
    // Before the retry, the failure replays.
    let before = Ledger::fold(3, &events[..6])?;
    assert!(matches!(
        before.lookup("b"),
        Lookup::Done(StepStatus::Failed { .. })
    ));
    Ok(())
}

#[test]
fn events_of_other_turns_are_not_the_ledgers() -> Result<(), StoreError> {
    let events = log(&[step(1, "a", 1), started(None), step(9, "a", 1)], 1);
    let ledger = Ledger::fold(2, &events)?;
    assert_eq!(ledger.lookup("a"), Lookup::Run { previous: 0 });
    Ok(())
}

#[test]
fn the_last_turn_is_its_run_of_claims() -> Result<(), StoreError> {
    let failed_turn = SessionEvent::terminal(&crate::outcome::Terminal::Failed {
        error: SessionError::new("x", "y"),
    });
    let shutdown = SessionEvent::ExecutionInterrupted {
        reason: InterruptReason::Shutdown,
    };
    let ok = SessionEvent::ExecutionSucceeded {};
    // turn 1 succeeded; turn 3 was shut down, resumed at 5, failed at 6.
    let events = log(
        &[
            started(None),
            ok,
            started(None),
            shutdown,
            started(None),
            failed_turn.clone(),
        ],
        1,
    );
    assert_eq!(
        last_turn(&events, true)?,
        LastTurn::Turn {
            id: 3,
            terminal: Some(Box::new(failed_turn.clone()))
        }
    );
    // Only its resume is read: further back is needed.
    assert_eq!(last_turn(&events[4..], false)?, LastTurn::Before);
    // A retry names its turn.
    let retried = log(&[started(Some(3)), failed_turn.clone()], 7);
    assert_eq!(
        last_turn(&retried, false)?,
        LastTurn::Turn {
            id: 3,
            terminal: Some(Box::new(failed_turn))
        }
    );
    assert_eq!(last_turn(&[], true)?, LastTurn::None);
    Ok(())
}
