//! The writer thread's connection: BEGIN, a savepoint per request, COMMIT, and the one
//! `ds_events` notification of a batch that appended events.
//!
//! PostgreSQL aborts a transaction at its first failed statement: inside a savepoint, `ROLLBACK
//! TO` makes it usable again; outside one, only `ROLLBACK` does. The connection records every
//! failed statement ([`PgConn::failed`]), so [`WriterConnection::in_transaction`] is false for a
//! transaction that failed outside a savepoint (or whose connection is lost), and `COMMIT` of an
//! aborted transaction (which the server turns into a `ROLLBACK` without an error) fails.
//!
//! The notification: `{"node":<id>,"sessions":[[<session>,<lowest seq>,<highest seq>],…]}` on
//! channel `ds_events`, sent just before COMMIT (PostgreSQL delivers it at COMMIT, and only if
//! the transaction commits), naming every session the batch appended to. When that would
//! exceed [`MAX_PAYLOAD`] bytes: `{"node":<id>,"many":true}`.

use std::collections::HashMap;

use serde_json::json;

use super::conn::{connect, PgConn};
use super::{PgConfig, EVENTS_CHANNEL};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{Store, WriterConnection};

/// The largest `ds_events` payload sent (PostgreSQL's limit is 8,000 bytes).
pub(crate) const MAX_PAYLOAD: usize = 7_900;

/// The writer thread's connection.
pub(crate) struct PgWriter {
    /// The connection and its statements.
    conn: PgConn,
    /// How to reconnect.
    cfg: PgConfig,
    /// A transaction is open.
    in_tx: bool,
    /// The per-request savepoint is open.
    in_savepoint: bool,
    /// A statement failed outside a savepoint: the transaction is aborted.
    aborted: bool,
    /// How many appended events the batch had when the request's savepoint opened.
    mark: usize,
}

impl std::fmt::Debug for PgWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWriter")
            .field("conn", &self.conn)
            .field("in_tx", &self.in_tx)
            .finish_non_exhaustive()
    }
}

impl PgWriter {
    /// The writer on `conn`, reconnecting with `cfg` when the connection is lost.
    pub(crate) fn new(conn: PgConn, cfg: PgConfig) -> Self {
        Self {
            conn,
            cfg,
            in_tx: false,
            in_savepoint: false,
            aborted: false,
            mark: 0,
        }
    }

    /// Notes a statement that failed outside the savepoint since the last look.
    fn note_failure(&mut self) {
        if self.conn.failed && !self.in_savepoint {
            self.aborted = true;
        }
    }

    /// Sends the batch's `ds_events` notification (delivered at COMMIT).
    fn notify_events(&mut self) -> Result<(), StoreError> {
        if self.conn.appended.is_empty() {
            return Ok(());
        }
        let payload = events_payload(self.conn.node(), &self.conn.appended);
        self.conn
            .query_one("SELECT pg_notify($1, $2)", &[&EVENTS_CHANNEL, &payload])?;
        Ok(())
    }

    /// Forgets the transaction's state.
    fn reset(&mut self) {
        self.in_tx = false;
        self.in_savepoint = false;
        self.aborted = false;
        self.mark = 0;
        self.conn.appended.clear();
        self.conn.failed = false;
    }
}

/// The `ds_events` payload naming, per session in first-append order, the lowest and highest
/// seq `appended` holds; `{"node":…,"many":true}` when that exceeds [`MAX_PAYLOAD`] bytes.
pub(crate) fn events_payload(node: &str, appended: &[(SessionId, u64)]) -> String {
    let mut order: Vec<(&str, u64, u64)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (session, seq) in appended {
        match index.get(session.as_str()) {
            Some(&i) => {
                if let Some(entry) = order.get_mut(i) {
                    entry.1 = entry.1.min(*seq);
                    entry.2 = entry.2.max(*seq);
                }
            }
            None => {
                index.insert(session.as_str(), order.len());
                order.push((session.as_str(), *seq, *seq));
            }
        }
    }
    let sessions: Vec<_> = order
        .iter()
        .map(|(session, from, to)| json!([session, from, to]))
        .collect();
    let full = json!({ "node": node, "sessions": sessions }).to_string();
    if full.len() <= MAX_PAYLOAD {
        full
    } else {
        json!({ "node": node, "many": true }).to_string()
    }
}

impl WriterConnection for PgWriter {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.reset();
        if self.conn.is_closed() {
            log::warn!("postgres: the writer's connection was lost; reconnecting");
            let client = connect(&self.cfg)?;
            self.conn.replace_client(client);
        }
        self.conn.batch("BEGIN")?;
        self.in_tx = true;
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.note_failure();
        self.conn.failed = false;
        self.conn.batch("SAVEPOINT request")?;
        self.in_savepoint = true;
        self.mark = self.conn.appended.len();
        Ok(())
    }

    fn release(&mut self) -> Result<(), StoreError> {
        self.conn.batch("RELEASE SAVEPOINT request")?;
        self.in_savepoint = false;
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        self.conn.batch("ROLLBACK TO SAVEPOINT request")?;
        self.conn.failed = false;
        let mark = self.mark;
        self.conn.appended.truncate(mark);
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.note_failure();
        if self.aborted || (self.in_savepoint && self.conn.failed) {
            self.rollback();
            return Err(StoreError::Inconsistent(
                "the write transaction was aborted by a failed statement".into(),
            ));
        }
        let committed = self
            .notify_events()
            .and_then(|()| self.conn.batch("COMMIT"));
        if committed.is_err() {
            self.rollback();
        } else {
            self.reset();
        }
        committed
    }

    fn rollback(&mut self) {
        if self.in_tx && !self.conn.is_closed() {
            if let Err(e) = self.conn.batch("ROLLBACK") {
                log::error!("persistence: rollback failed: {e}");
            }
        }
        self.reset();
    }

    fn in_transaction(&mut self) -> bool {
        self.note_failure();
        self.in_tx && !self.aborted && !self.conn.is_closed()
    }

    fn store(&mut self) -> &mut dyn Store {
        &mut self.conn
    }

    fn release_memory(&mut self) {}
}
