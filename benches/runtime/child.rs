//! Memory-sensitive scenarios run in a fresh child process: the bench binary re-executes itself
//! with `DS_BENCH_CHILD=<kind>` and its arguments as JSON in `DS_BENCH_ARGS`; the child prints
//! one `DS_BENCH_RESULT <json>` line on stdout. Its `VmHWM` (peak RSS) is then its own.
//!
//! The same entry point serves profiling by hand, e.g. under `valgrind --tool=massif`:
//! `DS_BENCH_CHILD=seed DS_BENCH_ARGS='{"db":"/tmp/m.db","n":5000}' <bench binary>` creates a
//! database, then `DS_BENCH_CHILD=memory DS_BENCH_ARGS='{"db":"/tmp/m.db","n":5000,
//! "idle_ms":20000}' valgrind --tool=massif <bench binary>` profiles the memory scenario.

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
