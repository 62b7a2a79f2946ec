//! A runner standing in for an agent, for the reliability suites.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_sessions::{RunError, Runner, Turn};
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use super::{say, splitmix};

/// What an [`EchoRunner`] does, besides promoting and replying.
#[derive(Debug, Clone, Default)]
pub struct EchoOptions {
    /// Print `DRAIN <session> <forced>` when a drain starts (child processes).
    pub print: bool,
    /// After promoting and at most one reply, print `MID_DRAIN <session>` and block forever.
    pub mid_drain: bool,
    /// Pause up to this many microseconds between steps (seeded), to widen race windows.
    pub jitter_us: u64,
    /// Seed of the pauses.
    pub seed: u64,
}

/// A runner standing in for an agent: each drain promotes every pending steer prompt, then the
/// oldest pending queue prompt (if any: one per drain), then appends one `assistant` reply
/// (`{"reply_to": <id>}`) for each user message of the transcript that has none yet and that no
/// user interrupted ([`durable_sessions::Message::interrupted`]). Because it replies from the
/// durable transcript, a drain resumed after a crash answers what the crashed one did not, and
/// never answers anything twice.
#[derive(Clone, Default)]
pub struct EchoRunner {
    options: EchoOptions,
    rng: Arc<AtomicU64>,
    /// Drains started, per (session, forced): bounded by the sessions, so a long load run's
    /// memory measures the runtime, not this record.
    drains: Arc<Mutex<BTreeMap<(String, bool), usize>>>,
}

impl std::fmt::Debug for EchoRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoRunner")
            .field("options", &self.options)
            .finish()
    }
}

impl EchoRunner {
    pub fn new(options: EchoOptions) -> Self {
        let rng = Arc::new(AtomicU64::new(splitmix(options.seed) | 1));
        Self {
            options,
            rng,
            drains: Arc::default(),
        }
    }

    /// How many drains started, per (session, forced).
    pub fn drains(&self) -> BTreeMap<(String, bool), usize> {
        self.drains.lock().unwrap().clone()
    }

    fn pause(&self) -> Option<Duration> {
        if self.options.jitter_us == 0 {
            return None;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        Some(Duration::from_micros(x % (self.options.jitter_us + 1)))
    }
}

fn run_error(e: durable_sessions::Error) -> RunError {
    RunError::Other(e.to_string())
}

/// The user messages of `turn`'s transcript that have no assistant reply yet, in order, less
/// those a user interrupted (marked [`durable_sessions::Message::interrupted`]): an interrupted
/// prompt is never answered again.
pub async fn unreplied(turn: &Turn) -> Result<Vec<String>, RunError> {
    let context = turn.context().await.map_err(run_error)?;
    let replied: BTreeSet<String> = context
        .iter()
        .filter(|m| m.kind == "assistant")
        .filter_map(|m| {
            m.data
                .get("reply_to")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    Ok(context
        .iter()
        .filter(|m| m.kind == "user" && !m.interrupted && !replied.contains(m.id.as_str()))
        .map(|m| m.id.to_string())
        .collect())
}

impl Runner for EchoRunner {
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
        let session = turn.session_id().to_string();
        *self
            .drains
            .lock()
            .unwrap()
            .entry((session.clone(), turn.is_forced()))
            .or_insert(0) += 1;
        if self.options.print {
            say(&format!("DRAIN {session} {}", turn.is_forced()));
        }
        let this = self.clone();
        async move {
            if let Some(pause) = this.pause() {
                actix_rt::time::sleep(pause).await;
            }
            turn.promote_steer(None).await.map_err(run_error)?;
            turn.promote_queue().await.map_err(run_error)?;
            let todo = unreplied(&turn).await?;
            let take = if this.options.mid_drain {
                1
            } else {
                todo.len()
            };
            for id in todo.into_iter().take(take) {
                if let Some(pause) = this.pause() {
                    actix_rt::time::sleep(pause).await;
                }
                turn.append_message("assistant", json!({ "reply_to": id }))
                    .await
                    .map_err(run_error)?;
            }
            if this.options.mid_drain {
                say(&format!("MID_DRAIN {session}"));
                futures::future::pending::<()>().await;
            }
            Ok(())
        }
        .boxed_local()
    }
}
