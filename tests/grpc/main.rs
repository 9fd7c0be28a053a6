//! The retry layer under a generated tonic client, against the real gRPC peer of
//! `tests/common` on 127.0.0.1.
//!
//! The client is `EchoClient::new(ServiceBuilder::new().layer(RetryLayer::new(policies))
//! .service(channel))` and nothing else. Everything runs on the real clock with backoffs of
//! 1-10 ms; assertions are on counts, headers and bytes, never on durations. `guard` only
//! stops a broken peer from hanging the run.

mod commit;
#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "retry-info")]
mod retry_info;
mod wait_for_ready;

use std::future::Future;
use std::time::Duration;

use common::pb::echo_client::EchoClient;
use common::pb::{Chunk, EchoRequest};
use common::{
    Action, CALL_METADATA, GrpcPeer, Method, Outcome, Script, expected_previous, spawn_grpc,
};
use http::HeaderValue;
use tonic::Code;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{self, GrpcCodes};
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{BufferLimits, Policies, Retry, RetryLayer, RetryPolicy, grpc_timeout};

type Client = EchoClient<Retry<Channel>>;

const SERVICE: &str = "test.echo.Echo";
const UNARY: &str = "/test.echo.Echo/Unary";

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

fn retry_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(backoff())
        .retryable(GrpcCodes::from([classify::Code::Unavailable]))
        .build()
        .expect("valid policy")
}

/// Every method of the echo service retried with `max_attempts`.
fn policies(max_attempts: u32) -> Policies {
    Policies::builder()
        .service(SERVICE, retry_policy(max_attempts))
        .build()
}

async fn client(peer: &GrpcPeer, policies: &Policies) -> Client {
    let channel = peer.channel().await;
    EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(channel),
    )
}

fn echo(call: u32, message: &str) -> EchoRequest {
    EchoRequest {
        message: message.to_owned(),
        payload: message.as_bytes().to_vec(),
        call,
    }
}

fn metadata_str<'a>(metadata: &'a MetadataMap, key: &str) -> Option<&'a str> {
    metadata.get(key).and_then(|v| v.to_str().ok())
}

fn assert_buffers_free(policies: &Policies) {
    assert_eq!(
        policies.buffer_limits().in_use(),
        0,
        "replay buffers still held after the call"
    );
}

/// `len` deterministic, varied bytes (a small LCG), cut into chunks of `chunk` bytes.
fn chunks(len: usize, chunk: usize, seed: u32) -> (Vec<Chunk>, Vec<u8>) {
    let mut state = seed;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state.to_be_bytes()[0]
        })
        .collect();
    let chunks = bytes
        .chunks(chunk)
        .map(|c| Chunk { data: c.to_vec() })
        .collect();
    (chunks, bytes)
}

fn streaming_request(
    call: u32,
    chunks: Vec<Chunk>,
) -> tonic::Request<impl tokio_stream::Stream<Item = Chunk>> {
    let mut request = tonic::Request::new(tokio_stream::iter(chunks));
    request
        .metadata_mut()
        .insert(CALL_METADATA, AsciiMetadataValue::from(call));
    request
}

#[tokio::test]
async fn unary_unavailable_twice_then_ok_is_retried_with_attempt_metadata() {
    let peer = spawn_grpc(Script::new().call(
        0,
        [
            Action::fail(Code::Unavailable),
            Action::fail(Code::Unavailable),
            Action::Ok,
        ],
    ))
    .await;
    let policies = policies(4);
    let mut client = client(&peer, &policies).await;

    let response = guard(client.unary(echo(0, "hello")))
        .await
        .expect("the third attempt succeeds");
    assert_eq!(
        metadata_str(response.metadata(), "grpc-previous-rpc-attempts"),
        Some("2")
    );
    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(3, 0))
    );
    let reply = response.into_inner();
    assert_eq!(reply.message, "hello");
    assert_eq!(reply.attempt, 2, "the server answered its third attempt");

    assert_eq!(peer.recorder().attempt_count(0), 3);
    assert_eq!(peer.previous_attempts(0), expected_previous(3));
    for attempt in peer.recorder().attempts(0) {
        assert_eq!(attempt.method, Method::Unary);
        assert_eq!(attempt.message, "hello");
        assert_eq!(attempt.payload.as_ref(), b"hello");
        assert!(!attempt.cancelled);
    }
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn unary_ok_at_once_carries_no_retry_metadata() {
    let peer = spawn_grpc(Script::new()).await;
    let policies = policies(4);
    let mut client = client(&peer, &policies).await;

    let response = guard(client.unary(echo(0, "once"))).await.expect("ok");
    assert_eq!(
        metadata_str(response.metadata(), "grpc-previous-rpc-attempts"),
        None
    );
    // One attempt: no extension, as no grpc-previous-rpc-attempts header.
    assert_eq!(response.extensions().get::<Attempts>(), None);
    assert_eq!(peer.previous_attempts(0), expected_previous(1));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn fatal_code_is_returned_after_one_attempt() {
    let peer = spawn_grpc(Script::new().call(0, [Action::fail(Code::InvalidArgument)])).await;
    let policies = policies(5);
    let mut client = client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "bad")))
        .await
        .expect_err("INVALID_ARGUMENT is fatal");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "scripted failure");
    assert_eq!(peer.recorder().attempt_count(0), 1);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn negative_pushback_stops_after_one_attempt() {
    let peer = spawn_grpc(Script::new().call(0, [Action::pushback(Code::Unavailable, "-1")])).await;
    let policies = policies(5);
    let mut client = client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "stop")))
        .await
        .expect_err("pushback -1 says do not retry");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        metadata_str(status.metadata(), "grpc-retry-pushback-ms"),
        Some("-1")
    );
    assert_eq!(peer.recorder().attempt_count(0), 1);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn positive_pushback_is_retried() {
    let peer =
        spawn_grpc(Script::new().call(0, [Action::pushback(Code::Unavailable, "20"), Action::Ok]))
            .await;
    let policies = policies(3);
    let mut client = client(&peer, &policies).await;

    let response = guard(client.unary(echo(0, "later")))
        .await
        .expect("retried after the pushback");
    assert_eq!(
        metadata_str(response.metadata(), "grpc-previous-rpc-attempts"),
        Some("1")
    );
    assert_eq!(response.into_inner().attempt, 1);
    let attempts = peer.recorder().attempts(0);
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        attempts[0].outcome,
        Some(Outcome::Status {
            code: Code::Unavailable,
            pushback: Some("20".to_owned()),
        })
    );
    assert_eq!(attempts[1].outcome, Some(Outcome::Ok));
    assert_eq!(peer.previous_attempts(0), expected_previous(2));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn max_attempts_ten_is_clamped_to_five() {
    let peer = spawn_grpc(Script::always(Action::fail(Code::Unavailable))).await;
    let policies = policies(10);
    let mut client = client(&peer, &policies).await;

    let status = guard(client.unary(echo(0, "again")))
        .await
        .expect_err("every attempt fails");
    assert_eq!(status.code(), Code::Unavailable);
    // The last failure is returned with the number of attempts before it.
    assert_eq!(
        metadata_str(status.metadata(), "grpc-previous-rpc-attempts"),
        Some("4")
    );
    assert_eq!(peer.recorder().attempt_count(0), 5);
    assert_eq!(peer.previous_attempts(0), expected_previous(5));
    let snapshot = policies.stats().snapshot();
    let unary = snapshot.methods.get(UNARY).expect("unary statistics");
    assert_eq!(unary.retry_attempts, 4);
    assert_eq!(unary.retry_failures, 4);
    assert_eq!(unary.histogram, [1, 1, 1, 1, 0, 0, 0, 0]);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn client_stream_of_100_kb_is_replayed_byte_for_byte() {
    let peer = spawn_grpc(Script::new().call(
        7,
        [
            Action::fail(Code::Unavailable),
            Action::fail(Code::Unavailable),
            Action::Ok,
        ],
    ))
    .await;
    let policies = policies(4);
    let mut client = client(&peer, &policies).await;
    // 100 000 bytes in 49 chunks of 2 048 bytes and a shorter last one.
    let (chunks, sent) = chunks(100_000, 2_048, 0x5eed);
    let chunk_count = chunks.len();

    let response = guard(client.client_stream(streaming_request(7, chunks)))
        .await
        .expect("the third attempt succeeds");
    assert_eq!(
        metadata_str(response.metadata(), "grpc-previous-rpc-attempts"),
        Some("2")
    );
    let digest = response.into_inner();
    assert_eq!(digest.bytes, 100_000);
    assert_eq!(digest.chunks, u64::try_from(chunk_count).unwrap());
    assert!(
        digest.sha_or_all == sent,
        "the digest differs from what was sent"
    );

    let attempts = peer.recorder().attempts(7);
    assert_eq!(attempts.len(), 3);
    for attempt in &attempts {
        assert_eq!(attempt.method, Method::ClientStream);
        assert_eq!(attempt.messages, chunk_count, "attempt {}", attempt.attempt);
        assert!(
            attempt.payload.as_ref() == sent.as_slice(),
            "attempt {} received different bytes",
            attempt.attempt
        );
    }
    assert_eq!(peer.previous_attempts(7), expected_previous(3));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn client_stream_over_the_buffer_limit_is_sent_once() {
    let peer =
        spawn_grpc(Script::new().call(8, [Action::fail(Code::Unavailable), Action::Ok])).await;
    let policies = Policies::builder()
        .service(SERVICE, retry_policy(5))
        .buffer_limits(BufferLimits::new(16 * 1024, 16 * 1024 * 1024))
        .build();
    let mut client = client(&peer, &policies).await;
    let (chunks, sent) = chunks(100_000, 4_096, 0xb16);
    let chunk_count = chunks.len();

    let status = guard(client.client_stream(streaming_request(8, chunks)))
        .await
        .expect_err("the only attempt fails and cannot be replayed");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "scripted failure");

    let attempts = peer.recorder().attempts(8);
    assert_eq!(attempts.len(), 1, "a committed call makes no new attempt");
    assert_eq!(attempts[0].messages, chunk_count);
    assert!(
        attempts[0].payload.as_ref() == sent.as_slice(),
        "the body arrived altered"
    );
    assert!(!attempts[0].cancelled);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn server_stream_failing_after_headers_is_committed() {
    let peer = spawn_grpc(
        Script::new().call(3, [Action::FailAfterHeaders(Code::Unavailable), Action::Ok]),
    )
    .await;
    let policies = policies(5);
    let mut client = client(&peer, &policies).await;

    let mut stream = guard(client.server_stream(echo(3, "stream")))
        .await
        .expect("headers arrive")
        .into_inner();
    let first = guard(stream.message())
        .await
        .expect("one message")
        .expect("not the end");
    assert_eq!(first.message, "stream");
    let status = guard(stream.message())
        .await
        .expect_err("then the scripted status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(peer.recorder().attempt_count(3), 1);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn deadline_shorter_than_the_retry_chain_is_deadline_exceeded() {
    // Two quick UNAVAILABLEs, then an attempt that never answers: the retry chain (up to 5
    // attempts) outlasts the call's 250 ms, and the deadline passes with attempt 3 in flight.
    let peer = spawn_grpc(Script::new().call(
        9,
        [
            Action::fail(Code::Unavailable),
            Action::fail(Code::Unavailable),
            Action::Hang,
        ],
    ))
    .await;
    let policies = policies(5);
    let mut client = client(&peer, &policies).await;

    let mut request = tonic::Request::new(echo(9, "hurry"));
    request.set_timeout(Duration::from_millis(250));
    let status = guard(client.unary(request))
        .await
        .expect_err("the deadline passes first");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // The attempt in flight at the deadline was cancelled (by the client's reset, or by the
    // server enforcing the grpc-timeout it was sent), and no fourth attempt was made.
    guard(peer.recorder().wait_for_cancelled(9, 1)).await;
    let attempts = peer.recorder().attempts(9);
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    assert!(attempts[2].cancelled);
    assert_eq!(attempts[2].outcome, None);
    assert_eq!(peer.previous_attempts(9), expected_previous(3));
    let timeouts: Vec<Duration> = attempts
        .iter()
        .map(|a| {
            let raw = a
                .grpc_timeout
                .as_deref()
                .expect("every attempt carries grpc-timeout");
            grpc_timeout::parse(&HeaderValue::from_str(raw).expect("header value"))
                .expect("a valid grpc-timeout")
        })
        .collect();
    assert!(timeouts[0] <= Duration::from_millis(250), "{timeouts:?}");
    assert!(
        timeouts.windows(2).all(|w| w[1] < w[0]),
        "each later attempt carries less time: {timeouts:?}"
    );
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

/// gRFC A6's shape, with short backoffs.
const SERVICE_CONFIG: &str = r#"{
  "loadBalancingPolicy": "round_robin",
  "methodConfig": [
    {
      "name": [{ "service": "test.echo.Echo", "method": "Unary" }],
      "retryPolicy": {
        "maxAttempts": 3,
        "initialBackoff": "0.001s",
        "maxBackoff": "0.01s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted"]
      }
    },
    {
      "name": [{ "service": "test.echo.Echo", "method": "ClientStream" }],
      "timeout": "5s"
    }
  ],
  "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
}"#;

#[tokio::test]
async fn service_config_json_drives_the_client_and_its_throttle() {
    let peer = spawn_grpc(
        Script::new()
            .call(
                0,
                [
                    Action::fail(Code::Unavailable),
                    Action::fail(Code::ResourceExhausted),
                    Action::Ok,
                ],
            )
            .call(1, [Action::fail(Code::Internal)])
            .otherwise(Action::fail(Code::Unavailable)),
    )
    .await;
    let policies = ServiceConfig::from_json(SERVICE_CONFIG)
        .expect("a valid service config")
        .policies();
    let mut client = client(&peer, &policies).await;

    // Both retryable codes of the config are retried, by name in either case.
    let reply = guard(client.unary(echo(0, "config")))
        .await
        .expect("the third attempt succeeds")
        .into_inner();
    assert_eq!(reply.attempt, 2);
    assert_buffers_free(&policies);

    // INTERNAL is not in the config: fatal.
    let status = guard(client.unary(echo(1, "fatal")))
        .await
        .expect_err("fatal");
    assert_eq!(status.code(), Code::Internal);
    assert_buffers_free(&policies);

    // The throttle (10 tokens, 0.1 a success) is down to 8.1: the next failing call gets its
    // three attempts (7.1, 6.1, 5.1); the one after stops at 4.1, below half.
    for call in [2, 3] {
        let status = guard(client.unary(echo(call, "throttled")))
            .await
            .expect_err("fails");
        assert_eq!(status.code(), Code::Unavailable);
        assert_buffers_free(&policies);
    }
    let recorder = peer.recorder();
    let made: Vec<usize> = (0u32..4).map(|call| recorder.attempt_count(call)).collect();
    assert_eq!(made, [3, 1, 3, 1]);

    // A method with only a timeout in the config passes through: one attempt.
    let (chunks, sent) = chunks(1_000, 100, 1);
    let status = guard(client.client_stream(streaming_request(4, chunks)))
        .await
        .expect_err("the scripted failure");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(recorder.attempt_count(4), 1);
    assert!(recorder.attempts(4)[0].payload.as_ref() == sent.as_slice());
    assert_buffers_free(&policies);

    let snapshot = policies.stats().snapshot();
    let unary = snapshot.methods.get(UNARY).expect("unary statistics");
    assert_eq!(unary.retry_attempts, 4);
    assert_eq!(unary.retry_failures, 3);
    assert_eq!(unary.histogram, [2, 2, 0, 0, 0, 0, 0, 0]);
    guard(peer.shutdown()).await;
}
