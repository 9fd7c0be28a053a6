//! The hedge layer under a generated tonic client, over a real channel to the scripted gRPC
//! peer of `tests/common`. Real clock and real sockets: the tests wait on the peer's
//! recorder, assert on no durations, and `guard` only stops a broken run from hanging.

use std::future::Future;
use std::time::Duration;

use tower::{Layer, ServiceBuilder};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies};

use crate::common::pb::EchoRequest;
use crate::common::pb::echo_client::EchoClient;
use crate::common::{Action, Outcome, Script, spawn_grpc};

/// Fails the test instead of hanging it if the peer or the layer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .expect("no progress within the hang guard")
}

#[tokio::test]
async fn tonic_client_gets_the_fast_hedge_and_the_slow_attempt_is_cancelled() {
    // Attempt 0 never answers; attempt 1, the hedge sent 20 ms later, answers at once.
    let peer = spawn_grpc(Script::new().call(0, [Action::Hang, Action::Ok])).await;
    let recorder = peer.recorder();
    let policy = HedgePolicy::builder()
        .max_attempts(2)
        .delay(Duration::from_millis(20))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("a valid policy");
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .build();
    let channel = peer.channel().await;
    let mut client = EchoClient::new(
        ServiceBuilder::new()
            .layer(HedgeLayer::new(policies))
            .service(channel),
    );

    let response = guard(client.unary(EchoRequest {
        message: "hedged".to_owned(),
        payload: b"\x00\xff".to_vec(),
        call: 0,
    }))
    .await
    .expect("the hedge answers");
    assert_eq!(
        response
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().expect("ascii")),
        Some("1")
    );
    assert_eq!(
        response.extensions().get::<Attempts>(),
        Some(&Attempts::new(2, 0))
    );
    let reply = response.into_inner();
    assert_eq!(reply.attempt, 1, "the fast answer is the hedge's");
    assert_eq!(reply.message, "hedged");
    assert_eq!(reply.payload, b"\x00\xff");

    // Dropping the slow attempt resets its stream: the server sees the cancellation.
    guard(recorder.wait_for_cancelled(0, 1)).await;
    let attempts = recorder.attempts(0);
    assert_eq!(attempts.len(), 2);
    assert!(attempts[0].cancelled);
    assert_eq!(attempts[0].outcome, None);
    assert_eq!(attempts[0].previous_attempts, None);
    assert!(!attempts[1].cancelled);
    assert_eq!(attempts[1].outcome, Some(Outcome::Ok));
    assert_eq!(attempts[1].previous_attempts.as_deref(), Some("1"));
    assert_eq!(attempts[1].payload.as_ref(), b"\x00\xff");

    guard(peer.shutdown()).await;
}

#[tokio::test]
async fn a_json_hedging_method_sends_the_next_hedge_for_every_failed_first_attempt() {
    // 100 calls one after the other, each with a first attempt that fails UNAVAILABLE and a
    // second that answers: every call succeeds after 2 attempts, whatever the hedge budget
    // that the JSON policy carries (A6's next hedge after a failure does not ask it).
    let calls = 100;
    let script = (0..calls).fold(Script::new(), |script, call| {
        script.call(call, [Action::fail(tonic::Code::Unavailable), Action::Ok])
    });
    let peer = spawn_grpc(script).await;
    let policies = tower_retry_hedge::ServiceConfig::from_json(
        r#"{"methodConfig": [{
            "name": [{"service": "test.echo.Echo"}],
            "hedgingPolicy": {
                "maxAttempts": 3, "hedgingDelay": "1s", "nonFatalStatusCodes": ["UNAVAILABLE"]
            }
        }]}"#,
    )
    .expect("valid service config")
    .policies();
    let channel = peer.channel().await;
    let mut client = EchoClient::new(HedgeLayer::new(policies).layer(channel));
    for call in 0..calls {
        let request = EchoRequest {
            message: "hedged".to_owned(),
            payload: Vec::new(),
            call,
        };
        let response = guard(client.unary(request))
            .await
            .unwrap_or_else(|status| panic!("call {call} failed: {status:?}"));
        assert_eq!(
            response.extensions().get::<Attempts>(),
            Some(&Attempts::new(2, 0)),
            "call {call}"
        );
    }
    guard(peer.shutdown()).await;
}
