//! `GET /sessions/{id}/events`: a session's event log as Server-Sent Events, replayed from a
//! sequence number and then followed live, with its live-only events (frames without `id:`)
//! interleaved (see the module docs of [`super`] for the format); `GET /events`: every
//! session's committed events live (the console's feed); and their tickets.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::time::{Instant, Sleep};

use actix_web::http::{header, Method, StatusCode, Version};
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::{extract, ticket, State};
use crate::runtime::{EventStream, RecvError};
use crate::service::{SessionStream, StreamItem};

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

/// One event as an SSE frame: `id:` its seq (a durable event only: a live-only event has
/// none, so `Last-Event-ID` stays a durable seq), `event:` its wire name, `data:` the whole
/// [`crate::EventRecord`] (or [`crate::LiveEvent`]) as one line of JSON.
fn encode(item: &StreamItem) -> Bytes {
    // Runner-defined names are free text; keep the frame a frame.
    let name: String = item
        .kind()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let data = match item {
        StreamItem::Event(event) => serde_json::to_string(&**event),
        StreamItem::Live(event) => serde_json::to_string(&**event),
    };
    let data = data.unwrap_or_else(|e| {
        json!({ "error": { "type": "internal", "message": e.to_string() } }).to_string()
    });
    Bytes::from(match item.seq() {
        Some(seq) => format!("id: {seq}\nevent: {name}\ndata: {data}\n\n"),
        None => format!("event: {name}\ndata: {data}\n\n"),
    })
}

/// Frames this worker thread encoded last, with their events.
const RECENT_FRAMES: usize = 8;

thread_local! {
    /// An event followed live (committed or live-only) reaches every stream of its session as
    /// the same `Arc`: each worker encodes it once, not once per stream (a hot session may
    /// have thousands).
    static FRAMES: RefCell<VecDeque<(StreamItem, Bytes)>> =
        const { RefCell::new(VecDeque::new()) };
}

/// [`encode`], once per event and worker thread.
fn frame(item: &StreamItem) -> Bytes {
    FRAMES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, bytes)) = cache.iter().find(|(seen, _)| seen.same(item)) {
            return bytes.clone();
        }
        let bytes = encode(item);
        if cache.len() == RECENT_FRAMES {
            cache.pop_front();
        }
        cache.push_back((item.clone(), bytes.clone()));
        bytes
    })
}

/// The frame of an error that ends a stream: `event: stream.error` (not `error`, which a
/// browser's `EventSource` reserves for its own connection errors).
fn error_frame(kind: &str, message: &str) -> Bytes {
    let error = json!({ "error": { "type": kind, "message": message } });
    Bytes::from(format!("event: stream.error\ndata: {error}\n\n"))
}

/// The comment a quiet stream sends.
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// When a quiet stream sends its keep-alive comment: one timer per stream, set when the stream
/// opens and moved only when it fires (a frame only notes the time it went out), so a busy
/// stream never touches the timer wheel.
struct KeepAlive {
    every: Duration,
    timer: Pin<Box<Sleep>>,
    last_sent: Instant,
}

impl KeepAlive {
    fn new(every: Duration) -> Self {
        let now = Instant::now();
        Self {
            every,
            timer: Box::pin(tokio::time::sleep_until(now + every)),
            last_sent: now,
        }
    }

    /// A frame went out.
    fn sent(&mut self) {
        self.last_sent = Instant::now();
    }

    /// Ready when the stream has been quiet for `every`: send a comment (counted as sent).
    fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last_sent + self.every;
            let now = Instant::now();
            if now >= due {
                self.last_sent = now;
                self.timer.as_mut().reset(now + self.every);
                return Poll::Ready(());
            }
            // Frames went out meanwhile: wait until the stream has been quiet long enough.
            self.timer.as_mut().reset(due);
        }
    }
}

/// The body of `GET /sessions/{id}/events`: the hello, then a frame per item of the session's
/// stream, with keep-alive comments while it is quiet. The connection polls it for as many
/// frames as are ready before it writes, so what a stream has queued goes out in one write.
struct EventBody {
    /// The opening comment, until sent.
    hello: Option<Bytes>,
    /// `None` once the stream is over.
    events: Option<SessionStream>,
    keep_alive: KeepAlive,
}

impl Stream for EventBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(hello) = this.hello.take() {
            return Poll::Ready(Some(Ok(hello)));
        }
        let Some(events) = this.events.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(events).poll_next(cx) {
            Poll::Ready(Some(Ok(item))) => {
                this.keep_alive.sent();
                return Poll::Ready(Some(Ok(frame(&item))));
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(events) = this.events.take() {
                    log::warn!("events of {}: {e}", events.session_id());
                }
                return Poll::Ready(Some(Ok(error_frame("store", &e.to_string()))));
            }
            Poll::Ready(None) => {
                this.events = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        this.keep_alive
            .poll_due(cx)
            .map(|()| Some(Ok(Bytes::from_static(KEEP_ALIVE))))
    }
}

/// An event-stream response's head. Streams need HTTP/1.1 (chunked transfer): an HTTP/1.0
/// client is refused with 505 rather than sent a framing it cannot read.
fn stream_head(req: &HttpRequest) -> Result<HttpResponseBuilder, ApiError> {
    if req.version() < Version::HTTP_11 {
        return Err(ApiError::new(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "http_version_not_supported",
            "event streams need HTTP/1.1 or later",
        ));
    }
    let mut head = HttpResponse::Ok();
    head.insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"));
    Ok(head)
}

/// `GET /sessions/{id}/events?after=`: the SSE stream. `after` (or `Last-Event-ID`) past the
/// end of the log is 400: such a client kept an id from another database (or invented it),
/// and would otherwise wait for events that may never come.
pub(super) async fn events(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let after = start_after(&req)?;
    let mut head = stream_head(&req)?;
    let sessions = state.runtime.sessions();
    if let Some(after) = after {
        let last = sessions.last_seq(&id).await?;
        if after > last {
            return Err(ApiError::invalid(format!(
                "seq {after} is past the end of the event log of session {id} (its last event \
                 is seq {last}): was it taken from another database?"
            )));
        }
    }
    if req.method() == Method::HEAD {
        sessions.get(&id).await?;
        return Ok(head.finish());
    }
    let events = sessions.stream(&id, after).await?;
    let hello = format!(
        "retry: 1000\n: events of session {} after {}\n\n",
        events.session_id(),
        events
            .last_seq()
            .map_or_else(|| "the start".to_owned(), |seq| format!("seq {seq}"))
    );
    let body = EventBody {
        hello: Some(Bytes::from(hello)),
        events: Some(events),
        keep_alive: KeepAlive::new(state.options.keep_alive),
    };
    Ok(head.streaming(body))
}

/// `POST /sessions/{id}/events/ticket`: a short-lived ticket for this session's stream.
pub(super) async fn ticket(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    state.runtime.sessions().get(&id).await?;
    Ok(ticket_response(id.as_str(), &state))
}

/// `POST /events/ticket`: a short-lived ticket for the all-sessions feed.
pub(super) async fn feed_ticket(state: web::Data<State>) -> HttpResponse {
    ticket_response(ticket::ALL_SESSIONS, &state)
}

fn ticket_response(scope: &str, state: &State) -> HttpResponse {
    let ttl = state.options.ticket_ttl;
    let (ticket, expires) = ticket::issue(scope, ttl);
    HttpResponse::Ok().json(json!({
        "ticket": ticket,
        "expires_at": expires,
        "expires_in_ms": ttl.as_millis() as u64,
    }))
}

/// One step of the all-sessions feed.
async fn feed_step(
    mut events: EventStream,
    keep_alive: Duration,
) -> Option<(Result<Bytes, Infallible>, EventStream)> {
    match actix_rt::time::timeout(keep_alive, events.recv()).await {
        Err(_quiet) => Some((Ok(Bytes::from_static(KEEP_ALIVE)), events)),
        Ok(Ok(event)) => {
            let name: String = event
                .kind
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let data = serde_json::to_string(&*event).unwrap_or_default();
            let frame = format!("event: {name}\ndata: {data}\n\n");
            Some((Ok(Bytes::from(frame)), events))
        }
        Ok(Err(RecvError::Lagged { missed })) => {
            let frame = format!("event: stream.lagged\ndata: {{\"missed\":{missed}}}\n\n");
            Some((Ok(Bytes::from(frame)), events))
        }
        Ok(Err(_closed)) => None,
    }
}

/// `GET /events`: every session's committed events as they commit (no replay, no `id:`: seqs
/// are per session; live-only events are not in it). A `stream.lagged` frame says events were missed (re-read what you
/// show). Meant for dashboards such as the console; a client of one session reads
/// `GET /sessions/{id}/events`, which costs nothing while its session is silent.
pub(super) async fn feed(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let mut head = stream_head(&req)?;
    if req.method() == Method::HEAD {
        return Ok(head.finish());
    }
    let events = state.runtime.subscribe();
    let keep_alive = state.options.keep_alive;
    let hello = futures::stream::once(async {
        Ok::<_, Infallible>(Bytes::from_static(
            b"retry: 1000\n: every session's events, live\n\n",
        ))
    });
    let live = futures::stream::unfold(events, move |events| feed_step(events, keep_alive));
    Ok(head.streaming(futures::StreamExt::chain(hello, live)))
}
