//! Load and supervision: many sessions under random prompts, and drains that panic.
//!
//! Load: many sessions receive prompts at random instants over a fixed window, with random user
//! interrupts, bare wakes and explicit resumes thrown in, on one runtime with the echo runner
//! (promote, then reply once per user message no user interrupted). At the end, once every
//! session is idle: the store-wide invariants of `tests/common` hold (contiguous logs, each
//! input promoted at most once with its one event and transcript row, claims matching the log,
//! no interrupted prompt answered after its interrupt); no claim is left; every admitted prompt
//! is promoted exactly once, or — only if a later user interrupt fenced it — still pending; one
//! more prompt per session then leaves nothing pending and every user message answered exactly
//! once, except one whose turn a user interrupted, which is answered at most once (before the
//! interrupt); and the process's resident memory (`VmRSS`) grows less than 20% from the middle
//! of the window to its end. CI runs 100 sessions × 5 prompts over 5 s;
//! `DS_LOAD_SECS=60` runs 1,000 sessions × 20 prompts over 60 s (`DS_LOAD_SESSIONS`,
//! `DS_LOAD_PROMPTS` override either).
//!
//! Supervision: a drain that panics while publishing its own events — after a publish
//! committed, while building an event's data, with a publish still in flight — fails only its
//! own turn (one `failed{panic}`, claim released), its actor is replaced, the runtime and the
//! other sessions (draining meanwhile on both arbiters) keep serving, and the session runs again.
//! There is no public handle to a session actor; the one way to take one down from outside its
//! drain's control flow is to stop the arbiter thread it runs on, which a runner can do: that
//! case is pinned too (the killed turn keeps its claim, as after a process crash, and the
//! session's next turn runs on a live arbiter).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use durable_sessions::kind;
use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{
    CreateSession, Error, MessageId, PromptInput, Runtime, SessionId, Terminal,
};
use futures::future::join_all;
use serde_json::json;

use common::{
    create, prompt_body, run_seed, wait_for, EchoOptions, EchoRunner, Harness, StoreView, XorShift,
    WAIT,
};

// ---------------------------------------------------------------------------------------------
// Supervision.

/// Asserts that the session's only failure is one `failed{panic}` and its claim is released.
fn assert_failed_once_with_panic(db: &Path, id: &SessionId) {
    let failed = testing::events_of_kind(db, id, kind::EXECUTION_FAILED).unwrap();
    let types: Vec<_> = failed
        .iter()
        .map(|e| e.data["error"]["type"].clone())
        .collect();
    assert_eq!(types, vec![json!("panic")], "{id}");
    assert!(!testing::is_claimed(db, id).unwrap(), "{id} still claimed");
}

fn panicky(message: &'static str) -> serde_json::Value {
    panic!("{message}")
}

/// Three drains panic in the middle of publishing their own events — after `publish` committed,
/// while building an event's data, and with a `publish` still in flight — while four other
/// sessions drain on both arbiters: each panicking turn is recorded once as `failed{panic}` with
/// its claim released (the event committed before the panic stays, nothing else of it), its
/// actor is replaced, the other turns complete, and every session runs again.
#[actix_rt::test]
async fn panics_while_publishing_fail_only_their_own_turns_and_the_actors_are_replaced() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let gate = Gate::new();
    let mut steady = Vec::new();
    for i in 0..4 {
        let id = create(&runtime, &format!("steady{i}"), None).await;
        runner.push(&id, Script::Gate(gate.clone()));
        steady.push(id);
    }
    let after_publish = create(&runtime, "after-publish", None).await;
    runner.push(
        &after_publish,
        Script::custom(|turn| async move {
            turn.publish("app.step", json!({"n": 1})).await.unwrap();
            panic!("after the publish committed")
        }),
    );
    let building = create(&runtime, "building", None).await;
    runner.push(
        &building,
        Script::custom(|turn| async move {
            turn.publish("app.step", json!({"n": 1})).await.unwrap();
            turn.publish("app.step", panicky("while building the event data"))
                .await
                .unwrap();
            Ok(())
        }),
    );
    let in_flight = create(&runtime, "in-flight", None).await;
    runner.push(
        &in_flight,
        Script::custom(|turn| async move {
            // `join!` polls the publish first: its write is queued, then the drain panics.
            let publish = turn.publish("app.step", json!({"n": 1}));
            let (_, ()) = futures::join!(publish, async { panic!("with a publish in flight") });
            Ok(())
        }),
    );
    let started = runtime.stats().registry;
    let running: Vec<_> = steady
        .iter()
        .map(|id| {
            let (execution, id) = (runtime.execution(), id.clone());
            actix_rt::spawn(async move { execution.resume(&id).await })
        })
        .collect();
    runner.wait_for_drains(steady.len(), WAIT).await;
    for id in [&after_publish, &building, &in_flight] {
        match runtime.execution().resume(id).await.unwrap() {
            Terminal::Failed { error } => assert_eq!(error.kind, "panic", "{id}: {error:?}"),
            other => panic!("{id}: {other:?}"),
        }
        assert_failed_once_with_panic(runtime.path(), id);
    }
    assert_eq!(
        testing::events_of_kind(runtime.path(), &after_publish, "app.step")
            .unwrap()
            .len(),
        1,
        "the event committed before the panic is kept"
    );
    assert_eq!(
        testing::events_of_kind(runtime.path(), &building, "app.step")
            .unwrap()
            .len(),
        1,
        "the event whose data panicked was never published"
    );
    assert_eq!(
        testing::events_of_kind(runtime.path(), &in_flight, "app.step")
            .unwrap()
            .len(),
        1,
        "a write queued before the panic commits, ahead of the failure"
    );
    wait_for("the three panicked actors to be replaced", || {
        runtime.stats().registry.replaced >= started.replaced + 3
    })
    .await;
    // The other turns were untouched and complete.
    assert_eq!(
        runtime.execution().active(),
        steady.iter().cloned().collect()
    );
    gate.release();
    for turn in running {
        assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);
    }
    // Every session runs again (the panicked ones on fresh actors).
    for id in steady.iter().chain([&after_publish, &building, &in_flight]) {
        assert_eq!(
            runtime.execution().resume(id).await.unwrap(),
            Terminal::Succeeded
        );
    }
    for id in [&after_publish, &building, &in_flight] {
        assert_failed_once_with_panic(runtime.path(), id);
    }
    let view = StoreView::read(runtime.path());
    view.assert_invariants(10, "after the panics");
    assert!(view.claimed().is_empty());
    runtime.stop().await;
}

/// A session actor taken down from outside — its arbiter thread stopped under it (by its own
/// drain: there is no public handle to an actor) — does not take the runtime with it: its
/// caller gets a typed error, the turn keeps its claim exactly as after a process crash (so a
/// later boot would resume it), the other sessions keep being served (new actors that land on
/// the dead arbiter are retried on a live one), and the session's next turn runs and releases.
#[actix_rt::test]
async fn a_session_actor_whose_arbiter_is_stopped_leaves_its_claim_and_the_runtime_serving() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let victim = create(&runtime, "victim", None).await;
    runner.push(
        &victim,
        Script::custom(|_turn| async {
            actix::Arbiter::current().stop();
            futures::future::pending::<()>().await;
            Ok(())
        }),
    );
    let answer = runtime.execution().resume(&victim).await;
    assert!(matches!(answer, Err(Error::ShuttingDown)), "{answer:?}");
    assert!(
        testing::is_claimed(runtime.path(), &victim).unwrap(),
        "the claim was dropped"
    );
    wait_for("the dead actor to leave active()", || {
        runtime.execution().active().is_empty()
    })
    .await;
    for i in 0..8 {
        let id = create(&runtime, &format!("other{i}"), None).await;
        assert_eq!(
            runtime.execution().resume(&id).await.unwrap(),
            Terminal::Succeeded
        );
    }
    assert_eq!(
        runtime.execution().resume(&victim).await.unwrap(),
        Terminal::Succeeded
    );
    let view = StoreView::read(runtime.path());
    view.assert_invariants(10, "after the arbiter stopped");
    assert!(view.claimed().is_empty());
    runtime.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Load.

/// The size of a load run.
#[derive(Debug, Clone, Copy)]
struct Load {
    sessions: usize,
    prompts: usize,
    window: Duration,
}

impl Load {
    fn from_env() -> Load {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let secs = var("DS_LOAD_SECS").unwrap_or(5);
        let (sessions, prompts) = if secs >= 60 { (1000, 20) } else { (100, 5) };
        Load {
            sessions: var("DS_LOAD_SESSIONS").map_or(sessions, |n| n as usize),
            prompts: var("DS_LOAD_PROMPTS").map_or(prompts, |n| n as usize),
            window: Duration::from_secs(secs.max(1)),
        }
    }
}

/// Fields of `/proc/self/status`: `VmRSS`, `RssAnon`, `RssFile`, `RssShmem` (KiB) and
/// `Threads`, in that order (0 when missing).
fn memory() -> [u64; 5] {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    [
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:"),
        field("RssShmem:"),
        field("Threads:"),
    ]
}

/// What the load driver did (counts only: the prompt ids are `s<i>-p<n>`, all of them admitted).
#[derive(Debug, Default)]
struct Tally {
    admitted: usize,
    interrupts: usize,
    interrupted: usize,
    wakes: usize,
    resumes: usize,
}

/// The id of prompt `n` of session `i`.
fn prompt_id(session: usize, n: usize) -> String {
    format!("s{session}-p{n}")
}

/// One session's workload: its prompts at random instants of the window, each possibly
/// followed by a user interrupt, a bare wake or an explicit resume (not awaited).
async fn drive(runtime: Runtime, index: usize, load: Load, seed: u64, start: Instant) -> Tally {
    let sessions = runtime.sessions();
    let id = SessionId::new(format!("s{index}")).unwrap();
    sessions
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/load".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    let mut rng = XorShift::new(seed ^ common::splitmix(index as u64));
    let window_us = load.window.as_micros() as u64 * 9 / 10;
    let mut at: Vec<u64> = (0..load.prompts).map(|_| rng.below(window_us)).collect();
    at.sort_unstable();
    let mut tally = Tally::default();
    let mut resumes = Vec::new();
    for (n, at) in at.into_iter().enumerate() {
        // Workload pacing (the schedule under test), not a synchronisation.
        actix_rt::time::sleep_until((start + Duration::from_micros(at)).into()).await;
        let message = prompt_id(index, n);
        let input = PromptInput::new(id.clone(), prompt_body(&message))
            .with_id(MessageId::new(message.as_str()).unwrap());
        sessions.prompt(input).await.expect("prompt under load");
        tally.admitted += 1;
        match rng.below(100) {
            0..=7 => {
                tally.interrupts += 1;
                tally.interrupted += usize::from(sessions.interrupt(&id).await.unwrap());
            }
            8..=15 => {
                tally.wakes += 1;
                // After an interrupt request an unsequenced wake is refused, saying why.
                match runtime.execution().wake(&id, None).await {
                    Ok(()) | Err(durable_sessions::Error::WakeAfterInterrupt { .. }) => {}
                    Err(e) => panic!("wake under load: {e}"),
                }
            }
            16..=20 => {
                tally.resumes += 1;
                let (execution, id) = (runtime.execution(), id.clone());
                resumes.push(actix_rt::spawn(async move { execution.resume(&id).await }));
            }
            _ => {}
        }
    }
    for resume in resumes {
        // A resume joins or follows whatever runs; any terminal is fine, an error is not.
        resume.await.unwrap().expect("resume under load");
    }
    tally
}

/// Set in the child process that runs the load.
const LOAD_CHILD_ENV: &str = "DS_LOAD_CHILD";

/// `DS_LOAD_SESSIONS` × `DS_LOAD_PROMPTS` prompts (default 100 × 5; 1,000 × 20 with
/// `DS_LOAD_SECS=60`) at random instants over `DS_LOAD_SECS` (default 5), with random user
/// interrupts, wakes and resumes: every invariant holds at the end, no claim is left, nothing
/// admitted is lost or promoted twice, and RSS grows less than 20% over the second half. The
/// load runs in a child process (this test re-executed), so that `VmRSS` is the runtime's
/// alone, not that of the tests running beside it.
#[test]
fn sessions_under_load_lose_nothing_and_memory_stays_flat() {
    const TEST: &str = "sessions_under_load_lose_nothing_and_memory_stays_flat";
    if std::env::var(LOAD_CHILD_ENV).is_ok() {
        actix_rt::System::new().block_on(run_load());
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(LOAD_CHILD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the load child");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in stderr.lines().filter(|l| l.starts_with("load:")) {
        eprintln!("{line}");
    }
    assert!(
        output.status.success(),
        "the load child failed ({})\n--- stdout ---\n{}\n--- stderr ---\n{stderr}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
}

/// The load itself (in the child process).
async fn run_load() {
    let load = Load::from_env();
    let seed = run_seed();
    eprintln!("load: {load:?}, seed {seed} (replay with DS_SEED={seed})");
    let runner = EchoRunner::new(EchoOptions {
        jitter_us: 500,
        seed,
        ..EchoOptions::default()
    });
    let runtime = Harness::with(|b| {
        b.sweep_on_start(true)
            .shutdown_grace(Duration::from_secs(5))
    })
    .start(&runner)
    .await;
    let start = Instant::now();
    let sampler = {
        let window = load.window;
        actix_rt::spawn(async move {
            let mut samples = Vec::new();
            let every = window / 20;
            while start.elapsed() < window {
                samples.push((start.elapsed(), memory()));
                actix_rt::time::sleep(every).await;
            }
            samples.push((start.elapsed(), memory()));
            samples
        })
    };
    let drivers =
        (0..load.sessions).map(|i| actix_rt::spawn(drive(runtime.clone(), i, load, seed, start)));
    let tallies = join_all(drivers).await;
    let driven = start.elapsed();
    let mut tally = Tally::default();
    for t in tallies {
        let t = t.unwrap();
        tally.admitted += t.admitted;
        tally.interrupts += t.interrupts;
        tally.interrupted += t.interrupted;
        tally.wakes += t.wakes;
        tally.resumes += t.resumes;
    }
    let ids: Vec<SessionId> = (0..load.sessions)
        .map(|i| SessionId::new(format!("s{i}")).unwrap())
        .collect();
    for id in &ids {
        runtime.execution().await_idle(id).await.unwrap();
    }
    let samples = sampler.await.unwrap();

    // Everything admitted is promoted once, or pending behind a later interrupt.
    let view = StoreView::read(runtime.path());
    view.assert_invariants(10, "after the load");
    assert!(
        view.claimed().is_empty(),
        "claims left: {:?}",
        view.claimed()
    );
    let mut fenced = 0;
    for (i, id) in ids.iter().enumerate() {
        for n in 0..load.prompts {
            let message = prompt_id(i, n);
            let row = view
                .inputs
                .get(&message)
                .unwrap_or_else(|| panic!("admitted prompt {message} is not stored"));
            assert_eq!(row.session, id.as_str());
            if row.promoted_seq.is_none() {
                let fence = view.interrupt_fence(id.as_str());
                assert!(
                    fence.is_some_and(|f| row.admitted_seq <= f),
                    "{message} pending at seq {} without a later interrupt ({fence:?})",
                    row.admitted_seq
                );
                fenced += 1;
            }
        }
    }
    assert_eq!(tally.admitted, load.sessions * load.prompts);
    assert_eq!(view.inputs.len(), tally.admitted);

    // One more prompt per session promotes what the interrupts left and answers everything.
    let sessions = runtime.sessions();
    for id in &ids {
        let message = format!("{id}-last");
        let input = PromptInput::new(id.clone(), prompt_body(&message))
            .with_id(MessageId::new(message.as_str()).unwrap());
        sessions.prompt(input).await.unwrap();
    }
    for id in &ids {
        runtime.execution().await_idle(id).await.unwrap();
    }
    let last = StoreView::read(runtime.path());
    last.assert_invariants(10, "after the last prompts");
    assert!(last.claimed().is_empty());
    assert!(last.pending().is_empty(), "pending: {:?}", last.pending());
    let replies = last.replies();
    let users: BTreeSet<&String> = last
        .messages
        .iter()
        .filter(|(_, m)| m.kind == "user")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(users.len(), tally.admitted + ids.len());
    for id in &users {
        // A prompt whose turn a user interrupted is never answered again.
        let answers = replies.get(*id).copied().unwrap_or(0);
        assert!(
            answers == 1 || (last.messages[*id].interrupted && answers == 0),
            "{id} (interrupted: {}) answered {answers} times",
            last.messages[*id].interrupted
        );
    }

    // Memory: flat over the second half of the window.
    let at_mid = samples
        .iter()
        .find(|(at, _)| *at >= load.window / 2)
        .map_or([0; 5], |(_, m)| *m);
    let at_end = samples.last().map_or([0; 5], |(_, m)| *m);
    let (mid, end) = (at_mid[0], at_end[0]);
    let first = samples.first().map_or(0, |(_, m)| m[0]);
    let trace: Vec<String> = samples
        .iter()
        .map(|(at, m)| {
            format!(
                "{:.0}s {}/{}/{}/{}K {}t",
                at.as_secs_f64(),
                m[0],
                m[1],
                m[2],
                m[3],
                m[4]
            )
        })
        .collect();
    eprintln!(
        "load: memory (VmRSS/RssAnon/RssFile/RssShmem, threads): {}",
        trace.join(", ")
    );
    let stats = runtime.stats();
    eprintln!(
        "load: {} sessions x {} prompts in {driven:?}: {} admitted, {} interrupts ({} hit a \
         turn), {} wakes, {} resumes, {fenced} left pending by an interrupt until the last \
         prompt; {} events, {} write transactions for {} requests (largest batch {}); RSS \
         {first} KiB at start, {mid} KiB at mid-window, {end} KiB at the end",
        load.sessions,
        load.prompts,
        tally.admitted,
        tally.interrupts,
        tally.interrupted,
        tally.wakes,
        tally.resumes,
        last.counts()[3],
        stats.persistence.transactions,
        stats.persistence.requests,
        stats.persistence.largest_batch,
    );
    assert!(mid > 0 && end > 0, "no VmRSS samples: {trace:?}");
    assert!(
        end * 100 < mid * 120,
        "RSS grew {mid} -> {end} KiB over the second half: {trace:?}"
    );
    runtime.stop().await;
}
