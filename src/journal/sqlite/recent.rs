//! The event log's two indexes (schema version 7): recent entries and the settled history.
//! Both are keyed by `(stream, seq)` (version 9): `stream` is the log's number, given in
//! `event_stream` on its first event, so an entry is a dozen bytes, not a session id.
//!
//! An event is appended with `recent = 1`, indexed by `event_recent`: an index of a few
//! thousand entries, so a group commit touching many sessions dirties a few dozen of its
//! leaves rather than one leaf per session of the long history. The writer *settles* the log
//! from time to time ([`Settler`]): one `UPDATE` flips every recent row to `recent = 0`, which
//! moves its entry to `event_log`, the per-session history, one leaf per session for all the
//! events it got since the last settle.
//!
//! A session's recent seqs are always above its settled ones (a settle takes every recent row,
//! and a new event's seq is one past the newest of both), so a replay reads the settled part,
//! then the recent part. Statements name the index they need (`INDEXED BY`): one that cannot
//! use it fails when prepared instead of scanning the whole log.

use rusqlite::Connection;

use super::StoreError;
use crate::journal::backend::Maintenance;

/// The number of the newest segment of the log (`event_stream.k`; see
/// [`super::segments`]) of the session whose id is the SQL expression `$id`, as a scalar
/// subquery: NULL, which matches no entry, when it has none. The newest events of a log are
/// in its newest segment.
macro_rules! stream_of {
    ($id:literal) => {
        concat!(
            "(SELECT MAX(k) FROM event_stream WHERE aggregate_id = ",
            $id,
            ")"
        )
    };
}
pub(crate) use stream_of;

/// The numbers of every segment of the log of the session whose id is the SQL expression
/// `$id`, as a list subquery (for `stream IN …`).
macro_rules! segments_of {
    ($id:literal) => {
        concat!(
            "(SELECT k FROM event_stream WHERE aggregate_id = ",
            $id,
            ")"
        )
    };
}
pub(crate) use segments_of;

/// The newest seq of a session's log in either index, or -1 when it holds no event: a probe
/// of `event_recent`'s right edge, and of `event_log`'s only when the session has no recent
/// entry (its recent seqs are above its settled ones, so the first answers when there is one;
/// `COALESCE` stops at its first non-NULL argument). `newest_seq!(stream "?2")` names the log
/// by its number in the SQL expression given; `newest_seq!("s.id")`, by the session's id
/// ([`stream_of`]).
macro_rules! newest_seq {
    (stream $k:expr) => {
        concat!(
            "COALESCE((SELECT MAX(seq) FROM event INDEXED BY event_recent \
                       WHERE stream = ",
            $k,
            " AND recent = 1), \
                      (SELECT MAX(seq) FROM event INDEXED BY event_log \
                       WHERE stream = ",
            $k,
            " AND recent = 0), -1)"
        )
    };
    ($id:literal) => {
        newest_seq!(stream stream_of!($id))
    };
}
pub(crate) use newest_seq;

/// The time of the event whose seq is the column `latest` in the log of the session whose id
/// is the SQL expression `$id`, or NULL when there is none.
macro_rules! time_of_latest {
    ($id:literal) => {
        concat!(
            "COALESCE((SELECT e.time FROM event e INDEXED BY event_recent \
                       WHERE e.stream = ",
            stream_of!($id),
            " AND e.recent = 1 AND e.seq = latest), \
                      (SELECT e.time FROM event e INDEXED BY event_log \
                       WHERE e.stream = ",
            stream_of!($id),
            " AND e.recent = 0 AND e.seq = latest))"
        )
    };
}
pub(crate) use time_of_latest;

/// How many events may be appended after a settle before the writer settles again. A settle
/// writes a leaf of the history per session it finds, whatever number of events that session
/// got, so settling less often moves more events per leaf; in exchange a commit touches more
/// leaves of `event_recent` the more entries it holds, and a settle pauses the writer longer.
/// With the log's entries keyed by a dozen-byte number (schema v9), `growth`'s steady turns
/// ran fastest at this interval of the three measured (8,192, 16,384, 32,768), and a settle
/// costs less per event the more it moves; the price is a longer pause of a busy writer, about
/// once a second (docs/bench-notes/cost-that-stays-flat.md, "Schema v9").
pub(crate) const SETTLE_EVERY: i64 = 32_768;

/// How many events may be appended after a settle while the writer defers its housekeeping
/// ([`Maintenance::Deferred`]: the restart sweep) before it settles anyway. A sweep's orphans
/// get about two events each, so a settle in its midst writes a leaf of history for every two
/// events, and runs again after it for the turns' terminals, so the sweep's drains start
/// sooner with no settle before the end (`sweep`, docs/bench-notes/cost-that-stays-flat.md). The
/// bound keeps a sweep of very many orphans from growing `event_recent` past what a commit can
/// share.
pub(crate) const SETTLE_DEFERRED: i64 = 2 * SETTLE_EVERY;

/// Moves every recent event to the settled history (`event_log`), on the caller's
/// transaction. Returns how many moved.
pub(crate) fn settle_recent(conn: &Connection) -> Result<usize, StoreError> {
    Ok(conn
        .prepare_cached("UPDATE event INDEXED BY event_recent SET recent = 0 WHERE recent = 1")?
        .execute([])?)
}

/// The writer's record of when it last settled the log, by the event table's rowids (appended
/// in order, so the newest rowid less the one at the last settle bounds the recent entries).
#[derive(Debug, Default)]
pub(crate) struct Settler {
    /// The event table's newest rowid when the log was last settled; `None` before the first
    /// settle of this connection (recent rows left by an earlier process are settled then).
    settled_at: Option<i64>,
}

impl Settler {
    /// Settles the log in a transaction of its own when at least [`SETTLE_EVERY`] events came
    /// since the last settle ([`SETTLE_DEFERRED`] while deferred), or, idle, any. A failure is
    /// logged and left for the next time (nothing of a request depends on it: both indexes
    /// answer every read).
    pub(crate) fn maybe_settle(&mut self, conn: &Connection, when: Maintenance) {
        let newest = match conn
            .prepare_cached("SELECT COALESCE(MAX(rowid), 0) FROM event")
            .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)))
        {
            Ok(newest) => newest,
            Err(e) => {
                // Asked after every batch: a store that cannot answer (corrupt, gone) reports
                // it through the requests themselves, not here each time.
                log::debug!("persistence: cannot read the event log's end: {e}");
                return;
            }
        };
        let due = match (self.settled_at, when) {
            (None, _) => true,
            (Some(at), Maintenance::Idle) => newest > at,
            (Some(at), Maintenance::AfterWrite) => newest - at >= SETTLE_EVERY,
            (Some(at), Maintenance::Deferred) => newest - at >= SETTLE_DEFERRED,
        };
        if !due || !conn.is_autocommit() {
            return;
        }
        // The mark moves even when the settle fails, so a failing store is not retried after
        // every commit.
        self.settled_at = Some(newest);
        if let Err(e) = Self::settle(conn) {
            log::warn!("persistence: settling the event log failed (retried later): {e}");
        }
    }

    /// One `UPDATE` in autocommit mode: the statement is its own transaction. Inside an
    /// explicit one, SQLite would keep a statement journal for it (the update may fail on
    /// `event_log`'s uniqueness halfway, and only the statement would be undone), copying each
    /// page it first touches there: about an eighth of a settle's time (`perf`, `growth`).
    fn settle(conn: &Connection) -> Result<(), StoreError> {
        settle_recent(conn).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::id::SessionId;
    use crate::journal::sqlite::event::{EVENTS_AFTER_SQL, NEXT_SEQ_SQL};
    use crate::journal::sqlite::test_support::rows::*;
    use crate::journal::sqlite::test_support::{create, plan, sid, test_db};
    use crate::journal::sqlite::SqliteStore;
    fn recent_rows(conn: &Connection) -> rusqlite::Result<i64> {
        conn.query_row(
            "SELECT COUNT(*) FROM event INDEXED BY event_recent WHERE recent = 1",
            [],
            |row| row.get(0),
        )
    }

    fn seqs(conn: &mut SqliteStore, s: &SessionId, after: Option<u64>, limit: usize) -> Vec<u64> {
        conn.events_after(s, after, limit)
            .expect("read")
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    /// Reads answer the same whichever index holds an event: a replay crosses from the
    /// settled history into the recent entries in seq order (a limit stopping on either side),
    /// and the next seq follows the newest of both.
    #[test]
    fn a_replay_reads_the_settled_history_then_the_recent_entries() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let (a, b) = (sid("a"), sid("b"));
        create(conn, "a", None, 1)?;
        create(conn, "b", None, 1)?;
        for _ in 0..3 {
            conn.publish(&a, "custom.kind", &json!({}), 2)?;
        }
        conn.publish(&b, "custom.kind", &json!({}), 2)?;
        // `session.created` of each, and the four above.
        assert_eq!(settle_recent(conn)?, 6);
        assert_eq!(recent_rows(conn)?, 0);
        assert_eq!(conn.latest_seq(&a)?, Some(3));
        for _ in 0..2 {
            conn.publish(&a, "custom.kind", &json!({}), 3)?;
        }
        assert_eq!(recent_rows(conn)?, 2);
        assert_eq!(conn.latest_seq(&a)?, Some(5));
        assert_eq!(conn.latest_seq(&b)?, Some(1));
        assert_eq!(seqs(conn, &a, None, 100), [0, 1, 2, 3, 4, 5]);
        assert_eq!(seqs(conn, &a, Some(2), 2), [3, 4]);
        assert_eq!(seqs(conn, &a, None, 2), [0, 1]);
        assert_eq!(seqs(conn, &a, Some(3), 100), [4, 5]);
        assert_eq!(seqs(conn, &b, None, 100), [0, 1]);
        let stored: Vec<u64> = conn.stored_events(&a)?.iter().map(|e| e.seq).collect();
        assert_eq!(stored, [0, 1, 2, 3, 4, 5]);
        // A compaction and a deletion reach both indexes.
        let ids: Vec<String> = conn
            .compactable(1, i64::MAX, 10)?
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(conn.compact(&a, 1, i64::MAX)?, Some((5, 5)));
        assert_eq!(seqs(conn, &a, None, 100), [5]);
        conn.delete_session(&b)?;
        assert!(conn.stored_events(&b)?.is_empty());
        assert_eq!(conn.publish(&a, "custom.kind", &json!({}), 4)?.seq, 6);
        Ok(())
    }

    /// The writer settles once [`SETTLE_EVERY`] events came since the last time
    /// ([`SETTLE_DEFERRED`] while it defers its housekeeping), or when idle, in a transaction of
    /// its own, and never inside a caller's transaction.
    #[test]
    fn the_writer_settles_after_enough_events_or_when_idle() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        let a = sid("a");
        create(conn, "a", None, 1)?;
        let mut settler = Settler::default();
        // The first call of a connection settles what an earlier process left.
        settler.maybe_settle(conn, Maintenance::AfterWrite);
        assert_eq!(recent_rows(conn)?, 0);
        conn.publish(&a, "custom.kind", &json!({}), 2)?;
        settler.maybe_settle(conn, Maintenance::AfterWrite);
        assert_eq!(recent_rows(conn)?, 1, "one event is not enough");
        conn.execute_batch("BEGIN")?;
        settler.maybe_settle(conn, Maintenance::Idle);
        conn.execute_batch("COMMIT")?;
        assert_eq!(recent_rows(conn)?, 1, "not inside the caller's transaction");
        settler.maybe_settle(conn, Maintenance::Idle);
        assert_eq!(recent_rows(conn)?, 0, "idle: whatever came");
        conn.execute_batch("BEGIN")?;
        for _ in 0..SETTLE_EVERY {
            conn.publish(&a, "custom.kind", &json!({}), 3)?;
        }
        conn.execute_batch("COMMIT")?;
        settler.maybe_settle(conn, Maintenance::Deferred);
        assert_eq!(recent_rows(conn)?, SETTLE_EVERY, "deferred: not yet");
        settler.maybe_settle(conn, Maintenance::AfterWrite);
        assert_eq!(recent_rows(conn)?, 0);
        assert_eq!(
            conn.latest_seq(&a)?,
            Some(u64::try_from(SETTLE_EVERY + 1).unwrap_or(0))
        );
        conn.execute_batch("BEGIN")?;
        for _ in 0..SETTLE_DEFERRED {
            conn.publish(&a, "custom.kind", &json!({}), 4)?;
        }
        conn.execute_batch("COMMIT")?;
        settler.maybe_settle(conn, Maintenance::Deferred);
        assert_eq!(recent_rows(conn)?, 0, "deferred, but not past its bound");
        Ok(())
    }

    /// Every read of a session's log searches an index by its id: none scans the event table
    /// or a whole index, whatever the history holds.
    #[test]
    fn every_log_read_searches_one_session_in_each_index() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let conn = &mut db.conn;
        for sql in [NEXT_SEQ_SQL, EVENTS_AFTER_SQL] {
            let lines = plan(conn, sql)?;
            let reads: Vec<&String> = lines.iter().filter(|l| l.contains(" event ")).collect();
            assert_eq!(reads.len(), 2, "{sql}: {lines:?}");
            for index in ["event_log", "event_recent"] {
                assert!(
                    reads.iter().any(|l| l.starts_with("SEARCH")
                        && l.contains(&format!("INDEX {index} (stream=?"))),
                    "{sql}: {index}: {lines:?}"
                );
            }
            assert!(
                !lines.iter().any(|l| l.contains("TEMP B-TREE")),
                "{sql}: sorts: {lines:?}"
            );
        }
        Ok(())
    }
}
