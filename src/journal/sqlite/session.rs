//! Session rows: lookup, keyset listing and idempotent creation.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, Row};

use super::{
    append, conflict_on_constraint, json_text, json_value, limit_param, session_id, StoreError,
};
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::records::{Direction, ListQuery, Order, ParentFilter, SessionInfo};

macro_rules! session_columns {
    () => {
        "id, parent_id, title, directory, agent, model, metadata, time_created, time_updated, \
         time_suspended, resume_attempts"
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

/// The stored session `id`, if any.
pub(crate) fn get_session(
    conn: &Connection,
    id: &SessionId,
) -> Result<Option<SessionInfo>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        session_columns!(),
        " FROM session WHERE id = ?1"
    ))?;
    let row = stmt.query_row([id.as_str()], SessionRow::read).optional()?;
    row.map(SessionRow::decode).transpose()
}

/// Whether a session `id` is stored.
pub(crate) fn session_exists(conn: &Connection, id: &SessionId) -> Result<bool, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT EXISTS(SELECT 1 FROM session WHERE id = ?1)")?;
    Ok(stmt.query_row([id.as_str()], |row| row.get(0))?)
}

/// Escapes `%`, `_` and `\` for a `LIKE … ESCAPE '\'` pattern.
fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A search with this many candidates or more in the title index reads the sessions in order
/// instead (see [`list_sessions`]).
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
pub(crate) fn list_sessions(
    conn: &Connection,
    query: &ListQuery,
) -> Result<Vec<SessionInfo>, StoreError> {
    let mut params: Vec<SqlValue> = Vec::new();
    // Binds a value and returns its placeholder.
    let mut param = |value: SqlValue| {
        params.push(value);
        format!("?{}", params.len())
    };
    let mut clauses: Vec<String> = Vec::new();
    if let Some(directory) = &query.directory {
        clauses.push(format!("directory = {}", param(directory.clone().into())));
    }
    match &query.parent {
        ParentFilter::Any => {}
        ParentFilter::TopLevel => clauses.push("parent_id IS NULL".into()),
        ParentFilter::ChildrenOf(parent) => {
            clauses.push(format!("parent_id = {}", param(parent.to_string().into())));
        }
    }
    let mut from = String::from("session");
    if let Some(search) = &query.search {
        let pattern = param(format!("%{}%", escape_like(search)).into());
        clauses.push(format!(r"title LIKE {pattern} ESCAPE '\'"));
        if few_candidates(conn, search)? {
            // `CROSS JOIN` keeps the candidates as the outer loop, whatever else filters.
            let phrase = param(fts_phrase(search).into());
            from = format!(
                "(SELECT rowid AS hit FROM session_search WHERE session_search MATCH {phrase}) \
                 CROSS JOIN session ON session.rowid = hit"
            );
        }
    }
    let previous = matches!(&query.anchor, Some(a) if a.direction == Direction::Previous);
    let order = if previous {
        query.order.flip()
    } else {
        query.order
    };
    let (cmp, dir) = match order {
        Order::Asc => (">", "ASC"),
        Order::Desc => ("<", "DESC"),
    };
    if let Some(anchor) = &query.anchor {
        let time = param(anchor.time.into());
        let id = param(anchor.id.to_string().into());
        clauses.push(format!("(time_created, id) {cmp} ({time}, {id})"));
    }
    let limit = param(limit_param(query.limit).into());
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let sql = format!(
        concat!(
            "SELECT ",
            session_columns!(),
            " FROM {}{} ORDER BY time_created {}, id {} LIMIT {}"
        ),
        from, filter, dir, dir, limit
    );

    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params.iter()), SessionRow::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut sessions = rows
        .into_iter()
        .map(SessionRow::decode)
        .collect::<Result<Vec<_>, _>>()?;
    if previous {
        sessions.reverse();
    }
    Ok(sessions)
}

/// Inserts a session row (the projection of `session.created`); an existing id is a conflict.
pub(super) fn insert_session(conn: &Connection, info: &SessionInfo) -> Result<(), StoreError> {
    let model = info.model.as_ref().map(json_text).transpose()?;
    let metadata = info.metadata.as_ref().map(json_text).transpose()?;
    let mut stmt = conn.prepare_cached(concat!(
        "INSERT INTO session (",
        session_columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
    ))?;
    stmt.execute(rusqlite::params![
        info.id.as_str(),
        info.parent_id.as_ref().map(SessionId::as_str),
        info.title,
        info.directory,
        info.agent,
        model,
        metadata,
        info.time_created,
        info.time_updated,
        info.time_suspended,
        info.resume_attempts,
    ])
    .map_err(|e| conflict_on_constraint(e, || format!("session {} already exists", info.id)))?;
    Ok(())
}

/// Creates `info` unless its id is stored. Returns the stored row and, when it was created, the
/// `session.created` event (for the caller to hand to the bus after commit); an existing session
/// is returned unchanged and nothing is published.
pub(crate) fn create_session(
    conn: &Connection,
    info: &SessionInfo,
) -> Result<(SessionInfo, Option<EventRecord>), StoreError> {
    if let Some(existing) = get_session(conn, &info.id)? {
        return Ok((existing, None));
    }
    let created = SessionEvent::Created { info: info.clone() };
    let event = append(conn, &info.id, &created, info.time_created)?;
    Ok((info.clone(), Some(event)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::kind;
    use crate::journal::sqlite::test_support::{create, info, sid, test_db};
    use crate::journal::sqlite::{events_after, latest_seq};
    use crate::records::Anchor;

    #[test]
    fn get_session_round_trips_every_field() -> Result<(), StoreError> {
        let db = test_db()?;
        create(&db.conn, "parent", None, 5)?;
        let mut child = info("child", Some("parent"), 7);
        child.agent = Some("build".into());
        child.model = Some(json!({"provider": "p", "id": "m"}));
        child.metadata = Some(json!(["x", 1]));
        child.time_updated = 9;
        create_session(&db.conn, &child)?;
        assert_eq!(get_session(&db.conn, &sid("child"))?, Some(child));
        assert_eq!(get_session(&db.conn, &sid("ghost"))?, None);
        Ok(())
    }

    #[test]
    fn session_exists_reports_stored_ids_only() -> Result<(), StoreError> {
        let db = test_db()?;
        create(&db.conn, "a", None, 1)?;
        assert!(session_exists(&db.conn, &sid("a"))?);
        assert!(!session_exists(&db.conn, &sid("b"))?);
        Ok(())
    }

    #[test]
    fn create_session_is_idempotent_and_publishes_once() -> Result<(), StoreError> {
        let db = test_db()?;
        let first = info("a", None, 10);
        let (stored, created) = create_session(&db.conn, &first)?;
        let created = created.expect("a fresh session publishes");
        assert_eq!((created.seq, created.kind.as_str()), (0, kind::CREATED));
        assert_eq!(stored, first);
        let mut second = info("a", None, 20);
        second.title = "another title".into();
        let (again, created) = create_session(&db.conn, &second)?;
        assert_eq!(created, None);
        assert_eq!(again, first);
        let events = events_after(&db.conn, &sid("a"), None, 10)?;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, kind::CREATED);
        assert_eq!(events[0].data, json!({ "info": first }));
        assert_eq!(latest_seq(&db.conn, &sid("a"))?, Some(0));
        Ok(())
    }

    /// Six sessions: `a`..`f` created at 10, 20, 20, 30, 40, 50 (`b` and `c` tie on time).
    fn seed(conn: &Connection) -> Result<(), StoreError> {
        for (id, parent, time, dir, title) in [
            ("a", None, 10, "/one", "plain title"),
            ("b", None, 20, "/one", "100% done"),
            ("c", Some("a"), 20, "/one", "100 percent"),
            ("d", None, 30, "/two", "snake_case"),
            ("e", Some("a"), 40, "/two", "snakeXcase"),
            ("f", None, 50, "/one", r"back\slash"),
        ] {
            let mut s = info(id, parent, time);
            s.directory = dir.into();
            s.title = title.into();
            create_session(conn, &s)?;
        }
        Ok(())
    }

    fn ids(sessions: &[SessionInfo]) -> Vec<&str> {
        sessions.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn list_filters_by_directory_and_parent() -> Result<(), StoreError> {
        let db = test_db()?;
        seed(&db.conn)?;
        let all = list_sessions(&db.conn, &ListQuery::default())?;
        assert_eq!(ids(&all), ["f", "e", "d", "c", "b", "a"]);
        let one = ListQuery {
            directory: Some("/one".into()),
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &one)?), ["f", "c", "b", "a"]);
        let top = ListQuery {
            parent: ParentFilter::TopLevel,
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &top)?), ["f", "d", "b", "a"]);
        let children = ListQuery {
            parent: ParentFilter::ChildrenOf(sid("a")),
            directory: Some("/two".into()),
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &children)?), ["e"]);
        Ok(())
    }

    #[test]
    fn list_search_treats_like_wildcards_literally() -> Result<(), StoreError> {
        let db = test_db()?;
        seed(&db.conn)?;
        let search = |text: &str| ListQuery {
            search: Some(text.into()),
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &search("100%"))?), ["b"]);
        assert_eq!(ids(&list_sessions(&db.conn, &search("100"))?), ["c", "b"]);
        assert_eq!(ids(&list_sessions(&db.conn, &search("e_c"))?), ["d"]);
        assert_eq!(ids(&list_sessions(&db.conn, &search(r"k\s"))?), ["f"]);
        assert!(list_sessions(&db.conn, &search("%%"))?.is_empty());
        Ok(())
    }

    /// The title index only chooses which rows the `LIKE` tests: ASCII case folds, other case
    /// does not, quotes are literal, and texts under three characters scan as before.
    #[test]
    fn list_search_through_the_title_index_keeps_like_semantics() -> Result<(), StoreError> {
        let db = test_db()?;
        for (id, time, title) in [
            ("a", 1, "Plain Title"),
            ("b", 2, "Élan vital"),
            ("c", 3, r#"they say "hi" twice"#),
            ("d", 4, "an"),
            ("e", 5, "日本語のタイトル"),
        ] {
            let mut s = info(id, None, time);
            s.title = title.into();
            create_session(&db.conn, &s)?;
        }
        let search = |text: &str| -> Result<Vec<String>, StoreError> {
            let q = ListQuery {
                search: Some(text.into()),
                ..ListQuery::default()
            };
            Ok(ids(&list_sessions(&db.conn, &q)?)
                .into_iter()
                .map(String::from)
                .collect())
        };
        assert!(few_candidates(&db.conn, "plain")?);
        assert_eq!(search("plain tITLE")?, ["a"]);
        assert_eq!(search("Élan")?, ["b"]);
        assert!(search("éLAN")?.is_empty(), "LIKE folds ASCII only");
        assert_eq!(search(r#"say "hi""#)?, ["c"]);
        assert_eq!(search(r#"""#)?, ["c"]);
        assert_eq!(search("an")?, ["d", "b"], "two characters: a LIKE scan");
        assert_eq!(search("本語の")?, ["e"]);
        assert_eq!(search("日本")?, ["e"]);
        assert!(search("no such title")?.is_empty());
        Ok(())
    }

    /// A text most titles hold reads the sessions in order; the page is the same.
    #[test]
    fn list_search_with_many_candidates_reads_in_order() -> Result<(), StoreError> {
        let db = test_db()?;
        let n = SEARCH_CANDIDATES + 4;
        db.conn.execute_batch("BEGIN")?;
        for i in 0..n {
            let mut s = info(&format!("s{i:05}"), None, i);
            s.title = format!("common title {i}");
            create_session(&db.conn, &s)?;
        }
        db.conn.execute_batch("COMMIT")?;
        assert!(!few_candidates(&db.conn, "common")?);
        let page = ListQuery {
            search: Some("COMMON".into()),
            limit: Some(3),
            ..ListQuery::default()
        };
        let newest: Vec<String> = (n - 3..n).rev().map(|i| format!("s{i:05}")).collect();
        assert_eq!(ids(&list_sessions(&db.conn, &page)?), newest);
        let one = ListQuery {
            search: Some(format!("title {}", n - 1)),
            ..ListQuery::default()
        };
        assert!(few_candidates(&db.conn, "title 12")?);
        assert_eq!(ids(&list_sessions(&db.conn, &one)?), [newest[0].as_str()]);
        Ok(())
    }

    /// Deleting a session takes its title out of the index; an id created again is found by
    /// its new title only.
    #[test]
    fn the_title_index_follows_deletions() -> Result<(), StoreError> {
        let db = test_db()?;
        let mut s = info("a", None, 1);
        s.title = "first title".into();
        create_session(&db.conn, &s)?;
        crate::journal::sqlite::delete_session(&db.conn, &sid("a"))?;
        let search = |text: &str| ListQuery {
            search: Some(text.into()),
            ..ListQuery::default()
        };
        assert!(list_sessions(&db.conn, &search("first"))?.is_empty());
        s.title = "second title".into();
        create_session(&db.conn, &s)?;
        assert!(list_sessions(&db.conn, &search("first"))?.is_empty());
        assert_eq!(ids(&list_sessions(&db.conn, &search("second"))?), ["a"]);
        let (rows,): (i64,) = db.conn.query_row(
            "SELECT COUNT(*) FROM session_search WHERE session_search MATCH 'title'",
            [],
            |r| Ok((r.get(0)?,)),
        )?;
        assert_eq!(rows, 1);
        db.conn.execute(
            "INSERT INTO session_search(session_search) VALUES ('integrity-check')",
            [],
        )?;
        Ok(())
    }

    #[test]
    fn list_orders_by_time_then_id_and_limits() -> Result<(), StoreError> {
        let db = test_db()?;
        seed(&db.conn)?;
        let asc = ListQuery {
            order: Order::Asc,
            limit: Some(4),
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &asc)?), ["a", "b", "c", "d"]);
        let desc = ListQuery {
            limit: Some(2),
            ..ListQuery::default()
        };
        assert_eq!(ids(&list_sessions(&db.conn, &desc)?), ["f", "e"]);
        Ok(())
    }

    #[test]
    fn list_anchors_page_next_and_previous_in_both_orders() -> Result<(), StoreError> {
        let db = test_db()?;
        seed(&db.conn)?;
        // The anchor is `b` (time 20), which ties on time with `c`.
        let page = |order, direction| -> Result<Vec<String>, StoreError> {
            let q = ListQuery {
                order,
                limit: Some(2),
                anchor: Some(Anchor {
                    id: sid("b"),
                    time: 20,
                    direction,
                }),
                ..ListQuery::default()
            };
            Ok(ids(&list_sessions(&db.conn, &q)?)
                .into_iter()
                .map(String::from)
                .collect())
        };
        assert_eq!(page(Order::Asc, Direction::Next)?, ["c", "d"]);
        assert_eq!(page(Order::Asc, Direction::Previous)?, ["a"]);
        assert_eq!(page(Order::Desc, Direction::Next)?, ["a"]);
        assert_eq!(page(Order::Desc, Direction::Previous)?, ["d", "c"]);
        Ok(())
    }
}
