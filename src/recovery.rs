//! The restart sweep (`resume_suspended_sessions`): resumes every turn a previous process left
//! claimed or owed, counting each attempt durably; terminalizes turns over budget; records the
//! user interrupts a crash cut short. It talks to the journal for what is durable and to the
//! session actors (through the registry) with one message: resume this already-claimed turn.

pub(crate) mod heal;

use std::sync::Arc;

use futures::channel::oneshot;

use crate::error::Result;
use crate::id::SessionId;
use crate::journal::{Swept, Unfinished};
use crate::registry::Registry;
use crate::session::messages::Resume;
use crate::session::Environment;

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Child-session claims released (children are never resumed on their own): those no live
    /// turn holds.
    pub children_released: usize,
    /// Sessions whose turn was resumed with the restart notice: claimed turns, and sessions
    /// holding an acknowledged prompt whose turn never started.
    pub resumed: Vec<SessionId>,
    /// Sessions whose turn exhausted its resume budget and was recorded as `aborted`.
    pub terminalized: Vec<SessionId>,
    /// Claimed turns a durable user interrupt request had stopped before the crash: recorded
    /// as `interrupted{user}` and released, never resumed. A session listed in `resumed` too was
    /// then taken up again, in the same sweep, for a prompt acknowledged after the request.
    pub interrupted: Vec<SessionId>,
}

/// Orphans noticed and claimed per transaction of the sweep.
const SWEEP_CHUNK: usize = 1024;

/// Runs the sweep: (1) snapshots what this process already runs; (2) releases the child claims
/// no live turn holds (children are never resumed on their own) while (3) a reader lists the
/// sessions earlier boots left claimed and those owed a turn, minus that snapshot; (4a) counts
/// every claimed attempt durably, in one transaction, before any notice or drain; (4b) settles
/// the orphans in chunks, each one transaction (see the journal's `sweep`): resume, abort over
/// budget, or record the user interrupt that came before the crash; (4c) as each chunk commits,
/// its resumes start (registration only, never waiting for drains) while the writer commits the
/// next chunk. Returns once every resumed turn is registered (in `active()`).
pub(crate) async fn resume_suspended_sessions(
    registry: &Registry,
    env: &Arc<Environment>,
    max_resume_attempts: u32,
) -> Result<SweepReport> {
    let (journal, boot) = (&env.journal, &env.claimant());
    let active = registry.active();
    // Independent: the release touches child claims only, the plan lists top-level sessions.
    // The writer releases while a reader lists.
    let (children_released, plan) = futures::future::join(
        journal.release_child_claims(boot.clone()),
        journal.recovery_plan(boot.clone()),
    )
    .await;
    let (children_released, plan) = (children_released?, plan?);
    let claimed: Vec<SessionId> = plan
        .claimed
        .into_iter()
        .filter(|id| !active.contains(id))
        .collect();
    let owed: Vec<SessionId> = plan
        .owed
        .into_iter()
        .filter(|id| !active.contains(id))
        .collect();
    // Turns an earlier sweep of this process counted and could not settle: no listing finds
    // them (their claims name this boot). One a turn of this process took up since (a wake)
    // is that turn's to settle.
    let stranded: Vec<(SessionId, u32)> = registry
        .take_stranded()
        .into_iter()
        .filter(|(id, _)| !active.contains(id))
        .collect();
    // From the counting (which makes this node their owner) until their resumes are delivered,
    // wakes and interrupts of these sessions wait: a plain turn must not start next to the
    // adopted one.
    let adopted = claimed
        .iter()
        .chain(&owed)
        .chain(stranded.iter().map(|(id, _)| id));
    let _adopting = registry.adopt(adopted.cloned().collect());
    let mut orphans = if claimed.is_empty() {
        Vec::new()
    } else {
        match journal.count_resumes(claimed, boot.clone()).await {
            Ok(counted) => counted,
            Err(e) => {
                registry.strand(stranded);
                return Err(e.into());
            }
        }
    };
    orphans.extend(
        stranded
            .into_iter()
            .map(|(id, n)| Unfinished::Claimed(id, n)),
    );
    orphans.extend(owed.into_iter().map(Unfinished::Owed));
    let mut report = SweepReport {
        children_released,
        ..SweepReport::default()
    };
    if orphans.is_empty() {
        return Ok(report);
    }
    crate::crash::point(crate::crash::SWEEP_AFTER_COUNT);
    crate::crash::point(crate::crash::BEFORE_CLAIM);
    let max = max_resume_attempts;
    // The chunks are queued together; the writer's housekeeping (SQLite's settle of the event
    // log) waits until they are done rather than running between them.
    let _hold = journal.defer_maintenance();
    let outcomes = chunked(orphans, SWEEP_CHUNK).into_iter().map(|chunk| {
        async move {
            let counted: Vec<(SessionId, u32)> = chunk
                .iter()
                .filter_map(|orphan| match orphan {
                    Unfinished::Claimed(id, attempts) => Some((id.clone(), *attempts)),
                    Unfinished::Owed(_) => None,
                })
                .collect();
            let swept = match journal.sweep(chunk, max, boot.clone()).await {
                Ok(swept) => swept,
                Err(e) => {
                    // Counted and left unsettled: the next sweep settles them (an adoption's
                    // count rolled back with the rest, so its session is listed again).
                    registry.strand(counted);
                    return Err(e.into());
                }
            };
            // Each resumed turn's actor registers it (in `active()`) as it handles the message,
            // which `deliver` waits for; the drains run on their own.
            let registrations = swept.iter().filter_map(|outcome| match outcome {
                Swept::Resumed(id, resumption) => Some(async move {
                    let delivered = registry
                        .deliver(env, id, || {
                            let (reply, _outcome) = oneshot::channel();
                            let recovery = Some(resumption.clone());
                            (Resume { reply, recovery }, ())
                        })
                        .await;
                    if let Err(e) = delivered {
                        log::error!("sweep: could not resume session {id}: {e}");
                    }
                }),
                _ => None,
            });
            // Unordered, so each delivery's future is freed as it completes (a `join_all` keeps
            // every slot until the last one is done).
            {
                let mut registrations: futures::stream::FuturesUnordered<_> =
                    registrations.collect();
                while futures::StreamExt::next(&mut registrations).await.is_some() {}
            }
            Ok::<_, crate::Error>(swept)
        }
    });
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

    /// A runtime on `path` that does not sweep at start, and one stored session `name`.
    async fn start_with_session(
        path: &std::path::Path,
        runner: &ScriptedRunner,
        name: &str,
    ) -> (Runtime, SessionId) {
        let runtime = Runtime::builder()
            .database(path)
            .runner(runner.clone())
            .sweep_on_start(false)
            .start()
            .await
            .unwrap();
        let id = SessionId::new(name).unwrap();
        runtime
            .sessions()
            .create(CreateSession {
                id: Some(id.clone()),
                directory: "/sweep".into(),
                ..CreateSession::default()
            })
            .await
            .unwrap();
        (runtime, id)
    }

    /// Regression: two sweeps running at once in one boot count each orphaned turn
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

    /// A turn that promoted a queued prompt, was stopped by a durable user interrupt request and
    /// died before its terminal owes the next queued prompt (admitted after the request, with
    /// no wake of its own) a turn, as its terminal would have settled had it been written: the
    /// sweep records the interrupt, settles the claim like a terminal does, and takes the
    /// prompt up in the same sweep.
    #[actix_rt::test]
    async fn a_swept_interrupt_settles_the_queue_like_a_terminal() {
        use serde_json::json;

        use crate::event::SessionEvent;
        use crate::journal::sqlite::test_support::rows::Store;
        use crate::journal::sqlite::{open_connection, SqliteStore, StoreConfig};

        use crate::journal::sqlite::test_support::{admit, promote_queue};
        use crate::records::Delivery;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.db");
        let runner = ScriptedRunner::new();
        let (runtime, id) = start_with_session(&path, &runner, "queue").await;
        let later = {
            // What a dead boot left: its turn promoted p1 and was then asked to stop; p2 was
            // queued behind the request without a wake.
            let mut conn = SqliteStore::new(open_connection(&StoreConfig::new(&path)).unwrap());
            let p1 = crate::id::MessageId::new("p1").unwrap();
            let p2 = crate::id::MessageId::new("p2").unwrap();
            admit(&mut conn, &id, &p1, &json!("one"), Delivery::Queue, 1).unwrap();
            conn.publish(&id, kind::EXECUTION_STARTED, &json!({"boot": "dead"}), 2)
                .unwrap();
            assert!(promote_queue(&mut conn, &id, 3).unwrap().is_some());
            let request = SessionEvent::InterruptRequested {
                session_id: id.clone(),
            };
            conn.publish(&id, kind::INTERRUPT_REQUESTED, &request.data().unwrap(), 4)
                .unwrap();
            admit(&mut conn, &id, &p2, &json!("two"), Delivery::Queue, 5)
                .unwrap()
                .0
        };
        // The resumed turn serves the queue as a runner does (a failure shows in the log below).
        runner.set_default(
            &id,
            Script::custom(|turn| async move {
                let _ = turn.promote_queue().await;
                Ok(())
            }),
        );
        let report = runtime.resume_suspended_sessions().await.unwrap();
        assert_eq!(report.interrupted, vec![id.clone()]);
        assert_eq!(report.resumed, vec![id.clone()], "p2 is taken up");
        runtime.execution().await_idle(&id).await.unwrap();
        let drains = runner.drains_of(&id);
        assert_eq!(drains.len(), 1, "{drains:?}");
        let promoted = testing::events_of_kind(&path, &id, kind::PROMPT_PROMOTED).unwrap();
        assert_eq!(
            promoted.len(),
            2,
            "p1 before the crash, p2 after: {promoted:?}"
        );
        assert_eq!(promoted[1].data["messageID"], later.id.as_str());
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
        let (runtime, id) = start_with_session(&path, &runner, "orphan").await;
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
