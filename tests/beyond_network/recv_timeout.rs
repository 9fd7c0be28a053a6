//! `retryPolicy.perAttemptRecvTimeout` from service-config JSON over a real tonic channel and
//! server, through the tower layer, as gRPC C-core applies it (grpcio 1.85.1 against a
//! scripted server): an attempt without response headers in time is cancelled and retried
//! after the backoff whatever `retryableStatusCodes` lists; headers in time stop the timer; a
//! call whose last attempt timed out ends CANCELLED; each timeout is a failure for the
//! throttle. The `grpc` interceptor's twin is in `tests/grpc_channel`.
//!
//! A hanging attempt is what times out, so no assertion reads a duration. An attempt that must
//! answer in time gets 0.5 s or 1 s, which a loaded machine does not miss on loopback; the one
//! wait (twice the timeout, once the headers came) only gives a wrongly kept timer its chance.

use common::fed_request;
use common::pb::Chunk;
use common::pb::bidi_echo_client::BidiEchoClient;
use tokio_stream::wrappers::ReceiverStream;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::throttle::ThrottleState;

use super::*;

/// The echo services retried with a `perAttemptRecvTimeout` (see
/// `common::recv_timeout_service_config`).
fn recv_timeout_policies(max_attempts: u32, codes: &str, timeout: &str, extra: &str) -> Policies {
    let json = common::recv_timeout_service_config(max_attempts, codes, timeout, extra);
    let config: ServiceConfig = json.parse().expect("valid service config");
    config.policies()
}

#[tokio::test]
async fn recv_timeout_cancels_a_silent_attempt_and_retries_whatever_the_codes() {
    let peer = spawn_grpc(Script::new().call(70, [Action::Hang, Action::Ok])).await;
    // No retryable code: only a timeout is retried.
    let policies = recv_timeout_policies(3, "[]", "0.5s", "");
    let mut client = grpc_client(&peer, &policies).await;

    let response = guard(client.unary(echo(70, "late")))
        .await
        .expect("the second attempt answers");

    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(2, 0))
    );
    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(70, 1)).await;
    let records = recorder.attempts(70);
    assert_eq!(records.len(), 2);
    assert!(records[0].cancelled, "the silent attempt was cancelled");
    assert_eq!(records[1].previous_attempts.as_deref(), Some("1"));
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn recv_timeout_leaves_the_next_attempt_s_status_to_decide() {
    let peer = spawn_grpc(Script::new().call(
        71,
        [Action::Hang, Action::fail(Code::Unavailable), Action::Ok],
    ))
    .await;
    // UNAVAILABLE is not listed: the second attempt's failure ends the call.
    let policies = recv_timeout_policies(3, "[]", "0.5s", "");
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(71, "x")))
        .await
        .expect_err("UNAVAILABLE is not retryable here");

    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(peer.recorder().attempt_count(71), 2);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn recv_timeout_on_the_last_attempt_ends_the_call_cancelled() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    let policies = recv_timeout_policies(3, r#"["UNAVAILABLE"]"#, "0.05s", "");
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(72, "never")))
        .await
        .expect_err("every attempt hangs");

    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    let recorder = peer.recorder();
    guard(recorder.wait_for_cancelled(72, 3)).await;
    assert_eq!(recorder.attempt_count(72), 3);
    assert_buffers_free(&policies);
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn each_recv_timeout_is_a_failure_for_the_throttle() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    // 4 tokens: 4 → 3 (retried) → 2 (not above half: CANCELLED after 2 attempts of 5).
    let policies = recv_timeout_policies(
        5,
        r#"["UNAVAILABLE"]"#,
        "0.05s",
        r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 1}"#,
    );
    let mut client = grpc_client(&peer, &policies).await;

    let status = guard(client.unary(echo(73, "t")))
        .await
        .expect_err("every attempt hangs");

    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert_eq!(peer.recorder().attempt_count(73), 2);
    let state = policies.throttle_state().expect("a throttle");
    assert!(
        matches!(state, ThrottleState::Bucket { tokens, .. } if tokens == 2.0),
        "{state:?}"
    );
    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn recv_timeout_is_stopped_by_response_headers_in_time() {
    let peer = spawn_grpc(Script::new().call(74, [Action::Ok])).await;
    let policies = recv_timeout_policies(3, r#"["UNAVAILABLE"]"#, "1s", "");
    let mut client = BidiEchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(peer.channel().await),
    );
    let (chunks, request): (_, tonic::Request<ReceiverStream<Chunk>>) = fed_request(74);
    chunks
        .send(Chunk {
            data: b"one".to_vec(),
        })
        .await
        .expect("the call reads its stream");
    // The peer answers with headers once the first chunk has arrived.
    let mut replies = guard(client.bidi(request))
        .await
        .expect("headers")
        .into_inner();
    // Twice the timeout with the stream open: a timer still running would cancel it.
    tokio::time::sleep(ms(2_000)).await;
    chunks
        .send(Chunk {
            data: b"two".to_vec(),
        })
        .await
        .expect("the call reads its stream");
    drop(chunks);
    let mut echoed = Vec::new();
    while let Some(chunk) = guard(replies.message()).await.expect("no error") {
        echoed.push(chunk.data);
    }

    assert_eq!(echoed, [b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(peer.recorder().attempt_count(74), 1);
    guard(peer.shutdown()).await;
}
