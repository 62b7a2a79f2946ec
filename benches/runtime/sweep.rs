//! `sweep`: 100,000 sessions, every tenth claimed by an earlier boot (10,000 orphans), seeded in
//! one rusqlite transaction. A fresh child process starts the runtime with
//! `sweep_on_start(false)`, then times `resume_suspended_sessions()` to: its return, the
//! 10,000th drain start (a counting runner), and every turn completed (`await_idle` on each
//! resumed id); and reports its own peak RSS (`VmHWM`).
//!
//! Baseline: the same durable writes done by rusqlite directly in three batched transactions, as
//! the runtime groups them (count the attempts; publish each notice with its claim,
//! `execution.started`; release with `execution.succeeded`) — the floor for a perfectly batched
//! sweep on this filesystem.

use std::path::{Path, PathBuf};
use std::time::Instant;

use durable_sessions::{Runtime, SessionId, Synchronous};
use rusqlite::{params, TransactionBehavior};
use serde_json::{json, Value};

use crate::ceiling::SYNCS;
use crate::child::{self, field, peak_rss_mib, rss_mib};
use crate::db;
use crate::report::{median, Row};
use crate::runners::Counting;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "sweep";

/// One claimed session in this many.
const CLAIM_EVERY: usize = 10;

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let total = ctx.pick(100_000, 10_000);
    let template = ctx.dir.join("sweep-template.db");
    db::remove(&template);
    db::create(&template)?;
    let ids = db::seed_sessions(&template, total, CLAIM_EVERY)?;
    let claimed: Vec<SessionId> = ids.into_iter().step_by(CLAIM_EVERY).collect();
    let run_db = ctx.dir.join("sweep-run.db");
    // Per sync: raw baseline, returned, drains started, turns completed, peak RSS, start RSS.
    let mut figures: [[Vec<f64>; 6]; 2] = Default::default();
    // Per sync: the raw baseline's phases (list, count, notices + claims, releases).
    let mut phases: [Vec<[f64; 4]>; 2] = Default::default();
    for repeat in 0..ctx.repeats {
        for (i, sync) in SYNCS.into_iter().enumerate() {
            db::copy(&template, &run_db)?;
            let (raw, phase) = raw_sweep(&run_db, sync, &claimed)?;
            phases[i].push(phase);
            db::copy(&template, &run_db)?;
            let args = json!({
                "db": run_db,
                "sync": sync.as_pragma(),
                "claimed": claimed.len(),
            });
            let out = child::spawn("sweep", &args)?;
            let values = [
                raw,
                field(&out, "returned_s")?,
                field(&out, "started_s")?,
                field(&out, "completed_s")?,
                field(&out, "peak_rss_mib")?,
                field(&out, "start_rss_mib")?,
            ];
            for (dst, v) in figures[i].iter_mut().zip(values) {
                dst.push(v);
            }
            ctx.log(format_args!(
                "sweep repeat {repeat} {}: raw {:.3} s; returned {:.3} s, started {:.3} s, \
                 completed {:.3} s, peak {:.1} MiB",
                sync.as_pragma(),
                values[0],
                values[1],
                values[2],
                values[3],
                values[4]
            ));
        }
    }
    let mut rows = Vec::new();
    let n = claimed.len();
    let all = SYNCS.into_iter().zip(figures).zip(phases);
    for ((sync, [raw, returned, started, completed, peak, start]), phases) in all {
        let s = sync.as_pragma();
        let full = sync == Synchronous::Full;
        let phase = |k: usize| median(&phases.iter().map(|p| p[k]).collect::<Vec<_>>());
        let raw = Row::new(NAME, format!("raw batched writes {s}"), "s", raw).note(format!(
            "phases (median s): list {:.3}, count {:.3}, notices + claims {:.3}, releases {:.3}",
            phase(0),
            phase(1),
            phase(2),
            phase(3)
        ));
        let returned = Row::new(NAME, format!("sweep call returned {s}"), "s", returned).vs(&raw);
        let mut started =
            Row::new(NAME, format!("all {n} drains started {s}"), "s", started).vs(&raw);
        let mut completed =
            Row::new(NAME, format!("all {n} turns completed {s}"), "s", completed).vs(&raw);
        let start = Row::new(NAME, format!("child RSS before start {s}"), "MiB", start);
        let mut peak = Row::new(NAME, format!("peak RSS {s}"), "MiB", peak).vs(&start);
        if full {
            let met = started.median() <= 0.5;
            started = started.target("<= 0.5 s", met);
            let met = completed.median() <= 1.5;
            completed = completed.target("<= 1.5 s", met);
            let met = peak.median() <= 64.0;
            peak = peak.target("<= 64 MiB", met);
        }
        rows.extend([raw, returned, started, completed, peak, start]);
    }
    Ok(rows)
}

/// The sweep's durable writes for `claimed`, by rusqlite directly, shaped like the runtime's:
/// the counts in one transaction, each orphan's notice and claim together in a second, the
/// terminal events and releases in a third. Seconds in all and per phase (list, count,
/// notices + claims, releases).
fn raw_sweep(
    path: &Path,
    sync: Synchronous,
    claimed: &[SessionId],
) -> BenchResult<(f64, [f64; 4])> {
    let mut conn = db::open(path, sync)?;
    let started = Instant::now();
    let orphans: Vec<String> = conn
        .prepare(
            "SELECT c.session_id FROM session_claim c CROSS JOIN session s \
             ON s.id = c.session_id WHERE c.time_suspended IS NOT NULL AND s.parent_id IS NULL \
             AND c.claim_boot <> 'now' ORDER BY c.time_suspended, c.session_id",
        )?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if orphans.len() != claimed.len() {
        return Err(format!("found {} orphans, seeded {}", orphans.len(), claimed.len()).into());
    }
    type Event = (&'static str, Option<&'static str>);
    let claim = (
        "session.execution.started",
        Some("UPDATE session_claim SET time_suspended = COALESCE(time_suspended, ?2), claim_boot = 'now' WHERE session_id = ?1"),
    );
    let release = (
        "session.execution.succeeded",
        Some("DELETE FROM session_claim WHERE session_id = ?1 AND ?2 IS NOT NULL"),
    );
    let steps: [&[Event]; 3] = [&[], &[("session.synthetic", None), claim], &[release]];
    let mut phases = [started.elapsed().as_secs_f64(), 0.0, 0.0, 0.0];
    for (step, events) in steps.into_iter().enumerate() {
        let t = Instant::now();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for id in &orphans {
            let now = db::now_ms();
            if events.is_empty() {
                tx.prepare_cached(
                    "UPDATE session_claim SET resume_attempts = resume_attempts + 1, \
                     claim_boot = 'now' WHERE session_id = ?1 RETURNING resume_attempts",
                )?
                .query_row([id], |row| row.get::<_, i64>(0))?;
                continue;
            }
            for (kind, projection) in events {
                let seq: i64 = tx
                    .prepare_cached(db::NEXT_SEQ)?
                    .query_row([id], |row| row.get(0))?;
                tx.prepare_cached(db::INSERT_EVENT)?.execute(params![
                    id,
                    seq,
                    kind,
                    r#"{"boot":"now"}"#,
                    now
                ])?;
                if let Some(sql) = projection {
                    tx.prepare_cached(sql)?.execute(params![id, now])?;
                }
            }
        }
        tx.commit()?;
        phases[step + 1] = t.elapsed().as_secs_f64();
    }
    Ok((started.elapsed().as_secs_f64(), phases))
}

/// In the child: the timed sweep.
pub fn child(args: &Value) -> BenchResult<Value> {
    let path = PathBuf::from(args["db"].as_str().ok_or("no db")?);
    let sync = match args["sync"].as_str() {
        Some("NORMAL") => Synchronous::Normal,
        _ => Synchronous::Full,
    };
    let claimed = usize::try_from(args["claimed"].as_u64().ok_or("no claimed")?)?;
    let start_rss = rss_mib();
    actix_rt::System::new().block_on(async move {
        let counter = Counting::new(claimed);
        let rt = Runtime::builder()
            .database(path)
            .runner(counter.clone())
            .synchronous(sync)
            .sweep_on_start(false)
            .start()
            .await?;
        let ready_rss = rss_mib();
        let t0 = Instant::now();
        let report = rt.resume_suspended_sessions().await?;
        let returned = t0.elapsed();
        if report.resumed.len() != claimed {
            return Err(format!("resumed {} of {claimed}", report.resumed.len()).into());
        }
        let reached = timed(counter.reached()).await?;
        let exec = rt.execution();
        for id in &report.resumed {
            timed(exec.await_idle(id)).await??;
        }
        let completed = t0.elapsed();
        let peak = peak_rss_mib();
        let stats = rt.stats();
        rt.shutdown().await;
        Ok(json!({
            "returned_s": returned.as_secs_f64(),
            "started_s": reached.duration_since(t0).as_secs_f64(),
            "completed_s": completed.as_secs_f64(),
            "peak_rss_mib": peak,
            "start_rss_mib": start_rss,
            "ready_rss_mib": ready_rss,
            "drains": counter.started(),
            "stats": stats,
        }))
    })
}
