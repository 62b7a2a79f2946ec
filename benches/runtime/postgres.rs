//! `postgres` (feature `testing-postgres`, issue #13): the runtime on PostgreSQL, against a throwaway
//! local cluster with the stock settings (`fsync` and `synchronous_commit` on), a fresh
//! database for every measurement. Per repeat:
//!
//! - baseline: raw commits by a plain `postgres` client on the same cluster, `BEGIN; INSERT;
//!   COMMIT` (what the "2 commits + 300 µs" target counts as a commit) and a single
//!   autocommitted `INSERT`, and one round trip (`SELECT 1`), the unit the writer pays per
//!   statement;
//! - turns/s at c = 1,000 over 1,000 sessions on one node (the runtime in this process, empty
//!   drains, `resume` in a loop as in `turns`);
//! - the same on three nodes together: three child processes, a third of the sessions and of
//!   the concurrency each, started together once all three are ready; total turns / the
//!   longest window;
//! - wake → drain-start and whole-turn p50/p99 of one session on one node, with raw commits
//!   timed between the turns;
//! - takeover: a child node holds 1,000 claimed turns blocked in their drains; it is killed
//!   with `SIGKILL` and this process's node (started before the kill, takeover on, same lease)
//!   times until it has started all 1,000 resumed drains.
//!
//! Without PostgreSQL the scenario is skipped with one line, except under `CI=true` where it
//! fails (as the `postgres` tests do).

use std::time::{Duration, Instant};

use durable_sessions::testing::postgres::{PgCluster, PgUnavailable};
use serde_json::json;

use crate::child::{field, Live};
use crate::postgres_node::{create_sessions, node, start_actors, Raw, RawPg};
use crate::report::{median, percentile, Row};
use crate::runners::{Counting, Empty, Stamp};
use crate::turns::resume_loop;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "postgres";

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Plan {
    sessions: usize,
    concurrency: usize,
    window: Duration,
    cap: usize,
    latency_samples: usize,
    takeover_sessions: usize,
    lease: Duration,
}

/// Per-repeat figures.
#[derive(Debug, Default)]
struct Series {
    raw_tx50: Vec<f64>,
    raw_auto50: Vec<f64>,
    round_trip50: Vec<f64>,
    raw_rate: Vec<f64>,
    one: Vec<f64>,
    one_batch: Vec<f64>,
    three: Vec<f64>,
    three_batch: Vec<f64>,
    commit50: Vec<f64>,
    commit99: Vec<f64>,
    wake50: Vec<f64>,
    wake99: Vec<f64>,
    whole50: Vec<f64>,
    whole99: Vec<f64>,
    takeover: Vec<f64>,
    takeover_first: Vec<f64>,
    takeover_sweep: Vec<f64>,
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let Some(pg) = cluster(ctx)? else {
        return Ok(Vec::new());
    };
    let plan = Plan {
        sessions: ctx.pick(1_000, 60),
        concurrency: ctx.pick(1_000, 60),
        window: ctx.pick(Duration::from_secs(3), Duration::from_millis(300)),
        cap: ctx.pick(200_000, 5_000),
        latency_samples: ctx.pick(400, 30),
        takeover_sessions: ctx.pick(1_000, 60),
        lease: ctx.pick(Duration::from_secs(2), Duration::from_secs(1)),
    };
    // For profiling one part: `DS_BENCH_PG_ONLY=one` (any of raw, one, three, latency,
    // takeover, comma-separated).
    let only = std::env::var("DS_BENCH_PG_ONLY").ok();
    let runs = |part: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == part))
    };
    let mut s = Series::default();
    for repeat in 0..ctx.repeats {
        if runs("raw") {
            raw_commits(ctx, &pg, repeat, &mut s)?;
        }
        if runs("one") {
            let url = pg.create_database(&format!("bench_one_{repeat}"))?;
            let (rate, batch) = actix_rt::System::new().block_on(one_node(&url, plan))?;
            s.one.push(rate);
            s.one_batch.push(batch);
        }
        if runs("three") {
            let url = pg.create_database(&format!("bench_three_{repeat}"))?;
            let (rate, batches) = three_nodes(&url, plan)?;
            s.three.push(rate);
            s.three_batch.push(median(&batches));
        }
        if runs("latency") {
            let url = pg.create_database(&format!("bench_latency_{repeat}"))?;
            let lat = actix_rt::System::new().block_on(latency(&url, plan.latency_samples))?;
            s.commit50.push(percentile(&lat.commits, 50.0));
            s.commit99.push(percentile(&lat.commits, 99.0));
            s.wake50.push(percentile(&lat.wake, 50.0));
            s.wake99.push(percentile(&lat.wake, 99.0));
            s.whole50.push(percentile(&lat.whole, 50.0));
            s.whole99.push(percentile(&lat.whole, 99.0));
        }
        if runs("takeover") {
            let url = pg.create_database(&format!("bench_takeover_{repeat}"))?;
            let taken = takeover(ctx, &url, plan)?;
            s.takeover.push(taken.last);
            s.takeover_first.push(taken.first);
            s.takeover_sweep.push(taken.first - taken.lapse);
        }
        let last = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN);
        ctx.log(format_args!(
            "postgres repeat {repeat}: raw commit p50 {:.0} µs, round trip p50 {:.0} µs; one \
             node {:.0} turns/s (batch {:.1}); three nodes {:.0} turns/s; wake->drain-start \
             p50 {:.0} µs, whole turn p50 {:.0} µs (commit p50 {:.0} µs); takeover of {} {:.2} \
             s (first drain {:.2} s, {:.2} s after the lease lapsed); load {}",
            last(&s.raw_tx50),
            last(&s.round_trip50),
            last(&s.one),
            last(&s.one_batch),
            last(&s.three),
            last(&s.wake50),
            last(&s.whole50),
            last(&s.commit50),
            plan.takeover_sessions,
            last(&s.takeover),
            last(&s.takeover_first),
            last(&s.takeover_sweep),
            crate::report::loadavg()
        ));
    }
    let mut rows = rows(&s, plan);
    // Parts not run (`DS_BENCH_PG_ONLY`) have no samples.
    rows.retain(|r| !r.samples.is_empty());
    Ok(rows)
}

/// Times raw transactions in a fresh database of the cluster.
fn raw_commits(ctx: &Ctx, pg: &PgCluster, repeat: usize, s: &mut Series) -> BenchResult<()> {
    let url = pg.create_database(&format!("bench_raw_{repeat}"))?;
    let raw = RawPg::open(&url)?;
    raw.times(Raw::Transaction, 20)?;
    let tx = raw.times(Raw::Transaction, ctx.pick(400, 40))?;
    let auto = raw.times(Raw::Autocommit, ctx.pick(400, 40))?;
    let trip = raw.times(Raw::RoundTrip, ctx.pick(400, 40))?;
    drop(raw);
    s.round_trip50.push(percentile(&trip, 50.0));
    s.raw_tx50.push(percentile(&tx, 50.0));
    s.raw_auto50.push(percentile(&auto, 50.0));
    s.raw_rate
        .push(1e6 * tx.len() as f64 / tx.iter().sum::<f64>());
    Ok(())
}

/// Starts the throwaway cluster, or says why not: `None` (after a line) when PostgreSQL is not
/// installed and not under CI.
fn cluster(ctx: &Ctx) -> BenchResult<Option<PgCluster>> {
    match PgCluster::start() {
        Ok(pg) => {
            ctx.log(format_args!(
                "postgres: throwaway cluster on port {} ({}), stock settings (fsync on)",
                pg.port(),
                pg.binaries().dir.display()
            ));
            Ok(Some(pg))
        }
        Err(PgUnavailable::NotInstalled)
            if !std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) =>
        {
            ctx.log(format_args!(
                "postgres: skipped: {} (set CI=true to make this a failure)",
                PgUnavailable::NotInstalled
            ));
            Ok(None)
        }
        Err(e) => Err(format!("postgres: cannot start a PostgreSQL cluster: {e}").into()),
    }
}

/// Turns/s (and the writer's requests per transaction) of one node in this process.
async fn one_node(url: &str, plan: Plan) -> BenchResult<(f64, f64)> {
    let rt = node(url, Empty, plan.lease, "one").start().await?;
    let ids = create_sessions(&rt, plan.sessions).await?;
    start_actors(&rt, &ids).await?;
    let before = rt.stats().persistence;
    let (done, elapsed) = resume_loop(
        &rt.execution(),
        &ids,
        plan.concurrency,
        plan.window,
        plan.cap,
    )
    .await?;
    let after = rt.stats().persistence;
    rt.shutdown().await;
    let transactions = after
        .transactions
        .saturating_sub(before.transactions)
        .max(1);
    let batch = after.requests.saturating_sub(before.requests) as f64 / transactions as f64;
    Ok((done as f64 / elapsed, batch))
}

/// Total turns/s of three nodes (child processes) started together, and each one's batch.
fn three_nodes(url: &str, plan: Plan) -> BenchResult<(f64, Vec<f64>)> {
    let mut nodes = (0..3)
        .map(|i| {
            Live::start(
                "pg-turns",
                &json!({
                    "url": url,
                    "name": format!("n{i}"),
                    "n": plan.sessions / 3,
                    "c": plan.concurrency / 3,
                    "window_ms": plan.window.as_millis() as u64,
                    "cap": plan.cap / 3,
                    "lease_ms": plan.lease.as_millis() as u64,
                }),
            )
        })
        .collect::<BenchResult<Vec<_>>>()?;
    for node in &mut nodes {
        node.expect("ready")?;
    }
    for node in &mut nodes {
        node.send("go")?;
    }
    let mut done = 0.0;
    let mut longest: f64 = 0.0;
    let mut batches = Vec::new();
    for node in nodes {
        let result = node.finish()?;
        done += field(&result, "done")?;
        longest = longest.max(field(&result, "elapsed_s")?);
        batches.push(field(&result, "batch")?);
    }
    Ok((done / longest.max(1e-9), batches))
}

/// The µs samples of the latency run.
#[derive(Debug, Default)]
struct Latency {
    commits: Vec<f64>,
    wake: Vec<f64>,
    whole: Vec<f64>,
}

/// `n` times, interleaved: a raw commit, a wake-started turn, a raw commit, a resume — of one
/// session on one node (as `latency` does on SQLite).
async fn latency(url: &str, n: usize) -> BenchResult<Latency> {
    let raw = RawPg::open(url)?;
    let (runner, mut starts) = Stamp::new();
    let rt = node(url, runner, Duration::from_secs(10), "latency")
        .start()
        .await?;
    let ids = create_sessions(&rt, 1).await?;
    let id = &ids[0];
    let exec = rt.execution();
    for _ in 0..5 {
        timed(exec.resume(id)).await??;
        raw.time(Raw::Transaction).await?;
    }
    while starts.try_recv().is_ok() {}
    let us = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e6;
    let mut l = Latency::default();
    for _ in 0..n {
        l.commits.push(raw.time(Raw::Transaction).await?);
        let before = Instant::now();
        exec.wake(id, None).await?;
        let start = timed(futures::StreamExt::next(&mut starts))
            .await?
            .ok_or("the runner stopped")?;
        timed(exec.await_idle(id)).await??;
        l.wake.push(us(before, start));

        l.commits.push(raw.time(Raw::Transaction).await?);
        let before = Instant::now();
        timed(exec.resume(id)).await??;
        l.whole.push(us(before, Instant::now()));
        let _ = starts.try_recv();
    }
    rt.shutdown().await;
    Ok(l)
}

/// Seconds from the `SIGKILL` of a node to the lapse of its lease and to its survivor's first
/// and last resumed drain start.
#[derive(Debug, Clone, Copy)]
struct Takeover {
    lapse: f64,
    first: f64,
    last: f64,
}

/// Times the takeover of the turns of a node holding `plan.takeover_sessions` claimed turns,
/// from its `SIGKILL` until a survivor started the first and the last resumed drain.
fn takeover(ctx: &Ctx, url: &str, plan: Plan) -> BenchResult<Takeover> {
    let n = plan.takeover_sessions;
    let mut victim = Live::start(
        "pg-owner",
        &json!({ "url": url, "n": n, "lease_ms": plan.lease.as_millis() as u64 }),
    )?;
    let ready = victim.expect("ready")?;
    ctx.log(format_args!(
        "postgres takeover: pid {} holds {} claimed turns (set up in {:.1} s)",
        victim.id(),
        field(&ready, "sessions")?,
        field(&ready, "setup_s")?
    ));
    let raw = RawPg::open(url)?;
    actix_rt::System::new().block_on(async move {
        let runner = Counting::new(n);
        let rt = node(url, runner.clone(), plan.lease, "survivor")
            .start()
            .await?;
        victim.kill()?;
        let killed = Instant::now();
        let lease_left = raw.time(Raw::LeaseLeft).await?;
        let last = timed(runner.reached()).await?;
        let first = runner.first().unwrap_or(last);
        rt.shutdown().await;
        Ok(Takeover {
            lapse: lease_left,
            first: first.duration_since(killed).as_secs_f64(),
            last: last.duration_since(killed).as_secs_f64(),
        })
    })
}

/// The table's rows.
fn rows(s: &Series, plan: Plan) -> Vec<Row> {
    let raw_tx = Row::new(
        NAME,
        "raw commit p50 (BEGIN; INSERT; COMMIT)",
        "µs",
        s.raw_tx50.clone(),
    )
    .note("a plain postgres client, three round trips and one commit per transaction");
    let raw_auto = Row::new(
        NAME,
        "raw autocommit INSERT p50",
        "µs",
        s.raw_auto50.clone(),
    );
    let trip = Row::new(
        NAME,
        "raw round trip p50 (prepared SELECT 1)",
        "µs",
        s.round_trip50.clone(),
    );
    let raw_rate = Row::new(
        NAME,
        "raw commits/s, one client (BEGIN; INSERT; COMMIT)",
        "tx/s",
        s.raw_rate.clone(),
    );
    let c = plan.concurrency;
    let n = plan.sessions;
    let one = Row::new(
        NAME,
        format!("turns/s c={c} over {n} sessions, one node"),
        "turns/s",
        s.one.clone(),
    )
    .vs(&raw_rate)
    .note(format!(
        "writer batch (requests per transaction) median {:.1}",
        median(&s.one_batch)
    ));
    let met = one.median() >= 5_000.0;
    let one = one.target(">= 5,000/s (DBOS Rust 0.5: 1,370 workflows/s)", met);
    let three = Row::new(
        NAME,
        format!("turns/s c={c} over {n} sessions, three nodes (child processes) total"),
        "turns/s",
        s.three.clone(),
    )
    .vs(&one)
    .note(format!(
        "each node a third of the sessions and of c; writer batch per node median {:.1}",
        median(&s.three_batch)
    ));
    let met = three.ratio().unwrap_or(0.0) >= 1.0;
    let three = three.target(">= one node", met);

    let commit50 = Row::new(
        NAME,
        "commit p50 (BEGIN; INSERT; COMMIT, between the turns)",
        "µs",
        s.commit50.clone(),
    );
    let commit99 = Row::new(
        NAME,
        "commit p99 (between the turns)",
        "µs",
        s.commit99.clone(),
    );
    // Judged per repeat against the commits timed between that repeat's turns.
    let excess = |samples: &[f64], commits: f64| -> f64 {
        let each: Vec<f64> = samples
            .iter()
            .zip(&s.commit50)
            .map(|(x, c)| x - commits * c)
            .collect();
        median(&each)
    };
    let over = excess(&s.wake50, 1.0);
    let wake50 = Row::new(NAME, "wake->drain-start p50", "µs", s.wake50.clone())
        .vs(&commit50)
        .note(format!("one commit + {over:.0} µs"));
    let wake99 = Row::new(NAME, "wake->drain-start p99", "µs", s.wake99.clone()).vs(&commit99);
    let over = excess(&s.whole50, 2.0);
    let whole50 = Row::new(NAME, "whole turn p50", "µs", s.whole50.clone())
        .vs(&commit50)
        .target(
            format!("<= 2 commits + 300 µs (is {over:+.0})"),
            over <= 300.0,
        );
    let whole99 = Row::new(NAME, "whole turn p99", "µs", s.whole99.clone()).vs(&commit99);

    let lease = plan.lease.as_secs_f64();
    let take = Row::new(
        NAME,
        format!(
            "takeover of {} claimed sessions after SIGKILL (lease {lease} s)",
            plan.takeover_sessions
        ),
        "s",
        s.takeover.clone(),
    )
    .note("from the kill until the survivor started the last resumed drain");
    let met = take.median() <= lease + 2.0;
    let take = take.target(format!("<= lease + 2 s = {:.1} s", lease + 2.0), met);
    let first = Row::new(
        NAME,
        "takeover: first resumed drain after SIGKILL",
        "s",
        s.takeover_first.clone(),
    )
    .note(format!(
        "the lease lapses {:.2} to {lease:.2} s after the kill (renewed every third of it); \
         survivors look every quarter lease",
        lease * 2.0 / 3.0
    ));
    let sweep = Row::new(
        NAME,
        "takeover: first resumed drain after the lease lapsed",
        "s",
        s.takeover_sweep.clone(),
    )
    .note("the wait for the survivor's next look (at most a quarter lease), then its sweep");
    vec![
        raw_tx, raw_auto, trip, raw_rate, one, three, commit50, commit99, wake50, wake99, whole50,
        whole99, take, first, sweep,
    ]
}
