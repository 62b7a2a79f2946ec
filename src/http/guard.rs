//! What every request passes before a route sees it: the origin and body checks that keep
//! other web sites out, CORS for the origins an operator allows, and the token (or an event
//! stream's ticket).
//!
//! Order, outermost first: [`screen`] (a path that is not UTF-8, a `Host` the server does not
//! answer to, a foreign `Origin`, a body that is not JSON), then CORS (only with allowed
//! origins: it answers preflights; its refusals get a JSON body on their way out through
//! [`screen`]), then [`authorize`]. Every refusal is a JSON [`ApiError`].

use std::net::SocketAddr;

use actix_cors::{Cors, CorsError};
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{RequestHead, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, ResponseError};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::{ticket, HttpOptions, State};

/// The names every server answers to: a page can only be served under them from this machine.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The host name of a `Host` header (or of a name given to [`HttpOptions::allowed_host`]):
/// lowercased, without its port or a trailing dot; an IPv6 address in brackets.
pub(super) fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if host.starts_with('[') {
        host.find(']').map_or(host, |end| &host[..=end])
    } else if host.matches(':').count() > 1 {
        // A bare IPv6 address (as a name given to the options may be).
        return format!("[{}]", host.to_ascii_lowercase());
    } else {
        host.split(':').next().unwrap_or(host)
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The address of the listener `req` came through: the one [`super::serve`] records per
/// connection, else actix-web's (`HttpServer`'s bound address, or its default 127.0.0.1:8080).
fn listener(req: &ServiceRequest) -> SocketAddr {
    req.conn_data::<super::serve::Listener>()
        .map_or_else(|| req.app_config().local_addr(), |l| l.0)
}

/// Whether a request naming `host` in `Host`, received on `listener`, may be served (see
/// [`HttpOptions::allowed_host`]).
fn host_allowed(options: &HttpOptions, host: &str, listener: SocketAddr) -> bool {
    let name = host_name(host);
    LOOPBACK_HOSTS.contains(&name.as_str())
        || options.allowed_hosts.iter().any(|h| h == "*" || *h == name)
        || (options.allowed_hosts.is_empty() && !listener.ip().to_canonical().is_loopback())
}

/// 421 `host_not_allowed` when the request's `Host` (or, without one, its URI's authority)
/// names a host the server does not answer to.
fn host_refusal(req: &ServiceRequest, options: &HttpOptions) -> Option<ApiError> {
    let host = match req.headers().get(header::HOST) {
        Some(host) => String::from_utf8_lossy(host.as_bytes()).into_owned(),
        None => req.uri().authority()?.as_str().to_owned(),
    };
    if host_allowed(options, &host, listener(req)) {
        return None;
    }
    let mut accepted: Vec<&str> = LOOPBACK_HOSTS.to_vec();
    accepted.extend(options.allowed_hosts.iter().map(String::as_str));
    Some(ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "host_not_allowed",
        format!(
            "this server does not answer to the host {host:?} (it answers to {}; see \
             --allowed-host)",
            accepted.join(", ")
        ),
    ))
}

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
        .allowed_methods(CORS_METHODS)
        .allowed_headers(CORS_HEADERS.map(header::HeaderName::from_static))
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

/// The first refusal a request earns before routing, if any (the `Host` checked when
/// `check_host`).
fn refusal(req: &ServiceRequest, options: &HttpOptions, check_host: bool) -> Option<ApiError> {
    // Ids are percent-decoded; bytes that are not UTF-8 would be decoded lossily and alias
    // other ids.
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(req.path()).collect();
    if std::str::from_utf8(&decoded).is_err() {
        return Some(ApiError::invalid(
            "the path is not valid UTF-8 once percent-decoded",
        ));
    }
    if check_host {
        if let Some(refused) = host_refusal(req, options) {
            return Some(refused);
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if !origin_allowed(options, origin, req.head()) {
            return Some(origin_refusal(&String::from_utf8_lossy(origin.as_bytes())));
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

/// The outermost check of every route but `/healthz`: see [`refusal`].
pub(super) async fn screen<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    screened(req, next, true).await
}

/// [`screen`] without the `Host` check (`/healthz`).
pub(super) async fn screen_any_host<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    screened(req, next, false).await
}

async fn screened<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
    check_host: bool,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let refused = match req.app_data::<web::Data<State>>() {
        Some(state) => refusal(&req, &state.options, check_host),
        None => refusal(&req, &HttpOptions::default(), check_host),
    };
    if let Some(error) = refused {
        return Ok(req.into_response(error.error_response()));
    }
    let response = next.call(req).await?;
    let cors = response
        .response()
        .error()
        .and_then(|e| e.as_error::<CorsError>())
        .cloned();
    match cors {
        Some(cors) => Ok(json_cors_refusal(response, &cors)),
        None => Ok(response.map_into_boxed_body()),
    }
}

/// The methods and headers cross-origin callers may use (see [`cors`]).
const CORS_METHODS: [Method; 4] = [Method::GET, Method::HEAD, Method::POST, Method::DELETE];
const CORS_HEADERS: [&str; 3] = ["authorization", "content-type", "last-event-id"];

/// A refusal of `actix-cors` (plain text, no content type) as the JSON error it stands for,
/// keeping its `Vary` header.
fn json_cors_refusal<B>(
    response: ServiceResponse<B>,
    cors: &CorsError,
) -> ServiceResponse<BoxBody> {
    let origin = response
        .request()
        .headers()
        .get(header::ORIGIN)
        .map(|o| String::from_utf8_lossy(o.as_bytes()).into_owned())
        .unwrap_or_default();
    let vary = response.headers().get(header::VARY).cloned();
    let error = match cors {
        CorsError::OriginNotAllowed => origin_refusal(&origin),
        CorsError::MethodNotAllowed => ApiError::new(
            StatusCode::FORBIDDEN,
            "cors_not_allowed",
            format!(
                "cross-origin callers may use the methods {} only",
                CORS_METHODS.map(|m| m.to_string()).join(", ")
            ),
        ),
        CorsError::HeadersNotAllowed => ApiError::new(
            StatusCode::FORBIDDEN,
            "cors_not_allowed",
            format!(
                "cross-origin callers may send the headers {} only",
                CORS_HEADERS.join(", ")
            ),
        ),
        other => ApiError::invalid(format!("CORS preflight: {other}")),
    };
    let (req, _) = response.into_parts();
    let mut response = error.error_response();
    if let Some(vary) = vary {
        response.headers_mut().insert(header::VARY, vary);
    }
    ServiceResponse::new(req, response)
}

/// 403 `origin_not_allowed`.
fn origin_refusal(origin: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "origin_not_allowed",
        format!("requests from the origin {origin} are not allowed (see --cors-origin)"),
    )
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

    #[test]
    fn a_host_is_its_name_without_port_case_or_trailing_dot() {
        assert_eq!(host_name("LocalHost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "[::1]");
        assert_eq!(host_name("::1"), "[::1]");
        assert_eq!(host_name("evil.example.:80"), "evil.example");
        assert_eq!(host_name("app.example.com"), "app.example.com");
    }

    #[test]
    fn a_loopback_listener_answers_to_the_loopback_names_and_the_allowed_ones() {
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap_or_else(|_| unreachable!());
        let v6: SocketAddr = "[::1]:8080".parse().unwrap_or_else(|_| unreachable!());
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!());
        let default = HttpOptions::new();
        for listener in [loopback, v6] {
            for host in ["localhost:8080", "127.0.0.1:9", "[::1]:8080", "localhost"] {
                assert!(host_allowed(&default, host, listener), "{host}");
            }
            assert!(!host_allowed(&default, "evil.example:8080", listener));
            assert!(!host_allowed(&default, "127.0.0.2:8080", listener));
        }
        assert!(host_allowed(&default, "evil.example:8080", any));
        let named = HttpOptions::new().allowed_hosts(["App.Example:443", "10.0.0.5"]);
        for listener in [loopback, any] {
            assert!(host_allowed(&named, "app.example", listener));
            assert!(host_allowed(&named, "10.0.0.5:8080", listener));
            assert!(host_allowed(&named, "localhost:8080", listener));
            assert!(!host_allowed(&named, "evil.example", listener));
        }
        let every = HttpOptions::new().allowed_host("*");
        assert!(host_allowed(&every, "evil.example", loopback));
    }
}
