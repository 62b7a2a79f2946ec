//! A turn's ledger: its attempts and its steps, as the turn's own events say. Two pure rules,
//! written once for both engines: [`Ledger::fold`] (the record of a turn from its events) and
//! [`last_turn`] (which turn a retry would take up).

use std::collections::HashMap;

use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::outcome::InterruptReason;
use crate::step::{StepRecord, StepStatus};

#[cfg(test)]
mod tests;

/// What a drain's step finds in the ledger.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lookup {
    /// No outcome to replay: run the body. `previous` bodies of the step started before
    /// without one (or with a failure a retry cleared).
    Run {
        /// How many earlier bodies of the step were started.
        previous: u32,
    },
    /// Its intent is recorded and its outcome is not (it ran in an earlier drain).
    Ambiguous {
        /// How many bodies of the step were started.
        previous: u32,
    },
    /// The recorded outcome to hand back.
    Done(StepStatus),
}

/// One step as the ledger keeps it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    record: StepRecord,
    /// A retry cleared its failure: the body runs again.
    cleared: bool,
}

/// A turn's record: its id, its attempts and its steps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ledger {
    /// The turn's id: the seq that first claimed it.
    pub(crate) turn: u64,
    /// Its attempts so far (each claim of it: the first, a resume, a retry), from 1.
    pub(crate) attempt: u32,
    /// Its steps in the order they first started.
    entries: Vec<Entry>,
    /// Step name → index in `entries`.
    index: HashMap<String, usize>,
}

impl Ledger {
    /// The ledger of a turn just claimed for the first time: attempt 1, no step.
    pub(crate) fn fresh(turn: u64) -> Self {
        Self {
            turn,
            attempt: 1,
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The ledger of turn `turn` from the session's events since it was claimed (`events`, in
    /// seq order; those before `turn` are skipped): one attempt per claim
    /// (`session.execution.started`), a step's latest start and outcome; a retry's claim
    /// clears the failures before it.
    ///
    /// # Errors
    /// [`StoreError::Inconsistent`] for a step or claim event that does not decode.
    pub(crate) fn fold(turn: u64, events: &[EventRecord]) -> Result<Self, StoreError> {
        let mut ledger = Self {
            attempt: 0,
            ..Self::fresh(turn)
        };
        for ev in events.iter().filter(|ev| ev.seq >= turn) {
            match SessionEvent::of_turn(&ev.kind, &ev.data) {
                None => {}
                Some(Ok(event)) => ledger.apply(&event),
                Some(Err(e)) => {
                    return Err(StoreError::Inconsistent(format!(
                        "{} event {}#{}: {e}",
                        ev.kind, ev.session_id, ev.seq
                    )))
                }
            }
        }
        ledger.attempt = ledger.attempt.max(1);
        Ok(ledger)
    }

    /// Takes in one event of the turn.
    pub(crate) fn apply(&mut self, event: &SessionEvent) {
        match event {
            SessionEvent::ExecutionStarted { turn, .. } => {
                self.attempt += 1;
                if turn.is_some() {
                    // A retry runs the steps that failed again.
                    for entry in &mut self.entries {
                        entry.cleared |= matches!(entry.record.status, StepStatus::Failed { .. });
                    }
                }
            }
            SessionEvent::StepStarted {
                turn,
                step,
                attempt,
                key,
            } if *turn == self.turn => {
                let at = *self.index.entry(step.clone()).or_insert(self.entries.len());
                if at == self.entries.len() {
                    self.entries.push(Entry {
                        record: StepRecord {
                            name: step.clone(),
                            key: key.clone(),
                            attempts: 0,
                            turn_attempt: *attempt,
                            status: StepStatus::Started,
                        },
                        cleared: false,
                    });
                }
                let entry = &mut self.entries[at];
                entry.record.attempts += 1;
                entry.record.turn_attempt = *attempt;
                entry.record.status = StepStatus::Started;
                entry.cleared = false;
            }
            SessionEvent::StepCompleted {
                turn, step, result, ..
            } if *turn == self.turn => {
                self.settle(
                    step,
                    StepStatus::Completed {
                        result: result.clone(),
                    },
                );
            }
            SessionEvent::StepFailed {
                turn, step, error, ..
            } if *turn == self.turn => {
                self.settle(
                    step,
                    StepStatus::Failed {
                        error: error.clone(),
                    },
                );
            }
            _ => {}
        }
    }

    /// Records the outcome of a started step (an outcome of a step never started is ignored).
    fn settle(&mut self, step: &str, status: StepStatus) {
        if let Some(&at) = self.index.get(step) {
            self.entries[at].record.status = status;
        }
    }

    /// What step `name` finds: an outcome to replay, an open intent, or nothing.
    pub(crate) fn lookup(&self, name: &str) -> Lookup {
        let Some(entry) = self.index.get(name).map(|&at| &self.entries[at]) else {
            return Lookup::Run { previous: 0 };
        };
        let previous = entry.record.attempts;
        match &entry.record.status {
            StepStatus::Started => Lookup::Ambiguous { previous },
            StepStatus::Failed { .. } if entry.cleared => Lookup::Run { previous },
            status => Lookup::Done(status.clone()),
        }
    }

    /// Every step, in the order they first started.
    pub(crate) fn steps(&self) -> Vec<StepRecord> {
        self.entries.iter().map(|e| e.record.clone()).collect()
    }

    /// The steps whose intent is recorded and whose outcome is not: ambiguous, seen from a
    /// drain that did not start them.
    pub(crate) fn open(&self) -> Vec<StepRecord> {
        self.entries
            .iter()
            .filter(|e| e.record.is_open())
            .map(|e| e.record.clone())
            .collect()
    }
}

/// Where the session's last turn stands, as the end of its log says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LastTurn {
    /// The events read do not reach back to the turn's first claim: read further back.
    Before,
    /// No turn was ever claimed.
    None,
    /// The last turn: its id, and the terminal that ended it (`None` while it holds its claim).
    Turn {
        /// The seq that first claimed it.
        id: u64,
        /// How it ended.
        terminal: Option<Box<SessionEvent>>,
    },
}

/// Which turn the end of a log (`events`, a suffix of it in seq order; `complete` when it
/// starts at the log's first stored event) shows last: the latest claims not separated by a
/// terminal that released one are one turn's attempts; a retry's claim names its turn.
///
/// # Errors
/// [`StoreError::Inconsistent`] for a claim or terminal event that does not decode.
pub(crate) fn last_turn(events: &[EventRecord], complete: bool) -> Result<LastTurn, StoreError> {
    let mut terminal: Option<Box<SessionEvent>> = None;
    let mut earliest: Option<u64> = None;
    // Only claims and terminals say where a turn starts and how it ended: the turn's other
    // events (its steps, often most of its log) are skipped undecoded.
    let claims_and_terminals = events
        .iter()
        .rev()
        .filter(|ev| ev.kind.starts_with("session.execution."));
    for ev in claims_and_terminals {
        let Some(event) = SessionEvent::of_turn(&ev.kind, &ev.data) else {
            continue;
        };
        let event = event.map_err(|e| {
            StoreError::Inconsistent(format!(
                "{} event {}#{}: {e}",
                ev.kind, ev.session_id, ev.seq
            ))
        })?;
        match &event {
            SessionEvent::ExecutionStarted { turn: Some(id), .. } => {
                return Ok(LastTurn::Turn { id: *id, terminal });
            }
            SessionEvent::ExecutionStarted { turn: None, .. } => earliest = Some(ev.seq),
            ended if ended.releases_claim() || is_shutdown(ended) => {
                if let Some(id) = earliest {
                    if ended.releases_claim() {
                        return Ok(LastTurn::Turn { id, terminal });
                    }
                } else if terminal.is_none() {
                    terminal = Some(Box::new(event.clone()));
                }
            }
            _ => {}
        }
    }
    Ok(match (earliest, complete) {
        (Some(id), true) => LastTurn::Turn { id, terminal },
        (None, true) => LastTurn::None,
        (_, false) => LastTurn::Before,
    })
}

/// Whether `event` is an interruption by shutdown (the claim stays).
fn is_shutdown(event: &SessionEvent) -> bool {
    matches!(
        event,
        SessionEvent::ExecutionInterrupted {
            reason: InterruptReason::Shutdown
        }
    )
}
