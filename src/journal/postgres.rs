//! The PostgreSQL store (feature `postgres`): the journal's seam ([`Store`],
//! [`WriterConnection`], [`Readers`]) over the synchronous `postgres` client, for several
//! runtime processes ("nodes") sharing one database.
//!
//! It mirrors the SQLite store statement for statement (same rows, same results, same errors:
//! constraint violations are [`StoreError::Conflict`], undecodable payloads
//! [`StoreError::Json`]) and adds what several nodes need (ARCHITECTURE.md, "Several nodes"):
//!
//! - a `node` row per running node, whose lease (`lease_until`, compared with the database's
//!   `now()` only) the node renews every `lease / 3` ([`node`]);
//! - `session.owner_node` / `session.owner_epoch`: the node hosting a session and the fencing
//!   epoch, which grows with every change of owner ([`ownership`]);
//! - every event row records the node that wrote it and the session's epoch at that moment;
//! - `NOTIFY`: one `ds_events` notification per committed batch that appended events
//!   ([`writer`]), a `ds_node_<id>` notification per nudge routed to another node, and
//!   `ds_nodes` when a node leaves; each node's listener turns them into [`Signal`]s.
//!
//! Connections: the writer thread's one connection (reconnected at the next `BEGIN` when lost),
//! a pool of reader connections, and the node's lease and listener connections. Every
//! connection sets `idle_in_transaction_session_timeout` (half the lease: a node paused in the
//! middle of a transaction loses it, and its row locks, long before its lease lapses) and
//! `lock_timeout` (the lease: no statement waits forever behind another node), and reads and
//! writes in `READ COMMITTED` whatever the database's default: the conditional updates of
//! ownership rely on its re-check of a row another transaction changed meanwhile.
//!
//! Payloads are stored as TEXT exactly as `serde_json::to_string` writes them (never JSONB), so
//! the event wire format is byte-for-byte the SQLite one. Text columns that are compared or
//! ordered use the `"C"` collation, so orderings and `LIKE` searches match SQLite's whatever the
//! database's default collation.
//!
//! The sync client must not run on a thread inside a tokio runtime: [`open`] and
//! [`Node::leave`] run their work on a thread of their own, and connections dropped on such a
//! thread are closed on a thread of their own ([`drop_off_runtime`]).

// `Journal::open` selects this backend for a `postgres://` or `postgresql://` database.

use std::sync::Arc;
use std::time::Duration;

use super::columns::{json_text, json_value, message_id, seq_param, session_id};
use crate::error::StoreError;
use crate::journal::backend::{Readers, WriterConnection};

/// The SQL condition "no live node other than `$me` owns session `s`": it has no owner, or
/// this node owns it, or its owner's lease has lapsed (by the database's clock) or its row is
/// gone. `$me` is the placeholder binding this node's id.
macro_rules! not_held_elsewhere {
    ($me:literal) => {
        concat!(
            "(s.owner_node IS NULL OR s.owner_node = ",
            $me,
            " OR NOT EXISTS (SELECT 1 FROM node n \
             WHERE n.node_id = s.owner_node AND n.lease_until > now()))"
        )
    };
}

/// The SQL assignments that make `$me` the owner of session `s`: the epoch grows unless `$me`
/// owns it already.
macro_rules! take_ownership {
    ($me:literal) => {
        concat!(
            "owner_epoch = CASE WHEN s.owner_node IS NOT DISTINCT FROM ",
            $me,
            " THEN s.owner_epoch ELSE s.owner_epoch + 1 END, owner_node = ",
            $me
        )
    };
}

mod claim;
mod conn;
mod event;
mod input;
mod message;
mod node;
mod ownership;
mod projection;
mod readers;
mod retention;
mod schema;
mod session;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_journal;
#[cfg(test)]
mod tests_leases;
#[cfg(test)]
mod tests_nodes;
#[cfg(test)]
mod tests_own;
#[cfg(test)]
mod tests_parity;
#[cfg(test)]
mod tests_rejoin;
#[cfg(test)]
mod tests_turn;
#[cfg(test)]
mod tests_writer;
mod turn;
mod writer;

pub(crate) use self::conn::{connect, PgConn};
pub(crate) use self::event::stored_events;
pub(crate) use self::node::Node;
pub(crate) use self::readers::PgReaders;
pub(crate) use self::writer::PgWriter;

/// This node's current id, shared by its connections and threads: set when the store opens,
/// replaced when the node rejoins under a new id after its lease lapsed (see [`node`]). Each id
/// has a generation, 1 for the first and one more for each rejoin: what the node acquired
/// under an id is told apart by it (see [`Signal::LeaseLost`](crate::journal::Signal)).
#[derive(Debug)]
pub(crate) struct NodeId(std::sync::RwLock<(u64, Arc<str>)>);

impl NodeId {
    /// The id `id` (generation 1), shared.
    pub(crate) fn new(id: &str) -> Arc<Self> {
        Arc::new(Self(std::sync::RwLock::new((1, Arc::from(id)))))
    }

    /// The current id.
    pub(crate) fn get(&self) -> Arc<str> {
        self.current().1
    }

    /// The current id's generation and the id, read together.
    pub(crate) fn current(&self) -> (u64, Arc<str>) {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the id (the node rejoined): the next generation.
    pub(crate) fn set(&self, id: Arc<str>) {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        *current = (current.0 + 1, id);
    }
}

/// The default lease of a node.
#[cfg(test)]
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The channel every node listens on for committed events.
pub(crate) const EVENTS_CHANNEL: &str = "ds_events";
/// The channel every node listens on for nodes leaving.
pub(crate) const NODES_CHANNEL: &str = "ds_nodes";
/// The prefix of a node's own channel (`ds_node_<node id>`), where nudges for it arrive.
pub(crate) const NODE_CHANNEL_PREFIX: &str = "ds_node_";

/// Where and as whom a node opens the PostgreSQL store.
#[derive(Debug, Clone)]
pub(crate) struct PgConfig {
    /// The connection URL (`postgres://user@host:port/db`).
    pub(crate) url: String,
    /// This boot's node id (32 hex chars): 1 to 40 ASCII letters, digits, `_` or `-`.
    pub(crate) node_id: String,
    /// A human name of the node (shown in the `node` table).
    pub(crate) node_name: String,
    /// How long a renewal keeps the node's lease (default 10 s).
    pub(crate) lease: Duration,
    /// The most pooled reader connections.
    pub(crate) pool_size: u32,
}

impl PgConfig {
    /// A configuration with the default lease and pool size (8).
    #[cfg(test)]
    pub(crate) fn new(url: impl Into<String>, node_id: impl Into<String>) -> Self {
        let node_id = node_id.into();
        Self {
            url: url.into(),
            node_name: node_id.clone(),
            node_id,
            lease: DEFAULT_LEASE,
            pool_size: 8,
        }
    }

    /// The lease, never under 300 ms (the renewal runs every third of it).
    pub(crate) fn lease(&self) -> Duration {
        self.lease.max(Duration::from_millis(300))
    }

    /// `SET` statements every connection of this node runs once connected.
    pub(crate) fn session_settings(&self) -> String {
        let lease = self.lease();
        format!(
            "SET idle_in_transaction_session_timeout = {}; SET lock_timeout = {}; \
             SET default_transaction_isolation = 'read committed'; \
             SET standard_conforming_strings = on; \
             SET application_name = '{}'",
            (lease / 2).as_millis(),
            lease.as_millis(),
            application_name(&self.node_name)
        )
    }
}

/// `durable-sessions <name>`, reduced to characters safe in a quoted literal.
fn application_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ' | ':'))
        .take(40)
        .collect();
    format!("durable-sessions {clean}")
}

/// What [`open`] gives the journal: its readers, its writer and this node.
pub(crate) struct PgBackend {
    /// The read pool.
    pub(crate) readers: Arc<dyn Readers>,
    /// The writer thread's connection.
    pub(crate) writer: Box<dyn WriterConnection>,
    /// This node: its id, its signals, its lease.
    pub(crate) node: Node,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Opens the store for one node: connects, applies pending migrations (under an advisory lock,
/// so nodes starting together do not race), registers the node's row with a fresh lease,
/// builds the reader pool and starts the node's lease and listener threads.
///
/// Runs on a thread of its own (the sync client must not run inside a tokio runtime), so it
/// may be called from anywhere; it blocks until done.
///
/// # Errors
/// An invalid node id ([`StoreError::Inconsistent`]), an unreachable or refusing server
/// ([`StoreError::Database`]), a schema newer than this crate ([`StoreError::SchemaTooNew`]).
pub(crate) fn open(cfg: &PgConfig) -> Result<PgBackend, StoreError> {
    let cfg = cfg.clone();
    off_runtime(move || open_here(&cfg))
}

/// [`open`], on the calling thread.
fn open_here(cfg: &PgConfig) -> Result<PgBackend, StoreError> {
    check_node_id(&cfg.node_id)?;
    let node_id = NodeId::new(&cfg.node_id);
    let mut client = conn::connect(cfg)?;
    schema::migrate(&mut client)?;
    node::register(&mut client, cfg, &cfg.node_id)?;
    let writer = PgWriter::new(PgConn::new(client, node_id.clone()), cfg.clone());
    let readers = PgReaders::open(cfg, node_id.clone())?;
    let node = Node::start(cfg, node_id)?;
    Ok(PgBackend {
        readers: Arc::new(readers),
        writer: Box::new(writer),
        node,
    })
}

/// A node id must be usable in a channel name (`ds_node_<id>`, at most 63 bytes).
fn check_node_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= 40
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Inconsistent(format!(
            "node id {id:?} must be 1 to 40 ASCII letters, digits, `_` or `-`"
        )))
    }
}

/// The channel of node `id`, as `pg_notify` takes it (LISTEN takes it double-quoted).
pub(crate) fn node_channel(id: &str) -> String {
    format!("{NODE_CHANNEL_PREFIX}{id}")
}

/// Runs `f` on a thread of its own when the calling thread is inside a tokio runtime (where
/// the sync client panics), else here.
pub(crate) fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::Builder::new()
        .name("durable-pg-call".into())
        .spawn(f)
        .map_err(StoreError::WriterThread)?
        .join()
        .unwrap_or_else(|_| {
            Err(StoreError::Inconsistent(
                "a PostgreSQL call panicked on its thread".into(),
            ))
        })
}

/// Drops `value` (whose drop talks to the server: a `postgres::Client` closes its connection)
/// here, or on a thread of its own when this thread is inside a tokio runtime.
pub(crate) fn drop_off_runtime<T: Send + 'static>(value: T) {
    if tokio::runtime::Handle::try_current().is_err() {
        drop(value);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("durable-pg-drop".into())
        .spawn(move || drop(value));
    if let Err(e) = spawned {
        log::warn!("postgres: cannot start a thread to close a connection: {e}");
    }
}

/// A stored seq (never negative).
fn seq_value(raw: i64) -> Result<u64, StoreError> {
    u64::try_from(raw).map_err(|_| StoreError::Inconsistent(format!("negative seq {raw}")))
}

/// A stored attempt count.
fn count_value(raw: i64) -> Result<u32, StoreError> {
    u32::try_from(raw).map_err(|_| StoreError::Inconsistent(format!("attempt count {raw}")))
}

/// A `LIMIT` parameter (`NULL` is no limit).
fn limit_param(limit: Option<usize>) -> Option<i64> {
    limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}
