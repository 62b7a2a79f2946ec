//! Property test: random operation sequences against one coordinator, driven through the
//! [`Sim`] harness of the unit tests and checked against a small model of the interrupt fence.
//!
//! The harness itself asserts, on every effect, that a key never has two executions or two
//! drains at once, that drains only start after the start hook, and that no caller is answered
//! twice. On top of that the model checks:
//! - the coordinator's fence is the highest interrupt seq seen;
//! - no stale wake drives a drain: an advisory drain's wake seq is newer than the fence when it
//!   starts (and an unsequenced advisory drain only starts while there is no fence);
//! - every wake that was fresh when made is served by a drain started after it (a forced or
//!   unsequenced one, or one with a wake seq at least as new), unless a later interrupt covers it
//!   or a later start hook failed (that turn settles failed without draining); a timeout
//!   covers no wake;
//! - after draining everything (at random points and at the end), every caller was answered and
//!   the coordinator is quiescent; the wake check above runs at those points.

use proptest::prelude::*;

use super::tests::Sim;
use super::{Mode, Seq};
use crate::outcome::{Exit, RunError};

const S: &str = "session";

#[derive(Debug, Clone)]
enum Op {
    /// A wake whose seq lags the sequence counter by `lag` (messages race), or unsequenced.
    Wake {
        sequenced: bool,
        lag: u64,
    },
    Run,
    /// A user interrupt whose seq lags the counter by `lag`, or unsequenced.
    Interrupt {
        sequenced: bool,
        lag: u64,
    },
    AwaitIdle,
    /// The running turn passes its deadline.
    TimeOut,
    FinishDrain {
        success: bool,
    },
    FinishCleanup,
    ReleaseStart {
        ok: bool,
    },
    ReleaseSettle {
        ok: bool,
    },
    /// Let everything pending complete, then check the liveness properties at that point.
    Quiesce,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::bool::weighted(0.75), 0..6u64)
            .prop_map(|(sequenced, lag)| Op::Wake { sequenced, lag }),
        2 => Just(Op::Run),
        3 => (prop::bool::weighted(0.5), 0..6u64)
            .prop_map(|(sequenced, lag)| Op::Interrupt { sequenced, lag }),
        1 => Just(Op::AwaitIdle),
        1 => Just(Op::TimeOut),
        4 => prop::bool::weighted(0.8).prop_map(|success| Op::FinishDrain { success }),
        3 => Just(Op::FinishCleanup),
        3 => prop::bool::weighted(0.9).prop_map(|ok| Op::ReleaseStart { ok }),
        3 => prop::bool::weighted(0.9).prop_map(|ok| Op::ReleaseSettle { ok }),
        2 => Just(Op::Quiesce),
    ]
}

#[derive(Debug)]
struct WakeRec {
    /// The harness clock just before the wake.
    at: u64,
    seq: Option<Seq>,
    /// Newer than the fence when made.
    fresh: bool,
}

#[derive(Debug)]
struct InterruptRec {
    at: u64,
    seq: Option<Seq>,
}

#[derive(Debug, Default)]
struct Model {
    counter: Seq,
    boundary: Option<Seq>,
    wakes: Vec<WakeRec>,
    interrupts: Vec<InterruptRec>,
    /// Harness clock of each failed start hook: that execution settles failed without draining.
    failed_starts: Vec<u64>,
    /// Drains already checked for staleness.
    checked: usize,
}

impl Model {
    fn next_seq(&mut self, sequenced: bool, lag: u64) -> Option<Seq> {
        self.counter += 1;
        sequenced.then(|| self.counter.saturating_sub(lag))
    }

    fn is_fresh(&self, seq: Option<Seq>) -> bool {
        match (self.boundary, seq) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(b), Some(s)) => s > b,
        }
    }
}

/// Whether a drain serves pending work of a wake with `seq`.
fn covers(mode: Mode, wake_seq: Option<Seq>, seq: Option<Seq>) -> bool {
    match (mode, wake_seq, seq) {
        (Mode::Run, _, _) | (Mode::Wake, None, _) => true,
        (Mode::Wake, Some(w), Some(s)) => w >= s,
        (Mode::Wake, Some(_), None) => false,
    }
}

fn step(sim: &mut Sim, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::Wake { sequenced, lag } => {
            let seq = model.next_seq(sequenced, lag);
            model.wakes.push(WakeRec {
                at: sim.clock,
                seq,
                fresh: model.is_fresh(seq),
            });
            sim.wake(S, seq);
        }
        Op::Run => {
            sim.run(S);
        }
        Op::Interrupt { sequenced, lag } => {
            let seq = model.next_seq(sequenced, lag);
            model.interrupts.push(InterruptRec { at: sim.clock, seq });
            if let Some(s) = seq {
                model.boundary = Some(model.boundary.map_or(s, |b| b.max(s)));
            }
            sim.interrupt(S, seq);
        }
        Op::AwaitIdle => {
            sim.await_idle(S);
        }
        Op::TimeOut => sim.time_out(S),
        Op::FinishDrain { success } => {
            if sim.draining(S) {
                let exit = if success {
                    Exit::Success
                } else {
                    Exit::Failure(RunError::Other("drain failed".into()))
                };
                sim.finish(S, exit);
            }
        }
        Op::FinishCleanup => {
            if sim.cleaning_up(S) {
                sim.finish_cleanup(S);
            }
        }
        Op::ReleaseStart { ok } => {
            if sim.held_start(S) {
                let result = if ok {
                    Ok(())
                } else {
                    model.failed_starts.push(sim.clock);
                    Err(Exit::Failure(RunError::Other("claim failed".into())))
                };
                sim.release_start(S, result);
            }
        }
        Op::ReleaseSettle { ok } => {
            if sim.held_settle(S) {
                let result = if ok { Ok(()) } else { Err("defect".to_owned()) };
                sim.release_settle(S, result);
            }
        }
        Op::Quiesce => check_quiescent(sim, model)?,
    }
    Ok(())
}

/// Checks the fence and the drains started since the last check.
fn check_step(sim: &mut Sim, model: &mut Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(sim.coordinator(S).boundary(), model.boundary);
    for drain in &sim.drains[model.checked..] {
        if drain.mode == Mode::Wake {
            match (drain.wake_seq, drain.boundary_at_start) {
                (Some(w), Some(b)) => prop_assert!(w > b, "stale wake drove {:?}", drain),
                (None, Some(_)) => {
                    prop_assert!(false, "unsequenced wake past a fence: {:?}", drain)
                }
                (_, None) => {}
            }
        }
    }
    model.checked = sim.drains.len();
    Ok(())
}

/// Lets every held hook and running drain complete successfully until nothing is pending.
fn quiesce(sim: &mut Sim) {
    loop {
        if sim.held_start(S) {
            sim.release_start(S, Ok(()));
        } else if sim.cleaning_up(S) {
            sim.finish_cleanup(S);
        } else if sim.draining(S) {
            sim.finish(S, Exit::Success);
        } else if sim.held_settle(S) {
            sim.release_settle(S, Ok(()));
        } else {
            break;
        }
    }
}

/// Drains everything, then checks: nothing pending, every caller answered, every fresh wake
/// served (checking this mid-run too keeps later drains from masking a lost wake).
fn check_quiescent(sim: &mut Sim, model: &mut Model) -> Result<(), TestCaseError> {
    let idle = sim.await_idle(S);
    quiesce(sim);
    check_step(sim, model)?;
    prop_assert!(!sim.has_pending_work());
    prop_assert!(sim.coordinator(S).is_quiescent());
    prop_assert!(sim.idle_answer(idle).is_some());
    sim.assert_all_answered();
    check_wakes_served(sim, model)
}

/// Every fresh wake is served by a drain started after it, or covered by a later interrupt.
fn check_wakes_served(sim: &Sim, model: &Model) -> Result<(), TestCaseError> {
    for wake in model.wakes.iter().filter(|w| w.fresh) {
        let served = sim
            .drains
            .iter()
            .any(|d| d.started_at > wake.at && covers(d.mode, d.wake_seq, wake.seq));
        // A failed start hook fails the turn before it drains: the wake that began it is lost.
        let failed = model.failed_starts.iter().any(|&at| at > wake.at);
        let excused = failed
            || model.interrupts.iter().any(|i| {
                i.at > wake.at
                    && match (i.seq, wake.seq) {
                        (None, _) | (_, None) => true,
                        (Some(i_seq), Some(w_seq)) => i_seq >= w_seq,
                    }
            });
        prop_assert!(
            served || excused,
            "fresh wake {:?} was never served; drains {:?}; interrupts {:?}",
            wake,
            sim.drains,
            model.interrupts
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Random interleavings of wakes, runs, interrupts, idle waits and hook/drain completions
    /// keep the coordinator's invariants, and everything settles once work stops arriving.
    #[test]
    fn random_operation_sequences_keep_the_coordinator_invariants(
        ops in prop::collection::vec(op(), 1..48)
    ) {
        let mut sim = Sim::new();
        sim.hold_starts = true;
        sim.hold_settles = true;
        let mut model = Model::default();
        for op in &ops {
            step(&mut sim, &mut model, op)?;
            check_step(&mut sim, &mut model)?;
        }
        check_quiescent(&mut sim, &mut model)?;
    }
}
