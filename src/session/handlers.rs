//! How a `SessionActor` handles each message: load (and, with several nodes, own) the session
//! first, then hand the message to the coordinator — or, when another live node owns the
//! session, forward what must reach it through the store.

use std::sync::atomic::Ordering;

use actix::prelude::*;

use super::messages::{
    AwaitIdle, Close, Fence, Heal, Interrupt, Passivate, Resume, Retry, SessionDeleted, Wake,
};
use super::{Forget, Held, SessionActor};
use crate::error::{Error, StoreError};
use crate::journal::{Loaded, Nudge, Ownership};

/// How often a wake or an interrupt waiting for an adoption looks again (see
/// [`super::Host::adopting`]); an adoption takes a sweep's two transactions.
const ADOPTION_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// How often a retry that arrived while a turn settles looks again.
const SETTLING_POLL: std::time::Duration = std::time::Duration::from_millis(2);

impl SessionActor {
    /// Runs `then` once the actor knows its session is stored and who owns it: at once when it
    /// is this node's; otherwise after loading it again (the session may have been created
    /// since; with several nodes, this takes it when no live node owns it), holding the mailbox
    /// meanwhile (`ctx.wait`) so no later message overtakes this one. The arbiter never blocks.
    pub(super) fn when_loaded(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        if self.held == Held::Mine {
            then(self, ctx);
            return;
        }
        let journal = self.env.journal.clone();
        let id = self.id.clone();
        let load = async move { journal.load_session(id).await };
        ctx.wait(load.into_actor(self).map(move |loaded, act, ctx| {
            act.loaded(loaded);
            then(act, ctx);
        }));
    }

    /// Takes in what the actor derives from the store: whether the session is stored, who owns
    /// it, and its durable interrupt fence.
    fn loaded(&mut self, loaded: Result<Loaded, StoreError>) {
        match loaded {
            Ok(Loaded {
                ownership,
                fence,
                node,
            }) => {
                let acquired = matches!(ownership, Ownership::Owned { .. });
                self.stamp
                    .node
                    .store(if acquired { node } else { 0 }, Ordering::Relaxed);
                self.held = match ownership {
                    Ownership::Owned { epoch } => {
                        self.stamp.epoch.store(epoch, Ordering::Relaxed);
                        Held::Mine
                    }
                    Ownership::Elsewhere { .. } => Held::Elsewhere,
                    Ownership::Missing => Held::Unknown,
                };
                if let Some(seq) = fence {
                    self.coordinator.raise_boundary(seq);
                }
            }
            Err(e) => {
                log::error!("session {}: cannot load state: {e}", self.id);
                self.held = Held::Unknown;
            }
        }
    }

    /// Hands `nudge` to the node that owns the session (another live node took it since this
    /// actor loaded, or before): through the store, which notifies that node at COMMIT. If no
    /// live node owns it any more, this node takes it and `then` runs here. Otherwise the actor
    /// stops: it holds nothing of the session.
    fn forward(
        &mut self,
        nudge: Nudge,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>) + 'static,
    ) {
        let journal = self.env.journal.clone();
        let id = self.id.clone();
        let forward = async move { journal.forward(id, nudge).await };
        ctx.wait(
            forward
                .into_actor(self)
                .map(move |forwarded, act, ctx| match forwarded {
                    Ok(Some((epoch, node))) => {
                        act.stamp.epoch.store(epoch, Ordering::Relaxed);
                        act.stamp.node.store(node, Ordering::Relaxed);
                        act.held = Held::Mine;
                        then(act, ctx);
                    }
                    Ok(None) => act.retire(Forget::Stopped, ctx),
                    Err(e) => {
                        log::error!("session {}: cannot forward {nudge:?}: {e}", act.id);
                        act.retire(Forget::Stopped, ctx);
                    }
                }),
        );
    }

    /// Stops the actor and removes its registry entry.
    pub(super) fn retire(&mut self, why: Forget, ctx: &mut Context<Self>) {
        self.env.host.forget(&self.id, self.stamp.generation, why);
        ctx.stop();
    }
}

impl Handler<Wake> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Wake, ctx: &mut Self::Context) {
        if self.env.host.adopting(&self.id) {
            ctx.notify_later(msg, ADOPTION_POLL);
            return;
        }
        let Wake { seq, refused } = msg;
        self.when_loaded(ctx, move |act, ctx| match (act.held, seq) {
            (Held::Mine, seq) => match (seq, act.coordinator.boundary()) {
                (None, Some(interrupt_seq)) => {
                    // An unsequenced wake cannot be ordered against the durable interrupt
                    // request: the coordinator would drop it as stale, so its caller is told why.
                    if let Some(refused) = refused {
                        let _ = refused.send(Error::WakeAfterInterrupt {
                            session_id: act.id.clone(),
                            interrupt_seq,
                        });
                    }
                }
                _ => {
                    let effects = act.coordinator.wake(seq);
                    act.apply(effects, ctx);
                }
            },
            (Held::Elsewhere, Some(seq)) => act.forward(Nudge::Wake(seq), ctx, move |act, ctx| {
                let effects = act.coordinator.wake(Some(seq));
                act.apply(effects, ctx);
            }),
            // An unsequenced wake names no durable work: the owner serves what is pending.
            (Held::Elsewhere, None) => act.retire(Forget::Stopped, ctx),
            (Held::Unknown, _) => {
                log::debug!("session {}: wake for an unknown session dropped", act.id);
            }
        });
    }
}

impl Handler<Resume> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Resume, ctx: &mut Self::Context) {
        self.when_loaded(ctx, move |act, ctx| act.resume(msg, ctx));
    }
}

impl SessionActor {
    /// Runs a forced turn (or joins the running one); with `recovery`, the turn the restart
    /// sweep claimed.
    fn resume(&mut self, msg: Resume, ctx: &mut Context<Self>) {
        match self.held {
            Held::Mine => {}
            Held::Elsewhere => {
                // The turn runs on the node that owns the session; its outcome is not ours to
                // wait for.
                let _ = msg.reply.send(Err(Error::Fenced {
                    session_id: self.id.clone(),
                }));
                self.retire(Forget::Stopped, ctx);
                return;
            }
            Held::Unknown => {
                let _ = msg.reply.send(Err(Error::NotFound {
                    session_id: self.id.clone(),
                }));
                return;
            }
        }
        let effects = self.coordinator.run(msg.reply);
        if let Some(resumption) = msg.recovery {
            self.running.get_or_insert_with(Box::default).recovery = Some(resumption);
        }
        self.apply(effects, ctx);
        // Only a turn this resume started uses the sweep's claim (it may have joined one).
        if let Some(running) = self.running.as_mut() {
            running.recovery = None;
            if running.drain.is_none() {
                self.running = None;
            }
        }
    }
}

impl Handler<Retry> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Retry, ctx: &mut Self::Context) {
        if self.coordinator.phase() == Some(super::coordinator::Phase::Settling) {
            // The turn's terminal is being recorded: it is over, and a caller that saw it
            // commit may retry it now. Asked again once it settled.
            ctx.notify_later(msg, SETTLING_POLL);
            return;
        }
        self.when_loaded(ctx, move |act, ctx| act.retry(msg, ctx));
    }
}

impl SessionActor {
    /// Commits the retry's claim (the mailbox held meanwhile, so nothing starts a turn beside
    /// it), then drains the turn as a retry.
    fn retry(&mut self, msg: Retry, ctx: &mut Context<Self>) {
        let refuse = |why| Error::NotRetryable {
            session_id: self.id.clone(),
            why,
        };
        let refusal = match self.held {
            Held::Mine if self.coordinator.is_active() => {
                Some(refuse(crate::error::NotRetryable::TurnInFlight))
            }
            Held::Mine => None,
            Held::Elsewhere => Some(Error::Fenced {
                session_id: self.id.clone(),
            }),
            Held::Unknown => Some(Error::NotFound {
                session_id: self.id.clone(),
            }),
        };
        if let Some(error) = refusal {
            let _ = msg.started.send(Err(error));
            return;
        }
        let journal = self.env.journal.clone();
        let (id, boot, epoch) = (self.id.clone(), self.env.claimant(), self.epoch());
        let max = self.env.max_resume_attempts;
        let claim = async move { journal.retry_turn(id, boot, epoch, max).await };
        ctx.wait(claim.into_actor(self).map(move |retried, act, ctx| {
            let resumption = match retried {
                Ok(Ok(resumption)) => resumption,
                Ok(Err(why)) => {
                    let _ = msg.started.send(Err(Error::NotRetryable {
                        session_id: act.id.clone(),
                        why,
                    }));
                    return;
                }
                Err(e) => {
                    act.fenced |= matches!(e, StoreError::Fenced { .. });
                    let _ = msg.started.send(Err(e.into()));
                    return;
                }
            };
            let _ = msg.started.send(Ok(()));
            act.running.get_or_insert_with(Box::default).retry = true;
            act.take_up(resumption, ctx, |coordinator| coordinator.run(msg.reply));
        }));
    }
}

impl Handler<Heal> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Heal, ctx: &mut Self::Context) {
        self.when_loaded(ctx, |act, ctx| {
            if act.held != Held::Mine || act.coordinator.is_active() {
                // Its turn settles its own claim; another node's is not ours.
                return;
            }
            act.orphan = true;
            let (reply, _outcome) = futures::channel::oneshot::channel();
            let effects = act.coordinator.run(reply);
            act.apply(effects, ctx);
        });
    }
}

impl Handler<Interrupt> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Interrupt, ctx: &mut Self::Context) {
        if self.env.host.adopting(&self.id) {
            ctx.notify_later(msg, ADOPTION_POLL);
            return;
        }
        let Interrupt { seq, reason, reply } = msg;
        match (self.held, seq) {
            (Held::Elsewhere, Some(fence)) => {
                self.forward(Nudge::Interrupt(fence), ctx, move |act, ctx| {
                    let effects = act.coordinator.interrupt(seq, reason, reply);
                    act.apply(effects, ctx);
                });
            }
            _ => {
                let effects = self.coordinator.interrupt(seq, reason, reply);
                self.apply(effects, ctx);
            }
        }
    }
}

impl Handler<AwaitIdle> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: AwaitIdle, ctx: &mut Self::Context) {
        let effects = self.coordinator.await_idle(msg.reply);
        self.apply(effects, ctx);
    }
}

impl Handler<Close> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Close, ctx: &mut Self::Context) {
        let effects = self.coordinator.close();
        self.apply(effects, ctx);
    }
}

impl Handler<Fence> for SessionActor {
    type Result = ();

    /// This node lost the lease of the id it acquired the session under: the session is not
    /// its own any more. The drain is dropped (cancelled) without recording anything, the claim
    /// stays for the node that takes the session over. A session acquired under another id
    /// (a later one: the node rejoined), or not acquired, is not this fence's.
    fn handle(&mut self, msg: Fence, ctx: &mut Self::Context) {
        if self.stamp.node.load(Ordering::Relaxed) != msg.node {
            return;
        }
        self.fenced = true;
        ctx.stop();
    }
}

impl Handler<SessionDeleted> for SessionActor {
    type Result = ();

    /// Whatever comes next for this id loads the session again (it may be created anew);
    /// an idle actor stops at once, so a recreated session starts with a fresh one.
    fn handle(&mut self, _: SessionDeleted, ctx: &mut Self::Context) {
        self.held = Held::Unknown;
        if self.coordinator.is_quiescent() {
            self.retire(Forget::Stopped, ctx);
        } else {
            self.fenced = true;
        }
    }
}

impl Handler<Passivate> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Passivate, ctx: &mut Self::Context) {
        let idle = self.env.idle_timeout;
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let last = self.stamp.touched.load(Ordering::Relaxed);
        if self.coordinator.is_quiescent() && self.env.host.now_ms().saturating_sub(last) >= idle_ms
        {
            log::debug!("session {}: passivating after {idle:?} idle", self.id);
            if self.env.journal.is_shared() {
                // Queued before the entry is forgotten, so a new actor of the session takes it
                // again only after this release.
                let released = self.env.journal.release_ownership(self.id.clone());
                let id = self.id.clone();
                actix_rt::spawn(async move {
                    if let Err(e) = released.await {
                        log::warn!("session {id}: cannot release its ownership: {e}");
                    }
                });
            }
            self.env
                .host
                .forget(&self.id, self.stamp.generation, Forget::Passivated);
            ctx.stop();
        }
    }
}
