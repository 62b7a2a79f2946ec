//! Turns past their deadline: `interrupted{timeout}`, with the wakes they had not served kept.

use super::*;

fn timeout() -> Terminal {
    interrupted(InterruptReason::Timeout)
}

/// A timed-out drain is cancelled and its turn settles as `interrupted{timeout}`; its caller
/// is told so, and nothing is reported as an advisory failure.
#[test]
fn a_timed_out_drain_settles_as_interrupted_timeout() {
    let mut sim = Sim::new();
    let run = sim.run(S);
    sim.time_out(S);
    assert_eq!(sim.cancels(S), 1);
    assert!(sim.cleaning_up(S));
    sim.finish_cleanup(S);
    assert_eq!(sim.settled(S), [timeout()]);
    assert_eq!(sim.run_answer(run), Some(&Ok(timeout())));
    assert!(sim.reported(S).is_empty());
    assert!(sim.active().is_empty());
    assert_eq!(
        sim.coordinator(S).boundary(),
        None,
        "a timeout fences nothing"
    );
    sim.assert_all_answered();
}

/// Wakes rung while the timed-out turn ran (a prompt queued behind it) start a successor.
#[test]
fn a_wake_queued_behind_a_timed_out_turn_runs_next() {
    let mut sim = Sim::new();
    sim.wake(S, Some(1));
    sim.wake(S, Some(2));
    sim.time_out(S);
    sim.wake(S, None);
    sim.finish_cleanup(S);
    assert_eq!(sim.settled(S), [timeout()]);
    assert!(sim.draining(S), "the queued wakes run after the timeout");
    assert_eq!(sim.modes(S), [Mode::Wake, Mode::Wake]);
    assert_eq!(sim.wake_seqs(S), [Some(1), None]);
    sim.complete_all_immediate();
    assert_eq!(sim.settled(S), [timeout(), Terminal::Succeeded]);
}

/// A timeout does nothing to an idle session, a turn still claiming, or a turn already
/// stopping: a user interrupt under way keeps its reason.
#[test]
fn a_timeout_leaves_idle_starting_and_stopping_turns_alone() {
    let mut sim = Sim::new();
    sim.time_out(S);
    assert!(sim.active().is_empty());

    sim.hold_starts = true;
    sim.wake(S, None);
    sim.time_out(S);
    sim.release_start(S, Ok(()));
    assert!(sim.draining(S), "a turn still claiming is not timed out");

    let interrupt = sim.interrupt(S, None);
    sim.time_out(S);
    assert_eq!(sim.cancels(S), 1);
    sim.finish_cleanup(S);
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.settled(S), [user()]);
}
