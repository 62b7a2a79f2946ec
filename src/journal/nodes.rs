//! What a node sharing its database with other nodes asks of the journal: its signals (the
//! database's notifications), the events other nodes committed, giving up ownership, and
//! leaving. With a single-node store these are no-ops.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc::UnboundedReceiver;

use super::backend::Signal;
use super::Journal;
use crate::error::StoreError;
use crate::id::SessionId;

/// How old a wake or interrupt request must be before a rescan carries it out again: a routed
/// nudge normally arrives within milliseconds, and carrying one out twice is harmless (a wake is
/// advisory, an interrupt is fenced by its seq) but not free.
const MISSED_AFTER_MS: i64 = 1_000;

/// Events of other nodes read per session per notification, at most.
const RELAY_PAGE: usize = 1024;

impl Journal {
    /// Whether several nodes share the database.
    pub(crate) fn is_shared(&self) -> bool {
        self.inner.shared
    }

    /// This node's current id when several nodes share the database (it changes when the node
    /// rejoins after losing its lease); `None` with a single-node store.
    pub(crate) fn node_id(&self) -> Option<std::sync::Arc<str>> {
        #[cfg(feature = "postgres")]
        if let Some(node) = &self.inner.node {
            return Some(node.id());
        }
        None
    }

    /// What other nodes asked of this node's sessions, a second or more ago, that it may never
    /// have been told (see [`super::backend::Store::missed_nudges`]); nothing with a
    /// single-node store.
    pub(crate) async fn missed_nudges(&self) -> Result<Vec<(SessionId, super::Nudge)>, StoreError> {
        if !self.inner.shared {
            return Ok(Vec::new());
        }
        let before = super::now_ms() - MISSED_AFTER_MS;
        self.inner
            .persistence
            .read(move |store| store.missed_nudges(before))
            .await
    }

    /// The database's signals to this node (taken once; `None` with a single-node store).
    pub(crate) fn take_signals(&self) -> Option<UnboundedReceiver<Signal>> {
        #[cfg(feature = "postgres")]
        if let Some(node) = &self.inner.node {
            return node.take_signals();
        }
        None
    }

    /// Reads the events other nodes committed (`from..=to` of each session) and publishes them
    /// on this node's bus, so live followers here see them.
    pub(crate) async fn relay(&self, batches: Vec<(SessionId, u64, u64)>) {
        let read = self
            .inner
            .persistence
            .read(move |store| {
                let mut events = Vec::new();
                for (session, from, to) in batches {
                    let after = from.checked_sub(1);
                    let limit = usize::try_from(to.saturating_sub(from) + 1)
                        .unwrap_or(RELAY_PAGE)
                        .min(RELAY_PAGE);
                    events.extend(store.events_after(&session, after, limit)?);
                }
                Ok(events)
            })
            .await;
        match read {
            Ok(events) => self.inner.persistence.rebroadcast(events),
            Err(e) => {
                log::warn!("cannot relay other nodes' events: {e}; followers re-read");
                self.resync();
            }
        }
    }

    /// Publishes, on this node's bus, the `session.deleted` of sessions another node deleted
    /// (`(session, seq)`), so that their streams here end too.
    pub(crate) fn relay_deleted(&self, deleted: Vec<(SessionId, u64)>) {
        let now = super::now_ms();
        let records = deleted
            .into_iter()
            .map(|(session, seq)| super::deleted_record(&session, seq.checked_sub(1), now))
            .collect();
        self.inner.persistence.rebroadcast(records);
    }

    /// Tells every live follower to re-read its session from the store.
    pub(crate) fn resync(&self) {
        self.inner.resyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times followers were told to re-read (a follower re-reads when it changed).
    pub(crate) fn resyncs(&self) -> u64 {
        self.inner.resyncs.load(Ordering::Relaxed)
    }

    /// Gives up this node's ownership of `session` (a passivated actor), queued at once: a new
    /// actor of the session, started after this call, takes it again after the release (the
    /// writer serves requests in order).
    pub(crate) fn release_ownership(
        &self,
        session: SessionId,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + use<> {
        let shared = self.inner.shared;
        let released = shared.then(|| {
            self.inner
                .persistence
                .write_now(move |w| w.store().release_ownership(std::slice::from_ref(&session)))
        });
        async move {
            match released {
                Some(released) => released.await,
                None => Ok(()),
            }
        }
    }

    /// Leaves the cluster at a graceful shutdown: gives up every session this node owns (their
    /// claims stay), ends its lease at once and tells the other nodes, which take the claimed
    /// turns over without waiting a lease.
    pub(crate) async fn leave(&self) {
        #[cfg(feature = "postgres")]
        if self.inner.node.is_some() {
            let inner = self.inner.clone();
            let left = actix_rt::task::spawn_blocking(move || match &inner.node {
                Some(node) => node.leave(),
                None => Ok(()),
            })
            .await;
            match left {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::warn!("leaving the cluster failed: {e}"),
                Err(e) => log::warn!("leaving the cluster failed: {e}"),
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl Journal {
    /// Opens a PostgreSQL database shared with other nodes: migrations, this node's row and
    /// lease, its listener, the writer thread.
    pub(super) fn open_postgres(
        config: &crate::config::RuntimeConfig,
        url: &str,
        boot: &str,
    ) -> Result<Self, StoreError> {
        let node_name = config
            .node_name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()));
        let backend = super::postgres::open(&super::postgres::PgConfig {
            url: url.to_owned(),
            node_id: boot.to_owned(),
            node_name,
            lease: config.lease,
            pool_size: config.pool_size,
        })?;
        let persistence = super::persistence::Persistence::start(
            backend.readers,
            backend.writer,
            config.group_commit,
            config.bus_capacity,
        )?;
        Ok(Self {
            inner: std::sync::Arc::new(super::Inner {
                persistence,
                shared: true,
                resyncs: std::sync::atomic::AtomicU64::new(0),
                loads: super::loads::Loads::default(),
                node: Some(backend.node),
            }),
        })
    }
}

/// The machine's name, for a node's default name.
#[cfg(feature = "postgres")]
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}
