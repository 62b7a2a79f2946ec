//! A turn's two writes ([`TurnRows`]): on SQLite, each statement is a call into the library,
//! not a round trip, so the seam's defaults (the fence check, then the append) are the
//! statements.

use std::borrow::Borrow;

use rusqlite::Connection;

use super::SqliteStore;
use crate::journal::backend::TurnRows;

impl<C: Borrow<Connection>> TurnRows for SqliteStore<C> {
    #[cfg(test)]
    fn as_sqlite(&mut self) -> Option<&Connection> {
        Some(self.conn())
    }
}
