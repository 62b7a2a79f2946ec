//! Healing: a turn whose drain failed because the store was unavailable is resumed in place
//! instead of settling as failed; wakes wait for it and interrupts stop it.

use super::*;

/// The failed drain is not recorded: its caller is answered with the store's error at once, and
/// the turn drains again, forced, then serves the wake that rang meanwhile.
#[test]
fn a_healed_turn_drains_again_and_then_serves_the_wakes_that_waited() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    let run = sim.run(S);
    sim.finish(S, fail("disk full"));
    sim.heal(S);
    assert_eq!(
        sim.run_answer(run),
        Some(&Err("store unavailable".to_owned()))
    );
    sim.wake(S, Some(5));
    assert_eq!(sim.runs(S), 1, "nothing drains while it heals");
    sim.resume_healed(S);
    assert!(sim.draining(S));
    assert_eq!(sim.modes(S), [Mode::Run, Mode::Run]);
    sim.finish(S, Exit::Success);
    assert!(sim.draining(S), "the wake's follow-up drain");
    assert_eq!(sim.wake_seqs(S).last(), Some(&Some(5)));
    sim.finish(S, Exit::Success);
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.settled(S).last(), Some(&Terminal::Succeeded));
    assert!(sim.active().is_empty());
    sim.assert_all_answered();
}

/// An interrupt while the turn heals joins as a stop: the resumed turn does not drain, it
/// settles as interrupted by the user, and the interrupter is answered once that is recorded.
#[test]
fn an_interrupt_while_healing_stops_the_resumed_turn() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    sim.wake(S, Some(1));
    sim.finish(S, fail("read-only"));
    sim.heal(S);
    let interrupt = sim.interrupt(S, Some(2));
    assert_eq!(sim.interrupt_answer(interrupt), None, "waits for the heal");
    sim.resume_healed(S);
    assert!(!sim.draining(S));
    assert_eq!(sim.settled(S).last(), Some(&user()));
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert_eq!(sim.runs(S), 1);
    assert!(sim.active().is_empty());
}

/// A heal that ends the turn otherwise (aborted over budget, or nothing left to resume)
/// settles it: the interrupter waiting for it is answered.
#[test]
fn a_heal_that_ends_the_turn_settles_it() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    sim.wake(S, Some(1));
    sim.finish(S, fail("I/O"));
    sim.heal(S);
    let interrupt = sim.interrupt(S, Some(2));
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.interrupt_answer(interrupt), Some(true));
    assert!(sim.active().is_empty());
}

/// The scope closed while the turn healed: the resumed turn does not drain; it settles as
/// interrupted by the shutdown.
#[test]
fn a_close_while_healing_settles_as_shutdown() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    sim.wake(S, Some(1));
    sim.finish(S, fail("connection lost"));
    sim.heal(S);
    sim.close_all();
    sim.resume_healed(S);
    assert!(!sim.draining(S));
    assert_eq!(sim.settled(S).last(), Some(&shutdown()));
    sim.release_settle(S, Ok(()));
    assert!(sim.active().is_empty());
}

/// A terminal the store refused is retried by the shell: its `run` callers are answered with
/// the store's error at once, and once the terminal lands nobody is answered twice.
#[test]
fn a_refused_terminal_answers_its_callers_at_once() {
    let mut sim = Sim::new();
    sim.hold_settles = true;
    let run = sim.run(S);
    sim.finish(S, Exit::Success);
    let effects = sim.coord(S).fail_runs("disk full".to_owned());
    sim.apply(S, effects);
    assert_eq!(sim.run_answer(run), Some(&Err("disk full".to_owned())));
    assert!(sim.active().contains(&S), "the turn waits for its terminal");
    sim.release_settle(S, Ok(()));
    assert_eq!(sim.settled(S), [Terminal::Succeeded]);
    assert!(sim.active().is_empty());
}
