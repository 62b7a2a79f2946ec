//! Real server processes ("nodes") sharing one PostgreSQL database, for the multi-node tests:
//! start, `SIGKILL`, `SIGSTOP`/`SIGCONT` and restart the `server` example (`process`); HTTP
//! requests and a Server-Sent Events reader (`client`); a client that spreads a workload over
//! the live nodes and the ledger of what it was promised (`workload`); and a consistent
//! snapshot of the database read with the sync `postgres` client (`snapshot`) with the
//! invariants checked on it (`checks`).
//!
//! Everything here blocks: call it from a plain `#[test]` thread (the sync `postgres` client
//! and `reqwest`'s blocking one panic inside a tokio runtime).

use std::time::{SystemTime, UNIX_EPOCH};

mod checks;
mod client;
mod process;
mod snapshot;
mod workload;

pub use checks::{is_client_write, quiesce, sql_violations};
pub use client::{call, request, Sse, SseEvent};
pub use process::{Node, NodeOptions, Nodes};
pub use snapshot::{connect, notices_after, PgView, Writer};
pub use workload::{words, Ledger, Spread};

/// Milliseconds since the Unix epoch (the clock the nodes stamp events with: same machine).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
