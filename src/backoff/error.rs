//! The error a backoff constructor returns.

use std::fmt;
use std::time::Duration;

/// Why a backoff schedule could not be built.
///
/// Each variant names the parameter that broke a rule; [`BackoffError::parameter`] gives that
/// name as a string, and `Display` states the rule in lower case.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::backoff::{BackoffError, Exponential};
///
/// let err = Exponential::grpc(Duration::from_secs(2), Duration::from_secs(1), 2.0).unwrap_err();
/// assert_eq!(err.parameter(), "initial");
/// assert_eq!(err.to_string(), "backoff initial (2s) must not exceed max (1s)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum BackoffError {
    /// The multiplier was NaN or infinite.
    MultiplierNotFinite {
        /// The value given.
        multiplier: f64,
    },
    /// The multiplier was zero or negative.
    MultiplierNotPositive {
        /// The value given.
        multiplier: f64,
    },
    /// The initial delay of an exponential schedule was zero.
    ZeroInitial,
    /// The maximum delay of an exponential schedule was zero.
    ZeroMax,
    /// The initial delay was greater than the maximum delay.
    InitialAboveMax {
        /// The initial delay given.
        initial: Duration,
        /// The maximum delay given.
        max: Duration,
    },
    /// The base delay of a decorrelated schedule was zero.
    ZeroBase,
    /// The cap of a decorrelated schedule was zero.
    ZeroCap,
    /// The base delay of a decorrelated schedule was greater than its cap.
    BaseAboveCap {
        /// The base delay given.
        base: Duration,
        /// The cap given.
        cap: Duration,
    },
    /// A table schedule was given no delays.
    EmptyTable,
    /// A proportional jitter fraction was NaN or outside `[0, 1]`.
    JitterFractionOutOfRange {
        /// The value given.
        fraction: f64,
    },
}

impl BackoffError {
    /// The name of the parameter that broke a rule: `"multiplier"`, `"initial"`, `"max"`,
    /// `"base"`, `"cap"`, `"table"` or `"jitter"`.
    pub fn parameter(&self) -> &'static str {
        match self {
            Self::MultiplierNotFinite { .. } | Self::MultiplierNotPositive { .. } => "multiplier",
            Self::ZeroInitial | Self::InitialAboveMax { .. } => "initial",
            Self::ZeroMax => "max",
            Self::ZeroBase | Self::BaseAboveCap { .. } => "base",
            Self::ZeroCap => "cap",
            Self::EmptyTable => "table",
            Self::JitterFractionOutOfRange { .. } => "jitter",
        }
    }
}

impl fmt::Display for BackoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MultiplierNotFinite { multiplier } => {
                write!(f, "backoff multiplier must be finite, got {multiplier}")
            }
            Self::MultiplierNotPositive { multiplier } => {
                write!(
                    f,
                    "backoff multiplier must be greater than zero, got {multiplier}"
                )
            }
            Self::ZeroInitial => f.write_str("backoff initial must be greater than zero"),
            Self::ZeroMax => f.write_str("backoff max must be greater than zero"),
            Self::InitialAboveMax { initial, max } => {
                write!(
                    f,
                    "backoff initial ({initial:?}) must not exceed max ({max:?})"
                )
            }
            Self::ZeroBase => f.write_str("backoff base must be greater than zero"),
            Self::ZeroCap => f.write_str("backoff cap must be greater than zero"),
            Self::BaseAboveCap { base, cap } => {
                write!(f, "backoff base ({base:?}) must not exceed cap ({cap:?})")
            }
            Self::EmptyTable => f.write_str("backoff table must hold at least one delay"),
            Self::JitterFractionOutOfRange { fraction } => write!(
                f,
                "backoff jitter fraction must be within [0, 1], got {fraction}"
            ),
        }
    }
}

impl std::error::Error for BackoffError {}
