//! The SQLite backend of the journal's seam: [`Store`] for a rusqlite connection (each
//! method is the store function of the same name); the writer thread's connection and the
//! readers' pool are in [`writer`].

use rusqlite::Connection;
use serde_json::Value;

use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::{
    ClaimRows, ClaimedTurn, EventRows, InputRows, MessageRows, Nudge, Ownership, OwnershipRows,
    RetentionRows, Route, SessionRows, TurnRows,
};
use crate::journal::rules::Scan;
use crate::journal::sqlite::{self, streams};
use crate::records::{Admission, ClaimState, ListQuery, Message, SessionInfo};

/// One process owns a SQLite file (its lock): it owns every session, at epoch 0.
impl SessionRows for Connection {
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError> {
        sqlite::get_session(self, id)
    }

    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError> {
        sqlite::session_exists(self, id)
    }

    fn create_session(
        &mut self,
        info: &SessionInfo,
    ) -> Result<(SessionInfo, Option<EventRecord>), StoreError> {
        sqlite::create_session(self, info)
    }

    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError> {
        sqlite::list_sessions(self, query)
    }
}

impl EventRows for Connection {
    fn append(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        sqlite::append(self, session, event, now)
    }

    fn publish(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        sqlite::publish(self, session, kind, data, now)
    }

    fn project(&mut self, event: &EventRecord) -> Result<(), StoreError> {
        sqlite::project(self, event)
    }

    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        sqlite::events_after(self, session, after, limit)
    }

    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        sqlite::latest_interrupt_seq(self, session)
    }

    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        sqlite::latest_seq(self, session)
    }

    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        sqlite::log_start(self, session)
    }
}

impl InputRows for Connection {
    fn clear_wakes_before(&mut self, session: &SessionId, seq: u64) -> Result<(), StoreError> {
        sqlite::clear_wakes_before(self, session, seq)
    }

    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError> {
        sqlite::promoted_after(self, session, claim)
    }

    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError> {
        sqlite::get_input(self, id)
    }

    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError> {
        sqlite::pending_inputs(self, session)
    }

    fn mark_wake(&mut self, id: &MessageId) -> Result<(), StoreError> {
        sqlite::mark_wake(self, id)
    }

    fn clear_wakes(&mut self, session: &SessionId) -> Result<(), StoreError> {
        sqlite::clear_wakes(self, session)
    }

    fn owes_turn(&mut self, session: &SessionId) -> Result<bool, StoreError> {
        sqlite::owes_turn(self, session)
    }
}

impl MessageRows for Connection {
    fn message_seq(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<u64>, StoreError> {
        sqlite::message_seq(self, session, id)
    }

    fn scan_messages(
        &mut self,
        session: &SessionId,
        scan: Scan,
    ) -> Result<Vec<Message>, StoreError> {
        sqlite::scan_messages(self, session, scan)
    }

    fn user_message_after(&mut self, session: &SessionId, seq: u64) -> Result<bool, StoreError> {
        sqlite::user_message_after(self, session, seq)
    }

    fn append_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        sqlite::append_message(self, session, id, kind, data, now)
    }

    fn get_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<Message>, StoreError> {
        sqlite::get_message(self, session, id)
    }

    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError> {
        sqlite::transcript_owner(self, id)
    }

    fn undecodable_message(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<MessageId>, StoreError> {
        sqlite::undecodable_message(self, session)
    }

    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError> {
        sqlite::delete_projections(self, session)
    }

    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError> {
        sqlite::projection_counts(self, session)
    }

    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError> {
        sqlite::mark_interrupted(self, session, claim)
    }
}

impl ClaimRows for Connection {
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError> {
        sqlite::claim_state(self, id)
    }

    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        sqlite::claim_seq(self, session)
    }

    fn claimed_turn(
        &mut self,
        id: &SessionId,
        boot: &str,
    ) -> Result<Option<ClaimedTurn>, StoreError> {
        sqlite::claimed_turn(self, id, boot)
    }

    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError> {
        sqlite::claim_counts(self, now)
    }

    fn list_claimed(&mut self, exclude_boot: Option<&str>) -> Result<Vec<SessionId>, StoreError> {
        sqlite::list_claimed(self, exclude_boot)
    }

    fn own_claims(&mut self, boot: &str) -> Result<Vec<(SessionId, u64)>, StoreError> {
        sqlite::own_claims(self, boot)
    }

    fn adoptable(&mut self) -> Result<Vec<SessionId>, StoreError> {
        sqlite::adoptable(self)
    }

    fn count_resume(&mut self, id: &SessionId, boot: &str) -> Result<Option<u32>, StoreError> {
        sqlite::count_resume(self, id, boot)
    }

    fn count_own_resume(
        &mut self,
        id: &SessionId,
        boot: &str,
        claim: u64,
    ) -> Result<Option<u32>, StoreError> {
        sqlite::count_own_resume(self, id, boot, claim)
    }

    fn count_adoption(&mut self, id: &SessionId) -> Result<Option<u32>, StoreError> {
        sqlite::count_adoption(self, id)
    }

    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError> {
        sqlite::release_child_claims(self, boot)
    }
}

impl RetentionRows for Connection {
    fn session_tree(&mut self, session: &SessionId) -> Result<Vec<SessionId>, StoreError> {
        sqlite::session_tree(self, session)
    }

    fn lock_sessions(&mut self, _sessions: &[SessionId]) -> Result<(), StoreError> {
        Ok(())
    }

    fn delete_session(&mut self, session: &SessionId) -> Result<(), StoreError> {
        sqlite::delete_session(self, session)
    }

    fn compactable(
        &mut self,
        keep_last: u64,
        idle_before: i64,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError> {
        sqlite::compactable(self, keep_last, idle_before, limit)
    }

    fn compact(
        &mut self,
        session: &SessionId,
        keep_last: u64,
        idle_before: i64,
    ) -> Result<Option<(u64, usize)>, StoreError> {
        sqlite::compact(self, session, keep_last, idle_before)
    }
}

impl OwnershipRows for Connection {
    fn acquire(&mut self, session: &SessionId) -> Result<Ownership, StoreError> {
        Ok(if sqlite::session_exists(self, session)? {
            Ownership::Owned { epoch: 0 }
        } else {
            Ownership::Missing
        })
    }

    /// Fenced only when the session is not stored (deleted under the turn).
    /// A session whose log number the writer remembers exists (the number is deleted with
    /// the session, and forgotten then: see `sqlite::streams`); any other is probed.
    fn check_fence(&mut self, session: &SessionId, epoch: u64) -> Result<(), StoreError> {
        if streams::lookup(session).is_some() || sqlite::session_exists(self, session)? {
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

impl TurnRows for Connection {
    #[cfg(test)]
    fn as_sqlite(&mut self) -> Option<&Connection> {
        Some(self)
    }
}

mod writer;

pub(crate) use writer::{SqliteReaders, SqliteWriter};
