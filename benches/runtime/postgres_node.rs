//! The nodes of the `postgres` scenario that run as child processes (see `child`), the raw
//! client its baselines are timed with, and what the parent and the children share (building a
//! node, creating sessions).
//!
//! - `pg-turns`: a node that creates its share of the sessions, starts their actors (which
//!   takes them for this node), announces `ready`, waits for the parent's line, then resumes
//!   its sessions in a loop for the window and prints what it did.
//! - `pg-owner`: a node that creates sessions and wakes each into a turn whose drain never
//!   ends, announces `ready` once every drain started (every claim committed), and waits to be
//!   killed.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use durable_sessions::{CreateSession, Runner, Runtime, RuntimeBuilder, SessionId};
use futures::channel::oneshot;
use serde_json::{json, Value};

use crate::child::{self, field};
use crate::runners::{Counting, Empty};
use crate::turns::resume_loop;
use crate::{timed, BenchResult};

/// A node of the scenario on `url`: no restart sweep at start (nothing is left to sweep in a
/// fresh database, and the takeover measurement must see the tick do it), `lease`.
pub fn node(url: &str, runner: impl Runner, lease: Duration, name: &str) -> RuntimeBuilder {
    Runtime::builder()
        .postgres(url)
        .runner(runner)
        .lease(lease)
        .node_name(name)
        .sweep_on_start(false)
}

/// Creates `n` top-level sessions through `rt` (concurrently, so they group-commit).
pub async fn create_sessions(rt: &Runtime, n: usize) -> BenchResult<Vec<SessionId>> {
    let sessions = rt.sessions();
    let created = futures::future::try_join_all((0..n).map(|_| {
        sessions.create(CreateSession {
            directory: "/bench".into(),
            ..CreateSession::default()
        })
    }))
    .await?;
    Ok(created.into_iter().map(|c| c.into_info().id).collect())
}

/// Starts every session's actor (an interrupt of an idle session writes nothing), which takes
/// the session for this node.
pub async fn start_actors(rt: &Runtime, ids: &[SessionId]) -> BenchResult<()> {
    let exec = rt.execution();
    timed(futures::future::try_join_all(
        ids.iter().map(|id| exec.interrupt(id, None)),
    ))
    .await??;
    Ok(())
}

/// The `pg-turns` child: `{"url", "n", "c", "window_ms", "cap", "lease_ms", "name"}` →
/// `{"done", "elapsed_s", "batch"}`.
pub fn turns_child(args: &Value) -> BenchResult<Value> {
    let url = args["url"].as_str().ok_or("pg-turns: no url")?.to_owned();
    let name = args["name"].as_str().unwrap_or("node").to_owned();
    let n = field(args, "n")? as usize;
    let c = field(args, "c")? as usize;
    let window = Duration::from_millis(field(args, "window_ms")? as u64);
    let cap = field(args, "cap")? as usize;
    let lease = Duration::from_millis(field(args, "lease_ms")? as u64);
    actix_rt::System::new().block_on(async move {
        let rt = node(&url, Empty, lease, &name).start().await?;
        let ids = create_sessions(&rt, n).await?;
        start_actors(&rt, &ids).await?;
        child::announce("ready", &json!({ "sessions": ids.len() }));
        let go = child::from_parent();
        go.await.map_err(|_| "the parent went away")?;
        let before = rt.stats().persistence;
        let (done, elapsed) = resume_loop(&rt.execution(), &ids, c, window, cap).await?;
        let after = rt.stats().persistence;
        rt.shutdown().await;
        let transactions = after
            .transactions
            .saturating_sub(before.transactions)
            .max(1);
        let batch = after.requests.saturating_sub(before.requests) as f64 / transactions as f64;
        Ok(json!({ "done": done, "elapsed_s": elapsed, "batch": batch }))
    })
}

/// The `pg-owner` child: `{"url", "n", "lease_ms"}`. Never returns on its own: the parent kills
/// it once it announced `ready` (`{"sessions", "setup_s"}`).
pub fn owner_child(args: &Value) -> BenchResult<Value> {
    let url = args["url"].as_str().ok_or("pg-owner: no url")?.to_owned();
    let n = field(args, "n")? as usize;
    let lease = Duration::from_millis(field(args, "lease_ms")? as u64);
    actix_rt::System::new().block_on(async move {
        let started = Instant::now();
        let runner = Counting::holding(n);
        let rt = node(&url, runner.clone(), lease, VICTIM).start().await?;
        let ids = create_sessions(&rt, n).await?;
        let exec = rt.execution();
        timed(futures::future::try_join_all(
            ids.iter().map(|id| exec.wake(id, None)),
        ))
        .await??;
        // A drain starts only after its claim committed.
        timed(runner.reached()).await?;
        child::announce(
            "ready",
            &json!({ "sessions": runner.started(), "setup_s": started.elapsed().as_secs_f64() }),
        );
        // Until killed (or the parent goes away).
        let _ = child::from_parent().await;
        rt.shutdown().await;
        Ok(json!({}))
    })
}

/// A plain client on its own thread (the sync client must not run inside the actix system)
/// timing raw transactions in a table of its own: `BEGIN; INSERT; COMMIT` (three round trips,
/// one commit) and a single autocommitted `INSERT` (one round trip, one commit), and a round
/// trip that writes nothing (a prepared `SELECT 1`).
#[derive(Debug)]
pub struct RawPg {
    requests: Option<mpsc::Sender<RawRequest>>,
    thread: Option<JoinHandle<()>>,
}

/// One timing asked of [`RawPg`]'s thread, and where the µs (or the error) go.
type RawRequest = (Raw, oneshot::Sender<Result<f64, String>>);

/// What [`RawPg`] times.
#[derive(Debug, Clone, Copy)]
pub enum Raw {
    /// `BEGIN`, a one-row `INSERT`, `COMMIT`.
    Transaction,
    /// A one-row `INSERT` on its own (the server commits it).
    Autocommit,
    /// A prepared `SELECT 1`: one round trip, no commit.
    RoundTrip,
    /// Not a timing: how many seconds the lease of the node named [`VICTIM`] has left (negative
    /// once it lapsed), by the database's clock.
    LeaseLeft,
}

/// The node name of the `pg-owner` child.
pub const VICTIM: &str = "victim";

impl RawPg {
    /// Connects to `url` and creates the table `raw_commit`.
    pub fn open(url: &str) -> BenchResult<Self> {
        let url = url.to_owned();
        let (requests, inbox) = mpsc::channel::<RawRequest>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let thread = std::thread::spawn(move || {
            let setup = (|| {
                let mut client = ::postgres::Client::connect(&url, ::postgres::NoTls)?;
                client.batch_execute(
                    "CREATE TABLE IF NOT EXISTS raw_commit \
                     (id BIGSERIAL PRIMARY KEY, v BIGINT NOT NULL)",
                )?;
                let insert = client.prepare("INSERT INTO raw_commit (v) VALUES ($1)")?;
                let select = client.prepare("SELECT 1")?;
                Ok::<_, ::postgres::Error>((client, insert, select))
            })();
            let (mut client, insert, select) = match setup {
                Ok(ok) => {
                    let _ = ready_tx.send(Ok(()));
                    ok
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let mut v = 0_i64;
            while let Ok((what, reply)) = inbox.recv() {
                v += 1;
                let t = Instant::now();
                let us = |done: Result<(), ::postgres::Error>| {
                    done.map(|()| t.elapsed().as_secs_f64() * 1e6)
                };
                let done = match what {
                    Raw::Transaction => us(client.transaction().and_then(|mut tx| {
                        tx.execute(&insert, &[&v])?;
                        tx.commit()
                    })),
                    Raw::Autocommit => us(client.execute(&insert, &[&v]).map(drop)),
                    Raw::RoundTrip => us(client.query_one(&select, &[]).map(drop)),
                    Raw::LeaseLeft => client
                        .query_one(
                            "SELECT EXTRACT(EPOCH FROM lease_until - now())::float8 FROM node \
                             WHERE name = $1",
                            &[&VICTIM],
                        )
                        .map(|row| row.get(0)),
                };
                let _ = reply.send(done.map_err(|e| e.to_string()));
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "the raw client's thread died")??;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Times one `what`, in µs ([`Raw::LeaseLeft`]: its answer, in s).
    pub async fn time(&self, what: Raw) -> BenchResult<f64> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .as_ref()
            .ok_or("the raw client is closed")?
            .send((what, tx))
            .map_err(|_| "the raw client's thread died")?;
        Ok(rx.await.map_err(|_| "the raw client's thread died")??)
    }

    /// Times `n` of `what` back to back, outside any actix system, in µs.
    pub fn times(&self, what: Raw, n: usize) -> BenchResult<Vec<f64>> {
        (0..n)
            .map(|_| futures::executor::block_on(self.time(what)))
            .collect()
    }
}

impl Drop for RawPg {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
