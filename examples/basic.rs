//! Opens (or creates) `./basic.db` (or the file given as the first argument), runs
//! one turn of the session `basic` with a tiny runner that appends one assistant message, and
//! prints the session's whole event log, marking the events this run added. The session id is
//! fixed, so each run adds a turn to the same stored session: run it twice and the second log
//! is the first one plus one more turn.
//!
//! ```text
//! cargo run --example basic
//! cargo run --example basic   # the same session, one turn longer
//! ```

use durable_sessions::{CreateSession, RunError, Runner, Runtime, SessionId, Turn};
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
    let path = std::env::args().nth(1).unwrap_or_else(|| "basic.db".into());
    actix_rt::System::new().block_on(async move {
        let runtime = Runtime::builder()
            .database(&path)
            .runner(Greeter)
            .start()
            .await?;
        // A fixed id: `create` is idempotent, so a later run finds this session stored.
        let session = runtime
            .sessions()
            .create(CreateSession {
                id: Some(SessionId::new("basic")?),
                directory: std::env::current_dir()?.display().to_string(),
                ..CreateSession::default()
            })
            .await?;
        let db = std::path::Path::new(&path);
        // The events already stored by earlier runs (none when this run created the session).
        let before = if session.is_created() {
            0
        } else {
            durable_sessions::testing::events(db, &session.id)?.len()
        };
        let outcome = runtime.execution().resume(&session.id).await?;
        let events = durable_sessions::testing::events(db, &session.id)?;
        println!("database: {path}");
        let whence = if session.is_created() {
            "created by this run"
        } else {
            "stored by an earlier run"
        };
        println!("session:  {} ({}), {whence}", session.id, session.title);
        println!("turn:     {outcome:?}");
        println!(
            "its event log, {} events ('+' marks the {} this run added):",
            events.len(),
            events.len() - before
        );
        for (i, event) in events.iter().enumerate() {
            let mark = if i >= before { '+' } else { ' ' };
            let (seq, kind, data) = (event.seq, &event.kind, &event.data);
            println!("{mark} event {seq:>3} {kind} {data}");
        }
        println!("run it again: the same session gets one more turn and its log grows");
        println!("stats:    {:?}", runtime.stats());
        runtime.shutdown().await;
        Ok(())
    })
}
