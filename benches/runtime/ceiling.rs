//! `ceiling`: what SQLite itself allows on this filesystem, through rusqlite directly — single-row
//! UPDATE transactions per second, and the *naive turn* (claim committed in one transaction, an
//! empty drain, release committed in another) per second — with `synchronous` FULL and NORMAL.
//! These are the baselines of the other scenarios.

use std::path::Path;
use std::time::Duration;

use durable_sessions::{SessionId, Synchronous};

use crate::db::{self, Raw};
use crate::report::Row;
use crate::{BenchResult, Ctx};

const NAME: &str = "ceiling";

/// Both synchronous settings, FULL first.
pub const SYNCS: [Synchronous; 2] = [Synchronous::Full, Synchronous::Normal];

/// How long each throughput measurement runs.
pub fn window(ctx: &Ctx) -> Duration {
    ctx.pick(Duration::from_secs(2), Duration::from_millis(150))
}

/// Raw single-row UPDATE transactions per second.
pub fn commits_per_s(
    path: &Path,
    sync: Synchronous,
    ids: &[SessionId],
    window: Duration,
) -> BenchResult<f64> {
    let mut raw = Raw::open(path, sync, ids)?;
    db::rate(window, 10, 1_000_000, || raw.commit())
}

/// Naive turns (two transactions each) per second.
pub fn naive_turns_per_s(
    path: &Path,
    sync: Synchronous,
    ids: &[SessionId],
    window: Duration,
) -> BenchResult<f64> {
    let mut raw = Raw::open(path, sync, ids)?;
    db::rate(window, 5, 1_000_000, || raw.naive_turn())
}

/// A database of `n` sessions for the baselines; returns the ids.
pub fn baseline_db(path: &Path, n: usize) -> BenchResult<Vec<SessionId>> {
    db::remove(path);
    db::create(path)?;
    db::seed_sessions(path, n, 0)
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let path = ctx.dir.join("ceiling.db");
    let ids = baseline_db(&path, 1_000)?;
    let window = window(ctx);
    let mut commits = [Vec::new(), Vec::new()];
    let mut turns = [Vec::new(), Vec::new()];
    for repeat in 0..ctx.repeats {
        for (i, sync) in SYNCS.into_iter().enumerate() {
            commits[i].push(commits_per_s(&path, sync, &ids, window)?);
            turns[i].push(naive_turns_per_s(&path, sync, &ids, window)?);
        }
        ctx.log(format_args!(
            "ceiling repeat {repeat}: FULL {:.0} commits/s, {:.0} naive turns/s; NORMAL {:.0}, {:.0}",
            commits[0][repeat], turns[0][repeat], commits[1][repeat], turns[1][repeat]
        ));
    }
    let mut rows = Vec::new();
    for (i, sync) in SYNCS.into_iter().enumerate() {
        let s = sync.as_pragma();
        let commit = Row::new(NAME, format!("raw commit {s}"), "tx/s", commits[i].clone());
        let turn =
            Row::new(NAME, format!("naive turn {s}"), "turns/s", turns[i].clone()).vs(&commit);
        rows.push(commit);
        rows.push(turn);
    }
    let full_ms = 1e3 / rows[0].median();
    rows[0] = rows[0].clone().note(format!(
        "one FULL commit = {full_ms:.2} ms (WAL fsync on every commit)"
    ));
    Ok(rows)
}
