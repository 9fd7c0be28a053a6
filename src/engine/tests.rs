//! One test per A6 rule, on the engine alone: no runtime, no clock, no IO.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::backoff::{Exponential, Jitter};
use crate::classify::{Code, GrpcCodes};
use crate::policy::{HedgePolicy, MethodPolicy, RetryDecision, RetryPolicy, ThrottleHandle};
use crate::pushback::Pushback;
use crate::throttle::{RetryThrottle, Throttle};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fixed clock for one step of a test.
struct Clock(Instant);

impl Clock {
    fn at(&self, offset: Duration) -> Instant {
        self.0 + offset
    }
}

/// Runs `f` with the engine's inputs at `at`, and a generator that always draws the same.
fn at<T>(at: Instant, f: impl FnOnce(&mut Inputs<'_>) -> T) -> T {
    let read = move || at;
    let mut rng = SmallRng::seed_from_u64(7);
    f(&mut Inputs::new(&read, &mut rng))
}

fn poll(engine: &mut Engine, now: Instant) -> Action {
    at(now, |inputs| engine.poll(inputs))
}

/// A body whose commit always goes to the reader that asks, as a body that records nothing.
struct Unrecorded;

impl CommitBody for Unrecorded {
    fn commit(&self, reader: u64) -> u64 {
        reader
    }
}

fn answer(engine: &mut Engine, id: AttemptId, outcome: Outcome, now: Instant) -> Verdict {
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    at(now, |inputs| {
        engine.on_answer(id, outcome, result, &Unrecorded, inputs)
    })
}

/// Sends `send` as the driver does: admitted, then sent with the body reader numbered as the
/// send is.
fn sent(engine: &mut Engine, send: Send, now: Instant) -> AttemptId {
    assert_eq!(engine.admit(send), Admission::Send, "{send:?} is admitted");
    let reader = u64::from(engine.attempts().sent() + 1);
    at(now, |inputs| engine.on_sent(send, reader, inputs))
}

/// An engine whose first attempt sends body reader 1, with a body that records nothing.
fn engine_of(rules: Rules, deadline: Option<Instant>) -> Engine {
    Engine::new(rules, deadline, BodyKind::Clones, 1)
}

fn ends_with_last(action: Action) -> bool {
    matches!(action, Action::End(End::Last(_)))
}

fn retry_policy(
    build: impl FnOnce(crate::policy::RetryPolicyBuilder) -> crate::policy::RetryPolicyBuilder,
) -> Arc<RetryPolicy> {
    let builder = RetryPolicy::builder()
        .max_attempts(5)
        .backoff(Exponential::new(ms(100), ms(1000), 2.0, Jitter::None).unwrap())
        .retryable(GrpcCodes::from([Code::Unavailable]));
    Arc::new(build(builder).build().unwrap())
}

fn rules(mode: Mode, max_attempts: u32, throttle: Option<ThrottleHandle>) -> Rules {
    Rules {
        mode,
        max_attempts,
        may_repeat: true,
        grpc: true,
        max_pushback: Duration::from_secs(60),
        throttle,
        wait_for_ready: false,
    }
}

/// [`rules`] with gRPC's wait-for-ready: never-sent attempts are resent transparently.
fn waiting(mut rules: Rules) -> Rules {
    rules.wait_for_ready = true;
    rules
}

fn retry_engine(policy: Arc<RetryPolicy>, deadline: Option<Instant>) -> Engine {
    let max = policy.max_attempts;
    engine_of(rules(Mode::Retry(policy), max, None), deadline)
}

const RETRYABLE: Outcome = Outcome::Retryable(None);

#[test]
fn a_success_returns_at_once_and_credits_the_throttle() {
    let throttle = Throttle::new(10, 0.5).unwrap();
    for _ in 0..4 {
        throttle.on_failure();
    }
    let before = throttle.tokens_milli();
    let mut engine = engine_of(
        rules(
            Mode::Retry(retry_policy(|b| b)),
            5,
            Some(Arc::new(throttle.clone())),
        ),
        None,
    );
    let t = Clock(Instant::now());
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::Success, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), before + 500);
}

#[test]
fn backoff_is_min_of_initial_times_multiplier_and_max() {
    // 100, 200, 400, 800 ms: the fifth attempt's wait would be 1600, capped at 1000.
    let mut engine = retry_engine(retry_policy(|b| b.max_attempts(5)), None);
    let t = Clock(Instant::now());
    let mut now = t.at(ms(0));
    let mut id = AttemptId::FIRST;
    for expected in [100, 200, 400, 800] {
        assert_eq!(answer(&mut engine, id, RETRYABLE, now), Verdict::Keep);
        assert_eq!(
            poll(&mut engine, now),
            Action::Wait(Some(now + ms(expected)))
        );
        now += ms(expected);
        let Action::Send(send) = poll(&mut engine, now) else {
            panic!("a retry is due");
        };
        id = sent(&mut engine, send, now);
    }
    assert_eq!(id.number, 5);
    assert_eq!(answer(&mut engine, id, RETRYABLE, now), Verdict::Keep);
    assert!(ends_with_last(poll(&mut engine, now)));
}

#[test]
fn backoff_with_max_below_initial_and_a_shrinking_multiplier() {
    let schedule = Exponential::a6(
        Duration::from_secs(2),
        Duration::from_secs(1),
        0.5,
        Jitter::None,
    )
    .unwrap();
    let delays: Vec<_> = (0..3).map(|n| schedule.base_delay(n)).collect();
    assert_eq!(
        delays,
        [Duration::from_secs(1), Duration::from_secs(1), ms(500)]
    );
}

#[test]
fn pushback_is_waited_exactly_and_restarts_the_backoff() {
    let mut engine = retry_engine(retry_policy(|b| b), None);
    let t = Clock(Instant::now());
    // A backoff step first (100 ms), then a pushback of 250 ms, then backoff from 100 again.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    let Action::Send(send) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    let second = sent(&mut engine, send, t.at(ms(100)));
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(250))));
    answer(&mut engine, second, pushback, t.at(ms(110)));
    assert_eq!(
        poll(&mut engine, t.at(ms(110))),
        Action::Wait(Some(t.at(ms(360))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(360))) else {
        panic!()
    };
    let third = sent(&mut engine, send, t.at(ms(360)));
    answer(&mut engine, third, RETRYABLE, t.at(ms(370)));
    assert_eq!(
        poll(&mut engine, t.at(ms(370))),
        Action::Wait(Some(t.at(ms(470))))
    );
}

#[test]
fn pushback_stop_and_pushback_over_the_cap_stop_retries() {
    for pushback in [Pushback::Stop, Pushback::After(Duration::from_secs(3600))] {
        let mut engine = retry_engine(retry_policy(|b| b), None);
        let t = Clock(Instant::now());
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Retryable(Some(pushback)),
            t.at(ms(0)),
        );
        assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
    }
}

#[test]
fn a_fatal_pushback_over_the_cap_does_not_debit_the_throttle() {
    let throttle = Throttle::new(10, 0.1).unwrap();
    let handle = || Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle()), None);
    let t = Clock(Instant::now());
    let long = Outcome::Fatal(Some(Pushback::After(Duration::from_secs(3600))));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, long, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), 10_000);
    // The server's own "do not retry" on a fatal code does count (A6).
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle()), None);
    let stop = Outcome::Fatal(Some(Pushback::Stop));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, stop, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(throttle.tokens_milli(), 9_000);
}

#[test]
fn a_hook_may_lengthen_a_delay_but_never_shorten_a_pushback() {
    let policy = retry_policy(|b| b.on_retry(|_| RetryDecision::Delay(ms(10))));
    let mut engine = retry_engine(policy, None);
    let t = Clock(Instant::now());
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(250))));
    answer(&mut engine, AttemptId::FIRST, pushback, t.at(ms(0)));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(250))))
    );
    // Without a pushback, the hook's delay stands (here shorter than the backoff).
    let policy = retry_policy(|b| b.on_retry(|_| RetryDecision::Delay(ms(10))));
    let mut engine = retry_engine(policy, None);
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(10))))
    );
}

#[test]
fn fail_fast_when_the_next_attempt_cannot_start_before_the_deadline() {
    let t = Clock(Instant::now());
    let mut engine = retry_engine(retry_policy(|b| b), Some(t.at(ms(50))));
    // The backoff (100 ms) ends after the deadline: the failure is returned now.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
}

#[test]
fn the_deadline_ends_the_call() {
    let t = Clock(Instant::now());
    let mut engine = retry_engine(retry_policy(|b| b), Some(t.at(ms(50))));
    assert_eq!(
        poll(&mut engine, t.at(ms(0))),
        Action::Wait(Some(t.at(ms(50))))
    );
    assert_eq!(
        poll(&mut engine, t.at(ms(50))),
        Action::End(End::DeadlineExceeded)
    );
}

#[test]
fn never_sent_attempts_back_off_until_the_deadline_and_do_not_count() {
    let t = Clock(Instant::now());
    let policy = retry_policy(|b| b.max_attempts(2));
    let rules = waiting(rules(Mode::Retry(policy), 2, None));
    let mut engine = engine_of(rules, Some(t.at(ms(1000))));
    let mut id = AttemptId::FIRST;
    let mut now = t.at(ms(0));
    // Backoff 100, 200, 400 ms; the fourth (800 ms) would end past the deadline.
    for expected in [100, 200, 400] {
        answer(&mut engine, id, Outcome::NotSent, now);
        assert_eq!(
            poll(&mut engine, now),
            Action::Wait(Some(now + ms(expected)))
        );
        now += ms(expected);
        let Action::Send(send) = poll(&mut engine, now) else {
            panic!()
        };
        assert!(send.transparent);
        assert_eq!(send.number, 1, "a resend repeats the attempt it replaces");
        id = sent(&mut engine, send, now);
    }
    answer(&mut engine, id, Outcome::NotSent, now);
    assert!(ends_with_last(poll(&mut engine, now)));
    assert_eq!(engine.attempts(), Attempts::new(4, 3));
}

#[test]
fn never_sent_then_unavailable_then_ok_numbers_the_third_send_1() {
    let t = Clock(Instant::now());
    let mut engine = engine_of(
        waiting(rules(Mode::Retry(retry_policy(|b| b)), 5, None)),
        None,
    );
    answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t.at(ms(100)));
    // `grpc-previous-rpc-attempts` is `number - 1`: absent on the transparent resend.
    assert_eq!(second.number, 1);
    answer(&mut engine, second, RETRYABLE, t.at(ms(100)));
    let Action::Send(retry) = poll(&mut engine, t.at(ms(200))) else {
        panic!()
    };
    let third = sent(&mut engine, retry, t.at(ms(200)));
    assert_eq!(third.number - 1, 1);
    assert_eq!(
        answer(&mut engine, third, Outcome::Success, t.at(ms(200))),
        Verdict::Return
    );
    assert_eq!(engine.attempts(), Attempts::new(3, 1));
}

#[test]
fn a_refusal_is_resent_once_at_once_and_a_second_is_judged_by_the_policy() {
    let t = Clock(Instant::now());
    // Retryable codes [ABORTED]: the second refusal maps to UNAVAILABLE, which is final.
    let policy = retry_policy(|b| b.retryable(GrpcCodes::from([Code::Aborted])));
    let mut engine = retry_engine(policy, None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!("resent at once")
    };
    assert!(resend.transparent);
    let second = sent(&mut engine, resend, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Refused, t.at(ms(0))),
        Verdict::Return
    );
    assert_eq!(engine.attempts().sent(), 2);
    // With UNAVAILABLE retryable, the second refusal is retried as a counted attempt.
    let mut engine = retry_engine(retry_policy(|b| b), None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Refused, t.at(ms(0))),
        Verdict::Keep
    );
    let Action::Send(retry) = poll(&mut engine, t.at(ms(100))) else {
        panic!()
    };
    assert!(!retry.transparent);
}

#[test]
fn transparent_retries_apply_without_a_policy() {
    let t = Clock(Instant::now());
    let mut engine = engine_of(rules(Mode::Single, 1, None), None);
    answer(&mut engine, AttemptId::FIRST, Outcome::Refused, t.at(ms(0)));
    let Action::Send(resend) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    assert!(resend.transparent);
    let second = sent(&mut engine, resend, t.at(ms(0)));
    // Any other failure is final.
    assert_eq!(
        answer(&mut engine, second, Outcome::Fatal(None), t.at(ms(0))),
        Verdict::Return
    );
}

#[test]
fn a_non_idempotent_request_is_not_repeated() {
    let t = Clock(Instant::now());
    let mut rules = rules(Mode::Retry(retry_policy(|b| b)), 5, None);
    rules.may_repeat = false;
    let mut engine = engine_of(rules, None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0))),
        Verdict::Return
    );
}

#[test]
fn throttled_retries_stop() {
    let throttle = Throttle::new(2, 0.1).unwrap();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = engine_of(rules(Mode::Retry(retry_policy(|b| b)), 5, handle), None);
    let t = Clock(Instant::now());
    // 2 tokens: one failure leaves 1, not above half: no retry.
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(0)));
    assert!(ends_with_last(poll(&mut engine, t.at(ms(0)))));
}

fn hedge_engine(max: u32, delay: Duration, throttle: Option<ThrottleHandle>) -> Engine {
    let mut rules = hedge_rules(max, delay);
    rules.throttle = throttle;
    engine_of(rules, None)
}

#[test]
fn hedges_go_every_delay_from_the_first_poll() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(500), None);
    assert_eq!(
        poll(&mut engine, t.at(ms(1))),
        Action::Wait(Some(t.at(ms(501))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(501))) else {
        panic!()
    };
    assert!(send.hedge && send.number == 2);
    sent(&mut engine, send, t.at(ms(501)));
    assert_eq!(
        poll(&mut engine, t.at(ms(501))),
        Action::Wait(Some(t.at(ms(1001))))
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(1001))) else {
        panic!()
    };
    sent(&mut engine, send, t.at(ms(1001)));
    // maxAttempts reached: nothing more is scheduled.
    assert_eq!(poll(&mut engine, t.at(ms(1001))), Action::Wait(None));
}

#[test]
fn a_non_fatal_hedge_failure_sends_the_next_at_once_and_pushback_delays_it() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(500), None);
    poll(&mut engine, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t.at(ms(10))),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t.at(ms(10))) else {
        panic!("at once")
    };
    let second = sent(&mut engine, send, t.at(ms(10)));
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(100))));
    answer(&mut engine, second, pushback, t.at(ms(20)));
    assert_eq!(
        poll(&mut engine, t.at(ms(20))),
        Action::Wait(Some(t.at(ms(120))))
    );
}

#[test]
fn a_fatal_hedge_answer_is_returned_and_pushback_stop_ends_hedging() {
    let t = Clock(Instant::now());
    let mut engine = hedge_engine(3, ms(0), None);
    let Action::Send(send) = poll(&mut engine, t.at(ms(0))) else {
        panic!()
    };
    let second = sent(&mut engine, send, t.at(ms(0)));
    assert_eq!(
        answer(&mut engine, second, Outcome::Fatal(None), t.at(ms(1))),
        Verdict::Return
    );

    let mut engine = hedge_engine(3, ms(100), None);
    poll(&mut engine, t.at(ms(0)));
    let stop = Outcome::Retryable(Some(Pushback::Stop));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, stop, t.at(ms(1))),
        Verdict::Keep
    );
    // No more hedges, nothing in flight: the failure is returned.
    assert!(ends_with_last(poll(&mut engine, t.at(ms(1)))));
}

#[test]
fn hedges_need_the_throttle_above_half() {
    let throttle = Throttle::new(2, 0.1).unwrap();
    throttle.on_failure();
    let mut engine = hedge_engine(3, ms(10), Some(Arc::new(throttle)));
    poll(&mut engine, t0());
    // The hedge comes due; once its service is ready, the throttle refuses it: none is sent,
    // and the first goes on.
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(engine.admit(send), Admission::Refused);
    assert_eq!(poll(&mut engine, t0() + ms(10)), Action::Wait(None));
}

fn t0() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

#[test]
fn a_commit_cancels_every_other_attempt_and_stops_new_ones() {
    let mut engine = hedge_engine(3, ms(0), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!()
    };
    let second = sent(&mut engine, send, t0());
    engine.on_commit(u64::from(second.send));
    assert_eq!(poll(&mut engine, t0()), Action::Cancel);
    assert!(!engine.is_live(AttemptId::FIRST) && engine.is_live(second));
    // The first attempt, cut off, answers with a body error: it means nothing.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Drop
    );
    assert_eq!(poll(&mut engine, t0()), Action::Wait(None));
    assert_eq!(answer(&mut engine, second, RETRYABLE, t0()), Verdict::Keep);
    assert!(ends_with_last(poll(&mut engine, t0())));
}

#[test]
fn a_per_attempt_timeout_cancels_the_attempt_and_retries() {
    let policy = retry_policy(|b| b.per_attempt_timeout(ms(50)));
    let mut engine = retry_engine(policy, None);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(50))));
    assert_eq!(
        poll(&mut engine, t0() + ms(50)),
        Action::TimedOut(AttemptId::FIRST)
    );
    assert_eq!(
        poll(&mut engine, t0() + ms(50)),
        Action::Wait(Some(t0() + ms(150)))
    );
}

#[test]
fn hedging_on_the_per_attempt_timeout_keeps_the_slow_attempt() {
    let policy = retry_policy(|b| {
        b.per_attempt_timeout(ms(50))
            .hedge_on_per_attempt_timeout(true)
    });
    let mut engine = retry_engine(policy, None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(50)) else {
        panic!("hedged at once")
    };
    assert!(send.hedge);
    let second = sent(&mut engine, send, t0() + ms(50));
    // The slow first attempt's retryable answer was counted when it timed out.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0() + ms(60)),
        Verdict::Drop
    );
    assert_eq!(
        answer(&mut engine, second, Outcome::Success, t0() + ms(70)),
        Verdict::Return
    );
}

// The seams the engine now owns: commit, winner and end.

/// A recorded body already committed (by a transport's task) to `reader`, which the engine
/// has not been told of.
struct CommittedTo(u64);

impl CommitBody for CommittedTo {
    fn commit(&self, _: u64) -> u64 {
        self.0
    }
}

fn answer_with(
    engine: &mut Engine,
    id: AttemptId,
    outcome: Outcome,
    body: &dyn CommitBody,
) -> Verdict {
    let headers = HeaderMap::new();
    let result = AttemptResult::Response {
        status: StatusCode::OK,
        headers: &headers,
    };
    at(t0(), |inputs| {
        engine.on_answer(id, outcome, result, body, inputs)
    })
}

/// The first attempt fails with a retryable code, and the call ends with that failure at
/// once: no retry can be made.
fn fails_at_once_with_its_first_attempt(engine: &mut Engine) {
    assert_eq!(
        answer(engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Keep
    );
    assert_eq!(poll(engine, t0()), Action::End(End::Last(AttemptId::FIRST)));
}

fn recorded(rules: Rules, deadline: Option<Instant>) -> Engine {
    Engine::new(rules, deadline, BodyKind::Recorded, 1)
}

#[test]
fn a_body_committed_to_the_attempt_that_fails_in_the_same_poll_returns_that_failure() {
    let mut engine = recorded(rules(Mode::Retry(retry_policy(|b| b)), 5, None), None);
    // The body's source failed while attempt 1 read it; attempt 1 answered 503.
    engine.on_commit(1);
    fails_at_once_with_its_first_attempt(&mut engine);
}

#[test]
fn a_hedged_call_committed_to_one_attempt_ends_when_it_and_another_fail_together() {
    let mut engine = recorded(hedge_rules(3, ms(0)), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!("the hedge goes at once")
    };
    let second = sent(&mut engine, send, t0());
    engine.on_commit(u64::from(second.send));
    // Both fail in the same poll, before the driver has dropped the cut-off attempt.
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0()),
        Verdict::Drop
    );
    assert_eq!(answer(&mut engine, second, RETRYABLE, t0()), Verdict::Keep);
    assert_eq!(poll(&mut engine, t0()), Action::Cancel);
    assert_eq!(poll(&mut engine, t0()), Action::End(End::Last(second)));
}

#[test]
fn an_answer_loses_to_the_attempt_the_body_committed_to_first() {
    let mut engine = recorded(hedge_rules(3, ms(0)), None);
    let Action::Send(send) = poll(&mut engine, t0()) else {
        panic!()
    };
    let second = sent(&mut engine, send, t0());
    // The body committed to attempt 1's reader in the transport's task; attempt 2's
    // headers arrive before the call hears of it.
    assert_eq!(
        answer_with(&mut engine, second, Outcome::Success, &CommittedTo(1)),
        Verdict::Drop
    );
    assert!(engine.is_live(AttemptId::FIRST));
    assert_eq!(
        answer_with(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            &CommittedTo(1)
        ),
        Verdict::Return
    );
}

fn hedge_rules(max: u32, delay: Duration) -> Rules {
    let policy = HedgePolicy::builder()
        .max_attempts(max)
        .delay(delay)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .build()
        .unwrap();
    rules(Mode::Hedge(Arc::new(policy), delay), max, None)
}

#[test]
fn a_body_sent_once_is_never_hedged_and_its_attempt_goes_on() {
    let mut engine = Engine::new(hedge_rules(3, ms(20)), None, BodyKind::Once, 0);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(None));
    assert_eq!(poll(&mut engine, t0() + ms(20)), Action::Wait(None));
    assert!(engine.is_live(AttemptId::FIRST));
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(100)
        ),
        Verdict::Return
    );
}

#[test]
fn a_body_sent_once_fails_at_once_without_asking_the_hook_or_the_throttle() {
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let hook_asked = Arc::clone(&asked);
    let policy = retry_policy(move |b| {
        b.on_retry(move |_| {
            hook_asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            RetryDecision::Proceed
        })
    });
    let throttle = Counting::default();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut engine = Engine::new(
        rules(Mode::Retry(policy), 5, handle),
        None,
        BodyKind::Once,
        0,
    );
    fails_at_once_with_its_first_attempt(&mut engine);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(throttle.asked(), 0);
}

/// A throttle that always allows, and counts how often it was asked.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<std::sync::atomic::AtomicU32>);

impl Counting {
    fn asked(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl RetryThrottle for Counting {
    fn on_success(&self) {}

    fn on_failure(&self) {}

    fn allows_retry(&self) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }
}

#[test]
fn the_result_carries_its_own_attempts_count_transparent_resends_excluded() {
    let mut engine = engine_of(
        waiting(rules(Mode::Retry(retry_policy(|b| b)), 5, None)),
        None,
    );
    answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0());
    let Action::Send(resend) = poll(&mut engine, t0() + ms(100)) else {
        panic!()
    };
    let second = sent(&mut engine, resend, t0() + ms(100));
    assert_eq!(
        answer(&mut engine, second, Outcome::Success, t0() + ms(100)),
        Verdict::Return
    );
    let marks = engine.marks(Some(second)).expect("two sends");
    assert_eq!((marks.attempts, marks.previous), (Attempts::new(2, 1), 0));
    // A hedged call's result is its winner's: the second of three counted attempts.
    let mut engine = engine_of(hedge_rules(3, ms(0)), None);
    let mut ids = vec![AttemptId::FIRST];
    for _ in 0..2 {
        let Action::Send(send) = poll(&mut engine, t0()) else {
            panic!()
        };
        ids.push(sent(&mut engine, send, t0()));
    }
    assert_eq!(
        answer(&mut engine, ids[1], Outcome::Success, t0()),
        Verdict::Return
    );
    assert_eq!(engine.marks(Some(ids[1])).map(|m| m.previous), Some(1));
}

#[test]
fn a_hedge_that_cannot_start_before_the_deadline_fails_the_call_at_once() {
    let mut engine = engine_of(hedge_rules(3, ms(100)), Some(t0() + ms(50)));
    poll(&mut engine, t0());
    let pushback = Outcome::Retryable(Some(Pushback::After(ms(80))));
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, pushback, t0() + ms(10)),
        Verdict::Keep
    );
    // The next hedge would go at 90 ms, past the 50 ms deadline: nothing in flight, so the
    // failure is returned now rather than at the deadline.
    assert_eq!(
        poll(&mut engine, t0() + ms(10)),
        Action::End(End::Last(AttemptId::FIRST))
    );
}

#[test]
fn a_service_error_with_an_attempt_in_flight_waits_for_that_attempt() {
    let mut engine = engine_of(hedge_rules(3, ms(10)), Some(t0() + ms(500)));
    poll(&mut engine, t0());
    assert!(matches!(poll(&mut engine, t0() + ms(10)), Action::Send(_)));
    assert!(!engine.on_service_error(), "the first attempt is in flight");
    assert_eq!(
        poll(&mut engine, t0() + ms(10)),
        Action::Wait(Some(t0() + ms(500)))
    );
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(20)
        ),
        Verdict::Return
    );
    // With nothing in flight, the service's error is the call's.
    let mut engine = engine_of(hedge_rules(3, ms(10)), None);
    poll(&mut engine, t0());
    answer(&mut engine, AttemptId::FIRST, RETRYABLE, t0());
    assert!(matches!(poll(&mut engine, t0()), Action::Send(_)));
    assert!(engine.on_service_error());
}

#[test]
fn a_hedge_asks_the_throttle_only_once_its_service_is_ready() {
    let throttle = Counting::default();
    let mut rules = hedge_rules(3, ms(10));
    rules.throttle = Some(Arc::new(throttle.clone()));
    let mut engine = engine_of(rules, None);
    poll(&mut engine, t0());
    let Action::Send(send) = poll(&mut engine, t0() + ms(10)) else {
        panic!()
    };
    // The service is not ready: the driver waits, and asks the engine again later.
    assert!(matches!(poll(&mut engine, t0() + ms(11)), Action::Send(_)));
    assert_eq!(throttle.asked(), 0);
    assert_eq!(engine.admit(send), Admission::Send);
    assert_eq!(
        engine.admit(send),
        Admission::Send,
        "asked once per attempt"
    );
    assert_eq!(throttle.asked(), 1);
}

fn facts<'a>(method: &'a http::Method, headers: &'a HeaderMap, grpc: bool) -> CallFacts<'a> {
    CallFacts {
        method,
        grpc,
        headers,
        driven: false,
        deadline: None,
    }
}

const TABLE: TableFacts = TableFacts {
    max_attempts_cap: 3,
    max_pushback: Duration::from_secs(60),
    transparent_retries: true,
    has_throttle: false,
    track_backends: false,
};

fn drive(plan: Plan) -> Start {
    match plan {
        Plan::Drive(start) => start,
        Plan::Passthrough => panic!("the call is driven"),
    }
}

#[test]
fn the_plan_of_a_call_is_its_policy_whichever_layer_meets_it_first() {
    let never = || panic!("no timeout: the clock is not read");
    let (post, get) = (http::Method::POST, http::Method::GET);
    let headers = HeaderMap::new();
    let retry = MethodPolicy::Retry(retry_policy(|b| b.max_attempts(5)));
    // Retried, its cap clamped to the table's; a gRPC POST may repeat.
    let start = drive(plan(
        Some(&retry),
        &TABLE,
        &facts(&post, &headers, true),
        &never,
    ));
    assert!(matches!(start.rules.mode, Mode::Retry(_)));
    assert_eq!(
        (start.rules.max_attempts, start.rules.may_repeat),
        (3, true)
    );
    assert!(start.has_policy && start.deadline.is_none());
    // An HTTP POST may not, unless it carries an idempotency key its policy accepts.
    let start = drive(plan(
        Some(&retry),
        &TABLE,
        &facts(&post, &headers, false),
        &never,
    ));
    assert!(!start.rules.may_repeat);
    let keyed = MethodPolicy::Retry(retry_policy(|b| b.retry_with_idempotency_key(true)));
    let mut with_key = HeaderMap::new();
    with_key.insert("idempotency-key", http::HeaderValue::from_static("k"));
    let start = drive(plan(
        Some(&keyed),
        &TABLE,
        &facts(&post, &with_key, false),
        &never,
    ));
    assert!(start.rules.may_repeat);
    // A call a layer above drives passes through; so does a call with nothing to apply.
    let mut driven = facts(&get, &headers, true);
    driven.driven = true;
    assert!(matches!(
        plan(Some(&retry), &TABLE, &driven, &never),
        Plan::Passthrough
    ));
    let off = TableFacts {
        transparent_retries: false,
        ..TABLE
    };
    let get_facts = facts(&get, &headers, false);
    assert!(matches!(
        plan(None, &off, &get_facts, &never),
        Plan::Passthrough
    ));
    let start = drive(plan(None, &TABLE, &get_facts, &never));
    assert!(matches!(start.rules.mode, Mode::Single) && !start.has_policy);
    // A hedging policy keeps its record of backends, whatever the table says.
    let hedge = HedgePolicy::builder()
        .max_attempts(2)
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .track_backends(true)
        .build()
        .unwrap();
    let hedge = MethodPolicy::Hedge(Arc::new(hedge));
    let start = drive(plan(
        Some(&hedge),
        &TABLE,
        &facts(&get, &headers, true),
        &never,
    ));
    assert!(matches!(start.rules.mode, Mode::Hedge(..)) && start.track_backends);
}

#[test]
fn the_deadline_is_the_earliest_of_header_timeout_and_extension() {
    let now = t0();
    let read = move || now;
    let get = http::Method::GET;
    let mut grpc_headers = HeaderMap::new();
    grpc_headers.insert("grpc-timeout", http::HeaderValue::from_static("2S"));
    let secs = Duration::from_secs;
    let deadline_of = |timeout: Option<Duration>, call: &CallFacts<'_>| {
        let policy = timeout.map(MethodPolicy::Timeout);
        let start = drive(plan(policy.as_ref(), &TABLE, call, &read));
        (start.deadline, start.deadline_from_header)
    };
    let grpc = facts(&get, &grpc_headers, true);
    assert_eq!(deadline_of(None, &grpc), (Some(now + secs(2)), true));
    assert_eq!(
        deadline_of(Some(secs(1)), &grpc),
        (Some(now + secs(1)), false)
    );
    assert_eq!(
        deadline_of(Some(secs(3)), &grpc),
        (Some(now + secs(2)), true)
    );
    // Not gRPC: its `grpc-timeout` is not the call's.
    let http = facts(&get, &grpc_headers, false);
    assert_eq!(deadline_of(None, &http), (None, false));
    assert_eq!(
        deadline_of(Some(secs(5)), &http),
        (Some(now + secs(5)), false)
    );
    let mut with_extension = facts(&get, &grpc_headers, true);
    with_extension.deadline = Some(now + ms(500));
    assert_eq!(
        deadline_of(Some(secs(1)), &with_extension),
        (Some(now + ms(500)), false)
    );
}

#[test]
fn without_wait_for_ready_a_never_sent_attempt_is_an_unavailable_failure_for_the_policy() {
    // Retried as a counted attempt, after the backoff, even for a POST, and it counts
    // against the throttle.
    let throttle = Throttle::new(10, 0.1).unwrap();
    let handle = Some(Arc::new(throttle.clone()) as ThrottleHandle);
    let mut rules = rules(Mode::Retry(retry_policy(|b| b.max_attempts(3))), 3, handle);
    rules.may_repeat = false;
    let mut engine = engine_of(rules, None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Keep
    );
    assert_eq!(throttle.tokens_milli(), 9_000);
    assert_eq!(poll(&mut engine, t0()), Action::Wait(Some(t0() + ms(100))));
    let Action::Send(send) = poll(&mut engine, t0() + ms(100)) else {
        panic!("retried after the backoff")
    };
    assert!(!send.transparent);
    let second = sent(&mut engine, send, t0() + ms(100));
    assert_eq!(second.number, 2);
    assert_eq!(
        answer(&mut engine, second, Outcome::NotSent, t0() + ms(100)),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(300)) else {
        panic!("retried again")
    };
    let third = sent(&mut engine, send, t0() + ms(300));
    assert_eq!(
        answer(&mut engine, third, Outcome::NotSent, t0() + ms(300)),
        Verdict::Keep
    );
    // maxAttempts reached.
    assert_eq!(
        poll(&mut engine, t0() + ms(300)),
        Action::End(End::Last(third))
    );
    assert_eq!(engine.attempts(), Attempts::new(3, 0));
}

#[test]
fn without_a_policy_a_never_sent_attempt_fails_the_call_at_once() {
    let mut engine = engine_of(rules(Mode::Single, 1, None), None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Return
    );
    // With wait-for-ready (a method config with only `"waitForReady": true`), it is resent.
    let mut engine = engine_of(waiting(rules(Mode::Single, 1, None)), None);
    assert_eq!(
        answer(&mut engine, AttemptId::FIRST, Outcome::NotSent, t0()),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(1000)) else {
        panic!("resent")
    };
    assert!(send.transparent);
}

#[test]
fn a_never_sent_hedge_sends_the_next_at_once_when_unavailable_is_non_fatal() {
    let mut engine = engine_of(hedge_rules(3, ms(500)), None);
    poll(&mut engine, t0());
    assert_eq!(
        answer(
            &mut engine,
            AttemptId::FIRST,
            Outcome::NotSent,
            t0() + ms(1)
        ),
        Verdict::Keep
    );
    let Action::Send(send) = poll(&mut engine, t0() + ms(1)) else {
        panic!("the next hedge goes at once")
    };
    assert!(send.hedge && !send.transparent);
}

#[test]
fn a_hedge_over_its_policy_budget_is_not_sent_and_the_call_waits_on_the_first() {
    // 50 % of calls, no floor: of two calls, one hedge.
    let budget = crate::throttle::HedgeBudget::new(Duration::from_secs(10), 0, 0.5).unwrap();
    let policy = HedgePolicy::builder()
        .max_attempts(3)
        .delay(ms(10))
        .non_fatal(GrpcCodes::from([Code::Unavailable]))
        .budget(budget.clone())
        .build()
        .unwrap();
    let rules = || rules(Mode::Hedge(Arc::new(policy.clone()), ms(10)), 3, None);
    let mut first = engine_of(rules(), None);
    let mut second = engine_of(rules(), None);
    for engine in [&mut first, &mut second] {
        poll(engine, t0());
    }
    let Action::Send(send) = poll(&mut first, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(first.admit(send), Admission::Send);
    let Action::Send(send) = poll(&mut second, t0() + ms(10)) else {
        panic!("the hedge is due")
    };
    assert_eq!(second.admit(send), Admission::OverBudget);
    // No more hedges for this call: it waits on its first attempt.
    assert_eq!(poll(&mut second, t0() + ms(10)), Action::Wait(None));
    assert_eq!(second.extra().map(|e| e.hedges_over_budget), Some(1));
    assert_eq!(
        answer(
            &mut second,
            AttemptId::FIRST,
            Outcome::Success,
            t0() + ms(50)
        ),
        Verdict::Return
    );
}
