//! [`Runtime`] and [`RuntimeBuilder`]: open the store, start the actors, run the restart sweep.

use std::sync::{Arc, Mutex};

use actix::{Addr, Arbiter};
use tokio::sync::broadcast;

use crate::config::RuntimeConfig;
use crate::error::Result;
use crate::event::EventRecord;
use crate::execution::Execution;
use crate::journal::{ClaimStats, Journal, PersistenceStats};
use crate::lock::OwnerLock;
use crate::recovery::{self, SweepReport};
use crate::registry::{Registry, RegistryStats, StopSupervisor, Supervisor};
use crate::service::{Fanout, Sessions};
use crate::session::Environment;

mod builder;

pub use builder::RuntimeBuilder;

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
    /// What the restart sweep of `start` did (unset when it was disabled).
    start_sweep: std::sync::OnceLock<SweepReport>,
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
        RuntimeBuilder::new()
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

    /// What the restart sweep run by [`RuntimeBuilder::start`] did: the turns an earlier process
    /// left that it resumed, terminalized or recorded interrupted. `None` when the sweep on
    /// start was disabled.
    pub fn start_sweep(&self) -> Option<&SweepReport> {
        self.inner.start_sweep.get()
    }

    /// The restart sweep, which `start` runs unless [`RuntimeBuilder::sweep_on_start`] is off:
    /// resumes every turn an earlier boot left claimed and every session owed a turn (a prompt
    /// acknowledged before a crash whose turn never started), aborts turns over their resume
    /// budget, and records user interrupts a crash cut short; see [`SweepReport`].
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when the sweep's writes fail (a retry is safe: counts already committed
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
    /// [`RetainEvents::interval`](crate::RetainEvents::interval)); returns how many sessions it compacted (0 when off).
    ///
    /// # Errors
    /// [`Error::Store`](crate::Error::Store) when a read or a compaction fails (what it compacted before stays).
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
    /// [`Error::Store`](crate::Error::Store) when the read fails.
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
