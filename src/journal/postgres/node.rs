//! This node: its row in `node`, its lease (renewed by a thread of its own), its listener
//! (a connection of its own that `LISTEN`s and turns notifications into [`Signal`]s), and a
//! graceful leave.
//!
//! - Lease: every `lease / 3`, `UPDATE node SET lease_until = now() + lease WHERE node_id = me
//!   AND lease_until > now()`. No row updated (the lease lapsed: other nodes may have taken this
//!   node's sessions), or no successful renewal for a whole lease (by this node's monotonic
//!   clock, counted from the start of the last successful renewal, so never later than the
//!   database sees the lapse) ⇒ [`Signal::LeaseLost`] naming the lost id's generation (the
//!   runtime fences the sessions it acquired under that id), then the node rejoins under a new
//!   id at once: a new row with a fresh lease, the new id (the next generation) in every
//!   connection, its own channel listened to. What it owned under the old id is taken over like
//!   any dead node's sessions — by itself too, under the new id; what it acquires and claims
//!   under the new id, even before the runtime handled the signal, stays its own. About every
//!   ten renewals it also deletes the rows of nodes whose lease lapsed more than ten leases ago
//!   and that no session refers to.
//! - Listener: `LISTEN "ds_node_<me>"`, `ds_events`, `ds_nodes`. A nudge on its own channel is
//!   [`Signal::Nudge`]; another node's `ds_events` is [`Signal::Events`] or
//!   [`Signal::ManyEvents`] (its own are ignored: the writer's bus has them); `ds_nodes` (another
//!   node left) is [`Signal::Rescan`], and so is every (re)connection and every lease period
//!   without one (notifications may have been missed). It reconnects with a growing backoff.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator as _;
use postgres::Client;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::conn::{conflict_on_constraint, connect};
use super::{node_channel, off_runtime, NodeId, PgConfig, EVENTS_CHANNEL, NODES_CHANNEL};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{Nudge, Signal};

/// How long the listener waits for a notification before it looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// The longest pause between two reconnection attempts of the listener.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Registers node `id` (named `cfg.node_name`) with a fresh lease. An id registered already is
/// a conflict.
pub(crate) fn register(client: &mut Client, cfg: &PgConfig, id: &str) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO node (node_id, name, started_at, lease_until) \
             VALUES ($1, $2, now(), now() + make_interval(secs => $3))",
            &[&id, &cfg.node_name, &cfg.lease().as_secs_f64()],
        )
        .map_err(|e| conflict_on_constraint(e, || format!("node {id} exists")))?;
    Ok(())
}

/// A fresh node id (the form of a runtime's boot id).
fn fresh_id() -> Arc<str> {
    Arc::from(uuid::Uuid::now_v7().simple().to_string())
}

/// What the node's threads share with it.
#[derive(Debug, Default)]
struct Shared {
    /// Set when the node is dropped.
    stopped: Mutex<bool>,
    /// Wakes the lease thread when `stopped` is set.
    wake: Condvar,
    /// Set by [`Node::leave`]: the lease thread stops renewing, silently.
    left: AtomicBool,
}

impl Shared {
    /// Waits `period` or until stopped; returns whether the node stopped.
    fn sleep(&self, period: Duration) -> bool {
        let Ok(stopped) = self.stopped.lock() else {
            return true;
        };
        match self.wake.wait_timeout_while(stopped, period, |s| !*s) {
            Ok((stopped, _)) => *stopped,
            Err(_) => true,
        }
    }

    /// Whether the node stopped.
    fn is_stopped(&self) -> bool {
        self.stopped.lock().map_or(true, |s| *s)
    }

    /// Stops the node's threads.
    fn stop(&self) {
        if let Ok(mut stopped) = self.stopped.lock() {
            *stopped = true;
        }
        self.wake.notify_all();
    }
}

/// This node: its id, its signals, its lease and listener threads.
///
/// Dropping it stops both threads (joining them: at most the listener's 100 ms poll and an
/// in-flight statement) without ending the lease, as if the node died: other nodes take its
/// sessions once the lease lapses. Call [`Node::leave`] first for a graceful exit.
pub(crate) struct Node {
    /// The configuration it was opened with (`cfg.node_id` is its first id).
    cfg: PgConfig,
    /// Its current id.
    id: Arc<NodeId>,
    /// The signals, until the runtime takes them.
    signals: Mutex<Option<UnboundedReceiver<Signal>>>,
    /// Shared with the threads.
    shared: Arc<Shared>,
    /// The lease and listener threads.
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id.get())
            .field("name", &self.cfg.node_name)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts the lease and listener threads of the node `cfg` names (registered already under
    /// the current `id`).
    pub(crate) fn start(cfg: &PgConfig, id: Arc<NodeId>) -> Result<Self, StoreError> {
        let (tx, rx) = unbounded_channel();
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::with_capacity(2);
        for (name, lease) in [("durable-pg-lease", true), ("durable-pg-listen", false)] {
            let (cfg, tx, mine, id) = (cfg.clone(), tx.clone(), shared.clone(), id.clone());
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    if lease {
                        lease_loop(&cfg, &id, &tx, &mine);
                    } else {
                        listen_loop(&cfg, &id, &tx, &mine);
                    }
                })
                .map_err(StoreError::WriterThread);
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    shared.stop();
                    threads
                        .into_iter()
                        .for_each(|t: JoinHandle<()>| drop(t.join()));
                    return Err(e);
                }
            }
        }
        Ok(Self {
            cfg: cfg.clone(),
            id,
            signals: Mutex::new(Some(rx)),
            shared,
            threads,
        })
    }

    /// This node's current id.
    pub(crate) fn id(&self) -> Arc<str> {
        self.id.get()
    }

    /// The node's signals (once: later calls return `None`).
    pub(crate) fn take_signals(&self) -> Option<UnboundedReceiver<Signal>> {
        self.signals.lock().ok().and_then(|mut s| s.take())
    }

    /// Leaves gracefully: stops renewing, ends the lease at once (`lease_until` in the past),
    /// gives up the ownership of every session this node owns (claims are kept, for the
    /// survivors to resume) and notifies `ds_nodes` (`{"node":<id>,"left":true}`), all in one
    /// transaction, so other nodes rescan and adopt at once. Runs on a thread of its own; blocks
    /// until done.
    ///
    /// # Errors
    /// When the database cannot be reached (the lease then lapses on its own).
    pub(crate) fn leave(&self) -> Result<(), StoreError> {
        self.shared.left.store(true, Ordering::SeqCst);
        let (cfg, id) = (self.cfg.clone(), self.id.get());
        off_runtime(move || {
            let mut client = connect(&cfg)?;
            let mut tx = client.transaction()?;
            tx.execute(
                "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = $1",
                &[&&*id],
            )?;
            tx.execute(
                "UPDATE session SET owner_node = NULL WHERE owner_node = $1",
                &[&&*id],
            )?;
            let payload = json!({ "node": &*id, "left": true }).to_string();
            tx.execute("SELECT pg_notify($1, $2)", &[&NODES_CHANNEL, &payload])?;
            tx.commit()?;
            Ok(())
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shared.stop();
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                log::error!("postgres: a node thread panicked");
            }
        }
    }
}

/// Renews the lease every `lease / 3` until stopped or left; when the lease is lost, signals it
/// and rejoins under a new id as soon as the database can be reached.
fn lease_loop(cfg: &PgConfig, id: &NodeId, tx: &UnboundedSender<Signal>, shared: &Shared) {
    let lease = cfg.lease();
    let mut client: Option<Client> = None;
    // Registration just set the lease.
    let mut renewed_at = Instant::now();
    let mut renewals: u64 = 0;
    // The id whose lease was lost, until the node has rejoined under a new one.
    let mut lost: Option<Arc<str>> = None;
    loop {
        if lost.is_none() && shared.sleep(lease / 3) {
            return;
        }
        if shared.left.load(Ordering::SeqCst) || shared.is_stopped() {
            return;
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = match connect(cfg) {
                Ok(c) => Some(c),
                Err(e) => {
                    log::warn!(
                        "postgres: node {}: cannot reach the database: {e}",
                        id.get()
                    );
                    None
                }
            };
        }
        if let Some(old) = lost.clone() {
            match client.as_mut().map(|c| rejoin(c, cfg, &old)) {
                Some(Ok(new)) => {
                    log::warn!("postgres: node {old} rejoined as node {new}");
                    id.set(new);
                    lost = None;
                    renewed_at = Instant::now();
                    // The listener follows the new id and then asks for a rescan: whatever
                    // the old id owned is now another dead node's, to take over.
                }
                Some(Err(e)) => log::warn!("postgres: node {old}: cannot rejoin: {e}"),
                None => {}
            }
            if lost.is_some() && shared.sleep((lease / 3).min(MAX_BACKOFF)) {
                return;
            }
            continue;
        }
        let (generation, me) = id.current();
        let started = Instant::now();
        let mut lapsed = false;
        if let Some(c) = client.as_mut() {
            match renew(c, cfg, &me) {
                Ok(true) => renewed_at = started,
                Ok(false) => {
                    log::error!("postgres: node {me}: its lease lapsed");
                    lapsed = true;
                }
                Err(e) => log::warn!("postgres: node {me}: lease renewal: {e}"),
            }
            renewals += 1;
            if renewals.is_multiple_of(10) {
                if let Err(e) = forget_dead_nodes(c, lease) {
                    log::warn!("postgres: deleting dead nodes: {e}");
                }
            }
        }
        if lapsed || renewed_at.elapsed() >= lease {
            if shared.left.load(Ordering::SeqCst) {
                return;
            }
            log::error!("postgres: node {me}: lease lost; fencing what it acquired as {me}");
            let _ = tx.send(Signal::LeaseLost { generation });
            lost = Some(me);
        }
    }
}

/// Registers a new id for this node and ends the lease of `old` in one transaction (the
/// sessions `old` owned can be taken over at once); returns the new id.
fn rejoin(client: &mut Client, cfg: &PgConfig, old: &str) -> Result<Arc<str>, StoreError> {
    let new = fresh_id();
    let mut tx = client.transaction()?;
    tx.execute(
        "UPDATE node SET lease_until = LEAST(lease_until, now() - interval '1 second') \
         WHERE node_id = $1",
        &[&old],
    )?;
    tx.execute(
        "INSERT INTO node (node_id, name, started_at, lease_until) \
         VALUES ($1, $2, now(), now() + make_interval(secs => $3))",
        &[&&*new, &cfg.node_name, &cfg.lease().as_secs_f64()],
    )?;
    let payload = json!({ "node": old, "left": true }).to_string();
    tx.execute("SELECT pg_notify($1, $2)", &[&NODES_CHANNEL, &payload])?;
    tx.commit()?;
    Ok(new)
}

/// Renews the lease of node `me` unless it lapsed; returns whether it was renewed.
fn renew(client: &mut Client, cfg: &PgConfig, me: &str) -> Result<bool, postgres::Error> {
    let n = client.execute(
        "UPDATE node SET lease_until = now() + make_interval(secs => $2) \
         WHERE node_id = $1 AND lease_until > now()",
        &[&me, &cfg.lease().as_secs_f64()],
    )?;
    Ok(n > 0)
}

/// Deletes the rows of nodes whose lease lapsed more than ten leases ago and that no session
/// refers to.
fn forget_dead_nodes(client: &mut Client, lease: Duration) -> Result<u64, postgres::Error> {
    client.execute(
        "DELETE FROM node n WHERE n.lease_until < now() - make_interval(secs => $1) \
         AND NOT EXISTS (SELECT 1 FROM session s WHERE s.owner_node = n.node_id)",
        &[&(lease.as_secs_f64() * 10.0)],
    )
}

/// Connects the listener and subscribes to its channels (node `me`'s own among them).
fn subscribe(cfg: &PgConfig, me: &str) -> Result<Client, StoreError> {
    let mut client = connect(cfg)?;
    client.batch_execute(&format!(
        "LISTEN {}; LISTEN {EVENTS_CHANNEL}; LISTEN {NODES_CHANNEL}",
        quoted_channel(me)
    ))?;
    Ok(client)
}

/// Node `id`'s channel, double-quoted for `LISTEN`/`UNLISTEN`.
fn quoted_channel(id: &str) -> String {
    format!("\"{}\"", node_channel(id).replace('"', "\"\""))
}

/// Listens until stopped, reconnecting with a growing backoff, and following the node's id
/// when it rejoins under a new one.
fn listen_loop(cfg: &PgConfig, id: &NodeId, tx: &UnboundedSender<Signal>, shared: &Shared) {
    let lease = cfg.lease();
    let mut backoff = Duration::from_millis(50);
    while !shared.is_stopped() {
        let mut me = id.get();
        let mut client = match subscribe(cfg, &me) {
            Ok(client) => client,
            Err(e) => {
                log::warn!("postgres: node {me}: listener: {e}");
                if shared.sleep(backoff) {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // Whatever was sent while not listening is missed: look at the store.
        let _ = tx.send(Signal::Rescan);
        let mut rescanned = Instant::now();
        while !shared.is_stopped() {
            let current = id.get();
            if current != me {
                let moved = client.batch_execute(&format!(
                    "LISTEN {}; UNLISTEN {}",
                    quoted_channel(&current),
                    quoted_channel(&me)
                ));
                if let Err(e) = moved {
                    log::warn!("postgres: node {current}: listener lost: {e}");
                    break;
                }
                me = current;
                // What the old id owned is to be taken over, and nudges sent to the new
                // channel before it was listened to were missed: look at the store.
                let _ = tx.send(Signal::Rescan);
                rescanned = Instant::now();
            }
            let next = client.notifications().timeout_iter(POLL).next();
            match next {
                Ok(Some(n)) => {
                    if let Some(signal) = decode(&me, n.channel(), n.payload()) {
                        let _ = tx.send(signal);
                    }
                }
                Ok(None) if client.is_closed() => break,
                Ok(None) => {}
                Err(e) => {
                    log::warn!("postgres: node {me}: listener lost: {e}");
                    break;
                }
            }
            if rescanned.elapsed() >= lease {
                rescanned = Instant::now();
                let _ = tx.send(Signal::Rescan);
            }
        }
    }
}

/// A nudge's payload.
#[derive(Deserialize)]
struct NudgePayload {
    session: String,
    nudge: String,
    seq: u64,
}

/// A `ds_events` or `ds_nodes` payload.
#[derive(Deserialize)]
struct NodePayload {
    node: String,
    #[serde(default)]
    many: bool,
    #[serde(default)]
    sessions: Vec<(String, u64, u64)>,
    /// Sessions another node deleted, with the seq of their `session.deleted`.
    #[serde(default)]
    deleted: Vec<(String, u64)>,
}

/// The signal a notification on `channel` means to node `me`, if any.
pub(crate) fn decode(me: &str, channel: &str, payload: &str) -> Option<Signal> {
    let signal = match channel {
        EVENTS_CHANNEL => {
            let p: NodePayload = serde_json::from_str(payload).ok()?;
            if p.node == me {
                return None;
            }
            if !p.deleted.is_empty() {
                let deleted = p
                    .deleted
                    .into_iter()
                    .filter_map(|(s, seq)| Some((SessionId::new(s).ok()?, seq)))
                    .collect();
                Signal::Deleted(deleted)
            } else if p.many {
                Signal::ManyEvents
            } else {
                let events = p
                    .sessions
                    .into_iter()
                    .filter_map(|(s, from, to)| Some((SessionId::new(s).ok()?, from, to)))
                    .collect();
                Signal::Events(events)
            }
        }
        NODES_CHANNEL => {
            let p: NodePayload = serde_json::from_str(payload).ok()?;
            if p.node == me {
                return None;
            }
            Signal::Rescan
        }
        _ if channel == node_channel(me) => {
            let p: NudgePayload = serde_json::from_str(payload).ok()?;
            let nudge = match p.nudge.as_str() {
                "wake" => Nudge::Wake(p.seq),
                "interrupt" => Nudge::Interrupt(p.seq),
                _ => return None,
            };
            Signal::Nudge {
                session: SessionId::new(p.session).ok()?,
                nudge,
            }
        }
        _ => return None,
    };
    Some(signal)
}
