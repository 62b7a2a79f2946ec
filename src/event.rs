//! Durable session events: wire names and the stored [`EventRecord`].

use serde::{Deserialize, Serialize};

use crate::id::SessionId;

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
