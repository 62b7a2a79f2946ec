//! The coordinator's vocabulary: sequence numbers, drain modes, waiter tokens, execution phases,
//! and the [`Effect`]s a shell carries out; also the compact fence and id counter an idle
//! coordinator keeps inline.

use std::fmt;

use crate::outcome::Terminal;

/// A per-session event sequence number.
pub type Seq = u64;

/// Whether a drain is advisory (a wake) or forced (an explicit run / resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Drain only if eligible work exists (`force = false`).
    Wake,
    /// Make at least one attempt even if nothing new is pending (`force = true`).
    Run,
}

/// The waiter tokens a shell hands the coordinator; it hands them back in answer effects.
pub trait Tokens {
    /// A `resume`/`run` caller waiting for its execution's outcome.
    type Run;
    /// An `await_idle` caller.
    type Idle;
    /// An `interrupt` caller waiting for cleanup to finish.
    type Interrupt;
    /// What the shell keeps for one execution, from its start to its settle (the actor: the
    /// turn's ledger, which its drains share).
    type Turn: Default;
}

/// What a `run` caller receives: the terminal of the execution it joined, or the error of that
/// execution's settle hook (ownership is released either way).
pub type RunAnswer<E> = Result<Terminal, E>;

/// Something the shell must do, in order.
pub enum Effect<T: Tokens, E> {
    /// The session now has an execution: it enters `active()`.
    Activated,
    /// Commit the start hook (claim + `session.execution.started`), then call
    /// [`Coordinator::started`]. The hook is uninterruptible.
    Start {
        /// The execution's id.
        execution: u64,
    },
    /// Call the runner. Report the result with [`Coordinator::drain_finished`] and this `drain`.
    Drain {
        /// Identifies this drain in [`Coordinator::drain_finished`].
        drain: u64,
        /// Advisory or forced.
        mode: Mode,
        /// The admission seq that woke this drain, if any.
        wake_seq: Option<Seq>,
    },
    /// Cancel the running drain (drop its future) and report [`Exit::Interrupted`].
    Cancel {
        /// The drain to cancel.
        drain: u64,
    },
    /// Commit the settle hook (terminal event, plus release unless shutdown), then call
    /// [`Coordinator::settled`].
    Settle {
        /// The classified outcome.
        terminal: Terminal,
    },
    /// An advisory (wake-started) drain ended badly on its own: log it, exactly once.
    ReportFailure {
        /// The classified outcome.
        terminal: Terminal,
    },
    /// The session has no execution any more: it leaves `active()`.
    Deactivated,
    /// Answer a `run` caller.
    AnswerRun(T::Run, RunAnswer<E>),
    /// Answer an `await_idle` caller with the first non-success terminal of the chain, if any.
    AnswerIdle(T::Idle, Option<Terminal>),
    /// Answer an `interrupt` caller: whether a running execution was interrupted.
    AnswerInterrupt(T::Interrupt, bool),
}

impl<T: Tokens, E: fmt::Debug> fmt::Debug for Effect<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Activated => f.write_str("Activated"),
            Effect::Start { execution } => write!(f, "Start({execution})"),
            Effect::Drain {
                drain,
                mode,
                wake_seq,
            } => write!(f, "Drain({drain}, {mode:?}, {wake_seq:?})"),
            Effect::Cancel { drain } => write!(f, "Cancel({drain})"),
            Effect::Settle { terminal } => write!(f, "Settle({terminal:?})"),
            Effect::ReportFailure { terminal } => write!(f, "ReportFailure({terminal:?})"),
            Effect::Deactivated => f.write_str("Deactivated"),
            Effect::AnswerRun(_, answer) => write!(f, "AnswerRun({answer:?})"),
            Effect::AnswerIdle(_, answer) => write!(f, "AnswerIdle({answer:?})"),
            Effect::AnswerInterrupt(_, answer) => write!(f, "AnswerInterrupt({answer})"),
        }
    }
}

/// Where an execution is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The start hook (claim) is being committed; uninterruptible.
    Starting,
    /// A drain runs (or is being cancelled, when `stopping`).
    Draining,
    /// The settle hook is being committed; the outcome is decided.
    Settling,
}

/// An optional seq in eight bytes: 0 is none, `seq + 1` is `seq` (a seq of `u64::MAX` would read
/// as `u64::MAX - 1`; SQLite seqs stop at `i64::MAX`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fence(u64);

impl Fence {
    pub(super) fn new(seq: Option<Seq>) -> Self {
        Self(seq.map_or(0, |s| s.saturating_add(1)))
    }

    pub(super) fn get(self) -> Option<Seq> {
        self.0.checked_sub(1)
    }
}

/// Takes the next execution or drain id from `counter`.
pub(super) fn next_id(counter: &mut u32) -> u64 {
    let id = *counter;
    *counter = id.wrapping_add(1);
    u64::from(id)
}

/// The idle waiters and first failure of a chain of executions, handed to a successor.
pub(super) type Chain<T> = (Vec<<T as Tokens>::Idle>, Option<Box<Terminal>>);
