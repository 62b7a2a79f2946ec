//! The prompt inbox (`session_input`): admission and steer/queue promotion.

use rusqlite::{Connection, OptionalExtension, Row};
use serde_json::Value;

use super::{
    conflict_on_constraint, get_opt_seq, get_seq, json_text, json_value, message_exists,
    message_id, seq_param, session_id, StoreError,
};
use crate::id::{MessageId, SessionId};
use crate::records::{Admission, Delivery};

macro_rules! input_columns {
    () => {
        "id, session_id, admitted_seq, prompt, delivery, time_created, promoted_seq"
    };
}

/// A `session_input` row as stored, before ids and JSON are decoded.
struct InputRow {
    id: String,
    session_id: String,
    admitted_seq: u64,
    prompt: String,
    delivery: String,
    time_created: i64,
    promoted_seq: Option<u64>,
}

impl InputRow {
    /// Reads the columns of `input_columns!()` in order.
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            session_id: row.get(1)?,
            admitted_seq: get_seq(row, 2)?,
            prompt: row.get(3)?,
            delivery: row.get(4)?,
            time_created: row.get(5)?,
            promoted_seq: get_opt_seq(row, 6)?,
        })
    }

    fn decode(self) -> Result<Admission, StoreError> {
        let delivery = self
            .delivery
            .parse::<Delivery>()
            .map_err(|e| StoreError::Inconsistent(format!("stored delivery: {e}")))?;
        Ok(Admission {
            id: message_id(self.id)?,
            session_id: session_id(self.session_id)?,
            admitted_seq: self.admitted_seq,
            prompt: json_value(&self.prompt)?,
            delivery,
            time_created: self.time_created,
            promoted_seq: self.promoted_seq,
        })
    }
}

/// Runs a cached query of inbox rows and decodes them.
pub(super) fn query_inputs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Admission>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt
        .query_map(params, InputRow::read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(InputRow::decode).collect()
}

/// The admission stored under `id`, pending or promoted, of any session.
pub(crate) fn get_input(
    conn: &Connection,
    id: &MessageId,
) -> Result<Option<Admission>, StoreError> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT ",
        input_columns!(),
        " FROM session_input WHERE id = ?1"
    ))?;
    let row = stmt.query_row([id.as_str()], InputRow::read).optional()?;
    row.map(InputRow::decode).transpose()
}

/// Inserts a pending inbox row (the projection of `session.prompt.admitted`). An id already in
/// the inbox or the transcript is a conflict.
pub(super) fn insert_input(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
    admitted_seq: u64,
    prompt: &Value,
    delivery: Delivery,
    time: i64,
) -> Result<(), StoreError> {
    if message_exists(conn, id)? {
        return Err(StoreError::Conflict(format!(
            "prompt {id} is already in a transcript"
        )));
    }
    let mut stmt = conn.prepare_cached(concat!(
        "INSERT INTO session_input (",
        input_columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)"
    ))?;
    stmt.execute(rusqlite::params![
        id.as_str(),
        session.as_str(),
        seq_param(admitted_seq),
        json_text(prompt)?,
        delivery.as_str(),
        time,
    ])
    .map_err(|e| {
        conflict_on_constraint(e, || {
            format!("prompt {id} cannot be admitted to session {session}")
        })
    })?;
    Ok(())
}

/// Marks a pending input promoted by event `seq` (part of the projection of
/// `session.prompt.promoted`). An input that is unknown or already promoted is a conflict.
pub(super) fn mark_promoted(
    conn: &Connection,
    session: &SessionId,
    id: &MessageId,
    seq: u64,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE session_input SET promoted_seq = ?3 \
         WHERE id = ?1 AND session_id = ?2 AND promoted_seq IS NULL",
    )?;
    if stmt.execute(rusqlite::params![
        id.as_str(),
        session.as_str(),
        seq_param(seq)
    ])? == 0
    {
        return Err(StoreError::Conflict(format!(
            "prompt {id} is not pending in session {session}"
        )));
    }
    Ok(())
}

/// `session`'s pending inputs in admission order.
pub(crate) fn pending_inputs(
    conn: &Connection,
    session: &SessionId,
) -> Result<Vec<Admission>, StoreError> {
    query_inputs(
        conn,
        concat!(
            "SELECT ",
            input_columns!(),
            " FROM session_input WHERE session_id = ?1 AND promoted_seq IS NULL \
             ORDER BY admitted_seq"
        ),
        [session.as_str()],
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::kind;
    use crate::journal::sqlite::publish;
    use crate::journal::sqlite::test_support::{admit, promote_queue, promote_steer};
    use crate::journal::sqlite::test_support::{create, mid, sid, test_db};
    use crate::journal::sqlite::{append_message, events_after, get_message, latest_seq};
    fn ids(inputs: &[Admission]) -> Vec<&str> {
        inputs.iter().map(|a| a.id.as_str()).collect()
    }

    #[test]
    fn admit_stores_a_pending_input_with_its_event() -> Result<(), StoreError> {
        let mut db = test_db()?;
        create(&db.conn, "s", None, 1)?;
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
        assert_eq!(get_input(&db.conn, &mid("p"))?, Some(expected));
        assert_eq!(get_input(&db.conn, &mid("unknown"))?, None);
        Ok(())
    }

    #[test]
    fn admit_returns_the_stored_input_without_an_event() -> Result<(), StoreError> {
        let mut db = test_db()?;
        create(&db.conn, "s", None, 1)?;
        create(&db.conn, "t", None, 1)?;
        let (first, _) = admit(
            &mut db.conn,
            &sid("s"),
            &mid("p"),
            &json!("a"),
            Delivery::Steer,
            2,
        )?;
        let seq = latest_seq(&db.conn, &sid("s"))?;
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
        assert_eq!(latest_seq(&db.conn, &sid("s"))?, seq);
        assert_eq!(latest_seq(&db.conn, &sid("t"))?, Some(0));
        Ok(())
    }

    #[test]
    fn admit_rejects_an_id_already_in_a_transcript() -> Result<(), StoreError> {
        let mut db = test_db()?;
        create(&db.conn, "s", None, 1)?;
        append_message(&db.conn, &sid("s"), &mid("m"), "assistant", &json!("x"), 2)?;
        let seq = latest_seq(&db.conn, &sid("s"))?;
        let result = admit(
            &mut db.conn,
            &sid("s"),
            &mid("m"),
            &json!("p"),
            Delivery::Steer,
            3,
        );
        assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
        assert_eq!(latest_seq(&db.conn, &sid("s"))?, seq);
        assert_eq!(get_input(&db.conn, &mid("m"))?, None);
        Ok(())
    }

    #[test]
    fn pending_inputs_are_in_admission_order() -> Result<(), StoreError> {
        let mut db = test_db()?;
        create(&db.conn, "s", None, 1)?;
        create(&db.conn, "t", None, 1)?;
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
        assert_eq!(ids(&pending_inputs(&db.conn, &sid("s"))?), ["z", "a", "m"]);
        promote_queue(&mut db.conn, &sid("s"), 3)?;
        assert_eq!(ids(&pending_inputs(&db.conn, &sid("s"))?), ["a", "m"]);
        Ok(())
    }

    #[test]
    fn promote_steer_respects_cutoff_order_and_delivery() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let s = sid("s");
        create(&db.conn, "s", None, 1)?;
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
            assert_eq!(
                get_input(&db.conn, &admission.id)?.as_ref(),
                Some(admission)
            );
            let message = get_message(&db.conn, &s, &admission.id)?.expect("in transcript");
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
        assert_eq!(ids(&pending_inputs(&db.conn, &s)?), ["q1"]);
        Ok(())
    }

    #[test]
    fn promote_queue_promotes_only_the_oldest_queue_input() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let s = sid("s");
        create(&db.conn, "s", None, 1)?;
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
        assert_eq!(ids(&pending_inputs(&db.conn, &s)?), ["st", "q2"]);
        let (second, _) = promote_queue(&mut db.conn, &s, 4)?.expect("a queue input");
        assert_eq!(second.id.as_str(), "q2");
        assert_eq!(promote_queue(&mut db.conn, &s, 5)?, None);
        Ok(())
    }

    #[test]
    fn an_input_cannot_be_promoted_twice() -> Result<(), StoreError> {
        let mut db = test_db()?;
        let s = sid("s");
        create(&db.conn, "s", None, 1)?;
        admit(&mut db.conn, &s, &mid("p"), &json!("p"), Delivery::Steer, 2)?;
        let (promoted, _) = promote_steer(&mut db.conn, &s, None, 3)?.remove(0);
        let before = latest_seq(&db.conn, &s)?;

        let data = json!({ "messageID": "p", "prompt": "p", "delivery": "steer" });
        let tx = db.conn.unchecked_transaction()?;
        let again = publish(&tx, &s, kind::PROMPT_PROMOTED, &data, 4);
        assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
        drop(tx);

        assert!(promote_steer(&mut db.conn, &s, None, 5)?.is_empty());
        assert_eq!(get_input(&db.conn, &mid("p"))?, Some(promoted));
        assert_eq!(latest_seq(&db.conn, &s)?, before);
        assert_eq!(events_after(&db.conn, &s, before, 10)?, []);
        Ok(())
    }

    #[test]
    fn promoting_an_unknown_input_is_a_conflict() -> Result<(), StoreError> {
        let db = test_db()?;
        create(&db.conn, "s", None, 1)?;
        let data = json!({ "messageID": "nope", "prompt": "p", "delivery": "steer" });
        let result = publish(&db.conn, &sid("s"), kind::PROMPT_PROMOTED, &data, 2);
        assert!(matches!(result, Err(StoreError::Conflict(_))), "{result:?}");
        Ok(())
    }
}
