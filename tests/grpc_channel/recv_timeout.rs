//! `retryPolicy.perAttemptRecvTimeout` through the interceptor, as gRPC C-core applies it
//! (grpcio 1.85.1 against a scripted server): an attempt without response headers in time is
//! cancelled and retried after the backoff whatever `retryableStatusCodes` lists; headers in
//! time stop the timer; a call whose last attempt timed out ends CANCELLED; each timeout is a
//! failure for the throttle. The tower layer's twin is in `tests/beyond_network`.
//!
//! Real clock: a hanging attempt is what times out, so no assertion reads a duration. An
//! attempt that must answer in time gets 0.5 s or 1 s, which a loaded machine does not miss
//! on loopback; the one wait (twice the timeout, once the headers came) only gives a wrongly
//! kept timer its chance.

use std::time::Duration;

use super::*;

/// The echo services retried with a `perAttemptRecvTimeout` (see
/// `common::recv_timeout_service_config`).
fn recv_timeout_config(max_attempts: u32, codes: &str, timeout: &str, extra: &str) -> Policies {
    let json = common::recv_timeout_service_config(max_attempts, codes, timeout, extra);
    let config: ServiceConfig = json.parse().expect("valid service config");
    config.policies()
}

#[tokio::test]
async fn a_silent_attempt_is_cancelled_and_retried_whatever_the_codes() {
    let peer = spawn_grpc(Script::new().call(60, [Action::Hang, Action::Ok])).await;
    // No retryable code: only a timeout is retried.
    let policies = recv_timeout_config(3, "[]", "0.5s", "");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 60, "late").await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(60), 2);
    assert_eq!(peer.previous_attempts(60), expected_previous(2));
    peer.shutdown().await;
}

#[tokio::test]
async fn the_next_attempt_s_own_status_decides_as_usual() {
    let peer = spawn_grpc(Script::new().call(
        61,
        [Action::Hang, Action::fail(Code::Unavailable), Action::Ok],
    ))
    .await;
    // UNAVAILABLE is not listed: the second attempt's failure ends the call.
    let policies = recv_timeout_config(3, "[]", "0.5s", "");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 61, "x").await;

    assert_eq!(seen.code(), Some(StatusCodeError::Unavailable), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(61), 2);
    peer.shutdown().await;
}

#[tokio::test]
async fn the_last_attempt_timing_out_ends_the_call_cancelled() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    let policies = recv_timeout_config(3, r#"["UNAVAILABLE"]"#, "0.05s", "");
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 62, "never").await;

    assert_eq!(seen.code(), Some(StatusCodeError::Cancelled), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(62), 3);
    peer.shutdown().await;
}

#[tokio::test]
async fn each_timed_out_attempt_is_a_failure_for_the_throttle() {
    let peer = spawn_grpc(Script::always(Action::Hang)).await;
    // 4 tokens: 4 → 3 (retried) → 2 (not above half: CANCELLED after 2 attempts of 5).
    let policies = recv_timeout_config(
        5,
        r#"["UNAVAILABLE"]"#,
        "0.05s",
        r#", "retryThrottling": {"maxTokens": 4, "tokenRatio": 1}"#,
    );
    let invoker = channel(&peer, &policies);

    let seen = echo_call(&invoker, UNARY, 63, "t").await;

    assert_eq!(seen.code(), Some(StatusCodeError::Cancelled), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(63), 2);
    let state = policies.throttle_state().expect("a throttle");
    assert!(
        matches!(state, ThrottleState::Bucket { tokens, .. } if tokens == 2.0),
        "{state:?}"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn response_headers_in_time_stop_the_timer() {
    let peer = spawn_grpc(Script::new().call(64, [Action::Ok])).await;
    let policies = recv_timeout_config(3, r#"["UNAVAILABLE"]"#, "1s", "");
    let invoker = channel(&peer, &policies);

    let headers = RequestHeaders::new()
        .with_method_name(BIDI)
        .with_metadata(call_metadata(64));
    let (mut send, mut recv) = invoker.invoke(headers, CallOptions::new()).await;
    let options = SendOptions::new().with_final_msg(false);
    assert!(send.send(&Raw(chunk(b"one")), options).await.is_ok());
    // The peer answers with headers once the first chunk has arrived.
    let mut reply = RawReply::default();
    let first = guard(recv.recv(&mut reply)).await;
    assert!(
        matches!(first, ResponseStreamItem::Headers(_)),
        "headers first"
    );
    // Twice the timeout with the stream open: a timer still running would cancel it.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let options = SendOptions::new().with_final_msg(true);
    assert!(send.send(&Raw(chunk(b"two")), options).await.is_ok());
    drop(send);
    let seen = guard(read_all(&mut recv)).await;

    assert!(seen.status.is_ok(), "{seen:?}");
    assert_eq!(peer.recorder().attempt_count(64), 1);
    peer.shutdown().await;
}
