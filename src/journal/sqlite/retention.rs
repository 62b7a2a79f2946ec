//! Deleting sessions and compacting their event logs ([`RetentionRows`]): the session tree,
//! every row keyed by a session, and the compaction of idle sessions' old events.
//! Every value is a bound parameter.

use std::borrow::Borrow;

use rusqlite::{Connection, OptionalExtension};

use super::recent::{newest_seq, segments_of, stream_of, time_of_latest};
use super::{get_seq, seq_param, session_id, SqliteStore, StoreError};
use crate::id::SessionId;
use crate::journal::backend::{EventRows, RetentionRows};
use crate::journal::rules::{self, LogState};

impl<C: Borrow<Connection>> RetentionRows for SqliteStore<C> {
    /// `session` and every session below it, `session` first; empty when it is not stored.
    fn session_tree(&mut self, session: &SessionId) -> Result<Vec<SessionId>, StoreError> {
        // `UNION` (not `UNION ALL`): a row seen twice is not walked again, so the walk ends even if
        // the parent links of a hand-edited database formed a cycle.
        let mut stmt = self.conn().prepare_cached(
            "WITH RECURSIVE tree(id) AS ( \
                 SELECT id FROM session WHERE id = ?1 \
                 UNION SELECT s.id FROM session s JOIN tree t ON s.parent_id = t.id \
             ) SELECT id FROM tree",
        )?;
        let ids = stmt
            .query_map([session.as_str()], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut tree = Vec::with_capacity(ids.len());
        for id in ids {
            let id = session_id(id)?;
            if &id == session {
                tree.insert(0, id);
            } else {
                tree.push(id);
            }
        }
        Ok(tree)
    }

    /// Deletes every row keyed by `session`: the inbox, the transcript, the event log and its
    /// number (which the writer forgets at once), the claim, the seq floor and the session row.
    fn delete_session(&mut self, session: &SessionId) -> Result<(), StoreError> {
        self.streams.forget(session);
        for sql in [
            "DELETE FROM session_input WHERE session_id = ?1",
            "DELETE FROM session_message WHERE session_id = ?1",
            concat!(
                "DELETE FROM event INDEXED BY event_log WHERE stream IN ",
                segments_of!("?1"),
                " AND recent = 0"
            ),
            concat!(
                "DELETE FROM event INDEXED BY event_recent WHERE stream IN ",
                segments_of!("?1"),
                " AND recent = 1"
            ),
            "DELETE FROM event_stream WHERE aggregate_id = ?1",
            "DELETE FROM session_claim WHERE session_id = ?1",
            "DELETE FROM event_floor WHERE aggregate_id = ?1",
            "DELETE FROM session WHERE id = ?1",
        ] {
            self.conn()
                .prepare_cached(sql)?
                .execute([session.as_str()])?;
        }
        Ok(())
    }

    /// Nothing: one writer serializes every write of a SQLite file.
    fn lock_sessions(&mut self, _sessions: &[SessionId]) -> Result<(), StoreError> {
        Ok(())
    }

    fn compactable(
        &mut self,
        keep_last: u64,
        idle_before: i64,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError> {
        // The newest event's time is looked up only for sessions the cheap tests let through, so a
        // pass over sessions compacted already costs one probe of each log's newest seq. A log
        // that kept no event (its newest seq is the fence, or none) has nothing more to compact.
        let mut stmt = self.conn().prepare_cached(concat!(
            "SELECT id FROM (SELECT s.id, s.log_start, ",
            newest_seq!("s.id"),
            " AS latest \
                  FROM session s \
                  WHERE NOT EXISTS (SELECT 1 FROM session_claim c \
                                    WHERE c.session_id = s.id AND c.time_suspended IS NOT NULL)) \
             WHERE latest >= 0 AND latest + 1 - log_start > ?1 \
               AND ",
            time_of_latest!("id"),
            " < ?2 LIMIT ?3"
        ))?;
        let ids = stmt
            .query_map(
                rusqlite::params![
                    seq_param(keep_last),
                    idle_before,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |row| row.get::<_, String>(0),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter().map(session_id).collect()
    }

    /// Compacts `session`'s log if it still qualifies (unclaimed, idle since before
    /// `idle_before`, more than `keep_last` events): deletes every event below the new start but
    /// the latest interrupt request, and records the start. When no event is kept (`keep_last`
    /// 0), the start is also the log's seq floor (`event_floor`): the next event gets it, as it
    /// would have with the newest event kept. Returns the start and how many events went.
    fn compact(
        &mut self,
        session: &SessionId,
        keep_last: u64,
        idle_before: i64,
    ) -> Result<Option<(u64, usize)>, StoreError> {
        let mut stmt = self.conn().prepare_cached(concat!(
            "SELECT latest, log_start, claimed, ",
            time_of_latest!("?1"),
            " FROM (SELECT ",
            newest_seq!("s.id"),
            " AS latest, s.log_start, \
                          EXISTS (SELECT 1 FROM session_claim c WHERE c.session_id = s.id \
                                  AND c.time_suspended IS NOT NULL) AS claimed \
                   FROM session s WHERE s.id = ?1) \
             WHERE latest >= 0"
        ))?;
        let found = stmt
            .query_row([session.as_str()], |row| {
                Ok(LogState {
                    latest: get_seq(row, 0)?,
                    start: get_seq(row, 1)?,
                    claimed: row.get(2)?,
                    newest_time: row.get(3)?,
                })
            })
            .optional()?;
        drop(stmt);
        let Some(log) = found else {
            return Ok(None);
        };
        let Some(start_now) = rules::compaction_start(log, keep_last, idle_before) else {
            return Ok(None);
        };
        let latest = log.latest;
        let fence = self.latest_interrupt_seq(session)?;
        self.streams.forget_appended();
        let mut deleted = 0;
        for sql in [
            concat!(
                "DELETE FROM event INDEXED BY event_log WHERE stream IN ",
                segments_of!("?1"),
                " AND recent = 0 AND seq < ?2 AND seq <> ?3"
            ),
            concat!(
                "DELETE FROM event INDEXED BY event_recent WHERE stream IN ",
                segments_of!("?1"),
                " AND recent = 1 AND seq < ?2 AND seq <> ?3"
            ),
        ] {
            deleted += self.conn().prepare_cached(sql)?.execute(rusqlite::params![
                session.as_str(),
                seq_param(start_now),
                fence.map_or(-1, seq_param)
            ])?;
        }
        self.conn()
            .prepare_cached("UPDATE session SET log_start = ?2 WHERE id = ?1")?
            .execute(rusqlite::params![session.as_str(), seq_param(start_now)])?;
        if start_now > latest {
            self.conn()
                .prepare_cached(
                    "INSERT INTO event_floor (aggregate_id, seq) VALUES (?1, ?2) \
                 ON CONFLICT (aggregate_id) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                )?
                .execute(rusqlite::params![session.as_str(), seq_param(start_now)])?;
        }
        Ok(Some((start_now, deleted)))
    }
}

#[cfg(test)]
mod tests;
