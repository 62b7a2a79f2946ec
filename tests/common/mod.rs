//! Shared helpers for the integration tests: a temp database, a runtime on it, sessions.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use durable_sessions::testing::ScriptedRunner;
use durable_sessions::{CreateSession, Runtime, RuntimeBuilder, SessionId};
use tempfile::TempDir;

/// How long a test waits for something observable before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// A temp directory holding the test's database file.
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sessions.db");
        Self { dir, path }
    }

    /// A builder on this database with a short shutdown grace and no sweep at start.
    pub fn builder(&self, runner: &ScriptedRunner) -> RuntimeBuilder {
        Runtime::builder()
            .database(&self.path)
            .runner(runner.clone())
            .arbiters(2)
            .sweep_on_start(false)
            .shutdown_grace(Duration::from_secs(2))
    }

    pub async fn start(&self, runner: &ScriptedRunner) -> Runtime {
        self.builder(runner).start().await.expect("runtime starts")
    }
}

/// Creates a top-level session `id` (or a child of `parent`).
pub async fn create(runtime: &Runtime, id: &str, parent: Option<&SessionId>) -> SessionId {
    let id = SessionId::new(id).expect("valid id");
    runtime
        .sessions()
        .create(CreateSession {
            id: Some(id.clone()),
            parent_id: parent.cloned(),
            directory: "/work".into(),
            ..CreateSession::default()
        })
        .await
        .expect("create session");
    id
}

/// Waits until `check` holds, polling every few milliseconds.
///
/// # Panics
/// After [`WAIT`], naming `what`.
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
}
