//! Test-only crash points for the crash matrix (`tests/crash_matrix.rs`).
//!
//! With the cargo feature `crash-points` and the environment variable `DS_CRASH_POINT` set to a
//! point's name, the thread that reaches that point prints `CRASH_POINT <name>` on stdout and
//! blocks forever, so the test harness can `SIGKILL` the process exactly there. Without the
//! feature every point compiles to nothing: no code path users run ever reaches one.

/// Before the claim (`session.execution.started`) of a turn is sent to be committed.
pub(crate) const BEFORE_CLAIM: &str = "before_claim";
/// Inside the claim write of a turn, before its transaction commits.
pub(crate) const DURING_CLAIM: &str = "during_claim";
/// After the claim committed, before the drain starts.
pub(crate) const AFTER_CLAIM_BEFORE_DRAIN: &str = "after_claim_before_drain";
/// After the drain returned, before its terminal event (and release) is committed.
pub(crate) const AFTER_DRAIN_BEFORE_RELEASE: &str = "after_drain_before_release";
/// In the restart sweep, after the attempt counts committed, before the notices.
pub(crate) const SWEEP_AFTER_COUNT: &str = "sweep_after_count";
/// Inside the admission write of a prompt, before its transaction commits.
pub(crate) const DURING_ADMISSION: &str = "during_admission";
/// After an admission with `resume` committed, before its wake is sent (so before its caller
/// was answered).
pub(crate) const AFTER_ADMISSION_BEFORE_WAKE: &str = "after_admission_before_wake";
/// After a user interrupt request committed, before the interrupt reaches the turn.
pub(crate) const AFTER_INTERRUPT_REQUEST: &str = "after_interrupt_request";
/// Inside the promotion write of a turn, before its transaction commits.
pub(crate) const DURING_PROMOTION: &str = "during_promotion";

/// Inside a step: after its intent (`session.step.started`) committed, before its body runs.
pub(crate) const AFTER_STEP_INTENT: &str = "after_step_intent";
/// Inside a step: after its body returned, before its outcome is sent to be committed.
pub(crate) const AFTER_STEP_BODY: &str = "after_step_body";
/// Inside the commit of a step's outcome, before its transaction commits.
pub(crate) const DURING_STEP_OUTCOME: &str = "during_step_outcome";

/// Every crash point, for the matrix.
pub const ALL: &[&str] = &[
    BEFORE_CLAIM,
    DURING_CLAIM,
    AFTER_CLAIM_BEFORE_DRAIN,
    AFTER_DRAIN_BEFORE_RELEASE,
    SWEEP_AFTER_COUNT,
    DURING_ADMISSION,
    AFTER_ADMISSION_BEFORE_WAKE,
    AFTER_INTERRUPT_REQUEST,
    DURING_PROMOTION,
    AFTER_STEP_INTENT,
    AFTER_STEP_BODY,
    DURING_STEP_OUTCOME,
];

/// Reaches the crash point `name`: a no-op unless the feature and `DS_CRASH_POINT=name` are set.
#[inline]
pub(crate) fn point(name: &str) {
    #[cfg(feature = "crash-points")]
    {
        use std::io::Write;
        if std::env::var("DS_CRASH_POINT").is_ok_and(|v| v == name) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "CRASH_POINT {name}");
            let _ = out.flush();
            drop(out);
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
    #[cfg(not(feature = "crash-points"))]
    let _ = name;
}
