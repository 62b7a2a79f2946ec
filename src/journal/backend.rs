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

use super::projection;
use super::rules::Settlement;
use super::rules::{self, Scan};
use super::turn_write::TurnWrite;
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::records::{Admission, Delivery, Message, MessagesQuery, Order, SessionInfo};

mod ownership;
pub(crate) mod rows;

pub(crate) use ownership::{ClaimedTurn, Nudge, Ownership, Route, Signal};
pub(crate) use rows::{
    ClaimRows, EventRows, InputRows, MessageRows, NewInput, NewMessage, OwnershipRows,
    ProjectionRows, RetentionRows, SessionRows, TurnRows,
};

/// Every statement of an engine ([`SessionRows`] … [`TurnRows`]), and what composes them
/// with a rule, written once here for every engine: promotion, paging, settle, served inputs.
pub(crate) trait Store:
    SessionRows
    + ProjectionRows
    + EventRows
    + InputRows
    + MessageRows
    + ClaimRows
    + RetentionRows
    + OwnershipRows
    + TurnRows
{
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
    /// Inserts the session with its `session.created` event; an id stored already returns the
    /// stored row and no event.
    fn create_session(
        &mut self,
        info: &SessionInfo,
    ) -> Result<(SessionInfo, Option<EventRecord>), StoreError> {
        if let Some(existing) = self.get_session(&info.id)? {
            return Ok((existing, None));
        }
        let created = SessionEvent::Created { info: info.clone() };
        let event = self.append(&info.id, &created, info.time_created)?;
        Ok((info.clone(), Some(event)))
    }
    /// Appends a runtime event (next seq of its session) and runs its projection, in the
    /// caller's transaction (in one round trip where the engine can:
    /// [`EventRows::append_projected`]).
    fn append(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        if let Some(record) = self.append_projected(session, event, now)? {
            return Ok(record);
        }
        let record = self.insert_event(session, event.kind(), event.data()?, now)?;
        projection::apply(self, session, record.seq, now, event)?;
        Ok(record)
    }
    /// Appends an event given by wire name and payload (a runner-defined event, or a built-in
    /// one by name: its projection runs), returns it.
    fn publish(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        let record = self.insert_event(session, kind, data.clone(), now)?;
        self.project(&record)?;
        Ok(record)
    }
    /// Records a step of the turn running under `epoch` (its intent or its outcome): a turn
    /// write, fenced like every other, so a node the session was taken from records nothing.
    fn record_step(
        &mut self,
        session: &SessionId,
        step: &SessionEvent,
        epoch: u64,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        self.check_fence(session, epoch)?;
        self.append(session, step, now)
    }
    /// Runs the projection of a stored event again (the rebuild of the inbox and transcript).
    fn project(&mut self, event: &EventRecord) -> Result<(), StoreError> {
        projection::project(self, event)
    }
    /// Appends a transcript message with its `session.message.appended` event.
    fn append_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        let appended = SessionEvent::MessageAppended {
            message_id: id.clone(),
            kind: kind.to_owned(),
            data: data.clone(),
        };
        self.append(session, &appended, now)
    }
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
    /// Claims a turn of `session` for boot `boot`: [`OwnershipRows::check_fence`], then
    /// appends `session.execution.started` (whose projection takes the claim) and returns it;
    /// in one round trip where the engine can ([`TurnRows::claim_turn_at_once`]).
    fn claim_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        boot: &str,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        if let Some(record) = self.claim_turn_at_once(session, epoch, boot, now)? {
            return Ok(record);
        }
        self.check_fence(session, epoch)?;
        let boot = boot.to_owned();
        self.append(
            session,
            &SessionEvent::ExecutionStarted { boot, turn: None },
            now,
        )
    }
    /// Records the terminal `event` of a turn of `session`: [`OwnershipRows::check_fence`],
    /// then, for a terminal that releases the claim, [`Store::settle`] (decided while the claim
    /// is held), then appends `event` (whose projection releases the claim). Returns what
    /// `settle` decided and the event; in one round trip where the engine can
    /// ([`TurnRows::settle_turn_at_once`]).
    fn settle_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        event: &SessionEvent,
        now: i64,
    ) -> Result<(Option<u64>, EventRecord), StoreError> {
        if let Some(done) = self.settle_turn_at_once(session, epoch, event, now)? {
            return Ok(done);
        }
        self.check_fence(session, epoch)?;
        let next = if event.releases_claim() {
            self.settle(session)?
        } else {
            None
        };
        let record = self.append(session, event, now)?;
        Ok((next, record))
    }
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
}

impl<T> Store for T where
    T: SessionRows
        + ProjectionRows
        + EventRows
        + InputRows
        + MessageRows
        + ClaimRows
        + RetentionRows
        + OwnershipRows
        + TurnRows
        + ?Sized
{
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

/// How an engine wants the writer to run its batches ([`WriterConnection::batching`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Batching {
    /// A batch first runs without per-request savepoints, all or nothing: committed as is when
    /// every request succeeds; rolled back and run again with a savepoint per request when one
    /// fails. Worth it where a savepoint costs a round trip (PostgreSQL) or copies pages
    /// (SQLite's sub-journal).
    pub(crate) optimistic: bool,
    /// A turn write alone in its batch commits in one statement
    /// ([`WriterConnection::commit_turn`]).
    pub(crate) turns_alone: bool,
    /// A run of turn writes goes to the store in one round trip ahead of their requests
    /// ([`TurnRows::prepare_turns`]).
    pub(crate) turn_runs: bool,
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
    /// How this engine wants its batches run: its performance choices, in one place. Default:
    /// a savepoint per request, every statement on its own.
    fn batching(&self) -> Batching {
        Batching::default()
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
