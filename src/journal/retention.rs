//! Deleting sessions and compacting their event logs (retention).
//!
//! A deletion is one write request: it finds the session's tree (the session and every session
//! below it), checks that no turn holds a claim in it, and deletes every row of every session
//! of the tree, in one transaction. For each deleted session it records a `session.deleted`
//! event that is broadcast after COMMIT but never stored (the log went with the session): the
//! session's open event streams deliver it, then end.
//!
//! Compaction runs in passes: a read finds idle sessions whose log is longer than the policy
//! keeps, then write requests of [`COMPACT_CHUNK`] sessions each compact them, every session
//! re-checked inside the transaction (a turn may have claimed it since the read).

use std::collections::BTreeSet;

use serde_json::json;

use super::Journal;
use crate::config::RetainEvents;
use crate::error::StoreError;
use crate::event::{kind, EventRecord};
use crate::id::SessionId;

/// Sessions compacted per write request.
const COMPACT_CHUNK: usize = 64;

/// Candidates read per compaction round.
const COMPACT_ROUND: usize = 1024;

/// The most rounds of one compaction pass (a pass compacts at most this many rounds' worth;
/// the next pass goes on).
const COMPACT_ROUNDS: usize = 16;

/// What [`Journal::delete_session`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deletion {
    /// Deleted: the session and the sessions below it, the requested one first.
    Deleted(Vec<SessionId>),
    /// The session is not stored.
    Missing,
    /// A turn holds the claim of this session of the tree; nothing was written.
    Busy(SessionId),
}

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Compaction {
    /// Sessions whose log was compacted.
    pub(crate) sessions: usize,
    /// Events deleted.
    pub(crate) events: usize,
}

/// The `session.deleted` record of `session`, whose newest event was `latest`.
pub(crate) fn deleted_record(session: &SessionId, latest: Option<u64>, time: i64) -> EventRecord {
    EventRecord {
        session_id: session.clone(),
        seq: latest.map_or(0, |seq| seq + 1),
        kind: kind::DELETED.to_owned(),
        data: json!({ "sessionID": session }),
        time,
    }
}

impl Journal {
    /// `session` and every session below it, `session` first (empty when it is not stored).
    pub(crate) async fn session_tree(
        &self,
        session: SessionId,
    ) -> Result<Vec<SessionId>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.session_tree(&session))
            .await
    }

    /// Deletes `session` and every session below it, in one transaction, unless a turn holds
    /// the claim of one of them: any claim when `except_boot` is `None`, else only a claim
    /// this boot made (a turn of this process that is still running; claims of earlier boots
    /// or of other nodes are deleted with the session, and a turn still running elsewhere
    /// finds its session gone — fenced — at its next write).
    pub(crate) async fn delete_session(
        &self,
        session: SessionId,
        except_boot: Option<String>,
    ) -> Result<Deletion, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                let tree = w.store().session_tree(&session)?;
                if tree.is_empty() {
                    return Ok(Deletion::Missing);
                }
                w.store().lock_sessions(&tree)?;
                for id in &tree {
                    let Some(claim) = w.store().claim_state(id)? else {
                        continue;
                    };
                    let blocks = claim.time_suspended.is_some()
                        && except_boot
                            .as_deref()
                            .is_none_or(|boot| claim.claim_boot.as_deref() == Some(boot));
                    if blocks {
                        return Ok(Deletion::Busy(id.clone()));
                    }
                }
                let now = super::now_ms();
                for id in &tree {
                    let latest = w.store().latest_seq(id)?;
                    w.store().delete_session(id)?;
                    w.record(deleted_record(id, latest, now));
                }
                Ok(Deletion::Deleted(tree))
            })
            .await
    }

    /// The seq of the session's newest event, `None` before its first (or when not stored).
    pub(crate) async fn latest_seq(&self, session: SessionId) -> Result<Option<u64>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.latest_seq(&session))
            .await
    }

    /// The first seq the session's log holds for replay (0 until compacted); `None` when the
    /// session is not stored.
    pub(crate) async fn log_start(&self, session: SessionId) -> Result<Option<u64>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.log_start(&session))
            .await
    }

    /// One compaction pass with `policy` at `now` (ms): compacts every idle session's log
    /// that is longer than the policy keeps, except `busy` (the sessions with a turn in this
    /// process).
    pub(crate) async fn compact_events(
        &self,
        policy: RetainEvents,
        busy: BTreeSet<SessionId>,
        now: i64,
    ) -> Result<Compaction, StoreError> {
        let after_idle = i64::try_from(policy.after_idle.as_millis()).unwrap_or(i64::MAX);
        let idle_before = now.saturating_sub(after_idle);
        let keep = policy.keep_last;
        let mut done = Compaction::default();
        for _ in 0..COMPACT_ROUNDS {
            let found = self
                .inner
                .persistence
                .read(move |conn| conn.compactable(keep, idle_before, COMPACT_ROUND))
                .await?;
            let exhausted = found.len() < COMPACT_ROUND;
            let candidates: Vec<SessionId> =
                found.into_iter().filter(|id| !busy.contains(id)).collect();
            let mut compacted = 0;
            for chunk in candidates.chunks(COMPACT_CHUNK) {
                let chunk = chunk.to_vec();
                let (sessions, events) = self
                    .inner
                    .persistence
                    .write(move |w| {
                        let (mut sessions, mut events) = (0, 0);
                        for id in &chunk {
                            if let Some((_, deleted)) = w.store().compact(id, keep, idle_before)? {
                                sessions += 1;
                                events += deleted;
                            }
                        }
                        Ok((sessions, events))
                    })
                    .await?;
                compacted += sessions;
                done.sessions += sessions;
                done.events += events;
            }
            // A round that compacted nothing would find the same candidates again.
            if exhausted || compacted == 0 {
                break;
            }
        }
        Ok(done)
    }
}
