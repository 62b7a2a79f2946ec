//! `memory`: 100,000 live idle session actors, in a fresh child process: RSS before, every
//! session woken once (a drain that completes at once; at most 512 turns in flight; a long idle
//! timeout), RSS once every turn settled → RSS per live actor; then, with the idle timeout passed, every actor passivated
//! (`stats().registry.live == 0`) → RSS relative to where it started.
//!
//! Baseline, in another fresh child: the same number of bare actix actors (an interval timer
//! each, like a session actor's passivation tick) on the same arbiter count, their addresses in a
//! map keyed by session id, like the registry's — the framework's floor per actor.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Arbiter, AsyncContext, Context};
use durable_sessions::{Execution, Runtime, SessionId};
use futures::{StreamExt, TryStreamExt};
use serde_json::{json, Value};

use crate::child::{self, field, rss_mib};
use crate::db;
use crate::report::Row;
use crate::runners::Empty;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "memory";

/// Turns in flight at once while filling the registry.
const IN_FLIGHT: usize = 512;

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let n = ctx.pick(100_000, 5_000);
    let idle_ms = ctx.pick(30_000, 2_000);
    let template = ctx.dir.join("memory-template.db");
    db::remove(&template);
    db::create(&template)?;
    db::seed_sessions(&template, n, 0)?;
    let run_db = ctx.dir.join("memory-run.db");
    // bare KiB/actor, KiB/actor, before, live, after passivation, re-filled, fill s,
    // passivation s
    let mut f: [Vec<f64>; 8] = Default::default();
    for repeat in 0..ctx.repeats {
        let floor = child::spawn("memory-floor", &json!({ "n": n }))?;
        db::copy(&template, &run_db)?;
        let out = child::spawn(
            "memory",
            &json!({ "db": run_db, "n": n, "idle_ms": idle_ms }),
        )?;
        let live = field(&out, "live")?;
        if live < n as f64 {
            return Err(format!("only {live} of {n} actors were live at once").into());
        }
        let values = [
            field(&floor, "kib_per_actor")?,
            field(&out, "kib_per_actor")?,
            field(&out, "before_mib")?,
            field(&out, "live_mib")?,
            field(&out, "passivated_mib")?,
            field(&out, "refilled_mib")?,
            field(&out, "fill_s")?,
            field(&out, "passivation_s")?,
        ];
        for (dst, v) in f.iter_mut().zip(values) {
            dst.push(v);
        }
        ctx.log(format_args!(
            "memory repeat {repeat}: bare actor {:.2} KiB, session actor {:.2} KiB; RSS {:.1} -> \
             {:.1} -> {:.1} MiB, re-filled {:.1} MiB (fill {:.1} s, passivation {:.1} s)",
            values[0], values[1], values[2], values[3], values[4], values[5], values[6], values[7]
        ));
    }
    let [bare, per, before, live, after, refilled, fill, passivation] = f;
    let bare = Row::new(NAME, "bare actix actor + map entry", "KiB/actor", bare);
    let mut per = Row::new(
        NAME,
        format!("RSS per idle live actor ({n})"),
        "KiB/actor",
        per,
    )
    .vs(&bare);
    let met = per.median() <= 2.0;
    per = per.target("<= 2 KiB", met).note(child::ALLOCATOR);
    let before = Row::new(NAME, "RSS before waking", "MiB", before);
    let live = Row::new(NAME, format!("RSS with {n} live actors"), "MiB", live).vs(&before);
    let mut after = Row::new(NAME, "RSS after passivation", "MiB", after).vs(&before);
    let limit = before.median() * 1.10;
    let met = after.median() <= limit;
    after = after
        .target(format!("<= before + 10% = {limit:.1} MiB"), met)
        .note(child::ALLOCATOR);
    let refilled = Row::new(
        NAME,
        "RSS after passivation and a second fill",
        "MiB",
        refilled,
    )
    .vs(&live)
    .note("a second fill that reuses the memory freed by passivation barely grows RSS");
    let fill = Row::new(NAME, format!("wake {n} sessions, all settled"), "s", fill);
    let passivation = Row::new(
        NAME,
        format!("passivation of all (idle timeout {} s)", idle_ms / 1000),
        "s",
        passivation,
    );
    Ok(vec![
        per,
        bare,
        after,
        live,
        before,
        refilled,
        fill,
        passivation,
    ])
}

/// Waits until `done()` or `limit` passed, checking every `every`.
async fn wait_for(limit: Duration, every: Duration, done: impl Fn() -> bool) -> BenchResult<()> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("condition not reached within {limit:?}").into());
        }
        actix_rt::time::sleep(every).await;
    }
    Ok(())
}

/// Wakes every session once and waits until every turn settled. At most [`IN_FLIGHT`] turns
/// run at a time (wake, then await that session's idle): the figure is what idle actors cost,
/// not what the allocator keeps of a burst. `DS_BENCH_MEMORY_FILL=burst` wakes [`IN_FLIGHT`]
/// sessions at a time without waiting for their turns instead (the fill before 2026-11-30): every
/// turn then queues at the writer at once, and glibc malloc keeps much of that peak.
async fn fill(exec: &Execution, ids: &[SessionId], idle: Duration) -> BenchResult<()> {
    let burst = std::env::var("DS_BENCH_MEMORY_FILL").is_ok_and(|v| v == "burst");
    if burst {
        futures::stream::iter(ids)
            .map(|id| exec.wake(id, None))
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<()>()
            .await?;
    } else {
        futures::stream::iter(ids)
            .map(|id| async move {
                exec.wake(id, None).await?;
                exec.await_idle(id).await
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<()>()
            .await?;
    }
    wait_for(idle, Duration::from_millis(20), || exec.active().is_empty()).await
}

/// In the child: fill the registry, measure, wait for passivation, measure.
pub fn child(args: &Value) -> BenchResult<Value> {
    fix_trim_threshold();
    let path = PathBuf::from(args["db"].as_str().ok_or("no db")?);
    let n = usize::try_from(args["n"].as_u64().ok_or("no n")?)?;
    let idle = Duration::from_millis(args["idle_ms"].as_u64().ok_or("no idle_ms")?);
    let ids: Vec<SessionId> = {
        let conn = db::open(&path, durable_sessions::Synchronous::Full)?;
        let mut stmt = conn.prepare("SELECT id FROM session")?;
        let ids = stmt
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter()
            .map(SessionId::new)
            .collect::<Result<_, _>>()?
    };
    if ids.len() != n {
        return Err(format!("found {} sessions, expected {n}", ids.len()).into());
    }
    actix_rt::System::new().block_on(async move {
        // Set by the runtime's `after_passivation` hook, once the passivation wave is over.
        let released = Arc::new(AtomicBool::new(false));
        let rt = Runtime::builder()
            .database(path)
            .runner(Empty)
            .idle_timeout(idle)
            .sweep_on_start(false)
            .after_passivation({
                let released = released.clone();
                move |_| {
                    return_freed_memory();
                    released.store(true, Ordering::Release);
                }
            })
            .start()
            .await?;
        let exec = rt.execution();
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let before = rss_mib();
        let step = Duration::from_millis(20);
        let t0 = Instant::now();
        fill(&exec, &ids, idle).await?;
        let fill_time = t0.elapsed();
        let stats = rt.stats();
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let live_rss = rss_mib();
        let live = rt.stats().registry.live;
        let t1 = Instant::now();
        let limit = idle * 3 + Duration::from_secs(30);
        wait_for(limit, step, || rt.stats().registry.live == 0).await?;
        let passivation = t1.elapsed();
        // The supervisor releases memory on its first tick after the wave (idle / 2, <= 5 s).
        wait_for(idle + Duration::from_secs(10), step, || {
            released.load(Ordering::Acquire)
        })
        .await?;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let after = rss_mib();
        // Fill again: if the freed memory is reused, RSS barely grows (retained, not leaked).
        fill(&exec, &ids, idle).await?;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let refilled = rss_mib();
        rt.shutdown().await;
        Ok(json!({
            "before_mib": before,
            "live_mib": live_rss,
            "passivated_mib": after,
            "live": live,
            "kib_per_actor": (live_rss - before) * 1024.0 / live.max(1) as f64,
            "refilled_mib": refilled,
            "fill_s": fill_time.as_secs_f64(),
            "passivation_s": passivation.as_secs_f64(),
            "stats": stats,
        }))
    })
}

/// A bare actor with an interval timer, like a session actor's passivation tick.
struct Bare {
    started: Arc<AtomicUsize>,
}

impl Actor for Bare {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_secs(5), |_, _| {});
        self.started.fetch_add(1, Ordering::Release);
    }
}

/// In the child: the framework's floor per actor.
pub fn floor_child(args: &Value) -> BenchResult<Value> {
    let n = usize::try_from(args["n"].as_u64().ok_or("no n")?)?;
    let ids: Vec<SessionId> = (0..n).map(|_| SessionId::generate()).collect();
    actix_rt::System::new().block_on(async move {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let arbiters: Vec<Arbiter> = (0..cores).map(|_| Arbiter::new()).collect();
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let before = rss_mib();
        let started = Arc::new(AtomicUsize::new(0));
        let mut map: HashMap<SessionId, Addr<Bare>> = HashMap::new();
        for (i, id) in ids.into_iter().enumerate() {
            let started = started.clone();
            let arbiter = arbiters[i % arbiters.len()].handle();
            map.insert(
                id,
                Bare::start_in_arbiter(&arbiter, move |_| Bare { started }),
            );
        }
        let done = || started.load(Ordering::Acquire) == n;
        timed(wait_for(
            Duration::from_secs(60),
            Duration::from_millis(10),
            done,
        ))
        .await??;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let after = rss_mib();
        for arbiter in &arbiters {
            arbiter.stop();
        }
        Ok(json!({
            "kib_per_actor": (after - before) * 1024.0 / n as f64,
            "actors": map.len(),
        }))
    })
}

/// What an application does in [`durable_sessions::RuntimeBuilder::after_passivation`] to give
/// the memory of passivated sessions back to the OS: with glibc malloc, `malloc_trim(0)` (glibc
/// never returns free chunks that sit between live ones on its own).
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` only releases free memory of glibc's arenas; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The allocator setting that goes with [`return_freed_memory`], made before anything is
/// allocated in bulk: a fixed `M_TRIM_THRESHOLD` (128 KiB, glibc's default). Otherwise glibc
/// raises it, up to 64 MiB, whenever a large block is freed (the registry's table, say), and
/// since `malloc_trim` does not trim the top of a thread's arena, a few MiB freed there stay
/// resident or not depending on where the last frees landed.
fn fix_trim_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `mallopt` sets an allocator parameter; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}
