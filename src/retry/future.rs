//! The retry layer's response future: one attempt at a time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep};
use tower_service::Service;

use crate::BoxError;
use crate::backoff::Step;
use crate::body::Replay;
use crate::call::{Call, Shared, annotate, deadline_fired, no_result};
use crate::classify::{AttemptResult, Classify, Outcome, grpc_status};
use crate::error::{attempt_timed_out, deadline_exceeded};
use crate::policy::{Policies, RetryContext, RetryDecision, RetryPolicy, ThrottleHandle};
use crate::pushback::Pushback;
use crate::stats::{MethodStats, Stats};
use crate::throttle::RetryThrottle;

pin_project! {
    /// The response future of [`Retry`](super::Retry).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        #[pin]
        kind: Kind<S, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // No policy for the method: the inner future as it is. With a throttle configured,
        // a success still credits it, as A6 counts every outgoing call.
        Passthrough {
            #[pin]
            future: S::Future,
            credit: Option<Credit>,
        },
        // The first attempt of a call with a retry policy, polled in place. Most calls end
        // here: what a later attempt would need waits in `state`, and the retry engine is
        // built, boxed, only when the first attempt does not succeed. `state` is boxed so that
        // the future stays small: a future is moved whole, and a passthrough call (or any
        // caller that moves the future before polling it) should not copy a request's worth
        // of bytes each time.
        First {
            #[pin]
            future: S::Future,
            state: Pin<Box<FirstState<S, B>>>,
        },
        // A call with a retry policy past its first attempt.
        // Boxed: the state of a call with a policy is large, and a passthrough call should
        // not move it around.
        Retrying {
            retrying: Pin<Box<Retrying<S, B>>>,
        },
        // The call ended during its first attempt (on its deadline; the attempt is dropped),
        // or its policy was missing from the table (never expected).
        Finished,
    }
}

pin_project! {
    /// The first attempt's timer, and what it keeps for the attempts that may follow it.
    pub(crate) struct FirstState<S, B: Replay> {
        // Fires at the call's deadline or the attempt's timeout, whichever comes first; made
        // only once the attempt is pending.
        #[pin]
        timer: Option<Sleep>,
        // When the first attempt times out, with a per-attempt timeout.
        attempt_deadline: Option<Instant>,
        // Taken when the retry engine takes over.
        start: Option<Start<S, B>>,
    }
}

impl<S, B: Replay> FirstState<S, B> {
    /// What a call keeps while its first attempt is in flight, still without its
    /// [`Start`]: the caller writes that into the box, where it stays (see
    /// [`Retry::call_with_policy`](super::Retry)).
    ///
    /// The box is allocated before it is filled, so that the state is written in place
    /// rather than made on the stack and copied.
    #[inline]
    pub(crate) fn boxed(per_attempt_timeout: Option<Duration>) -> Box<Self> {
        // The clock is read only when a per-attempt timeout needs it.
        let attempt_deadline =
            per_attempt_timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        Box::write(
            Box::new_uninit(),
            FirstState {
                timer: None,
                attempt_deadline,
                start: None,
            },
        )
    }

    /// Where the call's [`Start`] goes, before the state is pinned.
    #[inline]
    pub(crate) fn start_slot(&mut self) -> &mut Option<Start<S, B>> {
        &mut self.start
    }
}

/// What a call with a retry policy starts from. Cheap to make: the spare service, the
/// policy, the shared throttle and the statistics are all reached through one reference.
pub(crate) struct Start<S, B: Replay> {
    // The layer's spare clone of the inner service (a call that retries clones it for its
    // later attempts; a call that does not pays one reference count instead of a clone),
    // and the table.
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) call: Call<B>,
    // Where the call's retry policy is in the table.
    pub(crate) index: usize,
    // The throttle of the request's authority, when the table keeps one per authority.
    pub(crate) authority_throttle: Option<ThrottleHandle>,
    pub(crate) span: tracing::Span,
}

impl<S, B: Replay> Start<S, B> {
    /// A call with the retry policy at `index`, for a request with these parts.
    #[inline(always)]
    pub(crate) fn new(
        shared: Arc<Shared<S>>,
        parts: &http::request::Parts,
        timeout: Option<Duration>,
        index: usize,
        authority_throttle: Option<ThrottleHandle>,
        span: tracing::Span,
    ) -> Self {
        Start {
            shared,
            call: Call::new(parts, timeout, false),
            index,
            authority_throttle,
            span,
        }
    }
}

impl<S: Clone, B: Replay> Start<S, B> {
    fn policies(&self) -> &Policies {
        &self.shared.policies
    }

    fn policy(&self) -> Option<&Arc<RetryPolicy>> {
        self.policies().retry_policy(self.index)
    }

    fn throttle(&self) -> Option<&dyn RetryThrottle> {
        self.policies()
            .call_throttle(self.authority_throttle.as_ref())
    }

    /// What the retry engine needs, taken out of the table.
    fn into_parts(self) -> Option<RetryingParts<S, B>> {
        let policy = self.policy()?.clone();
        let policies = &self.shared.policies;
        let throttle = self.authority_throttle.or_else(|| {
            policies
                .shared_throttle()
                .cloned()
                .map(ThrottleHandle::Shared)
        });
        Some(RetryingParts {
            service: self.shared.service(),
            call: self.call,
            policy,
            throttle,
            max_attempts_cap: policies.max_attempts_cap(),
            max_pushback: policies.max_pushback(),
            stats: policies.stats().clone(),
            span: self.span,
        })
    }
}

/// What a passthrough call needs to credit the throttle on success.
pub(crate) struct Credit {
    pub(crate) throttle: ThrottleHandle,
    pub(crate) grpc: bool,
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>> + Clone,
    B: Replay,
{
    pub(crate) fn passthrough(future: S::Future, credit: Option<Credit>) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future, credit },
        }
    }

    /// A call with a retry policy, whose first attempt is polled in place: `first` is its
    /// inner future, already called on the service that was polled ready, and `state` what
    /// the call keeps for the attempts that may follow ([`FirstState::boxed`]).
    #[inline]
    pub(crate) fn first(first: S::Future, state: Box<FirstState<S, B>>) -> Self {
        ResponseFuture {
            kind: Kind::First {
                future: first,
                state: Box::into_pin(state),
            },
        }
    }

    /// A call with a retry policy that the engine runs from its first attempt: one whose
    /// attempts may be left running when their timeout fires, so that they must be boxed.
    pub(crate) fn engine(start: Start<S, B>, first: S::Future) -> Self {
        let kind = match start.into_parts() {
            Some(parts) => Kind::Retrying {
                retrying: Box::pin(Retrying::new(parts, first)),
            },
            None => Kind::Finished,
        };
        ResponseFuture { kind }
    }
}

/// How the first attempt's poll ends.
enum FirstStep<S, B, RB>
where
    S: Service<Request<B>>,
    B: Replay,
{
    Pending,
    Return(Result<Response<RB>, BoxError>),
    DeadlineExceeded(bool),
    // The retry engine takes over, from the first attempt's result.
    Engine(Box<Retrying<S, B>>),
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    // Inline, so that a call without a policy costs its caller no more than the inner
    // future's poll: a call with a policy is polled out of line.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        if let KindProj::Passthrough { future, credit } = kind.as_mut().project() {
            if credit.is_none() {
                // Nothing to do with the answer: handed on as the inner future gives it.
                return future.poll(cx).map_err(Into::into);
            }
            let result = ready!(future.poll(cx)).map_err(Into::into);
            if let (Some(credit), Ok(response)) = (credit, &result)
                && is_success(response, credit.grpc)
            {
                credit.throttle.on_success();
            }
            return Poll::Ready(result);
        }
        poll_with_policy(kind, cx)
    }
}

/// Polls a call with a retry policy.
#[inline(never)]
fn poll_with_policy<S, B, RB>(
    mut kind: Pin<&mut Kind<S, B>>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<RB>, BoxError>>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    let step = match kind.as_mut().project() {
        KindProj::Retrying { retrying } => return retrying.as_mut().poll(cx),
        KindProj::First { future, state } => poll_first(future, state.as_mut(), cx),
        // Passthrough calls are polled by the caller.
        KindProj::Passthrough { .. } | KindProj::Finished => {
            return Poll::Ready(Err(no_result()));
        }
    };
    match step {
        FirstStep::Pending => Poll::Pending,
        FirstStep::Return(result) => Poll::Ready(result),
        FirstStep::DeadlineExceeded(grpc) => {
            // Dropping the attempt cancels it.
            kind.set(Kind::Finished);
            Poll::Ready(Err(deadline_exceeded(grpc)))
        }
        FirstStep::Engine(retrying) => {
            kind.set(Kind::Retrying {
                retrying: Box::into_pin(retrying),
            });
            match kind.project() {
                KindProj::Retrying { retrying } => retrying.as_mut().poll(cx),
                _ => Poll::Ready(Err(no_result())),
            }
        }
    }
}

/// Polls the first attempt of a call with a retry policy. A success is returned from here;
/// anything else hands the call to the retry engine, with the attempt's outcome.
fn poll_first<S, B, RB>(
    future: Pin<&mut S::Future>,
    state: Pin<&mut FirstState<S, B>>,
    cx: &mut Context<'_>,
) -> FirstStep<S, B, RB>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    let mut state = state.project();
    let Some(start) = state.start.as_ref() else {
        return FirstStep::Return(Err(no_result()));
    };
    let Some(policy) = start.policy() else {
        return FirstStep::Return(Err(no_result()));
    };
    let _enter = start.span.enter();
    let (deadline, attempt_deadline) = (start.call.deadline, *state.attempt_deadline);
    // As in the engine: the deadline wins over an answer that is ready in the same poll, and
    // an answer wins over the attempt's own timeout.
    let mut attempt_expired = false;
    if let Some(timer) = state.timer.as_mut().as_pin_mut()
        && timer.poll(cx).is_ready()
    {
        state.timer.set(None);
        if deadline_passed(deadline, attempt_deadline) {
            tracing::debug!(attempts = start.call.sent, "deadline exceeded");
            return FirstStep::DeadlineExceeded(start.call.grpc);
        }
        attempt_expired = true;
    }
    let (result, outcome) = match future.poll(cx) {
        Poll::Ready(result) => {
            let result = result.map_err(Into::into);
            let outcome = classify(&*policy.classifier, &result);
            if outcome == Outcome::Success {
                if let Some(throttle) = start.throttle() {
                    throttle.on_success();
                }
                // One attempt: nothing to annotate (see `annotate`).
                return FirstStep::Return(result);
            }
            (result, outcome)
        }
        Poll::Pending => {
            if !attempt_expired {
                if state.timer.is_some() {
                    // Polled above, and not due.
                    return FirstStep::Pending;
                }
                let wake_at = match (deadline, attempt_deadline) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(at), None) | (None, Some(at)) => at,
                    (None, None) => return FirstStep::Pending,
                };
                if !deadline_fired(state.timer.as_mut(), Some(wake_at), cx) {
                    return FirstStep::Pending;
                }
                state.timer.set(None);
                if deadline_passed(deadline, attempt_deadline) {
                    tracing::debug!(attempts = start.call.sent, "deadline exceeded");
                    return FirstStep::DeadlineExceeded(start.call.grpc);
                }
            }
            // The attempt's own timeout: the engine drops it (which cancels it) and decides.
            (
                Err(attempt_timed_out(start.call.grpc)),
                Outcome::Retryable(None),
            )
        }
    };
    drop(_enter);
    hand_over(state.start.take(), result, outcome)
}

/// The retry engine, built to take a call over after its first attempt. Out of line: the
/// engine's state is large, and building it in `poll` would give every poll of a first
/// attempt the stack frame it needs.
#[cold]
#[inline(never)]
fn hand_over<S, B, RB>(
    start: Option<Start<S, B>>,
    result: Result<Response<RB>, BoxError>,
    outcome: Outcome,
) -> FirstStep<S, B, RB>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    B: Replay,
{
    match start.and_then(Start::into_parts) {
        Some(parts) => FirstStep::Engine(Box::new(Retrying::after_first(parts, result, outcome))),
        None => FirstStep::Return(Err(no_result())),
    }
}

/// Whether the first attempt's timer, set to the earlier of the deadline and the attempt's
/// timeout, fired for the deadline: it did when there is no per-attempt timeout, or one no
/// earlier than the deadline, whatever the clock reads.
fn deadline_passed(deadline: Option<Instant>, attempt_deadline: Option<Instant>) -> bool {
    match (deadline, attempt_deadline) {
        (Some(deadline), Some(attempt)) => deadline <= attempt || Instant::now() >= deadline,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Whether a response of a call without a policy counts as a success for the throttle.
fn is_success<RB>(response: &Response<RB>, grpc: bool) -> bool {
    if grpc {
        matches!(
            grpc_status(response.status(), response.headers()),
            None | Some(crate::classify::Code::Ok)
        )
    } else {
        !response.status().is_server_error()
            && response.status() != http::StatusCode::TOO_MANY_REQUESTS
    }
}

pin_project! {
    /// The state of a call with a retry policy.
    pub(crate) struct Retrying<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        #[pin]
        state: State<S::Future>,
        // Fires when the call's deadline passes; armed once an attempt is pending.
        #[pin]
        deadline: Option<Sleep>,
        // Fires when the attempt in flight outlives the policy's per-attempt timeout.
        #[pin]
        attempt_timer: Option<Sleep>,
        // Attempts left running after their per-attempt timeout (hedge on per-attempt
        // timeout): the first good answer among them and the current attempt wins.
        lingering: Vec<Pin<Box<S::Future>>>,
        // A clone of the inner service, polled ready before each attempt after the first.
        service: S,
        call: Call<B>,
        policy: Arc<RetryPolicy>,
        throttle: Option<ThrottleHandle>,
        max_attempts: u32,
        max_pushback: Duration,
        // Attempts that count toward `max_attempts`.
        counted: u32,
        // Transparent retries made.
        transparent: u32,
        // Never-sent retries in a row, for their backoff and their bound.
        not_sent_in_a_row: u32,
        refused_retried: bool,
        // The backoff exponent: backoffs since the start or the last pushback.
        backoff_attempt: u32,
        previous_delay: Option<Duration>,
        // The last failed attempt's result, returned if no new attempt can start.
        last: Option<Result<S::Response, BoxError>>,
        stats: Option<Arc<MethodStats>>,
        stats_source: Stats,
        span: tracing::Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is in flight.
        Called {
            #[pin]
            future: F,
        },
        // An attempt is in flight, boxed so that it can be left running when its per-attempt
        // timeout fires (hedge on per-attempt timeout).
        CalledBoxed {
            future: Option<Pin<Box<F>>>,
        },
        // The last attempt failed and no new one may start, but attempts left running after
        // their per-attempt timeout may still answer.
        Draining,
        // Waiting out a backoff or a pushback before the next attempt.
        Waiting {
            #[pin]
            sleep: Sleep,
        },
        // Waiting for the service to be ready for the next attempt.
        Ready,
        // The first attempt ended (its result is in `last`) before the engine took over:
        // classify it and decide.
        Decide {
            outcome: Outcome,
        },
    }
}

/// What to do after an attempt.
enum Decision {
    Return,
    RetryAfter(Duration),
}

struct RetryingParts<S, B: Replay> {
    pub(crate) service: S,
    pub(crate) call: Call<B>,
    pub(crate) policy: Arc<RetryPolicy>,
    pub(crate) throttle: Option<ThrottleHandle>,
    pub(crate) max_attempts_cap: u32,
    pub(crate) max_pushback: Duration,
    pub(crate) stats: Stats,
    pub(crate) span: tracing::Span,
}

impl<S, B> Retrying<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// Starts a call: `first` is the inner future of the first attempt, already called on the
    /// service that was polled ready.
    fn new(parts: RetryingParts<S, B>, first: S::Future) -> Self {
        let state = if parts.policy.hedge_on_per_attempt_timeout {
            State::CalledBoxed {
                future: Some(Box::pin(first)),
            }
        } else {
            State::Called { future: first }
        };
        let attempt_timer = parts.policy.per_attempt_timeout.map(sleep);
        Self::with_state(parts, state, attempt_timer, None)
    }

    /// Takes a call over after its first attempt ended with `result`, classified as
    /// `outcome`; the rules are applied on the first poll.
    fn after_first(
        parts: RetryingParts<S, B>,
        result: Result<S::Response, BoxError>,
        outcome: Outcome,
    ) -> Self {
        Self::with_state(parts, State::Decide { outcome }, None, Some(result))
    }

    fn with_state(
        parts: RetryingParts<S, B>,
        state: State<S::Future>,
        attempt_timer: Option<Sleep>,
        last: Option<Result<S::Response, BoxError>>,
    ) -> Self {
        let max_attempts = parts.policy.max_attempts.min(parts.max_attempts_cap);
        Retrying {
            state,
            deadline: None,
            attempt_timer,
            lingering: Vec::new(),
            service: parts.service,
            call: parts.call,
            policy: parts.policy,
            throttle: parts.throttle,
            max_attempts,
            max_pushback: parts.max_pushback,
            counted: 1,
            transparent: 0,
            not_sent_in_a_row: 0,
            refused_retried: false,
            backoff_attempt: 0,
            previous_delay: None,
            last,
            stats: None,
            stats_source: parts.stats,
            span: parts.span,
        }
    }
}

impl<S, B, RB> Retrying<S, B>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Replay,
{
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>> {
        let poll = self.as_mut().poll_attempts(cx);
        if poll.is_ready() {
            return poll;
        }
        let mut this = self.project();
        if deadline_fired(this.deadline, this.call.deadline, cx) {
            this.state.set(State::Ready);
            this.lingering.clear();
            return Poll::Ready(Err(deadline_exceeded(this.call.grpc)));
        }
        Poll::Pending
    }

    fn poll_attempts(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>> {
        let mut this = self.project();
        let _enter = this.span.enter();
        loop {
            // The deadline spans every attempt and every wait.
            if let Some(deadline) = this.deadline.as_mut().as_pin_mut()
                && deadline.poll(cx).is_ready()
            {
                tracing::debug!(attempts = this.call.sent, "deadline exceeded");
                this.state.set(State::Ready);
                this.lingering.clear();
                return Poll::Ready(Err(deadline_exceeded(this.call.grpc)));
            }
            if let Some((result, outcome)) = poll_lingering(this.lingering, this.policy, cx) {
                if outcome == Outcome::Success
                    && let Some(throttle) = this.throttle
                {
                    throttle.on_success();
                }
                this.lingering.clear();
                this.state.set(State::Ready);
                let (sent, transparent) = (this.call.sent, *this.transparent);
                return Poll::Ready(result.map(|r| annotate(r, sent, transparent, this.call.grpc)));
            }
            // The outcome, when it is known already (a timeout, or the first attempt's).
            let (result, known) = match this.state.as_mut().project() {
                StateProj::Called { future } => match future.poll(cx) {
                    Poll::Ready(result) => (result.map_err(Into::into), None),
                    Poll::Pending => {
                        if !attempt_timer_fired(this.attempt_timer.as_mut(), cx) {
                            return Poll::Pending;
                        }
                        // Dropping the attempt cancels it.
                        this.state.set(State::Ready);
                        (
                            Err(attempt_timed_out(this.call.grpc)),
                            Some(Outcome::Retryable(None)),
                        )
                    }
                },
                StateProj::CalledBoxed { future } => {
                    let Some(attempt) = future.as_mut() else {
                        this.state.set(State::Draining);
                        continue;
                    };
                    match attempt.as_mut().poll(cx) {
                        Poll::Ready(result) => (result.map_err(Into::into), None),
                        Poll::Pending => {
                            if !attempt_timer_fired(this.attempt_timer.as_mut(), cx) {
                                return Poll::Pending;
                            }
                            // Hedge on per-attempt timeout: the slow attempt goes on, and
                            // the next one starts now if the policy allows one. A request
                            // that may not be repeated just waits, and (as when it is not
                            // retried) its timeout does not count against the throttle.
                            let repeatable = may_repeat(this.policy, this.call);
                            if repeatable && let Some(throttle) = this.throttle {
                                throttle.on_failure();
                            }
                            let may_hedge = *this.counted < *this.max_attempts
                                && repeatable
                                && this.call.can_replay()
                                && this.throttle.as_ref().is_none_or(|t| t.allows_retry());
                            if !may_hedge {
                                tracing::debug!("per-attempt timeout: no attempt left to hedge");
                                return Poll::Pending;
                            }
                            if let Some(slow) = future.take() {
                                this.lingering.push(slow);
                            }
                            *this.counted += 1;
                            this.stats
                                .get_or_insert_with(|| this.stats_source.method(this.call.path()))
                                .record_retry(*this.counted - 1);
                            tracing::debug!(
                                attempt = this.call.sent + 1,
                                reason = "per-attempt timeout",
                                "hedging"
                            );
                            this.state.set(State::Ready);
                            continue;
                        }
                    }
                }
                StateProj::Draining => {
                    if !this.lingering.is_empty() {
                        return Poll::Pending;
                    }
                    let (sent, transparent) = (this.call.sent, *this.transparent);
                    let last = this.last.take().unwrap_or_else(|| Err(no_result()));
                    return Poll::Ready(
                        last.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                    );
                }
                StateProj::Decide { outcome } => {
                    let outcome = *outcome;
                    this.state.set(State::Ready);
                    let result = this.last.take().unwrap_or_else(|| Err(no_result()));
                    (result, Some(outcome))
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Ready);
                    continue;
                }
                StateProj::Ready => {
                    if let Err(error) = ready!(this.service.poll_ready(cx)) {
                        this.lingering.clear();
                        return Poll::Ready(Err(error.into()));
                    }
                    let Some((request, _reader)) = this.call.next_request(false) else {
                        // The body outgrew the buffer while we waited: the call is committed
                        // to what the last attempt got.
                        tracing::debug!("committed: body cannot be replayed");
                        this.state.set(State::Draining);
                        continue;
                    };
                    let sent = this.call.sent;
                    this.span.record("http.request.resend_count", sent - 1);
                    let future = this.service.call(request);
                    if this.policy.hedge_on_per_attempt_timeout {
                        this.state.set(State::CalledBoxed {
                            future: Some(Box::pin(future)),
                        });
                    } else {
                        this.state.set(State::Called { future });
                    }
                    if let Some(timeout) = this.policy.per_attempt_timeout {
                        this.attempt_timer.set(Some(sleep(timeout)));
                    }
                    continue;
                }
            };

            let outcome = known
                .unwrap_or_else(|| classify(&*this.policy.classifier, &result))
                .cap_pushback(*this.max_pushback);
            let decision = decide(
                outcome,
                Ctx {
                    policy: this.policy,
                    call: this.call,
                    result: attempt_result(&result),
                    throttle: this.throttle.as_deref(),
                    max_attempts: *this.max_attempts,
                    counted: this.counted,
                    transparent: this.transparent,
                    not_sent_in_a_row: this.not_sent_in_a_row,
                    refused_retried: this.refused_retried,
                    backoff_attempt: this.backoff_attempt,
                    previous_delay: this.previous_delay,
                    stats: this.stats,
                    stats_source: this.stats_source,
                },
            );
            match decision {
                Decision::Return
                    if !matches!(outcome, Outcome::Success | Outcome::Fatal(_))
                        && !this.lingering.is_empty() =>
                {
                    // Out of retries, but an earlier attempt may still answer well: wait for
                    // it. A non-retryable answer ends the call whichever attempt gave it.
                    *this.last = Some(result);
                    this.state.set(State::Draining);
                }
                Decision::Return => {
                    this.lingering.clear();
                    let (sent, transparent) = (this.call.sent, *this.transparent);
                    return Poll::Ready(
                        result.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                    );
                }
                Decision::RetryAfter(delay) => {
                    *this.last = Some(result);
                    // A zero delay (a refused stream, pushback "0") goes at once: a timer
                    // would round it up to the next millisecond tick.
                    if delay.is_zero() {
                        this.state.set(State::Ready);
                    } else {
                        this.state.set(State::Waiting {
                            sleep: sleep(delay),
                        });
                    }
                }
            }
        }
    }
}

/// Whether the per-attempt timer (if any) has fired; disarms it when it has.
fn attempt_timer_fired(mut timer: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) -> bool {
    let fired = timer
        .as_mut()
        .as_pin_mut()
        .is_some_and(|t| t.poll(cx).is_ready());
    if fired {
        timer.set(None);
    }
    fired
}

/// Polls the attempts left running after their per-attempt timeout; returns the first result
/// that is not retryable (a success or a fatal failure), with its outcome. Their retryable
/// failures were counted when they timed out, and are dropped.
fn poll_lingering<F, RB, E>(
    lingering: &mut Vec<Pin<Box<F>>>,
    policy: &RetryPolicy,
    cx: &mut Context<'_>,
) -> Option<(Result<Response<RB>, BoxError>, Outcome)>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
{
    let mut i = 0;
    while i < lingering.len() {
        let Poll::Ready(result) = lingering[i].as_mut().poll(cx) else {
            i += 1;
            continue;
        };
        drop(lingering.swap_remove(i));
        let result = result.map_err(Into::into);
        let outcome = classify(&*policy.classifier, &result);
        if matches!(outcome, Outcome::Success | Outcome::Fatal(_)) {
            return Some((result, outcome));
        }
    }
    None
}

fn attempt_result<RB>(result: &Result<Response<RB>, BoxError>) -> AttemptResult<'_> {
    match result {
        Ok(response) => AttemptResult::Response {
            status: response.status(),
            headers: response.headers(),
        },
        Err(error) => AttemptResult::Error(&**error),
    }
}

fn classify<RB>(classifier: &dyn Classify, result: &Result<Response<RB>, BoxError>) -> Outcome {
    // Called on the `dyn` itself: `Arc<dyn Classify>` implements `Classify` too, through a
    // call of its own.
    classifier.classify(attempt_result(result))
}

/// The bookkeeping [`decide`] reads and updates.
struct Ctx<'a, B: Replay> {
    policy: &'a RetryPolicy,
    call: &'a Call<B>,
    result: AttemptResult<'a>,
    throttle: Option<&'a dyn RetryThrottle>,
    max_attempts: u32,
    counted: &'a mut u32,
    transparent: &'a mut u32,
    not_sent_in_a_row: &'a mut u32,
    refused_retried: &'a mut bool,
    backoff_attempt: &'a mut u32,
    previous_delay: &'a mut Option<Duration>,
    stats: &'a mut Option<Arc<MethodStats>>,
    stats_source: &'a Stats,
}

/// The A6 rules, applied to one attempt's outcome.
fn decide<B: Replay>(outcome: Outcome, ctx: Ctx<'_, B>) -> Decision {
    let was_retry = *ctx.counted > 1 && *ctx.not_sent_in_a_row == 0;
    let outcome = gate_idempotency(outcome, ctx.policy, ctx.call);
    if was_retry
        && !matches!(
            outcome,
            Outcome::Success | Outcome::NotSent | Outcome::Refused
        )
        && let Some(stats) = ctx.stats.as_ref()
    {
        stats.record_retry_failure();
    }
    // The clock is read only when a delay must fit before the deadline: a success needs none.
    let fits = |delay: Duration| match ctx.call.deadline {
        Some(deadline) => delay < deadline.saturating_duration_since(Instant::now()),
        None => true,
    };
    match outcome {
        Outcome::Success => {
            if let Some(throttle) = ctx.throttle {
                throttle.on_success();
            }
            Decision::Return
        }
        Outcome::Fatal(pushback) => {
            // A6: a pushback saying "do not retry" counts as a failure even on a code that
            // would not be retried.
            if pushback == Some(Pushback::Stop)
                && let Some(throttle) = ctx.throttle
            {
                throttle.on_failure();
            }
            tracing::debug!(attempt = ctx.call.sent, reason = "fatal", "not retrying");
            Decision::Return
        }
        Outcome::NotSent => {
            // Never left the client: safe to retry at any time, with backoff; bounded by the
            // deadline, or by a count when there is none.
            let bounded_out = ctx.call.deadline.is_none()
                && *ctx.not_sent_in_a_row >= ctx.policy.max_transparent_retries;
            if bounded_out || !ctx.call.can_replay() {
                return Decision::Return;
            }
            let delay = ctx.policy.backoff.sample(
                Step {
                    attempt: *ctx.not_sent_in_a_row,
                    previous: None,
                },
                &mut rand::rng(),
            );
            if !fits(delay) {
                return Decision::Return;
            }
            *ctx.not_sent_in_a_row += 1;
            *ctx.transparent += 1;
            tracing::debug!(
                attempt = ctx.call.sent,
                ?delay,
                reason = "not sent",
                "transparent retry"
            );
            Decision::RetryAfter(delay)
        }
        Outcome::Refused if !*ctx.refused_retried => {
            // Reached the server but not its application: once, at once.
            *ctx.not_sent_in_a_row = 0;
            if !ctx.call.can_replay() {
                return Decision::Return;
            }
            *ctx.refused_retried = true;
            *ctx.transparent += 1;
            tracing::debug!(
                attempt = ctx.call.sent,
                reason = "refused",
                "transparent retry"
            );
            Decision::RetryAfter(Duration::ZERO)
        }
        // A second refusal is handled by the policy, like `UNAVAILABLE`.
        Outcome::Refused | Outcome::Retryable(_) => {
            *ctx.not_sent_in_a_row = 0;
            let pushback = outcome.pushback();
            if let Some(throttle) = ctx.throttle {
                throttle.on_failure();
            }
            let stop = |reason: &'static str| {
                tracing::debug!(attempt = ctx.call.sent, reason, "not retrying");
                Decision::Return
            };
            if pushback == Some(Pushback::Stop) {
                return stop("pushback: stop");
            }
            if *ctx.counted >= ctx.max_attempts {
                return stop("max attempts");
            }
            if !ctx.call.can_replay() {
                return stop("committed");
            }
            let delay = match pushback {
                Some(Pushback::After(delay)) => {
                    // The server's delay exactly; the backoff restarts from the initial one.
                    *ctx.backoff_attempt = 0;
                    *ctx.previous_delay = None;
                    delay
                }
                _ => {
                    let delay = ctx.policy.backoff.sample(
                        Step {
                            attempt: *ctx.backoff_attempt,
                            previous: *ctx.previous_delay,
                        },
                        &mut rand::rng(),
                    );
                    *ctx.backoff_attempt = ctx.backoff_attempt.saturating_add(1);
                    *ctx.previous_delay = Some(delay);
                    delay
                }
            };
            let delay = match ctx.policy.on_retry.as_ref() {
                None => delay,
                Some(hook) => match hook(&RetryContext {
                    attempts: *ctx.counted,
                    outcome,
                    result: ctx.result,
                    delay,
                }) {
                    RetryDecision::Proceed => delay,
                    RetryDecision::Delay(delay) => delay,
                    RetryDecision::Stop => return stop("vetoed by on_retry"),
                },
            };
            if !fits(delay) {
                return stop("deadline");
            }
            // Last, since a budget withdraws when it says yes.
            if ctx.throttle.is_some_and(|t| !t.allows_retry()) {
                return stop("throttled");
            }
            *ctx.counted += 1;
            let k = *ctx.counted - 1;
            ctx.stats
                .get_or_insert_with(|| ctx.stats_source.method(ctx.call.path()))
                .record_retry(k);
            tracing::debug!(
                attempt = ctx.call.sent + 1,
                ?delay,
                pushback = pushback.is_some(),
                reason = "retryable",
                "retrying"
            );
            Decision::RetryAfter(delay)
        }
    }
}

/// Non-idempotent HTTP requests are not retried unless the policy opts in: their retryable
/// failures become fatal. Never-sent and refused attempts stay safe to retry.
fn gate_idempotency<B: Replay>(outcome: Outcome, policy: &RetryPolicy, call: &Call<B>) -> Outcome {
    match outcome {
        Outcome::Retryable(pushback) if !may_repeat(policy, call) => Outcome::Fatal(pushback),
        other => other,
    }
}

/// Whether the request may reach the server's application more than once: gRPC, an
/// idempotent method, or a policy that opts in.
fn may_repeat<B: Replay>(policy: &RetryPolicy, call: &Call<B>) -> bool {
    call.grpc
        || policy.retry_non_idempotent
        || call.method().is_idempotent()
        || (policy.retry_with_idempotency_key && call.has_idempotency_key())
}
