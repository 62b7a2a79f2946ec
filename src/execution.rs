//! [`Execution`]: the handle that starts, wakes, interrupts and awaits session turns.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::channel::oneshot;

use crate::error::{Error, Result};
use crate::id::SessionId;
use crate::outcome::{InterruptReason, Terminal};
use crate::registry::Registry;
use crate::session::messages::{AwaitIdle, Interrupt, Resume, Retry, Wake};
use crate::session::{Environment, SessionActor};

/// A turn started without waiting for it ([`Execution::start_resume`],
/// [`Execution::start_retry`]): await [`TurnHandle::outcome`] for how it ends. Dropping it
/// leaves the turn running.
#[derive(Debug)]
pub struct TurnHandle {
    session_id: SessionId,
    outcome: oneshot::Receiver<Result<Terminal>>,
}

impl TurnHandle {
    /// The session the turn belongs to.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// How the turn ended.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] when the runtime stopped before the turn ended (a shutdown keeps
    /// its claim for the next boot); [`Error::Store`] when its terminal could not be recorded.
    pub async fn outcome(self) -> Result<Terminal> {
        self.outcome.await.unwrap_or(Err(Error::ShuttingDown))
    }
}

/// Starts, wakes, interrupts and awaits the turns of sessions. Cheap to clone.
///
/// The low-level, process-local handle under [`crate::Sessions`]: it acts on this process's
/// session actors and records nothing but the turns themselves (for a durable interrupt, use
/// [`crate::Sessions::interrupt`]).
///
/// Every method must be called inside the actix `System` the runtime was started in.
#[derive(Clone)]
pub struct Execution {
    /// The live actors and the `active()` set.
    registry: Arc<Registry>,
    /// What an actor the registry starts is given.
    env: Arc<Environment>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution").finish_non_exhaustive()
    }
}

impl Execution {
    pub(crate) fn new(registry: Arc<Registry>, env: Arc<Environment>) -> Self {
        Self { registry, env }
    }

    /// Whether the runtime is shutting down (no actor starts any more).
    pub(crate) fn is_closed(&self) -> bool {
        self.registry.is_closed()
    }

    async fn deliver<M, R>(&self, id: &SessionId, make: impl FnMut() -> (M, R)) -> Result<R>
    where
        M: actix::Message<Result = ()> + Send + 'static,
        SessionActor: actix::Handler<M>,
    {
        self.registry.deliver(&self.env, id, make).await
    }

    /// Runs a forced turn, or joins the running one, and returns how it ended.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown session, [`Error::ShuttingDown`] while shutting down,
    /// [`Error::Store`] when the turn's terminal could not be recorded.
    pub async fn resume(&self, id: &SessionId) -> Result<Terminal> {
        self.start_resume(id).await?.outcome().await
    }

    /// Starts a forced turn (or joins the running one) without waiting for it: returns once the
    /// session's actor took it (the session is in [`Execution::active`]), with a handle that
    /// awaits how the turn ends. Dropping the handle leaves the turn running.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] while shutting down.
    pub async fn start_resume(&self, id: &SessionId) -> Result<TurnHandle> {
        let outcome = self
            .deliver(id, || {
                let (reply, outcome) = oneshot::channel();
                (
                    Resume {
                        reply,
                        recovery: None,
                    },
                    outcome,
                )
            })
            .await?;
        Ok(TurnHandle {
            session_id: id.clone(),
            outcome,
        })
    }

    /// Runs the next attempt of the session's last turn, which ended `failed` (or `aborted`),
    /// and returns how it ended (see [`Execution::start_retry`]).
    ///
    /// # Errors
    /// Those of [`Execution::start_retry`]; [`Error::Store`] when the turn's terminal could not
    /// be recorded.
    pub async fn retry(&self, id: &SessionId) -> Result<Terminal> {
        self.start_retry(id).await?.outcome().await
    }

    /// Starts the next attempt of the session's last turn, which ended `failed` (or `aborted`:
    /// a dead letter becomes re-runnable): same turn id, its completed steps replay, its failed
    /// ones run again, and `Turn::resumption` names the inputs it had promoted. Returns once
    /// the attempt's claim committed, with a handle that awaits how it ends.
    ///
    /// # Errors
    /// [`Error::NotRetryable`] (nothing written) when a turn is in flight, none has run, or the
    /// last one succeeded or was interrupted; [`Error::NotFound`] for an unknown session;
    /// [`Error::Fenced`] when another node owns the session; [`Error::Store`] when the claim
    /// could not be written; [`Error::ShuttingDown`] while shutting down.
    pub async fn start_retry(&self, id: &SessionId) -> Result<TurnHandle> {
        let (started, outcome) = self
            .deliver(id, || {
                let (started, claimed) = oneshot::channel();
                let (reply, outcome) = oneshot::channel();
                (Retry { started, reply }, (claimed, outcome))
            })
            .await?;
        started.await.unwrap_or(Err(Error::ShuttingDown))?;
        Ok(TurnHandle {
            session_id: id.clone(),
            outcome,
        })
    }

    /// An advisory wake: starts a drain if idle, or rings the running turn's doorbell. Returns
    /// once the wake is delivered, never waiting for the drain. `seq` is the admission seq of
    /// the work that caused it; wakes at or below the session's interrupt fence (its latest
    /// interrupt request) are dropped, as their work was interrupted.
    ///
    /// An unsequenced wake (`seq: None`) names no admission, so it cannot be ordered against an
    /// interrupt request: for a session that has one it is refused with
    /// [`Error::WakeAfterInterrupt`] instead of being dropped. Pass the admission seq of the
    /// work to serve, or run a forced turn with [`Execution::resume`].
    ///
    /// # Errors
    /// [`Error::WakeAfterInterrupt`] for an unsequenced wake of a session with an interrupt
    /// request; [`Error::ShuttingDown`] while shutting down.
    pub async fn wake(&self, id: &SessionId, seq: Option<u64>) -> Result<()> {
        if seq.is_some() {
            let wake = || (Wake { seq, refused: None }, ());
            return self.deliver(id, wake).await;
        }
        let refused = self
            .deliver(id, || {
                let (refused, answer) = oneshot::channel();
                let wake = Wake {
                    seq,
                    refused: Some(refused),
                };
                (wake, answer)
            })
            .await?;
        // Dropped unanswered: the wake was taken (or, for an unknown session, ignored).
        refused.await.map_or(Ok(()), Err)
    }

    /// Interrupts the session's running turn in this process as a user interrupt: cancels the
    /// drain, commits `interrupted{user}` + release, and only then returns `true`. Returns
    /// `false` when nothing was running (or the running drain serves work admitted after `seq`).
    ///
    /// This is the low-level, process-local handle; the durable interrupt is
    /// [`crate::Sessions::interrupt`], which commits `session.interrupt.requested` first and
    /// passes its seq here. Called directly with `seq: None`, this records **no** interrupt
    /// request: it sets no interrupt fence (wakes of prompts admitted before it still start
    /// turns, now or after a restart), does not reach a turn another node runs, and if this
    /// process dies before the turn's terminal commits, the restart sweep resumes the turn
    /// instead of recording it as interrupted. A `seq` given here is taken as the seq of a
    /// committed `session.interrupt.requested`: it raises the actor's in-memory fence (and,
    /// when another node owns the session, is handed to that node through the store).
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] while shutting down.
    pub async fn interrupt(&self, id: &SessionId, seq: Option<u64>) -> Result<bool> {
        self.interrupt_with(id, seq, InterruptReason::User).await
    }

    /// [`Execution::interrupt`] with an explicit reason (`superseded` releases like `user`).
    pub(crate) async fn interrupt_with(
        &self,
        id: &SessionId,
        seq: Option<u64>,
        reason: InterruptReason,
    ) -> Result<bool> {
        let answer = self
            .deliver(id, || {
                let (reply, answer) = oneshot::channel();
                (Interrupt { seq, reason, reply }, answer)
            })
            .await?;
        Ok(answer.await.unwrap_or(false))
    }

    /// Resolves once no turn of `id` runs in this process (through successor turns). Returns at
    /// once when idle; never starts work.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] while shutting down.
    pub async fn await_idle(&self, id: &SessionId) -> Result<()> {
        if !self.registry.is_active(id) {
            return Ok(());
        }
        let idle = self
            .deliver(id, || {
                let (reply, idle) = oneshot::channel();
                (AwaitIdle { reply }, idle)
            })
            .await?;
        let _ = idle.await;
        Ok(())
    }

    /// The sessions with a turn in this process, including ones starting or settling.
    pub fn active(&self) -> BTreeSet<SessionId> {
        self.registry.active()
    }

    /// Whether `id` has a turn in this process.
    pub(crate) fn is_active(&self, id: &SessionId) -> bool {
        self.registry.is_active(id)
    }

    /// This boot's id (recorded with every claim it makes).
    pub(crate) fn boot(&self) -> &str {
        &self.env.boot
    }

    /// The session was deleted: its live actor, if any, forgets it and stops.
    pub(crate) fn forget_deleted(&self, id: &SessionId) {
        self.registry.retire(id);
    }
}
