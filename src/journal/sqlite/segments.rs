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
//! the whole file, one or two per such session (`growth` at 1,000,000 sessions,
//! docs/bench-notes/cost-that-stays-flat.md).
//! So when the writer meets a session whose newest segment is more than [`SEGMENT_SPAN`]
//! numbers behind the newest number given, it opens a new segment for it, at the end of the
//! numbers, next to the other sessions being written now.
//!
//! Each segment records its first seq. A read from a seq walks the segments in order from the
//! one that holds it ([`segments_from`]): one index seek per segment and index, and a read
//! near the end of a log (a client catching up) starts at its newest segment. A session gets a
//! new segment at most once per [`SEGMENT_SPAN`] numbers given to others (new sessions, other
//! sessions' new segments), and not while the writer remembers it.

use rusqlite::Connection;

use super::StoreError;
use crate::id::SessionId;

/// How far (in numbers given since) a session's newest segment may fall behind before its
/// next append, when the writer does not remember the session, opens a new one. (While the
/// writer is busy it remembers up to 65,536 sessions, and a session it remembers keeps its
/// segment: a log gets a new segment after an absence, not per turn.)
pub(crate) const SEGMENT_SPAN: i64 = 16_384;

/// Where a session's next event goes, when the writer did not remember its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    /// The segment the event goes to.
    pub(super) k: i64,
    /// The event's seq, when `k` was opened for it (read where the log was before).
    pub(super) seq: Option<u64>,
}

/// The number of `session`'s newest segment (`event_stream.k`), `None` before its first event.
pub(super) fn newest(conn: &Connection, session: &SessionId) -> Result<Option<i64>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1")?;
    Ok(stmt.query_row([session.as_str()], |row| row.get(0))?)
}

/// The numbers of `session`'s segments that may hold seqs from `from` on, in order: from the
/// newest segment whose first seq is at most `from` (seqs ascend with the segments), so a read
/// near the end of a long log starts at its end.
pub(super) fn segments_from(
    conn: &Connection,
    session: &SessionId,
    from: u64,
) -> Result<Vec<i64>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT k FROM event_stream WHERE aggregate_id = ?1 AND k >= COALESCE( \
             (SELECT k FROM event_stream WHERE aggregate_id = ?1 AND first_seq <= ?2 \
              ORDER BY k DESC LIMIT 1), 0) \
         ORDER BY k",
    )?;
    let ks = stmt
        .query_map(
            rusqlite::params![session.as_str(), i64::try_from(from).unwrap_or(i64::MAX)],
            |row| row.get(0),
        )?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    Ok(ks)
}

/// Gives `session` a new segment, numbered after every other, starting at `seq`.
fn open(conn: &Connection, session: &SessionId, seq: u64) -> Result<i64, StoreError> {
    conn.prepare_cached("INSERT INTO event_stream (aggregate_id, first_seq) VALUES (?1, ?2)")?
        .execute(rusqlite::params![
            session.as_str(),
            i64::try_from(seq).unwrap_or(i64::MAX)
        ])?;
    Ok(conn.last_insert_rowid())
}

/// The segment `session`'s next event goes to, read from the table (inside the writer's
/// transaction): its first, if it has none; a new one, if its newest fell more than
/// [`SEGMENT_SPAN`] behind; else its newest. `next_seq` reads the next seq of the log in a
/// segment (`None`: a log with no segment yet), for a segment opened here.
pub(super) fn place(
    conn: &Connection,
    session: &SessionId,
    next_seq: impl FnOnce(Option<i64>) -> Result<u64, StoreError>,
) -> Result<Placed, StoreError> {
    let newest = newest(conn, session)?;
    if let Some(k) = newest {
        let top: i64 = conn
            .prepare_cached("SELECT MAX(k) FROM event_stream")?
            .query_row([], |row| row.get(0))?;
        if top - k <= SEGMENT_SPAN {
            return Ok(Placed { k, seq: None });
        }
    }
    let seq = next_seq(newest)?;
    Ok(Placed {
        k: open(conn, session, seq)?,
        seq: Some(seq),
    })
}

#[cfg(test)]
mod tests;
