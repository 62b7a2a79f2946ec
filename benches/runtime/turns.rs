//! `turns`: empty-drain turns (resume → claim → drain → release) over 1,000 sessions at
//! concurrency 1, 64 and 1,000, group commit on and off, synchronous FULL and NORMAL, driven
//! through the public API: `c` tasks each `resume` their share of the sessions in a loop.
//!
//! Every configuration runs for a fixed window (or a cap of turns, whichever ends first) on a
//! fresh copy of one seeded database; turns/s = turns completed / time until the last returned.
//! *Fresh*: the sessions have no history (their `session.created` only), which is why every
//! label says so; `growth` measures the same workload in steady state (≥ 100 turns of history
//! per session, on databases of up to 1,000,000 sessions).
//! Actors are spawned before the window (a no-op `interrupt` to every session), so the figure
//! is steady-state turns, not actor start-up. Baseline: the naive turn, measured on the same
//! database file just before each run (so each ratio compares figures taken seconds apart).
//! At c = 1 with group commit, also a loop of *bare turns* (`floor`) right after: the naive
//! turn's two commits reached through the same thread hand-offs as a runtime turn, without the
//! runtime. It is the floor of c = 1 under this architecture, and c = 1 FULL's target is
//! relative to it: ≥ 0.9× the bare loop, per repeat.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_sessions::{Execution, Runtime, SessionId, Synchronous, Terminal};

use crate::ceiling::{self, SYNCS};
use crate::db;
use crate::floor::{Floor, Writes};
use crate::report::Row;
use crate::runners::Empty;
use crate::{BenchResult, Ctx};

const NAME: &str = "turns";

/// One measured configuration.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// SQLite `synchronous`.
    pub sync: Synchronous,
    /// Group commit on.
    pub group: bool,
    /// Tasks resuming sessions at once.
    pub concurrency: usize,
}

impl Config {
    fn label(&self) -> String {
        format!(
            "turns/s c={} {} {} fresh",
            self.concurrency,
            self.sync.as_pragma(),
            if self.group { "group" } else { "no-group" }
        )
    }
}

/// What one run of a configuration measured.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Turns completed per second.
    pub turns_per_s: f64,
    /// Writer requests per committed transaction during the window.
    pub batch: f64,
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let sessions = ctx.pick(1_000, 100);
    let levels = ctx.pick([1, 64, 1_000], [1, 8, 50]);
    let window = ctx.pick(Duration::from_secs(3), Duration::from_millis(150));
    let cap = ctx.pick(20_000, 2_000);
    let template = ctx.dir.join("turns-template.db");
    let ids = ceiling::baseline_db(&template, sessions)?;
    let run_db = ctx.dir.join("turns-run.db");
    let naive_window = ctx.pick(Duration::from_secs(1), Duration::from_millis(100));
    // For profiling one configuration: `DS_BENCH_TURNS_ONLY="c=1000 FULL group"`.
    let only = std::env::var("DS_BENCH_TURNS_ONLY").ok();
    let configs: Vec<Config> = SYNCS
        .into_iter()
        .flat_map(|sync| {
            [true, false].into_iter().flat_map(move |group| {
                levels.into_iter().map(move |concurrency| Config {
                    sync,
                    group,
                    concurrency,
                })
            })
        })
        .filter(|c| only.as_deref().is_none_or(|o| c.label().contains(o)))
        .collect();
    // Per configuration: its samples and the naive turn measured just before each.
    let mut samples: Vec<(Vec<Sample>, Vec<f64>)> = vec![Default::default(); configs.len()];
    // At c = 1 with group commit: bare turns (`floor`) measured just after, per repeat.
    let mut bare: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for repeat in 0..ctx.repeats {
        for ((config, (out, naive)), bare) in configs.iter().zip(samples.iter_mut()).zip(&mut bare)
        {
            db::copy(&template, &run_db)?;
            let base = ceiling::naive_turns_per_s(&run_db, config.sync, &ids, naive_window)?;
            let sample = measure(&run_db, *config, &ids, window, cap)?;
            if config.concurrency == 1 && config.group {
                let floor = actix_rt::System::new().block_on(async {
                    let floor = Floor::start(&run_db, config.sync, &ids, Writes::NaiveTurn)?;
                    let rate = floor.turns_per_s(naive_window).await;
                    floor.stop();
                    rate
                })?;
                ctx.log(format_args!(
                    "turns repeat {repeat}: bare turns c=1 {}: {floor:.0}",
                    config.sync.as_pragma()
                ));
                bare.push(floor);
            }
            ctx.log(format_args!(
                "turns repeat {repeat}: {}: {:.0} (naive {base:.0}, writer batch {:.1})",
                config.label(),
                sample.turns_per_s,
                sample.batch
            ));
            out.push(sample);
            naive.push(base);
        }
    }
    let mut rows = Vec::new();
    let mut all_naive = [Vec::new(), Vec::new()];
    for ((config, (s, naive)), bare) in configs.iter().zip(&samples).zip(bare) {
        let sync = config.sync.as_pragma();
        let baseline = Row::new(
            NAME,
            format!("naive {sync}, adjacent"),
            "turns/s",
            naive.clone(),
        );
        all_naive[usize::from(config.sync == Synchronous::Normal)].extend(naive);
        let batches: Vec<f64> = s.iter().map(|x| x.batch).collect();
        let mut row = Row::new(
            NAME,
            config.label(),
            "turns/s",
            s.iter().map(|x| x.turns_per_s).collect(),
        )
        .vs(&baseline)
        .note(format!(
            "writer batch (requests per transaction) median {:.1}",
            crate::report::median(&batches)
        ));
        let top = config.concurrency == levels[levels.len() - 1];
        if top && config.group && config.sync == Synchronous::Full {
            let met = row.median() >= 15_000.0 && row.ratio().unwrap_or(0.0) >= 6.0;
            row = row.target(">= 15,000/s and >= 6x naive", met);
        }
        let bare = (!bare.is_empty()).then(|| {
            Row::new(
                NAME,
                format!("bare turns/s c=1 {sync} (the hand-offs alone)"),
                "turns/s",
                bare,
            )
            .vs(&baseline)
            .note("the naive turn's two commits on a writer thread, reached as a turn reaches the runtime's (caller -> actor -> writer -> actor, twice, -> caller), no runtime: the floor of c=1 under this architecture")
        });
        if let Some(bare) = bare.as_ref().filter(|_| config.sync == Synchronous::Full) {
            // Relative to the floor: per repeat, the runtime's rate over the bare loop's
            // measured right after it.
            let x = row.ratio_to_floor(bare);
            row = row.target(format!(">= 0.9x the bare loop (is {x:.2}x)"), x >= 0.9);
        }
        rows.push(row);
        rows.extend(bare);
    }
    for (sync, naive) in SYNCS.into_iter().zip(all_naive) {
        let name = format!("naive turn {} (all runs)", sync.as_pragma());
        rows.push(Row::new(NAME, name, "turns/s", naive));
    }
    Ok(rows)
}

/// Measures one configuration in its own actix system on the database at `path`.
pub fn measure(
    path: &Path,
    config: Config,
    ids: &[SessionId],
    window: Duration,
    cap: usize,
) -> BenchResult<Sample> {
    let path = path.to_path_buf();
    actix_rt::System::new().block_on(drive(path, config, ids, window, cap))
}

async fn drive(
    path: PathBuf,
    config: Config,
    ids: &[SessionId],
    window: Duration,
    cap: usize,
) -> BenchResult<Sample> {
    let rt = Runtime::builder()
        .database(path)
        .runner(Empty)
        .synchronous(config.sync)
        .group_commit(config.group)
        .sweep_on_start(false)
        .start()
        .await?;
    let exec = rt.execution();
    // Spawn every actor before the window: interrupting an idle session writes nothing.
    futures::future::try_join_all(ids.iter().map(|id| exec.interrupt(id, None))).await?;
    let before = rt.stats().persistence;
    let (done, elapsed) = resume_loop(&exec, ids, config.concurrency, window, cap).await?;
    let after = rt.stats().persistence;
    rt.shutdown().await;
    let transactions = after
        .transactions
        .saturating_sub(before.transactions)
        .max(1);
    Ok(Sample {
        turns_per_s: done as f64 / elapsed,
        batch: after.requests.saturating_sub(before.requests) as f64 / transactions as f64,
    })
}

/// Drives turns through the public API: `c` tasks each `resume` their share of `ids` in a loop
/// until `window` has passed or `cap` turns were issued. Returns the turns completed and the
/// seconds until the last one returned. Every turn must end `Succeeded`.
pub async fn resume_loop(
    exec: &Execution,
    ids: &[SessionId],
    c: usize,
    window: Duration,
    cap: usize,
) -> BenchResult<(usize, f64)> {
    let issued = Cell::new(0_usize);
    let started = Instant::now();
    let deadline = started + window;
    let tasks = (0..c).map(|k| {
        let issued = &issued;
        let mine: Vec<&SessionId> = ids.iter().skip(k % ids.len()).step_by(c).collect();
        async move {
            let mut done = 0_usize;
            while issued.get() < cap && Instant::now() < deadline {
                issued.set(issued.get() + 1);
                let terminal = exec.resume(mine[done % mine.len()]).await?;
                if terminal != Terminal::Succeeded {
                    return Err(format!("turn ended {terminal:?}").into());
                }
                done += 1;
            }
            BenchResult::Ok(done)
        }
    });
    let done: usize = futures::future::try_join_all(tasks)
        .await?
        .into_iter()
        .sum();
    Ok((done, started.elapsed().as_secs_f64()))
}
