//! Sessions: creating them, reading and listing their rows, and claim counts.

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
        self.persistence
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
        self.persistence
            .read(move |conn| conn.get_session(&key))
            .await
    }

    /// Whether the session is stored.
    pub(crate) async fn session_exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        let key = id.clone();
        self.persistence
            .read(move |conn| conn.session_exists(&key))
            .await
    }

    /// Whether the session is stored and the seq of its latest interrupt request: what a
    /// session actor loads when it starts.
    pub(crate) async fn session_state(
        &self,
        id: SessionId,
    ) -> Result<(bool, Option<u64>), StoreError> {
        self.persistence
            .read(move |conn| {
                let exists = conn.session_exists(&id)?;
                let fence = if exists {
                    conn.latest_interrupt_seq(&id)?
                } else {
                    None
                };
                Ok((exists, fence))
            })
            .await
    }

    /// Sessions matching `query`, keyset-paged.
    pub(crate) async fn list_sessions(
        &self,
        query: ListQuery,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        self.persistence
            .read(move |conn| conn.list_sessions(&query))
            .await
    }

    /// How many sessions hold a claim, and the age of the oldest claim at `now`.
    pub(crate) async fn claim_stats(&self, now: i64) -> Result<ClaimStats, StoreError> {
        let (claimed, oldest): (i64, Option<i64>) = self
            .persistence
            .read(move |conn| conn.claim_counts(now))
            .await?;
        Ok(ClaimStats {
            claimed: u64::try_from(claimed).unwrap_or(0),
            oldest_claim_age_ms: oldest.map(|age| u64::try_from(age).unwrap_or(0)),
        })
    }
}
