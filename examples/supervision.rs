//! A narrated, self-checking tour of what the runtime does when turns go wrong:
//!
//! 1. a drain that panics is recorded as `failed{panic}`, its claim released, its actor replaced,
//!    and other sessions never notice (the panic is deliberate: the example prints it as one
//!    line marked "expected" instead of the default panic message and backtrace);
//! 2. a provider transport failure is recorded as `failed{provider.transport}`;
//! 3. a user interrupt is recorded as `interrupted{user}` and never resumed;
//! 4. a real crash loop: this example re-spawns itself as a child process and `SIGKILL`s it
//!    mid-turn again and again; each boot resumes the turn and counts the attempt, until the
//!    budget runs out and the turn is terminalized as `aborted`.
//!
//! It exits non-zero if anything it narrates did not happen.
//!
//! ```text
//! cargo run --example supervision
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use durable_sessions::kind;
use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{CreateSession, ProviderErrorKind, RunError, Runtime, SessionId, Terminal};
use futures::FutureExt;

/// The resume budget of the crash-loop demo.
const BUDGET: u32 = 3;
/// Marks the child process mode.
const CHILD_FLAG: &str = "--crash-child";

type Fallible<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn check(ok: bool, what: &str) -> Fallible {
    if ok {
        println!("   ok: {what}");
        Ok(())
    } else {
        Err(format!("FAILED: {what}").into())
    }
}

async fn session(runtime: &Runtime, id: &str) -> Fallible<SessionId> {
    let id = SessionId::new(id)?;
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            directory: "/demo".into(),
            ..CreateSession::default()
        })
        .await?;
    Ok(id)
}

async fn in_process_demos(db: &Path) -> Fallible {
    let runner = ScriptedRunner::new();
    let runtime = Runtime::builder()
        .database(db)
        .runner(runner.clone())
        .arbiters(2)
        .start()
        .await?;
    let execution = runtime.execution();

    println!("1. a drain panics while another session keeps working");
    let bystander = session(&runtime, "bystander").await?;
    let panicky = session(&runtime, "panicky").await?;
    let gate = Gate::new();
    runner.push(&bystander, Script::Gate(gate.clone()));
    runner.push(
        &panicky,
        Script::Panic("the model returned nonsense".into()),
    );
    let bystander_turn = actix_rt::spawn({
        let (execution, id) = (execution.clone(), bystander.clone());
        async move { execution.resume(&id).await }
    });
    runner
        .wait_for_drains_of(&bystander, 1, Duration::from_secs(10))
        .await;
    // The drain panics on purpose. The default panic hook would print the panic and, under
    // `RUST_BACKTRACE=1`, a backtrace that reads like this example failing: while this turn
    // runs, a hook of our own prints one line instead, and the default hook comes back after.
    println!("   the runner panics on purpose now; the runtime catches the panic");
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a non-string payload");
        println!("   (expected) the drain panicked: {message}");
    }));
    let outcome = execution.resume(&panicky).await;
    std::panic::set_hook(default_hook);
    let outcome = outcome?;
    println!("   the panicking turn ended: {outcome:?}");
    check(
        matches!(&outcome, Terminal::Failed { error } if error.kind == "panic"),
        "the panic is recorded as failed{panic}",
    )?;
    check(!testing::is_claimed(db, &panicky)?, "its claim is released")?;
    gate.release();
    let bystander_outcome = bystander_turn.await??;
    check(
        bystander_outcome == Terminal::Succeeded,
        "the other session's turn completed",
    )?;
    let again = execution.resume(&panicky).await?;
    check(
        again == Terminal::Succeeded && runtime.stats().registry.replaced >= 1,
        "the panicked session's actor was replaced and serves the next turn",
    )?;

    println!("2. a provider transport failure");
    let flaky = session(&runtime, "flaky").await?;
    runner.push(
        &flaky,
        Script::fail(|| RunError::provider(ProviderErrorKind::Transport, "Disconnected")),
    );
    let outcome = execution.resume(&flaky).await?;
    println!("   the turn ended: {outcome:?}");
    let failed = testing::events_of_kind(db, &flaky, kind::EXECUTION_FAILED)?;
    check(
        failed.len() == 1 && failed[0].data["error"]["type"] == "provider.transport",
        "recorded as failed{provider.transport}",
    )?;

    println!("3. a user interrupt");
    let chatty = session(&runtime, "chatty").await?;
    runner.push(&chatty, Script::Never);
    execution.wake(&chatty, None).await?;
    runner
        .wait_for_drains_of(&chatty, 1, Duration::from_secs(10))
        .await;
    let interrupted = execution.interrupt(&chatty, None).await?;
    check(interrupted, "the running turn was interrupted")?;
    check(!testing::is_claimed(db, &chatty)?, "its claim is released")?;
    let report = runtime.resume_suspended_sessions().await?;
    check(
        !report.resumed.contains(&chatty),
        "a restart sweep does not resurrect it",
    )?;
    runtime.shutdown().await;
    Ok(())
}

/// The child process: boots the runtime (running the restart sweep), starts the turn on the
/// first boot, and reports each drain start on stdout; then waits to be killed.
fn child(db: &Path) -> Fallible {
    actix_rt::System::new().block_on(async move {
        let runner = ScriptedRunner::new();
        let id = SessionId::new("crashloop")?;
        let announce = id.clone();
        runner.set_default(
            &id,
            Script::custom(move |_turn| {
                let announce = announce.clone();
                async move {
                    println!("DRAIN_STARTED {announce}");
                    let _ = std::io::stdout().flush();
                    futures::future::pending::<()>().await;
                    Ok(())
                }
                .boxed_local()
            }),
        );
        let runtime = Runtime::builder()
            .database(db)
            .runner(runner)
            .max_resume_attempts(BUDGET)
            .start()
            .await?;
        if runtime.sessions().get(&id).await.is_err() {
            session(&runtime, "crashloop").await?;
            runtime.execution().wake(&id, None).await?;
        }
        println!("BOOTED");
        let _ = std::io::stdout().flush();
        futures::future::pending::<()>().await;
        Ok(())
    })
}

/// Starts a child on `db`, waits for its turn's drain to start, and kills it with SIGKILL.
fn crash_once(db: &Path) -> Fallible<bool> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg(CHILD_FLAG)
        .arg(db)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait for the drain; once the child says it booted, give the resumed drain a moment.
    let mut deadline = Instant::now() + Duration::from_secs(20);
    let mut drained = false;
    while Instant::now() < deadline && !drained {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) if line.starts_with("DRAIN_STARTED") => drained = true,
            Ok(line) if line == "BOOTED" => {
                deadline = deadline.min(Instant::now() + Duration::from_secs(1));
            }
            _ => {}
        }
    }
    child.kill()?; // SIGKILL
    child.wait()?;
    Ok(drained)
}

fn crash_loop_demo(db: &Path) -> Fallible {
    println!("4. a crash loop, cut off by the resume budget ({BUDGET})");
    let id = SessionId::new("crashloop")?;
    for boot in 0..=BUDGET {
        check(
            crash_once(db)?,
            &format!("boot {boot}: the turn's drain started"),
        )?;
        let attempts = testing::resume_attempts(db, &id)?;
        println!("   killed with SIGKILL mid-turn; resume_attempts = {attempts}");
        check(attempts == boot, &format!("the attempt count is {boot}"))?;
        check(testing::is_claimed(db, &id)?, "the claim survived the kill")?;
    }
    check(
        !crash_once(db)?,
        "the next boot does not drain the turn again",
    )?;
    let failed = testing::events_of_kind(db, &id, kind::EXECUTION_FAILED)?;
    check(
        failed.len() == 1 && failed[0].data["error"]["type"] == "aborted",
        "the turn was terminalized as failed{aborted}",
    )?;
    check(!testing::is_claimed(db, &id)?, "its claim is released")?;
    let notices = testing::events_of_kind(db, &id, kind::SYNTHETIC)?;
    check(
        notices.len() == BUDGET as usize,
        "each resume published one continue notice",
    )?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        let db = PathBuf::from(&args[2]);
        if let Err(e) = child(&db) {
            eprintln!("child failed: {e}");
            std::process::exit(2);
        }
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("cannot create a temp dir: {e}");
            std::process::exit(1);
        }
    };
    let db = dir.path().join("supervision.db");
    let result = actix_rt::System::new()
        .block_on(in_process_demos(&db))
        .and_then(|()| crash_loop_demo(&dir.path().join("crashloop.db")));
    match result {
        Ok(()) => println!("everything narrated above happened"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
