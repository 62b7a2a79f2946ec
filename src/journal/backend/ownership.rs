//! What a backend tells the journal about who owns a session and what other nodes asked of
//! it: the ownership and routing answers of [`super::Store`], and the signals of a database
//! shared by several nodes. On a single-node engine only [`Ownership::Owned`] at epoch 0 and
//! [`Route::Local`] occur.

use crate::id::SessionId;

/// Who owns a session, as [`Store::acquire`] found (and maybe changed) it.
#[allow(dead_code)] // the multi-node variants are built by the PostgreSQL backend
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// This node owns it, with this fencing epoch (taken now, or held already).
    Owned {
        /// The fencing epoch: every turn write of this node carries it.
        epoch: u64,
    },
    /// Another node, whose lease is live, owns it.
    Elsewhere {
        /// That node's id.
        node: String,
    },
    /// The session is not stored.
    Missing,
}

/// Where the wake of an admission or the interrupt of a request must be carried out.
#[allow(dead_code)] // the multi-node variants are built by the PostgreSQL backend
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// On this node (it owns the session, or nobody live does and this node will take it).
    Local,
    /// On the live node that owns the session, which this transaction notified (delivered at
    /// COMMIT).
    Remote {
        /// That node's id.
        node: String,
    },
}

/// What a request asks the owner of a session to do, when another node received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nudge {
    /// Wake the session for the prompt admitted at this seq.
    Wake(u64),
    /// Interrupt the session's running turn: a user interrupt request committed at this seq.
    Interrupt(u64),
}

/// What the database tells a node that shares it with other nodes (PostgreSQL `NOTIFY`,
/// delivered at the notifying transaction's COMMIT, and the node's own lease keeping).
#[allow(dead_code)] // the multi-node variants are built by the PostgreSQL backend
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Another node admitted a prompt or committed an interrupt request for a session this
    /// node owns: carry it out here.
    Nudge {
        /// The session.
        session: SessionId,
        /// What to do.
        nudge: Nudge,
    },
    /// Other nodes committed events of these sessions, with these seqs (`from..=to`); read
    /// them from the store.
    Events(Vec<(SessionId, u64, u64)>),
    /// Other nodes committed events of more sessions than one notification names: every live
    /// follower re-reads its session from the store.
    ManyEvents,
    /// Another node deleted these sessions (each with the seq its `session.deleted` carries):
    /// end their streams here and forget their actors.
    Deleted(Vec<(SessionId, u64)>),
    /// Notifications may have been missed (the listener reconnected), or another node left or
    /// lapsed: scan the store for work this node owes (unserved intents of owned sessions,
    /// sessions of dead nodes to take over).
    Rescan,
    /// This node's lease lapsed (or the database was unreachable for longer than the lease):
    /// nothing it acquired under that id is its own any more; it cancels those sessions'
    /// drains and forgets them. What it acquired under a later id (it rejoins at once) stays.
    LeaseLost {
        /// The generation of the node id whose lease was lost (see
        /// [`Store::acquire_under`](super::Store::acquire_under)).
        generation: u64,
    },
}

/// What the restart sweep reads of a claimed turn ([`Store::claimed_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimedTurn {
    /// The seq of the event that took the claim.
    pub(crate) claim: Option<u64>,
    /// The seq of the session's latest interrupt request.
    pub(crate) fence: Option<u64>,
}
