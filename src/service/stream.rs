//! [`SessionStream`]: what a client watching a session reads — its durable events (replayed
//! from a sequence number, then followed, as [`super::SessionEvents`] yields them) and,
//! interleaved, the live-only events its turns publish while the stream is open (each a
//! [`StreamItem`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use super::events::{Follower, StreamItem};
use super::Sessions;
use crate::error::Result;
use crate::id::SessionId;

/// A session's durable events after a starting point, in seq order, then live, with the
/// live-only events its turns publish meanwhile (see [`Sessions::stream`]). Read it with
/// [`SessionStream::next`] or as a [`futures::Stream`]. Dropping it unsubscribes.
///
/// The durable events come exactly as from [`super::SessionEvents`]: no gap, no duplicate,
/// healed from the store after a lag. Live events are best effort: those published before
/// the stream opened are not in it, and one that finds the stream too far behind is dropped
/// for it ([`SessionStream::live_dropped`]). Each comes after the durable events its turn
/// had committed before publishing it.
#[derive(Debug)]
pub struct SessionStream {
    inner: Follower,
}

impl SessionStream {
    /// The next item; `None` once the stream ended (the runtime shut down and every committed
    /// event was yielded).
    ///
    /// Cancel-safe: dropping the returned future loses nothing, the next call resumes the
    /// same read.
    pub async fn next(&mut self) -> Option<Result<StreamItem>> {
        futures::future::poll_fn(|cx| self.inner.poll_item(cx)).await
    }

    /// The session followed.
    pub fn session_id(&self) -> &SessionId {
        self.inner.session_id()
    }

    /// The seq of the last durable event yielded (or the `after` the stream started from):
    /// a client that reconnects with it as `after` misses no durable event.
    pub fn last_seq(&self) -> Option<u64> {
        self.inner.last_seq()
    }

    /// How many times the stream fell behind and re-read the missed durable events from the
    /// store.
    pub fn heals(&self) -> u64 {
        self.inner.heals()
    }

    /// How many live-only events this stream missed because it was too far behind to take
    /// them (they cannot be read back).
    pub fn live_dropped(&self) -> u64 {
        self.inner.live_dropped()
    }
}

impl Stream for SessionStream {
    type Item = Result<StreamItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_item(cx)
    }
}

impl Sessions {
    /// The session's durable events with seq strictly greater than `after` (all when `None`),
    /// replayed and then followed exactly as [`Sessions::events`] yields them, interleaved
    /// with the live-only events ([`crate::Turn::publish_live`]) published on this node from
    /// now on: what a client watching the session shows (the HTTP SSE stream reads it).
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] when the session is not stored; [`crate::Error::Store`] when
    /// the check fails.
    pub async fn stream(
        &self,
        session_id: &SessionId,
        after: Option<u64>,
    ) -> Result<SessionStream> {
        Ok(SessionStream {
            inner: Follower::start(self, session_id, after, true).await?,
        })
    }
}
