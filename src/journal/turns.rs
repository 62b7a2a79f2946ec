//! What a turn writes and reads: its claim, promotions, messages and events, its settlement,
//! and the reads of the log and the transcript.
//!
//! Every write of a turn carries the fencing epoch its session actor holds and checks it first,
//! in the same transaction (`Store::check_fence`): a node another node took the session from
//! writes nothing more to it.
//!
//! A turn is claimed in one place ([`Journal::claim_turn`]: `session.execution.started`, whose
//! projection takes the claim) and released in one place ([`Journal::settle_turn`]: the
//! terminal event, whose projection releases the claim unless the turn was interrupted by a
//! shutdown).

use std::future::Future;

use serde_json::Value;

use super::backend::Store;
use super::turn_write::{TurnWrite, TurnWriteKind};
use super::Journal;
use crate::error::StoreError;
use crate::event::EventRecord;
use crate::id::{MessageId, SessionId};
use crate::outcome::Terminal;
use crate::records::{Admission, Message, MessagesQuery};

/// A transcript read for the session service.
#[derive(Debug)]
pub(crate) enum Transcript<T> {
    /// The session is not stored.
    Missing,
    /// This message of the session could not be decoded.
    Undecodable(MessageId),
    /// The answer.
    Found(T),
}

/// Runs `read` for a stored session, diagnosing a JSON decode failure to the first undecodable
/// message of the session.
fn read_transcript<T>(
    conn: &mut dyn Store,
    session: &SessionId,
    read: impl FnOnce(&mut dyn Store) -> Result<T, StoreError>,
) -> Result<Transcript<T>, StoreError> {
    if !conn.session_exists(session)? {
        return Ok(Transcript::Missing);
    }
    match read(conn) {
        Ok(found) => Ok(Transcript::Found(found)),
        Err(StoreError::Json(e)) => conn
            .undecodable_message(session)?
            .map(Transcript::Undecodable)
            .ok_or(StoreError::Json(e)),
        Err(other) => Err(other),
    }
}

impl Journal {
    /// Claims a turn of `session` for process boot `boot`: commits `session.execution.started`
    /// (data `{"boot"}`), whose projection takes the claim (`Store::claim_turn`). Queued to the
    /// writer when called; resolves, with the event's seq, once it is durable. The future holds
    /// only the writer's answer, not the request: a restart sweep keeps one per resumed session
    /// in flight at once.
    pub(crate) fn claim_turn(
        &self,
        session: SessionId,
        boot: String,
        epoch: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + 'static {
        let claimed = self.inner.persistence.write_turn(TurnWrite {
            session,
            epoch,
            kind: TurnWriteKind::Claim { boot },
        });
        async move {
            claimed
                .await?
                .ok_or_else(|| StoreError::Inconsistent("a claim without a seq".into()))
        }
    }

    /// Records how the turn of `session` ended, which releases its claim — except after a
    /// shutdown, which keeps it for the next boot. (A turn whose claim never committed is not
    /// settled here: it never started, and its session actor records nothing.) For any other
    /// ending, decided while the claim is still held: returns the admission seq of the next
    /// queued prompt the session must run in a turn of its own (see `Store::settle`). Queued to
    /// the writer when called, like [`Journal::claim_turn`]; the event is built on the writer
    /// (a queued request holds the smaller terminal).
    pub(crate) fn settle_turn(
        &self,
        session: SessionId,
        terminal: Terminal,
        epoch: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + 'static {
        self.inner.persistence.write_turn(TurnWrite {
            session,
            epoch,
            kind: TurnWriteKind::Settle { terminal },
        })
    }

    /// Promotes every pending `steer` input admitted at or before `cutoff` (all when `None`),
    /// in admission order; each promotion commits its event, `promoted_seq` and transcript row
    /// together.
    pub(crate) async fn promote_steer(
        &self,
        session: SessionId,
        cutoff: Option<u64>,
        epoch: u64,
    ) -> Result<Vec<Admission>, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                let promoted = w.store().promote_steer(&session, cutoff, super::now_ms())?;
                if !promoted.is_empty() {
                    crate::crash::point(crate::crash::DURING_PROMOTION);
                }
                Ok(promoted
                    .into_iter()
                    .map(|(admission, event)| {
                        w.record(event);
                        admission
                    })
                    .collect())
            })
            .await
    }

    /// Promotes the oldest pending `queue` input, if any.
    pub(crate) async fn promote_queue(
        &self,
        session: SessionId,
        epoch: u64,
    ) -> Result<Option<Admission>, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                let promoted = w.store().promote_queue(&session, super::now_ms())?;
                if promoted.is_some() {
                    crate::crash::point(crate::crash::DURING_PROMOTION);
                }
                Ok(promoted.map(|(admission, event)| {
                    w.record(event);
                    admission
                }))
            })
            .await
    }

    /// Appends a message of type `kind` to the transcript with its `session.message.appended`
    /// event, under a fresh id, and returns the id and the event's seq (the message's).
    pub(crate) async fn append_message(
        &self,
        session: SessionId,
        kind: String,
        data: Value,
        epoch: u64,
    ) -> Result<(MessageId, u64), StoreError> {
        let message = MessageId::generate();
        let id = message.clone();
        let seq = self
            .inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                let event =
                    w.store()
                        .append_message(&session, &id, &kind, &data, super::now_ms())?;
                let seq = event.seq;
                w.record(event);
                Ok(seq)
            })
            .await?;
        Ok((message, seq))
    }

    /// Publishes a runner-defined event (no projection) on the session's log.
    pub(crate) async fn publish(
        &self,
        session: SessionId,
        name: String,
        data: Value,
        epoch: u64,
    ) -> Result<EventRecord, StoreError> {
        self.inner
            .persistence
            .write(move |w| {
                w.store().check_fence(&session, epoch)?;
                w.publish(&session, &name, &data)
            })
            .await
    }

    /// The session's pending inputs, in admission order.
    pub(crate) async fn pending(&self, session: SessionId) -> Result<Vec<Admission>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.pending_inputs(&session))
            .await
    }

    /// Up to `limit` events of `session` with seq greater than `after` (all when `None`).
    pub(crate) async fn events_after(
        &self,
        session: SessionId,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.events_after(&session, after, limit))
            .await
    }

    /// The whole transcript of `session` in seq order (empty for an unknown session).
    pub(crate) async fn context(&self, session: SessionId) -> Result<Vec<Message>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.context(&session))
            .await
    }

    /// The transcript messages of `session` with seq greater than `after` (all when `None`),
    /// in seq order (empty for an unknown session).
    pub(crate) async fn context_after(
        &self,
        session: SessionId,
        after: Option<u64>,
    ) -> Result<Vec<Message>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.messages_after(&session, after))
            .await
    }

    /// The newest `n` transcript messages of `session`, in seq order.
    pub(crate) async fn context_tail(
        &self,
        session: SessionId,
        n: usize,
    ) -> Result<Vec<Message>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| conn.messages_tail(&session, n))
            .await
    }

    /// The whole transcript of a stored session in seq order, with decode failures named.
    pub(crate) async fn transcript(
        &self,
        session: SessionId,
    ) -> Result<Transcript<Vec<Message>>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| read_transcript(conn, &session, |conn| conn.context(&session)))
            .await
    }

    /// One page of a stored session's transcript, with decode failures named.
    pub(crate) async fn messages(
        &self,
        query: MessagesQuery,
    ) -> Result<Transcript<Vec<Message>>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| {
                read_transcript(conn, &query.session_id, |conn| conn.messages(&query))
            })
            .await
    }

    /// Message `message` if it belongs to `session`; a stored payload that cannot be decoded is
    /// [`Transcript::Undecodable`].
    pub(crate) async fn message(
        &self,
        session: SessionId,
        message: MessageId,
    ) -> Result<Transcript<Option<Message>>, StoreError> {
        self.inner
            .persistence
            .read(move |conn| match conn.get_message(&session, &message) {
                Ok(found) => Ok(Transcript::Found(found)),
                Err(StoreError::Json(_)) => Ok(Transcript::Undecodable(message)),
                Err(other) => Err(other),
            })
            .await
    }
}
