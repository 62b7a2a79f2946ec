//! Reads and writes of a database outside any runtime, on a connection of their own: what the
//! `testing` helpers use to look at (or seed) the database a runtime works on — a SQLite file,
//! or (feature `postgres`) a PostgreSQL database named by its URL.

use std::path::Path;
use std::time::Duration;

use super::backend::ClaimRows as _;
use super::sqlite as store;
use crate::error::StoreError;
use crate::event::EventRecord;
use crate::id::SessionId;
use crate::records::ClaimState;

fn open(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

/// The claim of `session` (`None` when the session is missing).
pub(crate) fn claim_state(
    path: &Path,
    session: &SessionId,
) -> Result<Option<ClaimState>, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| store.claim_state(&session));
    }
    store::SqliteStore::new(&open(path)?).claim_state(session)
}

/// Every stored event of `session`, in seq order (with a compacted log: the rows still
/// stored, the kept interrupt fence below its start included).
pub(crate) fn events(path: &Path, session: &SessionId) -> Result<Vec<EventRecord>, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| {
            super::postgres::stored_events(store, &session)
        });
    }
    store::SqliteStore::new(&open(path)?).stored_events(session)
}

/// Marks `session` claimed by an earlier boot with `attempts` resume attempts, the claim taken
/// at the session's latest event.
pub(crate) fn seed_claim(
    path: &Path,
    session: &SessionId,
    attempts: u32,
) -> Result<(), StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| {
            // Owned by no node, as a node that died would leave it once its lease lapsed.
            let changed = store.execute(
                "UPDATE session SET time_suspended = $2, resume_attempts = $3, \
                 claim_boot = 'seeded', owner_node = NULL, \
                 claim_seq = (SELECT seq FROM event_sequence WHERE aggregate_id = $1) \
                 WHERE id = $1",
                &[&session.as_str(), &super::now_ms(), &i64::from(attempts)],
            )?;
            if changed == 0 {
                return Err(StoreError::Inconsistent(format!("no session {session}")));
            }
            Ok(())
        });
    }
    let conn = open(path)?;
    let changed = conn.execute(
        "INSERT OR REPLACE INTO session_claim \
             (session_id, time_suspended, resume_attempts, claim_boot, claim_seq) \
         SELECT id, ?2, ?3, 'seeded', (SELECT MAX(seq) FROM event WHERE aggregate_id = ?1) \
         FROM session WHERE id = ?1",
        rusqlite::params![session.as_str(), super::now_ms(), attempts],
    )?;
    if changed == 0 {
        return Err(StoreError::Inconsistent(format!("no session {session}")));
    }
    Ok(())
}

/// One thing a seeded turn did before its process died ([`seed_crashed_turn`]).
#[derive(Debug, Clone)]
pub(crate) enum Seeded {
    /// Promoted prompt `id` (admitted as `steer` before the turn claimed).
    Promoted(crate::id::MessageId, serde_json::Value),
    /// Appended a message of this kind.
    Message(String, serde_json::Value),
    /// Ran a step to this outcome (`Ok`: its value, `Err`: its error), or only recorded its
    /// intent (`None`: the process died in its body).
    Step(String, Option<Result<serde_json::Value, String>>),
}

/// Writes, in one transaction, a turn of `session` that a process claimed and died in after
/// doing `done`; returns the turn's id. On PostgreSQL the session is left owned by no node.
pub(crate) fn seed_crashed_turn(
    path: &Path,
    session: &SessionId,
    done: Vec<Seeded>,
) -> Result<u64, StoreError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = postgres_url(path) {
        let session = session.clone();
        return on_postgres(url, move |store| {
            store.execute("BEGIN", &[])?;
            let turn = seed_turn(store, &session, &done)?;
            store.execute(
                "UPDATE session SET owner_node = NULL WHERE id = $1",
                &[&session.as_str()],
            )?;
            store.execute("COMMIT", &[])?;
            Ok(turn)
        });
    }
    let conn = open(path)?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let turn = seed_turn(&mut store::SqliteStore::new(&conn), session, &done)?;
    conn.execute_batch("COMMIT")?;
    Ok(turn)
}

/// The statements of [`seed_crashed_turn`], written once for both engines.
fn seed_turn(
    store: &mut (impl super::backend::Store + ?Sized),
    session: &SessionId,
    done: &[Seeded],
) -> Result<u64, StoreError> {
    use crate::event::SessionEvent;
    use crate::outcome::SessionError;
    let now = super::now_ms();
    if store.claim_seq(session)?.is_some() {
        return Err(StoreError::Conflict(format!("{session} holds a claim")));
    }
    let mut admitted = std::collections::HashMap::new();
    for seeded in done {
        if let Seeded::Promoted(id, prompt) = seeded {
            let (admission, _) = super::backend::admit_new(
                store,
                session,
                id,
                prompt,
                crate::records::Delivery::Steer,
                now,
            )?;
            admitted.insert(id.clone(), admission.admitted_seq);
        }
    }
    let started = SessionEvent::ExecutionStarted {
        boot: "seeded".into(),
        turn: None,
    };
    let turn = store.append(session, &started, now)?.seq;
    let attempt = 1;
    for seeded in done {
        match seeded {
            Seeded::Promoted(id, _) => {
                store.promote_steer(session, admitted.get(id).copied(), now)?;
            }
            Seeded::Message(kind, data) => {
                let id = crate::id::MessageId::generate();
                store.append_message(session, &id, kind, data, now)?;
            }
            Seeded::Step(step, outcome) => {
                let key = crate::step::step_key(session.as_str(), turn, step);
                let intent = SessionEvent::StepStarted {
                    turn,
                    step: step.clone(),
                    attempt,
                    key,
                };
                store.append(session, &intent, now)?;
                let outcome = match outcome {
                    None => continue,
                    Some(Ok(result)) => SessionEvent::StepCompleted {
                        turn,
                        step: step.clone(),
                        attempt,
                        result: result.clone(),
                    },
                    Some(Err(message)) => SessionEvent::StepFailed {
                        turn,
                        step: step.clone(),
                        attempt,
                        error: SessionError::new("step", message.clone()),
                    },
                };
                store.append(session, &outcome, now)?;
            }
        }
    }
    Ok(turn)
}

/// The URL when `path` names a PostgreSQL database.
#[cfg(feature = "postgres")]
fn postgres_url(path: &Path) -> Option<String> {
    let path = path.to_str()?;
    (path.starts_with("postgres://") || path.starts_with("postgresql://")).then(|| path.to_owned())
}

/// Runs `work` on a connection of its own to the PostgreSQL database at `url` (on a thread of
/// its own when called inside a tokio runtime, where the sync client cannot run).
#[cfg(feature = "postgres")]
fn on_postgres<T: Send + 'static>(
    url: String,
    work: impl FnOnce(&mut super::postgres::PgConn) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    super::postgres::off_runtime(move || {
        let config = super::postgres::PgConfig {
            url,
            node_id: "inspect".into(),
            node_name: "inspect".into(),
            lease: Duration::from_secs(10),
            pool_size: 1,
        };
        let client = super::postgres::connect(&config)?;
        let mut conn =
            super::postgres::PgConn::new(client, super::postgres::NodeId::new("inspect"));
        work(&mut conn)
    })
}
