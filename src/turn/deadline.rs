//! [`Deadline`]: when a turn is due to end, shared by the drains of its execution
//! ([`crate::Turn::set_deadline`] writes it) and the session actor's timer, which watches it.

use std::sync::Mutex;
use std::time::Instant;

use futures::future::select;
use tokio::sync::Notify;

/// The deadline of one turn: the runtime's `turn_timeout` counted from the turn's start, and the
/// deadline its drains set; the earlier of the two applies.
#[derive(Debug)]
pub(crate) struct Deadline {
    state: Mutex<State>,
    /// Wakes the watcher when the deadline changes or the turn ends.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// `turn_timeout` after the turn started.
    configured: Option<Instant>,
    /// The latest [`Deadline::set`] (a later call replaces an earlier one).
    set: Option<Instant>,
    /// The turn ended: the watcher stops.
    closed: bool,
    /// The deadline passed while the turn could not be timed out (it was healing after a store
    /// fault): its next drain watches it again.
    unwatched: bool,
}

impl Deadline {
    /// A turn's deadline, starting with the runtime's timeout (`configured`, if any).
    pub(crate) fn new(configured: Option<Instant>) -> Self {
        Self {
            state: Mutex::new(State {
                configured,
                ..State::default()
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the turn's own deadline, replacing the one set before.
    pub(crate) fn set(&self, at: Instant) {
        self.state().set = Some(at);
        self.changed.notify_one();
    }

    /// When the turn is due to end: the earlier of the configured and the set deadline.
    pub(crate) fn due(&self) -> Option<Instant> {
        let state = self.state();
        match (state.configured, state.set) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The deadline passed while the turn could not be timed out: the next drain re-arms it.
    pub(crate) fn unwatch(&self) {
        self.state().unwatched = true;
    }

    /// Whether the deadline needs a new watcher (see [`Deadline::unwatch`]); clears the mark.
    pub(crate) fn rearm(&self) -> bool {
        std::mem::take(&mut self.state().unwatched)
    }

    /// The turn ended: [`Deadline::expired`] answers `false`.
    pub(crate) fn close(&self) {
        self.state().closed = true;
        self.changed.notify_one();
    }

    /// Resolves `true` once the deadline has passed, or `false` once the turn ended first.
    pub(crate) async fn expired(&self) -> bool {
        loop {
            // Taken before reading the state: a change after the read is not missed (the one
            // watcher gets `notify_one`'s permit).
            let changed = self.changed.notified();
            if self.state().closed {
                return false;
            }
            match self.due() {
                Some(at) if at <= Instant::now() => return true,
                Some(at) => {
                    let sleep = tokio::time::sleep_until(at.into());
                    // Either way the loop looks again: passed, changed or closed.
                    let _ = select(Box::pin(sleep), Box::pin(changed)).await;
                }
                None => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The earlier of the configured and the set deadline applies; a later `set` replaces an
    /// earlier one, even with a later instant.
    #[test]
    fn the_earlier_deadline_applies_and_a_later_set_replaces_the_earlier() {
        let now = Instant::now();
        let deadline = Deadline::new(Some(now + Duration::from_secs(10)));
        assert_eq!(deadline.due(), Some(now + Duration::from_secs(10)));
        deadline.set(now + Duration::from_secs(1));
        assert_eq!(deadline.due(), Some(now + Duration::from_secs(1)));
        deadline.set(now + Duration::from_secs(5));
        assert_eq!(deadline.due(), Some(now + Duration::from_secs(5)));
        deadline.set(now + Duration::from_secs(60));
        assert_eq!(deadline.due(), Some(now + Duration::from_secs(10)));
        assert_eq!(Deadline::new(None).due(), None);
    }

    /// A deadline marked unwatched asks for one new watcher.
    #[test]
    fn an_unwatched_deadline_is_rearmed_once() {
        let deadline = Deadline::new(None);
        assert!(!deadline.rearm());
        deadline.unwatch();
        assert!(deadline.rearm());
        assert!(!deadline.rearm());
    }

    /// The watcher answers `true` once a deadline set after it started passes, and `false` when
    /// the turn ends first.
    #[actix_rt::test]
    async fn the_watcher_sees_a_new_deadline_and_the_turn_ending() {
        let deadline = std::sync::Arc::new(Deadline::new(None));
        let watched = deadline.clone();
        let watcher = actix_rt::spawn(async move { watched.expired().await });
        tokio::task::yield_now().await;
        deadline.set(Instant::now() + Duration::from_millis(20));
        assert!(watcher.await.unwrap());

        let deadline = std::sync::Arc::new(Deadline::new(Some(
            Instant::now() + Duration::from_secs(60),
        )));
        let watched = deadline.clone();
        let watcher = actix_rt::spawn(async move { watched.expired().await });
        tokio::task::yield_now().await;
        deadline.close();
        assert!(!watcher.await.unwrap());
    }
}
