//! Real process death: a turn whose process is SIGKILLed mid-drain keeps its write-ahead claim,
//! and the next boot's sweep resumes it exactly once with one restart notice, counting the
//! attempt durably before the drain; a turn the user interrupted before the kill is never
//! resumed; a turn that keeps crashing its process is terminalized as `aborted` once it
//! exhausts `max_resume_attempts`, instead of crash-looping; and a turn killed inside a durable
//! step's body does not run again the steps it completed.
//!
//! Each test re-executes this test binary as a child process (sled's pattern): with
//! `DS_CRASH_CHILD=<mode>` and `DS_CRASH_DB=<path>` set, the test function runs the child
//! workload instead — a runtime on the database whose drain never ends — prints a marker line
//! once the drain runs, and waits to be killed. The parent reads the child's stdout up to the
//! marker, kills it with SIGKILL and then boots the runtime again on the same file.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{kind, ABORTED_MESSAGE, RESTART_NOTICE_DESCRIPTION, RESTART_NOTICE_TEXT};
use durable_sessions::{
    CreateSession, RunError, Runner, Runtime, SessionId, StepContext, StepRecord, StepStatus,
    Terminal, Turn, TurnCause,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::json;

use common::{say, ChildProcess, StoreView, TestDb, WAIT};

/// The child's workload, when set.
const CHILD_ENV: &str = "DS_CRASH_CHILD";
/// The database file the child opens.
const DB_ENV: &str = "DS_CRASH_DB";
/// Printed by the child once its drain runs (and the claim is committed).
const DRAIN_STARTED: &str = "DRAIN_STARTED";
/// Printed by the child once its user interrupt returned `true`.
const INTERRUPTED: &str = "INTERRUPTED";
/// Printed by the child inside the body of step 2, which never returns.
const IN_STEP_2: &str = "IN_STEP 2";
/// The resume budget of every boot in the crash-loop test.
const MAX_ATTEMPTS: u32 = 2;
/// The session every child works on.
const SESSION: &str = "turn";

fn session() -> SessionId {
    SessionId::new(SESSION).expect("valid id")
}

// ---------------------------------------------------------------------------------------------
// The child side.

/// What a child process does before it waits to be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Create the session, `resume` it with a never-ending drain, print [`DRAIN_STARTED`].
    Resume,
    /// As `Resume`, then interrupt the turn as the user and print [`INTERRUPTED`].
    Interrupt,
    /// Boot with the sweep (budget [`MAX_ATTEMPTS`]); print [`DRAIN_STARTED`] once the resumed,
    /// never-ending drain runs.
    Sweep,
    /// Create the session and `resume` it with a [`StepRunner`] whose step 2 never returns: it
    /// prints [`IN_STEP_2`] once its run is recorded.
    Steps,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Resume => "resume",
            Mode::Interrupt => "interrupt",
            Mode::Sweep => "sweep",
            Mode::Steps => "steps",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "resume" => Mode::Resume,
            "interrupt" => Mode::Interrupt,
            "sweep" => Mode::Sweep,
            "steps" => Mode::Steps,
            other => panic!("unknown {CHILD_ENV} mode {other:?}"),
        }
    }
}

/// When this process is a crash child, runs the child workload and never returns.
fn run_child_if_requested() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mode = Mode::parse(&mode);
    let path = PathBuf::from(std::env::var(DB_ENV).expect("DS_CRASH_DB is set"));
    // End the test harness's `test <name> ... ` line, so the marker starts a line.
    say("");
    if mode == Mode::Steps {
        actix_rt::System::new().block_on(steps_child(path));
    } else {
        actix_rt::System::new().block_on(child(mode, path));
    }
    // The workload ends only when the parent kills it; never report a result of our own.
    std::process::exit(3);
}

async fn child(mode: Mode, path: PathBuf) {
    let id = session();
    let runner = ScriptedRunner::new();
    runner.set_default(&id, Script::Never);
    let runtime = Runtime::builder()
        .database(&path)
        .runner(runner.clone())
        .arbiters(2)
        .max_resume_attempts(MAX_ATTEMPTS)
        .sweep_on_start(mode == Mode::Sweep)
        .start()
        .await
        .expect("child runtime starts");
    if mode != Mode::Sweep {
        runtime
            .sessions()
            .create(CreateSession {
                id: Some(id.clone()),
                directory: "/work".into(),
                ..CreateSession::default()
            })
            .await
            .expect("create session");
        let execution = runtime.execution();
        let id = id.clone();
        actix_rt::spawn(async move { execution.resume(&id).await });
    }
    runner.wait_for_drains_of(&id, 1, WAIT).await;
    if mode == Mode::Interrupt {
        assert!(runtime.execution().interrupt(&id, None).await.unwrap());
        say(INTERRUPTED);
    } else {
        say(DRAIN_STARTED);
    }
    // Wait to be killed; a parent that died without killing us must not leave us behind.
    actix_rt::time::sleep(Duration::from_secs(60)).await;
}

/// One run of a [`StepRunner`] step's body: its external effect.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BodyRun {
    /// The step's number (`step<n>`).
    step: u32,
    /// What [`StepContext`] told it.
    key: String,
    turn: u64,
    turn_attempt: u32,
    previous: u32,
}

impl BodyRun {
    fn new(step: u32, ctx: &StepContext) -> Self {
        BodyRun {
            step,
            key: ctx.key().to_owned(),
            turn: ctx.turn(),
            turn_attempt: ctx.turn_attempt(),
            previous: ctx.previous_attempts(),
        }
    }

    /// The line a child prints for it: `STEP_BODY <step> <key> <turn> <turn attempt>
    /// <previous attempts>`.
    fn line(&self) -> String {
        format!(
            "STEP_BODY {} {} {} {} {}",
            self.step, self.key, self.turn, self.turn_attempt, self.previous
        )
    }
}

/// What a [`StepRunner`] drain saw of its turn, and the values its steps returned.
#[derive(Debug, Clone)]
struct SeenDrain {
    recovery: bool,
    id: u64,
    attempt: u32,
    /// [`durable_sessions::Resumption::steps`]: the ambiguous steps.
    ambiguous: Vec<StepRecord>,
    values: Vec<u32>,
}

/// A runner whose turn runs three durable steps, `step1`, `step2`, `step3`: each body records
/// its run (its external effect: kept here, and printed as a `STEP_BODY` line with `print`)
/// and returns `10 * n`. The body of step `block_in`, once its run is recorded, prints
/// `IN_STEP <n>` and never returns.
#[derive(Clone, Default)]
struct StepRunner {
    block_in: Option<u32>,
    print: bool,
    runs: Arc<Mutex<Vec<BodyRun>>>,
    drains: Arc<Mutex<Vec<SeenDrain>>>,
}

impl StepRunner {
    fn ran(&self, run: BodyRun) {
        if self.print {
            say(&run.line());
        }
        self.runs.lock().unwrap().push(run);
    }
}

impl Runner for StepRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let this = self.clone();
        async move {
            let mut seen = SeenDrain {
                recovery: matches!(turn.cause(), TurnCause::Recovery(_)),
                id: turn.id(),
                attempt: turn.attempt(),
                ambiguous: turn
                    .resumption()
                    .map(|r| r.steps.clone())
                    .unwrap_or_default(),
                values: Vec::new(),
            };
            for n in 1..=3u32 {
                let body = |ctx: StepContext| {
                    let this = this.clone();
                    async move {
                        this.ran(BodyRun::new(n, &ctx));
                        if this.block_in == Some(n) {
                            say(&format!("IN_STEP {n}"));
                            futures::future::pending::<()>().await;
                        }
                        Ok::<_, std::convert::Infallible>(10 * n)
                    }
                };
                let value = turn
                    .step(&format!("step{n}"), body)
                    .await
                    .map_err(|e| RunError::Other(e.to_string()))?;
                seen.values.push(value);
            }
            this.drains.lock().unwrap().push(seen);
            Ok(())
        }
        .boxed_local()
    }
}

/// The [`Mode::Steps`] child: a turn of a [`StepRunner`] blocked in step 2's body.
async fn steps_child(path: PathBuf) {
    let id = session();
    let runner = StepRunner {
        block_in: Some(2),
        print: true,
        ..StepRunner::default()
    };
    let runtime = Runtime::builder()
        .database(&path)
        .runner(runner)
        .arbiters(2)
        .sweep_on_start(false)
        .start()
        .await
        .expect("child runtime starts");
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/work".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    let execution = runtime.execution();
    actix_rt::spawn(async move { execution.resume(&id).await });
    // Wait to be killed; a parent that died without killing us must not leave us behind.
    actix_rt::time::sleep(Duration::from_secs(60)).await;
}

// ---------------------------------------------------------------------------------------------
// The parent side.

/// Runs one child in `mode` for `test` on `db` until it prints `marker`, then SIGKILLs it.
fn crash_child(test: &str, mode: Mode, db: &Path, marker: &str) {
    let mut child = ChildProcess::spawn(
        test,
        &[
            (CHILD_ENV, mode.as_str().to_owned()),
            (DB_ENV, db.display().to_string()),
        ],
    );
    child.wait_for(marker);
    child.kill();
}

/// The wire names of the session's stored events, in seq order; asserts the seqs are 0, 1, 2, …
fn event_kinds(db: &Path, id: &SessionId) -> Vec<String> {
    let events = testing::events(db, id).unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    events.into_iter().map(|e| e.kind).collect()
}

fn count(db: &Path, id: &SessionId, event: &str) -> usize {
    testing::events_of_kind(db, id, event).unwrap().len()
}

/// A turn whose process was SIGKILLed mid-drain is resumed exactly once by the next boot: one
/// restart notice, `resume_attempts == 1` while the resumed drain runs, the claim released after.
#[test]
fn a_turn_killed_mid_drain_is_resumed_exactly_once_at_the_next_boot() {
    run_child_if_requested();
    let db = TestDb::new();
    let id = session();
    crash_child(
        "a_turn_killed_mid_drain_is_resumed_exactly_once_at_the_next_boot",
        Mode::Resume,
        &db.path,
        DRAIN_STARTED,
    );
    // The kill left the write-ahead claim and nothing after it.
    let crashed = testing::claim_state(&db.path, &id).unwrap().unwrap();
    assert!(crashed.time_suspended.is_some());
    assert_eq!(crashed.resume_attempts, 0);
    assert_eq!(
        event_kinds(&db.path, &id),
        [kind::CREATED, kind::EXECUTION_STARTED]
    );

    actix_rt::System::new().block_on(async {
        let runner = ScriptedRunner::new();
        let gate = Gate::new();
        runner.push(&id, Script::Gate(gate.clone()));
        let runtime = db.builder(&runner).sweep_on_start(true).start().await.unwrap();
        runner.wait_for_drains(1, WAIT).await;

        // The resumed drain runs: the attempt is counted, the notice published, the claim held.
        assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), 1);
        assert!(testing::is_claimed(&db.path, &id).unwrap());
        let notices = testing::events_of_kind(&db.path, &id, kind::SYNTHETIC).unwrap();
        assert_eq!(notices.len(), 1);
        assert_eq!(
            notices[0].data,
            json!({"sessionID": id, "text": RESTART_NOTICE_TEXT, "description": RESTART_NOTICE_DESCRIPTION})
        );
        // Re-claimed by this boot, keeping the original claim time.
        let claim = testing::claim_state(&db.path, &id).unwrap().unwrap();
        assert_eq!(claim.claim_boot.as_deref(), Some(runtime.boot_id()));
        assert_ne!(claim.claim_boot, crashed.claim_boot);
        assert_eq!(claim.time_suspended, crashed.time_suspended);

        gate.release();
        runtime.execution().await_idle(&id).await.unwrap();
        assert!(!testing::is_claimed(&db.path, &id).unwrap());
        assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), 0);
        let drains = runner.drains();
        assert_eq!(drains.len(), 1, "{drains:?}");
        assert!(drains[0].session_id == id && drains[0].forced);
        assert_eq!(
            event_kinds(&db.path, &id),
            [
                kind::CREATED,
                kind::EXECUTION_STARTED,
                kind::SYNTHETIC,
                kind::EXECUTION_STARTED,
                kind::EXECUTION_SUCCEEDED,
            ]
        );

        // Nothing is left to resume.
        let again = runtime.resume_suspended_sessions().await.unwrap();
        assert!(again.resumed.is_empty() && again.terminalized.is_empty());
        assert_eq!(runner.drains().len(), 1);
        runtime.shutdown().await;
    });
}

/// A turn the user interrupted before the process was SIGKILLed stays interrupted: the next
/// boot's sweep resumes nothing and publishes no notice.
#[test]
fn a_user_interrupted_turn_is_not_resumed_after_a_kill() {
    run_child_if_requested();
    let db = TestDb::new();
    let id = session();
    crash_child(
        "a_user_interrupted_turn_is_not_resumed_after_a_kill",
        Mode::Interrupt,
        &db.path,
        INTERRUPTED,
    );
    assert!(!testing::is_claimed(&db.path, &id).unwrap());
    let interrupted = testing::events_of_kind(&db.path, &id, kind::EXECUTION_INTERRUPTED).unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].data, json!({"reason": "user"}));

    actix_rt::System::new().block_on(async {
        let runner = ScriptedRunner::new();
        let runtime = db
            .builder(&runner)
            .sweep_on_start(true)
            .start()
            .await
            .unwrap();
        // The boot sweep registers every turn it resumes before `start` returns.
        assert!(runtime.execution().active().is_empty());
        let report = runtime.resume_suspended_sessions().await.unwrap();
        assert!(report.resumed.is_empty() && report.terminalized.is_empty());
        assert!(runner.drains().is_empty());
        assert_eq!(count(&db.path, &id, kind::SYNTHETIC), 0);
        assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), 0);
        assert_eq!(
            event_kinds(&db.path, &id),
            [
                kind::CREATED,
                kind::EXECUTION_STARTED,
                kind::EXECUTION_INTERRUPTED
            ]
        );

        // The session itself still works.
        assert_eq!(
            runtime.execution().resume(&id).await.unwrap(),
            Terminal::Succeeded
        );
        runtime.shutdown().await;
    });
}

/// A turn that crashes its process three times (the first run, then each of its two resumes)
/// exhausts `max_resume_attempts = 2`: the fourth boot records `failed{aborted}` with the release
/// and does not drain it.
#[test]
fn repeated_crashes_mid_drain_end_in_aborted_instead_of_a_crash_loop() {
    run_child_if_requested();
    const TEST: &str = "repeated_crashes_mid_drain_end_in_aborted_instead_of_a_crash_loop";
    let db = TestDb::new();
    let id = session();
    crash_child(TEST, Mode::Resume, &db.path, DRAIN_STARTED);
    assert!(testing::is_claimed(&db.path, &id).unwrap());
    assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), 0);
    for attempt in 1..=MAX_ATTEMPTS {
        crash_child(TEST, Mode::Sweep, &db.path, DRAIN_STARTED);
        assert!(testing::is_claimed(&db.path, &id).unwrap());
        assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), attempt);
        assert_eq!(count(&db.path, &id, kind::SYNTHETIC), attempt as usize);
        assert_eq!(
            count(&db.path, &id, kind::EXECUTION_STARTED),
            attempt as usize + 1
        );
    }

    actix_rt::System::new().block_on(async {
        let runner = ScriptedRunner::new();
        let runtime = db
            .builder(&runner)
            .max_resume_attempts(MAX_ATTEMPTS)
            .sweep_on_start(true)
            .start()
            .await
            .unwrap();
        assert!(runtime.execution().active().is_empty());
        assert!(runner.drains().is_empty());
        let failed = testing::events_of_kind(&db.path, &id, kind::EXECUTION_FAILED).unwrap();
        assert_eq!(failed.len(), 1);
        assert_eq!(
            failed[0].data,
            json!({"error": {"type": "aborted", "message": ABORTED_MESSAGE}})
        );
        assert!(!testing::is_claimed(&db.path, &id).unwrap());
        assert_eq!(testing::resume_attempts(&db.path, &id).unwrap(), 0);
        assert_eq!(count(&db.path, &id, kind::SYNTHETIC), MAX_ATTEMPTS as usize);

        let again = runtime.resume_suspended_sessions().await.unwrap();
        assert!(again.resumed.is_empty() && again.terminalized.is_empty());
        assert!(runner.drains().is_empty());
        runtime.shutdown().await;
    });
}

/// A turn whose process is SIGKILLed inside the body of its second of three durable steps is
/// resumed by the next boot under the same turn id: step 1, completed before the kill, is not
/// run again (its recorded value is returned); step 2, whose intent is recorded and whose
/// outcome is not, is listed as ambiguous in the resumption and runs again, told one previous
/// attempt; step 3 runs once; the turn succeeds. Each body's run is an external effect (a
/// `STEP_BODY` line of the child, a record of the recovery boot's runner): step 1 ran once in
/// all, step 2 twice, step 3 once.
#[test]
fn a_completed_step_is_not_run_again_after_a_crash() {
    run_child_if_requested();
    const TEST: &str = "a_completed_step_is_not_run_again_after_a_crash";
    let db = TestDb::new();
    let id = session();
    let mut child = ChildProcess::spawn(
        TEST,
        &[
            (CHILD_ENV, Mode::Steps.as_str().to_owned()),
            (DB_ENV, db.path.display().to_string()),
        ],
    );
    child.wait_for(IN_STEP_2);
    let lines = child.kill();

    // The claim at seq 1 is the turn's id; the kill left step 1 completed and step 2 open.
    let turn = 1;
    let key = |n: u32| format!("{SESSION}:{turn}:step{n}");
    let killed_runs: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("STEP_BODY"))
        .map(String::as_str)
        .collect();
    let first_run = |n: u32| BodyRun {
        step: n,
        key: key(n),
        turn,
        turn_attempt: 1,
        previous: 0,
    };
    assert_eq!(
        killed_runs,
        [first_run(1).line(), first_run(2).line()],
        "the killed child's step bodies"
    );
    assert_eq!(
        event_kinds(&db.path, &id),
        [
            kind::CREATED,
            kind::EXECUTION_STARTED,
            kind::STEP_STARTED,
            kind::STEP_COMPLETED,
            kind::STEP_STARTED,
        ]
    );

    actix_rt::System::new().block_on(async {
        let runner = StepRunner::default();
        let runtime = db
            .builder(&runner)
            .sweep_on_start(true)
            .start()
            .await
            .unwrap();
        // The sweep registers every turn it resumes before `start` returns.
        runtime.execution().await_idle(&id).await.unwrap();

        // Step 1 did not run again; step 2 ran again, told of the lost run; step 3 ran once.
        let runs = runner.runs.lock().unwrap().clone();
        let resumed_run = |n: u32, previous: u32| BodyRun {
            turn_attempt: 2,
            previous,
            ..first_run(n)
        };
        assert_eq!(runs, [resumed_run(2, 1), resumed_run(3, 0)]);

        let drains = runner.drains.lock().unwrap().clone();
        assert_eq!(drains.len(), 1, "{drains:?}");
        let drain = &drains[0];
        assert!(drain.recovery, "{drain:?}");
        assert_eq!((drain.id, drain.attempt), (turn, 2));
        assert_eq!(drain.values, [10, 20, 30], "step 1's value is the recorded one");
        let [ambiguous] = drain.ambiguous.as_slice() else {
            panic!("ambiguous steps {:?}", drain.ambiguous);
        };
        assert_eq!(
            (
                ambiguous.name.as_str(),
                ambiguous.key.as_str(),
                ambiguous.attempts,
                ambiguous.turn_attempt,
                &ambiguous.status
            ),
            ("step2", key(2).as_str(), 1, 1, &StepStatus::Started)
        );

        // The log: both attempts' step records under the same turn, attempt 1 then 2.
        assert_eq!(
            event_kinds(&db.path, &id),
            [
                kind::CREATED,
                kind::EXECUTION_STARTED,
                kind::STEP_STARTED,
                kind::STEP_COMPLETED,
                kind::STEP_STARTED,
                kind::SYNTHETIC,
                kind::EXECUTION_STARTED,
                kind::STEP_STARTED,
                kind::STEP_COMPLETED,
                kind::STEP_STARTED,
                kind::STEP_COMPLETED,
                kind::EXECUTION_SUCCEEDED,
            ]
        );
        let steps: Vec<serde_json::Value> = testing::events(&db.path, &id)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind.starts_with("session.step."))
            .map(|e| e.data)
            .collect();
        let started = |n: u32, attempt: u32| {
            json!({"turn": turn, "step": format!("step{n}"), "attempt": attempt, "key": key(n)})
        };
        let completed = |n: u32, attempt: u32| {
            json!({"turn": turn, "step": format!("step{n}"), "attempt": attempt, "result": 10 * n})
        };
        assert_eq!(
            steps,
            [
                started(1, 1),
                completed(1, 1),
                started(2, 1),
                started(2, 2),
                completed(2, 2),
                started(3, 2),
                completed(3, 2),
            ]
        );
        assert!(!testing::is_claimed(&db.path, &id).unwrap());
        StoreView::read(&db.path).assert_invariants(MAX_ATTEMPTS, TEST);
        runtime.shutdown().await;
    });
}
