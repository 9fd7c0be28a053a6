//! The retry layer over a hyper-util legacy client (HTTP/1.1 and HTTP/2), against the real
//! HTTP peer of `tests/common` on 127.0.0.1.
//!
//! The request body type is `BoxBody<Bytes, BoxError>`, so streaming bodies are recorded and
//! replayed. Everything runs on the real clock with backoffs of 1-10 ms; assertions are on
//! counts, headers and bytes, never on durations. `guard` only stops a broken peer from
//! hanging the run.

#[path = "../common/mod.rs"]
mod common;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use common::{
    CALL_HEADER, HttpAction, HttpOutcome, HttpPeer, HttpScript, PEER_ATTEMPT_HEADER, http_client,
    http2_client, spawn_http,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{BoxError, Policies, Retry, RetryLayer, RetryPolicy};

type Body = BoxBody<Bytes, BoxError>;
type HttpClient = Client<HttpConnector, Body>;

/// Fails the test instead of hanging it if a peer or the layer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("the call did not end within the hang guard")
}

fn backoff() -> Exponential {
    Exponential::new(
        Duration::from_millis(1),
        Duration::from_millis(10),
        2.0,
        Jitter::None,
    )
    .expect("valid backoff")
}

/// Every path retried on the default HTTP statuses, at most 3 attempts.
fn policies(retry_non_idempotent: bool) -> Policies {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff())
        .retryable(HttpStatuses::default())
        .retry_non_idempotent(retry_non_idempotent)
        .build()
        .expect("valid policy");
    Policies::builder()
        .route(Route::prefix("/"), policy)
        .build()
}

fn retrying(client: HttpClient, policies: &Policies) -> Retry<HttpClient> {
    ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(client)
}

fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

fn request(peer: &HttpPeer, method: Method, call: &str, body: Body) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(peer.url("/items"))
        .header(CALL_HEADER, call)
        .body(body)
        .expect("valid request")
}

/// A body fed chunk by chunk through a channel by a task of its own, as a program streaming
/// an upload would; ends with `trailers` if given.
fn channel_body(chunks: Vec<Bytes>, trailers: Option<HeaderMap>) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
    tokio::spawn(async move {
        for chunk in chunks {
            if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
        if let Some(trailers) = trailers {
            let _ = tx.send(Ok(Frame::trailers(trailers))).await;
        }
    });
    StreamBody::new(ReceiverStream::new(rx)).boxed()
}

/// `count` chunks of `size` deterministic, varied bytes, and all of them concatenated.
fn upload(count: usize, size: usize) -> (Vec<Bytes>, Bytes) {
    let mut state: u32 = 0x1234_5678;
    let all: Vec<u8> = (0..count * size)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state.to_be_bytes()[0]
        })
        .collect();
    let chunks = all
        .chunks(size)
        .map(Bytes::copy_from_slice)
        .collect::<Vec<_>>();
    (chunks, Bytes::from(all))
}

fn attempts(response: &Response<Incoming>) -> Attempts {
    Attempts::of(response)
}

fn peer_attempt(response: &Response<Incoming>) -> Option<&str> {
    response
        .headers()
        .get(PEER_ATTEMPT_HEADER)
        .and_then(|v| v.to_str().ok())
}

async fn body_bytes(response: Response<Incoming>) -> Bytes {
    guard(response.into_body().collect())
        .await
        .expect("a whole response body")
        .to_bytes()
}

fn assert_buffers_free(policies: &Policies) {
    assert_eq!(
        policies.buffer_limits().in_use(),
        0,
        "replay buffers still held after the call"
    );
}

/// A streaming PUT answered 503 once is replayed; both attempts receive the same bytes (and,
/// on HTTP/2, the same trailers).
async fn streaming_body_is_replayed_after_503(client: HttpClient, version: Version) {
    let peer = spawn_http(HttpScript::new().call("up", [HttpAction::status(503)])).await;
    let policies = policies(false);
    let svc = retrying(client, &policies);
    // 64 chunks of 1 KiB.
    let (chunks, sent) = upload(64, 1024);
    let trailers = (version == Version::HTTP_2).then(|| {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc123"));
        trailers
    });

    let body = channel_body(chunks, trailers.clone());
    let response = guard(svc.oneshot(request(&peer, Method::PUT, "up", body)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_eq!(peer_attempt(&response), Some("1"));
    // No gRPC metadata on plain HTTP.
    assert!(
        response
            .headers()
            .get("grpc-previous-rpc-attempts")
            .is_none()
    );
    assert!(body_bytes(response).await == sent, "the echo differs");

    let records = peer.recorder().attempts("up");
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].outcome, Some(HttpOutcome::Status(503)));
    assert_eq!(records[1].outcome, Some(HttpOutcome::Status(200)));
    for record in &records {
        assert_eq!(record.version, version);
        assert_eq!(record.method, Method::PUT);
        assert!(record.body_complete);
        assert!(
            record.body == sent,
            "attempt {} received different bytes",
            record.attempt
        );
        assert_eq!(record.trailers, trailers, "attempt {}", record.attempt);
        assert_eq!(record.previous_attempts, None);
    }
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn streaming_body_is_replayed_after_503_over_http1() {
    streaming_body_is_replayed_after_503(http_client(), Version::HTTP_11).await;
}

#[tokio::test]
async fn streaming_body_is_replayed_after_503_over_http2() {
    streaming_body_is_replayed_after_503(http2_client(), Version::HTTP_2).await;
}

#[tokio::test]
async fn retry_after_one_second_is_retried() {
    let peer = spawn_http(HttpScript::new().call("ra", [HttpAction::retry_after(503, "1")])).await;
    let policies = policies(false);
    let svc = retrying(http2_client(), &policies);

    let response = guard(svc.oneshot(request(&peer, Method::GET, "ra", empty())))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response).sent(), 2);
    let records = peer.recorder().attempts("ra");
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].outcome, Some(HttpOutcome::Status(503)));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn post_is_not_retried_by_default() {
    let peer = spawn_http(HttpScript::new().call("post", [HttpAction::status(503)])).await;
    let policies = policies(false);
    let svc = retrying(http_client(), &policies);

    let body = channel_body(vec![Bytes::from_static(b"order #1")], None);
    let response = guard(svc.oneshot(request(&peer, Method::POST, "post", body)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&response).sent(), 1);
    assert_eq!(peer.recorder().attempt_count("post"), 1);
    assert_eq!(peer.recorder().attempts("post")[0].body, "order #1");
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn post_is_retried_when_the_policy_opts_in() {
    let peer = spawn_http(HttpScript::new().call("post", [HttpAction::status(503)])).await;
    let policies = policies(true);
    let svc = retrying(http_client(), &policies);

    let body = channel_body(vec![Bytes::from_static(b"order #2")], None);
    let response = guard(svc.oneshot(request(&peer, Method::POST, "post", body)))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(attempts(&response).sent(), 2);
    assert_eq!(body_bytes(response).await, "order #2");
    let records = peer.recorder().attempts("post");
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.body == "order #2"));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn status_429_without_retry_after_is_not_retried() {
    let peer = spawn_http(HttpScript::new().call("busy", [HttpAction::status(429)])).await;
    let policies = policies(false);
    let svc = retrying(http2_client(), &policies);

    let response = guard(svc.oneshot(request(&peer, Method::GET, "busy", empty())))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(attempts(&response).sent(), 1);
    assert_eq!(peer.recorder().attempt_count("busy"), 1);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

/// Needs the `hyper-util` feature: the layer recognises the client's connect errors as
/// "never sent".
#[cfg(feature = "hyper-util")]
mod connection_refused {
    use tower_retry_hedge::classify::{Outcome, transport_outcome};
    use tower_retry_hedge::metadata::Attempts;

    use super::*;

    #[tokio::test]
    async fn connection_refused_is_retried_by_the_policy_then_returned() {
        // A port that was just free: nothing listens on it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        drop(listener);

        let policy = RetryPolicy::builder()
            .max_attempts(2)
            .backoff(backoff())
            .retryable(HttpStatuses::default())
            .build()
            .expect("valid policy");
        let policies = Policies::builder()
            .route(Route::prefix("/"), policy)
            .build();
        let counting = common::Sends::new(http_client::<Body>());
        let sends = counting.clone();
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(counting);

        // POST: a request that never left the client is safe to retry whatever its method.
        let request = Request::post(format!("http://{addr}/items"))
            .body(channel_body(vec![Bytes::from_static(b"never sent")], None))
            .expect("valid request");
        let error = guard(svc.oneshot(request))
            .await
            .expect_err("nothing listens");
        let connect = tower_retry_hedge::error::last_error(&error)
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .expect("the client's own error, unchanged inside");
        assert!(connect.is_connect(), "{connect:?}");
        assert_eq!(transport_outcome(&*error), Some(Outcome::NotSent));
        // An UNAVAILABLE (503) failure for the policy: two counted attempts, maxAttempts 2.
        assert_eq!(Attempts::of_error(&*error), Attempts::new(2, 0));
        assert_eq!(sends.count(), 2);
        assert_buffers_free(&policies);
    }
}
