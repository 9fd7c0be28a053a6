//! gRFC A6 retries for any tower service whose requests are `http::Request<B>`.
//!
//! [`Retry`] looks up each request's policy in a [`Policies`] table and hands the call to
//! the crate's one call engine, which applies every rule of A6 (the module docs of
//! [`hedge`](crate::hedge) describe the same engine's hedging). For a method with a
//! [`RetryPolicy`](crate::RetryPolicy):
//!
//! 1. The deadline is the earliest of the request's `grpc-timeout` (gRPC), the policy's
//!    timeout and a [`Deadline`](crate::metadata::Deadline) extension. It spans every attempt
//!    and every wait; each gRPC attempt carries the *remaining* time in `grpc-timeout`. When
//!    it passes, the call ends: a gRPC call with the `tonic` feature returns
//!    `Status::deadline_exceeded`, other calls [`DeadlineExceeded`].
//! 2. The body is made replayable within the [`BufferLimits`](crate::body::BufferLimits);
//!    one that cannot be (its size is known to be over the limit) is sent once, untouched,
//!    and its call is never retried.
//! 3. Attempt 1 is sent; attempt N+1 carries `grpc-previous-rpc-attempts: N` (transparent
//!    retries are not counted).
//! 4. The outcome is classified ([`classify`](crate::classify)). A success is returned and
//!    credits the throttle. A response with ordinary headers (not Trailers-Only) commits the
//!    call and is returned as it is.
//! 5. A retryable failure debits the throttle; the call is retried only if attempts remain
//!    (`maxAttempts`, clamped to the client cap), the body can still be replayed, the throttle
//!    is above half, no pushback said stop, and the next attempt can start before the
//!    deadline.
//! 6. The wait is the server's pushback exactly when it gave one (and the backoff then
//!    restarts from its first step), else the backoff schedule's next delay. When the wait
//!    would reach the deadline, the call returns the last failure at once rather than
//!    sleeping into a certain `DEADLINE_EXCEEDED`.
//! 7. The last attempt's outcome is returned. After more than one attempt it carries an
//!    [`Attempts`](crate::metadata::Attempts) extension and, for gRPC, the
//!    `grpc-previous-rpc-attempts` of the retry attempts made; after one, neither (read it
//!    with [`Attempts::of`](crate::metadata::Attempts::of)), so the success path allocates
//!    nothing for it.
//!
//! A method with a [`HedgePolicy`](crate::HedgePolicy) is hedged, never retried, whichever
//! of the two layers meets its call first. A method without a policy still gets A6's
//! transparent retries (unless
//! [`transparent_retries(false)`](crate::policy::PoliciesBuilder::transparent_retries)) and
//! credits the throttle when it succeeds; a method whose policy is only a timeout gets that
//! deadline too.
//!
//! An attempt that could not be sent because no connection could be made is, as in gRPC, an
//! `UNAVAILABLE` (HTTP: 503) failure for the policy: counted, backed off and throttled like
//! any other, and retried whatever the HTTP method, since it never reached the server; a
//! call without a policy fails at once. With gRPC's wait-for-ready
//! ([`wait_for_ready`](crate::policy::RetryPolicyBuilder::wait_for_ready), or
//! `"waitForReady": true` in service config) it is resent transparently, with backoff, until
//! the deadline (or [`max_transparent_retries`](crate::policy::RetryPolicyBuilder::max_transparent_retries)
//! times without one). A stream refused before the server's application saw it is resent
//! once at once, then judged by the policy. Transparent resends count toward neither
//! `maxAttempts` nor the throttle.
//!
//! Every error a call returns is one [`Attempted`](crate::error::Attempted) around the last
//! attempt's error, whatever the number of attempts.
//!
//! Non-idempotent HTTP requests (`POST`, `PATCH`, …) are not retried after a response or an
//! ambiguous error unless the policy opts in; gRPC requests are not gated.
//!
//! # One layer, two names
//!
//! [`HedgeLayer`](crate::HedgeLayer) and [`Hedge`](crate::Hedge) are this module's
//! [`RetryLayer`] and [`Retry`] under the names hedging users reach for: one type, which
//! drives every call by its method's policy, retried or hedged. One layer is all a stack
//! needs. Stacking two is harmless: the layer that meets a call first drives it, and a layer
//! of this crate below passes its attempts through, so no call is driven twice.
//!
//! A layer below knows a call's first attempt is driven while the layer above calls it (a
//! thread-local flag, so that marking the request costs nothing); later attempts also carry
//! a mark in their extensions. A layer that moves calls to another task, such as
//! `tower::buffer::Buffer`, hides the first attempt: put it above both layers or below both.
//!
//! # `poll_ready` and cloned services
//!
//! The first attempt goes to the service that [`poll_ready`](tower_service::Service::poll_ready)
//! made ready, which stays in `self` for the next call. At its first call the layer also keeps
//! a spare clone of the service, shared by its calls; a call that retries clones the spare for
//! its later attempts, and a call that does not clones nothing (a clone per call would cost a
//! tonic `Channel` an allocation and a `poll_ready` from cold). The exception is a policy
//! that hedges on its per-attempt timeout, whose calls take their clone at the start. Before each later attempt the
//! future polls its clone ready, so a buffer or a concurrency limit below sees every attempt
//! as a request of its own and no capacity is taken while the future waits out a backoff.
//!
//! Each clone of a [`Retry`] keeps its own spare, and its own references to the table's
//! policies and throttle, made at its first call: calls through clones on different cores
//! write nothing they share while they succeed (the throttle's bucket, budgets and latency
//! windows stay one, shared by every clone). Clone the stack per task or per core, not per
//! call: a clone's first call pays for making them.
//!
//! # Examples
//!
//! A tonic client (with the `tonic` feature), policies from code:
//!
//! ```
//! # #[cfg(feature = "tonic")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_retry_hedge::backoff::Exponential;
//! use tower_retry_hedge::classify::{Code, GrpcCodes};
//! use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(4)
//!     .backoff(Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)?)
//!     .retryable(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let policies = Policies::builder().service("helloworld.Greeter", policy).build();
//!
//! let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
//! let svc = ServiceBuilder::new().layer(RetryLayer::new(policies)).service(channel);
//! // let client = GreeterClient::new(svc);
//! # let _ = svc;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "tonic"))]
//! # fn main() {}
//! ```
//!
//! Any service of `http::Request<Full<Bytes>>`, with a customised HTTP policy and a throttle:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use bytes::Bytes;
//! use http_body_util::{Empty, Full};
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_retry_hedge::backoff::{Exponential, Jitter};
//! use tower_retry_hedge::classify::HttpStatuses;
//! use tower_retry_hedge::metadata::Attempts;
//! use tower_retry_hedge::policy::Route;
//! use tower_retry_hedge::throttle::Throttle;
//! use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(3)
//!     .backoff(Exponential::new(Duration::from_millis(1), Duration::from_millis(4), 2.0, Jitter::None)?)
//!     .retryable(HttpStatuses::default())
//!     .build()?;
//! let policies = Policies::builder()
//!     .route(Route::prefix("/"), policy)
//!     .throttle(Throttle::new(10, 0.1)?)
//!     .build();
//!
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let server = service_fn(move |_req: http::Request<Full<Bytes>>| {
//!     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async move {
//!         let status = if n == 0 { 503 } else { 200 };
//!         Ok::<_, std::convert::Infallible>(
//!             http::Response::builder().status(status).body(Empty::<Bytes>::new()).unwrap(),
//!         )
//!     }
//! });
//! let svc = ServiceBuilder::new().layer(RetryLayer::new(policies)).service(server);
//! let response = svc
//!     .oneshot(http::Request::get("/items").body(Full::new(Bytes::from("x")))?)
//!     .await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(Attempts::of(&response).sent(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`DeadlineExceeded`]: crate::error::DeadlineExceeded

mod call;
mod layer;

use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use self::call::Handles;
pub use self::call::ResponseFuture;
pub use self::layer::RetryLayer;
use crate::body::Replay;
use crate::error::BoxError;
use crate::policy::Policies;

/// Retries or hedges requests by their method's [`RetryPolicy`](crate::RetryPolicy) or
/// [`HedgePolicy`](crate::HedgePolicy): see [the module docs](self) and
/// [`hedge`](crate::hedge)'s. [`Hedge`](crate::Hedge) is this type.
#[derive(Debug, Clone)]
pub struct Retry<S> {
    inner: S,
    // This clone's own, made at its first call that needs them (a clone starts with none):
    // a spare clone of `inner`, which calls clone again only when they retry (a clone per
    // call costs real services, a tonic `Channel`, an allocation), and the references its
    // calls take, on handles no other clone writes.
    handles: Handles<S>,
    policies: Policies,
}

impl<S> Retry<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, policies: Policies) -> Retry<S> {
        Retry {
            inner,
            handles: Handles::default(),
            policies,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. Later attempts are made on clones of the spare taken at
    /// the first call (see [the module docs](self)), which a change made here does not reach.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The policy table.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }
}

impl<S, B, RB> Service<Request<B>> for Retry<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        call::call(&mut self.inner, &mut self.handles, &self.policies, request)
    }
}
