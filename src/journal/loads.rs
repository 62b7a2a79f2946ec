//! Loading sessions for actors that start in a burst (the restart sweep, a wave of wakes): the
//! loads queue here and one blocking read serves the whole queue on one pooled connection,
//! instead of a task hand-off and a blocking thread's turn for each actor.

use std::sync::{Arc, Mutex};

use futures::channel::oneshot;

use super::backend::{Ownership, Store};
use super::sessions::Loaded;
use super::Journal;
use crate::error::StoreError;
use crate::id::SessionId;

/// Loads served by one read transaction at most, so a long burst does not hold one read
/// snapshot (and the WAL behind it) for its whole length.
const BATCH: usize = 1024;

type Reply = oneshot::Sender<Result<Loaded, StoreError>>;

/// The loads waiting for the next batch, and whether a batch is running (it takes what is
/// queued before it stops).
#[derive(Debug, Default)]
pub(super) struct Loads {
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: Vec<(SessionId, Reply)>,
    draining: bool,
}

impl Loads {
    /// Queues a load; `true` when no batch is running, so the caller must start one.
    fn push(&self, id: SessionId, reply: Reply) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.waiting.push((id, reply));
        !std::mem::replace(&mut queue.draining, true)
    }

    /// The next batch; empty (and the drainer marked gone) when nothing waits.
    fn next_batch(&self) -> Vec<(SessionId, Reply)> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.waiting.len() <= BATCH {
            if queue.waiting.is_empty() {
                queue.draining = false;
            }
            return std::mem::take(&mut queue.waiting);
        }
        queue.waiting.drain(..BATCH).collect()
    }
}

/// Whether the session is stored, who owns it and its latest interrupt request.
pub(super) fn load_one(store: &mut dyn Store, id: &SessionId) -> Result<Loaded, StoreError> {
    let (ownership, node) = store.acquire_under(id)?;
    let fence = match ownership {
        Ownership::Missing => None,
        _ => store.latest_interrupt_seq(id)?,
    };
    Ok(Loaded {
        ownership,
        fence,
        node,
    })
}

impl Journal {
    /// Loads `id` in the next batch (a read: one process owns the database).
    pub(super) async fn load_batched(&self, id: SessionId) -> Result<Loaded, StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.inner.loads.push(id.clone(), reply) {
            let journal = self.clone();
            actix_rt::spawn(async move { journal.drain_loads().await });
        }
        match answer.await {
            Ok(loaded) => loaded,
            // The batch could not run (its read failed before it started): load alone, to get
            // this load's own answer or error.
            Err(oneshot::Canceled) => {
                self.inner
                    .persistence
                    .read(move |store| load_one(store, &id))
                    .await
            }
        }
    }

    /// Serves queued loads, a batch per read, until none waits.
    async fn drain_loads(&self) {
        loop {
            let batch = self.inner.loads.next_batch();
            if batch.is_empty() {
                return;
            }
            let batch = Arc::new(Mutex::new(batch));
            let serving = Arc::clone(&batch);
            let served = self
                .inner
                .persistence
                .read(move |store| {
                    let batch =
                        std::mem::take(&mut *serving.lock().unwrap_or_else(|e| e.into_inner()));
                    for (id, reply) in batch {
                        let _ = reply.send(load_one(store, &id));
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = served {
                // Dropping the replies that were not served sends each waiter to load alone.
                log::warn!("a batch of session loads failed, loading one by one: {e}");
                batch.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
        }
    }
}
