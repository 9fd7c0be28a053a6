//! Retry and hedging policies, and the table that picks one for each request.
//!
//! A [`RetryPolicy`] says how often and how patiently a method is retried; a [`HedgePolicy`]
//! says how many copies of a request may be in flight and how far apart they start. A
//! [`Policies`] table maps requests to them:
//!
//! - gRPC methods by the request path `/package.Service/Method`: the exact method first,
//!   then the whole service, as gRPC service config does;
//! - HTTP routes by method and path prefix, in the order they were added;
//! - then a default, if one is set.
//!
//! A request that matches nothing passes through the layers untouched.
//!
//! The table also holds what every call through a layer shares: the retry throttle (one per
//! layer, one shared by several layers, or one per authority), the replay-buffer limits, the
//! client's cap on `maxAttempts` (5 by default, as in gRPC) and the statistics.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_hedge::backoff::Exponential;
//! use tower_retry_hedge::classify::{Code, GrpcCodes, HttpStatuses};
//! use tower_retry_hedge::policy::{HedgePolicy, Policies, RetryPolicy, Route};
//! use tower_retry_hedge::throttle::Throttle;
//!
//! let retry = RetryPolicy::builder()
//!     .max_attempts(4)
//!     .backoff(Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)?)
//!     .retryable(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let hedge = HedgePolicy::builder()
//!     .max_attempts(3)
//!     .delay(Duration::from_millis(50))
//!     .non_fatal(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let http = RetryPolicy::builder().retryable(HttpStatuses::default()).build()?;
//!
//! let policies = Policies::builder()
//!     .method("helloworld.Greeter/SayHello", retry)
//!     .service("helloworld.Lookup", hedge)
//!     .route(Route::prefix("/api/"), http)
//!     .throttle(Throttle::new(10, 0.1)?)
//!     .build();
//! assert!(policies.lookup(&http::Method::POST, "/helloworld.Greeter/SayHello").is_some());
//! assert!(policies.lookup(&http::Method::GET, "/api/users").is_some());
//! assert!(policies.lookup(&http::Method::GET, "/other").is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};

use crate::backoff::{Backoff, Exponential};
use crate::body::BufferLimits;
use crate::classify::{AttemptResult, Classify, Code, GrpcCodes, Outcome};
use crate::latency::AdaptiveDelay;
use crate::stats::Stats;
use crate::throttle::{AuthorityThrottle, AuthorityThrottles, RetryThrottle, ThrottleRegistry};

/// The client-side cap on `maxAttempts` that gRPC applies by default.
pub const DEFAULT_MAX_ATTEMPTS_CAP: u32 = 5;

/// The longest server pushback (`grpc-retry-pushback-ms`) the layers wait out by default;
/// a longer one stops the retries. A6 caps `maxAttempts` on the client because service
/// config comes from DNS; a pushback comes from any server, and deserves a cap too.
pub const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(60);

/// Never-sent attempts retried transparently when the call has no deadline. With a deadline
/// they are retried until it passes, as A6 says; without one, something must end the loop.
pub const DEFAULT_MAX_TRANSPARENT_RETRIES: u32 = 10;

/// An error building a policy: names the field and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    field: &'static str,
    rule: &'static str,
}

impl PolicyError {
    fn new(field: &'static str, rule: &'static str) -> PolicyError {
        PolicyError { field, rule }
    }

    /// The field that was wrong, such as `max_attempts`.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for PolicyError {}

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
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry_non_idempotent: bool,
    pub(crate) retry_with_idempotency_key: bool,
    pub(crate) max_transparent_retries: u32,
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
/// [`DEFAULT_MAX_TRANSPARENT_RETRIES`] never-sent retries when the call has no deadline.
pub struct RetryPolicyBuilder {
    max_attempts: u32,
    backoff: Option<Arc<dyn Backoff>>,
    classifier: Option<Arc<dyn Classify>>,
    timeout: Option<Duration>,
    retry_non_idempotent: bool,
    retry_with_idempotency_key: bool,
    max_transparent_retries: u32,
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
    /// ([`PoliciesBuilder::max_attempts_cap`]) are clamped to it, not rejected.
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

    /// How many times a never-sent attempt is retried when the call has no deadline.
    pub fn max_transparent_retries(mut self, max: u32) -> Self {
        self.max_transparent_retries = max;
        self
    }

    /// Cancels an attempt that takes longer than `timeout` and counts it as a retryable
    /// failure (Envoy's `per_try_timeout`). The call's deadline still spans every attempt.
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
    /// # Ok::<(), tower_retry_hedge::policy::PolicyError>(())
    /// ```
    pub fn on_retry(
        mut self,
        hook: impl Fn(&RetryContext<'_>) -> RetryDecision + Send + Sync + 'static,
    ) -> Self {
        self.on_retry = Some(Arc::new(hook));
        self
    }

    /// Validates and builds the policy.
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        if self.max_attempts < 2 {
            return Err(PolicyError::new("max_attempts", "must be at least 2"));
        }
        if self.per_attempt_timeout == Some(Duration::ZERO) {
            return Err(PolicyError::new(
                "per_attempt_timeout",
                "must be above zero",
            ));
        }
        if self.hedge_on_per_attempt_timeout && self.per_attempt_timeout.is_none() {
            return Err(PolicyError::new(
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
            per_attempt_timeout: self.per_attempt_timeout,
            hedge_on_per_attempt_timeout: self.hedge_on_per_attempt_timeout,
            on_retry: self.on_retry,
        })
    }
}

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

    /// Whether the delay learns from latencies.
    pub(crate) fn is_adaptive(&self) -> bool {
        matches!(self, HedgeDelay::Adaptive(_))
    }

    /// Feeds the latency of a successful attempt to an adaptive delay.
    pub(crate) fn record(&self, latency: Duration) {
        if let HedgeDelay::Adaptive(adaptive) = self {
            adaptive.record(latency);
        }
    }
}

/// How a method is hedged: gRFC A6's `hedgingPolicy`, and an adaptive delay beyond it.
#[derive(Clone)]
pub struct HedgePolicy {
    pub(crate) max_attempts: u32,
    pub(crate) track_backends: bool,
    pub(crate) delay: HedgeDelay,
    pub(crate) classifier: Arc<dyn Classify>,
    pub(crate) timeout: Option<Duration>,
}

impl fmt::Debug for HedgePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgePolicy")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HedgePolicy {
    /// A builder: 2 attempts, delay 0 (all at once), no non-fatal codes.
    pub fn builder() -> HedgePolicyBuilder {
        HedgePolicyBuilder {
            max_attempts: 2,
            track_backends: false,
            delay: HedgeDelay::Fixed(Duration::ZERO),
            classifier: None,
            timeout: None,
        }
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
}

/// Builds a [`HedgePolicy`].
pub struct HedgePolicyBuilder {
    max_attempts: u32,
    track_backends: bool,
    delay: HedgeDelay,
    classifier: Option<Arc<dyn Classify>>,
    timeout: Option<Duration>,
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
    /// should be sent to distinct backends"). Off by default: it costs a few allocations per
    /// call, worth it only when a balancer below reads it.
    pub fn track_backends(mut self, enabled: bool) -> Self {
        self.track_backends = enabled;
        self
    }

    /// A fixed delay between hedges; zero sends every attempt at once.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = HedgeDelay::Fixed(delay);
        self
    }

    /// A delay that follows a latency percentile of recent successful attempts, clamped,
    /// with a fixed fallback until enough samples are in (beyond A6).
    pub fn adaptive_delay(mut self, delay: AdaptiveDelay) -> Self {
        self.delay = HedgeDelay::Adaptive(delay);
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

    /// Validates and builds the policy.
    pub fn build(self) -> Result<HedgePolicy, PolicyError> {
        if self.max_attempts < 2 {
            return Err(PolicyError::new("max_attempts", "must be at least 2"));
        }
        Ok(HedgePolicy {
            max_attempts: self.max_attempts,
            track_backends: self.track_backends,
            delay: self.delay,
            classifier: self
                .classifier
                .unwrap_or_else(|| Arc::new(GrpcCodes::empty())),
            timeout: self.timeout,
        })
    }
}

/// The policy of one method: retried or hedged, never both.
#[derive(Debug, Clone)]
pub enum MethodPolicy {
    /// Retried by [`RetryLayer`](crate::RetryLayer); passes through the hedge layer.
    Retry(Arc<RetryPolicy>),
    /// Hedged by [`HedgeLayer`](crate::HedgeLayer); passes through the retry layer.
    Hedge(Arc<HedgePolicy>),
}

impl From<RetryPolicy> for MethodPolicy {
    fn from(policy: RetryPolicy) -> MethodPolicy {
        MethodPolicy::Retry(Arc::new(policy))
    }
}

impl From<HedgePolicy> for MethodPolicy {
    fn from(policy: HedgePolicy) -> MethodPolicy {
        MethodPolicy::Hedge(Arc::new(policy))
    }
}

/// An HTTP route: a path prefix (matched on whole segments) and, optionally, a set of
/// methods.
///
/// ```
/// use tower_retry_hedge::policy::Route;
/// use http::Method;
///
/// let route = Route::prefix("/api").methods([Method::GET, Method::PUT]);
/// assert!(route.matches(&Method::GET, "/api/users"));
/// assert!(route.matches(&Method::GET, "/api"));
/// assert!(!route.matches(&Method::GET, "/apiary"));
/// assert!(!route.matches(&Method::POST, "/api/users"));
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    prefix: Box<str>,
    methods: Option<Vec<Method>>,
}

impl Route {
    /// Matches paths that start with `prefix` at a segment boundary (`/api` matches `/api`
    /// and `/api/x`, not `/apiary`; a prefix ending in `/` matches below it).
    pub fn prefix(prefix: impl Into<String>) -> Route {
        Route {
            prefix: prefix.into().into_boxed_str(),
            methods: None,
        }
    }

    /// Limits the route to these methods.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Route {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// Whether a request with this method and path takes the route.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if let Some(methods) = &self.methods
            && !methods.contains(method)
        {
            return false;
        }
        match path.strip_prefix(&*self.prefix) {
            Some(rest) => self.prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

/// The throttle a call counts against: the table's shared one, or its authority's.
/// Neither allocates per call.
#[derive(Clone)]
pub(crate) enum ThrottleHandle {
    Shared(Arc<dyn RetryThrottle>),
    Authority(Arc<dyn RetryThrottle>),
}

impl std::ops::Deref for ThrottleHandle {
    type Target = dyn RetryThrottle;

    fn deref(&self) -> &(dyn RetryThrottle + 'static) {
        match self {
            ThrottleHandle::Shared(throttle) => &**throttle,
            ThrottleHandle::Authority(throttle) => &**throttle,
        }
    }
}

#[derive(Clone)]
pub(crate) enum ThrottleChoice {
    None,
    Shared(Arc<dyn RetryThrottle>),
    PerAuthority(Arc<dyn AuthorityThrottles>),
}

/// Names to policies. foldhash, seeded per process, hashes a short name in a few ns where
/// SipHash takes tens, on every call; its seed keeps names from a hostile service config
/// from being chosen to collide.
type NameMap = HashMap<Box<str>, Option<MethodPolicy>, foldhash::fast::RandomState>;

/// Names to indexes into [`Table::entries`].
///
/// A client names a handful of methods or services, and comparing a path with a few names
/// costs less than hashing it (most names differ in length, which is compared first). A
/// longer list, as a service config may give, is hashed.
enum Names {
    Few(Vec<(Box<str>, Option<usize>)>),
    Many(HashMap<Box<str>, Option<usize>, foldhash::fast::RandomState>),
}

impl Names {
    /// Up to this many names are compared one by one.
    const FEW: usize = 8;

    fn new(names: Vec<(Box<str>, Option<usize>)>) -> Names {
        if names.len() <= Names::FEW {
            Names::Few(names)
        } else {
            Names::Many(names.into_iter().collect())
        }
    }

    fn get(&self, name: &str) -> Option<Option<usize>> {
        match self {
            Names::Few(names) => names
                .iter()
                .find(|(known, _)| same_name(known.as_bytes(), name.as_bytes()))
                .map(|(_, index)| *index),
            Names::Many(names) => names.get(name).copied(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Names::Few(names) => names.len(),
            Names::Many(names) => names.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether two names are equal, compared inline 8 bytes at a time, last bytes first: the
/// names of one service differ at their end, and `memcmp`, called for a few bytes, costs
/// more than the whole comparison.
fn same_name(a: &[u8], b: &[u8]) -> bool {
    fn word(bytes: &[u8], at: usize) -> Option<u64> {
        let word = bytes.get(at..at + 8)?;
        Some(u64::from_ne_bytes(word.try_into().ok()?))
    }
    if a.len() != b.len() {
        return false;
    }
    if a.len() < 8 {
        return a == b;
    }
    let last = a.len() - 8;
    if word(a, last) != word(b, last) {
        return false;
    }
    // The words before the last one; the last may overlap the one before it.
    (0..last).step_by(8).all(|at| word(a, at) == word(b, at))
}

/// `None` entries turn a less specific policy off for that method or service.
struct Table {
    // Every policy of the table. The maps and routes hold indexes into it, so that a call
    // can keep its policy by index, under the one reference count of the table it holds.
    entries: Vec<MethodPolicy>,
    methods: Names,
    services: Names,
    routes: Vec<(Route, usize)>,
    default: Option<usize>,
    throttle: ThrottleChoice,
    buffer_limits: BufferLimits,
    max_attempts_cap: u32,
    max_pushback: Duration,
    stats: Stats,
}

/// The policy table shared by [`RetryLayer`](crate::RetryLayer) and
/// [`HedgeLayer`](crate::HedgeLayer). Cheap to clone: clones share the table, the throttle,
/// the buffer budget and the statistics.
#[derive(Clone)]
pub struct Policies(Arc<Table>);

impl fmt::Debug for Policies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policies")
            .field("methods", &self.0.methods.len())
            .field("services", &self.0.services.len())
            .field("routes", &self.0.routes.len())
            .field("default", &self.0.default.is_some())
            .field("max_attempts_cap", &self.0.max_attempts_cap)
            .finish_non_exhaustive()
    }
}

impl Default for Policies {
    fn default() -> Policies {
        Policies::builder().build()
    }
}

impl Policies {
    /// An empty table: every request passes through.
    pub fn builder() -> PoliciesBuilder {
        PoliciesBuilder {
            methods: NameMap::default(),
            services: NameMap::default(),
            routes: Vec::new(),
            default: None,
            throttle: ThrottleChoice::None,
            buffer_limits: BufferLimits::default(),
            max_attempts_cap: DEFAULT_MAX_ATTEMPTS_CAP,
            max_pushback: DEFAULT_MAX_PUSHBACK,
        }
    }

    /// The policy for a request with this method and path, if any.
    pub fn lookup(&self, method: &Method, path: &str) -> Option<&MethodPolicy> {
        self.lookup_index(method, path)
            .and_then(|index| self.0.entries.get(index))
    }

    /// The policy for a request.
    pub fn lookup_request<B>(&self, request: &Request<B>) -> Option<&MethodPolicy> {
        self.lookup(request.method(), request.uri().path())
    }

    /// The policy at `index`, as given by [`lookup_index`](Self::lookup_index).
    pub(crate) fn entry(&self, index: usize) -> Option<&MethodPolicy> {
        self.0.entries.get(index)
    }

    /// The retry policy at `index`.
    pub(crate) fn retry_policy(&self, index: usize) -> Option<&Arc<RetryPolicy>> {
        match self.0.entries.get(index) {
            Some(MethodPolicy::Retry(policy)) => Some(policy),
            _ => None,
        }
    }

    /// The hedging policy at `index`.
    pub(crate) fn hedge_policy(&self, index: usize) -> Option<&Arc<HedgePolicy>> {
        match self.0.entries.get(index) {
            Some(MethodPolicy::Hedge(policy)) => Some(policy),
            _ => None,
        }
    }

    /// Where the policy for a request with this method and path is in the table.
    pub(crate) fn lookup_index(&self, method: &Method, path: &str) -> Option<usize> {
        let table = &*self.0;
        if !table.methods.is_empty() || !table.services.is_empty() {
            // A gRPC path is `/service/method`.
            let name = path.strip_prefix('/').unwrap_or(path);
            // Each map is hashed into only when it has entries: most tables name methods or
            // services, rarely both.
            if !table.methods.is_empty()
                && let Some(found) = table.methods.get(name)
            {
                return found;
            }
            if !table.services.is_empty()
                && let Some((service, _)) = name.rsplit_once('/')
                && let Some(found) = table.services.get(service)
            {
                return found;
            }
        }
        table
            .routes
            .iter()
            .find(|(route, _)| route.matches(method, path))
            .map(|(_, index)| *index)
            .or(table.default)
    }

    /// The shared throttle, when the table has one rather than one per authority.
    pub(crate) fn shared_throttle(&self) -> Option<&Arc<dyn RetryThrottle>> {
        match &self.0.throttle {
            ThrottleChoice::Shared(throttle) => Some(throttle),
            _ => None,
        }
    }

    /// The throttle a call counts against: its authority's (from
    /// [`authority_throttle`](Self::authority_throttle)), else the shared one.
    pub(crate) fn call_throttle<'a>(
        &'a self,
        authority: Option<&'a ThrottleHandle>,
    ) -> Option<&'a dyn RetryThrottle> {
        match authority {
            Some(throttle) => Some(&**throttle),
            None => self.shared_throttle().map(|throttle| &**throttle),
        }
    }

    /// Counts a call that has a policy against its throttle (a budget deposits), and gives
    /// the throttle of the request's authority for the call to keep, when the table keeps
    /// one per authority; the shared one is read through the table.
    pub(crate) fn begin_call<B>(&self, request: &Request<B>) -> Option<ThrottleHandle> {
        let authority = self.authority_throttle(request);
        if let Some(throttle) = self.call_throttle(authority.as_ref()) {
            throttle.on_call();
        }
        authority
    }

    /// The throttle of a request's authority, when the table keeps one per authority.
    fn authority_throttle<B>(&self, request: &Request<B>) -> Option<ThrottleHandle> {
        match &self.0.throttle {
            ThrottleChoice::PerAuthority(_) => self.throttle_for(request),
            _ => None,
        }
    }

    /// The throttle for a request: the shared one, or the one of its authority.
    pub(crate) fn throttle_for<B>(&self, request: &Request<B>) -> Option<ThrottleHandle> {
        match &self.0.throttle {
            ThrottleChoice::None => None,
            ThrottleChoice::Shared(throttle) => Some(ThrottleHandle::Shared(throttle.clone())),
            ThrottleChoice::PerAuthority(registry) => {
                let authority = request
                    .uri()
                    .authority()
                    .map(|a| a.as_str())
                    .or_else(|| {
                        request
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|h| h.to_str().ok())
                    })
                    .unwrap_or("");
                Some(ThrottleHandle::Authority(registry.throttle(authority)))
            }
        }
    }

    /// Whether any throttle is configured (calls without a policy still credit it).
    pub(crate) fn has_throttle(&self) -> bool {
        !matches!(self.0.throttle, ThrottleChoice::None)
    }

    /// The replay-buffer limits shared by every call.
    pub fn buffer_limits(&self) -> &BufferLimits {
        &self.0.buffer_limits
    }

    /// The client's cap on `maxAttempts`.
    pub fn max_attempts_cap(&self) -> u32 {
        self.0.max_attempts_cap
    }

    /// The longest server pushback waited out.
    pub fn max_pushback(&self) -> Duration {
        self.0.max_pushback
    }

    /// The statistics of every method.
    pub fn stats(&self) -> &Stats {
        &self.0.stats
    }
}

/// Builds [`Policies`].
pub struct PoliciesBuilder {
    max_pushback: Duration,
    methods: NameMap,
    services: NameMap,
    routes: Vec<(Route, MethodPolicy)>,
    default: Option<MethodPolicy>,
    throttle: ThrottleChoice,
    buffer_limits: BufferLimits,
    max_attempts_cap: u32,
}

impl fmt::Debug for PoliciesBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoliciesBuilder").finish_non_exhaustive()
    }
}

fn grpc_name(name: &str) -> Box<str> {
    name.trim_matches('/').into()
}

impl PoliciesBuilder {
    /// The policy of one gRPC method, named `package.Service/Method` (a leading `/` is
    /// accepted). Replaces an earlier policy for the same method.
    pub fn method(mut self, name: &str, policy: impl Into<MethodPolicy>) -> Self {
        self.methods.insert(grpc_name(name), Some(policy.into()));
        self
    }

    /// The policy of every method of a gRPC service, named `package.Service`.
    pub fn service(mut self, name: &str, policy: impl Into<MethodPolicy>) -> Self {
        self.services.insert(grpc_name(name), Some(policy.into()));
        self
    }

    /// No policy for this gRPC method, even if its service or the default has one: what a
    /// service config's method entry without a retry or hedging policy means.
    pub fn method_without_policy(mut self, name: &str) -> Self {
        self.methods.insert(grpc_name(name), None);
        self
    }

    /// No policy for the methods of this gRPC service (but those given one by
    /// [`method`](PoliciesBuilder::method)), even if the default has one.
    pub fn service_without_policy(mut self, name: &str) -> Self {
        self.services.insert(grpc_name(name), None);
        self
    }

    /// The policy of an HTTP route; routes are tried in the order they were added, after
    /// gRPC methods and services.
    pub fn route(mut self, route: Route, policy: impl Into<MethodPolicy>) -> Self {
        self.routes.push((route, policy.into()));
        self
    }

    /// The policy of requests that match nothing else.
    pub fn default_policy(mut self, policy: impl Into<MethodPolicy>) -> Self {
        self.default = Some(policy.into());
        self
    }

    /// One throttle for every call through layers built from these policies (gRPC's
    /// per-channel throttle). Pass the same [`Throttle`](crate::throttle::Throttle) (it is
    /// cheap to clone) to several tables to share it between layers.
    pub fn throttle(mut self, throttle: impl RetryThrottle + 'static) -> Self {
        self.throttle = ThrottleChoice::Shared(Arc::new(throttle));
        self
    }

    /// One throttle per authority (host:port) of the request URI, for clients that talk to
    /// many hosts: A6 buckets, or copies of any [`AuthorityThrottle`] such as an
    /// [`AdaptiveThrottle`](crate::throttle::AdaptiveThrottle).
    pub fn throttle_per_authority<T: AuthorityThrottle>(
        mut self,
        registry: ThrottleRegistry<T>,
    ) -> Self {
        self.throttle = ThrottleChoice::PerAuthority(registry.erased());
        self
    }

    /// The replay-buffer limits (default 256 KiB per call, 16 MiB in all).
    pub fn buffer_limits(mut self, limits: BufferLimits) -> Self {
        self.buffer_limits = limits;
        self
    }

    /// The client's cap on `maxAttempts` (default 5). Policies asking for more are clamped.
    /// A cap below 1 is taken as 1.
    pub fn max_attempts_cap(mut self, cap: u32) -> Self {
        self.max_attempts_cap = cap.max(1);
        self
    }

    /// The longest server pushback the layers wait out (default
    /// [`DEFAULT_MAX_PUSHBACK`]); a longer one is taken as "do not retry".
    pub fn max_pushback(mut self, max: Duration) -> Self {
        self.max_pushback = max;
        self
    }

    /// Builds the table.
    pub fn build(self) -> Policies {
        let mut entries = Vec::new();
        let mut index = |policy: MethodPolicy| {
            entries.push(policy);
            entries.len() - 1
        };
        let mut names = |map: NameMap| -> Names {
            Names::new(
                map.into_iter()
                    .map(|(name, policy)| (name, policy.map(&mut index)))
                    .collect(),
            )
        };
        let methods = names(self.methods);
        let services = names(self.services);
        let routes = self
            .routes
            .into_iter()
            .map(|(route, policy)| (route, index(policy)))
            .collect();
        let default = self.default.map(&mut index);
        Policies(Arc::new(Table {
            entries,
            methods,
            services,
            routes,
            default,
            throttle: self.throttle,
            buffer_limits: self.buffer_limits,
            max_attempts_cap: self.max_attempts_cap,
            max_pushback: self.max_pushback,
            stats: Stats::default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry() -> RetryPolicy {
        RetryPolicy::builder().build().unwrap()
    }

    fn hedge() -> HedgePolicy {
        HedgePolicy::builder().build().unwrap()
    }

    #[test]
    fn method_beats_service_beats_default() {
        let policies = Policies::builder()
            .method("/pkg.Svc/A", retry())
            .service("pkg.Svc", hedge())
            .default_policy(retry().clone())
            .build();
        let get = |p: &str| policies.lookup(&Method::POST, p).cloned();
        assert!(matches!(get("/pkg.Svc/A"), Some(MethodPolicy::Retry(_))));
        assert!(matches!(get("/pkg.Svc/B"), Some(MethodPolicy::Hedge(_))));
        assert!(matches!(get("/pkg.Other/B"), Some(MethodPolicy::Retry(_))));
        assert!(matches!(get("/"), Some(MethodPolicy::Retry(_))));
    }

    #[test]
    fn names_compare_as_strings_do() {
        let names = [
            "",
            "a",
            "ab",
            "abcdefg",
            "abcdefgh",
            "abcdefgi",
            "bbcdefgh",
            "abcdefghi",
            "abcdefghj",
            "pkg.Svc/Method",
            "pkg.Svc/Methoe",
            "qkg.Svc/Method",
            "test.echo.Echo/Unary",
            "test.echo.Echo/Other",
            "test.echo.Fcho/Unary",
        ];
        for a in names {
            for b in names {
                assert_eq!(same_name(a.as_bytes(), b.as_bytes()), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn long_tables_resolve_as_short_ones_do() {
        // One table small enough to be scanned, one that is hashed: same answers.
        for extra in [0, Names::FEW * 2] {
            let mut builder = Policies::builder()
                .method("/pkg.Svc/A", retry())
                .service("pkg.Svc", hedge())
                .method_without_policy("pkg.Svc/Off");
            for i in 0..extra {
                builder = builder
                    .method(&format!("pkg.Filler/M{i}"), retry())
                    .service(&format!("pkg.Filler{i}"), retry());
            }
            let policies = builder.build();
            let get = |p: &str| policies.lookup(&Method::POST, p).cloned();
            assert!(matches!(get("/pkg.Svc/A"), Some(MethodPolicy::Retry(_))));
            assert!(matches!(get("/pkg.Svc/B"), Some(MethodPolicy::Hedge(_))));
            assert!(get("/pkg.Svc/Off").is_none());
            assert!(get("/pkg.Other/A").is_none());
            if extra > 0 {
                assert!(matches!(&policies.0.methods, Names::Many(_)));
                assert!(matches!(
                    get("/pkg.Filler/M3"),
                    Some(MethodPolicy::Retry(_))
                ));
                assert!(matches!(
                    get("/pkg.Filler5/Any"),
                    Some(MethodPolicy::Retry(_))
                ));
            } else {
                assert!(matches!(&policies.0.methods, Names::Few(_)));
            }
        }
    }

    #[test]
    fn entries_without_policy_turn_broader_ones_off() {
        let policies = Policies::builder()
            .service("pkg.Svc", retry())
            .method_without_policy("pkg.Svc/Off")
            .service_without_policy("pkg.Quiet")
            .method("pkg.Quiet/Loud", hedge())
            .default_policy(retry())
            .build();
        let get = |p: &str| policies.lookup(&Method::POST, p).cloned();
        assert!(matches!(get("/pkg.Svc/On"), Some(MethodPolicy::Retry(_))));
        assert!(get("/pkg.Svc/Off").is_none());
        assert!(get("/pkg.Quiet/X").is_none());
        assert!(matches!(
            get("/pkg.Quiet/Loud"),
            Some(MethodPolicy::Hedge(_))
        ));
        assert!(matches!(get("/other.Svc/X"), Some(MethodPolicy::Retry(_))));
    }

    #[test]
    fn no_match_without_default() {
        let policies = Policies::builder().method("pkg.Svc/A", retry()).build();
        assert!(policies.lookup(&Method::POST, "/pkg.Svc/B").is_none());
        assert!(policies.lookup(&Method::POST, "").is_none());
        assert!(policies.lookup(&Method::POST, "/pkg.Svc/A/extra").is_none());
    }

    #[test]
    fn routes_in_order() {
        let policies = Policies::builder()
            .route(Route::prefix("/api/slow"), hedge())
            .route(Route::prefix("/api"), retry())
            .build();
        assert!(matches!(
            policies.lookup(&Method::GET, "/api/slow/x"),
            Some(MethodPolicy::Hedge(_))
        ));
        assert!(matches!(
            policies.lookup(&Method::GET, "/api/fast"),
            Some(MethodPolicy::Retry(_))
        ));
        assert!(policies.lookup(&Method::GET, "/apix").is_none());
    }

    #[test]
    fn builders_validate() {
        let err = RetryPolicy::builder().max_attempts(1).build().unwrap_err();
        assert_eq!(err.to_string(), "max_attempts: must be at least 2");
        assert!(HedgePolicy::builder().max_attempts(0).build().is_err());
    }
}
