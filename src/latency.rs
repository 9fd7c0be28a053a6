//! A latency percentile over a sliding time window, for an adaptive hedging delay.
//!
//! A fixed hedging delay has to be chosen before anyone knows the service's latency, and
//! stays wrong when the latency shifts. [`AdaptiveDelay`] follows a percentile (say p95) of
//! recent successful attempts instead, clamped between a minimum and a maximum, and falls
//! back to a fixed delay until it has seen enough samples.
//!
//! Samples land in a log-scaled histogram (8 buckets per power of two, so a reported value is
//! within 9 % of the true one) kept in 10 time slots that rotate through the window, and old
//! samples age out a slot at a time. Each core records into a window of its own (about 9 KiB
//! each, for up to 16 cores, whatever the call rate), so calls on different cores write
//! nothing they share. The percentile is taken over every core's window at most once per
//! slot, by one caller; every other call reads it from two atomics.
//!
//! Time is `tokio::time::Instant`, so behaviour can be tested on tokio's paused clock.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_hedge::latency::AdaptiveDelay;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let delay = AdaptiveDelay::builder()
//!     .percentile(0.95)
//!     .window(Duration::from_secs(10))
//!     .bounds(Duration::from_millis(1), Duration::from_millis(50))
//!     .min_samples(100)
//!     .fallback(Duration::from_millis(10))
//!     .build()?;
//! assert_eq!(delay.current(), Duration::from_millis(10)); // too few samples yet
//! for i in 0..1000u64 {
//!     delay.record(Duration::from_micros(1000 + i * 10)); // 1 ms .. 11 ms
//! }
//! tokio::time::advance(Duration::from_secs(1)).await;
//! let p95 = delay.current();
//! assert!(p95 >= Duration::from_micros(10_000) && p95 <= Duration::from_micros(11_500), "{p95:?}");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BuildError;
use crate::window::ShardedSlots;

const SLOTS: usize = 10;
const SUB_BUCKETS: u32 = 8;
/// Microsecond values up to 2^28 µs (about 268 s); longer samples land in the last bucket.
const MAX_LOG2: u32 = 28;
const BUCKETS: usize = (MAX_LOG2 * SUB_BUCKETS) as usize;

fn bucket_of(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let log2 = 63 - us.leading_zeros();
    if log2 >= MAX_LOG2 {
        return BUCKETS - 1;
    }
    // The three bits below the leading one pick the sub-bucket.
    let sub = if log2 >= 3 {
        (us >> (log2 - 3)) & 0b111
    } else {
        (us << (3 - log2)) & 0b111
    };
    (log2 * SUB_BUCKETS) as usize + sub as usize
}

/// The upper edge of a bucket, in microseconds.
fn bucket_upper(bucket: usize) -> u64 {
    let log2 = bucket as u32 / SUB_BUCKETS;
    let sub = bucket as u64 % u64::from(SUB_BUCKETS);
    let base = 1u64 << log2;
    base + (base * (sub + 1)) / u64::from(SUB_BUCKETS)
}

/// One slot of the window: a histogram and its total.
#[derive(Debug, Clone)]
struct Histogram {
    counts: [u32; BUCKETS],
    total: u32,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: [0; BUCKETS],
            total: 0,
        }
    }
}

/// The samples, per core, and the percentile last taken from them.
#[derive(Debug)]
struct Window {
    samples: ShardedSlots<Histogram, SLOTS>,
    /// The delay last computed, in nanoseconds plus one; 0 before the first.
    cached: AtomicU64,
    /// Until when the cached delay stands, in nanoseconds since `epoch`.
    valid_until: AtomicU64,
    epoch: Instant,
    /// Held by the one caller that takes the percentile again.
    refresh: Mutex<()>,
}

impl Window {
    fn since_epoch(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.epoch))
    }

    fn cached(&self) -> Option<Duration> {
        match self.cached.load(Ordering::Acquire) {
            0 => None,
            plus_one => Some(Duration::from_nanos(plus_one - 1)),
        }
    }
}

/// `duration` in nanoseconds, saturating (at 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A hedging delay that follows a latency percentile: see [the module docs](self).
///
/// Cheap to clone; clones share the window.
#[derive(Clone)]
pub struct AdaptiveDelay {
    window: Arc<Window>,
    percentile: f64,
    slot_len: Duration,
    min: Duration,
    max: Duration,
    min_samples: u32,
    fallback: Duration,
}

impl fmt::Debug for AdaptiveDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveDelay")
            .field("percentile", &self.percentile)
            .field("window", &(self.slot_len * SLOTS as u32))
            .field("min", &self.min)
            .field("max", &self.max)
            .field("min_samples", &self.min_samples)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl AdaptiveDelay {
    /// A builder: p95 over 10 s, clamped to [1 ms, 1 s], 100 samples before it is used, 10 ms
    /// before that.
    pub fn builder() -> AdaptiveDelayBuilder {
        AdaptiveDelayBuilder {
            percentile: 0.95,
            window: Duration::from_secs(10),
            min: Duration::from_millis(1),
            max: Duration::from_secs(1),
            min_samples: 100,
            fallback: Duration::from_millis(10),
        }
    }

    /// Records the latency of a successful attempt.
    pub fn record(&self, latency: Duration) {
        self.record_at(Instant::now(), latency);
    }

    /// [`record`](AdaptiveDelay::record) at `now`, read by the caller.
    pub(crate) fn record_at(&self, now: Instant, latency: Duration) {
        let bucket = bucket_of(latency);
        self.window.samples.count(now, |slot| {
            slot.counts[bucket] = slot.counts[bucket].saturating_add(1);
            slot.total = slot.total.saturating_add(1);
        });
    }

    /// The delay to use now.
    pub fn current(&self) -> Duration {
        self.current_at(Instant::now())
    }

    /// [`current`](AdaptiveDelay::current) at `now`, read by the caller.
    pub(crate) fn current_at(&self, now: Instant) -> Duration {
        let window = &*self.window;
        let since = window.since_epoch(now);
        if let Some(cached) = window.cached()
            && since < window.valid_until.load(Ordering::Acquire)
        {
            return cached;
        }
        let _refresh = match window.refresh.try_lock() {
            Ok(guard) => guard,
            // Nothing the lock guards can be left half done.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // Another caller takes the percentile now; the value it replaces is a slot old.
            Err(TryLockError::WouldBlock) => return window.cached().unwrap_or(self.fallback),
        };
        let value = self.percentile_now(now);
        window
            .cached
            .store(nanos(value).saturating_add(1), Ordering::Release);
        let slot = nanos(self.slot_len);
        window
            .valid_until
            .store(since.saturating_add(slot), Ordering::Release);
        value
    }

    /// The percentile of every core's samples in the window as of `now`, clamped; the
    /// fallback while there are too few.
    fn percentile_now(&self, now: Instant) -> Duration {
        let (counts, total) =
            self.window
                .samples
                .fold(now, ([0u64; BUCKETS], 0u64), |(mut counts, total), slot| {
                    for (sum, count) in counts.iter_mut().zip(slot.counts) {
                        *sum += u64::from(count);
                    }
                    (counts, total + u64::from(slot.total))
                });
        if total < u64::from(self.min_samples) {
            return self.fallback;
        }
        // The smallest bucket at which the cumulative count reaches the percentile.
        let rank = ((self.percentile * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0u64;
        let found = counts
            .iter()
            .position(|&count| {
                seen += count;
                seen >= rank
            })
            .unwrap_or(BUCKETS - 1);
        Duration::from_micros(bucket_upper(found)).clamp(self.min, self.max)
    }
}

/// Builds an [`AdaptiveDelay`].
#[derive(Debug, Clone)]
pub struct AdaptiveDelayBuilder {
    percentile: f64,
    window: Duration,
    min: Duration,
    max: Duration,
    min_samples: u32,
    fallback: Duration,
}

impl AdaptiveDelayBuilder {
    /// The percentile to follow, in (0, 1]: 0.95 is p95.
    pub fn percentile(mut self, percentile: f64) -> Self {
        self.percentile = percentile;
        self
    }

    /// How far back samples count (at least 10 ms).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The delay never goes below `min` nor above `max`.
    pub fn bounds(mut self, min: Duration, max: Duration) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// Samples in the window before the percentile is trusted.
    pub fn min_samples(mut self, min_samples: u32) -> Self {
        self.min_samples = min_samples;
        self
    }

    /// The delay used until then.
    pub fn fallback(mut self, fallback: Duration) -> Self {
        self.fallback = fallback;
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<AdaptiveDelay, BuildError> {
        if !(self.percentile > 0.0 && self.percentile <= 1.0) {
            return Err(BuildError::new("percentile", "must be in (0, 1]"));
        }
        if self.window < Duration::from_millis(10) {
            return Err(BuildError::new("window", "must be at least 10 ms"));
        }
        if self.min > self.max {
            return Err(BuildError::new("bounds", "min must not exceed max"));
        }
        let now = Instant::now();
        Ok(AdaptiveDelay {
            window: Arc::new(Window {
                samples: ShardedSlots::new(self.window, now),
                cached: AtomicU64::new(0),
                valid_until: AtomicU64::new(0),
                epoch: now,
                refresh: Mutex::new(()),
            }),
            percentile: self.percentile,
            slot_len: self.window / SLOTS as u32,
            min: self.min,
            max: self.max,
            min_samples: self.min_samples,
            fallback: self.fallback,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for us in [
            1u64,
            2,
            3,
            7,
            8,
            9,
            15,
            16,
            100,
            1000,
            1023,
            1024,
            50_000,
            1 << 27,
        ] {
            let b = bucket_of(Duration::from_micros(us));
            assert!(b >= last, "{us}");
            last = b;
            let upper = bucket_upper(b);
            assert!(upper >= us, "{us} <= {upper}");
            assert!(upper as f64 <= us as f64 * 1.13 + 1.0, "{us} vs {upper}");
        }
        assert_eq!(bucket_of(Duration::from_secs(100_000)), BUCKETS - 1);
        assert_eq!(bucket_of(Duration::ZERO), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn falls_back_until_enough_samples_then_follows_the_percentile() {
        let delay = AdaptiveDelay::builder()
            .min_samples(10)
            .fallback(Duration::from_millis(7))
            .bounds(Duration::ZERO, Duration::from_secs(1))
            .build()
            .unwrap();
        for _ in 0..9 {
            delay.record(Duration::from_millis(2));
        }
        assert_eq!(delay.current(), Duration::from_millis(7));
        tokio::time::advance(Duration::from_secs(1)).await;
        delay.record(Duration::from_millis(2));
        let value = delay.current();
        assert!(value >= Duration::from_millis(2) && value <= Duration::from_micros(2300));
    }

    #[tokio::test(start_paused = true)]
    async fn old_samples_age_out_and_bounds_clamp() {
        let delay = AdaptiveDelay::builder()
            .window(Duration::from_secs(10))
            .min_samples(1)
            .bounds(Duration::from_millis(5), Duration::from_millis(20))
            .build()
            .unwrap();
        delay.record(Duration::from_millis(1));
        assert_eq!(delay.current(), Duration::from_millis(5));
        tokio::time::advance(Duration::from_secs(11)).await;
        delay.record(Duration::from_millis(500));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(delay.current(), Duration::from_millis(20));
    }

    #[test]
    fn samples_recorded_on_many_threads_all_count() {
        // Four threads record 900 fast samples (1 ms) and 100 slow ones (50 ms) each, into
        // the windows of their cores: the p90 is the fast bucket and the p95 the slow one,
        // which holds only if all 4 000 samples are summed.
        let build = |percentile| {
            AdaptiveDelay::builder()
                .percentile(percentile)
                .min_samples(4_000)
                .bounds(Duration::ZERO, Duration::from_secs(1))
                .build()
                .unwrap()
        };
        let (p90, p95) = (build(0.9), build(0.95));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for i in 0..1_000 {
                        let latency = Duration::from_millis(if i % 10 == 9 { 50 } else { 1 });
                        p90.record(latency);
                        p95.record(latency);
                    }
                });
            }
        });
        let fast = Duration::from_micros(bucket_upper(bucket_of(Duration::from_millis(1))));
        let slow = Duration::from_micros(bucket_upper(bucket_of(Duration::from_millis(50))));
        assert_eq!((p90.current(), p95.current()), (fast, slow));
    }

    #[test]
    fn builder_rejects_bad_parameters() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        assert!(AdaptiveDelay::builder().percentile(0.0).build().is_err());
        assert!(
            AdaptiveDelay::builder()
                .percentile(f64::NAN)
                .build()
                .is_err()
        );
        assert!(AdaptiveDelay::builder().percentile(1.5).build().is_err());
        assert!(
            AdaptiveDelay::builder()
                .window(Duration::from_millis(1))
                .build()
                .is_err()
        );
        let err = AdaptiveDelay::builder()
            .bounds(Duration::from_secs(2), Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert_eq!(err.to_string(), "bounds: min must not exceed max");
    }
}
