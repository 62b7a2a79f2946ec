//! `GET /console`: the operator console, one self-contained page (HTML, CSS and JavaScript,
//! embedded in the binary; no build step, nothing fetched from elsewhere).
//!
//! The page holds no data and is served without the token; everything it shows it reads
//! through the public routes, with the token the operator types in (kept in the tab's
//! `sessionStorage`) and event-stream tickets for its `EventSource`s.
//!
//! A session's page shows its current (or last) turn: its id and attempt, and each durable
//! step with its status (running, completed, failed, or ambiguous: started, and the attempt
//! that started it is over without its outcome), attempts, key and outcome. The page folds
//! them from the session's events as the runtime folds its ledger. A retry button, shown when
//! the last turn failed, calls `POST /sessions/{id}/retry`.

use actix_web::http::header;
use actix_web::HttpResponse;

/// The page.
const PAGE: &str = include_str!("console.html");

/// `GET /console`.
pub(super) async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .body(PAGE)
}
