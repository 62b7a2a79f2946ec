//! The session service beyond prompt admission: `create` idempotency and its
//! race, `list` filters/order/anchors, transcript cursors, `context` decode errors, promotion
//! from inside a turn, the replay-then-live event stream (under concurrent publishing and with a
//! lagging subscriber), interrupt fencing, and input validation that writes nothing.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::kind;
use durable_sessions::testing::{self, DrainRecord, Gate, Script, ScriptedRunner};
use durable_sessions::{
    Admission, Anchor, CreateSession, Creation, Cursor, Delivery, Direction, Error, ListQuery,
    MessageId, MessagesQuery, Order, ParentFilter, PromptInput, RuntimeConfig, SessionId,
    SessionInfo, Sessions, Terminal,
};
use futures::future::{join_all, Either};
use futures::StreamExt;
use serde_json::{json, Value};

use common::{count, create, mid, sid, text, Harness, WAIT};

/// Row counts of the four tables a rejected call must leave alone.
fn row_counts(db: &Path) -> [i64; 4] {
    ["session", "session_input", "session_message", "event"]
        .map(|table| count(db, &format!("SELECT COUNT(*) FROM {table}")))
}

fn ids(sessions: &[SessionInfo]) -> Vec<String> {
    sessions.iter().map(|s| s.id.to_string()).collect()
}

fn quiet(session: &SessionId, prompt: Value) -> PromptInput {
    PromptInput::new(session.clone(), prompt).with_resume(false)
}

fn is_invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::InvalidInput { .. }))
}

/// A runner script that appends `n` assistant messages and reports their ids.
fn append_script(n: usize, ids: Arc<Mutex<Vec<MessageId>>>) -> Script {
    Script::custom(move |turn| {
        let ids = ids.clone();
        async move {
            for i in 0..n {
                let id = turn
                    .append_message("assistant", json!({ "text": format!("reply {i}") }))
                    .await?;
                ids.lock().unwrap().push(id);
            }
            Ok(())
        }
    })
}

/// Reads the next event of `stream`, failing the test after [`WAIT`].
async fn next_seq(stream: &mut durable_sessions::SessionEvents) -> u64 {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("the read succeeds")
        .seq
}

/// Creating an existing id returns the stored session unchanged and writes nothing; defaults
/// and parent validation behave as documented.
#[actix_rt::test]
async fn create_is_idempotent_by_id() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();

    let first = sessions
        .create(CreateSession {
            id: Some(sid("a")),
            title: Some("first".into()),
            directory: "/one".into(),
            agent: Some("build".into()),
            model: Some(json!({"id": "m", "providerID": "p"})),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    let again = sessions
        .create(CreateSession {
            id: Some(sid("a")),
            title: Some("second".into()),
            directory: "/two".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    assert!(first.is_created() && !again.is_created());
    let (first, again) = (first.into_info(), again.into_info());
    assert_eq!(again, first);
    assert_eq!(sessions.get(&sid("a")).await.unwrap(), first);
    assert_eq!(first.title, "first");
    let created = testing::events(runtime.path(), &sid("a")).unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(
        (created[0].seq, created[0].kind.as_str()),
        (0, kind::CREATED)
    );

    let generated = sessions
        .create(CreateSession {
            directory: "/one".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    assert!(generated.id.as_str().starts_with("ses_"));
    assert!(
        generated.title.starts_with("New session - "),
        "{}",
        generated.title
    );
    assert_eq!(
        (generated.parent_id.as_ref(), generated.time_suspended),
        (None, None)
    );

    let orphan = sessions
        .create(CreateSession {
            id: Some(sid("orphan")),
            parent_id: Some(sid("missing")),
            directory: "/one".into(),
            ..CreateSession::default()
        })
        .await;
    assert!(
        matches!(orphan, Err(Error::NotFound { session_id }) if session_id.as_str() == "missing")
    );
    let child = sessions
        .create(CreateSession {
            id: Some(sid("child")),
            parent_id: Some(sid("a")),
            directory: "/one".into(),
            ..CreateSession::default()
        })
        .await
        .unwrap();
    assert_eq!(child.parent_id, Some(sid("a")));
    assert_eq!(count(runtime.path(), "SELECT COUNT(*) FROM session"), 3);
    runtime.stop().await;
}

/// Twenty concurrent creates of one id: one row, equal answers, exactly one `session.created`
/// event, and live subscribers see that one event.
#[actix_rt::test]
async fn concurrent_creates_of_one_id_make_one_row_and_the_same_answer() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let mut bus = runtime.subscribe();

    let creates = (0..20).map(|i| {
        let sessions = sessions.clone();
        async move {
            sessions
                .create(CreateSession {
                    id: Some(sid("race")),
                    title: Some(format!("title {i}")),
                    directory: format!("/dir/{i}"),
                    ..CreateSession::default()
                })
                .await
        }
    });
    let answers: Vec<Creation> = join_all(creates)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let created = answers.iter().filter(|a| a.is_created()).count();
    assert_eq!(
        created, 1,
        "exactly one create of the id created it: {answers:?}"
    );
    let answers: Vec<SessionInfo> = answers.into_iter().map(Creation::into_info).collect();
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert_eq!(sessions.get(&sid("race")).await.unwrap(), answers[0]);
    assert_eq!(count(runtime.path(), "SELECT COUNT(*) FROM session"), 1);
    let created = testing::events_of_kind(runtime.path(), &sid("race"), kind::CREATED).unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].data["info"]["title"], json!(answers[0].title));

    let live = tokio::time::timeout(WAIT, bus.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (live.session_id.as_str(), live.seq, live.kind.as_str()),
        ("race", 0, kind::CREATED)
    );
    let nothing_more = tokio::time::timeout(Duration::from_millis(50), bus.recv()).await;
    assert!(nothing_more.is_err(), "{nothing_more:?}");
    runtime.stop().await;
}

/// `list` filters by directory, parent and title search, orders on `(time_created, id)` both
/// ways, and pages with `next`/`previous` anchors in both orders, each page in the requested
/// order and every session exactly once.
#[actix_rt::test]
async fn lists_with_filters_order_and_anchors_in_both_directions() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let spec = [
        ("a", None, "/one", "plain title"),
        ("b", None, "/one", "100% done"),
        ("c", Some("a"), "/one", "100 percent"),
        ("d", None, "/two", "snake_case"),
        ("e", Some("a"), "/two", "snakeXcase"),
        ("f", None, "/one", "fresh"),
        ("g", Some("d"), "/one", "grand"),
    ];
    for (id, parent, directory, title) in spec {
        sessions
            .create(CreateSession {
                id: Some(sid(id)),
                parent_id: parent.map(sid),
                title: Some(title.into()),
                directory: directory.into(),
                ..CreateSession::default()
            })
            .await
            .unwrap();
    }
    // Creation times may tie within a millisecond; the order is `(time_created, id)` either way.
    let mut asc = sessions
        .list(ListQuery {
            order: Order::Asc,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let mut expected = asc.clone();
    expected.sort_by(|x, y| (x.time_created, &x.id).cmp(&(y.time_created, &y.id)));
    assert_eq!(ids(&asc), ids(&expected));
    let desc = sessions.list(ListQuery::default()).await.unwrap();
    asc.reverse();
    assert_eq!(ids(&desc), ids(&asc));
    asc.reverse();

    let listed = |query: ListQuery| {
        let sessions = sessions.clone();
        async move { ids(&sessions.list(query).await.unwrap()) }
    };
    let in_asc_order = |wanted: &[&str]| -> Vec<String> {
        ids(&asc)
            .into_iter()
            .filter(|id| wanted.contains(&id.as_str()))
            .collect()
    };
    let one = listed(ListQuery {
        directory: Some("/one".into()),
        order: Order::Asc,
        ..ListQuery::default()
    })
    .await;
    assert_eq!(one, in_asc_order(&["a", "b", "c", "f", "g"]));
    let top = listed(ListQuery {
        parent: ParentFilter::TopLevel,
        order: Order::Asc,
        ..ListQuery::default()
    })
    .await;
    assert_eq!(top, in_asc_order(&["a", "b", "d", "f"]));
    let children = listed(ListQuery {
        parent: ParentFilter::ChildrenOf(sid("a")),
        order: Order::Asc,
        ..ListQuery::default()
    })
    .await;
    assert_eq!(children, in_asc_order(&["c", "e"]));
    let search = |text: &str| ListQuery {
        search: Some(text.into()),
        order: Order::Asc,
        ..ListQuery::default()
    };
    assert_eq!(listed(search("100%")).await, ["b"]);
    assert_eq!(listed(search("100")).await, in_asc_order(&["b", "c"]));
    assert_eq!(listed(search("e_c")).await, ["d"]);
    let limited = listed(ListQuery {
        limit: Some(3),
        ..ListQuery::default()
    })
    .await;
    assert_eq!(limited, ids(&desc)[..3]);

    // Anchored pages around the fourth session, in both orders and both directions.
    let all = ids(&asc);
    let pivot = &asc[3];
    let anchored = |order, direction, limit| ListQuery {
        order,
        limit,
        anchor: Some(Anchor {
            id: pivot.id.clone(),
            time: pivot.time_created,
            direction,
        }),
        ..ListQuery::default()
    };
    assert_eq!(
        listed(anchored(Order::Asc, Direction::Next, None)).await,
        all[4..]
    );
    assert_eq!(
        listed(anchored(Order::Asc, Direction::Next, Some(2))).await,
        all[4..6]
    );
    assert_eq!(
        listed(anchored(Order::Asc, Direction::Previous, None)).await,
        all[..3]
    );
    assert_eq!(
        listed(anchored(Order::Asc, Direction::Previous, Some(2))).await,
        all[1..3]
    );
    let rev = |s: &[String]| s.iter().rev().cloned().collect::<Vec<_>>();
    assert_eq!(
        listed(anchored(Order::Desc, Direction::Next, None)).await,
        rev(&all[..3])
    );
    assert_eq!(
        listed(anchored(Order::Desc, Direction::Next, Some(2))).await,
        rev(&all[1..3])
    );
    assert_eq!(
        listed(anchored(Order::Desc, Direction::Previous, None)).await,
        rev(&all[4..])
    );
    assert_eq!(
        listed(anchored(Order::Desc, Direction::Previous, Some(2))).await,
        rev(&all[4..6])
    );

    // Paging through everything forward, then back, sees each session once, in order.
    for order in [Order::Asc, Order::Desc] {
        let mut pages = Vec::new();
        let mut anchor: Option<Anchor> = None;
        loop {
            let page = sessions
                .list(ListQuery {
                    order,
                    limit: Some(2),
                    anchor: anchor.clone(),
                    ..ListQuery::default()
                })
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            anchor = Some(Anchor {
                id: last.id.clone(),
                time: last.time_created,
                direction: Direction::Next,
            });
            pages.extend(ids(&page));
        }
        let walked_forward = pages.clone();
        let expected = if order == Order::Asc {
            all.clone()
        } else {
            rev(&all)
        };
        assert_eq!(walked_forward, expected);

        let mut backward: Vec<String> = Vec::new();
        let last = if order == Order::Asc {
            &asc[asc.len() - 1]
        } else {
            &asc[0]
        };
        let mut anchor = Anchor {
            id: last.id.clone(),
            time: last.time_created,
            direction: Direction::Previous,
        };
        loop {
            let page = sessions
                .list(ListQuery {
                    order,
                    limit: Some(2),
                    anchor: Some(anchor.clone()),
                    ..ListQuery::default()
                })
                .await
                .unwrap();
            let Some(first) = page.first() else { break };
            anchor = Anchor {
                id: first.id.clone(),
                time: first.time_created,
                direction: Direction::Previous,
            };
            let mut page_ids = ids(&page);
            page_ids.extend(backward);
            backward = page_ids;
        }
        assert_eq!(backward, expected[..expected.len() - 1]);
    }
    runtime.stop().await;
}

/// `messages` pages the transcript by seq with cursors in both directions and both orders; an
/// unknown cursor (or another session's message) yields `[]`; `message` is `None` for another
/// session's message; an unknown session is `NotFound`.
#[actix_rt::test]
async fn pages_messages_by_seq_with_cursors_in_both_directions() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let other = create(&runtime, "other", None).await;
    let appended = Arc::new(Mutex::new(Vec::new()));
    runner.push(&s, append_script(6, appended.clone()));
    let foreign = Arc::new(Mutex::new(Vec::new()));
    runner.push(&other, append_script(1, foreign.clone()));
    sessions.resume(&s).await.unwrap();
    sessions.resume(&other).await.unwrap();
    let all: Vec<String> = appended
        .lock()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    let foreign = foreign.lock().unwrap()[0].clone();

    let page = |order, limit, cursor: Option<(&str, Direction)>| {
        let sessions = sessions.clone();
        let query = MessagesQuery {
            session_id: sid("s"),
            limit,
            order,
            cursor: cursor.map(|(id, direction)| Cursor {
                id: mid(id),
                direction,
            }),
        };
        async move {
            let page = sessions.messages(query).await.unwrap();
            page.iter().map(|m| m.id.to_string()).collect::<Vec<_>>()
        }
    };
    let rev = |s: &[String]| s.iter().rev().cloned().collect::<Vec<_>>();
    assert_eq!(page(Order::Asc, None, None).await, all);
    assert_eq!(page(Order::Desc, None, None).await, rev(&all));
    assert_eq!(page(Order::Desc, Some(2), None).await, rev(&all[4..]));
    let c = all[2].as_str();
    assert_eq!(
        page(Order::Asc, None, Some((c, Direction::Next))).await,
        all[3..]
    );
    assert_eq!(
        page(Order::Asc, Some(2), Some((c, Direction::Next))).await,
        all[3..5]
    );
    assert_eq!(
        page(Order::Asc, None, Some((c, Direction::Previous))).await,
        all[..2]
    );
    assert_eq!(
        page(Order::Asc, Some(1), Some((c, Direction::Previous))).await,
        all[1..2]
    );
    assert_eq!(
        page(Order::Desc, None, Some((c, Direction::Next))).await,
        rev(&all[..2])
    );
    assert_eq!(
        page(Order::Desc, Some(2), Some((c, Direction::Previous))).await,
        rev(&all[3..5])
    );
    assert_eq!(
        page(Order::Desc, None, Some((c, Direction::Previous))).await,
        rev(&all[3..])
    );
    assert!(page(Order::Asc, None, Some(("nope", Direction::Next)))
        .await
        .is_empty());
    assert!(page(
        Order::Desc,
        None,
        Some((foreign.as_str(), Direction::Previous))
    )
    .await
    .is_empty());

    let seqs: Vec<u64> = sessions
        .messages(MessagesQuery {
            order: Order::Asc,
            ..MessagesQuery::new(s.clone())
        })
        .await
        .unwrap()
        .iter()
        .map(|m| m.seq)
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let own = sessions.message(&s, &mid(&all[0])).await.unwrap().unwrap();
    assert_eq!(
        (own.kind.as_str(), own.data.clone()),
        ("assistant", json!({"text": "reply 0"}))
    );
    assert_eq!(sessions.message(&s, &foreign).await.unwrap(), None);
    assert_eq!(sessions.message(&s, &mid("nope")).await.unwrap(), None);
    assert!(sessions.message(&other, &foreign).await.unwrap().is_some());
    let ghost = sid("ghost");
    assert!(matches!(
        sessions.messages(MessagesQuery::new(ghost.clone())).await,
        Err(Error::NotFound { session_id }) if session_id == ghost
    ));
    runtime.stop().await;
}

/// `context` is the transcript in seq order; a stored message that no longer decodes is
/// `MessageDecode` naming it, from `context`, `messages` and `message` alike.
#[actix_rt::test]
async fn context_returns_the_transcript_and_names_an_undecodable_message() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, text("question")).with_id(mid("p1")))
        .await
        .unwrap();
    let appended = Arc::new(Mutex::new(Vec::new()));
    runner.push(&s, {
        let appended = appended.clone();
        Script::custom(move |turn| {
            let appended = appended.clone();
            async move {
                turn.promote_steer(None).await?;
                let id = turn
                    .append_message("assistant", json!({"text": "answer"}))
                    .await?;
                appended.lock().unwrap().push(id);
                Ok(())
            }
        })
    });
    sessions.resume(&s).await.unwrap();
    let answer = appended.lock().unwrap()[0].clone();

    let context = sessions.context(&s).await.unwrap();
    let shape: Vec<_> = context
        .iter()
        .map(|m| (m.id.to_string(), m.kind.clone()))
        .collect();
    assert_eq!(
        shape,
        [
            ("p1".to_string(), "user".to_string()),
            (answer.to_string(), "assistant".to_string())
        ]
    );
    let asc = sessions
        .messages(MessagesQuery {
            order: Order::Asc,
            ..MessagesQuery::new(s.clone())
        })
        .await
        .unwrap();
    assert_eq!(context, asc);
    assert!(matches!(
        sessions.context(&sid("ghost")).await,
        Err(Error::NotFound { .. })
    ));

    common::execute(
        runtime.path(),
        "UPDATE session_message SET data = '{not json' WHERE id = $1",
        &[answer.as_str()],
    );
    let decode = |r: Result<_, Error>| match r {
        Err(Error::MessageDecode {
            session_id,
            message_id,
        }) => Some((session_id, message_id)),
        _ => None,
    };
    let expected = Some((s.clone(), answer.clone()));
    assert_eq!(decode(sessions.context(&s).await.map(drop)), expected);
    assert_eq!(
        decode(
            sessions
                .messages(MessagesQuery::new(s.clone()))
                .await
                .map(drop)
        ),
        expected
    );
    assert_eq!(
        decode(sessions.message(&s, &answer).await.map(drop)),
        expected
    );
    assert!(sessions.message(&s, &mid("p1")).await.unwrap().is_some());
    runtime.stop().await;
}

/// Steer promotes every pending steer input admitted at or before the cutoff, in admission
/// order, leaving queue inputs; queue promotes only the oldest pending queue input, one per
/// turn. Each promotion commits its event, `promoted_seq` and transcript row together.
#[actix_rt::test]
async fn promotion_follows_delivery_modes_and_cutoffs() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let mut admitted: Vec<Admission> = Vec::new();
    for (id, delivery) in [
        ("s1", Delivery::Steer),
        ("q1", Delivery::Queue),
        ("s2", Delivery::Steer),
        ("q2", Delivery::Queue),
        ("s3", Delivery::Steer),
    ] {
        let input = quiet(&s, text(id)).with_id(mid(id)).with_delivery(delivery);
        admitted.push(sessions.prompt(input).await.unwrap());
    }
    let cutoff = admitted[2].admitted_seq;
    let log: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let record = |log: &Arc<Mutex<Vec<Vec<String>>>>, promoted: Vec<Admission>| {
        log.lock()
            .unwrap()
            .push(promoted.iter().map(|a| a.id.to_string()).collect());
    };
    runner.push(&s, {
        let log = log.clone();
        Script::custom(move |turn| {
            let log = log.clone();
            async move {
                record(&log, turn.promote_steer(Some(cutoff)).await?);
                record(&log, turn.promote_queue().await?.into_iter().collect());
                record(&log, turn.promote_steer(None).await?);
                Ok(())
            }
        })
    });
    runner.push(&s, {
        let log = log.clone();
        Script::custom(move |turn| {
            let log = log.clone();
            async move {
                record(&log, turn.promote_queue().await?.into_iter().collect());
                record(&log, turn.promote_queue().await?.into_iter().collect());
                Ok(())
            }
        })
    });
    sessions.resume(&s).await.unwrap();
    sessions.resume(&s).await.unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            vec!["s1".to_string(), "s2".to_string()],
            vec!["q1".to_string()],
            vec!["s3".to_string()],
            vec!["q2".to_string()],
            vec![],
        ]
    );
    let transcript = sessions
        .messages(MessagesQuery {
            order: Order::Asc,
            ..MessagesQuery::new(s.clone())
        })
        .await
        .unwrap();
    let order: Vec<String> = transcript.iter().map(|m| m.id.to_string()).collect();
    assert_eq!(order, ["s1", "s2", "q1", "s3", "q2"]);
    let promoted = testing::events_of_kind(runtime.path(), &s, kind::PROMPT_PROMOTED).unwrap();
    for (message, event) in transcript.iter().zip(&promoted) {
        assert_eq!(message.seq, event.seq);
        assert_eq!(event.data["messageID"], json!(message.id));
        assert_eq!(message.data, json!({ "prompt": text(message.id.as_str()) }));
    }
    assert_eq!(
        count(
            runtime.path(),
            "SELECT COUNT(*) FROM session_input WHERE promoted_seq IS NULL"
        ),
        0
    );
    runtime.stop().await;
}

/// A runner appends assistant messages and publishes its own events; both are on the durable
/// log in order and reach a live event stream. Runtime event names are refused.
#[actix_rt::test]
async fn a_runner_appends_messages_and_publishes_its_own_events() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let mut stream = sessions.events(&s, Some(0)).await.unwrap();
    let refused = Arc::new(Mutex::new(None));
    runner.push(&s, {
        let refused = refused.clone();
        Script::custom(move |turn| {
            let refused = refused.clone();
            async move {
                turn.publish("agent.step", json!({"n": 1})).await?;
                turn.append_message("assistant", json!({"text": "done"}))
                    .await?;
                *refused.lock().unwrap() = Some(
                    turn.publish(kind::PROMPT_ADMITTED, json!({}))
                        .await
                        .is_err(),
                );
                Ok(())
            }
        })
    });
    sessions.resume(&s).await.unwrap();
    assert_eq!(*refused.lock().unwrap(), Some(true));
    let mut kinds = Vec::new();
    for _ in 0..4 {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        kinds.push((event.seq, event.kind.clone()));
    }
    assert_eq!(
        kinds,
        vec![
            (1, kind::EXECUTION_STARTED.to_string()),
            (2, "agent.step".to_string()),
            (3, kind::MESSAGE_APPENDED.to_string()),
            (4, kind::EXECUTION_SUCCEEDED.to_string()),
        ]
    );
    assert_eq!(sessions.context(&s).await.unwrap().len(), 1);
    runtime.stop().await;
}

/// A subscriber that starts while two tasks publish to the session (prompts, and a turn
/// publishing its own events) sees every seq after `after` exactly once, in order, with no gap
/// at the switch from replay to live, up to the last one.
#[actix_rt::test]
async fn events_replay_then_follow_live_under_concurrent_publishing() {
    const PROMPTS: usize = 150;
    const CUSTOM: usize = 150;
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    for i in 0..5 {
        sessions
            .prompt(quiet(&s, text(&format!("early {i}"))))
            .await
            .unwrap();
    }
    let gate = Gate::new();
    runner.push(&s, {
        let gate = gate.clone();
        Script::custom(move |turn| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                for i in 0..CUSTOM {
                    turn.publish("agent.step", json!({ "i": i })).await?;
                }
                Ok(())
            }
        })
    });
    let turn = actix_rt::spawn({
        let (sessions, s) = (sessions.clone(), s.clone());
        async move { sessions.resume(&s).await }
    });
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    let prompts = actix_rt::spawn({
        let (sessions, s) = (sessions.clone(), s.clone());
        async move {
            for i in 0..PROMPTS {
                sessions
                    .prompt(quiet(&s, text(&format!("p{i}"))))
                    .await
                    .unwrap();
            }
        }
    });
    gate.release();
    // Start reading while both publishers are under way.
    actix_rt::time::sleep(Duration::from_millis(5)).await;
    let after = 3;
    let mut stream = sessions.events(&s, Some(after)).await.unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    let seq = |item: Option<Result<Arc<durable_sessions::EventRecord>, Error>>| {
        item.expect("the stream goes on")
            .expect("the read succeeds")
            .seq
    };
    // Read while the publishers are under way, until both are done...
    let mut publishers = Box::pin(async { (prompts.await, turn.await) });
    let (prompted, terminal) = loop {
        let next = Box::pin(tokio::time::timeout_at(deadline, stream.next()));
        match futures::future::select(next, publishers.as_mut()).await {
            Either::Left((Ok(item), _)) => seen.push(seq(item)),
            Either::Left((Err(_), _)) => panic!("stalled after {seen:?}"),
            Either::Right((done, _)) => break done,
        }
    };
    // ...then on up to the last event they stored.
    let last = testing::events(runtime.path(), &s)
        .unwrap()
        .last()
        .map(|e| e.seq)
        .expect("the session has events");
    while seen.last() != Some(&last) {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(item) => seen.push(seq(item)),
            Err(_) => panic!("stalled after {seen:?}"),
        }
    }
    prompted.unwrap();
    assert_eq!(terminal.unwrap().unwrap(), Terminal::Succeeded);
    // created + 5 early prompts + started + CUSTOM + PROMPTS + succeeded.
    assert_eq!(last as usize, 1 + 5 + 1 + CUSTOM + PROMPTS + 1 - 1);
    let expected: Vec<u64> = (after + 1..=last).collect();
    assert_eq!(seen, expected);
    runtime.stop().await;
}

/// With a tiny bus, a subscriber that does not read while 300 events commit lags behind the
/// bus (the runtime does not wait for it), then heals from the store: it still sees every
/// event exactly once, in order, and then follows live.
#[actix_rt::test]
async fn a_lagging_subscriber_sees_every_event_once_through_the_self_heal() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| {
        b.config(RuntimeConfig {
            arbiters: 2,
            sweep_on_start: false,
            shutdown_grace: Duration::from_secs(2),
            bus_capacity: 4,
            ..RuntimeConfig::default()
        })
    })
    .start(&runner)
    .await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let mut stream = sessions.events(&s, None).await.unwrap();
    assert_eq!(next_seq(&mut stream).await, 0);

    for i in 0..300 {
        sessions
            .prompt(quiet(&s, text(&format!("p{i}"))))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..300 {
        seen.push(next_seq(&mut stream).await);
    }
    assert_eq!(seen, (1..=300).collect::<Vec<u64>>());
    assert!(stream.heals() >= 1, "the subscriber should have lagged");
    assert_eq!(stream.last_seq(), Some(300));

    // And it follows live afterwards, through the `Stream` interface too.
    sessions.prompt(quiet(&s, text("live"))).await.unwrap();
    let live = tokio::time::timeout(WAIT, StreamExt::next(&mut stream))
        .await
        .unwrap();
    assert_eq!(live.unwrap().unwrap().seq, 301);
    runtime.stop().await;
}

/// An interrupt fences by seq: a wake for a prompt admitted before it never drains (also after
/// a restart, the fence is durable), while a prompt admitted after it drains with its own seq.
#[actix_rt::test]
async fn interrupt_fences_prompts_admitted_before_it_but_not_after() {
    let runner = ScriptedRunner::new();
    let mut runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;

    let before = sessions.prompt(quiet(&s, text("before"))).await.unwrap();
    assert!(
        !sessions.interrupt(&s).await.unwrap(),
        "nothing was running"
    );
    let fence = testing::events_of_kind(runtime.path(), &s, kind::INTERRUPT_REQUESTED).unwrap();
    assert_eq!(fence.len(), 1);
    assert!(fence[0].seq > before.admitted_seq);

    runtime
        .execution()
        .wake(&s, Some(before.admitted_seq))
        .await
        .unwrap();
    assert!(sessions.active().is_empty());
    actix_rt::time::sleep(Duration::from_millis(50)).await;
    assert!(runner.drains().is_empty());

    let after = sessions
        .prompt(PromptInput::new(s.clone(), text("after")))
        .await
        .unwrap();
    assert!(after.admitted_seq > fence[0].seq);
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    sessions.await_idle(&s).await.unwrap();
    let wake = |seq| DrainRecord {
        session_id: s.clone(),
        forced: false,
        wake_seq: Some(seq),
    };
    assert_eq!(runner.drains(), vec![wake(after.admitted_seq)]);
    runtime.stop().await;

    // A new process loads the fence from the store.
    let runner = ScriptedRunner::new();
    runtime.restart(&runner, |b| b).await;
    runtime
        .execution()
        .wake(&s, Some(before.admitted_seq))
        .await
        .unwrap();
    assert!(runtime.execution().active().is_empty());
    runtime
        .execution()
        .wake(&s, Some(after.admitted_seq))
        .await
        .unwrap();
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    runtime.execution().await_idle(&s).await.unwrap();
    assert_eq!(runner.drains(), vec![wake(after.admitted_seq)]);
    runtime.stop().await;
}

/// `switch_model`, `resume` and `await_idle` check the session first; `switch_model` publishes
/// `session.model.switched` with a fresh message id; `await_idle` waits for the running turn.
#[actix_rt::test]
async fn execution_controls_require_the_session() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    let ghost = sid("ghost");
    let not_found = |r: Result<(), Error>| matches!(r, Err(Error::NotFound { session_id }) if session_id.as_str() == "ghost");

    let model = json!({"id": "m2", "providerID": "p"});
    let switched = sessions.switch_model(&s, model.clone()).await.unwrap();
    assert_eq!(switched.kind, kind::MODEL_SWITCHED);
    assert_eq!(switched.data["model"], model);
    assert_eq!(switched.data["sessionID"], json!("s"));
    assert!(switched.data["messageID"]
        .as_str()
        .unwrap()
        .starts_with("msg_"));
    assert_eq!(
        testing::events_of_kind(runtime.path(), &s, kind::MODEL_SWITCHED).unwrap(),
        vec![switched]
    );
    assert!(not_found(
        sessions.switch_model(&ghost, model).await.map(drop)
    ));
    assert!(not_found(sessions.resume(&ghost).await.map(drop)));
    assert!(not_found(sessions.await_idle(&ghost).await));
    assert!(not_found(sessions.events(&ghost, None).await.map(drop)));
    assert!(not_found(
        sessions
            .prompt(PromptInput::new(ghost.clone(), text("x")))
            .await
            .map(drop)
    ));
    assert!(testing::events(runtime.path(), &ghost).unwrap().is_empty());

    let gate = Gate::new();
    runner.push(&s, Script::Gate(gate.clone()));
    sessions
        .prompt(PromptInput::new(s.clone(), text("go")))
        .await
        .unwrap();
    let idle = actix_rt::spawn({
        let (sessions, s) = (sessions.clone(), s.clone());
        async move { sessions.await_idle(&s).await }
    });
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    actix_rt::time::sleep(Duration::from_millis(20)).await;
    assert!(!idle.is_finished());
    gate.release();
    idle.await.unwrap().unwrap();
    assert!(sessions.active().is_empty());
    sessions.await_idle(&s).await.unwrap();
    runtime.stop().await;
}

/// Every invalid input is `InvalidInput` and writes nothing: bad ids, prompts of the wrong
/// shape, too large or too deep, out-of-range limits, bad search/directory/agent/model/title.
#[actix_rt::test]
async fn rejects_invalid_input_and_writes_nothing() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::with(|b| b.max_prompt_bytes(256))
        .start(&runner)
        .await;
    let sessions: Sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    sessions
        .prompt(quiet(&s, text("ok")).with_id(mid("ok")))
        .await
        .unwrap();
    let before = row_counts(runtime.path());

    // Ids.
    for bad in [
        String::new(),
        "x".repeat(256),
        "a\nb".into(),
        "tab\there".into(),
    ] {
        assert!(is_invalid(SessionId::new(bad.clone()).map_err(Error::from)));
        assert!(is_invalid(MessageId::new(bad.clone()).map_err(Error::from)));
        let from_json = serde_json::from_value::<PromptInput>(json!({
            "session_id": "s", "id": bad, "prompt": "hi"
        }));
        assert!(from_json.is_err());
    }
    assert!(
        serde_json::from_value::<PromptInput>(json!({"session_id": "", "prompt": "x"})).is_err()
    );
    let parsed: PromptInput =
        serde_json::from_value(json!({"session_id": "s", "prompt": "x"})).unwrap();
    assert_eq!(
        (parsed.delivery, parsed.resume, parsed.id),
        (Delivery::Steer, true, None)
    );

    // Prompts: shape, size (serialized JSON bytes), depth.
    for bad in [json!(null), json!(42), json!(true), json!(["a"])] {
        assert!(is_invalid(
            sessions.prompt(PromptInput::new(s.clone(), bad)).await
        ));
    }
    let big = json!({ "text": "x".repeat(300) });
    assert!(is_invalid(
        sessions.prompt(PromptInput::new(s.clone(), big)).await
    ));
    let fits = json!("y".repeat(254));
    assert_eq!(serde_json::to_string(&fits).unwrap().len(), 256);
    let mut deep = json!("leaf");
    for _ in 0..80 {
        deep = json!({ "n": deep });
    }
    assert!(is_invalid(
        sessions.prompt(PromptInput::new(s.clone(), deep)).await
    ));
    // Invalid input wins over a missing session and over a conflicting id.
    assert!(is_invalid(
        sessions
            .prompt(PromptInput::new(sid("ghost"), json!(1)))
            .await
    ));
    assert!(is_invalid(
        sessions
            .prompt(PromptInput::new(s.clone(), json!(1)).with_id(mid("ok")))
            .await
    ));

    // Limits and filters.
    for limit in [0, 1001] {
        let list = ListQuery {
            limit: Some(limit),
            ..ListQuery::default()
        };
        assert!(is_invalid(sessions.list(list).await));
        let messages = MessagesQuery {
            limit: Some(limit),
            ..MessagesQuery::new(s.clone())
        };
        assert!(is_invalid(sessions.messages(messages).await));
    }
    assert!(sessions
        .list(ListQuery {
            limit: Some(1000),
            ..ListQuery::default()
        })
        .await
        .is_ok());
    let search = ListQuery {
        search: Some("a\u{0}b".into()),
        ..ListQuery::default()
    };
    assert!(is_invalid(sessions.list(search).await));
    let long_search = ListQuery {
        search: Some("s".repeat(2000)),
        ..ListQuery::default()
    };
    assert!(is_invalid(sessions.list(long_search).await));

    // Create and switch_model.
    let bad_creates = [
        CreateSession {
            directory: "/a\nb".into(),
            ..CreateSession::default()
        },
        CreateSession {
            directory: "d".repeat(5000),
            ..CreateSession::default()
        },
        CreateSession {
            title: Some("t".repeat(2000)),
            ..CreateSession::default()
        },
        CreateSession {
            agent: Some(String::new()),
            ..CreateSession::default()
        },
        CreateSession {
            agent: Some("a\u{7}".into()),
            ..CreateSession::default()
        },
        CreateSession {
            model: Some(json!(7)),
            ..CreateSession::default()
        },
        CreateSession {
            model: Some(json!({"id": "m".repeat(20_000)})),
            ..CreateSession::default()
        },
    ];
    for input in bad_creates {
        assert!(
            is_invalid(sessions.create(input.clone()).await),
            "{input:?}"
        );
    }
    assert!(is_invalid(sessions.switch_model(&s, json!([1])).await));
    assert!(is_invalid(
        sessions.switch_model(&sid("ghost"), json!(null)).await
    ));

    assert_eq!(row_counts(runtime.path()), before);
    // The prompt that fits the limit exactly is accepted.
    sessions.prompt(quiet(&s, fits)).await.unwrap();
    assert_eq!(row_counts(runtime.path())[1], before[1] + 1);
    runtime.stop().await;
}

/// After the runtime shuts down, an event stream yields what was committed (including the
/// shutdown interruption of a running turn) and then ends.
#[actix_rt::test]
async fn an_event_stream_ends_after_shutdown() {
    let runner = ScriptedRunner::new();
    let runtime = Harness::start(&runner).await;
    let sessions = runtime.sessions();
    let s = create(&runtime, "s", None).await;
    runner.push(&s, Script::Never);
    let mut stream = sessions.events(&s, Some(0)).await.unwrap();
    sessions
        .prompt(PromptInput::new(s.clone(), text("go")))
        .await
        .unwrap();
    runner.wait_for_drains_of(&s, 1, WAIT).await;
    runtime.stop().await;

    let mut kinds = Vec::new();
    while let Some(item) = tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        kinds.push(item.unwrap().kind.clone());
    }
    assert_eq!(
        kinds,
        [
            kind::PROMPT_ADMITTED,
            kind::EXECUTION_STARTED,
            kind::EXECUTION_INTERRUPTED
        ]
    );
    assert!(stream.next().await.is_none());
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_session_service_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_session_service_suite");
}
