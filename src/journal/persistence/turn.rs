//! A turn's two writes (its claim and its terminal) as requests the writer can see into: in a
//! batch run without savepoints, the writer hands each run of them to the store at once
//! ([`Store::prepare_turns`]), so that an engine where each statement is a round trip runs the
//! whole run in one.
//!
//! [`Store::prepare_turns`]: crate::journal::backend::Store::prepare_turns

use futures::channel::oneshot;

use super::{answer, Job, Persistence, WriteCtx};
use crate::error::StoreError;
use crate::event::SessionEvent;
use crate::journal::turn_write::{TurnWrite, TurnWriteKind};

/// A queued [`TurnWrite`]. Its answer: the claim's seq, or what the terminal's settlement
/// decided (the admission seq of the queued prompt owed the next turn, if any).
struct TurnJob {
    write: TurnWrite,
    result: Option<Result<Option<u64>, StoreError>>,
    reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
}

impl TurnJob {
    fn write(&self, ctx: &mut WriteCtx<'_>) -> Result<Option<u64>, StoreError> {
        let TurnWrite {
            session,
            epoch,
            kind,
        } = &self.write;
        let now = crate::journal::now_ms();
        match kind {
            TurnWriteKind::Claim { boot } => {
                let claim = ctx.store().claim_turn(session, *epoch, boot, now)?;
                let seq = claim.seq;
                ctx.record(claim);
                crate::crash::point(crate::crash::DURING_CLAIM);
                Ok(Some(seq))
            }
            TurnWriteKind::Settle { terminal } => {
                let event = SessionEvent::terminal(terminal);
                let (next, recorded) = ctx.store().settle_turn(session, *epoch, &event, now)?;
                ctx.record(recorded);
                Ok(next)
            }
        }
    }
}

impl Job for TurnJob {
    fn run(&mut self, ctx: &mut WriteCtx<'_>) -> bool {
        let result = self.write(ctx);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn complete(self: Box<Self>, commit: Result<(), &StoreError>) {
        let _ = self.reply.send(answer(commit, self.result));
    }

    fn succeeded(&self) -> bool {
        matches!(self.result, Some(Ok(_)))
    }

    fn error(&self) -> Option<&StoreError> {
        self.result.as_ref().and_then(|r| r.as_ref().err())
    }

    fn alone(&self) -> bool {
        false
    }

    fn turn(&self) -> Option<&TurnWrite> {
        Some(&self.write)
    }
}

impl Persistence {
    /// Queues `write` at once (like [`Persistence::write_now`]); resolves after its COMMIT with
    /// the claim's seq, or with what the terminal's settlement decided.
    ///
    /// # Errors
    /// The write's own error (`Fenced` when the session has another owner), or the error that
    /// stopped the batch from committing.
    pub(crate) fn write_turn(
        &self,
        write: TurnWrite,
    ) -> impl std::future::Future<Output = Result<Option<u64>, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let job = TurnJob {
            write,
            result: None,
            reply,
        };
        self.queue(Box::new(job), answer)
    }
}
