//! Databases for the scenarios: created and migrated by the crate itself (a runtime started and
//! shut down on the file), then seeded in bulk with rusqlite directly; and the raw rusqlite
//! operations the baselines time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use durable_sessions::{Runtime, SessionId, SessionInfo, Synchronous};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::json;

use crate::runners::Empty;
use crate::BenchResult;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Opens `path` the way the store does: WAL, the given `synchronous`, a busy timeout.
pub fn open(path: &Path, sync: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", sync.as_pragma())?;
    Ok(conn)
}

/// Creates the database at `path` with the crate's current schema: starts a runtime on it in a
/// throwaway actix system and shuts it down.
pub fn create(path: &Path) -> BenchResult<()> {
    let path = path.to_path_buf();
    actix_rt::System::new().block_on(async move {
        let rt = Runtime::builder()
            .database(path)
            .runner(Empty)
            .sweep_on_start(false)
            .arbiters(1)
            .start()
            .await?;
        // Let the runtime's supervisor actor start before the system is dropped: one that never
        // ran is started while the system is torn down, where its timer panics (no reactor).
        actix_rt::time::sleep(Duration::from_millis(5)).await;
        rt.shutdown().await;
        Ok(())
    })
}

/// Removes a database file and its WAL and shared-memory files.
pub fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(sibling(path, suffix));
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Copies a closed (checkpointed) database file to `to`, replacing what was there.
pub fn copy(from: &Path, to: &Path) -> BenchResult<()> {
    remove(to);
    std::fs::copy(from, to)?;
    Ok(())
}

/// Closes `conn` after checkpointing, so the main file holds everything (ready to copy).
fn close(conn: Connection) -> BenchResult<()> {
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")?;
    conn.close().map_err(|(_, e)| e)?;
    Ok(())
}

/// The trigger that adds a new session's title to the title index (schema version 5).
const TITLE_TRIGGER: &str = "session_search_insert";

/// Inserts `n` top-level sessions as `Sessions::create` would store them (row, `session.created`
/// event at seq 0, the title index), in one transaction. Every `claim_every`-th session (when
/// non-zero) is left claimed by an earlier boot (a `session_claim` row with `claim_boot =
/// 'previous'`), as a crash would.
///
/// The title index is built once at the end, as the schema migration indexes an existing
/// store (`rebuild`, `optimize`): the trigger that indexes each created session is dropped
/// for the inserts and created again as it was (one title at a time, 1,000,000 sessions took
/// two minutes, the rebuild about ten seconds).
pub fn seed_sessions(path: &Path, n: usize, claim_every: usize) -> BenchResult<Vec<SessionId>> {
    let mut conn = open(path, Synchronous::Normal)?;
    let now = now_ms();
    let mut ids = Vec::with_capacity(n);
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let trigger: Option<String> = tx
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name = ?1",
                [TITLE_TRIGGER],
                |row| row.get(0),
            )
            .optional()?;
        if trigger.is_some() {
            tx.execute_batch(&format!("DROP TRIGGER {TITLE_TRIGGER}"))?;
        }
        {
            let mut session = tx.prepare(
                "INSERT INTO session (id, parent_id, title, directory, agent, model, metadata, \
                 time_created, time_updated) VALUES (?1, NULL, ?2, ?3, NULL, NULL, NULL, ?4, ?4)",
            )?;
            let mut claim = tx.prepare(
                "INSERT INTO session_claim (session_id, time_suspended, claim_boot) \
                 VALUES (?1, ?2, 'previous')",
            )?;
            let mut stream = tx.prepare("INSERT INTO event_stream (aggregate_id) VALUES (?1)")?;
            let mut event = tx.prepare(
                "INSERT INTO event (aggregate_id, stream, seq, type, data, time) \
                 VALUES (?1, last_insert_rowid(), 0, 'session.created', ?2, ?3)",
            )?;
            for i in 0..n {
                let id = SessionId::generate();
                let time = now - (n - i) as i64;
                let info = SessionInfo {
                    id: id.clone(),
                    parent_id: None,
                    title: format!("bench session {i}"),
                    directory: "/bench".into(),
                    agent: None,
                    model: None,
                    metadata: None,
                    time_created: time,
                    time_updated: time,
                    time_suspended: None,
                    resume_attempts: 0,
                };
                session.execute(params![id.as_str(), info.title, info.directory, time])?;
                if claim_every > 0 && i % claim_every == 0 {
                    claim.execute(params![id.as_str(), time])?;
                }
                stream.execute([id.as_str()])?;
                event.execute(params![
                    id.as_str(),
                    serde_json::to_string(&json!({ "info": info }))?,
                    time
                ])?;
                ids.push(id);
            }
        }
        if let Some(sql) = trigger {
            tx.execute_batch(&sql)?;
            tx.execute_batch(
                "INSERT INTO session_search(session_search) VALUES ('rebuild'); \
                 INSERT INTO session_search(session_search) VALUES ('optimize');",
            )?;
        }
        tx.commit()?;
    }
    close(conn)?;
    Ok(ids)
}

/// The bytes the database's pages hold, WAL included: `(page_count − freelist_count) ×
/// page_size`, read through a connection of its own.
pub fn used_bytes(path: &Path) -> BenchResult<f64> {
    let conn = open(path, Synchronous::Normal)?;
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    let size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(((pages - free) * size) as f64)
}

/// In a child (for profiling by hand): creates the database `db` with `n` sessions, one in
/// `claim_every` of them claimed (none when absent).
pub fn seed_child(args: &serde_json::Value) -> BenchResult<serde_json::Value> {
    let path = PathBuf::from(args["db"].as_str().ok_or("no db")?);
    let n = usize::try_from(args["n"].as_u64().ok_or("no n")?)?;
    // One claimed session in `claim_every` (none when absent), as the `sweep` scenario seeds.
    let claim_every = usize::try_from(args["claim_every"].as_u64().unwrap_or(0))?;
    remove(&path);
    create(&path)?;
    seed_sessions(&path, n, claim_every)?;
    Ok(json!({ "db": path, "sessions": n }))
}

/// The payload of every seeded event (a restart-notice-sized `session.synthetic`).
fn event_payload(id: &SessionId, seq: u64) -> String {
    json!({
        "sessionID": id,
        "text": format!("seeded event {seq}: the quick brown fox jumps over the lazy dog"),
        "description": "benchmark",
    })
    .to_string()
}

/// Inserts one session whose log holds `n` events (seqs `0..n`: `session.created`, then
/// `session.synthetic`), in one transaction.
pub fn seed_events(path: &Path, n: u64) -> BenchResult<SessionId> {
    let id = seed_sessions(path, 1, 0)?.remove(0);
    let mut conn = open(path, Synchronous::Normal)?;
    let now = now_ms();
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut event = tx.prepare(
                "INSERT INTO event (aggregate_id, stream, seq, type, data, time) \
                 VALUES (?1, (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1), ?2, \
                         'session.synthetic', ?3, ?4)",
            )?;
            for seq in 1..n {
                event.execute(params![
                    id.as_str(),
                    seq as i64,
                    event_payload(&id, seq),
                    now
                ])?;
            }
        }
        tx.commit()?;
    }
    close(conn)?;
    Ok(id)
}

/// The next seq of session `?1`, as the runtime reads it (schema version 10): one past the
/// newest seq of its log's newest segment (numbered in `event_stream`) in either index (the recent entries and
/// the settled history), never below its floor (`event_floor`, written by a compaction that
/// kept no event).
pub const NEXT_SEQ: &str = "SELECT MAX(COALESCE( \
     (SELECT MAX(seq) FROM event INDEXED BY event_recent \
      WHERE stream = (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1) AND recent = 1), \
     (SELECT MAX(seq) FROM event INDEXED BY event_log \
      WHERE stream = (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1) AND recent = 0), \
     -1) + 1, \
     COALESCE((SELECT seq FROM event_floor WHERE aggregate_id = ?1), 0))";

/// An event appended as the runtime appends it: to the recent entries, under its log's number
/// (the session's log must have one: every seeded session's has).
pub const INSERT_EVENT: &str = "INSERT INTO event (aggregate_id, stream, seq, type, data, time, \
     recent) VALUES (?1, (SELECT MAX(k) FROM event_stream WHERE aggregate_id = ?1), ?2, ?3, ?4, ?5, 1)";

/// A direct rusqlite connection doing the baselines' writes on sessions' claim rows.
pub struct Raw {
    conn: Connection,
    ids: Vec<String>,
    next: usize,
}

impl Raw {
    /// Opens `path` with `sync`; writes rotate over `ids`.
    pub fn open(path: &Path, sync: Synchronous, ids: &[SessionId]) -> BenchResult<Self> {
        Ok(Self {
            conn: open(path, sync)?,
            ids: ids.iter().map(|id| id.as_str().to_string()).collect(),
            next: 0,
        })
    }

    fn id(&mut self) -> String {
        self.next = (self.next + 1) % self.ids.len();
        self.ids[self.next].clone()
    }

    fn transaction(&mut self, id: &str, sql: &str, with_time: bool) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut stmt = tx.prepare_cached(sql)?;
            if with_time {
                stmt.execute(params![id, now_ms()])?;
            } else {
                stmt.execute([id])?;
            }
        }
        tx.commit()
    }

    /// One single-row UPDATE transaction. The value always changes: SQLite skips writing (and
    /// syncing) a row rewritten with identical content.
    pub fn commit(&mut self) -> rusqlite::Result<()> {
        let id = self.id();
        self.transaction(
            &id,
            "UPDATE session SET time_updated = time_updated + 1 WHERE id = ?1",
            false,
        )
    }

    /// The statements of the runtime's claim transaction, by hand: a savepoint, the next seq
    /// (one past the log's newest, floored), the `session.execution.started` insert (a
    /// serialized JSON payload) and the claim row's upsert. (A diagnostic: how much of a
    /// turn's commit is SQL work.)
    pub fn claim_shaped(&mut self) -> rusqlite::Result<()> {
        let id = self.id();
        let now = now_ms();
        let data = json!({ "boot": "0199a0b1c2d3e4f5a6b7c8d9e0f1a2b3" }).to_string();
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let sp = tx.savepoint()?;
            let seq: i64 = sp
                .prepare_cached(NEXT_SEQ)?
                .query_row([&id], |row| row.get(0))?;
            sp.prepare_cached(INSERT_EVENT)?.execute(params![
                id,
                seq,
                "session.execution.started",
                data,
                now
            ])?;
            sp.prepare_cached(
                "INSERT INTO session_claim (session_id, time_suspended, claim_boot) \
                 VALUES (?1, ?2, 'shaped') ON CONFLICT (session_id) DO UPDATE SET \
                 time_suspended = COALESCE(time_suspended, excluded.time_suspended), \
                 claim_boot = excluded.claim_boot",
            )?
            .execute(params![id, now])?;
            sp.commit()?;
        }
        tx.commit()
    }

    /// The naive turn: the claim in one transaction, an empty drain, the release in another.
    pub fn naive_turn(&mut self) -> rusqlite::Result<()> {
        let id = self.id();
        self.naive_claim(&id)?;
        self.naive_release(&id)
    }

    /// The naive turn's first transaction: the claim row of the next session in turn. Returns
    /// that session's id, for [`Raw::naive_release`].
    pub fn naive_claim_next(&mut self) -> rusqlite::Result<String> {
        let id = self.id();
        self.naive_claim(&id)?;
        Ok(id)
    }

    fn naive_claim(&mut self, id: &str) -> rusqlite::Result<()> {
        self.transaction(
            id,
            "INSERT INTO session_claim (session_id, time_suspended, claim_boot) \
             VALUES (?1, ?2, 'naive') ON CONFLICT (session_id) DO UPDATE SET \
             time_suspended = COALESCE(time_suspended, excluded.time_suspended), \
             claim_boot = excluded.claim_boot",
            true,
        )
    }

    /// The naive turn's second transaction: the release of `id`'s claim.
    pub fn naive_release(&mut self, id: &str) -> rusqlite::Result<()> {
        self.transaction(id, "DELETE FROM session_claim WHERE session_id = ?1", false)
    }
}

/// Runs `op` until `window` has passed (at least `min_ops` times, at most `max_ops`); returns
/// operations per second.
pub fn rate(
    window: Duration,
    min_ops: usize,
    max_ops: usize,
    mut op: impl FnMut() -> rusqlite::Result<()>,
) -> BenchResult<f64> {
    let started = Instant::now();
    let mut done = 0;
    while done < max_ops && (done < min_ops || started.elapsed() < window) {
        op()?;
        done += 1;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// Times `n` runs of `op`, in microseconds each.
pub fn latencies(n: usize, mut op: impl FnMut() -> rusqlite::Result<()>) -> BenchResult<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        op()?;
        out.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}
