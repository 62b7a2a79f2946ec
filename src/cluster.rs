//! A node's part in sharing its database with other nodes (PostgreSQL): it carries out what the
//! database signals — a wake or an interrupt another node received for a session this node
//! owns, events other nodes committed (for live followers here), sessions other nodes deleted
//! (their streams here end, their actors here stop), a rescan, a lost lease — and
//! every quarter lease (at most every second) takes over the sessions of dead nodes, with the restart sweep's rules
//! (budget, notice, interrupt fence, `aborted`).
//!
//! Nothing here talks to another node: every signal comes from a row and a `NOTIFY` another
//! node committed, and a lost notification only delays work (the periodic takeover and the
//! rescans find the rows).

use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;

use crate::config::RuntimeConfig;
use crate::id::SessionId;
use crate::journal::{Nudge, Signal};
use crate::outcome::InterruptReason;
use crate::recovery;
use crate::registry::Registry;
use crate::session::messages::{Interrupt, Wake};
use crate::session::Environment;

/// Starts the node's loop when the journal is shared (otherwise nothing); `Runtime::start` calls
/// it once its start-up sweep returned, so the two never take the same turns over at once.
pub(crate) fn start(registry: Arc<Registry>, env: Arc<Environment>, config: &RuntimeConfig) {
    let Some(mut signals) = env.journal.take_signals() else {
        return;
    };
    // Often enough that a dead node's turns resume within a second of its lease lapsing: a
    // tick is two reads when nothing is to be taken over.
    let tick = (config.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let node = Node {
        registry,
        env,
        max_resume_attempts: config.max_resume_attempts,
        takeover: config.takeover,
    };
    actix_rt::spawn(async move {
        let mut next = tokio::time::Instant::now() + tick;
        loop {
            if node.registry.is_closed() {
                break;
            }
            match tokio::time::timeout_at(next, signals.recv()).await {
                Ok(Some(signal)) => node.handle(signal).await,
                Ok(None) => break,
                Err(_) => {
                    node.take_over().await;
                    next = tokio::time::Instant::now() + tick;
                }
            }
        }
    });
}

/// What the loop works with.
struct Node {
    registry: Arc<Registry>,
    env: Arc<Environment>,
    max_resume_attempts: u32,
    /// Whether this node takes over dead nodes' turns on its own.
    takeover: bool,
}

impl Node {
    async fn handle(&self, signal: Signal) {
        match signal {
            Signal::Nudge { session, nudge } => self.nudge(session, nudge).await,
            Signal::Events(batches) => self.env.journal.relay(batches).await,
            Signal::ManyEvents => self.env.journal.resync(),
            Signal::Deleted(deleted) => {
                for (session, _) in &deleted {
                    self.registry.retire(session);
                }
                self.env.journal.relay_deleted(deleted);
            }
            Signal::Rescan => {
                self.take_over().await;
                self.serve_missed().await;
            }
            Signal::LeaseLost { generation } => {
                log::error!(
                    "node {}: lease lost; cancelling every local turn of the sessions acquired \
                     under its id of generation {generation} (other nodes take them over)",
                    self.env.claimant()
                );
                self.registry.fence(generation);
            }
        }
    }

    /// Carries out, here, what another node received for a session this node owns.
    async fn nudge(&self, session: SessionId, nudge: Nudge) {
        let delivered = match nudge {
            Nudge::Wake(seq) => {
                self.registry
                    .deliver(&self.env, &session, || {
                        (
                            Wake {
                                seq: Some(seq),
                                refused: None,
                            },
                            (),
                        )
                    })
                    .await
            }
            Nudge::Interrupt(seq) => {
                self.registry
                    .deliver(&self.env, &session, || {
                        let (reply, _answer) = oneshot::channel();
                        let reason = InterruptReason::User;
                        (
                            Interrupt {
                                seq: Some(seq),
                                reason,
                                reply,
                            },
                            (),
                        )
                    })
                    .await
            }
        };
        if let Err(e) = delivered {
            log::warn!("session {session}: cannot carry out {nudge:?}: {e}");
        }
    }

    /// Carries out the wakes and interrupts other nodes routed here whose notification may have
    /// been lost (the listener was reconnecting, say): the rows say what is owed.
    async fn serve_missed(&self) {
        match self.env.journal.missed_nudges().await {
            Ok(missed) => {
                for (session, nudge) in missed {
                    log::info!("session {session}: carrying out {nudge:?} found by a rescan");
                    self.nudge(session, nudge).await;
                }
            }
            Err(e) => log::warn!(
                "node {}: rescan of owed nudges failed: {e}",
                self.env.claimant()
            ),
        }
    }

    /// The restart sweep over what dead nodes left: their claimed turns and owed prompts.
    async fn take_over(&self) {
        if !self.takeover {
            return;
        }
        let swept = recovery::resume_suspended_sessions(
            &self.registry,
            &self.env,
            self.max_resume_attempts,
        )
        .await;
        match swept {
            Ok(report) if !report.resumed.is_empty() || !report.terminalized.is_empty() => {
                log::info!(
                    "node {}: took over {} turns ({} aborted, {} interrupted)",
                    self.env.claimant(),
                    report.resumed.len(),
                    report.terminalized.len(),
                    report.interrupted.len()
                );
            }
            Ok(_) => {}
            Err(e) => log::warn!("node {}: takeover sweep failed: {e}", self.env.claimant()),
        }
    }
}
