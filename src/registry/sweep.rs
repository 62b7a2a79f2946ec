//! The restart sweep (`resume_suspended_sessions`, reference §3): resumes every turn a previous
//! boot left claimed, counting each attempt durably, and terminalizes turns over budget.

use std::sync::Arc;

use serde_json::json;

use crate::core::Core;
use crate::error::Result;
use crate::event::{kind, ABORTED_MESSAGE, RESTART_NOTICE_DESCRIPTION, RESTART_NOTICE_TEXT};
use crate::execution::Execution;
use crate::id::SessionId;
use crate::runner::InterruptReason;
use crate::store;
use crate::turn::Resumption;

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Child-session claims released (children are never resumed on their own).
    pub children_released: usize,
    /// Sessions whose turn was resumed with the restart notice: claimed turns, and sessions
    /// holding an acknowledged prompt whose turn never started.
    pub resumed: Vec<SessionId>,
    /// Sessions whose turn exhausted its resume budget and was recorded as `aborted`.
    pub terminalized: Vec<SessionId>,
    /// Claimed turns a durable user interrupt request had stopped before the crash: recorded
    /// as `interrupted{user}` and released, never resumed.
    pub interrupted: Vec<SessionId>,
}

/// Orphans noticed and claimed per transaction of the sweep.
const SWEEP_CHUNK: usize = 1024;

/// A session the sweep takes up.
enum Orphan {
    /// Claimed by an earlier boot, with its attempt count (this boot's included).
    Claimed(SessionId, u32),
    /// Holding no claim but an acknowledged prompt owed a turn: the process died before the
    /// prompt's turn started.
    Owed(SessionId),
}

/// What the sweep did with one orphan.
enum Swept {
    Resumed(SessionId, Arc<Resumption>),
    Terminalized(SessionId),
    Interrupted(SessionId),
}

/// Runs the sweep in the order of reference §3. Returns once every resumed turn is registered
/// (in `active()`), never waiting for a drain.
pub(crate) async fn resume_suspended_sessions(core: &Arc<Core>) -> Result<SweepReport> {
    let persistence = &core.persistence;
    // (1) Children are never resumed on their own.
    let children_released = persistence
        .write(|w| store::release_child_claims(w.conn()))
        .await?;
    // (2) Snapshot what this process is already running.
    let active = core.registry.active();
    // (3) Claimed top-level sessions, made by an earlier boot, and unclaimed ones owed a turn,
    // minus that snapshot.
    let boot = core.boot.clone();
    let (claimed, owed) = persistence
        .read(move |conn| {
            Ok((
                store::list_suspended(conn, Some(&boot))?,
                store::adoptable(conn)?,
            ))
        })
        .await?;
    let claimed: Vec<SessionId> = claimed
        .into_iter()
        .filter(|id| !active.contains(id))
        .collect();
    let owed: Vec<SessionId> = owed.into_iter().filter(|id| !active.contains(id)).collect();
    if claimed.is_empty() && owed.is_empty() {
        return Ok(SweepReport {
            children_released,
            ..SweepReport::default()
        });
    }
    // (4a) Count every claimed attempt durably, in one transaction, before any notice or drain.
    // A count takes the claim for this boot, so an orphan is counted once per boot even when
    // sweeps run concurrently; one released (or claimed by a turn of this process) since it
    // was listed is skipped. The sweep's writes run alone: a savepoint around 10,000 rows would
    // copy every page it touches to the statement journal.
    let boot = core.boot.clone();
    let mut orphans: Vec<Orphan> = persistence
        .write_alone(move |w| {
            let mut counted = Vec::with_capacity(claimed.len());
            for id in claimed {
                if let Some(attempts) = store::count_resume(w.conn(), &id, &boot)? {
                    counted.push(Orphan::Claimed(id, attempts));
                }
            }
            Ok(counted)
        })
        .await?;
    orphans.extend(owed.into_iter().map(Orphan::Owed));
    crate::crash::point(crate::crash::SWEEP_AFTER_COUNT);
    crate::crash::point(crate::crash::BEFORE_CLAIM);
    // (4b) In chunks, each one transaction: settle each orphan (see `sweep_one`). (4c) As each
    // chunk commits, its resumes start (concurrently; registration only, never waiting for
    // drains) while the writer commits the next chunk.
    let max = core.config.max_resume_attempts;
    let execution = Execution { core: core.clone() };
    let chunks: Vec<Vec<Orphan>> = chunked(orphans, SWEEP_CHUNK);
    let outcomes = chunks.into_iter().map(|chunk| {
        let execution = execution.clone();
        let started = json!({ "boot": core.boot });
        async move {
            let swept = persistence
                .write_alone(move |w| {
                    let mut swept = Vec::with_capacity(chunk.len());
                    for orphan in chunk {
                        swept.extend(sweep_one(w, orphan, max, &started)?);
                    }
                    Ok(swept)
                })
                .await?;
            // Every turn of the chunk is active before any of them drains (a claimed resume
            // drains as soon as its actor handles it); an actor whose resume starts no turn
            // deactivates its session again.
            for outcome in &swept {
                if let Swept::Resumed(id, _) = outcome {
                    execution.core.registry.activate(id);
                }
            }
            let registrations = swept.iter().filter_map(|outcome| match outcome {
                Swept::Resumed(id, resumption) => Some((id, resumption)),
                _ => None,
            });
            let registrations = registrations.map(|(id, resumption)| {
                let execution = execution.clone();
                let resumption = resumption.clone();
                async move {
                    if let Err(e) = execution.start_resume_with(id, Some(resumption)).await {
                        log::error!("sweep: could not resume session {id}: {e}");
                        execution.core.registry.deactivate(id);
                    }
                }
            });
            futures::future::join_all(registrations).await;
            Ok::<_, crate::Error>(swept)
        }
    });
    let mut report = SweepReport {
        children_released,
        ..SweepReport::default()
    };
    for outcome in futures::future::join_all(outcomes).await {
        for swept in outcome? {
            match swept {
                Swept::Resumed(id, _) => report.resumed.push(id),
                Swept::Terminalized(id) => report.terminalized.push(id),
                Swept::Interrupted(id) => report.interrupted.push(id),
            }
        }
    }
    Ok(report)
}

/// Step (4b) for one orphan, in the chunk's transaction:
///
/// - a claimed turn whose durable user interrupt request came after its claim, and that served
///   nothing admitted after that request, is recorded `interrupted{user}` and released: an
///   interrupt sticks even when the process died before the turn's terminal;
/// - a turn over `max` attempts is recorded `failed{aborted}` and released;
/// - any other is resumed: the restart notice and, right behind it, the turn's claim
///   (`session.execution.started`), so each orphan's pages are dirtied once.
///
/// `None` when there is nothing left to do: a turn of this process ended the claim, or served
/// the owed prompt, since the orphan was listed.
fn sweep_one(
    w: &mut crate::persistence::WriteCtx<'_>,
    orphan: Orphan,
    max: u32,
    started: &serde_json::Value,
) -> std::result::Result<Option<Swept>, crate::StoreError> {
    let (id, attempts, inputs) = match orphan {
        Orphan::Claimed(id, attempts) => {
            let claimed =
                store::claim_state(w.conn(), &id)?.is_some_and(|c| c.time_suspended.is_some());
            if !claimed {
                return Ok(None);
            }
            let fence = store::latest_interrupt_seq(w.conn(), &id)?;
            let claim = store::claim_seq(w.conn(), &id)?;
            let inputs = match claim {
                Some(claim) => store::served_inputs(w.conn(), &id, claim, fence)?,
                None => Vec::new(),
            };
            let interrupted = matches!((claim, fence), (Some(c), Some(f)) if f > c);
            if interrupted && inputs.is_empty() {
                let reason = json!({ "reason": InterruptReason::User.as_str() });
                w.publish(&id, kind::EXECUTION_INTERRUPTED, &reason)?;
                return Ok(Some(Swept::Interrupted(id)));
            }
            (id, attempts, inputs)
        }
        Orphan::Owed(id) => {
            if !store::owes_turn(w.conn(), &id)? {
                return Ok(None);
            }
            let Some(attempts) = store::count_adoption(w.conn(), &id)? else {
                return Ok(None);
            };
            (id, attempts, Vec::new())
        }
    };
    if attempts > max {
        let error = json!({ "error": { "type": "aborted", "message": ABORTED_MESSAGE } });
        w.publish(&id, kind::EXECUTION_FAILED, &error)?;
        // Nothing is owed any more: the turn is over, recorded as aborted.
        store::clear_wakes(w.conn(), &id)?;
        return Ok(Some(Swept::Terminalized(id)));
    }
    let notice = json!({
        "sessionID": id,
        "text": RESTART_NOTICE_TEXT,
        "description": RESTART_NOTICE_DESCRIPTION,
    });
    let notice_seq = w.publish(&id, kind::SYNTHETIC, &notice)?.seq;
    w.publish(&id, kind::EXECUTION_STARTED, started)?;
    let resumption = Resumption {
        attempt: attempts,
        max_attempts: max,
        notice_seq,
        inputs,
    };
    Ok(Some(Swept::Resumed(id, Arc::new(resumption))))
}

/// Splits `items` into chunks of at most `size`, in order.
fn chunked<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut chunks = Vec::with_capacity(items.len().div_ceil(size));
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        chunks.push(items.by_ref().take(size).collect());
    }
    chunks
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::event::kind;
    use crate::id::SessionId;
    use crate::service::CreateSession;
    use crate::testing::{self, Gate, Script, ScriptedRunner};
    use crate::Runtime;

    /// Regression (issue #7): two sweeps running at once in one boot count each orphaned turn
    /// once, publish one restart notice for it and resume it once. Before the fix both sweeps
    /// listed every orphan before either counted, so each was counted twice (spending its
    /// resume budget twice as fast) and got two notices.
    #[actix_rt::test]
    async fn concurrent_sweeps_count_notice_and_resume_each_orphan_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.db");
        let runner = ScriptedRunner::new();
        let gate = Gate::new();
        let runtime = Runtime::builder()
            .database(&path)
            .runner(runner.clone())
            .arbiters(2)
            .sweep_on_start(false)
            .shutdown_grace(Duration::from_secs(2))
            .start()
            .await
            .unwrap();
        let mut ids = Vec::new();
        for i in 0..5 {
            let id = SessionId::new(format!("orphan{i}")).unwrap();
            runtime
                .sessions()
                .create(CreateSession {
                    id: Some(id.clone()),
                    directory: "/sweep".into(),
                    ..CreateSession::default()
                })
                .await
                .unwrap();
            testing::seed_claim(&path, &id, 0).unwrap();
            runner.push(&id, Script::Gate(gate.clone()));
            ids.push(id);
        }
        let (a, b) = futures::join!(
            runtime.resume_suspended_sessions(),
            runtime.resume_suspended_sessions()
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let mut resumed: Vec<_> = a.resumed.iter().chain(&b.resumed).cloned().collect();
        resumed.sort();
        assert_eq!(resumed, ids, "each orphan resumed by exactly one sweep");
        for id in &ids {
            assert_eq!(testing::resume_attempts(&path, id).unwrap(), 1, "{id}");
            let notices = testing::events_of_kind(&path, id, kind::SYNTHETIC).unwrap();
            assert_eq!(notices.len(), 1, "{id}");
        }
        runner
            .wait_for_drains(ids.len(), Duration::from_secs(10))
            .await;
        gate.release();
        for id in &ids {
            runtime.execution().await_idle(id).await.unwrap();
            assert_eq!(runner.drains_of(id).len(), 1, "{id}");
            assert!(!testing::is_claimed(&path, id).unwrap());
        }
        runtime.shutdown().await;
    }

    /// The sweep commits a resumed turn's claim with its restart notice, in one transaction:
    /// the log reads notice, `execution.started` (claim of this boot), then the terminal, with
    /// exactly one claim event for the resumed turn.
    #[actix_rt::test]
    async fn a_resumed_turn_is_claimed_with_its_notice_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.db");
        let runner = ScriptedRunner::new();
        let runtime = Runtime::builder()
            .database(&path)
            .runner(runner.clone())
            .sweep_on_start(false)
            .start()
            .await
            .unwrap();
        let id = SessionId::new("orphan").unwrap();
        runtime
            .sessions()
            .create(CreateSession {
                id: Some(id.clone()),
                directory: "/sweep".into(),
                ..CreateSession::default()
            })
            .await
            .unwrap();
        testing::seed_claim(&path, &id, 0).unwrap();
        let before = testing::events(&path, &id).unwrap().len();
        let report = runtime.resume_suspended_sessions().await.unwrap();
        assert_eq!(report.resumed, vec![id.clone()]);
        runtime.execution().await_idle(&id).await.unwrap();
        let kinds: Vec<String> = testing::events(&path, &id).unwrap()[before..]
            .iter()
            .map(|e| e.kind.clone())
            .collect();
        assert_eq!(
            kinds,
            [
                kind::SYNTHETIC,
                kind::EXECUTION_STARTED,
                kind::EXECUTION_SUCCEEDED
            ]
        );
        assert_eq!(runner.drains_of(&id).len(), 1);
        assert!(!testing::is_claimed(&path, &id).unwrap());
        runtime.shutdown().await;
    }
}
