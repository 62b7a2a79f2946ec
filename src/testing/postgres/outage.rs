//! Outages: the server taken away from its clients and brought back on the same data directory
//! and port (see the module docs, "Outages").

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{PgCluster, PgUnavailable, STOP_TIMEOUT};

/// How [`PgCluster::stop_server`] shuts the server down: PostgreSQL's shutdown modes
/// (`pg_ctl stop -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Waits for every client to disconnect.
    Smart,
    /// Rolls back open transactions, disconnects every client, writes a checkpoint.
    Fast,
    /// Kills every server process at once; the next start runs crash recovery.
    Immediate,
}

impl ShutdownMode {
    /// The mode's name for `pg_ctl -m`.
    pub fn name(self) -> &'static str {
        match self {
            ShutdownMode::Smart => "smart",
            ShutdownMode::Fast => "fast",
            ShutdownMode::Immediate => "immediate",
        }
    }
}

impl PgCluster {
    /// Whether the server runs (it was not stopped by [`PgCluster::stop_server`]).
    pub fn is_running(&self) -> bool {
        self.server.is_some()
    }

    /// Shuts the server down with `pg_ctl stop -m <mode>` (the `pg_ctl` beside `postgres`) and
    /// waits until it is gone; the data directory and the port are kept for
    /// [`PgCluster::start_server`]. Does nothing when the server is not running.
    ///
    /// # Errors
    /// [`PgUnavailable::NotStopped`] when `pg_ctl` fails (the server is then stopped
    /// immediately, as on drop); [`PgUnavailable::Io`] when `pg_ctl` cannot be run.
    pub fn stop_server(&mut self, mode: ShutdownMode) -> Result<(), PgUnavailable> {
        let Some(mut server) = self.server.take() else {
            return Ok(());
        };
        let output = self
            .command(self.binaries.dir.join("pg_ctl"))
            .arg("stop")
            .args(["-m", mode.name(), "-w", "-t"])
            .arg(STOP_TIMEOUT.as_secs().to_string())
            .arg("-D")
            .arg(self.data_dir())
            .stdin(Stdio::null())
            .output();
        let failure = match output {
            Ok(output) if output.status.success() => None,
            Ok(output) => {
                let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
                text.push_str(&String::from_utf8_lossy(&output.stdout));
                Some(PgUnavailable::NotStopped {
                    mode: mode.name(),
                    status: output.status.to_string(),
                    output: text.trim().to_owned(),
                })
            }
            Err(e) => Some(PgUnavailable::io("run pg_ctl stop")(e)),
        };
        if let Some(failure) = failure {
            self.server = Some(server);
            self.stop();
            return Err(failure);
        }
        // The server is gone: the wrapper's `wait` returns. Closing the pipe ends its watcher.
        drop(server.guard.take());
        let _ = server.child.wait();
        Ok(())
    }

    /// Starts the server again after [`PgCluster::stop_server`], on the same data directory and
    /// port, and waits until it accepts connections. Does nothing when it runs.
    ///
    /// # Errors
    /// As [`PgCluster::start`]'s last step: the server exited (e.g. another process took the
    /// port meanwhile) or did not accept connections in time.
    pub fn start_server(&mut self) -> Result<(), PgUnavailable> {
        if self.server.is_some() {
            return Ok(());
        }
        self.launch()
    }

    /// [`PgCluster::stop_server`] then [`PgCluster::start_server`]: `pg_ctl restart -m
    /// <mode>` on the same port. Returns how long the server was away (from the shutdown's
    /// start to the first connection accepted again).
    ///
    /// # Errors
    /// As those two.
    pub fn restart(&mut self, mode: ShutdownMode) -> Result<Duration, PgUnavailable> {
        let began = Instant::now();
        self.stop_server(mode)?;
        self.start_server()?;
        Ok(began.elapsed())
    }
}
