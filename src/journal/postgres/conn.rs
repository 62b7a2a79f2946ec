//! One connection with the store's statements: the prepared-statement cache, the error
//! bookkeeping the writer needs (did a statement fail, aborting the transaction?) and the
//! `(session, seq)` of every event appended since the writer last looked.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use super::{drop_off_runtime, PgConfig};
use crate::error::StoreError;
use crate::id::SessionId;

/// Statement parameters.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The client configuration of `cfg.url`: unless the URL says otherwise, connecting gives up
/// after the lease, and so does a connection whose sent data stays unacknowledged that long
/// (`tcp_user_timeout`), so that no call blocks much longer than a lease on a lost server.
pub(crate) fn client_config(cfg: &PgConfig) -> Result<postgres::Config, StoreError> {
    let mut config: postgres::Config = cfg.url.parse()?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(cfg.lease());
    }
    config.tcp_user_timeout(cfg.lease());
    Ok(config)
}

/// Connects to the store's database with this node's session settings.
pub(crate) fn connect(cfg: &PgConfig) -> Result<Client, StoreError> {
    let mut client = client_config(cfg)?.connect(NoTls)?;
    client.batch_execute(&cfg.session_settings())?;
    Ok(client)
}

/// A connection and what the store keeps per connection.
pub(crate) struct PgConn {
    /// The client; `None` only while being dropped.
    client: Option<Client>,
    /// Prepared statements by SQL text.
    statements: HashMap<String, Statement>,
    /// This node's id (written into event rows, compared with `owner_node`).
    node: std::sync::Arc<super::NodeId>,
    /// The `(session, seq)` of every event appended on this connection since the writer last
    /// took them.
    pub(crate) appended: Vec<(SessionId, u64)>,
    /// A statement failed since the flag was last cleared: the server aborted the transaction
    /// (or the innermost savepoint) it ran in.
    pub(crate) failed: bool,
    /// The results of the writer's run of turn writes its requests have not taken yet.
    pub(crate) prepared: std::collections::VecDeque<super::turn::Prepared>,
    /// Transaction control deferred by the writer (`BEGIN`, `RELEASE`, `SAVEPOINT`…), sent in
    /// one round trip together before the next statement.
    pending: String,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn")
            .field("node", &self.node)
            .field("statements", &self.statements.len())
            .finish_non_exhaustive()
    }
}

impl PgConn {
    /// Wraps a connected client of node `node`.
    pub(crate) fn new(client: Client, node: std::sync::Arc<super::NodeId>) -> Self {
        Self {
            client: Some(client),
            statements: HashMap::new(),
            node,
            appended: Vec::new(),
            failed: false,
            prepared: std::collections::VecDeque::new(),
            pending: String::new(),
        }
    }

    /// This node's current id.
    pub(crate) fn node_arc(&self) -> std::sync::Arc<str> {
        self.node.get()
    }

    /// This node's current id and its generation, read together.
    pub(crate) fn node_generation(&self) -> (u64, std::sync::Arc<str>) {
        self.node.current()
    }

    /// The client.
    pub(crate) fn client(&mut self) -> Result<&mut Client, StoreError> {
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Inconsistent("the connection is closed".into()))
    }

    /// Whether the connection to the server is lost.
    pub(crate) fn is_closed(&self) -> bool {
        self.client.as_ref().is_none_or(Client::is_closed)
    }

    /// Replaces a lost connection with `client` (prepared statements are per connection).
    pub(crate) fn replace_client(&mut self, client: Client) {
        self.statements.clear();
        self.pending.clear();
        if let Some(old) = self.client.replace(client) {
            drop_off_runtime(old);
        }
        self.failed = false;
    }

    /// Records a failed statement and wraps its error.
    fn fail(&mut self, e: postgres::Error) -> StoreError {
        self.failed = true;
        e.into()
    }

    /// Defers `sql` (transaction control, no result) until the next round trip.
    pub(crate) fn defer(&mut self, sql: &str) {
        if !self.pending.is_empty() {
            self.pending.push_str("; ");
        }
        self.pending.push_str(sql);
    }

    /// Whether transaction control is deferred (a transaction is being opened).
    pub(crate) fn has_deferred(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Forgets what was deferred.
    pub(crate) fn discard(&mut self) {
        self.pending.clear();
    }

    /// Sends what was deferred, in one round trip.
    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let sql = std::mem::take(&mut self.pending);
        self.batch(&sql)
    }

    /// The prepared statement for `sql` (prepared once per connection), after what was
    /// deferred.
    fn prepared(&mut self, sql: &str) -> Result<Statement, StoreError> {
        self.flush()?;
        if let Some(stmt) = self.statements.get(sql) {
            return Ok(stmt.clone());
        }
        let prepared = self.client()?.prepare(sql);
        let stmt = prepared.map_err(|e| self.fail(e))?;
        self.statements.insert(sql.to_owned(), stmt.clone());
        Ok(stmt)
    }

    /// Runs a query, returning its rows.
    pub(crate) fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let stmt = self.prepared(sql)?;
        let rows = self.client()?.query(&stmt, params);
        rows.map_err(|e| self.fail(e))
    }

    /// Runs a query returning at most one row.
    pub(crate) fn query_opt(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let stmt = self.prepared(sql)?;
        let row = self.client()?.query_opt(&stmt, params);
        row.map_err(|e| self.fail(e))
    }

    /// Runs a query returning exactly one row.
    pub(crate) fn query_one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        let stmt = self.prepared(sql)?;
        let row = self.client()?.query_one(&stmt, params);
        row.map_err(|e| self.fail(e))
    }

    /// Runs a statement, returning how many rows it changed.
    pub(crate) fn execute(&mut self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let stmt = self.prepared(sql)?;
        let n = self.client()?.execute(&stmt, params);
        n.map_err(|e| self.fail(e))
    }

    /// Runs a statement; a constraint violation is [`StoreError::Conflict`] described by
    /// `what`, as in the SQLite store.
    pub(crate) fn execute_or_conflict(
        &mut self,
        sql: &str,
        params: Params<'_>,
        what: impl FnOnce() -> String,
    ) -> Result<u64, StoreError> {
        match self.execute(sql, params) {
            Err(e) => Err(e.map_postgres(|e| conflict_on_constraint(e, what))),
            other => other,
        }
    }

    /// Runs SQL text (transaction control) without preparing it, ignoring what was deferred.
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        let done = self.client()?.batch_execute(sql);
        done.map_err(|e| self.fail(e))
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            drop_off_runtime(client);
        }
    }
}

/// Maps an integrity constraint violation (SQLSTATE class 23: unique, foreign key, check, not
/// null) to [`StoreError::Conflict`] described by `what`; other errors stay
/// [`StoreError::Postgres`].
pub(crate) fn conflict_on_constraint(
    err: postgres::Error,
    what: impl FnOnce() -> String,
) -> StoreError {
    match err.code() {
        Some(code) if code.code().starts_with("23") => {
            StoreError::Conflict(format!("{} ({err})", what()))
        }
        _ => err.into(),
    }
}
