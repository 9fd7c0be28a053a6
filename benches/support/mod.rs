//! What the overhead and allocation benchmarks share: the echo service, the request shapes,
//! and every middleware variant they compare, built the same way for both.
//!
//! Each variant wraps the same [`Echo`] service and takes the same `http::Request<Full<Bytes>>`.
//! The peers that need `Clone` requests (tower-resilience) get them through [`CloneRequest`],
//! which rebuilds the request from its parts as any user of those crates must, since
//! `http::Request` is not `Clone`.

// Each benchmark binary uses its own part of this module.
#![allow(dead_code)]

pub mod clock;
pub mod counting;
pub mod streaming;
pub mod summary;

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, TE, USER_AGENT};
use http::{HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::classify::{AttemptResult, Code, GrpcCodes, Outcome};
use tower_retry_hedge::policy::HedgePolicyBuilder;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy};

/// The request type every variant takes.
pub type Req = Request<Full<Bytes>>;
/// The response type every variant returns.
pub type Res = Response<Full<Bytes>>;

/// The method the policies name: a unary gRPC call.
pub const METHOD: &str = "test.echo.Echo/Unary";
const URI: &str = "http://127.0.0.1:50051/test.echo.Echo/Unary";
const PAYLOAD: &[u8] = b"\x00\x00\x00\x00\x07\x0a\x05hello";
const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// What the request carries besides its method, URI and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// No headers at all.
    NoHeaders,
    /// `content-type: application/grpc`, `te: trailers`, `user-agent`, `grpc-accept-encoding`.
    Grpc4,
    /// The four, and `grpc-timeout: 1S`: the call gets a deadline.
    Grpc4Timeout,
}

impl Shape {
    /// Every shape, in table order.
    pub const ALL: [Shape; 3] = [Shape::NoHeaders, Shape::Grpc4, Shape::Grpc4Timeout];

    /// The shape's name in tables and benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Shape::NoHeaders => "no_headers",
            Shape::Grpc4 => "grpc_4_headers",
            Shape::Grpc4Timeout => "grpc_4_headers+timeout",
        }
    }
}

/// A fresh request of `shape`. Nothing in it allocates except the header map (two
/// allocations when there are headers): the URI, header names and values, and the body are
/// static.
pub fn request(shape: Shape) -> Req {
    let mut request = Request::new(Full::new(Bytes::from_static(PAYLOAD)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static(URI);
    if shape != Shape::NoHeaders {
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static("grpc-rust/0.14 tonic/0.14.9"),
        );
        headers.insert(
            GRPC_ACCEPT_ENCODING,
            HeaderValue::from_static("identity,deflate,gzip"),
        );
    }
    if shape == Shape::Grpc4Timeout {
        request
            .headers_mut()
            .insert(GRPC_TIMEOUT, HeaderValue::from_static("1S"));
    }
    request
}

/// A copy of a request, as a tower retry or hedge policy must make one: `http::Request` is
/// not `Clone`, so it is rebuilt from cloned parts and a clone of the body.
pub fn clone_request(request: &Req) -> Req {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    copy
}

/// A request that is `Clone`, for peers that require it.
#[derive(Debug)]
pub struct CloneRequest(pub Req);

impl Clone for CloneRequest {
    fn clone(&self) -> Self {
        CloneRequest(clone_request(&self.0))
    }
}

/// Answers every request at once with its own body.
#[derive(Debug, Clone, Copy)]
pub struct Echo;

impl Service<Req> for Echo {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ready(Ok(Response::new(request.into_body())))
    }
}

impl Service<CloneRequest> for Echo {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: CloneRequest) -> Self::Future {
        ready(Ok(Response::new(request.0.into_body())))
    }
}

/// tower's retry with the policy users write for `http` requests: clones the request,
/// retries 5xx up to `attempts_left` times after a fixed pause.
#[derive(Debug, Clone)]
pub struct CloningPolicy {
    attempts_left: u32,
}

fn failed<E>(result: &Result<Res, E>) -> bool {
    match result {
        Ok(response) => response.status().is_server_error(),
        Err(_) => true,
    }
}

impl CloningPolicy {
    /// Retries up to `attempts_left` times.
    pub fn new(attempts_left: u32) -> Self {
        CloningPolicy { attempts_left }
    }
}

impl<E> tower::retry::Policy<Req, Res, E> for CloningPolicy {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        if failed(result) && self.attempts_left > 0 {
            self.attempts_left -= 1;
            Some(tokio::time::sleep(Duration::from_millis(100)))
        } else {
            None
        }
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(clone_request(request))
    }
}

/// [`CloningPolicy`] with a tower [`TpsBudget`](tower::retry::budget::TpsBudget): successes
/// deposit, retries withdraw.
#[derive(Debug, Clone)]
pub struct BudgetPolicy {
    budget: Arc<tower::retry::budget::TpsBudget>,
    attempts_left: u32,
}

impl BudgetPolicy {
    /// Retries up to `attempts_left` times, while `budget` allows.
    pub fn new(budget: Arc<tower::retry::budget::TpsBudget>, attempts_left: u32) -> Self {
        BudgetPolicy {
            budget,
            attempts_left,
        }
    }
}

impl<E> tower::retry::Policy<Req, Res, E> for BudgetPolicy {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        use tower::retry::budget::Budget;
        if !failed(result) {
            self.budget.deposit();
            return None;
        }
        if self.attempts_left > 0 && self.budget.withdraw() {
            self.attempts_left -= 1;
            Some(tokio::time::sleep(Duration::from_millis(100)))
        } else {
            None
        }
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(clone_request(request))
    }
}

/// tower's hedge policy for `http` requests: every request may be hedged.
#[derive(Debug, Clone, Copy)]
pub struct HedgeAll;

impl tower::hedge::Policy<Req> for HedgeAll {
    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(clone_request(request))
    }

    fn can_retry(&self, _: &Req) -> bool {
        true
    }
}

/// The retry policy of the `ours_retry_policy` variant.
pub fn our_retry_policy() -> RetryPolicy {
    let backoff = Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)
        .expect("valid backoff");
    RetryPolicy::builder()
        .max_attempts(4)
        .backoff(backoff)
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid retry policy")
}

/// The hedge policy of the `ours_hedge_policy` variant.
pub fn our_hedge_policy() -> HedgePolicy {
    our_hedge_policy_built(|builder| builder)
}

/// [`our_hedge_policy`], changed by `change` before it is built.
pub fn our_hedge_policy_built(
    change: impl FnOnce(HedgePolicyBuilder) -> HedgePolicyBuilder,
) -> HedgePolicy {
    // Large enough that no hedge fires: the echo answers on the first poll. With the default
    // budget and the record of backends tried, as a user gets it.
    let builder = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::from_secs(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]));
    change(builder).build().expect("valid hedge policy")
}

/// Receives each variant, fully built, with its name.
pub trait Visit {
    /// Called once per variant.
    fn visit<S>(&mut self, name: &'static str, service: S)
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug;
}

/// The names of the variants, in the order [`each_variant`] visits them.
pub const VARIANTS: [&str; 13] = [
    "bare",
    "tower_retry",
    "tower_retry+tps_budget",
    "tower_hedge",
    "resilience_retry",
    "resilience_hedge",
    "ours_retry_policy",
    "ours_retry_policy+track_backends",
    "ours_retry_no_policy",
    "ours_retry_no_policy_passthrough",
    "ours_hedge_policy+no_tracking",
    "ours_hedge_policy",
    "ours_retry_route",
];

/// Builds every variant around [`Echo`] afresh (no state carried between shapes) and hands
/// it to `visitor`.
pub fn each_variant(visitor: &mut impl Visit) {
    each_variant_over(Echo, visitor);
}

/// Builds every variant afresh around a clone of `downstream` and hands it to `visitor`;
/// `bare` is `downstream` itself.
pub fn each_variant_over<D>(downstream: D, visitor: &mut impl Visit)
where
    D: Service<Req, Response = Res, Error = Infallible>
        + Service<CloneRequest, Response = Res, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <D as Service<Req>>::Future: Send + 'static,
    <D as Service<CloneRequest>>::Future: Send + 'static,
{
    visitor.visit("bare", downstream.clone());

    visitor.visit(
        "tower_retry",
        tower::retry::Retry::new(CloningPolicy::new(3), downstream.clone()),
    );

    let budget = tower::retry::budget::TpsBudget::new(Duration::from_secs(10), 10, 0.2);
    visitor.visit(
        "tower_retry+tps_budget",
        tower::retry::Retry::new(BudgetPolicy::new(Arc::new(budget), 3), downstream.clone()),
    );

    // Hedges once 10 latencies are recorded, at their 90th percentile; the echo answers on
    // the first poll, before the hedge is polled, and a downstream that never answers records
    // no latency, so none is sent.
    visitor.visit(
        "tower_hedge",
        tower::hedge::Hedge::new::<Req>(
            downstream.clone(),
            HedgeAll,
            10,
            0.9,
            Duration::from_secs(10),
        ),
    );

    let resilience_retry =
        tower_resilience::retry::RetryLayer::<CloneRequest, Res, Infallible>::builder()
            .max_attempts(4)
            .exponential_backoff(Duration::from_millis(100))
            .retry_on_response(|response: &Res| response.status().is_server_error())
            .build();
    visitor.visit(
        "resilience_retry",
        resilience_retry
            .layer(downstream.clone())
            .map_request(CloneRequest as fn(Req) -> CloneRequest),
    );

    let resilience_hedge = tower_resilience::hedge::HedgeLayer::builder()
        .delay(Duration::from_secs(10))
        .max_hedged_attempts(3)
        .build();
    visitor.visit(
        "resilience_hedge",
        resilience_hedge
            .layer(downstream.clone())
            .map_request(CloneRequest as fn(Req) -> CloneRequest),
    );

    let policies = Policies::builder()
        .method(METHOD, our_retry_policy())
        .build();
    visitor.visit(
        "ours_retry_policy",
        RetryLayer::new(policies).layer(downstream.clone()),
    );

    // The record of the backends tried (`TriedBackends`), for a balancer below: what it
    // costs a call that never retries.
    let policies = Policies::builder()
        .method(METHOD, our_retry_policy())
        .track_backends(true)
        .build();
    visitor.visit(
        "ours_retry_policy+track_backends",
        RetryLayer::new(policies).layer(downstream.clone()),
    );

    // A table with a policy for another method: the lookup misses, and the call keeps a copy
    // of its request for A6's transparent retries.
    let policies = Policies::builder()
        .method("test.echo.Echo/Other", our_retry_policy())
        .build();
    visitor.visit(
        "ours_retry_no_policy",
        RetryLayer::new(policies).layer(downstream.clone()),
    );

    // The same with transparent retries off for calls without a policy: they pass through.
    let policies = Policies::builder()
        .method("test.echo.Echo/Other", our_retry_policy())
        .transparent_retries(false)
        .build();
    visitor.visit(
        "ours_retry_no_policy_passthrough",
        RetryLayer::new(policies).layer(downstream.clone()),
    );

    // A hedging policy records its call's backends by default; without the record.
    let policies = Policies::builder()
        .method(METHOD, our_hedge_policy_built(|b| b.track_backends(false)))
        .build();
    visitor.visit(
        "ours_hedge_policy+no_tracking",
        HedgeLayer::new(policies).layer(downstream.clone()),
    );

    let policies = Policies::builder()
        .method(METHOD, our_hedge_policy())
        .build();
    visitor.visit(
        "ours_hedge_policy",
        HedgeLayer::new(policies).layer(downstream.clone()),
    );

    // As a team retrying an HTTP API sets it up (the scaling benchmark's HTTP shape): one
    // route for every path, a `POST` retried, a classifier closure that retries errors.
    let policy = RetryPolicy::builder()
        .max_attempts(4)
        .retry_non_idempotent(true)
        .retryable(|result: AttemptResult<'_>| match result {
            AttemptResult::Error(_) => Outcome::Retryable(None),
            _ => Outcome::Success,
        })
        .build()
        .expect("valid retry policy");
    let policies = Policies::builder()
        .route(Route::prefix("/"), policy)
        .build();
    visitor.visit(
        "ours_retry_route",
        RetryLayer::new(policies).layer(downstream),
    );
}

/// One call of any request type: waits for the service to be ready, then calls it.
pub async fn call<Rq, S>(service: &mut S, request: Rq) -> Res
where
    S: Service<Rq, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let ready = match ServiceExt::<Rq>::ready(service).await {
        Ok(ready) => ready,
        Err(error) => panic!("the echo is always ready: {error:?}"),
    };
    match ready.call(request).await {
        Ok(response) => response,
        Err(error) => panic!("the echo never fails: {error:?}"),
    }
}

/// A fresh current-thread runtime with timers, for one variant, in the state of a client
/// that has been waiting on its calls' timers.
///
/// Why the state matters: tokio's timer driver remembers, each time the runtime parks, the
/// earliest timer it will wake for; registering a timer earlier than that (or any timer,
/// when it remembers none) writes to the driver's eventfd to wake it, a system call of
/// ~0.5 µs. A runtime that has never parked remembers none, so in a benchmark whose calls
/// never wait every timer pays that call; in a client whose calls wait on the network the
/// runtime parks with their timers registered, and later timers pay nothing. This runtime
/// parks once with a 1 s timer registered, as such a client would, so that each variant
/// starts from that state rather than from whatever the previous variant left.
///
/// `BENCH_RUNTIME=never-parked` skips that step, to measure the other state.
pub fn runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    if std::env::var_os("BENCH_RUNTIME").is_some_and(|state| state == "never-parked") {
        return runtime;
    }
    runtime.block_on(async {
        let sleep = tokio::time::sleep(Duration::from_secs(1));
        let mut sleep = std::pin::pin!(sleep);
        // Registers the timer, then yields so that the runtime parks with it registered.
        std::future::poll_fn(|cx| {
            let _ = sleep.as_mut().poll(cx);
            Poll::Ready(())
        })
        .await;
        tokio::task::yield_now().await;
    });
    runtime
}
