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
//! - `registry`: the `RegistryActor` (spawn on demand, supervise, passivate) and the restart sweep.
//! - `runtime`/`service`: the public handles `Runtime`, `Sessions` and `Execution`.
//! - `lock`: the exclusive lock on `<database>.lock` that makes one runtime own the database.
//!
//! Dependencies point down: service → registry → session → persistence → store.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::print_stdout))]

pub mod config;
pub(crate) mod core;
#[doc(hidden)]
pub mod crash;
pub mod error;
pub mod event;
pub mod execution;
#[cfg(feature = "http")]
pub mod http;
pub mod id;
pub(crate) mod journal;
pub(crate) mod lock;
pub mod model;
mod outcome;
pub(crate) mod recovery;
pub(crate) mod registry;
pub mod runner;
pub mod runtime;
pub mod service;
pub(crate) mod session;
pub mod testing;
pub mod turn;

pub use config::RuntimeConfig;
pub use config::Synchronous;
pub use error::{Error, Result, StoreError};
pub use event::{EventRecord, SessionEvent};
pub use execution::Execution;
pub use id::{MessageId, SessionId};
pub use journal::{ClaimStats, PersistenceStats};
pub use model::{
    Admission, Anchor, ClaimState, Cursor, Delivery, Direction, ListQuery, Message, MessagesQuery,
    Order, ParentFilter, SessionInfo,
};
pub use model::{Reprojection, Resumption};
pub use outcome::{
    terminal, Exit, InterruptReason, ProviderErrorKind, RunError, SessionError, Terminal,
};
pub use recovery::SweepReport;
pub use registry::RegistryStats;
pub use runner::Runner;
pub use runtime::{EventStream, RecvError, Runtime, RuntimeBuilder, RuntimeStats};
pub use service::{CreateSession, Creation, PromptInput, SessionEvents, Sessions};
pub use turn::{Turn, TurnCause};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
