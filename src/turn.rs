//! [`Turn`]: what a runner's drain is given — the session, how the drain was started, and
//! methods that write through the Persistence actor.

use std::sync::Arc;

use serde_json::Value;

use crate::core::Core;
use crate::error::{Error, Result};
use crate::event::{kind, EventRecord};
use crate::execution::Execution;
use crate::id::{MessageId, SessionId};
use crate::model::{Admission, Message};

use crate::store;

/// Why a drain runs: what the runner is asked to serve.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnCause {
    /// An advisory wake: a prompt's admission (`seq`, its admission seq), the next queued prompt
    /// after a turn, or an unsequenced wake (`seq: None`). Drain only what is pending.
    Wake {
        /// The admission seq that woke this drain, if any.
        seq: Option<u64>,
    },
    /// An explicit resume (`Sessions::resume`, `POST /sessions/{id}/resume`): make at least one
    /// attempt. It resumes nothing a crash left behind and nothing a user interrupted: what it
    /// may serve is what is pending.
    Resume,
    /// The restart sweep resumed a turn a previous process left claimed (or owed: a prompt
    /// acknowledged but never started), after publishing the restart notice.
    Recovery(Arc<Resumption>),
}

/// What a turn resumed after a restart is resuming (see [`TurnCause::Recovery`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Resumption {
    /// Which restart-resume of this turn this is, from 1.
    pub attempt: u32,
    /// The budget: attempts past it are recorded as `aborted` instead of resumed.
    pub max_attempts: u32,
    /// The seq of the restart notice (`session.synthetic`) published for this attempt.
    pub notice_seq: u64,
    /// The inputs the killed attempt had promoted and not finished, in promotion order: never
    /// an input an earlier turn served to its terminal, never one a user interrupted. Empty
    /// when the killed process had not started the turn (an acknowledged prompt whose wake was
    /// lost): the prompt is then still pending, to be promoted as usual.
    pub inputs: Vec<Admission>,
}

/// One drain of a session's turn, handed to [`crate::Runner::drain`].
#[derive(Clone)]
pub struct Turn {
    core: Arc<Core>,
    session_id: SessionId,
    cause: TurnCause,
    /// The drain's interrupt fence: its wake's admission seq (a forced drain upgraded from a
    /// wake keeps that wake's seq).
    wake_seq: Option<u64>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("session_id", &self.session_id)
            .field("cause", &self.cause)
            .finish_non_exhaustive()
    }
}

impl Turn {
    pub(crate) fn new(
        core: Arc<Core>,
        session_id: SessionId,
        cause: TurnCause,
        wake_seq: Option<u64>,
    ) -> Self {
        Self {
            core,
            session_id,
            cause,
            wake_seq,
        }
    }

    /// Why this drain runs.
    pub fn cause(&self) -> &TurnCause {
        &self.cause
    }

    /// For a turn the restart sweep resumed, what it resumes.
    pub fn resumption(&self) -> Option<&Resumption> {
        match &self.cause {
            TurnCause::Recovery(resumption) => Some(resumption),
            _ => None,
        }
    }

    /// The session this turn belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// True for an explicit resume or a recovery (make at least one attempt), false for an
    /// advisory wake.
    pub fn is_forced(&self) -> bool {
        !matches!(self.cause, TurnCause::Wake { .. })
    }

    /// The admission seq that woke this drain, if any.
    pub fn wake_seq(&self) -> Option<u64> {
        self.wake_seq
    }

    /// The execution handle, e.g. to wake this session again from inside the drain.
    pub fn execution(&self) -> Execution {
        Execution {
            core: self.core.clone(),
        }
    }

    /// Promotes every pending `steer` input admitted at or before `cutoff` (all when `None`)
    /// into the transcript, in admission order. Each promotion commits its
    /// `session.prompt.promoted` event, `promoted_seq` and transcript row together; concurrent
    /// promotion promotes each input exactly once.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed (nothing was promoted).
    pub async fn promote_steer(&self, cutoff: Option<u64>) -> Result<Vec<Admission>> {
        let id = self.session_id.clone();
        let promoted = self
            .core
            .persistence
            .write(move |w| {
                let promoted = store::promote_steer(w.conn(), &id, cutoff, store::now_ms())?;
                if !promoted.is_empty() {
                    crate::crash::point(crate::crash::DURING_PROMOTION);
                }
                Ok(promoted
                    .into_iter()
                    .map(|(admission, event)| {
                        w.record(event);
                        admission
                    })
                    .collect())
            })
            .await?;
        Ok(promoted)
    }

    /// Promotes only the oldest pending `queue` input (one per turn), if any.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn promote_queue(&self) -> Result<Option<Admission>> {
        let id = self.session_id.clone();
        let promoted = self
            .core
            .persistence
            .write(move |w| {
                let promoted = store::promote_queue(w.conn(), &id, store::now_ms())?;
                if promoted.is_some() {
                    crate::crash::point(crate::crash::DURING_PROMOTION);
                }
                Ok(promoted.map(|(admission, event)| {
                    w.record(event);
                    admission
                }))
            })
            .await?;
        Ok(promoted)
    }

    /// The inputs still pending in the session's inbox, in admission order.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn pending(&self) -> Result<Vec<Admission>> {
        let id = self.session_id.clone();
        Ok(self
            .core
            .persistence
            .read(move |conn| store::pending_inputs(conn, &id))
            .await?)
    }

    /// Appends a message (`kind` such as `assistant`) to the transcript, with its
    /// `session.message.appended` event, and returns its id.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn append_message(&self, kind: &str, data: Value) -> Result<MessageId> {
        let id = self.session_id.clone();
        let message = MessageId::generate();
        let kind = kind.to_string();
        let out = message.clone();
        self.core
            .persistence
            .write(move |w| {
                let event =
                    store::append_message(w.conn(), &id, &message, &kind, &data, store::now_ms())?;
                w.record(event);
                Ok(())
            })
            .await?;
        Ok(out)
    }

    /// Publishes a runner-defined event on the session's log (committed, then broadcast).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty, over-long or control-character name, or one of the runtime's own event names (those
    /// carry projections only the runtime may trigger); [`Error::Store`] when the write failed.
    pub async fn publish(&self, event: &str, data: Value) -> Result<EventRecord> {
        if event.is_empty() || event.len() > 128 || event.chars().any(char::is_control) {
            return Err(Error::invalid(
                "event",
                "must be 1 to 128 bytes without control characters",
            ));
        }
        if kind::BUILTIN.contains(&event) && event != kind::SYNTHETIC {
            return Err(Error::invalid(
                "event",
                format!("{event} is published by the runtime itself"),
            ));
        }
        let id = self.session_id.clone();
        let event = event.to_string();
        Ok(self
            .core
            .persistence
            .write(move |w| w.publish(&id, &event, &data))
            .await?)
    }

    /// The transcript a runner feeds the model, in order. A `user` message whose turn a user
    /// interrupted has [`Message::interrupted`] set: it must not be answered again.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn context(&self) -> Result<Vec<Message>> {
        let id = self.session_id.clone();
        Ok(self
            .core
            .persistence
            .read(move |conn| store::context(conn, &id))
            .await?)
    }
}
