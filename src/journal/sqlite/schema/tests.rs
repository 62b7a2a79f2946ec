//! Tests of the schema migrations: a fresh database, reopening, a newer version refused, and
//! each migration that moves data.

use super::*;
use crate::journal::sqlite::pool::{self, StoreConfig};
use crate::journal::sqlite::test_support::tempdir;

const TABLES: &[&str] = &[
    "session",
    "event",
    "session_claim",
    "session_input",
    "session_message",
];

fn tables(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt =
        conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")?;
    let names = stmt.query_map([], |row| row.get(0))?;
    names.collect()
}

#[test]
fn fresh_database_gets_every_table_and_latest_version() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let pool = pool::open(&StoreConfig::new(dir.path().join("s.db")))?;
    let conn = pool.get()?;
    let names = tables(&conn)?;
    for table in TABLES {
        assert!(
            names.iter().any(|n| n == table),
            "missing {table} in {names:?}"
        );
    }
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    Ok(())
}

#[test]
fn migrating_twice_is_a_no_op() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let mut conn = pool::open_connection(&StoreConfig::new(dir.path().join("s.db")))?;
    migrate(&mut conn)?;
    migrate(&mut conn)?;
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    Ok(())
}

#[test]
fn reopening_keeps_data() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let pool = pool::open(&cfg)?;
        pool.get()?.execute(
            "INSERT INTO event(aggregate_id, stream, seq, type, data, time) \
             VALUES ('s', 1, 7, 'x', '{}', 0)",
            [],
        )?;
    }
    let pool = pool::open(&cfg)?;
    let seq: i64 = pool.get()?.query_row(
        "SELECT seq FROM event WHERE aggregate_id = 's'",
        [],
        |row| row.get(0),
    )?;
    assert_eq!(seq, 7);
    Ok(())
}

#[test]
fn newer_schema_is_refused() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let conn = pool::open_connection(&cfg)?;
        conn.pragma_update(None, "user_version", LATEST_VERSION + 1)?;
    }
    match pool::open(&cfg) {
        Err(StoreError::SchemaTooNew { found, known }) => {
            assert_eq!((found, known), (LATEST_VERSION + 1, LATEST_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    let conn = pool::open_connection(&cfg)?;
    assert!(
        tables(&conn)?.is_empty(),
        "a refused database is left untouched"
    );
    Ok(())
}

/// Sessions stored before version 5 are in the title index once migrated, and new ones
/// join it.
#[test]
fn version_4_titles_are_indexed_by_the_migration() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let conn = Connection::open(dir.path().join("s.db"))?;
        for sql in &MIGRATIONS[..4] {
            conn.execute_batch(sql)?;
        }
        conn.pragma_update(None, "user_version", 4)?;
        conn.execute(
            "INSERT INTO session (id, title, directory, time_created, time_updated) \
             VALUES ('old', 'stored before the index', '/d', 1, 1)",
            [],
        )?;
    }
    let pool = pool::open(&cfg)?;
    let conn = pool.get()?;
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    conn.execute(
        "INSERT INTO session (id, title, directory, time_created, time_updated) \
         VALUES ('new', 'stored after the index', '/d', 2, 2)",
        [],
    )?;
    let matches = |text: &str| -> rusqlite::Result<Vec<String>> {
        let mut stmt = conn.prepare(
            "SELECT s.id FROM session_search f JOIN session s ON s.rowid = f.rowid \
             WHERE session_search MATCH ?1 ORDER BY s.id",
        )?;
        let ids = stmt.query_map([text], |r| r.get(0))?;
        ids.collect()
    };
    assert_eq!(matches("\"before the\"")?, ["old"]);
    assert_eq!(matches("\"STORED\"")?, ["new", "old"]);
    Ok(())
}

/// A version-5 database migrates to version 6 keeping every claim (and the attempt count
/// of an adoption not claimed yet) in `session_claim`, and every session's next seq: after
/// its newest event, after a log compacted whole (the start one past its last seq), and
/// after a counter that was ahead of the log (a floor in `event_floor`; what the log holds
/// is replayed as before). The title index still finds the sessions once the claim columns
/// are dropped from `session`.
#[test]
fn version_5_claims_and_seq_counters_migrate_to_version_6() -> Result<(), StoreError> {
    use crate::journal::sqlite::test_support::rows::*;
    use crate::journal::sqlite::test_support::sid;

    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let conn = Connection::open(dir.path().join("s.db"))?;
        for sql in &MIGRATIONS[..5] {
            conn.execute_batch(sql)?;
        }
        conn.pragma_update(None, "user_version", 5)?;
        // (id, log_start, time_suspended, resume_attempts, claim_boot, claim_seq, seqs
        // stored, counter)
        type Row<'a> = (
            &'a str,
            i64,
            Option<i64>,
            i64,
            Option<&'a str>,
            Option<i64>,
            &'a [i64],
            i64,
        );
        let rows: [Row<'_>; 6] = [
            (
                "claimed",
                0,
                Some(1_000),
                2,
                Some("old"),
                Some(1),
                &[0, 1],
                1,
            ),
            ("adopted", 0, None, 1, None, None, &[0], 0),
            ("idle", 0, None, 0, None, None, &[0, 1, 2], 2),
            // Compacted with `keep_last` 0: only the interrupt fence (1) is left.
            ("whole", 5, None, 0, None, None, &[1], 4),
            // Compacted keeping the newest two.
            ("kept", 3, None, 0, None, None, &[3, 4], 4),
            // A counter ahead of the log (its newest events deleted by hand).
            ("ahead", 0, None, 0, None, None, &[0, 1, 2], 6),
        ];
        for (id, start, suspended, attempts, boot, claim, seqs, counter) in rows {
            conn.execute(
                "INSERT INTO session (id, title, directory, time_created, time_updated, \
                 time_suspended, resume_attempts, claim_boot, claim_seq, log_start) \
                 VALUES (?1, ?2, '/d', 1, 1, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    id,
                    format!("title of {id}"),
                    suspended,
                    attempts,
                    boot,
                    claim,
                    start
                ],
            )?;
            for seq in seqs {
                let kind = if *seq == 0 {
                    "session.created"
                } else {
                    "session.interrupt.requested"
                };
                conn.execute(
                    "INSERT INTO event (aggregate_id, seq, type, data, time) \
                     VALUES (?1, ?2, ?3, '{}', 1)",
                    rusqlite::params![id, seq, kind],
                )?;
            }
            conn.execute(
                "INSERT INTO event_sequence (aggregate_id, seq) VALUES (?1, ?2)",
                rusqlite::params![id, counter],
            )?;
        }
    }
    let pool = pool::open(&cfg)?;
    let pooled = pool.get()?;
    let mut conn = crate::journal::sqlite::SqliteStore::new(&*pooled);
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    let names = tables(&conn)?;
    assert!(!names.iter().any(|n| n == "event_sequence"), "{names:?}");
    let mut stmt = pooled.prepare("SELECT name FROM pragma_table_info('session')")?;
    let columns = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for gone in [
        "time_suspended",
        "resume_attempts",
        "claim_boot",
        "claim_seq",
    ] {
        assert!(!columns.iter().any(|c| c == gone), "{gone} in {columns:?}");
    }

    let state = conn.claim_state(&sid("claimed"))?.expect("stored");
    assert_eq!(
        (state.time_suspended, state.resume_attempts),
        (Some(1_000), 2)
    );
    assert_eq!(state.claim_boot.as_deref(), Some("old"));
    assert_eq!(conn.claim_seq(&sid("claimed"))?, Some(1));
    assert_eq!(conn.list_claimed(None)?, [sid("claimed")]);
    let adopted = conn.claim_state(&sid("adopted"))?.expect("stored");
    assert_eq!((adopted.time_suspended, adopted.resume_attempts), (None, 1));
    let idle = conn.claim_state(&sid("idle"))?.expect("stored");
    assert_eq!((idle.time_suspended, idle.resume_attempts), (None, 0));
    let claim_rows: i64 =
        pooled.query_row("SELECT COUNT(*) FROM session_claim", [], |r| r.get(0))?;
    assert_eq!(claim_rows, 2, "only the claimed and the counted session");

    let floors: i64 = pooled.query_row("SELECT COUNT(*) FROM event_floor", [], |r| r.get(0))?;
    assert_eq!(
        floors, 2,
        "the log compacted whole and the counter ahead of its log"
    );
    assert_eq!(conn.log_start(&sid("ahead"))?, Some(0));
    assert_eq!(conn.events_after(&sid("ahead"), None, 10)?.len(), 3);

    for (id, latest) in [
        ("claimed", 1),
        ("adopted", 0),
        ("idle", 2),
        ("whole", 4),
        ("kept", 4),
        ("ahead", 6),
    ] {
        assert_eq!(conn.latest_seq(&sid(id))?, Some(latest), "{id}");
        let next = conn.publish(&sid(id), "custom.kind", &serde_json::json!({}), 2)?;
        assert_eq!(next.seq, latest + 1, "{id}");
    }

    let found: i64 = pooled.query_row(
        "SELECT COUNT(*) FROM session_search f JOIN session s ON s.rowid = f.rowid \
         WHERE session_search MATCH '\"title of\"' AND s.title LIKE 'title of %'",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(
        found, 6,
        "the title index still points at the sessions' rows"
    );
    Ok(())
}

/// A version-1 database (event log keyed `WITHOUT ROWID`) migrates to version 2 keeping
/// every event, and `(aggregate_id, seq)` stays unique.
#[test]
fn version_1_event_log_migrates_to_a_rowid_table() -> Result<(), StoreError> {
    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let conn = Connection::open(dir.path().join("s.db"))?;
        conn.execute_batch(V1)?;
        conn.pragma_update(None, "user_version", 1)?;
        for (id, seq, kind, time) in [
            ("b", 0, "session.created", 10),
            ("a", 0, "session.created", 20),
            ("a", 1, "session.interrupt.requested", 30),
            ("b", 1, "session.synthetic", 40),
        ] {
            conn.execute(
                "INSERT INTO event (aggregate_id, seq, type, data, time) \
                 VALUES (?1, ?2, ?3, '{}', ?4)",
                rusqlite::params![id, seq, kind, time],
            )?;
        }
    }
    let pool = pool::open(&cfg)?;
    let conn = pool.get()?;
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    let without_rowid: String = conn.query_row(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'event'",
        [],
        |row| row.get(0),
    )?;
    assert!(!without_rowid.contains("WITHOUT ROWID"), "{without_rowid}");
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'event' \
         ORDER BY name",
    )?;
    let indexes = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    // Version 7 splits the `(aggregate_id, seq)` index into the settled and the recent parts.
    assert_eq!(indexes, ["event_interrupt", "event_log", "event_recent"]);
    let mut stmt =
        conn.prepare("SELECT aggregate_id, seq, type, time FROM event ORDER BY aggregate_id, seq")?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    assert_eq!(
        rows,
        vec![
            ("a".into(), 0, "session.created".into(), 20),
            ("a".into(), 1, "session.interrupt.requested".into(), 30),
            ("b".into(), 0, "session.created".into(), 10),
            ("b".into(), 1, "session.synthetic".into(), 40),
        ]
    );
    // Version 9 numbers each log: `a`'s events all carry its number, and `(stream, seq)`
    // stays unique in either index; an event without a number is refused.
    let a: i64 = conn.query_row(
        "SELECT k FROM event_stream WHERE aggregate_id = 'a'",
        [],
        |r| r.get(0),
    )?;
    let numbered: i64 = conn.query_row(
        "SELECT COUNT(*) FROM event WHERE aggregate_id = 'a' AND stream = ?1",
        [a],
        |r| r.get(0),
    )?;
    assert_eq!(numbered, 2);
    let duplicate = conn.execute(
        "INSERT INTO event (aggregate_id, stream, seq, type, data, time) \
         VALUES ('a', ?1, 1, 'x', '{}', 0)",
        [a],
    );
    assert!(duplicate.is_err(), "(stream, seq) must stay unique");
    conn.execute(
        "INSERT INTO event (aggregate_id, stream, seq, type, data, time, recent) \
         VALUES ('a', ?1, 2, 'x', '{}', 0, 1)",
        [a],
    )?;
    let duplicate = conn.execute(
        "INSERT INTO event (aggregate_id, stream, seq, type, data, time, recent) \
         VALUES ('a', ?1, 2, 'x', '{}', 0, 1)",
        [a],
    );
    assert!(duplicate.is_err(), "recent (stream, seq) must stay unique");
    let unnumbered = conn.execute(
        "INSERT INTO event (aggregate_id, seq, type, data, time) VALUES ('c', 0, 'x', '{}', 0)",
        [],
    );
    assert!(unnumbered.is_err(), "an event without a log number");
    Ok(())
}

/// A version-6 database migrates to version 7 with every event settled (`recent` 0, in
/// `event_log`): replayed as before, and the next seq goes on after the newest.
#[test]
fn version_6_events_are_settled_by_the_migration_to_version_7() -> Result<(), StoreError> {
    use crate::journal::sqlite::test_support::rows::*;
    use crate::journal::sqlite::test_support::sid;

    let dir = tempdir()?;
    let cfg = StoreConfig::new(dir.path().join("s.db"));
    {
        let conn = Connection::open(dir.path().join("s.db"))?;
        for sql in &MIGRATIONS[..6] {
            conn.execute_batch(sql)?;
        }
        conn.pragma_update(None, "user_version", 6)?;
        conn.execute(
            "INSERT INTO session (id, title, directory, time_created, time_updated) \
             VALUES ('a', 't', '/', 1, 1)",
            [],
        )?;
        for seq in 0..3 {
            conn.execute(
                "INSERT INTO event (aggregate_id, seq, type, data, time) \
                 VALUES ('a', ?1, 'custom.kind', '{}', 1)",
                [seq],
            )?;
        }
    }
    let pool = pool::open(&cfg)?;
    let pooled = pool.get()?;
    let mut conn = crate::journal::sqlite::SqliteStore::new(&*pooled);
    assert_eq!(user_version(&conn)?, LATEST_VERSION);
    let settled: i64 = conn.query_row(
        "SELECT COUNT(*) FROM event INDEXED BY event_log \
         WHERE stream = (SELECT k FROM event_stream WHERE aggregate_id = 'a') AND recent = 0",
        [],
        |row| row.get(0),
    )?;
    assert_eq!(settled, 3);
    let a = sid("a");
    assert_eq!(
        conn.publish(&a, "custom.kind", &serde_json::json!({}), 2)?
            .seq,
        3
    );
    let seqs: Vec<u64> = conn
        .events_after(&a, None, 10)?
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    Ok(())
}
