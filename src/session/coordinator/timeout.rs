//! The transition of an execution past its deadline: it stops as `interrupted{timeout}`, and
//! the wakes it had not served yet start its successor.

use super::{Coordinator, Effect, Phase, Tokens};
use crate::outcome::InterruptReason;

impl<T: Tokens, E> Coordinator<T, E> {
    /// The running drain's turn is past its deadline: cancels it, to settle as
    /// `interrupted{timeout}`. Unlike a user interrupt it fences nothing: the wakes rung while
    /// it ran are kept and start a successor once it settled, so a prompt queued behind the
    /// turn runs next. Nothing happens unless a drain runs and no stop is under way (a turn
    /// already stopping, settling or healing keeps its outcome).
    pub fn time_out(&mut self) -> Vec<Effect<T, E>> {
        let Some(e) = &mut self.execution else {
            return Vec::new();
        };
        if e.phase != Phase::Draining || e.stopping || e.healing {
            return Vec::new();
        }
        e.stopping = true;
        e.deliberate = true;
        e.reason = Some(InterruptReason::Timeout);
        // A run that joined an advisory drain is answered with the timeout, not a follow-up.
        e.upgrade = false;
        vec![Effect::Cancel { drain: e.drain }]
    }
}
