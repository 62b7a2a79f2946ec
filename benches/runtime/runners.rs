//! The runners the scenarios drive: empty drains, drains that timestamp their start, drains that
//! count their starts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use durable_sessions::{RunError, Runner, Turn};
use futures::channel::mpsc;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use tokio::sync::Notify;

/// A drain that completes at once: the empty-drain turn.
#[derive(Debug, Clone, Copy)]
pub struct Empty;

impl Runner for Empty {
    fn drain(&self, _turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        async { Ok(()) }.boxed_local()
    }
}

/// An empty drain that sends `Instant::now()` at its start.
#[derive(Debug)]
pub struct Stamp {
    starts: mpsc::UnboundedSender<Instant>,
}

impl Stamp {
    /// The runner and the receiving end of its timestamps.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Instant>) {
        let (starts, rx) = mpsc::unbounded();
        (Self { starts }, rx)
    }
}

impl Runner for Stamp {
    fn drain(&self, _turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let _ = self.starts.unbounded_send(Instant::now());
        async { Ok(()) }.boxed_local()
    }
}

/// An empty drain that counts its starts and notes when the `target`-th one started; with
/// [`Counting::holding`], a drain that never ends (a turn blocked in its drain).
#[derive(Debug, Clone)]
pub struct Counting {
    state: Arc<CountState>,
    hold: bool,
}

#[derive(Debug)]
struct CountState {
    started: AtomicUsize,
    target: usize,
    reached_at: Mutex<Option<Instant>>,
    first_at: Mutex<Option<Instant>>,
    reached: Notify,
}

impl Counting {
    /// Counts towards `target` drain starts.
    pub fn new(target: usize) -> Self {
        Self {
            state: Arc::new(CountState {
                started: AtomicUsize::new(0),
                target,
                reached_at: Mutex::new(None),
                first_at: Mutex::new(None),
                reached: Notify::new(),
            }),
            hold: false,
        }
    }

    /// Counts towards `target` drain starts; every drain stays pending until cancelled.
    #[cfg(feature = "testing-postgres")]
    pub fn holding(target: usize) -> Self {
        Self {
            hold: true,
            ..Self::new(target)
        }
    }

    /// When the first drain started, if one did.
    #[cfg(feature = "testing-postgres")]
    pub fn first(&self) -> Option<Instant> {
        *self
            .state
            .first_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Drains started so far.
    pub fn started(&self) -> usize {
        self.state.started.load(Ordering::Acquire)
    }

    /// Resolves once `target` drains have started, with the instant the last one started.
    pub async fn reached(&self) -> Instant {
        loop {
            let notified = self.state.reached.notified();
            if let Some(at) = *self
                .state
                .reached_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
            {
                return at;
            }
            notified.await;
        }
    }
}

impl Runner for Counting {
    fn drain(&self, _turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let now = Instant::now();
        let before = self.state.started.fetch_add(1, Ordering::AcqRel);
        if before == 0 {
            *self
                .state
                .first_at
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
        if before + 1 == self.state.target {
            *self
                .state
                .reached_at
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(now);
            self.state.reached.notify_waiters();
        }
        if self.hold {
            return futures::future::pending().boxed_local();
        }
        async { Ok(()) }.boxed_local()
    }
}
