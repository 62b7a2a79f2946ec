//! One stream's queue of routed events: the dispatcher (or a publishing drain) pushes, the
//! stream pops. A bounded channel with one sender and one receiver, and no more: a mutex over
//! a `VecDeque` and the receiver's waker, about 100 bytes per stream (a tokio `mpsc` channel
//! costs over a kilobyte, cache-padded, with its first block of slots allocated up front) and
//! no allocation until events come. Pushing wakes the stream only if it waits: a burst of
//! events costs one wake.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// What both ends share.
struct State<T> {
    items: VecDeque<T>,
    /// The receiver, when it waits.
    waker: Option<Waker>,
    /// The sender is gone: the receiver gets `None` once it took what is left.
    closed: bool,
}

type Shared<T> = Arc<Mutex<State<T>>>;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, State<T>> {
    // Nothing panics while the lock is held; a poisoned queue is still consistent.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Items a queue keeps room for once it is empty again; a larger buffer (a burst) is given
/// back.
const KEEP_CAPACITY: usize = 8;

/// The pushing end; dropping it closes the queue.
pub(super) struct Sender<T> {
    shared: Shared<T>,
    bound: usize,
}

/// The popping end.
pub(super) struct Receiver<T> {
    shared: Shared<T>,
}

/// Why [`Sender::try_send`] failed.
pub(super) enum TrySendError {
    /// `bound` items wait already.
    Full,
    /// The receiver is gone.
    Closed,
}

/// A queue holding at most `bound` items.
pub(super) fn channel<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(State {
        items: VecDeque::new(),
        waker: None,
        closed: false,
    }));
    (
        Sender {
            shared: shared.clone(),
            bound,
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Pushes `item` and wakes the receiver if it waits.
    pub(super) fn try_send(&self, item: T) -> Result<(), TrySendError> {
        if Arc::strong_count(&self.shared) == 1 {
            return Err(TrySendError::Closed);
        }
        let waker = {
            let mut state = lock(&self.shared);
            if state.items.len() >= self.bound {
                return Err(TrySendError::Full);
            }
            state.items.push_back(item);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.shared);
            state.closed = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item; `None` once the sender is gone and every item was taken.
    pub(super) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = lock(&self.shared);
        if let Some(item) = state.items.pop_front() {
            if state.items.is_empty() && state.items.capacity() > KEEP_CAPACITY {
                state.items.shrink_to(KEEP_CAPACITY);
            }
            return Poll::Ready(Some(item));
        }
        if state.closed {
            return Poll::Ready(None);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn bounded_fifo_that_wakes_a_waiting_receiver_once_and_closes_with_its_sender() {
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let (tx, mut rx) = channel(2);
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert!(tx.try_send(1).is_ok());
        assert!(tx.try_send(2).is_ok());
        assert!(matches!(tx.try_send(3), Err(TrySendError::Full)));
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
        drop(tx);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(None));
        let (tx, rx) = channel::<u8>(2);
        drop(rx);
        assert!(matches!(tx.try_send(1), Err(TrySendError::Closed)));
    }
}
