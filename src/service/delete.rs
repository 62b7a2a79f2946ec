//! Deleting sessions: [`Sessions::delete`].
//!
//! A deletion removes a session and every session below it (its children, theirs…) with every
//! row they have — session rows, inboxes, transcripts, event logs and seq counters — in one
//! transaction. It is refused while a turn holds one of them, unless forced: then the turns
//! are interrupted first (as a user interrupt), and the deletion goes on once they settled.

use super::Sessions;
use crate::error::{Error, Result};
use crate::id::SessionId;
use crate::journal::Deletion;

/// How many times a forced deletion interrupts again when a turn of this process claimed one
/// of the sessions between the interrupt and the deletion (a prompt admitted meanwhile).
const FORCED_ATTEMPTS: usize = 8;

impl Sessions {
    /// Deletes the session and every session below it (children are deleted with their parent,
    /// recursively), durably and atomically: every row of each — the session row, its inbox,
    /// transcript, event log and seq counter — goes in one transaction, or nothing does.
    /// Returns the deleted ids, `session_id` first.
    ///
    /// Afterwards the session is unknown: reads, prompts, interrupts and event streams answer
    /// [`Error::NotFound`], a prompt racing the deletion is either admitted before it (and
    /// deleted with it) or refused, and creating the same id again makes a fresh session
    /// whose seqs start at 0. Each open event stream of a deleted session receives a last,
    /// unstored `session.deleted` event (`{"sessionID"}`, with the seq after the session's
    /// last event) and then ends — with several nodes, on every node. The session's actor is
    /// stopped.
    ///
    /// A turn in flight blocks the deletion: one running in this process, on another node, or
    /// left claimed by an earlier process (for the restart sweep to resume). With `force`,
    /// every running turn of the tree is first interrupted as a user interrupt (committing
    /// `session.interrupt.requested` and `interrupted{user}`, as [`Sessions::interrupt`]) and
    /// awaited; claims left by earlier processes, or held by another node, are deleted with
    /// the session (a turn still running on another node finds its session gone at its next
    /// write and stops there).
    ///
    /// The work runs on a task of its own, so a caller that stops waiting does not cut it
    /// between the interrupt and the deletion.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::SessionBusy`] (nothing
    /// written) when a turn is in flight and `force` is false; [`Error::ShuttingDown`] while
    /// shutting down; [`Error::Store`] when a read or the deletion fails (then nothing was
    /// deleted).
    pub async fn delete(&self, session_id: &SessionId, force: bool) -> Result<Vec<SessionId>> {
        if self.execution.is_closed() {
            return Err(Error::ShuttingDown);
        }
        let this = self.clone();
        let id = session_id.clone();
        actix_rt::spawn(async move { this.delete_tree(id, force).await })
            .await
            .map_err(|source| Error::Task {
                task: "delete",
                source,
            })?
    }

    async fn delete_tree(&self, id: SessionId, force: bool) -> Result<Vec<SessionId>> {
        let not_found = || Error::NotFound {
            session_id: id.clone(),
        };
        let tree = self.journal.session_tree(id.clone()).await?;
        if tree.is_empty() {
            return Err(not_found());
        }
        if !force {
            // Also a turn that is starting: its claim may not be committed yet.
            if let Some(busy) = tree.iter().find(|s| self.execution.is_active(s)) {
                return Err(Error::SessionBusy {
                    session_id: busy.clone(),
                });
            }
        }
        let except_boot = force.then(|| self.execution.boot().to_owned());
        for attempt in 1..=FORCED_ATTEMPTS {
            if force {
                self.stop_turns(&tree).await?;
            }
            match self
                .journal
                .delete_session(id.clone(), except_boot.clone())
                .await?
            {
                Deletion::Deleted(deleted) => {
                    for session in &deleted {
                        self.execution.forget_deleted(session);
                    }
                    log::info!("session {id}: deleted ({} sessions)", deleted.len());
                    return Ok(deleted);
                }
                Deletion::Missing => return Err(not_found()),
                Deletion::Busy(_) if force && attempt < FORCED_ATTEMPTS => {}
                Deletion::Busy(session_id) => return Err(Error::SessionBusy { session_id }),
            }
        }
        Err(Error::SessionBusy { session_id: id })
    }

    /// Interrupts (as a user) every turn of `tree` that runs in this process or holds a claim,
    /// and waits until those of this process settled.
    async fn stop_turns(&self, tree: &[SessionId]) -> Result<()> {
        for session in tree {
            let claimed = match self.journal.session(session).await? {
                Some(info) => info.time_suspended.is_some(),
                None => false,
            };
            if !claimed && !self.execution.is_active(session) {
                continue;
            }
            self.interrupt(session).await?;
            self.execution.await_idle(session).await?;
        }
        Ok(())
    }

    /// The first seq of the session's event log a replay returns: 0, unless retention
    /// compacted its older events ([`crate::RetainEvents`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::Store`] when the read
    /// fails.
    pub async fn log_start(&self, session_id: &SessionId) -> Result<u64> {
        self.journal
            .log_start(session_id.clone())
            .await?
            .ok_or_else(|| Error::NotFound {
                session_id: session_id.clone(),
            })
    }
}
