//! When the writer checkpoints its write-ahead log while idle: once it has written and then
//! had nothing to do for [`IDLE_CHECKPOINT`], at most every [`CHECKPOINT_EVERY`].

use std::time::{Duration, Instant};

/// How long the writer must have had nothing to do before it checkpoints the write-ahead log.
pub(super) const IDLE_CHECKPOINT: Duration = Duration::from_secs(1);

/// The least time between two idle checkpoints (not one after every burst).
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(10);

/// When the writer checkpoints its log while idle.
#[derive(Debug, Default)]
pub(super) struct IdleCheckpoint {
    /// When it last wrote, if the log holds writes not checkpointed since.
    dirty: Option<Instant>,
    /// When it last tried to checkpoint.
    last: Option<Instant>,
}

impl IdleCheckpoint {
    /// A write was taken from the mailbox.
    pub(super) fn wrote(&mut self) {
        self.dirty = Some(Instant::now());
    }

    /// When to checkpoint if nothing arrives before: [`IDLE_CHECKPOINT`] after the last write,
    /// and [`CHECKPOINT_EVERY`] after the last attempt. `None` when nothing was written.
    pub(super) fn due(&self) -> Option<Instant> {
        let quiet = self.dirty? + IDLE_CHECKPOINT;
        Some(match self.last {
            Some(last) => quiet.max(last + CHECKPOINT_EVERY),
            None => quiet,
        })
    }

    /// A checkpoint was tried; `done` when it truncated the log.
    pub(super) fn checkpointed(&mut self, done: bool) {
        let now = Instant::now();
        self.last = Some(now);
        if done {
            self.dirty = None;
        } else {
            // A reader was in the way: try again after another quiet moment.
            self.dirty = Some(now);
        }
    }
}
