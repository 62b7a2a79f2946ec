//! The [`Supervisor`]: passivates idle session actors on a timer, releases the store's
//! unused memory and the threads' allocator caches after a wave of passivation, and (with a
//! retention policy) compacts the event logs of idle sessions on a timer of its own.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;

use super::Registry;
use crate::config::RetainEvents;
use crate::journal::Journal;
use crate::session::messages::Passivate;
use crate::thread_caches;

/// The hook [`crate::RuntimeBuilder::after_passivation`] installs.
pub(crate) type AfterPassivation = Arc<dyn Fn(usize) + Send + Sync>;

/// How many actors a passivation wave must have stopped before the runtime releases memory.
const RELEASE_AFTER: usize = 64;

/// The most `Passivate` requests in flight at once. A wave asks its idle actors in batches of
/// this many, each batch answered before the next is sent: sending them all at once would queue
/// one wake-up per actor in the arbiters' run queues (100,000 idle actors: 50,000 on each of two
/// arbiters), which grow to that peak and never shrink, and would hold up the live sessions'
/// messages behind the whole wave.
const PASSIVATE_BATCH: usize = 1024;

/// How long a wave waits for one actor to answer its `Passivate`.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The supervisor: passivates idle session actors on a timer, and once a wave of passivation is
/// over (the live actors down to a quarter of their peak, at least [`RELEASE_AFTER`] fewer, and
/// no fewer than on the tick before) releases SQLite's unused memory and calls the
/// `after_passivation` hook.
pub(crate) struct Supervisor {
    registry: Arc<Registry>,
    journal: Journal,
    idle_timeout: Duration,
    after_passivation: Option<AfterPassivation>,
    /// The most live actors since memory was last released.
    peak: usize,
    /// Live actors at the previous tick.
    last: usize,
    /// A passivation wave is still sending its `Passivate` batches.
    passivating: bool,
    /// The retention policy, if any.
    retain: Option<RetainEvents>,
    /// A compaction pass is running.
    compacting: bool,
}

impl Supervisor {
    pub(crate) fn new(
        registry: Arc<Registry>,
        journal: Journal,
        idle_timeout: Duration,
        after_passivation: Option<AfterPassivation>,
    ) -> Self {
        Self {
            registry,
            journal,
            idle_timeout,
            after_passivation,
            peak: 0,
            last: 0,
            passivating: false,
            retain: None,
            compacting: false,
        }
    }

    /// Compacts idle sessions' event logs with `policy` every `policy.interval`.
    pub(crate) fn retain_events(mut self, policy: Option<RetainEvents>) -> Self {
        self.retain = policy;
        self
    }

    /// Starts a compaction pass unless one is running (sessions with a turn in this process are
    /// skipped; a claimed one is skipped by the store).
    fn compact(&mut self, policy: RetainEvents, ctx: &mut Context<Self>) {
        if self.compacting {
            return;
        }
        self.compacting = true;
        let (journal, busy) = (self.journal.clone(), self.registry.active());
        ctx.spawn(
            async move {
                match journal
                    .compact_events(policy, busy, crate::journal::now_ms())
                    .await
                {
                    Ok(done) if done.sessions > 0 => log::debug!(
                        "retention: compacted {} sessions ({} events)",
                        done.sessions,
                        done.events
                    ),
                    Ok(_) => {}
                    Err(e) => log::warn!("retention: a compaction pass failed: {e}"),
                }
            }
            .into_actor(self)
            .map(|(), act, _| act.compacting = false),
        );
    }

    /// Asks every actor idle longer than `idle` to stop, [`PASSIVATE_BATCH`] at a time; ticks
    /// that come while a wave is still being sent start none.
    fn passivate_idle(&mut self, idle: Duration, ctx: &mut Context<Self>) {
        if self.passivating {
            return;
        }
        let idle_actors = self.registry.idle_actors(idle);
        if idle_actors.is_empty() {
            return;
        }
        self.passivating = true;
        ctx.spawn(
            async move {
                let mut rest = idle_actors.into_iter();
                loop {
                    let batch: Vec<_> = rest.by_ref().take(PASSIVATE_BATCH).collect();
                    if batch.is_empty() {
                        break;
                    }
                    // An actor that stopped meanwhile answers with a mailbox error, and one whose
                    // arbiter is stuck times out: neither holds up passivation for good.
                    let asks = batch
                        .iter()
                        .map(|addr| addr.send(Passivate).timeout(ASK_TIMEOUT));
                    futures::future::join_all(asks).await;
                }
            }
            .into_actor(self)
            .map(|(), act, _| act.passivating = false),
        );
    }

    /// After a passivation wave: releases the store's unused memory and the threads' allocator
    /// caches, then calls the hook.
    fn release_after_wave(&mut self, ctx: &mut Context<Self>) {
        let live = self.registry.stats().live;
        let settled = live >= self.last;
        self.last = live;
        self.peak = self.peak.max(live);
        let freed = self.peak - live;
        // While actors are still stopping, their memory is still being freed: wait a tick.
        if !settled || freed < RELEASE_AFTER || live > self.peak / 4 {
            return;
        }
        self.peak = live;
        let (journal, hook) = (self.journal.clone(), self.after_passivation.clone());
        let arbiters = self.registry.arbiters().to_vec();
        ctx.spawn(
            async move {
                // What the threads that ran the wave keep cached, given back before the hook
                // trims the heaps (see `thread_caches`): the arbiters', this thread's, and
                // (after its SQLite caches shrank) the writer's.
                let mut taken = vec![thread_caches::take()];
                for arbiter in &arbiters {
                    let (tx, rx) = oneshot::channel();
                    // An arbiter that stopped takes nothing, and one that is stuck is skipped.
                    if arbiter.spawn(async move {
                        let _ = tx.send(thread_caches::take());
                    }) {
                        if let Ok(Ok(held)) = actix_rt::time::timeout(ASK_TIMEOUT, rx).await {
                            taken.push(held);
                        }
                    }
                }
                taken.push(journal.release_memory().await);
                thread_caches::give_back(taken);
                if let Some(hook) = &hook {
                    hook(freed);
                }
            }
            .into_actor(self),
        );
    }
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let idle = self.idle_timeout;
        let tick = (idle / 2).clamp(Duration::from_millis(5), Duration::from_secs(5));
        ctx.run_interval(tick, move |act, ctx| {
            if act.registry.is_closed() {
                return;
            }
            // Actors asked on an earlier tick have stopped by now, unless a wave is still
            // being sent.
            if !act.passivating {
                act.release_after_wave(ctx);
            }
            act.passivate_idle(idle, ctx);
        });
        if let Some(policy) = self.retain {
            ctx.run_interval(policy.interval, move |act, ctx| {
                if !act.registry.is_closed() {
                    act.compact(policy, ctx);
                }
            });
        }
    }
}

/// Stops the [`Supervisor`] (at shutdown).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StopSupervisor;

impl Handler<StopSupervisor> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: StopSupervisor, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Answered once the [`Supervisor`] runs (so `start` never returns before it started).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Ready;

impl Handler<Ready> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: Ready, _: &mut Self::Context) {}
}
