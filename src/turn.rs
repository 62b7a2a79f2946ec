//! [`Turn`]: what a runner's drain is given.

use crate::id::SessionId;

/// One drain of a session's turn, handed to [`crate::Runner::drain`].
#[derive(Debug, Clone)]
pub struct Turn {
    session_id: SessionId,
    forced: bool,
    wake_seq: Option<u64>,
}

impl Turn {
    /// The session this turn belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// True for an explicit resume, false for an advisory wake.
    pub fn is_forced(&self) -> bool {
        self.forced
    }

    /// The admission seq that woke this drain, if any.
    pub fn wake_seq(&self) -> Option<u64> {
        self.wake_seq
    }
}
