//! Self-healing while the runtime runs: a claim of this boot (or node) with no live turn in this
//! process is settled by the restart sweep's rules, without waiting for a restart.
//!
//! A session actor keeps the turns the store failed under and heals a claim it may have left
//! (see `session::heal`), so such a claim is rare: one whose commit answered an error though it
//! was stored, with no later turn of the session. Every [`HEAL_TICK`] the healer lists this
//! claimant's claims; one seen twice in a row at the same claim seq with no turn active here
//! (a live turn is in `active()` from before its claim until after its release), and no sweep
//! of this process settling it, is an orphan: its actor is told (`Heal`), and starts a turn
//! that resumes it with the restart notice (an attempt counted), or aborts it over budget.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::id::SessionId;
use crate::registry::Registry;
use crate::session::messages::Heal;
use crate::session::Environment;

/// How often the healer looks for orphaned claims of this process: one read of the claim
/// table a second.
pub(crate) const HEAL_TICK: Duration = Duration::from_secs(1);

/// Starts the healer on the current arbiter; it stops with the registry.
pub(crate) fn start(registry: Arc<Registry>, env: Arc<Environment>) {
    actix_rt::spawn(async move {
        let mut suspects = HashMap::new();
        loop {
            tokio::time::sleep(HEAL_TICK).await;
            if registry.is_closed() {
                break;
            }
            heal(&registry, &env, &mut suspects).await;
        }
    });
}

/// One look: tells the actors of the claims `suspects` held at the last look, still held at
/// the same seq with no turn here, to heal them; remembers this look's suspects. Returns the
/// sessions told.
pub(crate) async fn heal(
    registry: &Registry,
    env: &Arc<Environment>,
    suspects: &mut HashMap<SessionId, u64>,
) -> Vec<SessionId> {
    let claims = match env.journal.own_claims(env.claimant()).await {
        Ok(claims) => claims,
        Err(e) => {
            log::debug!("healer: cannot list this process's claims: {e}");
            return Vec::new();
        }
    };
    let active = registry.active();
    let seen = std::mem::take(suspects);
    let mut told = Vec::new();
    for (id, claim) in claims {
        if active.contains(&id) || registry.swept(&id) {
            continue;
        }
        if seen.get(&id) != Some(&claim) {
            suspects.insert(id, claim);
            continue;
        }
        log::warn!("session {id}: its claim has no live turn here; healing it");
        match registry.deliver(env, &id, || (Heal, ())).await {
            Ok(()) => told.push(id),
            Err(e) => log::warn!("healer: cannot reach session {id}: {e}"),
        }
    }
    told
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use crate::event::kind;
    use crate::id::SessionId;
    use crate::journal::sqlite::test_support::rows::Store;
    use crate::journal::sqlite::{open_connection, SqliteStore, StoreConfig};
    use crate::service::CreateSession;
    use crate::testing::{self, Gate, Script, ScriptedRunner};
    use crate::Runtime;

    /// A claim this boot holds with no live turn (its commit's answer was lost) is resumed while
    /// the runtime runs, with the restart notice; a live turn's claim, held across several
    /// looks, is left alone.
    #[actix_rt::test]
    async fn an_orphaned_claim_of_this_boot_is_resumed_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heal.db");
        let runner = ScriptedRunner::new();
        let runtime = Runtime::builder()
            .database(&path)
            .runner(runner.clone())
            .start()
            .await
            .unwrap();
        let [orphan, live] = ["orphan", "live"].map(|id| SessionId::new(id).unwrap());
        for id in [&orphan, &live] {
            let created = CreateSession {
                id: Some(id.clone()),
                directory: "/heal".into(),
                ..CreateSession::default()
            };
            runtime.sessions().create(created).await.unwrap();
        }
        let gate = Gate::new();
        runner.push(&live, Script::Gate(gate.clone()));
        runtime.execution().wake(&live, None).await.unwrap();
        {
            // What a claim whose answer was lost leaves: the claim of this boot, no turn.
            let mut conn = SqliteStore::new(open_connection(&StoreConfig::new(&path)).unwrap());
            let boot = json!({ "boot": runtime.boot_id() });
            conn.publish(&orphan, kind::EXECUTION_STARTED, &boot, 2)
                .unwrap();
        }
        runner
            .wait_for_drains_of(&orphan, 1, super::HEAL_TICK * 5)
            .await;
        runtime.execution().await_idle(&orphan).await.unwrap();
        assert_eq!(testing::resume_attempts(&path, &orphan).unwrap(), 0);
        assert!(!testing::is_claimed(&path, &orphan).unwrap());
        let notices = testing::events_of_kind(&path, &orphan, kind::SYNTHETIC).unwrap();
        assert_eq!(notices.len(), 1);

        // The live turn held its claim through at least two more looks.
        tokio::time::sleep(super::HEAL_TICK * 2 + Duration::from_millis(200)).await;
        gate.release();
        runtime.execution().await_idle(&live).await.unwrap();
        assert!(testing::events_of_kind(&path, &live, kind::SYNTHETIC)
            .unwrap()
            .is_empty());
        let drains = runner.drains_of(&live);
        assert_eq!(drains.len(), 1, "{drains:?}");
        runtime.shutdown().await;
    }
}
