//! [`RuntimeBuilder`]: the configuration of a runtime, and its start (open the store, start the
//! actors, run the restart sweep).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Arbiter};

use crate::config::{RetainEvents, RuntimeConfig, Synchronous};
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::lock::OwnerLock;
use crate::registry::{AfterPassivation, Ready, Registry, Supervisor};
use crate::runner::Runner;
use crate::service::Fanout;
use crate::session::Environment;

use super::{Inner, Runtime};

/// Configures and starts a [`Runtime`].
pub struct RuntimeBuilder {
    config: RuntimeConfig,
    runner: Option<Arc<dyn Runner>>,
    after_passivation: Option<AfterPassivation>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The defaults of [`RuntimeConfig`], no runner yet.
    pub(super) fn new() -> Self {
        RuntimeBuilder {
            config: RuntimeConfig::default(),
            runner: None,
            after_passivation: None,
        }
    }

    /// The SQLite file (created when missing). Default `./durable-sessions.db`. The runtime owns
    /// it through an exclusive lock on the sidecar file `<path>.lock` (kept on disk).
    ///
    /// With the `postgres` feature, a `postgres://…` URL selects PostgreSQL instead (see
    /// [`RuntimeBuilder::postgres`]).
    pub fn database(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.database = path.into();
        self
    }

    /// A PostgreSQL database (feature `postgres`), e.g.
    /// `postgres://user:password@host:5432/db`: several runtimes (nodes) may share it. Each node
    /// holds a lease it renews; each live session is owned by one node at a time, with a
    /// fencing epoch every write of a turn is checked against; a dead node's turns resume on a
    /// live node within the lease and one takeover tick.
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.config.database = PathBuf::from(url.into());
        self
    }

    /// This node's name, shown to operators (PostgreSQL only). Default: host name and pid.
    pub fn node_name(mut self, name: impl Into<String>) -> Self {
        self.config.node_name = Some(name.into());
        self
    }

    /// Whether this node takes over the turns of dead nodes on its own (PostgreSQL only): every
    /// quarter lease (at most every second) and when a node leaves. Default true.
    pub fn takeover(mut self, on: bool) -> Self {
        self.config.takeover = on;
        self
    }

    /// How long this node's lease lasts unless renewed (PostgreSQL only). Default 10 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// The runner that does the work of every turn (required).
    pub fn runner<R: Runner>(mut self, runner: R) -> Self {
        self.runner = Some(Arc::new(runner));
        self
    }

    /// Restart-resumes a claimed turn gets before it is terminalized as `aborted`. Default 10.
    pub fn max_resume_attempts(mut self, attempts: u32) -> Self {
        self.config.max_resume_attempts = attempts;
        self
    }

    /// How long an idle session actor lives before it is stopped. Default 60 s.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// How long a turn may run before it is interrupted as `interrupted{timeout}`, which
    /// releases its claim: the session is free for its next prompt. The clock starts when the
    /// turn's first drain starts (after its claim commits) and covers its follow-up drains; a
    /// turn resumed after a restart gets a fresh timeout from its resume. A drain may tighten
    /// its turn's deadline with [`crate::Turn::set_deadline`]. Default: none. Must be positive.
    pub fn turn_timeout(mut self, timeout: Duration) -> Self {
        self.config.turn_timeout = Some(timeout);
        self
    }

    /// SQLite `synchronous`. Default [`Synchronous::Full`].
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.config.synchronous = synchronous;
        self
    }

    /// Arbiters (threads) for session actors. Default: one per core.
    pub fn arbiters(mut self, n: usize) -> Self {
        self.config.arbiters = n;
        self
    }

    /// Whether `start` runs the restart sweep. Default true.
    pub fn sweep_on_start(mut self, sweep: bool) -> Self {
        self.config.sweep_on_start = sweep;
        self
    }

    /// How long `shutdown` waits for running turns to record their interruption. Default 5 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.config.shutdown_grace = grace;
        self
    }

    /// SQLite `busy_timeout`. Default 5 s.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.config.busy_timeout = timeout;
        self
    }

    /// The largest accepted prompt in bytes of JSON. Default 1 MiB.
    pub fn max_prompt_bytes(mut self, bytes: usize) -> Self {
        self.config.max_prompt_bytes = bytes;
        self
    }

    /// Batch writes of many sessions into one transaction. Default true.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.config.group_commit = on;
        self
    }

    /// Called after a wave of passivation — the live session actors fell to a quarter of their
    /// peak, at least 64 fewer — with how many actors it stopped, once the runtime released
    /// SQLite's unused cache memory and had the threads that ran the wave hand back what their
    /// allocator caches held (glibc's per-thread caches, which `malloc_trim` does not reach).
    /// The runtime cannot choose the allocator: this is where an
    /// application returns the freed memory to the OS, e.g. `malloc_trim(0)` with glibc malloc,
    /// which otherwise keeps freed chunks that sit between live ones. Runs on the supervisor's
    /// arbiter: keep it short.
    pub fn after_passivation(mut self, hook: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.after_passivation = Some(Arc::new(hook));
        self
    }

    /// Compacts the event logs of idle sessions (see [`RetainEvents`] for what is kept and what
    /// a replay from before the compaction point answers). Default: off, every event is kept.
    pub fn retain_events(mut self, policy: RetainEvents) -> Self {
        self.config.retain_events = Some(policy);
        self
    }

    /// SQLite `journal_size_limit`, in bytes, of the write-ahead log. Default 64 MiB. (The
    /// runtime also truncates the WAL when its writer has been idle for 1 s, and at shutdown.)
    pub fn journal_size_limit(mut self, bytes: u64) -> Self {
        self.config.journal_size_limit = bytes;
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// Takes the exclusive lock on `<database>.lock` (held until [`Runtime::shutdown`], or the
    /// process's end), opens (and migrates) the database, starts the Persistence actor, the
    /// arbiters and the registry, and — unless disabled — runs the restart sweep. Must run inside
    /// an actix `System`.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad configuration, a missing runner or an in-memory database;
    /// [`Error::DatabaseInUse`] when another runtime, in any process, owns the database, and
    /// [`Error::LockFile`] when its lock file cannot be created (e.g. a missing directory) —
    /// both before anything is written; [`Error::Store`] when the database cannot be opened, is
    /// corrupt or is newer than this crate, and with
    /// [`StoreError::WalWithoutDatabase`](crate::StoreError::WalWithoutDatabase) when the SQLite
    /// file is missing or empty while its `-wal` beside it holds committed transactions
    /// (checked before SQLite opens either; restore the file, or move the log away to start
    /// empty).
    pub async fn start(self) -> Result<Runtime> {
        let config = self.config;
        config.validate()?;
        let runner = self
            .runner
            .ok_or_else(|| Error::Config("a runner is required".into()))?;
        // Before anything opens the database: a second runtime must not migrate it, nor sweep
        // the claims of the live one.
        let owner = match config.postgres_url() {
            // Nodes sharing a PostgreSQL database coordinate through it: leases and fencing.
            Some(_) => None,
            None => Some(OwnerLock::acquire(&config.database)?),
        };
        let boot = uuid::Uuid::now_v7().simple().to_string();
        let journal = Journal::open(&config, &boot)?;
        let arbiters: Vec<Arbiter> = (0..config.arbiters).map(|_| Arbiter::new()).collect();
        let registry = Arc::new(Registry::new(
            arbiters.iter().map(Arbiter::handle).collect(),
        ));
        let config = Arc::new(config);
        // The streams' routes, shared by every `Sessions` handle and every drain of this runtime.
        let fanout = Arc::new(Fanout::default());
        let env = Arc::new(Environment {
            journal: journal.clone(),
            runner,
            boot,
            idle_timeout: config.idle_timeout,
            turn_timeout: config.turn_timeout,
            max_resume_attempts: config.max_resume_attempts,
            host: registry.clone(),
            live: fanout.clone(),
        });
        let supervisor = Supervisor::new(
            registry.clone(),
            journal.clone(),
            config.idle_timeout,
            self.after_passivation,
        )
        .retain_events(config.retain_events)
        .start();
        // Wait until the supervisor runs, so a runtime shut down right after `start` never has
        // it starting during teardown.
        let _ = supervisor.send(Ready).await;
        let runtime = Runtime {
            inner: Arc::new(Inner {
                journal,
                registry,
                env,
                config,
                fanout,
                owner: Mutex::new(owner),
                supervisor,
                arbiters,
                start_sweep: std::sync::OnceLock::new(),
            }),
        };
        if runtime.inner.config.sweep_on_start {
            let report = runtime.resume_suspended_sessions().await?;
            log::info!(
                "restart sweep: {} resumed, {} terminalized, {} interrupted, {} child claims \
                 released",
                report.resumed.len(),
                report.terminalized.len(),
                report.interrupted.len(),
                report.children_released
            );
            let _ = runtime.inner.start_sweep.set(report);
        }
        // Only now (PostgreSQL): the node's loop takes over dead nodes' turns on its own, and
        // its first takeover (the listener's first rescan) must not run beside the start-up
        // sweep, or it may count turns first that the sweep then leaves to it, and `start`
        // returns before they are resumed. Signals received meanwhile wait in its channel.
        crate::cluster::start(
            runtime.inner.registry.clone(),
            runtime.inner.env.clone(),
            &runtime.inner.config,
        );
        // A claim of this process with no live turn here (its answer was lost, or its actor
        // stopped) is settled while the runtime runs, not at the next restart.
        crate::recovery::heal::start(runtime.inner.registry.clone(), runtime.inner.env.clone());
        Ok(runtime)
    }
}
