//! One of a turn's two writes (its claim, its terminal) as a request the writer can see into:
//! the store may run a run of them in one round trip (`Store::prepare_turns`), and a writer
//! connection may commit one alone in one statement (`WriterConnection::commit_turn`).

use crate::id::SessionId;
use crate::outcome::Terminal;

/// One of a turn's two writes, as the writer queues it: a backend where each statement is a
/// round trip runs a run of them in one (`Store::prepare_turns`).
#[derive(Debug)]
pub(crate) struct TurnWrite {
    /// The session.
    pub(crate) session: SessionId,
    /// The fencing epoch the session's actor holds.
    pub(crate) epoch: u64,
    /// The claim or the terminal.
    pub(crate) kind: TurnWriteKind,
}

/// What a [`TurnWrite`] writes.
#[derive(Debug)]
pub(crate) enum TurnWriteKind {
    /// The claim (`Store::claim_turn`) for this process boot.
    Claim {
        /// The boot.
        boot: String,
    },
    /// The terminal (`Store::settle_turn`) of how the turn ended.
    Settle {
        /// How it ended.
        terminal: Terminal,
    },
}
