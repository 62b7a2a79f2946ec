//! Coordinator tests on a deterministic harness: joiners, wakes and the doorbell, interrupts and
//! their fences, cleanup, successor executions, scope close and the `active` snapshot.
//!
//! [`Sim`] plays the shell: it keeps one [`Coordinator`] per key and carries out the effects.
//! Start and settle hooks either complete at once or are held until the test releases them;
//! drains always stay running until the test finishes them; a [`Effect::Cancel`] only marks the
//! drain "cleanup started", and the test decides when cleanup ends (as a runner's own cleanup
//! after a cancellation would) by calling [`Sim::finish_cleanup`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::effect::RunAnswer;
use super::{Coordinator, Effect, Mode, Seq, Tokens};
use crate::outcome::{Exit, InterruptReason, RunError, SessionError, Terminal};

/// Plain ids as waiter tokens.
#[derive(Debug)]
pub(super) struct SimTokens;

impl Tokens for SimTokens {
    type Run = u32;
    type Idle = u32;
    type Interrupt = u32;
}

type Fx = Effect<SimTokens, String>;

/// Which kind of caller a token was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    Run,
    Idle,
    Interrupt,
}

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DrainState {
    Running,
    CleanupStarted,
    Finished,
}

/// One drain the coordinator asked for.
#[derive(Debug, Clone)]
pub(super) struct DrainRec {
    pub(super) key: String,
    pub(super) id: u64,
    pub(super) mode: Mode,
    pub(super) wake_seq: Option<Seq>,
    pub(super) state: DrainState,
    /// The harness clock when the drain started.
    pub(super) started_at: u64,
    /// The coordinator's interrupt fence when the drain started.
    pub(super) boundary_at_start: Option<Seq>,
}

/// The deterministic shell.
#[derive(Debug, Default)]
pub(super) struct Sim {
    coords: BTreeMap<String, Coordinator<SimTokens, String>>,
    /// The owning scope was closed: every coordinator, present or future, is closed.
    closed: bool,
    /// Hold start hooks until [`Sim::release_start`].
    pub(super) hold_starts: bool,
    /// Hold settle hooks until [`Sim::release_settle`].
    pub(super) hold_settles: bool,
    next_token: u32,
    /// Ticks once per operation and once per applied effect.
    pub(super) clock: u64,
    issued: BTreeMap<u32, (String, Caller)>,
    /// Every start hook: (key, execution).
    starts: Vec<(String, u64)>,
    pending_starts: BTreeMap<String, u64>,
    /// Every drain, in start order.
    pub(super) drains: Vec<DrainRec>,
    /// Index into `drains` of the drain running (or cleaning up) per key.
    current: BTreeMap<String, usize>,
    cancels: Vec<(String, u64)>,
    /// Every settle hook: (key, terminal).
    settles: Vec<(String, Terminal)>,
    pending_settles: BTreeSet<String>,
    /// Keys with an execution between its start hook and its settle hook's completion.
    executing: BTreeSet<String>,
    run_answers: BTreeMap<u32, RunAnswer<String>>,
    idle_answers: BTreeMap<u32, Option<Terminal>>,
    interrupt_answers: BTreeMap<u32, bool>,
    active: BTreeSet<String>,
    reported: Vec<(String, Terminal)>,
}

impl Sim {
    pub(super) fn new() -> Self {
        Self::default()
    }

    fn coord(&mut self, key: &str) -> &mut Coordinator<SimTokens, String> {
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
    pub(super) fn coordinator(&mut self, key: &str) -> &Coordinator<SimTokens, String> {
        self.coord(key)
    }

    fn token(&mut self, key: &str, caller: Caller) -> u32 {
        self.next_token += 1;
        self.issued
            .insert(self.next_token, (key.to_owned(), caller));
        self.next_token
    }

    // ---- operations -------------------------------------------------------------------------

    pub(super) fn wake(&mut self, key: &str, seq: Option<Seq>) {
        self.clock += 1;
        let effects = self.coord(key).wake(seq);
        self.apply(key, effects);
    }

    pub(super) fn run(&mut self, key: &str) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Run);
        let effects = self.coord(key).run(token);
        self.apply(key, effects);
        token
    }

    pub(super) fn await_idle(&mut self, key: &str) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Idle);
        let effects = self.coord(key).await_idle(token);
        self.apply(key, effects);
        token
    }

    /// A user interrupt fenced by `seq`.
    pub(super) fn interrupt(&mut self, key: &str, seq: Option<Seq>) -> u32 {
        self.clock += 1;
        let token = self.token(key, Caller::Interrupt);
        let effects = self.coord(key).interrupt(seq, InterruptReason::User, token);
        self.apply(key, effects);
        token
    }

    /// Closes the owning scope: every coordinator, and those created later.
    pub(super) fn close_all(&mut self) {
        self.clock += 1;
        self.closed = true;
        let keys: Vec<String> = self.coords.keys().cloned().collect();
        for key in keys {
            let effects = self.coord(&key).close();
            self.apply(&key, effects);
        }
    }

    /// Completes the held start hook of `key`.
    pub(super) fn release_start(&mut self, key: &str, result: Result<(), Exit>) {
        self.clock += 1;
        let execution = self
            .pending_starts
            .remove(key)
            .unwrap_or_else(|| panic!("no held start hook for {key}"));
        let effects = self.coord(key).started(execution, result);
        self.apply(key, effects);
    }

    /// Completes the held settle hook of `key`.
    pub(super) fn release_settle(&mut self, key: &str, result: Result<(), String>) {
        self.clock += 1;
        assert!(
            self.pending_settles.remove(key),
            "no held settle hook for {key}"
        );
        assert!(self.executing.remove(key));
        let effects = self.coord(key).settled(result);
        self.apply(key, effects);
    }

    /// The running drain of `key` returns `exit`.
    pub(super) fn finish(&mut self, key: &str, exit: Exit) {
        self.finish_in(key, DrainState::Running, exit);
    }

    /// The cleanup of the cancelled drain of `key` ends: it reports [`Exit::Interrupted`].
    pub(super) fn finish_cleanup(&mut self, key: &str) {
        self.finish_in(key, DrainState::CleanupStarted, Exit::Interrupted);
    }

    fn finish_in(&mut self, key: &str, state: DrainState, exit: Exit) {
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
    pub(super) fn run_drains(&mut self, mut exit: impl FnMut(&mut Sim, &DrainRec) -> Exit) {
        while let Some(drain) = self.running_any() {
            let exit = exit(self, &drain);
            self.finish(&drain.key, exit);
        }
    }

    /// Lets every running drain succeed at once, to quiescence.
    pub(super) fn complete_all_immediate(&mut self) {
        self.run_drains(|_, _| Exit::Success);
    }

    fn running_any(&self) -> Option<DrainRec> {
        self.current
            .values()
            .map(|&i| &self.drains[i])
            .find(|d| d.state == DrainState::Running)
            .cloned()
    }

    // ---- effects ----------------------------------------------------------------------------

    fn apply(&mut self, key: &str, effects: Vec<Fx>) {
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

    fn answer_for(&self, token: u32, key: &str, caller: Caller) {
        let issued = self
            .issued
            .get(&token)
            .unwrap_or_else(|| panic!("token {token} was never issued"));
        assert_eq!(issued, &(key.to_owned(), caller), "token {token}");
    }

    fn apply_one(&mut self, key: &str, effect: Fx) -> Vec<Fx> {
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
    pub(super) fn runs(&self, key: &str) -> usize {
        self.drains.iter().filter(|d| d.key == key).count()
    }

    /// The modes of the drains of `key`, in order.
    pub(super) fn modes(&self, key: &str) -> Vec<Mode> {
        self.drains
            .iter()
            .filter(|d| d.key == key)
            .map(|d| d.mode)
            .collect()
    }

    /// The wake seqs of the drains of `key`, in order.
    fn wake_seqs(&self, key: &str) -> Vec<Option<Seq>> {
        self.drains
            .iter()
            .filter(|d| d.key == key)
            .map(|d| d.wake_seq)
            .collect()
    }

    /// The drain of `key` that is running or cleaning up.
    fn current_state(&self, key: &str) -> Option<DrainState> {
        self.current.get(key).map(|&i| self.drains[i].state)
    }

    fn starts(&self, key: &str) -> usize {
        self.starts.iter().filter(|(k, _)| k == key).count()
    }

    fn cancels(&self, key: &str) -> usize {
        self.cancels.iter().filter(|(k, _)| k == key).count()
    }

    /// The terminals the settle hook of `key` committed, in order.
    fn settled(&self, key: &str) -> Vec<Terminal> {
        self.settles
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// The advisory failures reported for `key`.
    fn reported(&self, key: &str) -> Vec<Terminal> {
        self.reported
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// The `active` snapshot.
    fn active(&self) -> Vec<&str> {
        self.active.iter().map(String::as_str).collect()
    }

    pub(super) fn run_answer(&self, token: u32) -> Option<&RunAnswer<String>> {
        self.run_answers.get(&token)
    }

    pub(super) fn idle_answer(&self, token: u32) -> Option<&Option<Terminal>> {
        self.idle_answers.get(&token)
    }

    pub(super) fn interrupt_answer(&self, token: u32) -> Option<bool> {
        self.interrupt_answers.get(&token).copied()
    }

    /// Whether a start or settle hook is held or a drain runs or cleans up.
    pub(super) fn has_pending_work(&self) -> bool {
        !self.pending_starts.is_empty()
            || !self.pending_settles.is_empty()
            || !self.current.is_empty()
    }

    pub(super) fn held_start(&self, key: &str) -> bool {
        self.pending_starts.contains_key(key)
    }

    pub(super) fn held_settle(&self, key: &str) -> bool {
        self.pending_settles.contains(key)
    }

    pub(super) fn cleaning_up(&self, key: &str) -> bool {
        self.current_state(key) == Some(DrainState::CleanupStarted)
    }

    pub(super) fn draining(&self, key: &str) -> bool {
        self.current_state(key) == Some(DrainState::Running)
    }

    /// Asserts every issued token was answered exactly once (twice is caught when it happens).
    pub(super) fn assert_all_answered(&self) {
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

const S: &str = "session";

fn succeeded() -> RunAnswer<String> {
    Ok(Terminal::Succeeded)
}

fn interrupted(reason: InterruptReason) -> Terminal {
    Terminal::Interrupted { reason }
}

fn user() -> Terminal {
    interrupted(InterruptReason::User)
}

fn shutdown() -> Terminal {
    interrupted(InterruptReason::Shutdown)
}

fn failed(kind: &str, message: &str) -> Terminal {
    Terminal::Failed {
        error: SessionError::new(kind, message),
    }
}

fn fail(message: &str) -> Exit {
    Exit::Failure(RunError::Other(message.to_owned()))
}

fn defect(message: &str) -> Exit {
    Exit::Failure(RunError::Panic(message.to_owned()))
}

// ---- Joiners, wakes, interrupts, cleanup and successors -----------------------------------------

/// Two explicit runs of one key share one drain and both get its outcome.
#[test]
fn joins_concurrent_resumes_for_one_key() {
    let mut sim = Sim::new();
    let first = sim.run(S);
    let second = sim.run(S);
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.run_answer(first), None);
    assert_eq!(sim.run_answer(second), None);

    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.run_answer(second), Some(&succeeded()));
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.starts(S), 1);
    sim.assert_all_answered();
}

/// A wake on an idle key starts an advisory drain.
#[test]
fn starts_a_drain_when_woken_while_idle() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    assert_eq!(sim.modes(S), [Mode::Wake]);
    assert!(sim.draining(S));
    sim.complete_all_immediate();
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
    assert!(sim.active().is_empty());
}

/// A wake on an idle key starts an execution: it becomes active, runs its start hook and drains.
#[test]
fn starts_execution_when_woken_while_idle() {
    let mut sim = Sim::new();
    sim.hold_starts = true;
    sim.wake(S, None);
    assert_eq!(sim.active(), [S]);
    assert!(sim.held_start(S));
    assert_eq!(sim.runs(S), 0, "the drain waits for the start hook");
    sim.release_start(S, Ok(()));
    assert_eq!(sim.starts(S), 1);
    assert_eq!(sim.modes(S), [Mode::Wake]);
    sim.complete_all_immediate();
    assert!(sim.active().is_empty());
}

/// An interrupt of an idle key answers "nothing interrupted" at once, and a later run settles
/// with no reason attached.
#[test]
fn does_nothing_when_interrupted_while_idle() {
    let mut sim = Sim::new();
    let interrupt = sim.interrupt(S, None);
    assert_eq!(sim.interrupt_answer(interrupt), Some(false));
    assert!(sim.active().is_empty());
    assert_eq!(sim.coordinator(S).boundary(), None);

    let run = sim.run(S);
    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.settled(S), [Terminal::Succeeded], "no reason attaches");
    assert_eq!(sim.runs(S), 1);
}

/// An idle interrupt still raises the fence: an older wake is dropped, a newer one runs.
#[test]
fn suppresses_stale_wakes_after_an_idle_interrupt_boundary() {
    let mut sim = Sim::new();
    let interrupt = sim.interrupt(S, Some(2));
    assert_eq!(sim.interrupt_answer(interrupt), Some(false));
    sim.wake(S, Some(1));
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.runs(S), 0);
    assert!(sim.active().is_empty());

    sim.wake(S, Some(3));
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), None);
    sim.complete_all_immediate();
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.wake_seqs(S), [Some(3)]);
}

/// An interrupt older than the running drain's wake does not cancel it.
#[test]
fn does_not_interrupt_a_wake_newer_than_the_interrupt_boundary() {
    let mut sim = Sim::new();
    sim.wake(S, Some(3));
    assert!(sim.draining(S));
    let interrupt = sim.interrupt(S, Some(2));
    assert!(sim.draining(S), "the drain is not cancelled");
    assert_eq!(sim.cancels(S), 0);
    assert_eq!(sim.interrupt_answer(interrupt), Some(false));

    sim.finish(S, Exit::Success);
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
}

/// Interrupting an old drain keeps a queued newer wake, which runs after cleanup.
#[test]
fn preserves_a_queued_wake_newer_than_the_interrupt_boundary() {
    let mut sim = Sim::new();
    sim.wake(S, Some(1));
    sim.wake(S, Some(3));
    let interrupt = sim.interrupt(S, Some(2));
    assert!(sim.cleaning_up(S));
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.settled(S), [user()]);

    assert!(sim.draining(S), "the newer wake runs after cleanup");
    let idle = sim.await_idle(S);
    sim.complete_all_immediate();
    assert!(sim.idle_answer(idle).is_some());
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.wake_seqs(S), [Some(1), Some(3)]);
}

/// An interrupt stops only its own key.
#[test]
fn interrupts_only_the_requested_key() {
    let mut sim = Sim::new();
    sim.wake("first", None);
    sim.wake("second", None);
    assert!(sim.draining("first") && sim.draining("second"));

    sim.interrupt("first", None);
    assert!(sim.cleaning_up("first"));
    assert!(sim.draining("second"), "the other key is not interrupted");
    assert_eq!(sim.cancels("second"), 0);

    sim.finish_cleanup("first");
    sim.finish("second", Exit::Success);
    let idle = sim.await_idle("second");
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.settled("second"), [Terminal::Succeeded]);
}

/// An interrupt cancels the running drain and drops the wake queued behind it; the run caller
/// gets "interrupted" and a second interrupt finds nothing.
#[test]
fn interrupts_the_active_drain_and_suppresses_its_queued_wake() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, None);
    assert!(sim.cleaning_up(S));
    sim.finish_cleanup(S);

    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.run_answer(run), Some(&Ok(user())));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.runs(S), 1);

    let again = sim.interrupt(S, None);
    assert_eq!(sim.interrupt_answer(again), Some(false));
}

/// A stale wake that lands during cleanup is dropped; a newer wake later runs.
#[test]
fn suppresses_a_wake_received_during_interruption_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, Some(2));
    sim.wake(S, Some(1));
    assert!(sim.cleaning_up(S));
    assert_eq!(sim.runs(S), 1);

    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.runs(S), 1);

    sim.wake(S, Some(3));
    assert!(sim.draining(S));
    let idle = sim.await_idle(S);
    sim.complete_all_immediate();
    assert!(sim.idle_answer(idle).is_some());
    assert_eq!(sim.runs(S), 2);
}

/// A wake newer than the stop barrier that lands during cleanup survives a later stale
/// interrupt and runs after cleanup.
#[test]
fn remembers_a_wake_received_after_the_interrupt_boundary_during_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, Some(2));
    assert!(sim.cleaning_up(S));
    sim.wake(S, Some(3));
    let stale = sim.interrupt(S, Some(1));
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.cancels(S), 1);

    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.interrupt_answer(stale), Some(true));
    assert!(sim.draining(S));
    let idle = sim.await_idle(S);
    sim.complete_all_immediate();
    assert!(sim.idle_answer(idle).is_some());
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.wake_seqs(S), [None, Some(3)]);
}

/// A newer interrupt during cleanup moves the stop barrier past a wake that landed in between;
/// a wake newer still runs.
#[test]
fn moves_the_stop_barrier_forward_for_repeated_interrupts() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let first = sim.interrupt(S, Some(2));
    sim.wake(S, Some(3));
    let second = sim.interrupt(S, Some(4));
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(first), Some(true));
    assert_eq!(sim.interrupt_answer(second), Some(true));
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.runs(S), 1);

    sim.wake(S, Some(5));
    assert!(sim.draining(S));
    sim.complete_all_immediate();
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.wake_seqs(S), [None, Some(5)]);
}

/// A run that joined the running wake before the interrupt is interrupted with it.
#[test]
fn interrupts_an_explicit_run_queued_before_the_interruption_request() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let run = sim.run(S);
    sim.interrupt(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(run), Some(&Ok(user())));
    assert_eq!(sim.runs(S), 1);
    assert!(sim.active().is_empty());
}

/// The interrupted run caller (and the interrupter) are answered only once cleanup ends.
#[test]
fn settles_a_pre_interrupt_explicit_run_only_after_active_wake_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let run = sim.run(S);
    let interrupt = sim.interrupt(S, None);
    assert!(sim.cleaning_up(S));
    assert_eq!(sim.run_answer(run), None);
    assert_eq!(sim.interrupt_answer(interrupt), None);

    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(run), Some(&Ok(user())));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
}

/// A run arriving during cleanup is not interrupted: it starts a fresh, forced execution after
/// cleanup.
#[test]
fn starts_an_explicit_run_arriving_during_interrupt_cleanup_after_the_stop_barrier() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, None);
    let run = sim.run(S);
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(
        sim.run_answer(run),
        None,
        "the run waits for its own execution"
    );
    assert!(sim.draining(S));
    assert_eq!(sim.starts(S), 2);

    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.modes(S), [Mode::Wake, Mode::Run]);
}

/// A run before the interrupt is interrupted; a run during cleanup runs after it.
#[test]
fn interrupts_pre_stop_waiters_and_runs_post_stop_waiters_after_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let before = sim.run(S);
    let interrupt = sim.interrupt(S, None);
    let after = sim.run(S);
    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(before), Some(&Ok(user())));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.run_answer(after), None);

    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(after), Some(&succeeded()));
    assert_eq!(sim.runs(S), 2);
}

/// Run, await-idle and interrupt callers all wait for cleanup; then the run and the idle waiter
/// see the interruption.
#[test]
fn waits_for_interrupt_cleanup_before_settling_callers() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    let idle = sim.await_idle(S);
    let interrupt = sim.interrupt(S, None);
    assert!(sim.cleaning_up(S));
    assert_eq!(sim.run_answer(run), None);
    assert_eq!(sim.idle_answer(idle), None);
    assert_eq!(sim.interrupt_answer(interrupt), None);

    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(run), Some(&Ok(user())));
    assert_eq!(sim.idle_answer(idle), Some(&Some(user())));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
}

/// A second interrupt during cleanup joins the first: one cancellation, both answered after
/// cleanup.
#[test]
fn joins_concurrent_interruption_requests_for_one_active_drain() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let first = sim.interrupt(S, None);
    let second = sim.interrupt(S, None);
    assert_eq!(sim.cancels(S), 1);
    assert_eq!(sim.interrupt_answer(first), None);
    assert_eq!(sim.interrupt_answer(second), None);

    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(first), Some(true));
    assert_eq!(sim.interrupt_answer(second), Some(true));
    assert_eq!(sim.settled(S), [user()]);
}

/// A run queued during cleanup survives a second interrupt and still runs.
#[test]
fn does_not_discard_a_post_stop_explicit_run_when_interrupted_again() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let first = sim.interrupt(S, None);
    let run = sim.run(S);
    let second = sim.interrupt(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(first), Some(true));
    assert_eq!(sim.interrupt_answer(second), Some(true));
    assert!(sim.draining(S));

    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.runs(S), 2);
}

/// Three wakes during a run coalesce into one follow-up drain, which the run caller waits for.
#[test]
fn coalesces_wakes_received_during_an_active_run() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    sim.wake(S, None);
    sim.wake(S, None);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(run), None);
    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.modes(S), [Mode::Run, Mode::Wake]);
}

/// Three wakes during an execution coalesce into exactly one more drain.
#[test]
fn coalesces_wakes_received_during_active_execution() {
    let mut sim = Sim::new();
    let resumed = sim.run(S);
    sim.wake(S, None);
    sim.wake(S, None);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    assert!(sim.draining(S), "the second drain started");
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(resumed), Some(&succeeded()));
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.starts(S), 1);
}

/// `await_idle` waits through a coalesced follow-up drain.
#[test]
fn waits_for_a_coalesced_ownership_chain_to_become_idle() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let idle = sim.await_idle(S);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    assert!(sim.draining(S));
    assert_eq!(sim.idle_answer(idle), None);
    sim.finish(S, Exit::Success);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(sim.runs(S), 2);
}

/// `await_idle` over a chain whose first execution died reports that defect, even though the
/// successor succeeded.
#[test]
fn reports_the_first_defect_after_a_failed_chain_becomes_idle() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let idle = sim.await_idle(S);
    sim.wake(S, None);
    sim.finish(S, defect("defect"));
    assert!(sim.draining(S), "the wake starts a successor");
    assert_eq!(sim.idle_answer(idle), None);
    sim.finish(S, Exit::Success);
    assert_eq!(
        sim.idle_answer(idle),
        Some(&Some(failed("panic", "defect")))
    );
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.starts(S), 2);
}

/// A wake during the follow-up drain causes one more.
#[test]
fn runs_again_when_woken_during_the_coalesced_drain() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.runs(S), 3);
}

/// A wake during the follow-up drain causes a third drain in the same execution.
#[test]
fn runs_again_when_woken_during_the_follow_up() {
    let mut sim = Sim::new();
    let resumed = sim.run(S);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    assert!(sim.draining(S), "the third drain started");
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(resumed), Some(&succeeded()));
    assert_eq!(sim.runs(S), 3);
    assert_eq!(sim.starts(S), 1);
}

/// A wake racing with a failing run starts one successor; the run caller sees the failure.
#[test]
fn starts_one_successor_after_a_wake_races_with_failure() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    sim.wake(S, None);
    sim.finish(S, fail("failed"));
    assert_eq!(sim.run_answer(run), Some(&Ok(failed("unknown", "failed"))));
    assert!(sim.draining(S));
    sim.complete_all_immediate();
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.starts(S), 2);
}

/// The same race, checked on what settles: one follow-up drain in the same execution, the
/// failure for the run caller, then the follow-up's success.
#[test]
fn starts_one_follow_up_when_a_wake_races_with_failure() {
    let mut sim = Sim::new();
    let resumed = sim.run(S);
    sim.wake(S, None);
    sim.finish(S, fail("failed"));
    assert_eq!(
        sim.run_answer(resumed),
        Some(&Ok(failed("unknown", "failed")))
    );
    assert!(sim.draining(S), "the follow-up started");
    sim.complete_all_immediate();
    assert_eq!(sim.runs(S), 2);
    assert_eq!(
        sim.settled(S),
        [failed("unknown", "failed"), Terminal::Succeeded]
    );
}

/// A run joining an advisory drain forces one more drain after it: modes wake, run. (The
/// advisory drain started before the run was asked for and may already have found nothing to
/// do; a run is promised a forced attempt that starts after it asked.)
#[test]
fn upgrades_an_active_wake_when_an_explicit_run_joins_it() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let run = sim.run(S);
    sim.finish(S, Exit::Success);
    assert_eq!(
        sim.run_answer(run),
        None,
        "the run waits for its forced drain"
    );
    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.modes(S), [Mode::Wake, Mode::Run]);
}

/// A run joining a coalesced advisory drain forces one more drain too: modes run, wake, run.
#[test]
fn upgrades_a_recursive_wake_drain_when_an_explicit_run_joins_it() {
    let mut sim = Sim::new();
    let first = sim.run(S);
    sim.wake(S, None);
    sim.finish(S, Exit::Success);
    let second = sim.run(S);
    sim.finish(S, Exit::Success);
    assert!(sim.draining(S), "the forced drain started");
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.run_answer(second), Some(&succeeded()));
    assert_eq!(sim.modes(S), [Mode::Run, Mode::Wake, Mode::Run]);
}

/// The upgraded forced drain's failure reaches the run caller even though a wake then starts a
/// successful advisory successor: modes wake, run, wake.
#[test]
fn propagates_an_upgraded_explicit_run_failure_before_a_successful_advisory_successor() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let run = sim.run(S);
    sim.finish(S, Exit::Success);
    sim.wake(S, None);
    sim.finish(S, fail("explicit run failed"));
    assert!(sim.draining(S), "the advisory successor started");
    sim.complete_all_immediate();
    assert_eq!(
        sim.run_answer(run),
        Some(&Ok(failed("unknown", "explicit run failed")))
    );
    assert_eq!(sim.modes(S), [Mode::Wake, Mode::Run, Mode::Wake]);
    assert!(
        sim.reported(S).is_empty(),
        "a forced drain's failure is not advisory"
    );
}

/// Closing the scope interrupts the run caller (shutdown) and releases the idle waiter.
#[test]
fn settles_active_callers_when_its_owning_scope_closes() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    let idle = sim.await_idle(S);
    sim.close_all();
    assert!(sim.cleaning_up(S));
    assert_eq!(sim.run_answer(run), None);
    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(run), Some(&Ok(shutdown())));
    assert_eq!(sim.idle_answer(idle), Some(&None), "await_idle succeeds");
    assert_eq!(sim.settled(S), [shutdown()]);
    assert!(sim.active().is_empty());
}

/// After the scope closed a wake does nothing, await_idle returns and a run is interrupted.
#[test]
fn does_not_start_work_after_its_owning_scope_closes() {
    let mut sim = Sim::new();
    sim.close_all();
    sim.wake(S, None);
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None));
    let run = sim.run(S);
    assert_eq!(sim.run_answer(run), Some(&Ok(shutdown())));
    assert_eq!(sim.runs(S), 0);
    assert!(sim.active().is_empty());
}

/// A joined run caller that goes away (the shell drops its answer) does not cancel the shared
/// drain.
#[test]
fn does_not_cancel_the_owner_when_one_joined_waiter_is_interrupted() {
    let mut sim = Sim::new();
    let first = sim.run(S);
    let _abandoned = sim.run(S);
    // The coordinator has no "leave" operation: the shell just ignores that answer.
    assert_eq!(sim.cancels(S), 0);
    assert!(sim.draining(S));
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.runs(S), 1);
}

/// The same joiner independence, checked on what settles: one drain, one success.
#[test]
fn does_not_cancel_execution_when_a_joined_waiter_is_interrupted() {
    let mut sim = Sim::new();
    let first = sim.run(S);
    let _abandoned = sim.run(S);
    assert_eq!(sim.cancels(S), 0);
    sim.finish(S, Exit::Success);
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
}

/// Different keys drain at the same time.
#[test]
fn runs_different_keys_concurrently() {
    let mut sim = Sim::new();
    let first = sim.run("first");
    let second = sim.run("second");
    assert!(
        sim.draining("first") && sim.draining("second"),
        "both started"
    );
    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.run_answer(second), Some(&succeeded()));
}

/// A failing advisory drain is reported exactly once, with its failure.
#[test]
fn reports_an_advisory_drain_failure_exactly_once() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.finish(S, fail("wake failed"));
    assert_eq!(sim.reported(S), [failed("unknown", "wake failed")]);
    assert!(sim.active().is_empty());
}

/// Reporting an advisory failure does not wedge the coordinator: a second wake still runs,
/// fails, is reported and settles.
#[test]
fn contains_defects_thrown_while_constructing_an_advisory_failure_report() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.finish(S, fail("wake failed"));
    let idle = sim.await_idle(S);
    assert_eq!(sim.idle_answer(idle), Some(&None), "already idle");
    assert_eq!(sim.reported(S).len(), 1);

    sim.wake(S, None);
    let idle = sim.await_idle(S);
    sim.finish(S, fail("wake failed"));
    assert_eq!(
        sim.idle_answer(idle),
        Some(&Some(failed("unknown", "wake failed")))
    );
    assert_eq!(sim.reported(S).len(), 2);
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.settled(S).len(), 2);
}

/// An advisory drain that ends interrupted without anyone asking is reported, once.
#[test]
fn reports_an_independently_interrupted_advisory_drain() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.finish(S, Exit::Interrupted);
    assert_eq!(sim.reported(S), [shutdown()]);
    assert_eq!(sim.settled(S), [shutdown()]);
}

/// A deliberate interrupt of an advisory drain is not reported as a failure.
#[test]
fn does_not_report_deliberate_interruption_as_an_advisory_failure() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.interrupt(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.settled(S), [user()]);
    assert!(sim.reported(S).is_empty());
}

/// 20,000 drains that wake themselves and complete at once run iteratively in one execution.
#[test]
fn trampolines_many_synchronous_self_waking_drains() {
    const LIMIT: usize = 20_000;
    let mut sim = Sim::new();
    let mut runs = 0;
    sim.wake(S, None);
    let idle = sim.await_idle(S);
    sim.run_drains(|sim, drain| {
        runs += 1;
        if runs < LIMIT {
            sim.wake(&drain.key, None);
        }
        Exit::Success
    });
    assert_eq!(sim.idle_answer(idle), Some(&None));
    assert_eq!(runs, LIMIT);
    assert_eq!(sim.runs(S), LIMIT);
    assert_eq!(sim.starts(S), 1);
    assert!(!sim.has_pending_work());
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
}

// ---- Executions: start and settle hooks, ownership and the `active` snapshot --------------------

/// The `active` snapshot follows executions: [], [first], [first, second], [second], [].
#[test]
fn snapshots_only_active_executions() {
    let mut sim = Sim::new();
    assert!(sim.active().is_empty());
    let first = sim.run("first");
    assert_eq!(sim.active(), ["first"]);
    let second = sim.run("second");
    assert_eq!(sim.active(), ["first", "second"]);

    sim.finish("first", Exit::Success);
    assert_eq!(sim.run_answer(first), Some(&succeeded()));
    assert_eq!(sim.active(), ["second"]);
    sim.finish("second", Exit::Success);
    assert_eq!(sim.run_answer(second), Some(&succeeded()));
    assert!(sim.active().is_empty());
}

/// A failing and a dying drain both settle, answer their run callers with the failure and leave
/// `active`.
#[test]
fn cleans_active_executions_after_failure_and_defect() {
    let mut sim = Sim::new();
    let failure = sim.run("failure");
    sim.finish("failure", fail("failed"));
    assert_eq!(
        sim.run_answer(failure),
        Some(&Ok(failed("unknown", "failed")))
    );
    assert!(sim.active().is_empty());

    let died = sim.run("defect");
    sim.finish("defect", defect("defect"));
    assert_eq!(sim.run_answer(died), Some(&Ok(failed("panic", "defect"))));
    assert!(sim.active().is_empty());
    assert_eq!(sim.settles.len(), 2);
}

/// A settle hook defect reaches the run caller, and ownership is released all the same.
#[test]
fn preserves_settlement_hook_defects_while_releasing_ownership() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    let run = sim.run(S);
    sim.finish(S, Exit::Success);
    assert_eq!(sim.active(), [S]);
    sim.release_settle(S, Err("terminal publication failed".into()));
    assert_eq!(
        sim.run_answer(run),
        Some(&Err("terminal publication failed".to_owned()))
    );
    assert!(sim.active().is_empty());
    assert!(sim.coordinator(S).is_quiescent());
}

/// Closing the scope cancels the running execution, which settles as shutdown and leaves
/// `active`.
#[test]
fn cleans_active_executions_when_its_scope_closes() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    assert_eq!(sim.active(), [S]);
    sim.close_all();
    sim.finish_cleanup(S);
    assert!(sim.active().is_empty());
    assert_eq!(sim.settled(S), [shutdown()]);
    assert!(sim.reported(S).is_empty(), "shutdown is deliberate");
}

/// An interrupt during the settle hook attaches no reason: both turns settle as plain
/// successes.
#[test]
fn does_not_attach_a_late_interrupt_reason_after_terminal_settlement_starts() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    let run = sim.run(S);
    sim.finish(S, Exit::Success);
    assert!(sim.held_settle(S));
    let interrupt = sim.interrupt(S, None);
    assert_eq!(sim.interrupt_answer(interrupt), Some(false));
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.run_answer(run), Some(&succeeded()));

    let again = sim.run(S);
    sim.finish(S, Exit::Success);
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.run_answer(again), Some(&succeeded()));
    assert_eq!(sim.settled(S), [Terminal::Succeeded, Terminal::Succeeded]);
}

/// A user interrupt cancels the execution and its pending wake: the run is interrupted,
/// `active` empties, one drain ran and the reason is `user`.
#[test]
fn interrupts_active_execution_and_clears_its_pending_wake() {
    let mut sim = Sim::new();
    let resumed = sim.run(S);
    sim.wake(S, None);
    sim.interrupt(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.run_answer(resumed), Some(&Ok(user())));
    assert!(sim.active().is_empty());
    assert_eq!(sim.runs(S), 1);
    assert_eq!(sim.settled(S), [user()]);
}

/// A wake during cleanup starts a successor execution with its own start hook.
#[test]
fn runs_a_wake_registered_during_interruption_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, None);
    sim.wake(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert!(sim.draining(S));
    sim.complete_all_immediate();
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.starts(S), 2);
}

/// A resume during cleanup starts a forced successor: forces false, true.
#[test]
fn starts_a_resume_registered_during_interruption_cleanup() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    let interrupt = sim.interrupt(S, None);
    let resumed = sim.run(S);
    sim.finish_cleanup(S);
    sim.complete_all_immediate();
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.run_answer(resumed), Some(&succeeded()));
    assert_eq!(sim.modes(S), [Mode::Wake, Mode::Run]);
}

/// Coalesced drains share one start hook and one settle hook, which records success.
#[test]
fn settles_once_per_execution_across_coalesced_drains() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.wake(S, None);
    sim.complete_all_immediate();
    assert_eq!(sim.runs(S), 2);
    assert_eq!(sim.starts(S), 1);
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
}

/// An interrupted execution commits its (interrupted) settle hook before idle waiters resolve.
#[test]
fn settles_interrupted_executions_before_waiters_resolve() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    sim.wake(S, None);
    sim.interrupt(S, None);
    let idle = sim.await_idle(S);
    sim.finish_cleanup(S);
    assert_eq!(sim.settled(S), [user()]);
    assert_eq!(sim.idle_answer(idle), None, "waits for the settle hook");
    sim.release_settle(S, Ok(()));
    assert!(sim.idle_answer(idle).is_some());
    assert_eq!(sim.settled(S).len(), 1);
    assert!(sim.active().is_empty());
}

/// 20,000 self-waking synchronous drains complete without growing the stack.
#[test]
fn trampolines_synchronous_self_waking_execution() {
    const LIMIT: usize = 20_000;
    let mut sim = Sim::new();
    let mut runs = 0;
    sim.wake(S, None);
    sim.run_drains(|sim, drain| {
        runs += 1;
        if runs < LIMIT {
            sim.wake(&drain.key, None);
        }
        Exit::Success
    });
    assert_eq!(runs, LIMIT);
    assert_eq!(sim.runs(S), LIMIT);
    assert!(sim.active().is_empty());
}

// ---- regressions found by the property test ---------------------------------------------------

/// A run that joins a wake-started execution still in its start hook makes the first drain
/// forced, but keeps the wake's fence: an interrupt older than the wake does not cancel it.
#[test]
fn a_run_joining_a_starting_wake_keeps_its_interrupt_fence() {
    let mut sim = Sim::new();
    sim.hold_starts = true;
    sim.wake(S, Some(7));
    let run = sim.run(S);
    let interrupt = sim.interrupt(S, Some(5));
    assert_eq!(sim.interrupt_answer(interrupt), Some(false));
    sim.release_start(S, Ok(()));
    assert_eq!(sim.modes(S), [Mode::Run]);
    assert_eq!(sim.wake_seqs(S), [Some(7)]);

    sim.complete_all_immediate();
    assert_eq!(sim.run_answer(run), Some(&succeeded()));
    assert_eq!(sim.runs(S), 1);
    assert!(!sim.has_pending_work());

    // A newer interrupt still stops such a drain.
    sim.wake(S, Some(9));
    let run = sim.run(S);
    let interrupt = sim.interrupt(S, Some(10));
    sim.release_start(S, Ok(()));
    assert_eq!(sim.run_answer(run), Some(&Ok(user())));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.runs(S), 1);
}

/// An interrupt covers an unsequenced wake but not a newer sequenced wake coalesced with it:
/// the newer wake survives the interrupt and runs after cleanup.
#[test]
fn an_interrupt_keeps_a_newer_wake_coalesced_with_an_unsequenced_one() {
    let mut sim = Sim::new();
    sim.wake(S, None);
    sim.wake(S, None);
    sim.wake(S, Some(4));
    let interrupt = sim.interrupt(S, Some(3));
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert!(sim.draining(S), "the newer wake runs after cleanup");
    sim.complete_all_immediate();
    assert_eq!(sim.wake_seqs(S), [None, Some(4)]);

    // Without an interrupt (and so without a fence), the coalesced drain stays unsequenced: it
    // serves the unsequenced wake too.
    sim.wake("other", Some(5));
    sim.wake("other", None);
    sim.wake("other", Some(6));
    sim.complete_all_immediate();
    assert_eq!(sim.wake_seqs("other"), [Some(5), None]);
}

/// The proptest regression seed, by name: a start hook fails, a sequenced and an unsequenced
/// wake coalesce during settlement and start a successor serving both; an interrupt older than
/// the sequenced wake stops that successor but keeps the newer work, which then runs.
#[test]
fn an_older_interrupt_keeps_newer_work_a_mixed_successor_served() {
    let mut sim = Sim::new();
    sim.hold_starts = true;
    sim.hold_settles = true;
    sim.wake(S, None);
    sim.release_start(S, Err(fail("claim failed")));
    sim.wake(S, Some(2));
    sim.wake(S, None);
    sim.release_settle(S, Err("defect".into()));
    let interrupt = sim.interrupt(S, Some(1));
    sim.hold_starts = false;
    sim.hold_settles = false;
    sim.release_start(S, Ok(()));
    sim.complete_all_immediate();
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(
        sim.wake_seqs(S),
        [Some(2)],
        "the newer wake ran after the interrupt"
    );
}
