//! [`Fanout`]: per-session delivery of committed events, and of live-only events, to the
//! runtime's event streams.
//!
//! The journal's bus is global: every subscriber of it sees every event of every session. A
//! server with thousands of open event streams, most of them on silent sessions, would wake
//! each of them for each event of any session. Instead, one dispatcher per runtime (a thread of
//! its own, started with the first stream) takes the bus and hands each event only to the
//! streams of its session, through a small bounded channel per stream. A stream of a silent
//! session is never woken; it costs its channel and its entry in the routing table.
//!
//! Live-only events (`Turn::publish_live`) never touch the bus, the writer or the store: the
//! publishing drain hands each one, as one `Arc`, straight to the channels of its session's
//! streams that take live events ([`Fanout`] is the turns' [`LiveSink`]), on its own thread.
//!
//! Nothing here is durable and nothing waits for a reader: a stream whose channel is full, or
//! every stream when the dispatcher itself lagged behind the bus, is cut off (its channel
//! closed). The stream sees [`Delivery::Lagged`], subscribes again, and re-reads what it missed
//! from the store, where every event is before it is broadcast. A live event that finds a
//! stream's channel full is dropped for that stream only (counted, not cut off: the store
//! could not give it back anyway).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use self::queue::TrySendError;

use super::Sessions;
use crate::event::{EventRecord, LiveEvent};
use crate::id::SessionId;
use crate::turn::LiveSink;

mod queue;

/// Events a stream may have waiting before it is cut off (and re-reads the store).
const STREAM_BUFFER: usize = 64;

/// How often the dispatcher checks, while the bus is quiet, whether the runtime shut down.
const CLOSED_POLL: Duration = Duration::from_millis(250);

/// What a route carries to its stream.
enum Routed {
    /// A committed event.
    Durable(Arc<EventRecord>),
    /// A live-only event.
    Live(Arc<LiveEvent>),
}

/// The receiving end of one route.
type Receiver = queue::Receiver<Routed>;

/// One stream's end of its session's route.
struct Route {
    id: u64,
    sender: queue::Sender<Routed>,
    /// Live events dropped for this stream (its channel was full); `None` for a stream that
    /// takes durable events only, to which live events are never sent.
    live: Option<Arc<AtomicU64>>,
}

/// What the dispatcher and the streams share.
#[derive(Default)]
struct Routes {
    /// The streams of each session that has any.
    table: Mutex<HashMap<SessionId, Vec<Route>>>,
    /// Ids of routes (a stream that renews its route gets a new one).
    next_id: AtomicU64,
    /// The runtime shut down (or the bus closed): no route is added any more.
    closed: AtomicBool,
    /// Open subscriptions.
    streams: AtomicUsize,
}

impl Routes {
    fn table(&self) -> MutexGuard<'_, HashMap<SessionId, Vec<Route>>> {
        // A panic while the lock was held leaves a table that is still consistent.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a route for `session` (taking live events when `live` counts their drops);
    /// `None` once closed.
    fn add(&self, session: &SessionId, live: Option<&Arc<AtomicU64>>) -> Option<(u64, Receiver)> {
        let (sender, receiver) = queue::channel(STREAM_BUFFER);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut table = self.table();
        // Checked under the lock: `close` empties the table under it too.
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        table.entry(session.clone()).or_default().push(Route {
            id,
            sender,
            live: live.cloned(),
        });
        Some((id, receiver))
    }

    fn remove(&self, session: &SessionId, id: u64) {
        let mut table = self.table();
        if let Some(routes) = table.get_mut(session) {
            routes.retain(|route| route.id != id);
            if routes.is_empty() {
                table.remove(session);
            }
        }
    }

    /// Hands `event` to its session's streams; a stream whose buffer is full is cut off.
    fn route(&self, event: &Arc<EventRecord>) {
        let mut table = self.table();
        let Some(routes) = table.get_mut(&event.session_id) else {
            return;
        };
        routes.retain(|route| {
            route
                .sender
                .try_send(Routed::Durable(event.clone()))
                .is_ok()
        });
        if routes.is_empty() {
            table.remove(&event.session_id);
        }
    }

    /// Hands a live event to its session's streams that take live events; a stream whose
    /// buffer is full misses it (and counts it), a closed one is removed.
    fn route_live(&self, event: &Arc<LiveEvent>) {
        let mut table = self.table();
        let Some(routes) = table.get_mut(&event.session_id) else {
            return;
        };
        routes.retain(|route| {
            let Some(dropped) = &route.live else {
                return true;
            };
            match route.sender.try_send(Routed::Live(event.clone())) {
                Ok(()) => true,
                Err(TrySendError::Full) => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(TrySendError::Closed) => false,
            }
        });
        if routes.is_empty() {
            table.remove(&event.session_id);
        }
    }

    /// Cuts every stream off (they re-read the store); with `for_good`, no route is added again.
    fn cut_all(&self, for_good: bool) {
        let mut table = self.table();
        if for_good {
            self.closed.store(true, Ordering::Release);
        }
        table.clear();
    }
}

/// The per-session event router of one runtime (see the module docs).
#[derive(Default)]
pub(crate) struct Fanout {
    routes: Arc<Routes>,
    /// Set once the dispatcher thread runs.
    dispatcher: OnceLock<()>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("streams", &self.streams())
            .finish_non_exhaustive()
    }
}

impl Fanout {
    /// Subscribes to the events of `session` committed from now on, and (with `live`) to its
    /// live-only events published from now on. The dispatcher is subscribed to the bus before
    /// the route exists, so every event committed after this call is delivered (or the stream
    /// is told it lagged).
    pub(crate) fn subscribe(
        &self,
        sessions: &Sessions,
        session: &SessionId,
        live: bool,
    ) -> Subscription {
        self.dispatcher
            .get_or_init(|| start(sessions, self.routes.clone()));
        let live = live.then(Arc::default);
        let route = self.routes.add(session, live.as_ref());
        self.routes.streams.fetch_add(1, Ordering::Relaxed);
        Subscription {
            routes: self.routes.clone(),
            session: session.clone(),
            route,
            live,
        }
    }

    /// How many subscriptions are open.
    pub(crate) fn streams(&self) -> usize {
        self.routes.streams.load(Ordering::Relaxed)
    }
}

impl LiveSink for Fanout {
    fn publish(&self, event: Arc<LiveEvent>) {
        self.routes.route_live(&event);
    }
}

/// Starts the dispatcher thread. It ends when the runtime shut down or the bus closed. When the journal resynchronizes (another node
/// committed events this one was not told about one by one), every stream re-reads the store.
fn start(sessions: &Sessions, routes: Arc<Routes>) {
    let bus = sessions.journal.subscribe();
    let journal = sessions.journal.clone();
    let execution = sessions.execution.clone();
    let shared = routes.clone();
    let spawned = std::thread::Builder::new()
        .name("ds-fanout".into())
        .spawn(move || {
            let watch = Watch {
                closed: Box::new(move || execution.is_closed()),
                resyncs: Box::new(move || journal.resyncs()),
            };
            match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(rt) => rt.block_on(dispatch(bus, watch, shared.clone())),
                Err(e) => log::error!("event fan-out: cannot start its runtime: {e}"),
            }
            shared.cut_all(true);
        });
    if let Err(e) = spawned {
        log::error!("event fan-out: cannot start its thread: {e}");
        // Streams then see a closed runtime and end after replaying the store.
        routes.cut_all(true);
    }
}

/// What the dispatcher checks while the bus is quiet.
struct Watch {
    closed: Box<dyn Fn() -> bool + Send>,
    resyncs: Box<dyn Fn() -> u64 + Send>,
}

async fn dispatch(
    mut bus: broadcast::Receiver<Arc<EventRecord>>,
    watch: Watch,
    routes: Arc<Routes>,
) {
    let mut resyncs = (watch.resyncs)();
    loop {
        match tokio::time::timeout(CLOSED_POLL, bus.recv()).await {
            Ok(Ok(event)) => routes.route(&event),
            Ok(Err(RecvError::Lagged(missed))) => {
                log::debug!("event fan-out lagged by {missed} events; streams re-read the store");
                routes.cut_all(false);
            }
            Ok(Err(RecvError::Closed)) => return,
            Err(_quiet) => {
                if (watch.closed)() {
                    return;
                }
                let now = (watch.resyncs)();
                if now != resyncs {
                    resyncs = now;
                    routes.cut_all(false);
                }
            }
        }
    }
}

/// What [`Subscription::recv`] got.
pub(crate) enum Delivery {
    /// The next event of the session (possibly one already seen: streams skip those).
    Event(Arc<EventRecord>),
    /// A live-only event of the session (only to a subscription that takes them).
    Live(Arc<LiveEvent>),
    /// Events may have been dropped for this stream: re-read the store, then [`Subscription::renew`].
    Lagged,
    /// The runtime shut down: nothing more will be delivered.
    Closed,
}

/// One stream's subscription to its session's events; dropping it unsubscribes.
pub(crate) struct Subscription {
    routes: Arc<Routes>,
    session: SessionId,
    /// The route and its receiving end; `None` once closed.
    route: Option<(u64, Receiver)>,
    /// For a subscription that takes live events: how many were dropped for it (kept across
    /// renewals).
    live: Option<Arc<AtomicU64>>,
}

impl Subscription {
    /// The next delivery. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Delivery {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next delivery: [`Subscription::recv`] without a future (the follower's
    /// fast path, which waits on the route for as long as its session is silent).
    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Delivery> {
        let Some((_, receiver)) = self.route.as_mut() else {
            return std::task::Poll::Ready(Delivery::Closed);
        };
        receiver.poll_recv(cx).map(|routed| match routed {
            Some(Routed::Durable(event)) => Delivery::Event(event),
            Some(Routed::Live(event)) => Delivery::Live(event),
            None if self.routes.closed.load(Ordering::Acquire) => Delivery::Closed,
            None => Delivery::Lagged,
        })
    }

    /// Replaces a cut-off route with a new one (call it before re-reading the store).
    pub(crate) fn renew(&mut self) {
        if let Some((id, _)) = self.route.take() {
            self.routes.remove(&self.session, id);
        }
        self.route = self.routes.add(&self.session, self.live.as_ref());
    }

    /// How many live events were dropped for this subscription because its buffer was full.
    pub(crate) fn live_dropped(&self) -> u64 {
        self.live
            .as_ref()
            .map_or(0, |dropped| dropped.load(Ordering::Relaxed))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some((id, _)) = self.route.take() {
            self.routes.remove(&self.session, id);
        }
        self.routes.streams.fetch_sub(1, Ordering::Relaxed);
    }
}
