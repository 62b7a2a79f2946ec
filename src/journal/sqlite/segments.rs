//! A session's log in segments (schema version 10): each segment is a row of `event_stream`,
//! its number `k` the first half of the key of every index entry of its events, `(stream,
//! seq)`. A session's segments hold ascending, disjoint ranges of its seqs, in the order of
//! their numbers; only the newest takes appends.
//!
//! Why more than one: numbers are given in order, so sessions written together have
//! neighbouring numbers and the ends of their logs share the leaves of the indexes. A session
//! that comes back after thousands of others got numbers (an idle session of a large store)
//! would append at the end of its old range, among the entries of sessions idle for as long,
//! and each settle of the recent entries into the history would rewrite leaves scattered over
//! the whole file, one or two per such session (`growth` at 1,000,000 sessions, BENCHMARKS.md).
//! So when the writer meets a session whose newest segment is more than [`SEGMENT_SPAN`]
//! numbers behind the newest number given, it opens a new segment for it, at the end of the
//! numbers, next to the other sessions being written now.
//!
//! Reads of a whole log walk its segments in order ([`segments`]): one index seek per segment
//! and index. A session gets a new segment at most once per [`SEGMENT_SPAN`] numbers given
//! to others (new sessions, other sessions' new segments), so a log read replays a few
//! segments, not one per turn.

use rusqlite::Connection;

use super::StoreError;
use crate::id::SessionId;

/// How far (in numbers given since) a session's newest segment may fall behind before its
/// next append, when the writer does not remember the session, opens a new one.
pub(crate) const SEGMENT_SPAN: i64 = 4_096;

/// Where a session's next event goes, when the writer did not remember its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    /// The segment the event goes to.
    pub(super) k: i64,
    /// The segment the log continues from, when `k` was opened for this event (the next seq
    /// is read there: `k` holds no event yet).
    pub(super) continued_from: Option<i64>,
}

/// The number of `session`'s newest segment (`event_stream.k`), `None` before its first event.
pub(super) fn newest(conn: &Connection, session: &SessionId) -> Result<Option<i64>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1")?;
    Ok(stmt.query_row([session.as_str()], |row| row.get(0))?)
}

/// The numbers of `session`'s segments, oldest first (their seqs ascend with them).
pub(super) fn segments(conn: &Connection, session: &SessionId) -> Result<Vec<i64>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT k FROM event_stream WHERE aggregate_id = ?1 ORDER BY k")?;
    let ks = stmt
        .query_map([session.as_str()], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    Ok(ks)
}

/// Gives `session` a new segment, numbered after every other.
fn open(conn: &Connection, session: &SessionId) -> Result<i64, StoreError> {
    conn.prepare_cached("INSERT INTO event_stream (aggregate_id) VALUES (?1)")?
        .execute([session.as_str()])?;
    Ok(conn.last_insert_rowid())
}

/// The segment `session`'s next event goes to, read from the table (inside the writer's
/// transaction): its first, if it has none; a new one, if its newest fell more than
/// [`SEGMENT_SPAN`] behind; else its newest.
pub(super) fn place(conn: &Connection, session: &SessionId) -> Result<Placed, StoreError> {
    let Some(k) = newest(conn, session)? else {
        return Ok(Placed {
            k: open(conn, session)?,
            continued_from: None,
        });
    };
    let top: i64 = conn
        .prepare_cached("SELECT MAX(k) FROM event_stream")?
        .query_row([], |row| row.get(0))?;
    if top - k <= SEGMENT_SPAN {
        return Ok(Placed {
            k,
            continued_from: None,
        });
    }
    Ok(Placed {
        k: open(conn, session)?,
        continued_from: Some(k),
    })
}

#[cfg(test)]
mod tests;
