//! The operator console (`GET /console`) in a real browser: headless Chromium driven through
//! chromedriver (WebDriver, with fantoccini) against the `server` example run as a child process
//! behind a token. The test opens the console, gives it the token, creates a session, prompts,
//! watches the reply stream in word by word (an `EventSource` opened with a ticket), interrupts
//! it, and checks the page's DOM: the sessions list, the transcript (the prompt marked
//! interrupted), the event log and the `/stats` figures. It also checks, from the page, that a
//! foreign origin's request is refused and that `EventSource` frames never reach `onmessage`,
//! and finally deletes the session from its page (the list then no longer shows it).
//!
//! Two more tests run the runtime and the server in the test itself, with a runner of two
//! durable steps, and check the page's steps panel: as a turn runs, fails and is retried from
//! the page; as another is interrupted inside a step (which leaves the step ambiguous); and
//! after a restart cut a step off (ambiguous while the turn's second attempt runs, then run
//! again and completed).
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them). Without
//! them each test prints one line saying it was skipped and why, and passes, except under
//! `CI=true`, where it fails. `UPDATE_CONSOLE_SCREENSHOT=1` writes `docs/console.png`.
#![cfg(feature = "http")]

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{web, App};
use durable_sessions::http::{self, HttpOptions};
use durable_sessions::testing::Gate;
use durable_sessions::{RunError, Runner, Runtime, Turn};
use fantoccini::{ClientBuilder, Locator};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use common::web::{ServerChild, WebServer};

/// How long the browser may take for anything.
const BROWSER_WAIT: Duration = Duration::from_secs(30);

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// chromedriver and chromium, or why the test cannot run.
fn browser() -> Result<(PathBuf, PathBuf), String> {
    let driver = on_path(&["chromedriver"]).ok_or("chromedriver is not installed")?;
    let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"])
        .ok_or("chromium is not installed")?;
    Ok((driver, chromium))
}

/// chromedriver and chromium, or `None` once it said why `test` is skipped (under `CI=true`, it
/// fails instead).
fn browser_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    match browser() {
        Ok(found) => Some(found),
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the browser test cannot run under CI: {why} (apt-get install chromium chromium-driver)"
            );
            let _ = writeln!(
                std::io::stderr().lock(),
                "http_console: skipped {test}: {why} (apt-get install chromium chromium-driver to run it)"
            );
            None
        }
    }
}

/// A headless Chromium session through `driver`.
async fn open_browser(driver: &Driver, chromium: &Path) -> fantoccini::Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,860"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a browser session")
}

/// chromedriver as a child process, killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(driver: &PathBuf) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + BROWSER_WAIT;
        // A bare connect, no request: it only asks whether chromedriver listens yet.
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Evaluates `script` (a JavaScript function body) in the page until it returns `true`.
async fn until(client: &fantoccini::Client, what: &str, script: &str) {
    let deadline = Instant::now() + BROWSER_WAIT;
    loop {
        let value = client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{what}: script failed: {e}"));
        if value == json!(true) {
            return;
        }
        if Instant::now() > deadline {
            let page = client.source().await.unwrap_or_default();
            panic!("timed out waiting for {what}; the page:\n{page}");
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn text(client: &fantoccini::Client, script: &str) -> String {
    client
        .execute(script, vec![])
        .await
        .expect("script")
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[actix_rt::test]
async fn the_console_creates_prompts_streams_and_interrupts_in_a_browser() {
    let Some((driver, chromium)) =
        browser_or_skip("the_console_creates_prompts_streams_and_interrupts_in_a_browser")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerChild::spawn(
        &dir.path().join("console.db"),
        &["--word-delay-ms", "250", "--token", "console-token"],
    );
    let base = server.base.clone();
    let driver = Driver::start(&driver);
    let client = open_browser(&driver, &chromium).await;

    client
        .goto(&format!("{base}/console"))
        .await
        .expect("open the console");
    // Without the token the page says what failed.
    until(
        &client,
        "the 401 shown",
        "return document.getElementById('error').textContent.includes('401');",
    )
    .await;
    let token = client
        .find(Locator::Id("token-input"))
        .await
        .expect("token field");
    token.send_keys("console-token").await.expect("type");
    client
        .find(Locator::Id("token-save"))
        .await
        .expect("use")
        .click()
        .await
        .expect("click");
    until(
        &client,
        "the stats",
        "return !!document.querySelector('[data-stat=event_streams]');",
    )
    .await;

    let create = client
        .find(Locator::Id("create-id"))
        .await
        .expect("create field");
    create.send_keys("browser").await.expect("type");
    client
        .find(Locator::Css("#create-form button"))
        .await
        .expect("create")
        .click()
        .await
        .expect("click");
    until(
        &client,
        "the new session in the list",
        "const r = document.querySelector('tr.session[data-id=browser]'); \
         return !!r && r.textContent.includes('idle');",
    )
    .await;
    client
        .find(Locator::Css("tr.session[data-id=browser]"))
        .await
        .expect("the row")
        .click()
        .await
        .expect("open the session");
    until(
        &client,
        "the replayed event log",
        "return !!document.querySelector('#log [data-type=\"session.created\"]');",
    )
    .await;

    client
        .find(Locator::Id("prompt-text"))
        .await
        .expect("prompt field")
        .send_keys("one two three four five six seven eight nine ten eleven twelve")
        .await
        .expect("type");
    client
        .find(Locator::Id("prompt-send"))
        .await
        .expect("send")
        .click()
        .await
        .expect("click");
    until(
        &client,
        "the reply streaming in",
        "return document.getElementById('live').textContent.startsWith('echo: one two');",
    )
    .await;
    let status = text(
        &client,
        "return document.getElementById('session-status').textContent;",
    )
    .await;
    assert!(status.contains("turn running"), "{status}");
    // The screenshot of the console mid-reply.
    let png = client.screenshot().await.expect("a screenshot");
    if std::env::var_os("UPDATE_CONSOLE_SCREENSHOT").is_some() {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
        std::fs::create_dir_all(&docs).expect("docs/");
        std::fs::write(docs.join("console.png"), &png).expect("write docs/console.png");
    }
    client
        .find(Locator::Id("interrupt"))
        .await
        .expect("interrupt")
        .click()
        .await
        .expect("click");
    until(
        &client,
        "the interrupt in the event log and the status",
        "return !!document.querySelector('#log [data-type=\"session.execution.interrupted\"]') \
         && document.getElementById('session-status').textContent.includes('interrupted');",
    )
    .await;
    until(
        &client,
        "the prompt marked interrupted in the transcript",
        "const u = document.querySelector('#transcript .msg.user'); \
         return !!u && u.textContent.includes('interrupted') && u.textContent.includes('one two');",
    )
    .await;
    let deltas = client
        .execute(
            "return document.querySelectorAll('#log [data-type=\"agent.delta\"]').length;",
            vec![],
        )
        .await
        .expect("count");
    let deltas = deltas.as_u64().unwrap_or(0);
    assert!(
        (2..13).contains(&deltas),
        "some words, not the whole reply: {deltas}"
    );
    let assistant = client
        .execute(
            "return document.querySelectorAll('#transcript .msg.assistant').length;",
            vec![],
        )
        .await
        .expect("count");
    assert_eq!(
        assistant,
        json!(0),
        "an interrupted reply is never appended"
    );

    // The list, live: the session's row shows its last terminal.
    client
        .goto(&format!("{base}/console#/"))
        .await
        .expect("the list");
    until(
        &client,
        "the row with its last terminal",
        "const r = document.querySelector('tr.session[data-id=browser]'); \
         return !!r && r.textContent.includes('interrupted (user)');",
    )
    .await;
    let sessions_live = text(
        &client,
        "const s = document.querySelector('[data-stat=sessions_live] b'); return s ? s.textContent : '';",
    )
    .await;
    assert!(!sessions_live.is_empty(), "the stats are shown");

    // From the page: named frames never reach `onmessage`, and a fetch from this origin is
    // allowed (it is the server's own).
    let checked = client
        .execute_async(
            "const done = arguments[0];
             const token = 'console-token';
             fetch('/sessions/browser/events/ticket', {method: 'POST', headers: {Authorization: 'Bearer ' + token}})
               .then(r => r.json())
               .then(({ticket}) => {
                 const es = new EventSource('/sessions/browser/events?ticket=' + encodeURIComponent(ticket));
                 let onmessage = 0, named = 0;
                 es.onmessage = () => { onmessage += 1; };
                 es.addEventListener('session.created', () => { named += 1; });
                 setTimeout(() => { es.close(); done({onmessage, named}); }, 1500);
               })
               .catch(e => done({error: String(e)}));",
            vec![],
        )
        .await
        .expect("the page's own EventSource");
    assert_eq!(checked, json!({ "onmessage": 0, "named": 1 }), "{checked}");

    // Delete it from its page: after the confirmation, back to the list, without its row.
    client
        .goto(&format!("{base}/console#/s/browser"))
        .await
        .expect("the session again");
    until(
        &client,
        "the session's page",
        "return !!document.querySelector('#log [data-type=\"session.created\"]');",
    )
    .await;
    client
        .find(Locator::Id("delete"))
        .await
        .expect("delete")
        .click()
        .await
        .expect("click");
    client.accept_alert().await.expect("confirm the deletion");
    until(
        &client,
        "the list without the deleted session",
        "return !document.getElementById('list-view').hidden \
         && !document.querySelector('tr.session[data-id=browser]') \
         && !document.getElementById('error').textContent;",
    )
    .await;
    client.close().await.expect("close the browser");
    drop(server);
}

/// Answers each input with two durable steps: `look up` completes at once with
/// `{"found": <the prompt's text>}`; `act` waits for the gate, then fails on the turn's first
/// attempt and completes on a later one. On the prompt `hang`, the first attempt's `act` never
/// returns, and a later attempt waits for the gate before it starts `act` again.
#[derive(Clone)]
struct TwoSteps {
    gate: Gate,
}

impl Runner for TwoSteps {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let gate = self.gate.clone();
        async move {
            for input in turn.take_inputs().await? {
                let text = input.prompt["text"].as_str().unwrap_or_default().to_owned();
                let found = text.clone();
                let _: Value = turn
                    .step("look up", |_| async move {
                        Ok::<_, String>(json!({ "found": found }))
                    })
                    .await?;
                let hang = text == "hang";
                if hang && turn.attempt() > 1 {
                    gate.wait().await;
                }
                let gate = gate.clone();
                let done: String = turn
                    .step("act", |ctx| async move {
                        if hang && ctx.turn_attempt() == 1 {
                            std::future::pending::<()>().await;
                        }
                        gate.wait().await;
                        match ctx.turn_attempt() {
                            1 => Err("the provider refused".to_owned()),
                            n => Ok(format!("done by attempt {n}")),
                        }
                    })
                    .await?;
                turn.append_message("assistant", json!({ "text": done }))
                    .await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// The steps panel's row of `step`, as `status|attempts|key|outcome` (empty when absent).
async fn step_row(client: &fantoccini::Client, step: &str) -> String {
    text(
        client,
        &format!(
            "const r = document.querySelector('#steps tr[data-step=\"{step}\"]'); \
             return r ? [r.dataset.status, ...[2, 3, 4].map(i => r.children[i].textContent)] \
             .join('|') : '';"
        ),
    )
    .await
}

/// Waits until the steps panel shows `step` with a status of `status`.
async fn until_step(client: &fantoccini::Client, step: &str, status: &str) {
    until(
        client,
        &format!("step {step} {status}"),
        &format!(
            "const r = document.querySelector('#steps tr[data-step=\"{step}\"]'); \
             return !!r && r.dataset.status === '{status}' \
             && r.querySelector('.pill').textContent === '{status}';"
        ),
    )
    .await;
}

async fn click(client: &fantoccini::Client, id: &str) {
    client
        .find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click #{id}: {e}"));
}

/// Opens `session`'s page and sends `prompt` from it.
async fn prompt_from_page(client: &fantoccini::Client, base: &str, session: &str, prompt: &str) {
    client
        .goto(&format!("{base}/console#/s/{session}"))
        .await
        .expect("the session's page");
    until(
        client,
        "the session's page, its log replayed",
        &format!(
            "return document.getElementById('session-title').textContent === '{session}' \
             && !!document.querySelector('#log [data-type=\"session.created\"]');"
        ),
    )
    .await;
    client
        .find(Locator::Id("prompt-text"))
        .await
        .expect("prompt field")
        .send_keys(prompt)
        .await
        .expect("type");
    click(client, "prompt-send").await;
}

#[actix_rt::test]
async fn the_console_shows_a_turns_steps() {
    let Some((driver, chromium)) = browser_or_skip("the_console_shows_a_turns_steps") else {
        return;
    };
    let gate = Gate::new();
    let server =
        WebServer::start_with(HttpOptions::default(), TwoSteps { gate: gate.clone() }).await;
    let base = server.base();
    common::create(&server.runtime, "steps", None).await;
    common::create(&server.runtime, "cut", None).await;
    let driver = Driver::start(&driver);
    let client = open_browser(&driver, &chromium).await;

    // The first attempt: `look up` completed, `act` running (its body waits on the gate).
    prompt_from_page(&client, &base, "steps", "fail once").await;
    until_step(&client, "act", "running").await;
    let turn = text(
        &client,
        "return document.getElementById('turn').textContent;",
    )
    .await;
    let id = text(
        &client,
        "return document.getElementById('turn').dataset.turn;",
    )
    .await;
    assert!(!id.is_empty(), "the turn id is shown: {turn}");
    assert_eq!(turn, format!("#{id} · attempt 1 · live"));
    let claim = text(
        &client,
        "return document.querySelector('#log [data-type=\"session.execution.started\"] .seq') \
         .textContent;",
    )
    .await;
    assert_eq!(id, claim, "the turn's id is the seq of its claim");
    assert_eq!(
        step_row(&client, "look up").await,
        format!("completed|1|steps:{id}:look up|{{\"found\":\"fail once\"}}")
    );
    assert_eq!(
        step_row(&client, "act").await,
        format!("running|1|steps:{id}:act|")
    );
    let retry_hidden = "return document.getElementById('retry').hidden;";
    assert_eq!(
        client.execute(retry_hidden, vec![]).await.expect("script"),
        json!(true)
    );

    // `act` fails, and with it the turn: the page offers a retry.
    gate.release();
    until_step(&client, "act", "failed").await;
    until(
        &client,
        "the failed turn and the retry button",
        "return document.getElementById('turn').textContent.endsWith('attempt 1 · failed') \
         && !document.getElementById('retry').hidden;",
    )
    .await;
    assert_eq!(
        step_row(&client, "act").await,
        format!("failed|1|steps:{id}:act|the provider refused")
    );

    // The retry, from the page: the same turn's second attempt replays `look up` and runs `act`
    // again, which completes.
    click(&client, "retry").await;
    until_step(&client, "act", "completed").await;
    until(
        &client,
        "the retried turn succeeded, no retry offered",
        &format!(
            "return document.getElementById('turn').textContent === '#{id} · attempt 2 · succeeded' \
             && document.getElementById('retry').hidden;"
        ),
    )
    .await;
    assert_eq!(
        step_row(&client, "act").await,
        format!("completed|2|steps:{id}:act|\"done by attempt 2\"")
    );
    assert!(
        step_row(&client, "look up")
            .await
            .starts_with("completed|1|"),
        "a completed step is replayed, not run again"
    );
    assert_eq!(
        text(
            &client,
            "return document.getElementById('error').textContent;"
        )
        .await,
        ""
    );
    // A retry of a turn that succeeded: the page shows the 409.
    client
        .execute("document.getElementById('retry').click();", vec![])
        .await
        .expect("click the hidden button");
    until(
        &client,
        "the 409 shown",
        "const e = document.getElementById('error').textContent; \
         return e.includes('409 not_retryable') && e.includes('the last turn succeeded');",
    )
    .await;

    // Interrupted inside a step: the turn ended without its outcome, so it is ambiguous.
    prompt_from_page(&client, &base, "cut", "hang").await;
    until_step(&client, "act", "running").await;
    click(&client, "interrupt").await;
    until_step(&client, "act", "ambiguous").await;
    until(
        &client,
        "the interrupted turn",
        "return document.getElementById('turn').textContent.endsWith('attempt 1 · interrupted') \
         && document.getElementById('retry').hidden;",
    )
    .await;
    assert!(
        step_row(&client, "act")
            .await
            .starts_with("ambiguous|1|cut:"),
        "{}",
        step_row(&client, "act").await
    );
    client.close().await.expect("close the browser");
    server.stop().await;
}

/// A runtime with `runner` on `db` (its restart sweep on) and the HTTP server on `listener`, in
/// this test's actix System.
async fn serve_on(db: &Path, listener: TcpListener, runner: TwoSteps) -> (Runtime, ServerHandle) {
    let runtime = Runtime::builder()
        .database(db)
        .runner(runner)
        .arbiters(2)
        .shutdown_grace(Duration::from_secs(2))
        .start()
        .await
        .expect("runtime starts");
    let app_runtime = runtime.clone();
    let serve = http::ServeOptions {
        workers: Some(1),
        shutdown_timeout: Duration::from_secs(1),
        signals: false,
    };
    let server = http::serve(vec![listener], &serve, move || {
        App::new()
            .configure(http::configure(app_runtime.clone(), HttpOptions::default()))
            .default_service(web::to(http::not_found))
    })
    .expect("serve");
    let handle = server.handle();
    actix_rt::spawn(server);
    (runtime, handle)
}

#[actix_rt::test]
async fn the_console_shows_a_step_cut_by_a_restart_ambiguous() {
    let Some((driver, chromium)) =
        browser_or_skip("the_console_shows_a_step_cut_by_a_restart_ambiguous")
    else {
        return;
    };
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("restart.db");
    let gate = Gate::new();
    let runner = TwoSteps { gate: gate.clone() };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let base = format!("http://{addr}");
    let (runtime, server) = serve_on(&db, listener, runner.clone()).await;
    common::create(&runtime, "restart", None).await;
    let driver = Driver::start(&driver);
    let client = open_browser(&driver, &chromium).await;

    prompt_from_page(&client, &base, "restart", "hang").await;
    until_step(&client, "act", "running").await;
    let id = text(
        &client,
        "return document.getElementById('turn').dataset.turn;",
    )
    .await;

    // The shutdown cuts `act` off; the next runtime on the file resumes the turn (the restart
    // notice, then its claim: attempt 2), and the drain waits before it starts `act` again.
    server.stop(false).await;
    runtime.shutdown().await;
    let listener = TcpListener::bind(addr).expect("the same port again");
    let (runtime, server) = serve_on(&db, listener, runner).await;
    client.refresh().await.expect("reload the page");
    until_step(&client, "act", "ambiguous").await;
    until(
        &client,
        "the turn's second attempt",
        &format!(
            "return document.getElementById('turn').textContent === '#{id} · attempt 2 · live';"
        ),
    )
    .await;
    assert_eq!(
        step_row(&client, "act").await,
        format!("ambiguous|1|restart:{id}:act|")
    );
    assert!(
        step_row(&client, "look up")
            .await
            .starts_with("completed|1|"),
        "{}",
        step_row(&client, "look up").await
    );
    assert!(
        client
            .execute(
                "return !!document.querySelector('#log [data-type=\"session.synthetic\"]');",
                vec![]
            )
            .await
            .expect("script")
            == json!(true),
        "the restart notice is in the log"
    );

    // The second attempt runs `act` again (at least once), and it completes.
    gate.release();
    until_step(&client, "act", "completed").await;
    until(
        &client,
        "the turn succeeded",
        &format!(
            "return document.getElementById('turn').textContent === '#{id} · attempt 2 · succeeded';"
        ),
    )
    .await;
    assert_eq!(
        step_row(&client, "act").await,
        format!("completed|2|restart:{id}:act|\"done by attempt 2\"")
    );
    client.close().await.expect("close the browser");
    server.stop(false).await;
    runtime.shutdown().await;
}
