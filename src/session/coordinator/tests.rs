//! Coordinator tests on a deterministic harness: joiners, wakes and the doorbell, interrupts and
//! their fences, cleanup, successor executions, scope close and the `active` snapshot.
//!
//! [`Sim`] plays the shell: it keeps one [`Coordinator`] per key and carries out the effects.
//! Start and settle hooks either complete at once or are held until the test releases them;
//! drains always stay running until the test finishes them; a [`Effect::Cancel`] only marks the
//! drain "cleanup started", and the test decides when cleanup ends (as a runner's own cleanup
//! after a cancellation would) by calling [`Sim::finish_cleanup`].
//!
//! The cases are in the submodules, by subject: `interrupts`, `successors`, `executions`,
//! `timeouts` and `regressions` (found by the property test).

use super::effect::RunAnswer;
use super::Mode;
use crate::outcome::{Exit, InterruptReason, RunError, SessionError, Terminal};

mod sim;

pub(super) use sim::Sim;

const S: &str = "session";

fn succeeded() -> RunAnswer<String> {
    Ok(Terminal::Succeeded)
}

fn interrupted(reason: InterruptReason) -> Terminal {
    Terminal::Interrupted { reason }
}

fn user() -> Terminal {
    interrupted(InterruptReason::User)
}

fn shutdown() -> Terminal {
    interrupted(InterruptReason::Shutdown)
}

fn failed(kind: &str, message: &str) -> Terminal {
    Terminal::Failed {
        error: SessionError::new(kind, message),
    }
}

fn fail(message: &str) -> Exit {
    Exit::Failure(RunError::Other(message.to_owned()))
}

fn defect(message: &str) -> Exit {
    Exit::Failure(RunError::Panic(message.to_owned()))
}

mod executions;
mod healing;
mod interrupts;
mod regressions;
mod successors;
mod timeouts;
