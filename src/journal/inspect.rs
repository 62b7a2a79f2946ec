//! Reads and writes of a database file outside any runtime, on a connection of their own: what
//! the `testing` helpers use to look at (or seed) the file a runtime works on.

use std::path::Path;
use std::time::Duration;

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

/// The claim columns of `session` (`None` when the row is missing).
pub(crate) fn claim_state(
    path: &Path,
    session: &SessionId,
) -> Result<Option<ClaimState>, StoreError> {
    store::claim_state(&open(path)?, session)
}

/// Every stored event of `session`, in seq order.
pub(crate) fn events(path: &Path, session: &SessionId) -> Result<Vec<EventRecord>, StoreError> {
    store::events_after(&open(path)?, session, None, usize::MAX)
}

/// Marks `session` claimed by an earlier boot with `attempts` resume attempts, the claim taken
/// at the session's latest event.
pub(crate) fn seed_claim(
    path: &Path,
    session: &SessionId,
    attempts: u32,
) -> Result<(), StoreError> {
    let conn = open(path)?;
    let changed = conn.execute(
        "UPDATE session SET time_suspended = ?2, resume_attempts = ?3, claim_boot = 'seeded', \
         claim_seq = (SELECT seq FROM event_sequence WHERE aggregate_id = ?1) WHERE id = ?1",
        rusqlite::params![session.as_str(), super::now_ms(), attempts],
    )?;
    if changed == 0 {
        return Err(StoreError::Inconsistent(format!("no session {session}")));
    }
    Ok(())
}
