//! [`RetryPolicy`]: how a method is retried.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::DEFAULT_MAX_TRANSPARENT_RETRIES;
use crate::backoff::{Backoff, Exponential};
use crate::classify::{AttemptResult, Classify, Code, GrpcCodes, Outcome};
use crate::error::BuildError;

fn default_backoff() -> Arc<dyn Backoff> {
    // A6's own example: 0.1 s, x2, capped at 1 s, with today's gRPC jitter.
    match Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0) {
        Ok(backoff) => Arc::new(backoff),
        Err(_) => unreachable!("the default backoff parameters are valid"),
    }
}

/// What a [`RetryPolicyBuilder::on_retry`] hook sees before a retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryContext<'a> {
    /// Attempts made so far that count toward `maxAttempts`.
    pub attempts: u32,
    /// How the last attempt was classified.
    pub outcome: Outcome,
    /// The last attempt's response or error.
    pub result: AttemptResult<'a>,
    /// The delay the policy would wait: the server's pushback, or the backoff.
    pub delay: Duration,
}

/// What a [`RetryPolicyBuilder::on_retry`] hook decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Retry after the policy's delay.
    Proceed,
    /// Retry after this delay instead (still never past the deadline).
    Delay(Duration),
    /// Do not retry: return the last attempt's outcome.
    Stop,
}

type RetryHook = Arc<dyn Fn(&RetryContext<'_>) -> RetryDecision + Send + Sync>;

/// How a method is retried: gRFC A6's `retryPolicy`, and a few things beyond it.
// Alone on its cache lines: each clone of a layer's service keeps a copy whose reference
// count its calls write (`call/handles.rs`), and two clones' copies side by side would make
// the cores running them fight over one line.
#[derive(Clone)]
#[repr(align(128))]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry_non_idempotent: bool,
    pub(crate) retry_with_idempotency_key: bool,
    pub(crate) max_transparent_retries: u32,
    pub(crate) wait_for_ready: bool,
    pub(crate) per_attempt_timeout: Option<Duration>,
    pub(crate) hedge_on_per_attempt_timeout: bool,
    pub(crate) on_retry: Option<RetryHook>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("timeout", &self.timeout)
            .field("retry_non_idempotent", &self.retry_non_idempotent)
            .field("per_attempt_timeout", &self.per_attempt_timeout)
            .field(
                "hedge_on_per_attempt_timeout",
                &self.hedge_on_per_attempt_timeout,
            )
            .field("on_retry", &self.on_retry.is_some())
            .finish_non_exhaustive()
    }
}

impl RetryPolicy {
    /// A builder; see [`RetryPolicyBuilder`] for its defaults.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            max_attempts: 3,
            backoff: None,
            classifier: None,
            timeout: None,
            retry_non_idempotent: false,
            retry_with_idempotency_key: false,
            max_transparent_retries: DEFAULT_MAX_TRANSPARENT_RETRIES,
            wait_for_ready: false,
            per_attempt_timeout: None,
            hedge_on_per_attempt_timeout: false,
            on_retry: None,
        }
    }

    /// The attempts allowed, including the first, before the client cap is applied.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The call timeout used when a request carries no `grpc-timeout`.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The backoff schedule.
    pub fn backoff(&self) -> &dyn Backoff {
        &*self.backoff
    }

    /// The classifier of attempt outcomes.
    pub fn classifier(&self) -> &dyn Classify {
        &*self.classifier
    }
}

/// Builds a [`RetryPolicy`].
///
/// Defaults: 3 attempts; backoff [`Exponential::grpc`]`(100 ms, 1 s, 2.0)`; `UNAVAILABLE`
/// retryable; no timeout; non-idempotent HTTP methods not retried; at most
/// 10 never-sent retries when the call has no deadline.
pub struct RetryPolicyBuilder {
    max_attempts: u32,
    backoff: Option<Arc<dyn Backoff>>,
    classifier: Option<Arc<dyn Classify>>,
    timeout: Option<Duration>,
    retry_non_idempotent: bool,
    retry_with_idempotency_key: bool,
    max_transparent_retries: u32,
    wait_for_ready: bool,
    per_attempt_timeout: Option<Duration>,
    hedge_on_per_attempt_timeout: bool,
    on_retry: Option<RetryHook>,
}

impl fmt::Debug for RetryPolicyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicyBuilder")
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl RetryPolicyBuilder {
    /// The attempts allowed, counting the first; at least 2. Values above the client cap
    /// ([`PoliciesBuilder::max_attempts_cap`](super::PoliciesBuilder::max_attempts_cap)) are clamped to it, not rejected.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The backoff schedule between attempts. Any [`Backoff`] works; its `attempt` is the
    /// number of backoffs since the start of the call or the last server pushback.
    pub fn backoff(mut self, backoff: impl Backoff + 'static) -> Self {
        self.backoff = Some(Arc::new(backoff));
        self
    }

    /// Which outcomes are retryable: a [`GrpcCodes`] set, an
    /// [`HttpStatuses`](crate::classify::HttpStatuses), or any [`Classify`].
    pub fn retryable(mut self, classifier: impl Classify) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// The call's timeout across all attempts, used when the request has no `grpc-timeout`
    /// header (service config's `timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Retries HTTP requests whose method is not idempotent (RFC 9110 §9.2.2), such as
    /// `POST`. Off by default. gRPC requests are not gated: A6 leaves idempotency to the
    /// choice of retryable codes.
    pub fn retry_non_idempotent(mut self, enabled: bool) -> Self {
        self.retry_non_idempotent = enabled;
        self
    }

    /// Retries a non-idempotent HTTP request when it carries an `Idempotency-Key` header:
    /// the server promises to apply it once whatever the number of copies. Off by default.
    pub fn retry_with_idempotency_key(mut self, enabled: bool) -> Self {
        self.retry_with_idempotency_key = enabled;
        self
    }

    /// With [`wait_for_ready`](Self::wait_for_ready): how many times an attempt that could
    /// not be sent is resent in a row when the call has no deadline (default 10; with a
    /// deadline, until the deadline). Hedging policies and calls without a policy resend at
    /// most 10 times too.
    pub fn max_transparent_retries(mut self, max: u32) -> Self {
        self.max_transparent_retries = max;
        self
    }

    /// gRPC's wait-for-ready (the service config's `"waitForReady": true`): an attempt that
    /// could not be sent because no connection could be made (refused, no route, a failed
    /// name lookup, a connect timeout) is resent transparently, with backoff, until the
    /// call's deadline (or [`max_transparent_retries`](Self::max_transparent_retries) times
    /// without one), counting toward neither `maxAttempts` nor the throttle.
    ///
    /// Off by default, as in gRPC: such an attempt is an `UNAVAILABLE` failure (a `503` for
    /// HTTP) for this policy, counted, backed off and throttled like any other; having never
    /// reached the server, it may be retried whatever the HTTP method.
    ///
    /// ```
    /// use tower_retry_hedge::RetryPolicy;
    ///
    /// let policy = RetryPolicy::builder().wait_for_ready(true).build()?;
    /// # let _ = policy;
    /// # Ok::<(), tower_retry_hedge::error::BuildError>(())
    /// ```
    pub fn wait_for_ready(mut self, enabled: bool) -> Self {
        self.wait_for_ready = enabled;
        self
    }

    /// Cancels an attempt that has no answer (for HTTP/2, no response headers) within
    /// `timeout` and counts it as a retryable failure whatever the classifier says (Envoy's
    /// `per_try_timeout`; the service config's `retryPolicy.perAttemptRecvTimeout`, which
    /// policies from JSON read). The timeout is a failure for the throttle, and the retry
    /// waits for the backoff. An answer in time stops its timer, however long its body then
    /// streams. The call's deadline still spans every attempt.
    ///
    /// When no attempt is left, a gRPC call ends `CANCELLED` (as gRPC C-core ends it), with
    /// [`AttemptTimedOut`](crate::error::AttemptTimedOut) as the status's source; an HTTP
    /// call fails with [`AttemptTimedOut`](crate::error::AttemptTimedOut).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::RetryPolicy;
    ///
    /// let policy = RetryPolicy::builder()
    ///     .max_attempts(3)
    ///     .per_attempt_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// # let _ = policy;
    /// # Ok::<(), tower_retry_hedge::error::BuildError>(())
    /// ```
    pub fn per_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.per_attempt_timeout = Some(timeout);
        self
    }

    /// With a per-attempt timeout: when it fires, start the next attempt at once *without*
    /// cancelling the slow one; the first answer that is not retryable (a success or a fatal
    /// failure) wins and the others are cancelled (Envoy's `hedge_on_per_try_timeout`). A
    /// request that may not be retried (a non-idempotent method without an opt-in) is never
    /// sent twice: its slow attempt is left to answer. Off by default.
    pub fn hedge_on_per_attempt_timeout(mut self, enabled: bool) -> Self {
        self.hedge_on_per_attempt_timeout = enabled;
        self
    }

    /// A hook that sees each retryable outcome before the retry and may change its delay
    /// or stop it (Polly's `DelayGenerator`, resilience4j's `intervalBiFunction`). It runs
    /// after A6's own checks (attempts left, pushback, commit): it can only make retrying
    /// more careful, never exceed `maxAttempts`, the throttle or the deadline.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::policy::{RetryDecision, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder()
    ///     .on_retry(|ctx| {
    ///         if ctx.attempts >= 2 && ctx.delay < Duration::from_millis(50) {
    ///             RetryDecision::Delay(Duration::from_millis(50))
    ///         } else {
    ///             RetryDecision::Proceed
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), tower_retry_hedge::error::BuildError>(())
    /// ```
    pub fn on_retry(
        mut self,
        hook: impl Fn(&RetryContext<'_>) -> RetryDecision + Send + Sync + 'static,
    ) -> Self {
        self.on_retry = Some(Arc::new(hook));
        self
    }

    /// Validates and builds the policy.
    pub fn build(self) -> Result<RetryPolicy, BuildError> {
        if self.max_attempts < 2 {
            return Err(BuildError::new("max_attempts", "must be at least 2"));
        }
        if self.per_attempt_timeout == Some(Duration::ZERO) {
            return Err(BuildError::new("per_attempt_timeout", "must be above zero"));
        }
        if self.hedge_on_per_attempt_timeout && self.per_attempt_timeout.is_none() {
            return Err(BuildError::new(
                "hedge_on_per_attempt_timeout",
                "needs a per_attempt_timeout",
            ));
        }
        Ok(RetryPolicy {
            max_attempts: self.max_attempts,
            backoff: self.backoff.unwrap_or_else(default_backoff),
            classifier: self
                .classifier
                .unwrap_or_else(|| Arc::new(GrpcCodes::from([Code::Unavailable]))),
            timeout: self.timeout,
            retry_non_idempotent: self.retry_non_idempotent,
            retry_with_idempotency_key: self.retry_with_idempotency_key,
            max_transparent_retries: self.max_transparent_retries,
            wait_for_ready: self.wait_for_ready,
            per_attempt_timeout: self.per_attempt_timeout,
            hedge_on_per_attempt_timeout: self.hedge_on_per_attempt_timeout,
            on_retry: self.on_retry,
        })
    }
}
