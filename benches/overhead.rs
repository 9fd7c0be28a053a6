//! Success-path cost of each retry and hedge middleware, in ns per call.
//!
//! Every variant wraps the same echo service (it answers on the first poll with the request's
//! body) and takes the same `http::Request<Full<Bytes>>`; see `support/mod.rs`. Each call is
//! driven to completion with `block_on` on a current-thread tokio runtime (a fresh one per
//! variant, in the same state: see `support::runtime`), so every variant pays the same
//! runtime cost, which `bare` shows. Building the request is left out of the
//! timing (`iter_batched`); dropping the request and the response is in it.
//!
//! By default criterion measures wall time. With `OVERHEAD_CLOCK=thread-cpu` it measures the
//! benchmark thread's CPU time instead (groups `overhead_cpu/…`), which time spent waiting
//! for a core on a loaded machine does not inflate.
//!
//! ```text
//! cargo bench --bench overhead -- --warm-up-time 1 --measurement-time 3
//! OVERHEAD_CLOCK=thread-cpu cargo bench --bench overhead -- --warm-up-time 1 --measurement-time 3
//! ```

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BatchSize, BenchmarkGroup, Criterion, Throughput};
use support::clock::Clock;
use support::{Req, Res, Shape, Visit};
use tower::Service;

struct Bench<'a, 'g, M: Measurement> {
    group: &'a mut BenchmarkGroup<'g, M>,
    shape: Shape,
}

impl<M: Measurement> Visit for Bench<'_, '_, M> {
    fn visit<S>(&mut self, name: &'static str, mut service: S)
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug,
    {
        // A fresh runtime per variant: see `support::runtime` on why its state matters.
        let runtime = support::runtime();
        let shape = self.shape;
        self.group.bench_function(name, |b| {
            b.iter_batched(
                || support::request(shape),
                |request| {
                    let response = runtime.block_on(support::call(&mut service, request));
                    drop(black_box(response));
                },
                BatchSize::SmallInput,
            )
        });
    }
}

fn overhead<M: Measurement>(c: &mut Criterion<M>, prefix: &str) {
    for shape in Shape::ALL {
        let mut group = c.benchmark_group(format!("{prefix}/{}", shape.name()));
        support::each_variant(&mut Bench {
            group: &mut group,
            shape,
        });
        group.finish();
    }
}

/// The benchmark thread's CPU time, in nanoseconds.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        Clock::Thread.now().unwrap_or_default()
    }

    fn end(&self, started: Duration) -> Duration {
        Clock::Thread
            .now()
            .unwrap_or_default()
            .saturating_sub(started)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        a.saturating_add(*b)
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &Nanos
    }
}

/// Shows CPU time in nanoseconds, unscaled, so every row reads in the same unit.
struct Nanos;

impl ValueFormatter for Nanos {
    fn scale_values(&self, _: f64, _: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }

    fn scale_throughputs(
        &self,
        _: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let (per_iteration, unit) = match *throughput {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => (n as f64, "B/s (cpu)"),
            Throughput::Elements(n) => (n as f64, "elem/s (cpu)"),
        };
        for value in values {
            *value = per_iteration * 1e9 / *value;
        }
        unit
    }

    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn main() {
    if std::env::var_os("OVERHEAD_CLOCK").is_some_and(|clock| clock == "thread-cpu") {
        assert!(Clock::Thread.now().is_some(), "no thread CPU clock here");
        let mut c = Criterion::default()
            .with_measurement(ThreadCpu)
            .configure_from_args();
        overhead(&mut c, "overhead_cpu");
        c.final_summary();
    } else {
        let mut c = Criterion::default().configure_from_args();
        overhead(&mut c, "overhead");
        c.final_summary();
    }
}
