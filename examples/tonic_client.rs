//! A tonic client with gRPC A6 retries, policies written in code.
//!
//! ```text
//! cargo run --example tonic_client
//! ```
//!
//! The example serves the `test.echo.Echo` service on 127.0.0.1; the server fails the first
//! two attempts of every call with `UNAVAILABLE`. The client wraps its channel in a
//! `RetryLayer`, and the generated `EchoClient` is used exactly as without it. Each call
//! succeeds on its third attempt; the response says so in its metadata.

use std::error::Error;
use std::time::Duration;

use tonic::transport::Endpoint;
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

#[path = "support/echo_peer.rs"]
mod echo_peer;

use echo_peer::pb::EchoRequest;
use echo_peer::pb::echo_client::EchoClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let (addr, server) = echo_peer::serve().await?;

    // Up to 4 attempts, 10 ms backoff doubling up to 100 ms (±20 % jitter, as gRPC does),
    // UNAVAILABLE retryable, and A6's retry throttle.
    let policy = RetryPolicy::builder()
        .max_attempts(4)
        .backoff(Exponential::grpc(
            Duration::from_millis(10),
            Duration::from_millis(100),
            2.0,
        )?)
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()?;
    let throttle = Throttle::new(10, 0.1)?;
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .throttle(throttle.clone())
        .build();

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .service(channel);
    let mut client = EchoClient::new(svc);

    for call in 0..2 {
        let request = EchoRequest {
            message: format!("hello #{call}"),
            payload: Vec::new(),
            call,
        };
        let response = client.unary(request).await?;
        let sent = response
            .extensions()
            .get::<Attempts>()
            .copied()
            .unwrap_or_default()
            .sent();
        let previous = response
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("absent")
            .to_owned();
        let reply = response.into_inner();
        println!(
            "call {call}: {:?} after {sent} attempts (grpc-previous-rpc-attempts: {previous}); \
             throttle at {:.1} tokens",
            reply.message,
            throttle.tokens()
        );
    }
    let stats = policies.stats().snapshot();
    if let Some(unary) = stats.methods.get("/test.echo.Echo/Unary") {
        println!(
            "Unary: {} retry attempts, {} of them failed",
            unary.retry_attempts, unary.retry_failures
        );
    }

    server.abort();
    Ok(())
}
