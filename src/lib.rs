//! # durable-sessions
//!
//! A crash-safe, one-actor-per-session execution runtime for conversational work (AI-agent
//! sessions, chat bots, long-running jobs), built on actix with an embedded SQLite store.
//!
//! A *session* receives prompts and runs *turns* through your [`Runner`]. A turn is claimed
//! durably before your code runs, so a process that dies mid-turn has the turn resumed on its
//! next boot instead of losing it; every session keeps an ordered, replayable event log.
//!
//! # Quickstart
//!
//! Implement [`Runner`], start a [`Runtime`] on a database file inside an actix `System`, and
//! drive sessions through [`Runtime::sessions`] (create, list, prompt, interrupt, transcripts,
//! event streams) and [`Runtime::execution`] (resume, wake, interrupt, await idle):
//!
//! ```no_run
//! use durable_sessions::{Admission, CreateSession, PromptInput, RunError, Runner, Runtime, Turn};
//! use futures::future::LocalBoxFuture;
//! use futures::FutureExt;
//! use serde_json::json;
//!
//! /// Your agent: answers each prompt of the turn with one assistant message.
//! struct Agent;
//!
//! impl Runner for Agent {
//!     fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>> {
//!         async move {
//!             // The prompts this turn answers, promoted into the transcript. A turn resumed
//!             // after a crash gets again those its killed attempt took and did not answer.
//!             for input in turn.take_inputs().await? {
//!                 let text = call_the_model(&input).await;
//!                 let answer = json!({ "text": text, "reply_to": input.id });
//!                 turn.append_message("assistant", answer).await?;
//!             }
//!             Ok(())
//!         }
//!         .boxed_local()
//!     }
//! }
//!
//! /// Your model call (here, an echo).
//! async fn call_the_model(input: &Admission) -> String {
//!     format!("you said {}", input.prompt)
//! }
//!
//! #[actix_rt::main]
//! async fn main() -> Result<(), durable_sessions::Error> {
//!     let runtime = Runtime::builder()
//!         .database("durable-sessions.db")
//!         .runner(Agent)
//!         .max_resume_attempts(10)
//!         .start() // opens/migrates the file and resumes turns a crash left behind
//!         .await?;
//!     let sessions = runtime.sessions();
//!     let session = sessions
//!         .create(CreateSession { directory: "/srv/app".into(), ..Default::default() })
//!         .await?;
//!     let prompt = PromptInput::new(session.id.clone(), "hello");
//!     let admission = sessions.prompt(prompt).await?; // acknowledged: it will be answered
//!     let outcome = sessions.await_served(&admission).await?;
//!     println!("turn ended: {outcome:?}");
//!     runtime.shutdown().await; // running turns keep their claims for the next boot
//!     Ok(())
//! }
//! ```
//!
//! The module `http` (cargo feature `http`, on by default) serves the same service as JSON over
//! HTTP with Server-Sent Events; `examples/server.rs` is a complete server, and the README walks
//! through it with curl.
//!
//! # Guarantees
//!
//! | what happens | the turn's claim | next boot | recorded |
//! |---|---|---|---|
//! | turn completes | released | nothing to do | `session.execution.succeeded` |
//! | runner returns an error / panics | released | nothing to do | `session.execution.failed` (`provider.*`, `panic`, `unknown`, …) |
//! | user interrupt | released | not resumed | `session.execution.interrupted{user}` |
//! | user interrupt committed, then crash before the turn's terminal (or a racing shutdown) | **kept** | **not resumed**: recorded then, released | `session.execution.interrupted{user}` (by the sweep) |
//! | turn past its deadline (`turn_timeout`, `Turn::set_deadline`) | released | not resumed | `session.execution.interrupted{timeout}` |
//! | graceful shutdown | **kept** | resumed with the continue notice | `session.execution.interrupted{shutdown}` (best effort) |
//! | crash / `SIGKILL` / OOM | **kept** | resumed with the continue notice | nothing (the claim is the record) |
//! | prompt acknowledged (`202`, or `prompt` returned `Ok` with `resume: true`), crash before its turn started | none | **run**, with the continue notice | the admission's wake mark is the record |
//! | crashed more than `max_resume_attempts` times | released | not resumed | `session.execution.failed{aborted}` |
//!
//! What the table promises, in words:
//!
//! - **Acknowledged ⇒ runs.** A prompt admitted with `resume: true` is marked, in the admission's
//!   own transaction, as owed a turn: if the process dies at any instant after the answer, the
//!   next boot runs it without the client sending it again. A prompt admitted with
//!   `resume: false` is only stored (a later turn promotes it).
//! - **Every queued prompt runs, each in its own turn, in order.** After a turn settles, if
//!   `queue` prompts admitted after the last interrupt are still pending (and the turn promoted
//!   something), the session starts the next turn by itself; across a restart too.
//! - **An interrupt sticks, even across a crash.** [`Sessions::interrupt`] either takes effect
//!   or stores nothing and returns an error. Once `session.interrupt.requested` is committed,
//!   the turn it interrupts is never resumed: if the process dies before the turn's terminal, or
//!   a shutdown races the interrupt, the next boot records `interrupted{user}` instead of
//!   resuming it. The prompts of an interrupted turn are marked interrupted in the transcript
//!   ([`Message::interrupted`], `"interrupted": true` over HTTP), so no runner answers them
//!   again.
//! - **A turn past its deadline ends, and frees its session.** With `turn_timeout` set, or a
//!   deadline a drain set with `Turn::set_deadline` (the earlier applies), a turn still running
//!   at its deadline is cancelled and recorded as `interrupted{timeout}`: its claim is released,
//!   its prompts are marked `interrupted`, it is not retried, and the next queued or admitted
//!   prompt runs. The clock starts with the turn's first drain and covers its later drains; it is
//!   kept in memory, so a turn resumed after a restart gets a fresh timeout from its resume.
//! - **A resumed turn knows what it resumes.** [`Turn::cause`] says why a drain runs (a prompt's
//!   wake, an explicit resume, a recovery or a retry) and [`Turn::resumption`], for a turn the
//!   sweep resumed (or a retry), which attempt of how many it is, the seq of its restart notice,
//!   the inputs the killed attempt had promoted and not finished (never one an earlier turn
//!   finished, never one a user interrupted), which [`Turn::take_inputs`] hands out first, and
//!   its ambiguous steps.
//! - **One owner per database file** (below).
//!
//! Recovery is at-least-once: a resumed turn may repeat side effects of its interrupted attempt;
//! the runner is told (the `session.synthetic` notice and [`Turn::resumption`]) so it can
//! continue without repeating work. A side effect run through [`Turn::step`] whose outcome is
//! recorded never runs again in that turn: a later drain gets the recorded outcome back. Only a
//! step cut off inside its body runs again, and its body is told
//! ([`StepContext::previous_attempts`], the idempotency key [`StepContext::key`]);
//! [`Turn::step_once`] refuses to run it again. A failed turn runs again only when retried
//! ([`Sessions::retry`]).
//!
//! One owner per database file: [`RuntimeBuilder::start`] takes an exclusive OS lock on
//! `<database>.lock` before it opens the database and holds it until [`Runtime::shutdown`] (the
//! OS drops it when the process dies, so a restart after a crash is never refused). A second
//! runtime on the same file, in this process or another, fails at once with
//! [`Error::DatabaseInUse`] (naming the holder's pid) and writes nothing. Read-only tools such
//! as `sqlite3` are not blocked.
//!
//! A database that lost its main file is refused: when the SQLite file is missing or empty
//! while its `-wal` beside it holds committed transactions (a bad restore, a damaged copy),
//! [`RuntimeBuilder::start`] fails with [`StoreError::WalWithoutDatabase`], naming both files,
//! before SQLite opens them (SQLite would start an empty database and delete the log). Restore
//! the file, or move the log away to start with an empty database.
//!
//! # Layout
//!
//! Each module owns one thing; the public types are re-exported at the crate root. Only
//! `journal` touches the database: the public handles (`service`, `execution`, `turn`,
//! `runtime`), the restart sweep and the actors (`registry`, `session`) call it with domain
//! types, and `journal` itself imports only the vocabulary all of them share (`records`, `event`,
//! `id`, `error`, `outcome`, `config`) and the test-only crash points.
//!
//! - `journal` (internal): every durable operation, named for what it means to a session
//!   (create it, admit a prompt, request an interrupt, claim and settle a turn, promote, append,
//!   the sweep's plan and writes), and every read, written once over the backend seam
//!   (`journal::backend`: `Store`, the statements; `WriterConnection`, the writer's
//!   transaction control; `Readers`, the read pool — no signature mentions a driver type).
//!   `journal::sqlite` implements the seam over rusqlite (schema migrations, the pool and its
//!   PRAGMAs, every query and projection write); `journal::postgres` (feature `postgres`)
//!   implements it over PostgreSQL for several runtime processes sharing one database
//!   (ownership with fencing epochs, leases, `NOTIFY` routing). The journal alone imports
//!   them. `journal::persistence` is the writer thread that group-commits the requests of many
//!   sessions: a batch runs without savepoints, and again with one per request only when a
//!   request failed. It answers after COMMIT and then broadcasts the committed events.
//! - `cluster` (internal): with PostgreSQL, this node's part in sharing the database: it
//!   carries out what other nodes signal (a wake or interrupt for a session this node owns,
//!   their events for local streams, a lost lease) and takes over dead nodes' turns.
//! - `recovery` (internal): the restart sweep. It resumes every turn an earlier process left
//!   claimed and every session owed a turn (an acknowledged prompt whose turn never started),
//!   counting each attempt durably; aborts turns over budget; records the user interrupts a
//!   crash cut short.
//! - `registry` (internal): which session actor serves which session on which arbiter, the set
//!   of sessions with a turn in this process, and the `Supervisor` actor that passivates idle
//!   actors and, after a wave, has the threads that ran it hand back their allocator caches
//!   (`thread_caches`) before the `after_passivation` hook.
//! - `session` (internal): the `SessionActor`, one per live session, a thin actix shell built
//!   with an `Environment` (journal, runner, boot id, and its registry entry seen through the
//!   `Host` trait, so it imports nothing above it). It loads its session on the journal's
//!   readers before its first message and carries out its coordinator's effects: commits the
//!   claim before calling the runner, runs
//!   the drain as a cancellable future (a panic is recorded as `failed{panic}` and the actor is
//!   replaced), commits the terminal, and starts the next queued prompt's turn.
//!   - `session::coordinator`: the per-session state machine (joiners, doorbell, interrupt
//!     fences, successor turns, the stop barrier) as plain data: no actix and no I/O, so it is
//!     unit- and property-tested on its own.
//! - `outcome`: how a drain ends ([`RunError`], `Exit`) and how that ending is classified
//!   (`terminal`, [`Terminal`]).
//! - `turn`: [`Turn`], what a drain is given: its [`TurnCause`], what it resumes, the writes a
//!   runner makes (promote prompts, append messages, publish events), the transcript reads
//!   (whole, after a cursor, the tail) and live-only events ([`Turn::publish_live`]: to the
//!   session's open streams, never stored). It holds the journal, its session and the sink of
//!   live events (seen through a trait, so it imports nothing above it). Its durable steps
//!   ([`Turn::step`], [`Turn::step_once`]) record their intent and outcome in the turn's ledger.
//! - `step`: what the ledger records of a step ([`StepRecord`], [`StepStatus`]) and what a
//!   step's body is told ([`StepContext`]).
//! - `runner`: the [`Runner`] trait you implement.
//! - `service`: [`Sessions`], the session service: create, list, prompt admission, interrupt
//!   and resume, deletion, transcripts and replay-then-live event streams ([`SessionEvents`],
//!   durable; [`SessionStream`], with live-only events interleaved), fed per session by
//!   `service::fanout` (one dispatcher per runtime for committed events; live-only events go
//!   straight from the publishing drain); every input is validated before anything is read
//!   or written.
//! - `execution`: [`Execution`], the handle that starts, wakes, interrupts and awaits turns by
//!   messaging session actors.
//! - `runtime`: [`Runtime`] and [`RuntimeBuilder`]: take the owner lock, open the journal,
//!   start the arbiters and the registry, run the sweep, shut down gracefully. Each handle holds
//!   only what it uses: [`Sessions`] the journal, an [`Execution`] and the configuration;
//!   [`Execution`] the registry and what a session actor is built with.
//! - `http` (feature `http`): the actix-web adapter: the session service as JSON routes, each
//!   session's event log as Server-Sent Events (tickets for browsers), CORS, and the operator
//!   console at `/console`.
//! - `lock` (internal): the exclusive OS lock on `<database>.lock` that makes one runtime own a
//!   database file.
//! - `records`: the public data types: sessions, list and transcript queries, admissions,
//!   transcript messages, claim state, resumptions.
//! - `event`: the events the runtime publishes itself, typed ([`SessionEvent`]), their wire
//!   names (`kind`), the stored [`EventRecord`] every event becomes, and the [`LiveEvent`] a
//!   runner publishes live only.
//! - `id`: the validated identifiers [`SessionId`] and [`MessageId`].
//! - `error`: [`Error`], the umbrella error of the public API, and [`StoreError`] for the
//!   store (SQLite or PostgreSQL).
//! - `config`: [`RuntimeConfig`], every knob with its documented default, and [`Synchronous`].
//! - `testing`: a [`testing::ScriptedRunner`] and helpers that read (or seed) claims and events
//!   straight from a database file, for your own integration tests.
//! - `crash` (hidden): the named crash points of the crash matrix; they compile to nothing
//!   without the test-only `crash-points` feature.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::print_stdout))]

mod cluster;
mod config;
#[doc(hidden)]
pub mod crash;
mod error;
mod event;
mod execution;
#[cfg(feature = "http")]
pub mod http;
mod id;
mod journal;
mod lock;
mod outcome;
mod records;
mod recovery;
mod registry;
mod runner;
mod runtime;
mod service;
mod session;
mod step;
pub mod testing;
mod thread_caches;
mod turn;

pub use config::{RetainEvents, RuntimeConfig, Synchronous};
pub use error::{DatabaseError, Error, NotRetryable, Result, StoreError, Unavailable};
pub use event::{
    kind, EventRecord, LiveEvent, SessionEvent, ABORTED_MESSAGE, RESTART_NOTICE_DESCRIPTION,
    RESTART_NOTICE_TEXT,
};
pub use execution::{Execution, TurnHandle};
pub use id::{InvalidId, MessageId, SessionId, MAX_ID_BYTES};
pub use journal::{ClaimStats, PersistenceStats};
pub use outcome::{InterruptReason, ProviderErrorKind, RunError, SessionError, Terminal};
pub use records::{
    Admission, Anchor, ClaimState, Cursor, Delivery, Direction, ListQuery, Message, MessagesQuery,
    Order, ParentFilter, Reprojection, Resumption, SessionInfo,
};
pub use recovery::SweepReport;
pub use registry::RegistryStats;
pub use runner::Runner;
pub use runtime::{EventStream, RecvError, Runtime, RuntimeBuilder, RuntimeStats};
pub use service::{
    CreateSession, Creation, PromptInput, SessionEvents, SessionStream, Sessions, StreamItem,
    MAX_JSON_DEPTH, MAX_MODEL_BYTES, MAX_PAGE_SIZE, MAX_TEXT_BYTES,
};
pub use step::{StepContext, StepRecord, StepStatus, TurnSteps};
pub use turn::{Turn, TurnCause, MAX_STEP_RESULT_BYTES};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
