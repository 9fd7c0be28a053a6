//! A scripted source body, wakers that count, and helpers to poll bodies by hand.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tower_retry_hedge::body::{BoxError, NotReplayable};

/// One step of a [`Script`].
#[derive(Clone, Debug)]
pub enum Step {
    /// A data frame.
    Data(Bytes),
    /// `Pending` until the test opens the script's [`Gate`] once.
    Wait,
    /// `Pending` once, waking the poller at once (as a body that yields would).
    Yield,
    /// A trailers frame; must come last.
    Trailers(HeaderMap),
    /// An error; must come last.
    Fail(&'static str),
}

/// The error a [`Script`] fails with.
#[derive(Debug, PartialEq, Eq)]
pub struct SourceError(pub &'static str);

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "source failed: {}", self.0)
    }
}

impl std::error::Error for SourceError {}

/// Opens the `Wait` steps of a [`Script`] from outside.
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<Mutex<GateState>>);

#[derive(Debug, Default)]
struct GateState {
    opened: usize,
    waker: Option<Waker>,
    waiting: bool,
}

impl Gate {
    /// Lets one `Wait` step pass and wakes the task that polled the source last.
    pub fn open(&self) {
        let waker = {
            let mut state = self.0.lock().unwrap();
            state.opened += 1;
            state.waiting = false;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Lets one `Wait` step pass without waking anyone: only a poll will find out.
    pub fn open_silently(&self) {
        let mut state = self.0.lock().unwrap();
        state.opened += 1;
        state.waiting = false;
    }

    /// Whether the source body still exists.
    pub fn source_alive(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }

    /// Whether the source is parked at a `Wait` step.
    pub fn is_waiting(&self) -> bool {
        self.0.lock().unwrap().waiting
    }
}

/// A source body that plays a list of steps.
#[derive(Debug)]
pub struct Script {
    steps: VecDeque<Step>,
    gate: Gate,
    /// Report an exact size hint (the data bytes left) and `is_end_stream` when empty;
    /// otherwise behave like a stream body that knows nothing about itself.
    exact: bool,
    remaining: u64,
    ended: bool,
}

impl Script {
    pub fn new(steps: Vec<Step>, exact: bool) -> (Script, Gate) {
        let remaining = steps
            .iter()
            .map(|step| match step {
                Step::Data(data) => data.len() as u64,
                _ => 0,
            })
            .sum();
        let gate = Gate::default();
        let script = Script {
            steps: steps.into(),
            gate: gate.clone(),
            exact,
            remaining,
            ended: false,
        };
        (script, gate)
    }

    /// A script of data chunks only.
    pub fn data(chunks: &[&'static [u8]]) -> Script {
        let steps = chunks
            .iter()
            .map(|chunk| Step::Data(Bytes::from_static(chunk)))
            .collect();
        Script::new(steps, true).0
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = SourceError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SourceError>>> {
        assert!(!self.ended, "source polled after it ended");
        loop {
            let Some(step) = self.steps.pop_front() else {
                self.ended = true;
                return Poll::Ready(None);
            };
            match step {
                Step::Data(data) => {
                    self.remaining -= data.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Step::Wait => {
                    let mut gate = self.gate.0.lock().unwrap();
                    if gate.opened > 0 {
                        gate.opened -= 1;
                        continue;
                    }
                    gate.waker = Some(cx.waker().clone());
                    gate.waiting = true;
                    drop(gate);
                    self.steps.push_front(Step::Wait);
                    return Poll::Pending;
                }
                Step::Yield => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Step::Trailers(trailers) => {
                    self.ended = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Step::Fail(message) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(SourceError(message))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.exact && (self.ended || self.steps.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub struct Count(AtomicUsize);

impl Count {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn counting_waker() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count::default());
    (Arc::clone(&count), Waker::from(count))
}

pub type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// Polls `body` once with `waker`.
pub fn poll<B: Body<Data = Bytes, Error = BoxError> + Unpin>(
    body: &mut B,
    waker: &Waker,
) -> Polled {
    Pin::new(body).poll_frame(&mut Context::from_waker(waker))
}

/// Polls `body` once with a no-op waker.
pub fn poll_noop<B: Body<Data = Bytes, Error = BoxError> + Unpin>(body: &mut B) -> Polled {
    poll(body, Waker::noop())
}

/// The data of a polled frame, or a panic naming what came instead.
pub fn expect_data(polled: Polled) -> Bytes {
    match polled {
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) => data,
            Err(frame) => panic!("expected data, got {frame:?}"),
        },
        other => panic!("expected data, got {other:?}"),
    }
}

/// The trailers of a polled frame, or a panic naming what came instead.
pub fn expect_trailers(polled: Polled) -> HeaderMap {
    match polled {
        Poll::Ready(Some(Ok(frame))) => match frame.into_trailers() {
            Ok(trailers) => trailers,
            Err(frame) => panic!("expected trailers, got {frame:?}"),
        },
        other => panic!("expected trailers, got {other:?}"),
    }
}

/// The error of a polled frame, or a panic naming what came instead.
pub fn expect_error(polled: Polled) -> BoxError {
    match polled {
        Poll::Ready(Some(Err(error))) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The `NotReplayable` of a polled frame, or a panic naming what came instead.
pub fn expect_not_replayable(polled: Polled) -> NotReplayable {
    let error = expect_error(polled);
    match error.downcast::<NotReplayable>() {
        Ok(error) => *error,
        Err(error) => panic!("expected NotReplayable, got {error}"),
    }
}

/// Asserts the poll was the end of the body.
pub fn expect_end(polled: Polled) {
    assert!(
        matches!(polled, Poll::Ready(None)),
        "expected the end, got {polled:?}"
    );
}

/// What a reader sent, read to its end with no-op wakers.
#[derive(Debug, Default, PartialEq)]
pub struct Collected {
    pub data: Vec<u8>,
    pub chunks: Vec<Bytes>,
    pub trailers: Option<HeaderMap>,
}

/// Reads `body` to its end, assuming it never waits.
pub fn drain<B: Body<Data = Bytes, Error = BoxError> + Unpin>(
    body: &mut B,
) -> Result<Collected, BoxError> {
    let mut collected = Collected::default();
    loop {
        match poll_noop(body) {
            Poll::Ready(None) => return Ok(collected),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    collected.data.extend_from_slice(&data);
                    collected.chunks.push(data);
                }
                Err(frame) => {
                    collected.trailers = Some(frame.into_trailers().expect("a trailers frame"))
                }
            },
            Poll::Ready(Some(Err(error))) => return Err(error),
            Poll::Pending => panic!("drain: the body waited"),
        }
    }
}

/// Trailers with one header.
pub fn trailers(value: &'static str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static(value));
    trailers
}
