//! The seam between the journal and a database engine.
//!
//! The journal's operations (admit a prompt, claim a turn, sweep…) are written once, over the
//! three traits here; a backend implements them for its engine:
//! - [`Store`]: the statements, named for what they read or write (`session_exists`,
//!   `admit`, `settle`, `append`…), run on a connection inside whatever transaction the caller
//!   opened. Appending an event assigns its per-session seq and runs its projection into the
//!   tables, in the same transaction.
//! - [`WriterConnection`]: the one connection the writer thread group-commits on: begin,
//!   savepoints, commit, rollback, housekeeping, whether batches run without savepoints first.
//! - [`Readers`]: the pool that reads run on, off the writer.
//!
//! Several nodes may share one database (PostgreSQL): then a session is owned by at most one
//! node at a time, recorded with a fencing epoch that grows with every change of owner. The
//! ownership methods of [`Store`] say who owns a session and check a turn's epoch; on a
//! single-node engine (SQLite, whose file one process owns) the runtime owns every session, at
//! epoch 0, and the checks always pass.
//!
//! No signature mentions a driver type: each backend implements them over its own driver, and
//! the layers above do not change.

use serde_json::Value;

use super::rules::{self, Scan, Settlement};
use super::turn_write::TurnWrite;
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::records::{
    Admission, ClaimState, Delivery, ListQuery, Message, MessagesQuery, Order, SessionInfo,
};

mod ownership;

pub(crate) use ownership::{ClaimedTurn, Nudge, Ownership, Route, Signal};

/// The statements of the store, on one connection, inside the caller's transaction.
///
/// A method never opens or ends a transaction: the writer decides the boundary (a savepoint per
/// request, a transaction per batch), so a request is atomic whatever it calls.
pub(crate) trait Store {
    // --- sessions -------------------------------------------------------------------------

    /// The stored session, if any.
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError>;
    /// Whether the session is stored.
    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError>;
    /// Inserts the session with its `session.created` event; an id stored already returns the
    /// stored row and no event.
    fn create_session(
        &mut self,
        info: &SessionInfo,
    ) -> Result<(SessionInfo, Option<EventRecord>), StoreError>;
    /// Sessions matching `query`, keyset-paged.
    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError>;

    // --- the event log --------------------------------------------------------------------

    /// Appends a runtime event (next seq of its session), runs its projection, returns it.
    fn append(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        now: i64,
    ) -> Result<EventRecord, StoreError>;
    /// Appends an event given by wire name and payload (a runner-defined event, or a built-in
    /// one by name: its projection runs), returns it.
    fn publish(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError>;
    /// Runs the projection of a stored event again (the rebuild of the inbox and transcript).
    fn project(&mut self, event: &EventRecord) -> Result<(), StoreError>;
    /// Up to `limit` events of `session` with seq greater than `after` (all when `None`).
    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError>;
    /// The seq of the session's latest `session.interrupt.requested`, if any.
    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;

    // --- the inbox ------------------------------------------------------------------------

    /// The stored admission of input `id`, pending or promoted.
    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError>;
    /// Admits a prompt: `session.prompt.admitted` and its inbox row (the event is `None` when
    /// the id was admitted already). An id already in a transcript is a conflict, and nothing
    /// is written. (The journal's admission checks first, then calls [`admit_new`].)
    #[cfg(test)]
    fn admit(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        prompt: &Value,
        delivery: Delivery,
        now: i64,
    ) -> Result<(Admission, Option<EventRecord>), StoreError> {
        if let Some(stored) = self.get_input(id)? {
            return Ok((stored, None));
        }
        if self.transcript_owner(id)?.is_some() {
            return Err(StoreError::Conflict(format!(
                "prompt {id} is already in a transcript"
            )));
        }
        let (admission, event) = admit_new(self, session, id, prompt, delivery, now)?;
        Ok((admission, Some(event)))
    }
    /// The session's pending inputs, in admission order.
    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError>;
    /// Promotes every pending `steer` input admitted at or before `cutoff` (all when `None`),
    /// in admission order ([`rules::steer_due`]).
    fn promote_steer(
        &mut self,
        session: &SessionId,
        cutoff: Option<u64>,
        now: i64,
    ) -> Result<Vec<(Admission, EventRecord)>, StoreError> {
        let due = rules::steer_due(self.pending_inputs(session)?, cutoff);
        due.into_iter()
            .map(|input| promote(self, input, now))
            .collect()
    }
    /// Promotes the oldest pending `queue` input, if any ([`rules::queue_due`]).
    fn promote_queue(
        &mut self,
        session: &SessionId,
        now: i64,
    ) -> Result<Option<(Admission, EventRecord)>, StoreError> {
        let due = rules::queue_due(self.pending_inputs(session)?);
        due.map(|input| promote(self, input, now)).transpose()
    }
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

    // --- the transcript -------------------------------------------------------------------

    /// Appends a transcript message with its `session.message.appended` event.
    fn append_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError>;
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
    /// One page of a transcript, keyset-paged ([`rules::page`]).
    fn messages(&mut self, query: &MessagesQuery) -> Result<Vec<Message>, StoreError> {
        let anchor = match &query.cursor {
            Some(cursor) => self.message_seq(&query.session_id, &cursor.id)?,
            None => None,
        };
        let Some((scan, reversed)) = rules::page(query, anchor) else {
            return Ok(Vec::new());
        };
        let mut page = self.scan_messages(&query.session_id, scan)?;
        if reversed {
            page.reverse();
        }
        Ok(page)
    }
    /// The whole transcript of `session`, in seq order.
    fn context(&mut self, session: &SessionId) -> Result<Vec<Message>, StoreError> {
        self.messages_after(session, None)
    }
    /// The messages of `session` with seq greater than `after` (all when `None`), in seq
    /// order.
    fn messages_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<Message>, StoreError> {
        let scan = Scan {
            order: Order::Asc,
            past: after,
            limit: None,
        };
        self.scan_messages(session, scan)
    }
    /// The newest `n` messages of `session`, in seq order.
    fn messages_tail(&mut self, session: &SessionId, n: usize) -> Result<Vec<Message>, StoreError> {
        let scan = Scan {
            order: Order::Desc,
            past: None,
            limit: Some(n),
        };
        let mut tail = self.scan_messages(session, scan)?;
        tail.reverse();
        Ok(tail)
    }
    /// The session whose transcript holds message `id`, if any.
    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError>;
    /// The first message of `session` whose stored payload cannot be decoded.
    fn undecodable_message(&mut self, session: &SessionId)
        -> Result<Option<MessageId>, StoreError>;
    /// Deletes the inbox and transcript rows of `session` (before a rebuild from its log).
    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError>;
    /// How many inbox and transcript rows `session` has.
    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError>;

    // --- claims and the restart sweep -----------------------------------------------------

    /// The claim bookkeeping of `id`, or `None` when the session is not stored.
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError>;
    /// The seq of the event that took the session's current claim.
    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
    /// How many sessions hold a claim, and `now` minus the oldest claim's time.
    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError>;
    /// Settles, while the claim is held, the inbox of a turn that ends for good
    /// ([`rules::settle`]): marks the queued prompt owed the next turn and returns its
    /// admission seq, or drops the wake marks the turn had its chance to serve.
    fn settle(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        self.hold_admissions(session)?;
        let pending = self.pending_inputs(session)?;
        if pending.is_empty() {
            return Ok(None);
        }
        let fence = self.latest_interrupt_seq(session)?;
        let claim = self.claim_seq(session)?;
        let settlement = rules::settle(&pending, fence, claim, || match claim {
            Some(claim) => self.user_message_after(session, claim),
            None => Ok(false),
        })?;
        match settlement {
            Settlement::Nothing => Ok(None),
            Settlement::Owe(seq) => {
                if let Some(input) = pending.iter().find(|input| input.admitted_seq == seq) {
                    self.mark_wake(&input.id)?;
                }
                Ok(Some(seq))
            }
            Settlement::Forgive { claim } => {
                self.clear_wakes_before(session, claim)?;
                Ok(None)
            }
        }
    }
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
    /// The inputs whose prompts entered `session`'s transcript after seq `claim`, in
    /// promotion order.
    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError>;
    /// The inputs the turn claimed at `claim` promoted and had not finished, less those a
    /// user interrupt request at `fence` stopped ([`rules::served`]).
    fn served_inputs(
        &mut self,
        session: &SessionId,
        claim: u64,
        fence: Option<u64>,
    ) -> Result<Vec<Admission>, StoreError> {
        Ok(rules::served(
            self.promoted_after(session, claim)?,
            claim,
            fence,
        ))
    }
    /// Marks the `user` messages of `session` promoted after `claim` as interrupted.
    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError>;
    /// Releases every claimed child session no live turn holds: claimed by a boot other than
    /// `boot` (this process's turns are live) and, with several nodes, not owned by another live
    /// node (whose turns are live too); returns how many.
    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError>;

    // --- deletion and retention -----------------------------------------------------------

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
    /// The seq of the session's newest event (its seq counter), `None` before its first.
    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
    /// The first seq the session's log still holds for replay: 0 until events were compacted;
    /// `None` when the session is not stored.
    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError>;
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

    // --- ownership (several nodes over one database) --------------------------------------

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

    // --- a turn's two writes (each one request of the writer) ------------------------------

    /// Claims a turn of `session` for boot `boot`: [`Store::check_fence`], then appends
    /// `session.execution.started` (whose projection takes the claim) and returns it. An engine
    /// where each statement is a round trip may do all of it in one.
    fn claim_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        boot: &str,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        self.check_fence(session, epoch)?;
        let boot = boot.to_owned();
        self.append(session, &SessionEvent::ExecutionStarted { boot }, now)
    }

    /// Records the terminal `event` of a turn of `session`: [`Store::check_fence`], then, for
    /// a terminal that releases the claim, [`Store::settle`] (decided while the claim is
    /// held), then appends `event` (whose projection releases the claim). Returns what `settle`
    /// decided and the event. An engine where each statement is a round trip may do the common
    /// case in one.
    fn settle_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        event: &SessionEvent,
        now: i64,
    ) -> Result<(Option<u64>, EventRecord), StoreError> {
        self.check_fence(session, epoch)?;
        let next = if event.releases_claim() {
            self.settle(session)?
        } else {
            None
        };
        let record = self.append(session, event, now)?;
        Ok((next, record))
    }

    /// Runs `turns` (claims and terminals of distinct sessions, in this order) ahead of the
    /// requests that make them, which then take the results from their own
    /// [`Store::claim_turn`] and [`Store::settle_turn`] calls, made in the same order with the
    /// same arguments. An engine where each statement is a round trip does all of them in one;
    /// default: nothing (each call then runs its statements). An error aborts the transaction
    /// like any failed statement.
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

/// When the writer offers the engine its housekeeping ([`WriterConnection::maintain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Maintenance {
    /// After a write, in the usual course: what is due.
    AfterWrite,
    /// After a write, while a burst that should not wait for housekeeping is under way (the
    /// restart sweep, see [`crate::journal::persistence::Persistence::defer_maintenance`]):
    /// only what can wait no longer.
    Deferred,
    /// The writer has been idle for a while, or is stopping: everything there is.
    Idle,
}

/// The writer thread's connection: the transaction control the group commit needs.
pub(crate) trait WriterConnection: Send {
    /// Folds the write-ahead log into the database and truncates it (SQLite), when the writer
    /// has gone idle (`idle`: give up at once rather than wait for a reader) and when it stops.
    /// Returns whether it completed. Engines without such a log: nothing.
    fn checkpoint(&mut self, _idle: bool) -> bool {
        true
    }
    /// Housekeeping after a batch's requests were answered, and when the writer went idle or
    /// stops (`when` says which): SQLite settles its recent event entries. Other engines:
    /// nothing.
    fn maintain(&mut self, _when: Maintenance) {}
    /// Opens a write transaction (taking the write lock at once where the engine has one).
    fn begin(&mut self) -> Result<(), StoreError>;
    /// Opens the per-request savepoint.
    fn savepoint(&mut self) -> Result<(), StoreError>;
    /// Keeps the request's writes (pops its savepoint).
    fn release(&mut self) -> Result<(), StoreError>;
    /// Undoes the request's writes (then [`WriterConnection::release`] pops the savepoint).
    fn rollback_to(&mut self) -> Result<(), StoreError>;
    /// Commits the transaction.
    fn commit(&mut self) -> Result<(), StoreError>;
    /// Rolls the transaction back (nothing when none is open).
    fn rollback(&mut self);
    /// Whether a transaction is open: an engine may roll a whole transaction back on its own
    /// (SQLite does on a full disk or an I/O error), and the batch must then fail as a whole.
    fn in_transaction(&mut self) -> bool;
    /// Whether a batch first runs without per-request savepoints, all or nothing: committed as
    /// is when every request succeeds; rolled back and run again with a savepoint per request
    /// when one fails. Worth it where a savepoint costs a round trip (PostgreSQL) or copies
    /// pages (SQLite's sub-journal); default false.
    fn optimistic_batches(&self) -> bool {
        false
    }
    /// Whether [`WriterConnection::commit_turn`] may commit a turn write alone in one
    /// statement. Default false.
    fn commits_turns_alone(&self) -> bool {
        false
    }
    /// Commits `turn` alone, ahead of its request, where one statement carries the write and
    /// its commit (PostgreSQL: autocommitted, with its notification); returns whether it did.
    /// The request then runs outside any transaction, taking the result from its own
    /// [`Store::claim_turn`] or [`Store::settle_turn`] call, and nothing more is committed.
    /// When it did not (`Ok(false)`: the server refused the statement, or a terminal found
    /// inputs pending and wrote nothing), nothing of it is stored and the request runs in a
    /// transaction as usual. `Err`: whether it committed is unknown (the connection was lost),
    /// and the request fails with that error rather than run twice. Default: never.
    fn commit_turn(&mut self, turn: &TurnWrite) -> Result<bool, StoreError> {
        let _ = turn;
        Ok(false)
    }
    /// Forgets what the request of a turn committed by [`WriterConnection::commit_turn`]
    /// left behind (its appended events, its result).
    fn after_turn(&mut self) {}
    /// The statements, on this connection.
    fn store(&mut self) -> &mut dyn Store;
    /// Gives unused cache memory back (outside a transaction).
    fn release_memory(&mut self);
}

/// A read to run on a pooled connection.
pub(crate) type ReadWork<'a> = &'a mut dyn FnMut(&mut dyn Store) -> Result<(), StoreError>;

/// The pool reads run on, beside the writer.
pub(crate) trait Readers: Send + Sync {
    /// Runs `work` on a pooled connection (blocking: call it from a blocking thread).
    fn read(&self, work: ReadWork<'_>) -> Result<(), StoreError>;
    /// Gives the unused cache memory of idle connections back.
    fn release_memory(&self);
    /// How many reads can run at once (the pool's connections).
    fn size(&self) -> usize;
}

/// Appends `session.prompt.admitted` for an input the caller checked is new (neither in an
/// inbox nor in a transcript) and returns its admission.
pub(crate) fn admit_new<S: Store + ?Sized>(
    store: &mut S,
    session: &SessionId,
    id: &MessageId,
    prompt: &Value,
    delivery: Delivery,
    now: i64,
) -> Result<(Admission, EventRecord), StoreError> {
    let admitted = SessionEvent::PromptAdmitted {
        message_id: id.clone(),
        prompt: prompt.clone(),
        delivery,
    };
    let event = store.append(session, &admitted, now)?;
    let admission = Admission {
        id: id.clone(),
        session_id: session.clone(),
        admitted_seq: event.seq,
        prompt: prompt.clone(),
        delivery,
        time_created: event.time,
        promoted_seq: None,
    };
    Ok((admission, event))
}

/// Promotes one pending input by appending `session.prompt.promoted`.
fn promote<S: Store + ?Sized>(
    store: &mut S,
    mut input: Admission,
    now: i64,
) -> Result<(Admission, EventRecord), StoreError> {
    let promoted = SessionEvent::PromptPromoted {
        message_id: input.id.clone(),
        prompt: input.prompt.clone(),
        delivery: input.delivery,
    };
    let session = input.session_id.clone();
    let event = store.append(&session, &promoted, now)?;
    input.promoted_seq = Some(event.seq);
    Ok((input, event))
}
