//! `latency`: one session, sequential turns. *wake → drain start*: the time from just before
//! `wake` to the first instant of the drain (the runner timestamps it); *whole turn*: a `resume`
//! call to its return. p50 and p99 per repeat. Baseline: the latency of one raw single-row
//! UPDATE transaction on a copy of the database beside it, timed between the turns (the claim
//! has to commit before the drain may start, so one commit is the floor of the first figure and
//! two commits the floor of the second). Beside them, a *bare turn* (`floor`): the same
//! thread hand-offs around two raw commits, without the runtime: the floor of its overhead.
//! Under NORMAL the overhead's target is relative to that floor (≤ 1.5× the bare turn's
//! hand-offs, per repeat); under FULL it is ≤ 50 µs.

use std::path::Path;
use std::time::Instant;

use durable_sessions::{Runtime, SessionId, Synchronous};
use futures::StreamExt;

use crate::ceiling::SYNCS;
use crate::db::{self, Raw};
use crate::floor::{Floor, Writes};
use crate::report::{median, percentile, Row};
use crate::runners::Stamp;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "latency";

/// Per-repeat percentiles (µs) of one synchronous setting.
#[derive(Debug, Default)]
struct Series {
    commit: [Vec<f64>; 2],
    shaped: [Vec<f64>; 2],
    wake: [Vec<f64>; 2],
    resume: [Vec<f64>; 2],
    whole: [Vec<f64>; 2],
    bare: [Vec<f64>; 2],
    /// The slowest whole turn of each repeat: where a checkpoint inside a commit shows when
    /// it is rarer than one turn in a hundred.
    whole_max: Vec<f64>,
    /// The mean whole turn of each repeat: what the turns cost in total, rare stalls included.
    whole_mean: Vec<f64>,
}

impl Series {
    fn push(which: &mut [Vec<f64>; 2], samples: &[f64]) {
        which[0].push(percentile(samples, 50.0));
        which[1].push(percentile(samples, 99.0));
    }
}

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let n = ctx.pick(400, 40);
    let path = ctx.dir.join("latency.db");
    db::remove(&path);
    db::create(&path)?;
    let ids = db::seed_sessions(&path, 1, 0)?;
    // The raw commits go to a copy beside it: same filesystem and moment, but they must not
    // invalidate the runtime's page caches (another connection writing the same file would).
    let raw_path = ctx.dir.join("latency-raw.db");
    db::copy(&path, &raw_path)?;
    // The bare turns' writer commits to a copy of its own, for the same reason.
    let bare_path = ctx.dir.join("latency-bare.db");
    db::copy(&path, &bare_path)?;
    let mut series = [Series::default(), Series::default()];
    for repeat in 0..ctx.repeats {
        for (i, sync) in SYNCS.into_iter().enumerate() {
            let t = actix_rt::System::new()
                .block_on(turns(&path, &raw_path, &bare_path, sync, &ids[0], n))?;
            let s = &mut series[i];
            Series::push(&mut s.commit, &t.commits);
            Series::push(&mut s.shaped, &t.shaped);
            Series::push(&mut s.wake, &t.wake);
            Series::push(&mut s.resume, &t.resume);
            Series::push(&mut s.whole, &t.whole);
            Series::push(&mut s.bare, &t.bare);
            s.whole_max.push(percentile(&t.whole, 100.0));
            s.whole_mean
                .push(t.whole.iter().sum::<f64>() / t.whole.len().max(1) as f64);
            ctx.log(format_args!(
                "latency repeat {repeat} {}: commit p50 {:.0} µs, wake->drain-start p50 {:.0} µs, \
                 whole turn p50 {:.0} µs, bare turn p50 {:.0} µs",
                sync.as_pragma(),
                s.commit[0][repeat],
                s.wake[0][repeat],
                s.whole[0][repeat],
                s.bare[0][repeat]
            ));
        }
    }
    let mut rows = Vec::new();
    for (sync, s) in SYNCS.into_iter().zip(series) {
        let name = sync.as_pragma();
        let full = sync == Synchronous::Full;
        let [c50, c99] = s.commit;
        let c50_samples = c50.clone();
        let [s50, _] = s.shaped;
        let [w50, w99] = s.wake;
        let [r50, r99] = s.resume;
        let [t50, t99] = s.whole;
        let [b50, _] = s.bare;
        let bare_each: Vec<f64> = b50
            .iter()
            .zip(&c50_samples)
            .map(|(bare, commit)| bare - 2.0 * commit)
            .collect();
        let t50_samples = t50.clone();
        let commit50 = Row::new(NAME, format!("commit p50 {name}"), "µs", c50);
        let commit99 = Row::new(NAME, format!("commit p99 {name}"), "µs", c99);
        let shaped50 = Row::new(
            NAME,
            format!("raw claim-shaped commit p50 {name}"),
            "µs",
            s50,
        )
        .vs(&commit50)
        .note("the claim transaction's statements by hand: SQL cost without the actors");
        let mut wake50 =
            Row::new(NAME, format!("wake->drain-start p50 {name}"), "µs", w50).vs(&commit50);
        let wake99 =
            Row::new(NAME, format!("wake->drain-start p99 {name}"), "µs", w99).vs(&commit99);
        let resume50 =
            Row::new(NAME, format!("resume->drain-start p50 {name}"), "µs", r50).vs(&commit50);
        let resume99 =
            Row::new(NAME, format!("resume->drain-start p99 {name}"), "µs", r99).vs(&commit99);
        let mut whole50 = Row::new(NAME, format!("whole turn p50 {name}"), "µs", t50).vs(&commit50);
        let mut whole99 = Row::new(NAME, format!("whole turn p99 {name}"), "µs", t99).vs(&commit99);
        if !full {
            let p99 = median(&whole99.samples);
            whole99 = whole99.target("<= 500 µs (#15)", p99 <= 500.0);
        }
        // The runtime's own share of a turn: per repeat, the whole turn's p50 less the two
        // commits timed beside it.
        let each: Vec<f64> = t50_samples
            .iter()
            .zip(&c50_samples)
            .map(|(whole, commit)| whole - 2.0 * commit)
            .collect();
        let bare50 = Row::new(NAME, format!("bare turn p50 {name}"), "µs", b50)
            .vs(&commit50)
            .note("caller -> actor on an arbiter -> writer thread -> actor, twice, -> caller, around two raw commits: no runtime");
        let bare_overhead = Row::new(
            NAME,
            format!("thread hand-offs of a bare turn p50 {name}"),
            "µs",
            bare_each,
        )
        .note("bare turn p50 - 2 x commit p50, per repeat: the overhead's floor under this architecture");
        let overhead = Row::new(
            NAME,
            format!("runtime overhead per turn p50 {name}"),
            "µs",
            each,
        )
        .vs(&bare_overhead)
        .note("whole turn p50 - 2 x commit p50, per repeat");
        let overhead = if full {
            let over = overhead.median();
            overhead.target("<= 50 µs (#15)", over <= 50.0)
        } else {
            // Relative to the floor: per repeat, the overhead over the bare turn's hand-offs
            // timed beside it (their cost is the architecture's and the machine's).
            let x = overhead.ratio_to_floor(&bare_overhead);
            overhead.target(
                format!("<= 1.5x the bare turn's hand-offs (is {x:.2}x)"),
                x <= 1.5,
            )
        };
        let whole_mean = Row::new(NAME, format!("whole turn mean {name}"), "µs", s.whole_mean);
        let whole_max = Row::new(NAME, format!("whole turn max {name}"), "µs", s.whole_max).note(
            "the slowest of the repeat's turns: a checkpoint inside a commit, if one fell there",
        );
        if full {
            // Judged per repeat against the commits timed between that repeat's turns: the
            // median over repeats of (figure − floor).
            let excess = |row: &Row, commits: f64| -> f64 {
                let each: Vec<f64> = row
                    .samples
                    .iter()
                    .zip(&commit50.samples)
                    .map(|(x, c)| x - commits * c)
                    .collect();
                median(&each)
            };
            let over = excess(&wake50, 1.0);
            wake50 = wake50.target(
                format!("<= commit p50 + 100 µs (is +{over:.0})"),
                over <= 100.0,
            );
            let over = excess(&whole50, 2.0);
            whole50 = whole50.target(
                format!("<= 2 commits + 150 µs (is +{over:.0})"),
                over <= 150.0,
            );
        }
        rows.extend([
            commit50,
            commit99,
            shaped50,
            wake50,
            wake99,
            resume50,
            resume99,
            whole50,
            whole99,
            whole_mean,
            whole_max,
            overhead,
            bare50,
            bare_overhead,
        ]);
    }
    Ok(rows)
}

/// The µs samples of one run.
#[derive(Debug, Default)]
struct Samples {
    /// Raw single-row UPDATE transactions, timed between the turns.
    commits: Vec<f64>,
    /// Raw transactions with the claim's statements, timed between the turns.
    shaped: Vec<f64>,
    /// Just before `wake` → the drain's first instant.
    wake: Vec<f64>,
    /// Just before `resume` → the drain's first instant (the first half of a whole turn).
    resume: Vec<f64>,
    /// `resume` call → its return.
    whole: Vec<f64>,
    /// A bare turn ([`Floor::turn`]) call → its return.
    bare: Vec<f64>,
}

/// Times, `n` times over, interleaved: a raw commit, a wake-started turn, a raw commit, a resume,
/// a bare turn — of one session, on one file (the raw commits and the bare turn's on copies
/// beside it), so baseline and figure see the same moment of a noisy disk.
async fn turns(
    path: &Path,
    raw_path: &Path,
    bare_path: &Path,
    sync: Synchronous,
    id: &SessionId,
    n: usize,
) -> BenchResult<Samples> {
    let mut raw = Raw::open(raw_path, sync, std::slice::from_ref(id))?;
    let floor = Floor::start(bare_path, sync, std::slice::from_ref(id), Writes::Commits)?;
    let (runner, mut starts) = Stamp::new();
    let rt = Runtime::builder()
        .database(path.to_path_buf())
        .runner(runner)
        .synchronous(sync)
        .sweep_on_start(false)
        .start()
        .await?;
    let exec = rt.execution();
    // Warm up: spawn the actor, prepare the writer's statements.
    for _ in 0..5 {
        timed(exec.resume(id)).await??;
    }
    while starts.try_recv().is_ok() {}
    let mut s = Samples::default();
    let us = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e6;
    for _ in 0..n {
        s.commits.extend(db::latencies(1, || raw.commit())?);
        s.shaped.extend(db::latencies(1, || raw.claim_shaped())?);
        let before = Instant::now();
        exec.wake(id, None).await?;
        let start = timed(starts.next()).await?.ok_or("the runner stopped")?;
        timed(exec.await_idle(id)).await??;
        s.wake.push(us(before, start));

        s.commits.extend(db::latencies(1, || raw.commit())?);
        let before = Instant::now();
        timed(exec.resume(id)).await??;
        s.whole.push(us(before, Instant::now()));
        let start = starts.try_recv().map_err(|_| "the drain did not stamp")?;
        s.resume.push(us(before, start));

        let before = Instant::now();
        timed(floor.turn()).await??;
        s.bare.push(us(before, Instant::now()));
    }
    rt.shutdown().await;
    floor.stop();
    Ok(s)
}
