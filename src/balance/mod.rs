//! A load balancer that sends each attempt of a call to a backend the call has not tried
//! (feature `balance`).
//!
//! A retry that lands on the backend that just failed, or a hedge sent to the backend the
//! first attempt is stuck on, buys nothing. tower's `p2c::Balance` and tonic's
//! `Channel::balance_list` pick each attempt afresh: over 3 backends with one dead, 3
//! attempts of a call all land on the dead one once in 27 calls. [`Balance`] reads the call's
//! [`TriedBackends`] record and draws only among the endpoints the call has not tried (Envoy's
//! `previous_hosts` retry predicate; grpc-java passes each attempt through its picker again).
//!
//! # How it picks
//!
//! [`Balance`] is a tower [`Service`] over a [`tower::discover::Discover`] of endpoint
//! services that measure their [`Load`] (wrap them in
//! [`tower::load::PendingRequests`] or [`tower::load::PeakEwma`]). Endpoints are driven to
//! readiness by tower's [`ReadyCache`], as in tower's own
//! balancer. For each request:
//!
//! 1. Without a [`TriedBackends`] extension: power of two choices on load among the ready
//!    endpoints (two drawn at random, the less loaded one takes the request), as tower's
//!    `p2c::Balance` does.
//! 2. With one: the same, drawn only among the ready endpoints whose [`BackendId`] the record
//!    does not hold; when every ready endpoint was tried, among all of them. Then the id of
//!    the endpoint picked is added to the record, which every attempt of the call shares, so
//!    the next attempt avoids it.
//!
//! An endpoint's id is [`BackendId::of`] its discovery key (for [`BalancedChannel`], the
//! endpoint's URI, or the key of its [`Change`](tonic::transport::channel::Change)).
//!
//! The choice is among *ready* endpoints: an untried endpoint that is not ready (its
//! connection is being set up, or its buffer is full) is passed over in favour of a tried one
//! that is, rather than holding the attempt back. tonic channels are ready at once.
//!
//! # Turning the record on
//!
//! Say so in the policy table the layers above are built from:
//! `Policies::builder().track_backends(true)`
//! ([`track_backends`](crate::policy::PoliciesBuilder::track_backends)). Every call through
//! those layers then keeps a [`TriedBackends`] record that its attempts share (the layers copy
//! a request's extensions to every attempt, and clones of a record share one list). The layers
//! cannot see what is below them, so they do not guess: without the switch a call carries no
//! record, and its retries are balanced as its first attempt was. A hedging policy can keep
//! the record for its own calls alone
//! ([`HedgePolicyBuilder::track_backends`](crate::policy::HedgePolicyBuilder::track_backends)).
//! A request above the layers may also bring its own record:
//!
//! ```
//! use tower_retry_hedge::metadata::TriedBackends;
//!
//! fn with_tried_backends<B>(mut request: http::Request<B>) -> http::Request<B> {
//!     request.extensions_mut().insert(TriedBackends::default());
//!     request
//! }
//! # let _ = with_tried_backends(http::Request::new(()));
//! ```
//!
//! A request without the record costs the balancer one extension lookup, and is balanced as
//! tower balances.
//!
//! # Example
//!
//! Three backends, one of which always answers `UNAVAILABLE`, under a retry policy of 3
//! attempts: every call succeeds, since no call tries the dead backend twice.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_retry_hedge::BoxError> {
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower::buffer::Buffer;
//! use tower::discover::ServiceList;
//! use tower::load::{CompleteOnResponse, PendingRequests};
//! use tower::{Layer, ServiceExt, service_fn};
//! use tower_retry_hedge::backoff::{Exponential, Jitter};
//! use tower_retry_hedge::balance::Balance;
//! use tower_retry_hedge::classify::{Code, GrpcCodes};
//! use tower_retry_hedge::metadata::TriedBackends;
//! use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
//!
//! type Request = http::Request<Full<Bytes>>;
//!
//! // A backend that answers every call with this gRPC status (Trailers-Only).
//! let backend = |status: &'static str| {
//!     let service = service_fn(move |_: Request| async move {
//!         let response = http::Response::builder()
//!             .header("content-type", "application/grpc")
//!             .header("grpc-status", status)
//!             .body(())?;
//!         Ok::<_, BoxError>(response)
//!     });
//!     PendingRequests::new(service, CompleteOnResponse::default())
//! };
//! let endpoints = ServiceList::new([backend("0"), backend("14"), backend("0")]);
//! // The retry layer clones its service for later attempts; the balancer is not `Clone`.
//! let balanced = Buffer::new(Balance::new(endpoints), 64);
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(3)
//!     .backoff(Exponential::new(Duration::from_millis(1), Duration::from_millis(1), 2.0, Jitter::None)?)
//!     .retryable(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let policies = Policies::builder()
//!     .service("echo.Echo", policy)
//!     .track_backends(true)
//!     .build();
//! let retry = RetryLayer::new(policies);
//! let service = retry.layer(balanced);
//!
//! for _ in 0..100 {
//!     let mut request = http::Request::post("/echo.Echo/Say")
//!         .header("content-type", "application/grpc")
//!         .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))?;
//!     request.extensions_mut().insert(TriedBackends::default());
//!     let response = service.clone().oneshot(request).await?;
//!     assert_eq!(response.headers()["grpc-status"], "0");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # With tonic
//!
//! With the `tonic-transport` feature, [`BalancedChannel`] takes the place of tonic's
//! balanced `Channel`, one line for the other; the generated client is unchanged:
//!
//! ```no_run
//! # #[cfg(feature = "tonic-transport")]
//! # async fn example(policies: tower_retry_hedge::Policies) {
//! use tonic::transport::Endpoint;
//! use tower_retry_hedge::RetryLayer;
//! use tower_retry_hedge::balance::BalancedChannel;
//!
//! let endpoints = ["http://10.0.0.1:50051", "http://10.0.0.2:50051", "http://10.0.0.3:50051"]
//!     .map(Endpoint::from_static);
//! // was: let channel = Channel::balance_list(endpoints.into_iter());
//! let channel = BalancedChannel::balance_list(endpoints);
//! let service = tower::ServiceBuilder::new().layer(RetryLayer::new(policies)).service(channel);
//! // let client = GreeterClient::new(service);
//! # let _ = service;
//! # }
//! ```
//!
//! # How it composes
//!
//! - **tonic's balancer**: [`BalancedChannel`] replaces it, it does not stack on it. Each
//!   endpoint is a plain tonic `Channel` to one backend; a channel made by
//!   `Channel::balance_list` hides its backends, so as an endpoint of this balancer it would be
//!   one backend that answers from several, and avoiding it would avoid all of them.
//! - **`Clone`**: the retry and hedge layers clone their inner service for later attempts, and
//!   [`Balance`] is not `Clone` (it owns the endpoints). Put a
//!   [`tower::buffer::Buffer`] over it, as tonic does over its own balancer;
//!   [`BalancedChannel`] does.
//! - **Order**: the layers go above the balancer (one call, several attempts, each balanced);
//!   a balancer above the layers would pick once per call.
//! - **A throttle per authority**
//!   ([`throttle_per_authority`](crate::policy::PoliciesBuilder::throttle_per_authority)): the
//!   layers read the authority of the request *above* the balancer, the name of the service,
//!   not of a backend, so one bucket counts the failures of the whole backend set, as gRFC A6
//!   asks ("per server name"). The bucket still counts every failure of a bad backend: one
//!   that fails every call drains the bucket all backends share, and the throttle then stops
//!   retries to the healthy ones too.
//! - **Ejection is out of scope**: a backend that fails is avoided by the calls that tried it,
//!   not by the others. Take a backend that keeps failing out of the discovery stream (or use
//!   an outlier detector below). An endpoint whose `poll_ready` fails is dropped, as tower's
//!   balancer drops it, until discovery inserts it again.

mod pick;

#[cfg(feature = "tonic-transport")]
mod channel;

#[cfg(feature = "tonic-transport")]
pub use channel::{BalancedChannel, ChannelFuture};

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tower::discover::{Change, Discover};
use tower::load::Load;
use tower::ready_cache::ReadyCache;
use tower_service::Service;

use crate::BoxError;
use crate::metadata::{BackendId, TriedBackends};

/// Balances requests over the endpoints of a [`Discover`]: power of two choices on load,
/// among the endpoints the request's call has not tried yet (see the [module docs](self)).
///
/// Not `Clone`: put a [`tower::buffer::Buffer`] over it for the retry and hedge layers.
pub struct Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq,
{
    discover: D,
    /// The discovery stream ended: the endpoints it gave stay, and it is not polled again.
    discover_ended: bool,
    endpoints: ReadyCache<D::Key, Endpoint<D::Service>, Req>,
    rng: SmallRng,
}

impl<D, Req> Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq + Clone,
    D::Service: Service<Req>,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
{
    /// A balancer over the endpoints `discover` gives, with a random generator seeded from the
    /// thread's.
    pub fn new(discover: D) -> Self {
        Self::from_rng(discover, SmallRng::from_rng(&mut rand::rng()))
    }

    /// A balancer whose random draws follow `seed`, for repeatable tests and simulations.
    pub fn with_seed(discover: D, seed: u64) -> Self {
        Self::from_rng(discover, SmallRng::seed_from_u64(seed))
    }

    fn from_rng(discover: D, rng: SmallRng) -> Self {
        Balance {
            discover,
            discover_ended: false,
            endpoints: ReadyCache::default(),
            rng,
        }
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq,
{
    /// The endpoints known (ready or not), as of the last `poll_ready`.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether no endpoint is known, as of the last `poll_ready`.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
}

impl<D, Req> fmt::Debug for Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance")
            .field("ready", &self.endpoints.ready_len())
            .field("pending", &self.endpoints.pending_len())
            .field("discover_ended", &self.discover_ended)
            .finish_non_exhaustive()
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone,
    D::Error: Into<BoxError>,
    D::Service: Service<Req>,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
{
    /// Applies the changes discovery has ready. A discovery error is returned as it is.
    fn discover(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError> {
        while !self.discover_ended {
            match Pin::new(&mut self.discover).poll_discover(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => self.discover_ended = true,
                Poll::Ready(Some(Err(error))) => return Err(error.into()),
                Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                    let id = BackendId::of(&key);
                    // An endpoint already known under this key is replaced once the new one
                    // is ready; calls in flight on the old one go on.
                    self.endpoints.push(key, Endpoint { id, service });
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    // Calls in flight keep their response futures; only new calls lose it.
                    self.endpoints.evict(&key);
                }
            }
        }
        Ok(())
    }

    /// Moves the endpoints that became ready to the ready set; drops those that failed.
    fn promote_ready(&mut self, cx: &mut Context<'_>) {
        loop {
            match self.endpoints.poll_pending(cx) {
                // None left pending, or none of them ready yet.
                Poll::Ready(Ok(())) | Poll::Pending => return,
                Poll::Ready(Err(failed)) => {
                    tracing::debug!(error = %failed, "balance: dropping an endpoint that failed");
                }
            }
        }
    }
}

/// The ready endpoints, as the picker sees them.
struct Ready<'a, K: Hash + Eq, S, Req>(&'a ReadyCache<K, Endpoint<S>, Req>);

impl<K, S, Req> pick::Candidates for Ready<'_, K, S, Req>
where
    K: Hash + Eq,
    S: Load,
    S::Metric: PartialOrd,
{
    type Load = S::Metric;

    fn len(&self) -> usize {
        self.0.ready_len()
    }

    fn id(&self, index: usize) -> BackendId {
        self.endpoint(index).id
    }

    fn load(&self, index: usize) -> S::Metric {
        self.endpoint(index).service.load()
    }
}

impl<K: Hash + Eq, S, Req> Ready<'_, K, S, Req> {
    fn endpoint(&self, index: usize) -> &Endpoint<S> {
        let (_, endpoint) = self
            .0
            .get_ready_index(index)
            .expect("the picker asks only for indices below the ready count");
        endpoint
    }
}

impl<D, B> Service<http::Request<B>> for Balance<D, http::Request<B>>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone,
    D::Error: Into<BoxError>,
    D::Service: Service<http::Request<B>> + Load,
    <D::Service as Load>::Metric: PartialOrd,
    <D::Service as Service<http::Request<B>>>::Error: Into<BoxError>,
{
    type Response = <D::Service as Service<http::Request<B>>>::Response;
    type Error = BoxError;
    type Future = ResponseFuture<<D::Service as Service<http::Request<B>>>::Future>;

    /// Applies discovery's changes and drives endpoints to readiness; ready once one
    /// endpoint is. With none, it waits for discovery or an endpoint to wake it.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.discover(cx)?;
        self.promote_ready(cx);
        if self.endpoints.ready_len() > 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let ready = Ready(&self.endpoints);
        let rng = &mut self.rng;
        let index = match request.extensions().get::<TriedBackends>() {
            Some(tried) => tried.pick_and_record(|tried| {
                let index = pick::pick(&ready, tried, rng)?;
                Some((index, pick::Candidates::id(&ready, index)))
            }),
            None => pick::pick(&ready, &[], rng),
        };
        match index {
            Some(index) => ResponseFuture {
                state: State::Called {
                    future: self.endpoints.call_ready_index(index, request),
                },
            },
            None => ResponseFuture {
                state: State::NotReady {
                    error: Some(Box::new(NoReadyEndpoint(()))),
                },
            },
        }
    }
}

/// An endpoint and its id in the calls' records.
struct Endpoint<S> {
    id: BackendId,
    service: S,
}

impl<S, Req> Service<Req> for Endpoint<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> S::Future {
        self.service.call(request)
    }
}

/// The balancer was called while no endpoint was ready: `call` without a `poll_ready` that
/// returned ready first, which the `Service` contract rules out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoReadyEndpoint(());

impl fmt::Display for NoReadyEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("balancer called with no ready endpoint")
    }
}

impl std::error::Error for NoReadyEndpoint {}

pin_project_lite::pin_project! {
    /// The response future of [`Balance`]: the endpoint's, with its error boxed.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The endpoint's response future.
        Called { #[pin] future: F },
        // `call` came with no endpoint ready: the error, until polled.
        NotReady { error: Option<BoxError> },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future } => future.poll(cx).map_err(Into::into),
            StateProj::NotReady { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| Box::new(NoReadyEndpoint(()))))),
        }
    }
}
