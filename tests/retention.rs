//! Retention (`RuntimeBuilder::retain_events`): compacting the event logs of idle sessions keeps
//! their transcript, inbox and durable interrupt fence, keeps seqs monotonic, and makes a replay
//! from before the compaction point fail clearly (`EventsCompacted`, naming where the log now
//! starts); sessions with a turn in flight are never compacted. And the write-ahead log: a clean
//! shutdown, or a writer gone idle, leaves it truncated.
//!
//! Each test runs on SQLite and, through `postgres_backend_passes_the_retention_suite`, on
//! PostgreSQL, except the write-ahead log's (SQLite only: PostgreSQL has no WAL file of ours).

mod common;

use std::time::Duration;

use durable_sessions::testing::{Script, ScriptedRunner};
use durable_sessions::{
    kind, Delivery, Error, MessagesQuery, Order, PromptInput, RetainEvents, SessionId, Sessions,
};
use serde_json::json;

use common::{count, create, text, Harness, WAIT};

/// A drain that promotes the pending `steer` prompts and answers each.
fn echo() -> Script {
    Script::custom(|turn| async move {
        for prompt in turn.promote_steer(None).await? {
            turn.append_message("assistant", json!({ "reply_to": prompt.id }))
                .await?;
        }
        Ok(())
    })
}

/// Admits a prompt and waits until the session is idle again.
async fn turn(sessions: &Sessions, session: &SessionId, prompt: &str) -> u64 {
    let admission = sessions
        .prompt(PromptInput::new(session.clone(), text(prompt)))
        .await
        .expect("prompt");
    // The wake is delivered before `prompt` returns: the turn is registered.
    sessions.await_idle(session).await.expect("idle");
    admission.admitted_seq
}

/// The seqs of the events `sessions.events(session, after)` replays before going live.
async fn replay(sessions: &Sessions, session: &SessionId, after: Option<u64>) -> Vec<u64> {
    let last = sessions.last_seq(session).await.expect("last seq");
    let mut stream = sessions.events(session, after).await.expect("stream");
    let mut seqs = Vec::new();
    while seqs.last().is_none_or(|&seq| seq < last) {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .expect("the read succeeds");
        seqs.push(event.seq);
    }
    seqs
}

/// Compacting a session's log (keep the newest 3 events) deletes its older events only: the
/// transcript, the pending inbox and the interrupt fence stay (a fenced queued prompt is still
/// not owed a turn, even after another turn and an exact retry), new events continue after the
/// newest seq, a replay from the start begins where the log now starts, and one from before
/// it is `EventsCompacted` naming that seq; a rebuild from the log is refused.
#[actix_rt::test]
async fn retention_keeps_the_transcript_and_seqs_monotonic() {
    let runner = ScriptedRunner::new();
    // Compacted only when the test asks (the periodic pass waits an hour).
    let policy = RetainEvents::new(3, Duration::ZERO).interval(Duration::from_secs(3600));
    let runtime = Harness::with(|b| b.retain_events(policy))
        .start(&runner)
        .await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    runner.set_default(&s, echo());
    turn(&sessions, &s, "one").await;
    // A queued prompt that the user's interrupt then fences.
    let fenced = sessions
        .prompt(
            PromptInput::new(s.clone(), text("fenced"))
                .with_delivery(Delivery::Queue)
                .with_resume(false),
        )
        .await
        .expect("queued prompt");
    assert!(!sessions.interrupt(&s).await.expect("interrupt"), "idle");
    turn(&sessions, &s, "two").await;
    turn(&sessions, &s, "three").await;

    let transcript = |sessions: Sessions, s: SessionId| async move {
        sessions
            .messages(MessagesQuery {
                order: Order::Asc,
                ..MessagesQuery::new(s)
            })
            .await
            .expect("messages")
    };
    let before = transcript(sessions.clone(), s.clone()).await;
    assert_eq!(before.len(), 6, "three prompts and three answers");
    let last = sessions.last_seq(&s).await.unwrap();
    let stored = count(runtime.path(), "SELECT COUNT(*) FROM event");
    assert_eq!(sessions.log_start(&s).await.unwrap(), 0);

    actix_rt::time::sleep(Duration::from_millis(5)).await; // the newest event is in the past
    assert_eq!(runtime.compact_events().await.unwrap(), 1);
    let start = last + 1 - 3;
    assert_eq!(sessions.log_start(&s).await.unwrap(), start);
    assert_eq!(
        runtime.compact_events().await.unwrap(),
        0,
        "nothing more to do"
    );
    // The newest three, plus the fence, hidden from replay.
    assert_eq!(count(runtime.path(), "SELECT COUNT(*) FROM event"), 4);
    assert!(stored > 4);
    assert_eq!(transcript(sessions.clone(), s.clone()).await, before);
    assert_eq!(sessions.context(&s).await.unwrap(), before);
    assert_eq!(replay(&sessions, &s, None).await, [start, start + 1, last]);
    assert_eq!(
        replay(&sessions, &s, Some(start - 1)).await,
        [start, start + 1, last]
    );
    match sessions.events(&s, Some(0)).await {
        Err(Error::EventsCompacted {
            session_id,
            first_seq,
        }) => assert_eq!((session_id, first_seq), (s.clone(), start)),
        other => panic!("expected EventsCompacted, got {other:?}"),
    }
    assert!(matches!(
        sessions.reproject(&s).await,
        Err(Error::EventsCompacted { first_seq, .. }) if first_seq == start
    ));
    let terminal = sessions
        .last_terminal(&s)
        .await
        .unwrap()
        .expect("a terminal");
    assert_eq!(terminal.kind, kind::EXECUTION_SUCCEEDED);

    // Seqs go on after the newest; the fence still holds the queued prompt back.
    let mut live = sessions.events(&s, Some(last)).await.unwrap();
    let next = turn(&sessions, &s, "four").await;
    assert_eq!(
        next,
        last + 1,
        "the first seq after the compacted log's newest"
    );
    let first_live = live.next().await.unwrap().unwrap();
    assert_eq!(
        (first_live.seq, first_live.kind.as_str()),
        (last + 1, kind::PROMPT_ADMITTED)
    );
    let retried = sessions
        .prompt(
            PromptInput::new(s.clone(), text("fenced"))
                .with_id(fenced.id.clone())
                .with_delivery(Delivery::Queue),
        )
        .await
        .expect("exact retry");
    assert_eq!(retried, fenced);
    let owed = format!(
        "SELECT COUNT(*) FROM session_input WHERE id = '{}' AND wake",
        fenced.id
    );
    assert_eq!(count(runtime.path(), &owed), 0, "still fenced");
    sessions.await_idle(&s).await.unwrap();
    let messages = sessions
        .messages(MessagesQuery::new(s.clone()))
        .await
        .unwrap();
    assert_eq!(messages.len(), 8, "the fenced prompt never ran");
    runtime.stop().await;
}

/// The runtime compacts on its own, every `interval`, the logs of sessions idle for
/// `after_idle` — never a session whose turn is in flight.
#[actix_rt::test]
async fn retention_runs_by_itself_and_spares_running_turns() {
    let runner = ScriptedRunner::new();
    let policy =
        RetainEvents::new(1, Duration::from_millis(20)).interval(Duration::from_millis(20));
    let runtime = Harness::with(|b| b.retain_events(policy))
        .start(&runner)
        .await;
    let sessions = runtime.sessions();
    let idle = create(&runtime, "idle", None).await;
    let busy = create(&runtime, "busy", None).await;
    runner.push(&busy, Script::Never);
    turn(&sessions, &idle, "done").await;
    sessions
        .prompt(PromptInput::new(busy.clone(), text("running")))
        .await
        .unwrap();
    runner.wait_for_drains_of(&busy, 1, WAIT).await;
    // The claim is committed: from here on no pass compacts `busy` (one may have, before).
    let busy_start = sessions.log_start(&busy).await.unwrap();

    let deadline = std::time::Instant::now() + WAIT;
    while sessions.log_start(&idle).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "never compacted");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    let last = sessions.last_seq(&idle).await.unwrap();
    assert_eq!(sessions.log_start(&idle).await.unwrap(), last);
    // Several passes later, the running turn's log is as it was, longer than the policy keeps.
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sessions.log_start(&busy).await.unwrap(), busy_start);
    assert!(sessions.last_seq(&busy).await.unwrap() > busy_start);
    assert!(sessions.active().contains(&busy));
    runtime.stop().await;
}

/// The step records of an open turn are never compacted, even across a shutdown that keeps
/// its claim: the resumed turn replays its completed steps instead of running them again.
/// Once the turn ended, its records are old events like any other.
#[actix_rt::test]
async fn compaction_never_takes_the_steps_of_an_open_turn() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let runner = ScriptedRunner::new();
    let policy = RetainEvents::new(1, Duration::ZERO).interval(Duration::from_secs(3600));
    let mut runtime = Harness::with(|b| b.retain_events(policy))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    let bodies = Arc::new(AtomicU32::new(0));
    let script = {
        let bodies = bodies.clone();
        Script::custom(move |turn: durable_sessions::Turn| {
            let bodies = bodies.clone();
            async move {
                for name in ["a", "b", "c"] {
                    turn.step::<String, _, _, _>(name, |_| async {
                        bodies.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(name.to_owned())
                    })
                    .await?;
                }
                if turn.attempt() == 1 {
                    futures::future::pending::<()>().await;
                }
                Ok(())
            }
        })
    };
    runner.set_default(&s, script);
    let handle = runtime.execution().start_resume(&s).await.unwrap();
    common::wait_for("three steps", || bodies.load(Ordering::SeqCst) == 3).await;
    let steps = |path: &std::path::Path| {
        durable_sessions::testing::events_of_kind(path, &s, kind::STEP_COMPLETED)
            .unwrap()
            .len()
    };
    actix_rt::time::sleep(Duration::from_millis(5)).await; // the newest event is in the past
    assert_eq!(runtime.compact_events().await.unwrap(), 0, "a turn is open");
    assert_eq!(steps(runtime.path()), 3);
    runtime.stop().await;
    handle.outcome().await.unwrap();
    // Shut down: the turn keeps its claim, so it is still open.
    runtime.restart(&runner, |b| b.retain_events(policy)).await;
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(runtime.compact_events().await.unwrap(), 0, "still open");
    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert_eq!(report.resumed, vec![s.clone()]);
    runner.wait_for_drains_of(&s, 2, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    assert_eq!(
        bodies.load(Ordering::SeqCst),
        3,
        "the completed steps replayed"
    );
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(runtime.compact_events().await.unwrap(), 1, "the turn ended");
    assert!(runtime.sessions().log_start(&s).await.unwrap() > 0);
    runtime.stop().await;
}

/// After a clean shutdown the write-ahead log is empty (or gone): the writer checkpointed and
/// truncated it after its last write.
#[actix_rt::test]
async fn a_clean_shutdown_leaves_the_wal_truncated() {
    if common::sqlite_only("a_clean_shutdown_leaves_the_wal_truncated") {
        return;
    }
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    for i in 0..20 {
        let s = create(&runtime, &format!("s{i}"), None).await;
        turn(&sessions, &s, "hello").await;
    }
    let wal = wal_path(runtime.path());
    assert!(wal_size(&wal) > 0, "the writes went to the WAL");
    runtime.stop().await;
    assert_eq!(wal_size(&wal), 0, "{} after shutdown", wal.display());
    // Nothing was lost on the way.
    assert_eq!(count(runtime.path(), "SELECT COUNT(*) FROM session"), 20);
}

/// A writer that has been idle for a moment truncates the write-ahead log by itself.
#[actix_rt::test]
async fn the_wal_is_truncated_once_the_writer_is_idle() {
    if common::sqlite_only("the_wal_is_truncated_once_the_writer_is_idle") {
        return;
    }
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    turn(&runtime.sessions(), &s, "hello").await;
    let wal = wal_path(runtime.path());
    let deadline = std::time::Instant::now() + WAIT;
    while wal_size(&wal) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the WAL was never truncated"
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    runtime.stop().await;
}

/// `<database>-wal`.
fn wal_path(db: &std::path::Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// The size of `path`, 0 when it does not exist.
fn wal_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_retention_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_retention_suite");
}
