//! Turn deadlines through a real runtime on a real database: a turn past its deadline
//! (`RuntimeBuilder::turn_timeout`, or its own `Turn::set_deadline`) is recorded as
//! `interrupted{timeout}`, its claim released and its session free for the next prompt; a turn
//! that ends in time is unaffected.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_sessions::testing::{self, Script, ScriptedRunner};
use durable_sessions::{
    kind, Delivery, InterruptReason, MessageId, PromptInput, SessionId, Terminal, Turn,
};
use serde_json::json;

use common::{create, Harness, WAIT};

fn timed_out() -> Terminal {
    Terminal::Interrupted {
        reason: InterruptReason::Timeout,
    }
}

/// A drain that serves its prompts: one assistant reply per input.
fn replying() -> Script {
    Script::custom(|turn: Turn| async move {
        for input in turn.take_inputs().await? {
            turn.append_message("assistant", json!({ "reply_to": input.id }))
                .await?;
        }
        Ok(())
    })
}

fn queued(s: &SessionId, id: &str) -> PromptInput {
    PromptInput::new(s.clone(), json!({ "text": id }))
        .with_id(MessageId::new(id).unwrap())
        .with_delivery(Delivery::Queue)
}

/// The reasons of the session's recorded interruptions, in order.
fn interruptions(runtime: &Harness, s: &SessionId) -> Vec<serde_json::Value> {
    testing::events_of_kind(runtime.path(), s, kind::EXECUTION_INTERRUPTED)
        .unwrap()
        .into_iter()
        .map(|e| e.data["reason"].clone())
        .collect()
}

#[actix_rt::test]
async fn a_turn_past_its_timeout_is_interrupted_and_frees_the_session() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.turn_timeout(Duration::from_millis(200)))
        .start(&runner)
        .await;
    let sessions = runtime.sessions();

    // A turn that hangs, with a prompt queued behind it: the turn times out, the prompt runs.
    let s = create(&runtime, "s", None).await;
    runner.set_default(&s, replying());
    runner.push(&s, Script::Never);
    let hung = runtime.execution().start_resume(&s).await.unwrap();
    let behind = sessions.prompt(queued(&s, "q1")).await.unwrap();
    let ended = tokio::time::timeout(WAIT, hung.outcome()).await.unwrap();
    assert_eq!(ended.unwrap(), timed_out());
    let served = tokio::time::timeout(WAIT, sessions.await_served(&behind))
        .await
        .unwrap();
    assert_eq!(served.unwrap(), Terminal::Succeeded);
    assert_eq!(interruptions(&runtime, &s), [json!("timeout")]);
    let terminals: Vec<String> = testing::events(runtime.path(), &s)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .filter(|k| k.starts_with("session.execution.") && k != kind::EXECUTION_STARTED)
        .collect();
    assert_eq!(
        terminals,
        [kind::EXECUTION_INTERRUPTED, kind::EXECUTION_SUCCEEDED],
        "the timed-out turn's terminal, then the queued prompt's turn"
    );
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());

    // A turn that takes its prompt and hangs alone: once it timed out its prompt is marked
    // interrupted, the session holds no claim, and a prompt admitted after it runs to its end.
    let t = create(&runtime, "t", None).await;
    runner.set_default(&t, replying());
    runner.push(
        &t,
        Script::custom(|turn: Turn| async move {
            turn.take_inputs().await?;
            futures::future::pending::<()>().await;
            Ok(())
        }),
    );
    let hanging = sessions.prompt(queued(&t, "p0")).await.unwrap();
    let ended = tokio::time::timeout(WAIT, sessions.await_served(&hanging))
        .await
        .unwrap();
    assert_eq!(ended.unwrap(), timed_out());
    assert!(
        !testing::is_claimed(runtime.path(), &t).unwrap(),
        "a timeout releases the claim"
    );
    assert_eq!(interruptions(&runtime, &t), [json!("timeout")]);
    let prompt = sessions
        .message(&t, &MessageId::new("p0").unwrap())
        .await
        .unwrap()
        .expect("the prompt was promoted");
    assert!(prompt.interrupted, "the timed-out turn's prompt is marked");
    let after = sessions.prompt(queued(&t, "q2")).await.unwrap();
    let served = tokio::time::timeout(WAIT, sessions.await_served(&after))
        .await
        .unwrap();
    assert_eq!(served.unwrap(), Terminal::Succeeded);
    assert!(!testing::is_claimed(runtime.path(), &t).unwrap());
    runtime.stop().await;
}

#[actix_rt::test]
async fn a_turn_deadline_tighter_than_the_timeout_applies() {
    let runner = ScriptedRunner::new();
    // Far longer than the test waits: only the turn's own deadline can end it in time.
    let runtime = Harness::with(|b| b.turn_timeout(Duration::from_secs(3600)))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    runner.push(&s, {
        let seen = seen.clone();
        Script::custom(move |turn: Turn| {
            let seen = seen.clone();
            async move {
                let configured = turn.deadline().expect("the runtime's timeout applies");
                // A later call replaces an earlier one; the earlier of it and the timeout applies.
                turn.set_deadline(Instant::now() + Duration::from_secs(7200));
                let capped = turn.deadline() == Some(configured);
                turn.set_deadline(Instant::now() + Duration::from_secs(60));
                let later = turn.deadline().unwrap();
                turn.set_deadline(Instant::now() + Duration::from_millis(150));
                let tight = turn.deadline().unwrap();
                seen.lock()
                    .unwrap()
                    .push((capped, later < configured, tight < later));
                futures::future::pending::<()>().await;
                Ok(())
            }
        })
    });
    let ended = tokio::time::timeout(WAIT, runtime.execution().resume(&s))
        .await
        .expect("the turn's own deadline ends it");
    assert_eq!(ended.unwrap(), timed_out());
    assert_eq!(*seen.lock().unwrap(), [(true, true, true)]);
    assert_eq!(interruptions(&runtime, &s), [json!("timeout")]);
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());

    // With no timeout configured, a turn's own deadline applies alone.
    let runner = ScriptedRunner::new();
    let plain = Harness::start(&runner).await;
    let s = create(&plain, "s", None).await;
    runner.push(
        &s,
        Script::custom(|turn: Turn| async move {
            assert_eq!(turn.deadline(), None, "no deadline unless one is set");
            turn.set_deadline(Instant::now() + Duration::from_millis(100));
            futures::future::pending::<()>().await;
            Ok(())
        }),
    );
    let ended = tokio::time::timeout(WAIT, plain.execution().resume(&s))
        .await
        .unwrap();
    assert_eq!(ended.unwrap(), timed_out());
    plain.stop().await;
    runtime.stop().await;
}

#[actix_rt::test]
async fn a_turn_that_ends_in_time_is_unaffected() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.turn_timeout(Duration::from_millis(1500)))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    // Two turns of 800 ms each: together past the timeout, each within it (every turn's clock
    // starts with the turn).
    let working = || {
        Script::custom(|turn: Turn| async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            for input in turn.take_inputs().await? {
                turn.append_message("assistant", json!({ "reply_to": input.id }))
                    .await?;
            }
            Ok(())
        })
    };
    runner.push(&s, working());
    runner.push(&s, working());
    let sessions = runtime.sessions();
    let first = sessions.prompt(queued(&s, "q1")).await.unwrap();
    let served = tokio::time::timeout(WAIT, sessions.await_served(&first))
        .await
        .unwrap();
    assert_eq!(served.unwrap(), Terminal::Succeeded);
    let second = sessions.prompt(queued(&s, "q2")).await.unwrap();
    let served = tokio::time::timeout(WAIT, sessions.await_served(&second))
        .await
        .unwrap();
    assert_eq!(served.unwrap(), Terminal::Succeeded);
    assert!(interruptions(&runtime, &s).is_empty());
    assert_eq!(
        testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_SUCCEEDED)
            .unwrap()
            .len(),
        2
    );
    runtime.stop().await;
}

#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_deadlines_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_deadlines_suite");
}
