//! Supervision of session actors: a panicking drain is contained to its own session (recorded as
//! `failed{panic}`, claim released, actor replaced, arbiter and other sessions unaffected); an
//! idle actor is passivated and a later wake starts a fresh one that reloads the session,
//! durable interrupt fence included, from the store; a graceful shutdown cancels drains but keeps
//! every claim for the next boot; many sessions drain at once across arbiters with contiguous
//! event logs; and any number of wakes during a drain coalesce into exactly one follow-up drain.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use actix_rt::task::JoinHandle;
use durable_sessions::kind;
use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{InterruptReason, Result, Runtime, SessionId, Terminal};
use serde_json::json;

use common::{create, wait_for, Harness, WAIT};

/// Starts `resume(id)` in the background; the handle yields how the turn ended.
fn spawn_resume(runtime: &Runtime, id: &SessionId) -> JoinHandle<Result<Terminal>> {
    let (execution, id) = (runtime.execution(), id.clone());
    actix_rt::spawn(async move { execution.resume(&id).await })
}

/// Asserts that `terminal` is `Failed` with error type `panic`.
fn assert_panicked(terminal: &Terminal) {
    match terminal {
        Terminal::Failed { error } => assert_eq!(error.kind, "panic", "{terminal:?}"),
        other => panic!("expected Failed{{panic}}, got {other:?}"),
    }
}

/// The error types of the session's `session.execution.failed` events, in order.
fn failure_types(db: &Path, id: &SessionId) -> Vec<serde_json::Value> {
    testing::events_of_kind(db, id, kind::EXECUTION_FAILED)
        .unwrap()
        .iter()
        .map(|e| e.data["error"]["type"].clone())
        .collect()
}

/// A drain that records the thread it runs on, then panics: inside its future, or (`at_call`)
/// in `Runner::drain` itself, before any future exists.
fn panic_on_thread(threads: &Arc<Mutex<HashSet<ThreadId>>>, at_call: bool) -> Script {
    let threads = threads.clone();
    Script::custom(move |_turn| {
        threads.lock().unwrap().insert(std::thread::current().id());
        assert!(!at_call, "scripted panic in drain()");
        async move { panic!("scripted panic in the drain future") }
    })
}

/// A drain that records the thread it runs on, then completes.
fn complete_on_thread(threads: &Arc<Mutex<HashSet<ThreadId>>>) -> Script {
    let threads = threads.clone();
    Script::custom(move |_turn| {
        let threads = threads.clone();
        async move {
            threads.lock().unwrap().insert(std::thread::current().id());
            Ok(())
        }
    })
}

/// A drain that panics while other sessions drain on the same runtime fails only its own turn:
/// `failed{panic}` recorded with the release, its caller answered, the other turns complete, and
/// the session is served again by a fresh actor.
#[actix_rt::test]
async fn a_panicking_drain_fails_only_its_own_turn_and_its_actor_is_replaced() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let gate = Gate::new();
    let mut others = Vec::new();
    for i in 0..4 {
        let id = create(&runtime, &format!("steady{i}"), None).await;
        runner.push(&id, Script::Gate(gate.clone()));
        others.push(id);
    }
    let crashy = create(&runtime, "crashy", None).await;
    runner.push(&crashy, Script::Panic("boom in a drain".into()));

    let steady: Vec<_> = others.iter().map(|id| spawn_resume(&runtime, id)).collect();
    runner.wait_for_drains(others.len(), WAIT).await;
    let outcome = runtime.execution().resume(&crashy).await.unwrap();
    assert_panicked(&outcome);
    let Terminal::Failed { error } = &outcome else {
        unreachable!()
    };
    assert_eq!(error.message, "boom in a drain");

    // The failure is durable and released the claim; the other turns are untouched.
    let failed = testing::events_of_kind(runtime.path(), &crashy, kind::EXECUTION_FAILED).unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0].data,
        json!({"error": {"type": "panic", "message": "boom in a drain"}})
    );
    assert!(!testing::is_claimed(runtime.path(), &crashy).unwrap());
    wait_for("the panicked actor to be replaced", || {
        runtime.stats().registry.replaced >= 1
    })
    .await;
    let started = runtime.stats().registry.started;
    let active = runtime.execution().active();
    assert_eq!(active, others.iter().cloned().collect());
    for id in &others {
        assert!(testing::is_claimed(runtime.path(), id).unwrap());
    }

    gate.release();
    for handle in steady {
        assert_eq!(handle.await.unwrap().unwrap(), Terminal::Succeeded);
    }
    for id in &others {
        assert!(!testing::is_claimed(runtime.path(), id).unwrap());
        assert!(failure_types(runtime.path(), id).is_empty());
    }

    // The session works again, on a fresh actor.
    assert_eq!(
        runtime.execution().resume(&crashy).await.unwrap(),
        Terminal::Succeeded
    );
    assert_eq!(runtime.stats().registry.started, started + 1);
    assert_eq!(runner.drains_of(&crashy).len(), 2);
    assert!(!testing::is_claimed(runtime.path(), &crashy).unwrap());
    let succeeded =
        testing::events_of_kind(runtime.path(), &crashy, kind::EXECUTION_SUCCEEDED).unwrap();
    assert_eq!(succeeded.len(), 1);
    runtime.stop().await;
}

/// Panics in six sessions at once, on both arbiters, in drain futures and in `Runner::drain`
/// itself, take neither arbiter down: afterwards the same arbiter threads run new sessions and
/// the panicked ones again.
#[actix_rt::test]
async fn panics_on_every_arbiter_at_once_leave_the_runtime_serving() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let panicked_on = Arc::new(Mutex::new(HashSet::new()));
    let mut crashy = Vec::new();
    for i in 0..6 {
        let id = create(&runtime, &format!("crashy{i}"), None).await;
        runner.push(&id, panic_on_thread(&panicked_on, i % 2 == 0));
        crashy.push(id);
    }

    let turns: Vec<_> = crashy.iter().map(|id| spawn_resume(&runtime, id)).collect();
    for turn in turns {
        assert_panicked(&turn.await.unwrap().unwrap());
    }
    let panicked_on = panicked_on.lock().unwrap().clone();
    assert_eq!(panicked_on.len(), 2, "the panics ran on both arbiters");
    for id in &crashy {
        assert_eq!(failure_types(runtime.path(), id), vec![json!("panic")]);
        assert!(!testing::is_claimed(runtime.path(), id).unwrap());
    }
    wait_for("every panicked actor to be replaced", || {
        runtime.stats().registry.replaced >= 6
    })
    .await;
    assert!(runtime.execution().active().is_empty());

    // Fresh sessions and the panicked ones run again, on the same two arbiter threads.
    let served_on = Arc::new(Mutex::new(HashSet::new()));
    let mut all = crashy.clone();
    for i in 0..4 {
        all.push(create(&runtime, &format!("fresh{i}"), None).await);
    }
    for id in &all {
        runner.push(id, complete_on_thread(&served_on));
    }
    let turns: Vec<_> = all.iter().map(|id| spawn_resume(&runtime, id)).collect();
    for turn in turns {
        assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);
    }
    assert_eq!(*served_on.lock().unwrap(), panicked_on);
    for id in &all {
        assert!(!testing::is_claimed(runtime.path(), id).unwrap());
    }
    runtime.stop().await;
}

/// An actor idle for `idle_timeout` is stopped, never while its turn runs; the next wake starts
/// a fresh actor that reloads the session from the store and drains it with a consistent log.
#[actix_rt::test]
async fn an_idle_actor_is_passivated_and_the_next_wake_starts_a_fresh_one() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.idle_timeout(Duration::from_millis(50)))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    let gate = Gate::new();
    runner.push(&s, Script::Gate(gate.clone()));

    let turn = spawn_resume(&runtime, &s);
    runner.wait_for_drains(1, WAIT).await;
    assert_eq!(runtime.stats().registry.live, 1);
    // Not a synchronisation: give the passivation timer several idle periods to (wrongly) stop
    // an actor whose turn is running.
    actix_rt::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(runtime.stats().registry.live, 1);
    assert_eq!(runtime.stats().registry.passivated, 0);
    assert!(runtime.execution().active().contains(&s));
    gate.release();
    assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);

    wait_for("the idle actor to be passivated", || {
        runtime.stats().registry.live == 0
    })
    .await;
    let stats = runtime.stats().registry;
    assert_eq!((stats.passivated, stats.replaced), (1, 0));
    let started = stats.started;

    // A wake reaches a new actor, which finds the stored session and drains it.
    runtime.execution().wake(&s, None).await.unwrap();
    runner.wait_for_drains(2, WAIT).await;
    assert_eq!(runtime.stats().registry.started, started + 1);
    runtime.execution().await_idle(&s).await.unwrap();
    let drains = runner.drains_of(&s);
    assert_eq!(drains.len(), 2);
    assert!(drains[0].forced && !drains[1].forced);
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 0);
    let events = testing::events(runtime.path(), &s).unwrap();
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            kind::CREATED,
            kind::EXECUTION_STARTED,
            kind::EXECUTION_SUCCEEDED,
            kind::EXECUTION_STARTED,
            kind::EXECUTION_SUCCEEDED,
        ]
    );
    let seqs: Vec<_> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..5).collect::<Vec<u64>>());

    // And it is passivated again once idle.
    wait_for("the second actor to be passivated", || {
        runtime.stats().registry.live == 0
    })
    .await;
    assert_eq!(runtime.stats().registry.passivated, 2);
    runtime.stop().await;
}

/// After a wave of passivation (here 100 idle actors stopped at once) the runtime calls the
/// `after_passivation` hook once the actors are gone, with how many it stopped; a few actors
/// passivating later do not call it again.
#[actix_rt::test]
async fn a_wave_of_passivation_calls_the_after_passivation_hook() {
    let runner = ScriptedRunner::new();
    let calls: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let live_when_called: Arc<Mutex<Option<Runtime>>> = Arc::default();
    let runtime = Harness::with(|b| {
        b.idle_timeout(Duration::from_millis(50))
            .after_passivation({
                let calls = calls.clone();
                let runtime = live_when_called.clone();
                move |stopped| {
                    let live = runtime
                        .lock()
                        .unwrap()
                        .as_ref()
                        .map_or(usize::MAX, |r| r.stats().registry.live);
                    calls.lock().unwrap().push((stopped, live));
                }
            })
    })
    .start(&runner)
    .await;
    *live_when_called.lock().unwrap() = Some(runtime.clone());
    let mut ids = Vec::new();
    // The drains hold until all 100 actors are live (and the supervisor saw them), so they
    // go idle together, as one wave, however slowly the wakes arrive.
    let gate = Gate::new();
    for i in 0..100 {
        let id = create(&runtime, &format!("s{i}"), None).await;
        runner.set_default(&id, Script::Gate(gate.clone()));
        ids.push(id);
    }
    for id in &ids {
        runtime.execution().wake(id, None).await.unwrap();
    }
    runner.wait_for_drains(ids.len(), WAIT).await;
    assert_eq!(runtime.stats().registry.live, 100);
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    for id in &ids[..3] {
        runner.set_default(id, Script::Complete);
    }
    gate.release();
    wait_for("the hook after the wave", || {
        !calls.lock().unwrap().is_empty()
    })
    .await;
    let first = calls.lock().unwrap()[0];
    assert!(first.0 >= 64, "the wave stopped {} actors", first.0);
    assert_eq!(
        first.1,
        100 - first.0,
        "the hook ran after the actors stopped"
    );
    wait_for("every actor passivated", || {
        runtime.stats().registry.live == 0
    })
    .await;
    actix_rt::time::sleep(Duration::from_millis(150)).await;
    let calls_before = calls.lock().unwrap().len();

    // Three more sessions come and go: too few for another release.
    for id in &ids[..3] {
        runtime.execution().wake(id, None).await.unwrap();
    }
    runner.wait_for_drains(ids.len() + 3, WAIT).await;
    wait_for("the three to passivate", || {
        runtime.stats().registry.live == 0
    })
    .await;
    actix_rt::time::sleep(Duration::from_millis(150)).await;
    let calls_now = calls.lock().unwrap().clone();
    assert_eq!(
        calls_now.len(),
        calls_before,
        "hook called again for a handful: {calls_now:?}"
    );
    *live_when_called.lock().unwrap() = None;
    runtime.stop().await;
}

/// The interrupt fence survives passivation: a fresh actor reloads it from the stored
/// `session.interrupt.requested` event, drops a wake at or below it and runs one above it.
#[actix_rt::test]
async fn a_fresh_actor_after_passivation_reloads_the_durable_interrupt_fence() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.idle_timeout(Duration::from_millis(50)))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    // Nothing runs: the request is recorded (the fence) and nothing is interrupted.
    assert!(!runtime.sessions().interrupt(&s).await.unwrap());
    let requested = testing::events_of_kind(runtime.path(), &s, kind::INTERRUPT_REQUESTED).unwrap();
    assert_eq!(requested.len(), 1);
    let fence = requested[0].seq;

    wait_for("the idle actor to be passivated", || {
        runtime.stats().registry.live == 0
    })
    .await;
    let started = runtime.stats().registry.started;
    let execution = runtime.execution();
    // A wake handled by the fresh actor starts its turn synchronously (the session enters
    // `active()` before `wake` returns), so a dropped wake is visible at once.
    execution.wake(&s, Some(fence)).await.unwrap();
    assert_eq!(runtime.stats().registry.started, started + 1);
    assert!(!execution.active().contains(&s), "a stale wake is dropped");
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());

    execution.wake(&s, Some(fence + 1)).await.unwrap();
    runner.wait_for_drains(1, WAIT).await;
    execution.await_idle(&s).await.unwrap();
    let drains = runner.drains();
    assert_eq!(drains.len(), 1);
    assert_eq!(drains[0].wake_seq, Some(fence + 1));
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    runtime.stop().await;
}

/// Shutdown cancels three running drains as `interrupted{shutdown}`, answers their callers so,
/// and keeps every claim and attempt counter; the next boot's sweep resumes all three, once each.
#[actix_rt::test]
async fn shutdown_keeps_every_claim_and_the_next_boot_resumes_them() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = create(&runtime, &format!("s{i}"), None).await;
        runner.push(&id, Script::Never);
        ids.push(id);
    }
    let turns: Vec<_> = ids.iter().map(|id| spawn_resume(&runtime, id)).collect();
    runner.wait_for_drains(3, WAIT).await;
    let before: Vec<_> = ids
        .iter()
        .map(|id| testing::claim_state(runtime.path(), id).unwrap().unwrap())
        .collect();

    runtime.stop().await;
    for turn in turns {
        assert_eq!(
            turn.await.unwrap().unwrap(),
            Terminal::Interrupted {
                reason: InterruptReason::Shutdown
            }
        );
    }
    for (id, before) in ids.iter().zip(&before) {
        let after = testing::claim_state(runtime.path(), id).unwrap().unwrap();
        assert!(after.time_suspended.is_some(), "{id} keeps its claim");
        assert_eq!(
            after, *before,
            "{id}: shutdown changes no claim bookkeeping"
        );
        let interrupted =
            testing::events_of_kind(runtime.path(), id, kind::EXECUTION_INTERRUPTED).unwrap();
        assert_eq!(interrupted.len(), 1);
        assert_eq!(interrupted[0].data, json!({"reason": "shutdown"}));
    }

    // The next boot (sweep on start) resumes every one of them, counting one attempt each.
    let next = ScriptedRunner::new();
    let gate = Gate::new();
    for id in &ids {
        next.push(id, Script::Gate(gate.clone()));
    }
    runtime.restart(&next, |b| b.sweep_on_start(true)).await;
    next.wait_for_drains(3, WAIT).await;
    let mut resumed: Vec<_> = next.drains().into_iter().map(|d| d.session_id).collect();
    resumed.sort();
    assert_eq!(resumed, ids);
    for id in &ids {
        assert_eq!(testing::resume_attempts(runtime.path(), id).unwrap(), 1);
        assert_eq!(
            testing::events_of_kind(runtime.path(), id, kind::SYNTHETIC)
                .unwrap()
                .len(),
            1
        );
    }
    gate.release();
    for id in &ids {
        runtime.execution().await_idle(id).await.unwrap();
        assert!(!testing::is_claimed(runtime.path(), id).unwrap());
    }
    assert_eq!(next.drains().len(), 3);
    runtime.stop().await;
}

/// 200 sessions on two arbiters drain at once: all 200 gated drains are in flight together, every
/// turn succeeds once released, no claim is left and each session's log is contiguous from 0.
#[actix_rt::test]
async fn two_hundred_sessions_drain_concurrently_on_two_arbiters() {
    const N: usize = 200;
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let gate = Gate::new();
    let ids: Vec<SessionId> = futures::future::join_all((0..N).map(|i| {
        let runtime = &runtime;
        async move { create(runtime, &format!("s{i:03}"), None).await }
    }))
    .await;
    for id in &ids {
        runner.push(id, Script::Gate(gate.clone()));
    }

    let turns: Vec<_> = ids.iter().map(|id| spawn_resume(&runtime, id)).collect();
    runner.wait_for_drains(N, WAIT).await;
    assert_eq!(runtime.execution().active().len(), N);
    assert_eq!(runtime.execution().active(), ids.iter().cloned().collect());
    gate.release();
    for turn in turns {
        assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);
    }

    assert_eq!(runner.drains().len(), N);
    for id in &ids {
        runtime.execution().await_idle(id).await.unwrap();
        assert!(
            !testing::is_claimed(runtime.path(), id).unwrap(),
            "{id} released"
        );
        let events = testing::events(runtime.path(), id).unwrap();
        let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                kind::CREATED,
                kind::EXECUTION_STARTED,
                kind::EXECUTION_SUCCEEDED
            ],
            "{id}"
        );
        let seqs: Vec<_> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [0, 1, 2], "{id}");
    }
    assert!(runtime.execution().active().is_empty());
    runtime.stop().await;
}

/// Fifty wakes while a gated drain runs ring one doorbell: exactly one follow-up (advisory)
/// drain, inside the same turn, and nothing after it.
#[actix_rt::test]
async fn fifty_wakes_during_a_drain_coalesce_into_one_follow_up_drain() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let gate = Gate::new();
    runner.push(&s, Script::Gate(gate.clone()));

    let turn = spawn_resume(&runtime, &s);
    runner.wait_for_drains(1, WAIT).await;
    let execution = runtime.execution();
    for _ in 0..50 {
        execution.wake(&s, None).await.unwrap();
    }
    assert_eq!(
        runner.drains_of(&s).len(),
        1,
        "wakes never run a second drain at once"
    );

    gate.release();
    assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);
    execution.await_idle(&s).await.unwrap();
    let drains = runner.drains_of(&s);
    assert_eq!(drains.len(), 2, "{drains:?}");
    assert!(drains[0].forced);
    assert!(!drains[1].forced);
    // One turn: one claim, one terminal.
    for event in [kind::EXECUTION_STARTED, kind::EXECUTION_SUCCEEDED] {
        assert_eq!(
            testing::events_of_kind(runtime.path(), &s, event)
                .unwrap()
                .len(),
            1
        );
    }
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    runtime.stop().await;
}

/// Panics in `Drop` when the drain future holding it is dropped (cancelled).
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("scripted panic while the drain is dropped");
        }
    }
}

/// A drain that panics while being cancelled by a user interrupt is still recorded as
/// `interrupted{user}` with its claim released; the session keeps serving.
#[actix_rt::test]
async fn a_drain_that_panics_while_cancelled_still_records_the_user_interrupt() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    runner.push(
        &s,
        Script::custom(|_turn| async move {
            let _guard = PanicsOnDrop;
            futures::future::pending::<()>().await;
            Ok(())
        }),
    );
    let execution = runtime.execution();
    execution.wake(&s, None).await.unwrap();
    runner.wait_for_drains(1, WAIT).await;

    assert!(execution.interrupt(&s, None).await.unwrap());
    let interrupted =
        testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_INTERRUPTED).unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].data, json!({"reason": "user"}));
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    assert_eq!(execution.resume(&s).await.unwrap(), Terminal::Succeeded);
    runtime.stop().await;
}

/// A caller answered with its turn's outcome never sees the session still in `active()`.
#[actix_rt::test]
async fn a_session_leaves_active_before_its_callers_are_answered() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let execution = runtime.execution();
    for _ in 0..200 {
        assert_eq!(execution.resume(&s).await.unwrap(), Terminal::Succeeded);
        assert!(
            !execution.active().contains(&s),
            "still active after resume returned"
        );
    }
    runtime.stop().await;
}
