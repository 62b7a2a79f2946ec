//! The clients' side of a workload: [`Spread`], which sends each request to a live node and
//! moves on when one cannot be reached, and the [`Ledger`] of what they were promised.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::request;
use crate::common::StoreView;

/// A client spreading requests over the nodes that are up, moving to the next one when a node
/// cannot be reached (it was killed): requests are retried as they are, so only idempotent ones
/// (an admission with its message id, an interrupt) go through it.
#[derive(Debug, Clone)]
pub struct Spread {
    pub(super) addrs: Arc<RwLock<Vec<Option<String>>>>,
}

impl Spread {
    /// Sends to node `preferred` if it is up, else to the next one up; returns the node that
    /// answered, with the answer. Gives up (panics) after 60 s without an answer.
    pub fn send(
        &self,
        preferred: usize,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (usize, u16, Value) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut i = preferred;
        let mut last = None;
        loop {
            let addr = {
                let addrs = self.addrs.read().unwrap();
                i %= addrs.len();
                addrs[i].clone()
            };
            if let Some(addr) = addr {
                match request(&addr, method, path, body) {
                    Ok((status, value)) if status < 500 => return (i, status, value),
                    other => last = Some(format!("{addr}: {other:?}")),
                }
            }
            assert!(
                Instant::now() < deadline,
                "{method} {path}: no node answered within 60 s; last {last:?}"
            );
            i += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the clients were told: the prompts acknowledged (message id → session).
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    inner: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Ledger {
    pub fn ack(&self, message: &str, session: &str) {
        self.inner
            .lock()
            .unwrap()
            .insert(message.to_owned(), session.to_owned());
    }

    pub fn acked(&self) -> BTreeMap<String, String> {
        self.inner.lock().unwrap().clone()
    }

    /// Every acknowledged prompt ran (was promoted) and, unless a user interrupted its turn,
    /// was answered exactly once; or a later interrupt request fenced it before it ran; or an
    /// `aborted` turn of its session gave it up. Returns `[answered, interrupted mid-turn,
    /// fenced before running, given up]`.
    pub fn check(&self, view: &StoreView, context: &str) -> [usize; 4] {
        let (tally, bad) = self.problems(view);
        assert!(
            bad.is_empty(),
            "{context}: {} acknowledged prompt(s) not served:\n{}",
            bad.len(),
            bad.join("\n")
        );
        tally
    }

    /// What [`Ledger::check`] checks: the tally, and one line per prompt not served.
    pub fn problems(&self, view: &StoreView) -> ([usize; 4], Vec<String>) {
        let replies = view.replies();
        let mut tally = [0; 4];
        let mut bad = Vec::new();
        for (id, session) in self.acked() {
            let Some(row) = view.inputs.get(&id) else {
                bad.push(format!(
                    "acknowledged prompt {id} ({session}) is not admitted"
                ));
                continue;
            };
            if row.session != session {
                bad.push(format!(
                    "prompt {id} admitted to {} not {session}",
                    row.session
                ));
            }
            match row.promoted_seq {
                Some(_) => {
                    let message = view.messages.get(&id);
                    let answered = replies.get(&id).copied().unwrap_or(0);
                    if message.is_some_and(|m| m.interrupted) {
                        tally[1] += 1;
                    } else if answered == 1 {
                        tally[0] += 1;
                    } else if answered == 0 && view.aborted_after(&session, row.admitted_seq) {
                        tally[3] += 1;
                    } else {
                        bad.push(format!(
                            "prompt {id} ({session}#{}) promoted, not interrupted, answered \
                             {answered} times",
                            row.admitted_seq
                        ));
                    }
                }
                None if view.interrupted_after(&session, row.admitted_seq) => tally[2] += 1,
                None if view.aborted_after(&session, row.admitted_seq) => tally[3] += 1,
                None => bad.push(format!(
                    "acknowledged prompt {id} ({session}#{}, {}, wake {}) never ran, and no \
                     later interrupt fenced it",
                    row.admitted_seq, row.delivery, row.wake
                )),
            }
        }
        (tally, bad)
    }
}

/// A prompt of `words` words (the echo agent's reply has one more: `echo:`).
pub fn words(words: usize, tag: &str) -> String {
    (0..words)
        .map(|i| format!("{tag}w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}
