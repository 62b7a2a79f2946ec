//! The user's side of a turn: the [`Runner`] trait. How a drain ends and how that ending is
//! classified live in `outcome`.

use futures::future::LocalBoxFuture;

use crate::outcome::RunError;
use crate::turn::Turn;

/// Does the actual work of a turn. The runtime calls [`Runner::drain`] once a turn's claim is
/// durable, cancels it by dropping the future, and records how it ended.
///
/// The returned future may be `!Send`: it runs on the actix arbiter of the session's actor.
pub trait Runner: Send + Sync + 'static {
    /// Runs one drain of the session's pending work.
    ///
    /// `turn.is_forced()` is true for an explicit resume or a recovery ("make at least one
    /// attempt even if nothing new is pending") and false for an advisory wake ("drain only if
    /// work exists"); `turn.cause()` says which, and `turn.resumption()` what a recovery resumes.
    fn drain(&self, turn: Turn) -> LocalBoxFuture<'static, Result<(), RunError>>;
}
