//! The projection of stored events onto the rows read back (the session row and its claim, the
//! inbox, the transcript): one rule, written once, that every backend applies with its own
//! statements ([`ProjectionRows`]).
//!
//! This is where a turn is claimed (`session.execution.started`) and released (a terminal
//! event), where an interrupted turn's prompts are marked, and where the inbox and the
//! transcript are written. Events of kinds without a projection change nothing; re-running the
//! projection of stored events rebuilds the projected rows once they are deleted.

use super::backend::rows::{NewInput, NewMessage, ProjectionRows};
use super::rules;
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;

/// Applies the projection of one stored event (kinds without one are a no-op).
pub(crate) fn project(
    rows: &mut (impl ProjectionRows + ?Sized),
    ev: &EventRecord,
) -> Result<(), StoreError> {
    match SessionEvent::projected(&ev.kind, &ev.data) {
        None => Ok(()),
        Some(Ok(event)) => apply(rows, &ev.session_id, ev.seq, ev.time, &event),
        Some(Err(e)) => Err(StoreError::Inconsistent(format!(
            "{} event {}#{}: {e}",
            ev.kind, ev.session_id, ev.seq
        ))),
    }
}

/// The projection of event `seq` of `session`, already decoded (an append knows its event).
pub(crate) fn apply(
    rows: &mut (impl ProjectionRows + ?Sized),
    session: &SessionId,
    seq: u64,
    time: i64,
    event: &SessionEvent,
) -> Result<(), StoreError> {
    match event {
        SessionEvent::Created { info } => {
            if &info.id != session {
                return Err(StoreError::Inconsistent(format!(
                    "session.created event of {session} carries session {}",
                    info.id
                )));
            }
            rows.insert_session(info)
        }
        // A retry's claim is taken at the seq of the turn it is the next attempt of.
        SessionEvent::ExecutionStarted { boot, turn } => {
            claim(rows, session, time, turn.unwrap_or(seq), boot).map(drop)
        }
        terminal if terminal.releases_claim() => {
            if matches!(terminal, SessionEvent::ExecutionInterrupted { .. }) {
                // The prompts this turn promoted were interrupted with it.
                if let Some(claim) = rows.claim_seq(session)? {
                    rows.mark_interrupted(session, claim)?;
                }
            }
            rows.release(session)
        }
        SessionEvent::PromptAdmitted {
            message_id,
            prompt,
            delivery,
        } => {
            let row = NewInput {
                session,
                id: message_id,
                seq,
                prompt,
                delivery: *delivery,
                time,
            };
            if rows.insert_input(&row)? {
                Ok(())
            } else {
                Err(StoreError::Conflict(format!(
                    "prompt {message_id} is already in a transcript"
                )))
            }
        }
        SessionEvent::PromptPromoted {
            message_id, prompt, ..
        } => {
            if !rows.mark_promoted(session, message_id, seq)? {
                return Err(StoreError::Conflict(format!(
                    "prompt {message_id} is not pending in session {session}"
                )));
            }
            let data = serde_json::json!({ "prompt": prompt });
            rows.insert_message(&NewMessage {
                session,
                id: message_id,
                kind: "user",
                seq,
                data: &data,
                time,
            })
        }
        SessionEvent::MessageAppended {
            message_id,
            kind,
            data,
        } => {
            let row = NewMessage {
                session,
                id: message_id,
                kind,
                seq,
                data,
                time,
            };
            if rows.insert_appended(&row)? {
                Ok(())
            } else {
                Err(StoreError::Conflict(format!(
                    "message {message_id} is a prompt id; prompts enter the transcript by \
                     promotion"
                )))
            }
        }
        _ => Ok(()),
    }
}

/// Claims `session` for the turn that event `seq` started on `boot`, by the claim merge
/// ([`rules::merge_claim`]); whether the session is stored.
pub(crate) fn claim(
    rows: &mut (impl ProjectionRows + ?Sized),
    session: &SessionId,
    time: i64,
    seq: u64,
    boot: &str,
) -> Result<bool, StoreError> {
    if rows.insert_claim(session, &rules::merge_claim(None, time, seq, boot))? {
        return Ok(true);
    }
    let existing = rows.claim_row(session)?;
    let merged = rules::merge_claim(existing.as_ref(), time, seq, boot);
    if existing.as_ref() == Some(&merged) {
        return Ok(true);
    }
    rows.write_claim(session, &merged)
}
