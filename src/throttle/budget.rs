//! A retry budget: retries limited to a ratio of recent calls, plus a floor per second.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::{AuthorityThrottle, RetryThrottle, ThrottleState};
use crate::error::BuildError;
use crate::window::{ShardedSlots, Slots};

const SLOTS: usize = 10;

/// A retry budget (Finagle, Linkerd, tower's `TpsBudget`): over a sliding window, retries may
/// be at most `ratio × calls`, plus `min_per_second` retries per second so that a client with
/// little traffic can still retry.
///
/// It implements [`RetryThrottle`], so it can stand where the A6 [`Throttle`](super::Throttle)
/// stands: `Policies::builder().throttle(budget)`. Time is `tokio::time::Instant`, so it can be
/// tested on tokio's paused clock.
///
/// # Budget or token bucket?
///
/// The A6 bucket reacts to the *failure rate*: it stops retries when failures outnumber
/// successes by the configured ratio, and needs successes to refill. A budget bounds the
/// *extra load* retries may add, whatever the failure rate: with a ratio of 0.2, retries never
/// add more than 20 % to the calls of the last window. Choose the bucket to get gRPC's
/// behaviour from service config; choose a budget when you size capacity by load and want a
/// hard ceiling on retry amplification even while the server half-works.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::throttle::{RetryBudget, RetryThrottle};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5)?;
/// for _ in 0..4 {
///     budget.on_call();
/// }
/// assert!(budget.allows_retry()); // 1 of 2
/// assert!(budget.allows_retry()); // 2 of 2
/// assert!(!budget.allows_retry()); // 4 calls × 0.5 spent
/// # Ok(())
/// # }
/// ```
///
/// Every call counts into a window kept per core, so calls on different cores write nothing
/// they share; a retry sums those windows, and retries themselves count in one window under
/// one lock, so that retries never exceed what the budget allows however many ask at once.
#[derive(Clone)]
pub struct RetryBudget {
    window: Arc<Window>,
    ttl: Duration,
    min_per_second: u32,
    ratio: f64,
}

/// Calls per shard; retries in one window, whose lock is taken by every withdrawal.
#[derive(Debug)]
struct Window {
    calls: ShardedSlots<u64, SLOTS>,
    retries: Mutex<Slots<u64, SLOTS>>,
}

impl Window {
    fn new(ttl: Duration) -> Arc<Window> {
        let now = Instant::now();
        Arc::new(Window {
            calls: ShardedSlots::new(ttl, now),
            retries: Mutex::new(Slots::new(ttl, now)),
        })
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ttl", &self.ttl)
            .field("min_per_second", &self.min_per_second)
            .field("ratio", &self.ratio)
            .finish()
    }
}

impl RetryBudget {
    /// A budget over a window of `ttl` (1 s to 60 s), with a floor of `min_per_second`
    /// retries per second and `ratio` (0 to 1000) retries per call.
    pub fn new(ttl: Duration, min_per_second: u32, ratio: f64) -> Result<RetryBudget, BuildError> {
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(BuildError::new("ttl", "must be between 1 s and 60 s"));
        }
        if !(ratio.is_finite() && (0.0..=1000.0).contains(&ratio)) {
            return Err(BuildError::new(
                "ratio",
                "must be a finite number in [0, 1000]",
            ));
        }
        Ok(RetryBudget {
            window: Window::new(ttl),
            ttl,
            min_per_second,
            ratio,
        })
    }

    /// The window over which calls and retries are counted.
    pub fn window(&self) -> Duration {
        self.ttl
    }

    /// The retries allowed per second whatever the calls.
    pub fn min_per_second(&self) -> u32 {
        self.min_per_second
    }

    /// The retries allowed per call in the window.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The retries' window, locked: a withdrawal holds it from its check to its count.
    fn retries(&self) -> std::sync::MutexGuard<'_, Slots<u64, SLOTS>> {
        // Plain counters: a panic elsewhere cannot leave them inconsistent.
        self.window
            .retries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Retries still allowed now (rounded down).
    pub fn remaining(&self) -> u64 {
        let now = Instant::now();
        let mut retries = self.retries();
        retries.current(now);
        self.available(&retries, now)
    }

    /// Gives back a retry that [`allows_retry`](RetryThrottle::allows_retry) let through
    /// and that was not sent after all.
    pub(crate) fn give_back(&self) {
        let mut retries = self.retries();
        let current = retries.current(Instant::now());
        *current = current.saturating_sub(1);
    }

    /// What the window allows beyond the retries in `retries` (current as of `now`). A call
    /// counted while the shards are summed may be missed: the budget errs on the side of
    /// fewer retries.
    fn available(&self, retries: &Slots<u64, SLOTS>, now: Instant) -> u64 {
        let calls = self.window.calls.fold(now, 0u64, |sum, calls| sum + calls);
        let retries: u64 = retries.iter().sum();
        let floor = u64::from(self.min_per_second).saturating_mul(self.ttl.as_secs());
        let allowed = (calls as f64 * self.ratio) as u64 + floor;
        allowed.saturating_sub(retries)
    }
}

impl RetryThrottle for RetryBudget {
    fn on_call(&self) {
        let now = Instant::now();
        self.window
            .calls
            .count(now, |calls| *calls = calls.saturating_add(1));
    }

    fn on_success(&self) {}

    fn on_failure(&self) {}

    fn allows_retry(&self) -> bool {
        let now = Instant::now();
        let mut retries = self.retries();
        retries.current(now);
        if self.available(&retries, now) == 0 {
            return false;
        }
        let current = retries.current(now);
        *current = current.saturating_add(1);
        true
    }

    fn state(&self) -> ThrottleState {
        ThrottleState::Budget {
            remaining: self.remaining(),
        }
    }
}

impl AuthorityThrottle for RetryBudget {
    fn fresh(&self) -> Self {
        RetryBudget {
            window: Window::new(self.ttl),
            ttl: self.ttl,
            min_per_second: self.min_per_second,
            ratio: self.ratio,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ratio_of_calls_in_the_window() {
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.2).unwrap();
        for _ in 0..10 {
            budget.on_call();
        }
        assert_eq!(budget.remaining(), 2);
        assert!(budget.allows_retry());
        assert!(budget.allows_retry());
        assert!(!budget.allows_retry());
        // The calls age out with the window; so do the retries.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(budget.remaining(), 0);
        budget.on_call();
        budget.on_call();
        budget.on_call();
        budget.on_call();
        budget.on_call();
        assert!(budget.allows_retry());
        assert!(!budget.allows_retry());
    }

    #[tokio::test(start_paused = true)]
    async fn floor_per_second_without_traffic() {
        let budget = RetryBudget::new(Duration::from_secs(2), 3, 0.0).unwrap();
        for _ in 0..6 {
            assert!(budget.allows_retry());
        }
        assert!(!budget.allows_retry());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(budget.remaining(), 6);
    }

    #[test]
    fn parameters_are_validated() {
        let ttl = Duration::from_secs(10);
        assert!(RetryBudget::new(Duration::from_millis(10), 1, 0.1).is_err());
        assert!(RetryBudget::new(Duration::from_secs(61), 1, 0.1).is_err());
        assert!(RetryBudget::new(ttl, 1, f64::NAN).is_err());
        assert!(RetryBudget::new(ttl, 1, -0.1).is_err());
        let err = RetryBudget::new(ttl, 1, f64::INFINITY).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ratio: must be a finite number in [0, 1000]"
        );
    }

    #[test]
    fn concurrent_calls_and_retries_never_exceed_the_budget() {
        // Four threads each count 1 000 calls and ask for 200 retries, interleaved; at 10 %
        // with no floor, no more than 400 are allowed, and once every call is in, exactly
        // 400 in all.
        let budget = RetryBudget::new(Duration::from_secs(60), 0, 0.1).unwrap();
        let granted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for i in 0..1_000 {
                        budget.on_call();
                        if i % 5 == 4 && budget.allows_retry() {
                            granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let granted = granted.into_inner();
        assert!(granted <= 400, "{granted} retries for 4 000 calls at 10 %");
        // What was refused while calls were still coming in is allowed now.
        let mut more = 0;
        while budget.allows_retry() {
            more += 1;
        }
        assert_eq!(granted + more, 400);
        assert_eq!(budget.remaining(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_copies_start_empty() {
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
        budget.on_call();
        budget.on_call();
        let fresh = budget.fresh();
        assert_eq!((budget.remaining(), fresh.remaining()), (1, 0));
        fresh.on_call();
        fresh.on_call();
        assert!(fresh.allows_retry());
        assert_eq!(budget.remaining(), 1);
    }
}
