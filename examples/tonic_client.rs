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

use std::collections::HashMap;
use std::error::Error;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use tower::ServiceBuilder;
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

/// The code generated from `tests/proto/echo.proto` (package `test.echo`).
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pb {
    include!("../tests/common/pb/test.echo.rs");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::{Chunk, Digest, EchoReply, EchoRequest};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        Server::builder()
            .add_service(EchoServer::new(FailsTwice::default()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

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

/// Fails the first two attempts of every call with `UNAVAILABLE`.
#[derive(Default)]
struct FailsTwice {
    attempts: Mutex<HashMap<u32, u32>>,
}

#[tonic::async_trait]
impl Echo for FailsTwice {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let request = request.into_inner();
        let attempt = {
            let mut attempts = self
                .attempts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = attempts.entry(request.call).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        if attempt <= 2 {
            return Err(Status::unavailable(format!("attempt {attempt}: try again")));
        }
        Ok(Response::new(EchoReply {
            message: request.message,
            payload: request.payload,
            attempt: attempt.saturating_sub(1),
        }))
    }

    async fn client_stream(
        &self,
        _request: Request<tonic::Streaming<Chunk>>,
    ) -> Result<Response<Digest>, Status> {
        Err(Status::unimplemented("not used by this example"))
    }

    type ServerStreamStream = tokio_stream::Empty<Result<EchoReply, Status>>;

    async fn server_stream(
        &self,
        _request: Request<EchoRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not used by this example"))
    }
}
