//! The HTTP adapter as browsers and hostile pages see it, over real listeners: CORS for allowed
//! origins (preflights answered, foreign origins refused), JSON-only bodies (415), event-stream
//! tickets behind a token, slow bodies cut off (408) while the server keeps answering, odd
//! input (a non-UTF-8 path, `HEAD`, an event stream over HTTP/1.0, HTTP framing errors with JSON
//! bodies), `after`/`Last-Event-ID` past the end of the log, and `event:` on every frame.
#![cfg(feature = "http")]

mod common;

use std::time::Duration;

use actix_web::http::{Method, StatusCode};
use actix_web::{App, HttpServer};
use durable_sessions::http::{self, HttpOptions};
use futures::StreamExt;
use serde_json::{json, Value};

use common::web::{raw_async, send as send_answer, WebServer, WordAgent};
use common::WAIT;

/// A quiet period after which a raw read gives up waiting for more bytes.
const QUIET: Duration = Duration::from_millis(1500);

fn client() -> awc::Client {
    awc::Client::builder().timeout(WAIT).finish()
}

/// Sends a request and returns its status, headers and body (JSON or `null`).
async fn send(
    request: awc::ClientRequest,
    body: Option<&str>,
) -> (StatusCode, actix_web::http::header::HeaderMap, Value) {
    let sent = match body {
        Some(body) => request.send_body(body.to_owned()).await,
        None => request.send().await,
    };
    let mut response = sent.expect("a response");
    let bytes = response.body().await.expect("the body");
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (response.status(), response.headers().clone(), value)
}

fn error_type(body: &Value) -> &str {
    body["error"]["type"].as_str().unwrap_or("<none>")
}

async fn create(base: &str, id: &str) {
    let request = client()
        .post(format!("{base}/sessions"))
        .insert_header(("Content-Type", "application/json"));
    let (status, _, body) = send(request, Some(&json!({ "id": id }).to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// With an allowed origin, a preflight is answered with the CORS headers and the real request
/// carries `Access-Control-Allow-Origin`; a preflight or a request from any other origin is
/// refused with a JSON 403 before it reaches a route; by default no origin but the server's own
/// is allowed.
#[actix_rt::test]
async fn cors_allows_configured_origins_and_refuses_others() {
    let allowed = "http://app.example:5173";
    let server = WebServer::start(
        HttpOptions::new().cors_origin(allowed),
        Duration::from_millis(1),
    )
    .await;
    let base = server.base();
    let preflight = |origin: &str| {
        client()
            .request(Method::OPTIONS, format!("{base}/sessions"))
            .insert_header(("Origin", origin.to_owned()))
            .insert_header(("Access-Control-Request-Method", "POST"))
            .insert_header((
                "Access-Control-Request-Headers",
                "content-type, authorization",
            ))
    };
    let (status, headers, _) = send(preflight(allowed), None).await;
    assert!(status.is_success(), "preflight answered: {status}");
    assert_eq!(
        headers
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some(allowed)
    );
    let methods = headers
        .get("access-control-allow-methods")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(methods.contains("POST"), "{methods}");

    let (status, _, body) = send(preflight("http://evil.example"), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(error_type(&body), "origin_not_allowed");

    let request = client()
        .post(format!("{base}/sessions"))
        .insert_header(("Origin", allowed))
        .insert_header(("Content-Type", "application/json"));
    let (status, headers, body) = send(request, Some(r#"{"id": "cors"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        headers
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some(allowed)
    );
    server.stop().await;

    // Default: nothing allowed, no preflight answered.
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let base = server.base();
    let request = client()
        .request(Method::OPTIONS, format!("{base}/sessions"))
        .insert_header(("Origin", allowed))
        .insert_header(("Access-Control-Request-Method", "POST"));
    let (status, headers, body) = send(request, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(headers.get("access-control-allow-origin").is_none());
    server.stop().await;
}

/// A preflight from an allowed origin that asks for a method or a header cross-origin callers
/// may not use is refused by CORS with a JSON body (`cors_not_allowed`) and
/// `Content-Type: application/json`, not actix-cors's plain text.
#[actix_rt::test]
async fn a_refused_cors_preflight_is_json() {
    let allowed = "http://app.example:5173";
    let server = WebServer::start(
        HttpOptions::new().cors_origin(allowed),
        Duration::from_millis(1),
    )
    .await;
    let base = server.base();
    for (method, headers) in [("PUT", "content-type"), ("POST", "x-custom")] {
        let request = client()
            .request(Method::OPTIONS, format!("{base}/sessions"))
            .insert_header(("Origin", allowed))
            .insert_header(("Access-Control-Request-Method", method))
            .insert_header(("Access-Control-Request-Headers", headers));
        let (status, response_headers, body) = send(request, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {headers}: {body}");
        assert_eq!(error_type(&body), "cors_not_allowed", "{body}");
        assert!(body["error"]["message"].as_str().is_some(), "{body}");
        assert_eq!(
            response_headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{method} {headers}"
        );
    }
    server.stop().await;
}

/// DNS rebinding: a page of `http://evil.example:8080` whose name resolves to 127.0.0.1 sends
/// `Host: evil.example:8080` (and, as its own origin, a matching `Origin`). A server on a
/// loopback address refuses it with a JSON 421 `host_not_allowed` and creates nothing; the
/// loopback names and an explicitly allowed host are served. Both through `http::serve` and
/// through `http::configure` on actix-web's `HttpServer` (which learns its listener from
/// actix-web); a listener on `0.0.0.0` answers to any host by default.
#[actix_rt::test]
async fn a_request_with_a_foreign_host_is_refused() {
    let server = WebServer::start(
        HttpOptions::new().allowed_host("app.example"),
        Duration::from_millis(1),
    )
    .await;
    let base = server.base();
    let port = server.addr.port();
    let create_as = |host: &str, origin: Option<&str>, id: &str| {
        let mut request = client()
            .post(format!("{base}/sessions"))
            .insert_header(("Host", host.to_owned()))
            .insert_header(("Content-Type", "application/json"));
        if let Some(origin) = origin {
            request = request.insert_header(("Origin", origin.to_owned()));
        }
        let body = json!({ "id": id }).to_string();
        async move { send(request, Some(&body)).await }
    };
    for origin in [None, Some("http://evil.example:8080")] {
        let (status, headers, body) = create_as("evil.example:8080", origin, "evil").await;
        assert_eq!(
            status,
            StatusCode::MISDIRECTED_REQUEST,
            "{origin:?}: {body}"
        );
        assert_eq!(error_type(&body), "host_not_allowed", "{body}");
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/json")
        );
    }
    let (status, _, body) = send(client().get(format!("{base}/sessions")), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!([]), "a refused request created nothing");
    let accepted = [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("app.example:{port}"),
    ];
    for (i, host) in accepted.iter().enumerate() {
        let origin = format!("http://{host}");
        let (status, _, body) = create_as(host, Some(&origin), &format!("ok{i}")).await;
        assert_eq!(status, StatusCode::CREATED, "{host}: {body}");
    }
    // `/healthz` answers any host.
    let healthz = client()
        .get(format!("{base}/healthz"))
        .insert_header(("Host", "evil.example:8080"));
    assert_eq!(send(healthz, None).await.0, StatusCode::OK);
    server.stop().await;

    // Embedded with `http::configure` on actix-web's own server: a loopback listener and one on
    // every address (reached here through 127.0.0.1).
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = durable_sessions::Runtime::builder()
        .database(dir.path().join("embedded.db"))
        .runner(WordAgent {
            delay: Duration::from_millis(1),
        })
        .arbiters(1)
        .start()
        .await
        .expect("runtime starts");
    let app_runtime = runtime.clone();
    let embedded = HttpServer::new(move || {
        App::new().configure(http::configure(app_runtime.clone(), HttpOptions::new()))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(("127.0.0.1", 0))
    .expect("bind loopback")
    .bind(("0.0.0.0", 0))
    .expect("bind every address");
    let ports: Vec<u16> = embedded.addrs().iter().map(|a| a.port()).collect();
    let embedded = embedded.run();
    let handle = embedded.handle();
    actix_rt::spawn(embedded);
    for (port, refused) in ports.iter().zip([true, false]) {
        let request = client()
            .post(format!("http://127.0.0.1:{port}/sessions"))
            .insert_header(("Host", "evil.example:8080"))
            .insert_header(("Content-Type", "application/json"));
        let (status, _, body) = send(request, Some(&json!({ "id": "e" }).to_string())).await;
        if refused {
            assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body}");
            assert_eq!(error_type(&body), "host_not_allowed");
        } else {
            assert_eq!(
                status,
                StatusCode::CREATED,
                "0.0.0.0 answers any host: {body}"
            );
        }
    }
    handle.stop(false).await;
    runtime.shutdown().await;
}

/// What a foreign page's `fetch(…, {mode: "no-cors", method: "POST"})` sends (a `text/plain`
/// body and its own `Origin`) is refused and admits nothing; without an `Origin` (curl) a body
/// must still be JSON (415); the server's own origin (the console) is served.
#[actix_rt::test]
async fn cross_site_posts_are_refused_and_bodies_must_be_json() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let base = server.base();
    create(&base, "victim").await;
    let prompt = r#"{"text": "rm -rf"}"#;

    let foreign = client()
        .post(format!("{base}/sessions/victim/prompt"))
        .insert_header(("Origin", "http://evil.example"))
        .insert_header(("Content-Type", "text/plain;charset=UTF-8"));
    let (status, _, body) = send(foreign, Some(prompt)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(error_type(&body), "origin_not_allowed");

    // An interrupt needs no body: the Origin alone keeps a foreign page out.
    let foreign = client()
        .post(format!("{base}/sessions/victim/interrupt"))
        .insert_header(("Origin", "http://evil.example"));
    let (status, _, body) = send(foreign, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut request = client().post(format!("{base}/sessions/victim/prompt"));
        if let Some(content_type) = content_type {
            request = request.insert_header(("Content-Type", content_type));
        }
        let (status, _, body) = send(request, Some(prompt)).await;
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}: {body}"
        );
        assert_eq!(error_type(&body), "unsupported_media_type");
    }
    let messages = client().get(format!("{base}/sessions/victim/messages"));
    let (_, _, body) = send(messages, None).await;
    assert_eq!(body, json!([]), "nothing was admitted");

    let own = client()
        .post(format!("{base}/sessions/victim/prompt"))
        .insert_header(("Origin", base.clone()))
        .insert_header(("Content-Type", "application/json; charset=utf-8"));
    let (status, _, body) = send(own, Some(prompt)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    server.stop().await;
}

/// Behind a token, `POST /sessions/{id}/events/ticket` gives a ticket that opens that session's
/// event stream as `?ticket=` (what an `EventSource` can send), and nothing else: not another
/// session's stream, not another route, not after it expired.
#[actix_rt::test]
async fn event_stream_tickets_open_one_stream_for_a_short_time() {
    let token = "s3cret";
    let options = HttpOptions::new()
        .token(Some(token.into()))
        .ticket_ttl(Duration::from_millis(3000));
    let server = WebServer::start(options, Duration::from_millis(1)).await;
    let base = server.base();
    let bearer = ("Authorization", format!("Bearer {token}"));
    for id in ["t1", "t2"] {
        let request = client()
            .post(format!("{base}/sessions"))
            .insert_header(bearer.clone())
            .insert_header(("Content-Type", "application/json"));
        let (status, _, body) = send(request, Some(&json!({ "id": id }).to_string())).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let events = client().get(format!("{base}/sessions/t1/events"));
    let (status, _, body) = send(events, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let request = client().post(format!("{base}/sessions/t1/events/ticket"));
    let (status, _, _) = send(request, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a ticket needs the token");

    let request = client()
        .post(format!("{base}/sessions/t1/events/ticket"))
        .insert_header(bearer.clone());
    let (status, _, body) = send(request, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ticket = body["ticket"].as_str().expect("a ticket").to_owned();
    assert!(!ticket.contains(token), "the token is not in the ticket");

    let mut stream = client()
        .get(format!("{base}/sessions/t1/events?ticket={ticket}"))
        .send()
        .await
        .expect("events");
    assert_eq!(stream.status(), StatusCode::OK);
    let mut text = String::new();
    while !text.contains("event: session.created") {
        let chunk = actix_rt::time::timeout(WAIT, stream.next())
            .await
            .expect("a frame in time")
            .expect("the stream goes on")
            .expect("a chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(stream);

    for path in [
        format!("/sessions/t2/events?ticket={ticket}"),
        format!("/sessions/t1/messages?ticket={ticket}"),
        // A path that ends in `/events` but is not a stream (a message whose id is `events`).
        format!("/sessions/t1/messages/events?ticket={ticket}"),
        format!("/events?ticket={ticket}"),
        "/sessions/t1/events?ticket=123.abc".to_owned(),
    ] {
        let (status, _, body) = send(client().get(format!("{base}{path}")), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        // The answer names the ticket, not the header the request did not send.
        assert_eq!(body["error"]["type"], "invalid_ticket", "{path}: {body}");
    }
    actix_rt::time::sleep(Duration::from_millis(3100)).await;
    let expired = client().get(format!("{base}/sessions/t1/events?ticket={ticket}"));
    let (status, _, body) = send(expired, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "an expired ticket");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("expired"), "{body}");
    server.stop().await;
}

/// A body trickled after complete headers, or one that never comes, is answered 408 after the
/// body timeout and its connection closed; meanwhile `/healthz` answers at once.
#[actix_rt::test]
async fn slow_bodies_are_cut_off_with_408() {
    let options = HttpOptions::new().body_timeout(Duration::from_millis(600));
    let server = WebServer::start(options, Duration::from_millis(1)).await;
    let addr = server.addr;
    let started = std::time::Instant::now();
    // Raw sockets: a body that never comes, or trickles, is what a client library never sends.
    let never = raw_async(
        addr,
        "POST /sessions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: 40\r\n\r\n{"
            .to_owned(),
        Duration::from_secs(20),
    );
    let trickle = actix_rt::task::spawn_blocking(move || {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .write_all(
                b"POST /sessions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                  Content-Length: 40\r\n\r\n",
            )
            .expect("headers");
        for _ in 0..8 {
            if stream.write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        common::web::read_response(&mut stream, Duration::from_secs(20))
    });
    let health = send_answer(client().get(format!("{}/healthz", server.base())), "").await;
    assert_eq!(health.status, 200, "{health:?}");
    let never = never.await;
    assert_eq!(never.status, 408, "{never:?}");
    assert_eq!(never.error_type(), "request_timeout");
    let trickle = trickle.await.expect("trickling client");
    assert_eq!(trickle.status, 408, "{trickle:?}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "cut off after the timeout, not held: {took:?}"
    );
    server.stop().await;
}

/// Odd requests get JSON answers: a percent-encoded id that is not UTF-8 is 400 (never decoded
/// lossily into another id), `HEAD` works on GET routes, an event stream over HTTP/1.0 is
/// refused with 505 (chunked framing does not exist there), and the errors actix-web's HTTP
/// layer produces itself (400 on bad framing, 431 on too many headers) carry the JSON error body.
#[actix_rt::test]
async fn odd_requests_get_json_answers() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let base = server.base();
    let addr = server.addr;
    create(&base, "\u{fffd}\u{fffd}").await;

    let (status, _, body) = send(client().get(format!("{base}/sessions/%FF%FE")), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error_type(&body), "invalid_input");
    let (status, _, body) = send(
        client().get(format!("{base}/sessions/%EF%BF%BD%EF%BF%BD")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the real U+FFFD id: {body}");

    // Raw sockets from here on: that no body byte follows a HEAD answer's head, an HTTP/1.0
    // request, bad framing and a header flood are wire-level matters a client hides or refuses.
    let head = raw_async(
        addr,
        "HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_owned(),
        QUIET,
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.body, "", "HEAD has no body");
    let head = raw_async(
        addr,
        "HEAD /sessions/nope HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_owned(),
        QUIET,
    )
    .await;
    assert_eq!(head.status, 404, "{head:?}");
    let head = raw_async(
        addr,
        "HEAD /sessions/%EF%BF%BD%EF%BF%BD/events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            .to_owned(),
        QUIET,
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-type"), Some("text/event-stream"));

    let old = raw_async(
        addr,
        "GET /sessions/%EF%BF%BD%EF%BF%BD/events HTTP/1.0\r\nHost: localhost\r\n\r\n".to_owned(),
        QUIET,
    )
    .await;
    assert_eq!(old.status, 505, "{old:?}");
    assert!(old.header("transfer-encoding").is_none(), "{old:?}");
    assert_eq!(old.error_type(), "http_version_not_supported");

    let bad = raw_async(
        addr,
        "POST /sessions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}"
            .to_owned(),
        QUIET,
    )
    .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(bad.error_type(), "bad_request", "{bad:?}");
    let huge = raw_async(
        addr,
        format!(
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\n{}\r\n",
            (0..200)
                .map(|i| format!("X-H{i}: {i}\r\n"))
                .collect::<String>()
        ),
        QUIET,
    )
    .await;
    assert_eq!(huge.status, 431, "{huge:?}");
    assert_eq!(huge.error_type(), "request_header_fields_too_large");
    server.stop().await;
}

/// `after` or `Last-Event-ID` past the end of the session's log (an id kept from another
/// database) is a clear 400, not a stream that waits forever; the last seq itself is fine.
#[actix_rt::test]
async fn a_start_past_the_end_of_the_log_is_400() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let base = server.base();
    create(&base, "short").await; // seq 0 only
    let (status, _, body) = send(
        client().get(format!("{base}/sessions/short/events?after=5")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("past the end"), "{message}");
    let request = client()
        .get(format!("{base}/sessions/short/events"))
        .insert_header(("Last-Event-ID", "1"));
    let (status, _, body) = send(request, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let response = client()
        .get(format!("{base}/sessions/short/events?after=0"))
        .send()
        .await
        .expect("events");
    assert_eq!(response.status(), StatusCode::OK);
    server.stop().await;
}

/// Every frame that carries data carries `event:` too (so a browser's `onmessage` never fires
/// and listeners are per event name), on a turn with runner-defined live-only events (the
/// stream opens before the prompt: live events are not replayed).
#[actix_rt::test]
async fn every_frame_with_data_is_named() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let base = server.base();
    create(&base, "named").await;
    let mut stream = client()
        .get(format!("{base}/sessions/named/events"))
        .send()
        .await
        .expect("events");
    let request = client()
        .post(format!("{base}/sessions/named/prompt"))
        .insert_header(("Content-Type", "application/json"));
    let (status, _, body) = send(request, Some(r#"{"text": "a b c"}"#)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let mut text = String::new();
    while !text.contains("event: session.execution.succeeded") {
        let chunk = actix_rt::time::timeout(WAIT, stream.next())
            .await
            .expect("a frame in time")
            .expect("the stream goes on")
            .expect("a chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let mut names = Vec::new();
    for frame in text.split("\n\n").filter(|f| f.contains("data:")) {
        let name = frame
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("a frame without event: {frame:?}"));
        names.push(name.to_owned());
    }
    assert!(names.iter().any(|n| n == "agent.delta"), "{names:?}");
    assert!(
        names.iter().any(|n| n == "session.prompt.promoted"),
        "{names:?}"
    );
    server.stop().await;
}
