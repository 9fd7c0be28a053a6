//! [`Policies`]: the table that picks a policy for each request, and what every call through
//! the layers shares.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};

use super::{DEFAULT_MAX_ATTEMPTS_CAP, DEFAULT_MAX_PUSHBACK, MethodPolicy};
use crate::body::BufferLimits;
use crate::resets::StreamResets;
use crate::stats::Stats;
use crate::throttle::HedgeBudget;
use crate::throttle::{
    AuthorityThrottle, AuthorityThrottles, RetryThrottle, ThrottleRegistry, ThrottleState,
};

/// An HTTP route: a path prefix (matched on whole segments) and, optionally, a set of
/// methods. Its statistics are kept under its name (the prefix, unless named otherwise),
/// never under each raw path.
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
/// assert_eq!(route.name(), "/api");
/// assert_eq!(Route::prefix("/api/v2").named("v2").name(), "v2");
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    prefix: Box<str>,
    methods: Option<Vec<Method>>,
    name: Arc<str>,
}

impl Route {
    /// Matches paths that start with `prefix` at a segment boundary (`/api` matches `/api`
    /// and `/api/x`, not `/apiary`; a prefix ending in `/` matches below it).
    pub fn prefix(prefix: impl Into<String>) -> Route {
        let prefix: Box<str> = prefix.into().into_boxed_str();
        Route {
            name: Arc::from(&*prefix),
            prefix,
            methods: None,
        }
    }

    /// Limits the route to these methods.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Route {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// Names the route, for statistics and metrics (default: its prefix).
    pub fn named(mut self, name: impl Into<String>) -> Route {
        self.name = Arc::from(name.into());
        self
    }

    /// The route's name.
    pub fn name(&self) -> &str {
        &self.name
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

/// The throttle a call counts against: the table's shared one, or its authority's. Neither
/// allocates per call (a registry keeps each authority's throttle in an `Arc`).
pub(crate) type ThrottleHandle = Arc<dyn RetryThrottle>;

#[derive(Clone)]
enum ThrottleChoice {
    None,
    Shared(Arc<dyn RetryThrottle>),
    PerAuthority(Arc<dyn AuthorityThrottles>),
}

/// gRPC names (`package.Service/Method` or `package.Service`) to policies; `None` turns a
/// broader policy off. foldhash, seeded per process, hashes a short name in a few ns where
/// SipHash takes tens; its seed keeps names from a hostile service config from being
/// chosen to collide.
type Names = HashMap<Box<str>, Option<MethodPolicy>, foldhash::fast::RandomState>;

/// What a request matched: its policy, and the name its statistics are kept under when it
/// is not the request's own gRPC method path.
#[derive(Clone, Copy)]
pub(crate) struct Matched<'a> {
    pub(crate) policy: &'a MethodPolicy,
    // The route's place in the table rather than a clone of its name: a clone per call would
    // write the name's reference count, which every core's calls share.
    pub(crate) route: Option<usize>,
}

struct RouteTable {
    methods: Names,
    services: Names,
    routes: Vec<(Route, MethodPolicy)>,
    default: Option<MethodPolicy>,
    throttle: ThrottleChoice,
    buffer_limits: BufferLimits,
    max_attempts_cap: u32,
    max_pushback: Duration,
    track_backends: bool,
    transparent_retries: bool,
    stats: Stats,
    resets: Arc<StreamResets>,
    #[cfg(feature = "opentelemetry")]
    metrics: Option<crate::metrics::RetryMetrics>,
}

/// The policy table shared by [`RetryLayer`](crate::RetryLayer) and
/// [`HedgeLayer`](crate::HedgeLayer). Cheap to clone: clones share the table, the throttle,
/// the buffer budget and the statistics.
#[derive(Clone)]
pub struct Policies(Arc<RouteTable>);

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
            methods: Names::default(),
            services: Names::default(),
            routes: Vec::new(),
            default: None,
            throttle: ThrottleChoice::None,
            buffer_limits: BufferLimits::default(),
            max_attempts_cap: DEFAULT_MAX_ATTEMPTS_CAP,
            max_pushback: DEFAULT_MAX_PUSHBACK,
            track_backends: false,
            transparent_retries: true,
            hedge_budget: None,
            resets_per_second: Some(crate::resets::DEFAULT_PER_SECOND),
            #[cfg(feature = "opentelemetry")]
            metrics: None,
        }
    }

    /// The policy for a request with this method and path, if any.
    pub fn lookup(&self, method: &Method, path: &str) -> Option<&MethodPolicy> {
        self.matched(method, path).map(|matched| matched.policy)
    }

    /// The policy for a request.
    pub fn lookup_request<B>(&self, request: &Request<B>) -> Option<&MethodPolicy> {
        self.lookup(request.method(), request.uri().path())
    }

    /// The name of the route at `index` in the table, as [`matched`](Self::matched) gave it.
    pub(crate) fn route_name(&self, index: usize) -> &Arc<str> {
        &self.0.routes[index].0.name
    }

    /// What a request with this method and path matches: a gRPC method, then its service
    /// (as gRPC service config looks names up), then HTTP routes in order, then the default.
    pub(crate) fn matched(&self, method: &Method, path: &str) -> Option<Matched<'_>> {
        let table = &*self.0;
        // Every method name in the table is a gRPC path without its leading `/` (`build`
        // keeps no other), so a hit needs no check of the path's shape first.
        if !table.methods.is_empty()
            && let Some(found) = path
                .strip_prefix('/')
                .and_then(|name| table.methods.get(name))
        {
            return found.as_ref().map(|policy| Matched {
                policy,
                route: None,
            });
        }
        // Each map is hashed into only when it has entries: most tables name methods or
        // services, rarely both.
        if !table.services.is_empty()
            && let Some((service, _)) = crate::grpc_path::split(path)
            && let Some(found) = table.services.get(service)
        {
            return found.as_ref().map(|policy| Matched {
                policy,
                route: None,
            });
        }
        if let Some((index, (_, policy))) = table
            .routes
            .iter()
            .enumerate()
            .find(|(_, (route, _))| route.matches(method, path))
        {
            return Some(Matched {
                policy,
                route: Some(index),
            });
        }
        table.default.as_ref().map(|policy| Matched {
            policy,
            route: None,
        })
    }

    /// The authority a request's throttle is kept under: its URI's, else its `Host` header.
    pub(crate) fn authority_of<B>(request: &Request<B>) -> &str {
        request
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| {
                request
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
            })
            .unwrap_or("")
    }

    /// The throttle every call shares, if the table has one (not one per authority).
    pub(crate) fn shared_throttle(&self) -> Option<&ThrottleHandle> {
        match &self.0.throttle {
            ThrottleChoice::Shared(throttle) => Some(throttle),
            ThrottleChoice::None | ThrottleChoice::PerAuthority(_) => None,
        }
    }

    /// The throttle of `authority`, when the table keeps one per authority.
    pub(crate) fn authority_throttle(&self, authority: &str) -> Option<ThrottleHandle> {
        match &self.0.throttle {
            ThrottleChoice::PerAuthority(registry) => Some(registry.throttle(authority)),
            ThrottleChoice::None | ThrottleChoice::Shared(_) => None,
        }
    }

    /// Whether the table keeps a throttle per authority.
    pub(crate) fn has_authority_throttles(&self) -> bool {
        matches!(self.0.throttle, ThrottleChoice::PerAuthority(_))
    }

    /// The state of the table's throttle, the one every call shares (set with
    /// [`throttle`](PoliciesBuilder::throttle), or built from a service config's
    /// `retryThrottling`); `None` without one, or when throttles are kept per authority
    /// (see [`authority_throttle_states`](Policies::authority_throttle_states)).
    ///
    /// ```
    /// use tower_retry_hedge::throttle::{Throttle, ThrottleState};
    /// use tower_retry_hedge::Policies;
    ///
    /// let policies = Policies::builder().throttle(Throttle::new(20, 1.0)?).build();
    /// let Some(ThrottleState::Bucket { tokens, threshold, .. }) = policies.throttle_state() else {
    ///     panic!("an A6 bucket");
    /// };
    /// assert_eq!((tokens, threshold), (20.0, 10.0));
    /// assert!(Policies::default().throttle_state().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn throttle_state(&self) -> Option<ThrottleState> {
        match &self.0.throttle {
            ThrottleChoice::Shared(throttle) => Some(throttle.state()),
            ThrottleChoice::None | ThrottleChoice::PerAuthority(_) => None,
        }
    }

    /// The state of each authority's throttle, by authority, when the table keeps one per
    /// authority ([`throttle_per_authority`](PoliciesBuilder::throttle_per_authority));
    /// empty otherwise.
    pub fn authority_throttle_states(&self) -> BTreeMap<String, ThrottleState> {
        match &self.0.throttle {
            ThrottleChoice::PerAuthority(registry) => registry.states(),
            ThrottleChoice::None | ThrottleChoice::Shared(_) => BTreeMap::new(),
        }
    }

    /// Whether any throttle is configured.
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

    /// Whether every call keeps a [`TriedBackends`](crate::metadata::TriedBackends) record
    /// for the balancer below the layers (see [`PoliciesBuilder::track_backends`]).
    pub fn track_backends(&self) -> bool {
        self.0.track_backends
    }

    /// Whether calls without a policy get A6's transparent retries (see
    /// [`PoliciesBuilder::transparent_retries`]).
    pub fn transparent_retries(&self) -> bool {
        self.0.transparent_retries
    }

    /// The statistics of every method.
    pub fn stats(&self) -> &Stats {
        &self.0.stats
    }

    /// The stream resets per second the layers allow themselves (see
    /// [`PoliciesBuilder::resets_per_second`]); `None`: no limit.
    pub fn resets_per_second(&self) -> Option<u32> {
        self.0.resets.per_second()
    }

    /// The limit of stream resets every call through layers built from this table shares.
    pub(crate) fn stream_resets(&self) -> &Arc<StreamResets> {
        &self.0.resets
    }

    /// The gRFC A96 instruments calls record on, if the table was given a meter.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn metrics(&self) -> Option<&crate::metrics::RetryMetrics> {
        self.0.metrics.as_ref()
    }
}

/// Builds [`Policies`].
pub struct PoliciesBuilder {
    max_pushback: Duration,
    methods: Names,
    services: Names,
    routes: Vec<(Route, MethodPolicy)>,
    default: Option<MethodPolicy>,
    throttle: ThrottleChoice,
    buffer_limits: BufferLimits,
    max_attempts_cap: u32,
    track_backends: bool,
    transparent_retries: bool,
    /// `Some`: the budget of every hedging policy of the table (`Some(None)`: none).
    hedge_budget: Option<Option<HedgeBudget>>,
    resets_per_second: Option<u32>,
    #[cfg(feature = "opentelemetry")]
    metrics: Option<crate::metrics::RetryMetrics>,
}

impl fmt::Debug for PoliciesBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoliciesBuilder").finish_non_exhaustive()
    }
}

impl PoliciesBuilder {
    /// Gives every hedging policy `budget`.
    fn set_hedge_budgets(&mut self, budget: &Option<HedgeBudget>) {
        let with_budget = |policy: &mut MethodPolicy| {
            if let MethodPolicy::Hedge(hedge) = policy {
                *hedge = Arc::new(hedge.with_budget(budget.clone()));
            }
        };
        let names = self.methods.values_mut().chain(self.services.values_mut());
        names.flatten().for_each(with_budget);
        self.routes
            .iter_mut()
            .for_each(|(_, policy)| with_budget(policy));
        self.default.iter_mut().for_each(with_budget);
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
    /// service config's method entry without a retry or hedging policy (nor a timeout)
    /// means.
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
    /// 60 s); a longer one is taken as "do not retry".
    pub fn max_pushback(mut self, max: Duration) -> Self {
        self.max_pushback = max;
        self
    }

    /// Gives every attempt of every call a shared
    /// [`TriedBackends`](crate::metadata::TriedBackends) record, in which a load balancer
    /// below the layers notes the backend it picked, so that a call's retries and hedges
    /// go to backends it has not tried (A6: "hedged requests should be sent to distinct
    /// backends").
    ///
    /// Off by default for the table, on by default for every hedging policy
    /// ([`HedgePolicyBuilder::track_backends`](crate::policy::HedgePolicyBuilder::track_backends),
    /// built in code or from JSON); a call keeps the record if either says so. For retry
    /// policies the record costs every call 7 allocations, most of them never retrying, so
    /// it is yours to turn on: over `balance::Balance` or `balance::BalancedChannel` (the
    /// crate's balancer, feature `balance`), or any other balancer that reads
    /// [`TriedBackends`](crate::metadata::TriedBackends).
    ///
    /// ```
    /// use tower_retry_hedge::Policies;
    ///
    /// // Over a `BalancedChannel`: each retry and hedge of a call goes to a backend it has
    /// // not tried yet.
    /// let policies = Policies::builder().track_backends(true).build();
    /// assert!(policies.track_backends());
    /// ```
    pub fn track_backends(mut self, enabled: bool) -> Self {
        self.track_backends = enabled;
        self
    }

    /// Whether calls without a policy get A6's transparent retries (default `true`).
    ///
    /// gRFC A6 resends an attempt that never left the client "regardless of the retry
    /// configuration", so by default every call through a layer keeps a copy of its request
    /// for that, which a call with a policy keeps anyway. For a call without a policy, that copy
    /// is most of what the layer costs (see BENCHMARKS.md, "Overhead"). `false` lets such a
    /// call pass straight to the service below, as if the layer were not there, unless the
    /// table has a throttle, which A6 credits with every call's success. Calls with a policy
    /// keep their transparent retries either way.
    ///
    /// ```
    /// use tower_retry_hedge::Policies;
    ///
    /// let policies = Policies::builder().transparent_retries(false).build();
    /// assert!(!policies.transparent_retries());
    /// ```
    pub fn transparent_retries(mut self, enabled: bool) -> Self {
        self.transparent_retries = enabled;
        self
    }

    /// The HTTP/2 stream resets per second the layers allow themselves for attempts they no
    /// longer need (default 32, paced evenly, in bursts of a quarter of them and at least 1).
    /// `None` resets every such attempt at once, as gRFC A6 says; `Some(0)` lets every one
    /// finish.
    ///
    /// Each hedge that loses, each attempt cut off by a commit and each attempt still running
    /// when the deadline ends its call is a stream the client resets, and HTTP/2 peers close
    /// a connection that resets too fast: the `h2` crate that tonic and hyper use remembers 50
    /// reset streams for 1 s by default, and counts frames on the ones it forgot towards a
    /// limit of 1 024 per connection, then closes it with every call on it; its servers close
    /// a connection with more than 20 streams reset before they were accepted. Past this rate
    /// (one limit for every clone of the layers built on this table), a stopped attempt is
    /// let finish on a task of its own instead, its answer read
    /// and dropped (at most 1 MiB, and 10 s or 1 s past the call's deadline, then it is reset
    /// after all; 256 at a time per table, then it is reset). An attempt let finish keeps
    /// what it holds below the layer meanwhile (a concurrency permit, a balancer's count of
    /// requests in flight) and its replay record counts against the
    /// [`BufferLimits`](crate::BufferLimits). An attempt whose request cannot be sent whole
    /// any more (the call committed while its body was still streaming) is reset: its
    /// transport would reset it anyway. Outside a tokio runtime, every stopped attempt is
    /// reset. `grpc_channel::RetryInterceptor` (feature `grpc`) does not pace its resets.
    ///
    /// A call the caller drops is cancelled at once either way. The statistics count the
    /// attempts let finish ([`MethodSnapshot::attempts_let_finish`]) and those reset past the
    /// limit ([`MethodSnapshot::resets_over_limit`]). See the README's "Hedging over HTTP/2"
    /// for the peers' settings.
    ///
    /// [`MethodSnapshot::attempts_let_finish`]: crate::stats::MethodSnapshot::attempts_let_finish
    /// [`MethodSnapshot::resets_over_limit`]: crate::stats::MethodSnapshot::resets_over_limit
    ///
    /// ```
    /// use tower_retry_hedge::Policies;
    ///
    /// assert_eq!(Policies::default().resets_per_second(), Some(32));
    /// // gRFC A6 to the letter: every attempt no longer needed is cancelled at once.
    /// let policies = Policies::builder().resets_per_second(None).build();
    /// assert_eq!(policies.resets_per_second(), None);
    /// ```
    pub fn resets_per_second(mut self, limit: Option<u32>) -> Self {
        self.resets_per_second = limit;
        self
    }

    /// Records gRFC A96's retry metrics (`grpc.client.call.retries`,
    /// `grpc.client.call.transparent_retries`, `grpc.client.call.hedges`,
    /// `grpc.client.call.retry_delay`) of every call through layers built from this table,
    /// on a [`Meter`](opentelemetry::metrics::Meter) (`.metrics(&meter)`) or on
    /// [`RetryMetrics`](crate::telemetry::RetryMetrics) that name the channel's target. See
    /// [`telemetry`](crate::telemetry#metrics).
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use tower_retry_hedge::Policies;
    ///
    /// let provider = SdkMeterProvider::builder().build();
    /// let policies = Policies::builder()
    ///     .metrics(&provider.meter("tower-retry-hedge"))
    ///     .build();
    /// # let _ = policies;
    /// ```
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn metrics(mut self, metrics: impl Into<crate::metrics::RetryMetrics>) -> Self {
        self.metrics = Some(metrics.into());
        self
    }

    /// Gives every hedging policy of the table this [`HedgeBudget`] (`None`: no budget),
    /// in place of its own: for a table made from service-config JSON, whose hedging
    /// policies get [`HedgeBudget::default`] as those built in code do, to change it or turn
    /// it off. Policies that
    /// share one budget share one window.
    ///
    /// ```
    /// use tower_retry_hedge::ServiceConfig;
    /// use tower_retry_hedge::backoff::Jitter;
    ///
    /// let config = ServiceConfig::from_json(r#"{"methodConfig": [{
    ///     "name": [{"service": "echo.Echo"}],
    ///     "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.01s"}
    /// }]}"#)?;
    /// // Hedges without a cap on their extra load, as A6 has it.
    /// let policies = config.policies_builder_with(Jitter::GRPC).hedge_budget(None).build();
    /// # let _ = policies;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hedge_budget(mut self, budget: Option<HedgeBudget>) -> Self {
        self.hedge_budget = Some(budget);
        self
    }

    /// Builds the table.
    pub fn build(mut self) -> Policies {
        if let Some(budget) = self.hedge_budget.take() {
            self.set_hedge_budgets(&budget);
        }
        // A name that is not `service/method` matches no gRPC path: dropped, so that a
        // lookup can take any hit as a match.
        self.methods
            .retain(|name, _| crate::grpc_path::split(&format!("/{name}")).is_some());
        Policies(Arc::new(RouteTable {
            methods: self.methods,
            services: self.services,
            routes: self.routes,
            default: self.default,
            throttle: self.throttle,
            buffer_limits: self.buffer_limits,
            max_attempts_cap: self.max_attempts_cap,
            max_pushback: self.max_pushback,
            track_backends: self.track_backends,
            transparent_retries: self.transparent_retries,
            stats: Stats::default(),
            resets: Arc::new(StreamResets::new(self.resets_per_second)),
            #[cfg(feature = "opentelemetry")]
            metrics: self.metrics,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{HedgePolicy, RetryPolicy};

    fn retry() -> RetryPolicy {
        RetryPolicy::builder().build().unwrap()
    }

    fn hedge() -> HedgePolicy {
        HedgePolicy::builder()
            .delay(Duration::ZERO)
            .build()
            .unwrap()
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
    fn a_method_name_that_is_not_a_grpc_path_matches_nothing() {
        let policies = Policies::builder()
            .method("pkg.Svc/A/B", retry())
            .method("pkg.Svc/", retry())
            .build();
        for path in ["/pkg.Svc/A/B", "/pkg.Svc/", "pkg.Svc/A/B"] {
            assert!(policies.lookup(&Method::POST, path).is_none(), "{path}");
        }
    }

    #[test]
    fn long_tables_resolve_as_short_ones_do() {
        // A few names and many: same answers.
        for extra in [0, 16] {
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
                assert!(matches!(
                    get("/pkg.Filler/M3"),
                    Some(MethodPolicy::Retry(_))
                ));
                assert!(matches!(
                    get("/pkg.Filler5/Any"),
                    Some(MethodPolicy::Retry(_))
                ));
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
