//! Throughput and CPU per request over real loopback connections (127.0.0.1), side by side:
//! the client alone, `tower::retry` as users write it, and `RetryLayer` in the configurations
//! a user meets, all answering (no call fails, so nothing is retried). What each costs a client
//! that actually talks to a server.
//!
//! # Pairs and configurations
//!
//! Each server runs on a thread of its own (a current-thread tokio runtime) and the client on
//! the main thread (another), as a client and a server in two processes would: with one
//! multi-thread runtime for both, the rate flipped between two modes (about 2× apart) from run
//! to run, depending on how the runtime happened to spread the tasks over its workers.
//!
//! - hyper: an HTTP/2 echo server (`hyper::server::conn::http2`) and hyper-util's legacy
//!   client (HTTP/2 only, one connection), `POST /echo` of 64 bytes. Configurations:
//!   - `bare`: the client alone;
//!   - `tower_retry`: `tower::retry::Retry` with a policy that clones the request (rebuilt
//!     from its parts, as users must since `http::Request` is not `Clone`) and retries 5xx or
//!     errors up to 3 times after a `tokio::time::Sleep` (the in-memory overhead benchmark's
//!     peer, `benches/support/mod.rs`);
//!   - `tower_retry+tps_budget`: the same with a shared
//!     `tower::retry::budget::TpsBudget::new(10 s, 10, 0.2)`: successes deposit, retries
//!     withdraw;
//!   - `ours_retry_policy`: `RetryLayer` with a `RetryPolicy` for the route (`/`, 3 attempts,
//!     retryable 5xx);
//!   - `ours_retry_policy+throttle`: the same table with gRFC A6's retry throttle
//!     (`Throttle::new(10, 0.1)`, A6's maxTokens 10 and tokenRatio 0.1);
//!   - `ours_retry_no_policy`: `RetryLayer` whose table has a policy for another path
//!     (`/other`) only: the lookup misses and the call keeps a copy of its request for A6's
//!     transparent retries (on by default);
//!   - `ours_retry_no_policy_passthrough`: that table with `transparent_retries(false)`: the
//!     call passes through.
//! - tonic (with `--features tonic`): the test echo service (`tests/common/pb`) and a
//!   `tonic::transport::Channel`, unary calls of 64-byte payloads. Configurations: `bare` (the
//!   channel alone), `tower_retry+tps_budget` (the channel's request body collected into
//!   `Full<Bytes>` first, since tonic's body cannot be cloned, then the policy above), and
//!   `ours_retry_policy` (`RetryLayer` with a policy for the service, retryable UNAVAILABLE).
//! - the official gRPC crate (with `--features grpc`): the same tonic echo server, and a
//!   `grpc` 0.9 `Channel`, unary calls of the same request encoded once. Configurations:
//!   `bare` (the channel alone), `ours_retry_policy` (the channel with `RetryInterceptor`
//!   and the retry policy above) and `ours_hedge_policy` (a hedging policy whose 1 s delay
//!   never passes). `grpc` 0.9 leaves Nagle's algorithm on, so every call waits for a
//!   delayed ACK (about 44 ms): the rate is the kernel's, and the CPU per request is the
//!   figure. `LOOPBACK_GRPC_REQUESTS` (2 000 unless set) requests per measurement.
//!
//! # Method
//!
//! A measurement builds a fresh client (and connection), sends 1 000 warm-up requests, then
//! `LOOPBACK_REQUESTS` requests (20 000 unless set), 8 in flight (8 tasks, each calling in a
//! loop; `LOOPBACK_IN_FLIGHT` changes it). It records the rate (requests/s, wall time), the
//! process's CPU time per request (client and server threads, user and system), and the client
//! thread's CPU time per request (`CLOCK_THREAD_CPUTIME_ID` on the main thread, read before and
//! after).
//!
//! The client runtime is a current-thread runtime on the main thread, so everything the client
//! side does runs there and shows in the client thread's CPU: the calling tasks, the layer
//! under test, hyper-util's pool, the HTTP/2 connection task that hyper-util (through
//! `TokioExecutor`, i.e. `tokio::spawn`) or tonic (its `Buffer` worker and connection) spawn,
//! the socket system calls, and tokio's I/O and timer driver when the runtime parks. No
//! resolver thread is involved: the URIs are IP literals, which hyper-util's `HttpConnector`
//! parses without resolving. The run ends by listing the process's threads and the CPU time
//! each used (from `/proc/self/task`), which shows that only the main thread and the servers'
//! threads did any work.
//!
//! The measurements come in rounds (`LOOPBACK_ROUNDS`, 50 unless set): in each round every
//! configuration of a pair is measured once, in an order that rotates from round to round
//! (round `r` starts at configuration `r mod n`), so that no configuration always runs first
//! or right after another. Each round gives every configuration its ratios to that round's
//! `bare`: rate ÷ bare's rate and CPU per request ÷ bare's (process and client thread), which
//! cancels the machine's drift in speed (it shifts by up to 2× within a minute here) as long
//! as it is slow compared to a round (about 5 s for both pairs); a shift within a round shows
//! as a wide interquartile range, hence many rounds. The table gives, per configuration, the
//! median and interquartile range (25th–75th percentile, interpolated) of each ratio over the
//! rounds, and the median absolute rate and CPU per request. Each round's rates and process
//! CPU per request go to stderr as the run goes.
//!
//! ```text
//! cargo bench --bench loopback --features tonic
//! LOOPBACK_ROUNDS=10 LOOPBACK_REQUESTS=5000 cargo bench --bench loopback --features tonic
//! ```
//!
//! # Profiling one configuration
//!
//! `LOOPBACK_ONLY=<configuration>` (one of the hyper names above) measures that configuration
//! once (warm-up and `LOOPBACK_REQUESTS` requests) and exits, for a profiler: under
//! `valgrind --tool=callgrind --separate-threads=yes` the main thread's file holds the client
//! side's instructions. Two runs with different `LOOPBACK_REQUESTS` give instructions per call
//! without the set-up and warm-up, `(Ir(N2) − Ir(N1)) / (N2 − N1)`;
//! `benches/support/profile_loopback.sh` does that for the main configurations.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

#[path = "support/clock.rs"]
mod clock;
#[path = "support/server_thread.rs"]
mod server_thread;
#[path = "support/summary.rs"]
mod summary;
use clock::Clock;
use summary::{median_iqr, quantile};

const WARM_UP: usize = 1_000;
const PAYLOAD: [u8; 64] = [b'x'; 64];

/// A positive number from the environment variable `name`, or `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Calls in flight: 8, or `LOOPBACK_IN_FLIGHT` to look at latency (1) or saturation.
fn in_flight() -> usize {
    env_count("LOOPBACK_IN_FLIGHT", 8)
}

/// Requests per measurement, after the warm-up: 20 000, or `LOOPBACK_REQUESTS`.
fn requests() -> usize {
    env_count("LOOPBACK_REQUESTS", 20_000)
}

/// Rounds: 50, or `LOOPBACK_ROUNDS`. At 20 000 requests a round of both pairs takes about
/// 5 s here (2 cores), so the default run takes about 4 minutes, up to twice that when the
/// machine is slow. Shorter measurements for more rounds in the same time gave wider
/// interquartile ranges (5 000 requests × 75 rounds: about twice as wide as 20 000 × 25).
fn rounds() -> usize {
    env_count("LOOPBACK_ROUNDS", 50)
}

// ---- measuring ---------------------------------------------------------------------------

/// Makes one call and checks its answer.
trait Caller: Clone + Send + 'static {
    fn call_once(&mut self) -> impl Future<Output = ()> + Send;
}

/// `total` calls, `in_flight()` at a time.
async fn run<C: Caller>(caller: &C, total: usize) {
    let mut tasks = JoinSet::new();
    let in_flight = in_flight();
    for i in 0..in_flight {
        let calls = total / in_flight + usize::from(i < total % in_flight);
        let mut caller = caller.clone();
        tasks.spawn(async move {
            for _ in 0..calls {
                caller.call_once().await;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined {
            panic!("a calling task failed: {error}");
        }
    }
}

/// What one measurement gives.
#[derive(Debug, Clone, Copy)]
struct Sample {
    requests_per_second: f64,
    /// Process CPU time (client and server threads, user and system) per request, in µs.
    process_cpu_us: f64,
    /// The client thread's CPU time per request, in µs.
    thread_cpu_us: f64,
}

/// CPU time between two readings of a clock, in seconds (NaN where it is not available).
fn cpu_seconds(before: Option<Duration>, after: Option<Duration>) -> f64 {
    match (before, after) {
        (Some(before), Some(after)) => after.saturating_sub(before).as_secs_f64(),
        _ => f64::NAN,
    }
}

/// Warms `caller` up, then measures `requests` calls through it. Drops the caller (and with it
/// the client's connection) and gives the connection a moment to close, so that its teardown
/// does not fall into the next measurement.
async fn measure<C: Caller>(caller: C, requests: usize) -> Sample {
    run(&caller, WARM_UP).await;
    let process = Clock::Process.now();
    let thread = Clock::Thread.now();
    let started = Instant::now();
    run(&caller, requests).await;
    let elapsed = started.elapsed();
    let thread = cpu_seconds(thread, Clock::Thread.now());
    let process = cpu_seconds(process, Clock::Process.now());
    drop(caller);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let per_request = 1e6 / requests as f64;
    Sample {
        requests_per_second: requests as f64 / elapsed.as_secs_f64(),
        process_cpu_us: process * per_request,
        thread_cpu_us: thread * per_request,
    }
}

/// Measures every configuration of a pair once per round, in rotating order, with `measure`
/// (which gets the configuration's index in `names` and makes `requests` calls), and prints
/// the table. `names[0]` is the baseline the ratios divide by.
async fn side_by_side(
    pair: &str,
    names: &[&str],
    requests: usize,
    mut measure: impl AsyncFnMut(usize) -> Sample,
) {
    let (rounds, n) = (rounds(), names.len());
    // samples[configuration][round]
    let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        let mut line = format!("{pair} round {}/{rounds}:", round + 1);
        for i in 0..n {
            let configuration = (round + i) % n;
            let sample = measure(configuration).await;
            line += &format!(
                " {} {:.0}/s {:.1}µs",
                names[configuration], sample.requests_per_second, sample.process_cpu_us
            );
            samples[configuration].push(sample);
        }
        eprintln!("{line}");
    }

    println!(
        "\n{pair}: {rounds} rounds of {requests} requests after {WARM_UP} warm-up, {} in flight; \
         ratios to the same round's bare, median (p25–p75)\n",
        in_flight()
    );
    println!(
        "| configuration | rate × bare | CPU/request × bare, process | client-thread CPU/request × bare | median req/s | median µs CPU/request (process / client thread) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let bare = &samples[0];
    for (name, samples) in names.iter().zip(&samples) {
        let ratios = |field: fn(&Sample) -> f64| -> Vec<f64> {
            samples
                .iter()
                .zip(bare)
                .map(|(sample, bare)| field(sample) / field(bare))
                .collect()
        };
        let absolute = |field: fn(&Sample) -> f64| -> f64 {
            quantile(&samples.iter().map(field).collect::<Vec<_>>(), 0.5)
        };
        let name = if name.starts_with("ours") {
            format!("**{name}**")
        } else {
            (*name).to_string()
        };
        println!(
            "| {name} | {} | {} | {} | {:.0} | {:.1} / {:.1} |",
            median_iqr(&ratios(|s| s.requests_per_second)),
            median_iqr(&ratios(|s| s.process_cpu_us)),
            median_iqr(&ratios(|s| s.thread_cpu_us)),
            absolute(|s| s.requests_per_second),
            absolute(|s| s.process_cpu_us),
            absolute(|s| s.thread_cpu_us),
        );
    }
}

/// The process's threads with the CPU time (user and system) each has used, from
/// `/proc/self/task`: "main (client) 12.3 s, hyper-server 9.8 s". Empty where there is no `/proc`.
fn threads_cpu() -> String {
    /// Clock ticks per second of `/proc`'s times (`USER_HZ`), 100 on every Linux port.
    const TICKS_PER_SECOND: f64 = 100.0;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return String::new();
    };
    let mut threads = Vec::new();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ppid …": utime and stime are the 14th and 15th fields, the 12th
        // and 13th after the command name (which may hold spaces, hence the last ')').
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, s)| s.rsplit_once(") "))
        else {
            continue;
        };
        let ticks: f64 = rest
            .split(' ')
            .skip(11)
            .take(2)
            .filter_map(|t| t.parse::<f64>().ok())
            .sum();
        // The main thread's id is the process's; its name is the binary's.
        let name = if task.file_name().to_str() == Some(&std::process::id().to_string()) {
            "main (client)"
        } else {
            name
        };
        threads.push(format!("{name} {:.1} s", ticks / TICKS_PER_SECOND));
    }
    threads.join(", ")
}

// ---- the tower::retry peer ----------------------------------------------------------------

/// tower's retry with the policy users write for `http` requests (the overhead benchmark's
/// `CloningPolicy` and `BudgetPolicy` in one): clones the request, retries a 5xx answer or an
/// error up to `attempts_left` times after a fixed pause; with a budget, successes deposit
/// and retries withdraw.
#[derive(Clone)]
struct ClonePolicy {
    attempts_left: u32,
    budget: Option<Arc<TpsBudget>>,
}

impl ClonePolicy {
    fn new() -> ClonePolicy {
        ClonePolicy {
            attempts_left: 3,
            budget: None,
        }
    }

    /// With a fresh `TpsBudget::new(10 s, 10, 0.2)`, shared by the clones.
    fn with_budget() -> ClonePolicy {
        ClonePolicy {
            attempts_left: 3,
            budget: Some(Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2))),
        }
    }
}

impl<B, E> tower::retry::Policy<Request<Full<Bytes>>, Response<B>, E> for ClonePolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _: &mut Request<Full<Bytes>>,
        result: &mut Result<Response<B>, E>,
    ) -> Option<Self::Future> {
        let failed = match result {
            Ok(response) => response.status().is_server_error(),
            Err(_) => true,
        };
        if !failed {
            if let Some(budget) = &self.budget {
                budget.deposit();
            }
            return None;
        }
        let allowed = self.budget.as_ref().is_none_or(|budget| budget.withdraw());
        if self.attempts_left > 0 && allowed {
            self.attempts_left -= 1;
            Some(tokio::time::sleep(Duration::from_millis(100)))
        } else {
            None
        }
    }

    /// `http::Request` is not `Clone`: rebuilt from its cloned parts and a clone of the body.
    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut copy = Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

// ---- hyper -------------------------------------------------------------------------------

async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = request.into_body().collect().await?.to_bytes();
    Ok(Response::new(Full::new(body)))
}

/// Runs `serve` on a thread of its own (see `support/server_thread.rs`); the thread lives as
/// long as the process.
fn serve_on_own_thread<F, Fut>(name: &str, serve: F) -> std::io::Result<SocketAddr>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    server_thread::serve_on_own_thread(name, serve).map(|(addr, _thread)| addr)
}

/// An HTTP/2 echo server on 127.0.0.1, on its own thread.
fn spawn_hyper_server() -> std::io::Result<SocketAddr> {
    serve_on_own_thread("hyper-server", |listener| async move {
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            connections.spawn(async move {
                let service = hyper::service::service_fn(echo);
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

fn hyper_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector)
}

#[derive(Clone)]
struct HttpCaller<S> {
    service: S,
    uri: http::Uri,
}

impl<S> HttpCaller<S> {
    fn new(service: S, uri: &http::Uri) -> HttpCaller<S> {
        HttpCaller {
            service,
            uri: uri.clone(),
        }
    }
}

impl<S> Caller for HttpCaller<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
{
    async fn call_once(&mut self) {
        let mut request = Request::new(Full::new(Bytes::from_static(&PAYLOAD)));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/octet-stream"),
        );
        let response = match self.service.ready().await {
            Ok(ready) => ready.call(request).await,
            Err(error) => panic!("client not ready: {error:?}"),
        };
        let response = match response {
            Ok(response) => response,
            Err(error) => panic!("call failed: {error:?}"),
        };
        assert_eq!(response.status(), 200);
        match response.into_body().collect().await {
            Ok(body) => assert_eq!(body.to_bytes().len(), PAYLOAD.len()),
            Err(error) => panic!("response body failed: {error:?}"),
        }
    }
}

/// The route's retry policy: 3 attempts, retryable 5xx.
fn http_retry_policy() -> RetryPolicy {
    let backoff = Exponential::new(
        Duration::from_millis(10),
        Duration::from_millis(100),
        2.0,
        Jitter::None,
    )
    .expect("valid backoff");
    RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff)
        .retryable(HttpStatuses::default())
        .retry_non_idempotent(true)
        .build()
        .expect("valid retry policy")
}

/// The hyper pair's configurations, in table order (`bare` first: the ratios' baseline).
const HYPER_CONFIGURATIONS: [&str; 7] = [
    "bare",
    "tower_retry",
    "tower_retry+tps_budget",
    "ours_retry_policy",
    "ours_retry_policy+throttle",
    "ours_retry_no_policy",
    "ours_retry_no_policy_passthrough",
];

/// Measures the hyper configuration `name` (one of [`HYPER_CONFIGURATIONS`]) once, on a fresh
/// client and connection to `uri`.
async fn measure_hyper(name: &str, uri: &http::Uri, requests: usize) -> Sample {
    // Every `RetryLayer` configuration has the same type: only the table differs.
    let retry_layer =
        |policies: Policies| HttpCaller::new(RetryLayer::new(policies).layer(hyper_client()), uri);
    match name {
        "bare" => measure(HttpCaller::new(hyper_client(), uri), requests).await,
        "tower_retry" => {
            let service = tower::retry::Retry::new(ClonePolicy::new(), hyper_client());
            measure(HttpCaller::new(service, uri), requests).await
        }
        "tower_retry+tps_budget" => {
            let service = tower::retry::Retry::new(ClonePolicy::with_budget(), hyper_client());
            measure(HttpCaller::new(service, uri), requests).await
        }
        "ours_retry_policy" => {
            let policies = Policies::builder()
                .route(Route::prefix("/"), http_retry_policy())
                .build();
            measure(retry_layer(policies), requests).await
        }
        "ours_retry_policy+throttle" => {
            let policies = Policies::builder()
                .route(Route::prefix("/"), http_retry_policy())
                .throttle(Throttle::new(10, 0.1).expect("A6's default throttle"))
                .build();
            measure(retry_layer(policies), requests).await
        }
        "ours_retry_no_policy" => {
            let policies = Policies::builder()
                .route(Route::prefix("/other"), http_retry_policy())
                .build();
            measure(retry_layer(policies), requests).await
        }
        "ours_retry_no_policy_passthrough" => {
            let policies = Policies::builder()
                .route(Route::prefix("/other"), http_retry_policy())
                .transparent_retries(false)
                .build();
            measure(retry_layer(policies), requests).await
        }
        other => panic!("no hyper configuration named {other:?}; one of {HYPER_CONFIGURATIONS:?}"),
    }
}

async fn hyper_pair() -> std::io::Result<()> {
    let addr = spawn_hyper_server()?;
    let uri: http::Uri = format!("http://{addr}/echo").parse().expect("valid uri");
    let requests = requests();
    side_by_side(
        "hyper-util HTTP/2",
        &HYPER_CONFIGURATIONS,
        requests,
        async |i| measure_hyper(HYPER_CONFIGURATIONS[i], &uri, requests).await,
    )
    .await;
    Ok(())
}

// ---- tonic -------------------------------------------------------------------------------

#[cfg(feature = "tonic")]
mod grpc {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;
    use tokio_stream::StreamExt;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::transport::{Channel, Endpoint, Server};
    use tonic::{Status, Streaming};
    use tower_retry_hedge::classify::{Code, GrpcCodes};

    /// Code generated from `tests/proto/echo.proto` (package `test.echo`).
    #[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
    pub mod pb {
        include!("../tests/common/pb/test.echo.rs");
    }
    use pb::echo_client::EchoClient;
    use pb::echo_server::{Echo, EchoServer};
    use pb::{Chunk, Digest, EchoReply, EchoRequest};

    /// Answers `Unary` with the request's message and payload.
    struct Echoer;

    #[tonic::async_trait]
    impl Echo for Echoer {
        async fn unary(
            &self,
            request: tonic::Request<EchoRequest>,
        ) -> Result<tonic::Response<EchoReply>, Status> {
            let request = request.into_inner();
            Ok(tonic::Response::new(EchoReply {
                message: request.message,
                payload: request.payload,
                attempt: 0,
            }))
        }

        async fn client_stream(
            &self,
            _: tonic::Request<Streaming<Chunk>>,
        ) -> Result<tonic::Response<Digest>, Status> {
            Err(Status::unimplemented("not benchmarked"))
        }

        type ServerStreamStream = tokio_stream::Empty<Result<EchoReply, Status>>;

        async fn server_stream(
            &self,
            _: tonic::Request<EchoRequest>,
        ) -> Result<tonic::Response<Self::ServerStreamStream>, Status> {
            Err(Status::unimplemented("not benchmarked"))
        }
    }

    #[derive(Clone)]
    struct GrpcCaller<T> {
        client: EchoClient<T>,
    }

    impl<T> Caller for GrpcCaller<T>
    where
        T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
        T::Future: Send,
        T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
        <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
        T::Error: Into<tonic::codegen::StdError>,
    {
        async fn call_once(&mut self) {
            let request = EchoRequest {
                message: "hello".to_string(),
                payload: PAYLOAD.to_vec(),
                call: 0,
            };
            match self.client.unary(request).await {
                Ok(reply) => assert_eq!(reply.into_inner().payload.len(), PAYLOAD.len()),
                Err(status) => panic!("unary call failed: {status}"),
            }
        }
    }

    /// What `tower::retry` needs under tonic: tonic's request body is a stream that cannot be
    /// cloned, so this collects it into `Full<Bytes>` before the service below (boxing the
    /// future, as a user would write it).
    #[derive(Clone)]
    struct CollectBody<S> {
        inner: S,
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    impl<S, B> Service<Request<tonic::body::Body>> for CollectBody<S>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        type Response = Response<B>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
            // The service that was polled ready makes the call; `self` keeps a fresh clone.
            let clone = self.inner.clone();
            let mut ready = std::mem::replace(&mut self.inner, clone);
            Box::pin(async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                ready
                    .call(Request::from_parts(parts, Full::new(body)))
                    .await
                    .map_err(Into::into)
            })
        }
    }

    async fn channel(addr: SocketAddr) -> Channel {
        match Endpoint::from_shared(format!("http://{addr}")) {
            Ok(endpoint) => match endpoint.tcp_nodelay(true).connect().await {
                Ok(channel) => channel,
                Err(error) => panic!("cannot connect to the echo server: {error}"),
            },
            Err(error) => panic!("bad endpoint: {error}"),
        }
    }

    fn policies() -> Policies {
        let backoff = Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)
            .expect("valid backoff");
        let policy = RetryPolicy::builder()
            .max_attempts(4)
            .backoff(backoff)
            .retryable(GrpcCodes::from([Code::Unavailable]))
            .build()
            .expect("valid retry policy");
        Policies::builder()
            .service("test.echo.Echo", policy)
            .build()
    }

    /// The request `CollectBody` made, back into the channel's body type.
    fn to_tonic_body(request: Request<Full<Bytes>>) -> Request<tonic::body::Body> {
        request.map(tonic::body::Body::new)
    }

    /// The tonic pair's configurations, in table order (`bare` first).
    const CONFIGURATIONS: [&str; 3] = ["bare", "tower_retry+tps_budget", "ours_retry_policy"];

    /// Measures the tonic configuration `CONFIGURATIONS[index]` once, on a fresh channel.
    async fn measure_tonic(index: usize, addr: SocketAddr, requests: usize) -> Sample {
        match CONFIGURATIONS[index] {
            "bare" => {
                let client = EchoClient::new(channel(addr).await);
                measure(GrpcCaller { client }, requests).await
            }
            "tower_retry+tps_budget" => {
                let below = channel(addr).await.map_request(to_tonic_body as fn(_) -> _);
                let inner = tower::retry::Retry::new(ClonePolicy::with_budget(), below);
                let client = EchoClient::new(CollectBody { inner });
                measure(GrpcCaller { client }, requests).await
            }
            "ours_retry_policy" => {
                let client =
                    EchoClient::new(RetryLayer::new(policies()).layer(channel(addr).await));
                measure(GrpcCaller { client }, requests).await
            }
            other => unreachable!("{other}"),
        }
    }

    /// The official gRPC crate's channel (`grpc` 0.9), with and without the interceptor.
    #[cfg(feature = "grpc")]
    mod grpc_crate {
        use std::sync::Arc;

        use ::grpc::client::interceptor::InvokeExt as _;
        use ::grpc::client::{
            CallOptions, Channel, ChannelOptions, Invoke, RecvStream, ResponseStreamItem,
            SendOptions, SendStream,
        };
        use ::grpc::core::{RecvMessage, RequestHeaders, SendMessage};
        use ::grpc::credentials::LocalChannelCredentials;
        use bytes::Buf;
        use prost::Message as _;
        use tower_retry_hedge::HedgePolicy;
        use tower_retry_hedge::grpc_channel::RetryInterceptor;

        use super::*;

        struct Raw(Bytes);

        impl SendMessage for Raw {
            fn encode(&self) -> Result<Box<dyn Buf + Send + Sync>, String> {
                Ok(Box::new(self.0.clone()))
            }
        }

        #[derive(Default)]
        struct Reply(usize);

        impl RecvMessage for Reply {
            fn decode(&mut self, data: &mut dyn Buf) -> Result<(), String> {
                let reply = EchoReply::decode(data).map_err(|e| e.to_string())?;
                self.0 = reply.payload.len();
                Ok(())
            }
        }

        struct CrateCaller<I> {
            invoker: Arc<I>,
            request: Bytes,
        }

        impl<I> Clone for CrateCaller<I> {
            fn clone(&self) -> Self {
                CrateCaller {
                    invoker: Arc::clone(&self.invoker),
                    request: self.request.clone(),
                }
            }
        }

        impl<I: Invoke + Send + 'static> Caller for CrateCaller<I>
        where
            I::SendStream: Send,
            I::RecvStream: Send,
        {
            async fn call_once(&mut self) {
                let headers = RequestHeaders::new().with_method_name("/test.echo.Echo/Unary");
                let (mut send, mut recv) = self.invoker.invoke(headers, CallOptions::new()).await;
                let message = Raw(self.request.clone());
                let _ = send
                    .send(&message, SendOptions::new().with_final_msg(true))
                    .await;
                drop(send);
                let mut reply = Reply::default();
                loop {
                    match recv.recv(&mut reply).await {
                        ResponseStreamItem::Headers(_) | ResponseStreamItem::Message => {}
                        ResponseStreamItem::Trailers(trailers) => {
                            assert!(trailers.status().is_ok(), "{:?}", trailers.status());
                            assert_eq!(reply.0, PAYLOAD.len());
                            return;
                        }
                        ResponseStreamItem::StreamClosed => panic!("closed without a status"),
                    }
                }
            }
        }

        fn channel(addr: SocketAddr) -> Channel {
            Channel::new(
                format!("dns:///{addr}"),
                Arc::new(LocalChannelCredentials::new()),
                ChannelOptions::default(),
            )
        }

        /// A hedging policy whose delay (1 s) never passes here: the cost of being ready to
        /// hedge.
        fn hedge_policies() -> Policies {
            let policy = HedgePolicy::builder()
                .max_attempts(3)
                .delay(Duration::from_secs(1))
                .non_fatal(GrpcCodes::from([Code::Unavailable]))
                .build()
                .expect("valid hedging policy");
            Policies::builder()
                .service("test.echo.Echo", policy)
                .build()
        }

        /// The pair's configurations, in table order (`bare` first).
        const CONFIGURATIONS: [&str; 3] = ["bare", "ours_retry_policy", "ours_hedge_policy"];

        async fn measure_crate(index: usize, addr: SocketAddr, requests: usize) -> Sample {
            let request = Bytes::from(
                EchoRequest {
                    message: "hello".to_string(),
                    payload: PAYLOAD.to_vec(),
                    call: 0,
                }
                .encode_to_vec(),
            );
            let channel = channel(addr);
            match CONFIGURATIONS[index] {
                "bare" => {
                    let invoker = Arc::new(channel);
                    measure(CrateCaller { invoker, request }, requests).await
                }
                "ours_retry_policy" => {
                    let invoker =
                        Arc::new(channel.with_interceptor(RetryInterceptor::new(policies())));
                    measure(CrateCaller { invoker, request }, requests).await
                }
                "ours_hedge_policy" => {
                    let interceptor = RetryInterceptor::new(hedge_policies());
                    let invoker = Arc::new(channel.with_interceptor(interceptor));
                    measure(CrateCaller { invoker, request }, requests).await
                }
                other => unreachable!("{other}"),
            }
        }

        /// Requests per measurement for this pair: 2 000, or `LOOPBACK_GRPC_REQUESTS`.
        /// `grpc` 0.9 leaves Nagle's algorithm on (its transport options are fixed), so a
        /// call waits for delayed ACKs and this pair is far slower than the others.
        fn requests() -> usize {
            env_count("LOOPBACK_GRPC_REQUESTS", 2_000)
        }

        pub(in super::super) async fn grpc_crate_pair(addr: SocketAddr) {
            let requests = requests();
            side_by_side("grpc crate", &CONFIGURATIONS, requests, async |i| {
                measure_crate(i, addr, requests).await
            })
            .await;
        }
    }

    pub(super) async fn tonic_pair() -> std::io::Result<()> {
        let addr = serve_on_own_thread("tonic-server", |listener| async move {
            // Without TCP_NODELAY on the server's side too, Nagle's algorithm and delayed
            // ACKs would hold small responses back and measure the kernel, not the client.
            let incoming = TcpListenerStream::new(listener).map(|connection| {
                connection.and_then(|stream| {
                    stream.set_nodelay(true)?;
                    Ok(stream)
                })
            });
            let _ = Server::builder()
                .add_service(EchoServer::new(Echoer))
                .serve_with_incoming(incoming)
                .await;
        })?;
        let requests = requests();
        side_by_side("tonic", &CONFIGURATIONS, requests, async |i| {
            measure_tonic(i, addr, requests).await
        })
        .await;
        #[cfg(feature = "grpc")]
        grpc_crate::grpc_crate_pair(addr).await;
        #[cfg(not(feature = "grpc"))]
        println!("\ngrpc crate: skipped, build with `--features grpc`");
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        if let Ok(only) = std::env::var("LOOPBACK_ONLY") {
            // Profiling mode: one measurement of one hyper configuration, no rounds.
            let addr = spawn_hyper_server()?;
            let uri: http::Uri = format!("http://{addr}/echo").parse().expect("valid uri");
            let sample = measure_hyper(&only, &uri, requests()).await;
            println!(
                "{only}: {WARM_UP} warm-up + {} requests, {} in flight: {:.0} req/s, \
                 {:.1} µs CPU/request (process), {:.1} µs (client thread)",
                requests(),
                in_flight(),
                sample.requests_per_second,
                sample.process_cpu_us,
                sample.thread_cpu_us,
            );
            return Ok(());
        }
        hyper_pair().await?;
        #[cfg(feature = "tonic")]
        grpc::tonic_pair().await?;
        #[cfg(not(feature = "tonic"))]
        println!("\ntonic: skipped, build with `--features tonic`");
        println!("\nThreads and the CPU time each used: {}", threads_cpu());
        Ok::<_, std::io::Error>(())
    })?;
    Ok(())
}
