//! The SQLite store ([`SqliteStore`]): a connection and the writer's memory of log numbers,
//! owned together, with the statements of every table of the journal's seam implemented on it,
//! each trait in the file named for its table ([`session`], [`event`], [`input`], [`message`],
//! [`claim`], [`retention`], [`ownership`], [`turn`], and [`projection`] for the projection's
//! row writes).
//!
//! No statement opens a transaction: the caller decides the transaction boundary, so one request
//! or a whole group commit is atomic. Writes go through an append, which adds an event to the
//! session's log and runs its projection in the same transaction. Statements are cached per
//! connection (`prepare_cached`) and every value is a bound parameter. The writer's store also
//! remembers each log's number ([`streams`]), inside its own transactions only; a store over a
//! pooled connection (a read) remembers nothing.
//!
//! This module does not depend on actix.

use std::borrow::Borrow;

use rusqlite::Connection;

use super::columns::{json_text, json_value, message_id, seq_param, session_id};
use crate::error::StoreError;

pub(crate) mod backend;
mod claim;
mod event;
mod input;
mod message;
mod ownership;
pub(crate) mod pool;
mod projection;
pub(crate) mod recent;
mod retention;
pub(crate) mod schema;
mod segments;
mod session;
mod streams;
mod turn;
mod wal;

pub(crate) use pool::{open, open_connection, Pool, StoreConfig};

/// The SQLite store: the statements of every table on connection `C` (the writer's own
/// [`Connection`], or a pooled one for a read), and the writer's memory of log numbers
/// ([`streams::Streams`]), which answers inside the writer's transactions only (a store that
/// never begins one, like a reader's, remembers nothing).
#[derive(Debug)]
pub(crate) struct SqliteStore<C = Connection> {
    /// The connection every statement runs on.
    conn: C,
    /// What the writer remembers of log numbers and of the seqs its transaction appended.
    streams: streams::Streams,
}

impl<C: Borrow<Connection>> SqliteStore<C> {
    /// A store on `conn` (a connection with the store's PRAGMAs applied), with empty memory.
    pub(crate) fn new(conn: C) -> Self {
        Self {
            conn,
            streams: streams::Streams::default(),
        }
    }

    /// The connection the statements run on.
    fn conn(&self) -> &Connection {
        self.conn.borrow()
    }
}

/// The connection under a test's store, for its raw statements.
#[cfg(test)]
impl<C: Borrow<Connection>> std::ops::Deref for SqliteStore<C> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn()
    }
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
    //! Fixtures for the store's unit tests: a migrated database in a temporary directory, and
    //! the seam's compositions ([`Store`]'s provided methods) on a SQLite store.

    use rusqlite::Connection;
    use tempfile::TempDir;

    use super::pool::{self, StoreConfig};
    use super::SqliteStore;
    use crate::error::StoreError;
    use crate::id::{MessageId, SessionId};
    use serde_json::Value;

    use crate::event::EventRecord;
    use crate::journal::backend::Store;
    use crate::records::{Admission, Delivery, Message, MessagesQuery, SessionInfo};

    /// The statements' traits, for a test to call them on a store (`use rows::*`).
    pub(crate) mod rows {
        pub(crate) use crate::journal::backend::{
            ClaimRows, EventRows, InputRows, MessageRows, RetentionRows, SessionRows, Store,
        };
    }

    /// A temporary directory, with the I/O error carried as a store error.
    pub(crate) fn tempdir() -> Result<TempDir, StoreError> {
        tempfile::tempdir().map_err(|e| StoreError::Inconsistent(format!("tempdir: {e}")))
    }

    /// A migrated database file and one store on it (a connection with the store's PRAGMAs).
    pub(crate) struct TestDb {
        /// Keeps the directory (and the file) alive for the test.
        pub(crate) _dir: TempDir,
        /// The configuration the database was opened with.
        pub(crate) cfg: StoreConfig,
        /// A store on a plain connection, outside any writer (it remembers no log number);
        /// its connection is reached through `Deref`.
        pub(crate) conn: SqliteStore<Connection>,
    }

    /// Opens a fresh, migrated database.
    pub(crate) fn test_db() -> Result<TestDb, StoreError> {
        let dir = tempdir()?;
        let cfg = StoreConfig::new(dir.path().join("store.db"));
        drop(pool::open(&cfg)?);
        let conn = SqliteStore::new(pool::open_connection(&cfg)?);
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
        store: &mut (impl Store + ?Sized),
        id: &str,
        parent: Option<&str>,
        time: i64,
    ) -> Result<SessionInfo, StoreError> {
        Ok(store.create_session(&info(id, parent, time))?.0)
    }

    /// Claims `id` by the projection's claim merge (whether the session is stored).
    pub(crate) fn claim<C: std::borrow::Borrow<Connection>>(
        store: &mut SqliteStore<C>,
        id: &SessionId,
        now: i64,
        seq: u64,
        boot: &str,
    ) -> Result<bool, StoreError> {
        crate::journal::projection::claim(store, id, now, seq, boot)
    }

    /// [`Store::admit`] on a store.
    pub(crate) fn admit(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        id: &MessageId,
        prompt: &Value,
        delivery: Delivery,
        now: i64,
    ) -> Result<(Admission, Option<EventRecord>), StoreError> {
        store.admit(session, id, prompt, delivery, now)
    }

    /// [`Store::promote_steer`] on a store.
    pub(crate) fn promote_steer(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        cutoff: Option<u64>,
        now: i64,
    ) -> Result<Vec<(Admission, EventRecord)>, StoreError> {
        store.promote_steer(session, cutoff, now)
    }

    /// [`Store::promote_queue`] on a store.
    pub(crate) fn promote_queue(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        now: i64,
    ) -> Result<Option<(Admission, EventRecord)>, StoreError> {
        store.promote_queue(session, now)
    }

    /// [`Store::settle`] on a store.
    pub(crate) fn settle(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
    ) -> Result<Option<u64>, StoreError> {
        store.settle(session)
    }

    /// [`Store::served_inputs`] on a store.
    pub(crate) fn served_inputs(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        claim: u64,
        fence: Option<u64>,
    ) -> Result<Vec<Admission>, StoreError> {
        store.served_inputs(session, claim, fence)
    }

    /// [`Store::messages`] on a store.
    pub(crate) fn messages(
        store: &mut (impl Store + ?Sized),
        query: &MessagesQuery,
    ) -> Result<Vec<Message>, StoreError> {
        store.messages(query)
    }

    /// [`Store::context`] on a store.
    pub(crate) fn context(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
    ) -> Result<Vec<Message>, StoreError> {
        store.context(session)
    }

    /// [`Store::messages_after`] on a store.
    pub(crate) fn messages_after(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        after: Option<u64>,
    ) -> Result<Vec<Message>, StoreError> {
        store.messages_after(session, after)
    }

    /// [`Store::messages_tail`] on a store.
    pub(crate) fn messages_tail(
        store: &mut (impl Store + ?Sized),
        session: &SessionId,
        n: usize,
    ) -> Result<Vec<Message>, StoreError> {
        store.messages_tail(session, n)
    }

    /// Publishes `session.execution.started` for `s` (a turn claimed by boot `b`); its seq.
    pub(crate) fn started(
        store: &mut (impl Store + ?Sized),
        s: &SessionId,
    ) -> Result<u64, StoreError> {
        let boot = serde_json::json!({ "boot": "b" });
        Ok(store
            .publish(s, crate::event::kind::EXECUTION_STARTED, &boot, 1)?
            .seq)
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
