//! Session rows: lookup, keyset listing and idempotent creation (as the SQLite store's).

use postgres::types::ToSql;
use postgres::Row;

use super::conn::PgConn;
use super::{count_value, json_value, limit_param, session_id};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::SessionRows;
use crate::journal::listing::{list_filter, ListValue};
use crate::records::{ListQuery, SessionInfo};

macro_rules! session_columns {
    () => {
        "id, parent_id, title, directory, agent, model, metadata, time_created, time_updated, \
         time_suspended, resume_attempts"
    };
}
pub(super) use session_columns;

/// Decodes a row of `session_columns!()`.
fn decode(row: &Row) -> Result<SessionInfo, StoreError> {
    let model: Option<String> = row.try_get(5)?;
    let metadata: Option<String> = row.try_get(6)?;
    let parent: Option<String> = row.try_get(1)?;
    Ok(SessionInfo {
        id: session_id(row.try_get(0)?)?,
        parent_id: parent.map(session_id).transpose()?,
        title: row.try_get(2)?,
        directory: row.try_get(3)?,
        agent: row.try_get(4)?,
        model: model.as_deref().map(json_value).transpose()?,
        metadata: metadata.as_deref().map(json_value).transpose()?,
        time_created: row.try_get(7)?,
        time_updated: row.try_get(8)?,
        time_suspended: row.try_get(9)?,
        resume_attempts: count_value(row.try_get(10)?)?,
    })
}

impl SessionRows for PgConn {
    /// The stored session `id`, if any.
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError> {
        let row = self.query_opt(
            concat!("SELECT ", session_columns!(), " FROM session WHERE id = $1"),
            &[&id.as_str()],
        )?;
        row.as_ref().map(decode).transpose()
    }

    /// Whether a session `id` is stored.
    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError> {
        let row = self.query_one(
            "SELECT EXISTS (SELECT 1 FROM session WHERE id = $1)",
            &[&id.as_str()],
        )?;
        Ok(row.try_get(0)?)
    }

    /// Sessions matching `query`, keyset-paged on `(time_created, id)`; a `Previous` anchor scans
    /// the opposite way and reverses the rows. The title search is SQLite's `LIKE`: ASCII case is
    /// ignored (`ILIKE` under the `"C"` collation).
    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError> {
        let filter = list_filter(query, "ILIKE", |n| format!("${n}"));
        let limit = limit_param(query.limit);
        let sql = format!(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM session{} ORDER BY time_created {dir}, id {dir} LIMIT ${}"
            ),
            filter.where_clause(),
            filter.values.len() + 1,
            dir = filter.direction,
        );
        let mut bound: Vec<&(dyn ToSql + Sync)> = filter
            .values
            .iter()
            .map(|value| -> &(dyn ToSql + Sync) {
                match value {
                    ListValue::Text(text) => text,
                    ListValue::Int(n) => n,
                }
            })
            .collect();
        bound.push(&limit);
        let rows = self.query(&sql, &bound)?;
        let mut sessions = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        if filter.reversed {
            sessions.reverse();
        }
        Ok(sessions)
    }
}
