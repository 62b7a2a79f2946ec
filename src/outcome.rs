//! How a drain ends ([`RunError`], [`Exit`]) and how that ending is classified ([`terminal`],
//! [`Terminal`]): the vocabulary the coordinator, the journal and runners share.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a turn was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterruptReason {
    /// A user asked to stop; the claim is released and the turn never resurrects.
    User,
    /// The process is shutting down; the claim is kept so the next boot resumes the turn.
    Shutdown,
    /// Another owner took over; released like `User`.
    Superseded,
    /// The turn ran past its deadline (`RuntimeBuilder::turn_timeout`, `Turn::set_deadline`);
    /// released like `User`, so the session is free for its next prompt, and never retried by
    /// the restart sweep.
    Timeout,
}

impl InterruptReason {
    /// The wire name (`user`, `shutdown`, `superseded`, `timeout`).
    pub fn as_str(self) -> &'static str {
        match self {
            InterruptReason::User => "user",
            InterruptReason::Shutdown => "shutdown",
            InterruptReason::Superseded => "superseded",
            InterruptReason::Timeout => "timeout",
        }
    }
}

/// A typed error as recorded in a `session.execution.failed` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionError {
    /// The error type, such as `provider.transport`, `panic` or `unknown`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A human-readable message.
    pub message: String,
}

impl SessionError {
    /// Builds an error of the given type.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// The reason tag of a model provider's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderErrorKind {
    /// The provider rate-limited the request.
    RateLimit,
    /// The credentials were rejected.
    Authentication,
    /// The account's quota is exhausted.
    QuotaExceeded,
    /// The content policy refused the request.
    ContentPolicy,
    /// The connection failed.
    Transport,
    /// The provider failed internally.
    ProviderInternal,
    /// The provider's output could not be used.
    InvalidProviderOutput,
    /// The request was malformed.
    InvalidRequest,
    /// No provider serves the requested model.
    NoRoute,
    /// The provider is not known.
    UnknownProvider,
}

impl ProviderErrorKind {
    /// Every kind, for exhaustive tests.
    pub const ALL: [ProviderErrorKind; 10] = [
        ProviderErrorKind::RateLimit,
        ProviderErrorKind::Authentication,
        ProviderErrorKind::QuotaExceeded,
        ProviderErrorKind::ContentPolicy,
        ProviderErrorKind::Transport,
        ProviderErrorKind::ProviderInternal,
        ProviderErrorKind::InvalidProviderOutput,
        ProviderErrorKind::InvalidRequest,
        ProviderErrorKind::NoRoute,
        ProviderErrorKind::UnknownProvider,
    ];

    /// The recorded error type (`provider.rate-limit`, `provider.transport`, ...).
    pub fn error_type(self) -> &'static str {
        match self {
            ProviderErrorKind::RateLimit => "provider.rate-limit",
            ProviderErrorKind::Authentication => "provider.auth",
            ProviderErrorKind::QuotaExceeded => "provider.quota",
            ProviderErrorKind::ContentPolicy => "provider.content-filter",
            ProviderErrorKind::Transport => "provider.transport",
            ProviderErrorKind::ProviderInternal => "provider.internal",
            ProviderErrorKind::InvalidProviderOutput => "provider.invalid-output",
            ProviderErrorKind::InvalidRequest => "provider.invalid-request",
            ProviderErrorKind::NoRoute => "provider.no-route",
            ProviderErrorKind::UnknownProvider => "provider.unknown",
        }
    }
}

/// How a runner's drain failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The user interrupted the session from inside the runner ("Session interrupted by user").
    #[error("Session interrupted by user")]
    UserInterrupted,
    /// A model provider failed.
    #[error("{message}")]
    Provider {
        /// The provider's reason tag.
        kind: ProviderErrorKind,
        /// The provider's message.
        message: String,
    },
    /// A failure the runner has already typed (recorded as is).
    #[error("{0}")]
    Typed(SessionError),
    /// The drain panicked; the panic was caught and the turn recorded as failed.
    #[error("drain panicked: {0}")]
    Panic(String),
    /// Any other failure (recorded with type `unknown`).
    #[error("{0}")]
    Other(String),
}

impl RunError {
    /// Shorthand for a provider error.
    pub fn provider(kind: ProviderErrorKind, message: impl Into<String>) -> Self {
        RunError::Provider {
            kind,
            message: message.into(),
        }
    }

    /// The [`SessionError`] recorded for this failure.
    pub fn to_session_error(&self) -> SessionError {
        match self {
            RunError::UserInterrupted => SessionError::new("aborted", self.to_string()),
            RunError::Provider { kind, message } => SessionError::new(kind.error_type(), message),
            RunError::Typed(error) => error.clone(),
            RunError::Panic(message) => SessionError::new("panic", message),
            RunError::Other(message) => SessionError::new("unknown", message),
        }
    }
}

impl From<crate::Error> for RunError {
    fn from(e: crate::Error) -> Self {
        RunError::Other(e.to_string())
    }
}

/// How a drain (or the whole turn) exited, before classification.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The drain returned `Ok(())`.
    Success,
    /// The drain returned an error (or panicked).
    Failure(RunError),
    /// The drain was cancelled (its future dropped).
    Interrupted,
}

/// How a turn ended, as recorded in its terminal event and returned to `resume` callers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Terminal {
    /// The turn completed.
    Succeeded,
    /// The turn failed with a typed error.
    Failed {
        /// What went wrong.
        error: SessionError,
    },
    /// The turn was interrupted.
    Interrupted {
        /// Why.
        reason: InterruptReason,
    },
}

impl Terminal {
    /// Whether the turn succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, Terminal::Succeeded)
    }
}

/// Classifies how a turn ended: the one place that decides which terminal event a drain's
/// ending records.
///
/// A cancelled drain is `Interrupted` with `reason`, defaulting to `shutdown`;
/// [`RunError::UserInterrupted`] is `Interrupted{user}`; any other error is `Failed`.
pub(crate) fn terminal(exit: &Exit, reason: Option<InterruptReason>) -> Terminal {
    match exit {
        Exit::Success => Terminal::Succeeded,
        Exit::Interrupted => Terminal::Interrupted {
            reason: reason.unwrap_or(InterruptReason::Shutdown),
        },
        Exit::Failure(RunError::UserInterrupted) => Terminal::Interrupted {
            reason: InterruptReason::User,
        },
        Exit::Failure(error) => Terminal::Failed {
            error: error.to_session_error(),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Success is `succeeded`; a transport failure "Disconnected" is exactly
    /// `failed{provider.transport, "Disconnected"}`.
    #[test]
    fn classifies_success_and_typed_failure_terminals() {
        assert_eq!(terminal(&Exit::Success, None), Terminal::Succeeded);
        let failed = terminal(
            &Exit::Failure(RunError::provider(
                ProviderErrorKind::Transport,
                "Disconnected",
            )),
            None,
        );
        assert_eq!(
            failed,
            Terminal::Failed {
                error: SessionError::new("provider.transport", "Disconnected")
            }
        );
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"type": "failed", "error": {"type": "provider.transport", "message": "Disconnected"}})
        );
    }

    /// A bare interruption is `shutdown`; explicit `user`/`superseded`/`timeout` are preserved; a
    /// `UserInterrupted` failure is `interrupted{user}`.
    #[test]
    fn defaults_owner_scope_interruption_to_shutdown_and_preserves_explicit_reasons() {
        let interrupted = |reason| Terminal::Interrupted { reason };
        assert_eq!(
            terminal(&Exit::Interrupted, None),
            interrupted(InterruptReason::Shutdown)
        );
        assert_eq!(
            terminal(&Exit::Interrupted, Some(InterruptReason::User)),
            interrupted(InterruptReason::User)
        );
        assert_eq!(
            terminal(&Exit::Interrupted, Some(InterruptReason::Superseded)),
            interrupted(InterruptReason::Superseded)
        );
        let timeout = terminal(&Exit::Interrupted, Some(InterruptReason::Timeout));
        assert_eq!(timeout, interrupted(InterruptReason::Timeout));
        assert_eq!(
            serde_json::to_value(&timeout).unwrap(),
            json!({"type": "interrupted", "reason": "timeout"})
        );
        assert_eq!(InterruptReason::Timeout.as_str(), "timeout");
        assert_eq!(
            terminal(&Exit::Failure(RunError::UserInterrupted), None),
            interrupted(InterruptReason::User)
        );
    }

    /// Every provider reason tag maps to its recorded type, the `type` a client reads in
    /// `session.execution.failed`.
    #[test]
    fn maps_every_provider_reason_to_its_error_type() {
        let expected = [
            "provider.rate-limit",
            "provider.auth",
            "provider.quota",
            "provider.content-filter",
            "provider.transport",
            "provider.internal",
            "provider.invalid-output",
            "provider.invalid-request",
            "provider.no-route",
            "provider.unknown",
        ];
        for (kind, ty) in ProviderErrorKind::ALL.into_iter().zip(expected) {
            let t = terminal(&Exit::Failure(RunError::provider(kind, "m")), None);
            assert_eq!(
                t,
                Terminal::Failed {
                    error: SessionError::new(ty, "m")
                }
            );
        }
        let other = terminal(&Exit::Failure(RunError::Other("boom".into())), None);
        assert_eq!(
            other,
            Terminal::Failed {
                error: SessionError::new("unknown", "boom")
            }
        );
    }
}
