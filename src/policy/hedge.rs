//! [`HedgePolicy`]: how a method is hedged.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::classify::{Classify, GrpcCodes};
use crate::error::BuildError;
use crate::latency::AdaptiveDelay;
use crate::throttle::HedgeBudget;

/// The delay between hedges: fixed (A6's `hedgingDelay`) or following a latency percentile.
#[derive(Debug, Clone)]
pub enum HedgeDelay {
    /// The same delay for every call; zero sends every attempt at once.
    Fixed(Duration),
    /// A percentile of recent latencies, clamped: see [`AdaptiveDelay`].
    Adaptive(AdaptiveDelay),
}

impl HedgeDelay {
    /// The delay for a call starting now.
    pub fn current(&self) -> Duration {
        match self {
            HedgeDelay::Fixed(delay) => *delay,
            HedgeDelay::Adaptive(adaptive) => adaptive.current(),
        }
    }

    /// [`current`](HedgeDelay::current) for a call starting at `now`, read only for an
    /// adaptive delay.
    pub(crate) fn current_at(&self, now: impl FnOnce() -> std::time::Instant) -> Duration {
        match self {
            HedgeDelay::Fixed(delay) => *delay,
            HedgeDelay::Adaptive(adaptive) => adaptive.current_at(now().into()),
        }
    }

    /// Whether the delay learns from latencies.
    pub(crate) fn is_adaptive(&self) -> bool {
        matches!(self, HedgeDelay::Adaptive(_))
    }

    /// Feeds the latency of a successful attempt, answered at `now`, to an adaptive delay.
    pub(crate) fn record_at(&self, now: std::time::Instant, latency: Duration) {
        if let HedgeDelay::Adaptive(adaptive) = self {
            adaptive.record_at(now.into(), latency);
        }
    }
}

/// How a method is hedged: gRFC A6's `hedgingPolicy`, and an adaptive delay beyond it.
// Alone on its cache lines: each clone of a layer's service keeps a copy whose reference
// count its calls write (`call/handles.rs`), and two clones' copies side by side would make
// the cores running them fight over one line.
#[derive(Clone)]
#[repr(align(128))]
pub struct HedgePolicy {
    pub(crate) max_attempts: u32,
    pub(crate) track_backends: bool,
    pub(crate) delay: HedgeDelay,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) non_idempotent: bool,
    pub(crate) wait_for_ready: bool,
    pub(crate) budget: Option<HedgeBudget>,
}

impl fmt::Debug for HedgePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgePolicy")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .field("timeout", &self.timeout)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl HedgePolicy {
    /// A builder: 2 attempts, no non-fatal codes, the default [`HedgeBudget`], backends
    /// tracked, and no delay: [`delay`](HedgePolicyBuilder::delay) or
    /// [`adaptive_delay`](HedgePolicyBuilder::adaptive_delay) must be given.
    pub fn builder() -> HedgePolicyBuilder {
        HedgePolicyBuilder {
            max_attempts: 2,
            track_backends: true,
            delay: None,
            classifier: None,
            timeout: None,
            non_idempotent: false,
            wait_for_ready: false,
            budget: Some(HedgeBudget::default()),
        }
    }

    /// The budget on this policy's backup hedges, if it has one.
    pub fn budget(&self) -> Option<&HedgeBudget> {
        self.budget.as_ref()
    }

    /// Whether this policy's calls record the backends they tried (see
    /// [`HedgePolicyBuilder::track_backends`]).
    pub fn tracks_backends(&self) -> bool {
        self.track_backends
    }

    /// The attempts allowed, including the first, before the client cap is applied.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay between hedges.
    pub fn delay(&self) -> &HedgeDelay {
        &self.delay
    }

    /// The call timeout used when a request carries no `grpc-timeout`.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// This policy with `budget` in place of its own.
    pub(crate) fn with_budget(&self, budget: Option<HedgeBudget>) -> HedgePolicy {
        HedgePolicy {
            budget,
            ..self.clone()
        }
    }
}

/// Builds a [`HedgePolicy`].
///
/// Defaults: 2 attempts; no non-fatal codes (every failure is fatal); no timeout;
/// non-idempotent HTTP methods not hedged; [`HedgeBudget::default`] on the backups; backends
/// tracked. The delay has no default: a policy built in code names it, so that "every copy
/// at once" is never sent by accident.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_hedge::HedgePolicy;
/// use tower_retry_hedge::classify::{Code, GrpcCodes};
///
/// let policy = HedgePolicy::builder()
///     .max_attempts(3)
///     .delay(Duration::from_millis(50))
///     .non_fatal(GrpcCodes::from([Code::Unavailable]))
///     .build()?;
/// assert!(policy.budget().is_some(), "the default budget");
///
/// // Without a delay the builder refuses; zero, named, sends every copy at once.
/// assert!(HedgePolicy::builder().max_attempts(3).build().is_err());
/// let all_at_once = HedgePolicy::builder().delay(Duration::ZERO).build()?;
/// # let _ = all_at_once;
/// # Ok::<(), tower_retry_hedge::error::BuildError>(())
/// ```
pub struct HedgePolicyBuilder {
    max_attempts: u32,
    track_backends: bool,
    delay: Option<HedgeDelay>,
    classifier: Option<Arc<dyn Classify>>,
    timeout: Option<Duration>,
    non_idempotent: bool,
    wait_for_ready: bool,
    budget: Option<HedgeBudget>,
}

impl fmt::Debug for HedgePolicyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgePolicyBuilder")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl HedgePolicyBuilder {
    /// The attempts allowed, counting the first; at least 2; clamped to the client cap.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Gives every attempt of a hedged call a shared
    /// [`TriedBackends`](crate::metadata::TriedBackends) list, in which a load balancer records
    /// the backend it picked, so that later hedges can go elsewhere (A6: "hedged requests
    /// should be sent to distinct backends"). On by default, for policies built in code and
    /// from service-config JSON alike. It costs every call 7 allocations (the record, the
    /// request's extension map it goes in, and the copy of that map kept for later attempts;
    /// about 1 600 instructions, BENCHMARKS.md), which a hedged call, whose attempts overlap,
    /// pays for a balancer below to keep that promise.
    /// `false` drops it for this policy's calls, unless
    /// [`PoliciesBuilder::track_backends`](crate::policy::PoliciesBuilder::track_backends)
    /// turns it on for every call of the table; a call keeps the list if either asks.
    pub fn track_backends(mut self, enabled: bool) -> Self {
        self.track_backends = enabled;
        self
    }

    /// A fixed delay between hedges; zero sends every attempt at once. A policy built in
    /// code must give this or [`adaptive_delay`](Self::adaptive_delay).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(HedgeDelay::Fixed(delay));
        self
    }

    /// A delay that follows a latency percentile of recent successful attempts, clamped,
    /// with a fixed fallback until enough samples are in (beyond A6).
    pub fn adaptive_delay(mut self, delay: AdaptiveDelay) -> Self {
        self.delay = Some(HedgeDelay::Adaptive(delay));
        self
    }

    /// Which failures are non-fatal (the next hedge is sent at once, the others go on):
    /// a [`GrpcCodes`] set or any [`Classify`]. Outcomes it calls `Retryable` are non-fatal.
    /// Without one, every failure is fatal.
    pub fn non_fatal(mut self, classifier: impl Classify) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// The call's timeout across all hedges, used when the request has no `grpc-timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Hedges HTTP requests whose method is not idempotent (RFC 9110 §9.2.2), such as
    /// `POST`: off by default, as for retries
    /// ([`retry_non_idempotent`](crate::policy::RetryPolicyBuilder::retry_non_idempotent)),
    /// since a hedge reaches the server's application a second time. gRPC requests are not
    /// gated.
    pub fn hedge_non_idempotent(mut self, enabled: bool) -> Self {
        self.non_idempotent = enabled;
        self
    }

    /// gRPC's wait-for-ready, as
    /// [`RetryPolicyBuilder::wait_for_ready`](crate::policy::RetryPolicyBuilder::wait_for_ready)
    /// has it: an attempt that could not connect is resent transparently until the deadline,
    /// or at most 10 times in a row for a call without one (the default of
    /// [`RetryPolicyBuilder::max_transparent_retries`](crate::policy::RetryPolicyBuilder::max_transparent_retries),
    /// which a hedging policy keeps). Off by default: it is an `UNAVAILABLE` failure, which
    /// sends the next hedge at once if `UNAVAILABLE` is non-fatal.
    pub fn wait_for_ready(mut self, enabled: bool) -> Self {
        self.wait_for_ready = enabled;
        self
    }

    /// Caps the extra load this policy's hedges add: a backup hedge over the budget is not
    /// sent, and the call keeps waiting on the attempts in flight with no more backups (the
    /// hedge a non-fatal failure owes still goes at once; see [`HedgeBudget`]).
    /// [`HedgeBudget::default`] (5 % of the calls over 10 s, plus 2 hedges a second) unless
    /// given another, for policies built in code and from service-config JSON alike; `None`
    /// hedges without a cap on the extra load, as A6 does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_hedge::HedgePolicy;
    /// use tower_retry_hedge::throttle::HedgeBudget;
    ///
    /// let policy = HedgePolicy::builder()
    ///     .max_attempts(3)
    ///     .delay(Duration::from_millis(2))
    ///     .budget(HedgeBudget::new(Duration::from_secs(10), 1, 0.05)?)
    ///     .build()?;
    ///
    /// // A6 to the letter: no cap on the backups.
    /// let unbounded = HedgePolicy::builder()
    ///     .delay(Duration::from_millis(2))
    ///     .budget(None)
    ///     .build()?;
    /// assert!(unbounded.budget().is_none());
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn budget(mut self, budget: impl Into<Option<HedgeBudget>>) -> Self {
        self.budget = budget.into();
        self
    }

    /// Validates and builds the policy.
    pub fn build(self) -> Result<HedgePolicy, BuildError> {
        if self.max_attempts < 2 {
            return Err(BuildError::new("max_attempts", "must be at least 2"));
        }
        let Some(delay) = self.delay else {
            return Err(BuildError::new(
                "delay",
                "must be given: delay(..) or adaptive_delay(..); delay(Duration::ZERO) sends \
                 every attempt at once",
            ));
        };
        Ok(HedgePolicy {
            max_attempts: self.max_attempts,
            track_backends: self.track_backends,
            delay,
            classifier: self
                .classifier
                .unwrap_or_else(|| Arc::new(GrpcCodes::empty())),
            timeout: self.timeout,
            non_idempotent: self.non_idempotent,
            wait_for_ready: self.wait_for_ready,
            budget: self.budget,
        })
    }
}
