//! The transitions of an execution that waits for the store: a turn whose drain the store
//! failed is healed (resumed in place) rather than settled, and the callers of an execution
//! waiting on the store are answered with its error at once.

use super::effect::next_id;
use super::{Coordinator, Effect, Mode, Phase, Tokens};
use crate::outcome::Exit;

impl<T: Tokens, E> Coordinator<T, E> {
    /// Whether the current execution is an advisory one no caller waits on (a wake's turn).
    pub fn is_advisory(&self) -> bool {
        self.execution
            .as_ref()
            .is_some_and(|e| e.mode == Mode::Wake && e.runs.is_empty())
    }

    /// The settling execution's drain failed because the store was unavailable: the shell
    /// resumes the turn in place once the store answers ([`Coordinator::resumed`]) rather than
    /// record the failure, or reports [`Coordinator::settled`] when the turn ended otherwise.
    /// Until then an interrupt stops the turn as it would a running drain (it is carried out
    /// when the resume is done), and wakes wait for the resumed drain. The `run` callers are
    /// answered at once with `error` (the store's): the turn goes on without them.
    pub fn healing(&mut self, error: E) -> Vec<Effect<T, E>>
    where
        E: Clone,
    {
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        if e.phase != Phase::Settling {
            return Vec::new();
        }
        e.healing = true;
        self.fail_runs(error)
    }

    /// Answers the `run` callers of the current execution with `error` now (the store is
    /// unavailable and the execution waits for it): the execution goes on without them.
    pub fn fail_runs(&mut self, error: E) -> Vec<Effect<T, E>>
    where
        E: Clone,
    {
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        e.runs
            .drain(..)
            .map(|token| Effect::AnswerRun(token, Err(error.clone())))
            .collect()
    }

    /// The healing execution's turn was resumed in place (its restart notice and claim are
    /// committed): it drains again, forced — or, when an interrupt or the scope's close came
    /// while it healed, settles as interrupted.
    pub fn resumed(&mut self) -> Vec<Effect<T, E>> {
        let closed = self.closed;
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        if e.phase != Phase::Settling || !e.healing {
            return Vec::new();
        }
        e.healing = false;
        e.terminal = None;
        e.phase = Phase::Draining;
        if e.stopping || closed {
            e.deliberate = true;
            return self.settle(Exit::Interrupted);
        }
        e.mode = Mode::Run;
        e.wake_seq = None;
        let drain = next_id(&mut self.next_id);
        e.drain = drain;
        vec![Effect::Drain {
            drain,
            mode: Mode::Run,
            wake_seq: None,
        }]
    }
}
