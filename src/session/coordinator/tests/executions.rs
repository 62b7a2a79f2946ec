//! Executions: start and settle hooks, ownership and the `active` snapshot.

use super::*;

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
