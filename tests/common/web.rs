//! The web-facing suites' tools: a runtime and an HTTP server on `127.0.0.1:0` in the test's
//! actix System (configured as the server example is), an agent that streams its reply word by
//! word, requests through `awc` ([`client`], [`send`]), a raw TCP client only for what a polite
//! HTTP client never sends (malformed or trickled requests, bytes on the wire a client hides),
//! and the `server` example as a child process.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{web, App};
use durable_sessions::http::{self, HttpOptions};
use durable_sessions::{RunError, Runner, Runtime, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};
use tempfile::TempDir;

use super::{server_binary, WAIT};

/// Promotes every pending steer prompt and answers each with `echo: <its words>`, one
/// live-only `agent.delta` event (`{"reply_to", "index", "word"}`) per word after `delay`, then
/// the whole reply as one `assistant` message (as the server example's agent does).
#[derive(Clone)]
pub struct WordAgent {
    pub delay: Duration,
}

impl Runner for WordAgent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let delay = self.delay;
        async move {
            for prompt in turn.promote_steer(None).await? {
                let text = prompt.prompt["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let mut words = vec!["echo:".to_owned()];
                words.extend(text.split_whitespace().map(str::to_owned));
                for (index, word) in words.iter().enumerate() {
                    actix_rt::time::sleep(delay).await;
                    let delta = json!({ "reply_to": prompt.id, "index": index, "word": word });
                    turn.publish_live("agent.delta", delta)?;
                }
                let reply = json!({ "text": words.join(" "), "reply_to": prompt.id });
                turn.append_message("assistant", reply).await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// A runtime and an HTTP server in this test's actix System.
pub struct WebServer {
    pub addr: SocketAddr,
    pub runtime: Runtime,
    server: ServerHandle,
    _dir: TempDir,
}

impl WebServer {
    /// Starts both, the server with `options` through `http::serve`, as the server example
    /// does.
    pub async fn start(options: HttpOptions, delay: Duration) -> Self {
        Self::start_with(options, WordAgent { delay }).await
    }

    /// [`WebServer::start`] with another runner.
    pub async fn start_with<R: Runner>(options: HttpOptions, runner: R) -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = Runtime::builder()
            .database(dir.path().join("web.db"))
            .runner(runner)
            .arbiters(2)
            .shutdown_grace(Duration::from_secs(2))
            .start()
            .await
            .expect("runtime starts");
        let app_runtime = runtime.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let serve = http::ServeOptions {
            workers: Some(2),
            shutdown_timeout: Duration::from_secs(1),
            signals: false,
        };
        let server = http::serve(vec![listener], &serve, move || {
            App::new()
                .configure(http::configure(app_runtime.clone(), options.clone()))
                .default_service(web::to(http::not_found))
        })
        .expect("serve");
        let handle = server.handle();
        actix_rt::spawn(server);
        Self {
            addr,
            runtime,
            server: handle,
            _dir: dir,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
        self.runtime.shutdown().await;
    }
}

/// A response: status, headers and the whole body (read by [`send`], or off a raw connection).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics, naming the response, when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a JSON body ({e}): {self:?}"))
    }

    /// The `error.type` of a JSON error body.
    pub fn error_type(&self) -> String {
        self.json()["error"]["type"]
            .as_str()
            .unwrap_or("<none>")
            .to_owned()
    }
}

/// The suites' HTTP client: every request, its answer and its body bounded by [`WAIT`].
pub fn client() -> awc::Client {
    awc::Client::builder().timeout(WAIT).finish()
}

/// Sends `request` with `body` (none when empty) and reads the whole answer.
///
/// # Panics
/// When no answer comes (within [`WAIT`]).
pub async fn send(request: awc::ClientRequest, body: &str) -> Answer {
    let what = format!("{} {}", request.get_method(), request.get_uri());
    let sent = if body.is_empty() {
        request.send().await
    } else {
        request.send_body(body.to_owned()).await
    };
    let mut response = sent.unwrap_or_else(|e| panic!("{what}: {e}"));
    let bytes = response
        .body()
        .await
        .unwrap_or_else(|e| panic!("{what}: the body: {e}"));
    Answer {
        status: response.status().as_u16(),
        headers: response
            .headers()
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_owned(), value)
            })
            .collect(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The answer in `raw`, its head parsed by `httparse`: `None` while the head is incomplete.
/// The body is what follows the head (all of it: the caller cuts it at its `content-length`).
///
/// # Panics
/// When the head is not an HTTP/1.x response head.
fn parse(raw: &[u8]) -> Option<(usize, Answer)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(raw) {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) => return None,
        Err(e) => panic!(
            "not a response head ({e}): {:?}",
            String::from_utf8_lossy(raw)
        ),
    };
    let answer = Answer {
        status: response.code.expect("a status code"),
        headers: response
            .headers
            .iter()
            .map(|h| {
                let value = String::from_utf8_lossy(h.value).trim().to_owned();
                (h.name.to_ascii_lowercase(), value)
            })
            .collect(),
        body: String::from_utf8_lossy(&raw[head..]).into_owned(),
    };
    Some((head, answer))
}

/// Sends `request` as is on a new connection and reads the answer until the server closes the
/// connection, `quiet` passes without a byte, or a complete `content-length` body arrived.
/// Blocking: call it from `spawn_blocking` (or a thread) in async tests.
pub fn raw(addr: SocketAddr, request: &[u8], quiet: Duration) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(request).expect("send the request");
    read_response(&mut stream, quiet)
}

/// Reads one response off `stream` (see [`raw`]); gives up reading after `quiet` plus [`WAIT`]
/// in all, however the bytes trickle.
///
/// # Panics
/// When no complete response head came.
pub fn read_response(stream: &mut TcpStream, quiet: Duration) -> Answer {
    stream.set_read_timeout(Some(quiet)).expect("read timeout");
    let deadline = Instant::now() + quiet + WAIT;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some((head, answer)) = parse(&got) {
            if let Some(length) = answer
                .header("content-length")
                .and_then(|l| l.parse::<usize>().ok())
            {
                if got.len() >= head + length {
                    got.truncate(head + length);
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    assert!(!got.is_empty(), "no answer at all");
    parse(&got)
        .unwrap_or_else(|| panic!("an incomplete head: {:?}", String::from_utf8_lossy(&got)))
        .1
}

/// `raw` on a blocking thread.
pub async fn raw_async(addr: SocketAddr, request: String, quiet: Duration) -> Answer {
    actix_rt::task::spawn_blocking(move || raw(addr, request.as_bytes(), quiet))
        .await
        .expect("raw client thread")
}

/// The `server` example as a child process on a free port.
pub struct ServerChild {
    pub child: Child,
    pub base: String,
    /// The stdout lines after `listening on`.
    pub lines: mpsc::Receiver<String>,
}

impl ServerChild {
    /// Starts `server --addr 127.0.0.1:0 --db <db> <extra…>` and waits until it listens.
    pub fn spawn(db: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(server_binary())
            .args(["--addr", "127.0.0.1:0", "--db"])
            .arg(db)
            .args(extra)
            .env_remove("DURABLE_SESSIONS_TOKEN")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the server example");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(base) = line.strip_prefix("listening on ") {
                        let base = base.trim().to_owned();
                        return Self { child, base, lines };
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the server example did not start listening: {e}");
                }
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.base
            .trim_start_matches("http://")
            .parse()
            .expect("host:port")
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

/// Runs the `server` example with `args` until it exits (it must, within [`WAIT`]); returns
/// whether it succeeded and what it wrote to stdout and stderr.
pub fn run_server_to_exit(args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(server_binary())
        .args(args)
        .env_remove("DURABLE_SESSIONS_TOKEN")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server example");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server example {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    let _ = child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out);
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    (status.success(), out, err)
}
