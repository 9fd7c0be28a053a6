//! The future of one call, for both layers. It does IO and nothing else: it reports what
//! happened to the [engine](crate::engine) (the timer fired, the body committed, an attempt
//! answered, the service failed) and carries out what the engine asks (send, cancel, end).

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
use crate::engine::{Action, Admission, AttemptId, Books, Dispatch, End, Engine, Inputs, Verdict};
use crate::error::BoxError;
use crate::error::{attempt_timed_out, deadline_exceeded};
use crate::resets::Stop;

use crate::telemetry::{AttemptFields, AttemptSpans};

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
        // The call's metrics are recorded once, when it ends: returned or dropped. A call
        // dropped by its caller resets every attempt in flight, which the table's limit of
        // stream resets counts.
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let in_flight = usize::from(this.first.is_some())
                + this.state.later.as_ref().map_or(0, |later| later.attempts.len());
            if in_flight > 0 {
                this.state.shared.policies.stream_resets().count_resets(in_flight);
            }
            #[cfg(feature = "opentelemetry")]
            {
                let state = &**this.state;
                let labels = |route: Option<&Arc<str>>, grpc, custom| {
                    state.call.labels(grpc, route, custom)
                };
                state.engine.close(state.books(), labels);
            }
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
    /// Where the call's books go.
    fn books(&self) -> Books<'_> {
        Books {
            policies: &self.shared.policies,
            route: self.route,
            path: self.call.path(),
        }
    }

    /// Posts what the engine recorded to the call's books.
    fn report(&mut self) {
        let books = Books {
            policies: &self.shared.policies,
            route: self.route,
            path: self.call.path(),
        };
        self.engine.post(books);
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
        let stats = self.books().method_stats();
        stats.record_stop(stop);
        if let (Stop::Finish, Some(future)) = (stop, future) {
            tracing::debug!(attempt = id.send, "attempt let finish");
            let deadline = self.engine.deadline().map(tokio::time::Instant::from_std);
            crate::resets::let_finish(resets, future, deadline, stats);
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
    // The route the call took (its place in the policy table), whose name its statistics are
    // kept under (else its path).
    route: Option<usize>,
    // The call's span and its attempts', if the call's span is enabled.
    spans: Option<Box<AttemptSpans>>,
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
        route: Option<usize>,
        span: tracing::Span,
    ) -> Box<Self> {
        Box::new(CallExtras {
            later: None,
            timer: None,
            shared,
            call,
            engine,
            route,
            spans: AttemptSpans::of_call(span),
        })
    }
}

impl<S, B> Driver<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// A call whose first attempt, `first`, was just sent.
    pub(crate) fn new(first: S::Future, state: Box<CallExtras<S, B>>) -> Self {
        // Boxed only where it may have to be let finish.
        let paced = state.shared.policies.stream_resets().per_second().is_some();
        Driver {
            first: First::new(first, paced && state.engine.may_stop_first()),
            state,
        }
    }
}

type Output<RB> = Result<Response<RB>, BoxError>;

impl<S, B, RB> Future for Driver<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    type Output = Output<RB>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output<RB>> {
        let mut this = self.project();
        let span = this.state.spans.as_ref().map(|spans| spans.call().clone());
        let _enter = span.as_ref().map(tracing::Span::enter);
        let read = || tokio::time::Instant::now().into_std();
        let mut rng = LazyRng::default();
        let mut inputs = Inputs::new(&read, &mut rng);
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
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    if this.first.is_some() {
        let spans = this.state.spans.as_deref();
        let entered = spans.and_then(|s| s.enter(AttemptId::FIRST.send));
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
        let spans = this.state.spans.as_deref();
        let entered = spans.and_then(|s| s.enter(attempt.id.send));
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
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
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
            Action::Cancel => {
                let state = &mut **this.state;
                let engine = &state.engine;
                let live = |id: AttemptId| engine.is_live(id.send);
                for (id, future) in take_attempts(this.first.as_mut(), &mut state.later, live) {
                    state.stop(id, future);
                }
                let engine = &state.engine;
                if let Some(spans) = &mut state.spans {
                    spans.cancelled(|send| !engine.is_live(send));
                }
            }
            Action::TimedOut(id) => {
                let state = &mut **this.state;
                let stopped = take_attempts(this.first.as_mut(), &mut state.later, |a| a != id);
                for (id, future) in stopped {
                    state.stop(id, future);
                }
                if let Some(spans) = &mut this.state.spans {
                    spans.timed_out(id.send);
                }
                let error = attempt_timed_out(this.state.engine.grpc());
                LaterAttempts::of(&mut this.state.later).last = Some(Err(error));
            }
            Action::End(end) => return Some(Progress::Done(end_call(this, end))),
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
    send: Dispatch,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Sent<Box<Output<RB>>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let state = &mut **this.state;
    if let Some(not_sent) = poll_service(state, inputs, cx) {
        return not_sent;
    }
    match state.engine.admit(send) {
        Admission::Send => {}
        Admission::Refused => return Sent::No,
        Admission::OverBudget => {
            state.report();
            return Sent::No;
        }
    }
    let sent = state.engine.attempts().sent();
    let attempt_headers = state.engine.attempt_headers(send.number, inputs.now());
    let Some((request, reader)) = state.call.request(send, sent, attempt_headers) else {
        // The body committed itself while the call waited.
        if let Some(reader) = state.call.committed_reader() {
            state.engine.on_commit(reader);
        }
        return Sent::No;
    };
    let later = state.later.as_mut().expect("made by poll_service");
    let service = later.service.as_mut().expect("polled ready above");
    let future = Box::pin(super::sending(|| service.call(request)));
    let id = state.engine.on_sent(send, reader, inputs);
    later.attempts.push(Attempt { id, future });
    state.report();
    crate::telemetry::hedge_sent(id.send, send.hedge && !send.transparent);
    if let Some(spans) = &mut state.spans {
        let fields = AttemptFields {
            send: id.send,
            previous: id.number - 1,
            transparent: send.transparent,
            hedge: send.hedge,
        };
        spans.sent(fields);
    }
    Sent::Yes
}

/// Polls the call's own service (a clone of the layer's spare) ready; `None` once it is.
fn poll_service<S, B, RB>(
    state: &mut CallExtras<S, B>,
    inputs: &mut Inputs<'_>,
    cx: &mut Context<'_>,
) -> Option<Sent<Box<Output<RB>>>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let later = LaterAttempts::of(&mut state.later);
    let service = later.service.get_or_insert_with(|| state.shared.service());
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => None,
        // The engine's later times still run while the service is not ready.
        Poll::Pending if arm(&mut state.timer, state.engine.wake_after(inputs.now()), cx) => {
            inputs.reset();
            state.engine.on_timer(inputs);
            Some(Sent::No)
        }
        Poll::Pending => Some(Sent::NotReady),
        Poll::Ready(Err(error)) => {
            // A service that failed is not polled again.
            later.service = None;
            if !state.engine.on_service_error() {
                return Some(Sent::No);
            }
            let engine = &state.engine;
            let (attempts, marks) = (engine.attempts(), engine.marks());
            let result = finish(Err(error.into()), attempts, marks, engine.grpc());
            Some(Sent::Failed(Box::new(result)))
        }
    }
}

/// The call's result when no answer was returned.
fn end_call<S, B, RB>(this: &mut Proj<'_, S, B>, end: End) -> Output<RB>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: http_body::Body + Send + 'static,
    B: Replay,
{
    let state = &mut **this.state;
    let stopped = take_attempts(this.first.as_mut(), &mut state.later, |_| false);
    for (id, future) in stopped {
        state.stop(id, future);
    }
    let last = state.later.take().and_then(|later| later.last);
    let engine = &this.state.engine;
    let result = match end {
        End::Last(_) => last.unwrap_or_else(|| Err(no_result())),
        End::DeadlineExceeded => Err(deadline_exceeded(engine.grpc())),
    };
    finish(result, engine.attempts(), engine.marks(), engine.grpc())
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
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
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
            this.state
                .books()
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
    if let Some(spans) = &mut state.spans {
        spans.answered(id.send, &outcome);
    }
    state.report();
    match verdict {
        Verdict::Return => {
            // A call answered by its only attempt has nothing left to stop.
            if this.first.is_some() || state.later.is_some() {
                let stopped = take_attempts(this.first.as_mut(), &mut state.later, |_| false);
                for (id, future) in stopped {
                    state.stop(id, future);
                }
                let earlier = state.later.take().and_then(|later| later.last);
                state.drop_answer(earlier);
            }
            let grpc = state.engine.grpc();
            let engine = &state.engine;
            Some(finish(result, engine.attempts(), engine.marks(), grpc))
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
