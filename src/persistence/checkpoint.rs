//! The background checkpointer: copies the WAL back into the database file off the writer thread.
//!
//! The writer connection runs with a high `wal_autocheckpoint` ([`WRITER_AUTOCHECKPOINT`]), so
//! its COMMITs no longer checkpoint every 1,000 pages. Instead the writer nudges this thread
//! after each commit, and the thread runs `PRAGMA wal_checkpoint(PASSIVE)` on a pooled
//! connection at most once per [`INTERVAL`]. A passive checkpoint never waits for the writer or
//! for readers. If it cannot keep up (a long burst of big transactions, or a reader pinning an
//! old snapshot), the writer's own auto-checkpoint still runs once the WAL reaches
//! [`WRITER_AUTOCHECKPOINT`] pages, so the WAL stays bounded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::store::pool::Pool;

/// The shortest time between two background checkpoints.
pub(super) const INTERVAL: Duration = Duration::from_millis(50);

/// The writer connection's `wal_autocheckpoint`, in pages: the WAL size (about 32 MiB with
/// 4 KiB pages) past which the writer checkpoints inline, as SQLite does by default at 1,000.
pub(super) const WRITER_AUTOCHECKPOINT: u32 = 8192;

/// The writer's handle on the checkpointer thread.
pub(super) struct Checkpointer {
    nudge: Option<mpsc::SyncSender<()>>,
    stopping: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread; it checkpoints through connections of `pool`.
    pub(super) fn start(pool: Pool) -> std::io::Result<Self> {
        let (nudge, nudged) = mpsc::sync_channel(1);
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = thread::Builder::new()
            .name("durable-sessions-checkpoint".into())
            .spawn(move || run(&pool, &nudged, &flag))?;
        Ok(Self {
            nudge: Some(nudge),
            stopping,
            thread: Some(thread),
        })
    }

    /// Tells the thread that a transaction committed (never blocks).
    pub(super) fn committed(&self) {
        if let Some(nudge) = &self.nudge {
            let _ = nudge.try_send(());
        }
    }

    /// Stops the thread and waits for it (at most the checkpoint it is running).
    pub(super) fn stop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.nudge = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(pool: &Pool, nudged: &mpsc::Receiver<()>, stopping: &AtomicBool) {
    let mut last: Option<Instant> = None;
    // Each nudge is a commit since the last checkpoint; the channel holds at most one.
    while nudged.recv().is_ok() {
        if let Some(last) = last {
            // Pace: wait out the interval, collapsing the nudges that arrive meanwhile.
            let until = last + INTERVAL;
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                match nudged.recv_timeout(until - now) {
                    Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        }
        if stopping.load(Ordering::Acquire) {
            return;
        }
        checkpoint(pool);
        last = Some(Instant::now());
    }
}

/// One passive checkpoint; failures are logged and retried after the next commit.
fn checkpoint(pool: &Pool) {
    // Never wait for a pooled connection: a busy pool only delays the checkpoint.
    let Some(conn) = pool.try_get() else {
        log::debug!("checkpoint: no idle pooled connection; retrying after the next commit");
        return;
    };
    let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, i64>(2)?,
        ))
    });
    match result {
        Ok((_busy, log, done)) => log::trace!("checkpoint: {done} of {log} WAL frames"),
        Err(e) => log::debug!("checkpoint failed: {e}"),
    }
}
