//! What every request passes before a route sees it: the origin and body checks that keep
//! other web sites out, CORS for the origins an operator allows, and the token (or an event
//! stream's ticket).
//!
//! Order, outermost first: [`screen`] (a path that is not UTF-8, a foreign `Origin`, a body
//! that is not JSON), then CORS (only with allowed origins: it answers preflights), then
//! [`authorize`]. Every refusal is a JSON [`ApiError`].

use actix_cors::Cors;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{RequestHead, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, ResponseError};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::{ticket, HttpOptions, State};

/// Whether `origin` (an `Origin` header) names the server the request was sent to, judged by
/// its `Host` header: a page the server itself served (the console) calls it freely.
fn same_origin(origin: &str, head: &RequestHead) -> bool {
    let Some(host) = head
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|authority| authority.eq_ignore_ascii_case(host))
}

/// Whether a request carrying `Origin: origin` may be served.
fn origin_allowed(options: &HttpOptions, origin: &HeaderValue, head: &RequestHead) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    same_origin(origin, head) || options.cors_origins.iter().any(|o| o == origin)
}

/// The CORS middleware for the configured origins (disabled when there are none).
pub(super) fn cors(options: &HttpOptions) -> actix_web::middleware::Condition<Cors> {
    let allowed = options.clone();
    let cors = Cors::default()
        .allowed_origin_fn(move |origin, head| origin_allowed(&allowed, origin, head))
        .allowed_methods([Method::GET, Method::HEAD, Method::POST, Method::DELETE])
        .allowed_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("last-event-id"),
        ])
        .max_age(3600);
    actix_web::middleware::Condition::new(!options.cors_origins.is_empty(), cors)
}

/// Whether the request will send a body (a declared length over 0, or chunked).
fn has_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    length.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// Whether the `Content-Type` is `application/json` (parameters such as `charset` allowed).
fn is_json(req: &ServiceRequest) -> bool {
    req.mime_type()
        .ok()
        .flatten()
        .is_some_and(|mime| mime.essence_str() == "application/json")
}

/// The first refusal a request earns before routing, if any.
fn refusal(req: &ServiceRequest, options: &HttpOptions) -> Option<ApiError> {
    // Ids are percent-decoded; bytes that are not UTF-8 would be decoded lossily and alias
    // other ids.
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(req.path()).collect();
    if std::str::from_utf8(&decoded).is_err() {
        return Some(ApiError::invalid(
            "the path is not valid UTF-8 once percent-decoded",
        ));
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if !origin_allowed(options, origin, req.head()) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!(
                    "requests from the origin {} are not allowed (see --cors-origin)",
                    String::from_utf8_lossy(origin.as_bytes())
                ),
            ));
        }
    }
    if has_body(req) && !is_json(req) {
        return Some(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "request bodies must be sent as `Content-Type: application/json`",
        ));
    }
    None
}

/// The outermost check of every route: see [`refusal`].
pub(super) async fn screen<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let refused = match req.app_data::<web::Data<State>>() {
        Some(state) => refusal(&req, &state.options),
        None => refusal(&req, &HttpOptions::default()),
    };
    match refused {
        Some(error) => Ok(req.into_response(error.error_response())),
        None => Ok(next.call(req).await?.map_into_boxed_body()),
    }
}

/// Whether the request carries `Authorization: Bearer <token>`.
fn bearer(req: &ServiceRequest, token: &str) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, credentials) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| credentials.trim())
        })
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
}

/// The stream a `GET` (or `HEAD`) of an event stream route reads, as tickets name it: the
/// session id (decoded as the routes decode it) or [`ticket::ALL_SESSIONS`]. `None` for any
/// other request: matched by route pattern, so a path that merely ends in `/events` (a message
/// whose id is `events`) is not a stream.
fn stream_scope(req: &ServiceRequest) -> Option<String> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    match req.match_pattern()?.as_str() {
        "/sessions/{id}/events" => req.match_info().load::<IdSegment>().ok().map(|s| s.id),
        "/events" => Some(ticket::ALL_SESSIONS.to_owned()),
        _ => None,
    }
}

/// The request's `?ticket=`, if it has one.
fn ticket_param(req: &ServiceRequest) -> Option<String> {
    web::Query::<TicketParam>::from_query(req.query_string())
        .ok()?
        .into_inner()
        .ticket
}

/// Whether the request is an event stream's `GET` (or `HEAD`) with a valid `?ticket=` for it.
fn ticketed(req: &ServiceRequest) -> bool {
    stream_scope(req)
        .zip(ticket_param(req))
        .is_some_and(|(scope, t)| ticket::valid(&t, &scope))
}

/// When a refused request carried `?ticket=`, why the ticket did not open it (a 401 that names
/// the ticket rather than the header it did not send); `None` without a ticket.
fn ticket_refusal(req: &ServiceRequest) -> Option<ApiError> {
    ticket_param(req)?;
    let message = if stream_scope(req).is_some() {
        "the ticket does not open this stream: it has expired, was issued for another stream, \
         or is malformed (a new one: POST /sessions/{id}/events/ticket, or POST /events/ticket, \
         with the token)"
    } else {
        "a ticket opens an event stream only (GET /sessions/{id}/events or GET /events); \
         this route needs `Authorization: Bearer <token>`"
    };
    Some(ApiError::new(
        actix_web::http::StatusCode::UNAUTHORIZED,
        "invalid_ticket",
        message,
    ))
}

#[derive(serde::Deserialize)]
struct IdSegment {
    id: String,
}

#[derive(serde::Deserialize)]
struct TicketParam {
    ticket: Option<String>,
}

/// The token guard of every route but `/healthz` and `/console`.
pub(super) async fn authorize(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let token = req
        .app_data::<web::Data<State>>()
        .and_then(|state| state.options.token.clone());
    match token {
        Some(token) if !bearer(&req, &token) && !ticketed(&req) => {
            let refusal = ticket_refusal(&req).unwrap_or_else(ApiError::unauthorized);
            Ok(req.into_response(refusal.error_response()))
        }
        _ => next.call(req).await,
    }
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;

    #[test]
    fn an_origin_is_the_same_when_it_names_the_host() {
        let req = TestRequest::default()
            .insert_header((header::HOST, "127.0.0.1:8080"))
            .to_srv_request();
        assert!(same_origin("http://127.0.0.1:8080", req.head()));
        assert!(!same_origin("http://127.0.0.1:8081", req.head()));
        assert!(!same_origin("http://evil.example", req.head()));
        assert!(!same_origin("null", req.head()));
    }
}
