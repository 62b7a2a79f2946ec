//! Which database a test's runtime works on: a SQLite file in the test's temp directory (the
//! default), or a fresh database of a throwaway PostgreSQL cluster, one per runtime (feature
//! `postgres`). Every test runs on both backends from one source, by construction: each test
//! runs on SQLite as itself, and a test binary's `postgres_backend_passes_the_…_suite` test
//! ([`run_suite_on_postgres`], feature `testing-postgres`) starts one cluster and runs the
//! binary again as a child process, its every other test on PostgreSQL ([`POSTGRES_ENV`] names
//! the cluster). A test that cannot run on PostgreSQL returns early there ([`sqlite_only`]); one
//! that runs only there is named `postgres_backend_…` and starts its own cluster
//! ([`postgres_only`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[cfg(feature = "testing-postgres")]
use std::cell::RefCell;
#[cfg(feature = "postgres")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "testing-postgres")]
use durable_sessions::testing::postgres::start_or_skip;

/// The environment variable of a suite's child process ([`run_suite_on_postgres`]): the URL of
/// the superuser's default database of the PostgreSQL cluster its tests run on.
pub const POSTGRES_ENV: &str = "DURABLE_SESSIONS_TEST_POSTGRES";

/// What the names of the tests that start a PostgreSQL cluster of their own begin with: the
/// suite tests, and the tests that run on PostgreSQL only. A suite's child skips them.
pub const OWN_CLUSTER_PREFIX: &str = "postgres_backend_";

/// How a test that cannot run on PostgreSQL says so in a suite's child: `<test>: SQLite only`.
const SQLITE_ONLY: &str = ": SQLite only";

/// How many tests a suite's child runs at once.
#[cfg(feature = "testing-postgres")]
const SUITE_THREADS: &str = "2";

#[cfg(feature = "testing-postgres")]
thread_local! {
    /// The cluster (its superuser URL) of the running [`postgres_only`] test.
    static POSTGRES: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Databases created so far in this process (their names must differ).
#[cfg(feature = "postgres")]
static CREATED: AtomicU64 = AtomicU64::new(0);

/// The superuser URL of the PostgreSQL cluster this test works on, if any: in a
/// [`postgres_only`] test, its cluster's; in a suite's child process, [`POSTGRES_ENV`].
#[cfg(feature = "postgres")]
fn postgres_cluster() -> Option<String> {
    #[cfg(feature = "testing-postgres")]
    if let Some(url) = POSTGRES.with(|p| p.borrow().clone()) {
        return Some(url);
    }
    std::env::var(POSTGRES_ENV)
        .ok()
        .filter(|url| !url.is_empty())
}

/// The test suite of this test binary on PostgreSQL, as the test `suite` (named
/// `postgres_backend_passes_the_…_suite`): starts a throwaway cluster (or, without PostgreSQL
/// installed, prints one line saying the suite was skipped — a failure under `CI=true`), runs
/// this test binary again as a child process with [`POSTGRES_ENV`] naming the cluster, so that
/// every runtime of its tests works on a fresh database of it, skipping the tests that start a
/// cluster of their own ([`OWN_CLUSTER_PREFIX`]), and prints how many tests passed there.
///
/// # Panics
/// When a test failed on PostgreSQL: the failing tests' names, then the child's output.
#[cfg(feature = "testing-postgres")]
pub fn run_suite_on_postgres(suite: &str) {
    assert!(
        suite.starts_with(OWN_CLUSTER_PREFIX),
        "{suite}: a suite test's name"
    );
    if postgres_cluster().is_some() {
        // Already on PostgreSQL (the child skips this test; run by hand, it does nothing).
        return;
    }
    // Stopped when it drops: when this function returns or panics.
    let Some(cluster) = start_or_skip(suite) else {
        return;
    };
    let exe = std::env::current_exe().expect("the test binary");
    let output = std::process::Command::new(&exe)
        .args([
            "--skip",
            OWN_CLUSTER_PREFIX,
            "--test-threads",
            SUITE_THREADS,
        ])
        .env(POSTGRES_ENV, cluster.url())
        // Captured output: each test's line `test … ok` whole, a failing test's output shown.
        .env_remove("RUST_TEST_NOCAPTURE")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{suite}: run {} on PostgreSQL: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let failed: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test ")?.strip_suffix(" ... FAILED"))
        .collect();
    assert!(
        output.status.success(),
        "{suite}: failed on PostgreSQL ({}): {}\n\
         ---- the test binary on PostgreSQL: stdout ----\n{stdout}\n\
         ---- stderr ----\n{stderr}",
        output.status,
        if failed.is_empty() {
            "no test named".to_owned()
        } else {
            failed.join(", ")
        },
    );
    let passed = stdout
        .lines()
        .filter(|line| line.starts_with("test ") && line.ends_with(" ... ok"))
        .count();
    assert!(passed > 0, "{suite}: no test ran on PostgreSQL:\n{stdout}");
    let sqlite_only: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.strip_suffix(SQLITE_ONLY))
        .collect();
    let sqlite_only = if sqlite_only.is_empty() {
        String::new()
    } else {
        format!(
            ", {} of them returned at once as SQLite only: {}",
            sqlite_only.len(),
            sqlite_only.join(", ")
        )
    };
    // Past the test harness's capture, as `start_or_skip`'s skip line.
    let _ = writeln!(
        std::io::stderr(),
        "{suite}: {passed} tests passed on PostgreSQL{sqlite_only}"
    );
}

/// Runs the test `test`, which works on PostgreSQL only, on a throwaway cluster (or prints one
/// line saying it was skipped — a failure under `CI=true`): every runtime `case` starts works
/// on a fresh database of it. `test` starts with [`OWN_CLUSTER_PREFIX`], so that a suite's
/// child skips it (it runs here, once).
#[cfg(feature = "testing-postgres")]
pub fn postgres_only(test: &str, case: fn()) {
    assert!(
        test.starts_with(OWN_CLUSTER_PREFIX),
        "{test}: a PostgreSQL-only test is named {OWN_CLUSTER_PREFIX}…"
    );
    let Some(cluster) = start_or_skip(test) else {
        return;
    };
    POSTGRES.with(|p| *p.borrow_mut() = Some(cluster.url()));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            POSTGRES.with(|p| *p.borrow_mut() = None);
        }
    }
    let _reset = Reset;
    case();
}

/// Whether the test `test` is to return at once because it works on SQLite only (it reads or
/// breaks the SQLite file itself) and this run is on PostgreSQL; then it prints one line
/// `<test>: SQLite only` (past the test harness's capture: the suite counts them).
pub fn sqlite_only(test: &str) -> bool {
    if !on_postgres_now() {
        return false;
    }
    let _ = writeln!(std::io::stderr(), "{test}{SQLITE_ONLY}");
    true
}

/// Where a test's runtime keeps its data: on PostgreSQL (in a suite's child, or a
/// [`postgres_only`] test), a fresh database of the cluster (its URL); else the file
/// `sessions.db` in `dir`.
pub fn fresh_database(dir: &Path) -> PathBuf {
    #[cfg(feature = "postgres")]
    if let Some(cluster) = postgres_cluster() {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            CREATED.fetch_add(1, Ordering::Relaxed)
        );
        return PathBuf::from(create_database(&cluster, &name));
    }
    dir.join("sessions.db")
}

/// Creates database `name` on the cluster whose superuser URL is `cluster`; returns its URL.
#[cfg(feature = "postgres")]
fn create_database(cluster: &str, name: &str) -> String {
    let (base, _) = cluster.rsplit_once('/').expect("a database URL");
    let url = format!("{base}/{name}");
    let (cluster, sql) = (cluster.to_owned(), format!("CREATE DATABASE {name}"));
    // The sync client cannot run on a thread inside a tokio runtime.
    std::thread::spawn(move || {
        let mut client =
            postgres::Client::connect(&cluster, postgres::NoTls).expect("connect to PostgreSQL");
        client
            .batch_execute(&sql)
            .expect("a fresh PostgreSQL database");
    })
    .join()
    .expect("the thread creating a database");
    url
}

/// Whether the running test works on PostgreSQL.
pub fn on_postgres_now() -> bool {
    #[cfg(feature = "postgres")]
    {
        postgres_cluster().is_some()
    }
    #[cfg(not(feature = "postgres"))]
    {
        false
    }
}

/// The names of the tests of this test binary (`--list`).
pub fn test_names() -> Vec<String> {
    let exe = std::env::current_exe().expect("the test binary");
    let output = std::process::Command::new(&exe)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("list the tests");
    assert!(output.status.success(), "{} --list failed", exe.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
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
