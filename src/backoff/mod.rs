//! Backoff schedules: how long to wait before the next attempt.
//!
//! A schedule is plain data (`Clone + Send + Sync`, nothing mutable, no allocation per call):
//! it turns an attempt number, and for [`Decorrelated`] the previous delay, into a delay. The
//! loop that retries owns the counter; the [guide](crate::guide) says why, and which to pick.
//!
//! # Attempt numbering
//!
//! `attempt` is 0-based: `0` is the first wait. gRPC A6 numbers retries from 1, so its
//! retry `n` waits for `attempt = n - 1`.
//!
//! # Schedules
//!
//! | schedule | un-jittered delay `v` for `attempt` | default jitter |
//! |---|---|---|
//! | [`Exponential`] | `min(initial * multiplier^attempt, max)` | chosen by the constructor |
//! | [`Decorrelated`] | `min(cap, U(base, 3 * previous))` (its own randomness) | — |
//! | [`Table`] | `table[min(attempt, len - 1)]` | `Proportional(0.5)` |
//! | [`Constant`] | `duration` | `None` |
//!
//! # Jitter
//!
//! Jitter spreads clients that failed together so that they do not retry together (the
//! thundering herd). For an un-jittered delay `v`:
//!
//! | [`Jitter`] | delay | mean | range |
//! |---|---|---|---|
//! | `Full` | `U(0, v)` | `v / 2` | `[0, v]` |
//! | `Equal` | `v / 2 + U(0, v / 2)` | `3v / 4` | `[v / 2, v]` |
//! | `Proportional(f)` | `v * U(1 - f, 1 + f)` | `v` | `[v(1 - f), v(1 + f)]` |
//! | `None` | `v` | `v` | `{v}` |
//!
//! For [`Exponential`], jitter is applied after the cap, so `Proportional(f)` can reach
//! `max * (1 + f)`.
//!
//! # Randomness
//!
//! [`Backoff::delay`] and [`Backoff::delay_after`] draw from the thread-local generator
//! (`rand::rng()`). [`Backoff::sample`] takes any `&mut dyn RngCore`: a
//! `rand::rngs::StdRng` built with `SeedableRng::seed_from_u64` gives the same sequence of
//! delays every run (for a given version of `rand`), which makes tests and simulations
//! repeatable.
//!
//! # Examples
//!
//! A default schedule:
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_hedge::backoff::{Backoff, Table};
//!
//! let schedule = Table::seed_default();
//! assert_eq!(schedule.delay(0), Duration::ZERO); // the first attempt goes at once
//! let d = schedule.delay(u32::MAX); // saturates at 5 s ± 50 %
//! assert!(d >= Duration::from_millis(2500) && d <= Duration::from_millis(7500));
//! ```
//!
//! A customised one, sampled from a seeded generator:
//!
//! ```
//! use std::time::Duration;
//! use rand::{SeedableRng, rngs::StdRng};
//! use tower_retry_hedge::backoff::{Backoff, Exponential, Jitter, Step};
//!
//! let schedule = Exponential::new(
//!     Duration::from_millis(50), // initial
//!     Duration::from_secs(2),    // max
//!     3.0,                       // multiplier
//!     Jitter::Equal,             // between v/2 and v
//! )?;
//! let run = |seed| {
//!     let mut rng = StdRng::seed_from_u64(seed);
//!     (0..6).map(|n| schedule.sample(Step::new(n), &mut rng)).collect::<Vec<_>>()
//! };
//! assert_eq!(run(7), run(7)); // repeatable
//! for (n, d) in (0..).zip(run(7)) {
//!     let v = schedule.base_delay(n);
//!     assert!(d >= v / 2 && d <= v);
//! }
//! # Ok::<(), tower_retry_hedge::backoff::BackoffError>(())
//! ```
//!
//! Seed 002's reconnect loop in miniature: a caller-owned counter, a `select!` over a done
//! signal, a reset signal and the backoff sleep (on tokio's paused clock here).
//!
//! ```
//! use std::time::Duration;
//! use tokio::sync::Notify;
//! use tokio::time::{Instant, sleep};
//! use tower_retry_hedge::backoff::{Backoff, Table};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let schedule = Table::seed_default();
//! let (done, reset) = (Notify::new(), Notify::new());
//! let mut refusals = 3; // the server refuses three connections, then accepts
//! let start = Instant::now();
//!
//! let mut attempt: u32 = 0;
//! loop {
//!     tokio::select! {
//!         biased;
//!         _ = done.notified() => break,
//!         _ = reset.notified() => { attempt = 0; continue; }
//!         _ = sleep(schedule.delay(attempt)) => {}
//!     }
//!     if refusals > 0 {
//!         refusals -= 1;
//!         attempt = attempt.saturating_add(1); // wait longer next time
//!         continue;
//!     }
//!     // Connected: use the connection until it fails, then start again from zero.
//!     attempt = 0;
//!     done.notify_one(); // another task would send this in a real program
//! }
//! // Waited 0 ms, then 10, 10 and 100 ms, each ± 50 % (and the timer's 1 ms rounding).
//! let waited = start.elapsed();
//! assert!(waited >= Duration::from_millis(60) && waited <= Duration::from_millis(185));
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;

mod constant;
mod decorrelated;
mod error;
mod exponential;
mod jitter;
mod table;

pub use self::constant::Constant;
pub use self::decorrelated::Decorrelated;
pub use self::error::BackoffError;
pub use self::exponential::Exponential;
pub use self::jitter::Jitter;
pub use self::table::Table;

/// One step of a backoff schedule: what the caller's loop knows when it is about to wait.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::Step;
///
/// assert_eq!(Step::new(0), Step::default());
/// let step = Step::after(3, Duration::from_millis(40));
/// assert_eq!((step.attempt, step.previous), (3, Some(Duration::from_millis(40))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// The wait number, 0-based: 0 is the first wait.
    pub attempt: u32,
    /// The delay of the previous wait, if any. Only [`Decorrelated`] uses it.
    pub previous: Option<Duration>,
}

impl Step {
    /// Wait number `attempt`, with no previous delay known.
    pub const fn new(attempt: u32) -> Self {
        Self {
            attempt,
            previous: None,
        }
    }

    /// Wait number `attempt`, after a wait of `previous`.
    pub const fn after(attempt: u32, previous: Duration) -> Self {
        Self {
            attempt,
            previous: Some(previous),
        }
    }
}

/// A backoff schedule: the delay before each attempt.
///
/// Implementations are plain data, read through `&self`; whatever state a retry loop has
/// (the attempt number, the previous delay) comes in through [`Step`]. The trait is object
/// safe, so a `Box<dyn Backoff>` or `Arc<dyn Backoff>` can hold any schedule, and it is
/// implemented for `&B`, `Box<B>` and `Arc<B>` of any schedule `B`.
///
/// Implementing it takes one method:
///
/// ```
/// use std::time::Duration;
/// use rand::RngCore;
/// use tower_retry_hedge::backoff::{Backoff, Step};
///
/// /// 100 ms more per attempt, at most 1 s.
/// #[derive(Debug)]
/// struct Linear;
///
/// impl Backoff for Linear {
///     fn sample(&self, step: Step, _rng: &mut dyn RngCore) -> Duration {
///         Duration::from_millis(100)
///             .saturating_mul(step.attempt.saturating_add(1))
///             .min(Duration::from_secs(1))
///     }
/// }
///
/// let schedule: Box<dyn Backoff> = Box::new(Linear);
/// assert_eq!(schedule.delay(2), Duration::from_millis(300));
/// assert_eq!(schedule.delay(u32::MAX), Duration::from_secs(1));
/// ```
pub trait Backoff: fmt::Debug + Send + Sync {
    /// The delay for `step`, drawing randomness from `rng`.
    ///
    /// With a seeded generator (`rand::rngs::StdRng::seed_from_u64`) the same steps give the
    /// same delays.
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration;

    /// The delay before wait number `attempt` (0-based: 0 is the first wait), drawn with the
    /// thread-local generator.
    fn delay(&self, attempt: u32) -> Duration {
        self.sample(Step::new(attempt), &mut rand::rng())
    }

    /// The delay before wait number `attempt`, after a wait of `previous`, drawn with the
    /// thread-local generator. Schedules that depend on the previous delay
    /// ([`Decorrelated`]) need this form; the others ignore `previous`.
    fn delay_after(&self, attempt: u32, previous: Duration) -> Duration {
        self.sample(Step::after(attempt, previous), &mut rand::rng())
    }
}

impl<B: Backoff + ?Sized> Backoff for &B {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        (**self).sample(step, rng)
    }

    fn delay(&self, attempt: u32) -> Duration {
        (**self).delay(attempt)
    }

    fn delay_after(&self, attempt: u32, previous: Duration) -> Duration {
        (**self).delay_after(attempt, previous)
    }
}

impl<B: Backoff + ?Sized> Backoff for Box<B> {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        (**self).sample(step, rng)
    }

    fn delay(&self, attempt: u32) -> Duration {
        (**self).delay(attempt)
    }

    fn delay_after(&self, attempt: u32, previous: Duration) -> Duration {
        (**self).delay_after(attempt, previous)
    }
}

impl<B: Backoff + ?Sized> Backoff for Arc<B> {
    fn sample(&self, step: Step, rng: &mut dyn RngCore) -> Duration {
        (**self).sample(step, rng)
    }

    fn delay(&self, attempt: u32) -> Duration {
        (**self).delay(attempt)
    }

    fn delay_after(&self, attempt: u32, previous: Duration) -> Duration {
        (**self).delay_after(attempt, previous)
    }
}
