//! [`Turn`]: what a runner's drain is given — the session, how the drain was started, and
//! methods that write through the journal.

use std::sync::Arc;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::event::{kind, EventRecord};
use crate::id::{MessageId, SessionId};
use crate::journal::Journal;
use crate::records::{Admission, Message, Resumption};

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

/// One drain of a session's turn, handed to [`crate::Runner::drain`].
#[derive(Clone)]
pub struct Turn {
    journal: Journal,
    session_id: SessionId,
    cause: TurnCause,
    /// The drain's interrupt fence: its wake's admission seq (a forced drain upgraded from a
    /// wake keeps that wake's seq).
    wake_seq: Option<u64>,
    /// The fencing epoch of the session's ownership this drain runs under: every write checks
    /// it, so a node the session was taken from writes nothing more.
    epoch: u64,
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
        journal: Journal,
        session_id: SessionId,
        cause: TurnCause,
        wake_seq: Option<u64>,
        epoch: u64,
    ) -> Self {
        Self {
            journal,
            session_id,
            cause,
            wake_seq,
            epoch,
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

    /// Promotes every pending `steer` input admitted at or before `cutoff` (all when `None`)
    /// into the transcript, in admission order. Each promotion commits its
    /// `session.prompt.promoted` event, `promoted_seq` and transcript row together; concurrent
    /// promotion promotes each input exactly once.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed (nothing was promoted); [`Error::Fenced`] when
    /// another node took the session over (several nodes sharing a database): stop the drain.
    pub async fn promote_steer(&self, cutoff: Option<u64>) -> Result<Vec<Admission>> {
        Ok(self
            .journal
            .promote_steer(self.session_id.clone(), cutoff, self.epoch)
            .await?)
    }

    /// Promotes only the oldest pending `queue` input (one per turn), if any.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn promote_queue(&self) -> Result<Option<Admission>> {
        Ok(self
            .journal
            .promote_queue(self.session_id.clone(), self.epoch)
            .await?)
    }

    /// The inputs still pending in the session's inbox, in admission order.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn pending(&self) -> Result<Vec<Admission>> {
        Ok(self.journal.pending(self.session_id.clone()).await?)
    }

    /// Appends a message (`kind` such as `assistant`) to the transcript, with its
    /// `session.message.appended` event, and returns its id.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn append_message(&self, kind: &str, data: Value) -> Result<MessageId> {
        Ok(self
            .journal
            .append_message(self.session_id.clone(), kind.to_owned(), data, self.epoch)
            .await?)
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
        if (kind::BUILTIN.contains(&event) && event != kind::SYNTHETIC) || event == kind::DELETED {
            return Err(Error::invalid(
                "event",
                format!("{event} is published by the runtime itself"),
            ));
        }
        Ok(self
            .journal
            .publish(self.session_id.clone(), event.to_owned(), data, self.epoch)
            .await?)
    }

    /// The transcript a runner feeds the model, in order. A `user` message whose turn a user
    /// interrupted has [`Message::interrupted`] set: it must not be answered again.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn context(&self) -> Result<Vec<Message>> {
        Ok(self.journal.context(self.session_id.clone()).await?)
    }
}
