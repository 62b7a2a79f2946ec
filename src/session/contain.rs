//! Containing a runner's panics: the drain runs inside `catch_unwind` (see the actor's
//! `run_drain`), and its cancellation, dropping the runner's future, cannot unwind into the
//! actor either.

use std::panic::AssertUnwindSafe;

use futures::future::LocalBoxFuture;

/// A drain future whose *drop* (cancellation) cannot unwind into the actor: a panic raised
/// while the runner's future is dropped is caught and logged.
pub(super) struct DropSafe<T>(pub(super) Option<LocalBoxFuture<'static, T>>);

impl<T> std::future::Future for DropSafe<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        match self.0.as_mut() {
            Some(future) => future.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

impl<T> Drop for DropSafe<T> {
    fn drop(&mut self) {
        if let Some(future) = self.0.take() {
            if std::panic::catch_unwind(AssertUnwindSafe(move || drop(future))).is_err() {
                log::error!("a drain panicked while being cancelled; the panic was contained");
            }
        }
    }
}

/// The message a panic was raised with, for the `Failed{kind: "panic"}` it is recorded as.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
