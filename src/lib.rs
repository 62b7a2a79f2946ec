//! # durable-sessions
//!
//! A crash-safe, one-actor-per-session execution runtime for conversational work (AI-agent
//! sessions, chat bots, long-running jobs), built on actix with an embedded SQLite store.
//!
//! # Layout
//!
//! - `store` (private): plain rusqlite functions over a connection or transaction:
//!   schema migrations, the connection pool, and every read and projection write.
//! - `persistence`: the Persistence actor. It owns the pool, runs every write on one writer
//!   thread and group-commits requests from many sessions into one transaction.
//! - `session::coordinator`: the per-session state machine (joiners, doorbell, fences,
//!   successor turns) as plain data, with no actix and no I/O.
//! - `session`: the `SessionActor`, a thin actix shell over the coordinator.
//! - `registry`: the `Supervisor` (spawn on demand, supervise, passivate) and the restart sweep.
//! - `runtime`/`service`: the public handles `Runtime`, `Sessions` and `Execution`.
//! - `lock`: the exclusive lock on `<database>.lock` that makes one runtime own the database.
//!
//! Dependencies point down: service → registry → session → persistence → store.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::print_stdout))]

mod config;
mod core;
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
pub mod testing;
mod turn;

pub use config::{RuntimeConfig, Synchronous};
pub use error::{Error, Result, StoreError};
pub use event::{
    kind, EventRecord, SessionEvent, ABORTED_MESSAGE, RESTART_NOTICE_DESCRIPTION,
    RESTART_NOTICE_TEXT,
};
pub use execution::Execution;
pub use id::{MessageId, SessionId, MAX_ID_BYTES};
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
    CreateSession, Creation, PromptInput, SessionEvents, Sessions, MAX_JSON_DEPTH, MAX_MODEL_BYTES,
    MAX_PAGE_SIZE, MAX_TEXT_BYTES,
};
pub use turn::{Turn, TurnCause};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
