//! gRFC A6 hedging: several copies of a request in flight, the first good answer wins.
//!
//! [`HedgeLayer`] is [`RetryLayer`] under the name hedging users reach for: one layer,
//! which looks up each request's policy in a [`Policies`](crate::Policies) table and hands
//! the call to the crate's one call engine. A method with a
//! [`RetryPolicy`](crate::RetryPolicy) is retried, one without a policy gets A6's transparent
//! retries (see [the retry module docs](crate::retry#one-layer-two-names)). For a method with
//! a [`HedgePolicy`](crate::HedgePolicy):
//!
//! - Attempt 1 goes at once; another every hedging delay (zero: all at once), up to
//!   `maxAttempts` (clamped to the client cap). With `maxAttempts` 4 and a 500 ms delay and no
//!   answers, 1 attempt is outstanding at 1 ms, 2 at 501 ms, 3 at 1001 ms, 4 at 1501 ms.
//!   The first delay runs from the response future's first poll (a call answered on that
//!   poll never reads the clock or makes a timer); callers poll it at once, as `.await` does.
//! - The first success (or a response that commits the call) wins: every other attempt is
//!   dropped, which cancels it (tonic and hyper reset the stream, so the server sees the
//!   cancellation).
//! - A non-fatal failure sends the next hedge at once, and later hedges resume at the delay
//!   from then. A fatal failure cancels the rest and is returned.
//! - Pushback "stop" on any attempt: no more hedges; those in flight go on. Pushback of
//!   n ms: the next hedge after n ms, later ones at n + delay.
//! - Every hedge after the first needs the throttle above half, asked when the hedge's
//!   service is ready (a hedge never sent costs nothing); a non-fatal failure debits it, a
//!   success credits it. Throttled with nothing in flight: the failure is returned.
//! - When the request body outgrows the buffer, the attempt that has sent the most goes on,
//!   the others are cancelled, and no new hedge starts; an answer of another attempt that
//!   arrives before the call hears of it is dropped. A body too large to record is sent once
//!   and never hedged.
//! - When the next hedge cannot start before the deadline and nothing is in flight, the last
//!   failure is returned at once.
//! - When all attempts failed non-fatally, the last failure is returned once all are done.
//! - The deadline spans all attempts; attempts carry `grpc-previous-rpc-attempts` 1, 2, 3 …
//!   after the first, an [`AttemptInfo`](crate::metadata::AttemptInfo) extension, and (with
//!   [`PoliciesBuilder::track_backends`](crate::policy::PoliciesBuilder::track_backends) or
//!   [`HedgePolicyBuilder::track_backends`](crate::policy::HedgePolicyBuilder::track_backends)) a shared
//!   [`TriedBackends`](crate::metadata::TriedBackends) list for the load balancer.
//!   Statistics count the first attempt as the original and the others as retries.
//!
//! Beyond A6, the delay can follow a latency percentile: see
//! [`AdaptiveDelay`](crate::latency::AdaptiveDelay).
//!
//! # `poll_ready` and reserved capacity
//!
//! A hedge reserves nothing until it is sent: the future polls its own clone of the service
//! ready only when a hedge is due, then calls it at once. The first attempt goes to the
//! service that [`poll_ready`](tower_service::Service::poll_ready) made ready, which stays in
//! `self` for the next call, as in [`Retry`]. The clone is taken, when the
//! first hedge is due, from a spare that the layer clones at its first call and shares with
//! its calls: a call that sends no hedge clones nothing.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_retry_hedge::classify::{Code, GrpcCodes};
//! use tower_retry_hedge::metadata::Attempts;
//! use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies};
//!
//! let policy = HedgePolicy::builder()
//!     .max_attempts(3)
//!     .delay(Duration::from_millis(10))
//!     .non_fatal(GrpcCodes::from([Code::Unavailable]))
//!     .build()?;
//! let policies = Policies::builder().service("test.Echo", policy).build();
//!
//! // The first attempt is slow (1 s); the hedge sent at 10 ms answers in 2 ms.
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let server = service_fn(move |_req: http::Request<Full<Bytes>>| {
//!     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async move {
//!         let latency = if n == 0 { 1000 } else { 2 };
//!         tokio::time::sleep(Duration::from_millis(latency)).await;
//!         // The body says which attempt answered.
//!         Ok::<_, std::convert::Infallible>(http::Response::new(n.to_string()))
//!     }
//! });
//! let svc = ServiceBuilder::new().layer(HedgeLayer::new(policies)).service(server);
//! let started = tokio::time::Instant::now();
//! let request = http::Request::post("/test.Echo/Unary")
//!     .header("content-type", "application/grpc")
//!     .body(Full::new(Bytes::from_static(b"hello")))?;
//! let response = svc.oneshot(request).await?;
//! assert_eq!(response.body(), "1"); // the hedge won
//! assert_eq!(started.elapsed(), Duration::from_millis(12));
//! assert_eq!(Attempts::of(&response).sent(), 2);
//! # Ok(())
//! # }
//! ```

use crate::retry::{Retry, RetryLayer};

/// The layer of this crate under the name hedging users reach for: the same type as
/// [`RetryLayer`], which drives every call by its method's policy, hedged or retried.
///
/// ```
/// use tower_retry_hedge::{HedgeLayer, Policies, RetryLayer};
///
/// let layer: RetryLayer = HedgeLayer::new(Policies::builder().build());
/// # let _ = layer;
/// ```
pub type HedgeLayer = RetryLayer;

/// The service of [`HedgeLayer`]: the same type as [`Retry`], which hedges a call whose
/// method has a [`HedgePolicy`](crate::HedgePolicy) (see [the module docs](self)).
pub type Hedge<S> = Retry<S>;

pub use crate::retry::ResponseFuture;
