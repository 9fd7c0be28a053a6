//! The official gRPC crate's client (`grpc` 0.9) with gRFC A6 retries and hedging: a
//! `grpc::client::Channel` wrapped in the crate's `RetryInterceptor`, policies from a
//! service config.
//!
//! ```text
//! cargo run --features grpc --example grpc_channel
//! ```
//!
//! The example serves the `test.echo.Echo` service on 127.0.0.1 with tonic; the server fails
//! the first two attempts of every call with `UNAVAILABLE`. `Unary` is retried (with A6's
//! throttle); `ServerStream` is not configured, so its failure is its answer. The client calls through the channel with the interceptor, as a generated
//! `grpc` client would, and prints what each call did.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use grpc::client::interceptor::InvokeExt as _;
use grpc::client::{
    CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem, SendOptions,
    SendStream,
};
use grpc::core::RequestHeaders;
use grpc::credentials::LocalChannelCredentials;
use prost::Message as _;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::grpc_channel::RetryInterceptor;

#[path = "support/echo_peer.rs"]
mod echo_peer;
#[path = "support/raw_message.rs"]
mod raw_message;

use echo_peer::pb::{EchoReply, EchoRequest};
use raw_message::{Raw, RawReply};

const CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "test.echo.Echo", "method": "Unary"}],
    "retryPolicy": {
      "maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let (addr, server) = echo_peer::serve().await?;

    let config: ServiceConfig = CONFIG.parse()?;
    let interceptor = RetryInterceptor::new(config.policies());
    let policies = interceptor.policies().clone();
    let channel = Channel::new(
        format!("dns:///{addr}"),
        Arc::new(LocalChannelCredentials::new()),
        ChannelOptions::default(),
    );
    let client = channel.with_interceptor(interceptor);

    for call in 0..2 {
        let request = EchoRequest {
            message: format!("hello #{call}"),
            payload: Vec::new(),
            call,
        };
        let started = Instant::now();
        let (status, previous, reply) = unary(&client, "/test.echo.Echo/Unary", request).await;
        let reply = reply.map(|bytes| EchoReply::decode(bytes).map(|r| r.message));
        println!(
            "Unary call {call}: {status} in {:?}, reply {reply:?} \
             (grpc-previous-rpc-attempts: {previous})",
            started.elapsed()
        );
    }
    // No policy for this method: its failure is the answer.
    let request = EchoRequest {
        message: "not configured".to_owned(),
        payload: Vec::new(),
        call: 9,
    };
    let (status, previous, _) = unary(&client, "/test.echo.Echo/ServerStream", request).await;
    println!("ServerStream call 9: {status} (grpc-previous-rpc-attempts: {previous})");

    let stats = policies.stats().snapshot();
    if let Some(unary) = stats.methods.get("/test.echo.Echo/Unary") {
        println!(
            "Unary: {} retry attempts, {} of them failed",
            unary.retry_attempts, unary.retry_failures
        );
    }
    println!("throttle: {:?}", policies.throttle_state());

    server.abort();
    Ok(())
}

/// A call of `method` with one request message: its status, the attempts the answer says
/// came before it, and the first reply message.
async fn unary(
    client: &impl Invoke,
    method: &str,
    request: EchoRequest,
) -> (String, String, Option<Bytes>) {
    let headers = RequestHeaders::new().with_method_name(method);
    let (mut send, mut recv) = client.invoke(headers, CallOptions::new()).await;
    let message = Raw(request.encode_to_vec().into());
    // A failed send means the call is over; its status comes on the receive side.
    let _ = send
        .send(&message, SendOptions::new().with_final_msg(true))
        .await;
    drop(send);
    let mut previous = "absent".to_owned();
    let mut first = None;
    loop {
        let mut reply = RawReply::default();
        match recv.recv(&mut reply).await {
            ResponseStreamItem::Headers(headers) => {
                if let Some(value) = headers.metadata().get("grpc-previous-rpc-attempts") {
                    previous = value.to_str().to_owned();
                }
            }
            ResponseStreamItem::Message => first = first.or(reply.0),
            ResponseStreamItem::Trailers(trailers) => {
                if let Some(value) = trailers.metadata().get("grpc-previous-rpc-attempts") {
                    previous = value.to_str().to_owned();
                }
                let status = match trailers.status() {
                    Ok(()) => "OK".to_owned(),
                    Err(error) => format!("{:?} ({})", error.code(), error.message()),
                };
                return (status, previous, first);
            }
            ResponseStreamItem::StreamClosed => {
                return ("closed without a status".to_owned(), previous, first);
            }
        }
    }
}
