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

use crate::error::StoreError;
use crate::id::{MessageId, SessionId};

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
    claim, claim_counts, claim_state, count_adoption, count_own_resume, count_resume, list_claimed,
    own_claims, release, release_child_claims,
};
#[allow(unused_imports)]
pub(crate) use event::{
    append, events_after, latest_interrupt_seq, latest_seq, project, publish, stored_events,
};
#[allow(unused_imports)]
pub(crate) use input::{admit, get_input, pending_inputs, promote_queue, promote_steer};
#[allow(unused_imports)]
pub(crate) use maintenance::{
    delete_projections, projection_counts, transcript_owner, undecodable_message,
};
pub(crate) use message::{
    append_message, context, get_message, message_exists, messages, messages_after, messages_tail,
};
#[allow(unused_imports)]
pub(crate) use pool::{open, open_connection, Pool, StoreConfig};
pub(crate) use recovery::{
    adoptable, claim_seq, claimed_turn, clear_wakes, mark_interrupted, mark_wake, owes_turn,
    served_inputs, settle,
};
pub(crate) use retention::{compact, compactable, delete_session, log_start, session_tree};
#[allow(unused_imports)]
pub(crate) use session::{create_session, get_session, list_sessions, session_exists};

/// Encodes a JSON payload for a TEXT column.
fn json_text(value: &serde_json::Value) -> Result<String, StoreError> {
    Ok(serde_json::to_string(value)?)
}

/// Decodes a TEXT column holding JSON; a malformed payload is [`StoreError::Json`].
fn json_value(text: &str) -> Result<serde_json::Value, StoreError> {
    Ok(serde_json::from_str(text)?)
}

/// Decodes a stored session id.
fn session_id(s: String) -> Result<SessionId, StoreError> {
    SessionId::new(s).map_err(|e| StoreError::Inconsistent(format!("stored session id: {e}")))
}

/// Decodes a stored message id.
fn message_id(s: String) -> Result<MessageId, StoreError> {
    MessageId::new(s).map_err(|e| StoreError::Inconsistent(format!("stored message id: {e}")))
}

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

/// A seq as an SQL integer, saturating (seqs never come near `i64::MAX`).
fn seq_param(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
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
    use crate::records::SessionInfo;

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
