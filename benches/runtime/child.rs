//! Memory-sensitive scenarios run in a fresh child process: the bench binary re-executes itself
//! with `DS_BENCH_CHILD=<kind>` and its arguments as JSON in `DS_BENCH_ARGS`; the child prints
//! one `DS_BENCH_RESULT <json>` line on stdout. Its `VmHWM` (peak RSS) is then its own.
//!
//! The same entry point serves profiling by hand, e.g. under `valgrind --tool=massif`:
//! `DS_BENCH_CHILD=seed DS_BENCH_ARGS='{"db":"/tmp/m.db","n":5000}' <bench binary>` creates a
//! database, then `DS_BENCH_CHILD=memory DS_BENCH_ARGS='{"db":"/tmp/m.db","n":5000,
//! "idle_ms":20000}' valgrind --tool=massif <bench binary>` profiles the memory scenario.

#[cfg(feature = "testing-postgres")]
use std::io::{BufRead as _, BufReader, Write as _};
#[cfg(feature = "testing-postgres")]
use std::process::{Child, ChildStdin, ChildStdout};
use std::process::{Command, ExitCode, Stdio};

use serde_json::Value;

use crate::BenchResult;

const KIND: &str = "DS_BENCH_CHILD";
const ARGS: &str = "DS_BENCH_ARGS";
const RESULT: &str = "DS_BENCH_RESULT ";

/// A field of this process's `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Current resident set size, MiB.
pub fn rss_mib() -> f64 {
    status_kib("VmRSS").unwrap_or(0) as f64 / 1024.0
}

/// Peak resident set size of this process, MiB.
pub fn peak_rss_mib() -> f64 {
    status_kib("VmHWM").unwrap_or(0) as f64 / 1024.0
}

/// The allocator the children run with, for the table's notes.
pub const ALLOCATOR: &str = "glibc malloc; malloc_trim(0) in the after_passivation hook";

/// Runs the child scenario `kind` with `args` in a fresh process and returns its result.
pub fn spawn(kind: &str, args: &Value) -> BenchResult<Value> {
    let output = Command::new(std::env::current_exe()?)
        .env(KIND, kind)
        .env(ARGS, args.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find_map(|l| l.strip_prefix(RESULT));
    match (output.status.success(), line) {
        (true, Some(json)) => Ok(serde_json::from_str(json)?),
        _ => Err(format!("child `{kind}` failed ({}): {stdout}", output.status).into()),
    }
}

/// In a child process: runs the scenario named by the environment and prints its result.
/// Returns `None` in the parent.
pub fn dispatch() -> Option<ExitCode> {
    let kind = std::env::var(KIND).ok()?;
    let result = std::env::var(ARGS)
        .map_err(|e| e.into())
        .and_then(|a| serde_json::from_str::<Value>(&a).map_err(Into::into))
        .and_then(|args| match kind.as_str() {
            "sweep" => crate::sweep::child(&args),
            "memory" => crate::memory::child(&args),
            "memory-floor" => crate::memory::floor_child(&args),
            "seed" => crate::db::seed_child(&args),
            "growth-turns" => crate::growth::turns_child(&args),
            #[cfg(feature = "testing-postgres")]
            "pg-turns" => crate::postgres_node::turns_child(&args),
            #[cfg(feature = "testing-postgres")]
            "pg-owner" => crate::postgres_node::owner_child(&args),
            #[cfg(feature = "http")]
            "sse-server" => crate::sse_server::child(&args),
            other => Err(format!("unknown child scenario {other}").into()),
        });
    Some(match result {
        Ok(value) => {
            println!("{RESULT}{value}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("child `{kind}` failed: {e}");
            ExitCode::FAILURE
        }
    })
}

/// A numeric field of a child's result.
pub fn field(value: &Value, name: &str) -> BenchResult<f64> {
    value
        .get(name)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("child result lacks `{name}`: {value}").into())
}

/// A child the parent talks to while it runs (a node of a cluster; feature `testing-postgres`): it
/// announces steps with [`announce`] lines, waits for the parent's [`Live::send`] with
/// [`from_parent`], and prints its `DS_BENCH_RESULT` line at the end. Killed (`SIGKILL`) and
/// reaped on drop.
#[cfg(feature = "testing-postgres")]
#[derive(Debug)]
pub struct Live {
    kind: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// The prefix of a step a live child announces: `DS_BENCH_STEP <name> <json>`.
#[cfg(feature = "testing-postgres")]
const STEP: &str = "DS_BENCH_STEP ";

#[cfg(feature = "testing-postgres")]
impl Live {
    /// Starts the child scenario `kind` with `args`, its stdin and stdout piped to us.
    pub fn start(kind: &str, args: &Value) -> BenchResult<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(KIND, kind)
            .env(ARGS, args.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().ok_or("the child has no stdout")?);
        Ok(Self {
            kind: kind.to_owned(),
            child,
            stdin,
            stdout,
        })
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Blocks until the child announces `step`, and returns what it announced with it.
    pub fn expect(&mut self, step: &str) -> BenchResult<Value> {
        self.read_until(|line| {
            let rest = line.strip_prefix(STEP)?;
            let (name, json) = rest.split_once(' ')?;
            (name == step).then(|| json.to_owned())
        })
    }

    /// Sends one line to the child's stdin.
    pub fn send(&mut self, line: &str) -> BenchResult<()> {
        let stdin = self.stdin.as_mut().ok_or("the child's stdin is closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Closes the child's stdin, reads its result and waits for it to exit.
    pub fn finish(mut self) -> BenchResult<Value> {
        drop(self.stdin.take());
        let result = self.read_until(|line| line.strip_prefix(RESULT).map(str::to_owned))?;
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("child `{}` exited {status}", self.kind).into());
        }
        Ok(result)
    }

    /// Kills the child with `SIGKILL` (no cleanup of any kind runs in it) and reaps it.
    pub fn kill(&mut self) -> BenchResult<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    fn read_until(&mut self, mut pick: impl FnMut(&str) -> Option<String>) -> BenchResult<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                let status = self.child.wait()?;
                return Err(format!("child `{}` ended ({status}) early", self.kind).into());
            }
            if let Some(json) = pick(line.trim_end()) {
                return Ok(serde_json::from_str(&json)?);
            }
        }
    }
}

#[cfg(feature = "testing-postgres")]
impl Drop for Live {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a live child: tells the parent that `step` was reached, with `value`.
#[cfg(feature = "testing-postgres")]
pub fn announce(step: &str, value: &Value) {
    println!("{STEP}{step} {value}");
    let _ = std::io::stdout().flush();
}

/// In a live child: resolves with the next line the parent sends (empty once it closed our
/// stdin). The line is read on a thread of its own, so the actix system keeps running.
#[cfg(feature = "testing-postgres")]
pub fn from_parent() -> futures::channel::oneshot::Receiver<String> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(line.trim_end().to_owned());
    });
    rx
}
