//! [`Core`]: what every part of a running runtime shares.

use std::sync::{Arc, Mutex};

use crate::config::RuntimeConfig;
use crate::journal::Journal;
use crate::lock::OwnerLock;
use crate::registry::Registry;
use crate::runner::Runner;

/// The shared state of one running runtime (one boot).
pub(crate) struct Core {
    /// The durable store: every write and read goes through it.
    pub(crate) journal: Journal,
    /// The user's runner.
    pub(crate) runner: Arc<dyn Runner>,
    /// This boot's id, recorded with every claim (`claim_boot`).
    pub(crate) boot: String,
    /// The configuration the runtime was started with.
    pub(crate) config: RuntimeConfig,
    /// Live session actors and the `active()` set.
    pub(crate) registry: Registry,
    /// Called after a wave of passivation, with how many actors it stopped.
    pub(crate) after_passivation: Option<AfterPassivation>,
    /// The lock on `<database>.lock` that makes this runtime the database's only owner. Taken
    /// before the database was opened; `shutdown` takes it out and releases it once the
    /// Persistence actor stopped (otherwise it goes when the last handle is dropped, or with the
    /// process).
    pub(crate) owner: Mutex<Option<OwnerLock>>,
    /// Routes committed events to the event streams of their session (started with the first).
    pub(crate) fanout: crate::service::Fanout,
}

/// The hook [`crate::RuntimeBuilder::after_passivation`] installs.
pub(crate) type AfterPassivation = Arc<dyn Fn(usize) + Send + Sync>;

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("boot", &self.boot)
            .finish_non_exhaustive()
    }
}
