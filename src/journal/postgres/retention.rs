//! Deleting sessions and compacting their event logs (the SQLite store's `retention`,
//! statement for statement), plus what several nodes need: the rows of a deleted tree are
//! locked before they are checked, and the other nodes are told of a deletion (a `ds_events`
//! notification `{"node":<id>,"deleted":[[<session>,<seq>]]}`, delivered at COMMIT) so that
//! their event streams of the session end too.

use serde_json::json;

use super::conn::PgConn;
use super::{seq_param, seq_value, session_id, EVENTS_CHANNEL};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{EventRows, RetentionRows};
use crate::journal::rules::{self, LogState};

impl RetentionRows for PgConn {
    /// `session` and every session below it, `session` first; empty when it is not stored.
    fn session_tree(&mut self, session: &SessionId) -> Result<Vec<SessionId>, StoreError> {
        let rows = self.query(
            "WITH RECURSIVE tree(id) AS ( \
                 SELECT id FROM session WHERE id = $1 \
                 UNION SELECT s.id FROM session s JOIN tree t ON s.parent_id = t.id \
             ) SELECT id FROM tree",
            &[&session.as_str()],
        )?;
        let mut tree = Vec::with_capacity(rows.len());
        for row in rows {
            let id = session_id(row.try_get(0)?)?;
            if &id == session {
                tree.insert(0, id);
            } else {
                tree.push(id);
            }
        }
        Ok(tree)
    }

    /// Locks the rows of `sessions` until the transaction ends (in id order, so two deletions of
    /// overlapping trees cannot deadlock).
    fn lock_sessions(&mut self, sessions: &[SessionId]) -> Result<(), StoreError> {
        let ids: Vec<&str> = sessions.iter().map(SessionId::as_str).collect();
        self.query(
            "SELECT id FROM session WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&ids],
        )?;
        Ok(())
    }

    /// Deletes every row keyed by `session` and notifies the other nodes (at COMMIT) with the seq
    /// its `session.deleted` carries.
    fn delete_session(&mut self, session: &SessionId) -> Result<(), StoreError> {
        let latest = self.latest_seq(session)?;
        let s = session.as_str();
        for sql in [
            "DELETE FROM session_input WHERE session_id = $1",
            "DELETE FROM session_message WHERE session_id = $1",
            "DELETE FROM event WHERE aggregate_id = $1",
            "DELETE FROM event_sequence WHERE aggregate_id = $1",
            "DELETE FROM session WHERE id = $1",
        ] {
            self.execute(sql, &[&s])?;
        }
        let seq = latest.map_or(0, |seq| seq + 1);
        let payload = json!({ "node": &*self.node_arc(), "deleted": [[s, seq]] }).to_string();
        self.query_one("SELECT pg_notify($1, $2)", &[&EVENTS_CHANNEL, &payload])?;
        Ok(())
    }

    fn compactable(
        &mut self,
        keep_last: u64,
        idle_before: i64,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(
            "SELECT s.id FROM session s JOIN event_sequence q ON q.aggregate_id = s.id \
             WHERE s.time_suspended IS NULL AND q.seq + 1 - s.log_start > $1 \
               AND (SELECT e.time FROM event e WHERE e.aggregate_id = s.id AND e.seq = q.seq) < $2 \
             LIMIT $3",
            &[&seq_param(keep_last), &idle_before, &limit],
        )?;
        rows.iter().map(|row| session_id(row.try_get(0)?)).collect()
    }

    /// Compacts `session`'s log if it still qualifies, its row locked meanwhile (a claim of
    /// another node waits); see the SQLite store's `compact`.
    fn compact(
        &mut self,
        session: &SessionId,
        keep_last: u64,
        idle_before: i64,
    ) -> Result<Option<(u64, usize)>, StoreError> {
        let s = session.as_str();
        let row = self.query_opt(
            "SELECT q.seq, s.log_start, s.time_suspended IS NOT NULL, \
                    (SELECT e.time FROM event e WHERE e.aggregate_id = s.id AND e.seq = q.seq) \
             FROM session s JOIN event_sequence q ON q.aggregate_id = s.id WHERE s.id = $1 \
             FOR UPDATE OF s",
            &[&s],
        )?;
        let Some(row) = row else {
            return Ok(None);
        };
        let log = LogState {
            latest: seq_value(row.try_get(0)?)?,
            start: seq_value(row.try_get(1)?)?,
            claimed: row.try_get(2)?,
            newest_time: row.try_get(3)?,
        };
        let Some(start_now) = rules::compaction_start(log, keep_last, idle_before) else {
            return Ok(None);
        };
        let fence = self.latest_interrupt_seq(session)?;
        let deleted = self.execute(
            "DELETE FROM event WHERE aggregate_id = $1 AND seq < $2 AND seq <> $3",
            &[&s, &seq_param(start_now), &fence.map_or(-1, seq_param)],
        )?;
        self.execute(
            "UPDATE session SET log_start = $2 WHERE id = $1",
            &[&s, &seq_param(start_now)],
        )?;
        Ok(Some((
            start_now,
            usize::try_from(deleted).unwrap_or(usize::MAX),
        )))
    }
}
