//! What a session actor does when the store fails under a turn: an open claim is the truth.
//!
//! - A claim or a terminal that could not be committed because the store is unavailable
//!   (`StoreError::unavailable`) is tried again with backoff until the store takes it; the
//!   turn stays in its hook meanwhile, so wakes coalesce behind it and nothing claims over it.
//! - A drain that failed because a read or write of its turn found the store unavailable is not
//!   the runner's failure: the turn is kept claimed and, once the store answers, resumed in
//!   place by the restart sweep's rules (`Journal::heal_turn`: an attempt counted, the restart
//!   notice, `Turn::resumption` naming what it had promoted; `failed{aborted}` over budget).
//!
//! - A session that may hold a claim of this process with no live turn (a commit whose answer
//!   was lost, an actor that stopped mid-turn, the healer's word) is healed by its next turn
//!   before it claims: that claim is resumed by the sweep's rules, and the turn drains as its
//!   recovery; with no such claim, the turn claims as usual.
//!
//! A shutdown ends the retries: the claim stays, and the next boot resumes the turn.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::Either;

use super::coordinator::{Coordinator, Effect};
use super::{ActorTokens, SessionActor, SettleError};
use crate::crash;
use crate::error::StoreError;
use crate::journal::Swept;
use crate::outcome::{Exit, InterruptReason, RunError, Terminal};
use crate::records::Resumption;

/// The first wait before a write the store refused is tried again.
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest wait between two tries.
const LAST_RETRY: Duration = Duration::from_secs(2);

/// How long to wait before try `attempt + 1` (doubling from [`FIRST_RETRY`] up to
/// [`LAST_RETRY`]).
pub(crate) fn backoff(attempt: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << attempt.min(16))
        .min(LAST_RETRY)
}

impl SessionActor {
    /// When `error` is a store fault and the runtime is not shutting down, schedules `again`
    /// after the backoff of `attempt` and returns true; otherwise returns false.
    pub(super) fn retry_later(
        &mut self,
        error: &StoreError,
        attempt: u32,
        ctx: &mut Context<Self>,
        again: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) -> bool {
        let Some(kind) = error.unavailable() else {
            return false;
        };
        if self.coordinator.is_closed() {
            return false;
        }
        let delay = backoff(attempt);
        if attempt == 0 {
            log::warn!(
                "session {}: the store is unavailable ({kind}: {error}); trying again",
                self.id
            );
        } else {
            log::debug!(
                "session {}: still unavailable, next try in {delay:?}",
                self.id
            );
        }
        ctx.run_later(delay, again);
        true
    }

    /// Commits the terminal event (+ release unless shutdown), then reports. A store fault is
    /// tried again (see [`SessionActor::retry_later`]); before a retry, a claim already
    /// released means the earlier try committed after all, and nothing is written twice.
    pub(super) fn commit_terminal(
        &mut self,
        terminal: Terminal,
        attempt: u32,
        ctx: &mut Context<Self>,
    ) {
        let best_effort = matches!(
            terminal,
            Terminal::Interrupted {
                reason: InterruptReason::Shutdown
            }
        );
        let journal = self.env.journal.clone();
        let (id, boot, epoch) = (self.id.clone(), self.env.claimant(), self.epoch());
        let commit = if attempt == 0 {
            // Queued to the writer now, ahead of anything a stray poll of the drain could queue.
            Either::Left(journal.settle_turn(id, terminal.clone(), epoch))
        } else {
            let ending = terminal.clone();
            Either::Right(async move {
                if journal.claimed_by(id.clone(), boot).await?.is_none() {
                    // The earlier try committed (its answer was lost with the connection).
                    return Ok(None);
                }
                journal.settle_turn(id, ending, epoch).await
            })
        };
        ctx.spawn(commit.into_actor(self).map(move |result, act, ctx| {
            let (result, next) = match result {
                Ok(next) => (Ok(()), next),
                Err(e @ StoreError::Fenced { .. }) => {
                    // Another node owns the turn now: it records how the turn ends.
                    log::warn!("session {}: fenced: {e}", act.id);
                    act.fenced = true;
                    (Err(Arc::new(e)), None)
                }
                Err(e) if best_effort => {
                    log::warn!("session {}: could not record shutdown: {e}", act.id);
                    (Ok(()), None)
                }
                Err(e) => {
                    let retry = terminal.clone();
                    if act.retry_later(&e, attempt, ctx, move |act, ctx| {
                        act.commit_terminal(retry, attempt + 1, ctx);
                    }) {
                        // Its callers are told now; the terminal lands once the store answers.
                        let effects = act.coordinator.fail_runs(Arc::new(e));
                        act.apply(effects, ctx);
                        return;
                    }
                    log::error!(
                        "session {}: could not record the turn's {}: {e}",
                        act.id,
                        ending(&terminal)
                    );
                    // Its claim stays open: the next turn heals it.
                    act.orphan = true;
                    (Err(Arc::new(e)), None)
                }
            };
            let effects = act.coordinator.settled(result);
            act.apply(effects, ctx);
            if let Some(seq) = next {
                // Queued prompts each run in a turn of their own, in admission order: the next
                // one starts once this turn settled (unless a successor already runs).
                if !act.coordinator.is_active() {
                    let effects = act.coordinator.wake(Some(seq));
                    act.apply(effects, ctx);
                }
            }
        }));
    }

    /// The write that settles this process's claim on the session by the sweep's rules
    /// (`Journal::heal_turn`), under the actor's epoch and resume budget.
    fn heal_write(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<Swept>, StoreError>> + 'static {
        let journal = self.env.journal.clone();
        let (id, boot, epoch) = (self.id.clone(), self.env.claimant(), self.epoch());
        let max = self.env.max_resume_attempts;
        async move { journal.heal_turn(id, boot, epoch, max).await }
    }

    /// Settles, by the restart sweep's rules, the turn whose drain the store failed: resumed in
    /// place (it drains again as a recovery), or ended (aborted over budget, interrupted by a
    /// request that came first). Tried again with backoff while the store is unavailable.
    pub(super) fn heal(&mut self, attempt: u32, ctx: &mut Context<Self>) {
        let healed = self.heal_write();
        ctx.spawn(healed.into_actor(self).map(move |result, act, ctx| {
            let swept = match result {
                Ok(swept) => swept,
                Err(e) => {
                    if act.retry_later(&e, attempt, ctx, move |act, ctx| {
                        act.heal(attempt + 1, ctx);
                    }) {
                        return;
                    }
                    log::error!("session {}: could not resume the turn: {e}", act.id);
                    act.fenced |= matches!(e, StoreError::Fenced { .. });
                    act.orphan = !act.fenced;
                    let effects = act.coordinator.settled(Err(Arc::new(e)));
                    act.apply(effects, ctx);
                    return;
                }
            };
            let Some(resumption) = resumed(swept) else {
                // Ended by the sweep's rules (recorded), or no longer claimed.
                let effects = act.coordinator.settled(Ok(()));
                act.apply(effects, ctx);
                return;
            };
            log::info!(
                "session {}: the store answers again; resuming the turn (attempt {} of {})",
                act.id,
                resumption.attempt,
                resumption.max_attempts
            );
            act.take_up(resumption, ctx, |coordinator| coordinator.resumed());
        }));
    }
}

impl SessionActor {
    /// Commits the claim of execution `execution`. While the store is unavailable, a wake's
    /// turn tries again with backoff (it waits in its start hook, where later wakes coalesce),
    /// unless the runtime is shutting down; a turn a caller waits on fails at once, with the
    /// store's error.
    pub(super) fn claim(&mut self, execution: u64, attempt: u32, ctx: &mut Context<Self>) {
        let (id, boot, epoch) = (self.id.clone(), self.env.claimant(), self.epoch());
        let journal = self.env.journal.clone();
        let commit = if attempt == 0 {
            Either::Left(journal.claim_turn(id, boot, epoch))
        } else {
            Either::Right(async move {
                if let Some(claim) = journal.claimed_by(id.clone(), boot.clone()).await? {
                    // The earlier try committed (its answer was lost with the connection).
                    return Ok(claim);
                }
                journal.claim_turn(id, boot, epoch).await
            })
        };
        ctx.spawn(commit.into_actor(self).map(move |result, act, ctx| {
            if let (Err(e), true) = (&result, act.coordinator.is_advisory()) {
                if act.retry_later(e, attempt, ctx, move |act, ctx| {
                    act.claim(execution, attempt + 1, ctx);
                }) {
                    return;
                }
            }
            let result = result.map(|seq| {
                act.running.get_or_insert_with(Box::default).committed = Some(seq);
            });
            let result = result.map_err(|e| {
                log::error!("session {}: claim failed: {e}", act.id);
                act.fenced |= matches!(e, StoreError::Fenced { .. });
                // The claim may be stored though its answer was lost.
                act.orphan = !act.fenced;
                let exit = Exit::Failure(RunError::Other(format!("claim failed: {e}")));
                act.running.get_or_insert_with(Box::default).claim_failed = Some(Arc::new(e));
                exit
            });
            if result.is_ok() {
                crash::point(crash::AFTER_CLAIM_BEFORE_DRAIN);
            }
            let effects = act.coordinator.started(execution, result);
            act.apply(effects, ctx);
        }));
    }
}

impl SessionActor {
    /// The start hook of a session that may hold an orphaned claim of this process: resumes
    /// that claim by the sweep's rules, and the execution drains as its recovery; when there is
    /// none (or the rules ended it), claims as usual.
    pub(super) fn heal_claim(&mut self, execution: u64, attempt: u32, ctx: &mut Context<Self>) {
        let healed = self.heal_write();
        ctx.spawn(healed.into_actor(self).map(move |result, act, ctx| {
            let swept = match result {
                Ok(swept) => swept,
                Err(e) => {
                    if act.coordinator.is_advisory()
                        && act.retry_later(&e, attempt, ctx, move |act, ctx| {
                            act.heal_claim(execution, attempt + 1, ctx);
                        })
                    {
                        return;
                    }
                    log::error!("session {}: could not heal its claim: {e}", act.id);
                    act.fenced |= matches!(e, StoreError::Fenced { .. });
                    act.orphan = !act.fenced;
                    let exit = Exit::Failure(RunError::Other(format!("claim failed: {e}")));
                    act.running.get_or_insert_with(Box::default).claim_failed = Some(Arc::new(e));
                    let effects = act.coordinator.started(execution, Err(exit));
                    act.apply(effects, ctx);
                    return;
                }
            };
            let Some(resumption) = resumed(swept) else {
                act.claim(execution, 0, ctx);
                return;
            };
            log::warn!(
                "session {}: resuming a claim of this process no turn held (attempt {} of {})",
                act.id,
                resumption.attempt,
                resumption.max_attempts
            );
            act.take_up(resumption, ctx, |coordinator| {
                coordinator.started(execution, Ok(()))
            });
        }));
    }

    /// Drains the execution again as the recovery of `resumption` (its notice and claim are
    /// committed; a retry's when `Running::retry` is set): `next` is the coordinator's
    /// transition that starts the drain.
    pub(super) fn take_up(
        &mut self,
        resumption: Arc<Resumption>,
        ctx: &mut Context<Self>,
        next: impl FnOnce(
            &mut Coordinator<ActorTokens, SettleError>,
        ) -> Vec<Effect<ActorTokens, SettleError>>,
    ) {
        let running = self.running.get_or_insert_with(Box::default);
        running.committed = Some(resumption.notice_seq);
        running.recovery = Some(resumption);
        let effects = next(&mut self.coordinator);
        self.apply(effects, ctx);
        // Only a drain this transition started takes the resumption.
        if let Some(running) = self.running.as_mut() {
            running.recovery = None;
            running.retry = false;
            if running.drain.is_none() {
                self.running = None;
            }
        }
    }
}

/// The resumption of the turn a heal resumed, if it did.
fn resumed(swept: Vec<Swept>) -> Option<Arc<Resumption>> {
    swept.into_iter().find_map(|swept| match swept {
        Swept::Resumed(_, resumption) => Some(resumption),
        _ => None,
    })
}

/// The turn's ending, named in the log when it cannot be recorded.
fn ending(terminal: &Terminal) -> &'static str {
    match terminal {
        Terminal::Succeeded => "success",
        Terminal::Failed { .. } => "failure",
        Terminal::Interrupted { .. } => "interruption",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        assert_eq!(backoff(0), FIRST_RETRY);
        assert_eq!(backoff(1), FIRST_RETRY * 2);
        assert_eq!(backoff(5), LAST_RETRY.min(FIRST_RETRY * 32));
        assert_eq!(backoff(40), LAST_RETRY);
    }
}
