//! A sliding time window of rotating slots, shared by the adaptive hedge delay, the retry and
//! hedge budgets and adaptive throttling; and the same window kept per shard, so that calls
//! on different cores count into different cache lines.

use std::num::NonZero;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// `N` slots covering a window: new samples go to the current slot, and as time passes the
/// oldest slot is cleared and becomes the current one. Memory is fixed whatever the rate.
#[derive(Debug)]
pub(crate) struct Slots<T, const N: usize> {
    slots: [T; N],
    current: usize,
    slot_started: Instant,
    slot_len: Duration,
}

impl<T: Default, const N: usize> Slots<T, N> {
    /// A window of `window`, split into `N` slots, starting now.
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        Slots {
            slots: std::array::from_fn(|_| T::default()),
            current: 0,
            slot_started: now,
            slot_len: window / N as u32,
        }
    }

    /// Clears the slots that time has passed by, and returns the current one.
    pub(crate) fn current(&mut self, now: Instant) -> &mut T {
        let mut steps = 0;
        while now.saturating_duration_since(self.slot_started) >= self.slot_len && steps <= N {
            self.current = (self.current + 1) % N;
            self.slots[self.current] = T::default();
            self.slot_started += self.slot_len;
            steps += 1;
        }
        if steps > N {
            // Idle for longer than the window: every slot is clear; restart the clock.
            self.slot_started = now;
        }
        &mut self.slots[self.current]
    }

    /// Every slot of the window, as of the last [`current`](Slots::current).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter()
    }
}

/// The most shards a window is split into: past this, threads share shards (with 16 the
/// adaptive delay's histograms take about 150 KiB).
const MAX_SHARDS: usize = 16;

/// [`Slots`] kept once per shard: a thread counts into its own shard's current slot, under a
/// lock that only the threads of that shard take, and a reader folds over every slot of
/// every shard. The shards rotate on the same clock, so slot `i` of each covers the same span
/// of time (a shard idle for longer than the window restarts its clock and may lag the
/// others by less than a slot).
///
/// This is what keeps a healthy call from writing a cache line that every core writes: a
/// count per call goes to the caller's shard, and the sums are taken only when someone asks
/// (a retry, a refresh of a percentile).
#[derive(Debug)]
pub(crate) struct ShardedSlots<T, const N: usize> {
    shards: Box<[Shard<T, N>]>,
}

/// One shard, on cache lines of its own (128 bytes: two lines, for the processors that fetch
/// lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Shard<T, const N: usize>(Mutex<Slots<T, N>>);

impl<T: Default, const N: usize> ShardedSlots<T, N> {
    /// A window of `window`, split into `N` slots per shard, starting now; one shard per
    /// core, up to [`MAX_SHARDS`].
    pub(crate) fn new(window: Duration, now: Instant) -> Self {
        Self::with_shards(shard_count(), window, now)
    }

    fn with_shards(shards: usize, window: Duration, now: Instant) -> Self {
        let shards = (0..shards)
            .map(|_| Shard(Mutex::new(Slots::new(window, now))))
            .collect();
        ShardedSlots { shards }
    }

    /// Runs `count` on the current slot of this thread's shard.
    pub(crate) fn count<R>(&self, now: Instant, count: impl FnOnce(&mut T) -> R) -> R {
        let shard = &self.shards[thread_index() % self.shards.len()];
        count(lock(&shard.0).current(now))
    }

    /// Folds `f` over every slot of every shard, each as of `now`.
    pub(crate) fn fold<A>(&self, now: Instant, init: A, mut f: impl FnMut(A, &T) -> A) -> A {
        self.shards.iter().fold(init, |sum, shard| {
            let mut slots = lock(&shard.0);
            slots.current(now);
            slots.iter().fold(sum, &mut f)
        })
    }
}

/// The window's counters are plain numbers: a panic elsewhere cannot leave them inconsistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One shard per core the process may use, rounded up to a power of two.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, NonZero::get);
        cores.next_power_of_two().min(MAX_SHARDS)
    })
}

/// This thread's index, given in the order threads first count: the worker threads of a
/// runtime get consecutive indices, so each counts into a shard of its own.
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|index| *index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_rotate_and_age_out() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut window: Slots<u32, 4> = Slots::new(4 * second, start);
        *window.current(start) += 1;
        *window.current(start + second) += 10;
        assert_eq!(window.iter().sum::<u32>(), 11);
        // Four seconds on, the first slot is reused and cleared.
        *window.current(start + 4 * second) += 100;
        assert_eq!(window.iter().sum::<u32>(), 110);
        // Idle for longer than the window: everything is gone.
        window.current(start + 60 * second);
        assert_eq!(window.iter().sum::<u32>(), 0);
        *window.current(start + 60 * second) += 1;
        *window.current(start + 61 * second) += 1;
        assert_eq!(window.iter().sum::<u32>(), 2);
    }

    #[test]
    fn shards_add_up_to_every_count_made_from_every_thread() {
        // Eight threads on four shards (two per shard, so that shards are shared too), each
        // counting 10 000 times: the fold sees every count, exactly.
        let start = Instant::now();
        let window: ShardedSlots<u64, 4> =
            ShardedSlots::with_shards(4, Duration::from_secs(3600), start);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        window.count(start, |slot| *slot += 1);
                    }
                });
            }
        });
        assert_eq!(window.fold(start, 0, |sum, slot| sum + slot), 80_000);
        // They age out together, a slot at a time.
        let later = start + Duration::from_secs(3600);
        assert_eq!(window.fold(later, 0, |sum, slot| sum + slot), 0);
    }

    #[test]
    fn one_thread_counts_into_one_shard() {
        let start = Instant::now();
        let window: ShardedSlots<u64, 2> =
            ShardedSlots::with_shards(4, Duration::from_secs(10), start);
        for _ in 0..5 {
            window.count(start, |slot| *slot += 1);
        }
        let shards_used = window
            .shards
            .iter()
            .filter(|shard| lock(&shard.0).iter().sum::<u64>() > 0)
            .count();
        assert_eq!(shards_used, 1);
    }
}
