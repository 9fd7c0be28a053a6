//! A constant delay, optionally jittered.

use std::time::Duration;

use rand::RngCore;

use super::{Backoff, BackoffError, Jitter, Step};

/// The same delay before every attempt, randomised by a [`Jitter`] ([`Jitter::None`] unless
/// [`with_jitter`](Constant::with_jitter) says otherwise). A zero delay retries at once.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::{Backoff, Constant, Jitter};
///
/// let fixed = Constant::new(Duration::from_millis(250));
/// assert_eq!(fixed.delay(7), Duration::from_millis(250));
///
/// let spread = fixed.with_jitter(Jitter::Proportional(0.1))?;
/// let d = spread.delay(7);
/// assert!(d >= Duration::from_millis(225) && d <= Duration::from_millis(275));
/// # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constant {
    duration: Duration,
    jitter: Jitter,
}

impl Constant {
    /// Always `duration`, with no jitter.
    pub const fn new(duration: Duration) -> Self {
        Self {
            duration,
            jitter: Jitter::None,
        }
    }

    /// The same delay with `jitter` applied.
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

    /// The delay before jitter.
    pub const fn duration(&self) -> Duration {
        self.duration
    }

    /// The jitter applied to [`duration`](Constant::duration).
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }
}

impl Backoff for Constant {
    fn sample(&self, _step: Step, rng: &mut dyn RngCore) -> Duration {
        self.jitter.apply(self.duration, rng)
    }
}
