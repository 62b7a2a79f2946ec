//! [`Harness`]: a runtime on a fresh temp database, for one test.

use std::cell::Cell;
use std::ops::Deref;
use std::path::Path;

use durable_sessions::{Runner, Runtime, RuntimeBuilder};

use super::{test_builder, TestDb};

/// A runtime started on a fresh temp database, and that database: the preamble and the last
/// step of a runtime test.
///
/// ```ignore
/// let runner = ScriptedRunner::new();
/// let runtime = Harness::start(&runner).await;
/// // or: Harness::with(|b| b.idle_timeout(Duration::from_millis(50))).start(&runner).await
/// let s = create(&runtime, "s", None).await; // a `Harness` derefs to its `Runtime`
/// assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
/// runtime.stop().await;
/// ```
///
/// The runtime is built by [`test_builder`] (two arbiters, no restart sweep at start, a short
/// shutdown grace), then by the test's own `configure` closure, on the harness's database.
///
/// # Stopping
/// [`Runtime::shutdown`] is async and `Drop` is not, so a test stops the runtime itself, with
/// [`Harness::stop`] — as its last step, or wherever it tests what a shutdown does; the harness
/// stays usable after it (the database path, the stopped runtime's answers). Dropping a
/// harness cannot shut the runtime down: a shutdown spawned from `drop` onto the test's actix
/// System would never run, since `#[actix_rt::test]` returns as soon as the test body ends and
/// drops the System's pending tasks with it. So `drop`:
/// - after `stop`, drops the runtime, then deletes the temp directory;
/// - when the test is panicking (failed before `stop`, or after it), leaves the runtime as the
///   failure left it — its arbiter threads, and its lock on the database, last until the test
///   binary exits, as they did before this harness — and keeps the temp directory, printing its
///   path, so the database can be inspected;
/// - otherwise (a test that forgot `stop`) panics, so every test still ends with a graceful
///   shutdown.
///
/// A runtime holds an exclusive lock on its database until it shuts down: a second runtime on
/// the same file is refused (`Error::DatabaseInUse`). [`Harness::restart`] stops the runtime
/// before it starts the next one on the file.
pub struct Harness {
    /// Declared before `db`: dropped first.
    runtime: Runtime,
    stopped: Cell<bool>,
    /// `None` only once `drop` kept it.
    db: Option<TestDb>,
}

/// A [`Harness`] about to start, with the test's own builder settings; see [`Harness::with`].
pub struct HarnessBuilder<F> {
    configure: F,
}

impl Harness {
    /// Starts a runtime with `runner` on a fresh temp database, with the tests' defaults.
    ///
    /// # Panics
    /// When the runtime does not start.
    pub async fn start<R: Runner + Clone>(runner: &R) -> Harness {
        Harness::with(|builder| builder).start(runner).await
    }

    /// A harness whose runtime `configure` adjusts (`|b| b.idle_timeout(..)`); the database is
    /// always the harness's own, even when `configure` replaces the whole configuration.
    pub fn with<F>(configure: F) -> HarnessBuilder<F>
    where
        F: FnOnce(RuntimeBuilder) -> RuntimeBuilder,
    {
        HarnessBuilder { configure }
    }

    /// The temp database.
    pub fn db(&self) -> &TestDb {
        self.db.as_ref().expect("the database is kept until drop")
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.db().path
    }

    /// The runtime (a harness also derefs to it).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Shuts the runtime down gracefully ([`Runtime::shutdown`]), releasing the database's
    /// lock. Idempotent: a second call does nothing.
    pub async fn stop(&self) {
        if !self.stopped.replace(true) {
            self.runtime.shutdown().await;
        }
    }

    /// Stops the runtime (when it still runs) and starts another on the same database, with
    /// `runner` and the tests' defaults adjusted by `configure` (not those of the first one).
    ///
    /// # Panics
    /// When the new runtime does not start.
    pub async fn restart<R, F>(&mut self, runner: &R, configure: F)
    where
        R: Runner + Clone,
        F: FnOnce(RuntimeBuilder) -> RuntimeBuilder,
    {
        self.stop().await;
        self.runtime = build(self.path(), runner, configure)
            .start()
            .await
            .expect("the runtime restarts");
        self.stopped.set(false);
    }
}

impl<F> HarnessBuilder<F>
where
    F: FnOnce(RuntimeBuilder) -> RuntimeBuilder,
{
    /// Starts the runtime with `runner` on a fresh temp database.
    ///
    /// # Panics
    /// When the runtime does not start.
    pub async fn start<R: Runner + Clone>(self, runner: &R) -> Harness {
        let db = TestDb::new();
        let runtime = build(&db.path, runner, self.configure)
            .start()
            .await
            .expect("the runtime starts");
        Harness {
            runtime,
            stopped: Cell::new(false),
            db: Some(db),
        }
    }
}

/// [`test_builder`] on `database`, adjusted by `configure`, on `database` still.
fn build<R, F>(database: &Path, runner: &R, configure: F) -> RuntimeBuilder
where
    R: Runner + Clone,
    F: FnOnce(RuntimeBuilder) -> RuntimeBuilder,
{
    configure(test_builder(database, runner)).database(database)
}

impl Deref for Harness {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        &self.runtime
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(db) = self.db.take() {
                let kept = db.keep();
                eprintln!("the failed test's database is kept in {}", kept.display());
            }
        } else if !self.stopped.get() {
            panic!(
                "a Harness was dropped without `stop().await`: end the test with it, so the \
                 runtime on {} shuts down gracefully",
                self.path().display()
            );
        }
    }
}
