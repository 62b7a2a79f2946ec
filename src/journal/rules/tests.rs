//! The rules without a database: examples of each, and properties of those with an order or a
//! fence.

use std::convert::Infallible;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::id::MessageId;
use crate::records::Cursor;

fn input(seq: u64, delivery: Delivery, promoted: Option<u64>) -> Admission {
    Admission {
        id: MessageId::new(format!("p{seq}")).expect("valid id"),
        session_id: SessionId::new("s").expect("valid id"),
        admitted_seq: seq,
        prompt: json!(seq),
        delivery,
        time_created: 0,
        promoted_seq: promoted,
    }
}

fn seqs(inputs: &[Admission]) -> Vec<u64> {
    inputs.iter().map(|i| i.admitted_seq).collect()
}

fn settled(
    pending: &[Admission],
    fence: Option<u64>,
    claim: Option<u64>,
    progress: bool,
) -> Settlement {
    let decided: Result<_, Infallible> = settle(pending, fence, claim, || Ok(progress));
    decided.unwrap_or_else(|never| match never {})
}

#[test]
fn the_fence_stops_what_was_admitted_at_or_before_it() {
    assert!(!fenced(5, None));
    assert!(fenced(5, Some(5)));
    assert!(fenced(4, Some(5)));
    assert!(!fenced(6, Some(5)));
}

#[test]
fn an_interrupt_request_interrupts_the_turn_it_came_after() {
    assert!(interrupts_turn(Some(3), Some(4)));
    assert!(
        !interrupts_turn(Some(4), Some(3)),
        "a request before the claim"
    );
    assert!(!interrupts_turn(Some(4), None));
    assert!(!interrupts_turn(None, Some(4)));
}

#[test]
fn settle_owes_the_oldest_unfenced_queued_prompt_after_progress() {
    let pending = [
        input(2, Delivery::Queue, None),
        input(6, Delivery::Queue, None),
        input(8, Delivery::Queue, None),
        input(3, Delivery::Steer, None),
    ];
    assert_eq!(settled(&pending, None, Some(4), true), Settlement::Owe(2));
    assert_eq!(
        settled(&pending, Some(5), Some(4), true),
        Settlement::Owe(6)
    );
    assert_eq!(
        settled(&pending, Some(9), Some(4), true),
        Settlement::Forgive { claim: 4 },
        "every queued prompt is fenced"
    );
    assert_eq!(
        settled(&pending, None, Some(4), false),
        Settlement::Forgive { claim: 4 },
        "no progress: the turn had its chance"
    );
    assert_eq!(settled(&[], None, Some(4), true), Settlement::Nothing);
}

#[test]
fn settle_asks_for_progress_only_when_a_queued_prompt_waits() {
    let steer_only = [input(2, Delivery::Steer, None)];
    let decided: Result<_, &str> = settle(&steer_only, None, Some(1), || Err("asked"));
    assert_eq!(decided, Ok(Settlement::Forgive { claim: 1 }));
    let queued = [input(2, Delivery::Queue, None)];
    let decided: Result<_, &str> = settle(&queued, None, Some(1), || Err("asked"));
    assert_eq!(decided, Err("asked"));
}

#[test]
fn a_second_claim_keeps_the_first_time_and_seq() {
    let first = merge_claim(None, 100, 7, "b1");
    assert_eq!(
        first,
        ClaimRow {
            time: Some(100),
            seq: Some(7),
            boot: Some("b1".into())
        }
    );
    let again = merge_claim(Some(&first), 200, 9, "b2");
    assert_eq!(again.time, Some(100));
    assert_eq!(again.seq, Some(7));
    assert_eq!(again.boot.as_deref(), Some("b2"));
    let counted = ClaimRow {
        time: None,
        seq: None,
        boot: Some("sweeper".into()),
    };
    assert_eq!(merge_claim(Some(&counted), 300, 11, "b3").seq, Some(11));
}

#[test]
fn served_inputs_leave_out_those_a_later_request_stopped() {
    let promoted = vec![
        input(2, Delivery::Steer, Some(6)),
        input(9, Delivery::Steer, Some(10)),
    ];
    assert_eq!(seqs(&served(promoted.clone(), 5, None)), [2, 9]);
    assert_eq!(seqs(&served(promoted.clone(), 5, Some(8))), [9]);
    assert_eq!(
        seqs(&served(promoted, 5, Some(4))),
        [2, 9],
        "a request before the claim stops nothing of this turn"
    );
}

#[test]
fn an_exact_retry_is_the_same_session_delivery_and_prompt() {
    let stored = input(2, Delivery::Queue, None);
    let s = SessionId::new("s").expect("valid id");
    assert!(same_admission(&stored, &s, &json!(2), Delivery::Queue));
    assert!(!same_admission(&stored, &s, &json!(3), Delivery::Queue));
    assert!(!same_admission(&stored, &s, &json!(2), Delivery::Steer));
    let t = SessionId::new("t").expect("valid id");
    assert!(!same_admission(&stored, &t, &json!(2), Delivery::Queue));
    assert!(retry_wakes(&stored, true, None));
    assert!(!retry_wakes(&stored, false, None));
    assert!(!retry_wakes(&stored, true, Some(2)), "fenced");
    let promoted = input(2, Delivery::Queue, Some(3));
    assert!(!retry_wakes(&promoted, true, None));
}

#[test]
fn promotion_takes_steers_up_to_the_cutoff_and_the_oldest_queued() {
    let pending = vec![
        input(5, Delivery::Steer, None),
        input(2, Delivery::Steer, None),
        input(3, Delivery::Queue, None),
        input(1, Delivery::Queue, None),
        input(9, Delivery::Steer, None),
    ];
    assert_eq!(seqs(&steer_due(pending.clone(), None)), [2, 5, 9]);
    assert_eq!(seqs(&steer_due(pending.clone(), Some(5))), [2, 5]);
    assert_eq!(queue_due(pending).map(|i| i.admitted_seq), Some(1));
    assert!(queue_due(vec![input(2, Delivery::Steer, None)]).is_none());
}

#[test]
fn a_page_scans_past_its_cursor_and_a_previous_page_the_other_way() {
    let s = SessionId::new("s").expect("valid id");
    let mut query = MessagesQuery::new(s);
    query.limit = Some(2);
    let (scan, reversed) = page(&query, None).expect("a first page");
    assert_eq!(
        (scan.order, scan.past, scan.limit, reversed),
        (Order::Desc, None, Some(2), false)
    );
    query.cursor = Some(Cursor {
        id: MessageId::new("m").expect("valid id"),
        direction: Direction::Previous,
    });
    assert!(
        page(&query, None).is_none(),
        "an unknown cursor: an empty page"
    );
    let (scan, reversed) = page(&query, Some(4)).expect("a page");
    assert_eq!(
        (scan.order, scan.past, reversed),
        (Order::Asc, Some(4), true)
    );
}

#[test]
fn compaction_moves_the_start_of_an_idle_unclaimed_log_only() {
    let log = LogState {
        latest: 9,
        start: 0,
        claimed: false,
        newest_time: Some(100),
    };
    assert_eq!(compaction_start(log, 3, 200), Some(7));
    assert_eq!(compaction_start(log, 3, 100), None, "not idle long enough");
    assert_eq!(
        compaction_start(
            LogState {
                claimed: true,
                ..log
            },
            3,
            200
        ),
        None
    );
    assert_eq!(
        compaction_start(LogState { start: 7, ..log }, 3, 200),
        None,
        "kept already"
    );
    assert_eq!(
        compaction_start(log, 20, 200),
        None,
        "shorter than what is kept"
    );
    assert_eq!(
        compaction_start(
            LogState {
                newest_time: None,
                ..log
            },
            3,
            200
        ),
        None
    );
    assert_eq!(keyset_order(Order::Desc, true), (Order::Asc, true));
    assert_eq!(keyset_order(Order::Asc, false), (Order::Asc, false));
}

fn inputs() -> impl Strategy<Value = Vec<Admission>> {
    prop::collection::vec((1u64..60, any::<bool>(), prop::option::of(1u64..60)), 0..12).prop_map(
        |rows| {
            let mut seen = std::collections::BTreeSet::new();
            rows.into_iter()
                .filter(|(seq, ..)| seen.insert(*seq))
                .map(|(seq, queue, promoted)| {
                    let delivery = if queue {
                        Delivery::Queue
                    } else {
                        Delivery::Steer
                    };
                    input(seq, delivery, promoted)
                })
                .collect()
        },
    )
}

proptest! {
    /// The prompt settle owes is pending, queued, past the fence, and no older one is.
    #[test]
    fn settle_owes_only_the_oldest_unfenced_queued_prompt(
        pending in inputs(),
        fence in prop::option::of(0u64..60),
        claim in prop::option::of(0u64..60),
        progress in any::<bool>(),
    ) {
        match settled(&pending, fence, claim, progress) {
            Settlement::Owe(seq) => {
                prop_assert!(progress);
                let owed = pending.iter().find(|i| i.admitted_seq == seq).expect("owed input");
                prop_assert!(owed.promoted_seq.is_none() && owed.delivery == Delivery::Queue);
                prop_assert!(!fenced(seq, fence));
                prop_assert!(!pending.iter().any(|i| i.promoted_seq.is_none()
                    && i.delivery == Delivery::Queue
                    && !fenced(i.admitted_seq, fence)
                    && i.admitted_seq < seq));
            }
            Settlement::Forgive { claim: forgiven } => prop_assert_eq!(Some(forgiven), claim),
            Settlement::Nothing => prop_assert!(
                claim.is_none() || pending.iter().all(|i| i.promoted_seq.is_some())
            ),
        }
    }

    /// Served inputs are the promoted ones in their order, less exactly those fenced by a
    /// request after the claim.
    #[test]
    fn served_inputs_are_an_ordered_subset_past_the_fence(
        promoted in inputs(),
        claim in 0u64..60,
        fence in prop::option::of(0u64..60),
    ) {
        let kept = served(promoted.clone(), claim, fence);
        let expected: Vec<u64> = promoted
            .iter()
            .filter(|i| !matches!(fence, Some(f) if f > claim && i.admitted_seq <= f))
            .map(|i| i.admitted_seq)
            .collect();
        prop_assert_eq!(seqs(&kept), expected);
    }

    /// A claim merge is idempotent for the same turn: merging again keeps time and seq.
    #[test]
    fn the_claim_merge_keeps_the_first_claim(
        time in 0i64..1000, seq in 0u64..1000, later in 0i64..1000, later_seq in 0u64..1000,
    ) {
        let first = merge_claim(None, time, seq, "a");
        let again = merge_claim(Some(&first), later, later_seq, "b");
        prop_assert_eq!(again.time, Some(time));
        prop_assert_eq!(again.seq, Some(seq));
    }
}
