use serde_json::json;

use super::*;

/// The payload of every typed event is byte for byte what the runtime stored before events
/// were typed (`json!` objects, whose keys `serde_json` sorts).
#[test]
fn payloads_keep_their_wire_bytes() -> Result<(), Box<dyn std::error::Error>> {
    let s = SessionId::new("s")?;
    let m = MessageId::new("m")?;
    let cases: Vec<(SessionEvent, Value)> = vec![
        (
            SessionEvent::ExecutionStarted {
                boot: "b".into(),
                turn: None,
            },
            json!({ "boot": "b" }),
        ),
        (SessionEvent::ExecutionSucceeded {}, json!({})),
        (
            SessionEvent::aborted(),
            json!({ "error": { "type": "aborted", "message": ABORTED_MESSAGE } }),
        ),
        (
            SessionEvent::ExecutionInterrupted {
                reason: InterruptReason::User,
            },
            json!({ "reason": "user" }),
        ),
        (
            SessionEvent::PromptAdmitted {
                message_id: m.clone(),
                prompt: json!({ "text": "hi" }),
                delivery: Delivery::Queue,
            },
            json!({ "messageID": "m", "prompt": { "text": "hi" }, "delivery": "queue" }),
        ),
        (
            SessionEvent::MessageAppended {
                message_id: m.clone(),
                kind: "assistant".into(),
                data: json!({ "b": 1, "a": [2] }),
            },
            json!({ "messageID": "m", "type": "assistant", "data": { "b": 1, "a": [2] } }),
        ),
        (
            SessionEvent::InterruptRequested {
                session_id: s.clone(),
            },
            json!({ "sessionID": "s" }),
        ),
        (
            SessionEvent::ModelSwitched {
                session_id: s.clone(),
                message_id: m,
                model: json!("gpt"),
            },
            json!({ "sessionID": "s", "messageID": "m", "model": "gpt" }),
        ),
        (
            SessionEvent::ExecutionStarted {
                boot: "b".into(),
                turn: Some(7),
            },
            json!({ "boot": "b", "turn": 7 }),
        ),
        (
            SessionEvent::StepStarted {
                turn: 7,
                step: "pay".into(),
                attempt: 2,
                key: "s:7:pay".into(),
            },
            json!({ "turn": 7, "step": "pay", "attempt": 2, "key": "s:7:pay" }),
        ),
        (
            SessionEvent::StepCompleted {
                turn: 7,
                step: "pay".into(),
                attempt: 2,
                result: json!({ "paid": 42 }),
            },
            json!({ "turn": 7, "step": "pay", "attempt": 2, "result": { "paid": 42 } }),
        ),
        (
            SessionEvent::StepFailed {
                turn: 7,
                step: "pay".into(),
                attempt: 2,
                error: SessionError::new("step", "429"),
            },
            json!({ "turn": 7, "step": "pay", "attempt": 2,
                    "error": { "type": "step", "message": "429" } }),
        ),
        (
            SessionEvent::restart_notice(&s),
            json!({
                "sessionID": "s",
                "text": RESTART_NOTICE_TEXT,
                "description": RESTART_NOTICE_DESCRIPTION,
            }),
        ),
    ];
    for (event, expected) in cases {
        let data = event.data()?;
        assert_eq!(
            serde_json::to_string(&data)?,
            serde_json::to_string(&expected)?,
            "{}",
            event.kind()
        );
        if let Some(decoded) = SessionEvent::projected(event.kind(), &data) {
            assert_eq!(decoded?, event);
        }
        if let Some(decoded) = SessionEvent::of_turn(event.kind(), &data) {
            assert_eq!(decoded?, event);
        }
    }
    Ok(())
}

#[test]
fn only_a_shutdown_keeps_the_claim() {
    for (reason, releases) in [
        (InterruptReason::User, true),
        (InterruptReason::Superseded, true),
        (InterruptReason::Timeout, true),
        (InterruptReason::Shutdown, false),
    ] {
        assert_eq!(
            SessionEvent::ExecutionInterrupted { reason }.releases_claim(),
            releases
        );
    }
    assert!(SessionEvent::aborted().releases_claim());
    assert!(!SessionEvent::ExecutionStarted {
        boot: "b".into(),
        turn: None
    }
    .releases_claim());
}
