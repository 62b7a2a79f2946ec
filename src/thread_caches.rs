//! Handing back what the runtime's threads keep in their allocator caches after a wave of
//! passivation.
//!
//! Why: glibc malloc (the default allocator of a Rust program on Linux) keeps up to 7 freed
//! chunks of each small size (up to about 1 KiB) in a cache of the thread that freed them
//! (tcache). After a wave those are the last passivated actors' chunks, scattered through the
//! tens of MiB an arbiter's heap grew to, and each keeps its page resident, out of
//! `malloc_trim`'s reach (it trims the heaps, not the threads' caches; only the thread's own
//! allocations or its exit empty them; the `memory` figures are in docs/bench-notes/). So each of
//! those threads allocates 7 blocks of every cached size ([`take`], which empties its cache),
//! and a short-lived thread drops them all and ends ([`give_back`]): its own cache goes back to
//! the heaps as it ends, so every chunk is then an ordinary free chunk, coalesced with its
//! neighbours, that the application's `after_passivation` hook (`malloc_trim`) gives back.
//! With another allocator this is a few hundred allocations and frees once per wave.

/// The cached sizes: requests of 24 to 1,032 bytes, 16 apart (chunks of 32 to 1,040 bytes).
const SIZES: usize = 64;
/// How many chunks of each size a thread's cache holds at most (glibc's default).
const PER_SIZE: usize = 7;

/// Blocks taken out of one thread's allocator cache, to be dropped by [`give_back`].
#[derive(Debug, Default)]
pub(crate) struct Taken(
    #[allow(dead_code, reason = "held only to be dropped on the freeing thread")] Vec<Vec<u8>>,
);

/// Takes [`PER_SIZE`] blocks of every cached size on the calling thread, which empties its
/// cache (blocks the cache lacks come from the heap, and go back to it).
pub(crate) fn take() -> Taken {
    let mut held = Vec::with_capacity(SIZES * PER_SIZE);
    for class in 0..SIZES {
        for _ in 0..PER_SIZE {
            held.push(Vec::with_capacity(24 + 16 * class));
        }
    }
    Taken(held)
}

/// Drops `taken` on a thread of its own, which then ends, and waits for it: the blocks go back
/// to the heaps they came from instead of into a live thread's cache.
pub(crate) fn give_back(taken: Vec<Taken>) {
    let freeing = std::thread::Builder::new()
        .name("durable-sessions-free".into())
        .spawn(move || drop(taken));
    match freeing {
        Ok(thread) => {
            let _ = thread.join();
        }
        // Dropped here instead: into this thread's cache, as before.
        Err(e) => log::warn!("cannot start a thread to free the threads' cached memory: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_every_size_and_gives_back_on_a_thread_that_ends() {
        let taken = take();
        assert_eq!(taken.0.len(), SIZES * PER_SIZE);
        assert!(taken.0.iter().all(|block| block.capacity() >= 24));
        give_back(vec![taken, take(), Taken::default()]);
    }
}
