//! `balance::BalancedChannel` against three real tonic servers on 127.0.0.1, with the retry
//! and hedge layers on top and the generated client unchanged; next to tonic's own
//! `Channel::balance_list`.
//!
//! The calls run 64 (retry) or 4 (hedge) at a time on two worker threads, on the real clock:
//! the backoff is 1 ms and the hedging delay 20 ms, so no test waits on a timer for long.
//! Assertions are on outcomes and on what each server saw, never on wall-clock durations; the
//! latencies are printed (`cargo test --all-features --test balance_network -- --nocapture`).

// For the generated `test.echo` code.
#[path = "../common/mod.rs"]
mod common;
mod json_defaults;
mod json_hedging;
mod outliers;
mod tried;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::ReplyStream;
use common::pb::echo_client::EchoClient;
use common::pb::echo_server::{Echo, EchoServer};
use common::pb::{Chunk, Digest, EchoReply, EchoRequest};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use tower::Layer;
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::balance::{BalancedChannel, OutlierDetection};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy};

const SERVICE: &str = "test.echo.Echo";

/// How a backend answers every call.
#[derive(Debug, Clone)]
enum Behaviour {
    Ok,
    Unavailable,
    OkAfter(Duration),
    /// `UNAVAILABLE` while the switch is on, OK otherwise.
    UnavailableWhile(Arc<AtomicBool>),
    /// `UNAVAILABLE` until then (tokio's clock), OK from then on.
    UnavailableUntil(tokio::time::Instant),
}

/// A small `test.echo.Echo` server (unary only) that counts, per call, the attempts it saw,
/// the first attempts it saw (a request without `grpc-previous-rpc-attempts`) and when, and
/// the calls it answered OK. Lighter than `tests/common`'s scripted peer, which keeps every
/// attempt's metadata: these tests make tens of thousands of attempts.
#[derive(Debug, Clone)]
struct Backend {
    behaviour: Behaviour,
    attempts: Arc<Mutex<HashMap<u32, u32>>>,
    first: Arc<Mutex<Vec<(u32, tokio::time::Instant)>>>,
    answered_ok: Arc<AtomicU32>,
    /// Where every arrival is also noted, with its attempt number, for `json_defaults`.
    witness: Option<json_defaults::Witness>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let first = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .is_none();
        if let Some(witness) = &self.witness {
            witness.record(&request);
        }
        let request = request.into_inner();
        *self
            .attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(request.call)
            .or_default() += 1;
        if first {
            self.first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((request.call, tokio::time::Instant::now()));
        }
        match &self.behaviour {
            Behaviour::Unavailable => return Err(Status::unavailable("backend down")),
            Behaviour::UnavailableWhile(down) if down.load(Ordering::Relaxed) => {
                return Err(Status::unavailable("backend down"));
            }
            Behaviour::UnavailableUntil(up) if tokio::time::Instant::now() < *up => {
                return Err(Status::unavailable("backend down"));
            }
            Behaviour::OkAfter(delay) => tokio::time::sleep(*delay).await,
            Behaviour::Ok | Behaviour::UnavailableWhile(_) | Behaviour::UnavailableUntil(_) => {}
        }
        self.answered_ok.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(EchoReply {
            message: request.message,
            payload: request.payload,
            attempt: 0,
        }))
    }

    async fn client_stream(
        &self,
        _request: Request<Streaming<Chunk>>,
    ) -> Result<Response<Digest>, Status> {
        Err(Status::unimplemented("unary only"))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        _request: Request<EchoRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("unary only"))
    }
}

/// A [`Backend`] served on 127.0.0.1:0.
struct EchoPeer {
    addr: SocketAddr,
    backend: Backend,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl EchoPeer {
    async fn spawn(behaviour: Behaviour) -> Self {
        EchoPeer::spawn_witnessed(behaviour, None).await
    }

    /// A server that also notes every arrival with `witness`.
    async fn spawn_witnessed(
        behaviour: Behaviour,
        witness: Option<json_defaults::Witness>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let backend = Backend {
            behaviour,
            attempts: Arc::default(),
            first: Arc::default(),
            answered_ok: Arc::default(),
            witness,
        };
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(
            Server::builder()
                .tcp_nodelay(true)
                .add_service(EchoServer::new(backend.clone()))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = signal.await;
                }),
        );
        EchoPeer {
            addr,
            backend,
            shutdown,
            task,
        }
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("valid endpoint uri")
            .tcp_nodelay(true)
    }

    /// The calls in `calls` that reached this server more than once.
    fn repeated(&self, calls: std::ops::Range<u32>) -> Vec<u32> {
        let attempts = self
            .backend
            .attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut repeated: Vec<u32> = attempts
            .iter()
            .filter(|&(call, &n)| calls.contains(call) && n > 1)
            .map(|(&call, _)| call)
            .collect();
        repeated.sort_unstable();
        repeated
    }

    /// How many attempts of calls in `calls` reached this server.
    fn attempts(&self, calls: std::ops::Range<u32>) -> u32 {
        let attempts = self
            .backend
            .attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        attempts
            .iter()
            .filter(|(call, _)| calls.contains(call))
            .map(|(_, &n)| n)
            .sum()
    }

    /// How many calls in `calls` sent their first attempt here.
    fn first_attempts(&self, calls: std::ops::Range<u32>) -> usize {
        let first = self
            .backend
            .first
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first
            .iter()
            .filter(|(call, _)| calls.contains(call))
            .count()
    }

    /// The first attempts that reached this server at or after `from` and before `to`.
    fn first_attempts_between(
        &self,
        from: tokio::time::Instant,
        to: tokio::time::Instant,
    ) -> usize {
        let first = self
            .backend
            .first
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first
            .iter()
            .filter(|(_, at)| (from..to).contains(at))
            .count()
    }

    /// Stops accepting, waits for the connections to close (drop the clients first) and for
    /// the server task to end.
    async fn shutdown(self) {
        let _ = self.shutdown.send(());
        self.task
            .await
            .expect("server task")
            .expect("server ran without error");
    }
}

/// A table hedging every call of the echo service, 3 attempts `delay` apart (`UNAVAILABLE`
/// non-fatal), with the record of tried backends that the balancer reads. With
/// `reset_every_loser`, every loser is reset at once, as A6 says (`resets_per_second(None)`),
/// for a test that counts what each server answered: a loser let finish has its server answer
/// a call that did not wait for it.
fn hedged_and_tracked(delay: Duration, reset_every_loser: bool) -> Policies {
    // No hedge budget: every call stuck on the slow server is to be hedged (the default
    // budget's 5 % would leave some waiting for it), as A6 hedges.
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(delay)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(None)
        .build()
        .expect("valid policy");
    let builder = Policies::builder()
        .service(SERVICE, policy)
        .track_backends(true);
    match reset_every_loser {
        true => builder.resets_per_second(None).build(),
        false => builder.build(),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails the test instead of hanging it if a server or a layer misbehaves.
async fn guard<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("the calls did not end within the hang guard")
}

/// Makes calls `first..first + calls`, `concurrency` at a time, each with its number as the
/// request's `call`; gives each call's outcome and latency, by call number.
async fn run<S>(
    client: EchoClient<S>,
    first: u32,
    calls: u32,
    concurrency: usize,
) -> Vec<(Result<(), tonic::Status>, Duration)>
where
    EchoClient<S>: Clone + Send + 'static,
    S: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
    S::Future: Send,
    S::Error: Into<tower_retry_hedge::BoxError>,
    S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower_retry_hedge::BoxError> + Send,
{
    let next = Arc::new(AtomicU32::new(first));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (next, mut client) = (Arc::clone(&next), client.clone());
        workers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let call = next.fetch_add(1, Ordering::Relaxed);
                if call >= first + calls {
                    return outcomes;
                }
                let started = tokio::time::Instant::now();
                let request = EchoRequest {
                    message: "hello".into(),
                    payload: Vec::new(),
                    call,
                };
                let outcome = client.unary(request).await.map(drop);
                outcomes.push((call, outcome, started.elapsed()));
            }
        }));
    }
    let mut outcomes = Vec::new();
    for worker in workers {
        outcomes.extend(worker.await.expect("a worker panicked"));
    }
    outcomes.sort_by_key(|(call, ..)| *call);
    outcomes
        .into_iter()
        .map(|(_, outcome, latency)| (outcome, latency))
        .collect()
}

fn failures(outcomes: &[(Result<(), tonic::Status>, Duration)]) -> usize {
    outcomes
        .iter()
        .filter(|(outcome, _)| outcome.is_err())
        .count()
}

/// The latency below which `q` of the calls ended.
fn quantile(outcomes: &[(Result<(), tonic::Status>, Duration)], q: f64) -> Duration {
    let mut latencies: Vec<Duration> = outcomes.iter().map(|(_, latency)| *latency).collect();
    latencies.sort_unstable();
    let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[index]
}

const RETRY_CALLS: u32 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_dead_backend_of_three_no_call_fails() {
    let servers = [
        EchoPeer::spawn(Behaviour::Unavailable).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    let endpoints = || servers.each_ref().map(EchoPeer::endpoint);
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Exponential::new(ms(1), ms(1), 2.0, Jitter::None).expect("valid backoff"))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("valid policy");
    let policies = Policies::builder()
        .service(SERVICE, policy)
        .track_backends(true)
        .build();

    // This crate's balancer in place of `Channel::balance_list`, with the calls' record of
    // tried backends, and without outlier detection: the dead backend keeps its share of
    // first attempts, and the record alone saves their calls. (`outliers.rs` turns it on.)
    let channel = BalancedChannel::builder()
        .outlier_detection(OutlierDetection::disabled())
        .balance_list(endpoints());
    let client = EchoClient::new(RetryLayer::new(policies.clone()).layer(channel));
    let ours = guard(run(client, 0, RETRY_CALLS, 64)).await;

    // tonic's balancer with the same retry layer (the record would change nothing for it).
    let channel = Channel::balance_list(endpoints().into_iter());
    let client = EchoClient::new(RetryLayer::new(policies).layer(channel));
    let tonic = guard(run(client, RETRY_CALLS, RETRY_CALLS, 64)).await;

    println!(
        "{RETRY_CALLS} calls, 3 servers, one always UNAVAILABLE, maxAttempts 3: \
         balance::BalancedChannel {} failed; tonic Channel::balance_list {} failed",
        failures(&ours),
        failures(&tonic),
    );
    assert_eq!(
        failures(&ours),
        0,
        "{:?}",
        ours.iter().find(|o| o.0.is_err())
    );
    // No server saw a call of ours twice: every retry went to a server the call had not tried.
    for server in &servers {
        let repeated = server.repeated(0..RETRY_CALLS);
        assert!(
            repeated.is_empty(),
            "{} saw calls again: {repeated:?}",
            server.addr
        );
    }
    // The dead server took its share of first attempts, so the retries were needed.
    let dead_attempts = servers[0].attempts(0..RETRY_CALLS);
    assert!(
        dead_attempts > 100,
        "dead server saw {dead_attempts} attempts"
    );

    for server in servers {
        server.shutdown().await;
    }
}

const HEDGE_CALLS: u32 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_never_go_to_the_backend_their_call_tried() {
    let servers = [
        EchoPeer::spawn(Behaviour::OkAfter(ms(1_000))).await,
        EchoPeer::spawn(Behaviour::Ok).await,
        EchoPeer::spawn(Behaviour::Ok).await,
    ];
    // A few calls at a time: resetting every loser stays far within what h2 allows.
    let policies = hedged_and_tracked(ms(20), true);
    let channel = BalancedChannel::balance_list(servers.each_ref().map(EchoPeer::endpoint));
    let client = EchoClient::new(HedgeLayer::new(policies).layer(channel));
    // A few calls at a time: with more, the calls queue for the two cores of a debug build,
    // and the queueing, not the backends, decides the latency.
    let outcomes = guard(run(client, 0, HEDGE_CALLS, 4)).await;

    let slow = &servers[0];
    let slow_attempts = slow.attempts(0..HEDGE_CALLS);
    let all_attempts: u32 = servers.iter().map(|s| s.attempts(0..HEDGE_CALLS)).sum();
    println!(
        "{HEDGE_CALLS} hedged calls, 4 at a time, 3 servers, one answering after 1 s, hedging \
         delay 20 ms: {slow_attempts} attempts to the slow server, {} hedges; latency p50 {:?}, \
         p99 {:?}, max {:?}",
        all_attempts - HEDGE_CALLS,
        quantile(&outcomes, 0.5),
        quantile(&outcomes, 0.99),
        quantile(&outcomes, 1.0),
    );
    assert_eq!(failures(&outcomes), 0);
    // No server saw a call twice: no hedge went where its call had already gone.
    for server in &servers {
        let repeated = server.repeated(0..HEDGE_CALLS);
        assert!(
            repeated.is_empty(),
            "{} saw calls again: {repeated:?}",
            server.addr
        );
    }
    // The slow server took first attempts, and answered none of them: a hedge to a fast
    // server answered each of those calls first (the slow one takes 1 s).
    assert!(slow_attempts > 0, "the slow server took no attempt");
    assert_eq!(
        slow.backend.answered_ok.load(Ordering::Relaxed),
        0,
        "a call waited for it"
    );
    assert!(all_attempts > HEDGE_CALLS, "no call was hedged");

    for server in servers {
        server.shutdown().await;
    }
}
