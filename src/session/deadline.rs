//! Turn deadlines in the session actor: what it keeps for a running turn ([`TurnMemory`]),
//! and the watcher that times the turn out.
//!
//! The clock starts when the turn's first drain starts (its claim committed) and covers the
//! turn's later drains; a turn resumed after a restart is a new execution of a new actor, so it
//! gets a fresh timeout from its resume. The deadline lives in memory only: a turn whose
//! deadline passed while its process was down is resumed by the restart sweep as any claimed
//! turn is, and times out again if it still runs too long.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::prelude::*;

use super::SessionActor;
use crate::journal::ledger::Ledger;
use crate::turn::Deadline;

/// What the actor keeps for one execution (the coordinator's `Turn` memory): the turn's ledger
/// and its deadline, shared by its drains.
#[derive(Default)]
pub(crate) struct TurnMemory {
    /// The turn's id, attempt and steps.
    pub(super) ledger: Option<Arc<Mutex<Ledger>>>,
    /// The turn's deadline, watched while the execution lasts.
    pub(super) deadline: Option<Arc<Deadline>>,
}

impl Drop for TurnMemory {
    /// The execution ended: its watcher stops.
    fn drop(&mut self) {
        if let Some(deadline) = &self.deadline {
            deadline.close();
        }
    }
}

impl SessionActor {
    /// The current turn's deadline. At its first drain it is made (the runtime's `turn_timeout`
    /// from now) and watched (see [`SessionActor::watch`]); a later drain watches it again when
    /// it passed while the turn healed.
    pub(super) fn turn_deadline(&mut self, ctx: &mut Context<Self>) -> Option<Arc<Deadline>> {
        let timeout = self.env.turn_timeout;
        let memory = self.coordinator.memory()?;
        if let Some(deadline) = memory.deadline.clone() {
            if deadline.rearm() {
                self.watch(deadline.clone(), ctx);
            }
            return Some(deadline);
        }
        let configured = timeout.and_then(|t| Instant::now().checked_add(t));
        let deadline = Arc::new(Deadline::new(configured));
        memory.deadline = Some(deadline.clone());
        self.watch(deadline.clone(), ctx);
        Some(deadline)
    }

    /// Spawns the watcher of `deadline` on the actor's context: once it passes, it times the
    /// turn out if the same execution still runs. A turn that cannot be timed out then (it is
    /// healing after a store fault) is marked, so its resumed drain watches it again.
    fn watch(&mut self, deadline: Arc<Deadline>, ctx: &mut Context<Self>) {
        let watched = deadline.clone();
        let watcher = async move { watched.expired().await };
        ctx.spawn(watcher.into_actor(self).map(move |expired, act, ctx| {
            let same = act
                .coordinator
                .memory()
                .and_then(|m| m.deadline.as_ref())
                .is_some_and(|d| Arc::ptr_eq(d, &deadline));
            if !(expired && same) {
                return;
            }
            let effects = act.coordinator.time_out();
            if effects.is_empty() {
                deadline.unwatch();
                return;
            }
            log::info!("session {}: the turn ran past its deadline", act.id);
            act.apply(effects, ctx);
        }));
    }
}
