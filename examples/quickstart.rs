//! The README's quickstart runner as a program, on the session `quickstart` of a SQLite file:
//! send a prompt, `kill -9` the process while it answers, run it again without a prompt, and
//! the restarted process answers it.
//!
//! ```text
//! QUICKSTART_DELAY_MS=5000 cargo run --example quickstart -- quickstart.db "hello" &
//! kill -9 $!                                     # after it prints PROMOTED
//! cargo run --example quickstart -- quickstart.db   # the sweep resumes the turn: SERVED
//! ```
//!
//! It prints one line per step: `ADMITTED <id>` when the prompt is acknowledged, `PROMOTED
//! <id>` when a turn took it (it is in the transcript, and the turn holds the claim), then
//! `SERVED <terminal>` when that turn ended, or `IDLE` when started without a prompt, once
//! the turns the restart sweep resumed ended. `QUICKSTART_DELAY_MS` (default 0) slows the
//! answer down, so a test can kill the process mid-turn (`tests/quickstart.rs`).

use std::time::Duration;

use durable_sessions::SessionId;
use durable_sessions::{Admission, CreateSession, PromptInput, RunError, Runner, Runtime, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::json;

// The README shows this runner, from `/// Your agent` to the end of its `impl` (section
// "Embedding"): `tests/quickstart.rs` checks that the README's text appears here unchanged.

/// Your agent: answers each prompt of the turn with one assistant message.
struct Agent;

impl Runner for Agent {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        async move {
            // The prompts this turn answers, promoted into the transcript. A turn resumed
            // after a crash gets again those its killed attempt took and did not answer.
            for input in turn.take_inputs().await? {
                let text = call_the_model(&input).await;
                let answer = json!({ "text": text, "reply_to": input.id });
                turn.append_message("assistant", answer).await?;
            }
            Ok(())
        }
        .boxed_local()
    }
}

/// The README's echo, which says which prompt it answers (`PROMOTED <id>`) and takes
/// `QUICKSTART_DELAY_MS` to answer.
async fn call_the_model(input: &Admission) -> String {
    println!("PROMOTED {}", input.id);
    let delay = std::env::var("QUICKSTART_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0);
    actix_rt::time::sleep(Duration::from_millis(delay)).await;
    format!("you said {}", input.prompt)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let database = args.next().unwrap_or_else(|| "quickstart.db".into());
    let prompt = args.next();
    actix_rt::System::new().block_on(async move {
        // `start` runs the restart sweep: a turn a killed process left claimed resumes now.
        let runtime = Runtime::builder()
            .database(&database)
            .runner(Agent)
            .start()
            .await?;
        let sessions = runtime.sessions();
        let id = SessionId::new("quickstart")?;
        let session = CreateSession {
            id: Some(id.clone()),
            directory: std::env::current_dir()?.display().to_string(),
            ..CreateSession::default()
        };
        sessions.create(session).await?; // idempotent: a later run finds it stored
        if let Some(text) = prompt {
            let admission = sessions.prompt(PromptInput::new(id, text)).await?;
            println!("ADMITTED {}", admission.id);
            let terminal = sessions.await_served(&admission).await?;
            println!("SERVED {terminal:?}");
        } else {
            sessions.await_idle(&id).await?;
            println!("IDLE");
        }
        runtime.shutdown().await;
        Ok(())
    })
}
