//! The HTTP/SSE adapter against real listeners on `127.0.0.1:0` with a real client (awc): every
//! route and status code, SSE replay with `after` and `Last-Event-ID`, the token guard, the body
//! limit, 503 after shutdown; and the `server` example as a child process, killed with SIGKILL
//! mid-reply (and stopped with SIGINT) and restarted on the same database.
#![cfg(feature = "http")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::http::{Method, StatusCode};
use actix_web::web::Bytes;
use actix_web::{web, App, HttpServer};
use durable_sessions::http::{self, HttpOptions};
use durable_sessions::{kind, RESTART_NOTICE_TEXT};
use durable_sessions::{EventRecord, RunError, Runner, Runtime, Turn};
use futures::future::LocalBoxFuture;
use futures::stream::LocalBoxStream;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use tempfile::TempDir;

use common::{next_commit, server_binary};

/// How long any single wait may take before the test fails (generous for a loaded machine).
const WAIT: Duration = Duration::from_secs(30);

/// Promotes every pending prompt and answers each with an `assistant` message; sessions whose id
/// starts with `slow` promote, then never finish (until interrupted); sessions whose id starts
/// with `live` publish three live-only `agent.delta` events (`{"i"}`) before each answer;
/// sessions whose id starts with `flaky` fail the first attempt of each turn.
struct TestAgent;

impl Runner for TestAgent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        async move {
            let promoted = turn.take_inputs().await?;
            if turn.session_id().as_str().starts_with("flaky") && turn.attempt() == 1 {
                return Err(RunError::Other("429 from the provider".into()));
            }
            if turn.session_id().as_str().starts_with("slow") {
                futures::future::pending::<()>().await;
            }
            if turn.session_id().as_str().starts_with("live") {
                for i in 0..3 * promoted.len() {
                    turn.publish_live("agent.delta", json!({ "i": i }))?;
                }
            }
            for admission in promoted {
                let reply = json!({ "reply_to": admission.id, "text": "ok" });
                turn.append_message("assistant", reply).await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// A client of one server.
struct Api {
    client: awc::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(base: String) -> Self {
        let client = awc::Client::builder().timeout(WAIT).finish();
        Self {
            client,
            base,
            token: None,
        }
    }

    fn request(&self, method: Method, path: &str) -> awc::ClientRequest {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.insert_header(("Authorization", format!("Bearer {token}"))),
            None => request,
        }
    }

    /// Sends `body` (raw) and returns the status and the JSON answer (`null` when empty).
    async fn call(&self, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
        let mut request = self.request(method.clone(), path);
        if !body.is_empty() {
            request = request.insert_header(("Content-Type", "application/json"));
        }
        let mut response = request
            .send_body(body.to_owned())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let bytes = response
            .body()
            .limit(16 * 1024 * 1024)
            .await
            .expect("response body");
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{method} {path}: not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (response.status(), value)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, "").await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, &body.to_string()).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, "").await
    }

    /// Opens an event stream, sending `Last-Event-ID` when given.
    async fn events(&self, path: &str, last_event_id: Option<&str>) -> Sse {
        let mut request = self.request(Method::GET, path);
        if let Some(id) = last_event_id {
            request = request.insert_header(("Last-Event-ID", id));
        }
        let response = request.send().await.expect("events request");
        assert_eq!(response.status(), StatusCode::OK, "GET {path}");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(content_type, "text/event-stream");
        Sse {
            body: response.boxed_local(),
            buffer: String::new(),
        }
    }
}

/// One parsed SSE frame.
#[derive(Debug, Clone, Default)]
struct Frame {
    id: Option<u64>,
    event: Option<String>,
    data: Option<Value>,
    comments: Vec<String>,
}

/// A Server-Sent Events reader.
struct Sse {
    body: LocalBoxStream<'static, Result<Bytes, awc::error::PayloadError>>,
    buffer: String,
}

impl Sse {
    /// The next frame (comment-only frames included); panics after [`WAIT`] or at the end.
    async fn frame(&mut self) -> Frame {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame::default();
                for line in raw.lines() {
                    if let Some(comment) = line.strip_prefix(':') {
                        frame.comments.push(comment.trim().to_owned());
                    } else if let Some(id) = line.strip_prefix("id: ") {
                        frame.id = Some(id.parse().expect("numeric id"));
                    } else if let Some(event) = line.strip_prefix("event: ") {
                        frame.event = Some(event.to_owned());
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        frame.data = Some(serde_json::from_str(data).expect("JSON data"));
                    }
                }
                return frame;
            }
            let chunk = actix_rt::time::timeout(WAIT, self.body.next())
                .await
                .expect("timed out waiting for an SSE frame")
                .expect("the event stream ended")
                .expect("event stream chunk");
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// The next event frame (skipping comments), checked for consistency: `event` is the
    /// data's `type`; a durable event's `id` is its `seq`, and a live-only event's frame has
    /// neither.
    async fn event(&mut self) -> Frame {
        loop {
            let frame = self.frame().await;
            let Some(data) = &frame.data else {
                continue;
            };
            match frame.id {
                Some(id) => assert_eq!(data["seq"], json!(id), "id is the seq: {frame:?}"),
                None => assert!(data.get("seq").is_none(), "live-only: no seq: {frame:?}"),
            }
            if !is(&frame, "stream.error") {
                assert_eq!(
                    data["type"].as_str(),
                    frame.event.as_deref(),
                    "event is the type: {frame:?}"
                );
            }
            return frame;
        }
    }

    /// Reads the stream to its end and returns the event frames still sent; panics if it
    /// does not end within [`WAIT`].
    async fn rest(&mut self) -> Vec<Frame> {
        loop {
            match actix_rt::time::timeout(WAIT, self.body.next()).await {
                Err(_) => panic!("the event stream did not end"),
                Ok(None) => break,
                Ok(Some(chunk)) => {
                    let chunk = chunk.expect("event stream chunk");
                    self.buffer
                        .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
                }
            }
        }
        let mut frames = Vec::new();
        while self.buffer.contains("\n\n") {
            let frame = self.frame().await;
            if frame.id.is_some() {
                frames.push(frame);
            }
        }
        frames
    }

    /// Events until (and including) the first one `done` accepts.
    async fn until(&mut self, done: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.event().await;
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
    }
}

fn is(frame: &Frame, name: &str) -> bool {
    frame.event.as_deref() == Some(name)
}

fn ids(frames: &[Frame]) -> Vec<u64> {
    frames.iter().filter_map(|f| f.id).collect()
}

/// Asserts `ids` is `first, first + 1, …` with no gap and no duplicate.
fn assert_contiguous(ids: &[u64], first: u64) {
    let expected: Vec<u64> = (first..first + ids.len() as u64).collect();
    assert_eq!(
        ids,
        expected.as_slice(),
        "ids must be contiguous from {first}"
    );
}

/// A runtime and an HTTP server on `127.0.0.1:0` in this test's actix System.
struct Harness {
    api: Api,
    runtime: Runtime,
    server: ServerHandle,
    /// The runtime's SQLite file.
    db: std::path::PathBuf,
    _dir: TempDir,
}

impl Harness {
    async fn start(options: HttpOptions) -> Self {
        Self::start_with(options, |builder| builder).await
    }

    /// [`Harness::start`] with the runtime's builder adjusted by `configure`.
    async fn start_with(
        options: HttpOptions,
        configure: impl FnOnce(durable_sessions::RuntimeBuilder) -> durable_sessions::RuntimeBuilder,
    ) -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("http.db");
        let builder = Runtime::builder()
            .database(&db)
            .runner(TestAgent)
            .arbiters(2)
            .shutdown_grace(Duration::from_secs(2));
        let runtime = configure(builder).start().await.expect("runtime starts");
        let app_runtime = runtime.clone();
        let server = HttpServer::new(move || {
            App::new()
                .configure(http::configure(app_runtime.clone(), options.clone()))
                .default_service(web::to(http::not_found))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(1)
        .bind(("127.0.0.1", 0))
        .expect("bind");
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Self {
            api: Api::new(format!("http://{addr}")),
            runtime,
            server: handle,
            db,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.server.stop(false).await;
        self.runtime.shutdown().await;
    }

    /// Creates session `id` and asserts 201.
    async fn session(&self, id: &str) {
        let (status, body) = self.api.post("/sessions", json!({ "id": id })).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// Waits until the session's transcript has at least `n` messages and returns them (oldest
    /// first): read again each time the session commits an event.
    async fn transcript(&self, id: &str, n: usize) -> Vec<Value> {
        let mut events = self.runtime.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let page = messages(&self.api, id).await;
            if page.len() >= n {
                return page;
            }
            let theirs = |e: &EventRecord| e.session_id.as_str() == id;
            assert!(
                next_commit(&mut events, deadline, theirs).await,
                "timed out waiting for {n} messages in {id}: {page:?}"
            );
        }
    }
}

/// The session's transcript, oldest first.
async fn messages(api: &Api, id: &str) -> Vec<Value> {
    let (status, body) = api.get(&format!("/sessions/{id}/messages?order=asc")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.as_array().cloned().unwrap_or_default()
}

/// Waits until the transcript of a session of another process has at least `n` messages and
/// returns them (oldest first), reading it every 20 ms.
async fn transcript(api: &Api, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let page = messages(api, id).await;
        if page.len() >= n {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} messages in {id}: {page:?}"
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

fn error_type(body: &Value) -> &str {
    body["error"]["type"].as_str().unwrap_or("<none>")
}

#[actix_rt::test]
async fn creates_sessions_201_then_200_and_gets_them_or_404() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    let body = json!({ "id": "a", "title": "First", "directory": "/work" });
    let (status, created) = api.post("/sessions", body.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (&created["id"], &created["title"], &created["directory"]),
        (&json!("a"), &json!("First"), &json!("/work"))
    );
    let (status, again) = api
        .post("/sessions", json!({ "id": "a", "title": "ignored" }))
        .await;
    assert_eq!((status, &again), (StatusCode::OK, &created));
    let (status, generated) = api.call(Method::POST, "/sessions", "").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(generated["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("ses_")));
    assert!(generated["title"]
        .as_str()
        .is_some_and(|t| t.starts_with("New session - ")));
    let (status, child) = api
        .post("/sessions", json!({ "id": "a-child", "parent_id": "a" }))
        .await;
    assert_eq!(
        (status, &child["parent_id"]),
        (StatusCode::CREATED, &json!("a"))
    );

    let (status, got) = api.get("/sessions/a").await;
    assert_eq!((status, &got), (StatusCode::OK, &created));
    let (status, missing) = api.get("/sessions/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_type(&missing), "not_found");
    assert!(missing["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("nope")));
    let (status, orphan) = api
        .post("/sessions", json!({ "id": "b", "parent_id": "nope" }))
        .await;
    assert_eq!(
        (status, error_type(&orphan)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (status, body) = api.get("/no/such/route").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    // (DELETE is a route of its own now: `delete_is_200_404_or_409_…`.)
    let (status, body) = api.call(Method::PUT, "/sessions/a", "").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    let (status, body) = api.get("/healthz").await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "status": "ok" })));
    h.stop().await;
}

#[actix_rt::test]
async fn lists_sessions_with_filters_order_and_anchors() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    for (id, directory, title) in [
        ("s1", "/x", "alpha"),
        ("s2", "/x", "beta"),
        ("s3", "/x", "alphabet"),
        ("s4", "/y", "alpha"),
    ] {
        let body = json!({ "id": id, "directory": directory, "title": title });
        assert_eq!(api.post("/sessions", body).await.0, StatusCode::CREATED);
        // Distinct creation times keep the expected order obvious.
        actix_rt::time::sleep(Duration::from_millis(3)).await;
    }
    let ids_of = |body: &Value| -> Vec<String> {
        body.as_array()
            .expect("an array")
            .iter()
            .map(|s| s["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let (status, all) = api.get("/sessions?directory=/x&order=asc").await;
    assert_eq!(
        (status, ids_of(&all)),
        (StatusCode::OK, vec!["s1".into(), "s2".into(), "s3".into()])
    );
    let (_, newest) = api.get("/sessions?directory=/x").await;
    assert_eq!(ids_of(&newest), ["s3", "s2", "s1"]);
    let (_, found) = api.get("/sessions?search=alpha&order=asc").await;
    assert_eq!(ids_of(&found), ["s1", "s3", "s4"]);
    let (_, first) = api.get("/sessions?directory=/x&order=asc&limit=2").await;
    assert_eq!(ids_of(&first), ["s1", "s2"]);
    let last = &first[1];
    let next = format!(
        "/sessions?directory=/x&order=asc&limit=2&anchor_id={}&anchor_time={}&direction=next",
        last["id"].as_str().unwrap_or_default(),
        last["time_created"]
    );
    let (status, page) = api.get(&next).await;
    assert_eq!((status, ids_of(&page)), (StatusCode::OK, vec!["s3".into()]));
    let previous = next.replace("direction=next", "direction=previous");
    let (_, page) = api.get(&previous).await;
    assert_eq!(ids_of(&page), ["s1"]);

    for bad in [
        "/sessions?limit=abc",
        "/sessions?limit=0",
        "/sessions?limit=100000",
        "/sessions?order=sideways",
        "/sessions?anchor_id=s1",
        "/sessions?anchor_time=1&anchor_id=s1&direction=up",
        "/sessions?direction=next",
        "/sessions?parent_id=s1&top_level=true",
    ] {
        let (status, body) = api.get(bad).await;
        assert_eq!(
            (status, error_type(&body)),
            (StatusCode::BAD_REQUEST, "invalid_input"),
            "{bad}: {body}"
        );
    }
    h.stop().await;
}

#[actix_rt::test]
async fn rejects_malformed_json_and_invalid_input_with_400() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("s").await;
    for (path, body, expected) in [
        ("/sessions", r#"{"id": "#, "malformed_json"),
        ("/sessions", "not json", "malformed_json"),
        ("/sessions", r#"{"id": ""}"#, "invalid_input"),
        ("/sessions", r#"{"id": "a\u0001b"}"#, "invalid_input"),
        ("/sessions", r#"{"idd": "x"}"#, "invalid_input"),
        ("/sessions", r#"{"title": 5}"#, "invalid_input"),
        ("/sessions/s/prompt", r#"{"text": "hi""#, "malformed_json"),
        ("/sessions/s/prompt", "{}", "invalid_input"),
        (
            "/sessions/s/prompt",
            r#"{"text": "a", "prompt": "b"}"#,
            "invalid_input",
        ),
        ("/sessions/s/prompt", r#"{"prompt": 5}"#, "invalid_input"),
        (
            "/sessions/s/prompt",
            r#"{"text": "hi", "delivery": "later"}"#,
            "invalid_input",
        ),
        (
            "/sessions/s/prompt",
            r#"{"text": "hi", "id": ""}"#,
            "invalid_input",
        ),
    ] {
        let (status, answer) = api.call(Method::POST, path, body).await;
        assert_eq!(
            (status, error_type(&answer)),
            (StatusCode::BAD_REQUEST, expected),
            "POST {path} {body}: {answer}"
        );
    }
    let (status, body) = api.get("/sessions/a%01b").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::BAD_REQUEST, "invalid_input")
    );
    let (_, messages) = api.get("/sessions/s/messages").await;
    assert_eq!(messages, json!([]), "nothing was admitted");
    h.stop().await;
}

#[actix_rt::test]
async fn prompts_are_accepted_idempotently_and_a_conflicting_reuse_is_409() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("s").await;
    h.session("t").await;
    let (status, admission) = api
        .post("/sessions/s/prompt", json!({ "id": "m1", "text": "hello" }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{admission}");
    assert_eq!(
        (
            &admission["id"],
            &admission["session_id"],
            &admission["prompt"],
            &admission["delivery"]
        ),
        (
            &json!("m1"),
            &json!("s"),
            &json!({ "text": "hello" }),
            &json!("steer")
        )
    );
    let (status, retry) = api
        .post("/sessions/s/prompt", json!({ "id": "m1", "text": "hello" }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(retry["admitted_seq"], admission["admitted_seq"]);
    for conflicting in [
        json!({ "id": "m1", "text": "other" }),
        json!({ "id": "m1", "text": "hello", "delivery": "queue" }),
    ] {
        let (status, body) = api.post("/sessions/s/prompt", conflicting).await;
        assert_eq!(
            (status, error_type(&body)),
            (StatusCode::CONFLICT, "conflict")
        );
    }
    let (status, body) = api
        .post("/sessions/t/prompt", json!({ "id": "m1", "text": "hello" }))
        .await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::CONFLICT, "conflict")
    );
    let (status, body) = api
        .post("/sessions/nope/prompt", json!({ "text": "hi" }))
        .await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );

    // The turn promotes the prompt and answers it; the transcript pages by cursor.
    let transcript = h.transcript("s", 2).await;
    assert_eq!(
        (&transcript[0]["id"], &transcript[0]["type"]),
        (&json!("m1"), &json!("user"))
    );
    assert_eq!(transcript[1]["type"], json!("assistant"));
    assert_eq!(transcript[1]["data"]["reply_to"], json!("m1"));
    let (status, newest) = api.get("/sessions/s/messages?limit=1").await;
    assert_eq!((status, &newest[0]), (StatusCode::OK, &transcript[1]));
    let (_, before) = api
        .get(&format!(
            "/sessions/s/messages?limit=1&cursor={}",
            transcript[1]["id"].as_str().unwrap_or_default()
        ))
        .await;
    assert_eq!(before, json!([transcript[0]]));
    let (status, one) = api.get("/sessions/s/messages/m1").await;
    assert_eq!((status, &one), (StatusCode::OK, &transcript[0]));
    let (status, body) = api.get("/sessions/t/messages/m1").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (status, body) = api.get("/sessions/nope/messages").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    for bad in ["?limit=0", "?order=up", "?direction=next"] {
        let (status, _) = api.get(&format!("/sessions/s/messages{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // A queued prompt given as raw JSON, admitted without waking, then resumed explicitly.
    let (status, queued) = api
        .post(
            "/sessions/t/prompt",
            json!({ "prompt": { "text": "later", "n": 1 }, "delivery": "queue", "resume": false }),
        )
        .await;
    assert_eq!(
        (status, &queued["delivery"]),
        (StatusCode::ACCEPTED, &json!("queue"))
    );
    assert_eq!(queued["prompt"], json!({ "text": "later", "n": 1 }));
    let (status, terminal) = api.post("/sessions/t/resume", json!(null)).await;
    assert_eq!(
        (status, terminal),
        (StatusCode::OK, json!({ "type": "succeeded" }))
    );
    assert_eq!(h.transcript("t", 2).await.len(), 2);
    h.stop().await;
}

#[actix_rt::test]
async fn interrupt_resume_and_stats_report_turns_and_claims() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("slow").await;
    let (status, _) = api
        .post("/sessions/slow/prompt", json!({ "text": "hang" }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    h.transcript("slow", 1).await; // promoted: the turn is running
    let (status, stats) = api.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&stats["claimed"], &stats["active_turns"]),
        (&json!(1), &json!(1))
    );
    assert!(stats["oldest_claim_age_ms"].is_u64(), "{stats}");
    assert!(
        stats["transactions_committed"].as_u64() >= Some(4),
        "{stats}"
    );
    assert!(stats["largest_batch"].as_u64() >= Some(1), "{stats}");
    assert!(stats["sessions_live"].as_u64() >= Some(1), "{stats}");

    let (status, body) = api.post("/sessions/slow/interrupt", json!(null)).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({ "interrupted": true }))
    );
    let (status, body) = api.post("/sessions/slow/interrupt", json!(null)).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({ "interrupted": false }))
    );
    let (_, stats) = api.get("/stats").await;
    assert_eq!(
        (&stats["claimed"], &stats["oldest_claim_age_ms"]),
        (&json!(0), &json!(null))
    );
    let (status, body) = api.post("/sessions/nope/interrupt", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );

    // An explicit resume while a turn hangs is interrupted by a concurrent interrupt.
    let mut events = h.runtime.subscribe();
    let resume = actix_rt::spawn({
        let api = Api::new(h.api.base.clone());
        async move { api.post("/sessions/slow/resume", json!(null)).await }
    });
    // The turn is active before it commits its claim (`session.execution.started`).
    let deadline = tokio::time::Instant::now() + WAIT;
    while api.get("/stats").await.1["active_turns"] != json!(1) {
        let slow = |e: &EventRecord| e.session_id.as_str() == "slow";
        assert!(
            next_commit(&mut events, deadline, slow).await,
            "timed out waiting for the resumed turn"
        );
    }
    let (_, body) = api.post("/sessions/slow/interrupt", json!(null)).await;
    assert_eq!(body, json!({ "interrupted": true }));
    let (status, terminal) = resume.await.expect("resume task");
    assert_eq!(
        (status, terminal),
        (
            StatusCode::OK,
            json!({ "type": "interrupted", "reason": "user" })
        )
    );
    let (status, body) = api.post("/sessions/nope/resume", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    h.stop().await;
}

/// `POST /retry` runs the next attempt of a failed turn (200, how it ended) and is 409
/// `not_retryable` when the last turn did not fail, 404 for an unknown session.
#[actix_rt::test]
async fn retry_is_200_after_a_failed_turn_and_409_otherwise() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("flaky").await;
    let (status, body) = api.post("/sessions/flaky/retry", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::CONFLICT, "not_retryable"),
        "{body}"
    );
    assert!(body.to_string().contains("no turn has run"), "{body}");
    let (status, terminal) = api.post("/sessions/flaky/resume", json!(null)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(terminal["type"], json!("failed"), "{terminal}");
    let (status, terminal) = api.post("/sessions/flaky/retry", json!(null)).await;
    assert_eq!(
        (status, terminal),
        (StatusCode::OK, json!({ "type": "succeeded" }))
    );
    let (status, body) = api.post("/sessions/flaky/retry", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::CONFLICT, "not_retryable")
    );
    assert!(body.to_string().contains("succeeded"), "{body}");
    let (status, steps) = api.get("/sessions/flaky/steps").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&steps["attempt"], &steps["open"], &steps["terminal"]),
        (&json!(2), &json!(false), &json!({ "type": "succeeded" })),
        "{steps}"
    );
    assert_eq!(steps["steps"], json!([]), "the test agent runs no step");
    let (status, _) = api.get("/sessions/nope/steps").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = api.post("/sessions/nope/retry", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    h.stop().await;
}

#[actix_rt::test]
async fn bodies_over_the_limit_are_413() {
    let h = Harness::start(HttpOptions::new().max_body_bytes(1024)).await;
    let api = &h.api;
    h.session("s").await;
    let big = "x".repeat(4096);
    let (status, body) = api.post("/sessions", json!({ "title": big })).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    let (status, body) = api.post("/sessions/s/prompt", json!({ "text": big })).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, _) = api
        .post("/sessions/s/prompt", json!({ "text": "small" }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, sessions) = api.get("/sessions").await;
    assert_eq!(
        sessions.as_array().map(Vec::len),
        Some(1),
        "nothing else was created"
    );
    h.stop().await;
}

#[actix_rt::test]
async fn a_token_guards_every_route_but_healthz() {
    let h = Harness::start(HttpOptions::new().token(Some("s3cret".into()))).await;
    let mut api = Api::new(h.api.base.clone());
    for (method, path) in [
        (Method::GET, "/sessions"),
        (Method::POST, "/sessions"),
        (Method::GET, "/sessions/s"),
        (Method::POST, "/sessions/s/prompt"),
        (Method::POST, "/sessions/s/interrupt"),
        (Method::POST, "/sessions/s/resume"),
        (Method::POST, "/sessions/s/retry"),
        (Method::GET, "/sessions/s/steps"),
        (Method::GET, "/sessions/s/messages"),
        (Method::GET, "/sessions/s/messages/m"),
        (Method::GET, "/sessions/s/events"),
        (Method::GET, "/stats"),
    ] {
        for token in [None, Some("wrong"), Some("")] {
            api.token = token.map(str::to_owned);
            let (status, body) = api.call(method.clone(), path, "{}").await;
            assert_eq!(
                (status, error_type(&body)),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{method} {path} with {token:?}"
            );
        }
    }
    api.token = None;
    assert_eq!(api.get("/healthz").await.0, StatusCode::OK);
    api.token = Some("s3cret".into());
    assert_eq!(
        api.post("/sessions", json!({ "id": "s" })).await.0,
        StatusCode::CREATED
    );
    assert_eq!(api.get("/sessions/s").await.0, StatusCode::OK);
    assert_eq!(api.get("/stats").await.0, StatusCode::OK);
    let mut events = api.events("/sessions/s/events", None).await;
    assert!(is(&events.event().await, kind::CREATED));
    h.stop().await;
}

#[actix_rt::test]
async fn sse_replays_after_a_seq_then_follows_live() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("s").await;
    api.post("/sessions/s/prompt", json!({ "text": "one" }))
        .await;
    let first = api
        .events("/sessions/s/events", None)
        .await
        .until(|f| is(f, kind::EXECUTION_SUCCEEDED))
        .await;
    assert_contiguous(&ids(&first), 0);
    assert!(is(&first[0], kind::CREATED));
    let last = first.last().and_then(|f| f.id).unwrap_or_default();

    let mut stream = api.events("/sessions/s/events?after=2", None).await;
    let replayed = stream.until(|f| f.id == Some(last)).await;
    assert_contiguous(&ids(&replayed), 3);
    assert_eq!(replayed[0].data, first[3].data, "replay is the stored log");
    // Live: a second prompt's events follow without a gap.
    api.post("/sessions/s/prompt", json!({ "text": "two" }))
        .await;
    let live = stream.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    assert_contiguous(&ids(&live), last + 1);
    assert!(live.iter().any(|f| is(f, kind::PROMPT_ADMITTED)));
    assert!(live.iter().any(|f| is(f, kind::MESSAGE_APPENDED)));

    for (path, last_event_id) in [
        ("/sessions/s/events?after=x", None),
        ("/sessions/s/events?after=-1", None),
        ("/sessions/s/events", Some("x")),
        ("/sessions/s/events", Some("-3")),
    ] {
        let mut request = api.request(Method::GET, path);
        if let Some(id) = last_event_id {
            request = request.insert_header(("Last-Event-ID", id));
        }
        let mut response = request.send().await.expect("request");
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(
            (response.status(), error_type(&body)),
            (StatusCode::BAD_REQUEST, "invalid_input"),
            "{path} {last_event_id:?}"
        );
    }
    let (status, body) = api.get("/sessions/nope/events").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    h.stop().await;
}

#[actix_rt::test]
async fn sse_reconnect_with_last_event_id_resumes_without_gap_or_duplicate() {
    let h = Harness::start(HttpOptions::new().keep_alive(Duration::from_millis(100))).await;
    let api = &h.api;
    h.session("s").await;
    for text in ["one", "two", "three"] {
        api.post(
            "/sessions/s/prompt",
            json!({ "text": text, "resume": false }),
        )
        .await;
    }
    // Read the first two events (of 0..=3), then drop the connection mid-log.
    let mut stream = api.events("/sessions/s/events", None).await;
    let mut seen = vec![stream.event().await, stream.event().await];
    drop(stream);
    assert_eq!(ids(&seen), [0, 1]);
    // Reconnect as an EventSource would: the original URL (`after=0`) plus Last-Event-ID,
    // which wins.
    let mut stream = api.events("/sessions/s/events?after=0", Some("1")).await;
    let hello = stream.frame().await;
    assert!(
        hello.comments.iter().any(|c| c.contains("after seq 1")),
        "{hello:?}"
    );
    seen.push(stream.event().await);
    seen.push(stream.event().await);
    let (status, _) = api.post("/sessions/s/resume", json!(null)).await;
    assert_eq!(status, StatusCode::OK);
    seen.extend(stream.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await);
    assert_contiguous(&ids(&seen), 0);
    assert_eq!(
        seen.iter().filter(|f| is(f, kind::PROMPT_PROMOTED)).count(),
        3,
        "the replayed admissions were all promoted live: {seen:?}"
    );
    // A quiet stream carries keep-alive comments.
    loop {
        let frame = stream.frame().await;
        if frame.comments.iter().any(|c| c == "keep-alive") {
            break;
        }
        assert!(frame.id.is_some(), "only events or keep-alives: {frame:?}");
    }
    // An empty Last-Event-ID is no Last-Event-ID: `after` applies.
    let mut stream = api.events("/sessions/s/events?after=1", Some("")).await;
    assert_eq!(stream.event().await.id, Some(2));
    h.stop().await;
}

/// A live-only event is an SSE frame with `event:` and `data:` (the event without a seq) and no
/// `id:`, so `Last-Event-ID` stays a durable seq; it is sent to the streams open when it is
/// published and never replayed.
#[actix_rt::test]
async fn sse_frames_of_live_only_events_have_no_id() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("live").await;
    let mut stream = api.events("/sessions/live/events", None).await;
    assert!(is(&stream.event().await, kind::CREATED));
    let (status, body) = api
        .post("/sessions/live/prompt", json!({ "text": "hi" }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let seen = stream.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    let live: Vec<&Frame> = seen.iter().filter(|f| is(f, "agent.delta")).collect();
    assert_eq!(live.len(), 3, "{seen:?}");
    for (i, frame) in live.iter().enumerate() {
        assert_eq!(frame.id, None, "no id: {frame:?}");
        let data = frame.data.as_ref().expect("data");
        assert_eq!(data["type"], json!("agent.delta"));
        assert_eq!(data["session_id"], json!("live"));
        assert_eq!(data["data"], json!({ "i": i }));
        assert!(
            data["time"].is_i64() && data["after_seq"].is_u64(),
            "{data}"
        );
    }
    let promoted = seen
        .iter()
        .position(|f| is(f, kind::PROMPT_PROMOTED))
        .expect("promoted");
    let first_live = seen.iter().position(|f| is(f, "agent.delta")).unwrap();
    assert!(promoted < first_live, "after the promotion: {seen:?}");
    assert_eq!(
        live[0].data.as_ref().expect("data")["after_seq"],
        json!(seen[promoted].id.expect("a seq")),
        "after its turn's last write"
    );
    assert_contiguous(&ids(&seen), 1);
    // The last id seen is a durable seq, whatever frames came after it; a replay (what a
    // reconnect gets) has no live event.
    let last = seen.iter().rev().find_map(|f| f.id).expect("a seq");
    let mut replay = api.events("/sessions/live/events?after=0", None).await;
    let replayed = replay.until(|f| f.id == Some(last)).await;
    assert!(!replayed.iter().any(|f| f.id.is_none()), "{replayed:?}");
    assert_contiguous(&ids(&replayed), 1);
    h.stop().await;
}

/// `DELETE /sessions/{id}`: 200 with the deleted ids (children included), 404 for an unknown
/// id, 409 `session_busy` while a turn runs, 200 with `?force=true`; an open event stream of
/// the deleted session gets a last `session.deleted` frame and ends.
#[actix_rt::test]
async fn delete_is_200_404_or_409_and_ends_the_sessions_event_streams() {
    let h = Harness::start(HttpOptions::new()).await;
    let api = &h.api;
    h.session("s").await;
    let (status, body) = api
        .post("/sessions", json!({ "id": "kid", "parent_id": "s" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    api.post("/sessions/s/prompt", json!({ "text": "one" }))
        .await;
    let mut stream = api.events("/sessions/s/events", None).await;
    let seen = stream.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    let last = seen.last().and_then(|f| f.id).unwrap_or_default();

    h.session("slow-1").await;
    let mut slow = api.events("/sessions/slow-1/events", None).await;
    api.post("/sessions/slow-1/prompt", json!({ "text": "work" }))
        .await;
    slow.until(|f| is(f, kind::PROMPT_PROMOTED)).await;
    let (status, body) = api.delete("/sessions/slow-1").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::CONFLICT, "session_busy"),
        "{body}"
    );

    let (status, body) = api.delete("/sessions/s").await;
    assert_eq!(
        (status, &body),
        (StatusCode::OK, &json!({ "deleted": ["s", "kid"] }))
    );
    let rest = stream.rest().await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(is(&rest[0], kind::DELETED), "{rest:?}");
    assert_eq!(rest[0].id, Some(last + 1));
    for path in ["/sessions/s", "/sessions/kid"] {
        let (status, body) = api.get(path).await;
        assert_eq!(
            (status, error_type(&body)),
            (StatusCode::NOT_FOUND, "not_found")
        );
    }
    let (status, body) = api.delete("/sessions/s").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (status, body) = api.delete("/sessions/slow-1?force=maybe").await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::BAD_REQUEST, "invalid_input")
    );

    let (status, body) = api.delete("/sessions/slow-1?force=true").await;
    assert_eq!(
        (status, &body),
        (StatusCode::OK, &json!({ "deleted": ["slow-1"] }))
    );
    let names: Vec<String> = slow
        .rest()
        .await
        .iter()
        .filter_map(|f| f.event.clone())
        .collect();
    assert_eq!(
        names,
        [
            kind::INTERRUPT_REQUESTED,
            kind::EXECUTION_INTERRUPTED,
            kind::DELETED
        ]
    );
    h.stop().await;
}

/// With retention, a stream from before the start of a compacted log is 410
/// `events_compacted` naming the first seq still held; one from that seq on, or from the
/// start, replays what is held.
#[actix_rt::test]
async fn sse_from_before_a_compacted_log_is_410_with_its_first_seq() {
    let policy =
        durable_sessions::RetainEvents::new(2, Duration::ZERO).interval(Duration::from_secs(3600));
    let h = Harness::start_with(HttpOptions::new(), |b| b.retain_events(policy)).await;
    let api = &h.api;
    h.session("s").await;
    api.post("/sessions/s/prompt", json!({ "text": "one" }))
        .await;
    let seen = api
        .events("/sessions/s/events", None)
        .await
        .until(|f| is(f, kind::EXECUTION_SUCCEEDED))
        .await;
    let last = seen.last().and_then(|f| f.id).unwrap_or_default();
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(h.runtime.compact_events().await.expect("compact"), 1);
    let first = last - 1;

    for (path, last_event_id) in [
        ("/sessions/s/events?after=0", None),
        ("/sessions/s/events", Some("1")),
    ] {
        let mut request = api.request(Method::GET, path);
        if let Some(id) = last_event_id {
            request = request.insert_header(("Last-Event-ID", id));
        }
        let mut response = request.send().await.expect("request");
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(
            (response.status(), error_type(&body)),
            (StatusCode::GONE, "events_compacted"),
            "{path} {last_event_id:?}: {body}"
        );
        assert_eq!(body["error"]["first_seq"], json!(first), "{body}");
    }
    let mut from_start = api.events("/sessions/s/events", None).await;
    assert_eq!(from_start.event().await.id, Some(first));
    let mut from_first = api
        .events(&format!("/sessions/s/events?after={}", first - 1), None)
        .await;
    assert_eq!(from_first.event().await.id, Some(first));
    let (status, body) = api.get("/sessions/s/status").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["log_start"].clone(), body["last_seq"].clone()),
        (json!(first), json!(last))
    );
    h.stop().await;
}

#[actix_rt::test]
async fn a_shut_down_runtime_answers_503() {
    let h = Harness::start(HttpOptions::new()).await;
    h.session("s").await;
    h.runtime.shutdown().await;
    let (status, body) = h.api.post("/sessions", json!({ "id": "t" })).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    );
    let (status, body) = h
        .api
        .post("/sessions/s/prompt", json!({ "text": "hi" }))
        .await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    );
    let (status, body) = h.api.post("/sessions/s/resume", json!(null)).await;
    assert_eq!(
        (status, error_type(&body)),
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    );
    h.server.stop(false).await;
}

/// Posts `body` to `path` and returns the status, the `Retry-After` header and the JSON body.
async fn post_with_retry_after(api: &Api, path: &str, body: Value) -> (u16, Option<String>, Value) {
    let mut response = api
        .request(Method::POST, path)
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.to_string())
        .await
        .expect("a response");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response.body().await.expect("the body");
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (response.status().as_u16(), retry_after, value)
}

/// The database file and its WAL made read-only under the running server (`chattr +i` as root;
/// the `-shm` file is left alone, as in `tests/store_faults.rs`: an immutable mapped file
/// faults the process): a prompt is answered 503 `store_unavailable` naming the fault, with
/// `Retry-After`, and `/stats` counts the failed write; once the files are writable again the
/// exact retry of the prompt is 202.
#[cfg(unix)]
#[actix_rt::test]
async fn a_store_fault_is_503_store_unavailable_with_retry_after() {
    let h = Harness::start(HttpOptions::new()).await;
    h.session("fault").await;
    let prompt = json!({ "id": "p1", "text": "hello" });
    let (status, body) = h
        .api
        .post(
            "/sessions/fault/prompt",
            json!({ "id": "p0", "text": "first" }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    h.transcript("fault", 2).await;
    let wal = std::path::PathBuf::from(format!("{}-wal", h.db.display()));
    let skip = |why: &str| {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the store fault cannot be made here ({why}); CI must run this test"
        );
        println!("skipped: {why}");
    };
    let Some(read_only) = common::ReadOnly::set(&[h.db.clone(), wal]) else {
        skip("cannot make the database files read-only (chattr/chmod failed)");
        h.stop().await;
        return;
    };
    let (status, retry_after, body) =
        post_with_retry_after(&h.api, "/sessions/fault/prompt", prompt.clone()).await;
    if status == 202 && !read_only.immutable() {
        skip("chmod 0444 does not stop writes through open files (chattr +i needs root)");
        drop(read_only);
        h.stop().await;
        return;
    }
    assert_eq!(status, 503, "{body}");
    assert_eq!(error_type(&body), "store_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("I/O error") || message.contains("read-only"),
        "the message names the fault: {message}"
    );
    let seconds: u64 = retry_after
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After in seconds: {retry_after:?}"));
    assert!((1..=5).contains(&seconds), "Retry-After: {seconds}");
    let (status, stats) = h.api.get("/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert!(
        stats["failed_write_requests"].as_u64() >= Some(1),
        "the failed write is counted: {stats}"
    );
    drop(read_only);
    let (status, _, body) = post_with_retry_after(&h.api, "/sessions/fault/prompt", prompt).await;
    assert_eq!(status, 202, "the exact retry once writable: {body}");
    h.transcript("fault", 4).await;
    h.stop().await;
}

/// A `server` example child process; killed (SIGKILL) when dropped.
struct ServerProcess {
    child: Child,
    base: String,
}

impl ServerProcess {
    /// Starts the server on `db` and a free port, and waits until it listens.
    fn spawn(db: &Path, word_delay_ms: u64) -> Self {
        let mut child = Command::new(server_binary())
            .arg("--addr")
            .arg("127.0.0.1:0")
            .arg("--db")
            .arg(db)
            .arg("--word-delay-ms")
            .arg(word_delay_ms.to_string())
            .env_remove("DURABLE_SESSIONS_TOKEN")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the server example");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining stdout so the child never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut process = Self {
            child,
            base: String::new(),
        };
        let deadline = Instant::now() + WAIT;
        while process.base.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(base) = line.strip_prefix("listening on ") {
                        process.base = base.trim().to_owned();
                    }
                }
                Err(e) => panic!("the server example did not start listening: {e}"),
            }
        }
        process
    }

    fn api(&self) -> Api {
        Api::new(self.base.clone())
    }

    /// Sends SIGINT (Ctrl-C) and waits for a clean exit.
    async fn interrupt(&mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("sh")
            .args(["-c", &format!("kill -INT {pid}")])
            .status()
            .is_ok_and(|status| status.success());
        assert!(sent, "could not send SIGINT");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "Ctrl-C exits cleanly: {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not stop on SIGINT"
            );
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

/// Creates `demo` on the server, prompts it, and returns the events up to the first word of
/// the reply (the turn is then mid-reply) and the prompt's id.
async fn prompt_until_mid_reply(api: &Api) -> Vec<Frame> {
    let (status, body) = api.post("/sessions", json!({ "id": "demo" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut events = api.events("/sessions/demo/events", None).await;
    let text = "one two three four five six seven eight nine ten";
    let (status, body) = api
        .post("/sessions/demo/prompt", json!({ "id": "m1", "text": text }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let seen = events.until(|f| is(f, "agent.delta")).await;
    assert!(
        !seen
            .iter()
            .any(|f| is(f, kind::MESSAGE_APPENDED) || is(f, kind::EXECUTION_SUCCEEDED)),
        "mid-reply: {seen:?}"
    );
    seen
}

/// After a restart: the log continues from `seen` with the continue notice, the agent's
/// `agent.continuing`, and a succeeded turn; the transcript holds the prompt and its reply.
async fn assert_resumed(api: &Api, seen: &[Frame]) {
    let last = seen.iter().rev().find_map(|f| f.id).expect("a seq");
    let mut events = api
        .events("/sessions/demo/events", Some(&last.to_string()))
        .await;
    let after = events.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    assert_contiguous(&ids(&after), last + 1);
    let position = |name: &str| after.iter().position(|f| is(f, name));
    let notice = position(kind::SYNTHETIC).expect("the continue notice");
    let data = after[notice].data.as_ref().expect("data");
    assert_eq!(data["data"]["text"], json!(RESTART_NOTICE_TEXT));
    let continuing = position("agent.continuing").expect("agent.continuing");
    let succeeded = after.len() - 1;
    assert!(notice < continuing && continuing < succeeded, "{after:?}");
    assert!(
        !after[..notice]
            .iter()
            .any(|f| is(f, kind::EXECUTION_FAILED) || is(f, kind::MESSAGE_APPENDED)),
        "nothing ended the turn before the restart: {after:?}"
    );
    let messages = transcript(api, "demo", 2).await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(
        (&messages[0]["id"], &messages[0]["type"]),
        (&json!("m1"), &json!("user"))
    );
    assert_eq!(messages[1]["type"], json!("assistant"));
    assert_eq!(
        messages[1]["data"],
        json!({
            "reply_to": "m1",
            "text": "echo: one two three four five six seven eight nine ten",
        })
    );
    let (_, session) = api.get("/sessions/demo").await;
    assert_eq!(
        session["time_suspended"],
        json!(null),
        "released: {session}"
    );
}

#[actix_rt::test]
async fn server_example_resumes_a_turn_killed_mid_reply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("server.db");
    let server = ServerProcess::spawn(&db, 500);
    let seen = prompt_until_mid_reply(&server.api()).await;
    drop(server); // SIGKILL mid-reply
    let server = ServerProcess::spawn(&db, 5);
    assert_resumed(&server.api(), &seen).await;
}

#[actix_rt::test]
async fn server_example_ctrl_c_keeps_the_turn_for_the_next_boot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("server.db");
    let mut server = ServerProcess::spawn(&db, 500);
    let seen = prompt_until_mid_reply(&server.api()).await;
    server.interrupt().await;
    let server = ServerProcess::spawn(&db, 5);
    let api = server.api();
    let mut events = api.events("/sessions/demo/events", None).await;
    let log = events.until(|f| is(f, kind::SYNTHETIC)).await;
    let interrupted = log
        .iter()
        .find(|f| is(f, kind::EXECUTION_INTERRUPTED))
        .and_then(|f| f.data.clone())
        .expect("the shutdown was recorded");
    assert_eq!(interrupted["data"]["reason"], json!("shutdown"));
    assert_resumed(&api, &seen).await;
}

/// Creates `demo`, prompts it with `text` as message `a`, and interrupts the reply after its
/// first word; returns the session's event stream (read up to that first word).
async fn interrupt_a_mid_reply(api: &Api, text: &str) -> Sse {
    let (status, body) = api.post("/sessions", json!({ "id": "demo" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut events = api.events("/sessions/demo/events", None).await;
    let (status, body) = api
        .post("/sessions/demo/prompt", json!({ "id": "a", "text": text }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    events.until(|f| is(f, "agent.delta")).await;
    let (status, body) = api.post("/sessions/demo/interrupt", json!(null)).await;
    assert_eq!(
        (status, &body),
        (StatusCode::OK, &json!({ "interrupted": true }))
    );
    events
}

/// The README's walkthrough, over HTTP against the server example: prompt A, interrupt it
/// mid-reply, prompt B, SIGKILL during B's reply, restart. The resumed turn answers B (with
/// `agent.continuing`) and never A: a reply a user interrupted stays interrupted, across a
/// crash, and the transcript marks A as interrupted.
#[actix_rt::test]
async fn the_readme_walkthrough_never_answers_an_interrupted_prompt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("server.db");
    let server = ServerProcess::spawn(&db, 300);
    let api = server.api();
    let quick = "the quick brown fox jumps over the lazy dog";
    let mut events = interrupt_a_mid_reply(&api, quick).await;
    let (status, body) = api
        .post(
            "/sessions/demo/prompt",
            json!({ "id": "b", "text": "one two three four five six" }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let seen = events
        .until(|f| {
            is(f, "agent.delta")
                && f.data
                    .as_ref()
                    .is_some_and(|d| d["data"]["reply_to"] == "b")
        })
        .await;
    drop(events);
    drop(server); // SIGKILL mid-reply of B
    let server = ServerProcess::spawn(&db, 5);
    let api = server.api();
    let last = seen.iter().rev().find_map(|f| f.id).expect("a seq");
    let mut events = api
        .events("/sessions/demo/events", Some(&last.to_string()))
        .await;
    let after = events.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    assert!(after.iter().any(|f| is(f, kind::SYNTHETIC)), "{after:?}");
    let replied_to = |frames: &[Frame], name: &str| -> Vec<String> {
        frames
            .iter()
            .filter(|f| is(f, name))
            .filter_map(|f| {
                f.data.as_ref()?["data"]["reply_to"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    };
    assert_eq!(replied_to(&after, "agent.continuing"), ["b"], "{after:?}");
    assert!(
        replied_to(&after, "agent.delta").iter().all(|to| to == "b"),
        "only B is answered after the restart: {after:?}"
    );
    let messages = transcript(&api, "demo", 3).await;
    // (type, id of a user message, what an assistant message replies to, interrupted)
    let summary: Vec<(&str, &str, &str, bool)> = messages
        .iter()
        .map(|m| {
            let user = m["type"] == "user";
            (
                m["type"].as_str().unwrap_or_default(),
                if user {
                    m["id"].as_str().unwrap_or_default()
                } else {
                    ""
                },
                m["data"]["reply_to"].as_str().unwrap_or_default(),
                m["interrupted"] == json!(true),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("user", "a", "", true),
            ("user", "b", "", false),
            ("assistant", "", "b", false)
        ],
        "{messages:?}"
    );
    assert_eq!(
        messages[2]["data"]["text"],
        json!("echo: one two three four five six")
    );
}

/// `POST /sessions/{id}/resume` after a user interrupt runs a turn that answers nothing: the
/// interrupted prompt stays unanswered and nothing else is pending.
#[actix_rt::test]
async fn an_explicit_resume_after_an_interrupt_answers_nothing_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("server.db");
    let server = ServerProcess::spawn(&db, 200);
    let api = server.api();
    let mut events = interrupt_a_mid_reply(&api, "one two three four").await;
    let interrupted = events.until(|f| is(f, kind::EXECUTION_INTERRUPTED)).await;
    let (status, body) = api.post("/sessions/demo/resume", json!(null)).await;
    assert_eq!(
        (status, &body),
        (StatusCode::OK, &json!({ "type": "succeeded" }))
    );
    let after = events.until(|f| is(f, kind::EXECUTION_SUCCEEDED)).await;
    assert!(
        !after.iter().any(|f| is(f, "agent.delta")
            || is(f, "agent.continuing")
            || is(f, kind::MESSAGE_APPENDED)),
        "the resume answered something: {after:?} (before: {interrupted:?})"
    );
    let (status, messages) = api.get("/sessions/demo/messages?order=asc").await;
    assert_eq!(status, StatusCode::OK);
    let messages = messages.as_array().cloned().unwrap_or_default();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(
        (&messages[0]["id"], &messages[0]["interrupted"]),
        (&json!("a"), &json!(true))
    );
}
