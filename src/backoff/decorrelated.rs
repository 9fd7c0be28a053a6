//! Decorrelated jitter: `min(cap, U(base, 3 * previous))`.

use std::time::Duration;

use rand::RngCore;

use super::jitter::{duration_from_nanos, uniform_nanos};
use super::{Backoff, BackoffError, Step};

/// Decorrelated jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): each delay
/// is drawn from `U(base, 3 * previous)` and capped at `cap`.
///
/// The schedule grows from the previous *delay*, not from the attempt number, so the caller
/// keeps the previous delay next to its attempt counter and passes it through
/// [`Step::after`] or [`Backoff::delay_after`]. With no previous delay (the first wait,
/// [`Backoff::delay`], or [`Step::new`]) the previous delay is taken to be `base`, so the
/// first wait is `U(base, 3 * base)`. A previous delay below `base` also counts as `base`:
/// every result lies in `[base, cap]`.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::{Backoff, Decorrelated};
///
/// let schedule = Decorrelated::new(Duration::from_millis(10), Duration::from_secs(1))?;
/// let mut previous = schedule.delay(0);
/// assert!(previous >= Duration::from_millis(10) && previous <= Duration::from_millis(30));
/// for attempt in 1..20 {
///     let next = schedule.delay_after(attempt, previous);
///     let hi = (previous * 3).min(Duration::from_secs(1));
///     assert!(next >= Duration::from_millis(10) && next <= hi);
///     previous = next;
/// }
/// # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decorrelated {
    base: Duration,
    cap: Duration,
}

impl Decorrelated {
    /// A decorrelated schedule between `base` and `cap`.
    ///
    /// # Errors
    ///
    /// - [`BackoffError::ZeroCap`]: `cap` is zero;
    /// - [`BackoffError::ZeroBase`]: `base` is zero (the schedule would never leave zero);
    /// - [`BackoffError::BaseAboveCap`]: `base > cap`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, BackoffError> {
        if cap.is_zero() {
            return Err(BackoffError::ZeroCap);
        }
        if base.is_zero() {
            return Err(BackoffError::ZeroBase);
        }
        if base > cap {
            return Err(BackoffError::BaseAboveCap { base, cap });
        }
        Ok(Self { base, cap })
    }

    /// The smallest delay, and the previous delay assumed for the first wait.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay.
    pub const fn cap(&self) -> Duration {
        self.cap
    }
}

impl Backoff for Decorrelated {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        let previous = step.previous.unwrap_or(self.base).max(self.base);
        let lo = self.base.as_nanos();
        // At most 3 * Duration::MAX in nanoseconds: fits a u128 with room to spare.
        let hi = previous.as_nanos() * 3;
        duration_from_nanos(uniform_nanos(lo, hi, rng)).min(self.cap)
    }
}
