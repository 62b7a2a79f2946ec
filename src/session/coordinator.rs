//! The per-session execution state machine as plain data and methods: joiners, doorbell
//! coalescing, successor turns, the stop barrier, sequence fences, upgrades of advisory turns
//! and scope close. No actix and no I/O: every method returns the [`Effect`]s the
//! shell (the `SessionActor`, or a test harness) must carry out, and the shell reports back with
//! [`Coordinator::started`], [`Coordinator::drain_finished`] and [`Coordinator::settled`].
//!
//! One *execution* (a turn, a "busy period") runs from its start hook (the claim) through one or
//! more drains to its settle hook (terminal event + release). Wakes during a drain ring the
//! doorbell and coalesce into one follow-up drain; wakes that land while it stops or settles
//! start a *successor* execution.

mod bell;
mod effect;
mod healing;
mod queries;
mod timeout;

use std::fmt;

use self::bell::Bell;
use self::effect::{next_id, Chain, Fence};
pub use self::effect::{Effect, Mode, Phase, Seq, Tokens};
use crate::outcome::{terminal, Exit, InterruptReason, Terminal};

/// One execution (turn) of the session.
struct TurnState<T: Tokens> {
    id: u64,
    phase: Phase,
    /// Mode of the current (or first) drain.
    mode: Mode,
    /// Admission seq the current drain serves, its interrupt fence (None: unsequenced or forced;
    /// a forced first drain that a run upgraded from a wake keeps that wake's seq).
    wake_seq: Option<Seq>,
    /// The highest sequenced admission the current drain serves, even when an unsequenced wake
    /// was coalesced with it: an interrupt older than it must not swallow that newer work.
    served: Option<Seq>,
    /// Id of the running drain, while `phase == Draining`.
    drain: u64,
    /// Wakes received during this execution, to run after the current drain (or as a successor).
    bell: Option<Bell>,
    /// An explicit run joined a wake-mode drain: the next drain is forced.
    upgrade: bool,
    /// An interrupt (or scope close) is stopping this execution.
    stopping: bool,
    /// The stop barrier: the highest interrupt seq applied to this execution.
    interrupt_seq: Option<Seq>,
    /// The interrupt reason; None when stopped by scope close (classified `shutdown`).
    reason: Option<InterruptReason>,
    /// Whether the stop was deliberate (interrupt or close), so it is not reported as a failure.
    deliberate: bool,
    /// Callers joined to this execution.
    runs: Vec<T::Run>,
    /// `await_idle` callers, answered when the chain of executions ends (carried to successors).
    idle: Vec<T::Idle>,
    /// The first non-success terminal of the chain (carried to successors).
    chain_failure: Option<Box<Terminal>>,
    /// Explicit runs that arrived while stopping or settling: they start a fresh execution.
    post_stop_runs: Vec<T::Run>,
    /// Interrupt callers waiting for cleanup.
    interrupters: Vec<T::Interrupt>,
    /// Set once the exit is decided.
    terminal: Option<Terminal>,
    /// The drain failed because the store was unavailable: the shell resumes the turn in place
    /// once the store answers, instead of recording the failure (see [`Coordinator::healing`]).
    healing: bool,
    /// What the shell keeps for this execution ([`Tokens::Turn`]).
    memory: T::Turn,
}

/// The per-session coordinator. `E` is the error type of the settle hook.
///
/// An idle session carries only this (24 bytes: it lives inline in every session actor, so its
/// size is part of every live actor's); everything an execution needs, including the chain's
/// idle waiters, is boxed in [`TurnState`].
pub struct Coordinator<T: Tokens, E> {
    /// Boxed so an idle session (most of them) carries one pointer, not the whole execution.
    execution: Option<Box<TurnState<T>>>,
    /// The highest interrupt seq seen (durable: seeded from the store at actor start).
    boundary: Fence,
    /// The next execution or drain id (one counter for both; ids only need to differ from the
    /// running execution's and drain's, so wrapping after 2^32 is harmless).
    next_id: u32,
    /// Scope closed (shutdown): no new work starts.
    closed: bool,
    _settle_error: std::marker::PhantomData<fn() -> E>,
}

impl<T: Tokens, E> fmt::Debug for Coordinator<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("phase", &self.phase())
            .field("boundary", &self.boundary())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl<T: Tokens, E> Default for Coordinator<T, E> {
    fn default() -> Self {
        Self::new(None)
    }
}

impl<T: Tokens, E> Coordinator<T, E> {
    /// A coordinator whose interrupt fence starts at `boundary` (the latest durable interrupt seq).
    pub fn new(boundary: Option<Seq>) -> Self {
        Self {
            execution: None,
            boundary: Fence::new(boundary),
            next_id: 0,
            closed: false,
            _settle_error: std::marker::PhantomData,
        }
    }

    /// Starts an execution; `chain` is the idle waiters and first failure carried over from the
    /// execution it succeeds (empty for a new chain).
    fn begin(
        &mut self,
        mode: Mode,
        wake_seq: Option<Seq>,
        served: Option<Seq>,
        runs: Vec<T::Run>,
        chain: Chain<T>,
    ) -> Effect<T, E> {
        let id = next_id(&mut self.next_id);
        let (idle, chain_failure) = chain;
        self.execution = Some(Box::new(TurnState {
            id,
            phase: Phase::Starting,
            mode,
            wake_seq: if mode == Mode::Run { None } else { wake_seq },
            served,
            drain: 0,
            bell: None,
            upgrade: false,
            stopping: false,
            interrupt_seq: None,
            reason: None,
            deliberate: false,
            runs,
            idle,
            chain_failure,
            post_stop_runs: Vec::new(),
            interrupters: Vec::new(),
            terminal: None,
            healing: false,
            memory: T::Turn::default(),
        }));
        Effect::Start { execution: id }
    }

    /// An advisory wake, optionally fenced by the admission seq that caused it.
    pub fn wake(&mut self, seq: Option<Seq>) -> Vec<Effect<T, E>> {
        if self.closed || self.is_stale(seq) {
            return Vec::new();
        }
        match &mut self.execution {
            None => vec![
                Effect::Activated,
                self.begin(Mode::Wake, seq, seq, Vec::new(), (Vec::new(), None)),
            ],
            Some(e) => {
                if e.stopping {
                    if let Some(barrier) = e.interrupt_seq {
                        if seq.is_none_or(|s| s <= barrier) {
                            return Vec::new();
                        }
                    }
                }
                e.bell = Some(Bell::merge(e.bell, seq));
                Vec::new()
            }
        }
    }

    /// An explicit run (`resume`): starts an execution, joins the running one (upgrading an
    /// advisory one to a forced follow-up drain), or — while it stops or settles — waits for it to
    /// settle and then starts a fresh one.
    pub fn run(&mut self, token: T::Run) -> Vec<Effect<T, E>> {
        if self.closed {
            return vec![Effect::AnswerRun(
                token,
                Ok(Terminal::Interrupted {
                    reason: InterruptReason::Shutdown,
                }),
            )];
        }
        match &mut self.execution {
            None => vec![
                Effect::Activated,
                self.begin(Mode::Run, None, None, vec![token], (Vec::new(), None)),
            ],
            Some(e) if e.stopping || e.phase == Phase::Settling => {
                e.post_stop_runs.push(token);
                Vec::new()
            }
            Some(e) => {
                e.runs.push(token);
                if e.mode == Mode::Wake {
                    if e.phase == Phase::Starting {
                        // The first drain has not begun: it simply becomes forced. It keeps the
                        // wake's seq, so an older interrupt still cannot cancel that newer work.
                        e.mode = Mode::Run;
                    } else {
                        e.upgrade = true;
                    }
                }
                Vec::new()
            }
        }
    }

    /// Waits until no execution runs (through successors). Answers at once when idle.
    pub fn await_idle(&mut self, token: T::Idle) -> Vec<Effect<T, E>> {
        match &mut self.execution {
            None => vec![Effect::AnswerIdle(token, None)],
            Some(e) => {
                e.idle.push(token);
                Vec::new()
            }
        }
    }

    /// Interrupts the running execution for `reason`, fenced by `seq`: a drain serving work
    /// admitted after `seq` is not the one the caller meant to stop, and keeps running.
    ///
    /// The caller is answered `true` once cleanup finished (the settle hook committed), or `false`
    /// at once when there was nothing to interrupt.
    pub fn interrupt(
        &mut self,
        seq: Option<Seq>,
        reason: InterruptReason,
        token: T::Interrupt,
    ) -> Vec<Effect<T, E>> {
        if let Some(s) = seq {
            self.raise_boundary(s);
        }
        let Some(e) = &mut self.execution else {
            return vec![Effect::AnswerInterrupt(token, false)];
        };
        if e.phase == Phase::Settling && !e.healing {
            // The outcome is decided; no reason attaches. Drop the wakes this interrupt covers.
            e.bell = e.bell.and_then(|b| b.after_interrupt(seq));
            return vec![Effect::AnswerInterrupt(token, false)];
        }
        if e.stopping {
            // Cleanup in progress: join it, moving the stop barrier forward for a newer seq.
            if let Some(s) = seq {
                if e.interrupt_seq.is_none_or(|b| s > b) {
                    e.interrupt_seq = Some(s);
                    e.bell = e.bell.and_then(|b| b.after_interrupt(Some(s)));
                }
            }
            e.interrupters.push(token);
            return Vec::new();
        }
        if let (Some(s), Some(w)) = (seq, e.wake_seq) {
            if w > s {
                // The running drain serves work admitted after the interrupt.
                e.bell = e.bell.and_then(|b| b.after_interrupt(seq));
                return vec![Effect::AnswerInterrupt(token, false)];
            }
        }
        e.stopping = true;
        e.deliberate = true;
        e.interrupt_seq = seq;
        e.reason = Some(reason);
        e.upgrade = false;
        e.bell = e.bell.and_then(|b| b.after_interrupt(seq));
        if let (Some(s), Some(served)) = (seq, e.served) {
            if served > s {
                // The cancelled drain also served work admitted after the interrupt (coalesced
                // with an unsequenced wake): keep it for a successor.
                e.bell = Some(Bell::merge(e.bell, Some(served)));
            }
        }
        e.interrupters.push(token);
        if e.phase == Phase::Draining {
            vec![Effect::Cancel { drain: e.drain }]
        } else {
            // Starting: the claim commit is uninterruptible; `started` settles instead of draining.
            Vec::new()
        }
    }

    /// Closes the scope (shutdown): cancels the running drain with no reason (classified
    /// `shutdown`), answers queued explicit runs as interrupted, and starts nothing afterwards.
    pub fn close(&mut self) -> Vec<Effect<T, E>> {
        self.closed = true;
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        let shutdown = Terminal::Interrupted {
            reason: InterruptReason::Shutdown,
        };
        let mut effects: Vec<Effect<T, E>> = e
            .post_stop_runs
            .drain(..)
            .map(|token| Effect::AnswerRun(token, Ok(shutdown.clone())))
            .collect();
        e.bell = None;
        e.upgrade = false;
        if e.phase != Phase::Settling && !e.stopping {
            e.stopping = true;
            e.deliberate = true;
            if e.phase == Phase::Draining {
                effects.push(Effect::Cancel { drain: e.drain });
            }
        }
        effects
    }

    /// The start hook of execution `execution` finished. `Err` carries a failure of the claim
    /// commit; the turn then settles as failed without draining.
    pub fn started(&mut self, execution: u64, result: Result<(), Exit>) -> Vec<Effect<T, E>> {
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        if e.id != execution || e.phase != Phase::Starting {
            return Vec::new();
        }
        match result {
            Err(exit) => self.settle(exit),
            Ok(()) if e.stopping => self.settle(Exit::Interrupted),
            Ok(()) => {
                e.phase = Phase::Draining;
                let drain = next_id(&mut self.next_id);
                e.drain = drain;
                vec![Effect::Drain {
                    drain,
                    mode: e.mode,
                    wake_seq: e.wake_seq,
                }]
            }
        }
    }

    /// Drain `drain` ended with `exit`. Stale reports (of a drain no longer running) are ignored.
    pub fn drain_finished(&mut self, drain: u64, exit: Exit) -> Vec<Effect<T, E>> {
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        if e.phase != Phase::Draining || e.drain != drain {
            return Vec::new();
        }
        if matches!(exit, Exit::Success) && !e.stopping && (e.upgrade || e.bell.is_some()) {
            let (mode, wake_seq) = if e.upgrade {
                (Mode::Run, None)
            } else {
                (Mode::Wake, e.bell.and_then(Bell::wake_seq))
            };
            e.served = e.bell.and_then(|b| b.seq);
            e.upgrade = false;
            e.bell = None;
            e.mode = mode;
            e.wake_seq = wake_seq;
            let drain = next_id(&mut self.next_id);
            e.drain = drain;
            return vec![Effect::Drain {
                drain,
                mode,
                wake_seq,
            }];
        }
        let exit = if e.stopping && matches!(exit, Exit::Success) {
            Exit::Interrupted
        } else {
            exit
        };
        self.settle(exit)
    }

    fn settle(&mut self, exit: Exit) -> Vec<Effect<T, E>> {
        let e = self
            .execution
            .as_mut()
            .expect("settle is only called with an execution");
        e.phase = Phase::Settling;
        let classified = terminal(&exit, e.reason);
        e.terminal = Some(classified.clone());
        let mut effects = vec![Effect::Settle {
            terminal: classified.clone(),
        }];
        if e.mode == Mode::Wake && !e.deliberate && !classified.is_success() {
            effects.push(Effect::ReportFailure {
                terminal: classified,
            });
        }
        effects
    }

    /// The settle hook of the current execution finished (`Err` = the terminal commit failed;
    /// ownership is released all the same and the error goes to the joined `run` callers).
    pub fn settled(&mut self, result: Result<(), E>) -> Vec<Effect<T, E>>
    where
        E: Clone,
    {
        let Some(mut e) = self.execution.take() else {
            return Vec::new();
        };
        if e.phase != Phase::Settling {
            self.execution = Some(e);
            return Vec::new();
        }
        let terminal = e.terminal.expect("a settling execution has a terminal");
        // Being stopped by scope close is not a failure of the chain: idle waiters are released
        // with no failure, since the turn's own work did not fail (the next boot resumes it).
        let closed_by_scope = self.closed
            && e.deliberate
            && e.reason.is_none()
            && terminal
                == Terminal::Interrupted {
                    reason: InterruptReason::Shutdown,
                };
        if !terminal.is_success() && !closed_by_scope && e.chain_failure.is_none() {
            e.chain_failure = Some(Box::new(terminal.clone()));
        }
        let (idle, chain_failure) = (std::mem::take(&mut e.idle), e.chain_failure.take());
        let mut effects: Vec<Effect<T, E>> = Vec::new();
        for token in e.runs {
            effects.push(Effect::AnswerRun(
                token,
                result.clone().map(|()| terminal.clone()),
            ));
        }
        for token in e.interrupters {
            effects.push(Effect::AnswerInterrupt(token, true));
        }
        // Drop what the fence covers (an interrupt raised it while this execution settled).
        let bell = match self.boundary.get() {
            None => e.bell,
            Some(boundary) => e.bell.and_then(|b| b.after_interrupt(Some(boundary))),
        };
        if !self.closed && (!e.post_stop_runs.is_empty() || bell.is_some()) {
            let (mode, seq, served) = if e.post_stop_runs.is_empty() {
                (
                    Mode::Wake,
                    bell.and_then(Bell::wake_seq),
                    bell.and_then(|b| b.seq),
                )
            } else {
                (Mode::Run, None, None)
            };
            effects.push(self.begin(mode, seq, served, e.post_stop_runs, (idle, chain_failure)));
            if mode == Mode::Run {
                if let (Some(bell), Some(next)) = (bell, self.execution.as_mut()) {
                    // A wake rang too: it is served by the forced drain's follow-up.
                    next.bell = Some(bell);
                }
            }
            return effects;
        }
        // Leave `active()` before any caller is answered, so a caller that sees its answer never
        // sees the session still active.
        effects.insert(0, Effect::Deactivated);
        for token in idle {
            effects.push(Effect::AnswerIdle(token, chain_failure.as_deref().cloned()));
        }
        effects
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
