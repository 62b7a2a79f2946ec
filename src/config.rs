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
    /// How many restart-resumes a claimed turn gets before it is terminalized as `aborted`.
    /// Default: 10.
    pub max_resume_attempts: u32,
    /// A session actor idle this long is stopped (passivated). Default: 60 s.
    pub idle_timeout: Duration,
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
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            database: PathBuf::from("durable-sessions.db"),
            node_name: None,
            lease: Duration::from_secs(10),
            max_resume_attempts: 10,
            idle_timeout: Duration::from_secs(60),
            synchronous: Synchronous::Full,
            arbiters: std::thread::available_parallelism().map_or(2, |n| n.get()),
            sweep_on_start: true,
            shutdown_grace: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
            pool_size: 8,
            max_prompt_bytes: 1024 * 1024,
            group_commit: true,
            bus_capacity: 4096,
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
        if self.max_prompt_bytes == 0 {
            return Err(Error::Config("max_prompt_bytes must be positive".into()));
        }
        if self.lease < Duration::from_millis(300) {
            return Err(Error::Config("lease must be at least 300 ms".into()));
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
    /// `PRAGMA synchronous = NORMAL`: durable across process crashes, faster commits.
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
