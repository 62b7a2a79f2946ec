//! The HTTP/SSE adapter (cargo feature `http`, on by default): the session service as JSON over
//! HTTP, and each session's event log as Server-Sent Events, on [actix-web].
//!
//! [`configure`] mounts the routes on any actix-web `App`, so a service embeds them next to its
//! own; `examples/server.rs` is a complete server.
//!
//! ```no_run
//! use actix_web::{web, App, HttpServer};
//! use durable_sessions::http::{self, HttpOptions};
//! # use durable_sessions::Runtime;
//! # async fn serve(runtime: Runtime) -> std::io::Result<()> {
//! let options = HttpOptions::new().token(Some("s3cret".into()));
//! let app_runtime = runtime.clone();
//! HttpServer::new(move || {
//!     App::new()
//!         .configure(http::configure(app_runtime.clone(), options.clone()))
//!         .default_service(web::to(http::not_found))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .shutdown_timeout(2) // SSE streams never end by themselves
//! .run()
//! .await?;
//! runtime.shutdown().await; // after the server stopped: running turns keep their claims
//! # Ok(())
//! # }
//! ```
//!
//! # Routes
//!
//! | method and path | body / query | answer |
//! |---|---|---|
//! | `POST /sessions` | `{id?, parent_id?, title?, directory?, agent?, model?}` | 201 the new [`SessionInfo`], 200 the stored one if `id` exists |
//! | `GET /sessions` | `?directory=&search=&limit=&order=asc\|desc&anchor_id=&anchor_time=&direction=previous\|next&parent_id=&top_level=true` | 200 `[SessionInfo]` |
//! | `GET /sessions/{id}` | | 200 [`SessionInfo`], 404 |
//! | `POST /sessions/{id}/prompt` | `{id?, text, delivery?: "steer"\|"queue", resume?: bool}` (or `prompt` instead of `text`) | 202 the [`Admission`], 404, 409 |
//! | `POST /sessions/{id}/interrupt` | | 200 `{"interrupted": bool}`, 404 |
//! | `POST /sessions/{id}/resume` | | 200 how the turn ended: a [`Terminal`] such as `{"type": "succeeded"}` |
//! | `GET /sessions/{id}/messages` | `?limit=&order=asc\|desc&cursor=<message id>&direction=previous\|next` | 200 `[Message]` |
//! | `GET /sessions/{id}/messages/{message_id}` | | 200 [`Message`], 404 |
//! | `GET /sessions/{id}/events` | `?after=<seq>`, header `Last-Event-ID` | `text/event-stream` |
//! | `GET /healthz` | | 200 `{"status": "ok"}` (never needs the token) |
//! | `GET /stats` | | 200 `{sessions_live, claimed, oldest_claim_age_ms, active_turns, transactions_committed, largest_batch, write_requests, failed_write_requests, actors_started, actors_replaced}` |
//!
//! Bodies are JSON (any `Content-Type` is accepted, so `curl -d` works; an empty body reads as
//! `{}`); unknown body fields are rejected, unknown query parameters ignored. `text` becomes the
//! prompt `{"text": text}`; `prompt` passes a JSON object or string through as is. Listings
//! are plain arrays: the next page's anchor is the last session's `id` and `time_created` (or
//! the last message's `id` as `cursor`).
//!
//! # Server-Sent Events
//!
//! `GET /sessions/{id}/events` replays the session's durable events with seq greater than the
//! starting point, in order, then follows new ones live, with no gap and no duplicate. Each
//! event is one frame:
//!
//! ```text
//! id: 7
//! event: session.execution.succeeded
//! data: {"session_id":"s1","seq":7,"type":"session.execution.succeeded","data":{},"time":1764504000000}
//! ```
//!
//! `id:` is the event's seq, `event:` its wire name, and `data:` the **whole** [`EventRecord`]
//! (`session_id`, `seq`, `type`, `data`, `time`) on one line. The starting point is the
//! `Last-Event-ID` header when a client sends one (an `EventSource` reconnecting: it wins over
//! `after`, which is what the original URL still carries), else `after`, else the start of the
//! log; a malformed `Last-Event-ID` is 400. The stream opens with a `retry:` hint and a
//! comment, sends a `: keep-alive` comment after [`HttpOptions::keep_alive`] without events,
//! and ends when the runtime shuts down (or with an `event: error` frame on a store fault; a
//! client reconnects with `Last-Event-ID` and loses nothing).
//!
//! # Errors and the token
//!
//! Every error is JSON `{"error": {"type", "message"}}`; [`ApiError`] lists the statuses. With
//! [`HttpOptions::token`] set, every route except `GET /healthz` (kept open for liveness probes;
//! it reveals nothing) requires `Authorization: Bearer <token>` and answers 401 without it.
//! (A browser's `EventSource` cannot send that header; behind a token, read the event stream
//! with a `fetch`-based SSE client.)
//!
//! [actix-web]: https://actix.rs
//! [`SessionInfo`]: crate::SessionInfo
//! [`Admission`]: crate::Admission
//! [`Terminal`]: crate::Terminal
//! [`Message`]: crate::Message
//! [`EventRecord`]: crate::EventRecord

mod error;
mod events;
mod extract;
mod sessions;

use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use crate::runtime::Runtime;

pub use error::ApiError;

/// Options of the HTTP adapter.
#[derive(Clone)]
pub struct HttpOptions {
    token: Option<String>,
    max_body_bytes: usize,
    keep_alive: Duration,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            token: None,
            max_body_bytes: 2 * 1024 * 1024,
            keep_alive: Duration::from_secs(15),
        }
    }
}

impl HttpOptions {
    /// The defaults: no token, 2 MiB bodies, a keep-alive comment every 15 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bearer token every route but `GET /healthz` requires; `None` (the default) leaves
    /// the routes open. An empty token counts as none.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// The largest request body accepted; larger ones are answered 413. Default 2 MiB (prompts
    /// are further limited by the runtime's `max_prompt_bytes`, 400 when over).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// How long an event stream may stay silent before a `: keep-alive` comment. Default 15 s.
    pub fn keep_alive(mut self, every: Duration) -> Self {
        self.keep_alive = every.max(Duration::from_millis(10));
        self
    }
}

/// What every handler shares (resource-level app data, private to these routes).
pub(crate) struct State {
    runtime: Runtime,
    options: HttpOptions,
}

/// Mounts the routes (see the module docs) on an actix-web `App` or scope:
/// `App::new().configure(http::configure(runtime.clone(), options.clone()))`.
///
/// The routes keep their state per resource, so they live next to an application's own routes
/// and data without clashing. Call it once per worker (inside `HttpServer::new`'s factory).
pub fn configure(runtime: Runtime, options: HttpOptions) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        let state = web::Data::new(State { runtime, options });
        let guarded = |path: &str| {
            web::resource(path)
                .app_data(state.clone())
                .wrap(from_fn(authorize))
                .default_service(web::to(method_not_allowed))
        };
        cfg.service(
            web::resource("/healthz")
                .route(web::get().to(sessions::healthz))
                .default_service(web::to(method_not_allowed)),
        )
        .service(guarded("/stats").route(web::get().to(sessions::stats)))
        .service(
            guarded("/sessions")
                .route(web::post().to(sessions::create))
                .route(web::get().to(sessions::list)),
        )
        .service(guarded("/sessions/{id}").route(web::get().to(sessions::get)))
        .service(guarded("/sessions/{id}/prompt").route(web::post().to(sessions::prompt)))
        .service(guarded("/sessions/{id}/interrupt").route(web::post().to(sessions::interrupt)))
        .service(guarded("/sessions/{id}/resume").route(web::post().to(sessions::resume)))
        .service(guarded("/sessions/{id}/messages").route(web::get().to(sessions::messages)))
        .service(
            guarded("/sessions/{id}/messages/{message_id}").route(web::get().to(sessions::message)),
        )
        .service(guarded("/sessions/{id}/events").route(web::get().to(events::events)));
    }
}

/// A JSON 404 for paths no route matches: `App::new().default_service(web::to(http::not_found))`.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::not_found(format!("no route for {} {}", req.method(), req.path())).error_response()
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.path()),
    )
    .error_response()
}

/// Whether two byte strings are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the request carries `Authorization: Bearer <token>`.
fn authorized(req: &ServiceRequest, token: &str) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, credentials) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| credentials.trim())
        })
        .is_some_and(|given| same(given.as_bytes(), token.as_bytes()))
}

/// The token guard of every route but `/healthz`.
async fn authorize(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let token = req
        .app_data::<web::Data<State>>()
        .and_then(|state| state.options.token.clone());
    match token {
        Some(token) if !authorized(&req, &token) => {
            Ok(req.into_response(ApiError::unauthorized().error_response()))
        }
        _ => next.call(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn compares_tokens() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }
}
