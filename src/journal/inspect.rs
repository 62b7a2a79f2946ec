//! Reads and writes of a database outside any runtime, on a connection of their own: what the
//! `testing` helpers use to look at (or seed) the database a runtime works on — a SQLite file,
//! or (feature `postgres`) a PostgreSQL database named by its URL.

use std::path::Path;
use std::time::Duration;

use super::backend::ClaimRows as _;
use super::sqlite as store;
use crate::error::StoreError;
use crate::event::EventRecord;
use crate::id::SessionId;
use crate::records::ClaimState;

fn open(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

/// The claim of `session` (`None` when the session is missing).
pub(crate) fn claim_state(
    path: &Path,
    session: &SessionId,
) -> Result<Option<ClaimState>, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| store.claim_state(&session));
    }
    store::SqliteStore::new(&open(path)?).claim_state(session)
}

/// Every stored event of `session`, in seq order (with a compacted log: the rows still
/// stored, the kept interrupt fence below its start included).
pub(crate) fn events(path: &Path, session: &SessionId) -> Result<Vec<EventRecord>, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| {
            super::postgres::stored_events(store, &session)
        });
    }
    store::SqliteStore::new(&open(path)?).stored_events(session)
}

/// Marks `session` claimed by an earlier boot with `attempts` resume attempts, the claim taken
/// at the session's latest event.
pub(crate) fn seed_claim(
    path: &Path,
    session: &SessionId,
    attempts: u32,
) -> Result<(), StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| {
            // Owned by no node, as a node that died would leave it once its lease lapsed.
            let changed = store.execute(
                "UPDATE session SET time_suspended = $2, resume_attempts = $3, \
                 claim_boot = 'seeded', owner_node = NULL, \
                 claim_seq = (SELECT seq FROM event_sequence WHERE aggregate_id = $1) \
                 WHERE id = $1",
                &[&session.as_str(), &super::now_ms(), &i64::from(attempts)],
            )?;
            if changed == 0 {
                return Err(StoreError::Inconsistent(format!("no session {session}")));
            }
            Ok(())
        });
    }
    let conn = open(path)?;
    let changed = conn.execute(
        "INSERT OR REPLACE INTO session_claim \
             (session_id, time_suspended, resume_attempts, claim_boot, claim_seq) \
         SELECT id, ?2, ?3, 'seeded', (SELECT MAX(seq) FROM event WHERE aggregate_id = ?1) \
         FROM session WHERE id = ?1",
        rusqlite::params![session.as_str(), super::now_ms(), attempts],
    )?;
    if changed == 0 {
        return Err(StoreError::Inconsistent(format!("no session {session}")));
    }
    Ok(())
}

/// The URL when `path` names a PostgreSQL database.
#[cfg(feature = "postgres")]
fn postgres_url(path: &Path) -> Option<String> {
    let path = path.to_str()?;
    (path.starts_with("postgres://") || path.starts_with("postgresql://")).then(|| path.to_owned())
}

/// Runs `work` on a connection of its own to the PostgreSQL database at `url` (on a thread of
/// its own when called inside a tokio runtime, where the sync client cannot run).
#[cfg(feature = "postgres")]
fn on_postgres<T: Send + 'static>(
    url: String,
    work: impl FnOnce(&mut super::postgres::PgConn) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    super::postgres::off_runtime(move || {
        let config = super::postgres::PgConfig {
            url,
            node_id: "inspect".into(),
            node_name: "inspect".into(),
            lease: Duration::from_secs(10),
            pool_size: 1,
        };
        let client = super::postgres::connect(&config)?;
        let mut conn =
            super::postgres::PgConn::new(client, super::postgres::NodeId::new("inspect"));
        work(&mut conn)
    })
}
