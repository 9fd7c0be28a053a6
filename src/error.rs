//! Errors the layers make themselves. Errors of the inner service pass through unchanged
//! (boxed as [`BoxError`](crate::BoxError), so they can be downcast).

use crate::metadata::Attempts;
use std::fmt;

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
/// For gRPC requests with the `tonic` feature, the layers return a
/// `tonic::Status::deadline_exceeded` whose source is this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttemptTimedOut(());

impl AttemptTimedOut {
    pub(crate) fn new() -> AttemptTimedOut {
        AttemptTimedOut(())
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("attempt timed out")
    }
}

impl std::error::Error for AttemptTimedOut {}

/// The error of a call that made more than one attempt: the last attempt's error (or the
/// layer's own, such as [`DeadlineExceeded`]), with the [`Attempts`]
/// made. A call of one attempt returns its error as it is.
///
/// Find it by downcasting; the error inside is its [`source`](std::error::Error::source)
/// (tonic's client finds a `tonic::Status` there, so the status code is kept).
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
    error: crate::BoxError,
    attempts: crate::metadata::Attempts,
}

impl Attempted {
    pub(crate) fn new(error: crate::BoxError, attempts: crate::metadata::Attempts) -> Attempted {
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
    pub fn into_inner(self) -> crate::BoxError {
        self.error
    }
}

/// The last attempt's error of a call: inside an [`Attempted`] when the call made several
/// attempts, else the error itself. What a caller that downcasts the inner service's error
/// should look at.
///
/// ```
/// use tower_retry_hedge::error::last_error;
///
/// let error: tower_retry_hedge::BoxError = std::io::Error::other("reset").into();
/// assert!(last_error(&error).is::<std::io::Error>());
/// ```
pub fn last_error(error: &crate::BoxError) -> &(dyn std::error::Error + Send + Sync + 'static) {
    match error.downcast_ref::<Attempted>() {
        Some(attempted) => attempted.get_ref(),
        None => &**error,
    }
}

impl fmt::Display for Attempted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (after {} attempts)",
            self.error,
            self.attempts.sent()
        )
    }
}

impl std::error::Error for Attempted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// The error for a call whose deadline passed: a gRPC `DEADLINE_EXCEEDED` status for gRPC
/// requests when tonic is available, else [`DeadlineExceeded`].
pub(crate) fn deadline_exceeded(grpc: bool) -> crate::BoxError {
    #[cfg(feature = "tonic")]
    if grpc {
        return Box::new(tonic::Status::deadline_exceeded(
            "deadline exceeded across retry attempts",
        ));
    }
    let _ = grpc;
    Box::new(DeadlineExceeded::new())
}

/// The error for a call whose last attempt hit the per-attempt timeout: a gRPC
/// `DEADLINE_EXCEEDED` status (with [`AttemptTimedOut`] as its source) for gRPC requests when
/// tonic is available, else [`AttemptTimedOut`].
pub(crate) fn attempt_timed_out(grpc: bool) -> crate::BoxError {
    #[cfg(feature = "tonic")]
    if grpc {
        let mut status = tonic::Status::deadline_exceeded("attempt timed out");
        status.set_source(std::sync::Arc::new(AttemptTimedOut::new()));
        return Box::new(status);
    }
    let _ = grpc;
    Box::new(AttemptTimedOut::new())
}

/// Read here, beside [`Attempted`], so that `metadata` does not depend on this module.
impl Attempts {
    /// The attempts behind an error of the layers: an [`Attempted`]
    /// error's, or for a `tonic::Status`, its `grpc-previous-rpc-attempts` metadata (plus
    /// one); a single attempt otherwise (the layers mark only calls of several attempts).
    pub fn of_error(error: &(dyn std::error::Error + 'static)) -> Attempts {
        if let Some(attempted) = error.downcast_ref::<Attempted>() {
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
