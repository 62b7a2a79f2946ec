//! `growth`: what the store's size costs (issue #15). The same workload on databases of 1,000,
//! 100,000 and 1,000,000 sessions, measured in steady state, and a turn over a long transcript.
//!
//! Per size `N`: `N` top-level sessions are seeded in bulk (as `Sessions::create` stores them,
//! see `db::seed_sessions`); 1,000 of them, spread evenly over the table (every `N / 1,000`-th,
//! so at 1,000,000 each sits on its own pages, as live sessions do in an old store), are the
//! *active* ones. Each active session is given 100 turns of history through the runtime
//! (1,000 tasks, one per session, each resuming its session 100 times: 100,000 turns whose rows
//! are exactly what the runtime writes), and only then is anything measured, on that same
//! file:
//!
//! - turns/s at c=1,000 FULL with group commit (the `turns` workload: `turns::measure`);
//! - wake → drain start p50 of one active session (sequential wakes, the drain stamps its
//!   start);
//! - the restart sweep with no orphans (`resume_suspended_sessions`: the first call on each of
//!   5 runtimes started one after the other, and the median of the calls after it);
//! - `Sessions::list`: the first page of 100 (newest first; all and top-level), a search that
//!   matches nothing, a search every title matches, and a two-character search;
//! - `Sessions::create`, one at a time (p50, p99): what indexing the title costs;
//! - bytes on disk per session (after seeding) and per turn (the history's growth);
//! - the WAL frames one group commit of 500 claims (and of 500 releases) appends, by rusqlite
//!   on the file after the measurements (with 4,096 recent event entries, the average between
//!   two settles), with the frames of each statement alone, and of the settle after them:
//!   which B-trees a commit dirties, and how that grows with the store.
//!
//! On the smallest database, a runner that reads its context incrementally
//! (`Turn::context_after` from the last message it saw, then `Turn::append_message`): its whole
//! turn p50 on a session with a 10,000-message transcript, against a session with an empty one,
//! alternating.
//!
//! The databases are built once per run (the largest takes most of the scenario's time) and
//! deleted after their size is measured. `--quick`: 100, 1,000 and 10,000 sessions, 100
//! active, 10 turns of history, a 1,000-message transcript.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_sessions::{
    CreateSession, ListQuery, ParentFilter, RunError, Runner, Runtime, SessionId, Synchronous,
    Terminal, Turn,
};
use futures::channel::mpsc;
use futures::future::LocalBoxFuture;
use futures::{FutureExt, StreamExt};
use rusqlite::{params, Connection, TransactionBehavior};
use serde_json::json;

use crate::db;
use crate::report::{median, percentile, Row};
use crate::turns::{self, Config};
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "growth";

/// Sessions touched by one profiled group commit (about what the writer batches at c=1,000).
const PROFILE_BATCH: usize = 500;

/// A search no seeded title matches (every title is `bench session <i>`).
const NO_MATCH: &str = "no such title";

/// What one database size measured, per repeat.
#[derive(Debug, Default)]
struct Size {
    sessions: usize,
    seed_s: f64,
    history_s: f64,
    history_turns: usize,
    bytes_per_session: f64,
    bytes_per_turn: f64,
    turns: Vec<f64>,
    batch: Vec<f64>,
    wake: Vec<f64>,
    sweep_first: Vec<f64>,
    sweep_warm: Vec<f64>,
    list: Vec<f64>,
    list_top: Vec<f64>,
    search_none: Vec<f64>,
    search_all: Vec<f64>,
    search_short: Vec<f64>,
    create50: Vec<f64>,
    create99: Vec<f64>,
    /// WAL frames per commit: claims, releases, then each statement alone (next seq read,
    /// event insert, claim row upsert), then the settle of the recent entries.
    frames: [f64; 6],
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let sizes: Vec<usize> = match std::env::var("DS_BENCH_GROWTH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse())
            .collect::<Result<_, _>>()?,
        Err(_) => ctx.pick(vec![1_000, 100_000, 1_000_000], vec![100, 1_000, 10_000]),
    };
    let keep = std::env::var_os("DS_BENCH_GROWTH_KEEP").map(std::path::PathBuf::from);
    let active = sizes[0];
    let history = ctx.pick(100, 10);
    let window = ctx.pick(Duration::from_secs(3), Duration::from_millis(150));
    let cap = ctx.pick(20_000, 2_000);
    let transcript = ctx.pick(10_000, 1_000);
    let probes = Probes {
        wakes: ctx.pick(200, 30),
        reads: ctx.pick(20, 5),
        starts: ctx.pick(5, 2),
        creates: ctx.pick(200, 20),
    };
    let mut figures = Vec::new();
    let mut context: Option<[Vec<f64>; 2]> = None;
    let mut fresh_frames: Option<(usize, [f64; 6])> = None;
    let mut fresh_turns = Vec::new();
    for n in sizes.iter().copied() {
        let path = ctx.dir.join(format!("growth-{n}.db"));
        let mut size = Size {
            sessions: n,
            ..Size::default()
        };
        db::remove(&path);
        db::create(&path)?;
        let empty = db::used_bytes(&path)?;
        let t = Instant::now();
        let ids = db::seed_sessions(&path, n, 0)?;
        size.seed_s = t.elapsed().as_secs_f64();
        let seeded = db::used_bytes(&path)?;
        size.bytes_per_session = (seeded - empty) / n as f64;
        let ids: Vec<SessionId> = ids.into_iter().step_by(n / active).take(active).collect();
        let batch = &ids[..PROFILE_BATCH.min(ids.len())];
        let config = Config {
            sync: Synchronous::Full,
            group: true,
            concurrency: active,
        };
        if fresh_frames.is_none() {
            // On copies of the smallest database before any history: the same turns (the
            // `turns` scenario's fresh figure, in this run) and the same WAL profile.
            let copy = ctx.dir.join("growth-fresh.db");
            for _ in 0..ctx.repeats {
                db::copy(&path, &copy)?;
                fresh_turns.push(turns::measure(&copy, config, &ids, window, cap)?.turns_per_s);
            }
            db::copy(&path, &copy)?;
            fresh_frames = Some((n, wal_frames(&copy, batch)?));
            db::remove(&copy);
            ctx.log(format_args!(
                "growth {n} fresh: {:?} turns/s; WAL frames per commit of {} claims {:?}",
                fresh_turns,
                batch.len(),
                fresh_frames.map(|f| f.1)
            ));
        }
        let t = Instant::now();
        size.history_turns = build_history(&path, &ids, history)?;
        size.history_s = t.elapsed().as_secs_f64();
        size.bytes_per_turn = (db::used_bytes(&path)? - seeded) / size.history_turns as f64;
        ctx.log(format_args!(
            "growth {n}: seeded in {:.1} s ({:.0} bytes/session), {} turns of history in \
             {:.1} s ({:.0} bytes/turn)",
            size.seed_s,
            size.bytes_per_session,
            size.history_turns,
            size.history_s,
            size.bytes_per_turn
        ));
        if let Some(dir) = &keep {
            let kept = dir.join(format!("growth-{n}.db"));
            db::copy(&path, &kept)?;
            ctx.log(format_args!(
                "growth {n}: kept the steady database as {}",
                kept.display()
            ));
        }
        for repeat in 0..ctx.repeats {
            let s = turns::measure(&path, config, &ids, window, cap)?;
            size.turns.push(s.turns_per_s);
            size.batch.push(s.batch);
            let r = actix_rt::System::new().block_on(reads(&path, &ids, probes))?;
            ctx.log(format_args!(
                "growth {n} repeat {repeat}: {:.0} turns/s (batch {:.0}); wake->drain p50 \
                 {:.0} µs; sweep {:.2} ms (warm {:.2}); list {:.2} ms, top-level {:.2} ms; \
                 search none {:.2} ms, all {:.2} ms, short {:.2} ms; create p50 {:.0} µs, p99 \
                 {:.0} µs",
                s.turns_per_s,
                s.batch,
                r.wake,
                r.sweep_first,
                r.sweep_warm,
                r.list,
                r.list_top,
                r.search_none,
                r.search_all,
                r.search_short,
                r.create[0],
                r.create[1]
            ));
            size.wake.push(r.wake);
            size.sweep_first.push(r.sweep_first);
            size.sweep_warm.push(r.sweep_warm);
            size.list.push(r.list);
            size.list_top.push(r.list_top);
            size.search_none.push(r.search_none);
            size.search_all.push(r.search_all);
            size.search_short.push(r.search_short);
            size.create50.push(r.create[0]);
            size.create99.push(r.create[1]);
        }
        if context.is_none() {
            let c = actix_rt::System::new().block_on(long_transcript(
                &path,
                transcript,
                probes.wakes,
                ctx.repeats,
            ))?;
            ctx.log(format_args!(
                "growth: context_after turn p50 {:?} µs with {transcript} messages, {:?} µs \
                 with none",
                c[0], c[1]
            ));
            context = Some(c);
        }
        size.frames = wal_frames(&path, batch)?;
        ctx.log(format_args!(
            "growth {n}: WAL frames per commit of {} claims {}, releases {}; alone: next seq \
             {}, event {}, claim {}; settle {}",
            PROFILE_BATCH.min(ids.len()),
            size.frames[0],
            size.frames[1],
            size.frames[2],
            size.frames[3],
            size.frames[4],
            size.frames[5]
        ));
        db::remove(&path);
        figures.push(size);
    }
    let [long, short] = context.unwrap_or_default();
    let mut rows = rows(&figures, fresh_turns, long, short, transcript, active);
    if let Some((n, frames)) = fresh_frames {
        rows.push(frames_row(
            format!("at {n} sessions, fresh (before any history)"),
            PROFILE_BATCH.min(active),
            frames,
        ));
    }
    Ok(rows)
}

/// The table's rows, with the targets judged on the smallest and the largest database.
fn rows(
    figures: &[Size],
    fresh: Vec<f64>,
    long: Vec<f64>,
    short: Vec<f64>,
    transcript: usize,
    c: usize,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let (first, last) = (&figures[0], &figures[figures.len() - 1]);
    let at = |s: &Size| format!("at {} sessions", s.sessions);
    let fresh = Row::new(
        NAME,
        format!("fresh turns/s c={c} FULL group {}", at(first)),
        "turns/s",
        fresh,
    )
    .note("the same turns on a copy of the database before its history (as the turns scenario)");
    let smallest_turns = Row::new(
        NAME,
        format!("steady turns/s c={c} FULL group {}", at(first)),
        "turns/s",
        first.turns.clone(),
    );
    rows.push(fresh.clone());
    for s in figures {
        let mut row = Row::new(
            NAME,
            format!("steady turns/s c={c} FULL group {}", at(s)),
            "turns/s",
            s.turns.clone(),
        )
        .note(format!(
            "writer batch median {:.0}; history: {} turns in {:.1} s ({:.0}/s); seeding {:.1} s",
            median(&s.batch),
            s.history_turns,
            s.history_s,
            s.history_turns as f64 / s.history_s,
            s.seed_s
        ));
        if std::ptr::eq(s, first) {
            let met = row.median() >= 25_000.0;
            row = row.vs(&fresh).target(">= 25,000/s", met);
        } else {
            row = row.vs(&smallest_turns);
            if std::ptr::eq(s, last) {
                let met = row.ratio().unwrap_or(0.0) >= 0.8;
                row = row.target(format!(">= 0.8x {}", at(first)), met);
            }
        }
        rows.push(row);
    }
    let smallest_wake = Row::new(
        NAME,
        format!("wake->drain-start p50 {}", at(first)),
        "µs",
        first.wake.clone(),
    );
    for s in figures {
        let mut row = Row::new(
            NAME,
            format!("wake->drain-start p50 {}", at(s)),
            "µs",
            s.wake.clone(),
        );
        if !std::ptr::eq(s, first) {
            row = row.vs(&smallest_wake);
        }
        if std::ptr::eq(s, last) {
            let met = row.ratio().unwrap_or(f64::INFINITY) <= 1.2;
            row = row.target(format!("<= 1.2x {}", at(first)), met);
        }
        rows.push(row);
    }
    type Pick = fn(&Size) -> &Vec<f64>;
    let reads: [(&str, Pick, Option<f64>); 7] = [
        (
            "restart sweep, no orphans (first after start)",
            |s| &s.sweep_first,
            Some(5.0),
        ),
        ("restart sweep, no orphans (warm)", |s| &s.sweep_warm, None),
        ("list first page of 100", |s| &s.list, Some(2.0)),
        ("list first page of 100, top-level", |s| &s.list_top, None),
        (
            "list search matching nothing",
            |s| &s.search_none,
            Some(10.0),
        ),
        ("list search matching every title", |s| &s.search_all, None),
        (
            "list search of 2 characters (LIKE scan)",
            |s| &s.search_short,
            None,
        ),
    ];
    for (what, pick, limit) in reads {
        for s in figures {
            let mut row = Row::new(NAME, format!("{what} {}", at(s)), "ms", pick(s).clone());
            if let (Some(limit), true) = (limit, std::ptr::eq(s, last)) {
                let met = row.median() <= limit;
                row = row.target(format!("<= {limit} ms"), met);
            }
            rows.push(row);
        }
    }
    for s in figures {
        rows.push(Row::new(
            NAME,
            format!("Sessions::create p50, one at a time, {}", at(s)),
            "µs",
            s.create50.clone(),
        ));
        rows.push(
            Row::new(
                NAME,
                format!("Sessions::create p99, one at a time, {}", at(s)),
                "µs",
                s.create99.clone(),
            )
            .note("each create also adds its title to the title index (FTS5 segments, merged 16 at a time)"),
        );
    }
    let empty = Row::new(
        NAME,
        "context_after turn p50, empty transcript",
        "µs",
        short,
    );
    let long = Row::new(
        NAME,
        format!("context_after turn p50, {transcript}-message transcript"),
        "µs",
        long,
    )
    .vs(&empty)
    .note("whole turn (resume -> return): context_after(last seen) + append_message");
    let met = long.ratio().unwrap_or(f64::INFINITY) <= 1.2;
    rows.push(long.target("<= 1.2x empty transcript", met));
    rows.push(empty);
    for s in figures {
        rows.push(Row::new(
            NAME,
            format!("bytes on disk per session {}", at(s)),
            "bytes",
            vec![s.bytes_per_session],
        ));
        rows.push(
            Row::new(
                NAME,
                format!("bytes on disk per turn {}", at(s)),
                "bytes",
                vec![s.bytes_per_turn],
            )
            .note("empty-drain turn: execution.started + execution.succeeded"),
        );
    }
    for s in figures {
        rows.push(frames_row(at(s), PROFILE_BATCH.min(c), s.frames));
    }
    rows
}

/// The row of a WAL profile (see [`wal_frames`]).
fn frames_row(at: String, batch: usize, frames: [f64; 6]) -> Row {
    Row::new(
        NAME,
        format!("WAL frames per commit of {batch} claims {at}"),
        "frames",
        vec![frames[0]],
    )
    .note(format!(
        "{batch} releases: {}; each statement alone over the same {batch} sessions: next seq \
         read {}, event insert {}, claim row upsert {}; the settle after them: {} (4 KiB \
         pages; 4,096 recent entries before the commits)",
        frames[1], frames[2], frames[3], frames[4], frames[5]
    ))
}

/// Gives each of `ids` `turns` empty-drain turns through the runtime, one task per session;
/// returns how many ran.
fn build_history(path: &Path, ids: &[SessionId], turns: usize) -> BenchResult<usize> {
    let path = path.to_path_buf();
    actix_rt::System::new().block_on(async move {
        let rt = Runtime::builder()
            .database(path)
            .runner(crate::runners::Empty)
            .sweep_on_start(false)
            .start()
            .await?;
        let exec = rt.execution();
        let tasks = ids.iter().map(|id| {
            let exec = &exec;
            async move {
                for _ in 0..turns {
                    let terminal = timed(exec.resume(id)).await??;
                    if terminal != Terminal::Succeeded {
                        return Err(format!("turn ended {terminal:?}").into());
                    }
                }
                BenchResult::Ok(turns)
            }
        });
        let done: usize = futures::future::try_join_all(tasks)
            .await?
            .into_iter()
            .sum();
        rt.shutdown().await;
        Ok(done)
    })
}

/// In a child (for profiling by hand): the steady turns of `growth` on a database it kept
/// (`DS_BENCH_GROWTH_KEEP=<dir>`): `{"db": <path>, "active": 1000, "window_ms": 3000, "cap":
/// 20000}`; the active sessions are every `sessions / active`-th in insertion order, as
/// seeded.
pub fn turns_child(args: &serde_json::Value) -> BenchResult<serde_json::Value> {
    let path = std::path::PathBuf::from(args["db"].as_str().ok_or("no db")?);
    let active = usize::try_from(args["active"].as_u64().unwrap_or(1_000))?;
    let window = Duration::from_millis(args["window_ms"].as_u64().unwrap_or(3_000));
    let cap = usize::try_from(args["cap"].as_u64().unwrap_or(20_000))?;
    let ids: Vec<SessionId> = {
        let conn = db::open(&path, Synchronous::Full)?;
        let mut stmt = conn.prepare("SELECT id FROM session ORDER BY rowid")?;
        let all = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let step = (all.len() / active).max(1);
        all.into_iter()
            .step_by(step)
            .take(active)
            .map(SessionId::new)
            .collect::<Result<_, _>>()?
    };
    let config = Config {
        sync: Synchronous::Full,
        group: true,
        concurrency: ids.len(),
    };
    let s = turns::measure(&path, config, &ids, window, cap)?;
    Ok(json!({ "turns_per_s": s.turns_per_s, "batch": s.batch }))
}

/// How many probes of each kind one repeat runs.
#[derive(Debug, Clone, Copy)]
struct Probes {
    wakes: usize,
    reads: usize,
    /// Runtimes started (one after the other) to time the sweep a start runs.
    starts: usize,
    /// Sessions created one at a time.
    creates: usize,
}

/// One repeat's reads and wake latency (ms, except `wake` in µs).
#[derive(Debug, Default)]
struct Reads {
    wake: f64,
    sweep_first: f64,
    sweep_warm: f64,
    list: f64,
    list_top: f64,
    search_none: f64,
    search_all: f64,
    search_short: f64,
    /// `Sessions::create` p50 and p99, µs.
    create: [f64; 2],
}

/// The drains of the reads' runtime: every drain sends the instant it started; a session with
/// a cursor reads its context after it and appends a reply; a session with a fill appends that
/// many messages at once.
#[derive(Debug, Clone)]
struct Mixed {
    starts: mpsc::UnboundedSender<Instant>,
    cursors: Arc<Mutex<HashMap<SessionId, Option<u64>>>>,
    fills: Arc<Mutex<HashMap<SessionId, usize>>>,
}

impl Mixed {
    fn new() -> (Self, mpsc::UnboundedReceiver<Instant>) {
        let (starts, rx) = mpsc::unbounded();
        let runner = Self {
            starts,
            cursors: Arc::default(),
            fills: Arc::default(),
        };
        (runner, rx)
    }
}

impl Runner for Mixed {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let _ = self.starts.unbounded_send(Instant::now());
        let id = turn.session_id().clone();
        let fill = self
            .fills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        let cursors = self.cursors.clone();
        async move {
            if let Some(n) = fill {
                let appends = (0..n).map(|i| {
                    let text = format!("message {i}: the quick brown fox jumps over the lazy dog");
                    turn.append_message("user", json!({ "text": text }))
                });
                futures::future::try_join_all(appends).await?;
                return Ok(());
            }
            let cursor = cursors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .copied();
            if let Some(after) = cursor {
                let new = turn.context_after(after).await?;
                let seen = new.iter().map(|m| m.seq).max().or(after);
                turn.append_message("assistant", json!({ "text": "ok", "read": new.len() }))
                    .await?;
                cursors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id, seen);
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// Milliseconds `f` took.
async fn ms<T>(f: impl std::future::Future<Output = T>) -> (T, f64) {
    let t = Instant::now();
    let out = f.await;
    (out, t.elapsed().as_secs_f64() * 1e3)
}

/// One repeat of the reads on a runtime just started on `path`.
async fn reads(path: &Path, ids: &[SessionId], probes: Probes) -> BenchResult<Reads> {
    let mut r = Reads::default();
    // The sweep a start runs: the first call on runtimes started one after the other.
    let mut first = Vec::new();
    for _ in 0..probes.starts {
        let rt = Runtime::builder()
            .database(path.to_path_buf())
            .runner(crate::runners::Empty)
            .sweep_on_start(false)
            .start()
            .await?;
        let (report, t) = ms(rt.resume_suspended_sessions()).await;
        if !report?.resumed.is_empty() {
            return Err("the sweep found orphans".into());
        }
        first.push(t);
        rt.shutdown().await;
    }
    r.sweep_first = median(&first);
    let (runner, mut starts) = Mixed::new();
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(runner)
        .sweep_on_start(false)
        .start()
        .await?;
    // Later sweeps of one runtime.
    let mut warm = Vec::new();
    for _ in 0..probes.reads {
        let (report, t) = ms(rt.resume_suspended_sessions()).await;
        report?;
        warm.push(t);
    }
    r.sweep_warm = median(&warm);
    let sessions = rt.sessions();
    let page = |parent, search: Option<&str>| ListQuery {
        parent,
        search: search.map(String::from),
        limit: Some(100),
        ..ListQuery::default()
    };
    // Each query with how many calls, and how many sessions it must find.
    let queries = [
        (page(ParentFilter::Any, None), probes.reads, 100),
        (page(ParentFilter::TopLevel, None), probes.reads, 100),
        (page(ParentFilter::Any, Some(NO_MATCH)), probes.reads, 0),
        (page(ParentFilter::Any, Some("session")), probes.reads, 100),
        (page(ParentFilter::Any, Some("zq")), 3, 0),
    ];
    let mut times = Vec::new();
    for (query, n, expect) in queries {
        let mut each = Vec::new();
        for _ in 0..n {
            let (found, t) = ms(sessions.list(query.clone())).await;
            let found = found?.len();
            if found != expect {
                return Err(format!("{query:?} found {found}, expected {expect}").into());
            }
            each.push(t);
        }
        times.push(median(&each));
    }
    [
        r.list,
        r.list_top,
        r.search_none,
        r.search_all,
        r.search_short,
    ] = [times[0], times[1], times[2], times[3], times[4]];
    // Wake -> drain start of one active session (its actor spawned by a first turn).
    let exec = rt.execution();
    let id = &ids[ids.len() / 2];
    timed(exec.resume(id)).await??;
    while starts.try_recv().is_ok() {}
    let mut wakes = Vec::with_capacity(probes.wakes);
    for _ in 0..probes.wakes {
        let before = Instant::now();
        exec.wake(id, None).await?;
        let start = timed(starts.next()).await?.ok_or("the runner stopped")?;
        timed(exec.await_idle(id)).await??;
        wakes.push(start.duration_since(before).as_secs_f64() * 1e6);
    }
    r.wake = percentile(&wakes, 50.0);
    // Sessions created one at a time (each adds its title to the title index).
    let mut creates = Vec::with_capacity(probes.creates);
    for _ in 0..probes.creates {
        let (created, t) = ms(sessions.create(CreateSession {
            directory: "/bench".into(),
            ..CreateSession::default()
        }))
        .await;
        created?;
        creates.push(t * 1e3);
    }
    r.create = [percentile(&creates, 50.0), percentile(&creates, 99.0)];
    rt.shutdown().await;
    Ok(r)
}

/// Whole-turn p50 (µs) per repeat of the incremental-context runner on a session with a
/// `messages`-long transcript and on one with none, alternating `n` turns of each per repeat.
async fn long_transcript(
    path: &Path,
    messages: usize,
    n: usize,
    repeats: usize,
) -> BenchResult<[Vec<f64>; 2]> {
    let (runner, _starts) = Mixed::new();
    let (cursors, fills) = (runner.cursors.clone(), runner.fills.clone());
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(runner)
        .sweep_on_start(false)
        .start()
        .await?;
    let (sessions, exec) = (rt.sessions(), rt.execution());
    let mut ids = Vec::new();
    for _ in 0..2 {
        let created = sessions
            .create(CreateSession {
                directory: "/bench".into(),
                ..CreateSession::default()
            })
            .await?;
        ids.push(created.id.clone());
    }
    fills
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ids[0].clone(), messages);
    timed(exec.resume(&ids[0])).await??;
    let stored = sessions.context(&ids[0]).await?.len();
    if stored != messages {
        return Err(format!("the transcript holds {stored} messages, not {messages}").into());
    }
    for id in &ids {
        cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), None);
        // The first drain reads the whole transcript; the measured ones what is new.
        timed(exec.resume(id)).await??;
    }
    let mut out = [Vec::new(), Vec::new()];
    for _ in 0..repeats {
        let mut each = [Vec::new(), Vec::new()];
        for _ in 0..n {
            for (k, id) in ids.iter().enumerate() {
                let t = Instant::now();
                let terminal = timed(exec.resume(id)).await??;
                if terminal != Terminal::Succeeded {
                    return Err(format!("turn ended {terminal:?}").into());
                }
                each[k].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        for k in 0..2 {
            out[k].push(percentile(&each[k], 50.0));
        }
    }
    rt.shutdown().await;
    Ok(out)
}

/// WAL frames one commit appends, by rusqlite on the closed database at `path`, for the
/// sessions `ids`: each one's claim as the runtime writes it (next seq read,
/// `session.execution.started`, claim row upsert), then each one's release (the same with the
/// terminal and the claim row's deletion), then each statement alone. The WAL is checkpointed
/// (PASSIVE, no reader) after each commit, so the next commit starts it over.
///
/// The runtime settled the log when it stopped; the commits are measured with the recent
/// entries at their average between two settles (half of the 8,192 the writer settles at:
/// 4,096 events spread over `ids`, written first and not counted). The last figure is the
/// frames of the settle that then moves every recent entry to the history.
fn wal_frames(path: &Path, ids: &[SessionId]) -> BenchResult<[f64; 6]> {
    let mut conn = db::open(path, Synchronous::Full)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")?;
    const SEQ: &str = db::NEXT_SEQ;
    const EVENT: &str = db::INSERT_EVENT;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for id in ids.iter().cycle().take(4096) {
        let next: i64 = tx
            .prepare_cached(SEQ)?
            .query_row([id.as_str()], |r| r.get(0))?;
        tx.prepare_cached(EVENT)?.execute(params![
            id.as_str(),
            next,
            "session.synthetic",
            "{}",
            db::now_ms()
        ])?;
    }
    tx.commit()?;
    checkpointed_frames(&conn)?;
    const CLAIM: &str = "INSERT INTO session_claim (session_id, time_suspended, claim_seq, \
         claim_boot) SELECT id, ?2, ?4, ?3 FROM session WHERE id = ?1 \
         ON CONFLICT (session_id) DO UPDATE SET \
           time_suspended = COALESCE(time_suspended, excluded.time_suspended), \
           claim_seq = CASE WHEN time_suspended IS NULL THEN excluded.claim_seq \
                            ELSE COALESCE(claim_seq, excluded.claim_seq) END, \
           claim_boot = excluded.claim_boot";
    const RELEASE: &str = "DELETE FROM session_claim WHERE session_id = ?1 AND ?2 IS NOT NULL";
    // Which statements each commit runs: next seq, event (with its type), projection.
    type Shape = (bool, Option<&'static str>, Option<&'static str>);
    let shapes: [Shape; 5] = [
        (true, Some("session.execution.started"), Some(CLAIM)),
        (true, Some("session.execution.succeeded"), Some(RELEASE)),
        (true, None, None),
        (false, Some("session.synthetic"), None),
        (false, None, Some(CLAIM)),
    ];
    let mut frames = [0.0; 6];
    for (k, (seq, event, projection)) in shapes.into_iter().enumerate() {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for id in ids {
            let now = db::now_ms();
            let next: i64 = if seq {
                tx.prepare_cached(SEQ)?
                    .query_row([id.as_str()], |r| r.get(0))?
            } else {
                tx.prepare_cached(SEQ)?
                    .query_row([id.as_str()], |r| r.get::<_, i64>(0))?
                    + 1_000_000
            };
            if let Some(kind) = event {
                tx.prepare_cached(EVENT)?.execute(params![
                    id.as_str(),
                    next,
                    kind,
                    r#"{"boot":"0199a0b1c2d3e4f5a6b7c8d9e0f1a2b3"}"#,
                    now
                ])?;
            }
            match projection {
                Some(CLAIM) => {
                    tx.prepare_cached(CLAIM)?.execute(params![
                        id.as_str(),
                        now,
                        "profile",
                        next
                    ])?;
                }
                Some(sql) => {
                    tx.prepare_cached(sql)?.execute(params![id.as_str(), now])?;
                }
                None => {}
            }
        }
        tx.commit()?;
        frames[k] = checkpointed_frames(&conn)?;
    }
    conn.execute_batch(
        "BEGIN IMMEDIATE; \
         UPDATE event INDEXED BY event_recent SET recent = 0 WHERE recent = 1; COMMIT",
    )?;
    frames[5] = checkpointed_frames(&conn)?;
    Ok(frames)
}

/// Checkpoints the WAL and returns how many frames it held, then empties it (`TRUNCATE`), so
/// that a commit that writes nothing counts 0 frames instead of the frames of the one before.
fn checkpointed_frames(conn: &Connection) -> BenchResult<f64> {
    let (busy, log): (i64, i64) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    if busy != 0 {
        return Err("the WAL checkpoint was blocked".into());
    }
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")?;
    Ok(log as f64)
}
