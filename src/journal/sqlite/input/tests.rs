//! Tests of the inbox: admission, promotion, wake marks, served inputs and the settle.
use serde_json::json;

use super::*;
use crate::event::kind;
use crate::journal::sqlite::test_support::rows::*;
use crate::journal::sqlite::test_support::started;
use crate::journal::sqlite::test_support::{admit, promote_queue, promote_steer};
use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
use crate::journal::sqlite::test_support::{served_inputs, settle};

fn ids(inputs: &[Admission]) -> Vec<&str> {
    inputs.iter().map(|a| a.id.as_str()).collect()
}

#[test]
fn admit_stores_a_pending_input_with_its_event() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    let prompt = json!({ "parts": [{ "type": "text", "text": "hi" }] });
    let (admission, event) = admit(
        &mut db.conn,
        &sid("s"),
        &mid("p"),
        &prompt,
        Delivery::Queue,
        7,
    )?;
    let event = event.expect("a fresh admission publishes");
    assert_eq!(event.kind, kind::PROMPT_ADMITTED);
    assert_eq!(
        event.data,
        json!({ "messageID": "p", "prompt": prompt, "delivery": "queue" })
    );
    let expected = Admission {
        id: mid("p"),
        session_id: sid("s"),
        admitted_seq: event.seq,
        prompt,
        delivery: Delivery::Queue,
        time_created: 7,
        promoted_seq: None,
    };
    assert_eq!(admission, expected);
    assert_eq!(db.conn.get_input(&mid("p"))?, Some(expected));
    assert_eq!(db.conn.get_input(&mid("unknown"))?, None);
    Ok(())
}

#[test]
fn admit_returns_the_stored_input_without_an_event() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    create(&mut db.conn, "t", None, 1)?;
    let (first, _) = admit(
        &mut db.conn,
        &sid("s"),
        &mid("p"),
        &json!("a"),
        Delivery::Steer,
        2,
    )?;
    let seq = db.conn.latest_seq(&sid("s"))?;
    // Different content and session: the stored row comes back for the caller to compare.
    let (again, event) = admit(
        &mut db.conn,
        &sid("t"),
        &mid("p"),
        &json!("b"),
        Delivery::Queue,
        3,
    )?;
    assert_eq!((again, event), (first, None));
    assert_eq!(db.conn.latest_seq(&sid("s"))?, seq);
    assert_eq!(db.conn.latest_seq(&sid("t"))?, Some(0));
    Ok(())
}

#[test]
fn admit_rejects_an_id_already_in_a_transcript() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    db.conn
        .append_message(&sid("s"), &mid("m"), "assistant", &json!("x"), 2)?;
    let seq = db.conn.latest_seq(&sid("s"))?;
    let result = admit(
        &mut db.conn,
        &sid("s"),
        &mid("m"),
        &json!("p"),
        Delivery::Steer,
        3,
    );
    assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
    assert_eq!(db.conn.latest_seq(&sid("s"))?, seq);
    assert_eq!(db.conn.get_input(&mid("m"))?, None);
    Ok(())
}

#[test]
fn pending_inputs_are_in_admission_order() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    create(&mut db.conn, "t", None, 1)?;
    for (id, delivery) in [
        ("z", Delivery::Queue),
        ("a", Delivery::Steer),
        ("m", Delivery::Queue),
    ] {
        admit(&mut db.conn, &sid("s"), &mid(id), &json!(id), delivery, 2)?;
    }
    admit(
        &mut db.conn,
        &sid("t"),
        &mid("other"),
        &json!("o"),
        Delivery::Steer,
        2,
    )?;
    assert_eq!(ids(&db.conn.pending_inputs(&sid("s"))?), ["z", "a", "m"]);
    promote_queue(&mut db.conn, &sid("s"), 3)?;
    assert_eq!(ids(&db.conn.pending_inputs(&sid("s"))?), ["a", "m"]);
    Ok(())
}

#[test]
fn promote_steer_respects_cutoff_order_and_delivery() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let s = sid("s");
    create(&mut db.conn, "s", None, 1)?;
    let mut seqs = Vec::new();
    for (id, delivery) in [
        ("s1", Delivery::Steer),
        ("q1", Delivery::Queue),
        ("s2", Delivery::Steer),
        ("s3", Delivery::Steer),
    ] {
        let (a, _) = admit(&mut db.conn, &s, &mid(id), &json!(id), delivery, 2)?;
        seqs.push(a.admitted_seq);
    }
    let first = promote_steer(&mut db.conn, &s, Some(seqs[2]), 5)?;
    let promoted: Vec<&str> = first.iter().map(|(a, _)| a.id.as_str()).collect();
    assert_eq!(promoted, ["s1", "s2"]);
    for (admission, event) in &first {
        assert_eq!(admission.promoted_seq, Some(event.seq));
        assert_eq!(event.kind, kind::PROMPT_PROMOTED);
        assert_eq!(db.conn.get_input(&admission.id)?.as_ref(), Some(admission));
        let message = db
            .conn
            .get_message(&s, &admission.id)?
            .expect("in transcript");
        assert_eq!((message.kind.as_str(), message.seq), ("user", event.seq));
        assert_eq!(message.data, json!({ "prompt": admission.prompt }));
    }
    assert!(first[0].1.seq < first[1].1.seq);
    let rest = promote_steer(&mut db.conn, &s, None, 6)?;
    assert_eq!(
        rest.iter().map(|(a, _)| a.id.as_str()).collect::<Vec<_>>(),
        ["s3"]
    );
    assert!(promote_steer(&mut db.conn, &s, None, 7)?.is_empty());
    assert_eq!(ids(&db.conn.pending_inputs(&s)?), ["q1"]);
    Ok(())
}

#[test]
fn promote_queue_promotes_only_the_oldest_queue_input() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let s = sid("s");
    create(&mut db.conn, "s", None, 1)?;
    for (id, delivery) in [
        ("st", Delivery::Steer),
        ("q1", Delivery::Queue),
        ("q2", Delivery::Queue),
    ] {
        admit(&mut db.conn, &s, &mid(id), &json!(id), delivery, 2)?;
    }
    let (first, event) = promote_queue(&mut db.conn, &s, 3)?.expect("a queue input");
    assert_eq!(
        (first.id.as_str(), first.promoted_seq),
        ("q1", Some(event.seq))
    );
    assert_eq!(ids(&db.conn.pending_inputs(&s)?), ["st", "q2"]);
    let (second, _) = promote_queue(&mut db.conn, &s, 4)?.expect("a queue input");
    assert_eq!(second.id.as_str(), "q2");
    assert_eq!(promote_queue(&mut db.conn, &s, 5)?, None);
    Ok(())
}

#[test]
fn an_input_cannot_be_promoted_twice() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let s = sid("s");
    create(&mut db.conn, "s", None, 1)?;
    admit(&mut db.conn, &s, &mid("p"), &json!("p"), Delivery::Steer, 2)?;
    let (promoted, _) = promote_steer(&mut db.conn, &s, None, 3)?.remove(0);
    let before = db.conn.latest_seq(&s)?;

    let data = json!({ "messageID": "p", "prompt": "p", "delivery": "steer" });
    db.conn.execute_batch("BEGIN")?;
    let again = db.conn.publish(&s, kind::PROMPT_PROMOTED, &data, 4);
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    db.conn.execute_batch("ROLLBACK")?;

    assert!(promote_steer(&mut db.conn, &s, None, 5)?.is_empty());
    assert_eq!(db.conn.get_input(&mid("p"))?, Some(promoted));
    assert_eq!(db.conn.latest_seq(&s)?, before);
    assert_eq!(db.conn.events_after(&s, before, 10)?, []);
    Ok(())
}

#[test]
fn promoting_an_unknown_input_is_a_conflict() -> Result<(), StoreError> {
    let mut db = test_db()?;
    create(&mut db.conn, "s", None, 1)?;
    let data = json!({ "messageID": "nope", "prompt": "p", "delivery": "steer" });
    let result = db.conn.publish(&sid("s"), kind::PROMPT_PROMOTED, &data, 2);
    assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
    Ok(())
}

#[test]
fn wake_marks_are_adopted_until_fenced_or_claimed() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    create(conn, "quiet", None, 1)?;
    create(conn, "child", Some("s"), 1)?;
    admit(conn, &s, &mid("p1"), &json!("one"), Delivery::Steer, 2)?;
    admit(
        conn,
        &sid("quiet"),
        &mid("q"),
        &json!("q"),
        Delivery::Steer,
        2,
    )?;
    admit(
        conn,
        &sid("child"),
        &mid("c"),
        &json!("c"),
        Delivery::Steer,
        2,
    )?;
    assert!(conn.adoptable()?.is_empty(), "admitted without resume");
    conn.mark_wake(&mid("p1"))?;
    conn.mark_wake(&mid("c"))?;
    assert_eq!(
        conn.adoptable()?,
        vec![s.clone()],
        "children are not adopted"
    );
    assert!(conn.owes_turn(&s)?);
    started(conn, &s)?;
    assert!(
        conn.adoptable()?.is_empty(),
        "a claimed session is swept as a claim"
    );
    conn.publish(&s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
    assert_eq!(conn.adoptable()?, vec![s.clone()]);
    conn.clear_wakes(&s)?;
    assert!(conn.adoptable()?.is_empty());
    assert!(!conn.owes_turn(&s)?);
    Ok(())
}

#[test]
fn served_inputs_skip_earlier_turns_and_interrupted_work() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    admit(conn, &s, &mid("old"), &json!("old"), Delivery::Steer, 2)?;
    started(conn, &s)?;
    promote_steer(conn, &s, None, 3)?;
    conn.publish(&s, kind::EXECUTION_SUCCEEDED, &json!({}), 3)?;
    admit(conn, &s, &mid("a"), &json!("a"), Delivery::Steer, 4)?;
    let claim = started(conn, &s)?;
    promote_steer(conn, &s, None, 5)?;
    let ids = |v: Vec<Admission>| v.into_iter().map(|a| a.id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(served_inputs(conn, &s, claim, None)?), ["a"]);
    let fence = conn
        .publish(&s, kind::INTERRUPT_REQUESTED, &json!({}), 6)?
        .seq;
    assert!(ids(served_inputs(conn, &s, claim, Some(fence))?).is_empty());
    admit(conn, &s, &mid("b"), &json!("b"), Delivery::Queue, 7)?;
    promote_queue(conn, &s, 8)?;
    assert_eq!(ids(served_inputs(conn, &s, claim, Some(fence))?), ["b"]);
    Ok(())
}

#[test]
fn settle_schedules_the_next_queued_prompt_only_after_progress() -> Result<(), StoreError> {
    let mut db = test_db()?;
    let conn = &mut db.conn;
    let s = sid("s");
    create(conn, "s", None, 1)?;
    started(conn, &s)?;
    let q1 = admit(conn, &s, &mid("q1"), &json!("1"), Delivery::Queue, 2)?.0;
    let q2 = admit(conn, &s, &mid("q2"), &json!("2"), Delivery::Queue, 2)?.0;
    conn.mark_wake(&q1.id)?;
    conn.mark_wake(&q2.id)?;
    // Nothing promoted yet: no progress, no continuation; the wakes came after the claim.
    assert_eq!(settle(conn, &s)?, None);
    assert!(conn.owes_turn(&s)?);
    promote_queue(conn, &s, 3)?;
    assert_eq!(settle(conn, &s)?, Some(q2.admitted_seq));
    conn.publish(&s, kind::EXECUTION_SUCCEEDED, &json!({}), 4)?;
    // The next turn claims after both admissions and promotes nothing: the mark is dropped.
    started(conn, &s)?;
    assert_eq!(settle(conn, &s)?, None);
    assert!(!conn.owes_turn(&s)?);
    // A fenced queue input is never scheduled.
    conn.publish(&s, kind::INTERRUPT_REQUESTED, &json!({}), 5)?;
    promote_steer(conn, &s, None, 5)?;
    assert_eq!(settle(conn, &s)?, None);
    Ok(())
}
