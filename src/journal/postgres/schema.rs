//! Schema migrations of the PostgreSQL store, numbered in `ds_schema.version` and applied in one
//! transaction under an advisory lock, so that nodes starting together migrate once. Each
//! migration's doc keeps the history of why; the tables as they are at the newest version:
//!
//! | table | a row is | keyed by |
//! |---|---|---|
//! | `node` | a node sharing the database: its name, start and `lease_until` | `node_id` |
//! | `session` | a session (as SQLite's `session`), its claim (`time_suspended`, `claim_seq`, `claim_boot`, `resume_attempts`), its owner (`owner_node`, fencing `owner_epoch`) and `log_start` | `id` |
//! | `event` | an event of a session's log, with the `node` and `epoch` that wrote it | unique `(aggregate_id, seq)` |
//! | `event_sequence` | a session's newest seq; locked until COMMIT by every append (writers of one session serialize on it) | `aggregate_id` |
//! | `session_input` | an admitted prompt (as SQLite's), `wake` a boolean | `id`; pending `(session_id, admitted_seq)`; woken `session_id` |
//! | `session_message` | a transcript message (as SQLite's) | `id`; unique `(session_id, seq)`; `(session_id, type, seq)` |
//!
//! Server functions: `ds_append` (next seq and insert in one round trip), `ds_claim_turn` and
//! `ds_settle_turn` (a turn's claim, or its terminal when no input is pending, in one round trip;
//! the journal's rules define what they do, see `turn.rs`), `ds_turns` (a run of them).
//! Ids, titles and directories use the `"C"` collation, so text compares as in SQLite.

use postgres::Client;

use crate::error::StoreError;

/// The key of the advisory lock migrations run under (any constant of this crate's own).
const MIGRATION_LOCK: i64 = 0x6473_5f73_6368_656d; // "ds_schem"

/// Version 1. Ids, titles and directories use the `"C"` collation (byte order, ASCII-only case
/// folding), as SQLite compares text.
const V1: &str = r#"
CREATE TABLE node (
    node_id     TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);

CREATE TABLE session (
    id              TEXT COLLATE "C" PRIMARY KEY,
    parent_id       TEXT COLLATE "C" NULL,
    title           TEXT COLLATE "C" NOT NULL,
    directory       TEXT COLLATE "C" NOT NULL,
    agent           TEXT NULL,
    model           TEXT NULL,
    metadata        TEXT NULL,
    time_created    BIGINT NOT NULL,
    time_updated    BIGINT NOT NULL,
    time_suspended  BIGINT NULL,
    resume_attempts BIGINT NOT NULL DEFAULT 0,
    claim_boot      TEXT COLLATE "C" NULL,
    claim_seq       BIGINT NULL,
    owner_node      TEXT COLLATE "C" NULL,
    owner_epoch     BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX session_parent ON session(parent_id);
CREATE INDEX session_suspended ON session(time_suspended) WHERE time_suspended IS NOT NULL;
CREATE INDEX session_created ON session(time_created, id);
CREATE INDEX session_directory_created ON session(directory, time_created, id);
CREATE INDEX session_owner ON session(owner_node) WHERE owner_node IS NOT NULL;

CREATE TABLE event (
    aggregate_id TEXT COLLATE "C" NOT NULL,
    seq          BIGINT NOT NULL,
    type         TEXT COLLATE "C" NOT NULL,
    data         TEXT NOT NULL,
    time         BIGINT NOT NULL,
    node         TEXT COLLATE "C" NULL,
    epoch        BIGINT NULL,
    CONSTRAINT event_aggregate_seq UNIQUE (aggregate_id, seq)
);
CREATE INDEX event_interrupt ON event(aggregate_id, seq)
    WHERE type = 'session.interrupt.requested';

CREATE TABLE event_sequence (
    aggregate_id TEXT COLLATE "C" PRIMARY KEY,
    seq          BIGINT NOT NULL
);

-- Appends an event with the next seq of its session, in one round trip. The sequence row stays
-- locked until COMMIT (writers of one session serialize on it); the epoch is read by a later
-- statement of this volatile function, with a fresh snapshot, so it sees every ownership
-- change committed before the seq was taken.
CREATE FUNCTION ds_append(p_session TEXT, p_type TEXT, p_data TEXT, p_time BIGINT,
                          p_node TEXT) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    next_seq BIGINT;
BEGIN
    INSERT INTO event_sequence AS q (aggregate_id, seq) VALUES (p_session, 0)
        ON CONFLICT (aggregate_id) DO UPDATE SET seq = q.seq + 1
        RETURNING q.seq INTO next_seq;
    INSERT INTO event (aggregate_id, seq, type, data, time, node, epoch)
        VALUES (p_session, next_seq, p_type, p_data, p_time, p_node,
                COALESCE((SELECT s.owner_epoch FROM session s WHERE s.id = p_session), 0));
    RETURN next_seq;
END
$fn$;

CREATE TABLE session_input (
    id           TEXT COLLATE "C" PRIMARY KEY,
    session_id   TEXT COLLATE "C" NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    admitted_seq BIGINT NOT NULL,
    prompt       TEXT NOT NULL,
    delivery     TEXT NOT NULL CHECK (delivery IN ('steer', 'queue')),
    time_created BIGINT NOT NULL,
    promoted_seq BIGINT NULL,
    wake         BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX session_input_pending ON session_input(session_id, admitted_seq)
    WHERE promoted_seq IS NULL;
CREATE INDEX session_input_wake ON session_input(session_id)
    WHERE promoted_seq IS NULL AND wake;

CREATE TABLE session_message (
    id           TEXT COLLATE "C" PRIMARY KEY,
    session_id   TEXT COLLATE "C" NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    type         TEXT COLLATE "C" NOT NULL,
    seq          BIGINT NOT NULL,
    data         TEXT NOT NULL,
    time_created BIGINT NOT NULL,
    time_updated BIGINT NOT NULL,
    interrupted  BOOLEAN NOT NULL DEFAULT false,
    UNIQUE (session_id, seq)
);
CREATE INDEX session_message_type ON session_message(session_id, type, seq);
"#;

/// Version 2 (the SQLite store's version 4): retention. `session.log_start` is the first seq
/// of the session's log a replay returns (0 until its older events are compacted).
const V2: &str = r#"
ALTER TABLE session ADD COLUMN log_start BIGINT NOT NULL DEFAULT 0;
"#;

/// Version 3: a turn's claim and its settlement each in one round trip, as functions doing what
/// `Store::claim_turn` and `Store::settle_turn` do statement by statement (the fence check under
/// the session's row lock, the append, its projection). A fenced call writes nothing.
const V3: &str = r#"
-- The claim of a turn: the fence check (the session's row locked FOR NO KEY UPDATE until
-- COMMIT, as `check_fence`; none when p_epoch is NULL, for the restart sweep's claims), the
-- append of its `session.execution.started` event (p_type, through `ds_append`) and its
-- projection (the claim, as the store's `claim`). Returns the event's seq, or NULL when this
-- node does not own the session at p_epoch (nothing written).
CREATE FUNCTION ds_claim_turn(p_session TEXT, p_node TEXT, p_epoch BIGINT, p_type TEXT,
                              p_data TEXT, p_time BIGINT, p_boot TEXT) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_owner TEXT;
    v_epoch BIGINT;
    v_seq   BIGINT;
BEGIN
    IF p_epoch IS NOT NULL THEN
        SELECT s.owner_node, s.owner_epoch INTO v_owner, v_epoch
            FROM session s WHERE s.id = p_session FOR NO KEY UPDATE;
        IF NOT FOUND OR v_owner IS DISTINCT FROM p_node OR v_epoch <> p_epoch THEN
            RETURN NULL;
        END IF;
    END IF;
    v_seq := ds_append(p_session, p_type, p_data, p_time, p_node);
    UPDATE session s SET time_suspended = COALESCE(s.time_suspended, p_time),
        claim_seq = CASE WHEN s.time_suspended IS NULL THEN v_seq
                         ELSE COALESCE(s.claim_seq, v_seq) END,
        claim_boot = p_boot
        WHERE s.id = p_session;
    RETURN v_seq;
END
$fn$;

-- The terminal of a turn: the fence check (as in `ds_claim_turn`); then, for a terminal that
-- releases the claim (p_release), the settle probe: when the session holds a pending input,
-- nothing is written and `out_pending` is true (the caller then settles statement by
-- statement, under the row lock taken here); otherwise the terminal's append and, with
-- p_release, its projection: the `user` messages promoted since the claim marked interrupted
-- (p_interrupted), the claim released (as the store's `release`).
CREATE FUNCTION ds_settle_turn(p_session TEXT, p_node TEXT, p_epoch BIGINT, p_type TEXT,
                               p_data TEXT, p_time BIGINT, p_release BOOLEAN,
                               p_interrupted BOOLEAN, OUT out_fenced BOOLEAN,
                               OUT out_pending BOOLEAN, OUT out_seq BIGINT)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_owner TEXT;
    v_epoch BIGINT;
BEGIN
    out_fenced := false;
    out_pending := false;
    SELECT s.owner_node, s.owner_epoch INTO v_owner, v_epoch
        FROM session s WHERE s.id = p_session FOR NO KEY UPDATE;
    IF NOT FOUND OR v_owner IS DISTINCT FROM p_node OR v_epoch <> p_epoch THEN
        out_fenced := true;
        RETURN;
    END IF;
    IF p_release AND EXISTS (SELECT 1 FROM session_input i
                             WHERE i.session_id = p_session AND i.promoted_seq IS NULL) THEN
        out_pending := true;
        RETURN;
    END IF;
    out_seq := ds_append(p_session, p_type, p_data, p_time, p_node);
    IF p_release THEN
        IF p_interrupted THEN
            UPDATE session_message m SET interrupted = true
                WHERE m.session_id = p_session AND m.type = 'user' AND NOT m.interrupted
                  AND m.seq > (SELECT s.claim_seq FROM session s WHERE s.id = p_session);
        END IF;
        UPDATE session s SET time_suspended = NULL, resume_attempts = 0, claim_boot = NULL,
            claim_seq = NULL WHERE s.id = p_session;
    END IF;
END
$fn$;
"#;

/// Version 4: a terminal's settle probe sees every prompt admitted before the terminal.
///
/// Nodes write concurrently, and an admission (another node's, for a client) takes only the
/// session's sequence row, not its session row. In version 3 the terminal probed the inbox
/// before taking its seq: a queued prompt admitted by a transaction still open at the probe
/// got the seq before the terminal's, yet the probe did not see it, so no turn was owed to it
/// and it stayed pending with nothing scheduled. The terminal now locks the sequence row first
/// (waiting for such an admission to commit); the probe, a later statement with a fresh
/// snapshot, then sees every admission ordered before the terminal, and every later one gets a
/// seq after it.
const V4: &str = r#"
CREATE OR REPLACE FUNCTION ds_settle_turn(p_session TEXT, p_node TEXT, p_epoch BIGINT,
                               p_type TEXT, p_data TEXT, p_time BIGINT, p_release BOOLEAN,
                               p_interrupted BOOLEAN, OUT out_fenced BOOLEAN,
                               OUT out_pending BOOLEAN, OUT out_seq BIGINT)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_owner TEXT;
    v_epoch BIGINT;
BEGIN
    out_fenced := false;
    out_pending := false;
    SELECT s.owner_node, s.owner_epoch INTO v_owner, v_epoch
        FROM session s WHERE s.id = p_session FOR NO KEY UPDATE;
    IF NOT FOUND OR v_owner IS DISTINCT FROM p_node OR v_epoch <> p_epoch THEN
        out_fenced := true;
        RETURN;
    END IF;
    IF p_release THEN
        -- Held until COMMIT: admissions in flight commit first, later ones come after.
        PERFORM 1 FROM event_sequence q WHERE q.aggregate_id = p_session FOR UPDATE;
        IF EXISTS (SELECT 1 FROM session_input i
                   WHERE i.session_id = p_session AND i.promoted_seq IS NULL) THEN
            out_pending := true;
            RETURN;
        END IF;
    END IF;
    out_seq := ds_append(p_session, p_type, p_data, p_time, p_node);
    IF p_release THEN
        IF p_interrupted THEN
            UPDATE session_message m SET interrupted = true
                WHERE m.session_id = p_session AND m.type = 'user' AND NOT m.interrupted
                  AND m.seq > (SELECT s.claim_seq FROM session s WHERE s.id = p_session);
        END IF;
        UPDATE session s SET time_suspended = NULL, resume_attempts = 0, claim_boot = NULL,
            claim_seq = NULL WHERE s.id = p_session;
    END IF;
END
$fn$;
"#;

/// Version 5: a run of turn writes in one round trip (`Store::prepare_turns`): `ds_turns`
/// calls `ds_claim_turn` or `ds_settle_turn` for each element of its arrays, in order, and
/// returns what each returned, one row per element in the same order. It waits at most 250 ms
/// for a lock (the session's is `lock_timeout`, a lease): a run is one statement, and when it
/// fails the batch runs again request by request, where the request that waits on another
/// node's lock fails alone, after one full wait, and runs after its batch.
const V5: &str = r#"
CREATE FUNCTION ds_turns(p_node TEXT, p_time BIGINT, p_sessions TEXT[], p_epochs BIGINT[],
                         p_claims BOOLEAN[], p_types TEXT[], p_data TEXT[], p_boots TEXT[],
                         p_release BOOLEAN[], p_interrupted BOOLEAN[])
RETURNS TABLE (fenced BOOLEAN, pending BOOLEAN, seq BIGINT)
LANGUAGE plpgsql VOLATILE SET lock_timeout = '250ms' AS $fn$
DECLARE
    i INT;
    r RECORD;
BEGIN
    FOR i IN 1 .. COALESCE(array_length(p_sessions, 1), 0) LOOP
        IF p_claims[i] THEN
            seq := ds_claim_turn(p_sessions[i], p_node, p_epochs[i], p_types[i], p_data[i],
                                 p_time, p_boots[i]);
            fenced := seq IS NULL;
            pending := false;
        ELSE
            SELECT * INTO r FROM ds_settle_turn(p_sessions[i], p_node, p_epochs[i], p_types[i],
                                                p_data[i], p_time, p_release[i],
                                                p_interrupted[i]);
            fenced := r.out_fenced;
            pending := r.out_pending;
            seq := r.out_seq;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
"#;

/// Every migration in order; migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

/// The newest schema version this crate knows.
pub(crate) const LATEST_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database up to [`LATEST_VERSION`] in one transaction, holding an advisory lock so
/// that concurrent openers wait for the first and then find nothing to do. A database newer
/// than this crate is refused with [`StoreError::SchemaTooNew`] and left untouched.
pub(crate) fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS ds_schema (version BIGINT NOT NULL)")?;
    let found: i64 = match tx.query_opt("SELECT version FROM ds_schema", &[])? {
        Some(row) => row.try_get(0)?,
        None => {
            tx.execute("INSERT INTO ds_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    if found > LATEST_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            known: LATEST_VERSION,
        });
    }
    let start = usize::try_from(found)
        .map_err(|_| StoreError::Inconsistent(format!("negative schema version {found}")))?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        log::info!("applying postgres schema migration {} -> {}", i, i + 1);
        tx.batch_execute(sql)?;
    }
    if found < LATEST_VERSION {
        tx.execute("UPDATE ds_schema SET version = $1", &[&LATEST_VERSION])?;
    }
    tx.commit()?;
    Ok(())
}

/// The schema version stored in the database (0 when never migrated).
#[cfg(test)]
pub(crate) fn version(client: &mut Client) -> Result<i64, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('ds_schema') IS NOT NULL", &[])?
        .try_get(0)?;
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_opt("SELECT version FROM ds_schema", &[])?
        .map(|row| row.try_get(0))
        .transpose()?
        .unwrap_or(0))
}
