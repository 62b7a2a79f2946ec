//! A throwaway PostgreSQL cluster for tests and benchmarks (feature `testing-postgres`, Unix
//! only).
//!
//! [`PgCluster::start`] builds a private cluster from the PostgreSQL binaries installed on the
//! machine (the Debian `postgresql` package puts them in `/usr/lib/postgresql/<major>/bin`):
//!
//! 1. it finds `initdb` and `postgres` (see [`find_binaries`]);
//! 2. it creates a fresh directory under [`std::env::temp_dir`] (mode 0700) holding the data
//!    directory, the server log (`postgres.log`) and the Unix socket directory (`socket/`);
//! 3. it runs `initdb` with `trust` authentication, encoding UTF8, locale `C` and superuser
//!    `postgres`;
//! 4. it picks a free TCP port and starts `postgres` listening on `127.0.0.1` only, with the
//!    stock configuration (`fsync` on, `synchronous_commit` on) except
//!    [`max_connections`](PgCluster::MAX_CONNECTIONS) (300, enough for three nodes with their
//!    pools and listeners);
//! 5. it waits until the server accepts a connection.
//!
//! # Outages
//!
//! A test can take the server away from its clients and bring it back, on the same data
//! directory and port (the URLs stay valid): [`PgCluster::stop_server`] shuts it down with
//! `pg_ctl stop -m <mode>` and waits until it is gone (every connection is broken; the clients
//! see SQLSTATE 57P01 or a closed socket, then "connection refused"),
//! [`PgCluster::start_server`] starts it again and waits until it accepts connections, and
//! [`PgCluster::restart`] does both (`pg_ctl restart -m fast` is
//! `restart(ShutdownMode::Fast)`). What was committed survives: the data directory is kept, and
//! a fast or smart shutdown writes a checkpoint (an immediate one leaves crash recovery to the
//! next start).
//!
//! Dropping the [`PgCluster`] stops the server (immediate shutdown: nothing of a throwaway
//! cluster needs to be flushed) and removes the directory. Each test should use its own database
//! ([`PgCluster::create_database`]) or its own cluster.
//!
//! # Running as root
//!
//! `initdb` and `postgres` refuse to run as root. When the tests run as root (containers, CI),
//! every PostgreSQL process runs as an unprivileged user instead, through `runuser -u <user> --`
//! (or `su` when `runuser` is missing), and the cluster's directory is given to that user. The
//! user is `$DURABLE_SESSIONS_PG_USER` when set, else `durable_pg` (created with `useradd
//! --system` when missing), else `nobody` when no user can be created. The temp directory's
//! ancestors must be searchable by that user (`/tmp` is).
//!
//! # Orphans
//!
//! The server is started by a small `sh` wrapper that holds one end of a pipe from this
//! process: when this process ends in any way (even `SIGKILL`, which skips `Drop`), the pipe
//! closes and the wrapper shuts the server down, so no `postgres` outlives the test binary. Only
//! the directory stays behind in that case.
//!
//! # Skipping
//!
//! [`start_or_skip`] is what a test calls: it returns `None`, after printing one line saying
//! why, when PostgreSQL is not installed, except under `CI=true`, where a skipped PostgreSQL test
//! is a failure and it panics.
//!
//! # Async tests
//!
//! Everything here blocks (it runs processes and uses the synchronous `postgres` client, whose
//! calls panic on a thread that is inside a tokio runtime). Connections made here run on a
//! short-lived thread of their own, so [`PgCluster`]'s functions may be called from an
//! `#[actix_rt::test]` body too; the blocking is a second or two at start.

mod error;
mod host;
mod outage;

pub use self::error::{CreateDatabaseError, PgUnavailable};
pub use self::outage::ShutdownMode;

use self::host::{
    as_user, binaries_in, debian_bin_dirs, free_port, ids_of, make_temp_dir, off_runtime,
    running_as_root, unprivileged_user,
};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Environment variable naming the directory holding `initdb` and `postgres` (overrides the
/// search).
pub const BIN_ENV: &str = "DURABLE_SESSIONS_PG_BIN";

/// Environment variable naming the unprivileged user PostgreSQL runs as when the tests run as
/// root (default `durable_pg`, created when missing).
pub const USER_ENV: &str = "DURABLE_SESSIONS_PG_USER";

/// The user created (when missing) to run PostgreSQL as when the tests run as root.
pub const DEFAULT_USER: &str = "durable_pg";

/// The superuser `initdb` creates; every URL of a cluster connects as this role.
pub const SUPERUSER: &str = "postgres";

/// How long [`PgCluster::start`] waits for the server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How many ports [`PgCluster::start`] tries when the one it picked was taken meanwhile.
const PORT_ATTEMPTS: u32 = 5;

/// How long `Drop` and [`PgCluster::stop_server`] wait for the server to exit after asking it to.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The installed PostgreSQL server binaries [`PgCluster`] uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    /// The directory holding them.
    pub dir: PathBuf,
    /// `initdb`.
    pub initdb: PathBuf,
    /// `postgres` (the server).
    pub postgres: PathBuf,
}

/// A running throwaway PostgreSQL cluster; stopped and deleted on drop.
///
/// ```no_run
/// use durable_sessions::testing::postgres::start_or_skip;
///
/// let Some(pg) = start_or_skip("my_test") else { return };
/// let url = pg.create_database("my_test").unwrap();
/// let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
/// client.batch_execute("CREATE TABLE t (x int)").unwrap();
/// ```
pub struct PgCluster {
    dir: PathBuf,
    port: u16,
    binaries: PgBinaries,
    user: Option<String>,
    server: Option<Server>,
}

/// The wrapper process and the pipe whose closing stops the server.
struct Server {
    child: Child,
    guard: Option<ChildStdin>,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("bin", &self.binaries.dir)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl PgCluster {
    /// The server's `max_connections` (PostgreSQL's default is 100): room for three nodes with
    /// their pools, listeners and a test's own connections.
    pub const MAX_CONNECTIONS: u32 = 300;

    /// Creates, starts and waits for a new cluster: about 1.3 s on an idle 2-core machine, more
    /// under load (`initdb` is most of it).
    ///
    /// # Errors
    /// [`PgUnavailable::NotInstalled`] when no PostgreSQL binaries are found; otherwise the step
    /// that failed, with what `initdb` or the server said.
    pub fn start() -> Result<PgCluster, PgUnavailable> {
        let binaries = find_binaries()?;
        let user = if running_as_root() {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let dir = make_temp_dir()?;
        // From here on, `Drop` cleans up whatever was made.
        let mut cluster = PgCluster {
            dir,
            port: 0,
            binaries,
            user,
            server: None,
        };
        cluster.give_dir_to_user()?;
        cluster.initdb()?;
        let mut attempt = 1;
        loop {
            cluster.port = free_port().map_err(PgUnavailable::io("pick a free port"))?;
            match cluster.launch() {
                Ok(()) => return Ok(cluster),
                Err(PgUnavailable::Exited { log, .. })
                    if attempt < PORT_ATTEMPTS && log.contains("could not bind") =>
                {
                    // Another process took the port between our probe and the server's bind.
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`: the superuser on the default database.
    pub fn url(&self) -> String {
        self.database_url(SUPERUSER)
    }

    /// The URL of database `name` on this cluster (whether or not it exists).
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates database `name` (an isolated database for one test) and returns its URL.
    ///
    /// # Errors
    /// When `name` is not 1 to 63 of `[a-z0-9_]` (not starting with a digit), or the server
    /// refuses (e.g. it exists already).
    pub fn create_database(&self, name: &str) -> Result<String, CreateDatabaseError> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(CreateDatabaseError::InvalidName(name.to_owned()));
        }
        let sql = format!("CREATE DATABASE {name}");
        off_runtime(self.url(), move |url| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
            client.batch_execute(&sql)
        })
        .map_err(|source| CreateDatabaseError::Postgres {
            name: name.to_owned(),
            source,
        })?;
        Ok(self.database_url(name))
    }

    /// The TCP port the server listens on (on `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (data directory `data/`, log `postgres.log`, sockets `socket/`);
    /// removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries this cluster runs.
    pub fn binaries(&self) -> &PgBinaries {
        &self.binaries
    }

    /// The unprivileged user the server runs as, when the tests run as root.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The server log so far (empty when it cannot be read): worth printing when a test fails.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// A command running `program` as the cluster's user (as is when not root).
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        as_user(self.user.as_deref(), program.as_ref())
    }

    fn give_dir_to_user(&self) -> Result<(), PgUnavailable> {
        std::fs::create_dir(self.socket_dir()).map_err(PgUnavailable::io("create socket dir"))?;
        let Some(user) = &self.user else {
            return Ok(());
        };
        let (uid, gid) = ids_of(user)?;
        for path in [self.dir.clone(), self.socket_dir()] {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(PgUnavailable::io(
                format!("chown {} to {user}", path.display()),
            ))?;
        }
        Ok(())
    }

    fn initdb(&self) -> Result<(), PgUnavailable> {
        let output = self
            .command(&self.binaries.initdb)
            .arg("--pgdata")
            .arg(self.data_dir())
            .args(["--auth=trust", "--encoding=UTF8", "--locale=C"])
            .arg(format!("--username={SUPERUSER}"))
            // Skips fsyncing the fresh files only; the server runs with fsync on.
            .arg("--no-sync")
            .stdin(Stdio::null())
            .output()
            .map_err(PgUnavailable::io(format!(
                "run {}",
                self.binaries.initdb.display()
            )))?;
        if output.status.success() {
            return Ok(());
        }
        let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        stderr.push_str(&String::from_utf8_lossy(&output.stdout));
        if self.user.is_some() && stderr.contains("ermission denied") {
            stderr.push_str(&format!(
                "\n(hint: every ancestor of {} must be searchable by user {})",
                self.dir.display(),
                self.user.as_deref().unwrap_or_default()
            ));
        }
        Err(PgUnavailable::Initdb {
            status: output.status.to_string(),
            stderr: stderr.trim().to_owned(),
        })
    }

    /// Starts the server on `self.port` and waits until it accepts a connection.
    fn launch(&mut self) -> Result<(), PgUnavailable> {
        // The wrapper starts the server in the background, then waits for it. A watcher
        // subshell reads the pipe from this process (fd 3): at EOF (drop, or this process died)
        // it sends SIGQUIT, PostgreSQL's immediate shutdown.
        const WRAPPER: &str = r#"log=$1; shift
exec 3<&0
"$@" </dev/null >>"$log" 2>&1 3<&- &
pid=$!
(cat <&3 >/dev/null 2>&1; kill -QUIT "$pid" 2>/dev/null) &
exec 3<&-
wait "$pid""#;
        let mut command = self.command("sh");
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("sh")
            .arg(self.log_path())
            .arg(&self.binaries.postgres)
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.socket_dir())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("max_connections={}", Self::MAX_CONNECTIONS))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command
            .spawn()
            .map_err(PgUnavailable::io("run sh to start postgres"))?;
        let guard = child.stdin.take();
        self.server = Some(Server { child, guard });

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.server_exit()? {
                self.server = None;
                return Err(PgUnavailable::Exited {
                    status: status.to_string(),
                    log: self.log(),
                });
            }
            let last_error = match off_runtime(self.url(), |url| {
                postgres::Client::connect(&url, postgres::NoTls).map(drop)
            }) {
                Ok(()) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                self.stop();
                return Err(PgUnavailable::NotReady {
                    timeout: READY_TIMEOUT,
                    last_error,
                    log: self.log(),
                });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn server_exit(&mut self) -> Result<Option<ExitStatus>, PgUnavailable> {
        match &mut self.server {
            Some(server) => server
                .child
                .try_wait()
                .map_err(PgUnavailable::io("wait for postgres")),
            None => Ok(None),
        }
    }

    /// Shuts the server down (immediate mode) and waits until it is gone.
    fn stop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        // Closing the pipe makes the wrapper send SIGQUIT and exit once the server is gone.
        drop(server.guard.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match server.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => thread::sleep(Duration::from_millis(5)),
            }
        }
        // The wrapper did not finish: stop the server through its pid file, then the wrapper.
        let _ = self
            .command(self.binaries.dir.join("pg_ctl"))
            .arg("stop")
            .args(["-m", "immediate", "-D"])
            .arg(self.data_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = server.child.kill();
        let _ = server.child.wait();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a cluster for test `test_name`, or says why not.
///
/// Returns `None` after printing one line (`skipped <test>: PostgreSQL not installed (apt-get
/// install postgresql)`) when PostgreSQL is not installed; the line goes straight to stderr, so
/// it shows even for a passing test whose output the test harness captures.
///
/// # Panics
/// When PostgreSQL is not installed and the environment has `CI=true` (a skipped PostgreSQL
/// test is a failure in CI), and whenever PostgreSQL is installed but the cluster does not
/// start (a broken setup is not a skip).
pub fn start_or_skip(test_name: &str) -> Option<PgCluster> {
    match PgCluster::start() {
        Ok(cluster) => Some(cluster),
        Err(PgUnavailable::NotInstalled) => {
            let line = format!(
                "skipped {test_name}: PostgreSQL not installed (apt-get install postgresql)"
            );
            if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
                panic!("{line}, and CI=true: PostgreSQL tests must run in CI");
            }
            let _ = writeln!(io::stderr(), "{line}");
            None
        }
        Err(e) => panic!("{test_name}: cannot start PostgreSQL: {e}"),
    }
}

/// Finds `initdb` and `postgres`: in `$DURABLE_SESSIONS_PG_BIN` when set, else the first
/// directory on `PATH` holding both, else `/usr/lib/postgresql/<highest version>/bin`, else
/// `/usr/local/pgsql/bin` (a source install).
///
/// # Errors
/// [`PgUnavailable::BadBinDir`] when the variable is set but wrong;
/// [`PgUnavailable::NotInstalled`] when nothing is found.
pub fn find_binaries() -> Result<PgBinaries, PgUnavailable> {
    if let Some(dir) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return binaries_in(&dir).ok_or(PgUnavailable::BadBinDir(dir));
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(debian_bin_dirs())
        .chain([PathBuf::from("/usr/local/pgsql/bin")])
        .find_map(|dir| binaries_in(&dir))
        .ok_or(PgUnavailable::NotInstalled)
}
