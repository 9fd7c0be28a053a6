//! The tour of tower-retry-hedge: a tonic client that retries and hedges against a flaky
//! gRPC server, configured by the same service-config JSON a grpc-go client would take.
//!
//! ```text
//! cargo run --example demo --features opentelemetry
//! RUST_LOG=off cargo run --example demo --features opentelemetry   # only the summary lines
//! ```
//!
//! The example starts a gRPC server on 127.0.0.1 whose failures are scripted, so every run
//! tells the same story: some calls fail with `UNAVAILABLE` a few times, one gets a server
//! pushback, one is told "do not retry", one is slow on its first attempt so that a hedge
//! wins, one outlives its deadline, and the last ones fail until the retry throttle stops
//! retrying. The client makes eleven calls through one layer, which retries the methods
//! with a retry policy and hedges those with a hedging policy:
//!
//! ```text
//! EchoClient -> RetryLayer -> Probe (prints each attempt) -> tonic Channel
//! ```
//!
//! and prints, per call, each attempt as it leaves the client, the crate's own `DEBUG`
//! events (why it retried, for how long it waited), the result, the number of attempts the
//! response reports and the waits between attempts. At the end it prints the per-method
//! statistics of gRFC A6, the gRFC A96 metrics the layer recorded (read back from the
//! OpenTelemetry SDK's in-memory exporter) and what is left in the retry throttle. It
//! finishes in about two seconds.

use std::collections::HashMap;
use std::error::Error;
use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, HistogramDataPoint, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tokio::net::TcpListener;
use tokio::time::{Instant, sleep, timeout};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tower::{Service, ServiceBuilder};
use tower_retry_hedge::RetryLayer;
use tower_retry_hedge::backoff::Jitter;
use tower_retry_hedge::config::ServiceConfig;
use tower_retry_hedge::metadata::{AttemptInfo, Attempts};
use tower_retry_hedge::stats::MethodSnapshot;
use tower_retry_hedge::telemetry::RetryMetrics;
use tracing::span::Record;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::{DefaultFields, FormatFields, Writer};

/// The code generated from `tests/proto/echo.proto` (package `test.echo`): the `Echo`
/// service with `Unary` and `ServerStream` (and `ClientStream`, unused here).
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pb {
    include!("../tests/common/pb/test.echo.rs");
}

use pb::echo_client::EchoClient;
use pb::echo_server::{Echo, EchoServer};
use pb::{Chunk, Digest, EchoReply, EchoRequest};

/// The client's configuration: gRPC service-config JSON, as grpc-go or grpc-java would read
/// it. `Unary` is retried (up to 4 attempts, backoff 20 ms doubling to 200 ms, ±20 %
/// jitter), `ServerStream` is hedged (up to 3 attempts, a new one every 50 ms), and the
/// retry throttle is the one the guide recommends, `{"maxTokens": 20, "tokenRatio": 1}`: a
/// failure costs a token, a success earns one back, and retries and hedges stop while the
/// bucket is at or below half (10 failures more than successes).
const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [
    {
      "name": [{ "service": "test.echo.Echo", "method": "Unary" }],
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.02s",
        "maxBackoff": "0.2s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]
      }
    },
    {
      "name": [{ "service": "test.echo.Echo", "method": "ServerStream" }],
      "hedgingPolicy": {
        "maxAttempts": 3,
        "hedgingDelay": "0.05s",
        "nonFatalStatusCodes": ["UNAVAILABLE"]
      }
    }
  ],
  "retryThrottling": { "maxTokens": 20, "tokenRatio": 1 }
}"#;

/// What the server does with one attempt.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// Answer at once.
    Ok,
    /// Fail with this code.
    Fail(Code),
    /// Fail with this code and a `grpc-retry-pushback-ms` value.
    Pushback(Code, &'static str),
    /// Answer after this many milliseconds.
    SlowOk(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    Unary,
    ServerStream,
}

/// One call of the tour: what the server will do with each attempt, and what to expect.
struct Scenario {
    rpc: Rpc,
    story: &'static str,
    /// The server's reply to attempt 1, 2, …; past the end, `then`.
    replies: &'static [Reply],
    then: Reply,
    /// The client's deadline for the call (tonic `Request::set_timeout`).
    deadline: Option<Duration>,
}

const UNAVAILABLE: Reply = Reply::Fail(Code::Unavailable);

/// The script: the server and the client both read it, the call id is the index.
const SCENARIOS: &[Scenario] = &[
    Scenario {
        rpc: Rpc::Unary,
        story: "a healthy call: answered at once",
        replies: &[],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE twice, then answered: retried with exponential backoff",
        replies: &[UNAVAILABLE, UNAVAILABLE],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE with pushback 150 ms: the retry waits exactly that long",
        replies: &[Reply::Pushback(Code::Unavailable, "150")],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "INVALID_ARGUMENT is not retryable: returned at once",
        replies: &[Reply::Fail(Code::InvalidArgument)],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE with pushback -1: the server says do not retry",
        replies: &[Reply::Pushback(Code::Unavailable, "-1")],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "a 150 ms deadline; attempt 1 fails, attempt 2 takes 1 s: DEADLINE_EXCEEDED",
        replies: &[UNAVAILABLE, Reply::SlowOk(1000)],
        then: Reply::Ok,
        deadline: Some(Duration::from_millis(150)),
    },
    Scenario {
        rpc: Rpc::ServerStream,
        story: "hedged: attempt 1 takes 400 ms, the hedge sent at 50 ms answers first",
        replies: &[Reply::SlowOk(400)],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::ServerStream,
        story: "hedged: attempt 1 fails UNAVAILABLE (non-fatal), the next hedge goes at once",
        replies: &[UNAVAILABLE],
        then: Reply::Ok,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE every time: gives up after maxAttempts (4)",
        replies: &[],
        then: UNAVAILABLE,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE every time again: 4 more failures take the throttle to half",
        replies: &[],
        then: UNAVAILABLE,
        deadline: None,
    },
    Scenario {
        rpc: Rpc::Unary,
        story: "UNAVAILABLE again: the throttle is at half, so no retry",
        replies: &[],
        then: UNAVAILABLE,
        deadline: None,
    },
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    // The crate's per-attempt events; RUST_LOG overrides the default.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("tower_retry_hedge=debug"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::stdout().is_terminal())
        .fmt_fields(SpanFieldsAsOpened::default())
        .compact()
        .init();

    let flaky = Arc::new(FlakyEcho::default());
    let (addr, server) = start_server(Arc::clone(&flaky)).await?;
    println!("A flaky gRPC server listens on {addr}; its failures are scripted, call by call.");
    println!("The client's policies come from this gRPC service config:\n");
    for line in SERVICE_CONFIG.lines() {
        println!("    {line}");
    }
    println!(
        "\nHow to read what follows:\n\
         \x20 →      an attempt leaving the client, with the A6 headers it carries\n\
         \x20 DEBUG  the crate's own tracing events: why it retries or hedges, and the delay\n\
         \x20 ✔ / ✘  what the tonic client got, and the attempts the response reports\n"
    );

    // A safety net: an example must never hang.
    timeout(Duration::from_secs(20), run_client(addr, &flaky)).await??;

    server.abort();
    Ok(())
}

async fn run_client(
    addr: std::net::SocketAddr,
    server: &FlakyEcho,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    let config = ServiceConfig::from_json(SERVICE_CONFIG)?;
    // `config.policies()` builds the whole table, throttle included, in one line. Here the
    // throttle is taken from `retryThrottling` first, to keep a handle on it and print its
    // tokens.
    let throttle = config.throttle().ok_or("the config has retryThrottling")?;
    // gRFC A96's metrics go to an OpenTelemetry meter; an in-memory exporter keeps them for
    // the summary. The generated client sends path-only URIs, so the target is named here.
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let metrics =
        RetryMetrics::new(&provider.meter("tower-retry-hedge")).target(format!("http://{addr}"));
    let policies = config
        .policies_builder_with(Jitter::GRPC)
        .throttle(throttle.clone())
        .metrics(metrics)
        .build();

    let channel: Channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let timeline = Timeline::default();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(policies.clone()))
        .layer_fn(|inner| Probe {
            inner,
            timeline: timeline.clone(),
        })
        .service(channel);
    let mut client = EchoClient::new(svc);

    for (call, scenario) in SCENARIOS.iter().enumerate() {
        let call = u32::try_from(call)?;
        let rpc = match scenario.rpc {
            Rpc::Unary => "Unary",
            Rpc::ServerStream => "ServerStream",
        };
        println!("── call {call}: {rpc} ── {}", scenario.story);
        timeline.start();

        let mut request = tonic::Request::new(EchoRequest {
            message: format!("hello #{call}"),
            payload: Vec::new(),
            call,
        });
        if let Some(deadline) = scenario.deadline {
            request.set_timeout(deadline);
        }
        let outcome = match scenario.rpc {
            Rpc::Unary => match client.unary(request).await {
                Ok(response) => {
                    let attempts = reported_attempts(response.metadata(), response.extensions());
                    let reply = response.into_inner();
                    Ok((
                        format!(
                            "{:?} (answered by server attempt {})",
                            reply.message,
                            reply.attempt.saturating_add(1)
                        ),
                        attempts,
                    ))
                }
                Err(status) => Err(status),
            },
            Rpc::ServerStream => match client.server_stream(request).await {
                Ok(response) => {
                    let attempts = reported_attempts(response.metadata(), response.extensions());
                    let mut stream = response.into_inner();
                    let mut replies = Vec::new();
                    while let Some(reply) = stream.message().await? {
                        replies.push(reply);
                    }
                    let winner = replies.first().map_or(0, |r| r.attempt.saturating_add(1));
                    Ok((
                        format!(
                            "{} replies (streamed by server attempt {winner})",
                            replies.len()
                        ),
                        attempts,
                    ))
                }
                Err(status) => Err(status),
            },
        };

        let sent = timeline.sends();
        match outcome {
            Ok((what, attempts)) => println!("   ✔ OK: {what}; {attempts}"),
            Err(status) => {
                let previous = status
                    .metadata()
                    .get("grpc-previous-rpc-attempts")
                    .and_then(|v| v.to_str().ok())
                    .map(|n| format!(" (grpc-previous-rpc-attempts: {n})"))
                    .unwrap_or_default();
                println!(
                    "   ✘ {:?}: {:?}; {} attempt(s) sent{previous}",
                    status.code(),
                    status.message(),
                    sent.len()
                );
            }
        }
        // Attempts the client cancelled end on the server a moment later: wait for them, so
        // that the server's notice is printed with this call.
        server.settled(call).await;
        println!("   time between attempt sends: {}", waits(&sent));
        println!(
            "   throttle: {:.1} of {} tokens (retries allowed above {})\n",
            throttle.tokens(),
            throttle.max_tokens(),
            throttle.max_tokens() / 2
        );
    }

    println!("── statistics (gRFC A6: retry attempts, failed retries, k-th retry histogram)");
    let buckets: Vec<String> = MethodSnapshot::HISTOGRAM_BOUNDS
        .iter()
        .map(|b| format!(">={b}"))
        .collect();
    for (method, stats) in policies.stats().snapshot().methods {
        let histogram: Vec<String> = buckets
            .iter()
            .zip(stats.histogram)
            .filter(|(_, n)| *n > 0)
            .map(|(bucket, n)| format!("{bucket}: {n}"))
            .collect();
        println!(
            "   {method}: {} retry attempts, {} failed; histogram {{{}}}",
            stats.retry_attempts,
            stats.retry_failures,
            histogram.join(", ")
        );
    }
    println!(
        "   throttle: {:.1} of {} tokens left; replay buffers in use: {} bytes",
        throttle.tokens(),
        throttle.max_tokens(),
        policies.buffer_limits().in_use()
    );

    println!(
        "\n── metrics (gRFC A96, per call, read back from the OpenTelemetry SDK's in-memory exporter)"
    );
    provider.force_flush()?;
    for resource in exporter.get_finished_metrics()? {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics() {
                let points = match metric.data() {
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                        h.data_points().map(|p| summary(p, |v| v as f64)).collect()
                    }
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        h.data_points().map(|p| summary(p, |v| v)).collect()
                    }
                    _ => Vec::new(),
                };
                for point in points {
                    println!("   {} [{}] {point}", metric.name(), metric.unit());
                }
            }
        }
    }
    Ok(())
}

/// One histogram point: its labels, how many calls, their sum, and the buckets that hold
/// any (by upper bound).
fn summary<T: Copy>(point: &HistogramDataPoint<T>, to_f64: impl Fn(T) -> f64) -> String {
    let labels: Vec<String> = point
        .attributes()
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    let bounds: Vec<f64> = point.bounds().collect();
    let buckets: Vec<String> = point
        .bucket_counts()
        .enumerate()
        .filter(|(_, n)| *n > 0)
        .map(|(i, n)| match bounds.get(i) {
            Some(bound) => format!("<={bound}: {n}"),
            None => format!(">{}: {n}", bounds.last().copied().unwrap_or_default()),
        })
        .collect();
    format!(
        "{{{}}}: {} call(s), sum {}; buckets {{{}}}",
        labels.join(", "),
        point.count(),
        to_f64(point.sum()),
        buckets.join(", ")
    )
}

/// "3 attempts (Attempts extension), grpc-previous-rpc-attempts: 2": what a response says
/// about the attempts its call made.
fn reported_attempts(
    metadata: &tonic::metadata::MetadataMap,
    extensions: &tonic::Extensions,
) -> String {
    // The extension is there only after more than one attempt.
    let attempts = extensions.get::<Attempts>().copied().unwrap_or_default();
    let mut text = format!("{} attempt(s) sent", attempts.sent());
    if let Some(previous) = metadata
        .get("grpc-previous-rpc-attempts")
        .and_then(|v| v.to_str().ok())
    {
        let _ = write!(
            text,
            " (response metadata grpc-previous-rpc-attempts: {previous})"
        );
    }
    text
}

/// Formats span fields when a span opens, and ignores values recorded later.
///
/// The layer records `http.request.resend_count` on its span at every resend; the default
/// formatter would append each value to the span's fields (`resend_count=1 resend_count=2`).
#[derive(Default)]
struct SpanFieldsAsOpened(DefaultFields);

impl<'writer> FormatFields<'writer> for SpanFieldsAsOpened {
    fn format_fields<R: RecordFields>(
        &self,
        writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        self.0.format_fields(writer, fields)
    }

    fn add_fields(&self, _: &mut FormattedFields<Self>, _: &Record<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// "21 ms, 44 ms" from the send times of a call's attempts.
fn waits(sent: &[Duration]) -> String {
    if sent.len() < 2 {
        return "none".to_owned();
    }
    sent.windows(2)
        .map(|w| format!("{} ms", w[1].saturating_sub(w[0]).as_millis()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// When each attempt of the current call left the client, from the call's start.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<(Option<Instant>, Vec<Duration>)>>);

impl Timeline {
    fn start(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = (Some(Instant::now()), Vec::new());
    }

    /// Records a send; returns its attempt number and its time since the call started.
    fn record(&self) -> (usize, Duration) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let at = state.0.map_or(Duration::ZERO, |start| start.elapsed());
        state.1.push(at);
        (state.1.len(), at)
    }

    fn sends(&self) -> Vec<Duration> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }
}

/// Sits between the layer and the channel: prints every attempt as it is sent.
#[derive(Clone)]
struct Probe<S> {
    inner: S,
    timeline: Timeline,
}

impl<S, B> Service<http::Request<B>> for Probe<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        let (n, at) = self.timeline.record();
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| format!(", {name}: {v}"))
                .unwrap_or_default()
        };
        // Every attempt of a hedged call carries `AttemptInfo { hedge: true, .. }`; the first
        // is the original request.
        let kind = match request.extensions().get::<AttemptInfo>() {
            Some(info) if info.hedge && info.number > 1 => " (hedge)",
            _ => "",
        };
        println!(
            "   → attempt {n}{kind} sent at +{} ms{}{}",
            at.as_millis(),
            header("grpc-previous-rpc-attempts"),
            header("grpc-timeout"),
        );
        self.inner.call(request)
    }
}

// ---------------------------------------------------------------------------------------
// The flaky server.

/// The `Echo` service, answering each attempt as [`SCENARIOS`] says.
#[derive(Default)]
struct FlakyEcho {
    /// Attempts seen so far, per call.
    attempts: Mutex<HashMap<u32, u32>>,
    /// Attempts being handled now, per call.
    in_flight: Arc<Mutex<HashMap<u32, u32>>>,
}

impl FlakyEcho {
    /// Waits (up to a second) until no attempt of `call` is being handled.
    async fn settled(&self, call: u32) {
        for _ in 0..100 {
            let busy = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&call)
                .is_some_and(|n| *n > 0);
            if !busy {
                return;
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Counts the attempt and returns its number (1-based) and the scripted reply.
    fn next_reply(&self, call: u32) -> (u32, Reply) {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let n = attempts.entry(call).or_insert(0);
        *n = n.saturating_add(1);
        let reply = usize::try_from(call)
            .ok()
            .and_then(|call| SCENARIOS.get(call))
            .map_or(Reply::Ok, |s| {
                usize::try_from(n.saturating_sub(1))
                    .ok()
                    .and_then(|i| s.replies.get(i))
                    .copied()
                    .unwrap_or(s.then)
            });
        (*n, reply)
    }

    /// Plays the scripted reply to the next attempt of `call`: `Ok` with the attempt number
    /// (1-based) to answer normally, or the scripted failure.
    async fn play(&self, call: u32) -> Result<u32, Status> {
        let (attempt, reply) = self.next_reply(call);
        let guard = CancelNotice::new(call, attempt, Arc::clone(&self.in_flight));
        let result = match reply {
            Reply::Ok => Ok(attempt),
            Reply::Fail(code) => Err(Status::new(code, "scripted failure")),
            Reply::Pushback(code, ms) => {
                let mut status = Status::new(code, format!("scripted failure, pushback {ms} ms"));
                if let Ok(value) = ms.parse() {
                    status
                        .metadata_mut()
                        .insert("grpc-retry-pushback-ms", value);
                }
                Err(status)
            }
            Reply::SlowOk(ms) => {
                sleep(Duration::from_millis(ms)).await;
                Ok(attempt)
            }
        };
        guard.disarm();
        result
    }
}

/// Counts an attempt in flight, and prints a line when the client cancels it (tonic drops
/// the handler).
struct CancelNotice {
    call: u32,
    attempt: u32,
    armed: bool,
    in_flight: Arc<Mutex<HashMap<u32, u32>>>,
}

impl CancelNotice {
    fn new(call: u32, attempt: u32, in_flight: Arc<Mutex<HashMap<u32, u32>>>) -> Self {
        let mut counts = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        let n = counts.entry(call).or_insert(0);
        *n = n.saturating_add(1);
        drop(counts);
        CancelNotice {
            call,
            attempt,
            armed: true,
            in_flight,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelNotice {
    fn drop(&mut self) {
        if let Some(n) = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&self.call)
        {
            *n = n.saturating_sub(1);
        }
        if self.armed {
            println!(
                "   [server] call {} attempt {} cancelled by the client",
                self.call, self.attempt
            );
        }
    }
}

type ReplyStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<EchoReply, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for FlakyEcho {
    async fn unary(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        let request = request.into_inner();
        let attempt = self.play(request.call).await?;
        Ok(tonic::Response::new(EchoReply {
            message: request.message,
            payload: request.payload,
            attempt: attempt.saturating_sub(1),
        }))
    }

    async fn client_stream(
        &self,
        _request: tonic::Request<tonic::Streaming<Chunk>>,
    ) -> Result<tonic::Response<Digest>, Status> {
        Err(Status::unimplemented("not part of the demo"))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<ReplyStream>, Status> {
        let request = request.into_inner();
        let attempt = self.play(request.call).await?;
        let reply = EchoReply {
            message: request.message,
            payload: request.payload,
            attempt: attempt.saturating_sub(1),
        };
        let replies = vec![Ok(reply); 3];
        Ok(tonic::Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}

async fn start_server(
    service: Arc<FlakyEcho>,
) -> Result<
    (
        std::net::SocketAddr,
        tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    ),
    Box<dyn Error + Send + Sync>,
> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        Server::builder()
            .add_service(EchoServer::from_arc(service))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok((addr, server))
}
