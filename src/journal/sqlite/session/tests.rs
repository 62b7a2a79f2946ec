//! Tests of the session rows: lookup, creation, listing and search.

use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::{create, info, sid, test_db};
use crate::journal::sqlite::SqliteStore;
use crate::records::{Anchor, Direction, Order, ParentFilter};

#[test]
fn get_session_round_trips_every_field() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "parent", None, 5)?;
    let mut child = info("child", Some("parent"), 7);
    child.agent = Some("build".into());
    child.model = Some(json!({"provider": "p", "id": "m"}));
    child.metadata = Some(json!(["x", 1]));
    child.time_updated = 9;
    db.conn.create_session(&child)?;
    assert_eq!(db.conn.get_session(&sid("child"))?, Some(child));
    assert_eq!(db.conn.get_session(&sid("ghost"))?, None);
    Ok(())
}

#[test]
fn session_exists_reports_stored_ids_only() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "a", None, 1)?;
    assert!(db.conn.session_exists(&sid("a"))?);
    assert!(!db.conn.session_exists(&sid("b"))?);
    Ok(())
}

#[test]
fn create_session_is_idempotent_and_publishes_once() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let first = info("a", None, 10);
    let (stored, created) = db.conn.create_session(&first)?;
    let created = created.expect("a fresh session publishes");
    assert_eq!((created.seq, created.kind.as_str()), (0, kind::CREATED));
    assert_eq!(stored, first);
    let mut second = info("a", None, 20);
    second.title = "another title".into();
    let (again, created) = db.conn.create_session(&second)?;
    assert_eq!(created, None);
    assert_eq!(again, first);
    let events = db.conn.events_after(&sid("a"), None, 10)?;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, kind::CREATED);
    assert_eq!(events[0].data, json!({ "info": first }));
    assert_eq!(db.conn.latest_seq(&sid("a"))?, Some(0));
    Ok(())
}

/// Six sessions: `a`..`f` created at 10, 20, 20, 30, 40, 50 (`b` and `c` tie on time).
fn seed(conn: &mut SqliteStore) -> Result<(), StoreError> {
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
        conn.create_session(&s)?;
    }
    Ok(())
}

fn ids(sessions: &[SessionInfo]) -> Vec<&str> {
    sessions.iter().map(|s| s.id.as_str()).collect()
}

#[test]
fn list_filters_by_directory_and_parent() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let all = db.conn.list_sessions(&ListQuery::default())?;
    assert_eq!(ids(&all), ["f", "e", "d", "c", "b", "a"]);
    let one = ListQuery {
        directory: Some("/one".into()),
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&one)?), ["f", "c", "b", "a"]);
    let top = ListQuery {
        parent: ParentFilter::TopLevel,
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&top)?), ["f", "d", "b", "a"]);
    let children = ListQuery {
        parent: ParentFilter::ChildrenOf(sid("a")),
        directory: Some("/two".into()),
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&children)?), ["e"]);
    Ok(())
}

#[test]
fn list_search_treats_like_wildcards_literally() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let search = |text: &str| ListQuery {
        search: Some(text.into()),
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&search("100%"))?), ["b"]);
    assert_eq!(ids(&db.conn.list_sessions(&search("100"))?), ["c", "b"]);
    assert_eq!(ids(&db.conn.list_sessions(&search("e_c"))?), ["d"]);
    assert_eq!(ids(&db.conn.list_sessions(&search(r"k\s"))?), ["f"]);
    assert!(db.conn.list_sessions(&search("%%"))?.is_empty());
    Ok(())
}

/// The title index only chooses which rows the `LIKE` tests: ASCII case folds, other case
/// does not, quotes are literal, and texts under three characters scan as before.
#[test]
fn list_search_through_the_title_index_keeps_like_semantics() -> Result<(), StoreError> {
    let mut db = test_db()?;
    for (id, time, title) in [
        ("a", 1, "Plain Title"),
        ("b", 2, "Élan vital"),
        ("c", 3, r#"they say "hi" twice"#),
        ("d", 4, "an"),
        ("e", 5, "日本語のタイトル"),
    ] {
        let mut s = info(id, None, time);
        s.title = title.into();
        db.conn.create_session(&s)?;
    }
    assert!(few_candidates(&db.conn, "plain")?);
    let mut search = |text: &str| -> Result<Vec<String>, StoreError> {
        let q = ListQuery {
            search: Some(text.into()),
            ..ListQuery::default()
        };
        Ok(ids(&db.conn.list_sessions(&q)?)
            .into_iter()
            .map(String::from)
            .collect())
    };
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
    let mut db = test_db()?;
    let n = SEARCH_CANDIDATES + 4;
    db.conn.execute_batch("BEGIN")?;
    for i in 0..n {
        let mut s = info(&format!("s{i:05}"), None, i);
        s.title = format!("common title {i}");
        db.conn.create_session(&s)?;
    }
    db.conn.execute_batch("COMMIT")?;
    assert!(!few_candidates(&db.conn, "common")?);
    let page = ListQuery {
        search: Some("COMMON".into()),
        limit: Some(3),
        ..ListQuery::default()
    };
    let newest: Vec<String> = (n - 3..n).rev().map(|i| format!("s{i:05}")).collect();
    assert_eq!(ids(&db.conn.list_sessions(&page)?), newest);
    let one = ListQuery {
        search: Some(format!("title {}", n - 1)),
        ..ListQuery::default()
    };
    assert!(few_candidates(&db.conn, "title 12")?);
    assert_eq!(ids(&db.conn.list_sessions(&one)?), [newest[0].as_str()]);
    Ok(())
}

/// Deleting a session takes its title out of the index; an id created again is found by
/// its new title only.
#[test]
fn the_title_index_follows_deletions() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let mut s = info("a", None, 1);
    s.title = "first title".into();
    db.conn.create_session(&s)?;
    db.conn.delete_session(&sid("a"))?;
    let search = |text: &str| ListQuery {
        search: Some(text.into()),
        ..ListQuery::default()
    };
    assert!(db.conn.list_sessions(&search("first"))?.is_empty());
    s.title = "second title".into();
    db.conn.create_session(&s)?;
    assert!(db.conn.list_sessions(&search("first"))?.is_empty());
    assert_eq!(ids(&db.conn.list_sessions(&search("second"))?), ["a"]);
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
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    let asc = ListQuery {
        order: Order::Asc,
        limit: Some(4),
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&asc)?), ["a", "b", "c", "d"]);
    let desc = ListQuery {
        limit: Some(2),
        ..ListQuery::default()
    };
    assert_eq!(ids(&db.conn.list_sessions(&desc)?), ["f", "e"]);
    Ok(())
}

#[test]
fn list_anchors_page_next_and_previous_in_both_orders() -> Result<(), StoreError> {
    let mut db = test_db()?;
    seed(&mut db.conn)?;
    // The anchor is `b` (time 20), which ties on time with `c`.
    let mut page = |order, direction| -> Result<Vec<String>, StoreError> {
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
        Ok(ids(&db.conn.list_sessions(&q)?)
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
