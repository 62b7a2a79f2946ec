//! Talking to a node over HTTP: one request at a time with `reqwest`'s blocking client, and a
//! Server-Sent Events reader (`eventsource-stream` over a `reqwest` byte stream, driven by a
//! runtime of its own) whose every read is bounded by a deadline.

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::Value;

/// The timeout of a plain request (an admission or an interrupt answers in milliseconds), and
/// of an event stream's response head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The blocking client every request goes through: no proxy (the nodes are on this machine),
/// and no idle connection kept (each request has a connection of its own, which a killed node
/// breaks; none is reused after a node went away).
fn client() -> &'static reqwest::blocking::Client {
    static CLIENT: OnceLock<reqwest::blocking::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client")
    })
}

/// `e` as an `io::Error` (`TimedOut` when it is a timeout).
fn io_error(e: reqwest::Error) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, e)
}

/// One request, on a connection of its own: the status and the body as JSON (`Value::Null`
/// when empty, a string when not JSON).
///
/// # Errors
/// When the node cannot be reached, the connection breaks (a killed node) or no answer comes
/// within 15 s (a paused one).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> io::Result<(u16, Value)> {
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let response = client()
        .request(method, format!("http://{addr}{path}"))
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .map_err(io_error)?;
    let status = response.status().as_u16();
    let text = response.text().map_err(io_error)?;
    let value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Ok((status, value))
}

/// [`request`] that must reach the node and answer `expect`.
pub fn call(addr: &str, method: &str, path: &str, body: Option<&Value>, expect: u16) -> Value {
    match request(addr, method, path, body) {
        Ok((status, value)) if status == expect => value,
        other => panic!("{method} {path} on {addr}: expected {expect}, got {other:?}"),
    }
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// `id:` (the event's seq).
    pub id: u64,
    /// `event:` (its wire name).
    pub kind: String,
    /// `data:` (the whole `EventRecord`).
    pub data: Value,
}

/// The parsed frames of a response body.
type Frames = Pin<
    Box<dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>>,
>;

/// A `GET /sessions/{id}/events` stream. Comments and retry hints are skipped (they carry no
/// data); every frame with data must be a durable event (an `id:` of its own).
pub struct Sse {
    /// Declared before the runtime that drives its connection.
    frames: Frames,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Sse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sse").finish_non_exhaustive()
    }
}

impl Sse {
    /// Opens the stream of `session` on `addr`, starting after `after` (sent as `?after=`), or
    /// after `last_event_id` (sent as the `Last-Event-ID` header).
    ///
    /// # Errors
    /// When the node cannot be reached, answers anything but 200, or sends no response head
    /// within 15 s.
    pub fn open(
        addr: &str,
        session: &str,
        after: Option<u64>,
        last_event_id: Option<u64>,
    ) -> io::Result<Sse> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let query = after.map(|a| format!("?after={a}")).unwrap_or_default();
        let url = format!("http://{addr}/sessions/{session}/events{query}");
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(io_error)?;
        let mut get = client.get(url).header(ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            get = get.header("Last-Event-ID", id.to_string());
        }
        let response = runtime
            .block_on(async { tokio::time::timeout(REQUEST_TIMEOUT, get.send()).await })
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no response head"))?
            .map_err(io_error)?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(io::Error::other(format!(
                "stream answered {}",
                response.status()
            )));
        }
        Ok(Sse {
            frames: Box::pin(response.bytes_stream().eventsource()),
            runtime,
        })
    }

    /// The next event, or `None` when none came before `deadline`.
    ///
    /// # Errors
    /// When the stream breaks or ends, or a frame is malformed.
    pub fn next(&mut self, deadline: Instant) -> io::Result<Option<SseEvent>> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let next = self.frames.next();
        let frame = match self
            .runtime
            .block_on(async { tokio::time::timeout_at(deadline, next).await })
        {
            Err(_) => return Ok(None),
            Ok(None) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the stream ended",
                ))
            }
            Ok(Some(Err(e))) => return Err(io::Error::other(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let data: Value = serde_json::from_str(&frame.data).map_err(|e| bad(e.to_string()))?;
        // The parser keeps the last `id:` for a frame without one (the standard's "last event
        // ID"); a frame of its own id is a durable event, whose data has its `seq`.
        if data.get("seq").is_none() {
            return Err(bad(format!("a frame without id: {frame:?}")));
        }
        let id = frame
            .id
            .parse()
            .map_err(|_| bad(format!("a frame without id: {frame:?}")))?;
        Ok(Some(SseEvent {
            id,
            kind: frame.event,
            data,
        }))
    }

    /// Reads events until `done` holds for the events read so far or `timeout` passes.
    ///
    /// # Panics
    /// When the stream breaks.
    pub fn read_until(
        &mut self,
        seen: &mut Vec<SseEvent>,
        timeout: Duration,
        mut done: impl FnMut(&[SseEvent]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        while !done(seen) {
            match self.next(deadline) {
                Ok(Some(event)) => seen.push(event),
                Ok(None) => return false,
                Err(e) => panic!("event stream broke after {} events: {e}", seen.len()),
            }
        }
        true
    }
}
