//! A turn's steps and attempts: recording a step's intent and outcome, reading a turn's
//! ledger back, and a retry of the session's last turn.

use std::sync::Arc;

use super::ledger::{last_turn, LastTurn, Ledger};
use super::Journal;
use crate::error::{NotRetryable, StoreError};
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::outcome::InterruptReason;
use crate::records::Resumption;
use crate::step::TurnSteps;

/// Events read per page when a turn's ledger is loaded or the log is searched backwards for
/// its last turn.
const PAGE: usize = 1024;

/// What a retry did: the claim of the turn's next attempt, or why there is none.
pub(crate) type Retried = Result<Arc<Resumption>, NotRetryable>;

impl Journal {
    /// Commits one step record of a running turn (its intent or its outcome), fenced by
    /// `epoch` like every write of a turn; returns its seq.
    pub(crate) async fn record_step(
        &self,
        session: SessionId,
        event: SessionEvent,
        epoch: u64,
    ) -> Result<u64, StoreError> {
        let outcome = !matches!(event, SessionEvent::StepStarted { .. });
        self.inner
            .persistence
            .write(move |w| {
                let record = w
                    .store()
                    .record_step(&session, &event, epoch, super::now_ms())?;
                let seq = record.seq;
                w.record(record);
                if outcome {
                    crate::crash::point(crate::crash::DURING_STEP_OUTCOME);
                }
                Ok(seq)
            })
            .await
    }

    /// The ledger of turn `turn` of `session`, from its events (read on a reader).
    pub(crate) async fn turn_ledger(
        &self,
        session: SessionId,
        turn: u64,
    ) -> Result<Ledger, StoreError> {
        self.inner
            .persistence
            .read(move |conn| ledger_of(conn, &session, turn))
            .await
    }

    /// The steps of the session's last turn, `None` when no turn has run (read on a reader).
    pub(crate) async fn last_turn_steps(
        &self,
        session: SessionId,
    ) -> Result<Option<TurnSteps>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| {
                let LastTurn::Turn { id, terminal } = find_last_turn(conn, &session)? else {
                    return Ok(None);
                };
                let ledger = ledger_of(conn, &session, id)?;
                let open = conn.claim_seq(&session)?.is_some();
                Ok(Some(TurnSteps {
                    turn: id,
                    attempt: ledger.attempt,
                    open,
                    terminal: terminal.filter(|_| !open).and_then(|t| t.as_terminal()),
                    steps: ledger.steps(),
                }))
            })
            .await
    }

    /// Starts the next attempt of the session's last turn if it ended `failed` (or
    /// `aborted`): in one transaction, fenced by `epoch`, its claim for `boot` at the turn's
    /// own seq (`session.execution.started` naming the turn). The resumption names the inputs
    /// the turn had promoted and not finished. Anything else is refused, saying why.
    pub(crate) async fn retry_turn(
        &self,
        session: SessionId,
        boot: String,
        epoch: u64,
        max: u32,
    ) -> Result<Retried, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                if w.store().claim_seq(&session)?.is_some() {
                    return Ok(Err(NotRetryable::TurnInFlight));
                }
                let (id, terminal) = match find_last_turn(w.store(), &session)? {
                    LastTurn::Turn { id, terminal } => (id, terminal),
                    LastTurn::None | LastTurn::Before => return Ok(Err(NotRetryable::NoTurn)),
                };
                match terminal.map(|t| *t) {
                    Some(SessionEvent::ExecutionFailed { .. }) => {}
                    Some(SessionEvent::ExecutionSucceeded {}) => {
                        return Ok(Err(NotRetryable::Succeeded))
                    }
                    Some(SessionEvent::ExecutionInterrupted { reason })
                        if reason != InterruptReason::Shutdown =>
                    {
                        return Ok(Err(NotRetryable::Interrupted))
                    }
                    _ => return Ok(Err(NotRetryable::TurnInFlight)),
                }
                let fence = w.store().latest_interrupt_seq(&session)?;
                if super::rules::interrupts_turn(Some(id), fence) {
                    return Ok(Err(NotRetryable::Interrupted));
                }
                let inputs = w.store().served_inputs(&session, id, fence)?;
                let started = SessionEvent::ExecutionStarted {
                    boot: boot.clone(),
                    turn: Some(id),
                };
                let claim = w.append(&session, &started)?.seq;
                Ok(Ok(Arc::new(Resumption {
                    attempt: 1,
                    max_attempts: max,
                    notice_seq: claim,
                    inputs,
                    turn: id,
                    steps: Vec::new(),
                })))
            })
            .await
    }
}

/// The ledger of turn `turn`: its events read from its first claim on, a page at a time.
fn ledger_of(
    store: &mut dyn super::backend::Store,
    session: &SessionId,
    turn: u64,
) -> Result<Ledger, StoreError> {
    let mut events = Vec::new();
    let mut after = turn.checked_sub(1);
    loop {
        let page = store.events_after(session, after, PAGE)?;
        let full = page.len() == PAGE;
        after = page.last().map(|e| e.seq).or(after);
        events.extend(page);
        if !full {
            break;
        }
    }
    Ledger::fold(turn, &events)
}

/// The session's last turn: the end of its log read backwards a page at a time until the
/// rule ([`last_turn`]) sees where that turn began.
fn find_last_turn(
    store: &mut dyn super::backend::Store,
    session: &SessionId,
) -> Result<LastTurn, StoreError> {
    let Some(latest) = store.latest_seq(session)? else {
        return Ok(LastTurn::None);
    };
    let first = store.log_start(session)?.unwrap_or(0);
    let mut end = latest + 1;
    let mut window: Vec<EventRecord> = Vec::new();
    loop {
        let start = end.saturating_sub(PAGE as u64).max(first);
        let mut page = store.events_after(session, start.checked_sub(1), PAGE)?;
        page.retain(|e| e.seq < end);
        page.append(&mut window);
        window = page;
        match last_turn(&window, start <= first)? {
            LastTurn::Before if start > first => end = start,
            found => return Ok(found),
        }
    }
}
