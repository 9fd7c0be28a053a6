//! Heap allocations (and bytes) per successful call, for every variant of the overhead
//! benchmark, counted by a global allocator that wraps the system one.
//!
//! Allocations do not depend on machine load, so this table is exact where the timing tables
//! are noisy. Each figure is the average over 10 000 calls after 1 000 warm-up calls (the
//! warm-up fills lazily built tables: tower's hedge histogram, the statistics map), and
//! covers the whole call: building the request, `ready`, `call`, polling to completion, and
//! dropping the response. `Δ bare` subtracts the bare echo's figure (the request itself).
//!
//! ```text
//! cargo bench --bench allocations
//! # where each allocation of one call comes from (symbol names; more with line tables):
//! ALLOC_TRACE=ours_retry_policy/grpc_4_headers cargo bench --bench allocations
//! ALLOC_TRACE=ours_retry_policy/streaming cargo bench --bench allocations
//! ```

mod support;

use std::hint::black_box;

use support::counting::{self, interesting};
use support::streaming::{DrainEcho, stream_request};
use support::{Req, Res, Shape, Visit};
use tower::{Layer, Service};
use tower_retry_hedge::{Policies, RetryLayer};

#[global_allocator]
static GLOBAL: support::counting::Counting = support::counting::Counting;

const WARM_UP: u64 = 1_000;
const CALLS: u64 = 10_000;

/// One row of the table.
struct Row {
    variant: &'static str,
    shape: Shape,
    allocs: f64,
    bytes: f64,
    /// The size of the response future, which each move of it copies.
    future_size: usize,
}

struct Count<'a> {
    shape: Shape,
    rows: &'a mut Vec<Row>,
    trace: Option<&'a str>,
}

/// Allocations and bytes per call over `CALLS` calls of `service` after `WARM_UP` calls, each
/// on a request from `make`; then, if `trace` is set, one more call with every allocation's
/// backtrace printed under `title`.
fn count<Rq, S>(make: impl Fn() -> Rq, service: &mut S, trace: Option<&str>) -> (f64, f64)
where
    S: Service<Rq, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let runtime = support::runtime();
    let one = |service: &mut S| {
        let response = runtime.block_on(support::call(service, make()));
        drop(black_box(response));
    };
    for _ in 0..WARM_UP {
        one(service);
    }
    let (allocs, bytes) = (counting::allocations(), counting::bytes());
    for _ in 0..CALLS {
        one(service);
    }
    let allocs = counting::allocations() - allocs;
    let bytes = counting::bytes() - bytes;

    if let Some(title) = trace {
        let ((), traces) = counting::traced(|| one(service));
        println!("\n## {} allocations of one call: {title}\n", traces.len());
        for (i, traced) in traces.iter().enumerate() {
            println!(
                "### allocation {} ({} bytes)\n{}",
                i + 1,
                traced.size,
                interesting(&traced.trace)
            );
        }
    }
    (allocs as f64 / CALLS as f64, bytes as f64 / CALLS as f64)
}

impl Visit for Count<'_> {
    fn visit<S>(&mut self, name: &'static str, mut service: S)
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug,
    {
        let shape = self.shape;
        let title = format!("{name}/{}", shape.name());
        let trace = (self.trace == Some(title.as_str())).then_some(title.as_str());
        let (allocs, bytes) = count(|| support::request(shape), &mut service, trace);
        self.rows.push(Row {
            variant: name,
            shape,
            allocs,
            bytes,
            future_size: std::mem::size_of::<S::Future>(),
        });
    }
}

/// The streaming-body rows: bare and the retry layer with a policy, `grpc_4_headers`.
fn streaming(trace: Option<&str>) {
    println!(
        "\nstreaming request body (`UnsyncBoxBody`, made replayable by `ReplayBody`), grpc_4_headers\n"
    );
    println!("| variant | allocs per call (Δ bare) | bytes per call |");
    println!("|---|---:|---:|");
    let policies = Policies::builder()
        .method(support::METHOD, support::our_retry_policy())
        .build();
    let mut bare = DrainEcho;
    let mut ours = RetryLayer::new(policies).layer(DrainEcho);
    let title = |name: &str| format!("{name}/streaming");
    let wants = |name: &str| trace == Some(title(name).as_str());
    let bare_title = title("bare");
    let ours_title = title("ours_retry_policy");
    let (bare_allocs, bare_bytes) = count(
        stream_request,
        &mut bare,
        wants("bare").then_some(bare_title.as_str()),
    );
    let (ours_allocs, ours_bytes) = count(
        stream_request,
        &mut ours,
        wants("ours_retry_policy").then_some(ours_title.as_str()),
    );
    println!("| bare | {} (+0) | {} |", fmt(bare_allocs), fmt(bare_bytes));
    println!(
        "| ours_retry_policy | {} ({:+}) | {} |",
        fmt(ours_allocs),
        fmt(ours_allocs - bare_allocs).parse::<f64>().unwrap_or(0.0),
        fmt(ours_bytes)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to filter.
    let trace = std::env::var("ALLOC_TRACE").ok();
    let mut rows = Vec::new();
    for shape in Shape::ALL {
        support::each_variant(&mut Count {
            shape,
            rows: &mut rows,
            trace: trace.as_deref(),
        });
    }

    println!("\nallocations per successful call ({CALLS} calls after {WARM_UP} warm-up calls)\n");
    print!("| variant | future size (bytes) |");
    for shape in Shape::ALL {
        print!(" {} allocs (Δ bare) | bytes |", shape.name());
    }
    println!();
    print!("|---|---:|");
    for _ in Shape::ALL {
        print!("---:|---:|");
    }
    println!();
    for variant in support::VARIANTS {
        let future_size = rows
            .iter()
            .find(|r| r.variant == variant)
            .map_or(0, |r| r.future_size);
        print!("| {variant} | {future_size} |");
        for shape in Shape::ALL {
            let find = |v: &str| rows.iter().find(|r| r.variant == v && r.shape == shape);
            match (find(variant), find("bare")) {
                (Some(row), Some(bare)) => print!(
                    " {} ({:+}) | {} |",
                    fmt(row.allocs),
                    fmt(row.allocs - bare.allocs).parse::<f64>().unwrap_or(0.0),
                    fmt(row.bytes)
                ),
                _ => print!(" – | – |"),
            }
        }
        println!();
    }

    streaming(trace.as_deref());
}

/// A count with at most two decimals, without trailing zeros.
fn fmt(value: f64) -> String {
    let s = format!("{value:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
