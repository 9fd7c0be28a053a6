//! The future of one call, for both layers: it sends what the engine asks for, polls the
//! attempts and the one timer, and feeds back what happened.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::{Call, Shared};
use crate::BoxError;
use crate::body::Replay;
use crate::classify::{AttemptResult, Outcome};
use crate::engine::{Action, AttemptId, Cancel, Engine, Now, Verdict};
use crate::error::{Attempted, attempt_timed_out, deadline_exceeded};
use crate::metadata::{Attempts, GRPC_PREVIOUS_RPC_ATTEMPTS_NAME};
use crate::stats::{MethodStats, Stats};
use crate::telemetry::AttemptSpans;

pin_project! {
    /// The future of a call through either layer.
    #[project = CallFutureProj]
    pub(crate) enum CallFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // The other layer's call: the inner future as it is.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // A call the engine runs: its first attempt in place, where the other variant keeps
        // its future, and the rest of its state in a box.
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
    reader: u64,
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
            let this = this.project();
            crate::telemetry::record_call(
                &this.state.shared.policies,
                &this.state.engine,
                &this.state.call,
                this.state.stats.route.as_ref(),
            );
        }
    }
}

/// What a call keeps besides its first attempt.
struct State<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    first_reader: u64,
    // When the first attempt was sent, for a hedging delay that learns from latencies:
    // stamped at the first poll, and only for such a delay.
    first_sent_at: Option<std::time::Instant>,
    // The attempts after the first, in the order they were sent.
    others: Vec<Attempt<S::Future>>,
    // The one timer: the earliest of the deadline, the next send and the attempt's timeout,
    // as the engine says. Made when the call first waits.
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
    /// A call whose first attempt, `first`, was just sent with the body of `first_reader`.
    pub(crate) fn new(
        first: S::Future,
        first_reader: u64,
        shared: Arc<Shared<S>>,
        call: Call<B>,
        engine: Engine,
        stats: StatsHandle,
        span: tracing::Span,
    ) -> Self {
        Driver {
            first: Some(first),
            state: Box::new(State {
                first_reader,
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
            }),
        }
    }
}

/// How one pass over the attempts ended.
enum Step<T> {
    /// Something changed (an attempt answered, was sent or cancelled): look again.
    Again,
    Done(T),
    Pending,
}

impl<S, B, RB> Driver<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>> {
        let span = self.state.span.clone();
        let _enter = span.enter();
        if self.state.spans.is_none() && !span.is_disabled() {
            self.as_mut().project().state.spans = AttemptSpans::of_call(&span);
        }
        let read = || tokio::time::Instant::now().into_std();
        let mut now = Now::lazy(&read);
        if self.state.engine.adaptive_delay().is_some() && self.state.first_sent_at.is_none() {
            self.as_mut().project().state.first_sent_at = Some(now.get());
        }
        // The deadline wins over an answer that is ready in the same poll (an answer wins over
        // the attempt's own timeout, which the engine sees after the answers).
        let timer_fired = self
            .as_mut()
            .project()
            .state
            .timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
        if timer_fired
            && self
                .state
                .engine
                .deadline()
                .is_some_and(|deadline| now.get() >= deadline)
        {
            match self.as_mut().act(&mut now, cx) {
                Step::Done(result) => return Poll::Ready(result),
                Step::Again | Step::Pending => {}
            }
        }
        loop {
            let answered = match self.as_mut().poll_attempts(&mut now, cx) {
                Step::Done(result) => return Poll::Ready(result),
                Step::Again => true,
                Step::Pending => false,
            };
            self.as_mut().poll_commit(cx);
            match self.as_mut().act(&mut now, cx) {
                Step::Done(result) => return Poll::Ready(result),
                Step::Again => continue,
                Step::Pending if answered => continue,
                Step::Pending => return Poll::Pending,
            }
        }
    }

    /// Polls every attempt in flight, and feeds each answer to the engine.
    fn poll_attempts(
        self: Pin<&mut Self>,
        now: &mut Now<'_>,
        cx: &mut Context<'_>,
    ) -> Step<Result<Response<RB>, BoxError>> {
        let mut this = self.project();
        let mut answered = false;
        if let Some(first) = this.first.as_mut().as_pin_mut() {
            let entered = this
                .state
                .spans
                .as_deref()
                .and_then(|s| s.enter(AttemptId::FIRST));
            let polled = first.poll(cx);
            drop(entered);
            if let Poll::Ready(result) = polled {
                this.first.set(None);
                answered = true;
                let (sent_at, reader) = (this.state.first_sent_at, this.state.first_reader);
                let first = AttemptId::FIRST;
                if let Some(done) = answer(&mut this, first, reader, sent_at, result, now) {
                    return Step::Done(done);
                }
            }
        }
        let mut i = 0;
        while let Some(attempt) = this.state.others.get_mut(i) {
            let entered = this
                .state
                .spans
                .as_deref()
                .and_then(|s| s.enter(attempt.id));
            let polled = attempt.future.as_mut().poll(cx);
            drop(entered);
            let Poll::Ready(result) = polled else {
                i += 1;
                continue;
            };
            let Attempt {
                id,
                reader,
                sent_at,
                ..
            } = this.state.others.remove(i);
            answered = true;
            if let Some(done) = answer(&mut this, id, reader, Some(sent_at), result, now) {
                return Step::Done(done);
            }
        }
        if answered { Step::Again } else { Step::Pending }
    }

    /// Tells the engine when the body committed itself to one attempt (it outgrew the
    /// buffer, or its source failed), whichever task polled it: the body wakes the call.
    fn poll_commit(self: Pin<&mut Self>, cx: &mut Context<'_>) {
        let mut this = self.project();
        let committed = this.state.call.poll_committed(cx);
        if let Poll::Ready(reader) = committed {
            on_commit(&mut this, reader);
        }
    }

    /// Carries out the engine's actions until it waits or ends the call.
    fn act(
        self: Pin<&mut Self>,
        now: &mut Now<'_>,
        cx: &mut Context<'_>,
    ) -> Step<Result<Response<RB>, BoxError>> {
        let mut this = self.project();
        let mut changed = false;
        loop {
            match this.state.engine.poll(now) {
                Action::Send(send) => {
                    let service = this
                        .state
                        .service
                        .get_or_insert_with(|| this.state.shared.service());
                    match service.poll_ready(cx) {
                        Poll::Pending => {
                            // The deadline still runs while the service is not ready.
                            if arm(
                                &mut this.state.timer,
                                this.state.engine.wake_after(now.get()),
                                cx,
                            ) {
                                now.reset();
                                continue;
                            }
                            return if changed { Step::Again } else { Step::Pending };
                        }
                        Poll::Ready(Err(error)) => {
                            if this.state.engine.on_service_error() {
                                return Step::Done(Err(error.into()));
                            }
                            continue;
                        }
                        Poll::Ready(Ok(())) => {}
                    }
                    let sent = this.state.engine.attempts().sent();
                    let deadline = this.state.engine.deadline();
                    let Some((request, reader)) =
                        this.state.call.request(send, sent, deadline, now.get())
                    else {
                        // The body outgrew the buffer while the call waited: committed to
                        // what an earlier attempt got.
                        this.state.engine.on_commit(None);
                        continue;
                    };
                    let future = service.call(request);
                    let id = this.state.engine.on_sent(send, now);
                    if !send.transparent {
                        this.state
                            .stats
                            .get(this.state.shared.policies.stats(), this.state.call.path())
                            .record_retry(id.number - 1);
                    }
                    this.state
                        .span
                        .record("http.request.resend_count", id.send - 1);
                    crate::telemetry::hedge_sent(id, send);
                    if let Some(spans) = &mut this.state.spans {
                        spans.sent(&this.state.span, id, send);
                    }
                    this.state.others.push(Attempt {
                        id,
                        reader,
                        sent_at: now.get(),
                        future: Box::pin(future),
                    });
                    changed = true;
                }
                Action::Cancel(cancel) => {
                    if let Some(spans) = &mut this.state.spans {
                        spans.cancelled(cancel);
                    }
                    match cancel {
                        Cancel::AllBut(keep) => {
                            if keep != AttemptId::FIRST {
                                this.first.set(None);
                            }
                            this.state.others.retain(|a| a.id == keep);
                        }
                        Cancel::All => {
                            this.first.set(None);
                            this.state.others.clear();
                        }
                        Cancel::TimedOut(id) => {
                            if id == AttemptId::FIRST {
                                this.first.set(None);
                            } else {
                                this.state.others.retain(|a| a.id != id);
                            }
                            this.state.last =
                                Some(Box::new(Err(attempt_timed_out(this.state.engine.grpc()))));
                        }
                    }
                    changed = true;
                }
                Action::ReturnLast => {
                    let attempts = this.state.engine.attempts();
                    let last = this
                        .state
                        .last
                        .take()
                        .map_or_else(|| Err(no_result()), |last| *last);
                    return Step::Done(finish(last, attempts, this.state.engine.grpc()));
                }
                Action::DeadlineExceeded => {
                    this.first.set(None);
                    this.state.others.clear();
                    let attempts = this.state.engine.attempts();
                    let error = deadline_exceeded(this.state.engine.grpc());
                    return Step::Done(finish(Err(error), attempts, this.state.engine.grpc()));
                }
                Action::Wait(at) => {
                    if !arm(&mut this.state.timer, at, cx) {
                        return if changed { Step::Again } else { Step::Pending };
                    }
                    now.reset();
                }
            }
        }
    }
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

/// Tells the engine which attempt the body committed to.
fn on_commit<S, B>(this: &mut DriverProj<'_, S, B>, reader: u64)
where
    S: Service<Request<B>>,
    B: Replay,
{
    let attempt = if this.state.first_reader == reader && this.first.is_some() {
        Some(AttemptId::FIRST)
    } else {
        this.state
            .others
            .iter()
            .find(|a| a.reader == reader)
            .map(|a| a.id)
    };
    this.state.engine.on_commit(attempt);
}

/// Feeds one attempt's answer to the engine; gives the call's result if it ends with it.
fn answer<S, B, RB>(
    this: &mut DriverProj<'_, S, B>,
    id: AttemptId,
    reader: u64,
    sent_at: Option<std::time::Instant>,
    result: Result<Response<RB>, S::Error>,
    now: &mut Now<'_>,
) -> Option<Result<Response<RB>, BoxError>>
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
    let outcome: Outcome = this.state.engine.classifier().classify(view);
    if let Some(spans) = &mut this.state.spans {
        spans.answered(id, &outcome);
    }
    if outcome != Outcome::Success
        && let Some(reader) = this.state.call.committed_reader()
    {
        // A failure may be a body error of an attempt that another one's commit cut off.
        on_commit(this, reader);
    }
    let verdict = this.state.engine.on_answer(id, outcome, view, now);
    for _ in 0..this.state.engine.take_retry_failures() {
        this.state
            .stats
            .get(this.state.shared.policies.stats(), this.state.call.path())
            .record_retry_failure();
    }
    match verdict {
        Verdict::Return => {
            if outcome == Outcome::Success
                && let (Some(delay), Some(sent_at)) = (this.state.engine.adaptive_delay(), sent_at)
            {
                delay.record(now.get().saturating_duration_since(sent_at));
            }
            this.first.set(None);
            this.state.others.clear();
            if result.is_ok() {
                // The call is committed to this attempt: the replay buffer is released now,
                // even if the attempt goes on streaming its request body.
                this.state.call.commit(reader);
            }
            Some(finish(
                result,
                this.state.engine.attempts(),
                this.state.engine.grpc(),
            ))
        }
        Verdict::Keep => {
            this.state.last = Some(Box::new(result));
            None
        }
        Verdict::Drop => None,
    }
}

/// The call's result, marked with its attempts when it made more than one: an [`Attempts`]
/// response extension (and for gRPC `grpc-previous-rpc-attempts`), or an [`Attempted`]
/// error around the last error. Like that header (A6: "it will not be present on the first
/// RPC"), a call of one attempt is returned as it is, so the success path allocates nothing.
fn finish<RB>(
    result: Result<Response<RB>, BoxError>,
    attempts: Attempts,
    grpc: bool,
) -> Result<Response<RB>, BoxError> {
    if attempts.sent() <= 1 {
        return result;
    }
    match result {
        Ok(mut response) => {
            if grpc {
                response.headers_mut().insert(
                    GRPC_PREVIOUS_RPC_ATTEMPTS_NAME,
                    http::HeaderValue::from(attempts.sent() - 1),
                );
            }
            response.extensions_mut().insert(attempts);
            Ok(response)
        }
        Err(error) => Err(mark_error(error, attempts)),
    }
}

/// A gRPC status keeps its type (tonic's client reads it as it is) and carries the count as
/// A6's `grpc-previous-rpc-attempts` metadata; any other error is wrapped in [`Attempted`].
fn mark_error(error: BoxError, attempts: Attempts) -> BoxError {
    #[cfg(feature = "tonic")]
    let error = match error.downcast::<tonic::Status>() {
        Ok(mut status) => {
            status.metadata_mut().insert(
                crate::metadata::GRPC_PREVIOUS_RPC_ATTEMPTS,
                tonic::metadata::MetadataValue::from(attempts.sent() - 1),
            );
            return status;
        }
        Err(error) => error,
    };
    Box::new(Attempted::new(error, attempts))
}

/// The error for a call that ends with no attempt result to return: an attempt left the
/// call before answering (a service error while none was in flight is returned itself).
fn no_result() -> BoxError {
    "no attempt result left to return".into()
}
