//! `GET /sessions/{id}/events`: a session's event log as Server-Sent Events, replayed from a
//! sequence number and then followed live (see the module docs of [`super`] for the format).

use std::convert::Infallible;
use std::time::Duration;

use actix_web::http::header;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::{extract, State};
use crate::event::EventRecord;
use crate::service::SessionEvents;

/// The request header a reconnecting `EventSource` sends.
const LAST_EVENT_ID: &str = "Last-Event-ID";

/// `GET /sessions/{id}/events` query.
#[derive(Debug, Deserialize)]
struct EventsParams {
    after: Option<u64>,
}

/// Where a stream starts: `Last-Event-ID` (a reconnect) when present and not empty, else
/// `after`, else the beginning of the log.
fn start_after(req: &HttpRequest) -> Result<Option<u64>, ApiError> {
    let params: EventsParams = extract::query(req)?;
    let Some(header) = req.headers().get(LAST_EVENT_ID) else {
        return Ok(params.after);
    };
    let value = header
        .to_str()
        .map_err(|_| ApiError::invalid("Last-Event-ID must be a sequence number"))?
        .trim();
    if value.is_empty() {
        return Ok(params.after);
    }
    value.parse::<u64>().map(Some).map_err(|_| {
        ApiError::invalid(format!(
            "Last-Event-ID must be a sequence number, got {value:?}"
        ))
    })
}

/// One event as an SSE frame: `id:` its seq, `event:` its wire name, `data:` the whole
/// [`EventRecord`] as one line of JSON.
fn frame(event: &EventRecord) -> Bytes {
    // Runner-defined names are free text; keep the frame a frame.
    let name: String = event
        .kind
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let data = serde_json::to_string(event).unwrap_or_else(|e| {
        json!({ "error": { "type": "internal", "message": e.to_string() } }).to_string()
    });
    Bytes::from(format!(
        "id: {}\nevent: {name}\ndata: {data}\n\n",
        event.seq
    ))
}

/// What the response body does next.
enum Feed {
    /// Say hello (the retry hint), then follow.
    Start(SessionEvents),
    /// Follow the session's events.
    Follow(SessionEvents),
    /// The stream is over.
    Done,
}

async fn step(feed: Feed, keep_alive: Duration) -> Option<(Result<Bytes, Infallible>, Feed)> {
    let mut events = match feed {
        Feed::Done => return None,
        Feed::Start(events) => {
            let hello = format!(
                "retry: 1000\n: events of session {} after {}\n\n",
                events.session_id(),
                events
                    .last_seq()
                    .map_or_else(|| "the start".to_owned(), |seq| format!("seq {seq}"))
            );
            return Some((Ok(Bytes::from(hello)), Feed::Follow(events)));
        }
        Feed::Follow(events) => events,
    };
    // `SessionEvents::next` is cancel-safe: a keep-alive timeout loses nothing.
    match actix_rt::time::timeout(keep_alive, events.next()).await {
        Err(_quiet) => Some((
            Ok(Bytes::from_static(b": keep-alive\n\n")),
            Feed::Follow(events),
        )),
        Ok(Some(Ok(event))) => Some((Ok(frame(&event)), Feed::Follow(events))),
        Ok(Some(Err(e))) => {
            log::warn!("events of {}: {e}", events.session_id());
            let error = json!({ "error": { "type": "store", "message": e.to_string() } });
            Some((
                Ok(Bytes::from(format!("event: error\ndata: {error}\n\n"))),
                Feed::Done,
            ))
        }
        Ok(None) => None,
    }
}

/// `GET /sessions/{id}/events?after=`: the SSE stream.
pub(super) async fn events(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let after = start_after(&req)?;
    let events = state.runtime.sessions().events(&id, after).await?;
    let keep_alive = state.options.keep_alive;
    let body = futures::stream::unfold(Feed::Start(events), move |feed| step(feed, keep_alive));
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}
