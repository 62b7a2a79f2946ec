//! [`Sessions`]: the session service applications call.
//!
//! The service is split by concept:
//! - this file: the handle, [`CreateSession`] and the session rows (`create`, `get`, `list`);
//! - `prompt`: prompt admission ([`PromptInput`], `prompt`) and inbox reprojection;
//! - `control`: execution control through the service (`interrupt`, `resume`, `switch_model`,
//!   `await_idle`, `active`);
//! - `delete`: deleting a session and the sessions below it, and where a (compacted) log
//!   starts;
//! - `transcript`: `messages`, `message` and `context`;
//! - `events`: the replay-then-live [`SessionEvents`] stream of durable events, and the engine
//!   and items ([`StreamItem`]) it shares with `stream`;
//! - `stream`: [`SessionStream`], the same with the session's live-only events interleaved;
//! - `fanout`: the per-session routing of committed and live-only events to those streams;
//! - `validate`: the input limits every method checks before touching the store.
//!
//! Every method validates its input first (an invalid input is [`Error::InvalidInput`] and
//! nothing is read or written), then checks that the session exists ([`Error::NotFound`]), then
//! does its work. Reads and writes go through the journal; a check-and-write runs inside one
//! write request, so the single writer serializes it against every other write.

mod control;
mod delete;
mod events;
mod fanout;
mod log;
mod prompt;
mod stream;
mod transcript;
mod validate;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::RuntimeConfig;
use crate::error::{Error, Result};
use crate::execution::Execution;
use crate::id::SessionId;
use crate::journal::Created;
use crate::journal::Journal;
use crate::records::{ListQuery, SessionInfo};

pub use events::{SessionEvents, StreamItem};
pub(crate) use fanout::Fanout;
pub use prompt::PromptInput;
pub use stream::SessionStream;
pub use validate::{MAX_JSON_DEPTH, MAX_MODEL_BYTES, MAX_PAGE_SIZE, MAX_TEXT_BYTES};

/// What [`Sessions::create`] takes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateSession {
    /// The id; generated when absent. Creating an existing id returns the stored session.
    pub id: Option<SessionId>,
    /// The parent session (a child session is never resumed on its own).
    pub parent_id: Option<SessionId>,
    /// The title; default `New session - <RFC 3339 time>`.
    pub title: Option<String>,
    /// The working directory the session belongs to.
    pub directory: String,
    /// The agent name.
    pub agent: Option<String>,
    /// The model, as JSON.
    pub model: Option<serde_json::Value>,
}

/// What [`Sessions::create`] did: created the session, or found it stored. Derefs to the
/// session either way.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Creation {
    /// The session was created now (its row and `session.created` committed together).
    Created(SessionInfo),
    /// A session with this id was stored already; it is returned unchanged.
    Existing(SessionInfo),
}

impl Creation {
    /// Whether the session was created by this call.
    pub fn is_created(&self) -> bool {
        matches!(self, Creation::Created(_))
    }

    /// The session.
    pub fn into_info(self) -> SessionInfo {
        match self {
            Creation::Created(info) | Creation::Existing(info) => info,
        }
    }
}

impl std::ops::Deref for Creation {
    type Target = SessionInfo;

    fn deref(&self) -> &SessionInfo {
        match self {
            Creation::Created(info) | Creation::Existing(info) => info,
        }
    }
}

/// The session service: create, list, prompt, read transcripts and event streams. Cheap to clone.
///
/// Every method must be called inside the actix `System` the runtime was started in.
#[derive(Clone)]
pub struct Sessions {
    journal: Journal,
    execution: Execution,
    config: Arc<RuntimeConfig>,
    /// Routes committed events to the event streams of their session (one per runtime: every
    /// handle of the runtime shares it).
    fanout: Arc<Fanout>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// Formats epoch milliseconds as RFC 3339 UTC (`2026-11-30T12:00:00.000Z`).
pub(crate) fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

impl Sessions {
    pub(crate) fn new(
        journal: Journal,
        execution: Execution,
        config: Arc<RuntimeConfig>,
        fanout: Arc<Fanout>,
    ) -> Self {
        Self {
            journal,
            execution,
            config,
            fanout,
        }
    }

    /// Creates a session, idempotently by id: an existing id returns the stored session
    /// unchanged (the other fields are ignored) as [`Creation::Existing`], and concurrent
    /// creates of one id yield one row, one `session.created` event and exactly one
    /// [`Creation::Created`]. The row and its `session.created` event (seq 0) commit together.
    ///
    /// # Errors
    /// [`Error::NotFound`] when `parent_id` names no session (checked only when `id` is not
    /// stored yet); [`Error::InvalidInput`] for a title over [`MAX_TEXT_BYTES`], a directory over
    /// 4096 bytes or with control characters, a bad agent name, or a model that is not a JSON
    /// object or string within [`MAX_MODEL_BYTES`]; [`Error::Store`] when the write fails.
    pub async fn create(&self, input: CreateSession) -> Result<Creation> {
        if input
            .title
            .as_ref()
            .is_some_and(|t| t.len() > MAX_TEXT_BYTES)
        {
            return Err(Error::invalid(
                "title",
                format!("longer than {MAX_TEXT_BYTES} bytes"),
            ));
        }
        validate::directory(&input.directory)?;
        if let Some(agent) = &input.agent {
            validate::name("agent", agent)?;
        }
        if let Some(model) = &input.model {
            validate::model(model)?;
        }
        let now = crate::journal::now_ms();
        let id = input.id.unwrap_or_else(SessionId::generate);
        let info = SessionInfo {
            id: id.clone(),
            parent_id: input.parent_id,
            title: input
                .title
                .unwrap_or_else(|| format!("New session - {}", rfc3339(now))),
            directory: input.directory,
            agent: input.agent,
            model: input.model,
            metadata: None,
            time_created: now,
            time_updated: now,
            time_suspended: None,
            resume_attempts: 0,
        };
        match self.journal.create_session(info).await? {
            Created::New(info) => Ok(Creation::Created(info)),
            Created::Existing(info) => Ok(Creation::Existing(info)),
            Created::NoParent(parent) => Err(Error::NotFound { session_id: parent }),
        }
    }

    /// The stored session.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is none; [`Error::Store`] when the read fails.
    pub async fn get(&self, id: &SessionId) -> Result<SessionInfo> {
        self.journal
            .session(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                session_id: id.clone(),
            })
    }

    /// Sessions matching `query`: exact `directory`, parent filter, `search`
    /// (title contains the text, `%` and `_` taken literally), sorted on `(time_created, id)` in
    /// `order` (newest first by default), keyset-paged from `anchor` (so sessions created while
    /// a client pages never shift a page, as offsets would). A `previous` anchor reads
    /// the page before the anchor; every page reads in the requested order.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a `limit` outside `1..=`[`MAX_PAGE_SIZE`], a `search` over
    /// [`MAX_TEXT_BYTES`] or with control characters, or a bad `directory`; [`Error::Store`] when
    /// the read fails.
    pub async fn list(&self, query: ListQuery) -> Result<Vec<SessionInfo>> {
        validate::limit(query.limit)?;
        if let Some(directory) = &query.directory {
            validate::directory(directory)?;
        }
        if let Some(search) = &query.search {
            validate::text("search", search)?;
        }
        Ok(self.journal.list_sessions(query).await?)
    }

    /// Fails with [`Error::NotFound`] unless `id` is stored.
    pub(crate) async fn require(&self, id: &SessionId) -> Result<()> {
        if self.journal.session_exists(id).await? {
            Ok(())
        } else {
            Err(Error::NotFound {
                session_id: id.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_040_000_123), "2026-11-30T12:00:00.123Z");
    }
}
