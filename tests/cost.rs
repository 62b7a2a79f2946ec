//! What a turn costs stays flat as a session grows (issue #15):
//! - live-only events (`Turn::publish_live`) reach the session's open streams, in order and
//!   after the durable events their turn wrote before them, and write nothing: no seq, no
//!   commit, no row; a clone of the turn kept past its drain publishes nothing;
//! - incremental context (`Turn::context_after`, `Turn::context_tail`) returns only the
//!   messages after a cursor (or the newest `n`), within a drain and across drains.
//!
//! Each test runs on SQLite, and again on PostgreSQL in `postgres_backend_passes_the_cost_suite`.

mod common;

use std::sync::{Arc, Mutex};

use durable_sessions::testing::{Script, ScriptedRunner};
use durable_sessions::{
    kind, Error, Message, PromptInput, Runtime, SessionId, StreamItem, Terminal, Turn,
};
use serde_json::{json, Value};

use common::{count, create, text, Harness, WAIT};

/// Live events the drain publishes.
const DELTAS: usize = 50;

/// Stored events of `session`: every row of the event table for it.
fn stored_events(runtime: &Harness, session: &SessionId) -> i64 {
    count(
        runtime.path(),
        &format!(
            "SELECT COUNT(*) FROM event WHERE aggregate_id = '{}'",
            session.as_str()
        ),
    )
}

/// Reads `stream` until the turn's terminal and [`DELTAS`] live events were read, failing
/// after [`WAIT`].
async fn read_turn(stream: &mut durable_sessions::SessionStream) -> Vec<StreamItem> {
    let mut items: Vec<StreamItem> = Vec::new();
    let done = |items: &[StreamItem]| {
        items.iter().filter(|i| i.seq().is_none()).count() == DELTAS
            && items.iter().any(|i| i.kind() == kind::EXECUTION_SUCCEEDED)
    };
    while !done(&items) {
        let item = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap_or_else(|_| panic!("an item in time after {items:?}"))
            .expect("the stream goes on")
            .expect("the read succeeds");
        items.push(item);
    }
    items
}

/// What the drain of [`live_script`] leaves for the test: the writer's request count before
/// and after its live events, and a clone of its turn.
#[derive(Default)]
struct Left {
    requests: Option<(u64, u64)>,
    turn: Option<Turn>,
}

/// A drain that writes one durable event, then publishes [`DELTAS`] live-only events (noting
/// the write requests `runtime`'s writer processed meanwhile), then keeps a clone of its turn.
fn live_script(runtime: Runtime, left: Arc<Mutex<Left>>) -> Script {
    Script::custom(move |turn| {
        let (runtime, left) = (runtime.clone(), left.clone());
        async move {
            turn.publish("agent.step", json!({ "n": 0 })).await?;
            let requests = || runtime.stats().persistence.requests;
            let before = requests();
            for i in 0..DELTAS {
                turn.publish_live("agent.delta", json!({ "i": i }))?;
            }
            let mut left = left.lock().unwrap();
            left.requests = Some((before, requests()));
            left.turn = Some(turn);
            Ok(())
        }
    })
}

/// Live-only events reach a subscriber of the session in order, each after the durable event
/// its turn committed before it, as items without a seq; a durable-only stream never sees
/// them; and nothing of them is stored: the event table gains exactly the turn's durable
/// events, the writer processes no request for them, and a replay has none. A clone of the
/// turn kept past its drain publishes nothing.
#[actix_rt::test]
async fn live_only_events_reach_subscribers_and_are_never_stored() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let mut stream = sessions.stream(&s, None).await.unwrap();
    let mut durable_only = sessions.events(&s, None).await.unwrap();
    let stored_before = stored_events(&runtime, &s);
    let left = Arc::new(Mutex::new(Left::default()));
    runner.push(&s, live_script(runtime.runtime().clone(), left.clone()));
    // Read while the turn runs: its live events come straight from the drain, its durable
    // ones through the writer and the dispatcher, and the stream still yields them in order.
    let turn = actix_rt::spawn({
        let (sessions, s) = (sessions.clone(), s.clone());
        async move { sessions.resume(&s).await }
    });
    let items = read_turn(&mut stream).await;
    assert_eq!(turn.await.unwrap().unwrap(), Terminal::Succeeded);
    let step = items
        .iter()
        .position(|i| i.kind() == "agent.step")
        .expect("the durable step");
    let step_seq = items[step].seq().expect("a durable seq");
    let live: Vec<&StreamItem> = items.iter().filter(|i| i.seq().is_none()).collect();
    assert_eq!(live.len(), DELTAS, "every live event, once: {items:?}");
    for (i, item) in live.iter().enumerate() {
        let StreamItem::Live(event) = item else {
            panic!("a live item: {item:?}")
        };
        assert_eq!(
            (event.kind.as_str(), &event.data, &event.session_id),
            ("agent.delta", &json!({ "i": i }), &s),
            "in order"
        );
        assert_eq!(event.after_seq, step_seq, "after the turn's last write");
    }
    let first_live = items.iter().position(|i| i.seq().is_none()).unwrap();
    assert!(step < first_live, "the step comes first: {items:?}");
    let durable: Vec<u64> = items.iter().filter_map(StreamItem::seq).collect();
    assert_eq!(durable, (0..=step_seq + 1).collect::<Vec<_>>(), "{items:?}");
    assert_eq!(stream.live_dropped(), 0);

    // Nothing stored: the started, step and succeeded events only; no write request while
    // the live events went out; none in a replay or in the durable-only stream.
    assert_eq!(stored_events(&runtime, &s), stored_before + 3);
    let deltas = count(
        runtime.path(),
        "SELECT COUNT(*) FROM event WHERE type = 'agent.delta'",
    );
    assert_eq!(deltas, 0);
    let (before, after) = left.lock().unwrap().requests.expect("the drain ran");
    assert_eq!(after, before, "live events made write requests");
    let mut replay = sessions.events(&s, None).await.unwrap();
    let last = sessions.last_seq(&s).await.unwrap();
    for seq in 0..=last {
        let event = replay.next().await.unwrap().unwrap();
        assert_eq!(event.seq, seq);
        assert_ne!(event.kind, "agent.delta");
        let event = durable_only.next().await.unwrap().unwrap();
        assert_eq!(
            event.seq, seq,
            "the durable-only stream: durable events only"
        );
    }

    // The drain ended: its turn publishes nothing more, and names were checked first.
    let turn = left.lock().unwrap().turn.take().expect("the kept turn");
    let late = turn.publish_live("agent.delta", json!({ "late": true }));
    assert!(matches!(late, Err(Error::TurnEnded { .. })), "{late:?}");
    for name in ["", kind::EXECUTION_SUCCEEDED, "bad\nname"] {
        let refused = turn.publish_live(name, Value::Null);
        assert!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "{name:?}: {refused:?}"
        );
    }
    assert_eq!(stored_events(&runtime, &s), stored_before + 3);
    runtime.stop().await;
}

/// What a drain read, for the test to check.
#[derive(Debug, Default)]
struct Reads {
    all: Vec<Message>,
    /// `context_after` at each cursor, with the cursor.
    after: Vec<(Option<u64>, Vec<Message>)>,
    /// `context_tail` for each `n`, with `n`.
    tail: Vec<(usize, Vec<Message>)>,
}

fn ids(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| m.id.to_string()).collect()
}

/// Within a drain: `context_after(cursor)` is exactly the messages with a greater seq (a
/// message's seq, or any event's, as cursor), and `context_tail(n)` the newest `n`, both in
/// order. Across drains: a runner that keeps the seq of the last message it read gets only
/// what the next turn added.
#[actix_rt::test]
async fn context_after_a_cursor_returns_only_newer_messages() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    for i in 0..3 {
        let prompt = PromptInput::new(s.clone(), text(&format!("p{i}"))).with_resume(false);
        sessions.prompt(prompt).await.unwrap();
    }
    let reads = Arc::new(Mutex::new(Reads::default()));
    runner.push(&s, {
        let reads = reads.clone();
        Script::custom(move |turn| {
            let reads = reads.clone();
            async move {
                turn.promote_steer(None).await?;
                turn.append_message("assistant", json!({ "text": "a0" }))
                    .await?;
                // An event between two messages: its seq is a cursor too.
                let step = turn.publish("agent.step", json!({})).await?;
                for text in ["a1", "a2"] {
                    turn.append_message("assistant", json!({ "text": text }))
                        .await?;
                }
                let all = turn.context().await?;
                let mut got = Reads::default();
                for cursor in [None, Some(all[2].seq), Some(step.seq), Some(all[5].seq)] {
                    got.after.push((cursor, turn.context_after(cursor).await?));
                }
                for n in [0, 2, 6, 100] {
                    got.tail.push((n, turn.context_tail(n).await?));
                }
                got.all = all;
                *reads.lock().unwrap() = got;
                Ok(())
            }
        })
    });
    assert_eq!(sessions.resume(&s).await.unwrap(), Terminal::Succeeded);
    let first = std::mem::take(&mut *reads.lock().unwrap());
    let all = &first.all;
    assert_eq!(all.len(), 6, "{all:?}");
    let texts: Vec<&Value> = all.iter().map(|m| &m.data["text"]).collect();
    assert_eq!(texts[3..], [&json!("a0"), &json!("a1"), &json!("a2")]);
    let expected_after = [&all[..], &all[3..], &all[4..], &[][..]];
    for ((cursor, got), expected) in first.after.iter().zip(expected_after) {
        assert_eq!(ids(got), ids(expected), "after {cursor:?}");
        assert_eq!(got, expected, "after {cursor:?}: the same messages");
    }
    let expected_tail = [&[][..], &all[4..], &all[..], &all[..]];
    for ((n, got), expected) in first.tail.iter().zip(expected_tail) {
        assert_eq!(ids(got), ids(expected), "tail {n}");
    }

    // The next turn: a runner keeping the last seq it read gets only what was added since.
    let cursor = all.last().map(|m| m.seq);
    sessions
        .prompt(PromptInput::new(s.clone(), text("p3")).with_resume(false))
        .await
        .unwrap();
    runner.push(&s, {
        let reads = reads.clone();
        Script::custom(move |turn| {
            let reads = reads.clone();
            async move {
                turn.promote_steer(None).await?;
                turn.append_message("assistant", json!({ "text": "a3" }))
                    .await?;
                let newer = turn.context_after(cursor).await?;
                reads.lock().unwrap().after.push((cursor, newer));
                Ok(())
            }
        })
    });
    assert_eq!(sessions.resume(&s).await.unwrap(), Terminal::Succeeded);
    let second = std::mem::take(&mut *reads.lock().unwrap());
    let (_, newer) = &second.after[0];
    let summary: Vec<(&str, &Value)> = newer.iter().map(|m| (m.kind.as_str(), &m.data)).collect();
    assert_eq!(summary.len(), 2, "{newer:?}");
    assert_eq!(summary[0].0, "user");
    assert_eq!(summary[0].1["prompt"], text("p3"));
    assert_eq!(summary[1], ("assistant", &json!({ "text": "a3" })));
    assert!(newer.iter().all(|m| Some(m.seq) > cursor));
    let whole = sessions.context(&s).await.unwrap();
    assert_eq!(
        ids(&whole[6..]),
        ids(newer),
        "the whole transcript ends with them"
    );
    runtime.stop().await;
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_cost_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_cost_suite");
}
