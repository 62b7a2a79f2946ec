//! Session rows: lookup, keyset listing and idempotent creation (as the SQLite store's).

use postgres::types::ToSql;
use postgres::Row;

use super::conn::PgConn;
use super::{count_value, json_value, limit_param, session_id};
use crate::error::StoreError;
use crate::id::SessionId;
use crate::journal::backend::SessionRows;
use crate::journal::columns::escape_like;
use crate::journal::rules;
use crate::records::{Direction, ListQuery, Order, ParentFilter, SessionInfo};

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

/// A bound value of a dynamically built query.
enum Param {
    Text(String),
    Int(i64),
    OptInt(Option<i64>),
}

impl Param {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Text(s) => s,
            Param::Int(n) => n,
            Param::OptInt(n) => n,
        }
    }
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
        let mut params: Vec<Param> = Vec::new();
        let mut param = |value: Param| {
            params.push(value);
            format!("${}", params.len())
        };
        let mut clauses: Vec<String> = Vec::new();
        if let Some(directory) = &query.directory {
            clauses.push(format!(
                "directory = {}",
                param(Param::Text(directory.clone()))
            ));
        }
        match &query.parent {
            ParentFilter::Any => {}
            ParentFilter::TopLevel => clauses.push("parent_id IS NULL".into()),
            ParentFilter::ChildrenOf(parent) => {
                clauses.push(format!(
                    "parent_id = {}",
                    param(Param::Text(parent.to_string()))
                ));
            }
        }
        if let Some(search) = &query.search {
            let pattern = param(Param::Text(format!("%{}%", escape_like(search))));
            clauses.push(format!(r"title ILIKE {pattern} ESCAPE '\'"));
        }
        let previous = matches!(&query.anchor, Some(a) if a.direction == Direction::Previous);
        let (order, reversed) = rules::keyset_order(query.order, previous);
        let (cmp, dir) = match order {
            Order::Asc => (">", "ASC"),
            Order::Desc => ("<", "DESC"),
        };
        if let Some(anchor) = &query.anchor {
            let time = param(Param::Int(anchor.time));
            let id = param(Param::Text(anchor.id.to_string()));
            clauses.push(format!("(time_created, id) {cmp} ({time}, {id})"));
        }
        let limit = param(Param::OptInt(limit_param(query.limit)));
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        };
        let sql = format!(
            concat!(
                "SELECT ",
                session_columns!(),
                " FROM session{} ORDER BY time_created {}, id {} LIMIT {}"
            ),
            filter, dir, dir, limit
        );
        let bound: Vec<&(dyn ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
        let rows = self.query(&sql, &bound)?;
        let mut sessions = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        if reversed {
            sessions.reverse();
        }
        Ok(sessions)
    }
}
