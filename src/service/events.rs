//! [`SessionEvents`]: a session's durable event log replayed from a sequence number, then
//! followed live, with no gap and no duplicate at the switch; and the engine it shares with
//! [`super::SessionStream`], which also yields live-only events.
//!
//! The technique: subscribe *first* (to this session's route of the runtime's [`super::fanout`]),
//! then replay from the store in pages (seq greater than the last one yielded), then take live
//! events from the subscription, skipping any seq already yielded. Every event is committed
//! before it is broadcast, and broadcast in commit order, so an event is either in the store
//! when a page is read or arrives on the subscription afterwards. Delivery is bounded: a stream
//! that falls behind is cut off (the runtime never waits for it and never buffers more for
//! it), and the stream heals itself by subscribing again and re-reading the missed range from
//! the store. A stream of a silent session is never woken.
//!
//! A live-only event comes straight from its publisher, so it may arrive before a durable
//! event its turn committed earlier (that one goes through the bus and the dispatcher): it is
//! held until the stream has yielded the event's `after_seq`, which is committed, so it arrives
//! on the subscription or is read from the store like any other.
//!
//! A stream of a deleted session ends after the session's (unstored) `session.deleted`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::Stream;

use super::fanout::{Delivery, Subscription};
use super::Sessions;
use crate::error::Result;
use crate::event::{kind, EventRecord, LiveEvent};
use crate::id::SessionId;

/// Events read from the store per replay page.
pub(super) const REPLAY_PAGE: usize = 1024;

/// Live events a stream holds at most while it waits for the durable events before them
/// (the oldest is dropped past it). Reached only if the store cannot be read meanwhile.
const MAX_HELD: usize = 1024;

/// One item of a [`super::SessionStream`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A durable event of the session's log: it has a seq, and a reconnecting client gets it
    /// again if it missed it.
    Event(Arc<EventRecord>),
    /// A live-only event ([`crate::Turn::publish_live`]): no seq, never stored, never
    /// replayed.
    Live(Arc<LiveEvent>),
}

impl StreamItem {
    /// The seq of a durable event; `None` for a live-only one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            StreamItem::Event(event) => Some(event.seq),
            StreamItem::Live(_) => None,
        }
    }

    /// The event's wire name (its `type`).
    pub fn kind(&self) -> &str {
        match self {
            StreamItem::Event(event) => &event.kind,
            StreamItem::Live(event) => &event.kind,
        }
    }

    /// The event's payload.
    pub fn data(&self) -> &serde_json::Value {
        match self {
            StreamItem::Event(event) => &event.data,
            StreamItem::Live(event) => &event.data,
        }
    }

    /// Whether both are the same shared event (the same `Arc`): every stream of a session is
    /// handed the same one.
    pub(crate) fn same(&self, other: &StreamItem) -> bool {
        match (self, other) {
            (StreamItem::Event(a), StreamItem::Event(b)) => Arc::ptr_eq(a, b),
            (StreamItem::Live(a), StreamItem::Live(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The follower's state; moved into the in-flight future while a read is pending.
struct Follow {
    /// The service the stream reads through.
    sessions: Sessions,
    session_id: SessionId,
    /// The seq of the last event yielded (or the `after` the stream started from).
    last: Option<u64>,
    subscription: Subscription,
    /// Replayed events not yet yielded.
    buffer: VecDeque<Arc<EventRecord>>,
    /// Live events received, in order, not yet yielded: the first waits until `last` reaches
    /// its `after_seq`.
    held: VecDeque<Arc<LiveEvent>>,
    /// Live events dropped from `held` (at [`MAX_HELD`]).
    held_dropped: u64,
    /// Read the store before taking live events again.
    replay: bool,
    /// The runtime stopped: yield what the store still holds, then end.
    closing: bool,
    /// Times the subscription lagged (or skipped a seq) and the store was re-read.
    heals: u64,
    /// The route lagged: check the session still exists before re-reading the store (its
    /// `session.deleted` may be among what was missed).
    check_exists: bool,
}

type Item = Result<StreamItem>;

impl Follow {
    /// The oldest held live event, once the durable events its turn wrote before it were
    /// yielded.
    fn released(&mut self) -> Option<Arc<LiveEvent>> {
        let first = self.held.front()?;
        if self.last.is_some_and(|last| last >= first.after_seq) {
            self.held.pop_front()
        } else {
            None
        }
    }

    /// Ends the stream: nothing more is read or awaited (what is held still goes out).
    fn end(&mut self) {
        self.closing = true;
        self.replay = false;
        self.buffer.clear();
    }

    /// Whether `page`, read after the last seq yielded, skips seqs: retention compacted the
    /// session's log past this follower (which fell that far behind).
    fn compacted_under(&self, page: &[EventRecord]) -> bool {
        match (self.last, page.first()) {
            (Some(last), Some(first)) => first.seq > last + 1,
            _ => false,
        }
    }

    /// What a delivery from the route makes the follower yield (`None`: nothing yet).
    fn take(&mut self, delivery: Delivery) -> Option<StreamItem> {
        match delivery {
            Delivery::Event(event) if event.kind == kind::DELETED => {
                // The session was deleted: this is its stream's last durable item.
                self.end();
                self.last = Some(event.seq);
                Some(StreamItem::Event(event))
            }
            Delivery::Event(event) => {
                let expected = self.last.map_or(0, |seq| seq + 1);
                if event.seq < expected {
                    return None;
                }
                if event.seq > expected {
                    // Cannot happen without a lag; the store has it all anyway.
                    self.heals += 1;
                    self.replay = true;
                    return None;
                }
                self.last = Some(event.seq);
                Some(StreamItem::Event(event))
            }
            Delivery::Live(event) => {
                if self.held.len() == MAX_HELD {
                    self.held.pop_front();
                    self.held_dropped += 1;
                }
                // Yielded once its turn's earlier writes were.
                self.held.push_back(event);
                None
            }
            Delivery::Lagged => {
                log::debug!(
                    "events of {}: the stream fell behind; re-reading the store",
                    self.session_id
                );
                // Subscribe again before reading: nothing committed from now on is missed.
                self.subscription.renew();
                self.heals += 1;
                self.replay = true;
                self.check_exists = true;
                None
            }
            Delivery::Closed => {
                self.closing = true;
                self.replay = true;
                None
            }
        }
    }

    /// The next item that needs no store read: what is buffered, or what the route holds.
    /// `Ready(None)` when the store must be read (or the stream is ending): see
    /// [`Follow::next_item`]. No future, no allocation: this is what a follower does for each
    /// event it follows live.
    fn poll_fast(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        loop {
            if let Some(live) = self.released() {
                return Poll::Ready(Some(StreamItem::Live(live)));
            }
            if let Some(event) = self.buffer.pop_front() {
                self.last = Some(event.seq);
                return Poll::Ready(Some(StreamItem::Event(event)));
            }
            if self.replay || self.closing || self.check_exists {
                return Poll::Ready(None);
            }
            let Poll::Ready(delivery) = self.subscription.poll_recv(cx) else {
                return Poll::Pending;
            };
            if let Some(item) = self.take(delivery) {
                return Poll::Ready(Some(item));
            }
        }
    }

    async fn next_item(&mut self) -> Option<Item> {
        loop {
            if let Some(live) = self.released() {
                return Some(Ok(StreamItem::Live(live)));
            }
            if let Some(event) = self.buffer.pop_front() {
                self.last = Some(event.seq);
                return Some(Ok(StreamItem::Event(event)));
            }
            if std::mem::take(&mut self.check_exists) {
                if let Ok(false) = self.sessions.journal.session_exists(&self.session_id).await {
                    self.end();
                }
            }
            if self.replay {
                // Boxed: a follower waits far longer on the live route than on the store, and
                // its pending future should not carry the read's state all that time.
                let page = Box::pin(self.sessions.journal.events_after(
                    self.session_id.clone(),
                    self.last,
                    REPLAY_PAGE,
                ))
                .await;
                match page {
                    Ok(page) if self.compacted_under(&page) => {
                        let first_seq = page.first().map_or(0, |e| e.seq);
                        self.end();
                        return Some(Err(crate::Error::EventsCompacted {
                            session_id: self.session_id.clone(),
                            first_seq,
                        }));
                    }
                    Ok(page) => {
                        self.replay = page.len() == REPLAY_PAGE;
                        if !self.replay && self.buffer.is_empty() && page.is_empty() {
                            // Caught up: give back a large replay buffer before waiting.
                            self.buffer = VecDeque::new();
                        }
                        self.buffer.extend(page.into_iter().map(Arc::new));
                        continue;
                    }
                    // The next call retries the same page.
                    Err(e) => return Some(Err(e.into())),
                }
            }
            if self.closing {
                // Nothing more comes: what is still held goes out before the end.
                return self.held.pop_front().map(|live| Ok(StreamItem::Live(live)));
            }
            let delivery = self.subscription.recv().await;
            if let Some(item) = self.take(delivery) {
                return Some(Ok(item));
            }
        }
    }
}

/// The engine of [`SessionEvents`] and [`super::SessionStream`]: a [`Follow`] driven as a
/// cancel-safe stream, with what it has yielded so far.
pub(super) struct Follower {
    /// The follower, when no read is in flight; `None` once the stream ended.
    idle: Option<Follow>,
    /// The read in flight: it owns the follower until it completes.
    pending: Option<BoxFuture<'static, (Follow, Option<Item>)>>,
    session_id: SessionId,
    last: Option<u64>,
    heals: u64,
    live_dropped: u64,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("session_id", &self.session_id)
            .field("last_seq", &self.last)
            .field("heals", &self.heals)
            .finish_non_exhaustive()
    }
}

impl Follower {
    /// Subscribes to `session_id`'s route (with `live`, to its live events too), checks the
    /// session exists, and starts after `after`.
    pub(super) async fn start(
        sessions: &Sessions,
        session_id: &SessionId,
        after: Option<u64>,
        live: bool,
    ) -> Result<Self> {
        // Subscribe first: everything committed from here on arrives live, everything before is
        // in the store when the first page is read.
        let subscription = sessions.fanout.subscribe(sessions, session_id, live);
        let start = sessions.log_start(session_id).await?;
        if let Some(after) = after {
            if after.saturating_add(1) < start {
                return Err(crate::Error::EventsCompacted {
                    session_id: session_id.clone(),
                    first_seq: start,
                });
            }
        }
        Ok(Follower {
            idle: Some(Follow {
                sessions: sessions.clone(),
                session_id: session_id.clone(),
                last: after,
                subscription,
                buffer: VecDeque::new(),
                held: VecDeque::new(),
                held_dropped: 0,
                replay: true,
                closing: false,
                heals: 0,
                check_exists: false,
            }),
            pending: None,
            session_id: session_id.clone(),
            last: after,
            heals: 0,
            live_dropped: 0,
        })
    }

    /// The session followed.
    pub(super) fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The seq of the last durable event yielded (or the `after` the stream started from).
    pub(super) fn last_seq(&self) -> Option<u64> {
        self.last
    }

    /// Times the stream fell behind and re-read the store.
    pub(super) fn heals(&self) -> u64 {
        self.heals
    }

    /// Live events this stream missed because it was behind.
    pub(super) fn live_dropped(&self) -> u64 {
        self.live_dropped
    }

    /// Copies what the follower counts, for the accessors.
    fn note(&mut self) {
        if let Some(follow) = &self.idle {
            self.last = follow.last;
            self.heals = follow.heals;
            self.live_dropped = follow.subscription.live_dropped() + follow.held_dropped;
        }
    }

    pub(super) fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        if self.pending.is_none() {
            let Some(follow) = self.idle.as_mut() else {
                return Poll::Ready(None);
            };
            // The fast path: an event the route already holds, or a wait on the route, needs
            // no future (one per event would be an allocation per event and stream).
            match follow.poll_fast(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(item)) => {
                    self.note();
                    return Poll::Ready(Some(Ok(item)));
                }
                Poll::Ready(None) => {}
            }
            let Some(mut follow) = self.idle.take() else {
                return Poll::Ready(None);
            };
            self.pending = Some(Box::pin(async move {
                let item = follow.next_item().await;
                (follow, item)
            }));
        }
        let Some(pending) = self.pending.as_mut() else {
            return Poll::Ready(None);
        };
        match pending.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((follow, item)) => {
                self.pending = None;
                self.idle = Some(follow);
                self.note();
                if item.is_none() {
                    self.idle = None;
                }
                Poll::Ready(item)
            }
        }
    }
}

/// A session's durable events with seq greater than a starting point, in order, then live
/// (see [`Sessions::events`]). Read it with [`SessionEvents::next`] or as a
/// [`futures::Stream`]. Dropping it unsubscribes.
///
/// The stream ends (`None`) once the runtime has shut down and every committed event of the
/// session was yielded. An `Err` item is a failed store read; reading on retries it. It never
/// yields live-only events (see [`Sessions::stream`] for a stream that does).
#[derive(Debug)]
pub struct SessionEvents {
    inner: Follower,
}

impl SessionEvents {
    /// The next event; `None` once the stream ended.
    ///
    /// Cancel-safe: dropping the returned future loses nothing, the next call resumes the
    /// same read.
    pub async fn next(&mut self) -> Option<Result<Arc<EventRecord>>> {
        futures::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// The session followed.
    pub fn session_id(&self) -> &SessionId {
        self.inner.session_id()
    }

    /// The seq of the last event yielded (or the `after` the stream started from): a client
    /// that reconnects with it as `after` continues without a gap or a duplicate.
    pub fn last_seq(&self) -> Option<u64> {
        self.inner.last_seq()
    }

    /// How many times the stream fell behind the bus and re-read the missed events from the
    /// store.
    pub fn heals(&self) -> u64 {
        self.inner.heals()
    }
}

impl Stream for SessionEvents {
    type Item = Result<Arc<EventRecord>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match self.inner.poll_item(cx) {
                Poll::Ready(Some(Ok(StreamItem::Event(event)))) => Poll::Ready(Some(Ok(event))),
                // Not subscribed to them: none comes.
                Poll::Ready(Some(Ok(StreamItem::Live(_)))) => continue,
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

impl Sessions {
    /// The session's durable events with seq strictly greater than `after` (all when `None`),
    /// in seq order, then live as they commit — with no gap and no duplicate at the switch from
    /// replay to live, even while other tasks publish to the session. A slow reader never
    /// slows the runtime: when it falls behind the bounded bus it re-reads what it missed from
    /// the store. Live-only events ([`crate::Turn::publish_live`]) are not in it: read
    /// [`Sessions::stream`] for both.
    ///
    /// When retention compacted the session's log ([`crate::RetainEvents`]), a replay from the
    /// start (`after: None`) begins at the first seq still held ([`Sessions::log_start`]).
    /// When the session is deleted ([`Sessions::delete`]), the stream yields its
    /// `session.deleted` event and ends.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored;
    /// [`crate::Error::EventsCompacted`] when `after` is before the start of the compacted log
    /// (events after it are gone: the error names the first seq still held);
    /// [`crate::Error::Store`] when the check fails. The stream itself yields
    /// `EventsCompacted` (and ends) if it fell so far behind that retention compacted past it.
    pub async fn events(
        &self,
        session_id: &SessionId,
        after: Option<u64>,
    ) -> Result<SessionEvents> {
        Ok(SessionEvents {
            inner: Follower::start(self, session_id, after, false).await?,
        })
    }
}
