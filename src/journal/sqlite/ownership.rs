//! Ownership of sessions ([`OwnershipRows`]) on a single node: one process owns a SQLite file
//! (its lock), so it owns every stored session, at epoch 0; no other node is told anything.

use std::borrow::Borrow;

use rusqlite::Connection;

use super::{SqliteStore, StoreError};
use crate::id::SessionId;
use crate::journal::backend::{Nudge, Ownership, OwnershipRows, Route, SessionRows};

impl<C: Borrow<Connection>> OwnershipRows for SqliteStore<C> {
    /// Owned at epoch 0 when the session is stored.
    fn acquire(&mut self, session: &SessionId) -> Result<Ownership, StoreError> {
        Ok(if self.session_exists(session)? {
            Ownership::Owned { epoch: 0 }
        } else {
            Ownership::Missing
        })
    }

    /// Fenced only when the session is not stored (deleted under the turn). A session whose
    /// log number the writer remembers exists (the number is deleted with the session, and
    /// forgotten then: see [`super::streams`]); any other is probed.
    fn check_fence(&mut self, session: &SessionId, epoch: u64) -> Result<(), StoreError> {
        if self.streams.lookup(session).is_some() || self.session_exists(session)? {
            Ok(())
        } else {
            Err(StoreError::Fenced {
                session_id: session.clone(),
                epoch,
            })
        }
    }

    fn release_ownership(&mut self, _sessions: &[SessionId]) -> Result<(), StoreError> {
        Ok(())
    }

    fn route(&mut self, _session: &SessionId, _nudge: Nudge) -> Result<Route, StoreError> {
        Ok(Route::Local)
    }

    fn missed_nudges(&mut self, _before: i64) -> Result<Vec<(SessionId, Nudge)>, StoreError> {
        Ok(Vec::new())
    }
}
