//! Why a throwaway cluster could not be had, or a database in it.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::BIN_ENV;

/// Why [`PgCluster::start`](super::PgCluster::start) could not give a running cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgUnavailable {
    /// No PostgreSQL server binaries on this machine (the only case [`start_or_skip`](super::start_or_skip) skips).
    #[error(
        "PostgreSQL not installed: no `initdb` and `postgres` in ${BIN_ENV}, on PATH or in \
         /usr/lib/postgresql/<version>/bin (apt-get install postgresql)"
    )]
    NotInstalled,
    /// `$DURABLE_SESSIONS_PG_BIN` is set but does not hold both binaries.
    #[error("${BIN_ENV}={0}: no `initdb` and `postgres` there")]
    BadBinDir(PathBuf),
    /// Running as root, and no unprivileged user to run PostgreSQL as could be found or made.
    #[error("running as root and no unprivileged user to run PostgreSQL as: {0}")]
    NoUser(String),
    /// A file system step failed (temp directory, ownership, log).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `initdb` failed.
    #[error("initdb failed ({status}): {stderr}")]
    Initdb {
        /// Its exit status.
        status: String,
        /// What it wrote to stderr (and stdout).
        stderr: String,
    },
    /// The server exited while starting.
    #[error("postgres exited while starting ({status}); its log:\n{log}")]
    Exited {
        /// Its exit status.
        status: String,
        /// The server log.
        log: String,
    },
    /// The server did not accept connections in time.
    #[error(
        "postgres did not accept connections within {timeout:?}: {last_error}; its log:\n{log}"
    )]
    NotReady {
        /// How long it was given.
        timeout: Duration,
        /// The last connection error.
        last_error: String,
        /// The server log.
        log: String,
    },
    /// `pg_ctl stop` failed: the server did not shut down.
    #[error("pg_ctl stop -m {mode} failed ({status}): {output}")]
    NotStopped {
        /// The shutdown mode asked for.
        mode: &'static str,
        /// `pg_ctl`'s exit status.
        status: String,
        /// What `pg_ctl` wrote.
        output: String,
    },
}

impl PgUnavailable {
    pub(super) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let what = what.into();
        move |source| PgUnavailable::Io { what, source }
    }
}

/// Why [`PgCluster::create_database`](super::PgCluster::create_database) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateDatabaseError {
    /// The name is not 1 to 63 characters of `[a-z0-9_]` starting with a letter or `_`.
    #[error("invalid database name {0:?}: use 1 to 63 of [a-z0-9_], not starting with a digit")]
    InvalidName(String),
    /// The server refused `CREATE DATABASE` (e.g. the database exists).
    #[error("CREATE DATABASE {name}: {source}")]
    Postgres {
        /// The database.
        name: String,
        /// The error.
        #[source]
        source: postgres::Error,
    },
}
