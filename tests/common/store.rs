//! A consistent snapshot of a database (a SQLite file read with plain rusqlite, a PostgreSQL
//! database with the plain `postgres` client), and the store-wide invariants every reliability
//! suite checks on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use durable_sessions::{kind, ABORTED_MESSAGE, RESTART_NOTICE_TEXT};
use serde_json::Value;

/// One `session` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub parent: Option<String>,
    pub claimed: bool,
    pub attempts: u32,
    pub claim_boot: Option<String>,
    /// The seq of the `session.execution.started` that took the claim (kept across resumes).
    pub claim_seq: Option<u64>,
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
    /// The durable wake mark: admitted with `resume` and not yet served, fenced or given up.
    pub wake: bool,
}

/// One `session_message` row.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRow {
    pub session: String,
    pub kind: String,
    pub seq: u64,
    pub data: Value,
    /// A `user` message whose turn a user interrupted.
    pub interrupted: bool,
}

/// A consistent snapshot of the whole database, read in one transaction.
#[derive(Debug, Clone, Default)]
pub struct StoreView {
    pub sessions: BTreeMap<String, SessionRow>,
    pub events: BTreeMap<String, Vec<EventRow>>,
    pub sequences: BTreeMap<String, u64>,
    pub inputs: BTreeMap<String, InputRow>,
    pub messages: BTreeMap<String, MessageRow>,
    /// Sessions with a recent event entry below a settled one (SQLite schema version 7: a
    /// settle takes every recent entry, so each session's recent seqs are above its settled
    /// ones).
    pub misordered: BTreeSet<String>,
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stored JSON {text:?}: {e}"))
}

impl StoreView {
    /// Reads the database at `path` (a SQLite file, or a PostgreSQL URL); an empty view when
    /// the file does not exist yet, or holds no schema.
    pub fn read(path: &Path) -> StoreView {
        #[cfg(feature = "postgres")]
        if path.to_str().is_some_and(|p| p.starts_with("postgres")) {
            return Self::read_postgres(path);
        }
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
        // Schema version 6 keeps the claims in a table of their own.
        let mut stmt = tx
            .prepare(
                "SELECT s.id, s.parent_id, c.time_suspended, COALESCE(c.resume_attempts, 0), \
                 c.claim_boot, c.claim_seq \
                 FROM session s LEFT JOIN session_claim c ON c.session_id = s.id",
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
                        claim_seq: r.get::<_, Option<i64>>(5)?.map(|s| s as u64),
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
        let split: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM pragma_table_info('event') WHERE name = 'recent'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if split > 0 {
            let mut stmt = tx
                .prepare(
                    "SELECT aggregate_id FROM event GROUP BY aggregate_id \
                     HAVING MIN(CASE WHEN recent = 1 THEN seq END) \
                          < MAX(CASE WHEN recent = 0 THEN seq END)",
                )
                .unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
            view.misordered = rows.map(Result::unwrap).collect();
        }
        // Schema version 6 keeps no counter: a log's next seq is one past its newest, never
        // below its floor (`event_floor`, written by a compaction that kept no event).
        let mut stmt = tx
            .prepare(
                "SELECT id, MAX(seq) FROM (SELECT aggregate_id AS id, seq FROM event \
                 UNION ALL SELECT aggregate_id, seq - 1 FROM event_floor) \
                 GROUP BY id HAVING MAX(seq) >= 0",
            )
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
                "SELECT id, session_id, admitted_seq, promoted_seq, prompt, delivery, wake \
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
                    r.get::<_, bool>(6)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, session, admitted, promoted, prompt, delivery, wake) = row.unwrap();
            view.inputs.insert(
                id,
                InputRow {
                    session,
                    admitted_seq: admitted as u64,
                    promoted_seq: promoted.map(|s| s as u64),
                    prompt: parse_json(&prompt),
                    delivery,
                    wake,
                },
            );
        }
        drop(stmt);
        let mut stmt = tx
            .prepare("SELECT id, session_id, type, seq, data, interrupted FROM session_message")
            .unwrap();
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, bool>(5)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, session, kind, seq, data, interrupted) = row.unwrap();
            view.messages.insert(
                id,
                MessageRow {
                    session,
                    kind,
                    seq: seq as u64,
                    data: parse_json(&data),
                    interrupted,
                },
            );
        }
        drop(stmt);
        tx.commit().unwrap();
        view
    }

    /// [`StoreView::read`] of a PostgreSQL database (`path` is its URL), in one snapshot
    /// ([`super::pg_snapshot`]): the same tables and columns, booleans read as integers; an
    /// empty view before the first runtime created the schema.
    #[cfg(feature = "postgres")]
    fn read_postgres(db: &Path) -> StoreView {
        let mut view = StoreView::default();
        let url = db.to_str().expect("a URL");
        let has_schema =
            "SELECT CAST(CAST(to_regclass('session') IS NOT NULL AS INTEGER) AS BIGINT)";
        if super::count(db, has_schema) == 0 {
            return view;
        }
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let int = |v: &Value| v.as_i64();
        let [sessions, events, sequences, inputs, messages]: [Vec<Vec<Value>>; 5] =
            super::pg_snapshot(
                url,
                &[
                    "SELECT id, parent_id, time_suspended, resume_attempts, claim_boot, claim_seq \
                     FROM session",
                    "SELECT aggregate_id, seq, type, data FROM event ORDER BY aggregate_id, seq",
                    "SELECT aggregate_id, seq FROM event_sequence",
                    "SELECT id, session_id, admitted_seq, promoted_seq, prompt, delivery, \
                     CAST(CAST(wake AS INTEGER) AS BIGINT) FROM session_input",
                    "SELECT id, session_id, type, seq, data, \
                     CAST(CAST(interrupted AS INTEGER) AS BIGINT) FROM session_message",
                ],
            )
            .try_into()
            .expect("five result sets");
        for r in sessions {
            view.sessions.insert(
                text(&r[0]).expect("id"),
                SessionRow {
                    parent: text(&r[1]),
                    claimed: !r[2].is_null(),
                    attempts: int(&r[3]).expect("attempts") as u32,
                    claim_boot: text(&r[4]),
                    claim_seq: int(&r[5]).map(|s| s as u64),
                },
            );
        }
        for r in events {
            view.events
                .entry(text(&r[0]).expect("id"))
                .or_default()
                .push(EventRow {
                    seq: int(&r[1]).expect("seq") as u64,
                    kind: text(&r[2]).expect("type"),
                    data: parse_json(&text(&r[3]).expect("data")),
                });
        }
        for r in sequences {
            view.sequences
                .insert(text(&r[0]).expect("id"), int(&r[1]).expect("seq") as u64);
        }
        for r in inputs {
            view.inputs.insert(
                text(&r[0]).expect("id"),
                InputRow {
                    session: text(&r[1]).expect("session"),
                    admitted_seq: int(&r[2]).expect("admitted") as u64,
                    promoted_seq: int(&r[3]).map(|s| s as u64),
                    prompt: parse_json(&text(&r[4]).expect("prompt")),
                    delivery: text(&r[5]).expect("delivery"),
                    wake: int(&r[6]) == Some(1),
                },
            );
        }
        for r in messages {
            view.messages.insert(
                text(&r[0]).expect("id"),
                MessageRow {
                    session: text(&r[1]).expect("session"),
                    kind: text(&r[2]).expect("type"),
                    seq: int(&r[3]).expect("seq") as u64,
                    data: parse_json(&text(&r[4]).expect("data")),
                    interrupted: int(&r[5]) == Some(1),
                },
            );
        }
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

    /// The seq of the session's latest `session.interrupt.requested` event before `seq`.
    pub fn interrupt_fence_before(&self, session: &str, seq: u64) -> Option<u64> {
        self.events
            .get(session)?
            .iter()
            .filter(|e| e.kind == kind::INTERRUPT_REQUESTED && e.seq < seq)
            .map(|e| e.seq)
            .max()
    }

    /// Whether a `session.interrupt.requested` of the session came after `seq`: it fenced
    /// whatever was admitted at `seq`.
    pub fn interrupted_after(&self, session: &str, seq: u64) -> bool {
        self.interrupt_fence(session)
            .is_some_and(|fence| fence > seq)
    }

    /// Whether an `aborted` failure of the session came after `seq`: the turn over its resume
    /// budget gave up what was owed then.
    pub fn aborted_after(&self, session: &str, seq: u64) -> bool {
        self.events
            .get(session)
            .is_some_and(|evs| evs.iter().any(|e| e.seq > seq && is_abort(e)))
    }

    /// Whether the session was owed a turn at its event `seq`, as far as the log tells: it held
    /// an input admitted before `seq`, not promoted before it, and admitted after the session's
    /// latest interrupt request before it. (The wake mark itself is not in the log: this is what
    /// a restart notice of a session holding no claim needs.)
    pub fn owed_at(&self, session: &str, seq: u64) -> bool {
        let fence = self.interrupt_fence_before(session, seq);
        self.inputs.values().any(|input| {
            input.session == session
                && input.admitted_seq < seq
                && input.promoted_seq.is_none_or(|promoted| promoted > seq)
                && fence.is_none_or(|fence| input.admitted_seq > fence)
        })
    }

    /// The sessions the restart sweep adopts: top-level, holding no claim (or a claim a user
    /// interrupt fenced, which the sweep releases first), and holding a pending input with its
    /// wake mark admitted after the session's latest interrupt request (an acknowledged prompt
    /// whose turn never started).
    pub fn owed(&self) -> BTreeSet<String> {
        self.sessions
            .iter()
            .filter(|(id, row)| {
                let fence = self.interrupt_fence(id);
                row.parent.is_none()
                    && (!row.claimed || self.interrupt_fenced(id))
                    && self.inputs.values().any(|input| {
                        &input.session == *id
                            && input.wake
                            && input.promoted_seq.is_none()
                            && fence.is_none_or(|fence| input.admitted_seq > fence)
                    })
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether the session's claimed turn is fenced by a user interrupt: its latest interrupt
    /// request came after the turn's claim (`claim_seq`) and the turn promoted nothing admitted
    /// after that request. The restart sweep records such a turn as `interrupted{user}` instead
    /// of resuming it.
    pub fn interrupt_fenced(&self, session: &str) -> bool {
        let Some(row) = self.sessions.get(session).filter(|row| row.claimed) else {
            return false;
        };
        let (Some(claim), Some(fence)) = (row.claim_seq, self.interrupt_fence(session)) else {
            return false;
        };
        fence > claim
            && !self.messages.iter().any(|(id, m)| {
                m.session == session
                    && m.kind == "user"
                    && m.seq > claim
                    && self.inputs.get(id).is_some_and(|i| i.admitted_seq > fence)
            })
    }

    /// Whether the session's latest turn, settled in the boot whose first event is `from`,
    /// scheduled the next queued prompt, and that prompt's turn has not claimed yet: the turn
    /// promoted a prompt, and a `queue` input admitted after the session's latest interrupt
    /// request was still pending at the terminal. Then a turn of its own is owed to it (queued
    /// prompts continue). An interrupt request after the terminal fences that input like any
    /// other admitted before it (its wake is dropped; only prompts admitted after the request
    /// still run), so nothing is due then. The restart sweep's own outcomes — an `aborted`
    /// failure, and the `interrupted{user}` of a fenced turn, the boot's first event — schedule
    /// nothing.
    pub fn continuation_due(&self, session: &str, from: u64) -> bool {
        let Some(events) = self.events.get(session) else {
            return false;
        };
        let lifecycle = |e: &&EventRow| {
            e.kind == kind::EXECUTION_STARTED
                || e.kind == kind::EXECUTION_SUCCEEDED
                || e.kind == kind::EXECUTION_FAILED
                || e.kind == kind::EXECUTION_INTERRUPTED
        };
        let Some(end) = events.iter().rev().find(lifecycle) else {
            return false;
        };
        if end.seq <= from || !is_releasing_terminal(end) || is_abort(end) {
            return false;
        }
        // The claim the terminal released: the first `started` after the previous release.
        let claim = events
            .iter()
            .rev()
            .skip_while(|e| e.seq >= end.seq)
            .take_while(|e| !is_releasing_terminal(e))
            .filter(|e| e.kind == kind::EXECUTION_STARTED)
            .map(|e| e.seq)
            .last();
        let Some(claim) = claim else {
            return false;
        };
        let progress = self
            .messages
            .values()
            .any(|m| m.session == session && m.kind == "user" && m.seq > claim && m.seq < end.seq);
        let fence = self.interrupt_fence(session);
        let queued = self.inputs.values().any(|input| {
            input.session == session
                && input.delivery == "queue"
                && input.admitted_seq < end.seq
                && input.promoted_seq.is_none_or(|promoted| promoted > end.seq)
                && fence.is_none_or(|fence| input.admitted_seq > fence)
        });
        progress && queued
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

    /// Every step the log records, by (session, turn id, step name): how often it was started,
    /// its outcome, and how its turn ended.
    pub fn steps(&self) -> BTreeMap<(String, u64, String), StepLog> {
        let mut steps: BTreeMap<(String, u64, String), StepLog> = BTreeMap::new();
        for (session, events) in &self.events {
            let mut turn: Option<u64> = None;
            let mut ends: BTreeMap<u64, String> = BTreeMap::new();
            for e in events {
                if e.kind == kind::EXECUTION_STARTED {
                    let named = e.data.get("turn").and_then(Value::as_u64);
                    turn = turn.or(Some(named.unwrap_or(e.seq)));
                } else if is_releasing_terminal(e) {
                    if let Some(id) = turn.take() {
                        ends.insert(id, e.kind.clone());
                    }
                } else if e.kind.starts_with("session.step.") {
                    let (Some(of), Some(name)) = (
                        e.data.get("turn").and_then(Value::as_u64),
                        e.data.get("step").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    let step = steps
                        .entry((session.clone(), of, name.to_string()))
                        .or_default();
                    if e.kind == kind::STEP_STARTED {
                        step.started += 1;
                        step.outcome = None;
                    } else {
                        step.outcome = Some(e.kind.clone());
                    }
                }
            }
            for ((of_session, turn, _), step) in steps.iter_mut() {
                if of_session == session {
                    step.turn_end = ends.get(turn).cloned();
                }
            }
        }
        steps
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
    ///   `session.created`, and the seq counter holds `max` (PostgreSQL's `event_sequence`;
    ///   SQLite derives it from the log and its start);
    /// - replaying the log's claims (`started` claims; succeeded/failed/non-shutdown interrupted
    ///   release) matches the `session` row (its `claim_seq` is the `started` that began the
    ///   claim), a released row has 0 attempts and no claim seq; a restart notice is followed,
    ///   at the next seq, by the claim it publishes, and while no claim is held it is legal only
    ///   for a session owed a turn (an input admitted before the notice, pending at it, admitted
    ///   after the latest interrupt request before it: the sweep adopting an acknowledged prompt
    ///   whose turn never started); anything else is resurrected (a user-interrupted turn is
    ///   never resumed); a claim episode has at most `max_attempts` notices and its row at least
    ///   as many attempts as notices;
    /// - no `started` follows an open claim without a releasing terminal or a restart notice in
    ///   between (no turn is claimed over another);
    /// - no turn has two terminals: every terminal (releasing or `interrupted{shutdown}`)
    ///   follows a live claim, so between two `started` that begin a claim there is at most one
    ///   releasing terminal (an `aborted` one too);
    /// - every inbox row has its `session.prompt.admitted` event at `admitted_seq`; a promoted
    ///   row has exactly one `session.prompt.promoted` event, at `promoted_seq`, and its `user`
    ///   transcript row at that seq; a pending row has no promoted event; every admitted and
    ///   promoted event has its row (nothing half-committed);
    /// - every transcript row is backed by the event at its seq; an assistant reply answers a
    ///   promoted user message of its own session, once;
    /// - a `user` message is marked `interrupted` exactly when the turn that promoted it ended
    ///   with a non-shutdown `interrupted`, and no interrupted input is answered: a reply to it
    ///   precedes that terminal;
    /// - step records ([`step_violations`]): each is written inside a live claim, for the turn
    ///   that claim serves, with the step's key; an outcome answers an open intent of the same
    ///   attempt; a step whose outcome is recorded is never started again (a failed one only
    ///   after a retry's claim).
    pub fn violations(&self, max_attempts: u32) -> Vec<String> {
        let mut bad = Vec::new();
        for (session, events) in &self.events {
            let top = self
                .sessions
                .get(session)
                .is_some_and(|r| r.parent.is_none());
            if top {
                step_violations(session, events, &mut bad);
            }
        }
        for session in &self.misordered {
            bad.push(format!(
                "{session}: a recent event entry below a settled one"
            ));
        }
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
            // The seq of the `started` that began the live claim (the row's `claim_seq`).
            let mut claim_seq = None;
            // A restart notice adopted a session that held no claim (owed a turn): the claim it
            // publishes right behind it begins an episode that already has that notice.
            let mut adopting = false;
            // A restart notice came since the last `started`: a claim may be taken again.
            let mut noticed = false;
            for (i, e) in events.iter().enumerate() {
                if is_restart_notice(e) {
                    noticed = true;
                    if events
                        .get(i + 1)
                        .is_none_or(|next| next.kind != kind::EXECUTION_STARTED)
                    {
                        bad.push(format!(
                            "{session}#{}: restart notice not followed by its claim",
                            e.seq
                        ));
                    }
                    if !claimed {
                        if self.owed_at(session, e.seq) {
                            notices = 0;
                            adopting = true;
                        } else {
                            bad.push(format!(
                                "{session}#{}: restart notice for a released turn that was owed \
                                 nothing (resurrected)",
                                e.seq
                            ));
                        }
                    }
                    notices += 1;
                    if notices > max_attempts {
                        bad.push(format!(
                            "{session}#{}: {notices} notices for one turn, budget {max_attempts}",
                            e.seq
                        ));
                    }
                    continue;
                }
                if e.kind == kind::EXECUTION_STARTED {
                    if claimed && !noticed {
                        bad.push(format!(
                            "{session}#{}: execution.started over an open claim, with no \
                             terminal or restart notice in between",
                            e.seq
                        ));
                    }
                    noticed = false;
                    if !claimed {
                        claim_seq = Some(e.seq);
                        if !adopting {
                            notices = 0;
                        }
                    }
                    claimed = true;
                    adopting = false;
                } else if is_releasing_terminal(e) {
                    // Over a budget of 0, the sweep records an owed session as aborted at once.
                    let adopted_abort =
                        is_abort(e) && max_attempts == 0 && self.owed_at(session, e.seq);
                    if !claimed && !adopted_abort {
                        bad.push(format!(
                            "{session}#{}: {} {} without a live claim (a turn's second \
                             terminal, or the terminal of no turn)",
                            e.seq, e.kind, e.data
                        ));
                    }
                    if is_abort(e) && notices > max_attempts {
                        bad.push(format!(
                            "{session}#{}: aborted after {notices} notices",
                            e.seq
                        ));
                    }
                    claimed = false;
                    claim_seq = None;
                    notices = 0;
                } else if e.kind == kind::EXECUTION_INTERRUPTED && !claimed {
                    bad.push(format!(
                        "{session}#{}: interrupted{{shutdown}} without a live claim",
                        e.seq
                    ));
                }
            }
            if row.claimed != claimed {
                bad.push(format!(
                    "{session}: row claimed={} but the log says claimed={claimed}",
                    row.claimed
                ));
            }
            if !row.claimed
                && (row.attempts != 0 || row.claim_boot.is_some() || row.claim_seq.is_some())
            {
                bad.push(format!("{session}: released row keeps {row:?}"));
            }
            if row.claimed && row.claim_seq != claim_seq {
                bad.push(format!(
                    "{session}: row claim_seq {:?} but the claim began at {claim_seq:?}",
                    row.claim_seq
                ));
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
        // Per session, the seqs of the terminals that release a claim, ascending.
        let releases: BTreeMap<&str, Vec<&EventRow>> = self
            .events
            .iter()
            .map(|(session, events)| {
                let ends = events.iter().filter(|e| is_releasing_terminal(e)).collect();
                (session.as_str(), ends)
            })
            .collect();
        // The terminal that ended the turn which promoted (or appended) the message at `seq`.
        let ending = |session: &str, seq: u64| -> Option<&EventRow> {
            let ends = releases.get(session)?;
            ends.get(ends.partition_point(|e| e.seq < seq)).copied()
        };
        for (id, message) in &self.messages {
            let turn_end = ending(&message.session, message.seq);
            let user_interrupted = turn_end.is_some_and(|e| {
                e.kind == kind::EXECUTION_INTERRUPTED
                    && e.data.get("reason").and_then(Value::as_str) != Some("shutdown")
            });
            if message.interrupted != (message.kind == "user" && user_interrupted) {
                bad.push(format!(
                    "message {id} ({}): interrupted mark {} but its turn ended with {turn_end:?}",
                    message.kind, message.interrupted
                ));
            }
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
                    // No interrupted input is answered: a reply to a prompt whose turn a user
                    // interrupted was appended before that interrupt, by that turn.
                    if let Some(u) = self.messages.get(to).filter(|u| u.interrupted) {
                        let end = ending(&u.session, u.seq);
                        if end.is_none_or(|end| message.seq > end.seq) {
                            bad.push(format!(
                                "reply {id} (#{}) answers {to}, interrupted at {:?}",
                                message.seq,
                                end.map(|e| e.seq)
                            ));
                        }
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

/// One step of a turn, as the log records it ([`StoreView::steps`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLog {
    /// Its intents (`session.step.started`), over every attempt of the turn.
    pub started: usize,
    /// The kind of the outcome recorded after its latest intent, if any.
    pub outcome: Option<String>,
    /// The kind of the terminal that released its turn's claim, once it did.
    pub turn_end: Option<String>,
}

/// Where a step stands in the log, as [`step_violations`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepState {
    /// Its intent is recorded, by this attempt of the turn, and no outcome yet.
    Open(u64),
    Completed,
    /// Failed; a retry's claim since then lets it start again.
    Failed {
        cleared: bool,
    },
}

/// The violations of the step records of one session's log (`events`, in seq order): a step
/// record outside a live claim, or naming another turn than the claim serves (its first
/// `started`, or the turn a retry's `started` names), or a key other than
/// `<session>:<turn>:<step>`; an outcome (`completed` or `failed`) without an open intent, or of
/// another attempt than that intent's; an intent of a step whose outcome is recorded (a failed
/// one may start again after a retry's claim).
pub fn step_violations(session: &str, events: &[EventRow], bad: &mut Vec<String>) {
    let mut turn: Option<u64> = None;
    let mut steps: BTreeMap<(u64, String), StepState> = BTreeMap::new();
    for e in events {
        if e.kind == kind::EXECUTION_STARTED {
            let named = e.data.get("turn").and_then(Value::as_u64);
            if let Some(id) = named {
                for ((of, _), state) in steps.iter_mut() {
                    if *of == id {
                        if let StepState::Failed { cleared } = state {
                            *cleared = true;
                        }
                    }
                }
            }
            if turn.is_none() {
                turn = Some(named.unwrap_or(e.seq));
            }
            continue;
        }
        if is_releasing_terminal(e) {
            turn = None;
            continue;
        }
        let outcome = e.kind == kind::STEP_COMPLETED || e.kind == kind::STEP_FAILED;
        if e.kind != kind::STEP_STARTED && !outcome {
            continue;
        }
        let of = e.data.get("turn").and_then(Value::as_u64);
        let name = e
            .data
            .get("step")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let attempt = e.data.get("attempt").and_then(Value::as_u64);
        let at = format!("{session}#{} {} {name:?}", e.seq, e.kind);
        let (Some(of), Some(attempt)) = (of, attempt) else {
            bad.push(format!("{at}: no turn or attempt in {}", e.data));
            continue;
        };
        if turn != Some(of) {
            bad.push(format!(
                "{at} of turn {of}, but the live claim serves turn {turn:?}"
            ));
        }
        let state = steps.entry((of, name.to_string()));
        if e.kind == kind::STEP_STARTED {
            let key = format!("{session}:{of}:{name}");
            if e.data.get("key").and_then(Value::as_str) != Some(key.as_str()) {
                bad.push(format!("{at}: key {} is not {key:?}", e.data["key"]));
            }
            let previous = state.or_insert(StepState::Open(attempt));
            if matches!(
                previous,
                StepState::Completed | StepState::Failed { cleared: false }
            ) {
                bad.push(format!(
                    "{at}: started again after its outcome ({previous:?}) was recorded"
                ));
            }
            *previous = StepState::Open(attempt);
        } else {
            let settled = if e.kind == kind::STEP_COMPLETED {
                StepState::Completed
            } else {
                StepState::Failed { cleared: false }
            };
            match state {
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if *o.get() != StepState::Open(attempt) {
                        bad.push(format!(
                            "{at} of attempt {attempt}, but the step stands at {:?}",
                            o.get()
                        ));
                    }
                    o.insert(settled);
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    bad.push(format!("{at} without its intent"));
                    v.insert(settled);
                }
            }
        }
    }
}

/// Whether `e` is the sweep's restart notice.
pub fn is_restart_notice(e: &EventRow) -> bool {
    e.kind == kind::SYNTHETIC
        && e.data.get("text").and_then(Value::as_str) == Some(RESTART_NOTICE_TEXT)
}

/// Whether `e` is a terminal that releases the claim: `succeeded`, `failed`, or `interrupted`
/// for any reason but `shutdown`.
pub fn is_releasing_terminal(e: &EventRow) -> bool {
    e.kind == kind::EXECUTION_SUCCEEDED
        || e.kind == kind::EXECUTION_FAILED
        || (e.kind == kind::EXECUTION_INTERRUPTED
            && e.data.get("reason").and_then(Value::as_str) != Some("shutdown"))
}

/// Whether `e` is the `aborted` failure of a turn over its resume budget.
pub fn is_abort(e: &EventRow) -> bool {
    e.kind == kind::EXECUTION_FAILED
        && e.data["error"]["type"] == "aborted"
        && e.data["error"]["message"] == ABORTED_MESSAGE
}
