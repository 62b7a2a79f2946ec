//! The writer thread of the Persistence actor: takes everything queued, commits it as one
//! transaction (without savepoints first; again with one per request only when a request
//! failed), replies after COMMIT and broadcasts what committed.
//!
//! After each batch is answered it lets the engine do its housekeeping
//! (`WriterConnection::maintain`). Once it has written and then had nothing to do for a second
//! (at most every ten seconds: [`super::idle`]), and when it stops, it has the engine
//! checkpoint and truncate its log, so a clean stop leaves an empty `-wal` file.
//!
//! Where savepoints cost more than they save (`WriterConnection::batching`:
//! PostgreSQL, a round trip each; SQLite, page copies), a batch first runs without them and
//! commits as is when every request succeeded; when one fails, the batch is rolled back and
//! runs again, a savepoint per request (the failed request alone after it, when its error may
//! clear on retry). A request may therefore run twice; every request may already (a retry
//! after a transient error), and nothing of a rolled-back run is stored or published. In that
//! savepoint-free run, each run of turn writes (claims and terminals) is handed to the store
//! ahead of its requests (`Store::prepare_turns`: one round trip for the run); a turn write
//! alone in its transaction may be committed in one statement
//! (`WriterConnection::commit_turn`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use futures::channel::oneshot;
use tokio::sync::broadcast;

use super::idle::IdleCheckpoint;
use super::{Counters, Job, Msg, WriteCtx};
use crate::error::StoreError;
use crate::event::EventRecord;
use crate::journal::backend::{Maintenance, Store, WriterConnection};
use crate::journal::turn_write::TurnWriteKind;

/// How often a request that failed with a transient error (a deadlock with another node's
/// transaction, a lock wait that timed out) runs again, alone, before its caller gets the error.
const MAX_RETRIES: u32 = 5;

/// The writer thread's state.
pub(super) struct WriterActor {
    /// The one connection every write goes through.
    pub(super) conn: Box<dyn WriterConnection>,
    /// The mailbox: write requests, memory release, stop.
    pub(super) inbox: mpsc::Receiver<Msg>,
    /// Where committed events are published.
    pub(super) bus: broadcast::Sender<Arc<EventRecord>>,
    /// Shared with the handles, for `stats()`.
    pub(super) counters: Arc<Counters>,
    /// The most requests per transaction (1 with group commit off).
    pub(super) max_batch: usize,
    /// How many [`super::MaintenanceHold`]s are alive: while any is, housekeeping after a
    /// write does only what can wait no longer.
    pub(super) holds: Arc<AtomicUsize>,
}

impl WriterActor {
    /// The next message; while the log holds writes not yet checkpointed (`dirty`), a quiet
    /// moment checkpoints it first. `None` once every handle is gone.
    fn next_message(&mut self, idle: &mut IdleCheckpoint) -> Option<Msg> {
        loop {
            let Some(due) = idle.due() else {
                return self.inbox.recv().ok();
            };
            let wait = due.saturating_duration_since(Instant::now());
            match self.inbox.recv_timeout(wait) {
                Ok(msg) => return Some(msg),
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.conn.maintain(Maintenance::Idle);
                    let done = self.conn.checkpoint(true);
                    idle.checkpointed(done);
                }
            }
        }
    }

    /// The thread's loop, until `Stop` or every handle is gone.
    pub(super) fn run(mut self) {
        let mut stop: Option<oneshot::Sender<()>> = None;
        // A write that must run alone, taken from the mailbox while collecting a batch.
        let mut held: Option<Box<dyn Job>> = None;
        let mut idle = IdleCheckpoint::default();
        while stop.is_none() {
            let first = match held.take() {
                Some(job) => Msg::Job(job),
                None => match self.next_message(&mut idle) {
                    Some(msg) => msg,
                    None => break,
                },
            };
            if matches!(first, Msg::Job(_)) {
                idle.wrote();
            }
            let mut batch = Vec::new();
            match first {
                Msg::Job(job) if job.alone() => {
                    self.commit_alone(job);
                    self.maintain_after_write();
                    continue;
                }
                Msg::Job(job) => batch.push(job),
                Msg::ReleaseMemory(done) => {
                    self.conn.release_memory();
                    let _ = done.send(crate::thread_caches::take());
                    continue;
                }
                Msg::Stop(tx) => stop = Some(tx),
            }
            while stop.is_none() && batch.len() < self.max_batch {
                match self.inbox.try_recv() {
                    Ok(Msg::Job(job)) if job.alone() => {
                        held = Some(job);
                        break;
                    }
                    Ok(Msg::Job(job)) => batch.push(job),
                    Ok(Msg::ReleaseMemory(done)) => {
                        // Shrinking between two batches changes nothing they store.
                        self.conn.release_memory();
                        let _ = done.send(crate::thread_caches::take());
                    }
                    Ok(Msg::Stop(tx)) => stop = Some(tx),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                idle.wrote();
                self.commit_batch(batch);
                self.maintain_after_write();
            }
        }
        if let Some(job) = held {
            // Refused unprocessed: not a failed write.
            job.complete(Err(&StoreError::Closed));
        }
        // Drain what is still queued so no caller waits forever.
        while let Ok(msg) = self.inbox.try_recv() {
            match msg {
                Msg::Job(job) => job.complete(Err(&StoreError::Closed)),
                Msg::ReleaseMemory(done) => {
                    let _ = done.send(crate::thread_caches::Taken::default());
                }
                Msg::Stop(tx) => {
                    let _ = tx.send(());
                }
            }
        }
        if let Some(tx) = stop {
            // After the last write: a clean stop leaves an empty log.
            self.conn.maintain(Maintenance::Idle);
            if !self.conn.checkpoint(false) {
                log::warn!("persistence: the write-ahead log could not be truncated at stop");
            }
            let _ = tx.send(());
        }
    }

    /// The engine's housekeeping after a write: deferred while a hold is alive.
    fn maintain_after_write(&mut self) {
        let when = if self.holds.load(Ordering::Acquire) > 0 {
            Maintenance::Deferred
        } else {
            Maintenance::AfterWrite
        };
        self.conn.maintain(when);
    }

    fn commit_batch(&mut self, mut batch: Vec<Box<dyn Job>>) {
        if batch.len() == 1 {
            // A request alone in its transaction needs no savepoint: rolling the transaction
            // back undoes exactly that request.
            if let Some(job) = batch.pop() {
                self.commit_alone(job);
            }
            return;
        }
        let size = batch.len() as u64;
        self.count_transaction(size);
        let mut events = Vec::new();
        // A request that failed the savepoint-free run with an error that may clear: it runs
        // alone after the batch.
        let mut held_out = None;
        if self.conn.batching().optimistic {
            match Self::transact_optimistic(&mut *self.conn, &mut batch, &mut events) {
                Ok(None) => {
                    for job in batch {
                        self.answer(job, Ok(()));
                    }
                    self.broadcast(events);
                    return;
                }
                // A request failed: everything was rolled back; run the batch again, a
                // savepoint per request, where the failure stays the request's own. A request
                // that failed with a transient error (a lock wait that timed out, a deadlock)
                // would most likely wait on the same lock again and hold up the whole batch a
                // second time: it runs alone after the batch, as it would after failing in
                // its savepoint.
                Ok(Some(at)) => {
                    events.clear();
                    if batch.get(at).is_some_and(|job| job.retryable()) {
                        held_out = Some(batch.remove(at));
                    }
                }
                Err(e) => {
                    self.conn.rollback();
                    log::error!("persistence: batch of {size} write(s) failed to commit: {e}");
                    for job in batch {
                        self.answer(job, Err(&e));
                    }
                    return;
                }
            }
        }
        let mut again = Vec::new();
        let outcome = Self::transact(&mut *self.conn, &mut batch, &mut events, &mut again);
        if outcome.is_err() {
            self.conn.rollback();
        }
        match outcome {
            Ok(()) => {
                let mut retries = Vec::new();
                for (i, job) in batch.into_iter().enumerate() {
                    if again.contains(&i) {
                        retries.push(job);
                    } else {
                        self.answer(job, Ok(()));
                    }
                }
                self.broadcast(events);
                // Rolled back for a transient error (a deadlock with another node's batch):
                // each runs again in a transaction of its own, which holds no lock of the
                // batch it was part of.
                for job in retries {
                    self.commit_alone(job);
                }
            }
            Err(e) => {
                log::error!("persistence: batch of {size} write(s) failed to commit: {e}");
                for job in batch {
                    self.answer(job, Err(&e));
                }
            }
        }
        if let Some(job) = held_out {
            self.commit_alone(job);
        }
    }

    /// Counts one transaction of `size` requests.
    fn count_transaction(&self, size: u64) {
        self.counters.requests.fetch_add(size, Ordering::Relaxed);
        self.counters.transactions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .largest_batch
            .fetch_max(size, Ordering::Relaxed);
    }

    /// Answers a request processed in a transaction whose COMMIT returned `commit`, counting
    /// it in `failed_requests` (before its caller can read the count) when the answer is an
    /// error. Every processed request is answered here exactly once.
    fn answer(&self, job: Box<dyn Job>, commit: Result<(), &StoreError>) {
        if commit.is_err() || !job.succeeded() {
            self.counters
                .failed_requests
                .fetch_add(1, Ordering::Relaxed);
        }
        job.complete(commit);
    }

    /// Publishes committed events on the bus (after their callers were answered).
    fn broadcast(&self, events: Vec<EventRecord>) {
        for event in events {
            let _ = self.bus.send(Arc::new(event));
        }
    }

    /// Commits one write in a transaction of its own, without a savepoint.
    fn commit_alone(&mut self, job: Box<dyn Job>) {
        self.count_transaction(1);
        let Some(mut job) = self.commit_turn_alone(job) else {
            return;
        };
        let mut events = Vec::new();
        let conn = &mut *self.conn;
        let mut retries = 0;
        let outcome = loop {
            let attempt = (|| {
                conn.begin()?;
                let mut ctx = WriteCtx {
                    store: conn.store(),
                    events: Vec::new(),
                };
                if !job.run(&mut ctx) {
                    // The job replies with its own error.
                    conn.rollback();
                    return Ok(false);
                }
                events = ctx.events;
                conn.commit()?;
                Ok::<_, StoreError>(true)
            })();
            if attempt.is_err() {
                conn.rollback();
            }
            if matches!(attempt, Ok(false)) && job.retryable() && retries < MAX_RETRIES {
                retries += 1;
                // Give the other transaction time to finish before taking its locks again.
                std::thread::sleep(std::time::Duration::from_millis(5 << retries));
                continue;
            }
            break attempt;
        };
        match outcome {
            Ok(true) => {
                self.answer(job, Ok(()));
                self.broadcast(events);
            }
            // The job answers with its own error.
            Ok(false) => self.answer(job, Ok(())),
            Err(e) => {
                log::error!("persistence: a write alone failed to commit: {e}");
                self.answer(job, Err(&e));
            }
        }
    }

    /// Commits a turn write alone in one statement where the connection can
    /// (`WriterConnection::commit_turn`), then runs its request on the result and answers it.
    /// Gives the job back when it did not (then nothing is stored, and the write commits as
    /// usual).
    fn commit_turn_alone(&mut self, mut job: Box<dyn Job>) -> Option<Box<dyn Job>> {
        if !self.conn.batching().turns_alone {
            return Some(job);
        }
        let Some(turn) = job.turn() else {
            return Some(job);
        };
        if matches!(turn.kind, TurnWriteKind::Claim { .. }) {
            // Before anything of the claim is sent, as inside its transaction otherwise.
            crate::crash::point(crate::crash::DURING_CLAIM);
        }
        match self.conn.commit_turn(turn) {
            Ok(true) => {}
            Ok(false) => return Some(job),
            Err(e) => {
                log::error!("persistence: a turn write alone failed to commit: {e}");
                self.conn.after_turn();
                self.answer(job, Err(&e));
                return None;
            }
        }
        let mut ctx = WriteCtx {
            store: self.conn.store(),
            events: Vec::new(),
        };
        let ok = job.run(&mut ctx);
        let events = ctx.events;
        self.conn.after_turn();
        // Not `ok`: fenced (the statement wrote nothing), or its answer could not be read; the
        // job answers with its own error.
        self.answer(job, Ok(()));
        if ok {
            self.broadcast(events);
        }
        None
    }

    /// Runs the batch without savepoints. `Ok(None)`: every request succeeded and the batch
    /// committed. `Ok(Some(i))`: request `i` failed (or the engine aborted the transaction
    /// while it ran), and the transaction was rolled back: nothing of the batch is stored, and
    /// every request may run again. `Err`: `BEGIN` or `COMMIT` failed; nothing is stored.
    fn transact_optimistic(
        conn: &mut dyn WriterConnection,
        batch: &mut [Box<dyn Job>],
        events: &mut Vec<EventRecord>,
    ) -> Result<Option<usize>, StoreError> {
        conn.begin()?;
        // The end of the run of turn writes handed to the store ahead of their requests.
        let mut prepared = 0;
        let turn_runs = conn.batching().turn_runs;
        for i in 0..batch.len() {
            if turn_runs && i >= prepared {
                prepared = prepare_turns(conn.store(), batch, i);
            }
            let Some(job) = batch.get_mut(i) else { break };
            let mut ctx = WriteCtx {
                store: conn.store(),
                events: Vec::new(),
            };
            let ok = job.run(&mut ctx);
            let published = std::mem::take(&mut ctx.events);
            if !ok || !conn.in_transaction() {
                conn.rollback();
                return Ok(Some(i));
            }
            events.extend(published);
        }
        conn.commit()?;
        Ok(None)
    }

    fn transact(
        conn: &mut dyn WriterConnection,
        batch: &mut [Box<dyn Job>],
        events: &mut Vec<EventRecord>,
        again: &mut Vec<usize>,
    ) -> Result<(), StoreError> {
        conn.begin()?;
        for (i, job) in batch.iter_mut().enumerate() {
            conn.savepoint()?;
            let mut ctx = WriteCtx {
                store: conn.store(),
                events: Vec::new(),
            };
            let ok = job.run(&mut ctx);
            let published = std::mem::take(&mut ctx.events);
            if !conn.in_transaction() {
                // The engine rolled the whole transaction back (SQLite may on SQLITE_FULL,
                // IOERR, BUSY or NOMEM): the writes of the requests before this one are gone,
                // and a later SAVEPOINT would open, and its RELEASE commit, a transaction of its
                // own. The batch fails as a whole, with this request's error.
                return Err(job.failure().unwrap_or_else(|| {
                    StoreError::Inconsistent("the engine rolled back the write transaction".into())
                }));
            }
            if ok {
                conn.release()?;
                events.extend(published);
                continue;
            }
            // Roll back this request alone, then pop its savepoint. Should that fail, the batch
            // fails rather than commit part of the failed request.
            conn.rollback_to()?;
            conn.release()?;
            if job.retryable() {
                // Runs again after this batch, alone (see `commit_batch`).
                again.push(i);
            }
        }
        conn.commit()
    }
}

/// Hands the run of turn writes that starts at `batch[start]` (up to the first request that
/// is not one, or whose session the run already has) to the store ahead of their requests
/// (`Store::prepare_turns`); returns where the run ends. A run of one is left to its request.
/// Should the store fail, the transaction is aborted and the run's first request fails with it:
/// the batch then runs again with savepoints, where nothing is prepared.
fn prepare_turns(store: &mut dyn Store, batch: &[Box<dyn Job>], start: usize) -> usize {
    let mut turns = Vec::new();
    let mut sessions = HashSet::new();
    for job in batch.iter().skip(start) {
        match job.turn() {
            Some(turn) if sessions.insert(turn.session.as_str()) => turns.push(turn),
            _ => break,
        }
    }
    let end = start + turns.len().max(1);
    if turns.len() > 1 {
        if let Err(e) = store.prepare_turns(&turns, crate::journal::now_ms()) {
            log::debug!(
                "persistence: a run of {} turn writes failed: {e}",
                turns.len()
            );
        }
    }
    end
}
