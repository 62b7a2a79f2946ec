//! Opens (or creates) `./durable-sessions.db`, runs one turn of a tiny runner, and prints what
//! was recorded. Run it twice to see the log grow:
//!
//! ```text
//! cargo run --example basic
//! ```

use durable_sessions::{CreateSession, RunError, Runner, Runtime, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::json;

/// Appends one assistant message per turn.
struct Greeter;

impl Runner for Greeter {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        async move {
            turn.append_message("assistant", json!({"text": "hello from a durable turn"}))
                .await?;
            Ok(())
        }
        .boxed_local()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "durable-sessions.db".into());
    actix_rt::System::new().block_on(async move {
        let runtime = Runtime::builder()
            .database(&path)
            .runner(Greeter)
            .start()
            .await?;
        let session = runtime
            .sessions()
            .create(CreateSession {
                directory: std::env::current_dir()?.display().to_string(),
                ..CreateSession::default()
            })
            .await?;
        let outcome = runtime.execution().resume(&session.id).await?;
        let events = durable_sessions::testing::events(std::path::Path::new(&path), &session.id)?;
        println!("database: {path}");
        println!("session:  {} ({})", session.id, session.title);
        println!("turn:     {outcome:?}");
        for event in events {
            println!("event {:>3} {} {}", event.seq, event.kind, event.data);
        }
        println!("stats:    {:?}", runtime.stats());
        runtime.shutdown().await;
        Ok(())
    })
}
