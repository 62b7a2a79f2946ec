//! Per-session event fan-out, over real listeners: one dispatcher thread per runtime however
//! many streams are open; a client that hangs up is noticed within a second (its stream, and
//! its socket, are released: `/stats` `event_streams` counts them); a stream that falls behind
//! is cut off and heals from the store with no gap and no duplicate; streams of one session
//! see nothing of another's.
#![cfg(feature = "http")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use durable_sessions::http::HttpOptions;
use durable_sessions::SessionId;
use serde_json::{json, Value};

use common::web::{client, send, WebServer};
use common::WAIT;

async fn stats(server: &WebServer) -> Value {
    let response = send(client().get(format!("{}/stats", server.base())), "").await;
    assert_eq!(response.status, 200, "{response:?}");
    response.json()
}

async fn event_streams(server: &WebServer) -> u64 {
    stats(server).await["event_streams"]
        .as_u64()
        .expect("event_streams in /stats")
}

/// Threads of this process with `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .is_ok_and(|comm| comm.trim() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Opens an event stream on a raw connection and reads until its opening comment arrived.
// A raw socket: the test is about hanging up, which must close the TCP connection at once (a
// pooling client may keep it).
fn open_stream(addr: std::net::SocketAddr, session: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let request = format!("GET /sessions/{session}/events HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("request");
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("event: session.created") {
        let n = stream.read(&mut buf).expect("the stream's first frames");
        assert!(
            n > 0,
            "the stream closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    stream
}

/// 200 streams on two sessions run on one dispatcher thread; when their clients hang up, the
/// server releases every one of them within about a second, with no event to write.
#[actix_rt::test]
async fn closed_clients_are_released_within_a_second_by_one_dispatcher() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    for id in ["quiet-a", "quiet-b"] {
        server
            .runtime
            .sessions()
            .create(durable_sessions::CreateSession {
                id: Some(SessionId::new(id).expect("id")),
                ..Default::default()
            })
            .await
            .expect("create");
    }
    let addr = server.addr;
    let streams = actix_rt::task::spawn_blocking(move || {
        (0..200)
            .map(|i| open_stream(addr, if i % 2 == 0 { "quiet-a" } else { "quiet-b" }))
            .collect::<Vec<_>>()
    })
    .await
    .expect("clients");
    assert_eq!(event_streams(&server).await, 200);
    // One per runtime (the other test of this binary may run its own at the same time), not
    // one per stream.
    let dispatchers = threads_named("ds-fanout");
    assert!(
        (1..=2).contains(&dispatchers),
        "{dispatchers} dispatcher threads for 200 streams"
    );
    let hung_up = Instant::now();
    drop(streams);
    loop {
        let open = event_streams(&server).await;
        if open == 0 {
            break;
        }
        assert!(
            hung_up.elapsed() < Duration::from_millis(1500),
            "{open} streams of gone clients still open after {:?}",
            hung_up.elapsed()
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// A stream that stops reading while its session publishes far more than it may buffer is cut
/// off from the live route; when it reads again it re-reads the missed range from the store:
/// every event once, in order. Another session's stream sees none of them.
#[actix_rt::test]
async fn a_stream_that_falls_behind_heals_from_the_store() {
    let server = WebServer::start(HttpOptions::new(), Duration::from_millis(1)).await;
    let sessions = server.runtime.sessions();
    let busy = SessionId::new("busy").expect("id");
    let other = SessionId::new("other").expect("id");
    for id in [&busy, &other] {
        sessions
            .create(durable_sessions::CreateSession {
                id: Some(id.clone()),
                ..Default::default()
            })
            .await
            .expect("create");
    }
    let mut behind = sessions.events(&busy, None).await.expect("stream");
    let mut bystander = sessions.events(&other, Some(0)).await.expect("stream");
    let first = behind.next().await.expect("an event").expect("ok");
    assert_eq!(first.seq, 0);
    const EVENTS: u64 = 500;
    for i in 0..EVENTS {
        sessions
            .switch_model(&busy, json!({ "n": i }))
            .await
            .expect("publish");
    }
    for seq in 1..=EVENTS {
        let event = actix_rt::time::timeout(WAIT, behind.next())
            .await
            .expect("in time")
            .expect("an event")
            .expect("ok");
        assert_eq!(event.seq, seq, "in order, once");
    }
    assert!(behind.heals() >= 1, "the stream was cut off and healed");
    let nothing = actix_rt::time::timeout(Duration::from_millis(300), bystander.next()).await;
    assert!(nothing.is_err(), "another session's stream saw {nothing:?}");
    drop((behind, bystander));
    server.stop().await;
}
