//! Prompts and requests into a session: admission, interrupt requests, model switches, and the
//! rebuild of the inbox and transcript from the log.

use serde_json::Value;

use super::backend::{admit_new, Nudge, Ownership, Route, Store};
use super::rules;
use super::Journal;
use crate::error::StoreError;
use crate::event::{kind, EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::records::Reprojection;
use crate::records::{Admission, Delivery};

/// What [`Journal::admit_prompt`] did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Admitted {
    /// Admitted now: the inbox row and `session.prompt.admitted` committed together.
    New(Admission),
    /// An exact retry (same session, prompt JSON and delivery): the stored admission, pending
    /// or promoted; nothing new was written but its wake mark.
    Retried(Admission),
    /// The id is stored with another prompt, delivery or session (`session` names the session
    /// the stored record belongs to), or is already in a transcript. Nothing was written.
    Conflict(SessionId),
    /// The session is not stored. Nothing was written.
    NoSession,
}

/// The event kinds whose projections are the inbox and the transcript.
const INBOX_AND_TRANSCRIPT: &[&str] = &[
    kind::PROMPT_ADMITTED,
    kind::PROMPT_PROMOTED,
    kind::MESSAGE_APPENDED,
];

/// Where `nudge` for `session` is carried out, decided in the request's transaction: here when
/// this node owns the session (taking it when no live node does), else on the live node that
/// owns it, which the store notifies at COMMIT.
fn here_or_owner(
    store: &mut dyn Store,
    session: &SessionId,
    nudge: Nudge,
) -> Result<Route, StoreError> {
    match store.acquire(session)? {
        Ownership::Elsewhere { .. } => store.route(session, nudge),
        Ownership::Owned { .. } | Ownership::Missing => Ok(Route::Local),
    }
}

impl Journal {
    /// Admits a prompt into the session's inbox, checking and admitting in one request.
    ///
    /// With `resume`, the input is marked as owed a turn in the same transaction (an exact
    /// retry marks a pending, unfenced input too): the acknowledgement is then a durable promise
    /// that a turn runs for it, even if the process dies before the wake reaches the session.
    /// A conflict raised by the admission's own projection rolls the request back.
    ///
    /// With several nodes, a client's exact retry on another node can race the first attempt's
    /// COMMIT (the first node died after sending it): its read misses the row, and its insert
    /// then meets the committed row's key, a constraint conflict. Such a conflict is decided
    /// once more, by a request that reads the committed row (an exact retry, or a conflict).
    pub(crate) async fn admit_prompt(
        &self,
        session: SessionId,
        id: MessageId,
        prompt: Value,
        delivery: Delivery,
        resume: bool,
    ) -> Result<(Admitted, Route), StoreError> {
        let mut again = self.inner.shared;
        loop {
            let attempt = self
                .admit_once(
                    session.clone(),
                    id.clone(),
                    prompt.clone(),
                    delivery,
                    resume,
                )
                .await;
            match attempt {
                Err(StoreError::Conflict(_)) if std::mem::take(&mut again) => {}
                Err(StoreError::Conflict(_)) => {
                    return Ok((Admitted::Conflict(session), Route::Local))
                }
                other => return other,
            }
        }
    }

    /// One request of [`Journal::admit_prompt`]; a constraint conflict is returned as the
    /// error.
    async fn admit_once(
        &self,
        session: SessionId,
        id: MessageId,
        prompt: Value,
        delivery: Delivery,
        resume: bool,
    ) -> Result<(Admitted, Route), StoreError> {
        let shared = self.inner.shared;
        self.inner
            .persistence
            .write(move |w| {
                let conn = w.store();
                if !conn.session_exists(&session)? {
                    return Ok((Admitted::NoSession, Route::Local));
                }
                if let Some(stored) = conn.get_input(&id)? {
                    if !rules::same_admission(&stored, &session, &prompt, delivery) {
                        return Ok((Admitted::Conflict(stored.session_id), Route::Local));
                    }
                    let fence = conn.latest_interrupt_seq(&session)?;
                    let mut route = Route::Local;
                    if rules::retry_wakes(&stored, resume, fence) {
                        conn.mark_wake(&id)?;
                        if shared {
                            route =
                                here_or_owner(conn, &session, Nudge::Wake(stored.admitted_seq))?;
                        }
                    }
                    return Ok((Admitted::Retried(stored), route));
                }
                if let Some(owner) = conn.transcript_owner(&id)? {
                    return Ok((Admitted::Conflict(owner), Route::Local));
                }
                let (admission, event) =
                    admit_new(conn, &session, &id, &prompt, delivery, super::now_ms())?;
                let event = Some(event);
                let mut route = Route::Local;
                if resume {
                    conn.mark_wake(&id)?;
                    if shared {
                        route = here_or_owner(conn, &session, Nudge::Wake(admission.admitted_seq))?;
                    }
                }
                if let Some(event) = event {
                    crate::crash::point(crate::crash::DURING_ADMISSION);
                    w.record(event);
                }
                Ok((Admitted::New(admission), route))
            })
            .await
    }

    /// Commits `session.interrupt.requested` (data `{"sessionID"}`) and drops the wake marks
    /// of every pending input (the request fences them all). Returns the request's seq,
    /// whether a turn held the claim and where the interrupt is to be carried out, or `None`
    /// (nothing written) when the session is not stored.
    pub(crate) async fn request_interrupt(
        &self,
        session: SessionId,
    ) -> Result<Option<(u64, bool, Route)>, StoreError> {
        let shared = self.inner.shared;
        self.inner
            .persistence
            .write(move |w| {
                let Some(claim) = w.store().claim_state(&session)? else {
                    return Ok(None);
                };
                let request = SessionEvent::InterruptRequested {
                    session_id: session.clone(),
                };
                let seq = w.append(&session, &request)?.seq;
                w.store().clear_wakes(&session)?;
                let route = if shared {
                    here_or_owner(w.store(), &session, Nudge::Interrupt(seq))?
                } else {
                    Route::Local
                };
                Ok(Some((seq, claim.time_suspended.is_some(), route)))
            })
            .await
    }

    /// Commits `session.model.switched` (data `{"sessionID", "messageID", "model"}`, with a
    /// fresh message id); `None` when the session is not stored.
    pub(crate) async fn switch_model(
        &self,
        session: SessionId,
        model: Value,
    ) -> Result<Option<EventRecord>, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                if !w.store().session_exists(&session)? {
                    return Ok(None);
                }
                let switched = SessionEvent::ModelSwitched {
                    session_id: session.clone(),
                    message_id: MessageId::generate(),
                    model: model.clone(),
                };
                w.append(&session, &switched).map(Some)
            })
            .await
    }

    /// Rebuilds the session's inbox and transcript from its log, in one transaction: deletes
    /// those rows and replays every admission, promotion and appended message through its
    /// projection, in seq order, marking the prompts of turns a user interrupted again. The
    /// claim is execution state and is left as it is; wake marks are not rebuilt (a rebuild
    /// schedules nothing). `None` when the session is not stored; `Err(start)` (nothing
    /// changed) when its log was compacted and starts at `start`: the rows built from the
    /// compacted events could not be rebuilt.
    pub(crate) async fn reproject(
        &self,
        session: SessionId,
    ) -> Result<Option<Result<Reprojection, u64>>, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                let conn = w.store();
                match conn.log_start(&session)? {
                    None => return Ok(None),
                    Some(0) => {}
                    Some(start) => return Ok(Some(Err(start))),
                }
                conn.delete_projections(&session)?;
                let mut events = 0;
                // The claim of the turn being replayed, to mark the prompts of a turn a user
                // interrupted.
                let mut claim = None;
                for event in conn.events_after(&session, None, usize::MAX)? {
                    match SessionEvent::projected(&event.kind, &event.data) {
                        Some(Ok(SessionEvent::ExecutionStarted { .. })) => {
                            claim.get_or_insert(event.seq);
                        }
                        Some(Ok(terminal)) if terminal.releases_claim() => {
                            let claimed = claim.take();
                            if let (SessionEvent::ExecutionInterrupted { .. }, Some(seq)) =
                                (terminal, claimed)
                            {
                                conn.mark_interrupted(&session, seq)?;
                            }
                        }
                        _ => {}
                    }
                    if INBOX_AND_TRANSCRIPT.contains(&event.kind.as_str()) {
                        conn.project(&event)?;
                        events += 1;
                    }
                }
                let (inputs, messages) = conn.projection_counts(&session)?;
                Ok(Some(Ok(Reprojection {
                    events,
                    inputs,
                    messages,
                })))
            })
            .await
    }
}
