//! Prompt admission and the rebuild of a session's inbox and
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
use crate::error::{Error, Result};
use crate::id::{MessageId, SessionId};
use crate::journal::{Admitted, Route};
use crate::records::{Admission, Delivery, Reprojection};

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

fn conflict(session_id: SessionId, message_id: &MessageId) -> Error {
    Error::PromptConflict {
        session_id,
        message_id: message_id.clone(),
    }
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
        validate::prompt(&input.prompt, self.config.max_prompt_bytes)?;
        let this = self.clone();
        actix_rt::spawn(async move { this.admit_and_wake(input).await })
            .await
            .map_err(|source| Error::Task {
                task: "prompt",
                source,
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
        let admitted = self
            .journal
            .admit_prompt(
                session_id.clone(),
                message_id.clone(),
                prompt,
                delivery,
                resume,
            )
            .await?;
        let (admitted, route) = admitted;
        let admission = match admitted {
            Admitted::New(admission) | Admitted::Retried(admission) => admission,
            Admitted::Conflict(owner) => return Err(conflict(owner, &message_id)),
            Admitted::NoSession => return Err(Error::NotFound { session_id }),
        };
        // With several nodes, a session another node owns was woken there, by the store.
        if resume && route == Route::Local {
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
    /// [`Error::NotFound`] when the session is not stored; [`Error::EventsCompacted`] when its
    /// log was compacted (retention: the rows built from the compacted events cannot be
    /// rebuilt; nothing changed); [`Error::Store`] when the log cannot be replayed (then
    /// nothing changed).
    pub async fn reproject(&self, session_id: &SessionId) -> Result<Reprojection> {
        match self.journal.reproject(session_id.clone()).await? {
            Some(Ok(reprojection)) => Ok(reprojection),
            Some(Err(first_seq)) => Err(Error::EventsCompacted {
                session_id: session_id.clone(),
                first_seq,
            }),
            None => Err(Error::NotFound {
                session_id: session_id.clone(),
            }),
        }
    }
}
