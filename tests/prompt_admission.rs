//! Prompt admission (`Sessions::prompt`) on the real runtime: a SQLite file in a temp
//! directory, real session actors, and a `ScriptedRunner` whose drains (`forced` = resume,
//! `!forced` = wake) record which turns ran.
//!
//! Seqs are asserted relative to what the log holds, because two writes come before any
//! promotion: a session created through `Sessions::create` owns seq 0 (`session.created`), and
//! a real turn commits `session.execution.started` before its drain can promote anything.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::kind;
use durable_sessions::testing::{self, DrainRecord, Script, ScriptedRunner};
use durable_sessions::{
    Admission, Delivery, Error, MessageId, MessagesQuery, PromptInput, Reprojection, SessionId,
    Terminal,
};
use futures::future::join_all;
use serde_json::{json, Value};

use common::{count, create, mid, text, Harness, WAIT};

/// Inbox rows of `session`.
fn inputs_of(db: &Path, session: &SessionId) -> i64 {
    count(
        db,
        &format!("SELECT COUNT(*) FROM session_input WHERE session_id = '{session}'"),
    )
}

/// Stored `session.prompt.admitted` events of `session`.
fn admitted_events(db: &Path, session: &SessionId) -> usize {
    testing::events_of_kind(db, session, kind::PROMPT_ADMITTED)
        .expect("events")
        .len()
}

/// The inbox row `id` as stored: (session, admitted_seq, prompt, delivery, time, promoted_seq).
fn input_row(db: &Path, id: &MessageId) -> Option<(String, i64, Value, String, i64, Option<i64>)> {
    let rows = common::rows(
        db,
        "SELECT session_id, admitted_seq, prompt, delivery, time_created, promoted_seq \
         FROM session_input WHERE id = $1",
        &[id.as_str()],
    );
    let row = rows.into_iter().next()?;
    let text = |v: &Value| v.as_str().expect("text").to_owned();
    let int = |v: &Value| v.as_i64().expect("integer");
    Some((
        text(&row[0]),
        int(&row[1]),
        serde_json::from_str(row[2].as_str().expect("prompt")).expect("prompt json"),
        text(&row[3]),
        int(&row[4]),
        row[5].as_i64(),
    ))
}

/// A prompt that only records (no wake).
fn quiet(session: &SessionId, id: Option<&str>, prompt: Value) -> PromptInput {
    let input = PromptInput::new(session.clone(), prompt).with_resume(false);
    match id {
        Some(id) => input.with_id(mid(id)),
        None => input,
    }
}

fn wake_drain(session: &SessionId, seq: u64) -> DrainRecord {
    DrainRecord {
        session_id: session.clone(),
        forced: false,
        wake_seq: Some(seq),
    }
}

/// Lets anything wrongly scheduled show up before asserting it did not happen.
async fn settle() {
    actix_rt::time::sleep(Duration::from_millis(50)).await;
}

/// `active` on the session service is the execution registry's set.
#[actix_rt::test]
async fn exposes_the_execution_registry() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    assert!(sessions.active().is_empty());

    runner.push(&s, Script::Never);
    sessions
        .prompt(PromptInput::new(s.clone(), text("go")))
        .await
        .unwrap();
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    assert_eq!(sessions.active(), runtime.execution().active());
    assert_eq!(
        sessions.active().into_iter().collect::<Vec<_>>(),
        vec![s.clone()]
    );

    assert!(sessions.interrupt(&s).await.unwrap());
    sessions.await_idle(&s).await.unwrap();
    assert!(sessions.active().is_empty());
    assert_eq!(sessions.active(), runtime.execution().active());
    runtime.stop().await;
}

/// `resume` runs a forced turn through the execution (a resume, not a wake) and returns its
/// outcome; an unknown session is `NotFound`.
#[actix_rt::test]
async fn delegates_execution_continuation_through_session_execution() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    assert_eq!(sessions.resume(&s).await.unwrap(), Terminal::Succeeded);
    assert_eq!(
        runner.drains(),
        vec![DrainRecord {
            session_id: s.clone(),
            forced: true,
            wake_seq: None
        }]
    );
    let ghost = SessionId::new("ghost").unwrap();
    assert!(matches!(
        sessions.resume(&ghost).await,
        Err(Error::NotFound { session_id }) if session_id == ghost
    ));
    assert_eq!(runner.drains().len(), 1);
    runtime.stop().await;
}

/// `interrupt` records `session.interrupt.requested`, interrupts the running turn as a user
/// interrupt (released claim) and adds no message.
#[actix_rt::test]
async fn delegates_process_local_interruption_through_session_execution() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    runner.push(&s, Script::Never);
    let running = actix_rt::spawn({
        let (sessions, s) = (sessions.clone(), s.clone());
        async move { sessions.resume(&s).await }
    });
    runner.wait_for_drains_of(&s, 1, WAIT).await;

    assert!(sessions.interrupt(&s).await.unwrap());
    assert_eq!(
        running.await.unwrap().unwrap(),
        Terminal::Interrupted {
            reason: durable_sessions::InterruptReason::User
        }
    );
    let requested = testing::events_of_kind(runtime.path(), &s, kind::INTERRUPT_REQUESTED).unwrap();
    assert_eq!(requested.len(), 1);
    assert_eq!(requested[0].data, json!({ "sessionID": "s" }));
    let interrupted =
        testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_INTERRUPTED).unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].data, json!({ "reason": "user" }));
    assert!(requested[0].seq < interrupted[0].seq);
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    assert!(sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        count(runtime.path(), "SELECT COUNT(*) FROM session_message"),
        0
    );
    runtime.stop().await;
}

/// Interrupting an id with no stored session delegates a seq-less interrupt: no error, nothing
/// recorded, no session created.
#[actix_rt::test]
async fn delegates_interruption_without_requiring_a_recorded_session() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let ghost = SessionId::new("ghost").unwrap();
    let events_before = count(runtime.path(), "SELECT COUNT(*) FROM event");

    assert!(!sessions.interrupt(&ghost).await.unwrap());
    assert!(testing::events(runtime.path(), &ghost).unwrap().is_empty());
    assert_eq!(
        count(runtime.path(), "SELECT COUNT(*) FROM event"),
        events_before
    );
    assert!(matches!(
        sessions.get(&ghost).await,
        Err(Error::NotFound { .. })
    ));
    assert!(runner.drains().is_empty());
    runtime.stop().await;
}

/// Admission stores the prompt in the inbox (`steer`, pending) and leaves the transcript empty
/// until a turn promotes it.
#[actix_rt::test]
async fn durably_admits_one_user_message_before_transcript_promotion() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let admission = sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    assert_eq!(admission.delivery, Delivery::Steer);
    assert_eq!(admission.promoted_seq, None);
    assert!(sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap()
        .is_empty());
    let (session, admitted, prompt, delivery, _, promoted) =
        input_row(runtime.path(), &mid("m1")).unwrap();
    assert_eq!(
        (
            session.as_str(),
            admitted,
            prompt,
            delivery.as_str(),
            promoted
        ),
        (
            "s",
            admission.admitted_seq as i64,
            text("hello"),
            "steer",
            None
        )
    );

    // A turn promotes it: only now is it a user message of the transcript.
    runner.push(
        &s,
        Script::custom(|turn| async move {
            turn.promote_steer(None).await?;
            Ok(())
        }),
    );
    sessions.resume(&s).await.unwrap();
    let messages = sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(
        (messages[0].id.as_str(), messages[0].kind.as_str()),
        ("m1", "user")
    );
    assert_eq!(messages[0].data, json!({ "prompt": text("hello") }));
    runtime.stop().await;
}

/// `events(after)` yields the durable log strictly after `after`, in order: the two admissions,
/// then (inside the turn that promotes them) the two promotions. Seq 0 is `session.created` and
/// the promotions follow `session.execution.started`, so the admissions are seqs 1 and 2 and
/// the promotions 4 and 5; "after X yields X+1 first" holds for X = 0 and for X = the first
/// admission.
#[actix_rt::test]
async fn streams_durable_session_events_after_an_aggregate_sequence() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let first = sessions
        .prompt(quiet(&s, Some("m1"), text("one")))
        .await
        .unwrap();
    let second = sessions
        .prompt(quiet(&s, Some("m2"), text("two")))
        .await
        .unwrap();
    assert_eq!((first.admitted_seq, second.admitted_seq), (1, 2));
    runner.push(
        &s,
        Script::custom(|turn| async move {
            turn.promote_steer(None).await?;
            Ok(())
        }),
    );
    sessions.resume(&s).await.unwrap();

    let mut stream = sessions.events(&s, None).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..7 {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push((event.seq, event.kind.clone()));
    }
    let expected: Vec<(u64, String)> = [
        kind::CREATED,
        kind::PROMPT_ADMITTED,
        kind::PROMPT_ADMITTED,
        kind::EXECUTION_STARTED,
        kind::PROMPT_PROMOTED,
        kind::PROMPT_PROMOTED,
        kind::EXECUTION_SUCCEEDED,
    ]
    .iter()
    .enumerate()
    .map(|(seq, k)| (seq as u64, (*k).to_string()))
    .collect();
    assert_eq!(seen, expected);

    let mut after_zero = sessions.events(&s, Some(0)).await.unwrap();
    let event = after_zero.next().await.unwrap().unwrap();
    assert_eq!((event.seq, event.kind.as_str()), (1, kind::PROMPT_ADMITTED));
    assert_eq!(event.data["messageID"], json!("m1"));

    let mut after_first = sessions.events(&s, Some(first.admitted_seq)).await.unwrap();
    let event = after_first.next().await.unwrap().unwrap();
    assert_eq!(event.seq, first.admitted_seq + 1);
    assert_eq!(event.data["messageID"], json!("m2"));
    runtime.stop().await;
}

/// `resume` drains the recorded prompt's session once (forced) without appending another
/// prompt, promoting anything, or waking.
#[actix_rt::test]
async fn resumes_through_a_recorded_message_without_appending_another_prompt() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();

    assert_eq!(sessions.resume(&s).await.unwrap(), Terminal::Succeeded);
    let drains = runner.drains();
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert!(
        drains[0].forced && drains[0].wake_seq.is_none(),
        "{drains:?}"
    );
    assert_eq!(
        input_row(runtime.path(), &mid("m1")).unwrap().5,
        None,
        "no promoted seq"
    );
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(admitted_events(runtime.path(), &s), 1);
    assert!(sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap()
        .is_empty());
    runtime.stop().await;
}

/// Without an id every prompt gets a fresh one: two identical prompts are two inputs.
#[actix_rt::test]
async fn records_distinct_messages_when_the_id_is_omitted() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let a = sessions
        .prompt(quiet(&s, None, text("same")))
        .await
        .unwrap();
    let b = sessions
        .prompt(quiet(&s, None, text("same")))
        .await
        .unwrap();
    assert_ne!(a.id, b.id);
    assert_ne!(a.admitted_seq, b.admitted_seq);
    assert_eq!(inputs_of(runtime.path(), &s), 2);
    assert_eq!(admitted_events(runtime.path(), &s), 2);
    runtime.stop().await;
}

/// An exact retry of an id returns the stored admission and writes nothing more.
#[actix_rt::test]
async fn returns_the_original_recorded_message_when_the_id_is_retried() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let first = sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    let again = sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(admitted_events(runtime.path(), &s), 1);
    runtime.stop().await;
}

/// A prompt committed with `resume: false` is recovered by an exact retry with `resume: true`:
/// the retry writes nothing and wakes the session once, with the original admission seq.
#[actix_rt::test]
async fn wakes_execution_when_an_exact_prompt_retry_recovers_a_committed_message() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let first = sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    assert!(sessions.active().is_empty());
    settle().await;
    assert!(runner.drains().is_empty());

    let retry = PromptInput::new(s.clone(), text("hello")).with_id(mid("m1"));
    let again = sessions.prompt(retry).await.unwrap();
    assert_eq!(again, first);
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    sessions.await_idle(&s).await.unwrap();
    assert_eq!(runner.drains(), vec![wake_drain(&s, first.admitted_seq)]);
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(admitted_events(runtime.path(), &s), 1);
    runtime.stop().await;
}

/// Reusing an id with another prompt is `PromptConflict`, and nothing is written.
#[actix_rt::test]
async fn rejects_reuse_of_one_id_with_a_different_prompt() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    let events = testing::events(runtime.path(), &s).unwrap().len();

    let result = sessions.prompt(quiet(&s, Some("m1"), text("other"))).await;
    assert!(
        matches!(&result, Err(Error::PromptConflict { session_id, message_id })
            if session_id == &s && message_id.as_str() == "m1"),
        "{result:?}"
    );
    assert!(sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(
        input_row(runtime.path(), &mid("m1")).unwrap().2,
        text("hello")
    );
    assert_eq!(testing::events(runtime.path(), &s).unwrap().len(), events);
    runtime.stop().await;
}

/// Reusing an id with another delivery mode is `PromptConflict`, and nothing is written.
#[actix_rt::test]
async fn rejects_reuse_of_one_id_with_a_different_delivery_mode() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    let events = testing::events(runtime.path(), &s).unwrap().len();

    let queued = quiet(&s, Some("m1"), text("hello")).with_delivery(Delivery::Queue);
    let result = sessions.prompt(queued).await;
    assert!(
        matches!(&result, Err(Error::PromptConflict { session_id, message_id })
            if session_id == &s && message_id.as_str() == "m1"),
        "{result:?}"
    );
    assert!(sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(input_row(runtime.path(), &mid("m1")).unwrap().3, "steer");
    assert_eq!(testing::events(runtime.path(), &s).unwrap().len(), events);
    runtime.stop().await;
}

/// Twenty concurrent exact retries of one id get one answer, one input row and exactly one
/// `session.prompt.admitted` event.
#[actix_rt::test]
async fn returns_one_recorded_message_to_concurrent_exact_retries() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let attempts = (0..20).map(|_| {
        let sessions = sessions.clone();
        let input = quiet(&s, Some("m1"), text("hello"));
        async move { sessions.prompt(input).await }
    });
    let results: Vec<Admission> = join_all(attempts)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(results.iter().all(|r| r == &results[0]), "{results:?}");
    assert_eq!(inputs_of(runtime.path(), &s), 1);
    assert_eq!(admitted_events(runtime.path(), &s), 1);
    runtime.stop().await;
}

/// Concurrent promotion attempts inside one turn promote the input exactly once: one promoted
/// event, whose seq is the input's `promoted_seq`, and one user message in the transcript.
/// (The promotion follows `session.created`, the admission and `session.execution.started`.)
#[actix_rt::test]
async fn promotes_one_message_once_under_concurrent_promotion_attempts() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let admission = sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();

    let promoted = Arc::new(Mutex::new(Vec::new()));
    runner.push(&s, {
        let promoted = promoted.clone();
        Script::custom(move |turn| {
            let promoted = promoted.clone();
            async move {
                let attempts = (0..8).map(|i| {
                    let turn = turn.clone();
                    async move {
                        if i % 2 == 0 {
                            turn.promote_steer(None).await
                        } else {
                            turn.promote_steer(Some(u64::MAX)).await
                        }
                    }
                });
                for result in join_all(attempts).await {
                    promoted.lock().unwrap().extend(result?);
                }
                Ok(())
            }
        })
    });
    assert_eq!(sessions.resume(&s).await.unwrap(), Terminal::Succeeded);

    let promoted = promoted.lock().unwrap().clone();
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    let events = testing::events_of_kind(runtime.path(), &s, kind::PROMPT_PROMOTED).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].data,
        json!({ "messageID": "m1", "prompt": text("hello"), "delivery": "steer" })
    );
    assert_eq!(promoted[0].promoted_seq, Some(events[0].seq));
    assert_eq!(events[0].seq, admission.admitted_seq + 2);
    assert_eq!(
        input_row(runtime.path(), &mid("m1")).unwrap().5,
        Some(events[0].seq as i64)
    );
    let transcript = sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap();
    let shape: Vec<_> = transcript
        .iter()
        .map(|m| (m.id.as_str(), m.kind.as_str(), m.seq, m.data.clone()))
        .collect();
    assert_eq!(
        shape,
        vec![(
            "m1",
            "user",
            events[0].seq,
            json!({ "prompt": text("hello") })
        )]
    );
    runtime.stop().await;
}

/// Deleting the inbox and replaying the log rebuilds the pending input row as it was, without
/// waking the session or publishing anything.
#[actix_rt::test]
async fn reprojects_pending_inbox_input_without_scheduling_execution() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, Some("m1"), text("hello")))
        .await
        .unwrap();
    let before = input_row(runtime.path(), &mid("m1")).unwrap();
    let events = count(runtime.path(), "SELECT COUNT(*) FROM event");

    common::execute(runtime.path(), "DELETE FROM session_input", &[]);
    assert_eq!(inputs_of(runtime.path(), &s), 0);

    let rebuilt = sessions.reproject(&s).await.unwrap();
    assert_eq!(
        rebuilt,
        Reprojection {
            events: 1,
            inputs: 1,
            messages: 0
        }
    );
    assert_eq!(input_row(runtime.path(), &mid("m1")), Some(before));
    assert_eq!(count(runtime.path(), "SELECT COUNT(*) FROM event"), events);
    assert!(sessions.active().is_empty());
    settle().await;
    assert!(runner.drains().is_empty());
    assert!(matches!(
        sessions.reproject(&SessionId::new("ghost").unwrap()).await,
        Err(Error::NotFound { .. })
    ));
    runtime.stop().await;
}

/// Message ids are global: an id admitted in one session conflicts in another, naming the
/// session that holds it (`other`), and nothing is written.
#[actix_rt::test]
async fn rejects_reuse_of_one_globally_unique_message_id_across_sessions() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let other = create(&runtime, "other", None).await;
    sessions
        .prompt(quiet(&other, Some("m1"), text("hello")))
        .await
        .unwrap();
    let events = testing::events(runtime.path(), &s).unwrap().len();

    let result = sessions.prompt(quiet(&s, Some("m1"), text("hello"))).await;
    assert!(
        matches!(&result, Err(Error::PromptConflict { session_id, message_id })
            if session_id == &other && message_id.as_str() == "m1"),
        "{result:?}"
    );
    assert_eq!(inputs_of(runtime.path(), &s), 0);
    assert_eq!(inputs_of(runtime.path(), &other), 1);
    assert_eq!(testing::events(runtime.path(), &s).unwrap().len(), events);
    runtime.stop().await;
}

/// An id already in the visible transcript (here an assistant message a turn appended) cannot
/// be a prompt id: `PromptConflict`, no input row, no event.
#[actix_rt::test]
async fn rejects_a_prompt_id_already_used_by_visible_session_history() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let appended = Arc::new(Mutex::new(None));
    runner.push(&s, {
        let appended = appended.clone();
        Script::custom(move |turn| {
            let appended = appended.clone();
            async move {
                let id = turn
                    .append_message("assistant", json!({ "text": "hi" }))
                    .await?;
                *appended.lock().unwrap() = Some(id);
                Ok(())
            }
        })
    });
    sessions.resume(&s).await.unwrap();
    let id = appended.lock().unwrap().clone().unwrap();
    assert!(sessions.message(&s, &id).await.unwrap().is_some());
    let events = testing::events(runtime.path(), &s).unwrap().len();

    let input = PromptInput::new(s.clone(), text("hello")).with_id(id.clone());
    let result = sessions.prompt(input).await;
    assert!(
        matches!(&result, Err(Error::PromptConflict { session_id, message_id })
            if session_id == &s && message_id == &id),
        "{result:?}"
    );
    assert_eq!(input_row(runtime.path(), &id), None);
    assert_eq!(inputs_of(runtime.path(), &s), 0);
    assert_eq!(testing::events(runtime.path(), &s).unwrap().len(), events);
    assert_eq!(runner.drains().len(), 1);
    runtime.stop().await;
}

/// By default the prompt is recorded and the session woken (not resumed) with its admission
/// seq.
#[actix_rt::test]
async fn starts_execution_by_default_after_recording_the_prompt() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let admission = sessions
        .prompt(PromptInput::new(s.clone(), text("go")))
        .await
        .unwrap();
    assert!(input_row(runtime.path(), &admission.id).is_some());
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    sessions.await_idle(&s).await.unwrap();
    assert_eq!(
        runner.drains(),
        vec![wake_drain(&s, admission.admitted_seq)]
    );
    runtime.stop().await;
}

/// `resume: true` wakes the session with the admission seq, as the default does.
#[actix_rt::test]
async fn starts_execution_when_resume_is_explicitly_true() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let input = PromptInput::new(s.clone(), text("go")).with_resume(true);
    let admission = sessions.prompt(input).await.unwrap();
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    sessions.await_idle(&s).await.unwrap();
    assert_eq!(
        runner.drains(),
        vec![wake_drain(&s, admission.admitted_seq)]
    );
    runtime.stop().await;
}

/// `resume: false` only records the prompt: no wake, no resume, no turn.
#[actix_rt::test]
async fn only_records_the_prompt_when_resume_is_false() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let admission = sessions
        .prompt(quiet(&s, None, text("later")))
        .await
        .unwrap();
    assert!(input_row(runtime.path(), &admission.id).is_some());
    assert!(sessions.active().is_empty());
    settle().await;
    assert!(runner.drains().is_empty());
    assert!(
        testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_STARTED)
            .unwrap()
            .is_empty()
    );
    runtime.stop().await;
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_prompt_admission_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_prompt_admission_suite");
}
