//! Sessions: creating them, reading and listing their rows, and claim counts.

use super::backend::{Nudge, Ownership};
use super::loads::load_one;
use super::Journal;
use crate::error::StoreError;
use crate::id::SessionId;
use crate::records::{ListQuery, SessionInfo};

/// What [`Journal::create_session`] did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Created {
    /// The session was created (its row and `session.created` committed together).
    New(SessionInfo),
    /// A session with this id was stored already; it is returned unchanged.
    Existing(SessionInfo),
    /// The parent the new session names is not stored; nothing was written.
    NoParent(SessionId),
}

/// What [`Journal::load_session`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// Who owns the session (`Missing` when it is not stored).
    pub(crate) ownership: Ownership,
    /// The seq of its latest interrupt request.
    pub(crate) fence: Option<u64>,
    /// The generation of the node id it was acquired under (0 with a single-node store).
    pub(crate) node: u64,
}

/// How many sessions hold a claim and how old the oldest claim is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClaimStats {
    /// Sessions whose `time_suspended` is set (a turn is or was in flight).
    pub claimed: u64,
    /// Milliseconds since the oldest claim was made; `None` when nothing is claimed.
    pub oldest_claim_age_ms: Option<u64>,
}

impl Journal {
    /// Creates `info` unless its id is stored (then returns the stored row): concurrent creates
    /// of one id yield one row, one `session.created` event, and exactly one [`Created::New`].
    /// The parent is checked only for a new session.
    pub(crate) async fn create_session(&self, info: SessionInfo) -> Result<Created, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                if let Some(existing) = w.store().get_session(&info.id)? {
                    return Ok(Created::Existing(existing));
                }
                if let Some(parent) = &info.parent_id {
                    if !w.store().session_exists(parent)? {
                        return Ok(Created::NoParent(parent.clone()));
                    }
                }
                let (stored, event) = w.store().create_session(&info)?;
                if let Some(event) = event {
                    w.record(event);
                }
                Ok(Created::New(stored))
            })
            .await
    }

    /// The stored session, if any.
    pub(crate) async fn session(&self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError> {
        let key = id.clone();
        self.inner
            .persistence
            .read(move |conn| conn.get_session(&key))
            .await
    }

    /// Whether the session is stored.
    pub(crate) async fn session_exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        let key = id.clone();
        self.inner
            .persistence
            .read(move |conn| conn.session_exists(&key))
            .await
    }

    /// What a session actor loads when it starts: whether the session is stored, who owns it
    /// (taking it for this node when no live node does), and the seq of its latest interrupt
    /// request. A read when one process owns the database; a write (the ownership may change)
    /// when several nodes share it.
    pub(crate) async fn load_session(&self, id: SessionId) -> Result<Loaded, StoreError> {
        if self.inner.shared {
            self.inner
                .persistence
                .write(move |w| load_one(w.store(), &id))
                .await
        } else {
            self.load_batched(id).await
        }
    }

    /// Carries `nudge` to the owner of `session`, for an actor that found another live node
    /// owning it: in one transaction, takes the session for this node if no live node owns it
    /// any more (then returns the new epoch: carry the nudge out here), or has the owner
    /// notified at COMMIT (`None`). `None` as well when the session is not stored. The epoch
    /// comes with the generation of the node id it was taken under (see [`Loaded::node`]).
    pub(crate) async fn forward(
        &self,
        session: SessionId,
        nudge: Nudge,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.inner
            .persistence
            .write(move |w| match w.store().acquire_under(&session)? {
                (Ownership::Owned { epoch }, node) => Ok(Some((epoch, node))),
                (Ownership::Elsewhere { .. }, _) => {
                    w.store().route(&session, nudge)?;
                    Ok(None)
                }
                (Ownership::Missing, _) => Ok(None),
            })
            .await
    }

    /// Sessions matching `query`, keyset-paged.
    pub(crate) async fn list_sessions(
        &self,
        query: ListQuery,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.list_sessions(&query))
            .await
    }

    /// How many sessions hold a claim, and the age of the oldest claim at `now`.
    pub(crate) async fn claim_stats(&self, now: i64) -> Result<ClaimStats, StoreError> {
        let (claimed, oldest): (i64, Option<i64>) = self
            .inner
            .persistence
            .read(move |conn| conn.claim_counts(now))
            .await?;
        Ok(ClaimStats {
            claimed: u64::try_from(claimed).unwrap_or(0),
            oldest_claim_age_ms: oldest.map(|age| u64::try_from(age).unwrap_or(0)),
        })
    }
}
