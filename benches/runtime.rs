//! The runtime benchmark harness: `cargo bench --bench runtime -- [scenario...]
//! [--quick]`.
//!
//! Scenarios: `ceiling` (raw SQLite commits and the naive two-commit turn), `turns` (empty-drain
//! turns at concurrency 1, 64 and 1,000, group commit on and off), `latency` (wake → drain start
//! and whole-turn p50/p99), `sweep` (restart sweep of 10,000 claimed sessions among 100,000),
//! `memory` (RSS per idle live actor, and after passivation), `events` (replay of 1,000,000
//! stored events), `sse` (10,000 idle event streams and 1,000 on one hot session, over HTTP),
//! `stream` (live-only events to 100 in-process subscribers), `growth` (the same workload on
//! databases of 1,000 to 1,000,000 sessions in steady state, and a 10,000-message transcript),
//! `steps` (durable steps against appends of the same payload at concurrency 1 and 1,000, a
//! step's latency against a commit's, and the replay of a retried turn's 1,000 steps),
//! `postgres` (feature `testing-postgres`: turns/s on one and three nodes, latency and takeover on a
//! throwaway local PostgreSQL). No scenario named runs them all (`postgres` only when built with
//! its feature).
//!
//! Every scenario repeats [`REPEATS`] times and measures its own baseline in the same run, so
//! its figures are ratios that survive a noisy machine. The table goes to stdout and the same
//! figures to `target/bench/runtime.json`. `--quick` runs a small version of every scenario (CI
//! runs it so the harness never rots). Unknown flags (cargo passes `--bench`) are ignored.
//! Memory-sensitive scenarios run in a fresh child process (see `child`).
//!
//! Layout: `report` (rows, table, JSON, machine facts), `db` (database creation, bulk seeding
//! and the raw rusqlite baselines), `runners` (the drains), `child` (re-exec protocol), then one
//! module per scenario (`floor`: the `latency` scenario's bare turn; `postgres_node`: the `postgres` scenario's child nodes and raw client).

#[path = "runtime/ceiling.rs"]
mod ceiling;
#[path = "runtime/child.rs"]
mod child;
#[path = "runtime/db.rs"]
mod db;
#[path = "runtime/events.rs"]
mod events;
#[path = "runtime/floor.rs"]
mod floor;
#[path = "runtime/growth.rs"]
mod growth;
#[path = "runtime/latency.rs"]
mod latency;
#[path = "runtime/memory.rs"]
mod memory;
#[cfg(feature = "testing-postgres")]
#[path = "runtime/postgres.rs"]
mod postgres;
#[cfg(feature = "testing-postgres")]
#[path = "runtime/postgres_node.rs"]
mod postgres_node;
#[path = "runtime/report.rs"]
mod report;
#[path = "runtime/runners.rs"]
mod runners;
#[cfg(feature = "http")]
#[path = "runtime/sse.rs"]
mod sse;
#[cfg(feature = "http")]
#[path = "runtime/sse_server.rs"]
mod sse_server;
#[path = "runtime/steps.rs"]
mod steps;
#[path = "runtime/stream.rs"]
mod stream;
#[path = "runtime/sweep.rs"]
mod sweep;
#[path = "runtime/turns.rs"]
mod turns;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use report::Row;

/// What a scenario returns, and the harness's error type.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Repeats of every scenario (min / median / max are over these).
pub const REPEATS: usize = 3;

/// Every scenario, in the order they run.
const SCENARIOS: [&str; 11] = [
    "ceiling", "turns", "latency", "sweep", "memory", "events", "sse", "stream", "growth", "steps",
    "postgres",
];

/// What every scenario is given.
#[derive(Debug)]
pub struct Ctx {
    /// Run the small version.
    pub quick: bool,
    /// Repeats of each measurement.
    pub repeats: usize,
    /// The directory every database lives in (one filesystem for all scenarios).
    pub dir: PathBuf,
}

impl Ctx {
    /// `full` normally, `quick` with `--quick`.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }

    /// Logs progress on stderr (stdout carries the table).
    pub fn log(&self, what: impl std::fmt::Display) {
        eprintln!("[bench] {what}");
    }
}

/// How long any awaited step may take before the run is declared hung.
const HANG: Duration = Duration::from_secs(60);

/// Awaits `f`, failing after [`HANG`] instead of hanging the run.
pub async fn timed<T>(f: impl Future<Output = T>) -> BenchResult<T> {
    actix_rt::time::timeout(HANG, f)
        .await
        .map_err(|_| format!("a step took longer than {HANG:?}").into())
}

/// `target/` (or `$CARGO_TARGET_DIR`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn run_scenario(name: &str, ctx: &Ctx) -> BenchResult<Vec<Row>> {
    match name {
        "ceiling" => ceiling::run(ctx),
        "turns" => turns::run(ctx),
        "latency" => latency::run(ctx),
        "sweep" => sweep::run(ctx),
        "memory" => memory::run(ctx),
        "events" => events::run(ctx),
        #[cfg(feature = "http")]
        "sse" => sse::run(ctx),
        "stream" => stream::run(ctx),
        "growth" => growth::run(ctx),
        "steps" => steps::run(ctx),
        #[cfg(feature = "testing-postgres")]
        "postgres" => postgres::run(ctx),
        #[cfg(not(feature = "testing-postgres"))]
        "postgres" => Err("the postgres scenario needs `--features testing-postgres`".into()),
        other => Err(format!("unknown scenario {other}").into()),
    }
}

fn main() -> ExitCode {
    if let Some(code) = child::dispatch() {
        return code;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let names: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    if !args.iter().any(|a| a == "--bench" || a == "--quick") {
        // `cargo test --all-targets [-- <filter> <libtest flags>]` runs bench binaries without
        // `--bench` (cargo bench passes it): do not benchmark an unoptimized build there, and
        // ignore libtest's arguments rather than take a test filter for a scenario.
        eprintln!(
            "runtime bench: run it with `cargo bench --bench runtime -- [scenario] [--quick]`"
        );
        return ExitCode::SUCCESS;
    }
    if let Some(bad) = names.iter().find(|n| !SCENARIOS.contains(n)) {
        eprintln!("unknown scenario `{bad}`; known: {}", SCENARIOS.join(", "));
        return ExitCode::from(2);
    }
    let selected: Vec<&str> = if names.is_empty() {
        // Everything this build can run: `postgres` only with its feature.
        SCENARIOS
            .iter()
            .copied()
            .filter(|s| *s != "postgres" || cfg!(feature = "testing-postgres"))
            .collect()
    } else {
        SCENARIOS
            .iter()
            .copied()
            .filter(|s| names.contains(s))
            .collect()
    };
    match run(&selected, quick) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runtime bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(selected: &[&str], quick: bool) -> BenchResult<()> {
    let bench_dir = target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir)?;
    let tmp = tempfile::Builder::new()
        .prefix("runtime-")
        .tempdir_in(&bench_dir)?;
    let ctx = Ctx {
        quick,
        repeats: REPEATS,
        dir: tmp.path().to_path_buf(),
    };
    let machine = report::machine(&ctx.dir);
    ctx.log(format_args!("machine: {machine}"));
    let started = Instant::now();
    let mut rows = Vec::new();
    for name in selected {
        let t = Instant::now();
        ctx.log(format_args!(
            "scenario {name}{}",
            if quick { " (quick)" } else { "" }
        ));
        rows.extend(run_scenario(name, &ctx)?);
        ctx.log(format_args!(
            "scenario {name} took {:.1} s",
            t.elapsed().as_secs_f64()
        ));
    }
    println!("{}", report::table(&rows));
    let json = bench_dir.join("runtime.json");
    let elapsed = started.elapsed().as_secs_f64();
    report::write_json(&json, &machine, elapsed, quick, ctx.repeats, &rows)?;
    ctx.log(format_args!(
        "wrote {} ({elapsed:.1} s in all; load average {})",
        json.display(),
        report::loadavg()
    ));
    Ok(())
}
