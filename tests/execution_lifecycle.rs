//! The session execution lifecycle: write-ahead claims, their release on terminals, their
//! survival through shutdown, and the restart sweep. (How a drain's ending is classified is
//! tested beside `terminal`, in the crate.)

mod common;

use durable_sessions::testing::{self, Gate, Script, ScriptedRunner};
use durable_sessions::{kind, RESTART_NOTICE_DESCRIPTION, RESTART_NOTICE_TEXT};
use durable_sessions::{Error, InterruptReason, Terminal};
use serde_json::json;

use common::{create, wait_for, Harness, WAIT};

/// `list_suspended` sees only the claimed parent; releasing child claims clears only the child.
#[actix_rt::test]
async fn the_sweep_only_lists_claimed_top_level_sessions() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let parent = create(&runtime, "parent", None).await;
    let idle = create(&runtime, "idle", None).await;
    let child = create(&runtime, "child", Some(&parent)).await;
    testing::seed_claim(runtime.path(), &parent, 0).unwrap();
    testing::seed_claim(runtime.path(), &child, 0).unwrap();
    runner.push(&parent, Script::Never);

    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert_eq!(report.resumed, vec![parent.clone()]);
    assert_eq!(report.children_released, 1);
    runner.wait_for_drains(1, WAIT).await;

    assert_eq!(runner.drains()[0].session_id, parent);
    assert_eq!(runner.drains().len(), 1);
    let claims =
        [&parent, &child, &idle].map(|id| testing::is_claimed(runtime.path(), id).unwrap());
    assert_eq!(claims, [true, false, false]);
    runtime.stop().await;
}

/// A claim commits before the drain, is released by completion, and survives shutdown.
#[actix_rt::test]
async fn claims_at_execution_start_releases_on_completion_and_preserves_through_teardown() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let a = create(&runtime, "a", None).await;
    let b = create(&runtime, "b", None).await;
    runner.push(&a, Script::Never);
    let gate = Gate::new();
    runner.push(&b, Script::Gate(gate.clone()));

    let execution = runtime.execution();
    let resume_a = actix_rt::spawn({
        let (execution, a) = (execution.clone(), a.clone());
        async move { execution.resume(&a).await }
    });
    let resume_b = actix_rt::spawn({
        let (execution, b) = (execution.clone(), b.clone());
        async move { execution.resume(&b).await }
    });
    runner.wait_for_drains(2, WAIT).await;
    assert!(testing::is_claimed(runtime.path(), &a).unwrap());
    assert!(testing::is_claimed(runtime.path(), &b).unwrap());

    gate.release();
    assert_eq!(resume_b.await.unwrap().unwrap(), Terminal::Succeeded);
    execution.await_idle(&b).await.unwrap();
    assert!(!testing::is_claimed(runtime.path(), &b).unwrap());

    runtime.stop().await;
    assert!(testing::is_claimed(runtime.path(), &a).unwrap());
    assert_eq!(
        resume_a.await.unwrap().unwrap(),
        Terminal::Interrupted {
            reason: InterruptReason::Shutdown
        }
    );
}

/// A user interrupt commits `interrupted{user}` with the release, so the turn never resurrects.
#[actix_rt::test]
async fn a_user_interrupt_releases_the_claim_so_the_turn_never_resurrects() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    runner.push(&s, Script::Never);
    let execution = runtime.execution();
    execution.wake(&s, None).await.unwrap();
    runner.wait_for_drains(1, WAIT).await;
    assert!(testing::is_claimed(runtime.path(), &s).unwrap());

    assert!(execution.interrupt(&s, None).await.unwrap());
    execution.await_idle(&s).await.unwrap();
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    let interrupted =
        testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_INTERRUPTED).unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].data, json!({"reason": "user"}));

    // A later sweep does not resume it.
    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert!(report.resumed.is_empty());
    runtime.stop().await;
}

/// After a durable interrupt request, an unsequenced wake is not silently dropped: it is refused
/// with `Error::WakeAfterInterrupt` naming the request's seq, and starts nothing — in this
/// process and after a restart. The ways the error names (a wake with the admission seq of newer
/// work, a resume) still run turns.
#[actix_rt::test]
async fn an_unsequenced_wake_after_an_interrupt_request_is_refused_not_dropped() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    assert!(!runtime.sessions().interrupt(&s).await.unwrap());
    let requested = testing::events_of_kind(runtime.path(), &s, kind::INTERRUPT_REQUESTED).unwrap();
    let fence = requested[0].seq;
    let refused = |result: Result<(), Error>| match result {
        Err(Error::WakeAfterInterrupt {
            session_id,
            interrupt_seq,
        }) => session_id == s && interrupt_seq == fence,
        _ => false,
    };

    let execution = runtime.execution();
    let woken = execution.wake(&s, None).await;
    assert!(refused(woken), "the wake is refused with the fence");
    assert!(!execution.active().contains(&s));
    assert!(runner.drains().is_empty());

    execution.wake(&s, Some(fence + 1)).await.unwrap();
    runner.wait_for_drains(1, WAIT).await;
    execution.await_idle(&s).await.unwrap();
    assert_eq!(execution.resume(&s).await.unwrap(), Terminal::Succeeded);
    assert_eq!(runner.drains().len(), 2);
    runtime.stop().await;

    // The request is durable, and so is the refusal.
    let runner = ScriptedRunner::new();
    runtime.restart(&runner, |b| b).await;
    let woken = runtime.execution().wake(&s, None).await;
    assert!(
        refused(woken),
        "the wake is refused with the fence after a restart"
    );
    assert!(runner.drains().is_empty());
    runtime.stop().await;
}

/// The sweep starts all claimed turns without waiting for earlier drains: their drains never
/// end, yet the sweep returns with all five resumed and registered (active), and all five
/// drains run at once.
#[actix_rt::test]
async fn starts_every_claimed_execution_without_waiting_for_earlier_drains_to_finish() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let id = create(&runtime, &format!("s{i}"), None).await;
        testing::seed_claim(runtime.path(), &id, 0).unwrap();
        runner.set_default(&id, Script::Never);
        ids.push(id);
    }
    let sweep = actix_rt::spawn({
        let runtime = runtime.clone();
        async move { runtime.resume_suspended_sessions().await }
    });
    let report = tokio::time::timeout(WAIT, sweep)
        .await
        .expect("the sweep returns while the drains still run")
        .unwrap()
        .unwrap();
    assert_eq!(report.resumed.len(), 5);
    let active: Vec<_> = runtime.execution().active().into_iter().collect();
    assert_eq!(active, ids);
    runner.wait_for_drains(5, WAIT).await;
    runtime.stop().await;
}

/// Each claimed session is resumed once, with the exact continue notice; a second sweep finds
/// nothing.
#[actix_rt::test]
async fn resumes_each_claimed_session_at_most_once() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let first = create(&runtime, "first", None).await;
    let second = create(&runtime, "second", None).await;
    testing::seed_claim(runtime.path(), &first, 0).unwrap();
    testing::seed_claim(runtime.path(), &second, 0).unwrap();

    runtime.resume_suspended_sessions().await.unwrap();
    runner.wait_for_drains(2, WAIT).await;
    let execution = runtime.execution();
    execution.await_idle(&first).await.unwrap();
    execution.await_idle(&second).await.unwrap();

    let mut drained: Vec<_> = runner.drains().into_iter().map(|d| d.session_id).collect();
    drained.sort();
    assert_eq!(drained, vec![first.clone(), second.clone()]);
    for id in [&first, &second] {
        let notices = testing::events_of_kind(runtime.path(), id, kind::SYNTHETIC).unwrap();
        assert_eq!(notices.len(), 1);
        assert_eq!(
            notices[0].data,
            json!({"sessionID": id, "text": RESTART_NOTICE_TEXT, "description": RESTART_NOTICE_DESCRIPTION})
        );
        assert!(!testing::is_claimed(runtime.path(), id).unwrap());
    }
    assert_eq!(testing::resume_attempts(runtime.path(), &first).unwrap(), 0);

    let again = runtime.resume_suspended_sessions().await.unwrap();
    assert!(again.resumed.is_empty());
    assert_eq!(runner.drains().len(), 2);
    for id in [&first, &second] {
        assert_eq!(
            testing::events_of_kind(runtime.path(), id, kind::SYNTHETIC)
                .unwrap()
                .len(),
            1
        );
    }
    runtime.stop().await;
}

/// `resume_attempts = 2` with a budget of 2 becomes 3 > 2: terminalized as `aborted`, no drain.
#[actix_rt::test]
async fn terminalizes_a_turn_that_exhausts_its_resume_budget_instead_of_crash_looping() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.max_resume_attempts(2))
        .start(&runner)
        .await;
    let s = create(&runtime, "s", None).await;
    testing::seed_claim(runtime.path(), &s, 2).unwrap();

    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert_eq!(report.terminalized, vec![s.clone()]);
    assert!(runner.drains().is_empty());
    let failed = testing::events_of_kind(runtime.path(), &s, kind::EXECUTION_FAILED).unwrap();
    let types: Vec<_> = failed
        .iter()
        .map(|e| e.data["error"]["type"].clone())
        .collect();
    assert_eq!(types, vec![json!("aborted")]);
    assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
    assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 0);
    runtime.stop().await;
}

/// The sweep counts the attempt durably before draining and never clears the claim it recovers;
/// shutdown keeps both.
#[actix_rt::test]
async fn counts_every_resume_durably_and_never_consumes_the_claim_it_recovers() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    testing::seed_claim(runtime.path(), &s, 0).unwrap();
    runner.push(&s, Script::Never);

    runtime.resume_suspended_sessions().await.unwrap();
    runner.wait_for_drains(1, WAIT).await;
    assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 1);
    assert!(testing::is_claimed(runtime.path(), &s).unwrap());

    runtime.stop().await;
    assert!(testing::is_claimed(runtime.path(), &s).unwrap());
    assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 1);
}

/// A session already draining in this process gets no count, no notice and keeps its claim.
#[actix_rt::test]
async fn the_sweep_leaves_sessions_already_draining_in_this_process_untouched() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let s = create(&runtime, "s", None).await;
    runner.push(&s, Script::Never);
    let execution = runtime.execution();
    let _running = actix_rt::spawn({
        let (execution, s) = (execution.clone(), s.clone());
        async move { execution.resume(&s).await }
    });
    runner.wait_for_drains(1, WAIT).await;

    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert!(report.resumed.is_empty());
    assert!(testing::events_of_kind(runtime.path(), &s, kind::SYNTHETIC)
        .unwrap()
        .is_empty());
    assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 0);
    assert!(testing::is_claimed(runtime.path(), &s).unwrap());
    wait_for("the turn to stay active", || {
        execution.active().contains(&s)
    })
    .await;
    runtime.stop().await;
}

/// A sweep releases the claim of a child session only when no live turn holds it: the turn of
/// a child running in this process keeps its claim until it ends (on PostgreSQL every node
/// sweeps every quarter lease; before the fix each sweep released the claims of every running
/// child turn, so a turn ended with no claim to settle against).
#[actix_rt::test]
async fn the_sweep_leaves_a_running_child_turn_claimed() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let parent = create(&runtime, "parent", None).await;
    let child = create(&runtime, "child", Some(&parent)).await;
    let gate = Gate::new();
    runner.push(&child, Script::Gate(gate.clone()));
    let execution = runtime.execution();
    let running = actix_rt::spawn({
        let (execution, child) = (execution.clone(), child.clone());
        async move { execution.resume(&child).await }
    });
    runner.wait_for_drains(1, WAIT).await;

    let report = runtime.resume_suspended_sessions().await.unwrap();
    assert_eq!(report.children_released, 0, "{report:?}");
    assert!(testing::is_claimed(runtime.path(), &child).unwrap());
    gate.release();
    running.await.unwrap().unwrap();
    assert!(!testing::is_claimed(runtime.path(), &child).unwrap());
    runtime.stop().await;
}

/// `start` returns once every turn a crash left claimed is resumed (its notice committed) and
/// registered, with the periodic takeover on too; five restarts in a row, each resuming the
/// turns the previous one's shutdown kept. Regression (PostgreSQL): the node's loop started
/// before the start-up sweep, and its first takeover (on the listener's first rescan) ran
/// alongside it: when that one counted the turns first, the start-up sweep found them taken by
/// this boot already and `start` returned before they were noticed or in `active()`.
#[actix_rt::test]
async fn start_returns_once_every_turn_a_crash_left_is_resumed() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        let id = create(&runtime, &format!("s{i}"), None).await;
        testing::seed_claim(runtime.path(), &id, 0).unwrap();
        runner.set_default(&id, Script::Never);
        ids.push(id);
    }
    for restart in 1..=5 {
        runtime
            .restart(&runner, |b| b.sweep_on_start(true).takeover(true))
            .await;
        let active: Vec<_> = runtime.execution().active().into_iter().collect();
        assert_eq!(
            active, ids,
            "restart {restart}: turns not registered by start"
        );
        for id in &ids {
            let notices = testing::events_of_kind(runtime.path(), id, kind::SYNTHETIC).unwrap();
            assert_eq!(
                notices.len(),
                restart,
                "{id}: notices when start {restart} returned"
            );
        }
        runner.wait_for_drains(ids.len() * restart, WAIT).await;
    }
    runtime.stop().await;
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_execution_lifecycle_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_execution_lifecycle_suite");
}

/// A sweep whose settling transaction failed after its count committed (the count names this
/// boot in the claim, so no later listing of this process finds the turn) leaves the turn to
/// the next sweep, which resumes it once — not claimed, with no actor, for as long as the
/// process lives (on PostgreSQL, where every node sweeps every quarter lease, until the node
/// died). The failure: another connection holds the session's `event_sequence` row past the
/// writer's lock timeout (a lease).
#[cfg(feature = "testing-postgres")]
fn the_next_sweep_settles_what_a_failed_sweep_counted() {
    actix_rt::System::new().block_on(async {
        let runner = ScriptedRunner::new();
        let runtime = Harness::with(|b| b.lease(std::time::Duration::from_secs(1)))
            .start(&runner)
            .await;
        let s = create(&runtime, "s", None).await;
        testing::seed_claim(runtime.path(), &s, 0).unwrap();
        let url = runtime.path().to_str().expect("a URL").to_owned();
        let (locked, is_locked) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut tx = client.transaction().unwrap();
            tx.execute(
                "SELECT seq FROM event_sequence WHERE aggregate_id = 's' FOR UPDATE",
                &[],
            )
            .unwrap();
            locked.send(()).unwrap();
            released.recv().unwrap();
            tx.rollback().unwrap();
        });
        is_locked.recv().unwrap();
        let failed = runtime.resume_suspended_sessions().await;
        assert!(failed.is_err(), "the sweep did not fail: {failed:?}");
        assert_eq!(testing::resume_attempts(runtime.path(), &s).unwrap(), 1);
        release.send(()).unwrap();
        holder.join().unwrap();

        let report = runtime.resume_suspended_sessions().await.unwrap();
        assert_eq!(report.resumed, vec![s.clone()], "{report:?}");
        runtime.execution().await_idle(&s).await.unwrap();
        let notices = testing::events_of_kind(runtime.path(), &s, kind::SYNTHETIC).unwrap();
        assert_eq!(notices.len(), 1);
        assert_eq!(runner.drains_of(&s).len(), 1);
        assert!(!testing::is_claimed(runtime.path(), &s).unwrap());
        runtime.stop().await;
    });
}

/// [`the_next_sweep_settles_what_a_failed_sweep_counted`], on PostgreSQL only (its failure is
/// a row lock).
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_settles_what_a_failed_sweep_counted() {
    common::postgres_only(
        "postgres_backend_settles_what_a_failed_sweep_counted",
        the_next_sweep_settles_what_a_failed_sweep_counted,
    );
}
