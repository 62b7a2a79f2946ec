//! The SQLite store: plain rusqlite functions over a connection, transaction or savepoint.
//!
//! Every function takes `&rusqlite::Connection` (a `Transaction` or `Savepoint` derefs to one) and
//! never opens a transaction itself: the caller decides the transaction boundary, so one request
//! or a whole group commit is atomic. Writes go through [`publish`], which appends an event to the
//! session's log and runs its projection ([`project`]) in the same transaction. Statements are
//! cached per connection (`prepare_cached`) and every value is a bound parameter.
//! The writer connection also remembers each log's number (`streams`), inside its own
//! transactions only.
//!
//! This module does not depend on actix.

use super::columns::{json_text, json_value, message_id, seq_param, session_id};
use crate::error::StoreError;

pub(crate) mod backend;
mod claim;
mod event;
mod input;
mod maintenance;
mod message;
pub(crate) mod pool;
mod projection;
pub(crate) mod recent;
mod recovery;
mod retention;
pub(crate) mod schema;
mod segments;
mod session;
mod streams;
mod wal;

pub(crate) use claim::{
    claim_counts, claim_row, claim_state, count_adoption, count_own_resume, count_resume,
    list_claimed, own_claims, release, release_child_claims, write_claim,
};
#[allow(unused_imports)]
pub(crate) use event::{
    append, events_after, latest_interrupt_seq, latest_seq, project, publish, stored_events,
};
#[allow(unused_imports)]
pub(crate) use input::{get_input, pending_inputs};
#[allow(unused_imports)]
pub(crate) use maintenance::{
    delete_projections, projection_counts, transcript_owner, undecodable_message,
};
pub(crate) use message::{append_message, get_message, message_exists, message_seq, scan_messages};
#[allow(unused_imports)]
pub(crate) use pool::{open, open_connection, Pool, StoreConfig};
pub(crate) use recovery::{
    adoptable, claim_seq, claimed_turn, clear_wakes, clear_wakes_before, mark_interrupted,
    mark_wake, owes_turn, promoted_after, user_message_after,
};
pub(crate) use retention::{compact, compactable, delete_session, log_start, session_tree};
#[allow(unused_imports)]
pub(crate) use session::{create_session, get_session, list_sessions, session_exists};

/// A `LIMIT` parameter: SQLite treats a negative limit as "no limit".
fn limit_param(limit: Option<usize>) -> i64 {
    limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

/// Reads a seq column (rusqlite maps `u64` only with its `fallible_uint` feature).
fn get_seq(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let raw: i64 = row.get(idx)?;
    u64::try_from(raw).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Integer, Box::new(e))
    })
}

/// Reads a nullable seq column.
fn get_opt_seq(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Option<u64>> {
    match row.get_ref(idx)? {
        rusqlite::types::ValueRef::Null => Ok(None),
        _ => get_seq(row, idx).map(Some),
    }
}

/// Maps a constraint violation to [`StoreError::Conflict`] described by `what`; other errors
/// pass through as [`StoreError::Database`].
fn conflict_on_constraint(err: rusqlite::Error, what: impl FnOnce() -> String) -> StoreError {
    match err.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => {
            StoreError::Conflict(format!("{} ({err})", what()))
        }
        _ => err.into(),
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Fixtures for the store's unit tests: a migrated database in a temporary directory.

    use rusqlite::Connection;
    use tempfile::TempDir;

    use super::pool::{self, StoreConfig};
    use crate::error::StoreError;
    use crate::id::{MessageId, SessionId};
    use serde_json::Value;

    use crate::event::EventRecord;
    use crate::journal::backend::Store;
    use crate::records::{Admission, Delivery, Message, MessagesQuery, SessionInfo};

    /// A temporary directory, with the I/O error carried as a store error.
    pub(crate) fn tempdir() -> Result<TempDir, StoreError> {
        tempfile::tempdir().map_err(|e| StoreError::Inconsistent(format!("tempdir: {e}")))
    }

    /// A migrated database file and one connection to it with the store's PRAGMAs.
    pub(crate) struct TestDb {
        /// Keeps the directory (and the file) alive for the test.
        pub(crate) _dir: TempDir,
        /// The configuration the database was opened with.
        pub(crate) cfg: StoreConfig,
        /// A plain connection.
        pub(crate) conn: Connection,
    }

    /// Opens a fresh, migrated database.
    pub(crate) fn test_db() -> Result<TestDb, StoreError> {
        let dir = tempdir()?;
        let cfg = StoreConfig::new(dir.path().join("store.db"));
        drop(pool::open(&cfg)?);
        let conn = pool::open_connection(&cfg)?;
        Ok(TestDb {
            _dir: dir,
            cfg,
            conn,
        })
    }

    /// A session id from a test literal.
    pub(crate) fn sid(s: &str) -> SessionId {
        SessionId::new(s).expect("valid test session id")
    }

    /// A message id from a test literal.
    pub(crate) fn mid(s: &str) -> MessageId {
        MessageId::new(s).expect("valid test message id")
    }

    /// A session with the given id, parent and creation time.
    pub(crate) fn info(id: &str, parent: Option<&str>, time: i64) -> SessionInfo {
        SessionInfo {
            id: sid(id),
            parent_id: parent.map(sid),
            title: format!("session {id}"),
            directory: "/work".into(),
            agent: None,
            model: None,
            metadata: None,
            time_created: time,
            time_updated: time,
            time_suspended: None,
            resume_attempts: 0,
        }
    }

    /// Creates a session through the store and returns it.
    pub(crate) fn create(
        conn: &Connection,
        id: &str,
        parent: Option<&str>,
        time: i64,
    ) -> Result<SessionInfo, StoreError> {
        Ok(super::create_session(conn, &info(id, parent, time))?.0)
    }

    /// Claims `id` by the projection's claim merge (whether the session is stored).
    pub(crate) fn claim(
        conn: &Connection,
        id: &SessionId,
        now: i64,
        seq: u64,
        boot: &str,
    ) -> Result<bool, StoreError> {
        crate::journal::projection::claim(&mut super::projection::Rows(conn), id, now, seq, boot)
    }

    /// [`Store::admit`] on a plain connection.
    pub(crate) fn admit(
        conn: &mut Connection,
        session: &SessionId,
        id: &MessageId,
        prompt: &Value,
        delivery: Delivery,
        now: i64,
    ) -> Result<(Admission, Option<EventRecord>), StoreError> {
        Store::admit(conn, session, id, prompt, delivery, now)
    }

    /// [`Store::promote_steer`] on a plain connection.
    pub(crate) fn promote_steer(
        conn: &mut Connection,
        session: &SessionId,
        cutoff: Option<u64>,
        now: i64,
    ) -> Result<Vec<(Admission, EventRecord)>, StoreError> {
        Store::promote_steer(conn, session, cutoff, now)
    }

    /// [`Store::promote_queue`] on a plain connection.
    pub(crate) fn promote_queue(
        conn: &mut Connection,
        session: &SessionId,
        now: i64,
    ) -> Result<Option<(Admission, EventRecord)>, StoreError> {
        Store::promote_queue(conn, session, now)
    }

    /// [`Store::settle`] on a plain connection.
    pub(crate) fn settle(
        conn: &mut Connection,
        session: &SessionId,
    ) -> Result<Option<u64>, StoreError> {
        Store::settle(conn, session)
    }

    /// [`Store::served_inputs`] on a plain connection.
    pub(crate) fn served_inputs(
        conn: &mut Connection,
        session: &SessionId,
        claim: u64,
        fence: Option<u64>,
    ) -> Result<Vec<Admission>, StoreError> {
        Store::served_inputs(conn, session, claim, fence)
    }

    /// [`Store::messages`] on a plain connection.
    pub(crate) fn messages(
        conn: &mut Connection,
        query: &MessagesQuery,
    ) -> Result<Vec<Message>, StoreError> {
        Store::messages(conn, query)
    }

    /// [`Store::context`] on a plain connection.
    pub(crate) fn context(
        conn: &mut Connection,
        session: &SessionId,
    ) -> Result<Vec<Message>, StoreError> {
        Store::context(conn, session)
    }

    /// [`Store::messages_after`] on a plain connection.
    pub(crate) fn messages_after(
        conn: &mut Connection,
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<Message>, StoreError> {
        Store::messages_after(conn, session, after)
    }

    /// [`Store::messages_tail`] on a plain connection.
    pub(crate) fn messages_tail(
        conn: &mut Connection,
        session: &SessionId,
        n: usize,
    ) -> Result<Vec<Message>, StoreError> {
        Store::messages_tail(conn, session, n)
    }

    /// The detail lines of `EXPLAIN QUERY PLAN` for `sql`.
    pub(crate) fn plan(conn: &Connection, sql: &str) -> rusqlite::Result<Vec<String>> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
        // Unbound parameters are NULL: the plan does not depend on them.
        let mut rows = stmt.raw_query();
        let mut lines = Vec::new();
        while let Some(row) = rows.next()? {
            lines.push(row.get::<_, String>(3)?);
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_ms_is_after_2020() {
        assert!(crate::journal::now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn constraint_violations_become_conflicts() -> Result<(), StoreError> {
        let db = test_support::test_db()?;
        db.conn.execute(
            "INSERT INTO event(aggregate_id, stream, seq, type, data, time) \
             VALUES ('a', 1, 0, 'x', '{}', 0)",
            [],
        )?;
        let err = db
            .conn
            .execute(
                "INSERT INTO event(aggregate_id, stream, seq, type, data, time) \
                 VALUES ('a', 1, 0, 'y', '{}', 1)",
                [],
            )
            .map_err(|e| conflict_on_constraint(e, || "duplicate".into()));
        assert!(matches!(err, Err(StoreError::Conflict(m)) if m.starts_with("duplicate")));
        let err = db
            .conn
            .execute("SELECT * FROM no_such_table", [])
            .map_err(|e| conflict_on_constraint(e, || "unused".into()));
        assert!(matches!(err, Err(StoreError::Database(_))));
        Ok(())
    }
}
