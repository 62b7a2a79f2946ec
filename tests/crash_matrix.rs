//! The crash matrix: nothing lost, nothing resurrected, nothing run twice,
//! never a crash loop, every acknowledged prompt runs — under real `SIGKILL`s of real processes.
//!
//! Each test re-executes this test binary as a child process (`--exact <test> --nocapture`, with
//! `DS_MATRIX_PLAN` selecting the child role). The child runs the runtime on a database — a SQLite
//! file in a temp directory, or (`postgres_backend_passes_the_crash_matrix`) a fresh PostgreSQL
//! database, as a node with a short lease — with an [`EchoRunner`] (each drain promotes the pending
//! steer prompts with `promote_steer(None)` and the oldest queued one with `promote_queue()`, then,
//! for each user message no user interrupted and none answered, runs the durable step
//! `reply:<message id>` and appends the reply it returned), creates sessions and admits
//! `steer` and `queue` prompts with `Sessions::prompt`, printing `ADMITTING <id> <session>
//! <delivery>` before and `ADMITTED <id>` once `prompt()` returned, and interrupts sessions. The
//! parent kills it with SIGKILL either at a named crash point (`DS_CRASH_POINT`, feature
//! `crash-points`: the thread reaching it prints `CRASH_POINT <name>` and blocks; three of them
//! are inside the reply step; the mid-drain point is the runner's own `MID_DRAIN` marker) or under a seeded workload — at a random instant,
//! or right after an acknowledgement or an interrupt — then reads the database with a plain client
//! and checks, after every kill (on PostgreSQL, once the killed node's connections closed and its
//! lease lapsed):
//!
//! - every acknowledged admission is in `session_input` (nothing lost), and nothing is
//!   half-committed: each input's `promoted_seq` matches exactly one `session.prompt.promoted`
//!   event and one `user` transcript row, every admitted/promoted/appended event has its row;
//! - per-session event seqs are `0..=max` with no gap or duplicate, and the log of every earlier
//!   boot is an untouched prefix of the new one (append-only);
//! - the claim replayed from the log matches the `session` row (and its `claim_seq`); a restart
//!   notice is followed by the claim it publishes, and follows a live claim — or, for a session
//!   holding none, is the adoption of a session owed a turn (a pending input admitted after its
//!   latest interrupt request); anything else is resurrected; no turn has two terminals (every
//!   terminal follows a live claim);
//! - a user message is marked `interrupted` exactly when its turn ended `interrupted` by a user,
//!   and no interrupted input is answered after that interrupt;
//! - steps: a step's body records its run as an external effect, a line `STEP_BODY <session>
//!   <turn> <step> <previous attempts>` on stdout before it returns (the recovery boot's runner
//!   keeps the same record). Every step record lies inside a live claim of its turn, an outcome
//!   answers an open intent, and no step is started again once its outcome is recorded. A body
//!   runs at most once per intent and never without one (its runs over all boots were told
//!   distinct `previous_attempts`, each below the step's intents), the run of its last intent
//!   left its effect when its outcome is recorded, no boot runs the body of a step whose
//!   outcome an earlier boot recorded (no completed step's body runs twice), and a turn that
//!   succeeded left no step open;
//! - per boot, a session the sweep takes up — claimed by an earlier boot, or owed a turn (a
//!   pending input marked `wake`, admitted after its latest interrupt request) — gets as its
//!   first event of the boot the sweep's one outcome: `interrupted{user}` for a claimed turn a
//!   later interrupt request fenced (no notice, no attempt left), else one attempt count and one
//!   notice, or `aborted` exactly when the count exceeds `max_resume_attempts` — exactly one once
//!   the boot's sweep completed; no other session is swept, and none gets more than one forced
//!   drain.
//!
//! Then a recovery boot (the test process itself, in its own actix `System`) resumes every
//! claimed turn not fenced by an interrupt and every owed session exactly once (one forced
//! drain, one notice) or terminalizes it once over budget, records the fenced ones as
//! `interrupted{user}` without a drain, runs the next turn of every queued prompt a settled turn
//! left (queued prompts continue), and leaves no claim. Every acknowledged prompt has then run
//! (been promoted) without any retry, unless a later interrupt request fenced it or an `aborted`
//! turn gave it up. The client then retries, exactly (same id, body and delivery), only the
//! prompts it never saw acknowledged; every prompt is then promoted, fenced, or (acknowledged,
//! not retried) given up by an `aborted` turn; one more queued
//! prompt per session leaves nothing pending and every user message no user interrupted
//! answered exactly once. Repeating a crash at the same point `budget + 1` boots in a row — or,
//! from a session owed a turn, crashing its adopted turn on every boot — ends in `aborted`,
//! never a loop.
//!
//! `random_kills_and_store_faults_under_a_seeded_workload` runs the random kills with the store
//! failing under the child (root only): each chain's database on a small disk of its own (a
//! tmpfs, or an ext4 image on a loop device) that fills up, or with the database file and its
//! WAL immutable, for short windows. A prompt refused as unavailable leaves nothing stored, no
//! turn is recorded failed but `aborted`, and a boot left to settle once the faults cleared has
//! run every acknowledged prompt in place.
//!
//! `DS_SOAK=<n>` runs `n` random kills instead of the CI default; `DS_SEED=<seed>` replays a run.
#![cfg(feature = "crash-points")]
#![cfg(unix)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use durable_sessions::kind;
use durable_sessions::{
    CreateSession, Delivery, EventRecord, EventStream, MessageId, PromptInput, Runtime, SessionId,
    Synchronous, Unavailable,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use common::{
    await_killed_node, await_no_live_node, is_postgres, is_releasing_terminal, is_root,
    next_commit, prompt_body, run_seed, say, splitmix, ChildProcess, EchoOptions, EchoRunner,
    EventRow, Filler, ReadOnly, SmallDisk, StepBody, StoreView, TestDb, XorShift, CHILD_WAIT,
    CRASH_LEASE,
};

/// The child's plan (JSON); set only in child processes.
const PLAN_ENV: &str = "DS_MATRIX_PLAN";
/// The database the child opens: a SQLite file, or a PostgreSQL URL.
const DB_ENV: &str = "DS_MATRIX_DB";
/// The resume budget of the named-point scenarios.
const BUDGET: u32 = 3;
/// The resume budget of the crash-loop scenarios (`budget + 1` crashing boots end in `aborted`).
const LOOP_BUDGET: u32 = 2;
/// Random kills CI runs on SQLite (override with `DS_SOAK`).
const RANDOM_KILLS: usize = 240;
/// Random kills CI runs on PostgreSQL (override with `DS_SOAK`): fewer, as each kill there
/// waits for the killed node's lease to lapse ([`CRASH_LEASE`], 1 s) before the next boot.
const PG_RANDOM_KILLS: usize = 80;
/// Independent kill chains run at once, each on its own database.
const CHAINS: usize = 4;
/// A chain runs a full in-process recovery check after this many kills (and at its end).
const VERIFY_EVERY: usize = 10;

fn session(i: usize) -> SessionId {
    SessionId::new(format!("s{i}")).expect("valid session id")
}

/// The node name of the matrix child process `pid` on PostgreSQL: the parent waits for that
/// node's connections to close once it killed it.
fn child_node(pid: u32) -> String {
    format!("matrix-child-{pid}")
}

// ---------------------------------------------------------------------------------------------
// The child side.

/// What one child process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    /// The boot number: prompt ids are unique per boot (`b<boot>-s<i>-p<n>`).
    boot: usize,
    /// Seeds the child's pauses, interrupts and runner jitter.
    seed: u64,
    /// Sessions `s0..s<sessions>` (created idempotently).
    sessions: usize,
    /// Prompts admitted per session.
    prompts: usize,
    /// `max_resume_attempts`.
    max_attempts: u32,
    /// Chance (per mille) that a prompt is admitted with `queue` delivery (else `steer`).
    queue_per_mille: u64,
    /// Chance (per mille) of a user interrupt after each admission.
    interrupt_per_mille: u64,
    /// When set, only this session is interrupted, after each of its admissions.
    interrupt_session: Option<usize>,
    /// Interrupt only once the session's transcript holds a reply (its turn claimed, promoted
    /// and answered: with `mid_drain`, the turn is then blocked mid-drain).
    interrupt_when_answered: bool,
    /// Pause of up to this many microseconds after each admission.
    pause_us: u64,
    /// The runner's pauses between its steps.
    jitter_us: u64,
    /// The runner prints `MID_DRAIN` and blocks after promoting and one reply.
    mid_drain: bool,
    /// `synchronous = NORMAL` (crash-safe, not power-loss-safe) instead of `FULL`.
    normal_sync: bool,
    /// Another client (a thread with its own actix `System`) admits `b<boot>-s0-late` to `s0`
    /// once an interrupt request of `s0` is committed.
    late_prompt: bool,
    /// The store fails under the child (disk full, read-only files): a runtime whose start
    /// failed is started again (`START_REFUSED <kind>` when the store was unavailable, else
    /// `START_FAILED <error>`), a session is created again until the store takes it, and a
    /// prompt or an interrupt the store refuses as unavailable is reported (`REFUSED <id>
    /// <kind>`, `INTERRUPT_REFUSED <session> <kind>`).
    #[serde(default)]
    faults: bool,
}

impl Plan {
    /// The plan of the named-point scenarios: two sessions, three prompts each.
    fn named(boot: usize) -> Plan {
        Plan {
            boot,
            seed: boot as u64,
            sessions: 2,
            prompts: 3,
            max_attempts: BUDGET,
            queue_per_mille: 0,
            interrupt_per_mille: 0,
            interrupt_session: None,
            interrupt_when_answered: false,
            pause_us: 0,
            jitter_us: 0,
            mid_drain: false,
            normal_sync: false,
            late_prompt: false,
            faults: false,
        }
    }
}

/// When this process is a matrix child, runs the child workload and never returns.
fn run_child_if_requested() {
    let Ok(plan) = std::env::var(PLAN_ENV) else {
        return;
    };
    let plan: Plan = serde_json::from_str(&plan).expect("a valid plan");
    let db = PathBuf::from(std::env::var(DB_ENV).expect("DS_MATRIX_DB is set"));
    // End the test harness's `test <name> ... ` line, so every marker starts a line.
    say("");
    actix_rt::System::new().block_on(child(plan, db));
    // The workload ends only when the parent kills it; never report a result of our own.
    std::process::exit(3);
}

async fn child(plan: Plan, db: PathBuf) {
    let runner = EchoRunner::new(EchoOptions {
        print: true,
        mid_drain: plan.mid_drain,
        jitter_us: plan.jitter_us,
        seed: plan.seed,
        steps: true,
    });
    let builder = || {
        let mut builder = Runtime::builder()
            .database(&db)
            .runner(runner.clone())
            .arbiters(2)
            .max_resume_attempts(plan.max_attempts)
            .sweep_on_start(true);
        if plan.normal_sync {
            builder = builder.synchronous(Synchronous::Normal);
        }
        if is_postgres(&db) {
            builder = builder
                .lease(CRASH_LEASE)
                .node_name(child_node(std::process::id()));
        }
        builder
    };
    let runtime = loop {
        match builder().start().await {
            Ok(runtime) => break runtime,
            // The store failed under the start-up (its sweep): the application starts again.
            Err(e) if plan.faults => {
                match unavailable(&e) {
                    Some(kind) => say(&format!("START_REFUSED {kind:?}")),
                    None => say(&format!("START_FAILED {e}")),
                }
                actix_rt::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("child runtime starts: {e}"),
        }
    };
    say("READY");
    let sessions = runtime.sessions();
    if plan.late_prompt {
        let (sessions, db, boot) = (sessions.clone(), db.clone(), plan.boot);
        let events = runtime.subscribe();
        thread::spawn(move || {
            actix_rt::System::new().block_on(late_prompt(sessions, events, db, boot));
        });
    }
    let workloads = (0..plan.sessions).map(|i| {
        let (runtime, sessions, plan) = (runtime.clone(), sessions.clone(), plan.clone());
        async move {
            let sid = session(i);
            loop {
                let created = sessions
                    .create(CreateSession {
                        id: Some(sid.clone()),
                        directory: "/matrix".into(),
                        ..CreateSession::default()
                    })
                    .await;
                match created {
                    Err(e) if plan.faults && unavailable(&e).is_some() => {
                        actix_rt::time::sleep(Duration::from_millis(5)).await;
                    }
                    created => break created.map(drop).expect("create session"),
                }
            }
            let mut rng = XorShift::new(plan.seed ^ splitmix(i as u64));
            for n in 0..plan.prompts {
                let id = format!("b{}-s{i}-p{n}", plan.boot);
                let delivery = if rng.chance(plan.queue_per_mille) {
                    Delivery::Queue
                } else {
                    Delivery::Steer
                };
                say(&format!("ADMITTING {id} {sid} {}", delivery.as_str()));
                let input = PromptInput::new(sid.clone(), prompt_body(&id))
                    .with_id(MessageId::new(id.as_str()).expect("valid message id"))
                    .with_delivery(delivery);
                match sessions.prompt(input).await {
                    Ok(_) => say(&format!("ADMITTED {id}")),
                    Err(e) => match unavailable(&e) {
                        Some(kind) => say(&format!("REFUSED {id} {kind:?}")),
                        None => say(&format!("REJECTED {id} {e}")),
                    },
                }
                let interrupt = match plan.interrupt_session {
                    Some(only) => only == i,
                    None => rng.chance(plan.interrupt_per_mille),
                };
                if interrupt {
                    if plan.interrupt_when_answered {
                        // Checked again whenever the session appends a message.
                        let mut events = runtime.subscribe();
                        let appended = |e: &EventRecord| {
                            e.session_id == sid && e.kind == kind::MESSAGE_APPENDED
                        };
                        let deadline = tokio::time::Instant::now() + CHILD_WAIT;
                        while !sessions
                            .context(&sid)
                            .await
                            .expect("read the transcript")
                            .iter()
                            .any(|m| m.kind == "assistant")
                        {
                            assert!(
                                next_commit(&mut events, deadline, appended).await,
                                "{sid}: no reply to wait for"
                            );
                        }
                    }
                    match sessions.interrupt(&sid).await {
                        Ok(hit) => say(&format!("INTERRUPTED {sid} {hit}")),
                        Err(e) => match unavailable(&e) {
                            Some(kind) => say(&format!("INTERRUPT_REFUSED {sid} {kind:?}")),
                            None => panic!("interrupt {sid}: {e}"),
                        },
                    }
                }
                if plan.pause_us > 0 {
                    actix_rt::time::sleep(Duration::from_micros(rng.below(plan.pause_us))).await;
                }
            }
        }
    });
    futures::future::join_all(workloads).await;
    for i in 0..plan.sessions {
        sessions
            .execution()
            .await_idle(&session(i))
            .await
            .expect("await idle");
    }
    say("DONE");
    // Wait to be killed; a parent that died without killing us must not leave us behind.
    actix_rt::time::sleep(Duration::from_secs(60)).await;
}

/// The kind of store fault `e` reports, when it says the store is unavailable.
fn unavailable(e: &durable_sessions::Error) -> Option<Unavailable> {
    match e {
        durable_sessions::Error::Store(e) => e.unavailable(),
        _ => None,
    }
}

/// The other client of [`Plan::late_prompt`]; `events` was subscribed before the workload
/// started.
async fn late_prompt(
    sessions: durable_sessions::Sessions,
    mut events: EventStream,
    db: PathBuf,
    boot: usize,
) {
    let requested =
        |e: &EventRecord| e.session_id.as_str() == "s0" && e.kind == kind::INTERRUPT_REQUESTED;
    let deadline = tokio::time::Instant::now() + CHILD_WAIT;
    while StoreView::read(&db).count_kind("s0", kind::INTERRUPT_REQUESTED) == 0 {
        assert!(
            next_commit(&mut events, deadline, requested).await,
            "no interrupt request to follow"
        );
    }
    let id = format!("b{boot}-s0-late");
    say(&format!("ADMITTING {id} s0 steer"));
    let input = PromptInput::new(session(0), prompt_body(&id))
        .with_id(MessageId::new(id.as_str()).expect("valid message id"));
    match sessions.prompt(input).await {
        Ok(_) => say(&format!("ADMITTED {id}")),
        Err(e) => say(&format!("REJECTED {id} {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The parent side: child processes.

/// Re-executes this test binary, running only `test`, as a matrix child with `plan` on `db`,
/// armed at crash point `point` if any.
fn spawn_child(test: &str, plan: &Plan, db: &Path, point: Option<&str>) -> ChildProcess {
    let mut env = vec![
        (PLAN_ENV, serde_json::to_string(plan).unwrap()),
        (DB_ENV, db.display().to_string()),
    ];
    if let Some(point) = point {
        env.push(("DS_CRASH_POINT", point.to_string()));
    }
    ChildProcess::spawn(test, &env)
}

// ---------------------------------------------------------------------------------------------
// The parent side: what the client knows, and the checks.

/// What the client (the parent) learned from the children's stdout.
#[derive(Debug, Default, Clone)]
struct Ledger {
    /// Every prompt a child tried to admit: id → session.
    attempted: BTreeMap<String, String>,
    /// The prompts of `attempted` sent with `queue` delivery (the others are `steer`).
    queued: BTreeSet<String>,
    /// Prompts whose `prompt()` returned `Ok` to the child (or to the client's retry).
    acked: BTreeSet<String>,
    /// Every session a child worked on.
    sessions: BTreeSet<String>,
    /// Child boots and kills, store snapshots checked, recovery boots, user interrupts.
    kills: usize,
    snapshots: usize,
    recoveries: usize,
    interrupts: usize,
    /// Notices and aborts seen at the end.
    notices: usize,
    aborts: usize,
    /// Where the kills landed: before `READY`, in the workload, after `DONE`.
    landed: [usize; 3],
    /// Kills that left at least one claimed turn behind, or a session owed a turn.
    left_claims: usize,
    left_owed: usize,
    /// Kills right after an acknowledgement (`ADMITTED`) or a user interrupt (`INTERRUPTED`).
    after_ack: usize,
    after_interrupt: usize,
    /// Acknowledged prompts a recovery found run with no retry; found fenced by a later
    /// interrupt; found given up by a later `aborted` turn (and neither run nor fenced).
    ran: usize,
    fenced: usize,
    given_up: usize,
    /// The store faults under the children: a prompt or an interrupt it refuses as unavailable
    /// is expected then, a failure otherwise.
    faults: bool,
    /// Prompts the store refused as unavailable (`REFUSED`): none of them may be stored until
    /// the client retries it.
    refused: BTreeSet<String>,
    /// Refusals by what was refused and the fault's kind (`prompt Full`, `interrupt ReadOnly`).
    refusals: BTreeMap<String, usize>,
    /// Fault windows opened: disk full, disk nearly full (a few KiB left), files read-only.
    windows: [usize; 3],
    /// Kills while a fault was in force; boots that waited, faults cleared, for their workload
    /// to settle.
    killed_in_fault: usize,
    settled: usize,
    /// Restart notices a boot published after its sweep: turns the store failed under,
    /// resumed in place.
    in_place: usize,
    /// Every step body run on this chain's database (the children's `STEP_BODY` lines, the
    /// recovery boots' record): (session, turn, step) → the `previous_attempts` each run was
    /// told, in order. Not merged across chains (their databases differ).
    bodies: BTreeMap<StepKey, Vec<u32>>,
    /// Step bodies run, and those of them run again (an ambiguous step: told
    /// `previous_attempts > 0`).
    step_runs: usize,
    step_reruns: usize,
}

/// A step of a turn: (session, turn id, step name).
type StepKey = (String, u64, String);

fn step_key(body: &StepBody) -> StepKey {
    (body.session.clone(), body.turn, body.step.clone())
}

impl Ledger {
    /// Takes in one child's output; returns the forced drains it started, per session, and
    /// the step bodies it ran.
    fn absorb(
        &mut self,
        lines: &[String],
        context: &str,
    ) -> (BTreeMap<String, usize>, Vec<StepBody>) {
        let mut forced = BTreeMap::new();
        let bodies: Vec<StepBody> = lines.iter().filter_map(|l| StepBody::parse(l)).collect();
        self.ran_bodies(&bodies);
        for line in lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["ADMITTING", id, session, delivery] => {
                    self.attempted.insert((*id).into(), (*session).into());
                    self.sessions.insert((*session).into());
                    if *delivery == "queue" {
                        self.queued.insert((*id).into());
                    }
                }
                ["ADMITTED", id] => {
                    self.acked.insert((*id).into());
                }
                ["REJECTED", ..] => panic!("{context}: a child's prompt failed: {line}"),
                ["REFUSED", id, kind] if self.faults => {
                    self.refused.insert((*id).into());
                    *self.refusals.entry(format!("prompt {kind}")).or_insert(0) += 1;
                }
                ["INTERRUPT_REFUSED", _, kind] if self.faults => {
                    *self
                        .refusals
                        .entry(format!("interrupt {kind}"))
                        .or_insert(0) += 1;
                }
                ["START_REFUSED", kind] if self.faults => {
                    *self.refusals.entry(format!("start {kind}")).or_insert(0) += 1;
                }
                ["START_FAILED", ..] => panic!("{context}: a child's start failed: {line}"),
                ["REFUSED" | "INTERRUPT_REFUSED" | "START_REFUSED", ..] => {
                    panic!("{context}: the store refused a child with no fault: {line}")
                }
                ["INTERRUPTED", _, hit] => self.interrupts += usize::from(*hit == "true"),
                ["DRAIN", session, "true"] => {
                    *forced.entry((*session).to_string()).or_insert(0) += 1
                }
                ["STEP_BODY", ..] if StepBody::parse(line).is_none() => {
                    panic!("{context}: a child's step line does not parse: {line}")
                }
                _ => {}
            }
        }
        (forced, bodies)
    }

    /// Takes in the step bodies a boot ran.
    fn ran_bodies(&mut self, bodies: &[StepBody]) {
        for body in bodies {
            self.bodies
                .entry(step_key(body))
                .or_default()
                .push(body.previous);
            self.step_runs += 1;
            self.step_reruns += usize::from(body.previous > 0);
        }
    }

    /// Adds up another chain's ledger.
    fn merge(&mut self, other: Ledger) {
        self.kills += other.kills;
        self.snapshots += other.snapshots;
        self.recoveries += other.recoveries;
        self.interrupts += other.interrupts;
        self.notices += other.notices;
        self.aborts += other.aborts;
        self.left_claims += other.left_claims;
        self.left_owed += other.left_owed;
        self.after_ack += other.after_ack;
        self.after_interrupt += other.after_interrupt;
        self.ran += other.ran;
        self.fenced += other.fenced;
        self.given_up += other.given_up;
        for (total, landed) in self.landed.iter_mut().zip(other.landed) {
            *total += landed;
        }
        self.attempted.extend(other.attempted);
        self.queued.extend(other.queued);
        self.acked.extend(other.acked);
        self.refused.extend(other.refused);
        for (what, n) in other.refusals {
            *self.refusals.entry(what).or_insert(0) += n;
        }
        for (total, opened) in self.windows.iter_mut().zip(other.windows) {
            *total += opened;
        }
        self.killed_in_fault += other.killed_in_fault;
        self.settled += other.settled;
        self.in_place += other.in_place;
        self.step_runs += other.step_runs;
        self.step_reruns += other.step_reruns;
    }
}

/// Checks the steps after a boot: `before` was read before it started, `after` once it ended
/// (killed, or shut down), `boot` is the step bodies it ran (already in `ledger`). No completed
/// step's body runs twice: a boot runs no body of a step whose outcome an earlier boot recorded,
/// and over the chain a step's body ran at most once per intent and never without one (each run
/// was told a distinct `previous_attempts`, below the step's intents). A recorded outcome was
/// the run of the last intent, which left its effect; a turn that succeeded left no step open
/// (the runner returns only once each step it called returned).
fn check_steps(
    before: &StoreView,
    after: &StoreView,
    ledger: &Ledger,
    boot: &[StepBody],
    context: &str,
) {
    let earlier = before.steps();
    let steps = after.steps();
    for body in boot {
        let key = step_key(body);
        assert!(
            steps.contains_key(&key),
            "{context}: the body of step {key:?} ran without its intent in the log"
        );
        if let Some(outcome) = earlier.get(&key).and_then(|s| s.outcome.as_ref()) {
            panic!(
                "{context}: the body of step {key:?} ran again (told {} previous attempts)                  though an earlier boot recorded its outcome {outcome}",
                body.previous
            );
        }
    }
    for (key, runs) in &ledger.bodies {
        let started = steps.get(key).map_or(0, |s| s.started);
        let distinct: BTreeSet<u32> = runs.iter().copied().collect();
        assert!(
            distinct.len() == runs.len() && runs.iter().all(|p| (*p as usize) < started),
            "{context}: step {key:?} has {started} intents but its body ran {} times, told              previous attempts {runs:?} (a body runs once per intent, never without one)",
            runs.len()
        );
    }
    for (key, step) in &steps {
        if let Some(outcome) = &step.outcome {
            let last = step.started.saturating_sub(1) as u32;
            assert!(
                ledger.bodies.get(key).is_some_and(|r| r.contains(&last)),
                "{context}: step {key:?} recorded {outcome}, but the run of its last intent                  ({last} previous attempts) left no effect: {:?}",
                ledger.bodies.get(key)
            );
        } else {
            assert!(
                step.turn_end.as_deref() != Some(kind::EXECUTION_SUCCEEDED),
                "{context}: step {key:?} is open, yet its turn succeeded"
            );
        }
    }
}

/// Checks one boot: `before` was read before the child started, `after` once it was killed.
/// `ready`: the boot's `start` (and so its sweep) completed. `faulted`: the store failed under
/// the boot, so turns may have been resumed in place (notices, attempts and forced drains beyond
/// the sweep's); the sweep's outcome still comes first. `refused_starts`: starts of the boot the
/// store refused; each may have counted the attempts of the claimed turns before it failed (as
/// a boot killed in its sweep does), so a turn within its budget may be aborted.
#[allow(clippy::too_many_arguments)]
fn check_boot(
    before: &StoreView,
    after: &StoreView,
    ledger: &Ledger,
    forced: &BTreeMap<String, usize>,
    ready: bool,
    faulted: bool,
    refused_starts: u32,
    max: u32,
    context: &str,
) {
    after.assert_invariants(max, context);
    for (session, old) in &before.events {
        let new = after.events.get(session).map_or(&[][..], Vec::as_slice);
        assert!(
            new.len() >= old.len() && new[..old.len()] == old[..],
            "{context}: the log of {session} was rewritten"
        );
    }
    let owed = before.owed();
    for (session, row) in &after.sessions {
        let old_len = before.events.get(session).map_or(0, Vec::len);
        let new = &after.events[session][old_len..];
        let notices = new.iter().filter(|e| common::is_restart_notice(e)).count();
        let aborts = new.iter().filter(|e| common::is_abort(e)).count();
        let drains = forced.get(session).copied().unwrap_or(0);
        assert!(
            drains <= 1 || faulted,
            "{context}: {session} drained forced {drains} times in one boot"
        );
        // What the sweep takes up: a turn an earlier boot left claimed, or a session owed a turn.
        let claimed = before.sessions.get(session).filter(|r| r.claimed);
        let taken_up = match claimed {
            Some(old) => Some((old, "claimed")),
            None if owed.contains(session) => Some((&before.sessions[session], "owed a turn")),
            None => None,
        };
        let Some((old, why)) = taken_up else {
            if faulted {
                continue;
            }
            assert!(
                !row.claimed || row.attempts == 0,
                "{context}: {session} claimed in this boot with {} attempts",
                row.attempts
            );
            assert_eq!(
                (notices, aborts),
                (0, 0),
                "{context}: {session} was neither claimed nor owed a turn at boot yet was swept \
                 (resurrected)"
            );
            continue;
        };
        // A claimed turn a later user interrupt request fenced is recorded as interrupted,
        // never resumed; any other gets one attempt: resumed, or aborted over the budget.
        let fenced = claimed.is_some() && before.interrupt_fenced(session);
        let over = old.attempts + 1 > max;
        let (outcome, is_outcome): (&str, fn(&EventRow) -> bool) = if fenced {
            ("interrupted{user}", |e| {
                e.kind == kind::EXECUTION_INTERRUPTED && e.data["reason"] == "user"
            })
        } else if over {
            ("aborted", common::is_abort)
        } else if claimed.is_some() && old.attempts + 1 + refused_starts > max {
            ("a restart notice or aborted", |e| {
                common::is_restart_notice(e) || common::is_abort(e)
            })
        } else {
            ("a restart notice", common::is_restart_notice)
        };
        match new.first() {
            Some(first) => assert!(
                is_outcome(first),
                "{context}: {session} ({why} at boot, {} attempts, budget {max}, {refused_starts} \
                 starts refused): the boot's first event is {first:?}, not the sweep's {outcome}",
                old.attempts
            ),
            None => assert!(
                !ready,
                "{context}: {session} was {why} at boot but the completed sweep skipped it"
            ),
        }
        if faulted {
            continue;
        }
        if fenced && owed.contains(session) {
            // Released as interrupted, then adopted for a prompt acknowledged after the request.
            assert!(
                notices + aborts == 1 || (!ready && notices + aborts == 0),
                "{context}: {session}, fenced but owed a turn, swept {notices} + {aborts} times"
            );
        } else if fenced {
            assert_eq!(
                (notices, aborts),
                (0, 0),
                "{context}: {session}'s turn, fenced by a user interrupt, was resumed"
            );
            assert_eq!(
                drains, 0,
                "{context}: {session}'s turn, fenced by a user interrupt, drained"
            );
        } else {
            assert!(
                notices + aborts <= 1,
                "{context}: {session} swept {notices} + {aborts} times in one boot"
            );
        }
        let released = new.iter().any(is_releasing_terminal);
        if row.claimed && !released {
            let counted = row.attempts.checked_sub(old.attempts);
            assert!(
                counted == Some(1) || (!ready && counted == Some(0)),
                "{context}: {session} attempts {} -> {} in one boot (ready {ready})",
                old.attempts,
                row.attempts
            );
        }
    }
    for id in &ledger.acked {
        let session = &ledger.attempted[id];
        assert!(
            after.inputs.get(id).is_some_and(|r| &r.session == session),
            "{context}: acknowledged prompt {id} is not in session_input (lost)"
        );
    }
    for id in after.inputs.keys() {
        assert!(
            ledger.attempted.contains_key(id),
            "{context}: input {id} was never sent"
        );
    }
    if ledger.faults {
        // The runner fails only when the store does, and a turn the store failed under is kept
        // claimed and resumed, never recorded failed: its only failure is `aborted`.
        for (session, events) in &after.events {
            let old_len = before.events.get(session).map_or(0, Vec::len);
            for e in events.iter().skip(old_len) {
                assert!(
                    e.kind != kind::EXECUTION_FAILED || common::is_abort(e),
                    "{context}: {session}#{} recorded failed: {}",
                    e.seq,
                    e.data
                );
            }
        }
    }
    for id in ledger.refused.difference(&ledger.acked) {
        assert!(
            !after.inputs.contains_key(id),
            "{context}: prompt {id}, refused as the store was unavailable, is stored: {:?}",
            after.inputs[id]
        );
    }
}

/// Runs one child with `plan` (armed at `point`) until it prints a line starting with
/// `marker` (or, for `marker == None`, until the caller's `kill_after` returns), SIGKILLs it
/// and checks the boot. Returns the child's lines.
fn crash_once(
    test: &str,
    db: &Path,
    ledger: &mut Ledger,
    plan: &Plan,
    point: Option<&str>,
    marker: &str,
) -> Vec<String> {
    crash_with(test, db, ledger, plan, point, |child| {
        child.wait_for(marker)
    })
}

fn crash_with(
    test: &str,
    db: &Path,
    ledger: &mut Ledger,
    plan: &Plan,
    point: Option<&str>,
    kill_after: impl FnOnce(&mut ChildProcess),
) -> Vec<String> {
    crash_under_faults(test, db, ledger, plan, point, |child| {
        kill_after(child);
        BootFaults::default()
    })
}

/// [`crash_with`], where `kill_after` may open store faults under the child: those it says it
/// opened relax the boot's checks ([`check_boot`]'s `faulted`), and one still open at the kill
/// is cleared once the child is dead, before the store is read.
fn crash_under_faults(
    test: &str,
    db: &Path,
    ledger: &mut Ledger,
    plan: &Plan,
    point: Option<&str>,
    kill_after: impl FnOnce(&mut ChildProcess) -> BootFaults,
) -> Vec<String> {
    let context = format!(
        "{test} boot {} (seed {}, point {point:?})",
        plan.boot, plan.seed
    );
    let before = StoreView::read(db);
    let mut child = spawn_child(test, plan, db, point);
    let pid = child.id();
    let faults = kill_after(&mut child);
    let lines = child.kill();
    let faulted = faults.opened.iter().sum::<usize>() > 0;
    for (total, opened) in ledger.windows.iter_mut().zip(faults.opened) {
        *total += opened;
    }
    ledger.killed_in_fault += usize::from(faults.open.is_some());
    ledger.settled += usize::from(faults.settled);
    drop(faults);
    await_killed_node(db, &child_node(pid));
    ledger.kills += 1;
    let (forced, bodies) = ledger.absorb(&lines, &context);
    let ready = lines.iter().any(|l| l == "READY");
    let done = lines.iter().any(|l| l == "DONE");
    ledger.landed[usize::from(ready) + usize::from(done)] += 1;
    let after = StoreView::read(db);
    ledger.snapshots += 1;
    // The sweep's notice is a session's first event of the boot; any later one resumed a turn
    // in place.
    for (session, events) in &after.events {
        let old_len = before.events.get(session).map_or(0, Vec::len);
        let later = events.iter().skip(old_len + 1);
        ledger.in_place += later.filter(|e| common::is_restart_notice(e)).count();
    }
    ledger.left_claims += usize::from(!after.claimed().is_empty());
    ledger.left_owed += usize::from(!after.owed().is_empty());
    let refused_starts = lines
        .iter()
        .filter(|l| l.starts_with("START_REFUSED"))
        .count();
    check_boot(
        &before,
        &after,
        ledger,
        &forced,
        ready,
        faulted,
        refused_starts as u32,
        plan.max_attempts,
        &context,
    );
    check_steps(&before, &after, ledger, &bodies, &context);
    lines
}

/// Waits until no turn of `sessions` runs and none is due: every session idle, none claimed,
/// and no turn that settled in this boot (at or after its event `from[session]`) left a queued
/// prompt whose own turn has not claimed yet (`await_idle` can answer between a turn and the
/// queued turn it schedules). Returns the store then.
///
/// # Panics
/// After [`CHILD_WAIT`]: a claim never released, or a queued prompt's turn never started.
async fn quiesce(
    db: &Path,
    runtime: &Runtime,
    sessions: &BTreeSet<String>,
    from: &BTreeMap<String, u64>,
    context: &str,
) -> StoreView {
    let execution = runtime.execution();
    // Checked again whenever one of the sessions commits an event (a claim, a release).
    let mut commits = runtime.subscribe();
    let theirs = |e: &EventRecord| sessions.contains(e.session_id.as_str());
    let deadline = tokio::time::Instant::now() + CHILD_WAIT;
    loop {
        for id in sessions {
            execution
                .await_idle(&SessionId::new(id.as_str()).unwrap())
                .await
                .unwrap();
        }
        let view = StoreView::read(db);
        let busy: Vec<&String> = sessions
            .iter()
            .filter(|s| {
                view.sessions.get(*s).is_some_and(|r| r.claimed)
                    || view.continuation_due(s, from.get(*s).copied().unwrap_or(0))
            })
            .collect();
        if busy.is_empty() {
            return view;
        }
        if !next_commit(&mut commits, deadline, theirs).await {
            let detail: Vec<String> = busy
                .iter()
                .map(|s| {
                    let start = from.get(*s).copied().unwrap_or(0) as usize;
                    let events = &view.events[*s][start.min(view.events[*s].len())..];
                    let inputs: Vec<_> = view
                        .inputs
                        .iter()
                        .filter(|(_, i)| &i.session == *s)
                        .collect();
                    format!(
                        "{s}: row {:?}\nevents of this boot:\n{}\ninputs: {inputs:#?}",
                        view.sessions[*s],
                        events
                            .iter()
                            .map(|e| format!("  #{} {} {}", e.seq, e.kind, e.data))
                            .collect::<Vec<_>>()
                            .join("\n")
                    )
                })
                .collect();
            panic!(
                "{context}: {busy:?} still claimed, or owed the turn of a queued prompt, after \
                 {CHILD_WAIT:?}; active {:?}\n{}",
                execution.active(),
                detail.join("\n")
            );
        }
    }
}

/// Every acknowledged prompt has run (been promoted), unless a later interrupt request of its
/// session fenced it, or — for one the client did not retry (`retried`) — an `aborted` turn of
/// its session gave it up after its admission (the sweep drops what an aborted turn owed).
fn assert_acknowledged_ran(
    view: &StoreView,
    ledger: &Ledger,
    retried: &BTreeSet<String>,
    context: &str,
) -> [usize; 3] {
    let mut tally = [0; 3];
    for id in &ledger.acked {
        let session = &ledger.attempted[id];
        let row = view
            .inputs
            .get(id)
            .unwrap_or_else(|| panic!("{context}: acknowledged prompt {id} is not admitted"));
        let fenced = view.interrupted_after(session, row.admitted_seq);
        let given_up =
            !retried.contains(id) && !row.wake && view.aborted_after(session, row.admitted_seq);
        assert!(
            row.promoted_seq.is_some() || fenced || given_up,
            "{context}: acknowledged prompt {id} ({}, admitted at {session}#{}, wake {}) never \
             ran, and no later interrupt fenced it",
            row.delivery,
            row.admitted_seq,
            row.wake
        );
        tally[if row.promoted_seq.is_some() {
            0
        } else if fenced {
            1
        } else {
            2
        }] += 1;
    }
    tally
}

/// The recovery boot, in this process: the sweep resumes every claimed turn not fenced by an
/// interrupt and every session owed a turn exactly once (or terminalizes it over budget), records
/// the fenced ones as interrupted, and leaves no claim; every acknowledged prompt has then run;
/// the client's exact retries of the unacknowledged ones promote them once; a last queued prompt
/// per session leaves nothing pending and everything not interrupted answered once.
fn verify_recovery(db: &Path, ledger: &mut Ledger, max: u32, context: &str) {
    let context = format!("{context}, recovery {}", ledger.recoveries);
    let before = StoreView::read(db);
    before.assert_invariants(max, &context);
    let round = ledger.recoveries;
    ledger.recoveries += 1;
    ledger.snapshots += 4;
    await_no_live_node(db);
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions {
            steps: true,
            ..EchoOptions::default()
        });
        let mut builder = Runtime::builder()
            .database(db)
            .runner(runner.clone())
            .arbiters(2)
            .max_resume_attempts(max)
            .sweep_on_start(true);
        if is_postgres(db) {
            builder = builder.lease(CRASH_LEASE);
        }
        let runtime = builder.start().await.expect("recovery boot starts");
        let sessions = runtime.sessions();
        let orphans = before.claimed();
        let owed = before.owed();
        // Resumed: claimed turns no interrupt fenced, and owed sessions, within the budget.
        let resumed: BTreeSet<String> = orphans
            .iter()
            .filter(|s| !before.interrupt_fenced(s) && before.sessions[*s].attempts < max)
            .chain(owed.iter().filter(|_| max > 0))
            .cloned()
            .collect();
        let mut all_sessions: BTreeSet<String> = before.sessions.keys().cloned().collect();
        all_sessions.extend(ledger.sessions.iter().cloned());
        let from: BTreeMap<String, u64> = all_sessions
            .iter()
            .map(|s| (s.clone(), before.events.get(s).map_or(0, Vec::len) as u64))
            .collect();
        let swept = quiesce(db, &runtime, &all_sessions, &from, &context).await;

        // The sweep: one forced drain per resumed turn, none for anything else, no claim left.
        // The only other drains are the turns of queued prompts a resumed turn left.
        let mut forced = BTreeMap::new();
        for ((session, was_forced), n) in runner.drains() {
            if was_forced {
                *forced.entry(session).or_insert(0) += n;
            } else {
                let queued = before.inputs.values().any(|i| {
                    i.session == session && i.promoted_seq.is_none() && i.delivery == "queue"
                });
                assert!(
                    resumed.contains(&session) && queued,
                    "{context}: a wake drain of {session} ran during the sweep, yet no resumed \
                     turn of it left a queued prompt"
                );
            }
        }
        check_boot(
            &before, &swept, ledger, &forced, true, false, 0, max, &context,
        );
        for id in orphans.iter().chain(&owed) {
            let drains = forced.get(id).copied().unwrap_or(0);
            assert_eq!(
                drains,
                usize::from(resumed.contains(id)),
                "{context}: {id} resumed {drains} times (attempts {}, budget {max}, fenced by an \
                 interrupt: {}, owed: {})",
                before.sessions[id].attempts,
                before.interrupt_fenced(id),
                owed.contains(id)
            );
        }
        assert_eq!(
            forced.keys().filter(|s| !resumed.contains(*s)).count(),
            0,
            "{context}: a session the sweep should not resume was resumed: {forced:?}"
        );
        assert!(
            swept.claimed().is_empty(),
            "{context}: claims left after the recovered turns ended: {:?}",
            swept.claimed()
        );
        // Acknowledged => runs: with no retry at all.
        let [ran, fenced, given_up] =
            assert_acknowledged_ran(&swept, ledger, &BTreeSet::new(), &context);
        ledger.ran += ran;
        ledger.fenced += fenced;
        ledger.given_up += given_up;

        // The client's recovery: retry, exactly, every prompt it never saw acknowledged.
        for id in &all_sessions {
            sessions
                .create(CreateSession {
                    id: Some(SessionId::new(id.as_str()).unwrap()),
                    directory: "/matrix".into(),
                    ..CreateSession::default()
                })
                .await
                .expect("create session");
        }
        let mut retried = BTreeSet::new();
        for (id, session) in &ledger.attempted {
            let promoted = swept
                .inputs
                .get(id)
                .is_some_and(|r| r.promoted_seq.is_some());
            if ledger.acked.contains(id) || promoted {
                continue;
            }
            let delivery = if ledger.queued.contains(id) {
                Delivery::Queue
            } else {
                Delivery::Steer
            };
            let input =
                PromptInput::new(SessionId::new(session.as_str()).unwrap(), prompt_body(id))
                    .with_id(MessageId::new(id.as_str()).unwrap())
                    .with_delivery(delivery);
            sessions
                .prompt(input)
                .await
                .unwrap_or_else(|e| panic!("{context}: the exact retry of {id} failed: {e}"));
            retried.insert(id.clone());
        }
        ledger.acked.extend(retried.iter().cloned());
        let retried_view = quiesce(db, &runtime, &all_sessions, &from, &context).await;
        retried_view.assert_invariants(max, &context);
        assert_acknowledged_ran(&retried_view, ledger, &retried, &context);

        // One more queued prompt per session: its turn promotes the pending steer prompts and
        // the oldest queued one, and each queued prompt left runs in a turn of its own, the last
        // one last.
        for session in &all_sessions {
            let id = format!("v{round}-{session}");
            ledger.attempted.insert(id.clone(), session.clone());
            ledger.queued.insert(id.clone());
            let input =
                PromptInput::new(SessionId::new(session.as_str()).unwrap(), prompt_body(&id))
                    .with_id(MessageId::new(id.as_str()).unwrap())
                    .with_delivery(Delivery::Queue);
            sessions.prompt(input).await.expect("last prompt");
            ledger.acked.insert(id);
        }
        let settled = quiesce(db, &runtime, &all_sessions, &from, &context).await;
        settled.assert_invariants(max, &context);
        assert!(
            settled.pending().is_empty(),
            "{context}: prompts still pending at the end: {:?}",
            settled.pending()
        );
        for id in ledger.attempted.keys() {
            assert!(
                settled.inputs[id].promoted_seq.is_some(),
                "{context}: {id} was never promoted"
            );
        }
        let replies = settled.replies();
        for (id, message) in &settled.messages {
            if message.kind == "user" {
                let answers = replies.get(id).copied().unwrap_or(0);
                // An interrupted one may have been answered before the interrupt (the store
                // invariants check when), never after.
                assert!(
                    answers == 1 || (message.interrupted && answers == 0),
                    "{context}: user message {id} (interrupted: {}) answered {answers} times",
                    message.interrupted
                );
            }
        }
        ledger.notices = settled.sessions.keys().map(|s| settled.notices(s)).sum();
        ledger.aborts = settled.sessions.keys().map(|s| settled.aborts(s)).sum();
        runtime.shutdown().await;
        let bodies = runner.bodies();
        ledger.ran_bodies(&bodies);
        check_steps(&before, &StoreView::read(db), ledger, &bodies, &context);
    });
}

// ---------------------------------------------------------------------------------------------
// Named crash points.

/// Where a named scenario kills its child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    /// `crash::point` of that name.
    Named(&'static str),
    /// The runner's own marker, after it promoted and replied once.
    MidDrain,
}

impl Point {
    fn env(self) -> Option<&'static str> {
        match self {
            Point::Named(name) => Some(name),
            Point::MidDrain => None,
        }
    }

    fn marker(self) -> String {
        match self {
            Point::Named(name) => format!("CRASH_POINT {name}"),
            Point::MidDrain => "MID_DRAIN".into(),
        }
    }

    /// Lines the parent waits for besides the marker before it kills the child.
    fn also(self) -> &'static [&'static str] {
        match self {
            // The wake handler returned before the claim write began: the prompt that woke the
            // turn is (or is about to be) acknowledged.
            Point::Named("during_claim") => &["ADMITTED"],
            _ => &[],
        }
    }

    /// Whether the point can be reached by a resumed turn (so it can crash-loop). The claim of a
    /// resumed turn is the sweep's write, not the turn's own; admissions and interrupts come
    /// from the workload, which a loop boot does not run.
    fn loops(self) -> bool {
        !matches!(
            self,
            Point::Named(
                "during_admission"
                    | "during_claim"
                    | "after_admission_before_wake"
                    | "after_interrupt_request"
            )
        )
    }

    /// Whether a first boot armed at this point leaves a claimed turn behind.
    fn leaves_a_claim(self) -> bool {
        !matches!(
            self,
            Point::Named(
                "before_claim"
                    | "sweep_after_count"
                    | "during_admission"
                    | "during_claim"
                    | "after_admission_before_wake"
            )
        )
    }

    /// Whether a kill at this point leaves a session owed a turn (a pending input marked `wake`
    /// whose turn never claimed): the next boot's sweep adopts it.
    fn leaves_owed(self) -> bool {
        matches!(
            self,
            Point::Named("before_claim" | "during_claim" | "after_admission_before_wake")
        )
    }
}

/// Kills the child (armed at `point`) once it printed the point's marker and extra lines.
fn crash_at(test: &str, db: &Path, ledger: &mut Ledger, plan: &Plan, point: Point) -> Vec<String> {
    let mut lines = vec![point.marker()];
    lines.extend(point.also().iter().map(|l| (*l).to_string()));
    crash_with(test, db, ledger, plan, point.env(), |child| {
        child.wait_for_all(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    })
}

/// One SIGKILL at `point` on a fresh database, the point's own assertions, then the recovery
/// boot; and, where the point can be reached again by a resumed turn, `LOOP_BUDGET + 1`
/// crashing boots in a row that must end in `aborted`; and, where the point leaves a session
/// owed a turn, the same from that session's adopted turn.
fn crash_point_scenario(test: &str, point: Point, specific: impl FnOnce(&StoreView, &Ledger)) {
    crash_point_scenario_then(test, point, specific, |_, _, _, _| {});
}

/// [`crash_point_scenario`], with `recovered`, the point's assertions after the recovery boot
/// (before the crash loops): it is given the store and the ledger at the kill, then after the
/// recovery.
fn crash_point_scenario_then(
    test: &str,
    point: Point,
    specific: impl FnOnce(&StoreView, &Ledger),
    recovered: impl FnOnce(&StoreView, &Ledger, &StoreView, &Ledger),
) {
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    if point == Point::Named("sweep_after_count") {
        // The sweep needs a turn a previous boot left claimed.
        let plan = Plan {
            mid_drain: true,
            ..Plan::named(0)
        };
        crash_once(test, &db.path, &mut ledger, &plan, None, "MID_DRAIN");
        let claimed = StoreView::read(&db.path).claimed();
        assert!(
            !claimed.is_empty(),
            "{test}: no claim left by the first kill"
        );
    }
    let plan = Plan {
        mid_drain: point == Point::MidDrain,
        ..Plan::named(1)
    };
    let before = StoreView::read(&db.path);
    crash_at(test, &db.path, &mut ledger, &plan, point);
    let after = StoreView::read(&db.path);
    if point == Point::Named("sweep_after_count") {
        for id in before.claimed() {
            assert_eq!(
                after.sessions[&id].attempts,
                before.sessions[&id].attempts + 1
            );
            assert_eq!(
                after.notices(&id),
                before.notices(&id),
                "{test}: notice before crash"
            );
        }
    }
    if point.leaves_owed() {
        assert!(
            !after.owed().is_empty(),
            "{test}: no session left owed a turn"
        );
    }
    specific(&after, &ledger);
    let at_kill = ledger.clone();
    verify_recovery(&db.path, &mut ledger, BUDGET, test);
    recovered(&after, &at_kill, &StoreView::read(&db.path), &ledger);
    if point.loops() {
        crash_loop(test, point);
    }
    if point.leaves_owed() {
        owed_crash_loop(test, point);
    }
}

/// `LOOP_BUDGET + 1` boots in a row crash at `point` while resuming the same turn; each counts
/// one attempt; the next boot terminalizes it as `aborted` once and does not drain it, and the
/// session then works again.
fn crash_loop(test: &str, point: Point) {
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let first = Plan {
        sessions: 1,
        prompts: 2,
        max_attempts: LOOP_BUDGET,
        mid_drain: point == Point::MidDrain || !point.leaves_a_claim(),
        ..Plan::named(0)
    };
    let (first_point, first_marker) = if point.leaves_a_claim() {
        (point.env(), point.marker())
    } else {
        (None, "MID_DRAIN".to_string())
    };
    crash_once(
        test,
        &db.path,
        &mut ledger,
        &first,
        first_point,
        &first_marker,
    );
    let id = "s0".to_string();
    let view = StoreView::read(&db.path);
    assert!(
        view.sessions[&id].claimed,
        "{test}: the first kill left no claim"
    );
    for boot in 1..=LOOP_BUDGET as usize {
        let plan = Plan {
            boot,
            prompts: 0,
            ..first.clone()
        };
        let plan = Plan {
            mid_drain: point == Point::MidDrain,
            ..plan
        };
        crash_once(
            test,
            &db.path,
            &mut ledger,
            &plan,
            point.env(),
            &point.marker(),
        );
        let view = StoreView::read(&db.path);
        let row = &view.sessions[&id];
        assert!(row.claimed, "{test}: loop boot {boot} released the turn");
        assert_eq!(
            row.attempts as usize, boot,
            "{test}: loop boot {boot} attempts"
        );
        assert!(view.notices(&id) <= boot);
        assert_eq!(view.aborts(&id), 0);
    }
    verify_recovery(&db.path, &mut ledger, LOOP_BUDGET, &format!("{test} loop"));
    let view = StoreView::read(&db.path);
    assert_eq!(
        view.aborts(&id),
        1,
        "{test}: the crash loop did not end in aborted"
    );
    assert!(!view.sessions[&id].claimed);
}

/// A session left owed a turn by a kill at `point` (its prompt's turn never claimed) is adopted
/// by the next boot: one attempt counted, its notice, the claim behind it. Its adopted turn then
/// crashes (after its claim, before its drain) `LOOP_BUDGET` boots in a row, each counting one
/// attempt; the next boot terminalizes it as `aborted` once, and the session then works again.
fn owed_crash_loop(test: &str, point: Point) {
    let test_loop = format!("{test} owed loop");
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let first = Plan {
        sessions: 1,
        prompts: 1,
        max_attempts: LOOP_BUDGET,
        ..Plan::named(0)
    };
    crash_at(test, &db.path, &mut ledger, &first, point);
    let id = "s0".to_string();
    let view = StoreView::read(&db.path);
    assert!(
        view.owed().contains(&id) && !view.sessions[&id].claimed,
        "{test_loop}: the first kill left {id} {:?}, not owed a turn",
        view.sessions.get(&id)
    );
    let resumed = Point::Named("after_claim_before_drain");
    for boot in 1..=LOOP_BUDGET as usize {
        let plan = Plan {
            boot,
            prompts: 0,
            ..first.clone()
        };
        crash_at(test, &db.path, &mut ledger, &plan, resumed);
        let view = StoreView::read(&db.path);
        let row = &view.sessions[&id];
        assert!(row.claimed, "{test_loop}: boot {boot} did not adopt {id}");
        assert_eq!(
            row.attempts as usize, boot,
            "{test_loop}: boot {boot} attempts"
        );
        assert_eq!(view.notices(&id), boot, "{test_loop}: boot {boot} notices");
        assert_eq!(view.aborts(&id), 0);
    }
    verify_recovery(&db.path, &mut ledger, LOOP_BUDGET, &test_loop);
    let view = StoreView::read(&db.path);
    assert_eq!(
        view.aborts(&id),
        1,
        "{test_loop}: the crash loop did not end in aborted"
    );
    assert!(!view.sessions[&id].claimed);
}

/// No claim committed and no `session.execution.started` event exists: the kill came before
/// any turn's claim.
fn assert_no_turn_claimed(view: &StoreView) {
    assert!(
        view.claimed().is_empty(),
        "a claim committed: {:?}",
        view.claimed()
    );
    for id in view.sessions.keys() {
        assert_eq!(view.count_kind(id, kind::EXECUTION_STARTED), 0);
    }
}

/// Killed before the claim of a turn commits (the wake handler never returned): no claim and
/// no `started` event exist, and the admission that woke it is committed with its wake mark but
/// unacknowledged. The next boot's sweep adopts the session (one notice, the claim right behind
/// it, one forced drain), which promotes the prompt once without a retry. Repeated on resumed
/// turns, the crash loop ends in `aborted`; so does crashing the adopted turn on every boot.
#[test]
fn crash_before_claim() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_before_claim",
        Point::Named("before_claim"),
        |view, ledger| {
            assert_no_turn_claimed(view);
            let unacked: Vec<_> = view
                .inputs
                .iter()
                .filter(|(id, row)| !ledger.acked.contains(*id) && row.wake)
                .collect();
            assert!(
                !unacked.is_empty(),
                "the prompt that woke the turn was not committed with its wake mark"
            );
        },
    );
}

/// Killed inside the claim write of a turn, before it commits: the wake handler had returned,
/// so the prompt that woke the turn is acknowledged, yet no claim and no `started` event exist.
/// Its durable wake mark makes the session owed a turn: the next boot's sweep adopts it (one
/// attempt, one notice, the claim right behind it, one forced drain) and the acknowledged
/// prompt runs once, with no retry. Crashing the adopted turn on every boot ends in `aborted`.
#[test]
fn crash_during_claim() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_during_claim",
        Point::Named("during_claim"),
        |view, ledger| {
            assert_no_turn_claimed(view);
            let owed: Vec<_> = ledger
                .acked
                .iter()
                .filter(|id| view.inputs[*id].promoted_seq.is_none() && view.inputs[*id].wake)
                .collect();
            assert!(
                !owed.is_empty(),
                "no acknowledged prompt is pending with its wake mark: {:?}",
                ledger.acked
            );
        },
    );
}

/// Killed after a prompt's admission committed with its wake mark, before its wake was sent and
/// before the caller was answered: nothing is acknowledged and nothing claimed, yet the durable
/// mark makes the session owed a turn; the next boot adopts it and runs the prompt once (the
/// client's retry then finds it promoted). Crashing the adopted turn on every boot ends in
/// `aborted`.
#[test]
fn crash_after_admission_before_wake() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_after_admission_before_wake",
        Point::Named("after_admission_before_wake"),
        |view, ledger| {
            assert!(ledger.acked.is_empty(), "answered: {:?}", ledger.acked);
            assert!(view.claimed().is_empty());
            for id in view.sessions.keys() {
                assert_eq!(view.count_kind(id, kind::EXECUTION_STARTED), 0);
            }
            assert!(
                view.inputs
                    .values()
                    .any(|row| row.wake && row.promoted_seq.is_none()),
                "no admission committed with its wake mark"
            );
        },
    );
}

/// Killed after the claim committed, before the drain started: the turn is claimed with no
/// promotion and no drain; the next boot resumes it exactly once.
#[test]
fn crash_after_claim_before_drain() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_after_claim_before_drain",
        Point::Named("after_claim_before_drain"),
        |view, _| {
            assert!(!view.claimed().is_empty(), "no claim committed");
            for id in view.sessions.keys() {
                assert_eq!(
                    view.count_kind(id, kind::PROMPT_PROMOTED),
                    0,
                    "{id} drained"
                );
            }
        },
    );
}

/// Killed mid-drain (after promotion and one reply): the promotions are durable with their
/// transcript rows, the turn stays claimed, and the resumed turn answers the rest exactly once.
#[test]
fn crash_mid_drain() {
    run_child_if_requested();
    crash_point_scenario("crash_mid_drain", Point::MidDrain, |view, _| {
        assert!(!view.claimed().is_empty(), "no claim committed");
        let promoted: usize = view
            .sessions
            .keys()
            .map(|id| view.count_kind(id, kind::PROMPT_PROMOTED))
            .sum();
        assert!(promoted >= 1, "nothing promoted before the mid-drain kill");
    });
}

/// Killed after the drain returned, before its terminal and release committed: the turn's work
/// is all durable, the claim is still held, and the next boot resumes it once (a drain that
/// finds nothing new) and releases it.
#[test]
fn crash_after_drain_before_release() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_after_drain_before_release",
        Point::Named("after_drain_before_release"),
        |view, _| {
            let claimed = view.claimed();
            assert!(!claimed.is_empty(), "no claim held at the kill");
            let replies = view.replies();
            assert!(
                claimed
                    .iter()
                    .any(|s| view.messages.iter().any(|(id, m)| &m.session == s
                        && m.kind == "user"
                        && replies.contains_key(id))),
                "no claimed turn finished its work before the kill"
            );
        },
    );
}

/// Killed in the restart sweep after the attempt counts committed and before any notice: the
/// count stays (one per crashed boot), no notice exists, and the next boot counts again and
/// resumes the turn once with a single notice.
#[test]
fn crash_sweep_after_count() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_sweep_after_count",
        Point::Named("sweep_after_count"),
        |view, _| {
            for id in view.claimed() {
                assert_eq!(view.sessions[&id].attempts, 1);
                assert_eq!(view.notices(&id), 0);
            }
        },
    );
}

/// Killed inside a prompt's admission transaction: the admission is not stored at all (no
/// inbox row, no event), was never acknowledged, and the client's retry admits it exactly once.
#[test]
fn crash_during_admission() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_during_admission",
        Point::Named("during_admission"),
        |view, ledger| {
            assert!(view.inputs.is_empty(), "an admission half-committed");
            for id in view.sessions.keys() {
                assert_eq!(view.count_kind(id, kind::PROMPT_ADMITTED), 0);
            }
            assert!(ledger.acked.is_empty());
            assert!(!ledger.attempted.is_empty());
        },
    );
}

/// Killed inside a promotion transaction: no promotion is stored (no event, no `promoted_seq`,
/// no transcript row), the turn stays claimed, and the resumed turn promotes each prompt once.
#[test]
fn crash_during_promotion() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_during_promotion",
        Point::Named("during_promotion"),
        |view, _| {
            assert!(!view.claimed().is_empty(), "no claim before the promotion");
            assert!(view.messages.is_empty(), "a promotion half-committed");
            for id in view.sessions.keys() {
                assert_eq!(view.count_kind(id, kind::PROMPT_PROMOTED), 0);
            }
            assert!(!view.pending().is_empty());
        },
    );
}

/// The steps a kill inside a step left open (an intent and no outcome): each with its intents
/// and the `previous_attempts` its bodies' runs were told.
fn open_steps(view: &StoreView, ledger: &Ledger) -> Vec<(StepKey, usize, Vec<u32>)> {
    view.steps()
        .into_iter()
        .filter(|(_, step)| step.outcome.is_none())
        .map(|(key, step)| {
            let runs = ledger.bodies.get(&key).cloned().unwrap_or_default();
            (key, step.started, runs)
        })
        .collect()
}

/// After the recovery boot, every step a kill inside a step left open (`killed`, with
/// `at_kill`'s record of its bodies) was run again once by its resumed turn, under the same
/// turn id: one more intent, its body run once more told every earlier intent as a previous
/// attempt, and its outcome `completed`.
fn assert_open_steps_ran_again(
    test: &str,
    killed: &StoreView,
    at_kill: &Ledger,
    recovered: &StoreView,
    ledger: &Ledger,
) {
    let open = open_steps(killed, at_kill);
    assert!(!open.is_empty(), "{test}: no step open at the kill");
    let steps = recovered.steps();
    for (key, started, mut runs) in open {
        let now = &steps[&key];
        assert_eq!(
            (now.started, now.outcome.as_deref()),
            (started + 1, Some(kind::STEP_COMPLETED)),
            "{test}: step {key:?}, open at the kill with {started} intents, after the recovery"
        );
        runs.push(started as u32);
        assert_eq!(
            ledger.bodies.get(&key),
            Some(&runs),
            "{test}: step {key:?}: its body did not run exactly once more, told {started} \
             previous attempts"
        );
    }
}

/// Killed inside the reply step, after its intent (`session.step.started`) committed, before
/// its body ran: the step is open with no effect recorded, the turn claimed. The next boot
/// resumes the turn, whose drain runs the step again under the same turn id: its body runs
/// once in all, told one previous attempt, and completes. Repeated on the resumed turn, the
/// crash loop ends in `aborted`.
#[test]
fn crash_after_step_intent() {
    run_child_if_requested();
    const TEST: &str = "crash_after_step_intent";
    crash_point_scenario_then(
        TEST,
        Point::Named("after_step_intent"),
        |view, ledger| {
            assert!(!view.claimed().is_empty(), "no claim committed");
            let open = open_steps(view, ledger);
            assert!(
                open.iter()
                    .any(|(_, started, runs)| *started == 1 && runs.is_empty()),
                "no step killed after its intent, before its body: {open:?}"
            );
        },
        |killed, at_kill, recovered, ledger| {
            assert_open_steps_ran_again(TEST, killed, at_kill, recovered, ledger);
        },
    );
}

/// Killed inside the reply step, after its body ran (its `STEP_BODY` effect printed), before
/// its outcome was sent to be committed: the step is open and its effect happened once. The
/// next boot's resumed drain finds it ambiguous and runs it again (at least once): two runs
/// in all, the second told one previous attempt, then the outcome. Repeated on the resumed
/// turn, the crash loop ends in `aborted`.
#[test]
fn crash_after_step_body() {
    run_child_if_requested();
    const TEST: &str = "crash_after_step_body";
    crash_point_scenario_then(
        TEST,
        Point::Named("after_step_body"),
        |view, ledger| {
            assert!(!view.claimed().is_empty(), "no claim committed");
            let open = open_steps(view, ledger);
            assert!(
                open.iter()
                    .any(|(_, started, runs)| *started == 1 && runs == &[0]),
                "no step killed after its body, before its outcome: {open:?}"
            );
        },
        |killed, at_kill, recovered, ledger| {
            assert_open_steps_ran_again(TEST, killed, at_kill, recovered, ledger);
        },
    );
}

/// Killed inside the transaction committing a step's outcome, before it commits: no outcome
/// is stored (the step is open, its body's effect happened once) and no reply for it. The next
/// boot's resumed drain runs it again, once, told one previous attempt, and records its
/// outcome; its message is answered once. Repeated on the resumed turn, the crash loop ends in
/// `aborted`.
#[test]
fn crash_during_step_outcome() {
    run_child_if_requested();
    const TEST: &str = "crash_during_step_outcome";
    crash_point_scenario_then(
        TEST,
        Point::Named("during_step_outcome"),
        |view, ledger| {
            assert!(!view.claimed().is_empty(), "no claim committed");
            let open = open_steps(view, ledger);
            assert!(
                open.iter()
                    .any(|(_, started, runs)| *started == 1 && runs == &[0]),
                "no step killed committing its outcome: {open:?}"
            );
            let replies = view.replies();
            for ((_, _, step), _, _) in &open {
                let message = step.strip_prefix("reply:").expect("a reply step");
                assert!(
                    !replies.contains_key(message),
                    "{message}: answered, yet its step's outcome was not committed"
                );
            }
        },
        |killed, at_kill, recovered, ledger| {
            assert_open_steps_ran_again(TEST, killed, at_kill, recovered, ledger);
        },
    );
}

/// A turn the user interrupted (`interrupted{user}` + release committed before `interrupt`
/// returned) in a process SIGKILLed with another turn mid-drain is never resumed: the next boot
/// resumes only the other turn.
#[test]
fn crash_after_a_user_interrupt() {
    const TEST: &str = "crash_after_a_user_interrupt";
    run_child_if_requested();
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let plan = Plan {
        sessions: 2,
        prompts: 1,
        interrupt_session: Some(0),
        mid_drain: true,
        ..Plan::named(0)
    };
    // Both turns block mid-drain; s0's is interrupted by the user right after its prompt.
    let lines = crash_with(TEST, &db.path, &mut ledger, &plan, None, |child| {
        child.wait_for_all(&["INTERRUPTED s0", "MID_DRAIN s1"]);
    });
    assert!(
        lines.iter().any(|l| l == "INTERRUPTED s0 true"),
        "{lines:?}"
    );
    let view = StoreView::read(&db.path);
    let user_interrupts = view.events["s0"]
        .iter()
        .filter(|e| e.kind == kind::EXECUTION_INTERRUPTED && e.data["reason"] == "user")
        .count();
    assert_eq!(user_interrupts, 1, "the user interrupt was not committed");
    assert!(
        !view.sessions["s0"].claimed,
        "the interrupt did not release the claim"
    );
    assert!(view.sessions["s1"].claimed, "the other turn is not claimed");
    verify_recovery(&db.path, &mut ledger, BUDGET, TEST);
    let after = StoreView::read(&db.path);
    assert_eq!(
        after.notices("s0"),
        0,
        "the user-interrupted turn was resumed"
    );
    assert_eq!(
        after.notices("s1"),
        1,
        "the other turn was not resumed once"
    );
}

/// Killed after a user's interrupt request committed, before it reached the turn (blocked
/// mid-drain after promoting and answering its prompt): the turn is still claimed, with the
/// request after its claim. The interrupt sticks: the next boot records the turn as
/// `interrupted{user}` (marking its prompt interrupted, so it is never answered again), with no
/// notice, no attempt and no drain; the other session's turn is resumed once.
#[test]
fn crash_after_interrupt_request() {
    const TEST: &str = "crash_after_interrupt_request";
    run_child_if_requested();
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let plan = Plan {
        sessions: 2,
        prompts: 1,
        interrupt_session: Some(0),
        interrupt_when_answered: true,
        mid_drain: true,
        ..Plan::named(0)
    };
    let point = Point::Named("after_interrupt_request");
    crash_with(TEST, &db.path, &mut ledger, &plan, point.env(), |child| {
        child.wait_for_all(&[&point.marker(), "MID_DRAIN s0", "MID_DRAIN s1"]);
    });
    let view = StoreView::read(&db.path);
    assert_eq!(view.count_kind("s0", kind::INTERRUPT_REQUESTED), 1);
    assert_eq!(view.count_kind("s0", kind::EXECUTION_INTERRUPTED), 0);
    assert!(
        view.sessions["s0"].claimed && view.interrupt_fenced("s0"),
        "s0 is not a claimed turn fenced by the request: {:?}",
        view.sessions["s0"]
    );
    assert!(view.sessions["s1"].claimed && !view.interrupt_fenced("s1"));
    verify_recovery(&db.path, &mut ledger, BUDGET, TEST);
    let after = StoreView::read(&db.path);
    let user_interrupts: Vec<_> = after.events["s0"]
        .iter()
        .filter(|e| e.kind == kind::EXECUTION_INTERRUPTED)
        .collect();
    assert_eq!(user_interrupts.len(), 1, "{user_interrupts:?}");
    assert_eq!(user_interrupts[0].data["reason"], "user");
    assert_eq!(after.notices("s0"), 0, "the interrupted turn was resumed");
    let prompt = &after.messages["b0-s0-p0"];
    assert!(prompt.interrupted, "the interrupted prompt is not marked");
    assert_eq!(
        after.replies().get("b0-s0-p0"),
        Some(&1),
        "answered once, before the interrupt"
    );
    assert_eq!(
        after.notices("s1"),
        1,
        "the other turn was not resumed once"
    );
}

/// Killed after a user's interrupt request committed, before it reached the turn (blocked
/// mid-drain), and after another client's prompt, admitted behind the request, was acknowledged
/// (its wake rang the running turn's doorbell). The request fences the turn, which the next
/// boot records as `interrupted{user}`; the prompt, acknowledged after the request, must still
/// run in that boot with no retry (regression: the first cut of the sweep listed the sessions
/// owed a turn before it settled the claimed ones, so this prompt waited for the next boot).
#[test]
fn crash_after_interrupt_request_then_a_prompt() {
    const TEST: &str = "crash_after_interrupt_request_then_a_prompt";
    run_child_if_requested();
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let plan = Plan {
        sessions: 1,
        prompts: 1,
        interrupt_session: Some(0),
        interrupt_when_answered: true,
        mid_drain: true,
        late_prompt: true,
        ..Plan::named(0)
    };
    let point = Point::Named("after_interrupt_request");
    crash_with(TEST, &db.path, &mut ledger, &plan, point.env(), |child| {
        child.wait_for_all(&[&point.marker(), "ADMITTED b0-s0-late"]);
    });
    let view = StoreView::read(&db.path);
    let late = &view.inputs["b0-s0-late"];
    assert!(late.wake && late.promoted_seq.is_none(), "{late:?}");
    assert!(late.admitted_seq > view.interrupt_fence("s0").unwrap());
    assert!(
        view.sessions["s0"].claimed && view.interrupt_fenced("s0"),
        "s0 is not a claimed turn fenced by the request: {:?}",
        view.sessions["s0"]
    );
    verify_recovery(&db.path, &mut ledger, BUDGET, TEST);
}

// ---------------------------------------------------------------------------------------------
// Random kills.

/// Where a random kill lands.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// This long after the spawn: in start-up or the sweep, or early in the workload.
    Early(Duration),
    /// This long after `READY`: somewhere in the workload.
    InWorkload(Duration),
    /// Right after (this long after) the n-th acknowledgement (`ADMITTED`): an acknowledged
    /// prompt whose turn may not have claimed yet.
    AfterAck(usize, Duration),
    /// Right after (this long after) the n-th user interrupt (`INTERRUPTED`).
    AfterInterrupt(usize, Duration),
}

/// One chain of random kills on its own database; returns its ledger.
fn random_chain(test: &str, db: &TestDb, chain: usize, kills: usize, base: u64) -> Ledger {
    let mut ledger = Ledger::default();
    let max = 3;
    for k in 0..kills {
        let seed = splitmix(base ^ ((chain as u64) << 40) ^ k as u64);
        let mut rng = XorShift::new(seed);
        let mut plan = Plan {
            boot: k,
            seed,
            sessions: 2 + rng.below(3) as usize,
            prompts: 2 + rng.below(6) as usize,
            max_attempts: max,
            queue_per_mille: 300,
            interrupt_per_mille: 100,
            interrupt_session: None,
            interrupt_when_answered: false,
            pause_us: 3000,
            jitter_us: 1500,
            mid_drain: false,
            normal_sync: rng.chance(500),
            late_prompt: false,
            faults: false,
        };
        // Right after an acknowledgement, mostly within the next few hundred microseconds.
        let soon = |rng: &mut XorShift| {
            Duration::from_micros(if rng.chance(333) { 0 } else { rng.below(600) })
        };
        // One kill in eight lands in start-up or the sweep, one in four right after an
        // acknowledgement, one in sixteen right after a user interrupt (of a session the plan
        // interrupts after each of its prompts), the rest a few ms into the workload.
        let kill = match rng.below(16) {
            0 | 1 => Kill::Early(Duration::from_micros(rng.below(40_000))),
            2..=5 => {
                let nth = 1 + rng.below((plan.sessions * plan.prompts) as u64) as usize;
                Kill::AfterAck(nth, soon(&mut rng))
            }
            6 => {
                plan.interrupt_session = Some(rng.below(plan.sessions as u64) as usize);
                let nth = 1 + rng.below(plan.prompts as u64) as usize;
                Kill::AfterInterrupt(nth, soon(&mut rng))
            }
            _ => Kill::InWorkload(Duration::from_micros(rng.below(25_000))),
        };
        crash_with(test, &db.path, &mut ledger, &plan, None, |child| {
            // The kill itself is the event under test: a random instant, not a synchronisation.
            let delay = match kill {
                Kill::Early(delay) => delay,
                Kill::InWorkload(delay) => {
                    child.wait_for("READY");
                    delay
                }
                Kill::AfterAck(nth, delay) => {
                    for _ in 0..nth {
                        child.wait_for("ADMITTED");
                    }
                    delay
                }
                Kill::AfterInterrupt(nth, delay) => {
                    for _ in 0..nth {
                        child.wait_for("INTERRUPTED");
                    }
                    delay
                }
            };
            thread::sleep(delay);
        });
        match kill {
            Kill::AfterAck(..) => ledger.after_ack += 1,
            Kill::AfterInterrupt(..) => ledger.after_interrupt += 1,
            _ => {}
        }
        if (k + 1) % VERIFY_EVERY == 0 || k + 1 == kills {
            let context = format!("{test} chain {chain} after kill {k} (base seed {base})");
            verify_recovery(&db.path, &mut ledger, max, &context);
        }
    }
    ledger
}

/// `DS_SOAK` (default 240 on SQLite, 80 on PostgreSQL) SIGKILLs of a seeded workload — steer
/// and queue prompts, user interrupts, runner pauses, half of the boots with `synchronous =
/// NORMAL` (SQLite) — at random instants, right after an acknowledgement or right after a user
/// interrupt, in four chains on four databases at once; every kill is followed by the per-boot
/// checks and every tenth by a full recovery.
#[test]
fn random_kills_under_a_seeded_workload() {
    const TEST: &str = "random_kills_under_a_seeded_workload";
    run_child_if_requested();
    let total: usize = std::env::var("DS_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if common::on_postgres_now() {
            PG_RANDOM_KILLS
        } else {
            RANDOM_KILLS
        });
    let base = run_seed();
    eprintln!("{TEST}: {total} kills, base seed {base} (replay with DS_SEED={base})");
    let started = Instant::now();
    let chains: Vec<_> = (0..CHAINS)
        .map(|chain| {
            let kills = total / CHAINS + usize::from(chain < total % CHAINS);
            // Made here, for the chain: on PostgreSQL, a fresh database of the suite's cluster.
            let db = TestDb::new();
            thread::spawn(move || random_chain(TEST, &db, chain, kills, base))
        })
        .collect();
    let mut totals = Ledger::default();
    for chain in chains {
        totals.merge(chain.join().expect("a kill chain failed"));
    }
    assert_eq!(totals.kills, total);
    eprintln!(
        "{TEST}: {} kills ({} in start-up, {} in the workload, {} once idle; {} right after an \
         acknowledgement, {} right after an interrupt; {} left a claimed turn, {} a session owed \
         a turn), {} recoveries, {} store snapshots checked, {} prompts ({} queued; {} \
         acknowledged by a child or retried), {} user interrupts, {} restart notices, {} \
         aborted; at the recoveries, acknowledged prompts had run {} times, were fenced by an \
         interrupt {} times and given up by an aborted turn {} times; {} step bodies run, {} \
         of them again after their outcome was lost; in {:?} (seed {base})",
        totals.kills,
        totals.landed[0],
        totals.landed[1],
        totals.landed[2],
        totals.after_ack,
        totals.after_interrupt,
        totals.left_claims,
        totals.left_owed,
        totals.recoveries,
        totals.snapshots,
        totals.attempted.len(),
        totals.queued.len(),
        totals.acked.len(),
        totals.interrupts,
        totals.notices,
        totals.aborts,
        totals.ran,
        totals.fenced,
        totals.given_up,
        totals.step_runs,
        totals.step_reruns,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Random kills and store faults.

/// Store faults CI runs with the random kills (override with `DS_SOAK`).
const FAULT_KILLS: usize = 80;
/// The size of each chain's disk, in MiB.
const FAULT_DISK_MIB: u64 = 8;

/// One store fault, in force until dropped: the disk full, or nearly (a few KiB left); or the
/// database file and its WAL immutable (never the `-shm`: it is memory-mapped, and an immutable
/// mapped file faults the process).
struct Fault {
    _full: Option<Filler>,
    _frozen: Option<ReadOnly>,
}

impl Fault {
    /// Opens a fault of a kind `rng` picks; returns it with its index in [`Ledger::windows`],
    /// or `None` for read-only files before the first boot created the database.
    fn open(rng: &mut XorShift, disk: &SmallDisk, db: &Path) -> Option<(Fault, usize)> {
        let (full, frozen, kind) = match rng.below(3) {
            0 => (Some(disk.fill(0)), None, 0),
            1 => (Some(disk.fill(1024 * (4 + rng.below(60)))), None, 1),
            _ => (None, Some(freeze(db)?), 2),
        };
        let fault = Fault {
            _full: full,
            _frozen: frozen,
        };
        Some((fault, kind))
    }
}

/// Makes the database file and its WAL (when there is one) immutable; `None` when there is no
/// database file yet.
fn freeze(db: &Path) -> Option<ReadOnly> {
    if !db.exists() {
        return None;
    }
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    // The WAL may vanish between the look and `chattr` (the last connection closing removes it).
    for _ in 0..3 {
        let files = if wal.exists() {
            vec![db.to_path_buf(), wal.clone()]
        } else {
            vec![db.to_path_buf()]
        };
        if let Some(frozen) = ReadOnly::set(&files) {
            return Some(frozen);
        }
    }
    panic!("chattr +i {} failed", db.display());
}

/// The store faults of one boot.
#[derive(Default)]
struct BootFaults {
    /// Fault windows opened, by kind (as [`Ledger::windows`]).
    opened: [usize; 3],
    /// The fault still in force at the kill.
    open: Option<Fault>,
    /// The boot waited for `DONE` once its faults were cleared.
    settled: bool,
}

/// Waits, faults cleared and the child's workload `DONE`, until the store holds no claim and no
/// turn that settled in this boot (after `before`) left a queued prompt whose own turn has not
/// claimed yet: every turn the store failed under was resumed in place and ended.
///
/// # Panics
/// After [`CHILD_WAIT`], naming the sessions still busy.
fn settle(db: &Path, before: &StoreView, context: &str) {
    let deadline = Instant::now() + CHILD_WAIT;
    loop {
        let view = StoreView::read(db);
        let busy: Vec<&String> = view
            .sessions
            .iter()
            .filter(|(id, row)| {
                let from = before.events.get(*id).map_or(0, Vec::len) as u64;
                row.claimed || view.continuation_due(id, from)
            })
            .map(|(id, _)| id)
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{context}: {busy:?} still claimed, or owed a queued prompt's turn, {CHILD_WAIT:?} \
             after the faults cleared"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// One chain of random kills and store faults on a database on its own small disk. One boot in
/// five gets a fault window of 5–60 ms under its start-up; most get, once `READY`, one to three
/// fault windows of a few to 150 ms (disk full, disk nearly full,
/// database and WAL immutable) while the workload runs; the child is then killed a few ms
/// later, inside the last window, or once the workload settled ([`settle`]: then every
/// acknowledged prompt has run, been fenced or given up, with no restart). Every boot is
/// checked, every tenth recovered.
fn fault_chain(test: &str, disk: &SmallDisk, chain: usize, kills: usize, base: u64) -> Ledger {
    let db = disk.mount.join("sessions.db");
    let mut ledger = Ledger {
        faults: true,
        ..Ledger::default()
    };
    let max = 3;
    for k in 0..kills {
        let seed = splitmix(base ^ (0xfa17 << 48) ^ ((chain as u64) << 40) ^ k as u64);
        let mut rng = XorShift::new(seed);
        let plan = Plan {
            boot: k,
            seed,
            sessions: 2 + rng.below(3) as usize,
            prompts: 3 + rng.below(6) as usize,
            max_attempts: max,
            queue_per_mille: 300,
            interrupt_per_mille: 100,
            interrupt_session: None,
            interrupt_when_answered: false,
            pause_us: 4000,
            jitter_us: 1500,
            mid_drain: false,
            normal_sync: rng.chance(500),
            late_prompt: false,
            faults: true,
        };
        // One boot in eight is killed in start-up with no fault; of the others, one in four
        // is killed inside its last fault window, one in four once its workload settled.
        let early = rng.chance(125).then(|| rng.below(40_000));
        let at_start = rng.chance(200);
        let ending = rng.below(4);
        let before = StoreView::read(&db);
        let mut settled = false;
        crash_under_faults(test, &db, &mut ledger, &plan, None, |child| {
            let mut faults = BootFaults::default();
            if let Some(delay) = early {
                thread::sleep(Duration::from_micros(delay));
                return faults;
            }
            if at_start {
                // Under the start-up and its sweep.
                thread::sleep(Duration::from_micros(rng.below(3_000)));
                if let Some((fault, kind)) = Fault::open(&mut rng, disk, &db) {
                    faults.opened[kind] += 1;
                    thread::sleep(Duration::from_micros(5_000 + rng.below(55_000)));
                    drop(fault);
                }
            }
            child.wait_for("READY");
            let windows = 1 + rng.below(3);
            for w in 0..windows {
                thread::sleep(Duration::from_micros(rng.below(10_000)));
                let (fault, kind) =
                    Fault::open(&mut rng, disk, &db).expect("a database once READY");
                faults.opened[kind] += 1;
                let hold = Duration::from_micros(2_000 + rng.below(148_000));
                if w + 1 == windows && ending == 0 {
                    thread::sleep(hold / 2);
                    faults.open = Some(fault);
                    return faults;
                }
                thread::sleep(hold);
                drop(fault);
            }
            if ending == 1 {
                child.wait_for_all(&["DONE"]);
                settle(&db, &before, &format!("{test} chain {chain} boot {k}"));
                faults.settled = true;
                settled = true;
            } else {
                thread::sleep(Duration::from_micros(rng.below(20_000)));
            }
            faults
        });
        if settled {
            // The store answered again: every turn it failed under was resumed in place and
            // ended, and every acknowledged prompt ran, with no restart and no retry.
            let context = format!("{test} chain {chain} boot {k} (seed {seed}), settled");
            let view = StoreView::read(&db);
            assert_acknowledged_ran(&view, &ledger, &BTreeSet::new(), &context);
        }
        if (k + 1) % VERIFY_EVERY == 0 || k + 1 == kills {
            let context = format!("{test} chain {chain} after kill {k} (base seed {base})");
            verify_recovery(&db, &mut ledger, max, &context);
        }
    }
    ledger
}

/// The random kills of [`random_kills_under_a_seeded_workload`] on SQLite, with the store
/// failing under the workload: each chain's database on a small disk of its own that fills up
/// (a filler file written until `ENOSPC`, sometimes shrunk to leave a few KiB, then removed),
/// or with the database file and its WAL immutable (`chattr +i`), for short windows while
/// prompts, interrupts and resumed turns keep coming. Even chains run on a tmpfs, odd ones on
/// an ext4 image on a loop device where there is one (else a tmpfs too): on a tmpfs, `chattr
/// +i` refuses only new opens of the files, on ext4 it also stops the writes of connections
/// already open. Besides every check of a boot (the
/// store invariants, including no `started` over an open claim) and of a recovery boot (every
/// acknowledged prompt answered exactly once, interrupted, or given up by an `aborted` turn),
/// a prompt refused as unavailable left nothing stored, no turn is recorded failed but
/// `aborted`, and a boot that waited for its workload to settle once the faults cleared has
/// run every acknowledged prompt in place. `DS_SOAK` (default 80) sets the kills,
/// `DS_SEED` replays a run. Needs root (a tmpfs mount, `chattr +i`): skipped elsewhere with one
/// line, a failure under `CI=true`.
#[test]
fn random_kills_and_store_faults_under_a_seeded_workload() {
    const TEST: &str = "random_kills_and_store_faults_under_a_seeded_workload";
    run_child_if_requested();
    // The faults are the SQLite file's (a full disk, an immutable file).
    if common::sqlite_only(TEST) {
        return;
    }
    let skip = |why: &str| {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{TEST}: cannot run under CI: {why}"
        );
        eprintln!("{TEST}: skipped: {why}");
    };
    if !is_root() {
        return skip("needs root to mount a tmpfs and chattr +i the database");
    }
    let tmpfs = || SmallDisk::tmpfs(&format!("{FAULT_DISK_MIB}m"));
    let Some(disks) = (0..CHAINS)
        .map(|chain| match chain % 2 {
            0 => tmpfs(),
            _ => SmallDisk::ext4(FAULT_DISK_MIB).or_else(tmpfs),
        })
        .collect::<Option<Vec<_>>>()
    else {
        return skip("cannot mount a tmpfs");
    };
    for disk in &disks {
        let probe = disk.mount.join("probe");
        std::fs::write(&probe, b"probe").expect("write on the small disk");
        if ReadOnly::set(std::slice::from_ref(&probe)).is_none() {
            return skip(&format!("chattr +i fails on a {} here", disk.kind));
        }
        std::fs::remove_file(&probe).expect("remove the probe");
    }
    let kinds: Vec<&str> = disks.iter().map(|d| d.kind).collect();
    let total: usize = std::env::var("DS_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(FAULT_KILLS);
    let base = run_seed();
    eprintln!("{TEST}: {total} kills on {kinds:?}, base seed {base} (replay with DS_SEED={base})");
    let started = Instant::now();
    let mut totals = Ledger::default();
    thread::scope(|scope| {
        let chains: Vec<_> = disks
            .iter()
            .enumerate()
            .map(|(chain, disk)| {
                let kills = total / CHAINS + usize::from(chain < total % CHAINS);
                scope.spawn(move || fault_chain(TEST, disk, chain, kills, base))
            })
            .collect();
        for chain in chains {
            totals.merge(chain.join().expect("a kill chain failed"));
        }
    });
    assert_eq!(totals.kills, total);
    eprintln!(
        "{TEST}: {} kills ({} in start-up, {} in the workload, {} once idle; {} inside a fault, \
         {} once the workload settled), fault windows {} disk full, {} disk nearly full, {} \
         read-only; refused: {:?}; {} recoveries, {} store snapshots checked, {} prompts ({} \
         refused; {} acknowledged by a child or retried), {} user interrupts, {} restart \
         notices ({} of a turn resumed in place), {} aborted; at the recoveries, acknowledged prompts had run {} times, were \
         fenced by an interrupt {} times and given up by an aborted turn {} times; {} step \
         bodies run, {} of them again after their outcome was lost; in {:?} (seed {base})",
        totals.kills,
        totals.landed[0],
        totals.landed[1],
        totals.landed[2],
        totals.killed_in_fault,
        totals.settled,
        totals.windows[0],
        totals.windows[1],
        totals.windows[2],
        totals.refusals,
        totals.recoveries,
        totals.snapshots,
        totals.attempted.len(),
        totals.refused.len(),
        totals.acked.len(),
        totals.interrupts,
        totals.notices,
        totals.in_place,
        totals.aborts,
        totals.ran,
        totals.fenced,
        totals.given_up,
        totals.step_runs,
        totals.step_reruns,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL.

/// The matrix above on PostgreSQL ([`common::run_suite_on_postgres`]): each test runs again,
/// every child and recovery boot a node with a 1 s lease ([`CRASH_LEASE`]), each scenario (and
/// kill chain) on a fresh database of one throwaway cluster. Each kill waits for the killed
/// node's connections to close and its lease to lapse before the next boot, whose start-up
/// sweep then takes its turns over as a SQLite restart's does (a running node taking over a
/// dead one is the multi-node suite's); so the random kills are 80 there (`DS_SOAK` overrides),
/// not 240. The store faults are the SQLite file's: that test returns at once there. First,
/// every crash point has its test `crash_<point>`.
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_crash_matrix() {
    let tests = common::test_names();
    for point in durable_sessions::crash::ALL {
        let test = format!("crash_{point}");
        assert!(
            tests.contains(&test),
            "no test {test} of the crash point {point}"
        );
    }
    common::run_suite_on_postgres("postgres_backend_passes_the_crash_matrix");
}

// ---------------------------------------------------------------------------------------------
// The invariants themselves, on hand-made logs.

/// A hand-made store holding one top-level session `s` whose log is `steps` (from seq 0), with
/// the rows the runtime would project from it: inputs (marked `wake`), transcript rows (user
/// messages a user interrupted marked so), and the claim.
fn synthetic(steps: &[(&str, serde_json::Value)]) -> StoreView {
    use common::{InputRow, MessageRow, SessionRow};
    let mut view = StoreView::default();
    let mut row = SessionRow {
        parent: None,
        claimed: false,
        attempts: 0,
        claim_boot: None,
        claim_seq: None,
    };
    let mut events = Vec::new();
    for (seq, (kind, data)) in steps.iter().enumerate() {
        let seq = seq as u64;
        let event = EventRow {
            seq,
            kind: (*kind).to_string(),
            data: data.clone(),
        };
        let id = data["messageID"].as_str().unwrap_or_default().to_string();
        match *kind {
            kind::PROMPT_ADMITTED => {
                let input = InputRow {
                    session: "s".into(),
                    admitted_seq: seq,
                    promoted_seq: None,
                    prompt: data["prompt"].clone(),
                    delivery: data["delivery"].as_str().unwrap_or("steer").into(),
                    wake: true,
                };
                view.inputs.insert(id, input);
            }
            kind::PROMPT_PROMOTED => {
                view.inputs.get_mut(&id).unwrap().promoted_seq = Some(seq);
                let message = MessageRow {
                    session: "s".into(),
                    kind: "user".into(),
                    seq,
                    data: json!({}),
                    interrupted: false,
                };
                view.messages.insert(id, message);
            }
            kind::MESSAGE_APPENDED => {
                let message = MessageRow {
                    session: "s".into(),
                    kind: "assistant".into(),
                    seq,
                    data: json!({ "reply_to": data["reply_to"] }),
                    interrupted: false,
                };
                view.messages.insert(id, message);
            }
            kind::EXECUTION_STARTED => {
                if !row.claimed {
                    row.claim_seq = Some(seq);
                }
                row.claimed = true;
            }
            _ if common::is_restart_notice(&event) => row.attempts += 1,
            _ if is_releasing_terminal(&event) => {
                if kind == &kind::EXECUTION_INTERRUPTED {
                    let claim = row.claim_seq.unwrap_or(u64::MAX);
                    for m in view.messages.values_mut() {
                        m.interrupted |= m.kind == "user" && m.seq > claim;
                    }
                }
                row.claimed = false;
                row.attempts = 0;
                row.claim_seq = None;
            }
            _ => {}
        }
        events.push(event);
    }
    view.sequences.insert("s".into(), events.len() as u64 - 1);
    view.events.insert("s".into(), events);
    view.sessions.insert("s".into(), row);
    view
}

/// The store invariants hold on a legal log and name what breaks them: a restart notice for a
/// session neither claimed nor owed a turn, a notice without its claim, a turn claimed over an
/// open claim with no terminal or notice in between, a second terminal of a turn, an interrupted prompt answered after its interrupt, a wrong interrupted mark, a step
/// record outside its turn's claim or started again after its outcome; and the sweep's view of
/// a store (`owed`, `interrupt_fenced`, `steps`) is what the runtime decides.
#[test]
fn the_invariants_catch_what_they_claim_to() {
    use durable_sessions::{ABORTED_MESSAGE, RESTART_NOTICE_TEXT};
    run_child_if_requested();
    let created = (kind::CREATED, json!({}));
    let admitted = |id: &str| {
        (
            kind::PROMPT_ADMITTED,
            json!({ "messageID": id, "prompt": prompt_body(id) }),
        )
    };
    let promoted = |id: &str| (kind::PROMPT_PROMOTED, json!({ "messageID": id }));
    let reply = |id: &str, to: &str| {
        (
            kind::MESSAGE_APPENDED,
            json!({ "messageID": id, "reply_to": to }),
        )
    };
    let notice = (kind::SYNTHETIC, json!({ "text": RESTART_NOTICE_TEXT }));
    let started = (kind::EXECUTION_STARTED, json!({ "boot": "b" }));
    let succeeded = (kind::EXECUTION_SUCCEEDED, json!({}));
    let aborted = (
        kind::EXECUTION_FAILED,
        json!({ "error": { "type": "aborted", "message": ABORTED_MESSAGE } }),
    );
    let user_interrupt = (kind::EXECUTION_INTERRUPTED, json!({ "reason": "user" }));
    let request = (kind::INTERRUPT_REQUESTED, json!({ "sessionID": "s" }));
    let holds = |steps: &[(&str, serde_json::Value)]| {
        let view = synthetic(steps);
        let bad = view.violations(BUDGET);
        assert!(bad.is_empty(), "{steps:?}: {bad:?}");
        view
    };
    let breaks = |view: &StoreView, what: &str| {
        let bad = view.violations(BUDGET);
        assert!(
            bad.iter().any(|b| b.contains(what)),
            "expected a violation naming {what:?}, got {bad:?}"
        );
    };

    // The sweep adopts an acknowledged prompt whose turn never started: notice, then its claim.
    let owed = holds(&[created.clone(), admitted("p")]);
    assert_eq!(owed.owed(), BTreeSet::from(["s".to_string()]));
    holds(&[
        created.clone(),
        admitted("p"),
        notice.clone(),
        started.clone(),
        promoted("p"),
        reply("r", "p"),
        succeeded.clone(),
    ]);
    // ... and over the budget of that one attempt, aborts it.
    let view = synthetic(&[created.clone(), admitted("p"), aborted.clone()]);
    assert!(view.violations(0).is_empty(), "{:?}", view.violations(0));
    breaks(&view, "without a live claim");
    // Owed nothing: the prompt was fenced by a later interrupt request, or already promoted.
    let fenced = synthetic(&[created.clone(), admitted("p"), request.clone()]);
    assert!(fenced.owed().is_empty());
    breaks(
        &synthetic(&[
            created.clone(),
            admitted("p"),
            request.clone(),
            notice.clone(),
            started.clone(),
        ]),
        "resurrected",
    );
    breaks(
        &synthetic(&[
            created.clone(),
            admitted("p"),
            started.clone(),
            promoted("p"),
            succeeded.clone(),
            notice.clone(),
            started.clone(),
        ]),
        "resurrected",
    );
    // A notice is followed by the claim it publishes.
    breaks(
        &synthetic(&[created.clone(), admitted("p"), notice.clone()]),
        "not followed by its claim",
    );
    // No turn is claimed over another: a second `started` over an open claim needs a terminal
    // or a restart notice (the turn resumed in place, or by the next boot) in between.
    let open = [
        created.clone(),
        admitted("p"),
        started.clone(),
        promoted("p"),
    ];
    let mut over = open.to_vec();
    over.push(started.clone());
    breaks(&synthetic(&over), "execution.started over an open claim");
    let mut resumed = open.to_vec();
    resumed.extend([notice.clone(), started.clone()]);
    assert_eq!(holds(&resumed).sessions["s"].attempts, 1);
    let mut next_turn = open.to_vec();
    next_turn.extend([succeeded.clone(), admitted("q"), started.clone()]);
    holds(&next_turn);
    // No turn has two terminals.
    breaks(
        &synthetic(&[
            created.clone(),
            started.clone(),
            succeeded.clone(),
            aborted.clone(),
        ]),
        "without a live claim",
    );
    // A claimed turn an interrupt request came after is fenced, unless it served newer work.
    let claimed = [
        created.clone(),
        admitted("p"),
        started.clone(),
        promoted("p"),
        request.clone(),
    ];
    assert!(holds(&claimed).interrupt_fenced("s"));
    let mut served = claimed.to_vec();
    served.extend([admitted("q"), promoted("q")]);
    assert!(!holds(&served).interrupt_fenced("s"));
    // An interrupted prompt may have been answered before its interrupt, never after.
    let mut answered = claimed.to_vec();
    answered.extend([reply("r", "p"), user_interrupt.clone()]);
    let view = holds(&answered);
    assert!(view.messages["p"].interrupted);
    let mut late = claimed.to_vec();
    late.extend([
        user_interrupt.clone(),
        started.clone(),
        reply("r", "p"),
        succeeded.clone(),
    ]);
    breaks(&synthetic(&late), "interrupted at");
    // The mark is exactly "its turn ended interrupted by a user".
    let mut unmarked = view;
    unmarked.messages.get_mut("p").unwrap().interrupted = false;
    breaks(&unmarked, "interrupted mark");
    let mut finished = claimed[..4].to_vec();
    finished.push(succeeded.clone());
    let mut marked = holds(&finished);
    marked.messages.get_mut("p").unwrap().interrupted = true;
    breaks(&marked, "interrupted mark");

    // A turn that promoted a prompt owes the next queued one a turn of its own, until that
    // turn claims, or an interrupt request fences it (its wake is dropped: the prompt was
    // admitted before the request), even one that came after the terminal.
    let queued = |id: &str| {
        (
            kind::PROMPT_ADMITTED,
            json!({ "messageID": id, "prompt": prompt_body(id), "delivery": "queue" }),
        )
    };
    let settled = [
        created.clone(),
        queued("p"),
        queued("q"),
        started.clone(),
        promoted("p"),
        reply("r", "p"),
        succeeded.clone(),
    ];
    assert!(holds(&settled).continuation_due("s", 0));
    let mut next = settled.to_vec();
    next.push(started.clone());
    assert!(!holds(&next).continuation_due("s", 0));
    let mut fenced = settled.to_vec();
    fenced.push(request.clone());
    assert!(!holds(&fenced).continuation_due("s", 0));
    fenced.push(queued("later"));
    assert!(!holds(&fenced).continuation_due("s", 0));

    // Step records: inside the claim of the turn they name (its first `started`, at seq 2
    // here), an outcome after its intent, none started again once completed.
    let step = |event: &'static str, turn: u64, attempt: u64| {
        let mut data = json!({ "turn": turn, "step": "tool", "attempt": attempt });
        if event == kind::STEP_STARTED {
            data["key"] = json!(format!("s:{turn}:tool"));
        } else {
            data["result"] = json!(1);
        }
        (event, data)
    };
    let turn = [
        created.clone(),
        admitted("p"),
        started.clone(),
        promoted("p"),
    ];
    let mut done = turn.to_vec();
    done.extend([
        step(kind::STEP_STARTED, 2, 1),
        step(kind::STEP_COMPLETED, 2, 1),
        succeeded.clone(),
    ]);
    let steps = holds(&done).steps();
    assert_eq!(steps.len(), 1, "{steps:?}");
    let tool = &steps[&("s".to_string(), 2, "tool".to_string())];
    assert_eq!(tool.started, 1);
    assert_eq!(tool.outcome.as_deref(), Some(kind::STEP_COMPLETED));
    assert_eq!(tool.turn_end.as_deref(), Some(kind::EXECUTION_SUCCEEDED));
    // Open at a kill, run again by the resumed turn (attempt 2), under the same turn id.
    let mut again = turn.to_vec();
    again.extend([
        step(kind::STEP_STARTED, 2, 1),
        notice.clone(),
        started.clone(),
        step(kind::STEP_STARTED, 2, 2),
        step(kind::STEP_COMPLETED, 2, 2),
        succeeded.clone(),
    ]);
    assert_eq!(
        holds(&again).steps()[&("s".into(), 2, "tool".into())].started,
        2
    );
    let mut twice = turn.to_vec();
    twice.extend([
        step(kind::STEP_STARTED, 2, 1),
        step(kind::STEP_COMPLETED, 2, 1),
        notice.clone(),
        started.clone(),
        step(kind::STEP_STARTED, 2, 2),
    ]);
    breaks(&synthetic(&twice), "started again after its outcome");
    let mut stale = turn.to_vec();
    stale.extend([
        step(kind::STEP_STARTED, 2, 1),
        step(kind::STEP_COMPLETED, 2, 2),
    ]);
    breaks(&synthetic(&stale), "but the step stands at Open(1)");
    let mut orphan = turn.to_vec();
    orphan.push(step(kind::STEP_COMPLETED, 2, 1));
    breaks(&synthetic(&orphan), "without its intent");
    let mut other = turn.to_vec();
    other.push(step(kind::STEP_STARTED, 7, 1));
    breaks(&synthetic(&other), "the live claim serves turn Some(2)");
    let mut after = turn.to_vec();
    after.extend([succeeded.clone(), step(kind::STEP_STARTED, 2, 1)]);
    breaks(&synthetic(&after), "the live claim serves turn None");
    let mut keyed = turn.to_vec();
    let (started_kind, mut data) = step(kind::STEP_STARTED, 2, 1);
    data["key"] = json!("s:3:tool");
    keyed.push((started_kind, data));
    breaks(&synthetic(&keyed), "is not \"s:2:tool\"");
}
