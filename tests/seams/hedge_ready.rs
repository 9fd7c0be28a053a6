//! Hedges whose service fails to become ready while the first attempt is in flight: the call
//! must still return the first attempt's answer, and its deadline must still be enforced.
//!
//! The service under the hedge layer is a real tonic `Channel` wrapped in [`FlakyReady`]:
//! the clones the layer makes to send hedges fail every 7th `poll_ready` between them; the
//! service each call is made with (which sends its first attempt) never does. The server
//! answers every attempt OK after 20 ms; hedges go 2 ms apart, up to 3 attempts.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Server};
use tower::{Service, ServiceBuilder};
use tower_retry_hedge::classify::{self, GrpcCodes};
use tower_retry_hedge::{BoxError, HedgeLayer, HedgePolicy, Policies};

use super::common::pb::EchoRequest;
use super::common::pb::echo_client::EchoClient;
use super::common::{Action, Script, grpc_channel, spawn_grpc_on};
use super::{chain_text, guard};

/// How many hedged calls the test makes, and how many are in flight at once.
const CALLS: u32 = 1_500;
const IN_FLIGHT: usize = 40;
/// Every call's deadline, and how long a call may run before it counts as hung: 10 times it.
const DEADLINE: Duration = Duration::from_millis(500);
const HUNG: Duration = Duration::from_secs(5);
/// Every how many `poll_ready` of the layer's clones fails.
const FAIL_EVERY: usize = 7;

/// The error a hedge's `poll_ready` fails with.
#[derive(Debug)]
struct NotReady;

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("scripted poll_ready failure")
    }
}

impl std::error::Error for NotReady {}

/// A tonic `Channel` whose clones fail every [`FAIL_EVERY`]th `poll_ready` between them.
struct FlakyReady {
    inner: Channel,
    polls: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
    // Made by `clone`: the layer's spare and the services it sends hedges on.
    flaky: bool,
}

impl Clone for FlakyReady {
    fn clone(&self) -> Self {
        FlakyReady {
            inner: self.inner.clone(),
            polls: Arc::clone(&self.polls),
            failures: Arc::clone(&self.failures),
            flaky: true,
        }
    }
}

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

impl Service<GrpcRequest> for FlakyReady {
    type Response = GrpcResponse;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<GrpcResponse, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.flaky && self.polls.fetch_add(1, Ordering::Relaxed) % FAIL_EVERY == FAIL_EVERY - 1 {
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(Box::new(NotReady)));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        let future = self.inner.call(request);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// What a call ended with.
#[derive(Debug)]
enum Ended {
    Ok,
    Failed(Code, String),
    Hung,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_failing_to_get_ready_leave_the_first_attempts_answer_and_the_deadline() {
    // The scripted peer on a server that lets clients reset as many streams as they like:
    // the hedges cancelled here reset streams by the thousand, and a loaded machine can make
    // that look like a flood of resets to h2's guard against them (GOAWAY,
    // ENHANCE_YOUR_CALM), failing calls this test is not about.
    let server = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(1_000_000))
        .http2_max_local_error_reset_streams(Some(1_000_000));
    let script = Script::always(Action::delay(Duration::from_millis(20), Action::Ok));
    let peer = spawn_grpc_on(server, script).await;
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::from_millis(2))
        .non_fatal(GrpcCodes::from([classify::Code::Unavailable]))
        .build()
        .expect("a valid policy");
    let policies = Policies::builder()
        .service("test.echo.Echo", policy)
        .build();
    let layer = HedgeLayer::new(policies);
    let channel = grpc_channel(peer.addr()).await;
    let polls = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));

    let mut calls = JoinSet::new();
    for call in 0..CALLS {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("the semaphore is open");
        // A client per call, made with the service that never fails: only the layer's
        // clones, which send the hedges, fail to get ready.
        let mut client = EchoClient::new(ServiceBuilder::new().layer(layer.clone()).service(
            FlakyReady {
                inner: channel.clone(),
                polls: Arc::clone(&polls),
                failures: Arc::clone(&failures),
                flaky: false,
            },
        ));
        calls.spawn(async move {
            let mut request = tonic::Request::new(EchoRequest {
                message: "hedged".to_owned(),
                payload: call.to_be_bytes().to_vec(),
                call,
            });
            request.set_timeout(DEADLINE);
            let started = Instant::now();
            let mut unary = pin!(client.unary(request));
            // A call still running at its deadline gives its place to the next one (so that
            // calls that hang do not hold the others back), and counts as hung if it is still
            // running at 10 times its deadline.
            let answer = match tokio::time::timeout(DEADLINE, &mut unary).await {
                Ok(answer) => Some(answer),
                Err(_) => {
                    drop(permit);
                    tokio::time::timeout_at(started + HUNG, &mut unary)
                        .await
                        .ok()
                }
            };
            let ended = match answer {
                None => Ended::Hung,
                Some(Ok(response)) => {
                    let reply = response.into_inner();
                    assert_eq!(
                        reply.payload,
                        call.to_be_bytes(),
                        "call {call}: another reply"
                    );
                    Ended::Ok
                }
                Some(Err(status)) => Ended::Failed(status.code(), chain_text(&status)),
            };
            (call, ended)
        });
    }

    let (mut ok, mut failed, mut hung) = (0, Vec::new(), Vec::new());
    while let Some(joined) = guard(calls.join_next()).await {
        match joined.expect("the call task ends") {
            (_, Ended::Ok) => ok += 1,
            (call, Ended::Failed(code, message)) => failed.push((call, code, message)),
            (call, Ended::Hung) => hung.push(call),
        }
    }
    let failures = failures.load(Ordering::Relaxed);
    eprintln!(
        "{CALLS} hedged calls: {ok} OK, {} failed, {} ran past {HUNG:?}; {failures} hedge \
         poll_ready failures",
        failed.len(),
        hung.len()
    );
    assert!(
        failures > 0,
        "no hedge failed to get ready: the test tests nothing"
    );
    assert!(
        hung.is_empty(),
        "{} of {CALLS} hedged calls ran past {HUNG:?} with a {DEADLINE:?} deadline: {:?}",
        hung.len(),
        &hung[..hung.len().min(20)]
    );
    assert!(
        failed.is_empty(),
        "{} of {CALLS} hedged calls failed though their first attempt was answered OK: {:?}",
        failed.len(),
        &failed[..failed.len().min(20)]
    );
    assert_eq!(ok, CALLS);
    guard(peer.shutdown()).await;
}
