//! The `server` example as a program, run as a child process: its flags come from clap (`--help`,
//! `DURABLE_SESSIONS_TOKEN`, repeatable `--cors-origin` and `--allowed-host`), its errors name what failed (the
//! address, the database file), and it stops on SIGTERM even when its stdout is closed
//! (`server | head -1`); its retention flags compact an idle session's log.
#![cfg(feature = "http")]

mod common;

use std::process::{Command, Stdio};

use actix_web::http::Method;
use std::time::{Duration, Instant};

use common::web::{client, run_server_to_exit, send, ServerChild};
use common::{server_binary, WAIT};

#[test]
fn help_lists_the_flags_and_the_token_variable() {
    let (ok, out, err) = run_server_to_exit(&["--help"]);
    assert!(ok, "{err}");
    for flag in [
        "--addr",
        "--db",
        "--token",
        "DURABLE_SESSIONS_TOKEN",
        "--cors-origin",
        "--allowed-host",
        "--word-delay-ms",
        "--body-timeout-ms",
        "--max-resume-attempts",
        "--retain-events",
        "--retain-after-idle-ms",
    ] {
        assert!(out.contains(flag), "--help mentions {flag}: {out}");
    }
    let (ok, _, err) = run_server_to_exit(&["--no-such-flag"]);
    assert!(!ok);
    assert!(err.contains("--no-such-flag"), "{err}");
}

/// Each failure names what failed: a port without a host, a busy address, a directory or a
/// file that is not a database where the database should be.
#[test]
fn errors_name_what_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ok.db");
    let db = db.to_str().expect("UTF-8 path");

    let (ok, _, err) = run_server_to_exit(&["--addr", "8093", "--db", db]);
    assert!(!ok);
    assert!(err.contains("expected host:port"), "{err}");
    assert!(err.contains("8093"), "{err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr").to_string();
    let (ok, _, err) = run_server_to_exit(&["--addr", &addr, "--db", db]);
    assert!(!ok);
    assert!(err.contains(&addr), "names the address: {err}");
    assert!(err.to_lowercase().contains("in use"), "{err}");

    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).expect("mkdir");
    let directory = directory.to_str().expect("UTF-8");
    let (ok, _, err) = run_server_to_exit(&["--addr", "127.0.0.1:0", "--db", directory]);
    assert!(!ok);
    assert!(err.contains(directory), "names the file: {err}");
    assert!(err.contains("is a directory"), "{err}");

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![b'x'; 4096]).expect("write");
    let garbage = garbage.to_str().expect("UTF-8");
    let (ok, _, err) = run_server_to_exit(&["--addr", "127.0.0.1:0", "--db", garbage]);
    assert!(!ok);
    assert!(err.contains(garbage), "names the file: {err}");
    assert!(err.contains("not a database"), "{err}");
}

/// `server | head -1`: once the reader of its stdout is gone, SIGTERM still stops the server,
/// cleanly.
#[test]
fn sigterm_stops_the_server_when_its_stdout_is_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(server_binary())
        .args(["--addr", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("x.db"))
        .env_remove("DURABLE_SESSIONS_TOKEN")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 64];
    let n = std::io::Read::read(&mut stdout, &mut first).expect("the first bytes");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("listening on"));
    drop(stdout); // `head -1` exits
    std::thread::sleep(Duration::from_millis(200));
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("SIGTERM did not stop a server whose stdout is closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// `--allowed-host` given twice answers both hosts besides the loopback names, and refuses
/// any other `Host` with 421 on its loopback address.
#[actix_rt::test]
async fn repeated_allowed_hosts_take_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerChild::spawn(
        &dir.path().join("h.db"),
        &[
            "--allowed-host",
            "one.example",
            "--allowed-host",
            "two.example:9",
        ],
    );
    let base = &server.base;
    for (host, status) in [
        ("one.example:8080", 200),
        ("two.example", 200),
        ("localhost:1", 200),
        ("three.example", 421),
    ] {
        let request = client()
            .get(format!("{base}/stats"))
            .insert_header(("Host", host));
        let answer = send(request, "").await;
        assert_eq!(answer.status, status, "{host}: {answer:?}");
        if status == 421 {
            assert_eq!(answer.error_type(), "host_not_allowed", "{answer:?}");
        }
    }
}

/// `DURABLE_SESSIONS_TOKEN` guards the routes like `--token`; `--cors-origin` given twice allows
/// both origins (their preflights are answered) and no other.
#[actix_rt::test]
async fn the_token_variable_and_repeated_cors_origins_take_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("x.db");
    let server = ServerChild::spawn(
        &db,
        &[
            "--cors-origin",
            "http://one.example",
            "--cors-origin",
            "http://two.example:8000",
        ],
    );
    let base = &server.base;
    for (origin, allowed) in [
        ("http://one.example", true),
        ("http://two.example:8000", true),
        ("http://three.example", false),
    ] {
        let preflight = client()
            .request(Method::OPTIONS, format!("{base}/sessions"))
            .insert_header(("Origin", origin))
            .insert_header(("Access-Control-Request-Method", "POST"));
        let answer = send(preflight, "").await;
        let allow = answer.header("access-control-allow-origin");
        if allowed {
            assert_eq!(answer.status, 200, "{origin}: {answer:?}");
            assert_eq!(allow, Some(origin), "{answer:?}");
        } else {
            assert_eq!(answer.status, 403, "{origin}: {answer:?}");
            assert_eq!(allow, None);
        }
    }
    drop(server);

    let mut child = Command::new(server_binary())
        .args(["--addr", "127.0.0.1:0", "--db"])
        .arg(&db)
        .env("DURABLE_SESSIONS_TOKEN", "from-the-env")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    std::io::BufRead::read_line(&mut reader, &mut line).expect("a line");
    let addr: std::net::SocketAddr = line
        .trim()
        .trim_start_matches("listening on http://")
        .parse()
        .expect("the address");
    let stats = format!("http://{addr}/stats");
    let denied = send(client().get(&stats), "").await;
    assert_eq!(denied.status, 401, "{denied:?}");
    let allowed = send(
        client()
            .get(&stats)
            .insert_header(("Authorization", "Bearer from-the-env")),
        "",
    )
    .await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let _ = child.kill();
    let _ = child.wait();
}

/// `--retain-events N` with `--retain-after-idle-ms`: once a session has been idle that long,
/// its log keeps its newest N events (status says where it starts), a replay from before
/// answers 410 naming the first seq held, and the transcript is whole. Without the flag,
/// `--retain-after-idle-ms` alone is refused.
#[actix_rt::test]
async fn the_retention_flags_compact_an_idle_session_and_keep_its_transcript() {
    let (ok, _, err) = run_server_to_exit(&["--retain-after-idle-ms", "100"]);
    assert!(
        !ok,
        "--retain-after-idle-ms without --retain-events is refused"
    );
    assert!(err.contains("--retain-events"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerChild::spawn(
        &dir.path().join("r.db"),
        &[
            "--word-delay-ms",
            "1",
            "--retain-events",
            "2",
            "--retain-after-idle-ms",
            "200",
        ],
    );
    let base = &server.base;
    let request = |method: Method, path: &str, body: &str| {
        let request = client()
            .request(method, format!("{base}{path}"))
            .insert_header(("Content-Type", "application/json"));
        let body = body.to_owned();
        async move { send(request, &body).await }
    };
    let created = request(Method::POST, "/sessions", r#"{"id":"r"}"#).await;
    assert_eq!(created.status, 201, "{created:?}");
    let prompted = request(Method::POST, "/sessions/r/prompt", r#"{"text":"one two"}"#).await;
    assert_eq!(prompted.status, 202, "{prompted:?}");

    // The turn ends (admitted, promoted, started, the reply, succeeded: seqs 1 – 5), then the
    // session idles past 200 ms and the next pass compacts it to its newest 2 events.
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let status = request(Method::GET, "/sessions/r/status", "").await.json();
        if status["log_start"].as_u64().unwrap_or(0) > 0 {
            break status;
        }
        assert!(Instant::now() < deadline, "never compacted: {status}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    };
    let last = status["last_seq"].as_u64().expect("last_seq");
    assert_eq!(status["log_start"].as_u64(), Some(last - 1), "{status}");

    let replay = request(Method::GET, "/sessions/r/events?after=0", "").await;
    assert_eq!(replay.status, 410, "{replay:?}");
    assert_eq!(replay.error_type(), "events_compacted");
    assert_eq!(replay.json()["error"]["first_seq"].as_u64(), Some(last - 1));

    let messages = request(Method::GET, "/sessions/r/messages?order=asc", "")
        .await
        .json();
    let kinds: Vec<&str> = messages
        .as_array()
        .expect("an array")
        .iter()
        .map(|m| m["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["user", "assistant"], "{messages}");
    assert_eq!(messages[1]["data"]["text"], "echo: one two", "{messages}");
}
