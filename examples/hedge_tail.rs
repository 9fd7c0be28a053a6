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
//! For each it prints p50, p99, p99.9 and the maximum latency, the calls that took 100 ms or
//! more (in all, and after the first 1000), the extra requests the downstream received, and
//! whether the goals hold: p99.9 <= 5 ms, no call >= 100 ms after the first 1000, extra
//! requests <= 2 %.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceExt};
use tower_retry_hedge::latency::AdaptiveDelay;
use tower_retry_hedge::{HedgeLayer, HedgePolicy, Policies};

use common::{Cli, Req, Res, SERVICE, grpc_request, paused_runtime, print_table, quantile};

const SLOW_SHARE: f64 = 0.01;
const FAST_MS: f64 = 1.0;
const FAST_JITTER: f64 = 0.2;
const SLOW_MS: f64 = 100.0;
/// Calls that may still be slow while a strategy learns the latency.
const WARM_UP: usize = 1000;

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
}

impl Downstream {
    fn new(seed: u64, scale: Scale) -> Self {
        Downstream {
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
            requests: Arc::new(AtomicU64::new(0)),
            scale,
        }
    }

    fn latency(&self) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let model_ms = if rng.random::<f64>() < SLOW_SHARE {
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
    Fixed { delay_ms: f64, max_attempts: u32 },
    Adaptive,
}

impl Strategy {
    fn name(self) -> String {
        match self {
            Strategy::Bare => "bare".into(),
            Strategy::TowerHedge => "tower::hedge p95".into(),
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
    /// Where an adaptive delay ended up, in model milliseconds.
    final_delay_ms: Option<f64>,
}

/// `calls` calls, one after another; the latency of each in model milliseconds.
async fn run(
    strategy: Strategy,
    calls: usize,
    seed: u64,
    scale: Scale,
) -> Result<Outcome, BoxError> {
    let downstream = Downstream::new(seed, scale);
    let requests = Arc::clone(&downstream.requests);
    let (mut service, adaptive) = strategy.service(downstream, scale)?;
    let mut latencies_ms = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let response = service.ready().await?.call(grpc_request()).await?;
        if !common::is_ok(&response) {
            return Err("the downstream never fails, yet a call did".into());
        }
        latencies_ms.push(scale.model_ms(started.elapsed()));
    }
    Ok(Outcome {
        latencies_ms,
        requests: requests.load(Ordering::Relaxed),
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
    ];
    let runtime = paused_runtime()?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for strategy in strategies {
        let outcome = runtime.block_on(run(strategy, calls, seed, scale))?;
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
    Ok(())
}
