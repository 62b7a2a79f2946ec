//! The [`Journal`]: every durable operation of the runtime, named for what it means to a
//! session — create it, admit a prompt, request an interrupt, claim and settle a turn, promote,
//! append, recover — and every read of the store. The layers above see domain types only: no
//! method mentions a connection, a transaction or a closure over one.
//!
//! Each write is one request of the writer thread (`persistence`), which group-commits the
//! requests of many sessions in one transaction and answers after COMMIT; a request's checks
//! and writes run in that transaction, so the single writer serializes a check-and-write
//! against every other write. Reads run on the readers' pool.
//!
//! The layers, top-down (each imports only those below it):
//! - the domain operations: `sessions`, `prompts`, `turns`, `loads`, `recovery`, `retention`;
//! - the seam: `backend` (the statements a backend runs, `Store`, and the writer's and
//!   readers' traits), `projection` (stored events onto rows), `turn_write`;
//! - the engines, which implement the seam: `sqlite`, and `postgres` (feature `postgres`);
//! - the rules (`rules`): each decision of the domain (settle, the claim merge, served inputs,
//!   the interrupt fence, admission, promotion, keyset paging) as a pure function, and how
//!   values are stored (`columns`).

mod backend;
mod columns;
pub(crate) mod inspect;
pub(crate) mod ledger;
mod listing;
mod loads;
mod nodes;
mod persistence;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod projection;
mod prompts;
mod recovery;
mod retention;
pub(crate) mod rules;
mod sessions;
pub(crate) mod sqlite;
mod steps;
mod turn_write;
mod turns;

use std::sync::Arc;

use tokio::sync::broadcast;

pub(crate) use self::backend::{Nudge, Ownership, Route, Signal};
use self::persistence::Persistence;
pub use self::persistence::PersistenceStats;
pub(crate) use self::prompts::Admitted;
pub(crate) use self::recovery::{Swept, Unfinished};
pub(crate) use self::retention::{deleted_record, Deletion};
pub use self::sessions::ClaimStats;
pub(crate) use self::sessions::{Created, Loaded};

pub(crate) use self::turns::Transcript;
use crate::config::RuntimeConfig;
use crate::error::StoreError;
use crate::event::EventRecord;

/// The durable store of one runtime: cheap to clone (one reference count; a drain holds one);
/// every clone talks to the same writer.
#[derive(Clone, Debug)]
pub(crate) struct Journal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The writer thread, the readers and the bus.
    persistence: Persistence,
    /// Several nodes share the database (ownership can change under this node).
    shared: bool,
    /// Bumped when other nodes committed events this node was not told about one by one: every
    /// live follower re-reads its session from the store.
    resyncs: std::sync::atomic::AtomicU64,
    /// Session loads of starting actors, served in batches.
    loads: loads::Loads,
    /// This node's membership (lease, listener), with PostgreSQL.
    #[cfg(feature = "postgres")]
    node: Option<postgres::Node>,
}

impl Journal {
    /// Opens (creating and migrating) the database the configuration names and starts its
    /// writer thread; `boot` is this runtime's boot id (with PostgreSQL, its node id).
    ///
    /// # Errors
    /// When the database cannot be opened, is corrupt or is newer than this crate.
    pub(crate) fn open(config: &RuntimeConfig, boot: &str) -> Result<Self, StoreError> {
        #[cfg(feature = "postgres")]
        if let Some(url) = config.postgres_url() {
            return Self::open_postgres(config, url, boot);
        }
        let _ = boot;
        let store_config = sqlite::StoreConfig {
            synchronous: config.synchronous,
            busy_timeout: config.busy_timeout,
            pool_size: config.pool_size,
            journal_size_limit: config.journal_size_limit,
            ..sqlite::StoreConfig::new(&config.database)
        };
        let pool = sqlite::open(&store_config)?;
        let writer = sqlite::open_connection(&store_config)?;
        let persistence = Persistence::start(
            Arc::new(sqlite::backend::SqliteReaders(pool.clone())),
            Box::new(sqlite::backend::SqliteWriter::new(writer, pool)),
            config.group_commit,
            config.bus_capacity,
        )?;
        Ok(Self::new(persistence, false))
    }

    fn new(persistence: Persistence, shared: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                persistence,
                shared,
                resyncs: std::sync::atomic::AtomicU64::new(0),
                loads: loads::Loads::default(),
                #[cfg(feature = "postgres")]
                node: None,
            }),
        }
    }

    /// Subscribes to every event committed from now on (broadcast after COMMIT, in commit
    /// order).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<EventRecord>> {
        self.inner.persistence.subscribe()
    }

    /// A snapshot of the writer's counters.
    pub(crate) fn stats(&self) -> PersistenceStats {
        self.inner.persistence.stats()
    }

    /// Releases the SQLite memory that is not in use (after mass passivation); returns what the
    /// writer thread's allocator cache held, to be given back (`thread_caches`).
    pub(crate) async fn release_memory(&self) -> crate::thread_caches::Taken {
        self.inner.persistence.release_memory().await
    }

    /// Finishes what is queued and stops the writer; later writes fail with
    /// [`StoreError::Closed`].
    pub(crate) async fn stop(&self) {
        self.inner.persistence.stop().await;
    }
}

/// The current time in milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
