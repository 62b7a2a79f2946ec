//! `GET /console`: the operator console, one self-contained page (HTML, CSS and JavaScript,
//! embedded in the binary; no build step, nothing fetched from elsewhere).
//!
//! The page holds no data and is served without the token; everything it shows it reads
//! through the public routes, with the token the operator types in (kept in the tab's
//! `sessionStorage`) and event-stream tickets for its `EventSource`s.

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
