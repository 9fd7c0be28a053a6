//! Jitter families and the integer-nanosecond sampling they share.

use std::time::Duration;

use rand::{Rng, RngCore};

use super::BackoffError;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// How a schedule randomises its un-jittered delay `v`.
///
/// | family | delay | mean |
/// |---|---|---|
/// | [`Full`](Jitter::Full) | `U(0, v)` | `v / 2` |
/// | [`Equal`](Jitter::Equal) | `v / 2 + U(0, v / 2)` | `3v / 4` |
/// | [`Proportional(f)`](Jitter::Proportional) | `v * U(1 - f, 1 + f)` | `v` |
/// | [`None`](Jitter::None) | `v` | `v` |
///
/// Sampling is done on whole nanoseconds, both ends included, so `Full` can return zero
/// and `v` itself. Results past [`Duration::MAX`] saturate there.
///
/// `Proportional(f)` requires `f` in `[0, 1]`; the constructors of every schedule check it
/// (and [`Jitter::proportional`] builds a checked one). [`Jitter::apply`] never panics: an
/// unchecked fraction is clamped into `[0, 1]`, and NaN counts as zero.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::Jitter;
///
/// let v = Duration::from_millis(100);
/// let d = Jitter::GRPC.apply(v, &mut rand::rng());
/// assert!(d >= Duration::from_millis(80) && d <= Duration::from_millis(120));
/// assert!(Jitter::proportional(1.5).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// `U(0, v)`: the AWS "full jitter", and the 2017 text of gRPC A6.
    Full,
    /// `v / 2 + U(0, v / 2)`: never waits less than half the delay.
    Equal,
    /// `v * U(1 - f, 1 + f)`, `f` in `[0, 1]`: `±f` around the delay. gRPC uses `0.2`
    /// ([`Jitter::GRPC`]); seed 002's table and Google's client libraries use `0.5`.
    Proportional(f64),
    /// No randomisation: exactly `v`.
    None,
}

impl Jitter {
    /// `Proportional(0.2)`: what grpc-go, grpc-java and grpc C-core apply to retry delays
    /// (the 2024 revision of gRPC A6).
    pub const GRPC: Jitter = Jitter::Proportional(0.2);

    /// A checked `Proportional(fraction)`.
    ///
    /// # Errors
    ///
    /// [`BackoffError::JitterFractionOutOfRange`] if `fraction` is NaN or outside `[0, 1]`.
    pub fn proportional(fraction: f64) -> Result<Self, BackoffError> {
        Jitter::Proportional(fraction).validate()
    }

    /// Returns `self` if it is valid: every family but a `Proportional` whose fraction is NaN
    /// or outside `[0, 1]`.
    ///
    /// # Errors
    ///
    /// [`BackoffError::JitterFractionOutOfRange`] for such a fraction.
    pub fn validate(self) -> Result<Self, BackoffError> {
        match self {
            Jitter::Proportional(fraction) if !(0.0..=1.0).contains(&fraction) => {
                Err(BackoffError::JitterFractionOutOfRange { fraction })
            }
            _ => Ok(self),
        }
    }

    /// Randomises `v` according to this family, drawing from `rng`.
    pub fn apply(self, v: Duration, rng: &mut dyn RngCore) -> Duration {
        let v = v.as_nanos();
        let nanos = match self {
            Jitter::None => v,
            Jitter::Full => uniform_nanos(0, v, rng),
            Jitter::Equal => uniform_nanos(v / 2, v, rng),
            Jitter::Proportional(fraction) => {
                let fraction = if fraction.is_nan() {
                    0.0
                } else {
                    fraction.clamp(0.0, 1.0)
                };
                // `as` saturates; the `min` keeps rounding from pushing the low end below 0.
                let spread = ((v as f64 * fraction) as u128).min(v);
                uniform_nanos(v - spread, v + spread, rng)
            }
        };
        duration_from_nanos(nanos)
    }
}

/// A uniform draw from `lo..=hi` whole nanoseconds (`lo` if `hi <= lo`).
pub(super) fn uniform_nanos(lo: u128, hi: u128, rng: &mut dyn RngCore) -> u128 {
    if hi <= lo {
        return lo;
    }
    // 64-bit sampling covers 584 years and is cheaper than 128-bit.
    match (u64::try_from(lo), u64::try_from(hi)) {
        (Ok(lo), Ok(hi)) => u128::from(rng.random_range(lo..=hi)),
        _ => rng.random_range(lo..=hi),
    }
}

/// `nanos` as a `Duration`, saturating at `Duration::MAX`.
pub(super) fn duration_from_nanos(nanos: u128) -> Duration {
    match u64::try_from(nanos / NANOS_PER_SEC) {
        // The remainder is below 10^9, so it fits and cannot carry into the seconds.
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn duration_from_nanos_round_trips_and_saturates() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::new(1, 999_999_999),
            Duration::MAX,
        ] {
            assert_eq!(duration_from_nanos(d.as_nanos()), d);
        }
        assert_eq!(
            duration_from_nanos(Duration::MAX.as_nanos() + 1),
            Duration::MAX
        );
        assert_eq!(duration_from_nanos(u128::MAX), Duration::MAX);
    }

    #[test]
    fn uniform_nanos_handles_every_width() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(uniform_nanos(5, 5, &mut rng), 5);
        assert_eq!(uniform_nanos(9, 3, &mut rng), 9);
        let edge = u128::from(u64::MAX);
        for (lo, hi) in [(0, edge), (edge - 1, edge + 1), (edge + 1, u128::MAX)] {
            for _ in 0..100 {
                let x = uniform_nanos(lo, hi, &mut rng);
                assert!((lo..=hi).contains(&x), "{x} outside {lo}..={hi}");
            }
        }
    }

    #[test]
    fn apply_never_panics_on_unchecked_fractions() {
        let mut rng = StdRng::seed_from_u64(2);
        let v = Duration::from_secs(10);
        for fraction in [f64::NAN, -1.0, 2.0, f64::INFINITY, f64::NEG_INFINITY] {
            let d = Jitter::Proportional(fraction).apply(v, &mut rng);
            assert!(d <= Duration::from_secs(20));
        }
        assert_eq!(Jitter::Proportional(f64::NAN).apply(v, &mut rng), v);
        let d = Jitter::Proportional(1.0).apply(Duration::MAX, &mut rng);
        assert!(d >= Duration::ZERO);
    }

    #[test]
    fn validate_checks_the_fraction() {
        assert_eq!(Jitter::proportional(0.0), Ok(Jitter::Proportional(0.0)));
        assert_eq!(Jitter::proportional(1.0), Ok(Jitter::Proportional(1.0)));
        assert!(Jitter::proportional(-0.1).is_err());
        assert!(Jitter::proportional(1.1).is_err());
        assert!(Jitter::proportional(f64::NAN).is_err());
        assert_eq!(Jitter::Full.validate(), Ok(Jitter::Full));
    }
}
