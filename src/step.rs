//! Durable steps: what a turn's step ledger records of each step ([`StepRecord`]), and what a
//! step's body is told ([`StepContext`]). The steps themselves run through
//! [`crate::Turn::step`] and [`crate::Turn::step_once`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::outcome::SessionError;

/// Where a step stands in its turn's ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StepStatus {
    /// Its intent is recorded and its outcome is not: the body is running now, or the
    /// process (or the store) lost it mid-body. Seen from a later drain, such a step is
    /// *ambiguous*: its side effect may or may not have happened.
    Started,
    /// The body returned this value; later drains of the turn get it back without running.
    Completed {
        /// The body's value, as JSON.
        result: Value,
    },
    /// The body returned this error; later drains of the turn get it back without running,
    /// until the turn is retried ([`crate::Sessions::retry`]), which runs it again.
    Failed {
        /// What went wrong.
        error: SessionError,
    },
}

/// One step of a turn, as its ledger holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// The step's name, unique within the turn.
    pub name: String,
    /// Its idempotency key: the same in every attempt of the turn.
    pub key: String,
    /// How many times its body was started, over all attempts of the turn.
    pub attempts: u32,
    /// The attempt of the turn that last started it.
    pub turn_attempt: u32,
    /// Where it stands.
    #[serde(flatten)]
    pub status: StepStatus,
}

impl StepRecord {
    /// Whether its intent is recorded and its outcome is not.
    pub fn is_open(&self) -> bool {
        matches!(self.status, StepStatus::Started)
    }
}

/// The steps of a session's last turn ([`crate::Sessions::steps`], `GET
/// /sessions/{id}/steps`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TurnSteps {
    /// The turn's id ([`crate::Turn::id`]).
    pub turn: u64,
    /// Its attempts so far ([`crate::Turn::attempt`] of the latest).
    pub attempt: u32,
    /// Whether it holds the session's claim (running, or left for the restart sweep): a
    /// started step of its latest attempt may still be running; any other is ambiguous.
    pub open: bool,
    /// How it ended; `None` while it is open.
    pub terminal: Option<crate::outcome::Terminal>,
    /// Its steps, in the order they first started.
    pub steps: Vec<StepRecord>,
}

/// The idempotency key of step `step` of turn `turn` of `session`: `session:turn:step`, the
/// same in every attempt of the turn, for an external API that deduplicates on a key.
pub(crate) fn step_key(session: &str, turn: u64, step: &str) -> String {
    format!("{session}:{turn}:{step}")
}

/// What a step's body is told about the step it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepContext {
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) turn: u64,
    pub(crate) turn_attempt: u32,
    pub(crate) previous_attempts: u32,
}

impl StepContext {
    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The idempotency key to hand to an external API (`session:turn:step`): the same in every
    /// attempt of the turn, so a provider that deduplicates on it applies the effect once.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The id of the turn the step belongs to ([`crate::Turn::id`]).
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The attempt of the turn running it ([`crate::Turn::attempt`]).
    pub fn turn_attempt(&self) -> u32 {
        self.turn_attempt
    }

    /// How many times this step's body was started before, in earlier drains of the turn,
    /// without a recorded outcome (or with a failure a retry cleared): 0 on a first run. When
    /// it is not 0 the effect may already have happened; reconcile, or pass [`Self::key`].
    pub fn previous_attempts(&self) -> u32 {
        self.previous_attempts
    }
}
