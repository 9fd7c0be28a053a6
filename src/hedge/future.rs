//! The hedge layer's response future: several attempts in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tower_service::Service;

use crate::BoxError;
use crate::body::Replay;
use crate::call::{Call, annotate, deadline_fired, no_result};
use crate::classify::{AttemptResult, Outcome};
use crate::error::deadline_exceeded;
use crate::policy::HedgePolicy;
use crate::pushback::Pushback;
use crate::stats::{MethodStats, Stats};
use crate::throttle::RetryThrottle;

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

    pub(crate) fn hedging(hedging: Hedging<S, B>) -> Self {
        ResponseFuture {
            kind: Kind::Hedging {
                hedging: Box::pin(hedging),
            },
        }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Replay,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => future.poll(cx).map_err(Into::into),
            KindProj::Hedging { hedging } => hedging.as_mut().poll(cx),
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

/// One attempt in flight.
struct InFlight<F> {
    future: Pin<Box<F>>,
    // The body reader it sends from, to find the one that goes on after commit.
    reader: u64,
    number: u32,
    sent_at: Instant,
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
        #[pin]
        timer: Sleep,
        timer_armed: bool,
        attempts: Vec<InFlight<S::Future>>,
        // A clone of the inner service, polled ready only when a hedge is about to be sent,
        // so a pending hedge holds no capacity.
        service: S,
        call: Call<B>,
        policy: Arc<HedgePolicy>,
        throttle: Option<Arc<dyn RetryThrottle>>,
        delay: Duration,
        max_attempts: u32,
        max_pushback: Duration,
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
        stats_source: Stats,
        span: tracing::Span,
    }
}

pub(crate) struct HedgingParts<S, B: Replay> {
    pub(crate) service: S,
    pub(crate) call: Call<B>,
    pub(crate) reader: u64,
    pub(crate) policy: Arc<HedgePolicy>,
    pub(crate) throttle: Option<Arc<dyn RetryThrottle>>,
    pub(crate) max_attempts_cap: u32,
    pub(crate) max_pushback: Duration,
    pub(crate) stats: Stats,
}

impl<S, B> Hedging<S, B>
where
    S: Service<Request<B>>,
    B: Replay,
{
    /// Starts a hedged call; `first` is the first attempt, called on the ready service.
    pub(crate) fn new(parts: HedgingParts<S, B>, first: S::Future) -> Self {
        let span = tracing::debug_span!(
            "hedge",
            path = %parts.call.path(),
            http.request.resend_count = tracing::field::Empty,
        );
        let now = Instant::now();
        let delay = parts.policy.delay.current();
        let max_attempts = parts.policy.max_attempts.min(parts.max_attempts_cap);
        let more = max_attempts > 1;
        // The cap is the client's, but still bound what one call reserves up front.
        let mut attempts = Vec::with_capacity(max_attempts.min(8) as usize);
        attempts.push(InFlight {
            future: Box::pin(first),
            reader: parts.reader,
            number: 1,
            sent_at: now,
        });
        Hedging {
            deadline: None,
            timer: sleep_until(instant_after(now, delay)),
            timer_armed: more && !delay.is_zero(),
            attempts,
            service: parts.service,
            call: parts.call,
            policy: parts.policy,
            throttle: parts.throttle,
            delay,
            max_attempts,
            max_pushback: parts.max_pushback,
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
            stats_source: parts.stats,
            span,
        }
    }
}

impl<S, B, RB> Hedging<S, B>
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
        let this = self.project();
        if deadline_fired(this.deadline, this.call.deadline, cx) {
            this.attempts.clear();
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
        if let Some(deadline) = this.deadline.as_mut().as_pin_mut()
            && deadline.poll(cx).is_ready()
        {
            tracing::debug!(attempts = this.call.sent, "deadline exceeded");
            this.attempts.clear();
            return Poll::Ready(Err(deadline_exceeded(this.call.grpc)));
        }
        loop {
            // Once the body outgrew the buffer, only the attempt that sent the most goes on.
            if let Some(reader) = this.call.committed_reader() {
                this.attempts.retain(|a| a.reader == reader);
                *this.stopped = true;
                *this.hedge_due = false;
                *this.timer_armed = false;
            }

            let mut i = 0;
            while i < this.attempts.len() {
                let Poll::Ready(result) = this.attempts[i].future.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let attempt = this.attempts.swap_remove(i);
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
                    Ok(response) => this.policy.classifier.classify(AttemptResult::Response {
                        status: response.status(),
                        headers: response.headers(),
                    }),
                    Err(error) => this
                        .policy
                        .classifier
                        .classify(AttemptResult::Error(&**error)),
                }
                .cap_pushback(*this.max_pushback);
                let now = Instant::now();
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
                        if let Some(throttle) = this.throttle {
                            throttle.on_success();
                        }
                        this.policy.delay.record(now - attempt.sent_at);
                        tracing::debug!(attempt = attempt.number, "hedge won");
                        // Dropping the others cancels them.
                        this.attempts.clear();
                        let (sent, transparent) = (this.call.sent, *this.transparent);
                        return Poll::Ready(
                            result.map(|r| annotate(r, sent, transparent, this.call.grpc)),
                        );
                    }
                    Outcome::Fatal(pushback) => {
                        if pushback == Some(Pushback::Stop)
                            && let Some(throttle) = this.throttle
                        {
                            throttle.on_failure();
                        }
                        tracing::debug!(attempt = attempt.number, "fatal: cancelling the rest");
                        this.attempts.clear();
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
                        if let Some(throttle) = this.throttle {
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
                                this.timer.as_mut().reset(instant_after(now, delay));
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
                && this.attempts.iter().any(|a| a.reader != reader)
            {
                continue;
            }

            if *this.timer_armed && this.timer.as_mut().poll(cx).is_ready() {
                *this.timer_armed = false;
                *this.hedge_due = true;
            }

            let counted_possible = !*this.stopped && *this.counted < *this.max_attempts;
            let want_counted = *this.hedge_due && counted_possible;
            if (want_counted || *this.resends_due > 0) && this.call.can_replay() {
                if want_counted && *this.resends_due == 0 && !*this.throttle_granted {
                    // Asked once per hedge: a budget withdraws when it says yes.
                    if this.throttle.as_ref().is_some_and(|t| !t.allows_retry()) {
                        tracing::debug!("throttled: no more hedges");
                        *this.stopped = true;
                        *this.hedge_due = false;
                        *this.timer_armed = false;
                        continue;
                    }
                    *this.throttle_granted = true;
                }
                match this.service.poll_ready(cx) {
                    Poll::Pending => {}
                    Poll::Ready(Err(error)) => {
                        // The service cannot take more: let the attempts in flight finish.
                        *this.stopped = true;
                        *this.hedge_due = false;
                        *this.resends_due = 0;
                        if this.attempts.is_empty() {
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
                                        this.stats_source.method(this.call.path())
                                    })
                                    .record_retry(k);
                                if *this.counted < *this.max_attempts {
                                    if this.delay.is_zero() {
                                        *this.hedge_due = true;
                                    } else {
                                        this.timer
                                            .as_mut()
                                            .reset(instant_after(Instant::now(), *this.delay));
                                        *this.timer_armed = true;
                                    }
                                }
                            }
                            let number = this.call.sent;
                            this.span.record("http.request.resend_count", number - 1);
                            tracing::debug!(attempt = number, transparent, "sending hedge");
                            let future = Box::pin(this.service.call(request));
                            this.attempts.push(InFlight {
                                future,
                                reader,
                                number,
                                sent_at: Instant::now(),
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

            if this.attempts.is_empty() {
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
