//! Errors: [`StoreError`] for the store (SQLite, or PostgreSQL with the `postgres` feature) and
//! the umbrella [`Error`] users see.

use std::path::PathBuf;

use crate::id::{InvalidId, MessageId, SessionId};

mod database;

pub use database::DatabaseError;

/// A `Result` whose error defaults to the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failure of the store: connection pool, SQL, schema, payload encoding, or ownership.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database reported an error: SQLite (disk full, read-only, locked or corrupt files,
    /// SQL errors), PostgreSQL (feature `postgres`), or no pooled connection could be had. The
    /// driver's own error is the [`source`](std::error::Error::source); whether the fault clears
    /// by itself is [`StoreError::unavailable`].
    #[error(transparent)]
    Database(DatabaseError),
    /// This node no longer owns the session: another node took it over (its fencing epoch is
    /// newer than `epoch`), so this write was rejected and nothing of it was stored.
    #[error("session {session_id} is owned by another node (this node's epoch {epoch} is stale)")]
    Fenced {
        /// The session.
        session_id: SessionId,
        /// The epoch this node held.
        epoch: u64,
    },
    /// The database was written by a newer version of this crate.
    #[error("database schema version {found} is newer than the newest this crate knows ({known})")]
    SchemaTooNew {
        /// `PRAGMA user_version` found in the file.
        found: i64,
        /// The newest version this crate can migrate to.
        known: i64,
    },
    /// The SQLite database file is missing or empty, while its write-ahead log beside it
    /// holds committed transactions (a bad restore, a damaged copy): opening it would start an
    /// empty database, and SQLite would delete the log. Refused at start, before anything opens
    /// the file; both files are left as they are. Restore the database file (the log belongs
    /// to it), or move the log away to start with an empty database.
    #[error(
        "database file {} is missing or empty, but its write-ahead log {} holds committed \
         transactions: restore {} (the log belongs to it), or move {} away to start with an \
         empty database",
        .database.display(),
        .wal.display(),
        .database.display(),
        .wal.display()
    )]
    WalWithoutDatabase {
        /// The database file.
        database: PathBuf,
        /// Its write-ahead log (`<database>-wal`).
        wal: PathBuf,
    },
    /// A JSON payload could not be encoded or decoded.
    #[error("json payload: {0}")]
    Json(#[from] serde_json::Error),
    /// A stored row violates an invariant the crate relies on.
    #[error("inconsistent store: {0}")]
    Inconsistent(String),
    /// A write conflicted with what is stored; carried through a batch as a typed reason.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The persistence actor has stopped and accepts no more requests.
    #[error("persistence actor has stopped")]
    Closed,
    /// The writer thread could not be started.
    #[error("cannot start the writer thread: {0}")]
    WriterThread(#[source] std::io::Error),
    /// A read's blocking task failed (it panicked or was cancelled).
    #[error("a read task failed: {0}")]
    ReadTask(#[source] tokio::task::JoinError),
    /// The store could not be reached or written for a while (a copy of such an error for a
    /// second caller, see [`StoreError::unavailable`]).
    #[error("store unavailable ({kind}): {message}")]
    Unavailable {
        /// What kind of fault.
        kind: Unavailable,
        /// The store's own words.
        message: String,
    },
}

/// Why the store cannot take a write now: a fault of the store, its file or its server that
/// clears without the caller changing anything. Turns are kept claimed across it and resumed
/// once the store answers again; over HTTP it is a `503` with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unavailable {
    /// The disk (or the database's quota) is full.
    Full,
    /// The database file, its directory or the server is read-only.
    ReadOnly,
    /// An I/O error reading or writing the database.
    Io,
    /// Another process holds the database's lock past the busy timeout.
    Busy,
    /// The connection to the database server is lost, or the server is restarting.
    Connection,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unavailable::Full => "the disk is full",
            Unavailable::ReadOnly => "the database is read-only",
            Unavailable::Io => "an I/O error",
            Unavailable::Busy => "the database is locked by another process",
            Unavailable::Connection => "the database cannot be reached",
        })
    }
}

impl StoreError {
    /// Whether the error is SQLite's "database is locked/busy" (the fault may clear on retry).
    pub fn is_busy(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.unavailable() == Some(Unavailable::Busy))
    }
}

impl StoreError {
    /// The kind of store fault, when the error is one that clears by itself (disk full,
    /// read-only file, I/O error, a lock held past the busy timeout, a lost or restarting
    /// server, no pooled connection to be had); `None` for errors of the request or the data.
    pub fn unavailable(&self) -> Option<Unavailable> {
        match self {
            StoreError::Database(e) => e.unavailable(),
            StoreError::Unavailable { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Whether the engine says the failed statement may succeed if run again: a deadlock with
    /// another node's transaction, a serialization failure or a lock wait that timed out
    /// (PostgreSQL). The writer runs such a request again.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.is_transient())
    }

    /// The database's error, if it is one.
    fn database(&self) -> Option<&DatabaseError> {
        match self {
            StoreError::Database(e) => Some(e),
            _ => None,
        }
    }

    /// The PostgreSQL error, if it is one (the backend reads its SQLSTATE).
    #[cfg(feature = "postgres")]
    pub(crate) fn as_postgres(&self) -> Option<&postgres::Error> {
        self.database().and_then(DatabaseError::as_postgres)
    }

    /// `f` of the PostgreSQL error, if it is one; else this error as it is.
    #[cfg(feature = "postgres")]
    pub(crate) fn map_postgres(self, f: impl FnOnce(postgres::Error) -> StoreError) -> StoreError {
        match self {
            StoreError::Database(e) => e.into_postgres().map_or_else(StoreError::Database, f),
            other => other,
        }
    }

    /// A copy of this error for a second caller (rusqlite errors are not `Clone`): SQLite failures
    /// keep their code, anything else keeps its message.
    pub(crate) fn duplicate(&self) -> StoreError {
        if let Some(copy) = self
            .database()
            .and_then(DatabaseError::duplicate_sqlite_failure)
        {
            return StoreError::Database(copy);
        }
        match self {
            StoreError::Closed => StoreError::Closed,
            StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
            StoreError::Fenced { session_id, epoch } => StoreError::Fenced {
                session_id: session_id.clone(),
                epoch: *epoch,
            },
            other => match other.unavailable() {
                Some(kind) => StoreError::Unavailable {
                    kind,
                    message: other.to_string(),
                },
                None => StoreError::Inconsistent(other.to_string()),
            },
        }
    }
}

/// Why [`crate::Sessions::retry`] refused: only a last turn that ended `failed` (or
/// `aborted`) is run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotRetryable {
    /// A turn holds the session's claim: running, or left for the restart sweep.
    #[error("a turn is in flight")]
    TurnInFlight,
    /// No turn has run (or its records were compacted away).
    #[error("no turn has run")]
    NoTurn,
    /// The last turn succeeded.
    #[error("the last turn succeeded")]
    Succeeded,
    /// The last turn was interrupted by a user (or a request came after it): an interrupt
    /// sticks.
    #[error("the last turn was interrupted")]
    Interrupted,
}

/// Everything that can go wrong when calling the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No session with this id is stored.
    #[error("session not found: {session_id}")]
    NotFound {
        /// The id that was looked up.
        session_id: SessionId,
    },
    /// A prompt id was reused with different content, delivery or session, or is already in a
    /// transcript. Nothing was written.
    #[error("prompt {message_id} conflicts with what is recorded for session {session_id}")]
    PromptConflict {
        /// The session the conflicting record belongs to.
        session_id: SessionId,
        /// The reused message id.
        message_id: MessageId,
    },
    /// The session (or one below it) has a turn in flight — running in this process, on
    /// another node, or left claimed by an earlier process for the restart sweep — so it was
    /// not deleted. Nothing was written; interrupt the turn, or delete with `force`.
    #[error("session {session_id} has a turn in flight; interrupt it first, or delete with force")]
    SessionBusy {
        /// The session whose turn holds it.
        session_id: SessionId,
    },
    /// The session's events before `first_seq` were compacted away (retention): a replay from
    /// before that point, or a rebuild from the whole log, cannot be served.
    #[error(
        "the events of session {session_id} before seq {first_seq} were compacted; its log now \
         starts at seq {first_seq}"
    )]
    EventsCompacted {
        /// The session.
        session_id: SessionId,
        /// The first seq the log still holds (replay from `first_seq - 1`, or from the start).
        first_seq: u64,
    },
    /// A stored transcript message could not be decoded.
    #[error("failed to decode message {message_id} in session {session_id}")]
    MessageDecode {
        /// The session holding the message.
        session_id: SessionId,
        /// The message that failed to decode.
        message_id: MessageId,
    },
    /// The caller's input was rejected before anything was written.
    #[error("invalid input: {field}: {reason}")]
    InvalidInput {
        /// Which input was wrong (`session_id`, `prompt`, `limit`, ...).
        field: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// The store failed; nothing of the failed operation was committed.
    #[error(transparent)]
    Store(StoreError),
    /// The runtime is shutting down and accepts no new work.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// Several nodes share the database and another node took this session over — or the
    /// session was deleted under its turn: this node's write was rejected (nothing of it was
    /// stored) and its turn was cancelled.
    #[error("session {session_id} is owned by another node; this node's write was rejected")]
    Fenced {
        /// The session.
        session_id: SessionId,
    },
    /// The drain this [`crate::Turn`] was given to has ended (it returned, failed, or was
    /// cancelled by an interrupt or a shutdown): a clone kept past it publishes nothing live.
    #[error("session {session_id}: the drain this turn belongs to has ended")]
    TurnEnded {
        /// The session.
        session_id: SessionId,
    },
    /// An unsequenced wake ([`crate::Execution::wake`] with `seq: None`) of a session with a
    /// durable interrupt request ([`crate::Sessions::interrupt`]): the wake names no admission,
    /// so it cannot be told apart from a wake the interrupt covers, and it was refused — no
    /// turn was started. This holds for as long as the session has that request (it is
    /// stored). To serve work admitted after it, wake with that work's admission seq (greater
    /// than `interrupt_seq`); to make an attempt regardless, `resume` the session.
    #[error(
        "session {session_id}: an unsequenced wake is refused after the interrupt request at seq \
         {interrupt_seq}; wake with the admission seq of newer work, or resume the session"
    )]
    WakeAfterInterrupt {
        /// The session.
        session_id: SessionId,
        /// The seq of the session's latest `session.interrupt.requested` (its interrupt fence).
        interrupt_seq: u64,
    },
    /// A step's body returned an error ([`crate::Turn::step`]), now or in an earlier drain of
    /// the turn (its recorded outcome, replayed).
    #[error("session {session_id}: step {step} failed: {}", error.message)]
    StepFailed {
        /// The session.
        session_id: SessionId,
        /// The step's name.
        step: String,
        /// What the body returned, as recorded.
        error: crate::outcome::SessionError,
    },
    /// [`crate::Turn::step_once`] refused to run a step again whose intent is recorded and
    /// whose outcome is not: its effect may or may not have happened. Reconcile (look the
    /// effect up by `key`), then record what you found under another step name.
    #[error(
        "session {session_id}: step {step} is ambiguous (started {attempts} time(s) without a recorded outcome); reconcile by its key {key}"
    )]
    Ambiguous {
        /// The session.
        session_id: SessionId,
        /// The step's name.
        step: String,
        /// Its idempotency key.
        key: String,
        /// How many times its body was started.
        attempts: u32,
    },
    /// A drain called a step name it had already called: names are unique within a turn
    /// (name each call of a loop, e.g. `tool:{call_id}`). Nothing was recorded.
    #[error("session {session_id}: step {step} was already called in this drain")]
    DuplicateStep {
        /// The session.
        session_id: SessionId,
        /// The step's name.
        step: String,
    },
    /// A step's value is larger, as JSON, than the limit: its outcome is recorded as a failure
    /// of type `result_too_large` (the body ran), which later drains get as
    /// [`Error::StepFailed`].
    #[error("session {session_id}: the result of step {step} is {bytes} bytes, over {limit}")]
    StepResultTooLarge {
        /// The session.
        session_id: SessionId,
        /// The step's name.
        step: String,
        /// Its size as JSON.
        bytes: usize,
        /// The limit ([`crate::MAX_STEP_RESULT_BYTES`]).
        limit: usize,
    },
    /// A step's recorded value does not decode as the type the drain asks for now.
    #[error("session {session_id}: the recorded result of step {step} does not decode: {reason}")]
    StepDecode {
        /// The session.
        session_id: SessionId,
        /// The step's name.
        step: String,
        /// What the decoder said.
        reason: String,
    },
    /// [`crate::Sessions::retry`] found no failed turn to run again; nothing was written.
    #[error("session {session_id}: nothing to retry: {why}")]
    NotRetryable {
        /// The session.
        session_id: SessionId,
        /// Why.
        why: NotRetryable,
    },
    /// A configuration value was out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The task that carries a call through (so that a caller who stops waiting cannot cut it
    /// in the middle) failed: it panicked or its arbiter stopped.
    #[error("the {task} task failed: {source}")]
    Task {
        /// Which call's task: `prompt`, `interrupt` or `delete`.
        task: &'static str,
        /// Why it failed.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A message could not be delivered to the session's actor: the actors it found kept
    /// stopping before handling it. Nothing was done; the call may be retried.
    #[error("session {session_id}: its actor kept stopping before handling a message")]
    Undeliverable {
        /// The session.
        session_id: SessionId,
    },
    /// Another runtime — in another process, or in this one — owns the database file: it holds
    /// the lock on `<path>.lock`. Nothing was written.
    #[error(
        "database {} is in use by another runtime{}; one process owns a database file",
        .path.display(),
        held_by(*.pid)
    )]
    DatabaseInUse {
        /// The database file.
        path: PathBuf,
        /// The holder's process id, as it recorded it in the lock file (`None` when it could
        /// not be read).
        pid: Option<u32>,
    },
    /// The database's lock file (`<database>.lock`) could not be created or locked, e.g.
    /// because the database's directory does not exist. Nothing was written.
    #[error("cannot lock the database through {}: {source}", .path.display())]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The " (pid N)" part of [`Error::DatabaseInUse`]'s message, when the pid is known.
fn held_by(pid: Option<u32>) -> String {
    pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }
}

impl From<InvalidId> for Error {
    fn from(e: InvalidId) -> Self {
        Error::InvalidInput {
            field: e.field,
            reason: e.reason,
        }
    }
}

impl From<StoreError> for Error {
    /// A store that has stopped because the runtime shut down is [`Error::ShuttingDown`].
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Closed => Error::ShuttingDown,
            StoreError::Fenced { session_id, .. } => Error::Fenced { session_id },
            other => Error::Store(other),
        }
    }
}

// The drivers' errors convert into `StoreError::Database` for the backends' `?`. Hidden: the
// drivers' types are not part of the crate's API (callers read a `StoreError`).

#[doc(hidden)]
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(DatabaseError::sqlite(e))
    }
}

#[doc(hidden)]
#[cfg(feature = "postgres")]
impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        StoreError::Database(DatabaseError::postgres(e))
    }
}

#[doc(hidden)]
impl From<r2d2::Error> for StoreError {
    fn from(e: r2d2::Error) -> Self {
        StoreError::Database(DatabaseError::pool(e))
    }
}
