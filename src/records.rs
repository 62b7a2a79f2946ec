//! Public data types of the session service: sessions, list and transcript queries, admissions
//! and transcript messages.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::id::{MessageId, SessionId};

/// A stored session (one row of the `session` table). Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session's id.
    pub id: SessionId,
    /// The parent session; `None` for a top-level session.
    pub parent_id: Option<SessionId>,
    /// The human-readable title.
    pub title: String,
    /// The working directory the session belongs to.
    pub directory: String,
    /// The agent the session runs, if any.
    pub agent: Option<String>,
    /// The model selection as opaque JSON, if any.
    pub model: Option<serde_json::Value>,
    /// Free-form metadata as opaque JSON, if any.
    pub metadata: Option<serde_json::Value>,
    /// When the session was created.
    pub time_created: i64,
    /// When the session itself last changed (claim bookkeeping never changes it).
    pub time_updated: i64,
    /// The claim: `Some(time)` while a turn is or was in flight, `None` when released.
    pub time_suspended: Option<i64>,
    /// How many times the claimed turn has been resumed after a restart.
    pub resume_attempts: u32,
}

/// The sort order of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Oldest first.
    Asc,
    /// Newest first (the default).
    #[default]
    Desc,
}

impl Order {
    /// The opposite order.
    pub fn flip(self) -> Self {
        match self {
            Order::Asc => Order::Desc,
            Order::Desc => Order::Asc,
        }
    }
}

/// Which side of a keyset anchor or cursor a page is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The page before the anchor (in the requested order).
    Previous,
    /// The page after the anchor (the default).
    #[default]
    Next,
}

/// A keyset anchor on `(time_created, id)` for paging through sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    /// The id of the anchor session.
    pub id: SessionId,
    /// The anchor session's `time_created`.
    pub time: i64,
    /// Whether to read the page before or after the anchor.
    #[serde(default)]
    pub direction: Direction,
}

/// Which sessions a listing includes by parent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParentFilter {
    /// Every session (the default).
    #[default]
    Any,
    /// Only sessions without a parent.
    TopLevel,
    /// Only the direct children of this session.
    ChildrenOf(SessionId),
}

/// A session listing request.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ListQuery {
    /// Only sessions of exactly this directory.
    pub directory: Option<String>,
    /// Filter by parent.
    pub parent: ParentFilter,
    /// Only sessions whose title contains this text.
    pub search: Option<String>,
    /// At most this many sessions; `None` for all.
    pub limit: Option<usize>,
    /// Sort order on `(time_created, id)`; newest first by default.
    pub order: Order,
    /// Keyset anchor: start after (or before) this session.
    pub anchor: Option<Anchor>,
}

/// How an admitted prompt enters a running turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// Promoted at the next step of the running turn, together with every earlier steer prompt
    /// (the default).
    #[default]
    Steer,
    /// Promoted one at a time, each starting its own turn.
    Queue,
}

impl Delivery {
    /// The wire name: `steer` or `queue`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Steer => "steer",
            Delivery::Queue => "queue",
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Delivery {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "steer" => Ok(Delivery::Steer),
            "queue" => Ok(Delivery::Queue),
            other => Err(Error::invalid(
                "delivery",
                format!("expected `steer` or `queue`, got {other:?}"),
            )),
        }
    }
}

/// A prompt admitted to a session's inbox (one row of `session_input`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// The prompt's message id (the idempotency key).
    pub id: MessageId,
    /// The session the prompt was admitted to.
    pub session_id: SessionId,
    /// The seq of the `session.prompt.admitted` event.
    pub admitted_seq: u64,
    /// The prompt as opaque JSON.
    pub prompt: serde_json::Value,
    /// How the prompt enters a turn.
    pub delivery: Delivery,
    /// When the prompt was admitted.
    pub time_created: i64,
    /// The seq of the `session.prompt.promoted` event; `None` while the prompt is pending.
    pub promoted_seq: Option<u64>,
}

/// One message of a session's transcript (one row of `session_message`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The message id (globally unique).
    pub id: MessageId,
    /// The session the message belongs to.
    pub session_id: SessionId,
    /// The message type, such as `user`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The seq of the event that created the message.
    pub seq: u64,
    /// The message payload as opaque JSON.
    pub data: serde_json::Value,
    /// When the message was created.
    pub time_created: i64,
    /// For a `user` message (a promoted prompt): a user interrupted the turn that promoted it,
    /// so a runner must not answer it again. Serialized only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// A keyset cursor on a transcript message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The message the page starts after (or before).
    pub id: MessageId,
    /// Whether to read the page before or after the cursor.
    #[serde(default)]
    pub direction: Direction,
}

/// A transcript page request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesQuery {
    /// The session whose transcript is read.
    pub session_id: SessionId,
    /// At most this many messages; `None` for all.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Sort order on `seq`; newest first by default.
    #[serde(default)]
    pub order: Order,
    /// Keyset cursor: start after (or before) this message.
    #[serde(default)]
    pub cursor: Option<Cursor>,
}

impl MessagesQuery {
    /// The whole transcript of `session_id`, newest first.
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            limit: None,
            order: Order::Desc,
            cursor: None,
        }
    }
}

/// The claim bookkeeping of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimState {
    /// The claim time; `None` when no turn is claimed.
    pub time_suspended: Option<i64>,
    /// Resume attempts made for the claimed turn.
    pub resume_attempts: u32,
    /// The process boot that made the claim.
    pub claim_boot: Option<String>,
}

/// What a turn resumed after a restart is resuming (see `TurnCause::Recovery`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Resumption {
    /// Which restart-resume of this turn this is, from 1.
    pub attempt: u32,
    /// The budget: attempts past it are recorded as `aborted` instead of resumed.
    pub max_attempts: u32,
    /// The seq of the restart notice (`session.synthetic`) published for this attempt.
    pub notice_seq: u64,
    /// The inputs the killed attempt had promoted and not finished, in promotion order: never
    /// an input an earlier turn served to its terminal, never one a user interrupted. Empty
    /// when the killed process had not started the turn (an acknowledged prompt whose wake was
    /// lost): the prompt is then still pending, to be promoted as usual.
    pub inputs: Vec<Admission>,
    /// The turn's id ([`crate::Turn::id`]): the seq that first claimed it.
    pub turn: u64,
    /// The turn's *ambiguous* steps: their intent is recorded and their outcome is not (the
    /// process died, or the store failed, inside their body). Running one again is allowed
    /// ([`crate::Turn::step`], told by `StepContext::previous_attempts`) or refused
    /// ([`crate::Turn::step_once`]).
    pub steps: Vec<crate::step::StepRecord>,
}

/// What `Sessions::reproject` rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reprojection {
    /// Events replayed (admissions, promotions and appended messages).
    pub events: usize,
    /// Inbox rows after the rebuild.
    pub inputs: usize,
    /// Transcript rows after the rebuild.
    pub messages: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn delivery_parses_wire_names_and_rejects_others() {
        assert_eq!("steer".parse::<Delivery>().ok(), Some(Delivery::Steer));
        assert_eq!("queue".parse::<Delivery>().ok(), Some(Delivery::Queue));
        assert!(matches!(
            "later".parse::<Delivery>(),
            Err(Error::InvalidInput {
                field: "delivery",
                ..
            })
        ));
        assert_eq!(Delivery::Queue.as_str(), "queue");
        assert_eq!(Delivery::default(), Delivery::Steer);
    }

    #[test]
    fn defaults_are_desc_next_any() {
        let q = ListQuery::default();
        assert_eq!(q.order, Order::Desc);
        assert_eq!(q.parent, ParentFilter::Any);
        assert_eq!(Direction::default(), Direction::Next);
        assert_eq!(Order::Asc.flip(), Order::Desc);
    }

    #[test]
    fn enums_serialize_lowercase() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_value(Order::Asc)?, json!("asc"));
        assert_eq!(
            serde_json::to_value(Direction::Previous)?,
            json!("previous")
        );
        assert_eq!(serde_json::to_value(Delivery::Queue)?, json!("queue"));
        let q: ListQuery = serde_json::from_value(json!({"order": "asc"}))?;
        assert_eq!(q.order, Order::Asc);
        assert_eq!(q.parent, ParentFilter::Any);
        Ok(())
    }

    #[test]
    fn message_serializes_kind_as_type() -> Result<(), Box<dyn std::error::Error>> {
        let m = Message {
            id: MessageId::new("m1")?,
            session_id: SessionId::new("s1")?,
            kind: "user".into(),
            seq: 3,
            data: json!({"text": "hi"}),
            time_created: 1,
            interrupted: false,
        };
        let v = serde_json::to_value(&m)?;
        assert_eq!(v["type"], json!("user"));
        assert_eq!(serde_json::from_value::<Message>(v)?, m);
        Ok(())
    }

    #[test]
    fn messages_query_new_has_defaults() -> Result<(), Error> {
        let q = MessagesQuery::new(SessionId::new("s")?);
        assert_eq!((q.limit, q.order, q.cursor), (None, Order::Desc, None));
        Ok(())
    }
}
