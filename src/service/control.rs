//! Execution control through the session service: `interrupt`, `resume`, `await_idle`,
//! `switch_model` and the `active` set.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{validate, Sessions};
use crate::error::{Error, Result};
use crate::event::EventRecord;
use crate::execution::Execution;
use crate::id::SessionId;
use crate::journal::Route;
use crate::outcome::Terminal;

impl Sessions {
    /// The execution handle of the same runtime.
    pub fn execution(&self) -> Execution {
        self.execution.clone()
    }

    /// The sessions with a turn in this process, including ones starting or settling
    /// (the execution registry, [`Execution::active`]).
    pub fn active(&self) -> BTreeSet<SessionId> {
        self.execution().active()
    }

    /// Interrupts the session as a user interrupt.
    ///
    /// For a stored session, first commits `session.interrupt.requested` (data
    /// `{"sessionID": …}`); its seq is the interrupt fence: the running turn is interrupted
    /// unless it serves work admitted after the fence, and wakes for prompts admitted at or
    /// before it are dropped — durably: a restarted process loads the fence too, and the
    /// restart sweep records a claimed turn the request came after as `interrupted{user}`
    /// instead of resuming it, so the interrupt sticks even if the process dies before the
    /// turn's terminal. Prompts admitted later still run. For an id with no stored session,
    /// delegates a seq-less interrupt (delegation does not require the session to exist) and
    /// records nothing.
    ///
    /// Returns whether a running turn was interrupted (it then committed `interrupted{user}`
    /// and released its claim before this returns). When the runtime starts shutting down
    /// after the request committed, the request has taken effect all the same (the next boot
    /// records the turn as interrupted by the user) and this returns whether a turn held the
    /// claim. The work runs on a task of its own, so a caller that stops waiting does not cut
    /// it between the event and the interrupt.
    ///
    /// # Errors
    /// [`Error::Store`] when the event cannot be committed (then nothing was interrupted);
    /// [`Error::ShuttingDown`] when the runtime was already shutting down (then nothing was
    /// stored).
    pub async fn interrupt(&self, session_id: &SessionId) -> Result<bool> {
        if self.execution.is_closed() {
            return Err(Error::ShuttingDown);
        }
        let this = self.clone();
        let id = session_id.clone();
        actix_rt::spawn(async move {
            let request = this.journal.request_interrupt(id.clone()).await?;
            crate::crash::point(crate::crash::AFTER_INTERRUPT_REQUEST);
            if let Some((_, claimed, Route::Remote { .. })) = request {
                // Another node owns the session: the store notified it, and it interrupts the
                // turn. The request is durable either way.
                return Ok(claimed);
            }
            let request = request.map(|(seq, claimed, _)| (seq, claimed));
            match (
                this.execution().interrupt(&id, request.map(|r| r.0)).await,
                request,
            ) {
                (Err(Error::ShuttingDown), Some((seq, claimed))) => {
                    log::info!(
                        "session {id}: interrupt request {seq} committed during shutdown; \
                         the next boot records it"
                    );
                    Ok(claimed)
                }
                (answer, _) => answer,
            }
        })
        .await
        .map_err(|source| Error::Task {
            task: "interrupt",
            source,
        })?
    }

    /// Runs a forced turn of the session (or joins the running one) and returns how it ended.
    /// Appends no prompt and does not wake.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::ShuttingDown`] while
    /// shutting down; [`Error::Store`] when the turn's terminal could not be recorded.
    pub async fn resume(&self, session_id: &SessionId) -> Result<Terminal> {
        self.require(session_id).await?;
        self.execution().resume(session_id).await
    }

    /// Runs the next attempt of the session's last turn, which ended `failed` (or `aborted`),
    /// and returns how it ended: the same turn ([`crate::Turn::id`]), its completed steps
    /// replayed, its failed ones run again, `Turn::resumption` naming the inputs it had
    /// promoted. To start it without waiting, see [`Execution::start_retry`].
    ///
    /// # Errors
    /// [`Error::NotRetryable`] (nothing written) when a turn is in flight, none has run, or the
    /// last one succeeded or was interrupted; [`Error::NotFound`] when the session is not
    /// stored; [`Error::ShuttingDown`] while shutting down; [`Error::Store`] when a write fails.
    pub async fn retry(&self, session_id: &SessionId) -> Result<Terminal> {
        self.require(session_id).await?;
        self.execution().retry(session_id).await
    }

    /// The steps of the session's last turn, as its ledger holds them (every attempt's), with
    /// the turn's id and attempt and whether it still holds the claim; `None` when no turn has
    /// run. Read from the session's log.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::Store`] when a read fails.
    pub async fn steps(&self, session_id: &SessionId) -> Result<Option<crate::TurnSteps>> {
        self.require(session_id).await?;
        Ok(self.journal.last_turn_steps(session_id.clone()).await?)
    }

    /// Waits for the turn that serves the admitted prompt `admission` and returns how it
    /// ended: the first turn terminal that releases the claim after the prompt's
    /// `session.prompt.promoted` (a shutdown's keeps the claim, so the resumed turn's counts).
    /// A prompt an interrupt request stopped before it was promoted is never served: that
    /// answers `interrupted{user}`. Read from the session's log, so it works for a prompt
    /// already served, on any node.
    ///
    /// A prompt admitted without `resume` waits for a turn something else starts.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::EventsCompacted`] when
    /// retention removed the events after the admission; [`Error::ShuttingDown`] when the
    /// runtime stops first; [`Error::Store`] when a read fails.
    pub async fn await_served(&self, admission: &crate::Admission) -> Result<Terminal> {
        use crate::event::{kind, SessionEvent};
        let mut events = self
            .events(&admission.session_id, Some(admission.admitted_seq))
            .await?;
        let mut promoted = admission.promoted_seq.is_some();
        let after = admission.promoted_seq.unwrap_or(admission.admitted_seq);
        while let Some(event) = events.next().await {
            let event = event?;
            match event.kind.as_str() {
                kind::PROMPT_PROMOTED
                    if event.data.get("messageID").and_then(Value::as_str)
                        == Some(admission.id.as_str()) =>
                {
                    promoted = true;
                }
                kind::INTERRUPT_REQUESTED if !promoted => {
                    return Ok(Terminal::Interrupted {
                        reason: crate::InterruptReason::User,
                    });
                }
                _ if promoted && event.seq > after => {
                    let decoded: std::result::Result<SessionEvent, _> = serde_json::from_value(
                        serde_json::json!({ "type": event.kind, "data": event.data }),
                    );
                    match decoded {
                        Ok(ended) if ended.releases_claim() => {
                            if let Some(terminal) = ended.as_terminal() {
                                return Ok(terminal);
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        Err(Error::ShuttingDown)
    }

    /// Resolves once no turn of the session runs in this process (through successor turns);
    /// at once when idle. Never starts work.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::ShuttingDown`] while
    /// shutting down.
    pub async fn await_idle(&self, session_id: &SessionId) -> Result<()> {
        self.require(session_id).await?;
        self.execution().await_idle(session_id).await
    }

    /// Publishes `session.model.switched` (data `{"sessionID", "messageID", "model"}`, with a
    /// fresh message id) and returns the committed event. The stored session row is not
    /// changed: the event log is the record of the switch.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when `model` is not a JSON object or string within
    /// [`super::MAX_MODEL_BYTES`]; [`Error::NotFound`] when the session is not stored;
    /// [`Error::Store`] when the write fails.
    pub async fn switch_model(&self, session_id: &SessionId, model: Value) -> Result<EventRecord> {
        validate::model(&model)?;
        let event = self.journal.switch_model(session_id.clone(), model).await?;
        event.ok_or_else(|| Error::NotFound {
            session_id: session_id.clone(),
        })
    }
}
