//! The messages a `SessionActor` handles. Replies travel in oneshot channels carried by the
//! message, so a caller can first wait for delivery (the turn is registered) and then, separately,
//! for the outcome.

use actix::Message;
use futures::channel::oneshot;

use crate::error::Error;
use crate::outcome::{InterruptReason, Terminal};

/// An advisory wake, fenced by the admission seq that caused it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Wake {
    /// The admission seq, if any.
    pub(crate) seq: Option<u64>,
    /// Told why an unsequenced wake was refused (the session has an interrupt fence); dropped
    /// unanswered otherwise.
    pub(crate) refused: Option<oneshot::Sender<Error>>,
}

/// An explicit resume: start a turn or join the running one.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Resume {
    /// Receives how the joined turn ended.
    pub(crate) reply: oneshot::Sender<Result<Terminal, Error>>,
    /// Set by the restart sweep, which already committed the claim (`session.execution.started`)
    /// of this turn: if the resume starts a turn, it goes straight to the drain, whose cause is
    /// this recovery.
    pub(crate) recovery: Option<std::sync::Arc<crate::records::Resumption>>,
}

/// Run the next attempt of the session's last turn, which failed (`Sessions::retry`): when no
/// turn runs, its claim is committed, then the turn drains as a retry.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Retry {
    /// Told once the retry's claim committed, or why there is none.
    pub(crate) started: oneshot::Sender<Result<(), Error>>,
    /// Receives how the retried turn ended.
    pub(crate) reply: oneshot::Sender<Result<Terminal, Error>>,
}

/// The healer found a claim of this process on the session with no live turn: unless a turn
/// runs, start one that heals it (see `session::heal`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Heal;

/// Interrupt the running turn.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Interrupt {
    /// The interrupt fence (seq of `session.interrupt.requested`), if any.
    pub(crate) seq: Option<u64>,
    /// Why.
    pub(crate) reason: InterruptReason,
    /// Receives whether a running turn was interrupted, after its cleanup committed.
    pub(crate) reply: oneshot::Sender<bool>,
}

/// Wait until no turn runs.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct AwaitIdle {
    /// Answered when idle.
    pub(crate) reply: oneshot::Sender<()>,
}

/// Graceful shutdown: cancel the running drain (reason shutdown, claim kept), start nothing new.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Close;

/// Asks a session actor to stop if it is still idle and nothing waits on it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Passivate;

/// This node lost the lease of one of its ids (several nodes sharing a database): an actor that
/// acquired its session under that id stops at once, recording nothing; the node that takes
/// the session over resumes its turn. Any other actor carries on.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Fence {
    /// The generation of the node id whose lease was lost ([`super::Stamp::node`]).
    pub(crate) node: u64,
}

/// The session was deleted: forget what was loaded of it and stop once no turn runs (a turn
/// still running finds its session gone at its next write, is fenced, and the actor stops
/// after it settles).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct SessionDeleted;
