//! A table of delays (seed 002), saturating at its last entry.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;

use super::{Backoff, BackoffError, Jitter, Step};

/// The delays of [`Table::seed_default`], in milliseconds as seed 002 gives them.
static SEED_DEFAULT: [Duration; 10] = [
    Duration::from_millis(0),
    Duration::from_millis(10),
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_millis(500),
    Duration::from_millis(3000),
    Duration::from_millis(3000),
    Duration::from_millis(5000),
];

/// A backoff schedule written out as data: wait `attempt` is entry `attempt` of the table,
/// the last entry for every attempt past the end, randomised by `±50 %`
/// (`d * U(0.5, 1.5)`, [`Jitter::Proportional(0.5)`](Jitter::Proportional)) unless
/// [`with_jitter`](Table::with_jitter) says otherwise. A zero entry stays zero: an attempt
/// that should happen at once does.
///
/// This is the "Simple backoff" policy of seed 002. Cloning is cheap: the entries are shared.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::{Backoff, Table};
///
/// let ms = Duration::from_millis;
/// let schedule = Table::new(vec![ms(0), ms(100), ms(1000)])?;
/// assert_eq!(schedule.delay(0), Duration::ZERO);
/// let d = schedule.delay(1);
/// assert!(d >= Duration::from_millis(50) && d <= Duration::from_millis(150));
/// let late = schedule.delay(1_000); // saturates at the last entry
/// assert!(late >= Duration::from_millis(500) && late <= Duration::from_millis(1500));
/// # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct Table {
    delays: Delays,
    jitter: Jitter,
}

/// Where a table's entries live: built-in tables need no allocation.
#[derive(Clone)]
enum Delays {
    Static(&'static [Duration]),
    Shared(Arc<[Duration]>),
}

impl Delays {
    fn as_slice(&self) -> &[Duration] {
        match self {
            Delays::Static(delays) => delays,
            Delays::Shared(delays) => delays,
        }
    }
}

impl PartialEq for Delays {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Table {
    /// A table of `delays`, jittered by `±50 %`. Accepts a `Vec<Duration>`, a slice, an
    /// array or an `Arc<[Duration]>`.
    ///
    /// # Errors
    ///
    /// [`BackoffError::EmptyTable`] if `delays` is empty.
    pub fn new(delays: impl Into<Arc<[Duration]>>) -> Result<Self, BackoffError> {
        let delays: Arc<[Duration]> = delays.into();
        if delays.is_empty() {
            return Err(BackoffError::EmptyTable);
        }
        Ok(Self {
            delays: Delays::Shared(delays),
            jitter: Jitter::Proportional(0.5),
        })
    }

    /// A table over a `'static` slice, jittered by `±50 %`; it allocates nothing.
    ///
    /// # Errors
    ///
    /// [`BackoffError::EmptyTable`] if `delays` is empty.
    pub const fn from_static(delays: &'static [Duration]) -> Result<Self, BackoffError> {
        if delays.is_empty() {
            return Err(BackoffError::EmptyTable);
        }
        Ok(Self {
            delays: Delays::Static(delays),
            jitter: Jitter::Proportional(0.5),
        })
    }

    /// Seed 002's default policy: 0, 10, 10, 100, 100, 500, 500, 3000, 3000, 5000 ms, each
    /// jittered by `±50 %`, so waits saturate between 2.5 s and 7.5 s.
    pub const fn seed_default() -> Self {
        Self {
            delays: Delays::Static(&SEED_DEFAULT),
            jitter: Jitter::Proportional(0.5),
        }
    }

    /// The same table with another jitter.
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

    /// The table's entries, before jitter. Never empty.
    pub fn delays(&self) -> &[Duration] {
        self.delays.as_slice()
    }

    /// The jitter applied to each entry.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The entry for `attempt` before jitter: entry `attempt`, or the last one past the end.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let delays = self.delays();
        usize::try_from(attempt)
            .ok()
            .and_then(|index| delays.get(index))
            .or_else(|| delays.last())
            .copied()
            .unwrap_or(Duration::ZERO)
    }
}

impl Default for Table {
    /// [`Table::seed_default`].
    fn default() -> Self {
        Self::seed_default()
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("delays", &self.delays())
            .field("jitter", &self.jitter)
            .finish()
    }
}

impl Backoff for Table {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        self.jitter.apply(self.base_delay(step.attempt), rng)
    }
}
