//! The operator console (`GET /console`) in a real browser: headless Chromium driven through
//! chromedriver (WebDriver, with fantoccini) against the `server` example run as a child process
//! behind a token. The test opens the console, gives it the token, creates a session, prompts,
//! watches the reply stream in word by word (an `EventSource` opened with a ticket), interrupts
//! it, and checks the page's DOM: the sessions list, the transcript (the prompt marked
//! interrupted), the event log and the `/stats` figures. It also checks, from the page, that a
//! foreign origin's request is refused and that `EventSource` frames never reach `onmessage`,
//! and finally deletes the session from its page (the list then no longer shows it).
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them). Without
//! them the test prints one line saying it was skipped and why, and passes, except under
//! `CI=true`, where it fails. `UPDATE_CONSOLE_SCREENSHOT=1` writes `docs/console.png`.
#![cfg(feature = "http")]

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{ClientBuilder, Locator};
use serde_json::json;

use common::web::ServerChild;

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
    let (driver, chromium) = match browser() {
        Ok(found) => found,
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the browser test cannot run under CI: {why} (apt-get install chromium chromium-driver)"
            );
            let _ = writeln!(
                std::io::stderr().lock(),
                "http_console: skipped: {why} (apt-get install chromium chromium-driver to run it)"
            );
            return;
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerChild::spawn(
        &dir.path().join("console.db"),
        &["--word-delay-ms", "250", "--token", "console-token"],
    );
    let base = server.base.clone();
    let driver = Driver::start(&driver);
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,860"],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a browser session");

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
