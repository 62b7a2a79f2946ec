//! A consistent snapshot of the shared database, read with the sync `postgres` client: the
//! crash matrix's [`StoreView`] (so its store-wide invariants apply as they are) plus what only
//! PostgreSQL records (each event's node and epoch, owners, nodes).

use std::collections::{BTreeMap, BTreeSet};

use postgres::{Client, NoTls};
use serde_json::Value;

use crate::common::{EventRow, InputRow, MessageRow, SessionRow, StoreView};

/// A connection to the test's database.
pub fn connect(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Who wrote one event row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub seq: u64,
    pub kind: String,
    pub node: Option<String>,
    pub epoch: Option<i64>,
    /// Commit time (ms since the Unix epoch, the writing node's clock).
    pub time: i64,
}

/// The whole database in one consistent snapshot: the crash matrix's view and what only the
/// shared store records.
#[derive(Debug, Clone, Default)]
pub struct PgView {
    pub store: StoreView,
    /// Per session, every event's writer, by seq.
    pub writers: BTreeMap<String, Vec<Writer>>,
    /// Per session, `(owner_node, owner_epoch)`.
    pub owners: BTreeMap<String, (Option<String>, i64)>,
    /// `node_id` → `name` of every node row.
    pub nodes: BTreeMap<String, String>,
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stored JSON {text:?}: {e}"))
}

fn seq(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_else(|_| panic!("negative seq {value}"))
}

impl PgView {
    /// Reads every table in one `REPEATABLE READ` transaction.
    pub fn read(db: &mut Client) -> PgView {
        let mut tx = db
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .expect("snapshot transaction");
        let mut view = PgView::default();
        for row in tx
            .query(
                "SELECT id, parent_id, time_suspended, resume_attempts, claim_boot, claim_seq, \
                 owner_node, owner_epoch FROM session",
                &[],
            )
            .unwrap()
        {
            let id: String = row.get(0);
            view.store.sessions.insert(
                id.clone(),
                SessionRow {
                    parent: row.get(1),
                    claimed: row.get::<_, Option<i64>>(2).is_some(),
                    attempts: u32::try_from(row.get::<_, i64>(3)).expect("attempts"),
                    claim_boot: row.get(4),
                    claim_seq: row.get::<_, Option<i64>>(5).map(seq),
                },
            );
            view.owners.insert(id, (row.get(6), row.get(7)));
        }
        for row in tx
            .query(
                "SELECT aggregate_id, seq, type, data, time, node, epoch FROM event \
                 ORDER BY aggregate_id, seq",
                &[],
            )
            .unwrap()
        {
            let id: String = row.get(0);
            let (n, kind): (u64, String) = (seq(row.get(1)), row.get(2));
            view.store
                .events
                .entry(id.clone())
                .or_default()
                .push(EventRow {
                    seq: n,
                    kind: kind.clone(),
                    data: json(row.get(3)),
                });
            view.writers.entry(id).or_default().push(Writer {
                seq: n,
                kind,
                time: row.get(4),
                node: row.get(5),
                epoch: row.get(6),
            });
        }
        for row in tx
            .query("SELECT aggregate_id, seq FROM event_sequence", &[])
            .unwrap()
        {
            view.store.sequences.insert(row.get(0), seq(row.get(1)));
        }
        for row in tx
            .query(
                "SELECT id, session_id, admitted_seq, promoted_seq, prompt, delivery, wake \
                 FROM session_input",
                &[],
            )
            .unwrap()
        {
            view.store.inputs.insert(
                row.get(0),
                InputRow {
                    session: row.get(1),
                    admitted_seq: seq(row.get(2)),
                    promoted_seq: row.get::<_, Option<i64>>(3).map(seq),
                    prompt: json(row.get(4)),
                    delivery: row.get(5),
                    wake: row.get(6),
                },
            );
        }
        for row in tx
            .query(
                "SELECT id, session_id, type, seq, data, interrupted FROM session_message",
                &[],
            )
            .unwrap()
        {
            view.store.messages.insert(
                row.get(0),
                MessageRow {
                    session: row.get(1),
                    kind: row.get(2),
                    seq: seq(row.get(3)),
                    data: json(row.get(4)),
                    interrupted: row.get(5),
                },
            );
        }
        for row in tx.query("SELECT node_id, name FROM node", &[]).unwrap() {
            view.nodes.insert(row.get(0), row.get(1));
        }
        tx.commit().unwrap();
        view
    }

    /// Whether nothing runs or is due: no claim, no session owed a turn (an acknowledged prompt
    /// whose turn has not started), no queued prompt whose turn the last one scheduled.
    pub fn quiet(&self) -> bool {
        self.store.claimed().is_empty()
            && self.store.owed().is_empty()
            && !self
                .store
                .sessions
                .keys()
                .any(|s| self.store.continuation_due(s, 0))
    }

    /// What keeps [`PgView::quiet`] from holding, for a failure message.
    pub fn busy(&self) -> String {
        let due: BTreeSet<&String> = self
            .store
            .sessions
            .keys()
            .filter(|s| self.store.continuation_due(s, 0))
            .collect();
        format!(
            "claimed {:?}; owed {:?}; continuation due {due:?}",
            self.store.claimed(),
            self.store.owed()
        )
    }

    /// The session's events after `seq`, one line each, with their writers (failure messages).
    pub fn log(&self, session: &str, after: Option<u64>) -> String {
        let events = self
            .store
            .events
            .get(session)
            .map_or(&[][..], Vec::as_slice);
        let writers = self.writers.get(session).map_or(&[][..], Vec::as_slice);
        events
            .iter()
            .zip(writers)
            .filter(|(e, _)| after.is_none_or(|a| e.seq > a))
            .map(|(e, w)| {
                let data = e.data.to_string();
                let data: String = data.chars().take(120).collect();
                format!(
                    "  #{} {} {data} [node {} epoch {:?} t {}]",
                    e.seq,
                    e.kind,
                    w.node
                        .as_deref()
                        .map(|n| self.nodes.get(n).map_or(n, String::as_str))
                        .unwrap_or("-"),
                    w.epoch,
                    w.time
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The restart notices of `session` after `seq`, with their writers.
pub fn notices_after<'a>(
    view: &'a PgView,
    session: &str,
    seq: u64,
) -> Vec<(&'a EventRow, &'a Writer)> {
    let events = view
        .store
        .events
        .get(session)
        .map_or(&[][..], Vec::as_slice);
    let writers = view.writers.get(session).map_or(&[][..], Vec::as_slice);
    events
        .iter()
        .zip(writers)
        .filter(|(e, _)| e.seq > seq && crate::common::is_restart_notice(e))
        .collect()
}
