//! Adaptive throttling (the SRE book's client-side throttling, google-cloud-gax's
//! `AdaptiveThrottler`): retries rejected with a probability that grows with the share of
//! answers the server did not accept.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{AuthorityThrottle, RetryThrottle, ThrottleState};
use crate::error::BuildError;
use crate::window::ShardedSlots;

const SLOTS: usize = 10;

/// Requests and accepts in one slot of the window.
#[derive(Debug, Default, Clone, Copy)]
struct SlotCounts {
    requests: u64,
    accepts: u64,
}

/// The answers, counted per core (a success writes nothing other cores write), and the
/// generator of the rejections, drawn from only while some are rejected.
struct Inner {
    window: ShardedSlots<SlotCounts, SLOTS>,
    rng: Mutex<SmallRng>,
}

/// Adaptive throttling: a retry (or hedge) is rejected with probability
///
/// ```text
/// max(0, (requests − k · accepts) / (requests + 1))
/// ```
///
/// where, over a sliding window, `requests` counts the answers the server gave and `accepts`
/// those that were not a retryable failure: successes, and fatal answers (the server took the
/// request and said no, which says nothing against its health). This is the client-side
/// throttling of the SRE book ("Handling Overload") applied to retries, as google-cloud-gax
/// does with its `AdaptiveThrottler`.
///
/// While the server accepts more than `1 / k` of what it is sent (with the default `k = 2`,
/// while fewer than half of the answers are retryable failures), the probability is 0 and
/// every retry the policy wants is sent: a brown-out keeps its retries. Past that share, the
/// rejection grows smoothly; in a full outage `accepts` falls to 0 and the probability tends
/// to `requests / (requests + 1)`, so retries all but stop. The first attempt of a call is
/// never throttled.
///
/// Time is `tokio::time::Instant` (testable on tokio's paused clock). The window is split into
/// 10 slots; the oldest is dropped as time moves on. The random draw comes from a small
/// generator seeded from the thread's generator, or from [`with_seed`](Self::with_seed) for
/// repeatable runs. Cheap to clone; clones share the counts.
///
/// # Adaptive throttle or A6 bucket?
///
/// Both follow the failure rate. The window forgets: after a long healthy period, an outage
/// is only recognised once its failures outweigh the accepts still in the window, so in an
/// abrupt outage retries go on for a part of the window (the brown-out bench in
/// `BENCHMARKS.md` measures it). The A6 [`Throttle`](super::Throttle) with `tokenRatio` 1
/// has the same break-even (it stops once failures outnumber successes) with a memory of
/// `maxTokens / 2` answers rather than a time: see [the guide](crate::guide).
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::throttle::{AdaptiveThrottle, RetryThrottle};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let throttle = AdaptiveThrottle::new(Duration::from_secs(10), 2.0)?.with_seed(7);
/// for _ in 0..3 {
///     throttle.on_failure();
/// }
/// throttle.on_success();
/// throttle.on_fatal(); // the server answered: an accept
/// // 5 requests, 2 accepts: (5 - 2 × 2) / (5 + 1)
/// assert_eq!(throttle.rejection_probability(), 1.0 / 6.0);
///
/// let healthy = AdaptiveThrottle::default();
/// healthy.on_failure();
/// healthy.on_success();
/// assert!(healthy.allows_retry()); // (2 - 2 × 1) / 3 = 0: never rejected
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottle {
    state: Arc<Inner>,
    window: Duration,
    k: f64,
}

impl AdaptiveThrottle {
    /// The default window: 10 s, the window of [`RetryBudget`](super::RetryBudget) and of
    /// tower's `TpsBudget`. (The SRE book counts over 2 minutes; a longer window is slower to
    /// recognise an outage.)
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

    /// The default `k`: 2, the SRE book's and google-cloud-gax's.
    pub const DEFAULT_K: f64 = 2.0;

    /// A throttle over a sliding `window` (1 s to 10 min) with factor `k` (finite, at least
    /// 1: below 1, retries would be rejected while every answer is a success).
    ///
    /// A higher `k` tolerates a larger share of failures before rejecting anything
    /// (`1 − 1/k`: half with 2).
    pub fn new(window: Duration, k: f64) -> Result<AdaptiveThrottle, BuildError> {
        if window < Duration::from_secs(1) || window > Duration::from_secs(600) {
            return Err(BuildError::new("window", "must be between 1 s and 10 min"));
        }
        if !(k.is_finite() && k >= 1.0) {
            return Err(BuildError::new(
                "k",
                "must be a finite number of at least 1",
            ));
        }
        Ok(AdaptiveThrottle::with_rng(
            window,
            k,
            SmallRng::from_rng(&mut rand::rng()),
        ))
    }

    fn with_rng(window: Duration, k: f64, rng: SmallRng) -> AdaptiveThrottle {
        AdaptiveThrottle {
            state: Arc::new(Inner {
                window: ShardedSlots::new(window, Instant::now()),
                rng: Mutex::new(rng),
            }),
            window,
            k,
        }
    }

    /// The same settings with a generator seeded with `seed`, so that the same answers give
    /// the same decisions (for tests and simulations).
    ///
    /// Meant for building: the throttle returned has an empty window and is not shared with
    /// clones of `self`.
    #[must_use]
    pub fn with_seed(self, seed: u64) -> AdaptiveThrottle {
        AdaptiveThrottle::with_rng(self.window, self.k, SmallRng::seed_from_u64(seed))
    }

    /// The length of the sliding window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The factor `k`.
    pub fn k(&self) -> f64 {
        self.k
    }

    fn rng(&self) -> MutexGuard<'_, SmallRng> {
        // A panic elsewhere cannot leave a generator half drawn.
        self.state
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers counted in the window now.
    pub fn requests(&self) -> u64 {
        self.counts().requests
    }

    /// Accepted answers (successes and fatal answers) in the window now.
    pub fn accepts(&self) -> u64 {
        self.counts().accepts
    }

    fn counts(&self) -> SlotCounts {
        self.state
            .window
            .fold(Instant::now(), SlotCounts::default(), |sum, slot| {
                SlotCounts {
                    requests: sum.requests.saturating_add(slot.requests),
                    accepts: sum.accepts.saturating_add(slot.accepts),
                }
            })
    }

    /// The probability that a retry asked for now is rejected:
    /// `max(0, (requests − k · accepts) / (requests + 1))`.
    pub fn rejection_probability(&self) -> f64 {
        probability(self.counts(), self.k)
    }

    fn record(&self, accepted: bool) {
        self.state.window.count(Instant::now(), |slot| {
            slot.requests = slot.requests.saturating_add(1);
            if accepted {
                slot.accepts = slot.accepts.saturating_add(1);
            }
        });
    }
}

fn probability(counts: SlotCounts, k: f64) -> f64 {
    let requests = counts.requests as f64;
    let rejected = (requests - k * counts.accepts as f64) / (requests + 1.0);
    rejected.max(0.0)
}

impl Default for AdaptiveThrottle {
    /// [`DEFAULT_WINDOW`](Self::DEFAULT_WINDOW) and [`DEFAULT_K`](Self::DEFAULT_K).
    fn default() -> Self {
        AdaptiveThrottle::with_rng(
            Self::DEFAULT_WINDOW,
            Self::DEFAULT_K,
            SmallRng::from_rng(&mut rand::rng()),
        )
    }
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = self.counts();
        f.debug_struct("AdaptiveThrottle")
            .field("window", &self.window)
            .field("k", &self.k)
            .field("requests", &counts.requests)
            .field("accepts", &counts.accepts)
            .finish()
    }
}

impl RetryThrottle for AdaptiveThrottle {
    fn on_success(&self) {
        self.record(true);
    }

    fn on_failure(&self) {
        self.record(false);
    }

    fn on_fatal(&self) {
        self.record(true);
    }

    fn allows_retry(&self) -> bool {
        let rejected = probability(self.counts(), self.k);
        // No draw while nothing is rejected: the healthy path takes no random number.
        rejected == 0.0 || self.rng().random::<f64>() >= rejected
    }

    fn state(&self) -> ThrottleState {
        let counts = self.counts();
        ThrottleState::Adaptive {
            requests: counts.requests,
            accepts: counts.accepts,
            rejection_probability: probability(counts, self.k),
        }
    }
}

impl AuthorityThrottle for AdaptiveThrottle {
    fn fresh(&self) -> Self {
        // Seeded from this one's generator, so that a seeded registry stays repeatable.
        let seed = self.rng().random::<u64>();
        AdaptiveThrottle::with_rng(self.window, self.k, SmallRng::seed_from_u64(seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> AdaptiveThrottle {
        AdaptiveThrottle::new(Duration::from_secs(10), 2.0)
            .unwrap()
            .with_seed(1)
    }

    fn answers(throttle: &AdaptiveThrottle, failures: u32, successes: u32, fatal: u32) {
        for _ in 0..failures {
            throttle.on_failure();
        }
        for _ in 0..successes {
            throttle.on_success();
        }
        for _ in 0..fatal {
            throttle.on_fatal();
        }
    }

    #[test]
    fn answers_counted_on_many_threads_add_up_exactly() {
        // Each of four threads counts 1 000 successes, 500 failures and 250 fatal answers,
        // into the shard of its core; the window sees every one.
        let throttle = throttle();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| answers(&throttle, 500, 1_000, 250));
            }
        });
        assert_eq!(throttle.requests(), 4 * 1_750);
        assert_eq!(throttle.accepts(), 4 * 1_250);
        // (7 000 − 2 × 5 000) / 7 001 < 0: nothing is rejected.
        assert_eq!(throttle.rejection_probability(), 0.0);
    }

    #[test]
    fn probability_on_fixed_counts() {
        let cases = [
            // (failures, successes, fatal, k, probability)
            (0, 0, 0, 2.0, 0.0),
            (1, 0, 0, 2.0, 1.0 / 2.0),
            (10, 0, 0, 2.0, 10.0 / 11.0),
            (6, 2, 0, 2.0, 4.0 / 9.0),
            (5, 5, 0, 2.0, 0.0),
            (6, 4, 0, 2.0, 2.0 / 11.0),
            (6, 2, 2, 2.0, 2.0 / 11.0),
            (5, 3, 2, 2.0, 0.0),
            (6, 0, 2, 2.0, 4.0 / 9.0),
            (6, 4, 0, 1.0, 6.0 / 11.0),
            (0, 9, 0, 1.0, 0.0),
            (3, 1, 0, 3.0, 1.0 / 5.0),
        ];
        for (failures, successes, fatal, k, expected) in cases {
            let t = AdaptiveThrottle::new(Duration::from_secs(10), k)
                .unwrap()
                .with_seed(1);
            answers(&t, failures, successes, fatal);
            assert_eq!(t.requests(), u64::from(failures + successes + fatal));
            assert_eq!(t.accepts(), u64::from(successes + fatal));
            assert_eq!(
                t.rejection_probability(),
                expected,
                "{failures} failures, {successes} successes, {fatal} fatal, k {k}"
            );
        }
    }

    #[test]
    fn retries_are_rejected_at_the_probability() {
        // 6 failures and 4 successes: 2/11 of retries rejected.
        let t = throttle();
        answers(&t, 6, 4, 0);
        let draws = 20_000;
        let allowed = (0..draws).filter(|_| t.allows_retry()).count();
        let rejected = 1.0 - allowed as f64 / f64::from(draws);
        assert!((rejected - 2.0 / 11.0).abs() < 0.01, "rejected {rejected}");

        // No accepts: 100 failures reject all but about 1 in 101.
        let t = throttle();
        answers(&t, 100, 0, 0);
        let allowed = (0..draws).filter(|_| t.allows_retry()).count();
        assert!(allowed < 400, "{allowed} of {draws} allowed");
    }

    #[test]
    fn nothing_is_rejected_below_the_break_even() {
        // Half the answers fail: (R - 2 · R/2) = 0, never rejected, whatever the draw.
        let t = throttle();
        answers(&t, 500, 500, 0);
        assert!((0..10_000).all(|_| t.allows_retry()));
    }

    #[test]
    fn same_seed_same_decisions() {
        let decisions = |seed| {
            let t = AdaptiveThrottle::default().with_seed(seed);
            answers(&t, 3, 1, 0);
            (0..64).map(|_| t.allows_retry()).collect::<Vec<_>>()
        };
        assert_eq!(decisions(5), decisions(5));
        assert_ne!(decisions(5), decisions(6));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_expire_with_the_window() {
        let t = throttle();
        answers(&t, 10, 0, 0);
        assert_eq!(t.rejection_probability(), 10.0 / 11.0);

        // Half-way through, new successes join the failures still in the window.
        tokio::time::advance(Duration::from_secs(5)).await;
        answers(&t, 0, 4, 0);
        assert_eq!(t.rejection_probability(), (14.0 - 8.0) / 15.0);

        // The failures' slot leaves the window after 10 s; the successes stay.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!((t.requests(), t.accepts()), (4, 4));
        assert_eq!(t.rejection_probability(), 0.0);

        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(t.requests(), 0);
        assert!(t.allows_retry());
    }

    #[test]
    fn fresh_copies_share_settings_not_counts() {
        let t = throttle();
        answers(&t, 4, 0, 0);
        let fresh = t.fresh();
        assert_eq!((fresh.window(), fresh.k()), (t.window(), t.k()));
        assert_eq!(fresh.requests(), 0);
        fresh.on_failure();
        assert_eq!(t.requests(), 4);
        // A clone shares the counts.
        let clone = t.clone();
        clone.on_failure();
        assert_eq!(t.requests(), 5);
    }

    #[test]
    fn parameters_are_validated() {
        let ten = Duration::from_secs(10);
        assert!(AdaptiveThrottle::new(Duration::from_millis(999), 2.0).is_err());
        assert!(AdaptiveThrottle::new(Duration::from_secs(601), 2.0).is_err());
        assert!(AdaptiveThrottle::new(Duration::from_secs(600), 2.0).is_ok());
        for k in [f64::NAN, f64::INFINITY, 0.0, 0.99, -2.0] {
            assert!(AdaptiveThrottle::new(ten, k).is_err(), "{k}");
        }
        assert!(AdaptiveThrottle::new(ten, 1.0).is_ok());
        let err = AdaptiveThrottle::new(Duration::ZERO, 2.0).unwrap_err();
        assert_eq!(err.to_string(), "window: must be between 1 s and 10 min");
    }

    #[test]
    fn debug_shows_settings_and_counts() {
        let t = throttle();
        answers(&t, 2, 1, 0);
        assert_eq!(
            format!("{t:?}"),
            "AdaptiveThrottle { window: 10s, k: 2.0, requests: 3, accepts: 1 }"
        );
    }
}
