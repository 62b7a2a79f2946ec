//! [`SessionEvents`]: a session's durable event log replayed from a sequence number, then
//! followed live, with no gap and no duplicate at the switch.
//!
//! The technique: subscribe *first* (to this session's route of the runtime's [`super::fanout`]),
//! then replay from the store in pages (seq greater than the last one yielded), then take live
//! events from the subscription, skipping any seq already yielded. Every event is committed
//! before it is broadcast, and broadcast in commit order, so an event is either in the store
//! when a page is read or arrives on the subscription afterwards. Delivery is bounded: a stream
//! that falls behind is cut off (the runtime never waits for it and never buffers more for
//! it), and the stream heals itself by subscribing again and re-reading the missed range from
//! the store. A stream of a silent session is never woken. A stream of a deleted session ends
//! after the session's (unstored) `session.deleted`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::Stream;

use super::fanout::{Delivery, Subscription};
use super::Sessions;
use crate::error::Result;
use crate::event::{kind, EventRecord};
use crate::id::SessionId;

/// Events read from the store per replay page.
const REPLAY_PAGE: usize = 256;

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
    /// Read the store before taking live events again.
    replay: bool,
    /// The runtime stopped: yield what the store still holds, then end.
    closing: bool,
    /// Times the subscription lagged (or skipped a seq) and the store was re-read.
    heals: u64,
}

type Item = Result<Arc<EventRecord>>;

impl Follow {
    /// Ends the stream: nothing more is read or awaited.
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

    async fn next_event(&mut self) -> Option<Item> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.last = Some(event.seq);
                return Some(Ok(event));
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
                return None;
            }
            match self.subscription.recv().await {
                Delivery::Event(event) if event.kind == kind::DELETED => {
                    // The session was deleted: this is its stream's last item.
                    self.end();
                    self.last = Some(event.seq);
                    return Some(Ok(event));
                }
                Delivery::Event(event) => {
                    let expected = self.last.map_or(0, |seq| seq + 1);
                    if event.seq < expected {
                        continue;
                    }
                    if event.seq > expected {
                        // Cannot happen without a lag; the store has it all anyway.
                        self.heals += 1;
                        self.replay = true;
                        continue;
                    }
                    self.last = Some(event.seq);
                    return Some(Ok(event));
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
                    // Its `session.deleted` may be among what was missed.
                    if let Ok(false) = self.sessions.journal.session_exists(&self.session_id).await
                    {
                        self.end();
                    }
                }
                Delivery::Closed => {
                    self.closing = true;
                    self.replay = true;
                }
            }
        }
    }
}

/// A session's durable events with seq greater than a starting point, in order, then live
/// (see [`Sessions::events`]). Read it with [`SessionEvents::next`] or as a
/// [`futures::Stream`]. Dropping it unsubscribes.
///
/// The stream ends (`None`) once the runtime has shut down and every committed event of the
/// session was yielded. An `Err` item is a failed store read; reading on retries it.
pub struct SessionEvents {
    /// The follower, when no read is in flight; `None` once the stream ended.
    idle: Option<Follow>,
    /// The read in flight: it owns the follower until it completes.
    pending: Option<BoxFuture<'static, (Follow, Option<Item>)>>,
    session_id: SessionId,
    last: Option<u64>,
    heals: u64,
}

impl std::fmt::Debug for SessionEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEvents")
            .field("session_id", &self.session_id)
            .field("last_seq", &self.last)
            .field("heals", &self.heals)
            .finish_non_exhaustive()
    }
}

impl SessionEvents {
    /// The next event; `None` once the stream ended.
    ///
    /// Cancel-safe: dropping the returned future loses nothing, the next call resumes the
    /// same read.
    pub async fn next(&mut self) -> Option<Item> {
        futures::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// The session followed.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The seq of the last event yielded (or the `after` the stream started from): a client
    /// that reconnects with it as `after` continues without a gap or a duplicate.
    pub fn last_seq(&self) -> Option<u64> {
        self.last
    }

    /// How many times the stream fell behind the bus and re-read the missed events from the
    /// store.
    pub fn heals(&self) -> u64 {
        self.heals
    }
}

impl Stream for SessionEvents {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = &mut *self;
        if this.pending.is_none() {
            let Some(mut follow) = this.idle.take() else {
                return Poll::Ready(None);
            };
            this.pending = Some(Box::pin(async move {
                let item = follow.next_event().await;
                (follow, item)
            }));
        }
        let Some(pending) = this.pending.as_mut() else {
            return Poll::Ready(None);
        };
        match pending.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((follow, item)) => {
                this.pending = None;
                this.last = follow.last;
                this.heals = follow.heals;
                if item.is_some() {
                    this.idle = Some(follow);
                }
                Poll::Ready(item)
            }
        }
    }
}

impl Sessions {
    /// The session's durable events with seq strictly greater than `after` (all when `None`),
    /// in seq order, then live as they commit — with no gap and no duplicate at the switch from
    /// replay to live, even while other tasks publish to the session. A slow reader never
    /// slows the runtime: when it falls behind the bounded bus it re-reads what it missed from
    /// the store.
    ///
    /// When retention compacted the session's log ([`crate::RetainEvents`]), a replay from the
    /// start (`after: None`) begins at the first seq still held ([`Sessions::log_start`]).
    ///
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
        // Subscribe first: everything committed from here on arrives live, everything before is
        // in the store when the first page is read.
        let subscription = self.fanout.subscribe(self, session_id);
        let start = self.log_start(session_id).await?;
        if let Some(after) = after {
            if after.saturating_add(1) < start {
                return Err(crate::Error::EventsCompacted {
                    session_id: session_id.clone(),
                    first_seq: start,
                });
            }
        }
        Ok(SessionEvents {
            idle: Some(Follow {
                sessions: self.clone(),
                session_id: session_id.clone(),
                last: after,
                subscription,
                buffer: VecDeque::new(),
                replay: true,
                closing: false,
                heals: 0,
            }),
            pending: None,
            session_id: session_id.clone(),
            last: after,
            heals: 0,
        })
    }
}

impl Sessions {
    /// The seq of the session's newest committed event (a stored session has at least its
    /// `session.created`, seq 0): its seq counter, one indexed read (retention never moves it
    /// back).
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored; [`crate::Error::Store`] when
    /// a read fails.
    pub async fn last_seq(&self, session_id: &SessionId) -> Result<u64> {
        self.require(session_id).await?;
        self.journal
            .latest_seq(session_id.clone())
            .await?
            .ok_or_else(|| crate::Error::NotFound {
                session_id: session_id.clone(),
            })
    }

    /// The session's most recent turn terminal (`session.execution.succeeded`, `failed` or
    /// `interrupted`), if any: read backwards from the end of the log a page at a time.
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored; [`crate::Error::Store`] when
    /// a read fails.
    pub async fn last_terminal(&self, session_id: &SessionId) -> Result<Option<EventRecord>> {
        let mut end = self.last_seq(session_id).await? + 1;
        let first = self.log_start(session_id).await?;
        while end > first {
            let start = end.saturating_sub(REPLAY_PAGE as u64);
            let page = self
                .journal
                .events_after(session_id.clone(), start.checked_sub(1), REPLAY_PAGE)
                .await?;
            let terminal = page.into_iter().rev().find(|e| {
                e.seq < end
                    && matches!(
                        e.kind.as_str(),
                        kind::EXECUTION_SUCCEEDED
                            | kind::EXECUTION_FAILED
                            | kind::EXECUTION_INTERRUPTED
                    )
            });
            if terminal.is_some() {
                return Ok(terminal);
            }
            end = start;
        }
        Ok(None)
    }

    /// How many event streams ([`Sessions::events`]) are open on this runtime.
    pub fn event_streams(&self) -> usize {
        self.fanout.streams()
    }
}
