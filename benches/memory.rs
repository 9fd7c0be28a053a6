//! Memory per call in flight: heap bytes that stay live while a call waits on a downstream
//! that never answers, with each retry and hedge middleware against the bare downstream.
//!
//! For every variant of the overhead benchmark (`support/mod.rs`), 10 000 calls are made, each
//! with a 1 KiB request body, and each response future is boxed, kept, and polled once; the
//! downstream's future holds its request, as a transport holds a request in flight, and never
//! answers. The counting allocator (`support/counting.rs`) reads the bytes live before the
//! calls, with all of them in flight, and after they are all dropped. "Δ bare" subtracts the
//! bare downstream's figure (the request itself, the box of its future, the slot in the list),
//! leaving what the middleware keeps per call. The figures are exact byte counts, the same on
//! every run.
//!
//! A second table does the same with a streaming body (`UnsyncBoxBody`, the tonic and hyper
//! path), which the downstream reads to its end before it waits, as a transport sends a body:
//! what this crate then keeps includes the recorded body, for a retry or a hedge to replay.
//!
//! For this crate's variants, the live allocations one call leaves are printed with a
//! backtrace symbol each when the variant is over its goal, or when named:
//!
//! ```text
//! cargo bench --bench memory
//! MEMORY_TRACE=ours_hedge_policy/grpc_4_headers cargo bench --bench memory
//! MEMORY_TRACE=ours_retry_policy/streaming/grpc_4_headers cargo bench --bench memory
//! ```

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use support::counting::{self, interesting};
use support::{CloneRequest, Req, Res, Shape, Visit};
use tower::{Layer, Service};
use tower_retry_hedge::{BoxError, HedgeLayer, Policies, RetryLayer};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Calls in flight at once.
const CALLS: usize = 10_000;
/// Calls made and dropped first, so that what a service builds once (a spare clone of the
/// downstream, a statistics table) is not counted against the calls.
const WARM_UP: usize = 100;
/// The size of every request body.
const BODY: usize = 1024;

/// A downstream that never answers: the future of each call holds the request.
#[derive(Debug, Clone, Copy)]
struct Silent;

/// The future of a call to [`Silent`]: pending for ever, holding the request.
struct Held<R>(#[allow(dead_code)] R);

impl<R: Unpin> Future for Held<R> {
    type Output = Result<Res, Infallible>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Pending
    }
}

impl Service<Req> for Silent {
    type Response = Res;
    type Error = Infallible;
    type Future = Held<Req>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        Held(request)
    }
}

impl Service<CloneRequest> for Silent {
    type Response = Res;
    type Error = Infallible;
    type Future = Held<CloneRequest>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: CloneRequest) -> Self::Future {
        Held(request)
    }
}

type StreamRequest = Request<UnsyncBoxBody<Bytes, BoxError>>;

/// [`Silent`] for streaming bodies: reads the body to its end first, as a transport sends
/// it, then holds the request and never answers.
#[derive(Debug, Clone, Copy)]
struct SilentAfterBody;

impl Service<StreamRequest> for SilentAfterBody {
    type Response = Res;
    type Error = Infallible;
    type Future = Held<StreamRequest>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: StreamRequest) -> Self::Future {
        let mut cx = Context::from_waker(Waker::noop());
        let mut sent = 0;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(request.body_mut()).poll_frame(&mut cx) {
            sent += frame.data_ref().map_or(0, Bytes::len);
        }
        assert_eq!(sent, BODY, "the body is read in one go");
        Held(request)
    }
}

/// A request of `shape` with a body of [`BODY`] bytes of its own.
fn request(shape: Shape) -> Req {
    let mut request = support::request(shape);
    *request.body_mut() = Full::new(Bytes::from(vec![b'x'; BODY]));
    request
}

fn stream_request(shape: Shape) -> StreamRequest {
    let (parts, body) = request(shape).into_parts();
    let body = body
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    Request::from_parts(parts, body)
}

/// Calls `service` `calls` times with requests from `make`, polls each response future once
/// (it must be pending), and gives them all back, boxed.
fn in_flight<Rq, S>(
    service: &mut S,
    make: &impl Fn() -> Rq,
    calls: usize,
) -> Vec<Pin<Box<S::Future>>>
where
    S: Service<Rq>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut futures = Vec::with_capacity(calls);
    for _ in 0..calls {
        match service.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(error)) => panic!("the downstream is always ready: {error:?}"),
            Poll::Pending => panic!("the downstream is always ready"),
        }
        let mut future = Box::pin(service.call(make()));
        assert!(
            future.as_mut().poll(&mut cx).is_pending(),
            "the downstream never answers"
        );
        futures.push(future);
    }
    futures
}

/// What one variant keeps.
struct Measured {
    /// Live bytes per call in flight.
    per_call: f64,
    /// Live bytes left once every call is dropped, in all.
    left: i64,
    /// The allocations one call leaves live, with their backtraces.
    breakdown: String,
}

/// Measures `service` with requests from `make` on a fresh runtime.
fn measure<Rq, S>(service: &mut S, make: impl Fn() -> Rq) -> Measured
where
    S: Service<Rq>,
    S::Error: std::fmt::Debug,
{
    let runtime = support::runtime();
    // Polled from inside the runtime, for the timers; unconstrained, so that tokio's
    // cooperative budget never makes a timer skip its registration after 128 polls.
    runtime.block_on(tokio::task::coop::unconstrained(async {
        drop(in_flight(service, &make, WARM_UP));
        let before = counting::live();
        let futures = in_flight(service, &make, CALLS);
        let during = counting::live_since(before);
        drop(futures);
        let left = counting::live_since(before);

        // One call more, traced.
        let request = make();
        let mut cx = Context::from_waker(Waker::noop());
        assert!(service.poll_ready(&mut cx).is_ready());
        let (future, traces) = counting::traced(|| {
            let mut future = Box::pin(service.call(request));
            let _ = future.as_mut().poll(&mut cx);
            future
        });
        let mut breakdown = String::new();
        let live: Vec<_> = traces.iter().filter(|t| !t.freed).collect();
        let total: usize = live.iter().map(|t| t.size).sum();
        breakdown.push_str(&format!(
            "{} live allocations, {total} bytes (the box of the response future included; \
             {} more allocations were freed before the end of the first poll)\n\n",
            live.len(),
            traces.len() - live.len()
        ));
        for (i, traced) in live.iter().enumerate() {
            breakdown.push_str(&format!(
                "### live allocation {} ({} bytes)\n{}\n",
                i + 1,
                traced.size,
                interesting(&traced.trace)
            ));
        }
        drop(future);
        Measured {
            per_call: during as f64 / CALLS as f64,
            left,
            breakdown,
        }
    }))
}

/// One row of the main table.
struct Row {
    variant: &'static str,
    shape: Shape,
    future_size: usize,
    measured: Measured,
}

struct Rows<'a> {
    shape: Shape,
    rows: &'a mut Vec<Row>,
}

impl Visit for Rows<'_> {
    fn visit<S>(&mut self, name: &'static str, mut service: S)
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug,
    {
        let shape = self.shape;
        let measured = measure(&mut service, || request(shape));
        self.rows.push(Row {
            variant: name,
            shape,
            future_size: std::mem::size_of::<S::Future>(),
            measured,
        });
    }
}

/// The streaming-body table: bare, and this crate's layers with a policy; with the
/// breakdown of the variant `trace` names (`<variant>/streaming/<shape>`).
fn streaming(shape: Shape, trace: Option<&str>) {
    let make = || stream_request(shape);
    let mut bare = SilentAfterBody;
    let retry = Policies::builder()
        .method(support::METHOD, support::our_retry_policy())
        .build();
    let hedge = Policies::builder()
        .method(support::METHOD, support::our_hedge_policy())
        .build();
    let bare = measure(&mut bare, make);
    let retried = measure(&mut RetryLayer::new(retry).layer(SilentAfterBody), make);
    let hedged = measure(&mut HedgeLayer::new(hedge).layer(SilentAfterBody), make);
    println!(
        "\nstreaming request body (`UnsyncBoxBody` of {BODY} bytes, read by the downstream), {}\n",
        shape.name()
    );
    println!("| variant | live bytes per call (Δ bare) | bytes left after drop |");
    println!("|---|---:|---:|");
    for (name, measured) in [
        ("bare", &bare),
        ("ours_retry_policy", &retried),
        ("ours_hedge_policy", &hedged),
    ] {
        println!(
            "| {name} | {} ({}) | {} |",
            fmt(measured.per_call),
            signed(measured.per_call - bare.per_call),
            measured.left
        );
    }
    for (name, measured) in [
        ("bare", &bare),
        ("ours_retry_policy", &retried),
        ("ours_hedge_policy", &hedged),
    ] {
        let title = format!("{name}/streaming/{}", shape.name());
        if trace == Some(title.as_str()) {
            println!("\n## where one call's live bytes go: {title}\n");
            print!("{}", measured.breakdown);
        }
    }
}

/// tower's hedge with latencies recorded, so that it hedges.
const PRIMED: &str = "tower_hedge (10 latencies recorded)";

/// The peer each of this crate's variants must not keep more than, per call.
const GOALS: [(&str, &str); 3] = [
    ("ours_retry_policy", "tower_retry+tps_budget"),
    ("ours_hedge_policy", "tower_hedge"),
    ("ours_hedge_policy", PRIMED),
];

fn main() {
    let trace = std::env::var("MEMORY_TRACE").ok();
    let shapes = [Shape::NoHeaders, Shape::Grpc4];
    let mut rows = Vec::new();
    for shape in shapes {
        let mut visitor = Rows {
            shape,
            rows: &mut rows,
        };
        support::each_variant_over(Silent, &mut visitor);
        // tower's hedge clones a request only once its histogram holds `min_data_points`
        // latencies, which calls that never answer never record: this one starts with 10 of
        // 10 s, so it hedges after 10 s as ours does, and clones each request up front.
        visitor.visit(
            PRIMED,
            tower::hedge::Hedge::new_with_mock_latencies::<Req>(
                Silent,
                support::HedgeAll,
                10,
                0.9,
                Duration::from_secs(600),
                &[10_000; 10],
            ),
        );
    }
    let find = |variant: &str, shape: Shape| {
        rows.iter()
            .find(|r| r.variant == variant && r.shape == shape)
            .expect("every variant is measured in every shape")
    };
    let delta = |variant: &str, shape: Shape| {
        find(variant, shape).measured.per_call - find("bare", shape).measured.per_call
    };

    println!(
        "\nlive heap bytes per call in flight ({CALLS} calls, {BODY}-byte bodies, each future \
         polled once; Δ bare = what the middleware keeps)\n"
    );
    print!("| variant | future size (bytes) |");
    for shape in shapes {
        print!(
            " {}: bytes per call (Δ bare) | left after drop |",
            shape.name()
        );
    }
    println!();
    print!("|---|---:|");
    for _ in shapes {
        print!("---:|---:|");
    }
    println!();
    let mut variants = support::VARIANTS.to_vec();
    let after = variants
        .iter()
        .position(|v| *v == "tower_hedge")
        .map_or(0, |i| i + 1);
    variants.insert(after, PRIMED);
    for variant in variants {
        print!("| {variant} | {} |", find(variant, shapes[0]).future_size);
        for shape in shapes {
            let row = find(variant, shape);
            print!(
                " {} ({}) | {} |",
                fmt(row.measured.per_call),
                signed(delta(variant, shape)),
                row.measured.left
            );
        }
        println!();
    }

    println!();
    let mut over = Vec::new();
    for (ours, peer) in GOALS {
        for shape in shapes {
            let (mine, theirs) = (delta(ours, shape), delta(peer, shape));
            let met = mine <= theirs;
            println!(
                "goal {ours} ≤ {peer}, {}: {} against {}: {}",
                shape.name(),
                signed(mine),
                signed(theirs),
                if met { "met" } else { "NOT met" }
            );
            if !met {
                over.push(format!("{ours}/{}", shape.name()));
            }
        }
    }
    for row in &rows {
        if row.measured.left != 0 {
            println!(
                "goal 0 bytes left: {} / {} leaves {} bytes",
                row.variant,
                row.shape.name(),
                row.measured.left
            );
        }
    }

    for shape in shapes {
        streaming(shape, trace.as_deref());
    }

    for row in &rows {
        let title = format!("{}/{}", row.variant, row.shape.name());
        if over.contains(&title) || trace.as_deref() == Some(title.as_str()) {
            println!("\n## where one call's live bytes go: {title}\n");
            print!("{}", row.measured.breakdown);
        }
    }
}

/// A figure with at most two decimals, without trailing zeros.
fn fmt(value: f64) -> String {
    let s = format!("{value:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A difference, with its sign.
fn signed(value: f64) -> String {
    if value < 0.0 {
        fmt(value)
    } else {
        format!("+{}", fmt(value))
    }
}
