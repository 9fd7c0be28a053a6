//! The hedge layer's response future: several attempts in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::BoxError;
use crate::body::Replay;
use crate::call::{Call, Shared, annotate, deadline_fired, no_result};
use crate::classify::{AttemptResult, Outcome};
use crate::error::deadline_exceeded;
use crate::policy::ThrottleHandle;
use crate::pushback::Pushback;
use crate::stats::MethodStats;

pin_project! {
    /// The response future of [`Hedge`](super::Hedge).
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
        // No hedging policy for the method: the inner future as it is.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // A hedged call.
        // Boxed: the state of a call with a policy is large, and a passthrough call should
        // not move it around.
        Hedging {
            hedging: Pin<Box<Hedging<S, B>>>,
        },
        // The policy was missing from the table (never expected).
        Finished,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    pub(crate) fn passthrough(future: S::Future) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn hedging(hedging: Option<Hedging<S, B>>) -> Self {
        let kind = match hedging {
            Some(hedging) => Kind::Hedging {
                hedging: Box::pin(hedging),
            },
            None => Kind::Finished,
        };
        ResponseFuture { kind }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => future.poll(cx).map_err(Into::into),
            KindProj::Hedging { hedging } => hedging.as_mut().poll(cx),
            KindProj::Finished => Poll::Ready(Err(no_result())),
        }
    }
}

/// What tokio's `sleep` takes for a delay past what the clock can hold: about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `now + delay`, saturating rather than panicking on a delay too large for the clock (a
/// policy's delay and a classifier's pushback are any `Duration`).
fn instant_after(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// Sets the hedge timer to fire at `at`: resets it if it exists, else leaves it to be made
/// at `at` when next polled.
fn arm(timer: Pin<&mut Option<Sleep>>, timer_at: &mut Option<Instant>, at: Instant) {
    *timer_at = Some(at);
    if let Some(timer) = timer.as_pin_mut() {
        timer.reset(at);
    }
}

/// What the engine knows of one attempt in flight.
#[derive(Clone, Copy)]
struct Attempt {
    // The body reader it sends from, to find the one that goes on after commit.
    reader: u64,
    number: u32,
    // When it was sent; for the first attempt, stamped at the first poll, and only when
    // an adaptive delay needs it.
    sent_at: Option<Instant>,
}

/// A hedge in flight: boxed, so that the list can grow and shrink under it.
struct InFlight<F> {
    future: Pin<Box<F>>,
    attempt: Attempt,
}

pin_project! {
    /// The first attempt in flight, kept in place: a call that ends on its first attempt
    /// allocates nothing for it.
    struct FirstAttempt<F> {
        #[pin]
        future: F,
        attempt: Attempt,
    }
}

pin_project! {
    /// The state of a hedged call.
    pub(crate) struct Hedging<S, B>
    where
        S: Service<Request<B>>,
        B: Replay,
    {
        // Fires when the call's deadline passes; armed once an attempt is pending.
        #[pin]
        deadline: Option<Sleep>,
        // Fires when the next hedge is due; armed only while one is scheduled.
        // Made only once the call is pending: a call answered on its first poll needs no
        // timer, and making one costs a clock read and a runtime-handle clone.
        #[pin]
        timer: Option<Sleep>,
        // When the next hedge is due, while `timer_armed`; for the first hedge, set when the
        // call is first left pending: the hedging delay runs from the first poll.
        timer_at: Option<Instant>,
        timer_armed: bool,
        #[pin]
        first: Option<FirstAttempt<S::Future>>,
        // The hedges after the first attempt; allocated only once one is sent.
        hedges: Vec<InFlight<S::Future>>,
        // A clone of the layer's spare service, made when the first hedge is about to be
        // sent (most calls send none) and polled ready only then, so a pending hedge holds no
        // capacity.
        service: Option<S>,
        call: Call<B>,
        // The spare service and the table: the policy, the shared throttle and the
        // statistics are reached through it.
        shared: Arc<Shared<S>>,
        index: usize,
        // The throttle of the request's authority, when the table keeps one per authority.
        authority_throttle: Option<ThrottleHandle>,
        delay: Duration,
        max_attempts: u32,
        // Attempts that count toward `max_attempts`.
        counted: u32,
        // A counted hedge should go as soon as the service is ready.
        hedge_due: bool,
        // The throttle already allowed the hedge that is waiting for the service.
        throttle_granted: bool,
        // Transparent resends waiting to go (never sent, or refused).
        resends_due: u32,
        transparent: u32,
        transparent_left: u32,
        refused_retried: bool,
        // No more counted hedges: pushback said stop, the throttle said no, or the call is
        // committed.
        stopped: bool,
        last: Option<Result<S::Response, BoxError>>,
        stats: Option<Arc<MethodStats>>,
        span: tracing::Span,
    }
}

pub(crate) struct HedgingParts<S, B: Replay> {
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) call: Call<B>,
    pub(crate) reader: u64,
    // Where the call's hedging policy is in the table.
    pub(crate) index: usize,
    pub(crate) authority_throttle: Option<ThrottleHandle>,
    pub(crate) span: tracing::Span,
}

impl<S, B> Hedging<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// Starts a hedged call; `first` is the first attempt, called on the ready service.
    pub(crate) fn new(parts: HedgingParts<S, B>, first: S::Future) -> Option<Self> {
        let policies = &parts.shared.policies;
        let policy = policies.hedge_policy(parts.index)?;
        let delay = policy.delay.current();
        let max_attempts = policy.max_attempts.min(policies.max_attempts_cap());
        let more = max_attempts > 1;
        Some(Hedging {
            deadline: None,
            timer: None,
            timer_at: None,
            timer_armed: more && !delay.is_zero(),
            first: Some(FirstAttempt {
                future: first,
                attempt: Attempt {
                    reader: parts.reader,
                    number: 1,
                    sent_at: None,
                },
            }),
            hedges: Vec::new(),
            service: None,
            call: parts.call,
            shared: parts.shared,
            index: parts.index,
            authority_throttle: parts.authority_throttle,
            delay,
            max_attempts,
            counted: 1,
            hedge_due: more && delay.is_zero(),
            throttle_granted: false,
            resends_due: 0,
            transparent: 0,
            transparent_left: crate::policy::DEFAULT_MAX_TRANSPARENT_RETRIES,
            refused_retried: false,
            stopped: false,
            last: None,
            stats: None,
            span: parts.span,
        })
    }
}

impl<S, B, RB> Hedging<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
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
            this.first.set(None);
            this.hedges.clear();
            return Poll::Ready(Err(deadline_exceeded(this.call.grpc)));
        }
        Poll::Pending
    }

    fn poll_attempts(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<RB>, BoxError>> {
        let mut this = self.project();
        let shared: &Shared<S> = this.shared;
        let policies = &shared.policies;
        let Some(policy) = policies.hedge_policy(*this.index) else {
            return Poll::Ready(Err(no_result()));
        };
        let throttle = policies.call_throttle(this.authority_throttle.as_ref());
        let _enter = this.span.enter();
        if let Some(deadline) = this.deadline.as_mut().as_pin_mut()
            && deadline.poll(cx).is_ready()
        {
            tracing::debug!(attempts = this.call.sent, "deadline exceeded");
            this.first.set(None);
            this.hedges.clear();
            return Poll::Ready(Err(deadline_exceeded(this.call.grpc)));
        }
        if policy.delay.is_adaptive()
            && let Some(first) = this.first.as_mut().as_pin_mut()
        {
            let attempt = first.project().attempt;
            if attempt.sent_at.is_none() {
                attempt.sent_at = Some(Instant::now());
            }
        }
        loop {
            // Once the body outgrew the buffer, only the attempt that sent the most goes on.
            if let Some(reader) = this.call.committed_reader() {
                if this
                    .first
                    .as_ref()
                    .as_pin_ref()
                    .is_some_and(|first| first.attempt.reader != reader)
                {
                    this.first.set(None);
                }
                this.hedges.retain(|h| h.attempt.reader == reader);
                *this.stopped = true;
                *this.hedge_due = false;
                *this.timer_armed = false;
            }

            // The first attempt, then each hedge; a finished one leaves the list.
            let mut i = 0;
            let mut first_polled = false;
            loop {
                let (result, attempt) = if !first_polled {
                    first_polled = true;
                    let Some(first) = this.first.as_mut().as_pin_mut() else {
                        continue;
                    };
                    let first = first.project();
                    let Poll::Ready(result) = first.future.poll(cx) else {
                        continue;
                    };
                    let attempt = *first.attempt;
                    this.first.set(None);
                    (result, attempt)
                } else {
                    let Some(hedge) = this.hedges.get_mut(i) else {
                        break;
                    };
                    let Poll::Ready(result) = hedge.future.as_mut().poll(cx) else {
                        i += 1;
                        continue;
                    };
                    (result, this.hedges.swap_remove(i).attempt)
                };
                // An attempt polled before this one may just have committed the body to
                // itself: this one was cut off, and its result (a body error) means nothing.
                if this
                    .call
                    .committed_reader()
                    .is_some_and(|reader| reader != attempt.reader)
                {
                    continue;
                }
                let result = result.map_err(Into::into);
                let outcome = match &result {
                    Ok(response) => (*policy.classifier).classify(AttemptResult::Response {
                        status: response.status(),
                        headers: response.headers(),
                    }),
                    Err(error) => (*policy.classifier).classify(AttemptResult::Error(&**error)),
                }
                .cap_pushback(policies.max_pushback());
                // The clock is read only when needed: a fixed delay learns nothing from a
                // success's latency.
                let now = Instant::now;
                if attempt.number > 1
                    && !matches!(
                        outcome,
                        Outcome::Success | Outcome::NotSent | Outcome::Refused
                    )
                    && let Some(stats) = this.stats.as_ref()
                {
                    stats.record_retry_failure();
                }
                match outcome {
                    Outcome::Success => {
                        if let Some(throttle) = throttle {
                            throttle.on_success();
                        }
                        if policy.delay.is_adaptive()
                            && let Some(sent_at) = attempt.sent_at
                        {
                            policy
                                .delay
                                .record(now().saturating_duration_since(sent_at));
                        }
                        tracing::debug!(attempt = attempt.number, "hedge won");
                        // Dropping the others cancels them.
                        this.first.set(None);
                        this.hedges.clear();
                        let (sent, transparent) = (this.call.sent, *this.transparent);
                        return Poll::Ready(
                            result.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                        );
                    }
                    Outcome::Fatal(pushback) => {
                        if pushback == Some(Pushback::Stop)
                            && let Some(throttle) = throttle
                        {
                            throttle.on_failure();
                        }
                        tracing::debug!(attempt = attempt.number, "fatal: cancelling the rest");
                        this.first.set(None);
                        this.hedges.clear();
                        let (sent, transparent) = (this.call.sent, *this.transparent);
                        return Poll::Ready(
                            result.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                        );
                    }
                    Outcome::NotSent if *this.transparent_left > 0 => {
                        *this.transparent_left -= 1;
                        *this.resends_due += 1;
                        *this.last = Some(result);
                    }
                    Outcome::Refused if !*this.refused_retried => {
                        *this.refused_retried = true;
                        *this.resends_due += 1;
                        *this.last = Some(result);
                    }
                    Outcome::NotSent | Outcome::Refused | Outcome::Retryable(_) => {
                        // Non-fatal: counts against the throttle, and the next hedge goes
                        // now, or after the server's pushback, or never.
                        if let Some(throttle) = throttle {
                            throttle.on_failure();
                        }
                        match outcome.pushback() {
                            Some(Pushback::Stop) => {
                                tracing::debug!(attempt = attempt.number, "pushback: stop");
                                *this.stopped = true;
                                *this.hedge_due = false;
                                *this.timer_armed = false;
                            }
                            Some(Pushback::After(delay)) => {
                                tracing::debug!(attempt = attempt.number, ?delay, "pushback");
                                *this.hedge_due = false;
                                let at = instant_after(now(), delay);
                                arm(this.timer.as_mut(), this.timer_at, at);
                                *this.timer_armed = true;
                            }
                            None => {
                                tracing::debug!(
                                    attempt = attempt.number,
                                    "non-fatal: next hedge now"
                                );
                                *this.hedge_due = true;
                                *this.timer_armed = false;
                            }
                        }
                        *this.last = Some(result);
                    }
                }
            }

            // The body may have been committed while the attempts were polled: cancel the
            // others now, as A6 asks, not at some later wake-up.
            if let Some(reader) = this.call.committed_reader()
                && (this
                    .first
                    .as_ref()
                    .as_pin_ref()
                    .is_some_and(|first| first.attempt.reader != reader)
                    || this.hedges.iter().any(|h| h.attempt.reader != reader))
            {
                continue;
            }

            if *this.timer_armed {
                // The first hedge's time is set when the call is first left pending: the
                // hedging delay runs from the first poll.
                let delay = *this.delay;
                let at = *this
                    .timer_at
                    .get_or_insert_with(|| instant_after(Instant::now(), delay));
                if deadline_fired(this.timer.as_mut(), Some(at), cx) {
                    *this.timer_armed = false;
                    *this.hedge_due = true;
                }
            }

            let in_flight = this.first.is_some() || !this.hedges.is_empty();
            let counted_possible = !*this.stopped && *this.counted < *this.max_attempts;
            let want_counted = *this.hedge_due && counted_possible;
            if (want_counted || *this.resends_due > 0) && this.call.can_replay() {
                if want_counted && *this.resends_due == 0 && !*this.throttle_granted {
                    // Asked once per hedge: a budget withdraws when it says yes.
                    if throttle.is_some_and(|t| !t.allows_retry()) {
                        tracing::debug!("throttled: no more hedges");
                        *this.stopped = true;
                        *this.hedge_due = false;
                        *this.timer_armed = false;
                        continue;
                    }
                    *this.throttle_granted = true;
                }
                let service = this.service.get_or_insert_with(|| shared.service());
                match service.poll_ready(cx) {
                    Poll::Pending => {}
                    Poll::Ready(Err(error)) => {
                        // The service cannot take more: let the attempts in flight finish.
                        *this.stopped = true;
                        *this.hedge_due = false;
                        *this.resends_due = 0;
                        if !in_flight {
                            return Poll::Ready(Err(error.into()));
                        }
                    }
                    Poll::Ready(Ok(())) => {
                        if let Some((request, reader)) = this.call.next_request(true) {
                            let transparent = *this.resends_due > 0;
                            if transparent {
                                *this.resends_due -= 1;
                                *this.transparent += 1;
                            } else {
                                *this.counted += 1;
                                *this.hedge_due = false;
                                *this.throttle_granted = false;
                                let k = *this.counted - 1;
                                this.stats
                                    .get_or_insert_with(|| {
                                        policies.stats().method(this.call.path())
                                    })
                                    .record_retry(k);
                                if *this.counted < *this.max_attempts {
                                    if this.delay.is_zero() {
                                        *this.hedge_due = true;
                                    } else {
                                        let at = instant_after(Instant::now(), *this.delay);
                                        arm(this.timer.as_mut(), this.timer_at, at);
                                        *this.timer_armed = true;
                                    }
                                }
                            }
                            let number = this.call.sent;
                            this.span.record("http.request.resend_count", number - 1);
                            tracing::debug!(attempt = number, transparent, "sending hedge");
                            let future = Box::pin(service.call(request));
                            if this.hedges.capacity() == 0 {
                                // The cap is the client's, but still bound what one call
                                // reserves up front.
                                this.hedges
                                    .reserve(this.max_attempts.saturating_sub(1).min(8) as usize);
                            }
                            this.hedges.push(InFlight {
                                future,
                                attempt: Attempt {
                                    reader,
                                    number,
                                    sent_at: Some(Instant::now()),
                                },
                            });
                            // Poll the new attempt, and maybe send another.
                            continue;
                        }
                        *this.stopped = true;
                        *this.hedge_due = false;
                        *this.resends_due = 0;
                    }
                }
            } else if !this.call.can_replay() {
                *this.resends_due = 0;
            }

            if this.first.is_none() && this.hedges.is_empty() {
                let more_coming = *this.resends_due > 0
                    || (counted_possible && (*this.hedge_due || *this.timer_armed));
                if !more_coming || !this.call.can_replay() {
                    let (sent, transparent) = (this.call.sent, *this.transparent);
                    let last = this.last.take().unwrap_or_else(|| Err(no_result()));
                    return Poll::Ready(
                        last.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                    );
                }
                if *this.hedge_due || *this.resends_due > 0 {
                    // Waiting on the service's readiness alone.
                    return Poll::Pending;
                }
            }
            return Poll::Pending;
        }
    }
}
