//! Shared helpers for the integration tests: a temp database, a runtime on it, sessions.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use durable_sessions::testing::ScriptedRunner;
use durable_sessions::{CreateSession, Runtime, RuntimeBuilder, SessionId};
use tempfile::TempDir;

/// How long a test waits for something observable before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A temp directory holding the test's database file.
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sessions.db");
        Self { dir, path }
    }

    /// A builder on this database with a short shutdown grace and no sweep at start.
    pub fn builder(&self, runner: &ScriptedRunner) -> RuntimeBuilder {
        Runtime::builder()
            .database(&self.path)
            .runner(runner.clone())
            .arbiters(2)
            .sweep_on_start(false)
            .shutdown_grace(Duration::from_secs(2))
    }

    pub async fn start(&self, runner: &ScriptedRunner) -> Runtime {
        self.builder(runner).start().await.expect("runtime starts")
    }
}

/// Creates a top-level session `id` (or a child of `parent`).
pub async fn create(runtime: &Runtime, id: &str, parent: Option<&SessionId>) -> SessionId {
    let id = SessionId::new(id).expect("valid id");
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            parent_id: parent.cloned(),
            directory: "/work".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    id
}

/// Waits until `check` holds, polling every few milliseconds.
///
/// # Panics
/// After [`WAIT`], naming `what`.
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Reliability helpers (crash matrix, store faults, bad input, load): a store snapshot read with
// plain rusqlite and the invariants every test of those suites checks on it, a deterministic
// PRNG, and a runner that promotes prompts and replies to each exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_sessions::event::{kind, ABORTED_MESSAGE, RESTART_NOTICE_TEXT};
use durable_sessions::{RunError, Runner, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

/// xorshift64*: a tiny deterministic PRNG, so a failing run can be replayed from its seed.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator for `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Self {
        Self(splitmix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`0` when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// SplitMix64: derives well-spread seeds from (base, index) pairs.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed for this run: `DS_SEED` when set (to replay a failure), else derived from the clock.
pub fn run_seed() -> u64 {
    std::env::var("DS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            splitmix(now ^ u64::from(std::process::id()))
        })
}

/// Prints one line on stdout and flushes it (child processes talk to their parent this way).
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The prompt body the reliability suites admit for message id `id`: deterministic, so a client
/// can retry it exactly.
pub fn prompt_body(id: &str) -> Value {
    json!({ "text": id })
}

/// One `session` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub parent: Option<String>,
    pub claimed: bool,
    pub attempts: u32,
    pub claim_boot: Option<String>,
}

/// One `event` row.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub seq: u64,
    pub kind: String,
    pub data: Value,
}

/// One `session_input` row.
#[derive(Debug, Clone, PartialEq)]
pub struct InputRow {
    pub session: String,
    pub admitted_seq: u64,
    pub promoted_seq: Option<u64>,
    pub prompt: Value,
    pub delivery: String,
}

/// One `session_message` row.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRow {
    pub session: String,
    pub kind: String,
    pub seq: u64,
    pub data: Value,
}

/// A consistent snapshot of the whole database, read in one transaction with plain rusqlite.
#[derive(Debug, Clone, Default)]
pub struct StoreView {
    pub sessions: BTreeMap<String, SessionRow>,
    pub events: BTreeMap<String, Vec<EventRow>>,
    pub sequences: BTreeMap<String, u64>,
    pub inputs: BTreeMap<String, InputRow>,
    pub messages: BTreeMap<String, MessageRow>,
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stored JSON {text:?}: {e}"))
}

impl StoreView {
    /// Reads the database at `path`; an empty view when the file does not exist yet.
    pub fn read(path: &Path) -> StoreView {
        if !path.exists() {
            return StoreView::default();
        }
        let mut conn = rusqlite::Connection::open(path).expect("open the database");
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        let tx = conn.transaction().expect("read transaction");
        let mut view = StoreView::default();
        let has_schema: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = 'session'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if has_schema == 0 {
            return view;
        }
        let mut stmt = tx
            .prepare(
                "SELECT id, parent_id, time_suspended, resume_attempts, claim_boot FROM session",
            )
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    SessionRow {
                        parent: r.get(1)?,
                        claimed: r.get::<_, Option<i64>>(2)?.is_some(),
                        attempts: r.get(3)?,
                        claim_boot: r.get(4)?,
                    },
                ))
            })
            .unwrap();
        for row in rows {
            let (id, row) = row.unwrap();
            view.sessions.insert(id, row);
        }
        drop(stmt);
        let mut stmt = tx
            .prepare("SELECT aggregate_id, seq, type, data FROM event ORDER BY aggregate_id, seq")
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, seq, kind, data) = row.unwrap();
            view.events.entry(id).or_default().push(EventRow {
                seq: seq as u64,
                kind,
                data: parse_json(&data),
            });
        }
        drop(stmt);
        let mut stmt = tx
            .prepare("SELECT aggregate_id, seq FROM event_sequence")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .unwrap();
        for row in rows {
            let (id, seq) = row.unwrap();
            view.sequences.insert(id, seq as u64);
        }
        drop(stmt);
        let mut stmt = tx
            .prepare(
                "SELECT id, session_id, admitted_seq, promoted_seq, prompt, delivery \
                 FROM session_input",
            )
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, session, admitted, promoted, prompt, delivery) = row.unwrap();
            view.inputs.insert(
                id,
                InputRow {
                    session,
                    admitted_seq: admitted as u64,
                    promoted_seq: promoted.map(|s| s as u64),
                    prompt: parse_json(&prompt),
                    delivery,
                },
            );
        }
        drop(stmt);
        let mut stmt = tx
            .prepare("SELECT id, session_id, type, seq, data FROM session_message")
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, session, kind, seq, data) = row.unwrap();
            view.messages.insert(
                id,
                MessageRow {
                    session,
                    kind,
                    seq: seq as u64,
                    data: parse_json(&data),
                },
            );
        }
        drop(stmt);
        tx.commit().unwrap();
        view
    }

    /// Row counts of `session`, `session_input`, `session_message` and `event`.
    pub fn counts(&self) -> [usize; 4] {
        [
            self.sessions.len(),
            self.inputs.len(),
            self.messages.len(),
            self.events.values().map(Vec::len).sum(),
        ]
    }

    /// The sessions holding a claim.
    pub fn claimed(&self) -> BTreeSet<String> {
        self.sessions
            .iter()
            .filter(|(_, row)| row.claimed)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The inputs still pending (not promoted).
    pub fn pending(&self) -> BTreeSet<String> {
        self.inputs
            .iter()
            .filter(|(_, row)| row.promoted_seq.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The seq of the session's latest `session.interrupt.requested` event (its durable fence).
    pub fn interrupt_fence(&self, session: &str) -> Option<u64> {
        self.events
            .get(session)?
            .iter()
            .filter(|e| e.kind == kind::INTERRUPT_REQUESTED)
            .map(|e| e.seq)
            .max()
    }

    /// How many events of `kind` the session has.
    pub fn count_kind(&self, session: &str, event: &str) -> usize {
        self.events
            .get(session)
            .map_or(0, |evs| evs.iter().filter(|e| e.kind == event).count())
    }

    /// Restart notices (`session.synthetic` with the restart text) of the session.
    pub fn notices(&self, session: &str) -> usize {
        self.events
            .get(session)
            .map_or(0, |evs| evs.iter().filter(|e| is_restart_notice(e)).count())
    }

    /// `aborted` failures of the session.
    pub fn aborts(&self, session: &str) -> usize {
        self.events
            .get(session)
            .map_or(0, |evs| evs.iter().filter(|e| is_abort(e)).count())
    }

    /// Assistant replies per user message id, over the whole store.
    pub fn replies(&self) -> BTreeMap<String, usize> {
        let mut replies = BTreeMap::new();
        for row in self.messages.values() {
            if row.kind == "assistant" {
                if let Some(to) = row.data.get("reply_to").and_then(Value::as_str) {
                    *replies.entry(to.to_string()).or_insert(0) += 1;
                }
            }
        }
        replies
    }

    /// Every violation of the store-wide invariants, empty when they all hold:
    ///
    /// - per session, event seqs are exactly `0..=max` (no gap, no duplicate), the first event is
    ///   `session.created`, and `event_sequence` holds `max`;
    /// - replaying the log's claims (`started` claims; succeeded/failed/non-shutdown interrupted
    ///   release) matches the `session` row, a released row has 0 attempts, a restart notice or
    ///   an `aborted` failure only ever follows a live claim (nothing resurrected: a
    ///   user-interrupted turn is never resumed), a claim episode has at most `max_attempts`
    ///   notices and its row at least as many attempts as notices;
    /// - every inbox row has its `session.prompt.admitted` event at `admitted_seq`; a promoted
    ///   row has exactly one `session.prompt.promoted` event, at `promoted_seq`, and its `user`
    ///   transcript row at that seq; a pending row has no promoted event; every admitted and
    ///   promoted event has its row (nothing half-committed);
    /// - every transcript row is backed by the event at its seq; an assistant reply answers a
    ///   promoted user message of its own session, once.
    pub fn violations(&self, max_attempts: u32) -> Vec<String> {
        let mut bad = Vec::new();
        for (session, events) in &self.events {
            for (i, e) in events.iter().enumerate() {
                if e.seq != i as u64 {
                    bad.push(format!(
                        "{session}: event #{i} has seq {} (gap or duplicate)",
                        e.seq
                    ));
                    break;
                }
            }
            if events.first().is_some_and(|e| e.kind != kind::CREATED) {
                bad.push(format!("{session}: first event is {}", events[0].kind));
            }
            let last = events.last().map(|e| e.seq);
            if self.sequences.get(session).copied() != last {
                bad.push(format!(
                    "{session}: event_sequence {:?} but last event {last:?}",
                    self.sequences.get(session)
                ));
            }
            if !self.sessions.contains_key(session) {
                bad.push(format!("{session}: events without a session row"));
            }
        }
        for (session, row) in &self.sessions {
            let events = self.events.get(session).map_or(&[][..], Vec::as_slice);
            if events.is_empty() {
                bad.push(format!(
                    "{session}: a session row without its created event"
                ));
            }
            if row.parent.is_some() {
                continue;
            }
            let (mut claimed, mut notices) = (false, 0u32);
            for e in events {
                match e.kind.as_str() {
                    k if k == kind::EXECUTION_STARTED => {
                        if !claimed {
                            notices = 0;
                        }
                        claimed = true;
                    }
                    k if k == kind::EXECUTION_SUCCEEDED || k == kind::EXECUTION_FAILED => {
                        if is_abort(e) {
                            if !claimed {
                                bad.push(format!("{session}#{}: aborted without a claim", e.seq));
                            }
                            if notices > max_attempts {
                                bad.push(format!(
                                    "{session}#{}: aborted after {notices} notices",
                                    e.seq
                                ));
                            }
                        }
                        claimed = false;
                        notices = 0;
                    }
                    k if k == kind::EXECUTION_INTERRUPTED
                        && e.data.get("reason").and_then(Value::as_str) != Some("shutdown") =>
                    {
                        claimed = false;
                        notices = 0;
                    }
                    _ if is_restart_notice(e) => {
                        if !claimed {
                            bad.push(format!(
                                "{session}#{}: restart notice for a released turn (resurrected)",
                                e.seq
                            ));
                        }
                        notices += 1;
                        if notices > max_attempts {
                            bad.push(format!(
                                "{session}#{}: {notices} notices for one turn, budget {max_attempts}",
                                e.seq
                            ));
                        }
                    }
                    _ => {}
                }
            }
            if row.claimed != claimed {
                bad.push(format!(
                    "{session}: row claimed={} but the log says claimed={claimed}",
                    row.claimed
                ));
            }
            if !row.claimed && (row.attempts != 0 || row.claim_boot.is_some()) {
                bad.push(format!("{session}: released row keeps {row:?}"));
            }
            if row.claimed && row.attempts < notices {
                bad.push(format!(
                    "{session}: {} attempts counted but {notices} notices published",
                    row.attempts
                ));
            }
        }
        let event_at = |session: &str, seq: u64| -> Option<&EventRow> {
            self.events.get(session)?.get(usize::try_from(seq).ok()?)
        };
        let message_id = |e: &EventRow| -> Option<String> {
            e.data
                .get("messageID")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        // Every promotion event, by prompt id: (session, seq).
        let mut promoted_at: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (session, events) in &self.events {
            for e in events.iter().filter(|e| e.kind == kind::PROMPT_PROMOTED) {
                if let Some(id) = e.data.get("messageID").and_then(Value::as_str) {
                    if self.inputs.get(id).is_some_and(|r| &r.session == session) {
                        promoted_at.entry(id).or_default().push(e.seq);
                    }
                }
            }
        }
        for (id, input) in &self.inputs {
            match event_at(&input.session, input.admitted_seq) {
                Some(e)
                    if e.kind == kind::PROMPT_ADMITTED
                        && message_id(e).as_deref() == Some(id)
                        && e.data.get("prompt") == Some(&input.prompt) => {}
                other => bad.push(format!("input {id}: admitted event is {other:?}")),
            }
            let promotions = promoted_at.get(id.as_str()).map_or(&[][..], Vec::as_slice);
            match input.promoted_seq {
                None if promotions.is_empty() => {}
                Some(seq) if promotions == [seq] => match self.messages.get(id) {
                    Some(m) if m.kind == "user" && m.seq == seq && m.session == input.session => {}
                    other => bad.push(format!(
                        "input {id}: promoted at {seq}, transcript row {other:?}"
                    )),
                },
                promoted => bad.push(format!(
                    "input {id}: promoted_seq {promoted:?} but promoted events at {promotions:?}"
                )),
            }
        }
        for (session, events) in &self.events {
            for e in events {
                let id = message_id(e);
                if e.kind == kind::PROMPT_ADMITTED || e.kind == kind::PROMPT_PROMOTED {
                    let row = id.as_ref().and_then(|id| self.inputs.get(id));
                    if row.is_none_or(|r| &r.session != session) {
                        bad.push(format!(
                            "{session}#{}: {} without its inbox row",
                            e.seq, e.kind
                        ));
                    }
                }
                if e.kind == kind::MESSAGE_APPENDED {
                    let row = id.as_ref().and_then(|id| self.messages.get(id));
                    if row.is_none_or(|r| &r.session != session || r.seq != e.seq) {
                        bad.push(format!(
                            "{session}#{}: appended message without its row",
                            e.seq
                        ));
                    }
                }
            }
        }
        let replies = self.replies();
        for (id, message) in &self.messages {
            let backing = event_at(&message.session, message.seq);
            let expected = if message.kind == "user" {
                kind::PROMPT_PROMOTED
            } else {
                kind::MESSAGE_APPENDED
            };
            if backing.is_none_or(|e| e.kind != expected || message_id(e).as_deref() != Some(id)) {
                bad.push(format!("message {id}: backing event {backing:?}"));
            }
            if message.kind == "user" && replies.get(id).copied().unwrap_or(0) > 1 {
                bad.push(format!("message {id}: answered {} times", replies[id]));
            }
            if message.kind == "assistant" {
                if let Some(to) = message.data.get("reply_to").and_then(Value::as_str) {
                    match self.messages.get(to) {
                        Some(u)
                            if u.kind == "user"
                                && u.session == message.session
                                && u.seq < message.seq => {}
                        other => bad.push(format!("reply {id} answers {to}: {other:?}")),
                    }
                }
            }
        }
        bad
    }

    /// Panics with every violation of [`StoreView::violations`], prefixed by `context`.
    pub fn assert_invariants(&self, max_attempts: u32, context: &str) {
        let bad = self.violations(max_attempts);
        assert!(
            bad.is_empty(),
            "{context}: {} invariant violation(s):\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}

/// Whether `e` is the sweep's restart notice.
pub fn is_restart_notice(e: &EventRow) -> bool {
    e.kind == kind::SYNTHETIC
        && e.data.get("text").and_then(Value::as_str) == Some(RESTART_NOTICE_TEXT)
}

/// Whether `e` is the `aborted` failure of a turn over its resume budget.
pub fn is_abort(e: &EventRow) -> bool {
    e.kind == kind::EXECUTION_FAILED
        && e.data["error"]["type"] == "aborted"
        && e.data["error"]["message"] == ABORTED_MESSAGE
}

/// What an [`EchoRunner`] does, besides promoting and replying.
#[derive(Debug, Clone, Default)]
pub struct EchoOptions {
    /// Print `DRAIN <session> <forced>` when a drain starts (child processes).
    pub print: bool,
    /// After promoting and at most one reply, print `MID_DRAIN <session>` and block forever.
    pub mid_drain: bool,
    /// Pause up to this many microseconds between steps (seeded), to widen race windows.
    pub jitter_us: u64,
    /// Seed of the pauses.
    pub seed: u64,
}

/// A runner standing in for an agent: each drain promotes every pending steer prompt, then
/// appends one `assistant` reply (`{"reply_to": <id>}`) for each user message of the transcript
/// that has none yet. Because it replies from the durable transcript, a drain resumed after a
/// crash answers what the crashed one did not, and never answers anything twice.
#[derive(Clone, Default)]
pub struct EchoRunner {
    options: EchoOptions,
    rng: Arc<AtomicU64>,
    /// Drains started, per (session, forced): bounded by the sessions, so a long load run's
    /// memory measures the runtime, not this record.
    drains: Arc<Mutex<BTreeMap<(String, bool), usize>>>,
}

impl std::fmt::Debug for EchoRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoRunner")
            .field("options", &self.options)
            .finish()
    }
}

impl EchoRunner {
    pub fn new(options: EchoOptions) -> Self {
        let rng = Arc::new(AtomicU64::new(splitmix(options.seed) | 1));
        Self {
            options,
            rng,
            drains: Arc::default(),
        }
    }

    /// How many drains started, per (session, forced).
    pub fn drains(&self) -> BTreeMap<(String, bool), usize> {
        self.drains.lock().unwrap().clone()
    }

    fn pause(&self) -> Option<Duration> {
        if self.options.jitter_us == 0 {
            return None;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        Some(Duration::from_micros(x % (self.options.jitter_us + 1)))
    }
}

fn run_error(e: durable_sessions::Error) -> RunError {
    RunError::Other(e.to_string())
}

/// The user messages of `turn`'s transcript that have no assistant reply yet, in order.
pub async fn unreplied(turn: &Turn) -> Result<Vec<String>, RunError> {
    let context = turn.context().await.map_err(run_error)?;
    let replied: BTreeSet<String> = context
        .iter()
        .filter(|m| m.kind == "assistant")
        .filter_map(|m| {
            m.data
                .get("reply_to")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    Ok(context
        .iter()
        .filter(|m| m.kind == "user" && !replied.contains(m.id.as_str()))
        .map(|m| m.id.to_string())
        .collect())
}

impl Runner for EchoRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let session = turn.session_id().to_string();
        *self
            .drains
            .lock()
            .unwrap()
            .entry((session.clone(), turn.is_forced()))
            .or_insert(0) += 1;
        if self.options.print {
            say(&format!("DRAIN {session} {}", turn.is_forced()));
        }
        let this = self.clone();
        async move {
            if let Some(pause) = this.pause() {
                actix_rt::time::sleep(pause).await;
            }
            turn.promote_steer(None).await.map_err(run_error)?;
            let todo = unreplied(&turn).await?;
            let take = if this.options.mid_drain {
                1
            } else {
                todo.len()
            };
            for id in todo.into_iter().take(take) {
                if let Some(pause) = this.pause() {
                    actix_rt::time::sleep(pause).await;
                }
                turn.append_message("assistant", json!({ "reply_to": id }))
                    .await
                    .map_err(run_error)?;
            }
            if this.options.mid_drain {
                say(&format!("MID_DRAIN {session}"));
                futures::future::pending::<()>().await;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// How long a parent waits for a child process's marker line before failing.
pub const CHILD_WAIT: Duration = Duration::from_secs(20);

/// A running child; killed (SIGKILL) and reaped on drop if the test failed first.
pub struct ChildProcess {
    process: std::process::Child,
    /// Complete stdout lines, from a reader thread.
    lines: std::sync::mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// The lines read so far.
    seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl ChildProcess {
    /// Re-executes this test binary, running only `test`, with `env` set (and `DS_CRASH_POINT`
    /// cleared unless `env` sets it); stdout is read line by line.
    pub fn spawn(test: &str, env: &[(&str, String)]) -> ChildProcess {
        let exe = std::env::current_exe().expect("current test binary");
        let mut command = std::process::Command::new(exe);
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env_remove("DS_CRASH_POINT")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut process = command.spawn().expect("spawn a child process");
        let stdout = process.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut stdout = std::io::BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match std::io::BufRead::read_until(&mut stdout, b'\n', &mut line) {
                    // A line cut by the kill (no newline) was never fully printed: drop it.
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.last() != Some(&b'\n') => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                        if tx.send(text).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut stderr = process.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        ChildProcess {
            process,
            lines,
            reader: Some(reader),
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.process.id()
    }

    /// Reads stdout until a line starting with `prefix`; panics (showing the child's output)
    /// when the child exits first or [`CHILD_WAIT`] passes.
    pub fn wait_for(&mut self, prefix: &str) {
        let deadline = std::time::Instant::now() + CHILD_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => self.fail(&format!("no {prefix:?} from the child ({e})")),
            }
        }
    }

    /// Reads stdout until it has seen a line starting with each of `prefixes`, in any order.
    pub fn wait_for_all(&mut self, prefixes: &[&str]) {
        for prefix in prefixes {
            if !self.seen.iter().any(|l| l.starts_with(prefix)) {
                self.wait_for(prefix);
            }
        }
    }

    pub fn fail(&mut self, why: &str) -> ! {
        let _ = self.process.kill();
        let status = self.process.wait();
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        panic!(
            "{why}; child status {status:?}\n--- child stdout ---\n{}\n--- child stderr ---\n{stderr}",
            self.seen.join("\n")
        );
    }

    /// SIGKILLs the child, reaps it and returns every complete line it printed.
    pub fn kill(mut self) -> Vec<String> {
        if let Ok(Some(status)) = self.process.try_wait() {
            self.fail(&format!("the child exited on its own ({status})"));
        }
        self.process.kill().expect("SIGKILL the child");
        let status = self.process.wait().expect("reap the child");
        if std::os::unix::process::ExitStatusExt::signal(&status) != Some(9) {
            self.fail(&format!("the child did not die of SIGKILL: {status}"));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(self.lines.try_iter());
        lines
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// A valid session id.
pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("valid session id")
}

/// A valid message id.
pub fn mid(s: &str) -> durable_sessions::MessageId {
    durable_sessions::MessageId::new(s).expect("valid message id")
}

/// The prompt `{"text": s}`.
pub fn text(s: &str) -> serde_json::Value {
    serde_json::json!({ "text": s })
}

/// `SELECT COUNT(*)` (or any single integer) on the database file.
pub fn count(db: &TestDb, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(&db.path).expect("open db");
    conn.query_row(sql, [], |row| row.get(0)).expect("count")
}
