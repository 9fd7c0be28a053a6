//! Several backends: what sending each attempt of a call to a backend the call has not tried
//! buys, for hedges and for retries, and what outlier detection adds when a backend is dead.
//!
//! Three backends answer after 1 ms ± 20 % (uniform). Calls arrive at 1000/s (one every
//! millisecond, open loop) on tokio's paused clock, with seeded generators, and go through:
//!
//! - `random`: tower's `p2c::Balance` over endpoints that all report load 0, which is what
//!   tonic's `Channel::balance_list` builds: every attempt is a uniform pick;
//! - `ours, no record`: this crate's `balance::Balance` over endpoints whose load is their
//!   requests in flight (tower's `PendingRequests`), without the call's `TriedBackends` and
//!   without outlier detection: power of two choices on load, as tower's balancer does;
//! - `ours, record only`: the same with the record (`track_backends(true)`), each attempt
//!   going to a backend its call has not tried, and still no outlier detection: the balancer
//!   as it was before it learned of failures (retry run only);
//! - `ours`: the balancer as it comes, with the record and its default outlier detection.
//!
//! Two runs:
//!
//! - hedge: backend `c` is slow (100 ms) during 1 % of the 10 ms time windows, drawn once per
//!   window (per-backend slowness: every request it gets in such a window is slow); the hedge
//!   layer sends a hedge after 2 ms, `maxAttempts` 2 and 3. Printed: p50, p99, p99.9, p99.99
//!   and max latency, and the extra requests the backends received. `bare` rows are the
//!   balancers without hedging.
//! - retry: backend `c` answers every attempt with UNAVAILABLE after 0.2 ms; the retry layer
//!   allows 3 attempts (gRFC A6's example backoff, 0.1 s × 2 up to 1 s, ±20 %), without a
//!   throttle and with gRFC A6's example throttle `{10, 0.1}`. Printed: failed calls per
//!   10 000, attempts per call, and the share of first attempts that reached `c`.
//!
//! With `--ablation` it runs instead what each piece of the outlier detection buys: backend
//! `c` dead (UNAVAILABLE, under the retry run's layer, without and with the throttle), gone
//! away (1 ms ± 20 % until 2.5 s, then every connection refused after 0.2 ms, the same
//! layer), and slow (the hedge run's windows, a hedge after 2 ms, 2 attempts), each over the
//! balancer with the record and: no outlier detection; (a) gRFC A50's algorithms as the
//! defaults set them, alone; (b) with the run of consecutive failures that ejects at once;
//! (c) with recent failures weighing the pick too (the defaults). Printed: failed calls, the
//! attempts `c` answered badly (an error status, a refused connection, a slow answer), p99
//! and p99.9 latency.
//!
//! As in `hedge_tail`, the paused clock runs 10 times faster than the model by default
//! (`--scale 10`), so that tokio's whole-millisecond timers keep a 0.1 ms resolution; every
//! figure is in model time.
//!
//! With `--loopback` (and `--features tonic-transport`) it runs real tonic servers on
//! 127.0.0.1 instead: three, one answering every call UNAVAILABLE, behind tonic's
//! `Channel::balance_list` and `balance::BalancedChannel`, under the retry layer (3 attempts,
//! the README's quick-start backoff and gRFC A6's example throttle `{10, 0.1}`); 2 000
//! calls, 16 at a time, a few runs of each. Printed per balancer: failed calls, those among
//! the first 100, and the share of first attempts (requests without
//! `grpc-previous-rpc-attempts`) that reached the dead server, in all and from call 200 on;
//! medians and ranges over the runs.
//!
//! ```text
//! cargo run --release --features balance --example several_backends -- \
//!     [--ablation] [--hedge-calls N] [--retry-calls N] [--seed N] [--scale N]
//! cargo run --release --features tonic-transport --example several_backends -- \
//!     --loopback [--loopback-calls N] [--concurrency N] [--runs N]
//! ```

#[path = "support/common.rs"]
mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio::time::{Instant, MissedTickBehavior};
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, Constant, PendingRequests};
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::Exponential;
use tower_retry_hedge::balance::{Balance, OutlierDetection, ResponseBody};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::policy::PoliciesBuilder;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy, Throttle};

use common::{Cli, Req, Res, SERVICE, Seeded, grpc_request, paused_runtime, print_table, quantile};

const FAST_MS: f64 = 1.0;
const FAST_JITTER: f64 = 0.2;
const SLOW_MS: f64 = 100.0;
const WINDOW_MS: f64 = 10.0;
const SLOW_WINDOW_SHARE: f64 = 0.01;
const DEAD_MS: f64 = 0.2;
const ARRIVAL_MS: f64 = 1.0;
const HEDGE_DELAY_MS: f64 = 2.0;
/// Requests the buffer in front of a balancer holds.
const BUFFER: usize = 1024;

/// Converts between model time and the paused clock, which runs `scale` times faster.
#[derive(Debug, Clone, Copy)]
struct Scale(u32);

impl Scale {
    fn clock(self, model_ms: f64) -> Duration {
        Duration::from_secs_f64(model_ms * f64::from(self.0) / 1000.0)
    }

    fn model_ms(self, clock: Duration) -> f64 {
        clock.as_secs_f64() * 1000.0 / f64::from(self.0)
    }
}

/// How a backend answers.
#[derive(Clone)]
enum Behaviour {
    /// 1 ms ± 20 %.
    Fast,
    /// 100 ms in the windows marked slow, from `start`; 1 ms ± 20 % otherwise.
    SlowIn {
        windows: Arc<Vec<bool>>,
        start: Instant,
    },
    /// UNAVAILABLE after 0.2 ms.
    Dead,
    /// 1 ms ± 20 % until `at`; from then on, a refused connection after 0.2 ms (the error
    /// `ConnectionRefused`, which the crate's classifiers read as an attempt never sent).
    GoneAt { at: Instant },
}

/// A simulated backend: a hand-written service that answers after a sleep, drawn from a
/// seeded generator, and counts the requests it receives.
#[derive(Clone)]
struct Backend {
    behaviour: Behaviour,
    rng: Arc<Mutex<SmallRng>>,
    requests: Arc<AtomicU64>,
    /// Requests without `grpc-previous-rpc-attempts`: first attempts.
    first: Arc<AtomicU64>,
    /// Requests answered badly: with an error status, a refused connection, or slowly.
    bad: Arc<AtomicU64>,
    scale: Scale,
}

impl Backend {
    fn new(behaviour: Behaviour, seed: u64, scale: Scale) -> Self {
        Backend {
            behaviour,
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
            requests: Arc::new(AtomicU64::new(0)),
            first: Arc::new(AtomicU64::new(0)),
            bad: Arc::new(AtomicU64::new(0)),
            scale,
        }
    }

    fn fast(&self) -> f64 {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        FAST_MS * rng.random_range(1.0 - FAST_JITTER..=1.0 + FAST_JITTER)
    }

    /// The answer's latency in model milliseconds and its gRPC status; `None` for a refused
    /// connection.
    fn answer(&self) -> (f64, Option<u8>) {
        let (latency, status) = match &self.behaviour {
            Behaviour::Fast => (self.fast(), 0),
            Behaviour::SlowIn { windows, start } => {
                let window = (self.scale.model_ms(start.elapsed()) / WINDOW_MS) as usize;
                if windows.get(window).copied().unwrap_or(false) {
                    (SLOW_MS, 0)
                } else {
                    (self.fast(), 0)
                }
            }
            Behaviour::Dead => (DEAD_MS, Code::Unavailable as u8),
            Behaviour::GoneAt { at } if Instant::now() >= *at => return (DEAD_MS, None),
            Behaviour::GoneAt { .. } => (self.fast(), 0),
        };
        (latency, Some(status))
    }
}

impl Service<Req> for Backend {
    type Response = Res;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !request.headers().contains_key("grpc-previous-rpc-attempts") {
            self.first.fetch_add(1, Ordering::Relaxed);
        }
        let (model_ms, status) = self.answer();
        if status != Some(0) || model_ms >= SLOW_MS {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        let latency = self.scale.clock(model_ms);
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            match status {
                Some(status) => Ok(common::trailers_only(status)),
                None => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()),
            }
        })
    }
}

/// tower's balancer draws from its own generator trait; this one is seeded.
struct SeededRng(SmallRng);

impl tower::util::rng::Rng for SeededRng {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Balancer {
    Random,
    OursNoRecord,
    OursRecordOnly,
    Ours,
    /// Ours, with the record and this much of the outlier detection (the ablation).
    Ablated(Detection),
}

/// How much of the balancer's outlier detection runs, piece by piece (the ablation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detection {
    /// None at all (`OutlierDetection::disabled()`).
    Off,
    /// gRFC A50's algorithms as the defaults set them (failure percentage 85 %, 3 hosts, 10
    /// answers, each 1 s; success rate off), and nothing else.
    A50,
    /// And the run of 5 consecutive failures that ejects at once.
    A50Trip,
    /// And recent failures weighing the pick (with their 2 s half-life, and the probation
    /// of a backend back from an ejection): the defaults.
    A50TripWeighted,
}

impl Detection {
    const ALL: [Detection; 4] = [
        Detection::Off,
        Detection::A50,
        Detection::A50Trip,
        Detection::A50TripWeighted,
    ];

    fn name(self) -> &'static str {
        match self {
            Detection::Off => "none",
            Detection::A50 => "(a) A50 alone",
            Detection::A50Trip => "(b) (a) + consecutive-failure trip",
            Detection::A50TripWeighted => "(c) (b) + failure-weighted pick",
        }
    }

    /// These settings in model time: the detection runs on the paused clock, `scale` times
    /// faster.
    fn settings(self, scale: Scale) -> OutlierDetection {
        let defaults = OutlierDetection::default();
        let builder = match self {
            Detection::Off => return OutlierDetection::disabled(),
            Detection::A50 => defaults
                .to_builder()
                .consecutive_failures(None)
                .weigh_failures(false),
            Detection::A50Trip => defaults.to_builder().weigh_failures(false),
            Detection::A50TripWeighted => defaults.to_builder(),
        };
        let model = |duration: Duration| scale.clock(duration.as_secs_f64() * 1000.0);
        builder
            .interval(model(defaults.interval()))
            .base_ejection_time(model(defaults.base_ejection_time()))
            .max_ejection_time(model(defaults.max_ejection_time()))
            .failure_half_life(model(defaults.failure_half_life()))
            .build()
            .expect("the defaults, scaled, are valid")
    }
}

impl Balancer {
    fn name(self) -> &'static str {
        match self {
            Balancer::Random => "random (tonic's balance_list)",
            Balancer::OursNoRecord => "ours, no record",
            Balancer::OursRecordOnly => "ours, record only",
            Balancer::Ours => "ours",
            Balancer::Ablated(detection) => detection.name(),
        }
    }

    /// The outlier detection of this balancer: the defaults for `Ours`, the ablation's for
    /// `Ablated`, in model time; none for the others.
    fn outlier_detection(self, scale: Scale) -> OutlierDetection {
        match self {
            Balancer::Ours => Detection::A50TripWeighted.settings(scale),
            Balancer::Ablated(detection) => detection.settings(scale),
            _ => OutlierDetection::disabled(),
        }
    }

    /// The balancer over `backends`, behind a buffer (the layers clone their service).
    fn over(
        self,
        backends: &[Backend],
        seed: u64,
        scale: Scale,
    ) -> BoxCloneService<Req, Res, BoxError> {
        match self {
            Balancer::Random => {
                let endpoints = backends.iter().map(|b| Constant::new(b.clone(), 0u32));
                let balance = tower::balance::p2c::Balance::from_rng(
                    ServiceList::new(endpoints.collect::<Vec<_>>()),
                    SeededRng(SmallRng::seed_from_u64(seed)),
                );
                BoxCloneService::new(Buffer::new(balance, BUFFER))
            }
            Balancer::OursNoRecord
            | Balancer::OursRecordOnly
            | Balancer::Ours
            | Balancer::Ablated(_) => {
                let endpoints = backends
                    .iter()
                    .map(|b| PendingRequests::new(b.clone(), CompleteOnResponse::default()));
                let balance =
                    Balance::with_seed(ServiceList::new(endpoints.collect::<Vec<_>>()), seed)
                        .outlier_detection(self.outlier_detection(scale));
                // The simulated answers are Trailers-Only: the balancer judged them on their
                // headers, and their bodies have nothing more to tell it.
                let balanced = Buffer::new(balance, BUFFER)
                    .map_response(|response| response.map(ResponseBody::into_inner));
                BoxCloneService::new(balanced)
            }
        }
    }

    /// Whether calls keep their record of the backends tried over this balancer.
    fn records(self) -> bool {
        matches!(
            self,
            Balancer::OursRecordOnly | Balancer::Ours | Balancer::Ablated(_)
        )
    }

    /// A policy table that keeps the call's record for the balancers that use it.
    fn policies(self) -> PoliciesBuilder {
        Policies::builder().track_backends(self.records())
    }

    /// `layer` over this balancer.
    fn client<L>(
        self,
        layer: L,
        backends: &[Backend],
        seed: u64,
        scale: Scale,
    ) -> BoxCloneService<Req, Res, BoxError>
    where
        L: Layer<BoxCloneService<Req, Res, BoxError>>,
        L::Service: Service<Req, Response = Res, Error = BoxError> + Clone + Send + 'static,
        <L::Service as Service<Req>>::Future: Send,
    {
        BoxCloneService::new(layer.layer(self.over(backends, seed, scale)))
    }
}

/// What the calls of a run gave: each call's latency (model ms) and whether it ended OK.
struct Outcome {
    latencies_ms: Vec<f64>,
    failed: usize,
}

/// `calls` calls, one every model millisecond, each in its own task.
async fn run(
    client: BoxCloneService<Req, Res, BoxError>,
    calls: usize,
    scale: Scale,
) -> Result<Outcome, BoxError> {
    let mut arrivals = tokio::time::interval(scale.clock(ARRIVAL_MS));
    arrivals.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(calls);
    for _ in 0..calls {
        arrivals.tick().await;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            // An error (every attempt refused) is a failed call, as an error status is.
            let ok = match client.oneshot(grpc_request()).await {
                Ok(response) => common::is_ok(&response),
                Err(_) => false,
            };
            Ok::<_, BoxError>((started.elapsed(), ok))
        }));
    }
    let mut outcome = Outcome {
        latencies_ms: Vec::with_capacity(calls),
        failed: 0,
    };
    for task in tasks {
        let (latency, ok) = task.await??;
        outcome.latencies_ms.push(scale.model_ms(latency));
        outcome.failed += usize::from(!ok);
    }
    Ok(outcome)
}

/// Three backends, `c` as `behaviour` says; their request counters.
fn backends(c: Behaviour, seed: u64, scale: Scale) -> Vec<Backend> {
    vec![
        Backend::new(Behaviour::Fast, seed, scale),
        Backend::new(Behaviour::Fast, seed.wrapping_add(1), scale),
        Backend::new(c, seed.wrapping_add(2), scale),
    ]
}

fn requests(backends: &[Backend]) -> u64 {
    backends
        .iter()
        .map(|b| b.requests.load(Ordering::Relaxed))
        .sum()
}

/// The hedge run: one row per hedging set-up and balancer.
/// The 10 ms windows in which backend `c` is slow, drawn once for `calls` calls and their
/// last hedges.
fn slow_windows(calls: usize, seed: u64) -> Arc<Vec<bool>> {
    let windows = (calls as f64 * ARRIVAL_MS / WINDOW_MS) as usize + 100;
    let mut rng = SmallRng::seed_from_u64(seed);
    Arc::new(
        (0..windows)
            .map(|_| rng.random::<f64>() < SLOW_WINDOW_SHARE)
            .collect(),
    )
}

/// The hedge layer of the hedge runs over `balancer`: a hedge after 2 ms, `max_attempts`.
fn hedge_layer(
    balancer: Balancer,
    max_attempts: u32,
    scale: Scale,
) -> Result<HedgeLayer, BoxError> {
    // A hedging policy keeps the record by default, whatever the table says.
    let policy = HedgePolicy::builder()
        .max_attempts(max_attempts)
        .delay(scale.clock(HEDGE_DELAY_MS))
        .track_backends(balancer.records())
        .build()?;
    Ok(HedgeLayer::new(
        balancer.policies().service(SERVICE, policy).build(),
    ))
}

/// The retry layer of the retry runs over `balancer`: 3 attempts, gRFC A6's example backoff,
/// and its example throttle if `throttled`.
fn retry_layer(
    balancer: Balancer,
    throttled: bool,
    seed: u64,
    scale: Scale,
) -> Result<RetryLayer, BoxError> {
    let backoff = Exponential::grpc(scale.clock(100.0), scale.clock(1000.0), 2.0)?;
    let policy = RetryPolicy::builder()
        .max_attempts(3)
        .backoff(Seeded::new(backoff, seed))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()?;
    let mut policies = balancer.policies().service(SERVICE, policy);
    if throttled {
        policies = policies.throttle(Throttle::new(10, 0.1)?);
    }
    Ok(RetryLayer::new(policies.build()))
}

async fn hedge_rows(calls: usize, seed: u64, scale: Scale) -> Result<Vec<Vec<String>>, BoxError> {
    // Enough windows for the whole run and its last calls' hedges.
    let slow = slow_windows(calls, seed);
    let windows = slow.len();
    let slow_windows = slow.iter().filter(|&&s| s).count();
    let mut rows = Vec::new();
    for max_attempts in [1, 2, 3] {
        for balancer in [Balancer::Random, Balancer::OursNoRecord, Balancer::Ours] {
            let start = Instant::now();
            let behaviour = Behaviour::SlowIn {
                windows: Arc::clone(&slow),
                start,
            };
            let backends = backends(behaviour, seed, scale);
            let client = if max_attempts == 1 {
                balancer.client(tower::layer::util::Identity::new(), &backends, seed, scale)
            } else {
                let layer = hedge_layer(balancer, max_attempts, scale)?;
                balancer.client(layer, &backends, seed, scale)
            };
            let outcome = run(client, calls, scale).await?;
            if outcome.failed > 0 {
                return Err("the backends never fail, yet a call did".into());
            }
            let mut sorted = outcome.latencies_ms;
            sorted.sort_by(f64::total_cmp);
            let extra = requests(&backends).saturating_sub(calls as u64) as f64 / calls as f64;
            let setup = if max_attempts == 1 {
                "bare".to_string()
            } else {
                format!("hedge {HEDGE_DELAY_MS} ms, {max_attempts} attempts")
            };
            rows.push(vec![
                setup,
                balancer.name().to_string(),
                format!("{:.2}", quantile(&sorted, 0.5)),
                format!("{:.2}", quantile(&sorted, 0.99)),
                format!("{:.2}", quantile(&sorted, 0.999)),
                format!("{:.2}", quantile(&sorted, 0.9999)),
                format!("{:.2}", sorted.last().copied().unwrap_or_default()),
                sorted
                    .iter()
                    .filter(|&&ms| ms >= SLOW_MS)
                    .count()
                    .to_string(),
                format!("{:.2}%", extra * 100.0),
            ]);
        }
    }
    println!(
        "hedge: {calls} calls at 1/ms; 3 backends at 1 ms ± 20 %, c at 100 ms in {slow_windows} \
         of {windows} 10 ms windows; seed {seed}, clock scale {}; latencies in ms",
        scale.0
    );
    Ok(rows)
}

/// The retry run: one row per throttle and balancer.
async fn retry_rows(calls: usize, seed: u64, scale: Scale) -> Result<Vec<Vec<String>>, BoxError> {
    let mut rows = Vec::new();
    for throttled in [false, true] {
        for balancer in [
            Balancer::Random,
            Balancer::OursNoRecord,
            Balancer::OursRecordOnly,
            Balancer::Ours,
        ] {
            let backends = backends(Behaviour::Dead, seed, scale);
            let layer = retry_layer(balancer, throttled, seed, scale)?;
            let client = balancer.client(layer, &backends, seed, scale);
            let outcome = run(client, calls, scale).await?;
            let per_10k = outcome.failed as f64 * 10_000.0 / calls as f64;
            let dead_first = backends[2].first.load(Ordering::Relaxed) as f64 / calls as f64;
            rows.push(vec![
                if throttled { "{10, 0.1}" } else { "none" }.to_string(),
                balancer.name().to_string(),
                format!("{per_10k:.1}"),
                format!("{:.4}", requests(&backends) as f64 / calls as f64),
                format!("{:.1}%", dead_first * 100.0),
            ]);
        }
    }
    println!(
        "retry: {calls} calls at 1/ms; 3 backends, c answers UNAVAILABLE; maxAttempts 3; seed \
         {seed}"
    );
    Ok(rows)
}

/// A backend that turns bad, as the ablation runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// `c` answers every attempt UNAVAILABLE; the retry layer.
    Dead,
    /// `c` is slow in 1 % of the windows; the hedge layer, 2 attempts.
    Slow,
    /// `c` refuses connections from `GONE_AT_MS` on; the retry layer.
    GoneAway,
}

/// When backend `c` goes away in the `GoneAway` scenario, in model milliseconds.
const GONE_AT_MS: f64 = 2_500.0;

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Dead => "dead (UNAVAILABLE), retry",
            Scenario::Slow => "slow (1 % of windows), hedge 2 ms",
            Scenario::GoneAway => "goes away at 2.5 s (refused), retry",
        }
    }
}

/// The ablation: each scenario under each share of the outlier detection, with the record.
async fn ablation_rows(
    retry_calls: usize,
    hedge_calls: usize,
    seed: u64,
    scale: Scale,
) -> Result<Vec<Vec<String>>, BoxError> {
    let mut rows = Vec::new();
    let runs = [
        (Scenario::Dead, false),
        (Scenario::Dead, true),
        (Scenario::GoneAway, false),
        (Scenario::GoneAway, true),
        (Scenario::Slow, false),
    ];
    for (scenario, throttled) in runs {
        for detection in Detection::ALL {
            let balancer = Balancer::Ablated(detection);
            let start = Instant::now();
            let (c, calls) = match scenario {
                Scenario::Dead => (Behaviour::Dead, retry_calls),
                Scenario::GoneAway => (
                    Behaviour::GoneAt {
                        at: start + scale.clock(GONE_AT_MS),
                    },
                    retry_calls,
                ),
                Scenario::Slow => (
                    Behaviour::SlowIn {
                        windows: slow_windows(hedge_calls, seed),
                        start,
                    },
                    hedge_calls,
                ),
            };
            let backends = backends(c, seed, scale);
            let client = match scenario {
                Scenario::Slow => {
                    balancer.client(hedge_layer(balancer, 2, scale)?, &backends, seed, scale)
                }
                Scenario::Dead | Scenario::GoneAway => {
                    let layer = retry_layer(balancer, throttled, seed, scale)?;
                    balancer.client(layer, &backends, seed, scale)
                }
            };
            let outcome = run(client, calls, scale).await?;
            let mut sorted = outcome.latencies_ms;
            sorted.sort_by(f64::total_cmp);
            rows.push(vec![
                scenario.name().to_string(),
                if throttled { "{10, 0.1}" } else { "none" }.to_string(),
                detection.name().to_string(),
                format!("{} of {calls}", outcome.failed),
                backends[2].bad.load(Ordering::Relaxed).to_string(),
                format!("{:.2}", quantile(&sorted, 0.99)),
                format!("{:.2}", quantile(&sorted, 0.999)),
            ]);
        }
    }
    println!(
        "ablation: calls at 1/ms over 3 backends, c the bad one, with the record; retry runs \
         {retry_calls} calls (maxAttempts 3), the hedge run {hedge_calls}; seed {seed}, clock \
         scale {}; latencies in ms",
        scale.0
    );
    Ok(rows)
}

fn main() -> Result<(), BoxError> {
    let mut cli = Cli::new(
        "several_backends",
        "[--ablation] [--hedge-calls N] [--retry-calls N] [--seed N] [--scale N] \
         | --loopback [--loopback-calls N] [--concurrency N] [--runs N]",
    );
    if cli.flag("--loopback") {
        let calls: u32 = cli.value("--loopback-calls", 2_000);
        let concurrency: usize = cli.value("--concurrency", 16);
        let runs: usize = cli.value("--runs", 5);
        if calls <= loopback::LATE_FROM || concurrency == 0 || runs == 0 {
            cli.fail("--loopback-calls must be above 200, --concurrency and --runs at least 1");
        }
        cli.finish();
        return loopback::main(calls, concurrency, runs);
    }
    let ablation = cli.flag("--ablation");
    let hedge_calls: usize = cli.value("--hedge-calls", 100_000);
    let retry_calls: usize = cli.value("--retry-calls", 10_000);
    let seed: u64 = cli.value("--seed", 1);
    let scale: u32 = cli.value("--scale", 10);
    if hedge_calls == 0 || retry_calls == 0 || scale == 0 {
        cli.fail("--hedge-calls, --retry-calls and --scale must be at least 1");
    }
    cli.finish();
    let scale = Scale(scale);
    let runtime = paused_runtime()?;
    if ablation {
        let rows = runtime.block_on(ablation_rows(retry_calls, hedge_calls, seed, scale))?;
        print_table(
            &[
                "scenario",
                "throttle",
                "outlier detection",
                "failed calls",
                "bad attempts on c",
                "p99",
                "p99.9",
            ],
            &rows,
        );
        return Ok(());
    }

    let rows = runtime.block_on(hedge_rows(hedge_calls, seed, scale))?;
    print_table(
        &[
            "set-up",
            "balancer",
            "p50",
            "p99",
            "p99.9",
            "p99.99",
            "max",
            ">=100ms",
            "extra req",
        ],
        &rows,
    );
    println!();
    let rows = runtime.block_on(retry_rows(retry_calls, seed, scale))?;
    print_table(
        &[
            "throttle",
            "balancer",
            "failed per 10 000",
            "attempts/call",
            "first attempts on c",
        ],
        &rows,
    );
    Ok(())
}

/// Over loopback: three tonic servers on 127.0.0.1, one answering every call `UNAVAILABLE`,
/// behind tonic's `Channel::balance_list` and `balance::BalancedChannel`, under the retry
/// layer with gRFC A6's example throttle `{10, 0.1}`.
#[cfg(feature = "tonic-transport")]
mod loopback {
    use std::collections::HashSet;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::{Duration, Instant};

    use tokio::net::TcpListener;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::transport::{Channel, Endpoint, Server};
    use tonic::{Request, Response, Status, Streaming};
    use tower::{BoxError, Layer};
    use tower_retry_hedge::backoff::Exponential;
    use tower_retry_hedge::balance::BalancedChannel;
    use tower_retry_hedge::classify::{Code, GrpcCodes};
    use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

    use super::common::{print_table, quantile};
    use pb::echo_client::EchoClient;
    use pb::echo_server::{Echo, EchoServer};
    use pb::{Chunk, Digest, EchoReply, EchoRequest};

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

    const SERVICE: &str = "test.echo.Echo";
    /// Calls from this one on are "late": the balancer has had 200 calls to learn.
    pub(super) const LATE_FROM: u32 = 200;
    /// Calls before this one are "early" for the failure count.
    const EARLY_BEFORE: u32 = 100;

    type Stream = tokio_stream::Iter<std::vec::IntoIter<Result<EchoReply, Status>>>;

    /// A backend that answers OK, or `UNAVAILABLE` when `dead`, and notes the calls whose
    /// first attempt it received (a request without `grpc-previous-rpc-attempts`).
    #[derive(Clone)]
    struct Backend {
        dead: bool,
        first: Arc<Mutex<HashSet<u32>>>,
        attempts: Arc<AtomicU32>,
    }

    #[tonic::async_trait]
    impl Echo for Backend {
        async fn unary(
            &self,
            request: Request<EchoRequest>,
        ) -> Result<Response<EchoReply>, Status> {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let first = request
                .metadata()
                .get("grpc-previous-rpc-attempts")
                .is_none();
            let request = request.into_inner();
            if first {
                self.first
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(request.call);
            }
            if self.dead {
                return Err(Status::unavailable("backend down"));
            }
            Ok(Response::new(EchoReply {
                message: request.message,
                payload: Vec::new(),
                attempt: 0,
            }))
        }

        async fn client_stream(
            &self,
            _request: Request<Streaming<Chunk>>,
        ) -> Result<Response<Digest>, Status> {
            Err(Status::unimplemented("unary only"))
        }

        type ServerStreamStream = Stream;

        async fn server_stream(
            &self,
            _request: Request<EchoRequest>,
        ) -> Result<Response<Stream>, Status> {
            Err(Status::unimplemented("unary only"))
        }
    }

    struct Peer {
        addr: SocketAddr,
        backend: Backend,
        shutdown: oneshot::Sender<()>,
        task: JoinHandle<Result<(), tonic::transport::Error>>,
    }

    impl Peer {
        async fn spawn(dead: bool) -> Result<Peer, BoxError> {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let backend = Backend {
                dead,
                first: Arc::default(),
                attempts: Arc::default(),
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
            Ok(Peer {
                addr,
                backend,
                shutdown,
                task,
            })
        }

        fn endpoint(&self) -> Result<Endpoint, BoxError> {
            Ok(Endpoint::from_shared(format!("http://{}", self.addr))?.tcp_nodelay(true))
        }

        async fn stop(self) -> Result<(), BoxError> {
            let _ = self.shutdown.send(());
            self.task.await??;
            Ok(())
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Balancer {
        Tonic,
        Ours,
    }

    impl Balancer {
        fn name(self) -> &'static str {
            match self {
                Balancer::Tonic => "tonic Channel::balance_list",
                Balancer::Ours => "balance::BalancedChannel",
            }
        }
    }

    /// What one run gave.
    struct Run {
        failed: usize,
        failed_early: usize,
        first_on_dead: usize,
        first_on_dead_late: usize,
        attempts: u32,
        elapsed: Duration,
    }

    /// The README's quick-start retry backoff with `maxAttempts` 3: 0.1 s, ×2, at most 1 s,
    /// ±20 %; throttle {10, 0.1}; each call records the backends it tried.
    fn policies() -> Result<Policies, BoxError> {
        let policy = RetryPolicy::builder()
            .max_attempts(3)
            .backoff(Exponential::grpc(
                Duration::from_millis(100),
                Duration::from_secs(1),
                2.0,
            )?)
            .retryable(GrpcCodes::from([Code::Unavailable]))
            .build()?;
        Ok(Policies::builder()
            .service(SERVICE, policy)
            .throttle(Throttle::new(10, 0.1)?)
            .track_backends(true)
            .build())
    }

    async fn run(balancer: Balancer, calls: u32, concurrency: usize) -> Result<Run, BoxError> {
        let peers = [
            Peer::spawn(true).await?,
            Peer::spawn(false).await?,
            Peer::spawn(false).await?,
        ];
        let endpoints = peers
            .iter()
            .map(Peer::endpoint)
            .collect::<Result<Vec<_>, _>>()?;
        let layer = RetryLayer::new(policies()?);
        let started = Instant::now();
        let outcomes = match balancer {
            Balancer::Tonic => {
                let channel = Channel::balance_list(endpoints.into_iter());
                drive(EchoClient::new(layer.layer(channel)), calls, concurrency).await?
            }
            Balancer::Ours => {
                let channel = BalancedChannel::balance_list(endpoints);
                drive(EchoClient::new(layer.layer(channel)), calls, concurrency).await?
            }
        };
        let elapsed = started.elapsed();
        let failed: Vec<u32> = outcomes
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(call, _)| *call)
            .collect();
        let dead = &peers[0].backend;
        let (first_on_dead, first_on_dead_late) = {
            let first = dead.first.lock().unwrap_or_else(PoisonError::into_inner);
            (
                first.len(),
                first.iter().filter(|&&c| c >= LATE_FROM).count(),
            )
        };
        let attempts = peers
            .iter()
            .map(|p| p.backend.attempts.load(Ordering::Relaxed))
            .sum();
        for peer in peers {
            peer.stop().await?;
        }
        Ok(Run {
            failed: failed.len(),
            failed_early: failed.iter().filter(|&&c| c < EARLY_BEFORE).count(),
            first_on_dead,
            first_on_dead_late,
            attempts,
            elapsed,
        })
    }

    /// Calls `0..calls`, `concurrency` at a time; each call's number and whether it was OK.
    async fn drive<S>(
        client: EchoClient<S>,
        calls: u32,
        concurrency: usize,
    ) -> Result<Vec<(u32, bool)>, BoxError>
    where
        EchoClient<S>: Clone + Send + 'static,
        S: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
        S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        <S::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    {
        let next = Arc::new(AtomicU32::new(0));
        let mut workers = Vec::new();
        for _ in 0..concurrency {
            let (next, mut client) = (Arc::clone(&next), client.clone());
            workers.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let call = next.fetch_add(1, Ordering::Relaxed);
                    if call >= calls {
                        return outcomes;
                    }
                    let request = EchoRequest {
                        message: "hello".into(),
                        payload: Vec::new(),
                        call,
                    };
                    outcomes.push((call, client.unary(request).await.is_ok()));
                }
            }));
        }
        let mut outcomes = Vec::new();
        for worker in workers {
            outcomes.extend(worker.await?);
        }
        Ok(outcomes)
    }

    fn median(values: &mut [f64]) -> f64 {
        values.sort_by(f64::total_cmp);
        quantile(values, 0.5)
    }

    pub(super) fn main(calls: u32, concurrency: usize, runs: usize) -> Result<(), BoxError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let late = f64::from(calls - LATE_FROM);
        let mut rows = Vec::new();
        for balancer in [Balancer::Tonic, Balancer::Ours] {
            let mut results = Vec::new();
            for _ in 0..runs {
                let run = runtime.block_on(run(balancer, calls, concurrency))?;
                println!(
                    "{}: {} failed ({} of the first {EARLY_BEFORE}), first attempts on the dead \
                     backend {} ({} of calls {LATE_FROM}..{calls}), {:.3} attempts/call, {:.2?}",
                    balancer.name(),
                    run.failed,
                    run.failed_early,
                    run.first_on_dead,
                    run.first_on_dead_late,
                    f64::from(run.attempts) / f64::from(calls),
                    run.elapsed,
                );
                results.push(run);
            }
            let column = |f: &dyn Fn(&Run) -> f64| {
                let mut values: Vec<f64> = results.iter().map(f).collect();
                let (min, max) = values
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                (median(&mut values), min, max)
            };
            let cell = |(median, min, max): (f64, f64, f64), digits: usize| {
                format!("{median:.digits$} ({min:.digits$}-{max:.digits$})")
            };
            rows.push(vec![
                balancer.name().to_string(),
                cell(column(&|r| r.failed as f64), 0),
                cell(column(&|r| r.failed_early as f64), 0),
                cell(
                    column(&|r| 100.0 * r.first_on_dead as f64 / f64::from(calls)),
                    1,
                ),
                cell(column(&|r| 100.0 * r.first_on_dead_late as f64 / late), 1),
                cell(column(&|r| f64::from(r.attempts) / f64::from(calls)), 3),
            ]);
        }
        println!(
            "\n{calls} calls, {concurrency} at a time, over loopback to 3 tonic servers, one \
             always UNAVAILABLE; retry maxAttempts 3 (0.1 s, x2, at most 1 s), throttle {{10, \
             0.1}}; medians of {runs} runs (min-max)"
        );
        print_table(
            &[
                "balancer",
                "failed calls",
                &format!("failed of first {EARLY_BEFORE}"),
                "first attempts on dead",
                &format!("same, calls {LATE_FROM}.."),
                "attempts/call",
            ],
            &rows,
        );
        Ok(())
    }
}

#[cfg(not(feature = "tonic-transport"))]
mod loopback {
    use tower::BoxError;

    pub(super) const LATE_FROM: u32 = 200;

    pub(super) fn main(_calls: u32, _concurrency: usize, _runs: usize) -> Result<(), BoxError> {
        Err("--loopback runs tonic servers: build with --features tonic-transport".into())
    }
}
