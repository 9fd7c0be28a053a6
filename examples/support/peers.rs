//! The retry strategies that `retry_storm` and `brownout` compare, the failing downstream
//! they call, and the loop that drives calls on the paused clock.
//!
//! Every strategy that retries makes at most 4 attempts and waits gRFC A6's example backoff
//! between them (0.1 s, x2, at most 1 s, ±20 %, from a seeded generator), so the strategies
//! differ only in what limits their retries.
//!
//! Included with `#[path = "support/peers.rs"] mod peers;` next to `common`; each benchmark
//! uses a part of it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep, sleep, sleep_until};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_retry_hedge::backoff::{Backoff, Exponential, Step};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::throttle::{AdaptiveThrottle, RetryBudget};
use tower_retry_hedge::{Policies, RetryLayer, RetryPolicy, Throttle};

use crate::common::{Req, Res, SERVICE, Seeded, grpc_request, is_ok, is_unavailable};

/// Attempts per call, counting the first, for every strategy that retries.
pub const MAX_ATTEMPTS: u32 = 4;

/// Seconds the per-second counters cover; later attempts count in the last second.
const MAX_SECONDS: usize = 100_000;

/// gRFC A6's example backoff: 0.1 s, x2, at most 1 s, ±20 %, from a seeded generator.
fn a6_backoff(seed: u64) -> Result<Seeded<Exponential>, BoxError> {
    let schedule = Exponential::grpc(Duration::from_millis(100), Duration::from_secs(1), 2.0)?;
    Ok(Seeded::new(schedule, seed))
}

/// The probability that an attempt fails, as a function of the time since the start.
pub type FailureRate = fn(Duration) -> f64;

struct DownstreamState {
    start: Instant,
    latency: Duration,
    failure_rate: FailureRate,
    rng: Mutex<SmallRng>,
    attempts: AtomicU64,
    per_second: Mutex<Vec<u64>>,
}

/// The downstream: a hand-written service that answers every attempt after `latency`, with
/// a Trailers-Only `UNAVAILABLE` with probability `failure_rate(now)`, else `OK`. It counts
/// the attempts it receives, in all and per second.
#[derive(Clone)]
pub struct Downstream(Arc<DownstreamState>);

impl Downstream {
    /// A downstream whose clock starts now (call it inside the runtime).
    pub fn new(seed: u64, latency: Duration, failure_rate: FailureRate) -> Self {
        Downstream(Arc::new(DownstreamState {
            start: Instant::now(),
            latency,
            failure_rate,
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            attempts: AtomicU64::new(0),
            per_second: Mutex::new(Vec::new()),
        }))
    }

    /// When the downstream was created: second 0 of its counters.
    pub fn start(&self) -> Instant {
        self.0.start
    }

    /// Attempts received so far.
    pub fn attempts(&self) -> u64 {
        self.0.attempts.load(Ordering::Relaxed)
    }

    /// Attempts received in each second since the start.
    pub fn attempts_per_second(&self) -> Vec<u64> {
        self.0
            .per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Service<Req> for Downstream {
    type Response = Res;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Res, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Req) -> Self::Future {
        let state = &self.0;
        state.attempts.fetch_add(1, Ordering::Relaxed);
        let elapsed = state.start.elapsed();
        let second = usize::try_from(elapsed.as_secs())
            .unwrap_or(usize::MAX)
            .min(MAX_SECONDS - 1);
        {
            let mut per_second = state.per_second.lock().unwrap_or_else(|e| e.into_inner());
            if per_second.len() <= second {
                per_second.resize(second + 1, 0);
            }
            if let Some(count) = per_second.get_mut(second) {
                *count += 1;
            }
        }
        let fail = {
            let mut rng = state.rng.lock().unwrap_or_else(|e| e.into_inner());
            rng.random::<f64>() < (state.failure_rate)(elapsed)
        };
        let latency = state.latency;
        Box::pin(async move {
            sleep(latency).await;
            Ok(crate::common::trailers_only(if fail { 14 } else { 0 }))
        })
    }
}

/// A `tower::retry` policy: retry `UNAVAILABLE` up to 3 times with the A6 backoff, and, with
/// a budget, only while the budget allows. Successes deposit into the budget, as in tower's
/// own budget example.
#[derive(Clone)]
struct TowerPolicy {
    retries: u32,
    backoff: Seeded<Exponential>,
    budget: Option<Arc<TpsBudget>>,
}

impl tower::retry::Policy<Req, Res, Infallible> for TowerPolicy {
    type Future = Sleep;

    fn retry(&mut self, _request: &mut Req, result: &mut Result<Res, Infallible>) -> Option<Sleep> {
        let Ok(response) = result else {
            return None;
        };
        if !is_unavailable(response) {
            if let Some(budget) = &self.budget {
                budget.deposit();
            }
            return None;
        }
        if self.retries + 1 >= MAX_ATTEMPTS {
            return None;
        }
        if let Some(budget) = &self.budget
            && !budget.withdraw()
        {
            return None;
        }
        let delay = self.backoff.delay(self.retries);
        self.retries += 1;
        Some(sleep(delay))
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

/// The A6 backoff as a tower-resilience interval function.
struct A6Interval(Seeded<Exponential>);

impl tower_resilience::retry::IntervalFunction for A6Interval {
    fn next_interval(&self, attempt: usize) -> Duration {
        self.0.sample(
            Step::new(u32::try_from(attempt).unwrap_or(u32::MAX)),
            &mut rand::rng(),
        )
    }
}

/// A retry strategy under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// No retries at all.
    NoRetry,
    /// `tower::retry`, up to 4 attempts, nothing else.
    Naive,
    /// `tower::retry`, up to 4 attempts, with `TpsBudget::default()` (10 s, 10/s, 20 %).
    TowerTps,
    /// tower-resilience's retry, up to 4 attempts, no budget (its default).
    Resilience,
    /// tower-resilience's retry with its AIMD budget at its defaults.
    ResilienceAimd,
    /// This crate's `RetryLayer`, `maxAttempts` 4, with the gRFC A6 throttle (10, 0.1).
    CrateA6,
    /// This crate's `RetryLayer`, `maxAttempts` 4, with a `RetryBudget` at tower's
    /// `TpsBudget` defaults (10 s, 10 retries/s, 20 %).
    CrateBudget,
    /// This crate's `RetryLayer`, `maxAttempts` 4, with an `AdaptiveThrottle` at its defaults
    /// (k 2, 10 s window), seeded.
    CrateAdaptive,
    /// This crate's `RetryLayer`, `maxAttempts` 4, with the guide's default: the gRFC A6
    /// throttle with `tokenRatio` 1 (20, 1.0).
    CrateDefault,
}

impl Peer {
    /// Every strategy, in the order the tables list them.
    pub const ALL: [Peer; 9] = [
        Peer::NoRetry,
        Peer::Naive,
        Peer::TowerTps,
        Peer::Resilience,
        Peer::ResilienceAimd,
        Peer::CrateA6,
        Peer::CrateBudget,
        Peer::CrateAdaptive,
        Peer::CrateDefault,
    ];

    /// A label for the tables.
    pub fn label(self) -> &'static str {
        match self {
            Peer::NoRetry => "no retries",
            Peer::Naive => "naive: tower::retry, 4 attempts",
            Peer::TowerTps => "tower::retry + TpsBudget",
            Peer::Resilience => "tower-resilience retry",
            Peer::ResilienceAimd => "tower-resilience retry + AIMD budget",
            Peer::CrateA6 => "this crate + A6 throttle (10, 0.1)",
            Peer::CrateBudget => "this crate + budget (10 s, 10/s, 20 %)",
            Peer::CrateAdaptive => "this crate + adaptive throttle (k 2, 10 s)",
            Peer::CrateDefault => "this crate + A6 throttle (20, 1.0): the default",
        }
    }

    /// A short name for CSV.
    pub fn id(self) -> &'static str {
        match self {
            Peer::NoRetry => "none",
            Peer::Naive => "naive",
            Peer::TowerTps => "tower_tps",
            Peer::Resilience => "resilience",
            Peer::ResilienceAimd => "resilience_aimd",
            Peer::CrateA6 => "crate_a6",
            Peer::CrateBudget => "crate_budget",
            Peer::CrateAdaptive => "crate_adaptive",
            Peer::CrateDefault => "crate_default",
        }
    }

    /// The strategy wrapped around `downstream`; `None` for one not written yet.
    pub fn service(
        self,
        downstream: Downstream,
        seed: u64,
    ) -> Result<Option<BoxCloneService<Req, Res, BoxError>>, BoxError> {
        let tower_retry = |budget: Option<Arc<TpsBudget>>| -> Result<_, BoxError> {
            let policy = TowerPolicy {
                retries: 0,
                backoff: a6_backoff(seed)?,
                budget,
            };
            Ok(BoxCloneService::new(
                tower::retry::Retry::new(policy, downstream.clone()).map_err(BoxError::from),
            ))
        };
        let resilience = |aimd: bool| -> Result<_, BoxError> {
            let mut builder =
                tower_resilience::retry::RetryLayer::<Req, Res, Infallible>::builder()
                    .max_attempts(MAX_ATTEMPTS as usize)
                    .backoff(A6Interval(a6_backoff(seed)?))
                    .retry_on_response(is_unavailable);
            if aimd {
                builder = builder.budget(
                    tower_resilience::retry::RetryBudgetBuilder::new()
                        .aimd()
                        .build()?,
                );
            }
            Ok(BoxCloneService::new(
                builder
                    .build()
                    .layer(downstream.clone())
                    .map_err(BoxError::from),
            ))
        };
        Ok(Some(match self {
            Peer::NoRetry => BoxCloneService::new(downstream.map_err(BoxError::from)),
            Peer::Naive => tower_retry(None)?,
            Peer::TowerTps => tower_retry(Some(Arc::new(TpsBudget::default())))?,
            Peer::Resilience => resilience(false)?,
            Peer::ResilienceAimd => resilience(true)?,
            Peer::CrateA6 | Peer::CrateBudget | Peer::CrateAdaptive | Peer::CrateDefault => {
                let policy = RetryPolicy::builder()
                    .max_attempts(MAX_ATTEMPTS)
                    .backoff(a6_backoff(seed)?)
                    .retryable(GrpcCodes::from([Code::Unavailable]))
                    .build()?;
                let policies = Policies::builder().service(SERVICE, policy);
                let policies = match self {
                    Peer::CrateA6 => policies.throttle(Throttle::new(10, 0.1)?),
                    Peer::CrateBudget => {
                        policies.throttle(RetryBudget::new(Duration::from_secs(10), 10, 0.2)?)
                    }
                    Peer::CrateAdaptive => {
                        policies.throttle(AdaptiveThrottle::default().with_seed(seed))
                    }
                    _ => policies.throttle(Throttle::new(20, 1.0)?),
                };
                BoxCloneService::new(RetryLayer::new(policies.build()).layer(downstream))
            }
        }))
    }
}

/// How one logical call ended: when (since the downstream's start) and whether it succeeded.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// Time from the downstream's start to the end of the call.
    pub at: Duration,
    /// Whether the call's final answer was `OK`.
    pub ok: bool,
}

/// Makes `calls` calls through `service`: one after another when `interval` is `None`, else
/// one every `interval` whatever the others are doing (each on its own task).
pub async fn drive(
    service: BoxCloneService<Req, Res, BoxError>,
    start: Instant,
    calls: u64,
    interval: Option<Duration>,
) -> Vec<Completion> {
    let call = |mut service: BoxCloneService<Req, Res, BoxError>| async move {
        let ok = match service.ready().await {
            Ok(ready) => ready.call(grpc_request()).await.is_ok_and(|r| is_ok(&r)),
            Err(_) => false,
        };
        Completion {
            at: start.elapsed(),
            ok,
        }
    };
    let mut completions = Vec::new();
    match interval {
        None => {
            for _ in 0..calls {
                completions.push(call(service.clone()).await);
            }
        }
        Some(interval) => {
            let mut tasks = JoinSet::new();
            let mut due = start;
            for _ in 0..calls {
                sleep_until(due).await;
                tasks.spawn(call(service.clone()));
                due += interval;
            }
            while let Some(done) = tasks.join_next().await {
                if let Ok(completion) = done {
                    completions.push(completion);
                }
            }
        }
    }
    completions
}
