//! The waker a [`ReplayBody`](super::ReplayBody) hands to its source: it wakes every reader
//! waiting for the source, not only the one that polled it last.

use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Wake, Waker};

/// The readers waiting for the source, each with the waker of its last poll.
///
/// A body remembers only the waker of its last poll. When two readers wait at the front and
/// the source is polled by each in turn, the first one's waker would be lost; and if the reader
/// that polled last is then dropped, or its task stops polling it (hyper waits for HTTP/2 send
/// capacity before it polls a body), nobody would be woken at all. So the source is always
/// polled with a waker made from this set, and waking it wakes every waiting reader.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    waiting: Mutex<Vec<(u64, Waker)>>,
    /// Whether `waiting` may be non-empty; lets the common case (no one waiting) skip the lock.
    any: AtomicBool,
}

impl Waiters {
    /// A new set and the waker to poll the source with.
    pub(super) fn new() -> (Arc<Waiters>, Waker) {
        let waiters = Arc::new(Waiters::default());
        let waker = Waker::from(Arc::clone(&waiters));
        (waiters, waker)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(u64, Waker)>> {
        // The lock is never held across user code, so a poisoned lock holds a valid list.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `waker` for reader `id`, replacing what it registered before.
    ///
    /// The list holds at most one entry per live reader, so it is bounded by the number of
    /// clones the caller made.
    pub(super) fn register(&self, id: u64, waker: &Waker) {
        let mut waiting = self.lock();
        match waiting.iter_mut().find(|(reader, _)| *reader == id) {
            Some((_, registered)) => {
                if !registered.will_wake(waker) {
                    registered.clone_from(waker);
                }
            }
            None => waiting.push((id, waker.clone())),
        }
        self.any.store(true, Ordering::Release);
    }

    /// Forgets reader `id` (it was dropped).
    pub(super) fn remove(&self, id: u64) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut waiting = self.lock();
        waiting.retain(|(reader, _)| *reader != id);
        self.any.store(!waiting.is_empty(), Ordering::Release);
    }

    /// Wakes every waiting reader but `except`, and forgets them all.
    pub(super) fn wake_all_except(&self, except: Option<u64>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let waiting = {
            let mut waiting = self.lock();
            self.any.store(false, Ordering::Release);
            mem::take(&mut *waiting)
        };
        // Woken outside the lock: a waker may run arbitrary code.
        for (reader, waker) in waiting {
            if Some(reader) != except {
                waker.wake();
            }
        }
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_all_except(None);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all_except(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (Arc::clone(&count), Waker::from(count))
    }

    #[test]
    fn source_waker_wakes_every_waiter_once() {
        let (waiters, source_waker) = Waiters::new();
        let (a, a_waker) = counting();
        let (b, b_waker) = counting();
        waiters.register(0, &a_waker);
        waiters.register(1, &b_waker);
        waiters.register(1, &b_waker);
        source_waker.wake_by_ref();
        source_waker.wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn removed_and_excepted_readers_are_not_woken() {
        let (waiters, _) = Waiters::new();
        let (a, a_waker) = counting();
        let (b, b_waker) = counting();
        let (c, c_waker) = counting();
        waiters.register(0, &a_waker);
        waiters.register(1, &b_waker);
        waiters.register(2, &c_waker);
        waiters.remove(1);
        waiters.wake_all_except(Some(2));
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 0);
        assert_eq!(c.0.load(Ordering::SeqCst), 0);
        assert!(!waiters.any.load(Ordering::SeqCst));
    }

    #[test]
    fn a_new_waker_replaces_the_old_one() {
        let (waiters, _) = Waiters::new();
        let (old, old_waker) = counting();
        let (new, new_waker) = counting();
        waiters.register(7, &old_waker);
        waiters.register(7, &new_waker);
        waiters.wake_all_except(None);
        assert_eq!(old.0.load(Ordering::SeqCst), 0);
        assert_eq!(new.0.load(Ordering::SeqCst), 1);
    }
}
