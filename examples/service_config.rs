//! The service config of gRFC A6 (its retry policy and retry throttling), applied to a
//! tonic client that talks to a flaky server on 127.0.0.1.
//!
//! The example parses the JSON with [`ServiceConfig::from_json`], turns it into a policy
//! table, wraps a tonic `Channel` with one [`RetryLayer`], and makes a
//! series of calls to a server (spawned here) that fails some attempts with `UNAVAILABLE`
//! (retryable) or `INTERNAL` (not). Both sides print what they see: each attempt as the
//! server received it, with its `grpc-previous-rpc-attempts`, and each call's outcome with
//! its attempt count and the throttle's tokens. It shows, in order:
//!
//! 1. a call that succeeds at once;
//! 2. a call retried twice, with backoff of about 0.1 s then 0.2 s (gRPC's ±20 % jitter);
//! 3. an `INTERNAL` failure, which is not in `retryableStatusCodes`: no retry;
//! 4. a call that fails every time: `maxAttempts` (4) attempts, then the last status;
//! 5. the throttle at work: each failed attempt took a token, the bucket is down to 4.1 of
//!    10, and retries need more than half of it, so the next failing call is not retried;
//! 6. thirty successes earn 0.1 token each (`tokenRatio`), and the next failing call gets one
//!    retry again (6.1 → 5.1, above half; 5.1 → 4.1, not).
//!
//! The throttle here is gRFC A6's example, `{"maxTokens": 10, "tokenRatio": 0.1}`, kept
//! because this example exists to show the bucket refusing retries and refilling. It is not
//! the crate's recommendation: at 30 % failure that bucket sits at half and stops nearly every
//! retry. The guide recommends `{"maxTokens": 20, "tokenRatio": 1}`, which keeps retrying
//! while fewer than half of the answers fail and stops after 10 failures more than successes.
//!
//! ```text
//! cargo run --features tonic --example service_config
//! ```
//!
//! The request and reply types come from the test suite's `tests/proto/echo.proto`
//! (generated code checked in at `tests/common/pb/test.echo.rs`).

use std::collections::HashMap;
use std::error::Error;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::metadata::MetadataMap;
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tower::ServiceBuilder;
use tower_retry_hedge::RetryLayer;
use tower_retry_hedge::backoff::Jitter;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::throttle::Throttle;

/// Code generated from `tests/proto/echo.proto` (package `test.echo`).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    dead_code
)]
mod pb {
    include!("../tests/common/pb/test.echo.rs");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::{Chunk, Digest, EchoReply, EchoRequest};

/// gRFC A6's retry policy and throttling, for the echo service. The bucket `{10, 0.1}` is
/// A6's example, chosen to show the throttle refusing; the recommended one is `{20, 1}`.
const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "test.echo.Echo"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {
    "maxTokens": 10,
    "tokenRatio": 0.1
  }
}"#;

/// Successes that refill the throttle between the two failing calls.
const REFILL_CALLS: u32 = 30;

/// What the server answers to one attempt.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok,
    Fail(Code),
}

/// The calls the client makes, in order: a description and the server's answers to its
/// attempts (past the end of the list, the last answer repeats).
fn plan() -> Vec<(&'static str, Vec<Answer>)> {
    use Answer::{Fail, Ok};
    let unavailable = Fail(Code::Unavailable);
    let mut plan = vec![
        ("succeeds at once", vec![Ok]),
        (
            "UNAVAILABLE twice, then OK",
            vec![unavailable, unavailable, Ok],
        ),
        ("INTERNAL: not retryable", vec![Fail(Code::Internal)]),
        ("always UNAVAILABLE", vec![unavailable]),
        ("always UNAVAILABLE, throttle low", vec![unavailable]),
    ];
    plan.extend((0..REFILL_CALLS).map(|_| ("refill", vec![Ok])));
    plan.push(("always UNAVAILABLE, after the refill", vec![unavailable]));
    plan
}

/// The flaky server: answers each attempt of call `request.call` as the plan says.
struct Flaky {
    plan: Vec<Vec<Answer>>,
    attempts: Mutex<HashMap<u32, usize>>,
    started: Instant,
}

impl Flaky {
    fn answer(&self, call: u32) -> (usize, Answer) {
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            let seen = attempts.entry(call).or_insert(0);
            *seen += 1;
            *seen
        };
        let answers = usize::try_from(call)
            .ok()
            .and_then(|call| self.plan.get(call))
            .map_or(&[][..], Vec::as_slice);
        let answer = answers
            .get(attempt - 1)
            .or(answers.last())
            .copied()
            .unwrap_or(Answer::Ok);
        (attempt, answer)
    }
}

#[tonic::async_trait]
impl Echo for Flaky {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let previous = header(request.metadata(), "grpc-previous-rpc-attempts");
        let request = request.into_inner();
        let (attempt, answer) = self.answer(request.call);
        let refill = usize::try_from(request.call)
            .is_ok_and(|call| (5..5 + REFILL_CALLS as usize).contains(&call));
        if !refill {
            println!(
                "  [server] +{:>5} ms  call {} attempt {attempt} (grpc-previous-rpc-attempts: {}): {answer:?}",
                self.started.elapsed().as_millis(),
                request.call,
                previous.as_deref().unwrap_or("none"),
            );
        }
        match answer {
            Answer::Ok => Ok(Response::new(EchoReply {
                message: request.message,
                payload: request.payload,
                attempt: u32::try_from(attempt - 1).unwrap_or(u32::MAX),
            })),
            Answer::Fail(code) => Err(Status::new(code, "the flaky server says no")),
        }
    }

    async fn client_stream(
        &self,
        _request: Request<Streaming<Chunk>>,
    ) -> Result<Response<Digest>, Status> {
        Err(Status::unimplemented("not part of this example"))
    }

    type ServerStreamStream = futures_util::stream::Empty<Result<EchoReply, Status>>;

    async fn server_stream(
        &self,
        _request: Request<EchoRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("not part of this example"))
    }
}

fn header(metadata: &MetadataMap, name: &str) -> Option<String> {
    metadata
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// The attempts a call made, from its response or its error status: the `Attempts`
/// extension, else `grpc-previous-rpc-attempts` + 1 (absent after a single attempt).
fn attempts_of(result: &Result<Response<EchoReply>, Status>) -> u32 {
    let from_metadata = |metadata: &MetadataMap| {
        header(metadata, "grpc-previous-rpc-attempts")
            .and_then(|previous| previous.parse::<u32>().ok())
            .map_or(1, |previous| previous.saturating_add(1))
    };
    match result {
        Ok(response) => response
            .extensions()
            .get::<Attempts>()
            .map_or_else(|| from_metadata(response.metadata()), Attempts::sent),
        Err(status) => from_metadata(status.metadata()),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // The service config, checked against every rule of gRFC A6.
    let config = ServiceConfig::from_json(SERVICE_CONFIG)?;
    println!("service config: {SERVICE_CONFIG}");

    // The policy table. The throttle is taken here from `retryThrottling` (rather than
    // left to `config.policies()`) only so that the example can print its tokens.
    let throttle = config.throttle().ok_or("the config has retryThrottling")?;
    let policies = config
        .policies_builder_with(Jitter::GRPC)
        .throttle(throttle.clone())
        .build();

    // The flaky server, on a port the OS picks.
    let plan = plan();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let flaky = Flaky {
        plan: plan.iter().map(|(_, answers)| answers.clone()).collect(),
        attempts: Mutex::new(HashMap::new()),
        started: Instant::now(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(EchoServer::new(flaky))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    println!("server listening on {addr}\n");

    // The client: a channel under one layer. It drives every call by its method's policy:
    // this config has only a retry policy, and the same layer would hedge the methods of a
    // config with a hedgingPolicy.
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let client = EchoClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new(policies.clone()))
            .service(channel),
    );

    // A safety net: an example must never hang.
    timeout(
        Duration::from_secs(30),
        make_calls(client, &plan, &throttle),
    )
    .await??;

    for (method, stats) in policies.stats().snapshot().methods {
        println!(
            "statistics of {method}: {} retry attempts, {} of them failed",
            stats.retry_attempts, stats.retry_failures
        );
    }
    let _ = stop.send(());
    server.await??;
    Ok(())
}

async fn make_calls<T>(
    client: EchoClient<T>,
    plan: &[(&'static str, Vec<Answer>)],
    throttle: &Throttle,
) -> Result<(), Box<dyn Error>>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone,
    T::Error: Into<tower_retry_hedge::BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower_retry_hedge::BoxError> + Send,
{
    let mut refilled = 0;
    for (call, (what, _)) in (0u32..).zip(plan) {
        if *what == "refill" {
            if refilled == 0 {
                println!("[client] {REFILL_CALLS} successful calls to refill the throttle ...");
            }
            refilled += 1;
        } else {
            println!("[client] call {call}: {what}");
        }
        let started = Instant::now();
        let result = client
            .clone()
            .unary(EchoRequest {
                message: format!("hello {call}"),
                payload: Vec::new(),
                call,
            })
            .await;
        if *what == "refill" {
            if refilled == REFILL_CALLS {
                println!(
                    "[client] calls {}-{call}: OK; throttle tokens {:.1} of {}\n",
                    call + 1 - REFILL_CALLS,
                    throttle.tokens(),
                    throttle.max_tokens(),
                );
            }
            continue;
        }
        let outcome = match &result {
            Ok(_) => "OK".to_owned(),
            Err(status) => format!("{:?} ({})", status.code(), status.message()),
        };
        println!(
            "[client] call {call}: {outcome} after {} attempt(s) in {} ms; throttle tokens {:.1} of {}\n",
            attempts_of(&result),
            started.elapsed().as_millis(),
            throttle.tokens(),
            throttle.max_tokens(),
        );
    }
    Ok(())
}
