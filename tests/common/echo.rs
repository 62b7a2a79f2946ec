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
    /// Answer each user message through a durable step `reply:<message id>`
    /// ([`durable_sessions::Turn::step`]) whose body records its run as an external effect
    /// ([`StepBody`]: in [`EchoRunner::bodies`], and with `print` as a `STEP_BODY` line), then
    /// append the reply the step returned.
    pub steps: bool,
}

/// One run of a step's body: the external effect of an [`EchoRunner`] with
/// [`EchoOptions::steps`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StepBody {
    pub session: String,
    /// The turn's id ([`durable_sessions::StepContext::turn`]).
    pub turn: u64,
    pub step: String,
    /// What the run was told by [`durable_sessions::StepContext::previous_attempts`].
    pub previous: u32,
}

impl StepBody {
    /// The line a child prints for it: `STEP_BODY <session> <turn> <step> <previous>`.
    pub fn line(&self) -> String {
        format!(
            "STEP_BODY {} {} {} {}",
            self.session, self.turn, self.step, self.previous
        )
    }

    /// The run a `STEP_BODY` line reports.
    pub fn parse(line: &str) -> Option<StepBody> {
        match line.split(' ').collect::<Vec<_>>().as_slice() {
            ["STEP_BODY", session, turn, step, previous] => Some(StepBody {
                session: (*session).to_string(),
                turn: turn.parse().ok()?,
                step: (*step).to_string(),
                previous: previous.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// A runner standing in for an agent: each drain promotes every pending steer prompt, then the
/// oldest pending queue prompt (if any: one per drain), then appends one `assistant` reply
/// (`{"reply_to": <id>}`) for each user message of the transcript that has none yet and that no
/// user interrupted ([`durable_sessions::Message::interrupted`]). Because it replies from the
/// durable transcript, a drain resumed after a crash answers what the crashed one did not, and
/// never answers anything twice. With [`EchoOptions::steps`], each reply is the result of a
/// durable step, so a resumed drain replays a step whose outcome was recorded instead of running
/// its body again.
#[derive(Clone, Default)]
pub struct EchoRunner {
    options: EchoOptions,
    rng: Arc<AtomicU64>,
    /// Drains started, per (session, forced): bounded by the sessions, so a long load run's
    /// memory measures the runtime, not this record.
    drains: Arc<Mutex<BTreeMap<(String, bool), usize>>>,
    /// The step bodies run, in order ([`EchoOptions::steps`]).
    bodies: Arc<Mutex<Vec<StepBody>>>,
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
            bodies: Arc::default(),
        }
    }

    /// The step bodies this runner ran, in order ([`EchoOptions::steps`]).
    pub fn bodies(&self) -> Vec<StepBody> {
        self.bodies.lock().unwrap().clone()
    }

    /// Records one run of a step's body: the external effect.
    fn ran(&self, body: StepBody) {
        if self.options.print {
            say(&body.line());
        }
        self.bodies.lock().unwrap().push(body);
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

impl EchoRunner {
    /// The step `reply:<id>`: its body records its run ([`EchoRunner::ran`]), pauses (a window
    /// between the effect and its recorded outcome) and returns the reply to append.
    async fn reply_step(&self, turn: &Turn, session: &str, id: String) -> Result<Value, RunError> {
        let pause = self.pause();
        turn.step(&format!("reply:{id}"), |ctx| async move {
            self.ran(StepBody {
                session: session.to_string(),
                turn: ctx.turn(),
                step: ctx.name().to_string(),
                previous: ctx.previous_attempts(),
            });
            if let Some(pause) = pause {
                actix_rt::time::sleep(pause).await;
            }
            Ok::<_, std::convert::Infallible>(json!({ "reply_to": id }))
        })
        .await
        .map_err(run_error)
    }
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
                let reply = if this.options.steps {
                    this.reply_step(&turn, &session, id).await?
                } else {
                    json!({ "reply_to": id })
                };
                turn.append_message("assistant", reply)
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
