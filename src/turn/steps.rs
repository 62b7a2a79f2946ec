//! Durable steps of a turn: [`Turn::step`] runs a body at most once per turn to a recorded
//! outcome, and [`Turn::step_once`] refuses to run again one whose outcome was lost.
//!
//! Before the body runs, the step's intent commits (`session.step.started`); after it
//! returns, its outcome (`session.step.completed` with the value, or `session.step.failed`).
//! A later drain of the same turn finds the outcome in the turn's ledger and returns it
//! without running the body. A step whose intent is recorded and whose outcome is not is
//! *ambiguous*: the process died (or the store failed) inside its body.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::Turn;
use crate::error::{Error, Result};
use crate::event::SessionEvent;
use crate::journal::ledger::Lookup;
use crate::outcome::SessionError;
use crate::step::{step_key, StepContext, StepStatus};

/// The largest value a step may record, as JSON (1 MiB): a bigger one is the failure
/// [`Error::StepResultTooLarge`], recorded with the type `result_too_large` (a later drain gets
/// it back as [`Error::StepFailed`]).
pub const MAX_STEP_RESULT_BYTES: usize = 1 << 20;

/// The `type` of the error a failed step records.
const STEP_ERROR: &str = "step";
/// The `type` of the failure recorded for a value over [`MAX_STEP_RESULT_BYTES`].
const TOO_LARGE: &str = "result_too_large";

impl Turn {
    /// Runs `body` at most once per turn to a recorded outcome, and returns its value.
    ///
    /// Its intent commits before `body` runs, its outcome after. In any later drain of the same
    /// turn (a resume after a crash or a shutdown, a retry, a second drain), a step whose
    /// outcome is recorded returns it without running `body`: the value, or the error as
    /// [`Error::StepFailed`] (a retry of the turn runs a failed step again). A step whose
    /// outcome was lost (it is listed in [`crate::Resumption::steps`]) runs again, and
    /// `body` is told by [`StepContext::previous_attempts`]; hand [`StepContext::key`] to an API
    /// that deduplicates, or use [`Turn::step_once`].
    ///
    /// `name` is unique within the turn: call each step of a loop by its own name (for
    /// example `tool:{call_id}`).
    ///
    /// # Errors
    /// [`Error::DuplicateStep`] when this drain already called `name`;
    /// [`Error::InvalidInput`] for an empty, over-long or control-character name;
    /// [`Error::StepFailed`] when `body` failed (now or before); [`Error::StepResultTooLarge`]
    /// when its value is over [`MAX_STEP_RESULT_BYTES`] as JSON; [`Error::StepDecode`] when a
    /// recorded value does not decode as `T`; [`Error::Store`] or [`Error::Fenced`] when a
    /// record could not be written (the step stays ambiguous if its body ran).
    pub async fn step<T, E, F, Fut>(&self, name: &str, body: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(StepContext) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        self.run_step(name, false, body).await
    }

    /// [`Turn::step`], except that an ambiguous step (its intent recorded, its outcome lost) is
    /// not run again: the call returns [`Error::Ambiguous`], so the agent can reconcile (look
    /// the payment up by its key) instead of repeating the effect.
    ///
    /// # Errors
    /// [`Error::Ambiguous`], and those of [`Turn::step`].
    pub async fn step_once<T, E, F, Fut>(&self, name: &str, body: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(StepContext) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        self.run_step(name, true, body).await
    }

    async fn run_step<T, E, F, Fut>(&self, name: &str, once: bool, body: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce(StepContext) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        check_step_name(name)?;
        let fresh = self
            .shared
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned());
        if !fresh {
            return Err(Error::DuplicateStep {
                session_id: self.session_id.clone(),
                step: name.to_owned(),
            });
        }
        let (turn, attempt, lookup) = {
            let ledger = self.ledger();
            (ledger.turn, ledger.attempt, ledger.lookup(name))
        };
        let key = step_key(self.session_id.as_str(), turn, name);
        let previous = match lookup {
            Lookup::Done(status) => return self.replay(name, status),
            Lookup::Ambiguous { previous } if once => {
                return Err(Error::Ambiguous {
                    session_id: self.session_id.clone(),
                    step: name.to_owned(),
                    key,
                    attempts: previous,
                })
            }
            Lookup::Ambiguous { previous } | Lookup::Run { previous } => previous,
        };
        let started = SessionEvent::StepStarted {
            turn,
            step: name.to_owned(),
            attempt,
            key: key.clone(),
        };
        self.record(started).await?;
        crate::crash::point(crate::crash::AFTER_STEP_INTENT);
        let context = StepContext {
            name: name.to_owned(),
            key,
            turn,
            turn_attempt: attempt,
            previous_attempts: previous,
        };
        let outcome = body(context).await;
        crate::crash::point(crate::crash::AFTER_STEP_BODY);
        let (event, answer) = match outcome {
            Ok(value) => match self.encode(name, &value) {
                Ok(result) => (
                    SessionEvent::StepCompleted {
                        turn,
                        step: name.to_owned(),
                        attempt,
                        result,
                    },
                    Ok(value),
                ),
                Err(error) => (self.failure(turn, name, attempt, &error), Err(error)),
            },
            Err(e) => {
                let error = Error::StepFailed {
                    session_id: self.session_id.clone(),
                    step: name.to_owned(),
                    error: SessionError::new(STEP_ERROR, e.to_string()),
                };
                (self.failure(turn, name, attempt, &error), Err(error))
            }
        };
        self.record(event).await?;
        answer
    }

    /// Commits a step record and takes it into the ledger.
    async fn record(&self, event: SessionEvent) -> Result<()> {
        let seq = self
            .journal
            .record_step(self.session_id.clone(), event.clone(), self.epoch)
            .await
            .map_err(|e| self.failed(e))?;
        self.committed(seq);
        self.ledger().apply(&event);
        Ok(())
    }

    /// The recorded outcome of step `name`, handed back.
    fn replay<T: DeserializeOwned>(&self, name: &str, status: StepStatus) -> Result<T> {
        match status {
            StepStatus::Completed { result } => {
                serde_json::from_value(result).map_err(|e| Error::StepDecode {
                    session_id: self.session_id.clone(),
                    step: name.to_owned(),
                    reason: e.to_string(),
                })
            }
            StepStatus::Failed { error } => Err(Error::StepFailed {
                session_id: self.session_id.clone(),
                step: name.to_owned(),
                error,
            }),
            StepStatus::Started => Err(Error::Ambiguous {
                session_id: self.session_id.clone(),
                step: name.to_owned(),
                key: step_key(self.session_id.as_str(), self.id(), name),
                attempts: 0,
            }),
        }
    }

    /// A step's value as JSON, within the size limit.
    fn encode<T: Serialize>(&self, name: &str, value: &T) -> Result<Value> {
        let too_large = |bytes| Error::StepResultTooLarge {
            session_id: self.session_id.clone(),
            step: name.to_owned(),
            bytes,
            limit: MAX_STEP_RESULT_BYTES,
        };
        let text = serde_json::to_string(value).map_err(|e| Error::StepDecode {
            session_id: self.session_id.clone(),
            step: name.to_owned(),
            reason: e.to_string(),
        })?;
        if text.len() > MAX_STEP_RESULT_BYTES {
            return Err(too_large(text.len()));
        }
        serde_json::from_str(&text).map_err(|e| Error::StepDecode {
            session_id: self.session_id.clone(),
            step: name.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The failure record of a step that ended with `error`.
    fn failure(&self, turn: u64, name: &str, attempt: u32, error: &Error) -> SessionEvent {
        let error = match error {
            Error::StepFailed { error, .. } => error.clone(),
            too_large @ Error::StepResultTooLarge { .. } => {
                SessionError::new(TOO_LARGE, too_large.to_string())
            }
            other => SessionError::new(STEP_ERROR, other.to_string()),
        };
        SessionEvent::StepFailed {
            turn,
            step: name.to_owned(),
            attempt,
            error,
        }
    }
}

/// Checks a step name: 1 to 256 bytes without control characters.
fn check_step_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "step",
            "must be 1 to 256 bytes without control characters",
        ));
    }
    Ok(())
}
