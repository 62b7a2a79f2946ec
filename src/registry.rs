//! The registry: which `SessionActor` serves which session, on which arbiter, and the exact set of
//! sessions with a turn in this process (`active()`); and the [`Supervisor`] that supervises
//! them.
//!
//! Lookups are on the hot path of every wake, so the map lives behind a mutex that handles read
//! directly (no actor hop per message); starting, forgetting and replacing actors also happen
//! under it, so a session never has two live actors. Supervision: an actor that stops
//! (passivation, a panicked drain, an external stop) removes its own entry, guarded by its
//! generation, and the next message for that session starts a fresh actor that reloads its state
//! (existence, interrupt fence) from the store. The `Supervisor` passivates: on a timer it
//! asks every actor idle longer than `idle_timeout` to stop, so an idle session costs no memory
//! and idle actors need no timers of their own.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::error::Error;
use crate::id::SessionId;
use crate::session::{Environment, Forget, Host, SessionActor, Stamp};

mod supervisor;

pub(crate) use self::supervisor::{AfterPassivation, Ready, StopSupervisor, Supervisor};

/// How often a message is re-sent to a fresh actor when the one it found had just stopped.
const DELIVERY_ATTEMPTS: usize = 8;

struct Entry {
    addr: Addr<SessionActor>,
    stamp: Arc<Stamp>,
}

/// Counters of what the registry did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RegistryStats {
    /// Session actors currently live.
    pub live: usize,
    /// Session actors started since boot.
    pub started: u64,
    /// Session actors replaced after a panicked drain.
    pub replaced: u64,
    /// Session actors stopped after being idle longer than `idle_timeout`.
    pub passivated: u64,
}

/// Live session actors and the `active()` set.
pub(crate) struct Registry {
    actors: Mutex<HashMap<SessionId, Entry>>,
    active: Mutex<HashSet<SessionId>>,
    /// Sessions a takeover sweep of this node is adopting right now (from counting their
    /// attempt, which makes this node their owner, until their resumes are delivered): a wake
    /// or an interrupt reaching one of them waits for that (see [`Host::adopting`]).
    adopting: Mutex<HashSet<SessionId>>,
    /// Turns a sweep of this process counted (taking their claims for this boot, so no later
    /// listing of this process finds them) and could not settle, its transaction having failed,
    /// with their attempt counts: the next sweep settles them.
    stranded: Mutex<Vec<(SessionId, u32)>>,
    /// Sessions whose actor stopped with a turn in hand (its arbiter stopped, say): their next
    /// actor heals the claim that turn may have left before claiming (see [`Host::orphaned`]).
    orphans: Mutex<HashSet<SessionId>>,
    /// Woken when `active` becomes empty (what `shutdown` waits for).
    idle: tokio::sync::Notify,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: AtomicUsize,
    next_generation: AtomicU64,
    replaced: AtomicU64,
    passivated: AtomicU64,
    closed: AtomicBool,
    /// The clock `touched` stamps are measured on.
    epoch: Instant,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Whether a table of `capacity` holding `len` entries should give memory back: once it is
/// a quarter full, it shrinks to twice its length (amortized O(1); a passivation pass that
/// empties the registry leaves it small instead of at the peak's size).
fn sparse(len: usize, capacity: usize) -> bool {
    capacity > 64 && len.saturating_mul(4) <= capacity
}

/// Removes `id`'s entry, shrinking the table once it is sparse.
fn remove_entry(actors: &mut HashMap<SessionId, Entry>, id: &SessionId) {
    actors.remove(id);
    let len = actors.len();
    if sparse(len, actors.capacity()) {
        actors.shrink_to(len * 2);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while these locks are held; recover the data if one ever did.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Registry {
    /// The arbiters session actors run on.
    pub(crate) fn arbiters(&self) -> &[ArbiterHandle] {
        &self.arbiters
    }

    pub(crate) fn new(arbiters: Vec<ArbiterHandle>) -> Self {
        Self {
            actors: Mutex::new(HashMap::new()),
            active: Mutex::new(HashSet::new()),
            adopting: Mutex::new(HashSet::new()),
            stranded: Mutex::new(Vec::new()),
            orphans: Mutex::new(HashSet::new()),
            idle: tokio::sync::Notify::new(),
            arbiters,
            next_arbiter: AtomicUsize::new(0),
            next_generation: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
            passivated: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// The live actor of `id`, started on the next arbiter if there is none.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] once the runtime is closing.
    pub(crate) fn addr(
        &self,
        env: &Arc<Environment>,
        id: &SessionId,
    ) -> Result<Addr<SessionActor>, Error> {
        let mut actors = lock(&self.actors);
        // Checked under the lock `close` takes, so no actor starts after `close` listed them.
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        if let Some(entry) = actors.get(id) {
            if entry.addr.connected() {
                return Ok(entry.addr.clone());
            }
        }
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let arbiter =
            &self.arbiters[self.next_arbiter.fetch_add(1, Ordering::Relaxed) % self.arbiters.len()];
        let stamp = Arc::new(Stamp {
            generation,
            touched: AtomicU64::new(self.now_ms()),
            epoch: AtomicU64::new(0),
            node: AtomicU64::new(0),
        });
        let (env, session, shared) = (env.clone(), id.clone(), stamp.clone());
        let addr = SessionActor::start_in_arbiter(arbiter, move |_| {
            SessionActor::new(env, session, shared)
        });
        actors.insert(
            id.clone(),
            Entry {
                addr: addr.clone(),
                stamp,
            },
        );
        Ok(addr)
    }

    /// Milliseconds since the registry started: the clock of `touched` stamps.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Why an actor removed its entry.
    pub(crate) fn forget(&self, id: &SessionId, generation: u64, why: Forget) {
        let mut actors = lock(&self.actors);
        if actors
            .get(id)
            .is_some_and(|e| e.stamp.generation == generation)
        {
            remove_entry(&mut actors, id);
            match why {
                Forget::Replaced => self.replaced.fetch_add(1, Ordering::Relaxed),
                Forget::Passivated => self.passivated.fetch_add(1, Ordering::Relaxed),
                Forget::Stopped => 0,
            };
        }
    }

    /// The actors whose last activity is older than `idle` (candidates for passivation).
    pub(crate) fn idle_actors(&self, idle: Duration) -> Vec<Addr<SessionActor>> {
        let cutoff = self
            .now_ms()
            .saturating_sub(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX));
        lock(&self.actors)
            .values()
            .filter(|e| e.stamp.touched.load(Ordering::Relaxed) <= cutoff)
            .map(|e| e.addr.clone())
            .collect()
    }

    /// Removes the entry of `id` if it is `addr` (a send to it found the mailbox closed).
    pub(crate) fn forget_addr(&self, id: &SessionId, addr: &Addr<SessionActor>) {
        let mut actors = lock(&self.actors);
        if actors.get(id).is_some_and(|e| &e.addr == addr) {
            remove_entry(&mut actors, id);
        }
    }

    /// The session has a turn in this process.
    pub(crate) fn activate(&self, id: &SessionId) {
        lock(&self.active).insert(id.clone());
    }

    /// The session's turns have all settled.
    pub(crate) fn deactivate(&self, id: &SessionId) {
        let mut active = lock(&self.active);
        let len = active.len().saturating_sub(1);
        if active.remove(id) && sparse(len, active.capacity()) {
            active.shrink_to(len * 2);
        }
        if active.is_empty() {
            self.idle.notify_waiters();
        }
    }

    /// Resolves once no session has a turn in this process, or at `deadline`; returns whether
    /// every turn settled.
    pub(crate) async fn settled_by(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            // Registered before the check, so a deactivation right after it is not missed.
            let idle = self.idle.notified();
            if lock(&self.active).is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return lock(&self.active).is_empty();
            }
        }
    }

    /// Marks `ids` as being adopted by a sweep of this node until the returned guard drops.
    pub(crate) fn adopt(&self, ids: Vec<SessionId>) -> Adopting<'_> {
        lock(&self.adopting).extend(ids.iter().cloned());
        Adopting {
            registry: self,
            ids,
        }
    }

    /// Keeps `turns` (counted by a sweep whose settling transaction failed, with their attempt
    /// counts) for the next sweep.
    pub(crate) fn strand(&self, turns: impl IntoIterator<Item = (SessionId, u32)>) {
        lock(&self.stranded).extend(turns);
    }

    /// Whether `id` is being adopted by a sweep of this node, or was counted by one and left
    /// to the next ([`Registry::strand`]): the sweeps settle it, not the healer.
    pub(crate) fn swept(&self, id: &SessionId) -> bool {
        lock(&self.adopting).contains(id) || lock(&self.stranded).iter().any(|(s, _)| s == id)
    }

    /// Takes the turns [`Registry::strand`] kept.
    pub(crate) fn take_stranded(&self) -> Vec<(SessionId, u32)> {
        std::mem::take(&mut *lock(&self.stranded))
    }

    /// Sessions with a turn in this process (starting, draining, stopping or settling).
    pub(crate) fn active(&self) -> BTreeSet<SessionId> {
        lock(&self.active).iter().cloned().collect()
    }

    /// Whether `id` has a turn in this process.
    pub(crate) fn is_active(&self, id: &SessionId) -> bool {
        lock(&self.active).contains(id)
    }

    /// Delivers a message to the session's actor, re-sending it to a fresh actor if the one
    /// found had stopped (passivation) before handling it. `make` builds the message anew for
    /// each attempt; it returns what the caller then waits on.
    pub(crate) async fn deliver<M, R>(
        &self,
        env: &Arc<Environment>,
        id: &SessionId,
        mut make: impl FnMut() -> (M, R),
    ) -> Result<R, Error>
    where
        M: actix::Message<Result = ()> + Send + 'static,
        SessionActor: actix::Handler<M>,
    {
        for _ in 0..DELIVERY_ATTEMPTS {
            let addr = self.addr(env, id)?;
            let (message, rest) = make();
            match addr.send(message).await {
                Ok(()) => return Ok(rest),
                Err(MailboxError::Closed) | Err(MailboxError::Timeout) => {
                    self.forget_addr(id, &addr);
                }
            }
        }
        if self.is_closed() {
            Err(Error::ShuttingDown)
        } else {
            Err(Error::Undeliverable {
                session_id: id.clone(),
            })
        }
    }

    /// Tells the live actor of `id`, if any, that its session was deleted (it stops once no
    /// turn runs); starts none.
    pub(crate) fn retire(&self, id: &SessionId) {
        let addr = lock(&self.actors).get(id).map(|e| e.addr.clone());
        if let Some(addr) = addr {
            addr.do_send(crate::session::messages::SessionDeleted);
        }
    }

    /// Stops handing out actors; returns the live ones so they can be closed.
    pub(crate) fn close(&self) -> Vec<Addr<SessionActor>> {
        let actors = lock(&self.actors);
        self.closed.store(true, Ordering::Release);
        actors.values().map(|e| e.addr.clone()).collect()
    }

    /// This node lost the lease of its id of generation `node` (several nodes sharing a
    /// database): every live actor that acquired its session under that id stops at once
    /// without recording anything; the nodes that take its sessions over resume them. Every
    /// actor is told, and each decides when it handles the message, after any load it is
    /// waiting for: an acquisition under a later id (the node rejoined) keeps its actor.
    pub(crate) fn fence(&self, node: u64) {
        let actors: Vec<_> = lock(&self.actors)
            .values()
            .map(|e| e.addr.clone())
            .collect();
        for addr in actors {
            addr.do_send(crate::session::messages::Fence { node });
        }
    }

    /// Whether `close` was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> RegistryStats {
        RegistryStats {
            live: lock(&self.actors).len(),
            started: self.next_generation.load(Ordering::Relaxed),
            replaced: self.replaced.load(Ordering::Relaxed),
            passivated: self.passivated.load(Ordering::Relaxed),
        }
    }
}

/// Sessions a sweep is adopting ([`Registry::adopt`]); unmarked on drop.
#[derive(Debug)]
pub(crate) struct Adopting<'a> {
    registry: &'a Registry,
    ids: Vec<SessionId>,
}

impl Drop for Adopting<'_> {
    fn drop(&mut self) {
        let mut adopting = lock(&self.registry.adopting);
        for id in &self.ids {
            adopting.remove(id);
        }
        if sparse(adopting.len(), adopting.capacity()) {
            let len = adopting.len();
            adopting.shrink_to(len * 2);
        }
    }
}

impl Host for Registry {
    fn adopting(&self, id: &SessionId) -> bool {
        lock(&self.adopting).contains(id)
    }

    fn orphaned(&self, id: &SessionId) {
        lock(&self.orphans).insert(id.clone());
    }

    fn take_orphan(&self, id: &SessionId) -> bool {
        lock(&self.orphans).remove(id)
    }

    fn activate(&self, id: &SessionId) {
        Registry::activate(self, id);
    }

    fn deactivate(&self, id: &SessionId) {
        Registry::deactivate(self, id);
    }

    fn forget(&self, id: &SessionId, generation: u64, why: Forget) {
        Registry::forget(self, id, generation, why);
    }

    fn now_ms(&self) -> u64 {
        Registry::now_ms(self)
    }
}
