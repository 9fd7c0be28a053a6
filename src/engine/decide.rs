//! The rules that turn one attempt's outcome into the call's next step.

use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};

use super::{AttemptId, CommitBody, Dispatch, Engine, Inputs, Mode, Pending, Verdict, after};
use crate::backoff::Step;
use crate::classify::{AttemptResult, Code, Outcome};
use crate::policy::{RetryContext, RetryDecision};
use crate::pushback::Pushback;

impl Engine {
    /// Attempt `attempt`, which sent body reader `reader` and is no longer live, answered.
    pub(super) fn answer(
        &mut self,
        attempt: AttemptId,
        reader: u64,
        outcome: Outcome,
        result: AttemptResult<'_>,
        body: &dyn CommitBody,
        inputs: &mut Inputs<'_>,
    ) -> Verdict {
        if self
            .retry_state
            .as_ref()
            .is_some_and(|t| attempt.send <= t.timed_out_through)
            && !matches!(outcome, Outcome::Success | Outcome::Fatal(_))
        {
            // Its timeout was counted as its failure already (hedging on per-attempt timeout,
            // which lets it run on): not again; but its answer is the failure the call ends
            // with, if it ends with none better, rather than none at all.
            return self.keep(attempt);
        }
        if !matches!(outcome, Outcome::NotSent)
            && let Some(retry_state) = &mut self.retry_state
        {
            retry_state.not_sent_in_a_row = 0;
        }
        match self.gate(outcome) {
            Outcome::Success => {
                if !self.claim(attempt, reader, body) {
                    return Verdict::Drop;
                }
                if let Some(throttle) = &self.rules.throttle {
                    throttle.on_success();
                }
                tracing::debug!(attempt = attempt.send, reason = "success", "committed");
                Verdict::Return(self.marks())
            }
            Outcome::Fatal(pushback) => {
                if !self.claim(attempt, reader, body) {
                    return Verdict::Drop;
                }
                self.count_retry_failure(attempt);
                // A6: a pushback saying "do not retry" counts as a failure even on a code
                // that would not be retried. A delay over the client's cap is the client's
                // choice, not the server's: it does not count.
                if let Some(throttle) = &self.rules.throttle {
                    if pushback == Some(Pushback::Stop) {
                        throttle.on_failure();
                    } else {
                        throttle.on_fatal();
                    }
                }
                tracing::debug!(attempt = attempt.send, reason = "fatal", "committed");
                Verdict::Return(self.marks())
            }
            Outcome::NotSent if self.rules.wait_for_ready => {
                self.not_sent(attempt, inputs);
                self.keep(attempt)
            }
            Outcome::NotSent => {
                // No connection could be made: gRPC's default (not waiting for ready) makes
                // it an `UNAVAILABLE` failure for the policy. It never reached the server,
                // so the method's idempotency does not stop a retry.
                match self.unavailable_as_the_policy_sees_it() {
                    outcome @ Outcome::Retryable(_) => {
                        self.count_retry_failure(attempt);
                        self.retryable_never_reached(outcome, result, inputs);
                        self.keep(attempt)
                    }
                    _ => {
                        let fatal = Outcome::Fatal(None);
                        self.answer(attempt, reader, fatal, result, body, inputs)
                    }
                }
            }
            Outcome::Refused if !self.retry_state().refused_retried && self.replayable() => {
                // Reached the server but not its application: once, at once.
                self.retry_state().refused_retried = true;
                self.resend(attempt, inputs.now(), Duration::ZERO, "refused");
                self.keep(attempt)
            }
            Outcome::Refused => {
                // A second refusal is the policy's to judge, as the `UNAVAILABLE` it maps to.
                let outcome = self.unavailable_as_the_policy_sees_it();
                self.retry_state().refused_retried = true;
                if outcome == Outcome::Refused {
                    if !self.claim(attempt, reader, body) {
                        return Verdict::Drop;
                    }
                    tracing::debug!(attempt = attempt.send, reason = "refused", "committed");
                    return Verdict::Return(self.marks());
                }
                self.answer(attempt, reader, outcome, result, body, inputs)
            }
            outcome @ Outcome::Retryable(_) => {
                self.count_retry_failure(attempt);
                self.retryable(outcome, result, inputs, false);
                self.keep(attempt)
            }
        }
    }

    /// Keeps `attempt`'s failure as the call's last.
    fn keep(&mut self, attempt: AttemptId) -> Verdict {
        self.retry_state().last = Some(attempt);
        Verdict::Keep
    }

    fn count_retry_failure(&mut self, attempt: AttemptId) {
        if attempt.number > 1 {
            self.retry_state().records.retry_failure();
        }
    }

    /// Non-idempotent HTTP requests are not repeated unless the policy opts in: their
    /// retryable failures are fatal. Never-sent and refused attempts stay safe to resend.
    pub(super) fn gate(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Retryable(pushback) if !self.rules.may_repeat => Outcome::Fatal(pushback),
            other => other,
        }
    }

    /// How the policy's classifier sees an attempt that did not reach the server's
    /// application (a second refused stream, or no connection without wait-for-ready): as
    /// `UNAVAILABLE` for gRPC, as a 503 for HTTP.
    fn unavailable_as_the_policy_sees_it(&self) -> Outcome {
        let headers = HeaderMap::new();
        let result = if self.rules.grpc {
            AttemptResult::Status {
                code: Code::Unavailable,
                pushback: None,
            }
        } else {
            AttemptResult::Response {
                status: StatusCode::SERVICE_UNAVAILABLE,
                headers: &headers,
            }
        };
        self.rules.classifier().classify(result)
    }

    /// A never-sent attempt: resent with backoff until the deadline (or a count of them,
    /// without one), in every mode alike.
    fn not_sent(&mut self, attempt: AttemptId, inputs: &mut Inputs<'_>) {
        let bounded_out = self.deadline.is_none()
            && self.retry_state().not_sent_in_a_row >= self.rules.max_transparent();
        if bounded_out || !self.replayable() {
            let reason = if bounded_out {
                "transparent retries exhausted"
            } else {
                "not replayable"
            };
            tracing::debug!(attempt = attempt.send, reason, "not retrying");
            return;
        }
        let step = Step {
            attempt: self.retry_state().not_sent_in_a_row,
            previous: None,
        };
        let delay = self.rules.backoff().sample(step, inputs.rng());
        let now = inputs.now();
        if !self.fits(now, delay) {
            tracing::debug!(attempt = attempt.send, reason = "deadline", "not retrying");
            return;
        }
        self.retry_state().not_sent_in_a_row += 1;
        self.resend(attempt, now, delay, "not sent");
    }

    /// Schedules a transparent resend of `attempt`.
    fn resend(&mut self, attempt: AttemptId, now: Instant, delay: Duration, reason: &str) {
        tracing::debug!(attempt = attempt.send, ?delay, reason, "transparent retry");
        let hedge = !self.live.is_empty();
        self.retry_state().resends.push(Pending {
            at: Some(after(now, delay)),
            send: Dispatch {
                number: attempt.number,
                transparent: true,
                hedge,
            },
            granted: true,
            backup: false,
        });
    }

    /// Whether an attempt starting `delay` from `now` starts before the deadline.
    fn fits(&self, now: Instant, delay: Duration) -> bool {
        self.deadline
            .is_none_or(|deadline| delay < deadline.saturating_duration_since(now))
    }

    /// A retryable (non-fatal) failure: counts against the throttle; then the next attempt
    /// is scheduled as the mode says. `at_once`: a hedge on the per-attempt timeout.
    pub(super) fn retryable(
        &mut self,
        outcome: Outcome,
        result: AttemptResult<'_>,
        inputs: &mut Inputs<'_>,
        at_once: bool,
    ) {
        self.retry(outcome, result, inputs, at_once, self.rules.may_repeat);
    }

    /// A retryable failure of an attempt that never reached the server: retried whatever
    /// the method's idempotency.
    fn retryable_never_reached(
        &mut self,
        outcome: Outcome,
        result: AttemptResult<'_>,
        inputs: &mut Inputs<'_>,
    ) {
        self.retry(outcome, result, inputs, false, true);
    }

    /// A retryable failure: see [`retryable`](Self::retryable); `may_repeat` says whether
    /// this attempt's request may reach the server's application again.
    fn retry(
        &mut self,
        outcome: Outcome,
        result: AttemptResult<'_>,
        inputs: &mut Inputs<'_>,
        at_once: bool,
        may_repeat: bool,
    ) {
        if let Some(throttle) = &self.rules.throttle {
            throttle.on_failure();
        }
        let pushback = match outcome.pushback() {
            Some(Pushback::After(delay)) if delay > self.rules.max_pushback => {
                tracing::debug!(?delay, "pushback over the cap");
                Some(Pushback::Stop)
            }
            other => other,
        };
        if let Mode::Hedge(..) = self.rules.mode {
            self.next_hedge(pushback, inputs.now(), may_repeat);
            return;
        }
        let stop = |engine: &mut Engine, reason: &'static str| {
            tracing::debug!(attempt = engine.sent, reason, "not retrying");
            engine.stopped = true;
        };
        if pushback == Some(Pushback::Stop) {
            return stop(self, "pushback: stop");
        }
        if !self.may_count(may_repeat) {
            // Before the hook and the throttle: a call that cannot repeat asks neither.
            let reason = if !self.replayable() {
                "not replayable"
            } else if !may_repeat {
                "not idempotent"
            } else {
                "max attempts"
            };
            return stop(self, reason);
        }
        let delay = match pushback {
            Some(Pushback::After(delay)) => {
                // The server's delay exactly; the backoff restarts from its first step.
                self.retry_state().backoff_step = 0;
                self.retry_state().previous_delay = None;
                delay
            }
            _ if at_once => Duration::ZERO,
            _ => {
                let retry_state = self.retry_state();
                let step = Step {
                    attempt: retry_state.backoff_step,
                    previous: retry_state.previous_delay,
                };
                let delay = self.rules.backoff().sample(step, inputs.rng());
                let retry_state = self.retry_state();
                retry_state.backoff_step = retry_state.backoff_step.saturating_add(1);
                retry_state.previous_delay = Some(delay);
                delay
            }
        };
        let delay = match self.hook(outcome, result, delay) {
            Some(delay) => match pushback {
                // A hook may lengthen a delay, never shorten the server's.
                Some(Pushback::After(server)) => delay.max(server),
                _ => delay,
            },
            None => return stop(self, "vetoed by on_retry"),
        };
        let now = inputs.now();
        if !self.fits(now, delay) {
            // Fail fast: the next attempt could not start before the deadline.
            return stop(self, "deadline");
        }
        // Last, since a budget withdraws when it says yes.
        if self.throttle_refuses() {
            return;
        }
        let reason = match pushback {
            Some(Pushback::After(_)) => "pushback",
            _ if at_once => "per-attempt timeout",
            _ => "backoff",
        };
        tracing::debug!(attempt = self.sent + 1, ?delay, reason, "retrying");
        self.next = Some(Pending {
            at: Some(after(now, delay)),
            send: Dispatch {
                number: self.counted + 1,
                transparent: false,
                hedge: at_once,
            },
            granted: true,
            backup: false,
        });
    }

    /// The retry policy's `on_retry` hook on a delay; `None` when it stops the retries.
    fn hook(
        &self,
        outcome: Outcome,
        result: AttemptResult<'_>,
        delay: Duration,
    ) -> Option<Duration> {
        let Mode::Retry(policy) = &self.rules.mode else {
            return Some(delay);
        };
        let Some(hook) = &policy.on_retry else {
            return Some(delay);
        };
        match hook(&RetryContext {
            attempts: self.counted,
            outcome,
            result,
            delay,
        }) {
            RetryDecision::Proceed => Some(delay),
            RetryDecision::Delay(delay) => Some(delay),
            RetryDecision::Stop => None,
        }
    }

    /// A non-fatal hedge failure: the next hedge goes now, or after the server's pushback,
    /// or never; later ones follow at the hedging delay from it. The next hedge replaces the
    /// attempt that failed: it is no backup, so the hedge budget leaves it alone.
    fn next_hedge(&mut self, pushback: Option<Pushback>, now: Instant, may_repeat: bool) {
        if pushback == Some(Pushback::Stop) {
            tracing::debug!(
                attempt = self.sent,
                reason = "pushback: stop",
                "not retrying"
            );
            self.stopped = true;
            self.next = None;
            return;
        }
        let delay = match pushback {
            Some(Pushback::After(delay)) => delay,
            _ => Duration::ZERO,
        };
        let at = after(now, delay);
        if let Some(next) = &mut self.next {
            next.at = Some(at);
            next.backup = false;
        } else if self.may_count(may_repeat) {
            self.next = Some(Pending {
                at: Some(at),
                send: Dispatch {
                    number: self.counted + 1,
                    transparent: false,
                    hedge: true,
                },
                granted: false,
                backup: false,
            });
        } else {
            return;
        }
        tracing::debug!(?delay, "next hedge");
    }
}

impl Engine {
    /// The latest counted attempt outlived its per-attempt timeout.
    pub(super) fn on_attempt_timeout(&mut self, attempt: AttemptId, inputs: &mut Inputs<'_>) {
        let Some((_, hedge)) = self.rules.per_attempt_timeout() else {
            return;
        };
        if !self.live.contains(attempt) {
            return;
        }
        tracing::debug!(attempt = attempt.send, "per-attempt timeout");
        self.retry_state().timed_out_through = attempt.send;
        let timed_out = crate::error::AttemptTimedOut::new();
        let result = AttemptResult::Error(&timed_out);
        if hedge {
            // Hedge on per-attempt timeout: the slow attempt goes on, the next starts now.
            // A request that may not be repeated just waits, and its timeout does not count
            // against the throttle, as when it is not retried.
            if !self.rules.may_repeat {
                tracing::debug!(
                    attempt = attempt.send,
                    reason = "not idempotent",
                    "not retrying"
                );
                return;
            }
            self.retryable(Outcome::Retryable(None), result, inputs, true);
            return;
        }
        self.live.remove(attempt);
        let retry_state = self.retry_state();
        retry_state.timed_out = Some(attempt);
        retry_state.last = Some(attempt);
        retry_state.not_sent_in_a_row = 0;
        match self.gate(Outcome::Retryable(None)) {
            outcome @ Outcome::Retryable(_) => self.retryable(outcome, result, inputs, false),
            _ => self.stopped = true,
        }
    }
}
