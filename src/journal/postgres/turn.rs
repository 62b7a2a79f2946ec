//! A turn's two writes in one round trip each: the claim (`ds_claim_turn`) and the terminal
//! (`ds_settle_turn`), schema functions doing what `Store::claim_turn` and `Store::settle_turn`
//! do statement by statement on another engine — the fence check under the session's row
//! lock, the append through `ds_append`, its projection. On the writer's connection every
//! statement is a round trip: the claim's three statements (fence, append, claim) and the
//! terminal's four (fence, settle probe, append, release) became one each. The restart sweep's
//! claim (a `session.execution.started` appended without a fence) uses the claim's function
//! too.
//!
//! The terminal's function covers the common case only: when the session holds a pending input
//! it writes nothing and says so, and the settlement (which queued prompt is owed the next
//! turn, the wake marks) runs statement by statement as before, in the same transaction, under
//! the row lock the function took.
//!
//! In a batch, a run of these writes goes in one round trip ([`TurnRows::prepare_turns`]:
//! `ds_turns`, the same functions in a loop), ahead of the requests; each request's call then
//! takes its result from [`PgConn::prepared`] instead of calling the function itself.

use postgres::Row;

use super::conn::PgConn;
use super::{event, json_text, seq_param, seq_value, EVENTS_CHANNEL};
use crate::error::StoreError;
use crate::event::{EventRecord, SessionEvent};
use crate::id::SessionId;
use crate::journal::backend::{Store, TurnRows};
use crate::journal::turn_write::{TurnWrite, TurnWriteKind};

/// What `ds_turns` did for one turn write, kept until its request takes it.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The session written.
    session: SessionId,
    /// The epoch the write carried.
    epoch: u64,
    /// A claim (or else a terminal).
    claim: bool,
    /// The time written into its event.
    time: i64,
    /// The session has another owner: nothing was written.
    fenced: bool,
    /// A terminal found pending inputs: nothing was written, the session row is locked.
    pending: bool,
    /// The seq of the event appended.
    seq: Option<i64>,
}

/// The arrays `ds_turns` takes, one element per turn write.
#[derive(Default)]
struct Arrays<'a> {
    sessions: Vec<&'a str>,
    epochs: Vec<i64>,
    claims: Vec<bool>,
    kinds: Vec<&'static str>,
    data: Vec<String>,
    boots: Vec<Option<&'a str>>,
    release: Vec<bool>,
    interrupted: Vec<bool>,
}

impl<'a> Arrays<'a> {
    fn of(turns: &[&'a TurnWrite]) -> Result<Self, StoreError> {
        let mut arrays = Arrays::default();
        for turn in turns {
            let (event, boot) = match &turn.kind {
                TurnWriteKind::Claim { boot } => (
                    SessionEvent::ExecutionStarted {
                        boot: boot.clone(),
                        turn: None,
                    },
                    Some(boot.as_str()),
                ),
                TurnWriteKind::Settle { terminal } => (SessionEvent::terminal(terminal), None),
            };
            arrays.sessions.push(turn.session.as_str());
            arrays.epochs.push(seq_param(turn.epoch));
            arrays.claims.push(boot.is_some());
            arrays.kinds.push(event.kind());
            arrays.data.push(json_text(&event.data()?)?);
            arrays.boots.push(boot);
            arrays
                .release
                .push(boot.is_none() && event.releases_claim());
            arrays
                .interrupted
                .push(matches!(event, SessionEvent::ExecutionInterrupted { .. }));
        }
        Ok(arrays)
    }

    /// Runs `ds_turns` over the arrays in `sql` (whose parameters 1 and 2 are the node and the
    /// time, 3 to 10 the arrays).
    fn run(&self, conn: &mut PgConn, sql: &str, now: i64) -> Result<Vec<Row>, StoreError> {
        let node = conn.node_arc();
        conn.query(
            sql,
            &[
                &&*node,
                &now,
                &self.sessions,
                &self.epochs,
                &self.claims,
                &self.kinds,
                &self.data,
                &self.boots,
                &self.release,
                &self.interrupted,
            ],
        )
    }
}

/// Keeps what `ds_turns` answered (`rows`, one per turn write) for the requests.
fn keep(
    conn: &mut PgConn,
    turns: &[&TurnWrite],
    rows: Vec<Row>,
    now: i64,
) -> Result<(), StoreError> {
    if rows.len() != turns.len() {
        return Err(StoreError::Inconsistent(format!(
            "ds_turns answered {} rows for {} turn writes",
            rows.len(),
            turns.len()
        )));
    }
    let mut prepared = std::collections::VecDeque::with_capacity(turns.len());
    for (turn, row) in turns.iter().zip(rows) {
        prepared.push_back(Prepared {
            session: turn.session.clone(),
            epoch: turn.epoch,
            claim: matches!(turn.kind, TurnWriteKind::Claim { .. }),
            time: now,
            fenced: row.try_get(0)?,
            pending: row.try_get(1)?,
            seq: row.try_get(2)?,
        });
    }
    conn.prepared = prepared;
    Ok(())
}

/// `WriterConnection::commit_turn`: `turn` alone in one autocommitted statement (its function
/// called directly, not through `ds_turns`), with its `ds_events` notification (the writer's
/// payload for one event), its result kept for its request. `Ok(false)`: nothing was written (the
/// server refused the statement, or a terminal found inputs pending); `Err`: the connection was
/// lost, and whether it committed is unknown.
pub(super) fn commit_turn(
    conn: &mut PgConn,
    turn: &TurnWrite,
    now: i64,
) -> Result<bool, StoreError> {
    conn.prepared.clear();
    if conn.is_closed() || conn.has_deferred() {
        return Ok(false);
    }
    let turns = [turn];
    // The notification names the one event: `{"node":…,"sessions":[[…,seq,seq]]}`.
    let node = conn.node_arc();
    let prefix = format!(
        "{{\"node\":{},\"sessions\":[[{},",
        serde_json::Value::from(&*node),
        serde_json::Value::from(turn.session.as_str())
    );
    let arrays = Arrays::of(&turns)?;
    let (session, epoch, kind, data) = (
        turn.session.as_str(),
        seq_param(turn.epoch),
        arrays.kinds.first().copied().unwrap_or_default(),
        arrays.data.first().map(String::as_str).unwrap_or_default(),
    );
    let ran = match &turn.kind {
        TurnWriteKind::Claim { boot } => conn.query(
            &format!(
                "SELECT s IS NULL, false, s, CASE WHEN s IS NOT NULL THEN \
                 pg_notify('{EVENTS_CHANNEL}', $8 || s || ',' || s || ']]}}') END \
                 FROM ds_claim_turn($1, $2, $3, $4, $5, $6, $7) AS s"
            ),
            &[&session, &&*node, &epoch, &kind, &data, &now, boot, &prefix],
        ),
        TurnWriteKind::Settle { .. } => {
            let release = arrays.release.first().copied().unwrap_or_default();
            let interrupted = arrays.interrupted.first().copied().unwrap_or_default();
            conn.query(
                &format!(
                    "SELECT out_fenced, out_pending, out_seq, CASE WHEN out_seq IS NOT NULL \
                     THEN pg_notify('{EVENTS_CHANNEL}', $9 || out_seq || ',' || out_seq || \
                     ']]}}') END FROM ds_settle_turn($1, $2, $3, $4, $5, $6, $7, $8)"
                ),
                &[
                    &session,
                    &&*node,
                    &epoch,
                    &kind,
                    &data,
                    &now,
                    &release,
                    &interrupted,
                    &prefix,
                ],
            )
        }
    };
    let rows = match ran {
        Ok(rows) => rows,
        Err(e) if e.as_postgres().is_some_and(|e| e.as_db_error().is_some()) => {
            // The server refused it: the statement, its own transaction, stored nothing.
            log::debug!("postgres: a turn write alone was refused: {e}");
            conn.failed = false;
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let pending = match rows.first() {
        Some(row) => row.try_get::<_, bool>(1)?,
        None => false,
    };
    if pending {
        // Inputs are pending: the settlement runs statement by statement, in a transaction.
        return Ok(false);
    }
    keep(conn, &turns, rows, now)?;
    Ok(true)
}

/// The prepared result of this request's write, if its run was prepared. A request that is not
/// the next one prepared is refused (and the batch then runs again without preparing): its
/// own call would write twice what the run wrote.
fn take_prepared(
    conn: &mut PgConn,
    session: &SessionId,
    epoch: u64,
    claim: bool,
) -> Result<Option<Prepared>, StoreError> {
    let Some(next) = conn.prepared.front() else {
        return Ok(None);
    };
    if next.session != *session || next.epoch != epoch || next.claim != claim {
        conn.prepared.clear();
        return Err(StoreError::Inconsistent(format!(
            "turn write of {session} taken out of its prepared order"
        )));
    }
    Ok(conn.prepared.pop_front())
}

/// The record of the `session.execution.started` of boot `boot` a function appended at `seq`.
fn started_record(
    conn: &mut PgConn,
    session: &SessionId,
    boot: &str,
    seq: u64,
    time: i64,
) -> Result<EventRecord, StoreError> {
    let started = SessionEvent::ExecutionStarted {
        boot: boot.to_owned(),
        turn: None,
    };
    let data = started.data()?;
    Ok(event::appended(
        conn,
        session,
        seq,
        started.kind(),
        data,
        time,
    ))
}

/// Appends `session.execution.started` of boot `boot` and takes the claim, in one round trip:
/// after the fence check when `epoch` is given (`None`: fenced, nothing written), without one
/// otherwise (an append like any other, e.g. the restart sweep's claim).
pub(super) fn started(
    conn: &mut PgConn,
    session: &SessionId,
    epoch: Option<u64>,
    boot: &str,
    now: i64,
) -> Result<Option<EventRecord>, StoreError> {
    let started = SessionEvent::ExecutionStarted {
        boot: boot.to_owned(),
        turn: None,
    };
    let text = json_text(&started.data()?)?;
    let node = conn.node_arc();
    let row = conn.query_one(
        "SELECT ds_claim_turn($1, $2, $3, $4, $5, $6, $7)",
        &[
            &session.as_str(),
            &&*node,
            &epoch.map(seq_param),
            &started.kind(),
            &text,
            &now,
            &boot,
        ],
    )?;
    let Some(seq) = row.try_get::<_, Option<i64>>(0)? else {
        return Ok(None);
    };
    started_record(conn, session, boot, seq_value(seq)?, now).map(Some)
}

fn fenced(session: &SessionId, epoch: u64) -> StoreError {
    StoreError::Fenced {
        session_id: session.clone(),
        epoch,
    }
}

impl TurnRows for PgConn {
    /// The fence check, `session.execution.started` and the claim: `ds_claim_turn` (or its
    /// result in a prepared run).
    fn claim_turn_at_once(
        &mut self,
        session: &SessionId,
        epoch: u64,
        boot: &str,
        now: i64,
    ) -> Result<Option<EventRecord>, StoreError> {
        if let Some(done) = take_prepared(self, session, epoch, true)? {
            let seq = done
                .seq
                .filter(|_| !done.fenced)
                .ok_or_else(|| fenced(session, epoch))?;
            return started_record(self, session, boot, seq_value(seq)?, done.time).map(Some);
        }
        started(self, session, Some(epoch), boot, now)?
            .ok_or_else(|| fenced(session, epoch))
            .map(Some)
    }

    /// The fence check, then (for a terminal releasing the claim) the settlement, then the
    /// terminal and its projection: `ds_settle_turn` (or its result in a prepared run), which
    /// leaves a settlement with inputs pending to [`Store::settle`], under the row lock it took.
    fn settle_turn_at_once(
        &mut self,
        session: &SessionId,
        epoch: u64,
        terminal: &SessionEvent,
        now: i64,
    ) -> Result<Option<(Option<u64>, EventRecord)>, StoreError> {
        let interrupted = match terminal {
            SessionEvent::ExecutionInterrupted { .. } => true,
            SessionEvent::ExecutionSucceeded {} | SessionEvent::ExecutionFailed { .. } => false,
            // Not a terminal: the function's projection (release or nothing) would not be its own.
            other => {
                return Err(StoreError::Inconsistent(format!(
                    "{} is not the terminal of a turn",
                    other.kind()
                )))
            }
        };
        let kind = terminal.kind();
        let data = terminal.data()?;
        // What the function did (in a prepared run, or called now) and the time it wrote.
        let (is_fenced, pending, seq, time) = match take_prepared(self, session, epoch, false)? {
            Some(done) => (done.fenced, done.pending, done.seq, done.time),
            None => {
                let text = json_text(&data)?;
                let node = self.node_arc();
                let row = self.query_one(
                    "SELECT out_fenced, out_pending, out_seq \
                     FROM ds_settle_turn($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[
                        &session.as_str(),
                        &&*node,
                        &seq_param(epoch),
                        &kind,
                        &text,
                        &now,
                        &terminal.releases_claim(),
                        &interrupted,
                    ],
                )?;
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, now)
            }
        };
        if is_fenced {
            return Err(fenced(session, epoch));
        }
        if pending {
            // Inputs are pending: settle statement by statement (the fence is checked and the row
            // stays locked until COMMIT).
            let next = Store::settle(self, session)?;
            let record = self.append(session, terminal, time)?;
            return Ok(Some((next, record)));
        }
        let seq =
            seq.ok_or_else(|| StoreError::Inconsistent("ds_settle_turn appended nothing".into()))?;
        let record = event::appended(self, session, seq_value(seq)?, kind, data, time);
        Ok(Some((None, record)))
    }

    /// [`TurnRows::prepare_turns`]: every write of `turns` in one round trip, their results kept
    /// for their requests.
    fn prepare_turns(&mut self, turns: &[&TurnWrite], now: i64) -> Result<(), StoreError> {
        self.prepared.clear();
        let rows = Arrays::of(turns)?.run(
            self,
            "SELECT fenced, pending, seq FROM ds_turns($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            now,
        )?;
        keep(self, turns, rows, now)
    }
}
