//! Session rows ([`SessionRows`]): lookup, keyset listing and idempotent creation.

use std::borrow::Borrow;

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Row};

use super::{json_value, limit_param, session_id, SqliteStore, StoreError};
use crate::id::SessionId;
use crate::journal::backend::SessionRows;
use crate::journal::listing::{list_filter, ListValue};
use crate::records::{ListQuery, SessionInfo};

/// The columns a session is read with, from `session` joined (left) with its claim row
/// (`claim_join!`); the claim's columns are the last two.
macro_rules! session_columns {
    () => {
        "id, parent_id, title, directory, agent, model, metadata, time_created, time_updated, \
         claim.time_suspended, COALESCE(claim.resume_attempts, 0)"
    };
}

/// Joined after `session` wherever `session_columns!` is read.
macro_rules! claim_join {
    () => {
        " LEFT JOIN session_claim claim ON claim.session_id = session.id"
    };
}

/// A `session` row as stored, before ids and JSON are decoded.
struct SessionRow {
    id: String,
    parent_id: Option<String>,
    title: String,
    directory: String,
    agent: Option<String>,
    model: Option<String>,
    metadata: Option<String>,
    time_created: i64,
    time_updated: i64,
    time_suspended: Option<i64>,
    resume_attempts: u32,
}

impl SessionRow {
    /// Reads the columns of `session_columns!()` in order.
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            parent_id: row.get(1)?,
            title: row.get(2)?,
            directory: row.get(3)?,
            agent: row.get(4)?,
            model: row.get(5)?,
            metadata: row.get(6)?,
            time_created: row.get(7)?,
            time_updated: row.get(8)?,
            time_suspended: row.get(9)?,
            resume_attempts: row.get(10)?,
        })
    }

    fn decode(self) -> Result<SessionInfo, StoreError> {
        Ok(SessionInfo {
            id: session_id(self.id)?,
            parent_id: self.parent_id.map(session_id).transpose()?,
            title: self.title,
            directory: self.directory,
            agent: self.agent,
            model: self.model.as_deref().map(json_value).transpose()?,
            metadata: self.metadata.as_deref().map(json_value).transpose()?,
            time_created: self.time_created,
            time_updated: self.time_updated,
            time_suspended: self.time_suspended,
            resume_attempts: self.resume_attempts,
        })
    }
}

/// A search with this many candidates or more in the title index reads the sessions in order
/// instead (see `list_sessions`).
const SEARCH_CANDIDATES: i64 = 4096;

/// `search` as an FTS5 string (a phrase: the trigram tokenizer matches it as a substring).
fn fts_phrase(search: &str) -> String {
    format!("\"{}\"", search.replace('"', "\"\""))
}

/// Whether a search for `search` should read the title index's candidates rather than the
/// sessions in order: the text has a trigram (three characters or more) and fewer than
/// [`SEARCH_CANDIDATES`] titles hold all of its trigrams in sequence.
fn few_candidates(conn: &Connection, search: &str) -> Result<bool, StoreError> {
    if search.chars().count() < 3 {
        return Ok(false);
    }
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(*) FROM (SELECT 1 FROM session_search WHERE session_search MATCH ?1 \
         LIMIT ?2)",
    )?;
    let found: i64 = stmt.query_row(
        rusqlite::params![fts_phrase(search), SEARCH_CANDIDATES],
        |row| row.get(0),
    )?;
    Ok(found < SEARCH_CANDIDATES)
}

impl<C: Borrow<Connection>> SessionRows for SqliteStore<C> {
    /// The stored session `id`, if any.
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError> {
        let mut stmt = self.conn().prepare_cached(concat!(
            "SELECT ",
            session_columns!(),
            " FROM session",
            claim_join!(),
            " WHERE id = ?1"
        ))?;
        let row = stmt.query_row([id.as_str()], SessionRow::read).optional()?;
        row.map(SessionRow::decode).transpose()
    }

    /// Whether a session `id` is stored.
    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM session WHERE id = ?1)")?;
        Ok(stmt.query_row([id.as_str()], |row| row.get(0))?)
    }

    /// Sessions matching `query`, keyset-paged on `(time_created, id)`.
    ///
    /// A `Previous` anchor reads the page before the anchor by scanning in the opposite order and
    /// reversing the rows, so every page reads in the requested order.
    ///
    /// A search is `title LIKE '%text%'` (ASCII case-insensitive, wildcards escaped) either way;
    /// what differs is which rows it tests. When the title index (`session_search`, trigrams) has
    /// few candidates for the text, only they are read (by rowid, then sorted): a search matching
    /// nothing costs a probe of the index, not a scan of every title. A text shorter than three
    /// characters has no trigram, and a text most titles contain is found sooner by reading the
    /// sessions in order until the page is full: both scan as before. The index folds case at
    /// least as widely as `LIKE` (Unicode, not only ASCII), so its candidates hold every match.
    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError> {
        let mut filter = list_filter(query, "LIKE", |n| format!("?{n}"));
        let mut from = String::from("session");
        if let Some(search) = &query.search {
            if few_candidates(self.conn(), search)? {
                // `CROSS JOIN` keeps the candidates as the outer loop, whatever else filters.
                let phrase = filter.bind(ListValue::Text(fts_phrase(search)), |n| format!("?{n}"));
                from = format!(
                    "(SELECT rowid AS hit FROM session_search WHERE session_search MATCH {phrase}) \
                     CROSS JOIN session ON session.rowid = hit"
                );
            }
        }
        let limit = filter.bind(ListValue::Int(limit_param(query.limit)), |n| {
            format!("?{n}")
        });
        let sql = format!(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM {}",
                claim_join!(),
                "{} ORDER BY time_created {dir}, id {dir} LIMIT {}"
            ),
            from,
            filter.where_clause(),
            limit,
            dir = filter.direction,
        );
        let params = filter.values.iter().map(|value| match value {
            ListValue::Text(text) => SqlValue::Text(text.clone()),
            ListValue::Int(n) => SqlValue::Integer(*n),
        });
        let mut stmt = self.conn().prepare_cached(&sql)?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), SessionRow::read)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut sessions = rows
            .into_iter()
            .map(SessionRow::decode)
            .collect::<Result<Vec<_>, _>>()?;
        if filter.reversed {
            sessions.reverse();
        }
        Ok(sessions)
    }
}

#[cfg(test)]
mod tests;
