//! The `SessionActor`: one actix actor per live session, a thin shell over the coordinator.
//!
//! Its mailbox serializes `Wake`, `Resume`, `Interrupt`, `AwaitIdle` and `Close` for one
//! session. Decisions are the coordinator's; the actor carries out its effects: it commits the
//! claim (with `session.execution.started`) through the journal *before* calling the runner,
//! runs the drain as a cancellable future on its arbiter (a panic is caught and recorded as
//! `Failed{kind: "panic"}`), and commits the terminal event (+ release, except on shutdown).

mod contain;
pub(crate) mod coordinator;
mod deadline;
mod handlers;
mod heal;
pub(crate) mod messages;

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use futures::FutureExt;

use self::contain::{panic_message, DropSafe};
use self::coordinator::{Coordinator, Effect, Mode, Tokens};
use self::deadline::TurnMemory;
use crate::crash;
use crate::error::{Error, StoreError};
use crate::id::SessionId;
use crate::journal::ledger::Ledger;
use crate::journal::Journal;
use crate::outcome::{Exit, RunError, Terminal};
use crate::records::Resumption;
use crate::runner::Runner;
use crate::turn::{LiveSink, Turn, TurnCause, TurnSetup};

/// What every session actor of a runtime is given when it starts.
pub(crate) struct Environment {
    /// The durable store: claims, settlements, and what a turn writes.
    pub(crate) journal: Journal,
    /// The user's runner.
    pub(crate) runner: Arc<dyn Runner>,
    /// This boot's id. Claims record [`Environment::claimant`].
    pub(crate) boot: String,
    /// How long an actor stays idle before the supervisor may passivate it.
    pub(crate) idle_timeout: Duration,
    /// How long a turn may run before it is interrupted as `timeout` (None: no limit).
    pub(crate) turn_timeout: Option<Duration>,
    /// The resume budget of a turn: a turn resumed after a store fault counts an attempt too.
    pub(crate) max_resume_attempts: u32,
    /// The actor's registry entry and the `active()` set.
    pub(crate) host: Arc<dyn Host>,
    /// Where its turns' live-only events go (the runtime's per-session stream routes).
    pub(crate) live: Arc<dyn LiveSink>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("boot", &self.boot)
            .finish_non_exhaustive()
    }
}

impl Environment {
    /// The id recorded with this process's claims, and left out of its restart sweep: the boot
    /// id; with several nodes, the node's current id (a new one after the node rejoined).
    pub(crate) fn claimant(&self) -> String {
        self.journal
            .node_id()
            .map_or_else(|| self.boot.clone(), |id| id.to_string())
    }
}

/// The registry as a session actor sees it: the set of sessions with a turn in this process,
/// which the actor changes as its coordinator says (`Effect::Activated` / `Deactivated`), and
/// its own entry, which it removes when it stops.
pub(crate) trait Host: Send + Sync {
    /// The session has a turn in this process.
    fn activate(&self, id: &SessionId);
    /// The session's turns have all settled.
    fn deactivate(&self, id: &SessionId);
    /// Removes the actor's entry (if it is still generation `generation`'s).
    fn forget(&self, id: &SessionId, generation: u64, why: Forget);
    /// The clock of [`Stamp::touched`].
    fn now_ms(&self) -> u64;
    /// A takeover sweep of this node is adopting the session: it owns it already and has
    /// counted (or is counting) the turn's attempt, and the restart notice, the claim and the
    /// resume (with the resumption) are on their way. A wake or an interrupt handled meanwhile
    /// would start a plain turn next to the adopted one (a second claim, and the resumption
    /// dropped when the resume joins it): they wait until the adoption is done.
    fn adopting(&self, id: &SessionId) -> bool;
    /// The session's actor stopped with a turn in hand: that turn's claim may be open with no
    /// live turn. Its next actor heals it before it claims ([`Host::take_orphan`]).
    fn orphaned(&self, id: &SessionId);
    /// Whether [`Host::orphaned`] was said of the session since it was last taken.
    fn take_orphan(&self, id: &SessionId) -> bool;
}

/// What a session actor and its registry entry share (the registry hands it to the actor when
/// it starts it).
#[derive(Debug)]
pub(crate) struct Stamp {
    /// Distinguishes this incarnation from earlier and later actors of the same session.
    pub(crate) generation: u64,
    /// When the actor last did anything (ms since the registry started); written by the actor.
    pub(crate) touched: AtomicU64,
    /// The fencing epoch of this node's ownership of the session (0 with a single-node store);
    /// here rather than in the actor, which must stay small.
    pub(crate) epoch: AtomicU64,
    /// The generation of the node id this node acquired the session under (0: not acquired,
    /// or a single-node store); a lost lease fences only the sessions of its generation.
    pub(crate) node: AtomicU64,
}

/// What the actor knows of its session's row and owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Not loaded yet, or not stored (re-read on the next message that needs it).
    Unknown,
    /// Stored and owned by this node, at the epoch in [`Stamp::epoch`].
    Mine,
    /// Stored and owned by another live node: messages are forwarded to it.
    Elsewhere,
}

/// Why an actor asks the registry to forget it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forget {
    /// It stopped after a panicked drain; the next message starts its replacement.
    Replaced,
    /// It was idle longer than `idle_timeout`.
    Passivated,
    /// Any other stop (system shutdown, external stop).
    Stopped,
}

/// The reply channels the actor hands its coordinator.
pub(crate) struct ActorTokens;

impl Tokens for ActorTokens {
    type Run = oneshot::Sender<Result<Terminal, Error>>;
    type Idle = oneshot::Sender<()>;
    type Interrupt = oneshot::Sender<bool>;
    type Turn = TurnMemory;
}

type SettleError = Arc<StoreError>;

/// One live session.
///
/// Kept at most 72 bytes (see the `size` test): the actix context and tokio's task header around
/// it come to 440 bytes, and tokio allocates a task in steps of 128 bytes, so every byte past 72
/// costs each live actor another 128. What only a running turn needs is boxed.
pub(crate) struct SessionActor {
    env: Arc<Environment>,
    id: SessionId,
    coordinator: Coordinator<ActorTokens, SettleError>,
    /// This incarnation's generation and last activity, shared with its registry entry.
    stamp: Arc<Stamp>,
    /// The running drain and a recovery waiting for its drain; boxed, as most actors are idle.
    running: Option<Box<Running>>,
    /// Whether the session is stored and owned here (loaded at start, re-read when it was not).
    held: Held,
    /// A drain panicked: after settling, the actor stops and is replaced.
    panicked: bool,
    /// Another node took the session over: after settling, the actor stops and forgets it.
    fenced: bool,
    /// The session may hold a claim of this process with no live turn (a commit whose answer
    /// was lost, an actor that stopped mid-turn): the next turn heals it instead of claiming.
    orphan: bool,
}

/// What only a session with a turn in hand carries.
#[derive(Default)]
struct Running {
    /// The running drain: its id, the handle that removes it from the context, and the flag
    /// that keeps it from being polled again (see `DropSafe`).
    drain: Option<(u64, SpawnHandle, Rc<Cell<bool>>)>,
    /// Set while handling a `Resume` of the restart sweep, which already committed the turn's
    /// claim: a turn it starts skips its own claim write, and its first drain is a recovery.
    recovery: Option<Arc<Resumption>>,
    /// The claim `recovery` names is a retry's ([`crate::Sessions::retry`]), not the sweep's.
    retry: bool,
    /// The turn's claim failed to commit: the turn never started, so nothing is recorded for
    /// its end, and its callers get this error.
    claim_failed: Option<SettleError>,
    /// The seq of the newest durable event of the turn before its drain (its claim, or the
    /// restart notice of a resumed turn): its live events never overtake it on a stream.
    committed: Option<u64>,
    /// The drain failed because the store was unavailable: the turn is healed, not settled.
    store_fault: Option<StoreError>,
}

impl std::fmt::Debug for SessionActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionActor")
            .field("id", &self.id)
            .field("generation", &self.stamp.generation)
            .field("coordinator", &self.coordinator)
            .finish_non_exhaustive()
    }
}

impl SessionActor {
    pub(crate) fn new(env: Arc<Environment>, id: SessionId, stamp: Arc<Stamp>) -> Self {
        Self {
            env,
            id,
            coordinator: Coordinator::new(None),
            stamp,
            running: None,
            held: Held::Unknown,
            panicked: false,
            fenced: false,
            orphan: false,
        }
    }

    /// The fencing epoch the actor's turns write under.
    fn epoch(&self) -> u64 {
        self.stamp.epoch.load(Ordering::Relaxed)
    }

    /// Carries out the coordinator's effects, in order; effects produced while doing so are
    /// appended, so chains of synchronous transitions never recurse.
    fn apply(&mut self, effects: Vec<Effect<ActorTokens, SettleError>>, ctx: &mut Context<Self>) {
        let mut queue: VecDeque<_> = effects.into();
        self.touch();
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::Activated => self.env.host.activate(&self.id),
                Effect::Deactivated => self.env.host.deactivate(&self.id),
                Effect::Start { execution } => queue.extend(self.start_hook(execution, ctx)),
                Effect::Drain {
                    drain,
                    mode,
                    wake_seq,
                } => self.spawn_drain(drain, mode, wake_seq, ctx),
                Effect::Cancel { drain } => {
                    let running = self.running.as_mut().and_then(|r| r.drain.take());
                    if let Some((id, handle, cancelled)) = running {
                        if id == drain {
                            self.running = None;
                            cancelled.set(true);
                            ctx.cancel_future(handle);
                            queue.extend(self.coordinator.drain_finished(drain, Exit::Interrupted));
                        } else if let Some(r) = self.running.as_mut() {
                            r.drain = Some((id, handle, cancelled));
                        }
                    }
                }
                Effect::Settle { terminal } => queue.extend(self.settle_hook(terminal, ctx)),
                Effect::ReportFailure { terminal } => {
                    log::warn!(
                        "session {}: advisory turn ended badly: {terminal:?}",
                        self.id
                    );
                }
                Effect::AnswerRun(reply, answer) => {
                    let _ = reply.send(answer.map_err(|e| Error::from(e.duplicate())));
                }
                Effect::AnswerIdle(reply, _) => {
                    let _ = reply.send(());
                }
                Effect::AnswerInterrupt(reply, interrupted) => {
                    let _ = reply.send(interrupted);
                }
            }
        }
        if self.fenced && !self.coordinator.is_active() {
            log::warn!(
                "session {}: another node took it over; forgetting it",
                self.id
            );
            self.retire(Forget::Stopped, ctx);
        } else if self.panicked && !self.coordinator.is_active() {
            log::warn!("session {}: replacing the actor after a panic", self.id);
            self.retire(Forget::Replaced, ctx);
        }
    }

    fn touch(&self) {
        self.stamp
            .touched
            .store(self.env.host.now_ms(), Ordering::Relaxed);
    }

    /// Commits the claim with `session.execution.started` (uninterruptible), then reports.
    /// Returns the effects of a claim already committed (see `preclaimed`), else none.
    fn start_hook(
        &mut self,
        execution: u64,
        ctx: &mut Context<Self>,
    ) -> Vec<Effect<ActorTokens, SettleError>> {
        if self.running.as_ref().is_some_and(|r| r.recovery.is_some()) {
            // The restart sweep committed this turn's claim with its notice.
            crash::point(crash::AFTER_CLAIM_BEFORE_DRAIN);
            return self.coordinator.started(execution, Ok(()));
        }
        crash::point(crash::BEFORE_CLAIM);
        if std::mem::take(&mut self.orphan) {
            self.heal_claim(execution, 0, ctx);
        } else {
            self.claim(execution, 0, ctx);
        }
        Vec::new()
    }

    /// Runs the user's drain as a cancellable future; a panic is caught and becomes a failure.
    fn spawn_drain(
        &mut self,
        drain: u64,
        mode: Mode,
        wake_seq: Option<u64>,
        ctx: &mut Context<Self>,
    ) {
        let (recovery, committed, retry) = self
            .running
            .take()
            .map_or((None, None, false), |r| (r.recovery, r.committed, r.retry));
        let committed = committed.or(recovery.as_ref().map(|r| r.notice_seq));
        // The turn's ledger: kept by its execution across drains; a resumed or retried turn's
        // is read from the store before its drain runs.
        let kept = self.coordinator.memory().and_then(|m| m.ledger.clone());
        let first = kept.is_none() && recovery.is_none();
        let shared = |ledger| Arc::new(Mutex::new(ledger));
        let (ledger, load) = match (&recovery, kept) {
            (Some(resumption), _) => (
                shared(Ledger::fresh(resumption.turn)),
                Some(resumption.turn),
            ),
            (None, Some(ledger)) => (ledger, None),
            (None, None) => (shared(Ledger::fresh(committed.unwrap_or(0))), None),
        };
        if let Some(memory) = self.coordinator.memory() {
            memory.ledger = Some(ledger.clone());
        }
        let deadline = self.turn_deadline(ctx);
        let cause = match (mode, recovery) {
            (_, Some(resumption)) if retry => TurnCause::Retry(resumption),
            (_, Some(resumption)) => TurnCause::Recovery(resumption),
            (Mode::Run, None) => TurnCause::Resume,
            (Mode::Wake, None) => TurnCause::Wake { seq: wake_seq },
        };
        let setup = TurnSetup {
            wake_seq,
            epoch: self.epoch(),
            committed: committed.unwrap_or(0),
            live: self.env.live.clone(),
            ledger,
            first,
            deadline,
        };
        let turn = Turn::new(self.env.journal.clone(), self.id.clone(), cause, setup);
        let runner = self.env.runner.clone();
        let faults = turn.fault_probe();
        // Its turns are marked ended with the future: returned, panicked or cancelled.
        let end = turn.end_guard();
        let future = DropSafe::new(
            AssertUnwindSafe(async move {
                let _end = end;
                let mut turn = turn;
                if let Some(id) = load {
                    turn.load_ledger(id).await?;
                }
                runner.drain(turn).await
            })
            .catch_unwind()
            .boxed_local(),
        );
        let cancelled = future.canceller();
        let handle = ctx.spawn(future.into_actor(self).map(move |result, act, ctx| {
            if act
                .running
                .as_ref()
                .is_some_and(|r| r.drain.as_ref().is_some_and(|d| d.0 == drain))
            {
                act.running = None;
            }
            let exit = match result {
                Ok(Ok(())) => Exit::Success,
                Ok(Err(error)) => Exit::Failure(error),
                Err(panic) => {
                    act.panicked = true;
                    let message = panic_message(panic.as_ref());
                    log::error!("session {}: drain panicked: {message}", act.id);
                    Exit::Failure(RunError::Panic(message))
                }
            };
            if matches!(&exit, Exit::Failure(e) if !matches!(e, RunError::Panic(_))) {
                // The store failed the drain, not the runner: the turn is healed, not settled.
                if let Some(fault) = faults.store_fault() {
                    act.running.get_or_insert_with(Box::default).store_fault = Some(fault);
                }
            }
            let effects = act.coordinator.drain_finished(drain, exit);
            act.apply(effects, ctx);
        }));
        self.running = Some(Box::new(Running {
            drain: Some((drain, handle, cancelled)),
            committed,
            ..Running::default()
        }));
    }

    /// Commits the terminal event (+ release unless shutdown), then reports. Returns the effects
    /// of a turn whose claim failed: it settles at once, recording nothing.
    fn settle_hook(
        &mut self,
        terminal: Terminal,
        ctx: &mut Context<Self>,
    ) -> Vec<Effect<ActorTokens, SettleError>> {
        if let Some(error) = self.running.as_mut().and_then(|r| r.claim_failed.take()) {
            if self.running.as_ref().is_some_and(|r| r.drain.is_none()) {
                self.running = None;
            }
            return self.coordinator.settled(Err(error));
        }
        let store_fault = self.running.as_mut().and_then(|r| r.store_fault.take());
        if let (Some(fault), Terminal::Failed { .. }) = (store_fault, &terminal) {
            log::warn!(
                "session {}: the store failed the turn ({fault}); it stays claimed and resumes \
                 once the store answers",
                self.id
            );
            // Its callers are told now; the turn itself goes on once the store answers.
            let effects = self.coordinator.healing(Arc::new(fault));
            self.heal(0, ctx);
            return effects;
        }
        crash::point(crash::AFTER_DRAIN_BEFORE_RELEASE);
        self.commit_terminal(terminal, 0, ctx);
        Vec::new()
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
        self.orphan = self.env.host.take_orphan(&self.id);
        // Before the first message: whether the session exists, and its interrupt fence.
        self.when_loaded(ctx, |_, _| {});
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // System stop or passivation: any drain future was dropped with the context; claims are
        // kept, so the next boot resumes the turn.
        if self.coordinator.is_active() {
            self.env.host.deactivate(&self.id);
            if !self.coordinator.is_closed() {
                self.env.host.orphaned(&self.id);
            }
        }
        self.env
            .host
            .forget(&self.id, self.stamp.generation, Forget::Stopped);
    }
}

#[cfg(test)]
mod size {
    /// Past 72 bytes every live actor's tokio task grows by 128 bytes (see [`super::SessionActor`]).
    #[test]
    fn session_actor_fits_its_task_allocation() {
        assert!(std::mem::size_of::<super::SessionActor>() <= 72);
        assert!(
            std::mem::size_of::<super::Coordinator<super::ActorTokens, super::SettleError>>() <= 24
        );
    }
}
