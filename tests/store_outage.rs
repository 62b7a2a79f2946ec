//! A store that fails under a running turn (SQLite): the database file and its WAL made
//! immutable (`chattr +i`, root only) while a turn streams its reply, then writable again.
//!
//! An open claim is the truth: the turn whose writes the store refused stays claimed, nothing
//! claims over it, and once the store answers it is resumed exactly as after a crash (restart
//! notice, an attempt counted, `Turn::resumption` naming the prompt it had promoted) — or its
//! terminal, when only that failed, is retried until the store takes it. Every acknowledged
//! prompt is answered once.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::testing::{Gate, Script, ScriptedRunner};
use durable_sessions::{
    Admission, CreateSession, Error, MessageId, PromptInput, Runtime, SessionId, Sessions,
    Terminal, Turn,
};
use serde_json::json;
use tokio::sync::Notify;

use common::{is_root, ReadOnly, StoreView, TestDb, WAIT};

/// The resume budget of these runtimes.
const MAX_ATTEMPTS: u32 = 3;

/// Says why the test cannot run here; under `CI=true` that is a failure.
fn skip(why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "store_outage: cannot run under CI: {why}"
    );
    eprintln!("store_outage: skipped: {why}");
}

/// The database file and its WAL made immutable (the `-shm` file is memory-mapped: an
/// immutable mapped file faults the process); undone on drop.
fn freeze(db: &Path) -> Option<ReadOnly> {
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    ReadOnly::set(&[db.to_path_buf(), wal])
}

/// Appends an `assistant` reply (`{"reply_to"}`) to every user message of the transcript that
/// has none and that no user interrupted.
async fn answer(turn: &Turn) -> Result<(), durable_sessions::RunError> {
    let transcript = turn.context().await?;
    let answered: Vec<&str> = transcript
        .iter()
        .filter(|m| m.kind == "assistant")
        .filter_map(|m| m.data.get("reply_to").and_then(|v| v.as_str()))
        .collect();
    let owed: Vec<String> = transcript
        .iter()
        .filter(|m| m.kind == "user" && !m.interrupted)
        .map(|m| m.id.to_string())
        .filter(|id| !answered.contains(&id.as_str()))
        .collect();
    for id in owed {
        let reply = json!({ "reply_to": id, "text": format!("echo: {id}") });
        turn.append_message("assistant", reply).await?;
    }
    Ok(())
}

/// What the runner of these tests saw.
#[derive(Default)]
struct Seen {
    /// The prompts each resumed drain's resumption named, in order of the drains.
    resumptions: Mutex<Vec<(u32, Vec<String>)>>,
}

/// A runner that promotes what is pending, stops once (the first drain) where `stop` says —
/// `"reply"` before its reply, `"end"` after it — telling `reached` and waiting for `go`,
/// then answers every owed prompt.
fn runner(stop: &'static str, reached: Arc<Notify>, go: Gate, seen: Arc<Seen>) -> ScriptedRunner {
    let runner = ScriptedRunner::new();
    let first = Arc::new(AtomicBool::new(true));
    let script = Script::custom(move |turn| {
        let (reached, go, seen, first) = (reached.clone(), go.clone(), seen.clone(), first.clone());
        async move {
            if let Some(resumption) = turn.resumption() {
                let inputs = resumption.inputs.iter().map(|a| a.id.to_string()).collect();
                seen.resumptions
                    .lock()
                    .unwrap()
                    .push((resumption.attempt, inputs));
            }
            turn.promote_steer(None).await?;
            let hold = first.swap(false, Ordering::SeqCst);
            if hold && stop == "reply" {
                reached.notify_one();
                go.wait().await;
            }
            answer(&turn).await?;
            if hold && stop == "end" {
                reached.notify_one();
                go.wait().await;
            }
            Ok(())
        }
    });
    runner.set_default(&SessionId::new("a").unwrap(), script);
    runner
}

async fn start(db: &TestDb, runner: &ScriptedRunner) -> (Runtime, Sessions, SessionId) {
    let runtime = Runtime::builder()
        .database(&db.path)
        .runner(runner.clone())
        .max_resume_attempts(MAX_ATTEMPTS)
        .start()
        .await
        .unwrap();
    let sessions = runtime.sessions();
    let id = SessionId::new("a").unwrap();
    sessions
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/outage".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    (runtime, sessions, id)
}

async fn prompt(sessions: &Sessions, session: &SessionId, id: &str) -> Result<Admission, Error> {
    sessions
        .prompt(
            PromptInput::new(session.clone(), json!({ "text": id }))
                .with_id(MessageId::new(id).unwrap())
                .with_resume(true),
        )
        .await
}

/// Asserts `result` is a store error that says the store is unavailable.
#[track_caller]
fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::Store(e)) if e.unavailable().is_some() => {}
        other => panic!("expected a store-unavailable error, got {other:?}"),
    }
}

/// Every invariant of the store, nothing claimed or pending, and each of `prompts` answered
/// exactly once.
fn assert_answered_once(view: &StoreView, prompts: &[&str]) {
    view.assert_invariants(MAX_ATTEMPTS, "after the outage");
    assert!(view.claimed().is_empty(), "claims {:?}", view.claimed());
    assert!(view.pending().is_empty(), "pending {:?}", view.pending());
    let replies = view.replies();
    for id in prompts {
        assert_eq!(replies.get(*id), Some(&1), "{id}: replies {replies:?}");
    }
}

/// The store becomes read-only while a turn streams its reply: the reply's append fails, the
/// turn stays claimed (running, no terminal) while a new prompt is refused as unavailable;
/// once writable, the turn is resumed in place with the restart notice and its resumption
/// names the prompt it had promoted; it answers that prompt, and the refused prompt's exact
/// retry is answered after it. The log never claims over the open claim.
#[test]
fn a_store_fault_mid_turn_resumes_the_turn_once_the_store_is_back() {
    if !is_root() {
        return skip("needs root for chattr +i on files the runtime holds open");
    }
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let (reached, go, seen) = (Arc::new(Notify::new()), Gate::new(), Arc::default());
        let runner = runner("reply", reached.clone(), go.clone(), Arc::clone(&seen));
        let (runtime, sessions, a) = start(&db, &runner).await;
        prompt(&sessions, &a, "p1").await.unwrap();
        tokio::time::timeout(WAIT, reached.notified())
            .await
            .expect("the turn reaches its reply");
        let Some(frozen) = freeze(&db.path) else {
            runtime.shutdown().await;
            return skip("chattr +i failed on this filesystem");
        };
        go.release();
        // The turn's reply cannot be written: it stays claimed and in flight here.
        assert_unavailable(prompt(&sessions, &a, "p2").await);
        assert!(sessions.active().contains(&a), "the turn is kept");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(sessions.active().contains(&a), "the turn is kept");
        drop(frozen);

        prompt(&sessions, &a, "p2")
            .await
            .expect("the exact retry, once writable");
        tokio::time::timeout(WAIT, runtime.execution().await_idle(&a))
            .await
            .expect("the session settles")
            .unwrap();
        let resumptions = seen.resumptions.lock().unwrap().clone();
        assert_eq!(resumptions, [(1, vec!["p1".to_owned()])]);
        let view = StoreView::read(&db.path);
        assert_answered_once(&view, &["p1", "p2"]);
        assert_eq!(
            view.notices("a"),
            1,
            "resumed once, with the restart notice"
        );
        runtime.shutdown().await;
    });
}

/// The store becomes read-only after the turn's reply, as it records its terminal: the
/// terminal is retried until the store takes it, and a prompt admitted meanwhile runs after
/// it, never claiming over the open claim; the turn is recorded `succeeded` once.
#[test]
fn a_failed_terminal_is_retried_and_never_claimed_over() {
    if !is_root() {
        return skip("needs root for chattr +i on files the runtime holds open");
    }
    let db = TestDb::new();
    actix_rt::System::new().block_on(async {
        let (reached, go, seen) = (Arc::new(Notify::new()), Gate::new(), Arc::default());
        let runner = runner("end", reached.clone(), go.clone(), Arc::clone(&seen));
        let (runtime, sessions, a) = start(&db, &runner).await;
        prompt(&sessions, &a, "p1").await.unwrap();
        tokio::time::timeout(WAIT, reached.notified())
            .await
            .expect("the turn reaches its end");
        let Some(frozen) = freeze(&db.path) else {
            runtime.shutdown().await;
            return skip("chattr +i failed on this filesystem");
        };
        go.release();
        // Its terminal fails to commit, and is retried with backoff.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(sessions.active().contains(&a), "the turn is kept");
        drop(frozen);
        // Admitted before the retry lands (its backoff is longer than this takes): it waits
        // for the terminal, then runs in a turn of its own.
        prompt(&sessions, &a, "p2").await.unwrap();
        tokio::time::timeout(WAIT, runtime.execution().await_idle(&a))
            .await
            .expect("the session settles")
            .unwrap();
        assert!(
            seen.resumptions.lock().unwrap().is_empty(),
            "nothing resumed"
        );
        let view = StoreView::read(&db.path);
        assert_answered_once(&view, &["p1", "p2"]);
        assert_eq!(view.notices("a"), 0);
        assert_eq!(view.count_kind("a", "session.execution.succeeded"), 2);
        assert_eq!(
            runtime.execution().resume(&a).await.unwrap(),
            Terminal::Succeeded
        );
        runtime.shutdown().await;
    });
}
