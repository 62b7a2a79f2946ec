//! [`Store`] for a PostgreSQL connection: each method is the store function of the same name.

use serde_json::Value;

use super::conn::PgConn;
use super::{claim, event, input, message, ownership, retention, session, turn};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::{MessageId, SessionId};
use crate::journal::backend::{
    ClaimRows, ClaimedTurn, EventRows, InputRows, MessageRows, Nudge, Ownership, OwnershipRows,
    RetentionRows, Route, SessionRows, TurnRows,
};
use crate::journal::rules::Scan;
use crate::journal::turn_write::TurnWrite;
use crate::records::{Admission, ClaimState, ListQuery, Message, SessionInfo};

impl SessionRows for PgConn {
    fn get_session(&mut self, id: &SessionId) -> Result<Option<SessionInfo>, StoreError> {
        session::get_session(self, id)
    }

    fn session_exists(&mut self, id: &SessionId) -> Result<bool, StoreError> {
        session::session_exists(self, id)
    }

    fn create_session(
        &mut self,
        info: &SessionInfo,
    ) -> Result<(SessionInfo, Option<EventRecord>), StoreError> {
        session::create_session(self, info)
    }

    fn list_sessions(&mut self, query: &ListQuery) -> Result<Vec<SessionInfo>, StoreError> {
        session::list_sessions(self, query)
    }
}

impl EventRows for PgConn {
    fn append(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        event::append(self, session, event, now)
    }

    fn publish(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        event::publish(self, session, kind, data, now)
    }

    fn project(&mut self, event: &EventRecord) -> Result<(), StoreError> {
        event::project(self, event)
    }

    fn events_after(
        &mut self,
        session: &SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        event::events_after(self, session, after, limit)
    }

    fn latest_interrupt_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        event::latest_interrupt_seq(self, session)
    }

    fn latest_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        event::latest_seq(self, session)
    }

    fn log_start(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        retention::log_start(self, session)
    }
}

impl InputRows for PgConn {
    fn clear_wakes_before(&mut self, session: &SessionId, seq: u64) -> Result<(), StoreError> {
        claim::clear_wakes_before(self, session, seq)
    }

    fn hold_admissions(&mut self, session: &SessionId) -> Result<(), StoreError> {
        claim::hold_admissions(self, session)
    }

    fn promoted_after(
        &mut self,
        session: &SessionId,
        claim: u64,
    ) -> Result<Vec<Admission>, StoreError> {
        claim::promoted_after(self, session, claim)
    }

    fn get_input(&mut self, id: &MessageId) -> Result<Option<Admission>, StoreError> {
        input::get_input(self, id)
    }

    fn pending_inputs(&mut self, session: &SessionId) -> Result<Vec<Admission>, StoreError> {
        input::pending_inputs(self, session)
    }

    fn mark_wake(&mut self, id: &MessageId) -> Result<(), StoreError> {
        claim::mark_wake(self, id)
    }

    fn clear_wakes(&mut self, session: &SessionId) -> Result<(), StoreError> {
        claim::clear_wakes(self, session)
    }

    fn owes_turn(&mut self, session: &SessionId) -> Result<bool, StoreError> {
        claim::owes_turn(self, session)
    }
}

impl MessageRows for PgConn {
    fn message_seq(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<u64>, StoreError> {
        message::message_seq(self, session, id)
    }

    fn scan_messages(
        &mut self,
        session: &SessionId,
        scan: Scan,
    ) -> Result<Vec<Message>, StoreError> {
        message::scan_messages(self, session, scan)
    }

    fn user_message_after(&mut self, session: &SessionId, seq: u64) -> Result<bool, StoreError> {
        claim::user_message_after(self, session, seq)
    }

    fn append_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        data: &Value,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        message::append_message(self, session, id, kind, data, now)
    }

    fn get_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
    ) -> Result<Option<Message>, StoreError> {
        message::get_message(self, session, id)
    }

    fn transcript_owner(&mut self, id: &MessageId) -> Result<Option<SessionId>, StoreError> {
        message::transcript_owner(self, id)
    }

    fn undecodable_message(
        &mut self,
        session: &SessionId,
    ) -> Result<Option<MessageId>, StoreError> {
        message::undecodable_message(self, session)
    }

    fn delete_projections(&mut self, session: &SessionId) -> Result<(), StoreError> {
        message::delete_projections(self, session)
    }

    fn projection_counts(&mut self, session: &SessionId) -> Result<(usize, usize), StoreError> {
        message::projection_counts(self, session)
    }

    fn mark_interrupted(&mut self, session: &SessionId, claim: u64) -> Result<(), StoreError> {
        claim::mark_interrupted(self, session, claim)
    }
}

impl ClaimRows for PgConn {
    fn claim_state(&mut self, id: &SessionId) -> Result<Option<ClaimState>, StoreError> {
        claim::claim_state(self, id)
    }

    fn claim_seq(&mut self, session: &SessionId) -> Result<Option<u64>, StoreError> {
        claim::claim_seq(self, session)
    }

    fn claim_counts(&mut self, now: i64) -> Result<(i64, Option<i64>), StoreError> {
        claim::claim_counts(self, now)
    }

    fn list_claimed(&mut self, exclude_boot: Option<&str>) -> Result<Vec<SessionId>, StoreError> {
        claim::list_claimed(self, exclude_boot)
    }

    fn adoptable(&mut self) -> Result<Vec<SessionId>, StoreError> {
        claim::adoptable(self)
    }

    fn count_resume(&mut self, id: &SessionId, boot: &str) -> Result<Option<u32>, StoreError> {
        claim::count_resume(self, id, boot)
    }

    fn own_claims(&mut self, boot: &str) -> Result<Vec<(SessionId, u64)>, StoreError> {
        claim::own_claims(self, boot)
    }

    fn count_own_resume(
        &mut self,
        id: &SessionId,
        boot: &str,
        claim: u64,
    ) -> Result<Option<u32>, StoreError> {
        claim::count_own_resume(self, id, boot, claim)
    }

    fn count_adoption(&mut self, id: &SessionId) -> Result<Option<u32>, StoreError> {
        claim::count_adoption(self, id)
    }

    fn count_resumes(
        &mut self,
        ids: &[SessionId],
        boot: &str,
    ) -> Result<Vec<(SessionId, u32)>, StoreError> {
        claim::count_resumes(self, ids, boot)
    }

    fn claimed_turn(
        &mut self,
        id: &SessionId,
        boot: &str,
    ) -> Result<Option<ClaimedTurn>, StoreError> {
        claim::claimed_turn(self, id, boot)
    }

    fn release_child_claims(&mut self, boot: &str) -> Result<usize, StoreError> {
        claim::release_child_claims(self, boot)
    }
}

impl RetentionRows for PgConn {
    fn session_tree(&mut self, session: &SessionId) -> Result<Vec<SessionId>, StoreError> {
        retention::session_tree(self, session)
    }

    fn lock_sessions(&mut self, sessions: &[SessionId]) -> Result<(), StoreError> {
        retention::lock_sessions(self, sessions)
    }

    fn delete_session(&mut self, session: &SessionId) -> Result<(), StoreError> {
        retention::delete_session(self, session)
    }

    fn compactable(
        &mut self,
        keep_last: u64,
        idle_before: i64,
        limit: usize,
    ) -> Result<Vec<SessionId>, StoreError> {
        retention::compactable(self, keep_last, idle_before, limit)
    }

    fn compact(
        &mut self,
        session: &SessionId,
        keep_last: u64,
        idle_before: i64,
    ) -> Result<Option<(u64, usize)>, StoreError> {
        retention::compact(self, session, keep_last, idle_before)
    }
}

impl OwnershipRows for PgConn {
    fn acquire(&mut self, session: &SessionId) -> Result<Ownership, StoreError> {
        Ok(ownership::acquire(self, session)?.0)
    }

    fn acquire_under(&mut self, session: &SessionId) -> Result<(Ownership, u64), StoreError> {
        ownership::acquire(self, session)
    }

    fn check_fence(&mut self, session: &SessionId, epoch: u64) -> Result<(), StoreError> {
        ownership::check_fence(self, session, epoch)
    }

    fn release_ownership(&mut self, sessions: &[SessionId]) -> Result<(), StoreError> {
        ownership::release_ownership(self, sessions)
    }

    fn route(&mut self, session: &SessionId, nudge: Nudge) -> Result<Route, StoreError> {
        ownership::route(self, session, nudge)
    }

    fn missed_nudges(&mut self, before: i64) -> Result<Vec<(SessionId, Nudge)>, StoreError> {
        ownership::missed_nudges(self, before)
    }
}

impl TurnRows for PgConn {
    fn claim_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        boot: &str,
        now: i64,
    ) -> Result<EventRecord, StoreError> {
        turn::claim_turn(self, session, epoch, boot, now)
    }

    fn settle_turn(
        &mut self,
        session: &SessionId,
        epoch: u64,
        event: &SessionEvent,
        now: i64,
    ) -> Result<(Option<u64>, EventRecord), StoreError> {
        turn::settle_turn(self, session, epoch, event, now)
    }

    fn prepare_turns(&mut self, turns: &[&TurnWrite], now: i64) -> Result<(), StoreError> {
        turn::prepare_turns(self, turns, now)
    }
}
