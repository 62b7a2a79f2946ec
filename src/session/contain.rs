//! Containing a runner's panics: the drain runs inside `catch_unwind` (see the actor's
//! `run_drain`), and its cancellation, dropping the runner's future, cannot unwind into the
//! actor either.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;

use futures::future::LocalBoxFuture;

/// A drain future whose *drop* (cancellation) cannot unwind into the actor: a panic raised
/// while the runner's future is dropped is caught and logged.
///
/// It is also never polled once its turn cancelled it. actix removes a cancelled future from
/// the actor's context lazily, and one spawned and cancelled while the context was polling
/// another future can still be polled once after the cancellation; by then the turn's terminal
/// may be queued to the writer, and a write that drain started would commit after it.
pub(super) struct DropSafe<T> {
    future: Option<LocalBoxFuture<'static, T>>,
    cancelled: Rc<Cell<bool>>,
}

impl<T> DropSafe<T> {
    /// Wraps `future`; setting `cancelled` (see [`DropSafe::canceller`]) drops it unpolled.
    pub(super) fn new(future: LocalBoxFuture<'static, T>) -> Self {
        DropSafe {
            future: Some(future),
            cancelled: Rc::new(Cell::new(false)),
        }
    }

    /// The flag that cancels this drain: once set, the next poll drops the runner's future
    /// without polling it, and the drain never completes.
    pub(super) fn canceller(&self) -> Rc<Cell<bool>> {
        self.cancelled.clone()
    }

    fn drop_future(&mut self) {
        if let Some(future) = self.future.take() {
            if std::panic::catch_unwind(AssertUnwindSafe(move || drop(future))).is_err() {
                log::error!("a drain panicked while being cancelled; the panic was contained");
            }
        }
    }
}

impl<T> std::future::Future for DropSafe<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        if self.cancelled.get() {
            self.drop_future();
            return std::task::Poll::Pending;
        }
        match self.future.as_mut() {
            Some(future) => future.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

impl<T> Drop for DropSafe<T> {
    fn drop(&mut self) {
        self.drop_future();
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use actix::prelude::*;
    use futures::FutureExt;

    use super::DropSafe;

    /// Spawns a drain from a future's completion, then cancels it from the next message: the
    /// order in which a session actor can start a drain (its claim's answer) and cancel it (an
    /// interrupt waiting in the mailbox) before actix has polled it once.
    struct Host {
        polled: Rc<Cell<bool>>,
        drain: Option<(SpawnHandle, Rc<Cell<bool>>)>,
    }

    impl Actor for Host {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Start;

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Cancel;

    impl Handler<Start> for Host {
        type Result = ();

        fn handle(&mut self, _: Start, ctx: &mut Context<Self>) {
            ctx.spawn(async {}.into_actor(self).map(|(), act, ctx| {
                let polled = act.polled.clone();
                let drain = DropSafe::new(async move { polled.set(true) }.boxed_local());
                let cancelled = drain.canceller();
                let handle = ctx.spawn(drain.into_actor(act));
                act.drain = Some((handle, cancelled));
                // Through the mailbox, which actix serves before it polls the new drain.
                ctx.address().do_send(Cancel);
            }));
        }
    }

    impl Handler<Cancel> for Host {
        type Result = ();

        fn handle(&mut self, _: Cancel, ctx: &mut Context<Self>) {
            if let Some((handle, cancelled)) = self.drain.take() {
                cancelled.set(true);
                ctx.cancel_future(handle);
            }
        }
    }

    #[actix_rt::test]
    async fn a_drain_cancelled_before_its_first_poll_never_runs() {
        let polled = Rc::new(Cell::new(false));
        let host = Host {
            polled: polled.clone(),
            drain: None,
        }
        .start();
        host.send(Start).await.expect("the host handles Start");
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        host.send(Cancel).await.expect("the host is alive");
        assert!(!polled.get(), "the cancelled drain was polled");
    }
}
