//! Which database a test's runtime works on: a SQLite file in the test's temp directory (the
//! default), or — inside [`on_postgres`], with the `postgres` feature — a fresh database of a
//! throwaway PostgreSQL cluster, one per runtime. A suite thus runs against both backends from
//! one source: each test runs on SQLite as itself, and a `postgres_backend_passes_the_…_suite`
//! test runs the same test functions again on PostgreSQL.

use std::path::{Path, PathBuf};

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
