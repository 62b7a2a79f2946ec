//! The restart sweep's reads and writes: which sessions a previous process left claimed or
//! owed a turn, their attempt counts, and settling each one (resume, abort, or record the user
//! interrupt that came before the crash).

use std::sync::Arc;

use super::backend::ClaimedTurn;
use super::persistence::WriteCtx;
use super::rules;
use super::Journal;
use crate::error::StoreError;
use crate::event::SessionEvent;
use crate::id::SessionId;
use crate::outcome::InterruptReason;
use crate::records::Resumption;

/// What the sweep has to look at.
#[derive(Debug, Default)]
pub(crate) struct RecoveryPlan {
    /// Claimed top-level sessions of other boots, oldest claim first.
    pub(crate) claimed: Vec<SessionId>,
    /// Unclaimed top-level sessions holding an acknowledged prompt owed a turn.
    pub(crate) owed: Vec<SessionId>,
}

/// A session the sweep takes up.
#[derive(Debug, Clone)]
pub(crate) enum Unfinished {
    /// Claimed by an earlier boot, with its attempt count (this boot's included).
    Claimed(SessionId, u32),
    /// Holding no claim but an acknowledged prompt owed a turn: the process died before the
    /// prompt's turn started.
    Owed(SessionId),
}

/// What the sweep did with one orphan.
#[derive(Debug)]
pub(crate) enum Swept {
    /// Noticed and claimed for this boot; to be resumed with this resumption.
    Resumed(SessionId, Arc<Resumption>),
    /// Over its budget: recorded `failed{aborted}` and released.
    Terminalized(SessionId),
    /// A durable user interrupt request had stopped it: recorded `interrupted{user}`, released.
    /// (It may be taken up again at once, for a prompt acknowledged after the request.)
    Interrupted(SessionId),
}

impl Journal {
    /// Releases every claimed child session (children are never resumed on their own) whose
    /// claim no live turn holds: not one of `boot`, nor, with several nodes, of another live node;
    /// returns how many.
    pub(crate) async fn release_child_claims(&self, boot: String) -> Result<usize, StoreError> {
        self.inner
            .persistence
            .write(move |w| w.store().release_child_claims(&boot))
            .await
    }

    /// The sessions a previous process left behind: claimed by a boot other than `boot`, or
    /// owed a turn.
    pub(crate) async fn recovery_plan(&self, boot: String) -> Result<RecoveryPlan, StoreError> {
        self.inner
            .persistence
            .read(move |conn| {
                Ok(RecoveryPlan {
                    claimed: conn.list_claimed(Some(&boot))?,
                    owed: conn.adoptable()?,
                })
            })
            .await
    }

    /// Counts one resume attempt of each claimed session for `boot`, in one transaction of its
    /// own, taking the claim for `boot` so a turn is counted once per boot even when sweeps run
    /// concurrently; a session released (or claimed by this boot) since it was listed is left
    /// out.
    pub(crate) async fn count_resumes(
        &self,
        claimed: Vec<SessionId>,
        boot: String,
    ) -> Result<Vec<Unfinished>, StoreError> {
        // Alone: a savepoint around 10,000 rows would copy every page it touches to the
        // statement journal.
        self.inner
            .persistence
            .write_alone(move |w| {
                let counted = w.store().count_resumes(&claimed, &boot)?;
                Ok(counted
                    .into_iter()
                    .map(|(id, attempts)| Unfinished::Claimed(id, attempts))
                    .collect())
            })
            .await
    }

    /// Defers the writer's housekeeping after writes while the hold lives (see
    /// [`super::persistence::Persistence::defer_maintenance`]): held over the sweep's chunks.
    pub(crate) fn defer_maintenance(&self) -> super::persistence::MaintenanceHold {
        self.inner.persistence.defer_maintenance()
    }

    /// Settles a chunk of orphans in one transaction of its own (see [`sweep_one`]).
    pub(crate) async fn sweep(
        &self,
        chunk: Vec<Unfinished>,
        max: u32,
        boot: String,
    ) -> Result<Vec<Swept>, StoreError> {
        self.inner
            .persistence
            .write_alone(move |w| {
                let started = SessionEvent::ExecutionStarted {
                    boot: boot.clone(),
                    turn: None,
                };
                let mut swept = Vec::with_capacity(chunk.len());
                for unfinished in chunk.iter().cloned() {
                    swept.extend(sweep_one(w, unfinished, max, &boot, &started)?);
                }
                Ok(swept)
            })
            .await
    }
}

impl Journal {
    /// The seq of the claim `boot` holds on `session`, if it holds one (read on a reader).
    pub(crate) async fn claimed_by(
        &self,
        session: SessionId,
        boot: String,
    ) -> Result<Option<u64>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| Ok(conn.claimed_turn(&session, &boot)?.and_then(|t| t.claim)))
            .await
    }

    /// The top-level sessions `boot` holds a claim on, with the seq each claim was taken at.
    pub(crate) async fn own_claims(
        &self,
        boot: String,
    ) -> Result<Vec<(SessionId, u64)>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.own_claims(&boot))
            .await
    }

    /// Settles, by the sweep's rules, the turn `boot` itself claimed and left without a live
    /// drain: a drain the store failed under, or a claim whose answer was lost. In one
    /// transaction: counts one more attempt, then resumes it (restart notice and claim), aborts
    /// it over `max`, or records the user interrupt that came before. Fenced by
    /// `epoch`, like every write of a turn. Nothing (an empty list) when `boot` holds no such
    /// claim any more.
    pub(crate) async fn heal_turn(
        &self,
        session: SessionId,
        boot: String,
        epoch: u64,
        max: u32,
    ) -> Result<Vec<Swept>, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                let Some(held) = w
                    .store()
                    .claimed_turn(&session, &boot)?
                    .and_then(|t| t.claim)
                else {
                    return Ok(Vec::new());
                };
                let Some(attempts) = w.store().count_own_resume(&session, &boot, held)? else {
                    return Ok(Vec::new());
                };
                let started = SessionEvent::ExecutionStarted {
                    boot: boot.clone(),
                    turn: None,
                };
                let orphan = Unfinished::Claimed(session.clone(), attempts);
                sweep_one(w, orphan, max, &boot, &started)
            })
            .await
    }
}

/// Settles one orphan:
///
/// - a claimed turn whose durable user interrupt request came after its claim, and that served
///   nothing admitted after that request, is settled and recorded `interrupted{user}` as its
///   own terminal would have been: an interrupt sticks even when the process died before the
///   turn's terminal, and a queued prompt the turn's progress made due is taken up;
/// - a turn over `max` attempts is recorded `failed{aborted}` and released;
/// - any other is resumed: the restart notice and, right behind it, the turn's claim
///   (`session.execution.started`), so each orphan's pages are dirtied once.
///
/// Nothing when there is nothing left to do: a turn of this process ended the claim, or served
/// the owed prompt, since the session was listed; or the claim its count took for `boot` is no
/// longer `boot`'s (with several nodes: another node took the turn over since, this node's
/// lease having lapsed).
fn sweep_one(
    w: &mut WriteCtx<'_>,
    orphan: Unfinished,
    max: u32,
    boot: &str,
    started: &SessionEvent,
) -> Result<Vec<Swept>, StoreError> {
    let (id, attempts, inputs, claim) = match orphan {
        Unfinished::Claimed(id, attempts) => {
            let Some(ClaimedTurn { claim, fence }) = w.store().claimed_turn(&id, boot)? else {
                return Ok(Vec::new());
            };
            let inputs = match claim {
                Some(claim) => w.store().served_inputs(&id, claim, fence)?,
                None => Vec::new(),
            };
            let interrupted = rules::interrupts_turn(claim, fence);
            if interrupted && inputs.is_empty() {
                // Settled as the turn's own terminal would have been, while the claim is held:
                // after progress, the next queued prompt is owed a turn (adopted below).
                w.store().settle(&id)?;
                let reason = InterruptReason::User;
                w.append(&id, &SessionEvent::ExecutionInterrupted { reason })?;
                // A prompt acknowledged after the interrupt request is still owed its turn.
                let mut swept = vec![Swept::Interrupted(id.clone())];
                swept.extend(adopt(w, &id, max, started)?);
                return Ok(swept);
            }
            (id, attempts, inputs, claim)
        }
        Unfinished::Owed(id) => return Ok(adopt(w, &id, max, started)?.into_iter().collect()),
    };
    Ok(vec![resume_or_abort(
        w,
        id,
        attempts,
        max,
        (inputs, claim),
        started,
    )?])
}

/// Takes up a session holding no claim whose acknowledged prompt is owed a turn: counts an
/// attempt and resumes it (or aborts it over budget). `None` when nothing is owed any more.
fn adopt(
    w: &mut WriteCtx<'_>,
    id: &SessionId,
    max: u32,
    started: &SessionEvent,
) -> Result<Option<Swept>, StoreError> {
    if !w.store().owes_turn(id)? {
        return Ok(None);
    }
    let Some(attempts) = w.store().count_adoption(id)? else {
        return Ok(None);
    };
    Ok(Some(resume_or_abort(
        w,
        id.clone(),
        attempts,
        max,
        (Vec::new(), None),
        started,
    )?))
}

/// Records `failed{aborted}` for a turn over `max` attempts; otherwise publishes the restart
/// notice and the turn's claim, and returns what the resumed turn is to serve: `inputs`, and
/// the turn first claimed at `claim` (`None`: this claim starts it).
fn resume_or_abort(
    w: &mut WriteCtx<'_>,
    id: SessionId,
    attempts: u32,
    max: u32,
    (inputs, claim): (Vec<crate::records::Admission>, Option<u64>),
    started: &SessionEvent,
) -> Result<Swept, StoreError> {
    if attempts > max {
        w.append(&id, &SessionEvent::aborted())?;
        // Nothing is owed any more: the turn is over, recorded as aborted.
        w.store().clear_wakes(&id)?;
        return Ok(Swept::Terminalized(id));
    }
    let notice_seq = w.append(&id, &SessionEvent::restart_notice(&id))?.seq;
    let claimed = w.append(&id, started)?.seq;
    let resumption = Resumption {
        attempt: attempts,
        max_attempts: max,
        notice_seq,
        inputs,
        turn: claim.unwrap_or(claimed),
        steps: Vec::new(),
    };
    Ok(Swept::Resumed(id, Arc::new(resumption)))
}
