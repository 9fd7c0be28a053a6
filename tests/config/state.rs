//! What a table built from service-config JSON lets one read while calls run: the throttle's
//! tokens and threshold, the replay buffer in use, and the statistics by method. Mock
//! services on tokio's paused clock.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use tower::{Layer, ServiceExt};
use tower_retry_hedge::throttle::{ThrottleRegistry, ThrottleState};
use tower_retry_hedge::{BoxError, Policies, RetryLayer, RetryPolicy};
use tower_test::mock;

use super::parse;

type Body = BoxBody<Bytes, BoxError>;
type Res = Response<http_body_util::Empty<Bytes>>;

const CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "pkg.Service"}],
    "retryPolicy": {
      "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.5}
}"#;

/// A gRPC request to `authority` whose body streams `chunks` (no size hint).
fn request(authority: &str, chunks: &[&'static [u8]]) -> Request<Body> {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c))))
        .collect();
    Request::post(format!("http://{authority}/pkg.Service/Method"))
        .header("content-type", "application/grpc")
        .body(BoxBody::new(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap()
}

fn status(code: u8) -> Res {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string())
        .body(http_body_util::Empty::new())
        .unwrap()
}

fn bucket(policies: &Policies) -> (f64, f64, Option<bool>) {
    match policies.throttle_state() {
        Some(
            state @ ThrottleState::Bucket {
                tokens, threshold, ..
            },
        ) => (tokens, threshold, state.allows_retry()),
        other => panic!("an A6 bucket, not {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_table_from_json_shows_its_throttle_buffer_and_statistics() {
    let policies = parse(CONFIG).policies();
    assert_eq!(bucket(&policies), (4.0, 2.0, Some(true)));

    let (service, mut handle) = mock::pair::<Request<Body>, Res>();
    let layer = RetryLayer::new(policies.clone());
    let call = tokio::spawn(
        layer
            .layer(service.clone())
            .oneshot(request("a.test", &[b"hell", b"o"])),
    );
    let (attempt, reply) = handle.next_request().await.expect("the first attempt");
    attempt.into_body().collect().await.unwrap();
    // The body is recorded for a retry while its attempt is in flight.
    assert_eq!(policies.buffer_limits().in_use(), 5);
    reply.send_response(status(14));
    // Two failures take two tokens: at the threshold, the retry after the second is throttled.
    let (_, reply) = handle.next_request().await.expect("the retry");
    reply.send_response(status(14));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(bucket(&policies), (2.0, 2.0, Some(false)));
    assert_eq!(policies.buffer_limits().in_use(), 0);
    let snapshot = policies.stats().snapshot();
    assert_eq!(snapshot.methods["/pkg.Service/Method"].retry_attempts, 1);

    // A success earns `tokenRatio`: retries flow again.
    let call = tokio::spawn(layer.layer(service).oneshot(request("a.test", &[b"again"])));
    let (_, reply) = handle.next_request().await.expect("an attempt");
    reply.send_response(status(0));
    call.await.unwrap().unwrap();
    assert_eq!(bucket(&policies), (2.5, 2.0, Some(true)));
}

#[tokio::test(start_paused = true)]
async fn throttles_per_authority_show_one_state_each() {
    let policy = RetryPolicy::builder().build().unwrap();
    let policies = Policies::builder()
        .service("pkg.Service", policy)
        .throttle_per_authority(ThrottleRegistry::new(10, 0.1).unwrap())
        .build();
    assert!(policies.throttle_state().is_none());
    assert!(policies.authority_throttle_states().is_empty());

    let (service, mut handle) = mock::pair::<Request<Body>, Res>();
    let layer = RetryLayer::new(policies.clone());
    for (authority, code) in [("a.test", 14), ("b.test", 0)] {
        let call = tokio::spawn(
            layer
                .layer(service.clone())
                .oneshot(request(authority, &[b"x"])),
        );
        let (_, reply) = handle.next_request().await.expect("an attempt");
        reply.send_response(status(code));
        if code != 0 {
            let (_, reply) = handle.next_request().await.expect("a retry");
            reply.send_response(status(0));
        }
        call.await.unwrap().unwrap();
    }
    let tokens: Vec<(String, f64)> = policies
        .authority_throttle_states()
        .into_iter()
        .map(|(authority, state)| match state {
            ThrottleState::Bucket { tokens, .. } => (authority, tokens),
            other => panic!("an A6 bucket, not {other:?}"),
        })
        .collect();
    // a.test: 10 - 1 + 0.1; b.test: full, and a success cannot overfill it.
    assert_eq!(
        tokens,
        [("a.test".to_owned(), 9.1), ("b.test".to_owned(), 10.0)]
    );
}
