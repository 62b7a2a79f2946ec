//! The stored format and the wire format are unchanged by the typed-events / Journal redesign.
//!
//! `tests/fixtures/v2-before-redesign.db` was written by the crate as it was before the
//! typed-events / Journal redesign (commit bed604c, schema version 2), by the generator kept
//! next to it (`tests/fixtures/generate_v2.rs.txt`, which says how it was run). It holds six
//! sessions, named by title:
//!
//! - `parent` (agent, model) and its `child`: a steer turn, a queue turn, a model switch;
//! - `failing`: a turn the runner failed with a provider rate limit;
//! - `interrupted`: a turn the user interrupted mid-drain;
//! - `resumed`: a turn left claimed by a SIGKILLed process, then resumed by the old version's
//!   restart sweep (restart notice, new claim, success);
//! - `claimed`: a turn left claimed mid-drain by a second SIGKILLed process, with a queue prompt
//!   admitted behind it, for the current version to resume.
//!
//! Between them they hold every built-in event kind and a runner-defined one (`agent.delta`).
//!
//! - [`a_database_written_before_the_redesign_opens_and_resumes`] opens a copy with the current
//!   crate: it migrates to the latest schema, every row reads back through the API exactly as
//!   stored, and the restart sweep resumes the claimed turn once, to success.
//! - [`built_in_events_keep_their_wire_format`] runs the generator's script with the current
//!   crate (as child processes of this test binary, SIGKILLed where the generator's were) on a
//!   fresh database and compares every stored row with the fixture's, byte for byte once ids,
//!   boots and times are replaced by placeholders; and the JSON of every [`EventRecord`] (the
//!   SSE `data:` line) with the stored row it came from. Only the columns schema version 2 has
//!   are compared: those later versions added (`claim_seq`, `wake`, `interrupted`, and
//!   version 4's `log_start`, the start of a log retention compacted) have no counterpart in
//!   the fixture. Version 6 moved the claim's columns to `session_claim`: they are read from
//!   there, joined to their session, when the database has it.
//! - With the `http` feature, [`sse_frames_of_a_database_written_before_the_redesign`] reads the
//!   fixture's events as Server-Sent Events and compares the frames byte for byte.
#![cfg(unix)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use durable_sessions::testing;
use durable_sessions::{kind, RESTART_NOTICE_DESCRIPTION, RESTART_NOTICE_TEXT};
use durable_sessions::{
    CreateSession, Delivery, EventRecord, ListQuery, MessageId, MessagesQuery, Order, ParentFilter,
    PromptInput, ProviderErrorKind, RunError, Runner, Runtime, SessionId, SessionInfo, Sessions,
    Turn,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The fixture, written by bed604c.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/v2-before-redesign.db"
);
/// The schema version bed604c wrote.
const FIXTURE_VERSION: i64 = 2;
/// The fixture's sessions, by title, in creation order.
const TITLES: [&str; 6] = [
    "parent",
    "child",
    "failing",
    "interrupted",
    "resumed",
    "claimed",
];
/// The runner-defined event the fixture's runner publishes.
const DELTA: &str = "agent.delta";
/// The directory of every session of the script.
const DIRECTORY: &str = "/srv/project";
/// The generator's first prompt: characters JSON must escape and non-ASCII ones it must not.
const HELLO: &str = "hello \"world\" \\ — ünïcode ✓\ttab";
/// How long any wait may take (generous: the machine may be loaded).
const WAIT: Duration = Duration::from_secs(60);

/// Set in a child process of [`built_in_events_keep_their_wire_format`]: the script phase to run.
const PHASE_ENV: &str = "DS_STORED_FORMAT_PHASE";
/// The database a child process opens.
const DB_ENV: &str = "DS_STORED_FORMAT_DB";
/// Printed by a child once it is ready to be killed.
const READY: &str = "STORED_FORMAT_READY";

// ---------------------------------------------------------------------------------------------
// The generator's runner and script, ported to the current API (the logic is unchanged).

/// One drain the runner started.
#[derive(Debug, Clone)]
struct Drain {
    session: SessionId,
    forced: bool,
    /// For a turn the restart sweep resumed: its attempt and the inputs it resumes.
    resumption: Option<(u32, Vec<MessageId>)>,
}

/// The generator's runner: promotes every pending steer prompt and then one queue prompt, then
/// answers each user message that has no `assistant` reply yet, by its prompt's `text`: `fail`
/// fails the turn with a provider rate limit; `block` and `hang` (in a turn that is not forced)
/// publish one `agent.delta`, report the session blocked and never finish; anything else (or
/// `hang` in a forced turn) publishes `agent.delta` and appends an `assistant` reply.
#[derive(Clone)]
struct FixtureAgent {
    blocked: mpsc::UnboundedSender<SessionId>,
    drains: Arc<Mutex<Vec<Drain>>>,
}

impl FixtureAgent {
    fn new() -> (Self, mpsc::UnboundedReceiver<SessionId>) {
        let (blocked, rx) = mpsc::unbounded_channel();
        let agent = Self {
            blocked,
            drains: Arc::default(),
        };
        (agent, rx)
    }

    fn drains_of(&self, session: &SessionId) -> Vec<Drain> {
        let drains = self.drains.lock().unwrap();
        drains
            .iter()
            .filter(|d| &d.session == session)
            .cloned()
            .collect()
    }
}

fn prompt_text(data: &Value) -> String {
    data["prompt"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

impl Runner for FixtureAgent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        self.drains.lock().unwrap().push(Drain {
            session: turn.session_id().clone(),
            forced: turn.is_forced(),
            resumption: turn.resumption().map(|r| {
                let inputs = r.inputs.iter().map(|a| a.id.clone()).collect();
                (r.attempt, inputs)
            }),
        });
        let blocked = self.blocked.clone();
        async move {
            turn.promote_steer(None).await?;
            turn.promote_queue().await?;
            let context = turn.context().await?;
            let replied: HashSet<String> = context
                .iter()
                .filter(|m| m.kind == "assistant")
                .filter_map(|m| m.data["reply_to"].as_str().map(str::to_owned))
                .collect();
            let unreplied = context
                .iter()
                .filter(|m| m.kind == "user" && !replied.contains(m.id.as_str()));
            for message in unreplied {
                let text = prompt_text(&message.data);
                match text.as_str() {
                    "fail" => {
                        return Err(RunError::provider(
                            ProviderErrorKind::RateLimit,
                            "rate limited by the provider",
                        ))
                    }
                    "block" | "hang" if !turn.is_forced() => {
                        turn.publish(
                            DELTA,
                            json!({ "messageID": message.id, "delta": "thinking" }),
                        )
                        .await?;
                        let _ = blocked.send(turn.session_id().clone());
                        futures::future::pending::<()>().await;
                    }
                    _ => {}
                }
                let reply = format!("echo: {text}");
                turn.publish(DELTA, json!({ "messageID": message.id, "delta": reply }))
                    .await?;
                turn.append_message(
                    "assistant",
                    json!({ "reply_to": message.id, "text": reply }),
                )
                .await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

async fn start(path: &Path, agent: FixtureAgent) -> Runtime {
    Runtime::builder()
        .database(path)
        .runner(agent)
        .arbiters(1)
        .sweep_on_start(false)
        .shutdown_grace(Duration::from_secs(2))
        .start()
        .await
        .expect("the runtime starts")
}

async fn create(
    sessions: &Sessions,
    title: &str,
    parent: Option<&SessionInfo>,
    agent: Option<&str>,
    model: Option<Value>,
) -> SessionInfo {
    sessions
        .create(CreateSession {
            id: None,
            parent_id: parent.map(|p| p.id.clone()),
            title: Some(title.to_owned()),
            directory: DIRECTORY.to_owned(),
            agent: agent.map(str::to_owned),
            model,
        })
        .await
        .expect("create")
        .into_info()
}

/// Prompts `text` with `delivery` and waits until the session's turns are over.
async fn turn(sessions: &Sessions, id: &SessionId, text: &str, delivery: Delivery) {
    let input = PromptInput::new(id.clone(), json!({ "text": text })).with_delivery(delivery);
    sessions.prompt(input).await.expect("prompt");
    sessions.await_idle(id).await.expect("await idle");
}

/// Prompts `text` and waits until the drain reports the session blocked.
async fn block(
    sessions: &Sessions,
    blocked: &mut mpsc::UnboundedReceiver<SessionId>,
    id: &SessionId,
    text: &str,
) {
    let input = PromptInput::new(id.clone(), json!({ "text": text }));
    sessions.prompt(input).await.expect("prompt");
    let got = actix_rt::time::timeout(WAIT, blocked.recv())
        .await
        .expect("the drain blocks")
        .expect("runner alive");
    assert_eq!(&got, id, "the blocked session");
}

fn ready() {
    let mut out = std::io::stdout();
    writeln!(out, "{READY}").expect("write marker");
    out.flush().expect("flush marker");
}

/// The generator's first process: everything up to `resumed` blocked mid-drain.
async fn first_phase(path: PathBuf) {
    let (agent, mut blocked) = FixtureAgent::new();
    let runtime = start(&path, agent).await;
    let sessions = runtime.sessions();
    let model = json!({ "providerID": "provider", "modelID": "model-a" });
    let parent = create(&sessions, "parent", None, Some("build"), Some(model)).await;
    create(&sessions, "child", Some(&parent), None, None).await;
    turn(&sessions, &parent.id, HELLO, Delivery::Steer).await;
    turn(&sessions, &parent.id, "later", Delivery::Queue).await;
    let switched = json!({ "providerID": "provider", "modelID": "model-b" });
    sessions
        .switch_model(&parent.id, switched)
        .await
        .expect("switch model");

    let failing = create(&sessions, "failing", None, None, None).await;
    turn(&sessions, &failing.id, "fail", Delivery::Steer).await;

    let interrupted = create(&sessions, "interrupted", None, None, None).await;
    block(&sessions, &mut blocked, &interrupted.id, "block").await;
    assert!(sessions
        .interrupt(&interrupted.id)
        .await
        .expect("interrupt"));

    let resumed = create(&sessions, "resumed", None, None, None).await;
    block(&sessions, &mut blocked, &resumed.id, "hang").await;
    ready();
}

/// The generator's second process: the restart sweep resumes `resumed`; `claimed` blocks
/// mid-drain with a queue prompt admitted behind it.
async fn second_phase(path: PathBuf) {
    let (agent, mut blocked) = FixtureAgent::new();
    let runtime = start(&path, agent).await;
    let sessions = runtime.sessions();
    let report = runtime.resume_suspended_sessions().await.expect("sweep");
    assert_eq!(report.resumed.len(), 1, "{report:?}");
    sessions
        .await_idle(&report.resumed[0])
        .await
        .expect("await idle");

    let claimed = create(&sessions, "claimed", None, None, None).await;
    block(&sessions, &mut blocked, &claimed.id, "hang").await;
    let queued = PromptInput::new(claimed.id.clone(), json!({ "text": "after the crash" }))
        .with_delivery(Delivery::Queue);
    sessions.prompt(queued).await.expect("queue prompt");
    ready();
}

/// In a child process: runs the phase asked for, then waits to be killed (and never reports a
/// result of its own). Returns at once in the parent.
fn run_phase_if_requested() {
    let Ok(phase) = std::env::var(PHASE_ENV) else {
        return;
    };
    let path = PathBuf::from(std::env::var(DB_ENV).expect("the database is named"));
    actix_rt::System::new().block_on(async move {
        match phase.as_str() {
            "first" => first_phase(path).await,
            "second" => second_phase(path).await,
            other => panic!("unknown phase {other:?}"),
        }
        // Wait to be killed; a parent that died without killing us must not leave us behind.
        actix_rt::time::sleep(WAIT).await;
    });
    std::process::exit(3);
}

/// Runs `phase` of the script in a child process (this test binary, running only `test`) on
/// `db`, and SIGKILLs it once it is ready.
fn run_killed(test: &str, phase: &str, db: &Path) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(PHASE_ENV, phase)
        .env(DB_ENV, db)
        .env_remove("DS_CRASH_POINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a child");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, lines) = std_mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    let ready = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(READY) => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    let stderr = stderr.join().unwrap_or_default();
    assert!(
        ready,
        "phase {phase} never got ready ({status:?})\n--- stdout ---\n{}\n--- stderr ---\n{stderr}",
        seen.join("\n")
    );
    assert_eq!(status.signal(), Some(9), "phase {phase} died of SIGKILL");
}

// ---------------------------------------------------------------------------------------------
// The stored rows, read with plain rusqlite.

#[derive(Debug, Clone, PartialEq)]
struct RawSession {
    id: String,
    parent_id: Option<String>,
    title: String,
    directory: String,
    agent: Option<String>,
    model: Option<String>,
    metadata: Option<String>,
    time_created: i64,
    time_updated: i64,
    time_suspended: Option<i64>,
    resume_attempts: u32,
    claim_boot: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct RawEvent {
    session: String,
    seq: u64,
    kind: String,
    data: String,
    time: i64,
}

#[derive(Debug, Clone, PartialEq)]
struct RawInput {
    id: String,
    session: String,
    admitted_seq: u64,
    prompt: String,
    delivery: String,
    time_created: i64,
    promoted_seq: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
struct RawMessage {
    id: String,
    session: String,
    kind: String,
    seq: u64,
    data: String,
    time_created: i64,
    time_updated: i64,
}

/// Every row of the tables schema version 2 has, in a stable order (the columns version 2
/// has; later versions may add columns).
#[derive(Debug, Clone, PartialEq)]
struct Rows {
    sessions: Vec<RawSession>,
    events: Vec<RawEvent>,
    inputs: Vec<RawInput>,
    messages: Vec<RawMessage>,
}

fn open(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the database");
    conn.busy_timeout(Duration::from_secs(10)).expect("busy");
    conn
}

fn to_seq(seq: i64) -> u64 {
    u64::try_from(seq).expect("a seq is not negative")
}

fn seq(row: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    row.get(idx).map(to_seq)
}

fn query<T>(
    conn: &rusqlite::Connection,
    sql: &str,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Vec<T> {
    let mut stmt = conn.prepare(sql).expect(sql);
    let rows = stmt.query_map([], row).expect(sql);
    rows.collect::<rusqlite::Result<_>>().expect(sql)
}

impl Rows {
    fn read(path: &Path) -> Rows {
        let conn = open(path);
        // From schema version 6 the claim columns are a table of their own.
        let claims_apart: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = 'session_claim')",
                [],
                |r| r.get(0),
            )
            .expect("the schema");
        let sessions = query(
            &conn,
            if claims_apart {
                "SELECT s.id, s.parent_id, s.title, s.directory, s.agent, s.model, s.metadata, \
                 s.time_created, s.time_updated, c.time_suspended, \
                 COALESCE(c.resume_attempts, 0), c.claim_boot \
                 FROM session s LEFT JOIN session_claim c ON c.session_id = s.id \
                 ORDER BY s.time_created, s.id"
            } else {
                "SELECT id, parent_id, title, directory, agent, model, metadata, time_created, \
                 time_updated, time_suspended, resume_attempts, claim_boot \
                 FROM session ORDER BY time_created, id"
            },
            |r| {
                Ok(RawSession {
                    id: r.get(0)?,
                    parent_id: r.get(1)?,
                    title: r.get(2)?,
                    directory: r.get(3)?,
                    agent: r.get(4)?,
                    model: r.get(5)?,
                    metadata: r.get(6)?,
                    time_created: r.get(7)?,
                    time_updated: r.get(8)?,
                    time_suspended: r.get(9)?,
                    resume_attempts: r.get(10)?,
                    claim_boot: r.get(11)?,
                })
            },
        );
        let events = query(
            &conn,
            "SELECT aggregate_id, seq, type, data, time FROM event ORDER BY aggregate_id, seq",
            |r| {
                Ok(RawEvent {
                    session: r.get(0)?,
                    seq: seq(r, 1)?,
                    kind: r.get(2)?,
                    data: r.get(3)?,
                    time: r.get(4)?,
                })
            },
        );
        let inputs = query(
            &conn,
            "SELECT id, session_id, admitted_seq, prompt, delivery, time_created, promoted_seq \
             FROM session_input ORDER BY session_id, admitted_seq",
            |r| {
                Ok(RawInput {
                    id: r.get(0)?,
                    session: r.get(1)?,
                    admitted_seq: seq(r, 2)?,
                    prompt: r.get(3)?,
                    delivery: r.get(4)?,
                    time_created: r.get(5)?,
                    promoted_seq: r.get::<_, Option<i64>>(6)?.map(to_seq),
                })
            },
        );
        let messages = query(
            &conn,
            "SELECT id, session_id, type, seq, data, time_created, time_updated \
             FROM session_message ORDER BY session_id, seq",
            |r| {
                Ok(RawMessage {
                    id: r.get(0)?,
                    session: r.get(1)?,
                    kind: r.get(2)?,
                    seq: seq(r, 3)?,
                    data: r.get(4)?,
                    time_created: r.get(5)?,
                    time_updated: r.get(6)?,
                })
            },
        );
        Rows {
            sessions,
            events,
            inputs,
            messages,
        }
    }

    fn session(&self, title: &str) -> &RawSession {
        self.sessions
            .iter()
            .find(|s| s.title == title)
            .unwrap_or_else(|| panic!("no session titled {title}"))
    }

    fn id(&self, title: &str) -> SessionId {
        SessionId::new(self.session(title).id.clone()).expect("a valid id")
    }

    fn events_of(&self, session: &str) -> Vec<&RawEvent> {
        self.events
            .iter()
            .filter(|e| e.session == session)
            .collect()
    }

    fn inputs_of(&self, session: &str) -> Vec<&RawInput> {
        self.inputs
            .iter()
            .filter(|i| i.session == session)
            .collect()
    }

    fn messages_of(&self, session: &str) -> Vec<&RawMessage> {
        self.messages
            .iter()
            .filter(|m| m.session == session)
            .collect()
    }
}

fn user_version(path: &Path) -> i64 {
    open(path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version")
}

/// The schema: every table and index, as SQLite stores its definition.
fn schema(path: &Path) -> Vec<(String, String, Option<String>)> {
    query(
        &open(path),
        "SELECT type, name, sql FROM sqlite_schema ORDER BY type, name",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stored JSON {text:?}: {e}"))
}

/// The JSON of an [`EventRecord`] (an SSE frame's `data:` line) as the stored row says it must
/// be: `session_id`, `seq`, `type`, `data` (the stored text), `time`, in that order.
fn record_json(e: &RawEvent) -> String {
    format!(
        "{{\"session_id\":{},\"seq\":{},\"type\":{},\"data\":{},\"time\":{}}}",
        serde_json::to_string(&e.session).unwrap(),
        e.seq,
        serde_json::to_string(&e.kind).unwrap(),
        e.data,
        e.time
    )
}

/// Asserts `record` is the stored row `raw`, field by field and as serialized JSON.
fn assert_record(record: &EventRecord, raw: &RawEvent) {
    assert_eq!(
        (
            record.session_id.as_str(),
            record.seq,
            record.kind.as_str(),
            &record.data,
            record.time
        ),
        (
            raw.session.as_str(),
            raw.seq,
            raw.kind.as_str(),
            &json(&raw.data),
            raw.time
        ),
        "event read back as stored"
    );
    assert_eq!(
        serde_json::to_string(record).unwrap(),
        record_json(raw),
        "EventRecord JSON of the stored {} (seq {})",
        raw.kind,
        raw.seq
    );
}

/// The built-in kinds schema version 2 never wrote, whose payloads' bytes the crate's own
/// `payloads_keep_their_wire_bytes` test pins instead: a turn's step records.
const NEWER_THAN_THE_FIXTURE: &[&str] =
    &[kind::STEP_STARTED, kind::STEP_COMPLETED, kind::STEP_FAILED];

/// Every built-in kind schema version 2 wrote, and the runner-defined one.
fn fixture_kinds() -> Vec<&'static str> {
    vec![
        kind::CREATED,
        kind::PROMPT_ADMITTED,
        kind::PROMPT_PROMOTED,
        kind::MESSAGE_APPENDED,
        kind::EXECUTION_STARTED,
        kind::EXECUTION_SUCCEEDED,
        kind::EXECUTION_FAILED,
        kind::EXECUTION_INTERRUPTED,
        kind::INTERRUPT_REQUESTED,
        kind::MODEL_SWITCHED,
        kind::SYNTHETIC,
        DELTA,
    ]
}

/// What the fixture must hold for these tests to mean anything.
fn assert_fixture_coverage(rows: &Rows) {
    let titles: Vec<&str> = rows.sessions.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(titles, TITLES, "the fixture's sessions");
    let kinds: BTreeSet<&str> = rows.events.iter().map(|e| e.kind.as_str()).collect();
    for k in fixture_kinds() {
        assert!(kinds.contains(k), "the fixture has no {k} event");
    }
    for k in kind::BUILTIN {
        assert!(
            fixture_kinds().contains(k) || NEWER_THAN_THE_FIXTURE.contains(k),
            "built-in kind {k} is new since schema version 2: this fixture cannot cover it; \
             pin its payload's bytes (the crate's `payloads_keep_their_wire_bytes`) and list it \
             in NEWER_THAN_THE_FIXTURE"
        );
    }
    let deliveries: BTreeSet<&str> = rows.inputs.iter().map(|i| i.delivery.as_str()).collect();
    assert_eq!(deliveries, BTreeSet::from(["queue", "steer"]));
    let child = rows.session("child");
    assert_eq!(child.parent_id.as_ref(), Some(&rows.session("parent").id));
    let claimed: Vec<&str> = rows
        .sessions
        .iter()
        .filter(|s| s.time_suspended.is_some())
        .map(|s| s.title.as_str())
        .collect();
    assert_eq!(claimed, ["claimed"], "the sessions left claimed");
}

// ---------------------------------------------------------------------------------------------
// Normalization: ids, boots and times replaced by placeholders, every other byte kept.

/// Replaces, in stored JSON text, session ids by `<session:title>`, message ids by
/// `<message:N>` and boot ids by `<boot:N>` (numbered in order of first appearance), and the
/// numbers of `time_*` keys by `0`. Feed it one database's rows in a fixed order.
struct Normalizer {
    /// Every id or boot seen, and its placeholder.
    names: BTreeMap<String, String>,
    messages: usize,
    boots: usize,
}

const TIME_KEYS: [&str; 3] = ["time_created", "time_updated", "time_suspended"];

fn is_generated(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() == 32 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Normalizer {
    fn new(rows: &Rows) -> Self {
        let names = rows
            .sessions
            .iter()
            .map(|s| (s.id.clone(), format!("<session:{}>", s.title)))
            .collect();
        Normalizer {
            names,
            messages: 0,
            boots: 0,
        }
    }

    fn message(&mut self, id: &str) -> String {
        if !self.names.contains_key(id) {
            self.messages += 1;
            let name = format!("<message:{}>", self.messages);
            self.names.insert(id.to_owned(), name);
        }
        self.names[id].clone()
    }

    fn boot(&mut self, boot: &str) -> String {
        if !self.names.contains_key(boot) {
            self.boots += 1;
            let name = format!("<boot:{}>", self.boots);
            self.names.insert(boot.to_owned(), name);
        }
        self.names[boot].clone()
    }

    fn learn(&mut self, value: &Value, key: Option<&str>) {
        match value {
            Value::String(s) if key == Some("boot") => {
                self.boot(s);
            }
            Value::String(s) if is_generated(s, "msg_") => {
                self.message(s);
            }
            Value::String(s) if is_generated(s, "ses_") => {
                assert!(self.names.contains_key(s), "unknown session id {s}");
            }
            Value::Array(items) => items.iter().for_each(|v| self.learn(v, None)),
            Value::Object(map) => map.iter().for_each(|(k, v)| self.learn(v, Some(k))),
            _ => {}
        }
    }

    /// The stored JSON text `raw`, normalized.
    fn text(&mut self, raw: &str) -> String {
        self.learn(&json(raw), None);
        let mut out = raw.to_owned();
        for (id, name) in &self.names {
            out = out.replace(&format!("\"{id}\""), &format!("\"{name}\""));
        }
        for key in TIME_KEYS {
            out = zero_numbers_of(&out, key);
        }
        out
    }

    /// A plain id (a column), normalized.
    fn id(&mut self, id: &str) -> String {
        if is_generated(id, "msg_") {
            return self.message(id);
        }
        self.names
            .get(id)
            .cloned()
            .unwrap_or_else(|| panic!("unknown id {id}"))
    }
}

/// `text` with every number that follows `"key":` replaced by `0`.
fn zero_numbers_of(text: &str, key: &str) -> String {
    let pattern = format!("\"{key}\":");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = at + pattern.len();
        out.push_str(&rest[..after]);
        rest = &rest[after..];
        let digits = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'-')
            .count();
        if digits > 0 {
            out.push('0');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// One database's rows, normalized, keyed for comparison; walked in a fixed order (sessions in
/// creation order, then each session's events, inputs and transcript in seq order), so two
/// databases written by the same script number their ids alike.
fn normalized(rows: &Rows) -> BTreeMap<String, String> {
    let mut n = Normalizer::new(rows);
    let mut out = BTreeMap::new();
    for (i, title) in TITLES.iter().enumerate() {
        let session = rows.session(title);
        let events = rows.events_of(&session.id);
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        let expected: Vec<u64> = (0..events.len() as u64).collect();
        assert_eq!(seqs, expected, "{title}: seqs are 0, 1, 2, …");
        for e in events {
            let data = n.text(&e.data);
            out.insert(
                format!("{i} {title} event {:>2}", e.seq),
                format!("{} {data}", e.kind),
            );
        }
        for input in rows.inputs_of(&session.id) {
            let row = format!(
                "id={} admitted_seq={} delivery={} promoted_seq={:?} prompt={}",
                n.id(&input.id),
                input.admitted_seq,
                input.delivery,
                input.promoted_seq,
                n.text(&input.prompt)
            );
            out.insert(format!("{i} {title} input {:>2}", input.admitted_seq), row);
        }
        for m in rows.messages_of(&session.id) {
            let row = format!(
                "id={} type={} data={}",
                n.id(&m.id),
                m.kind,
                n.text(&m.data)
            );
            out.insert(format!("{i} {title} message {:>2}", m.seq), row);
        }
        let row = format!(
            "parent={:?} directory={} agent={:?} model={:?} metadata={:?} claimed={} \
             resume_attempts={} claim_boot={:?}",
            session.parent_id.as_deref().map(|p| n.id(p)),
            session.directory,
            session.agent,
            session.model.as_deref().map(|m| n.text(m)),
            session.metadata.as_deref().map(|m| n.text(m)),
            session.time_suspended.is_some(),
            session.resume_attempts,
            session.claim_boot.as_deref().map(|b| n.boot(b)),
        );
        out.insert(format!("{i} {title} session"), row);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// The schema version and schema the current crate gives a new database.
async fn latest_schema() -> (i64, Vec<(String, String, Option<String>)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("new.db");
    let (agent, _blocked) = FixtureAgent::new();
    let runtime = start(&path, agent).await;
    runtime.shutdown().await;
    (user_version(&path), schema(&path))
}

/// Asserts every session, event and transcript message of `rows` reads back through the API as
/// stored.
async fn assert_readable(sessions: &Sessions, path: &Path, rows: &Rows) {
    let mut infos = Vec::new();
    for raw in &rows.sessions {
        let id = SessionId::new(raw.id.clone()).unwrap();
        let info = sessions.get(&id).await.expect("get");
        assert_eq!(
            (
                info.id.as_str(),
                info.parent_id.as_ref().map(SessionId::as_str),
                info.title.as_str(),
                info.directory.as_str(),
                info.agent.as_deref(),
                info.model.clone(),
                info.metadata.clone(),
                info.time_created,
                info.time_updated,
                info.time_suspended,
                info.resume_attempts,
            ),
            (
                raw.id.as_str(),
                raw.parent_id.as_deref(),
                raw.title.as_str(),
                raw.directory.as_str(),
                raw.agent.as_deref(),
                raw.model.as_deref().map(json),
                raw.metadata.as_deref().map(json),
                raw.time_created,
                raw.time_updated,
                raw.time_suspended,
                raw.resume_attempts,
            ),
            "session {} reads back as stored",
            raw.title
        );
        infos.push(info);

        let query = MessagesQuery {
            order: Order::Asc,
            ..MessagesQuery::new(id.clone())
        };
        let messages = sessions.messages(query).await.expect("messages");
        let read: Vec<_> = messages
            .iter()
            .map(|m| {
                (
                    m.id.to_string(),
                    m.session_id.to_string(),
                    m.kind.clone(),
                    m.seq,
                    m.data.clone(),
                    m.time_created,
                )
            })
            .collect();
        let stored: Vec<_> = rows
            .messages_of(&raw.id)
            .into_iter()
            .map(|m| {
                (
                    m.id.clone(),
                    m.session.clone(),
                    m.kind.clone(),
                    m.seq,
                    json(&m.data),
                    m.time_created,
                )
            })
            .collect();
        assert_eq!(
            read, stored,
            "transcript of {} reads back as stored",
            raw.title
        );

        let stored = rows.events_of(&raw.id);
        let read = testing::events(path, &id).expect("testing::events");
        assert_eq!(read.len(), stored.len(), "events of {}", raw.title);
        for (record, raw) in read.iter().zip(&stored) {
            assert_record(record, raw);
        }
        let mut stream = sessions.events(&id, None).await.expect("events");
        for raw in &stored {
            let record = actix_rt::time::timeout(WAIT, stream.next())
                .await
                .expect("the stream replays the stored events")
                .expect("the stream goes on")
                .expect("a stored event");
            assert_record(&record, raw);
        }
    }
    let mut newest_first = infos.clone();
    newest_first.sort_by(|a, b| (b.time_created, &b.id).cmp(&(a.time_created, &a.id)));
    let listed = sessions.list(ListQuery::default()).await.expect("list");
    assert_eq!(listed, newest_first, "Sessions::list, newest first");
    let children = sessions
        .list(ListQuery {
            parent: ParentFilter::ChildrenOf(rows.id("parent")),
            ..ListQuery::default()
        })
        .await
        .expect("list children");
    let child: Vec<_> = infos
        .iter()
        .filter(|i| i.title == "child")
        .cloned()
        .collect();
    assert_eq!(children, child, "the parent's children");
}

/// A copy of the fixture in `dir`.
fn fixture_copy(dir: &Path) -> PathBuf {
    let wal = format!("{FIXTURE}-wal");
    assert!(
        !Path::new(&wal).exists(),
        "the fixture is one checkpointed file"
    );
    let path = dir.join("v2.db");
    std::fs::copy(FIXTURE, &path).expect("copy the fixture");
    path
}

#[actix_rt::test]
async fn a_database_written_before_the_redesign_opens_and_resumes() {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixture_copy(dir.path());
    assert_eq!(user_version(&path), FIXTURE_VERSION);
    let stored = Rows::read(&path);
    assert_fixture_coverage(&stored);
    let (latest, latest_schema) = latest_schema().await;
    assert!(latest > FIXTURE_VERSION, "the crate's schema is {latest}");

    // Open it: it migrates, and every stored row reads back as it was written.
    let (agent, _blocked) = FixtureAgent::new();
    let runtime = start(&path, agent.clone()).await;
    assert_eq!(
        user_version(&path),
        latest,
        "migrated to the latest version"
    );
    assert_eq!(schema(&path), latest_schema, "the schema of a new database");
    assert_eq!(
        Rows::read(&path),
        stored,
        "the migration changes no stored row"
    );
    let sessions = runtime.sessions();
    assert_readable(&sessions, &path, &stored).await;
    // The prompt whose turn a user interrupted before the upgrade is marked so, and no other.
    let interrupted = stored.id("interrupted");
    let marked: Vec<(String, String)> = {
        let conn = rusqlite::Connection::open(&path).expect("open");
        let mut stmt = conn
            .prepare("SELECT session_id, type FROM session_message WHERE interrupted = 1")
            .expect("prepare");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    };
    assert_eq!(
        marked,
        [(interrupted.to_string(), "user".to_string())],
        "interrupted marks derived by the migration"
    );

    // The restart sweep resumes the claimed turn, once.
    let claimed = stored.id("claimed");
    let report = runtime.resume_suspended_sessions().await.expect("sweep");
    assert_eq!(report.resumed, std::slice::from_ref(&claimed), "{report:?}");
    assert!(report.terminalized.is_empty(), "{report:?}");
    assert!(report.interrupted.is_empty(), "{report:?}");
    assert_eq!(report.children_released, 0, "{report:?}");
    actix_rt::time::timeout(WAIT, sessions.await_idle(&claimed))
        .await
        .expect("the resumed turn ends")
        .expect("await idle");

    let drains = agent.drains_of(&claimed);
    let hang = stored.inputs_of(claimed.as_str())[0].id.clone();
    assert_eq!(drains.len(), 1, "one drain of the resumed turn: {drains:?}");
    assert!(drains[0].forced, "a resumed turn is forced");
    assert_eq!(
        drains[0].resumption,
        Some((1, vec![MessageId::new(hang.clone()).unwrap()])),
        "the first resume attempt, resuming the prompt the killed turn had promoted"
    );
    let after = Rows::read(&path);
    let before = stored.events_of(claimed.as_str());
    let events = after.events_of(claimed.as_str());
    assert_eq!(
        &events[..before.len()],
        &before[..],
        "the log before the restart"
    );
    let tail: Vec<&str> = events[before.len()..]
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(
        tail,
        [
            kind::SYNTHETIC,
            kind::EXECUTION_STARTED,
            kind::PROMPT_PROMOTED,
            DELTA,
            kind::MESSAGE_APPENDED,
            DELTA,
            kind::MESSAGE_APPENDED,
            kind::EXECUTION_SUCCEEDED,
        ],
        "restart notice, claim, the queued prompt promoted, both prompts answered, success"
    );
    let notice = events[before.len()];
    let expected = json!({
        "description": RESTART_NOTICE_DESCRIPTION,
        "sessionID": claimed,
        "text": RESTART_NOTICE_TEXT,
    });
    assert_eq!(notice.data, expected.to_string(), "the restart notice");
    // The notice the old version wrote for `resumed`, with its id, is byte for byte the same.
    let resumed = stored.session("resumed");
    let old_notice = stored
        .events_of(&resumed.id)
        .into_iter()
        .find(|e| e.kind == kind::SYNTHETIC)
        .expect("the old version's notice");
    assert_eq!(
        notice.data.replace(claimed.as_str(), "<id>"),
        old_notice.data.replace(&resumed.id, "<id>"),
        "the restart notice as the old version wrote it"
    );
    let started = events[before.len() + 1];
    assert_eq!(
        started.data,
        format!("{{\"boot\":\"{}\"}}", runtime.boot_id()),
        "the claim names this boot"
    );
    let replies: Vec<Value> = after
        .messages_of(claimed.as_str())
        .into_iter()
        .filter(|m| m.kind == "assistant")
        .map(|m| json(&m.data)["reply_to"].clone())
        .collect();
    let inputs: Vec<Value> = after
        .inputs_of(claimed.as_str())
        .into_iter()
        .map(|i| json!(i.id))
        .collect();
    assert_eq!(replies, inputs, "each prompt answered once, in order");
    assert!(
        after
            .inputs_of(claimed.as_str())
            .iter()
            .all(|i| i.promoted_seq.is_some()),
        "nothing left pending"
    );
    let info = sessions.get(&claimed).await.expect("get");
    assert_eq!((info.time_suspended, info.resume_attempts), (None, 0));
    assert!(!testing::is_claimed(&path, &claimed).expect("claim state"));

    // Once: a second sweep finds nothing, and no other session was touched.
    let again = runtime.resume_suspended_sessions().await.expect("sweep");
    assert!(again.resumed.is_empty(), "{again:?}");
    let others = |rows: &Rows| -> Vec<RawEvent> {
        rows.events
            .iter()
            .filter(|e| e.session != claimed.as_str())
            .cloned()
            .collect()
    };
    assert_eq!(others(&Rows::read(&path)), others(&stored));
    runtime.shutdown().await;
}

#[test]
fn built_in_events_keep_their_wire_format() {
    run_phase_if_requested();
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = fixture_copy(dir.path());
    // The generator's script, with the current crate, killed where the generator's was.
    let fresh = dir.path().join("fresh.db");
    run_killed("built_in_events_keep_their_wire_format", "first", &fresh);
    run_killed("built_in_events_keep_their_wire_format", "second", &fresh);

    let old = Rows::read(&fixture);
    let new = Rows::read(&fresh);
    assert_fixture_coverage(&old);
    assert_fixture_coverage(&new);
    let (old_rows, new_rows) = (normalized(&old), normalized(&new));
    let mut differences = Vec::new();
    for key in old_rows
        .keys()
        .chain(new_rows.keys())
        .collect::<BTreeSet<_>>()
    {
        let (was, now) = (old_rows.get(key), new_rows.get(key));
        if was != now {
            differences.push(format!(
                "{key}:\n    v2:  {}\n    now: {}",
                was.map_or("(none)", String::as_str),
                now.map_or("(none)", String::as_str)
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "the current crate stores {} rows differently from schema version 2:\n{}",
        differences.len(),
        differences.join("\n")
    );
    // Every kind was compared, byte for byte.
    let compared: BTreeSet<&str> = new.events.iter().map(|e| e.kind.as_str()).collect();
    for k in fixture_kinds() {
        assert!(compared.contains(k), "{k} was not compared");
    }

    // The EventRecord JSON (the SSE `data:` line) of every event, old and new, is the stored
    // row's, with its keys in the same order.
    for (path, rows) in [(&fixture, &old), (&fresh, &new)] {
        for raw in &rows.sessions {
            let id = SessionId::new(raw.id.clone()).unwrap();
            let records = testing::events(path, &id).expect("testing::events");
            let stored = rows.events_of(&raw.id);
            assert_eq!(records.len(), stored.len());
            for (record, raw) in records.iter().zip(stored) {
                assert_record(record, raw);
            }
        }
    }
}

/// The SSE frames of every event of the fixture, read over HTTP from the current crate, are
/// `id: <seq>`, `event: <type>`, `data: <EventRecord JSON of the stored row>`, byte for byte.
#[cfg(feature = "http")]
#[actix_rt::test]
async fn sse_frames_of_a_database_written_before_the_redesign() {
    use actix_web::{web, App, HttpServer};
    use durable_sessions::http::{self, HttpOptions};
    use futures::StreamExt;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixture_copy(dir.path());
    let stored = Rows::read(&path);
    let (agent, _blocked) = FixtureAgent::new();
    let runtime = start(&path, agent).await;
    let app_runtime = runtime.clone();
    let server = HttpServer::new(move || {
        App::new()
            .configure(http::configure(app_runtime.clone(), HttpOptions::new()))
            .default_service(web::to(http::not_found))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    let client = awc::Client::builder().timeout(WAIT).finish();

    for raw in &stored.sessions {
        let expected: Vec<String> = stored
            .events_of(&raw.id)
            .into_iter()
            .map(|e| {
                format!(
                    "id: {}\nevent: {}\ndata: {}\n\n",
                    e.seq,
                    e.kind,
                    record_json(e)
                )
            })
            .collect();
        let url = format!("http://{addr}/sessions/{}/events", raw.id);
        let mut response = client.get(url).send().await.expect("GET events");
        assert_eq!(response.status(), 200);
        let mut body = String::new();
        let frames = loop {
            let frames: Vec<String> = body
                .split_inclusive("\n\n")
                .filter(|f| f.starts_with("id: ") && f.ends_with("\n\n"))
                .map(str::to_owned)
                .collect();
            if frames.len() >= expected.len() {
                break frames;
            }
            let chunk = actix_rt::time::timeout(WAIT, response.next())
                .await
                .expect("an SSE frame")
                .expect("the stream goes on")
                .expect("a chunk");
            body.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        };
        assert_eq!(frames, expected, "SSE frames of {}", raw.title);
    }
    handle.stop(false).await;
    runtime.shutdown().await;
}
