//! The future of one call, for both layers. It does IO and nothing else: it reports what
//! happened to the [engine](crate::engine) (the timer fired, the body committed, an attempt
//! answered, the service failed) and carries out what the engine asks (send, cancel, end).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use rand::RngCore;
use rand::rngs::ThreadRng;
use tokio::time::Sleep;
use tower_service::Service;

use super::{Call, Shared};
use crate::BoxError;
use crate::body::Replay;
use crate::classify::AttemptResult;
use crate::engine::{Action, AttemptId, End, Engine, Inputs, Marks, Send, Verdict};
use crate::error::{Attempted, attempt_timed_out, deadline_exceeded};
use crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS_NAME;
use crate::stats::{MethodStats, Stats};
use crate::telemetry::{AttemptFields, AttemptSpans};

pin_project! {
    /// The future of a call through either layer.
    #[project = CallFutureProj]
    pub(crate) enum CallFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // A call this layer does not drive: the inner future as it is.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // A call the engine runs.
        Driven {
            #[pin]
            driver: Driver<S, B>,
        },
    }
}

impl<S, B> CallFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        CallFuture::Passthrough { future }
    }

    pub(crate) fn driven(driver: Driver<S, B>) -> Self {
        CallFuture::Driven { driver }
    }
}

impl<S, B, RB> Future for CallFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CallFutureProj::Passthrough { future } => future.poll(cx).map_err(Into::into),
            CallFutureProj::Driven { driver } => driver.poll(cx),
        }
    }
}

/// An attempt after the first: boxed, so that the list can grow and shrink under it.
struct Attempt<F> {
    id: AttemptId,
    sent_at: std::time::Instant,
    future: Pin<Box<F>>,
}

pin_project! {
    /// A call the engine runs.
    #[project = DriverProj]
    pub(crate) struct Driver<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // The first attempt, in place: a call answered by it allocates nothing more than
        // the box of the rest.
        #[pin]
        first: Option<S::Future>,
        // Boxed: a few hundred bytes, which a future would otherwise carry (and copy) through
        // every layer above it.
        state: Box<State<S, B>>,
    }

    impl<S, B> PinnedDrop for Driver<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // The call's metrics are recorded once, when it ends: returned or dropped.
        fn drop(this: Pin<&mut Self>) {
            #[cfg(feature = "opentelemetry")]
            record_metrics(this.project().state);
            #[cfg(not(feature = "opentelemetry"))]
            let _ = this;
        }
    }
}

/// Records what a call did in the table's metrics. A call of one attempt records nothing:
/// the success path stops at the first test.
#[cfg(feature = "opentelemetry")]
fn record_metrics<S, B>(state: &State<S, B>)
where
    S: Service<Request<B>>,
    B: Replay,
{
    if let Some(counts) = state.engine.extra()
        && let Some(metrics) = state.shared.policies.metrics()
    {
        metrics.record(&counts, &state.call.labels(state.stats.route.as_ref()));
    }
}

/// What a call keeps besides its first attempt.
struct State<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    // When the first attempt was sent, for a hedging delay that learns from latencies:
    // stamped at the first poll, and only for such a delay.
    first_sent_at: Option<std::time::Instant>,
    // The attempts after the first, in the order they were sent.
    others: Vec<Attempt<S::Future>>,
    // The one timer, at the earliest time the engine asks for. Made when the call first waits.
    timer: Option<Pin<Box<Sleep>>>,
    // A clone of the spare service for the later attempts, polled ready only when one is
    // due, so a pending attempt holds no capacity.
    service: Option<S>,
    shared: Arc<Shared<S>>,
    call: Call<B>,
    engine: Engine,
    // The last failure kept, returned if nothing better comes. Boxed: only a call that
    // failed once keeps one, and the response type is large to carry in every call.
    last: Option<Box<Result<S::Response, BoxError>>>,
    stats: StatsHandle,
    span: tracing::Span,
    // The attempts' spans, made at the first poll if the call's span is enabled.
    spans: Option<Box<AttemptSpans>>,
}

/// The statistics of a call's method (its path) or route (its name), looked up when the
/// first retry needs them.
pub(crate) struct StatsHandle {
    route: Option<Arc<str>>,
    method: Option<Arc<MethodStats>>,
}

impl StatsHandle {
    pub(crate) fn new(route: Option<Arc<str>>) -> StatsHandle {
        StatsHandle {
            route,
            method: None,
        }
    }

    fn get(&mut self, stats: &Stats, path: &str) -> &MethodStats {
        let key = self.route.as_deref().unwrap_or(path);
        self.method.get_or_insert_with(|| stats.method(key))
    }
}

impl<S, B> Driver<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// A call whose first attempt, `first`, was just sent.
    pub(crate) fn new(
        first: S::Future,
        shared: Arc<Shared<S>>,
        call: Call<B>,
        engine: Engine,
        stats: StatsHandle,
        span: tracing::Span,
    ) -> Self {
        let state = State {
            first_sent_at: None,
            others: Vec::new(),
            timer: None,
            service: None,
            shared,
            call,
            engine,
            last: None,
            stats,
            spans: None,
            span,
        };
        Driver {
            first: Some(first),
            state: Box::new(state),
        }
    }
}

/// The thread's random generator, taken only when the engine draws a jitter.
#[derive(Default)]
struct LazyRng(Option<ThreadRng>);

impl RngCore for LazyRng {
    fn next_u32(&mut self) -> u32 {
        self.0.get_or_insert_with(rand::rng).next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.0.get_or_insert_with(rand::rng).next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.get_or_insert_with(rand::rng).fill_bytes(dest)
    }
}

type Output<RB> = Result<Response<RB>, BoxError>;

impl<S, B, RB> Driver<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output<RB>> {
        let mut this = self.project();
        let span = this.state.span.clone();
        let _enter = span.enter();
        if this.state.spans.is_none() && !span.is_disabled() {
            this.state.spans = AttemptSpans::of_call(&span);
        }
        let read = || tokio::time::Instant::now().into_std();
        let mut rng = LazyRng::default();
        let mut inputs = Inputs::new(&read, &mut rng);
        if this.state.engine.adaptive_delay().is_some() && this.state.first_sent_at.is_none() {
            this.state.first_sent_at = Some(inputs.now());
        }
        loop {
            // Events in a fixed order: the timer (the deadline wins over an answer ready in
            // the same poll), the body's commit (seen before any answer), then the answers.
            if poll_timer(&mut this.state.timer, cx) {
                inputs.reset();
                this.state.engine.on_timer(&mut inputs);
            }
            if let Poll::Ready(reader) = this.state.call.poll_committed(cx) {
                this.state.engine.on_commit(reader);
            }
            if let Some(result) = poll_attempts(&mut this, &mut inputs, cx) {
                return Poll::Ready(result);
            }
            match act(&mut this, &mut inputs, cx) {
                Some(Step::Done(result)) => return Poll::Ready(result),
                Some(Step::Again) => continue,
                None => return Poll::Pending,
            }
        }
    }
}

enum Step<T> {
    /// Something changed (an attempt was sent or the timer fired): look again.
    Again,
    Done(T),
}

type Proj<'a, S, B> = DriverProj<'a, S, B>;

/// Polls every attempt in flight, and feeds each answer to the engine; gives the call's
/// result if an answer ends it.
fn poll_attempts<S, B, RB>(
    this: &mut Proj<'_, S, B>,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Option<Output<RB>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    if let Some(first) = this.first.as_mut().as_pin_mut() {
        let spans = this.state.spans.as_deref();
        let entered = spans.and_then(|s| s.enter(AttemptId::FIRST.send));
        let polled = first.poll(cx);
        drop(entered);
        if let Poll::Ready(result) = polled {
            this.first.set(None);
            let sent_at = this.state.first_sent_at;
            let done = answer(this, AttemptId::FIRST, sent_at, result, inputs);
            if done.is_some() {
                return done;
            }
        }
    }
    let mut i = 0;
    while let Some(attempt) = this.state.others.get_mut(i) {
        let spans = this.state.spans.as_deref();
        let entered = spans.and_then(|s| s.enter(attempt.id.send));
        let polled = attempt.future.as_mut().poll(cx);
        drop(entered);
        let Poll::Ready(result) = polled else {
            i += 1;
            continue;
        };
        let Attempt { id, sent_at, .. } = this.state.others.remove(i);
        let done = answer(this, id, Some(sent_at), result, inputs);
        if done.is_some() {
            return done;
        }
    }
    None
}

/// Carries out the engine's actions until it waits (`None`) or ends the call.
fn act<S, B, RB>(
    this: &mut Proj<'_, S, B>,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Option<Step<Output<RB>>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    loop {
        match this.state.engine.poll(inputs) {
            Action::Send(send) => match send_attempt(this, send, inputs, cx) {
                Sent::Yes | Sent::No => return Some(Step::Again),
                Sent::NotReady => return None,
                Sent::Failed(result) => return Some(Step::Done(*result)),
            },
            Action::Cancel => {
                let engine = &this.state.engine;
                if this.first.is_some() && !engine.is_live(AttemptId::FIRST) {
                    this.first.set(None);
                }
                this.state.others.retain(|a| engine.is_live(a.id));
                if let Some(spans) = &mut this.state.spans {
                    spans.cancelled(|send| !engine.is_live_send(send));
                }
            }
            Action::TimedOut(id) => {
                if id == AttemptId::FIRST {
                    this.first.set(None);
                } else {
                    this.state.others.retain(|a| a.id != id);
                }
                if let Some(spans) = &mut this.state.spans {
                    spans.timed_out(id.send);
                }
                let error = attempt_timed_out(this.state.engine.grpc());
                this.state.last = Some(Box::new(Err(error)));
            }
            Action::End(end) => return Some(Step::Done(end_call(this, end))),
            Action::Wait(at) => {
                if !arm(&mut this.state.timer, at, cx) {
                    return None;
                }
                inputs.reset();
                this.state.engine.on_timer(inputs);
            }
        }
    }
}

/// How a send went.
enum Sent<T> {
    Yes,
    /// The engine did not let it go, or the body could not be copied: ask the engine again.
    No,
    /// The service is not ready; the call is woken when it is, or at the engine's next time.
    NotReady,
    /// The service failed with nothing in flight: the call's result.
    Failed(T),
}

/// Sends `send` on the call's own service once it is ready.
fn send_attempt<S, B, RB>(
    this: &mut Proj<'_, S, B>,
    send: Send,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Sent<Box<Output<RB>>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    let state = &mut **this.state;
    let service = state.service.get_or_insert_with(|| state.shared.service());
    match service.poll_ready(cx) {
        Poll::Pending => {
            // The engine's later times still run while the service is not ready.
            if arm(&mut state.timer, state.engine.wake_after(inputs.now()), cx) {
                inputs.reset();
                state.engine.on_timer(inputs);
                return Sent::No;
            }
            return Sent::NotReady;
        }
        Poll::Ready(Err(error)) => {
            state.service = None;
            if state.engine.on_service_error() {
                let marks = state.engine.marks(None);
                return Sent::Failed(Box::new(finish(
                    Err(error.into()),
                    marks,
                    state.engine.grpc(),
                )));
            }
            return Sent::No;
        }
        Poll::Ready(Ok(())) => {}
    }
    if !state.engine.admit(send) {
        return Sent::No;
    }
    let sent = state.engine.attempts().sent();
    let deadline = state.engine.deadline();
    let Some((request, reader)) = state.call.request(send, sent, deadline, inputs.now()) else {
        // The body committed itself while the call waited.
        if let Some(reader) = state.call.committed_reader() {
            state.engine.on_commit(reader);
        }
        return Sent::No;
    };
    let future = service.call(request);
    let id = state.engine.on_sent(send, reader, inputs);
    if !send.transparent {
        let path = state.call.path();
        let stats = state.stats.get(state.shared.policies.stats(), path);
        stats.record_retry(id.number - 1);
    }
    state.span.record("http.request.resend_count", id.send - 1);
    crate::telemetry::hedge_sent(id.send, send.hedge && !send.transparent);
    if let Some(spans) = &mut state.spans {
        let fields = AttemptFields {
            send: id.send,
            previous: id.number - 1,
            transparent: send.transparent,
            hedge: send.hedge,
        };
        spans.sent(&state.span, fields);
    }
    let future = Box::pin(future);
    let sent_at = inputs.now();
    state.others.push(Attempt {
        id,
        sent_at,
        future,
    });
    Sent::Yes
}

/// The call's result when no answer was returned.
fn end_call<S, B, RB>(this: &mut Proj<'_, S, B>, end: End) -> Output<RB>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Replay,
{
    this.first.set(None);
    this.state.others.clear();
    let engine = &this.state.engine;
    let (result, from) = match end {
        End::Last(id) => {
            let last = this.state.last.take();
            (
                last.map_or_else(|| Err(no_result()), |last| *last),
                Some(id),
            )
        }
        End::DeadlineExceeded => (Err(deadline_exceeded(engine.grpc())), None),
    };
    finish(result, engine.marks(from), engine.grpc())
}

/// Polls the call's timer; tells whether it has fired.
fn poll_timer(timer: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> bool {
    timer
        .as_mut()
        .is_some_and(|timer| timer.as_mut().poll(cx).is_ready())
}

/// Sets the call's timer to fire at `at` and polls it; tells whether it has fired.
fn arm(
    timer: &mut Option<Pin<Box<Sleep>>>,
    at: Option<std::time::Instant>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(at) = at else {
        return false;
    };
    let at = tokio::time::Instant::from_std(at);
    let timer = match timer {
        Some(timer) => {
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            timer
        }
        None => timer.insert(Box::pin(tokio::time::sleep_until(at))),
    };
    timer.as_mut().poll(cx).is_ready()
}

/// Feeds one attempt's answer to the engine; gives the call's result if it ends with it.
fn answer<S, B, RB>(
    this: &mut Proj<'_, S, B>,
    id: AttemptId,
    sent_at: Option<std::time::Instant>,
    result: Result<Response<RB>, S::Error>,
    inputs: &mut Inputs<'_>,
) -> Option<Output<RB>>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Replay,
{
    let result = result.map_err(Into::into);
    let view = match &result {
        Ok(response) => AttemptResult::Response {
            status: response.status(),
            headers: response.headers(),
        },
        Err(error) => AttemptResult::Error(&**error),
    };
    let state = &mut **this.state;
    let outcome = state.engine.classifier().classify(view);
    if let Some(spans) = &mut state.spans {
        spans.answered(id.send, &outcome);
    }
    let verdict = state
        .engine
        .on_answer(id, outcome, view, &state.call, inputs);
    for _ in 0..state.engine.take_retry_failures() {
        let path = state.call.path();
        let stats = state.stats.get(state.shared.policies.stats(), path);
        stats.record_retry_failure();
    }
    match verdict {
        Verdict::Return => {
            if let (true, Some(delay), Some(sent_at)) =
                (result.is_ok(), state.engine.adaptive_delay(), sent_at)
            {
                delay.record(inputs.now().saturating_duration_since(sent_at));
            }
            this.first.set(None);
            state.others.clear();
            let grpc = state.engine.grpc();
            Some(finish(result, state.engine.marks(Some(id)), grpc))
        }
        Verdict::Keep => {
            state.last = Some(Box::new(result));
            None
        }
        Verdict::Drop => None,
    }
}

/// The call's result, marked as the engine says when it made more than one attempt: an
/// [`Attempts`](crate::metadata::Attempts) response extension and, for gRPC, the result's
/// attempt's `grpc-previous-rpc-attempts`; or an [`Attempted`] error around the last error.
/// Like that header (A6: "it will not be present on the first RPC"), a call of one attempt
/// is returned as it is, so the success path allocates nothing.
fn finish<RB>(result: Output<RB>, marks: Option<Marks>, grpc: bool) -> Output<RB> {
    let Some(marks) = marks else {
        return result;
    };
    match result {
        Ok(mut response) => {
            if grpc && marks.previous > 0 {
                response.headers_mut().insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    http::HeaderValue::from(marks.previous),
                );
            }
            response.extensions_mut().insert(marks.attempts);
            Ok(response)
        }
        Err(error) => Err(mark_error(error, marks)),
    }
}

/// A gRPC status keeps its type (tonic's client reads it as it is) and carries the count as
/// A6's `grpc-previous-rpc-attempts` metadata; any other error is wrapped in [`Attempted`].
fn mark_error(error: BoxError, marks: Marks) -> BoxError {
    #[cfg(feature = "tonic")]
    let error = match error.downcast::<tonic::Status>() {
        Ok(mut status) => {
            if marks.previous > 0 {
                status.metadata_mut().insert(
                    crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS,
                    tonic::metadata::MetadataValue::from(marks.previous),
                );
            }
            return status;
        }
        Err(error) => error,
    };
    Box::new(Attempted::new(error, marks.attempts))
}

/// The error for a call that ends with no attempt result to return. The engine keeps a
/// failure before it ends a call with it, so this is a bug.
fn no_result() -> BoxError {
    "no attempt result left to return".into()
}
