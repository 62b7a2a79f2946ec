//! Coalesced wakes and successor drains, runs joining a wake, `await_idle` over a chain, the
//! owning scope's close, advisory failure reports and keys running side by side.

use super::*;

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
