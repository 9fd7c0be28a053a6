//! The hedge layer against mock services, one test per gRFC A6 hedging rule, on tokio's
//! paused clock; `grpc.rs` runs it over a real tonic channel.
//!
//! Two kinds of mock: tower-test's `mock::pair` where counting and answering attempts is
//! enough, and [`Probe`] (and [`BodyReader`]) where a test must see an attempt being
//! cancelled: their futures carry a drop guard that tells whether the layer dropped them
//! before they answered.

#[path = "../common/mod.rs"]
mod common;
// The mock helpers of the retry tests: Trailers-Only responses.
#[path = "../retry/support.rs"]
mod support;

mod budget;
mod commit;
#[cfg(feature = "tonic")]
mod grpc;
mod resets;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_stream::wrappers::ReceiverStream;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::body::NotReplayable;
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::latency::AdaptiveDelay;
use tower_retry_hedge::metadata::{AttemptInfo, Attempts, TriedBackends};
use tower_retry_hedge::throttle::{RetryThrottle, Throttle};
use tower_retry_hedge::{
    BoxError, BufferLimits, Hedge, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy,
};
use tower_test::mock;

use support::trailers_only;

type Req = Request<Full<Bytes>>;
type Res = Response<http_body_util::Empty<Bytes>>;
type Handle = mock::Handle<Req, Res>;
type Reply = mock::SendResponse<Res>;
type CallHandle = tokio::task::JoinHandle<Result<Res, BoxError>>;

const SERVICE: &str = "test.Echo";
const METHOD: &str = "/test.Echo/Unary";
/// Set on a response by the tests, to tell which attempt it came from.
const MARK: &str = "x-attempt";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A hedge policy with UNAVAILABLE as its only non-fatal code.
/// A6's hedging, without the default hedge budget (its tests give it one): these tests send
/// a hedge with nearly every call, far past the budget's 5 %.
fn hedge(max_attempts: u32, delay_ms: u64) -> HedgePolicy {
    HedgePolicy::builder()
        .max_attempts(max_attempts)
        .delay(ms(delay_ms))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(None)
        .build()
        .unwrap()
}

/// The attempt's number: from its `AttemptInfo`, which every attempt but the first carries.
fn attempt_number<B>(request: &http::Request<B>) -> u32 {
    match request.extensions().get::<AttemptInfo>() {
        Some(info) => {
            assert!(info.hedge && info.number > 1, "{info:?}");
            info.number
        }
        None => 1,
    }
}

fn policies(policy: HedgePolicy) -> Policies {
    Policies::builder().service(SERVICE, policy).build()
}

fn request_to(path: &str) -> Req {
    Request::post(path)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap()
}

fn grpc_request() -> Req {
    request_to(METHOD)
}

/// A Trailers-Only OK.
fn grpc_ok() -> Res {
    trailers_only(Code::Ok, None)
}

/// Response headers with no status: a body follows, so the call is committed.
fn headers_only() -> Res {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(http_body_util::Empty::new())
        .unwrap()
}

fn marked(mut response: Res, attempt: u32) -> Res {
    response
        .headers_mut()
        .insert(MARK, HeaderValue::from(attempt));
    response
}

fn mark(response: &Res) -> Option<&str> {
    response.headers().get(MARK).map(|v| v.to_str().unwrap())
}

fn previous_attempts<B>(request: &Request<B>) -> Option<&str> {
    request
        .headers()
        .get("grpc-previous-rpc-attempts")
        .map(|v| v.to_str().unwrap())
}

fn attempts(response: &Res) -> Attempts {
    Attempts::of(response)
}

fn grpc_status(response: &Res) -> Option<&str> {
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap())
}

fn is_deadline_exceeded(error: &BoxError) -> bool {
    // Every error of a driven call is an `Attempted` around the last error.
    let error = tower_retry_hedge::error::last_error(error);
    if error
        .downcast_ref::<tower_retry_hedge::error::DeadlineExceeded>()
        .is_some()
    {
        return true;
    }
    #[cfg(feature = "tonic")]
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        return status.code() == tonic::Code::DeadlineExceeded;
    }
    false
}

/// Starts a call through the hedge layer over tower-test's mock; the test plays the
/// server through the handle.
fn call_mock(policies: Policies, request: Req) -> (CallHandle, Handle) {
    let (mock, handle) = mock::pair::<Req, Res>();
    let svc = HedgeLayer::new(policies).layer(mock);
    (tokio::spawn(svc.oneshot(request)), handle)
}

/// The next attempt, and how long after `start` it arrived.
async fn next(handle: &mut Handle, start: Instant) -> (Req, Reply, Duration) {
    let (request, reply) = handle.next_request().await.expect("an attempt");
    (request, reply, Instant::now() - start)
}

/// Moves every attempt that has arrived so far into `into`, keeping their replies alive
/// (a dropped reply would fail the attempt).
fn collect_arrived(handle: &mut Handle, into: &mut Vec<(Req, Reply)>) {
    while let Poll::Ready(Some(attempt)) = handle.poll_request() {
        into.push(attempt);
    }
}

/// Asserts that no further attempt reaches the mock, even after an hour.
async fn assert_no_more_attempts(handle: &mut Handle) {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        matches!(handle.poll_request(), Poll::Pending | Poll::Ready(None)),
        "an unexpected attempt was sent"
    );
}

/// Sets a drop flag unless disarmed: tells a cancelled attempt from one that answered.
struct DropFlag(Option<Arc<AtomicBool>>);

impl DropFlag {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// A hand-written mock whose attempt futures report their cancellation: each attempt
/// reaches the test as a [`Probed`], answered through its `reply`.
#[derive(Clone)]
struct Probe {
    arrivals: mpsc::UnboundedSender<Probed>,
}

/// One attempt as the [`Probe`] saw it.
struct Probed {
    request: Req,
    at: Instant,
    reply: oneshot::Sender<Result<Res, BoxError>>,
    cancelled: Arc<AtomicBool>,
}

impl Probed {
    fn number(&self) -> u32 {
        attempt_number(&self.request)
    }

    /// Whether the layer dropped the attempt before it answered.
    fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn answer(self, response: Res) {
        let number = self.number();
        // The attempt may have been cancelled already; then no one is listening.
        let _ = self.reply.send(Ok(marked(response, number)));
    }
}

impl Probe {
    fn new() -> (Probe, mpsc::UnboundedReceiver<Probed>) {
        let (arrivals, rx) = mpsc::unbounded_channel();
        (Probe { arrivals }, rx)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<Req> for Probe {
    type Response = Res;
    type Error = BoxError;
    type Future = BoxFuture<Result<Res, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let (reply, answer) = oneshot::channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(Some(cancelled.clone()));
        let _ = self.arrivals.send(Probed {
            request,
            at: Instant::now(),
            reply,
            cancelled,
        });
        Box::pin(async move {
            let result = answer.await;
            flag.disarm();
            result.unwrap_or_else(|_| Err("the test dropped the reply".into()))
        })
    }
}

/// A [`Probe`] that counts its clones and checks that each is polled ready before it is
/// called, as a tower `Buffer` (a tonic `Channel`) requires.
struct CloneCounted {
    probe: Probe,
    clones: Arc<AtomicUsize>,
    ready: bool,
}

impl Clone for CloneCounted {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::SeqCst);
        CloneCounted {
            probe: self.probe.clone(),
            clones: self.clones.clone(),
            ready: false,
        }
    }
}

impl tower::Service<Req> for CloneCounted {
    type Response = Res;
    type Error = BoxError;
    type Future = BoxFuture<Result<Res, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.ready = true;
        self.probe.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        self.probe.call(request)
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_clones_the_service_only_to_send_a_hedge() {
    use tower::Service;
    let (probe, mut arrivals) = Probe::new();
    let clones = Arc::new(AtomicUsize::new(0));
    let inner = CloneCounted {
        probe,
        clones: clones.clone(),
        ready: false,
    };
    let mut svc = HedgeLayer::new(policies(hedge(3, 50))).layer(inner);
    // Calls answered before their hedging delay: the layer's spare is the only clone.
    for _ in 0..5 {
        let call = tokio::spawn(svc.ready().await.unwrap().call(grpc_request()));
        next_probe(&mut arrivals).await.answer(grpc_ok());
        assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 1);
    }
    assert_eq!(clones.load(Ordering::SeqCst), 1);
    // A slow first attempt: the hedge goes to a clone of the spare, polled ready first.
    let call = tokio::spawn(svc.ready().await.unwrap().call(grpc_request()));
    let first = next_probe(&mut arrivals).await;
    let hedge = next_probe(&mut arrivals).await;
    assert_eq!((hedge.number(), hedge.at - first.at), (2, ms(50)));
    assert_eq!(clones.load(Ordering::SeqCst), 2);
    hedge.answer(grpc_ok());
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("2"));
    assert!(first.cancelled(), "the first attempt is cancelled");
}

/// Starts a call through the hedge layer over a [`Probe`].
fn call_probe(policies: Policies, request: Req) -> (CallHandle, mpsc::UnboundedReceiver<Probed>) {
    let (probe, arrivals) = Probe::new();
    let svc = HedgeLayer::new(policies).layer(probe);
    (tokio::spawn(svc.oneshot(request)), arrivals)
}

async fn next_probe(arrivals: &mut mpsc::UnboundedReceiver<Probed>) -> Probed {
    arrivals.recv().await.expect("an attempt")
}

async fn assert_no_more_probes(arrivals: &mut mpsc::UnboundedReceiver<Probed>) {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        arrivals.try_recv().is_err(),
        "an unexpected attempt was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn a6_timing_table_sends_one_more_attempt_every_delay() {
    // maxAttempts 4, hedgingDelay 500 ms, no answers: 1 outstanding at 1 ms, 2 at 501 ms,
    // 3 at 1001 ms, 4 at 1501 ms.
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(4, 500)), grpc_request());
    let mut outstanding = Vec::new();
    for (at, expected) in [
        (1, 1),
        (499, 1),
        (501, 2),
        (999, 2),
        (1001, 3),
        (1499, 3),
        (1501, 4),
    ] {
        sleep_until(start + ms(at)).await;
        collect_arrived(&mut handle, &mut outstanding);
        assert_eq!(
            outstanding.len(),
            expected,
            "attempts outstanding at {at} ms"
        );
    }
    assert_no_more_attempts(&mut handle).await;
    assert!(!call.is_finished());
}

#[tokio::test(start_paused = true)]
async fn zero_delay_sends_every_attempt_at_once() {
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(3, 0)), grpc_request());
    let mut replies = Vec::new();
    for n in 1..=3 {
        let (request, reply, at) = next(&mut handle, start).await;
        assert_eq!(at, Duration::ZERO, "attempt {n}");
        assert_eq!(attempt_number(&request), n);
        replies.push(reply);
    }
    assert_no_more_attempts(&mut handle).await;
    replies.pop().unwrap().send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Attempts::new(3, 0));
}

#[tokio::test(start_paused = true)]
async fn first_success_wins_and_cancels_every_other_attempt() {
    let start = Instant::now();
    let (call, mut arrivals) = call_probe(policies(hedge(3, 100)), grpc_request());
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;
    let third = next_probe(&mut arrivals).await;
    assert_eq!(
        [first.at, second.at, third.at].map(|t| t - start),
        [ms(0), ms(100), ms(200)]
    );

    sleep_until(start + ms(250)).await;
    second.answer(grpc_ok());
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("2"), "the winner is returned");
    assert_eq!(grpc_status(&response), Some("0"));
    assert_eq!(attempts(&response), Attempts::new(3, 0));
    // The retry attempts made (A6), not the winner's own count (grpc-java's): two hedges
    // went out after the first, though the second attempt won.
    assert_eq!(response.headers()["grpc-previous-rpc-attempts"], "2");
    assert!(first.cancelled(), "the first attempt was dropped");
    assert!(third.cancelled(), "the third attempt was dropped");
    assert_no_more_probes(&mut arrivals).await;
}

#[tokio::test(start_paused = true)]
async fn response_headers_commit_the_call_and_win() {
    let start = Instant::now();
    let (call, mut arrivals) = call_probe(policies(hedge(3, 100)), grpc_request());
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;

    sleep_until(start + ms(150)).await;
    first.answer(headers_only());
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("1"));
    assert_eq!(
        grpc_status(&response),
        None,
        "returned as it is, body to follow"
    );
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert!(second.cancelled());
    assert_no_more_probes(&mut arrivals).await;
}

#[tokio::test(start_paused = true)]
async fn non_fatal_failure_sends_the_next_hedge_at_once_then_resumes_the_delay() {
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(4, 500)), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(200)).await;
    first.send_response(trailers_only(Code::Unavailable, None));
    // At once, not at 500 ms; then 500 ms apart from there.
    let (_, _second, at2) = next(&mut handle, start).await;
    let (_, _third, at3) = next(&mut handle, start).await;
    let (_, fourth, at4) = next(&mut handle, start).await;
    assert_eq!([at2, at3, at4], [ms(200), ms(700), ms(1200)]);
    assert_no_more_attempts(&mut handle).await;
    fourth.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 4);
}

#[tokio::test(start_paused = true)]
async fn fatal_failure_cancels_the_rest_and_is_returned() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let policies = Policies::builder()
        .service(SERVICE, hedge(3, 100))
        .throttle(throttle.clone())
        .build();
    let start = Instant::now();
    let (call, mut arrivals) = call_probe(policies, grpc_request());
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;

    sleep_until(start + ms(150)).await;
    second.answer(trailers_only(Code::InvalidArgument, None));
    let response = call.await.unwrap().unwrap();
    assert_eq!(Instant::now() - start, ms(150));
    assert_eq!(grpc_status(&response), Some("3"));
    assert_eq!(mark(&response), Some("2"));
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert!(first.cancelled());
    assert_eq!(
        throttle.tokens(),
        10.0,
        "a fatal code is no throttle failure"
    );
    assert_no_more_probes(&mut arrivals).await;
}

#[tokio::test(start_paused = true)]
async fn pushback_stop_sends_no_more_hedges_but_those_in_flight_can_win() {
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(4, 500)), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    let (_, second, at2) = next(&mut handle, start).await;
    assert_eq!(at2, ms(500));

    sleep_until(start + ms(600)).await;
    second.send_response(trailers_only(Code::Unavailable, Some("-1")));
    // No hedge at 600 (the failure), 1000 or 1500 ms; the first attempt goes on.
    sleep_until(start + ms(5000)).await;
    assert!(matches!(handle.poll_request(), Poll::Pending));
    assert!(!call.is_finished());

    first.send_response(marked(grpc_ok(), 1));
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some("1"));
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn pushback_delays_the_next_hedge_and_later_ones_follow_at_the_delay() {
    // Pushback 700 ms at 100 ms: the next hedge at 800 ms (not the scheduled 500 ms), later
    // ones at 800 + 500 and 800 + 1000.
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(4, 500)), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(100)).await;
    first.send_response(trailers_only(Code::Unavailable, Some("700")));
    let (_, _second, at2) = next(&mut handle, start).await;
    let (_, _third, at3) = next(&mut handle, start).await;
    let (_, fourth, at4) = next(&mut handle, start).await;
    assert_eq!([at2, at3, at4], [ms(800), ms(1300), ms(1800)]);
    assert_no_more_attempts(&mut handle).await;
    fourth.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 4);
}

/// A throttle with `maxTokens` 10 and 0.1 per success, holding `tokens` whole tokens.
fn throttle_at(tokens: u32) -> Throttle {
    let throttle = Throttle::new(10, 0.1).unwrap();
    for _ in tokens..10 {
        throttle.on_failure();
    }
    assert_eq!(throttle.tokens(), f64::from(tokens));
    throttle
}

fn throttled(policy: HedgePolicy, throttle: &Throttle) -> Policies {
    Policies::builder()
        .service(SERVICE, policy)
        .throttle(throttle.clone())
        .build()
}

#[tokio::test(start_paused = true)]
async fn hedges_after_the_first_need_tokens_above_half() {
    // 6 tokens > 5: the second attempt goes. At exactly 5 the third does not; the first
    // attempt of a call always goes, even with no tokens at all.
    let throttle = throttle_at(6);
    let start = Instant::now();
    let (call, mut handle) = call_mock(throttled(hedge(3, 100), &throttle), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    let (_, _second, at2) = next(&mut handle, start).await;
    assert_eq!(at2, ms(100));
    throttle.on_failure(); // another call failed: 5 tokens
    sleep_until(start + ms(1000)).await;
    assert!(
        matches!(handle.poll_request(), Poll::Pending),
        "throttled at 5"
    );
    first.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 2);

    let empty = throttle_at(0);
    let (call, mut handle) = call_mock(throttled(hedge(3, 100), &empty), grpc_request());
    let (_, first, at) = next(&mut handle, Instant::now()).await;
    assert_eq!(at, Duration::ZERO);
    assert_no_more_attempts(&mut handle).await;
    first.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn non_fatal_failures_debit_the_throttle_and_success_credits_it() {
    let throttle = throttle_at(10);
    let start = Instant::now();
    let (call, mut handle) = call_mock(throttled(hedge(3, 500), &throttle), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(100)).await;
    first.send_response(trailers_only(Code::Unavailable, None));
    let (_, second, _) = next(&mut handle, start).await;
    second.send_response(trailers_only(Code::Unavailable, None));
    let (_, third, _) = next(&mut handle, start).await;
    tokio::task::yield_now().await;
    assert_eq!(throttle.tokens_milli(), 8_000, "two non-fatal failures");
    third.send_response(grpc_ok());
    call.await.unwrap().unwrap();
    assert_eq!(throttle.tokens_milli(), 8_100, "one success");
}

#[tokio::test(start_paused = true)]
async fn throttled_with_nothing_in_flight_returns_the_failure() {
    // 6 tokens: the failure at 100 ms leaves 5, so the next hedge may not go, and nothing
    // else is in flight.
    let throttle = throttle_at(6);
    let start = Instant::now();
    let (call, mut handle) = call_mock(throttled(hedge(3, 500), &throttle), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(100)).await;
    first.send_response(trailers_only(Code::Unavailable, None));
    let response = call.await.unwrap().unwrap();
    assert_eq!(Instant::now() - start, ms(100), "returned at once");
    assert_eq!(grpc_status(&response), Some("14"));
    assert_eq!(attempts(&response), Attempts::new(1, 0));
    assert_eq!(throttle.tokens(), 5.0);
    assert_no_more_attempts(&mut handle).await;
}

type BoxReq = Request<BoxBody<Bytes, BoxError>>;

/// A hand-written mock that reads each attempt's request body as a transport would: frame
/// by frame, failing the attempt if the body fails. Attempt `n` stops reading (without
/// ending) once it has `stall_at[n]` bytes.
///
/// With `pump_in_task`, each body is read by a task of its own, as hyper's connection task
/// sends a request body, and the attempt's future only waits for its answer: the body
/// commits the call from that task, and only the layer's cancellation ends the future.
#[derive(Clone)]
struct BodyReader {
    arrivals: mpsc::UnboundedSender<BodyAttempt>,
    stall_at: Arc<HashMap<u32, usize>>,
    pump_in_task: bool,
}

/// One attempt as the [`BodyReader`] saw it.
struct BodyAttempt {
    number: u32,
    received: Arc<Mutex<Vec<u8>>>,
    /// The body failed with [`NotReplayable`]: the call was committed to another attempt.
    cut_off: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    reply: Option<oneshot::Sender<Res>>,
}

impl BodyAttempt {
    /// Answers the attempt (once).
    fn answer(&mut self, response: Res) {
        let reply = self.reply.take().expect("answered once");
        let _ = reply.send(response);
    }

    fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }
}

/// Reads `body` frame by frame into `received`, stopping for good at `stall_at` bytes.
async fn read_body(
    mut body: BoxBody<Bytes, BoxError>,
    received: Arc<Mutex<Vec<u8>>>,
    stall_at: usize,
    cut_off: Arc<AtomicBool>,
) -> Result<(), BoxError> {
    loop {
        if received.lock().unwrap().len() >= stall_at {
            std::future::pending::<()>().await;
        }
        match body.frame().await {
            None => return Ok(()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    received.lock().unwrap().extend_from_slice(&data);
                }
            }
            Some(Err(error)) => {
                cut_off.store(error.is::<NotReplayable>(), Ordering::SeqCst);
                return Err(error);
            }
        }
    }
}

impl tower::Service<BoxReq> for BodyReader {
    type Response = Res;
    type Error = BoxError;
    type Future = BoxFuture<Result<Res, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: BoxReq) -> Self::Future {
        let number = attempt_number(&request);
        let stall_at = self.stall_at.get(&number).copied().unwrap_or(usize::MAX);
        let received = Arc::new(Mutex::new(Vec::new()));
        let cut_off = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(Some(cancelled.clone()));
        let (reply, answer) = oneshot::channel();
        let _ = self.arrivals.send(BodyAttempt {
            number,
            received: received.clone(),
            cut_off: cut_off.clone(),
            cancelled,
            reply: Some(reply),
        });
        let read = read_body(request.into_body(), received, stall_at, cut_off);
        if self.pump_in_task {
            tokio::spawn(read);
            return Box::pin(async move {
                let response = answer.await;
                flag.disarm();
                response.map_err(|_| "the test dropped the reply".into())
            });
        }
        Box::pin(async move {
            if let Err(error) = read.await {
                flag.disarm();
                return Err(error);
            }
            let response = answer.await;
            flag.disarm();
            response.map_err(|_| "the test dropped the reply".into())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn body_overflow_commits_to_the_attempt_that_sent_the_most() {
    // 8 bytes per call. Attempt 1 stalls after 4 bytes; attempts 2 and 3 read on. The chunk
    // that takes the body past 8 bytes commits the call to the attempt that pulls it: it
    // goes on alone and receives the whole body; the others are cancelled, and no fourth
    // hedge starts. Every failure is fatal here, so an excluded attempt's failure must not
    // be taken for the call's result.
    let limits = BufferLimits::new(8, 1024);
    let policy = HedgePolicy::builder()
        .max_attempts(4)
        .delay(ms(100))
        .build()
        .unwrap();
    let policies = Policies::builder()
        .service(SERVICE, policy)
        .buffer_limits(limits.clone())
        .build();
    let (arrivals, mut attempts_seen) = mpsc::unbounded_channel();
    let svc = HedgeLayer::new(policies).layer(BodyReader {
        arrivals,
        stall_at: Arc::new(HashMap::from([(1, 4)])),
        pump_in_task: false,
    });
    let (chunks, source) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(8);
    let body = StreamBody::new(ReceiverStream::new(source)).boxed();
    let request = Request::post(METHOD)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap();
    let send = |data: &'static str| {
        chunks
            .try_send(Ok(Frame::data(Bytes::from_static(data.as_bytes()))))
            .unwrap();
    };

    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(request));
    let first = attempts_seen.recv().await.unwrap();
    send("aaaa");
    sleep_until(start + ms(100)).await;
    let second = attempts_seen.recv().await.unwrap();
    sleep_until(start + ms(150)).await;
    send("bbbb");
    sleep_until(start + ms(200)).await;
    let third = attempts_seen.recv().await.unwrap();
    assert_eq!([first.number, second.number, third.number], [1, 2, 3]);
    sleep_until(start + ms(201)).await;
    assert_eq!(first.received(), b"aaaa");
    assert_eq!(second.received(), b"aaaabbbb");
    assert_eq!(third.received(), b"aaaabbbb");
    assert_eq!(limits.in_use(), 8);

    sleep_until(start + ms(250)).await;
    send("cccc");
    sleep_until(start + ms(251)).await;
    let (winner, loser) = if second.received().len() == 12 {
        (&second, &third)
    } else {
        (&third, &second)
    };
    assert_eq!(winner.received(), b"aaaabbbbcccc");
    assert!(!winner.cancelled() && !winner.cut_off());
    assert!(
        first.cancelled(),
        "the attempt that sent less is cancelled at once"
    );
    assert!(
        loser.cancelled() || loser.cut_off(),
        "the other attempt at the front is cancelled"
    );
    assert_eq!(limits.in_use(), 0, "the record is freed on commit");
    assert!(!call.is_finished(), "the committed attempt goes on");

    // No fourth hedge (it was due at 300 ms).
    sleep_until(start + ms(1000)).await;
    assert!(attempts_seen.try_recv().is_err());
    send("dddd");
    drop(chunks);
    sleep_until(start + ms(1001)).await;
    assert_eq!(
        winner.received(),
        b"aaaabbbbccccdddd",
        "the whole body, intact"
    );
    let winner_number = winner.number;
    let mut winner = if winner_number == 2 { second } else { third };
    winner.answer(marked(grpc_ok(), winner_number));
    let response = call.await.unwrap().unwrap();
    assert_eq!(mark(&response), Some(winner_number.to_string().as_str()));
    assert_eq!(attempts(&response), Attempts::new(3, 0));
    assert_eq!(limits.in_use(), 0);
}

#[tokio::test(start_paused = true)]
async fn all_failed_non_fatally_returns_the_last_failure_once_all_are_done() {
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(3, 0)), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    let (_, second, _) = next(&mut handle, start).await;
    let (_, third, _) = next(&mut handle, start).await;
    let unavailable = |n| marked(trailers_only(Code::Unavailable, None), n);
    second.send_response(unavailable(2));
    sleep_until(start + ms(10)).await;
    assert!(!call.is_finished(), "two attempts still in flight");
    third.send_response(unavailable(3));
    sleep_until(start + ms(20)).await;
    assert!(!call.is_finished(), "one attempt still in flight");
    first.send_response(unavailable(1));
    let response = call.await.unwrap().unwrap();
    assert_eq!(Instant::now() - start, ms(20));
    assert_eq!(mark(&response), Some("1"), "the last to finish");
    assert_eq!(grpc_status(&response), Some("14"));
    assert_eq!(attempts(&response), Attempts::new(3, 0));
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn deadline_spans_all_hedges_and_drops_every_attempt() {
    let mut request = grpc_request();
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("700m"));
    let start = Instant::now();
    let (call, mut arrivals) = call_probe(policies(hedge(3, 500)), request);
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;
    assert_eq!(second.at - start, ms(500));
    assert_eq!(first.request.headers()["grpc-timeout"], "700m");
    assert_eq!(
        second.request.headers()["grpc-timeout"],
        "200m",
        "the time left"
    );

    let error = call.await.unwrap().unwrap_err();
    assert!(is_deadline_exceeded(&error), "{error}");
    assert_eq!(Instant::now() - start, ms(700));
    assert!(first.cancelled() && second.cancelled());
    // The third hedge would have gone at 1000 ms.
    assert_no_more_probes(&mut arrivals).await;
}

#[tokio::test(start_paused = true)]
async fn hedges_carry_attempt_metadata_and_share_tried_backends() {
    let start = Instant::now();
    let policy = HedgePolicy::builder()
        .max_attempts(4)
        .delay(ms(100))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .track_backends(true)
        .build()
        .unwrap();
    let (call, mut handle) = call_mock(policies(policy), grpc_request());
    let mut replies = Vec::new();
    let mut backends = Vec::new();
    for n in 1..=4u32 {
        let (request, reply, _) = next(&mut handle, start).await;
        let expected = (n > 1).then(|| (n - 1).to_string());
        assert_eq!(
            previous_attempts(&request),
            expected.as_deref(),
            "attempt {n}"
        );
        let expected = (n > 1).then_some(AttemptInfo {
            number: n,
            hedge: true,
        });
        assert_eq!(request.extensions().get::<AttemptInfo>(), expected.as_ref());
        // The balancer's view: every backend earlier attempts recorded, then its own pick.
        let tried = request
            .extensions()
            .get::<TriedBackends>()
            .expect("TriedBackends extension");
        assert_eq!(tried.list(), backends, "attempt {n} sees the earlier picks");
        let backend = format!("10.0.0.{n}:443");
        tried.record(backend.clone());
        backends.push(backend);
        replies.push(reply);
    }
    replies.pop().unwrap().send_response(grpc_ok());
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response), Attempts::new(4, 0));
    assert_eq!(response.headers()["grpc-previous-rpc-attempts"], "3");
}

#[tokio::test(start_paused = true)]
async fn statistics_count_the_first_attempt_as_original_and_hedges_as_retries() {
    let policies = policies(hedge(3, 100));
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies.clone(), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    let (_, second, _) = next(&mut handle, start).await;
    let (_, third, _) = next(&mut handle, start).await;
    sleep_until(start + ms(250)).await;
    second.send_response(trailers_only(Code::Unavailable, None)); // a hedge failed
    sleep_until(start + ms(260)).await;
    first.send_response(trailers_only(Code::Unavailable, None)); // the original failed
    sleep_until(start + ms(270)).await;
    third.send_response(grpc_ok());
    call.await.unwrap().unwrap();

    let snapshot = policies.stats().snapshot();
    let method = &snapshot.methods[METHOD];
    assert_eq!(method.retry_attempts, 2);
    assert_eq!(method.retry_failures, 1);
    assert_eq!(method.histogram, [1, 1, 0, 0, 0, 0, 0, 0]);

    // A call won by its first attempt before any hedge adds nothing.
    let (call, mut handle) = call_mock(policies.clone(), grpc_request());
    let (_, first, _) = next(&mut handle, Instant::now()).await;
    first.send_response(grpc_ok());
    call.await.unwrap().unwrap();
    assert_eq!(policies.stats().snapshot().methods[METHOD], *method);
}

#[tokio::test(start_paused = true)]
async fn a_pending_hedge_waits_for_capacity_and_is_sent_when_it_appears() {
    let (mock, mut handle) = mock::pair::<Req, Res>();
    handle.allow(1);
    let svc = HedgeLayer::new(policies(hedge(3, 500))).layer(mock);
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(grpc_request()));
    let (_, _first, at1) = next(&mut handle, start).await;
    assert_eq!(at1, Duration::ZERO);
    // Due at 500 ms, but the service has no capacity: it waits in poll_ready.
    sleep_until(start + ms(5000)).await;
    assert!(matches!(handle.poll_request(), Poll::Pending));
    handle.allow(1);
    let (_, _second, at2) = next(&mut handle, start).await;
    assert_eq!(at2, ms(5000), "sent as soon as capacity appears");
    // The next one is due 500 ms after that send, and waits again.
    sleep_until(start + ms(6000)).await;
    assert!(matches!(handle.poll_request(), Poll::Pending));
    handle.allow(1);
    let (_, third, at3) = next(&mut handle, start).await;
    assert_eq!(at3, ms(6000));
    third.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_pending_hedge_holds_no_permit_of_a_concurrency_limit() {
    // Two permits. Call A takes one at 0 ms; call B takes the other at 100 ms, which it could
    // not if A's pending hedge held a permit. A's hedge, due at 500 ms, gets the permit B
    // frees at 550 ms.
    let (mock, mut handle) = mock::pair::<Req, Res>();
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies(hedge(2, 500))))
        .concurrency_limit(2)
        .service(mock);
    let call_of = |request: &Req| request.headers()["x-call"].to_str().unwrap().to_owned();
    let tagged = |call: &'static str| {
        let mut request = grpc_request();
        request
            .headers_mut()
            .insert("x-call", HeaderValue::from_static(call));
        request
    };
    let start = Instant::now();
    let a = tokio::spawn(svc.clone().oneshot(tagged("a")));
    let (a1, _a1_reply, _) = next(&mut handle, start).await;
    assert_eq!(call_of(&a1), "a");
    sleep_until(start + ms(100)).await;
    let b = tokio::spawn(svc.clone().oneshot(tagged("b")));
    let (b1, b1_reply, at) = next(&mut handle, start).await;
    assert_eq!((call_of(&b1).as_str(), at), ("b", ms(100)));

    sleep_until(start + ms(550)).await;
    assert!(matches!(handle.poll_request(), Poll::Pending), "no permit");
    b1_reply.send_response(grpc_ok());
    b.await.unwrap().unwrap();
    let (a2, a2_reply, at) = next(&mut handle, start).await;
    assert_eq!((call_of(&a2).as_str(), at), ("a", ms(550)));
    a2_reply.send_response(grpc_ok());
    assert_eq!(attempts(&a.await.unwrap().unwrap()).sent(), 2);
}

/// Retries UNAVAILABLE up to `max_attempts`, the first retry 100 ms after a failure.
fn retry_after_100ms(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_attempts(max_attempts)
        .backoff(Exponential::new(ms(100), ms(1000), 2.0, Jitter::None).unwrap())
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retry_methods_pass_through_the_hedge_layer_and_hedge_methods_through_the_retry_layer() {
    let retry = retry_after_100ms(3);
    let policies = Policies::builder()
        .method("test.Echo/Retried", retry)
        .method("test.Echo/Hedged", hedge(2, 500))
        .build();
    let (mock, mut handle) = mock::pair::<Req, Res>();
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .layer(RetryLayer::new(policies))
        .service(mock);

    // Retried: no hedge while the first attempt hangs for a second; one retry after its
    // 100 ms backoff.
    let start = Instant::now();
    let call = tokio::spawn(svc.clone().oneshot(request_to("/test.Echo/Retried")));
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(1000)).await;
    assert!(matches!(handle.poll_request(), Poll::Pending), "not hedged");
    first.send_response(trailers_only(Code::Unavailable, None));
    let (second, reply, at) = next(&mut handle, start).await;
    assert_eq!(at, ms(1100));
    assert_eq!(
        second.extensions().get::<AttemptInfo>(),
        Some(&AttemptInfo {
            number: 2,
            hedge: false
        })
    );
    reply.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Attempts::new(2, 0));

    // Hedged: the failure sends the next hedge at once (not after a retry backoff), and the
    // retry layer retries neither attempt.
    let start = Instant::now();
    let call = tokio::spawn(svc.oneshot(request_to("/test.Echo/Hedged")));
    let (_, first, _) = next(&mut handle, start).await;
    sleep_until(start + ms(100)).await;
    first.send_response(trailers_only(Code::Unavailable, None));
    let (second, reply, at) = next(&mut handle, start).await;
    assert_eq!(at, ms(100));
    assert_eq!(
        second.extensions().get::<AttemptInfo>(),
        Some(&AttemptInfo {
            number: 2,
            hedge: true
        })
    );
    reply.send_response(trailers_only(Code::Unavailable, None));
    let response = call.await.unwrap().unwrap();
    assert_eq!(grpc_status(&response), Some("14"));
    assert_eq!(attempts(&response), Attempts::new(2, 0));
    assert_no_more_attempts(&mut handle).await;
}

#[tokio::test(start_paused = true)]
async fn a_layer_passes_through_only_while_the_layer_above_calls_it() {
    let retry = retry_after_100ms(3);
    let policies = Policies::builder()
        .method("test.Echo/Retried", retry)
        .build();
    let (mock, mut handle) = mock::pair::<Req, Res>();
    let alone = RetryLayer::new(policies.clone()).layer(mock);
    let stacked = HedgeLayer::new(policies).layer(alone.clone());

    let start = Instant::now();
    let call = tokio::spawn(stacked.oneshot(request_to("/test.Echo/Retried")));
    let (_, reply, _) = next(&mut handle, start).await;
    reply.send_response(grpc_ok());
    call.await.unwrap().unwrap();

    // The same thread, after the stacked call: the layer alone drives its call again.
    let start = Instant::now();
    let call = tokio::spawn(alone.oneshot(request_to("/test.Echo/Retried")));
    let (_, first, _) = next(&mut handle, start).await;
    first.send_response(trailers_only(Code::Unavailable, None));
    let (_, reply, at) = next(&mut handle, start).await;
    assert_eq!(at, ms(100));
    reply.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Attempts::new(2, 0));
}

#[tokio::test(start_paused = true)]
async fn adaptive_delay_uses_its_fallback_then_follows_the_percentile() {
    let adaptive = AdaptiveDelay::builder()
        .percentile(0.5)
        .window(Duration::from_secs(10))
        .bounds(ms(1), ms(1000))
        .min_samples(5)
        .fallback(ms(300))
        .build()
        .unwrap();
    let policy = HedgePolicy::builder()
        .max_attempts(2)
        .adaptive_delay(adaptive.clone())
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let policies = policies(policy);

    // No samples: the fallback. The hedge wins 40 ms after it was sent: one sample.
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies.clone(), grpc_request());
    let (_, _first, _) = next(&mut handle, start).await;
    let (_, second, at) = next(&mut handle, start).await;
    assert_eq!(at, ms(300));
    sleep_until(start + ms(340)).await;
    second.send_response(grpc_ok());
    call.await.unwrap().unwrap();

    // Four more calls answered in 40 ms: five samples, enough.
    for _ in 0..4 {
        let begun = Instant::now();
        let (call, mut handle) = call_mock(policies.clone(), grpc_request());
        let (_, first, _) = next(&mut handle, begun).await;
        sleep_until(begun + ms(40)).await;
        first.send_response(grpc_ok());
        call.await.unwrap().unwrap();
    }
    // Past the slot the first estimate was cached for.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let expected = adaptive.current();
    assert!(
        expected >= ms(40) && expected <= ms(44),
        "p50 of 40 ms: {expected:?}"
    );

    let start = Instant::now();
    let (call, mut handle) = call_mock(policies, grpc_request());
    let (_, _first, _) = next(&mut handle, start).await;
    let (_, second, at) = next(&mut handle, start).await;
    // The timer wheel rounds up to the millisecond.
    assert!(
        at >= expected && at < expected + ms(1),
        "{at:?} vs {expected:?}"
    );
    second.send_response(grpc_ok());
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_cancels_every_attempt_and_sends_no_more() {
    let start = Instant::now();
    let (call, mut arrivals) = call_probe(policies(hedge(4, 100)), grpc_request());
    let first = next_probe(&mut arrivals).await;
    let second = next_probe(&mut arrivals).await;
    sleep_until(start + ms(150)).await;
    assert!(!first.cancelled() && !second.cancelled());
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(first.cancelled() && second.cancelled());
    assert_no_more_probes(&mut arrivals).await;
}

#[tokio::test(start_paused = true)]
async fn a_delay_too_large_for_the_clock_means_no_hedge_and_no_panic() {
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(Duration::MAX)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(policy), grpc_request());
    let (_, first, _) = next(&mut handle, start).await;
    // A non-fatal failure sends the next hedge at once; the one after would be due "never".
    first.send_response(trailers_only(Code::Unavailable, None));
    let (_, second, at) = next(&mut handle, start).await;
    assert_eq!(at, Duration::ZERO);
    assert_no_more_attempts(&mut handle).await;
    second.send_response(grpc_ok());
    assert_eq!(attempts(&call.await.unwrap().unwrap()).sent(), 2);
}

#[tokio::test(start_paused = true)]
async fn tried_backends_are_on_by_default_and_off_when_asked() {
    // By default a hedged call's attempts share one record (A6: distinct backends).
    let start = Instant::now();
    let (call, mut handle) = call_mock(policies(hedge(2, 0)), grpc_request());
    let mut records = Vec::new();
    for _ in 0..2 {
        let (request, reply, _) = next(&mut handle, start).await;
        let tried = request.extensions().get::<TriedBackends>().cloned();
        records.push(tried.expect("a record on every attempt"));
        reply.send_response(grpc_ok());
    }
    records[0].record("10.0.0.1:443".to_owned());
    assert_eq!(records[1].list(), ["10.0.0.1:443"], "one record, shared");
    call.await.unwrap().unwrap();

    // A record the request brings is the one every attempt shares.
    let own = TriedBackends::default();
    let mut request = grpc_request();
    request.extensions_mut().insert(own.clone());
    let (call, mut handle) = call_mock(policies(hedge(2, 0)), request);
    for n in 1..=2 {
        let (request, reply, _) = next(&mut handle, start).await;
        let tried = request.extensions().get::<TriedBackends>().cloned();
        tried
            .expect("the request's record")
            .record(format!("10.0.0.{n}:443"));
        reply.send_response(grpc_ok());
    }
    assert_eq!(
        own.list(),
        ["10.0.0.1:443", "10.0.0.2:443"],
        "the request's own"
    );
    call.await.unwrap().unwrap();

    // `track_backends(false)` drops it.
    let policy = HedgePolicy::builder()
        .max_attempts(2)
        .delay(ms(0))
        .track_backends(false)
        .build()
        .unwrap();
    let (call, mut handle) = call_mock(policies(policy), grpc_request());
    for _ in 0..2 {
        let (request, reply, _) = next(&mut handle, start).await;
        assert!(request.extensions().get::<TriedBackends>().is_none());
        reply.send_response(grpc_ok());
    }
    call.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_hedge_budget_caps_the_extra_load_when_every_call_turns_slow() {
    // Every call takes 100 ms; a 2 ms hedging delay would send 3 copies of each. A budget of
    // 10 % of the calls over 10 s, no floor, lets one hedge in ten calls through.
    let budget = tower_retry_hedge::throttle::HedgeBudget::new(Duration::from_secs(10), 0, 0.1)
        .expect("valid budget");
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(2))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget)
        .build()
        .unwrap();
    let policies = Policies::builder().method(METHOD, policy).build();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let slow = tower::service_fn(move |_: Req| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(ms(100)).await;
            Ok::<_, BoxError>(grpc_ok())
        }
    });
    let svc = HedgeLayer::new(policies.clone()).layer(slow);
    let calls = 50;
    for _ in 0..calls {
        let response = svc.clone().oneshot(grpc_request()).await.unwrap();
        assert_eq!(grpc_status(&response), Some("0"));
    }
    let hedges = requests.load(Ordering::SeqCst) - calls;
    // 50 calls earn 5 hedges; without the budget there would be 100.
    assert!(hedges <= 5, "{hedges} hedges");
    assert!(
        hedges >= 4,
        "the budget lets its share through: {hedges} hedges"
    );
    let snapshot = policies.stats().snapshot();
    let method = &snapshot.methods[METHOD];
    // Each call had one hedge refused: the first, or for the calls that hedged, the second.
    assert_eq!(method.hedges_over_budget as usize, calls);
}
