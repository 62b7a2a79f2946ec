//! Which database a test's runtime works on: a SQLite file in the test's temp directory (the
//! default), or — inside [`on_postgres`], with the `postgres` feature — a fresh database of a
//! throwaway PostgreSQL cluster, one per runtime. A suite thus runs against both backends from
//! one source: each test runs on SQLite as itself, and a `postgres_backend_passes_the_…_suite`
//! test runs the same test functions again on PostgreSQL.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[cfg(feature = "postgres")]
use std::cell::RefCell;
#[cfg(feature = "postgres")]
use std::rc::Rc;
#[cfg(feature = "postgres")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "postgres")]
use durable_sessions::testing::postgres::{start_or_skip, PgCluster};

#[cfg(feature = "postgres")]
thread_local! {
    /// The cluster the running suite's cases use (set by [`on_postgres`]).
    static POSTGRES: RefCell<Option<Rc<PgCluster>>> = const { RefCell::new(None) };
}

/// Databases created so far in this process (their names must differ).
#[cfg(feature = "postgres")]
static CREATED: AtomicU64 = AtomicU64::new(0);

/// A test case: an `#[actix_rt::test]` function (callable as a plain `fn()`: it runs its own
/// actix System).
pub type Case = (&'static str, fn());

/// Runs `cases` on PostgreSQL: starts a throwaway cluster (or, without PostgreSQL installed,
/// prints one line saying the suite was skipped — a failure under `CI=true`) and runs each case
/// with every runtime it starts on a fresh database of that cluster.
#[cfg(feature = "postgres")]
pub fn on_postgres(suite: &str, cases: &[Case]) {
    let Some(cluster) = start_or_skip(suite) else {
        return;
    };
    let cluster = Rc::new(cluster);
    POSTGRES.with(|p| *p.borrow_mut() = Some(cluster.clone()));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            POSTGRES.with(|p| *p.borrow_mut() = None);
        }
    }
    let _reset = Reset;
    for (name, case) in cases {
        eprintln!("{suite}: {name} on PostgreSQL");
        case();
    }
}

/// Where a test's runtime keeps its data: a fresh PostgreSQL database (its URL) inside
/// [`on_postgres`], else the file `sessions.db` in `dir`.
pub fn fresh_database(dir: &Path) -> PathBuf {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = POSTGRES.with(|p| p.borrow().clone()) {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            CREATED.fetch_add(1, Ordering::Relaxed)
        );
        let url = cluster
            .create_database(&name)
            .expect("a fresh PostgreSQL database");
        return PathBuf::from(url);
    }
    dir.join("sessions.db")
}

/// Whether the running case works on PostgreSQL.
pub fn on_postgres_now() -> bool {
    #[cfg(feature = "postgres")]
    {
        POSTGRES.with(|p| p.borrow().is_some())
    }
    #[cfg(not(feature = "postgres"))]
    {
        false
    }
}

/// Whether `db` names a PostgreSQL database (a URL) rather than a SQLite file.
pub fn is_postgres(db: &Path) -> bool {
    db.to_str().is_some_and(|d| d.starts_with("postgres"))
}

/// The lease of the nodes the crash suites start on PostgreSQL (the default is 10 s): a killed
/// node's turns are taken over only once its lease lapsed.
pub const CRASH_LEASE: Duration = Duration::from_secs(1);

/// How long [`await_killed_node`] waits before failing.
const NODE_WAIT: Duration = Duration::from_secs(20);

/// After the process running the node named `node_name` on `db` was SIGKILLed, waits until the
/// database is done with it, as a restart on SQLite finds the file: every connection of the
/// node is gone (so whatever it had sent — a `COMMIT` the kill cut off from its answer — has
/// committed or rolled back), and no node holds a live lease (so the next runtime's start-up
/// sweep takes over the killed node's turns, as a SQLite restart's does; the takeover by a node
/// already running is the multi-node suite's). Returns at once on SQLite.
///
/// # Panics
/// When the node is still connected, or a lease still live, after 20 s.
pub fn await_killed_node(db: &Path, node_name: &str) {
    if !is_postgres(db) {
        return;
    }
    let application = format!("durable-sessions {node_name}");
    await_zero(db, "the killed node's connections to close", || {
        super::rows(
            db,
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
            &[&application],
        )[0][0]
            .as_i64()
            .expect("a count")
    });
    await_no_live_node(db);
}

/// Waits until no node holds a live lease on the PostgreSQL database `db` (by the database's
/// clock); returns at once on SQLite, or before the first runtime created the schema.
///
/// # Panics
/// After 20 s.
pub fn await_no_live_node(db: &Path) {
    if !is_postgres(db) {
        return;
    }
    let has_nodes = "SELECT CAST(CAST(to_regclass('node') IS NOT NULL AS INTEGER) AS BIGINT)";
    if super::count(db, has_nodes) == 0 {
        return;
    }
    await_zero(db, "every node's lease to lapse", || {
        super::count(db, "SELECT COUNT(*) FROM node WHERE lease_until > now()")
    });
}

/// Polls `count` every 20 ms until it is zero.
fn await_zero(db: &Path, what: &str, mut count: impl FnMut() -> i64) {
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        let n = count();
        if n == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: still {n} after {NODE_WAIT:?} waiting for {what}",
            db.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
