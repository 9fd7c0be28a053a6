//! The future of one call through the layer (`RetryLayer` and `HedgeLayer` are one type): the
//! tower driver of the [engine](crate::engine). It reports what happened (the timer fired,
//! the body committed, an attempt answered, the service was ready or failed) and carries out
//! what the engine asks (send, post, cancel, time out, end); around that it keeps the
//! attempts in flight, the kept last answer, the call's trace and its books.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::attempt::{Attempt, First};
use super::marks::{finish, no_result};
use super::{Call, LayerShared, LazyRng};
use crate::body::Replay;
use crate::classify::AttemptResult;
use crate::engine::{
    Action, Admission, AttemptId, AttemptMarks, Books, Dispatch, End, Engine, Inputs, Readiness,
    Verdict,
};
use crate::error::BoxError;
use crate::error::{attempt_timed_out, deadline_exceeded};
use crate::resets::Stop;

use crate::telemetry::CallTrace;

pin_project! {
    /// A call the engine runs.
    #[project = DriverProj]
    pub(crate) struct Driver<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // The first attempt: in place where the call never stops it while it runs, so that
        // a call answered by it allocates nothing more than the box of the rest.
        #[pin]
        first: First<S::Future>,
        // Boxed: a few hundred bytes, which a future would otherwise carry (and copy) through
        // every layer above it.
        state: Box<CallExtras<S, B>>,
    }

    impl<S, B> PinnedDrop for Driver<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // The call's books are closed once, when it ends: returned or dropped. A call
        // dropped by its caller resets every attempt in flight, which the table's limit of
        // stream resets counts.
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let in_flight = usize::from(this.first.is_some())
                + this.state.later.as_ref().map_or(0, |later| later.attempts.len());
            if in_flight > 0 {
                this.state.shared.policies.stream_resets().count_resets(in_flight);
            }
            this.state.close();
        }
    }
}

/// What a call keeps once its first attempt is not enough: boxed, so that a call answered
/// by its first attempt carries one word for it.
struct LaterAttempts<S, B>
where
    S: Service<Request<B>>,
{
    // The attempts after the first, in the order they were sent.
    attempts: Vec<Attempt<S::Future>>,
    // A clone of the spare service, polled ready only when an attempt is due, so a pending
    // attempt holds no capacity.
    service: Option<S>,
    // The last failure kept, returned if nothing better comes.
    last: Option<Result<S::Response, BoxError>>,
}

impl<S, B> CallExtras<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// Closes the call's books (see [`Engine::close`]).
    fn close(&mut self) {
        let (shared, call, route) = (&self.shared, &self.call, self.planned.route);
        self.engine.close(|| books(shared, call, route))
    }

    /// Drops an answer the call does not return (a failure kept before a later one, an
    /// answer that came in after the call was decided): a response whose body has not ended
    /// resets its stream, which the table's limit of stream resets counts.
    fn drop_answer<RB, E>(&self, answer: Option<Result<Response<RB>, E>>)
    where
        RB: http_body::Body,
    {
        if let Some(Ok(response)) = &answer
            && !response.body().is_end_stream()
        {
            self.shared.policies.stream_resets().count_resets(1);
        }
    }

    /// Stops attempt `id`, which the call no longer needs (`future`, if it can be moved):
    /// resets its stream by dropping it, or lets it finish on a task of its own, as the
    /// table's limit of stream resets says (see `crate::resets`).
    fn stop<RB>(&self, id: AttemptId, future: Option<Pin<Box<S::Future>>>)
    where
        S: Service<Request<B>, Response = Response<RB>>,
        S::Future: Send + 'static,
        RB: http_body::Body + Send + 'static,
    {
        let resets = self.shared.policies.stream_resets();
        let can_finish = future.is_some() && self.call.every_attempt_may_finish();
        let stop = resets.stop(can_finish);
        if stop == Stop::Reset {
            return;
        }
        let stats = books(&self.shared, &self.call, self.planned.route).method_stats();
        stop.record(&stats);
        if let (Stop::Finish, Some(future)) = (stop, future) {
            tracing::debug!(attempt = id.send, "attempt let finish");
            crate::resets::let_finish(resets, future, self.planned.deadline, stats);
        }
    }
}

impl<S, B> LaterAttempts<S, B>
where
    S: Service<Request<B>>,
{
    /// What the call keeps in `slot` beyond its first attempt, made when it first needs it.
    fn of(slot: &mut Option<Box<LaterAttempts<S, B>>>) -> &mut LaterAttempts<S, B> {
        slot.get_or_insert_with(|| {
            Box::new(LaterAttempts {
                attempts: Vec::new(),
                service: None,
                last: None,
            })
        })
    }
}

/// What a call keeps besides its first attempt.
pub(crate) struct CallExtras<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    // The attempts after the first and their service, once the call sends a second one.
    later: Option<Box<LaterAttempts<S, B>>>,
    // The one timer, at the earliest time the engine asks for. Made when the call first waits.
    timer: Option<Pin<Box<Sleep>>>,
    shared: Arc<LayerShared<S>>,
    call: Call<B>,
    engine: Engine,
    planned: Planned,
    // The call's span and its attempts', if the call's span is enabled.
    trace: CallTrace,
}

impl<S, B> CallExtras<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// What a call keeps besides its first attempt, boxed.
    pub(crate) fn new(
        shared: Arc<LayerShared<S>>,
        call: Call<B>,
        engine: Engine,
        planned: Planned,
        span: tracing::Span,
    ) -> Box<Self> {
        Box::new(CallExtras {
            later: None,
            timer: None,
            shared,
            call,
            engine,
            planned,
            trace: CallTrace::of_call(span),
        })
    }
}

impl<S, B> Driver<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// A call whose first attempt, `first`, was just sent; the engine may stop that attempt
    /// while it runs if `may_stop_first` (see [`Start::may_stop_first`]).
    ///
    /// [`Start::may_stop_first`]: crate::engine::Start::may_stop_first
    pub(crate) fn new(
        first: S::Future,
        state: Box<CallExtras<S, B>>,
        may_stop_first: bool,
    ) -> Self {
        // Boxed only where it may have to be let finish.
        let paced = state.shared.policies.stream_resets().per_second().is_some();
        Driver {
            first: First::new(first, paced && may_stop_first),
            state,
        }
    }
}

type Output<RB> = Result<Response<RB>, BoxError>;

/// The service below the layer as the driver needs it: the bounds of the layer's `Service`
/// impl (but `Clone`, which only sending an attempt needs), written once. Its
/// answers are `Response<RB>`, its errors convert into `BoxError`, and its futures may be let
/// finish on a task of their own.
pub(crate) trait Below<B, RB>:
    Service<Request<B>, Response = Response<RB>, Error: Into<BoxError>, Future: Send + 'static>
{
}

impl<S, B, RB> Below<B, RB> for S where
    S: Service<Request<B>, Response = Response<RB>, Error: Into<BoxError>, Future: Send + 'static>
{
}

// `Response = Response<RB>` spelled out: an impl's type parameter is constrained only so.
impl<S, B, RB> Future for Driver<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Below<B, RB> + Clone,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    type Output = Output<RB>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output<RB>> {
        let mut this = self.project();
        let span = this.state.trace.call().cloned();
        let _enter = span.as_ref().map(tracing::Span::enter);
        let read = || tokio::time::Instant::now().into_std();
        let mut rng = LazyRng::default();
        let mut inputs = Inputs::new(&read, &mut rng);
        loop {
            // Events in a fixed order: the timer (the deadline wins over an answer ready in
            // the same poll), the body's commit (seen before any answer), then the answers.
            if poll_timer(&mut this.state.timer, cx) {
                inputs.timer_fired();
            }
            if let Poll::Ready(reader) = this.state.call.poll_committed(cx) {
                this.state.engine.on_commit(reader);
            }
            if let Some(result) = poll_attempts(&mut this, &mut inputs, cx) {
                return Poll::Ready(result);
            }
            match act(&mut this, &mut inputs, cx) {
                Some(Progress::Done(result)) => return Poll::Ready(result),
                Some(Progress::Again) => continue,
                None => return Poll::Pending,
            }
        }
    }
}

enum Progress<T> {
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
    S: Below<B, RB> + Clone,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    if this.first.is_some() {
        let entered = this.state.trace.enter(AttemptId::FIRST);
        let polled = this.first.as_mut().poll(cx);
        drop(entered);
        if let Some(Poll::Ready(result)) = polled {
            this.first.set(First::Gone);
            let done = answer(this, AttemptId::FIRST, result, inputs);
            if done.is_some() {
                return done;
            }
        }
    }
    let mut i = 0;
    while let Some(attempt) = this
        .state
        .later
        .as_mut()
        .and_then(|l| l.attempts.get_mut(i))
    {
        let entered = this.state.trace.enter(attempt.id);
        let polled = attempt.future.as_mut().poll(cx);
        drop(entered);
        let Poll::Ready(result) = polled else {
            i += 1;
            continue;
        };
        let later = this.state.later.as_mut().expect("polled above");
        let Attempt { id, .. } = later.attempts.remove(i);
        let done = answer(this, id, result, inputs);
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
) -> Option<Progress<Output<RB>>>
where
    S: Below<B, RB> + Clone,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    loop {
        match this.state.engine.poll(inputs) {
            Action::Send(send) => match send_attempt(this, send, inputs, cx) {
                Sent::Yes | Sent::No => return Some(Progress::Again),
                Sent::NotReady => return None,
                Sent::Failed(result) => return Some(Progress::Done(*result)),
            },
            Action::Post(records) => {
                let state = &**this.state;
                books(&state.shared, &state.call, state.planned.route).post(&records);
            }
            Action::Cancel(kept) => {
                let state = &mut **this.state;
                let keep = |id: AttemptId| Some(id) == kept;
                for (id, future) in take_attempts(this.first.as_mut(), &mut state.later, keep) {
                    state.stop(id, future);
                }
                state.trace.cancelled(kept);
            }
            Action::TimedOut(id) => {
                let state = &mut **this.state;
                let stopped = take_attempts(this.first.as_mut(), &mut state.later, |a| a != id);
                for (id, future) in stopped {
                    state.stop(id, future);
                }
                this.state.trace.timed_out(id);
                let error = attempt_timed_out(this.state.planned.grpc);
                LaterAttempts::of(&mut this.state.later).last = Some(Err(error));
            }
            Action::End(end, marks) => return Some(Progress::Done(end_call(this, end, marks))),
            Action::Wait(at) => {
                if !arm(&mut this.state.timer, at, cx) {
                    return None;
                }
                inputs.timer_fired();
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
    send: Dispatch,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Sent<Box<Output<RB>>>
where
    S: Below<B, RB> + Clone,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let state = &mut **this.state;
    let (readiness, error) = match poll_service(state, cx) {
        Poll::Ready(Ok(())) => (Readiness::Ready, None),
        Poll::Pending => (Readiness::Pending, None),
        Poll::Ready(Err(error)) => (Readiness::Failed, Some(error)),
    };
    match state.engine.admit(send, readiness, inputs) {
        Admission::Send => {}
        Admission::Refused | Admission::OverBudget => return Sent::No,
        // The engine's later times still run while the service is not ready.
        Admission::Wait(at) if arm(&mut state.timer, at, cx) => {
            inputs.timer_fired();
            return Sent::No;
        }
        Admission::Wait(_) => return Sent::NotReady,
        Admission::Failed(marks) => {
            let error = error.expect("the service failed").into();
            let result = finish(Err(error), marks, state.planned.grpc);
            return Sent::Failed(Box::new(result));
        }
    }
    let Some((body, reader)) = state.call.copy_body() else {
        // The body committed itself while the call waited.
        if let Some(reader) = state.call.committed_reader() {
            state.engine.on_commit(reader);
        }
        return Sent::No;
    };
    let (id, attempt_headers) = state.engine.on_sent(send, reader, inputs);
    let request = state.call.request(body, id, send.hedge, attempt_headers);
    let later = state.later.as_mut().expect("made by poll_service");
    let service = later.service.as_mut().expect("polled ready above");
    let future = Box::pin(super::sending(|| service.call(request)));
    later.attempts.push(Attempt { id, future });
    state.trace.sent(id, Some(send));
    Sent::Yes
}

/// Polls the call's own service (a clone of the layer's spare) ready. A service that failed
/// is not polled again.
fn poll_service<S, B>(
    state: &mut CallExtras<S, B>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), S::Error>>
where
    S: Service<Request<B>> + Clone,
    B: Replay,
{
    let later = LaterAttempts::of(&mut state.later);
    let service = later.service.get_or_insert_with(|| state.shared.service());
    let ready = service.poll_ready(cx);
    if matches!(ready, Poll::Ready(Err(_))) {
        later.service = None;
    }
    ready
}

/// The call's result when no answer was returned.
fn end_call<S, B, RB>(this: &mut Proj<'_, S, B>, end: End, marks: AttemptMarks) -> Output<RB>
where
    S: Below<B, RB>,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let state = &mut **this.state;
    let stopped = take_attempts(this.first.as_mut(), &mut state.later, |_| false);
    for (id, future) in stopped {
        state.stop(id, future);
    }
    let last = state.later.take().and_then(|later| later.last);
    let grpc = state.planned.grpc;
    let result = match end {
        End::Last(_) => last.unwrap_or_else(|| Err(no_result())),
        End::DeadlineExceeded => Err(deadline_exceeded(grpc)),
    };
    finish(result, marks, grpc)
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
    result: Result<Response<RB>, S::Error>,
    inputs: &mut Inputs<'_>,
) -> Option<Output<RB>>
where
    S: Below<B, RB>,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let result = result.map_err(Into::into);
    if let Err(error) = &result {
        let error: &(dyn std::error::Error + 'static) = &**error;
        if this
            .state
            .shared
            .policies
            .stream_resets()
            .guard_of(error)
            .is_some()
        {
            let state = &**this.state;
            books(&state.shared, &state.call, state.planned.route)
                .method_stats()
                .record_reset_guard_failure();
        }
    }
    let view = match &result {
        Ok(response) => AttemptResult::Response {
            status: response.status(),
            headers: response.headers(),
        },
        Err(error) => AttemptResult::Error(&**error),
    };
    let state = &mut **this.state;
    let (verdict, outcome) = state.engine.on_answer(id, view, &state.call, inputs);
    state.trace.answered(id, &outcome);
    match verdict {
        Verdict::Return(marks) => {
            // A call answered by its only attempt has nothing left to stop.
            if this.first.is_some() || state.later.is_some() {
                let stopped = take_attempts(this.first.as_mut(), &mut state.later, |_| false);
                for (id, future) in stopped {
                    state.stop(id, future);
                }
                let earlier = state.later.take().and_then(|later| later.last);
                state.drop_answer(earlier);
            }
            Some(finish(result, marks, state.planned.grpc))
        }
        Verdict::Keep => {
            let earlier = LaterAttempts::of(&mut state.later).last.replace(result);
            state.drop_answer(earlier);
            None
        }
        Verdict::Drop => {
            state.drop_answer(Some(result));
            None
        }
    }
}

/// What the driver keeps of the call's plan (see [`Start`](crate::engine::Start)).
pub(crate) struct Planned {
    pub(crate) grpc: bool,
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// The route the call took (its place in the policy table), whose name its statistics
    /// are kept under (else its path).
    pub(crate) route: Option<usize>,
}

/// Where the books of `call` go (see [`Books`]).
fn books<'a, S, B: Replay>(
    shared: &'a LayerShared<S>,
    call: &'a Call<B>,
    route: Option<usize>,
) -> Books<'a> {
    Books {
        policies: &shared.policies,
        route,
        path: call.path(),
        #[cfg(feature = "opentelemetry")]
        authority: call.authority(),
        #[cfg(feature = "opentelemetry")]
        extensions: Some(call.extensions()),
    }
}

/// What [`take_attempts`] takes: each attempt, with its future if it can be moved (the
/// first attempt in place cannot, and is dropped).
type Stopped<F> = Vec<(AttemptId, Option<Pin<Box<F>>>)>;

/// Takes out of the call the attempts in flight that `keep` does not keep.
fn take_attempts<S, B>(
    first: Pin<&mut First<S::Future>>,
    later: &mut Option<Box<LaterAttempts<S, B>>>,
    keep: impl Fn(AttemptId) -> bool,
) -> Stopped<S::Future>
where
    S: Service<Request<B>>,
{
    let mut stopped = Vec::new();
    if first.is_some() && !keep(AttemptId::FIRST) {
        stopped.push((AttemptId::FIRST, first.take()));
    }
    if let Some(later) = later {
        let taken = later.attempts.extract_if(.., |a| !keep(a.id));
        stopped.extend(taken.map(|a| (a.id, Some(a.future))));
    }
    stopped
}
