//! The thread hand-offs of a turn with nothing else: the `latency` scenario's floor of the
//! runtime's overhead under its architecture.
//!
//! A bare turn takes the path a runtime turn takes between threads, and does nothing on the
//! way: the caller sends a message to an actor on an arbiter of its own (`Addr::send`, as
//! `Execution::resume` does); the actor's handler answers at once and spawns the turn, which
//! sends a write to a plain writer thread (a std channel, as the runtime's writer) and awaits
//! its answer (a oneshot), does the same for the second write, then answers the caller. In
//! `latency` each write is the raw single-row commit the scenario times as its baseline, so
//! "bare turn − 2 commits" is what the hops alone cost on this machine, at this moment: no
//! coordinator, no journal, no events, no registry. In `turns` (c = 1) the two writes are the
//! naive turn's claim and release, so a loop of bare turns is the naive loop with the
//! architecture's hand-offs added.

use std::path::Path;
use std::sync::mpsc;

use actix::prelude::*;
use durable_sessions::{SessionId, Synchronous};
use tokio::sync::oneshot;

use crate::db::Raw;
use crate::BenchResult;

/// What a bare turn's two writes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Two raw single-row commits ([`Raw::commit`]).
    Commits,
    /// The naive turn's claim, then its release ([`Raw::naive_claim_next`]).
    NaiveTurn,
}

/// A write for the bare writer thread and where to answer.
type Write = oneshot::Sender<rusqlite::Result<()>>;

/// The actor that runs bare turns.
struct Bare {
    writer: mpsc::Sender<Write>,
}

impl Actor for Bare {
    type Context = Context<Self>;
}

/// Run one bare turn; its outcome goes to `done`.
#[derive(Message)]
#[rtype(result = "()")]
struct Turn {
    done: oneshot::Sender<rusqlite::Result<()>>,
}

impl Handler<Turn> for Bare {
    type Result = ();

    fn handle(&mut self, turn: Turn, ctx: &mut Context<Self>) {
        let writer = self.writer.clone();
        let commit = move || {
            let (answer, answered) = oneshot::channel();
            let sent = writer.send(answer);
            async move {
                sent.map_err(|_| rusqlite::Error::InvalidQuery)?;
                answered.await.map_err(|_| rusqlite::Error::InvalidQuery)?
            }
        };
        ctx.spawn(
            async move {
                let outcome = async {
                    commit().await?; // the claim
                    commit().await // the terminal
                }
                .await;
                let _ = turn.done.send(outcome);
            }
            .into_actor(self),
        );
    }
}

/// A bare turn's actor, its arbiter and its writer thread.
pub struct Floor {
    addr: Addr<Bare>,
    arbiter: Arbiter,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Floor {
    /// Starts the writer thread (`writes` to `path` with `sync`, rotating over `ids`) and the
    /// actor on an arbiter of its own.
    pub fn start(
        path: &Path,
        sync: Synchronous,
        ids: &[SessionId],
        writes: Writes,
    ) -> BenchResult<Self> {
        let mut raw = Raw::open(path, sync, ids)?;
        let (tx, rx) = mpsc::channel::<Write>();
        let writer = std::thread::Builder::new()
            .name("bench-floor-writer".into())
            .spawn(move || {
                // The claimed session, between a naive turn's two writes.
                let mut claimed: Option<String> = None;
                for answer in rx {
                    let done = match (writes, claimed.take()) {
                        (Writes::Commits, _) => raw.commit(),
                        (Writes::NaiveTurn, None) => raw.naive_claim_next().map(|id| {
                            claimed = Some(id);
                        }),
                        (Writes::NaiveTurn, Some(id)) => raw.naive_release(&id),
                    };
                    let _ = answer.send(done);
                }
            })?;
        let arbiter = Arbiter::new();
        let addr = Bare::start_in_arbiter(&arbiter.handle(), move |_| Bare { writer: tx });
        Ok(Self {
            addr,
            arbiter,
            writer: Some(writer),
        })
    }

    /// Runs one bare turn and returns once its second commit is answered.
    pub async fn turn(&self) -> BenchResult<()> {
        let (done, outcome) = oneshot::channel();
        self.addr.send(Turn { done }).await?;
        outcome.await??;
        Ok(())
    }

    /// Bare turns per second, back to back, for `window` (at least 5).
    pub async fn turns_per_s(&self, window: std::time::Duration) -> BenchResult<f64> {
        let started = std::time::Instant::now();
        let mut done = 0_u32;
        while done < 5 || started.elapsed() < window {
            self.turn().await?;
            done += 1;
        }
        Ok(f64::from(done) / started.elapsed().as_secs_f64())
    }

    /// Stops the actor, its arbiter and the writer thread.
    pub fn stop(mut self) {
        self.arbiter.stop();
        // The actor (and with it the writer's channel) is dropped as its arbiter stops.
        drop(self.addr);
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
