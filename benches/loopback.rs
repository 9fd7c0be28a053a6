//! Throughput over real loopback connections, with and without the retry layer (a policy for
//! the method, no failures): what the layer costs a client that actually talks to a server.
//!
//! Two pairs. Each server runs on a thread of its own (a current-thread tokio runtime) and the
//! client on the main thread (another), as a client and a server in two processes would: with
//! one multi-thread runtime for both, the rate flipped between two modes (about 2× apart) from
//! run to run, depending on how the runtime happened to spread the tasks over its workers.
//! - hyper: an HTTP/2 echo server (`hyper::server::conn::http2`) and hyper-util's legacy
//!   client (HTTP/2 only, one connection), `http::Request<Full<Bytes>>` of 64 bytes;
//! - tonic (with `--features tonic`): the test echo service (`tests/common/pb`) and a
//!   `tonic::transport::Channel`, unary calls of 64-byte payloads.
//!
//! Each measurement sends 20 000 requests, 8 in flight (8 tasks, each calling in a loop),
//! after 1 000 warm-up requests on a fresh client and connection. Each configuration is
//! measured 5 times, alternating which one goes first; the table gives every run, the median,
//! and the ratio of the medians (with the layer / without). It also gives the process's CPU
//! time per request (client and server together), which other processes on a loaded machine
//! disturb less than the rate: the layer's cost shows there as extra CPU per request.
//!
//! ```text
//! cargo bench --bench loopback --features tonic
//! ```

use std::future::Future;
use std::net::SocketAddr;
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
use tower::{Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::HttpStatuses;
use tower_retry_hedge::policy::Route;
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy};

#[path = "support/clock.rs"]
mod clock;
use clock::Clock;

const REQUESTS: usize = 20_000;
const IN_FLIGHT: usize = 8;

/// Calls in flight: `IN_FLIGHT`, or `LOOPBACK_IN_FLIGHT` to look at latency (1) or saturation.
fn in_flight() -> usize {
    std::env::var("LOOPBACK_IN_FLIGHT")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(IN_FLIGHT)
}
const WARM_UP: usize = 1_000;
const RUNS: usize = 5;
const PAYLOAD: [u8; 64] = [b'x'; 64];

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
#[derive(Clone, Copy)]
struct Sample {
    requests_per_second: f64,
    /// Process CPU time (client and server, user and system) per request, in µs.
    cpu_us_per_request: f64,
}

/// Requests per second over `REQUESTS` calls, after a warm-up, and CPU time per request.
async fn measure<C: Caller>(caller: C) -> Sample {
    run(&caller, WARM_UP).await;
    let cpu = Clock::Process.now();
    let started = Instant::now();
    run(&caller, REQUESTS).await;
    let elapsed = started.elapsed();
    let cpu = match (cpu, Clock::Process.now()) {
        (Some(before), Some(after)) => after.saturating_sub(before).as_secs_f64(),
        _ => f64::NAN,
    };
    Sample {
        requests_per_second: REQUESTS as f64 / elapsed.as_secs_f64(),
        cpu_us_per_request: cpu * 1e6 / REQUESTS as f64,
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Measures both configurations `RUNS` times, alternating, and prints a table row for each.
async fn compare<Bare, Layered, FB, FL>(pair: &str, bare: FB, layered: FL)
where
    Bare: Caller,
    Layered: Caller,
    FB: AsyncFn() -> Bare,
    FL: AsyncFn() -> Layered,
{
    let mut without = Vec::with_capacity(RUNS);
    let mut with = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        if run % 2 == 0 {
            without.push(measure(bare().await).await);
            with.push(measure(layered().await).await);
        } else {
            with.push(measure(layered().await).await);
            without.push(measure(bare().await).await);
        }
    }
    let row = |configuration: &str, samples: &[Sample], baseline: Option<(f64, f64)>| {
        let mut rates: Vec<f64> = samples.iter().map(|s| s.requests_per_second).collect();
        let mut cpu: Vec<f64> = samples.iter().map(|s| s.cpu_us_per_request).collect();
        let runs = rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (rate, cpu) = (median(&mut rates), median(&mut cpu));
        let (rate_ratio, cpu_ratio) = baseline.map_or((1.0, 1.0), |(r, c)| (rate / r, cpu / c));
        println!(
            "| {pair} | {configuration} | {runs} | {rate:.0} | {rate_ratio:.3} | {cpu:.1} | {cpu_ratio:.3} |"
        );
        (rate, cpu)
    };
    let baseline = row("without RetryLayer", &without, None);
    row(
        "with RetryLayer (policy, no failures)",
        &with,
        Some(baseline),
    );
}

// ---- hyper -------------------------------------------------------------------------------

async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = request.into_body().collect().await?.to_bytes();
    Ok(Response::new(Full::new(body)))
}

/// Runs `serve` on a thread of its own with a current-thread runtime, and returns the address
/// of the listener it was given (127.0.0.1, port 0). The thread lives as long as the process.
fn serve_on_own_thread<F, Fut>(serve: F) -> std::io::Result<SocketAddr>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("loopback-server".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = addr_tx.send(Err(error));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match TcpListener::bind("127.0.0.1:0").await {
                    Ok(listener) => listener,
                    Err(error) => {
                        let _ = addr_tx.send(Err(error));
                        return;
                    }
                };
                let _ = addr_tx.send(listener.local_addr());
                serve(listener).await;
            });
        })?;
    addr_rx
        .recv()
        .map_err(|_| std::io::Error::other("the server thread ended before listening"))?
}

/// An HTTP/2 echo server on 127.0.0.1, on its own thread.
fn spawn_hyper_server() -> std::io::Result<SocketAddr> {
    serve_on_own_thread(|listener| async move {
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

fn http_policies() -> Policies {
    let backoff = Exponential::new(
        Duration::from_millis(10),
        Duration::from_millis(100),
        2.0,
        Jitter::None,
    )
    .expect("valid backoff");
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(backoff)
        .retryable(HttpStatuses::default())
        .retry_non_idempotent(true)
        .build()
        .expect("valid retry policy");
    Policies::builder()
        .route(Route::prefix("/"), policy)
        .build()
}

async fn hyper_pair() -> std::io::Result<()> {
    let addr = spawn_hyper_server()?;
    let uri: http::Uri = format!("http://{addr}/echo").parse().expect("valid uri");
    let policies = http_policies();
    compare(
        "hyper HTTP/2",
        async || HttpCaller {
            service: hyper_client(),
            uri: uri.clone(),
        },
        async || HttpCaller {
            service: RetryLayer::new(policies.clone()).layer(hyper_client()),
            uri: uri.clone(),
        },
    )
    .await;
    Ok(())
}

// ---- tonic -------------------------------------------------------------------------------

#[cfg(feature = "tonic")]
mod grpc {
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

    pub(super) async fn tonic_pair() -> std::io::Result<()> {
        let addr = serve_on_own_thread(|listener| async move {
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
        let policies = policies();
        compare(
            "tonic",
            async || GrpcCaller {
                client: EchoClient::new(channel(addr).await),
            },
            async || GrpcCaller {
                client: EchoClient::new(
                    RetryLayer::new(policies.clone()).layer(channel(addr).await),
                ),
            },
        )
        .await;
        Ok(())
    }
}

fn main() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!(
            "\n{REQUESTS} requests, {} in flight; client and server on a thread each; requests/s\n",
            in_flight(),
        );
        println!(
            "| pair | configuration | runs (req/s) | median req/s | ratio | median CPU µs/req | CPU ratio |"
        );
        println!("|---|---|---|---:|---:|---:|---:|");
        hyper_pair().await?;
        #[cfg(feature = "tonic")]
        grpc::tonic_pair().await?;
        #[cfg(not(feature = "tonic"))]
        println!("| tonic | skipped: build with `--features tonic` | | | | | |");
        Ok::<_, std::io::Error>(())
    })?;
    Ok(())
}
