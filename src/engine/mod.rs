//! The A6 call as a plain state machine: events in, actions out.
//!
//! Every rule of gRFC A6 that decides what a call does next lives here once, for both
//! layers: a retried call is a hedged call with one attempt in flight and no hedging delay.
//! The engine owns no futures, reads no clock (the driver passes the time in, read lazily
//! through [`Now`]) and does no IO; the layers' futures drive it:
//!
//! ```text
//! events in:   on_answer (attempt n, its Outcome) | on_commit (the body went to attempt n)
//!              | on_service_error | poll(now): timers that are due
//! actions out: Send (counted or transparent, retry or hedge) | Cancel (one, or all but one)
//!              | ReturnLast | DeadlineExceeded | Wait(until)
//! ```
//!
//! The engine also keeps the throttle's books (it is a plain shared counter) and the
//! counters behind [`Attempts`] and the statistics.

mod decide;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Exponential};
use crate::classify::{AttemptResult, Classify, Outcome};
use crate::metadata::Attempts;
use crate::policy::{HedgePolicy, RetryPolicy, ThrottleHandle};

/// One attempt of a call: the order it was sent in and the counted attempt it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttemptId {
    /// 1 for the first attempt sent, then 2, 3, … for every send, transparent ones included.
    pub(crate) send: u32,
    /// The counted attempt this send makes: a transparent resend repeats the number of the
    /// attempt it replaces. `grpc-previous-rpc-attempts` is this number minus one.
    pub(crate) number: u32,
}

impl AttemptId {
    /// The first attempt of every call.
    pub(crate) const FIRST: AttemptId = AttemptId { send: 1, number: 1 };
}

/// An attempt the driver should send as soon as its service is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Send {
    /// The counted attempt it makes (see [`AttemptId::number`]).
    pub(crate) number: u32,
    /// A transparent retry: it counts toward neither `maxAttempts` nor the throttle.
    pub(crate) transparent: bool,
    /// Sent while earlier attempts may still be in flight.
    pub(crate) hedge: bool,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send this attempt now (once the service is ready), then report it with
    /// [`Engine::on_sent`]. Asked again, the engine gives the same send until it is sent.
    Send(Send),
    /// Drop these attempts: dropping an attempt's future cancels it.
    Cancel(Cancel),
    /// Return the last failure kept (see [`Verdict::Keep`]).
    ReturnLast,
    /// The call's deadline passed: drop every attempt and fail.
    DeadlineExceeded,
    /// Nothing to do until an attempt answers, the body commits, or this time comes.
    Wait(Option<Instant>),
}

/// Which attempts to drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// Every attempt but this one (the call is committed to it).
    AllBut(AttemptId),
    /// Every attempt: the call is committed to none that is still in flight.
    All,
    /// This attempt outlived its per-attempt timeout: its result is an "attempt timed out"
    /// failure, to keep as the last one.
    TimedOut(AttemptId),
}

/// What to do with an attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Return it now; every other attempt is cancelled.
    Return,
    /// Keep it as the call's last failure, returned if nothing better comes.
    Keep,
    /// Drop it: it means nothing (an attempt cut off by a commit, or one whose timeout was
    /// already counted as its failure).
    Drop,
}

/// The time, read once and only if a rule needs it: a call answered at once never reads the
/// clock.
pub(crate) struct Now<'a> {
    read: &'a dyn Fn() -> Instant,
    value: Option<Instant>,
}

impl<'a> Now<'a> {
    /// A time read from `read` the first time it is asked for.
    pub(crate) fn lazy(read: &'a dyn Fn() -> Instant) -> Now<'a> {
        Now { read, value: None }
    }

    pub(crate) fn get(&mut self) -> Instant {
        *self.value.get_or_insert_with(self.read)
    }

    /// Forgets the time read: a timer fired, so the clock has moved past it.
    pub(crate) fn reset(&mut self) {
        self.value = None;
    }
}

/// How a call makes its attempts after the first.
#[derive(Clone)]
pub(crate) enum Mode {
    /// One attempt at a time, the next after a backoff (A6 `retryPolicy`).
    Retry(Arc<RetryPolicy>),
    /// A new attempt every `delay`, without waiting for answers (A6 `hedgingPolicy`).
    Hedge(Arc<HedgePolicy>, Duration),
    /// No policy: only transparent retries (A6 applies them "regardless of the retry
    /// configuration"), each answer final.
    Single,
}

/// What a call's rules are made of: its policy and what the table says of every call.
pub(crate) struct Rules {
    pub(crate) mode: Mode,
    /// `maxAttempts`, clamped to the client's cap.
    pub(crate) max_attempts: u32,
    /// Whether the request may reach the server's application more than once (gRPC, an
    /// idempotent HTTP method, or an opt-in). When not, only transparent retries are made.
    pub(crate) may_repeat: bool,
    pub(crate) grpc: bool,
    /// The longest pushback waited out; a longer one stops the retries.
    pub(crate) max_pushback: Duration,
    pub(crate) throttle: Option<ThrottleHandle>,
}

impl Rules {
    fn classifier(&self) -> &dyn Classify {
        match &self.mode {
            Mode::Retry(policy) => &*policy.classifier,
            Mode::Hedge(policy, _) => &*policy.classifier,
            Mode::Single => &NoPolicy,
        }
    }

    /// The backoff of retries after a failure, and of never-sent resends.
    fn backoff(&self) -> &dyn Backoff {
        match &self.mode {
            Mode::Retry(policy) => &*policy.backoff,
            Mode::Hedge(..) | Mode::Single => &TRANSPARENT_BACKOFF,
        }
    }

    fn max_transparent(&self) -> u32 {
        match &self.mode {
            Mode::Retry(policy) => policy.max_transparent_retries,
            Mode::Hedge(..) | Mode::Single => crate::policy::DEFAULT_MAX_TRANSPARENT_RETRIES,
        }
    }

    fn hedging_delay(&self) -> Option<Duration> {
        match &self.mode {
            Mode::Hedge(_, delay) => Some(*delay),
            _ => None,
        }
    }

    fn per_attempt_timeout(&self) -> Option<(Duration, bool)> {
        match &self.mode {
            Mode::Retry(policy) => policy
                .per_attempt_timeout
                .map(|timeout| (timeout, policy.hedge_on_per_attempt_timeout)),
            _ => None,
        }
    }
}

/// How a call without a policy sees its answers: final, successes credit the throttle. A
/// gRPC status is read where there is one (OK or a committed response is a success); an HTTP
/// 5xx or 429 is a failure; errors are checked for never-sent and refused attempts.
#[derive(Debug)]
struct NoPolicy;

impl Classify for NoPolicy {
    fn classify(&self, result: AttemptResult<'_>) -> Outcome {
        match result {
            AttemptResult::Response { status, headers } => {
                let failed = match crate::classify::grpc_status(status, headers) {
                    Some(code) if headers.contains_key("grpc-status") => {
                        code != crate::classify::Code::Ok
                    }
                    _ => status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS,
                };
                if failed {
                    Outcome::Fatal(None)
                } else {
                    Outcome::Success
                }
            }
            AttemptResult::Error(error) => {
                crate::classify::transport_outcome(error).unwrap_or(Outcome::Fatal(None))
            }
        }
    }
}

/// The backoff of never-sent resends for calls whose policy has none (hedges, no policy):
/// A6's example schedule, so that a client that cannot connect does not spin.
const TRANSPARENT_BACKOFF: Exponential = Exponential::A6_EXAMPLE;

/// A send the engine has decided on, due at `at`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// `None` until the call starts waiting: the first hedge's delay runs from the first
    /// poll, and a call answered on that poll never reads the clock.
    at: Option<Instant>,
    send: Send,
    /// The throttle allowed it (asked once: a budget withdraws when it says yes).
    granted: bool,
}

/// The A6 call: see [the module docs](self).
pub(crate) struct Engine {
    rules: Rules,
    deadline: Option<Instant>,
    /// Every send so far, transparent ones included.
    sent: u32,
    /// Counted attempts sent (toward `maxAttempts`).
    counted: u32,
    /// Transparent retries sent.
    transparent: u32,
    in_flight: u32,
    /// Never-sent answers in a row, for their backoff and their bound.
    not_sent_in_a_row: u32,
    refused_retried: bool,
    /// Backoffs since the start or the last pushback: the exponent of the next one.
    backoff_step: u32,
    previous_delay: Option<Duration>,
    /// The next counted attempt decided on and not sent yet (one at a time in every mode).
    next: Option<Pending>,
    /// Transparent resends decided on and not sent yet; empty unless attempts failed, so
    /// the success path allocates nothing here.
    resends: Vec<Pending>,
    /// The latest counted attempt's per-attempt timeout.
    attempt_timeout: Option<(AttemptId, Instant)>,
    /// Attempts up to this send have timed out and been counted as failures (hedging on the
    /// per-attempt timeout leaves them running).
    timed_out_through: u32,
    /// No more counted attempts: pushback said stop, the throttle refused, the service failed.
    stopped: bool,
    /// The body went to one attempt (or to none still in flight): no new attempt may start.
    committed: Option<Option<AttemptId>>,
    cancel: Option<Cancel>,
    /// Failed retries (attempts after the first) not yet taken for the statistics.
    retry_failures: u32,
    /// Counted attempts sent while earlier ones might still be in flight.
    hedges: u32,
    /// Since when no attempt has been in flight (A96's retry delay), if the call is waiting.
    idle_since: Option<Instant>,
    /// Time spent with no attempt in flight before a later attempt was sent.
    idle: Duration,
    started: bool,
    ended: bool,
}

/// What a call did beyond its first attempt, for gRFC A96's per-call metrics.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Extra {
    /// Counted attempts after the first that were not hedges.
    pub(crate) retries: u32,
    /// Counted attempts sent while earlier ones might still be in flight.
    pub(crate) hedges: u32,
    pub(crate) transparent: u32,
    /// The time no attempt was in flight before a later one was sent.
    pub(crate) delay: Duration,
}

impl Engine {
    /// A call whose first attempt has just been sent.
    pub(crate) fn new(rules: Rules, deadline: Option<Instant>) -> Engine {
        let mut engine = Engine {
            rules,
            deadline,
            sent: 1,
            counted: 1,
            transparent: 0,
            in_flight: 1,
            not_sent_in_a_row: 0,
            refused_retried: false,
            backoff_step: 0,
            previous_delay: None,
            next: None,
            resends: Vec::new(),
            attempt_timeout: None,
            timed_out_through: 0,
            stopped: false,
            committed: None,
            cancel: None,
            retry_failures: 0,
            hedges: 0,
            idle_since: None,
            idle: Duration::ZERO,
            started: false,
            ended: false,
        };
        if engine.rules.hedging_delay().is_some() && engine.may_count_another() {
            // The first hedge's time is set when the call starts to wait.
            engine.next = Some(Pending {
                at: None,
                send: Send {
                    number: 2,
                    transparent: false,
                    hedge: true,
                },
                granted: false,
            });
        }
        engine
    }

    /// The attempts sent so far.
    pub(crate) fn attempts(&self) -> Attempts {
        Attempts::new(self.sent, self.transparent)
    }

    /// What the call did beyond its first attempt; `None` for a call of one attempt.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) fn extra(&self) -> Option<Extra> {
        if self.sent <= 1 {
            return None;
        }
        Some(Extra {
            retries: self.counted - 1 - self.hedges,
            hedges: self.hedges,
            transparent: self.transparent,
            delay: self.idle,
        })
    }

    /// Failed retries since the last call, for the statistics: A6 counts "retry attempts
    /// which failed", hedges after the first included.
    pub(crate) fn take_retry_failures(&mut self) -> u32 {
        std::mem::take(&mut self.retry_failures)
    }

    /// The classifier of the call's attempts.
    pub(crate) fn classifier(&self) -> &dyn Classify {
        self.rules.classifier()
    }

    /// The hedging delay that learns from latencies, if the call's policy has one.
    pub(crate) fn adaptive_delay(&self) -> Option<&crate::policy::HedgeDelay> {
        match &self.rules.mode {
            Mode::Hedge(policy, _) if policy.delay.is_adaptive() => Some(&policy.delay),
            _ => None,
        }
    }

    pub(crate) fn grpc(&self) -> bool {
        self.rules.grpc
    }

    /// When the engine next needs to be polled if no attempt answers: the deadline, the
    /// attempt's timeout, or a send that is not due yet.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        let next = self.scheduled().filter_map(|p| p.at).min();
        earliest([next, self.attempt_timeout.map(|(_, at)| at), self.deadline])
    }

    /// [`wake_at`](Self::wake_at) past `now`: while a due send waits for its service, only
    /// what comes later can need the engine (the service wakes the call when it is ready).
    pub(crate) fn wake_after(&self, now: Instant) -> Option<Instant> {
        let later = |at: &Instant| *at > now;
        let next = self.scheduled().filter_map(|p| p.at).filter(later).min();
        let timeout = self.attempt_timeout.map(|(_, at)| at).filter(later);
        earliest([next, timeout, self.deadline.filter(later)])
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Anchors the first attempt's timers at the time the call first waits.
    fn start(&mut self, now: Instant) {
        if self.started {
            return;
        }
        self.started = true;
        if let Some((timeout, _)) = self.rules.per_attempt_timeout() {
            self.attempt_timeout = Some((AttemptId::FIRST, after(now, timeout)));
        }
        if let Some(delay) = self.rules.hedging_delay()
            && let Some(next) = &mut self.next
        {
            next.at.get_or_insert_with(|| after(now, delay));
        }
    }

    /// Whether another counted attempt may be decided on: attempts left, no stop, and the
    /// request may be repeated.
    fn may_count_another(&self) -> bool {
        !self.stopped
            && self.committed.is_none()
            && self.rules.may_repeat
            && self.counted + u32::from(self.next.is_some()) < self.rules.max_attempts
    }

    /// Every send decided on and not made yet.
    fn scheduled(&self) -> impl Iterator<Item = &Pending> {
        self.next.iter().chain(&self.resends)
    }

    /// Drops every send decided on: no new attempt may start.
    fn unschedule(&mut self) {
        self.next = None;
        self.resends.clear();
    }

    /// An attempt was sent for `send`, which [`poll`](Self::poll) gave.
    pub(crate) fn on_sent(&mut self, send: Send, now: &mut Now<'_>) -> AttemptId {
        if self.next.is_some_and(|p| p.send == send) {
            self.next = None;
        } else if let Some(i) = self.resends.iter().position(|p| p.send == send) {
            self.resends.swap_remove(i);
        }
        self.sent += 1;
        self.in_flight += 1;
        if let Some(since) = self.idle_since.take() {
            self.idle += now.get().saturating_duration_since(since);
        }
        let id = AttemptId {
            send: self.sent,
            number: send.number,
        };
        if send.transparent {
            self.transparent += 1;
        } else {
            self.counted += 1;
            self.hedges += u32::from(send.hedge);
            if let Some((timeout, _)) = self.rules.per_attempt_timeout() {
                self.attempt_timeout = Some((id, after(now.get(), timeout)));
            }
            if let Some(delay) = self.rules.hedging_delay()
                && self.may_count_another()
            {
                self.next = Some(Pending {
                    at: Some(after(now.get(), delay)),
                    send: Send {
                        number: self.counted + 1,
                        transparent: false,
                        hedge: true,
                    },
                    granted: false,
                });
            }
        }
        id
    }

    /// The body committed to `attempt` (or to no attempt still in flight) by outgrowing the
    /// buffer, or failing: only that attempt may go on, and no new one may start.
    pub(crate) fn on_commit(&mut self, attempt: Option<AttemptId>) {
        if self.committed.is_some() || self.ended {
            return;
        }
        tracing::debug!(
            attempt = attempt.map(|a| a.send),
            reason = "body",
            "committed"
        );
        self.committed = Some(attempt);
        self.unschedule();
        self.attempt_timeout = None;
        self.cancel = Some(match attempt {
            Some(attempt) => Cancel::AllBut(attempt),
            None => Cancel::All,
        });
    }

    /// The service failed to become ready for a new attempt: no more attempts are sent.
    /// Returns whether the call has nothing left in flight (so the error is its result).
    pub(crate) fn on_service_error(&mut self) -> bool {
        self.stopped = true;
        self.unschedule();
        let over = self.in_flight == 0;
        self.ended |= over;
        over
    }

    /// What to do next, at `now`: call it until it says [`Action::Wait`] or ends the call.
    pub(crate) fn poll(&mut self, now: &mut Now<'_>) -> Action {
        if self.ended {
            return Action::Wait(None);
        }
        if let Some(cancel) = self.cancel.take() {
            self.in_flight = match cancel {
                Cancel::AllBut(_) => self.in_flight.min(1),
                Cancel::All => 0,
                Cancel::TimedOut(_) => self.in_flight.saturating_sub(1),
            };
            return Action::Cancel(cancel);
        }
        let now = {
            let now = now.get();
            self.start(now);
            now
        };
        if self.in_flight == 0 {
            // Nothing in flight: the wait until the next send is the call's retry delay.
            self.idle_since.get_or_insert(now);
        }
        if self.deadline.is_some_and(|deadline| now >= deadline) {
            tracing::debug!(attempts = self.sent, "deadline exceeded");
            self.ended = true;
            return Action::DeadlineExceeded;
        }
        if let Some((attempt, at)) = self.attempt_timeout
            && now >= at
        {
            self.attempt_timeout = None;
            if let Some(action) = self.on_attempt_timeout(attempt, now) {
                return action;
            }
        }
        if let Some(send) = self.due(now) {
            return Action::Send(send);
        }
        if self.in_flight == 0 && self.scheduled().next().is_none() {
            self.ended = true;
            return Action::ReturnLast;
        }
        Action::Wait(self.wake_at())
    }

    /// The send that is due at `now`, if any; asks the throttle for a counted one.
    fn due(&mut self, now: Instant) -> Option<Send> {
        let is_due = |p: &Pending| p.at.is_some_and(|at| at <= now);
        if let Some(resend) = self
            .resends
            .iter()
            .filter(|p| is_due(p))
            .min_by_key(|p| p.at)
        {
            return Some(resend.send);
        }
        let next = self.next.as_ref().filter(|p| is_due(p))?;
        let (send, granted) = (next.send, next.granted);
        if !granted {
            if self.throttle_refuses() {
                self.next = None;
                return None;
            }
            if let Some(next) = &mut self.next {
                next.granted = true;
            }
        }
        Some(send)
    }

    /// Asks the throttle for one more counted attempt, once per attempt (a budget withdraws
    /// when it says yes); a refusal stops the counted attempts.
    fn throttle_refuses(&mut self) -> bool {
        let refused = self
            .rules
            .throttle
            .as_ref()
            .is_some_and(|t| !t.allows_retry());
        if refused {
            tracing::debug!(attempt = self.sent + 1, "throttled");
            self.stopped = true;
        }
        refused
    }

    /// The latest counted attempt outlived its per-attempt timeout.
    fn on_attempt_timeout(&mut self, attempt: AttemptId, now: Instant) -> Option<Action> {
        let (_, hedge) = self.rules.per_attempt_timeout()?;
        tracing::debug!(attempt = attempt.send, "per-attempt timeout");
        self.timed_out_through = attempt.send;
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
                return None;
            }
            self.retryable(Outcome::Retryable(None), result, now, true);
            return None;
        }
        self.cancel = Some(Cancel::TimedOut(attempt));
        self.not_sent_in_a_row = 0;
        let outcome = self.gate(Outcome::Retryable(None));
        match outcome {
            Outcome::Retryable(_) => self.retryable(outcome, result, now, false),
            _ => self.stopped = true,
        }
        Some(self.poll_cancel())
    }

    fn poll_cancel(&mut self) -> Action {
        match self.cancel.take() {
            Some(cancel) => {
                if let Cancel::TimedOut(_) = cancel {
                    self.in_flight = self.in_flight.saturating_sub(1);
                }
                Action::Cancel(cancel)
            }
            None => Action::Wait(None),
        }
    }

    /// Attempt `attempt` answered, classified as `outcome` (before the engine's own rules:
    /// the idempotency gate, the pushback cap, a second refusal).
    pub(crate) fn on_answer(
        &mut self,
        attempt: AttemptId,
        outcome: Outcome,
        result: AttemptResult<'_>,
        now: &mut Now<'_>,
    ) -> Verdict {
        if self.ended {
            return Verdict::Drop;
        }
        if let Some(committed) = self.committed
            && committed != Some(attempt)
        {
            // Cut off by the commit (and counted out when it was cancelled): its result, a
            // body error, means nothing.
            return Verdict::Drop;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.answer(attempt, outcome, result, now)
    }
}

/// The earliest of a few optional times.
fn earliest<const N: usize>(times: [Option<Instant>; N]) -> Option<Instant> {
    times.into_iter().flatten().min()
}

/// What tokio's timers take for a delay past what the clock can hold: about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `now + delay`, saturating rather than panicking on a delay too large for the clock (a
/// policy's delay and a server's pushback can be any `Duration`).
pub(crate) fn after(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}
