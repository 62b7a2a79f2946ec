//! The filter of a session listing as SQL both engines run: the clauses, the values they bind
//! and the keyset order, built once; each engine only names its placeholders, its `LIKE`
//! and what it adds (SQLite's full-text candidates).

use super::columns::escape_like;
use super::rules;
use crate::records::{Direction, ListQuery, Order, ParentFilter};

/// A value a listing binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListValue {
    /// A text column's value.
    Text(String),
    /// An integer column's value.
    Int(i64),
}

/// The parts of one listing statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListFilter {
    /// The `WHERE` clauses, to be joined with `AND`.
    pub(crate) clauses: Vec<String>,
    /// The values bound, in placeholder order.
    pub(crate) values: Vec<ListValue>,
    /// `ASC` or `DESC`, for `ORDER BY time_created, id`.
    pub(crate) direction: &'static str,
    /// Whether the rows come back reversed (a page before its anchor).
    pub(crate) reversed: bool,
}

impl ListFilter {
    /// Binds `value` and returns its placeholder, as `placeholder(n)` names the n-th (from 1).
    pub(crate) fn bind(&mut self, value: ListValue, placeholder: fn(usize) -> String) -> String {
        self.values.push(value);
        placeholder(self.values.len())
    }

    /// `WHERE` and the clauses, or nothing.
    pub(crate) fn where_clause(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }
}

/// The filter of `query`: directory, parent, title search (with `like`: `LIKE` or `ILIKE`)
/// and keyset anchor, the anchor compared on `(time_created, id)` in the scan's order.
pub(crate) fn list_filter(
    query: &ListQuery,
    like: &str,
    placeholder: fn(usize) -> String,
) -> ListFilter {
    let previous = matches!(&query.anchor, Some(a) if a.direction == Direction::Previous);
    let (order, reversed) = rules::keyset_order(query.order, previous);
    let (cmp, direction) = match order {
        Order::Asc => (">", "ASC"),
        Order::Desc => ("<", "DESC"),
    };
    let mut filter = ListFilter {
        clauses: Vec::new(),
        values: Vec::new(),
        direction,
        reversed,
    };
    if let Some(directory) = &query.directory {
        let p = filter.bind(ListValue::Text(directory.clone()), placeholder);
        filter.clauses.push(format!("directory = {p}"));
    }
    match &query.parent {
        ParentFilter::Any => {}
        ParentFilter::TopLevel => filter.clauses.push("parent_id IS NULL".into()),
        ParentFilter::ChildrenOf(parent) => {
            let p = filter.bind(ListValue::Text(parent.to_string()), placeholder);
            filter.clauses.push(format!("parent_id = {p}"));
        }
    }
    if let Some(search) = &query.search {
        let pattern = format!("%{}%", escape_like(search));
        let p = filter.bind(ListValue::Text(pattern), placeholder);
        filter.clauses.push(format!(r"title {like} {p} ESCAPE '\'"));
    }
    if let Some(anchor) = &query.anchor {
        let time = filter.bind(ListValue::Int(anchor.time), placeholder);
        let id = filter.bind(ListValue::Text(anchor.id.to_string()), placeholder);
        filter
            .clauses
            .push(format!("(time_created, id) {cmp} ({time}, {id})"));
    }
    filter
}
