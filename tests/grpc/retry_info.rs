//! `google.rpc.RetryInfo` read as pushback (`GrpcCodes::with_retry_info`, the `retry-info`
//! feature): the real tonic peer answers UNAVAILABLE with a `RetryInfo` built by tonic-types.
//!
//! These run on tokio's paused clock, with no timer but the layer's own: while the client
//! waits on the socket, the clock can only jump to the retry's timer, so the gap the peer
//! sees between the first answer and the retry is the delay the layer chose, exactly.

use std::time::Duration;

use tonic::Code;
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{self, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};

use super::common::pb::echo_client::EchoClient;
use super::common::{Action, GrpcPeer, Script, spawn_grpc};
use super::{SERVICE, echo};

const BACKOFF: Duration = Duration::from_millis(10);
const RETRY_INFO: Duration = Duration::from_millis(300);

fn policies(read_retry_info: bool, max_pushback: Duration) -> Policies {
    let codes = GrpcCodes::from([classify::Code::Unavailable]);
    let builder = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(BACKOFF, BACKOFF, 1.0, Jitter::None).expect("valid backoff"));
    let policy = if read_retry_info {
        builder.retryable(codes.with_retry_info())
    } else {
        builder.retryable(codes)
    };
    Policies::builder()
        .service(SERVICE, policy.build().expect("valid policy"))
        .max_pushback(max_pushback)
        .build()
}

async fn client(
    peer: &GrpcPeer,
    policies: Policies,
) -> EchoClient<tower_retry_hedge::Retry<tonic::transport::Channel>> {
    EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies))
            .service(peer.channel().await),
    )
}

/// The time from the peer's answer to attempt `n` to the arrival of attempt `n + 1`.
fn gap(peer: &GrpcPeer, n: usize) -> Duration {
    let attempts = peer.recorder().attempts(0);
    let answered = attempts[n].ended.expect("the attempt was answered");
    attempts[n + 1].arrived - answered
}

#[tokio::test(start_paused = true)]
async fn unavailable_with_retry_info_is_retried_after_its_delay() {
    let peer = spawn_grpc(Script::new().call(
        0,
        [
            Action::retry_info(Code::Unavailable, RETRY_INFO),
            Action::Ok,
        ],
    ))
    .await;
    let mut client = client(&peer, policies(true, Duration::from_secs(60))).await;

    let response = client
        .unary(echo(0, "later"))
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
async fn without_the_option_the_backoff_applies() {
    let peer = spawn_grpc(Script::new().call(
        0,
        [
            Action::retry_info(Code::Unavailable, RETRY_INFO),
            Action::Ok,
        ],
    ))
    .await;
    let mut client = client(&peer, policies(false, Duration::from_secs(60))).await;

    client
        .unary(echo(0, "later"))
        .await
        .expect("the retry succeeds");
    assert_eq!(peer.recorder().attempt_count(0), 2);
    assert_eq!(gap(&peer, 0), BACKOFF);
    peer.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn retry_info_over_the_pushback_cap_stops_the_retries() {
    let peer = spawn_grpc(Script::always(Action::retry_info(
        Code::Unavailable,
        RETRY_INFO,
    )))
    .await;
    let mut client = client(&peer, policies(true, Duration::from_millis(299))).await;

    let status = client.unary(echo(0, "never")).await.expect_err("no retry");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(peer.recorder().attempt_count(0), 1);
    peer.shutdown().await;
}
