//! Deleting sessions (`Sessions::delete`): every row of the session and of the sessions below
//! it goes in one transaction, its open event streams end with `session.deleted`, prompts into
//! it answer `NotFound`, the same id can be created afresh; a turn in flight blocks the
//! deletion unless it is forced, which interrupts the turn first. Each test runs on SQLite and,
//! through `postgres_backend_passes_the_deletion_suite`, on PostgreSQL.

mod common;

use std::path::Path;

use durable_sessions::testing::{self, Script, ScriptedRunner};
use durable_sessions::{kind, Error, PromptInput, SessionEvents, SessionId};
use serde_json::json;

use common::{create, rows, text, Harness, WAIT};

/// Every table keyed by a session, with its key column: the four tables both backends have,
/// then each backend's own (the seq counter of PostgreSQL; the claims of SQLite, which hold a
/// row only while a session is claimed, its logs' numbers and its logs' seq floors).
fn session_tables(db: &Path) -> Vec<(&'static str, &'static str)> {
    let mut tables = vec![
        ("session", "id"),
        ("session_input", "session_id"),
        ("session_message", "session_id"),
        ("event", "aggregate_id"),
    ];
    if is_postgres(db) {
        tables.push(("event_sequence", "aggregate_id"));
    } else {
        tables.extend([
            ("session_claim", "session_id"),
            ("event_stream", "aggregate_id"),
            ("event_floor", "aggregate_id"),
        ]);
    }
    tables
}

fn is_postgres(db: &Path) -> bool {
    db.to_str().is_some_and(|p| p.starts_with("postgres"))
}

/// The rows `session` has in each of [`session_tables`].
fn rows_of(db: &Path, session: &SessionId) -> Vec<i64> {
    session_tables(db)
        .into_iter()
        .map(|(table, key)| {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE {key} = $1");
            rows(db, &sql, &[session.as_str()])[0][0]
                .as_i64()
                .expect("a count")
        })
        .collect()
}

/// The rows of an idle session in the backend's own tables of [`session_tables`]: the seq
/// counter's; or no claim, its log's number and no floor.
fn idle_own_rows(db: &Path) -> Vec<i64> {
    if is_postgres(db) {
        vec![1]
    } else {
        vec![0, 1, 0]
    }
}

/// No row in any of [`session_tables`].
fn no_rows(db: &Path) -> Vec<i64> {
    vec![0; session_tables(db).len()]
}

/// A drain that promotes the pending prompts and answers each with an assistant message.
fn echo() -> Script {
    Script::custom(|turn| async move {
        for prompt in turn.promote_steer(None).await? {
            turn.append_message("assistant", json!({ "reply_to": prompt.id }))
                .await?;
        }
        Ok(())
    })
}

/// Reads `stream` to its end; panics if it does not end within [`WAIT`].
async fn read_to_end(stream: &mut SessionEvents) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, stream.next()).await {
            Ok(Some(Ok(event))) => seen.push((event.seq, event.kind.clone())),
            Ok(Some(Err(e))) => panic!("the stream failed: {e}"),
            Ok(None) => return seen,
            Err(_) => panic!("the stream did not end; it yielded {seen:?}"),
        }
    }
}

/// A session with a parent, a child and a grandchild: deleting the parent removes every row of
/// all three from every session-keyed table (inbox, transcript, log, seq counter, row) in one
/// call, leaves another session untouched, ends the open event streams of the deleted
/// sessions with their `session.deleted` (the seq after their last event), and afterwards
/// the id is unknown to every read and to prompts, until it is created again, afresh.
#[actix_rt::test]
async fn deleting_a_session_removes_every_row_and_ends_its_streams() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let parent = create(&runtime, "parent", None).await;
    let child = create(&runtime, "child", Some(&parent)).await;
    let grandchild = create(&runtime, "grandchild", Some(&child)).await;
    let other = create(&runtime, "other", None).await;
    let family = [&parent, &child, &grandchild, &other];
    for session in family {
        runner.set_default(session, echo());
        sessions
            .prompt(PromptInput::new(session.clone(), text("hello")))
            .await
            .expect("prompt");
        // A prompt left pending in the inbox.
        sessions
            .prompt(PromptInput::new(session.clone(), text("later")).with_resume(false))
            .await
            .expect("quiet prompt");
    }
    runner.wait_for_drains(family.len(), WAIT).await;
    for session in family {
        sessions.await_idle(session).await.expect("idle");
        let counts = rows_of(runtime.path(), session);
        assert!(counts[..4].iter().all(|&n| n > 0), "{session}: {counts:?}");
        assert_eq!(counts[4..], idle_own_rows(runtime.path()), "{session}");
    }
    let other_rows = rows_of(runtime.path(), &other);

    let mut streams = Vec::new();
    for session in [&parent, &child] {
        let last = sessions.last_seq(session).await.expect("last seq");
        let stream = sessions.events(session, Some(last)).await.expect("stream");
        streams.push((session, last, stream));
    }

    let deleted = sessions.delete(&parent, false).await.expect("delete");
    assert_eq!(deleted[0], parent, "the requested session first");
    let mut below: Vec<&SessionId> = deleted[1..].iter().collect();
    below.sort();
    assert_eq!(below, [&child, &grandchild], "{deleted:?}");
    for session in [&parent, &child, &grandchild] {
        let counts = rows_of(runtime.path(), session);
        assert!(counts.iter().all(|&n| n == 0), "{session}: {counts:?}");
    }
    assert_eq!(
        rows_of(runtime.path(), &other),
        other_rows,
        "others untouched"
    );

    for (session, last, stream) in &mut streams {
        assert_eq!(
            read_to_end(stream).await,
            [(*last + 1, kind::DELETED.to_owned())],
            "the stream of {session} ends with its deletion"
        );
    }

    assert!(matches!(
        sessions.get(&parent).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        sessions.get(&grandchild).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        sessions
            .prompt(PromptInput::new(parent.clone(), text("too late")))
            .await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        sessions.events(&child, None).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        sessions.delete(&parent, true).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        rows_of(runtime.path(), &parent),
        no_rows(runtime.path()),
        "nothing resurrected"
    );

    // The same id again is a fresh session: no parent's leftovers, seqs from 0.
    create(&runtime, "parent", None).await;
    let mut fresh = sessions.events(&parent, None).await.expect("stream");
    let first = fresh.next().await.expect("an event").expect("read");
    assert_eq!((first.seq, first.kind.as_str()), (0, kind::CREATED));
    assert_eq!(
        rows_of(runtime.path(), &parent),
        [vec![1, 0, 0, 1], idle_own_rows(runtime.path())].concat()
    );
    assert!(sessions
        .messages(durable_sessions::MessagesQuery::new(parent.clone()))
        .await
        .expect("messages")
        .is_empty());
    runtime.stop().await;
}

/// A turn in flight blocks a deletion (`SessionBusy`, nothing written) — whether it runs in
/// this process (in the session itself or in a child) or is a claim an earlier process left
/// for the restart sweep — unless it is forced: then the running turn is interrupted as a
/// user interrupt, its streams see `interrupt.requested`, `interrupted{user}` and then
/// `session.deleted`, and every row goes.
#[actix_rt::test]
async fn a_running_turn_blocks_delete_unless_forced() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let busy = create(&runtime, "busy", None).await;
    let parent = create(&runtime, "parent", None).await;
    let child = create(&runtime, "child", Some(&parent)).await;
    runner.push(&busy, Script::Never);
    runner.push(&child, Script::Never);
    for session in [&busy, &child] {
        sessions
            .prompt(PromptInput::new(session.clone(), text("work")))
            .await
            .expect("prompt");
    }
    runner.wait_for_drains(2, WAIT).await;
    assert!(testing::is_claimed(runtime.path(), &busy).unwrap());

    let before = rows_of(runtime.path(), &busy);
    match sessions.delete(&busy, false).await {
        Err(Error::SessionBusy { session_id }) => assert_eq!(session_id, busy),
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    match sessions.delete(&parent, false).await {
        Err(Error::SessionBusy { session_id }) => assert_eq!(session_id, child),
        other => panic!("a child's turn blocks its parent: {other:?}"),
    }
    assert_eq!(rows_of(runtime.path(), &busy), before, "nothing written");
    assert!(sessions.active().contains(&busy), "the turn still runs");

    let last = sessions.last_seq(&busy).await.unwrap();
    let mut stream = sessions.events(&busy, Some(last)).await.unwrap();
    assert_eq!(
        sessions.delete(&busy, true).await.unwrap(),
        std::slice::from_ref(&busy)
    );
    let seen: Vec<String> = read_to_end(&mut stream)
        .await
        .into_iter()
        .map(|(_, kind)| kind)
        .collect();
    assert_eq!(
        seen,
        [
            kind::INTERRUPT_REQUESTED,
            kind::EXECUTION_INTERRUPTED,
            kind::DELETED
        ],
        "interrupted first, then deleted"
    );
    assert_eq!(rows_of(runtime.path(), &busy), no_rows(runtime.path()));
    assert!(!sessions.active().contains(&busy));

    assert_eq!(
        sessions.delete(&parent, true).await.unwrap(),
        [parent, child.clone()]
    );
    assert_eq!(rows_of(runtime.path(), &child), no_rows(runtime.path()));
    assert!(sessions.active().is_empty(), "{:?}", sessions.active());

    // A claim an earlier process left (the sweep would resume it) blocks too; force deletes it.
    let orphan = create(&runtime, "orphan", None).await;
    testing::seed_claim(runtime.path(), &orphan, 1).unwrap();
    assert!(matches!(
        sessions.delete(&orphan, false).await,
        Err(Error::SessionBusy { .. })
    ));
    assert_eq!(
        sessions.delete(&orphan, true).await.unwrap(),
        std::slice::from_ref(&orphan)
    );
    assert_eq!(rows_of(runtime.path(), &orphan), no_rows(runtime.path()));
    assert!(runtime
        .resume_suspended_sessions()
        .await
        .unwrap()
        .resumed
        .is_empty());
    runtime.stop().await;
}

/// A deletion that loses the race against a turn's start leaves no row behind: the turn's
/// claim finds the session gone and writes nothing (its session actor stops), and a wake of
/// the deleted id starts nothing.
#[actix_rt::test]
async fn a_turn_of_a_deleted_session_writes_nothing() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    // An actor is live (it loaded the session) when the deletion commits.
    sessions
        .prompt(PromptInput::new(s.clone(), text("one")))
        .await
        .unwrap();
    runner.wait_for_drains(1, WAIT).await;
    sessions.await_idle(&s).await.unwrap();
    sessions.delete(&s, false).await.unwrap();
    runtime.execution().wake(&s, None).await.unwrap();
    assert!(matches!(
        runtime.execution().resume(&s).await,
        Err(Error::NotFound { .. }) | Err(Error::Fenced { .. })
    ));
    assert_eq!(rows_of(runtime.path(), &s), no_rows(runtime.path()));
    assert_eq!(runner.drains_of(&s).len(), 1, "no turn after the deletion");
    runtime.stop().await;
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_deletion_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_deletion_suite");
}
