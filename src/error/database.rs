//! [`DatabaseError`]: what the database engine (SQLite, PostgreSQL) or the connection pool
//! reported, kept opaque so the drivers' error types are not part of the crate's API.

use super::Unavailable;

/// An error the database reported: SQLite, PostgreSQL (feature `postgres`), or a connection
/// pool that could not hand out a connection.
///
/// Opaque on purpose: the drivers are an implementation detail. Its `Display` is the engine's
/// own words (with the SQLSTATE for PostgreSQL); the driver's error is its
/// [`source`](std::error::Error::source); whether it is a fault of the store that clears by
/// itself is [`StoreError::unavailable`](super::StoreError::unavailable).
pub struct DatabaseError(Driver);

/// The driver's error, as it reported it.
#[derive(Debug)]
enum Driver {
    Sqlite(rusqlite::Error),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Error),
    Pool(r2d2::Error),
}

impl std::fmt::Debug for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Driver::Sqlite(e) => write!(f, "sqlite: {e}"),
            #[cfg(feature = "postgres")]
            Driver::Postgres(e) => write!(f, "postgres: {}", describe_postgres(e)),
            Driver::Pool(e) => write!(f, "connection pool: {e}"),
        }
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(match &self.0 {
            Driver::Sqlite(e) => e,
            #[cfg(feature = "postgres")]
            Driver::Postgres(e) => e,
            Driver::Pool(e) => e,
        })
    }
}

impl DatabaseError {
    /// SQLite's error.
    pub(crate) fn sqlite(e: rusqlite::Error) -> Self {
        DatabaseError(Driver::Sqlite(e))
    }

    /// PostgreSQL's error.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(e: postgres::Error) -> Self {
        DatabaseError(Driver::Postgres(e))
    }

    /// The pool's error: no connection could be had.
    pub(crate) fn pool(e: r2d2::Error) -> Self {
        DatabaseError(Driver::Pool(e))
    }

    /// The kind of store fault, when the error is one that clears by itself.
    pub(crate) fn unavailable(&self) -> Option<Unavailable> {
        match &self.0 {
            Driver::Sqlite(e) => sqlite_unavailable(e),
            #[cfg(feature = "postgres")]
            Driver::Postgres(e) => postgres_unavailable(e),
            Driver::Pool(_) => Some(Unavailable::Connection),
        }
    }

    /// Whether PostgreSQL says the statement may succeed if run again (a deadlock, a
    /// serialization failure, a lock wait that timed out, a cancelled statement).
    pub(crate) fn is_transient(&self) -> bool {
        match &self.0 {
            #[cfg(feature = "postgres")]
            Driver::Postgres(e) => {
                use postgres::error::SqlState;
                e.code().is_some_and(|code| {
                    [
                        SqlState::T_R_DEADLOCK_DETECTED,
                        SqlState::T_R_SERIALIZATION_FAILURE,
                        SqlState::LOCK_NOT_AVAILABLE,
                        SqlState::QUERY_CANCELED,
                    ]
                    .contains(code)
                })
            }
            _ => false,
        }
    }

    /// A copy of a SQLite failure, with its code and message (rusqlite errors are not
    /// `Clone`); `None` for any other error.
    pub(crate) fn duplicate_sqlite_failure(&self) -> Option<DatabaseError> {
        match &self.0 {
            Driver::Sqlite(rusqlite::Error::SqliteFailure(code, message)) => Some(DatabaseError(
                Driver::Sqlite(rusqlite::Error::SqliteFailure(*code, message.clone())),
            )),
            _ => None,
        }
    }

    /// The PostgreSQL error, if it is one.
    #[cfg(feature = "postgres")]
    pub(crate) fn as_postgres(&self) -> Option<&postgres::Error> {
        match &self.0 {
            Driver::Postgres(e) => Some(e),
            _ => None,
        }
    }

    /// The PostgreSQL error, if it is one; else this error back.
    #[cfg(feature = "postgres")]
    pub(crate) fn into_postgres(self) -> Result<postgres::Error, DatabaseError> {
        match self.0 {
            Driver::Postgres(e) => Ok(e),
            other => Err(DatabaseError(other)),
        }
    }
}

/// The store fault behind a SQLite error, if it is one.
fn sqlite_unavailable(e: &rusqlite::Error) -> Option<Unavailable> {
    use rusqlite::ErrorCode;
    let code = e.sqlite_error_code()?;
    Some(match code {
        ErrorCode::DiskFull => Unavailable::Full,
        ErrorCode::ReadOnly => Unavailable::ReadOnly,
        ErrorCode::SystemIoFailure
        | ErrorCode::CannotOpen
        | ErrorCode::FileLockingProtocolFailed
        | ErrorCode::OutOfMemory => Unavailable::Io,
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => Unavailable::Busy,
        _ => return None,
    })
}

/// The store fault behind a PostgreSQL error, if it is one: a lost connection, a server that is
/// shutting down or starting (SQLSTATE classes 08 and 57P), a full disk (53100) or a read-only
/// server (25006).
#[cfg(feature = "postgres")]
fn postgres_unavailable(e: &postgres::Error) -> Option<Unavailable> {
    use postgres::error::SqlState;
    let Some(code) = e.code() else {
        // No SQLSTATE: the client's own failure (I/O, a closed connection, a timeout).
        let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
        return (e.is_closed() || io).then_some(Unavailable::Connection);
    };
    if *code == SqlState::DISK_FULL {
        Some(Unavailable::Full)
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        Some(Unavailable::ReadOnly)
    } else if code.code().starts_with("08")
        || code.code().starts_with("57P")
        || *code == SqlState::INSUFFICIENT_RESOURCES
        || *code == SqlState::OUT_OF_MEMORY
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        Some(Unavailable::Connection)
    } else {
        None
    }
}

/// A PostgreSQL error with the server's message and SQLSTATE (the client's own `Display` of a
/// server error is only "db error").
#[cfg(feature = "postgres")]
fn describe_postgres(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::StoreError;
    use super::*;

    /// A SQLite failure with this primary result code, as the backends' `?` converts it.
    fn sqlite(code: i32) -> StoreError {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some("m".into())).into()
    }

    #[test]
    fn sqlite_faults_are_classified_and_the_driver_error_is_the_source() {
        use rusqlite::ffi;
        let cases = [
            (ffi::SQLITE_FULL, Some(Unavailable::Full)),
            (ffi::SQLITE_READONLY, Some(Unavailable::ReadOnly)),
            (ffi::SQLITE_IOERR, Some(Unavailable::Io)),
            (ffi::SQLITE_CANTOPEN, Some(Unavailable::Io)),
            (ffi::SQLITE_BUSY, Some(Unavailable::Busy)),
            (ffi::SQLITE_LOCKED, Some(Unavailable::Busy)),
            (ffi::SQLITE_CONSTRAINT, None),
            (ffi::SQLITE_CORRUPT, None),
        ];
        for (code, kind) in cases {
            let error = sqlite(code);
            assert!(matches!(error, StoreError::Database(_)), "{error:?}");
            assert_eq!(error.unavailable(), kind, "{error}");
            assert_eq!(error.is_busy(), kind == Some(Unavailable::Busy), "{error}");
            assert!(!error.is_transient());
            assert!(error.to_string().starts_with("sqlite: "), "{error}");
            let source = std::error::Error::source(&error).expect("the driver's error");
            let driver = source.downcast_ref::<rusqlite::Error>().expect("rusqlite");
            assert_eq!(driver.sqlite_error_code(), Some(ffi::Error::new(code).code));
            // A copy for a second caller keeps the code, and so the classification.
            let copy = error.duplicate();
            assert!(matches!(copy, StoreError::Database(_)), "{copy:?}");
            assert_eq!(copy.unavailable(), kind);
            assert_eq!(copy.to_string(), error.to_string());
        }
    }

    #[test]
    fn a_pool_that_hands_out_no_connection_is_unavailable() {
        let manager = r2d2_sqlite::SqliteConnectionManager::file("/nonexistent/dir/db.sqlite");
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .connection_timeout(std::time::Duration::from_millis(10))
            .build_unchecked(manager);
        let error = StoreError::from(pool.get().expect_err("no connection"));
        assert_eq!(error.unavailable(), Some(Unavailable::Connection));
        assert!(
            error.to_string().starts_with("connection pool: "),
            "{error}"
        );
        let copy = error.duplicate();
        assert_eq!(copy.unavailable(), Some(Unavailable::Connection));
    }
}
