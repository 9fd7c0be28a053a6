//! A tonic channel to a port nothing listens on: the call fails the way gRPC fails.
//!
//! Without wait-for-ready, an attempt that cannot connect is an `UNAVAILABLE` failure: a
//! method without a policy fails at once, one with a retry policy makes its attempts with
//! backoff. With wait-for-ready, it is resent until the deadline. The clock is paused: the
//! backoffs pass as soon as the runtime is idle, and the times below are exact.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{self, GrpcCodes};
use tower_retry_hedge::error::Attempted;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{MethodPolicy, Policies, RetryLayer, RetryPolicy};

use super::common::Sends;
use super::common::pb::echo_client::EchoClient;
use super::{SERVICE, echo, guard};

/// A channel to 127.0.0.1 on a port that was free a moment ago: nothing listens there.
async fn channel_to_nothing() -> Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("listener address");
    drop(listener);
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid endpoint")
        .connect_lazy()
}

/// Calls the echo service on nothing, through the retry layer with `policies`; gives the
/// status and the times of the sends, from the call's start.
async fn call_nothing(
    policies: Policies,
    timeout: Option<Duration>,
) -> (tonic::Status, Vec<Duration>) {
    let sends = Sends::new(channel_to_nothing().await);
    let times = sends.clone();
    let mut client = EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies))
            .service(sends),
    );
    let mut request = tonic::Request::new(echo(0, "nobody"));
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    let start = Instant::now();
    let status = guard(client.unary(request))
        .await
        .expect_err("nothing listens");
    let at = times.times();
    (status, at.iter().map(|t| *t - start).collect())
}

fn backoff() -> Exponential {
    let (initial, max) = (Duration::from_millis(100), Duration::from_secs(1));
    Exponential::new(initial, max, 2.0, Jitter::None).expect("valid backoff")
}

#[tokio::test(start_paused = true)]
async fn without_a_policy_nothing_listening_fails_at_once_with_unavailable() {
    let (status, sends) = call_nothing(Policies::builder().build(), None).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(sends, [Duration::ZERO], "one send, the error at once");
    // One error rule: even after a single attempt, the layer's error is an `Attempted`,
    // which tonic keeps as the status's source.
    let attempted = std::iter::successors(std::error::Error::source(&status), |e| e.source())
        .find_map(|e| e.downcast_ref::<Attempted>())
        .expect("an Attempted in the status's chain");
    assert_eq!(attempted.attempts(), Attempts::new(1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_retry_policy_makes_its_attempts_with_backoff() {
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff())
        .retryable(GrpcCodes::from([classify::Code::Unavailable]))
        .build()
        .expect("valid policy");
    let policies = Policies::builder().service(SERVICE, policy).build();
    let (status, sends) = call_nothing(policies, None).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let ms = Duration::from_millis;
    assert_eq!(sends, [ms(0), ms(100), ms(300)], "3 counted attempts");
    assert_eq!(Attempts::of_error(&status), Attempts::new(3, 0));
}

#[tokio::test(start_paused = true)]
async fn wait_for_ready_resends_until_the_deadline() {
    // A service-config method entry with only `"waitForReady": true`.
    let policies = Policies::builder()
        .service(SERVICE, MethodPolicy::WaitForReady(None))
        .build();
    let deadline = Duration::from_secs(2);
    let (status, sends) = call_nothing(policies, Some(deadline)).await;
    // A6's example schedule (0.1 s, x2, at most 1 s, ±20 %): 4 or 5 sends before 2 s; the
    // next could not start before the deadline, so the last failure comes back at once.
    assert!(sends.len() >= 4, "{sends:?}");
    assert!(sends.iter().all(|at| *at < deadline), "{sends:?}");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{status:?}"
    );
    let attempts = Attempts::of_error(&status);
    assert_eq!(attempts.sent() as usize, sends.len());
    assert_eq!(attempts.transparent() as usize, sends.len() - 1);
}
