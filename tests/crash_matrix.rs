//! The crash matrix (issue #7): nothing lost, nothing resurrected, nothing run twice, never a
//! crash loop — under real `SIGKILL`s of real processes.
//!
//! Each test re-executes this test binary as a child process (`--exact <test> --nocapture`, with
//! `DS_MATRIX_PLAN` selecting the child role). The child runs the runtime on a database file in a
//! temp directory with an [`EchoRunner`] (each drain promotes the pending steer prompts with
//! `promote_steer(None)` and appends one assistant reply per user message), creates sessions and
//! admits prompts with `Sessions::prompt`, printing `ADMITTING <id>` before and `ADMITTED <id>`
//! once `prompt()` returned. The parent kills it with SIGKILL either at a named crash point
//! (`DS_CRASH_POINT`, feature `crash-points`: the thread reaching it prints `CRASH_POINT <name>`
//! and blocks; the mid-drain point is the runner's own `MID_DRAIN` marker) or at a random time
//! under a seeded workload, then reads the file with plain rusqlite and checks, after every kill:
//!
//! - every acknowledged admission is in `session_input` (nothing lost), and nothing is
//!   half-committed: each input's `promoted_seq` matches exactly one `session.prompt.promoted`
//!   event and one `user` transcript row, every admitted/promoted/appended event has its row;
//! - per-session event seqs are `0..=max` with no gap or duplicate, and the log of every earlier
//!   boot is an untouched prefix of the new one (append-only);
//! - the claim replayed from the log matches the `session` row; a restart notice or an `aborted`
//!   failure only ever follows a live claim (a user-interrupted turn never resumes);
//! - per boot, a claimed turn of an earlier boot gets at most one attempt count and at most one
//!   notice or abort — exactly one once the boot's sweep completed — and `aborted` exactly when
//!   the count exceeds `max_resume_attempts`; no session gets more than one forced drain.
//!
//! Then a recovery boot (the test process itself, in its own actix `System`) resumes every
//! claimed turn exactly once (one forced drain, one notice) or terminalizes it once over budget,
//! leaves no claim, and — after the client retries every prompt it cannot see promoted, exactly
//! (same id and body: the documented recovery of an unacknowledged or never-woken admission) —
//! every prompt is promoted exactly once (or, if an interrupt fenced it, pending or promoted
//! once); one more prompt per session then leaves nothing pending and every user message
//! answered exactly once. Repeating a crash at the same point `budget + 1` boots in a row ends
//! in `aborted`, never a loop.
//!
//! `DS_SOAK=<n>` runs `n` random kills instead of the CI default; `DS_SEED=<seed>` replays a run.
#![cfg(feature = "crash-points")]
#![cfg(unix)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use durable_sessions::event::kind;
use durable_sessions::{CreateSession, MessageId, PromptInput, Runtime, SessionId, Synchronous};
use serde::{Deserialize, Serialize};

use common::{
    prompt_body, run_seed, say, splitmix, ChildProcess, EchoOptions, EchoRunner, StoreView, TestDb,
    XorShift,
};

/// The child's plan (JSON); set only in child processes.
const PLAN_ENV: &str = "DS_MATRIX_PLAN";
/// The database file the child opens.
const DB_ENV: &str = "DS_MATRIX_DB";
/// The resume budget of the named-point scenarios.
const BUDGET: u32 = 3;
/// The resume budget of the crash-loop scenarios (`budget + 1` crashing boots end in `aborted`).
const LOOP_BUDGET: u32 = 2;
/// Random kills CI runs (override with `DS_SOAK`).
const RANDOM_KILLS: usize = 240;
/// Independent kill chains run at once, each on its own database file.
const CHAINS: usize = 4;
/// A chain runs a full in-process recovery check after this many kills (and at its end).
const VERIFY_EVERY: usize = 10;

fn session(i: usize) -> SessionId {
    SessionId::new(format!("s{i}")).expect("valid session id")
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
    /// Chance (per mille) of a user interrupt after each admission.
    interrupt_per_mille: u64,
    /// When set, only this session is interrupted, after each of its admissions.
    interrupt_session: Option<usize>,
    /// Pause of up to this many microseconds after each admission.
    pause_us: u64,
    /// The runner's pauses between its steps.
    jitter_us: u64,
    /// The runner prints `MID_DRAIN` and blocks after promoting and one reply.
    mid_drain: bool,
    /// `synchronous = NORMAL` (crash-safe, not power-loss-safe) instead of `FULL`.
    normal_sync: bool,
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
            interrupt_per_mille: 0,
            interrupt_session: None,
            pause_us: 0,
            jitter_us: 0,
            mid_drain: false,
            normal_sync: false,
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
    });
    let mut builder = Runtime::builder()
        .database(&db)
        .runner(runner)
        .arbiters(2)
        .max_resume_attempts(plan.max_attempts)
        .sweep_on_start(true);
    if plan.normal_sync {
        builder = builder.synchronous(Synchronous::Normal);
    }
    let runtime = builder.start().await.expect("child runtime starts");
    say("READY");
    let sessions = runtime.sessions();
    let workloads = (0..plan.sessions).map(|i| {
        let (sessions, plan) = (sessions.clone(), plan.clone());
        async move {
            let sid = session(i);
            sessions
                .create(CreateSession {
                    id: Some(sid.clone()),
                    directory: "/matrix".into(),
                    ..CreateSession::default()
                })
                .await
                .expect("create session");
            let mut rng = XorShift::new(plan.seed ^ splitmix(i as u64));
            for n in 0..plan.prompts {
                let id = format!("b{}-s{i}-p{n}", plan.boot);
                say(&format!("ADMITTING {id} {sid}"));
                let input = PromptInput::new(sid.clone(), prompt_body(&id))
                    .with_id(MessageId::new(id.as_str()).expect("valid message id"));
                match sessions.prompt(input).await {
                    Ok(_) => say(&format!("ADMITTED {id}")),
                    Err(e) => say(&format!("REJECTED {id} {e}")),
                }
                let interrupt = match plan.interrupt_session {
                    Some(only) => only == i,
                    None => rng.chance(plan.interrupt_per_mille),
                };
                if interrupt {
                    let hit = sessions.interrupt(&sid).await.expect("interrupt");
                    say(&format!("INTERRUPTED {sid} {hit}"));
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
#[derive(Debug, Default)]
struct Ledger {
    /// Every prompt a child tried to admit: id → session.
    attempted: BTreeMap<String, String>,
    /// Prompts whose `prompt()` returned `Ok` to the child.
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
    /// Kills that left at least one claimed turn behind.
    left_claims: usize,
}

impl Ledger {
    /// Takes in one child's output; returns the forced drains it started, per session.
    fn absorb(&mut self, lines: &[String], context: &str) -> BTreeMap<String, usize> {
        let mut forced = BTreeMap::new();
        for line in lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["ADMITTING", id, session] => {
                    self.attempted.insert((*id).into(), (*session).into());
                    self.sessions.insert((*session).into());
                }
                ["ADMITTED", id] => {
                    self.acked.insert((*id).into());
                }
                ["REJECTED", ..] => panic!("{context}: a child's prompt failed: {line}"),
                ["INTERRUPTED", _, hit] => self.interrupts += usize::from(*hit == "true"),
                ["DRAIN", session, "true"] => {
                    *forced.entry((*session).to_string()).or_insert(0) += 1
                }
                _ => {}
            }
        }
        forced
    }
}

/// Checks one boot: `before` was read before the child started, `after` once it was killed.
/// `ready`: the boot's `start` (and so its sweep) completed.
fn check_boot(
    before: &StoreView,
    after: &StoreView,
    ledger: &Ledger,
    forced: &BTreeMap<String, usize>,
    ready: bool,
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
    for (session, row) in &after.sessions {
        let old_len = before.events.get(session).map_or(0, Vec::len);
        let new = &after.events[session][old_len..];
        let notices = new.iter().filter(|e| common::is_restart_notice(e)).count();
        let aborts = new.iter().filter(|e| common::is_abort(e)).count();
        let drains = forced.get(session).copied().unwrap_or(0);
        assert!(
            drains <= 1,
            "{context}: {session} drained forced {drains} times in one boot"
        );
        let Some(old) = before.sessions.get(session).filter(|r| r.claimed) else {
            assert!(
                !row.claimed || row.attempts == 0,
                "{context}: {session} claimed in this boot with {} attempts",
                row.attempts
            );
            assert_eq!(
                (notices, aborts),
                (0, 0),
                "{context}: {session} was not claimed at boot yet was swept (resurrected)"
            );
            continue;
        };
        assert!(
            notices + aborts <= 1,
            "{context}: {session} swept {notices} + {aborts} times in one boot"
        );
        if ready {
            assert_eq!(
                notices + aborts,
                1,
                "{context}: {session} was claimed but the completed sweep skipped it"
            );
            assert_eq!(
                aborts == 1,
                old.attempts + 1 > max,
                "{context}: {session} with {} attempts, budget {max}: aborts {aborts}",
                old.attempts
            );
        }
        let released = new.iter().any(|e| {
            e.kind == kind::EXECUTION_SUCCEEDED
                || e.kind == kind::EXECUTION_FAILED
                || (e.kind == kind::EXECUTION_INTERRUPTED && e.data["reason"] != "shutdown")
        });
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
    let context = format!(
        "{test} boot {} (seed {}, point {point:?})",
        plan.boot, plan.seed
    );
    let before = StoreView::read(db);
    let mut child = spawn_child(test, plan, db, point);
    kill_after(&mut child);
    let lines = child.kill();
    ledger.kills += 1;
    let forced = ledger.absorb(&lines, &context);
    let ready = lines.iter().any(|l| l == "READY");
    let done = lines.iter().any(|l| l == "DONE");
    ledger.landed[usize::from(ready) + usize::from(done)] += 1;
    let after = StoreView::read(db);
    ledger.snapshots += 1;
    ledger.left_claims += usize::from(!after.claimed().is_empty());
    check_boot(
        &before,
        &after,
        ledger,
        &forced,
        ready,
        plan.max_attempts,
        &context,
    );
    lines
}

/// The recovery boot, in this process: the sweep resumes every claimed turn exactly once (or
/// terminalizes it over budget) and leaves no claim; the client's exact retries promote every
/// prompt once; a last prompt per session leaves nothing pending and everything answered once.
fn verify_recovery(db: &Path, ledger: &mut Ledger, max: u32, context: &str) {
    let context = format!("{context}, recovery {}", ledger.recoveries);
    let before = StoreView::read(db);
    before.assert_invariants(max, &context);
    let round = ledger.recoveries;
    ledger.recoveries += 1;
    ledger.snapshots += 4;
    actix_rt::System::new().block_on(async {
        let runner = EchoRunner::new(EchoOptions::default());
        let runtime = Runtime::builder()
            .database(db)
            .runner(runner.clone())
            .arbiters(2)
            .max_resume_attempts(max)
            .sweep_on_start(true)
            .start()
            .await
            .expect("recovery boot starts");
        let sessions = runtime.sessions();
        let execution = runtime.execution();
        let orphans = before.claimed();
        for id in &orphans {
            execution
                .await_idle(&SessionId::new(id.as_str()).unwrap())
                .await
                .unwrap();
        }

        // The sweep: one forced drain per resumed turn, none for anything else, no claim left.
        let swept = StoreView::read(db);
        let mut forced = BTreeMap::new();
        for ((session, was_forced), n) in runner.drains() {
            assert!(
                was_forced,
                "{context}: a wake drain of {session} ran during the sweep"
            );
            *forced.entry(session).or_insert(0) += n;
        }
        check_boot(&before, &swept, ledger, &forced, true, max, &context);
        for id in &orphans {
            let resumed = before.sessions[id].attempts < max;
            let drains = forced.get(id).copied().unwrap_or(0);
            assert_eq!(
                drains,
                usize::from(resumed),
                "{context}: {id} resumed {drains} times (attempts {}, budget {max})",
                before.sessions[id].attempts
            );
        }
        assert_eq!(
            forced.keys().filter(|s| !orphans.contains(*s)).count(),
            0,
            "{context}: an unclaimed session was resumed"
        );
        assert!(
            swept.claimed().is_empty(),
            "{context}: claims left after the recovered turns ended: {:?}",
            swept.claimed()
        );

        // The client's recovery: retry, exactly, every prompt it cannot see promoted.
        let mut all_sessions: BTreeSet<String> = swept.sessions.keys().cloned().collect();
        all_sessions.extend(ledger.sessions.iter().cloned());
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
        for (id, session) in &ledger.attempted {
            if swept
                .inputs
                .get(id)
                .is_some_and(|r| r.promoted_seq.is_some())
            {
                continue;
            }
            let input =
                PromptInput::new(SessionId::new(session.as_str()).unwrap(), prompt_body(id))
                    .with_id(MessageId::new(id.as_str()).unwrap());
            sessions
                .prompt(input)
                .await
                .unwrap_or_else(|e| panic!("{context}: the exact retry of {id} failed: {e}"));
            ledger.acked.insert(id.clone());
        }
        for id in &all_sessions {
            execution
                .await_idle(&SessionId::new(id.as_str()).unwrap())
                .await
                .unwrap();
        }
        let retried = StoreView::read(db);
        retried.assert_invariants(max, &context);
        assert!(
            retried.claimed().is_empty(),
            "{context}: claims left after retries"
        );
        for (id, session) in &ledger.attempted {
            let row = retried
                .inputs
                .get(id)
                .unwrap_or_else(|| panic!("{context}: retried prompt {id} is not admitted"));
            let fenced = retried
                .interrupt_fence(session)
                .is_some_and(|fence| row.admitted_seq <= fence);
            assert!(
                row.promoted_seq.is_some() || fenced,
                "{context}: prompt {id} is still pending after recovery and not fenced"
            );
        }

        // One more prompt per session promotes whatever an interrupt fence left pending.
        for session in &all_sessions {
            let id = format!("v{round}-{session}");
            ledger.attempted.insert(id.clone(), session.clone());
            let input =
                PromptInput::new(SessionId::new(session.as_str()).unwrap(), prompt_body(&id))
                    .with_id(MessageId::new(id.as_str()).unwrap());
            sessions.prompt(input).await.expect("last prompt");
            ledger.acked.insert(id);
        }
        for id in &all_sessions {
            execution
                .await_idle(&SessionId::new(id.as_str()).unwrap())
                .await
                .unwrap();
        }
        let settled = StoreView::read(db);
        settled.assert_invariants(max, &context);
        assert!(
            settled.claimed().is_empty(),
            "{context}: claims left at the end"
        );
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
                assert_eq!(
                    replies.get(id).copied(),
                    Some(1),
                    "{context}: user message {id} answered {:?} times",
                    replies.get(id)
                );
            }
        }
        ledger.notices = settled.sessions.keys().map(|s| settled.notices(s)).sum();
        ledger.aborts = settled.sessions.keys().map(|s| settled.aborts(s)).sum();
        runtime.shutdown().await;
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

    /// Whether the point can be reached by a resumed turn (so it can crash-loop).
    fn loops(self) -> bool {
        self != Point::Named("during_admission")
    }

    /// Whether a first boot armed at this point leaves a claimed turn behind.
    fn leaves_a_claim(self) -> bool {
        !matches!(
            self,
            Point::Named("before_claim" | "sweep_after_count" | "during_admission")
        )
    }
}

/// One SIGKILL at `point` on a fresh database, the point's own assertions, then the recovery
/// boot; and, where the point can be reached again by a resumed turn, `LOOP_BUDGET + 1`
/// crashing boots in a row that must end in `aborted`.
fn crash_point_scenario(test: &str, point: Point, specific: impl FnOnce(&StoreView, &Ledger)) {
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
    crash_once(
        test,
        &db.path,
        &mut ledger,
        &plan,
        point.env(),
        &point.marker(),
    );
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
    specific(&after, &ledger);
    verify_recovery(&db.path, &mut ledger, BUDGET, test);
    if point.loops() {
        crash_loop(test, point);
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

/// Killed before the claim of a turn commits: no claim and no `started` event exist, the
/// admission that woke it is committed but unacknowledged, and the client's retry promotes it
/// once; nothing is resumed. Repeated on resumed turns, the crash loop ends in `aborted`.
#[test]
fn crash_before_claim() {
    run_child_if_requested();
    crash_point_scenario(
        "crash_before_claim",
        Point::Named("before_claim"),
        |view, ledger| {
            assert!(
                view.claimed().is_empty(),
                "a claim committed: {:?}",
                view.claimed()
            );
            for id in view.sessions.keys() {
                assert_eq!(view.count_kind(id, kind::EXECUTION_STARTED), 0);
            }
            let unacked: Vec<_> = view
                .inputs
                .keys()
                .filter(|id| !ledger.acked.contains(*id))
                .collect();
            assert!(
                !unacked.is_empty(),
                "the prompt that woke the turn was not committed"
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

// ---------------------------------------------------------------------------------------------
// Random kills.

/// One chain of random kills on its own database file; returns its ledger.
fn random_chain(test: &str, chain: usize, kills: usize, base: u64) -> Ledger {
    let db = TestDb::new();
    let mut ledger = Ledger::default();
    let max = 3;
    for k in 0..kills {
        let seed = splitmix(base ^ ((chain as u64) << 40) ^ k as u64);
        let mut rng = XorShift::new(seed);
        let plan = Plan {
            boot: k,
            seed,
            sessions: 2 + rng.below(3) as usize,
            prompts: 2 + rng.below(6) as usize,
            max_attempts: max,
            interrupt_per_mille: 60,
            interrupt_session: None,
            pause_us: 3000,
            jitter_us: 1500,
            mid_drain: false,
            normal_sync: rng.chance(500),
        };
        // Mostly a few ms into the workload; one kill in eight lands in start-up or the sweep.
        let early = rng.chance(125);
        let delay = Duration::from_micros(if early {
            rng.below(40_000)
        } else {
            rng.below(25_000)
        });
        crash_with(test, &db.path, &mut ledger, &plan, None, |child| {
            if !early {
                child.wait_for("READY");
            }
            // The kill itself is the event under test: a random instant, not a synchronisation.
            thread::sleep(delay);
        });
        if (k + 1) % VERIFY_EVERY == 0 || k + 1 == kills {
            let context = format!("{test} chain {chain} after kill {k} (base seed {base})");
            verify_recovery(&db.path, &mut ledger, max, &context);
        }
    }
    ledger
}

/// `DS_SOAK` (default 240) SIGKILLs at random instants of a seeded workload — prompts,
/// interrupts, runner pauses, half of the boots with `synchronous = NORMAL` — in four chains on
/// four database files at once; every kill is followed by the per-boot checks and every tenth
/// by a full recovery.
#[test]
fn random_kills_under_a_seeded_workload() {
    const TEST: &str = "random_kills_under_a_seeded_workload";
    run_child_if_requested();
    let total: usize = std::env::var("DS_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(RANDOM_KILLS);
    let base = run_seed();
    eprintln!("{TEST}: {total} kills, base seed {base} (replay with DS_SEED={base})");
    let started = Instant::now();
    let chains: Vec<_> = (0..CHAINS)
        .map(|chain| {
            let kills = total / CHAINS + usize::from(chain < total % CHAINS);
            thread::spawn(move || random_chain(TEST, chain, kills, base))
        })
        .collect();
    let mut totals = Ledger::default();
    for chain in chains {
        let ledger = chain.join().expect("a kill chain failed");
        totals.kills += ledger.kills;
        totals.snapshots += ledger.snapshots;
        totals.recoveries += ledger.recoveries;
        totals.interrupts += ledger.interrupts;
        totals.notices += ledger.notices;
        totals.aborts += ledger.aborts;
        totals.left_claims += ledger.left_claims;
        for (total, landed) in totals.landed.iter_mut().zip(ledger.landed) {
            *total += landed;
        }
        totals.attempted.extend(ledger.attempted);
        totals.acked.extend(ledger.acked);
    }
    assert_eq!(totals.kills, total);
    eprintln!(
        "{TEST}: {} kills ({} in start-up, {} in the workload, {} once idle; {} left a claimed \
         turn), {} recoveries, {} store snapshots checked, {} prompts ({} acknowledged by a child \
         or retried), {} user interrupts, {} restart notices, {} aborted, in {:?} (seed {base})",
        totals.kills,
        totals.landed[0],
        totals.landed[1],
        totals.landed[2],
        totals.left_claims,
        totals.recoveries,
        totals.snapshots,
        totals.attempted.len(),
        totals.acked.len(),
        totals.interrupts,
        totals.notices,
        totals.aborts,
        started.elapsed()
    );
}
