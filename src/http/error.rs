//! [`ApiError`]: every failure of the HTTP adapter as a JSON body
//! `{"error": {"type": "...", "message": "..."}}` with its status code.

use std::fmt;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::error::{Error, StoreError, Unavailable};
#[cfg(doc)]
use crate::http::HttpOptions;

/// The `Retry-After` of a `503 store_unavailable`, in seconds: long enough that a client does
/// not hammer a store that is down, short enough that a lock or a full disk that clears is
/// used again at once.
pub const STORE_RETRY_AFTER_SECS: u64 = 2;

/// An error answered by the HTTP adapter: a status code, a stable machine-readable `type` and a
/// human-readable `message`, rendered as `{"error": {"type", "message"}}`.
///
/// | status | `type` | when |
/// |---|---|---|
/// | 400 | `invalid_input` | an invalid id, prompt, title, limit, query value or `Last-Event-ID` |
/// | 400 | `malformed_json` | a body that is not JSON of the expected shape |
/// | 401 | `unauthorized` | a bearer token is configured and the request lacks it (or an event stream's ticket) |
/// | 400 | `invalid_input` | also a malformed CORS preflight |
/// | 403 | `origin_not_allowed` | an `Origin` that is neither the server's own nor an allowed one |
/// | 403 | `cors_not_allowed` | a CORS preflight asking for a method or header cross-origin callers may not use |
/// | 421 | `host_not_allowed` | a `Host` the server does not answer to (see [`HttpOptions::allowed_host`]) |
/// | 404 | `not_found` | an unknown session, message or route |
/// | 405 | `method_not_allowed` | a known route with another method |
/// | 408 | `request_timeout` | a body that did not arrive within the body timeout |
/// | 409 | `conflict` | a prompt id reused with other content, delivery or session |
/// | 409 | `session_busy` | a delete without `force` while the session (or a child) has a turn in flight |
/// | 410 | `events_compacted` | a replay from before the start of a compacted log (the body's `first_seq` is where it starts) |
/// | 413 | `payload_too_large` | a body over the configured limit |
/// | 415 | `unsupported_media_type` | a body not sent as `Content-Type: application/json` |
/// | 500 | `store` / `message_decode` / `internal` | a store fault, an undecodable stored message |
/// | 503 | `shutting_down` | the runtime is shutting down (or has stopped) |
/// | 503 | `store_unavailable` | the store cannot be written or reached now ([`StoreError::unavailable`]: a full disk, a read-only file, an I/O error, a lock held by another process, a lost server); the message says which, and `Retry-After` is [`STORE_RETRY_AFTER_SECS`] |
/// | 503 | `unavailable` | a session's actor could not be reached (retry) |
/// | 505 | `http_version_not_supported` | an event stream asked for over HTTP/1.0 |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// For `events_compacted`: the first seq the log still holds.
    first_seq: Option<u64>,
    /// For `store_unavailable`: the `Retry-After` header, in seconds.
    retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_seq: Option<u64>,
}

impl ApiError {
    /// An error with this status, `type` and message.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            first_seq: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_input`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    /// 400 `malformed_json`.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_json", message)
    }

    /// 401 `unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 413 `payload_too_large`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable `type`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// For a 410 `events_compacted`: the first seq the session's log still holds (the body
    /// carries it as `error.first_seq`).
    pub fn first_seq(&self) -> Option<u64> {
        self.first_seq
    }

    /// For a 503 `store_unavailable`: the seconds a client should wait before retrying (the
    /// response's `Retry-After` header).
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// 503 `store_unavailable`: the store cannot take the request now (`kind`), in its own
    /// words (`detail`); retry after [`STORE_RETRY_AFTER_SECS`].
    fn store_unavailable(kind: Unavailable, detail: &str) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!(
                "the store is unavailable: {kind} ({detail}); retry in {STORE_RETRY_AFTER_SECS} s"
            ),
        );
        error.retry_after = Some(STORE_RETRY_AFTER_SECS);
        error
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds));
        }
        response.json(Body {
            error: Detail {
                kind: self.kind,
                message: &self.message,
                first_seq: self.first_seq,
            },
        })
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        if let Error::Store(store) = &e {
            if let Some(kind) = store.unavailable() {
                let detail = match store {
                    StoreError::Unavailable { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                log::warn!("http: the store is unavailable ({kind}): {detail}");
                return Self::store_unavailable(kind, &detail);
            }
        }
        let message = e.to_string();
        let (status, kind) = match &e {
            Error::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Error::PromptConflict { .. } => (StatusCode::CONFLICT, "conflict"),
            Error::SessionBusy { .. } => (StatusCode::CONFLICT, "session_busy"),
            Error::NotRetryable { .. } => (StatusCode::CONFLICT, "not_retryable"),
            Error::Fenced { .. } => (StatusCode::CONFLICT, "fenced"),
            Error::EventsCompacted { .. } => (StatusCode::GONE, "events_compacted"),
            Error::InvalidInput { .. } => (StatusCode::BAD_REQUEST, "invalid_input"),
            Error::ShuttingDown | Error::Store(StoreError::Closed) => {
                (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
            Error::Undeliverable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::MessageDecode { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "message_decode"),
            Error::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            log::error!("http: {message}");
        }
        let mut error = Self::new(status, kind, message);
        if let Error::EventsCompacted { first_seq, .. } = e {
            error.first_seq = Some(first_seq);
        }
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SessionId;

    #[test]
    fn maps_runtime_errors_to_statuses() -> Result<(), Error> {
        let not_found = ApiError::from(Error::NotFound {
            session_id: SessionId::new("s")?,
        });
        assert_eq!(
            (not_found.status(), not_found.kind()),
            (StatusCode::NOT_FOUND, "not_found")
        );
        let closed = ApiError::from(Error::Store(StoreError::Closed));
        assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
        let store = ApiError::from(Error::Store(StoreError::Inconsistent("x".into())));
        assert_eq!(
            (store.status(), store.kind()),
            (StatusCode::INTERNAL_SERVER_ERROR, "store")
        );
        let busy = ApiError::from(Error::SessionBusy {
            session_id: SessionId::new("s")?,
        });
        assert_eq!(
            (busy.status(), busy.kind()),
            (StatusCode::CONFLICT, "session_busy")
        );
        let gone = ApiError::from(Error::EventsCompacted {
            session_id: SessionId::new("s")?,
            first_seq: 42,
        });
        assert_eq!(
            (gone.status(), gone.kind(), gone.first_seq()),
            (StatusCode::GONE, "events_compacted", Some(42))
        );
        let invalid = ApiError::from(Error::InvalidInput {
            field: "limit",
            reason: "0".into(),
        });
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        Ok(())
    }

    /// A SQLite failure with this primary result code and message.
    fn sqlite(code: i32, message: &str) -> Error {
        Error::Store(StoreError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            Some(message.into()),
        )))
    }

    #[test]
    fn a_store_outage_is_503_store_unavailable_naming_the_fault() {
        let read_only = "attempt to write a readonly database";
        let cases = [
            (
                sqlite(rusqlite::ffi::SQLITE_READONLY, read_only),
                "read-only",
                read_only,
            ),
            (
                sqlite(rusqlite::ffi::SQLITE_FULL, "database or disk is full"),
                "disk is full",
                "database or disk is full",
            ),
            (
                sqlite(rusqlite::ffi::SQLITE_IOERR, "disk I/O error"),
                "I/O error",
                "disk I/O error",
            ),
            (
                sqlite(rusqlite::ffi::SQLITE_BUSY, "database is locked"),
                "locked by another process",
                "database is locked",
            ),
            (
                Error::Store(StoreError::Unavailable {
                    kind: Unavailable::Connection,
                    message: "connection refused".into(),
                }),
                "cannot be reached",
                "connection refused",
            ),
            (
                Error::Store(StoreError::Unavailable {
                    kind: Unavailable::ReadOnly,
                    message: format!("sqlite: {read_only}"),
                }),
                "read-only",
                read_only,
            ),
        ];
        for (error, says, own) in cases {
            let api = ApiError::from(error);
            assert_eq!(
                (api.status(), api.kind(), api.retry_after()),
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    Some(STORE_RETRY_AFTER_SECS)
                ),
                "{api}"
            );
            assert!(api.message().contains(says), "{says:?} in {api}");
            assert!(api.message().contains(own), "{own:?} in {api}");
            let response = api.error_response();
            assert_eq!(
                response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
                Some(STORE_RETRY_AFTER_SECS.to_string().as_str())
            );
        }
        // A fault of the data, not of the store, stays a 500 without `Retry-After`.
        let constraint = ApiError::from(sqlite(
            rusqlite::ffi::SQLITE_CONSTRAINT,
            "UNIQUE constraint failed",
        ));
        assert_eq!(
            (
                constraint.status(),
                constraint.kind(),
                constraint.retry_after()
            ),
            (StatusCode::INTERNAL_SERVER_ERROR, "store", None)
        );
        assert!(constraint
            .error_response()
            .headers()
            .get(header::RETRY_AFTER)
            .is_none());
    }
}
