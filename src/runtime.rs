//! [`Runtime`] and [`RuntimeBuilder`]: open the store, start the actors, run the restart sweep.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr, Arbiter};
use tokio::sync::broadcast;

use crate::config::{RetainEvents, RuntimeConfig, Synchronous};
use crate::error::{Error, Result};
use crate::event::EventRecord;
use crate::execution::Execution;
use crate::journal::{ClaimStats, Journal, PersistenceStats};
use crate::lock::OwnerLock;
use crate::recovery::{self, SweepReport};
use crate::registry::{
    AfterPassivation, Ready, Registry, RegistryStats, StopSupervisor, Supervisor,
};
use crate::runner::Runner;
use crate::service::{Fanout, Sessions};
use crate::session::Environment;

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
    /// SQLite's unused cache memory. The runtime cannot choose the allocator: this is where an
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
    /// corrupt or is newer than this crate.
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
        Ok(runtime)
    }
}

/// A running runtime: the handles to sessions and executions. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

/// What a runtime owns; the handles it gives out hold only the parts they use.
struct Inner {
    /// The durable store.
    journal: Journal,
    /// Live session actors and the `active()` set.
    registry: Arc<Registry>,
    /// What every session actor is given (journal, runner, boot id, registry entry).
    env: Arc<Environment>,
    /// The configuration the runtime was started with.
    config: Arc<RuntimeConfig>,
    /// Routes committed and live-only events to each session's open streams.
    fanout: Arc<Fanout>,
    /// The lock on `<database>.lock` that makes this runtime the database's only owner. Taken
    /// before the database was opened; `shutdown` takes it out and releases it once the writer
    /// stopped (otherwise it goes when the last handle is dropped, or with the process).
    owner: Mutex<Option<OwnerLock>>,
    /// Passivates idle actors.
    supervisor: Addr<Supervisor>,
    /// The threads session actors run on.
    arbiters: Vec<Arbiter>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("boot", &self.inner.env.boot)
            .finish_non_exhaustive()
    }
}

/// A snapshot of what the runtime is doing, for `/stats` and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeStats {
    /// The Persistence actor's counters.
    pub persistence: PersistenceStats,
    /// The registry's counters.
    pub registry: RegistryStats,
    /// Sessions with a turn in this process.
    pub active: usize,
}

impl Runtime {
    /// A builder with the documented defaults.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            config: RuntimeConfig::default(),
            runner: None,
            after_passivation: None,
        }
    }

    /// The session service.
    pub fn sessions(&self) -> Sessions {
        Sessions::new(
            self.inner.journal.clone(),
            self.execution(),
            self.inner.config.clone(),
            self.inner.fanout.clone(),
        )
    }

    /// The execution handle.
    pub fn execution(&self) -> Execution {
        Execution::new(self.inner.registry.clone(), self.inner.env.clone())
    }

    /// The configuration the runtime runs with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// This boot's id (recorded with every claim it makes). With several nodes it is the
    /// node's first id: a node that lost its lease rejoins under a new one, see
    /// [`Runtime::node_id`].
    pub fn boot_id(&self) -> &str {
        &self.inner.env.boot
    }

    /// The id this process records with its claims now: the boot id, or with several nodes
    /// sharing a database, the node's current id (a new one each time the node rejoined after
    /// losing its lease).
    pub fn node_id(&self) -> String {
        self.inner.env.claimant()
    }

    /// The restart sweep, which `start` runs unless [`RuntimeBuilder::sweep_on_start`] is off:
    /// resumes every turn an earlier boot left claimed and every session owed a turn (a prompt
    /// acknowledged before a crash whose turn never started), aborts turns over their resume
    /// budget, and records user interrupts a crash cut short; see [`SweepReport`].
    ///
    /// # Errors
    /// [`Error::Store`] when the sweep's writes fail (a retry is safe: counts already committed
    /// stay, and a turn is resumed at most once per sweep).
    pub async fn resume_suspended_sessions(&self) -> Result<SweepReport> {
        let inner = &self.inner;
        recovery::resume_suspended_sessions(
            &inner.registry,
            &inner.env,
            inner.config.max_resume_attempts,
        )
        .await
    }

    /// Runs a compaction pass of the retention policy now (the runtime also runs one every
    /// [`RetainEvents::interval`]); returns how many sessions it compacted (0 when off).
    ///
    /// # Errors
    /// [`Error::Store`] when a read or a compaction fails (what it compacted before stays).
    pub async fn compact_events(&self) -> Result<usize> {
        let Some(policy) = self.inner.config.retain_events else {
            return Ok(0);
        };
        let done = self
            .inner
            .journal
            .compact_events(
                policy,
                self.inner.registry.active(),
                crate::journal::now_ms(),
            )
            .await?;
        Ok(done.sessions)
    }

    /// A live stream of every event committed from now on (durable events only: live-only
    /// events, [`crate::Turn::publish_live`], reach a session's [`Sessions::stream`]).
    pub fn subscribe(&self) -> EventStream {
        EventStream {
            receiver: self.inner.journal.subscribe(),
        }
    }

    /// Counters of the runtime's actors.
    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            persistence: self.inner.journal.stats(),
            registry: self.inner.registry.stats(),
            active: self.inner.registry.active().len(),
        }
    }

    /// How many sessions hold a claim (a turn in flight, or left behind by an earlier boot) and
    /// how old the oldest claim is: one read of the `session` table.
    ///
    /// # Errors
    /// [`Error::Store`] when the read fails.
    pub async fn claim_stats(&self) -> Result<ClaimStats> {
        Ok(self
            .inner
            .journal
            .claim_stats(crate::journal::now_ms())
            .await?)
    }

    /// Graceful stop: refuses new work, cancels every running drain with reason `shutdown`
    /// (recording `interrupted{shutdown}` best-effort and **keeping every claim and attempt
    /// counter** so the next boot resumes those turns), waits at most the configured grace
    /// period, then stops the arbiters and the Persistence actor, and releases the database's
    /// lock: another runtime may then start on it.
    pub async fn shutdown(&self) {
        let actors = self.inner.registry.close();
        for addr in actors {
            addr.do_send(crate::session::messages::Close);
        }
        let deadline = tokio::time::Instant::now() + self.inner.config.shutdown_grace;
        if !self.inner.registry.settled_by(deadline).await {
            log::warn!(
                "shutdown: {} turns had not recorded their interruption within the grace period",
                self.inner.registry.active().len()
            );
        }
        // With several nodes: hand this node's sessions over at once (claims kept).
        self.inner.journal.leave().await;
        self.inner.supervisor.do_send(StopSupervisor);
        for arbiter in &self.inner.arbiters {
            arbiter.stop();
        }
        self.inner.journal.stop().await;
        let owner = match self.inner.owner.lock() {
            Ok(mut owner) => owner.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(owner) = owner {
            owner.release();
        }
    }
}

/// A live stream of committed events (see [`Runtime::subscribe`]).
#[derive(Debug)]
pub struct EventStream {
    receiver: broadcast::Receiver<Arc<EventRecord>>,
}

/// Why [`EventStream::recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The subscriber fell behind and `missed` events were dropped for it; it can catch up by
    /// replaying each session's log from the last seq it saw.
    #[error("subscriber lagged behind and missed {missed} events")]
    Lagged {
        /// How many events were skipped.
        missed: u64,
    },
    /// The runtime stopped.
    #[error("the runtime stopped")]
    Closed,
}

impl EventStream {
    /// The next committed event.
    ///
    /// # Errors
    /// [`RecvError::Lagged`] when events were dropped for this slow subscriber (the stream goes
    /// on with newer ones); [`RecvError::Closed`] when the runtime stopped.
    pub async fn recv(&mut self) -> std::result::Result<Arc<EventRecord>, RecvError> {
        self.receiver.recv().await.map_err(|e| match e {
            broadcast::error::RecvError::Lagged(missed) => RecvError::Lagged { missed },
            broadcast::error::RecvError::Closed => RecvError::Closed,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::error::Error;
    use crate::testing::ScriptedRunner;
    use crate::Runtime;

    /// `shutdown` releases the database's lock: a runtime refused while the first one runs
    /// starts on the same file, in the same process, once it has shut down (while the first's
    /// handle is still alive).
    #[actix_rt::test]
    async fn a_shut_down_runtime_releases_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.db");
        let start = || {
            Runtime::builder()
                .database(&path)
                .runner(ScriptedRunner::new())
                .arbiters(1)
                .shutdown_grace(Duration::from_secs(1))
                .start()
        };
        let first = start().await.unwrap();
        let refused = start().await;
        assert!(
            matches!(refused, Err(Error::DatabaseInUse { .. })),
            "{refused:?}"
        );
        first.shutdown().await;
        let second = start().await.unwrap();
        second.shutdown().await;
    }
}
