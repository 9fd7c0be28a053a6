//! Concurrency: the throttle, the statistics and the replay bodies, driven by many tasks on a
//! multi-threaded runtime, end exactly where a sequential model says they must.
//!
//! The workloads are chosen so that the order of the calls cannot matter: every call's
//! outcome is scripted by its number, and the throttle is kept inside a window where neither
//! of its clamps (0 and `maxTokens`) nor the "above half" gate can be reached, whatever the
//! interleaving. Each figure is then checked three ways: the concurrent run, the same calls
//! made one after another through a fresh stack, and a closed-form model.
//!
//! No loom model: the throttle's only shared state is one `AtomicU32` changed by
//! `fetch_update` with a pure closure (the standard library's own CAS loop), and it publishes
//! no other memory, so there is no interleaving for loom to find that these tests and the
//! unit tests do not already pin down.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_hedge::backoff::Constant;
use tower_retry_hedge::body::ReplayBody;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::metadata::Attempts;
use tower_retry_hedge::stats::{MethodSnapshot, StatsSnapshot};
use tower_retry_hedge::throttle::{RetryThrottle, Throttle};
use tower_retry_hedge::{
    BoxError, BufferLimits, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy,
};

type Body = BoxBody<Bytes, BoxError>;
type Req = Request<Body>;
type Res = Response<http_body_util::Empty<Bytes>>;

const RETRIED: &str = "/test.Echo/Retried";
const HEDGED: &str = "/test.Echo/Hedged";
const MAX_ATTEMPTS: u32 = 4;
const TASKS: u32 = 32;
const CALLS_PER_TASK: u32 = 100;
const CALLS: u32 = TASKS * CALLS_PER_TASK;

/// How a workload scripts its calls: how many attempts of call `n` fail (UNAVAILABLE)
/// before one succeeds.
type Failures = fn(u32) -> u32;

/// Even calls are retried, odd calls hedged.
fn path(call: u32) -> &'static str {
    if call.is_multiple_of(2) {
        RETRIED
    } else {
        HEDGED
    }
}

/// The request body of a call: one to four chunks of different lengths, all derived from
/// the call's number, so that a body sent to the wrong call cannot pass.
fn chunks(call: u32) -> Vec<Bytes> {
    (0..=(call % 4))
        .map(|i| {
            Bytes::from(format!(
                "call {call} chunk {i}:{}|",
                "x".repeat((call % 7 + i) as usize)
            ))
        })
        .collect()
}

fn body_of(call: u32) -> Vec<u8> {
    chunks(call).concat()
}

fn request(call: u32) -> Req {
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks(call)
        .into_iter()
        .map(|c| Ok(Frame::data(c)))
        .collect();
    Request::post(path(call))
        .header("content-type", "application/grpc")
        .header("x-call", call)
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap()
}

/// The server: reads each attempt's body (yielding between frames, so that tasks interleave
/// on every thread), checks it against the call's, and answers as the script says for the
/// attempt's number (from `grpc-previous-rpc-attempts`, which both layers send).
#[derive(Clone)]
struct Scripted {
    failures: Failures,
    wrong_bodies: Arc<AtomicUsize>,
}

impl Service<Req> for Scripted {
    type Response = Res;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let header = |name: &str| -> u32 {
                request
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            let (call, attempt) = (header("x-call"), header("grpc-previous-rpc-attempts"));
            let mut body = request.into_body();
            let mut received = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    received.extend_from_slice(&data);
                }
                tokio::task::yield_now().await;
            }
            if received != body_of(call) {
                this.wrong_bodies.fetch_add(1, Ordering::SeqCst);
            }
            let mut response = Response::builder().header("content-type", "application/grpc");
            if attempt < (this.failures)(call) {
                response = response.header("grpc-status", Code::Unavailable.header_value());
            }
            Ok(response.body(http_body_util::Empty::new()).unwrap())
        })
    }
}

/// `backoff`: real (short) sleeps give the concurrent run more interleaving; the sequential
/// run retries at once, which changes none of the figures.
fn policies(throttle: Option<&Throttle>, backoff: Duration) -> Policies {
    let retry = RetryPolicy::builder()
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Constant::new(backoff))
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    // A delay no call reaches: a hedge goes only when the one before it failed, so every
    // call's attempts come in a fixed order.
    let hedge = HedgePolicy::builder()
        .max_attempts(MAX_ATTEMPTS)
        .delay(Duration::from_secs(3600))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let mut builder = Policies::builder()
        .method(RETRIED, retry)
        .method(HEDGED, hedge)
        // Room for every call in flight at once: the budget never commits a call.
        .buffer_limits(BufferLimits::new(4096, 4096 * TASKS as usize));
    if let Some(throttle) = throttle {
        builder = builder.throttle(throttle.clone());
    }
    builder.build()
}

type Stack = tower_retry_hedge::Hedge<tower_retry_hedge::Retry<Scripted>>;

fn stack(policies: &Policies, server: &Scripted) -> Stack {
    ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .layer(RetryLayer::new(policies.clone()))
        .service(server.clone())
}

/// One call, checked against its script: the outcome and the attempts made.
fn call(svc: Stack, failures: Failures, n: u32) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    // Boxed, named future types: an `async fn` holding the stack's future trips the
    // compiler's higher-ranked `Send` check inside `tokio::spawn`.
    let response: Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>> =
        Box::pin(svc.oneshot(request(n)));
    Box::pin(async move {
        let response = response.await.expect("the stack never fails a call");
        let f = failures(n);
        let attempts = Attempts::of(&response).sent();
        assert_eq!(attempts, (f + 1).min(MAX_ATTEMPTS), "call {n}");
        let failed = response.headers().get("grpc-status").is_some();
        assert_eq!(failed, f >= MAX_ATTEMPTS, "call {n}");
    })
}

/// What a run leaves behind.
#[derive(Debug, PartialEq)]
struct Figures {
    stats: StatsSnapshot,
    tokens_milli: Option<u32>,
    buffer_in_use: usize,
    wrong_bodies: usize,
}

fn figures(policies: &Policies, throttle: Option<&Throttle>, server: &Scripted) -> Figures {
    Figures {
        stats: policies.stats().snapshot(),
        tokens_milli: throttle.map(Throttle::tokens_milli),
        buffer_in_use: policies.buffer_limits().in_use(),
        wrong_bodies: server.wrong_bodies.load(Ordering::SeqCst),
    }
}

/// A fresh throttle, already down to `start` tokens.
fn throttle(max_tokens: u32, ratio: f64, start: u32) -> Throttle {
    let throttle = Throttle::new(max_tokens, ratio).unwrap();
    for _ in start..max_tokens {
        throttle.on_failure();
    }
    assert_eq!(throttle.tokens_milli(), start * 1000);
    throttle
}

/// Every call, `TASKS` tasks at a time on the multi-threaded runtime.
async fn run_concurrently(
    failures: Failures,
    make_throttle: impl Fn() -> Option<Throttle>,
) -> Figures {
    let throttle = make_throttle();
    let policies = policies(throttle.as_ref(), Duration::from_millis(1));
    let server = Scripted {
        failures,
        wrong_bodies: Arc::default(),
    };
    let svc = stack(&policies, &server);
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let svc = svc.clone();
            tokio::spawn(async move {
                // Task t makes calls t, t + TASKS, t + 2 TASKS, ...: both methods, every script.
                for i in 0..CALLS_PER_TASK {
                    call(svc.clone(), failures, i * TASKS + task).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a call task panicked");
    }
    figures(&policies, throttle.as_ref(), &server)
}

/// Every call, one after another.
async fn run_sequentially(
    failures: Failures,
    make_throttle: impl Fn() -> Option<Throttle>,
) -> Figures {
    let throttle = make_throttle();
    let policies = policies(throttle.as_ref(), Duration::ZERO);
    let server = Scripted {
        failures,
        wrong_bodies: Arc::default(),
    };
    let svc = stack(&policies, &server);
    for n in 0..CALLS {
        call(svc.clone(), failures, n).await;
    }
    figures(&policies, throttle.as_ref(), &server)
}

/// The A6 histogram bucket of the k-th retry.
fn bucket(k: u32) -> usize {
    MethodSnapshot::HISTOGRAM_BOUNDS
        .iter()
        .rposition(|&b| k >= b)
        .unwrap_or(0)
}

/// The closed-form model: statistics per method, and the throttle's tokens (in thousandths)
/// from `start`, assuming the window is never left.
fn model(failures: Failures, throttle: Option<(u32, u32)>) -> Figures {
    let mut methods = std::collections::BTreeMap::<String, MethodSnapshot>::new();
    let mut tokens = throttle.map(|(start, _)| i64::from(start) * 1000);
    for n in 0..CALLS {
        let f = failures(n);
        let attempts = (f + 1).min(MAX_ATTEMPTS);
        let succeeded = f < MAX_ATTEMPTS;
        let retries = attempts - 1;
        if retries > 0 {
            let stats = methods.entry(path(n).to_owned()).or_default();
            stats.retry_attempts += u64::from(retries);
            // Retries that failed: all of them, but the last if the call succeeded.
            stats.retry_failures += u64::from(retries - u32::from(succeeded));
            for k in 1..=retries {
                stats.histogram[bucket(k)] += 1;
            }
        }
        if let (Some(tokens), Some((_, ratio_milli))) = (tokens.as_mut(), throttle) {
            *tokens -= i64::from(f.min(MAX_ATTEMPTS)) * 1000;
            if succeeded {
                *tokens += i64::from(ratio_milli);
            }
        }
    }
    Figures {
        stats: StatsSnapshot { methods },
        tokens_milli: tokens.map(|t| u32::try_from(t).unwrap()),
        buffer_in_use: 0,
        wrong_bodies: 0,
    }
}

/// The throttle workload: one call in 32 of each method fails 0 to 4 times.
fn sparse_failures(n: u32) -> u32 {
    if (n / 2).is_multiple_of(32) {
        (n / 64) % 5
    } else {
        0
    }
}

/// The statistics workload: every call fails `n % 5` times (4 and over: every attempt).
fn dense_failures(n: u32) -> u32 {
    n % 5
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throttle_tokens_and_stats_match_the_sequential_model() {
    // maxTokens 1000, tokenRatio 0.01, starting at 750 tokens. The calls fail at most 200
    // times in all (750 - 200 > 500: every retry is allowed, the floor is never reached) and
    // succeed at most 3200 times (750 + 32 < 1000: the cap is never reached), so the tokens
    // end where they would in any order.
    let make = || Some(throttle(1000, 0.01, 750));
    let model = model(sparse_failures, Some((750, 10)));
    let failures_total: u32 = (0..CALLS)
        .map(|n| sparse_failures(n).min(MAX_ATTEMPTS))
        .sum();
    assert!(
        failures_total < 250,
        "the workload leaves the window: {failures_total}"
    );
    assert!(
        model.stats.methods.len() == 2,
        "both methods retry: {model:?}"
    );

    let sequential = run_sequentially(sparse_failures, make).await;
    assert_eq!(sequential, model);
    let concurrent = run_concurrently(sparse_failures, make).await;
    assert_eq!(concurrent, model);
    eprintln!(
        "throttle: {CALLS} calls, {failures_total} failed attempts, tokens {:?} (thousandths)",
        concurrent.tokens_milli
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_and_replayed_bodies_match_the_sequential_model() {
    let model = model(dense_failures, None);
    let sequential = run_sequentially(dense_failures, || None).await;
    assert_eq!(sequential, model);
    let concurrent = run_concurrently(dense_failures, || None).await;
    assert_eq!(concurrent, model);
    let retried = &concurrent.stats.methods[RETRIED];
    assert!(retried.retry_attempts > 1000, "{retried:?}");
    assert!(
        retried.histogram[2] > 0,
        "third retries happen: {retried:?}"
    );
}

#[test]
fn throttle_updates_from_many_threads_are_all_counted() {
    // Straight at the bucket, on 8 threads: 10 000 rounds each of one failure and four
    // successes of 0.25. From 600 tokens, no interleaving leaves [592, 608], far from both
    // clamps and above half, so every update counts and the end is 600 again.
    let throttle = Throttle::new(1000, 0.25).unwrap();
    for _ in 0..400 {
        throttle.on_failure();
    }
    assert_eq!(throttle.tokens_milli(), 600_000);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let throttle = throttle.clone();
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    throttle.on_failure();
                    assert!(throttle.allows_retry());
                    for _ in 0..4 {
                        throttle.on_success();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(throttle.tokens_milli(), 600_000);
}

/// A source body fed chunk by chunk through a channel, with no size hint.
struct Trickle(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_body_readers_on_many_threads_all_get_the_source() {
    // One trickling source, 16 readers on as many tasks, polled from 4 worker threads.
    const READERS: usize = 16;
    let limits = BufferLimits::new(64 * 1024, 64 * 1024);
    for round in 0..50u32 {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(1);
        let source = Trickle(receiver);
        let Ok(template) = ReplayBody::try_new(source, &limits) else {
            panic!("a body with no size hint is accepted");
        };
        let mut expected = Vec::new();
        let chunks: Vec<Bytes> = (0..20)
            .map(|i| Bytes::from(format!("r{round}c{i}{}", "y".repeat(i % 5))))
            .collect();
        for chunk in &chunks {
            expected.extend_from_slice(chunk);
        }
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let reader = template.clone();
                tokio::spawn(async move {
                    let collected = reader.collect().await.expect("no reader is excluded");
                    collected.to_bytes()
                })
            })
            .collect();
        let feeder = tokio::spawn(async move {
            for chunk in chunks {
                sender.send(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        for reader in readers {
            assert_eq!(reader.await.unwrap(), expected, "round {round}");
        }
        feeder.await.unwrap();
        assert!(!template.is_committed());
        assert_eq!(limits.in_use(), expected.len());
        drop(template);
        assert_eq!(limits.in_use(), 0, "round {round}");
    }
}
