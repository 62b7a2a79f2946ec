//! Maintenance and diagnosis queries the session service needs: who owns a transcript message,
//! clearing and counting a session's projections before a replay, and finding an undecodable
//! message. Every value is a bound parameter.

use rusqlite::{Connection, OptionalExtension};

use crate::error::StoreError;
use crate::id::{MessageId, SessionId};

/// The session whose transcript holds message `id`, if any.
pub(crate) fn transcript_owner(
    conn: &Connection,
    id: &MessageId,
) -> Result<Option<SessionId>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT session_id FROM session_message WHERE id = ?1")?;
    let owner: Option<String> = stmt.query_row([id.as_str()], |row| row.get(0)).optional()?;
    owner
        .map(|s| {
            SessionId::new(s)
                .map_err(|e| StoreError::Inconsistent(format!("stored session id: {e}")))
        })
        .transpose()
}

/// Deletes `session`'s inbox and transcript rows (before they are rebuilt from its events).
pub(crate) fn delete_projections(conn: &Connection, session: &SessionId) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM session_input WHERE session_id = ?1")?
        .execute([session.as_str()])?;
    conn.prepare_cached("DELETE FROM session_message WHERE session_id = ?1")?
        .execute([session.as_str()])?;
    Ok(())
}

/// How many inbox and transcript rows `session` has.
pub(crate) fn projection_counts(
    conn: &Connection,
    session: &SessionId,
) -> Result<(usize, usize), StoreError> {
    let count = |sql: &str| -> Result<usize, StoreError> {
        let n: i64 = conn
            .prepare_cached(sql)?
            .query_row([session.as_str()], |row| row.get(0))?;
        Ok(usize::try_from(n).unwrap_or(0))
    };
    Ok((
        count("SELECT COUNT(*) FROM session_input WHERE session_id = ?1")?,
        count("SELECT COUNT(*) FROM session_message WHERE session_id = ?1")?,
    ))
}

/// The first message of `session`'s transcript (in seq order) whose stored payload is not valid
/// JSON, if any: the diagnosis behind [`crate::Error::MessageDecode`].
pub(crate) fn undecodable_message(
    conn: &Connection,
    session: &SessionId,
) -> Result<Option<MessageId>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, data FROM session_message WHERE session_id = ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([session.as_str()])?;
    while let Some(row) = rows.next()? {
        let data: String = row.get(1)?;
        if serde_json::from_str::<serde_json::Value>(&data).is_err() {
            let id: String = row.get(0)?;
            return MessageId::new(id)
                .map(Some)
                .map_err(|e| StoreError::Inconsistent(format!("stored message id: {e}")));
        }
    }
    Ok(None)
}
