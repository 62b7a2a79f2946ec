//! Prompt admission (SPEC §6.3, reference §4) and the rebuild of a session's inbox and
//! transcript from its event log.
//!
//! A prompt is admitted into the session's inbox (`session_input`) by one write request that
//! checks and admits together: the single writer serializes it against every other write, so
//! concurrent exact retries of one id yield one row and one `session.prompt.admitted` event.
//! Admission never touches the transcript; a running turn promotes inputs with
//! [`crate::Turn::promote_steer`] and [`crate::Turn::promote_queue`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{validate, Sessions};
use crate::error::{Error, Result, StoreError};
use crate::event::kind;
use crate::id::{MessageId, SessionId};
use crate::model::{Admission, Delivery};
use crate::persistence::WriteCtx;
use crate::store;

/// What [`Sessions::prompt`] takes.
///
/// The prompt is opaque to the runtime but must be a JSON object or a JSON string, nested at
/// most [`super::MAX_JSON_DEPTH`] deep and at most `max_prompt_bytes` (default 1 MiB) once
/// encoded as compact JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptInput {
    /// The message id, the idempotency key; generated when absent.
    #[serde(default)]
    pub id: Option<MessageId>,
    /// The session the prompt is for.
    pub session_id: SessionId,
    /// The prompt: a JSON object or string.
    pub prompt: Value,
    /// How the prompt enters a turn (default `steer`).
    #[serde(default)]
    pub delivery: Delivery,
    /// Whether to wake the session after admission (default true).
    #[serde(default = "default_resume")]
    pub resume: bool,
}

fn default_resume() -> bool {
    true
}

impl PromptInput {
    /// A `steer` prompt with a generated id that wakes the session.
    pub fn new(session_id: SessionId, prompt: impl Into<Value>) -> Self {
        Self {
            id: None,
            session_id,
            prompt: prompt.into(),
            delivery: Delivery::Steer,
            resume: true,
        }
    }

    /// Sets the message id (the idempotency key).
    pub fn with_id(mut self, id: MessageId) -> Self {
        self.id = Some(id);
        self
    }

    /// Sets the delivery mode.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets whether the session is woken after admission.
    pub fn with_resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }
}

/// What [`Sessions::reproject`] rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reprojection {
    /// Events replayed (admissions, promotions and appended messages).
    pub events: usize,
    /// Inbox rows after the rebuild.
    pub inputs: usize,
    /// Transcript rows after the rebuild.
    pub messages: usize,
}

/// The event kinds whose projections are the inbox and the transcript.
const INBOX_AND_TRANSCRIPT: &[&str] = &[
    kind::PROMPT_ADMITTED,
    kind::PROMPT_PROMOTED,
    kind::MESSAGE_APPENDED,
];

/// Whether a stored admission is what this request would have admitted (reference
/// `equivalent`): same session, same delivery, same prompt JSON.
fn equivalent(stored: &Admission, session: &SessionId, prompt: &Value, delivery: Delivery) -> bool {
    &stored.session_id == session && stored.delivery == delivery && &stored.prompt == prompt
}

fn conflict(session_id: SessionId, message_id: &MessageId) -> Error {
    Error::PromptConflict {
        session_id,
        message_id: message_id.clone(),
    }
}

/// The check-and-admit of one prompt, inside one write request. Rejections return before
/// anything is written; a conflict raised by the admission's own projection is returned as
/// [`StoreError::Conflict`] so that the request's savepoint rolls back.
///
/// With `resume`, the input is marked as owed a turn in the same transaction (an exact retry
/// marks a pending, unfenced input too): the acknowledgement is then a durable promise that a
/// turn runs for it, even if the process dies before the wake reaches the session.
fn admit_once(
    w: &mut WriteCtx<'_>,
    session: &SessionId,
    id: &MessageId,
    prompt: &Value,
    delivery: Delivery,
    resume: bool,
) -> Result<Result<Admission>, StoreError> {
    let conn = w.conn();
    if !store::session_exists(conn, session)? {
        return Ok(Err(Error::NotFound {
            session_id: session.clone(),
        }));
    }
    if let Some(stored) = store::get_input(conn, id)? {
        if !equivalent(&stored, session, prompt, delivery) {
            return Ok(Err(conflict(stored.session_id, id)));
        }
        let fenced = store::latest_interrupt_seq(conn, session)?
            .is_some_and(|fence| stored.admitted_seq <= fence);
        if resume && stored.promoted_seq.is_none() && !fenced {
            store::mark_wake(conn, id)?;
        }
        return Ok(Ok(stored));
    }
    if let Some(owner) = store::transcript_owner(conn, id)? {
        return Ok(Err(conflict(owner, id)));
    }
    let (admission, event) = store::admit(conn, session, id, prompt, delivery, store::now_ms())?;
    if resume {
        store::mark_wake(conn, id)?;
    }
    if event.is_some() {
        crate::crash::point(crate::crash::DURING_ADMISSION);
    }
    if let Some(event) = event {
        w.record(event);
    }
    Ok(Ok(admission))
}

impl Sessions {
    /// Admits a prompt into the session's inbox and, unless `resume` is false, wakes the session
    /// with the admission's seq (returning once the wake is delivered, never waiting for the
    /// drain). The `session.prompt.admitted` event and the inbox row commit together; the
    /// transcript is not touched (a turn promotes the input later).
    ///
    /// The message id is the idempotency key: an exact retry (same session, prompt JSON and
    /// delivery) returns the stored [`Admission`] — pending or already promoted — writes
    /// nothing, and still wakes the session (recovering a prompt committed but never woken).
    ///
    /// The work runs on a task of its own, so a caller that stops waiting does not cut it
    /// between the admission and the wake. A failed wake is logged, not returned: the admission
    /// is durable and an exact retry wakes again.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a prompt that is not a JSON object or string, is nested deeper
    /// than [`super::MAX_JSON_DEPTH`] or is larger than `max_prompt_bytes`;
    /// [`Error::NotFound`] when the session is not stored; [`Error::PromptConflict`] when the id
    /// is stored with another prompt, delivery or session (`session_id` names the session the
    /// stored record belongs to) or is already in a transcript; [`Error::Store`] when the write
    /// fails. Nothing is written on any error.
    pub async fn prompt(&self, input: PromptInput) -> Result<Admission> {
        validate::prompt(&input.prompt, self.core.config.max_prompt_bytes)?;
        let this = self.clone();
        actix_rt::spawn(async move { this.admit_and_wake(input).await })
            .await
            .map_err(|e| {
                Error::Store(StoreError::Inconsistent(format!("prompt task failed: {e}")))
            })?
    }

    async fn admit_and_wake(&self, input: PromptInput) -> Result<Admission> {
        let PromptInput {
            id,
            session_id,
            prompt,
            delivery,
            resume,
        } = input;
        let message_id = id.unwrap_or_else(MessageId::generate);
        let (session, message) = (session_id.clone(), message_id.clone());
        let admission = self
            .core
            .persistence
            .write(move |w| admit_once(w, &session, &message, &prompt, delivery, resume))
            .await
            .map_err(|e| match e {
                StoreError::Conflict(_) => conflict(session_id.clone(), &message_id),
                other => Error::Store(other),
            })??;
        if resume {
            crate::crash::point(crate::crash::AFTER_ADMISSION_BEFORE_WAKE);
            let woken = self
                .execution()
                .wake(&admission.session_id, Some(admission.admitted_seq))
                .await;
            if let Err(e) = woken {
                log::warn!(
                    "session {}: prompt {} admitted but not woken: {e}",
                    admission.session_id,
                    admission.id
                );
            }
        }
        Ok(admission)
    }

    /// Rebuilds the session's inbox (`session_input`) and transcript (`session_message`) from
    /// its event log: deletes those rows and replays every `session.prompt.admitted`,
    /// `session.prompt.promoted` and `session.message.appended` event through its projection,
    /// in seq order, in one transaction. Publishes nothing and never wakes the session: pending
    /// inputs come back pending, without scheduling execution.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::Store`] when the log cannot
    /// be replayed (then nothing changed).
    pub async fn reproject(&self, session_id: &SessionId) -> Result<Reprojection> {
        let key = session_id.clone();
        let rebuilt = self
            .core
            .persistence
            .write(move |w| {
                let conn = w.conn();
                if !store::session_exists(conn, &key)? {
                    return Ok(None);
                }
                store::delete_projections(conn, &key)?;
                let mut events = 0;
                // The claim of the turn being replayed, to mark the prompts of a turn a user
                // interrupted (the claim itself is execution state and is left as it is).
                let mut claim = None;
                for event in store::events_after(conn, &key, None, usize::MAX)? {
                    match event.kind.as_str() {
                        kind::EXECUTION_STARTED => {
                            claim.get_or_insert(event.seq);
                        }
                        kind::EXECUTION_SUCCEEDED | kind::EXECUTION_FAILED => claim = None,
                        kind::EXECUTION_INTERRUPTED => {
                            if event.data["reason"] != "shutdown" {
                                if let Some(seq) = claim.take() {
                                    store::mark_interrupted(conn, &key, seq)?;
                                }
                            }
                        }
                        _ => {}
                    }
                    if INBOX_AND_TRANSCRIPT.contains(&event.kind.as_str()) {
                        store::project(conn, &event)?;
                        events += 1;
                    }
                }
                let (inputs, messages) = store::projection_counts(conn, &key)?;
                Ok(Some(Reprojection {
                    events,
                    inputs,
                    messages,
                }))
            })
            .await?;
        rebuilt.ok_or_else(|| Error::NotFound {
            session_id: session_id.clone(),
        })
    }
}
