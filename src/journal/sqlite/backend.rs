//! The SQLite backend of the journal's seam, beside its store ([`super::SqliteStore`], the
//! statements): the writer thread's connection ([`SqliteWriter`]: transactions, savepoints,
//! the engine's housekeeping and checkpoints, over a store it owns) and the readers' pool
//! ([`SqliteReaders`]: each read on a store over a pooled connection).

use rusqlite::Connection;

use super::recent::Settler;
use super::{Pool, SqliteStore};
use crate::error::StoreError;
use crate::journal::backend::{Batching, Maintenance, ReadWork, Readers, Store, WriterConnection};

/// The per-request savepoint's statements (prepared once per connection, then cached).
const SAVEPOINT: &str = "SAVEPOINT request";
const RELEASE: &str = "RELEASE request";
const ROLLBACK_TO: &str = "ROLLBACK TO request";

/// The writer connection's page cache, in KiB (SQLite's default is 2 MiB). A settle of the
/// event log ([`crate::journal::sqlite::recent`]) writes a leaf of the history per active session: with 1,000
/// busy sessions, about 1,000 pages that a 2 MiB cache has dropped again by the next settle
/// and reads back (`growth`'s steady turns, docs/bench-notes/cost-that-stays-flat.md). The
/// cache fills only as far as the writer uses it, and is given back when the
/// runtime releases memory after passivation (`PRAGMA shrink_memory`).
const WRITER_CACHE_KIB: i64 = 8 * 1024;

/// The writer thread's store (its connection and its memory of log numbers) and, to release
/// their memory, the readers' pool.
pub(crate) struct SqliteWriter {
    store: SqliteStore,
    pool: Pool,
    /// When the event log was last settled (see [`crate::journal::sqlite::recent`]).
    settler: Settler,
}

impl SqliteWriter {
    /// The writer on `conn` (a connection with the store's PRAGMAs applied).
    pub(crate) fn new(conn: Connection, pool: Pool) -> Self {
        // Negative: KiB. A failure leaves SQLite's default (2 MiB), slower, not wrong.
        if let Err(e) = conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB) {
            log::warn!("persistence: cannot size the writer's page cache: {e}");
        }
        Self {
            store: SqliteStore::new(conn),
            pool,
            settler: Settler::default(),
        }
    }

    /// The writer's store, for the engine's unit tests.
    #[cfg(test)]
    pub(crate) fn sqlite_store(&mut self) -> &mut SqliteStore {
        &mut self.store
    }

    fn run(&self, sql: &str) -> Result<(), StoreError> {
        self.store.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }
}

impl WriterConnection for SqliteWriter {
    /// `PRAGMA wal_checkpoint(TRUNCATE)`: copies the WAL into the database and truncates it
    /// to zero bytes. When `idle`, without waiting for readers (the busy timeout is lifted for
    /// the call): a reader in the middle of a read makes it give up, and a later idle moment
    /// tries again.
    fn checkpoint(&mut self, idle: bool) -> bool {
        let wait = if idle {
            let previous: Option<i64> = self
                .store
                .conn
                .pragma_query_value(None, "busy_timeout", |row| row.get(0))
                .ok();
            if self
                .store
                .conn
                .busy_timeout(std::time::Duration::ZERO)
                .is_err()
            {
                return false;
            }
            previous
        } else {
            None
        };
        let result = self
            .store
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            });
        if let Some(ms) = wait {
            let restore = std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
            if let Err(e) = self.store.conn.busy_timeout(restore) {
                log::warn!("persistence: cannot restore the busy timeout: {e}");
            }
        }
        match result {
            Ok(0) => true,
            Ok(_busy) => false,
            Err(e) => {
                log::warn!("persistence: WAL checkpoint failed: {e}");
                false
            }
        }
    }

    /// Settles the event log's recent entries into the history once enough came (or, idle,
    /// any): see [`crate::journal::sqlite::recent`]. Idle, it also forgets the log numbers it remembered
    /// ([`crate::journal::sqlite::streams`]).
    fn maintain(&mut self, when: Maintenance) {
        self.settler.maybe_settle(&self.store.conn, when);
        if matches!(when, Maintenance::Idle) {
            self.store.streams.release();
        }
    }

    fn begin(&mut self) -> Result<(), StoreError> {
        // IMMEDIATE: take the write lock now, so a busy database fails the BEGIN, not a write
        // halfway through the batch.
        self.store.conn.execute_batch("BEGIN IMMEDIATE")?;
        self.store.streams.begin();
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.run(SAVEPOINT)
    }

    fn release(&mut self) -> Result<(), StoreError> {
        self.run(RELEASE)
    }

    fn rollback_to(&mut self) -> Result<(), StoreError> {
        self.store.streams.rollback_to();
        self.run(ROLLBACK_TO)
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        let committed = self.store.conn.execute_batch("COMMIT");
        if committed.is_ok() {
            self.store.streams.commit();
        } else {
            self.store.streams.rollback();
        }
        Ok(committed?)
    }

    fn rollback(&mut self) {
        self.store.streams.rollback();
        if !self.store.conn.is_autocommit() {
            if let Err(e) = self.store.conn.execute_batch("ROLLBACK") {
                log::error!("persistence: rollback failed: {e}");
            }
        }
    }

    fn in_transaction(&mut self) -> bool {
        !self.store.conn.is_autocommit()
    }

    /// Yes: a savepoint makes SQLite copy every page a request first touches into the
    /// sub-journal, and costs two statements (`SAVEPOINT`, `RELEASE`) per request
    /// (docs/bench-notes/cost-that-stays-flat.md). A failing request (rare: a deleted session,
    /// a duplicate id) makes its batch run twice.
    fn batching(&self) -> Batching {
        Batching {
            optimistic: true,
            ..Batching::default()
        }
    }

    fn store(&mut self) -> &mut dyn Store {
        &mut self.store
    }

    /// `PRAGMA shrink_memory` on the writer connection and on every idle pooled connection,
    /// here rather than on a blocking thread: a thread started for it would bring its own stack
    /// and malloc arena.
    fn release_memory(&mut self) {
        self.store.streams.release();
        if let Err(e) = self.store.conn.execute_batch("PRAGMA shrink_memory") {
            log::warn!("persistence: cannot shrink the writer's memory: {e}");
        }
        SqliteReaders(self.pool.clone()).release_memory();
    }
}

/// The readers' pool.
pub(crate) struct SqliteReaders(pub(crate) Pool);

impl Readers for SqliteReaders {
    fn read(&self, work: ReadWork<'_>) -> Result<(), StoreError> {
        let conn = self.0.get()?;
        work(&mut SqliteStore::new(&*conn))
    }

    fn size(&self) -> usize {
        self.0.max_size() as usize
    }

    fn release_memory(&self) {
        // Hold every idle connection at once, so each is shrunk exactly once.
        let idle = self.0.state().idle_connections;
        let conns: Vec<_> = (0..idle).map_while(|_| self.0.try_get()).collect();
        for conn in &conns {
            if let Err(e) = conn.execute_batch("PRAGMA shrink_memory") {
                log::warn!("persistence: cannot shrink a pooled connection's memory: {e}");
            }
        }
    }
}
