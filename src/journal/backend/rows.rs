//! The statements of the store, one trait a table (or concern), each implemented by an engine
//! in the file named for that table: run on one connection, inside the caller's transaction.
//!
//! A method never opens or ends a transaction: the writer decides the boundary, so a request is
//! atomic whatever it calls.

use serde_json::Value;

use super::ownership::{ClaimedTurn, Nudge, Ownership, Route};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::rules::{ClaimRow, Scan};
use crate::journal::turn_write::TurnWrite;
use crate::records::{Admission, ClaimState, Delivery, ListQuery, Message, SessionInfo};

/// The session table.
pub(crate) trait SessionRows {
    /// The stored session, if any.
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError>;
    /// Whether the session is stored.
    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError>;
    /// Sessions matching `query`, keyset-paged.
    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError>;
}

/// The event log: appends (each with its projection) and reads.
pub(crate) trait EventRows {
    /// Inserts an event with the next seq of `session`'s log, without its projection.
    fn insert_event(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: Value,
        time: i64,
    ) -> Result<EventRecord, StoreError>;
    /// Appends `event` and runs its projection in one round trip where the engine can (the
    /// result is that of [`append_event`]); `None`: the statements run one by one.
    fn append_projected(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        time: i64,
    ) -> Result<Option<EventRecord>, StoreError> {
        let _ = (session, event, time);
        Ok(None)
    }
    /// Up to `limit` events of `session` with seq greater than `after` (all when `None`).
    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError>;
    /// The seq of the session's latest `session.interrupt.requested`, if any.
    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
    /// The seq of the session's newest event (its seq counter), `None` before its first.
    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
    /// The first seq the session's log still holds for replay: 0 until events were compacted;
    /// `None` when the session is not stored.
    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
}

/// The inbox: admitted prompts and their wake marks.
pub(crate) trait InputRows {
    /// The stored admission of input `id`, pending or promoted.
    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError>;
    /// The session's pending inputs, in admission order.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError>;
    /// Marks a pending input as owed a turn (its wake mark).
    fn mark_wake(&mut self, id: &MessageId) -> Result<(), StoreError>;
    /// Drops the wake marks of every pending input of `session`.
    fn clear_wakes(&mut self, session: &SessionId) -> Result<(), StoreError>;
    /// Drops the wake marks of the pending inputs of `session` admitted before `seq`.
    fn clear_wakes_before(&mut self, session: &SessionId, seq: u64) -> Result<(), StoreError>;
    /// Holds `session`'s admissions until the transaction ends: one another node has in
    /// flight commits first, a later one takes a seq after this transaction's events
    /// (PostgreSQL: the sequence row `FOR UPDATE`). Single-node engines: nothing.
    fn hold_admissions(&mut self, session: &SessionId) -> Result<(), StoreError> {
        let _ = session;
        Ok(())
    }
    /// Whether `session` holds a pending input owed a turn.
    fn owes_turn(&mut self, session: &SessionId) -> Result<bool, StoreError>;
    /// The inputs whose prompts entered `session`'s transcript after seq `claim`, in
    /// promotion order.
    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError>;
}

/// The transcript.
pub(crate) trait MessageRows {
    /// Message `id` if it belongs to `session`.
    fn get_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<Message>, StoreError>;
    /// The seq of message `id` in `session`'s transcript (a page's cursor).
    fn message_seq(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<u64>, StoreError>;
    /// The messages of `session` in the range `scan` names, in its order: one range scan of
    /// the `(session_id, seq)` index.
    fn scan_messages(
        &mut self,
        session: &SessionId,
        scan: Scan,
    ) -> Result<Vec<Message>, StoreError>;
    /// Whether `session`'s transcript holds a `user` message with seq greater than `seq` (a
    /// turn claimed at `seq` promoted a prompt).
    fn user_message_after(&mut self, session: &SessionId, seq: u64) -> Result<bool, StoreError>;
    /// The session whose transcript holds message `id`, if any.
    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError>;
    /// The first message of `session` whose stored payload cannot be decoded.
    fn undecodable_message(&mut self, session: &SessionId)
        -> Result<Option<MessageId>, StoreError>;
    /// Deletes the inbox and transcript rows of `session` (before a rebuild from its log).
    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError>;
    /// How many inbox and transcript rows `session` has.
    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError>;
    /// Marks the `user` messages of `session` promoted after `claim` as interrupted.
    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError>;
}

/// Claims, resume counting and the restart sweep's listings.
pub(crate) trait ClaimRows: EventRows {
    /// The claim bookkeeping of `id`, or `None` when the session is not stored.
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError>;
    /// The seq of the event that took the session's current claim.
    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
    /// How many sessions hold a claim, and `now` minus the oldest claim's time.
    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError>;
    /// Claimed top-level sessions, oldest claim first, except those claimed by `exclude_boot`.
    fn list_claimed(&mut self, exclude_boot: Option<&str>) -> Result<Vec<SessionId>, StoreError>;
    /// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
    fn own_claims(&mut self, boot: &str) -> Result<Vec<(SessionId, u64)>, StoreError>;
    /// Unclaimed top-level sessions holding a pending input owed a turn.
    fn adoptable(&mut self) -> Result<Vec<SessionId>, StoreError>;
    /// Counts one resume attempt of a session claimed by another boot and takes the claim for
    /// `boot`; `None` when it is no longer claimed by another boot.
    fn count_resume(&mut self, id: &SessionId, boot: &str) -> Result<Option<u32>, StoreError>;
    /// Counts one more attempt of the turn `boot` itself claimed at seq `claim` (a turn of this
    /// process the store failed under, resumed in place); `None` when that claim is not held.
    fn count_own_resume(
        &mut self,
        id: &SessionId,
        boot: &str,
        claim: u64,
    ) -> Result<Option<u32>, StoreError>;
    /// Counts one attempt of an unclaimed session owed a turn; `None` when it is claimed.
    fn count_adoption(&mut self, id: &SessionId) -> Result<Option<u32>, StoreError>;
    /// [`Store::count_resume`] of each of `ids`, in their order: those counted, with their
    /// attempts. An engine where each statement is a round trip may count them all in one.
    fn count_resumes(
        &mut self,
        ids: &[SessionId],
        boot: &str,
    ) -> Result<Vec<(SessionId, u32)>, StoreError> {
        let mut counted = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(attempts) = self.count_resume(id, boot)? {
                counted.push((id.clone(), attempts));
            }
        }
        Ok(counted)
    }
    /// What the sweep reads of a turn claimed by `boot`: `None` when `id` holds no claim of
    /// `boot` (or is gone); else the seq that took the claim ([`Store::claim_seq`]) and the
    /// latest interrupt request ([`Store::latest_interrupt_seq`]). An engine may read them in
    /// one statement.
    fn claimed_turn(
        &mut self,
        id: &SessionId,
        boot: &str,
    ) -> Result<Option<ClaimedTurn>, StoreError> {
        let claimed = self
            .claim_state(id)?
            .is_some_and(|c| c.time_suspended.is_some() && c.claim_boot.as_deref() == Some(boot));
        if !claimed {
            return Ok(None);
        }
        let fence = self.latest_interrupt_seq(id)?;
        let claim = self.claim_seq(id)?;
        Ok(Some(ClaimedTurn { claim, fence }))
    }
    /// Releases every claimed child session no live turn holds: claimed by a boot other than
    /// `boot` (this process's turns are live) and, with several nodes, not owned by another live
    /// node (whose turns are live too); returns how many.
    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError>;
}

/// Deletion and compaction.
pub(crate) trait RetentionRows {
    /// `session` and every session below it (its children, theirs…), `session` first; empty
    /// when it is not stored.
    fn session_tree(&mut self, session: &SessionId) -> Result<Vec<SessionId>, StoreError>;
    /// Holds the rows of `sessions` until the transaction ends, so that no other node's claim
    /// or turn write commits between this request's checks and its writes (PostgreSQL:
    /// `SELECT … FOR UPDATE`). Single-node engines: nothing (one writer serializes every write).
    fn lock_sessions(&mut self, sessions: &[SessionId]) -> Result<(), StoreError>;
    /// Deletes every row keyed by `session` — its row, inbox, transcript, event log and seq
    /// counter — and, with several nodes, tells the others (delivered at COMMIT). Sessions
    /// below it are not touched: the journal deletes a whole tree, one session at a time.
    fn delete_session(&mut self, session: &SessionId) -> Result<(), StoreError>;
    /// Up to `limit` unclaimed sessions whose log holds more than `keep_last` events and whose
    /// newest event was committed before `idle_before` (ms).
    fn compactable(
        &mut self,
        keep_last: u64,
        idle_before: i64,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError>;
    /// Compacts the log of `session` if it still qualifies (see [`Store::compactable`]):
    /// deletes its events below the new start (its newest seq + 1 − `keep_last`) except the
    /// latest interrupt request (the durable interrupt fence, kept and hidden from replay), and
    /// records the new start. Returns the new start and how many events were deleted.
    fn compact(
        &mut self,
        session: &SessionId,
        keep_last: u64,
        idle_before: i64,
    ) -> Result<Option<(u64, usize)>, StoreError>;
}

/// Ownership of sessions by nodes over one database.
pub(crate) trait OwnershipRows {
    /// Takes `session` for this node if no live node owns it (a new epoch), or returns the
    /// epoch this node holds; [`Ownership::Elsewhere`] when a live node owns it. Single-node
    /// engines: `Owned { epoch: 0 }` for every stored session.
    fn acquire(&mut self, session: &SessionId) -> Result<Ownership, StoreError>;
    /// [`Store::acquire`], with the generation of the node id it ran under (what a
    /// [`Signal::LeaseLost`] of that generation fences). Single-node engines: generation 0,
    /// which no signal names.
    fn acquire_under(&mut self, session: &SessionId) -> Result<(Ownership, u64), StoreError> {
        Ok((self.acquire(session)?, 0))
    }
    /// Fails with [`StoreError::Fenced`] unless this node owns `session` at `epoch`; holds the
    /// session's row until COMMIT, so no change of owner commits between the check and the
    /// request's writes. Every write of a turn calls it first. Single-node engines: Ok for
    /// every stored session. A session that is not stored (deleted under a running turn) is
    /// fenced on every engine: the turn writes nothing more to it.
    fn check_fence(&mut self, session: &SessionId, epoch: u64) -> Result<(), StoreError>;
    /// Gives up this node's ownership of `sessions` (passivated actors, a graceful shutdown).
    /// Claims are kept. Single-node engines: nothing.
    #[allow(dead_code)] // called by the multi-node runtime
    fn release_ownership(&mut self, sessions: &[SessionId]) -> Result<(), StoreError>;
    /// Where `nudge` for `session` must be carried out: here, or on the live node that owns
    /// it, which this call notifies in the current transaction. Single-node engines: `Local`.
    fn route(&mut self, session: &SessionId, nudge: Nudge) -> Result<Route, StoreError>;
    /// What other nodes asked of the sessions this node owns that may never have reached it
    /// (their notification was lost): a wake for each unclaimed session holding an input owed a
    /// turn, admitted before `before` (ms); an interrupt for each claimed session whose latest
    /// interrupt request, made before `before`, is newer than its claim. Single-node engines
    /// lose no notification: nothing.
    fn missed_nudges(&mut self, before: i64) -> Result<Vec<(SessionId, Nudge)>, StoreError>;
}

/// A turn's two writes, each one request of the writer.
/// A turn's two writes in one round trip each, where the engine can; each is otherwise
/// composed of the statements above by [`Store::claim_turn`] and [`Store::settle_turn`].
///
/// [`Store::claim_turn`]: super::Store::claim_turn
/// [`Store::settle_turn`]: super::Store::settle_turn
pub(crate) trait TurnRows {
    /// The claim of a turn (the fence check, `session.execution.started` and its projection)
    /// in one round trip; `None`: the statements run one by one.
    fn claim_turn_at_once(
        &mut self,
        session: &SessionId,
        epoch: u64,
        boot: &str,
        now: i64,
    ) -> Result<Option<EventRecord>, StoreError> {
        let _ = (session, epoch, boot, now);
        Ok(None)
    }
    /// The terminal of a turn (the fence check, the settle of its inbox for a terminal that
    /// releases the claim, the terminal and its projection) in one round trip where it can;
    /// `None`: the statements run one by one.
    fn settle_turn_at_once(
        &mut self,
        session: &SessionId,
        epoch: u64,
        event: &SessionEvent,
        now: i64,
    ) -> Result<Option<(Option<u64>, EventRecord)>, StoreError> {
        let _ = (session, epoch, event, now);
        Ok(None)
    }
    /// Runs `turns` (claims and terminals of distinct sessions, in this order) ahead of the
    /// requests that make them, which then take the results from their own claim and settle
    /// calls, made in the same order with the same arguments. An engine where each statement
    /// is a round trip does all of them in one; default: nothing. An error aborts the
    /// transaction like any failed statement.
    fn prepare_turns(&mut self, turns: &[&TurnWrite], now: i64) -> Result<(), StoreError> {
        let _ = (turns, now);
        Ok(())
    }
    /// The SQLite connection under this store, for the writer's unit tests (which write raw
    /// rows); `None` for another engine.
    #[cfg(test)]
    fn as_sqlite(&mut self) -> Option<&rusqlite::Connection> {
        None
    }
}

/// An inbox row as the projection of `session.prompt.admitted` writes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewInput<'a> {
    /// The session admitting the prompt.
    pub(crate) session: &'a SessionId,
    /// The prompt's message id.
    pub(crate) id: &'a MessageId,
    /// The seq of `session.prompt.admitted`.
    pub(crate) seq: u64,
    /// The prompt.
    pub(crate) prompt: &'a Value,
    /// How it enters a turn.
    pub(crate) delivery: Delivery,
    /// When it was admitted.
    pub(crate) time: i64,
}

/// A transcript row as a projection writes it (a promotion, or `session.message.appended`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewMessage<'a> {
    /// The session whose transcript it joins.
    pub(crate) session: &'a SessionId,
    /// The message id.
    pub(crate) id: &'a MessageId,
    /// The message type (`user` for a promoted prompt).
    pub(crate) kind: &'a str,
    /// The seq of the event that wrote it.
    pub(crate) seq: u64,
    /// The message's data.
    pub(crate) data: &'a Value,
    /// When it was written.
    pub(crate) time: i64,
}

/// The row writes a projection is made of, as a backend's statements perform them.
pub(crate) trait ProjectionRows: ClaimRows + MessageRows {
    /// Inserts the session row of `session.created`.
    fn insert_session(&mut self, info: &SessionInfo) -> Result<(), StoreError>;
    /// Writes `claim` as `session`'s claim if the session has no claim row (the common case:
    /// one statement); false when a row is there or the session is not stored (nothing
    /// written).
    fn insert_claim(&mut self, session: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError>;
    /// The claim row of `session`, if it has one.
    fn claim_row(&mut self, session: &SessionId) -> Result<Option<ClaimRow>, StoreError>;
    /// Writes `claim` as `session`'s claim, its counted resume attempts unchanged; whether the
    /// session is stored (nothing is written when it is not).
    fn write_claim(&mut self, session: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError>;
    /// Releases the claim of `session`.
    fn release(&mut self, session: &SessionId) -> Result<(), StoreError>;
    /// Inserts the inbox row of an admitted prompt unless its id is in a transcript (false:
    /// nothing written). An id already in the inbox is a [`StoreError::Conflict`].
    fn insert_input(&mut self, row: &NewInput<'_>) -> Result<bool, StoreError>;
    /// Marks the pending inbox row `id` of `session` promoted at `seq`; false when there is no
    /// such pending row (nothing written).
    fn mark_promoted(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
    ) -> Result<bool, StoreError>;
    /// Inserts a transcript row.
    fn insert_message(&mut self, row: &NewMessage<'_>) -> Result<(), StoreError>;
    /// Inserts the transcript row of `session.message.appended` unless its id is an inbox id
    /// (false: nothing written). An id or seq already in a transcript is a
    /// [`StoreError::Conflict`].
    fn insert_appended(&mut self, row: &NewMessage<'_>) -> Result<bool, StoreError>;
}
