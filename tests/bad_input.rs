//! Bad input, table-driven: every malformed input to the session service —
//! invalid ids (empty, 256 bytes, control characters), oversized or wrongly shaped prompts,
//! JSON nested too deep, wrong delivery strings, unknown sessions, absurd paging values,
//! conflicting prompt ids — is answered with a typed error (`InvalidInput` naming the field,
//! `NotFound`, `PromptConflict`) or, where the contract says so, an empty answer; and the same
//! through the HTTP adapter (when the `http` feature is on) with the matching 4xx and JSON error
//! type, including malformed JSON bodies, bad query strings and an invalid `Last-Event-ID`.
//! After every case the row counts of `session`, `session_input`, `session_message` and `event`
//! are unchanged: a rejected input writes nothing.

mod common;

use durable_sessions::{
    CreateSession, Cursor, Delivery, Direction, Error, InvalidId, ListQuery, MessageId,
    MessagesQuery, PromptInput, SessionId, Sessions,
};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use common::{mid, sid, EchoOptions, EchoRunner, Harness, StoreView};

/// The prompt size limit of these tests' runtime.
const MAX_PROMPT: usize = 4096;

/// How a case was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// `Error::InvalidInput` for this field.
    Invalid(&'static str),
    /// `Error::NotFound`.
    NotFound,
    /// `Error::PromptConflict`.
    Conflict,
    /// A successful answer that carries nothing (an empty page, `None`, `false`).
    Nothing,
    /// Anything else (always a failure of the case).
    Other(String),
}

fn got<T: std::fmt::Debug>(result: Result<T, Error>, empty: impl FnOnce(&T) -> bool) -> Got {
    match result {
        Err(Error::InvalidInput { field, .. }) => Got::Invalid(field),
        Err(Error::NotFound { .. }) => Got::NotFound,
        Err(Error::PromptConflict { .. }) => Got::Conflict,
        Ok(value) if empty(&value) => Got::Nothing,
        other => Got::Other(format!("{other:?}")),
    }
}

/// A value `depth` arrays deep inside an object.
fn nested(depth: usize) -> Value {
    let mut value = json!(0);
    for _ in 1..depth {
        value = Value::Array(vec![value]);
    }
    json!({ "deep": value })
}

/// A runtime with sessions `a` (two answered prompts) and `b` (one), no claim left.
async fn setup() -> Harness {
    let runner = EchoRunner::new(EchoOptions::default());
    let runtime = Harness::with(|b| b.sweep_on_start(true).max_prompt_bytes(MAX_PROMPT))
        .start(&runner)
        .await;
    let sessions = runtime.sessions();
    for (session, prompts) in [("a", &["a1", "a2"][..]), ("b", &["b1"][..])] {
        sessions
            .create(CreateSession {
                id: Some(sid(session)),
                directory: "/bad".into(),
                ..CreateSession::default()
            })
            .await
            .unwrap();
        for id in prompts {
            sessions
                .prompt(PromptInput::new(sid(session), json!({ "text": id })).with_id(mid(id)))
                .await
                .unwrap();
        }
        runtime.execution().await_idle(&sid(session)).await.unwrap();
    }
    let view = StoreView::read(runtime.path());
    view.assert_invariants(10, "setup");
    assert_eq!(view.messages.len(), 6, "three prompts, three replies");
    runtime
}

type Case<'a> = (&'static str, Got, LocalBoxFuture<'a, Got>);

/// The service-level cases.
fn service_cases(sessions: &Sessions) -> Vec<Case<'_>> {
    let s = sessions;
    let a = sid("a");
    let ghost = sid("ghost");
    let long = "x".repeat(256);
    let b_message = s.clone();
    let other_message = async move {
        // A message of session `b` through session `a`: `None`.
        let page = b_message
            .messages(MessagesQuery::new(sid("b")))
            .await
            .unwrap();
        let id = page[0].id.clone();
        got(b_message.message(&sid("a"), &id).await, Option::is_none)
    };
    let cursor_of_b = s.clone();
    let foreign_cursor = async move {
        let page = cursor_of_b
            .messages(MessagesQuery::new(sid("b")))
            .await
            .unwrap();
        let query = MessagesQuery {
            cursor: Some(Cursor {
                id: page[0].id.clone(),
                direction: Direction::Next,
            }),
            ..MessagesQuery::new(sid("a"))
        };
        got(cursor_of_b.messages(query).await, Vec::is_empty)
    };
    let transcript_id = s.clone();
    let reused_reply_id = async move {
        // The id of an assistant reply already in `a`'s transcript.
        let page = transcript_id
            .messages(MessagesQuery::new(sid("a")))
            .await
            .unwrap();
        let reply = page.iter().find(|m| m.kind == "assistant").unwrap();
        let input = PromptInput::new(sid("a"), json!("hi")).with_id(reply.id.clone());
        got(transcript_id.prompt(input).await, |_| false)
    };
    let create = |input: CreateSession| {
        let s = s.clone();
        async move { got(s.create(input).await, |_| false) }.boxed_local()
    };
    let dir = |directory: &str| CreateSession {
        directory: directory.into(),
        ..CreateSession::default()
    };
    let prompt = |input: PromptInput| {
        let s = s.clone();
        async move { got(s.prompt(input).await, |_| false) }.boxed_local()
    };
    let list = |query: ListQuery| {
        let s = s.clone();
        async move { got(s.list(query).await, |_| false) }.boxed_local()
    };
    let messages = |query: MessagesQuery| {
        let s = s.clone();
        async move { got(s.messages(query).await, |_| false) }.boxed_local()
    };
    let ready = |g: Got| async move { g }.boxed_local();
    let id_error = |r: Result<SessionId, InvalidId>| got(r.map_err(Error::from), |_| false);
    let message_id_error = |r: Result<MessageId, InvalidId>| got(r.map_err(Error::from), |_| false);
    vec![
        // Ids are validated where they are made.
        (
            "empty session id",
            Got::Invalid("session_id"),
            ready(id_error(SessionId::new(""))),
        ),
        (
            "256-byte session id",
            Got::Invalid("session_id"),
            ready(id_error(SessionId::new(long.clone()))),
        ),
        (
            "session id with a newline",
            Got::Invalid("session_id"),
            ready(id_error(SessionId::new("a\nb"))),
        ),
        (
            "session id with NUL",
            Got::Invalid("session_id"),
            ready(id_error(SessionId::new("a\0b"))),
        ),
        (
            "session id with DEL",
            Got::Invalid("session_id"),
            ready(id_error(SessionId::new("a\u{7f}"))),
        ),
        (
            "empty message id",
            Got::Invalid("message_id"),
            ready(message_id_error(MessageId::new(""))),
        ),
        (
            "256-byte message id",
            Got::Invalid("message_id"),
            ready(message_id_error(MessageId::new(long))),
        ),
        (
            "message id with a tab",
            Got::Invalid("message_id"),
            ready(message_id_error(MessageId::new("m\t1"))),
        ),
        (
            "delivery `later`",
            Got::Invalid("delivery"),
            ready(got("later".parse::<Delivery>(), |_| false)),
        ),
        (
            "delivery `Steer` (case matters)",
            Got::Invalid("delivery"),
            ready(got("Steer".parse::<Delivery>(), |_| false)),
        ),
        // Prompts.
        (
            "prompt to an unknown session",
            Got::NotFound,
            prompt(PromptInput::new(ghost.clone(), json!("hi"))),
        ),
        (
            "prompt one byte over max_prompt_bytes",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(
                a.clone(),
                json!("x".repeat(MAX_PROMPT - 1)),
            )),
        ),
        (
            "prompt of 1 MiB",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(
                a.clone(),
                json!({"t": "x".repeat(1 << 20)}),
            )),
        ),
        (
            "prompt null",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), json!(null))),
        ),
        (
            "prompt number",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), json!(42))),
        ),
        (
            "prompt boolean",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), json!(true))),
        ),
        (
            "prompt array",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), json!(["hi"]))),
        ),
        (
            "prompt nested 65 deep",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), nested(65))),
        ),
        (
            "prompt nested 200 deep",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(a.clone(), nested(200))),
        ),
        (
            "invalid prompt to an unknown session",
            Got::Invalid("prompt"),
            prompt(PromptInput::new(ghost.clone(), json!(1))),
        ),
        (
            "prompt id reused with another body",
            Got::Conflict,
            prompt(PromptInput::new(a.clone(), json!({"text": "not a1"})).with_id(mid("a1"))),
        ),
        (
            "prompt id reused with another delivery",
            Got::Conflict,
            prompt(
                PromptInput::new(a.clone(), json!({"text": "a1"}))
                    .with_id(mid("a1"))
                    .with_delivery(Delivery::Queue),
            ),
        ),
        (
            "prompt id already in the transcript",
            Got::Conflict,
            reused_reply_id.boxed_local(),
        ),
        (
            "prompt id reused in another session",
            Got::Conflict,
            prompt(PromptInput::new(sid("b"), json!({"text": "a1"})).with_id(mid("a1"))),
        ),
        // Sessions.
        (
            "title over 1024 bytes",
            Got::Invalid("title"),
            create(CreateSession {
                title: Some("t".repeat(1025)),
                ..dir("/bad")
            }),
        ),
        (
            "directory with a control character",
            Got::Invalid("directory"),
            create(dir("/bad\u{1b}[2J")),
        ),
        (
            "directory over 4096 bytes",
            Got::Invalid("directory"),
            create(dir(&"d".repeat(4097))),
        ),
        (
            "empty agent",
            Got::Invalid("agent"),
            create(CreateSession {
                agent: Some(String::new()),
                ..dir("/bad")
            }),
        ),
        (
            "agent with a newline",
            Got::Invalid("agent"),
            create(CreateSession {
                agent: Some("x\ny".into()),
                ..dir("/bad")
            }),
        ),
        (
            "model that is a number",
            Got::Invalid("model"),
            create(CreateSession {
                model: Some(json!(3)),
                ..dir("/bad")
            }),
        ),
        (
            "model over 16 KiB",
            Got::Invalid("model"),
            create(CreateSession {
                model: Some(json!("m".repeat(17 * 1024))),
                ..dir("/bad")
            }),
        ),
        (
            "unknown parent",
            Got::NotFound,
            create(CreateSession {
                parent_id: Some(ghost.clone()),
                ..dir("/bad")
            }),
        ),
        ("get an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.get(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        // Paging.
        (
            "list limit 0",
            Got::Invalid("limit"),
            list(ListQuery {
                limit: Some(0),
                ..ListQuery::default()
            }),
        ),
        (
            "list limit 10^9",
            Got::Invalid("limit"),
            list(ListQuery {
                limit: Some(1_000_000_000),
                ..ListQuery::default()
            }),
        ),
        (
            "list limit usize::MAX",
            Got::Invalid("limit"),
            list(ListQuery {
                limit: Some(usize::MAX),
                ..ListQuery::default()
            }),
        ),
        (
            "list search with a control character",
            Got::Invalid("search"),
            list(ListQuery {
                search: Some("a\u{0}".into()),
                ..ListQuery::default()
            }),
        ),
        (
            "list search over 1024 bytes",
            Got::Invalid("search"),
            list(ListQuery {
                search: Some("s".repeat(1025)),
                ..ListQuery::default()
            }),
        ),
        (
            "list directory with a control character",
            Got::Invalid("directory"),
            list(ListQuery {
                directory: Some("\r".into()),
                ..ListQuery::default()
            }),
        ),
        (
            "messages limit 0",
            Got::Invalid("limit"),
            messages(MessagesQuery {
                limit: Some(0),
                ..MessagesQuery::new(a.clone())
            }),
        ),
        (
            "messages limit 10^9",
            Got::Invalid("limit"),
            messages(MessagesQuery {
                limit: Some(1_000_000_000),
                ..MessagesQuery::new(a)
            }),
        ),
        (
            "messages of an unknown session",
            Got::NotFound,
            messages(MessagesQuery::new(ghost)),
        ),
        ("messages after an unknown cursor", Got::Nothing, {
            let s = s.clone();
            async move {
                let query = MessagesQuery {
                    cursor: Some(Cursor {
                        id: mid("nope"),
                        direction: Direction::Previous,
                    }),
                    ..MessagesQuery::new(sid("a"))
                };
                got(s.messages(query).await, Vec::is_empty)
            }
            .boxed_local()
        }),
        (
            "messages after another session's message",
            Got::Nothing,
            foreign_cursor.boxed_local(),
        ),
        (
            "another session's message",
            Got::Nothing,
            other_message.boxed_local(),
        ),
        // Everything else that names a session.
        ("context of an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.context(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        ("events of an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.events(&sid("ghost"), Some(3)).await.map(drop), |_| false) }
                .boxed_local()
        }),
        ("resume an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.resume(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        ("await_idle on an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.await_idle(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        ("switch_model of an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.switch_model(&sid("ghost"), json!("m")).await, |_| false) }
                .boxed_local()
        }),
        ("switch_model to an array", Got::Invalid("model"), {
            let s = s.clone();
            async move { got(s.switch_model(&sid("a"), json!(["m"])).await, |_| false) }
                .boxed_local()
        }),
        ("reproject an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.reproject(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        ("interrupt an unknown session", Got::Nothing, {
            let s = s.clone();
            async move { got(s.interrupt(&sid("ghost")).await, |hit| !hit) }.boxed_local()
        }),
        ("execution resume of an unknown session", Got::NotFound, {
            let s = s.clone();
            async move { got(s.execution().resume(&sid("ghost")).await, |_| false) }.boxed_local()
        }),
        ("execution wake of an unknown session", Got::Nothing, {
            let s = s.clone();
            async move { got(s.execution().wake(&sid("ghost"), Some(7)).await, |_| true) }
                .boxed_local()
        }),
    ]
}

/// At least 50 malformed inputs to `Sessions` (and the ids, delivery and execution calls it
/// takes): each is answered with the typed error it names — or the documented empty answer —
/// and leaves the four tables' row counts unchanged.
#[actix_rt::test]
async fn malformed_service_inputs_get_typed_errors_and_write_nothing() {
    let runtime = setup().await;
    let sessions = runtime.sessions();
    let cases = service_cases(&sessions);
    assert!(cases.len() >= 50, "{} cases", cases.len());
    let mut failures = Vec::new();
    let count = cases.len();
    for (name, expected, case) in cases {
        let before = StoreView::read(runtime.path()).counts();
        let answer = case.await;
        let after = StoreView::read(runtime.path()).counts();
        if answer != expected {
            failures.push(format!("{name}: expected {expected:?}, got {answer:?}"));
        }
        if after != before {
            failures.push(format!("{name}: row counts {before:?} -> {after:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    StoreView::read(runtime.path()).assert_invariants(10, "after the bad inputs");
    eprintln!("{count} malformed service inputs answered typed, nothing written");
    runtime.stop().await;
}

/// JSON that a client would send into the service types (`PromptInput`, `CreateSession`,
/// `MessagesQuery`, `ListQuery`) is refused at decoding when an id, the delivery or a paging
/// value is invalid: such a value can never reach the service.
#[test]
fn malformed_json_never_decodes_into_service_inputs() {
    let cases: &[(&str, Value)] = &[
        (
            "empty session id",
            json!({"session_id": "", "prompt": "hi"}),
        ),
        (
            "session id with a control character",
            json!({"session_id": "a\u{1}", "prompt": "hi"}),
        ),
        (
            "256-byte message id",
            json!({"session_id": "a", "id": "m".repeat(256), "prompt": "hi"}),
        ),
        (
            "delivery `later`",
            json!({"session_id": "a", "prompt": "hi", "delivery": "later"}),
        ),
        (
            "resume as a string",
            json!({"session_id": "a", "prompt": "hi", "resume": "yes"}),
        ),
        ("no session id", json!({"prompt": "hi"})),
        ("no prompt", json!({"session_id": "a"})),
    ];
    for (name, value) in cases {
        assert!(
            serde_json::from_value::<PromptInput>(value.clone()).is_err(),
            "PromptInput accepted {name}"
        );
    }
    assert!(serde_json::from_value::<CreateSession>(json!({"directory": "/", "id": ""})).is_err());
    assert!(serde_json::from_value::<CreateSession>(json!({"directory": 7})).is_err());
    assert!(
        serde_json::from_value::<MessagesQuery>(json!({"session_id": "a", "limit": -1})).is_err()
    );
    assert!(
        serde_json::from_value::<MessagesQuery>(json!({"session_id": "a", "order": "up"})).is_err()
    );
    assert!(serde_json::from_value::<ListQuery>(json!({"limit": "ten"})).is_err());
    assert!(serde_json::from_value::<ListQuery>(json!({"anchor": {"id": "", "time": 1}})).is_err());
    assert!(serde_json::from_str::<PromptInput>("{\"session_id\": \"a\", \"prompt\": ").is_err());
}

#[cfg(feature = "http")]
mod http {
    //! The same through the HTTP adapter, in-process (`actix_web::test`).

    use actix_web::http::{Method, StatusCode};
    use actix_web::{test, web, App};
    use durable_sessions::http::{self, HttpOptions};
    use serde_json::Value;

    use super::{setup, MAX_PROMPT};
    use crate::common::StoreView;

    /// One HTTP case: method, path, `Last-Event-ID`, body, expected status and error type.
    struct Case {
        name: &'static str,
        method: Method,
        path: String,
        last_event_id: Option<&'static str>,
        body: Option<Vec<u8>>,
        status: u16,
        kind: &'static str,
    }

    fn case(
        name: &'static str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        status: u16,
        kind: &'static str,
    ) -> Case {
        Case {
            name,
            method,
            path: path.into(),
            last_event_id: None,
            body,
            status,
            kind,
        }
    }

    fn post(name: &'static str, path: &str, body: &str, status: u16, kind: &'static str) -> Case {
        case(
            name,
            Method::POST,
            path,
            Some(body.as_bytes().to_vec()),
            status,
            kind,
        )
    }

    fn get(name: &'static str, path: &str, status: u16, kind: &'static str) -> Case {
        case(name, Method::GET, path, None, status, kind)
    }

    fn events(name: &'static str, last_event_id: &'static str) -> Case {
        Case {
            last_event_id: Some(last_event_id),
            ..get(name, "/sessions/a/events", 400, "invalid_input")
        }
    }

    fn cases() -> Vec<Case> {
        let long = "x".repeat(256);
        let deep_body = format!(
            "{{\"model\": {}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let deep_prompt = {
            let mut prompt = "0".to_string();
            for _ in 0..100 {
                prompt = format!("[{prompt}]");
            }
            format!("{{\"prompt\": {{\"deep\": {prompt}}}}}")
        };
        vec![
            post("malformed JSON", "/sessions", "{", 400, "malformed_json"),
            post(
                "JSON with a trailing comma",
                "/sessions",
                "{\"id\": \"n\",}",
                400,
                "malformed_json",
            ),
            case(
                "not UTF-8",
                Method::POST,
                "/sessions",
                Some(vec![0xff, 0xfe, b'{']),
                400,
                "malformed_json",
            ),
            post(
                "JSON nested 10,000 deep",
                "/sessions",
                &deep_body,
                400,
                "malformed_json",
            ),
            post("a JSON array", "/sessions", "[]", 400, "invalid_input"),
            post(
                "empty id",
                "/sessions",
                "{\"id\": \"\"}",
                400,
                "invalid_input",
            ),
            post(
                "256-byte id",
                "/sessions",
                &format!("{{\"id\": \"{long}\"}}"),
                400,
                "invalid_input",
            ),
            post(
                "id with a control character",
                "/sessions",
                "{\"id\": \"a\\u0001b\"}",
                400,
                "invalid_input",
            ),
            post(
                "unknown field",
                "/sessions",
                "{\"colour\": \"red\"}",
                400,
                "invalid_input",
            ),
            post(
                "title that is a number",
                "/sessions",
                "{\"title\": 5}",
                400,
                "invalid_input",
            ),
            post(
                "directory with a control character",
                "/sessions",
                "{\"directory\": \"/\\u001b\"}",
                400,
                "invalid_input",
            ),
            post(
                "model that is a number",
                "/sessions",
                "{\"model\": 1}",
                400,
                "invalid_input",
            ),
            post(
                "unknown parent",
                "/sessions",
                "{\"parent_id\": \"ghost\"}",
                404,
                "not_found",
            ),
            post(
                "prompt to an unknown session",
                "/sessions/ghost/prompt",
                "{\"text\": \"hi\"}",
                404,
                "not_found",
            ),
            post(
                "prompt without text",
                "/sessions/a/prompt",
                "{}",
                400,
                "invalid_input",
            ),
            post(
                "prompt with text and prompt",
                "/sessions/a/prompt",
                "{\"text\": \"a\", \"prompt\": \"b\"}",
                400,
                "invalid_input",
            ),
            post(
                "delivery `later`",
                "/sessions/a/prompt",
                "{\"text\": \"x\", \"delivery\": \"later\"}",
                400,
                "invalid_input",
            ),
            post(
                "resume `yes`",
                "/sessions/a/prompt",
                "{\"text\": \"x\", \"resume\": \"yes\"}",
                400,
                "invalid_input",
            ),
            post(
                "prompt that is a number",
                "/sessions/a/prompt",
                "{\"prompt\": 42}",
                400,
                "invalid_input",
            ),
            post(
                "prompt nested 101 deep",
                "/sessions/a/prompt",
                &deep_prompt,
                400,
                "invalid_input",
            ),
            post(
                "prompt over max_prompt_bytes",
                "/sessions/a/prompt",
                &format!("{{\"text\": \"{}\"}}", "x".repeat(MAX_PROMPT)),
                400,
                "invalid_input",
            ),
            post(
                "body over the body limit",
                "/sessions/a/prompt",
                &format!("{{\"text\": \"{}\"}}", "x".repeat(64 * 1024)),
                413,
                "payload_too_large",
            ),
            post(
                "empty prompt id",
                "/sessions/a/prompt",
                "{\"id\": \"\", \"text\": \"x\"}",
                400,
                "invalid_input",
            ),
            post(
                "prompt id reused with another text",
                "/sessions/a/prompt",
                "{\"id\": \"a1\", \"text\": \"other\"}",
                409,
                "conflict",
            ),
            post(
                "prompt id reused in another session",
                "/sessions/b/prompt",
                "{\"id\": \"a1\", \"text\": \"a1\"}",
                409,
                "conflict",
            ),
            post(
                "session id with a control character in the path",
                "/sessions/a%01b/prompt",
                "{\"text\": \"x\"}",
                400,
                "invalid_input",
            ),
            post(
                "256-byte session id in the path",
                &format!("/sessions/{long}/prompt"),
                "{\"text\": \"x\"}",
                400,
                "invalid_input",
            ),
            post(
                "interrupt an unknown session",
                "/sessions/ghost/interrupt",
                "",
                404,
                "not_found",
            ),
            post(
                "resume an unknown session",
                "/sessions/ghost/resume",
                "",
                404,
                "not_found",
            ),
            get("list limit 0", "/sessions?limit=0", 400, "invalid_input"),
            get(
                "list limit 10^9",
                "/sessions?limit=1000000000",
                400,
                "invalid_input",
            ),
            get("list limit -1", "/sessions?limit=-1", 400, "invalid_input"),
            get(
                "list limit 2^64",
                "/sessions?limit=18446744073709551616",
                400,
                "invalid_input",
            ),
            get(
                "list limit `ten`",
                "/sessions?limit=ten",
                400,
                "invalid_input",
            ),
            get(
                "list order `sideways`",
                "/sessions?order=sideways",
                400,
                "invalid_input",
            ),
            get(
                "anchor id without a time",
                "/sessions?anchor_id=a",
                400,
                "invalid_input",
            ),
            get(
                "anchor time not a number",
                "/sessions?anchor_id=a&anchor_time=noon",
                400,
                "invalid_input",
            ),
            get(
                "direction without an anchor",
                "/sessions?direction=next",
                400,
                "invalid_input",
            ),
            get(
                "parent and top_level",
                "/sessions?parent_id=a&top_level=true",
                400,
                "invalid_input",
            ),
            get(
                "search with a control character",
                "/sessions?search=%00",
                400,
                "invalid_input",
            ),
            get("an unknown session", "/sessions/ghost", 404, "not_found"),
            get(
                "messages limit 0",
                "/sessions/a/messages?limit=0",
                400,
                "invalid_input",
            ),
            get(
                "messages limit 10^9",
                "/sessions/a/messages?limit=1000000000",
                400,
                "invalid_input",
            ),
            get(
                "messages direction without a cursor",
                "/sessions/a/messages?direction=previous",
                400,
                "invalid_input",
            ),
            get(
                "messages cursor of 256 bytes",
                &format!("/sessions/a/messages?cursor={long}"),
                400,
                "invalid_input",
            ),
            get(
                "messages of an unknown session",
                "/sessions/ghost/messages",
                404,
                "not_found",
            ),
            get(
                "an unknown message",
                "/sessions/a/messages/nope",
                404,
                "not_found",
            ),
            get(
                "events after -5",
                "/sessions/a/events?after=-5",
                400,
                "invalid_input",
            ),
            get(
                "events of an unknown session",
                "/sessions/ghost/events",
                404,
                "not_found",
            ),
            events("Last-Event-ID `abc`", "abc"),
            events("Last-Event-ID `-1`", "-1"),
            events("Last-Event-ID `1e3`", "1e3"),
            events("Last-Event-ID `0x10`", "0x10"),
            events("Last-Event-ID beyond u64", "18446744073709551616"),
            case(
                "PUT a session",
                Method::PUT,
                "/sessions/a",
                None,
                405,
                "method_not_allowed",
            ),
            get("an unknown route", "/sessionz", 404, "not_found"),
        ]
    }

    /// The bad inputs through HTTP: every one answered with its 4xx and JSON error type, and
    /// no row written.
    #[actix_rt::test]
    async fn malformed_http_requests_get_their_4xx_and_write_nothing() {
        let runtime = setup().await;
        let app = test::init_service(
            App::new()
                .configure(http::configure(
                    runtime.clone(),
                    HttpOptions::new().max_body_bytes(32 * 1024),
                ))
                .default_service(web::to(http::not_found)),
        )
        .await;
        let cases = cases();
        assert!(cases.len() >= 50, "{} cases", cases.len());
        let count = cases.len();
        let mut failures = Vec::new();
        for case in cases {
            let before = StoreView::read(runtime.path()).counts();
            let mut request = test::TestRequest::default()
                .method(case.method.clone())
                .uri(&case.path);
            if let Some(id) = case.last_event_id {
                request = request.insert_header(("Last-Event-ID", id));
            }
            if let Some(body) = &case.body {
                request = request
                    .insert_header(("Content-Type", "application/json"))
                    .set_payload(body.clone());
            }
            let response = test::call_service(&app, request.to_request()).await;
            let status = response.status();
            let body: Value =
                serde_json::from_slice(&test::read_body(response).await).unwrap_or(Value::Null);
            let kind = body["error"]["type"]
                .as_str()
                .unwrap_or("<none>")
                .to_string();
            if status != StatusCode::from_u16(case.status).unwrap() || kind != case.kind {
                failures.push(format!(
                    "{}: expected {} {}, got {status} {body}",
                    case.name, case.status, case.kind
                ));
            }
            let after = StoreView::read(runtime.path()).counts();
            if after != before {
                failures.push(format!("{}: row counts {before:?} -> {after:?}", case.name));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        eprintln!("{count} malformed HTTP requests answered with their 4xx, nothing written");
        runtime.stop().await;
    }
}

/// Every other test of this file, again on PostgreSQL (one fresh database per runtime):
/// [`common::run_suite_on_postgres`].
#[cfg(feature = "testing-postgres")]
#[test]
fn postgres_backend_passes_the_bad_input_suite() {
    common::run_suite_on_postgres("postgres_backend_passes_the_bad_input_suite");
}
