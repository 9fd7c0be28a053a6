//! Exponential backoff: `min(initial * multiplier^attempt, max)`, then jitter.

use std::time::Duration;

use rand::RngCore;

use super::jitter::duration_from_nanos;
use super::{Backoff, BackoffError, Jitter, Step};

/// Exponential backoff: wait number `attempt` (0-based) is
/// `min(initial * multiplier^attempt, max)` ([`base_delay`](Exponential::base_delay)),
/// randomised by a [`Jitter`].
///
/// gRPC A6 numbers retries from 1; its retry `n` is `attempt = n - 1` here.
///
/// The jitter is applied *after* the cap, as grpc-go, grpc-java and grpc C-core do, so with
/// [`Jitter::Proportional(f)`](Jitter::Proportional) a delay can reach `max * (1 + f)`;
/// [`Jitter::Full`] and [`Jitter::Equal`] never exceed `max`.
///
/// A `multiplier` below 1 is accepted: the delays then shrink towards zero, which is rarely
/// what a retry loop wants but is a well-defined schedule. A multiplier of 1 gives a
/// constant delay of `initial`.
///
/// Any attempt number is safe: the growth saturates at `max` (never overflowing, never
/// infinite, never NaN), and a call allocates nothing.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::{Backoff, Exponential};
///
/// // The retry policy example of gRPC A6: 0.1 s, x2, at most 1 s, ±20 %.
/// let schedule = Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)?;
/// assert_eq!(schedule.base_delay(0), Duration::from_millis(100));
/// assert_eq!(schedule.base_delay(3), Duration::from_millis(800));
/// assert_eq!(schedule.base_delay(u32::MAX), Duration::from_secs(1));
/// let d = schedule.delay(1);
/// assert!(d >= Duration::from_millis(160) && d <= Duration::from_millis(240));
/// # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exponential {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: Jitter,
}

impl Exponential {
    /// gRFC A6's example schedule: 0.1 s, ×2, at most 1 s, with today's gRPC jitter (±20 %).
    pub(crate) const A6_EXAMPLE: Exponential = Exponential {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        multiplier: 2.0,
        jitter: Jitter::GRPC,
    };

    /// A schedule starting at `initial`, multiplied by `multiplier` at each attempt, capped
    /// at `max`, randomised by `jitter`.
    ///
    /// # Errors
    ///
    /// - [`BackoffError::MultiplierNotFinite`]: `multiplier` is NaN or infinite;
    /// - [`BackoffError::MultiplierNotPositive`]: `multiplier <= 0`;
    /// - [`BackoffError::ZeroMax`]: `max` is zero;
    /// - [`BackoffError::ZeroInitial`]: `initial` is zero;
    /// - [`BackoffError::InitialAboveMax`]: `initial > max`;
    /// - [`BackoffError::JitterFractionOutOfRange`]: a proportional fraction outside `[0, 1]`.
    pub fn new(
        initial: Duration,
        max: Duration,
        multiplier: f64,
        jitter: Jitter,
    ) -> Result<Self, BackoffError> {
        let schedule = Self::a6(initial, max, multiplier, jitter)?;
        if initial > max {
            return Err(BackoffError::InitialAboveMax { initial, max });
        }
        Ok(schedule)
    }

    /// A schedule exactly as gRFC A6 defines it, `min(initial * multiplier^(n-1), max)`,
    /// which also allows `max` below `initial` (service config may say so): every delay is
    /// then capped at `max`, and a multiplier below 1 still shrinks it once
    /// `initial * multiplier^(n-1)` falls under `max`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::backoff::{Exponential, Jitter};
    ///
    /// let s = Exponential::a6(Duration::from_secs(2), Duration::from_secs(1), 0.5, Jitter::None)?;
    /// let delays: Vec<_> = (0..3).map(|n| s.base_delay(n)).collect();
    /// assert_eq!(delays, [Duration::from_secs(1), Duration::from_secs(1), Duration::from_millis(500)]);
    /// # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Exponential::new`], but for `initial > max`.
    pub fn a6(
        initial: Duration,
        max: Duration,
        multiplier: f64,
        jitter: Jitter,
    ) -> Result<Self, BackoffError> {
        if !multiplier.is_finite() {
            return Err(BackoffError::MultiplierNotFinite { multiplier });
        }
        if multiplier <= 0.0 {
            return Err(BackoffError::MultiplierNotPositive { multiplier });
        }
        if max.is_zero() {
            return Err(BackoffError::ZeroMax);
        }
        if initial.is_zero() {
            return Err(BackoffError::ZeroInitial);
        }
        Ok(Self {
            initial,
            max,
            multiplier,
            jitter: jitter.validate()?,
        })
    }

    /// The jitter that grpc-go, grpc-java and grpc C-core apply today (the 2024 revision of
    /// gRPC A6): `min(initial * multiplier^attempt, max) * U(0.8, 1.2)`.
    ///
    /// # Errors
    ///
    /// As [`Exponential::new`].
    pub fn grpc(initial: Duration, max: Duration, multiplier: f64) -> Result<Self, BackoffError> {
        Self::new(initial, max, multiplier, Jitter::GRPC)
    }

    /// The jitter of gRPC A6's 2017 text: `U(0, min(initial * multiplier^attempt, max))`.
    ///
    /// # Errors
    ///
    /// As [`Exponential::new`].
    pub fn grpc_full_jitter(
        initial: Duration,
        max: Duration,
        multiplier: f64,
    ) -> Result<Self, BackoffError> {
        Self::new(initial, max, multiplier, Jitter::Full)
    }

    /// Google's client-library defaults: 0.5 s initial, x1.5, ±50 %, capped at 32 s.
    ///
    /// The initial delay, multiplier and jitter are those of the Google HTTP client
    /// library's `ExponentialBackOff`. That library caps the un-jittered delay at 60 s (and
    /// gives up after 15 minutes); the 32 s cap here is the maximum backoff that Google Cloud
    /// Storage's retry strategy recommends, which keeps a reconnect loop responsive once the
    /// server is back. Build `Exponential::new(500ms, 60s, 1.5, Jitter::Proportional(0.5))`
    /// for the client library's exact cap.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::backoff::{Exponential, Jitter};
    ///
    /// let schedule = Exponential::google();
    /// assert_eq!(schedule.initial(), Duration::from_millis(500));
    /// assert_eq!(schedule.max(), Duration::from_secs(32));
    /// assert_eq!(schedule.jitter(), Jitter::Proportional(0.5));
    /// ```
    pub const fn google() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(32),
            multiplier: 1.5,
            jitter: Jitter::Proportional(0.5),
        }
    }

    /// The same schedule with another jitter.
    ///
    /// # Errors
    ///
    /// [`BackoffError::JitterFractionOutOfRange`]: a proportional fraction outside `[0, 1]`.
    pub fn with_jitter(self, jitter: Jitter) -> Result<Self, BackoffError> {
        Ok(Self {
            jitter: jitter.validate()?,
            ..self
        })
    }

    /// The delay before the first wait, before jitter.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap on the un-jittered delay.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The growth factor between consecutive attempts.
    pub const fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The jitter applied to [`base_delay`](Exponential::base_delay).
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// `min(initial * multiplier^attempt, max)`: the delay for `attempt` before jitter.
    ///
    /// Saturates at `max` for any attempt, however large.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        if attempt == 0 || self.multiplier == 1.0 {
            return self.initial.min(self.max);
        }
        let max_nanos = self.max.as_nanos() as f64;
        // Finite, positive inputs: the product is finite, +inf or 0, never NaN; a NaN would
        // still go to the cap.
        let nanos = self.initial.as_nanos() as f64 * self.multiplier.powf(f64::from(attempt));
        if nanos.is_nan() || nanos >= max_nanos {
            return self.max;
        }
        // Below `max_nanos`, so the cast cannot saturate.
        duration_from_nanos(nanos as u128)
    }
}

impl Backoff for Exponential {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        self.jitter.apply(self.base_delay(step.attempt), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn base_delay_follows_the_a6_example() -> Result<(), BackoffError> {
        let schedule = Exponential::new(ms(100), ms(1000), 2.0, Jitter::None)?;
        let delays: Vec<_> = (0..6).map(|n| schedule.base_delay(n)).collect();
        assert_eq!(
            delays,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        Ok(())
    }

    #[test]
    fn shrinking_schedule_tends_to_zero() -> Result<(), BackoffError> {
        let schedule = Exponential::new(ms(800), ms(1000), 0.5, Jitter::None)?;
        assert_eq!(schedule.base_delay(1), ms(400));
        assert_eq!(schedule.base_delay(3), ms(100));
        assert_eq!(schedule.base_delay(u32::MAX), Duration::ZERO);
        Ok(())
    }

    #[test]
    fn extreme_multipliers_saturate() -> Result<(), BackoffError> {
        let huge = Exponential::new(
            Duration::from_nanos(1),
            Duration::MAX,
            f64::MAX,
            Jitter::None,
        )?;
        assert_eq!(huge.base_delay(1), Duration::MAX);
        assert_eq!(huge.base_delay(u32::MAX), Duration::MAX);
        let tiny = Exponential::new(
            Duration::MAX,
            Duration::MAX,
            f64::MIN_POSITIVE,
            Jitter::None,
        )?;
        assert_eq!(tiny.base_delay(0), Duration::MAX);
        assert_eq!(tiny.base_delay(u32::MAX), Duration::ZERO);
        Ok(())
    }
}
