//! [`Turn`]: what a runner's drain is given — the session, how the drain was started, methods
//! that write through the journal, reads of the transcript (whole, after a cursor, or its
//! tail), live-only events, which go to the session's open streams and never to the store,
//! and durable steps (`turn::steps`).

mod deadline;
mod inputs;
mod steps;

pub(crate) use self::deadline::Deadline;

pub use self::steps::MAX_STEP_RESULT_BYTES;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::error::{Error, Result, StoreError};
use crate::event::{kind, EventRecord, LiveEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::ledger::Ledger;
use crate::journal::Journal;
use crate::outcome::RunError;
use crate::records::{Message, Resumption};

/// Where a turn's live-only events go: the runtime's per-session routes to its open event
/// streams (`service::fanout`). Session actors are handed it in their `Environment`, so `turn`
/// imports nothing above it.
pub(crate) trait LiveSink: Send + Sync {
    /// Hands `event` to the open streams of its session that take live events; never blocks,
    /// never waits for a reader (a stream whose buffer is full misses it).
    fn publish(&self, event: Arc<LiveEvent>);
}

/// [`Shared::state`]: the drain runs.
const OPEN: u8 = 0;
/// [`Shared::state`]: the drain returned or was cancelled.
const ENDED: u8 = 1;
/// [`Shared::state`]: a write of the drain was fenced (another node owns the session now).
const FENCED: u8 = 2;

/// What every clone of one drain's [`Turn`] shares.
#[derive(Debug)]
struct Shared {
    /// [`OPEN`], [`ENDED`] or [`FENCED`]: checked in memory before a live event is published,
    /// so a clone kept past its drain (or a drain another node took over) publishes nothing.
    state: AtomicU8,
    /// The seq of the newest durable event this turn committed (its claim, then its own
    /// writes): [`LiveEvent::after_seq`] of what it publishes live.
    committed: AtomicU64,
    /// The first store fault a read or write of the drain met: a failed drain is then kept
    /// claimed and resumed, not recorded as the runner's failure.
    store_fault: Mutex<Option<StoreError>>,
    /// The step names this drain called: a name called twice is refused.
    names: Mutex<HashSet<String>>,
    /// [`Turn::take_inputs`] handed out the resumption's inputs.
    resumed_taken: AtomicBool,
}

/// Marks its drain's [`Turn`]s ended when dropped: the session actor keeps one inside the
/// drain's future, so it ends with the future (returned, failed, panicked or cancelled).
pub(crate) struct DrainEnd(Arc<Shared>);

impl Drop for DrainEnd {
    fn drop(&mut self) {
        // A fenced turn stays fenced: that is the better answer to a late publisher.
        let _ = self
            .0
            .state
            .compare_exchange(OPEN, ENDED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Tells whether a drain's reads or writes found the store unavailable (see
/// [`Turn::fault_probe`]).
pub(crate) struct FaultProbe(Arc<Shared>);

impl FaultProbe {
    /// The store fault a read or write of the drain met first, if any.
    pub(crate) fn store_fault(&self) -> Option<StoreError> {
        self.0
            .store_fault
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

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
    /// A retry of the session's last turn, which had failed (`Sessions::retry`, `POST
    /// /sessions/{id}/retry`): the next attempt of that turn, with the same id; its completed
    /// steps replay, its failed ones run again, and the resumption names the inputs it had
    /// promoted.
    Retry(Arc<Resumption>),
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
    /// Whether the drain still runs, and the newest seq it committed; shared by its clones.
    shared: Arc<Shared>,
    /// Where [`Turn::publish_live`] hands its events.
    live: Arc<dyn LiveSink>,
    /// The turn's id, attempt and steps, shared by the drains of one execution.
    ledger: Arc<Mutex<Ledger>>,
    /// No drain of the turn ran before this one.
    first: bool,
    /// The turn's deadline, shared by the drains of one execution and watched by its actor.
    deadline: Option<Arc<Deadline>>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("session_id", &self.session_id)
            .field("cause", &self.cause)
            .field("id", &self.id())
            .field("attempt", &self.attempt())
            .finish_non_exhaustive()
    }
}

/// Where a drain runs and what it starts from (the arguments of [`Turn::new`] beyond the
/// journal, the session and the cause).
pub(crate) struct TurnSetup {
    /// The drain's interrupt fence (its wake's admission seq).
    pub(crate) wake_seq: Option<u64>,
    /// The fencing epoch the drain writes under.
    pub(crate) epoch: u64,
    /// The seq of the newest durable event of the turn before the drain starts (its claim's
    /// `session.execution.started`, or the restart notice of a resumed turn).
    pub(crate) committed: u64,
    /// Where live-only events go.
    pub(crate) live: Arc<dyn LiveSink>,
    /// The turn's ledger (its id, attempt and steps), shared by the drains of its execution.
    pub(crate) ledger: Arc<Mutex<Ledger>>,
    /// No drain of the turn ran before this one.
    pub(crate) first: bool,
    /// The turn's deadline (see [`Turn::set_deadline`]).
    pub(crate) deadline: Option<Arc<Deadline>>,
}

impl Turn {
    pub(crate) fn new(
        journal: Journal,
        session_id: SessionId,
        cause: TurnCause,
        setup: TurnSetup,
    ) -> Self {
        Self {
            journal,
            session_id,
            cause,
            wake_seq: setup.wake_seq,
            epoch: setup.epoch,
            shared: Arc::new(Shared {
                state: AtomicU8::new(OPEN),
                committed: AtomicU64::new(setup.committed),
                store_fault: Mutex::new(None),
                names: Mutex::new(HashSet::new()),
                resumed_taken: AtomicBool::new(false),
            }),
            live: setup.live,
            ledger: setup.ledger,
            first: setup.first,
            deadline: setup.deadline,
        }
    }

    /// Reads the ledger of turn `id` (a resumed or retried drain's) before the drain runs,
    /// and names its ambiguous steps in the resumption.
    pub(crate) async fn load_ledger(&mut self, id: u64) -> std::result::Result<(), RunError> {
        let ledger = self
            .journal
            .turn_ledger(self.session_id.clone(), id)
            .await
            .map_err(|e| RunError::from(self.failed(e)))?;
        let open = ledger.open();
        *self.ledger() = ledger;
        let named = |resumption: &Arc<Resumption>| {
            let mut resumption = Resumption::clone(resumption);
            resumption.steps = open;
            Arc::new(resumption)
        };
        self.cause = match &self.cause {
            TurnCause::Recovery(r) => TurnCause::Recovery(named(r)),
            TurnCause::Retry(r) => TurnCause::Retry(named(r)),
            other => other.clone(),
        };
        Ok(())
    }

    /// The ledger this drain shares with its execution.
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The guard that marks this drain's turns ended when it is dropped (see [`DrainEnd`]).
    pub(crate) fn end_guard(&self) -> DrainEnd {
        DrainEnd(self.shared.clone())
    }

    /// A handle that tells, after the drain, whether the store failed it.
    pub(crate) fn fault_probe(&self) -> FaultProbe {
        FaultProbe(self.shared.clone())
    }

    /// Remembers that this turn committed event `seq`.
    fn committed(&self, seq: u64) {
        self.shared.committed.fetch_max(seq, Ordering::AcqRel);
    }

    /// The error a read or write returned, remembering a fence (later live events are refused
    /// too) and a store fault (the drain's failure is then the store's, not the runner's).
    fn failed(&self, error: StoreError) -> Error {
        if matches!(error, StoreError::Fenced { .. }) {
            self.shared.state.store(FENCED, Ordering::Release);
        }
        if error.unavailable().is_some() {
            let mut fault = self
                .shared
                .store_fault
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if fault.is_none() {
                *fault = Some(error.duplicate());
            }
        }
        error.into()
    }

    /// Why this drain runs.
    pub fn cause(&self) -> &TurnCause {
        &self.cause
    }

    /// For a turn the restart sweep resumed, or one retried, what it resumes: the inputs the
    /// earlier attempt promoted and did not finish, and its ambiguous steps.
    pub fn resumption(&self) -> Option<&Resumption> {
        match &self.cause {
            TurnCause::Recovery(resumption) | TurnCause::Retry(resumption) => Some(resumption),
            _ => None,
        }
    }

    /// The turn's id: the seq of the event that first claimed it. The same in every drain and
    /// every attempt of the turn (a resume after a crash or a shutdown, a retry), so it names
    /// the turn to external systems; step keys are built from it.
    pub fn id(&self) -> u64 {
        self.ledger().turn
    }

    /// Which attempt of the turn this drain belongs to: 1 for the first, then one more for each
    /// resume (after a crash, a shutdown or a store fault) and each retry.
    pub fn attempt(&self) -> u32 {
        self.ledger().attempt
    }

    /// Whether this drain is the turn's very first: attempt 1, and no drain of the turn ran
    /// before it (a turn may run several drains, when prompts arrive while it runs).
    pub fn is_first_drain(&self) -> bool {
        self.first
    }

    /// The turn's steps as its ledger holds them (every attempt's), in the order they first
    /// started.
    pub fn steps(&self) -> Vec<crate::step::StepRecord> {
        self.ledger().steps()
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

    /// Sets the turn's deadline: past `at`, the turn is interrupted and recorded as
    /// `interrupted{timeout}`, its claim released (as `RuntimeBuilder::turn_timeout` does). A
    /// later call replaces an earlier one; the earlier of this deadline and the runtime's
    /// `turn_timeout` applies. It holds for the rest of the turn, its later drains included; a
    /// turn resumed after a restart starts with no deadline of its own.
    pub fn set_deadline(&self, at: std::time::Instant) {
        if let Some(deadline) = &self.deadline {
            deadline.set(at);
        }
    }

    /// When the turn is due to end (the earlier of `turn_timeout` from its start and
    /// [`Turn::set_deadline`]), if it has a deadline.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.deadline.as_ref().and_then(|d| d.due())
    }

    /// Appends a message (`kind` such as `assistant`) to the transcript, with its
    /// `session.message.appended` event, and returns its id.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn append_message(&self, kind: &str, data: Value) -> Result<MessageId> {
        let (id, seq) = self
            .journal
            .append_message(self.session_id.clone(), kind.to_owned(), data, self.epoch)
            .await
            .map_err(|e| self.failed(e))?;
        self.committed(seq);
        Ok(id)
    }

    /// Publishes a runner-defined event on the session's log (committed, then broadcast). For
    /// progress that need not be stored (the words of a reply being generated), see
    /// [`Turn::publish_live`].
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty, over-long or control-character name, or one of the runtime's own event names (those
    /// carry projections only the runtime may trigger); [`Error::Store`] when the write failed.
    pub async fn publish(&self, event: &str, data: Value) -> Result<EventRecord> {
        check_name(event)?;
        if (kind::BUILTIN.contains(&event) && event != kind::SYNTHETIC) || event == kind::DELETED {
            return Err(Error::invalid(
                "event",
                format!("{event} is published by the runtime itself"),
            ));
        }
        let record = self
            .journal
            .publish(self.session_id.clone(), event.to_owned(), data, self.epoch)
            .await
            .map_err(|e| self.failed(e))?;
        self.committed(record.seq);
        Ok(record)
    }

    /// Publishes a **live-only** event: handed at once to the session's open streams
    /// ([`crate::Sessions::stream`], and over HTTP the SSE stream `GET /sessions/{id}/events`,
    /// as a frame without `id:`) and never stored: no seq, no commit, no database write. Meant
    /// for progress that the durable log should not grow by, such as the words of a reply
    /// being generated (append the finished reply once, with [`Turn::append_message`]).
    ///
    /// Lossy by design: a stream opened (or reconnected) later gets the durable events it
    /// missed and only the live events published from then on; a stream too far behind to
    /// take it misses it. A stream yields a live event after every durable event this turn had
    /// committed before publishing it ([`LiveEvent::after_seq`]). With several nodes sharing a
    /// PostgreSQL database, live events reach the streams open on the node running the turn
    /// only (durable events reach every node's).
    ///
    /// It costs no I/O: the event is checked, wrapped once in an `Arc`, and handed to each of
    /// the session's streams (none when nobody follows the session).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty, over-long or control-character name, or one of
    /// the runtime's own event names; [`Error::TurnEnded`] when the drain this turn was given
    /// to has ended (a clone kept past it, or a drain an interrupt cancelled);
    /// [`Error::Fenced`] when a write of this drain was fenced (another node owns the session).
    pub fn publish_live(&self, event: &str, data: Value) -> Result<()> {
        check_name(event)?;
        if kind::BUILTIN.contains(&event) {
            return Err(Error::invalid(
                "event",
                format!("{event} is published by the runtime itself"),
            ));
        }
        match self.shared.state.load(Ordering::Acquire) {
            OPEN => {}
            FENCED => {
                return Err(Error::Fenced {
                    session_id: self.session_id.clone(),
                })
            }
            _ => {
                return Err(Error::TurnEnded {
                    session_id: self.session_id.clone(),
                })
            }
        }
        self.live.publish(Arc::new(LiveEvent {
            session_id: self.session_id.clone(),
            kind: event.to_owned(),
            data,
            time: crate::journal::now_ms(),
            after_seq: self.shared.committed.load(Ordering::Acquire),
        }));
        Ok(())
    }

    /// The transcript a runner feeds the model, in order. A `user` message whose turn a user
    /// interrupted has [`Message::interrupted`] set: it must not be answered again.
    ///
    /// It reads the whole transcript, so its cost grows with the session: a runner that keeps
    /// what it read (or needs only the recent part) reads [`Turn::context_after`] or
    /// [`Turn::context_tail`] instead.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn context(&self) -> Result<Vec<Message>> {
        self.journal
            .context(self.session_id.clone())
            .await
            .map_err(|e| self.failed(e))
    }

    /// The transcript messages with [`Message::seq`] greater than `after` (all when `None`),
    /// in order: what was added since a message the runner already has. The cursor is a
    /// message's `seq` (any event seq works: a message's seq is the seq of the event that
    /// created it), read with one indexed range scan, so the cost is that of the messages
    /// returned, not of the session's history.
    ///
    /// Messages before the cursor are not read again, so a change to one of them is not seen
    /// here: [`Message::interrupted`] is set on the `user` messages of a turn when a user
    /// interrupts it, which is after its drain ended; a later drain re-reads from the oldest
    /// message it must act on (e.g. from [`Admission::promoted_seq`](crate::Admission::promoted_seq)), as the demo agent does.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn context_after(&self, after: Option<u64>) -> Result<Vec<Message>> {
        self.journal
            .context_after(self.session_id.clone(), after)
            .await
            .map_err(|e| self.failed(e))
    }

    /// The newest `n` transcript messages, in order (oldest of them first): a bounded window
    /// of the conversation, read with one indexed scan from the end.
    ///
    /// # Errors
    /// [`Error::Store`] when the read failed.
    pub async fn context_tail(&self, n: usize) -> Result<Vec<Message>> {
        self.journal
            .context_tail(self.session_id.clone(), n)
            .await
            .map_err(|e| self.failed(e))
    }
}

/// Checks a runner-defined event name: 1 to 128 bytes without control characters.
fn check_name(event: &str) -> Result<()> {
    if event.is_empty() || event.len() > 128 || event.chars().any(char::is_control) {
        return Err(Error::invalid(
            "event",
            "must be 1 to 128 bytes without control characters",
        ));
    }
    Ok(())
}
