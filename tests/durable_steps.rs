//! Durable steps, the turn ledger and retries, through a real runtime on a real database: a
//! step's recorded outcome replays in later drains of its turn, an open intent is ambiguous,
//! keys and turn ids hold across attempts, a failed turn is retried as the same turn, and an
//! admitted prompt can be awaited to the terminal of the turn that served it. (A step cut by a
//! real `SIGKILL` is the crash suites'.)

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use durable_sessions::testing::{self, CrashedTurn, Script, ScriptedRunner};
use durable_sessions::{
    kind, Error, InterruptReason, MessageId, NotRetryable, PromptInput, RunError, StepStatus,
    Terminal, Turn, TurnCause, MAX_STEP_RESULT_BYTES,
};
use serde_json::{json, Value};

use common::{create, Harness, WAIT};

/// A counter shared by a test and its drains.
#[derive(Clone, Default)]
struct Count(Arc<AtomicU32>);

impl Count {
    fn bump(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// What drains saw, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Value>>>);

impl Seen {
    fn push(&self, v: Value) {
        self.0.lock().unwrap().push(v);
    }
    fn all(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }
}

fn infallible<T>(v: T) -> Result<T, std::convert::Infallible> {
    Ok(v)
}

#[actix_rt::test]
async fn a_step_name_used_twice_in_one_drain_is_an_error() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let bodies = Count::default();
    let seen = Seen::default();
    runner.push(&s, {
        let (bodies, seen) = (bodies.clone(), seen.clone());
        Script::custom(move |turn: Turn| {
            let (bodies, seen) = (bodies.clone(), seen.clone());
            async move {
                let first: u32 = turn
                    .step("tool:1", |_| async { infallible(bodies.bump()) })
                    .await?;
                let again = turn
                    .step("tool:1", |_| async { infallible(bodies.bump()) })
                    .await;
                seen.push(json!({ "first": first, "again": format!("{again:?}") }));
                match again {
                    Err(Error::DuplicateStep { step, .. }) if step == "tool:1" => Ok(()),
                    other => Err(RunError::Other(format!("{other:?}"))),
                }
            }
        })
    });
    let ended = runtime.execution().resume(&s).await.unwrap();
    assert_eq!(ended, Terminal::Succeeded, "{:?}", seen.all());
    assert_eq!(bodies.get(), 1, "the second call ran nothing");
    let steps = testing::events_of_kind(runtime.path(), &s, kind::STEP_STARTED).unwrap();
    assert_eq!(steps.len(), 1, "nothing was recorded for the second call");
    runtime.stop().await;
}

/// A turn whose drain runs `steps` then blocks forever inside step `blocked`: its body marks
/// `entered`, so the test can stop the runtime while the step is open.
fn blocked_in(steps: &'static [&'static str], blocked: &'static str, log: Seen) -> Script {
    Script::custom(move |turn: Turn| {
        let log = log.clone();
        async move {
            for name in steps {
                let log = log.clone();
                turn.step(name, |ctx| async move {
                    log.push(json!({ "ran": ctx.name(), "key": ctx.key(),
                        "previous": ctx.previous_attempts(), "attempt": ctx.turn_attempt() }));
                    infallible(ctx.name().to_owned())
                })
                .await?;
            }
            let log = log.clone();
            turn.step(blocked, |ctx| async move {
                log.push(json!({ "ran": ctx.name(), "key": ctx.key(),
                    "previous": ctx.previous_attempts(), "attempt": ctx.turn_attempt(),
                    "blocked": true }));
                futures::future::pending::<Result<(), std::convert::Infallible>>().await
            })
            .await?;
            Ok(())
        }
    })
}

/// Waits until `log` holds an entry with `"blocked": true`.
async fn until_blocked(log: &Seen) {
    common::wait_for("the drain to block inside its step", || {
        log.all().iter().any(|e| e["blocked"] == json!(true))
    })
    .await;
}

#[actix_rt::test]
async fn step_once_refuses_to_rerun_an_ambiguous_step() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let log = Seen::default();
    runner.push(&s, blocked_in(&["lookup"], "pay", log.clone()));
    let handle = runtime.execution().start_resume(&s).await.unwrap();
    until_blocked(&log).await;
    // A graceful shutdown keeps the turn: the payment's outcome is lost with the drain.
    runtime.stop().await;
    assert_eq!(
        handle.outcome().await.unwrap(),
        Terminal::Interrupted {
            reason: InterruptReason::Shutdown
        }
    );

    let seen = Seen::default();
    let paid = Count::default();
    runner.push(&s, {
        let (seen, paid) = (seen.clone(), paid.clone());
        Script::custom(move |turn: Turn| {
            let (seen, paid) = (seen.clone(), paid.clone());
            async move {
                let ambiguous: Vec<String> = turn
                    .resumption()
                    .map(|r| r.steps.iter().map(|s| s.name.clone()).collect())
                    .unwrap_or_default();
                let lookup: String = turn
                    .step("lookup", |_| async { infallible("again".to_owned()) })
                    .await?;
                let pay = turn
                    .step_once("pay", |_| async { infallible(paid.bump()) })
                    .await;
                seen.push(json!({ "ambiguous": ambiguous, "lookup": lookup,
                    "pay": format!("{pay:?}"), "attempt": turn.attempt() }));
                match pay {
                    Err(Error::Ambiguous { attempts: 1, .. }) => Ok(()),
                    other => Err(RunError::Other(format!("{other:?}"))),
                }
            }
        })
    });
    runtime.restart(&runner, |b| b.sweep_on_start(true)).await;
    runner.wait_for_drains_of(&s, 2, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    let seen = seen.all();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["ambiguous"], json!(["pay"]));
    assert_eq!(seen[0]["lookup"], json!("lookup"), "the recorded value");
    assert_eq!(seen[0]["attempt"], json!(2));
    assert_eq!(paid.get(), 0, "the ambiguous payment did not run again");
    let last = runtime.sessions().last_terminal(&s).await.unwrap().unwrap();
    assert_eq!(last.kind, kind::EXECUTION_SUCCEEDED);
    runtime.stop().await;
}

#[actix_rt::test]
async fn a_step_key_is_stable_across_attempts_of_a_turn() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let log = Seen::default();
    runner.push(&s, blocked_in(&[], "charge", log.clone()));
    let ids = Seen::default();
    let handle = runtime.execution().start_resume(&s).await.unwrap();
    until_blocked(&log).await;
    runtime.stop().await;
    handle.outcome().await.unwrap();

    // The second attempt runs the ambiguous step again, told so, under the same key; then
    // fails, and a retry (the third attempt) replays the step it completed.
    let failing = Script::custom({
        let (log, ids) = (log.clone(), ids.clone());
        move |turn: Turn| {
            let (log, ids) = (log.clone(), ids.clone());
            async move {
                ids.push(json!({ "id": turn.id(), "attempt": turn.attempt(),
                    "retry": matches!(turn.cause(), TurnCause::Retry(_)) }));
                let log2 = log.clone();
                let key: String = turn
                    .step("charge", |ctx| async move {
                        log2.push(json!({ "ran": ctx.name(), "key": ctx.key(),
                            "previous": ctx.previous_attempts(), "attempt": ctx.turn_attempt() }));
                        infallible(ctx.key().to_owned())
                    })
                    .await?;
                if turn.attempt() == 2 {
                    return Err(RunError::Other(format!("failed after {key}")));
                }
                ids.push(json!({ "replayed_key": key }));
                Ok(())
            }
        }
    });
    runner.push(&s, failing.clone());
    runner.push(&s, failing);
    runtime.restart(&runner, |b| b.sweep_on_start(true)).await;
    runner.wait_for_drains_of(&s, 2, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    assert_eq!(
        runtime.sessions().retry(&s).await.unwrap(),
        Terminal::Succeeded
    );

    let ran = log.all();
    assert_eq!(
        ran.len(),
        2,
        "the body ran in attempts 1 and 2 only: {ran:?}"
    );
    assert_eq!(ran[0]["key"], ran[1]["key"]);
    assert_eq!(
        (ran[0]["previous"].clone(), ran[1]["previous"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(
        (ran[0]["attempt"].clone(), ran[1]["attempt"].clone()),
        (json!(1), json!(2))
    );
    let ids = ids.all();
    assert_eq!(ids[0]["id"], ids[1]["id"], "one turn: {ids:?}");
    assert_eq!(ids[1]["attempt"], json!(3));
    assert_eq!(ids[1]["retry"], json!(true));
    assert_eq!(ids[2]["replayed_key"], ran[0]["key"]);
    let key = ran[0]["key"].as_str().unwrap().to_owned();
    assert_eq!(key, format!("s:{}:charge", ids[0]["id"]));
    // The stored records carry the turn, its attempt and the key.
    let started = testing::events_of_kind(runtime.path(), &s, kind::STEP_STARTED).unwrap();
    let records: Vec<(Value, Value, Value)> = started
        .iter()
        .map(|e| {
            (
                e.data["turn"].clone(),
                e.data["attempt"].clone(),
                e.data["key"].clone(),
            )
        })
        .collect();
    assert_eq!(
        records,
        [
            (ids[0]["id"].clone(), json!(1), json!(key)),
            (ids[0]["id"].clone(), json!(2), json!(key))
        ]
    );
    runtime.stop().await;
}

#[actix_rt::test]
async fn a_retried_failed_turn_reuses_its_completed_steps() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let (tool1, tool2) = (Count::default(), Count::default());
    let seen = Seen::default();
    runner.set_default(&s, {
        let (tool1, tool2, seen) = (tool1.clone(), tool2.clone(), seen.clone());
        Script::custom(move |turn: Turn| {
            let (tool1, tool2, seen) = (tool1.clone(), tool2.clone(), seen.clone());
            async move {
                let inputs = turn.take_inputs().await?;
                let a: u32 = turn
                    .step("tool:1", |_| async { infallible(tool1.bump()) })
                    .await?;
                let b = turn
                    .step("tool:2", |_| async {
                        match tool2.bump() {
                            1 => Err("429 too many requests"),
                            n => Ok(n),
                        }
                    })
                    .await;
                seen.push(json!({ "id": turn.id(), "attempt": turn.attempt(),
                    "first": turn.is_first_drain(),
                    "inputs": inputs.iter().map(|i| i.id.as_str().to_owned()).collect::<Vec<_>>(),
                    "resumed": turn.resumption().map(|r| r.inputs.len()),
                    "a": a, "b": format!("{b:?}") }));
                let b = b?;
                for input in inputs {
                    turn.append_message("assistant", json!({ "reply_to": input.id, "b": b }))
                        .await?;
                }
                Ok(())
            }
        })
    });
    let admission = runtime
        .sessions()
        .prompt(
            PromptInput::new(s.clone(), json!({ "text": "hi" }))
                .with_id(MessageId::new("p1").unwrap()),
        )
        .await
        .unwrap();
    let first = runtime.sessions().await_served(&admission).await.unwrap();
    assert!(
        matches!(&first, Terminal::Failed { error } if error.message.contains("429")),
        "{first:?}"
    );
    assert_eq!(
        runtime.sessions().retry(&s).await.unwrap(),
        Terminal::Succeeded
    );
    let seen = seen.all();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["id"], seen[1]["id"], "the same turn");
    assert_eq!(
        (&seen[0]["first"], &seen[1]["first"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(seen[1]["attempt"], json!(2));
    assert_eq!(
        seen[1]["inputs"],
        json!(["p1"]),
        "the retry answers the prompt"
    );
    assert_eq!(seen[1]["resumed"], json!(1));
    assert_eq!(seen[1]["a"], json!(1), "tool 1's recorded value");
    assert_eq!(tool1.get(), 1, "tool 1 ran once");
    assert_eq!(tool2.get(), 2, "the failed tool ran again");
    let replies = runtime.sessions().context(&s).await.unwrap();
    let answered: Vec<&Message> = replies.iter().filter(|m| m.kind == "assistant").collect();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].data["reply_to"], json!("p1"));
    // The ledger as the session reads it back: one turn, two attempts, both steps completed.
    let ledger = runtime
        .sessions()
        .steps(&s)
        .await
        .unwrap()
        .expect("a turn ran");
    assert_eq!(json!(ledger.turn), seen[0]["id"]);
    assert_eq!((ledger.attempt, ledger.open), (2, false));
    assert_eq!(ledger.terminal, Some(Terminal::Succeeded));
    let steps: Vec<(String, u32, bool)> = ledger
        .steps
        .iter()
        .map(|s| {
            let done = matches!(s.status, StepStatus::Completed { .. });
            (s.name.clone(), s.attempts, done)
        })
        .collect();
    assert_eq!(
        steps,
        [("tool:1".into(), 1, true), ("tool:2".into(), 2, true)]
    );
    // The retry's claim names its turn.
    let claims = testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_STARTED).unwrap();
    assert_eq!(claims.len(), 2);
    assert_eq!(claims[1].data["turn"], json!(claims[0].seq));
    runtime.stop().await;
}

use durable_sessions::Message;

#[actix_rt::test]
async fn retry_of_a_turn_that_did_not_fail_is_refused() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let refused = |r: Result<Terminal, Error>| match r {
        Err(Error::NotRetryable { why, .. }) => Some(why),
        _ => None,
    };
    let sessions = runtime.sessions();
    assert_eq!(
        refused(sessions.retry(&s).await),
        Some(NotRetryable::NoTurn)
    );
    assert_eq!(sessions.steps(&s).await.unwrap(), None, "no turn has run");
    runner.push(&s, Script::Complete);
    runtime.execution().resume(&s).await.unwrap();
    assert_eq!(
        refused(sessions.retry(&s).await),
        Some(NotRetryable::Succeeded)
    );
    let gate = testing::Gate::new();
    runner.push(&s, Script::Gate(gate.clone()));
    let running = runtime.execution().start_resume(&s).await.unwrap();
    // Its drain takes the gate script: an interrupt while the turn still starts would leave
    // the script to the next drain.
    runner.wait_for_drains_of(&s, 2, WAIT).await;
    assert_eq!(
        refused(sessions.retry(&s).await),
        Some(NotRetryable::TurnInFlight)
    );
    assert!(sessions.interrupt(&s).await.unwrap());
    assert_eq!(
        running.outcome().await.unwrap(),
        Terminal::Interrupted {
            reason: InterruptReason::User
        }
    );
    assert_eq!(
        refused(sessions.retry(&s).await),
        Some(NotRetryable::Interrupted)
    );
    // A failed turn a user then interrupted: the interrupt sticks.
    runner.push(&s, Script::fail(|| RunError::Other("boom".into())));
    runtime.execution().resume(&s).await.unwrap();
    sessions.interrupt(&s).await.unwrap();
    assert_eq!(
        refused(sessions.retry(&s).await),
        Some(NotRetryable::Interrupted)
    );
    // Nothing was written by a refusal: the log ends with the interrupt request.
    let log = testing::events(runtime.path(), &s).unwrap();
    assert_eq!(log.last().unwrap().kind, kind::INTERRUPT_REQUESTED);
    let ghost = common::sid("ghost");
    assert!(matches!(
        sessions.retry(&ghost).await,
        Err(Error::NotFound { .. })
    ));
    runtime.stop().await;
}

#[actix_rt::test]
async fn awaiting_an_admitted_prompt_returns_the_terminal_of_the_turn_that_served_it() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    // Each turn serves one queued prompt; a prompt saying "fail" fails its turn.
    runner.set_default(
        &s,
        Script::custom(|turn: Turn| async move {
            for input in turn.take_inputs().await? {
                if input.prompt["text"] == json!("fail") {
                    return Err(RunError::Other("the model refused".into()));
                }
                turn.append_message("assistant", json!({ "reply_to": input.id }))
                    .await?;
            }
            Ok(())
        }),
    );
    let gate = testing::Gate::new();
    runner.push(&s, Script::Gate(gate.clone()));
    let blocker = runtime.execution().start_resume(&s).await.unwrap();
    let queue = |id: &str, text: &str| {
        PromptInput::new(s.clone(), json!({ "text": text }))
            .with_id(MessageId::new(id).unwrap())
            .with_delivery(durable_sessions::Delivery::Queue)
    };
    let sessions = runtime.sessions();
    let failing = sessions.prompt(queue("q1", "fail")).await.unwrap();
    let fine = sessions.prompt(queue("q2", "hello")).await.unwrap();
    let waits = futures::future::join(
        sessions.await_served(&fine),
        sessions.await_served(&failing),
    );
    gate.release();
    let (fine_ended, failing_ended) = waits.await;
    // The running turn took the first queued prompt in its next drain, and failed with it.
    assert_eq!(
        blocker.outcome().await.unwrap(),
        failing_ended.as_ref().unwrap().clone()
    );
    assert_eq!(fine_ended.unwrap(), Terminal::Succeeded);
    assert!(
        matches!(&failing_ended, Ok(Terminal::Failed { error }) if error.message.contains("refused")),
        "{failing_ended:?}"
    );
    // Served already: answered from the log.
    assert_eq!(
        sessions.await_served(&fine).await.unwrap(),
        Terminal::Succeeded
    );
    // A prompt an interrupt request stopped before a turn took it is never served.
    let held = sessions
        .prompt(queue("q3", "later").with_resume(false))
        .await
        .unwrap();
    sessions.interrupt(&s).await.unwrap();
    assert_eq!(
        sessions.await_served(&held).await.unwrap(),
        Terminal::Interrupted {
            reason: InterruptReason::User
        }
    );
    runtime.stop().await;
}

#[actix_rt::test]
async fn a_failed_step_replays_its_failure_and_an_oversized_result_is_refused() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    let bodies = Count::default();
    let seen = Seen::default();
    let script = {
        let (bodies, seen) = (bodies.clone(), seen.clone());
        Script::custom(move |turn: Turn| {
            let (bodies, seen) = (bodies.clone(), seen.clone());
            async move {
                let refused = turn
                    .step("flaky", |_| async {
                        bodies.bump();
                        Err::<u32, _>("boom")
                    })
                    .await;
                let huge = turn
                    .step("huge", |_| async {
                        bodies.bump();
                        infallible("x".repeat(MAX_STEP_RESULT_BYTES + 1))
                    })
                    .await;
                let huge = match huge {
                    Err(Error::StepResultTooLarge { bytes, .. }) => format!("too large: {bytes}"),
                    Err(Error::StepFailed { error, .. }) => {
                        format!("{}: {}", error.kind, error.message)
                    }
                    other => format!("{other:?}"),
                };
                seen.push(json!({ "flaky": format!("{refused:?}"), "huge": huge }));
                if turn.attempt() == 1 {
                    // Stop here, holding the claim, so a restart resumes the same turn.
                    futures::future::pending::<()>().await;
                }
                Ok(())
            }
        })
    };
    runner.set_default(&s, script);
    let handle = runtime.execution().start_resume(&s).await.unwrap();
    common::wait_for("the first drain", || !seen.all().is_empty()).await;
    runtime.stop().await;
    handle.outcome().await.unwrap();
    runtime.restart(&runner, |b| b.sweep_on_start(true)).await;
    runner.wait_for_drains_of(&s, 2, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    let seen = seen.all();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0]["flaky"], seen[1]["flaky"],
        "the resumed drain got the recorded failure"
    );
    assert!(seen[1]["flaky"].as_str().unwrap().contains("boom"));
    let size = MAX_STEP_RESULT_BYTES + 3; // the string's quotes
    assert_eq!(seen[0]["huge"], json!(format!("too large: {size}")));
    let replayed = seen[1]["huge"].as_str().unwrap();
    assert!(
        replayed.starts_with("result_too_large: ") && replayed.contains(&size.to_string()),
        "{replayed}"
    );
    assert_eq!(bodies.get(), 2, "each body ran once");
    let failed = testing::events_of_kind(runtime.path(), &s, kind::STEP_FAILED).unwrap();
    assert_eq!(failed.len(), 2);
    runtime.stop().await;
}

#[actix_rt::test]
async fn the_testing_kit_seeds_a_crashed_turn_with_its_inputs_messages_and_steps() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    runtime.stop().await;
    let crashed = CrashedTurn::new()
        .promoted(MessageId::new("p1").unwrap(), json!({ "text": "pay" }))
        .message("assistant", json!({ "text": "looking it up" }))
        .completed_step("lookup", json!({ "amount": 42 }))
        .started_step("pay");
    let turn = testing::seed_crashed_turn(runtime.path(), &s, &crashed).unwrap();

    let seen = Seen::default();
    runner.push(&s, {
        let seen = seen.clone();
        Script::custom(move |turn: Turn| {
            let seen = seen.clone();
            async move {
                let resumption = turn.resumption().cloned();
                let inputs = turn.take_inputs().await?;
                let amount: Value = turn
                    .step("lookup", |_| async { infallible(json!("ran again")) })
                    .await?;
                seen.push(json!({
                    "id": turn.id(), "attempt": turn.attempt(),
                    "inputs": inputs.iter().map(|i| i.id.as_str().to_owned()).collect::<Vec<_>>(),
                    "ambiguous": resumption.map(|r| r.steps.iter().map(|s| (s.name.clone(), s.status == StepStatus::Started)).collect::<Vec<_>>()),
                    "amount": amount,
                }));
                Ok(())
            }
        })
    });
    runtime.restart(&runner, |b| b.sweep_on_start(true)).await;
    let report = runtime.start_sweep().expect("the sweep ran on start");
    assert_eq!(report.resumed, vec![s.clone()]);
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    let seen = seen.all();
    assert_eq!(
        seen,
        [json!({
            "id": turn, "attempt": 2, "inputs": ["p1"],
            "ambiguous": [["pay", true]], "amount": { "amount": 42 },
        })]
    );
    runtime.stop().await;
}

/// A turn the restart sweep gave up on (`failed{aborted}`, over its resume budget) is a dead
/// letter a retry makes runnable again: the same turn, its completed step replayed, its
/// ambiguous one named.
#[actix_rt::test]
async fn a_turn_aborted_over_its_budget_can_be_retried() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    runtime.stop().await;
    let crashed = CrashedTurn::new()
        .completed_step("lookup", json!(42))
        .started_step("pay");
    let turn = testing::seed_crashed_turn(runtime.path(), &s, &crashed).unwrap();
    runtime
        .restart(&runner, |b| b.sweep_on_start(true).max_resume_attempts(0))
        .await;
    let report = runtime.start_sweep().expect("the sweep ran on start");
    assert_eq!(report.terminalized, vec![s.clone()]);
    let seen = Seen::default();
    runner.push(&s, {
        let seen = seen.clone();
        Script::custom(move |turn: Turn| {
            let seen = seen.clone();
            async move {
                let lookup: u32 = turn.step("lookup", |_| async { infallible(0) }).await?;
                let ambiguous: Vec<String> = turn
                    .resumption()
                    .map(|r| r.steps.iter().map(|s| s.name.clone()).collect())
                    .unwrap_or_default();
                seen.push(json!({ "id": turn.id(), "lookup": lookup, "ambiguous": ambiguous }));
                Ok(())
            }
        })
    });
    assert_eq!(
        runtime.sessions().retry(&s).await.unwrap(),
        Terminal::Succeeded
    );
    assert_eq!(
        seen.all(),
        [json!({ "id": turn, "lookup": 42, "ambiguous": ["pay"] })]
    );
    runtime.stop().await;
}

#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_durable_steps_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_durable_steps_suite");
}
