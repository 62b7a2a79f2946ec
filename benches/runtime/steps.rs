//! `steps`: durable steps (`Turn::step`) against `Turn::append_message` of the same payload,
//! and the replay of a resumed turn's completed steps.
//!
//! - *Throughput*: `c` sessions (c = 1 and 1,000), each driven by a task that `resume`s it in a
//!   loop; every turn's drain runs 10 steps with empty bodies (each returns the payload), and
//!   in the same repeat, on a fresh copy of the same database, 10 `append_message` of the same
//!   payload. Steps/s against appends/s, synchronous FULL and NORMAL, group commit on. A step
//!   is two records (its intent and its outcome) and an append one, so the writer does about
//!   twice the work per step. Target: at c = 1,000 FULL, steps/s ≥ 0.5× appends/s (the median
//!   of the per-repeat ratios).
//! - *Latency* (c = 1): turns of 10 steps; before each step a raw single-row commit on a copy
//!   of the database beside it (as `latency` times its baseline), then the step, then one
//!   `append_message`, then a *bare step*, each timed inside the drain. Target: a step's p50 ≤
//!   2 commits + 100 µs, judged per repeat against the commits timed beside it. The bare step is
//!   the floor of a step under this architecture: two raw event-insert transactions (`Raw::
//!   claim_shaped`: the next seq, an event, a claim row) on a plain writer thread (on a copy of
//!   its own), each reached from the drain as a step reaches the runtime's writer (drain →
//!   writer → drain), with nothing of the runtime.
//! - *Replay* (NORMAL): a turn records 1,000 steps and fails; `Sessions::retry` runs its next
//!   attempt, whose drain calls the same 1,000 steps: each returns the recorded value without
//!   running its body (the harness checks that no body ran). Timed from the drain's first
//!   instant to the last step's return (the ledger is read before the drain starts), and from
//!   the `retry` call to the same instant (the retry's claim, reading the turn's 2,000 step
//!   events and folding them included). Target: ≥ 100,000 steps/s from the drain's start.
//!   Replay is in-memory work, so the synchronous setting does not change it; NORMAL keeps the
//!   recording short.

use std::cell::Cell;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use durable_sessions::{RunError, Runner, Runtime, SessionId, Synchronous, Terminal, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use crate::ceiling::{self, SYNCS};
use crate::db::{self, Raw};
use crate::report::{median, percentile, Row};
use crate::turns::resume_loop;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "steps";

/// Steps (or appends) per turn.
const PER_TURN: usize = 10;

/// The steps a replayed turn completed before it failed.
const REPLAYED: usize = 1_000;

/// What every step returns and every append appends: a tool result of about 100 bytes.
fn payload() -> Value {
    json!({
        "tool": "bench",
        "output": "the quick brown fox jumps over the lazy dog",
        "ok": true,
    })
}

/// The name of step `i` of a turn.
fn step_name(i: usize) -> String {
    format!("s{i}")
}

/// Runs one step whose body returns `payload` at once.
async fn empty_step(turn: &Turn, i: usize, payload: &Value) -> durable_sessions::Result<Value> {
    let value = payload.clone();
    turn.step(
        &step_name(i),
        move |_| async move { Ok::<_, Infallible>(value) },
    )
    .await
}

/// What a throughput drain writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// [`PER_TURN`] steps.
    Steps,
    /// [`PER_TURN`] `append_message("assistant", payload)`.
    Appends,
}

impl Work {
    fn unit(self) -> &'static str {
        match self {
            Work::Steps => "steps/s",
            Work::Appends => "appends/s",
        }
    }
}

/// The throughput drain: [`PER_TURN`] steps or appends, one after the other.
#[derive(Debug)]
struct Tenfold {
    work: Work,
    payload: Value,
}

impl Runner for Tenfold {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let (work, payload) = (self.work, self.payload.clone());
        async move {
            for i in 0..PER_TURN {
                match work {
                    Work::Steps => {
                        empty_step(&turn, i, &payload).await?;
                    }
                    Work::Appends => {
                        turn.append_message("assistant", payload.clone()).await?;
                    }
                }
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// Runs the scenario.
///
/// `DS_BENCH_STEPS_ONLY=latency` runs only some parts (any of `throughput`, `latency`, `replay`,
/// comma-separated).
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let only = std::env::var("DS_BENCH_STEPS_ONLY").ok();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    let mut rows = Vec::new();
    if part("throughput") {
        rows.extend(throughput(ctx)?);
    }
    if part("latency") {
        rows.extend(latency(ctx)?);
    }
    if part("replay") {
        rows.extend(replay(ctx)?);
    }
    Ok(rows)
}

/// Steps/s against appends/s at each concurrency and synchronous setting.
fn throughput(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let levels = ctx.pick([1, 1_000], [1, 50]);
    let window = ctx.pick(Duration::from_secs(3), Duration::from_millis(150));
    // Turns issued at most per window (10 writes each).
    let cap = ctx.pick(10_000, 500);
    let template = ctx.dir.join("steps-template.db");
    let ids = ceiling::baseline_db(&template, levels[levels.len() - 1])?;
    let run_db = ctx.dir.join("steps-run.db");
    let configs: Vec<(Synchronous, usize)> = SYNCS
        .into_iter()
        .flat_map(|sync| levels.into_iter().map(move |c| (sync, c)))
        .collect();
    // Per configuration and work: (rate, writer batch) per repeat.
    let mut samples: Vec<[Vec<(f64, f64)>; 2]> = vec![Default::default(); configs.len()];
    for repeat in 0..ctx.repeats {
        for ((sync, c), out) in configs.iter().zip(samples.iter_mut()) {
            for (k, work) in [Work::Appends, Work::Steps].into_iter().enumerate() {
                db::copy(&template, &run_db)?;
                let sample = actix_rt::System::new().block_on(drive(
                    run_db.clone(),
                    *sync,
                    work,
                    &ids[..*c],
                    window,
                    cap,
                ))?;
                ctx.log(format_args!(
                    "steps repeat {repeat}: {} c={c} {}: {:.0} (writer batch {:.1})",
                    work.unit(),
                    sync.as_pragma(),
                    sample.0,
                    sample.1
                ));
                out[k].push(sample);
            }
        }
    }
    let mut rows = Vec::new();
    let top = levels[levels.len() - 1];
    for ((sync, c), [appends, steps]) in configs.iter().zip(samples) {
        let sync_name = sync.as_pragma();
        let batch = |s: &[(f64, f64)]| median(&s.iter().map(|x| x.1).collect::<Vec<_>>());
        let note = |s: &[(f64, f64)]| {
            format!(
                "turns of {PER_TURN}, fresh store; writer batch (requests per transaction) median {:.1}",
                batch(s)
            )
        };
        let base = Row::new(
            NAME,
            format!("appends/s c={c} {sync_name}"),
            "appends/s",
            appends.iter().map(|x| x.0).collect(),
        )
        .note(note(&appends));
        let mut row = Row::new(
            NAME,
            format!("steps/s c={c} {sync_name}"),
            "steps/s",
            steps.iter().map(|x| x.0).collect(),
        )
        .vs(&base)
        .note(note(&steps));
        if *c == top && *sync == Synchronous::Full {
            let x = row.ratio().unwrap_or(0.0);
            row = row.target(format!(">= 0.5x appends/s (is {x:.2}x)"), x >= 0.5);
        }
        rows.push(base);
        rows.push(row);
    }
    Ok(rows)
}

/// One throughput run in its own actix system: (writes per second, writer batch).
async fn drive(
    path: PathBuf,
    sync: Synchronous,
    work: Work,
    ids: &[SessionId],
    window: Duration,
    cap: usize,
) -> BenchResult<(f64, f64)> {
    let rt = Runtime::builder()
        .database(path)
        .runner(Tenfold {
            work,
            payload: payload(),
        })
        .synchronous(sync)
        .sweep_on_start(false)
        .start()
        .await?;
    let exec = rt.execution();
    // Spawn every actor before the window: interrupting an idle session writes nothing.
    futures::future::try_join_all(ids.iter().map(|id| exec.interrupt(id, None))).await?;
    let before = rt.stats().persistence;
    let (turns, elapsed) = resume_loop(&exec, ids, ids.len(), window, cap).await?;
    let after = rt.stats().persistence;
    rt.shutdown().await;
    let transactions = after
        .transactions
        .saturating_sub(before.transactions)
        .max(1);
    Ok((
        (turns * PER_TURN) as f64 / elapsed,
        after.requests.saturating_sub(before.requests) as f64 / transactions as f64,
    ))
}

/// The µs samples of one latency run.
#[derive(Debug, Default)]
struct Latencies {
    /// Raw single-row commits, one before each step.
    commits: Vec<f64>,
    /// `Turn::step` call → its return.
    steps: Vec<f64>,
    /// `Turn::step` call → its body starts: the intent's commit.
    intents: Vec<f64>,
    /// The body's start → `Turn::step` returns: the outcome's commit.
    outcomes: Vec<f64>,
    /// `Turn::append_message` call → its return, one after each step.
    appends: Vec<f64>,
    /// A bare step ([`BareWriter::step`]) call → its return, one after each append.
    bare: Vec<f64>,
}

/// What the latency drain shares with the harness: the raw connection, the bare writer and
/// the samples.
struct Timed {
    raw: Mutex<Raw>,
    bare: BareWriter,
    payload: Value,
    out: Mutex<Latencies>,
}

/// A write for the bare writer thread and where to answer.
type Job = tokio::sync::oneshot::Sender<rusqlite::Result<()>>;

/// A plain writer thread doing raw event-insert transactions ([`Raw::claim_shaped`]), each
/// answered over a oneshot: what a step's two records cost from a drain without the runtime.
struct BareWriter {
    tx: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl BareWriter {
    /// Starts the thread, committing to `path` with `sync`.
    fn start(path: &Path, sync: Synchronous, ids: &[SessionId]) -> BenchResult<Self> {
        let mut raw = Raw::open(path, sync, ids)?;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("bench-bare-step-writer".into())
            .spawn(move || {
                for answer in rx {
                    let _ = answer.send(raw.claim_shaped());
                }
            })?;
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// One raw event-insert transaction on the writer thread, awaited.
    async fn commit(&self) -> Result<(), RunError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|tx| tx.send(answer).is_ok());
        if !sent {
            return Err(RunError::Other("the bare writer stopped".into()));
        }
        answered
            .await
            .map_err(|_| RunError::Other("the bare writer stopped".into()))?
            .map_err(|e| RunError::Other(e.to_string()))
    }

    /// A bare step: two transactions, one after the other.
    async fn step(&self) -> Result<(), RunError> {
        self.commit().await?;
        self.commit().await
    }

    /// Stops the thread.
    fn stop(&self) {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The latency drain: per step, a raw commit, the step, an append and a bare step, each timed.
#[derive(Clone)]
struct TimedRunner(Arc<Timed>);

impl Runner for TimedRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let state = Arc::clone(&self.0);
        async move {
            let us = |from: Instant| from.elapsed().as_secs_f64() * 1e6;
            for i in 0..PER_TURN {
                // Blocks the actor's arbiter for one commit: nothing else runs on it.
                let t = Instant::now();
                state
                    .raw
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .commit()
                    .map_err(|e| RunError::Other(e.to_string()))?;
                let commit = us(t);
                let body_at = Cell::new(None);
                let value = state.payload.clone();
                let t = Instant::now();
                turn.step(&step_name(i), |_| {
                    body_at.set(Some(Instant::now()));
                    async move { Ok::<_, Infallible>(value) }
                })
                .await?;
                let step = us(t);
                let body_at = body_at
                    .get()
                    .ok_or_else(|| RunError::Other("the step's body did not run".into()))?;
                let intent = body_at.duration_since(t).as_secs_f64() * 1e6;
                let t = Instant::now();
                turn.append_message("assistant", state.payload.clone())
                    .await?;
                let append = us(t);
                let t = Instant::now();
                state.bare.step().await?;
                let bare = us(t);
                let mut out = state.out.lock().unwrap_or_else(PoisonError::into_inner);
                out.commits.push(commit);
                out.steps.push(step);
                out.intents.push(intent);
                out.outcomes.push(step - intent);
                out.appends.push(append);
                out.bare.push(bare);
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// At c = 1: a step's p50 against a commit's, timed in the same drains.
fn latency(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let turns = ctx.pick(40, 4);
    let template = ctx.dir.join("steps-latency-template.db");
    let ids = ceiling::baseline_db(&template, 1)?;
    let path = ctx.dir.join("steps-latency.db");
    // The raw commits go to a copy beside it: another connection writing the same file would
    // invalidate the runtime's page caches.
    let raw_path = ctx.dir.join("steps-latency-raw.db");
    // The bare steps' writer commits to a copy of its own, for the same reason.
    let bare_path = ctx.dir.join("steps-latency-bare.db");
    // Per sync: [commit, step, append, intent, outcome, bare step] p50s, and step p99s, per
    // repeat.
    let mut p50: [[Vec<f64>; 6]; 2] = Default::default();
    let mut p99: [Vec<f64>; 2] = Default::default();
    for repeat in 0..ctx.repeats {
        for (i, sync) in SYNCS.into_iter().enumerate() {
            db::copy(&template, &path)?;
            db::copy(&template, &raw_path)?;
            db::copy(&template, &bare_path)?;
            let s = actix_rt::System::new().block_on(timed_turns(
                &path, &raw_path, &bare_path, sync, &ids[0], turns,
            ))?;
            let all = [
                &s.commits,
                &s.steps,
                &s.appends,
                &s.intents,
                &s.outcomes,
                &s.bare,
            ];
            for (k, samples) in all.into_iter().enumerate() {
                p50[i][k].push(percentile(samples, 50.0));
            }
            p99[i].push(percentile(&s.steps, 99.0));
            ctx.log(format_args!(
                "steps repeat {repeat} {}: commit p50 {:.0} µs, step p50 {:.0} µs \
                 (intent {:.0}, outcome {:.0}), append p50 {:.0} µs, bare step p50 {:.0} µs",
                sync.as_pragma(),
                p50[i][0][repeat],
                p50[i][1][repeat],
                p50[i][3][repeat],
                p50[i][4][repeat],
                p50[i][2][repeat],
                p50[i][5][repeat]
            ));
        }
    }
    let mut rows = Vec::new();
    for ((sync, [c50, s50, a50, i50, o50, b50]), s99) in SYNCS.into_iter().zip(p50).zip(p99) {
        let name = sync.as_pragma();
        let commit = Row::new(NAME, format!("commit p50 c=1 {name}"), "µs", c50);
        let append = Row::new(NAME, format!("append p50 c=1 {name}"), "µs", a50)
            .vs(&commit)
            .note("one append_message after each step: one record, one commit");
        // Judged per repeat against the commits timed beside the steps: the median over
        // repeats of (step p50 − 2 × commit p50).
        let each: Vec<f64> = s50
            .iter()
            .zip(&commit.samples)
            .map(|(s, c)| s - 2.0 * c)
            .collect();
        let over = median(&each);
        let step = Row::new(NAME, format!("step p50 c=1 {name}"), "µs", s50)
            .vs(&commit)
            .target(
                format!("<= 2 commits + 100 µs (is {over:+.0})"),
                over <= 100.0,
            )
            .note("Turn::step call -> return, empty body: the intent's commit, the body, the outcome's commit");
        let step99 = Row::new(NAME, format!("step p99 c=1 {name}"), "µs", s99);
        let intent = Row::new(NAME, format!("step intent p50 c=1 {name}"), "µs", i50)
            .vs(&commit)
            .note("Turn::step call -> its body starts: the intent's commit");
        let outcome = Row::new(NAME, format!("step outcome p50 c=1 {name}"), "µs", o50)
            .vs(&commit)
            .note("the body's start -> Turn::step returns: the outcome's commit");
        let bare = Row::new(NAME, format!("bare step p50 c=1 {name}"), "µs", b50)
            .vs(&commit)
            .note("two raw event-insert transactions (next seq, event, claim row) on a plain writer thread, each reached from the drain as a step reaches the runtime's writer (drain -> writer -> drain, twice), no runtime: the floor of a step under this architecture");
        // The runtime's own share of a step: per repeat, its p50 less the bare step's.
        let share: Vec<f64> = step
            .samples
            .iter()
            .zip(&bare.samples)
            .map(|(s, b)| s - b)
            .collect();
        let share = Row::new(
            NAME,
            format!("step p50 - bare step p50 c=1 {name}"),
            "µs",
            share,
        )
        .note("per repeat: what the runtime adds to a step's two commits and hand-offs");
        rows.extend([commit, step, step99, intent, outcome, append, bare, share]);
    }
    Ok(rows)
}

/// `turns` turns of [`PER_TURN`] timed steps on one session.
async fn timed_turns(
    path: &Path,
    raw_path: &Path,
    bare_path: &Path,
    sync: Synchronous,
    id: &SessionId,
    turns: usize,
) -> BenchResult<Latencies> {
    let ids = std::slice::from_ref(id);
    let state = Arc::new(Timed {
        raw: Mutex::new(Raw::open(raw_path, sync, ids)?),
        bare: BareWriter::start(bare_path, sync, ids)?,
        payload: payload(),
        out: Mutex::default(),
    });
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(TimedRunner(Arc::clone(&state)))
        .synchronous(sync)
        .sweep_on_start(false)
        .start()
        .await?;
    let exec = rt.execution();
    // Warm up: spawn the actor, prepare the writer's statements.
    for _ in 0..2 {
        expect_success(timed(exec.resume(id)).await??)?;
    }
    std::mem::take(&mut *state.out.lock().unwrap_or_else(PoisonError::into_inner));
    for _ in 0..turns {
        expect_success(timed(exec.resume(id)).await??)?;
    }
    rt.shutdown().await;
    state.bare.stop();
    let out = std::mem::take(&mut *state.out.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(out)
}

/// Fails unless the turn succeeded.
fn expect_success(terminal: Terminal) -> BenchResult<()> {
    if terminal == Terminal::Succeeded {
        Ok(())
    } else {
        Err(format!("turn ended {terminal:?}").into())
    }
}

/// What the replay drain notes for the harness.
#[derive(Debug, Default)]
struct ReplayState {
    /// Bodies run by attempts after the first (must stay 0).
    reran: AtomicUsize,
    /// (drain start, last step returned) of each later attempt.
    spans: Mutex<Vec<(Instant, Instant)>>,
}

/// The replay drain: its first attempt records [`REPLAYED`] steps and fails; a later attempt
/// calls them again and notes when it started and when the last one returned.
#[derive(Debug, Clone)]
struct ReplayRunner {
    state: Arc<ReplayState>,
    payload: Value,
}

/// The failure that leaves a turn for `retry` to replay.
const FAIL: &str = "the bench fails the turn so that a retry replays its steps";

impl Runner for ReplayRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let this = self.clone();
        async move {
            let started = Instant::now();
            if turn.attempt() == 1 && turn.steps().is_empty() {
                for i in 0..REPLAYED {
                    empty_step(&turn, i, &this.payload).await?;
                }
                return Err(RunError::Other(FAIL.into()));
            }
            for i in 0..REPLAYED {
                let value = this.payload.clone();
                let state = Arc::clone(&this.state);
                let got: Value = turn
                    .step(&step_name(i), move |_| async move {
                        state.reran.fetch_add(1, Ordering::AcqRel);
                        Ok::<_, Infallible>(value)
                    })
                    .await?;
                if got != this.payload {
                    return Err(RunError::Other(format!("step {i} replayed {got}")));
                }
            }
            let done = Instant::now();
            this.state
                .spans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((started, done));
            Ok(())
        }
        .boxed_local()
    }
}

/// A turn of [`REPLAYED`] completed steps, retried: steps/s of the replay.
fn replay(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let per_repeat = ctx.pick(5, 1);
    let path = ctx.dir.join("steps-replay.db");
    // Per repeat: the median over its turns of (drain start → last step, retry call → last
    // step), as steps/s.
    let mut from_drain = Vec::new();
    let mut from_retry = Vec::new();
    for repeat in 0..ctx.repeats {
        let ids = ceiling::baseline_db(&path, per_repeat)?;
        let (drain, retry) = actix_rt::System::new().block_on(replays(&path, &ids))?;
        let drain = median(&drain);
        let retry = median(&retry);
        ctx.log(format_args!(
            "steps repeat {repeat}: replay of {REPLAYED} steps: {drain:.0} steps/s from the drain's start, {retry:.0} from the retry call"
        ));
        from_drain.push(drain);
        from_retry.push(retry);
    }
    let drain = Row::new(
        NAME,
        format!("replay of {REPLAYED} completed steps, from the drain's start"),
        "steps/s",
        from_drain,
    );
    let over = drain.median();
    let drain = drain
        .target(">= 100,000 steps/s", over >= 100_000.0)
        .note(format!(
            "Sessions::retry of a turn that completed {REPLAYED} steps and failed (NORMAL); the drain's first instant -> its {REPLAYED}th step returned, no body run; median of {per_repeat} turns per repeat"
        ));
    let retry = Row::new(
        NAME,
        format!("replay of {REPLAYED} completed steps, from the retry call"),
        "steps/s",
        from_retry,
    )
    .note(format!(
        "the same, from just before Sessions::retry: the retry's claim commit and reading the turn's {} step events into its ledger included",
        2 * REPLAYED
    ));
    Ok(vec![drain, retry])
}

/// Records and retries one turn per session of `ids`: per turn, steps/s from the drain's start
/// and from the retry call.
async fn replays(path: &Path, ids: &[SessionId]) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let state = Arc::new(ReplayState::default());
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(ReplayRunner {
            state: Arc::clone(&state),
            payload: payload(),
        })
        .synchronous(Synchronous::Normal)
        .sweep_on_start(false)
        .start()
        .await?;
    let sessions = rt.sessions();
    let (mut from_drain, mut from_retry) = (Vec::new(), Vec::new());
    for id in ids {
        match timed(sessions.resume(id)).await?? {
            Terminal::Failed { .. } => {}
            other => return Err(format!("the recording turn ended {other:?}").into()),
        }
        let before = Instant::now();
        expect_success(timed(sessions.retry(id)).await??)?;
        let (start, done) = state
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .ok_or("the retried drain did not replay")?;
        let rate = |from: Instant| REPLAYED as f64 / done.duration_since(from).as_secs_f64();
        from_drain.push(rate(start));
        from_retry.push(rate(before));
    }
    rt.shutdown().await;
    let reran = state.reran.load(Ordering::Acquire);
    if reran > 0 {
        return Err(format!("a retried turn ran {reran} completed steps' bodies again").into());
    }
    Ok((from_drain, from_retry))
}
