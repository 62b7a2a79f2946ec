//! Reading transcripts: `messages` (keyset pages on `seq`), `message` and `context`.
//!
//! A stored message whose payload is not valid JSON is reported as
//! [`Error::MessageDecode`] naming the message, not as a bare store error.

use super::{validate, Sessions};
use crate::error::{Error, Result};
use crate::id::{MessageId, SessionId};
use crate::journal::Transcript;
use crate::records::{Message, MessagesQuery};

impl Sessions {
    /// Maps a transcript read's outcome to the service's answer.
    fn answer<T>(&self, session: &SessionId, read: Transcript<T>) -> Result<T> {
        match read {
            Transcript::Missing => Err(Error::NotFound {
                session_id: session.clone(),
            }),
            Transcript::Undecodable(message_id) => Err(Error::MessageDecode {
                session_id: session.clone(),
                message_id,
            }),
            Transcript::Found(found) => Ok(found),
        }
    }

    /// One page of the session's transcript, keyset-paged on `seq` (so appends while a client
    /// pages never shift a page, as offsets would): `order`
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
        let read = self.journal.messages(query).await?;
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
        let read = self
            .journal
            .message(session_id.clone(), message_id.clone())
            .await?;
        match read {
            Transcript::Undecodable(message_id) => Err(Error::MessageDecode {
                session_id: session_id.clone(),
                message_id,
            }),
            Transcript::Found(found) => Ok(found),
            Transcript::Missing => Ok(None),
        }
    }

    /// The session's whole transcript in seq order: what a runner feeds the model.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the session is not stored; [`Error::MessageDecode`] when a
    /// stored message cannot be decoded (naming the first such message); [`Error::Store`] when
    /// the read fails.
    pub async fn context(&self, session_id: &SessionId) -> Result<Vec<Message>> {
        let read = self.journal.transcript(session_id.clone()).await?;
        self.answer(session_id, read)
    }
}
