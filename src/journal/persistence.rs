//! The Persistence actor: owns the store's connections, runs every durable write on one writer
//! thread and group-commits them.
//!
//! The actor lives on its own OS thread (like an actix `SyncArbiter` with one thread) whose
//! mailbox is a channel, so that it can take *everything* queued in one go: requests that arrive
//! while a transaction commits are batched into the next one. Each request runs inside its own
//! SAVEPOINT (unless it is alone in its transaction), so one failing request is rolled back
//! alone (on PostgreSQL, where a savepoint costs a round trip, a batch first runs without them
//! and again with them only if a request failed: see `writer`); each caller's reply is sent
//! only after the COMMIT that holds its write returned, and committed events are then
//! published on the bus.
//! Reads do not queue behind the writer: they run on pool connections on a blocking thread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use futures::channel::oneshot;
use tokio::sync::broadcast;

use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::journal::backend::{Readers, Store, WriterConnection};
use crate::journal::turn_write::TurnWrite;
use crate::thread_caches::Taken;

/// The largest number of requests committed in one transaction.
const MAX_BATCH: usize = 2048;

/// Counters of what the Persistence actor did, for tests, benchmarks and `/stats`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    transactions: AtomicU64,
    requests: AtomicU64,
    failed_requests: AtomicU64,
    largest_batch: AtomicU64,
}

/// A snapshot of the Persistence actor's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PersistenceStats {
    /// Write transactions committed (or attempted).
    pub transactions: u64,
    /// Write requests processed.
    pub requests: u64,
    /// Write requests answered with an error: their own (rolled back alone), or the one that
    /// kept their transaction from committing (a failed `BEGIN` or `COMMIT`, a transaction the
    /// engine rolled back). Each request counts once, however often it ran.
    pub failed_requests: u64,
    /// The most requests committed in one transaction.
    pub largest_batch: u64,
}

/// What a write request sees: the store, inside the request's savepoint, and a log of the
/// events it published, broadcast after COMMIT.
pub(crate) struct WriteCtx<'a> {
    store: &'a mut dyn Store,
    events: Vec<EventRecord>,
}

impl WriteCtx<'_> {
    /// The store, inside the request's savepoint.
    pub(crate) fn store(&mut self) -> &mut dyn Store {
        self.store
    }

    /// Appends an event given by wire name and payload (a runner-defined event), assigning its
    /// seq and running its projection, and remembers it for the bus.
    pub(crate) fn publish(
        &mut self,
        session: &SessionId,
        kind: &str,
        data: &serde_json::Value,
    ) -> Result<EventRecord, StoreError> {
        let record = self.store.publish(session, kind, data, super::now_ms())?;
        self.events.push(record.clone());
        Ok(record)
    }

    /// Appends a runtime event (assigning its seq and running its projection) and remembers it
    /// for the bus.
    pub(crate) fn append(
        &mut self,
        session: &SessionId,
        event: &SessionEvent,
    ) -> Result<EventRecord, StoreError> {
        let record = self.store.append(session, event, super::now_ms())?;
        self.events.push(record.clone());
        Ok(record)
    }

    /// Remembers an event already appended through a [`Store`] method.
    pub(crate) fn record(&mut self, event: EventRecord) {
        self.events.push(event);
    }
}

/// A queued write: run it inside a savepoint, then complete it after COMMIT.
trait Job: Send {
    /// Runs the write; returns whether it succeeded (so its savepoint is kept).
    fn run(&mut self, ctx: &mut WriteCtx<'_>) -> bool;
    /// Sends the reply: the write's own result, or the error that stopped the batch's commit.
    fn complete(self: Box<Self>, commit: Result<(), &StoreError>);
    /// Whether the write ran and succeeded (in its last run).
    fn succeeded(&self) -> bool;
    /// Whether the write failed with an error that may clear if it runs again.
    fn retryable(&self) -> bool {
        self.error().is_some_and(StoreError::is_transient)
    }
    /// A copy of the error the write failed with, if it ran and failed.
    fn failure(&self) -> Option<StoreError> {
        self.error().map(StoreError::duplicate)
    }
    /// The error the write failed with, if it ran and failed.
    fn error(&self) -> Option<&StoreError>;
    /// Whether the write runs in a transaction of its own, without a savepoint.
    fn alone(&self) -> bool;
    /// The turn write this request is, if it is one (see [`Store::prepare_turns`]).
    fn turn(&self) -> Option<&TurnWrite> {
        None
    }
}

/// The reply to a request that ran with `result` (`None`: it never ran) in a transaction whose
/// COMMIT returned `commit`.
fn answer<T>(
    commit: Result<(), &StoreError>,
    result: Option<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match (commit, result) {
        (Ok(()), None) => Err(StoreError::Inconsistent("write request never ran".into())),
        (Err(e), None) => Err(e.duplicate()),
        (_, Some(Err(e))) => Err(e),
        (Ok(()), Some(Ok(value))) => Ok(value),
        (Err(e), Some(Ok(_))) => Err(e.duplicate()),
    }
}

struct TypedJob<F, T> {
    /// Run again (inside a fresh savepoint) when it fails with an error the engine says may
    /// clear on retry: a deadlock between two nodes' transactions, a lock wait that timed out.
    work: F,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
    alone: bool,
}

impl<F, T> Job for TypedJob<F, T>
where
    F: FnMut(&mut WriteCtx<'_>) -> Result<T, StoreError> + Send,
    T: Send,
{
    fn run(&mut self, ctx: &mut WriteCtx<'_>) -> bool {
        let result = (self.work)(ctx);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn complete(self: Box<Self>, commit: Result<(), &StoreError>) {
        let _ = self.reply.send(answer(commit, self.result));
    }

    fn succeeded(&self) -> bool {
        matches!(self.result, Some(Ok(_)))
    }

    fn error(&self) -> Option<&StoreError> {
        self.result.as_ref().and_then(|r| r.as_ref().err())
    }

    fn alone(&self) -> bool {
        self.alone
    }
}

enum Msg {
    Job(Box<dyn Job>),
    /// Give unused SQLite cache memory back (`PRAGMA shrink_memory`), then answer with what
    /// the writer thread's allocator cache held.
    ReleaseMemory(oneshot::Sender<Taken>),
    Stop(oneshot::Sender<()>),
}

/// A handle to the Persistence actor. Cheap to clone; every clone talks to the same writer.
#[derive(Clone)]
pub(crate) struct Persistence {
    mailbox: mpsc::Sender<Msg>,
    readers: Arc<dyn Readers>,
    /// As many as the readers have connections.
    read_permits: Arc<tokio::sync::Semaphore>,
    bus: broadcast::Sender<Arc<EventRecord>>,
    counters: Arc<Counters>,
    /// Shared with the writer: how many [`MaintenanceHold`]s are alive.
    holds: Arc<AtomicUsize>,
}

/// While alive, the writer defers the engine's housekeeping after writes to what can wait no
/// longer ([`Persistence::defer_maintenance`]); dropped, the usual course resumes.
#[derive(Debug)]
pub(crate) struct MaintenanceHold(Arc<AtomicUsize>);

impl Drop for MaintenanceHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistence")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Persistence {
    /// Starts the writer thread on `writer`; reads run on `readers`.
    ///
    /// With `group_commit` off every request commits in its own transaction (kept for the
    /// benchmark comparison).
    pub(crate) fn start(
        readers: Arc<dyn Readers>,
        writer: Box<dyn WriterConnection>,
        group_commit: bool,
        bus_capacity: usize,
    ) -> Result<Self, StoreError> {
        let (mailbox, inbox) = mpsc::channel();
        let (bus, _) = broadcast::channel(bus_capacity.max(1));
        let counters = Arc::new(Counters::default());
        let holds = Arc::new(AtomicUsize::new(0));
        let actor = WriterActor {
            conn: writer,
            inbox,
            bus: bus.clone(),
            counters: counters.clone(),
            max_batch: if group_commit { MAX_BATCH } else { 1 },
            holds: holds.clone(),
        };
        thread::Builder::new()
            .name("durable-sessions-persistence".into())
            .spawn(move || actor.run())
            .map_err(StoreError::WriterThread)?;
        Ok(Self {
            mailbox,
            read_permits: Arc::new(tokio::sync::Semaphore::new(readers.size().max(1))),
            readers,
            bus,
            counters,
            holds,
        })
    }

    /// Defers the engine's housekeeping after writes while the returned hold is alive: for a
    /// burst whose latency matters more than the housekeeping it would wait behind (the
    /// restart sweep, whose claims start drains; SQLite's settle of the event log's recent
    /// entries would otherwise run between its chunks). What can wait no longer still runs,
    /// and the writer going idle does all of it.
    pub(crate) fn defer_maintenance(&self) -> MaintenanceHold {
        self.holds.fetch_add(1, Ordering::AcqRel);
        MaintenanceHold(self.holds.clone())
    }

    /// Runs `work` in the next group-committed transaction; resolves after its COMMIT.
    ///
    /// # Errors
    /// The work's own error (its savepoint was rolled back alone), or the error that stopped the
    /// batch from committing (then nothing of the batch is stored).
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteCtx<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.submit(work, false).await
    }

    /// Runs `work` in a transaction of its own, without a savepoint: for one big write (the
    /// restart sweep's), which a savepoint would make copy every page it touches to the
    /// statement journal. Requests queued before it commit first; it is atomic on its own (an
    /// error rolls its transaction back).
    ///
    /// # Errors
    /// The work's own error, or the error that stopped its COMMIT; either way nothing of it is
    /// stored.
    pub(crate) async fn write_alone<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteCtx<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.submit(work, true).await
    }

    /// Like [`Persistence::write`], but queued at once, when called rather than when first
    /// polled: a write the caller must have ordered before what it does next (the writer
    /// serves its mailbox in order).
    pub(crate) fn write_now<T, F>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + use<T, F>
    where
        F: FnMut(&mut WriteCtx<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.submit(work, false)
    }

    fn submit<T, F>(
        &self,
        work: F,
        alone: bool,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + use<T, F>
    where
        F: FnMut(&mut WriteCtx<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = TypedJob {
            work,
            result: None,
            reply,
            alone,
        };
        self.queue(Box::new(job), answer)
    }

    /// Queues `job`; the future resolves with its `answer`.
    fn queue<T>(
        &self,
        job: Box<dyn Job>,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> impl std::future::Future<Output = Result<T, StoreError>> + use<T> {
        // The future keeps only the answer's receiver (a failed send drops it): a burst of
        // turns keeps one per session in flight.
        let answer = self.mailbox.send(Msg::Job(job)).ok().map(|()| answer);
        async move {
            match answer {
                Some(answer) => answer.await.map_err(|_| StoreError::Closed)?,
                None => Err(StoreError::Closed),
            }
        }
    }

    /// Publishes events other nodes committed on this node's bus, as if committed here.
    pub(crate) fn rebroadcast(&self, events: Vec<EventRecord>) {
        for event in events {
            let _ = self.bus.send(Arc::new(event));
        }
    }

    /// Runs `work` on a pooled connection on a blocking thread, not behind the writer.
    ///
    /// # Errors
    /// Whatever the read returns, or a pool error.
    pub(crate) async fn read<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(&mut dyn Store) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        // One blocking thread per pooled connection at most: a burst of reads (a sweep
        // starting thousands of actors) queues here instead of starting a thread per read that
        // would then wait for a connection.
        let permit = self
            .read_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let readers = self.readers.clone();
        actix_rt::task::spawn_blocking(move || {
            let _permit = permit;
            read_on(&*readers, work)
        })
        .await
        .map_err(StoreError::ReadTask)?
    }

    /// Subscribes to every event committed from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<EventRecord>> {
        self.bus.subscribe()
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> PersistenceStats {
        let c = &self.counters;
        PersistenceStats {
            transactions: c.transactions.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// Releases the SQLite memory that is not in use: the page caches of the writer and of every
    /// idle pooled connection, on the writer thread after what is queued. Called after mass
    /// passivation, when the caches warmed by the departed sessions serve no one. Returns what
    /// the writer thread's allocator cache held then (see `thread_caches`), for the caller to
    /// give back.
    pub(crate) async fn release_memory(&self) -> Taken {
        let (tx, rx) = oneshot::channel();
        if self.mailbox.send(Msg::ReleaseMemory(tx)).is_ok() {
            if let Ok(taken) = rx.await {
                return taken;
            }
        }
        Taken::default()
    }

    /// Asks the writer to finish what is queued and stop. Later writes fail with `Closed`.
    pub(crate) async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.mailbox.send(Msg::Stop(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Runs a one-shot read on `readers` (whose interface takes a reusable closure).
fn read_on<T>(
    readers: &dyn Readers,
    work: impl FnOnce(&mut dyn Store) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut work = Some(work);
    let mut answer = None;
    readers.read(&mut |store| {
        let work = work
            .take()
            .ok_or_else(|| StoreError::Inconsistent("a read ran twice".into()))?;
        answer = Some(work(store)?);
        Ok(())
    })?;
    answer.ok_or_else(|| StoreError::Inconsistent("a read never ran".into()))
}

mod idle;
mod turn;
mod writer;

use self::writer::WriterActor;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_faults;
