//! `stream`: live-only events (`Turn::publish_live`) to `Sessions::stream` subscribers, in
//! process (issue #15).
//!
//! - *Paced*: one session, 100 subscribers, a turn whose drain publishes 1,000 deltas one per
//!   millisecond (a fast model's token rate), each stamped with its publish instant; the
//!   subscribers time publish → receive. A second session's turn, the same but publishing no
//!   delta, is the baseline of what a turn stores: the database's pages (`page_count ×
//!   page_size`, WAL included, read by a separate connection) and the event rows and payload
//!   bytes the two turns added are compared, so the figure is what the deltas store.
//! - *Throughput*: several sessions at once, 100 subscribers each, each drain publishing its
//!   1,000 deltas as fast as its subscribers take them (closed loop: at most [`WINDOW`] deltas
//!   ahead of them, so no stream's buffer overflows); live events delivered per second in
//!   total, from the first `resume` to the last subscriber's end.
//!
//! Subscribers run on the bench's thread, drains on the runtime's arbiters. A subscriber stops
//! at its turn's terminal event, which its stream yields after every live event of the turn.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use durable_sessions::{
    kind, CreateSession, RunError, Runner, Runtime, SessionId, SessionStream, Sessions, StreamItem,
    Terminal, Turn,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use rusqlite::Connection;
use serde_json::json;
use tokio::sync::Notify;

use crate::db;
use crate::report::{median, percentile, Row};
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "stream";

/// Deltas a throughput drain may publish ahead of what its subscribers took (per subscriber,
/// on average): below the runtime's 64-event stream buffer.
const WINDOW: u64 = 16;

/// Nanoseconds since the first call in this process: the publish stamp in each delta.
fn stamp_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How a drain paces its deltas.
#[derive(Debug, Clone, Copy)]
enum Pace {
    /// One delta, then this pause.
    Every(Duration),
    /// As fast as the subscribers take them: at most [`WINDOW`] ahead.
    Window,
}

/// What the drain of one session does, and what its subscribers report back to it.
#[derive(Debug)]
struct Plan {
    deltas: u64,
    pace: Pace,
    subscribers: u64,
    /// Live events received so far by the session's subscribers, all together.
    received: AtomicU64,
    /// The count the drain waits for (`u64::MAX` when it waits for nothing).
    wanted: AtomicU64,
    /// Wakes the drain once `received` reaches `wanted`.
    more: Notify,
}

impl Plan {
    fn new(deltas: u64, pace: Pace, subscribers: u64) -> Arc<Self> {
        Arc::new(Self {
            deltas,
            pace,
            subscribers,
            received: AtomicU64::new(0),
            wanted: AtomicU64::new(u64::MAX),
            more: Notify::new(),
        })
    }

    /// A subscriber received one delta.
    fn took(&self) {
        let total = self.received.fetch_add(1, Ordering::SeqCst) + 1;
        if total >= self.wanted.load(Ordering::SeqCst) {
            self.more.notify_one();
        }
    }

    /// Waits until the subscribers took `need` deltas in all.
    async fn until(&self, need: u64) {
        loop {
            let notified = self.more.notified();
            futures::pin_mut!(notified);
            notified.as_mut().enable();
            self.wanted.store(need, Ordering::SeqCst);
            if self.received.load(Ordering::SeqCst) >= need {
                break;
            }
            notified.await;
        }
        self.wanted.store(u64::MAX, Ordering::SeqCst);
    }
}

/// Each session's plan.
type Plans = Vec<(SessionId, Arc<Plan>)>;

/// The runner: each session's drain publishes what its [`Plan`] says.
#[derive(Debug, Clone, Default)]
struct Deltas {
    plans: Arc<Mutex<Plans>>,
}

impl Deltas {
    fn plan(&self, id: &SessionId, plan: Arc<Plan>) {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.retain(|(s, _)| s != id);
        plans.push((id.clone(), plan));
    }

    fn plan_of(&self, id: &SessionId) -> Option<Arc<Plan>> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.iter().find(|(s, _)| s == id).map(|(_, p)| p.clone())
    }
}

impl Runner for Deltas {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let plan = self.plan_of(turn.session_id());
        async move {
            let Some(plan) = plan else {
                return Ok(());
            };
            for i in 0..plan.deltas {
                match plan.pace {
                    Pace::Every(pause) if i > 0 => actix_rt::time::sleep(pause).await,
                    Pace::Every(_) => {}
                    Pace::Window => {
                        let need = plan.subscribers * i.saturating_sub(WINDOW);
                        if plan.received.load(Ordering::SeqCst) < need {
                            plan.until(need).await;
                        }
                    }
                }
                turn.publish_live("agent.delta", json!({ "i": i, "t": stamp_ns() }))?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// What one subscriber saw.
#[derive(Debug, Default)]
struct Seen {
    /// Publish → receive of each delta, µs.
    latencies: Vec<f64>,
    /// Deltas the stream reports it missed (its buffer was full).
    dropped: u64,
}

/// Follows `stream` until its session's first turn's terminal, timing each delta.
async fn follow(mut stream: SessionStream, plan: Arc<Plan>) -> BenchResult<Seen> {
    let mut seen = Seen::default();
    loop {
        match stream.next().await {
            Some(Ok(StreamItem::Live(event))) => {
                let now = stamp_ns();
                let t = event.data["t"]
                    .as_u64()
                    .ok_or("a delta without its stamp")?;
                seen.latencies.push(now.saturating_sub(t) as f64 / 1e3);
                plan.took();
            }
            Some(Ok(StreamItem::Event(event))) if event.kind == kind::EXECUTION_SUCCEEDED => {
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => return Err("the stream ended before the turn did".into()),
        }
    }
    seen.dropped = stream.live_dropped();
    Ok(seen)
}

/// A subscriber's task.
type Subscriber = actix_rt::task::JoinHandle<BenchResult<Seen>>;

/// Opens `n` streams of `id` (each subscribed when this returns) and follows each in a task.
async fn open(
    sessions: &Sessions,
    id: &SessionId,
    plan: &Arc<Plan>,
    n: u64,
) -> BenchResult<Vec<Subscriber>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let stream = sessions.stream(id, None).await?;
        // One timeout for the whole stream (a timer per item would cost more than the item).
        let follow = timed(follow(stream, plan.clone()));
        tasks.push(actix_rt::spawn(async move { follow.await? }));
    }
    Ok(tasks)
}

/// Waits for every subscriber; their records, or the first failure.
async fn collect(tasks: Vec<Subscriber>) -> BenchResult<Vec<Seen>> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(timed(task).await?.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

/// What the database holds: `page_count × page_size` (WAL included), event rows, their bytes.
fn stored(conn: &Connection) -> BenchResult<[f64; 3]> {
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let (rows, bytes): (i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(type) + LENGTH(data)), 0) FROM event",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok([(pages * size) as f64, rows as f64, bytes as f64])
}

/// One repeat's figures.
#[derive(Debug, Default)]
struct Sample {
    p50_us: f64,
    p99_us: f64,
    paced_dropped: f64,
    /// Database bytes, event rows and event bytes the deltas added (the turn with deltas minus
    /// the turn without).
    added: [f64; 3],
    /// The same three for the turn without deltas.
    baseline: [f64; 3],
    delivered_per_s: f64,
    loaded_p50_us: f64,
    loaded_dropped: f64,
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let deltas: u64 = ctx.pick(1_000, 200);
    let subscribers: u64 = ctx.pick(100, 20);
    let sessions = ctx.pick(8, 2);
    let path = ctx.dir.join("stream.db");
    let mut samples = Vec::new();
    for repeat in 0..ctx.repeats {
        db::remove(&path);
        db::create(&path)?;
        let s = actix_rt::System::new().block_on(measure(&path, deltas, subscribers, sessions))?;
        ctx.log(format_args!(
            "stream repeat {repeat}: paced p50 {:.0} µs p99 {:.0} µs ({} dropped); deltas \
             stored {:?} (turn without: {:?}); {sessions} sessions: {:.0} live events/s \
             delivered (p50 {:.0} µs, {} dropped)",
            s.p50_us,
            s.p99_us,
            s.paced_dropped,
            s.added,
            s.baseline,
            s.delivered_per_s,
            s.loaded_p50_us,
            s.loaded_dropped
        ));
        samples.push(s);
    }
    let col = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let paced = format!("{deltas} deltas 1/ms to {subscribers} subscribers");
    let p50 = Row::new(
        NAME,
        format!("publish->receive p50, {paced}"),
        "µs",
        col(|s| s.p50_us),
    );
    let met = p50.median() <= 1_000.0;
    let p50 = p50.target("<= 1 ms", met).note(format!(
        "live events dropped (stream buffer full), median per repeat: {}",
        median(&col(|s| s.paced_dropped))
    ));
    let p99 = Row::new(
        NAME,
        format!("publish->receive p99, {paced}"),
        "µs",
        col(|s| s.p99_us),
    );
    let base_db = Row::new(
        NAME,
        "database bytes added by a turn without deltas",
        "bytes",
        col(|s| s.baseline[0]),
    )
    .note(format!(
        "its event rows: {}, their bytes: {}",
        median(&col(|s| s.baseline[1])),
        median(&col(|s| s.baseline[2]))
    ));
    let added = Row::new(
        NAME,
        format!("database bytes added by {deltas} live deltas"),
        "bytes",
        col(|s| s.added[0]),
    );
    let rows_added = col(|s| s.added[1]);
    let bytes_added = col(|s| s.added[2]);
    let met = samples.iter().all(|s| s.added.iter().all(|v| *v == 0.0));
    let added = added
        .target("0 (pages, event rows and bytes)", met)
        .note(format!(
        "event rows added by the deltas per repeat {rows_added:?}, their bytes {bytes_added:?}; \
         pages from page_count x page_size on a separate connection"
    ));
    let load = format!("{sessions} sessions x {subscribers} subscribers x {deltas} deltas");
    let rate = Row::new(
        NAME,
        format!("live events delivered, {load}"),
        "events/s",
        col(|s| s.delivered_per_s),
    );
    let met = rate.median() >= 1_000_000.0;
    let rate = rate.target(">= 1,000,000/s", met).note(format!(
        "closed loop: each drain at most {WINDOW} deltas ahead of its subscribers; dropped \
         (median per repeat): {}",
        median(&col(|s| s.loaded_dropped))
    ));
    let loaded = Row::new(
        NAME,
        format!("publish->receive p50 at full rate, {load}"),
        "µs",
        col(|s| s.loaded_p50_us),
    );
    Ok(vec![p50, p99, added, base_db, rate, loaded])
}

async fn create(sessions: &Sessions, n: usize) -> BenchResult<Vec<SessionId>> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let created = sessions
            .create(CreateSession {
                directory: "/bench".into(),
                ..CreateSession::default()
            })
            .await?;
        ids.push(created.id.clone());
    }
    Ok(ids)
}

/// One repeat on a fresh database: the paced turn with its baseline, then the throughput run.
async fn measure(
    path: &Path,
    deltas: u64,
    subscribers: u64,
    parallel: usize,
) -> BenchResult<Sample> {
    let runner = Deltas::default();
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(runner.clone())
        .sweep_on_start(false)
        .start()
        .await?;
    let (sessions, exec) = (rt.sessions(), rt.execution());
    let reader = db::open(path, durable_sessions::Synchronous::Normal)?;
    let mut sample = Sample::default();

    // Paced: a turn without deltas (baseline), then one with.
    let ids = create(&sessions, 2).await?;
    let every = Pace::Every(Duration::from_millis(1));
    let mut growth = Vec::new();
    let mut seen = Vec::new();
    for (id, n) in ids.iter().zip([0, deltas]) {
        let plan = Plan::new(n, every, subscribers);
        runner.plan(id, plan.clone());
        let tasks = open(&sessions, id, &plan, subscribers).await?;
        let before = stored(&reader)?;
        let terminal = timed(exec.resume(id)).await??;
        if terminal != Terminal::Succeeded {
            return Err(format!("turn ended {terminal:?}").into());
        }
        let after = stored(&reader)?;
        growth.push([0, 1, 2].map(|k| after[k] - before[k]));
        seen = collect(tasks).await?;
    }
    let lat: Vec<f64> = seen.iter().flat_map(|s| s.latencies.clone()).collect();
    sample.p50_us = percentile(&lat, 50.0);
    sample.p99_us = percentile(&lat, 99.0);
    sample.paced_dropped = seen.iter().map(|s| s.dropped as f64).sum();
    sample.baseline = growth[0];
    sample.added = [0, 1, 2].map(|k| growth[1][k] - growth[0][k]);

    // Throughput: every session's turn at once.
    let ids = create(&sessions, parallel).await?;
    let mut tasks = Vec::new();
    for id in &ids {
        let plan = Plan::new(deltas, Pace::Window, subscribers);
        runner.plan(id, plan.clone());
        tasks.extend(open(&sessions, id, &plan, subscribers).await?);
    }
    let started = Instant::now();
    let turns = futures::future::try_join_all(ids.iter().map(|id| exec.resume(id)));
    for terminal in timed(turns).await?? {
        if terminal != Terminal::Succeeded {
            return Err(format!("turn ended {terminal:?}").into());
        }
    }
    let seen = collect(tasks).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let received: usize = seen.iter().map(|s| s.latencies.len()).sum();
    sample.delivered_per_s = received as f64 / elapsed;
    let lat: Vec<f64> = seen.iter().flat_map(|s| s.latencies.clone()).collect();
    sample.loaded_p50_us = percentile(&lat, 50.0);
    sample.loaded_dropped = seen.iter().map(|s| s.dropped as f64).sum();
    rt.shutdown().await;
    Ok(sample)
}
