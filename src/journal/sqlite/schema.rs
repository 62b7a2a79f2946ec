//! Schema migrations keyed by `PRAGMA user_version`, applied in one transaction. Each
//! migration's doc keeps the history of why; the tables as they are at the newest version:
//!
//! | table | a row is | keyed by |
//! |---|---|---|
//! | `session` | a session: parent, title, directory, agent, model, metadata, times, and `log_start` (the first seq a replay returns) | `id` |
//! | `session_claim` | a claimed session (`time_suspended`, `claim_seq`, `claim_boot`), or one whose adoption the sweep counted (`resume_attempts`); only such sessions have a row | `session_id` |
//! | `event` | an event of a session's log: `type`, `data` (JSON), `time`; `stream` is its log's number, `recent` whether it is still indexed among the recent entries | rowid; unique `(stream, seq)` in `event_log` (settled) or `event_recent` (recent) |
//! | `event_stream` | a segment of a session's log: its number `k` and first seq | `k`; `(aggregate_id, k, first_seq)` |
//! | `event_floor` | the next seq of a session whose log a compaction emptied | `aggregate_id` |
//! | `session_input` | an admitted prompt: `delivery`, `admitted_seq`, `promoted_seq` (NULL while pending), `wake` (owed a turn) | `id`; pending `(session_id, admitted_seq)`; woken `session_id` |
//! | `session_message` | a transcript message: `type`, `seq`, `data`, `interrupted` | `id`; unique `(session_id, seq)`; `(session_id, type, seq)` |
//! | `session_search` | the FTS5 trigram index of titles, kept by triggers on `session` | `rowid` of `session` |
//!
//! The latest interrupt request of a session is found through the partial index
//! `event_interrupt` (`(aggregate_id, seq)` of `session.interrupt.requested` events).

use rusqlite::{Connection, TransactionBehavior};

use crate::error::StoreError;

/// Version 1: sessions, the event log, the prompt inbox and the transcript.
const V1: &str = r"
CREATE TABLE session (
    id              TEXT PRIMARY KEY,
    parent_id       TEXT NULL,
    title           TEXT NOT NULL,
    directory       TEXT NOT NULL,
    agent           TEXT NULL,
    model           TEXT NULL,
    metadata        TEXT NULL,
    time_created    INTEGER NOT NULL,
    time_updated    INTEGER NOT NULL,
    time_suspended  INTEGER NULL,
    resume_attempts INTEGER NOT NULL DEFAULT 0,
    claim_boot      TEXT NULL
);
CREATE INDEX session_parent ON session(parent_id);
CREATE INDEX session_suspended ON session(time_suspended) WHERE time_suspended IS NOT NULL;
CREATE INDEX session_created ON session(time_created, id);
CREATE INDEX session_directory_created ON session(directory, time_created, id);

CREATE TABLE event (
    aggregate_id TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT NOT NULL,
    data         TEXT NOT NULL,
    time         INTEGER NOT NULL,
    PRIMARY KEY (aggregate_id, seq)
) WITHOUT ROWID;
CREATE INDEX event_interrupt ON event(aggregate_id, seq)
    WHERE type = 'session.interrupt.requested';

CREATE TABLE event_sequence (
    aggregate_id TEXT PRIMARY KEY,
    seq          INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE session_input (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    admitted_seq INTEGER NOT NULL,
    prompt       TEXT NOT NULL,
    delivery     TEXT NOT NULL CHECK (delivery IN ('steer', 'queue')),
    time_created INTEGER NOT NULL,
    promoted_seq INTEGER NULL
);
CREATE INDEX session_input_pending ON session_input(session_id, admitted_seq)
    WHERE promoted_seq IS NULL;

CREATE TABLE session_message (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    type         TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    data         TEXT NOT NULL,
    time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL,
    UNIQUE (session_id, seq)
);
CREATE INDEX session_message_type ON session_message(session_id, type, seq);
";

/// Version 2: the event log becomes a rowid table with a unique `(aggregate_id, seq)` index.
///
/// Keyed by `(aggregate_id, seq)`, every append went to its session's own leaf page, so a batch
/// appending to 1,000 sessions (a busy writer, the restart sweep) dirtied 1,000 pages of the
/// table, each holding whole payloads. Appended by rowid, new events fill the table's last
/// pages together and only the narrow index entries land per session.
const V2: &str = r"
CREATE TABLE event_v2 (
    aggregate_id TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT NOT NULL,
    data         TEXT NOT NULL,
    time         INTEGER NOT NULL
);
INSERT INTO event_v2 (aggregate_id, seq, type, data, time)
    SELECT aggregate_id, seq, type, data, time FROM event ORDER BY time, aggregate_id, seq;
DROP TABLE event;
ALTER TABLE event_v2 RENAME TO event;
CREATE UNIQUE INDEX event_aggregate_seq ON event(aggregate_id, seq);
CREATE INDEX event_interrupt ON event(aggregate_id, seq)
    WHERE type = 'session.interrupt.requested';
";

/// Version 3: what recovery needs to keep the contract for acknowledged and interrupted work.
///
/// - `session.claim_seq`: the seq of the `session.execution.started` event that took the claim
///   (kept across resume attempts), so recovery knows which inputs the claimed turn promoted
///   and whether a durable interrupt request came after it. Claims left by version 2 get their
///   latest `execution.started`.
/// - `session_input.wake`: the admission asked for a wake (`resume`) and no turn has had the
///   chance to serve it yet; the restart sweep adopts sessions holding such inputs, so an
///   acknowledged prompt runs even when the process died before its wake. Inputs admitted
///   before this version are left unmarked (whether they asked for a wake is not recorded).
/// - `session_message.interrupted`: a user interrupted the turn that promoted this prompt. For
///   prompts stored before, it is derived from the log: the first terminal that released the
///   claim after the promotion was a (non-shutdown) interruption.
const V3: &str = r"
ALTER TABLE session ADD COLUMN claim_seq INTEGER NULL;
UPDATE session SET claim_seq = (
    SELECT MAX(seq) FROM event
    WHERE aggregate_id = session.id AND type = 'session.execution.started'
) WHERE time_suspended IS NOT NULL;
ALTER TABLE session_input ADD COLUMN wake INTEGER NOT NULL DEFAULT 0;
CREATE INDEX session_input_wake ON session_input(session_id)
    WHERE promoted_seq IS NULL AND wake = 1;
ALTER TABLE session_message ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
UPDATE session_message SET interrupted = 1 WHERE type = 'user' AND (
    SELECT t.type FROM event t
    WHERE t.aggregate_id = session_message.session_id AND t.seq > session_message.seq
      AND (t.type IN ('session.execution.succeeded', 'session.execution.failed')
           OR (t.type = 'session.execution.interrupted'
               AND json_extract(t.data, '$.reason') <> 'shutdown'))
    ORDER BY t.seq LIMIT 1
) = 'session.execution.interrupted';
";

/// Version 4: retention. `session.log_start` is the first seq of the session's log a replay
/// returns: 0 until its older events are compacted (`RuntimeBuilder::retain_events`), then the
/// seq compaction kept from. The seq counter is never reset, so new events go on after it.
const V4: &str = r"
ALTER TABLE session ADD COLUMN log_start INTEGER NOT NULL DEFAULT 0;
";

/// Version 5: reads whose cost stays flat as the store grows (issue #15).
///
/// - `session_parent` indexes children only. Top-level sessions (nearly every row) all had the
///   key NULL, and the planner read `parent_id IS NULL` through it: the restart sweep's lists
///   of claimed and owed sessions, and a top-level listing, visited every top-level session.
///   Now those filters cannot use it, and the lists are read from the claims
///   (`session_claimed`) or the inbox's wake marks; `parent_id = ?` still implies the index's
///   condition.
/// - `session_claimed` replaces `session_suspended` with the sweep's order, `(time_suspended,
///   id)`: the sweep and the claim statistics read the claimed sessions only.
/// - `session_search`: an FTS5 index of the titles with the trigram tokenizer (external
///   content: the `session` table itself, by rowid, kept by triggers), so that a search
///   reads the sessions whose title holds every three-character piece of the text, not every
///   title. The `LIKE` stays as the exact test of each candidate (see `list_sessions`); a
///   search shorter than three characters (no trigram) is a `LIKE` scan as before. Each
///   commit that creates sessions adds a small segment to the index; `automerge` 0 leaves
///   merging them to FTS5's "crisis merges" (the 16 segments of a level at once) instead of
///   incremental merge work in every 64th write, which made the writer pause up to hundreds
///   of milliseconds (docs/bench-notes/cost-that-stays-flat.md, "schema version 5").
///   The titles stored before this version are indexed by the migration (`rebuild`, then
///   `optimize` into one segment; about 12 s for 1,000,000 sessions). Rowids of `session` are
///   kept by `VACUUM` (the table has indexes, so it is copied row by row with its rowids);
///   `INSERT INTO session_search(session_search) VALUES ('rebuild')` rebuilds the index from
///   the table in any case.
const V5: &str = r"
DROP INDEX session_parent;
CREATE INDEX session_parent ON session(parent_id) WHERE parent_id IS NOT NULL;
DROP INDEX session_suspended;
CREATE INDEX session_claimed ON session(time_suspended, id) WHERE time_suspended IS NOT NULL;
CREATE VIRTUAL TABLE session_search USING fts5(
    title, content = 'session', content_rowid = 'rowid', tokenize = 'trigram'
);
INSERT INTO session_search(session_search, rank) VALUES ('automerge', 0);
INSERT INTO session_search(session_search) VALUES ('rebuild');
INSERT INTO session_search(session_search) VALUES ('optimize');
CREATE TRIGGER session_search_insert AFTER INSERT ON session BEGIN
    INSERT INTO session_search(rowid, title) VALUES (new.rowid, new.title);
END;
CREATE TRIGGER session_search_delete AFTER DELETE ON session BEGIN
    INSERT INTO session_search(session_search, rowid, title) VALUES ('delete', old.rowid, old.title);
END;
CREATE TRIGGER session_search_update AFTER UPDATE OF title ON session BEGIN
    INSERT INTO session_search(session_search, rowid, title) VALUES ('delete', old.rowid, old.title);
    INSERT INTO session_search(rowid, title) VALUES (new.rowid, new.title);
END;
";

/// Version 6: a turn writes no page of its own per session beyond the event index (issue #15).
///
/// A group commit of 500 turns' claims on a store of 1,000,000 sessions wrote 1,680 WAL pages:
/// the event index `(aggregate_id, seq)` (674), and two more pages per session that nothing
/// else of the batch shares: the session's `event_sequence` leaf (500) and its wide `session`
/// row, rewritten by the claim (509). Both go:
///
/// - `event_sequence` is dropped. A session's next seq is one past the newest seq of its log,
///   read from the event index (the leaf the event's own index entry dirties anyway), and
///   never below its row in `event_floor`: the only log whose newest event is gone is one a
///   compaction kept no event of (`keep_last` 0), and that compaction writes the floor (one
///   past the log's last seq), so seqs stay monotonic and the floor is written at compaction
///   only, never per turn; nothing of a turn reads the session's row for it either. The
///   migration writes a floor wherever the counter was ahead of the log, so no seq is handed
///   out twice.
/// - The claim (`time_suspended`, `claim_seq`, `claim_boot`, `resume_attempts`) moves to
///   `session_claim`, a narrow table with a row only while a session holds a claim or counts
///   resume attempts (the restart sweep counts an adoption before it claims): a claim inserts
///   its row, a release deletes it, and together they dirty a few pages of a small table
///   instead of each session's row. `session_claim_time` is the sweep's order (it replaces
///   `session_claimed`). Claims and counts stored before are moved over, then the columns are
///   dropped from `session` (each `DROP COLUMN` rewrites the table once; rowids, and so the
///   title index, are kept).
///
/// With both, a commit writes no more pages at 1,000,000 sessions than at 1,000 (nearly all of
/// them the event index either way); the figures are in docs/bench-notes/cost-that-stays-flat.md,
/// "Schema version 6". The migration's time is mostly the four rewrites of `session`.
const V6: &str = r"
CREATE TABLE session_claim (
    session_id      TEXT PRIMARY KEY REFERENCES session(id) ON DELETE CASCADE,
    time_suspended  INTEGER NULL,
    claim_seq       INTEGER NULL,
    claim_boot      TEXT NULL,
    resume_attempts INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX session_claim_time ON session_claim(time_suspended, session_id)
    WHERE time_suspended IS NOT NULL;
INSERT INTO session_claim (session_id, time_suspended, claim_seq, claim_boot, resume_attempts)
    SELECT id, time_suspended, claim_seq, claim_boot, resume_attempts FROM session
    WHERE time_suspended IS NOT NULL OR resume_attempts <> 0;
CREATE TABLE event_floor (
    aggregate_id TEXT PRIMARY KEY,
    seq          INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO event_floor (aggregate_id, seq)
    SELECT q.aggregate_id, q.seq + 1 FROM event_sequence q
    WHERE q.seq + 1 > COALESCE(
        (SELECT MAX(e.seq) FROM event e WHERE e.aggregate_id = q.aggregate_id) + 1, 0);
DROP TABLE event_sequence;
DROP INDEX session_claimed;
ALTER TABLE session DROP COLUMN time_suspended;
ALTER TABLE session DROP COLUMN resume_attempts;
ALTER TABLE session DROP COLUMN claim_boot;
ALTER TABLE session DROP COLUMN claim_seq;
";

/// Version 7: a commit no longer writes a page of the event index per session (issue #15).
///
/// Every event was indexed by `(aggregate_id, seq)` as it was appended, so a group commit of
/// 500 turns dirtied one leaf of that index per session once the sessions had history (about
/// 800 WAL pages for 500 claims on a 1,000-session store, against 49 on a fresh one, where the
/// sessions' few entries share leaves). Now the index is split in two by the new column
/// `event.recent`:
///
/// - `event_recent`: the entries of the events appended since the writer last *settled* the
///   log. It stays small (a few thousand entries), so a commit of many sessions' events
///   dirties a few dozen of its leaves, as a fresh store's index did.
/// - `event_log`: every other event, the long per-session history.
///
/// Settling (`UPDATE event SET recent = 0 WHERE recent = 1`, the writer's own transaction after
/// a batch, once some thousands of events have come since the last time, and when it goes
/// idle) moves the recent entries to `event_log`: one leaf per session for all the events the
/// session got in between, not one per commit. A session's recent seqs are always above its
/// settled ones (a settle takes them all), and every reader asks both indexes (the SQL names
/// them with `INDEXED BY`, so a statement that could not use them fails when prepared instead
/// of scanning the log). Rows stored before are settled (`recent` 0); the migration rebuilds
/// the index under its new name, about a second per million events.
const V7: &str = r"
ALTER TABLE event ADD COLUMN recent INTEGER NOT NULL DEFAULT 0;
DROP INDEX event_aggregate_seq;
CREATE UNIQUE INDEX event_log ON event(aggregate_id, seq) WHERE recent = 0;
CREATE UNIQUE INDEX event_recent ON event(aggregate_id, seq) WHERE recent = 1;
";

/// Version 8: a claim and its release write one page fewer (issue #15).
///
/// `session_claim_time` ordered the claims by time for the restart sweep and the claim
/// statistics. `session_claim` holds a row only while a session is claimed (or counts resume
/// attempts), so those reads scan it and sort what they find, and every claim and release no
/// longer writes a leaf of the index beside the row: under `synchronous = FULL`, where each
/// commit syncs what it wrote, a turn's two commits sync about 2 pages fewer.
const V8: &str = r"
DROP INDEX session_claim_time;
";

/// Version 9: the log's per-session indexes key a session by a small integer (issue #15).
///
/// `event_log` and `event_recent` were keyed by `(aggregate_id, seq)`: a 36-character session
/// id in every entry, about 85 entries to a leaf. Settling the recent entries writes a leaf of
/// `event_log` per active session, and one leaf in five also split, its neighbours rewritten
/// too (docs/bench-notes/cost-that-stays-flat.md, "Schema v9"). Each log now has a number
/// (`event_stream.k`, given on its first event) and the indexes are keyed by `(stream, seq)`:
/// entries of about a dozen bytes, so the same settle writes about a third of the pages, and
/// the recent entries a commit touches share a few leaves. `aggregate_id` stays in the row (it
/// is what the log is read by; `event_stream` turns it into the key). The table is rebuilt so
/// that `stream` can be `NOT NULL` (a row without one would escape both unique indexes); rowids
/// are kept.
const V9: &str = r"
CREATE TABLE event_stream (
    k            INTEGER PRIMARY KEY,
    aggregate_id TEXT NOT NULL UNIQUE
);
INSERT INTO event_stream (aggregate_id)
    SELECT aggregate_id FROM event GROUP BY aggregate_id ORDER BY MIN(rowid);
CREATE TABLE event_v9 (
    aggregate_id TEXT NOT NULL,
    stream       INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    type         TEXT NOT NULL,
    data         TEXT NOT NULL,
    time         INTEGER NOT NULL,
    recent       INTEGER NOT NULL DEFAULT 0
);
INSERT INTO event_v9 (rowid, aggregate_id, stream, seq, type, data, time, recent)
    SELECT e.rowid, e.aggregate_id, s.k, e.seq, e.type, e.data, e.time, e.recent
    FROM event e JOIN event_stream s ON s.aggregate_id = e.aggregate_id
    ORDER BY e.rowid;
DROP TABLE event;
ALTER TABLE event_v9 RENAME TO event;
CREATE INDEX event_interrupt ON event(aggregate_id, seq)
    WHERE type = 'session.interrupt.requested';
CREATE UNIQUE INDEX event_log ON event(stream, seq) WHERE recent = 0;
CREATE UNIQUE INDEX event_recent ON event(stream, seq) WHERE recent = 1;
";

/// Version 10: a log in segments (`journal::sqlite::segments`). A session may have several
/// rows in `event_stream`, each a segment of its log, its events keyed by `(k, seq)` as
/// before; a session back after a long absence appends to a new segment, numbered next to
/// the sessions written now, instead of at the end of its old range among the logs of
/// sessions idle for as long (at 1,000,000 sessions, each settle rewrote leaves of the
/// history scattered over the whole file). The table is rebuilt without the unique
/// constraint on `aggregate_id`, with each segment's first seq (0 for the logs numbered
/// before: each is one segment from its start), indexed by `(aggregate_id, k, first_seq)` so
/// that a read finds the segment holding a seq in the index alone; numbers are kept.
const V10: &str = r"
CREATE TABLE event_stream_v10 (
    k            INTEGER PRIMARY KEY,
    aggregate_id TEXT NOT NULL,
    first_seq    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO event_stream_v10 (k, aggregate_id)
    SELECT k, aggregate_id FROM event_stream ORDER BY k;
DROP TABLE event_stream;
ALTER TABLE event_stream_v10 RENAME TO event_stream;
CREATE INDEX event_stream_session ON event_stream(aggregate_id, k, first_seq);
";

/// Every migration in order; migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10];

/// The newest schema version this crate knows.
pub(crate) const LATEST_VERSION: i64 = MIGRATIONS.len() as i64;

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

fn refuse_newer(found: i64) -> Result<(), StoreError> {
    if found > LATEST_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            known: LATEST_VERSION,
        });
    }
    Ok(())
}

/// Brings the database up to [`LATEST_VERSION`], applying every pending migration in one
/// immediate transaction. A database newer than this crate is refused with
/// [`StoreError::SchemaTooNew`] and left untouched.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found = user_version(conn)?;
    refuse_newer(found)?;
    if found == LATEST_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have migrated between the first read and taking the write lock.
    let current = user_version(&tx)?;
    refuse_newer(current)?;
    let start = usize::try_from(current)
        .map_err(|_| StoreError::Inconsistent(format!("negative user_version {current}")))?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        log::info!("applying schema migration {} -> {}", i, i + 1);
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "user_version", LATEST_VERSION)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests;
