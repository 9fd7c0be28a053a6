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
//! A request that matches nothing still gets A6's transparent retries (and credits the
//! throttle when it succeeds), unless the table turns them off
//! ([`PoliciesBuilder::transparent_retries`]); then, with no throttle either, it passes
//! through the layers untouched.
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

mod hedge;
mod retry;
mod table;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

pub use self::hedge::{HedgeDelay, HedgePolicy, HedgePolicyBuilder};
pub use self::retry::{RetryContext, RetryDecision, RetryPolicy, RetryPolicyBuilder};
pub(crate) use self::table::ThrottleHandle;
pub use self::table::{Policies, PoliciesBuilder, Route};

/// The client-side cap on `maxAttempts` that gRPC applies by default.
pub(crate) const DEFAULT_MAX_ATTEMPTS_CAP: u32 = 5;

/// The longest server pushback (`grpc-retry-pushback-ms`) the layers wait out by default;
/// a longer one stops the retries. A6 caps `maxAttempts` on the client because service
/// config comes from DNS; a pushback comes from any server, and deserves a cap too.
pub(crate) const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(60);

/// Never-sent attempts retried transparently when the call has no deadline. With a deadline
/// they are retried until it passes, as A6 says; without one, something must end the loop.
pub(crate) const DEFAULT_MAX_TRANSPARENT_RETRIES: u32 = 10;

/// The policy of one method: retried or hedged, never both; or neither, with a timeout.
#[derive(Debug, Clone)]
pub enum MethodPolicy {
    /// Retried, by whichever layer ([`RetryLayer`](crate::RetryLayer) or
    /// [`HedgeLayer`](crate::HedgeLayer)) meets the call first.
    Retry(Arc<RetryPolicy>),
    /// Hedged, by whichever layer meets the call first.
    Hedge(Arc<HedgePolicy>),
    /// Neither retried nor hedged, but given this call timeout across its (transparent)
    /// attempts: what a service-config method entry with only a `timeout` means.
    Timeout(Duration),
    /// Neither retried nor hedged, but sent with gRPC's wait-for-ready semantics: an attempt
    /// that could not be sent because no connection could be made is resent, with backoff,
    /// until the deadline (this call timeout, if any). What a service-config method entry
    /// with `"waitForReady": true` and no retry or hedging policy means.
    WaitForReady(Option<Duration>),
}

impl MethodPolicy {
    /// The call timeout the policy sets, used with the request's `grpc-timeout` (the
    /// earliest wins).
    pub fn timeout(&self) -> Option<Duration> {
        match self {
            MethodPolicy::Retry(policy) => policy.timeout,
            MethodPolicy::Hedge(policy) => policy.timeout,
            MethodPolicy::Timeout(timeout) => Some(*timeout),
            MethodPolicy::WaitForReady(timeout) => *timeout,
        }
    }
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
