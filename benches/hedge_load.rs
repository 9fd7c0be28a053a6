//! Sustained hedging through `HedgeLayer` over a real tonic `Channel` to a real tonic server on
//! 127.0.0.1, to show whether it tears the HTTP/2 connection down.
//!
//! Every hedge that loses is dropped, and tonic (hyper, h2) resets its stream. Two of h2's
//! rapid-reset guards count such resets and answer with a GOAWAY that fails every call on the
//! connection (errors that mention `too_many_internal_resets`, `too_many_resets`,
//! `broken pipe`, `connection closed`, …):
//!
//! - the client's `max_local_error_reset_streams` (1 024 per connection lifetime): frames that
//!   arrive for a stream the client reset and has already forgotten (h2 remembers 50 reset
//!   streams, for 1 s: `Endpoint::http2_max_concurrent_reset_streams` raises the 50);
//! - the server's `max_pending_accept_reset_streams` (20): streams reset before the server
//!   accepted them (`Server::http2_max_pending_accept_reset_streams`).
//!
//! tonic reconnects by itself after a GOAWAY, so a torn-down connection shows as failed calls
//! and as more than one accepted connection per scenario.
//!
//! # Scenarios
//!
//! `handler/in_flight/budget/settings`, 36 in all:
//!
//! - handler: `unary_1_6ms` (the handler sleeps uniformly 1–6 ms, then echoes),
//!   `unary_10_40ms` (10–40 ms), `server_stream` (sleeps 1–6 ms, then streams
//!   [`STREAM_REPLIES`] replies of 64 bytes back to back; a call succeeds only once the client
//!   has read the whole stream);
//! - in flight: 1, 16 or 64 callers, each calling in a loop on a clone of one client;
//! - budget: `no_budget` (`PoliciesBuilder::hedge_budget(None)`: A6 as written) or
//!   `default_budget` (what service-config JSON gives, `HedgeBudget::default()`);
//! - settings: `stock` (tonic's `Endpoint` and `Server` defaults, TCP_NODELAY on both sides)
//!   or `recommended` ([`CLIENT_MAX_CONCURRENT_RESET_STREAMS`] on the `Endpoint`,
//!   [`SERVER_MAX_PENDING_ACCEPT_RESET_STREAMS`] on the `Server`).
//!
//! The hedging policy comes from service-config JSON, as a new user writes it: `maxAttempts`
//! 3, `hedgingDelay` 1 ms, `nonFatalStatusCodes` UNAVAILABLE, no `retryThrottling`. The
//! server never fails: this is pure tail-latency hedging, and with a 1 ms delay under a 1–6 ms
//! handler nearly every call hedges (unless the budget refuses).
//!
//! # Method
//!
//! Each scenario gets a fresh server (the test echo service's generated trait, implemented
//! here with counters) on a thread of its own with a current-thread runtime, and a fresh
//! client runtime (current-thread, on the main thread), as `benches/loopback.rs` does: one
//! shared runtime gave bimodal results there. The client is one `Channel`
//! (`Endpoint::connect()`: one HTTP/2 connection, re-established by tonic after a GOAWAY)
//! under `HedgeLayer`, under the generated client. The callers run for `HEDGE_LOAD_SECS`
//! seconds (3 unless set; fractions allowed), then start no new call; the calls in flight
//! finish (each is bounded by [`CALL_TIMEOUT`], the wait by [`DRAIN_TIMEOUT`]), the client is
//! dropped, and the server is shut down.
//!
//! The server counts accepted TCP connections, handler invocations (attempts that reached the
//! handler) and handlers dropped before they finished (hyper drops the handler when the
//! client resets the stream: a cancelled hedge; for `server_stream`, until the stream's end).
//! The client counts calls and failures by kind: the `tonic::Status` code and what its
//! message and sources mention.
//!
//! ```text
//! cargo bench --bench hedge_load --features tonic
//! HEDGE_LOAD_SECS=60 cargo bench --bench hedge_load --features tonic -- unary_1_6ms/64/default_budget/stock
//! cargo bench --bench hedge_load --features tonic -- /64/ stock   # any filter matches
//! ```
//!
//! Arguments after `--` are substring filters on the scenario name (a scenario runs when any
//! matches; none: all of them). The machine's load moves the rates; the counts of failures and
//! connections are the point.
//!
//! `HEDGE_LOAD_RESETS` sets the layers' stream resets per second
//! (`PoliciesBuilder::resets_per_second`; `none`: every loser reset at once, as gRFC A6 says;
//! unset: the crate's default). `RUST_LOG` installs a tracing subscriber on stderr, e.g.
//! `RUST_LOG=h2::codec::framed_read=debug` to see every `RST_STREAM` and `GOAWAY` frame.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Status, Streaming};
use tower::ServiceBuilder;
use tower_retry_hedge::config::PolicyOptions;
use tower_retry_hedge::{Hedge, HedgeLayer, Policies, ServiceConfig};

#[path = "support/server_thread.rs"]
mod server_thread;

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

/// `recommended`: locally reset streams the client remembers (`Endpoint::
/// http2_max_concurrent_reset_streams`; hyper's default is 50). Frames for a remembered
/// stream are ignored; for a forgotten one they count toward the 1 024 that end the
/// connection.
const CLIENT_MAX_CONCURRENT_RESET_STREAMS: usize = 4096;

/// `recommended`: streams the client may reset before the server accepted them
/// (`Server::http2_max_pending_accept_reset_streams`; h2's default is 20).
const SERVER_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1024;

/// The hedging policy every scenario uses, as a new user writes it.
const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "test.echo.Echo"}],
    "hedgingPolicy": {
      "maxAttempts": 3,
      "hedgingDelay": "0.001s",
      "nonFatalStatusCodes": ["UNAVAILABLE"]
    }
  }]
}"#;

const PAYLOAD: [u8; 64] = [b'x'; 64];
/// Replies per `server_stream` call.
const STREAM_REPLIES: usize = 8;
/// A call that takes longer fails as `client timeout`: a stuck connection cannot hang a run.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the end of a scenario waits for the calls in flight before aborting them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server waits for its connections to close after the client is gone.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Distinct failure kinds kept per scenario; any further kind is counted under `other`, so
/// that messages carrying ids cannot grow the table without bound.
const MAX_FAILURE_KINDS: usize = 24;

/// Seconds per scenario: `HEDGE_LOAD_SECS` (fractions allowed), or 3.
fn seconds() -> f64 {
    std::env::var("HEDGE_LOAD_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(3.0)
}

// ---- scenarios ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    Unary1To6ms,
    Unary10To40ms,
    ServerStream,
}

impl Handler {
    const ALL: [Handler; 3] = [
        Handler::Unary1To6ms,
        Handler::Unary10To40ms,
        Handler::ServerStream,
    ];

    fn name(self) -> &'static str {
        match self {
            Handler::Unary1To6ms => "unary_1_6ms",
            Handler::Unary10To40ms => "unary_10_40ms",
            Handler::ServerStream => "server_stream",
        }
    }

    /// The handler's sleep range, in microseconds.
    fn sleep_us(self) -> (u64, u64) {
        match self {
            Handler::Unary1To6ms | Handler::ServerStream => (1_000, 6_000),
            Handler::Unary10To40ms => (10_000, 40_000),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    None,
    Default,
}

impl Budget {
    fn name(self) -> &'static str {
        match self {
            Budget::None => "no_budget",
            Budget::Default => "default_budget",
        }
    }

    fn policies(self) -> Policies {
        let config = match ServiceConfig::from_json(SERVICE_CONFIG) {
            Ok(config) => config,
            Err(error) => panic!("the bench's service config does not parse: {error}"),
        };
        let mut builder = config.policies_builder_with(PolicyOptions::new());
        if self == Budget::None {
            builder = builder.hedge_budget(None);
        }
        // `HEDGE_LOAD_RESETS`: the layer's stream resets per second (`none`: no limit, every
        // loser reset at once, as A6 says); the crate's default otherwise.
        match std::env::var("HEDGE_LOAD_RESETS").as_deref() {
            Ok("none") => builder = builder.resets_per_second(None),
            Ok(limit) => match limit.parse() {
                Ok(limit) => builder = builder.resets_per_second(Some(limit)),
                Err(_) => panic!("HEDGE_LOAD_RESETS must be `none` or a number: {limit:?}"),
            },
            Err(_) => {}
        }
        builder.build()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settings {
    Stock,
    Recommended,
}

impl Settings {
    fn name(self) -> &'static str {
        match self {
            Settings::Stock => "stock",
            Settings::Recommended => "recommended",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    handler: Handler,
    in_flight: usize,
    budget: Budget,
    settings: Settings,
}

impl Scenario {
    fn all() -> Vec<Scenario> {
        let mut all = Vec::new();
        for handler in Handler::ALL {
            for in_flight in [1, 16, 64] {
                for budget in [Budget::None, Budget::Default] {
                    for settings in [Settings::Stock, Settings::Recommended] {
                        all.push(Scenario {
                            handler,
                            in_flight,
                            budget,
                            settings,
                        });
                    }
                }
            }
        }
        all
    }

    fn name(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.handler.name(),
            self.in_flight,
            self.budget.name(),
            self.settings.name()
        )
    }
}

// ---- the server --------------------------------------------------------------------------

#[derive(Default)]
struct ServerCounts {
    connections: AtomicU64,
    invocations: AtomicU64,
    cancelled: AtomicU64,
}

/// Counts the handler as cancelled when dropped before `finish`.
struct HandlerGuard {
    counts: Arc<ServerCounts>,
    finished: bool,
}

impl HandlerGuard {
    fn new(counts: &Arc<ServerCounts>) -> HandlerGuard {
        counts.invocations.fetch_add(1, Ordering::Relaxed);
        HandlerGuard {
            counts: Arc::clone(counts),
            finished: false,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for HandlerGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.counts.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The echo service with counters: sleeps within the handler's range, then answers.
struct Echoer {
    handler: Handler,
    counts: Arc<ServerCounts>,
}

impl Echoer {
    async fn sleep(&self) {
        let (low, high) = self.handler.sleep_us();
        let us = rand::rng().random_range(low..=high);
        tokio::time::sleep(Duration::from_micros(us)).await;
    }
}

/// `STREAM_REPLIES` replies, back to back; the handler counts as finished at the stream's end.
struct Replies {
    left: usize,
    guard: HandlerGuard,
}

impl tokio_stream::Stream for Replies {
    type Item = Result<EchoReply, Status>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.left == 0 {
            this.guard.finish();
            return Poll::Ready(None);
        }
        this.left -= 1;
        Poll::Ready(Some(Ok(EchoReply {
            message: String::new(),
            payload: PAYLOAD.to_vec(),
            attempt: 0,
        })))
    }
}

#[tonic::async_trait]
impl Echo for Echoer {
    async fn unary(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, Status> {
        let mut guard = HandlerGuard::new(&self.counts);
        self.sleep().await;
        let request = request.into_inner();
        guard.finish();
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

    type ServerStreamStream = Replies;

    async fn server_stream(
        &self,
        _: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<Replies>, Status> {
        let guard = HandlerGuard::new(&self.counts);
        self.sleep().await;
        Ok(tonic::Response::new(Replies {
            left: STREAM_REPLIES,
            guard,
        }))
    }
}

/// A server running on a thread of its own.
struct ServerHandle {
    addr: SocketAddr,
    counts: Arc<ServerCounts>,
    shutdown: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl ServerHandle {
    /// Starts the server for `scenario` on 127.0.0.1 (port 0), on a thread with a
    /// current-thread runtime.
    fn start(scenario: &Scenario) -> std::io::Result<ServerHandle> {
        let counts = Arc::new(ServerCounts::default());
        let (shutdown, signal) = watch::channel(false);
        let handler = scenario.handler;
        let settings = scenario.settings;
        let server_counts = Arc::clone(&counts);
        let serve = move |listener| serve(listener, handler, settings, server_counts, signal);
        let (addr, thread) = server_thread::serve_on_own_thread("hedge-load-server", serve)?;
        Ok(ServerHandle {
            addr,
            counts,
            shutdown,
            thread,
        })
    }

    /// Shuts the server down: at once once its connections are closed, else after
    /// `SHUTDOWN_GRACE`.
    fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.thread.join();
    }
}

async fn serve(
    listener: TcpListener,
    handler: Handler,
    settings: Settings,
    counts: Arc<ServerCounts>,
    signal: watch::Receiver<bool>,
) {
    let accepted = Arc::clone(&counts);
    // TCP_NODELAY on the server's side too, else Nagle's algorithm and delayed ACKs hold
    // small responses back. `Server::tcp_nodelay` applies only to the listener `serve` makes.
    let incoming = TcpListenerStream::new(listener).map(move |connection| {
        connection.and_then(|stream| {
            accepted.connections.fetch_add(1, Ordering::Relaxed);
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    });
    let mut builder = match settings {
        Settings::Stock => Server::builder(),
        Settings::Recommended => Server::builder()
            .http2_max_pending_accept_reset_streams(Some(SERVER_MAX_PENDING_ACCEPT_RESET_STREAMS)),
    };
    let mut stopping = signal.clone();
    let shutdown = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let server = builder
        .add_service(EchoServer::new(Echoer { handler, counts }))
        .serve_with_incoming_shutdown(incoming, shutdown);
    let mut stopping = signal;
    let grace = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = server => {}
        () = grace => {}
    }
}

// ---- the client --------------------------------------------------------------------------

type Client = EchoClient<Hedge<Channel>>;

/// What the callers saw.
#[derive(Default)]
struct ClientCounts {
    calls: AtomicU64,
    failed: AtomicU64,
    /// Failures by kind, at most `MAX_FAILURE_KINDS` kinds.
    kinds: Mutex<BTreeMap<String, u64>>,
}

impl ClientCounts {
    fn fail(&self, kind: String, count: u64) {
        self.calls.fetch_add(count, Ordering::Relaxed);
        self.failed.fetch_add(count, Ordering::Relaxed);
        let mut kinds = match self.kinds.lock() {
            Ok(kinds) => kinds,
            Err(poisoned) => poisoned.into_inner(),
        };
        let kind = if kinds.contains_key(&kind) || kinds.len() < MAX_FAILURE_KINDS {
            kind
        } else {
            "other".to_string()
        };
        *kinds.entry(kind).or_default() += count;
    }
}

/// A failure's kind: the status code, and which of the connection errors its message (or the
/// errors under it) mentions, else the message's first 60 characters.
fn failure_kind(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(" | ");
        text.push_str(&error.to_string());
        source = error.source();
    }
    let text = text.to_lowercase();
    let known = [
        ("too_many_internal_resets", "too_many_internal_resets"),
        ("too_many_resets", "too_many_resets"),
        ("broken pipe", "broken pipe"),
        ("connection closed", "connection closed"),
        ("connection reset", "connection reset"),
        ("goaway", "go away"),
        ("go away", "go away"),
    ];
    let class = match known.iter().find(|(needle, _)| text.contains(needle)) {
        Some((_, class)) => (*class).to_string(),
        None => {
            let message: String = status.message().chars().take(60).collect();
            if message.is_empty() {
                "(no message)".to_string()
            } else {
                message
            }
        }
    };
    format!("{:?}: {class}", status.code())
}

fn request() -> EchoRequest {
    EchoRequest {
        message: "hedge".to_string(),
        payload: PAYLOAD.to_vec(),
        call: 0,
    }
}

/// One call, with its answer read to the end and checked.
async fn call_once(client: &mut Client, handler: Handler) -> Result<(), String> {
    match handler {
        Handler::Unary1To6ms | Handler::Unary10To40ms => {
            let reply = client
                .unary(request())
                .await
                .map_err(|s| failure_kind(&s))?;
            if reply.get_ref().payload.len() == PAYLOAD.len() {
                Ok(())
            } else {
                Err("wrong reply".to_string())
            }
        }
        Handler::ServerStream => {
            let mut stream = client
                .server_stream(request())
                .await
                .map_err(|s| failure_kind(&s))?
                .into_inner();
            let mut replies = 0;
            while let Some(reply) = stream.message().await.map_err(|s| failure_kind(&s))? {
                if reply.payload.len() != PAYLOAD.len() {
                    return Err("wrong reply".to_string());
                }
                replies += 1;
            }
            if replies == STREAM_REPLIES {
                Ok(())
            } else {
                Err(format!("stream of {replies} replies"))
            }
        }
    }
}

/// Calls one after another until `stop`.
async fn caller(
    mut client: Client,
    handler: Handler,
    stop: Arc<AtomicBool>,
    counts: Arc<ClientCounts>,
) {
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(CALL_TIMEOUT, call_once(&mut client, handler)).await {
            Ok(Ok(())) => {
                counts.calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(kind)) => counts.fail(kind, 1),
            Err(_) => counts.fail(format!("client timeout ({} s)", CALL_TIMEOUT.as_secs()), 1),
        }
    }
}

/// What a scenario gives.
struct Outcome {
    seconds: f64,
    calls: u64,
    failed: u64,
    connections: u64,
    invocations: u64,
    cancelled: u64,
    kinds: BTreeMap<String, u64>,
    /// The layer's own statistics: losers let finish, resets past its limit.
    let_finish: u64,
    over_limit: u64,
}

/// Runs the callers against `addr` for `seconds`, then drains them; the client is gone when
/// this returns.
async fn drive(
    scenario: &Scenario,
    addr: SocketAddr,
    seconds: f64,
) -> Result<(f64, Arc<ClientCounts>, Policies), String> {
    let mut endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad endpoint: {e}"))?
        .tcp_nodelay(true);
    if scenario.settings == Settings::Recommended {
        endpoint = endpoint.http2_max_concurrent_reset_streams(CLIENT_MAX_CONCURRENT_RESET_STREAMS);
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let policies = scenario.budget.policies();
    let service = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .service(channel);
    let client = EchoClient::new(service);

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(ClientCounts::default());
    let started = Instant::now();
    let mut callers = JoinSet::new();
    for _ in 0..scenario.in_flight {
        callers.spawn(caller(
            client.clone(),
            scenario.handler,
            Arc::clone(&stop),
            Arc::clone(&counts),
        ));
    }
    drop(client);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while callers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        let left = callers.len() as u64;
        callers.abort_all();
        while callers.join_next().await.is_some() {}
        counts.fail("still in flight at the end (aborted)".to_string(), left);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The last clone of the channel is gone with the callers: let its connection task see it
    // and close the connection, so that the server has seen every reset when it is read.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok((elapsed, counts, policies))
}

fn run(scenario: &Scenario, seconds: f64) -> Result<Outcome, String> {
    let server = ServerHandle::start(scenario).map_err(|e| format!("server: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("client runtime: {e}"))?;
    let driven = runtime.block_on(drive(scenario, server.addr, seconds));
    runtime.shutdown_timeout(Duration::from_secs(1));
    let counts = Arc::clone(&server.counts);
    server.stop();
    let (seconds, client, policies) = driven?;
    let stats = policies.stats().snapshot();
    let sum = |field: fn(&tower_retry_hedge::stats::MethodSnapshot) -> u64| {
        stats.methods.values().map(field).sum::<u64>()
    };
    let kinds = match client.kinds.lock() {
        Ok(kinds) => kinds.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    Ok(Outcome {
        seconds,
        calls: client.calls.load(Ordering::Relaxed),
        failed: client.failed.load(Ordering::Relaxed),
        connections: counts.connections.load(Ordering::Relaxed),
        invocations: counts.invocations.load(Ordering::Relaxed),
        cancelled: counts.cancelled.load(Ordering::Relaxed),
        kinds,
        let_finish: sum(|m| m.attempts_let_finish),
        over_limit: sum(|m| m.resets_over_limit),
    })
}

// ---- the table ---------------------------------------------------------------------------

const NAME_WIDTH: usize = 44;

fn print_legend(seconds: f64) {
    println!(
        "hedge_load: {seconds} s per scenario; hedging policy from service-config JSON: \
         maxAttempts 3, hedgingDelay 1 ms, nonFatalStatusCodes [UNAVAILABLE], no throttle"
    );
    println!(
        "recommended = client http2_max_concurrent_reset_streams({CLIENT_MAX_CONCURRENT_RESET_STREAMS}), \
         server http2_max_pending_accept_reset_streams(Some({SERVER_MAX_PENDING_ACCEPT_RESET_STREAMS}))"
    );
    println!("columns:");
    println!("  scenario     handler/callers in flight/hedge budget/HTTP/2 settings");
    println!("  secs         wall time from the first call to the last call's end");
    println!("  calls        calls finished (succeeded or failed)");
    println!("  calls/s      calls / secs");
    println!("  failed       calls that failed");
    println!("  conns        TCP connections the server accepted (1: never torn down)");
    println!("  att/call     attempts that reached the server's handler / calls");
    println!("  cancels/s    handlers dropped before finishing (hedges cancelled) / secs");
    println!("  finish/s     losers the layer let finish instead of resetting them / secs");
    println!("  over         losers reset past the layer's limit (none could be let finish)");
    println!("  failures     failed calls by status code and kind of error, or -");
    println!();
    println!(
        "{:<NAME_WIDTH$} {:>6} {:>8} {:>8} {:>7} {:>6} {:>8} {:>9} {:>8} {:>5}  failures",
        "scenario",
        "secs",
        "calls",
        "calls/s",
        "failed",
        "conns",
        "att/call",
        "cancels/s",
        "finish/s",
        "over"
    );
}

fn print_row(name: &str, outcome: &Outcome) {
    let per_call = if outcome.calls == 0 {
        f64::NAN
    } else {
        outcome.invocations as f64 / outcome.calls as f64
    };
    let failures = if outcome.kinds.is_empty() {
        "-".to_string()
    } else {
        outcome
            .kinds
            .iter()
            .map(|(kind, count)| format!("{count}× {kind}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    println!(
        "{name:<NAME_WIDTH$} {:>6.1} {:>8} {:>8.0} {:>7} {:>6} {:>8.2} {:>9.0} {:>8.0} {:>5}  {failures}",
        outcome.seconds,
        outcome.calls,
        outcome.calls as f64 / outcome.seconds,
        outcome.failed,
        outcome.connections,
        per_call,
        outcome.cancelled as f64 / outcome.seconds,
        outcome.let_finish as f64 / outcome.seconds,
        outcome.over_limit,
    );
}

fn main() {
    if std::env::var("RUST_LOG").is_ok() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_thread_names(true)
            .init();
    }
    // `cargo bench` passes `--bench`; every other argument is a filter.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let scenarios: Vec<Scenario> = Scenario::all()
        .into_iter()
        .filter(|s| filters.is_empty() || filters.iter().any(|f| s.name().contains(f.as_str())))
        .collect();
    if scenarios.is_empty() {
        println!("hedge_load: no scenario matches {filters:?}");
        return;
    }
    let seconds = seconds();
    print_legend(seconds);
    for scenario in &scenarios {
        let name = scenario.name();
        match run(scenario, seconds) {
            Ok(outcome) => print_row(&name, &outcome),
            Err(error) => println!("{name:<NAME_WIDTH$} did not run: {error}"),
        }
    }
}
