//! Reading requests with the adapter's own errors: a size-limited JSON body, a query string and
//! the ids in the path. Every failure is an [`ApiError`] with a JSON body, never one of
//! actix-web's plain-text errors.

use actix_web::http::{header, StatusCode};
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::HttpRequest;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::ApiError;
use super::HttpOptions;
use crate::error::Error;
use crate::id::{MessageId, SessionId};

/// Reads the whole body within the configured [`super::HttpOptions::body_timeout`] (408
/// after it), failing with 413 as soon as it exceeds the configured limit (at once when the
/// declared `Content-Length` does).
pub(super) async fn body(
    req: &HttpRequest,
    payload: web::Payload,
    options: &HttpOptions,
) -> Result<Bytes, ApiError> {
    let timeout = options.body_timeout;
    match actix_rt::time::timeout(timeout, read_body(req, payload, options.max_body_bytes)).await {
        Ok(read) => read,
        Err(_slow) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request body did not arrive within {} ms",
                timeout.as_millis()
            ),
        )),
    }
}

async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let mut buf = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::malformed(format!("reading the body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// Decodes a JSON body; an empty (or all-whitespace) body reads as `{}`. Syntax errors are
/// `malformed_json`; well-formed JSON of the wrong shape (a missing or unknown field, an invalid
/// id) is `invalid_input`.
pub(super) fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid(e.to_string()),
        _ => ApiError::malformed(format!("the body is not valid JSON: {e}")),
    })
}

/// Decodes the query string; a value that does not parse is `invalid_input`. Unknown parameters
/// are ignored.
pub(super) fn query<T: DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::invalid(format!("query string: {e}")))
}

/// The path segments the routes use.
#[derive(Debug, Deserialize)]
struct Segments {
    id: String,
    message_id: Option<String>,
}

fn segments(req: &HttpRequest) -> Result<Segments, ApiError> {
    req.match_info()
        .load()
        .map_err(|e| ApiError::invalid(format!("path: {e}")))
}

/// The `{id}` path segment (fully percent-decoded) as a session id (400 when invalid).
pub(super) fn session_id(req: &HttpRequest) -> Result<SessionId, ApiError> {
    Ok(SessionId::new(segments(req)?.id).map_err(Error::from)?)
}

/// The `{message_id}` path segment (fully percent-decoded) as a message id (400 when invalid).
pub(super) fn message_id(req: &HttpRequest) -> Result<MessageId, ApiError> {
    let id = segments(req)?
        .message_id
        .ok_or_else(|| ApiError::invalid("missing path segment message_id"))?;
    Ok(MessageId::new(id).map_err(Error::from)?)
}
