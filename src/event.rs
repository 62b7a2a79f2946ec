//! Session events: the durable events the runtime publishes itself, typed ([`SessionEvent`]),
//! their wire names ([`kind`]), the stored [`EventRecord`] every event becomes, and the
//! [`LiveEvent`] a runner publishes to live subscribers only.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::id::{MessageId, SessionId};
use crate::outcome::{InterruptReason, SessionError, Terminal};
use crate::records::{Delivery, SessionInfo};

/// Wire names of the events the runtime itself publishes (the `type` column).
pub mod kind {
    /// A session row was created.
    pub const CREATED: &str = "session.created";
    /// A turn started; commits with the claim.
    pub const EXECUTION_STARTED: &str = "session.execution.started";
    /// A turn ended naturally; commits with the release.
    pub const EXECUTION_SUCCEEDED: &str = "session.execution.succeeded";
    /// A turn failed (or its resume budget ran out); commits with the release.
    pub const EXECUTION_FAILED: &str = "session.execution.failed";
    /// A turn was interrupted; releases unless the reason is `shutdown`.
    pub const EXECUTION_INTERRUPTED: &str = "session.execution.interrupted";
    /// A prompt was admitted to the inbox; commits with the `session_input` row.
    pub const PROMPT_ADMITTED: &str = "session.prompt.admitted";
    /// A pending prompt was promoted into the transcript.
    pub const PROMPT_PROMOTED: &str = "session.prompt.promoted";
    /// A user asked to interrupt the session; its seq is the interrupt fence.
    pub const INTERRUPT_REQUESTED: &str = "session.interrupt.requested";
    /// The session's model was switched.
    pub const MODEL_SWITCHED: &str = "session.model.switched";
    /// A synthetic notice, such as the restart "continue" notice.
    pub const SYNTHETIC: &str = "session.synthetic";
    /// A runner appended a message to the transcript.
    pub const MESSAGE_APPENDED: &str = "session.message.appended";
    /// A step's intent: its body is about to run (`Turn::step`).
    pub const STEP_STARTED: &str = "session.step.started";
    /// A step's body returned a value: its recorded outcome.
    pub const STEP_COMPLETED: &str = "session.step.completed";
    /// A step's body returned an error: its recorded outcome.
    pub const STEP_FAILED: &str = "session.step.failed";

    /// The session was deleted ([`crate::Sessions::delete`]). Never stored (the log went with
    /// the session): delivered live to the session's open event streams, with the seq after
    /// its last event, as their last item before they end.
    pub const DELETED: &str = "session.deleted";

    /// Every wire name the runtime projects into tables.
    pub const BUILTIN: &[&str] = &[
        CREATED,
        EXECUTION_STARTED,
        EXECUTION_SUCCEEDED,
        EXECUTION_FAILED,
        EXECUTION_INTERRUPTED,
        PROMPT_ADMITTED,
        PROMPT_PROMOTED,
        INTERRUPT_REQUESTED,
        MODEL_SWITCHED,
        SYNTHETIC,
        MESSAGE_APPENDED,
        STEP_STARTED,
        STEP_COMPLETED,
        STEP_FAILED,
    ];
}

/// The exact text of the notice published before a turn is resumed after a restart.
pub const RESTART_NOTICE_TEXT: &str = "The server restarted while you were working. Continue from where you left off without repeating completed work.";
/// The description of the restart notice.
pub const RESTART_NOTICE_DESCRIPTION: &str = "Continuing after restart";
/// The message of the `aborted` failure recorded when a turn exhausts its resume budget.
pub const ABORTED_MESSAGE: &str =
    "Execution was interrupted repeatedly and will not be resumed automatically.";

/// One committed event of a session's ordered log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The session (aggregate) the event belongs to.
    pub session_id: SessionId,
    /// Per-session sequence number: 0, 1, 2, … with no gaps.
    pub seq: u64,
    /// The wire name, such as `session.execution.started`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The JSON payload.
    pub data: serde_json::Value,
    /// Commit time in milliseconds since the Unix epoch.
    pub time: i64,
}

/// A live-only event a runner published with [`crate::Turn::publish_live`]: handed to the
/// session's open streams on this node ([`crate::Sessions::stream`], SSE) and never stored. It
/// has no seq, so it cannot be replayed: a stream that reconnects gets the durable events it
/// missed and only the live events published from then on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveEvent {
    /// The session the event belongs to.
    pub session_id: SessionId,
    /// The runner-defined name, such as `agent.delta`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The JSON payload.
    pub data: serde_json::Value,
    /// Publish time in milliseconds since the Unix epoch.
    pub time: i64,
    /// The seq of the newest durable event the publishing turn had committed when it published
    /// this one (its claim's `session.execution.started`, or a later write of its own): a
    /// stream yields this event only after that one, so a live event never overtakes the
    /// durable events its turn wrote before it.
    pub after_seq: u64,
}

/// An event the runtime publishes itself. Serialized adjacently tagged, as `{"type": <wire
/// name>, "data": <payload>}`: the payload is exactly what is stored and what clients read in
/// an [`EventRecord`]'s `data`. The projections (claims, the inbox, the transcript) match on these
/// variants. Runner-defined events (`Turn::publish`) are not typed: they have no projection.
///
/// A client reads an [`EventRecord`] of one of these kinds back as a `SessionEvent` by
/// deserializing `{"type": record.kind, "data": record.data}`:
///
/// ```
/// use durable_sessions::{kind, SessionEvent};
///
/// let data = serde_json::json!({ "reason": "user" });
/// let tagged = serde_json::json!({ "type": kind::EXECUTION_INTERRUPTED, "data": data });
/// let event: SessionEvent = serde_json::from_value(tagged).unwrap();
/// assert_eq!(event.kind(), kind::EXECUTION_INTERRUPTED);
/// assert_eq!(event.data().unwrap(), data);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum SessionEvent {
    /// A session row was created (always seq 0).
    #[serde(rename = "session.created")]
    Created {
        /// The row as created.
        info: SessionInfo,
    },
    /// A turn started: its projection takes the claim.
    #[serde(rename = "session.execution.started")]
    ExecutionStarted {
        /// The process boot that claimed the turn.
        #[serde(default)]
        boot: String,
        /// Set on a retry ([`crate::Sessions::retry`]): the id of the turn this claim is the
        /// next attempt of (the seq that first claimed it), which the claim keeps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn: Option<u64>,
    },
    /// A turn ended naturally: releases the claim.
    #[serde(rename = "session.execution.succeeded")]
    ExecutionSucceeded {},
    /// A turn failed (or ran out of resume attempts, `aborted`): releases the claim.
    #[serde(rename = "session.execution.failed")]
    ExecutionFailed {
        /// What went wrong.
        error: SessionError,
    },
    /// A turn was interrupted: releases the claim, except for a shutdown.
    #[serde(rename = "session.execution.interrupted")]
    ExecutionInterrupted {
        /// Why.
        reason: InterruptReason,
    },
    /// A prompt entered the inbox.
    #[serde(rename = "session.prompt.admitted")]
    PromptAdmitted {
        /// The prompt's message id.
        #[serde(rename = "messageID")]
        message_id: MessageId,
        /// The prompt.
        prompt: Value,
        /// How it enters a turn.
        delivery: Delivery,
    },
    /// A pending prompt entered the transcript.
    #[serde(rename = "session.prompt.promoted")]
    PromptPromoted {
        /// The prompt's message id.
        #[serde(rename = "messageID")]
        message_id: MessageId,
        /// The prompt.
        prompt: Value,
        /// How it entered the turn.
        delivery: Delivery,
    },
    /// A runner appended a message to the transcript.
    #[serde(rename = "session.message.appended")]
    MessageAppended {
        /// The message id.
        #[serde(rename = "messageID")]
        message_id: MessageId,
        /// The message type, such as `assistant`.
        #[serde(rename = "type")]
        kind: String,
        /// The payload.
        data: Value,
    },
    /// A step's intent, committed before its body runs (`Turn::step`).
    #[serde(rename = "session.step.started")]
    StepStarted {
        /// The turn's id ([`crate::Turn::id`]).
        turn: u64,
        /// The step's name, unique within the turn.
        step: String,
        /// The attempt of the turn that runs it ([`crate::Turn::attempt`]).
        attempt: u32,
        /// The step's idempotency key, the same in every attempt of the turn.
        key: String,
    },
    /// A step's body returned a value.
    #[serde(rename = "session.step.completed")]
    StepCompleted {
        /// The turn's id.
        turn: u64,
        /// The step's name.
        step: String,
        /// The attempt of the turn that ran it.
        attempt: u32,
        /// The body's value, as JSON: what a later drain of the turn gets back.
        result: Value,
    },
    /// A step's body returned an error.
    #[serde(rename = "session.step.failed")]
    StepFailed {
        /// The turn's id.
        turn: u64,
        /// The step's name.
        step: String,
        /// The attempt of the turn that ran it.
        attempt: u32,
        /// What went wrong.
        error: SessionError,
    },
    /// A user asked to interrupt the session; its seq is the interrupt fence.
    #[serde(rename = "session.interrupt.requested")]
    InterruptRequested {
        /// The session.
        #[serde(rename = "sessionID")]
        session_id: SessionId,
    },
    /// The session's model was switched.
    #[serde(rename = "session.model.switched")]
    ModelSwitched {
        /// The session.
        #[serde(rename = "sessionID")]
        session_id: SessionId,
        /// A fresh message id naming the switch.
        #[serde(rename = "messageID")]
        message_id: MessageId,
        /// The new model.
        model: Value,
    },
    /// The restart sweep's "continue" notice (runners may publish other synthetic events,
    /// untyped).
    #[serde(rename = "session.synthetic")]
    RestartNotice {
        /// The session.
        #[serde(rename = "sessionID")]
        session_id: SessionId,
        /// [`RESTART_NOTICE_TEXT`].
        text: String,
        /// [`RESTART_NOTICE_DESCRIPTION`].
        description: String,
    },
}

impl SessionEvent {
    /// The event that records how a turn ended.
    pub fn terminal(terminal: &Terminal) -> Self {
        match terminal {
            Terminal::Succeeded => SessionEvent::ExecutionSucceeded {},
            Terminal::Failed { error } => SessionEvent::ExecutionFailed {
                error: error.clone(),
            },
            Terminal::Interrupted { reason } => {
                SessionEvent::ExecutionInterrupted { reason: *reason }
            }
        }
    }

    /// The [`Terminal`] a turn terminal event records; `None` for any other event.
    pub(crate) fn as_terminal(&self) -> Option<Terminal> {
        match self {
            SessionEvent::ExecutionSucceeded {} => Some(Terminal::Succeeded),
            SessionEvent::ExecutionFailed { error } => Some(Terminal::Failed {
                error: error.clone(),
            }),
            SessionEvent::ExecutionInterrupted { reason } => {
                Some(Terminal::Interrupted { reason: *reason })
            }
            _ => None,
        }
    }

    /// The restart notice for `session`.
    pub fn restart_notice(session: &SessionId) -> Self {
        SessionEvent::RestartNotice {
            session_id: session.clone(),
            text: RESTART_NOTICE_TEXT.into(),
            description: RESTART_NOTICE_DESCRIPTION.into(),
        }
    }

    /// The `aborted` failure of a turn over its resume budget.
    pub fn aborted() -> Self {
        SessionEvent::ExecutionFailed {
            error: SessionError::new("aborted", ABORTED_MESSAGE),
        }
    }

    /// The wire name (the `type` column).
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::Created { .. } => kind::CREATED,
            SessionEvent::ExecutionStarted { .. } => kind::EXECUTION_STARTED,
            SessionEvent::ExecutionSucceeded {} => kind::EXECUTION_SUCCEEDED,
            SessionEvent::ExecutionFailed { .. } => kind::EXECUTION_FAILED,
            SessionEvent::ExecutionInterrupted { .. } => kind::EXECUTION_INTERRUPTED,
            SessionEvent::PromptAdmitted { .. } => kind::PROMPT_ADMITTED,
            SessionEvent::PromptPromoted { .. } => kind::PROMPT_PROMOTED,
            SessionEvent::MessageAppended { .. } => kind::MESSAGE_APPENDED,
            SessionEvent::InterruptRequested { .. } => kind::INTERRUPT_REQUESTED,
            SessionEvent::ModelSwitched { .. } => kind::MODEL_SWITCHED,
            SessionEvent::RestartNotice { .. } => kind::SYNTHETIC,
            SessionEvent::StepStarted { .. } => kind::STEP_STARTED,
            SessionEvent::StepCompleted { .. } => kind::STEP_COMPLETED,
            SessionEvent::StepFailed { .. } => kind::STEP_FAILED,
        }
    }

    /// The payload (`data`), as stored and sent: keys in the order `serde_json` sorts them.
    ///
    /// # Errors
    /// When a payload cannot be encoded as JSON (a map with non-string keys in a prompt).
    pub fn data(&self) -> Result<Value, serde_json::Error> {
        let mut tagged = serde_json::to_value(self)?;
        Ok(tagged["data"].take())
    }

    /// Decodes a stored event of a kind that has a projection (`session.created`, the
    /// `session.execution.*` events, admissions, promotions and appended messages); `None` for
    /// any other kind, whose payload the runtime never reads back.
    ///
    /// # Errors
    /// When the payload does not have the shape of its kind: the log is inconsistent.
    pub(crate) fn projected(kind: &str, data: &Value) -> Option<Result<Self, serde_json::Error>> {
        if !PROJECTED.contains(&kind) {
            return None;
        }
        let tagged = serde_json::json!({ "type": kind, "data": data });
        Some(serde_json::from_value(tagged))
    }

    /// Decodes a stored step or claim event (`session.step.*`, `session.execution.*`) for the
    /// turn ledger; `None` for any other kind.
    pub(crate) fn of_turn(kind: &str, data: &Value) -> Option<Result<Self, serde_json::Error>> {
        if !kind.starts_with("session.step.") && !kind.starts_with("session.execution.") {
            return None;
        }
        let tagged = serde_json::json!({ "type": kind, "data": data });
        Some(serde_json::from_value(tagged))
    }

    /// Whether recording this event releases the session's claim: every terminal of a turn
    /// but an interruption by shutdown, which keeps the claim for the next boot.
    pub(crate) fn releases_claim(&self) -> bool {
        match self {
            SessionEvent::ExecutionSucceeded {} | SessionEvent::ExecutionFailed { .. } => true,
            SessionEvent::ExecutionInterrupted { reason } => *reason != InterruptReason::Shutdown,
            _ => false,
        }
    }
}

/// The kinds whose projections write tables.
const PROJECTED: &[&str] = &[
    kind::CREATED,
    kind::EXECUTION_STARTED,
    kind::EXECUTION_SUCCEEDED,
    kind::EXECUTION_FAILED,
    kind::EXECUTION_INTERRUPTED,
    kind::PROMPT_ADMITTED,
    kind::PROMPT_PROMOTED,
    kind::MESSAGE_APPENDED,
];

#[cfg(test)]
mod tests;
