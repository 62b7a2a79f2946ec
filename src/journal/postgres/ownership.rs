//! Ownership of sessions by nodes: acquiring a session (a new fencing epoch on every change of
//! owner), checking a turn's epoch under a row lock, giving sessions up, and routing a nudge to
//! the live node that owns a session.

use serde_json::json;

use super::conn::PgConn;
use super::{node_channel, seq_value, session_id};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{Nudge, Ownership, OwnershipRows, Route};
use crate::journal::rules;

/// The payload of a nudge on a node's channel: `{"session":<id>,"nudge":"wake"|"interrupt",
/// "seq":<seq>}`.
fn nudge_payload(session: &SessionId, nudge: Nudge) -> String {
    let (kind, seq) = match nudge {
        Nudge::Wake(seq) => ("wake", seq),
        Nudge::Interrupt(seq) => ("interrupt", seq),
    };
    json!({ "session": session.as_str(), "nudge": kind, "seq": seq }).to_string()
}

impl OwnershipRows for PgConn {
    /// [`OwnershipRows::acquire_under`], without the generation.
    fn acquire(&mut self, session: &SessionId) -> Result<Ownership, StoreError> {
        Ok(self.acquire_under(session)?.0)
    }

    /// Takes `session` for this node unless a live node other than this one owns it: the epoch
    /// grows unless this node owns it already. One conditional update (the lease compared with
    /// the database's clock); when it takes nothing, the owner is read (and should that owner have
    /// released it in between, the update is tried again).
    ///
    /// A session another boot left claimed (its node died or left mid-turn) is not taken here:
    /// that turn is the takeover's, which adopts it with the restart sweep's rules (an attempt
    /// counted, the restart notice, the resumption handed to the runner, `aborted` over budget, the
    /// interrupt fence). Taking it here would let a wake start a plain turn over the dead turn's
    /// claim. It reads as [`Ownership::Elsewhere`], naming the boot that holds the claim; the
    /// durable wake mark or interrupt request is served when the takeover resumes the turn.
    ///
    /// Returns the generation of the node id it acquired as (one id throughout, however the node's
    /// id changes meanwhile).
    fn acquire_under(&mut self, session: &SessionId) -> Result<(Ownership, u64), StoreError> {
        let (generation, me) = self.node_generation();
        let owned = |ownership| Ok((ownership, generation));
        for _ in 0..3 {
            let taken = self.query_opt(
                concat!(
                    "UPDATE session AS s SET ",
                    take_ownership!("$2"),
                    " WHERE s.id = $1 AND ",
                    not_held_elsewhere!("$2"),
                    " AND (s.owner_node = $2 OR s.time_suspended IS NULL OR s.claim_boot = $2) \
                     RETURNING s.owner_epoch"
                ),
                &[&session.as_str(), &&*me],
            )?;
            if let Some(row) = taken {
                return owned(Ownership::Owned {
                    epoch: seq_value(row.try_get(0)?)?,
                });
            }
            let owner = self.query_opt(
                "SELECT owner_node, CASE WHEN time_suspended IS NOT NULL THEN claim_boot END \
                 FROM session WHERE id = $1",
                &[&session.as_str()],
            )?;
            match owner {
                None => return owned(Ownership::Missing),
                Some(row) => {
                    if let Some(node) = row.try_get::<_, Option<String>>(0)? {
                        if node != *me {
                            return owned(Ownership::Elsewhere { node });
                        }
                    }
                    // Nobody owns it, and another boot's claim holds it: the takeover's.
                    if let Some(boot) = row.try_get::<_, Option<String>>(1)? {
                        if boot != *me {
                            return owned(Ownership::Elsewhere { node: boot });
                        }
                    }
                }
            }
        }
        Err(StoreError::Inconsistent(format!(
            "the owner of session {session} kept changing while it was acquired"
        )))
    }

    /// Fails with [`StoreError::Fenced`] unless this node owns `session` at `epoch` (a missing
    /// session is fenced too). The session's row stays locked (`FOR NO KEY UPDATE`: every change of
    /// owner waits, inserts that only reference the session do not) until the transaction ends.
    fn check_fence(&mut self, session: &SessionId, epoch: u64) -> Result<(), StoreError> {
        let row = self.query_opt(
            "SELECT owner_node, owner_epoch FROM session WHERE id = $1 FOR NO KEY UPDATE",
            &[&session.as_str()],
        )?;
        let fenced = || StoreError::Fenced {
            session_id: session.clone(),
            epoch,
        };
        let Some(row) = row else {
            return Err(fenced());
        };
        let owner: Option<String> = row.try_get(0)?;
        let current = seq_value(row.try_get(1)?)?;
        if owner.as_deref() == Some(&*self.node_arc()) && current == epoch {
            Ok(())
        } else {
            Err(fenced())
        }
    }

    /// Gives up this node's ownership of `sessions` (the epoch stays; the next owner increments
    /// it). Claims are kept.
    fn release_ownership(&mut self, sessions: &[SessionId]) -> Result<(), StoreError> {
        if sessions.is_empty() {
            return Ok(());
        }
        let me = self.node_arc();
        let ids: Vec<&str> = sessions.iter().map(SessionId::as_str).collect();
        self.execute(
            "UPDATE session SET owner_node = NULL WHERE id = ANY($1) AND owner_node = $2",
            &[&ids, &&*me],
        )?;
        Ok(())
    }

    /// Where `nudge` must be carried out: on the live node other than this one that owns `session`
    /// (notified on its channel, delivered at COMMIT), else here — unless the session holds a turn
    /// another boot left claimed (its node died or left): that turn is the takeover's (see
    /// [`OwnershipRows::acquire`]), which serves the durable wake mark or interrupt request when it
    /// resumes the turn, so nothing is carried out here (`Remote` naming that boot, nobody
    /// notified).
    fn route(&mut self, session: &SessionId, nudge: Nudge) -> Result<Route, StoreError> {
        let me = self.node_arc();
        let owner = self.query_opt(
            "SELECT s.owner_node FROM session s JOIN node n ON n.node_id = s.owner_node \
             WHERE s.id = $1 AND s.owner_node <> $2 AND n.lease_until > now()",
            &[&session.as_str(), &&*me],
        )?;
        let Some(row) = owner else {
            let orphan = self.query_opt(
                "SELECT COALESCE(claim_boot, '') FROM session WHERE id = $1 \
                 AND time_suspended IS NOT NULL AND claim_boot IS DISTINCT FROM $2 \
                 AND owner_node IS DISTINCT FROM $2",
                &[&session.as_str(), &&*me],
            )?;
            return Ok(match orphan {
                Some(row) => Route::Remote {
                    node: row.try_get(0)?,
                },
                None => Route::Local,
            });
        };
        let node: String = row.try_get(0)?;
        let payload = nudge_payload(session, nudge);
        self.query_one(
            "SELECT pg_notify($1, $2)",
            &[&node_channel(&node), &payload],
        )?;
        Ok(Route::Remote { node })
    }

    /// Wakes and interrupts other nodes routed to sessions this node owns, as the rows hold them,
    /// older than `before` (ms): see [`OwnershipRows::missed_nudges`]. Both reads start from the
    /// sessions this node owns (`session_owner`).
    fn missed_nudges(&mut self, before: i64) -> Result<Vec<(SessionId, Nudge)>, StoreError> {
        let me = self.node_arc();
        let wakes = self.query(
            "SELECT i.session_id, MAX(i.admitted_seq) FROM session s \
             JOIN session_input i ON i.session_id = s.id \
             WHERE s.owner_node = $1 AND s.time_suspended IS NULL \
               AND i.promoted_seq IS NULL AND i.wake AND i.time_created < $2 \
             GROUP BY i.session_id ORDER BY i.session_id",
            &[&&*me, &before],
        )?;
        let claimed = self.query(
            "SELECT s.id, s.claim_seq, \
                    (SELECT MAX(e.seq) FROM event e WHERE e.aggregate_id = s.id \
                       AND e.type = 'session.interrupt.requested' AND e.time < $2) \
             FROM session s WHERE s.owner_node = $1 AND s.time_suspended IS NOT NULL \
             ORDER BY s.id",
            &[&&*me, &before],
        )?;
        let mut missed = Vec::with_capacity(wakes.len());
        for row in wakes {
            let session = session_id(row.try_get(0)?)?;
            missed.push((session, Nudge::Wake(seq_value(row.try_get(1)?)?)));
        }
        for row in claimed {
            let claim: Option<i64> = row.try_get(1)?;
            let claim = claim.map(seq_value).transpose()?.unwrap_or(0);
            let fence: Option<i64> = row.try_get(2)?;
            let fence = fence.map(seq_value).transpose()?;
            if let (true, Some(fence)) = (rules::interrupts_turn(Some(claim), fence), fence) {
                missed.push((session_id(row.try_get(0)?)?, Nudge::Interrupt(fence)));
            }
        }
        Ok(missed)
    }
}
