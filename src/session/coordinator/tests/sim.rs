//! The deterministic shell the coordinator tests run on: [`Sim`] (see [`super`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::super::effect::RunAnswer;
use super::super::{Coordinator, Effect, Mode, Seq, Tokens};
use crate::outcome::{Exit, InterruptReason, Terminal};

/// Plain ids as waiter tokens.
#[derive(Debug)]
pub(crate) struct SimTokens;

impl Tokens for SimTokens {
    type Run = u32;
    type Idle = u32;
    type Interrupt = u32;
    type Turn = ();
}

pub(crate) type Fx = Effect<SimTokens, String>;

/// Which kind of caller a token was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    Run,
    Idle,
    Interrupt,
}

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainState {
    Running,
    CleanupStarted,
    Finished,
}

/// One drain the coordinator asked for.
#[derive(Debug, Clone)]
pub(crate) struct DrainRec {
    pub(crate) key: String,
    pub(crate) id: u64,
    pub(crate) mode: Mode,
    pub(crate) wake_seq: Option<Seq>,
    pub(crate) state: DrainState,
    /// The harness clock when the drain started.
    pub(crate) started_at: u64,
    /// The coordinator's interrupt fence when the drain started.
    pub(crate) boundary_at_start: Option<Seq>,
}

/// The deterministic shell.
#[derive(Debug, Default)]
pub(crate) struct Sim {
    pub(crate) coords: BTreeMap<String, Coordinator<SimTokens, String>>,
    /// The owning scope was closed: every coordinator, present or future, is closed.
    pub(crate) closed: bool,
    /// Hold start hooks until [`Sim::release_start`].
    pub(crate) hold_starts: bool,
    /// Hold settle hooks until [`Sim::release_settle`].
    pub(crate) hold_settles: bool,
    pub(crate) next_token: u32,
    /// Ticks once per operation and once per applied effect.
    pub(crate) clock: u64,
    pub(crate) issued: BTreeMap<u32, (String, Caller)>,
    /// Every start hook: (key, execution).
    pub(crate) starts: Vec<(String, u64)>,
    pub(crate) pending_starts: BTreeMap<String, u64>,
    /// Every drain, in start order.
    pub(crate) drains: Vec<DrainRec>,
    /// Index into `drains` of the drain running (or cleaning up) per key.
    pub(crate) current: BTreeMap<String, usize>,
    pub(crate) cancels: Vec<(String, u64)>,
    /// Every settle hook: (key, terminal).
    pub(crate) settles: Vec<(String, Terminal)>,
    pub(crate) pending_settles: BTreeSet<String>,
    /// Keys with an execution between its start hook and its settle hook's completion.
    pub(crate) executing: BTreeSet<String>,
    pub(crate) run_answers: BTreeMap<u32, RunAnswer<String>>,
    pub(crate) idle_answers: BTreeMap<u32, Option<Terminal>>,
    pub(crate) interrupt_answers: BTreeMap<u32, bool>,
    pub(crate) active: BTreeSet<String>,
    pub(crate) reported: Vec<(String, Terminal)>,
}

impl Sim {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn coord(&mut self, key: &str) -> &mut Coordinator<SimTokens, String> {
        if !self.coords.contains_key(key) {
            let mut coordinator = Coordinator::new(None);
            if self.closed {
                assert!(coordinator.close().is_empty());
            }
            self.coords.insert(key.to_owned(), coordinator);
        }
        self.coords.get_mut(key).expect("inserted above")
    }

    /// The coordinator of `key` (created on first use).
    pub(crate) fn coordinator(&mut self, key: &str) -> &Coordinator<SimTokens, String> {
        self.coord(key)
    }

    pub(crate) fn token(&mut self, key: &str, caller: Caller) -> u32 {
        self.next_token += 1;
        self.issued
            .insert(self.next_token, (key.to_owned(), caller));
        self.next_token
    }

    // ---- operations -------------------------------------------------------------------------

    pub(crate) fn wake(&mut self, key: &str, seq: Option<Seq>) {
        self.clock += 1;
        let effects = self.coord(key).wake(seq);
        self.apply(key, effects);
    }

    pub(crate) fn run(&mut self, key: &str) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Run);
        let effects = self.coord(key).run(token);
        self.apply(key, effects);
        token
    }

    pub(crate) fn await_idle(&mut self, key: &str) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Idle);
        let effects = self.coord(key).await_idle(token);
        self.apply(key, effects);
        token
    }

    /// A user interrupt fenced by `seq`.
    pub(crate) fn interrupt(&mut self, key: &str, seq: Option<Seq>) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Interrupt);
        let effects = self.coord(key).interrupt(seq, InterruptReason::User, token);
        self.apply(key, effects);
        token
    }

    /// The running turn of `key` passed its deadline ([`Coordinator::time_out`]).
    pub(crate) fn time_out(&mut self, key: &str) {
        self.clock += 1;
        let effects = self.coord(key).time_out();
        self.apply(key, effects);
    }

    /// Closes the owning scope: every coordinator, and those created later.
    pub(crate) fn close_all(&mut self) {
        self.clock += 1;
        self.closed = true;
        let keys: Vec<String> = self.coords.keys().cloned().collect();
        for key in keys {
            let effects = self.coord(&key).close();
            self.apply(&key, effects);
        }
    }

    /// Completes the held start hook of `key`.
    pub(crate) fn release_start(&mut self, key: &str, result: Result<(), Exit>) {
        self.clock += 1;
        let execution = self
            .pending_starts
            .remove(key)
            .unwrap_or_else(|| panic!("no held start hook for {key}"));
        let effects = self.coord(key).started(execution, result);
        self.apply(key, effects);
    }

    /// Completes the held settle hook of `key`.
    pub(crate) fn release_settle(&mut self, key: &str, result: Result<(), String>) {
        self.clock += 1;
        assert!(
            self.pending_settles.remove(key),
            "no held settle hook for {key}"
        );
        assert!(self.executing.remove(key));
        let effects = self.coord(key).settled(result);
        self.apply(key, effects);
    }

    /// The held settle hook of `key` found the drain's failure was the store's: the shell
    /// heals the turn instead of recording it ([`Coordinator::healing`]).
    pub(crate) fn heal(&mut self, key: &str) {
        assert!(
            self.pending_settles.contains(key),
            "no held settle hook for {key}"
        );
        let effects = self.coord(key).healing("store unavailable".to_owned());
        self.apply(key, effects);
    }

    /// The healing turn of `key` was resumed in place ([`Coordinator::resumed`]).
    pub(crate) fn resume_healed(&mut self, key: &str) {
        self.clock += 1;
        assert!(
            self.pending_settles.remove(key),
            "no held settle hook for {key}"
        );
        let effects = self.coord(key).resumed();
        self.apply(key, effects);
    }

    /// The running drain of `key` returns `exit`.
    pub(crate) fn finish(&mut self, key: &str, exit: Exit) {
        self.finish_in(key, DrainState::Running, exit);
    }

    /// The cleanup of the cancelled drain of `key` ends: it reports [`Exit::Interrupted`].
    pub(crate) fn finish_cleanup(&mut self, key: &str) {
        self.finish_in(key, DrainState::CleanupStarted, Exit::Interrupted);
    }

    pub(crate) fn finish_in(&mut self, key: &str, state: DrainState, exit: Exit) {
        self.clock += 1;
        let index = *self
            .current
            .get(key)
            .unwrap_or_else(|| panic!("no drain of {key} to finish"));
        let drain = &mut self.drains[index];
        assert_eq!(drain.state, state, "drain {} of {key}", drain.id);
        drain.state = DrainState::Finished;
        let id = drain.id;
        self.current.remove(key);
        let effects = self.coord(key).drain_finished(id, exit);
        self.apply(key, effects);
    }

    /// Finishes running drains with what `exit` says until none runs (iteratively, so thousands
    /// of self-waking drains do not grow the stack). Drains being cancelled are left alone.
    pub(crate) fn run_drains(&mut self, mut exit: impl FnMut(&mut Sim, &DrainRec) -> Exit) {
        while let Some(drain) = self.running_any() {
            let exit = exit(self, &drain);
            self.finish(&drain.key, exit);
        }
    }

    /// Lets every running drain succeed at once, to quiescence.
    pub(crate) fn complete_all_immediate(&mut self) {
        self.run_drains(|_, _| Exit::Success);
    }

    pub(crate) fn running_any(&self) -> Option<DrainRec> {
        self.current
            .values()
            .map(|&i| &self.drains[i])
            .find(|d| d.state == DrainState::Running)
            .cloned()
    }

    // ---- effects ----------------------------------------------------------------------------

    pub(crate) fn apply(&mut self, key: &str, effects: Vec<Fx>) {
        let mut queue: VecDeque<Fx> = effects.into();
        while let Some(effect) = queue.pop_front() {
            self.clock += 1;
            queue.extend(self.apply_one(key, effect));
        }
        for (key, coordinator) in &self.coords {
            assert_eq!(
                self.active.contains(key),
                coordinator.is_active(),
                "active set out of step for {key}"
            );
        }
    }

    pub(crate) fn answer_for(&self, token: u32, key: &str, caller: Caller) {
        let issued = self
            .issued
            .get(&token)
            .unwrap_or_else(|| panic!("token {token} was never issued"));
        assert_eq!(issued, &(key.to_owned(), caller), "token {token}");
    }

    pub(crate) fn apply_one(&mut self, key: &str, effect: Fx) -> Vec<Fx> {
        match effect {
            Effect::Activated => {
                assert!(self.active.insert(key.to_owned()), "{key} activated twice");
                Vec::new()
            }
            Effect::Deactivated => {
                assert!(self.active.remove(key), "{key} deactivated while inactive");
                assert!(
                    !self.executing.contains(key),
                    "{key} deactivated mid-execution"
                );
                Vec::new()
            }
            Effect::Start { execution } => {
                assert!(self.active.contains(key), "{key} started while inactive");
                assert!(
                    self.executing.insert(key.to_owned()),
                    "two executions of {key} at once"
                );
                self.starts.push((key.to_owned(), execution));
                if self.hold_starts {
                    self.pending_starts.insert(key.to_owned(), execution);
                    Vec::new()
                } else {
                    self.coord(key).started(execution, Ok(()))
                }
            }
            Effect::Drain {
                drain,
                mode,
                wake_seq,
            } => {
                assert!(
                    self.executing.contains(key),
                    "{key} drains without execution"
                );
                assert!(
                    !self.pending_starts.contains_key(key),
                    "{key} drains before its start hook finished"
                );
                assert!(
                    !self.current.contains_key(key),
                    "two drains of {key} at once"
                );
                let boundary_at_start = self.coord(key).boundary();
                self.current.insert(key.to_owned(), self.drains.len());
                self.drains.push(DrainRec {
                    key: key.to_owned(),
                    id: drain,
                    mode,
                    wake_seq,
                    state: DrainState::Running,
                    started_at: self.clock,
                    boundary_at_start,
                });
                Vec::new()
            }
            Effect::Cancel { drain } => {
                let index = *self
                    .current
                    .get(key)
                    .unwrap_or_else(|| panic!("cancel of {key} without a drain"));
                let rec = &mut self.drains[index];
                assert_eq!(rec.id, drain, "cancel of a drain that is not current");
                assert_eq!(rec.state, DrainState::Running, "cancelled twice");
                rec.state = DrainState::CleanupStarted;
                self.cancels.push((key.to_owned(), drain));
                Vec::new()
            }
            Effect::Settle { terminal } => {
                assert!(
                    self.executing.contains(key),
                    "{key} settles without execution"
                );
                assert!(
                    !self.current.contains_key(key),
                    "{key} settles while a drain runs"
                );
                self.settles.push((key.to_owned(), terminal));
                if self.hold_settles {
                    assert!(self.pending_settles.insert(key.to_owned()));
                    Vec::new()
                } else {
                    self.executing.remove(key);
                    self.coord(key).settled(Ok(()))
                }
            }
            Effect::ReportFailure { terminal } => {
                self.reported.push((key.to_owned(), terminal));
                Vec::new()
            }
            Effect::AnswerRun(token, answer) => {
                self.answer_for(token, key, Caller::Run);
                assert!(
                    self.run_answers.insert(token, answer).is_none(),
                    "run {token} answered twice"
                );
                Vec::new()
            }
            Effect::AnswerIdle(token, answer) => {
                self.answer_for(token, key, Caller::Idle);
                assert!(
                    self.idle_answers.insert(token, answer).is_none(),
                    "idle {token} answered twice"
                );
                Vec::new()
            }
            Effect::AnswerInterrupt(token, answer) => {
                self.answer_for(token, key, Caller::Interrupt);
                assert!(
                    self.interrupt_answers.insert(token, answer).is_none(),
                    "interrupt {token} answered twice"
                );
                Vec::new()
            }
        }
    }

    // ---- observations -----------------------------------------------------------------------

    /// How many drains `key` ran.
    pub(crate) fn runs(&self, key: &str) -> usize {
        self.drains.iter().filter(|d| d.key == key).count()
    }

    /// The modes of the drains of `key`, in order.
    pub(crate) fn modes(&self, key: &str) -> Vec<Mode> {
        self.drains
            .iter()
            .filter(|d| d.key == key)
            .map(|d| d.mode)
            .collect()
    }

    /// The wake seqs of the drains of `key`, in order.
    pub(crate) fn wake_seqs(&self, key: &str) -> Vec<Option<Seq>> {
        self.drains
            .iter()
            .filter(|d| d.key == key)
            .map(|d| d.wake_seq)
            .collect()
    }

    /// The drain of `key` that is running or cleaning up.
    pub(crate) fn current_state(&self, key: &str) -> Option<DrainState> {
        self.current.get(key).map(|&i| self.drains[i].state)
    }

    pub(crate) fn starts(&self, key: &str) -> usize {
        self.starts.iter().filter(|(k, _)| k == key).count()
    }

    pub(crate) fn cancels(&self, key: &str) -> usize {
        self.cancels.iter().filter(|(k, _)| k == key).count()
    }

    /// The terminals the settle hook of `key` committed, in order.
    pub(crate) fn settled(&self, key: &str) -> Vec<Terminal> {
        self.settles
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// The advisory failures reported for `key`.
    pub(crate) fn reported(&self, key: &str) -> Vec<Terminal> {
        self.reported
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// The `active` snapshot.
    pub(crate) fn active(&self) -> Vec<&str> {
        self.active.iter().map(String::as_str).collect()
    }

    pub(crate) fn run_answer(&self, token: u32) -> Option<&RunAnswer<String>> {
        self.run_answers.get(&token)
    }

    pub(crate) fn idle_answer(&self, token: u32) -> Option<&Option<Terminal>> {
        self.idle_answers.get(&token)
    }

    pub(crate) fn interrupt_answer(&self, token: u32) -> Option<bool> {
        self.interrupt_answers.get(&token).copied()
    }

    /// Whether a start or settle hook is held or a drain runs or cleans up.
    pub(crate) fn has_pending_work(&self) -> bool {
        !self.pending_starts.is_empty()
            || !self.pending_settles.is_empty()
            || !self.current.is_empty()
    }

    pub(crate) fn held_start(&self, key: &str) -> bool {
        self.pending_starts.contains_key(key)
    }

    pub(crate) fn held_settle(&self, key: &str) -> bool {
        self.pending_settles.contains(key)
    }

    pub(crate) fn cleaning_up(&self, key: &str) -> bool {
        self.current_state(key) == Some(DrainState::CleanupStarted)
    }

    pub(crate) fn draining(&self, key: &str) -> bool {
        self.current_state(key) == Some(DrainState::Running)
    }

    /// Asserts every issued token was answered exactly once (twice is caught when it happens).
    pub(crate) fn assert_all_answered(&self) {
        for (token, (key, caller)) in &self.issued {
            let answered = match caller {
                Caller::Run => self.run_answers.contains_key(token),
                Caller::Idle => self.idle_answers.contains_key(token),
                Caller::Interrupt => self.interrupt_answers.contains_key(token),
            };
            assert!(
                answered,
                "{caller:?} caller {token} of {key} never answered"
            );
        }
    }
}
