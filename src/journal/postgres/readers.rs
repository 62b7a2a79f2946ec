//! The readers' pool: r2d2 over `r2d2_postgres`'s manager, each pooled connection wrapped in a
//! [`PgConn`] so that it keeps its prepared statements and knows this node's id (the sweep's
//! listings leave out sessions other live nodes own). Reads run in autocommit.

use std::sync::Arc;
use std::time::Duration;

use postgres::NoTls;
use r2d2::ManageConnection;
use r2d2_postgres::PostgresConnectionManager;

use super::conn::{client_config, PgConn};
use super::PgConfig;
use crate::error::StoreError;
use crate::journal::backend::{ReadWork, Readers};

/// `r2d2_postgres`'s manager, making [`PgConn`]s with this node's session settings.
pub(crate) struct PgManager {
    /// Connects.
    inner: PostgresConnectionManager<NoTls>,
    /// This node's id.
    node: Arc<super::NodeId>,
    /// The `SET` statements of every connection.
    settings: String,
}

impl std::fmt::Debug for PgManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgManager")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PgConn, postgres::Error> {
        let mut client = self.inner.connect()?;
        client.batch_execute(&self.settings)?;
        Ok(PgConn::new(client, self.node.clone()))
    }

    fn is_valid(&self, conn: &mut PgConn) -> Result<(), postgres::Error> {
        match conn.client() {
            Ok(client) => self.inner.is_valid(client),
            // Never: a pooled connection always holds its client.
            Err(_) => Ok(()),
        }
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.is_closed()
    }
}

/// The readers' pool.
pub(crate) struct PgReaders {
    pool: r2d2::Pool<PgManager>,
}

impl std::fmt::Debug for PgReaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgReaders")
            .field("size", &self.pool.max_size())
            .finish()
    }
}

impl PgReaders {
    /// Builds the pool (every connection opened now, as the SQLite pool does).
    pub(crate) fn open(cfg: &PgConfig, node: Arc<super::NodeId>) -> Result<Self, StoreError> {
        let config = client_config(cfg)?;
        let manager = PgManager {
            inner: PostgresConnectionManager::new(config, NoTls),
            node,
            settings: cfg.session_settings(),
        };
        let pool = r2d2::Pool::builder()
            .max_size(cfg.pool_size.max(1))
            .min_idle(None)
            .connection_timeout(cfg.lease() + Duration::from_secs(1))
            .build(manager)?;
        Ok(Self { pool })
    }
}

impl Readers for PgReaders {
    fn read(&self, work: ReadWork<'_>) -> Result<(), StoreError> {
        let mut conn = self.pool.get()?;
        // A read that failed must not leave anything behind on a pooled connection.
        conn.failed = false;
        conn.appended.clear();
        work(&mut *conn)
    }

    fn release_memory(&self) {}

    fn size(&self) -> usize {
        self.pool.max_size() as usize
    }
}
