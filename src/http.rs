//! The HTTP/SSE adapter (cargo feature `http`, on by default): the session service as JSON over
//! HTTP, each session's event log as Server-Sent Events, and an operator console, on
//! [actix-web].
//!
//! [`configure`] mounts the routes on any actix-web `App`, so a service embeds them next to its
//! own; [`serve`] runs them the way `examples/server.rs` (a complete server) does.
//!
//! ```no_run
//! use actix_web::{web, App};
//! use durable_sessions::http::{self, HttpOptions, ServeOptions};
//! # use durable_sessions::Runtime;
//! # async fn run(runtime: Runtime) -> std::io::Result<()> {
//! let options = HttpOptions::new()
//!     .token(Some("s3cret".into()))
//!     .cors_origin("https://app.example.com");
//! let listener = std::net::TcpListener::bind("127.0.0.1:8080")?;
//! let app_runtime = runtime.clone();
//! http::serve(vec![listener], &ServeOptions::default(), move || {
//!     App::new()
//!         .configure(http::configure(app_runtime.clone(), options.clone()))
//!         .default_service(web::to(http::not_found))
//! })?
//! .await?;
//! runtime.shutdown().await; // after the server stopped: running turns keep their claims
//! # Ok(())
//! # }
//! ```
//!
//! `actix_web::HttpServer` works too; [`serve`] adds JSON bodies on the errors actix-http
//! answers by itself (400 on bad framing, 408, 431) and releases an event stream as soon as its
//! client hangs up (`HttpServer::h1_allow_half_closed(false)` does the latter).
//!
//! # Routes
//!
//! | method and path | body / query | answer |
//! |---|---|---|
//! | `POST /sessions` | `{id?, parent_id?, title?, directory?, agent?, model?}` | 201 the new [`SessionInfo`], 200 the stored one if `id` exists |
//! | `GET /sessions` | `?directory=&search=&limit=&order=asc\|desc&anchor_id=&anchor_time=&direction=previous\|next&parent_id=&top_level=true` | 200 `[SessionInfo]` |
//! | `GET /sessions/{id}` | | 200 [`SessionInfo`], 404 |
//! | `DELETE /sessions/{id}` | `?force=true` | 200 `{"deleted": [ids]}` (the session, then the sessions below it), 404, 409 `session_busy` while a turn is in flight (unless `force`) |
//! | `GET /sessions/{id}/status` | | 200 `{session, claimed, claim_age_ms, running, last_seq, log_start, last_terminal}` |
//! | `POST /sessions/{id}/prompt` | `{id?, text, delivery?: "steer"\|"queue", resume?: bool}` (or `prompt` instead of `text`) | 202 the [`Admission`], 404, 409 |
//! | `POST /sessions/{id}/interrupt` | | 200 `{"interrupted": bool}`, 404 |
//! | `POST /sessions/{id}/resume` | | 200 how the turn ended: a [`Terminal`] such as `{"type": "succeeded"}` |
//! | `POST /sessions/{id}/retry` | | 200 how the next attempt of the last turn, which failed, ended; 409 `not_retryable` (with why) otherwise |
//! | `GET /sessions/{id}/steps` | | 200 the steps of the last turn, a [`TurnSteps`] `{turn, attempt, open, steps: [{name, key, attempts, turn_attempt, status, result?, error?}]}`, or `null` before any turn; 404 |
//! | `GET /sessions/{id}/messages` | `?limit=&order=asc\|desc&cursor=<message id>&direction=previous\|next` | 200 `[Message]` |
//! | `GET /sessions/{id}/messages/{message_id}` | | 200 [`Message`], 404 |
//! | `GET /sessions/{id}/events` | `?after=<seq>`, header `Last-Event-ID`, `?ticket=` | `text/event-stream` |
//! | `POST /sessions/{id}/events/ticket` | | 200 `{ticket, expires_at, expires_in_ms}` |
//! | `GET /events` | `?ticket=` | `text/event-stream`: every session's committed events as they commit (no replay; no live-only events) |
//! | `POST /events/ticket` | | 200 a ticket for `GET /events` |
//! | `GET /healthz` | | 200 `{"status": "ok"}` (never needs the token; answers any `Host`) |
//! | `GET /stats` | | 200 `{sessions_live, claimed, oldest_claim_age_ms, active_turns, transactions_committed, largest_batch, write_requests, failed_write_requests, actors_started, actors_replaced, event_streams}` |
//! | `GET /console` | | the operator console (an HTML page; see below) |
//!
//! `HEAD` works on every `GET` route. Bodies are JSON and must say so: a request with a body
//! needs `Content-Type: application/json` (415 otherwise; an empty body reads as `{}` and needs
//! no type). Unknown body fields are rejected, unknown query parameters ignored. `text` becomes
//! the prompt `{"text": text}`; `prompt` passes a JSON object or string through as is. Listings
//! are plain arrays: the next page's anchor is the last session's `id` and `time_created` (or
//! the last message's `id` as `cursor`). A body must arrive within
//! [`HttpOptions::body_timeout`] (5 s) of the headers, or the answer is 408. Path segments are
//! percent-decoded; one that does not decode to UTF-8 is 400.
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
//! (`session_id`, `seq`, `type`, `data`, `time`) on one line. Every frame is named, so a
//! browser's `EventSource.onmessage` never fires: listen with `addEventListener(name, …)`. The
//! starting point is the `Last-Event-ID` header when a client sends one (an `EventSource`
//! reconnecting: it wins over `after`, which is what the original URL still carries), else
//! `after`, else the start of the log; a malformed `Last-Event-ID`, or a start past the end of
//! the log (an id kept from another database), is 400. The stream opens with a `retry:` hint
//! and a comment, sends a `: keep-alive` comment after [`HttpOptions::keep_alive`] without
//! events, and ends when the runtime shuts down (or with an `event: stream.error` frame on a
//! store fault; a client reconnects with `Last-Event-ID` and loses nothing). Streams need
//! HTTP/1.1: over HTTP/1.0 the answer is 505.
//!
//! Live-only events ([`Turn::publish_live`]) published while the stream is open come
//! interleaved, each after the durable events its turn wrote before it, as frames **without
//! `id:`** whose `data:` is the [`LiveEvent`] (`session_id`, `type`, `data`, `time`,
//! `after_seq`: no `seq`):
//!
//! ```text
//! event: agent.delta
//! data: {"session_id":"s1","type":"agent.delta","data":{"word":"hello"},"time":1764504000000,"after_seq":6}
//! ```
//!
//! They are never stored and never replayed, and `Last-Event-ID` stays a durable seq: a client
//! that reconnects gets the durable events it missed and the live ones from then on. With
//! several nodes, a stream gets the live events of turns running on its own node only.
//!
//! When the session is deleted (`DELETE /sessions/{id}`), its streams send a last
//! `event: session.deleted` frame and end. When retention compacted its log
//! ([`crate::RetainEvents`]), a stream from the start begins at the first seq still held, and
//! one from before that point (`after` or `Last-Event-ID`) is answered 410 `events_compacted`
//! with that seq as `error.first_seq`.
//!
//! Streams scale per session: the runtime routes each committed event only to the streams of
//! its session (one dispatcher thread per runtime), so a stream of a silent session costs no
//! CPU, only its connection's memory; a stream that falls behind re-reads from the store.
//!
//! # Errors, the token, tickets and browsers
//!
//! Every error is JSON `{"error": {"type", "message"}}`; [`ApiError`] lists the statuses. With
//! [`HttpOptions::token`] set, every route except `GET /healthz` (kept open for liveness probes)
//! and the console's page requires `Authorization: Bearer <token>` and answers 401 without it
//! (compared in constant time).
//!
//! A browser's `EventSource` cannot send that header, and the token must not go into URLs (they
//! end up in logs and histories). Instead, `POST /sessions/{id}/events/ticket` (with the token)
//! answers a **ticket**: signed (HMAC-SHA256 under a key drawn at random when the process
//! starts), valid for that one session's stream and for [`HttpOptions::ticket_ttl`] (60 s), and
//! accepted as `?ticket=` on `GET /sessions/{id}/events` only (`POST /events/ticket` likewise
//! for `GET /events`). A client whose ticket expired asks for a new one before reconnecting.
//!
//! Cross-site requests: a request with an `Origin` header is refused (403 `origin_not_allowed`)
//! unless the origin is the server's own (the `Host` it was sent to) or one allowed with
//! [`HttpOptions::cors_origin`]; for allowed origins, CORS preflights are answered and responses
//! carry `Access-Control-Allow-Origin` (`actix-cors`; a preflight it refuses is a JSON 403
//! `cors_not_allowed`). Together with the JSON content type, this keeps a page of another site
//! from posting a prompt to a token-less server on `127.0.0.1`.
//!
//! DNS rebinding: a page of another site whose name is re-pointed to `127.0.0.1` calls the
//! server as its own origin, with its own name in `Host`. So every route but `GET /healthz`
//! checks `Host` first and answers a host it does not serve with 421 `host_not_allowed`. A
//! server on a loopback address answers to `localhost`, `127.0.0.1` and `[::1]` (any port) and
//! the hosts named with [`HttpOptions::allowed_host`]; one on another address (`0.0.0.0`)
//! answers to any host unless some are named. [`configure`] learns the listener's address from
//! actix-web, so an embedded server gets the same default (see [`HttpOptions::allowed_host`]).
//!
//! # The console
//!
//! `GET /console` ([`HttpOptions::console`], on by default) serves one self-contained page,
//! embedded in the binary: the sessions list (title, directory, claimed or idle, the running
//! turn and its age, resume attempts, last terminal), updated live from `GET /events`; a
//! session's transcript and event log (replayed, then followed), its current turn's durable
//! steps (running, completed, failed or ambiguous), with prompt, interrupt, resume, retry (when
//! the last turn failed) and delete (forced, after a confirmation) buttons; the `/stats`
//! figures. It uses only the routes above, with the token typed into it and tickets for its
//! event streams; the page itself holds no data.
//!
//! [actix-web]: https://actix.rs
//! [`SessionInfo`]: crate::SessionInfo
//! [`Admission`]: crate::Admission
//! [`Terminal`]: crate::Terminal
//! [`TurnSteps`]: crate::TurnSteps
//! [`Message`]: crate::Message
//! [`EventRecord`]: crate::EventRecord
//! [`LiveEvent`]: crate::LiveEvent
//! [`Turn::publish_live`]: crate::Turn::publish_live

mod console;
mod error;
mod events;
mod extract;
mod guard;
mod serve;
mod sessions;
mod ticket;

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::middleware::from_fn;
use actix_web::{guard as route_guard, web, HttpRequest, HttpResponse, ResponseError};

use crate::runtime::Runtime;

pub use error::{ApiError, STORE_RETRY_AFTER_SECS};
pub use serve::{serve, JsonErrors, ServeOptions};

/// Options of the HTTP adapter.
#[derive(Clone)]
pub struct HttpOptions {
    token: Option<String>,
    max_body_bytes: usize,
    keep_alive: Duration,
    body_timeout: Duration,
    cors_origins: Vec<String>,
    allowed_hosts: Vec<String>,
    ticket_ttl: Duration,
    console: bool,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("keep_alive", &self.keep_alive)
            .field("body_timeout", &self.body_timeout)
            .field("cors_origins", &self.cors_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("ticket_ttl", &self.ticket_ttl)
            .field("console", &self.console)
            .finish()
    }
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            token: None,
            max_body_bytes: 2 * 1024 * 1024,
            keep_alive: Duration::from_secs(15),
            body_timeout: Duration::from_secs(5),
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            ticket_ttl: Duration::from_secs(60),
            console: true,
        }
    }
}

impl HttpOptions {
    /// The defaults: no token, 2 MiB bodies read within 5 s, a keep-alive comment every 15 s,
    /// no cross-origin caller allowed, only the loopback names as `Host` on a loopback
    /// listener, 60 s event-stream tickets, the console served.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bearer token every route but `GET /healthz` (and the console's page) requires;
    /// `None` (the default) leaves the routes open. An empty token counts as none.
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

    /// How long a request body may take to arrive, once the headers have: a slower (or never
    /// finished) body is answered 408 and its connection closed. Default 5 s. (Slow *headers*
    /// are actix-web's `HttpServer::client_request_timeout`, also 5 s by default.)
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Allows cross-origin calls from a web page served by `origin` (`scheme://host[:port]`,
    /// exactly as browsers send it in `Origin`), with CORS: preflights are answered and the
    /// responses carry `Access-Control-Allow-Origin`. Call it once per origin. By default no
    /// other origin is allowed, and a request whose `Origin` is neither allowed nor the
    /// server's own is refused with 403.
    pub fn cors_origin(mut self, origin: impl Into<String>) -> Self {
        let origin = origin.into().trim_end_matches('/').to_owned();
        if !origin.is_empty() && !self.cors_origins.contains(&origin) {
            self.cors_origins.push(origin);
        }
        self
    }

    /// Also accepts requests whose `Host` names `host` (a host name or IP address, any port;
    /// `"*"` accepts every host). Call it once per name, or use [`HttpOptions::allowed_hosts`].
    ///
    /// Every request but `GET /healthz` must name an accepted host in its `Host` header, or it
    /// is refused with `421 Misdirected Request` (`host_not_allowed`) before anything else runs:
    /// this keeps out DNS rebinding, where a page of `http://evil.example:8080` whose name an
    /// attacker re-points to `127.0.0.1` calls a server on this machine as its own origin. 421
    /// rather than 403: nothing is wrong with the caller's rights, the request reached a server
    /// that does not serve that host. `GET /healthz` answers any host: a liveness probe may name
    /// the server in any way, and the answer reveals nothing. Accepted are:
    ///
    /// - always `localhost`, `127.0.0.1` and `[::1]`, with any port;
    /// - the hosts given here;
    /// - when none are given and the listener the request came through is *not* a loopback
    ///   address (`0.0.0.0`, a LAN address), any host. Such a server is reachable as
    ///   `localhost` too: name its hosts here (or set a token) to keep rebinding pages out.
    ///
    /// The listener is the one [`serve`] or `actix_web::HttpServer` bound (actix-web's
    /// `AppConfig::local_addr`), so [`configure`] needs no address; an app run without one
    /// (actix-web's default configuration names `127.0.0.1:8080`, a Unix socket too) counts as
    /// loopback. Behind a reverse proxy on the same machine, name the public host here. A request
    /// without a `Host` header is not refused (browsers always send one); `Forwarded` and
    /// `X-Forwarded-Host` are not read (a rebinding page may set them).
    pub fn allowed_host(mut self, host: impl AsRef<str>) -> Self {
        let host = guard::host_name(host.as_ref());
        if !host.is_empty() && !self.allowed_hosts.contains(&host) {
            self.allowed_hosts.push(host);
        }
        self
    }

    /// [`HttpOptions::allowed_host`] for each of `hosts`: the host names (or addresses) that
    /// requests may name in `Host` besides the loopback names.
    pub fn allowed_hosts<I>(self, hosts: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        hosts.into_iter().fold(self, Self::allowed_host)
    }

    /// How long an event-stream ticket (`POST /sessions/{id}/events/ticket`) stays valid.
    /// Default 60 s.
    pub fn ticket_ttl(mut self, ttl: Duration) -> Self {
        self.ticket_ttl = ttl;
        self
    }

    /// Whether `GET /console` serves the operator console. Default `true`.
    pub fn console(mut self, serve: bool) -> Self {
        self.console = serve;
        self
    }
}

/// What every handler shares (resource-level app data, private to these routes).
pub(crate) struct State {
    runtime: Runtime,
    options: HttpOptions,
}

/// `GET`, and `HEAD` answered by the same handler (actix-web sends no body for `HEAD`).
fn get_or_head() -> actix_web::Route {
    web::route().guard(route_guard::Any(route_guard::Get()).or(route_guard::Head()))
}

/// Mounts the routes (see the module docs) on an actix-web `App` or scope:
/// `App::new().configure(http::configure(runtime.clone(), options.clone()))`.
///
/// The routes keep their state per resource, so they live next to an application's own routes
/// and data without clashing. Call it once per worker (inside `HttpServer::new`'s factory).
pub fn configure(runtime: Runtime, options: HttpOptions) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        let serve_console = options.console;
        let state = web::Data::new(State { runtime, options });
        // `/healthz` answers whatever `Host` it is sent (a liveness probe may name the server
        // in any way, and the answer reveals nothing).
        let healthz = |path: &str| {
            web::resource(path)
                .app_data(state.clone())
                .wrap(guard::cors(&state.options))
                .wrap(from_fn(guard::screen_any_host))
                .default_service(web::to(method_not_allowed))
        };
        let open = |path: &str| {
            web::resource(path)
                .app_data(state.clone())
                .wrap(guard::cors(&state.options))
                .wrap(from_fn(guard::screen))
                .default_service(web::to(method_not_allowed))
        };
        let guarded = |path: &str| {
            web::resource(path)
                .app_data(state.clone())
                .wrap(from_fn(guard::authorize))
                .wrap(guard::cors(&state.options))
                .wrap(from_fn(guard::screen))
                .default_service(web::to(method_not_allowed))
        };
        cfg.service(healthz("/healthz").route(get_or_head().to(sessions::healthz)))
            .service(guarded("/stats").route(get_or_head().to(sessions::stats)))
            .service(
                guarded("/sessions")
                    .route(web::post().to(sessions::create))
                    .route(get_or_head().to(sessions::list)),
            )
            .service(
                guarded("/sessions/{id}")
                    .route(get_or_head().to(sessions::get))
                    .route(web::delete().to(sessions::delete)),
            )
            .service(guarded("/sessions/{id}/status").route(get_or_head().to(sessions::status)))
            .service(guarded("/sessions/{id}/prompt").route(web::post().to(sessions::prompt)))
            .service(guarded("/sessions/{id}/interrupt").route(web::post().to(sessions::interrupt)))
            .service(guarded("/sessions/{id}/resume").route(web::post().to(sessions::resume)))
            .service(guarded("/sessions/{id}/retry").route(web::post().to(sessions::retry)))
            .service(guarded("/sessions/{id}/steps").route(web::get().to(sessions::steps)))
            .service(guarded("/sessions/{id}/messages").route(get_or_head().to(sessions::messages)))
            .service(
                guarded("/sessions/{id}/messages/{message_id}")
                    .route(get_or_head().to(sessions::message)),
            )
            .service(guarded("/sessions/{id}/events").route(get_or_head().to(events::events)))
            .service(guarded("/sessions/{id}/events/ticket").route(web::post().to(events::ticket)))
            .service(guarded("/events").route(get_or_head().to(events::feed)))
            .service(guarded("/events/ticket").route(web::post().to(events::feed_ticket)));
        if serve_console {
            cfg.service(open("/console").route(get_or_head().to(console::page)));
        }
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
