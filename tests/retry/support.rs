//! Mock-service helpers shared by the retry tests and the tracing test: a gRPC-shaped
//! request, Trailers-Only responses, and a call through `RetryLayer` over `tower_test::mock`.
// Each including test binary uses a different subset.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
use tower_test::mock;

pub(crate) type Req = Request<Full<Bytes>>;
pub(crate) type Res = Response<http_body_util::Empty<Bytes>>;
pub(crate) type Handle = mock::Handle<Req, Res>;

pub(crate) const METHOD: &str = "/test.Echo/Unary";

pub(crate) fn backoff(initial_ms: u64, max_ms: u64) -> Exponential {
    Exponential::new(
        Duration::from_millis(initial_ms),
        Duration::from_millis(max_ms),
        2.0,
        Jitter::None,
    )
    .unwrap()
}

pub(crate) fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(backoff(100, 1000))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap()
}

/// [`policy`] with gRPC's wait-for-ready: attempts that could not connect are resent
/// transparently, not counted.
#[allow(dead_code)] // Not every target that includes this file waits for ready.
pub(crate) fn waiting_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(backoff(100, 1000))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .wait_for_ready(true)
        .build()
        .unwrap()
}

pub(crate) fn policies(policy: RetryPolicy) -> Policies {
    Policies::builder().method(METHOD, policy).build()
}

pub(crate) fn grpc_request(body: &'static str) -> Req {
    Request::post(METHOD)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

pub(crate) fn trailers_only(code: Code, pushback: Option<&'static str>) -> Res {
    let mut response = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.header_value());
    if let Some(p) = pushback {
        response = response.header("grpc-retry-pushback-ms", p);
    }
    response.body(http_body_util::Empty::new()).unwrap()
}

pub(crate) fn grpc_ok() -> Res {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(http_body_util::Empty::new())
        .unwrap()
}

pub(crate) type CallHandle = tokio::task::JoinHandle<Result<Res, BoxError>>;

/// Starts a call through the layer; the test plays the server through the handle.
pub(crate) fn start(policies: Policies, request: Req) -> (CallHandle, Handle) {
    let (mock, handle) = mock::pair::<Req, Res>();
    let svc = RetryLayer::new(policies).layer(mock);
    (tokio::spawn(svc.oneshot(request)), handle)
}

/// Answers the next attempt with `response`, returning the request and when it arrived.
pub(crate) async fn answer(handle: &mut Handle, response: Res) -> (Req, Instant) {
    let (request, send) = handle.next_request().await.expect("an attempt");
    let at = Instant::now();
    send.send_response(response);
    (request, at)
}
