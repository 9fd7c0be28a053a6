//! A load balancer that sends each attempt of a call to a backend the call has not tried, and
//! stops sending attempts to a backend that keeps failing (feature `balance`).
//!
//! Why it remembers the backends a call tried, how it picks, and how it composes with the layers,
//! tonic and discovery: [the guide's section on load balancing](crate::guide#load-balancing).
//!
//! # Outlier detection
//!
//! On by default ([`OutlierDetection::default()`]; [`Balance::outlier_detection`] and
//! [`BalancedChannel::builder`] set other knobs, [`OutlierDetection::disabled()`] none). What it
//! counts as a failure, when it ejects and brings back a backend, why these defaults, and how it
//! shows: [the guide's section on it](crate::guide#outlier-detection-in-the-balancer).
//!
//! # The record of backends tried
//!
//! A call's attempts share a [`TriedBackends`] record (the layers copy a request's extensions
//! to every attempt, and clones of a record share one list), in which the balancer notes each
//! pick and which it reads to skip the backends the call has tried. The layers give one to:
//!
//! - every call of a **hedging policy**, by default, whether the policy was built in code or
//!   read from service-config JSON (A6: "hedged requests should be sent to distinct
//!   backends"); [`HedgePolicyBuilder::track_backends(false)`](crate::policy::HedgePolicyBuilder::track_backends)
//!   drops it;
//! - every call of a table built with `track_backends(true)`
//!   ([`PoliciesBuilder::track_backends`](crate::policy::PoliciesBuilder::track_backends)),
//!   retry policies included: a retry policy does not record by default, because the record
//!   costs every call 7 allocations, and most calls never retry (BENCHMARKS.md,
//!   "Several backends", has the figure). Turn it on for retry policies over this balancer,
//!   for a table from JSON too:
//!   `ServiceConfig::from_json(json)?.policies_builder_with(Jitter::GRPC).track_backends(true).build()`.
//!
//! **A call without a record** is balanced attempt by attempt as if each were a call of its
//! own: power of two choices on requests in flight, weighed by recent failures, with
//! ejected backends left out. Its retry can land on the backend that just failed it, and its
//! hedge on the backend its first attempt is stuck on when that one is no more loaded than
//! the others (the layers cannot see what is below them, so they do not guess).
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
//!             .body(http_body_util::Empty::<bytes::Bytes>::new())?;
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

mod body;
mod future;
mod outlier;
mod pick;

#[cfg(feature = "tonic-transport")]
mod channel;

pub use body::ResponseBody;
#[cfg(feature = "tonic-transport")]
pub use channel::{BalancedChannel, BalancedChannelBuilder, ChannelFuture};
pub use future::{NoReadyEndpoint, ResponseFuture};
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub use outlier::OutlierMetrics;
pub use outlier::{
    Ejection, EjectionReason, FailurePercentageEjection, OutlierDetection, OutlierDetectionBuilder,
    Outliers, SuccessRateEjection,
};

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tower::discover::{Change, Discover};
use tower::load::Load;
use tower::ready_cache::ReadyCache;
use tower_service::Service;

use crate::error::BoxError;
use crate::metadata::{AttemptInfo, BackendId, TriedBackends};
use outlier::{Detector, Health};

/// Balances requests over the endpoints of a [`Discover`]: power of two choices on load,
/// among the endpoints the request's call has not tried yet, with outlier detection (see the
/// [module docs](self)).
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
    /// `None` when outlier detection is disabled.
    outliers: Option<Detector>,
    /// The view of the ejections, shared with [`Outliers`] handles.
    view: Outliers,
}

impl<D, Req> Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq + Clone,
    D::Service: Service<Req>,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
{
    /// A balancer over the endpoints `discover` gives, with a random generator seeded from the
    /// thread's, and [`OutlierDetection::default()`].
    pub fn new(discover: D) -> Self {
        Self::from_rng(discover, SmallRng::from_rng(&mut rand::rng()))
    }

    /// A balancer whose random draws follow `seed`, for repeatable tests and simulations.
    pub fn with_seed(discover: D, seed: u64) -> Self {
        Self::from_rng(discover, SmallRng::seed_from_u64(seed))
    }

    fn from_rng(discover: D, rng: SmallRng) -> Self {
        let outliers = Detector::new(OutlierDetection::default());
        let view = outliers
            .as_ref()
            .map(|detector| detector.view().clone())
            .unwrap_or_default();
        Balance {
            discover,
            discover_ended: false,
            endpoints: ReadyCache::default(),
            rng,
            outliers,
            view,
        }
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq,
{
    /// Replaces the outlier detection ([`OutlierDetection::default()`] unless set);
    /// [`OutlierDetection::disabled()`] turns it off. Set it before the first `poll_ready`:
    /// what the balancer learned so far is forgotten.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::discover::ServiceList;
    /// use tower::load::{CompleteOnResponse, PendingRequests};
    /// use tower_retry_hedge::balance::{Balance, OutlierDetection};
    ///
    /// # type Req = http::Request<String>;
    /// let backend = || {
    ///     let service = tower::service_fn(|_: Req| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
    ///     });
    ///     PendingRequests::new(service, CompleteOnResponse::default())
    /// };
    /// let detection = OutlierDetection::builder()
    ///     .base_ejection_time(Duration::from_secs(10))
    ///     .build()?;
    /// let balance: Balance<_, Req> =
    ///     Balance::new(ServiceList::new([backend(), backend()])).outlier_detection(detection);
    /// # let _ = balance;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn outlier_detection(mut self, config: OutlierDetection) -> Self {
        self.outliers = Detector::new(config);
        if let Some(detector) = &self.outliers {
            self.view = detector.view().clone();
        } else {
            self.view = Outliers::default();
        }
        self
    }

    /// A view of the ejected backends and of the ejections so far, which stays current as the
    /// balancer runs (also once it is moved into a [`tower::buffer::Buffer`]).
    ///
    /// ```
    /// use tower::discover::ServiceList;
    /// use tower::load::{CompleteOnResponse, PendingRequests};
    /// use tower_retry_hedge::balance::Balance;
    ///
    /// # type Req = http::Request<String>;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let backend = || {
    ///     let service = tower::service_fn(|_: Req| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
    ///     });
    ///     PendingRequests::new(service, CompleteOnResponse::default())
    /// };
    /// let balance: Balance<_, Req> = Balance::new(ServiceList::new([backend(), backend()]));
    /// let outliers = balance.outliers();
    /// let balanced = tower::buffer::Buffer::new(balance, 16);
    /// // ... calls through `balanced` ...
    /// assert!(outliers.ejected().is_empty());
    /// # let _ = balanced;
    /// # }
    /// ```
    pub fn outliers(&self) -> Outliers {
        self.view.clone()
    }

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
            .field("outliers", &self.outliers)
            .finish_non_exhaustive()
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone + fmt::Debug,
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
                    // A key known already keeps what the balancer learned of it.
                    let health = self
                        .outliers
                        .as_mut()
                        .map(|detector| detector.insert(id, || format!("{key:?}")));
                    // An endpoint already known under this key is replaced once the new one
                    // is ready; calls in flight on the old one go on.
                    self.endpoints.push(
                        key,
                        Endpoint {
                            id,
                            service,
                            health,
                        },
                    );
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    // Calls in flight keep their response futures; only new calls lose it.
                    if let Some(detector) = &mut self.outliers {
                        detector.remove(BackendId::of(&key));
                    }
                    self.endpoints.evict(&key);
                }
            }
        }
        Ok(())
    }

    /// Moves the endpoints that became ready to the ready set; drops those that failed.
    ///
    /// Outside tokio's task budget. An endpoint behind a tokio resource (a `Buffer`, as every
    /// tonic channel is) polled once the task's budget is spent says Pending only to make the
    /// task yield, and tokio wakes it when a worker thread next runs out of work: under load,
    /// long after. Meanwhile the picks pass it over, and a hedge whose call tried every other
    /// backend goes back to one of them. The task still yields: receiving requests spends
    /// its budget.
    fn promote_ready(&mut self, cx: &mut Context<'_>) {
        let (endpoints, outliers) = (&mut self.endpoints, &mut self.outliers);
        let promote = std::future::poll_fn(|cx| {
            loop {
                match endpoints.poll_pending(cx) {
                    // None left pending, or none of them ready yet.
                    Poll::Ready(Ok(())) | Poll::Pending => return Poll::Ready(()),
                    Poll::Ready(Err(failed)) => {
                        tracing::debug!(error = %failed.1, "balance: dropping an endpoint that failed");
                        if let Some(detector) = outliers {
                            detector.remove(BackendId::of(&failed.0));
                        }
                    }
                }
            }
        });
        let _promoted = std::pin::pin!(tokio::task::coop::unconstrained(promote)).poll(cx);
    }
}

/// The ready endpoints, as the picker sees them.
struct Ready<'a, K: Hash + Eq, S, Req> {
    endpoints: &'a ReadyCache<K, Endpoint<S>, Req>,
    /// Whether some backend is ejected; the clock for the weights, if failures weigh the pick.
    any_ejected: bool,
    now: Option<Instant>,
}

impl<K, S, Req> pick::Candidates for Ready<'_, K, S, Req>
where
    K: Hash + Eq,
    S: Load,
    S::Metric: PartialOrd,
{
    type Load = S::Metric;

    fn len(&self) -> usize {
        self.endpoints.ready_len()
    }

    fn id(&self, index: usize) -> BackendId {
        self.endpoint(index).id
    }

    fn load(&self, index: usize) -> S::Metric {
        self.endpoint(index).service.load()
    }

    fn any_ejected(&self) -> bool {
        self.any_ejected
    }

    fn ejected(&self, index: usize) -> bool {
        self.endpoint(index)
            .health
            .as_ref()
            .is_some_and(|health| health.is_ejected())
    }

    fn weight(&self, index: usize) -> f64 {
        match (&self.endpoint(index).health, self.now) {
            (Some(health), Some(now)) => health.weight(now),
            _ => 1.0,
        }
    }
}

impl<K: Hash + Eq, S, Req> Ready<'_, K, S, Req> {
    fn endpoint(&self, index: usize) -> &Endpoint<S> {
        let (_, endpoint) = self
            .endpoints
            .get_ready_index(index)
            .expect("the picker asks only for indices below the ready count");
        endpoint
    }
}

impl<D, B, RB> Service<http::Request<B>> for Balance<D, http::Request<B>>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone + fmt::Debug,
    D::Error: Into<BoxError>,
    D::Service: Service<http::Request<B>, Response = http::Response<RB>> + Load,
    <D::Service as Load>::Metric: PartialOrd,
    <D::Service as Service<http::Request<B>>>::Error: Into<BoxError>,
{
    type Response = http::Response<ResponseBody<RB>>;
    type Error = BoxError;
    type Future = ResponseFuture<<D::Service as Service<http::Request<B>>>::Future>;

    /// Applies discovery's changes, drives endpoints to readiness, and runs the outlier
    /// detection that is due; ready once one endpoint is. With none, it waits for discovery
    /// or an endpoint to wake it.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.discover(cx)?;
        self.promote_ready(cx);
        if let Some(detector) = &mut self.outliers {
            detector.poll(Instant::now(), &mut self.rng);
        }
        if self.endpoints.ready_len() > 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let ready = Ready {
            endpoints: &self.endpoints,
            any_ejected: self.outliers.as_ref().is_some_and(Detector::any_ejected),
            now: self
                .outliers
                .as_ref()
                .filter(|detector| detector.weighs_failures())
                .map(Detector::now),
        };
        let rng = &mut self.rng;
        let extensions = request.extensions();
        let index = match extensions.get::<TriedBackends>() {
            Some(tried) => {
                let hedge = extensions.get::<AttemptInfo>().is_some_and(|a| a.hedge);
                tried.pick_and_record(|tried| {
                    let index = pick::pick(&ready, tried, hedge, rng)?;
                    Some((index, pick::Candidates::id(&ready, index)))
                })
            }
            None => pick::pick(&ready, &[], false, rng),
        };
        match index {
            Some(index) => {
                let health = ready.endpoint(index).health.clone();
                ResponseFuture::called(self.endpoints.call_ready_index(index, request), health)
            }
            None => ResponseFuture::not_ready(),
        }
    }
}

/// An endpoint, its id in the calls' records, and what the balancer learns of it.
struct Endpoint<S> {
    id: BackendId,
    service: S,
    health: Option<Arc<Health>>,
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
