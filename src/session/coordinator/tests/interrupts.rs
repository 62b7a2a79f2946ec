//! Joiners, wakes and interrupts: their fences, stop barriers and the cleanup that ends them.

use super::*;

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
