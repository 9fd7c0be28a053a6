//! `google.rpc.RetryInfo` read as pushback by policies made from service-config JSON
//! (`PolicyOptions::retry_info`, feature `retry-info`), against the real tonic peer of
//! `tests/common` on 127.0.0.1, which answers UNAVAILABLE with a `RetryInfo` built by
//! tonic-types.
//!
//! The retry tests run on tokio's paused clock with no timer but the layer's own: while the
//! client waits on the socket, the clock can only jump to the retry's timer, so the gap the
//! peer sees between the first answer and the retry is the delay the layer chose, exactly.
//! The hedging tests keep a hedging delay no test outlives on the real clock, and count
//! attempts.

use std::time::Duration;

use tonic::Code;
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::Jitter;
use tower_retry_hedge::config::{PolicyOptions, ServiceConfig};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{HedgeLayer, Policies, RetryLayer};

use super::common::pb::EchoRequest;
use super::common::pb::echo_client::EchoClient;
use super::common::{Action, GrpcPeer, Script, spawn_grpc};

/// The delay the peer's `RetryInfo` asks for.
const RETRY_INFO: Duration = Duration::from_millis(300);
/// The backoff of the retry policy: 10 ms at every step.
const BACKOFF: Duration = Duration::from_millis(10);

const RETRY_CONFIG: &str = r#"{"methodConfig": [{
  "name": [{"service": "test.echo.Echo"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                  "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}
}]}"#;

/// Hedges 100 s apart: only a non-fatal failure sends the next one within a test.
const HEDGING_CONFIG: &str = r#"{"methodConfig": [{
  "name": [{"service": "test.echo.Echo"}],
  "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "100s",
                    "nonFatalStatusCodes": ["UNAVAILABLE"]}
}]}"#;

/// The policies of `json`, reading `RetryInfo` or not, without backoff jitter, waiting out
/// a pushback of at most `max_pushback`.
fn policies(json: &str, retry_info: bool, max_pushback: Duration) -> Policies {
    let options = PolicyOptions::new()
        .jitter(Jitter::None)
        .retry_info(retry_info);
    ServiceConfig::from_json(json)
        .expect("a valid service config")
        .policies_builder_with(options)
        .max_pushback(max_pushback)
        .build()
}

fn echo(call: u32) -> EchoRequest {
    EchoRequest {
        message: "later".to_owned(),
        payload: b"later".to_vec(),
        call,
    }
}

/// The time from the peer's answer to attempt `n` to the arrival of attempt `n + 1`.
fn gap(peer: &GrpcPeer, n: usize) -> Duration {
    let attempts = peer.recorder().attempts(0);
    let answered = attempts[n].ended.expect("the attempt was answered");
    attempts[n + 1].arrived - answered
}

/// UNAVAILABLE with a `RetryInfo`, then OK.
fn retry_info_then_ok() -> Script {
    Script::new().call(
        0,
        [
            Action::retry_info(Code::Unavailable, RETRY_INFO),
            Action::Ok,
        ],
    )
}

#[tokio::test(start_paused = true)]
async fn a_retry_policy_from_json_waits_the_retry_info_delay() {
    let peer = spawn_grpc(retry_info_then_ok()).await;
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies(
            RETRY_CONFIG,
            true,
            Duration::from_secs(60),
        )))
        .service(peer.channel().await);

    let response = EchoClient::new(svc)
        .unary(echo(0))
        .await
        .expect("the retry succeeds");
    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(2, 0))
    );
    assert_eq!(peer.recorder().attempt_count(0), 2);
    assert_eq!(gap(&peer, 0), RETRY_INFO);
    peer.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn without_the_option_a_retry_policy_from_json_backs_off() {
    let peer = spawn_grpc(retry_info_then_ok()).await;
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies(
            RETRY_CONFIG,
            false,
            Duration::from_secs(60),
        )))
        .service(peer.channel().await);

    EchoClient::new(svc)
        .unary(echo(0))
        .await
        .expect("the retry succeeds");
    assert_eq!(peer.recorder().attempt_count(0), 2);
    assert_eq!(gap(&peer, 0), BACKOFF);
    peer.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_default_options_do_not_read_retry_info() {
    // `policies()`: the same as the option off, with gRPC's ±20 % jitter on the backoff.
    let peer = spawn_grpc(retry_info_then_ok()).await;
    let policies = ServiceConfig::from_json(RETRY_CONFIG).unwrap().policies();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies))
        .service(peer.channel().await);

    EchoClient::new(svc)
        .unary(echo(0))
        .await
        .expect("the retry succeeds");
    let gap = gap(&peer, 0);
    assert!(
        gap >= Duration::from_millis(8) && gap <= Duration::from_millis(12),
        "{gap:?} on the paused clock"
    );
    peer.shutdown().await;
}

#[tokio::test]
async fn a_hedging_policy_from_json_reads_retry_info() {
    // A `RetryInfo` delay over the pushback cap stops the hedges: one attempt, its failure.
    let peer = spawn_grpc(Script::always(Action::retry_info(
        Code::Unavailable,
        RETRY_INFO,
    )))
    .await;
    let policies = policies(HEDGING_CONFIG, true, RETRY_INFO - Duration::from_millis(1));
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies))
        .service(peer.channel().await);

    let status = EchoClient::new(svc)
        .unary(echo(0))
        .await
        .expect_err("no more hedges");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(peer.recorder().attempt_count(0), 1);
    peer.shutdown().await;
}

#[tokio::test]
async fn without_the_option_a_hedging_policy_from_json_hedges_at_once() {
    // The same answer without the option: a non-fatal failure sends the next hedge at once.
    let peer = spawn_grpc(retry_info_then_ok()).await;
    let policies = policies(HEDGING_CONFIG, false, RETRY_INFO - Duration::from_millis(1));
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies))
        .service(peer.channel().await);

    EchoClient::new(svc)
        .unary(echo(0))
        .await
        .expect("the second hedge succeeds");
    assert_eq!(peer.recorder().attempt_count(0), 2);
    peer.shutdown().await;
}
