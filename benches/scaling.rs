//! How each stack scales with worker threads when every task calls a clone of one shared
//! stack (issue 29: "a healthy call writes nothing that other cores share").
//!
//! A client shares one stack among all its tasks: one policy table, one throttle, one hedge
//! budget, one latency window. Whatever a call writes there (a reference count, a lock, a
//! counter) bounces its cache line between the cores that make calls, and the rate stops
//! growing with the cores. This benchmark runs every configuration below at 1, 2, … worker
//! threads and reports, per configuration, its rate as a share of the bare service's and how
//! it scales from the fewest threads to each thread count.
//!
//! # The request shapes, their services and the configurations
//!
//! Two request shapes, each with its own in-process service below every stack of its shape.
//! Each call's request is built fresh in the calling loop, the same way for every
//! configuration of the shape, so its bare service pays for it too. Nothing fails, so
//! nothing is retried or hedged: this is the path every call takes while the server is
//! healthy.
//!
//! - **gRPC** (`grpc`, the default): a `POST /bench.Echo/Unary` with `content-type:
//!   application/grpc` and a 5-byte body (the gRPC frame of an empty message). The service
//!   spins for `work` (busy CPU, reading `std::time::Instant` until `work` has passed;
//!   nothing for 0) and answers at once with a gRPC-looking OK (`content-type:
//!   application/grpc`, `grpc-status: 0`, empty body).
//! - **HTTP** (`http`): a `POST /echo.Echo/Call` with no headers and a 64-byte static
//!   `Full<Bytes>` body, as a team retrying an HTTP API sends it (issue 45). The service
//!   spins for `work` of the calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time
//!   the thread waits for a core while another process runs is not counted as work, and
//!   answers 200 with the request's body. Linux reads that clock in a system call (the vDSO
//!   serves only the wall clocks), so most of `work` is spent entering and leaving the
//!   kernel. The gRPC shape keeps its wall-clock spin so that
//!   its figures stay comparable with those recorded before the HTTP shape came.
//!
//! Both shapes can run in the same process and rounds (`SCALING_SHAPES=grpc,http`): their
//! configurations then share the rotating order, and each configuration's ratio is to its
//! own shape's bare service in the same round.
//!
//! The gRPC shape's configurations:
//!
//! | configuration | the stack |
//! |---|---|
//! | `bare` | the service alone |
//! | `tower_retry` | `tower::retry::Retry` with the other benchmarks' policy (`benches/support`): clones the request, would retry a 5xx (none comes) |
//! | `tower_retry+tps_budget` | the same with a shared `TpsBudget::new(10 s, 10, 0.2)`: every answer deposits, a 5xx would withdraw |
//! | `retry` | `RetryLayer`, a `RetryPolicy` for the method (4 attempts, `UNAVAILABLE` retryable) |
//! | `retry+route` | `retry`'s policy on an HTTP route (`Route::prefix("/bench.Echo")`) rather than on the gRPC method: statistics and metrics are kept under the route's name |
//! | `retry+throttle` | the same with gRFC A6's throttle, `Throttle::new(10, 0.1)` |
//! | `retry+retry_budget` | the same with `RetryBudget::new(10 s, 10, 0.2)` as the throttle |
//! | `retry+adaptive_throttle` | the same with `AdaptiveThrottle::default()` (10 s, k = 2) as the throttle |
//! | `retry+metrics` | the same with gRFC A96 metrics on (an SDK meter provider whose periodic reader exports to memory once a minute: never during a run) |
//! | `hedge` | `HedgeLayer`, a `HedgePolicy` for the method (3 attempts, fixed 5 ms delay, `UNAVAILABLE` non-fatal) |
//! | `hedge+adaptive_delay` | the same with `AdaptiveDelay` at p90 (its other settings the defaults) in place of the fixed delay |
//! | `hedge+hedge_budget` | `hedge` with `HedgeBudget::default()` on the policy |
//!
//! The HTTP shape's configurations: the peers a team would pick instead of this crate, and
//! this crate's retry as such a team would set it up. Each allows 4 attempts and would retry
//! an error (none comes); only `tower::retry`'s policy would also retry a response (a 5xx).
//!
//! | configuration | the stack |
//! |---|---|
//! | `http:bare` | the service alone |
//! | `http:tower_retry` | `tower::retry::Retry` with the policy of `tower_retry` (3 retries of an error or a 5xx; clones the request) |
//! | `http:resilience_retry` | tower-resilience's `RetryLayer`: 4 attempts, exponential backoff from 100 ms, every error retried (its default); it needs `Clone` requests, so the request is wrapped in `CloneRequest` (`benches/support`) and its copies rebuilt from their parts |
//! | `http:seatbelt_retry` | seatbelt's `Retry` as a tower layer: 3 retries (4 attempts), its default backoff (exponential from 10 ms, jittered), a recovery closure that retries an `Err`, the request copied by a closure (`http::Request` is not `Clone`); its `ResilienceContext` holds a `tick::Clock::new_tokio()` |
//! | `http:retry` | `RetryLayer` with `Policies::builder().route(Route::prefix("/"), policy)`, the policy `max_attempts(4)`, `retry_non_idempotent(true)` (the call is a `POST`) and a classifier closure that makes an error retryable and every response final |
//! | `http:retry+throttle` | the same with gRFC A6's throttle, `Throttle::new(10, 0.1)` |
//!
//! The balancer (`balance::Balance`) is not measured: it is not `Clone`, so tasks can share it
//! only behind a `tower::buffer::Buffer`, which sends every call through one channel to one
//! worker task and would measure the buffer rather than the pick.
//!
//! # Method
//!
//! One process. For each thread count `W` there is one tokio multi-thread runtime with `W`
//! worker threads. A measurement builds the configuration afresh, makes one call on it (as a
//! client that hands out clones of a stack it has used; the shared state every clone reads,
//! the policy table, throttle, budgets and latency window, is the same for all), then spawns
//! `4 × W` tasks, each with its own clone of that one stack. Each task loops: `ready().await`,
//! `call(request)`, and counts its calls in a local counter; every 256 calls it yields, so
//! that all its worker's tasks take turns (as tasks waiting on the network would) and the
//! worker gets to its timers. The main thread lets them run for a warm-up (50 ms), then for
//! the measured slice (`SCALING_SLICE_MS`, 300 ms), then stops them; the phase is one atomic
//! byte that tasks only read, and the counters are summed once the tasks have ended, so the
//! measurement itself writes nothing the cores share. The rate is the calls completed in the
//! slice over its wall time.
//!
//! Measurements come in rounds (`SCALING_ROUNDS`, 5): in each round, for each `work` and each
//! `W`, every configuration is measured once, in an order that rotates by one from round to
//! round. Each round gives every configuration
//!
//! - its rate × bare: its rate ÷ the bare service's, same round, same `W`, same `work`;
//! - its CPU × bare: its calls per CPU-second (the process's CPU time over the slice) ÷ the
//!   bare service's, same round, same `W`, same `work`. On a machine that lends the run its
//!   cores it is the rate × bare; where other processes take them, a worker waiting for its
//!   core spends no CPU and makes no calls, so this ratio holds where the rate ratio scatters;
//! - its scaling from the fewest threads `W₀` (1 by default) to `W`:
//!   `rate(W) / rate(W₀) × W₀ / W`, both rates from the same round: 1 is perfect scaling,
//!   `1 / W` (with `W₀ = 1`) no gain at all. Above the cores the machine has, the best it can
//!   be is `cores / W`;
//! - its CPU efficiency from `W₀` to `W`: calls per CPU-second (the process's CPU time over
//!   the slice) at `W` ÷ at `W₀`, same round. 1 when a call costs the same CPU on `W` cores
//!   as on `W₀`. What a write shared between cores costs in cache-line transfers shows here,
//!   and cores the run was not lent do not; a thread asleep on a contended lock spends no
//!   CPU, so a lock shows in the scaling rather than here: read the two together.
//!
//! The tables give the median and interquartile range (25th–75th percentile, interpolated)
//! over the rounds, then the median rates and the CPU cores the process kept busy during the
//! slice (its CPU time, every thread, over the slice's wall time). Cores busy below `W` mean
//! the machine lent the run fewer cores than it has workers (other processes, or fewer cores
//! than threads), which bounds the scaling whatever the stack does. Workers that share fewer
//! cores also run side by side less and collide less, so such a round understates the cost
//! of shared writes in both the scaling and the CPU efficiency: under each table the run
//! counts, per `W`, the rounds in which some configuration kept fewer than 90 % of
//! `min(W, CPUs)` cores busy; only the others show the stack alone. Each round's rates and
//! cores busy go to stderr as the run goes.
//!
//! # Running it
//!
//! ```text
//! cargo bench --all-features --bench scaling
//! SCALING_THREADS=1,2,4,8,16 SCALING_WORK_US=0,5 SCALING_SLICE_MS=300 SCALING_ROUNDS=5 \
//!     cargo bench --all-features --bench scaling
//! ```
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `SCALING_THREADS` | `1,2` | worker thread counts, comma-separated; the smallest is the base of the scaling |
//! | `SCALING_WORK_US` | `0,5` | the service's busy work per call, in µs, comma-separated |
//! | `SCALING_SLICE_MS` | `300` | the measured slice of each measurement, in ms |
//! | `SCALING_ROUNDS` | `5` | rounds |
//! | `SCALING_SHAPES` | `grpc` | the request shapes, `grpc`, `http` or both, comma-separated; each shape's bare is always measured |
//! | `SCALING_CONFIGS` | all of the shapes' | the configurations to measure besides the bares, by name, comma-separated; each must be of a shape `SCALING_SHAPES` names |
//!
//! The default run (12 configurations × 2 works × 2 thread counts × 5 rounds × 0.35 s) takes
//! about 80 s.
//!
//! The one-core comparison of issue 45, both shapes in the same rounds (about 5.5 s a round):
//!
//! ```text
//! SCALING_SHAPES=grpc,http SCALING_THREADS=1 SCALING_WORK_US=5 SCALING_SLICE_MS=500 \
//!     SCALING_ROUNDS=9 \
//!     SCALING_CONFIGS=tower_retry,retry,retry+throttle,http:tower_retry,http:resilience_retry,http:seatbelt_retry,http:retry,http:retry+throttle \
//!     cargo bench --all-features --bench scaling
//! ```
//!
//! On a machine with more cores but no toolchain, build here and carry the binary:
//! `cargo bench --all-features --bench scaling --no-run` prints its path
//! (`Executable benches/scaling.rs (target/release/deps/scaling-<hash>)`); copy that file
//! over (it links the C library dynamically, so the other machine needs a glibc at least as
//! recent) and run it there, e.g. `SCALING_THREADS=1,2,4,8,16 ./scaling-<hash>`.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Body as _;
use http_body_util::Full;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use seatbelt::{RecoveryInfo, ResilienceContext};
use tokio::runtime::Runtime;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::classify::{AttemptResult, Code, GrpcCodes, Outcome};
use tower_retry_hedge::latency::AdaptiveDelay;
use tower_retry_hedge::policy::{HedgePolicyBuilder, PoliciesBuilder, Route};
use tower_retry_hedge::throttle::{AdaptiveThrottle, HedgeBudget, RetryBudget};
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy, Throttle};

// The request and response types, and the `tower::retry` policies of the other benchmarks.
mod support;
use support::clock::Clock;
use support::summary::{median_iqr, quantile};
use support::{BudgetPolicy, CloneRequest, CloningPolicy, Req, Res, clone_request};

/// The method the gRPC shape's policies name, and the path its requests go to.
const METHOD: &str = "bench.Echo/Unary";
const PATH: &str = "/bench.Echo/Unary";
/// The gRPC frame of an empty message: not compressed, length 0.
const EMPTY_MESSAGE: &[u8] = b"\x00\x00\x00\x00\x00";
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The path of the HTTP shape's requests.
const HTTP_PATH: &str = "/echo.Echo/Call";
/// The HTTP shape's request body: 64 bytes.
const HTTP_BODY: &[u8; 64] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Client tasks per worker thread.
const TASKS_PER_WORKER: usize = 4;
/// Calls a task makes before it yields to the other tasks of its worker.
const YIELD_EVERY: u32 = 256;
/// Each measurement runs this long before its slice starts.
const WARM_UP: Duration = Duration::from_millis(50);

const BALANCE_SKIPPED: &str = "`balance::Balance` is not `Clone` (it owns its endpoints): \
     tasks can share it only behind a `tower::buffer::Buffer`, which sends every call through \
     one channel to one worker task, so it would measure the buffer, not the pick";

// ---- parameters ---------------------------------------------------------------------------

/// What a run measures, from the environment.
#[derive(Debug)]
struct Params {
    /// Worker thread counts, ascending; the first is the base of the scaling.
    threads: Vec<usize>,
    /// The service's busy work per call.
    works: Vec<Duration>,
    slice: Duration,
    rounds: usize,
    /// The request shapes measured, in the order of [`SHAPES`].
    shapes: Vec<&'static str>,
    /// The configurations measured, in table order; each shape's bare always, first of its
    /// shape's.
    configs: Vec<Config>,
}

impl Params {
    fn from_env() -> Params {
        let mut threads = env_list("SCALING_THREADS", "1,2");
        threads.sort_unstable();
        threads.dedup();
        assert!(
            threads.iter().all(|&w| w > 0),
            "SCALING_THREADS: thread counts must be positive"
        );
        let works = env_list("SCALING_WORK_US", "0,5")
            .into_iter()
            .map(|us| Duration::from_micros(us as u64))
            .collect();
        let slice = Duration::from_millis(env_number("SCALING_SLICE_MS", "300") as u64);
        let rounds = env_number("SCALING_ROUNDS", "5");
        assert!(
            !slice.is_zero() && rounds > 0,
            "SCALING_SLICE_MS and SCALING_ROUNDS must be positive"
        );
        let shapes_named = std::env::var("SCALING_SHAPES").unwrap_or_else(|_| "grpc".to_string());
        let shapes_named: Vec<&str> = shapes_named.split(',').map(str::trim).collect();
        for name in &shapes_named {
            assert!(
                SHAPES.contains(name),
                "SCALING_SHAPES: no shape is named {name:?} (there are {SHAPES:?})"
            );
        }
        let shapes: Vec<&'static str> = (SHAPES.into_iter())
            .filter(|shape| shapes_named.contains(shape))
            .collect();
        let of_shapes = (Config::ALL.into_iter()).filter(|c| shapes.contains(&c.shape()));
        let configs = match std::env::var("SCALING_CONFIGS") {
            Ok(names) => {
                let names: Vec<&str> = names.split(',').map(str::trim).collect();
                for name in &names {
                    let Some(config) = Config::ALL.iter().find(|c| c.name() == *name) else {
                        panic!("SCALING_CONFIGS: no configuration is named {name:?}");
                    };
                    assert!(
                        shapes.contains(&config.shape()),
                        "SCALING_CONFIGS: {name:?} is of the {} shape, which SCALING_SHAPES \
                         does not name",
                        config.shape()
                    );
                }
                of_shapes
                    .filter(|c| c.is_bare() || names.contains(&c.name()))
                    .collect()
            }
            Err(_) => of_shapes.collect(),
        };
        Params {
            threads,
            works,
            slice,
            rounds,
            shapes,
            configs,
        }
    }
}

/// The comma-separated numbers of the environment variable `name`, or of `default`.
fn env_list(name: &str, default: &str) -> Vec<usize> {
    let value = std::env::var(name).unwrap_or_else(|_| default.to_string());
    value
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {n:?} is not a non-negative integer"))
        })
        .collect()
}

/// The one number of the environment variable `name`, or `default`.
fn env_number(name: &str, default: &str) -> usize {
    let list = env_list(name, default);
    assert!(list.len() == 1, "{name}: one number, not a list");
    list[0]
}

// ---- the request shapes and their services ------------------------------------------------

/// The request shapes, by name, in table order.
const SHAPES: [&str; 2] = [Grpc::NAME, Http::NAME];

/// What the calls of one request shape send, and the answer its service gives.
trait Shape: Copy + Send + 'static {
    /// The shape's name in `SCALING_SHAPES`.
    const NAME: &'static str;

    /// A fresh request.
    fn request(self) -> Req;

    /// Panics unless `response` is the answer of this shape's service.
    fn assert_ok(self, response: &Res);
}

/// A unary gRPC call, answered by [`Spin`].
#[derive(Debug, Clone, Copy)]
struct Grpc;

impl Shape for Grpc {
    const NAME: &'static str = "grpc";

    /// Nothing in it allocates but the header map.
    fn request(self) -> Req {
        let mut request = Request::new(Full::new(Bytes::from_static(EMPTY_MESSAGE)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(PATH);
        request
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        request
    }

    fn assert_ok(self, response: &Res) {
        assert_eq!(
            response.headers()[GRPC_STATUS],
            "0",
            "an OK through the stack"
        );
    }
}

/// An HTTP `POST` of 64 bytes, answered by [`SpinEcho`].
#[derive(Debug, Clone, Copy)]
struct Http;

impl Shape for Http {
    const NAME: &'static str = "http";

    /// Nothing in it allocates: no headers, a static URI and body.
    fn request(self) -> Req {
        let mut request = Request::new(Full::new(Bytes::from_static(HTTP_BODY)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(HTTP_PATH);
        request
    }

    fn assert_ok(self, response: &Res) {
        assert_eq!(response.status(), StatusCode::OK, "a 200 through the stack");
        assert_eq!(
            response.body().size_hint().exact(),
            Some(HTTP_BODY.len() as u64),
            "the request's body echoed"
        );
    }
}

/// Busy CPU until `work` of wall time has passed.
fn spin_wall(work: Duration) {
    let started = Instant::now();
    while started.elapsed() < work {
        std::hint::spin_loop();
    }
}

/// Busy CPU until the calling thread has run for `work`: time it waited for a core (another
/// process on a loaded machine) is not counted. Wall time where the thread clock is missing.
fn spin_thread(work: Duration) {
    let Some(started) = Clock::Thread.now() else {
        return spin_wall(work);
    };
    while Clock::Thread
        .now()
        .is_some_and(|now| now.saturating_sub(started) < work)
    {
        std::hint::spin_loop();
    }
}

/// The gRPC shape's service: spins for `work` (wall time), then answers gRPC OK (status in
/// the headers, empty body).
#[derive(Debug, Clone, Copy)]
struct Spin {
    work: Duration,
}

impl Service<Req> for Spin {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        drop(request);
        if !self.work.is_zero() {
            spin_wall(self.work);
        }
        let mut response = Response::new(Full::new(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        ready(Ok(response))
    }
}

/// The HTTP shape's service: spins for `work` of the calling thread's CPU time, then answers
/// 200 with the request's body.
#[derive(Debug, Clone, Copy)]
struct SpinEcho {
    work: Duration,
}

impl SpinEcho {
    fn answer(self, request: Req) -> Ready<Result<Res, Infallible>> {
        if !self.work.is_zero() {
            spin_thread(self.work);
        }
        ready(Ok(Response::new(request.into_body())))
    }
}

impl Service<Req> for SpinEcho {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.answer(request)
    }
}

// tower-resilience retries only `Clone` requests; see `CloneRequest`.
impl Service<CloneRequest> for SpinEcho {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: CloneRequest) -> Self::Future {
        self.answer(request.0)
    }
}

// ---- the configurations -------------------------------------------------------------------

/// The configurations, in table order; `Bare` is the gRPC shape's baseline, `HttpBare` the
/// HTTP shape's.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Config {
    Bare,
    TowerRetry,
    TowerRetryTpsBudget,
    Retry,
    RetryRoute,
    RetryThrottle,
    RetryBudget,
    RetryAdaptiveThrottle,
    RetryMetrics,
    Hedge,
    HedgeAdaptiveDelay,
    HedgeBudget,
    HttpBare,
    HttpTowerRetry,
    HttpResilienceRetry,
    HttpSeatbeltRetry,
    HttpRetry,
    HttpRetryThrottle,
}

impl Config {
    const ALL: [Config; 18] = [
        Config::Bare,
        Config::TowerRetry,
        Config::TowerRetryTpsBudget,
        Config::Retry,
        Config::RetryRoute,
        Config::RetryThrottle,
        Config::RetryBudget,
        Config::RetryAdaptiveThrottle,
        Config::RetryMetrics,
        Config::Hedge,
        Config::HedgeAdaptiveDelay,
        Config::HedgeBudget,
        Config::HttpBare,
        Config::HttpTowerRetry,
        Config::HttpResilienceRetry,
        Config::HttpSeatbeltRetry,
        Config::HttpRetry,
        Config::HttpRetryThrottle,
    ];

    fn name(self) -> &'static str {
        match self {
            Config::Bare => "bare",
            Config::TowerRetry => "tower_retry",
            Config::TowerRetryTpsBudget => "tower_retry+tps_budget",
            Config::Retry => "retry",
            Config::RetryRoute => "retry+route",
            Config::RetryThrottle => "retry+throttle",
            Config::RetryBudget => "retry+retry_budget",
            Config::RetryAdaptiveThrottle => "retry+adaptive_throttle",
            Config::RetryMetrics => "retry+metrics",
            Config::Hedge => "hedge",
            Config::HedgeAdaptiveDelay => "hedge+adaptive_delay",
            Config::HedgeBudget => "hedge+hedge_budget",
            Config::HttpBare => "http:bare",
            Config::HttpTowerRetry => "http:tower_retry",
            Config::HttpResilienceRetry => "http:resilience_retry",
            Config::HttpSeatbeltRetry => "http:seatbelt_retry",
            Config::HttpRetry => "http:retry",
            Config::HttpRetryThrottle => "http:retry+throttle",
        }
    }

    /// The name of the request shape its calls send.
    fn shape(self) -> &'static str {
        match self {
            Config::HttpBare
            | Config::HttpTowerRetry
            | Config::HttpResilienceRetry
            | Config::HttpSeatbeltRetry
            | Config::HttpRetry
            | Config::HttpRetryThrottle => Http::NAME,
            _ => Grpc::NAME,
        }
    }

    /// Whether it is its shape's baseline: the service alone.
    fn is_bare(self) -> bool {
        matches!(self, Config::Bare | Config::HttpBare)
    }

    /// Builds the configuration afresh over its shape's service with `work` and measures its
    /// rate on `runtime` with `tasks` tasks.
    fn measure(self, work: Duration, runtime: &Runtime, tasks: usize, slice: Duration) -> Sample {
        let (spin, echo) = (Spin { work }, SpinEcho { work });
        let retry = |policies: PoliciesBuilder| RetryLayer::new(policies.build()).layer(spin);
        let http_retry = |policies: PoliciesBuilder| RetryLayer::new(policies.build()).layer(echo);
        let hedge = |policy: HedgePolicyBuilder| {
            let policy = policy.build().expect("a valid hedging policy");
            HedgeLayer::new(Policies::builder().method(METHOD, policy).build()).layer(spin)
        };
        match self {
            Config::Bare => measure(runtime, spin, Grpc, tasks, slice),
            Config::TowerRetry => measure(
                runtime,
                tower::retry::Retry::new(CloningPolicy::new(3), spin),
                Grpc,
                tasks,
                slice,
            ),
            Config::TowerRetryTpsBudget => {
                let budget = TpsBudget::new(Duration::from_secs(10), 10, 0.2);
                let policy = BudgetPolicy::new(Arc::new(budget), 3);
                let service = tower::retry::Retry::new(policy, spin);
                measure(runtime, service, Grpc, tasks, slice)
            }
            Config::Retry => measure(runtime, retry(retry_policies()), Grpc, tasks, slice),
            Config::RetryRoute => {
                let policies =
                    Policies::builder().route(Route::prefix("/bench.Echo"), retry_policy());
                measure(runtime, retry(policies), Grpc, tasks, slice)
            }
            Config::RetryThrottle => {
                let throttle = Throttle::new(10, 0.1).expect("A6's example throttle");
                let service = retry(retry_policies().throttle(throttle));
                measure(runtime, service, Grpc, tasks, slice)
            }
            Config::RetryBudget => {
                let budget = RetryBudget::new(Duration::from_secs(10), 10, 0.2)
                    .expect("a valid retry budget");
                let service = retry(retry_policies().throttle(budget));
                measure(runtime, service, Grpc, tasks, slice)
            }
            Config::RetryAdaptiveThrottle => {
                let service = retry(retry_policies().throttle(AdaptiveThrottle::default()));
                measure(runtime, service, Grpc, tasks, slice)
            }
            Config::RetryMetrics => {
                let meter = meter_provider().meter("tower-retry-hedge");
                let service = retry(retry_policies().metrics(&meter));
                measure(runtime, service, Grpc, tasks, slice)
            }
            Config::Hedge => measure(runtime, hedge(hedge_policy()), Grpc, tasks, slice),
            Config::HedgeAdaptiveDelay => {
                let delay = AdaptiveDelay::builder()
                    .percentile(0.9)
                    .build()
                    .expect("a valid adaptive delay");
                let policy = HedgePolicy::builder()
                    .max_attempts(3)
                    .adaptive_delay(delay)
                    .non_fatal(GrpcCodes::from([Code::Unavailable]));
                measure(runtime, hedge(policy), Grpc, tasks, slice)
            }
            Config::HedgeBudget => {
                let policy = hedge_policy().budget(HedgeBudget::default());
                measure(runtime, hedge(policy), Grpc, tasks, slice)
            }
            Config::HttpBare => measure(runtime, echo, Http, tasks, slice),
            Config::HttpTowerRetry => {
                let service = tower::retry::Retry::new(CloningPolicy::new(3), echo);
                measure(runtime, service, Http, tasks, slice)
            }
            Config::HttpResilienceRetry => {
                // Every error is retried unless `retry_on` says otherwise.
                let layer =
                    tower_resilience::retry::RetryLayer::<CloneRequest, Res, Infallible>::builder()
                        .max_attempts(4)
                        .exponential_backoff(Duration::from_millis(100))
                        .build();
                let service =
                    (layer.layer(echo)).map_request(CloneRequest as fn(Req) -> CloneRequest);
                measure(runtime, service, Http, tasks, slice)
            }
            Config::HttpSeatbeltRetry => {
                // `Clock::new_tokio` spawns the task that drives the clock's timers.
                let clock = {
                    let _entered = runtime.enter();
                    tick::Clock::new_tokio()
                };
                let context = ResilienceContext::<Req, Result<Res, Infallible>>::new(&clock);
                let layer = seatbelt::retry::Retry::layer("retry", &context)
                    .max_retry_attempts(3)
                    .clone_input_with(|request, _| Some(clone_request(request)))
                    .recovery_with(|result, _| {
                        if result.is_ok() {
                            RecoveryInfo::never()
                        } else {
                            RecoveryInfo::retry()
                        }
                    });
                measure(runtime, layer.layer(echo), Http, tasks, slice)
            }
            Config::HttpRetry => measure(
                runtime,
                http_retry(http_retry_policies()),
                Http,
                tasks,
                slice,
            ),
            Config::HttpRetryThrottle => {
                let throttle = Throttle::new(10, 0.1).expect("A6's example throttle");
                let service = http_retry(http_retry_policies().throttle(throttle));
                measure(runtime, service, Http, tasks, slice)
            }
        }
    }
}

/// The retry policy: 4 attempts, `UNAVAILABLE` retryable.
fn retry_policy() -> RetryPolicy {
    let backoff = Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)
        .expect("a valid backoff");
    RetryPolicy::builder()
        .max_attempts(4)
        .backoff(backoff)
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .expect("a valid retry policy")
}

/// A table with the retry policy for [`METHOD`].
fn retry_policies() -> PoliciesBuilder {
    Policies::builder().method(METHOD, retry_policy())
}

/// The HTTP shape's retry policy, as a team retrying an HTTP API writes one: 4 attempts,
/// `POST` retried, errors retryable (none comes), every response final.
fn http_retry_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(4)
        .retry_non_idempotent(true)
        .retryable(|result: AttemptResult<'_>| match result {
            AttemptResult::Error(_) => Outcome::Retryable(None),
            _ => Outcome::Success,
        })
        .build()
        .expect("a valid retry policy")
}

/// A table with the HTTP retry policy for every path.
fn http_retry_policies() -> PoliciesBuilder {
    Policies::builder().route(Route::prefix("/"), http_retry_policy())
}

/// The hedging policy: 3 attempts, 5 ms apart, `UNAVAILABLE` non-fatal.
fn hedge_policy() -> HedgePolicyBuilder {
    HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::from_millis(5))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
}

/// The meter provider of `retry+metrics`, one for the process: a periodic reader exporting
/// to memory once a minute, so never during a run (a provider without a reader would hand
/// out instruments that record nothing).
fn meter_provider() -> &'static SdkMeterProvider {
    static PROVIDER: std::sync::OnceLock<SdkMeterProvider> = std::sync::OnceLock::new();
    PROVIDER.get_or_init(|| {
        let reader = PeriodicReader::builder(InMemoryMetricExporter::default())
            .with_interval(Duration::from_secs(60))
            .build();
        SdkMeterProvider::builder().with_reader(reader).build()
    })
}

// ---- measuring ----------------------------------------------------------------------------

/// The phases of a measurement, in the one atomic byte the tasks read.
const WARMING_UP: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

/// One call of `shape`: waits for the service to be ready, then calls it.
async fn call<S, Sh: Shape>(service: &mut S, shape: Sh) -> Res
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let ready = match ServiceExt::<Req>::ready(service).await {
        Ok(ready) => ready,
        Err(error) => panic!("the service is always ready: {error:?}"),
    };
    match ready.call(shape.request()).await {
        Ok(response) => response,
        Err(error) => panic!("the service never fails: {error:?}"),
    }
}

/// A client task: calls its clone until the phase is `STOPPED`, and returns how many calls
/// ended while it was `MEASURING`.
async fn client<S, Sh: Shape>(mut service: S, shape: Sh, phase: Arc<AtomicU8>) -> u64
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let (mut measured, mut since_yield) = (0u64, 0u32);
    loop {
        let response = call(&mut service, shape).await;
        drop(std::hint::black_box(response));
        match phase.load(Relaxed) {
            WARMING_UP => {}
            MEASURING => measured += 1,
            _ => return measured,
        }
        since_yield += 1;
        if since_yield == YIELD_EVERY {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
}

/// What one measurement gives.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Calls per second, all tasks together.
    rate: f64,
    /// The process's CPU time over the slice's wall time: the cores it kept busy (NaN where
    /// the clock is missing). Below the worker threads, the machine lent it fewer cores
    /// (other processes, or fewer cores than threads), which bounds the scaling.
    cores_busy: f64,
}

/// The rate of `tasks` tasks, each calling its clone of `service` with requests of `shape`,
/// over `slice` after the warm-up.
fn measure<S, Sh: Shape>(
    runtime: &Runtime,
    mut service: S,
    shape: Sh,
    tasks: usize,
    slice: Duration,
) -> Sample
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    // A stack that has answered once, as a client hands out clones of the one it uses.
    shape.assert_ok(&runtime.block_on(call(&mut service, shape)));

    let phase = Arc::new(AtomicU8::new(WARMING_UP));
    let handles: Vec<_> = (0..tasks)
        .map(|_| runtime.spawn(client(service.clone(), shape, Arc::clone(&phase))))
        .collect();
    std::thread::sleep(WARM_UP);
    phase.store(MEASURING, Relaxed);
    let (started, cpu_started) = (Instant::now(), Clock::Process.now());
    std::thread::sleep(slice);
    phase.store(STOPPED, Relaxed);
    let (elapsed, cpu) = (started.elapsed(), Clock::Process.now());
    let calls: u64 = runtime.block_on(async {
        let mut calls = 0;
        for handle in handles {
            calls += handle.await.expect("a client task");
        }
        calls
    });
    let cpu = match (cpu_started, cpu) {
        (Some(started), Some(now)) => now.saturating_sub(started).as_secs_f64(),
        _ => f64::NAN,
    };
    Sample {
        rate: calls as f64 / elapsed.as_secs_f64(),
        cores_busy: cpu / elapsed.as_secs_f64(),
    }
}

// ---- statistics and output ----------------------------------------------------------------

/// "1 thread", "4 threads".
fn threads_label(threads: usize) -> String {
    if threads == 1 {
        "1 thread".to_string()
    } else {
        format!("{threads} threads")
    }
}

/// The CPU model, from `/proc/cpuinfo` where there is one.
fn cpu_model() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

/// Prints the tables of one `work`: `samples[threads][configuration][round]`; `cpus` is the
/// number of CPUs available.
fn print_tables(params: &Params, work: Duration, samples: &[Vec<Vec<Sample>>], cpus: usize) {
    let base = params.threads[0];
    let rates: Vec<Vec<Vec<f64>>> = (samples.iter())
        .map(|configs| {
            (configs.iter())
                .map(|rounds| rounds.iter().map(|s| s.rate).collect())
                .collect()
        })
        .collect();
    // Each configuration's ratio is to the bare service of its own shape.
    let bare: Vec<usize> = (params.configs.iter())
        .map(|config| {
            (params.configs.iter())
                .position(|c| c.is_bare() && c.shape() == config.shape())
                .expect("every shape measured has its bare")
        })
        .collect();
    let ratios = |t: usize, c: usize| -> Vec<f64> {
        (rates[t][c].iter().zip(&rates[t][bare[c]]))
            .map(|(rate, bare)| rate / bare)
            .collect()
    };
    let per_cpu = |t: usize, c: usize| -> Vec<f64> {
        (samples[t][c].iter().zip(&samples[t][bare[c]]))
            .map(|(at, bare)| (at.rate / at.cores_busy) / (bare.rate / bare.cores_busy))
            .collect()
    };
    let efficiency = |t: usize, c: usize| -> Vec<f64> {
        (samples[t][c].iter().zip(&samples[0][c]))
            .map(|(at, base)| (at.rate / at.cores_busy) / (base.rate / base.cores_busy))
            .collect()
    };
    let scaling = |t: usize, c: usize| -> Vec<f64> {
        let factor = base as f64 / params.threads[t] as f64;
        (rates[t][c].iter().zip(&rates[0][c]))
            .map(|(rate, base_rate)| rate / base_rate * factor)
            .collect()
    };

    println!(
        "\n## work {} µs: rate × bare and CPU × bare (calls per CPU-second ÷ bare's; its \
         shape's bare, same round, same threads), scaling {base}→W (rate(W) / rate({base}) × \
         {base} / W, same round) and CPU efficiency {base}→W (calls per CPU-second at W ÷ at \
         {base}, same round); median (p25–p75) over {} rounds\n",
        work.as_micros(),
        params.rounds
    );
    let mut header = "| configuration |".to_string();
    let mut rule = "|---|".to_string();
    for &threads in &params.threads {
        header += &format!(" × bare, {} |", threads_label(threads));
        rule += "---:|";
    }
    for &threads in &params.threads {
        header += &format!(" CPU × bare, {} |", threads_label(threads));
        rule += "---:|";
    }
    for &threads in &params.threads[1..] {
        header += &format!(" scaling {base}→{threads} |");
        rule += "---:|";
    }
    for &threads in &params.threads[1..] {
        header += &format!(" CPU efficiency {base}→{threads} |");
        rule += "---:|";
    }
    println!("{header}\n{rule}");
    for (c, config) in params.configs.iter().enumerate() {
        let mut row = format!("| {} |", config.name());
        for t in 0..params.threads.len() {
            row += &format!(" {} |", median_iqr(&ratios(t, c)));
        }
        for t in 0..params.threads.len() {
            row += &format!(" {} |", median_iqr(&per_cpu(t, c)));
        }
        for t in 1..params.threads.len() {
            row += &format!(" {} |", median_iqr(&scaling(t, c)));
        }
        for t in 1..params.threads.len() {
            row += &format!(" {} |", median_iqr(&efficiency(t, c)));
        }
        println!("{row}");
    }

    let short: Vec<String> = (params.threads.iter().zip(samples))
        .map(|(&threads, configs)| {
            let lent = 0.9 * threads.min(cpus.max(1)) as f64;
            let short = (0..params.rounds)
                .filter(|&round| configs.iter().any(|rounds| rounds[round].cores_busy < lent))
                .count();
            format!(
                "{} of {} at {}",
                short,
                params.rounds,
                threads_label(threads)
            )
        })
        .collect();
    println!(
        "\nRounds in which some configuration kept fewer than 90 % of min(W, CPUs) cores busy \
         (the machine lent fewer cores; those rounds understate what shared writes cost): {}.",
        short.join(", ")
    );

    println!(
        "\nwork {} µs: median rate, million calls/s (all tasks together), and median CPU \
         cores the process kept busy during the slice\n",
        work.as_micros()
    );
    let mut header = "| configuration |".to_string();
    let mut rule = "|---|".to_string();
    for &threads in &params.threads {
        header += &format!(
            " M calls/s, {0} | cores busy, {0} |",
            threads_label(threads)
        );
        rule += "---:|---:|";
    }
    println!("{header}\n{rule}");
    for (c, config) in params.configs.iter().enumerate() {
        let mut row = format!("| {} |", config.name());
        for (rates, samples) in rates.iter().zip(samples) {
            let cores: Vec<f64> = samples[c].iter().map(|s| s.cores_busy).collect();
            row += &format!(
                " {:.2} | {:.2} |",
                quantile(&rates[c], 0.5) / 1e6,
                quantile(&cores, 0.5)
            );
        }
        println!("{row}");
    }
}

fn main() {
    let params = Params::from_env();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let list = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");

    println!("# Scaling: one shared stack, called from every worker thread\n");
    println!(
        "- machine: {cores} CPUs available (`available_parallelism`), {}",
        cpu_model().unwrap_or_else(|| "CPU model unknown".to_string())
    );
    println!(
        "- request shapes: {}; worker threads: {}; work per call: {} µs; {} rounds; slice {} \
         ms after {} ms warm-up; {TASKS_PER_WORKER} tasks per worker thread, each yielding \
         every {YIELD_EVERY} calls",
        params.shapes.join(","),
        list(&mut params.threads.iter().map(usize::to_string)),
        list(&mut params.works.iter().map(|w| w.as_micros().to_string())),
        params.rounds,
        params.slice.as_millis(),
        WARM_UP.as_millis(),
    );
    println!("- not measured: balance: {BALANCE_SKIPPED}");

    let runtimes: Vec<Runtime> = (params.threads.iter())
        .map(|&threads| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
                .expect("a multi-thread runtime")
        })
        .collect();

    let n = params.configs.len();
    // samples[work][threads][configuration][round]
    let mut samples = vec![
        vec![vec![Vec::with_capacity(params.rounds); n]; params.threads.len()];
        params.works.len()
    ];
    for round in 0..params.rounds {
        for (w, &work) in params.works.iter().enumerate() {
            for (t, runtime) in runtimes.iter().enumerate() {
                let threads = params.threads[t];
                let mut line = format!(
                    "round {}/{}, work {} µs, {}:",
                    round + 1,
                    params.rounds,
                    work.as_micros(),
                    threads_label(threads)
                );
                for i in 0..n {
                    let c = (round + i) % n;
                    let config = params.configs[c];
                    let sample =
                        config.measure(work, runtime, TASKS_PER_WORKER * threads, params.slice);
                    line += &format!(
                        " {} {:.2}M/s {:.2}cores",
                        config.name(),
                        sample.rate / 1e6,
                        sample.cores_busy
                    );
                    samples[w][t][c].push(sample);
                }
                eprintln!("{line}");
            }
        }
    }

    for (w, &work) in params.works.iter().enumerate() {
        print_tables(&params, work, &samples[w], cores);
    }
}
