//! SQLite's statements for the projection's row writes ([`ProjectionRows`]; the rule is
//! `journal::projection`'s).

use rusqlite::Connection;
use serde_json::Value;

use super::recovery::{claim_seq, mark_interrupted};
use super::{claim_row, input, message, release, session, write_claim, StoreError};
use crate::id::{MessageId, SessionId};
use crate::journal::projection::ProjectionRows;
use crate::journal::rules::ClaimRow;
use crate::records::{Delivery, SessionInfo};

/// SQLite's statements for the projection's row writes.
pub(super) struct Rows<'a>(pub(super) &'a Connection);

impl ProjectionRows for Rows<'_> {
    fn insert_session(&mut self, info: &SessionInfo) -> Result<(), StoreError> {
        session::insert_session(self.0, info)
    }

    fn claim_row(&mut self, id: &SessionId) -> Result<Option<ClaimRow>, StoreError> {
        claim_row(self.0, id)
    }

    fn write_claim(&mut self, id: &SessionId, claim: &ClaimRow) -> Result<bool, StoreError> {
        write_claim(self.0, id, claim)
    }

    fn claim_seq(&mut self, id: &SessionId) -> Result<Option<u64>, StoreError> {
        claim_seq(self.0, id)
    }

    fn mark_interrupted(&mut self, id: &SessionId, claim: u64) -> Result<(), StoreError> {
        mark_interrupted(self.0, id, claim)
    }

    fn release(&mut self, id: &SessionId) -> Result<(), StoreError> {
        release(self.0, id).map(drop)
    }

    fn insert_input(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
        prompt: &Value,
        delivery: Delivery,
        time: i64,
    ) -> Result<(), StoreError> {
        input::insert_input(self.0, session, id, seq, prompt, delivery, time)
    }

    fn mark_promoted(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        seq: u64,
    ) -> Result<(), StoreError> {
        input::mark_promoted(self.0, session, id, seq)
    }

    fn insert_message(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        seq: u64,
        data: &Value,
        time: i64,
    ) -> Result<(), StoreError> {
        message::insert_message(self.0, session, id, kind, seq, data, time)
    }

    fn insert_appended(
        &mut self,
        session: &SessionId,
        id: &MessageId,
        kind: &str,
        seq: u64,
        data: &Value,
        time: i64,
    ) -> Result<(), StoreError> {
        if input::get_input(self.0, id)?.is_some() {
            return Err(StoreError::Conflict(format!(
                "message {id} is a prompt id; prompts enter the transcript by promotion"
            )));
        }
        message::insert_message(self.0, session, id, kind, seq, data, time)
    }
}
