//! A node that lost its lease and rejoined under a new id, with whole runtimes: two nodes in
//! this process on one database of the shared cluster (see `tests`).

use std::time::{Duration, Instant};

use serde_json::json;

use super::conn::connect;
use super::tests::{config, pg_db, PgDb};
use crate::event::kind;
use crate::id::SessionId;
use crate::service::{CreateSession, PromptInput};
use crate::testing::{Gate, Script, ScriptedRunner};
use crate::Runtime;

/// How long each wait of the test lasts at most.
const WAIT: Duration = Duration::from_secs(20);

/// Runs `sql` (every column cast to text) on a thread of its own: the sync client must not run
/// inside the test's runtime.
fn rows(db: &PgDb, sql: &str) -> Vec<Vec<Option<String>>> {
    let (cfg, sql) = (config(db, "admin"), sql.to_owned());
    std::thread::spawn(move || {
        let mut client = connect(&cfg).expect("an admin connection");
        let rows = client.query(&sql, &[]).expect(&sql);
        rows.iter()
            .map(|row| (0..row.len()).map(|i| row.get(i)).collect())
            .collect()
    })
    .join()
    .expect("the admin thread")
}

/// The only value `sql` returns.
fn value(db: &PgDb, sql: &str) -> Option<String> {
    rows(db, sql)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
}

/// Polls `sql` until it returns `want`; returns what it returned last.
async fn await_value(db: &PgDb, sql: &str, want: &str) -> Option<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = value(db, sql);
        if got.as_deref() == Some(want) || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A drain that waits for `gate`, then takes the pending prompts and answers them.
fn answering(gate: &Gate) -> Script {
    let gate = gate.clone();
    Script::custom(move |turn| {
        let gate = gate.clone();
        async move {
            gate.wait().await;
            let fail = |e: crate::Error| crate::outcome::RunError::Other(e.to_string());
            turn.promote_steer(None).await.map_err(fail)?;
            turn.append_message("assistant", json!({ "text": "answered" }))
                .await
                .map_err(fail)?;
            Ok(())
        }
    })
}

/// A node on `db` running `runner`'s drains.
async fn start(db: &PgDb, name: &str, lease: Duration, runner: &ScriptedRunner) -> Runtime {
    Runtime::builder()
        .postgres(db.url.clone())
        .node_name(name)
        .lease(lease)
        .takeover(name != "a")
        .arbiters(1)
        .shutdown_grace(Duration::from_millis(200))
        .runner(runner.clone())
        .start()
        .await
        .expect("a node starts")
}

/// Node `a` pauses past its lease (its lease is ended in the database) while a turn it claimed
/// runs; its lease thread rejoins under a new id, and before its loop handles the lost lease
/// (the loop's thread is held), a prompt is admitted on it and its turn claimed under the new
/// id. Then the loop fences what the old id held: that turn is taken over by node `b`, while
/// the turn claimed under the new id runs on and is answered, once.
#[actix_rt::test]
async fn a_rejoining_node_keeps_the_turns_it_claimed_under_its_new_id() {
    let Some(db) = pg_db("rejoin_keeps_turns") else {
        return;
    };
    let runner = ScriptedRunner::new();
    let a = start(&db, "a", Duration::from_millis(1_500), &runner).await;
    let b = start(&db, "b", Duration::from_secs(10), &runner).await;
    let (held, fresh) = (
        SessionId::new("held").unwrap(),
        SessionId::new("fresh").unwrap(),
    );
    for id in [&held, &fresh] {
        b.sessions()
            .create(CreateSession {
                id: Some(id.clone()),
                directory: "/rejoin".into(),
                ..CreateSession::default()
            })
            .await
            .unwrap();
    }
    let (old_gate, new_gate) = (Gate::new(), Gate::new());
    runner.push(&held, Script::Gate(old_gate.clone()));
    runner.push(&fresh, answering(&new_gate));
    a.sessions()
        .prompt(PromptInput::new(held.clone(), json!("under the old id")))
        .await
        .unwrap();
    runner.wait_for_drains_of(&held, 1, WAIT).await;
    let old_id = a.node_id();

    // This thread runs both nodes' loops: while it waits for `paused`, neither handles a
    // signal, so `a` rejoins and admits a prompt before it handles its lost lease.
    let paused = {
        let (a, runner, fresh, old_id) = (a.clone(), runner.clone(), fresh.clone(), old_id.clone());
        let cfg = config(&db, "admin");
        std::thread::spawn(move || -> Result<String, String> {
            let mut admin = connect(&cfg).map_err(|e| e.to_string())?;
            admin
                .execute(
                    "UPDATE node SET lease_until = now() - interval '1 second' WHERE node_id = $1",
                    &[&old_id],
                )
                .map_err(|e| e.to_string())?;
            let deadline = Instant::now() + WAIT;
            while a.node_id() == old_id {
                if Instant::now() > deadline {
                    return Err("node a never rejoined".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            actix_rt::System::new().block_on(async move {
                let prompt = PromptInput::new(fresh.clone(), json!("under the new id"));
                let admitted = tokio::time::timeout(WAIT, a.sessions().prompt(prompt)).await;
                match admitted {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(format!("prompt: {e}")),
                    Err(_) => return Err("prompt: timed out".into()),
                }
                // A drain starts once its claim committed.
                runner.wait_for_drains_of(&fresh, 1, WAIT).await;
                Ok(a.node_id())
            })
        })
        .join()
    };
    let new_id = paused
        .expect("the paused thread")
        .expect("a rejoined and claimed");
    assert_ne!(new_id, old_id);
    let claim = "SELECT claim_boot || ' ' || owner_node FROM session WHERE id = 'fresh'";
    assert_eq!(value(&db, claim), Some(format!("{new_id} {new_id}")));

    // `a` handles its lost lease now: what the old id held is fenced and taken over by `b`.
    let b_id = b.node_id();
    let owner = "SELECT owner_node || ' ' || (time_suspended IS NULL) FROM session \
                 WHERE id = 'held'";
    assert_eq!(
        await_value(&db, owner, &format!("{b_id} true")).await,
        Some(format!("{b_id} true")),
        "b took over the turn claimed under a's old id"
    );
    assert_eq!(runner.drains_of(&held).len(), 2);
    old_gate.release();

    // The turn claimed under the new id was left running: it ends and answers its prompt, once.
    new_gate.release();
    let answered = format!(
        "SELECT COUNT(*) FILTER (WHERE type = '{}') || ' ' || \
                COUNT(*) FILTER (WHERE type = '{}') || ' ' || \
                COUNT(*) FILTER (WHERE type = '{}') || ' ' || \
                COUNT(*) FILTER (WHERE type = '{}') FROM event WHERE aggregate_id = 'fresh'",
        kind::PROMPT_PROMOTED,
        kind::MESSAGE_APPENDED,
        kind::EXECUTION_STARTED,
        kind::EXECUTION_SUCCEEDED
    );
    assert_eq!(
        await_value(&db, &answered, "1 1 1 1").await.as_deref(),
        Some("1 1 1 1"),
        "promoted, answered, started, succeeded"
    );
    let claimed = "SELECT (time_suspended IS NULL) || ' ' || owner_node FROM session \
                   WHERE id = 'fresh'";
    assert_eq!(value(&db, claimed), Some(format!("true {new_id}")));
    assert_eq!(runner.drains_of(&fresh).len(), 1, "never taken over");
    let writers = "SELECT string_agg(DISTINCT node, ' ') FROM event \
                   WHERE aggregate_id = 'fresh' AND type <> 'session.created'";
    assert_eq!(value(&db, writers), Some(new_id.clone()));

    // The old id wrote nothing after the takeover: a turn's last events are `b`'s.
    let last = "SELECT node FROM event WHERE aggregate_id = 'held' ORDER BY seq DESC LIMIT 1";
    assert_eq!(value(&db, last), Some(b_id));
    a.shutdown().await;
    b.shutdown().await;
}
