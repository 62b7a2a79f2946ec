//! The writer thread's connection: BEGIN, the savepoints of a batch run again request by
//! request, COMMIT, and the one
//! `ds_events` notification of a batch that appended events.
//!
//! PostgreSQL aborts a transaction at its first failed statement: inside a savepoint, `ROLLBACK
//! TO` makes it usable again; outside one, only `ROLLBACK` does. The connection records every
//! failed statement ([`PgConn::failed`]), so [`WriterConnection::in_transaction`] is false for a
//! transaction that failed outside a savepoint (or whose connection is lost), and `COMMIT` of an
//! aborted transaction (which the server turns into a `ROLLBACK` without an error) fails.
//!
//! The notification: `{"node":<id>,"sessions":[[<session>,<lowest seq>,<highest seq>],…]}` on
//! channel `ds_events`, sent with the COMMIT (PostgreSQL delivers it at COMMIT, and only if
//! the transaction commits), naming every session the batch appended to. When that would
//! exceed [`MAX_PAYLOAD`] bytes: `{"node":<id>,"many":true}`.

use std::collections::HashMap;

use serde_json::json;

use super::conn::{connect, PgConn};
use super::{PgConfig, EVENTS_CHANNEL};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::{Batching, Store, WriterConnection};
use crate::journal::turn_write::TurnWrite;

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
    /// The last request's savepoint is kept but its `RELEASE` not yet sent.
    release_due: bool,
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
            release_due: false,
        }
    }

    /// Notes a statement that failed outside the savepoint since the last look.
    fn note_failure(&mut self) {
        if self.conn.failed && !self.in_savepoint {
            self.aborted = true;
        }
    }

    /// Defers the batch's `ds_events` notification (delivered at COMMIT), as a literal: it goes
    /// out with the COMMIT, in the same round trip.
    fn notify_events(&mut self) {
        if self.conn.appended.is_empty() {
            return;
        }
        let payload = events_payload(&self.conn.node_arc(), &self.conn.appended);
        // `standard_conforming_strings` is on (the session settings): only quotes double.
        let literal = payload.replace('\'', "''");
        self.conn.defer(&format!(
            "SELECT pg_notify('{EVENTS_CHANNEL}', '{literal}')"
        ));
    }

    /// Defers the `RELEASE` of the last request's savepoint, if due.
    fn defer_release(&mut self) {
        if self.release_due {
            self.release_due = false;
            self.conn.defer("RELEASE SAVEPOINT request");
        }
    }

    /// Forgets the transaction's state.
    fn reset(&mut self) {
        self.in_tx = false;
        self.in_savepoint = false;
        self.aborted = false;
        self.mark = 0;
        self.release_due = false;
        self.conn.appended.clear();
        self.conn.prepared.clear();
        self.conn.failed = false;
        self.conn.discard();
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

/// Transaction control is deferred and sent with the next statement, in one round trip: `BEGIN`
/// with the first request's `SAVEPOINT`, each `RELEASE` with the next `SAVEPOINT`, the last
/// `RELEASE`, the notification and `COMMIT` together. A deferred command that fails surfaces at
/// the next round trip, which then fails (and with it the batch): nothing commits that should
/// not.
impl WriterConnection for PgWriter {
    fn begin(&mut self) -> Result<(), StoreError> {
        self.reset();
        if self.conn.is_closed() {
            log::warn!("postgres: the writer's connection was lost; reconnecting");
            let client = connect(&self.cfg)?;
            self.conn.replace_client(client);
        }
        self.conn.defer("BEGIN");
        self.in_tx = true;
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.note_failure();
        self.conn.failed = false;
        self.defer_release();
        self.conn.defer("SAVEPOINT request");
        self.in_savepoint = true;
        self.mark = self.conn.appended.len();
        Ok(())
    }

    fn release(&mut self) -> Result<(), StoreError> {
        if self.in_savepoint && self.conn.failed {
            // A failed statement left the savepoint aborted: RELEASE would fail.
            return Err(StoreError::Inconsistent(
                "a request's savepoint was aborted by a failed statement".into(),
            ));
        }
        self.release_due = true;
        self.in_savepoint = false;
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        self.conn.defer("ROLLBACK TO SAVEPOINT request");
        self.conn.flush()?;
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
        self.defer_release();
        self.notify_events();
        self.conn.defer("COMMIT");
        let committed = self.conn.flush();
        if committed.is_err() {
            self.rollback();
        } else {
            self.reset();
        }
        committed
    }

    fn rollback(&mut self) {
        // Nothing deferred is sent; a transaction whose BEGIN was never sent gets a warning
        // from the server, not an error.
        self.conn.discard();
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

    /// A savepoint and its release cost a round trip per request (sent with the next
    /// statement's, but a round trip of their own): a batch first runs without them. A lone
    /// turn write commits in one round trip instead of three (`BEGIN`, the call, the
    /// notification with `COMMIT`), and a run of them in one (`ds_turns`).
    fn batching(&self) -> Batching {
        Batching {
            optimistic: true,
            turns_alone: true,
            turn_runs: true,
        }
    }

    fn commit_turn(&mut self, turn: &TurnWrite) -> Result<bool, StoreError> {
        super::turn::commit_turn(&mut self.conn, turn, crate::journal::now_ms())
    }

    fn after_turn(&mut self) {
        self.conn.appended.clear();
        self.conn.prepared.clear();
        self.conn.failed = false;
    }

    fn store(&mut self) -> &mut dyn Store {
        &mut self.conn
    }

    fn release_memory(&mut self) {}
}
