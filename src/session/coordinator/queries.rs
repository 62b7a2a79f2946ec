//! What the shell asks a coordinator without changing it (whether an execution runs, its
//! phase, the interrupt fence) and the per-execution memory it keeps for the shell.

use super::{Coordinator, Fence, Phase, Seq, Tokens};

impl<T: Tokens, E> Coordinator<T, E> {
    /// Whether an execution exists (starting, draining, stopping or settling).
    pub fn is_active(&self) -> bool {
        self.execution.is_some()
    }

    /// The phase of the current execution, if any.
    pub fn phase(&self) -> Option<Phase> {
        self.execution.as_ref().map(|e| e.phase)
    }

    /// What the shell keeps for the current execution, if one exists.
    pub fn memory(&mut self) -> Option<&mut T::Turn> {
        self.execution.as_mut().map(|e| &mut e.memory)
    }

    /// Whether nothing runs and nobody waits: the shell may passivate.
    pub fn is_quiescent(&self) -> bool {
        // Idle waiters live in the execution, so no execution means nobody waits either.
        self.execution.is_none()
    }

    /// The interrupt fence.
    #[allow(dead_code)]
    pub fn boundary(&self) -> Option<Seq> {
        self.boundary.get()
    }

    /// Whether the scope was closed.
    #[allow(dead_code)]
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether a wake with `seq` would be dropped as stale by the fence.
    pub fn is_stale(&self, seq: Option<Seq>) -> bool {
        match (self.boundary.get(), seq) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(b), Some(s)) => crate::journal::rules::fenced(s, Some(b)),
        }
    }

    /// Raises the interrupt fence (e.g. from a durable interrupt seen elsewhere).
    pub fn raise_boundary(&mut self, seq: Seq) {
        self.boundary = Fence::new(Some(self.boundary.get().map_or(seq, |b| b.max(seq))));
    }
}
