//! The restart sweep (`resume_suspended_sessions`, reference §3): resumes every turn a previous
//! boot left claimed, counting each attempt durably, and terminalizes turns over budget.

use std::sync::Arc;

use serde_json::json;

use crate::core::Core;
use crate::error::Result;
use crate::event::{kind, ABORTED_MESSAGE, RESTART_NOTICE_DESCRIPTION, RESTART_NOTICE_TEXT};
use crate::execution::Execution;
use crate::id::SessionId;
use crate::store;

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Child-session claims released (children are never resumed on their own).
    pub children_released: usize,
    /// Sessions whose turn was resumed with the restart notice.
    pub resumed: Vec<SessionId>,
    /// Sessions whose turn exhausted its resume budget and was recorded as `aborted`.
    pub terminalized: Vec<SessionId>,
}

/// Orphans noticed and claimed per transaction of the sweep.
const SWEEP_CHUNK: usize = 1024;

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
    // (3) Claimed top-level sessions, made by an earlier boot, minus that snapshot.
    let boot = core.boot.clone();
    let orphans: Vec<SessionId> = persistence
        .read(move |conn| store::list_suspended(conn, Some(&boot)))
        .await?
        .into_iter()
        .filter(|id| !active.contains(id))
        .collect();
    if orphans.is_empty() {
        return Ok(SweepReport {
            children_released,
            ..SweepReport::default()
        });
    }
    // (4a) Count every attempt durably, in one transaction, before any notice or drain. A count
    // takes the claim for this boot, so an orphan is counted once per boot even when sweeps run
    // concurrently; one released (or claimed by a turn of this process) since it was listed is
    // skipped. The sweep's writes run alone: a savepoint around 10,000 rows would copy every
    // page it touches to the statement journal.
    let boot = core.boot.clone();
    let counted: Vec<(SessionId, u32)> = persistence
        .write_alone(move |w| {
            let mut counted = Vec::with_capacity(orphans.len());
            for id in orphans {
                if let Some(attempts) = store::count_resume(w.conn(), &id, &boot)? {
                    counted.push((id, attempts));
                }
            }
            Ok(counted)
        })
        .await?;
    crate::crash::point(crate::crash::SWEEP_AFTER_COUNT);
    crate::crash::point(crate::crash::BEFORE_CLAIM);
    // (4b) In chunks, each one transaction: terminalize the turns over budget; for the rest
    // publish the continue notice and, right behind it, the turn's claim
    // (`session.execution.started`), so each orphan's pages are dirtied once. (4c) As each chunk
    // commits, its resumes start (concurrently; registration only, never waiting for drains)
    // while the writer commits the next chunk.
    let max = core.config.max_resume_attempts;
    let execution = Execution { core: core.clone() };
    let chunks: Vec<Vec<(SessionId, u32)>> = chunked(counted, SWEEP_CHUNK);
    let outcomes = chunks.into_iter().map(|chunk| {
        let execution = execution.clone();
        let started = json!({ "boot": core.boot });
        async move {
            let (resumed, terminalized) = persistence
                .write_alone(move |w| notice_and_claim(w, chunk, max, &started))
                .await?;
            // Every turn of the chunk is active before any of them drains (a claimed resume
            // drains as soon as its actor handles it); an actor whose resume starts no turn
            // deactivates its session again.
            for id in &resumed {
                execution.core.registry.activate(id);
            }
            let registrations = resumed.iter().map(|id| {
                let execution = execution.clone();
                async move {
                    match execution.start_resume_with(id, true).await {
                        Ok(_outcome) => {}
                        Err(e) => {
                            log::error!("sweep: could not resume session {id}: {e}");
                            execution.core.registry.deactivate(id);
                        }
                    }
                }
            });
            futures::future::join_all(registrations).await;
            Ok::<_, crate::Error>((resumed, terminalized))
        }
    });
    let (mut resumed, mut terminalized) = (Vec::new(), Vec::new());
    for outcome in futures::future::join_all(outcomes).await {
        let (r, t) = outcome?;
        resumed.extend(r);
        terminalized.extend(t);
    }
    Ok(SweepReport {
        children_released,
        resumed,
        terminalized,
    })
}

/// One chunk of step (4b): terminalizes the counted turns over `max` attempts, publishes the
/// restart notice and the claim of the others; returns (resumed, terminalized).
fn notice_and_claim(
    w: &mut crate::persistence::WriteCtx<'_>,
    chunk: Vec<(SessionId, u32)>,
    max: u32,
    started: &serde_json::Value,
) -> std::result::Result<(Vec<SessionId>, Vec<SessionId>), crate::StoreError> {
    let (mut resumed, mut terminalized) = (Vec::new(), Vec::new());
    for (id, attempts) in chunk {
        // A turn of this process may have ended (released) the claim since the count: then
        // there is nothing left to resume or to terminalize.
        let claimed =
            store::claim_state(w.conn(), &id)?.is_some_and(|c| c.time_suspended.is_some());
        if !claimed {
            continue;
        }
        if attempts > max {
            let error = json!({ "error": { "type": "aborted", "message": ABORTED_MESSAGE } });
            w.publish(&id, kind::EXECUTION_FAILED, &error)?;
            terminalized.push(id);
        } else {
            let notice = json!({
                "sessionID": id,
                "text": RESTART_NOTICE_TEXT,
                "description": RESTART_NOTICE_DESCRIPTION,
            });
            w.publish(&id, kind::SYNTHETIC, &notice)?;
            w.publish(&id, kind::EXECUTION_STARTED, started)?;
            resumed.push(id);
        }
    }
    Ok((resumed, terminalized))
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
