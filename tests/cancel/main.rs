//! Cancellation: dropping a call's response future at every state it can be in leaves
//! nothing behind: no attempt in flight (the probe service counts its attempts with drop
//! guards), no task, no request body source, and no byte of the replay buffer.
//!
//! Every call goes through the full stack, `HedgeLayer` over `RetryLayer`, with one retried
//! and one hedged method. The futures are polled by hand, on tokio's paused clock, so the
//! test decides exactly when each one is dropped.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::sync::mpsc;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_hedge::backoff::{Exponential, Jitter};
use tower_retry_hedge::classify::{Code, GrpcCodes};
use tower_retry_hedge::{
    BoxError, BufferLimits, HedgeLayer, HedgePolicy, Policies, RetryLayer, RetryPolicy,
};

type Body = BoxBody<Bytes, BoxError>;
type Req = Request<Body>;
type Res = Response<http_body_util::Empty<Bytes>>;

const RETRIED: &str = "/test.Echo/Retried";
const HEDGED: &str = "/test.Echo/Hedged";
const BACKOFF: Duration = Duration::from_millis(100);
const HEDGE_DELAY: Duration = Duration::from_millis(10);

/// What the probe does with one attempt.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Never answers.
    Hang,
    /// Reads this many body frames, then never answers.
    ReadThenHang(usize),
    /// Reads the whole body, then answers with this status (Trailers-Only).
    ReadThenFail(Code),
}

/// The inner service: plays a script of behaviours, one per attempt, and counts the attempts
/// started and those still alive (a guard in each attempt's future).
#[derive(Clone)]
struct Probe(Arc<ProbeState>);

struct ProbeState {
    script: Mutex<VecDeque<Behaviour>>,
    started: AtomicUsize,
    live: AtomicUsize,
    /// Body frames read, over all attempts.
    frames: AtomicUsize,
}

impl Probe {
    fn new(script: impl IntoIterator<Item = Behaviour>) -> Probe {
        Probe(Arc::new(ProbeState {
            script: Mutex::new(script.into_iter().collect()),
            started: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            frames: AtomicUsize::new(0),
        }))
    }

    fn started(&self) -> usize {
        self.0.started.load(Ordering::SeqCst)
    }

    fn live(&self) -> usize {
        self.0.live.load(Ordering::SeqCst)
    }

    fn frames(&self) -> usize {
        self.0.frames.load(Ordering::SeqCst)
    }
}

/// Counts one live attempt for as long as it exists.
struct Live(Arc<ProbeState>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Service<Req> for Probe {
    type Response = Res;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Res, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let state = Arc::clone(&self.0);
        state.started.fetch_add(1, Ordering::SeqCst);
        state.live.fetch_add(1, Ordering::SeqCst);
        // The guard exists from the call on, so an attempt that is never polled counts too.
        let live = Live(Arc::clone(&state));
        let behaviour = state
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Behaviour::Hang);
        Box::pin(async move {
            let _live = live;
            let mut body = request.into_body();
            let frames = match behaviour {
                Behaviour::Hang => 0,
                Behaviour::ReadThenHang(n) => n,
                Behaviour::ReadThenFail(_) => usize::MAX,
            };
            for _ in 0..frames {
                match body.frame().await {
                    Some(Ok(_)) => {
                        state.frames.fetch_add(1, Ordering::SeqCst);
                    }
                    Some(Err(error)) => return Err(error),
                    None => break,
                }
            }
            match behaviour {
                Behaviour::ReadThenFail(code) => Ok(Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", code.header_value())
                    .body(http_body_util::Empty::new())
                    .unwrap()),
                _ => std::future::pending().await,
            }
        })
    }
}

/// The request body's source: chunks sent by the test, and a flag telling it was dropped.
struct Source {
    chunks: mpsc::UnboundedSender<Bytes>,
    alive: Arc<()>,
}

impl Source {
    fn send(&self, chunk: &'static str) {
        self.chunks
            .send(Bytes::from_static(chunk.as_bytes()))
            .unwrap();
    }

    /// Ends the body.
    fn finish(self) -> Arc<()> {
        self.alive
    }

    fn dropped(alive: &Arc<()>) -> bool {
        Arc::strong_count(alive) == 1
    }
}

/// The request body: the chunks the test sends, with no size hint.
struct SourceBody {
    chunks: mpsc::UnboundedReceiver<Bytes>,
    _alive: Arc<()>,
}

impl http_body::Body for SourceBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// A streaming request body fed by the test, boxed as hyper users box theirs.
fn streaming_request(path: &str) -> (Req, Source) {
    let (chunks, receiver) = mpsc::unbounded_channel::<Bytes>();
    let alive = Arc::new(());
    let body = SourceBody {
        chunks: receiver,
        _alive: Arc::clone(&alive),
    }
    .boxed();
    let request = Request::post(path)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap();
    (request, Source { chunks, alive })
}

fn policies() -> Policies {
    let retry = RetryPolicy::builder()
        .max_attempts(4)
        .backoff(Exponential::new(BACKOFF, Duration::from_secs(1), 2.0, Jitter::None).unwrap())
        .retryable(GrpcCodes::from([Code::Unavailable]))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let hedge = HedgePolicy::builder()
        .max_attempts(3)
        .delay(HEDGE_DELAY)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    Policies::builder()
        .method(RETRIED, retry)
        .method(HEDGED, hedge)
        .buffer_limits(BufferLimits::new(64 * 1024, 1024 * 1024))
        .build()
}

type Stack = tower_retry_hedge::Hedge<tower_retry_hedge::Retry<Probe>>;

fn stack(policies: &Policies, probe: &Probe) -> Stack {
    ServiceBuilder::new()
        .layer(HedgeLayer::new(policies.clone()))
        .layer(RetryLayer::new(policies.clone()))
        .service(probe.clone())
}

/// Polls `future` once, from inside the test's task.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// Polls `future` (letting other tasks run in between) until `reached` holds; panics if the
/// call ends first.
async fn poll_until<F>(future: &mut F, mut reached: impl FnMut() -> bool)
where
    F: Future<Output = Result<Res, BoxError>> + Unpin,
{
    for _ in 0..100 {
        if let Poll::Ready(result) = poll_once(future).await {
            panic!("the call ended early: {:?}", result.map(|r| r.status()));
        }
        if reached() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the state was never reached");
}

/// What must hold once a call's future is dropped.
#[track_caller]
fn assert_nothing_left(probe: &Probe, policies: &Policies, tasks: usize) {
    assert_eq!(probe.live(), 0, "an attempt is still in flight");
    assert_eq!(
        policies.buffer_limits().in_use(),
        0,
        "the replay buffer still holds bytes"
    );
    let metrics = tokio::runtime::Handle::current().metrics();
    assert_eq!(metrics.num_alive_tasks(), tasks, "a task was left behind");
}

/// Long after the drop, nothing new starts either.
async fn assert_nothing_starts(probe: &Probe, started: usize) {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        probe.started(),
        started,
        "an attempt started after the call was dropped"
    );
    assert_eq!(probe.live(), 0);
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn dropped_before_the_first_poll() {
    for path in [RETRIED, HEDGED] {
        let (policies, probe) = (policies(), Probe::new([Behaviour::Hang]));
        let tasks = alive_tasks();
        let mut svc = stack(&policies, &probe);
        let (request, source) = streaming_request(path);
        source.send("never read");
        let future = Box::pin(svc.ready().await.unwrap().call(request));
        // The layers hand the first attempt to the service at once; it is never polled.
        assert_eq!(probe.started(), 1, "{path}");
        drop(future);
        assert_nothing_left(&probe, &policies, tasks);
        assert!(
            Source::dropped(&source.finish()),
            "{path}: the body source is still alive"
        );
        assert_nothing_starts(&probe, 1).await;
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_with_the_first_attempt_in_flight() {
    for path in [RETRIED, HEDGED] {
        let (policies, probe) = (policies(), Probe::new([Behaviour::ReadThenHang(1)]));
        let tasks = alive_tasks();
        let mut svc = stack(&policies, &probe);
        let (request, source) = streaming_request(path);
        source.send("first chunk");
        let mut future = Box::pin(svc.ready().await.unwrap().call(request));
        poll_until(&mut future, || probe.frames() == 1).await;
        assert_eq!(probe.live(), 1);
        assert!(
            policies.buffer_limits().in_use() > 0,
            "the first chunk is recorded"
        );
        drop(future);
        assert_nothing_left(&probe, &policies, tasks);
        assert!(
            Source::dropped(&source.finish()),
            "{path}: the body source is still alive"
        );
        assert_nothing_starts(&probe, 1).await;
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_while_sleeping_in_backoff() {
    let (policies, probe) = (
        policies(),
        Probe::new([Behaviour::ReadThenFail(Code::Unavailable)]),
    );
    let tasks = alive_tasks();
    let mut svc = stack(&policies, &probe);
    let (request, source) = streaming_request(RETRIED);
    source.send("whole ");
    source.send("body");
    let alive = source.finish();
    let mut future = Box::pin(svc.ready().await.unwrap().call(request));
    poll_until(&mut future, || probe.live() == 0).await;
    // Half-way through the backoff: the failed attempt is over, the next not yet sent, and
    // the body is kept for it.
    tokio::time::advance(BACKOFF / 2).await;
    assert!(poll_once(&mut future).await.is_pending());
    assert_eq!((probe.started(), probe.live()), (1, 0));
    assert_eq!(policies.buffer_limits().in_use(), "whole body".len());
    drop(future);
    assert_nothing_left(&probe, &policies, tasks);
    assert!(Source::dropped(&alive), "the body source is still alive");
    assert_nothing_starts(&probe, 1).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_with_hedges_in_flight_and_one_more_due() {
    let probe = Probe::new([Behaviour::ReadThenHang(2), Behaviour::ReadThenHang(2)]);
    let policies = policies();
    let tasks = alive_tasks();
    let mut svc = stack(&policies, &probe);
    let (request, source) = streaming_request(HEDGED);
    source.send("ab");
    source.send("cd");
    let mut future = Box::pin(svc.ready().await.unwrap().call(request));
    poll_until(&mut future, || probe.frames() == 2).await;
    tokio::time::advance(HEDGE_DELAY).await;
    // The second hedge replays the record; the third is due in another HEDGE_DELAY.
    poll_until(&mut future, || probe.frames() == 4).await;
    assert_eq!((probe.started(), probe.live()), (2, 2));
    assert_eq!(policies.buffer_limits().in_use(), 4);
    drop(future);
    assert_nothing_left(&probe, &policies, tasks);
    assert!(
        Source::dropped(&source.finish()),
        "the body source is still alive"
    );
    assert_nothing_starts(&probe, 2).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_mid_body_replay() {
    // Attempt 1 reads the whole body and fails; attempt 2 replays one chunk of three.
    let probe = Probe::new([
        Behaviour::ReadThenFail(Code::Unavailable),
        Behaviour::ReadThenHang(1),
    ]);
    let policies = policies();
    let tasks = alive_tasks();
    let mut svc = stack(&policies, &probe);
    let (request, source) = streaming_request(RETRIED);
    for chunk in ["one ", "two ", "three"] {
        source.send(chunk);
    }
    let alive = source.finish();
    let mut future = Box::pin(svc.ready().await.unwrap().call(request));
    poll_until(&mut future, || probe.started() == 1 && probe.live() == 0).await;
    tokio::time::advance(BACKOFF).await;
    poll_until(&mut future, || probe.frames() == 4).await;
    assert_eq!((probe.started(), probe.live()), (2, 1));
    assert_eq!(policies.buffer_limits().in_use(), "one two three".len());
    drop(future);
    assert_nothing_left(&probe, &policies, tasks);
    assert!(Source::dropped(&alive), "the body source is still alive");
    assert_nothing_starts(&probe, 2).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_mid_body_of_the_first_attempt_while_the_source_waits() {
    for path in [RETRIED, HEDGED] {
        // The attempt reads one chunk and waits for the next, which never comes.
        let (policies, probe) = (policies(), Probe::new([Behaviour::ReadThenHang(3)]));
        let tasks = alive_tasks();
        let mut svc = stack(&policies, &probe);
        let (request, source) = streaming_request(path);
        source.send("only chunk so far");
        let mut future = Box::pin(svc.ready().await.unwrap().call(request));
        poll_until(&mut future, || probe.frames() == 1).await;
        assert!(poll_once(&mut future).await.is_pending());
        assert_eq!(probe.live(), 1);
        drop(future);
        assert_nothing_left(&probe, &policies, tasks);
        // The source's sender is still held by the test: only the body side is gone.
        let alive = source.finish();
        assert!(
            Source::dropped(&alive),
            "{path}: the body source is still alive"
        );
        assert_nothing_starts(&probe, 1).await;
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_after_a_failed_hedge_with_the_others_in_flight() {
    // The second attempt fails non-fatally, so the third goes at once; the first and the
    // third are in flight when the call is dropped.
    let probe = Probe::new([Behaviour::Hang, Behaviour::ReadThenFail(Code::Unavailable)]);
    let policies = policies();
    let tasks = alive_tasks();
    let mut svc = stack(&policies, &probe);
    let (request, source) = streaming_request(HEDGED);
    source.send("x");
    let alive = source.finish();
    let mut future = Box::pin(svc.ready().await.unwrap().call(request));
    assert!(poll_once(&mut future).await.is_pending());
    tokio::time::advance(HEDGE_DELAY).await;
    // The second attempt fails at once; a third goes straight after it.
    poll_until(&mut future, || probe.started() == 3).await;
    assert_eq!(probe.live(), 2);
    drop(future);
    assert_nothing_left(&probe, &policies, tasks);
    assert!(Source::dropped(&alive), "the body source is still alive");
    assert_nothing_starts(&probe, 3).await;
}
