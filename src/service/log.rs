//! Reads of a session's log position: its newest seq, its last turn terminal, and how many
//! event streams are open.

use super::Sessions;
use crate::error::Result;
use crate::event::{kind, EventRecord};
use crate::id::SessionId;

/// Events read per page when the log is searched backwards for its last terminal (which is
/// usually among the newest few).
const TERMINAL_PAGE: usize = 256;

impl Sessions {
    /// The seq of the session's newest committed event (a stored session has at least its
    /// `session.created`, seq 0): its seq counter, one indexed read (retention never moves it
    /// back).
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored; [`crate::Error::Store`] when
    /// a read fails.
    pub async fn last_seq(&self, session_id: &SessionId) -> Result<u64> {
        self.require(session_id).await?;
        self.journal
            .latest_seq(session_id.clone())
            .await?
            .ok_or_else(|| crate::Error::NotFound {
                session_id: session_id.clone(),
            })
    }

    /// The session's most recent turn terminal (`session.execution.succeeded`, `failed` or
    /// `interrupted`), if any: read backwards from the end of the log a page at a time.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored; [`crate::Error::Store`] when
    /// a read fails.
    pub async fn last_terminal(&self, session_id: &SessionId) -> Result<Option<EventRecord>> {
        let mut end = self.last_seq(session_id).await? + 1;
        let first = self.log_start(session_id).await?;
        while end > first {
            let start = end.saturating_sub(TERMINAL_PAGE as u64);
            let page = self
                .journal
                .events_after(session_id.clone(), start.checked_sub(1), TERMINAL_PAGE)
                .await?;
            let terminal = page.into_iter().rev().find(|e| {
                e.seq < end
                    && matches!(
                        e.kind.as_str(),
                        kind::EXECUTION_SUCCEEDED
                            | kind::EXECUTION_FAILED
                            | kind::EXECUTION_INTERRUPTED
                    )
            });
            if terminal.is_some() {
                return Ok(terminal);
            }
            end = start;
        }
        Ok(None)
    }

    /// How many event streams ([`Sessions::events`]) are open on this runtime.
    pub fn event_streams(&self) -> usize {
        self.fanout.streams()
    }
}
