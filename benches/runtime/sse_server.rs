//! The `sse` scenario's server: a child process (`DS_BENCH_CHILD=sse-server`) serving the HTTP
//! adapter (`http::serve`, two workers) over a runtime whose runner publishes timestamped
//! events. It prints `DS_BENCH_SSE_LISTENING <addr> <pid>` once it listens and stops when its
//! stdin closes. Its CPU time and RSS are read by the parent from `/proc/<pid>`.

use std::io::{BufRead, Write};
use std::net::TcpListener;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::{web, App};
use durable_sessions::http::{self, HttpOptions, ServeOptions};
use durable_sessions::{RunError, Runner, Runtime, Synchronous, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use crate::BenchResult;

/// The line the parent waits for.
pub const LISTENING: &str = "DS_BENCH_SSE_LISTENING ";

/// Nanoseconds since the Unix epoch (the same clock in both processes).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// For each promoted prompt `{"events": n, "gap_ms": g}`: publishes `n` `bench.tick` events
/// `{"t": <unix ns just before the publish>, "i"}`, `g` ms apart, then appends one `assistant`
/// message. Promotes one queued prompt per turn (each runs in a turn of its own) and every
/// steer prompt.
struct Ticks;

impl Runner for Ticks {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        async move {
            let mut prompts = turn.promote_steer(None).await?;
            prompts.extend(turn.promote_queue().await?);
            for prompt in prompts {
                let n = prompt.prompt["events"].as_u64().unwrap_or(0);
                let gap = Duration::from_millis(prompt.prompt["gap_ms"].as_u64().unwrap_or(0));
                let mut commits = Vec::new();
                for i in 0..n {
                    if !gap.is_zero() {
                        actix_rt::time::sleep(gap).await;
                    }
                    let t = unix_nanos();
                    let tick = json!({ "t": t, "i": i });
                    turn.publish("bench.tick", tick).await?;
                    commits.push(unix_nanos().saturating_sub(t));
                }
                if !gap.is_zero() && !commits.is_empty() {
                    // The hot session's ticks: how long `publish` (its commit) took.
                    commits.sort_unstable();
                    let ms = |q: usize| commits[(commits.len() - 1) * q / 100] as f64 / 1e6;
                    eprintln!(
                        "[bench] sse server: {n} ticks {} ms apart, publish (commit) p50 {:.2} \
                         ms, p99 {:.2} ms",
                        gap.as_millis(),
                        ms(50),
                        ms(99)
                    );
                }
                let reply = json!({ "reply_to": prompt.id });
                turn.append_message("assistant", reply).await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// The baseline: a bare actix-web streaming response (one comment, then nothing, forever) on
/// the same server, so an idle connection costs what actix-web needs and nothing of ours.
async fn bare_stream() -> actix_web::HttpResponse {
    let hello = futures::stream::once(async {
        Ok::<_, std::convert::Infallible>(web::Bytes::from_static(b": bare\n\n"))
    });
    actix_web::HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(futures::StreamExt::chain(hello, futures::stream::pending()))
}

/// The hot-session baseline: a bare actix-web fan-out (a tokio broadcast channel, one
/// streaming response per subscriber, no runtime, no store) on the same server, publishing the
/// same `bench.tick` frames, so its publish → receive latency is what actix-web and the
/// sockets cost on this machine.
#[derive(Clone)]
struct BareHot {
    ticks: tokio::sync::broadcast::Sender<web::Bytes>,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl BareHot {
    fn new() -> Self {
        Self {
            ticks: tokio::sync::broadcast::channel(1024).0,
            open: Default::default(),
        }
    }
}

/// Counts an open bare hot stream while it lives.
struct Open(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `GET /bench/bare-hot`: every tick published from now on, as an SSE frame.
async fn bare_hot_stream(hot: web::Data<BareHot>) -> actix_web::HttpResponse {
    hot.open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let open = Open(hot.open.clone());
    let ticks = hot.ticks.subscribe();
    let hello = futures::stream::once(async {
        Ok::<_, std::convert::Infallible>(web::Bytes::from_static(b": bare hot\n\n"))
    });
    let frames = futures::stream::unfold((ticks, open), |(mut ticks, open)| async move {
        loop {
            match ticks.recv().await {
                Ok(frame) => return Some((Ok(frame), (ticks, open))),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    actix_web::HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(futures::StreamExt::chain(hello, frames))
}

/// `GET /bench/bare-hot/open`: how many bare hot streams are open.
async fn bare_hot_open(hot: web::Data<BareHot>) -> actix_web::HttpResponse {
    let open = hot.open.load(std::sync::atomic::Ordering::Relaxed);
    actix_web::HttpResponse::Ok().json(json!({ "open": open }))
}

/// `POST /bench/bare-hot/publish` `{"events": n, "gap_ms": g}`: publishes `n` ticks `g` ms
/// apart, each stamped just before its send, as the runner stamps its own before `publish`.
async fn bare_hot_publish(hot: web::Data<BareHot>, body: web::Bytes) -> actix_web::HttpResponse {
    let args: Value = serde_json::from_slice(&body).unwrap_or_default();
    let n = args["events"].as_u64().unwrap_or(0);
    let gap = Duration::from_millis(args["gap_ms"].as_u64().unwrap_or(0));
    let ticks = hot.ticks.clone();
    actix_rt::spawn(async move {
        for i in 0..n {
            actix_rt::time::sleep(gap).await;
            let t = unix_nanos();
            let data = json!({ "t": t, "i": i });
            let frame = format!("event: bench.tick\ndata: {data}\n\n");
            let _ = ticks.send(web::Bytes::from(frame));
        }
    });
    actix_web::HttpResponse::Accepted().json(json!({ "events": n }))
}

/// The child's entry point: `{"db": path}`.
pub fn child(args: &Value) -> BenchResult<Value> {
    let db = args["db"]
        .as_str()
        .ok_or("sse-server needs `db`")?
        .to_owned();
    actix_rt::System::new().block_on(async move {
        let runtime = Runtime::builder()
            .database(db)
            .runner(Ticks)
            .synchronous(Synchronous::Normal)
            .idle_timeout(Duration::from_secs(3600))
            .start()
            .await?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let app_runtime = runtime.clone();
        let bare_hot = web::Data::new(BareHot::new());
        let options = ServeOptions {
            workers: Some(2),
            shutdown_timeout: Duration::from_secs(1),
            signals: false,
        };
        let server = http::serve(vec![listener], &options, move || {
            App::new()
                .configure(http::configure(app_runtime.clone(), HttpOptions::new()))
                .route("/bench/bare", web::get().to(bare_stream))
                .app_data(bare_hot.clone())
                .route("/bench/bare-hot", web::get().to(bare_hot_stream))
                .route("/bench/bare-hot/open", web::get().to(bare_hot_open))
                .route("/bench/bare-hot/publish", web::post().to(bare_hot_publish))
                .default_service(web::to(http::not_found))
        })?;
        let handle = server.handle();
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{LISTENING}{addr} {}", std::process::id())?;
            out.flush()?;
        }
        // Stop when the parent closes our stdin; `trim` lines give freed memory back to the OS
        // (glibc keeps it otherwise), so RSS reflects what is live.
        let (stop_tx, stop_rx) = futures::channel::oneshot::channel::<()>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if line.trim() == "trim" {
                    trim();
                }
            }
            let _ = stop_tx.send(());
        });
        actix_rt::spawn(async move {
            let _ = stop_rx.await;
            handle.stop(false).await;
        });
        server.await?;
        runtime.shutdown().await;
        Ok(json!({ "stopped": true }))
    })
}

/// `malloc_trim(0)`: returns glibc's free memory (of every arena) to the OS.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` only releases free memory; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
