//! The decisions of the journal, each a pure function over what a backend read inside the
//! request's transaction: the interrupt fence, settle (which queued prompt is owed the next
//! turn), the claim merge, served inputs, admission, promotion and keyset paging.
//!
//! A backend only runs statements: it reads the small typed view a rule takes and writes what
//! the rule returns. PostgreSQL's one-round-trip functions (`ds_claim_turn`, `ds_settle_turn`)
//! do the common case of these rules in SQL as an optimization; the parity test runs the same
//! calls on both engines and fails on any difference.

use serde_json::Value;

use crate::id::SessionId;
use crate::records::{Admission, Cursor, Delivery, Direction, MessagesQuery, Order};

#[cfg(test)]
mod tests;

/// The interrupt fence: an input admitted at or before the session's latest interrupt request
/// (`fence`) was stopped by it and is owed nothing.
pub(crate) fn fenced(admitted_seq: u64, fence: Option<u64>) -> bool {
    fence.is_some_and(|fence| admitted_seq <= fence)
}

/// Whether a user interrupt request at `fence` came after the turn claimed at `claim` (that
/// turn was interrupted by it).
pub(crate) fn interrupts_turn(claim: Option<u64>, fence: Option<u64>) -> bool {
    matches!((claim, fence), (Some(claim), Some(fence)) if fence > claim)
}

/// The oldest pending `queue` input the fence did not stop: the prompt a next turn would run.
pub(crate) fn next_queued(pending: &[Admission], fence: Option<u64>) -> Option<&Admission> {
    pending
        .iter()
        .filter(|input| input.promoted_seq.is_none() && input.delivery == Delivery::Queue)
        .filter(|input| !fenced(input.admitted_seq, fence))
        .min_by_key(|input| input.admitted_seq)
}

/// What a turn that ends for good leaves to its session's inbox (decided while its claim is
/// still held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Nothing is pending: nothing to write.
    Nothing,
    /// The next turn is owed to the queued input admitted at this seq: its wake mark is set,
    /// so a crash before that turn claims does not strand it.
    Owe(u64),
    /// The turn had its chance to serve the inputs pending when it claimed: the wake marks of
    /// those admitted before `claim` are dropped (later ones keep theirs).
    Forgive {
        /// The seq that took the claim.
        claim: u64,
    },
}

/// Settle: after a turn that made progress (promoted at least one prompt), the oldest pending,
/// unfenced `queue` input is owed the next turn; otherwise the turn forgives what was pending
/// when it claimed. `progress` is asked only when a queued input is waiting.
pub(crate) fn settle<E>(
    pending: &[Admission],
    fence: Option<u64>,
    claim: Option<u64>,
    progress: impl FnOnce() -> Result<bool, E>,
) -> Result<Settlement, E> {
    if pending.iter().all(|input| input.promoted_seq.is_some()) {
        return Ok(Settlement::Nothing);
    }
    if let Some(queued) = next_queued(pending, fence) {
        if progress()? {
            return Ok(Settlement::Owe(queued.admitted_seq));
        }
    }
    Ok(match claim {
        Some(claim) => Settlement::Forgive { claim },
        None => Settlement::Nothing,
    })
}

/// A session's claim as its row holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimRow {
    /// When the turn was first claimed; `None` while only an adoption attempt was counted.
    pub(crate) time: Option<i64>,
    /// The seq of the event that first claimed the turn.
    pub(crate) seq: Option<u64>,
    /// The boot holding the claim.
    pub(crate) boot: Option<String>,
}

/// The claim merge: a claim of a turn already claimed is another attempt of the same turn, so
/// the first claim's time and seq stay and only the boot changes; any other claim takes the
/// row whole. (The resume attempts counted on the row are never changed by a claim.)
pub(crate) fn merge_claim(
    existing: Option<&ClaimRow>,
    time: i64,
    seq: u64,
    boot: &str,
) -> ClaimRow {
    match existing {
        Some(ClaimRow {
            time: Some(first),
            seq: first_seq,
            ..
        }) => ClaimRow {
            time: Some(*first),
            seq: Some(first_seq.unwrap_or(seq)),
            boot: Some(boot.to_owned()),
        },
        _ => ClaimRow {
            time: Some(time),
            seq: Some(seq),
            boot: Some(boot.to_owned()),
        },
    }
}

/// Served inputs: of the inputs the turn claimed at `claim` promoted (in promotion order), those
/// it still owes an answer — less the ones a user interrupt request after the claim stopped.
pub(crate) fn served(promoted: Vec<Admission>, claim: u64, fence: Option<u64>) -> Vec<Admission> {
    let fence = fence.filter(|&fence| fence > claim);
    promoted
        .into_iter()
        .filter(|input| !fenced(input.admitted_seq, fence))
        .collect()
}

/// Admission equivalence: a stored admission answers a new request with the same id as an
/// exact retry only when session, delivery and prompt are all the same; anything else is a
/// conflict.
pub(crate) fn same_admission(
    stored: &Admission,
    session: &SessionId,
    prompt: &Value,
    delivery: Delivery,
) -> bool {
    &stored.session_id == session && stored.delivery == delivery && &stored.prompt == prompt
}

/// Whether an exact retry of a stored admission marks it owed a turn again: asked to (`resume`),
/// still pending and not stopped by the fence.
pub(crate) fn retry_wakes(stored: &Admission, resume: bool, fence: Option<u64>) -> bool {
    resume && stored.promoted_seq.is_none() && !fenced(stored.admitted_seq, fence)
}

/// Steer promotion: the pending `steer` inputs admitted at or before `cutoff` (all when
/// `None`), in admission order.
pub(crate) fn steer_due(pending: Vec<Admission>, cutoff: Option<u64>) -> Vec<Admission> {
    let mut due: Vec<Admission> = pending
        .into_iter()
        .filter(|input| input.promoted_seq.is_none() && input.delivery == Delivery::Steer)
        .filter(|input| cutoff.is_none_or(|cutoff| input.admitted_seq <= cutoff))
        .collect();
    due.sort_by_key(|input| input.admitted_seq);
    due
}

/// Queue promotion: the oldest pending `queue` input.
pub(crate) fn queue_due(pending: Vec<Admission>) -> Option<Admission> {
    pending
        .into_iter()
        .filter(|input| input.promoted_seq.is_none() && input.delivery == Delivery::Queue)
        .min_by_key(|input| input.admitted_seq)
}

/// A range of a transcript to scan: the statement a backend runs for one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    /// The order of the scan on `seq`.
    pub(crate) order: Order,
    /// Only seqs strictly past this one in the scan's order (`None`: from the first).
    pub(crate) past: Option<u64>,
    /// At most this many rows (`None`: all).
    pub(crate) limit: Option<usize>,
}

/// Keyset paging: the scan for one page of `query`, given the seq of its cursor's message
/// (`anchor`; `None` with a cursor means the cursor names no message of this session, and the
/// page is empty: `None` is returned). The second value says whether the rows come back
/// reversed: a `Previous` page is scanned the opposite way, then read in the requested order.
pub(crate) fn page(query: &MessagesQuery, anchor: Option<u64>) -> Option<(Scan, bool)> {
    let previous = matches!(
        &query.cursor,
        Some(Cursor {
            direction: Direction::Previous,
            ..
        })
    );
    let (order, reversed) = keyset_order(query.order, previous);
    let past = match &query.cursor {
        None => None,
        Some(_) => Some(anchor?),
    };
    let scan = Scan {
        order,
        past,
        limit: query.limit,
    };
    Some((scan, reversed))
}

/// The order a keyset page is scanned in, and whether its rows are then reversed: a page
/// before its anchor (`previous`) is scanned the opposite way and read back in `order`.
pub(crate) fn keyset_order(order: Order, previous: bool) -> (Order, bool) {
    if previous {
        (order.flip(), true)
    } else {
        (order, false)
    }
}

/// What a session's log looks like to compaction, read under the session's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogState {
    /// The newest seq of the log.
    pub(crate) latest: u64,
    /// The first seq the log holds for replay.
    pub(crate) start: u64,
    /// Whether a turn holds a claim (its events are still being written).
    pub(crate) claimed: bool,
    /// When the newest event was committed (ms), if it is still stored.
    pub(crate) newest_time: Option<i64>,
}

/// Compaction: the new start of a log that keeps its last `keep_last` events, when that
/// moves the start and the session is idle (unclaimed, its newest event committed before
/// `idle_before`); `None` when the log is left as it is.
pub(crate) fn compaction_start(log: LogState, keep_last: u64, idle_before: i64) -> Option<u64> {
    let start = (log.latest + 1).saturating_sub(keep_last);
    let idle = log.newest_time.is_some_and(|time| time < idle_before);
    (!log.claimed && start > log.start && idle).then_some(start)
}
