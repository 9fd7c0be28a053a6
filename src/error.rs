//! Errors the layers make themselves. Errors of the inner service pass through unchanged
//! (boxed as [`BoxError`], so they can be downcast).

use crate::metadata::Attempts;
use std::fmt;

/// The boxed error the layers return: the inner service's error, unchanged inside the box,
/// or one of the layers' own errors (this module's).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A setting given in code that breaks a rule, from the builders and constructors of
/// policies, budgets, throttles and the adaptive delay: it names the setting and the rule.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::throttle::{AdaptiveThrottle, RetryBudget};
///
/// let err = AdaptiveThrottle::new(Duration::from_secs(10), 0.5).unwrap_err();
/// assert_eq!(err.field(), "k");
/// assert_eq!(err.to_string(), "k: must be a finite number of at least 1");
///
/// let err = RetryBudget::new(Duration::from_secs(10), 10, f64::NAN).unwrap_err();
/// assert_eq!(err.field(), "ratio");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildError {
    field: &'static str,
    rule: &'static str,
}

impl BuildError {
    pub(crate) fn new(field: &'static str, rule: &'static str) -> BuildError {
        BuildError { field, rule }
    }

    /// The setting that was wrong, by its builder method's or parameter's name, such as
    /// `max_attempts`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The rule it broke, such as `must be at least 2`.
    pub fn rule(&self) -> &'static str {
        self.rule
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for BuildError {}

/// The call's deadline passed before an attempt succeeded.
///
/// For gRPC requests with the `tonic` feature, the layers return a
/// `tonic::Status::deadline_exceeded` instead, which tonic's client reports as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlineExceeded(());

impl DeadlineExceeded {
    pub(crate) fn new() -> DeadlineExceeded {
        DeadlineExceeded(())
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("call deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// An attempt outlived the policy's per-attempt timeout and was cancelled. Retryable; it is
/// returned only when no attempt is left.
///
/// For gRPC requests with the `tonic` feature, the layers return a `tonic::Status` with
/// code `CANCELLED` whose source is this error, as gRPC C-core ends a call whose last
/// attempt outlived the service config's `perAttemptRecvTimeout`; whether the timeout came
/// from the service config or from
/// [`per_attempt_timeout`](crate::policy::RetryPolicyBuilder::per_attempt_timeout), the
/// outcome is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttemptTimedOut(());

impl AttemptTimedOut {
    pub(crate) fn new() -> AttemptTimedOut {
        AttemptTimedOut(())
    }
}

/// The message of the status a gRPC call ends with when its last attempt timed out.
#[cfg(any(feature = "tonic", feature = "grpc"))]
pub(crate) const ATTEMPT_TIMED_OUT: &str = "per-attempt timeout exceeded";

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("attempt timed out")
    }
}

impl std::error::Error for AttemptTimedOut {}

/// The error of every call a layer drove: the last attempt's error (or the layer's own, such
/// as [`DeadlineExceeded`]), with the [`Attempts`] made, whatever their number, so that the
/// type a caller matches on does not change the first time a call retries. Never nested: an
/// error that is an `Attempted` already is returned as it is.
///
/// Find it by downcasting; the error inside is its [`source`](std::error::Error::source),
/// and [`last_error`] gives it. tonic's client finds a `tonic::Status` in that chain, so the
/// status code is kept (with the `tonic` feature, a gRPC call whose last attempt could not
/// connect fails with `UNAVAILABLE` there); [`Attempts::of_error`] reads the count from the
/// `Attempted` or from a `tonic::Status` that carries one as its source.
///
/// ```
/// use tower_retry_hedge::error::Attempted;
/// use tower_retry_hedge::metadata::Attempts;
///
/// # fn check(error: tower_retry_hedge::BoxError) {
/// let attempts = error
///     .downcast_ref::<Attempted>()
///     .map_or(Attempts::default(), Attempted::attempts);
/// # let _ = attempts;
/// # }
/// ```
#[derive(Debug)]
pub struct Attempted {
    error: BoxError,
    attempts: crate::metadata::Attempts,
}

impl Attempted {
    pub(crate) fn new(error: BoxError, attempts: crate::metadata::Attempts) -> Attempted {
        Attempted { error, attempts }
    }

    /// The attempts the call made.
    pub fn attempts(&self) -> crate::metadata::Attempts {
        self.attempts
    }

    /// The last error, as the inner service (or the layer) gave it.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The last error, as the inner service (or the layer) gave it.
    pub fn into_inner(self) -> BoxError {
        self.error
    }
}

/// The last attempt's error of a call: the error inside its [`Attempted`] (found in the error
/// or in its chain of sources, as in a `tonic::Status` made from it), else the error itself.
/// What a caller that downcasts the inner service's error should look at.
///
/// ```
/// use tower_retry_hedge::error::last_error;
///
/// let error: tower_retry_hedge::BoxError = std::io::Error::other("reset").into();
/// assert!(last_error(&error).is::<std::io::Error>());
/// ```
pub fn last_error(error: &BoxError) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match find_attempted(&**error) {
        Some(attempted) => attempted.get_ref(),
        None => &**error,
    }
}

/// The [`Attempted`] in `error` or in its chain of sources.
fn find_attempted<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Attempted> {
    let mut next = Some(error);
    // Bounded: a chain is short, and a cycle must not hang the caller.
    for _ in 0..32 {
        let error = next?;
        if let Some(attempted) = error.downcast_ref::<Attempted>() {
            return Some(attempted);
        }
        next = error.source();
    }
    None
}

impl fmt::Display for Attempted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.attempts.sent() {
            1 => write!(f, "{}", self.error),
            sent => write!(f, "{} (after {sent} attempts)", self.error),
        }
    }
}

impl std::error::Error for Attempted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// The error for a call whose deadline passed: a gRPC `DEADLINE_EXCEEDED` status for gRPC
/// requests when tonic is available, else [`DeadlineExceeded`].
pub(crate) fn deadline_exceeded(grpc: bool) -> BoxError {
    #[cfg(feature = "tonic")]
    if grpc {
        return Box::new(tonic::Status::deadline_exceeded(
            "deadline exceeded across retry attempts",
        ));
    }
    let _ = grpc;
    Box::new(DeadlineExceeded::new())
}

/// The error for a call whose last attempt hit the per-attempt timeout: a gRPC `CANCELLED`
/// status (with [`AttemptTimedOut`] as its source) for gRPC requests when tonic is
/// available, as C-core ends it, else [`AttemptTimedOut`].
pub(crate) fn attempt_timed_out(grpc: bool) -> BoxError {
    #[cfg(feature = "tonic")]
    if grpc {
        let mut status = tonic::Status::cancelled(ATTEMPT_TIMED_OUT);
        status.set_source(std::sync::Arc::new(AttemptTimedOut::new()));
        return Box::new(status);
    }
    let _ = grpc;
    Box::new(AttemptTimedOut::new())
}

/// Read here, beside [`Attempted`], so that `metadata` does not depend on this module.
impl Attempts {
    /// The attempts behind an error of the layers: those of the [`Attempted`] in the error
    /// or in its chain of sources (a `tonic::Status` that tonic's client made from it carries
    /// it as its source), else, for a `tonic::Status`, its `grpc-previous-rpc-attempts`
    /// metadata plus one; a single attempt otherwise.
    pub fn of_error(error: &(dyn std::error::Error + 'static)) -> Attempts {
        if let Some(attempted) = find_attempted(error) {
            return attempted.attempts();
        }
        #[cfg(feature = "tonic")]
        if let Some(status) = error.downcast_ref::<tonic::Status>()
            && let Some(previous) = status
                .metadata()
                .get(crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u32>().ok())
        {
            return Attempts::new(previous.saturating_add(1), 0);
        }
        Attempts::new(1, 0)
    }
}
