//! One retry layer shared by 1 and 2 client tasks on a multi-thread runtime (2 workers), with
//! gRFC A96 metrics off and on: wall time per call, all tasks together (so with 2 tasks on 2
//! cores, perfect scaling halves the figure).
//!
//! Every task calls a clone of the same `Retry<S>` (one policy table, one throttle, one set
//! of statistics and instruments, one spare service), each call `ready().await` then
//! `call(req).await`. Two services below the layer:
//!
//! - `success`: the echo of `support/mod.rs`, which answers at once: the path every call
//!   takes while the server is healthy. A call of one attempt records no metric (A96 reports
//!   no zero), so metrics on must cost next to nothing here.
//! - `retried_once`: the first attempt of every call fails with `UNAVAILABLE` and a pushback
//!   of 0 ms, the retry succeeds at once: every call records `grpc.client.call.retries` and
//!   `grpc.client.call.retry_delay` (and the A6 statistics), so this is what recording costs.
//!
//! Metrics on means a table built with `.metrics(&meter)` on an SDK meter provider whose
//! periodic reader exports to memory (once a minute: never during a run). Each call builds
//! its request (four gRPC headers: two allocations) inside the timing.
//!
//! By default criterion measures wall time. With `CONTENTION_CLOCK=process-cpu` it measures
//! the CPU time of the whole process (every worker) per call instead, which time spent
//! waiting for a core on a loaded machine does not inflate; with 2 tasks it is about twice
//! the wall time when both cores are busy.
//!
//! ```text
//! cargo bench --features opentelemetry --bench contention -- --warm-up-time 2 --measurement-time 5
//! CONTENTION_CLOCK=process-cpu cargo bench --features opentelemetry --bench contention -- --warm-up-time 2 --measurement-time 5
//! ```

mod support;

use support::clock::Clock;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Response;
use http_body_util::Full;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use support::{Echo, METHOD, Req, Res, Shape};
use tower::{Layer, Service};
use tower_retry_hedge::metadata::AttemptInfo;
use tower_retry_hedge::{Policies, Retry, RetryLayer};

/// Fails the first attempt of every call with `UNAVAILABLE` and a pushback of 0 ms (a retry
/// at once); answers later attempts like [`Echo`].
#[derive(Debug, Clone, Copy)]
struct FailFirst;

impl Service<Req> for FailFirst {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // Attempts after the first carry an `AttemptInfo`.
        if request.extensions().get::<AttemptInfo>().is_some() {
            return ready(Ok(Response::new(request.into_body())));
        }
        let response = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-retry-pushback-ms", "0")
            .body(Full::new(Bytes::new()))
            .expect("a valid response");
        ready(Ok(response))
    }
}

/// The table, with A96 metrics or without.
fn policies(metrics: Option<&SdkMeterProvider>) -> Policies {
    let builder = Policies::builder().method(METHOD, support::our_retry_policy());
    match metrics {
        Some(provider) => builder.metrics(&provider.meter("tower-retry-hedge")),
        None => builder,
    }
    .build()
}

/// Wall time (or with `cpu`, the process's CPU time) for `calls` calls spread over `tasks`
/// tasks, each on its clone of `service`.
fn run<S>(
    runtime: &tokio::runtime::Runtime,
    service: &Retry<S>,
    tasks: u64,
    calls: u64,
    cpu: bool,
) -> Duration
where
    S: Service<Req, Response = Res, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let cpu_time = || Clock::Process.now().expect("the process CPU clock");
    runtime.block_on(async {
        let (started, cpu_started) = (Instant::now(), cpu.then(cpu_time));
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let mut service = service.clone();
                // The first tasks take the remainder, so that exactly `calls` are made.
                let share = calls / tasks + u64::from(task < calls % tasks);
                tokio::spawn(async move {
                    for _ in 0..share {
                        let response =
                            support::call(&mut service, support::request(Shape::Grpc4)).await;
                        drop(std::hint::black_box(response));
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("a client task");
        }
        match cpu_started {
            Some(cpu_started) => cpu_time().saturating_sub(cpu_started),
            None => started.elapsed(),
        }
    })
}

fn bench_service<S>(c: &mut Criterion, name: &str, inner: S)
where
    S: Service<Req, Response = Res, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a multi-thread runtime");
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(InMemoryMetricExporter::default()).build())
        .build();
    let cpu = std::env::var_os("CONTENTION_CLOCK").is_some_and(|clock| clock == "process-cpu");
    let prefix = if cpu { "contention_cpu" } else { "contention" };
    let mut group = c.benchmark_group(format!("{prefix}/{name}"));
    let variants = [("metrics_off", None), ("metrics_on", Some(&provider))].map(|(name, p)| {
        let service = RetryLayer::new(policies(p)).layer(inner.clone());
        // One call first, so that every clone shares the layer's spare service too.
        run(&runtime, &service, 1, 1, false);
        (name, service)
    });
    // Off and on side by side for each number of tasks, so that both see the same machine.
    for tasks in [1, 2] {
        for (metrics, service) in &variants {
            group.bench_function(format!("{metrics}/tasks_{tasks}"), |b| {
                b.iter_custom(|iters| run(&runtime, service, tasks, iters, cpu));
            });
        }
    }
    group.finish();
}

fn contention(c: &mut Criterion) {
    bench_service(c, "success", Echo);
    bench_service(c, "retried_once", FailFirst);
}

criterion_group!(benches, contention);
criterion_main!(benches);
