//! Test support for users' own message-driven integration tests: a [`ScriptedRunner`] whose
//! drains complete, block until released, never end, fail or panic, per session and in order;
//! and helpers that read claims, attempts and events straight from the database file.
//!
//! With feature `testing-postgres`, the submodule `postgres` starts a throwaway PostgreSQL
//! cluster.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use tokio::sync::{watch, Notify};

use crate::error::StoreError;
use crate::event::EventRecord;
use crate::id::SessionId;
use crate::journal::inspect;
use crate::outcome::RunError;
use crate::records::ClaimState;
use crate::runner::Runner;
use crate::turn::Turn;

// The crate's own unit tests of the PostgreSQL backend use it with `postgres` alone.
#[cfg(any(feature = "testing-postgres", all(test, feature = "postgres")))]
pub mod postgres;

/// A custom drain body.
pub type DrainFn = Arc<dyn Fn(Turn) -> LocalBoxFuture<'static, Result<(), RunError>> + Send + Sync>;

/// What one drain does.
#[derive(Clone)]
pub enum Script {
    /// Returns `Ok(())` at once.
    Complete,
    /// Never ends (until cancelled).
    Never,
    /// Waits until the gate is released, then returns `Ok(())`.
    Gate(Gate),
    /// Fails with the error the function builds.
    Fail(Arc<dyn Fn() -> RunError + Send + Sync>),
    /// Panics with this message.
    Panic(String),
    /// Runs a custom body.
    Custom(DrainFn),
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Script::Complete => "Complete",
            Script::Never => "Never",
            Script::Gate(_) => "Gate",
            Script::Fail(_) => "Fail",
            Script::Panic(_) => "Panic",
            Script::Custom(_) => "Custom",
        })
    }
}

impl Script {
    /// A drain failing with `error()`.
    pub fn fail(error: impl Fn() -> RunError + Send + Sync + 'static) -> Self {
        Script::Fail(Arc::new(error))
    }

    /// A drain running `body`.
    pub fn custom<F, Fut>(body: F) -> Self
    where
        F: Fn(Turn) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), RunError>> + 'static,
    {
        Script::Custom(Arc::new(move |turn| body(turn).boxed_local()))
    }
}

/// A gate drains wait on until [`Gate::release`] is called (once, for every waiter).
#[derive(Debug, Clone)]
pub struct Gate {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Opens the gate.
    pub fn release(&self) {
        self.tx.send_replace(true);
    }

    /// Waits until the gate is open.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// One drain the scripted runner started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainRecord {
    /// The session drained.
    pub session_id: SessionId,
    /// Whether it was forced (explicit resume).
    pub forced: bool,
    /// The admission seq that woke it.
    pub wake_seq: Option<u64>,
}

#[derive(Default)]
struct State {
    scripts: HashMap<SessionId, VecDeque<Script>>,
    defaults: HashMap<SessionId, Script>,
    drains: Vec<DrainRecord>,
}

/// A [`Runner`] driven by per-session scripts; records every drain it starts.
#[derive(Clone, Default)]
pub struct ScriptedRunner {
    state: Arc<Mutex<State>>,
    started: Arc<Notify>,
}

impl std::fmt::Debug for ScriptedRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedRunner")
            .field("drains", &self.lock().drains.len())
            .finish_non_exhaustive()
    }
}

impl ScriptedRunner {
    /// A runner whose drains complete at once unless scripted otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `script` for the next unscripted drain of `session`.
    pub fn push(&self, session: &SessionId, script: Script) {
        self.lock()
            .scripts
            .entry(session.clone())
            .or_default()
            .push_back(script);
    }

    /// What every drain of `session` does once its queued scripts ran out (default `Complete`).
    pub fn set_default(&self, session: &SessionId, script: Script) {
        self.lock().defaults.insert(session.clone(), script);
    }

    /// Every drain started so far, in order.
    pub fn drains(&self) -> Vec<DrainRecord> {
        self.lock().drains.clone()
    }

    /// The drains of `session`.
    pub fn drains_of(&self, session: &SessionId) -> Vec<DrainRecord> {
        self.lock()
            .drains
            .iter()
            .filter(|d| &d.session_id == session)
            .cloned()
            .collect()
    }

    /// Waits until at least `n` drains have started in total.
    ///
    /// # Panics
    /// After `timeout`, naming how many drains started.
    pub async fn wait_for_drains(&self, n: usize, timeout: Duration) {
        self.wait_until(timeout, |s| s.drains.len() >= n, &format!("{n} drains"))
            .await;
    }

    /// Waits until `session` has had at least `n` drains.
    ///
    /// # Panics
    /// After `timeout`.
    pub async fn wait_for_drains_of(&self, session: &SessionId, n: usize, timeout: Duration) {
        let what = format!("{n} drains of {session}");
        self.wait_until(
            timeout,
            |s| s.drains.iter().filter(|d| &d.session_id == session).count() >= n,
            &what,
        )
        .await;
    }

    async fn wait_until(&self, timeout: Duration, done: impl Fn(&State) -> bool, what: &str) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.started.notified();
            if done(&self.lock()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen = self.lock().drains.len();
                panic!("timed out waiting for {what} ({seen} drains started)");
            }
        }
    }
}

impl Runner for ScriptedRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let script = {
            let mut state = self.lock();
            state.drains.push(DrainRecord {
                session_id: turn.session_id().clone(),
                forced: turn.is_forced(),
                wake_seq: turn.wake_seq(),
            });
            let id = turn.session_id().clone();
            let next = state.scripts.get_mut(&id).and_then(VecDeque::pop_front);
            next.or_else(|| state.defaults.get(&id).cloned())
                .unwrap_or(Script::Complete)
        };
        self.started.notify_waiters();
        match script {
            Script::Complete => async { Ok(()) }.boxed_local(),
            Script::Never => futures::future::pending().boxed_local(),
            Script::Gate(gate) => async move {
                gate.wait().await;
                Ok(())
            }
            .boxed_local(),
            Script::Fail(error) => async move { Err(error()) }.boxed_local(),
            Script::Panic(message) => async move { panic!("{message}") }.boxed_local(),
            Script::Custom(body) => body(turn),
        }
    }
}

/// The claim columns of `session` in the database at `path` (`None` when the row is missing).
///
/// # Errors
/// When the file cannot be read.
pub fn claim_state(path: &Path, session: &SessionId) -> Result<Option<ClaimState>, StoreError> {
    inspect::claim_state(path, session)
}

/// Whether `session` holds a claim (`time_suspended IS NOT NULL`).
///
/// # Errors
/// When the file cannot be read.
pub fn is_claimed(path: &Path, session: &SessionId) -> Result<bool, StoreError> {
    Ok(claim_state(path, session)?.is_some_and(|c| c.time_suspended.is_some()))
}

/// `resume_attempts` of `session` (0 when the row is missing).
///
/// # Errors
/// When the file cannot be read.
pub fn resume_attempts(path: &Path, session: &SessionId) -> Result<u32, StoreError> {
    Ok(claim_state(path, session)?.map_or(0, |c| c.resume_attempts))
}

/// Every stored event of `session`, in seq order: every row of its log, read straight from the
/// table (after a compaction, the latest interrupt request kept below the log's start too).
///
/// # Errors
/// When the file cannot be read.
pub fn events(path: &Path, session: &SessionId) -> Result<Vec<EventRecord>, StoreError> {
    inspect::events(path, session)
}

/// Every stored event of `session` with wire name `kind`, in seq order.
///
/// # Errors
/// When the file cannot be read.
pub fn events_of_kind(
    path: &Path,
    session: &SessionId,
    kind: &str,
) -> Result<Vec<EventRecord>, StoreError> {
    Ok(events(path, session)?
        .into_iter()
        .filter(|e| e.kind == kind)
        .collect())
}

/// Marks `session` claimed by an earlier boot with `attempts` resume attempts, as a crashed
/// process would have left it (for sweep tests): the claim is taken at the session's latest
/// event, as if that were the turn's `session.execution.started`.
///
/// # Errors
/// When the file cannot be written or the session is missing.
pub fn seed_claim(path: &Path, session: &SessionId, attempts: u32) -> Result<(), StoreError> {
    inspect::seed_claim(path, session, attempts)
}

/// A turn a process claimed and died in the middle of, as [`seed_crashed_turn`] writes it:
/// what it had done, in order. The next runtime's restart sweep resumes it (a restart notice
/// and a claim), and its drain's [`crate::Turn::resumption`] names the inputs it promoted and
/// the steps it left ambiguous.
///
/// ```no_run
/// # use durable_sessions::{testing::{self, CrashedTurn}, SessionId, MessageId};
/// # fn seed(path: &std::path::Path, session: &SessionId) -> Result<(), Box<dyn std::error::Error>> {
/// let crashed = CrashedTurn::new()
///     .promoted(MessageId::new("p1")?, serde_json::json!({ "text": "pay the invoice" }))
///     .completed_step("lookup", serde_json::json!({ "amount": 42 }))
///     .started_step("pay"); // the process died inside the payment
/// let turn = testing::seed_crashed_turn(path, session, &crashed)?;
/// # let _ = turn; Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct CrashedTurn {
    done: Vec<inspect::Seeded>,
}

impl CrashedTurn {
    /// A turn that had done nothing yet beyond its claim.
    pub fn new() -> Self {
        Self::default()
    }

    /// It promoted prompt `id` (admitted as a `steer` prompt just before the turn claimed).
    pub fn promoted(mut self, id: crate::id::MessageId, prompt: serde_json::Value) -> Self {
        self.done.push(inspect::Seeded::Promoted(id, prompt));
        self
    }

    /// It appended a message of `kind` (such as `assistant`).
    pub fn message(mut self, kind: &str, data: serde_json::Value) -> Self {
        self.done
            .push(inspect::Seeded::Message(kind.to_owned(), data));
        self
    }

    /// It ran step `name` to the value `result`.
    pub fn completed_step(mut self, name: &str, result: serde_json::Value) -> Self {
        self.done
            .push(inspect::Seeded::Step(name.to_owned(), Some(Ok(result))));
        self
    }

    /// It ran step `name` to a failure with `message`.
    pub fn failed_step(mut self, name: &str, message: &str) -> Self {
        self.done.push(inspect::Seeded::Step(
            name.to_owned(),
            Some(Err(message.to_owned())),
        ));
        self
    }

    /// It recorded step `name`'s intent and died in its body: the step is ambiguous.
    pub fn started_step(mut self, name: &str) -> Self {
        self.done.push(inspect::Seeded::Step(name.to_owned(), None));
        self
    }
}

/// Writes `turn` into the database at `path` as a process that claimed a turn of `session`
/// (a boot named `seeded`) and died would have left it, in one transaction, and returns the
/// turn's id ([`crate::Turn::id`]). Seed while no runtime runs on the database; the next
/// runtime's start resumes it. On PostgreSQL the session is left owned by no node.
///
/// # Errors
/// When the database cannot be written, the session is missing, or it holds a claim already.
pub fn seed_crashed_turn(
    path: &Path,
    session: &SessionId,
    turn: &CrashedTurn,
) -> Result<u64, StoreError> {
    inspect::seed_crashed_turn(path, session, turn.done.clone())
}
