//! The A6 call as a plain state machine: events in, actions out.
//!
//! Every rule of gRFC A6 that decides what a call does lives here once, for both drivers (the
//! tower layer and the `grpc` interceptor): a
//! retried call is a hedged call with one attempt in flight and no hedging delay. The engine
//! owns no futures and does no IO. Its own rules read no clock and draw no random numbers:
//! the driver passes [`Inputs`] (the time, read lazily, and a random generator), and an
//! adaptive hedging delay is given that time to read and to learn from. A retry throttle or
//! budget is the exception: it keeps windows over time across calls, so it reads tokio's
//! clock.
//!
//! ```text
//! events in:   admit (the service's readiness for a send) | on_sent (attempt n went out
//!              with body reader r) | on_answer (attempt n, its result) | on_commit (the
//!              body committed itself to reader r) | a timer fired (told through Inputs)
//! actions out: Send (counted or transparent, retry or hedge) | Post (what the statistics
//!              count) | Cancel (every attempt but the committed one) | TimedOut (n) | End
//!              (the kept failure, or the deadline) | Wait (until)
//! ```
//!
//! A driver calls eight functions: [`enter`], [`Engine::new`], [`poll`](Engine::poll),
//! [`admit`](Engine::admit), [`on_sent`](Engine::on_sent), [`on_answer`](Engine::on_answer),
//! [`on_commit`](Engine::on_commit) and [`close`](Engine::close). Everything else it needs
//! comes with what those return: the attempt's headers with its send, the records to post
//! with [`Action::Post`], the marks of the result with the verdict or action that ends the
//! call.
//!
//! The engine owns the whole call, including its most race-prone rule, the commit. It keeps
//! the set of attempts in flight with the body reader of each, so a commit made by the body
//! (in whichever task polled it) names the attempt that goes on; an answer of an attempt that
//! is not live any more means nothing. And when an answer would end the call, the engine
//! claims the body for that attempt through [`CommitBody`] before it accepts the answer: if
//! the body committed to another reader first, that other attempt goes on and the answer is
//! dropped. The winner and the end of a call are decided here, nowhere else.
//!
//! What a call's rules are (its policy, the attempt cap, the idempotency gate, the deadline,
//! and whether this layer drives it at all) is one pure function, [`plan`](rules::plan).
//! Every driver enters a call through [`enter`]: the policy looked up, the plan, and the
//! throttle's deposit.

mod books;
mod decide;
mod entry;
mod live;
#[cfg(test)]
mod model;
mod rules;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use rand::RngCore;

use crate::classify::{AttemptResult, Outcome};
use crate::metadata::Attempts;
use crate::stats::{CallCounts, Records};

pub(crate) use self::books::Books;
pub(crate) use self::entry::{Entrance, enter};
use self::live::Live;
pub(crate) use self::rules::{BodyKind, CallFacts, Mode, Rules, Start};
#[cfg(test)]
use self::rules::{TableFacts, nothing_applies, plan};

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
pub(crate) struct Dispatch {
    /// The counted attempt it makes (see [`AttemptId::number`]).
    pub(crate) number: u32,
    /// A transparent retry: it counts toward neither `maxAttempts` nor the throttle.
    pub(crate) transparent: bool,
    /// Sent while earlier attempts may still be in flight.
    pub(crate) hedge: bool,
}

/// Where the driver's service stands for a send the engine asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready,
    /// Not ready yet: it wakes the call when it is.
    Pending,
    /// It failed, and is not polled again: no more attempts are sent.
    Failed,
}

/// Whether a send the engine asked for may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    Send,
    /// The call is over, or the throttle refused, or the service failed with attempts still
    /// in flight: no counted attempt goes any more. Poll the engine again.
    Refused,
    /// A backup hedge over its policy's budget: not sent, and no more backups for this call.
    /// The hedge owed to a later non-fatal failure still goes (it answers to the throttle
    /// alone). Poll the engine again.
    OverBudget,
    /// The service is not ready: wake the call at this time too (the deadline, a timeout, a
    /// later send), if the service has not woken it first.
    Wait(Option<Instant>),
    /// The service failed with nothing in flight: its error is the call's result, marked
    /// so.
    Failed(AttemptMarks),
}

/// How a call ends when no answer is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Return the last failure kept (see [`Verdict::Keep`]), which attempt `0` gave.
    Last(AttemptId),
    /// The call's deadline passed.
    DeadlineExceeded,
}

/// What the driver should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send this attempt: [`admit`](Engine::admit) it with the service's readiness, and
    /// report it with [`Engine::on_sent`]. Asked again, the engine gives the same send until
    /// it is sent.
    Send(Dispatch),
    /// Add these to the statistics of the call's route or method ([`Books::post`]).
    Post(Records),
    /// The call committed to this attempt (to none, if it is no longer in flight): drop
    /// every other attempt. Dropping an attempt's future cancels it.
    Cancel(Option<AttemptId>),
    /// This attempt outlived its per-attempt timeout: drop it; its result is an "attempt
    /// timed out" failure, kept as the last one.
    TimedOut(AttemptId),
    /// The call ends: drop every attempt and return this, marked so.
    End(End, AttemptMarks),
    /// Nothing to do until an attempt answers, the body commits, the service is ready, or
    /// this time comes.
    Wait(Option<Instant>),
}

/// What to do with an attempt's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Return it now, marked so: the call is committed to this attempt; every other one is
    /// cancelled.
    Return(AttemptMarks),
    /// Keep it as the call's last failure, returned if nothing better comes.
    Keep,
    /// Drop it: it means nothing (an attempt cut off by a commit, or by the end of the call,
    /// or one whose timeout was already counted as its failure).
    Drop,
}

/// The request body's side of a commit: the one atomic choice of the attempt that goes on.
pub(crate) trait CommitBody {
    /// Commits the body to `reader`, unless it is committed already; gives the reader it is
    /// committed to (`reader` itself for a body that records nothing).
    fn commit(&self, reader: u64) -> u64;
}

/// What the engine reads from outside: the time, read once and only if a rule needs it (a
/// call answered at once never reads the clock), whether the call's timer fired, and the
/// random generator of the jitter.
pub(crate) struct Inputs<'a> {
    read: &'a dyn Fn() -> Instant,
    now: Option<Instant>,
    timer_fired: bool,
    rng: &'a mut dyn RngCore,
}

impl<'a> Inputs<'a> {
    /// The time read from `read` the first time it is asked for; jitter drawn from `rng`.
    pub(crate) fn new(read: &'a dyn Fn() -> Instant, rng: &'a mut dyn RngCore) -> Inputs<'a> {
        Inputs {
            read,
            now: None,
            timer_fired: false,
            rng,
        }
    }

    pub(crate) fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(self.read)
    }

    /// The call's timer fired: the clock has moved past the time read, and a deadline that
    /// has passed ends the call before the next answer is accepted.
    pub(crate) fn timer_fired(&mut self) {
        self.now = None;
        self.timer_fired = true;
    }

    fn rng(&mut self) -> &mut dyn RngCore {
        self.rng
    }
}

/// A send the engine has decided on, due at `at`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// `None` until the call starts waiting: the first hedge's delay runs from the first
    /// poll, and a call answered on that poll never reads the clock.
    at: Option<Instant>,
    send: Dispatch,
    /// The throttle allowed it (asked once: a budget withdraws when it says yes).
    granted: bool,
    /// A backup request: a hedge due because the hedging delay passed while attempts are
    /// still in flight, so it adds load. Only backups ask the policy's hedge budget; the next
    /// hedge after a non-fatal failure replaces the attempt that failed and, as A6 says,
    /// answers to the throttle alone.
    backup: bool,
}

/// Which attempt the call is committed to: once it is, no new attempt may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    Open,
    /// To the attempt sent this `send`-th, which alone may go on.
    To(u32),
    /// To a body reader no attempt in flight holds: every attempt in flight is cut off.
    ToNone,
}

/// The A6 call: see [the module docs](self).
pub(crate) struct Engine {
    rules: Rules,
    deadline: Option<Instant>,
    body: BodyKind,
    /// The attempts in flight, each with its body reader.
    live: Live,
    /// Every send so far, transparent ones included.
    sent: u32,
    /// Counted attempts sent (toward `maxAttempts`).
    counted: u32,
    /// The next counted attempt decided on and not sent yet (one at a time in every mode).
    next: Option<Pending>,
    /// No more counted attempts: pushback said stop, the throttle refused, the service failed.
    stopped: bool,
    commit: Commit,
    /// Attempts left the live set since the last [`Action::Cancel`].
    cancelled: bool,
    /// What only a call that failed once needs, made at its first failure (or first poll,
    /// for a per-attempt timeout): a call answered at once carries one word for it.
    retry_state: Option<Box<RetryState>>,
    started: bool,
    ended: bool,
    /// [`close`](Engine::close) has posted the call's last records and its metrics.
    closed: bool,
}

/// The state of a call that has failed once (its backoff, its transparent resends, its last
/// failure and its statistics), or whose policy has a per-attempt timeout.
#[derive(Debug, Default)]
struct RetryState {
    /// Transparent retries sent.
    transparent: u32,
    /// Counted attempts sent while earlier ones might still be in flight.
    hedges: u32,
    /// Hedges not sent because the policy's hedge budget was spent.
    hedges_over_budget: u32,
    /// The budget refused a backup: no more backups for this call. Nothing else stops:
    /// the next non-fatal failure still sends its hedge at once.
    no_backups: bool,
    /// How the call ends, decided and not yet given to the driver.
    ending: Option<End>,
    /// The latest counted attempt's per-attempt timeout (a policy with one makes this state
    /// at the call's first poll).
    attempt_timeout: Option<(AttemptId, Instant)>,
    /// Never-sent answers in a row, for their backoff and their bound.
    not_sent_in_a_row: u32,
    refused_retried: bool,
    /// Backoffs since the start or the last pushback: the exponent of the next one.
    backoff_step: u32,
    previous_delay: Option<Duration>,
    /// Transparent resends decided on and not sent yet.
    resends: Vec<Pending>,
    /// Attempts up to this send have timed out and been counted as failures (hedging on the
    /// per-attempt timeout leaves them running).
    timed_out_through: u32,
    /// An attempt that timed out and is to be dropped.
    timed_out: Option<AttemptId>,
    /// The attempt whose failure is kept as the call's last.
    last: Option<AttemptId>,
    /// What the statistics count, not yet taken by the driver.
    records: Records,
    /// Since when no attempt has been in flight (A96's retry delay), if the call is waiting.
    idle_since: Option<Instant>,
    /// Time spent with no attempt in flight before a later attempt was sent.
    idle: Duration,
}

/// The headers of one attempt of a gRPC call, as [`Engine::on_sent`] gives them.
#[derive(Debug, Default)]
pub(crate) struct AttemptHeaders {
    /// `grpc-previous-rpc-attempts`, after the first attempt.
    pub(crate) previous: Option<http::HeaderValue>,
    /// `grpc-timeout`: the call's time left, when it has a deadline.
    pub(crate) timeout: Option<http::HeaderValue>,
}

/// What a call's result carries about its attempts, as the engine gives it with the result
/// ([`Verdict::Return`], [`Action::End`], [`Admission::Failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttemptMarks {
    /// Every attempt the call sent.
    pub(crate) attempts: Attempts,
    /// `grpc-previous-rpc-attempts` on the result: the retry attempts made, that is every
    /// counted attempt but one, transparent retries excluded (A6: "the client will receive
    /// the number of retry attempts made"). For a hedged call whose winner was not its last
    /// attempt this is more than the winner's own count, which grpc-java gives; every driver
    /// of this crate gives this one, so that a call reports the same count through each.
    pub(crate) previous: u32,
}

impl Engine {
    /// A call whose first attempt has just been sent with body reader `reader`, at
    /// `first_sent_at` where its hedging delay learns from latencies (see [`Start`]).
    pub(crate) fn new(
        rules: Rules,
        deadline: Option<Instant>,
        body: BodyKind,
        reader: u64,
        first_sent_at: Option<Instant>,
    ) -> Engine {
        if let Mode::Hedge(policy, _) = &rules.mode
            && let Some(budget) = &policy.budget
        {
            // Every hedged call earns its share of hedges.
            budget.on_call();
        }
        let mut engine = Engine {
            rules,
            deadline,
            body,
            live: Live::first(reader, first_sent_at),
            sent: 1,
            counted: 1,
            next: None,
            stopped: false,
            commit: Commit::Open,
            cancelled: false,
            retry_state: None,
            started: false,
            ended: false,
            closed: false,
        };
        if engine.rules.hedging_delay().is_some() && engine.may_count_another() {
            // The first hedge's time is set when the call starts to wait.
            engine.next = Some(Pending {
                at: None,
                send: Dispatch {
                    number: 2,
                    transparent: false,
                    hedge: true,
                },
                granted: false,
                backup: true,
            });
        }
        engine
    }

    /// The attempts sent so far.
    fn attempts(&self) -> Attempts {
        let transparent = self.retry_state.as_ref().map_or(0, |t| t.transparent);
        Attempts::new(self.sent, transparent)
    }

    /// What the call's result carries: its attempts, and the retry attempts made.
    fn marks(&self) -> AttemptMarks {
        AttemptMarks {
            attempts: self.attempts(),
            previous: self.counted - 1,
        }
    }

    /// What the call did beyond its first attempt; `None` for a call of one attempt.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    fn extra(&self) -> Option<CallCounts> {
        let retry_state = self.retry_state.as_deref();
        let over_budget = retry_state.map_or(0, |t| t.hedges_over_budget);
        if self.sent <= 1 && over_budget == 0 {
            return None;
        }
        let hedges = retry_state.map_or(0, |t| t.hedges);
        Some(CallCounts {
            retries: self.counted - 1 - hedges,
            hedges,
            hedges_over_budget: over_budget,
            transparent: retry_state.map_or(0, |t| t.transparent),
            delay: self.retry_state.as_ref().map_or(Duration::ZERO, |t| t.idle),
        })
    }

    /// What the call did for the statistics since the last call: retries sent, retries
    /// failed (A6 counts "retry attempts which failed", hedges after the first included) and
    /// hedges over budget. `None` when nothing: a call of one attempt never has any.
    fn take_records(&mut self) -> Option<Records> {
        let retry_state = self.retry_state.as_mut()?;
        if retry_state.records.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut retry_state.records))
    }

    /// The hedging delay that learns from latencies, if the call's policy has one.
    fn adaptive_delay(&self) -> Option<&crate::policy::HedgeDelay> {
        match &self.rules.mode {
            Mode::Hedge(policy, _) if policy.delay.is_adaptive() => Some(&policy.delay),
            _ => None,
        }
    }

    /// What counted attempt `number`, sent at `now`, tells the server of its call: for a
    /// gRPC call, the attempts before it (A6's `grpc-previous-rpc-attempts`, transparent
    /// retries excluded, absent on the first) and what is left of the call's time
    /// (`grpc-timeout`); nothing for other calls.
    fn attempt_headers(&self, number: u32, now: Instant) -> AttemptHeaders {
        if !self.rules.grpc {
            return AttemptHeaders::default();
        }
        AttemptHeaders {
            previous: (number > 1).then(|| http::HeaderValue::from(number - 1)),
            timeout: self.deadline.map(|deadline| {
                crate::grpc_timeout::encode(deadline.saturating_duration_since(now))
            }),
        }
    }

    /// Whether the engine still waits for the answer of the attempt sent `send`-th (see
    /// [`AttemptId::send`]).
    #[cfg(test)]
    pub(crate) fn is_live(&self, send: u32) -> bool {
        self.live.contains_send(send)
    }

    /// Whether the call has ended: every later event is ignored.
    #[cfg(test)]
    pub(crate) fn has_ended(&self) -> bool {
        self.ended
    }

    /// When the engine next needs to be polled if no attempt answers: the deadline, the
    /// attempt's timeout, or a send that is not due yet.
    fn wake_at(&self) -> Option<Instant> {
        let next = self.scheduled().filter_map(|p| p.at).min();
        earliest([next, self.attempt_timeout(), self.deadline])
    }

    /// [`wake_at`](Self::wake_at) past `now`: while a due send waits for its service, only
    /// what comes later can need the engine (the service wakes the call when it is ready).
    fn wake_after(&self, now: Instant) -> Option<Instant> {
        let later = |at: &Instant| *at > now;
        let next = self.scheduled().filter_map(|p| p.at).filter(later).min();
        let timeout = self.attempt_timeout().filter(later);
        earliest([next, timeout, self.deadline.filter(later)])
    }

    /// Whether the call has ended, or its end is decided.
    fn is_over(&self) -> bool {
        self.ended
            || self
                .retry_state
                .as_ref()
                .is_some_and(|t| t.ending.is_some())
    }

    /// When the latest counted attempt's per-attempt timeout runs out, if it has one.
    fn attempt_timeout(&self) -> Option<Instant> {
        let retry_state = self.retry_state.as_ref()?;
        retry_state.attempt_timeout.map(|(_, at)| at)
    }

    /// The state of a call that has failed, made at its first failure.
    fn retry_state(&mut self) -> &mut RetryState {
        self.retry_state.get_or_insert_with(Box::default)
    }

    /// Anchors the first attempt's timers at the time the call first waits.
    fn start(&mut self, now: Instant) {
        if self.started {
            return;
        }
        self.started = true;
        if let Some((timeout, _)) = self.rules.per_attempt_timeout() {
            self.retry_state().attempt_timeout = Some((AttemptId::FIRST, after(now, timeout)));
        }
        if let Some(delay) = self.rules.hedging_delay()
            && let Some(next) = &mut self.next
        {
            next.at.get_or_insert_with(|| after(now, delay));
        }
    }

    /// Whether a new attempt can be given the whole body.
    fn replayable(&self) -> bool {
        self.commit == Commit::Open && self.body != BodyKind::Once
    }

    /// Whether another counted attempt may be decided on: attempts left, no stop, the body
    /// can be replayed, and the request may be repeated.
    fn may_count_another(&self) -> bool {
        self.may_count(self.rules.may_repeat)
    }

    /// [`may_count_another`](Self::may_count_another), for an attempt whose request may
    /// reach the server's application again if `may_repeat`.
    fn may_count(&self, may_repeat: bool) -> bool {
        !self.stopped
            && self.replayable()
            && may_repeat
            && self.counted + u32::from(self.next.is_some()) < self.rules.max_attempts
    }

    /// Every send decided on and not made yet.
    fn scheduled(&self) -> impl Iterator<Item = &Pending> {
        let resends = self.retry_state.iter().flat_map(|t| &t.resends);
        self.next.iter().chain(resends)
    }

    /// Drops every send decided on: no new attempt may start.
    fn unschedule(&mut self) {
        self.next = None;
        if let Some(retry_state) = &mut self.retry_state {
            retry_state.resends.clear();
        }
    }

    /// The call ends as `end` says, at the next [`poll`](Self::poll).
    fn end(&mut self, end: End) {
        if !self.is_over() {
            // The driver drops every attempt when the call ends: no separate cancel.
            self.retry_state().ending = Some(end);
            self.unschedule();
            self.live.clear();
            self.cancelled = false;
        }
    }

    /// The driver's service stands as `service` says for `send`, which [`poll`](Self::poll)
    /// gave: tells whether it may go. A counted send asks the throttle once it can really be
    /// sent (a budget withdraws when it says yes); a backup hedge asks its policy's hedge
    /// budget first, and gets its hedge back if the throttle then refuses. The throttle's
    /// refusal stops the counted attempts; the budget's stops the call's backups only.
    /// Either way the call waits on the attempts in flight.
    pub(crate) fn admit(
        &mut self,
        send: Dispatch,
        service: Readiness,
        inputs: &mut Inputs<'_>,
    ) -> Admission {
        if self.is_over() {
            return Admission::Refused;
        }
        match service {
            Readiness::Ready => {}
            Readiness::Pending => return Admission::Wait(self.wake_after(inputs.now())),
            Readiness::Failed if self.on_service_error() => {
                return Admission::Failed(self.marks());
            }
            Readiness::Failed => return Admission::Refused,
        }
        let Some(next) = self.next.as_mut().filter(|p| p.send == send) else {
            // A transparent resend: granted when it was decided on.
            return match self.scheduled().any(|p| p.send == send) {
                true => Admission::Send,
                false => Admission::Refused,
            };
        };
        if next.granted {
            return Admission::Send;
        }
        next.granted = true;
        let budget = match (&self.rules.mode, next.backup) {
            (Mode::Hedge(policy, _), true) => policy.budget.clone(),
            _ => None,
        };
        if budget.as_ref().is_some_and(|b| !b.try_hedge()) {
            tracing::debug!(attempt = self.sent + 1, "hedge over budget");
            // Only this call's backups stop: a budget governs the load hedges add, and the
            // hedge owed to a non-fatal failure replaces an attempt instead of adding one.
            self.next = None;
            let retry_state = self.retry_state();
            retry_state.hedges_over_budget += 1;
            retry_state.records.hedge_over_budget();
            retry_state.no_backups = true;
            return Admission::OverBudget;
        }
        if self.throttle_refuses() {
            if let Some(budget) = budget {
                // A hedge never sent costs the budget nothing.
                budget.give_back();
            }
            self.next = None;
            return Admission::Refused;
        }
        Admission::Send
    }

    /// An attempt goes out for `send` (which [`admit`](Self::admit) let go), with body
    /// reader `reader`: gives its identity and the headers it carries.
    pub(crate) fn on_sent(
        &mut self,
        send: Dispatch,
        reader: u64,
        inputs: &mut Inputs<'_>,
    ) -> (AttemptId, AttemptHeaders) {
        let id = self.sent_attempt(send, reader, inputs);
        (id, self.attempt_headers(id.number, inputs.now()))
    }

    fn sent_attempt(&mut self, send: Dispatch, reader: u64, inputs: &mut Inputs<'_>) -> AttemptId {
        if self.next.is_some_and(|p| p.send == send) {
            self.next = None;
        } else if let Some(retry_state) = &mut self.retry_state
            && let Some(i) = retry_state.resends.iter().position(|p| p.send == send)
        {
            retry_state.resends.swap_remove(i);
        }
        self.sent += 1;
        if let Some(retry_state) = &mut self.retry_state
            && let Some(since) = retry_state.idle_since.take()
        {
            retry_state.idle += inputs.now().saturating_duration_since(since);
        }
        let id = AttemptId {
            send: self.sent,
            number: send.number,
        };
        let sent_at = self.adaptive_delay().is_some().then(|| inputs.now());
        self.live.push(live::InFlight {
            id,
            reader,
            sent_at,
        });
        if send.transparent {
            self.retry_state().transparent += 1;
            return id;
        }
        self.counted += 1;
        self.retry_state().records.retry(send.number - 1);
        if send.hedge {
            self.retry_state().hedges += 1;
        }
        if let Some((timeout, _)) = self.rules.per_attempt_timeout() {
            let at = after(inputs.now(), timeout);
            self.retry_state().attempt_timeout = Some((id, at));
        }
        if let Some(delay) = self.rules.hedging_delay()
            && self.may_count_another()
            && !self.retry_state.as_ref().is_some_and(|t| t.no_backups)
        {
            self.next = Some(Pending {
                at: Some(after(inputs.now(), delay)),
                send: Dispatch {
                    number: self.counted + 1,
                    transparent: false,
                    hedge: true,
                },
                granted: false,
                backup: true,
            });
        }
        id
    }

    /// The body committed itself to reader `reader`: it outgrew the buffer, or its source
    /// failed, in whichever task polled it. Only the attempt that holds that reader may go
    /// on (none, if no attempt in flight holds it), and no new attempt may start.
    pub(crate) fn on_commit(&mut self, reader: u64) {
        if self.commit != Commit::Open || self.is_over() {
            return;
        }
        let attempt = self.live.holding(reader);
        tracing::debug!(
            attempt = attempt.map(|a| a.send),
            reason = "body",
            "committed"
        );
        self.commit_to(attempt);
    }

    /// Commits the call to `attempt` (or to none): every other attempt is cut off.
    fn commit_to(&mut self, attempt: Option<AttemptId>) {
        self.commit = attempt.map_or(Commit::ToNone, |a| Commit::To(a.send));
        self.unschedule();
        if self.live.retain(|id| Some(id) == attempt) {
            self.cancelled = true;
        }
        if let Some(retry_state) = &mut self.retry_state {
            retry_state.attempt_timeout = None;
        }
    }

    /// Claims the body for `attempt` (whose reader is `reader`), whose answer would end the
    /// call: whether the call is committed to it. If the body committed to another reader
    /// first, the call is committed to that reader's attempt instead.
    fn claim(&mut self, attempt: AttemptId, reader: u64, body: &dyn CommitBody) -> bool {
        match self.commit {
            Commit::To(committed) => return committed == attempt.send,
            Commit::ToNone => return false,
            Commit::Open => {}
        }
        let chosen = if self.body == BodyKind::Recorded {
            body.commit(reader)
        } else {
            reader
        };
        if chosen != reader {
            // The body went to another reader first: `on_commit` tells of it.
            self.on_commit(chosen);
            return false;
        }
        self.commit = Commit::To(attempt.send);
        true
    }

    /// A timer fired: the deadline, if it has passed, ends the call before any answer that
    /// is ready in the same poll is accepted.
    fn on_timer(&mut self, inputs: &mut Inputs<'_>) {
        if self
            .deadline
            .is_some_and(|deadline| inputs.now() >= deadline)
        {
            self.deadline_passed();
        }
    }

    fn deadline_passed(&mut self) {
        if !self.is_over() {
            tracing::debug!(attempts = self.sent, "deadline exceeded");
            self.end(End::DeadlineExceeded);
        }
    }

    /// The service failed to become ready for a new attempt: no more attempts are sent.
    /// Returns whether the call has nothing left in flight, so that the error is its result.
    fn on_service_error(&mut self) -> bool {
        if self.is_over() {
            return false;
        }
        self.stopped = true;
        self.unschedule();
        if self.live.is_empty() {
            self.ended = true;
            return true;
        }
        false
    }

    /// What to do next: call it until it says [`Action::Wait`] or ends the call.
    pub(crate) fn poll(&mut self, inputs: &mut Inputs<'_>) -> Action {
        // A passed deadline is seen below; the timer has nothing more to say.
        inputs.timer_fired = false;
        if self.ended {
            return Action::Wait(None);
        }
        if let Some(records) = self.take_records() {
            return Action::Post(records);
        }
        if std::mem::take(&mut self.cancelled) {
            return Action::Cancel(self.live.single());
        }
        if let Some(id) = self.retry_state.as_mut().and_then(|t| t.timed_out.take()) {
            return Action::TimedOut(id);
        }
        if let Some(end) = self.retry_state.as_mut().and_then(|t| t.ending.take()) {
            self.ended = true;
            return Action::End(end, self.marks());
        }
        if self.waits_on_answers_alone() {
            // Nothing here needs the time: a pending call's poll reads no clock.
            return Action::Wait(None);
        }
        let now = inputs.now();
        self.start(now);
        if self.live.is_empty() {
            // Nothing in flight: the wait until the next send is the call's retry delay.
            self.retry_state().idle_since.get_or_insert(now);
        }
        if self.deadline.is_some_and(|deadline| now >= deadline) {
            self.deadline_passed();
            return self.poll(inputs);
        }
        if let Some(retry_state) = &mut self.retry_state
            && let Some((attempt, at)) = retry_state.attempt_timeout
            && now >= at
        {
            retry_state.attempt_timeout = None;
            self.on_attempt_timeout(attempt, inputs);
            return self.poll(inputs);
        }
        self.unschedule_past_the_deadline();
        if let Some(send) = self.due(now) {
            return Action::Send(send);
        }
        if self.live.is_empty() && self.scheduled().next().is_none() {
            self.ended = true;
            return Action::End(self.last_end(), self.marks());
        }
        Action::Wait(self.wake_at())
    }

    /// Whether only an answer (or a commit) can move the call on: attempts are in flight and
    /// nothing is timed, neither a deadline, nor a send decided on, nor a per-attempt timeout
    /// (set at the start, so the call must have started unless its policy has none).
    fn waits_on_answers_alone(&self) -> bool {
        !self.live.is_empty()
            && self.deadline.is_none()
            && self.scheduled().next().is_none()
            && self.attempt_timeout().is_none()
            && (self.started || self.rules.per_attempt_timeout().is_none())
    }

    /// The end of a call with nothing in flight and nothing to send: its last failure.
    fn last_end(&self) -> End {
        let last = self.retry_state.as_ref().and_then(|t| t.last);
        End::Last(last.unwrap_or(AttemptId::FIRST))
    }

    /// Fail fast: a send that cannot start before the deadline never will.
    fn unschedule_past_the_deadline(&mut self) {
        let Some(deadline) = self.deadline else {
            return;
        };
        let past = |p: &Pending| p.at.is_some_and(|at| at >= deadline);
        if self.next.as_ref().is_some_and(past) {
            tracing::debug!(reason = "deadline", "not retrying");
            self.next = None;
        }
        if let Some(retry_state) = &mut self.retry_state {
            retry_state.resends.retain(|p| !past(p));
        }
    }

    /// The send that is due at `now`, if any: transparent resends first.
    fn due(&self, now: Instant) -> Option<Dispatch> {
        let is_due = |p: &&Pending| p.at.is_some_and(|at| at <= now);
        let resends = self.retry_state.iter().flat_map(|t| &t.resends);
        let resend = resends.filter(is_due).min_by_key(|p| p.at);
        resend.or(self.next.as_ref().filter(is_due)).map(|p| p.send)
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

    /// Attempt `attempt` answered with `result`, which the call's policy classifies (before
    /// the engine's own rules: the idempotency gate, the pushback cap, a second refusal).
    /// `body` is asked to commit to the attempt's reader if the answer would end the call.
    /// Gives the verdict, and the class the policy gave the result (for the attempt's span).
    pub(crate) fn on_answer(
        &mut self,
        attempt: AttemptId,
        result: AttemptResult<'_>,
        body: &dyn CommitBody,
        inputs: &mut Inputs<'_>,
    ) -> (Verdict, Outcome) {
        let outcome = self.rules.classifier().classify(result);
        let verdict = self.on_outcome(attempt, outcome, result, body, inputs);
        (verdict, outcome)
    }

    /// [`on_answer`](Engine::on_answer) for a result already classified as `outcome`; the
    /// engine's rule tests and model give outcomes directly.
    pub(crate) fn on_outcome(
        &mut self,
        attempt: AttemptId,
        outcome: Outcome,
        result: AttemptResult<'_>,
        body: &dyn CommitBody,
        inputs: &mut Inputs<'_>,
    ) -> Verdict {
        if std::mem::take(&mut inputs.timer_fired) {
            self.on_timer(inputs);
        }
        if self.is_over() {
            return Verdict::Drop;
        }
        // Not live: cut off by a commit or cancelled (its result, a body error or a reset,
        // means nothing).
        let Some(in_flight) = self.live.remove(attempt) else {
            return Verdict::Drop;
        };
        let verdict = self.answer(attempt, in_flight.reader, outcome, result, body, inputs);
        if let Verdict::Return(_) = verdict {
            // An answer from the server is a latency; a transport error is not.
            let from_server = !matches!(result, AttemptResult::Error(_));
            if let (true, Some(delay), Some(sent_at)) =
                (from_server, self.adaptive_delay(), in_flight.sent_at)
            {
                let now = inputs.now();
                delay.record_at(now, now.saturating_duration_since(sent_at));
            }
            // The driver drops every other attempt as it returns the answer.
            self.unschedule();
            self.live.clear();
            self.ended = true;
        }
        verdict
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
