//! Reading transcripts: `messages` (keyset pages on `seq`), `message` and `context`.
//!
//! A stored message whose payload is not valid JSON is reported as
//! [`Error::MessageDecode`] naming the message, not as a bare store error.

use rusqlite::Connection;

use super::{validate, Sessions};
use crate::error::{Error, Result, StoreError};
use crate::id::{MessageId, SessionId};
use crate::model::{Message, MessagesQuery};
use crate::store;

/// The outcome of a transcript read on the store's connection.
enum Read<T> {
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
    conn: &Connection,
    session: &SessionId,
    read: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<Read<T>, StoreError> {
    if !store::session_exists(conn, session)? {
        return Ok(Read::Missing);
    }
    match read(conn) {
        Ok(found) => Ok(Read::Found(found)),
        Err(StoreError::Json(e)) => store::undecodable_message(conn, session)?
            .map(Read::Undecodable)
            .ok_or(StoreError::Json(e)),
        Err(other) => Err(other),
    }
}

impl Sessions {
    /// Maps a transcript read's outcome to the service's answer.
    fn answer<T>(&self, session: &SessionId, read: Read<T>) -> Result<T> {
        match read {
            Read::Missing => Err(Error::NotFound {
                session_id: session.clone(),
            }),
            Read::Undecodable(message_id) => Err(Error::MessageDecode {
                session_id: session.clone(),
                message_id,
            }),
            Read::Found(found) => Ok(found),
        }
    }

    /// One page of the session's transcript, keyset-paged on `seq` (reference §5): `order`
    /// (newest first by default), `limit`, and a `cursor` naming a message of this session to
    /// page after (`next`) or before (`previous`) it; every page reads in the requested order.
    /// A cursor that names no message of this session yields an empty page.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a `limit` outside `1..=`[`super::MAX_PAGE_SIZE`];
    /// [`Error::NotFound`] when the session is not stored; [`Error::MessageDecode`] when a
    /// stored message cannot be decoded (naming the session's first such message);
    /// [`Error::Store`] when the read fails.
    pub async fn messages(&self, query: MessagesQuery) -> Result<Vec<Message>> {
        validate::limit(query.limit)?;
        let session = query.session_id.clone();
        let read = self
            .core
            .persistence
            .read(move |conn| {
                read_transcript(conn, &query.session_id, |conn| {
                    store::messages(conn, &query)
                })
            })
            .await?;
        self.answer(&session, read)
    }

    /// Message `message_id` if it belongs to the session; `None` when it is unknown, belongs to
    /// another session, or the session is not stored (never [`Error::NotFound`]).
    ///
    /// # Errors
    /// [`Error::MessageDecode`] when the message's stored payload cannot be decoded;
    /// [`Error::Store`] when the read fails.
    pub async fn message(
        &self,
        session_id: &SessionId,
        message_id: &MessageId,
    ) -> Result<Option<Message>> {
        let (session, message) = (session_id.clone(), message_id.clone());
        let found = self
            .core
            .persistence
            .read(
                move |conn| match store::get_message(conn, &session, &message) {
                    Ok(found) => Ok(Ok(found)),
                    Err(StoreError::Json(_)) => Ok(Err(message)),
                    Err(other) => Err(other),
                },
            )
            .await?;
        found.map_err(|message_id| Error::MessageDecode {
            session_id: session_id.clone(),
            message_id,
        })
    }

    /// The session's whole transcript in seq order: what a runner feeds the model.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::MessageDecode`] when a
    /// stored message cannot be decoded (naming the first such message); [`Error::Store`] when
    /// the read fails.
    pub async fn context(&self, session_id: &SessionId) -> Result<Vec<Message>> {
        let session = session_id.clone();
        let read = self
            .core
            .persistence
            .read(move |conn| {
                read_transcript(conn, &session, |conn| store::context(conn, &session))
            })
            .await?;
        self.answer(session_id, read)
    }
}
