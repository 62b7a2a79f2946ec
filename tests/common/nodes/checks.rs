//! What the multi-node tests check on the shared store: the cluster's invariants over a
//! [`PgView`], the same as SQL over the live tables, and the wait until nothing runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use durable_sessions::kind;
use postgres::Client;

use super::{PgView, Writer};

impl PgView {
    /// The violations of what only the shared store promises, empty when they all hold:
    ///
    /// - every event records the node and the epoch it was written under;
    /// - along each session's seqs the epoch never decreases;
    /// - one writer per epoch: the turn's events (everything but the writes any node makes for
    ///   a client — `created`, `prompt.admitted`, `interrupt.requested`, `model.switched`) of one
    ///   epoch all come from one node (the epoch grows with every change of owner, so a second
    ///   node writing turn events at an epoch is a write that escaped its fence);
    /// - a claim is taken again, while it is live, only right after a restart notice (the
    ///   sweep's rules): never by a plain turn start on the same or another node;
    /// - no session is left owned by a node that has no row (a dead node whose row was deleted
    ///   while something still referred to it).
    pub fn cluster_violations(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (session, writers) in &self.writers {
            let mut last: Option<&Writer> = None;
            let mut turn_writer: BTreeMap<i64, &str> = BTreeMap::new();
            for w in writers {
                let (Some(node), Some(epoch)) = (&w.node, w.epoch) else {
                    bad.push(format!(
                        "{session}#{}: no node or epoch recorded: {w:?}",
                        w.seq
                    ));
                    continue;
                };
                if let Some(prev) = last {
                    if prev.epoch.is_some_and(|p| p > epoch) {
                        bad.push(format!(
                            "{session}#{}: epoch {epoch} ({}, by {node}) after epoch {:?} at #{}",
                            w.seq, w.kind, prev.epoch, prev.seq
                        ));
                    }
                }
                last = Some(w);
                if !is_client_write(&w.kind) {
                    match turn_writer.get(&epoch) {
                        Some(first) if *first != node.as_str() => bad.push(format!(
                            "{session}#{}: {} by {node} at epoch {epoch}, whose turn writes \
                             came from {first}: two writers of one epoch",
                            w.seq, w.kind
                        )),
                        Some(_) => {}
                        None => {
                            turn_writer.insert(epoch, node);
                        }
                    }
                }
            }
        }
        for (session, events) in &self.store.events {
            let writers = &self.writers[session];
            // The node that holds the live claim, replaying the log.
            let mut holder: Option<&str> = None;
            for (i, e) in events.iter().enumerate() {
                let node = writers[i].node.as_deref().unwrap_or("-");
                if e.kind == kind::EXECUTION_STARTED {
                    let after_notice = i > 0 && crate::common::is_restart_notice(&events[i - 1]);
                    if let Some(held) = holder.filter(|_| !after_notice) {
                        bad.push(format!(
                            "{session}#{}: claimed by {node} while {held}'s claim was live, \
                             without the restart notice (a second claim of one turn)",
                            e.seq
                        ));
                    }
                    holder = Some(node);
                } else if crate::common::is_releasing_terminal(e) {
                    holder = None;
                }
            }
        }
        for (session, (owner, _)) in &self.owners {
            if let Some(owner) = owner {
                if !self.nodes.contains_key(owner) {
                    bad.push(format!(
                        "{session}: owned by {owner}, which has no node row"
                    ));
                }
            }
        }
        bad
    }
}

/// Whether events of `kind` are written for a client by whichever node received the call (not
/// by the session's owner).
pub fn is_client_write(kind: &str) -> bool {
    kind == kind::CREATED
        || kind == kind::PROMPT_ADMITTED
        || kind == kind::INTERRUPT_REQUESTED
        || kind == kind::MODEL_SWITCHED
}

/// The same invariants, as SQL over the live tables (they need no snapshot): per-session seqs
/// gap-free from 0 and `event_sequence` at the last one; the epoch never decreasing along a log;
/// every event stamped with a node and an epoch; no claim without its `started` event. Returns
/// one line per violating row.
pub fn sql_violations(db: &mut Client) -> Vec<String> {
    let checks: [(&str, &str); 4] = [
        (
            "seqs not gap-free from 0",
            "SELECT aggregate_id || ': seq ' || seq || ' at index ' || i FROM \
             (SELECT aggregate_id, seq, row_number() OVER w - 1 AS i FROM event \
              WINDOW w AS (PARTITION BY aggregate_id ORDER BY seq)) e WHERE seq <> i \
             UNION ALL \
             SELECT q.aggregate_id || ': event_sequence ' || q.seq || ', last event ' || \
                    COALESCE(m.seq::text, 'none') \
             FROM event_sequence q LEFT JOIN \
              (SELECT aggregate_id, max(seq) AS seq FROM event GROUP BY aggregate_id) m \
              USING (aggregate_id) WHERE m.seq IS DISTINCT FROM q.seq",
        ),
        (
            "epoch decreasing along a log",
            "SELECT aggregate_id || '#' || seq || ': epoch ' || epoch || ' after ' || prev FROM \
             (SELECT aggregate_id, seq, epoch, lag(epoch) OVER \
              (PARTITION BY aggregate_id ORDER BY seq) AS prev FROM event) e \
             WHERE epoch < prev",
        ),
        (
            "event without node or epoch",
            "SELECT aggregate_id || '#' || seq FROM event WHERE node IS NULL OR epoch IS NULL",
        ),
        (
            "claim without its started event",
            "SELECT s.id || ': claim_seq ' || COALESCE(s.claim_seq::text, 'none') FROM session s \
             WHERE s.time_suspended IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event e \
             WHERE e.aggregate_id = s.id AND e.seq = s.claim_seq \
             AND e.type = 'session.execution.started')",
        ),
    ];
    let mut bad = Vec::new();
    for (what, sql) in checks {
        for row in db.query(sql, &[]).unwrap_or_else(|e| panic!("{what}: {e}")) {
            bad.push(format!("{what}: {}", row.get::<_, String>(0)));
        }
    }
    bad
}

/// Waits until [`PgView::quiet`] holds (twice, 100 ms apart) and returns the view then.
///
/// # Panics
/// After `timeout`, naming what is still busy.
pub fn quiesce(db: &mut Client, timeout: Duration, context: &str) -> PgView {
    let deadline = Instant::now() + timeout;
    let mut quiet_once = false;
    loop {
        let view = PgView::read(db);
        if view.quiet() {
            if quiet_once {
                return view;
            }
            quiet_once = true;
        } else {
            quiet_once = false;
            if Instant::now() >= deadline {
                let busy: Vec<String> = view
                    .store
                    .claimed()
                    .into_iter()
                    .chain(view.store.owed())
                    .chain(
                        view.store
                            .sessions
                            .keys()
                            .filter(|s| view.store.continuation_due(s, 0))
                            .cloned(),
                    )
                    .take(3)
                    .map(|s| {
                        let from = view.store.sequences.get(&s).map(|q| q.saturating_sub(25));
                        format!(
                            "{s}: row {:?}, owner {:?}\n{}",
                            view.store.sessions[&s],
                            view.owners[&s],
                            view.log(&s, from)
                        )
                    })
                    .collect();
                panic!(
                    "{context}: not quiet after {timeout:?}: {}\nnodes {:?}\n{}",
                    view.busy(),
                    view.nodes,
                    busy.join("\n")
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
