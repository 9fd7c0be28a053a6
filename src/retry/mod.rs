//! gRFC A6 retries for any tower service whose requests are `http::Request<B>`.
//!
//! [`Retry`] looks up each request's policy in a [`Policies`] table and hands the call to
//! the crate's one call engine, which applies every rule of A6 (the module docs of
//! [`hedge`](crate::hedge) describe the same engine's hedging). [The guide's section on how a
//! retried call runs](crate::guide#how-a-retried-call-runs) walks through those rules, step by
//! step, for a method with a [`RetryPolicy`](crate::RetryPolicy), and tells what becomes of an
//! attempt that could not be sent.
//!
//! A method with a [`HedgePolicy`](crate::HedgePolicy) is hedged, never retried, whichever
//! of the two layers meets its call first. A method without a policy still gets A6's
//! transparent retries (unless
//! [`transparent_retries(false)`](crate::policy::PoliciesBuilder::transparent_retries)) and
//! credits the throttle when it succeeds; a method whose policy is only a timeout gets that
//! deadline too.
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
//! How later attempts use [`poll_ready`](tower_service::Service::poll_ready) and clones of the
//! service, and what a clone of a [`Retry`] costs: [the guide's section on
//! them](crate::guide#poll_ready-and-cloned-services).
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
    /// the first call (see [the guide](crate::guide#poll_ready-and-cloned-services)), which a
    /// change made here does not reach.
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
