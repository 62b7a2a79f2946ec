//! `events`: replay of 1,000,000 stored events of one session (seeded by rusqlite directly: seqs
//! `0..N`) to a subscriber of `Sessions::events(id, None)`,
//! counted until the last seq arrives; events/s. Also timed: `testing::events` (the store's
//! replay query in one call, no runtime). Baseline: a raw rusqlite `SELECT` of the same rows,
//! every column read into owned values.

use std::path::{Path, PathBuf};
use std::time::Instant;

use durable_sessions::{Runtime, SessionId, Synchronous};

use crate::db;
use crate::report::Row;
use crate::runners::Empty;
use crate::{timed, BenchResult, Ctx};

const NAME: &str = "events";

/// Runs the scenario.
pub fn run(ctx: &Ctx) -> BenchResult<Vec<Row>> {
    let n: u64 = ctx.pick(1_000_000, 100_000);
    let path = ctx.dir.join("events.db");
    db::remove(&path);
    db::create(&path)?;
    let t = Instant::now();
    let id = db::seed_events(&path, n)?;
    ctx.log(format_args!(
        "seeded {n} events in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let (mut raw, mut api, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for repeat in 0..ctx.repeats {
        raw.push(raw_select(&path, &id, n)?);
        api.push(actix_rt::System::new().block_on(replay(path.clone(), id.clone(), n))?);
        direct.push(testing_events(&path, &id, n)?);
        ctx.log(format_args!(
            "events repeat {repeat}: raw SELECT {:.0}/s, Sessions::events {:.0}/s, \
             testing::events {:.0}/s",
            raw[repeat], api[repeat], direct[repeat]
        ));
    }
    let raw = Row::new(NAME, format!("raw SELECT of {n}"), "events/s", raw);
    let mut api = Row::new(
        NAME,
        format!("Sessions::events replay of {n}"),
        "events/s",
        api,
    )
    .vs(&raw)
    .note("pages of 1,024 read on the blocking pool, payloads decoded to serde_json::Value");
    let met = api.median() >= 300_000.0;
    api = api.target(">= 300,000/s", met);
    let direct = Row::new(NAME, format!("testing::events of {n}"), "events/s", direct).vs(&raw);
    Ok(vec![api, direct, raw])
}

/// Every stored event through the public replay stream; events/s.
async fn replay(path: PathBuf, id: SessionId, n: u64) -> BenchResult<f64> {
    let rt = Runtime::builder()
        .database(path)
        .runner(Empty)
        .sweep_on_start(false)
        .start()
        .await?;
    let started = Instant::now();
    let mut stream = rt.sessions().events(&id, None).await?;
    let mut count = 0_u64;
    while count < n {
        let event = timed(stream.next())
            .await?
            .ok_or("the stream ended early")??;
        if event.seq != count {
            return Err(format!("expected seq {count}, got {}", event.seq).into());
        }
        count += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop(stream);
    rt.shutdown().await;
    Ok(rate)
}

/// `durable_sessions::testing::events`: the whole log in one store call; events/s.
fn testing_events(path: &Path, id: &SessionId, n: u64) -> BenchResult<f64> {
    let started = Instant::now();
    let events = durable_sessions::testing::events(path, id)?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    if events.len() as u64 != n {
        return Err(format!("testing::events returned {} of {n}", events.len()).into());
    }
    Ok(rate)
}

/// The same rows by rusqlite directly, every column read into owned values; events/s. (The
/// seeded log is one segment, its newest.)
fn raw_select(path: &Path, id: &SessionId, n: u64) -> BenchResult<f64> {
    let conn = db::open(path, Synchronous::Full)?;
    let started = Instant::now();
    let mut stmt = conn.prepare(
        "SELECT aggregate_id, seq, type, data, time FROM event INDEXED BY event_log \
         WHERE stream = (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1) AND recent = 0 \
           AND seq > ?2 \
         UNION ALL \
         SELECT aggregate_id, seq, type, data, time FROM event INDEXED BY event_recent \
         WHERE stream = (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1) AND recent = 1 \
           AND seq > ?2 ORDER BY 2",
    )?;
    let mut rows = stmt.query(rusqlite::params![id.as_str(), -1_i64])?;
    let mut count = 0_u64;
    while let Some(row) = rows.next()? {
        let record: (String, i64, String, String, i64) = (
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
        );
        std::hint::black_box(record);
        count += 1;
    }
    if count != n {
        return Err(format!("raw SELECT returned {count} of {n}").into());
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
