//! [`RuntimeConfig`]: every knob of the runtime, with its documented default.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;

/// The runtime's configuration. Built through [`crate::RuntimeBuilder`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The database: a SQLite file (default `./durable-sessions.db`), or, with the `postgres`
    /// feature, a PostgreSQL URL (`postgres://…` or `postgresql://…`) that several runtimes
    /// (nodes) may share.
    pub database: PathBuf,
    /// With PostgreSQL: this node's name, shown to operators (the node's id is its boot id).
    /// Default: the host name and process id.
    pub node_name: Option<String>,
    /// With PostgreSQL: how long this node's lease lasts unless renewed (every third of it). A
    /// node whose lease lapsed is dead to the others: they take its sessions over within the
    /// lease and one takeover tick (half a lease). Default: 10 s.
    pub lease: Duration,
    /// With PostgreSQL: take over the turns of dead nodes (the restart sweep's rules) every
    /// quarter lease, at most every second, and at once when a node leaves. Default: true (off
    /// only where a test runs the sweep itself).
    pub takeover: bool,
    /// How many restart-resumes a claimed turn gets before it is terminalized as `aborted`.
    /// Default: 10.
    pub max_resume_attempts: u32,
    /// A session actor idle this long is stopped (passivated). Default: 60 s.
    pub idle_timeout: Duration,
    /// How long a turn may run, from the start of its first drain, before it is interrupted
    /// as `interrupted{timeout}` (its claim released). A turn resumed after a restart gets a
    /// fresh timeout from its resume. Default: `None`, no limit.
    pub turn_timeout: Option<Duration>,
    /// SQLite `synchronous` for every connection. Default: [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// Arbiters (threads) the session actors are spread over. Default: one per core.
    pub arbiters: usize,
    /// Run the restart sweep in `start`. Default: true.
    pub sweep_on_start: bool,
    /// How long `shutdown` waits for drains to record their interruption. Default: 5 s.
    pub shutdown_grace: Duration,
    /// SQLite `busy_timeout`. Default: 5 s.
    pub busy_timeout: Duration,
    /// Read connections in the pool (the writer has its own). Default: 8.
    pub pool_size: u32,
    /// The largest accepted prompt, in bytes of JSON. Default: 1 MiB.
    pub max_prompt_bytes: usize,
    /// Batch writes from many sessions into one transaction. Default: true (off only for the
    /// benchmark comparison).
    pub group_commit: bool,
    /// Events buffered per live subscriber before it is told it lagged. Default: 4096.
    pub bus_capacity: usize,
    /// SQLite `journal_size_limit`: the size, in bytes, the write-ahead log (`<database>-wal`)
    /// is truncated back to once a checkpoint has reset it. The runtime also truncates it to
    /// zero when its writer goes idle and at shutdown. Default: 64 MiB.
    pub journal_size_limit: u64,
    /// Compaction of the event logs of idle sessions ([`RetainEvents`]). Default: `None`, every
    /// event is kept.
    pub retain_events: Option<RetainEvents>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            database: PathBuf::from("durable-sessions.db"),
            node_name: None,
            lease: Duration::from_secs(10),
            takeover: true,
            max_resume_attempts: 10,
            idle_timeout: Duration::from_secs(60),
            turn_timeout: None,
            synchronous: Synchronous::Full,
            arbiters: std::thread::available_parallelism().map_or(2, |n| n.get()),
            sweep_on_start: true,
            shutdown_grace: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
            pool_size: 8,
            max_prompt_bytes: 1024 * 1024,
            group_commit: true,
            bus_capacity: 4096,
            journal_size_limit: 64 * 1024 * 1024,
            retain_events: None,
        }
    }
}

impl RuntimeConfig {
    /// Checks that every value is in range.
    ///
    /// # Errors
    /// [`Error::Config`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), Error> {
        if self.arbiters == 0 {
            return Err(Error::Config("arbiters must be at least 1".into()));
        }
        if self.pool_size == 0 {
            return Err(Error::Config("pool_size must be at least 1".into()));
        }
        if self.idle_timeout.is_zero() {
            return Err(Error::Config("idle_timeout must be positive".into()));
        }
        if self.turn_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::Config("turn_timeout must be positive".into()));
        }
        if self.max_prompt_bytes == 0 {
            return Err(Error::Config("max_prompt_bytes must be positive".into()));
        }
        if self.lease < Duration::from_millis(300) {
            return Err(Error::Config("lease must be at least 300 ms".into()));
        }
        if let Some(retain) = &self.retain_events {
            if retain.interval.is_zero() {
                return Err(Error::Config(
                    "retain_events: the interval must be positive".into(),
                ));
            }
        }
        if self.postgres_url().is_some() && !cfg!(feature = "postgres") {
            return Err(Error::Config(
                "a postgres:// database needs the `postgres` cargo feature".into(),
            ));
        }
        Ok(())
    }

    /// The PostgreSQL URL, when [`RuntimeConfig::database`] is one (`postgres://…` or
    /// `postgresql://…`).
    pub fn postgres_url(&self) -> Option<&str> {
        let database = self.database.to_str()?;
        (database.starts_with("postgres://") || database.starts_with("postgresql://"))
            .then_some(database)
    }
}

/// Retention of session event logs: how much of an idle session's log the runtime keeps
/// ([`crate::RuntimeBuilder::retain_events`]; off by default).
///
/// Every `interval`, the runtime compacts the log of each session that holds no claim (no turn
/// in flight anywhere), runs no turn in this process and whose newest event is older than
/// `after_idle`: it deletes the events before its newest `keep_last`. What compaction keeps:
///
/// - the transcript and the inbox (their own tables), and the session row;
/// - the seq counter: new events go on after the newest seq, never reusing one;
/// - the session's latest `session.interrupt.requested` (the durable interrupt fence, which
///   recovery and admission read), stored but no longer replayed.
///
/// The session records where its log now starts ([`crate::Sessions::log_start`]). A replay
/// from before that point ([`crate::Sessions::events`] with an `after` below it, an SSE
/// `after` or `Last-Event-ID`) fails with [`Error::EventsCompacted`] (HTTP 410) naming the
/// first seq still held; a replay from the start (`after: None`) begins there. A rebuild of the
/// inbox and transcript from the log ([`crate::Sessions::reproject`]) is refused once the log
/// is compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetainEvents {
    /// How many of a session's newest events are kept (at least). 0 compacts the whole log of
    /// an idle session.
    pub keep_last: u64,
    /// How long a session must have published nothing before it is compacted.
    pub after_idle: Duration,
    /// How often the runtime looks for sessions to compact. Default: half of `after_idle`,
    /// between 100 ms and 5 minutes.
    pub interval: Duration,
}

impl RetainEvents {
    /// Keep each idle session's newest `keep_last` events once it has been idle `after_idle`.
    pub fn new(keep_last: u64, after_idle: Duration) -> Self {
        Self {
            keep_last,
            after_idle,
            interval: (after_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(300)),
        }
    }

    /// Sets how often the runtime looks for sessions to compact.
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = every;
        self
    }
}

/// SQLite's `synchronous` setting, applied to every connection.
///
/// In WAL mode `Full` syncs the WAL on every commit, so a committed transaction survives a power
/// loss; `Normal` syncs only at checkpoints, so the last commits may be lost on power loss (never
/// on a process crash) in exchange for faster commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Synchronous {
    /// `PRAGMA synchronous = FULL` (the default): durable across power loss.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`: durable across process crashes, faster commits. A commit
    /// then waits for a sync only when it runs SQLite's automatic checkpoint, which the runtime
    /// sets to every 4,096 pages of log (1,000 under `Full`): rarer, longer waits.
    Normal,
}

impl Synchronous {
    /// The PRAGMA value: `FULL` or `NORMAL`.
    pub fn as_pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `turn_timeout` is off by default, and a zero timeout is refused.
    #[test]
    fn turn_timeout_is_off_by_default_and_must_be_positive() {
        let config = RuntimeConfig::default();
        assert_eq!(config.turn_timeout, None);
        assert!(config.validate().is_ok());
        let zero = RuntimeConfig {
            turn_timeout: Some(Duration::ZERO),
            ..RuntimeConfig::default()
        };
        assert!(matches!(zero.validate(), Err(Error::Config(m)) if m.contains("turn_timeout")));
    }
}
