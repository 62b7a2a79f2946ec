//! Regressions found by the property test.

use super::*;

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
