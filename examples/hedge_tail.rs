//! Hedging against a long tail: how much of it each hedging strategy cuts, and at what cost.
//!
//! The downstream answers 99 % of calls after 1 ms ± 20 % (uniform) and 1 % after 100 ms.
//! 20 000 calls are made one after another on tokio's paused clock, through:
//!
//! - `bare`: the downstream alone;
//! - `tower::hedge`: tower's `Hedge` (one hedge after the p95 of its own latency histogram,
//!   rotated every second, once it holds 100 samples);
//! - this crate's `HedgeLayer`, 3 attempts, with a fixed 2 ms and 5 ms delay, with 2 ms and
//!   2 attempts (one hedge, like tower's), and with an `AdaptiveDelay` following the p95 of
//!   the last 10 s (10 ms until it has 100 samples).
//!
//! - tower-resilience 0.13's hedge, 3 attempts, a fixed 2 ms delay;
//! - this crate with a 2 ms delay, 3 attempts and a `HedgeBudget` of 5 % of the calls.
//!
//! For each it prints p50, p99, p99.9 and the maximum latency, the calls that took 100 ms or
//! more (in all, and after the first 1000), the extra requests the downstream received, and
//! whether the goals hold: p99.9 <= 5 ms, no call >= 100 ms after the first 1000, extra
//! requests <= 2 %.
//!
//! A second table runs the same strategies through a phase in which every call is slow
//! (100 ms, a backend turned slow for everyone: overload, a pause, a slow disk), 2 000 calls
//! in the middle of the run, and prints the extra requests each sent during that phase: a
//! fixed delay hedges every slow call, a budget keeps the extra load to its share.
//!
//! tokio's timers fire on whole milliseconds of the clock, so on a clock that runs at model
//! time a 1 ms ± 20 % sleep ends at 1 ms or 2 ms. By default the simulation runs the clock 10
//! times faster than the model (`--scale 10`: a model millisecond is 10 ms of the paused
//! clock) so that latencies keep a 0.1 ms resolution; every figure printed is in model time.
//! `--scale 1` runs it at face value.
//!
//! ```text
//! cargo run --release --example hedge_tail -- [--calls N] [--seed N] [--scale N]
//! ```

#[path = "support/common.rs"]
mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceExt};
use tower_retry_hedge::latency::AdaptiveDelay;
use tower_retry_hedge::throttle::HedgeBudget;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies};

use common::{Cli, Req, Res, SERVICE, grpc_request, paused_runtime, print_table, quantile};

const SLOW_SHARE: f64 = 0.01;
const FAST_MS: f64 = 1.0;
const FAST_JITTER: f64 = 0.2;
const SLOW_MS: f64 = 100.0;
/// Calls that may still be slow while a strategy learns the latency.
const WARM_UP: usize = 1000;
/// Calls of the phase in which every call is slow.
const SLOW_PHASE: usize = 2000;
/// The share of calls a budgeted policy may hedge.
const BUDGET_RATIO: f64 = 0.05;

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

/// The downstream: a hand-written service that answers after a sleep of the modelled
/// latency, drawn from a seeded generator, and counts the requests it receives.
#[derive(Clone)]
struct Downstream {
    rng: Arc<Mutex<SmallRng>>,
    requests: Arc<AtomicU64>,
    scale: Scale,
    /// Every call is slow while this is set.
    all_slow: Arc<AtomicBool>,
}

impl Downstream {
    fn new(seed: u64, scale: Scale) -> Self {
        Downstream {
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
            requests: Arc::new(AtomicU64::new(0)),
            scale,
            all_slow: Arc::new(AtomicBool::new(false)),
        }
    }

    fn latency(&self) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let model_ms = if rng.random::<f64>() < SLOW_SHARE || self.all_slow.load(Ordering::Relaxed)
        {
            SLOW_MS
        } else {
            FAST_MS * rng.random_range(1.0 - FAST_JITTER..=1.0 + FAST_JITTER)
        };
        self.scale.clock(model_ms)
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
        self.requests.fetch_add(1, Ordering::Relaxed);
        let latency = self.latency();
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Ok(common::trailers_only(0))
        })
    }
}

/// The budgeted policy's window: 10 s of model time, at most the 60 s of the clock a budget
/// allows (6 s of model time at the default scale). No floor: the bound is exactly the share
/// of the calls in the window.
fn budget_window(scale: Scale) -> Duration {
    scale.clock(10_000.0).min(Duration::from_secs(60))
}

/// A strategy wrapped around the downstream, type-erased.
type Client = BoxService<Req, Res, BoxError>;

/// tower's hedge policy: every request may be cloned and hedged.
#[derive(Clone)]
struct HedgeAll;

impl tower::hedge::Policy<Req> for HedgeAll {
    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }

    fn can_retry(&self, _request: &Req) -> bool {
        true
    }
}

#[derive(Debug, Clone, Copy)]
enum Strategy {
    Bare,
    TowerHedge,
    ResilienceHedge,
    Fixed { delay_ms: f64, max_attempts: u32 },
    Budgeted,
    Adaptive,
}

impl Strategy {
    fn name(self) -> String {
        match self {
            Strategy::Bare => "bare".into(),
            Strategy::TowerHedge => "tower::hedge p95".into(),
            Strategy::ResilienceHedge => "tower-resilience hedge, 2 ms, 3 attempts".into(),
            Strategy::Budgeted => "this crate, 2 ms, 3 attempts, 5 % budget".into(),
            Strategy::Fixed {
                delay_ms,
                max_attempts,
            } => format!("this crate, {delay_ms} ms, {max_attempts} attempts"),
            Strategy::Adaptive => "this crate, adaptive p95, 3 attempts".into(),
        }
    }

    fn service(
        self,
        downstream: Downstream,
        scale: Scale,
    ) -> Result<(Client, Option<AdaptiveDelay>), BoxError> {
        let hedged = |policy: HedgePolicy| {
            let policies = Policies::builder().service(SERVICE, policy).build();
            BoxService::new(tower::Layer::layer(
                &HedgeLayer::new(policies),
                downstream.clone(),
            ))
        };
        Ok(match self {
            Strategy::Bare => (
                BoxService::new(downstream.clone().map_err(BoxError::from)),
                None,
            ),
            Strategy::TowerHedge => (
                BoxService::new(tower::hedge::Hedge::new::<Req>(
                    downstream,
                    HedgeAll,
                    100,  // samples before the first hedge
                    0.95, // the percentile to hedge at
                    scale.clock(1000.0),
                )),
                None,
            ),
            Strategy::ResilienceHedge => {
                let layer = tower_resilience::hedge::HedgeLayer::builder()
                    .delay(scale.clock(2.0))
                    .max_hedged_attempts(3)
                    .build();
                let hedge = tower::Layer::layer(&layer, downstream);
                (BoxService::new(hedge.map_err(BoxError::from)), None)
            }
            Strategy::Fixed {
                delay_ms,
                max_attempts,
            } => (
                hedged(
                    HedgePolicy::builder()
                        .max_attempts(max_attempts)
                        .delay(scale.clock(delay_ms))
                        .build()?,
                ),
                None,
            ),
            Strategy::Budgeted => {
                let budget = HedgeBudget::new(budget_window(scale), 0, BUDGET_RATIO)?;
                let policy = HedgePolicy::builder()
                    .max_attempts(3)
                    .delay(scale.clock(2.0))
                    .budget(budget)
                    .build()?;
                (hedged(policy), None)
            }
            Strategy::Adaptive => {
                let delay = AdaptiveDelay::builder()
                    .percentile(0.95)
                    .window(scale.clock(10_000.0))
                    .bounds(scale.clock(0.5), scale.clock(50.0))
                    .min_samples(100)
                    .fallback(scale.clock(10.0))
                    .build()?;
                let service = hedged(
                    HedgePolicy::builder()
                        .max_attempts(3)
                        .adaptive_delay(delay.clone())
                        .build()?,
                );
                (service, Some(delay))
            }
        })
    }
}

struct Outcome {
    latencies_ms: Vec<f64>,
    requests: u64,
    /// Requests the downstream received during the slow phase, if there was one.
    phase_requests: Option<u64>,
    /// Calls made in the budget's window before the slow phase began.
    calls_in_window_before_phase: usize,
    /// Where an adaptive delay ended up, in model milliseconds.
    final_delay_ms: Option<f64>,
}

/// `calls` calls, one after another, with a phase of `phase` calls that are all slow in the
/// middle; the latency of each in model milliseconds.
async fn run(
    strategy: Strategy,
    calls: usize,
    phase: usize,
    seed: u64,
    scale: Scale,
) -> Result<Outcome, BoxError> {
    let downstream = Downstream::new(seed, scale);
    let requests = Arc::clone(&downstream.requests);
    let all_slow = Arc::clone(&downstream.all_slow);
    let (mut service, adaptive) = strategy.service(downstream, scale)?;
    let mut latencies_ms = Vec::with_capacity(calls);
    let phase_calls = calls / 2..calls / 2 + phase;
    let mut at_phase_start = 0;
    let mut phase_requests = None;
    let mut started_at = Vec::with_capacity(calls);
    let mut calls_in_window_before_phase = 0;
    for call in 0..calls {
        if phase > 0 && call == phase_calls.start {
            at_phase_start = requests.load(Ordering::Relaxed);
            all_slow.store(true, Ordering::Relaxed);
            let window_start = Instant::now().checked_sub(budget_window(scale));
            calls_in_window_before_phase = started_at
                .iter()
                .filter(|&&at| window_start.is_none_or(|start| at >= start))
                .count();
        }
        if phase > 0 && call == phase_calls.end {
            all_slow.store(false, Ordering::Relaxed);
            phase_requests = Some(requests.load(Ordering::Relaxed) - at_phase_start);
        }
        let started = Instant::now();
        started_at.push(started);
        let response = service.ready().await?.call(grpc_request()).await?;
        if !common::is_ok(&response) {
            return Err("the downstream never fails, yet a call did".into());
        }
        latencies_ms.push(scale.model_ms(started.elapsed()));
    }
    Ok(Outcome {
        latencies_ms,
        requests: requests.load(Ordering::Relaxed),
        phase_requests,
        calls_in_window_before_phase,
        final_delay_ms: adaptive.map(|d| scale.model_ms(d.current())),
    })
}

fn yes_no(ok: bool) -> String {
    if ok { "yes" } else { "NO" }.to_string()
}

fn main() -> Result<(), BoxError> {
    let mut cli = Cli::new("hedge_tail", "[--calls N] [--seed N] [--scale N]");
    let calls: usize = cli.value("--calls", 20_000);
    let seed: u64 = cli.value("--seed", 1);
    let scale: u32 = cli.value("--scale", 10);
    if calls == 0 || scale == 0 {
        cli.fail("--calls and --scale must be at least 1");
    }
    cli.finish();
    let scale = Scale(scale);

    let strategies = [
        Strategy::Bare,
        Strategy::TowerHedge,
        Strategy::Fixed {
            delay_ms: 2.0,
            max_attempts: 3,
        },
        Strategy::Fixed {
            delay_ms: 5.0,
            max_attempts: 3,
        },
        Strategy::Fixed {
            delay_ms: 2.0,
            max_attempts: 2,
        },
        Strategy::Adaptive,
        Strategy::ResilienceHedge,
        Strategy::Budgeted,
    ];
    let runtime = paused_runtime()?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for strategy in strategies {
        let outcome = runtime.block_on(run(strategy, calls, 0, seed, scale))?;
        let slow = |from: usize| {
            outcome
                .latencies_ms
                .iter()
                .skip(from)
                .filter(|&&ms| ms >= SLOW_MS)
                .count()
        };
        let (slow_all, slow_late) = (slow(0), slow(WARM_UP));
        if let Some(ms) = outcome.final_delay_ms {
            notes.push(format!(
                "{}: hedging delay at the end {ms:.3} ms",
                strategy.name()
            ));
        }
        let mut sorted = outcome.latencies_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let p999 = quantile(&sorted, 0.999);
        let extra = outcome.requests.saturating_sub(calls as u64) as f64 / calls as f64 * 100.0;
        rows.push(vec![
            strategy.name(),
            format!("{:.2}", quantile(&sorted, 0.5)),
            format!("{:.2}", quantile(&sorted, 0.99)),
            format!("{p999:.2}"),
            format!("{:.2}", sorted.last().copied().unwrap_or_default()),
            slow_all.to_string(),
            slow_late.to_string(),
            format!("{extra:.2}%"),
            yes_no(p999 <= 5.0),
            yes_no(slow_late == 0),
            yes_no(extra <= 2.0),
        ]);
    }
    println!(
        "hedge_tail: {calls} sequential calls, 99 % at 1 ms ± 20 %, 1 % at 100 ms; seed {seed}, \
         clock scale {}; latencies in ms",
        scale.0
    );
    print_table(
        &[
            "strategy",
            "p50",
            "p99",
            "p99.9",
            "max",
            ">=100ms",
            ">=100ms after 1000",
            "extra req",
            "p99.9<=5",
            "none>=100 late",
            "extra<=2%",
        ],
        &rows,
    );
    for note in notes {
        println!("{note}");
    }
    slow_phase(&strategies, calls, seed, scale)
}

/// The second table: extra requests while every call is slow.
fn slow_phase(
    strategies: &[Strategy],
    calls: usize,
    seed: u64,
    scale: Scale,
) -> Result<(), BoxError> {
    let runtime = paused_runtime()?;
    let mut rows = Vec::new();
    for &strategy in strategies {
        let outcome = runtime.block_on(run(strategy, calls, SLOW_PHASE, seed, scale))?;
        let Some(phase_requests) = outcome.phase_requests else {
            return Err("the run is too short for the slow phase".into());
        };
        let hedges = phase_requests.saturating_sub(SLOW_PHASE as u64);
        let extra = hedges as f64 / SLOW_PHASE as f64;
        let extra_all = outcome.requests.saturating_sub(calls as u64) as f64 / calls as f64;
        // What the budget allows during the phase: its share of the phase's calls and of
        // those still in its window when the phase began.
        let earned = SLOW_PHASE + outcome.calls_in_window_before_phase;
        let bound = (earned as f64 * BUDGET_RATIO).floor() as u64;
        rows.push(vec![
            strategy.name(),
            format!("{:.2}%", extra * 100.0),
            format!("{hedges} / {bound}"),
            format!("{:.2}%", extra_all * 100.0),
            yes_no(hedges <= bound),
        ]);
    }
    println!(
        "\nslow phase: calls {}..{} of {calls} all take 100 ms; extra requests during the \
         phase; the hedges sent in it against what a 5 % budget allows (5 % of the phase's \
         calls and of the calls in the budget's window when it began); extra over the run",
        calls / 2,
        calls / 2 + SLOW_PHASE
    );
    print_table(
        &[
            "strategy",
            "extra in phase",
            "hedges / 5 % budget",
            "extra in all",
            "within budget",
        ],
        &rows,
    );
    Ok(())
}
