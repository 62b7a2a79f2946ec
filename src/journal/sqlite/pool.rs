//! The connection pool and the per-connection PRAGMAs (WAL, `synchronous`, `foreign_keys`,
//! `busy_timeout`, `journal_size_limit`, `wal_autocheckpoint`).

use std::path::PathBuf;
use std::time::Duration;

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::Connection;

pub(crate) use crate::config::Synchronous;
use crate::error::StoreError;
use crate::journal::sqlite::{schema, wal};

/// A pool of SQLite connections that all carry the store's PRAGMAs.
pub(crate) type Pool = r2d2::Pool<SqliteConnectionManager>;

/// Where and how the store opens its database.
#[derive(Debug, Clone)]
pub(crate) struct StoreConfig {
    /// The database file; created when missing.
    pub path: PathBuf,
    /// `PRAGMA synchronous` on every connection (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// How long a statement waits for a lock held by another connection (default 5 s).
    pub busy_timeout: Duration,
    /// The most pooled connections (default 8).
    pub pool_size: u32,
    /// `PRAGMA journal_size_limit`: the size, in bytes, the WAL file is truncated back to
    /// after a checkpoint reset it (default 64 MiB).
    pub journal_size_limit: u64,
}

impl StoreConfig {
    /// A configuration for `path` with the documented defaults.
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            pool_size: 8,
            journal_size_limit: DEFAULT_JOURNAL_SIZE_LIMIT,
        }
    }
}

/// The default `journal_size_limit`: 64 MiB.
pub(crate) const DEFAULT_JOURNAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// `PRAGMA wal_autocheckpoint` (in pages) under `synchronous = FULL`: SQLite's default.
///
/// SQLite copies the write-ahead log into the database inside the COMMIT that takes the log
/// past this many pages. Under `FULL`, a larger log does not pay: each commit syncs the log, and
/// a commit that extends the file past its usual size also syncs the file's size, which slows
/// every turn (the `latency` figures are in docs/bench-notes/cost-that-stays-flat.md).
const AUTOCHECKPOINT_FULL: i64 = 1000;

/// `PRAGMA wal_autocheckpoint` (in pages) under `synchronous = NORMAL`: four times SQLite's
/// default.
///
/// Under `NORMAL` a commit does not sync, so the checkpoint inside a commit (two syncs and the
/// copy) is the only sync a write waits for: with 1,000 pages about one turn in a hundred
/// paid for it, which set the whole turn's p99. With 4,096, one turn in about 500 pays for a
/// checkpoint about four times as long (the sync of four times as much log); a turn's mean is
/// unchanged (a page written again before the checkpoint is copied once), and the log (up to
/// 16 MiB) is still truncated when the writer goes idle and at stop. Checkpointing on a thread
/// of its own, or syncing the log ahead of the checkpoint from one, was measured and not kept:
/// their syncs slowed the concurrent commits (docs/bench-notes/cost-that-stays-flat.md).
const AUTOCHECKPOINT_NORMAL: i64 = 4096;

/// The `wal_autocheckpoint` for `synchronous`.
fn autocheckpoint(synchronous: Synchronous) -> i64 {
    match synchronous {
        Synchronous::Full => AUTOCHECKPOINT_FULL,
        Synchronous::Normal => AUTOCHECKPOINT_NORMAL,
    }
}

/// Prepared statements kept per connection; the store has a few dozen distinct statements.
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Sets the per-connection PRAGMAs. `busy_timeout` comes first so that switching to WAL waits for
/// a concurrent opener instead of failing with `SQLITE_BUSY`.
fn init_connection(
    conn: &mut Connection,
    synchronous: Synchronous,
    busy_timeout: Duration,
    journal_size_limit: u64,
) -> rusqlite::Result<()> {
    conn.busy_timeout(busy_timeout)?;
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        log::warn!("sqlite refused WAL mode; journal_mode is {mode}");
    }
    conn.pragma_update(None, "synchronous", synchronous.as_pragma())?;
    conn.pragma_update(None, "wal_autocheckpoint", autocheckpoint(synchronous))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    let limit = i64::try_from(journal_size_limit).unwrap_or(i64::MAX);
    conn.pragma_update(None, "journal_size_limit", limit)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(())
}

/// Opens one plain (unpooled) connection with the store's PRAGMAs. Does not migrate.
///
/// The connection must be able to write: SQLite silently opens a file it may not write (file
/// mode, immutable attribute, read-only mount) read-only, and such a connection would fail
/// every write with `SQLITE_READONLY` even after the file became writable again. That is
/// refused here, with the same error code, so a runtime on such a file fails at `start`.
pub(crate) fn open_connection(cfg: &StoreConfig) -> Result<Connection, StoreError> {
    let mut conn = Connection::open(&cfg.path)?;
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(StoreError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some(format!(
                "{} can only be opened read-only",
                cfg.path.display()
            )),
        )));
    }
    init_connection(
        &mut conn,
        cfg.synchronous,
        cfg.busy_timeout,
        cfg.journal_size_limit,
    )?;
    Ok(conn)
}

/// Opens the database, applies pending migrations and builds the pool.
///
/// A main file that is missing or empty beside a write-ahead log holding committed
/// transactions is refused first ([`StoreError::WalWithoutDatabase`]), before SQLite opens it
/// and deletes the log. The file is then opened and migrated on a plain connection, so that an
/// unopenable, corrupt or too-new database fails at once with the SQLite error (or
/// [`StoreError::SchemaTooNew`]) rather than after the pool's connection timeout.
pub(crate) fn open(cfg: &StoreConfig) -> Result<Pool, StoreError> {
    wal::check_main_file(&cfg.path)?;
    {
        let mut conn = open_connection(cfg)?;
        schema::migrate(&mut conn)?;
    }
    let (synchronous, busy_timeout, limit) =
        (cfg.synchronous, cfg.busy_timeout, cfg.journal_size_limit);
    let manager = SqliteConnectionManager::file(&cfg.path)
        .with_init(move |conn| init_connection(conn, synchronous, busy_timeout, limit));
    let pool = r2d2::Pool::builder()
        .max_size(cfg.pool_size.max(1))
        // Every connection is opened now and kept (r2d2's default): a connection's fixed
        // memory (schema, lookaside, statement cache) is part of the runtime's footprint from
        // the start, instead of being allocated amid the session actors of the first busy
        // moment, where it would pin freed memory after they passivate.
        .min_idle(None)
        .connection_timeout(cfg.busy_timeout + Duration::from_secs(1))
        .build(manager)?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::sqlite::test_support::tempdir;

    fn pragma<T: rusqlite::types::FromSql>(conn: &Connection, name: &str) -> rusqlite::Result<T> {
        conn.pragma_query_value(None, name, |row| row.get(0))
    }

    #[test]
    fn pooled_connections_carry_the_pragmas() -> Result<(), StoreError> {
        let dir = tempdir()?;
        let pool = open(&StoreConfig::new(dir.path().join("s.db")))?;
        // Hold two connections so both come from the init hook.
        let (a, b) = (pool.get()?, pool.get()?);
        for conn in [&*a, &*b] {
            assert_eq!(pragma::<String>(conn, "journal_mode")?, "wal");
            assert_eq!(pragma::<i64>(conn, "foreign_keys")?, 1);
            assert_eq!(pragma::<i64>(conn, "synchronous")?, 2);
            assert_eq!(pragma::<i64>(conn, "busy_timeout")?, 5000);
            assert_eq!(
                pragma::<i64>(conn, "journal_size_limit")?,
                DEFAULT_JOURNAL_SIZE_LIMIT as i64
            );
            assert_eq!(
                pragma::<i64>(conn, "wal_autocheckpoint")?,
                AUTOCHECKPOINT_FULL
            );
        }
        Ok(())
    }

    #[test]
    fn synchronous_normal_is_applied_to_plain_and_pooled_connections() -> Result<(), StoreError> {
        let dir = tempdir()?;
        let mut cfg = StoreConfig::new(dir.path().join("s.db"));
        cfg.synchronous = Synchronous::Normal;
        cfg.busy_timeout = Duration::from_millis(250);
        let pool = open(&cfg)?;
        let plain = open_connection(&cfg)?;
        for conn in [&*pool.get()?, &plain] {
            assert_eq!(pragma::<i64>(conn, "synchronous")?, 1);
            assert_eq!(pragma::<i64>(conn, "busy_timeout")?, 250);
            assert_eq!(pragma::<String>(conn, "journal_mode")?, "wal");
            assert_eq!(pragma::<i64>(conn, "foreign_keys")?, 1);
            // Checkpointed less often: the checkpoint is the only sync a commit waits for.
            assert_eq!(
                pragma::<i64>(conn, "wal_autocheckpoint")?,
                AUTOCHECKPOINT_NORMAL
            );
        }
        Ok(())
    }

    #[test]
    fn open_fails_fast_on_a_corrupt_file() -> Result<(), StoreError> {
        let dir = tempdir()?;
        let path = dir.path().join("corrupt.db");
        std::fs::write(&path, vec![0x5a_u8; 8192])
            .map_err(|e| StoreError::Inconsistent(e.to_string()))?;
        let started = std::time::Instant::now();
        let result = open(&StoreConfig::new(&path));
        assert!(matches!(result, Err(StoreError::Database(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        Ok(())
    }

    #[test]
    fn open_fails_fast_in_a_missing_directory() -> Result<(), StoreError> {
        let dir = tempdir()?;
        let started = std::time::Instant::now();
        let result = open(&StoreConfig::new(dir.path().join("no/such/dir/s.db")));
        assert!(matches!(result, Err(StoreError::Database(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        Ok(())
    }
}
