//! The demo server: the HTTP/SSE API (`durable_sessions::http`) over a runtime whose runner is an
//! "echo agent", so you can watch a turn stream, interrupt it, or `kill -9` the process mid-turn
//! and see the turn resume after a restart.
//!
//! ```text
//! cargo run --release --example server -- --help
//! ```
//!
//! The echo agent, for every drain: promotes the pending `steer` prompts, then the oldest
//! pending `queue` prompt (one per turn: the runtime runs the next queued prompt in a turn of
//! its own); then answers what it promoted, word by word. A turn the restart sweep resumed
//! also answers the prompts its resumption names (`Turn::resumption`: what the killed attempt
//! promoted and had not answered), and nothing else: a prompt whose reply a user interrupted
//! stays unanswered, across restarts and explicit resumes. Each word is a **live-only**
//! `agent.delta` event (`{"reply_to", "index", "word"}`, `Turn::publish_live`) published after
//! `--word-delay-ms`: open streams show it (an SSE frame without `id:`), the database never
//! stores it. The finished reply is appended **once** to the transcript as an `assistant`
//! message (`{"text", "reply_to"}`), so the transcript never holds half a reply and the event
//! log grows by one event per reply, not one per word. Steer prompts that arrive while it
//! replies are answered in the same turn.
//!
//! Its cost per drain does not grow with the session: it reads only the transcript from the
//! oldest prompt it answers onwards (`Turn::context_after`, from that prompt's promotion seq),
//! never the whole history.
//!
//! Resuming: if the process dies mid-reply, the prompt is already in the transcript (it was
//! promoted by the killed turn) but has no reply. At the next boot the restart sweep publishes
//! the `session.synthetic` continue notice and resumes the turn; its resumption names the
//! prompt, so the agent publishes `agent.continuing` (`{"reply_to", "text"}`) and replies from
//! the first word again (the deltas of the killed attempt were progress, never stored). A
//! prompt acknowledged (202) just before the kill, whose turn never started, is run by the
//! sweep the same way, without the client sending it again.
//!
//! Ctrl-C (SIGINT) or SIGTERM stops the HTTP server, then shuts the runtime down gracefully:
//! a running turn records `interrupted{shutdown}` and keeps its claim, so the next boot resumes
//! it too.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use actix_web::{web, App};
use clap::Parser;
use durable_sessions::http::{self, HttpOptions};
use durable_sessions::{
    Admission, Delivery, Message, MessageId, RetainEvents, RunError, Runner, Runtime, Turn,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::json;

type Fallible<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// `--version`: the crate's version and the cargo features this binary was built with (the
/// tests check them before they run it).
const VERSION: &str = match (cfg!(feature = "postgres"), cfg!(feature = "crash-points")) {
    (false, false) => concat!(env!("CARGO_PKG_VERSION"), " (features: http)"),
    (true, false) => concat!(env!("CARGO_PKG_VERSION"), " (features: http postgres)"),
    (false, true) => concat!(env!("CARGO_PKG_VERSION"), " (features: http crash-points)"),
    (true, true) => concat!(
        env!("CARGO_PKG_VERSION"),
        " (features: http postgres crash-points)"
    ),
};

/// durable-sessions demo server: the HTTP/SSE API (and the console at /console) over an echo
/// agent.
#[derive(Debug, Parser)]
#[command(name = "server", version = VERSION)]
struct Args {
    /// Address to bind, as host:port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// The SQLite database file, or a postgres://… URL shared by several nodes (built with
    /// `--features postgres`).
    #[arg(long, default_value = "durable-sessions.db")]
    db: PathBuf,
    /// This node's name, with PostgreSQL [default: host-pid].
    #[arg(long = "node-name")]
    node_name: Option<String>,
    /// This node's lease in milliseconds, with PostgreSQL.
    #[arg(long = "lease-ms", default_value_t = 10_000, value_name = "MS")]
    lease_ms: u64,
    /// Require `Authorization: Bearer <token>` on every route but /healthz and the console page.
    #[arg(long, env = "DURABLE_SESSIONS_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Allow cross-origin calls (CORS) from this web origin, e.g. http://localhost:5173;
    /// repeat for more.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Also answer requests whose Host header names NAME (any port; `*` for any host); repeat
    /// for more. localhost, 127.0.0.1 and [::1] are always answered; on a loopback --addr
    /// nothing else is unless named here (DNS rebinding), elsewhere any host is unless some are
    /// named.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Restart-resumes per turn before it is aborted.
    #[arg(long, default_value_t = 10)]
    max_resume_attempts: u32,
    /// The echo agent's delay per word, in milliseconds.
    #[arg(long = "word-delay-ms", default_value_t = 200, value_name = "MS")]
    word_delay_ms: u64,
    /// How long a request body may take to arrive, in milliseconds (408 after).
    #[arg(long = "body-timeout-ms", default_value_t = 5000, value_name = "MS")]
    body_timeout_ms: u64,
    /// Retention: keep only each idle session's newest N events (the transcript is kept whole;
    /// a replay from before the kept part answers 410). Off unless given.
    #[arg(long = "retain-events", value_name = "N")]
    retain_events: Option<u64>,
    /// Retention: how long a session must be idle before its log is compacted, in milliseconds.
    #[arg(
        long = "retain-after-idle-ms",
        default_value_t = 600_000,
        value_name = "MS",
        requires = "retain_events"
    )]
    retain_after_idle_ms: u64,
}

/// Writes a line to stdout, ignoring a closed stdout (`server | head -1`): the server's life
/// never depends on its output.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// The demo runner (see the module docs).
struct EchoAgent {
    word_delay: Duration,
}

/// The text of a user message: the prompt's `text`, the prompt if it is a string, else its JSON.
fn prompt_text(message: &Message) -> String {
    let prompt = &message.data["prompt"];
    prompt["text"]
        .as_str()
        .or_else(|| prompt.as_str())
        .map_or_else(|| prompt.to_string(), str::to_owned)
}

/// The user messages of the transcript that no assistant message replies to, in order.
fn unanswered(transcript: &[Message]) -> Vec<&Message> {
    let answered: HashSet<&str> = transcript
        .iter()
        .filter(|m| m.kind == "assistant")
        .filter_map(|m| m.data["reply_to"].as_str())
        .collect();
    transcript
        .iter()
        .filter(|m| m.kind == "user" && !answered.contains(m.id.as_str()))
        .collect()
}

/// Streams the reply to `to` word by word (live-only: never stored), then appends it to the
/// transcript.
async fn reply(turn: &Turn, to: &MessageId, text: &str, delay: Duration) -> Result<(), RunError> {
    let mut words = vec!["echo:"];
    words.extend(text.split_whitespace());
    if words.len() == 1 {
        words.push("(nothing)");
    }
    for (index, word) in words.iter().enumerate() {
        actix_rt::time::sleep(delay).await;
        turn.publish_live(
            "agent.delta",
            json!({ "reply_to": to, "index": index, "word": word }),
        )?;
    }
    turn.append_message(
        "assistant",
        json!({ "text": words.join(" "), "reply_to": to }),
    )
    .await?;
    Ok(())
}

impl Runner for EchoAgent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let delay = self.word_delay;
        async move {
            // A turn resumed after a restart finishes exactly what the killed attempt had
            // promoted and not answered, as the resumption says: never a prompt an earlier turn
            // answered, never one a user interrupted. Anything else is answered only by the
            // drain that promotes it, so an explicit resume (`POST /resume`) answers only what
            // is pending, and a prompt whose reply a user interrupted stays unanswered.
            let inputs = turn.resumption().map_or(&[][..], |r| r.inputs.as_slice());
            // One queued prompt per turn: a turn resuming one promotes no other.
            let mut first = !inputs.iter().any(|a| a.delivery == Delivery::Queue);
            let mut resumed: Vec<Admission> = inputs.to_vec();
            loop {
                let mut promoted: Vec<Admission> = turn.promote_steer(None).await?;
                if std::mem::take(&mut first) {
                    // One queued prompt per turn: the runtime starts the next turn for the next.
                    promoted.extend(turn.promote_queue().await?);
                }
                // A prompt's transcript message has its promotion's seq, and a reply to it comes
                // after it: reading from the oldest prompt to answer is enough, however long the
                // session is (and nothing is read when there is nothing to answer). An input
                // without a promotion seq (a resumption never holds one) reads it all.
                let Some(oldest) = resumed
                    .iter()
                    .chain(&promoted)
                    .map(|a| a.promoted_seq)
                    .min()
                else {
                    return Ok(());
                };
                let resumed_ids: Vec<MessageId> =
                    std::mem::take(&mut resumed).into_iter().map(|a| a.id).collect();
                let promoted: Vec<MessageId> = promoted.into_iter().map(|a| a.id).collect();
                let after = oldest.and_then(|seq| seq.checked_sub(1));
                let transcript = turn.context_after(after).await?;
                let open: Vec<&Message> = unanswered(&transcript);
                let text_of = |id: &MessageId| {
                    open.iter()
                        .find(|m| &m.id == id && !m.interrupted)
                        .map(|m| prompt_text(m))
                };
                let mut todo: Vec<(MessageId, String, bool)> = Vec::new();
                for id in resumed_ids {
                    if let Some(text) = text_of(&id) {
                        todo.push((id, text, true));
                    }
                }
                for id in promoted {
                    if let Some(text) = text_of(&id) {
                        todo.push((id, text, false));
                    }
                }
                if todo.is_empty() {
                    return Ok(());
                }
                for (id, text, continuing) in todo {
                    if continuing {
                        turn.publish(
                            "agent.continuing",
                            json!({
                                "reply_to": id,
                                "text": "The server restarted before this was answered; answering it now.",
                            }),
                        )
                        .await?;
                    }
                    reply(&turn, &id, &text, delay).await?;
                }
            }
        }
        .boxed_local()
    }
}

/// Prints the address and the commands to try.
fn print_banner(addr: SocketAddr, args: &Args) {
    let base = format!("http://{addr}");
    let auth = if args.token.is_some() {
        " -H \"Authorization: Bearer $DURABLE_SESSIONS_TOKEN\""
    } else {
        ""
    };
    say!("listening on {base}");
    say!("the console: {base}/console");
    say!(
        "database {} (pid {}, word delay {} ms, max resume attempts {})",
        args.db.display(),
        std::process::id(),
        args.word_delay_ms,
        args.max_resume_attempts
    );
    if let Some(keep_last) = args.retain_events {
        say!(
            "retention: each session idle for {} ms keeps its newest {keep_last} events \
             (its transcript whole)",
            args.retain_after_idle_ms
        );
    }
    say!(
        "\nTry, in a second terminal:\n\
         \x20 curl -s{auth} -X POST {base}/sessions -H 'content-type: application/json' -d '{{\"id\": \"demo\"}}'\n\
         \x20 curl -N{auth} {base}/sessions/demo/events          # watch; keep it open\n\
         and in a third:\n\
         \x20 curl -s{auth} -X POST {base}/sessions/demo/prompt -H 'content-type: application/json' -d '{{\"text\": \"the quick brown fox jumps over the lazy dog\"}}'\n\
         \x20 curl -s{auth} -X POST {base}/sessions/demo/interrupt\n\
         \x20 curl -s{auth} '{base}/sessions/demo/messages?order=asc'\n\
         \x20 curl -s{auth} {base}/stats\n\
         Prompt again and `kill -9 {pid}` mid-reply, start the server again, and watch the turn\n\
         resume (`curl -N{auth} {base}/sessions/demo/events`). Ctrl-C stops gracefully.\n",
        pid = std::process::id(),
    );
    if args.token.is_none() && !addr.ip().is_loopback() {
        say!("warning: listening on {addr} without a token; anyone who can reach it can use it");
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed at once, before the
/// banner says the server is up, so an early signal is never lost.
fn stop_signal() -> std::io::Result<LocalBoxFuture<'static, ()>> {
    #[cfg(unix)]
    {
        use actix_rt::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        Ok(async move {
            futures::future::select(Box::pin(interrupt.recv()), Box::pin(terminate.recv())).await;
        }
        .boxed_local())
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = actix_rt::signal::ctrl_c().await;
    }
    .boxed_local())
}

/// Binds every address `addr` resolves to, as `HttpServer::bind` does (it succeeds when any
/// binds), so a busy port fails before the runtime touches the database.
fn listen_on(addr: &str) -> Fallible<Vec<TcpListener>> {
    let fail = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
    let port = addr.rsplit_once(':').map(|(_, port)| port.parse::<u16>());
    if !matches!(port, Some(Ok(_))) {
        return Err(
            format!("cannot listen on {addr:?}: expected host:port, e.g. 127.0.0.1:8080").into(),
        );
    }
    let mut listeners = Vec::new();
    let mut error = None;
    let sockets = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot listen on {addr}: cannot resolve its host: {e}"))?;
    for socket in sockets {
        match TcpListener::bind(socket) {
            Ok(listener) => listeners.push(listener),
            Err(e) => error = Some(e),
        }
    }
    match error {
        Some(e) if listeners.is_empty() => Err(fail(e).into()),
        None if listeners.is_empty() => Err(format!("cannot listen on {addr}: no address").into()),
        _ => Ok(listeners),
    }
}

async fn run(args: Args) -> Fallible {
    let listeners = listen_on(&args.addr)?;
    if args.db.is_dir() {
        return Err(format!(
            "cannot open the database {}: it is a directory",
            args.db.display()
        )
        .into());
    }
    let mut builder = Runtime::builder()
        .database(&args.db)
        .lease(Duration::from_millis(args.lease_ms));
    if let Some(name) = &args.node_name {
        builder = builder.node_name(name);
    }
    if let Some(keep_last) = args.retain_events {
        builder = builder.retain_events(RetainEvents::new(
            keep_last,
            Duration::from_millis(args.retain_after_idle_ms),
        ));
    }
    let runtime = builder
        .runner(EchoAgent {
            word_delay: Duration::from_millis(args.word_delay_ms),
        })
        .max_resume_attempts(args.max_resume_attempts)
        .after_passivation(return_freed_memory)
        .start() // runs the restart sweep: turns a crash left behind resume now
        .await
        .map_err(|e| format!("cannot open the database {}: {e}", args.db.display()))?;
    let mut options = HttpOptions::new()
        .token(args.token.clone())
        .body_timeout(Duration::from_millis(args.body_timeout_ms));
    for origin in &args.cors_origins {
        options = options.cors_origin(origin);
    }
    options = options.allowed_hosts(&args.allowed_hosts);
    let app_runtime = runtime.clone();
    let addr = listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .ok_or("bound to no address")?;
    // `http::serve`: actix-web's HTTP/1.1 service with JSON bodies on the HTTP layer's own
    // errors, and a client that hangs up noticed at once. Signals are handled below, so the
    // runtime shuts down after the server; event streams never end on their own, hence the
    // short shutdown timeout.
    let server = http::serve(listeners, &http::ServeOptions::default(), move || {
        App::new()
            .configure(http::configure(app_runtime.clone(), options.clone()))
            .default_service(web::to(http::not_found))
    })?;
    let handle = server.handle();
    let stop = stop_signal()?;
    print_banner(addr, &args);
    actix_rt::spawn(async move {
        stop.await;
        log::info!("stopping: the HTTP server first, then the runtime (turns keep their claims)");
        handle.stop(true).await;
    });
    server.await?;
    runtime.shutdown().await;
    log::info!("stopped");
    Ok(())
}

/// Gives the memory of passivated sessions back to the OS: glibc malloc never returns free
/// chunks that sit between live ones by itself (installed with `after_passivation`).
fn return_freed_memory(stopped: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` only releases free memory of glibc's arenas; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
    log::debug!("{stopped} idle sessions passivated; freed memory returned to the OS");
}

/// Fixes glibc's `M_TRIM_THRESHOLD` at its default (128 KiB) before the server allocates: glibc
/// otherwise raises it (up to 64 MiB) whenever a large block is freed, and `malloc_trim` does not
/// trim the top of a thread's arena, so memory freed there could stay resident.
fn fix_trim_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `mallopt` sets an allocator parameter; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

fn main() {
    fix_trim_threshold();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if let Err(e) = actix_rt::System::new().block_on(run(args)) {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "server failed: {e}");
        std::process::exit(1);
    }
}
