//! The durable contract a user reads in the README, tried the way it broke: an acknowledged
//! prompt runs after a crash without a retry, queued prompts each run in their own turn, and a
//! user interrupt sticks across a crash and across a racing shutdown.
//!
//! The crash tests re-execute this test binary as a child process (`DS_CONTRACT_ROLE` selects
//! what the child does) armed at a crash point (feature `crash-points`), SIGKILL it there, and
//! recover the database in this process.
#![cfg(unix)]

mod common;

use std::path::Path;
#[cfg(feature = "crash-points")]
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::kind;
use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{
    CreateSession, Delivery, Error, EventRecord, MessageId, PromptInput, RunError, Runner, Runtime,
    RuntimeBuilder, SessionId, Turn, TurnCause,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::json;
use tokio::sync::Notify;

#[cfg(feature = "crash-points")]
use common::wait_for_event;
use common::{sid, test_builder, wait_until_committed, Harness, WAIT};

#[cfg(feature = "crash-points")]
/// Selects the child's role; set only in child processes.
const ROLE_ENV: &str = "DS_CONTRACT_ROLE";
#[cfg(feature = "crash-points")]
/// The database file a child opens.
const DB_ENV: &str = "DS_CONTRACT_DB";

/// What a turn of [`Agent`] was, as a runner sees it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    session: String,
    cause: TurnCause,
    promoted: Vec<String>,
}

/// Promotes the pending steer prompts and at most one queued prompt per turn (none when the
/// turn resumes one), answers what it promoted and what its resumption names, and records
/// every drain. Drains of sessions listed in `block` promote, then wait for the gate.
#[derive(Clone, Default)]
struct Agent {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Woken each time a drain is recorded in `seen`.
    recorded: Arc<Notify>,
    block: Arc<Mutex<Vec<(String, Gate)>>>,
    print: bool,
}

impl Agent {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the drains recorded so far satisfy `done`: checked now and again each time a
    /// drain is recorded, never on a timer.
    ///
    /// # Panics
    /// After [`WAIT`], naming `what`.
    async fn wait_seen(&self, what: &str, done: impl Fn(&[Seen]) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            // Registered before the check, so a drain recorded after it still wakes us.
            let recorded = self.recorded.notified();
            if done(&self.seen()) {
                return;
            }
            if tokio::time::timeout_at(deadline, recorded).await.is_err() {
                panic!("timed out waiting for {what}: {:?}", self.seen());
            }
        }
    }

    /// The next drain of `session` that promotes `prompt` waits for `gate`.
    fn block_on(&self, prompt: &str, gate: &Gate) {
        self.block
            .lock()
            .unwrap()
            .push((prompt.to_owned(), gate.clone()));
    }
}

impl Runner for Agent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let this = self.clone();
        async move {
            let resumed: Vec<_> = turn
                .resumption()
                .map(|r| r.inputs.clone())
                .unwrap_or_default();
            let mut promoted = turn.promote_steer(None).await?;
            if !resumed.iter().any(|a| a.delivery == Delivery::Queue) {
                promoted.extend(turn.promote_queue().await?);
            }
            let ids: Vec<String> = promoted.iter().map(|a| a.id.to_string()).collect();
            this.seen.lock().unwrap().push(Seen {
                session: turn.session_id().to_string(),
                cause: turn.cause().clone(),
                promoted: ids.clone(),
            });
            this.recorded.notify_waiters();
            if this.print {
                println!("DRAIN {} {ids:?}", turn.session_id());
            }
            let gate = {
                let mut block = this.block.lock().unwrap();
                let at = block.iter().position(|(p, _)| ids.contains(p));
                at.map(|i| block.remove(i).1)
            };
            if let Some(gate) = gate {
                gate.wait().await;
            }
            let answered: Vec<String> = turn
                .context()
                .await?
                .iter()
                .filter_map(|m| m.data["reply_to"].as_str().map(str::to_owned))
                .collect();
            for id in resumed
                .iter()
                .map(|a| &a.id)
                .chain(promoted.iter().map(|a| &a.id))
            {
                if !answered.contains(&id.to_string()) {
                    turn.append_message("assistant", json!({ "reply_to": id }))
                        .await?;
                }
            }
            Ok(())
        }
        .boxed_local()
    }
}

fn session_info(id: &SessionId) -> CreateSession {
    CreateSession {
        id: Some(id.clone()),
        directory: "/contract".into(),
        ..CreateSession::default()
    }
}

fn prompt(session: &SessionId, id: &str) -> PromptInput {
    PromptInput::new(session.clone(), json!({ "text": id }))
        .with_id(MessageId::new(id).expect("valid message id"))
}

/// The runtime of these tests: the tests' defaults with a resume budget of 3 and the restart
/// sweep at start.
fn contract(builder: RuntimeBuilder) -> RuntimeBuilder {
    builder.max_resume_attempts(3).sweep_on_start(true)
}

/// A runtime of these tests on `db`: the crash tests and their child processes share a file.
#[cfg_attr(not(feature = "crash-points"), allow(dead_code))]
async fn start<R: Runner + Clone>(db: &Path, runner: &R) -> Runtime {
    contract(test_builder(db, runner))
        .start()
        .await
        .expect("runtime starts")
}

#[cfg(feature = "crash-points")]
/// The kinds of `session`'s events from `from` on.
fn kinds(db: &Path, session: &SessionId, from: usize) -> Vec<String> {
    testing::events(db, session).unwrap()[from..]
        .iter()
        .map(|e| e.kind.clone())
        .collect()
}

/// `(type, id, reply_to, interrupted)` of every transcript row of `session`, in seq order.
fn transcript(db: &Path, session: &SessionId) -> Vec<(String, String, Option<String>, bool)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT type, id, json_extract(data, '$.reply_to'), interrupted FROM session_message \
             WHERE session_id = ?1 ORDER BY seq",
        )
        .unwrap();
    stmt.query_map([session.as_str()], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })
    .unwrap()
    .collect::<rusqlite::Result<_>>()
    .unwrap()
}

fn reply(to: &str) -> (String, String, Option<String>, bool) {
    ("assistant".into(), String::new(), Some(to.into()), false)
}

/// Blanks the generated ids of assistant rows, so transcripts compare by content.
fn without_reply_ids(
    rows: Vec<(String, String, Option<String>, bool)>,
) -> Vec<(String, String, Option<String>, bool)> {
    rows.into_iter()
        .map(|(kind, id, to, interrupted)| {
            let id = if kind == "assistant" {
                String::new()
            } else {
                id
            };
            (kind, id, to, interrupted)
        })
        .collect()
}

fn user(id: &str, interrupted: bool) -> (String, String, Option<String>, bool) {
    ("user".into(), id.into(), None, interrupted)
}

// ---------------------------------------------------------------------------------------------
// Child processes.

#[cfg(feature = "crash-points")]
/// When this process is a child, runs its role and never returns.
fn run_child_if_requested() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let db = PathBuf::from(std::env::var(DB_ENV).expect("the child's database"));
    println!();
    actix_rt::System::new().block_on(async move {
        let agent = Agent {
            print: true,
            ..Agent::default()
        };
        let gate = Gate::new();
        agent.block_on("p1", &gate);
        let runtime = start(&db, &agent).await;
        let sessions = runtime.sessions();
        let s = sid("s");
        sessions.create(session_info(&s)).await.expect("create");
        let mut events = runtime.subscribe();
        sessions.prompt(prompt(&s, "p1")).await.expect("prompt");
        println!("ADMITTED p1");
        if role == "interrupt" {
            // Wait until the turn promoted p1 and blocks, then interrupt it.
            wait_for_event(&mut events, "p1's promotion", |e| {
                e.session_id == s && e.kind == kind::PROMPT_PROMOTED
            })
            .await;
            let hit = sessions.interrupt(&s).await;
            println!("INTERRUPTED {hit:?}");
        }
        actix_rt::time::sleep(Duration::from_secs(60)).await;
    });
    std::process::exit(3);
}

#[cfg(feature = "crash-points")]
fn spawn_child(test: &str, role: &str, db: &Path, point: &str) -> common::ChildProcess {
    common::ChildProcess::spawn(
        test,
        &[
            (ROLE_ENV, role.to_owned()),
            (DB_ENV, db.display().to_string()),
            ("DS_CRASH_POINT", point.to_owned()),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// A prompt `Sessions::prompt` acknowledged, whose turn's claim never committed (SIGKILL inside
/// the claim write, after the wake was delivered and the caller answered), runs at the next
/// boot without the client sending it again: the sweep adopts the session, publishes the
/// restart notice and claims a recovered turn, which promotes and answers the prompt.
#[cfg(feature = "crash-points")]
#[test]
fn an_acknowledged_prompt_runs_after_a_crash_without_a_retry() {
    run_child_if_requested();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ack.db");
    let test = "an_acknowledged_prompt_runs_after_a_crash_without_a_retry";
    let mut child = spawn_child(test, "ack", &db, "during_claim");
    child.wait_for_all(&["ADMITTED p1", "CRASH_POINT during_claim"]);
    child.kill();
    let s = sid("s");
    let before = testing::events(&db, &s).unwrap().len();
    assert!(
        !testing::is_claimed(&db, &s).unwrap(),
        "the claim never committed"
    );
    assert!(testing::events_of_kind(&db, &s, kind::EXECUTION_STARTED)
        .unwrap()
        .is_empty());

    actix_rt::System::new().block_on(async {
        let agent = Agent::default();
        let runtime = start(&db, &agent).await;
        runtime.execution().await_idle(&s).await.unwrap();
        let seen = agent.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let TurnCause::Recovery(resumption) = &seen[0].cause else {
            panic!("a recovered turn: {seen:?}");
        };
        assert_eq!((resumption.attempt, resumption.max_attempts), (1, 3));
        assert!(
            resumption.inputs.is_empty(),
            "the killed process never started it"
        );
        assert_eq!(seen[0].promoted, ["p1"]);
        runtime.shutdown().await;
    });
    assert_eq!(
        kinds(&db, &s, before),
        [
            kind::SYNTHETIC,
            kind::EXECUTION_STARTED,
            kind::PROMPT_PROMOTED,
            kind::MESSAGE_APPENDED,
            kind::EXECUTION_SUCCEEDED
        ]
    );
    assert_eq!(
        without_reply_ids(transcript(&db, &s)),
        [user("p1", false), reply("p1")]
    );
    assert!(!testing::is_claimed(&db, &s).unwrap());

    // Served: a further boot has nothing to adopt.
    actix_rt::System::new().block_on(async {
        let agent = Agent::default();
        let runtime = start(&db, &agent).await;
        runtime.shutdown().await;
        assert!(agent.seen().is_empty());
    });
}

/// SIGKILL after `session.interrupt.requested` committed and before the turn's terminal: the
/// next boot records the turn `interrupted{user}` and releases it, never resumes it, and counts
/// no attempt; the interrupted prompt is marked so in the transcript.
#[cfg(feature = "crash-points")]
#[test]
fn a_durable_interrupt_request_sticks_across_a_crash_before_the_terminal() {
    run_child_if_requested();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("interrupt.db");
    let test = "a_durable_interrupt_request_sticks_across_a_crash_before_the_terminal";
    let mut child = spawn_child(test, "interrupt", &db, "after_interrupt_request");
    child.wait_for("CRASH_POINT after_interrupt_request");
    child.kill();
    let s = sid("s");
    assert!(testing::is_claimed(&db, &s).unwrap(), "killed mid-turn");
    let before = testing::events(&db, &s).unwrap().len();
    assert_eq!(
        kinds(&db, &s, before - 1),
        [kind::INTERRUPT_REQUESTED],
        "the request is the last thing the killed process committed"
    );

    for boot in 0..2 {
        actix_rt::System::new().block_on(async {
            let agent = Agent::default();
            let runtime = start(&db, &agent).await;
            runtime.execution().await_idle(&s).await.unwrap();
            runtime.shutdown().await;
            assert!(
                agent.seen().is_empty(),
                "boot {boot} resumed: {:?}",
                agent.seen()
            );
        });
    }
    assert_eq!(kinds(&db, &s, before), [kind::EXECUTION_INTERRUPTED]);
    let terminal = testing::events(&db, &s).unwrap().pop().unwrap();
    assert_eq!(terminal.data, json!({ "reason": "user" }));
    assert!(!testing::is_claimed(&db, &s).unwrap());
    assert_eq!(testing::resume_attempts(&db, &s).unwrap(), 0);
    assert_eq!(without_reply_ids(transcript(&db, &s)), [user("p1", true)]);
}

/// Three queued prompts admitted while a turn runs each run in a turn of their own, in
/// admission order, with nobody waking the session again — also across a restart in the middle
/// of the queue (a graceful shutdown while the second one's turn runs).
#[actix_rt::test]
async fn queued_prompts_each_run_in_their_own_turn_in_order() {
    let s = sid("q");
    let (first, second) = (Gate::new(), Gate::new());
    let agent = Agent::default();
    agent.block_on("p0", &first);
    agent.block_on("q2", &second);
    let mut runtime = Harness::with(contract).start(&agent).await;
    let sessions = runtime.sessions();
    sessions.create(session_info(&s)).await.unwrap();
    sessions.prompt(prompt(&s, "p0")).await.unwrap();
    agent
        .wait_seen("p0's turn", |seen| {
            seen.iter().any(|d| d.promoted == ["p0"])
        })
        .await;
    for id in ["q1", "q2", "q3"] {
        let input = prompt(&s, id).with_delivery(Delivery::Queue);
        sessions.prompt(input).await.unwrap();
    }
    first.release();
    // The turn serving q2 blocks; restart in the middle of the queue.
    agent
        .wait_seen("q2's turn", |seen| {
            seen.iter().any(|d| d.promoted == ["q2"])
        })
        .await;
    runtime.stop().await;
    assert!(
        testing::is_claimed(runtime.path(), &s).unwrap(),
        "shutdown keeps q2's turn"
    );

    let agent2 = Agent::default();
    runtime.restart(&agent2, contract).await;
    // The sweep in `restart` may already have served q3: the wait checks the store first.
    let mut events = runtime.subscribe();
    let appended = |e: &EventRecord| e.session_id == s && e.kind == kind::MESSAGE_APPENDED;
    wait_until_committed(&mut events, "q3's reply", appended, || {
        testing::events_of_kind(runtime.path(), &s, kind::MESSAGE_APPENDED)
            .unwrap()
            .iter()
            .any(|e| e.data["data"]["reply_to"] == "q3")
    })
    .await;
    runtime.execution().await_idle(&s).await.unwrap();
    runtime.stop().await;

    let resumed = agent2.seen();
    let TurnCause::Recovery(resumption) = &resumed[0].cause else {
        panic!("the restart resumes q2's turn: {resumed:?}");
    };
    let ids: Vec<&str> = resumption.inputs.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(
        ids,
        ["q2"],
        "the resumption names the queued prompt it serves"
    );

    // Each queued prompt was promoted in a claim of its own (between two releases), in order.
    let mut turns: Vec<Vec<String>> = Vec::new();
    let mut claimed = false;
    for e in testing::events(runtime.path(), &s).unwrap() {
        match e.kind.as_str() {
            k if k == kind::EXECUTION_STARTED && !claimed => {
                claimed = true;
                turns.push(Vec::new());
            }
            k if k == kind::EXECUTION_SUCCEEDED => claimed = false,
            k if k == kind::PROMPT_PROMOTED => {
                let id = e.data["messageID"].as_str().unwrap().to_owned();
                turns.last_mut().expect("promoted inside a turn").push(id);
            }
            _ => {}
        }
    }
    assert_eq!(
        turns,
        [vec!["p0", "q1"], vec!["q2"], vec!["q3"]],
        "one queued prompt per turn, in admission order"
    );
    assert_eq!(
        without_reply_ids(transcript(runtime.path(), &s)),
        [
            user("p0", false),
            reply("p0"),
            user("q1", false),
            reply("q1"),
            user("q2", false),
            reply("q2"),
            user("q3", false),
            reply("q3"),
        ]
    );
}

/// An interrupt racing a graceful shutdown either takes effect — and then the turn is never
/// resumed by a later boot — or returns an error having stored nothing.
#[actix_rt::test]
async fn an_interrupt_racing_shutdown_is_never_resumed() {
    let mut outcomes = (0, 0);
    for round in 0..20u64 {
        let s = sid("s");
        let runner = ScriptedRunner::new();
        runner.push(&s, Script::Never);
        let mut runtime = Harness::with(contract).start(&runner).await;
        let sessions = runtime.sessions();
        sessions.create(session_info(&s)).await.unwrap();
        sessions.prompt(prompt(&s, "p")).await.unwrap();
        runner
            .wait_for_drains_of(&s, 1, Duration::from_secs(10))
            .await;
        let delay = Duration::from_micros(round * 150);
        let (interrupted, ()) = futures::join!(sessions.interrupt(&s), async {
            actix_rt::time::sleep(delay).await;
            runtime.stop().await;
        });
        let requests =
            testing::events_of_kind(runtime.path(), &s, kind::INTERRUPT_REQUESTED).unwrap();
        let after = ScriptedRunner::new();
        runtime.restart(&after, contract).await;
        runtime.execution().await_idle(&s).await.unwrap();
        runtime.stop().await;
        match interrupted {
            Ok(_) => {
                outcomes.0 += 1;
                assert_eq!(requests.len(), 1, "round {round}");
                assert!(after.drains_of(&s).is_empty(), "round {round}: resumed");
                let terminal = testing::events(runtime.path(), &s).unwrap().pop().unwrap();
                assert_eq!(
                    (terminal.kind.as_str(), &terminal.data),
                    (kind::EXECUTION_INTERRUPTED, &json!({ "reason": "user" })),
                    "round {round}"
                );
            }
            Err(e) => {
                outcomes.1 += 1;
                assert!(matches!(e, Error::ShuttingDown), "round {round}: {e}");
                assert!(requests.is_empty(), "round {round}: stored though refused");
            }
        }
        assert!(
            !testing::is_claimed(runtime.path(), &s).unwrap(),
            "round {round}"
        );
    }
    assert!(
        outcomes.0 > 0,
        "no round let the interrupt through: {outcomes:?}"
    );
}
