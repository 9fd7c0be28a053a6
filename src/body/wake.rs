//! The waker a [`ReplayBody`](super::ReplayBody) hands to its source: it wakes every reader
//! waiting for the source, not only the one that polled it last.

use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Wake, Waker};

/// The readers waiting for the source, each with the waker of its last poll.
///
/// A body remembers only the waker of its last poll. When two readers wait at the front and
/// the source is polled by each in turn, the first one's waker would be lost; and if the reader
/// that polled last is then dropped, or its task stops polling it (hyper waits for HTTP/2 send
/// capacity before it polls a body), nobody would be woken at all. So once any reader has had
/// to wait, the source is always polled with a waker made from this set, and waking it wakes
/// every waiting reader. The set is made by the first poll that returns `Pending` (a source
/// that is always ready never needs it); until then the source is polled with the polling
/// reader's own waker, which is then the only one a wake must reach.
///
/// A reader registers only once the source has returned `Pending`, so that the common case
/// (the source is ready, no one waits) costs no lock; [`Waiters::wakes`] and
/// [`Waiters::register`] close the gap between that poll and the registration.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    waiting: Mutex<Vec<(u64, Waker)>>,
    /// Whether `waiting` may be non-empty; lets the common case (no one waiting) skip the lock.
    any: AtomicBool,
    /// How many times the source has woken this set; changed only under the lock.
    wakes: AtomicU64,
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

    /// The number of source wakes so far; read it before polling the source, and give it to
    /// [`register`](Self::register) if the poll returns `Pending`.
    pub(super) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Acquire)
    }

    /// Registers `waker` for reader `id`, replacing what it registered before, unless the
    /// source has woken since [`wakes`](Self::wakes) returned `seen`: then it returns `false`
    /// and the reader must wake itself, as the wake it waits for has already come.
    ///
    /// The list holds at most one entry per live reader, so it is bounded by the number of
    /// clones the caller made.
    pub(super) fn register(&self, id: u64, waker: &Waker, seen: u64) -> bool {
        let mut waiting = self.lock();
        // Read under the lock, where the source's wake counts: either this reader sees the
        // count change, or the wake comes after the registration and drains it.
        if self.wakes.load(Ordering::Acquire) != seen {
            return false;
        }
        match waiting.iter_mut().find(|(reader, _)| *reader == id) {
            Some((_, registered)) => {
                if !registered.will_wake(waker) {
                    registered.clone_from(waker);
                }
            }
            None => waiting.push((id, waker.clone())),
        }
        self.any.store(true, Ordering::Release);
        true
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

    /// Wakes every waiting reader but `except` (which has just changed the shared state and
    /// needs no wake), and forgets them all.
    ///
    /// The lock-free check of `any` is enough here: readers register under the state lock,
    /// which the caller held when it changed the state.
    pub(super) fn wake_all_except(&self, except: Option<u64>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        self.wake_waiting(except, false);
    }

    /// The source is ready: count the wake and wake every waiting reader.
    fn wake_source(&self) {
        self.wake_waiting(None, true);
    }

    fn wake_waiting(&self, except: Option<u64>, from_source: bool) {
        let waiting = {
            let mut waiting = self.lock();
            if from_source {
                self.wakes.fetch_add(1, Ordering::AcqRel);
            }
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
        self.wake_source();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_source();
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
        assert!(waiters.register(0, &a_waker, 0));
        assert!(waiters.register(1, &b_waker, 0));
        assert!(waiters.register(1, &b_waker, 0));
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
        assert!(waiters.register(0, &a_waker, 0));
        assert!(waiters.register(1, &b_waker, 0));
        assert!(waiters.register(2, &c_waker, 0));
        waiters.remove(1);
        waiters.wake_all_except(Some(2));
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 0);
        assert_eq!(c.0.load(Ordering::SeqCst), 0);
        assert!(!waiters.any.load(Ordering::SeqCst));
    }

    #[test]
    fn a_source_wake_before_registering_is_not_lost() {
        let (waiters, source_waker) = Waiters::new();
        let (a, a_waker) = counting();
        let seen = waiters.wakes();
        // The source wakes after the poll returned `Pending`, before the reader registers.
        source_waker.wake_by_ref();
        assert!(!waiters.register(0, &a_waker, seen));
        assert!(!waiters.any.load(Ordering::SeqCst));
        assert!(waiters.register(0, &a_waker, waiters.wakes()));
        source_waker.wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_new_waker_replaces_the_old_one() {
        let (waiters, _) = Waiters::new();
        let (old, old_waker) = counting();
        let (new, new_waker) = counting();
        assert!(waiters.register(7, &old_waker, 0));
        assert!(waiters.register(7, &new_waker, 0));
        waiters.wake_all_except(None);
        assert_eq!(old.0.load(Ordering::SeqCst), 0);
        assert_eq!(new.0.load(Ordering::SeqCst), 1);
    }
}
